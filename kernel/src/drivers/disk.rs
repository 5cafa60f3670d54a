//! The disk: whichever block device `disk=` names (see [`super::select`]), opened with
//! its driver, behind one [`BlockDevice`] type for the rest of the appliance.

use core::fmt;

use block::{BlockDevice, Geometry, IoError, WriteFlags};

use super::inflight::SlotStats;
use super::nvme::{self, NvmeDisk, NvmeError};
use super::select::{select, DiskKind, SelectError};
use super::virtio_blk::{self, VirtioBlk, VirtioBlkError};
use crate::config::{Config, DiskSelector};
use crate::pci::device::{self, PciDevice};
use crate::pci::PciAddress;

/// Driver options for whichever device is opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskOptions {
    /// For NVMe controllers.
    pub nvme: nvme::Options,
    /// For virtio-blk devices.
    pub virtio: virtio_blk::Options,
}

impl DiskOptions {
    /// The options the command line asks for (`nvme=poll`, `nvme_queues=`; one NVMe I/O
    /// queue pair per CPU online by default, requests routed by the running CPU).
    pub fn for_config(config: &Config) -> DiskOptions {
        let mut options = DiskOptions::default();
        if config.nvme_poll {
            options.nvme.mode = super::CompletionMode::Poll;
        }
        let per_cpu = crate::smp::online().clamp(1, usize::from(nvme::MAX_IO_QUEUES)) as u16;
        options.nvme.io_queues = config.nvme_queues.unwrap_or(per_cpu);
        options.nvme.current_cpu = crate::hal::percpu::index;
        options
    }
}

/// Why the disk could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// No device matches the selector.
    Select(SelectError),
    /// The NVMe controller would not come up.
    Nvme(PciAddress, NvmeError),
    /// The virtio-blk device would not come up.
    VirtioBlk(PciAddress, VirtioBlkError),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Select(e) => write!(f, "{e}"),
            OpenError::Nvme(a, e) => write!(f, "NVMe controller at {a}: {e}"),
            OpenError::VirtioBlk(a, e) => write!(f, "virtio-blk device at {a}: {e}"),
        }
    }
}

/// An opened block device, usable from every CPU: `Send + Sync`, as is the stack the
/// appliance serves from (`storage`: a `CountingDisk<FaultDisk<Disk>>` shared as a
/// `&'static`).
#[derive(Debug)]
pub enum Disk {
    /// An NVMe namespace.
    Nvme(NvmeDisk),
    /// A virtio block device.
    VirtioBlk(VirtioBlk),
}

const _: () = {
    const fn shared_by_cpus<T: Send + Sync>() {}
    shared_by_cpus::<Disk>();
    shared_by_cpus::<&'static block::CountingDisk<block::FaultDisk<Disk>>>();
};

/// Opens the device `selector` names (`None`: the first NVMe controller, else the first
/// virtio-blk device), from the functions PCI enumeration found.
pub async fn open(selector: Option<DiskSelector>, options: DiskOptions) -> Result<Disk, OpenError> {
    let (addr, kind) = select(device::functions(), selector).map_err(OpenError::Select)?;
    let pci = device::at(addr).expect("selected from the enumerated functions");
    open_at(pci, kind, options).await
}

/// The PCI address of the device `selector` names, without opening it.
pub fn address_of(selector: DiskSelector) -> Result<PciAddress, OpenError> {
    select(device::functions(), Some(selector))
        .map(|(addr, _)| addr)
        .map_err(OpenError::Select)
}

/// Opens the device at `pci` with the driver for `kind`.
pub async fn open_at(
    pci: PciDevice,
    kind: DiskKind,
    options: DiskOptions,
) -> Result<Disk, OpenError> {
    let addr = pci.address();
    match kind {
        DiskKind::Nvme => NvmeDisk::open(pci, options.nvme)
            .await
            .map(Disk::Nvme)
            .map_err(|e| OpenError::Nvme(addr, e)),
        DiskKind::VirtioBlk => VirtioBlk::open(pci, options.virtio)
            .await
            .map(Disk::VirtioBlk)
            .map_err(|e| OpenError::VirtioBlk(addr, e)),
    }
}

