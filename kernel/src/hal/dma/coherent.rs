//! [`DmaCoherent`]: memory a device and the CPU share for as long as both live.

use core::fmt;

use super::{DmaDevice, DmaValue, Frames};
use crate::mm::frames::OutOfFrames;

/// Zeroed, page-aligned, physically contiguous memory shared with one device: submission
/// and completion queues, doorbell pages, command data pages, per-request headers. Both
/// sides may access it at any time, so the CPU does so only with volatile accesses;
/// ordering against the device is the driver's (fences around doorbells and phase bits).
///
/// Its device address is always available ([`DmaCoherent::device_addr`]): the memory is
/// never freed while its device may reach it, because dropping it while the device masters
/// the bus parks it with the [`DmaDevice`] until bus mastering is off.
pub struct DmaCoherent {
    frames: Frames,
    device: DmaDevice,
}

impl fmt::Debug for DmaCoherent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaCoherent({:#x}+{:#x})", self.frames.addr, self.len())
    }
}

impl DmaCoherent {
    /// At least `len` bytes (whole pages), zeroed, for `device`.
    pub fn alloc(device: &DmaDevice, len: usize) -> Result<DmaCoherent, OutOfFrames> {
        Ok(DmaCoherent {
            frames: Frames::zeroed(device, len)?,
            device: device.clone(),
        })
    }

    /// Size in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Never true: there is at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address to give the device.
    pub fn device_addr(&self) -> u64 {
        self.frames.addr
    }

    /// The device it belongs to.
    pub fn device(&self) -> &DmaDevice {
        &self.device
    }

    /// Volatile read of a `T` at byte `offset` (naturally aligned), e.g. a completion
    /// entry the device may have written.
    pub fn read<T: DmaValue>(&self, offset: usize) -> T {
        let p = self.check::<T>(offset) as *const T;
        // SAFETY: `check` proved the access aligned and inside our frames, which are ours
        // until dropped and identity-mapped; `T` is a plain integer, valid for any bit
        // pattern the device left there.
        unsafe { p.read_volatile() }
    }

    /// Volatile write of a `T` at byte `offset` (naturally aligned).
    pub fn write<T: DmaValue>(&self, offset: usize, value: T) {
        let p = self.check::<T>(offset) as *mut T;
        // SAFETY: as for reads; the memory is ours and writable, and no Rust reference to
        // it exists (it is only ever accessed through these volatile operations).
        unsafe { p.write_volatile(value) }
    }

    /// Copies `dst.len()` bytes from `offset` (volatile reads).
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) {
        self.check_range(offset, dst.len());
        for (i, b) in dst.iter_mut().enumerate() {
            *b = self.read::<u8>(offset + i);
        }
    }

    /// Copies `src` to `offset` (volatile writes).
    pub fn write_bytes(&self, offset: usize, src: &[u8]) {
        self.check_range(offset, src.len());
        for (i, b) in src.iter().enumerate() {
            self.write::<u8>(offset + i, *b);
        }
    }

    /// Zeroes `len` bytes from `offset`.
    pub fn zero(&self, offset: usize, len: usize) {
        self.check_range(offset, len);
        let mut at = offset;
        while at < offset + len {
            if at.is_multiple_of(8) && at + 8 <= offset + len {
                self.write::<u64>(at, 0);
                at += 8;
            } else {
                self.write::<u8>(at, 0);
                at += 1;
            }
        }
    }

    fn check<T>(&self, offset: usize) -> u64 {
        let size = core::mem::size_of::<T>();
        assert!(
            offset.is_multiple_of(core::mem::align_of::<T>())
                && offset
                    .checked_add(size)
                    .is_some_and(|end| end <= self.len()),
            "bad DMA access: {size} bytes at {offset:#x} in {self:?}"
        );
        self.frames.addr + offset as u64
    }

    fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len()),
            "DMA range {offset:#x}+{len:#x} outside {self:?}"
        );
    }
}

impl Drop for DmaCoherent {
    fn drop(&mut self) {
        self.device.retire(self.frames.take());
    }
}
