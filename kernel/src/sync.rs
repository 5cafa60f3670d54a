//! Locks that interrupt handlers may also take, correct on several CPUs.
//!
//! [`IrqLock`] is a spin lock that also disables interrupts on the CPU holding it: another
//! CPU waits for the lock by spinning, and an interrupt handler on the holding CPU can never
//! find the lock taken by the code it interrupted (which would spin forever). The previous
//! interrupt state is restored on release, so locks nest. Keep the closures short:
//! interrupts stay off and other CPUs spin while they run.
//!
//! Taking a lock the same CPU already holds is a bug (it would spin forever); the lock
//! records its holder and panics instead, naming the lock's type.
//!
//! Lock order, outermost first, where locks nest: executor state, then a ready queue; an
//! interrupt vector's handler, or a block device queue's state (its completions wake
//! requests, its streams go back to their DMA device), then a ready queue or a DMA
//! device's counters; the frame allocator and the page tables are leaves, as are the
//! heap and the console (nothing is taken while holding them). See docs/kernel.md,
//! "CPUs".

use core::sync::atomic::{AtomicUsize, Ordering};

/// A value shared between CPUs and between task context and interrupt handlers.
#[derive(Debug)]
pub struct IrqLock<T> {
    inner: spin::Mutex<T>,
    /// The holding CPU's index plus one; 0 while free. Only for catching re-entrancy.
    holder: AtomicUsize,
}

impl<T> IrqLock<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        IrqLock {
            inner: spin::Mutex::new(value),
            holder: AtomicUsize::new(0),
        }
    }

    /// Runs `f` with exclusive access to the value, interrupts disabled on this CPU.
    ///
    /// # Panics
    /// If this CPU already holds the lock (called again from inside `f`, or from an
    /// interrupt handler that interrupted a holder that left interrupts on: neither can
    /// happen through this API except by a re-entrancy bug).
    pub fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let restore = irq::save_and_disable();
        let me = irq::cpu() + 1;
        assert!(
            self.holder.load(Ordering::Relaxed) != me,
            "IrqLock<{}> taken again by the CPU holding it",
            core::any::type_name::<T>()
        );
        let mut guard = self.inner.lock();
        self.holder.store(me, Ordering::Relaxed);
        let result = f(&mut guard);
        self.holder.store(0, Ordering::Relaxed);
        drop(guard);
        irq::restore(restore);
        result
    }
}

/// The CPU's interrupt flag and index, or their stand-ins on the host (tests).
#[cfg(target_os = "none")]
mod irq {
    use crate::hal::{cpu, percpu};

    pub use cpu::{restore_interrupts as restore, save_and_disable_interrupts as save_and_disable};

    pub fn cpu() -> usize {
        percpu::index()
    }
}

#[cfg(not(target_os = "none"))]
mod irq {
    extern crate std;

    use core::sync::atomic::{AtomicUsize, Ordering};

    pub fn save_and_disable() -> bool {
        false
    }

    pub fn restore(_was_enabled: bool) {}

    /// Host threads stand in for CPUs: each gets its own index.
    pub fn cpu() -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        std::thread_local! {
            static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        INDEX.with(|i| *i)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::sync::Arc;

    #[test]
    fn lock_gives_exclusive_access() {
        let l = IrqLock::new(1);
        l.lock(|v| *v += 1);
        assert_eq!(l.lock(|v| *v), 2);
    }

    #[test]
    fn lock_is_exclusive_across_threads() {
        let l = Arc::new(IrqLock::new(0u64));
        let threads: std::vec::Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        l.lock(|v| *v += 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(l.lock(|v| *v), 40_000);
    }

    #[test]
    #[should_panic(expected = "taken again by the CPU holding it")]
    fn taking_a_held_lock_again_panics() {
        let l = IrqLock::new(0);
        l.lock(|_| l.lock(|_| ()));
    }
}
