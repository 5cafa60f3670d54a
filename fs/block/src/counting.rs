//! Device-level counters for any block device: what the filesystem asked the device to
//! do (requests, bytes, FUA writes, flushes, discards, errors, time spent), counted where
//! it reaches the device. These are the figures the benchmarks judge a filesystem by
//! (bytes and flushes per fsync), kept the same way for NVMe and virtio-blk in the
//! appliance and for memory and file disks on the host.

use alloc::sync::Arc;
use core::future::Future;

use metrics::LatencyHistogram;
use spin::Mutex;

use crate::{BlockDevice, Geometry, IoError, WriteFlags};

/// Cumulative counters of one device. The one counter set of the block layer: the
/// appliance reports it, the benchmarks and the crash recorder keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
    /// Nanoseconds requests spent in the device, by kind (completion minus submission;
    /// zero without a clock).
    pub read_ns: u64,
    /// See [`DeviceCounters::read_ns`].
    pub write_ns: u64,
    /// See [`DeviceCounters::read_ns`].
    pub flush_ns: u64,
    /// See [`DeviceCounters::read_ns`].
    pub discard_ns: u64,
    /// Flush latencies (only timed flushes: none without a clock). Fixed buckets, so
    /// the counters stay a plain copyable value.
    pub flush_latency: LatencyHistogram,
}

/// What a request was, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// A read of this many bytes.
    Read(usize),
    /// A write of this many bytes, with these flags.
    Write(usize, WriteFlags),
    /// A flush.
    Flush,
    /// A discard of this many blocks.
    Discard(u64),
}

impl DeviceCounters {
    /// Counts one request that succeeded or not and took `ns` nanoseconds (`None`: not
    /// timed).
    pub fn count(&mut self, request: Counted, ok: bool, ns: Option<u64>) {
        if let (Counted::Flush, Some(ns)) = (request, ns) {
            self.flush_latency.record(ns);
        }
        let ns = ns.unwrap_or(0);
        match request {
            Counted::Read(len) => {
                self.reads += 1;
                self.bytes_read += len as u64;
                self.read_ns += ns;
            }
            Counted::Write(len, flags) => {
                self.writes += 1;
                self.bytes_written += len as u64;
                self.fua_writes += u64::from(flags.fua);
                self.write_ns += ns;
            }
            Counted::Flush => {
                self.flushes += 1;
                self.flush_ns += ns;
            }
            Counted::Discard(blocks) => {
                self.discards += 1;
                self.blocks_discarded += blocks;
                self.discard_ns += ns;
            }
        }
        self.errors += u64::from(!ok);
    }

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

/// A shared view of a [`CountingDisk`]'s counters, readable while something else (the
/// filesystem) owns the disk.
#[derive(Clone, Debug, Default)]
pub struct CounterHandle(Arc<Mutex<DeviceCounters>>);

impl CounterHandle {
    /// The counters now.
    pub fn get(&self) -> DeviceCounters {
        *self.0.lock()
    }
}

/// A block device that counts what passes through it (middleware, like smoltcp's
/// `phy` wrappers): every request once it completes, a failed one also in `errors`.
#[derive(Debug)]
pub struct CountingDisk<D> {
    inner: D,
    counters: CounterHandle,
    clock: Option<fn() -> u64>,
}

impl<D: BlockDevice> CountingDisk<D> {
    /// Counts the requests to `inner`, without timing them.
    pub fn new(inner: D) -> Self {
        CountingDisk {
            inner,
            counters: CounterHandle::default(),
            clock: None,
        }
    }

    /// Counts the requests to `inner` and the time they take on `clock` (nanoseconds).
    pub fn with_clock(inner: D, clock: fn() -> u64) -> Self {
        CountingDisk {
            clock: Some(clock),
            ..Self::new(inner)
        }
    }

    /// The device underneath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The counters now.
    pub fn counters(&self) -> DeviceCounters {
        self.counters.get()
    }

    /// A handle on the counters that outlives borrows of the disk.
    pub fn handle(&self) -> CounterHandle {
        self.counters.clone()
    }

