//! Receiving a snapshot stream (`docs/format.md`, "Snapshot streams"): the live tree of
//! the target is made the sent snapshot's tree, then a snapshot of it is taken under the
//! sent name. That snapshot is the result: it appears whole (its checkpoint) or not at
//! all.
//!
//! What a target holds is known from its snapshots: the root of every received one
//! carries [`RECEIVED_XATTR`] (the sender's uuid and the snapshot's checkpoint there).
//! An incremental stream applies only if a snapshot with its base's identity exists and
//! the live tree still equals it (compared with [`treediff`], so the check costs what
//! differs); a full one only to an empty live tree.
//!
//! The stream is read twice ([`StreamSource`]). The first pass checks it whole before
//! anything changes: its framing ([`Decoder`](crate::format::stream::Decoder)), each
//! record on its own (`validate`) and what the records do to the tree they apply to
//! (`model`: every path names an inode there, an entry removed is there and one added
//! is free, links go into directories, no directory gets a second name or goes under
//! itself, no inode changes its type, every inode described keeps a name, every
//! directory removed is empty). The second pass is checked the same way as it is
//! applied (`apply`), record by record (a client may write a different stream the
//! second time). Whatever still fails while applying (no space, a quota, a device
//! error, a second pass that differs, a stop) is rolled back before the receive
//! returns: what the receive made is deleted, then the live tree is made what it was
//! (the base snapshot again, or empty), and the next stream is received as if this one
//! had never come.
//!
//! Records are applied in the order the sender writes them, which is one where no order
//! of renames can cycle or collide: removed entries are first moved into a staging
//! directory at the root, new inodes are made there (with their attributes, xattrs and
//! data), added entries are linked (directories renamed) into place, what is left in
//! staging is deleted, and times are set last (every other step changes some).

mod apply;
mod model;
mod source;
mod validate;

use alloc::boxed::Box;
use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use crate::core::checkpoint::CheckpointCause;
use crate::core::dir::FIRST_INDEX;
use crate::core::txn::Txn;
use crate::engine::Engine;
use crate::features::snapshots::{read_items, valid_name, SnapshotInfo};
use crate::features::streams::host::StreamHost;
use crate::features::streams::send::{self, RECEIVED_XATTR};
use crate::features::streams::treediff;
use crate::features::streams::Streams;
use crate::format::items::SnapshotItem;
use crate::format::stream::{Header, StreamError};
use crate::format::TreeId;
use apply::Apply;
use block::BlockDevice;
use model::Model;
use source::Records;
pub use source::{InMemory, StreamSource};
use vfs::{
    Attr, Errno, FileSystem, FileType, FsResult, Ino, Owner, SetAttr, Timespec, XattrMode, ROOT_INO,
};

/// Name of the staging directory at the root while a receive runs (or, when the stream
/// itself has an entry of that name at the root, `STAGING.1`, `STAGING.2`, ...).
pub const STAGING: &[u8] = b".ninefold-receive";
/// The live tree as a rollback found it (deleted when it is done).
pub const ROLLBACK_LIVE: &str = "receive-rollback-live";
/// The rolled-back tree while its snapshot is retaken (deleted when it is done).
pub const ROLLBACK_BASE: &str = "receive-rollback-base";

/// Whether `name` is one a staging directory may have: [`STAGING`], or it and `.N`.
pub fn is_staging_name(name: &[u8]) -> bool {
    match name.strip_prefix(STAGING) {
        Some([]) => true,
        Some([b'.', n @ ..]) => !n.is_empty() && n.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// Why a receive was refused or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiveError {
    /// The stream is damaged, truncated or not a stream; nothing was applied.
    Stream(StreamError),
    /// No snapshot here is the incremental stream's base.
    BaseMissing(String),
    /// A rollback with nothing received here and no receive stopped half way: there is
    /// nothing to roll back to.
    NothingToRollBack,
    /// The live tree changed since the base snapshot (`.0` keys differ), or a receive
    /// stopped half way: roll back before receiving more.
    Diverged(usize),
    /// A full stream needs an empty live tree.
    NotEmpty,
    /// A snapshot of that name exists already.
    Exists(String),
    /// The stream names its snapshot with a name no snapshot may have
    /// ([`valid_name`]).
    BadName(String),
    /// No room for the received snapshot (and, for an incremental, the two a rollback
    /// would take): `.0` snapshots exist, at most `.1`.
    SnapshotLimit(usize, usize),
    /// The stream refers to something it never described or that is not there, or asks
    /// for what the filesystem would refuse (`.0` says what); nothing was applied.
    Inconsistent(&'static str),
    /// A receive or a rollback is running.
    Busy,
    /// The filesystem failed an operation.
    Fs(Errno),
    /// Applying failed part way (`.0`); the live tree was rolled back to what it was.
    RolledBack(Box<ReceiveError>),
    /// Applying failed part way (`.0`), and so did rolling back (`.1`): the live tree
    /// is half way, as after a crash (`receive rollback`).
    NotRolledBack(Box<ReceiveError>, Box<ReceiveError>),
}

impl From<Errno> for ReceiveError {
    fn from(e: Errno) -> ReceiveError {
        ReceiveError::Fs(e)
    }
}

impl ReceiveError {
    /// What went wrong, without what it left (for a failure while applying).
    fn cause(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReceiveError::Stream(e) => write!(f, "{e}"),
            ReceiveError::Inconsistent(w) => write!(f, "inconsistent stream: {w}"),
            e => write!(f, "{e}"),
        }
    }
}

/// [`ReceiveError::cause`] as a value to format.
struct Cause<'a>(&'a ReceiveError);

