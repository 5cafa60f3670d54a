//! Checkpoints and what the engine does around them: the checkpoint run, the write
//! policy's checks after each operation (eviction, early node writes), discarding
//! freed blocks, housekeeping, and the clean remount.

use ::core::ops::Range;
use alloc::vec::Vec;

use crate::core::checkpoint::CheckpointCause;
use crate::core::checks;
use crate::core::txn::Core;
use crate::engine::Engine;
use crate::util::check::ensure;
use block::{BlockDevice, WriteFlags};
use vfs::{Errno, FsResult, Ino};

/// Most discard requests one checkpoint sends; blocks beyond them are freed without
/// being discarded (bounded checkpoint time; counted as skipped blocks in the log).
pub(crate) const MAX_DISCARDS_PER_CHECKPOINT: usize = 4096;

impl<D: BlockDevice> Engine<D> {
    /// Does what a clean unmount does on disk, but keeps the filesystem mounted,
    /// read-only from then on (`mount -o remount,ro`; for a holder that cannot give the
    /// filesystem up, such as the appliance's 9P server at shutdown): frees inodes that
    /// were unlinked while open, writes a final checkpoint marked clean (the log is then
    /// empty: the next mount replays nothing), and refuses every later change with
    /// `EROFS`, so nothing can make the image unclean again. Every open file counts as
    /// closed: call it once no operation is running and no client holds a file.
    pub async fn remount_read_only(&self) -> FsResult<()> {
        if self.core.lock().read_only {
            return Ok(());
        }
        let open: Vec<Ino> = {
            let mut c = self.core.lock();
            c.inodes.values_mut().for_each(|s| s.open = 0);
            c.inodes.keys().copied().collect()
        };
        for ino in open {
            self.free_if_unlinked(ino).await?;
        }
        self.checkpoint(CheckpointCause::Unmount).await?;
        // No await since the checkpoint: nothing changed in between.
        self.core.lock().read_only = true;
        Ok(())
    }

    /// Discards `freed` (blocks whose release a checkpoint just made durable, still
    /// pinned). Errors are logged and counted, never fatal: the blocks are free either
    /// way; a device that cannot discard turns discarding off.
    pub(crate) async fn discard_freed(&self, freed: Vec<Range<u64>>) {
        let skipped: u64 = freed
            .iter()
            .skip(MAX_DISCARDS_PER_CHECKPOINT)
            .map(|r| r.end - r.start)
            .sum();
        if skipped > 0 {
            log::warn!("discard: {skipped} freed blocks left undiscarded (too many ranges)");
        }
        for r in freed.into_iter().take(MAX_DISCARDS_PER_CHECKPOINT) {
            let blocks = r.end - r.start;
            let result = self.dev.discard(r.start, blocks).await;
            let mut c = self.core.lock();
            match result {
                Ok(()) => {
                    c.stats.discards += 1;
                    c.stats.discarded_blocks += blocks;
                }
                Err(block::IoError::Unsupported) => {
                    drop(c);
                    log::info!(
                        "discard: the device cannot discard; freed blocks stay allocated on it"
                    );
                    *self.discard.lock() = None;
                    return;
                }
                Err(e) => {
                    c.stats.discard_errors += 1;
                    drop(c);
                    log::warn!("discard of blocks {}..{}: {e}", r.start, r.end);
                }
            }
        }
    }

    /// Periodic work, for the owner to call every few seconds: gives the node cache back
    /// the memory the data cache borrowed from it, if it grew into it; commits the
    /// release of blocks freed more than [`MountOptions::discard`](crate::volume::MountOptions::discard) ago (a `Discard`
    /// checkpoint), so deleted files give their space back to the device even when
    /// nothing else checkpoints.
    pub async fn housekeeping(&self) -> FsResult<()> {
        self.dev.cache().trim();
        let Some(delay) = *self.discard.lock() else {
            return Ok(());
        };
        let waiting = {
            let c = self.core.lock();
            !c.read_only && !c.failed && c.space.reclaimable() > 0
        };
        let now = self.now().sec;
        let due = {
            let mut since = self.freed_since.lock();
            match (*since, waiting) {
                (_, false) => {
                    *since = None;
                    false
                }
                (None, true) => {
                    *since = Some(now);
                    false
                }
                (Some(t), true) => now.saturating_sub(t) >= delay.as_secs() as i64,
            }
        };
        if due {
            *self.freed_since.lock() = None;
            self.checkpoint(CheckpointCause::Discard).await?;
        }
        Ok(())
    }

    /// Runs a checkpoint now (if anything changed, or to mark an unmount clean).
    pub async fn checkpoint(&self, cause: CheckpointCause) -> FsResult<()> {
        let _guard = self.checkpoint_lock.lock().await;
        self.checkpoint_locked(cause).await
    }

