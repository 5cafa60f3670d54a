//! The operator's surface: the administration tree (control), the counters report, and
//! the filesystem interface (vfs) the 9P server consumes.

pub mod control;
pub(crate) mod ops;
pub mod report;
