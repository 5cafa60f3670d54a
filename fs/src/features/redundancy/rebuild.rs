//! Replacing a leg of a mirrored volume and rebuilding it online.
//!
//! [`Redundancy::replace`] takes a device put in a leg's place (the leg out of service, or
//! taken out for it) and makes it the leg *being rebuilt*: the device joins the mirror
//! written and never read ([`block::BlockDevice::start_rebuild`]), gets the leg's label,
//! and the superblock's leg table says [`leg::REBUILDING`]. From then on every write
//! reaches it; [`Redundancy::rebuild_step`] copies the rest: every block the allocator holds
//! (blocks free when the copy passes them hold nothing to copy, and anything written
//! there later reaches the new leg anyway), in address order, verified where the
//! filesystem has checksums (data blocks) and read from the legs in service only.
//!
//! - **No stale copy over a newer write.** Each piece is copied inside the mirror's
//!   copy window ([`block::BlockDevice::open_copy_window`]): it does not open while a
//!   write over the blocks is in flight, and a write that starts while it is open makes
//!   the copy count for nothing (it is done again), so a copy of old data can never be
//!   the last thing to land on the new leg.
//! - **Resumable, never complete early.** The cursor (every block below it that was in
//!   use when the copy passed it is on the new leg) goes into the superblock
//!   ([`Superblock::rebuild_cursor`]) after a FLUSH, every [`CURSOR_EVERY_BLOCKS`]
//!   (`MountOptions::rebuild_record_blocks`); a
//!   mount after a crash or reboot goes on from the last one recorded. The leg becomes
//!   active in the table only after the last block was copied and flushed; only then
//!   does the mirror read from it.
//! - **Rate.** The owner calls [`Redundancy::rebuild_step`] with a byte budget every tick
//!   ([`DEFAULT_REBUILD_RATE_MIB`], [`crate::features::redundancy::scrub::budget_per_tick`]), as for
//!   scrub; tools rebuild offline at full speed ([`Redundancy::rebuild_all`]).

use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use crate::core::txn::{Core, Step};
use crate::features::redundancy::Redundancy;
use crate::format::items::decode_csums;
use crate::format::key::kind;
use crate::format::label::{DeviceLabel, LABEL_BLOCK};
use crate::format::superblock::{leg, Superblock};
use crate::format::{Key, TreeId, BLOCK_SIZE};
use crate::io::Verified;
use crate::util::crc::crc32c;
use block::{yield_now, BlockDevice};
use vfs::{Errno, FsResult, Timespec};

/// Default rebuild rate, in MiB per second (`rebuild_rate=`, `ninefold serve
/// --rebuild-rate`): a few times scrub's, since redundancy is missing until it ends.
pub const DEFAULT_REBUILD_RATE_MIB: u32 = 64;

/// Blocks copied between two records of the cursor in the superblock (32 MiB): what a
/// crash makes a rebuild copy again at most, for one superblock write and FLUSH each.
pub const CURSOR_EVERY_BLOCKS: u64 = 8192;

/// Blocks of the bitmap looked at per piece of a step (one group's worth at most).
const SCAN_BLOCKS: u64 = 4096;

/// Tries of one piece's copy window before the step gives up for now (blocks written
/// that often are tried again at the next step).
const MAX_WINDOW_TRIES: u32 = 64;

/// A rebuild going on (in memory; the superblock has its durable part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rebuild {
    /// The leg being rebuilt.
    pub place: usize,
    /// Every block below it that was in use when the copy passed it has been copied
    /// (not yet durably past `recorded`).
    pub cursor: u64,
    /// The cursor as the superblock last recorded it.
    pub recorded: u64,
    /// Blocks of the filesystem (the cursor's end).
    pub total: u64,
    /// When this mount's copying started, by the filesystem's clock ([`Engine::now`](crate::engine::Engine::now)):
    /// at `ctl replace`, or at the mount that took the rebuild up. With `copied`, the
    /// rate; to the end, the time the rebuild took.
    pub since: Timespec,
    /// Blocks copied since `since`.
    pub copied: u64,
}

/// What [`Redundancy::rebuild_step`] left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildStep {
    /// No rebuild is going on.
    Idle,
    /// The rebuild goes on.
    Running,
    /// The rebuild ended in this step: the leg is in service.
    Done,
}

impl Rebuild {
    /// Copied bytes per second since this mount's copying started (at `now`).
    pub fn rate(&self, now: Timespec) -> u64 {
        let secs = (now.sec - self.since.sec).max(1) as u64;
        self.copied * BLOCK_SIZE as u64 / secs
    }

