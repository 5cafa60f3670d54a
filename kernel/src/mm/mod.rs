//! Physical memory: the memory map, the frame allocator, the heap's policy (per-CPU caches
//! and size-class free lists in front of its allocator) and (on the appliance) the heap
//! itself, page tables and DMA memory, which live in `hal`.
//!
//! The kernel identity-maps RAM: a physical address is also the virtual address of the same
//! byte, so contiguous frames are physically contiguous, and device MMIO is mapped at its
//! physical address too. Devices are only given addresses of `hal::dma` objects.

pub mod frames;
pub mod heap;
pub mod memmap;
pub mod ranges;
pub mod recycle;

/// The page (and frame) size.
pub const PAGE_SIZE: u64 = 4096;

#[cfg(target_os = "none")]
pub mod setup;

#[cfg(target_os = "none")]
pub use crate::hal::dma::{DmaCoherent, DmaDevice, DmaStream, LentStream};
