//! The reference model: a small, obviously-correct, in-memory [`FileSystem`].
//!
//! It is the oracle the real filesystem is compared against (see [`crate::testing`] and
//! `docs/testing.md`), so it favours clarity over speed: one lock around plain
//! `BTreeMap`s, no caching, no cleverness. Every rule it implements is one a test can
//! point at.
//!
//! # Semantic choices
//! Where Linux or POSIX leave room, or the trait is silent, the model decides as follows
//! (the real filesystem must agree, since the tests compare errno values exactly):
//!
//! - **Check order.** (1) argument validation (names, symlink targets, xattr names and
//!   sizes, `max_entries`), (2) existence and type of the inodes in argument order
//!   (`ENOENT`, `ENOTDIR`, `EISDIR`), (3) operation-specific conflicts (`EEXIST`,
//!   `ENOTEMPTY`, `EINVAL` for cycles, `EMLINK`, ...).
//! - **Names.** Longer than [`NAME_MAX`] → `ENAMETOOLONG`; empty, `.`, `..`, or
//!   containing `/` or NUL → `EINVAL`. `lookup` also answers `.` and `..` (the root's `..`
//!   is the root).
//! - **Removed directories** (after `rmdir`, while still open) keep their inode
//!   (`getattr` works, `nlink` is 0) but every directory operation on them fails with
//!   `ENOENT`, as Linux's dead-directory checks do.
//! - **`mknod`** with type bits 0 or `S_IFREG` makes a regular file; `S_IFDIR` → `EPERM`;
//!   `S_IFLNK` or unknown bits → `EINVAL`. `rdev` is kept for device nodes only.
//! - **Symlinks.** Empty target → `ENOENT` (as `symlink(2)`); longer than
//!   [`SYMLINK_MAX`] → `ENAMETOOLONG`; containing NUL → `EINVAL`.
//! - **`link`** of a directory → `EPERM`; of an inode whose last link is gone → `ENOENT`;
//!   past [`ModelConfig::max_links`] → `EMLINK` (also `mkdir` and directory `rename`
//!   into a parent at the limit).
//! - **`rename`** follows Linux's order: source missing → `ENOENT`; a directory moved
//!   into itself or a descendant → `EINVAL`; a target directory that is the source's
//!   parent or one of its ancestors → `ENOTEMPTY`; source and target the same inode
//!   (including two hard links) → success, nothing changes; then `ENOTDIR` (directory
//!   onto non-directory), `EISDIR` (non-directory onto directory), `ENOTEMPTY`.
//! - **`unlink`** of a directory → `EISDIR`; **`rmdir`** of a non-directory → `ENOTDIR`.
//! - **Files.** Holes read as zeros. `write` of zero bytes does nothing (no timestamp
//!   change). A write starting at or past [`ModelConfig::max_file_size`] → `EFBIG`; one
//!   crossing it is cut short there (Linux's `generic_write_check_limits`). `setattr`
//!   `size` past the limit → `EFBIG`, on a directory → `EISDIR`, on other non-regular
//!   inodes → `EINVAL`. `read`/`write` of a directory → `EISDIR`, of other
//!   non-regular inodes → `EINVAL`.
//! - **`append`** is `write` at the size, read under the same lock (atomic); it
//!   returns that offset. An empty append changes nothing and returns the size.
//! - **`clone_range`**: both inodes regular (`EISDIR` / `EINVAL` otherwise);
//!   `len == 0` does nothing; `src_offset` and `dst_offset` must be multiples of
//!   [`ModelConfig::block_size`]; the source range must lie inside the source file
//!   (no silent shortening, unlike Linux); `len` must be a block multiple unless the range
//!   ends exactly at the source's end of file, and such an unaligned tail may not land
//!   inside the destination (`dst_offset + len < dst size`), as btrfs refuses; ranges of
//!   one inode may not overlap (rounded up to blocks); all of these → `EINVAL`; past the
//!   size limit → `EFBIG`. The effect is a copy (sharing is invisible); the destination
//!   grows to `dst_offset + len` if shorter.
//! - **xattrs.** Names 1..=[`NAME_MAX`] bytes (else `ERANGE`, as Linux), no NUL (else
//!   `EINVAL`); values up to [`XATTR_VALUE_MAX`] bytes, longer → `ERANGE` (Linux's
//!   `E2BIG` is not in [`Errno`]; `ERANGE` is what btrfs-style size limits return).
//!   Namespaces are not interpreted; all inode types may carry xattrs. `listxattr`
//!   returns names in byte order.
//! - **`readdir`** offsets: `.` is at 0, `..` at 1, and every entry gets a per-directory
//!   cookie (≥ 2) when it is inserted, never reused; `next_offset` is the cookie + 1 and a
//!   listing resumes at the first cookie ≥ offset. A rename or a replacement inserts a new
//!   entry (new cookie). `max_entries == 0` → `EINVAL`.
//! - **`open`/`release`** count openers per inode; `release` without an `open` →
//!   `EBADF`. An inode is freed when it has no links and no openers; until then it stays
//!   readable and writable by number. Inode numbers are never reused, so `generation` is
//!   always 0.
//! - **No space accounting**: the model never returns `ENOSPC`. `statfs` reports
//!   [`ModelConfig::capacity_blocks`] and the blocks its data occupies.
//! - **Sizes**: directory `size` is the number of entries (implementation-defined, not
//!   compared); `blocks` counts allocated 512-byte units of file data.
//! - **Privileges** are not interpreted: no set-id clearing on write or chown (the
//!   client's VFS does that and sends the result).
//!
//! # Timestamps
//! "Now" comes from the injected [`Clock`]; atime, mtime, ctime and btime of a new inode
//! are all now. Like Linux:
//! - create/mkdir/mknod/symlink: parent mtime+ctime;
//! - link: inode ctime, new parent mtime+ctime;
//! - unlink/rmdir: inode ctime, parent mtime+ctime;
//! - rename (not a no-op): moved inode ctime, replaced inode ctime, both parents
//!   mtime+ctime;
//! - write (non-empty), clone_range (non-empty), a size change by `setattr`: mtime+ctime;
//! - setattr with any field set: ctime (explicit mtime/atime win over the implied ones);
//!   an all-`None` setattr changes nothing;
//! - setxattr/removexattr: ctime.
//! - Reads never change atime (the model behaves as if mounted `noatime`).

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use spin::Mutex;

