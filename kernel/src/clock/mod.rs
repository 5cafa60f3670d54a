//! The monotonic clock: the TSC, calibrated against the PIT at boot.
//!
//! [`now`] is `(rdtsc() - tsc_at_calibration) * ns_per_tick`, in fixed point. Before
//! calibration it reads zero. The HPET ([`hpet`]), when present, is an independent
//! reference the self-test compares against.

pub mod hpet;
pub mod pit;

use core::time::Duration;

use crate::hal::cpu;
use crate::time::Instant;

struct Calibration {
    tsc0: u64,
    /// Nanoseconds per TSC tick, as a 32.32 fixed-point number.
    ns_per_tick: u64,
    hz: u64,
}

static CALIBRATION: spin::Once<Calibration> = spin::Once::new();

/// Measurements taken; the median is used.
const ROUNDS: usize = 5;

/// Calibrates the TSC against PIT channel 2 (10 ms gates) and starts the clock.
/// Returns the TSC frequency in Hz.
pub fn init() -> u64 {
    let mut hz = [0u64; ROUNDS];
    for h in &mut hz {
        let (ticks, window) = pit::measure_tsc(10);
        *h = (u128::from(ticks) * 1_000_000_000 / window.as_nanos()) as u64;
    }
    hz.sort_unstable();
    let hz = hz[ROUNDS / 2].max(1);
    CALIBRATION.call_once(|| Calibration {
        tsc0: cpu::rdtsc(),
        ns_per_tick: ((1_000_000_000u128 << 32) / u128::from(hz)) as u64,
        hz,
    });
    hz
}

/// The current time (zero before [`init`]).
pub fn now() -> Instant {
    match CALIBRATION.get() {
        None => Instant::ZERO,
        Some(c) => {
            let ticks = cpu::rdtsc().wrapping_sub(c.tsc0);
            Instant::from_nanos(((u128::from(ticks) * u128::from(c.ns_per_tick)) >> 32) as u64)
        }
    }
}

/// The TSC frequency in Hz (0 before [`init`]).
pub fn tsc_hz() -> u64 {
    CALIBRATION.get().map_or(0, |c| c.hz)
}

/// Time since boot as a `Duration`.
pub fn uptime() -> Duration {
    Duration::from_nanos(now().as_nanos())
}

/// Spins for `d` (boot-time use only; tasks sleep instead).
pub fn spin_for(d: Duration) {
    let end = now() + d;
    while now() < end {
        core::hint::spin_loop();
    }
}
