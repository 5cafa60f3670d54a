//! [`NvmeDisk`]: the block device over an NVMe namespace.
//!
//! The controller gets up to [`MAX_IO_QUEUES`](super::MAX_IO_QUEUES) I/O queue pairs
//! ([`IoQueue`], identifiers `1..=n`, see [`queues`](super::queues)), one per CPU: a
//! request goes to the pair of the CPU it is submitted on (`Options::current_cpu`). It
//! takes a slot of that pair (= command identifier), copies its data into a DMA stream
//! (see [`bounce`](crate::drivers::bounce)), lends the stream to the controller with the
//! slot (PRP1, PRP2 or a PRP list in the slot's list pages), pushes the command to the
//! pair's submission ring and waits for its slot to be completed. The *reaper* task
//! serves every pair: it publishes each submission tail once for all commands queued
//! since it last ran, consumes completions (woken by any I/O queue's MSI-X entry, or
//! polling while commands are outstanding) and takes each command's stream back with its
//! completion, and enforces timeouts: a late command is aborted; if the abort does not
//! resolve it, the controller is halted (which ends its DMA), everything in flight on
//! every pair fails with [`IoError::Timeout`], and the controller is brought up again
//! with all its pairs.

use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::time::Duration;

use block::{check_request, BlockDevice, Geometry, IoError, WriteFlags};

use super::cmd::{cns, Command};
use super::controller::{AdminError, Controller};
use super::identify::{self, oacs, oncs, ControllerInfo, NamespaceInfo};
use super::prp::{self, Second};
use super::queue::{DoorbellStats, QueuePair, ShadowPages};
use super::queues;
use super::{NvmeError, Options};
use crate::drivers::bounce::{Bounce, BounceStats};
use crate::drivers::inflight::{Completed, Request, SlotQueue, SlotStats, Slots};
use crate::drivers::reaper::{self, Health, Reaped};
use crate::drivers::{irq_event, irq_signalling, CompletionMode};
use crate::exec::IrqEvent;
use crate::hal::dma::DmaStats;
use crate::irq::IrqHandle;
use crate::mm::{DmaCoherent, DmaDevice, DmaStream, LentStream};
use crate::pci::device::{MsixTable, PciDevice};
use crate::task;
use crate::time::Instant;

/// The controller page size we configure (CC.MPS = 0).
const PAGE: usize = 4096;
/// Our cap on a single transfer, whatever MDTS allows: 1023 pages, so that a transfer
/// touches at most 1024 pages at any dword offset (QEMU's controller maps at most
/// IOV_MAX = 1024 pages per command and fails larger ones with "internal error"). It
/// still takes two chained PRP list pages.
const MAX_TRANSFER_CAP: usize = (4 << 20) - PAGE;
/// PRP list pages per slot at most (4 MiB needs 3).
const MAX_LIST_PAGES: usize = 8;
/// After an Abort, how long the command has to come back before we reset (at most).
const ABORT_GRACE: Duration = Duration::from_secs(2);
/// Dataset Management ranges per command (one 4 KiB page of 16-byte ranges).
const DSM_RANGES: usize = 256;

/// Per-slot driver memory and timing.
#[derive(Debug, Default)]
struct SlotMeta {
    /// The data stream the command's PRPs point at, while the controller holds it.
    data: Option<LentStream>,
    /// PRP list pages or Dataset Management ranges (allocated on first use, kept).
    scratch: Option<DmaCoherent>,
    /// When the command counts as late.
    deadline: Instant,
    /// An Abort was sent for it.
    aborted: bool,
}

/// Counters, per cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeStats {
    /// Read commands.
    pub reads: u64,
    /// Write commands (FUA ones included).
    pub writes: u64,
    /// Write commands with FUA.
    pub fua_writes: u64,
    /// Flush commands (a flush without a volatile cache sends none).
    pub flushes: u64,
    /// Dataset Management (deallocate) commands.
    pub discards: u64,
    /// Bounce buffers (every transfer is copied through one).
    pub bounce: BounceStats,
    /// Transfers that needed a PRP list.
    pub prp_lists: u64,
    /// Completions with an error status.
    pub errors: u64,
    /// Requests failed because they (or a request in flight with them) timed out.
    pub timeouts: u64,
    /// Abort commands sent.
    pub aborts: u64,
    /// Controller resets after timeouts.
    pub resets: u64,
    /// Reaper passes.
    pub reaps: u64,
    /// I/O queue pairs in use.
    pub io_queues: usize,
    /// Interrupts on the I/O queues' vectors.
    pub interrupts: u64,
    /// I/O queue doorbells, over every pair.
    pub doorbells: DoorbellStats,
    /// Slot tables, over every pair.
    pub slots: SlotStats,
    /// DMA memory.
    pub dma: DmaStats,
}