use vfs::{
    mode, Attr, Clock, DirEntry, Errno, FileSystem, FileType, FsResult, Ino, Owner, SetAttr,
    SetTime, StatFs, Timespec, XattrMode, NAME_MAX, ROOT_INO, SYMLINK_MAX, XATTR_VALUE_MAX,
};

/// Limits of a [`ModelFs`]; the real filesystem's tests configure the model like it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Block size: `clone_range` alignment, `statfs` unit, `blksize`.
    pub block_size: u32,
    /// Largest file size in bytes.
    pub max_file_size: u64,
    /// Largest link count (files: names; directories: 2 + subdirectories).
    pub max_links: u32,
    /// Capacity reported by `statfs`, in blocks.
    pub capacity_blocks: u64,
    /// Inode capacity reported by `statfs`.
    pub capacity_inodes: u64,
}

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            block_size: 4096,
            max_file_size: i64::MAX as u64,
            max_links: 65_000,
            capacity_blocks: 1 << 20,
            capacity_inodes: 1 << 20,
        }
    }
}

/// The reference filesystem. See the module documentation for its exact semantics.
#[derive(Debug)]
pub struct ModelFs<C: Clock> {
    clock: C,
    config: ModelConfig,
    state: Mutex<State>,
}

/// The model is served like the filesystem (`ninefold serve --model`), so it is shared
/// by several threads the same way: `Send + Sync` whenever its clock is.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn over<C: Clock + Send + Sync>() {
        shared::<ModelFs<C>>();
    }
    over::<crate::testing::ManualClock>();
};

#[derive(Debug)]
struct State {
    inodes: BTreeMap<Ino, Inode>,
    next_ino: Ino,
}

#[derive(Clone, Debug)]
struct Inode {
    kind: Kind,
    /// Permission bits only; the type bits come from `kind`.
    perm: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    nlink: u32,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    btime: Timespec,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Number of `open`s not yet `release`d.
    openers: u32,
}

