//! The administration tree: a small synthetic directory served beside a filesystem, for
//! the administration export (`admin_allow=`, `ninefold serve --admin-allow`).
//!
//! ```text
//! ctl      write a command (`sync`, `scrub start`, ...); read the last reply back
//! status   read-only: state, space, scrub and stream job progress (`key value` lines)
//! scrub    read-only: the running or last scrub pass's report
//! send     read-only: the stream `send start NAME [from BASE]` produces, read in order
//! receive  write-only: a stream for `receive start`, written twice (checked, applied)
//! ```
//!
//! `send` and `receive` are the client ends of the filesystem's stream jobs
//! (`ninefs::features::streams::jobs`): reads and writes there wait on a bounded buffer that a
//! background task fills or drains, so a request may take a while, and their sizes
//! read as 0.
//!
//! [`AdminFs`] wraps the served filesystem: inode numbers from [`ADMIN_ROOT`] up are the
//! tree's, everything else goes to the filesystem unchanged. Nothing in the real tree
//! leads to the synthetic inodes (and `..` stops at an export's root), so only a client
//! attached to the administration export ([`crate::server::Export::admin`]) reaches
//! them, through the server's usual export selection and allow-lists. A failed command
//! is `EINVAL` to the writer, and its reason is what `ctl` reads back.

use alloc::string::String;
use alloc::vec::Vec;

use vfs::{
    mode, Attr, Control, DirEntry, Errno, FileSystem, FileType, FsResult, Ino, Owner, QuotaInfo,
    QuotaLimits, SetAttr, StatFs, Timespec, XattrMode,
};

use crate::sync::Locked;

/// The administration tree's root directory.
pub const ADMIN_ROOT: Ino = u64::MAX - 15;
/// Longest command line accepted by one write.
pub const MAX_COMMAND_LEN: usize = 1024;

/// A file of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Root,
    Ctl,
    Status,
    Scrub,
    Send,
    Receive,
}

/// The files of the root, in `readdir` order.
const FILES: [(&[u8], Node); 5] = [
    (b"ctl", Node::Ctl),
    (b"status", Node::Status),
    (b"scrub", Node::Scrub),
    (b"send", Node::Send),
    (b"receive", Node::Receive),
];

impl Node {
    fn of(ino: Ino) -> Option<Node> {
        match ino.checked_sub(ADMIN_ROOT)? {
            0 => Some(Node::Root),
            1 => Some(Node::Ctl),
            2 => Some(Node::Status),
            3 => Some(Node::Scrub),
            4 => Some(Node::Send),
            5 => Some(Node::Receive),
            _ => None,
        }
    }

    fn ino(self) -> Ino {
        ADMIN_ROOT
            + match self {
                Node::Root => 0,
                Node::Ctl => 1,
                Node::Status => 2,
                Node::Scrub => 3,
                Node::Send => 4,
                Node::Receive => 5,
            }
    }
}

/// A filesystem with the administration tree beside it. See the module documentation.
#[derive(Debug)]
pub struct AdminFs<F> {
    fs: F,
    /// What `ctl` reads back: the last command's reply or error (from whichever CPU's
    /// connection wrote it).
    last_reply: Locked<String>,
}

impl<F> AdminFs<F> {
    /// `fs` with the administration tree.
    pub fn new(fs: F) -> AdminFs<F> {
        AdminFs {
            fs,
            last_reply: Locked::new(String::new()),
        }
    }

    /// The wrapped filesystem (what it answers beyond [`FileSystem`] is asked of it
    /// here: an `AdminFs` does not pass it on).
    pub fn inner(&self) -> &F {
        &self.fs
    }
}

impl<F: FileSystem + Control> AdminFs<F> {
    /// The content of a file of the tree.
    fn content(&self, node: Node) -> String {
        match node {
            Node::Root | Node::Send | Node::Receive => String::new(),
            Node::Ctl => self.last_reply.with(|r| r.clone()),
            Node::Status => self.fs.status(),
            Node::Scrub => self.fs.scrub_report(),
        }
    }

    fn attr(&self, node: Node) -> Attr {
        let (kind, perm, nlink) = match node {
            Node::Root => (mode::S_IFDIR, 0o555, 2),
            Node::Ctl => (mode::S_IFREG, 0o600, 1),
            Node::Status | Node::Scrub | Node::Send => (mode::S_IFREG, 0o444, 1),
            Node::Receive => (mode::S_IFREG, 0o200, 1),
        };
        let size = self.content(node).len() as u64;
        Attr {
            ino: node.ino(),
            generation: 0,
            mode: kind | perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            size,
            blocks: size.div_ceil(512),
            blksize: 4096,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            btime: Timespec::default(),
        }
    }

