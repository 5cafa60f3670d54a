//! POSIX byte-range locks, kept in memory and shared by all connections of a server.
//!
//! Requests never wait: a conflicting request is answered `BLOCKED` and the Linux client
//! retries (it polls for `F_SETLKW`). An owner is a process on a client:
//! `(connection, client_id, proc_id)`; an owner's own locks never conflict with each other
//! and a new lock replaces the overlapped parts of the owner's older ones, as `fcntl` does.
//! Locks remember the fid they were taken through, so clunking that fid (closing the file)
//! or dropping the connection releases them.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use fs::vfs::Ino;

/// Shared or exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// `F_RDLCK`.
    Read,
    /// `F_WRLCK`.
    Write,
}

/// Who holds a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOwner {
    /// The connection's id.
    pub conn: u64,
    /// The client's name for itself (Linux: its nodename).
    pub client_id: Vec<u8>,
    /// The process on the client.
    pub proc_id: u32,
}

/// One held lock over the inclusive byte range `start..=end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock {
    /// Holder.
    pub owner: LockOwner,
    /// The fid it was taken through (released when that fid is clunked).
    pub fid: u32,
    /// Shared or exclusive.
    pub kind: LockKind,
    /// First byte.
    pub start: u64,
    /// Last byte (`u64::MAX`: to end of file, however far it grows).
    pub end: u64,
}

impl Lock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn conflicts(&self, owner: &LockOwner, kind: LockKind, start: u64, end: u64) -> bool {
        self.owner != *owner
            && self.overlaps(start, end)
            && (kind == LockKind::Write || self.kind == LockKind::Write)
    }
}

/// The inclusive end of a POSIX range of `length` bytes from `start` (`0` = to EOF).
pub fn range_end(start: u64, length: u64) -> u64 {
    if length == 0 {
        u64::MAX
    } else {
        start.saturating_add(length - 1)
    }
}

/// All locks of a server, by inode.
#[derive(Debug, Default)]
pub struct LockTable {
    by_ino: BTreeMap<Ino, Vec<Lock>>,
}

impl LockTable {
    /// The first lock that conflicts with `owner` taking `kind` over `start..=end`.
    pub fn conflict(
        &self,
        ino: Ino,
        owner: &LockOwner,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Option<&Lock> {
        self.by_ino
            .get(&ino)?
            .iter()
            .find(|l| l.conflicts(owner, kind, start, end))
    }

    /// Takes a lock unless it conflicts; returns whether it was granted.
    pub fn lock(&mut self, ino: Ino, new: Lock) -> bool {
        if self
            .conflict(ino, &new.owner, new.kind, new.start, new.end)
            .is_some()
        {
            return false;
        }
        self.unlock(ino, &new.owner, new.start, new.end);
        self.by_ino.entry(ino).or_default().push(new);
        true
    }

    /// Releases `owner`'s locks over `start..=end`, splitting those that stick out.
    pub fn unlock(&mut self, ino: Ino, owner: &LockOwner, start: u64, end: u64) {
        let Some(locks) = self.by_ino.get_mut(&ino) else {
            return;
        };
        let mut kept = Vec::with_capacity(locks.len() + 1);
        for l in locks.drain(..) {
            if l.owner != *owner || !l.overlaps(start, end) {
                kept.push(l);
                continue;
            }
            if l.start < start {
                kept.push(Lock {
                    end: start - 1,
                    ..l.clone()
                });
            }
            if l.end > end {
                kept.push(Lock {
                    start: end + 1,
                    ..l
                });
            }
        }
        *locks = kept;
        if locks.is_empty() {
            self.by_ino.remove(&ino);
        }
    }

    /// Drops every lock taken through `fid` of connection `conn`.
    pub fn release_fid(&mut self, conn: u64, fid: u32) {
        self.retain(|l| !(l.owner.conn == conn && l.fid == fid));
    }

    /// Drops every lock of connection `conn`.
    pub fn release_conn(&mut self, conn: u64) {
        self.retain(|l| l.owner.conn != conn);
    }

    /// Number of locks held (for tests and statistics).
    pub fn len(&self) -> usize {
        self.by_ino.values().map(Vec::len).sum()
    }

    /// Whether no lock is held.
    pub fn is_empty(&self) -> bool {
        self.by_ino.is_empty()
    }

    fn retain(&mut self, keep: impl Fn(&Lock) -> bool) {
        self.by_ino.retain(|_, locks| {
            locks.retain(&keep);
            !locks.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(conn: u64, proc_id: u32) -> LockOwner {
        LockOwner {
            conn,
            client_id: b"host".to_vec(),
            proc_id,
        }
    }

    fn lock(o: &LockOwner, kind: LockKind, start: u64, end: u64) -> Lock {
        Lock {
            owner: o.clone(),
            fid: 1,
            kind,
            start,
            end,
        }
    }

    #[test]
    fn readers_share_writers_exclude() {
        let (a, b) = (owner(1, 10), owner(2, 10));
        let mut t = LockTable::default();
        assert!(t.lock(7, lock(&a, LockKind::Read, 0, 99)));
        assert!(t.lock(7, lock(&b, LockKind::Read, 50, 150)));
        assert!(!t.lock(7, lock(&b, LockKind::Write, 90, 95)));
        assert!(t.lock(7, lock(&b, LockKind::Write, 100, 200)));
        // Other inodes are independent.
        assert!(t.lock(8, lock(&b, LockKind::Write, 0, u64::MAX)));
    }

    #[test]
    fn unlock_in_the_middle_splits() {
        let a = owner(1, 1);
        let b = owner(1, 2);
        let mut t = LockTable::default();
        assert!(t.lock(1, lock(&a, LockKind::Write, 0, 99)));
        t.unlock(1, &a, 40, 59);
        assert_eq!(t.len(), 2);
        assert!(t.lock(1, lock(&b, LockKind::Write, 40, 59)));
        assert!(!t.lock(1, lock(&b, LockKind::Write, 39, 40)));
        assert!(!t.lock(1, lock(&b, LockKind::Write, 60, 60)));
    }

    #[test]
    fn same_owner_relocks_replace_and_release_paths_clean_up() {
        let a = owner(1, 1);
        let mut t = LockTable::default();
        assert!(t.lock(1, lock(&a, LockKind::Write, 0, 99)));
        assert!(t.lock(1, lock(&a, LockKind::Read, 10, 19)));
        assert_eq!(t.len(), 3);
        let b = owner(2, 1);
        assert!(t.conflict(1, &b, LockKind::Read, 10, 19).is_none());
        assert!(t.conflict(1, &b, LockKind::Read, 0, 9).is_some());
        t.release_fid(1, 1);
        assert!(t.is_empty());
        assert!(t.lock(1, lock(&a, LockKind::Write, 0, 9)));
        t.release_conn(1);
        assert!(t.is_empty());
    }

    #[test]
    fn lengths_map_to_inclusive_ends() {
        assert_eq!(range_end(10, 0), u64::MAX);
        assert_eq!(range_end(10, 1), 10);
        assert_eq!(range_end(u64::MAX - 1, 10), u64::MAX);
    }
}
