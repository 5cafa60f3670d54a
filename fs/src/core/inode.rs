//! Inodes: creating them (files, directories, device nodes, symlinks), attributes,
//! symlink targets, statfs.

use alloc::vec::Vec;

use crate::core::dir::check_name;
use crate::core::txn::{Core, Step, Stop, Txn};
use crate::format::items::InodeItem;
use crate::format::key::kind;
use crate::format::superblock::MAX_INO;
use crate::format::{Key, TreeId};
use vfs::{
    mode, Attr, Errno, FileType, Ino, Owner, SetAttr, SetTime, StatFs, Timespec, NAME_MAX,
    ROOT_INO, SYMLINK_MAX,
};

// The inode number space: live inodes below `LIVE_INO_END`; `.snapshots` and the
// inodes of snapshots (`features::snapshots::snapdir`) above, with bit 63 set.

/// The name of the snapshots directory at the root.
pub const SNAPSHOTS_DIR: &[u8] = b".snapshots";
/// Inode number of the snapshots directory.
pub const SNAPSHOTS_DIR_INO: Ino = 1 << 63;
/// Bits of a snapshot's own inode numbers: those of the live inode space
/// ([`MAX_INO`]), which a snapshot's inodes come from.
pub(crate) const INNER_BITS: u32 = MAX_INO.trailing_zeros();
/// Live inode numbers are below this (they never reach the bits of snapshot inodes).
pub const LIVE_INO_END: Ino = MAX_INO;
/// Snapshot ids must fit the 15 bits between the inner number and the flag.
pub const MAX_SNAPSHOT_ID: u64 = (1 << 15) - 1;

/// Whether `dir`/`name` is the snapshots directory's own entry (it cannot be created,
/// replaced or removed).
pub(crate) fn is_reserved(dir: Ino, name: &[u8]) -> bool {
    dir == ROOT_INO && name == SNAPSHOTS_DIR
}

/// Whether `ino` is the snapshots directory or under it.
pub(crate) fn is_snapshot_ino(ino: Ino) -> bool {
    ino & SNAPSHOTS_DIR_INO != 0
}

/// Largest file size (as Linux: `i64::MAX`).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Most links an inode may have by default (as ext4): a file's names, a directory's
/// `2 +` subdirectories. [`MountOptions::max_links`](crate::volume::MountOptions::max_links) changes it.
pub const MAX_LINKS: u32 = 65_000;

/// Symlink targets are stored in chunks of this many bytes.
const SYMLINK_CHUNK: usize = 2048;

/// What kind of inode to make.
#[derive(Clone, Debug)]
pub enum NewInode<'a> {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link to this target.
    Symlink(&'a [u8]),
    /// Device node, FIFO or socket.
    Special(FileType, u64),
}

/// Validates a symlink target.
pub fn check_target(target: &[u8]) -> Result<(), Errno> {
    if target.is_empty() {
        return Err(Errno::ENOENT);
    }
    if target.len() > SYMLINK_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if target.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// The inode kind `mknod` makes from `full_mode`.
pub fn mknod_kind(full_mode: u32, rdev: u64) -> Result<NewInode<'static>, Errno> {
    Ok(match full_mode & mode::S_IFMT {
        0 | mode::S_IFREG => NewInode::Regular,
        mode::S_IFDIR => return Err(Errno::EPERM),
        bits => match FileType::from_mode(bits) {
            Some(t @ (FileType::CharDevice | FileType::BlockDevice)) => NewInode::Special(t, rdev),
            Some(t @ (FileType::Fifo | FileType::Socket)) => NewInode::Special(t, 0),
            _ => return Err(Errno::EINVAL),
        },
    })
}

impl Core {
    /// Creates `dir/name` (name already validated by the caller).
    pub fn op_make(
        &mut self,
        dir: Ino,
        name: &[u8],
        what: &NewInode<'_>,
        perm: u32,
        owner: Owner,
        now: Timespec,
    ) -> Step<Attr> {
        check_name(name)?;
        self.writable()?;
        let mut tx = Txn::new();
        let d = self.live_dir(&tx, dir)?;
        if self.find_entry(&tx, dir, name)?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        let is_dir = matches!(what, NewInode::Directory);
        if is_dir {
            self.check_link_limit(d.nlink)?;
        }
        self.check_user_space()?;
        let (ft, rdev, size) = match what {
            NewInode::Regular => (FileType::Regular, 0, 0),
            NewInode::Directory => (FileType::Directory, 0, 0),
            NewInode::Symlink(t) => (FileType::Symlink, 0, t.len() as u64),
            NewInode::Special(t, rdev) => (*t, *rdev, 0),
        };
        // Live inode numbers stay below `MAX_INO` (higher ones are the snapshots'):
        // once they are all used, no inode can be made.
        let ino = self.next_ino;
        if ino >= MAX_INO {
            return Err(Errno::ENOSPC.into());
        }
        let item = InodeItem {
            mode: ft.mode_bits() | (perm & mode::PERMISSIONS),
            uid: owner.uid,
            gid: owner.gid,
            nlink: if is_dir { 2 } else { 1 },
            rdev,
            size,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            generation: self.seq,
            next_seq: crate::core::dir::FIRST_INDEX,
            transid: self.seq,
            // Charged to the directory's project, as XFS's project inheritance does.
            project: d.project,
            ..Default::default()
        };
        tx.put_inode(ino, &item);
        if let NewInode::Symlink(target) = what {
            for (i, chunk) in target.chunks(SYMLINK_CHUNK).enumerate() {
                tx.put(
                    TreeId::Fs,
                    Key::new(ino, kind::SYMLINK, i as u64),
                    chunk.to_vec(),
                );
            }
        }
        self.add_entry(&mut tx, dir, name, ino, ft, now)?;
        if is_dir {
            let mut d = tx.inode(self, dir)?;
            d.nlink += 1;
            tx.put_inode(dir, &d);
        }
        tx.inode_delta = 1;
        self.commit(tx)?;
        self.next_ino = ino + 1; // below `MAX_INO` + 1: no wrap
        self.state(ino).no_xattrs = true;
        Ok(self.attr(ino, &item))
    }

