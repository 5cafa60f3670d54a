//! The block-device interface the filesystem is written against, the devices of the
//! host (memory, files), and block middleware.
//!
//! The filesystem consumes this interface; the appliance's NVMe and virtio-blk drivers
//! and the host's file- and memory-backed devices implement it. As smoltcp stacks its
//! `phy` middleware over any `phy::Device`, every middleware here is a [`BlockDevice`]
//! wrapping another, so they stack over any device — in the appliance, the host tools
//! and the tests alike: `TraceDisk<FaultDisk<CountingDisk<NvmeDisk>>>`.
//! - [`CountingDisk`] counts requests, bytes, FUA writes, flushes, errors and time: the
//!   one counter set of the block layer, [`DeviceCounters`].
//! - [`RecordingDisk`] records writes, FLUSHes and discards with issue and completion
//!   times (for crash-state enumeration), and counts them.
//! - [`FaultDisk`] fails requests or flips bits by rule.
//! - [`TraceDisk`] logs requests through `log`.
//! - [`YieldDisk`] makes every request yield once, so joined futures overlap.
//! - [`MirrorDisk`] keeps a copy of every block on each of several devices (legs).
//!
//! `no_std + alloc`; [`FileDisk`] needs the `std` feature.
//!
//! # Durability
//! Completion of a [`BlockDevice::write`] means the device has *accepted* the data: a
//! later read returns it, but it may still sit in a volatile cache and be lost on power
//! failure. Data is durable only once a [`BlockDevice::flush`] issued *after* the write
//! completed has itself completed, or when the write was issued with
//! [`WriteFlags::fua`] set and has completed. Nothing is promised about the order in
//! which concurrently outstanding writes reach stable media.
//!
//! # Addressing
//! Requests address the device in logical blocks of [`Geometry::block_size`] bytes.
//! Buffer lengths must be non-zero multiples of the block size and no larger than
//! [`Geometry::max_transfer`]; a request that ends past [`Geometry::num_blocks`] fails
//! with [`IoError::OutOfRange`] and has no effect.
//!
//! # Concurrency and buffers
//! All methods take `&self` so that many requests can be in flight at once: a caller
//! creates several futures and polls them together. A request's buffer is borrowed for
//! the life of its future. If the future is dropped before it completes, the
//! implementation must make sure the device no longer touches the buffer once `drop`
//! returns (for instance by waiting for the completion, or by having transferred through
//! a bounce buffer it owns). Callers need not align buffers; implementations that need
//! alignment for DMA bounce internally.
//!
//! # Sharing between CPUs
//! A device *handle* is shared by every CPU: the appliance serves one filesystem from all
//! of them, and the filesystem holds its device, so an implementation the appliance
//! serves from is expected to be `Send + Sync` (the filesystem states it where it is
//! shared: `NineFs<D>` is `Send + Sync` when `D` is). Every middleware here is, over an
//! inner device that is, which is checked at compile time below.
//!
//! The request *futures* need not be `Send`: a request is polled to completion on the
//! CPU that issued it (the appliance runs one cooperative executor per CPU, and a task
//! never moves between them), so a driver may keep per-CPU state, such as its queue pair,
//! in a future. For the same reason the trait has no `Send + Sync` supertraits: a
//! single-CPU device (a test double, a driver not yet shared) remains a device, and only
//! the places that share one ask for the bounds.

#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

use core::fmt;

mod counting;
mod fault;
#[cfg(any(test, feature = "std"))]
mod file;
mod mem;
mod mirror;
mod recording;
mod trace;
mod yielding;

pub use counting::{Counted, CounterHandle, CountingDisk, DeviceCounters};
pub use fault::{Fault, FaultCounters, FaultDisk};
#[cfg(any(test, feature = "std"))]
pub use file::FileDisk;
pub use mem::MemDisk;
pub use mirror::{LegCounters, LegState, MirrorDisk, MirrorError, Opener};
pub use recording::{Recorder, Recording, RecordingDisk, Request, RequestKind};
pub use trace::TraceDisk;
pub use yielding::{yield_now, YieldDisk};

