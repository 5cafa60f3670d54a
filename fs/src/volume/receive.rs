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
//! differs). The stream is read twice ([`StreamSource`]): checked whole first, then
//! applied, so its size never costs memory and a damaged one changes nothing.
//!
//! Records are applied in the order the sender writes them, which is one where no order
//! of renames can cycle or collide: removed entries are first moved into a staging
//! directory at the root, new inodes are made there (with their attributes, xattrs and
//! data), added entries are linked (directories renamed) into place, what is left in
//! staging is deleted, and times are set last (every other step changes some).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use super::core::Txn;
use super::dir::check_name;
use super::inode::check_target;
use super::send::RECEIVED_XATTR;
use super::snapshot::{read_items, SnapshotInfo};
use super::treediff;
use super::xattr::check_xattr_name;
use super::{CheckpointCause, NineFs};
use crate::format::items::SnapshotItem;
use crate::format::stream::{DataMode, Decoder, Header, InodeRef, InodeState, Record, StreamError};
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
    staging_name: Vec<u8>,
    new: BTreeMap<Ino, Ino>,
    /// Every described inode's times, set last.
    times: Vec<(Ino, [Timespec; 4])>,
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

    /// Applies one record (in stream order, which [`Validator`] checked).
    async fn record(&mut self, r: &Record) -> Result<(), ReceiveError> {
        match r {
            Record::Begin(_) => {}
            Record::Unlink(dir, name) => self.unlink(dir, name).await?,
            Record::Inode(s) => {
                if let InodeRef::New(src) = s.ino {
                    self.make(s, src).await?;
                }
                self.attributes(s).await?;
                let ino = self.resolve(&s.ino).await?;
                self.times.push((ino, [s.atime, s.mtime, s.ctime, s.btime]));
            }
            Record::Xattrs(ino, list) => self.xattrs(ino, list).await?,
            Record::Data(ino, offset, data) => {
                let ino = self.resolve(ino).await?;
                self.fs.write(ino, *offset, data).await?;
            }
            Record::Link(dir, name, child) => self.link(dir, name, child).await?,
        }
        Ok(())
    }

    /// After the last record: empties and removes staging, marks the root with `mark`
    /// and sets the times (every other step changes some).
    async fn finish(mut self, mark: &[u8]) -> Result<(), ReceiveError> {
        self.clear_staging().await?;
        self.fs
            .setxattr(ROOT_INO, RECEIVED_XATTR, mark, XattrMode::Upsert)
            .await?;
        for (ino, times) in self.times {
            self.fs.restore_times(ino, times).await?;
        }
        Ok(())
    }

    /// Deletes what is left in staging (entries removed for good), then staging.
    async fn clear_staging(&mut self) -> Result<(), ReceiveError> {
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
        fs.rmdir(ROOT_INO, &self.staging_name).await?;
        Ok(())
    }
}

/// Checks, record by record, what the checksums cannot, so that a stream the receiver
/// could not apply is refused in the checking pass, before anything changes:
/// - the records come in the order the receiver applies them in (entries removed, then
///   each inode followed by its xattrs and data, then entries added);
/// - an inode named by sender number is described before it is used, and once;
/// - a full stream names nothing by a base path but the root;
/// - every mode names a type; names, symlink targets, xattr names and values are ones
///   the filesystem takes; data lies within its file and only where data is sent.
struct Validator {
    full: bool,
    phase: u8,
    described: alloc::collections::BTreeSet<Ino>,
    /// The last inode described: its ref, size and how its data comes.
    current: Option<(InodeRef, u64, DataMode)>,
}

fn refuse(what: &'static str) -> ReceiveError {
    ReceiveError::Inconsistent(what)
}

impl Validator {
    fn new(header: &Header) -> Validator {
        Validator {
            full: header.base.is_none(),
            phase: 0,
            described: alloc::collections::BTreeSet::new(),
            current: None,
        }
    }

    fn uses(&self, r: &InodeRef) -> Result<(), ReceiveError> {
        match r {
            InodeRef::New(n) if !self.described.contains(n) => {
                Err(refuse("an inode used before it is described"))
            }
            InodeRef::Base(path) if self.full && !path.is_empty() => {
                Err(refuse("a base path in a full stream"))
            }
            InodeRef::Base(path) if path.iter().any(|n| check_name(n).is_err()) => {
                Err(refuse("a bad name in a base path"))
            }
            _ => Ok(()),
        }
    }

