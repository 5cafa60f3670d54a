//! The fsync log (btrfs's tree-log idea over a ring of blocks).
//!
//! `fsync` writes only what the crash contract needs — the inode's changed items, the
//! checksums of its new extents, and the names that make it reachable — as records into
//! the log region, then issues one FLUSH; the btree stays in memory until a checkpoint.
//! Mount replays the records written since the last committed checkpoint.
//!
//! - [`track`]: per-inode marks of what is not logged yet, by checkpoint interval;
//! - [`build`]: building an fsync's records under the core lock (which inodes, which
//!   items), into a scratch buffer reserved beforehand;
//! - [`commit`]: group commit — fsyncs append to the open batch; one committer at a time
//!   writes a batch and flushes; everyone whose record is in it returns;
//! - [`replay`]: reading the log at mount and applying it;
//! - [`rules`]: what replay accepts (what the live operations accept).
//!
//! [`LogState`] is the ring: sequence numbers, the open batch, what is durable. It sits
//! behind its own short-held lock, taken after the core lock when both are needed.
//! `docs/durability.md` has the whole design.

use alloc::vec::Vec;
use hashbrown::HashSet;

use crate::core::checks::LogCommit;
use crate::format::log::{commit_blocks, LOG_PAYLOAD};

pub mod build;
pub mod replay;
pub mod rules;

pub use crate::core::counters::LogStats;
pub use build::{Built, Fallback};

/// Spare record buffers kept for reuse.
const POOL_MAX: usize = 64;
/// Record buffers larger than this are not kept.
const POOL_BUF_MAX: usize = 256 << 10;

/// A batch taken by a committer.
#[derive(Debug)]
pub struct Batch {
    /// Batch id.
    pub id: u64,
    /// The records, in order.
    pub records: Vec<Vec<u8>>,
    /// Sequence number of its first block.
    pub first_seq: u64,
    /// Its blocks.
    pub blocks: u64,
}

impl Batch {
    /// The batch about to be written into `log`'s ring, as the commit checks see it
    /// ([`checks::log_commit`](crate::core::checks::log_commit)).
    pub fn as_commit<'a>(&'a self, log: &LogState) -> LogCommit<'a> {
        LogCommit {
            first_seq: self.first_seq,
            blocks: self.blocks,
            records: &self.records,
            head: log.head,
            tail: log.tail,
            capacity: log.capacity,
        }
    }
}

/// The log ring and its batches (see the module documentation).
#[derive(Debug)]
pub struct LogState {
    /// First block of the log region.
    pub start: u64,
    /// Blocks in the log region.
    pub capacity: u64,
    /// This mount's epoch.
    pub epoch: u64,
    /// Sequence number of the next block to write.
    pub head: u64,
    /// First block still needed: the committed checkpoint's tail.
    pub tail: u64,
    /// Records of the open batch.
    open: Vec<Vec<u8>>,
    open_bytes: usize,
    /// Id of the open batch.
    pub open_id: u64,
    /// Batches up to this id are durable.
    pub durable: u64,
    /// Batches up to this id were absorbed by the last prepared checkpoint (durable once
    /// it commits).
    pub absorbed: u64,
    /// Data extents (first block) whose checksums the log holds since the last prepared
    /// checkpoint.
    csum_index: HashSet<u64>,
    pool: Vec<Vec<u8>>,
    commit_buf: Vec<u8>,
    /// Counters.
    pub stats: LogStats,
    /// The commit replay refused at mount, if it refused one.
    pub refused: Option<replay::RefusedCommit>,
    /// The data extents replay added at mount, `(first block, blocks)`: kept by a
    /// read-only mount only ([`NineFs::replayed_extents`](crate::volume::NineFs::replayed_extents)).
    pub replayed_extents: Vec<(u64, u32)>,
}

impl LogState {
    /// The log of a filesystem whose region is `start..start + capacity`, continuing at
    /// sequence number `head` in `epoch`.
    pub fn new(start: u64, capacity: u64, epoch: u64, head: u64) -> LogState {
        LogState {
            start,
            capacity,
            epoch,
            head,
            tail: head,
            open: Vec::new(),
            open_bytes: 0,
            open_id: 1,
            durable: 0,
            absorbed: 0,
            csum_index: HashSet::new(),
            pool: Vec::new(),
            commit_buf: Vec::new(),
            stats: LogStats::default(),
            refused: None,
            replayed_extents: Vec::new(),
        }
    }

