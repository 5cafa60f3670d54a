//! The filesystem the appliance serves: open the `disk=` device, format it when asked
//! (`mkfs`), mount it with memory limits derived from the heap, and say on the console
//! what was found. With `fs=memory` (development), the same filesystem on a RAM disk
//! ([`memory_disk_bytes`] of the heap), formatted at boot: nothing is stored.
//!
//! The disk lives for the rest of the appliance's life, so it is leaked to a `&'static`:
//! the filesystem, the counters service and a failed mount (which must not lose the
//! device) all borrow the same one. It is wrapped in a `block::CountingDisk`, whose
//! counters the counters service reports.

use core::time::Duration;

use ninefs::format::BLOCK_SIZE;
use ninefs::volume::MountOptions;

use crate::config::Config;

#[cfg(target_os = "none")]
pub use mount_impl::{
    mount, mount_memory, mount_mirror, DeviceName, InjectedFaults, Mounted, ServedFs, ServedVolume,
    StorageError,
};

/// Readahead workers the appliance runs: each has one device read in flight at a time,
/// so this many sequential readers are read ahead of at once.
pub const READAHEAD_WORKERS: usize = 4;
/// How often the served filesystem's housekeeping (`ServedVolume::housekeeping`) runs.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(5);
/// How often the served filesystem is looked at for a failure
/// (`ServedVolume::watch_failure`): the `fs_failed` event comes at most this late.
pub const FAILURE_CHECK: Duration = Duration::from_millis(100);

/// Share of the heap the btree node cache may use. A checkpoint holds encoded copies of
/// the dirty nodes while it writes them, so the cache can cost twice this at peak; the
/// socket buffers take up to a quarter (`net::limits`), and the rest is for request
/// frames, file data in flight and per-inode state.
pub const CACHE_SHARE: u64 = 5;
/// Bounds of the node cache.
pub const MIN_CACHE: u64 = 4 << 20;
/// See [`MIN_CACHE`].
pub const MAX_CACHE: u64 = 1 << 30;
/// Share of the heap the data cache has of its own (it also borrows what the node cache
/// leaves unused: at 128 MiB of RAM, 11.7 MiB of its own and most of the node cache's
/// 18.8 MiB while metadata is small). The node cache (twice its share at a checkpoint's
/// peak), the socket buffers (a quarter) and the clients' budget (a sixth) leave it
/// about this much at their worst.
pub const DATA_CACHE_SHARE: u64 = 8;
/// Bounds of the data cache's own memory (`data_cache=` sets it outright).
pub const MIN_DATA_CACHE: u64 = 2 << 20;
/// See [`MIN_DATA_CACHE`].
pub const MAX_DATA_CACHE: u64 = 4 << 30;
/// Share of the heap for cached allocation-bitmap groups (4 KiB each, 127 MiB of disk
/// each): 1/64 of a 94 MiB heap keeps the bitmap of a 45 GiB disk in memory.
pub const GROUP_SHARE: u64 = 64;
/// Label given to a disk the appliance formats.
pub const LABEL: &[u8] = b"ninefold";
/// Share of the heap the RAM disk of `fs=memory` takes, and its bounds.
pub const MEMORY_DISK_SHARE: u64 = 4;
/// See [`MEMORY_DISK_SHARE`]: the filesystem's smallest useful size.
pub const MIN_MEMORY_DISK: u64 = 16 << 20;
/// See [`MEMORY_DISK_SHARE`].
pub const MAX_MEMORY_DISK: u64 = 4 << 30;

/// Bytes of the RAM disk `fs=memory` serves from, for a `heap_bytes` heap: a quarter of
/// it, in whole filesystem blocks.
pub fn memory_disk_bytes(heap_bytes: u64) -> u64 {
    let bytes = (heap_bytes / MEMORY_DISK_SHARE).clamp(MIN_MEMORY_DISK, MAX_MEMORY_DISK);
    bytes / BLOCK_SIZE as u64 * BLOCK_SIZE as u64
}

