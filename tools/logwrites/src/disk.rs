//! [`LogWritesDisk`]: QEMU's `blklogwrites` as block middleware, for host tests: every
//! write, FLUSH and discard that completes on the wrapped device is appended to a
//! dm-log-writes log in the same format.

use std::sync::{Arc, Mutex};

use block::{BlockDevice, Geometry, IoError, WriteFlags};

use crate::LogBuilder;

/// Logs what completes on `D` (the log's sector size is the device's block size).
#[derive(Debug)]
pub struct LogWritesDisk<D> {
    inner: D,
    log: Arc<Mutex<LogBuilder>>,
}

impl<D: BlockDevice> LogWritesDisk<D> {
    /// Wraps `inner`; the returned handle reads the log while the disk is in use.
    pub fn new(inner: D) -> (LogWritesDisk<D>, Arc<Mutex<LogBuilder>>) {
        let log = Arc::new(Mutex::new(LogBuilder::new(inner.geometry().block_size)));
        (
            LogWritesDisk {
                inner,
                log: log.clone(),
            },
            log,
        )
    }

    fn log(&self) -> std::sync::MutexGuard<'_, LogBuilder> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn offset(&self, lba: u64) -> u64 {
        lba * u64::from(self.inner.geometry().block_size)
    }
}

impl<D: BlockDevice> BlockDevice for LogWritesDisk<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.inner.read(lba, buf).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        self.inner.write(lba, buf, flags).await?;
        self.log().write(self.offset(lba), buf, flags.fua);
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.inner.flush().await?;
        self.log().flush();
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        self.inner.discard(lba, blocks).await?;
        let bs = u64::from(self.inner.geometry().block_size);
        self.log().discard(self.offset(lba), blocks * bs);
        Ok(())
    }
}
