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
//! anything changes: its framing ([`Decoder`]), the order and fields of its records
//! ([`Validator`]) and what they do to the tree they apply to ([`Model`]: every path
//! names an inode there, an entry removed is there and one added is free, links go into
//! directories, no directory gets a second name or goes under itself, no inode changes
//! its type, every inode described keeps a name, every directory removed is empty). The
//! second pass is checked the same way as it is applied, record by record (a client may
//! write a different stream the second time). Whatever still fails while applying (no
//! space, a quota, a device error, a second pass that differs, a stop) is rolled back
//! before the receive returns: the live tree is what it was (the base snapshot again, or
//! empty), and the next stream is received as if this one had never come.
//!
//! Records are applied in the order the sender writes them, which is one where no order
//! of renames can cycle or collide: removed entries are first moved into a staging
//! directory at the root, new inodes are made there (with their attributes, xattrs and
//! data), added entries are linked (directories renamed) into place, what is left in
//! staging is deleted, and times are set last (every other step changes some).

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use super::core::Txn;
use super::dir::{check_name, within, FIRST_INDEX, MAX_DEPTH};
use super::inode::check_target;
use super::send::RECEIVED_XATTR;
use super::snapdir::is_reserved;
use super::snapshot::{read_items, valid_name, SnapshotInfo};
use super::treediff;
use super::xattr::check_xattr_name;
use super::{CheckpointCause, NineFs};
use crate::format::items::SnapshotItem;
use crate::format::stream::{DataMode, Decoder, Header, InodeRef, InodeState, Record, StreamError};
use crate::format::TreeId;
use block::BlockDevice;
use vfs::{Attr, Errno, FileSystem, FileType, Ino, Owner, SetAttr, Timespec, XattrMode, ROOT_INO};

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

const OWNER: Owner = Owner { uid: 0, gid: 0 };

fn refuse(what: &'static str) -> ReceiveError {
    ReceiveError::Inconsistent(what)
}

/// An inode as the stream leaves it so far ([`Model`]).
#[derive(Clone, Copy, Debug)]
struct Node {
    ty: FileType,
    /// One of the stream's new inodes (it has no entries in the base).
    new: bool,
    /// Not a directory: its names.
    links: u32,
    /// A directory: its parent; itself while it has no name (removed, or new and not
    /// yet linked). The root is its own parent too, and always has its name.
    parent: Ino,
    /// A directory: its entries.
    entries: u64,
    /// An INODE record describes it: it must have a name when the stream ends.
    described: bool,
}

impl Node {
    fn is_dir(&self) -> bool {
        self.ty == FileType::Directory
    }
}

/// The tree a stream applies to, changed record by record as the stream would change
/// it, and every record checked against it first: what the filesystem's own operations
/// would refuse half way through applying is refused here, before anything changes.
///
/// The tree is the base snapshot (which the live tree equals) or, for a full stream,
/// an empty root, plus what the stream did so far. Base inodes are known by their
/// numbers (those of the live tree), new ones by numbers of the model's own, counted
/// down from `u64::MAX`. It holds the inodes and entries the stream touches (a few
/// dozen bytes each and the names), never the base's others, which are read from the
/// base snapshot when a record names them.
struct Model<D: BlockDevice> {
    /// The base snapshot here; `None`: a full stream, into an empty live tree.
    base: Option<Arc<NineFs<D>>>,
    /// Base entries met on paths: directory → name → inode.
    paths: BTreeMap<Ino, BTreeMap<Vec<u8>, Ino>>,
    /// Entries the stream removed (`None`) or added: directory → name → inode.
    changed: BTreeMap<Ino, BTreeMap<Vec<u8>, Option<Ino>>>,
    /// Every inode the stream touched.
    nodes: BTreeMap<Ino, Node>,
    /// New inodes: the sender's number → the model's.
    new: BTreeMap<Ino, Ino>,
    /// The model's number for the next new inode.
    next_new: Ino,
    /// Names of entries the stream adds at the root that a staging directory could
    /// have ([`is_staging_name`]): the one applying it must take another.
    root_names: BTreeSet<Vec<u8>>,
    /// While applying: the staging directory's name (no entry of the stream's may
    /// have it).
    staging: Option<Vec<u8>>,
}

