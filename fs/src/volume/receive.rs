//! Receiving a snapshot stream (`docs/format.md`, "Snapshot streams"): the live tree of
//! the target is made the sent snapshot's tree, then a snapshot of it is taken under the
//! sent name. That snapshot is the result: it appears whole (its checkpoint) or not at
//! all; a receive that stops half way leaves a live tree that no longer matches its
//! base, which the next receive detects and refuses.
//!
//! What a target holds is known from its snapshots: the root of every received one
//! carries [`RECEIVED_XATTR`] (the sender's uuid and the snapshot's checkpoint there).
//! An incremental stream applies only if a snapshot with its base's identity exists and
//! the live tree still equals it (compared with [`treediff`], so the check costs what
//! differs). The stream is checked whole ([`stream::decode`]) before anything changes.
//!
//! Application is in phases, so that no order of renames can cycle or collide: removed
//! entries are first moved into a staging directory at the root, new inodes are made
//! there, added entries are linked (directories renamed) into place, what is left in
//! staging is deleted, and times are set last (every other step changes some).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use super::core::Txn;
use super::send::RECEIVED_XATTR;
use super::snapshot::{read_items, SnapshotInfo};
use super::treediff;
use super::{CheckpointCause, NineFs};
use crate::format::items::SnapshotItem;
use crate::format::stream::{self, DataMode, Header, InodeRef, InodeState, Record, StreamError};
use crate::format::TreeId;
use block::BlockDevice;
use vfs::{Errno, FileSystem, FileType, Ino, Owner, SetAttr, Timespec, XattrMode, ROOT_INO};

/// Name of the staging directory at the root while a receive runs.
pub const STAGING: &[u8] = b".ninefold-receive";
/// The live tree as a rollback found it (deleted when it is done).
pub const ROLLBACK_LIVE: &str = "receive-rollback-live";
/// The rolled-back tree while its snapshot is retaken (deleted when it is done).
pub const ROLLBACK_BASE: &str = "receive-rollback-base";

/// Why a receive was refused or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiveError {
    /// The stream is damaged, truncated or not a stream; nothing was applied.
    Stream(StreamError),
    /// No snapshot here is the incremental stream's base.
    BaseMissing(String),
    /// The live tree changed since the base snapshot (`.0` keys differ), or a receive
    /// stopped half way: roll back before receiving more.
    Diverged(usize),
    /// A full stream needs an empty live tree.
    NotEmpty,
    /// A snapshot of that name exists already.
    Exists(String),
    /// The stream refers to something it never described (a bug of the sender).
    Inconsistent(&'static str),
    /// The filesystem failed an operation.
    Fs(Errno),
}

impl From<Errno> for ReceiveError {
    fn from(e: Errno) -> ReceiveError {
        ReceiveError::Fs(e)
    }
}

impl fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReceiveError::Stream(e) => write!(f, "{e}; nothing applied"),
            ReceiveError::BaseMissing(b) => {
                write!(
                    f,
                    "incremental stream: base snapshot {b:?} not received here"
                )
            }
            ReceiveError::Diverged(n) => write!(
                f,
                "the live tree differs from the base snapshot ({n} items): it changed, \
                 or an earlier receive stopped half way"
            ),
            ReceiveError::NotEmpty => write!(f, "a full stream needs an empty filesystem"),
            ReceiveError::Exists(n) => write!(f, "snapshot {n:?} exists already"),
            ReceiveError::Inconsistent(w) => write!(f, "inconsistent stream: {w}"),
            ReceiveError::Fs(e) => write!(f, "{e}"),
        }
    }
}

/// The value of [`RECEIVED_XATTR`] for snapshot `seq` of filesystem `source`.
pub fn received_mark(source: &[u8; 16], seq: u64) -> Vec<u8> {
    [&source[..], &seq.to_le_bytes()].concat()
}

const OWNER: Owner = Owner { uid: 0, gid: 0 };

/// The receive in progress: how stream inodes map to inodes here.
struct Apply<'a, D: BlockDevice> {
    fs: &'a NineFs<D>,
    /// The base snapshot here (`None` for a full stream).
    base: Option<Arc<NineFs<D>>>,
    staging: Ino,
    new: BTreeMap<Ino, Ino>,
    resolved: BTreeMap<Vec<Vec<u8>>, Ino>,
    /// Directories now in staging, by inode: their name there.
    staged_dirs: BTreeMap<Ino, Vec<u8>>,
    next_name: u64,
}

