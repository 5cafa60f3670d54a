//! Running an [`Op`] on any [`FileSystem`] and recording what came back.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::op::{pattern, Op, Path, Target, TEST_OWNER};
use vfs::{Attr, Errno, FileSystem, FileType, FsResult, Ino, Timespec, ROOT_INO};

/// Largest number of `readdir` calls one [`Op::Readdir`] makes before calling the
/// listing broken (it never ended).
const MAX_READDIR_CALLS: usize = 100_000;

/// The comparable part of an [`Attr`]: everything but the inode number, generation,
/// `blocks`, `blksize` and a directory's size, which are implementation-defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrView {
    /// The inode number (recorded, never compared).
    pub ino: Ino,
    /// Full mode.
    pub mode: u32,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number.
    pub rdev: u64,
    /// Size; `None` for directories.
    pub size: Option<u64>,
    /// atime, mtime, ctime, btime.
    pub times: [Timespec; 4],
}

impl AttrView {
    /// The comparable part of `attr`.
    pub fn of(attr: &Attr) -> AttrView {
        let is_dir = attr.file_type() == FileType::Directory;
        AttrView {
            ino: attr.ino,
            mode: attr.mode,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            rdev: attr.rdev,
            size: (!is_dir).then_some(attr.size),
            times: [attr.atime, attr.mtime, attr.ctime, attr.btime],
        }
    }

    /// Equal in everything compared (`times` only if asked).
    pub fn same(&self, other: &AttrView, times: bool) -> bool {
        let strip = |a: &AttrView| AttrView {
            ino: 0,
            times: if times {
                a.times
            } else {
                [Timespec::default(); 4]
            },
            ..*a
        };
        strip(self) == strip(other)
    }
}

/// What an op returned, in comparable form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpOutcome {
    /// The op (or resolving its paths) failed with this errno.
    Err(Errno),
    /// Success without a value.
    Unit,
    /// Attributes (lookup, getattr, setattr, create, mkdir, mknod, symlink, link).
    Attr(AttrView),
    /// Bytes (read, readlink, getxattr).
    Data(Vec<u8>),
    /// Bytes written.
    Count(usize),
    /// `append`: the offset written at and the bytes written.
    Appended(u64, usize),
    /// A whole directory listing (sorted by name; `.` and `..` left out after being
    /// checked), or the xattr names (sorted).
    Names(Vec<(Vec<u8>, Option<FileType>)>),
    /// `statfs`: the fields both implementations must agree on (block size, name_max).
    StatFs(u32, u32),
    /// Nothing was run (a handle op with no handle open, or [`Op::Remount`]).
    Skipped,
    /// The implementation broke the trait's contract (e.g. a listing that repeats a
    /// name); always a mismatch.
    Broken(String),
}

impl OpOutcome {
    /// Whether two outcomes agree (`times`: compare timestamps in attributes).
    pub fn same(&self, other: &OpOutcome, times: bool) -> bool {
        match (self, other) {
            (OpOutcome::Attr(a), OpOutcome::Attr(b)) => a.same(b, times),
            (OpOutcome::Broken(_), _) | (_, OpOutcome::Broken(_)) => false,
            (a, b) => a == b,
        }
    }

    fn from<T>(result: FsResult<T>, f: impl FnOnce(T) -> OpOutcome) -> OpOutcome {
        match result {
            Ok(value) => f(value),
            Err(e) => OpOutcome::Err(e),
        }
    }
}

/// The inodes opened through [`Op::Open`] and not yet released, per filesystem.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handles(pub Vec<Ino>);

impl Handles {
    fn pick(&self, handle: u8) -> Option<usize> {
        (!self.0.is_empty()).then(|| usize::from(handle) % self.0.len())
    }
}

/// The result of [`apply`]: the outcome and the inode the op acted on (its target, or
/// the directory for directory ops), if it resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// What the op returned.
    pub outcome: OpOutcome,
    /// The resolved primary inode.
    pub ino: Option<Ino>,
}

/// Resolves a path by `lookup`s from the root.
pub async fn resolve(fs: &impl FileSystem, path: &Path) -> FsResult<Ino> {
    let mut ino = ROOT_INO;
    for name in &path.0 {
        ino = fs.lookup(ino, &name.bytes()).await?.ino;
    }
    Ok(ino)
}

async fn target(fs: &impl FileSystem, handles: &Handles, t: &Target) -> Option<FsResult<Ino>> {
    match t {
        Target::Path(p) => Some(resolve(fs, p).await),
        Target::Handle(h) => handles.pick(*h).map(|i| Ok(handles.0[i])),
    }
}