    /// Milliseconds from when this mount's copying started to `now` (0 if the clock
    /// went back).
    pub fn elapsed_ms(&self, now: Timespec) -> u64 {
        let ns = |t: Timespec| i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec);
        u64::try_from((ns(now) - ns(self.since)) / 1_000_000).unwrap_or(0)
    }
}

/// The checksums the checksum tree has for the blocks of `r` (data blocks), by block.
fn csums_in(c: &mut Core, r: Range<u64>) -> Step<Vec<Option<u32>>> {
    let mut items: Vec<(u64, Vec<u8>)> = Vec::new();
    // The extent starting at or before `r.start` (extents never overlap on disk), and
    // those starting in `r`.
    let first = Key::new(r.start, kind::CSUM, u64::MAX);
    if let Some((k, v)) = c.trees.get_le(TreeId::Csum, &first)? {
        if k.kind == kind::CSUM {
            items.push((k.objectid, v));
        }
    }
    if r.end > r.start + 1 {
        let (from, to) = (
            Key::new(r.start + 1, 0, 0),
            Key::new(r.end - 1, kind::CSUM, u64::MAX),
        );
        c.trees.range(TreeId::Csum, from, to, |k, v| {
            if k.kind == kind::CSUM {
                items.push((k.objectid, v.to_vec()));
            }
            true
        })?;
    }
    let mut out = vec![None; (r.end - r.start) as usize];
    for (start, v) in items {
        let Some(sums) = decode_csums(&v) else {
            continue;
        };
        for (i, sum) in sums.into_iter().enumerate() {
            let b = start + i as u64;
            if r.contains(&b) {
                out[(b - r.start) as usize] = Some(sum);
            }
        }
    }
    Ok(out)
}

impl<D: BlockDevice> Redundancy<D> {
    /// Puts the device in place `place` (out of service, or taken out for this; the
    /// caller has put the new device there: `block::MirrorDisk::attach`, or the
    /// volume was assembled with it) into the volume as the leg being rebuilt, and
    /// records that; [`Redundancy::rebuild_step`] then copies the volume to it.
    /// `EINVAL`: not a mirror or no such place; `EBUSY`: a rebuild is going on, or the
    /// leg is the last in service; `ENOENT`: no device in that place.
    pub async fn replace(&self, place: usize) -> FsResult<()> {
        let copies = self.engine.dev.copies();
        if copies < 2 || place >= copies {
            return Err(Errno::EINVAL);
        }
        if self.engine.core.lock().read_only {
            return Err(Errno::EROFS);
        }
        if self.rebuild.lock().is_some() || self.engine.dev.rebuilding_copies() != 0 {
            return Err(Errno::EBUSY);
        }
        if self.engine.dev.failed_copies() & 1 << place == 0 {
            self.engine.dev.fail_copy(place);
            if self.engine.dev.failed_copies() & 1 << place == 0 {
                return Err(Errno::EBUSY);
            }
        }
        // The table says failed before the new device holds anything: a crash from
        // here until the table says rebuilding leaves it out.
        self.engine.record_failed_legs().await?;
        if !self.engine.dev.start_rebuild(place) {
            return Err(Errno::ENOENT);
        }
        let uuid = self.engine.core.lock().sb.uuid;
        let label = DeviceLabel {
            uuid,
            place: place as u32,
            legs: copies as u32,
        };
        // Nothing else writes block 0: the window is never disturbed.
        if !self.engine.dev.open_copy_window(place, LABEL_BLOCK, 1)
            || !self
                .engine
                .dev
                .copy_blocks(place, LABEL_BLOCK, &label.encode())
                .await
                .map_err(|_| Errno::EIO)?
        {
            return Err(Errno::EIO);
        }
        let what = alloc::format!("mirror: leg {place} replaced, being rebuilt");
        self.engine
            .write_leg_table(&what, true, |sb| {
                sb.legs[place] = leg::REBUILDING;
                sb.rebuild_cursor = 0;
                true
            })
            .await?;
        self.resume_rebuild(true);
        self.engine.core.lock().stats.rebuild_starts += 1;
        Ok(())
    }

    /// `ctl replace PLACE DEVICE`: opens `device` (named as the volume's owner names
    /// devices: [`BlockDevice::attach_named`]), puts it in place `place` — the leg
    /// there taken out of service — and starts its rebuild ([`Redundancy::replace`]).
    pub async fn replace_named(
        &self,
        place: usize,
        device: &str,
    ) -> Result<(), alloc::string::String> {
        let copies = self.engine.dev.copies();
        if copies < 2 || place >= copies {
            return Err(alloc::format!("no leg {place} (the volume has {copies})"));
        }
        if self.rebuild.lock().is_some() || self.engine.dev.rebuilding_copies() != 0 {
            return Err("a rebuild is going on".into());
        }
        self.engine.dev.inner().attach_named(place, device).await?;
        self.replace(place)
            .await
            .map_err(|e| alloc::format!("leg {place}: {e}"))
    }

