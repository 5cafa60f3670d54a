//! [`CountingDisk`]: the counters of a [`RecordingDisk`](super::RecordingDisk) without
//! keeping the data, for benchmarks that write gigabytes.

use alloc::sync::Arc;

use spin::Mutex;

use super::recording::Counters;
use crate::block::{BlockDevice, Geometry, IoError, WriteFlags};

/// A device that counts the requests it passes to `D`.
#[derive(Debug)]
pub struct CountingDisk<D> {
    inner: D,
    counters: Arc<Mutex<Counters>>,
}

impl<D: BlockDevice> CountingDisk<D> {
    /// Wraps `inner`; the returned handle reads the counters while the filesystem owns
    /// the device.
    pub fn new(inner: D) -> (CountingDisk<D>, Arc<Mutex<Counters>>) {
        let counters = Arc::new(Mutex::new(Counters::default()));
        (
            CountingDisk {
                inner,
                counters: counters.clone(),
            },
            counters,
        )
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn count<T>(&self, r: Result<T, IoError>, f: impl FnOnce(&mut Counters)) -> Result<T, IoError> {
        let mut c = self.counters.lock();
        f(&mut c);
        c.errors += u64::from(r.is_err());
        r
    }
}

impl<D: BlockDevice> BlockDevice for CountingDisk<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let len = buf.len() as u64;
        let r = self.inner.read(lba, buf).await;
        self.count(r, |c| {
            c.reads += 1;
            c.bytes_read += len;
        })
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        let r = self.inner.write(lba, buf, flags).await;
        self.count(r, |c| {
            c.writes += 1;
            c.fua_writes += u64::from(flags.fua);
            c.bytes_written += buf.len() as u64;
        })
    }

    async fn flush(&self) -> Result<(), IoError> {
        let r = self.inner.flush().await;
        self.count(r, |c| c.flushes += 1)
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        let r = self.inner.discard(lba, blocks).await;
        self.count(r, |c| c.discards += 1)
    }
}