/// One I/O queue pair's counters ([`NvmeDisk::queue_stats`]); [`NvmeStats`] holds their
/// totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue identifier (1-based).
    pub qid: u16,
    /// Its completion queue's MSI-X entry (interrupt mode).
    pub msix_entry: Option<u16>,
    /// Commands submitted and completed, doorbell writes.
    pub doorbells: DoorbellStats,
    /// Its slot table.
    pub slots: SlotStats,
    /// Interrupts on its MSI-X entry's vector (a shared entry's count for each queue
    /// sharing it).
    pub interrupts: u64,
}

/// How a command ended: its status (dword 0 of the completion, or why it failed), and
/// the data stream it was lent, taken back with the completion.
#[derive(Debug)]
struct Outcome {
    status: Result<u32, IoError>,
    data: Option<DmaStream>,
}

/// What a transfer moves.
enum Data<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8], bool),
}

impl Data<'_> {
    fn len(&self) -> usize {
        match self {
            Data::Read(b) => b.len(),
            Data::Write(b, _) => b.len(),
        }
    }
}

/// One I/O queue pair and its requests: the rings, the slot table (command identifiers
/// belong to a submission queue) and the slots' driver memory.
#[derive(Debug)]
struct IoQueue {
    /// The queue identifier (1-based; the admin queue is 0).
    qid: u16,
    /// Its completion queue's MSI-X entry; `None` when completions are polled.
    msix_entry: Option<u16>,
    ring: RefCell<QueuePair>,
    slots: RefCell<Slots<Outcome>>,
    meta: RefCell<Vec<SlotMeta>>,
}

impl IoQueue {
    /// Queue pair `qid` of `entries` entries per ring (`entries - 1` slots), its
    /// completions on `msix_entry`.
    fn new(
        ctrl: &Controller,
        qid: u16,
        entries: u16,
        msix_entry: Option<u16>,
    ) -> Result<IoQueue, NvmeError> {
        let ring = QueuePair::new(qid, entries, ctrl.regs.clone(), &ctrl.cap, &ctrl.dma)
            .map_err(|_| NvmeError::NoMemory)?;
        let slots = usize::from(entries) - 1;
        Ok(IoQueue {
            qid,
            msix_entry,
            ring: RefCell::new(ring),
            slots: RefCell::new(Slots::new(slots)),
            meta: RefCell::new((0..slots).map(|_| SlotMeta::default()).collect()),
        })
    }
}

impl SlotQueue for IoQueue {
    type Output = Outcome;

    fn slots(&self) -> &RefCell<Slots<Outcome>> {
        &self.slots
    }
}

/// The driver state shared by the disk handle, the reaper and request futures.
#[derive(Debug)]
struct Inner {
    ctrl: Controller,
    info: ControllerInfo,
    nsid: u32,
    geometry: Geometry,
    block_shift: u8,
    options: Options,
    /// PRP list pages a slot may need.
    list_pages: usize,
    /// The I/O queue pairs, identifiers `1..=queues.len()`.
    queues: Vec<IoQueue>,
    /// I/O queue pairs asked for, and the submission and completion queues the
    /// controller granted, at bring-up.
    requested_queues: u16,
    granted_queues: (u32, u32),
    bounce: Bounce,
    shadow: Option<ShadowPages>,
    shadow_on: Cell<bool>,
    /// Kicks the reaper: submissions to publish, or a health change.
    work: Arc<IrqEvent>,
    /// Signalled by every I/O queue's MSI-X entry.
    io_event: Option<Arc<IrqEvent>>,
    health: Cell<Health>,
    stats: Cell<NvmeStats>,
    msix: Option<MsixTable>,
    /// The vectors of MSI-X entry 0 (admin), then of entries 1, 2, ... (I/O queues).
    irqs: Vec<IrqHandle>,
    /// Fault injection: ignore the next completion, as if the controller lost it.
    lose_next: Cell<bool>,
}

/// An NVMe namespace as a [`BlockDevice`]. See the module documentation.
#[derive(Debug)]
pub struct NvmeDisk {
    inner: Rc<Inner>,
}

fn admin_error(what: &'static str) -> impl Fn(AdminError) -> NvmeError {
    move |e| NvmeError::Admin {
        what,
        status: match e {
            AdminError::Status(s) => s.code(),
            AdminError::Timeout => 0,
        },
    }
}

/// The controller's MSI-X routing: entry 0 serves the admin queue, entries 1.. the I/O
/// queues (see [`queues::msix_entry`]). In polling mode MSI-X is enabled with every entry
/// masked, so the controller raises nothing.
struct Interrupts {
    msix: Option<MsixTable>,
    /// Entry 0's vector, then entry 1's, 2's, ...
    irqs: Vec<IrqHandle>,
    io_event: Option<Arc<IrqEvent>>,
}