/// Runs `op` on `fs`. `handles` are this filesystem's open handles; [`Op::Open`] and
/// [`Op::Release`] update them. [`Op::Remount`] is not run (the harness interprets it).
pub async fn apply(fs: &impl FileSystem, handles: &mut Handles, op: &Op) -> Applied {
    // Resolves a target or returns early with its outcome.
    macro_rules! get {
        ($t:expr) => {
            match target(fs, handles, $t).await {
                None => {
                    return Applied {
                        outcome: OpOutcome::Skipped,
                        ino: None,
                    }
                }
                Some(Err(e)) => {
                    return Applied {
                        outcome: OpOutcome::Err(e),
                        ino: None,
                    }
                }
                Some(Ok(ino)) => ino,
            }
        };
    }
    macro_rules! dir {
        ($p:expr) => {
            get!(&Target::Path($p.clone()))
        };
    }
    let attr = |a: Attr| OpOutcome::Attr(AttrView::of(&a));
    let unit = |()| OpOutcome::Unit;
    let (outcome, ino) = match op {
        Op::Lookup { dir, name } => {
            let d = dir!(dir);
            (OpOutcome::from(fs.lookup(d, &name.bytes()).await, attr), d)
        }
        Op::Getattr { target } => {
            let t = get!(target);
            (OpOutcome::from(fs.getattr(t).await, attr), t)
        }
        Op::Setattr { target, changes } => {
            let t = get!(target);
            (OpOutcome::from(fs.setattr(t, *changes).await, attr), t)
        }
        Op::Create { dir, name, perm } => {
            let d = dir!(dir);
            let r = fs.create(d, &name.bytes(), *perm, TEST_OWNER).await;
            (OpOutcome::from(r, attr), d)
        }
        Op::Mkdir { dir, name, perm } => {
            let d = dir!(dir);
            let r = fs.mkdir(d, &name.bytes(), *perm, TEST_OWNER).await;
            (OpOutcome::from(r, attr), d)
        }
        Op::Mknod {
            dir,
            name,
            mode,
            rdev,
        } => {
            let d = dir!(dir);
            let r = fs.mknod(d, &name.bytes(), *mode, *rdev, TEST_OWNER).await;
            (OpOutcome::from(r, attr), d)
        }
        Op::Symlink { dir, name, target } => {
            let d = dir!(dir);
            let r = fs.symlink(d, &name.bytes(), target, TEST_OWNER).await;
            (OpOutcome::from(r, attr), d)
        }
        Op::Readlink { target } => {
            let t = get!(target);
            (OpOutcome::from(fs.readlink(t).await, OpOutcome::Data), t)
        }
        Op::Link { target, dir, name } => {
            let t = get!(target);
            let d = dir!(dir);
            (OpOutcome::from(fs.link(t, d, &name.bytes()).await, attr), t)
        }
        Op::Unlink { dir, name } => {
            let d = dir!(dir);
            (OpOutcome::from(fs.unlink(d, &name.bytes()).await, unit), d)
        }
        Op::Rmdir { dir, name } => {
            let d = dir!(dir);
            (OpOutcome::from(fs.rmdir(d, &name.bytes()).await, unit), d)
        }
        Op::Rename {
            from_dir,
            from,
            to_dir,
            to,
        } => {
            let a = dir!(from_dir);
            let b = dir!(to_dir);
            let r = fs.rename(a, &from.bytes(), b, &to.bytes()).await;
            (OpOutcome::from(r, unit), a)
        }
        Op::Readdir { dir, page } => {
            let d = dir!(dir);
            (list(fs, d, usize::from(*page)).await, d)
        }
        Op::Read {
            target,
            offset,
            len,
        } => {
            let t = get!(target);
            let mut buf = vec![0u8; *len as usize];
            let outcome = match fs.read(t, *offset, &mut buf).await {
                Ok(n) if n > buf.len() => OpOutcome::Broken(format!("read returned {n}")),
                Ok(n) => {
                    buf.truncate(n);
                    OpOutcome::Data(buf)
                }
                Err(e) => OpOutcome::Err(e),
            };
            (outcome, t)
        }
        Op::Write {
            target,
            offset,
            len,
            seed,
        } => {
            let t = get!(target);
            let data = pattern(*seed, *len as usize);
            (
                OpOutcome::from(fs.write(t, *offset, &data).await, OpOutcome::Count),
                t,
            )
        }
        Op::Append { target, len, seed } => {
            let t = get!(target);
            let data = pattern(*seed, *len as usize);
            let r = fs.append(t, &data).await;
            (OpOutcome::from(r, |(at, n)| OpOutcome::Appended(at, n)), t)
        }
        Op::Clone {
            src,
            src_offset,
            dst,
            dst_offset,
            len,
        } => {
            let s = get!(src);
            let d = get!(dst);
            let r = fs.clone_range(s, *src_offset, d, *dst_offset, *len).await;
            (OpOutcome::from(r, unit), d)
        }
        Op::Getxattr { target, name } => {
            let t = get!(target);
            (
                OpOutcome::from(fs.getxattr(t, &name.bytes()).await, OpOutcome::Data),
                t,
            )
        }
        Op::Setxattr {
            target,
            name,
            len,
            seed,
            how,
        } => {
            let t = get!(target);
            let value = pattern(*seed, *len as usize);
            let r = fs.setxattr(t, &name.bytes(), &value, *how).await;
            (OpOutcome::from(r, unit), t)
        }
        Op::Listxattr { target } => {
            let t = get!(target);
            let r = fs.listxattr(t).await.map(|mut names| {
                names.sort();
                OpOutcome::Names(names.into_iter().map(|n| (n, None)).collect())
            });
            (OpOutcome::from(r, |o| o), t)
        }
        Op::Removexattr { target, name } => {
            let t = get!(target);
            (
                OpOutcome::from(fs.removexattr(t, &name.bytes()).await, unit),
                t,
            )
        }
        Op::Statfs => {
            let r = fs.statfs().await;
            let outcome = OpOutcome::from(r, |s| OpOutcome::StatFs(s.block_size, s.name_max));
            (outcome, ROOT_INO)
        }
        Op::Open { target } => {
            let t = get!(target);
            let r = fs.open(t).await;
            if r.is_ok() {
                handles.0.push(t);
            }
            (OpOutcome::from(r, unit), t)
        }
        Op::Release { handle } => {
            let Some(i) = handles.pick(*handle) else {
                return Applied {
                    outcome: OpOutcome::Skipped,
                    ino: None,
                };
            };
            let t = handles.0.remove(i);
            (OpOutcome::from(fs.release(t).await, unit), t)
        }
        Op::Fsync { target, datasync } => {
            let t = get!(target);
            (OpOutcome::from(fs.fsync(t, *datasync).await, unit), t)
        }
        Op::FsyncDir { dir } => {
            let d = dir!(dir);
            (OpOutcome::from(fs.fsync(d, false).await, unit), d)
        }
        Op::Sync => (OpOutcome::from(fs.sync().await, unit), ROOT_INO),
        Op::Remount => (OpOutcome::Skipped, ROOT_INO),
    };
    Applied {
        outcome,
        ino: Some(ino),
    }
}

