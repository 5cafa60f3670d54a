//! [`CrashDisk`]: a crash state as a copy-on-write overlay over the base image, so that a
//! state costs a few map entries instead of a copy of the disk.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;

use spin::Mutex;

use block::{check_request, BlockDevice, Geometry, IoError, MemDisk, WriteFlags};

/// One block's bytes inside a shared buffer (a recorded write, or a torn block).
#[derive(Clone, Debug)]
pub struct BlockRef {
    data: Arc<[u8]>,
    offset: usize,
}

impl BlockRef {
    /// Block `index` of `data` (blocks of `block_size` bytes).
    pub fn new(data: Arc<[u8]>, index: usize, block_size: usize) -> BlockRef {
        assert!((index + 1) * block_size <= data.len());
        BlockRef {
            data,
            offset: index * block_size,
        }
    }

    /// The bytes.
    pub fn bytes(&self, block_size: usize) -> &[u8] {
        &self.data[self.offset..self.offset + block_size]
    }
}

/// Blocks that differ from the base image: lba → content.
pub type Layer = BTreeMap<u64, BlockRef>;

/// A disk showing `base`, overlaid by a shared `durable` layer, overlaid by this state's
/// own `extra` blocks. Writes (by the mount, log replay or fsck that examine the state)
/// go to a private map, so states never affect each other.
#[derive(Debug)]
pub struct CrashDisk {
    geometry: Geometry,
    base: Arc<[u8]>,
    durable: Arc<Layer>,
    extra: Layer,
    own: Mutex<BTreeMap<u64, Box<[u8]>>>,
}

impl CrashDisk {
    /// A state over `base` (the whole image, `geometry.num_blocks` blocks).
    pub fn new(
        geometry: Geometry,
        base: Arc<[u8]>,
        durable: Arc<Layer>,
        extra: Layer,
    ) -> CrashDisk {
        assert_eq!(base.len() as u64, geometry.capacity_bytes());
        CrashDisk {
            geometry: Geometry {
                volatile_cache: false,
                ..geometry
            },
            base,
            durable,
            extra,
            own: Mutex::new(BTreeMap::new()),
        }
    }

    fn bs(&self) -> usize {
        self.geometry.block_size as usize
    }

    /// Copies block `lba` into `out`.
    fn read_block(&self, lba: u64, own: &BTreeMap<u64, Box<[u8]>>, out: &mut [u8]) {
        let bs = self.bs();
        if let Some(b) = own.get(&lba) {
            out.copy_from_slice(b);
        } else if let Some(b) = self.extra.get(&lba).or_else(|| self.durable.get(&lba)) {
            out.copy_from_slice(b.bytes(bs));
        } else {
            let start = lba as usize * bs;
            out.copy_from_slice(&self.base[start..start + bs]);
        }
    }

    /// The whole content as a [`MemDisk`] (for tools that want a plain image).
    pub fn to_mem_disk(&self) -> MemDisk {
        let mut bytes = alloc::vec![0u8; self.base.len()];
        let own = self.own.lock();
        for (i, chunk) in bytes.chunks_mut(self.bs()).enumerate() {
            self.read_block(i as u64, &own, chunk);
        }
        MemDisk::from_bytes(self.geometry.block_size, bytes)
    }

    /// Number of blocks this state differs from the base in (before any writes to it).
    pub fn overlay_blocks(&self) -> usize {
        let mut n = self.durable.len();
        n += self
            .extra
            .keys()
            .filter(|b| !self.durable.contains_key(b))
            .count();
        n
    }

    /// Blocks written to this state since it was made (by mount, replay, fsck).
    pub fn written_blocks(&self) -> Vec<u64> {
        self.own.lock().keys().copied().collect()
    }
}

impl BlockDevice for CrashDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        let own = self.own.lock();
        for (i, chunk) in buf.chunks_mut(self.bs()).enumerate() {
            self.read_block(lba + i as u64, &own, chunk);
        }
        Ok(())
    }

    async fn write(&self, lba: u64, buf: &[u8], _flags: WriteFlags) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        let mut own = self.own.lock();
        for (i, chunk) in buf.chunks(self.bs()).enumerate() {
            own.insert(lba + i as u64, chunk.into());
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        let end = lba.checked_add(blocks).ok_or(IoError::OutOfRange)?;
        if end > self.geometry.num_blocks {
            return Err(IoError::OutOfRange);
        }
        let zero: Box<[u8]> = alloc::vec![0u8; self.bs()].into();
        let mut own = self.own.lock();
        for b in lba..end {
            own.insert(b, zero.clone());
        }
        Ok(())
    }
}
