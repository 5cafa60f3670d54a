//! [`VirtioBlk`]: a virtio block device as a [`BlockDevice`], over the `virtio-drivers`
//! crate's PCI transport and virtqueue (see `hal::virtio` and `docs/drivers.md` for why
//! not its `VirtIOBlk`).
//!
//! Up to 85 requests are in flight in one 256-descriptor queue. Each request's data is
//! copied through a DMA stream it owns (see [`bounce`](crate::drivers::bounce)), which the
//! virtqueue holds until the completion. The reaper task notifies the device once for
//! every request queued since it last ran and consumes completions (woken by MSI-X, or
//! polling). virtio has no FUA: a FUA write is a write then a FLUSH. A request that times
//! out resets the device and stops its bus mastering (which ends its DMA), fails
//! everything in flight with [`IoError::Timeout`] and brings the device up again.

use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::fmt;
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
use crate::drivers::reaper::{self, Health, Reaped};
use crate::drivers::{irq_event, CompletionMode, DEFAULT_BOUNCE_POOL};
use crate::exec::IrqEvent;
use crate::hal::dma::DmaStats;
use crate::hal::virtio::{self, MsixRouteError};
use crate::irq::IrqHandle;
use crate::mm::{DmaDevice, DmaStream};
use crate::pci::device::{MsixTable, PciDevice};
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

#[derive(Debug)]
struct Inner {
    pci: PciDevice,
    dma: DmaDevice,
    bounce: Bounce,
    transport: RefCell<PciTransport>,
    ring: RefCell<BlkRing<QUEUE_SIZE>>,
    slots: RefCell<Slots<Outcome>>,
    deadlines: RefCell<Vec<Instant>>,
    geometry: Geometry,
    features: Features,
    max_discard_sectors: u32,
    options: Options,
    /// Requests queued since the last notification.
    unnotified: Cell<bool>,
    kick: Arc<IrqEvent>,
    event: Option<Arc<IrqEvent>>,
    health: Cell<Health>,
    stats: Cell<VirtioBlkStats>,
    msix: Option<MsixTable>,
    irq: Option<IrqHandle>,
    /// Fault injection: drop the next completion, as if the device lost it.
    lose_next: Cell<bool>,
}

/// A virtio block device. See the module documentation.
#[derive(Debug)]
pub struct VirtioBlk {
    inner: Rc<Inner>,
}

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
        let inner = Rc::new(Inner {
            pci,
            bounce: Bounce::new(&dma, options.bounce_pool),
            dma,
            transport: RefCell::new(t),
            ring: RefCell::new(ring),
            slots: RefCell::new(Slots::new(SLOTS)),
            deadlines: RefCell::new(alloc::vec![Instant::ZERO; SLOTS]),
            geometry,
            features,
            max_discard_sectors: cfg.max_discard_sectors,
            options,
            unnotified: Cell::new(false),
            kick: Arc::new(IrqEvent::new()),
            event,
            health: Cell::new(Health::Running),
            stats: Cell::new(VirtioBlkStats::default()),
            msix,
            irq,
            lose_next: Cell::new(false),
        });
        task::spawn(reaper::run(
            Rc::downgrade(&inner),
            inner.kick.clone(),
            inner.event.clone(),
            options.mode == CompletionMode::Poll,
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
        let mut s = i.stats.get();
        s.slots = i.slots.borrow().stats();
        s.interrupts = i.irq.as_ref().map_or(0, |h| h.count());
        s.dma = i.dma.stats();
        s.bounce = i.bounce.stats();
        s
    }

    /// Fault injection for self-tests: the next completion is dropped, as if the device
    /// had lost it, so its request runs into the timeout and recovery path.
    pub fn inject_lost_completion(&self) {
        self.inner.lose_next.set(true);
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
        // The reaper holds only a weak reference; wake it so it notices and ends.
        self.inner.kick.signal();
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
        i.bump(|s| {
            s.writes += 1;
            s.fua_writes += u64::from(flags.fua);
        });
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
            i.bump(|s| s.discards += 1);
            i.discard_sectors(next, n).await?;
            next += u64::from(n);
        }
        Ok(())
    }
}

impl SlotQueue for Inner {
    type Output = Outcome;

    fn slots(&self) -> &RefCell<Slots<Outcome>> {
        &self.slots
    }
}

impl Reaped for Inner {
    fn health(&self) -> Health {
        self.health.get()
    }

    fn reap(&self) {
        Inner::reap(self);
    }

    fn in_device(&self) -> usize {
        self.slots.borrow().in_device()
    }

    async fn restart(&self) {
        log::warn!("virtio-blk: {}: restarting the device", self.pci.address());
        let mut t = self.transport.borrow_mut();
        let result = init_device(&mut t, &self.dma).and_then(|(features, _, mut ring)| {
            if features != self.features {
                return Err(VirtioBlkError::Virtio(virtio_drivers::Error::Unsupported));
            }
            match &self.event {
                Some(_) => {
                    virtio::route_queue_msix(&self.pci, 0, 0).map_err(VirtioBlkError::Route)?
                }
                None => ring.set_interrupts(false),
            }
            // The device was reset and cannot master the bus: the old ring and the
            // streams it still holds are freed as it goes.
            *self.ring.borrow_mut() = ring;
            Ok(())
        });
        match result {
            Ok(()) => {
                self.dma.start();
                t.finish_init();
                self.health.set(Health::Running);
                log::info!("virtio-blk: device is back");
            }
            Err(e) => {
                t.set_status(DeviceStatus::empty());
                self.health.set(Health::Dead);
                log::error!("virtio-blk: device could not be restarted ({e}); giving up on it");
            }
        }
    }