    /// `r` must be the inode described last.
    fn of_current(&self, r: &InodeRef) -> Result<(u64, DataMode), ReceiveError> {
        match &self.current {
            Some((ino, size, data)) if ino == r => Ok((*size, *data)),
            _ => Err(refuse("xattrs or data away from their inode")),
        }
    }

    fn check(&mut self, r: &Record) -> Result<(), ReceiveError> {
        let phase = match r {
            Record::Begin(_) | Record::Unlink(..) => 0,
            Record::Inode(_) | Record::Xattrs(..) | Record::Data(..) => 1,
            Record::Link(..) => 2,
        };
        if phase < self.phase {
            return Err(refuse("records out of order"));
        }
        self.phase = phase;
        match r {
            Record::Begin(_) => Ok(()),
            Record::Inode(s) => {
                let ty = FileType::from_mode(s.mode).ok_or(refuse("mode"))?;
                if ty == FileType::Symlink {
                    check_target(&s.target).map_err(|_| refuse("a bad symlink target"))?;
                }
                if s.data != DataMode::Keep && ty != FileType::Regular {
                    return Err(refuse("data for an inode that is not a file"));
                }
                if s.size > super::MAX_FILE_SIZE {
                    return Err(refuse("a file too large"));
                }
                if let InodeRef::New(n) = s.ino {
                    if !self.described.insert(n) {
                        return Err(refuse("an inode described twice"));
                    }
                }
                self.current = Some((s.ino.clone(), s.size, s.data));
                self.uses(&s.ino)
            }
            Record::Xattrs(ino, list) => {
                self.of_current(ino)?;
                if list
                    .iter()
                    .any(|(n, v)| check_xattr_name(n).is_err() || v.len() > vfs::XATTR_VALUE_MAX)
                {
                    return Err(refuse("a bad xattr"));
                }
                Ok(())
            }
            Record::Data(ino, offset, data) => {
                let (size, mode) = self.of_current(ino)?;
                let end = offset.checked_add(data.len() as u64);
                if mode == DataMode::Keep || end.is_none_or(|e| e > size) {
                    return Err(refuse("data outside its file"));
                }
                Ok(())
            }
            Record::Unlink(dir, name) => {
                check_name(name).map_err(|_| refuse("a bad name"))?;
                self.uses(dir)
            }
            Record::Link(dir, name, child) => {
                check_name(name).map_err(|_| refuse("a bad name"))?;
                self.uses(dir).and(self.uses(child))
            }
        }
    }
}

/// A stream the receiver reads twice: once to check it whole, then to apply it.
#[allow(async_fn_in_trait)]
pub trait StreamSource {
    /// Goes back to the stream's start.
    async fn rewind(&mut self) -> Result<(), Errno>;
    /// Reads the next bytes into `buf`; how many (0: the end).
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Errno>;
}

/// A stream in memory.
#[derive(Debug)]
pub struct InMemory<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> InMemory<'a> {
    /// The stream `bytes`.
    pub fn new(bytes: &'a [u8]) -> InMemory<'a> {
        InMemory { bytes, at: 0 }
    }
}

impl StreamSource for InMemory<'_> {
    async fn rewind(&mut self) -> Result<(), Errno> {
        self.at = 0;
        Ok(())
    }

    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Errno> {
        let n = buf.len().min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The records of a source, read a chunk at a time through a [`Decoder`] and checked
/// by a [`Validator`].
struct Records<'a, S: StreamSource> {
    src: &'a mut S,
    decoder: Decoder,
    pending: alloc::collections::VecDeque<Record>,
    validator: Option<Validator>,
    chunk: Vec<u8>,
}

