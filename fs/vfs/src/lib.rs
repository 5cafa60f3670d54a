//! The filesystem interface the 9P server (and the tests' reference model) speak.
//!
//! It is shaped after what 9P2000.L needs, which is close to Linux's inode operations:
//! everything is addressed by inode number ([`Ino`]) and, inside a directory, by name. The
//! interface does no permission checks (the server decides who may do what, as a kernel's
//! VFS does); it enforces the filesystem's own rules (names, types, emptiness, cycles).
//!
//! Errors are Linux errno values ([`Errno`]), because that is what 9P2000.L's `Rlerror`
//! carries.
//!
//! Methods are `async` and take `&self`: on one CPU, many requests make progress while one
//! waits for the device. An implementation must never hold something another request
//! needs (a lock, a node) across a wait for I/O unless that request needs the same I/O.
//!
//! The futures carry no `Send` bound: a request is polled to completion on the CPU that
//! received it (one executor per CPU). What several CPUs share is the filesystem itself,
//! so an implementation served from more than one is `Send + Sync` (the filesystem and
//! the reference model are, checked at compile time in their crates).
//!
//! Implemented by the filesystem (`ninefold-fs`), the in-memory filesystem of the
//! appliance's development mode and the test kit's reference model; consumed by the 9P
//! server (`ninefold-ninep`). `no_std + alloc`.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

use alloc::vec::Vec;
use core::fmt;

mod forward;
mod limits;
mod read;

pub use limits::{parse_limit, parse_size, LimitChange};
pub use read::{ReadCtx, ReadStream, Window};

/// `Vec` for [`forward_filesystem!`]'s expansion, which names it from any crate.
#[doc(hidden)]
pub use alloc::vec::Vec as __Vec;

/// An inode number. Never reused within one filesystem's life, so `(ino, generation)` is a
/// stable identity (9P qid path and version).
pub type Ino = u64;

/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;

/// Longest name of a directory entry or xattr, in bytes.
pub const NAME_MAX: usize = 255;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Largest xattr value, in bytes.
pub const XATTR_VALUE_MAX: usize = 65536;

/// A Linux errno value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub u32);

macro_rules! errnos {
    ($($name:ident = $value:expr, $text:expr;)*) => {
        impl Errno {
            $(#[doc = $text] pub const $name: Errno = Errno($value);)*

            /// The symbolic name, e.g. `"ENOENT"`.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $($value => stringify!($name),)*
                    _ => "E?",
                }
            }
        }
    };
}

errnos! {
    EPERM = 1, "Operation not permitted";
    ENOENT = 2, "No such file or directory";
    EIO = 5, "Input/output error";
    EBADF = 9, "Bad file descriptor";
    EAGAIN = 11, "Resource temporarily unavailable";
    ENOMEM = 12, "Cannot allocate memory";
    EACCES = 13, "Permission denied";
    EBUSY = 16, "Device or resource busy";
    EEXIST = 17, "File exists";
    EXDEV = 18, "Invalid cross-device link";
    ENOTDIR = 20, "Not a directory";
    EISDIR = 21, "Is a directory";
    EINVAL = 22, "Invalid argument";
    EMFILE = 24, "Too many open files";
    EFBIG = 27, "File too large";
    ENOSPC = 28, "No space left on device";
    EROFS = 30, "Read-only file system";
    EMLINK = 31, "Too many links";
    ERANGE = 34, "Result too large";
    ENAMETOOLONG = 36, "File name too long";
    ENOLCK = 37, "No locks available";
    ENOSYS = 38, "Function not implemented";
    ENOTEMPTY = 39, "Directory not empty";
    ELOOP = 40, "Too many levels of symbolic links";
    ENODATA = 61, "No data available";
    EPROTO = 71, "Protocol error";
    EOVERFLOW = 75, "Value too large for defined data type";
    EOPNOTSUPP = 95, "Operation not supported";
    EDQUOT = 122, "Disk quota exceeded";
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Result of a filesystem operation.
pub type FsResult<T> = Result<T, Errno>;

/// File type bits of a mode (`S_IFMT` and friends, as in Linux).
pub mod mode {
    /// Mask of the file type bits.
    pub const S_IFMT: u32 = 0o170000;
    /// Socket.
    pub const S_IFSOCK: u32 = 0o140000;
    /// Symbolic link.
    pub const S_IFLNK: u32 = 0o120000;
    /// Regular file.
    pub const S_IFREG: u32 = 0o100000;
    /// Block device.
    pub const S_IFBLK: u32 = 0o060000;
    /// Directory.
    pub const S_IFDIR: u32 = 0o040000;
    /// Character device.
    pub const S_IFCHR: u32 = 0o020000;
    /// FIFO.
    pub const S_IFIFO: u32 = 0o010000;
    /// Permission and set-id/sticky bits.
    pub const PERMISSIONS: u32 = 0o7777;
}

/// The type of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Character device node.
    CharDevice,
    /// Block device node.
    BlockDevice,
    /// Named pipe.
    Fifo,
    /// Unix socket node.
    Socket,
}

