//! What the server may allocate on its clients' behalf: one [`Budget`] for the whole
//! server, an [`Account`] per connection, and [`Charge`]s that give their bytes back when
//! dropped.
//!
//! Everything a client can make the server hold — request frames being received or
//! served, replies waiting to be sent, fid table entries, extended-attribute values held
//! by fids, lock records — is charged to its connection's account *before* it is
//! allocated. A charge is refused when it would take the connection past its limit —
//! [`MemoryConfig::per_connection`] for work in progress (frames, replies),
//! [`MemoryConfig::held_per_connection`] for state that outlives requests (fids, xattr
//! values, locks): separate, so that a client whose state fills its share can still send
//! the `Tclunk` that frees it — or the server past [`MemoryConfig::limit`]; what a
//! refusal means is the caller's business (the connection stops reading its socket for
//! frames and replies, a request that wants to hold state gets `ENOMEM`).
//!
//! Each account **reserves** [`MemoryConfig::reserve`] bytes of the budget when it is
//! opened (while the budget has room): charges are taken from the reservation first, so
//! a connection that stays within it — a few hundred fids and small requests — is served
//! whatever the other connections hold. Beyond its reservation a connection draws on the
//! shared rest of the budget. A refusal by the shared budget says whether the refused
//! connection was below its fair share (the budget divided evenly among the open
//! accounts): then the server should reclaim memory from a connection that holds more
//! than its share and is not using it (see `Server::reclaim`).
//!
//! Single-threaded, like the rest of the server: plain cells.

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::fmt;
use core::task::Waker;

/// Bytes by what they are used for: the causes the counters are kept by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Use {
    /// Request frames, from their size field until the request is answered.
    Frames,
    /// Replies, from the request's start (the largest reply it can get) until sent.
    Replies,
    /// Fid table entries.
    Fids,
    /// Extended-attribute values held by fids (read or being written).
    Xattrs,
    /// POSIX lock records.
    Locks,
}

impl Use {
    /// Every use, in counter order.
    pub const ALL: [Use; 5] = [
        Use::Frames,
        Use::Replies,
        Use::Fids,
        Use::Xattrs,
        Use::Locks,
    ];

    /// Its name in counters and logs.
    pub fn name(self) -> &'static str {
        match self {
            Use::Frames => "frames",
            Use::Replies => "replies",
            Use::Fids => "fids",
            Use::Xattrs => "xattrs",
            Use::Locks => "locks",
        }
    }

    /// Whether the bytes outlive the request that took them (state a client holds, as
    /// opposed to work in progress).
    pub fn is_held(self) -> bool {
        matches!(self, Use::Fids | Use::Xattrs | Use::Locks)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The budget's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Bytes all connections together may hold.
    pub limit: usize,
    /// Bytes one connection may hold in work in progress: frames and replies.
    pub per_connection: usize,
    /// Bytes one connection may hold in state that outlives requests: fids, xattr
    /// values, locks.
    pub held_per_connection: usize,
    /// Bytes of [`MemoryConfig::limit`] set aside for each open connection.
    pub reserve: usize,
}

impl MemoryConfig {
    /// Default reservation per connection: room for a few hundred fids and small
    /// requests.
    pub const DEFAULT_RESERVE: usize = 64 << 10;

    /// Sizes for a server that may spend `limit` bytes: a connection may take a quarter
    /// of it in work in progress (so at least four must misbehave to exhaust it), but
    /// never less than `min_per_connection` (what one request of the largest msize needs:
    /// frame and reply), and an eighth in held state.
    pub fn for_limit(limit: usize, min_per_connection: usize) -> MemoryConfig {
        MemoryConfig {
            limit,
            per_connection: (limit / 4).max(min_per_connection).min(limit),
            held_per_connection: limit / 8,
            reserve: Self::DEFAULT_RESERVE.min(limit / 64),
        }
    }
}

