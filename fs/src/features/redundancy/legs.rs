//! A mirrored volume's legs as the filesystem sees them (the device is a mirror when
//! it keeps several copies: [`block::BlockDevice::copies`]).
//!
//! - **Which legs a mount trusts.** Every leg in service has its own two superblock
//!   copies; the current superblock is the valid one with the highest generation over
//!   all legs. A leg is stale, and taken out of service, when that superblock's leg
//!   table does not say it is active, when its own generation is more than one behind
//!   (every superblock write reaches all legs in service before the next one starts, so
//!   legs in service differ by at most the one a crash interrupted), or when it belongs
//!   to another volume.
//! - **The leg table stays true.** Every superblock written records the legs out of
//!   service ([`stamp`]); and a leg taken out of service since the last one is recorded
//!   with a superblock of its own before a log commit that followed is acknowledged
//!   ([`NineFs::record_failed_legs`]), so a leg that missed acknowledged writes can
//!   never pass for current after a crash.
//! - **A leg being rebuilt** (`rebuild`) is written with every write but never read;
//!   the table says so ([`leg::REBUILDING`]) with how far its copy has come, and a
//!   mount puts it back to being rebuilt if it is present and no more than one
//!   generation behind. One that fails, or is missing, is marked failed like any leg,
//!   and its copy is forgotten (a later replacement starts over).

use alloc::vec::Vec;

use crate::format::superblock::{leg, Superblock};
use crate::io::Dev;
use crate::volume::{read_superblock_copy, MountError, NineFs};
use block::{BlockDevice, WriteFlags};
use vfs::{Errno, FsResult};

/// Marks the legs of `failed` (bit `i`: leg `i`) failed in `sb`'s leg table. A failed
/// leg stays failed (only a rebuild brings it back); a leg being rebuilt that failed
/// takes its copy's progress with it.
pub fn stamp(sb: &mut Superblock, failed: u64) {
    let count = sb.leg_count();
    for (i, state) in sb.legs[..count].iter_mut().enumerate() {
        if failed & 1 << i != 0 {
            if *state == leg::REBUILDING {
                sb.rebuild_cursor = 0;
            }
            *state = leg::FAILED;
        }
    }
}

/// Whether `failed` names a leg that `sb`'s table still has in service.
fn unrecorded(sb: &Superblock, failed: u64) -> bool {
    let count = sb.leg_count();
    sb.legs[..count]
        .iter()
        .enumerate()
        .any(|(i, &s)| failed & 1 << i != 0 && s != leg::FAILED)
}

/// The current superblock of a mirrored volume, with the validity of the copies on the
/// leg it came from; takes the stale legs out of service (see the module documentation).
pub(crate) async fn choose<D: BlockDevice>(
    dev: &Dev<D>,
) -> Result<(Superblock, [bool; 2]), MountError> {
    let mut found: Vec<(usize, Superblock, [bool; 2])> = Vec::new();
    let mut refused = MountError::NoSuperblock(None);
    for c in 0..dev.copies() {
        if dev.failed_copies() & 1 << c != 0 {
            continue;
        }
        match read_superblock_copy(dev, Some(c)).await {
            Ok((sb, valid)) => found.push((c, sb, valid)),
            Err(e) => {
                log::warn!("leg {c}: {e}: taken out of service");
                dev.fail_copy(c);
                refused = e;
            }
        }
    }
    let best = found
        .iter()
        .max_by_key(|(_, sb, _)| sb.generation)
        .map(|(_, sb, valid)| (sb.clone(), *valid))
        .ok_or(refused)?;
    let sb = &best.0;
    if sb.leg_count() != dev.copies() {
        return Err(MountError::Legs(sb.leg_count()));
    }
    for (c, own, _) in &found {
        let behind = own.generation + 1 < sb.generation;
        let why = if own.uuid != sb.uuid {
            "another volume's"
        } else if sb.legs[*c] == leg::REBUILDING && !behind {
            // Written with every write since it joined: its copy goes on.
            if dev.start_rebuild(*c) {
                log::info!(
                    "leg {c} is being rebuilt (copied up to block {})",
                    sb.rebuild_cursor
                );
                continue;
            }
            "being rebuilt, and cannot go on"
        } else if sb.legs[*c] != leg::ACTIVE {
            "out of service since before the current superblock"
        } else if behind {
            "behind the others"
        } else {
            continue;
        };
        log::warn!(
            "leg {c} is stale ({why}: generation {} of {}): taken out of service",
            own.generation,
            sb.generation
        );
        dev.fail_copy(*c);
    }
    Ok(best)
}