/// The mount options for a `heap_bytes` heap and the command line's `config` (pure:
/// host-tested).
pub fn mount_options(heap_bytes: u64, config: &Config) -> MountOptions {
    let cache = (heap_bytes / CACHE_SHARE).clamp(MIN_CACHE, MAX_CACHE);
    let groups = (heap_bytes / GROUP_SHARE / BLOCK_SIZE as u64).max(256);
    let data_cache = match config.data_cache_mib {
        Some(mib) => u64::from(mib) << 20,
        None => (heap_bytes / DATA_CACHE_SHARE).clamp(MIN_DATA_CACHE, MAX_DATA_CACHE),
    };
    MountOptions {
        cache_limit: cache as usize,
        max_groups: groups as usize,
        discard: config.discard_secs.map(|s| Duration::from_secs(s.into())),
        max_snapshots: config.max_snapshots,
        stream_buffer: config.stream_buffer,
        refuse_degraded: config.refuse_degraded,
        data_cache: data_cache.min(heap_bytes / 2) as usize,
        readahead: config.readahead,
        ..MountOptions::default()
    }
}

#[cfg(target_os = "none")]
mod mount_impl {
    use alloc::boxed::Box;
    use alloc::format;
    use alloc::string::String;
    use core::fmt;

    use block::BlockDevice;
    use log::{info, warn};
    use ninefs::format::superblock::MAGIC;
    use ninefs::format::BLOCK_SIZE;
    use ninefs::io::Dev;
    use ninefs::volume::{
        format as mkfs, FormatError, FormatOptions, MountError, MountOptions, NineFs,
    };
    use vfs::FileSystem;

    use super::{mount_options, LABEL};
    use crate::clock::rtc::WallClock;
    use crate::config::DiskSelector;
    use crate::config::{Config, Mkfs};
    use crate::drivers::disk::{self, Disk, DiskOptions, OpenError};
    use crate::event::{self, Event};
    use crate::pci::PciAddress;
    use crate::sync::IrqLock;
    use alloc::vec::Vec;
    use block::{
        CountingDisk, FaultCounters, FaultDisk, IoError, LegState, MemDisk, MirrorDisk, Opener,
    };
    use core::future::Future;
    use core::pin::Pin;
    use core::sync::atomic::{AtomicBool, Ordering};
    use ninefs::features::redundancy::rebuild::RebuildStep;
    use ninefs::features::redundancy::scrub::ScrubProgress;
    use ninefs::format::label::{DeviceLabel, LABEL_BLOCK};

    use crate::report::{DeviceReport, FsReport, LegReport};

    /// The filesystem the appliance serves, on device `D` with its counters.
    pub type ServedFs<D> = NineFs<&'static CountingDisk<D>>;

    /// How a device is named in logs and reports.
    pub trait DeviceName {
        /// Short name, no spaces, e.g. `nvme@00:04.0`.
        fn device_name(&self) -> String;

        /// The legs of a mirror, each with its own state and counters (none for a
        /// single device).
        fn legs(&self) -> Vec<LegReport> {
            Vec::new()
        }
    }

    impl DeviceName for Disk {
        fn device_name(&self) -> String {
            format!("{}@{}", self.kind(), self.pci().address())
        }
    }

    impl DeviceName for MemDisk {
        fn device_name(&self) -> String {
            "ram".into()
        }
    }

    impl<D: BlockDevice + DeviceName> DeviceName for FaultDisk<D> {
        fn device_name(&self) -> String {
            self.inner().device_name()
        }
    }

    /// What a device's fault injector did, for the reports: `None` where there is none.
    pub trait InjectedFaults {
        /// The injector's counters, if the device has one that is armed.
        fn injected_faults(&self) -> Option<FaultCounters> {
            None
        }
    }

    impl InjectedFaults for Disk {}

    /// A mirror's injector is its first leg's (`fault=` arms only that one).
    impl<D: BlockDevice + InjectedFaults> InjectedFaults for MirrorDisk<D> {
        fn injected_faults(&self) -> Option<FaultCounters> {
            self.leg(0).and_then(|l| l.injected_faults())
        }
    }

    impl<D: BlockDevice + DeviceName> DeviceName for MirrorDisk<D> {
        fn device_name(&self) -> String {
            let legs: Vec<String> = (0..self.copies())
                .map(|i| self.leg(i).map_or("missing".into(), |l| l.device_name()))
                .collect();
            format!("mirror({})", legs.join(","))
        }

        fn legs(&self) -> Vec<LegReport> {
            MirrorDisk::legs(self)
                .into_iter()
                .enumerate()
                .map(|(place, c)| LegReport {
                    leg: format!("{place}"),
                    device: self
                        .leg(place)
                        .map_or("missing".into(), |l| l.device_name()),
                    state: match c.state {
                        LegState::Active => "active",
                        LegState::Rebuilding => "rebuilding",
                        LegState::Failed => "failed",
                        LegState::Missing => "missing",
                    },
                    in_service: u64::from(c.state == LegState::Active),
                    read_errors: c.read_errors,
                    write_errors: c.write_errors,
                    repairs: c.repairs,
                })
                .collect()
        }
    }

