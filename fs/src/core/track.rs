//! Per-inode tracking of what the log still has to carry.
//!
//! Every change an operation commits marks the inode (inode item, names, xattrs, file
//! block ranges; for directories also new entries and removed names). Marks are tagged
//! with the checkpoint interval they were made in, because the replay base is the last
//! *committed* checkpoint:
//!
//! - marks from an interval whose checkpoint has committed are covered by it (dropped);
//! - marks from the interval whose checkpoint is in flight are covered only if it
//!   commits: logging the inode must wait for it (its changes may be neither in the base
//!   a crash would return to nor in the log);
//! - marks from the current interval are what the next log record of the inode carries.
//!
//! When a change lands on marks from the in-flight interval, the marks are kept (a
//! superset is always safe to log) and the inode remembers that it must wait.

use alloc::vec::Vec;
use core::ops::Range;

use crate::util::ranges::RangeSet;
use vfs::Ino;

/// What changed in an inode since it was last logged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The inode item.
    pub inode: bool,
    /// Its names (`INODE_REF`s).
    pub names: bool,
    /// Its xattrs.
    pub xattrs: bool,
    /// File blocks whose mapping changed.
    pub extents: RangeSet,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.inode && !self.names && !self.xattrs && self.extents.is_empty()
    }
}

/// New entries of a directory since its entries were last logged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewEntries {
    /// Smallest readdir index added (indexes only grow, so every entry added since is at
    /// or above it).
    pub first_index: Option<u64>,
}

impl NewEntries {
    /// Whether no entry was added.
    pub fn is_empty(&self) -> bool {
        self.first_index.is_none()
    }
}

/// Marks tagged with checkpoint intervals (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tracked<T> {
    /// Interval of the last mark.
    seq: u64,
    /// An interval, possibly still in flight, holding changes merged into `marks`.
    pending: u64,
    marks: T,
}

/// What the marks mean for logging now.
#[derive(Debug, PartialEq, Eq)]
pub enum View<'a, T> {
    /// Everything is in the committed checkpoint: nothing to log.
    Covered,
    /// Some changes belong to the checkpoint in flight: wait for it to commit.
    Wait,
    /// These changes are to be logged.
    Dirty(&'a T),
}

/// Marks that can be tracked.
pub trait Marks: Default {
    /// Whether there is nothing marked.
    fn empty(&self) -> bool;
}

impl Marks for Changes {
    fn empty(&self) -> bool {
        self.is_empty()
    }
}

impl Marks for NewEntries {
    fn empty(&self) -> bool {
        self.is_empty()
    }
}

impl<T: Marks> Tracked<T> {
    /// The marks to add to in interval `cur` (the last committed checkpoint is
    /// `committed`).
    pub fn mark(&mut self, cur: u64, committed: u64) -> &mut T {
        if self.seq != cur {
            if self.seq > committed && !self.marks.empty() {
                // Changes of the interval in flight stay (a superset is safe to log);
                // logging must wait until that checkpoint commits.
                self.pending = self.seq;
            } else {
                self.marks = T::default();
            }
            self.seq = cur;
        }
        &mut self.marks
    }

    /// What to log now.
    pub fn view(&self, cur: u64, committed: u64) -> View<'_, T> {
        if self.seq <= committed {
            return View::Covered;
        }
        let in_flight = self.seq < cur && !self.marks.empty();
        if self.pending > committed || in_flight {
            return View::Wait;
        }
        View::Dirty(&self.marks)
    }

    /// Everything marked was logged (in interval `cur`).
    pub fn logged(&mut self, cur: u64) {
        self.marks = T::default();
        self.seq = cur;
        self.pending = 0;
    }

    /// The raw marks (tests and counters).
    pub fn marks(&self) -> &T {
        &self.marks
    }
}

