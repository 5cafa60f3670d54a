//! Features: siblings over the transaction core and the log.

pub(crate) mod grow;
pub mod quota;
pub mod redundancy;
pub mod snapshots;
pub mod streams;
