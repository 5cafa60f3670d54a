//! Snapshot streams: the difference of two trees, send, receive, and the jobs of the
//! administration tree that run them.

pub mod jobs;
pub mod receive;
pub mod send;
pub mod treediff;
