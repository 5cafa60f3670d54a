//! Applying a checked stream's records to the live tree, through the filesystem's own
//! operations, in the order the sender writes them (`super`'s documentation), and
//! deleting what a failed receive made before it is rolled back.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::core::dir::FIRST_INDEX;
use crate::features::streams::host::StreamHost;
use crate::features::streams::receive::model::Model;
use crate::features::streams::receive::{
    remove_tree, restore_times, ReceiveError, OWNER, RECEIVED_XATTR,
};
use crate::format::stream::{DataMode, InodeRef, InodeState, Record};
use vfs::{Attr, Errno, FileType, Ino, SetAttr, Timespec, XattrMode, ROOT_INO};

/// The receive in progress: how stream inodes map to inodes here.
pub(super) struct Apply<'a, H: StreamHost> {
    fs: &'a H,
    /// The tree as the records applied so far left it, which checks each record first.
    model: Model<H>,
    /// The staging directory (at the root) and its name.
    staging: Ino,
    staging_name: Vec<u8>,
    /// New inodes: the sender's number → the one here.
    new: BTreeMap<Ino, Ino>,
    /// Every described inode's times, set last.
    times: Vec<(Ino, [Timespec; 4])>,
    /// Directories now in staging, by inode: their name there.
    staged_dirs: BTreeMap<Ino, Vec<u8>>,
    /// The last name given in staging ([`staged_name`]).
    next_name: u64,
    /// The inodes this receive made (what [`Apply::discard`] deletes).
    made: BTreeSet<Ino>,
    /// Names this receive gave inodes it made in directories it did not make:
    /// directory, name, inode.
    placed: Vec<(Ino, Vec<u8>, Ino)>,
}

/// The next free name in staging (`1`, `2`, ...) after `last`.
fn staged_name(last: &mut u64) -> Vec<u8> {
    *last += 1;
    format!("{last}").into_bytes()
}

impl<'a, H: StreamHost> Apply<'a, H> {
    /// Starts applying to `fs`, whose live tree equals `base` (or is empty without one),
    /// with the staging directory just made there as `staging_name`.
    pub(super) fn new(
        fs: &'a H,
        base: Option<Arc<H>>,
        staging: Ino,
        staging_name: Vec<u8>,
    ) -> Self {
        Apply {
            fs,
            model: Model::new(base, Some(staging_name.clone())),
            staging,
            staging_name,
            new: BTreeMap::new(),
            times: Vec::new(),
            staged_dirs: BTreeMap::new(),
            next_name: 0,
            made: BTreeSet::new(),
            placed: Vec::new(),
        }
    }

    /// The inode `r` names here.
    async fn resolve(&mut self, r: &InodeRef) -> Result<Ino, ReceiveError> {
        match r {
            InodeRef::New(n) => self.new.get(n).copied().ok_or(ReceiveError::Inconsistent(
                "an inode used before it is made",
            )),
            // Base inodes have the same numbers here as in the base snapshot.
            InodeRef::Base(_) => self.model.resolve(r).await,
        }
    }

    /// The next free name in staging.
    fn stage_name(&mut self) -> Vec<u8> {
        staged_name(&mut self.next_name)
    }

    /// Makes the new inode of the sender's number `src` in staging, as `s` describes it.
    async fn make(&mut self, s: &InodeState, src: Ino) -> Result<(), ReceiveError> {
        let name = self.stage_name();
        let (fs, dir) = (self.fs, self.staging);
        let perm = s.mode & vfs::mode::PERMISSIONS;
        let ty = FileType::from_mode(s.mode).ok_or(ReceiveError::Inconsistent("mode"))?;
        let attr = match ty {
            FileType::Regular => fs.create(dir, &name, perm, OWNER).await?,
            FileType::Directory => fs.mkdir(dir, &name, perm, OWNER).await?,
            FileType::Symlink => fs.symlink(dir, &name, &s.target, OWNER).await?,
            _ => fs.mknod(dir, &name, s.mode, s.rdev, OWNER).await?,
        };
        if ty == FileType::Directory {
            self.staged_dirs.insert(attr.ino, name);
        }
        self.new.insert(src, attr.ino);
        self.made.insert(attr.ino);
        Ok(())
    }

    /// Gives the inode `s` describes its owner, permissions and size (its type and
    /// target it has: made so, or kept, as the check made sure).
    async fn attributes(&mut self, s: &InodeState) -> Result<(), ReceiveError> {
        let ino = self.resolve(&s.ino).await?;
        let fs = self.fs;
        let set = SetAttr {
            uid: Some(s.uid),
            gid: Some(s.gid),
            mode: Some(s.mode & vfs::mode::PERMISSIONS),
            ..SetAttr::default()
        };
        fs.setattr(ino, set).await?;
        match s.data {
            DataMode::Keep => {}
            DataMode::Whole => {
                fs.setattr(ino, size(0)).await?;
                fs.setattr(ino, size(s.size)).await?;
            }
            DataMode::Patch => {
                fs.setattr(ino, size(s.size)).await?;
            }
        }
        Ok(())
    }

