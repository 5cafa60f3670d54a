//! Physical memory: the memory map, the frame allocator and (on the appliance) the heap,
//! page tables and DMA buffers, which live in `hal`.
//!
//! The kernel identity-maps RAM: a physical address is also the virtual address of the same
//! byte. So a heap buffer's address is its DMA address (and a virtually contiguous buffer is
//! physically contiguous), and device MMIO is mapped at its physical address too.

pub mod frames;
pub mod memmap;
pub mod ranges;

/// The page (and frame) size.
pub const PAGE_SIZE: u64 = 4096;

#[cfg(target_os = "none")]
pub mod setup;

#[cfg(target_os = "none")]
pub use crate::hal::dma::{phys_addr_of, DmaBuffer};
