//! [`VirtioBlk`]: a virtio block device as a [`BlockDevice`], over the `virtio-drivers`
//! crate's PCI transport and virtqueue (see `hal::virtio` and `docs/drivers.md` for why
//! not its `VirtIOBlk`).
//!
//! Up to 85 requests are in flight in one 256-descriptor queue. Each request's data is
//! copied through a DMA stream it owns (see [`bounce`](crate::drivers::bounce)), which the
//! virtqueue holds until the completion. The queue's reaper task notifies the device
//! once for every request queued since it last ran and consumes completions (woken by
//! MSI-X, or polling), on the CPU that opened the device; requests may come from any CPU
//! (the queue's state is under one [`IrqLock`]). virtio has no FUA: a FUA write is a
//! write then a FLUSH. A request that times out makes the supervisor task reset the
//! device and stop its bus mastering (which ends its DMA), fail everything in flight
//! with [`IoError::Timeout`] and bring the device up again.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::time::Duration;

use block::{check_request, BlockDevice, Geometry, IoError, WriteFlags};
use virtio_drivers::transport::pci::{PciTransport, VirtioPciError};
use virtio_drivers::transport::{DeviceStatus, DeviceType, Transport};

use super::ring::{BlkData, BlkRing, Popped};
use super::wire::{
    self, config, kind, ConfigError, DeviceConfig, DiscardSegment, Features, RequestHeader, SECTOR,
};
use crate::drivers::bounce::{Bounce, BounceStats};
use crate::drivers::inflight::{Completed, Request, SlotQueue, SlotStats, Slots};
use crate::drivers::reaper::{self, Health, Reaped, SharedHealth};
use crate::drivers::{irq_event, CompletionMode, DEFAULT_BOUNCE_POOL};
use crate::exec::IrqEvent;
use crate::hal::dma::DmaStats;
use crate::hal::virtio::{self, MsixRouteError};
use crate::irq::IrqHandle;
use crate::mm::{DmaDevice, DmaStream};
use crate::pci::device::{MsixTable, PciDevice};
use crate::sync::IrqLock;
use crate::task;
use crate::time::Instant;

/// Descriptors in the request queue (QEMU's default queue size).
const QUEUE_SIZE: usize = 256;
/// Requests in flight: three descriptors each.
const SLOTS: usize = QUEUE_SIZE / 3;

/// How to run a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Interrupts or polling for completions.
    pub mode: CompletionMode,
    /// How long a request may take before the device is reset.
    pub timeout: Duration,
    /// Bytes of finished requests' DMA streams kept for the next requests.
    pub bounce_pool: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: CompletionMode::Interrupt,
            timeout: Duration::from_secs(30),
            bounce_pool: DEFAULT_BOUNCE_POOL,
        }
    }
}

/// Why a device could not be brought up.
#[derive(Clone, Debug)]
pub enum VirtioBlkError {
    /// The PCI transport could not be set up.
    Transport(VirtioPciError),
    /// The device is not a block device.
    NotBlock,
    /// The crate refused (configuration space, queue setup, DMA memory).
    Virtio(virtio_drivers::Error),
    /// The configuration does not describe a usable disk.
    Config(ConfigError),
    /// No MSI-X (interrupt mode needs it).
    NoMsix,
    /// No free interrupt vector.
    NoVector,
    /// The device would not take our MSI-X routing.
    Route(MsixRouteError),
    /// Another driver instance still holds the device's DMA.
    InUse,
}

impl fmt::Display for VirtioBlkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VirtioBlkError::Transport(e) => write!(f, "virtio PCI transport: {e}"),
            VirtioBlkError::NotBlock => f.write_str("not a virtio block device"),
            VirtioBlkError::Virtio(e) => write!(f, "virtio: {e}"),
            VirtioBlkError::Config(e) => write!(f, "unusable configuration: {e:?}"),
            VirtioBlkError::NoMsix => f.write_str("no MSI-X"),
            VirtioBlkError::NoVector => f.write_str("no free interrupt vector"),
            VirtioBlkError::Route(e) => write!(f, "MSI-X routing: {e:?}"),
            VirtioBlkError::InUse => f.write_str("already in use by another driver instance"),
        }
    }
}

