//! The one lock around [`Core`], counted.
//!
//! Every CPU serving the filesystem takes it for every operation, so how often it is
//! taken, how often a CPU finds it held, and how long it is held say whether it limits
//! how many CPUs the filesystem can use. Each acquisition is counted, and one that finds
//! the lock held (its first `try_lock` fails, then it spins) counts as contended. With a
//! monotonic clock ([`MountOptions::hold_clock`](crate::volume::MountOptions::hold_clock)) each
//! hold is timed too: one clock read when the lock is taken, one when it is released —
//! nothing else is added to the hold. The counters live in [`Core`] itself
//! ([`FsStats::core_lock`](crate::core::counters::FsStats::core_lock)), updated while the lock is held,
//! so they need no synchronisation of their own.

use ::core::ops::{Deref, DerefMut};
use spin::{Mutex, MutexGuard};

use crate::core::txn::Core;

/// A monotonic clock in nanoseconds (any origin).
pub(crate) type HoldClock = fn() -> u64;

/// [`Core`] behind a spin lock that counts its use (see the module documentation).
pub(crate) struct CoreLock {
    core: Mutex<Core>,
    clock: Option<HoldClock>,
}

impl CoreLock {
    /// `core` behind the lock; holds are timed on `clock` if there is one.
    pub(crate) fn new(core: Core, clock: Option<HoldClock>) -> CoreLock {
        CoreLock {
            core: Mutex::new(core),
            clock,
        }
    }

    /// The clock holds are timed on (a snapshot view times its own lock on it too).
    pub(crate) fn clock(&self) -> Option<HoldClock> {
        self.clock
    }

    /// Takes the lock, spinning while another CPU holds it. Only synchronous code may
    /// hold the guard: it is never kept across an `await`.
    pub(crate) fn lock(&self) -> CoreGuard<'_> {
        let (mut core, contended) = match self.core.try_lock() {
            Some(core) => (core, false),
            None => (self.core.lock(), true),
        };
        let counters = &mut core.stats.core_lock;
        counters.acquisitions += 1;
        counters.contended += u64::from(contended);
        let since = self.clock.map(|now| (now, now()));
        CoreGuard { core, since }
    }
}

/// The held lock: [`Core`] through `Deref`; dropping it releases the lock and adds the
/// hold to the counters.
pub(crate) struct CoreGuard<'a> {
    core: MutexGuard<'a, Core>,
    /// The clock and its reading when the lock was taken (`None`: holds are not timed).
    since: Option<(HoldClock, u64)>,
}

impl Deref for CoreGuard<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.core
    }
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        if let Some((now, since)) = self.since {
            let held = now().saturating_sub(since);
            let counters = &mut self.core.stats.core_lock;
            counters.hold_ns += held;
            counters.max_hold_ns = counters.max_hold_ns.max(held);
        }
    }
}
