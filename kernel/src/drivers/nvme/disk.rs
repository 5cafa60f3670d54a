//! [`NvmeDisk`]: the block device over an NVMe namespace, shared by every CPU.
//!
//! The controller gets up to [`MAX_IO_QUEUES`](super::MAX_IO_QUEUES) I/O queue pairs
//! ([`IoQueue`], identifiers `1..=n`, see [`queues`](super::queues)), one per CPU: a
//! request goes to the pair of the CPU it is submitted on (`Options::current_cpu`), and
//! pair `qid` *belongs* to CPU `(qid - 1) % cpus`: its MSI-X entry targets that CPU's
//! local APIC and its reaper task runs there, so a request's submission, interrupt and
//! completion happen on the CPU that made it (with fewer pairs than CPUs, some CPUs use
//! a pair another CPU owns; its lock makes that correct).
//!
//! A request takes a slot of its pair (= command identifier), copies its data into a DMA
//! stream (see [`bounce`](crate::drivers::bounce)), lends the stream to the controller
//! with the slot (PRP1, PRP2 or a PRP list in the slot's list pages), pushes the command
//! to the pair's submission ring and waits for its slot to be completed. Each pair's
//! state (ring, slot table, slot memory) is under its own [`IrqLock`], taken briefly by
//! submitters and by the pair's reaper, never across an `await`. The pair's reaper
//! publishes the submission tail once for all commands queued since it last ran,
//! consumes completions (woken by the pair's MSI-X entry, or polling while commands are
//! outstanding) and takes each command's stream back with its completion.
//!
//! The *supervisor* task, on the CPU that opened the disk, owns the controller: the
//! admin queue, the timeout scan and recovery. A late command is aborted; if the abort
//! does not resolve it, the controller is halted (which ends its DMA), everything in
//! flight on every pair fails with [`IoError::Timeout`], and the controller is brought up
//! again with all its pairs; meanwhile the health is `Restarting` and neither reapers
//! nor submitters touch the rings (each checks it under the pair's lock).

use alloc::string::String;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use crate::drivers::reaper::{self, Health, Reaped, SharedHealth};
use crate::drivers::{irq_event, CompletionMode};
use crate::exec::IrqEvent;
use crate::hal::dma::DmaStats;
use crate::hal::percpu::{self, MAX_CPUS};
use crate::irq::{self, IrqHandle};
use crate::mm::{DmaCoherent, DmaDevice, DmaStream, LentStream};
use crate::pci::device::{MsixTable, PciDevice};
use crate::sync::IrqLock;
use crate::time::Instant;
use crate::{smp, task};

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
    /// PRP list pages or Dataset Management ranges (allocated on first use, kept; the
    /// request holding the slot takes them out while it fills them).
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
    /// Reaper passes, over every pair.
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
/// totals. The `_by_cpu` lists have one entry per CPU online, by index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue identifier (1-based).
    pub qid: u16,
    /// The CPU it belongs to: its reaper runs there and its interrupt targets it.
    pub cpu: usize,
    /// Its completion queue's MSI-X entry (interrupt mode).
    pub msix_entry: Option<u16>,
    /// Commands submitted and completed, doorbell writes.
    pub doorbells: DoorbellStats,
    /// Its slot table.
    pub slots: SlotStats,
    /// Interrupts on its MSI-X entry's vector (a shared entry's count for each queue
    /// sharing it).
    pub interrupts: u64,
    /// Those interrupts by the CPU they were delivered to.
    pub interrupts_by_cpu: Vec<u64>,
    /// Commands submitted, by the CPU they were submitted on.
    pub submitted_by_cpu: Vec<u64>,
    /// Completions consumed, by the CPU that consumed them.
    pub completed_by_cpu: Vec<u64>,
}

/// How a command ended: its status (dword 0 of the completion, or why it failed), and
/// the data stream it was lent, taken back with the completion.
#[derive(Debug)]
struct Outcome {
    status: Result<u32, IoError>,
    data: Option<DmaStream>,
}

impl Outcome {
    fn failed(e: IoError) -> Outcome {
        Outcome {
            status: Err(e),
            data: None,
        }
    }
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

/// A count kept per CPU (by index), updated from any CPU.
#[derive(Debug)]
struct PerCpuCount([AtomicU64; MAX_CPUS]);

impl PerCpuCount {
    const fn new() -> PerCpuCount {
        PerCpuCount([const { AtomicU64::new(0) }; MAX_CPUS])
    }