impl<D: BlockDevice> Model<D> {
    fn new(base: Option<Arc<NineFs<D>>>, staging: Option<Vec<u8>>) -> Model<D> {
        Model {
            base,
            paths: BTreeMap::new(),
            changed: BTreeMap::new(),
            nodes: BTreeMap::new(),
            new: BTreeMap::new(),
            next_new: u64::MAX,
            root_names: BTreeSet::new(),
            staging,
        }
    }

    /// Base inode `ino`, whose directory in the base is `parent` (read from the base
    /// the first time; after that, as the stream left it).
    async fn base_node(&mut self, ino: Ino, parent: Ino) -> Result<Node, ReceiveError> {
        if let Some(n) = self.nodes.get(&ino) {
            return Ok(*n);
        }
        let node = match &self.base {
            Some(base) => {
                let a = base.getattr(ino).await?;
                let ty = a.file_type();
                Node {
                    ty,
                    new: false,
                    links: a.nlink,
                    parent,
                    entries: if ty == FileType::Directory { a.size } else { 0 },
                    described: false,
                }
            }
            None if ino == ROOT_INO => Node {
                ty: FileType::Directory,
                new: false,
                links: 0,
                parent: ROOT_INO,
                entries: 0,
                described: false,
            },
            None => return Err(refuse("a base path in a full stream")),
        };
        self.nodes.insert(ino, node);
        Ok(node)
    }

    fn node(&mut self, ino: Ino) -> &mut Node {
        self.nodes
            .get_mut(&ino)
            .expect("the model has every inode it resolved")
    }

    /// The inode `r` names (a base path is looked up in the base snapshot).
    async fn resolve(&mut self, r: &InodeRef) -> Result<Ino, ReceiveError> {
        let path = match r {
            InodeRef::New(n) => {
                return self
                    .new
                    .get(n)
                    .copied()
                    .ok_or(refuse("an inode used before it is described"))
            }
            InodeRef::Base(path) => path,
        };
        let mut at = ROOT_INO;
        self.base_node(ROOT_INO, ROOT_INO).await?;
        for name in path {
            let known = self.paths.get(&at).and_then(|m| m.get(name.as_slice()));
            let next = match known {
                Some(&ino) => ino,
                None => {
                    let base = self
                        .base
                        .as_ref()
                        .ok_or(refuse("a base path in a full stream"))?;
                    let ino = match base.lookup(at, name).await {
                        Ok(a) => a.ino,
                        Err(Errno::ENOENT | Errno::ENOTDIR) => {
                            return Err(refuse("a base path that names nothing here"))
                        }
                        Err(e) => return Err(e.into()),
                    };
                    self.paths.entry(at).or_default().insert(name.clone(), ino);
                    ino
                }
            };
            self.base_node(next, at).await?;
            at = next;
        }
        Ok(at)
    }

