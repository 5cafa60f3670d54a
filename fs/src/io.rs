//! The filesystem's view of a block device: 4 KiB filesystem blocks, whatever the
//! device's logical block size, and requests split to the device's transfer limit.

use crate::format::{BLOCK_SHIFT, BLOCK_SIZE};
use block::{BlockDevice, IoError, WriteFlags};

/// A block device addressed in filesystem blocks.
#[derive(Debug)]
pub struct Dev<D> {
    dev: D,
    /// log2(filesystem block / device block).
    shift: u32,
    /// Largest transfer, in bytes (a multiple of the filesystem block).
    max_bytes: usize,
}

/// Why a device cannot hold a filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevError {
    /// The device's logical block is larger than 4 KiB or not a power of two.
    BlockSize(u32),
    /// The device cannot transfer a whole filesystem block at once.
    MaxTransfer(u32),
}

impl<D: BlockDevice> Dev<D> {
    /// Wraps `dev`.
    pub fn new(dev: D) -> Result<Dev<D>, DevError> {
        let g = dev.geometry();
        if !g.block_size.is_power_of_two()
            || g.block_size as usize > BLOCK_SIZE
            || g.block_size < 512
        {
            return Err(DevError::BlockSize(g.block_size));
        }
        if (g.max_transfer as usize) < BLOCK_SIZE {
            return Err(DevError::MaxTransfer(g.max_transfer));
        }
        Ok(Dev {
            dev,
            shift: BLOCK_SHIFT - g.block_size.trailing_zeros(),
            max_bytes: g.max_transfer as usize / BLOCK_SIZE * BLOCK_SIZE,
        })
    }

    /// The underlying device.
    pub fn inner(&self) -> &D {
        &self.dev
    }

    /// Consumes the wrapper.
    pub fn into_inner(self) -> D {
        self.dev
    }

    /// Capacity in filesystem blocks.
    pub fn blocks(&self) -> u64 {
        self.dev.geometry().num_blocks >> self.shift
    }

    /// Reads `buf.len()` bytes (a multiple of 4 KiB) from filesystem block `block`.
    pub async fn read(&self, block: u64, buf: &mut [u8]) -> Result<(), IoError> {
        debug_assert!(buf.len().is_multiple_of(BLOCK_SIZE));
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_bytes);
            let b = block + (done / BLOCK_SIZE) as u64;
            self.dev
                .read(b << self.shift, &mut buf[done..done + n])
                .await?;
            done += n;
        }
        Ok(())
    }

    /// Writes `buf` (a multiple of 4 KiB) at filesystem block `block`.
    pub async fn write(&self, block: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        debug_assert!(buf.len().is_multiple_of(BLOCK_SIZE));
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_bytes);
            let b = block + (done / BLOCK_SIZE) as u64;
            self.dev
                .write(b << self.shift, &buf[done..done + n], flags)
                .await?;
            done += n;
        }
        Ok(())
    }

    /// Makes completed writes durable.
    pub async fn flush(&self) -> Result<(), IoError> {
        self.dev.flush().await
    }

    /// Tells the device that `blocks` filesystem blocks from `block` hold nothing.
    pub async fn discard(&self, block: u64, blocks: u64) -> Result<(), IoError> {
        self.dev
            .discard(block << self.shift, blocks << self.shift)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDisk;

    #[test]
    fn converts_512_byte_sectors_and_splits() {
        let dev = Dev::new(MemDisk::new(512, 64 * 8)).unwrap();
        assert_eq!(dev.blocks(), 64);
        let data: alloc::vec::Vec<u8> = (0..3 * BLOCK_SIZE).map(|i| i as u8).collect();
        pollster::block_on(dev.write(5, &data, WriteFlags::NONE)).unwrap();
        let mut back = alloc::vec![0u8; 3 * BLOCK_SIZE];
        pollster::block_on(dev.read(5, &mut back)).unwrap();
        assert_eq!(back, data);
        assert_eq!(dev.inner().snapshot()[5 * BLOCK_SIZE], 0);
        assert!(Dev::new(MemDisk::new(8192, 4)).is_err());
    }
}