    impl InjectedFaults for MemDisk {}

    impl<D> InjectedFaults for FaultDisk<D>
    where
        D: BlockDevice,
    {
        fn injected_faults(&self) -> Option<FaultCounters> {
            self.is_armed().then(|| self.counters())
        }
    }

    /// Requests `disk`'s fault injector failed on purpose.
    fn injected_errors(disk: &impl InjectedFaults) -> u64 {
        disk.injected_faults().map_or(0, |f| f.injected_errors)
    }

    /// The error a rule of `fault=` gives: NVMe's "write fault" status, which both
    /// drivers' callers treat like any device error.
    const INJECTED_ERROR: IoError = IoError::Device(0x0280);

    /// `disk` behind a fault injector armed with `config.faults` (none: it passes every
    /// request through).
    fn with_faults(disk: Disk, config: &Config) -> FaultDisk<Disk> {
        let disk =
            FaultDisk::with_clock(disk, config.fault_seed, || crate::clock::now().as_nanos());
        for fault in &config.faults {
            warn!(
                "fs: {}: injecting device errors: {fault}",
                disk.inner().device_name()
            );
            disk.inject(fault.clone(), INJECTED_ERROR);
        }
        disk
    }

    /// What the appliance does with the filesystem it serves besides serving it — the
    /// reports, the periodic work, the scrub, the clean unmount — so that everything
    /// that takes the served filesystem has one bound.
    #[allow(async_fn_in_trait)]
    pub trait ServedVolume: FileSystem + vfs::Control + Send + Sync + 'static {
        /// The block devices it uses, for the reports.
        fn devices(&self) -> Vec<DeviceReport>;
        /// Its state and counters (the node cache's limit left 0: the monitor knows it).
        async fn fs_report(&self) -> FsReport;
        /// Does what is due every [`HOUSEKEEPING_INTERVAL`](super::HOUSEKEEPING_INTERVAL):
        /// commits, and discards blocks freed longer ago than `discard=`; errors are
        /// logged. Emits `fs_failed` if the filesystem failed and it was not yet.
        async fn housekeeping(&self);
        /// Emits `fs_failed` if the device failed a request and the filesystem failed
        /// (once): called every [`FAILURE_CHECK`](super::FAILURE_CHECK), so that the
        /// event follows the failure closely; cheap until the device fails a request.
        fn watch_failure(&self);
        /// Starts a scrub pass when `start` and none is running, then verifies up to
        /// `budget` bytes of the running pass; errors are logged.
        async fn scrub_tick(&self, budget: u64, start: bool);
        /// Copies up to `budget` bytes of the rebuild `ctl replace` started, if one is
        /// going on (emitting `rebuilt` at its end); errors are logged.
        async fn rebuild_tick(&self, budget: u64);
        /// Lets each stream job move `budget` more bytes (every scrub tick).
        fn stream_grant(&self, budget: u64);
        /// Runs the send jobs `ctl` starts, for ever (spawned once).
        async fn send_worker(&self);
        /// Runs the receive jobs `ctl` starts, for ever (spawned once).
        async fn receive_worker(&self);
        /// Reads ahead of sequential readers, for ever (spawned
        /// [`READAHEAD_WORKERS`](super::READAHEAD_WORKERS) times: one device read in
        /// flight each).
        async fn readahead_worker(&self);
        /// Makes everything durable and marks the image cleanly unmounted (the next
        /// mount replays nothing); the filesystem stays mounted, read-only. Call it once
        /// no request is running on it.
        async fn unmount_clean(&self) -> vfs::FsResult<()>;
    }

    /// Emits `fs_failed` once `fs` has failed (the filesystem logs its failure itself,
    /// when it happens), once per boot.
    fn report_failure<D>(fs: &ServedFs<D>)
    where
        D: BlockDevice + DeviceName + InjectedFaults + Send + Sync + 'static,
    {
        static FAILED: AtomicBool = AtomicBool::new(false);
        if FAILED.load(Ordering::Relaxed) || fs.stats().failed == 0 {
            return;
        }
        if !FAILED.swap(true, Ordering::Relaxed) {
            let disk = *fs.device();
            event::emit(Event::FsFailed {
                device_errors: disk.counters().errors,
                injected_errors: injected_errors(disk.inner()),
            });
        }
    }

    impl<D> ServedVolume for ServedFs<D>
    where
        D: BlockDevice + DeviceName + InjectedFaults + Send + Sync + 'static,
    {
        fn devices(&self) -> Vec<DeviceReport> {
            let disk = *self.device();
            let g = disk.geometry();
            let counters = disk.counters();
            alloc::vec![DeviceReport {
                name: disk.inner().device_name(),
                block_size: g.block_size,
                blocks: g.num_blocks,
                native_fua: g.native_fua,
                volatile_cache: g.volatile_cache,
                counters,
                device_flushes: counters.device_flushes(&g),
                injected_faults: disk.inner().injected_faults(),
                legs: disk.inner().legs(),
            }]
        }

        async fn fs_report(&self) -> FsReport {
            self.report(0).await
        }

        async fn housekeeping(&self) {
            if let Err(e) = NineFs::housekeeping(self).await {
                warn!("fs: housekeeping: {e}");
            }
            // A failure without a device error (an invariant broken) is seen here.
            report_failure(self);
        }

        fn watch_failure(&self) {
            // Only a failed write or FLUSH fails the filesystem: until the device has
            // failed a request there is nothing to look at (and no lock to take).
            if self.device().counters().errors > 0 {
                report_failure(self);
            }
        }

        async fn rebuild_tick(&self, budget: u64) {
            let Some(going) = self.rebuild_progress() else {
                return;
            };
            match self.rebuild_step(budget).await {
                Ok(RebuildStep::Done) => event::emit(Event::Rebuilt {
                    leg: going.place as u64,
                    blocks: going.total,
                    copied_bytes: self.stats().rebuild_blocks * BLOCK_SIZE as u64,
                    // The rebuild's own start (this mount's), not a previous one's.
                    ms: going.elapsed_ms(self.now()),
                }),
                Ok(_) => {}
                Err(e) => warn!("rebuild: leg {}: {e}", going.place),
            }
        }

        async fn scrub_tick(&self, budget: u64, start: bool) {
            if start && !self.scrub_running() {
                if let Err(e) = self.scrub_start().await {
                    warn!("scrub: cannot start: {e}");
                }
            }
            if self.scrub_running() {
                match self.scrub_step(budget).await {
                    Ok(ScrubProgress::Done) => {
                        if let Some(r) = self.scrub_report() {
                            event::emit(Event::Scrub {
                                checkpoint: r.checkpoint_seq,
                                nodes: r.nodes,
                                data_blocks: r.data_blocks,
                                bytes: r.bytes,
                                errors: r.error_count,
                                skipped: r.skipped,
                            });
                        }
                    }
                    Ok(_) => {}
                    Err(e) => warn!("scrub: {e}"),
                }
            }
        }

        fn stream_grant(&self, budget: u64) {
            NineFs::stream_grant(self, budget)
        }

        async fn send_worker(&self) {
            NineFs::send_worker(self).await
        }

        async fn receive_worker(&self) {
            NineFs::receive_worker(self).await
        }

        async fn readahead_worker(&self) {
            NineFs::readahead_worker(self).await
        }

        async fn unmount_clean(&self) -> vfs::FsResult<()> {
            self.remount_read_only().await
        }
    }

    /// The mounted filesystem and its device.
    #[derive(Debug)]
    pub struct Mounted<D: BlockDevice + 'static> {
        /// The filesystem.
        pub fs: ServedFs<D>,
        /// Its device.
        pub disk: &'static CountingDisk<D>,
        /// The device's name in logs and reports.
        pub name: String,
        /// The node cache's limit.
        pub cache_limit: usize,
    }

    /// A device with its counters, for the rest of the appliance's life.
    fn counted<D: BlockDevice>(disk: D) -> &'static CountingDisk<D> {
        Box::leak(Box::new(CountingDisk::with_clock(disk, || {
            crate::clock::now().as_nanos()
        })))
    }

    /// Why there is no filesystem to serve.
    #[derive(Debug)]
    pub enum StorageError {
        /// No disk, or it would not come up.
        Open(OpenError),
        /// Neither superblock copy carries the ninefold magic: an empty or foreign disk.
        Unformatted(String),
        /// The disk holds a ninefold superblock, but no valid one.
        Damaged(String),
        /// `mkfs` failed.
        Format(String, FormatError),
        /// The mount failed.
        Mount(String, MountError),
        /// The devices of `disk=A,B,...` do not make one mirrored volume.
        Mirror(String),
    }

    impl fmt::Display for StorageError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                StorageError::Open(e) => write!(f, "no disk: {e}"),
                StorageError::Unformatted(d) => write!(
                    f,
                    "{d} holds no ninefold filesystem; format it with `ninefold mkfs` on the host, or boot with `mkfs` to format it here (erases the disk)"
                ),
                StorageError::Damaged(d) => write!(
                    f,
                    "{d}: both superblocks are damaged; check the image with `ninefold fsck`, or boot with `mkfs=force` to erase and format it"
                ),
                StorageError::Format(d, e) => write!(f, "{d}: mkfs failed: {e}"),
                StorageError::Mount(d, e) => write!(f, "{d}: mount failed: {e}"),
                StorageError::Mirror(why) => write!(f, "mirrored volume: {why}"),
            }
        }
    }

    /// The RAM disk of `fs=memory`, formatted and mounted: the real filesystem, with
    /// nothing stored.
    pub async fn mount_memory(
        config: &Config,
        heap_bytes: u64,
    ) -> Result<Mounted<MemDisk>, StorageError> {
        let bytes = super::memory_disk_bytes(heap_bytes);
        let disk = counted(MemDisk::new(BLOCK_SIZE as u32, bytes / BLOCK_SIZE as u64));
        let name = disk.inner().device_name();
        info!("fs: {name}: {} MiB RAM disk", bytes >> 20);
        let mounted = match format_disk(disk, &name).await {
            // Discarding a RAM disk's blocks would only zero memory.
            Ok(()) => {
                // Nothing to discard or to cache: the RAM disk is memory already.
                let opts = MountOptions {
                    discard: None,
                    data_cache: 0,
                    readahead: 0,
                    ..mount_options(heap_bytes, config)
                };
                mount_formatted(disk, name, opts).await
            }
            Err(e) => Err(e),
        };
        failed(mounted, Some(disk))
    }

    /// `mounted`, having emitted the [`Event::MountFailed`] of its error, with the
    /// counters of `disk` (if one was opened).
    fn failed<T, D: BlockDevice + InjectedFaults>(
        mounted: Result<T, StorageError>,
        disk: Option<&CountingDisk<D>>,
    ) -> Result<T, StorageError> {
        if let Err(e) = &mounted {
            let (reason, device) = match e {
                StorageError::Open(_) => ("no_disk", None),
                StorageError::Unformatted(d) => ("no_filesystem", Some(d)),
                StorageError::Damaged(d) => ("damaged", Some(d)),
                StorageError::Format(d, _) => ("mkfs_failed", Some(d)),
                StorageError::Mount(d, _) => ("mount_failed", Some(d)),
                StorageError::Mirror(_) => ("mirror", None),
            };
            event::emit(Event::MountFailed {
                reason,
                device: device.map(|d| d.as_str().into()),
                error: event::Text::display(e),
                device_errors: disk.map_or(0, |d| d.counters().errors),
                injected_errors: disk.map_or(0, |d| injected_errors(d.inner())),
            });
        }
        mounted
    }

    /// Opens the disk, formats it if `config.mkfs` says so, and mounts it.
    pub async fn mount(
        config: &Config,
        heap_bytes: u64,
    ) -> Result<Mounted<FaultDisk<Disk>>, StorageError> {
        let opened = match disk::open(config.disk, DiskOptions::for_config(config)).await {
            Ok(d) => d,
            Err(e) => return failed(Err(StorageError::Open(e)), None::<&CountingDisk<Disk>>),
        };
        let disk = counted(with_faults(opened, config));
        failed(mount_disk(disk, config, heap_bytes).await, Some(disk))
    }

    /// Opens the legs of `disk=A,B,...`, puts each in the place its label names (written
    /// by `ninefold mkfs A.img B.img`), and mounts the volume: a leg that does not come
    /// up is missing (the others serve, degraded, as the mount says). Formatting a mirror
    /// here is not done yet: `mkfs` is refused.
    pub async fn mount_mirror(
        config: &Config,
        heap_bytes: u64,
    ) -> Result<Mounted<MirrorDisk<FaultDisk<Disk>>>, StorageError> {
        let none = None::<&CountingDisk<MirrorDisk<FaultDisk<Disk>>>>;
        if config.mkfs != Mkfs::Off {
            let why = "formatting a mirror on the appliance: use `ninefold mkfs A.img B.img`";
            return failed(Err(StorageError::Mirror(why.into())), none);
        }
        let mut legs: Vec<Option<FaultDisk<Disk>>> = Vec::new();
        let mut volume: Option<[u8; 16]> = None;
        let selectors = config.disk.iter().chain(&config.mirror);
        for (i, &selector) in selectors.enumerate() {
            let opened = match disk::open(Some(selector), DiskOptions::for_config(config)).await {
                Ok(d) => d,
                Err(e) => {
                    warn!("fs: mirror leg disk={selector}: {e}: missing");
                    continue;
                }
            };
            let leg = if i == 0 {
                with_faults(opened, config)
            } else {
                FaultDisk::with_clock(opened, config.fault_seed, || crate::clock::now().as_nanos())
            };
            let name = leg.inner().device_name();
            let address = leg.inner().pci().address();
            LEGS_IN_USE.lock(|used| used.push(address));
            let label = match read_label(&leg).await {
                Ok(Some(l)) => l,
                Ok(None) => {
                    let why = format!("{name} (disk={selector}) is not a leg of a mirrored volume");
                    return failed(Err(StorageError::Mirror(why)), none);
                }
                Err(why) => {
                    return failed(Err(StorageError::Mirror(format!("{name}: {why}"))), none)
                }
            };
            if volume.is_some_and(|u| u != label.uuid || legs.len() != label.legs as usize) {
                let why = format!("{name} (disk={selector}) is a leg of another volume");
                return failed(Err(StorageError::Mirror(why)), none);
            }
            volume = Some(label.uuid);
            legs.resize_with(label.legs as usize, || None);
            let place = &mut legs[label.place as usize];
            if place.is_some() {
                let why = format!("leg {} given twice", label.place);
                return failed(Err(StorageError::Mirror(why)), none);
            }
            info!("fs: {name}: leg {} of {}", label.place, label.legs);
            *place = Some(leg);
        }
        let mirror = match MirrorDisk::new(legs) {
            Ok(m) => m.with_opener(leg_opener(config)),
            Err(e) => return failed(Err(StorageError::Mirror(format!("{e}"))), none),
        };
        let disk = counted(mirror);
        let name = disk.inner().device_name();
        let opts = mount_options(heap_bytes, config);
        failed(mount_formatted(disk, name, opts).await, Some(disk))
    }

    /// The PCI functions of the mirror's legs: `ctl replace` never opens one twice
    /// (a second driver instance would reset a device in service).
    static LEGS_IN_USE: IrqLock<Vec<PciAddress>> = IrqLock::new(Vec::new());

    /// How `ctl replace LEG DEVICE` opens DEVICE (a `disk=` selector) on the appliance:
    /// with the drivers' options of the command line, behind a fault injector as the
    /// other legs (unarmed).
    fn leg_opener(config: &Config) -> Opener<FaultDisk<Disk>> {
        let options = DiskOptions::for_config(config);
        let seed = config.fault_seed;
        Opener(Box::new(move |name: String| {
            Box::pin(async move {
                let selector = DiskSelector::parse(&name).map_err(|e| format!("{name}: {e}"))?;
                let address = disk::address_of(selector).map_err(|e| format!("{name}: {e}"))?;
                let fresh = LEGS_IN_USE.lock(|used| {
                    let fresh = !used.contains(&address);
                    if fresh {
                        used.push(address);
                    }
                    fresh
                });
                if !fresh {
                    return Err(format!("{name}: the device at {address} is in use"));
                }
                match disk::open(Some(selector), options).await {
                    Ok(d) => {
                        info!("fs: {}: opened for ctl replace", d.device_name());
                        Ok(FaultDisk::with_clock(d, seed, || {
                            crate::clock::now().as_nanos()
                        }))
                    }
                    Err(e) => {
                        LEGS_IN_USE.lock(|used| used.retain(|a| *a != address));
                        Err(format!("{name}: {e}"))
                    }
                }
            }) as Pin<Box<dyn Future<Output = Result<FaultDisk<Disk>, String>>>>
        }))
    }

    /// The label in block 0 of `disk`, if it is a leg of a mirrored volume.
    async fn read_label(disk: &impl BlockDevice) -> Result<Option<DeviceLabel>, String> {
        let dev = Dev::new(disk).map_err(|e| format!("{e:?}"))?;
        let mut buf = alloc::vec![0u8; BLOCK_SIZE];
        dev.read(LABEL_BLOCK, &mut buf)
            .await
            .map_err(|e| format!("reading its label: {e}"))?;
        DeviceLabel::decode(&buf).map_err(|e| format!("its label: {e:?}"))
    }

    /// Formats `disk` if `config.mkfs` says so, and mounts it.
    async fn mount_disk(
        disk: &'static CountingDisk<FaultDisk<Disk>>,
        config: &Config,
        heap_bytes: u64,
    ) -> Result<Mounted<FaultDisk<Disk>>, StorageError> {
        let name = disk.inner().device_name();
        let g = disk.geometry();
        info!(
            "fs: disk {name}: {} MiB, {}-byte blocks, {} write cache, {} FUA",
            g.capacity_bytes() >> 20,
            g.block_size,
            if g.volatile_cache { "volatile" } else { "no" },
            if g.native_fua { "native" } else { "emulated" }
        );

        let blank = !has_magic(disk).await;
        match (config.mkfs, blank) {
            (Mkfs::Force, _) | (Mkfs::IfBlank, true) => format_disk(disk, &name).await?,
            (Mkfs::IfBlank, false) => {
                info!("fs: mkfs: {name} already holds a ninefold filesystem; mounting it as it is");
                event::emit(Event::Mkfs {
                    device: name.as_str().into(),
                    formatted: false,
                });
            }
            (Mkfs::Off, true) => return Err(StorageError::Unformatted(name)),
            (Mkfs::Off, false) => {}
        }
        mount_formatted(disk, name, mount_options(heap_bytes, config)).await
    }

    /// Mounts the filesystem on `disk` and logs what it found.
    async fn mount_formatted<D: BlockDevice>(
        disk: &'static CountingDisk<D>,
        name: String,
        opts: MountOptions,
    ) -> Result<Mounted<D>, StorageError> {
        let dev =
            Dev::new(disk).map_err(|e| StorageError::Mount(name.clone(), MountError::Device(e)))?;
        let (sb, copies) = match ninefs::volume::read_superblock(&dev).await {
            Ok(found) => found,
            Err(MountError::NoSuperblock(_)) => return Err(StorageError::Damaged(name)),
            Err(e) => return Err(StorageError::Mount(name, e)),
        };
        if copies != [true, true] {
            warn!("fs: {name}: one superblock copy is invalid (a torn last write, or damage): {copies:?}");
        }
        let clean = sb.state & ninefs::format::superblock::state::CLEAN != 0;
        let cache_limit = opts.cache_limit;
        let started = crate::clock::now();
        // Every hold of the filesystem's core lock is timed (two TSC reads per hold).
        let opts = MountOptions {
            hold_clock: Some(|| crate::clock::now().as_nanos()),
            ..opts
        };
        let fs = NineFs::mount(disk, opts, Box::new(WallClock::new()))
            .await
            .map_err(|e| StorageError::Mount(name.clone(), e))?;
        let took = crate::clock::now() - started;
        let statfs = fs.statfs().await.ok();
        let sb = fs.superblock();
        let log = fs.stats().log;
        let size_mib = (sb.layout.total_blocks * BLOCK_SIZE as u64) >> 20;
        let free_mib = statfs.map_or(0, |s| (s.blocks_free * u64::from(s.block_size)) >> 20);
        info!(
            "fs: mounted {name}: label \"{}\", {} MiB, {} MiB free, {} (mount #{}, checkpoint {}), node cache {} MiB; mount took {} ms",
            label(&sb.label),
            size_mib,
            free_mib,
            if clean {
                "cleanly unmounted"
            } else {
                "NOT cleanly unmounted: recovered to its last checkpoint"
            },
            sb.mount_count,
            sb.checkpoint_seq,
            cache_limit >> 20,
            took.as_millis()
        );
        event::emit(Event::Mounted {
            device: name.as_str().into(),
            label: label(&sb.label).into(),
            size_mib,
            free_mib,
            clean,
            mount_count: sb.mount_count,
            checkpoint: sb.checkpoint_seq,
            replayed_commits: log.replayed_commits,
            replayed_records: log.replayed_records,
            dropped_commits: log.dropped_commits,
            unverified_commits: log.unverified_commits,
            ms: took.as_millis() as u64,
        });
        Ok(Mounted {
            fs,
            disk,
            name,
            cache_limit,
        })
    }

    /// Whether either superblock slot starts with the ninefold magic (the disk was formatted
    /// once, whatever state it is in now).
    async fn has_magic(disk: &impl BlockDevice) -> bool {
        let Ok(dev) = Dev::new(disk) else {
            return false;
        };
        let mut buf = alloc::vec![0u8; BLOCK_SIZE];
        for b in ninefs::format::layout::SUPERBLOCK_BLOCKS {
            if dev.read(b, &mut buf).await.is_ok() && buf[..MAGIC.len()] == MAGIC {
                return true;
            }
        }
        false
    }

    async fn format_disk(disk: &impl BlockDevice, name: &str) -> Result<(), StorageError> {
        let seed = entropy();
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&seed[0].to_le_bytes());
        uuid[8..].copy_from_slice(&seed[1].to_le_bytes());
        let now = WallClock::new();
        let opts = FormatOptions {
            label: LABEL.into(),
            uuid,
            secret: seed[2],
            now: vfs::Clock::now(&now),
            ..FormatOptions::default()
        };
        info!("fs: mkfs: formatting {name} (label \"ninefold\")");
        mkfs(&disk, &opts)
            .await
            .map_err(|e| StorageError::Format(name.into(), e))?;
        info!("fs: mkfs: done");
        event::emit(Event::Mkfs {
            device: name.into(),
            formatted: true,
        });
        Ok(())
    }

    /// Three random words for the filesystem's identity and hash secret: RDRAND where the
    /// CPU has it, else the TSC and the RTC stirred (unpredictable enough across boots for
    /// a uuid and a hash key; not key material).
    fn entropy() -> [u64; 3] {
        let rdrand = x86_64::instructions::random::RdRand::new();
        let mut state = crate::hal::cpu::rdtsc()
            ^ (crate::clock::rtc::read_epoch_seconds() as u64).rotate_left(32);
        core::array::from_fn(|_| {
            if let Some(v) = rdrand.and_then(|r| r.get_u64()) {
                return v;
            }
            state ^= crate::hal::cpu::rdtsc();
            splitmix64(&mut state)
        })
    }

    fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn label(raw: &[u8]) -> String {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        String::from_utf8_lossy(&raw[..end]).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_ram_disk_is_a_quarter_of_the_heap() {
        assert_eq!(memory_disk_bytes(94 * MIB), 94 * MIB / 4 / 4096 * 4096);
        assert_eq!(memory_disk_bytes(MIB), MIN_MEMORY_DISK);
        assert_eq!(memory_disk_bytes(1 << 40), MAX_MEMORY_DISK);
    }

    #[test]
    fn cache_scales_with_the_heap() {
        let c = Config::default();
        // 128 MiB of RAM: a 94 MiB heap.
        let small = mount_options(94 * MIB, &c);
        assert_eq!(small.cache_limit as u64, 94 * MIB / CACHE_SHARE);
        assert_eq!(small.data_cache as u64, 94 * MIB / DATA_CACHE_SHARE);
        assert_eq!(small.max_groups, 376);
        // make run's 512 MiB: about 375 MiB of heap.
        assert_eq!(mount_options(375 * MIB, &c).cache_limit as u64, 75 * MIB);
        assert_eq!(mount_options(MIB, &c).cache_limit as u64, MIN_CACHE);
        assert_eq!(mount_options(64 << 30, &c).cache_limit as u64, MAX_CACHE);
        assert_eq!(
            mount_options(64 << 30, &c).data_cache as u64,
            MAX_DATA_CACHE
        );
        assert_eq!(mount_options(MIB, &c).max_groups, 256);
        assert_eq!(
            mount_options(MIB, &c).data_cache as u64,
            MIB / 2,
            "at most half the heap"
        );
    }

    #[test]
    fn the_command_line_sets_the_data_cache_and_readahead() {
        let c = Config::parse(
            "data_cache=40 readahead=off discard=off snapshots=9",
            |_| {},
        );
        let o = mount_options(94 * MIB, &c);
        assert_eq!((o.data_cache as u64, o.readahead), (40 * MIB, 0));
        assert_eq!((o.discard, o.max_snapshots), (None, 9));
        let c = Config::parse("data_cache=0 readahead=512", |_| {});
        let o = mount_options(94 * MIB, &c);
        assert_eq!((o.data_cache, o.readahead), (0, 512 << 10));
    }
}
