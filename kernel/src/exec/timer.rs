//! Deadline-ordered timers.

use alloc::collections::BTreeMap;
use alloc::rc::Rc;
use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use super::executor::Inner;
use crate::time::Instant;

/// Armed timers, earliest first. The sequence number keeps equal deadlines apart (and
/// orders them by arming time).
#[derive(Debug, Default)]
pub(super) struct TimerQueue {
    entries: BTreeMap<(Instant, u64), Waker>,
    next_seq: u64,
}

type Key = (Instant, u64);

impl TimerQueue {
    fn insert(&mut self, deadline: Instant, waker: Waker) -> Key {
        let key = (deadline, self.next_seq);
        self.next_seq += 1;
        self.entries.insert(key, waker);
        key
    }

    fn remove(&mut self, key: Key) {
        self.entries.remove(&key);
    }

    /// Wakes and removes every timer due at `now`; returns how many.
    pub(super) fn expire(&mut self, now: Instant) -> u64 {
        let mut fired = 0;
        while let Some(entry) = self.entries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().wake();
            fired += 1;
        }
        fired
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.entries.keys().next().map(|k| k.0)
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Completes at its deadline. Made by [`Spawner::sleep`](super::Spawner::sleep) and
/// [`Spawner::sleep_until`](super::Spawner::sleep_until); dropping it disarms the timer.
pub struct Sleep {
    inner: Rc<Inner>,
    deadline: Instant,
    key: Option<Key>,
}

impl Sleep {
    pub(super) fn new(inner: Rc<Inner>, deadline: Instant) -> Sleep {
        Sleep {
            inner,
            deadline,
            key: None,
        }
    }

    /// When this sleep completes.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.inner.now() >= this.deadline {
            if let Some(key) = this.key.take() {
                this.inner.timers.borrow_mut().remove(key);
            }
            return Poll::Ready(());
        }
        let mut timers = this.inner.timers.borrow_mut();
        match this.key {
            Some(key) => {
                // Re-arm: the entry may have fired (and been removed) spuriously early.
                let stale = timers
                    .entries
                    .get(&key)
                    .is_none_or(|w| !w.will_wake(cx.waker()));
                if stale {
                    timers.remove(key);
                    this.key = Some(timers.insert(this.deadline, cx.waker().clone()));
                }
            }
            None => this.key = Some(timers.insert(this.deadline, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.inner.timers.borrow_mut().remove(key);
        }
    }
}

/// The error of [`Spawner::timeout`](super::Spawner::timeout): time ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("timed out")
    }
}