/// Names removed since the committed checkpoint: `(name hash, inode, interval)` — for a
/// directory the entries it lost (with the child), for an inode the names it lost (with
/// the directory). Replay must not let a base entry that was removed hide a new one, and
/// a directory fsync must remove them; both need to know what was there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    list: Vec<(u64, Ino, u64)>,
    /// Interval in which the list overflowed (then nothing is known about that
    /// interval's removals).
    overflow: u64,
}

/// Most removals remembered per directory and interval before falling back to a
/// checkpoint for logging that directory's names.
const MAX_REMOVED: usize = 64;

impl Removed {
    /// Records that `(hash, ino)` was removed in interval `cur`.
    pub fn push(&mut self, hash: u64, ino: Ino, cur: u64, committed: u64) {
        self.list.retain(|e| e.2 > committed);
        if self.list.len() >= MAX_REMOVED {
            self.overflow = cur;
        } else {
            self.list.push((hash, ino, cur));
        }
    }

    /// The removals not covered by the committed checkpoint, or `None` if too many were
    /// made to remember.
    pub fn since(&self, committed: u64) -> Option<impl Iterator<Item = (u64, Ino)> + '_> {
        if self.overflow > committed {
            return None;
        }
        Some(
            self.list
                .iter()
                .filter(move |e| e.2 > committed)
                .map(|e| (e.0, e.1)),
        )
    }
}

/// Everything the log keeps per inode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogTrack {
    /// Unlogged changes.
    pub changes: Tracked<Changes>,
    /// Unlogged new entries (directories).
    pub entries: Tracked<NewEntries>,
    /// Removed entries (directories): `(name hash, child)`.
    pub removed: Removed,
    /// Names this inode lost: `(name hash, directory)`. A name it lost may now be
    /// another inode's; replay of this inode's names removes it, so that inode's names
    /// are logged too.
    pub lost: Removed,
    /// A complete record of the inode is in the log (it needs no full logging even if
    /// it is not in the committed checkpoint yet).
    pub in_log: bool,
    /// The log batch that last carried a record of the inode.
    pub batch: u64,
}

impl LogTrack {
    /// Marks file blocks `r` changed.
    pub fn mark_extents(&mut self, r: Range<u64>, cur: u64, committed: u64) {
        let ext = &mut self.changes.mark(cur, committed).extents;
        ext.remove(r.clone());
        ext.insert(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        let mut t: Tracked<Changes> = Tracked::default();
        // Interval 5 current, 4 committed.
        t.mark(5, 4).inode = true;
        assert!(matches!(t.view(5, 4), View::Dirty(c) if c.inode));
        // A checkpoint of 5 is in flight (current 6, committed 4): wait.
        assert_eq!(t.view(6, 4), View::Wait);
        // A change in 6 keeps the marks of 5 and remembers to wait.
        t.mark(6, 4).names = true;
        assert_eq!(t.view(6, 4), View::Wait);
        // Checkpoint 5 commits: log both (a superset).
        assert!(matches!(t.view(6, 5), View::Dirty(c) if c.inode && c.names));
        t.logged(6);
        assert!(matches!(t.view(6, 5), View::Dirty(c) if c.is_empty()));
        // Everything covered once 6 commits.
        t.mark(6, 5).xattrs = true;
        assert_eq!(t.view(7, 6), View::Covered);
        // Marks of a committed interval are dropped by the next change.
        t.mark(7, 6).inode = true;
        assert!(matches!(t.view(7, 6), View::Dirty(c) if c.inode && !c.xattrs));
    }

    #[test]
    fn removed_names_expire() {
        let mut r = Removed::default();
        r.push(1, 10, 5, 4);
        r.push(2, 11, 6, 4);
        assert_eq!(r.since(4).unwrap().count(), 2);
        assert_eq!(r.since(5).unwrap().collect::<Vec<_>>(), [(2, 11)]);
        for i in 0..100 {
            r.push(i, 12, 6, 4);
        }
        assert!(r.since(5).is_none(), "overflow in interval 6");
        assert!(r.since(6).is_some());
    }
}