/// Why a charge was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The connection would exceed its limit for this use
    /// ([`MemoryConfig::per_connection`] or [`MemoryConfig::held_per_connection`]).
    Connection,
    /// The server's budget is spent. `below_share`: the connection held less than its
    /// fair share before this charge, so memory should be reclaimed from one that holds
    /// more.
    Server {
        /// The refused connection was below its fair share.
        below_share: bool,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Connection => f.write_str("connection's memory limit reached"),
            Refused::Server { .. } => f.write_str("server's memory budget spent"),
        }
    }
}

/// One number per [`Use`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ByUse {
    /// [`Use::Frames`].
    pub frames: u64,
    /// [`Use::Replies`].
    pub replies: u64,
    /// [`Use::Fids`].
    pub fids: u64,
    /// [`Use::Xattrs`].
    pub xattrs: u64,
    /// [`Use::Locks`].
    pub locks: u64,
}

impl ByUse {
    fn from_fn(f: impl Fn(usize) -> u64) -> ByUse {
        ByUse {
            frames: f(Use::Frames.index()),
            replies: f(Use::Replies.index()),
            fids: f(Use::Fids.index()),
            xattrs: f(Use::Xattrs.index()),
            locks: f(Use::Locks.index()),
        }
    }

    /// The number for `what`.
    pub fn get(&self, what: Use) -> u64 {
        match what {
            Use::Frames => self.frames,
            Use::Replies => self.replies,
            Use::Fids => self.fids,
            Use::Xattrs => self.xattrs,
            Use::Locks => self.locks,
        }
    }
}

/// A snapshot of the budget's state and counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MemoryStats {
    /// The limit.
    pub limit: u64,
    /// Bytes committed now: charges beyond reservations, plus every reservation.
    pub committed: u64,
    /// Most bytes ever committed.
    pub peak: u64,
    /// Bytes charged now, by use.
    pub charged: ByUse,
    /// Charges refused, by use.
    pub refused: ByUse,
    /// Accounts that were opened without a reservation (the budget was full).
    pub unreserved_accounts: u64,
}

/// A server's memory budget. See the module documentation.
#[derive(Debug)]
pub struct Budget {
    config: MemoryConfig,
    /// Σ over accounts of max(charged, reserved).
    committed: Cell<usize>,
    peak: Cell<usize>,
    accounts: Cell<usize>,
    charged: [Cell<usize>; 5],
    refused: [Cell<u64>; 5],
    unreserved: Cell<u64>,
    /// Tasks waiting for memory to be given back.
    waiters: RefCell<Vec<Waker>>,
}

impl Budget {
    /// A budget of `config`.
    pub fn new(config: MemoryConfig) -> Rc<Budget> {
        Rc::new(Budget {
            config,
            committed: Cell::new(0),
            peak: Cell::new(0),
            accounts: Cell::new(0),
            charged: Default::default(),
            refused: Default::default(),
            unreserved: Cell::new(0),
            waiters: RefCell::new(Vec::new()),
        })
    }

    /// The sizes.
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// Bytes committed now (see [`MemoryStats::committed`]).
    pub fn committed(&self) -> usize {
        self.committed.get()
    }

    /// What one of `accounts` open accounts may fairly hold.
    pub fn fair_share(&self) -> usize {
        self.config.limit / self.accounts.get().max(1)
    }

