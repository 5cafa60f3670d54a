//! [`DmaStream`] and [`LentStream`]: data buffers that are either the CPU's or the
//! device's, never both.

use core::fmt;
use core::sync::atomic::{fence, Ordering};

use super::{DmaDevice, Frames};
use crate::mm::frames::OutOfFrames;

/// A data buffer for transfers with one device: page-aligned, physically contiguous. While
/// it is a `DmaStream` it belongs to the CPU alone (the device has never been given its
/// address, or has handed it back), so it reads and writes like any slice. To transfer,
/// [`lend`](DmaStream::lend) it: only the [`LentStream`] has a device address.
pub struct DmaStream {
    frames: Frames,
    len: usize,
    device: DmaDevice,
}

impl fmt::Debug for DmaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaStream({:#x}+{:#x})", self.frames.addr, self.len)
    }
}

impl DmaStream {
    /// `len` zeroed bytes for `device`.
    pub fn alloc(device: &DmaDevice, len: usize) -> Result<DmaStream, OutOfFrames> {
        Ok(DmaStream {
            frames: Frames::zeroed(device, len)?,
            len,
            device: device.clone(),
        })
    }

    /// A copy of `data` for `device` (a transfer to the device; only the part of the last
    /// page past the data is zeroed).
    pub fn copy_of(device: &DmaDevice, data: &[u8]) -> Result<DmaStream, OutOfFrames> {
        let mut stream = DmaStream {
            frames: Frames::uninit(device, data.len())?,
            len: data.len(),
            device: device.clone(),
        };
        let (copy, tail) = stream.whole_mut().split_at_mut(data.len());
        copy.copy_from_slice(data);
        tail.fill(0);
        Ok(stream)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most bytes it can hold (whole pages).
    pub fn capacity(&self) -> usize {
        self.frames.len()
    }

    /// Makes it `len` bytes long, for reuse. The bytes keep what they held.
    ///
    /// # Panics
    /// If `len` is above [`DmaStream::capacity`].
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "{len} bytes in {self:?}");
        self.len = len;
    }

    /// The device it is for.
    pub fn device(&self) -> &DmaDevice {
        &self.device
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the frames are ours until dropped, identity-mapped and at least `len`
        // bytes long, and no device has their address (it is only handed out by
        // `LentStream`, which a `DmaStream` is not).
        unsafe { core::slice::from_raw_parts(self.frames.addr as *const u8, self.len) }
    }

    /// The contents, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.whole_mut()[..len]
    }

    fn whole_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, over every byte of the frames; `&mut self` makes this
        // the only reference.
        unsafe { core::slice::from_raw_parts_mut(self.frames.addr as *mut u8, self.frames.len()) }
    }

    /// Hands the buffer to the device: from now on only its address exists for the CPU
    /// side, until [`LentStream::reclaim`].
    pub fn lend(self) -> LentStream {
        // The CPU's writes must be in memory before the device can be told of the buffer.
        fence(Ordering::SeqCst);
        self.device.bump(|s| {
            s.lent += 1;
            s.lends += 1;
        });
        LentStream { stream: self }
    }
}

/// A [`DmaStream`] the device may be using. It only offers the buffer's device address
/// and length: the CPU can neither access nor free the memory. Dropping it (or its owner:
/// an abandoned request, a queue being torn down) parks the memory with its
/// [`DmaDevice`] until bus mastering is off; `mem::forget` leaks it. Either way the
/// device never writes into memory that has another owner.
pub struct LentStream {
    stream: DmaStream,
}

impl fmt::Debug for LentStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LentStream({:#x}+{:#x})",
            self.stream.frames.addr, self.stream.len
        )
    }
}

impl LentStream {
    /// The address to give the device.
    pub fn device_addr(&self) -> u64 {
        self.stream.frames.addr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.stream.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.stream.len == 0
    }

    /// The device it is lent to.
    pub fn device(&self) -> &DmaDevice {
        &self.stream.device
    }

    /// Takes the buffer back. Only once the device has handed it back: its completion was
    /// seen, or its bus mastering is off ([`DmaDevice::stop`]).
    pub fn reclaim(mut self) -> DmaStream {
        // The device's writes are seen before the CPU reads the buffer.
        fence(Ordering::SeqCst);
        let s = &mut self.stream;
        let stream = DmaStream {
            frames: s.frames.take(),
            len: s.len,
            device: s.device.clone(),
        };
        stream.device.bump(|s| s.lent -= 1);
        stream
    }
}

impl Drop for LentStream {
    fn drop(&mut self) {
        let frames = self.stream.frames.take();
        if frames.pages == 0 {
            return; // reclaimed
        }
        let device = &self.stream.device;
        device.bump(|s| s.lent -= 1);
        device.retire(frames);
    }
}