/// Static facts about a block device, fixed for the life of the handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (a power of two, at least 512).
    pub block_size: u32,
    /// Capacity in logical blocks.
    pub num_blocks: u64,
    /// Largest single transfer, in bytes (a multiple of `block_size`).
    pub max_transfer: u32,
    /// The device honours FUA writes natively. When false, implementations emulate a FUA
    /// write with write + flush, so [`WriteFlags::fua`] is always safe to use; the
    /// filesystem uses this bit only to choose the cheaper strategy.
    pub native_fua: bool,
    /// The device has a volatile write cache, so [`BlockDevice::flush`] does real work.
    pub volatile_cache: bool,
    /// The device supports [`BlockDevice::discard`].
    pub discard: bool,
}

impl Geometry {
    /// Capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.num_blocks * u64::from(self.block_size)
    }
}

/// Per-write options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Forced unit access: the write is durable when it completes.
    pub fua: bool,
}

impl WriteFlags {
    /// A plain (cached) write.
    pub const NONE: WriteFlags = WriteFlags { fua: false };
    /// A write that is durable on completion.
    pub const FUA: WriteFlags = WriteFlags { fua: true };
}

/// Why a block request failed. Callers map every variant to `EIO` for users, except
/// where noted; the variants exist so logs and counters can say what happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoError {
    /// The request reaches past the end of the device.
    OutOfRange,
    /// The buffer length is zero, not a multiple of the block size, or above
    /// `max_transfer`.
    BadLength,
    /// The device does not support this operation (e.g. discard).
    Unsupported,
    /// The device did not complete the request in time; it was aborted.
    Timeout,
    /// The device reported an error. The value is device-specific (for NVMe, the
    /// status code type and status code as `(sct << 8) | sc`).
    Device(u16),
    /// The driver could not get memory (e.g. DMA buffers) for the request.
    NoMemory,
    /// The device has been removed or failed and accepts no more requests.
    Dead,
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoError::OutOfRange => f.write_str("request past end of device"),
            IoError::BadLength => f.write_str("bad request length"),
            IoError::Unsupported => f.write_str("operation not supported by device"),
            IoError::Timeout => f.write_str("request timed out"),
            IoError::Device(status) => write!(f, "device error status {status:#06x}"),
            IoError::NoMemory => f.write_str("out of memory for request"),
            IoError::Dead => f.write_str("device is dead"),
        }
    }
}

/// An asynchronous block device. See the module documentation for the contract, and
/// "Sharing between CPUs" there for which parts must be `Send + Sync`.
#[allow(async_fn_in_trait)]
pub trait BlockDevice {
    /// The device's geometry.
    fn geometry(&self) -> Geometry;

    /// Reads `buf.len()` bytes starting at logical block `lba`.
    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError>;

    /// Writes `buf` starting at logical block `lba`. Completion is not durability unless
    /// `flags.fua` is set.
    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError>;

    /// Makes every write that completed before this call durable.
    async fn flush(&self) -> Result<(), IoError>;

    /// Tells the device that `blocks` logical blocks starting at `lba` are unused. The
    /// content of discarded blocks is unspecified afterwards. Fails with
    /// [`IoError::Unsupported`] when `geometry().discard` is false.
    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError>;

    /// How many copies of each block the device keeps: one, unless it is redundant (a
    /// [`MirrorDisk`]: one per leg). The copy methods below let a caller that can verify
    /// what it reads (the filesystem, by checksums) pick a good copy and mend bad ones.
    fn copies(&self) -> usize {
        1
    }

    /// Reads from copy `copy` only. Fails with [`IoError::Dead`] when that copy is out of
    /// service. A device with one copy reads as [`BlockDevice::read`].
    async fn read_copy(&self, copy: usize, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let _ = copy;
        self.read(lba, buf).await
    }

    /// Writes `buf`, read good from another copy, over copy `copy`, which read bad: a
    /// repair (counted by the device). Not durable until a later flush.
    async fn repair_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<(), IoError> {
        let _ = copy;
        self.write(lba, buf, WriteFlags::NONE).await
    }