impl FileType {
    /// The type from a full mode, or `None` if the type bits name no type.
    pub fn from_mode(full_mode: u32) -> Option<FileType> {
        Some(match full_mode & mode::S_IFMT {
            mode::S_IFREG => FileType::Regular,
            mode::S_IFDIR => FileType::Directory,
            mode::S_IFLNK => FileType::Symlink,
            mode::S_IFCHR => FileType::CharDevice,
            mode::S_IFBLK => FileType::BlockDevice,
            mode::S_IFIFO => FileType::Fifo,
            mode::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits for this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => mode::S_IFREG,
            FileType::Directory => mode::S_IFDIR,
            FileType::Symlink => mode::S_IFLNK,
            FileType::CharDevice => mode::S_IFCHR,
            FileType::BlockDevice => mode::S_IFBLK,
            FileType::Fifo => mode::S_IFIFO,
            FileType::Socket => mode::S_IFSOCK,
        }
    }

    /// The `DT_*` value Linux's `getdents` uses (and 9P's `Rreaddir` carries).
    pub fn dirent_type(self) -> u8 {
        match self {
            FileType::Fifo => 1,
            FileType::CharDevice => 2,
            FileType::Directory => 4,
            FileType::BlockDevice => 6,
            FileType::Regular => 8,
            FileType::Symlink => 10,
            FileType::Socket => 12,
        }
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    /// Seconds since 1970-01-01T00:00:00Z.
    pub sec: i64,
    /// Nanoseconds, `0..1_000_000_000`.
    pub nsec: u32,
}

/// Where the filesystem gets "now" for timestamps.
///
/// A filesystem shared by several CPUs reads its clock from all of them and holds it as
/// `dyn Clock + Send + Sync` (as `NineFs::mount` takes it); the trait itself asks for
/// neither, so a single-threaded test clock (a `Cell`) is still a clock.
pub trait Clock {
    /// The current wall-clock time.
    fn now(&self) -> Timespec;
}

/// Who is creating an inode: its owner and group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// Owning user id.
    pub uid: u32,
    /// Owning group id.
    pub gid: u32,
}

/// Attributes of an inode, as `getattr` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Generation (9P qid version source); changes if an inode number is ever reused.
    pub generation: u64,
    /// Full mode: type bits (`S_IFMT`) and permission bits.
    pub mode: u32,
    /// Number of hard links (directories: 2 + number of subdirectories).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number for character and block device nodes, else 0.
    pub rdev: u64,
    /// Size in bytes (symlinks: target length; directories: implementation-defined).
    pub size: u64,
    /// Space used, in 512-byte units.
    pub blocks: u64,
    /// Preferred I/O size in bytes.
    pub blksize: u32,
    /// Last access.
    pub atime: Timespec,
    /// Last content modification.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
    /// Creation.
    pub btime: Timespec,
}

impl Attr {
    /// The inode's type.
    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode).expect("an inode always has a valid type")
    }
}

/// How to set a timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// To the filesystem's current time.
    Now,
    /// To this value.
    To(Timespec),
}