impl Interrupts {
    /// Routes the admin vector of `pci` (in interrupt mode) and enables MSI-X.
    fn route(
        pci: PciDevice,
        ctrl: &mut Controller,
        mode: CompletionMode,
    ) -> Result<Interrupts, NvmeError> {
        let msix = pci.msix().ok();
        let mut irqs = Vec::new();
        match (&msix, mode) {
            (Some(m), CompletionMode::Interrupt) if m.len() >= 2 => {
                let (admin_irq, admin_event) = irq_event().map_err(|_| NvmeError::NoVector)?;
                m.set(0, &admin_irq);
                ctrl.set_admin_event(admin_event);
                irqs.push(admin_irq);
            }
            (_, CompletionMode::Interrupt) => return Err(NvmeError::NoMsix),
            _ => {}
        }
        if let Some(m) = &msix {
            m.enable();
        }
        Ok(Interrupts {
            msix,
            irqs,
            io_event: None,
        })
    }

    /// In interrupt mode, routes MSI-X entries `1..` for `queues` I/O queues, one each
    /// while the table and the free vectors last, every one signalling the reaper's
    /// event. Returns how many entries were routed (0 when polling).
    fn route_io(&mut self, queues: u16) -> Result<u16, NvmeError> {
        let Some(m) = self.msix.as_ref().filter(|_| !self.irqs.is_empty()) else {
            return Ok(0);
        };
        let event = Arc::new(IrqEvent::new());
        for entry in 1..=queues::io_entries(queues, m.len()) {
            match irq_signalling(&event) {
                Ok(irq) => {
                    m.set(entry, &irq);
                    self.irqs.push(irq);
                }
                Err(_) if entry == 1 => return Err(NvmeError::NoVector),
                Err(_) => {
                    log::warn!(
                        "nvme: no interrupt vector for MSI-X entry {entry}; {queues} I/O queues share {} entries",
                        entry - 1
                    );
                    break;
                }
            }
        }
        self.io_event = Some(event);
        Ok(self.irqs.len() as u16 - 1)
    }
}

/// Asks for `n` I/O queue pairs (Set Features / Number of Queues); the submission and
/// completion queues the controller granted.
async fn negotiate_queues(ctrl: &Controller, n: u16) -> Result<(u32, u32), NvmeError> {
    let c = ctrl
        .admin(Command::set_queue_count(n, n))
        .await
        .map_err(admin_error("set number of queues"))?;
    Ok(queues::granted(c.result()))
}

/// Identify Controller, the first active namespace and Identify Namespace.
async fn identify_namespace(
    ctrl: &Controller,
) -> Result<(ControllerInfo, u32, NamespaceInfo), NvmeError> {
    let page = ctrl
        .identify(cns::CONTROLLER, 0)
        .await
        .map_err(admin_error("identify controller"))?;
    let info = ControllerInfo::parse(&page).map_err(NvmeError::Identify)?;
    let nsid = match ctrl.identify(cns::ACTIVE_NAMESPACES, 0).await {
        Ok(page) => *identify::active_namespaces(&page)
            .first()
            .ok_or(NvmeError::NoNamespace)?,
        // NVMe 1.0 controllers lack the list; namespace 1 is the usual one.
        Err(_) if info.namespaces >= 1 => 1,
        Err(_) => return Err(NvmeError::NoNamespace),
    };
    let page = ctrl
        .identify(cns::NAMESPACE, nsid)
        .await
        .map_err(admin_error("identify namespace"))?;
    let ns = NamespaceInfo::parse(&page).map_err(NvmeError::Identify)?;
    Ok((info, nsid, ns))
}

/// The geometry of namespace `ns` of a controller `info` describes.
fn namespace_geometry(info: &ControllerInfo, ns: &NamespaceInfo) -> Geometry {
    let max_transfer = info
        .max_transfer(PAGE)
        .unwrap_or(MAX_TRANSFER_CAP)
        .min(MAX_TRANSFER_CAP)
        .min((1 << 16) << ns.block_shift);
    Geometry {
        block_size: ns.block_size(),
        num_blocks: ns.blocks,
        max_transfer: max_transfer as u32,
        // FUA is mandatory for NVMe Write commands.
        native_fua: true,
        volatile_cache: info.volatile_write_cache,
        discard: info.oncs & oncs::DSM != 0,
    }
}

