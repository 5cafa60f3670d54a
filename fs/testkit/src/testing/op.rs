//! Filesystem operations over a small namespace, as plain data.
//!
//! An [`Op`] names its inodes by path (resolved with `lookup` from the root on each
//! filesystem, so two implementations with different inode numbers run the same
//! sequence) or by open handle (so unlinked-but-open files can be used). Names come
//! from a handful of plain names plus a few invalid ones; data comes from a seed, so ops
//! stay small and print readably.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use vfs::{SetAttr, XattrMode, NAME_MAX};

/// The plain names used by generated sequences.
pub const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// An entry name argument: a plain name or one of the interesting invalid ones.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Name {
    /// `NAMES[i % NAMES.len()]`.
    Plain(u8),
    /// A valid name of exactly `NAME_MAX` bytes.
    Longest,
    /// `NAME_MAX + 1` bytes: `ENAMETOOLONG`.
    TooLong,
    /// The empty name.
    Empty,
    /// `.`
    Dot,
    /// `..`
    DotDot,
    /// A name containing `/`.
    Slash,
}

impl Name {
    /// The bytes passed to the filesystem.
    pub fn bytes(self) -> Vec<u8> {
        match self {
            Name::Plain(i) => NAMES[usize::from(i) % NAMES.len()].as_bytes().to_vec(),
            Name::Longest => alloc::vec![b'L'; NAME_MAX],
            Name::TooLong => alloc::vec![b'L'; NAME_MAX + 1],
            Name::Empty => Vec::new(),
            Name::Dot => b".".to_vec(),
            Name::DotDot => b"..".to_vec(),
            Name::Slash => b"x/y".to_vec(),
        }
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Name::Plain(i) => f.write_str(NAMES[usize::from(*i) % NAMES.len()]),
            Name::Longest => f.write_str("L*255"),
            Name::TooLong => f.write_str("L*256"),
            Name::Empty => f.write_str("''"),
            Name::Dot => f.write_str("."),
            Name::DotDot => f.write_str(".."),
            Name::Slash => f.write_str("'x/y'"),
        }
    }
}

/// A path from the root: a list of names, each resolved with `lookup`.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Path(pub Vec<Name>);

impl Path {
    /// The root directory.
    pub fn root() -> Path {
        Path(Vec::new())
    }

    /// A path of plain names, e.g. `Path::of(&[0, 1])` is `/a/b`.
    pub fn of(names: &[u8]) -> Path {
        Path(names.iter().map(|&i| Name::Plain(i)).collect())
    }
}

impl fmt::Debug for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("/");
        }
        for name in &self.0 {
            write!(f, "/{name:?}")?;
        }
        Ok(())
    }
}

/// The inode an op acts on.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Whatever the path resolves to.
    Path(Path),
    /// An open handle: index (modulo the number of open handles) into the handles opened
    /// by [`Op::Open`] and not yet released. With no handle open, the op is skipped.
    Handle(u8),
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Path(p) => write!(f, "{p:?}"),
            Target::Handle(h) => write!(f, "#{h}"),
        }
    }
}

/// The xattr names used by generated sequences; index 4 is empty (`ERANGE`) and index 5
/// is one byte too long.
pub const XATTR_NAMES: [&str; 4] = ["user.a", "user.b", "user.c", "trusted.t"];

/// An xattr name argument (see [`XATTR_NAMES`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct XName(pub u8);

impl XName {
    /// The bytes passed to the filesystem.
    pub fn bytes(self) -> Vec<u8> {
        match usize::from(self.0) {
            i if i < XATTR_NAMES.len() => XATTR_NAMES[i].as_bytes().to_vec(),
            4 => Vec::new(),
            _ => alloc::vec![b'x'; NAME_MAX + 1],
        }
    }
}

impl fmt::Debug for XName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match usize::from(self.0) {
            i if i < XATTR_NAMES.len() => f.write_str(XATTR_NAMES[i]),
            4 => f.write_str("''"),
            _ => f.write_str("x*256"),
        }
    }
}

