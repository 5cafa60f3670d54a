//! The transaction core: the state behind the one lock ([`txn::Core`]: trees, allocator,
//! inodes), and the operations on it — inodes, directories, file data, xattrs — with
//! the checkpoint that makes them durable, the checks every commit passes, and mkfs.

pub mod checkpoint;
pub(crate) mod checks;
pub mod counters;
pub(crate) mod dir;
pub(crate) mod file;
pub(crate) mod inode;
pub(crate) mod lock;
pub(crate) mod mkfs;
pub mod track;
pub mod txn;
pub(crate) mod xattr;