    /// Takes up the rebuild the superblock records, if its leg is being rebuilt (at
    /// mount, and after [`Redundancy::replace`]), from the recorded cursor: every block below
    /// it was copied and flushed, and every later write reached the leg. After a crash,
    /// writes since the last FLUSH may have reached a leg in service and not this one;
    /// of them only the last log commit's data becomes part of the volume (replay), and
    /// replay copies that to the leg being rebuilt too (`Dev::copy_to_rebuilding`).
    pub(crate) fn resume_rebuild(&self, clean: bool) {
        let sb: Superblock = self.engine.core.lock().sb.clone();
        let Some(place) = sb.legs.iter().position(|&l| l == leg::REBUILDING) else {
            return;
        };
        if self.engine.dev.rebuilding_copies() & 1 << place == 0 {
            return;
        }
        let recorded = sb.rebuild_cursor;
        if !clean && recorded > 0 {
            log::info!("rebuild: leg {place}: resumed at block {recorded} after a crash");
        }
        // Block 0 is the leg's own label, never copied.
        let cursor = recorded.max(LABEL_BLOCK + 1);
        *self.rebuild.lock() = Some(Rebuild {
            place,
            cursor,
            recorded,
            total: sb.layout.total_blocks,
            since: self.engine.now(),
            copied: 0,
        });
        let mut c = self.engine.core.lock();
        c.stats.rebuild_running = 1;
        c.stats.rebuild_total = sb.layout.total_blocks;
        c.stats.rebuild_cursor = cursor;
    }

    /// The rebuild going on, if any.
    pub fn rebuild_progress(&self) -> Option<Rebuild> {
        *self.rebuild.lock()
    }