    /// The counters.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            limit: self.config.limit as u64,
            committed: self.committed.get() as u64,
            peak: self.peak.get() as u64,
            charged: ByUse::from_fn(|i| self.charged[i].get() as u64),
            refused: ByUse::from_fn(|i| self.refused[i].get()),
            unreserved_accounts: self.unreserved.get(),
        }
    }

    /// Opens an account, reserving [`MemoryConfig::reserve`] bytes if the budget has
    /// them.
    pub fn open(self: &Rc<Self>) -> Account {
        let want = self.config.reserve;
        let reserved = if self.committed.get() + want <= self.config.limit {
            want
        } else {
            self.unreserved.set(self.unreserved.get() + 1);
            0
        };
        self.commit(reserved as isize);
        self.accounts.set(self.accounts.get() + 1);
        Account {
            budget: self.clone(),
            reserved,
            charged: Cell::new(0),
            by_use: Default::default(),
        }
    }

    /// Registers `waker` to be woken the next time memory is given back.
    pub fn wait(&self, waker: &Waker) {
        let mut w = self.waiters.borrow_mut();
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
    }

    fn commit(&self, delta: isize) {
        let now = self.committed.get().saturating_add_signed(delta);
        self.committed.set(now);
        self.peak.set(self.peak.get().max(now));
    }

    fn wake_waiters(&self) {
        let waiters = core::mem::take(&mut *self.waiters.borrow_mut());
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// One connection's share of a [`Budget`]. Closing it (dropping) gives its reservation
/// back; its charges must have been dropped first (they hold the account).
#[derive(Debug)]
pub struct Account {
    budget: Rc<Budget>,
    reserved: usize,
    charged: Cell<usize>,
    by_use: [Cell<usize>; 5],
}

impl Account {
    /// The budget it draws on.
    pub fn budget(&self) -> &Rc<Budget> {
        &self.budget
    }

    /// Bytes charged now.
    pub fn charged(&self) -> usize {
        self.charged.get()
    }

    /// Bytes charged now for `what`.
    pub fn charged_for(&self, what: Use) -> usize {
        self.by_use[what.index()].get()
    }

    /// Bytes charged for state that outlives requests (fids, xattr values, locks).
    pub fn held(&self) -> usize {
        Use::ALL
            .iter()
            .filter(|u| u.is_held())
            .map(|&u| self.charged_for(u))
            .sum()
    }

    /// Bytes set aside for this account.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Takes `bytes` for `what`, or says why not (counted). Give them back with
    /// [`Account::release`]; [`Charge`] does both for memory that moves around.
    pub fn take(&self, what: Use, bytes: usize) -> Result<(), Refused> {
        let b = &self.budget;
        let before = self.charged.get();
        let after = before.saturating_add(bytes);
        // Only the part beyond the reservation draws on the shared budget.
        let extra = after.max(self.reserved) - before.max(self.reserved);
        let (used, cap) = if what.is_held() {
            (self.held(), b.config.held_per_connection)
        } else {
            (before - self.held(), b.config.per_connection)
        };
        let refusal = if used.saturating_add(bytes) > cap {
            Some(Refused::Connection)
        } else if b.committed.get() + extra > b.config.limit {
            // Judged by what the connection holds before this charge: one that holds
            // little may ask for a large reply.
            Some(Refused::Server {
                below_share: before < b.fair_share(),
            })
        } else {
            None
        };
        if let Some(r) = refusal {
            let n = &b.refused[what.index()];
            n.set(n.get() + 1);
            return Err(r);
        }
        self.force(what, bytes);
        Ok(())
    }

    /// Takes `bytes` for `what` whatever the limits say: for memory that exists already
    /// and must be accounted (an estimate charged in advance fell short).
    pub fn force(&self, what: Use, bytes: usize) {
        let b = &self.budget;
        let before = self.charged.get();
        let after = before.saturating_add(bytes);
        b.commit((after.max(self.reserved) - before.max(self.reserved)) as isize);
        self.charged.set(after);
        let u = &self.by_use[what.index()];
        u.set(u.get() + bytes);
        let g = &b.charged[what.index()];
        g.set(g.get() + bytes);
    }

    /// Gives back `bytes` taken for `what`, waking the tasks waiting for memory.
    pub fn release(&self, what: Use, bytes: usize) {
        let b = &self.budget;
        let before = self.charged.get();
        debug_assert!(
            bytes <= self.by_use[what.index()].get(),
            "released more than taken"
        );
        let after = before.saturating_sub(bytes);
        let freed = before.max(self.reserved) - after.max(self.reserved);
        b.commit(-(freed as isize));
        self.charged.set(after);
        let u = &self.by_use[what.index()];
        u.set(u.get().saturating_sub(bytes));
        let g = &b.charged[what.index()];
        g.set(g.get().saturating_sub(bytes));
        if bytes > 0 {
            b.wake_waiters();
        }
    }

    /// Takes `bytes` for `what` as a [`Charge`] that gives them back when dropped.
    pub fn charge(self: &Rc<Self>, what: Use, bytes: usize) -> Result<Charge, Refused> {
        self.take(what, bytes)?;
        Ok(Charge {
            account: self.clone(),
            what,
            bytes,
        })
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        debug_assert_eq!(self.charged.get(), 0, "account closed with live charges");
        let b = &self.budget;
        b.commit(-(self.reserved.max(self.charged.get()) as isize));
        b.accounts.set(b.accounts.get() - 1);
        b.wake_waiters();
    }
}

/// Bytes taken from an [`Account`], given back when dropped.
pub struct Charge {
    account: Rc<Account>,
    what: Use,
    bytes: usize,
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Charge({} {} bytes)", self.what.name(), self.bytes)
    }
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps only `bytes` of the charge (no more than it holds), giving the rest back:
    /// for a reply that turned out smaller than the largest it could have been.
    pub fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            self.account.release(self.what, self.bytes - bytes);
            self.bytes = bytes;
        }
    }

    /// Moves the charge to another use (a frame's bytes becoming a reply's).
    pub fn convert(mut self, what: Use) -> Charge {
        let account = self.account.clone();
        let bytes = core::mem::take(&mut self.bytes);
        let by = &account.by_use;
        by[self.what.index()].set(by[self.what.index()].get() - bytes);
        by[what.index()].set(by[what.index()].get() + bytes);
        let g = &account.budget.charged;
        g[self.what.index()].set(g[self.what.index()].get() - bytes);
        g[what.index()].set(g[what.index()].get() + bytes);
        Charge {
            account,
            what,
            bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.account.release(self.what, self.bytes);
        }
    }
}