    /// Makes `list` the complete set of the inode's xattrs.
    async fn xattrs(
        &mut self,
        r: &InodeRef,
        list: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), ReceiveError> {
        let ino = self.resolve(r).await?;
        for name in self.fs.listxattr(ino).await? {
            if !list.iter().any(|(n, _)| *n == name) {
                self.fs.removexattr(ino, &name).await?;
            }
        }
        for (name, value) in list {
            self.fs
                .setxattr(ino, name, value, XattrMode::Upsert)
                .await?;
        }
        Ok(())
    }

    /// Links `child` into `dir` as `name` (a directory: moved there from staging).
    async fn link(
        &mut self,
        dir: &InodeRef,
        name: &[u8],
        child: &InodeRef,
    ) -> Result<(), ReceiveError> {
        let d = self.resolve(dir).await?;
        let c = self.resolve(child).await?;
        match self.staged_dirs.remove(&c) {
            Some(staged) => self.fs.rename(self.staging, &staged, d, name).await?,
            None => {
                self.fs.link(c, d, name).await?;
            }
        }
        if self.made.contains(&c) && !self.made.contains(&d) {
            self.placed.push((d, name.to_vec(), c));
        }
        Ok(())
    }

    /// Moves entry `name` of `dir` into staging (deleted at the end unless linked again).
    async fn unlink(&mut self, dir: &InodeRef, name: &[u8]) -> Result<(), ReceiveError> {
        let d = self.resolve(dir).await?;
        let attr = self.fs.lookup(d, name).await?;
        let staged = self.stage_name();
        self.fs.rename(d, name, self.staging, &staged).await?;
        if attr.file_type() == FileType::Directory {
            self.staged_dirs.insert(attr.ino, staged);
        }
        Ok(())
    }

    /// Applies one record (in stream order, which [`Validator`](crate::features::streams::receive::validate::Validator) checked), once the
    /// model has checked it.
    pub(super) async fn record(&mut self, r: &Record) -> Result<(), ReceiveError> {
        self.model.record(r).await?;
        match r {
            Record::Begin(_) => {}
            Record::Unlink(dir, name) => self.unlink(dir, name).await?,
            Record::Inode(s) => {
                if let InodeRef::New(src) = s.ino {
                    self.make(s, src).await?;
                }
                self.attributes(s).await?;
                let ino = self.resolve(&s.ino).await?;
                self.times.push((ino, [s.atime, s.mtime, s.ctime, s.btime]));
            }
            Record::Xattrs(ino, list) => self.xattrs(ino, list).await?,
            Record::Data(ino, offset, data) => {
                let ino = self.resolve(ino).await?;
                self.fs.write(ino, *offset, data).await?;
            }
            Record::Link(dir, name, child) => self.link(dir, name, child).await?,
        }
        Ok(())
    }

    /// After the last record: removes staging and what is left in it, marks the root
    /// with `mark` and sets the times (every other step changes some).
    pub(super) async fn finish(&mut self, mark: &[u8]) -> Result<(), ReceiveError> {
        self.model.finish()?;
        remove_tree(self.fs, ROOT_INO, &self.staging_name, &mut |_| None).await?;
        self.fs
            .setxattr(ROOT_INO, RECEIVED_XATTR, mark, XattrMode::Upsert)
            .await?;
        for (ino, times) in core::mem::take(&mut self.times) {
            restore_times(self.fs.engine(), ino, times).await?;
        }
        Ok(())
    }

    /// After a failure: deletes every inode this receive made, wherever it put them,
    /// so that the rollback that follows has the space they took (a receive that ran
    /// out of it could not start one otherwise). Base inodes met on the way are moved
    /// to staging, where the rollback finds them as it finds the others.
    pub(super) async fn discard(&mut self) -> Result<(), ReceiveError> {
        let (fs, staging) = (self.fs, self.staging);
        for (dir, name, ino) in core::mem::take(&mut self.placed) {
            match fs.lookup(dir, &name).await {
                Ok(a) if a.ino == ino => {
                    let staged = self.stage_name();
                    fs.rename(dir, &name, staging, &staged).await?;
                }
                Ok(_) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (made, next_name) = (&self.made, &mut self.next_name);
        let mut spare =
            |a: &Attr| (!made.contains(&a.ino)).then(|| (staging, staged_name(next_name)));
        let mut offset = FIRST_INDEX;
        loop {
            let entries = fs.readdir(staging, offset, 64).await?;
            let Some(last) = entries.last() else {
                return Ok(());
            };
            offset = last.next_offset;
            for e in entries.iter().filter(|e| made.contains(&e.ino)) {
                remove_tree(fs, staging, &e.name, &mut spare).await?;
            }
        }
    }
}

/// A change of size to `n` alone.
fn size(n: u64) -> SetAttr {
    SetAttr {
        size: Some(n),
        ..SetAttr::default()
    }
}
