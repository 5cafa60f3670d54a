//! Counters of a mounted filesystem, per cause where there is one (as bcachefs keeps
//! them), so policies can be compared by what they cost.
//!
//! With the `serde` feature they serialise as the appliance reports them: per-cause
//! arrays as maps from the cause's name (`checkpoints: {"sync": 3, ...}`), node writes
//! as `node_writes: {cause: {writes, bytes}}` with `node_appends`/`node_rewrites` beside.

use crate::btree::NodeWriteCounters;
use crate::synclog::LogStats;

/// Filesystem counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FsStats {
    /// Transactions committed.
    pub commits: u64,
    /// Checkpoints committed, indexed like [`crate::volume::CheckpointCause::ALL`].
    #[cfg_attr(feature = "serde", serde(serialize_with = "by_cause::checkpoints"))]
    pub checkpoints: [u64; crate::volume::CheckpointCause::ALL.len()],
    /// Node writes and bytes per cause.
    #[cfg_attr(feature = "serde", serde(flatten))]
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
    /// Writes, clones and creates refused with `EDQUOT` at a project's limit.
    pub quota_exceeded: u64,
    /// Discard requests sent to the device for freed blocks.
    pub discards: u64,
    /// Blocks discarded.
    pub discarded_blocks: u64,
    /// Discards the device failed (the blocks are free all the same; logged).
    pub discard_errors: u64,
    /// Times the filesystem grew to a larger device.
    pub grows: u64,
    /// Blocks added by growth.
    pub grown_blocks: u64,
    /// Replacements of a mirrored volume's leg started (`replace`).
    pub rebuild_starts: u64,
    /// Rebuilds completed: the replaced leg in service.
    pub rebuilds: u64,
    /// Rebuilds ended by the new leg failing.
    pub rebuild_failures: u64,
    /// Blocks copied to a leg being rebuilt.
    pub rebuild_blocks: u64,
    /// Copies done again, or put off, because a write over the same blocks was in
    /// flight or started meanwhile.
    pub rebuild_retries: u64,
    /// Blocks copied although they failed their checksum (or a read) on every leg in
    /// service (each also logged).
    pub rebuild_unverified: u64,
    /// 1 while a leg is being rebuilt.
    pub rebuild_running: u64,
    /// Where the rebuild's copy is (a block number; of `rebuild_total`).
    pub rebuild_cursor: u64,
    /// Blocks of the filesystem, the rebuild cursor's end.
    pub rebuild_total: u64,
    /// Scrub passes completed.
    pub scrub_runs: u64,
    /// Bytes of nodes and data read and verified by scrub.
    pub scrub_bytes: u64,
    /// Blocks scrub found failing their checksum or unreadable (each also logged).
    pub scrub_errors: u64,
    /// 1 while a scrub pass is running, else 0.
    pub scrub_running: u64,
    /// 1 once a failed write or FLUSH, or a commit that failed its checks, made the
    /// filesystem refuse every request with `EIO` (logged when it happens;
    /// docs/durability.md, "Device errors" and "Broken invariants"), else 0.
    pub failed: u64,
    /// Devices of a mirrored volume (a gauge; 0 on a single device).
    pub legs: u64,
    /// Devices of a mirrored volume out of service: failed, missing or stale (a gauge;
    /// the volume serves from the others). Per-leg errors and repairs are the mirror's.
    pub failed_legs: u64,
    /// Snapshots taken.
    pub snapshots_created: u64,
    /// Snapshots deleted.
    pub snapshots_deleted: u64,
    /// Snapshot creations refused with `ENOSPC` at the snapshot limit.
    pub snapshot_limit_hits: u64,
    /// Snapshots that exist (a gauge).
    pub snapshots: u64,
    /// Snapshot views closed to open another (at most `snapshot::MAX_OPEN_VIEWS` are
    /// open; a closed one is opened again, with a cold cache, when next read).
    pub snapshot_views_closed: u64,
    /// Blocks snapshots hold that the live filesystem no longer references, as far as
    /// this mount has seen (a gauge: the space snapshots pin).
    pub snapshot_held_blocks: u64,
    /// Use of the one lock around the filesystem's state.
    pub core_lock: LockStats,
    /// The fsync log.
    pub log: LogStats,
}

/// How the one lock around the filesystem's state (`Core`) is used: every operation
/// takes it, so these say whether it is what limits the CPUs serving the filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Acquisitions that found it held (by another CPU) and had to spin.
    pub contended: u64,
    /// Nanoseconds it was held, in total; 0 unless holds are timed
    /// ([`MountOptions::hold_clock`](crate::volume::MountOptions::hold_clock)).
    pub hold_ns: u64,
    /// The longest single hold so far, in nanoseconds (timed as `hold_ns`).
    pub max_hold_ns: u64,
}

impl LockStats {
    /// Mean hold in nanoseconds (0 before the first acquisition, or untimed).
    pub fn mean_hold_ns(&self) -> u64 {
        self.hold_ns.checked_div(self.acquisitions).unwrap_or(0)
    }
}

impl FsStats {
    /// Total checkpoints.
    pub fn total_checkpoints(&self) -> u64 {
        self.checkpoints.iter().sum()
    }
}

/// Per-cause arrays as maps from the cause's name.
#[cfg(feature = "serde")]
pub(crate) mod by_cause {
    use serde::ser::{SerializeMap, Serializer};

    use crate::synclog::Fallback;
    use crate::volume::CheckpointCause;

    /// `values[i]` under `names[i]`.
    pub(crate) fn map<S: Serializer, T: serde::Serialize>(
        names: impl ExactSizeIterator<Item = &'static str>,
        values: &[T],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(names.len()))?;
        for (name, v) in names.zip(values) {
            m.serialize_entry(name, v)?;
        }
        m.end()
    }

    pub(crate) fn checkpoints<S: Serializer>(
        v: &[u64; CheckpointCause::ALL.len()],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        map(CheckpointCause::ALL.iter().map(|c| c.name()), v, s)
    }

    pub(crate) fn fallbacks<S: Serializer>(
        v: &[u64; Fallback::ALL.len()],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        map(Fallback::ALL.iter().map(|f| f.name()), v, s)
    }
}