    fn lookup_admin(&self, dir: Node, name: &[u8]) -> FsResult<Attr> {
        if dir != Node::Root {
            return Err(Errno::ENOTDIR);
        }
        match name {
            b"." | b".." => Ok(self.attr(Node::Root)),
            _ => FILES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, node)| self.attr(node))
                .ok_or(Errno::ENOENT),
        }
    }

    fn readdir_admin(&self, dir: Node, offset: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        if dir != Node::Root {
            return Err(Errno::ENOTDIR);
        }
        let all = [
            (&b"."[..], Node::Root, FileType::Directory),
            (&b".."[..], Node::Root, FileType::Directory),
        ]
        .into_iter()
        .chain(FILES.iter().map(|&(n, node)| (n, node, FileType::Regular)));
        Ok(all
            .enumerate()
            .skip(offset as usize)
            .take(max)
            .map(|(i, (name, node, file_type))| DirEntry {
                ino: node.ino(),
                file_type,
                name: name.to_vec(),
                next_offset: i as u64 + 1,
            })
            .collect())
    }

    async fn read_admin(&self, node: Node, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        match node {
            Node::Root => return Err(Errno::EISDIR),
            Node::Send => return self.fs.send_read(offset, buf).await,
            Node::Receive => return Err(Errno::EACCES),
            _ => {}
        }
        let text = self.content(node);
        let bytes = text.as_bytes();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let n = buf.len().min(bytes.len() - start);
        buf[..n].copy_from_slice(&bytes[start..start + n]);
        Ok(n)
    }

    async fn write_admin(&self, node: Node, offset: u64, data: &[u8]) -> FsResult<usize> {
        match node {
            Node::Root => return Err(Errno::EISDIR),
            Node::Status | Node::Scrub | Node::Send => return Err(Errno::EACCES),
            Node::Receive => return self.fs.receive_write(offset, data).await,
            Node::Ctl => {}
        }
        if data.len() > MAX_COMMAND_LEN {
            return Err(Errno::EINVAL);
        }
        let line = core::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
        let result = self.fs.control(line).await;
        let (reply, ok) = match result {
            Ok(reply) => (reply, true),
            Err(e) => (alloc::format!("error: {e}"), false),
        };
        let mut last = reply;
        last.push('\n');
        self.last_reply.with(|r| *r = last);
        if ok {
            Ok(data.len())
        } else {
            Err(Errno::EINVAL)
        }
    }
}

/// Routes an inode to the administration tree or to the filesystem.
macro_rules! route {
    ($self:ident, $ino:expr, |$node:ident| $admin:expr, $fs:expr) => {
        match Node::of($ino) {
            Some($node) => $admin,
            None => $fs,
        }
    };
}

/// Each method decides for itself whether the tree or the filesystem answers: only the
/// two that name no inode are forwarded unseen (and a method added to [`FileSystem`]
/// must be routed here before it builds).
impl<F: FileSystem + Control> FileSystem for AdminFs<F> {
    vfs::forward_filesystem!(self.fs; only statfs, sync);

    async fn lookup(&self, dir: Ino, name: &[u8]) -> FsResult<Attr> {
        route!(
            self,
            dir,
            |n| self.lookup_admin(n, name),
            self.fs.lookup(dir, name).await
        )
    }