    async fn check_timeouts(&self, now: Instant) {
        let late = {
            let deadlines = self.deadlines.borrow();
            self.slots
                .borrow()
                .in_device_slots()
                .any(|s| deadlines[usize::from(s)] <= now)
        };
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
    fn bump(&self, f: impl FnOnce(&mut VirtioBlkStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    fn sector(&self, lba: u64) -> u64 {
        lba * (u64::from(self.geometry.block_size) / SECTOR)
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.bump(|s| s.reads += 1);
        self.request(kind::IN, self.sector(lba), Payload::Read(buf))
            .await
    }

    async fn flush(&self) -> Result<(), IoError> {
        if !self.geometry.volatile_cache {
            // No volatile cache: completed writes are durable.
            return Ok(());
        }
        self.bump(|s| s.flushes += 1);
        self.request(kind::FLUSH, 0, Payload::None).await
    }

    async fn discard_sectors(&self, sector: u64, sectors: u32) -> Result<(), IoError> {
        let segment = DiscardSegment::new(sector, sectors);
        self.request(kind::DISCARD, 0, Payload::Discard(segment))
            .await
    }

    /// One request: waits for a slot, copies the data into a DMA stream (writes), queues
    /// it with the stream, waits for completion and copies the data out (reads).
    async fn request(&self, kind: u32, sector: u64, payload: Payload<'_>) -> Result<(), IoError> {
        let mut req = Request::acquire(self).await;
        reaper::running(&self.health).await?;
        let data = match &payload {
            Payload::None => BlkData::None,
            Payload::Write(src) => BlkData::ToDevice(self.bounce.for_write(src).await?),
            Payload::Read(dst) => BlkData::FromDevice(self.bounce.for_read(dst.len()).await?),
            Payload::Discard(segment) => BlkData::Segment(*segment),
        };
        self.deadlines.borrow_mut()[usize::from(req.slot())] = task::now() + self.options.timeout;
        let header = RequestHeader::new(kind, sector);
        if let Err((data, e)) = self.ring.borrow_mut().push(req.slot(), header, data) {
            // Cannot happen: there are never more requests than the ring holds.
            log::error!("virtio-blk: queueing failed: {e:?}");
            if let Some(stream) = data {
                self.bounce.give_back(stream);
            }
            return Err(IoError::NoMemory);
        }
        req.submitted();
        self.unnotified.set(true);
        self.kick.signal();
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

    /// Consumes completions, then notifies the device of requests queued meanwhile.
    fn reap(&self) {
        if self.health.get() != Health::Running {
            return;
        }
        let mut ring = self.ring.borrow_mut();
        let mut slots = self.slots.borrow_mut();
        let mut errors = 0;
        while let Some(popped) = ring.pop() {
            let Popped { slot, status, data } = match popped {
                Ok(done) => done,
                Err(token) => {
                    log::error!(
                        "virtio-blk: device returned descriptor {token} it was never given"
                    );
                    drop((ring, slots));
                    self.stop_device();
                    return;
                }
            };
            if self.lose_next.replace(false) {
                log::warn!("virtio-blk: fault injection: dropping the completion of slot {slot}");
                continue;
            }
            let status = wire::result(status);
            if let Err(e) = status {
                errors += 1;
                log::warn!("virtio-blk: request in slot {slot} failed: {e} (status {status:?})");
            }
            // An abandoned request's outcome (and stream) is dropped by the slot table.
            if slots.complete(slot, Outcome { status, data }) == Completed::Stray {
                log::warn!("virtio-blk: completion for idle slot {slot}");
            }
        }
        let notify = self.unnotified.replace(false) && ring.should_notify();
        drop((ring, slots));
        if notify {
            self.transport.borrow_mut().notify(0);
        }
        self.bump(|s| {
            s.reaps += 1;
            s.errors += errors;
            s.notifies += u64::from(notify);
        });
    }

    /// Resets the device and stops its bus mastering (which ends its DMA at once), and
    /// fails everything in flight; the reaper then restarts it (or, if the reset did not
    /// take, gives up on it: it may still hold the old queue's addresses).
    fn stop_device(&self) {
        let reset = virtio::reset(&mut self.transport.borrow_mut());
        self.dma.stop();
        let busy: Vec<u16> = self.slots.borrow().in_device_slots().collect();
        let mut slots = self.slots.borrow_mut();
        for &slot in &busy {
            // The streams stay with the old ring, which is freed when it is replaced.
            let failed = Outcome {
                status: Err(IoError::Timeout),
                data: None,
            };
            slots.complete(slot, failed);
        }
        drop(slots);
        self.bump(|s| {
            s.resets += 1;
            s.timeouts += busy.len() as u64;
        });
        if !reset {
            log::error!("virtio-blk: the device did not confirm its reset; giving up on it");
            self.health.set(Health::Dead);
        } else if self.health.get() == Health::Running {
            self.health.set(Health::Restarting);
        }
        self.kick.signal();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Stop the device before its queue memory is freed.
        virtio::reset(self.transport.get_mut());
        self.dma.stop();
        if let Some(m) = &self.msix {
            m.disable();
        }
    }
}
