//! The leg table of a mirrored volume's superblock, kept true by the engine: every
//! superblock written records the legs out of service ([`stamp`]), and a leg taken out
//! of service since the last one is recorded before a log commit that followed is
//! acknowledged ([`Engine::record_failed_legs`]). Which legs a mount trusts, and the
//! rebuild of a replaced leg, are `features::redundancy`'s.

use crate::engine::Engine;
use crate::format::superblock::{leg, Superblock};
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
pub(crate) fn unrecorded(sb: &Superblock, failed: u64) -> bool {
    let count = sb.leg_count();
    sb.legs[..count]
        .iter()
        .enumerate()
        .any(|(i, &s)| failed & 1 << i != 0 && s != leg::FAILED)
}

impl<D: BlockDevice> Engine<D> {
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