/// Counters, per cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioBlkStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// FUA writes (each followed by a FLUSH request).
    pub fua_writes: u64,
    /// FLUSH requests.
    pub flushes: u64,
    /// DISCARD requests.
    pub discards: u64,
    /// Requests that completed with an error status.
    pub errors: u64,
    /// Requests failed by a timeout reset.
    pub timeouts: u64,
    /// Device resets.
    pub resets: u64,
    /// Queue notifications (doorbell writes).
    pub notifies: u64,
    /// Reaper passes.
    pub reaps: u64,
    /// Interrupts on the queue's vector.
    pub interrupts: u64,
    /// Bounce buffers (every transfer is copied through one).
    pub bounce: BounceStats,
    /// Slot table.
    pub slots: SlotStats,
    /// DMA memory.
    pub dma: DmaStats,
}

/// How a request ended, and its data stream, back from the device.
#[derive(Debug)]
struct Outcome {
    status: Result<(), IoError>,
    data: Option<DmaStream>,
}

/// What a request moves.
enum Payload<'a> {
    /// Nothing (flush).
    None,
    /// These bytes to the device (write).
    Write(&'a [u8]),
    /// From the device into this buffer (read).
    Read(&'a mut [u8]),
    /// This discard segment.
    Discard(DiscardSegment),
}

/// The request queue's state, under its lock: the ring, the slot table and each slot's
/// deadline.
#[derive(Debug)]
struct QueueState {
    ring: BlkRing<QUEUE_SIZE>,
    slots: Slots<Outcome>,
    deadlines: Vec<Instant>,
    /// Requests queued since the last notification.
    unnotified: bool,
}

/// [`VirtioBlkStats`]' own counters, updated from any CPU.
#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    resets: AtomicU64,
    notifies: AtomicU64,
    reaps: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

#[derive(Debug)]
struct Inner {
    pci: PciDevice,
    dma: DmaDevice,
    bounce: Bounce,
    transport: IrqLock<PciTransport>,
    queue: IrqLock<QueueState>,
    geometry: Geometry,
    features: Features,
    max_discard_sectors: u32,
    options: Options,
    /// Wakes the queue's reaper: submissions to notify, the queue's interrupt (its
    /// vector signals it), a health change.
    event: Arc<IrqEvent>,
    /// Kicks the supervisor: a health change, or the handle's drop.
    work: Arc<IrqEvent>,
    health: SharedHealth,
    counters: Counters,
    msix: Option<MsixTable>,
    irq: Option<IrqHandle>,
    /// Fault injection: drop the next completion, as if the device lost it.
    lose_next: AtomicBool,
}

/// A virtio block device, usable from every CPU (`Send + Sync`); its one queue's reaper
/// and its supervisor run on the CPU that opened it. See the module documentation.
#[derive(Debug)]
pub struct VirtioBlk {
    inner: Arc<Inner>,
}

const _: () = {
    const fn shared_by_cpus<T: Send + Sync>() {}
    shared_by_cpus::<VirtioBlk>();
};

/// Negotiates features, reads the configuration and sets up the request queue in DMA
/// memory of `dma` (the device is left before DRIVER_OK, without bus mastering).
fn init_device(
    t: &mut PciTransport,
    dma: &DmaDevice,
) -> Result<(Features, DeviceConfig, BlkRing<QUEUE_SIZE>), VirtioBlkError> {
    let features = t.begin_init(Features::WANTED);
    let read = |offset| {
        t.read_config_space::<u32>(offset)
            .map_err(VirtioBlkError::Virtio)
    };
    let optional = |f: Features, offset| {
        if features.contains(f) {
            read(offset)
        } else {
            Ok(0)
        }
    };
    let config = DeviceConfig {
        capacity: u64::from(read(config::CAPACITY)?) | u64::from(read(config::CAPACITY + 4)?) << 32,
        size_max: optional(Features::SIZE_MAX, config::SIZE_MAX)?,
        blk_size: optional(Features::BLK_SIZE, config::BLK_SIZE)?,
        max_discard_sectors: optional(Features::DISCARD, config::MAX_DISCARD_SECTORS)?,
        max_discard_seg: optional(Features::DISCARD, config::MAX_DISCARD_SEG)?,
    };
    let ring = BlkRing::new(t, 0, SLOTS, dma).map_err(VirtioBlkError::Virtio)?;
    Ok((features, config, ring))
}

impl VirtioBlk {
    /// Brings up the virtio block device at `pci`.
    pub async fn open(pci: PciDevice, options: Options) -> Result<VirtioBlk, VirtioBlkError> {
        let mut t = virtio::pci_transport(&pci).map_err(VirtioBlkError::Transport)?;
        if t.device_type() != DeviceType::Block {
            return Err(VirtioBlkError::NotBlock);
        }
        let dma = DmaDevice::new(pci).map_err(|_| VirtioBlkError::InUse)?;
        let setup = init_device(&mut t, &dma).and_then(|(features, cfg, mut ring)| {
            let geometry = wire::geometry(features, &cfg).map_err(VirtioBlkError::Config)?;
            let irq = match options.mode {
                CompletionMode::Interrupt => {
                    let table = pci.msix().map_err(|_| VirtioBlkError::NoMsix)?;
                    let (handle, e) = irq_event().map_err(|_| VirtioBlkError::NoVector)?;
                    table.set(0, &handle);
                    virtio::route_queue_msix(&pci, 0, 0).map_err(VirtioBlkError::Route)?;
                    table.enable();
                    Some((table, handle, e))
                }
                CompletionMode::Poll => {
                    ring.set_interrupts(false);
                    None
                }
            };
            Ok((features, cfg, ring, geometry, irq))
        });
        let (features, cfg, ring, geometry, irq) = match setup {
            Ok(s) => s,
            Err(e) => {
                // Reset: the device must not keep a queue whose memory is gone.
                t.set_status(DeviceStatus::empty());
                return Err(e);
            }
        };
        let (msix, irq, event) = match irq {
            Some((m, h, e)) => (Some(m), Some(h), Some(e)),
            None => (None, None, None),
        };
        dma.start();
        t.finish_init();
        let inner = Arc::new(Inner {
            pci,
            bounce: Bounce::new(&dma, options.bounce_pool),
            dma,
            transport: IrqLock::new(t),
            queue: IrqLock::new(QueueState {
                ring,
                slots: Slots::new(SLOTS),
                deadlines: alloc::vec![Instant::ZERO; SLOTS],
                unnotified: false,
            }),
            geometry,
            features,
            max_discard_sectors: cfg.max_discard_sectors,
            options,
            event: event.unwrap_or_default(),
            work: Arc::new(IrqEvent::new()),
            health: SharedHealth::new(),
            counters: Counters::default(),
            msix,
            irq,
            lose_next: AtomicBool::new(false),
        });
        let poll = options.mode == CompletionMode::Poll;
        task::spawn(reaper::serve_queue(
            Arc::downgrade(&inner),
            0,
            inner.event.clone(),
            poll,
        ));
        task::spawn(reaper::supervise(
            Arc::downgrade(&inner),
            inner.work.clone(),
        ));
        log::info!(
            "virtio-blk: {}: {} x {} B ({} MiB), max transfer {} KiB, {SLOTS} requests in flight, flush {}, discard {}{}, {:?} completions",
            pci.address(),
            geometry.num_blocks,
            geometry.block_size,
            geometry.capacity_bytes() >> 20,
            geometry.max_transfer / 1024,
            if geometry.volatile_cache { "yes" } else { "no" },
            if geometry.discard { "yes" } else { "no" },
            if features.contains(Features::RO) { ", read-only" } else { "" },
            options.mode,
        );
        Ok(VirtioBlk { inner })
    }

    /// The PCI function.
    pub fn pci(&self) -> PciDevice {
        self.inner.pci
    }

    /// The counters.
    pub fn stats(&self) -> VirtioBlkStats {
        let i = &self.inner;
        let c = &i.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VirtioBlkStats {
            reads: get(&c.reads),
            writes: get(&c.writes),
            fua_writes: get(&c.fua_writes),
            flushes: get(&c.flushes),
            discards: get(&c.discards),
            errors: get(&c.errors),
            timeouts: get(&c.timeouts),
            resets: get(&c.resets),
            notifies: get(&c.notifies),
            reaps: get(&c.reaps),
            interrupts: i.irq.as_ref().map_or(0, |h| h.count()),
            bounce: i.bounce.stats(),
            slots: i.queue.lock(|q| q.slots.stats()),
            dma: i.dma.stats(),
        }
    }

    /// Fault injection for self-tests: the next completion is dropped, as if the device
    /// had lost it, so its request runs into the timeout and recovery path.
    pub fn inject_lost_completion(&self) {
        self.inner.lose_next.store(true, Ordering::SeqCst);
    }

    /// Reads without checking the range against the capacity, so the device itself
    /// rejects what lies beyond it (for self-tests of error statuses).
    pub async fn read_unchecked(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.inner.geometry, 0, buf.len())?;
        self.inner.read(lba, buf).await
    }
}

