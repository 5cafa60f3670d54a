//! The ninefold filesystem.
//!
//! `no_std + alloc`: the same code runs inside the appliance (over the kernel's NVMe and
//! virtio-blk drivers) and on the host (over files and memory, for tests and tools).
//!
//! Boundaries:
//! - [`block`] is the block-device interface this crate consumes; the kernel's drivers and
//!   the host's file/memory devices implement it.
//! - [`vfs`] is the filesystem interface this crate provides; the 9P server consumes it.
//! - [`format`] is the on-disk format (pure encode/decode), shared by the filesystem,
//!   `fsck` and the tools.
//! - [`model`] is the reference model of [`vfs::FileSystem`] the tests compare against;
//!   `sim` holds block-device middleware and crash-state enumeration; `testing` (behind
//!   the `testing` feature) is the shared test kit.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod block;
pub mod btree;
pub mod format;
pub mod fsck;
pub mod inspect;
pub mod io;
pub mod model;
pub mod sim;
pub mod space;
#[cfg(feature = "testing")]
pub mod testing;
pub mod util;
pub mod vfs;
pub mod volume;
