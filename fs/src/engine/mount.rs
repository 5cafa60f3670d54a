//! What mounting needs of the engine: why a mount fails, reading the superblock copies
//! and the bitmap slots, and starting a writable mount's log epoch.

use alloc::vec;

use crate::core::checkpoint::CheckpointCause;
use crate::engine::Engine;
use crate::format::bitmap::GroupBlock;
use crate::format::layout::SUPERBLOCK_BLOCKS;
use crate::format::superblock::{next_seq, Superblock};
use crate::format::{features, Corrupt, BLOCK_SIZE};
use crate::io::{Dev, DevError};
use block::{BlockDevice, WriteFlags};
use vfs::Errno;

/// Why a mount failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountError {
    /// The device cannot hold a filesystem.
    Device(DevError),
    /// Reading the superblocks failed.
    Io(block::IoError),
    /// Neither superblock copy is valid.
    /// No superblock copy is valid; with why the last one read was refused (a checksum,
    /// a field out of its bounds).
    NoSuperblock(Option<Corrupt>),
    /// The filesystem uses features this code does not know.
    Features(u64),
    /// The device is smaller than the filesystem.
    TooSmall,
    /// Something else failed while mounting (recovery, orphan cleanup).
    Errno(Errno),
    /// The superblock names this many legs, not as many as the device has copies.
    Legs(usize),
    /// Legs are out of service (bit `i`: leg `i`) and
    /// [`MountOptions::refuse_degraded`](crate::volume::MountOptions::refuse_degraded) is set.
    Degraded(u64),
    /// This field (a sequence or counter) has less than
    /// [`SEQ_HEADROOM`](crate::format::superblock::SEQ_HEADROOM) left below its bound
    /// ([`MAX_SEQ`](crate::format::superblock::MAX_SEQ)), so a writable mount could not
    /// run (its checkpoints and superblocks would reach the bound); nothing was written.
    /// The filesystem can still be mounted read-only.
    Exhausted(Corrupt),
}

impl ::core::fmt::Display for MountError {
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
        match self {
            MountError::Device(e) => write!(f, "unusable device: {e:?}"),
            MountError::Io(e) => write!(f, "reading the superblocks: {e}"),
            MountError::NoSuperblock(None) => f.write_str("no valid superblock"),
            MountError::NoSuperblock(Some(why)) => write!(f, "no valid superblock ({why})"),
            MountError::Features(bits) => write!(f, "unknown incompatible features {bits:#x}"),
            MountError::TooSmall => f.write_str("device smaller than the filesystem"),
            MountError::Errno(e) => write!(f, "mount failed: {e}"),
            MountError::Legs(n) => write!(f, "the volume has {n} legs, not as many as given"),
            MountError::Degraded(mask) => {
                write!(f, "legs out of service (mask {mask:#x}): refused")
            }
            MountError::Exhausted(what) => write!(
                f,
                "{what}: at its bound (within 2^32 of 2^62), a writable mount could not run; mount read-only"
            ),
        }
    }
}

/// [`read_superblock`](crate::volume::read_superblock) of the device (`None`) or of one copy.
pub(crate) async fn read_superblock_copy<D: BlockDevice>(
    dev: &Dev<D>,
    copy: Option<usize>,
) -> Result<(Superblock, [bool; 2]), MountError> {
    let mut best: Option<Superblock> = None;
    let mut valid = [false; 2];
    let mut refused = None;
    for (i, &b) in SUPERBLOCK_BLOCKS.iter().enumerate() {
        let mut buf = vec![0u8; BLOCK_SIZE];
        match copy {
            None => dev.read(b, &mut buf).await,
            Some(c) => dev.read_copy(c, b, &mut buf).await,
        }
        .map_err(MountError::Io)?;
        match Superblock::decode(&buf) {
            Ok(sb) => {
                valid[i] = true;
                if best.as_ref().is_none_or(|x| sb.generation > x.generation) {
                    best = Some(sb);
                }
            }
            Err(e) => {
                log::warn!("superblock copy {i} at block {b}: {e}");
                refused = Some(e);
            }
        }
    }
    best.map(|sb| (sb, valid))
        .ok_or(MountError::NoSuperblock(refused))
}

/// Chooses the committed version of a bitmap group from its two slots: the valid one
/// with the highest sequence not above `committed`. With `strict`, an invalid slot is
/// corruption (after a clean shutdown or recovery both slots are always valid).
pub fn choose_group(
    slots: &[u8],
    group: u32,
    committed: u64,
    strict: bool,
) -> Result<(GroupBlock, usize), &'static str> {
    let mut best: Option<(GroupBlock, usize)> = None;
    for slot in 0..2 {
        match GroupBlock::decode(&slots[slot * BLOCK_SIZE..(slot + 1) * BLOCK_SIZE], group) {
            Ok(g) if g.seq <= committed => {
                if best.as_ref().is_none_or(|(b, _)| g.seq > b.seq) {
                    best = Some((g, slot));
                }
            }
            Ok(_) => {}
            // A checksum, the group number or a free count its bits do not show.
            Err(_) if strict => return Err("bitmap slot invalid"),
            Err(_) => {}
        }
    }
    best.ok_or("no committed bitmap slot")
}

/// The mount count and log epoch (the next generation) a writable mount of `sb`
/// writes: each one more. Every sequence and counter must have
/// [`SEQ_HEADROOM`](crate::format::superblock::SEQ_HEADROOM) left below its bound
/// ([`MAX_SEQ`](crate::format::superblock::MAX_SEQ)) for the mount to run, as fsck
/// checks. `Exhausted` otherwise: the filesystem can still be mounted read-only.
pub(crate) fn next_epoch(sb: &Superblock) -> Result<(u64, u64), MountError> {
    let exhausted = |field| MountError::Exhausted(Corrupt::Field(field));
    if let Some((field, _)) = sb.exhausted() {
        return Err(exhausted(field));
    }
    let mount_count = next_seq(sb.mount_count).ok_or(exhausted("mount_count"))?;
    let epoch = next_seq(sb.generation).ok_or(exhausted("generation"))?;
    Ok((mount_count, epoch))
}

impl<D: BlockDevice> Engine<D> {
    /// Starts this mount's log epoch with the log empty at `end` (where replay stopped),
    /// and commits it: with a checkpoint when replay changed the trees, else with a
    /// superblock write.
    pub(crate) async fn start_epoch(&self, end: u64, replayed: bool) -> Result<(), MountError> {
        // The next superblock written gets generation + 1: that is the new epoch,
        // unique to this mount, so no block written to the log before (by an
        // earlier mount, torn or not) is ever taken for one of this mount's.
        let epoch = {
            let mut c = self.core.lock();
            let (mount_count, epoch) = next_epoch(&c.sb)?;
            c.sb.mount_count = mount_count;
            c.sb.state = 0;
            c.sb.incompat |= features::INCOMPAT_LOG;
            c.sb.log_epoch = epoch;
            c.sb.log_tail = end;
            epoch
        };
        {
            let mut l = self.log.lock();
            l.epoch = epoch;
            l.head = end;
            l.tail = end;
        }
        if replayed {
            return self
                .checkpoint(CheckpointCause::Replay)
                .await
                .map_err(MountError::Errno);
        }
        let mut sb = {
            let mut c = self.core.lock();
            c.sb.generation = epoch;
            c.sb.clone()
        };
        self.stamp_legs(&mut sb);
        self.dev
            .write(sb.slot(), &sb.encode(), WriteFlags::FUA)
            .await
            .map_err(MountError::Io)
    }
}
