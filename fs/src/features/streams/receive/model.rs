//! The tree a stream applies to, as the stream changes it record by record: the check
//! of what each record does, against the base snapshot (or an empty root).

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::core::dir::within;
use crate::features::snapshots::snapdir::is_reserved;
use crate::features::streams::receive::{is_staging_name, refuse, ReceiveError};
use crate::format::stream::{InodeRef, InodeState, Record};
use vfs::{Errno, FileSystem, FileType, Ino, ROOT_INO};

/// An inode as the stream leaves it so far ([`Model`]).
#[derive(Clone, Copy, Debug)]
struct Node {
    /// Its type, for life.
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
    /// Whether it is a directory (which has one name and entries).
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
pub(super) struct Model<V: FileSystem> {
    /// The base snapshot here; `None`: a full stream, into an empty live tree.
    base: Option<Arc<V>>,
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
    pub(super) root_names: BTreeSet<Vec<u8>>,
    /// While applying: the staging directory's name (no entry of the stream's may
    /// have it).
    staging: Option<Vec<u8>>,
}

impl<V: FileSystem> Model<V> {
    /// The tree `base` (`None`: an empty root); `staging`: the staging directory's name
    /// while applying.
    pub(super) fn new(base: Option<Arc<V>>, staging: Option<Vec<u8>>) -> Model<V> {
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

    /// Inode `ino`, which the model has already met.
    fn node(&mut self, ino: Ino) -> &mut Node {
        self.nodes
            .get_mut(&ino)
            .expect("the model has every inode it resolved")
    }

    /// The inode `r` names (a base path is looked up in the base snapshot).
    pub(super) async fn resolve(&mut self, r: &InodeRef) -> Result<Ino, ReceiveError> {
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

    /// Records that entry `name` of `dir` now names `to` (`None`: removed).
    fn set_entry(&mut self, dir: Ino, name: &[u8], to: Option<Ino>) {
        self.changed
            .entry(dir)
            .or_default()
            .insert(name.to_vec(), to);
    }

    /// Checks record `r` against the tree and changes the tree as it does.
    pub(super) async fn record(&mut self, r: &Record) -> Result<(), ReceiveError> {
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
    pub(super) fn finish(&self) -> Result<(), ReceiveError> {
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