impl<D: BlockDevice> Apply<'_, D> {
    async fn resolve(&mut self, r: &InodeRef) -> Result<Ino, ReceiveError> {
        match r {
            InodeRef::New(n) => self.new.get(n).copied().ok_or(ReceiveError::Inconsistent(
                "an inode used before it is made",
            )),
            InodeRef::Base(path) if path.is_empty() => Ok(ROOT_INO),
            InodeRef::Base(path) => {
                if let Some(&ino) = self.resolved.get(path) {
                    return Ok(ino);
                }
                let base = self
                    .base
                    .as_ref()
                    .ok_or(ReceiveError::Inconsistent("a base path in a full stream"))?;
                let mut at = ROOT_INO;
                for name in path {
                    at = base.lookup(at, name).await?.ino;
                }
                self.resolved.insert(path.clone(), at);
                Ok(at)
            }
        }
    }

    fn stage_name(&mut self) -> Vec<u8> {
        self.next_name += 1;
        format!("{}", self.next_name).into_bytes()
    }

    async fn make(&mut self, s: &InodeState, src: Ino) -> Result<(), ReceiveError> {
        let name = self.stage_name();
        let (fs, dir) = (self.fs, self.staging);
        let perm = s.mode & vfs::mode::PERMISSIONS;
        let ty = FileType::from_mode(s.mode).ok_or(ReceiveError::Inconsistent("mode"))?;
        let attr = match ty {
            FileType::Regular => fs.create(dir, &name, perm, OWNER).await?,
            FileType::Directory => fs.mkdir(dir, &name, perm, OWNER).await?,
            FileType::Symlink => fs.symlink(dir, &name, &s.target, OWNER).await?,
            _ => fs.mknod(dir, &name, s.mode, s.rdev, OWNER).await?,
        };
        if ty == FileType::Directory {
            self.staged_dirs.insert(attr.ino, name);
        }
        self.new.insert(src, attr.ino);
        Ok(())
    }

    async fn attributes(&mut self, s: &InodeState) -> Result<(), ReceiveError> {
        let ino = self.resolve(&s.ino).await?;
        let fs = self.fs;
        let set = SetAttr {
            uid: Some(s.uid),
            gid: Some(s.gid),
            mode: Some(s.mode & vfs::mode::PERMISSIONS),
            ..SetAttr::default()
        };
        fs.setattr(ino, set).await?;
        match s.data {
            DataMode::Keep => {}
            DataMode::Whole => {
                fs.setattr(ino, size(0)).await?;
                fs.setattr(ino, size(s.size)).await?;
            }
            DataMode::Patch => {
                fs.setattr(ino, size(s.size)).await?;
            }
        }
        Ok(())
    }

    async fn xattrs(
        &mut self,
        r: &InodeRef,
        list: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), ReceiveError> {
        let ino = self.resolve(r).await?;
        for name in self.fs.listxattr(ino).await? {
            if !list.iter().any(|(n, _)| *n == name) {
                self.fs.removexattr(ino, &name).await?;
            }
        }
        for (name, value) in list {
            self.fs
                .setxattr(ino, name, value, XattrMode::Upsert)
                .await?;
        }
        Ok(())
    }

    async fn link(
        &mut self,
        dir: &InodeRef,
        name: &[u8],
        child: &InodeRef,
    ) -> Result<(), ReceiveError> {
        let d = self.resolve(dir).await?;
        let c = self.resolve(child).await?;
        match self.staged_dirs.remove(&c) {
            Some(staged) => self.fs.rename(self.staging, &staged, d, name).await?,
            None => {
                self.fs.link(c, d, name).await?;
            }
        }
        Ok(())
    }

    async fn unlink(&mut self, dir: &InodeRef, name: &[u8]) -> Result<(), ReceiveError> {
        let d = self.resolve(dir).await?;
        let attr = self.fs.lookup(d, name).await?;
        let staged = self.stage_name();
        self.fs.rename(d, name, self.staging, &staged).await?;
        if attr.file_type() == FileType::Directory {
            self.staged_dirs.insert(attr.ino, staged);
        }
        Ok(())
    }

    /// Deletes what is left in staging (entries removed for good), then staging.
    async fn clear_staging(&mut self, name: &[u8]) -> Result<(), ReceiveError> {
        let fs = self.fs;
        loop {
            let entries = fs.readdir(self.staging, 0, 256).await?;
            let mut left = false;
            for e in entries.iter().filter(|e| e.name != b"." && e.name != b"..") {
                left = true;
                match e.file_type {
                    FileType::Directory => fs.rmdir(self.staging, &e.name).await?,
                    _ => fs.unlink(self.staging, &e.name).await?,
                }
            }
            if !left {
                break;
            }
        }
        fs.rmdir(ROOT_INO, name).await?;
        Ok(())
    }
}