impl fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.cause(f)
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
            ReceiveError::NothingToRollBack => write!(
                f,
                "nothing to roll back: no snapshot was received here and no receive \
                 stopped half way"
            ),
            ReceiveError::NotEmpty => write!(
                f,
                "a full stream needs an empty filesystem (after a receive that stopped \
                 half way: receive rollback)"
            ),
            ReceiveError::Exists(n) => write!(f, "snapshot {n:?} exists already"),
            ReceiveError::BadName(n) => write!(
                f,
                "the stream's snapshot name {n:?} is not one a snapshot may have; nothing applied"
            ),
            ReceiveError::SnapshotLimit(n, max) => write!(
                f,
                "{n} of at most {max} snapshots exist: no room for the received one (and, \
                 for an incremental, the two a rollback takes)"
            ),
            ReceiveError::Inconsistent(w) => write!(f, "inconsistent stream: {w}; nothing applied"),
            ReceiveError::Busy => write!(f, "a receive or a rollback is running"),
            ReceiveError::Fs(e) => write!(f, "{e}"),
            ReceiveError::RolledBack(e) => write!(
                f,
                "failed while applying: {}; rolled back: the live tree is as it was",
                Cause(e)
            ),
            ReceiveError::NotRolledBack(e, r) => write!(
                f,
                "failed while applying: {}; rolling back failed too ({}): the live tree \
                 is half way (receive rollback)",
                Cause(e),
                Cause(r)
            ),
        }
    }
}

/// The value of [`RECEIVED_XATTR`] for snapshot `seq` of filesystem `source`.
pub fn received_mark(source: &[u8; 16], seq: u64) -> Vec<u8> {
    [&source[..], &seq.to_le_bytes()].concat()
}

/// Who owns what a receive makes before its INODE record gives the owner.
const OWNER: Owner = Owner { uid: 0, gid: 0 };

/// A record the check refuses: `what` it asks for.
fn refuse(what: &'static str) -> ReceiveError {
    ReceiveError::Inconsistent(what)
}

