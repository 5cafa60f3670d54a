//! The global frame allocator.

use crate::mm::frames::{FrameAllocator, FrameStats, OutOfFrames};
use crate::mm::memmap::PhysRanges;
use crate::mm::PAGE_SIZE;
use crate::sync::IrqLock;

static FRAMES: IrqLock<Option<FrameAllocator<'static>>> = IrqLock::new(None);

/// Where the bitmap went, for the boot log.
#[derive(Clone, Copy, Debug)]
pub struct BitmapPlacement {
    /// Physical address of the bitmap.
    pub addr: u64,
    /// Its size in bytes (page-rounded).
    pub bytes: u64,
}

/// Sets up the frame allocator over `usable` (identity-mapped RAM nobody else uses). The
/// bitmap is carved from the first usable range that fits it; that range must be mapped
/// by the current page tables (the early map covers the first 4 GiB, where QEMU and real
/// firmware put plenty of RAM).
///
/// # Panics
/// If called twice or if no range can hold the bitmap.
pub fn init(usable: &PhysRanges) -> BitmapPlacement {
    let end = usable.as_slice().last().map_or(0, |r| r.end);
    let words = FrameAllocator::words_for(end);
    let bytes = (words as u64 * 8).next_multiple_of(PAGE_SIZE);
    let addr = usable
        .as_slice()
        .iter()
        .find(|r| r.end - r.start >= bytes && r.start + bytes <= 1 << 32)
        .map(|r| r.start)
        .expect("no RAM below 4 GiB for the frame bitmap");
    // SAFETY: `addr..addr + bytes` is usable RAM (so identity-mapped, and not used by the
    // kernel image, the loader or firmware), below 4 GiB (so mapped by the early page
    // tables), and is removed from the allocator below, so nothing else will ever use it.
    let bits: &'static mut [u64] =
        unsafe { core::slice::from_raw_parts_mut(addr as *mut u64, words) };
    let mut fa = FrameAllocator::new(bits);
    for r in usable.as_slice() {
        let start = if r.start == addr {
            addr + bytes
        } else {
            r.start
        };
        fa.add_free(start..r.end);
    }
    FRAMES.lock(|f| {
        assert!(f.is_none(), "frame allocator initialised twice");
        *f = Some(fa);
    });
    BitmapPlacement { addr, bytes }
}

/// Allocates `count` physically contiguous frames aligned to `align_frames` frames; the
/// memory is not zeroed. Returns the physical (= virtual) address.
pub fn alloc_frames(count: usize, align_frames: usize) -> Result<u64, OutOfFrames> {
    FRAMES.lock(|f| {
        f.as_mut()
            .expect("frame allocator not initialised")
            .alloc(count, align_frames)
    })
}

/// Like [`alloc_frames`], and zeroes the frames.
pub fn alloc_zeroed_frames(count: usize, align_frames: usize) -> Result<u64, OutOfFrames> {
    let addr = alloc_frames(count, align_frames)?;
    // SAFETY: the frames were just allocated to us, are identity-mapped RAM, and no one
    // else holds a reference to them.
    unsafe { core::ptr::write_bytes(addr as *mut u8, 0, count * PAGE_SIZE as usize) };
    Ok(addr)
}

/// Returns frames from [`alloc_frames`].
pub fn free_frames(addr: u64, count: usize) {
    FRAMES.lock(|f| {
        f.as_mut()
            .expect("frame allocator not initialised")
            .free(addr, count)
    });
}

/// The allocator's counters.
pub fn stats() -> FrameStats {
    FRAMES.lock(|f| f.as_ref().map(|f| f.stats()).unwrap_or_default())
}
