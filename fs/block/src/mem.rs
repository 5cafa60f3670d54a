//! A block device backed by memory: for tests, simulations and tools.

use alloc::vec;
use alloc::vec::Vec;

use spin::Mutex;

use super::{check_request, BlockDevice, Geometry, IoError, WriteFlags};

/// A RAM disk. Every completed write is immediately "durable" (there is no cache to lose);
/// tests that need volatile-cache semantics wrap it in a simulating device.
#[derive(Debug)]
pub struct MemDisk {
    geometry: Geometry,
    data: Mutex<Vec<u8>>,
}

impl MemDisk {
    /// A zero-filled disk of `num_blocks` blocks of `block_size` bytes.
    pub fn new(block_size: u32, num_blocks: u64) -> MemDisk {
        let bytes = usize::try_from(num_blocks * u64::from(block_size))
            .expect("memory disk larger than the address space");
        MemDisk::from_bytes(block_size, vec![0; bytes])
    }

    /// A disk holding `bytes` (whose length must be a multiple of `block_size`).
    pub fn from_bytes(block_size: u32, bytes: Vec<u8>) -> MemDisk {
        assert!(block_size.is_power_of_two() && block_size >= 512);
        assert!(bytes.len().is_multiple_of(block_size as usize));
        MemDisk {
            geometry: Geometry {
                block_size,
                num_blocks: (bytes.len() / block_size as usize) as u64,
                max_transfer: 1 << 20,
                native_fua: true,
                volatile_cache: false,
                discard: true,
            },
            data: Mutex::new(bytes),
        }
    }

    /// A copy of the whole disk content.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().clone()
    }

    /// Runs `f` over the whole disk content (e.g. to corrupt it in a test).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.data.lock())
    }

    fn byte_range(&self, lba: u64, len: usize) -> Result<core::ops::Range<usize>, IoError> {
        check_request(&self.geometry, lba, len)?;
        let start = (lba * u64::from(self.geometry.block_size)) as usize;
        Ok(start..start + len)
    }
}

impl BlockDevice for MemDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let range = self.byte_range(lba, buf.len())?;
        buf.copy_from_slice(&self.data.lock()[range]);
        Ok(())
    }

    async fn write(&self, lba: u64, buf: &[u8], _flags: WriteFlags) -> Result<(), IoError> {
        let range = self.byte_range(lba, buf.len())?;
        self.data.lock()[range].copy_from_slice(buf);
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        let len = blocks
            .checked_mul(u64::from(self.geometry.block_size))
            .ok_or(IoError::OutOfRange)?;
        let end_lba = lba.checked_add(blocks).ok_or(IoError::OutOfRange)?;
        if end_lba > self.geometry.num_blocks {
            return Err(IoError::OutOfRange);
        }
        let start = (lba * u64::from(self.geometry.block_size)) as usize;
        self.data.lock()[start..start + len as usize].fill(0);
        Ok(())
    }
}
