//! What connections on different CPUs share is behind [`Locked`]: a short spin lock
//! reachable only through a closure.
//!
//! A closure cannot `.await`, so no lock of the server is ever held across a suspension
//! point — by construction, not by review — and a task holding one cannot be parked
//! while another CPU spins for it. Critical sections are a few map operations or
//! counter updates; nothing in them allocates much, does I/O or wakes a task (wakers are
//! taken out and woken after the closure returns).
//!
//! Where two locks nest, the outer one is named in the inner one's documentation; the
//! orders are listed in [`crate::server`]'s module documentation.

use core::fmt;

/// A `T` shared between CPUs, reached through [`Locked::with`].
pub struct Locked<T>(spin::Mutex<T>);

impl<T> Locked<T> {
    /// `value`, behind a lock.
    pub const fn new(value: T) -> Self {
        Locked(spin::Mutex::new(value))
    }

    /// Runs `f` with the value locked.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock())
    }

    /// The value, without locking: the caller owns it (teardown).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }
}

impl<T: Default> Default for Locked<T> {
    fn default() -> Self {
        Locked::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for Locked<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `try_lock`: formatting must not spin on (or deadlock with) a holder.
        match self.0.try_lock() {
            Some(value) => fmt::Debug::fmt(&*value, f),
            None => f.write_str("<locked>"),
        }
    }
}

/// A wake-up that tasks on any CPU or thread can wait for: [`Signal::signal`] sets it and
/// wakes every waiter; a wait completes once it is set, and clears it. A signal sent
/// while nobody waits is kept (level-triggered), so a waiter that checks its condition,
/// then waits, misses nothing that happened in between.
#[derive(Debug, Default)]
pub struct Signal(Locked<SignalState>);

#[derive(Debug, Default)]
struct SignalState {
    set: bool,
    waiters: alloc::vec::Vec<core::task::Waker>,
}

impl Signal {
    /// A signal not set.
    pub const fn new() -> Self {
        Signal(Locked::new(SignalState {
            set: false,
            waiters: alloc::vec::Vec::new(),
        }))
    }

    /// Sets the signal and wakes every waiter (after the lock is released).
    pub fn signal(&self) {
        let waiters = self.0.with(|s| {
            s.set = true;
            core::mem::take(&mut s.waiters)
        });
        for w in waiters {
            w.wake();
        }
    }

    /// Clears the signal; whether it was set.
    pub fn take(&self) -> bool {
        self.0.with(|s| core::mem::replace(&mut s.set, false))
    }

    /// Ready (and clears the signal) if it is set, else registers `cx`'s waker.
    pub fn poll_wait(&self, cx: &mut core::task::Context<'_>) -> core::task::Poll<()> {
        self.0.with(|s| {
            if core::mem::replace(&mut s.set, false) {
                return core::task::Poll::Ready(());
            }
            if !s.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                s.waiters.push(cx.waker().clone());
            }
            core::task::Poll::Pending
        })
    }

    /// Completes once the signal is set (clearing it).
    pub async fn wait(&self) {
        core::future::poll_fn(|cx| self.poll_wait(cx)).await
    }
}
