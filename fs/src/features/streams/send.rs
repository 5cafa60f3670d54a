//! Sending a snapshot as a stream (`format::stream`, `docs/format.md`, "Snapshot
//! streams"): in full, or as the changes since a base snapshot of the same filesystem.
//!
//! Both are the same walk: the fs trees of the base (none for a full stream) and of the
//! snapshot are compared key by key, skipping shared subtrees ([`treediff`]); the
//! inodes whose keys differ are the changed ones, and each is described by its state in
//! the snapshot (read through the snapshot's view). Directory changes come straight from
//! the `DIR_INDEX` keys: an index is never reused, so a key only in the base is an entry
//! removed and a key only in the snapshot an entry added. Inodes the base has are named
//! by a path in the base, which the receiver resolves in its own copy of it.

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use crate::core::dir::MAX_DEPTH;
use crate::core::txn::Txn;
use crate::features::snapshots::read_items;
use crate::features::streams::host::StreamHost;
use crate::features::streams::treediff;
use crate::features::streams::treediff::TreeDiff;
use crate::format::items::{decode_inode_refs, DirIndexRec, FileExtent, SnapshotItem};
use crate::format::key::kind;
use crate::format::stream::{
    DataMode, Encoder, Header, InodeRef, InodeState, Record, SnapshotId, DATA_CHUNK,
};
use crate::format::{Key, TreeId, BLOCK_SIZE};
use crate::util::ranges::RangeSet;
use alloc::string::String;
use alloc::sync::Arc;
use vfs::{Errno, FileType, FsResult, Ino, ROOT_INO};

/// The xattr a received snapshot's root carries: which snapshot of which filesystem it
/// is (`receive`). Never sent: each receiver writes its own.
pub const RECEIVED_XATTR: &[u8] = b"trusted.ninefold.received";

/// What a send did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Btree nodes read to find the changes (both trees).
    pub nodes_read: u64,
    /// Inodes described.
    pub inodes: u64,
    /// Records written (trailer excluded).
    pub records: u64,
    /// Stream bytes written.
    pub bytes: u64,
}

/// Where the stream goes, a chunk at a time.
pub type Sink<'a> = dyn FnMut(&[u8]) -> FsResult<()> + 'a;

/// Where the stream goes, a chunk at a time, for a sink that may wait (a bounded
/// buffer a client drains: `features::streams::jobs`).
#[allow(async_fn_in_trait)]
pub trait StreamSink {
    /// Takes the stream's next bytes (an error stops the send).
    async fn put(&mut self, bytes: &[u8]) -> FsResult<()>;
}

/// A [`Sink`] that never waits, as a [`StreamSink`].
struct Immediate<'a, 'b>(&'a mut Sink<'b>);

impl StreamSink for Immediate<'_, '_> {
    async fn put(&mut self, bytes: &[u8]) -> FsResult<()> {
        (self.0)(bytes)
    }
}

struct Writer<'a, S: StreamSink> {
    enc: Encoder,
    out: &'a mut S,
    stats: SendStats,
}

impl<S: StreamSink> Writer<'_, S> {
    async fn emit(&mut self, bytes: &[u8]) -> FsResult<()> {
        self.stats.bytes += bytes.len() as u64;
        self.out.put(bytes).await
    }

    async fn record(&mut self, rec: &Record) -> FsResult<()> {
        self.stats.records += 1;
        let bytes = self.enc.record(rec);
        self.emit(&bytes).await
    }
}

/// A snapshot's view and item.
struct Side<H: StreamHost> {
    view: Arc<H>,
    item: SnapshotItem,
}

impl<H: StreamHost> Side<H> {
    fn id(&self) -> SnapshotId {
        SnapshotId {
            name: String::from_utf8_lossy(&self.item.name).into_owned(),
            seq: self.item.seq,
            created: self.item.created,
        }
    }

    /// Whether `ino` is a linked inode of this snapshot (an orphan, open but unlinked
    /// when it was taken, is not part of it).
    async fn has(&self, ino: Ino) -> FsResult<bool> {
        match self.view.getattr(ino).await {
            Ok(a) => Ok(a.nlink > 0),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Items of `ino` of one kind.
    async fn items(&self, ino: Ino, k: u8) -> FsResult<Vec<(Key, Vec<u8>)>> {
        let (from, to) = (Key::new(ino, k, 0), Key::new(ino, k, u64::MAX));
        self.view
            .engine()
            .run(|c| Txn::new().range(c, TreeId::Fs, from, to))
            .await
    }
}

/// Paths of base inodes, found through their back-references.
struct BasePaths<'a, H: StreamHost> {
    base: Option<&'a Side<H>>,
    known: BTreeMap<Ino, Vec<Vec<u8>>>,
}

impl<H: StreamHost> BasePaths<'_, H> {
    /// How the stream names `ino`: by a path in the base if the base has it.
    async fn name(&mut self, ino: Ino) -> FsResult<InodeRef> {
        if ino == ROOT_INO {
            return Ok(InodeRef::root());
        }
        let Some(base) = self.base else {
            return Ok(InodeRef::New(ino));
        };
        if !base.has(ino).await? {
            return Ok(InodeRef::New(ino));
        }
        // Up through the first name of each ancestor (a directory has one) to a known one.
        let mut chain = Vec::new();
        let mut at = ino;
        while at != ROOT_INO && !self.known.contains_key(&at) {
            let refs = base.items(at, kind::INODE_REF).await?;
            let first = refs
                .first()
                .and_then(|(_, v)| decode_inode_refs(v))
                .and_then(|l| l.into_iter().next())
                .ok_or(Errno::EIO)?;
            chain.push((at, first.name));
            at = first.parent;
            if chain.len() > MAX_DEPTH {
                return Err(Errno::ELOOP);
            }
        }
        let mut path = self.known.get(&at).cloned().unwrap_or_default();
        for (ino, name) in chain.into_iter().rev() {
            path.push(name);
            self.known.insert(ino, path.clone());
        }
        Ok(InodeRef::Base(path))
    }
}

