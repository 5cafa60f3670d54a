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

use alloc::vec::Vec;

use super::{read_superblock_copy, MountError, NineFs};
use crate::format::layout::SUPERBLOCK_BLOCKS;
use crate::format::superblock::{leg, Superblock};
use crate::io::Dev;
use block::{BlockDevice, WriteFlags};
use vfs::{Errno, FsResult};

/// Marks the legs of `failed` (bit `i`: leg `i`) failed in `sb`'s leg table. A failed
/// leg stays failed (only a rebuild brings it back).
pub fn stamp(sb: &mut Superblock, failed: u64) {
    let count = sb.leg_count();
    for (i, state) in sb.legs[..count].iter_mut().enumerate() {
        if failed & 1 << i != 0 {
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
pub(super) async fn choose<D: BlockDevice>(
    dev: &Dev<D>,
) -> Result<(Superblock, [bool; 2]), MountError> {
    let mut found: Vec<(usize, Superblock, [bool; 2])> = Vec::new();
    for c in 0..dev.copies() {
        if dev.failed_copies() & 1 << c != 0 {
            continue;
        }
        match read_superblock_copy(dev, Some(c)).await {
            Ok((sb, valid)) => found.push((c, sb, valid)),
            Err(e) => {
                log::warn!("leg {c}: {e}: taken out of service");
                dev.fail_copy(c);
            }
        }
    }
    let best = found
        .iter()
        .max_by_key(|(_, sb, _)| sb.generation)
        .map(|(_, sb, valid)| (sb.clone(), *valid))
        .ok_or(MountError::NoSuperblock)?;
    let sb = &best.0;
    if sb.leg_count() != dev.copies() {
        return Err(MountError::Legs(sb.leg_count()));
    }
    for (c, own, _) in &found {
        let why = if own.uuid != sb.uuid {
            "another volume's"
        } else if sb.legs[*c] != leg::ACTIVE {
            "out of service since before the current superblock"
        } else if own.generation + 1 < sb.generation {
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
    pub(super) fn stamp_legs(&self, sb: &mut Superblock) {
        let failed = self.dev.failed_copies();
        stamp(sb, failed);
        stamp(&mut self.core.lock().sb, failed);
    }

    /// Writes a superblock recording the legs taken out of service since the last one,
    /// if any were: called after a log commit's flush, before it is acknowledged.
    pub(super) async fn record_failed_legs(&self) -> FsResult<()> {
        if !unrecorded(&self.core.lock().sb, self.dev.failed_copies()) {
            return Ok(());
        }
        // No checkpoint may write a superblock meanwhile (generations must not repeat).
        let _guard = self.checkpoint_lock.lock().await;
        let sb = {
            let mut c = self.core.lock();
            if !unrecorded(&c.sb, self.dev.failed_copies()) {
                return Ok(());
            }
            c.sb.generation += 1;
            c.sb.clone()
        };
        let mut sb = sb;
        self.stamp_legs(&mut sb);
        log::warn!(
            "mirror degraded: legs out of service recorded (superblock generation {})",
            sb.generation
        );
        let slot = SUPERBLOCK_BLOCKS[(sb.generation % 2) as usize];
        let written = self.dev.write(slot, &sb.encode(), WriteFlags::FUA).await;
        let mut c = self.core.lock();
        c.stats.superblock_writes += 1;
        written.map_err(|e| {
            log::error!("recording failed legs: {e}; filesystem is now failed");
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