#[derive(Clone, Debug)]
enum Kind {
    Regular(FileData),
    Directory(Dir),
    Symlink(Vec<u8>),
    /// Device node, FIFO or socket.
    Special(FileType),
}

/// File content as a map of `block_size` chunks; a missing chunk is a hole. Bytes past
/// `size` inside the last chunk are always zero, so extending never exposes old data.
#[derive(Clone, Debug, Default)]
struct FileData {
    size: u64,
    chunks: BTreeMap<u64, Vec<u8>>,
}

#[derive(Clone, Debug)]
struct Dir {
    /// The parent directory (the root is its own parent).
    parent: Ino,
    /// Name → (cookie, inode).
    entries: BTreeMap<Vec<u8>, (u64, Ino)>,
    /// Cookie → name: the readdir order.
    by_cookie: BTreeMap<u64, Vec<u8>>,
    next_cookie: u64,
    /// Set by `rmdir`: the directory is gone but still open.
    removed: bool,
}

/// First cookie of a directory's entries (`.` and `..` use offsets 0 and 1).
const FIRST_COOKIE: u64 = 2;

impl Dir {
    fn new(parent: Ino) -> Dir {
        Dir {
            parent,
            entries: BTreeMap::new(),
            by_cookie: BTreeMap::new(),
            next_cookie: FIRST_COOKIE,
            removed: false,
        }
    }

    fn get(&self, name: &[u8]) -> Option<Ino> {
        self.entries.get(name).map(|&(_, ino)| ino)
    }

    fn insert(&mut self, name: &[u8], ino: Ino) {
        assert!(!self.entries.contains_key(name), "insert over an entry");
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.entries.insert(name.to_vec(), (cookie, ino));
        self.by_cookie.insert(cookie, name.to_vec());
    }

    fn remove(&mut self, name: &[u8]) -> Ino {
        let (cookie, ino) = self
            .entries
            .remove(name)
            .expect("remove of a missing entry");
        self.by_cookie.remove(&cookie);
        ino
    }
}

/// Validates a name for an operation that takes a new or existing entry name.
fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Validates an xattr name.
fn check_xattr_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(Errno::ERANGE);
    }
    if name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn resolve(now: Timespec, how: SetTime) -> Timespec {
    match how {
        SetTime::Now => now,
        SetTime::To(t) => t,
    }
}

impl Inode {
    fn new(kind: Kind, perm: u32, owner: Owner, now: Timespec) -> Inode {
        Inode {
            nlink: if matches!(kind, Kind::Directory(_)) {
                2
            } else {
                1
            },
            kind,
            perm: perm & mode::PERMISSIONS,
            uid: owner.uid,
            gid: owner.gid,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            xattrs: BTreeMap::new(),
            openers: 0,
        }
    }

    fn file_type(&self) -> FileType {
        match &self.kind {
            Kind::Regular(_) => FileType::Regular,
            Kind::Directory(_) => FileType::Directory,
            Kind::Symlink(_) => FileType::Symlink,
            Kind::Special(t) => *t,
        }
    }

    fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Directory(_))
    }

    fn touch_content(&mut self, now: Timespec) {
        self.mtime = now;
        self.ctime = now;
    }

    /// The file data, or the errno `read`/`write`/`clone_range` give for other types.
    fn data_mut(&mut self) -> FsResult<&mut FileData> {
        match &mut self.kind {
            Kind::Regular(data) => Ok(data),
            Kind::Directory(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }
}

impl FileData {
    fn read(&self, block: u64, offset: u64, buf: &mut [u8]) -> usize {
        if offset >= self.size {
            return 0;
        }
        let len = buf.len().min((self.size - offset) as usize);
        let mut done = 0;
        while done < len {
            let pos = offset + done as u64;
            let within = (pos % block) as usize;
            let n = (block as usize - within).min(len - done);
            match self.chunks.get(&(pos / block)) {
                Some(chunk) => buf[done..done + n].copy_from_slice(&chunk[within..within + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        len
    }

    fn write(&mut self, block: u64, offset: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let pos = offset + done as u64;
            let within = (pos % block) as usize;
            let n = (block as usize - within).min(data.len() - done);
            let chunk = self
                .chunks
                .entry(pos / block)
                .or_insert_with(|| vec![0; block as usize]);
            chunk[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.size = self.size.max(offset + data.len() as u64);
    }

    fn truncate(&mut self, block: u64, size: u64) {
        if size < self.size {
            // Drop whole chunks past the end, zero the tail of the last one.
            self.chunks.retain(|&index, _| index * block < size);
            if let Some(chunk) = self.chunks.get_mut(&(size / block)) {
                chunk[(size % block) as usize..].fill(0);
            }
        }
        self.size = size;
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst_offset`, keeping holes
    /// holes. Both offsets are block-aligned.
    fn copy_range(
        &mut self,
        block: u64,
        src: &FileData,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(block);
            let (s, d) = ((src_offset + done) / block, (dst_offset + done) / block);
            match src.chunks.get(&s) {
                Some(chunk) => {
                    let target = self
                        .chunks
                        .entry(d)
                        .or_insert_with(|| vec![0; block as usize]);
                    target[..n as usize].copy_from_slice(&chunk[..n as usize]);
                }
                None if n == block => {
                    self.chunks.remove(&d);
                }
                None => {
                    if let Some(target) = self.chunks.get_mut(&d) {
                        target[..n as usize].fill(0);
                    }
                }
            }
            done += n;
        }
        self.size = self.size.max(dst_offset + len);
    }
}

impl State {
    fn get(&self, ino: Ino) -> FsResult<&Inode> {
        self.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn get_mut(&mut self, ino: Ino) -> FsResult<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    /// A live directory (`ENOENT` if missing or removed, `ENOTDIR` if not a directory).
    fn dir(&self, ino: Ino) -> FsResult<&Dir> {
        match &self.get(ino)?.kind {
            Kind::Directory(dir) if dir.removed => Err(Errno::ENOENT),
            Kind::Directory(dir) => Ok(dir),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> FsResult<&mut Dir> {
        self.dir(ino)?;
        match &mut self.get_mut(ino)?.kind {
            Kind::Directory(dir) => Ok(dir),
            _ => unreachable!("checked above"),
        }
    }

    fn child(&self, dir: Ino, name: &[u8]) -> FsResult<Ino> {
        self.dir(dir)?.get(name).ok_or(Errno::ENOENT)
    }

    /// Whether `ino` is `ancestor` or lies below it.
    fn is_within(&self, mut ino: Ino, ancestor: Ino) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            let Ok(Kind::Directory(dir)) = self.get(ino).map(|i| &i.kind) else {
                return false;
            };
            if ino == ROOT_INO {
                return false;
            }
            ino = dir.parent;
        }
    }

    fn touch_dir(&mut self, dir: Ino, now: Timespec) {
        self.inodes
            .get_mut(&dir)
            .expect("parent exists")
            .touch_content(now);
    }

    /// Drops one link of `ino` (already removed from its directory); frees it if that was
    /// the last link and nobody has it open.
    fn drop_link(&mut self, ino: Ino, now: Timespec) {
        let inode = self.inodes.get_mut(&ino).expect("linked inode exists");
        if let Kind::Directory(dir) = &mut inode.kind {
            dir.removed = true;
            inode.nlink = 0;
        } else {
            inode.nlink -= 1;
        }
        inode.ctime = now;
        self.free_if_unused(ino);
    }

    fn free_if_unused(&mut self, ino: Ino) {
        let inode = &self.inodes[&ino];
        if inode.nlink == 0 && inode.openers == 0 {
            self.inodes.remove(&ino);
        }
    }
}

impl<C: Clock> ModelFs<C> {
    /// An empty filesystem (just the root, mode 0755, owned by root) with default limits.
    pub fn new(clock: C) -> ModelFs<C> {
        ModelFs::with_config(clock, ModelConfig::default())
    }

    /// An empty filesystem with the given limits.
    pub fn with_config(clock: C, config: ModelConfig) -> ModelFs<C> {
        assert!(config.block_size.is_power_of_two() && config.block_size >= 512);
        let now = clock.now();
        let root = Inode::new(
            Kind::Directory(Dir::new(ROOT_INO)),
            0o755,
            Owner::default(),
            now,
        );
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT_INO, root);
        ModelFs {
            clock,
            config,
            state: Mutex::new(State {
                inodes,
                next_ino: ROOT_INO + 1,
            }),
        }
    }

    /// The limits this model enforces.
    pub fn config(&self) -> ModelConfig {
        self.config
    }

    /// The clock the model reads "now" from.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Number of live inodes (linked or open), the root included.
    pub fn inode_count(&self) -> usize {
        self.state.lock().inodes.len()
    }

    fn block(&self) -> u64 {
        u64::from(self.config.block_size)
    }

    /// `write` of `data` at `offset` into `inode` (the caller holds the state lock).
    fn write_at(&self, inode: &mut Inode, offset: u64, data: &[u8]) -> FsResult<usize> {
        inode.data_mut()?;
        if data.is_empty() {
            return Ok(0);
        }
        let max = self.config.max_file_size;
        if offset >= max {
            return Err(Errno::EFBIG);
        }
        let n = data
            .len()
            .min((max - offset).min(usize::MAX as u64) as usize);
        let now = self.clock.now();
        inode.data_mut()?.write(self.block(), offset, &data[..n]);
        inode.touch_content(now);
        Ok(n)
    }

    fn attr(&self, ino: Ino, inode: &Inode) -> Attr {
        let (size, blocks) = match &inode.kind {
            Kind::Regular(data) => (data.size, data.chunks.len() as u64 * self.block() / 512),
            Kind::Directory(dir) => (dir.entries.len() as u64, 0),
            Kind::Symlink(target) => (target.len() as u64, 0),
            Kind::Special(_) => (0, 0),
        };
        Attr {
            ino,
            generation: 0,
            mode: inode.file_type().mode_bits() | inode.perm,
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            rdev: inode.rdev,
            size,
            blocks,
            blksize: self.config.block_size,
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            btime: inode.btime,
        }
    }

    /// Inserts a new inode as `dir/name` (the shared tail of create, mkdir, mknod and
    /// symlink). The caller has validated `name`.
    fn make(
        &self,
        dir: Ino,
        name: &[u8],
        kind: Kind,
        perm: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<Attr> {
        let mut st = self.state.lock();
        let parent = st.dir(dir)?;
        if parent.get(name).is_some() {
            return Err(Errno::EEXIST);
        }
        let is_dir = matches!(kind, Kind::Directory(_));
        if is_dir && st.get(dir)?.nlink >= self.config.max_links {
            return Err(Errno::EMLINK);
        }
        let now = self.clock.now();
        let mut inode = Inode::new(kind, perm, owner, now);
        inode.rdev = rdev;
        let ino = st.next_ino;
        st.next_ino += 1;
        if let Kind::Directory(d) = &mut inode.kind {
            d.parent = dir;
        }
        st.dir_mut(dir)?.insert(name, ino);
        let parent = st.get_mut(dir)?;
        parent.touch_content(now);
        if is_dir {
            parent.nlink += 1;
        }
        let attr = self.attr(ino, &inode);
        st.inodes.insert(ino, inode);
        Ok(attr)
    }
}

impl<C: Clock> FileSystem for ModelFs<C> {
    async fn lookup(&self, dir: Ino, name: &[u8]) -> FsResult<Attr> {
        if name != b"." && name != b".." {
            check_name(name)?;
        }
        let st = self.state.lock();
        let d = st.dir(dir)?;
        let ino = match name {
            b"." => dir,
            b".." => d.parent,
            _ => d.get(name).ok_or(Errno::ENOENT)?,
        };
        Ok(self.attr(ino, st.get(ino)?))
    }

    async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        let st = self.state.lock();
        Ok(self.attr(ino, st.get(ino)?))
    }

    async fn setattr(&self, ino: Ino, changes: SetAttr) -> FsResult<Attr> {
        let mut st = self.state.lock();
        let block = self.block();
        let inode = st.get_mut(ino)?;
        if let Some(size) = changes.size {
            inode.data_mut()?;
            if size > self.config.max_file_size {
                return Err(Errno::EFBIG);
            }
        }
        if changes == SetAttr::default() {
            return Ok(self.attr(ino, inode));
        }
        let now = self.clock.now();
        if let Some(perm) = changes.mode {
            inode.perm = perm & mode::PERMISSIONS;
        }
        if let Some(uid) = changes.uid {
            inode.uid = uid;
        }
        if let Some(gid) = changes.gid {
            inode.gid = gid;
        }
        if let Some(size) = changes.size {
            let data = inode.data_mut()?;
            if data.size != size {
                data.truncate(block, size);
                inode.mtime = now;
            }
        }
        if let Some(how) = changes.atime {
            inode.atime = resolve(now, how);
        }
        if let Some(how) = changes.mtime {
            inode.mtime = resolve(now, how);
        }
        inode.ctime = now;
        Ok(self.attr(ino, inode))
    }

    async fn create(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        check_name(name)?;
        self.make(
            dir,
            name,
            Kind::Regular(FileData::default()),
            perm,
            0,
            owner,
        )
    }

    async fn mkdir(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        check_name(name)?;
        self.make(dir, name, Kind::Directory(Dir::new(dir)), perm, 0, owner)
    }

    async fn mknod(
        &self,
        dir: Ino,
        name: &[u8],
        full_mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<Attr> {
        check_name(name)?;
        let kind = match full_mode & mode::S_IFMT {
            0 | mode::S_IFREG => Kind::Regular(FileData::default()),
            mode::S_IFDIR => return Err(Errno::EPERM),
            bits => match FileType::from_mode(bits) {
                Some(
                    t @ (FileType::CharDevice
                    | FileType::BlockDevice
                    | FileType::Fifo
                    | FileType::Socket),
                ) => Kind::Special(t),
                _ => return Err(Errno::EINVAL),
            },
        };
        let is_device = matches!(
            kind,
            Kind::Special(FileType::CharDevice | FileType::BlockDevice)
        );
        let rdev = if is_device { rdev } else { 0 };
        self.make(dir, name, kind, full_mode, rdev, owner)
    }

    async fn symlink(&self, dir: Ino, name: &[u8], target: &[u8], owner: Owner) -> FsResult<Attr> {
        check_name(name)?;
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if target.contains(&0) {
            return Err(Errno::EINVAL);
        }
        self.make(dir, name, Kind::Symlink(target.to_vec()), 0o777, 0, owner)
    }

    async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        match &self.state.lock().get(ino)?.kind {
            Kind::Symlink(target) => Ok(target.clone()),
            _ => Err(Errno::EINVAL),
        }
    }

    async fn link(&self, ino: Ino, new_dir: Ino, new_name: &[u8]) -> FsResult<Attr> {
        check_name(new_name)?;
        let mut st = self.state.lock();
        let inode = st.get(ino)?;
        let dir = st.dir(new_dir)?;
        if inode.is_dir() {
            return Err(Errno::EPERM);
        }
        if inode.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        if dir.get(new_name).is_some() {
            return Err(Errno::EEXIST);
        }
        if inode.nlink >= self.config.max_links {
            return Err(Errno::EMLINK);
        }
        let now = self.clock.now();
        st.dir_mut(new_dir)?.insert(new_name, ino);
        st.touch_dir(new_dir, now);
        let inode = st.get_mut(ino)?;
        inode.nlink += 1;
        inode.ctime = now;
        Ok(self.attr(ino, inode))
    }

    async fn unlink(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        check_name(name)?;
        let mut st = self.state.lock();
        let victim = st.child(dir, name)?;
        if st.get(victim)?.is_dir() {
            return Err(Errno::EISDIR);
        }
        let now = self.clock.now();
        st.dir_mut(dir)?.remove(name);
        st.touch_dir(dir, now);
        st.drop_link(victim, now);
        Ok(())
    }

    async fn rmdir(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        check_name(name)?;
        let mut st = self.state.lock();
        let victim = st.child(dir, name)?;
        match &st.get(victim)?.kind {
            Kind::Directory(d) if !d.entries.is_empty() => return Err(Errno::ENOTEMPTY),
            Kind::Directory(_) => {}
            _ => return Err(Errno::ENOTDIR),
        }
        let now = self.clock.now();
        st.dir_mut(dir)?.remove(name);
        let parent = st.get_mut(dir)?;
        parent.touch_content(now);
        parent.nlink -= 1;
        st.drop_link(victim, now);
        Ok(())
    }

    async fn rename(
        &self,
        old_dir: Ino,
        old_name: &[u8],
        new_dir: Ino,
        new_name: &[u8],
    ) -> FsResult<()> {
        check_name(old_name)?;
        check_name(new_name)?;
        let mut st = self.state.lock();
        st.dir(old_dir)?;
        let target = st.dir(new_dir)?.get(new_name);
        let source = st.child(old_dir, old_name)?;
        let source_is_dir = st.get(source)?.is_dir();
        if source_is_dir && st.is_within(new_dir, source) {
            return Err(Errno::EINVAL);
        }
        if let Some(target) = target {
            if st.get(target)?.is_dir() && st.is_within(old_dir, target) {
                return Err(Errno::ENOTEMPTY);
            }
            if target == source {
                return Ok(());
            }
            match (&st.get(target)?.kind, source_is_dir) {
                (Kind::Directory(_), false) => return Err(Errno::EISDIR),
                (Kind::Directory(d), true) if !d.entries.is_empty() => {
                    return Err(Errno::ENOTEMPTY)
                }
                (Kind::Directory(_), true) => {}
                (_, true) => return Err(Errno::ENOTDIR),
                (_, false) => {}
            }
        } else if source_is_dir
            && old_dir != new_dir
            && st.get(new_dir)?.nlink >= self.config.max_links
        {
            return Err(Errno::EMLINK);
        }

        let now = self.clock.now();
        if let Some(target) = target {
            st.dir_mut(new_dir)?.remove(new_name);
            if source_is_dir {
                st.get_mut(new_dir)?.nlink -= 1;
            }
            st.drop_link(target, now);
        }
        st.dir_mut(old_dir)?.remove(old_name);
        st.dir_mut(new_dir)?.insert(new_name, source);
        st.touch_dir(old_dir, now);
        st.touch_dir(new_dir, now);
        if source_is_dir && old_dir != new_dir {
            st.get_mut(old_dir)?.nlink -= 1;
            st.get_mut(new_dir)?.nlink += 1;
        }
        let moved = st.get_mut(source)?;
        moved.ctime = now;
        if let Kind::Directory(d) = &mut moved.kind {
            d.parent = new_dir;
        }
        Ok(())
    }

    async fn readdir(&self, dir: Ino, offset: u64, max_entries: usize) -> FsResult<Vec<DirEntry>> {
        if max_entries == 0 {
            return Err(Errno::EINVAL);
        }
        let st = self.state.lock();
        let d = st.dir(dir)?;
        let mut out = Vec::new();
        let dots = [(b".".as_slice(), dir), (b"..".as_slice(), d.parent)];
        for (pos, (name, ino)) in dots.into_iter().enumerate() {
            if offset <= pos as u64 {
                out.push(DirEntry {
                    ino,
                    file_type: FileType::Directory,
                    name: name.to_vec(),
                    next_offset: pos as u64 + 1,
                });
            }
        }
        for (&cookie, name) in d.by_cookie.range(offset.max(FIRST_COOKIE)..) {
            let ino = d.get(name).expect("cookie index matches entries");
            out.push(DirEntry {
                ino,
                file_type: st.get(ino)?.file_type(),
                name: name.clone(),
                next_offset: cookie + 1,
            });
            if out.len() >= max_entries {
                break;
            }
        }
        out.truncate(max_entries);
        Ok(out)
    }

    async fn read_with(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        _: vfs::ReadCtx<'_>,
    ) -> FsResult<usize> {
        let mut st = self.state.lock();
        let data = st.get_mut(ino)?.data_mut()?;
        Ok(data.read(self.block(), offset, buf))
    }

    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        let mut st = self.state.lock();
        self.write_at(st.get_mut(ino)?, offset, data)
    }

    async fn append(&self, ino: Ino, data: &[u8]) -> FsResult<(u64, usize)> {
        // One lock around reading the size and writing: atomic.
        let mut st = self.state.lock();
        let inode = st.get_mut(ino)?;
        let offset = inode.data_mut()?.size;
        Ok((offset, self.write_at(inode, offset, data)?))
    }

    async fn clone_range(
        &self,
        src: Ino,
        src_offset: u64,
        dst: Ino,
        dst_offset: u64,
        len: u64,
    ) -> FsResult<()> {
        let block = self.block();
        let mut st = self.state.lock();
        let src_data = st.get_mut(src)?.data_mut()?.clone();
        let dst_size = st.get_mut(dst)?.data_mut()?.size;
        if len == 0 {
            return Ok(());
        }
        let (Some(src_end), Some(dst_end)) =
            (src_offset.checked_add(len), dst_offset.checked_add(len))
        else {
            return Err(Errno::EINVAL);
        };
        let aligned = |x: u64| x.is_multiple_of(block);
        if !aligned(src_offset) || !aligned(dst_offset) || src_end > src_data.size {
            return Err(Errno::EINVAL);
        }
        if !aligned(len) && (src_end != src_data.size || dst_end < dst_size) {
            return Err(Errno::EINVAL);
        }
        let span = len.div_ceil(block) * block;
        if src == dst && src_offset < dst_offset + span && dst_offset < src_offset + span {
            return Err(Errno::EINVAL);
        }
        if dst_end > self.config.max_file_size {
            return Err(Errno::EFBIG);
        }
        let now = self.clock.now();
        let inode = st.get_mut(dst)?;
        inode
            .data_mut()?
            .copy_range(block, &src_data, src_offset, dst_offset, len);
        inode.touch_content(now);
        Ok(())
    }

    async fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        check_xattr_name(name)?;
        let st = self.state.lock();
        st.get(ino)?.xattrs.get(name).cloned().ok_or(Errno::ENODATA)
    }

    async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrMode) -> FsResult<()> {
        check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(Errno::ERANGE);
        }
        let mut st = self.state.lock();
        let inode = st.get_mut(ino)?;
        match (how, inode.xattrs.contains_key(name)) {
            (XattrMode::Create, true) => return Err(Errno::EEXIST),
            (XattrMode::Replace, false) => return Err(Errno::ENODATA),
            _ => {}
        }
        inode.xattrs.insert(name.to_vec(), value.to_vec());
        inode.ctime = self.clock.now();
        Ok(())
    }

    async fn listxattr(&self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        let st = self.state.lock();
        Ok(st.get(ino)?.xattrs.keys().cloned().collect())
    }

    async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        check_xattr_name(name)?;
        let mut st = self.state.lock();
        let inode = st.get_mut(ino)?;
        inode.xattrs.remove(name).ok_or(Errno::ENODATA)?;
        inode.ctime = self.clock.now();
        Ok(())
    }

    async fn statfs(&self) -> FsResult<StatFs> {
        let st = self.state.lock();
        let used: u64 = st
            .inodes
            .values()
            .map(|inode| match &inode.kind {
                Kind::Regular(data) => data.chunks.len() as u64,
                _ => 0,
            })
            .sum();
        let free = self.config.capacity_blocks.saturating_sub(used);
        Ok(StatFs {
            block_size: self.config.block_size,
            blocks: self.config.capacity_blocks,
            blocks_free: free,
            blocks_avail: free,
            files: self.config.capacity_inodes,
            files_free: self
                .config
                .capacity_inodes
                .saturating_sub(st.inodes.len() as u64),
            fsid: 0,
            name_max: NAME_MAX as u32,
        })
    }

    async fn open(&self, ino: Ino) -> FsResult<()> {
        self.state.lock().get_mut(ino)?.openers += 1;
        Ok(())
    }

    async fn release(&self, ino: Ino) -> FsResult<()> {
        let mut st = self.state.lock();
        let inode = st.get_mut(ino)?;
        if inode.openers == 0 {
            return Err(Errno::EBADF);
        }
        inode.openers -= 1;
        st.free_if_unused(ino);
        Ok(())
    }

    async fn fsync(&self, ino: Ino, _datasync: bool) -> FsResult<()> {
        // Everything in memory is "durable" for the model; the crash contract is checked
        // by `sim::contract`, not here.
        self.state.lock().get(ino)?;
        Ok(())
    }

    async fn sync(&self) -> FsResult<()> {
        Ok(())
    }
}
