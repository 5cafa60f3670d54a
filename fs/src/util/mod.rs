//! Small helpers shared by the on-disk format and the filesystem: checksums, keyed
//! hashes, little-endian byte cursors, range sets and fixed-capacity encode buffers.

pub mod bytes;
pub mod crc;
pub mod hash;
pub mod ranges;
pub mod scratch;
