//! The btree: log-structured nodes (several sorted key sets each), cached in memory with
//! a bounded cache, written only by checkpoints.

pub mod cache;
pub mod node;
pub mod tree;
pub mod write;

pub use cache::NodeCache;
pub use node::Node;
pub use tree::{Need, Trees};
pub use write::{NodeWrite, NodeWriteCounters, WriteCause};