    /// The device block holding sequence number `seq`.
    pub fn block_of(&self, seq: u64) -> u64 {
        self.start + seq % self.capacity
    }

    /// Blocks in use (written since the committed checkpoint, and the open batch).
    pub fn used(&self) -> u64 {
        let open = if self.open.is_empty() {
            0
        } else {
            commit_blocks(self.open_bytes)
        };
        self.head - self.tail + open
    }

    /// Largest record an fsync may build (bigger ones fall back to a checkpoint).
    pub fn max_record(&self) -> usize {
        (self.capacity as usize / 4).max(1) * LOG_PAYLOAD
    }

    /// A record buffer of at least `min` bytes from the pool, if one is there.
    pub fn take_buffer(&mut self, min: usize) -> Option<Vec<u8>> {
        let i = self.pool.iter().position(|b| b.capacity() >= min)?;
        self.stats.scratch_reused += 1;
        Some(self.pool.swap_remove(i))
    }

    /// Returns a record buffer to the pool.
    pub fn give_buffer(&mut self, mut b: Vec<u8>) {
        if self.pool.len() < POOL_MAX && b.capacity() <= POOL_BUF_MAX && b.capacity() > 0 {
            b.clear();
            self.pool.push(b);
        }
    }

    /// Appends a record to the open batch; returns the batch id.
    pub fn append(&mut self, record: Vec<u8>) -> u64 {
        self.open_bytes += record.len();
        self.stats.record_bytes += record.len() as u64;
        self.open.push(record);
        self.open_id
    }

    /// Whether the log's index has the checksums of `disk_block` (no counting: a build
    /// counts on success).
    pub fn has_csum(&self, disk_block: u64) -> bool {
        self.csum_index.contains(&disk_block)
    }

    /// Notes that the open batch holds the checksums of `disk_block`.
    pub fn note_csum(&mut self, disk_block: u64) {
        self.csum_index.insert(disk_block);
    }

    /// A checkpoint is being prepared: it covers every record built so far, so the open
    /// batch is dropped (its syncs are durable when the checkpoint commits) and the log
    /// after the checkpoint starts at the head. Returns `(tail, absorbed batch id)`.
    pub fn absorb(&mut self) -> (u64, u64) {
        for r in core::mem::take(&mut self.open) {
            self.give_buffer(r);
        }
        self.open_bytes = 0;
        self.absorbed = self.open_id;
        self.open_id += 1;
        self.csum_index.clear();
        (self.head, self.absorbed)
    }

    /// The checkpoint that absorbed batches up to `absorbed` and set `tail` committed.
    pub fn checkpoint_committed(&mut self, tail: u64, absorbed: u64) {
        self.tail = self.tail.max(tail);
        self.durable = self.durable.max(absorbed);
    }

    /// Takes the open batch for writing, assigning its blocks. `Ok(None)` if it is
    /// empty; `Err(blocks)` if the log has no room for its `blocks` now.
    pub fn take_batch(&mut self) -> Result<Option<Batch>, u64> {
        if self.open.is_empty() {
            return Ok(None);
        }
        let blocks = commit_blocks(self.open_bytes);
        if self.head + blocks > self.tail + self.capacity {
            return Err(blocks);
        }
        let batch = Batch {
            id: self.open_id,
            records: core::mem::take(&mut self.open),
            first_seq: self.head,
            blocks,
        };
        self.open_bytes = 0;
        self.open_id += 1;
        self.head += blocks;
        Ok(Some(batch))
    }

    /// The buffer commits are encoded into (reused from commit to commit).
    pub fn take_commit_buffer(&mut self) -> Vec<u8> {
        let mut b = core::mem::take(&mut self.commit_buf);
        if b.capacity() > 0 {
            self.stats.commit_buffer_reused += 1;
        }
        b.clear();
        b
    }

    /// Batch `batch` is durable; its buffers come back.
    pub fn batch_durable(&mut self, batch: Batch, commit_buf: Vec<u8>) {
        self.durable = self.durable.max(batch.id);
        for r in batch.records {
            self.give_buffer(r);
        }
        if commit_buf.capacity() >= self.commit_buf.capacity() {
            self.commit_buf = commit_buf;
        }
    }
}
