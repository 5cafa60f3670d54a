//! Who a request runs as, and the permission checks the server makes on its behalf.
//!
//! The filesystem interface checks nothing; as diod does with `setfsuid`, the server
//! checks each request against the attaching user's uid and groups with the classic
//! owner/group/other bits, root (uid 0, unless squashed) bypassing read/write checks and
//! directory search checks.
//!
//! A user never gets a group they are not in: the gid a create names is honoured only
//! for root or a member (else the directory's group, the BSD rule), and a set-gid file
//! keeps that bit only if its creator, or whoever chmods it, is root or in its group.

use alloc::vec::Vec;

use vfs::{Attr, Errno, FileType, FsResult, Owner};

/// Read permission bit.
pub const MAY_READ: u32 = 4;
/// Write permission bit.
pub const MAY_WRITE: u32 = 2;
/// Execute (search, for directories) permission bit.
pub const MAY_EXEC: u32 = 1;
/// The sticky bit of a directory: only owners may delete or rename its entries.
const S_ISVTX: u32 = 0o1000;
/// The set-group-ID bit: a file runs as its group; a directory's new entries get its
/// group.
pub const S_ISGID: u32 = 0o2000;
/// The set-user-ID bit: a file runs as its owner.
pub const S_ISUID: u32 = 0o4000;
/// Group execute permission.
const S_IXGRP: u32 = 0o010;

/// The mode a file keeps when it is written or changes hands (Linux's
/// `should_remove_suid`): without set-uid, and without set-gid if it is group-executable
/// (set-gid without group execute marks mandatory locking, not privilege). `None` when
/// there is nothing to drop.
pub fn without_set_id(mode: u32) -> Option<u32> {
    let mut kill = mode & S_ISUID;
    if mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP {
        kill |= S_ISGID;
    }
    (kill != 0).then_some(mode & 0o7777 & !kill)
}

/// The bits `mkdir` takes from the request (Linux's `S_IRWXUGO | S_ISVTX`); set-gid
/// comes only from the parent.
const MKDIR_BITS: u32 = 0o1777;

/// The identity of an attached user, after export squashing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Effective uid.
    pub uid: u32,
    /// Groups the user is a member of (from [`crate::server::Config::groups`]).
    pub groups: Vec<u32>,
    /// Whether [`User::groups`] is known: the configuration names this uid's groups
    /// (`group=`), or the user is squashed. 9P carries no groups, so without an entry
    /// the server cannot tell whether the user is in a file's group; the client can
    /// (Linux's applies `setattr_prepare` before it sends a chmod), and its request is
    /// then taken as sent.
    pub groups_known: bool,
    /// gid forced onto new files (squashed users); `None`: the gid the client names, if
    /// the user may use it (see [`User::new_file`]).
    pub forced_gid: Option<u32>,
}

/// Owner and permission bits of a file about to be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewFile {
    /// Its uid and gid.
    pub owner: Owner,
    /// Its permission bits (`0o7777` at most).
    pub perm: u32,
}

impl User {
    /// Whether this user has root's privileges.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the user is in group `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }

    /// Whether the user is root or in group `gid`: may own files in it, set-gid ones too.
    pub fn may_use_group(&self, gid: u32) -> bool {
        self.is_root() || self.in_group(gid)
    }

    /// Whether a chmod by this user keeps a requested set-gid bit on a file of group
    /// `gid`: when [`User::may_use_group`], or when the server does not know the user's
    /// groups (the client, which does, cleared the bit already if it had to).
    pub fn may_keep_set_gid(&self, gid: u32) -> bool {
        self.may_use_group(gid) || !self.groups_known
    }

