//! [`FileSystem`] for [`NineFs`]: each operation runs its synchronous part on the core
//! (see [`crate::core::txn`]) and its I/O outside any lock, then lets the write policy
//! checkpoint if memory or space is short.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::core::checkpoint::CheckpointCause;
use crate::core::dir::check_name;
use crate::core::inode::{check_target, mknod_kind, NewInode};
use crate::core::xattr::check_xattr_name;
use crate::engine::Engine;
use crate::features::snapshots::snapdir::{is_reserved, is_snapshot_ino, Place};
use crate::surface::control::{self, Command};
use crate::surface::report::{self, FsReport};
use crate::volume::NineFs;
use block::BlockDevice;
use vfs::{
    Attr, DirEntry, Errno, FileSystem, FsResult, Ino, Owner, QuotaInfo, QuotaLimits, ReadCtx,
    SetAttr, StatFs, XattrMode,
};

impl<D: BlockDevice> NineFs<D> {
    /// Runs `cmd` of the administration tree; `Ok` carries a one-line reply
    /// ([`control::execute`]).
    pub async fn execute(&self, cmd: &Command) -> Result<String, String> {
        control::execute(self, cmd).await
    }

    /// The status text: `key value` lines ([`control::status_text`]).
    pub fn status_text(&self) -> String {
        control::status_text(self)
    }

    /// The filesystem's state and counters now; `cache_limit` is the node cache's limit
    /// it was mounted with ([`report::report`]).
    pub async fn report(&self, cache_limit: u64) -> FsReport {
        report::report(self, cache_limit).await
    }

    async fn make(
        &self,
        dir: Ino,
        name: &[u8],
        what: NewInode<'_>,
        perm: u32,
        owner: Owner,
    ) -> FsResult<Attr> {
        refuse_names(&[(dir, name)], Errno::EEXIST)?;
        let now = self.now();
        let attr = self
            .engine
            .run(|c| c.op_make(dir, name, &what, perm, owner, now))
            .await?;
        self.engine.maintain().await?;
        Ok(attr)
    }

    /// The view and inode number of `ino` if it is in a snapshot; `None` for the live
    /// filesystem; `on_dir` for the snapshots directory itself.
    pub(crate) async fn in_snapshot(
        &self,
        ino: Ino,
        on_dir: Errno,
    ) -> FsResult<Option<(Arc<Engine<D>>, Ino)>> {
        match self.snaps.place(ino).await? {
            Place::Live => Ok(None),
            Place::Dir => Err(on_dir),
            Place::Snapshot { view, ino, .. } => Ok(Some((view, ino))),
        }
    }

    /// Frees `ino` if an operation left it without links (and it is not open).
    async fn reap(&self, orphan: Option<Ino>) -> FsResult<()> {
        if let Some(ino) = orphan {
            self.engine.free_if_unlinked(ino).await?;
        }
        self.engine.maintain().await
    }
}

/// `EROFS` if any of `inos` is under `.snapshots`.
fn refuse(inos: &[Ino]) -> FsResult<()> {
    match inos.iter().any(|&i| is_snapshot_ino(i)) {
        true => Err(Errno::EROFS),
        false => Ok(()),
    }
}

/// `EROFS` if a directory is under `.snapshots`; `reserved` if an entry is `.snapshots`.
fn refuse_names(entries: &[(Ino, &[u8])], reserved: Errno) -> FsResult<()> {
    refuse(&entries.iter().map(|e| e.0).collect::<Vec<_>>())?;
    match entries.iter().any(|&(dir, name)| is_reserved(dir, name)) {
        true => Err(reserved),
        false => Ok(()),
    }
}

impl<D: BlockDevice> FileSystem for NineFs<D> {
    async fn lookup(&self, dir: Ino, name: &[u8]) -> FsResult<Attr> {
        if let Some(attr) = self.snaps.snap_lookup(dir, name).await? {
            return Ok(attr);
        }
        self.engine.run(|c| c.op_lookup(dir, name)).await
    }