impl NvmeDisk {
    /// Resets and brings up the controller at `pci` and opens its first active namespace.
    pub async fn open(pci: PciDevice, options: Options) -> Result<NvmeDisk, NvmeError> {
        let dma = DmaDevice::new(pci).map_err(|_| NvmeError::InUse)?;
        let mut ctrl = Controller::new(pci, dma)?;
        let mut interrupts = Interrupts::route(pci, &mut ctrl, options.mode)?;
        ctrl.disable().await?;
        ctrl.enable().await?;
        let (info, nsid, ns) = identify_namespace(&ctrl).await?;
        let geometry = namespace_geometry(&info, &ns);
        let entries = u32::from(options.queue_entries)
            .min(ctrl.cap.max_queue_entries)
            .clamp(2, 4096) as u16;
        let requested = queues::requested(options.io_queues);
        let granted = negotiate_queues(&ctrl, requested).await?;
        let count = queues::queue_count(requested, granted);
        let io_entries = interrupts.route_io(count)?;
        let queues = (1..=count)
            .map(|qid| {
                let entry = (io_entries > 0).then(|| queues::msix_entry(qid, io_entries));
                IoQueue::new(&ctrl, qid, entries, entry)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut shadow = options.shadow_doorbells && info.oacs & oacs::DOORBELL_BUFFER_CONFIG != 0;
        if shadow && !queues::shadow_page_covers(count, ctrl.cap.doorbell_stride, PAGE) {
            log::warn!(
                "nvme: the shadow doorbell page cannot hold {count} queues' doorbells (stride {} B); using MMIO",
                ctrl.cap.doorbell_stride
            );
            shadow = false;
        }
        let shadow = match shadow {
            true => Some(ShadowPages::new(&ctrl.dma).map_err(|_| NvmeError::NoMemory)?),
            false => None,
        };
        let inner = Rc::new(Inner {
            list_pages: prp::list_pages_for(geometry.max_transfer as usize / PAGE, PAGE),
            info,
            nsid,
            geometry,
            block_shift: ns.block_shift,
            options,
            queues,
            requested_queues: requested,
            granted_queues: granted,
            bounce: Bounce::new(&ctrl.dma, options.bounce_pool),
            shadow,
            shadow_on: Cell::new(false),
            work: Arc::new(IrqEvent::new()),
            io_event: interrupts.io_event,
            health: Cell::new(Health::Running),
            stats: Cell::new(NvmeStats::default()),
            msix: interrupts.msix,
            irqs: interrupts.irqs,
            lose_next: Cell::new(false),
            ctrl,
        });
        assert!(inner.list_pages <= MAX_LIST_PAGES);
        inner.create_queues().await?;
        task::spawn(reaper::run(
            Rc::downgrade(&inner),
            inner.work.clone(),
            inner.io_event.clone(),
            options.mode == CompletionMode::Poll,
        ));
        inner.log_bring_up(entries);
        Ok(NvmeDisk { inner })
    }

    /// Identify Controller facts (serial, model, ...).
    pub fn controller(&self) -> &ControllerInfo {
        &self.inner.info
    }

    /// The PCI function.
    pub fn pci(&self) -> PciDevice {
        self.inner.ctrl.pci
    }

    /// The admin queue's interrupt vector and how many interrupts it has delivered, in
    /// interrupt mode.
    pub fn admin_interrupts(&self) -> Option<(u8, u64)> {
        self.inner.irqs.first().map(|h| (h.vector(), h.count()))
    }

    /// The counters, totals over every I/O queue pair.
    pub fn stats(&self) -> NvmeStats {
        let i = &self.inner;
        let mut s = i.stats.get();
        s.io_queues = i.queues.len();
        s.doorbells = DoorbellStats::default();
        s.slots = SlotStats::default();
        for q in self.queue_stats() {
            s.doorbells.merge(&q.doorbells);
            s.slots.merge(&q.slots);
        }
        // Every I/O vector once, however many queues share it.
        s.interrupts = i.irqs.iter().skip(1).map(IrqHandle::count).sum();
        s.dma = i.ctrl.dma.stats();
        s.bounce = i.bounce.stats();
        s
    }

    /// How many I/O queue pairs the disk uses.
    pub fn io_queues(&self) -> usize {
        self.inner.queues.len()
    }

    /// Each I/O queue pair's counters, by queue (identifier 1 first).
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        let i = &self.inner;
        i.queues
            .iter()
            .map(|q| QueueStats {
                qid: q.qid,
                msix_entry: q.msix_entry,
                doorbells: q.ring.borrow().stats(),
                slots: q.slots.borrow().stats(),
                interrupts: q
                    .msix_entry
                    .and_then(|e| i.irqs.get(usize::from(e)))
                    .map_or(0, IrqHandle::count),
            })
            .collect()
    }

    /// Reads through I/O queue pair `queue` (0-based: identifier `queue + 1`) whatever
    /// CPU this is, so a test can drive every pair; `Unsupported` if there is no such
    /// pair.
    pub async fn read_on_queue(
        &self,
        queue: usize,
        lba: u64,
        buf: &mut [u8],
    ) -> Result<(), IoError> {
        let q = self.inner.queues.get(queue).ok_or(IoError::Unsupported)?;
        self.inner.read(q, lba, buf).await
    }

    /// Writes through I/O queue pair `queue`, like [`NvmeDisk::read_on_queue`].
    pub async fn write_on_queue(
        &self,
        queue: usize,
        lba: u64,
        buf: &[u8],
        flags: WriteFlags,
    ) -> Result<(), IoError> {
        let q = self.inner.queues.get(queue).ok_or(IoError::Unsupported)?;
        self.inner.write(q, lba, buf, flags).await
    }

    /// Reads CSTS `n` times; nanoseconds per read (what one MMIO exit costs).
    pub fn time_register_reads(&self, n: u32) -> u64 {
        let start = task::now();
        for _ in 0..n {
            core::hint::black_box(self.inner.ctrl.regs.read32(super::regs::CSTS));
        }
        task::now().saturating_duration_since(start).as_nanos() as u64 / u64::from(n.max(1))
    }

    /// Fault injection for self-tests: the next completion is ignored, as if the
    /// controller had lost it, so its request runs into the timeout and recovery path.
    pub fn inject_lost_completion(&self) {
        self.inner.lose_next.set(true);
    }

    /// Reads without checking the range against the namespace size, so the controller
    /// itself rejects what lies beyond it (self-tests use this to exercise the device's
    /// error statuses). The length must still be a valid transfer length.
    pub async fn read_unchecked(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.inner.geometry, 0, buf.len())?;
        self.inner.bump(|s| s.reads += 1);
        let q = self.inner.route();
        self.inner.transfer(q, lba, Data::Read(buf)).await
    }
}

