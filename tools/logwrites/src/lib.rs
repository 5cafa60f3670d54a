//! Block traces in the dm-log-writes format, as QEMU's `blklogwrites` block driver
//! records them: every write, FLUSH, FUA write and discard the guest's disk completed, in
//! completion order, with the written data.
//!
//! - [`format`]: the on-disk layouts (super entry, entry header, flags).
//! - [`Trace`]: a parsed log ([`Trace::parse`]), its [`Entry`]s and their data.
//! - [`replay`]: a trace applied to a base image (up to an entry, or up to the last
//!   completed FLUSH: what a power cut leaves on a disk without volatile-cache losses),
//!   and a trace as a [`block::Recording`], so the crash-state enumeration of the
//!   filesystem's crash simulator (`testkit::sim::enumerate`) applies to it unchanged.
//! - [`acks`]: the client's side of a recording: what each path held when, and which
//!   syncs were acknowledged when, measured in log bytes; and the check of a recovered
//!   path against it.
//! - [`LogBuilder`]: writes logs in the same format (hand-built logs for tests), and
//!   [`LogWritesDisk`], block middleware that logs like `blklogwrites` (host tests).
//!
//! The layout follows QEMU's `block/blklogwrites.c`, which differs from the kernel's
//! dm-log-writes in one respect that matters: QEMU counts `sector` and `nr_sectors` in
//! units of the log's sector size (`log-sector-size=`), the kernel always in 512-byte
//! sectors. Both put one entry header per log sector, followed by the data padded to
//! whole log sectors, and both rewrite the super entry (its `nr_entries`) only when a
//! FLUSH completes, so the entries after the last FLUSH are found by reading on until the
//! log ends ([`Trace::parse`] does).

#![forbid(unsafe_code)]

pub mod acks;
mod builder;
mod disk;
pub mod format;
pub mod replay;
mod trace;

pub use builder::LogBuilder;
pub use disk::LogWritesDisk;
pub use trace::{Entry, EntryKind, ParseError, Trace};
