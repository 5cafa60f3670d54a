//! Redundancy: the legs of a mirrored volume, the rebuild of a replaced leg, scrub.

pub(crate) mod legs;
pub mod rebuild;
pub mod scrub;

use alloc::sync::Arc;
use spin::Mutex;

use crate::engine::Engine;
use block::BlockDevice;

/// Redundancy, the service: the rebuild of a replaced leg and the scrub passes, each
/// with its state, over the engine (the leg table a superblock records is the
/// engine's, `engine::legs`).
pub(crate) struct Redundancy<D: BlockDevice> {
    pub(crate) engine: Arc<Engine<D>>,
    /// The running or last scrub pass.
    pub(crate) scrub: Mutex<scrub::ScrubState>,
    /// The rebuild of a replaced leg going on ([`rebuild`]).
    pub(crate) rebuild: Mutex<Option<rebuild::Rebuild>>,
    /// Blocks a rebuild copies between two records of its cursor
    /// ([`MountOptions::rebuild_record_blocks`](crate::volume::MountOptions::rebuild_record_blocks)).
    pub(crate) rebuild_record_blocks: u64,
}

impl<D: BlockDevice> Redundancy<D> {
    pub(crate) fn new(engine: Arc<Engine<D>>, rebuild_record_blocks: u64) -> Redundancy<D> {
        Redundancy {
            engine,
            scrub: Mutex::new(scrub::ScrubState::default()),
            rebuild: Mutex::new(None),
            rebuild_record_blocks: rebuild_record_blocks.max(1),
        }
    }
}
