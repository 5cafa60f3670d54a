//! Crash simulation: [`enumerate`] turns a base image and a [`Recording`](block::Recording)
//! (from a `block::RecordingDisk`) into the crash states a power
//! failure could leave ([`CrashState`]: a [`CrashDisk`] overlay and a printable
//! [`CrashDesc`]). With the `testing` feature, [`contract`] decides whether what a
//! filesystem recovers from such a state is allowed by the crash contract, and [`suite`]
//! is the crash suite of the real filesystem (workloads, the runner).
//!
//! Everything here is `no_std + alloc` except [`contract`].

pub mod contract;
mod crash;
mod overlay;
pub mod suite;

pub use crash::{enumerate, summary, CrashDesc, CrashParams, CrashState, CrashStates, Torn};
pub use overlay::{BlockRef, CrashDisk, Layer};
