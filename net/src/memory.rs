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
//! Accounts belong to a [`Group`]: the connections of one tenant (`crate::server::tenant`).
//! A group may hold at most [`MemoryConfig::per_tenant`] bytes together, so one tenant's
//! connections, however many, leave the rest of the budget to the others.
//!
//! Each account **reserves** [`MemoryConfig::reserve`] bytes of the budget when it is
//! opened (while the budget has room): charges are taken from the reservation first, so
//! a connection that stays within it — a few hundred fids and small requests — is served
//! whatever the other connections hold. Beyond its reservation a connection draws on the
//! shared rest of the budget. A refusal by the shared budget says whether the refused
//! connection was below its fair share (the budget divided evenly among the open
//! accounts) or its tenant below the tenant's (the budget divided evenly among the groups
//! with open accounts): then the server should reclaim memory from a connection that
//! holds more than its share and is not using it (see `Server::reclaim_memory`).
//!
//! Shared by connections on every CPU and kept exact: the budget's committed bytes rise
//! only by compare-and-swap against the limit, so charges taken at once on several CPUs
//! never pass it together; each account's books are checked and updated under the
//! account's own short lock; waiters are woken from whichever CPU gives memory back
//! (see [`Budget::wait`] for the order that keeps a wake from being lost).

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicU64, AtomicUsize};
use core::task::Waker;

use crate::sync::Locked;

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
    /// Bytes the connections of one tenant (one [`Group`]) may hold together.
    pub per_tenant: usize,
}

impl MemoryConfig {
    /// Default reservation per connection: room for a few hundred fids and small
    /// requests.
    pub const DEFAULT_RESERVE: usize = 64 << 10;

    /// Sizes for a server that may spend `limit` bytes: a connection may take a quarter
    /// of it in work in progress (so at least four must misbehave to exhaust it), but
    /// never less than `min_per_connection` (what one request of the largest msize needs:
    /// frame and reply), and an eighth in held state; a tenant all of it (tenants share
    /// by reclaim: one below its fair share takes memory back from one above).
    pub fn for_limit(limit: usize, min_per_connection: usize) -> MemoryConfig {
        MemoryConfig {
            limit,
            per_connection: (limit / 4).max(min_per_connection).min(limit),
            held_per_connection: limit / 8,
            reserve: Self::DEFAULT_RESERVE.min(limit / 64),
            per_tenant: limit,
        }
    }
}

/// Why a charge was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The connection would exceed its limit for this use
    /// ([`MemoryConfig::per_connection`] or [`MemoryConfig::held_per_connection`]).
    Connection,
    /// The connection's tenant would exceed [`MemoryConfig::per_tenant`]. `below_share`:
    /// the connection held less than its share of the tenant's (the tenant's divided
    /// among its connections), so memory should be reclaimed from another connection of
    /// the tenant that holds more.
    Tenant {
        /// The refused connection was below its share of its tenant's memory.
        below_share: bool,
    },
    /// The server's budget is spent. `below_share`: the connection (or its tenant) held
    /// less than its fair share before this charge, so memory should be reclaimed from
    /// one that holds more.
    Server {
        /// The refused connection, or its tenant, was below its fair share.
        below_share: bool,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Connection => f.write_str("connection's memory limit reached"),
            Refused::Tenant { .. } => f.write_str("tenant's memory share reached"),
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
    /// Σ over accounts of max(charged, reserved). Raised against the limit only by
    /// compare-and-swap ([`Budget::try_commit`]), so charges taken at once on several
    /// CPUs never pass it together.
    committed: AtomicUsize,
    peak: AtomicUsize,
    accounts: AtomicUsize,
    /// Groups with at least one open account.
    groups: AtomicUsize,
    /// Σ over accounts of their bytes by use.
    charged: [AtomicUsize; 5],
    refused: [AtomicU64; 5],
    unreserved: AtomicU64,
    /// Tasks waiting for memory to be given back.
    waiters: Locked<Vec<Waker>>,
}