impl Drop for NvmeDisk {
    fn drop(&mut self) {
        // The reaper holds only a weak reference; wake it so it notices and ends.
        self.inner.work.signal();
    }
}

impl BlockDevice for NvmeDisk {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.inner.read(self.inner.route(), lba, buf).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        self.inner.write(self.inner.route(), lba, buf, flags).await
    }

    async fn flush(&self) -> Result<(), IoError> {
        if !self.inner.geometry.volatile_cache {
            // Every completed write is already on stable media.
            return Ok(());
        }
        self.inner.bump(|s| s.flushes += 1);
        // A Flush covers every write completed before it, on whichever queue.
        self.inner
            .command(self.inner.route(), Command::flush(self.inner.nsid))
            .await
            .map(|_| ())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        let g = &self.inner.geometry;
        if !g.discard {
            return Err(IoError::Unsupported);
        }
        match lba.checked_add(blocks) {
            Some(end) if end <= g.num_blocks => {}
            _ => return Err(IoError::OutOfRange),
        }
        self.inner.discard(lba, blocks).await
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
        self.queues
            .iter()
            .map(|q| q.slots.borrow().in_device())
            .sum()
    }

    async fn restart(&self) {
        self.restart_controller().await;
    }

    async fn check_timeouts(&self, now: Instant) {
        self.abort_late(now).await;
    }
}

impl Outcome {
    fn failed(e: IoError) -> Outcome {
        Outcome {
            status: Err(e),
            data: None,
        }
    }
}