    /// Owner and bits of a new `kind` entry of `dir` that the client asks to create with
    /// group `requested` and bits `perm` (as Linux's `inode_init_owner`):
    /// - group: a set-gid directory's own; else a squashed user's anonymous gid; else
    ///   `requested` if [`User::may_use_group`], else the directory's (the BSD rule);
    /// - a new directory is set-gid if its parent is, and takes no other set-id bits;
    /// - anything else keeps `S_ISGID` only if the user may use its group.
    pub fn new_file(&self, dir: &Attr, requested: u32, perm: u32, kind: FileType) -> NewFile {
        let setgid_dir = dir.mode & S_ISGID != 0;
        let gid = if setgid_dir {
            dir.gid
        } else if let Some(anon) = self.forced_gid {
            anon
        } else if self.may_use_group(requested) {
            requested
        } else {
            dir.gid
        };
        let perm = perm & 0o7777;
        let perm = if kind == FileType::Directory {
            perm & MKDIR_BITS | if setgid_dir { S_ISGID } else { 0 }
        } else if self.may_use_group(gid) {
            perm
        } else {
            perm & !S_ISGID
        };
        NewFile {
            owner: Owner { uid: self.uid, gid },
            perm,
        }
    }

    /// Checks `want` ([`MAY_READ`] | [`MAY_WRITE`] | [`MAY_EXEC`]) on `attr`: `EACCES`.
    pub fn check(&self, attr: &Attr, want: u32) -> FsResult<()> {
        if self.is_root() {
            // Root reads and writes anything, searches any directory, and executes a
            // file only if some execute bit is set (as Linux's CAP_DAC_OVERRIDE).
            let exec_ok = want & MAY_EXEC == 0
                || attr.file_type() == FileType::Directory
                || attr.mode & 0o111 != 0;
            return if exec_ok { Ok(()) } else { Err(Errno::EACCES) };
        }
        let bits = if self.uid == attr.uid {
            attr.mode >> 6
        } else if self.in_group(attr.gid) {
            attr.mode >> 3
        } else {
            attr.mode
        } & 7;
        if bits & want == want {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// Whether the user owns `attr` or is root (needed for chmod, utimes to a given
    /// time, and setting system xattrs).
    pub fn owns(&self, attr: &Attr) -> bool {
        self.is_root() || self.uid == attr.uid
    }

    /// The sticky-directory rule for deleting or renaming `victim` out of `dir`: `EPERM`.
    pub fn check_sticky(&self, dir: &Attr, victim: &Attr) -> FsResult<()> {
        if dir.mode & S_ISVTX == 0 || self.owns(victim) || self.uid == dir.uid {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfs::Timespec;

    fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: 5,
            generation: 0,
            mode,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            size: 0,
            blocks: 0,
            blksize: 4096,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            btime: Timespec::default(),
        }
    }

    fn user(uid: u32, groups: &[u32]) -> User {
        User {
            uid,
            groups: groups.to_vec(),
            groups_known: true,
            forced_gid: None,
        }
    }

    #[test]
    fn writes_and_chowns_drop_set_id_bits_as_linux() {
        assert_eq!(without_set_id(0o100_4755), Some(0o755));
        assert_eq!(without_set_id(0o100_2755), Some(0o755));
        assert_eq!(without_set_id(0o100_6755), Some(0o755));
        // Set-gid without group execute stays (mandatory-locking marker).
        assert_eq!(without_set_id(0o100_2745), None);
        assert_eq!(without_set_id(0o100_6745), Some(0o2745));
        assert_eq!(without_set_id(0o100_0777), None);
    }

    #[test]
    fn classes_are_exclusive_like_posix() {
        let file = attr(0o100_604, 10, 20);
        // The owner class applies to the owner even when "other" would allow more.
        assert_eq!(user(10, &[]).check(&file, MAY_READ), Ok(()));
        assert_eq!(user(10, &[]).check(&file, MAY_WRITE), Ok(()));
        assert_eq!(user(11, &[20]).check(&file, MAY_READ), Err(Errno::EACCES));
        assert_eq!(user(12, &[]).check(&file, MAY_READ), Ok(()));
        assert_eq!(user(12, &[]).check(&file, MAY_WRITE), Err(Errno::EACCES));
    }

    #[test]
    fn root_bypasses_rw_but_not_exec_of_plain_files() {
        let root = user(0, &[]);
        assert_eq!(
            root.check(&attr(0o100_000, 5, 5), MAY_READ | MAY_WRITE),
            Ok(())
        );
        assert_eq!(
            root.check(&attr(0o100_600, 5, 5), MAY_EXEC),
            Err(Errno::EACCES)
        );
        assert_eq!(root.check(&attr(0o040_000, 5, 5), MAY_EXEC), Ok(()));
    }

    fn squashed(anon: u32) -> User {
        User {
            uid: anon,
            groups: alloc::vec![anon],
            groups_known: true,
            forced_gid: Some(anon),
        }
    }

    #[test]
    fn new_files_get_a_requested_group_only_from_members() {
        let dir = attr(0o040_777, 0, 50);
        let member = user(1000, &[100]);
        let new = member.new_file(&dir, 100, 0o644, FileType::Regular);
        assert_eq!((new.owner.uid, new.owner.gid, new.perm), (1000, 100, 0o644));
        // Naming a foreign group gets the directory's instead, and no set-gid bit.
        let new = member.new_file(&dir, 0, 0o2755, FileType::Regular);
        assert_eq!((new.owner.gid, new.perm), (50, 0o755));
        // Root may name any group; set-gid kept.
        let new = user(0, &[]).new_file(&dir, 7, 0o2755, FileType::Regular);
        assert_eq!((new.owner.uid, new.owner.gid, new.perm), (0, 7, 0o2755));
        // A member keeps set-gid on a file of their group.
        let new = member.new_file(&dir, 100, 0o2755, FileType::Regular);
        assert_eq!(new.perm, 0o2755);
        // Squashed users get their anonymous gid, whatever they name.
        let new = squashed(65534).new_file(&dir, 0, 0o2644, FileType::Regular);
        assert_eq!(
            (new.owner.uid, new.owner.gid, new.perm),
            (65534, 65534, 0o2644)
        );
    }

    #[test]
    fn set_gid_directories_pass_on_their_group() {
        let dir = attr(0o042_775, 0, 100);
        let outsider = user(1000, &[]);
        let new = outsider.new_file(&dir, 1000, 0o2755, FileType::Regular);
        // The directory's group, but a set-gid file only for members.
        assert_eq!((new.owner.gid, new.perm), (100, 0o755));
        let new = user(1001, &[100]).new_file(&dir, 5, 0o2755, FileType::Regular);
        assert_eq!((new.owner.gid, new.perm), (100, 0o2755));
        // New directories inherit the group and the set-gid bit, whoever makes them.
        let new = outsider.new_file(&dir, 1000, 0o755, FileType::Directory);
        assert_eq!((new.owner.gid, new.perm), (100, 0o2755));
        // Squashed users too (the directory's group beats the anonymous gid).
        let new = squashed(65534).new_file(&dir, 0, 0o644, FileType::Regular);
        assert_eq!(new.owner.gid, 100);
        // Outside set-gid directories, mkdir drops set-id bits and keeps sticky.
        let plain = attr(0o040_777, 0, 0);
        let new = user(0, &[]).new_file(&plain, 0, 0o7777, FileType::Directory);
        assert_eq!(new.perm, 0o1777);
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let dir = attr(0o041_777, 0, 0);
        let theirs = attr(0o100_666, 7, 7);
        assert_eq!(user(8, &[]).check_sticky(&dir, &theirs), Err(Errno::EPERM));
        assert_eq!(user(7, &[]).check_sticky(&dir, &theirs), Ok(()));
        assert_eq!(user(0, &[]).check_sticky(&dir, &theirs), Ok(()));
        let plain = attr(0o040_777, 0, 0);
        assert_eq!(user(8, &[]).check_sticky(&plain, &theirs), Ok(()));
    }
}