    /// The copies out of service (bit `i`: copy `i`): failed, stale or missing.
    fn failed_copies(&self) -> u64 {
        0
    }

    /// Takes copy `copy` out of service (the caller found it stale). The last copy in
    /// service is never taken out.
    fn fail_copy(&self, copy: usize) {
        let _ = copy;
    }

    /// The copies being rebuilt (bit `i`: copy `i`): every write and flush reaches
    /// them, no read is served from them. Not among [`BlockDevice::failed_copies`].
    fn rebuilding_copies(&self) -> u64 {
        0
    }

    /// Starts rebuilding copy `copy`, out of service with a device in its place: from
    /// now on every write and flush reaches it, no read. False when it cannot (no such
    /// copy or device, or another copy is being rebuilt).
    fn start_rebuild(&self, copy: usize) -> bool {
        let _ = copy;
        false
    }

    /// Copy `copy`, being rebuilt, holds every block now: it serves reads again.
    fn finish_rebuild(&self, copy: usize) {
        let _ = copy;
    }

    /// Opens the copy window over `blocks` blocks at `lba` of copy `copy`, being
    /// rebuilt, before reading them from the others to copy them
    /// ([`BlockDevice::write_copy`]). False while a write over them is in flight (try
    /// again once it has ended). One window at a time: opening one closes the last.
    fn open_copy_window(&self, copy: usize, lba: u64, blocks: u64) -> bool {
        let _ = (copy, lba, blocks);
        false
    }

    /// Writes `buf`, read from the copies in service, over copy `copy` (being rebuilt)
    /// within the open copy window, and closes it. `Ok(false)` when a write over the
    /// window started since it opened: `buf` may be older than that write, and may
    /// have landed after it, so the copy must be done again. Not durable until a flush.
    async fn write_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<bool, IoError> {
        let _ = (copy, lba, buf);
        Err(IoError::Unsupported)
    }

    /// Opens the device `name` names (as the volume's owner names devices: a PCI
    /// selector on the appliance, an image path on the host) and puts it in place
    /// `copy`, taking the leg there out of service first (never the last in service);
    /// [`BlockDevice::start_rebuild`] then brings it in. `Err`: why not, nothing
    /// changed.
    async fn attach_named(&self, copy: usize, name: &str) -> Result<(), alloc::string::String> {
        let _ = (copy, name);
        Err("not a mirrored volume".into())
    }
}

/// A shared reference to a device is a device too (so tools and `fsck` can borrow one).
impl<T: BlockDevice + ?Sized> BlockDevice for &T {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        (**self).read(lba, buf).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        (**self).write(lba, buf, flags).await
    }

    async fn flush(&self) -> Result<(), IoError> {
        (**self).flush().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        (**self).discard(lba, blocks).await
    }

    fn copies(&self) -> usize {
        (**self).copies()
    }

    async fn read_copy(&self, copy: usize, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        (**self).read_copy(copy, lba, buf).await
    }

    async fn repair_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<(), IoError> {
        (**self).repair_copy(copy, lba, buf).await
    }

    fn failed_copies(&self) -> u64 {
        (**self).failed_copies()
    }

    fn fail_copy(&self, copy: usize) {
        (**self).fail_copy(copy)
    }

    fn rebuilding_copies(&self) -> u64 {
        (**self).rebuilding_copies()
    }

    fn start_rebuild(&self, copy: usize) -> bool {
        (**self).start_rebuild(copy)
    }

    fn finish_rebuild(&self, copy: usize) {
        (**self).finish_rebuild(copy)
    }

    fn open_copy_window(&self, copy: usize, lba: u64, blocks: u64) -> bool {
        (**self).open_copy_window(copy, lba, blocks)
    }

    async fn write_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<bool, IoError> {
        (**self).write_copy(copy, lba, buf).await
    }
    async fn attach_named(&self, copy: usize, name: &str) -> Result<(), alloc::string::String> {
        (**self).attach_named(copy, name).await
    }
}