/// The root's own state before a full receive (it had no entries), given back if the
/// receive fails.
struct RootState {
    attr: Attr,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RootState {
    async fn capture(fs: &impl FileSystem) -> Result<RootState, ReceiveError> {
        let mut xattrs = Vec::new();
        for name in fs.listxattr(ROOT_INO).await? {
            let value = fs.getxattr(ROOT_INO, &name).await?;
            xattrs.push((name, value));
        }
        Ok(RootState {
            attr: fs.getattr(ROOT_INO).await?,
            xattrs,
        })
    }

    async fn restore(&self, fs: &impl StreamHost) -> Result<(), ReceiveError> {
        for name in fs.listxattr(ROOT_INO).await? {
            if !self.xattrs.iter().any(|(n, _)| *n == name) {
                fs.removexattr(ROOT_INO, &name).await?;
            }
        }
        for (name, value) in &self.xattrs {
            fs.setxattr(ROOT_INO, name, value, XattrMode::Upsert)
                .await?;
        }
        let a = &self.attr;
        let set = SetAttr {
            uid: Some(a.uid),
            gid: Some(a.gid),
            mode: Some(a.mode & vfs::mode::PERMISSIONS),
            ..SetAttr::default()
        };
        fs.setattr(ROOT_INO, set).await?;
        restore_times(fs.engine(), ROOT_INO, [a.atime, a.mtime, a.ctime, a.btime]).await?;
        Ok(())
    }
}

/// The first pass over `records`: each checked against the tree (the `base` snapshot,
/// or an empty live tree). Returns the names the stream adds at the root that a
/// staging directory could have.
async fn check_pass<V: FileSystem, S: StreamSource>(
    records: &mut Records<'_, S>,
    base: Option<Arc<V>>,
) -> Result<BTreeSet<Vec<u8>>, ReceiveError> {
    let mut model = Model::new(base, None);
    while let Some(r) = records.next().await? {
        model.record(&r).await?;
    }
    model.finish()?;
    Ok(model.root_names)
}

/// Sets all four times of `ino` as given (a receive restores them as sent; `setattr`
/// cannot set ctime or btime).
pub(crate) async fn restore_times<D: BlockDevice>(
    engine: &Engine<D>,
    ino: Ino,
    times: [Timespec; 4],
) -> FsResult<()> {
    engine
        .run(|c| {
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
async fn received<H: StreamHost>(
    host: &H,
) -> Result<Vec<(SnapshotItem, Vec<u8>, Arc<H>)>, ReceiveError> {
    let mut out = Vec::new();
    for (id, item) in host.engine().run(read_items).await? {
        let view = host.view(host.snaps().view_of(id, &item));
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
async fn differs_from<H: StreamHost>(host: &H, view: &H) -> Result<usize, ReceiveError> {
    let (node_size, live) = {
        let c = host.engine().core.lock();
        (c.sb.node_size, c.sb.root(TreeId::Fs))
    };
    let snap = view.engine().core.lock().sb.root(TreeId::Fs);
    let d = treediff::diff(
        &host.engine().dev,
        node_size,
        TreeId::Fs,
        Some(snap),
        Some(live),
    )
    .await?;
    Ok(d.changes.keys().filter(|k| k.objectid != 0).count())
}

/// The snapshot carrying `mark` that the live tree still equals, key for key (after
/// a rollback two may carry it: the one the live tree equals counts): its name here
/// and its view.
async fn base_for<H: StreamHost>(
    host: &H,
    mark: &[u8],
    name: &str,
) -> Result<(String, Arc<H>), ReceiveError> {
    host.engine().checkpoint(CheckpointCause::Snapshot).await?;
    let mut diverged = None;
    for (item, m, view) in received(host).await? {
        if m == mark {
            match differs_from(host, &view).await? {
                0 => return Ok((String::from_utf8_lossy(&item.name).into_owned(), view)),
                n => diverged = Some(diverged.map_or(n, |d: usize| d.min(n))),
            }
        }
    }
    Err(diverged.map_or_else(
        || ReceiveError::BaseMissing(name.into()),
        ReceiveError::Diverged,
    ))
}

impl Streams {
    /// Receives `stream` (checked whole first) into `host`: makes the live tree the sent
    /// snapshot's tree and takes it as a snapshot of the sent name, which it returns.
    pub(crate) async fn receive(
        &self,
        host: &impl StreamHost,
        stream: &[u8],
    ) -> Result<SnapshotInfo, ReceiveError> {
        self.receive_from(host, &mut InMemory::new(stream)).await
    }

    /// [`Streams::receive`] from a source read twice: once checked whole, once applied
    /// (the memory a receive takes is one record's, whatever the stream's size, plus
    /// what the check keeps of the inodes and entries the stream touches). A stream
    /// refused by the check changes nothing; one that fails while it is applied is
    /// rolled back ([`ReceiveError::RolledBack`]) before this returns.
    pub(crate) async fn receive_from(
        &self,
        host: &impl StreamHost,
        src: &mut impl StreamSource,
    ) -> Result<SnapshotInfo, ReceiveError> {
        let _one = self.receive_lock.try_lock().ok_or(ReceiveError::Busy)?;
        let (mut records, header) = Records::start(src).await?;
        let Header {
            source,
            snapshot,
            base,
        } = &header;
        if !valid_name(&snapshot.name) {
            return Err(ReceiveError::BadName(snapshot.name.clone()));
        }
        let existing = host.snaps().snapshots().await?;
        if existing.iter().any(|s| s.name == snapshot.name) {
            return Err(ReceiveError::Exists(snapshot.name.clone()));
        }
        // The received snapshot; for an incremental, the two a rollback takes.
        let room = if base.is_some() { 2 } else { 1 };
        if existing.len() + room > host.snaps().max_snapshots {
            return Err(ReceiveError::SnapshotLimit(
                existing.len(),
                host.snaps().max_snapshots,
            ));
        }
        let base_mark = base.as_ref().map(|b| received_mark(source, b.seq));
        let base = match (base, &base_mark) {
            (Some(b), Some(mark)) => Some(base_for(host, mark, &b.name).await?),
            _ => {
                if host.readdir(ROOT_INO, 0, 3).await?.len() > 2 {
                    return Err(ReceiveError::NotEmpty);
                }
                None
            }
        };
        let view = base.as_ref().map(|(_, v)| v.clone());
        let reserved = check_pass(&mut records, view.clone()).await?;
        let (mut records, again) = Records::start(records.src).await?;
        if again != header {
            return Err(ReceiveError::Inconsistent("the stream changed while read"));
        }
        let before = match base {
            None => Some(RootState::capture(host).await?),
            Some(_) => None,
        };
        let mark = received_mark(source, snapshot.seq);
        let applied = match apply_records(host, &mut records, view, &reserved, &mark).await {
            Ok(()) => host
                .snaps()
                .snapshot_create(&snapshot.name)
                .await
                .map_err(ReceiveError::from),
            Err(e) => Err(e),
        };
        let failed = match applied {
            Ok(info) => return Ok(info),
            Err(e) => Box::new(e),
        };
        log::warn!("receive: {}; rolling back", Cause(&failed));
        let undone = match (&base, &base_mark) {
            (Some((name, view)), Some(mark)) => rollback_to(host, name, mark, view.clone()).await,
            _ => empty_live(host, before.as_ref()).await,
        };
        Err(match undone {
            Ok(()) => ReceiveError::RolledBack(failed),
            Err(e) => ReceiveError::NotRolledBack(failed, Box::new(e)),
        })
    }
}

/// The second pass: makes the staging directory, then checks and applies each
/// record, and finishes with `mark` on the root. `reserved`: names the staging
/// directory may not take.
async fn apply_records<H: StreamHost, S: StreamSource>(
    host: &H,
    records: &mut Records<'_, S>,
    base: Option<Arc<H>>,
    reserved: &BTreeSet<Vec<u8>>,
    mark: &[u8],
) -> Result<(), ReceiveError> {
    let mut a = start_apply(host, base, reserved).await?;
    let mut applied = async {
        while let Some(r) = records.next().await? {
            a.record(&r).await?;
        }
        Ok(())
    }
    .await;
    if applied.is_ok() {
        applied = a.finish(mark).await;
    }
    if applied.is_err() {
        if let Err(e) = a.discard().await {
            log::warn!("receive: deleting what it made failed: {e}");
        }
    }
    applied
}

/// Makes the staging directory — the first free of `STAGING`, `STAGING.1`, ... not
/// in `reserved` (a receive that stopped half way left one, which a rollback
/// removes) — and starts applying records to the live tree, which equals `base` (or
/// is empty without one).
async fn start_apply<'a, H: StreamHost>(
    host: &'a H,
    base: Option<Arc<H>>,
    reserved: &BTreeSet<Vec<u8>>,
) -> Result<Apply<'a, H>, ReceiveError> {
    for n in 0u32.. {
        let name = match n {
            0 => STAGING.to_vec(),
            n => [STAGING, format!(".{n}").as_bytes()].concat(),
        };
        if reserved.contains(&name) {
            continue;
        }
        match host.mkdir(ROOT_INO, &name, 0o700, OWNER).await {
            Ok(attr) => return Ok(Apply::new(host, base, attr.ino, name)),
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("u32 staging names")
}

/// Removes `dir`/`name` and everything below it, depth first with a stack of its
/// own (however deep the tree), but what `spare` gives a place (a directory and a
/// name): that is moved there instead, with what is below it.
async fn remove_tree(
    fs: &impl FileSystem,
    dir: Ino,
    name: &[u8],
    spare: &mut impl FnMut(&Attr) -> Option<(Ino, Vec<u8>)>,
) -> Result<(), Errno> {
    let mut stack = alloc::vec![(dir, name.to_vec())];
    while let Some((parent, name)) = stack.last() {
        let (parent, attr) = (*parent, fs.lookup(*parent, name).await?);
        if let Some((to, to_name)) = spare(&attr) {
            fs.rename(parent, name, to, &to_name).await?;
            stack.pop();
            continue;
        }
        if attr.file_type() != FileType::Directory {
            fs.unlink(parent, name).await?;
            stack.pop();
            continue;
        }
        match fs.readdir(attr.ino, FIRST_INDEX, 1).await?.pop() {
            Some(e) => stack.push((attr.ino, e.name)),
            None => {
                fs.rmdir(parent, name).await?;
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Removes every entry of the live tree (staging directories last: while one is
/// there, a rollback after a crash knows a receive was half way), then gives the
/// root the attributes and xattrs of `before`.
async fn empty_live(
    host: &impl StreamHost,
    before: Option<&RootState>,
) -> Result<(), ReceiveError> {
    loop {
        let entries = host.readdir(ROOT_INO, FIRST_INDEX, 256).await?;
        let next = entries
            .iter()
            .find(|e| !is_staging_name(&e.name))
            .or(entries.first());
        let Some(e) = next else { break };
        remove_tree(host, ROOT_INO, &e.name, &mut |_| None).await?;
    }
    if let Some(before) = before {
        before.restore(host).await?;
    }
    Ok(())
}

/// Whether a staging directory is at the root: a receive stopped half way.
async fn staging_left(host: &impl FileSystem) -> Result<bool, ReceiveError> {
    let mut offset = FIRST_INDEX;
    loop {
        let entries = host.readdir(ROOT_INO, offset, 256).await?;
        let Some(last) = entries.last() else {
            return Ok(false);
        };
        offset = last.next_offset;
        if entries
            .iter()
            .any(|e| e.file_type == FileType::Directory && is_staging_name(&e.name))
        {
            return Ok(true);
        }
    }
}

impl Streams {
    /// Rolls the live tree back to the last received snapshot, after local changes or
    /// a receive that stopped half way (a crash), so that the next incremental applies.
    /// Returns that snapshot's name. With none received, a full receive that stopped
    /// half way (its staging directory is there) is undone by emptying the live tree
    /// (`None`), as it was before; without one, there is nothing to roll back
    /// ([`ReceiveError::NothingToRollBack`]).
    pub(crate) async fn receive_rollback(
        &self,
        host: &impl StreamHost,
    ) -> Result<Option<String>, ReceiveError> {
        let _one = self.receive_lock.try_lock().ok_or(ReceiveError::Busy)?;
        let last = received(host)
            .await?
            .into_iter()
            .max_by_key(|(item, _, _)| item.seq);
        let Some((item, mark, view)) = last else {
            if !staging_left(host).await? {
                return Err(ReceiveError::NothingToRollBack);
            }
            empty_live(host, None).await?;
            return Ok(None);
        };
        let name = String::from_utf8_lossy(&item.name).into_owned();
        rollback_to(host, &name, &mark, view).await?;
        Ok(Some(name))
    }
}

/// Makes the live tree snapshot `name` (`view`, carrying `mark`) again. The live
/// tree is taken as a snapshot, the stream from it to `name` is checked and applied,
/// and the result is snapshotted again under `name` (it must equal the live tree key
/// for key); at every step some snapshot with the mark equals the live tree or the
/// live tree is untouched, so a crash in between only leaves it to run again.
async fn rollback_to<H: StreamHost>(
    host: &H,
    name: &str,
    mark: &[u8],
    view: Arc<H>,
) -> Result<(), ReceiveError> {
    host.engine().checkpoint(CheckpointCause::Snapshot).await?;
    if differs_from(host, &view).await? == 0 {
        return Ok(());
    }
    for tmp in [ROLLBACK_LIVE, ROLLBACK_BASE] {
        match host.snaps().snapshot_delete(tmp).await {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    host.snaps().snapshot_create(ROLLBACK_LIVE).await?;
    let mut stream = Vec::new();
    send::send(host, name, Some(ROLLBACK_LIVE), &mut |b: &[u8]| {
        stream.extend_from_slice(b);
        Ok(())
    })
    .await?;
    let live = host.view(host.snaps().snapshot_view(ROLLBACK_LIVE).await?);
    let mut src = InMemory::new(&stream);
    let (mut records, _) = Records::start(&mut src).await?;
    let reserved = check_pass(&mut records, Some(live.clone())).await?;
    let (mut records, _) = Records::start(records.src).await?;
    apply_records(host, &mut records, Some(live), &reserved, mark).await?;
    host.snaps().snapshot_create(ROLLBACK_BASE).await?;
    host.snaps().snapshot_delete(name).await?;
    host.snaps().snapshot_create(name).await?;
    host.snaps().snapshot_delete(ROLLBACK_BASE).await?;
    host.snaps().snapshot_delete(ROLLBACK_LIVE).await?;
    Ok(())
}
