//! Locks that interrupt handlers may also take.
//!
//! [`IrqLock`] runs its closure inside a critical section (`critical-section` crate): on
//! the appliance that disables interrupts on this CPU for the duration (see
//! `hal::cpu`), so an interrupt handler can never find the lock held by the code it
//! interrupted. On the host (tests) the crate's `std` implementation is a global mutex.
//! Keep the closures short: interrupts stay off while they run.

use core::cell::RefCell;

/// A value shared between task context and interrupt handlers.
#[derive(Debug)]
pub struct IrqLock<T> {
    inner: critical_section::Mutex<RefCell<T>>,
}

impl<T> IrqLock<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        IrqLock {
            inner: critical_section::Mutex::new(RefCell::new(value)),
        }
    }

    /// Runs `f` with exclusive access to the value, interrupts disabled.
    ///
    /// # Panics
    /// If called again from inside `f` for the same lock (a re-entrancy bug).
    pub fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        critical_section::with(|cs| f(&mut self.inner.borrow_ref_mut(cs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_gives_exclusive_access() {
        let l = IrqLock::new(1);
        l.lock(|v| *v += 1);
        assert_eq!(l.lock(|v| *v), 2);
    }
}
