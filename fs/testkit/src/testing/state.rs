//! The visible state of a filesystem: what a client can observe by walking it from the
//! root, in a canonical form two implementations can be compared on.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use super::apply::AttrView;
use vfs::{FileSystem, FileType, Ino, ROOT_INO};

/// Content is summarised per block of this many bytes.
pub const DIGEST_BLOCK: usize = 4096;
/// Files larger than this are captured by size only (tests keep files small).
const CAPTURE_MAX: u64 = 256 << 20;
/// Entries per `readdir` call during a walk.
const WALK_PAGE: usize = 64;

const CRC: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_XZ);

/// A file's content: its length and a CRC-64 per [`DIGEST_BLOCK`] bytes, so a diff can
/// say where two contents first differ without keeping the bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Content {
    /// Length in bytes.
    pub len: u64,
    /// CRC-64 of each block (the last one may be short).
    pub blocks: Vec<u64>,
}

impl Content {
    /// The summary of `data`.
    pub fn of(data: &[u8]) -> Content {
        Content {
            len: data.len() as u64,
            blocks: data.chunks(DIGEST_BLOCK).map(|c| CRC.checksum(c)).collect(),
        }
    }

    /// Where `self` and `other` first differ, for reports.
    pub fn describe_difference(&self, other: &Content) -> String {
        match self
            .blocks
            .iter()
            .zip(&other.blocks)
            .position(|(a, b)| a != b)
        {
            Some(i) => format!(
                "content differs from block {i} (bytes {}..), lengths {} vs {}",
                i * DIGEST_BLOCK,
                self.len,
                other.len
            ),
            None => format!("lengths {} vs {}", self.len, other.len),
        }
    }
}

/// One inode as seen at one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The implementation's inode number (never compared between implementations).
    pub ino: Ino,
    /// Type.
    pub file_type: FileType,
    /// Comparable attributes.
    pub attr: AttrView,
    /// Regular files: content summary.
    pub content: Option<Content>,
    /// Symlinks: the target.
    pub target: Option<Vec<u8>>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// For an inode with several names: its first path (in byte order), on every path but
    /// that one. This captures hard-link structure without inode numbers.
    pub link_of: Option<Vec<u8>>,
}

/// A canonical tree: path → node, plus anything the walk found inconsistent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VisibleState {
    /// Paths relative to the root, components joined by `/`; the root is the empty path.
    pub nodes: BTreeMap<Vec<u8>, Node>,
    /// Contract breaches seen while walking (listing and lookup disagree, wrong link
    /// counts, short reads, ...). A correct filesystem has none.
    pub anomalies: Vec<String>,
}

