//! fsync through the log, and group commit.
//!
//! An fsync reserves a record buffer (from the pool, or allocated — in either case
//! before any lock), builds its records under the core lock and appends them to the
//! open batch, all in one lock hold. Then it waits for its batch to be durable:
//!
//! - if a checkpoint absorbed the batch (it was prepared after the records were built),
//!   the fsync is durable when that checkpoint commits;
//! - otherwise it queues for the commit lock. Whoever gets it while the batch is still
//!   open becomes the committer: it takes the open batch — its own records and those of
//!   every fsync that arrived meanwhile — writes its blocks, issues one FLUSH and marks
//!   it durable. The others find their batch durable when they get the lock.
//!
//! So while one commit is in flight, the next batch gathers, and one FLUSH serves them
//! all. The commit lock is held across the commit's I/O, but only syncs wait for it,
//! and they wait for exactly that I/O; the core lock is never held across I/O.

use crate::format::log::encode_commit;
use crate::format::BLOCK_SIZE;
use crate::util::scratch::Scratch;
use block::{BlockDevice, WriteFlags};
use vfs::{Errno, FsResult, Ino};

use crate::core::checkpoint::CheckpointCause;
use crate::core::checks;
use crate::engine::Engine;
use crate::synclog::{Batch, Built};

/// Record buffer reserved for a sync when nothing better is known.
const DEFAULT_SCRATCH: usize = 4096;

impl<D: BlockDevice> Engine<D> {
    /// `fsync`/`fdatasync` of `ino` through the log.
    pub(crate) async fn sync_inode(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        let is_dir = self.run(|c| Ok(c.inode(ino)?.is_dir())).await?;
        if self.core.lock().read_only {
            return Ok(());
        }
        {
            let mut l = self.log.lock();
            match (is_dir, datasync) {
                (true, _) => l.stats.dir_fsyncs += 1,
                (false, false) => l.stats.fsyncs += 1,
                (false, true) => l.stats.fdatasyncs += 1,
            }
        }
        let mut want = DEFAULT_SCRATCH;
        loop {
            // The buffer is reserved before the core lock is taken or the batch joined;
            // building never grows it (see `Scratch`).
            let mut scratch = self.reserve_scratch(want);
            let built = self
                .run(|c| c.build_log(ino, datasync, &mut scratch, &self.log))
                .await;
            let built = match built {
                Ok(b) => b,
                Err(e) => {
                    self.log.lock().give_buffer(scratch.into_vec());
                    return Err(e);
                }
            };
            if !matches!(built, Built::Appended(_)) {
                self.log.lock().give_buffer(scratch.into_vec());
            }
            match built {
                Built::Appended(batch) => return self.wait_durable(batch).await,
                Built::Clean(batch) => {
                    if batch <= self.log.lock().durable {
                        self.log.lock().stats.clean += 1;
                    }
                    return self.wait_durable(batch).await;
                }
                Built::NeedScratch(n) => {
                    self.log.lock().stats.scratch_regrown += 1;
                    want = n;
                }
                Built::WaitCheckpoint => {
                    self.log.lock().stats.checkpoint_waits += 1;
                    drop(self.checkpoint_lock.lock().await);
                }
                Built::Fallback(f) => {
                    self.log.lock().stats.fallbacks[f.index()] += 1;
                    log::debug!(
                        "fsync of inode {ino}: checkpoint instead of log ({})",
                        f.name()
                    );
                    return self.checkpoint(CheckpointCause::Fsync).await;
                }
            }
        }
    }

    /// A record buffer of at least `want` bytes: from the pool, else allocated (no lock
    /// is held here).
    fn reserve_scratch(&self, want: usize) -> Scratch {
        let pooled = self.log.lock().take_buffer(want);
        match pooled {
            Some(v) => Scratch::from_vec(v),
            None => {
                let s = Scratch::with_capacity(want);
                self.log.lock().stats.scratch_allocated += 1;
                s
            }
        }
    }

    /// Waits until batch `batch` is durable, committing it (and whatever joined it) if
    /// nobody else is.
    async fn wait_durable(&self, batch: u64) -> FsResult<()> {
        if batch == 0 {
            return Ok(());
        }
        loop {
            if self.core.lock().failed {
                return Err(Errno::EIO);
            }
            let absorbed = {
                let l = self.log.lock();
                if l.durable >= batch {
                    return Ok(());
                }
                batch <= l.absorbed
            };
            if absorbed {
                // A checkpoint covers it: durable when that commits.
                drop(self.checkpoint_lock.lock().await);
                continue;
            }
            let guard = self.commit_lock.lock().await;
            if self.core.lock().failed {
                return Err(Errno::EIO);
            }
            let taken = {
                let mut l = self.log.lock();
                if l.durable >= batch {
                    l.stats.joined += 1;
                    return Ok(());
                }
                if batch <= l.absorbed {
                    continue;
                }
                l.take_batch()
            };
            match taken {
                Ok(Some(b)) => self.write_batch(b).await?,
                Ok(None) => {}
                Err(_) => {
                    // No room: a checkpoint absorbs the open batch and frees the log.
                    drop(guard);
                    self.log.lock().stats.full += 1;
                    self.checkpoint(CheckpointCause::LogReclaim).await?;
                }
            }
        }
    }

    /// Writes one batch and flushes: one commit.
    async fn write_batch(&self, batch: Batch) -> FsResult<()> {
        let fs_seq = self.core.lock().seq;
        let (mut buf, epoch, start, capacity) = {
            let mut l = self.log.lock();
            (l.take_commit_buffer(), l.epoch, l.start, l.capacity)
        };
        let blocks = encode_commit(&batch.records, batch.first_seq, epoch, fs_seq, &mut buf);
        // Nothing of the commit is written unless it passes (`checks`).
        let checked = checks::log_commit(&batch.as_commit(&self.log.lock()), blocks);
        if let Err(v) = checked {
            let _ = self.core.lock().fail(v);
            return Err(Errno::EIO);
        }
        let first = batch.first_seq % capacity;
        let before_wrap = (capacity - first).min(blocks) as usize;
        let written: Result<(), block::IoError> = async {
            self.dev
                .write(
                    start + first,
                    &buf[..before_wrap * BLOCK_SIZE],
                    WriteFlags::NONE,
                )
                .await?;
            if before_wrap < blocks as usize {
                self.dev
                    .write(start, &buf[before_wrap * BLOCK_SIZE..], WriteFlags::NONE)
                    .await?;
            }
            self.dev.flush().await
        }
        .await;
        // A leg that missed any of it must be on record before the commit counts.
        if written.is_ok() && self.dev.copies() > 1 {
            self.record_failed_legs().await?;
        }
        match written {
            Ok(()) => {
                self.core.lock().stats.flushes += 1;
                let mut l = self.log.lock();
                l.stats.commits += 1;
                l.stats.blocks += blocks;
                l.batch_durable(batch, buf);
                Ok(())
            }
            Err(e) => {
                log::error!(
                    "log commit at sequence {}: {e}; filesystem is now failed",
                    batch.first_seq
                );
                self.core.lock().failed = true;
                Err(Errno::EIO)
            }
        }
    }
}