impl Budget {
    /// A budget of `config`.
    pub fn new(config: MemoryConfig) -> Arc<Budget> {
        Arc::new(Budget {
            config,
            committed: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            accounts: AtomicUsize::new(0),
            groups: AtomicUsize::new(0),
            charged: Default::default(),
            refused: Default::default(),
            unreserved: AtomicU64::new(0),
            waiters: Locked::new(Vec::new()),
        })
    }

    /// The sizes.
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// Bytes committed now (see [`MemoryStats::committed`]).
    pub fn committed(&self) -> usize {
        self.committed.load(Relaxed)
    }

    /// What one of the open accounts may fairly hold.
    pub fn fair_share(&self) -> usize {
        self.config.limit / self.accounts.load(Relaxed).max(1)
    }

    /// What the accounts of one of the groups with open accounts may fairly hold
    /// together.
    pub fn group_share(&self) -> usize {
        self.config.limit / self.groups.load(Relaxed).max(1)
    }

    /// The counters.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            limit: self.config.limit as u64,
            committed: self.committed() as u64,
            peak: self.peak.load(Relaxed) as u64,
            charged: ByUse::from_fn(|i| self.charged[i].load(Relaxed) as u64),
            refused: ByUse::from_fn(|i| self.refused[i].load(Relaxed)),
            unreserved_accounts: self.unreserved.load(Relaxed),
        }
    }

    /// Opens an account in a group of its own, reserving [`MemoryConfig::reserve`] bytes
    /// if the budget has them.
    pub fn open(self: &Arc<Self>) -> Account {
        self.open_in(&Arc::new(Group::default()))
    }

    /// Opens an account in `group` (a tenant's), reserving [`MemoryConfig::reserve`]
    /// bytes if the budget has them.
    pub fn open_in(self: &Arc<Self>, group: &Arc<Group>) -> Account {
        let want = self.config.reserve;
        let reserved = if self.try_commit(want) {
            want
        } else {
            self.unreserved.fetch_add(1, Relaxed);
            0
        };
        self.accounts.fetch_add(1, Relaxed);
        if group.accounts.fetch_add(1, Relaxed) == 0 {
            self.groups.fetch_add(1, Relaxed);
        }
        Account {
            budget: self.clone(),
            group: group.clone(),
            reserved,
            books: Locked::new(Books::default()),
        }
    }

    /// Registers `waker` to be woken the next time memory is given back.
    ///
    /// Register *before* the last attempt to charge, not after it fails: memory given
    /// back between a refusal and the registration (on another CPU) would wake nobody.
    /// Registered first, either the attempt sees that memory or its release sees the
    /// waker (both sides go through the waiters' lock). A waker registered by an attempt
    /// that then succeeds costs one spurious wake.
    pub fn wait(&self, waker: &Waker) {
        self.waiters.with(|w| {
            if !w.iter().any(|x| x.will_wake(waker)) {
                w.push(waker.clone());
            }
        });
    }

    /// Commits `extra` bytes if that keeps the budget within its limit.
    fn try_commit(&self, extra: usize) -> bool {
        let limit = self.config.limit;
        if extra == 0 {
            // Within the reservation (the common case): nothing to raise.
            return self.committed() <= limit;
        }
        let raised = self.committed.fetch_update(Relaxed, Relaxed, |now| {
            (now.saturating_add(extra) <= limit).then_some(now + extra)
        });
        match raised {
            Ok(before) => {
                self.peak.fetch_max(before + extra, Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// Commits `extra` bytes whatever the limit says.
    fn force_commit(&self, extra: usize) {
        if extra == 0 {
            return;
        }
        let before = self.committed.fetch_add(extra, Relaxed);
        self.peak.fetch_max(before.saturating_add(extra), Relaxed);
    }

    /// Gives `bytes` of the committed back.
    fn uncommit(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let before = self.committed.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "uncommitted more than committed");
    }

    fn wake_waiters(&self) {
        // Woken outside the lock: a waker may run arbitrary code.
        let waiters = self.waiters.with(core::mem::take);
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// The accounts of one tenant: what they hold together, checked against
/// [`MemoryConfig::per_tenant`]. Shared by the tenant's accounts on every CPU: its bytes
/// rise only by compare-and-swap against the cap.
#[derive(Debug, Default)]
pub struct Group {
    charged: AtomicUsize,
    accounts: AtomicUsize,
}

impl Group {
    /// Bytes its accounts hold now.
    pub fn charged(&self) -> usize {
        self.charged.load(Relaxed)
    }

    /// Its open accounts.
    pub fn accounts(&self) -> usize {
        self.accounts.load(Relaxed)
    }

    /// Adds `bytes` if that keeps the group within `cap`.
    fn try_add(&self, bytes: usize, cap: usize) -> bool {
        self.charged
            .fetch_update(Relaxed, Relaxed, |now| {
                (now.saturating_add(bytes) <= cap).then_some(now + bytes)
            })
            .is_ok()
    }

    fn sub(&self, bytes: usize) {
        let before = self.charged.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "a group gave back more than it held");
    }
}

/// An account's bytes: what its checks and updates read and write together.
#[derive(Debug, Default)]
struct Books {
    charged: usize,
    by_use: [usize; 5],
}

impl Books {
    /// Bytes charged for state that outlives requests.
    fn held(&self) -> usize {
        Use::ALL
            .iter()
            .filter(|u| u.is_held())
            .map(|&u| self.by_use[u.index()])
            .sum()
    }
}

/// One connection's share of a [`Budget`]. Closing it (dropping) gives its reservation
/// back; its charges must have been dropped first (they hold the account).
///
/// Its books are locked while a charge is checked and taken; the budget's own state is
/// atomic, so nothing else is locked meanwhile (lock order: a session's fid table, then
/// its account's books).
#[derive(Debug)]
pub struct Account {
    budget: Arc<Budget>,
    group: Arc<Group>,
    reserved: usize,
    books: Locked<Books>,
}

impl Account {
    /// The budget it draws on.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// The group (tenant) it belongs to.
    pub fn group(&self) -> &Arc<Group> {
        &self.group
    }

    /// Bytes charged now.
    pub fn charged(&self) -> usize {
        self.books.with(|b| b.charged)
    }

    /// Bytes charged now for `what`.
    pub fn charged_for(&self, what: Use) -> usize {
        self.books.with(|b| b.by_use[what.index()])
    }

    /// Bytes charged for state that outlives requests (fids, xattr values, locks).
    pub fn held(&self) -> usize {
        self.books.with(|b| b.held())
    }

    /// Bytes set aside for this account.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// A change of this account's charges from `before` to `after` as the budget sees
    /// it: both raised to the reservation, so only what lies beyond it moves the
    /// committed bytes.
    fn beyond_reservation(&self, before: usize, after: usize) -> (usize, usize) {
        (before.max(self.reserved), after.max(self.reserved))
    }

    /// Takes `bytes` for `what`, or says why not (counted). Give them back with
    /// [`Account::release`]; [`Charge`] does both for memory that moves around.
    pub fn take(&self, what: Use, bytes: usize) -> Result<(), Refused> {
        let b = &*self.budget;
        let taken = self.books.with(|books| {
            let before = books.charged;
            let after = before.saturating_add(bytes);
            let (from, to) = self.beyond_reservation(before, after);
            let (used, cap) = if what.is_held() {
                (books.held(), b.config.held_per_connection)
            } else {
                (before - books.held(), b.config.per_connection)
            };
            if used.saturating_add(bytes) > cap {
                return Err(Refused::Connection);
            }
            if !self.group.try_add(bytes, b.config.per_tenant) {
                let share = b.config.per_tenant / self.group.accounts().max(1);
                return Err(Refused::Tenant {
                    below_share: before < share,
                });
            }
            if !b.try_commit(to - from) {
                self.group.sub(bytes);
                // Judged by what the connection and its tenant hold before this charge:
                // one that holds little may ask for a large reply.
                let group_before = self.group.charged();
                return Err(Refused::Server {
                    below_share: before < b.fair_share() || group_before < b.group_share(),
                });
            }
            books.charged = after;
            books.by_use[what.index()] += bytes;
            Ok(())
        });
        match taken {
            Ok(()) => b.charged[what.index()].fetch_add(bytes, Relaxed),
            Err(_) => {
                b.refused[what.index()].fetch_add(1, Relaxed);
                0
            }
        };
        taken
    }

    /// Takes `bytes` for `what` whatever the limits say: for memory that exists already
    /// and must be accounted (an estimate charged in advance fell short).
    pub fn force(&self, what: Use, bytes: usize) {
        let b = &*self.budget;
        self.books.with(|books| {
            let after = books.charged.saturating_add(bytes);
            let (from, to) = self.beyond_reservation(books.charged, after);
            b.force_commit(to - from);
            self.group.charged.fetch_add(bytes, Relaxed);
            books.charged = after;
            books.by_use[what.index()] += bytes;
        });
        b.charged[what.index()].fetch_add(bytes, Relaxed);
    }

    /// Gives back `bytes` taken for `what`, waking the tasks waiting for memory.
    pub fn release(&self, what: Use, bytes: usize) {
        let b = &*self.budget;
        let released = self.books.with(|books| {
            let by_use = &mut books.by_use[what.index()];
            debug_assert!(bytes <= *by_use, "released more than taken");
            let bytes = bytes.min(*by_use);
            *by_use -= bytes;
            let after = books.charged - bytes;
            let (from, to) = self.beyond_reservation(books.charged, after);
            b.uncommit(from - to);
            self.group.sub(bytes);
            books.charged = after;
            bytes
        });
        b.charged[what.index()].fetch_sub(released, Relaxed);
        if released > 0 {
            b.wake_waiters();
        }
    }

    /// Takes `bytes` for `what` as a [`Charge`] that gives them back when dropped.
    pub fn charge(self: &Arc<Self>, what: Use, bytes: usize) -> Result<Charge, Refused> {
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
        let charged = self.books.get_mut().charged;
        debug_assert_eq!(charged, 0, "account closed with live charges");
        let b = &self.budget;
        b.uncommit(self.reserved.max(charged));
        b.accounts.fetch_sub(1, Relaxed);
        if self.group.accounts.fetch_sub(1, Relaxed) == 1 {
            b.groups.fetch_sub(1, Relaxed);
        }
        b.wake_waiters();
    }
}

/// Bytes taken from an [`Account`], given back when dropped.
pub struct Charge {
    account: Arc<Account>,
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
        let (from, to) = (self.what.index(), what.index());
        account.books.with(|books| {
            books.by_use[from] -= bytes;
            books.by_use[to] += bytes;
        });
        let g = &account.budget.charged;
        g[from].fetch_sub(bytes, Relaxed);
        g[to].fetch_add(bytes, Relaxed);
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

    fn budget(limit: usize, per_connection: usize, reserve: usize) -> Arc<Budget> {
        Budget::new(MemoryConfig {
            limit,
            per_connection,
            held_per_connection: per_connection,
            reserve,
            per_tenant: limit,
        })
    }

    #[test]
    fn charges_come_from_the_reservation_first() {
        let b = budget(100 * KIB, 50 * KIB, 10 * KIB);
        let a = Arc::new(b.open());
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
        let a = Arc::new(b.open());
        let c = Arc::new(b.open());
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
            per_tenant: 100 * KIB,
        });
        let a = Arc::new(b.open());
        let _fids = a.charge(Use::Fids, 10 * KIB).unwrap();
        assert_eq!(a.take(Use::Xattrs, 1), Err(Refused::Connection));
        // The client can still send requests (a Tclunk that frees its state).
        let _frame = a.charge(Use::Frames, 20 * KIB).unwrap();
        assert_eq!(a.take(Use::Replies, 1), Err(Refused::Connection));
    }

    #[test]
    fn a_reservation_is_kept_whatever_others_hold() {
        let b = budget(100 * KIB, 100 * KIB, 10 * KIB);
        let quiet = Arc::new(b.open());
        let hog = Arc::new(b.open());
        let _all = hog.charge(Use::Replies, 90 * KIB).unwrap();
        assert!(hog.take(Use::Replies, 1).is_err());
        // The quiet connection still has its 10 KiB.
        let _fid = quiet.charge(Use::Fids, 10 * KIB).unwrap();
        assert!(quiet.take(Use::Fids, 1).is_err());
    }

    #[test]
    fn a_tenant_holds_at_most_its_share_and_a_lean_tenant_is_below_share() {
        let b = Budget::new(MemoryConfig {
            limit: 100 * KIB,
            per_connection: 45 * KIB,
            held_per_connection: 45 * KIB,
            reserve: 0,
            per_tenant: 60 * KIB,
        });
        let (hogs, lean) = (Arc::new(Group::default()), Arc::new(Group::default()));
        let a: Vec<Arc<Account>> = (0..3).map(|_| Arc::new(b.open_in(&hogs))).collect();
        let _x = a[0].charge(Use::Xattrs, 30 * KIB).unwrap();
        let _y = a[1].charge(Use::Xattrs, 30 * KIB).unwrap();
        // Each connection is within its own limit; the tenant is at its share.
        assert_eq!(
            a[2].take(Use::Fids, 1),
            Err(Refused::Tenant { below_share: true }),
            "it holds nothing of the tenant's 60 KiB"
        );
        assert_eq!(hogs.charged(), 60 * KIB);
        assert_eq!((hogs.accounts(), b.group_share()), (3, 100 * KIB));
        let l = Arc::new(b.open_in(&lean));
        assert_eq!(b.group_share(), 50 * KIB);
        let _z = l.charge(Use::Frames, 40 * KIB).unwrap();
        // Out of budget: the lean tenant (40 KiB of a 50 KiB share) is below its share
        // although its connection holds more than a connection's (25 KiB).
        assert_eq!(
            l.take(Use::Replies, 1),
            Err(Refused::Server { below_share: true })
        );
        assert_eq!(lean.charged(), 40 * KIB, "a refused charge is not kept");
        drop(a);
        assert_eq!(
            b.group_share(),
            50 * KIB,
            "the hogs' charges keep their group open"
        );
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
        let a = Arc::new(b.open());
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
        let a = Arc::new(b.open());
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

    #[test]
    fn charges_on_several_threads_never_pass_the_limit_and_all_come_back() {
        // Eight accounts on four threads race for a budget that holds a fraction of
        // what they ask for: a check and an update that were not one step would let
        // two charges pass the limit together (the peak would show it) or lose an
        // update (the committed bytes would not return to zero).
        let b = budget(64 * KIB, 64 * KIB, KIB);
        let granted = std::sync::atomic::AtomicUsize::new(0);
        let start = std::sync::Barrier::new(4);
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (b, granted, start) = (&b, &granted, &start);
                scope.spawn(move || {
                    let accounts = [Arc::new(b.open()), Arc::new(b.open())];
                    start.wait();
                    let mut held = Vec::new();
                    for i in 0..1_000_000 {
                        let a = &accounts[i % 2];
                        let what = Use::ALL[(i + t) % Use::ALL.len()];
                        if let Ok(c) = a.charge(what, 1 + (i * 7 + t) % (12 * KIB)) {
                            granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            held.push(c);
                        }
                        if held.len() >= 4 || i.is_multiple_of(3) {
                            held.truncate(i % (held.len() + 1));
                        }
                    }
                });
            }
        });
        let s = b.stats();
        assert!(s.peak <= 64 * KIB as u64, "peak {} past the limit", s.peak);
        assert_eq!(s.committed, 0, "every charge and reservation came back");
        assert_eq!(s.charged, ByUse::default());
        assert!(granted.into_inner() > 1000, "the threads got memory");
        let refused: u64 = Use::ALL.iter().map(|&u| s.refused.get(u)).sum();
        assert!(refused > 1000, "and contended for it");
    }
}
