//! The TSC check at an application processor's bring-up (the arithmetic and why:
//! `clock::skew`): right after the new CPU reports online, it and CPU 0 exchange TSC
//! readings through [`TURN`] and [`ECHO`], CPU 0 works out the offset, corrects the new
//! CPU's clock if the offset is real, and lets it go on.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use core::time::Duration;

use crate::clock::{self, skew::RoundTrip, skew::Skew};
use crate::hal::cpu;

/// Exchanges per check: the interval narrows with each. On hardware one takes well under
/// a microsecond; under TCG on a busy host a vCPU may wait for a host core for
/// milliseconds, so the check stays short.
const EXCHANGES: u32 = 4;
/// How long either side waits for the other's turn before giving up on the check
/// (generous, as for a CPU coming online: a vCPU may wait long for a busy host's core).
const TURN_TIMEOUT: Duration = Duration::from_secs(1);

/// Whose turn it is: `2k + 1` the new CPU's in exchange `k`, `2k + 2` CPU 0's again,
/// [`DONE`] when the check is over (its correction set). Zero before a check.
static TURN: AtomicU32 = AtomicU32::new(0);
/// The new CPU's TSC, read in its turn.
static ECHO: AtomicU64 = AtomicU64::new(0);
const DONE: u32 = u32::MAX;

/// Spins until `ready`, or [`TURN_TIMEOUT`]; whether it became ready.
fn wait_for(ready: impl Fn() -> bool) -> bool {
    let until = clock::uptime() + TURN_TIMEOUT;
    while !ready() {
        if clock::uptime() > until {
            return false;
        }
        core::hint::spin_loop();
    }
    true
}

/// Before starting a CPU: a new check.
pub fn prepare() {
    TURN.store(0, Ordering::SeqCst);
}

/// CPU 0's side of the check with CPU `cpu`, which has just come online: the exchanges,
/// then the correction of its clock (`clock::set_tsc_offset`) if the offset is real.
/// Returns what the exchanges showed (`None` if the CPU did not answer).
pub fn measure(cpu_index: usize) -> Option<Skew> {
    let mut trips = Vec::with_capacity(EXCHANGES as usize);
    for k in 0..EXCHANGES {
        let sent = cpu::rdtsc_ordered();
        TURN.store(2 * k + 1, Ordering::SeqCst);
        if !wait_for(|| TURN.load(Ordering::SeqCst) == 2 * k + 2) {
            break;
        }
        let back = cpu::rdtsc_ordered();
        let echo = ECHO.load(Ordering::SeqCst);
        trips.push(RoundTrip { sent, echo, back });
    }
    let skew = Skew::measure(&trips);
    if let Some(s) = &skew {
        clock::set_tsc_offset(cpu_index, s.correction());
    }
    TURN.store(DONE, Ordering::SeqCst);
    skew
}

/// The new CPU's side: answers each exchange with its TSC, then waits for CPU 0 to have
/// set its correction (it reads the clock only after that).
pub fn answer() {
    for k in 0..EXCHANGES {
        let mine = || matches!(TURN.load(Ordering::SeqCst), t if t == 2 * k + 1 || t == DONE);
        if !wait_for(mine) || TURN.load(Ordering::SeqCst) == DONE {
            break;
        }
        ECHO.store(cpu::rdtsc_ordered(), Ordering::SeqCst);
        // Unless CPU 0 gave up meanwhile (its DONE stays).
        let _ = TURN.compare_exchange(2 * k + 1, 2 * k + 2, Ordering::SeqCst, Ordering::SeqCst);
    }
    wait_for(|| TURN.load(Ordering::SeqCst) == DONE);
}
