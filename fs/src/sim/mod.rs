//! Simulation for storage tests: block-device middleware and crash-state enumeration.
//!
//! In the spirit of smoltcp's `phy` middleware, each device here is a
//! [`BlockDevice`](crate::block::BlockDevice) wrapping another, so they stack:
//! `TraceDisk<FaultDisk<RecordingDisk<MemDisk>>>`.
//! - [`RecordingDisk`] records writes, FLUSHes and discards with issue and completion
//!   times, and counts them.
//! - [`FaultDisk`] fails requests or flips bits by rule.
//! - [`CountingDisk`] only counts (for benchmarks).
//! - [`TraceDisk`] logs requests through `log`.
//! - [`YieldDisk`] makes every request yield once, so joined futures overlap.
//!
//! [`enumerate`] turns a base image and a [`Recording`] into the crash states a power
//! failure could leave ([`CrashState`]: a [`CrashDisk`] overlay and a printable
//! [`CrashDesc`]). With the `testing` feature, [`contract`] decides whether what a
//! filesystem recovers from such a state is allowed by the crash contract, and [`suite`]
//! is the crash suite of the real filesystem (workloads, the runner).
//!
//! Everything here is `no_std + alloc` except [`contract`].

#[cfg(feature = "testing")]
pub mod contract;
mod counting;
mod crash;
mod fault;
mod overlay;
mod recording;
#[cfg(feature = "testing")]
pub mod suite;
mod trace;
mod yielding;

pub use counting::CountingDisk;
pub use crash::{enumerate, summary, CrashDesc, CrashParams, CrashState, CrashStates, Torn};
pub use fault::{Fault, FaultCounters, FaultDisk};
pub use overlay::{BlockRef, CrashDisk, Layer};
pub use recording::{Counters, Recorder, Recording, RecordingDisk, Request, RequestKind};
pub use trace::TraceDisk;
pub use yielding::YieldDisk;
