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
//! - **The leg table stays true** (the engine's part, `engine::legs`). Every superblock
//!   written records the legs out of service
//!   ([`stamp`](crate::engine::legs::stamp)); and a leg taken out of service since the
//!   last one is recorded with a superblock of its own before a log commit that
//!   followed is acknowledged
//!   ([`Engine::record_failed_legs`](crate::engine::Engine::record_failed_legs)), so a
//!   leg that missed acknowledged writes can never pass for current after a crash.
//! - **A leg being rebuilt** (`rebuild`) is written with every write but never read;
//!   the table says so ([`leg::REBUILDING`]) with how far its copy has come, and a
//!   mount puts it back to being rebuilt if it is present and no more than one
//!   generation behind. One that fails, or is missing, is marked failed like any leg,
//!   and its copy is forgotten (a later replacement starts over).

use alloc::vec::Vec;

use crate::engine::mount::{read_superblock_copy, MountError};
use crate::format::superblock::{leg, Superblock};
use crate::io::Dev;
use block::BlockDevice;

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

/// Reads both superblock copies and returns the valid one with the highest generation,
/// with the validity of each copy. On a mirror, of every leg in service; legs found
/// stale are taken out of service (see the module documentation).
pub async fn read_superblock<D: BlockDevice>(
    dev: &Dev<D>,
) -> Result<(Superblock, [bool; 2]), MountError> {
    if dev.copies() > 1 {
        return choose(dev).await;
    }
    read_superblock_copy(dev, None).await
}
