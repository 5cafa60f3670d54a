//! The monotonic clock: the TSC, calibrated against the PIT at boot.
//!
//! [`now`] is `(rdtsc() - offset - tsc_at_calibration) * ns_per_tick`, in fixed point,
//! where `offset` is the running CPU's TSC offset from the boot CPU's: zero unless the
//! check at its bring-up ([`skew`]) found a real one, which [`set_tsc_offset`] then
//! corrects. Before calibration it reads zero. The HPET ([`hpet`]), when present, is an
//! independent reference the self-test compares against.

pub mod skew;

#[cfg(target_os = "none")]
pub mod hpet;
#[cfg(target_os = "none")]
pub mod pit;
#[cfg(target_os = "none")]
pub mod rtc;
#[cfg(target_os = "none")]
mod tsc;

#[cfg(target_os = "none")]
pub use tsc::{init, now, ns_per_tick, set_tsc_offset, spin_for, tsc_hz, uptime};
