//! Reading ahead of sequential readers: the read path asks ([`Engine::ask_readahead`]),
//! the readahead workers read ([`NineFs::readahead_worker`](crate::volume::NineFs::readahead_worker)), the data cache keeps what
//! they read (`cache::readahead` has the queue and its bounds).
//!
//! A worker plans the range like a read (extents and checksums, loading nodes as
//! needed), leaves holes alone (they read as zeros without I/O), skips blocks cached or
//! already being read, and reads the rest in device requests of up to the device's
//! transfer limit, merging runs that are adjacent on the device (consecutive extents of
//! a file written in pieces usually are). Blocks are verified as a reader's would be
//! and kept marked as read ahead; a read that fails keeps nothing and is left for the
//! reader's own read to report.

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use crate::cache::data::Fill;
use crate::cache::{Part, ReadaheadCounters, ReadaheadRequest, Who};
use crate::core::file::{blocks_match, regular};
use crate::engine::Engine;
use crate::format::BLOCK_SIZE;
use crate::io::Verified;
use block::BlockDevice;
use vfs::{FsResult, Ino, ReadStream, Window};

const BS: u64 = BLOCK_SIZE as u64;

/// The first readahead window of a sequential reader (at least twice its read).
pub const INITIAL_WINDOW: u64 = 128 << 10;
/// Default of [`crate::volume::MountOptions::readahead`]: the largest window.
pub const DEFAULT_READAHEAD: u64 = 4 << 20;

/// Claimed runs adjacent on the device, to read in one request: each claim with its
/// checksums.
type Batch<'a> = Vec<(Fill<'a>, Vec<u32>)>;

impl<D: BlockDevice> Engine<D> {
    /// Records a read of `len` bytes at `offset` of `ino` through `stream` for `who`,
    /// and queues the readahead it calls for, if any.
    pub(crate) fn ask_readahead(
        &self,
        ino: Ino,
        offset: u64,
        len: u64,
        who: Who,
        stream: &Arc<ReadStream>,
    ) {
        if self.readahead_max == 0 {
            return;
        }
        let bounds = Window {
            initial: INITIAL_WINDOW.min(self.readahead_max),
            max: self.readahead_max,
        };
        if let Some((range, epoch)) = stream.advance(offset, len, bounds) {
            self.readahead.push(ReadaheadRequest {
                ino,
                range,
                who,
                stream: stream.clone(),
                epoch,
            });
        }
    }

    /// Readahead's counters.
    pub fn readahead_counters(&self) -> ReadaheadCounters {
        self.readahead.counters()
    }

    /// [`NineFs::prefetch`](crate::volume::NineFs::prefetch) in this filesystem (a
    /// snapshot's view: in it).
    pub(crate) async fn prefetch_data(
        &self,
        ino: Ino,
        range: Range<u64>,
        who: Who,
    ) -> FsResult<()> {
        let pieces = self
            .run(|c| {
                let item = c.inode(ino)?;
                regular(&item)?;
                let end = range.end.min(item.size);
                if range.start >= end {
                    return Ok(Vec::new());
                }
                c.read_plan(ino, range.start / BS, end.div_ceil(BS))
            })
            .await?;
        let cache = self.dev.cache();
        let max = self.dev.max_transfer_blocks().max(1) as usize;
        let mut batch: Batch<'_> = Vec::new();
        for piece in &pieces {
            for chunk in (0..piece.len as usize).step_by(max) {
                let sums = &piece.csums[chunk..(chunk + max).min(piece.len as usize)];
                let first = piece.disk_block + chunk as u64;
                for part in cache.lookup(who, first, sums, false) {
                    match part {
                        Part::Hit { .. } => self.readahead.count(|c| c.skipped_blocks += 1),
                        Part::Wait { len, .. } => {
                            self.readahead.count(|c| c.skipped_blocks += len as u64)
                        }
                        Part::Read { at, len, fill } => {
                            let held: usize = batch.iter().map(|(_, s)| s.len()).sum();
                            let adjacent = batch
                                .last()
                                .is_some_and(|(f, _)| f.blocks().end == fill.blocks().start);
                            if !batch.is_empty() && (!adjacent || held + len > max) {
                                self.read_ahead(core::mem::take(&mut batch), who).await;
                            }
                            batch.push((fill, sums[at..at + len].to_vec()));
                        }
                    }
                }
            }
        }
        if !batch.is_empty() {
            self.read_ahead(batch, who).await;
        }
        Ok(())
    }

    /// Reads the claimed runs of `batch` (adjacent on the device) in one request and
    /// keeps them for `who`, marked as read ahead, if every block passes its checksum.
    async fn read_ahead(&self, batch: Batch<'_>, who: Who) {
        let first = batch[0].0.blocks().start;
        let csums: Vec<u32> = batch.iter().flat_map(|(_, s)| s.iter().copied()).collect();
        let mut buf = vec![0u8; csums.len() * BLOCK_SIZE];
        let read = self
            .dev
            .read_verified(first, &mut buf, |b| blocks_match(b, &csums))
            .await;
        self.core.lock().stats.data_bytes_read += buf.len() as u64;
        match read {
            Ok(Verified::Good | Verified::Mended) => {
                let mut at = 0;
                for (fill, sums) in batch {
                    let bytes = sums.len() * BLOCK_SIZE;
                    fill.complete(who, &buf[at..at + bytes], &sums, true);
                    at += bytes;
                }
                self.readahead.count(|c| {
                    c.reads += 1;
                    c.bytes += buf.len() as u64;
                });
            }
            // Stale (the file changed since it was planned) or unreadable: the claims
            // are given up with the batch.
            _ => self.readahead.count(|c| c.failed += 1),
        }
    }
}