impl Drop for VirtioBlk {
    fn drop(&mut self) {
        // The reapers hold only weak references; wake them so they notice and end.
        self.inner.event.signal();
        self.inner.work.signal();
    }
}

impl BlockDevice for VirtioBlk {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.inner.geometry, lba, buf.len())?;
        self.inner.read(lba, buf).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        let i = &self.inner;
        check_request(&i.geometry, lba, buf.len())?;
        if i.features.contains(Features::RO) {
            return Err(IoError::Unsupported);
        }
        add(&i.counters.writes, 1);
        add(&i.counters.fua_writes, u64::from(flags.fua));
        i.request(kind::OUT, i.sector(lba), Payload::Write(buf))
            .await?;
        if flags.fua {
            // No FUA in virtio: the write is durable once a flush after it completes.
            i.flush().await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.inner.flush().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        let i = &self.inner;
        if !i.geometry.discard {
            return Err(IoError::Unsupported);
        }
        let end = match lba.checked_add(blocks) {
            Some(end) if end <= i.geometry.num_blocks => i.sector(end),
            _ => return Err(IoError::OutOfRange),
        };
        let mut next = i.sector(lba);
        while next < end {
            let n = (end - next).min(u64::from(i.max_discard_sectors)) as u32;
            add(&i.counters.discards, 1);
            i.discard_sectors(next, n).await?;
            next += u64::from(n);
        }
        Ok(())
    }
}