impl<D: BlockDevice> NineFs<D> {
    /// Stamps the legs now out of service into `sb`, and into the superblock kept in
    /// memory so later ones keep them.
    pub(crate) fn stamp_legs(&self, sb: &mut Superblock) {
        let failed = self.dev.failed_copies();
        stamp(sb, failed);
        stamp(&mut self.core.lock().sb, failed);
    }

    /// Writes a superblock recording the legs taken out of service since the last one,
    /// if any were: called after a log commit's flush, before it is acknowledged.
    pub(crate) async fn record_failed_legs(&self) -> FsResult<()> {
        if !unrecorded(&self.core.lock().sb, self.dev.failed_copies()) {
            return Ok(());
        }
        let failed = || self.dev.failed_copies();
        self.write_leg_table("recording failed legs", false, |sb| {
            unrecorded(sb, failed())
        })
        .await
    }

    /// Writes a superblock of the committed state with `change` made to it (kept in
    /// memory for later ones) and the legs out of service stamped, unless `change`
    /// says there is nothing to write; with `flush`, after a FLUSH (so what was written
    /// before is durable before the superblock says so). A failed write fails the
    /// filesystem.
    pub(crate) async fn write_leg_table(
        &self,
        what: &str,
        flush: bool,
        change: impl FnOnce(&mut Superblock) -> bool,
    ) -> FsResult<()> {
        // No checkpoint may write a superblock meanwhile (generations must not repeat).
        let _guard = self.checkpoint_lock.lock().await;
        {
            let mut c = self.core.lock();
            if c.failed {
                return Err(Errno::EIO);
            }
            if !change(&mut c.sb) {
                return Ok(());
            }
        }
        let flushed = if flush {
            self.dev.flush().await
        } else {
            Ok(())
        };
        let mut sb = {
            let mut c = self.core.lock();
            if let Err(e) = c.sb.next_generation() {
                log::error!("{what}: no superblock can be written ({e}: at its bound)");
                return Err(Errno::EIO);
            }
            c.sb.clone()
        };
        self.stamp_legs(&mut sb);
        log::info!("{what} (superblock generation {})", sb.generation);
        let written = match flushed {
            Ok(()) => {
                self.dev
                    .write(sb.slot(), &sb.encode(), WriteFlags::FUA)
                    .await
            }
            Err(e) => Err(e),
        };
        let mut c = self.core.lock();
        c.stats.superblock_writes += 1;
        c.stats.flushes += u64::from(flush);
        written.map_err(|e| {
            log::error!("{what}: {e}; filesystem is now failed");
            c.failed = true;
            Errno::EIO
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::superblock::tests::sample;

    #[test]
    fn stamping_marks_failed_legs_for_good() {
        let mut sb = sample();
        sb.legs[..3].copy_from_slice(&[leg::ACTIVE; 3]);
        assert!(!unrecorded(&sb, 0));
        assert!(unrecorded(&sb, 0b100));
        stamp(&mut sb, 0b100);
        assert_eq!(
            &sb.legs[..4],
            &[leg::ACTIVE, leg::ACTIVE, leg::FAILED, leg::NONE]
        );
        assert!(!unrecorded(&sb, 0b100));
        stamp(&mut sb, 0);
        assert_eq!(sb.legs[2], leg::FAILED);
        // A single device has no table to stamp.
        let mut single = sample();
        stamp(&mut single, 1);
        assert_eq!(single.leg_count(), 0);
    }
}