impl Disk {
    /// What kind of device it is.
    pub fn kind(&self) -> DiskKind {
        match self {
            Disk::Nvme(_) => DiskKind::Nvme,
            Disk::VirtioBlk(_) => DiskKind::VirtioBlk,
        }
    }

    /// The NVMe driver's own interface (its I/O queue pairs), if it is an NVMe disk.
    pub fn as_nvme(&self) -> Option<&NvmeDisk> {
        match self {
            Disk::Nvme(d) => Some(d),
            Disk::VirtioBlk(_) => None,
        }
    }

    /// Its PCI function.
    pub fn pci(&self) -> PciDevice {
        match self {
            Disk::Nvme(d) => d.pci(),
            Disk::VirtioBlk(d) => d.pci(),
        }
    }

    /// Reads without the range check, so the device itself refuses what lies past its
    /// end (self-tests of device error statuses).
    pub async fn read_unchecked(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        match self {
            Disk::Nvme(d) => d.read_unchecked(lba, buf).await,
            Disk::VirtioBlk(d) => d.read_unchecked(lba, buf).await,
        }
    }

    /// Fault injection for self-tests: the next completion is lost (see the drivers).
    pub fn inject_lost_completion(&self) {
        match self {
            Disk::Nvme(d) => d.inject_lost_completion(),
            Disk::VirtioBlk(d) => d.inject_lost_completion(),
        }
    }

    /// The slot table's counters (requests in flight, back-pressure).
    pub fn slot_stats(&self) -> SlotStats {
        match self {
            Disk::Nvme(d) => d.stats().slots,
            Disk::VirtioBlk(d) => d.stats().slots,
        }
    }

    /// Device-interaction counters for cost accounting.
    pub fn io_counters(&self) -> IoCounters {
        match self {
            Disk::Nvme(d) => {
                let s = d.stats();
                IoCounters {
                    requests: s.doorbells.submitted,
                    doorbell_writes: s.doorbells.sq_mmio + s.doorbells.cq_mmio,
                    interrupts: s.interrupts,
                    reaps: s.reaps,
                }
            }
            Disk::VirtioBlk(d) => {
                let s = d.stats();
                IoCounters {
                    requests: s.slots.acquired,
                    doorbell_writes: s.notifies,
                    interrupts: s.interrupts,
                    reaps: s.reaps,
                }
            }
        }
    }

    /// Reads a side-effect-free device register `n` times; returns the nanoseconds per
    /// read (the cost of one MMIO exit under emulation). NVMe only.
    pub fn time_register_reads(&self, n: u32) -> Option<u64> {
        match self {
            Disk::Nvme(d) => Some(d.time_register_reads(n)),
            Disk::VirtioBlk(_) => None,
        }
    }

    /// The driver's counters, as one log line.
    pub fn stats_line(&self) -> alloc::string::String {
        match self {
            Disk::Nvme(d) => alloc::format!("{:?}", d.stats()),
            Disk::VirtioBlk(d) => alloc::format!("{:?}", d.stats()),
        }
    }
}

/// How often a driver talked to its device, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Requests handed to the device.
    pub requests: u64,
    /// Doorbell (MMIO) writes: NVMe submission and completion doorbells, virtio
    /// notifications.
    pub doorbell_writes: u64,
    /// Completion interrupts.
    pub interrupts: u64,
    /// Reaper passes.
    pub reaps: u64,
}

impl BlockDevice for Disk {
    fn geometry(&self) -> Geometry {
        match self {
            Disk::Nvme(d) => d.geometry(),
            Disk::VirtioBlk(d) => d.geometry(),
        }
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        match self {
            Disk::Nvme(d) => d.read(lba, buf).await,
            Disk::VirtioBlk(d) => d.read(lba, buf).await,
        }
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        match self {
            Disk::Nvme(d) => d.write(lba, buf, flags).await,
            Disk::VirtioBlk(d) => d.write(lba, buf, flags).await,
        }
    }

    async fn flush(&self) -> Result<(), IoError> {
        match self {
            Disk::Nvme(d) => d.flush().await,
            Disk::VirtioBlk(d) => d.flush().await,
        }
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        match self {
            Disk::Nvme(d) => d.discard(lba, blocks).await,
            Disk::VirtioBlk(d) => d.discard(lba, blocks).await,
        }
    }
}
