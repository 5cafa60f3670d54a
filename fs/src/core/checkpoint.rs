//! Checkpoints: the unit of btree durability.
//!
//! A checkpoint (1) under the core lock writes nothing yet but *prepares*: it walks the
//! dirty nodes (leaves before parents), copying each one's new bset out (unsealed: no
//! header, no checksums yet), places relocated nodes, applies pending frees to the bitmap
//! and encodes the changed bitmap groups and the new superblock; then (2) with no lock
//! held it seals the bsets, writes all of that, flushes the device, and writes the
//! superblock with FUA; then (3) it records the commit, which releases the blocks the
//! checkpoint freed. Operations keep running during (2): their changes belong to the
//! next checkpoint.
//!
//! When a checkpoint runs is decided by a [`WritePolicy`].

use alloc::vec::Vec;

use crate::core::checks;
use crate::core::txn::{node_blocks, Core, Step, Stop};
use crate::format::bset::UnsealedBset;
use crate::format::superblock::{state, Superblock};
use vfs::Errno;

pub use crate::core::counters::CheckpointCause;

/// What a policy sees when deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pressure {
    /// Memory used by cached nodes.
    pub cache_mem: usize,
    /// The configured limit.
    pub cache_limit: usize,
    /// Cached nodes with unwritten changes.
    pub dirty_nodes: usize,
    /// Nodes the metadata reserve can place.
    pub reserve_nodes: usize,
    /// Log blocks in use (since the committed checkpoint).
    pub log_used: u64,
    /// Blocks in the log region.
    pub log_blocks: u64,
}

/// Decides when checkpoints run. Implementations must be cheap: this is asked after
/// every operation, on whichever CPU ran it (hence `Send + Sync`: the filesystem that
/// holds the policy is shared by every CPU).
pub trait WritePolicy: Send + Sync {
    /// Whether a checkpoint must run now, and why.
    fn checkpoint_due(&self, p: &Pressure) -> Option<CheckpointCause>;

    /// Whether to look for nodes to write ahead of the next checkpoint at all.
    fn writes_early(&self) -> bool {
        false
    }

    /// Whether a node with `pending_bytes` of unwritten changes is to be written now,
    /// ahead of the next checkpoint (asked only if [`WritePolicy::writes_early`]).
    fn node_write_due(&self, pending_bytes: usize) -> bool {
        let _ = pending_bytes;
        false
    }
}

/// The default policy: write only when something must be reclaimed (bcachefs's
/// journal-reclaim-driven writes) — log space (more than half the log region in use),
/// memory (the cache over its limit after evicting every clean node it could), or the
/// metadata reserve (more nodes dirty than it could place).
#[derive(Clone, Copy, Debug, Default)]
pub struct PressurePolicy;

impl WritePolicy for PressurePolicy {
    fn checkpoint_due(&self, p: &Pressure) -> Option<CheckpointCause> {
        if p.cache_mem > p.cache_limit {
            Some(CheckpointCause::CacheReclaim)
        } else if p.dirty_nodes > p.reserve_nodes / 2 {
            Some(CheckpointCause::Reserve)
        } else if p.log_used * 2 > p.log_blocks {
            Some(CheckpointCause::LogReclaim)
        } else {
            None
        }
    }
}

/// The baseline bcachefs had before journal-reclaim-driven writes: a node is written as
/// soon as 4 KiB of it is dirty (otherwise as [`PressurePolicy`]). For comparisons.
#[derive(Clone, Copy, Debug, Default)]
pub struct DirtyThresholdPolicy;

impl WritePolicy for DirtyThresholdPolicy {
    fn checkpoint_due(&self, p: &Pressure) -> Option<CheckpointCause> {
        PressurePolicy.checkpoint_due(p)
    }

    fn writes_early(&self) -> bool {
        true
    }

    fn node_write_due(&self, pending_bytes: usize) -> bool {
        pending_bytes >= crate::format::BLOCK_SIZE
    }
}

/// A prepared checkpoint: what to write.
#[derive(Debug)]
pub struct Plan {
    /// The sequence it commits.
    pub seq: u64,
    /// Node writes: `(block, bset)`, sealed as they are written.
    pub nodes: Vec<(u64, UnsealedBset)>,
    /// Bitmap group writes: `(block, data)`.
    pub groups: Vec<(u64, Vec<u8>)>,
    /// The superblock to write last.
    pub sb: Superblock,
    /// The cause.
    pub cause: CheckpointCause,
    /// Log batches up to this id are covered by this checkpoint.
    pub log_absorbed: u64,
}