    /// What entry `name` of directory `dir` names now.
    async fn entry(&mut self, dir: Ino, name: &[u8]) -> Result<Option<Ino>, ReceiveError> {
        if let Some(e) = self.changed.get(&dir).and_then(|m| m.get(name)) {
            return Ok(*e);
        }
        let base = match &self.base {
            Some(base) if !self.nodes[&dir].new => base,
            _ => return Ok(None),
        };
        match base.lookup(dir, name).await {
            Ok(a) => Ok(Some(a.ino)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The directory `dir` names, in which entry `name` is to change.
    async fn dir(&mut self, dir: &InodeRef, name: &[u8]) -> Result<Ino, ReceiveError> {
        let d = self.resolve(dir).await?;
        if !self.nodes[&d].is_dir() {
            return Err(refuse("an entry in something not a directory"));
        }
        if is_reserved(d, name) || (d == ROOT_INO && self.staging.as_deref() == Some(name)) {
            return Err(refuse(
                "an entry named as the snapshots or the staging directory",
            ));
        }
        Ok(d)
    }

    fn set_entry(&mut self, dir: Ino, name: &[u8], to: Option<Ino>) {
        self.changed
            .entry(dir)
            .or_default()
            .insert(name.to_vec(), to);
    }

    /// Checks record `r` against the tree and changes the tree as it does.
    async fn record(&mut self, r: &Record) -> Result<(), ReceiveError> {
        match r {
            Record::Begin(_) | Record::Xattrs(..) | Record::Data(..) => Ok(()),
            Record::Inode(s) => self.inode(s).await,
            Record::Unlink(dir, name) => {
                let d = self.dir(dir, name).await?;
                let child = self
                    .entry(d, name)
                    .await?
                    .ok_or(refuse("an entry removed that is not there"))?;
                self.base_node(child, d).await?;
                self.set_entry(d, name, None);
                let dn = self.node(d);
                dn.entries = dn.entries.saturating_sub(1);
                let c = self.node(child);
                match c.is_dir() {
                    true => c.parent = child,
                    false => c.links = c.links.saturating_sub(1),
                }
                Ok(())
            }
            Record::Link(dir, name, child) => {
                let d = self.dir(dir, name).await?;
                let c = self.resolve(child).await?;
                if self.entry(d, name).await?.is_some() {
                    return Err(refuse("an entry added where one is"));
                }
                let cn = self.nodes[&c];
                if cn.is_dir() {
                    if c == ROOT_INO || cn.parent != c {
                        return Err(refuse("a second name for a directory"));
                    }
                    let nodes = &self.nodes;
                    let parent = |i: Ino| match nodes.get(&i) {
                        Some(n) => Ok(n.parent),
                        None => Err(refuse("a directory the stream never reached")),
                    };
                    if within(d, c, parent, || refuse("directories nested too deep"))? {
                        return Err(refuse("a directory linked under itself"));
                    }
                    self.node(c).parent = d;
                } else {
                    let cn = self.node(c);
                    cn.links = cn.links.saturating_add(1);
                }
                self.node(d).entries += 1;
                self.set_entry(d, name, Some(c));
                if d == ROOT_INO && is_staging_name(name) {
                    self.root_names.insert(name.clone());
                }
                Ok(())
            }
        }
    }

    /// An INODE record: a new inode is made; a base one keeps its type (an inode's type
    /// never changes: a file replaced by another kind is a new inode of the stream), its
    /// symlink target and its device number.
    async fn inode(&mut self, s: &InodeState) -> Result<(), ReceiveError> {
        let ty = FileType::from_mode(s.mode).ok_or(refuse("mode"))?;
        let ino = match &s.ino {
            InodeRef::New(n) => {
                if self.new.contains_key(n) {
                    return Err(refuse("an inode described twice"));
                }
                let ino = self.next_new;
                self.next_new -= 1;
                self.new.insert(*n, ino);
                let node = Node {
                    ty,
                    new: true,
                    links: 0,
                    parent: ino,
                    entries: 0,
                    described: false,
                };
                self.nodes.insert(ino, node);
                ino
            }
            r => {
                let ino = self.resolve(r).await?;
                if self.nodes[&ino].ty != ty {
                    return Err(refuse("an inode record changes the inode's type"));
                }
                let changed = match (&self.base, ty) {
                    (Some(base), FileType::Symlink) => base.readlink(ino).await? != s.target,
                    (Some(base), FileType::CharDevice | FileType::BlockDevice) => {
                        base.getattr(ino).await?.rdev != s.rdev
                    }
                    _ => false,
                };
                if changed {
                    return Err(refuse(
                        "an inode record changes a symlink's target or a device number",
                    ));
                }
                ino
            }
        };
        let node = self.node(ino);
        if node.described {
            return Err(refuse("an inode described twice"));
        }
        node.described = true;
        Ok(())
    }

    /// After the last record: every inode described has a name, and every directory
    /// left without one (it goes with the staging directory) is empty.
    fn finish(&self) -> Result<(), ReceiveError> {
        for (&ino, n) in &self.nodes {
            let named = match n.is_dir() {
                true => ino == ROOT_INO || n.parent != ino,
                false => n.links > 0,
            };
            if n.described && !named {
                return Err(refuse("an inode described but left without a name"));
            }
            if n.is_dir() && !named && n.entries > 0 {
                return Err(refuse("a directory removed that keeps entries"));
            }
        }
        Ok(())
    }
}

/// The receive in progress: how stream inodes map to inodes here.
struct Apply<'a, D: BlockDevice> {
    fs: &'a NineFs<D>,
    /// The tree as the records applied so far left it, which checks each record first.
    model: Model<D>,
    staging: Ino,
    staging_name: Vec<u8>,
    new: BTreeMap<Ino, Ino>,
    /// Every described inode's times, set last.
    times: Vec<(Ino, [Timespec; 4])>,
    /// Directories now in staging, by inode: their name there.
    staged_dirs: BTreeMap<Ino, Vec<u8>>,
    next_name: u64,
    /// The inodes this receive made (what [`Apply::discard`] deletes).
    made: BTreeSet<Ino>,
    /// Names this receive gave inodes it made in directories it did not make:
    /// directory, name, inode.
    placed: Vec<(Ino, Vec<u8>, Ino)>,
}

impl<D: BlockDevice> Apply<'_, D> {
    async fn resolve(&mut self, r: &InodeRef) -> Result<Ino, ReceiveError> {
        match r {
            InodeRef::New(n) => self.new.get(n).copied().ok_or(ReceiveError::Inconsistent(
                "an inode used before it is made",
            )),
            // Base inodes have the same numbers here as in the base snapshot.
            InodeRef::Base(_) => self.model.resolve(r).await,
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
        self.made.insert(attr.ino);
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
        if self.made.contains(&c) && !self.made.contains(&d) {
            self.placed.push((d, name.to_vec(), c));
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

    /// Applies one record (in stream order, which [`Validator`] checked), once the
    /// model has checked it.
    async fn record(&mut self, r: &Record) -> Result<(), ReceiveError> {
        self.model.record(r).await?;
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

    /// After the last record: removes staging and what is left in it, marks the root
    /// with `mark` and sets the times (every other step changes some).
    async fn finish(&mut self, mark: &[u8]) -> Result<(), ReceiveError> {
        self.model.finish()?;
        self.fs
            .remove_tree(ROOT_INO, &self.staging_name, &mut |_| None)
            .await?;
        self.fs
            .setxattr(ROOT_INO, RECEIVED_XATTR, mark, XattrMode::Upsert)
            .await?;
        for (ino, times) in core::mem::take(&mut self.times) {
            self.fs.restore_times(ino, times).await?;
        }
        Ok(())
    }

    /// After a failure: deletes every inode this receive made, wherever it put them,
    /// so that the rollback that follows has the space they took (a receive that ran
    /// out of it could not start one otherwise). Base inodes met on the way are moved
    /// to staging, where the rollback finds them as it finds the others.
    async fn discard(&mut self) -> Result<(), ReceiveError> {
        let (fs, staging) = (self.fs, self.staging);
        for (dir, name, ino) in core::mem::take(&mut self.placed) {
            match fs.lookup(dir, &name).await {
                Ok(a) if a.ino == ino => {
                    let staged = self.stage_name();
                    fs.rename(dir, &name, staging, &staged).await?;
                }
                Ok(_) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (made, next_name) = (&self.made, &mut self.next_name);
        let mut spare = |a: &Attr| {
            (!made.contains(&a.ino)).then(|| {
                *next_name += 1;
                (staging, format!("{next_name}").into_bytes())
            })
        };
        let mut offset = FIRST_INDEX;
        loop {
            let entries = fs.readdir(staging, offset, 64).await?;
            let Some(last) = entries.last() else {
                return Ok(());
            };
            offset = last.next_offset;
            for e in entries.iter().filter(|e| made.contains(&e.ino)) {
                fs.remove_tree(staging, &e.name, &mut spare).await?;
            }
        }
    }
}

/// Checks, record by record, what the checksums cannot and needs no tree, so that a
/// stream the receiver could not apply is refused in the checking pass, before
/// anything changes ([`Model`] checks the rest, against the tree):
/// - the records come in the order the receiver applies them in (entries removed, then
///   each inode followed by its xattrs and data, then entries added);
/// - a full stream names nothing by a base path but the root; a path is no deeper than
///   the sender walks ([`MAX_DEPTH`]);
/// - every mode names a type; names, symlink targets (and only symlinks have one),
///   xattr names and values are ones the filesystem takes, and no xattr is the
///   receiver's own mark; data lies within its file and only where data is sent.
struct Validator {
    full: bool,
    phase: u8,
    /// The last inode described: its ref, size and how its data comes.
    current: Option<(InodeRef, u64, DataMode)>,
}

impl Validator {
    fn new(header: &Header) -> Validator {
        Validator {
            full: header.base.is_none(),
            phase: 0,
            current: None,
        }
    }

    fn uses(&self, r: &InodeRef) -> Result<(), ReceiveError> {
        match r {
            InodeRef::Base(path) if self.full && !path.is_empty() => {
                Err(refuse("a base path in a full stream"))
            }
            InodeRef::Base(path) if path.len() > MAX_DEPTH => Err(refuse("a base path too deep")),
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
                match ty {
                    FileType::Symlink => {
                        check_target(&s.target).map_err(|_| refuse("a bad symlink target"))?
                    }
                    _ if !s.target.is_empty() => {
                        return Err(refuse(
                            "a symlink target for an inode that is not a symlink",
                        ))
                    }
                    _ => {}
                }
                if s.data != DataMode::Keep && ty != FileType::Regular {
                    return Err(refuse("data for an inode that is not a file"));
                }
                if s.size > super::MAX_FILE_SIZE {
                    return Err(refuse("a file too large"));
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
                if list.iter().any(|(n, _)| n == RECEIVED_XATTR) {
                    return Err(refuse("the receiver's own mark as an xattr"));
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

/// The root's own state before a full receive (it had no entries), given back if the
/// receive fails.
struct RootState {
    attr: Attr,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
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
    pending: VecDeque<Record>,
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
            pending: VecDeque::new(),
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

impl RootState {
    async fn capture<D: BlockDevice>(fs: &NineFs<D>) -> Result<RootState, ReceiveError> {
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

    async fn restore<D: BlockDevice>(&self, fs: &NineFs<D>) -> Result<(), ReceiveError> {
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
        fs.restore_times(ROOT_INO, [a.atime, a.mtime, a.ctime, a.btime])
            .await?;
        Ok(())
    }
}

/// The first pass over `records`: each checked against the tree (the `base` snapshot,
/// or an empty live tree). Returns the names the stream adds at the root that a
/// staging directory could have.
async fn check_pass<D: BlockDevice, S: StreamSource>(
    records: &mut Records<'_, S>,
    base: Option<Arc<NineFs<D>>>,
) -> Result<BTreeSet<Vec<u8>>, ReceiveError> {
    let mut model = Model::new(base, None);
    while let Some(r) = records.next().await? {
        model.record(&r).await?;
    }
    model.finish()?;
    Ok(model.root_names)
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
    /// a rollback two may carry it: the one the live tree equals counts): its name here
    /// and its view.
    async fn base_for(
        &self,
        mark: &[u8],
        name: &str,
    ) -> Result<(String, Arc<NineFs<D>>), ReceiveError> {
        self.checkpoint(CheckpointCause::Snapshot).await?;
        let mut diverged = None;
        for (item, m, view) in self.received().await? {
            if m == mark {
                match self.differs_from(&view).await? {
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

    /// Receives `stream` (checked whole first): makes the live tree the sent snapshot's
    /// tree and takes it as a snapshot of the sent name, which it returns.
    pub async fn receive(&self, stream: &[u8]) -> Result<SnapshotInfo, ReceiveError> {
        self.receive_from(&mut InMemory::new(stream)).await
    }

    /// [`NineFs::receive`] from a source read twice: once checked whole, once applied
    /// (the memory a receive takes is one record's, whatever the stream's size, plus
    /// what the check keeps of the inodes and entries the stream touches). A stream
    /// refused by the check changes nothing; one that fails while it is applied is
    /// rolled back ([`ReceiveError::RolledBack`]) before this returns.
    pub async fn receive_from(
        &self,
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
        let existing = self.snapshots().await?;
        if existing.iter().any(|s| s.name == snapshot.name) {
            return Err(ReceiveError::Exists(snapshot.name.clone()));
        }
        // The received snapshot; for an incremental, the two a rollback takes.
        let room = if base.is_some() { 2 } else { 1 };
        if existing.len() + room > self.max_snapshots {
            return Err(ReceiveError::SnapshotLimit(
                existing.len(),
                self.max_snapshots,
            ));
        }
        let base_mark = base.as_ref().map(|b| received_mark(source, b.seq));
        let base = match (base, &base_mark) {
            (Some(b), Some(mark)) => Some(self.base_for(mark, &b.name).await?),
            _ => {
                if self.readdir(ROOT_INO, 0, 3).await?.len() > 2 {
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
            None => Some(RootState::capture(self).await?),
            Some(_) => None,
        };
        let mark = received_mark(source, snapshot.seq);
        let applied = match self
            .apply_records(&mut records, view, &reserved, &mark)
            .await
        {
            Ok(()) => self
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
            (Some((name, view)), Some(mark)) => self.rollback_to(name, mark, view.clone()).await,
            _ => self.empty_live(before.as_ref()).await,
        };
        Err(match undone {
            Ok(()) => ReceiveError::RolledBack(failed),
            Err(e) => ReceiveError::NotRolledBack(failed, Box::new(e)),
        })
    }

    /// The second pass: makes the staging directory, then checks and applies each
    /// record, and finishes with `mark` on the root. `reserved`: names the staging
    /// directory may not take.
    async fn apply_records<S: StreamSource>(
        &self,
        records: &mut Records<'_, S>,
        base: Option<Arc<NineFs<D>>>,
        reserved: &BTreeSet<Vec<u8>>,
        mark: &[u8],
    ) -> Result<(), ReceiveError> {
        let mut a = self.start_apply(base, reserved).await?;
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
    async fn start_apply(
        &self,
        base: Option<Arc<NineFs<D>>>,
        reserved: &BTreeSet<Vec<u8>>,
    ) -> Result<Apply<'_, D>, ReceiveError> {
        for n in 0u32.. {
            let name = match n {
                0 => STAGING.to_vec(),
                n => [STAGING, format!(".{n}").as_bytes()].concat(),
            };
            if reserved.contains(&name) {
                continue;
            }
            match self.mkdir(ROOT_INO, &name, 0o700, OWNER).await {
                Ok(attr) => {
                    return Ok(Apply {
                        fs: self,
                        model: Model::new(base, Some(name.clone())),
                        staging: attr.ino,
                        staging_name: name,
                        new: BTreeMap::new(),
                        times: Vec::new(),
                        staged_dirs: BTreeMap::new(),
                        next_name: 0,
                        made: BTreeSet::new(),
                        placed: Vec::new(),
                    })
                }
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
        &self,
        dir: Ino,
        name: &[u8],
        spare: &mut impl FnMut(&Attr) -> Option<(Ino, Vec<u8>)>,
    ) -> Result<(), Errno> {
        let mut stack = alloc::vec![(dir, name.to_vec())];
        while let Some((parent, name)) = stack.last() {
            let (parent, attr) = (*parent, self.lookup(*parent, name).await?);
            if let Some((to, to_name)) = spare(&attr) {
                self.rename(parent, name, to, &to_name).await?;
                stack.pop();
                continue;
            }
            if attr.file_type() != FileType::Directory {
                self.unlink(parent, name).await?;
                stack.pop();
                continue;
            }
            match self.readdir(attr.ino, FIRST_INDEX, 1).await?.pop() {
                Some(e) => stack.push((attr.ino, e.name)),
                None => {
                    self.rmdir(parent, name).await?;
                    stack.pop();
                }
            }
        }
        Ok(())
    }

    /// Removes every entry of the live tree (staging directories last: while one is
    /// there, a rollback after a crash knows a receive was half way), then gives the
    /// root the attributes and xattrs of `before`.
    async fn empty_live(&self, before: Option<&RootState>) -> Result<(), ReceiveError> {
        loop {
            let entries = self.readdir(ROOT_INO, FIRST_INDEX, 256).await?;
            let next = entries
                .iter()
                .find(|e| !is_staging_name(&e.name))
                .or(entries.first());
            let Some(e) = next else { break };
            self.remove_tree(ROOT_INO, &e.name, &mut |_| None).await?;
        }
        if let Some(before) = before {
            before.restore(self).await?;
        }
        Ok(())
    }

    /// Whether a staging directory is at the root: a receive stopped half way.
    async fn staging_left(&self) -> Result<bool, ReceiveError> {
        let mut offset = FIRST_INDEX;
        loop {
            let entries = self.readdir(ROOT_INO, offset, 256).await?;
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

    /// Rolls the live tree back to the last received snapshot, after local changes or
    /// a receive that stopped half way (a crash), so that the next incremental applies.
    /// Returns that snapshot's name. With none received, a full receive that stopped
    /// half way (its staging directory is there) is undone by emptying the live tree
    /// (`None`), as it was before; without one, it is refused.
    pub async fn receive_rollback(&self) -> Result<Option<String>, ReceiveError> {
        let _one = self.receive_lock.try_lock().ok_or(ReceiveError::Busy)?;
        let last = self
            .received()
            .await?
            .into_iter()
            .max_by_key(|(item, _, _)| item.seq);
        let Some((item, mark, view)) = last else {
            if !self.staging_left().await? {
                return Err(ReceiveError::BaseMissing("(none received)".into()));
            }
            self.empty_live(None).await?;
            return Ok(None);
        };
        let name = String::from_utf8_lossy(&item.name).into_owned();
        self.rollback_to(&name, &mark, view).await?;
        Ok(Some(name))
    }

    /// Makes the live tree snapshot `name` (`view`, carrying `mark`) again. The live
    /// tree is taken as a snapshot, the stream from it to `name` is checked and applied,
    /// and the result is snapshotted again under `name` (it must equal the live tree key
    /// for key); at every step some snapshot with the mark equals the live tree or the
    /// live tree is untouched, so a crash in between only leaves it to run again.
    async fn rollback_to(
        &self,
        name: &str,
        mark: &[u8],
        view: Arc<NineFs<D>>,
    ) -> Result<(), ReceiveError> {
        self.checkpoint(CheckpointCause::Snapshot).await?;
        if self.differs_from(&view).await? == 0 {
            return Ok(());
        }
        for tmp in [ROLLBACK_LIVE, ROLLBACK_BASE] {
            match self.snapshot_delete(tmp).await {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.snapshot_create(ROLLBACK_LIVE).await?;
        let mut stream = Vec::new();
        self.send(name, Some(ROLLBACK_LIVE), &mut |b: &[u8]| {
            stream.extend_from_slice(b);
            Ok(())
        })
        .await?;
        let live = self.snapshot_view(ROLLBACK_LIVE).await?;
        let mut src = InMemory::new(&stream);
        let (mut records, _) = Records::start(&mut src).await?;
        let reserved = check_pass(&mut records, Some(live.clone())).await?;
        let (mut records, _) = Records::start(records.src).await?;
        self.apply_records(&mut records, Some(live), &reserved, mark)
            .await?;
        self.snapshot_create(ROLLBACK_BASE).await?;
        self.snapshot_delete(name).await?;
        self.snapshot_create(name).await?;
        self.snapshot_delete(ROLLBACK_BASE).await?;
        self.snapshot_delete(ROLLBACK_LIVE).await?;
        Ok(())
    }
}