    /// [`Engine::checkpoint`] with the checkpoint lock already held.
    pub(crate) async fn checkpoint_locked(&self, cause: CheckpointCause) -> FsResult<()> {
        if self.core.lock().read_only {
            return Ok(());
        }
        let prepared = self
            .run_loads(&mut |c: &mut Core| {
                let mut plan = c.prepare_checkpoint(cause)?;
                if let Some(p) = plan.as_mut() {
                    // Every record built so far describes state this checkpoint holds:
                    // the log after it starts at the head, and the open batch is covered.
                    let (tail, absorbed) = self.log.lock().absorb();
                    let before = c.sb.log_tail;
                    c.check(ensure(tail >= before, "log tail moves backwards", || {
                        alloc::format!("from {before} to {tail}")
                    }))?;
                    p.sb.log_tail = tail;
                    c.sb.log_tail = tail;
                    p.log_absorbed = absorbed;
                }
                Ok(plan)
            })
            .await?;
        let Some(mut plan) = prepared.map_err(|()| Errno::ENOSPC)? else {
            return Ok(());
        };
        let written: Result<(), block::IoError> = async {
            // Sealed here, with no lock held: checksumming is most of encoding a node.
            for (block, bset) in ::core::mem::take(&mut plan.nodes) {
                self.dev
                    .write(block, &bset.seal(), WriteFlags::NONE)
                    .await?;
            }
            for (block, data) in &plan.groups {
                self.dev.write(*block, data, WriteFlags::NONE).await?;
            }
            self.dev.flush().await?;
            // Legs that failed up to here are out of what this checkpoint committed.
            self.stamp_legs(&mut plan.sb);
            self.dev
                .write(plan.sb.slot(), &plan.sb.encode(), WriteFlags::FUA)
                .await?;
            if cause == CheckpointCause::Unmount {
                // Both copies clean and current: on a cleanly unmounted image a damaged
                // copy is then detectably damage, not a torn last write. (Not past the
                // generations' bound: then the other copy stays one generation older.)
                let mut other = plan.sb.clone();
                if other.next_generation().is_ok() {
                    self.dev
                        .write(other.slot(), &other.encode(), WriteFlags::FUA)
                        .await?;
                    self.core.lock().sb.generation = other.generation;
                }
            }
            Ok(())
        }
        .await;
        let mut c = self.core.lock();
        match written {
            Ok(()) => {
                // The release of the freed blocks is durable: give them back to the
                // device before they can be reused (they stay pinned meanwhile).
                if self.discard.lock().is_some() {
                    let freed = c.space.pinned_ranges();
                    drop(c);
                    self.discard_freed(freed).await;
                    c = self.core.lock();
                }
                c.checkpoint_committed(&plan);
                drop(c);
                self.log
                    .lock()
                    .checkpoint_committed(plan.sb.log_tail, plan.log_absorbed);
                Ok(())
            }
            Err(e) => {
                log::error!(
                    "checkpoint {} failed: {e}; filesystem is now failed",
                    plan.seq
                );
                c.failed = true;
                Err(Errno::EIO)
            }
        }
    }

    /// Evicts clean nodes over the cache limit and runs a checkpoint if the policy asks.
    pub(crate) async fn maintain(&self) -> FsResult<()> {
        let due = {
            let mut c = self.core.lock();
            if c.read_only || c.failed {
                return Ok(());
            }
            self.evict(&mut c);
            let log_used = self.log.lock().used();
            self.policy
                .checkpoint_due(&c.pressure(self.cache_limit, log_used))
        };
        if let Some(cause) = due {
            self.checkpoint(cause).await?;
            let mut c = self.core.lock();
            self.evict(&mut c);
        }
        if self.policy.writes_early() {
            self.write_early().await?;
        }
        Ok(())
    }

    /// Writes the nodes the policy wants written ahead of the next checkpoint. Holds the
    /// checkpoint lock across the writes, so no checkpoint commits a length these
    /// writes have not reached yet.
    pub(crate) async fn write_early(&self) -> FsResult<()> {
        let _guard = self.checkpoint_lock.lock().await;
        let prepared = self
            .run_loads(&mut |c: &mut Core| {
                // Locations for nodes that need one (new, or too full to append).
                let want = c
                    .trees
                    .cache
                    .nodes()
                    .filter(|n| n.is_dirty() && self.policy.node_write_due(n.pending_bytes()))
                    .count();
                c.space.fill_pool(want)?;
                let mut pool = Vec::new();
                while let Some(a) = c.space.take_node() {
                    pool.push(a);
                }
                let seq = c.seq;
                let res = c
                    .trees
                    .write_early(seq, |p| self.policy.node_write_due(p), &mut pool);
                for a in pool {
                    c.space.return_node(a);
                }
                let nb = crate::core::txn::node_blocks(&c.sb);
                for w in &res.writes {
                    let layout = c.sb.layout;
                    c.check(checks::node_write(w, &layout, nb))?;
                }
                for &a in &res.placed {
                    c.space.commit_reserved(a..a + nb);
                }
                c.space.stats.node_allocs += res.placed.len() as u64;
                for &a in &res.freed {
                    c.space.free(a..a + nb);
                }
                c.check_space()?;
                for w in &res.writes {
                    c.stats.node_writes.count(w);
                }
                if !res.writes.is_empty() {
                    c.changed = true;
                }
                Ok(res.writes)
            })
            .await?;
        // Out of space for locations: the next checkpoint writes them.
        let writes = prepared.unwrap_or_default();
        for w in writes {
            if let Err(e) = self
                .dev
                .write(w.block, &w.bset.seal(), WriteFlags::NONE)
                .await
            {
                log::error!(
                    "early write of a node at block {}: {e}; filesystem is now failed",
                    w.block
                );
                self.core.lock().failed = true;
                return Err(Errno::EIO);
            }
        }
        Ok(())
    }
}
