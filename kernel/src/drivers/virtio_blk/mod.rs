//! The virtio-blk driver: [`wire`] (feature bits, configuration, request encoding; pure
//! and host-tested) and, on the appliance, `ring` (requests on a `hal::virtio`
//! virtqueue) and `disk` ([`VirtioBlk`], the block device).

pub mod wire;

#[cfg(target_os = "none")]
mod disk;
#[cfg(target_os = "none")]
mod ring;

#[cfg(target_os = "none")]
pub use disk::{Options, VirtioBlk, VirtioBlkError, VirtioBlkStats};
