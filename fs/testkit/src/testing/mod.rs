//! The shared test kit (feature `testing`): everything a test needs to compare a
//! [`FileSystem`](vfs::FileSystem) with the reference model.
//!
//! - [`Op`]: every trait operation with concrete arguments over a small namespace, plus
//!   durability ops and an [`Op::Remount`] marker; [`strategy`] generates sequences.
//! - [`apply`]: runs an op on any filesystem and returns a comparable [`OpOutcome`].
//! - [`VisibleState`]: the canonical tree a client can observe, and its diff.
//! - [`run_against_model`] / [`DualRunner`]: the model and a filesystem under test in
//!   lockstep, comparing outcomes op by op and visible states.
//! - [`Subtree`]: one directory of a filesystem as a filesystem of its own, so several
//!   sequences (threads) share one filesystem, each compared with its own model.
//!
//! The futures are not `Send`; everything runs on `pollster`.
//!
//! What is compared, and why, is written down in `docs/testing.md`.

mod apply;
mod harness;
mod op;
mod state;
pub mod strategy;
mod subtree;

use alloc::sync::Arc;

pub use apply::{apply, apply_blocking, resolve, Applied, AttrView, Handles, OpOutcome};
pub use harness::{op_time, run_against_model, CompareOptions, DualRunner, Mismatch, StepRecord};
pub use op::{format_ops, pattern, Name, Op, Path, Target, XName, NAMES, TEST_OWNER, XATTR_NAMES};
pub use state::{show_path, Content, Node, VisibleState, DIGEST_BLOCK};
pub use subtree::Subtree;

use vfs::{Clock, Timespec};

/// A clock the test sets by hand, shared by every clone (the harness gives one to both
/// filesystems, so their timestamps are comparable).
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<spin::Mutex<Timespec>>);

impl ManualClock {
    /// A clock showing `now`.
    pub fn new(now: Timespec) -> ManualClock {
        ManualClock(Arc::new(spin::Mutex::new(now)))
    }

    /// Sets the time every clone shows.
    pub fn set(&self, now: Timespec) {
        *self.0.lock() = now;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timespec {
        *self.0.lock()
    }
}