/// Checks what the checksums cannot: that every inode the records name by sender
/// number is described once, that every mode names a type, and that a full stream names
/// nothing by a base path but the root — so such a stream is refused before anything
/// changes rather than half way.
fn validate(header: &Header, records: &[Record]) -> Result<(), ReceiveError> {
    let mut described = alloc::collections::BTreeSet::new();
    for r in records {
        if let Record::Inode(s) = r {
            FileType::from_mode(s.mode).ok_or(ReceiveError::Inconsistent("mode"))?;
            if !described.insert(&s.ino) {
                return Err(ReceiveError::Inconsistent("an inode described twice"));
            }
        }
    }
    let check = |r: &InodeRef| match r {
        InodeRef::New(_) if !described.contains(r) => Err(ReceiveError::Inconsistent(
            "an inode used but not described",
        )),
        InodeRef::Base(path) if header.base.is_none() && !path.is_empty() => {
            Err(ReceiveError::Inconsistent("a base path in a full stream"))
        }
        _ => Ok(()),
    };
    for r in records {
        match r {
            // `decode` takes it only first, as the header.
            Record::Begin(_) => {}
            Record::Inode(s) => check(&s.ino)?,
            Record::Xattrs(ino, _) | Record::Data(ino, ..) => check(ino)?,
            Record::Unlink(dir, _) => check(dir)?,
            Record::Link(dir, _, child) => {
                check(dir)?;
                check(child)?;
            }
        }
    }
    Ok(())
}

fn size(n: u64) -> SetAttr {
    SetAttr {
        size: Some(n),
        ..SetAttr::default()
    }
}

impl<D: BlockDevice> NineFs<D> {
    /// Sets all four times of `ino` as given (a receive restores them as sent; `setattr`
    /// cannot set ctime or btime).
    pub async fn restore_times(&self, ino: Ino, times: [Timespec; 4]) -> vfs::FsResult<()> {
        self.run(|c| {
            c.writable()?;
            let mut tx = Txn::new();
            let mut item = tx.inode(c, ino)?;
            [item.atime, item.mtime, item.ctime, item.btime] = times;
            tx.put_inode(ino, &item);
            c.commit(tx)
        })
        .await
    }

