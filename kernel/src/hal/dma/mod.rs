//! Memory that devices read and write (DMA), typed by who owns it.
//!
//! Without an IOMMU a device reaches any physical address it is given, so two things keep
//! DMA from corrupting the kernel: a device is only ever given the address of memory set
//! aside for it, and that memory is not freed, reused or read while the device may still
//! use it. This module makes both a matter of types (the model is Asterinas OSTD's
//! `DmaCoherent` and `DmaStream`):
//!
//! - [`DmaDevice`]: one PCI function's permission to master the bus. Every DMA object is
//!   allocated for a device, and memory its device may still reach is never freed: an
//!   object dropped while the device masters the bus is *parked* with the device and freed
//!   once bus mastering is off ([`DmaDevice::stop`], or the last handle dropped).
//! - [`DmaCoherent`]: memory shared with the device for as long as both live (queues,
//!   doorbell pages, command data pages, per-request headers): volatile, typed accesses,
//!   and its device address is always at hand.
//! - [`DmaStream`]: a data buffer the CPU fills before and reads after a transfer. It has
//!   no device address until it is *lent* ([`DmaStream::lend`] → [`LentStream`]); a lent
//!   stream cannot be read, written or freed by the CPU, and dropping or forgetting it
//!   parks its memory instead of freeing it. [`LentStream::reclaim`] turns it back into a
//!   stream once the device has handed it back.
//!
//! There is no function that turns other memory (the heap, a caller's buffer) into a
//! device address: drivers copy data through streams. So dropping or `mem::forget`ting
//! any object (a request future, a driver) can leak memory but never leaves a device
//! writing into memory that something else owns.
//!
//! Two promises the types cannot check, because they depend on the device's protocol,
//! are the driver's: [`LentStream::reclaim`] only after the device has handed the buffer
//! back (its completion was seen, or bus mastering is off), and [`DmaDevice::start`] after
//! a [`DmaDevice::stop`] only once the device was reset (so it holds no earlier address).
//! Register and queue-entry contents are device programming like any other; the module
//! guarantees that every address it hands out stays valid while the device may use it.
//!
//! The kernel identity-maps RAM, so a buffer's device (bus) address is its own address and
//! a buffer in contiguous frames is physically contiguous; x86 DMA is cache-coherent, so
//! lending and reclaiming are memory fences, not cache maintenance.

mod coherent;
mod device;
mod stream;

pub use coherent::DmaCoherent;
pub use device::{DmaDevice, DmaInUse, DmaStats};
pub use stream::{DmaStream, LentStream};

use super::memory;
use crate::mm::frames::OutOfFrames;
use crate::mm::PAGE_SIZE;

/// Plain integers: the types device-shared memory is read and written as (every bit
/// pattern is a valid value).
pub trait DmaValue: Copy + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! dma_values {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl DmaValue for $t {}
    )*};
}
dma_values!(u8, u16, u32, u64);

/// The bus address of kernel memory at `ptr` (identity mapping). Private to the hal: the
/// only memory a device may be given is a DMA object's, and only the hal code that hands
/// such an object to a device (the `virtio-drivers` glue) needs the raw translation.
pub(super) fn bus_addr_of<T: ?Sized>(ptr: *const T) -> u64 {
    ptr as *const u8 as u64
}

/// Physically contiguous frames owned by a DMA object; returned to the frame allocator
/// when dropped. [`Frames::NONE`] owns nothing (what is left after the frames moved on).
#[derive(Debug)]
struct Frames {
    addr: u64,
    pages: usize,
}

impl Frames {
    const NONE: Frames = Frames { addr: 0, pages: 0 };

    /// Enough whole pages for `len` bytes (at least one) for `device`, zeroed.
    fn zeroed(device: &DmaDevice, len: usize) -> Result<Frames, OutOfFrames> {
        Frames::alloc(device, len, memory::alloc_zeroed_frames)
    }

    /// Enough whole pages for `len` bytes for `device`, not zeroed (the caller overwrites
    /// them).
    fn uninit(device: &DmaDevice, len: usize) -> Result<Frames, OutOfFrames> {
        Frames::alloc(device, len, memory::alloc_frames)
    }

    fn alloc(
        device: &DmaDevice,
        len: usize,
        alloc: fn(usize, usize) -> Result<u64, OutOfFrames>,
    ) -> Result<Frames, OutOfFrames> {
        let pages = len.max(1).div_ceil(PAGE_SIZE as usize);
        match alloc(pages, 1) {
            Ok(addr) => Ok(Frames { addr, pages }),
            Err(e) => {
                device.bump(|s| s.alloc_failures += 1);
                Err(e)
            }
        }
    }

    fn len(&self) -> usize {
        self.pages * PAGE_SIZE as usize
    }

    /// Moves the frames out, leaving [`Frames::NONE`].
    fn take(&mut self) -> Frames {
        core::mem::replace(self, Frames::NONE)
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        if self.pages > 0 {
            memory::free_frames(self.addr, self.pages);
        }
    }
}