impl Inner {
    fn bump(&self, f: impl FnOnce(&mut NvmeStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// The I/O queue pair of the CPU we run on.
    fn route(&self) -> &IoQueue {
        &self.queues[(self.options.current_cpu)() % self.queues.len()]
    }

    /// A checked read through `q`.
    async fn read(&self, q: &IoQueue, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        self.bump(|s| s.reads += 1);
        self.transfer(q, lba, Data::Read(buf)).await
    }

    /// A checked write through `q`.
    async fn write(
        &self,
        q: &IoQueue,
        lba: u64,
        buf: &[u8],
        flags: WriteFlags,
    ) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        self.bump(|s| {
            s.writes += 1;
            s.fua_writes += u64::from(flags.fua);
        });
        self.transfer(q, lba, Data::Write(buf, flags.fua)).await
    }

    /// The lines that describe the device once it is up.
    fn log_bring_up(&self, entries: u16) {
        let g = &self.geometry;
        let on_off = |on: bool| if on { "on" } else { "off" };
        log::info!(
            "nvme: {} \"{}\" serial \"{}\" fw {}: namespace {}, {} x {} B ({} MiB), max transfer {} KiB, {} I/O entries, write cache {}, discard {}, shadow doorbells {}, {:?} completions",
            self.ctrl.pci.address(),
            self.info.model,
            self.info.serial,
            self.info.firmware,
            self.nsid,
            g.num_blocks,
            g.block_size,
            g.capacity_bytes() >> 20,
            g.max_transfer / 1024,
            entries,
            on_off(g.volatile_cache),
            if g.discard { "yes" } else { "no" },
            on_off(self.shadow_on.get()),
            self.options.mode,
        );
        let n = self.queues.len();
        let entries: Vec<u16> = self.queues.iter().filter_map(|q| q.msix_entry).collect();
        let vectors = match entries.iter().max() {
            None => alloc::string::String::from("polled"),
            Some(&last) if usize::from(last) < n => {
                alloc::format!("MSI-X entries 1-{last}, shared")
            }
            Some(&last) => alloc::format!("MSI-X entries 1-{last}"),
        };
        log::info!(
            "nvme: {}: {n} I/O queue pair{} (requested {}, controller granted {}), {vectors}",
            self.ctrl.pci.address(),
            if n == 1 { "" } else { "s" },
            self.requested_queues,
            self.granted_queues.0.min(self.granted_queues.1),
        );
    }

    fn abort_grace(&self) -> Duration {
        self.options.timeout.min(ABORT_GRACE)
    }

    fn shadow(&self) -> Option<&ShadowPages> {
        self.shadow.as_ref().filter(|_| self.shadow_on.get())
    }

    /// Turns on shadow doorbells if we have them and creates every I/O queue pair (after
    /// the queue count was negotiated: at bring-up, and again after every reset).
    async fn create_queues(&self) -> Result<(), NvmeError> {
        let ctrl = &self.ctrl;
        for q in &self.queues {
            q.ring.borrow_mut().reset();
        }
        self.shadow_on.set(false);
        if let Some(pages) = &self.shadow {
            // One page holds the doorbells of every queue (checked at bring-up).
            pages.doorbells.zero(0, PAGE);
            pages.event_idx.zero(0, PAGE);
            let cmd = Command::doorbell_buffer_config(
                pages.doorbells.device_addr(),
                pages.event_idx.device_addr(),
            );
            match ctrl.admin(cmd).await {
                Ok(_) => self.shadow_on.set(true),
                Err(e) => log::warn!("nvme: shadow doorbells refused ({e:?}); using MMIO"),
            }
        }
        for q in &self.queues {
            let (entries, sq, cq) = {
                let ring = q.ring.borrow();
                (ring.entries(), ring.sq_addr(), ring.cq_addr())
            };
            let mut create_cq = Command::create_io_cq(q.qid, entries, q.msix_entry);
            create_cq.set_prps(cq, 0);
            ctrl.admin(create_cq)
                .await
                .map_err(admin_error("create I/O completion queue"))?;
            let mut create_sq = Command::create_io_sq(q.qid, entries, q.qid);
            create_sq.set_prps(sq, 0);
            ctrl.admin(create_sq)
                .await
                .map_err(admin_error("create I/O submission queue"))?;
            if let Some(pages) = self.shadow() {
                q.ring.borrow_mut().use_shadow(pages);
            }
        }
        Ok(())
    }

    /// Consumes every posted completion of every queue pair; publishes the completion
    /// heads and any queued submissions. Returns how many completions there were.
    fn reap(&self) -> usize {
        if self.health.get() != Health::Running {
            return 0;
        }
        let (mut n, mut errors) = (0, 0);
        for q in &self.queues {
            let (completions, failed) = self.reap_queue(q);
            n += completions;
            errors += failed;
        }
        self.bump(|s| {
            s.reaps += 1;
            s.errors += errors;
        });
        n
    }

    /// [`Inner::reap`] for one queue pair: its completions, and those with an error
    /// status.
    fn reap_queue(&self, q: &IoQueue) -> (usize, u64) {
        let shadow = self.shadow();
        let mut ring = q.ring.borrow_mut();
        let mut slots = q.slots.borrow_mut();
        let mut meta = q.meta.borrow_mut();
        let (mut n, mut errors) = (0, 0);
        while let Some(c) = ring.pop() {
            n += 1;
            if self.lose_next.replace(false) {
                log::warn!(
                    "nvme: fault injection: ignoring the completion of command {} on queue {}",
                    c.cid(),
                    q.qid
                );
                continue;
            }
            if !slots.is_in_device(c.cid()) {
                // Not a command the controller holds: counted as stray, trusted for nothing.
                let stray = slots.complete(c.cid(), Outcome::failed(IoError::Timeout));
                debug_assert_eq!(stray, Completed::Stray);
                log::warn!("nvme: stray completion on queue {}: {c:?}", q.qid);
                continue;
            }
            let m = &mut meta[usize::from(c.cid())];
            let status = if c.status().is_success() {
                Ok(c.result())
            } else if m.aborted {
                Err(IoError::Timeout)
            } else {
                errors += 1;
                log::warn!(
                    "nvme: command {} on queue {} failed: {:?}",
                    c.cid(),
                    q.qid,
                    c.status()
                );
                Err(IoError::Device(c.status().code()))
            };
            // The controller completed the command: it is done with the data stream.
            // An abandoned command's outcome (and stream) is dropped by the slot table.
            let data = m.data.take().map(LentStream::reclaim);
            slots.complete(c.cid(), Outcome { status, data });
        }
        ring.ring_cq(shadow);
        ring.ring_sq(shadow);
        (n, errors)
    }

    /// Halts the controller (which ends its DMA at once) and fails everything in flight
    /// with [`IoError::Timeout`]; the reaper then brings it up again.
    fn stop_device(&self) {
        self.ctrl.halt();
        let mut failed = 0;
        for q in &self.queues {
            let busy: Vec<u16> = q.slots.borrow().in_device_slots().collect();
            let mut slots = q.slots.borrow_mut();
            let mut meta = q.meta.borrow_mut();
            for &cid in &busy {
                // Bus mastering is off: the controller can no longer touch the streams.
                let data = meta[usize::from(cid)].data.take().map(LentStream::reclaim);
                slots.complete(
                    cid,
                    Outcome {
                        status: Err(IoError::Timeout),
                        data,
                    },
                );
            }
            failed += busy.len() as u64;
        }
        self.bump(|s| {
            s.resets += 1;
            s.timeouts += failed;
        });
        if self.health.get() == Health::Running {
            self.health.set(Health::Restarting);
        }
        self.work.signal();
    }

    /// Brings the controller up again after [`Inner::stop_device`].
    async fn restart_controller(&self) {
        log::warn!(
            "nvme: {}: resetting the controller",
            self.ctrl.pci.address()
        );
        let result = async {
            self.ctrl.enable().await?;
            // Ask for the pairs we have; requests are spread over all of them already.
            let n = self.queues.len() as u16;
            let granted = negotiate_queues(&self.ctrl, n).await?;
            if queues::queue_count(n, granted) < n {
                return Err(NvmeError::Unsupported(
                    "as many I/O queues after a reset as before",
                ));
            }
            self.create_queues().await
        }
        .await;
        match result {
            Ok(()) => {
                log::info!("nvme: controller is back");
                self.health.set(Health::Running);
            }
            Err(e) => {
                log::error!("nvme: controller could not be restarted ({e}); giving up on it");
                self.ctrl.halt();
                self.health.set(Health::Dead);
            }
        }
    }

    /// Aborts commands past their deadline; resets if an aborted one is still late.
    async fn abort_late(&self, now: Instant) {
        let mut late: Vec<(&IoQueue, u16, bool)> = Vec::new();
        for q in &self.queues {
            let slots = q.slots.borrow();
            let meta = q.meta.borrow();
            late.extend(
                slots
                    .in_device_slots()
                    .filter(|&s| meta[usize::from(s)].deadline <= now)
                    .map(|s| (q, s, meta[usize::from(s)].aborted)),
            );
        }
        let mut reset = false;
        for (q, cid, aborted) in late {
            if aborted {
                reset = true;
                continue;
            }
            log::warn!(
                "nvme: command {cid} on queue {} not completed within {:?}; aborting it",
                q.qid,
                self.options.timeout
            );
            {
                let mut meta = q.meta.borrow_mut();
                meta[usize::from(cid)].aborted = true;
                meta[usize::from(cid)].deadline = now + self.abort_grace();
            }
            self.bump(|s| s.aborts += 1);
            if let Err(e) = self.ctrl.admin(Command::abort(q.qid, cid)).await {
                log::warn!(
                    "nvme: abort of command {cid} on queue {} failed: {e:?}",
                    q.qid
                );
                reset |= e == AdminError::Timeout;
            }
        }
        if reset {
            self.stop_device();
        }
    }

    /// Hands a prepared command, and the stream its PRPs point at, to the device (the
    /// reaper publishes it). The slot keeps the stream until the command completes.
    fn submit(
        &self,
        q: &IoQueue,
        req: &mut Request<'_, IoQueue>,
        mut cmd: Command,
        data: Option<LentStream>,
    ) {
        let slot = req.slot();
        cmd.set_cid(slot);
        {
            let mut meta = q.meta.borrow_mut();
            let m = &mut meta[usize::from(slot)];
            m.deadline = task::now() + self.options.timeout;
            m.aborted = false;
            m.data = data;
        }
        req.submitted();
        q.ring.borrow_mut().push(&cmd);
        self.work.signal();
    }

    /// A command without data (Flush), through `q`.
    async fn command(&self, q: &IoQueue, cmd: Command) -> Result<u32, IoError> {
        let mut req = Request::acquire(q).await;
        reaper::running(&self.health).await?;
        self.submit(q, &mut req, cmd, None);
        req.wait().await.status
    }

    /// The slot's scratch pages, allocated on first use.
    fn scratch<'m>(&self, m: &'m mut SlotMeta) -> Result<&'m DmaCoherent, IoError> {
        if m.scratch.is_none() {
            let pages = DmaCoherent::alloc(&self.ctrl.dma, self.list_pages * PAGE)
                .map_err(|_| IoError::NoMemory)?;
            m.scratch = Some(pages);
        }
        Ok(m.scratch.as_ref().expect("just allocated"))
    }

    /// Points `cmd` at `addr..addr + len` (a lent stream: page-aligned): PRP2 or a PRP
    /// list in the slot's scratch pages.
    fn set_data_pointer(
        &self,
        q: &IoQueue,
        slot: u16,
        cmd: &mut Command,
        addr: u64,
        len: usize,
    ) -> Result<(), IoError> {
        let plan = prp::plan(addr, len, PAGE).map_err(|_| IoError::BadLength)?;
        let prp2 = match plan.second {
            Second::None => 0,
            Second::Page(p) => p,
            Second::List { list_pages, .. } => {
                let mut meta = q.meta.borrow_mut();
                let scratch = self.scratch(&mut meta[usize::from(slot)])?;
                let base = scratch.device_addr();
                let mut lists = [0u64; MAX_LIST_PAGES];
                for (i, l) in lists.iter_mut().enumerate().take(list_pages) {
                    *l = base + (i * PAGE) as u64;
                }
                prp::fill_list(addr, len, PAGE, &lists[..list_pages], |l, e, v| {
                    scratch.write::<u64>(l * PAGE + e * 8, v)
                });
                drop(meta);
                self.bump(|s| s.prp_lists += 1);
                base
            }
        };
        cmd.set_prps(plan.prp1, prp2);
        Ok(())
    }

    /// Reads or writes through a DMA stream, on queue pair `q`; the length is already
    /// checked.
    async fn transfer(&self, q: &IoQueue, lba: u64, data: Data<'_>) -> Result<(), IoError> {
        let len = data.len();
        let blocks = (len >> self.block_shift) as u32;
        let mut req = Request::acquire(q).await;
        reaper::running(&self.health).await?;
        let (stream, mut cmd) = match &data {
            Data::Read(_) => (
                self.bounce.for_read(len).await?,
                Command::read(self.nsid, lba, blocks),
            ),
            Data::Write(src, fua) => (
                self.bounce.for_write(src).await?,
                Command::write(self.nsid, lba, blocks, *fua),
            ),
        };
        let stream = stream.lend();
        if let Err(e) = self.set_data_pointer(q, req.slot(), &mut cmd, stream.device_addr(), len) {
            // Never submitted: the controller has not seen the stream.
            self.bounce.give_back(stream.reclaim());
            return Err(e);
        }
        self.submit(q, &mut req, cmd, Some(stream));
        let Outcome { status, data: back } = req.wait().await;
        status?;
        match (data, back) {
            (Data::Read(dst), Some(back)) => self.bounce.copy_out(back, dst),
            (Data::Read(_), None) => unreachable!("a read's stream comes back with it"),
            (Data::Write(..), Some(back)) => self.bounce.give_back(back),
            (Data::Write(..), None) => {}
        }
        Ok(())
    }

    /// Deallocates `lba..lba + blocks` (checked), up to 256 ranges per command, through
    /// the queue pair of the CPU we run on.
    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        let q = self.route();
        let end = lba + blocks;
        let mut next = lba;
        while next < end {
            let mut req = Request::acquire(q).await;
            reaper::running(&self.health).await?;
            let slot = req.slot();
            let (count, addr) = {
                let mut meta = q.meta.borrow_mut();
                let scratch = self.scratch(&mut meta[usize::from(slot)])?;
                let mut count = 0;
                while next < end && count < DSM_RANGES {
                    let n = (end - next).min(u64::from(u32::MAX)) as u32;
                    let at = count * 16;
                    scratch.write::<u32>(at, 0);
                    scratch.write::<u32>(at + 4, n);
                    scratch.write::<u64>(at + 8, next);
                    next += u64::from(n);
                    count += 1;
                }
                (count, scratch.device_addr())
            };
            let mut cmd = Command::deallocate(self.nsid, count);
            cmd.set_prps(addr, 0);
            self.bump(|s| s.discards += 1);
            self.submit(q, &mut req, cmd, None);
            req.wait().await.status?;
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Stop the controller before its queues and buffers are freed.
        self.ctrl.halt();
        if let Some(m) = &self.msix {
            m.disable();
        }
    }
}