impl Core {
    /// Prepares a checkpoint (see the module documentation). `None` if there is nothing
    /// to write.
    pub fn prepare_checkpoint(&mut self, cause: CheckpointCause) -> Step<Option<Plan>> {
        // Unmount marks the image clean and log reclaim moves the log tail even when no
        // node changed.
        if !self.changed
            && !matches!(
                cause,
                CheckpointCause::Unmount | CheckpointCause::LogReclaim
            )
        {
            return Ok(None);
        }
        // Everything that can stop comes first.
        let bound = self.trees.flush_bound();
        self.space.fill_pool(bound).map_err(|e| match e {
            crate::space::AllocNeed::Group(g) => Stop::Group(g),
            crate::space::AllocNeed::NoSpace => {
                log::error!("no space left for a checkpoint ({bound} nodes)");
                Stop::Errno(Errno::ENOSPC)
            }
        })?;
        let candidates = self.trees.relocation_candidates();
        if let Some(&g) = self.space.groups_needed(candidates.into_iter()).first() {
            return Err(Stop::Group(g));
        }

        let seq = self.seq;
        let nb = node_blocks(&self.sb);
        let mut pool = Vec::new();
        while let Some(a) = self.space.take_node() {
            pool.push(a);
        }
        let res = self.trees.flush(seq, cause.leaf_cause(), &mut pool);
        for a in pool {
            self.space.return_node(a);
        }
        // Nothing is written before every check below passed (`checks`).
        for w in &res.writes {
            self.check(checks::node_write(w, &self.sb.layout, nb))?;
        }
        for &a in &res.placed {
            self.space.commit_reserved(a..a + nb);
        }
        self.space.stats.node_allocs += res.placed.len() as u64;
        for a in res
            .freed
            .into_iter()
            .chain(core::mem::take(&mut self.trees.freed_nodes))
        {
            self.space.free(a..a + nb);
        }
        let mut nodes = Vec::with_capacity(res.writes.len());
        for w in res.writes {
            self.stats.node_writes.count(&w);
            nodes.push((w.block, w.bset));
        }
        let groups = match self.space.prepare(seq) {
            Ok(g) => g,
            Err(_) => {
                self.failed = true;
                return Err(Stop::Corrupt("bitmap group vanished during a checkpoint"));
            }
        };
        self.check_space()?;
        self.stats.group_writes += groups.len() as u64;
        let groups = groups.into_iter().map(|g| (g.block, g.data)).collect();

        let mut sb = self.sb.clone();
        sb.roots = self.trees.roots;
        sb.checkpoint_seq = seq;
        // Checked below with the rest (`checks::superblock`): one past the bound is
        // refused before anything is written.
        sb.generation = sb.generation.saturating_add(1);
        sb.next_ino = self.next_ino;
        sb.inode_count = self.inode_count;
        sb.free_blocks = self.space.committed_free();
        sb.state = if cause == CheckpointCause::Unmount {
            state::CLEAN
        } else {
            0
        };
        self.check(checks::superblock(&sb, &self.sb))?;
        self.sb = sb.clone();
        // Below `MAX_SEQ` (checked above), so this cannot wrap.
        self.seq = seq + 1;
        self.trees.set_birth_seq(seq + 1);
        self.changed = false;
        Ok(Some(Plan {
            seq,
            nodes,
            groups,
            sb,
            cause,
            log_absorbed: 0,
        }))
    }

    /// The checkpoint `plan` is durable.
    pub fn checkpoint_committed(&mut self, plan: &Plan) {
        self.committed_seq = plan.seq;
        self.space.committed();
        self.stats.checkpoints[plan.cause.index()] += 1;
        self.stats.superblock_writes += 1;
        self.stats.flushes += 1;
        self.prune_inode_states();
    }

    /// What the write policy sees.
    pub fn pressure(&self, cache_limit: usize, log_used: u64) -> Pressure {
        let nb = node_blocks(&self.sb);
        let reserve_nodes = (self.space.available() / nb.max(1)) as usize;
        Pressure {
            cache_mem: self.trees.cache.mem(),
            cache_limit,
            dirty_nodes: self.trees.cache.dirty_count(),
            reserve_nodes,
            log_used,
            log_blocks: self.sb.layout.log_blocks,
        }
    }
}
