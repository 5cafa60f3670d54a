//! Counters of a mounted filesystem, per cause where there is one (as bcachefs keeps
//! them), so policies can be compared by what they cost.

use super::synclog::LogStats;
use crate::btree::NodeWriteCounters;

/// Filesystem counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    /// Transactions committed.
    pub commits: u64,
    /// Checkpoints committed, indexed like [`super::CheckpointCause::ALL`].
    pub checkpoints: [u64; super::CheckpointCause::ALL.len()],
    /// Node writes and bytes per cause.
    pub node_writes: NodeWriteCounters,
    /// Bitmap group blocks written.
    pub group_writes: u64,
    /// Superblock writes.
    pub superblock_writes: u64,
    /// Device flushes issued.
    pub flushes: u64,
    /// Btree nodes read from the device.
    pub node_loads: u64,
    /// Bytes of btree nodes read.
    pub node_load_bytes: u64,
    /// Bitmap groups read.
    pub group_loads: u64,
    /// Data bytes written to the device.
    pub data_bytes_written: u64,
    /// Data bytes read from the device.
    pub data_bytes_read: u64,
    /// Nodes evicted from the cache.
    pub evictions: u64,
    /// Checksum or decoding failures seen (each also logged).
    pub corruptions: u64,
    /// `link`, `mkdir` and directory `rename` refused with `EMLINK` at the link limit.
    pub link_limit_hits: u64,
    /// The fsync log.
    pub log: LogStats,
}

impl FsStats {
    /// Total checkpoints.
    pub fn total_checkpoints(&self) -> u64 {
        self.checkpoints.iter().sum()
    }
}
