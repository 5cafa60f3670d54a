//! When a wake from another CPU needs an interrupt: only if the executor's CPU is halted,
//! or about to halt.
//!
//! A CPU running its executor sees new work in its ready queue by itself at the next pass
//! of its run loop; an IPI would only cost it an interrupt (and the sender a trapped
//! write of the interrupt command register, under virtualisation). A CPU in `sti; hlt`
//! needs one. The two sides follow a store-fence-load handshake, so one of them always
//! sees the other:
//!
//! | the executor's CPU, before halting | a waker on another CPU |
//! |---|---|
//! | interrupts off; [`HaltGate::halting`]: publish "halting", full fence | push the task into the ready queue |
//! | look at the ready queue: work there? then run it instead | [`HaltGate::must_interrupt`]: full fence, read "halting" |
//! | `sti; hlt`; [`HaltGate::running`] once woken | halting? send the IPI |
//!
//! If the waker reads "not halting", its fence came before the executor's, so the
//! executor's look at the queue sees the task and it does not halt. If it reads
//! "halting", it interrupts; an IPI that arrives while the executor still has interrupts
//! off stays pending and ends the `hlt` at once. No wake is lost, and a CPU that is
//! running is never interrupted.

use core::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

/// How wakes from other CPUs reached one executor, since boot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WakeStats {
    /// Wake-up IPIs sent to it (it was halted, or about to halt).
    pub ipis: u64,
    /// Wakes that needed none (it was running and would see the work itself).
    pub ipis_skipped: u64,
}

/// Whether one executor's CPU is halted (or about to halt), and the count of the
/// decisions taken on it. See the module documentation.
#[derive(Debug, Default)]
pub struct HaltGate {
    halting: AtomicBool,
    ipis: AtomicU64,
    skipped: AtomicU64,
}

impl HaltGate {
    /// A gate of a running executor.
    pub const fn new() -> HaltGate {
        HaltGate {
            halting: AtomicBool::new(false),
            ipis: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// The executor's CPU is about to halt: call with interrupts off, then look at the
    /// ready queue a last time (and halt only if it is empty).
    pub fn halting(&self) {
        self.halting.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The executor's CPU runs again (it did not halt, or was woken).
    pub fn running(&self) {
        self.halting.store(false, Ordering::Relaxed);
    }

    /// After a task was queued on this executor from another CPU: whether its CPU must
    /// be interrupted. Counted either way. Only the first waker of a halt interrupts it:
    /// it takes the flag, and wakers after it find the CPU already being woken (it
    /// looks at its queue after waking, and again before it halts next).
    pub fn must_interrupt(&self) -> bool {
        fence(Ordering::SeqCst);
        let halting =
            self.halting.load(Ordering::Relaxed) && self.halting.swap(false, Ordering::Relaxed);
        let counter = if halting { &self.ipis } else { &self.skipped };
        counter.fetch_add(1, Ordering::Relaxed);
        halting
    }

    /// The counts so far.
    pub fn stats(&self) -> WakeStats {
        WakeStats {
            ipis: self.ipis.load(Ordering::Relaxed),
            ipis_skipped: self.skipped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    #[test]
    fn only_a_halting_cpu_is_interrupted_and_both_answers_count() {
        let gate = HaltGate::new();
        assert!(!gate.must_interrupt());
        gate.halting();
        assert!(gate.must_interrupt());
        assert!(!gate.must_interrupt(), "one interrupt wakes it");
        gate.running();
        assert!(!gate.must_interrupt());
        gate.halting();
        assert!(gate.must_interrupt());
        assert_eq!(
            gate.stats(),
            WakeStats {
                ipis: 2,
                ipis_skipped: 3
            }
        );
    }

    /// A CPU that halts whenever its queue looks empty and wakers on other threads that
    /// interrupt it only when the gate says so: every item is taken, and a halt that no
    /// interrupt ends (a lost wake) fails the test.
    #[test]
    fn no_wake_is_lost_between_the_last_look_and_the_halt() {
        const WAKERS: usize = 3;
        const ITEMS: usize = 20_000;
        let gate = Arc::new(HaltGate::new());
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        // The pending interrupt of the halted CPU.
        let ipi = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let cpu = {
            let (gate, queue, ipi) = (gate.clone(), queue.clone(), ipi.clone());
            std::thread::spawn(move || {
                let mut taken = 0;
                loop {
                    while queue.lock().unwrap().pop_front().is_some() {
                        taken += 1;
                    }
                    if taken == WAKERS * ITEMS {
                        break;
                    }
                    gate.halting();
                    if !queue.lock().unwrap().is_empty() {
                        gate.running();
                        continue;
                    }
                    // `hlt` until the interrupt (one sent before is still pending).
                    let (pending, woken) = &*ipi;
                    let mut p = pending.lock().unwrap();
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !*p {
                        let left = deadline.saturating_duration_since(Instant::now());
                        assert!(!left.is_zero(), "halted with work queued: a lost wake");
                        p = woken.wait_timeout(p, left).unwrap().0;
                    }
                    *p = false;
                    drop(p);
                    gate.running();
                }
            })
        };
        let wakers: std::vec::Vec<_> = (0..WAKERS)
            .map(|w| {
                let (gate, queue, ipi) = (gate.clone(), queue.clone(), ipi.clone());
                std::thread::spawn(move || {
                    for i in 0..ITEMS {
                        queue.lock().unwrap().push_back((w, i));
                        if gate.must_interrupt() {
                            *ipi.0.lock().unwrap() = true;
                            ipi.1.notify_one();
                        }
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for w in wakers {
            w.join().unwrap();
        }
        cpu.join().unwrap();
        let s = gate.stats();
        assert_eq!(s.ipis + s.ipis_skipped, (WAKERS * ITEMS) as u64);
    }
}