/// A path for printing: `/` for the root.
pub fn show_path(path: &[u8]) -> String {
    format!("/{}", path.escape_ascii())
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

impl VisibleState {
    /// Walks `fs` from the root with readdir, lookup, getattr, read, readlink, listxattr
    /// and getxattr.
    pub async fn capture(fs: &impl FileSystem) -> VisibleState {
        let mut state = VisibleState::default();
        let root = match fs.getattr(ROOT_INO).await {
            Ok(attr) => attr,
            Err(e) => {
                state.anomalies.push(format!("getattr of the root: {e}"));
                return state;
            }
        };
        let mut visited_dirs = BTreeSet::from([ROOT_INO]);
        let node = state.node(fs, Vec::new(), &root).await;
        state.nodes.insert(Vec::new(), node);
        // (directory, its path, its parent)
        let mut stack = vec![(ROOT_INO, Vec::new(), ROOT_INO)];
        while let Some((dir, path, parent)) = stack.pop() {
            for (name, ino, file_type) in state.list(fs, dir, parent, &path).await {
                let child_path = join(&path, &name);
                let attr = match fs.lookup(dir, &name).await {
                    Ok(attr) => attr,
                    Err(e) => {
                        state.anomaly(&child_path, format!("listed but lookup fails: {e}"));
                        continue;
                    }
                };
                if attr.ino != ino || attr.file_type() != file_type {
                    state.anomaly(
                        &child_path,
                        format!(
                            "listed as {ino} {file_type:?}, lookup says {} {:?}",
                            attr.ino,
                            attr.file_type()
                        ),
                    );
                }
                if attr.file_type() == FileType::Directory {
                    if visited_dirs.insert(attr.ino) {
                        stack.push((attr.ino, child_path.clone(), dir));
                    } else {
                        state.anomaly(&child_path, "directory reachable twice".into());
                        continue;
                    }
                }
                let node = state.node(fs, child_path.clone(), &attr).await;
                state.nodes.insert(child_path, node);
            }
        }
        state.check_links();
        state
    }

    /// [`VisibleState::capture`] run to completion on the current thread.
    pub fn capture_blocking(fs: &impl FileSystem) -> VisibleState {
        pollster::block_on(VisibleState::capture(fs))
    }

    fn anomaly(&mut self, path: &[u8], what: String) {
        self.anomalies.push(format!("{}: {what}", show_path(path)));
    }

    /// A directory's entries other than `.` and `..`, after checking those two.
    async fn list(
        &mut self,
        fs: &impl FileSystem,
        dir: Ino,
        parent: Ino,
        path: &[u8],
    ) -> Vec<(Vec<u8>, Ino, FileType)> {
        let mut out = Vec::new();
        let mut offset = 0;
        let mut seen = BTreeSet::new();
        loop {
            let batch = match fs.readdir(dir, offset, WALK_PAGE).await {
                Ok(batch) => batch,
                Err(e) => {
                    self.anomaly(path, format!("readdir at offset {offset}: {e}"));
                    break;
                }
            };
            let Some(last) = batch.last() else { break };
            offset = last.next_offset;
            for e in batch {
                if !seen.insert(e.name.clone()) {
                    self.anomaly(path, format!("{} listed twice", e.name.escape_ascii()));
                    return out;
                }
                match e.name.as_slice() {
                    b"." if e.ino != dir => self.anomaly(path, format!(". is {}", e.ino)),
                    b".." if e.ino != parent => {
                        self.anomaly(path, format!(".. is {}, not {parent}", e.ino))
                    }
                    b"." | b".." => {}
                    _ => out.push((e.name, e.ino, e.file_type)),
                }
            }
        }
        if !seen.contains(&b"."[..]) || !seen.contains(&b".."[..]) {
            self.anomaly(path, "listing lacks . or ..".into());
        }
        out
    }

    async fn node(&mut self, fs: &impl FileSystem, path: Vec<u8>, attr: &vfs::Attr) -> Node {
        let file_type = attr.file_type();
        let content = match file_type {
            FileType::Regular => Some(self.content(fs, &path, attr.ino, attr.size).await),
            _ => None,
        };
        let target = match file_type {
            FileType::Symlink => match fs.readlink(attr.ino).await {
                Ok(t) => {
                    if t.len() as u64 != attr.size {
                        self.anomaly(
                            &path,
                            format!("size {} but target of {}", attr.size, t.len()),
                        );
                    }
                    Some(t)
                }
                Err(e) => {
                    self.anomaly(&path, format!("readlink: {e}"));
                    None
                }
            },
            _ => None,
        };
        let mut xattrs = BTreeMap::new();
        match fs.listxattr(attr.ino).await {
            Ok(names) => {
                for name in names {
                    match fs.getxattr(attr.ino, &name).await {
                        Ok(value) => {
                            if xattrs.insert(name.clone(), value).is_some() {
                                self.anomaly(
                                    &path,
                                    format!("xattr {} listed twice", name.escape_ascii()),
                                );
                            }
                        }
                        Err(e) => self.anomaly(
                            &path,
                            format!("xattr {} listed but getxattr: {e}", name.escape_ascii()),
                        ),
                    }
                }
            }
            Err(e) => self.anomaly(&path, format!("listxattr: {e}")),
        }
        Node {
            ino: attr.ino,
            file_type,
            attr: AttrView::of(attr),
            content,
            target,
            xattrs,
            link_of: None,
        }
    }

    async fn content(&mut self, fs: &impl FileSystem, path: &[u8], ino: Ino, size: u64) -> Content {
        if size > CAPTURE_MAX {
            return Content {
                len: size,
                blocks: Vec::new(),
            };
        }
        let mut data = vec![0u8; size as usize];
        let mut done = 0;
        while done < data.len() {
            let end = data.len().min(done + (64 << 10));
            match fs.read(ino, done as u64, &mut data[done..end]).await {
                Ok(0) => {
                    self.anomaly(path, format!("read returns 0 at {done} of size {size}"));
                    break;
                }
                Ok(n) => done += n.min(end - done),
                Err(e) => {
                    self.anomaly(path, format!("read at {done}: {e}"));
                    break;
                }
            }
        }
        Content::of(&data)
    }

    /// Link counts must match the tree: a non-directory has one link per name, a
    /// directory 2 + its subdirectories. Also fills in [`Node::link_of`].
    fn check_links(&mut self) {
        let mut paths: BTreeMap<Ino, Vec<Vec<u8>>> = BTreeMap::new();
        let mut subdirs: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        for (path, node) in &self.nodes {
            paths.entry(node.ino).or_default().push(path.clone());
            if node.file_type == FileType::Directory && !path.is_empty() {
                let parent = match path.iter().rposition(|&b| b == b'/') {
                    Some(i) => path[..i].to_vec(),
                    None => Vec::new(),
                };
                *subdirs.entry(parent).or_default() += 1;
            }
        }
        let mut found = Vec::new();
        for (path, node) in &self.nodes {
            let expected = if node.file_type == FileType::Directory {
                2 + subdirs.get(path).copied().unwrap_or(0)
            } else {
                paths[&node.ino].len() as u32
            };
            if node.attr.nlink != expected {
                found.push(format!(
                    "{}: nlink {} but the tree has {expected}",
                    show_path(path),
                    node.attr.nlink
                ));
            }
        }
        self.anomalies.extend(found);
        for names in paths.values().filter(|names| names.len() > 1) {
            for path in &names[1..] {
                if let Some(node) = self.nodes.get_mut(path) {
                    node.link_of = Some(names[0].clone());
                }
            }
        }
    }

    /// Differences between two states, one line each (empty: the same). `times`:
    /// compare timestamps too.
    pub fn diff(&self, other: &VisibleState, times: bool) -> Vec<String> {
        let mut out = Vec::new();
        if self.anomalies != other.anomalies {
            out.push(format!(
                "anomalies: {:?} vs {:?}",
                self.anomalies, other.anomalies
            ));
        }
        let paths: BTreeSet<&Vec<u8>> = self.nodes.keys().chain(other.nodes.keys()).collect();
        for path in paths {
            let p = show_path(path);
            match (self.nodes.get(path), other.nodes.get(path)) {
                (Some(a), None) => out.push(format!("{p}: only on the left ({:?})", a.file_type)),
                (None, Some(b)) => out.push(format!("{p}: only on the right ({:?})", b.file_type)),
                (Some(a), Some(b)) => node_diff(&p, a, b, times, &mut out),
                (None, None) => unreachable!(),
            }
        }
        out
    }
}

fn node_diff(p: &str, a: &Node, b: &Node, times: bool, out: &mut Vec<String>) {
    if a.file_type != b.file_type {
        out.push(format!("{p}: type {:?} vs {:?}", a.file_type, b.file_type));
        return;
    }
    if !a.attr.same(&b.attr, times) {
        let (x, y) = (&a.attr, &b.attr);
        let mut fields = Vec::new();
        if x.mode != y.mode {
            fields.push(format!("mode {:o} vs {:o}", x.mode, y.mode));
        }
        if x.nlink != y.nlink {
            fields.push(format!("nlink {} vs {}", x.nlink, y.nlink));
        }
        if (x.uid, x.gid) != (y.uid, y.gid) {
            fields.push(format!("owner {}:{} vs {}:{}", x.uid, x.gid, y.uid, y.gid));
        }
        if x.rdev != y.rdev {
            fields.push(format!("rdev {} vs {}", x.rdev, y.rdev));
        }
        if x.size != y.size {
            fields.push(format!("size {:?} vs {:?}", x.size, y.size));
        }
        for (i, which) in ["atime", "mtime", "ctime", "btime"].iter().enumerate() {
            if times && x.times[i] != y.times[i] {
                fields.push(format!("{which} {:?} vs {:?}", x.times[i], y.times[i]));
            }
        }
        out.push(format!("{p}: {}", fields.join(", ")));
    }
    if let (Some(x), Some(y)) = (&a.content, &b.content) {
        if x != y {
            out.push(format!("{p}: {}", x.describe_difference(y)));
        }
    }
    if a.target != b.target {
        out.push(format!("{p}: symlink target differs"));
    }
    if a.xattrs != b.xattrs {
        let names = |n: &Node| -> Vec<String> {
            n.xattrs
                .iter()
                .map(|(k, v)| format!("{}({}B)", k.escape_ascii(), v.len()))
                .collect()
        };
        out.push(format!("{p}: xattrs {:?} vs {:?}", names(a), names(b)));
    }
    if a.link_of != b.link_of {
        let show = |l: &Option<Vec<u8>>| l.as_deref().map(show_path);
        out.push(format!(
            "{p}: hard link of {:?} vs {:?}",
            show(&a.link_of),
            show(&b.link_of)
        ));
    }
}

impl fmt::Display for VisibleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (path, node) in &self.nodes {
            write!(
                f,
                "{} {:?} {:o} nlink={} {}:{}",
                show_path(path),
                node.file_type,
                node.attr.mode,
                node.attr.nlink,
                node.attr.uid,
                node.attr.gid
            )?;
            if let Some(c) = &node.content {
                write!(f, " len={}", c.len)?;
            }
            if let Some(t) = &node.target {
                write!(f, " -> {}", t.escape_ascii())?;
            }
            if !node.xattrs.is_empty() {
                write!(f, " xattrs={}", node.xattrs.len())?;
            }
            if let Some(l) = &node.link_of {
                write!(f, " (link of {})", show_path(l))?;
            }
            writeln!(f)?;
        }
        for a in &self.anomalies {
            writeln!(f, "ANOMALY {a}")?;
        }
        Ok(())
    }
}