impl SlotQueue for Inner {
    type Output = Outcome;
    type State = QueueState;

    fn with_state<T>(&self, f: impl FnOnce(&mut QueueState) -> T) -> T {
        self.queue.lock(f)
    }

    fn slots(state: &mut QueueState) -> &mut Slots<Outcome> {
        &mut state.slots
    }
}

impl Reaped for Inner {
    fn health(&self) -> Health {
        self.health.get()
    }

    fn reap(&self, _queue: usize) -> usize {
        Inner::reap(self)
    }

    fn in_device(&self) -> usize {
        self.queue.lock(|q| q.slots.in_device())
    }

    async fn restart(&self) {
        log::warn!("virtio-blk: {}: restarting the device", self.pci.address());
        let result = self.transport.lock(|t| {
            let (features, _, mut ring) = init_device(t, &self.dma)?;
            if features != self.features {
                return Err(VirtioBlkError::Virtio(virtio_drivers::Error::Unsupported));
            }
            match &self.irq {
                Some(_) => {
                    virtio::route_queue_msix(&self.pci, 0, 0).map_err(VirtioBlkError::Route)?
                }
                None => ring.set_interrupts(false),
            }
            // The device was reset and cannot master the bus: the old ring and the
            // streams it still holds are freed as it goes (outside the queue's lock).
            let old = self.queue.lock(|q| core::mem::replace(&mut q.ring, ring));
            drop(old);
            self.dma.start();
            t.finish_init();
            Ok(())
        });
        match result {
            Ok(()) => {
                self.health.set(Health::Running);
                log::info!("virtio-blk: device is back");
            }
            Err(e) => {
                self.transport.lock(|t| t.set_status(DeviceStatus::empty()));
                self.health.set(Health::Dead);
                log::error!("virtio-blk: device could not be restarted ({e}); giving up on it");
            }
        }
        // The queue's reaper looks again (or ends).
        self.event.signal();
    }

    async fn check_timeouts(&self, now: Instant) {
        let late = self.queue.lock(|q| {
            q.slots
                .in_device_slots()
                .any(|s| q.deadlines[usize::from(s)] <= now)
        });
        if late {
            log::warn!(
                "virtio-blk: a request took longer than {:?}; resetting the device",
                self.options.timeout
            );
            self.stop_device();
        }
    }
}

impl Inner {
    fn sector(&self, lba: u64) -> u64 {
        lba * (u64::from(self.geometry.block_size) / SECTOR)
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        add(&self.counters.reads, 1);
        self.request(kind::IN, self.sector(lba), Payload::Read(buf))
            .await
    }

    async fn flush(&self) -> Result<(), IoError> {
        if !self.geometry.volatile_cache {
            // No volatile cache: completed writes are durable.
            return Ok(());
        }
        add(&self.counters.flushes, 1);
        self.request(kind::FLUSH, 0, Payload::None).await
    }

    async fn discard_sectors(&self, sector: u64, sectors: u32) -> Result<(), IoError> {
        let segment = DiscardSegment::new(sector, sectors);
        self.request(kind::DISCARD, 0, Payload::Discard(segment))
            .await
    }

