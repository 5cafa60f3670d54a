//! Memory that devices read and write (DMA).
//!
//! The kernel identity-maps RAM, so the address a device must be given for a buffer is the
//! buffer's own address: [`DmaBuffer::phys_addr`], or [`phys_addr_of`] for any kernel
//! memory (a heap `Vec`, say; virtually contiguous kernel memory is physically contiguous).
//! x86 DMA is cache-coherent, so no cache maintenance is needed; drivers order their
//! accesses against the device with fences and volatile reads/writes of shared structures.

use core::fmt;

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

/// The physical (bus) address of kernel memory at `ptr` (identity mapping).
pub fn phys_addr_of<T: ?Sized>(ptr: *const T) -> u64 {
    ptr as *const u8 as u64
}

/// Zeroed, page-aligned, physically contiguous memory owned by the kernel and shared with a
/// device; freed on drop. Drop it only once the device can no longer access it.
pub struct DmaBuffer {
    addr: u64,
    pages: usize,
}

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaBuffer({:#x}+{:#x})", self.addr, self.len())
    }
}

impl DmaBuffer {
    /// At least `len` bytes (rounded up to whole pages), zeroed.
    pub fn new(len: usize) -> Result<DmaBuffer, OutOfFrames> {
        Self::with_alignment(len, PAGE_SIZE as usize)
    }

    /// Like [`DmaBuffer::new`], aligned to `align` bytes (a power of two, at least a page).
    pub fn with_alignment(len: usize, align: usize) -> Result<DmaBuffer, OutOfFrames> {
        let pages = len.max(1).div_ceil(PAGE_SIZE as usize);
        let align_frames = (align / PAGE_SIZE as usize).max(1);
        let addr = memory::alloc_zeroed_frames(pages, align_frames)?;
        Ok(DmaBuffer { addr, pages })
    }

    /// The address to give the device.
    pub fn phys_addr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.pages * PAGE_SIZE as usize
    }

    /// Never true: a buffer has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The contents. Only meaningful while the device is not writing to the buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the frames are ours until drop, identity-mapped, and `len` bytes long.
        unsafe { core::slice::from_raw_parts(self.addr as *const u8, self.len()) }
    }

    /// The contents, mutably. Only while the device is not accessing the buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes this the only reference from the CPU side.
        unsafe { core::slice::from_raw_parts_mut(self.addr as *mut u8, self.len()) }
    }

    /// A raw pointer to the start, for structures shared with a running device (access
    /// with volatile operations).
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Volatile read of a `T` at byte `offset` (naturally aligned), e.g. a completion entry
    /// the device may have written.
    pub fn read_volatile<T: DmaValue>(&self, offset: usize) -> T {
        let p = self.check::<T>(offset) as *const T;
        // SAFETY: `check` proved the access aligned and inside our frames; `T` is a plain
        // integer, valid for any bit pattern the device left there.
        unsafe { p.read_volatile() }
    }

    /// Volatile write of a `T` at byte `offset` (naturally aligned).
    pub fn write_volatile<T: DmaValue>(&self, offset: usize, value: T) {
        let p = self.check::<T>(offset) as *mut T;
        // SAFETY: as for reads; the memory is ours and writable.
        unsafe { p.write_volatile(value) }
    }

    fn check<T>(&self, offset: usize) -> u64 {
        let size = core::mem::size_of::<T>();
        assert!(
            offset.is_multiple_of(core::mem::align_of::<T>()) && offset + size <= self.len(),
            "bad DMA buffer access: {size} bytes at {offset:#x} in {self:?}"
        );
        self.addr + offset as u64
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        memory::free_frames(self.addr, self.pages);
    }
}