    async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        route!(self, ino, |n| Ok(self.attr(n)), self.fs.getattr(ino).await)
    }

    async fn setattr(&self, ino: Ino, changes: SetAttr) -> FsResult<Attr> {
        // Only what `echo cmd > ctl` does: truncate ctl on open (nothing to truncate).
        let truncate_only = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        route!(
            self,
            ino,
            |n| match n {
                Node::Ctl | Node::Receive if changes == truncate_only => Ok(self.attr(n)),
                _ => Err(Errno::EPERM),
            },
            self.fs.setattr(ino, changes).await
        )
    }

    async fn create(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        route!(
            self,
            dir,
            |_n| Err(Errno::EPERM),
            self.fs.create(dir, name, perm, owner).await
        )
    }

    async fn mkdir(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        route!(
            self,
            dir,
            |_n| Err(Errno::EPERM),
            self.fs.mkdir(dir, name, perm, owner).await
        )
    }

    async fn mknod(
        &self,
        dir: Ino,
        name: &[u8],
        full_mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<Attr> {
        route!(
            self,
            dir,
            |_n| Err(Errno::EPERM),
            self.fs.mknod(dir, name, full_mode, rdev, owner).await
        )
    }

    async fn symlink(&self, dir: Ino, name: &[u8], target: &[u8], owner: Owner) -> FsResult<Attr> {
        route!(
            self,
            dir,
            |_n| Err(Errno::EPERM),
            self.fs.symlink(dir, name, target, owner).await
        )
    }

    async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        route!(
            self,
            ino,
            |_n| Err(Errno::EINVAL),
            self.fs.readlink(ino).await
        )
    }

    async fn link(&self, ino: Ino, new_dir: Ino, new_name: &[u8]) -> FsResult<Attr> {
        if Node::of(ino).is_some() || Node::of(new_dir).is_some() {
            return Err(Errno::EPERM);
        }
        self.fs.link(ino, new_dir, new_name).await
    }

    async fn unlink(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        route!(
            self,
            dir,
            |_n| Err(Errno::EPERM),
            self.fs.unlink(dir, name).await
        )
    }

    async fn rmdir(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        route!(
            self,
            dir,
            |_n| Err(Errno::EPERM),
            self.fs.rmdir(dir, name).await
        )
    }

    async fn rename(
        &self,
        old_dir: Ino,
        old_name: &[u8],
        new_dir: Ino,
        new_name: &[u8],
    ) -> FsResult<()> {
        if Node::of(old_dir).is_some() || Node::of(new_dir).is_some() {
            return Err(Errno::EPERM);
        }
        self.fs.rename(old_dir, old_name, new_dir, new_name).await
    }

    async fn readdir(&self, dir: Ino, offset: u64, max_entries: usize) -> FsResult<Vec<DirEntry>> {
        route!(
            self,
            dir,
            |n| self.readdir_admin(n, offset, max_entries),
            self.fs.readdir(dir, offset, max_entries).await
        )
    }

    async fn read_with(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        ctx: vfs::ReadCtx<'_>,
    ) -> FsResult<usize> {
        route!(
            self,
            ino,
            |n| self.read_admin(n, offset, buf).await,
            self.fs.read_with(ino, offset, buf, ctx).await
        )
    }

    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        route!(
            self,
            ino,
            |n| self.write_admin(n, offset, data).await,
            self.fs.write(ino, offset, data).await
        )
    }

    async fn append(&self, ino: Ino, data: &[u8]) -> FsResult<(u64, usize)> {
        route!(
            self,
            ino,
            |n| self.write_admin(n, 0, data).await.map(|len| (0, len)),
            self.fs.append(ino, data).await
        )
    }

    async fn clone_range(
        &self,
        src: Ino,
        src_offset: u64,
        dst: Ino,
        dst_offset: u64,
        len: u64,
    ) -> FsResult<()> {
        if Node::of(src).is_some() || Node::of(dst).is_some() {
            return Err(Errno::EINVAL);
        }
        self.fs
            .clone_range(src, src_offset, dst, dst_offset, len)
            .await
    }

    async fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        route!(
            self,
            ino,
            |_n| Err(Errno::ENODATA),
            self.fs.getxattr(ino, name).await
        )
    }

    async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrMode) -> FsResult<()> {
        route!(
            self,
            ino,
            |_n| Err(Errno::EPERM),
            self.fs.setxattr(ino, name, value, how).await
        )
    }

    async fn listxattr(&self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        route!(self, ino, |_n| Ok(Vec::new()), self.fs.listxattr(ino).await)
    }

    async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        route!(
            self,
            ino,
            |_n| Err(Errno::ENODATA),
            self.fs.removexattr(ino, name).await
        )
    }

    async fn open(&self, ino: Ino) -> FsResult<()> {
        route!(self, ino, |_n| Ok(()), self.fs.open(ino).await)
    }

    async fn release(&self, ino: Ino) -> FsResult<()> {
        route!(
            self,
            ino,
            |n| {
                if n == Node::Receive {
                    self.fs.receive_closed();
                }
                Ok(())
            },
            self.fs.release(ino).await
        )
    }

    async fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        route!(self, ino, |_n| Ok(()), self.fs.fsync(ino, datasync).await)
    }

    async fn set_quota(&self, dir: Ino, limits: QuotaLimits) -> FsResult<QuotaInfo> {
        route!(
            self,
            dir,
            |_n| Err(Errno::EPERM),
            self.fs.set_quota(dir, limits).await
        )
    }

    async fn quota(&self, ino: Ino) -> FsResult<Option<QuotaInfo>> {
        route!(self, ino, |_n| Ok(None), self.fs.quota(ino).await)
    }

    async fn statfs_at(&self, ino: Ino) -> FsResult<StatFs> {
        route!(
            self,
            ino,
            |_n| self.fs.statfs().await,
            self.fs.statfs_at(ino).await
        )
    }
}
