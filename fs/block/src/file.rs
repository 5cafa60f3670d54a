//! A block device backed by a host file (disk images for tools and the hosted server).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{check_request, BlockDevice, Geometry, IoError, WriteFlags};

/// A disk image file. I/O is synchronous underneath (the futures complete at once);
/// `flush` and FUA writes call `fdatasync`, so durability matches a real device's.
#[derive(Debug)]
pub struct FileDisk {
    file: File,
    geometry: Geometry,
}

impl FileDisk {
    /// Opens an existing image. Its size must be a multiple of `block_size`.
    pub fn open(path: &Path, block_size: u32, writable: bool) -> io::Result<FileDisk> {
        let file = File::options().read(true).write(writable).open(path)?;
        let len = file.metadata()?.len();
        if !block_size.is_power_of_two() || block_size < 512 || len % u64::from(block_size) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("image size {len} is not a multiple of the block size {block_size}"),
            ));
        }
        Ok(FileDisk {
            file,
            geometry: Geometry {
                block_size,
                num_blocks: len / u64::from(block_size),
                max_transfer: 1 << 20,
                native_fua: false,
                volatile_cache: true,
                discard: false,
            },
        })
    }

    fn offset(&self, lba: u64, len: usize) -> Result<u64, IoError> {
        check_request(&self.geometry, lba, len)?;
        Ok(lba * u64::from(self.geometry.block_size))
    }
}

/// Host I/O errors carry no device status; report their errno where there is one.
fn io_error(e: io::Error) -> IoError {
    IoError::Device(e.raw_os_error().unwrap_or(0) as u16)
}

impl BlockDevice for FileDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let offset = self.offset(lba, buf.len())?;
        self.file.read_exact_at(buf, offset).map_err(io_error)
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        let offset = self.offset(lba, buf.len())?;
        self.file.write_all_at(buf, offset).map_err(io_error)?;
        if flags.fua {
            self.file.sync_data().map_err(io_error)?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.file.sync_data().map_err(io_error)
    }

    async fn discard(&self, _lba: u64, _blocks: u64) -> Result<(), IoError> {
        Err(IoError::Unsupported)
    }
}