    /// Copies blocks of the rebuild going on until about `budget` bytes were copied
    /// (blocks not in use cost nothing but the look), recording the cursor every
    /// `MountOptions::rebuild_record_blocks`; at the end, puts the leg in service.
    pub async fn rebuild_step(&self, budget: u64) -> FsResult<RebuildStep> {
        let Some(r) = self.rebuild_progress() else {
            return Ok(RebuildStep::Idle);
        };
        if self.engine.core.lock().read_only {
            return Ok(RebuildStep::Idle);
        }
        let mut cursor = r.cursor;
        let total = self.engine.core.lock().sb.layout.total_blocks;
        let mut spent = 0u64;
        while cursor < total && spent < budget {
            if self.engine.dev.rebuilding_copies() & 1 << r.place == 0 {
                return self.rebuild_failed(r.place).await;
            }
            let end = (cursor + SCAN_BLOCKS).min(total);
            let used = self
                .engine
                .run_loads(&mut |c: &mut Core| {
                    c.space.ensure_groups(cursor..end)?;
                    Ok(c.space.in_use(cursor..end))
                })
                .await?
                .map_err(|()| Errno::ENOSPC)?;
            // Where this look ends: the scan's end, or where the budget ran out.
            let mut upto = end;
            'pieces: for range in used {
                let mut at = range.start;
                while at < range.end {
                    if spent >= budget {
                        upto = at;
                        break 'pieces;
                    }
                    let n = (range.end - at).min(self.engine.dev.max_transfer_blocks());
                    if !self.copy_piece(r.place, at..at + n).await? {
                        // Written too often just now: go on from here next time.
                        self.rebuild_advanced(at, 0);
                        return Ok(RebuildStep::Running);
                    }
                    self.rebuild_advanced(at + n, n);
                    spent += n * BLOCK_SIZE as u64;
                    at += n;
                }
            }
            cursor = upto;
            self.rebuild_advanced(cursor, 0);
            let recorded = self.rebuild_progress().map_or(0, |r| r.recorded);
            if cursor - recorded >= self.rebuild_record_blocks && cursor < total {
                self.record_cursor(cursor).await?;
            }
        }
        if cursor < total {
            return Ok(RebuildStep::Running);
        }
        self.rebuild_done(r.place).await?;
        Ok(RebuildStep::Done)
    }

    /// Runs the rebuild going on to its end now (for tools and tests).
    pub async fn rebuild_all(&self) -> FsResult<()> {
        while self.rebuild_step(u64::MAX).await? == RebuildStep::Running {}
        Ok(())
    }

    /// Moves the in-memory cursor to `cursor`, counting `copied` blocks.
    fn rebuild_advanced(&self, cursor: u64, copied: u64) {
        if let Some(r) = self.rebuild.lock().as_mut() {
            debug_assert!(cursor >= r.cursor, "the cursor never moves back");
            r.cursor = cursor;
            r.copied += copied;
        }
        let mut c = self.engine.core.lock();
        c.stats.rebuild_cursor = cursor;
        c.stats.rebuild_blocks += copied;
    }

    /// Copies `r` from the legs in service to leg `place` inside a copy window, again
    /// while a write over it gets in the way; false when it kept doing so.
    async fn copy_piece(&self, place: usize, r: Range<u64>) -> FsResult<bool> {
        let mut buf = vec![0u8; ((r.end - r.start) as usize) * BLOCK_SIZE];
        for _ in 0..MAX_WINDOW_TRIES {
            if !self
                .engine
                .dev
                .open_copy_window(place, r.start, r.end - r.start)
            {
                self.engine.core.lock().stats.rebuild_retries += 1;
                yield_now().await;
                continue;
            }
            let range = r.clone();
            let sums = self
                .engine
                .run_loads(&mut |c: &mut Core| csums_in(c, range.clone()))
                .await?
                .map_err(|()| Errno::ENOSPC)?;
            let good = |b: &[u8]| {
                b.chunks(BLOCK_SIZE)
                    .zip(&sums)
                    .all(|(data, sum)| sum.is_none_or(|s| crc32c(data) == s))
            };
            let read = self.engine.dev.read_verified(r.start, &mut buf, good).await;
            let verified = match read {
                Ok(v) => v != Verified::Bad,
                Err(e) => {
                    // Unreadable on every leg in service: the new leg holds what it
                    // holds there, as wrong as nothing (checksums catch it).
                    log::error!("rebuild: blocks {}..{} unreadable: {e}", r.start, r.end);
                    false
                }
            };
            match self.engine.dev.copy_blocks(place, r.start, &buf).await {
                Ok(true) => {
                    if !verified {
                        log::error!(
                            "rebuild: blocks {}..{} copied as read, failing their checksums",
                            r.start,
                            r.end
                        );
                        self.engine.core.lock().stats.rebuild_unverified += r.end - r.start;
                    }
                    return Ok(true);
                }
                Ok(false) => {
                    self.engine.core.lock().stats.rebuild_retries += 1;
                    yield_now().await;
                }
                // The new leg failed: the mirror took it out.
                Err(_) => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Records `cursor` in the superblock, after a FLUSH that makes every copy below it
    /// durable.
    async fn record_cursor(&self, cursor: u64) -> FsResult<()> {
        let Some(place) = self.rebuild_progress().map(|r| r.place) else {
            return Ok(());
        };
        let what = alloc::format!("rebuild: leg {place} copied up to block {cursor}");
        self.engine
            .write_leg_table(&what, true, |sb| {
                if sb.legs[place] != leg::REBUILDING {
                    return false;
                }
                sb.rebuild_cursor = cursor;
                true
            })
            .await?;
        if let Some(r) = self.rebuild.lock().as_mut() {
            r.recorded = cursor;
        }
        Ok(())
    }

    /// The last block is copied: after a FLUSH, the table says the leg is active, and
    /// then the mirror reads from it.
    async fn rebuild_done(&self, place: usize) -> FsResult<()> {
        if self.engine.dev.rebuilding_copies() & 1 << place == 0 {
            self.rebuild_failed(place).await?;
            return Err(Errno::EIO);
        }
        let what = alloc::format!("rebuild: leg {place} complete, in service");
        self.engine
            .write_leg_table(&what, true, |sb| {
                assert_eq!(sb.legs[place], leg::REBUILDING, "the leg being rebuilt");
                sb.legs[place] = leg::ACTIVE;
                sb.rebuild_cursor = 0;
                true
            })
            .await?;
        self.engine.dev.finish_rebuild(place);
        *self.rebuild.lock() = None;
        let mut c = self.engine.core.lock();
        c.stats.rebuild_running = 0;
        c.stats.rebuilds += 1;
        log::warn!("mirror: leg {place} rebuilt and in service");
        Ok(())
    }

    /// The leg being rebuilt failed (the mirror took it out): the rebuild ends, the
    /// table says failed.
    async fn rebuild_failed(&self, place: usize) -> FsResult<RebuildStep> {
        log::error!("rebuild: leg {place} failed; replace it again");
        *self.rebuild.lock() = None;
        {
            let mut c = self.engine.core.lock();
            c.stats.rebuild_running = 0;
            c.stats.rebuild_failures += 1;
        }
        self.engine.record_failed_legs().await?;
        Ok(RebuildStep::Idle)
    }
}