/// The blocks of a file the extent items cover, clipped to `size`, as byte ranges.
fn covered(extents: &[(Key, Vec<u8>)], size: u64) -> FsResult<RangeSet> {
    let mut set = RangeSet::new();
    for (k, v) in extents {
        let e = FileExtent::decode(v).ok_or(Errno::EIO)?;
        let end = (k.offset + u64::from(e.num_blocks) * BLOCK_SIZE as u64).min(size);
        if k.offset < end {
            set.insert(k.offset..end);
        }
    }
    Ok(set)
}

/// Of `rewritten` (the ranges the extent items `fresh` cover), what holds other data
/// than before: a write into the middle of an extent splits its item, and the pieces
/// around the write are new items over the same blocks (`gone` are the items they
/// replace), which need not be sent.
fn moved(
    fresh: &[(Key, Vec<u8>)],
    gone: &[(Key, Vec<u8>)],
    mut rewritten: RangeSet,
) -> FsResult<RangeSet> {
    let bs = BLOCK_SIZE as u64;
    let pieces = |items: &[(Key, Vec<u8>)]| -> FsResult<Vec<(u64, u64, i128)>> {
        items
            .iter()
            .map(|(k, v)| {
                let e = FileExtent::decode(v).ok_or(Errno::EIO)?;
                let end = k.offset + u64::from(e.num_blocks) * bs;
                // Disk block minus file block: equal for two pieces that map the same
                // file offsets to the same blocks.
                Ok((
                    k.offset,
                    end,
                    e.first_block() as i128 - (k.offset / bs) as i128,
                ))
            })
            .collect()
    };
    let (fresh, gone) = (pieces(fresh)?, pieces(gone)?);
    // Both lists are in file order and do not overlap within themselves: merge them.
    let (mut i, mut j) = (0, 0);
    while let (Some(f), Some(g)) = (fresh.get(i), gone.get(j)) {
        let (start, end) = (f.0.max(g.0), f.1.min(g.1));
        if start < end && f.2 == g.2 {
            rewritten.remove(start..end);
        }
        if f.1 <= g.1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    Ok(rewritten)
}

/// The side of snapshot `name` of `host`, one of its snapshot `items`.
fn side<H: StreamHost>(host: &H, items: &[(u64, SnapshotItem)], name: &str) -> FsResult<Side<H>> {
    let (id, item) = items
        .iter()
        .find(|(_, i)| i.name == name.as_bytes())
        .ok_or(Errno::ENOENT)?;
    Ok(Side {
        view: host.view(host.snaps().view_of(*id, item)),
        item: item.clone(),
    })
}

/// Writes snapshot `name` of `host` as a stream to `out`: in full, or with `base` only
/// what changed since that snapshot (of the same filesystem). `ENOENT`: no such snapshot.
pub(crate) async fn send<H: StreamHost>(
    host: &H,
    name: &str,
    base: Option<&str>,
    out: &mut Sink<'_>,
) -> FsResult<SendStats> {
    send_to(host, name, base, &mut Immediate(out)).await
}

/// [`send`] to a sink that may wait.
pub(crate) async fn send_to<H: StreamHost, S: StreamSink>(
    host: &H,
    name: &str,
    base: Option<&str>,
    out: &mut S,
) -> FsResult<SendStats> {
    let items = host.engine().run(read_items).await?;
    let new = side(host, &items, name)?;
    let base = base.map(|b| side(host, &items, b)).transpose()?;
    let node_size = host.engine().core.lock().sb.node_size;
    let diff: TreeDiff = treediff::diff(
        &host.engine().dev,
        node_size,
        TreeId::Fs,
        base.as_ref().map(|b| b.item.roots[0]),
        Some(new.item.roots[0]),
    )
    .await?;
    let (mut enc, start) = Encoder::start();
    let header = Header {
        source: host.engine().core.lock().sb.uuid,
        snapshot: new.id(),
        base: base.as_ref().map(Side::id),
    };
    let first = enc.record(&Record::Begin(header));
    let mut w = Writer {
        enc,
        out,
        stats: SendStats {
            nodes_read: diff.nodes_read,
            ..SendStats::default()
        },
    };
    w.emit(&start).await?;
    w.emit(&first).await?;
    let mut paths = BasePaths {
        base: base.as_ref(),
        known: BTreeMap::new(),
    };

    // Changed keys by inode (objectid 0 holds the filesystem's own items: snapshots,
    // quotas, orphans, none of which a stream carries).
    let mut by_ino: BTreeMap<Ino, Vec<(&Key, &treediff::Change)>> = BTreeMap::new();
    by_ino.entry(ROOT_INO).or_default();
    for (k, ch) in diff.changes.iter().filter(|(k, _)| k.objectid != 0) {
        by_ino.entry(k.objectid).or_default().push((k, ch));
    }

    let mut links = Vec::new();
    for (&dir, changes) in &by_ino {
        for (k, ch) in changes.iter().filter(|(k, _)| k.kind == kind::DIR_INDEX) {
            if let Some(old) = &ch.old {
                let e = DirIndexRec::decode(old).ok_or(Errno::EIO)?;
                let d = paths.name(dir).await?;
                w.record(&Record::Unlink(d, e.name)).await?;
            }
            if let Some(new) = &ch.new {
                let e = DirIndexRec::decode(new).ok_or(Errno::EIO)?;
                links.push((dir, e.name, e.ino, k.offset));
            }
        }
    }
    for (&ino, changes) in &by_ino {
        if !new.has(ino).await? {
            continue;
        }
        w.stats.inodes += 1;
        let in_base = match &base {
            Some(b) => b.has(ino).await?,
            None => ino == ROOT_INO,
        };
        describe(&mut w, &mut paths, &new, ino, in_base, changes).await?;
    }
    for (dir, name, child, _) in links {
        let d = paths.name(dir).await?;
        let c = paths.name(child).await?;
        w.record(&Record::Link(d, name, c)).await?;
    }
    let end = core::mem::take(&mut w.enc).finish();
    w.emit(&end).await?;
    Ok(w.stats)
}

/// Writes the records that give `ino` its state in the snapshot `new`.
async fn describe<H: StreamHost>(
    w: &mut Writer<'_, impl StreamSink>,
    paths: &mut BasePaths<'_, H>,
    new: &Side<H>,
    ino: Ino,
    in_base: bool,
    changes: &[(&Key, &treediff::Change)],
) -> FsResult<()> {
    let attr = new.view.getattr(ino).await?;
    let me = paths.name(ino).await?;
    let file_type = attr.file_type();
    let target = match file_type {
        FileType::Symlink => new.view.readlink(ino).await?,
        _ => Vec::new(),
    };
    // Which byte ranges of a regular file to send.
    let (data, ranges) = if file_type != FileType::Regular {
        (DataMode::Keep, RangeSet::new())
    } else {
        let extent_changes: Vec<_> = changes
            .iter()
            .filter(|(k, _)| k.kind == kind::EXTENT_DATA)
            .collect();
        let fresh: Vec<(Key, Vec<u8>)> = extent_changes
            .iter()
            .filter_map(|(k, ch)| ch.new.clone().map(|v| (**k, v)))
            .collect();
        let gone: Vec<(Key, Vec<u8>)> = extent_changes
            .iter()
            .filter_map(|(k, ch)| ch.old.clone().map(|v| (**k, v)))
            .collect();
        let rewritten = covered(&fresh, attr.size)?;
        let mut lost = covered(&gone, attr.size)?;
        for r in rewritten.iter() {
            lost.remove(r);
        }
        if in_base && lost.is_empty() {
            (DataMode::Patch, moved(&fresh, &gone, rewritten)?)
        } else {
            // New, or holes punched where data was (truncated and extended): the
            // receiver cannot punch holes, so the file is sent whole.
            let all = new.items(ino, kind::EXTENT_DATA).await?;
            (DataMode::Whole, covered(&all, attr.size)?)
        }
    };
    w.record(&Record::Inode(InodeState {
        ino: me.clone(),
        mode: attr.mode,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        size: attr.size,
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        btime: attr.btime,
        data,
        target,
    }))
    .await?;
    let mut xattrs = Vec::new();
    for name in new.view.listxattr(ino).await? {
        if name != RECEIVED_XATTR {
            let value = new.view.getxattr(ino, &name).await?;
            xattrs.push((name, value));
        }
    }
    w.record(&Record::Xattrs(me.clone(), xattrs)).await?;
    let mut buf = vec![0u8; DATA_CHUNK];
    for r in ranges.iter() {
        let mut at = r.start;
        while at < r.end {
            let n = ((r.end - at) as usize).min(DATA_CHUNK);
            let got = new.view.read(ino, at, &mut buf[..n]).await?;
            if got != n {
                return Err(Errno::EIO);
            }
            w.record(&Record::Data(me.clone(), at, buf[..n].to_vec()))
                .await?;
            at += n as u64;
        }
    }
    Ok(())
}