/// Deterministic, never-zero data for writes and xattr values (so holes and lost writes
/// are distinguishable from written data).
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((usize::from(seed) * 131 + i * 7) % 255 + 1) as u8)
        .collect()
}

/// The owner of every inode a generated sequence creates.
pub const TEST_OWNER: vfs::Owner = vfs::Owner {
    uid: 1000,
    gid: 1000,
};

/// One filesystem operation with concrete arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // The fields are the trait method's arguments.
pub enum Op {
    /// `lookup(dir, name)`.
    Lookup { dir: Path, name: Name },
    /// `getattr`.
    Getattr { target: Target },
    /// `setattr` (truncate is a setattr with `size`).
    Setattr { target: Target, changes: SetAttr },
    /// `create(dir, name, perm)` owned by [`TEST_OWNER`].
    Create { dir: Path, name: Name, perm: u32 },
    /// `mkdir`.
    Mkdir { dir: Path, name: Name, perm: u32 },
    /// `mknod` with a full mode.
    Mknod {
        dir: Path,
        name: Name,
        mode: u32,
        rdev: u64,
    },
    /// `symlink(dir, name, target)`.
    Symlink {
        dir: Path,
        name: Name,
        target: Vec<u8>,
    },
    /// `readlink`.
    Readlink { target: Target },
    /// `link(target, dir, name)`.
    Link {
        target: Target,
        dir: Path,
        name: Name,
    },
    /// `unlink`.
    Unlink { dir: Path, name: Name },
    /// `rmdir`.
    Rmdir { dir: Path, name: Name },
    /// `rename`.
    Rename {
        from_dir: Path,
        from: Name,
        to_dir: Path,
        to: Name,
    },
    /// A whole listing through `readdir` calls of `page` entries (0 is sent as is).
    Readdir { dir: Path, page: u8 },
    /// `read` of `len` bytes.
    Read {
        target: Target,
        offset: u64,
        len: u32,
    },
    /// `write` of `pattern(seed, len)`.
    Write {
        target: Target,
        offset: u64,
        len: u32,
        seed: u8,
    },
    /// `append` of `pattern(seed, len)`.
    Append { target: Target, len: u32, seed: u8 },
    /// `clone_range`.
    Clone {
        src: Target,
        src_offset: u64,
        dst: Target,
        dst_offset: u64,
        len: u64,
    },
    /// `getxattr`.
    Getxattr { target: Target, name: XName },
    /// `setxattr` of `pattern(seed, len)`.
    Setxattr {
        target: Target,
        name: XName,
        len: u32,
        seed: u8,
        how: XattrMode,
    },
    /// `listxattr`.
    Listxattr { target: Target },
    /// `removexattr`.
    Removexattr { target: Target, name: XName },
    /// `statfs`.
    Statfs,
    /// `open`; on success the inode joins the open handles.
    Open { target: Target },
    /// `release` of an open handle (modulo the number open; skipped if none).
    Release { handle: u8 },
    /// `fsync(target, datasync)`.
    Fsync { target: Target, datasync: bool },
    /// `fsync` of a directory (not datasync).
    FsyncDir { dir: Path },
    /// `sync`.
    Sync,
    /// A marker for the harness: release every handle, then unmount and mount again.
    Remount,
}

impl Op {
    /// Whether the op can change the filesystem (used to skip state captures).
    pub fn mutates(&self) -> bool {
        !matches!(
            self,
            Op::Lookup { .. }
                | Op::Getattr { .. }
                | Op::Readlink { .. }
                | Op::Readdir { .. }
                | Op::Read { .. }
                | Op::Getxattr { .. }
                | Op::Listxattr { .. }
                | Op::Statfs
                | Op::Fsync { .. }
                | Op::FsyncDir { .. }
                | Op::Sync
        )
    }
}

/// A sequence printed one op per line with its index (for failure reports).
pub fn format_ops(ops: &[Op]) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        out.push_str(&alloc::format!("  {i:4}: {op:?}\n"));
    }
    out
}
