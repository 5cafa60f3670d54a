//! The ninefold filesystem.
//!
//! `no_std + alloc`: the same code runs inside the appliance (over the kernel's NVMe and
//! virtio-blk drivers) and on the host (over files and memory, for tests and tools).
//!
//! Boundaries:
//! - [`block`] (the `ninefold-block` crate) is the block-device interface this crate
//!   consumes; the kernel's drivers and the host's file/memory devices implement it.
//! - [`vfs`] (the `ninefold-vfs` crate) is the filesystem interface this crate provides;
//!   the 9P server consumes it.
//! - [`format`] is the on-disk format (pure encode/decode), shared by the filesystem,
//!   the checker (`ninefold-fsck`) and the tools.
//!
//! The test kit (the reference model, the harness, the crash simulator) is the
//! `ninefold-testkit` crate; the offline checker and inspector the `ninefold-fsck` crate.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod btree;
pub mod cache;
pub mod core;
pub mod engine;
pub mod features;
pub mod format;
pub mod io;
pub mod space;
pub mod surface;
pub mod synclog;
pub mod util;
pub mod volume;
