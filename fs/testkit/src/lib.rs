//! ninefold's test kit: the reference model of the filesystem interface, the shared
//! operations, strategies and harness that compare a filesystem with it, and the crash
//! simulator (crash-state enumeration, the crash contract, the crash suite of the real
//! filesystem).
//!
//! - [`model`]: `ModelFs`, the oracle: a small, obviously-correct, in-memory
//!   [`vfs::FileSystem`]. Never part of the appliance.
//! - [`testing`]: ops, proptest strategies, `apply`, `VisibleState`, the model harness.
//! - [`sim`]: crash states from a `block::Recording`, the contract checker, the suite.
//!
//! A dev-only crate: the filesystem's, the 9P server's and the tools' tests use it, and
//! so do the host tools that run the crash suite (`ninefold-crash`) or serve the model
//! (`ninefold serve --model`); the appliance never links it. The futures are not `Send`;
//! everything runs on `pollster`. What is compared, and why: `docs/testing.md`.
#![forbid(unsafe_code)]

extern crate alloc;

pub mod model;
pub mod sim;
pub mod testing;
