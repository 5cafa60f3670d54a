//! Device-level counters for any block device: what the filesystem asked the device to
//! do (requests, bytes, FUA writes, flushes), counted where it reaches the driver. These
//! are the figures the benchmarks judge a filesystem by (bytes and flushes per fsync),
//! kept the same way for NVMe and virtio-blk.

use core::sync::atomic::{AtomicU64, Ordering};

use fs::block::{BlockDevice, Geometry, IoError, WriteFlags};

/// Cumulative counters of one device (a snapshot of [`Counted`]'s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceCounters {
    /// Read requests.
    pub reads: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Write requests (FUA ones included).
    pub writes: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Write requests with FUA.
    pub fua_writes: u64,
    /// Flush requests.
    pub flushes: u64,
    /// Discard requests.
    pub discards: u64,
    /// Blocks discarded.
    pub blocks_discarded: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Nanoseconds requests spent in the device, by kind (completion minus submission).
    pub read_ns: u64,
    /// See [`DeviceCounters::read_ns`].
    pub write_ns: u64,
    /// See [`DeviceCounters::read_ns`].
    pub flush_ns: u64,
    /// See [`DeviceCounters::read_ns`].
    pub discard_ns: u64,
}

impl DeviceCounters {
    /// Flushes the device performs: explicit ones, plus one per FUA write when the
    /// device has no native FUA (the driver emulates it with write + flush).
    pub fn device_flushes(&self, geometry: &Geometry) -> u64 {
        if geometry.native_fua {
            self.flushes
        } else {
            self.flushes + self.fua_writes
        }
    }
}

#[derive(Debug, Default)]
struct Cells {
    reads: AtomicU64,
    bytes_read: AtomicU64,
    writes: AtomicU64,
    bytes_written: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    blocks_discarded: AtomicU64,
    errors: AtomicU64,
    read_ns: AtomicU64,
    write_ns: AtomicU64,
    flush_ns: AtomicU64,
    discard_ns: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A block device that counts what passes through it. A request is counted when it is
/// issued; a failed one is also counted in `errors`.
#[derive(Debug)]
pub struct Counted<D> {
    inner: D,
    cells: Cells,
    clock: fn() -> u64,
}

impl<D: BlockDevice> Counted<D> {
    /// Counts the requests to `inner`; `clock` gives nanoseconds (for the time spent).
    pub fn new(inner: D, clock: fn() -> u64) -> Self {
        Counted {
            inner,
            cells: Cells::default(),
            clock,
        }
    }

    /// The device underneath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The counters now.
    pub fn counters(&self) -> DeviceCounters {
        let c = &self.cells;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeviceCounters {
            reads: get(&c.reads),
            bytes_read: get(&c.bytes_read),
            writes: get(&c.writes),
            bytes_written: get(&c.bytes_written),
            fua_writes: get(&c.fua_writes),
            flushes: get(&c.flushes),
            discards: get(&c.discards),
            blocks_discarded: get(&c.blocks_discarded),
            errors: get(&c.errors),
            read_ns: get(&c.read_ns),
            write_ns: get(&c.write_ns),
            flush_ns: get(&c.flush_ns),
            discard_ns: get(&c.discard_ns),
        }
    }

    /// Runs `request`, adding its time to `time` and a failure to `errors`.
    async fn timed<T>(
        &self,
        time: &AtomicU64,
        request: impl core::future::Future<Output = Result<T, IoError>>,
    ) -> Result<T, IoError> {
        let start = (self.clock)();
        let r = request.await;
        add(time, (self.clock)().saturating_sub(start));
        if r.is_err() {
            add(&self.cells.errors, 1);
        }
        r
    }
}

impl<D: BlockDevice> BlockDevice for Counted<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        add(&self.cells.reads, 1);
        add(&self.cells.bytes_read, buf.len() as u64);
        self.timed(&self.cells.read_ns, self.inner.read(lba, buf))
            .await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        add(&self.cells.writes, 1);
        add(&self.cells.bytes_written, buf.len() as u64);
        if flags.fua {
            add(&self.cells.fua_writes, 1);
        }
        self.timed(&self.cells.write_ns, self.inner.write(lba, buf, flags))
            .await
    }

    async fn flush(&self) -> Result<(), IoError> {
        add(&self.cells.flushes, 1);
        self.timed(&self.cells.flush_ns, self.inner.flush()).await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        add(&self.cells.discards, 1);
        add(&self.cells.blocks_discarded, blocks);
        self.timed(&self.cells.discard_ns, self.inner.discard(lba, blocks))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fs::block::MemDisk;

    fn clock() -> u64 {
        static T: AtomicU64 = AtomicU64::new(0);
        T.fetch_add(10, Ordering::Relaxed)
    }

    #[test]
    fn counts_requests_bytes_and_failures() {
        let d = Counted::new(MemDisk::new(512, 64), clock);
        pollster::block_on(async {
            d.write(0, &[1u8; 4096], WriteFlags::NONE).await.unwrap();
            d.write(8, &[2u8; 512], WriteFlags::FUA).await.unwrap();
            d.flush().await.unwrap();
            let mut buf = [0u8; 1024];
            d.read(8, &mut buf).await.unwrap();
            assert_eq!(buf[0], 2);
            // Past the end: counted, and counted as an error.
            assert!(d.write(64, &[0u8; 512], WriteFlags::NONE).await.is_err());
        });
        let c = d.counters();
        assert_eq!(
            (c.writes, c.bytes_written, c.fua_writes),
            (3, 4096 + 512 + 512, 1)
        );
        assert_eq!(
            (c.reads, c.bytes_read, c.flushes, c.errors),
            (1, 1024, 1, 1)
        );
        assert!(c.write_ns > 0 && c.flush_ns > 0 && c.read_ns > 0);
        let mut g = d.geometry();
        g.native_fua = true;
        assert_eq!(c.device_flushes(&g), 1);
        g.native_fua = false;
        assert_eq!(c.device_flushes(&g), 2);
    }
}
