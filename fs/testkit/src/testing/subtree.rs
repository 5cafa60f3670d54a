//! One directory of a filesystem, served as a whole filesystem of its own.
//!
//! Several op sequences can then run on one filesystem at once, each in its own
//! directory and each compared with its own model (whose root is that directory):
//! [`Subtree`] shows the directory as [`ROOT_INO`] and nothing outside it — its `..`
//! is itself, as the root's is — so paths, listings and link counts read exactly as
//! the model's.

use alloc::vec::Vec;

use vfs::{Attr, DirEntry, FileSystem, FsResult, Ino, Owner, SetAttr, StatFs, XattrMode, ROOT_INO};

/// The directory `base` of `fs` as a filesystem (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct Subtree<'a, F> {
    fs: &'a F,
    base: Ino,
}

impl<'a, F: FileSystem> Subtree<'a, F> {
    /// `base` (a directory of `fs`) as the root.
    pub fn new(fs: &'a F, base: Ino) -> Subtree<'a, F> {
        Subtree { fs, base }
    }

    /// An inode number of the subtree as `fs` knows it.
    fn inward(&self, ino: Ino) -> Ino {
        if ino == ROOT_INO {
            self.base
        } else {
            ino
        }
    }

    /// An inode number of `fs` as the subtree shows it.
    fn outward(&self, ino: Ino) -> Ino {
        if ino == self.base {
            ROOT_INO
        } else {
            ino
        }
    }

    fn attr(&self, attr: FsResult<Attr>) -> FsResult<Attr> {
        attr.map(|a| Attr {
            ino: self.outward(a.ino),
            ..a
        })
    }
}

impl<F: FileSystem> FileSystem for Subtree<'_, F> {
    async fn lookup(&self, dir: Ino, name: &[u8]) -> FsResult<Attr> {
        // The root's parent is the root: nothing outside the subtree is reachable.
        let dir = self.inward(dir);
        if dir == self.base && name == b".." {
            return self.attr(self.fs.getattr(dir).await);
        }
        self.attr(self.fs.lookup(dir, name).await)
    }

    async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.attr(self.fs.getattr(self.inward(ino)).await)
    }

    async fn setattr(&self, ino: Ino, changes: SetAttr) -> FsResult<Attr> {
        self.attr(self.fs.setattr(self.inward(ino), changes).await)
    }

    async fn create(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        self.attr(self.fs.create(self.inward(dir), name, perm, owner).await)
    }

    async fn mkdir(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        self.attr(self.fs.mkdir(self.inward(dir), name, perm, owner).await)
    }

    async fn mknod(
        &self,
        dir: Ino,
        name: &[u8],
        full_mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<Attr> {
        let made = self
            .fs
            .mknod(self.inward(dir), name, full_mode, rdev, owner);
        self.attr(made.await)
    }

    async fn symlink(&self, dir: Ino, name: &[u8], target: &[u8], owner: Owner) -> FsResult<Attr> {
        self.attr(self.fs.symlink(self.inward(dir), name, target, owner).await)
    }

    async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.fs.readlink(self.inward(ino)).await
    }

    async fn link(&self, ino: Ino, new_dir: Ino, new_name: &[u8]) -> FsResult<Attr> {
        let linked = self
            .fs
            .link(self.inward(ino), self.inward(new_dir), new_name);
        self.attr(linked.await)
    }

    async fn unlink(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        self.fs.unlink(self.inward(dir), name).await
    }

    async fn rmdir(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        self.fs.rmdir(self.inward(dir), name).await
    }

    async fn rename(
        &self,
        old_dir: Ino,
        old_name: &[u8],
        new_dir: Ino,
        new_name: &[u8],
    ) -> FsResult<()> {
        let (from, to) = (self.inward(old_dir), self.inward(new_dir));
        self.fs.rename(from, old_name, to, new_name).await
    }

    async fn readdir(&self, dir: Ino, offset: u64, max_entries: usize) -> FsResult<Vec<DirEntry>> {
        let dir = self.inward(dir);
        let mut entries = self.fs.readdir(dir, offset, max_entries).await?;
        for e in &mut entries {
            e.ino = if dir == self.base && e.name == b".." {
                ROOT_INO
            } else {
                self.outward(e.ino)
            };
        }
        Ok(entries)
    }

    async fn read_with(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        ctx: vfs::ReadCtx<'_>,
    ) -> FsResult<usize> {
        self.fs.read_with(self.inward(ino), offset, buf, ctx).await
    }

    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.fs.write(self.inward(ino), offset, data).await
    }

    async fn append(&self, ino: Ino, data: &[u8]) -> FsResult<(u64, usize)> {
        self.fs.append(self.inward(ino), data).await
    }

    async fn clone_range(
        &self,
        src: Ino,
        src_offset: u64,
        dst: Ino,
        dst_offset: u64,
        len: u64,
    ) -> FsResult<()> {
        let (src, dst) = (self.inward(src), self.inward(dst));
        self.fs
            .clone_range(src, src_offset, dst, dst_offset, len)
            .await
    }

    async fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        self.fs.getxattr(self.inward(ino), name).await
    }

    async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrMode) -> FsResult<()> {
        self.fs.setxattr(self.inward(ino), name, value, how).await
    }

    async fn listxattr(&self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        self.fs.listxattr(self.inward(ino)).await
    }

    async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.fs.removexattr(self.inward(ino), name).await
    }

    async fn statfs(&self) -> FsResult<StatFs> {
        self.fs.statfs().await
    }

    async fn open(&self, ino: Ino) -> FsResult<()> {
        self.fs.open(self.inward(ino)).await
    }

    async fn release(&self, ino: Ino) -> FsResult<()> {
        self.fs.release(self.inward(ino)).await
    }

    async fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        self.fs.fsync(self.inward(ino), datasync).await
    }

    async fn sync(&self) -> FsResult<()> {
        self.fs.sync().await
    }
}
