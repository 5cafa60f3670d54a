//! The filesystem's view of a block device: 4 KiB filesystem blocks, whatever the
//! device's logical block size, and requests split to the device's transfer limit;
//! verified reads, which on a device with several copies (a mirror) take a copy that
//! passes verification and mend the others; and the data cache ([`DataCache`]), which
//! every write, discard, repair and rebuild copy made here keeps coherent: what the
//! device is told to overwrite or forget, the cache drops.

pub(crate) mod node_read;

use alloc::vec;
use alloc::vec::Vec;

use crate::cache::DataCache;
use crate::format::{BLOCK_SHIFT, BLOCK_SIZE};
use block::{BlockDevice, IoError, WriteFlags};

/// What a verified read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// The buffer holds data that passed verification (every copy checked did).
    Good,
    /// The buffer holds data that passed verification; copies that did not were
    /// rewritten with it.
    Mended,
    /// Every copy read passed no verification: the buffer holds one of them.
    Bad,
}

/// A block device addressed in filesystem blocks.
#[derive(Debug)]
pub struct Dev<D> {
    dev: D,
    /// log2(filesystem block / device block).
    shift: u32,
    /// Largest transfer, in bytes (a multiple of the filesystem block).
    max_bytes: usize,
    /// File data read from the device (off until given room: [`DataCache::set_limits`]).
    cache: DataCache,
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
            cache: DataCache::new(),
        })
    }

    /// The data cache over the device.
    pub fn cache(&self) -> &DataCache {
        &self.cache
    }

    /// Largest transfer, in filesystem blocks (what one rebuild copy,
    /// [`Dev::copy_blocks`], or one readahead read moves at most).
    pub fn max_transfer_blocks(&self) -> u64 {
        (self.max_bytes / BLOCK_SIZE) as u64
    }

    /// Filesystem blocks `buf` spans from `block`.
    fn span(block: u64, buf: &[u8]) -> core::ops::Range<u64> {
        block..block.saturating_add((buf.len() / BLOCK_SIZE) as u64)
    }

    /// The device's address of the byte `done` bytes past filesystem block `block`
    /// (`done` a multiple of 4 KiB): `OutOfRange` past the last address, as a block
    /// number read from a forged image may be, rather than a wrapped one.
    fn lba(&self, block: u64, done: usize) -> Result<u64, IoError> {
        block
            .checked_add((done / BLOCK_SIZE) as u64)
            .and_then(|b| b.checked_mul(1 << self.shift))
            .ok_or(IoError::OutOfRange)
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
        self.read_from(None, block, buf).await
    }

    /// Reads from copy `copy` only (see [`BlockDevice::read_copy`]).
    pub async fn read_copy(&self, copy: usize, block: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.read_from(Some(copy), block, buf).await
    }

    /// [`Dev::read`] from any copy (`None`) or one.
    async fn read_from(
        &self,
        copy: Option<usize>,
        block: u64,
        buf: &mut [u8],
    ) -> Result<(), IoError> {
        debug_assert!(buf.len().is_multiple_of(BLOCK_SIZE));
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_bytes);
            let lba = self.lba(block, done)?;
            let part = &mut buf[done..done + n];
            match copy {
                None => self.dev.read(lba, part).await?,
                Some(c) => self.dev.read_copy(c, lba, part).await?,
            }
            done += n;
        }
        Ok(())
    }

    /// Reads `buf` from `block` and checks it with `good`; when that fails (or the
    /// read does) on a device with several copies, [`Dev::check_copies`]. With one copy
    /// this is a read and a check. `Err` only when nothing could be read.
    pub async fn read_verified(
        &self,
        block: u64,
        buf: &mut [u8],
        good: impl Fn(&[u8]) -> bool,
    ) -> Result<Verified, IoError> {
        let first = self.read(block, buf).await;
        if first.is_ok() && good(buf) {
            return Ok(Verified::Good);
        }
        if self.dev.copies() < 2 {
            return first.map(|()| Verified::Bad);
        }
        self.check_copies(block, buf, good).await
    }

    /// Reads every copy in service of `buf.len()` bytes at `block`, keeps one that
    /// passes `good` in `buf` and writes it over those that did not (a repair, counted
    /// by the device per copy). `Err` only when no copy could be read; `Bad` (the
    /// buffer holding one of them) when none passed.
    pub async fn check_copies(
        &self,
        block: u64,
        buf: &mut [u8],
        good: impl Fn(&[u8]) -> bool,
    ) -> Result<Verified, IoError> {
        let mut scratch = vec![0u8; buf.len()];
        let (mut found, mut read_any, mut last) = (false, false, IoError::Dead);
        let mut bad: Vec<usize> = Vec::new();
        for c in 0..self.dev.copies() {
            if self.unreadable_copies() & 1 << c != 0 {
                continue;
            }
            match self.read_copy(c, block, &mut scratch).await {
                Ok(()) if good(&scratch) => {
                    if !found {
                        buf.copy_from_slice(&scratch);
                    }
                    found = true;
                }
                Ok(()) => {
                    if !found && !read_any {
                        buf.copy_from_slice(&scratch);
                    }
                    read_any = true;
                    bad.push(c);
                }
                Err(e) => {
                    last = e;
                    bad.push(c);
                }
            }
        }
        if !found {
            return if read_any {
                Ok(Verified::Bad)
            } else {
                Err(last)
            };
        }
        let mended = bad.len();
        for c in bad {
            // A repair that fails takes the copy out of service: nothing more to do.
            let _ = self.repair(c, block, buf).await;
        }
        Ok(if mended == 0 {
            Verified::Good
        } else {
            Verified::Mended
        })
    }

    /// Writes `buf`, good, over copy `copy` at `block` (see [`BlockDevice::repair_copy`]).
    async fn repair(&self, copy: usize, block: u64, buf: &[u8]) -> Result<(), IoError> {
        self.write_to(Some(copy), block, buf, WriteFlags::NONE)
            .await
    }

    /// How many copies the device keeps (1 unless it is a mirror).
    pub fn copies(&self) -> usize {
        self.dev.copies()
    }

    /// The copies out of service (bit `i`: copy `i`).
    pub fn failed_copies(&self) -> u64 {
        self.dev.failed_copies()
    }

    /// Takes copy `copy` out of service (found stale).
    pub fn fail_copy(&self, copy: usize) {
        self.dev.fail_copy(copy)
    }

    /// The copies being rebuilt (see [`BlockDevice::rebuilding_copies`]).
    pub fn rebuilding_copies(&self) -> u64 {
        self.dev.rebuilding_copies()
    }

    /// The copies no read may come from: out of service or being rebuilt.
    pub fn unreadable_copies(&self) -> u64 {
        self.dev.failed_copies() | self.dev.rebuilding_copies()
    }

    /// Starts rebuilding copy `copy` ([`BlockDevice::start_rebuild`]).
    pub fn start_rebuild(&self, copy: usize) -> bool {
        self.dev.start_rebuild(copy)
    }

    /// Puts copy `copy`, rebuilt, back in service ([`BlockDevice::finish_rebuild`]).
    pub fn finish_rebuild(&self, copy: usize) {
        self.dev.finish_rebuild(copy)
    }

    /// Opens the copy window over `blocks` filesystem blocks at `block` of copy `copy`
    /// ([`BlockDevice::open_copy_window`]).
    pub fn open_copy_window(&self, copy: usize, block: u64, blocks: u64) -> bool {
        self.dev
            .open_copy_window(copy, block << self.shift, blocks << self.shift)
    }

    /// Writes `buf` (at most [`Dev::max_transfer_blocks`]) over copy `copy`, being rebuilt,
    /// at `block`, within the open window ([`BlockDevice::write_copy`]): `Ok(false)`
    /// when it must be done again.
    pub async fn copy_blocks(&self, copy: usize, block: u64, buf: &[u8]) -> Result<bool, IoError> {
        assert!(buf.len().is_multiple_of(BLOCK_SIZE) && buf.len() <= self.max_bytes);
        let r = self.dev.write_copy(copy, block << self.shift, buf).await;
        self.cache.invalidate(Self::span(block, buf));
        r
    }

    /// Writes `buf` (good, read from the copies in service) at `block` over every copy
    /// being rebuilt, as the rebuild copies (through the copy window): for blocks the
    /// legs in service may hold and the one being rebuilt missed — the last log commit's
    /// data, which replay makes part of the trees after a crash. A copy window a write
    /// keeps disturbing fails it with `Timeout` (at mount nothing else writes).
    pub async fn copy_to_rebuilding(&self, block: u64, buf: &[u8]) -> Result<(), IoError> {
        let rebuilding = self.rebuilding_copies();
        for copy in (0..self.copies()).filter(|c| rebuilding & 1 << c != 0) {
            let mut done = 0;
            while done < buf.len() {
                let n = (buf.len() - done).min(self.max_bytes);
                let at = block + (done / BLOCK_SIZE) as u64;
                let part = &buf[done..done + n];
                let mut tries = 0;
                while !(self.open_copy_window(copy, at, (n / BLOCK_SIZE) as u64)
                    && self.copy_blocks(copy, at, part).await?)
                {
                    tries += 1;
                    if tries == 8 {
                        return Err(IoError::Timeout);
                    }
                }
                done += n;
            }
        }
        Ok(())
    }

    /// Writes `buf` (a multiple of 4 KiB) at filesystem block `block`.
    pub async fn write(&self, block: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        self.write_to(None, block, buf, flags).await
    }

    /// [`Dev::write`] to every copy (`None`), or a repair of one.
    async fn write_to(
        &self,
        copy: Option<usize>,
        block: u64,
        buf: &[u8],
        flags: WriteFlags,
    ) -> Result<(), IoError> {
        debug_assert!(buf.len().is_multiple_of(BLOCK_SIZE));
        // Dropped before (what the write replaces is stale from now on) and after (a
        // fill that read the device while the write was on its way may hold either).
        self.cache.invalidate(Self::span(block, buf));
        let r = self.write_parts(copy, block, buf, flags).await;
        self.cache.invalidate(Self::span(block, buf));
        r
    }

    /// [`Dev::write_to`] in requests of at most the device's transfer limit.
    async fn write_parts(
        &self,
        copy: Option<usize>,
        block: u64,
        buf: &[u8],
        flags: WriteFlags,
    ) -> Result<(), IoError> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_bytes);
            let lba = self.lba(block, done)?;
            let part = &buf[done..done + n];
            match copy {
                None => self.dev.write(lba, part, flags).await?,
                Some(c) => self.dev.repair_copy(c, lba, part).await?,
            }
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
        self.cache.invalidate(block..block.saturating_add(blocks));
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

    #[test]
    fn verified_reads_take_a_good_copy_and_mend_the_bad() {
        use block::MirrorDisk;
        let legs = (0..2).map(|_| Some(MemDisk::new(512, 64 * 8))).collect();
        let dev = Dev::new(MirrorDisk::new(legs).unwrap()).unwrap();
        let leg = |i| dev.inner().leg(i).unwrap();
        // Written long ago; leg 0 has a flipped bit since.
        for i in 0..2 {
            leg(i).with_bytes(|b| b[3 * BLOCK_SIZE..4 * BLOCK_SIZE].fill(7));
        }
        leg(0).with_bytes(|b| b[3 * BLOCK_SIZE + 5] ^= 1);
        let good = |b: &[u8]| b.iter().all(|&x| x == 7);
        let mut buf = alloc::vec![0u8; BLOCK_SIZE];
        let got = pollster::block_on(dev.read_verified(3, &mut buf, good)).unwrap();
        assert_eq!(got, Verified::Mended);
        assert!(good(&buf));
        assert!(
            good(&leg(0).snapshot()[3 * BLOCK_SIZE..4 * BLOCK_SIZE]),
            "mended"
        );
        assert_eq!(dev.inner().legs()[0].repairs, 1);
        // Both bad: said so, nothing written.
        for i in 0..2 {
            leg(i).with_bytes(|b| b[3 * BLOCK_SIZE] = 1);
        }
        let got = pollster::block_on(dev.read_verified(3, &mut buf, good)).unwrap();
        assert_eq!(got, Verified::Bad);
        assert_eq!(dev.inner().legs()[0].repairs, 1);
        // One copy: a read and a check.
        let single = Dev::new(MemDisk::new(512, 64 * 8)).unwrap();
        let got = pollster::block_on(single.read_verified(3, &mut buf, good)).unwrap();
        assert_eq!(got, Verified::Bad);
    }
}