/// Every middleware is `Send + Sync` over a device that is, and so are the devices of
/// this crate (see "Sharing between CPUs" above): checked here, for every inner device.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn over<D: BlockDevice + Send + Sync>() {
        shared::<CountingDisk<D>>();
        shared::<RecordingDisk<D>>();
        shared::<FaultDisk<D>>();
        shared::<TraceDisk<D>>();
        shared::<YieldDisk<D>>();
        shared::<MirrorDisk<D>>();
        shared::<&D>();
    }
    shared::<CounterHandle>();
    shared::<Recorder>();
    over::<MemDisk>();
    #[cfg(any(test, feature = "std"))]
    over::<FileDisk>();
};

/// Checks a request against a geometry: the one validation every implementation shares.
pub fn check_request(geometry: &Geometry, lba: u64, len: usize) -> Result<(), IoError> {
    let block = geometry.block_size as usize;
    if len == 0 || !len.is_multiple_of(block) || len > geometry.max_transfer as usize {
        return Err(IoError::BadLength);
    }
    let blocks = (len / block) as u64;
    match lba.checked_add(blocks) {
        Some(end) if end <= geometry.num_blocks => Ok(()),
        _ => Err(IoError::OutOfRange),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    fn geometry() -> Geometry {
        Geometry {
            block_size: 512,
            num_blocks: 100,
            max_transfer: 64 * 1024,
            native_fua: false,
            volatile_cache: true,
            discard: false,
        }
    }

    #[test]
    fn request_checks() {
        let g = geometry();
        assert_eq!(check_request(&g, 0, 512), Ok(()));
        assert_eq!(check_request(&g, 99, 512), Ok(()));
        assert_eq!(check_request(&g, 99, 1024), Err(IoError::OutOfRange));
        assert_eq!(check_request(&g, u64::MAX, 512), Err(IoError::OutOfRange));
        assert_eq!(check_request(&g, 0, 0), Err(IoError::BadLength));
        assert_eq!(check_request(&g, 0, 100), Err(IoError::BadLength));
        assert_eq!(check_request(&g, 0, 128 * 1024), Err(IoError::BadLength));
        assert_eq!(g.capacity_bytes(), 51200);
    }

    /// The behaviour every implementation shares, run against one device.
    pub(crate) async fn exercise(dev: &impl BlockDevice) {
        let g = dev.geometry();
        let bs = g.block_size as usize;
        let last = g.num_blocks - 1;
        let pattern: Vec<u8> = (0..2 * bs).map(|i| (i * 7 + 3) as u8).collect();
        dev.write(last - 1, &pattern, WriteFlags::NONE)
            .await
            .unwrap();
        dev.flush().await.unwrap();
        let mut back = vec![0u8; 2 * bs];
        dev.read(last - 1, &mut back).await.unwrap();
        assert_eq!(back, pattern);
        assert_eq!(dev.read(last, &mut back).await, Err(IoError::OutOfRange));
        assert_eq!(
            dev.write(0, &pattern[..1], WriteFlags::FUA).await,
            Err(IoError::BadLength)
        );
        // A failed request changed nothing.
        dev.read(last - 1, &mut back).await.unwrap();
        assert_eq!(back, pattern);
    }

    #[test]
    fn mem_disk() {
        let disk = MemDisk::new(512, 64);
        pollster::block_on(exercise(&disk));
        assert_eq!(&disk.snapshot()[62 * 512..62 * 512 + 4], &[3, 10, 17, 24]);
        pollster::block_on(disk.discard(62, 2)).unwrap();
        assert!(disk.snapshot().iter().all(|&b| b == 0));
    }

    #[test]
    fn file_disk() {
        let path = std::env::temp_dir().join(format!("ninefold-filedisk-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096 * 16]).unwrap();
        let disk = FileDisk::open(&path, 4096, true).unwrap();
        pollster::block_on(exercise(&disk));
        assert_eq!(
            pollster::block_on(disk.discard(0, 1)),
            Err(IoError::Unsupported)
        );
        drop(disk);
        assert!(FileDisk::open(&path, 4096, false).is_ok());
        std::fs::write(&path, vec![0u8; 4097]).unwrap();
        assert!(FileDisk::open(&path, 4096, false).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
