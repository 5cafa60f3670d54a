//! Who a request runs as, and the permission checks the server makes on its behalf.
//!
//! The filesystem interface checks nothing; as diod does with `setfsuid`, the server
//! checks each request against the attaching user's uid and groups with the classic
//! owner/group/other bits, root (uid 0, unless squashed) bypassing read/write checks and
//! directory search checks.

use alloc::vec::Vec;

use fs::vfs::{Attr, Errno, FileType, FsResult};

/// Read permission bit.
pub const MAY_READ: u32 = 4;
/// Write permission bit.
pub const MAY_WRITE: u32 = 2;
/// Execute (search, for directories) permission bit.
pub const MAY_EXEC: u32 = 1;
/// The sticky bit of a directory: only owners may delete or rename its entries.
const S_ISVTX: u32 = 0o1000;

/// The identity of an attached user, after export squashing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Effective uid.
    pub uid: u32,
    /// Groups the user is a member of (from [`crate::server::Config::groups`]).
    pub groups: Vec<u32>,
    /// gid forced onto new files (squashed users); `None` uses the client's gid.
    pub forced_gid: Option<u32>,
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

    /// The gid a new file gets when the client asks for `requested`.
    pub fn create_gid(&self, requested: u32) -> u32 {
        self.forced_gid.unwrap_or(requested)
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
    use fs::vfs::Timespec;

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
            forced_gid: None,
        }
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