/// Lists a whole directory and checks the listing's shape: `.` then `..` first, no name
/// twice, offsets that end.
async fn list(fs: &impl FileSystem, dir: Ino, page: usize) -> OpOutcome {
    let mut entries = Vec::new();
    let mut offset = 0;
    for _ in 0..MAX_READDIR_CALLS {
        match fs.readdir(dir, offset, page).await {
            Err(e) => return OpOutcome::Err(e),
            Ok(batch) if batch.is_empty() => return check_listing(dir, entries),
            Ok(batch) => {
                if batch.len() > page {
                    return OpOutcome::Broken(format!("readdir returned {} > {page}", batch.len()));
                }
                offset = batch.last().map(|e| e.next_offset).unwrap_or(offset);
                entries.extend(batch);
            }
        }
    }
    OpOutcome::Broken(format!("readdir of {dir} did not end"))
}

fn check_listing(dir: Ino, entries: Vec<vfs::DirEntry>) -> OpOutcome {
    let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
    if names.len() < 2 || names[0] != b"." || names[1] != b".." {
        return OpOutcome::Broken(format!("listing of {dir} does not start with . and .."));
    }
    if entries[0].ino != dir {
        return OpOutcome::Broken(format!("'.' of {dir} is {}", entries[0].ino));
    }
    let mut rest: Vec<(Vec<u8>, Option<FileType>)> = entries[2..]
        .iter()
        .map(|e| (e.name.clone(), Some(e.file_type)))
        .collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = rest.windows(2).find(|w| w[0].0 == w[1].0) {
        return OpOutcome::Broken(format!(
            "listing of {dir} repeats {}",
            w[0].0.escape_ascii()
        ));
    }
    if rest.iter().any(|(n, _)| n == b"." || n == b"..") {
        return OpOutcome::Broken(format!("listing of {dir} repeats . or .."));
    }
    OpOutcome::Names(rest)
}

/// [`apply`] that runs to completion on the current thread.
pub fn apply_blocking(fs: &impl FileSystem, handles: &mut Handles, op: &Op) -> Applied {
    pollster::block_on(apply(fs, handles, op))
}