    async fn counted<T>(
        &self,
        what: Counted,
        request: impl Future<Output = Result<T, IoError>>,
    ) -> Result<T, IoError> {
        let start = self.clock.map(|now| now());
        let r = request.await;
        let ns = self
            .clock
            .zip(start)
            .map(|(now, t0)| now().saturating_sub(t0));
        self.counters.0.lock().count(what, r.is_ok(), ns);
        r
    }
}

impl<D: BlockDevice> BlockDevice for CountingDisk<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let what = Counted::Read(buf.len());
        self.counted(what, self.inner.read(lba, buf)).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        let what = Counted::Write(buf.len(), flags);
        self.counted(what, self.inner.write(lba, buf, flags)).await
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.counted(Counted::Flush, self.inner.flush()).await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        self.counted(Counted::Discard(blocks), self.inner.discard(lba, blocks))
            .await
    }

    // A mirror's copies pass through (counted as reads and writes of the whole).

    fn copies(&self) -> usize {
        self.inner.copies()
    }

    async fn read_copy(&self, copy: usize, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let len = buf.len();
        self.counted(Counted::Read(len), self.inner.read_copy(copy, lba, buf))
            .await
    }

    async fn repair_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<(), IoError> {
        let request = Counted::Write(buf.len(), WriteFlags::NONE);
        self.counted(request, self.inner.repair_copy(copy, lba, buf))
            .await
    }

    fn failed_copies(&self) -> u64 {
        self.inner.failed_copies()
    }

    fn fail_copy(&self, copy: usize) {
        self.inner.fail_copy(copy)
    }

    fn rebuilding_copies(&self) -> u64 {
        self.inner.rebuilding_copies()
    }

    fn start_rebuild(&self, copy: usize) -> bool {
        self.inner.start_rebuild(copy)
    }

    fn finish_rebuild(&self, copy: usize) {
        self.inner.finish_rebuild(copy)
    }

    fn open_copy_window(&self, copy: usize, lba: u64, blocks: u64) -> bool {
        self.inner.open_copy_window(copy, lba, blocks)
    }

    async fn write_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<bool, IoError> {
        let request = Counted::Write(buf.len(), WriteFlags::NONE);
        self.counted(request, self.inner.write_copy(copy, lba, buf))
            .await
    }

    async fn attach_named(&self, copy: usize, name: &str) -> Result<(), alloc::string::String> {
        self.inner.attach_named(copy, name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;

    #[test]
    fn counts_every_kind_and_failures() {
        let disk = CountingDisk::new(MemDisk::new(512, 64));
        let handle = disk.handle();
        pollster::block_on(async {
            let mut buf = [0u8; 1024];
            disk.write(0, &buf, WriteFlags::FUA).await.unwrap();
            disk.read(2, &mut buf).await.unwrap();
            disk.flush().await.unwrap();
            assert!(disk.read(63, &mut buf).await.is_err());
        });
        let c = handle.get();
        assert_eq!((c.writes, c.fua_writes, c.bytes_written), (1, 1, 1024));
        assert_eq!((c.reads, c.bytes_read, c.errors), (2, 2048, 1));
        assert_eq!(c.flushes, 1);
        let g = disk.geometry();
        assert_eq!(c.device_flushes(&g), if g.native_fua { 1 } else { 2 });
        assert!(c.flush_latency.is_empty(), "no clock, no latencies");
    }

    #[test]
    fn times_flushes_into_the_histogram_with_a_clock() {
        use core::sync::atomic::{AtomicU64, Ordering};
        // Every reading advances 300 µs: each request takes 300 µs.
        static NOW: AtomicU64 = AtomicU64::new(0);
        fn clock() -> u64 {
            NOW.fetch_add(300_000, Ordering::Relaxed)
        }
        let disk = CountingDisk::with_clock(MemDisk::new(512, 64), clock);
        pollster::block_on(async {
            disk.flush().await.unwrap();
            disk.write(0, &[0u8; 512], WriteFlags::default())
                .await
                .unwrap();
            disk.flush().await.unwrap();
        });
        let c = disk.counters();
        assert_eq!((c.flush_ns, c.write_ns), (600_000, 300_000));
        let h = c.flush_latency;
        assert_eq!((h.count, h.sum_ns), (2, 600_000), "flushes only");
        assert_eq!(h.buckets[3], 2, "300 µs is in (250 µs, 500 µs]");
    }
}