/// Changes for `setattr`; `None` leaves a field alone. Any change also sets ctime to now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (type bits are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size: truncate or extend (regular files only; else `EISDIR`/`EINVAL`).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
}

/// One directory entry, as `readdir` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's inode.
    pub ino: Ino,
    /// The entry's type.
    pub file_type: FileType,
    /// The name (never empty; `.` and `..` included).
    pub name: Vec<u8>,
    /// The offset to pass to `readdir` to continue *after* this entry. Offsets stay valid
    /// across inserts and deletes in the directory: resuming never repeats or skips an
    /// entry that existed for the whole listing.
    pub next_offset: u64,
}

/// How `setxattr` treats an existing attribute (Linux `XATTR_CREATE`/`XATTR_REPLACE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Upsert,
    /// Fail with `EEXIST` if it exists.
    Create,
    /// Fail with `ENODATA` if it does not exist.
    Replace,
}

/// Filesystem-wide statistics (`statfs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Block size the counts below are in.
    pub block_size: u32,
    /// Total data blocks.
    pub blocks: u64,
    /// Free blocks.
    pub blocks_free: u64,
    /// Free blocks available to unprivileged users.
    pub blocks_avail: u64,
    /// Total inodes (an estimate where inodes are allocated dynamically).
    pub files: u64,
    /// Free inodes (an estimate).
    pub files_free: u64,
    /// Filesystem id.
    pub fsid: u64,
    /// Longest name.
    pub name_max: u32,
}

/// The limits of a quota root (a directory whose subtree is charged to one project, as an
/// XFS project quota): `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Most bytes of file data the project may hold.
    pub bytes: Option<u64>,
    /// Most inodes the project may hold (the root directory counts).
    pub inodes: Option<u64>,
}

/// A quota root's limits and what its project holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaInfo {
    /// The quota root directory (its inode number is the project's id).
    pub root: Ino,
    /// The limits.
    pub limits: QuotaLimits,
    /// Bytes of file data charged to the project.
    pub bytes: u64,
    /// Inodes charged to the project.
    pub inodes: u64,
}

impl QuotaInfo {
    /// What `statfs` of a directory in this project shows (as an NFS client of an XFS
    /// project quota or a ZFS dataset sees): the limits as the size, what is left under
    /// them as free (never more than the whole filesystem, `fs`, has free).
    pub fn statfs(&self, fs: StatFs) -> StatFs {
        let bs = u64::from(fs.block_size.max(1));
        let (blocks, bfree, bavail) = match self.limits.bytes {
            Some(limit) => {
                let left = limit.saturating_sub(self.bytes) / bs;
                (
                    limit.div_ceil(bs),
                    left.min(fs.blocks_free),
                    left.min(fs.blocks_avail),
                )
            }
            None => (fs.blocks, fs.blocks_free, fs.blocks_avail),
        };
        let (files, ffree) = match self.limits.inodes {
            Some(limit) => (limit, limit.saturating_sub(self.inodes).min(fs.files_free)),
            None => (fs.files, fs.files_free),
        };
        StatFs {
            blocks,
            blocks_free: bfree,
            blocks_avail: bavail,
            files,
            files_free: ffree,
            ..fs
        }
    }
}

/// The operations a 9P2000.L server needs from a filesystem.
///
/// Name arguments are raw bytes. A valid name is 1..=[`NAME_MAX`] bytes, contains neither
/// `/` nor NUL, and is not `.` or `..`; operations that take a new name reject invalid ones
/// with `EINVAL` (or `ENAMETOOLONG`). Lookups of `.` and `..` are answered.
///
/// Operations on an inode that does not exist fail with `ENOENT`; directory operations on
/// a non-directory fail with `ENOTDIR`.
///
/// The inode a `/`-separated path names, by lookups from the root (`/`, `a/b` and
/// `/a/b/` name what they say; empty components are skipped).
pub async fn lookup_path<F: FileSystem + ?Sized>(fs: &F, path: &str) -> FsResult<Ino> {
    let mut ino = ROOT_INO;
    for name in path.split('/').filter(|n| !n.is_empty()) {
        ino = fs.lookup(ino, name.as_bytes()).await?.ino;
    }
    Ok(ino)
}