    /// `getattr`.
    pub fn op_getattr(&mut self, ino: Ino) -> Step<Attr> {
        let item = self.inode(ino)?;
        Ok(self.attr(ino, &item))
    }

    /// The checks `setattr` makes before changing anything.
    pub fn setattr_check(&mut self, ino: Ino, changes: &SetAttr) -> Step<InodeItem> {
        let item = self.inode(ino)?;
        if let Some(size) = changes.size {
            match item.file_type() {
                Some(FileType::Regular) => {}
                Some(FileType::Directory) => return Err(Errno::EISDIR.into()),
                _ => return Err(Errno::EINVAL.into()),
            }
            if size > MAX_FILE_SIZE {
                return Err(Errno::EFBIG.into());
            }
        }
        if *changes != SetAttr::default() {
            self.writable()?;
        }
        Ok(item)
    }

    /// `setattr` of everything but the size (already applied by the caller).
    pub fn op_setattr(&mut self, ino: Ino, changes: &SetAttr, now: Timespec) -> Step<Attr> {
        let mut tx = Txn::new();
        let mut item = tx.inode(self, ino)?;
        if *changes == SetAttr::default() {
            return Ok(self.attr(ino, &item));
        }
        if let Some(perm) = changes.mode {
            item.mode = (item.mode & mode::S_IFMT) | (perm & mode::PERMISSIONS);
        }
        if let Some(uid) = changes.uid {
            item.uid = uid;
        }
        if let Some(gid) = changes.gid {
            item.gid = gid;
        }
        let resolve = |how: SetTime| match how {
            SetTime::Now => now,
            SetTime::To(t) => t,
        };
        if let Some(how) = changes.atime {
            item.atime = resolve(how);
        }
        if let Some(how) = changes.mtime {
            item.mtime = resolve(how);
        }
        item.ctime = now;
        tx.put_inode(ino, &item);
        self.commit(tx)?;
        Ok(self.attr(ino, &item))
    }

    /// `readlink`.
    pub fn op_readlink(&mut self, ino: Ino) -> Step<Vec<u8>> {
        let item = self.inode(ino)?;
        if item.file_type() != Some(FileType::Symlink) {
            return Err(Errno::EINVAL.into());
        }
        // The size is the item's word, not a bound: a forged one must not size an
        // allocation (a target is never longer than `SYMLINK_MAX`).
        if item.size > SYMLINK_MAX as u64 {
            return Err(Stop::Corrupt("symlink target length"));
        }
        let mut target = Vec::with_capacity(item.size as usize);
        self.trees.range(
            TreeId::Fs,
            Key::new(ino, kind::SYMLINK, 0),
            Key::new(ino, kind::SYMLINK, u64::MAX),
            |_, v| {
                target.extend_from_slice(v);
                true
            },
        )?;
        if target.len() as u64 != item.size {
            return Err(Stop::Corrupt("symlink target length"));
        }
        Ok(target)
    }

    /// `open`.
    pub fn op_open(&mut self, ino: Ino) -> Step<()> {
        self.inode(ino)?;
        self.state(ino).open += 1;
        Ok(())
    }

    /// `release`: returns whether the inode is now unreferenced (to be freed).
    pub fn op_release(&mut self, ino: Ino) -> Step<bool> {
        let item = self.inode(ino)?;
        let st = self.state(ino);
        if st.open == 0 {
            return Err(Errno::EBADF.into());
        }
        st.open -= 1;
        Ok(st.open == 0 && item.nlink == 0)
    }

    /// `statfs`. Blocks freed since the last checkpoint count as free at once: they are
    /// not reusable until a checkpoint commits their release, but an allocation that
    /// needs them runs that checkpoint (`Engine::run`).
    pub fn op_statfs(&self) -> StatFs {
        let free = self.space.free_after_checkpoint();
        // What users may still fill: both reserves are kept from them.
        let avail = free.saturating_sub(self.data_keep());
        // An inode takes no block of its own, but its number: free inodes are as many
        // as either allows.
        let inodes_free = avail.min(MAX_INO.saturating_sub(self.next_ino));
        let mut fsid = [0u8; 8];
        fsid.copy_from_slice(&self.sb.uuid[..8]);
        StatFs {
            block_size: crate::format::BLOCK_SIZE as u32,
            blocks: self.sb.layout.data_blocks(),
            blocks_free: free,
            blocks_avail: avail,
            files: self.inode_count.saturating_add(inodes_free),
            files_free: inodes_free,
            fsid: u64::from_le_bytes(fsid),
            name_max: NAME_MAX as u32,
        }
    }
}