    /// One request: waits for a slot, copies the data into a DMA stream (writes), queues
    /// it with the stream once the device runs, waits for completion and copies the data
    /// out (reads).
    async fn request(&self, kind: u32, sector: u64, payload: Payload<'_>) -> Result<(), IoError> {
        let mut req = Request::acquire(self).await;
        self.health.running().await?;
        let mut data = Some(match &payload {
            Payload::None => BlkData::None,
            Payload::Write(src) => BlkData::ToDevice(self.bounce.for_write(src).await?),
            Payload::Read(dst) => BlkData::FromDevice(self.bounce.for_read(dst.len()).await?),
            Payload::Discard(segment) => BlkData::Segment(*segment),
        });
        let header = RequestHeader::new(kind, sector);
        let slot = req.slot();
        loop {
            let deadline = task::now() + self.options.timeout;
            let handed = req.submit(|q| {
                // Checked under the queue's lock: a reset after this fails the request
                // with everything else in flight.
                if self.health.get() != Health::Running {
                    return Err(None);
                }
                q.deadlines[usize::from(slot)] = deadline;
                let data = data.take().expect("queued once");
                q.ring.push(slot, header, data).map_err(Some)?;
                q.unnotified = true;
                Ok(())
            });
            match handed {
                Ok(()) => break,
                // The device is being reset: queue it once it is back.
                Err(None) => self.health.running().await?,
                Err(Some((stream, e))) => {
                    // Cannot happen: there are never more requests than the ring holds.
                    log::error!("virtio-blk: queueing failed: {e:?}");
                    if let Some(stream) = stream {
                        self.bounce.give_back(stream);
                    }
                    return Err(IoError::NoMemory);
                }
            }
        }
        self.event.signal();
        let Outcome { status, data: back } = req.wait().await;
        status?;
        match (payload, back) {
            (Payload::Read(dst), Some(back)) => self.bounce.copy_out(back, dst),
            (Payload::Read(_), None) => unreachable!("a read's stream comes back with it"),
            (_, Some(back)) => self.bounce.give_back(back),
            (_, None) => {}
        }
        Ok(())
    }

    /// Consumes completions, then notifies the device of requests queued meanwhile;
    /// returns how many requests the device still holds.
    fn reap(&self) -> usize {
        let (notify, errors, bad, in_device) = self.queue.lock(|q| {
            if self.health.get() != Health::Running {
                return (false, 0, None, q.slots.in_device());
            }
            let mut errors = 0;
            while let Some(popped) = q.ring.pop() {
                let Popped { slot, status, data } = match popped {
                    Ok(done) => done,
                    Err(token) => return (false, errors, Some(token), 0),
                };
                if self.lose_next.load(Ordering::Relaxed)
                    && self.lose_next.swap(false, Ordering::SeqCst)
                {
                    log::warn!(
                        "virtio-blk: fault injection: dropping the completion of slot {slot}"
                    );
                    continue;
                }
                let status = wire::result(status);
                if let Err(e) = status {
                    errors += 1;
                    log::warn!(
                        "virtio-blk: request in slot {slot} failed: {e} (status {status:?})"
                    );
                }
                // An abandoned request's outcome (and stream) is dropped by the slot table.
                if q.slots.complete(slot, Outcome { status, data }) == Completed::Stray {
                    log::warn!("virtio-blk: completion for idle slot {slot}");
                }
            }
            let notify = core::mem::take(&mut q.unnotified) && q.ring.should_notify();
            (notify, errors, None, q.slots.in_device())
        });
        if let Some(token) = bad {
            log::error!("virtio-blk: device returned descriptor {token} it was never given");
            self.stop_device();
            return 0;
        }
        if notify {
            self.transport.lock(|t| t.notify(0));
        }
        add(&self.counters.reaps, 1);
        add(&self.counters.errors, errors);
        add(&self.counters.notifies, u64::from(notify));
        in_device
    }

    /// Resets the device and stops its bus mastering (which ends its DMA at once), and
    /// fails everything in flight; the supervisor then restarts it (or, if the reset did
    /// not take, gives up on it: it may still hold the old queue's addresses). The health
    /// changes first, so from here on nobody queues or reaps.
    fn stop_device(&self) {
        self.health.stop();
        let reset = self.transport.lock(virtio::reset);
        self.dma.stop();
        let failed = self.queue.lock(|q| {
            let busy: Vec<u16> = q.slots.in_device_slots().collect();
            for &slot in &busy {
                // The streams stay with the old ring, which is freed when it is replaced.
                let failed = Outcome {
                    status: Err(IoError::Timeout),
                    data: None,
                };
                q.slots.complete(slot, failed);
            }
            busy.len() as u64
        });
        add(&self.counters.resets, 1);
        add(&self.counters.timeouts, failed);
        if !reset {
            log::error!("virtio-blk: the device did not confirm its reset; giving up on it");
            self.health.set(Health::Dead);
            self.event.signal();
        }
        self.work.signal();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Stop the device before its queue memory is freed.
        self.transport.lock(virtio::reset);
        self.dma.stop();
        if let Some(m) = &self.msix {
            m.disable();
        }
    }
}