    /// The snapshots here that were received, with their marks ([`RECEIVED_XATTR`]).
    async fn received(&self) -> Result<Vec<(SnapshotItem, Vec<u8>, Arc<NineFs<D>>)>, ReceiveError> {
        let mut out = Vec::new();
        for (id, item) in self.run(read_items).await? {
            let view = self.view_of(id, &item);
            match view.getxattr(ROOT_INO, RECEIVED_XATTR).await {
                Ok(mark) => out.push((item, mark, view)),
                Err(Errno::ENODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Items (not the filesystem's own, objectid 0) in which the live tree, as of the
    /// last checkpoint, differs from the snapshot `view`.
    async fn differs_from(&self, view: &NineFs<D>) -> Result<usize, ReceiveError> {
        let (node_size, live) = {
            let c = self.core.lock();
            (c.sb.node_size, c.sb.root(TreeId::Fs))
        };
        let snap = view.core.lock().sb.root(TreeId::Fs);
        let d = treediff::diff(&self.dev, node_size, TreeId::Fs, Some(snap), Some(live)).await?;
        Ok(d.changes.keys().filter(|k| k.objectid != 0).count())
    }

    /// The snapshot carrying `mark` that the live tree still equals, key for key (after
    /// a rollback two may carry it: the one the live tree equals counts).
    async fn base_for(&self, mark: &[u8], name: &str) -> Result<Arc<NineFs<D>>, ReceiveError> {
        self.checkpoint(CheckpointCause::Snapshot).await?;
        let mut diverged = None;
        for (_, m, view) in self.received().await? {
            if m == mark {
                match self.differs_from(&view).await? {
                    0 => return Ok(view),
                    n => diverged = Some(diverged.map_or(n, |d: usize| d.min(n))),
                }
            }
        }
        Err(diverged.map_or_else(
            || ReceiveError::BaseMissing(name.into()),
            ReceiveError::Diverged,
        ))
    }

    /// Receives `stream` (checked whole first): makes the live tree the sent snapshot's
    /// tree and takes it as a snapshot of the sent name, which it returns.
    pub async fn receive(&self, stream: &[u8]) -> Result<SnapshotInfo, ReceiveError> {
        let (header, records) = stream::decode(stream).map_err(ReceiveError::Stream)?;
        validate(&header, &records)?;
        let Header {
            source,
            snapshot,
            base,
        } = header;
        if self
            .snapshots()
            .await?
            .iter()
            .any(|s| s.name == snapshot.name)
        {
            return Err(ReceiveError::Exists(snapshot.name));
        }
        let base_view = match &base {
            Some(b) => Some(
                self.base_for(&received_mark(&source, b.seq), &b.name)
                    .await?,
            ),
            None => {
                if self.readdir(ROOT_INO, 0, 3).await?.len() > 2 {
                    return Err(ReceiveError::NotEmpty);
                }
                None
            }
        };
        self.apply(base_view, &records, &received_mark(&source, snapshot.seq))
            .await?;
        Ok(self.snapshot_create(&snapshot.name).await?)
    }

    /// Makes the staging directory: the first free of `STAGING`, `STAGING.1`, ... (a
    /// receive that stopped half way left one, which a rollback removes).
    async fn make_staging(&self) -> Result<(Ino, Vec<u8>), ReceiveError> {
        for n in 0u32.. {
            let name = match n {
                0 => STAGING.to_vec(),
                n => [STAGING, format!(".{n}").as_bytes()].concat(),
            };
            match self.mkdir(ROOT_INO, &name, 0o700, OWNER).await {
                Ok(a) => return Ok((a.ino, name)),
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("u32 staging names")
    }

    /// Applies `records` to the live tree (which equals `base`, or is empty without
    /// one) and marks its root with `mark`.
    async fn apply(
        &self,
        base: Option<Arc<NineFs<D>>>,
        records: &[Record],
        mark: &[u8],
    ) -> Result<(), ReceiveError> {
        let (staging, staging_name) = self.make_staging().await?;
        let mut a = Apply {
            fs: self,
            base,
            staging,
            new: BTreeMap::new(),
            resolved: BTreeMap::new(),
            staged_dirs: BTreeMap::new(),
            next_name: 0,
        };
        for r in records {
            if let Record::Unlink(dir, name) = r {
                a.unlink(dir, name).await?;
            }
        }
        for r in records {
            if let Record::Inode(
                s @ InodeState {
                    ino: InodeRef::New(src),
                    ..
                },
            ) = r
            {
                a.make(s, *src).await?;
            }
        }
        for r in records {
            if let Record::Link(dir, name, child) = r {
                a.link(dir, name, child).await?;
            }
        }
        for r in records {
            match r {
                Record::Inode(s) => a.attributes(s).await?,
                Record::Xattrs(ino, list) => a.xattrs(ino, list).await?,
                Record::Data(ino, offset, data) => {
                    let ino = a.resolve(ino).await?;
                    self.write(ino, *offset, data).await?;
                }
                _ => {}
            }
        }
        a.clear_staging(&staging_name).await?;
        self.setxattr(ROOT_INO, RECEIVED_XATTR, mark, XattrMode::Upsert)
            .await?;
        for r in records {
            if let Record::Inode(s) = r {
                let ino = a.resolve(&s.ino).await?;
                self.restore_times(ino, [s.atime, s.mtime, s.ctime, s.btime])
                    .await?;
            }
        }
        Ok(())
    }

    /// Rolls the live tree back to the last received snapshot, after local changes or
    /// a receive that stopped half way (a crash), so that the next incremental applies.
    /// Returns that snapshot's name. The live tree is taken as a snapshot, the stream
    /// from it to the received one is applied, and the result is snapshotted again
    /// under the received name (it must equal the live tree key for key); at every
    /// step some snapshot with the received mark equals the live tree or the live tree
    /// is untouched, so a crash in between only leaves it to run again.
    pub async fn receive_rollback(&self) -> Result<String, ReceiveError> {
        let last = self
            .received()
            .await?
            .into_iter()
            .max_by_key(|(item, _, _)| item.seq)
            .ok_or(ReceiveError::BaseMissing("(none received)".into()))?;
        let (item, mark, view) = last;
        let name = String::from_utf8_lossy(&item.name).into_owned();
        self.checkpoint(CheckpointCause::Snapshot).await?;
        if self.differs_from(&view).await? == 0 {
            return Ok(name);
        }
        for tmp in [ROLLBACK_LIVE, ROLLBACK_BASE] {
            match self.snapshot_delete(tmp).await {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.snapshot_create(ROLLBACK_LIVE).await?;
        let mut stream = Vec::new();
        self.send(&name, Some(ROLLBACK_LIVE), &mut |b: &[u8]| {
            stream.extend_from_slice(b);
            Ok(())
        })
        .await?;
        let (_, records) = stream::decode(&stream).map_err(ReceiveError::Stream)?;
        let live = self.snapshot_view(ROLLBACK_LIVE).await?;
        self.apply(Some(live), &records, &mark).await?;
        self.snapshot_create(ROLLBACK_BASE).await?;
        self.snapshot_delete(&name).await?;
        self.snapshot_create(&name).await?;
        self.snapshot_delete(ROLLBACK_BASE).await?;
        self.snapshot_delete(ROLLBACK_LIVE).await?;
        Ok(name)
    }
}