    async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        if let Some(attr) = self.snaps.snap_getattr(ino).await? {
            return Ok(attr);
        }
        self.engine.run(|c| c.op_getattr(ino)).await
    }

    async fn setattr(&self, ino: Ino, changes: SetAttr) -> FsResult<Attr> {
        refuse(&[ino])?;
        self.engine
            .run(|c| c.setattr_check(ino, &changes).map(|_| ()))
            .await?;
        if changes == SetAttr::default() {
            return self.getattr(ino).await;
        }
        if let Some(size) = changes.size {
            self.engine.set_size(ino, size).await?;
        }
        let now = self.now();
        let attr = self
            .engine
            .run(|c| c.op_setattr(ino, &changes, now))
            .await?;
        self.engine.maintain().await?;
        Ok(attr)
    }

    async fn create(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        self.make(dir, name, NewInode::Regular, perm, owner).await
    }

    async fn mkdir(&self, dir: Ino, name: &[u8], perm: u32, owner: Owner) -> FsResult<Attr> {
        self.make(dir, name, NewInode::Directory, perm, owner).await
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
        let what = mknod_kind(full_mode, rdev)?;
        self.make(dir, name, what, full_mode, owner).await
    }

    async fn symlink(&self, dir: Ino, name: &[u8], target: &[u8], owner: Owner) -> FsResult<Attr> {
        check_name(name)?;
        check_target(target)?;
        self.make(dir, name, NewInode::Symlink(target), 0o777, owner)
            .await
    }

    async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        if let Some((view, ino)) = self.in_snapshot(ino, Errno::EINVAL).await? {
            return view.run(|c| c.op_readlink(ino)).await;
        }
        self.engine.run(|c| c.op_readlink(ino)).await
    }

    async fn link(&self, ino: Ino, new_dir: Ino, new_name: &[u8]) -> FsResult<Attr> {
        refuse(&[ino])?;
        refuse_names(&[(new_dir, new_name)], Errno::EEXIST)?;
        let now = self.now();
        let attr = self
            .engine
            .run(|c| c.op_link(ino, new_dir, new_name, now))
            .await?;
        self.engine.maintain().await?;
        Ok(attr)
    }

    async fn unlink(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        refuse_names(&[(dir, name)], Errno::EROFS)?;
        let now = self.now();
        let orphan = self
            .engine
            .run(|c| c.op_remove(dir, name, false, now))
            .await?;
        self.reap(orphan).await
    }

    async fn rmdir(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        refuse_names(&[(dir, name)], Errno::EROFS)?;
        let now = self.now();
        let orphan = self
            .engine
            .run(|c| c.op_remove(dir, name, true, now))
            .await?;
        self.reap(orphan).await
    }

    async fn rename(
        &self,
        old_dir: Ino,
        old_name: &[u8],
        new_dir: Ino,
        new_name: &[u8],
    ) -> FsResult<()> {
        refuse_names(&[(old_dir, old_name), (new_dir, new_name)], Errno::EROFS)?;
        let now = self.now();
        let orphan = self
            .engine
            .run(|c| c.op_rename(old_dir, old_name, new_dir, new_name, now))
            .await?;
        self.reap(orphan).await
    }

    async fn readdir(&self, dir: Ino, offset: u64, max_entries: usize) -> FsResult<Vec<DirEntry>> {
        if let Some(entries) = self.snaps.snap_readdir(dir, offset, max_entries).await? {
            return Ok(entries);
        }
        self.engine
            .run(|c| c.op_readdir(dir, offset, max_entries))
            .await
    }

    async fn read_with(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        ctx: ReadCtx<'_>,
    ) -> FsResult<usize> {
        let n = match self.in_snapshot(ino, Errno::EISDIR).await? {
            Some((view, inner)) => view.read_data(inner, offset, buf, ctx.tenant).await?,
            None => {
                let n = self.engine.read_data(ino, offset, buf, ctx.tenant).await?;
                self.engine.maintain().await?;
                n
            }
        };
        if let Some(stream) = ctx.stream {
            self.engine
                .ask_readahead(ino, offset, n as u64, ctx.tenant, stream);
        }
        Ok(n)
    }

    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        refuse(&[ino])?;
        let (_, n) = self.engine.write_data(ino, Some(offset), data).await?;
        self.engine.maintain().await?;
        Ok(n)
    }

    async fn append(&self, ino: Ino, data: &[u8]) -> FsResult<(u64, usize)> {
        refuse(&[ino])?;
        let done = self.engine.write_data(ino, None, data).await?;
        self.engine.maintain().await?;
        Ok(done)
    }

    async fn clone_range(
        &self,
        src: Ino,
        src_offset: u64,
        dst: Ino,
        dst_offset: u64,
        len: u64,
    ) -> FsResult<()> {
        refuse(&[src, dst])?;
        self.engine
            .clone_data(src, src_offset, dst, dst_offset, len)
            .await?;
        self.engine.maintain().await
    }

    async fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        if let Some((view, ino)) = self.in_snapshot(ino, Errno::ENODATA).await? {
            return view.run(|c| c.op_getxattr(ino, name)).await;
        }
        self.engine.run(|c| c.op_getxattr(ino, name)).await
    }

    async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrMode) -> FsResult<()> {
        refuse(&[ino])?;
        check_xattr_name(name)?;
        let now = self.now();
        self.engine
            .run(|c| c.op_setxattr(ino, name, value, how, now))
            .await?;
        self.engine.maintain().await
    }

    async fn listxattr(&self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        if is_snapshot_ino(ino) {
            return match self.in_snapshot(ino, Errno::ENODATA).await {
                Ok(Some((view, ino))) => view.run(|c| c.op_listxattr(ino)).await,
                _ => Ok(Vec::new()),
            };
        }
        self.engine.run(|c| c.op_listxattr(ino)).await
    }

    async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        refuse(&[ino])?;
        let now = self.now();
        self.engine
            .run(|c| c.op_removexattr(ino, name, now))
            .await?;
        self.engine.maintain().await
    }

    async fn statfs(&self) -> FsResult<StatFs> {
        Ok(self.engine.core.lock().op_statfs())
    }

    async fn open(&self, ino: Ino) -> FsResult<()> {
        if is_snapshot_ino(ino) {
            // Opening under `.snapshots` only needs the inode to exist.
            return self.getattr(ino).await.map(|_| ());
        }
        self.engine.run(|c| c.op_open(ino)).await
    }

    async fn release(&self, ino: Ino) -> FsResult<()> {
        if is_snapshot_ino(ino) {
            return Ok(());
        }
        if self.engine.run(|c| c.op_release(ino)).await? {
            self.engine.free_if_unlinked(ino).await?;
            self.engine.maintain().await?;
        }
        Ok(())
    }

    async fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        if is_snapshot_ino(ino) {
            // Nothing under `.snapshots` ever changes.
            return Ok(());
        }
        self.engine.sync_inode(ino, datasync).await?;
        self.engine.maintain().await
    }

    async fn sync(&self) -> FsResult<()> {
        self.checkpoint(CheckpointCause::Sync).await
    }

    async fn set_quota(&self, dir: Ino, limits: QuotaLimits) -> FsResult<QuotaInfo> {
        self.quota.set_quota_at(dir, limits).await
    }

    async fn quota(&self, ino: Ino) -> FsResult<Option<QuotaInfo>> {
        if is_snapshot_ino(ino) {
            // Snapshots are read-only: nothing under them is charged.
            return Ok(None);
        }
        self.engine.run(|c| c.op_quota(ino)).await
    }
}
