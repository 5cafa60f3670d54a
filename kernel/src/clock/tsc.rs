//! The TSC as the clock: calibration, and each CPU's offset from the boot CPU's.

use core::sync::atomic::{AtomicI64, Ordering};
use core::time::Duration;

use crate::hal::cpu;
use crate::hal::percpu::{self, MAX_CPUS};
use crate::time::Instant;

use super::pit;

struct Calibration {
    tsc0: u64,
    /// Nanoseconds per TSC tick, as a 32.32 fixed-point number.
    ns_per_tick: u64,
    hz: u64,
}

static CALIBRATION: spin::Once<Calibration> = spin::Once::new();

/// Each CPU's TSC minus the boot CPU's, in ticks, where the check at its bring-up found
/// a real offset (`clock::skew`); zero elsewhere.
static TSC_OFFSET: [AtomicI64; MAX_CPUS] = [const { AtomicI64::new(0) }; MAX_CPUS];

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

/// The current time (zero before [`init`]), the same on every CPU.
pub fn now() -> Instant {
    match CALIBRATION.get() {
        None => Instant::ZERO,
        Some(c) => {
            let offset = TSC_OFFSET[percpu::index()].load(Ordering::Relaxed);
            let ticks = cpu::rdtsc()
                .wrapping_sub(offset as u64)
                .wrapping_sub(c.tsc0);
            Instant::from_nanos(((u128::from(ticks) * u128::from(c.ns_per_tick)) >> 32) as u64)
        }
    }
}

/// Corrects CPU `cpu`'s clock for a TSC running `ticks` ahead of the boot CPU's (before
/// that CPU reads the clock).
pub fn set_tsc_offset(cpu: usize, ticks: i64) {
    TSC_OFFSET[cpu].store(ticks, Ordering::Relaxed);
}

/// The TSC frequency in Hz (0 before [`init`]).
pub fn tsc_hz() -> u64 {
    CALIBRATION.get().map_or(0, |c| c.hz)
}

/// Nanoseconds per TSC tick as a 32.32 fixed-point number (0 before [`init`]).
pub fn ns_per_tick() -> u64 {
    CALIBRATION.get().map_or(0, |c| c.ns_per_tick)
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