/// A wrapper that changes a few operations of another filesystem forwards the rest with
/// [`forward_filesystem!`].
#[allow(async_fn_in_trait)]
pub trait FileSystem {
    /// Finds `name` in directory `dir`.
    async fn lookup(&self, dir: Ino, name: &[u8]) -> FsResult<Attr>;

    /// Attributes of an inode.
    async fn getattr(&self, ino: Ino) -> FsResult<Attr>;

    /// Changes attributes; returns the new ones.
    async fn setattr(&self, ino: Ino, changes: SetAttr) -> FsResult<Attr>;

    /// Creates a regular file `name` in `dir` with permission bits `perm`.
    async fn create(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr>;

    /// Creates a directory.
    async fn mkdir(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr>;

    /// Creates a device node, FIFO or socket; `full_mode` carries the type bits.
    async fn mknod(
        &self,
        dir: Ino,
        name: &[u8],
        full_mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<Attr>;

    /// Creates a symbolic link to `target`.
    async fn symlink(&self, dir: Ino, name: &[u8], target: &[u8], owner: Owner) -> FsResult<Attr>;

    /// The target of a symbolic link (`EINVAL` for other types).
    async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>>;

    /// Adds a hard link `new_dir/new_name` to `ino` (`EPERM` for directories).
    async fn link(&self, ino: Ino, new_dir: Ino, new_name: &[u8]) -> FsResult<Attr>;

    /// Removes the non-directory entry `dir/name`.
    async fn unlink(&self, dir: Ino, name: &[u8]) -> FsResult<()>;

    /// Removes the empty directory `dir/name` (`ENOTEMPTY` otherwise).
    async fn rmdir(&self, dir: Ino, name: &[u8]) -> FsResult<()>;

    /// Renames `old_dir/old_name` to `new_dir/new_name`, replacing a compatible target
    /// (POSIX `rename(2)` rules: a directory only replaces an empty directory; moving a
    /// directory under itself is `EINVAL`).
    async fn rename(
        &self,
        old_dir: Ino,
        old_name: &[u8],
        new_dir: Ino,
        new_name: &[u8],
    ) -> FsResult<()>;

    /// Lists directory entries starting at `offset` (0 = the beginning; otherwise a
    /// `next_offset` from an earlier call). Returns at most `max_entries` entries; an empty
    /// result means the end. `.` and `..` come first.
    async fn readdir(&self, dir: Ino, offset: u64, max_entries: usize) -> FsResult<Vec<DirEntry>>;

    /// Reads from a regular file into `buf`; returns the number of bytes read (short only
    /// at end of file). Holes read as zeros. Default: [`FileSystem::read_with`] for no
    /// one in particular.
    async fn read(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        self.read_with(ino, offset, buf, ReadCtx::default()).await
    }

    /// [`FileSystem::read`] for a reader that says who it is and which open file it
    /// reads through ([`ReadCtx`]): a filesystem with a cache charges what it keeps to
    /// the tenant, and reads ahead of a sequential stream; others ignore `ctx`. Every
    /// implementation writes this one (so a wrapper cannot drop the context unseen).
    async fn read_with(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        ctx: ReadCtx<'_>,
    ) -> FsResult<usize>;

    /// Writes `data` to a regular file at `offset` (extending it, leaving a hole if past
    /// the end); returns the number of bytes written.
    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize>;

    /// Writes `data` at the end of a regular file (`O_APPEND`), atomically: reading the
    /// size and writing there are one step, so concurrent appends never overwrite each
    /// other and no write or size change of the file comes between. Returns the offset
    /// written at (the size before) and the number of bytes written; otherwise as
    /// [`FileSystem::write`] at that offset.
    async fn append(&self, ino: Ino, data: &[u8]) -> FsResult<(u64, usize)>;

    /// Shares `len` bytes of `src` at `src_offset` into `dst` at `dst_offset` without
    /// copying data (reflink). Offsets and length must be multiples of the block size,
    /// except that the range may end at the source's end of file.
    async fn clone_range(
        &self,
        src: Ino,
        src_offset: u64,
        dst: Ino,
        dst_offset: u64,
        len: u64,
    ) -> FsResult<()>;

    /// Value of extended attribute `name`.
    async fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>>;

    /// Sets extended attribute `name`.
    async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrMode) -> FsResult<()>;

    /// Names of all extended attributes.
    async fn listxattr(&self, ino: Ino) -> FsResult<Vec<Vec<u8>>>;

    /// Removes extended attribute `name` (`ENODATA` if absent).
    async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()>;

    /// Filesystem statistics.
    async fn statfs(&self) -> FsResult<StatFs>;

    /// Notes that a client opened `ino`. An inode whose last link is removed while open
    /// stays readable and writable until the matching [`FileSystem::release`].
    async fn open(&self, ino: Ino) -> FsResult<()>;

    /// Notes that a client closed `ino`; frees it if it has no links and no other opener.
    async fn release(&self, ino: Ino) -> FsResult<()>;

    /// Makes `ino` durable as the crash contract says (`docs/durability.md`): with
    /// `datasync`, its data and size; otherwise also its other metadata and a path to it.
    /// For a directory, its entries.
    async fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()>;

    /// Makes everything durable (a full checkpoint).
    async fn sync(&self) -> FsResult<()>;

    /// Makes directory `dir` a quota root with `limits`, or changes the limits of one.
    /// Everything in its subtree (but nested quota roots) is then charged to it; a write,
    /// clone or create that would pass a limit fails with `EDQUOT`, and a `rename` or
    /// `link` between projects with `EXDEV`. Returns the limits and usage. Default:
    /// `EOPNOTSUPP` (a filesystem without quotas).
    async fn set_quota(&self, dir: Ino, limits: QuotaLimits) -> FsResult<QuotaInfo> {
        let _ = (dir, limits);
        Err(Errno::EOPNOTSUPP)
    }

    /// The quota of the project `ino` is charged to, if it is in one. Default: none.
    async fn quota(&self, ino: Ino) -> FsResult<Option<QuotaInfo>> {
        let _ = ino;
        Ok(None)
    }

    /// Statistics as seen from `ino`: [`FileSystem::statfs`], bounded by the quota of the
    /// project `ino` is in ([`QuotaInfo::statfs`]).
    async fn statfs_at(&self, ino: Ino) -> FsResult<StatFs> {
        let fs = self.statfs().await?;
        Ok(match self.quota(ino).await? {
            Some(q) => q.statfs(fs),
            None => fs,
        })
    }
}

/// The administration side of a filesystem: commands written to the administration
/// export's `ctl` file and the text of its status files (the Plan 9 way: no new
/// protocol). The 9P server serves it ([`FileSystem`] stays about files).
#[allow(async_fn_in_trait)]
pub trait Control {
    /// Runs one command line (`sync`, `scrub start`, ...); `Ok` carries the reply text,
    /// `Err` says why the command was refused or failed.
    async fn control(&self, line: &str) -> Result<alloc::string::String, alloc::string::String>;

    /// The `status` file: state, space, scrub progress, one `key value` per line.
    fn status(&self) -> alloc::string::String;

    /// The `scrub` file: the running or last scrub pass's report.
    fn scrub_report(&self) -> alloc::string::String;

    /// The `send` file: the next bytes of the running send's stream at `offset` (read
    /// in order), waiting while none are ready; 0 at its end or with no send running.
    async fn send_read(&self, offset: u64, buf: &mut [u8]) -> FsResult<usize>;

    /// The `receive` file: takes bytes of a stream at `offset` for the running receive
    /// (how many it took), waiting while its buffer is full.
    async fn receive_write(&self, offset: u64, data: &[u8]) -> FsResult<usize>;

    /// The `receive` file was closed: the pass written through it ends.
    fn receive_closed(&self);
}