impl<'a, S: StreamSource> Records<'a, S> {
    /// From the start of `src`: the records and the header.
    async fn start(src: &'a mut S) -> Result<(Self, Header), ReceiveError> {
        src.rewind().await?;
        let mut r = Records {
            src,
            decoder: Decoder::new(),
            pending: alloc::collections::VecDeque::new(),
            validator: None,
            chunk: alloc::vec![0; 64 * 1024],
        };
        match r.next().await? {
            Some(Record::Begin(h)) => {
                r.validator = Some(Validator::new(&h));
                Ok((r, h))
            }
            _ => Err(ReceiveError::Stream(StreamError::Malformed(0))),
        }
    }

    async fn next(&mut self) -> Result<Option<Record>, ReceiveError> {
        while self.pending.is_empty() {
            let n = self.src.read(&mut self.chunk).await?;
            if n == 0 {
                self.decoder.finish().map_err(ReceiveError::Stream)?;
                return Ok(None);
            }
            let recs = self
                .decoder
                .push(&self.chunk[..n])
                .map_err(ReceiveError::Stream)?;
            self.pending.extend(recs);
        }
        let r = self.pending.pop_front();
        if let (Some(v), Some(r)) = (&mut self.validator, &r) {
            v.check(r)?;
        }
        Ok(r)
    }
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
        self.receive_from(&mut InMemory::new(stream)).await
    }

    /// [`NineFs::receive`] from a source read twice: once checked whole, once applied
    /// (the memory a receive takes is one record's, whatever the stream's size).
    pub async fn receive_from(
        &self,
        src: &mut impl StreamSource,
    ) -> Result<SnapshotInfo, ReceiveError> {
        let (mut records, header) = Records::start(src).await?;
        while records.next().await?.is_some() {}
        let Header {
            source,
            snapshot,
            base,
        } = &header;
        if self
            .snapshots()
            .await?
            .iter()
            .any(|s| s.name == snapshot.name)
        {
            return Err(ReceiveError::Exists(snapshot.name.clone()));
        }
        let base_view = match base {
            Some(b) => Some(
                self.base_for(&received_mark(source, b.seq), &b.name)
                    .await?,
            ),
            None => {
                if self.readdir(ROOT_INO, 0, 3).await?.len() > 2 {
                    return Err(ReceiveError::NotEmpty);
                }
                None
            }
        };
        let (mut records, again) = Records::start(records.src).await?;
        if again != header {
            return Err(ReceiveError::Inconsistent("the stream changed while read"));
        }
        let mut a = self.start_apply(base_view).await?;
        while let Some(r) = records.next().await? {
            a.record(&r).await?;
        }
        a.finish(&received_mark(source, snapshot.seq)).await?;
        Ok(self.snapshot_create(&snapshot.name).await?)
    }

    /// Makes the staging directory — the first free of `STAGING`, `STAGING.1`, ... (a
    /// receive that stopped half way left one, which a rollback removes) — and starts
    /// applying records to the live tree, which equals `base` (or is empty without one).
    async fn start_apply(
        &self,
        base: Option<Arc<NineFs<D>>>,
    ) -> Result<Apply<'_, D>, ReceiveError> {
        for n in 0u32.. {
            let name = match n {
                0 => STAGING.to_vec(),
                n => [STAGING, format!(".{n}").as_bytes()].concat(),
            };
            match self.mkdir(ROOT_INO, &name, 0o700, OWNER).await {
                Ok(attr) => {
                    return Ok(Apply {
                        fs: self,
                        base,
                        staging: attr.ino,
                        staging_name: name,
                        new: BTreeMap::new(),
                        times: Vec::new(),
                        resolved: BTreeMap::new(),
                        staged_dirs: BTreeMap::new(),
                        next_name: 0,
                    })
                }
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("u32 staging names")
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
        let live = self.snapshot_view(ROLLBACK_LIVE).await?;
        let mut src = InMemory::new(&stream);
        let (mut records, _) = Records::start(&mut src).await?;
        let mut a = self.start_apply(Some(live)).await?;
        while let Some(r) = records.next().await? {
            a.record(&r).await?;
        }
        a.finish(&mark).await?;
        self.snapshot_create(ROLLBACK_BASE).await?;
        self.snapshot_delete(&name).await?;
        self.snapshot_create(&name).await?;
        self.snapshot_delete(ROLLBACK_BASE).await?;
        self.snapshot_delete(ROLLBACK_LIVE).await?;
        Ok(name)
    }
}
