//! Directory requests: `Treaddir`, `Tmkdir`, `Tmknod`, `Tsymlink`, `Treadlink`, `Tlink`,
//! `Trename`, `Trenameat`, `Tunlinkat`.

use alloc::sync::Arc;
use alloc::vec::Vec;

use vfs::{Attr, Errno, FileSystem, FileType, FsResult};

use super::fid::{Fid, FidState, Parent};
use super::perm::{User, MAY_EXEC, MAY_WRITE};
use super::session::Session;
use super::{check_name, qid_of, qid_type_of, reply, Server};
use crate::wire::{
    Dirent, Qid, ReaddirReply, Rmsg, AT_REMOVEDIR, MIN_DIRENT, RDATA_HEADER_LEN, READDIR_BATCH,
};

/// The device number Linux's `new_encode_dev` makes of `(major, minor)`, which is what
/// the client decodes from `Rgetattr`'s `rdev`.
fn encode_dev(major: u32, minor: u32) -> u64 {
    let (major, minor) = (u64::from(major), u64::from(minor));
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// Names a request may not create or remove.
fn check_entry_name(name: &[u8]) -> FsResult<()> {
    check_name(name)?;
    if name == b"." || name == b".." {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

impl<F: FileSystem> Server<F> {
    /// The directory fid of a request that changes its entries, with its attributes,
    /// after the export and permission checks (`EROFS`, `ENOTDIR`, `EACCES`).
    pub(super) async fn dir_for_change(&self, s: &Session, dfid: u32) -> FsResult<(Fid, Attr)> {
        let d = s.get(dfid)?;
        if !matches!(d.state, FidState::Path | FidState::Open(..)) {
            return Err(Errno::EBADF);
        }
        if d.file_type != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        if d.read_only() {
            return Err(Errno::EROFS);
        }
        let attr = self.fs.getattr(d.ino).await?;
        d.user().check(&attr, MAY_WRITE | MAY_EXEC)?;
        Ok((d, attr))
    }

    pub(super) async fn readdir(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        offset: u64,
        count: u32,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        match f.state {
            FidState::Open(m, _) if m.read => {}
            _ => return Err(Errno::EBADF),
        }
        if f.file_type != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let count = count.min(s.msize() - RDATA_HEADER_LEN as u32);
        // The reply's memory was charged to the client when the request started
        // (`wire::reply_bound`); the allocation can still fail if the heap is short.
        let mut out = ReaddirReply::new(tag, count).map_err(|_| Errno::ENOMEM)?;
        let mut offset = offset;
        let mut full = false;
        while !full {
            let batch = (out.room() / MIN_DIRENT).clamp(1, READDIR_BATCH);
            let entries = self.fs.readdir(f.ino, offset, batch).await?;
            if entries.is_empty() {
                break;
            }
            for e in &entries {
                // `..` of the export root is the root itself, as a walk would say.
                let ino = if e.name == b".." && f.ino == f.mount.root {
                    f.ino
                } else {
                    e.ino
                };
                let entry = Dirent {
                    qid: Qid {
                        ty: qid_type_of(e.file_type),
                        version: 0,
                        path: ino,
                    },
                    offset: e.next_offset,
                    dtype: e.file_type.dirent_type(),
                    name: &e.name,
                };
                if !out.push(&entry).map_err(|_| Errno::EIO)? {
                    full = true;
                    break;
                }
                offset = e.next_offset;
            }
        }
        if out.is_empty() && full {
            // Not even one entry fits: an empty reply would read as end of directory.
            return Err(Errno::EINVAL);
        }
        Ok(out.finish())
    }

    pub(super) async fn mkdir(
        &self,
        s: &Session,
        tag: u16,
        dfid: u32,
        name: &[u8],
        mode: u32,
        gid: u32,
    ) -> FsResult<Vec<u8>> {
        let (d, dattr) = self.dir_for_change(s, dfid).await?;
        check_entry_name(name)?;
        let new = d.user().new_file(&dattr, gid, mode, FileType::Directory);
        let attr = self.fs.mkdir(d.ino, name, new.perm, new.owner).await?;
        Ok(reply(tag, &Rmsg::Mkdir { qid: qid_of(&attr) }))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn mknod(
        &self,
        s: &Session,
        tag: u16,
        dfid: u32,
        name: &[u8],
        mode: u32,
        (major, minor): (u32, u32),
        gid: u32,
    ) -> FsResult<Vec<u8>> {
        let (d, dattr) = self.dir_for_change(s, dfid).await?;
        check_entry_name(name)?;
        let kind = FileType::from_mode(mode).ok_or(Errno::EINVAL)?;
        let new = d.user().new_file(&dattr, gid, mode, kind);
        let attr = match kind {
            FileType::Regular => self.fs.create(d.ino, name, new.perm, new.owner).await?,
            FileType::Directory | FileType::Symlink => return Err(Errno::EINVAL),
            FileType::CharDevice | FileType::BlockDevice if !d.user().is_root() => {
                return Err(Errno::EPERM)
            }
            _ => {
                let rdev = encode_dev(major, minor);
                let full_mode = mode & !0o7777 | new.perm;
                self.fs
                    .mknod(d.ino, name, full_mode, rdev, new.owner)
                    .await?
            }
        };
        Ok(reply(tag, &Rmsg::Mknod { qid: qid_of(&attr) }))
    }

    pub(super) async fn symlink(
        &self,
        s: &Session,
        tag: u16,
        dfid: u32,
        name: &[u8],
        target: &[u8],
        gid: u32,
    ) -> FsResult<Vec<u8>> {
        let (d, dattr) = self.dir_for_change(s, dfid).await?;
        check_entry_name(name)?;
        if target.is_empty() || target.contains(&0) {
            return Err(Errno::EINVAL);
        }
        let new = d.user().new_file(&dattr, gid, 0o777, FileType::Symlink);
        let attr = self.fs.symlink(d.ino, name, target, new.owner).await?;
        Ok(reply(tag, &Rmsg::Symlink { qid: qid_of(&attr) }))
    }

    pub(super) async fn readlink(&self, s: &Session, tag: u16, fid: u32) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if f.file_type != FileType::Symlink {
            return Err(Errno::EINVAL);
        }
        let target = self.fs.readlink(f.ino).await?;
        Ok(reply(tag, &Rmsg::Readlink { target: &target }))
    }

    pub(super) async fn link(
        &self,
        s: &Session,
        tag: u16,
        dfid: u32,
        fid: u32,
        name: &[u8],
    ) -> FsResult<Vec<u8>> {
        let (d, _) = self.dir_for_change(s, dfid).await?;
        check_entry_name(name)?;
        let f = s.get(fid)?;
        if f.mount.export.name != d.mount.export.name {
            return Err(Errno::EXDEV);
        }
        self.fs.link(f.ino, d.ino, name).await?;
        Ok(reply(tag, &Rmsg::Link {}))
    }

    pub(super) async fn renameat(
        &self,
        s: &Session,
        tag: u16,
        olddirfid: u32,
        oldname: &[u8],
        newdirfid: u32,
        newname: &[u8],
    ) -> FsResult<Vec<u8>> {
        let (od, oattr) = self.dir_for_change(s, olddirfid).await?;
        let (nd, nattr) = self.dir_for_change(s, newdirfid).await?;
        if od.mount.export.name != nd.mount.export.name {
            return Err(Errno::EXDEV);
        }
        self.rename_entry(od.user(), &oattr, oldname, &nattr, newname)
            .await?;
        Ok(reply(tag, &Rmsg::Renameat {}))
    }

    pub(super) async fn rename(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        dfid: u32,
        name: &[u8],
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        let parent = f.parent.clone().ok_or(Errno::EOPNOTSUPP)?;
        let (nd, nattr) = self.dir_for_change(s, dfid).await?;
        if f.read_only() {
            return Err(Errno::EROFS);
        }
        if f.mount.export.name != nd.mount.export.name {
            return Err(Errno::EXDEV);
        }
        let oattr = self.fs.getattr(parent.dir).await?;
        f.user().check(&oattr, MAY_WRITE | MAY_EXEC)?;
        let found = self.fs.lookup(parent.dir, &parent.name).await?;
        if found.ino != f.ino {
            return Err(Errno::ENOENT);
        }
        self.rename_entry(f.user(), &oattr, &parent.name, &nattr, name)
            .await?;
        // Keep the fid's name current for a later Tremove/Trename.
        let mut moved = f;
        moved.parent = Some(Parent {
            dir: nd.ino,
            name: Arc::from(name),
        });
        let _ = s.replace(fid, moved);
        Ok(reply(tag, &Rmsg::Rename {}))
    }

    /// The checks and the rename itself, once both directories passed `dir_for_change`.
    async fn rename_entry(
        &self,
        user: &User,
        old_dir: &Attr,
        old_name: &[u8],
        new_dir: &Attr,
        new_name: &[u8],
    ) -> FsResult<()> {
        check_entry_name(old_name)?;
        check_entry_name(new_name)?;
        let src = self.fs.lookup(old_dir.ino, old_name).await?;
        user.check_sticky(old_dir, &src)?;
        match self.fs.lookup(new_dir.ino, new_name).await {
            Ok(dst) => user.check_sticky(new_dir, &dst)?,
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e),
        }
        // Moving a directory rewrites its `..`: that needs write permission on it.
        if src.file_type() == FileType::Directory && old_dir.ino != new_dir.ino {
            user.check(&src, MAY_WRITE)?;
        }
        self.fs
            .rename(old_dir.ino, old_name, new_dir.ino, new_name)
            .await
    }

    pub(super) async fn unlinkat(
        &self,
        s: &Session,
        tag: u16,
        dirfid: u32,
        name: &[u8],
        flags: u32,
    ) -> FsResult<Vec<u8>> {
        if flags & !AT_REMOVEDIR != 0 {
            return Err(Errno::EINVAL);
        }
        let (d, dattr) = self.dir_for_change(s, dirfid).await?;
        check_entry_name(name)?;
        let victim = self.fs.lookup(d.ino, name).await?;
        d.user().check_sticky(&dattr, &victim)?;
        let is_dir = victim.file_type() == FileType::Directory;
        match (flags & AT_REMOVEDIR != 0, is_dir) {
            (true, true) => self.fs.rmdir(d.ino, name).await?,
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (false, false) => self.fs.unlink(d.ino, name).await?,
        }
        Ok(reply(tag, &Rmsg::Unlinkat {}))
    }
}

#[cfg(test)]
mod tests {
    use super::encode_dev;

    #[test]
    fn device_numbers_use_linux_new_encoding() {
        // Linux: new_decode_dev(dev) = MKDEV((dev & 0xfff00) >> 8, (dev & 0xff) | ((dev >> 12) & 0xfff00)).
        let dev = encode_dev(8, 1);
        assert_eq!((dev & 0xfff00) >> 8, 8);
        assert_eq!((dev & 0xff) | ((dev >> 12) & 0xfff00), 1);
        let dev = encode_dev(259, 300);
        assert_eq!((dev & 0xfff00) >> 8, 259);
        assert_eq!((dev & 0xff) | ((dev >> 12) & 0xfff00), 300);
    }
}
