//! The `virtio-drivers` crate's [`Hal`]: DMA memory, MMIO mapping and buffer sharing over
//! the kernel's identity-mapped memory.
//!
//! Identity mapping makes this small: a kernel pointer is its bus address, RAM is
//! cache-coherent for devices on x86, and there is no IOMMU, so sharing a buffer with the
//! device is just naming its address.

use core::ptr::NonNull;

use virtio_drivers::{BufferDirection, Hal, PhysAddr};

use super::{dma, memory, paging};

/// The kernel's implementation of [`virtio_drivers::Hal`].
#[derive(Debug)]
pub struct VirtioHal;

// SAFETY: `dma_alloc` returns zeroed, page-aligned, physically contiguous frames that
// nothing else uses until `dma_dealloc` returns them; the identity mapping makes the
// virtual and physical addresses equal (as `share` assumes for any kernel buffer, which is
// physically contiguous because kernel memory is identity-mapped); `mmio_phys_to_virt`
// maps the registers uncached before returning their (identity) address.
unsafe impl Hal for VirtioHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        match memory::alloc_zeroed_frames(pages, 1) {
            Ok(addr) => (
                addr,
                NonNull::new(addr as *mut u8).expect("frame 0 is never allocated"),
            ),
            // virtio-drivers reports a zero physical address as `Error::DmaError`.
            Err(_) => (0, NonNull::dangling()),
        }
    }

    unsafe fn dma_dealloc(paddr: PhysAddr, _vaddr: NonNull<u8>, pages: usize) -> i32 {
        memory::free_frames(paddr, pages);
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, size: usize) -> NonNull<u8> {
        let region = paging::map_mmio(paddr, size as u64)
            .unwrap_or_else(|e| panic!("virtio: mapping MMIO {paddr:#x}+{size:#x}: {e:?}"));
        NonNull::new(region.as_ptr()).expect("MMIO at address 0")
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        dma::phys_addr_of(buffer.as_ptr())
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {
        // Nothing to copy back or unmap: the device wrote the buffer itself.
    }
}
