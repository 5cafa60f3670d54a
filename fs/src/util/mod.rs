//! Small helpers shared by the on-disk format and the filesystem: checksums, keyed
//! hashes, little-endian byte cursors, range sets, fixed-capacity encode buffers and
//! the production checks' [`check::Violation`].

#[cfg(feature = "serde")]
pub(crate) mod by_name;
pub mod bytes;
pub mod check;
pub mod crc;
pub mod hash;
pub mod ranges;
pub mod scratch;