    /// Counts one on the running CPU.
    fn add_here(&self) {
        self.add(percpu::index(), 1);
    }

    fn add(&self, cpu: usize, n: u64) {
        self.0[cpu].fetch_add(n, Ordering::Relaxed);
    }

    /// The counts of CPUs `0..cpus`.
    fn first(&self, cpus: usize) -> Vec<u64> {
        self.0[..cpus.min(MAX_CPUS)]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// One I/O queue pair's state: the rings, the slot table (command identifiers belong to
/// a submission queue) and the slots' driver memory, under the pair's lock.
#[derive(Debug)]
struct PairState {
    ring: QueuePair,
    slots: Slots<Outcome>,
    meta: Vec<SlotMeta>,
}

/// Counters of one pair that the CPUs using it update.
#[derive(Debug, Default)]
struct PairCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    prp_lists: AtomicU64,
    errors: AtomicU64,
    reaps: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// One I/O queue pair and its requests.
#[derive(Debug)]
struct IoQueue {
    /// The queue identifier (1-based; the admin queue is 0).
    qid: u16,
    /// Its completion queue's MSI-X entry; `None` when completions are polled.
    msix_entry: Option<u16>,
    /// The CPU it belongs to: its reaper runs there, its interrupt is delivered there.
    cpu: usize,
    state: IrqLock<PairState>,
    /// Wakes the pair's reaper: a submission to publish, an interrupt, a health change.
    event: Arc<IrqEvent>,
    counters: PairCounters,
    submitted_by_cpu: PerCpuCount,
    completed_by_cpu: PerCpuCount,
}

impl IoQueue {
    /// Queue pair `qid` of `entries` entries per ring (`entries - 1` slots), its
    /// completions on `msix_entry`, belonging to CPU `cpu`.
    fn new(
        ctrl: &Controller,
        qid: u16,
        entries: u16,
        msix_entry: Option<u16>,
        cpu: usize,
    ) -> Result<IoQueue, NvmeError> {
        let ring = QueuePair::new(qid, entries, ctrl.regs.clone(), &ctrl.cap, &ctrl.dma)
            .map_err(|_| NvmeError::NoMemory)?;
        let slots = usize::from(entries) - 1;
        Ok(IoQueue {
            qid,
            msix_entry,
            cpu,
            state: IrqLock::new(PairState {
                ring,
                slots: Slots::new(slots),
                meta: (0..slots).map(|_| SlotMeta::default()).collect(),
            }),
            event: Arc::new(IrqEvent::new()),
            counters: PairCounters::default(),
            submitted_by_cpu: PerCpuCount::new(),
            completed_by_cpu: PerCpuCount::new(),
        })
    }
}

impl SlotQueue for IoQueue {
    type Output = Outcome;
    type State = PairState;

    fn with_state<T>(&self, f: impl FnOnce(&mut PairState) -> T) -> T {
        self.state.lock(f)
    }

    fn slots(state: &mut PairState) -> &mut Slots<Outcome> {
        &mut state.slots
    }
}

/// The driver state shared by the disk handle, the reapers and request futures, on
/// every CPU.
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
    shadow_on: AtomicBool,
    /// Kicks the supervisor: a health change, or the handle's drop.
    work: Arc<IrqEvent>,
    health: SharedHealth,
    timeouts: AtomicU64,
    aborts: AtomicU64,
    resets: AtomicU64,
    msix: Option<MsixTable>,
    interrupts: Interrupts,
    /// Fault injection: ignore the next completion, as if the controller lost it.
    lose_next: AtomicBool,
}

/// An NVMe namespace as a [`BlockDevice`], usable from every CPU (`Send + Sync`). See
/// the module documentation.
#[derive(Debug)]
pub struct NvmeDisk {
    inner: Arc<Inner>,
}

const _: () = {
    const fn shared_by_cpus<T: Send + Sync>() {}
    shared_by_cpus::<NvmeDisk>();
};

fn admin_error(what: &'static str) -> impl Fn(AdminError) -> NvmeError {
    move |e| NvmeError::Admin {
        what,
        status: match e {
            AdminError::Status(s) => s.code(),
            AdminError::Timeout => 0,
        },
    }
}

/// What one I/O MSI-X entry's interrupt does: wakes the reapers of the pairs completing
/// on it, counting the CPU it was delivered to.
#[derive(Debug)]
struct EntryWake {
    /// The events of the pairs on the entry (set once the pairs exist; the entry is
    /// unmasked only then).
    reapers: spin::Once<Vec<Arc<IrqEvent>>>,
    by_cpu: PerCpuCount,
}

/// The controller's MSI-X routing: entry 0 serves the admin queue (on the CPU that opened
/// the disk), entries 1.. the I/O queues (see [`queues::msix_entry`]), each aimed at the
/// CPU its pairs belong to. In polling mode MSI-X is enabled with every entry masked, so
/// the controller raises nothing.
#[derive(Debug)]
struct Interrupts {
    /// Entry 0's vector, then entry 1's, 2's, ...
    irqs: Vec<IrqHandle>,
    /// What entries 1, 2, ... do.
    io: Vec<Arc<EntryWake>>,
}

impl Interrupts {
    /// Routes the admin vector of `pci` (in interrupt mode) and enables MSI-X.
    fn route(
        msix: Option<&MsixTable>,
        ctrl: &mut Controller,
        mode: CompletionMode,
    ) -> Result<Interrupts, NvmeError> {
        let mut irqs = Vec::new();
        match (msix, mode) {
            (Some(m), CompletionMode::Interrupt) if m.len() >= 2 => {
                let (admin_irq, admin_event) = irq_event().map_err(|_| NvmeError::NoVector)?;
                m.set(0, &admin_irq);
                ctrl.set_admin_event(admin_event);
                irqs.push(admin_irq);
            }
            (_, CompletionMode::Interrupt) => return Err(NvmeError::NoMsix),
            _ => {}
        }
        if let Some(m) = msix {
            m.enable();
        }
        Ok(Interrupts {
            irqs,
            io: Vec::new(),
        })
    }