/// A value together with the memory charged for it: the charge goes when the value does.
#[derive(Debug)]
pub struct Charged<T> {
    /// The value.
    pub value: T,
    _charge: Charge,
}

impl<T> Charged<T> {
    /// `value`, paid for by `charge`.
    pub fn new(value: T, charge: Charge) -> Self {
        Charged {
            value,
            _charge: charge,
        }
    }
}

impl<T> core::ops::Deref for Charged<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;

    fn budget(limit: usize, per_connection: usize, reserve: usize) -> Rc<Budget> {
        Budget::new(MemoryConfig {
            limit,
            per_connection,
            held_per_connection: per_connection,
            reserve,
        })
    }

    #[test]
    fn charges_come_from_the_reservation_first() {
        let b = budget(100 * KIB, 50 * KIB, 10 * KIB);
        let a = Rc::new(b.open());
        assert_eq!(b.committed(), 10 * KIB);
        let c = a.charge(Use::Frames, 8 * KIB).unwrap();
        assert_eq!(b.committed(), 10 * KIB, "within the reservation");
        let d = a.charge(Use::Replies, 8 * KIB).unwrap();
        assert_eq!(b.committed(), 16 * KIB);
        drop(c);
        assert_eq!(b.committed(), 10 * KIB);
        drop(d);
        assert_eq!(a.charged(), 0);
        drop(a);
        assert_eq!(b.committed(), 0);
        assert_eq!(b.stats().peak, 16 * KIB as u64);
    }

    #[test]
    fn per_connection_and_server_limits_refuse_and_count() {
        let b = budget(100 * KIB, 60 * KIB, 0);
        let a = Rc::new(b.open());
        let c = Rc::new(b.open());
        let _big = a.charge(Use::Xattrs, 60 * KIB).unwrap();
        assert_eq!(a.take(Use::Xattrs, 1), Err(Refused::Connection));
        let _more = c.charge(Use::Frames, 40 * KIB).unwrap();
        // Both at or above their fair share (50 KiB)? c holds 40: below it.
        assert_eq!(
            c.take(Use::Frames, 1),
            Err(Refused::Server { below_share: true })
        );
        let s = b.stats();
        assert_eq!(s.refused.get(Use::Xattrs), 1);
        assert_eq!(s.refused.frames, 1);
        assert_eq!(s.committed, 100 * KIB as u64);
    }

    #[test]
    fn held_state_and_work_in_progress_have_separate_limits() {
        let b = Budget::new(MemoryConfig {
            limit: 100 * KIB,
            per_connection: 20 * KIB,
            held_per_connection: 10 * KIB,
            reserve: 0,
        });
        let a = Rc::new(b.open());
        let _fids = a.charge(Use::Fids, 10 * KIB).unwrap();
        assert_eq!(a.take(Use::Xattrs, 1), Err(Refused::Connection));
        // The client can still send requests (a Tclunk that frees its state).
        let _frame = a.charge(Use::Frames, 20 * KIB).unwrap();
        assert_eq!(a.take(Use::Replies, 1), Err(Refused::Connection));
    }

    #[test]
    fn a_reservation_is_kept_whatever_others_hold() {
        let b = budget(100 * KIB, 100 * KIB, 10 * KIB);
        let quiet = Rc::new(b.open());
        let hog = Rc::new(b.open());
        let _all = hog.charge(Use::Replies, 90 * KIB).unwrap();
        assert!(hog.take(Use::Replies, 1).is_err());
        // The quiet connection still has its 10 KiB.
        let _fid = quiet.charge(Use::Fids, 10 * KIB).unwrap();
        assert!(quiet.take(Use::Fids, 1).is_err());
    }

    #[test]
    fn accounts_beyond_the_budget_get_no_reservation() {
        let b = budget(20 * KIB, 20 * KIB, 8 * KIB);
        let _a = b.open();
        let _b = b.open();
        let c = b.open();
        assert_eq!(c.reserved(), 0);
        assert_eq!(b.stats().unreserved_accounts, 1);
        assert_eq!(b.committed(), 16 * KIB);
    }

    #[test]
    fn shrinking_and_converting_keep_the_sums() {
        let b = budget(100 * KIB, 100 * KIB, 0);
        let a = Rc::new(b.open());
        let mut r = a.charge(Use::Frames, 30 * KIB).unwrap();
        r.shrink_to(10 * KIB);
        assert_eq!(a.charged(), 10 * KIB);
        let r = r.convert(Use::Replies);
        assert_eq!(a.charged_for(Use::Frames), 0);
        assert_eq!(a.charged_for(Use::Replies), 10 * KIB);
        assert_eq!(b.stats().charged.replies, 10 * KIB as u64);
        let held = Charged::new(7u8, a.charge(Use::Locks, KIB).unwrap());
        assert_eq!(*held, 7);
        assert_eq!(a.held(), KIB);
        drop((r, held));
        assert_eq!(b.committed(), 0);
    }

    #[test]
    fn releases_wake_waiters() {
        use alloc::sync::Arc;
        use alloc::task::Wake;
        use core::sync::atomic::{AtomicUsize, Ordering};
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let b = budget(10 * KIB, 10 * KIB, 0);
        let a = Rc::new(b.open());
        let c = a.charge(Use::Frames, 10 * KIB).unwrap();
        b.wait(&waker);
        b.wait(&waker);
        drop(c);
        assert_eq!(
            count.0.load(Ordering::Relaxed),
            1,
            "woken once, then forgotten"
        );
    }
}