    /// In interrupt mode, allocates the vectors of MSI-X entries `1..` for `queues` I/O
    /// queues, one each while the table (of `table_len` entries) and the free vectors
    /// last. Returns how many entries there are (0 when polling); [`Interrupts::aim`]
    /// points them at their CPUs once the pairs exist.
    fn allocate_io(&mut self, queues: u16, table_len: u16) -> Result<u16, NvmeError> {
        if self.irqs.is_empty() {
            return Ok(0);
        }
        for entry in 1..=queues::io_entries(queues, table_len) {
            let wake = Arc::new(EntryWake {
                reapers: spin::Once::new(),
                by_cpu: PerCpuCount::new(),
            });
            let w = wake.clone();
            let handler = move || {
                w.by_cpu.add_here();
                for reaper in w.reapers.get().into_iter().flatten() {
                    reaper.signal();
                }
            };
            match irq::allocate(handler) {
                Ok(irq) => {
                    self.irqs.push(irq);
                    self.io.push(wake);
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
        Ok(self.io.len() as u16)
    }

    /// Points each I/O entry at the local APIC of the CPU its first pair belongs to,
    /// waking the reapers of all its pairs, and unmasks it.
    fn aim(&self, msix: &MsixTable, pairs: &[IoQueue]) {
        for (i, (irq, wake)) in self.irqs.iter().skip(1).zip(&self.io).enumerate() {
            let entry = i as u16 + 1;
            let on_entry: Vec<&IoQueue> = pairs
                .iter()
                .filter(|q| q.msix_entry == Some(entry))
                .collect();
            wake.reapers
                .call_once(|| on_entry.iter().map(|q| q.event.clone()).collect());
            let cpu = on_entry.first().map_or(0, |q| q.cpu);
            match smp::apic_id(cpu) {
                Some(apic_id) => msix.set_target(entry, irq, apic_id),
                None => msix.set(entry, irq),
            }
        }
    }

    /// The interrupts of I/O entry `entry` so far, and by CPU (`cpus` of them).
    fn io_counts(&self, entry: u16, cpus: usize) -> (u64, Vec<u64>) {
        let i = usize::from(entry);
        match (self.irqs.get(i), self.io.get(i - 1)) {
            (Some(irq), Some(wake)) => (irq.count(), wake.by_cpu.first(cpus)),
            _ => (0, alloc::vec![0; cpus]),
        }
    }
}

/// How long opening a controller waits for the previous driver instance to be gone.
const IN_USE_WAIT: Duration = Duration::from_secs(1);

/// The controller's bus mastering, once no earlier driver instance holds it: after its
/// handle is dropped, a reaper on another CPU may still be finishing a pass with the
/// instance (which it then frees), for a moment.
async fn take_over(pci: PciDevice) -> Result<DmaDevice, NvmeError> {
    let give_up = task::now() + IN_USE_WAIT;
    loop {
        match DmaDevice::new(pci) {
            Ok(dma) => return Ok(dma),
            Err(_) if task::now() < give_up => task::sleep(Duration::from_millis(1)).await,
            Err(_) => return Err(NvmeError::InUse),
        }
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
    /// Its I/O queue pairs are spread over the CPUs online now (open it after the other
    /// CPUs are started): each pair's reaper is spawned on its CPU, and the supervisor
    /// on this one.
    pub async fn open(pci: PciDevice, options: Options) -> Result<NvmeDisk, NvmeError> {
        let dma = take_over(pci).await?;
        let mut ctrl = Controller::new(pci, dma)?;
        let msix = pci.msix().ok();
        let mut interrupts = Interrupts::route(msix.as_ref(), &mut ctrl, options.mode)?;
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
        let io_entries = interrupts.allocate_io(count, msix.as_ref().map_or(0, MsixTable::len))?;
        let cpus = smp::online().max(1);
        let queues = (1..=count)
            .map(|qid| {
                let entry = (io_entries > 0).then(|| queues::msix_entry(qid, io_entries));
                IoQueue::new(&ctrl, qid, entries, entry, queues::cpu_of(qid, cpus))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(m) = &msix {
            interrupts.aim(m, &queues);
        }
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
        let inner = Arc::new(Inner {
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
            shadow_on: AtomicBool::new(false),
            work: Arc::new(IrqEvent::new()),
            health: SharedHealth::new(),
            timeouts: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            msix,
            interrupts,
            lose_next: AtomicBool::new(false),
            ctrl,
        });
        assert!(inner.list_pages <= MAX_LIST_PAGES);
        inner.create_queues().await?;
        inner.spawn_reapers();
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
        let irqs = &self.inner.interrupts.irqs;
        irqs.first().map(|h| (h.vector(), h.count()))
    }

    /// The counters, totals over every I/O queue pair.
    pub fn stats(&self) -> NvmeStats {
        let i = &self.inner;
        let mut s = NvmeStats {
            timeouts: get(&i.timeouts),
            aborts: get(&i.aborts),
            resets: get(&i.resets),
            io_queues: i.queues.len(),
            // Every I/O vector once, however many queues share it.
            interrupts: i.interrupts.irqs.iter().skip(1).map(IrqHandle::count).sum(),
            dma: i.ctrl.dma.stats(),
            bounce: i.bounce.stats(),
            ..NvmeStats::default()
        };
        for q in &i.queues {
            let c = &q.counters;
            s.reads += get(&c.reads);
            s.writes += get(&c.writes);
            s.fua_writes += get(&c.fua_writes);
            s.flushes += get(&c.flushes);
            s.discards += get(&c.discards);
            s.prp_lists += get(&c.prp_lists);
            s.errors += get(&c.errors);
            s.reaps += get(&c.reaps);
            let (doorbells, slots) = q.state.lock(|st| (st.ring.stats(), st.slots.stats()));
            s.doorbells.merge(&doorbells);
            s.slots.merge(&slots);
        }
        s
    }

    /// How many I/O queue pairs the disk uses.
    pub fn io_queues(&self) -> usize {
        self.inner.queues.len()
    }

    /// Each I/O queue pair's counters, by queue (identifier 1 first).
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        let cpus = smp::online().max(1);
        self.inner
            .queues
            .iter()
            .map(|q| {
                let (doorbells, slots) = q.state.lock(|st| (st.ring.stats(), st.slots.stats()));
                let (interrupts, interrupts_by_cpu) = match q.msix_entry {
                    Some(e) => self.inner.interrupts.io_counts(e, cpus),
                    None => (0, alloc::vec![0; cpus]),
                };
                QueueStats {
                    qid: q.qid,
                    cpu: q.cpu,
                    msix_entry: q.msix_entry,
                    doorbells,
                    slots,
                    interrupts,
                    interrupts_by_cpu,
                    submitted_by_cpu: q.submitted_by_cpu.first(cpus),
                    completed_by_cpu: q.completed_by_cpu.first(cpus),
                }
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
        self.inner.lose_next.store(true, Ordering::SeqCst);
    }

    /// Reads without checking the range against the namespace size, so the controller
    /// itself rejects what lies beyond it (self-tests use this to exercise the device's
    /// error statuses). The length must still be a valid transfer length.
    pub async fn read_unchecked(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.inner.geometry, 0, buf.len())?;
        let q = self.inner.route();
        add(&q.counters.reads, 1);
        self.inner.transfer(q, lba, Data::Read(buf)).await
    }
}

impl Drop for NvmeDisk {
    fn drop(&mut self) {
        // The reapers hold only weak references; wake them so they notice and end.
        self.inner.wake_all();
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
        // A Flush covers every write completed before it, on whichever queue.
        let q = self.inner.route();
        add(&q.counters.flushes, 1);
        self.inner
            .command(q, Command::flush(self.inner.nsid))
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

    fn reap(&self, queue: usize) -> usize {
        self.reap_pair(&self.queues[queue])
    }

    fn in_device(&self) -> usize {
        self.queues
            .iter()
            .map(|q| q.state.lock(|st| st.slots.in_device()))
            .sum()
    }

    async fn restart(&self) {
        self.restart_controller().await;
    }

    async fn check_timeouts(&self, now: Instant) {
        self.abort_late(now).await;
    }
}

impl Inner {
    /// The I/O queue pair of the CPU we run on.
    fn route(&self) -> &IoQueue {
        &self.queues[(self.options.current_cpu)() % self.queues.len()]
    }

    /// Starts each pair's reaper on the CPU the pair belongs to, and the supervisor here.
    fn spawn_reapers(self: &Arc<Self>) {
        let poll = self.options.mode == CompletionMode::Poll;
        for (i, q) in self.queues.iter().enumerate() {
            let (device, event) = (Arc::downgrade(self), q.event.clone());
            let make = move || reaper::serve_queue(device, i, event, poll);
            if smp::spawn_on(q.cpu, make).is_err() {
                // Not online (cannot happen: pairs go to CPUs online): serve it here.
                let event = q.event.clone();
                task::spawn(reaper::serve_queue(Arc::downgrade(self), i, event, poll));
            }
        }
        let device: Weak<Inner> = Arc::downgrade(self);
        task::spawn(reaper::supervise(device, self.work.clone()));
    }

    /// Signals the supervisor and every pair's reaper (a health change, or the end).
    fn wake_all(&self) {
        self.work.signal();
        for q in &self.queues {
            q.event.signal();
        }
    }

    /// A checked read through `q`.
    async fn read(&self, q: &IoQueue, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        add(&q.counters.reads, 1);
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
        add(&q.counters.writes, 1);
        add(&q.counters.fua_writes, u64::from(flags.fua));
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
            on_off(self.shadow_on.load(Ordering::SeqCst)),
            self.options.mode,
        );
        let n = self.queues.len();
        let entries: Vec<u16> = self.queues.iter().filter_map(|q| q.msix_entry).collect();
        let vectors = match entries.iter().max() {
            None => String::from("polled"),
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
        let cpus: Vec<usize> = self.queues.iter().map(|q| q.cpu).collect();
        log::info!(
            "nvme: {}: I/O queue pairs 1-{n} served on CPUs {cpus:?} (their reapers, and their interrupts unless polled)",
            self.ctrl.pci.address(),
        );
        use crate::event::{self, Event, Text};
        event::emit(Event::Nvme {
            device: Text::display(self.ctrl.pci.address()),
            model: self.info.model.as_str().into(),
            serial: self.info.serial.as_str().into(),
            firmware: self.info.firmware.as_str().into(),
            blocks: g.num_blocks,
            block_size: g.block_size,
            max_transfer_kib: g.max_transfer / 1024,
            completions: match self.options.mode {
                crate::drivers::CompletionMode::Interrupt => "interrupt",
                crate::drivers::CompletionMode::Poll => "poll",
            },
            pairs: n,
            requested: self.requested_queues,
            granted: self.granted_queues.0.min(self.granted_queues.1),
            msix_entries: event::list(entries),
            cpus: event::list(cpus),
        });
    }

    fn abort_grace(&self) -> Duration {
        self.options.timeout.min(ABORT_GRACE)
    }

    fn shadow(&self) -> Option<&ShadowPages> {
        self.shadow
            .as_ref()
            .filter(|_| self.shadow_on.load(Ordering::SeqCst))
    }

    /// Turns on shadow doorbells if we have them and creates every I/O queue pair (after
    /// the queue count was negotiated: at bring-up, and again after every reset, while
    /// nothing else touches the rings).
    async fn create_queues(&self) -> Result<(), NvmeError> {
        let ctrl = &self.ctrl;
        for q in &self.queues {
            q.state.lock(|st| st.ring.reset());
        }
        self.shadow_on.store(false, Ordering::SeqCst);
        if let Some(pages) = &self.shadow {
            // One page holds the doorbells of every queue (checked at bring-up).
            pages.doorbells.zero(0, PAGE);
            pages.event_idx.zero(0, PAGE);
            let cmd = Command::doorbell_buffer_config(
                pages.doorbells.device_addr(),
                pages.event_idx.device_addr(),
            );
            match ctrl.admin(cmd).await {
                Ok(_) => self.shadow_on.store(true, Ordering::SeqCst),
                Err(e) => log::warn!("nvme: shadow doorbells refused ({e:?}); using MMIO"),
            }
        }
        for q in &self.queues {
            let (entries, sq, cq) = q
                .state
                .lock(|st| (st.ring.entries(), st.ring.sq_addr(), st.ring.cq_addr()));
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
                q.state.lock(|st| st.ring.use_shadow(pages));
            }
        }
        Ok(())
    }

    /// Consumes every posted completion of pair `q` and publishes its completion head and
    /// queued submissions, unless the controller is stopped; returns how many commands
    /// the pair still has in the controller.
    fn reap_pair(&self, q: &IoQueue) -> usize {
        let shadow = self.shadow();
        let (completions, errors, in_device) = q.state.lock(|st| {
            if self.health.get() != Health::Running {
                return (0, 0, st.slots.in_device());
            }
            let (mut n, mut errors) = (0, 0);
            while let Some(c) = st.ring.pop() {
                n += 1;
                if self.lose_next.load(Ordering::Relaxed)
                    && self.lose_next.swap(false, Ordering::SeqCst)
                {
                    log::warn!(
                        "nvme: fault injection: ignoring the completion of command {} on queue {}",
                        c.cid(),
                        q.qid
                    );
                    continue;
                }
                if !st.slots.is_in_device(c.cid()) {
                    // Not a command the controller holds: counted as stray, trusted for nothing.
                    let stray = st
                        .slots
                        .complete(c.cid(), Outcome::failed(IoError::Timeout));
                    debug_assert_eq!(stray, Completed::Stray);
                    log::warn!("nvme: stray completion on queue {}: {c:?}", q.qid);
                    continue;
                }
                let m = &mut st.meta[usize::from(c.cid())];
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
                st.slots.complete(c.cid(), Outcome { status, data });
            }
            st.ring.ring_cq(shadow);
            st.ring.ring_sq(shadow);
            (n, errors, st.slots.in_device())
        });
        add(&q.counters.reaps, 1);
        add(&q.counters.errors, errors);
        if completions > 0 {
            q.completed_by_cpu.add(percpu::index(), completions);
        }
        in_device
    }

    /// Halts the controller (which ends its DMA at once) and fails everything in flight
    /// with [`IoError::Timeout`]; the supervisor then brings it up again. The health
    /// changes first, so from here on no reaper or submitter touches a ring; the pairs
    /// are then emptied one at a time.
    fn stop_device(&self) {
        self.health.stop();
        self.ctrl.halt();
        let mut failed = 0;
        for q in &self.queues {
            failed += q.state.lock(|st| {
                let busy: Vec<u16> = st.slots.in_device_slots().collect();
                for &cid in &busy {
                    // Bus mastering is off: the controller can no longer touch the streams.
                    let data = st.meta[usize::from(cid)]
                        .data
                        .take()
                        .map(LentStream::reclaim);
                    let outcome = Outcome {
                        status: Err(IoError::Timeout),
                        data,
                    };
                    st.slots.complete(cid, outcome);
                }
                busy.len() as u64
            });
        }
        add(&self.resets, 1);
        add(&self.timeouts, failed);
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
        // The reapers look at their pairs again (or end).
        self.wake_all();
    }

    /// Aborts commands past their deadline; resets if an aborted one is still late.
    async fn abort_late(&self, now: Instant) {
        let grace = now + self.abort_grace();
        let mut late: Vec<(u16, u16)> = Vec::new();
        let mut reset = false;
        for q in &self.queues {
            q.state.lock(|st| {
                for cid in st.slots.in_device_slots() {
                    let m = &mut st.meta[usize::from(cid)];
                    if m.deadline > now {
                        continue;
                    }
                    if m.aborted {
                        reset = true;
                    } else {
                        m.aborted = true;
                        m.deadline = grace;
                        late.push((q.qid, cid));
                    }
                }
            });
        }
        for (qid, cid) in late {
            log::warn!(
                "nvme: command {cid} on queue {qid} not completed within {:?}; aborting it",
                self.options.timeout
            );
            add(&self.aborts, 1);
            if let Err(e) = self.ctrl.admin(Command::abort(qid, cid)).await {
                log::warn!("nvme: abort of command {cid} on queue {qid} failed: {e:?}");
                reset |= e == AdminError::Timeout;
            }
        }
        if reset {
            self.stop_device();
        }
    }

    /// Hands a prepared command (and the data stream its PRPs point at, lent) to the
    /// device through `q`, waiting first if the controller is being restarted, and kicks
    /// the pair's reaper, which publishes it. The slot keeps the stream until the command
    /// completes.
    async fn submit(
        &self,
        q: &IoQueue,
        req: &mut Request<'_, IoQueue>,
        mut cmd: Command,
        mut data: Option<LentStream>,
    ) -> Result<(), IoError> {
        let slot = req.slot();
        cmd.set_cid(slot);
        loop {
            let deadline = task::now() + self.options.timeout;
            let handed = req.submit(|st| {
                // Checked under the pair's lock: a reset that stops the controller after
                // this fails the command with everything else in flight.
                if self.health.get() != Health::Running {
                    return Err(());
                }
                let m = &mut st.meta[usize::from(slot)];
                m.deadline = deadline;
                m.aborted = false;
                m.data = data.take();
                st.ring.push(&cmd);
                Ok(())
            });
            if handed.is_ok() {
                break;
            }
            self.health.running().await?;
        }
        q.submitted_by_cpu.add_here();
        q.event.signal();
        Ok(())
    }

    /// A command without data (Flush), through `q`.
    async fn command(&self, q: &IoQueue, cmd: Command) -> Result<u32, IoError> {
        let mut req = Request::acquire(q).await;
        self.submit(q, &mut req, cmd, None).await?;
        req.wait().await.status
    }

    /// Runs `fill` on slot `slot`'s scratch pages of `q` (allocated on first use),
    /// outside the pair's lock: the request holding the slot takes them out meanwhile
    /// (nothing else uses a slot's scratch pages), and puts them back before anything
    /// could drop it. Returns their device address and what `fill` returned.
    fn with_scratch<T>(
        &self,
        q: &IoQueue,
        slot: u16,
        fill: impl FnOnce(&DmaCoherent) -> T,
    ) -> Result<(u64, T), IoError> {
        let pages = match q.state.lock(|st| st.meta[usize::from(slot)].scratch.take()) {
            Some(pages) => pages,
            None => DmaCoherent::alloc(&self.ctrl.dma, self.list_pages * PAGE)
                .map_err(|_| IoError::NoMemory)?,
        };
        let out = fill(&pages);
        let addr = pages.device_addr();
        q.state
            .lock(|st| st.meta[usize::from(slot)].scratch = Some(pages));
        Ok((addr, out))
    }

    /// Points `cmd` at `addr..addr + len` (a lent stream: page-aligned): PRP2, or a PRP
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
                let (base, ()) = self.with_scratch(q, slot, |scratch| {
                    let base = scratch.device_addr();
                    let mut lists = [0u64; MAX_LIST_PAGES];
                    for (i, l) in lists.iter_mut().enumerate().take(list_pages) {
                        *l = base + (i * PAGE) as u64;
                    }
                    prp::fill_list(addr, len, PAGE, &lists[..list_pages], |l, e, v| {
                        scratch.write::<u64>(l * PAGE + e * 8, v)
                    });
                })?;
                add(&q.counters.prp_lists, 1);
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
        self.health.running().await?;
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
        self.submit(q, &mut req, cmd, Some(stream)).await?;
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
            let (ranges, count) = self.with_scratch(q, req.slot(), |scratch| {
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
                count
            })?;
            let mut cmd = Command::deallocate(self.nsid, count);
            cmd.set_prps(ranges, 0);
            add(&q.counters.discards, 1);
            self.submit(q, &mut req, cmd, None).await?;
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
