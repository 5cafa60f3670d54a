//! The `virtio-drivers` crate behind safe interfaces, in one place:
//!
//! - `VirtioHal`, the crate's [`Hal`] (private): ring pages from the frame allocator, MMIO
//!   through the uncached identity mapping, and buffer sharing as the identity (a kernel
//!   address is its bus address, x86 DMA is coherent, so nothing is copied);
//! - [`PciConfig`], its [`ConfigurationAccess`] over the kernel's port-I/O configuration
//!   mechanism, [`pci_transport`] to build a [`PciTransport`], [`reset`], and
//!   [`route_queue_msix`] (which the crate lacks);
//! - [`Virtqueue`] (in `queue`): the crate's `unsafe` buffer-lending queue API, made safe
//!   by ownership: a request's buffers are [`Chain`]s of DMA memory the queue owns until
//!   the device hands them back;
//! - [`NetDevice`] (in `net`): the crate's raw virtio-net device, made safe the same way,
//!   over `event_idx::EventIdxTransport`, which drops the queue notifications the device
//!   did not ask for (the crate's event-index test is looser than the specification's)
//!   and negotiates the features the crate does not know (checksum and segmentation
//!   offload, which the driver asks for: `net::offload`).
//!
//! The drivers' request logic (virtio-blk's request layout and slots, virtio-net's buffer
//! recycling) lives in `drivers/` on top of these.

mod event_idx;
mod net;
mod queue;

pub use net::{kick_counts, NetDevice, RxError, NET_QUEUE_SIZE};
pub use queue::{Chain, Used, Virtqueue};

use core::ptr::NonNull;

use virtio_drivers::transport::pci::bus::{ConfigurationAccess, DeviceFunction, PciRoot};
use virtio_drivers::transport::pci::{PciTransport, VirtioPciError};
use virtio_drivers::transport::{DeviceStatus, Transport};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

use super::dma::bus_addr_of;
use super::mmio::MmioRegion;
use super::{memory, paging};
use crate::pci::caps::CAP_VENDOR;
use crate::pci::config::ConfigAccess;
use crate::pci::device::{MapBarError, PciDevice};
use crate::pci::port_io::PortIo;
use crate::pci::PciAddress;

/// The kernel's implementation of the crate's [`Hal`]. Private: the crate's queues are
/// only reachable through [`Virtqueue`] and [`NetDevice`], which hand it nothing but DMA
/// memory they own.
#[derive(Debug)]
struct VirtioHal;

// SAFETY: `dma_alloc` returns zeroed, page-aligned, physically contiguous frames that
// nothing else owns until `dma_dealloc`, identity-mapped (so the pointer is valid and the
// physical address is the pointer); the crate frees them when a queue is dropped, which
// `Virtqueue` and `NetDevice` only let happen once the device cannot reach them.
// `mmio_phys_to_virt` returns the identity mapping that `paging::map_mmio` made uncached.
// Sharing is the identity because kernel memory is identity-mapped and x86 DMA is
// cache-coherent; the buffers shared are DMA objects owned by the queue wrappers.
unsafe impl Hal for VirtioHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        match memory::alloc_zeroed_frames(pages, 1) {
            Ok(addr) => (
                addr,
                NonNull::new(addr as *mut u8).expect("frame 0 is never allocated"),
            ),
            // The crate turns a zero physical address into `Error::DmaError`.
            Err(_) => (0, NonNull::dangling()),
        }
    }

    unsafe fn dma_dealloc(paddr: PhysAddr, _vaddr: NonNull<u8>, pages: usize) -> i32 {
        memory::free_frames(paddr, pages);
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, size: usize) -> NonNull<u8> {
        // Drivers map the device's BARs before building the transport, so this only finds
        // the existing mapping; a conflict would be a kernel bug.
        let region = paging::map_mmio(paddr, size as u64)
            .unwrap_or_else(|e| panic!("virtio MMIO {paddr:#x}+{size:#x} not mappable: {e:?}"));
        NonNull::new(region.as_ptr()).expect("MMIO at address 0")
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        bus_addr_of(buffer.as_ptr())
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// PCI configuration space for the crate, through ports 0xCF8/0xCFC (segment 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct PciConfig;

fn address(f: DeviceFunction) -> PciAddress {
    PciAddress::new(0, f.bus, f.device, f.function)
}

impl ConfigurationAccess for PciConfig {
    fn read_word(&self, f: DeviceFunction, register_offset: u8) -> u32 {
        PortIo.read32(address(f), u16::from(register_offset))
    }

    fn write_word(&mut self, f: DeviceFunction, register_offset: u8, data: u32) {
        PortIo.write32(address(f), u16::from(register_offset), data)
    }

    unsafe fn unsafe_clone(&self) -> Self {
        PciConfig
    }
}

/// The modern virtio PCI transport of `dev`. Maps its memory BARs first (uncached), so
/// the crate's MMIO lookups find them.
pub fn pci_transport(dev: &PciDevice) -> Result<PciTransport, VirtioPciError> {
    for (index, _) in dev.bars() {
        // I/O BARs and unassigned ones are not what the virtio capabilities point at.
        let _ = dev.map_bar(index);
    }
    let a = dev.address();
    let function = DeviceFunction {
        bus: a.bus,
        device: a.device,
        function: a.function,
    };
    PciTransport::new::<VirtioHal, _>(&mut PciRoot::new(PciConfig), function)
}

/// Why MSI-X could not be routed to a virtqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsixRouteError {
    /// No common configuration capability.
    NoCommonConfig,
    /// Its BAR could not be mapped.
    Bar(MapBarError),
    /// The device refused the vector (it reads back as "no vector").
    Refused,
}

/// Routes virtqueue `queue`'s interrupts to MSI-X table entry `entry`, and configuration
/// changes to none. The crate's transport has no call for this, so it is done here on
/// the common configuration registers (`queue_select`, `queue_msix_vector`,
/// `msix_config`), before the driver sets DRIVER_OK.
pub fn route_queue_msix(dev: &PciDevice, queue: u16, entry: u16) -> Result<(), MsixRouteError> {
    const NO_VECTOR: u16 = 0xffff;
    let regs = vendor_region(dev, COMMON_CFG, QUEUE_MSIX_VECTOR + 2)?;
    regs.write16(MSIX_CONFIG, NO_VECTOR);
    regs.write16(QUEUE_SELECT, queue);
    regs.write16(QUEUE_MSIX_VECTOR, entry);
    if regs.read16(QUEUE_MSIX_VECTOR) != entry {
        return Err(MsixRouteError::Refused);
    }
    Ok(())
}

/// Where a device's queue notification registers ("doorbells") are: each queue's is the
/// 16-bit register its index is written to (virtio 1.1, 4.1.4.4: the notify capability's
/// offset plus the queue's `queue_notify_off` times the capability's multiplier). The
/// crate's transport finds it anew on every notification, selecting the queue and
/// reading its `queue_notify_off` first (three trapped MMIO accesses instead of one);
/// with this, a queue's register is read once, at the queue's setup (the
/// specification's place for it, after feature negotiation: [`Doorbells::of_queue`]).
#[derive(Clone)]
pub struct Doorbells {
    common: MmioRegion,
    notify: MmioRegion,
    multiplier: usize,
}

impl core::fmt::Debug for Doorbells {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Doorbells")
            .field("multiplier", &self.multiplier)
            .finish_non_exhaustive()
    }
}

/// `queue_notify_off` in the common configuration.
const QUEUE_NOTIFY_OFF: usize = 0x1e;

impl Doorbells {
    /// The capabilities that locate `dev`'s doorbells (PCI configuration only: nothing of
    /// the device's state is read); `None` if one is missing or too short.
    pub fn find(dev: &PciDevice) -> Option<Doorbells> {
        const NOTIFY_CFG: u8 = 2;
        let common = vendor_region(dev, COMMON_CFG, QUEUE_NOTIFY_OFF + 2).ok()?;
        let cap = vendor_cap(dev, NOTIFY_CFG).ok()?;
        let notify = vendor_region(dev, NOTIFY_CFG, 0).ok()?;
        let multiplier = dev.read32(cap + 16) as usize;
        Some(Doorbells {
            common,
            notify,
            multiplier,
        })
    }

    /// The doorbell of `queue`, to be read while the queue is set up (after the features
    /// are negotiated, before DRIVER_OK). It writes `queue_select`, which the crate's
    /// transport rewrites before each of its own queue accesses. `None` if the register
    /// lies outside the notify capability.
    pub fn of_queue(&self, queue: u16) -> Option<MmioRegion> {
        self.common.write16(QUEUE_SELECT, queue);
        let at = usize::from(self.common.read16(QUEUE_NOTIFY_OFF)).checked_mul(self.multiplier)?;
        (at.checked_add(2)? <= self.notify.len()).then(|| self.notify.subregion(at, 2))
    }
}

/// Common configuration capability (`cfg_type`) and the registers used in it.
const COMMON_CFG: u8 = 1;
const MSIX_CONFIG: usize = 0x10;
const QUEUE_SELECT: usize = 0x16;
const QUEUE_MSIX_VECTOR: usize = 0x1a;

/// The configuration offset of `dev`'s first virtio vendor capability of `cfg_type`.
fn vendor_cap(dev: &PciDevice, cfg_type: u8) -> Result<u16, MsixRouteError> {
    dev.capabilities()
        .find(|&(id, off)| id == CAP_VENDOR && dev.read8(off + 3) == cfg_type)
        .map(|(_, off)| off)
        .ok_or(MsixRouteError::NoCommonConfig)
}

/// The registers that `dev`'s vendor capability of `cfg_type` points at (their BAR
/// mapped), if at least `min_len` bytes long and inside the BAR.
fn vendor_region(
    dev: &PciDevice,
    cfg_type: u8,
    min_len: usize,
) -> Result<MmioRegion, MsixRouteError> {
    let cap = vendor_cap(dev, cfg_type)?;
    let bar = dev.read8(cap + 4);
    let offset = dev.read32(cap + 8) as usize;
    let length = dev.read32(cap + 12) as usize;
    if length < min_len {
        return Err(MsixRouteError::NoCommonConfig);
    }
    let bar = dev.map_bar(bar).map_err(MsixRouteError::Bar)?;
    if offset.checked_add(length).is_none_or(|end| end > bar.len()) {
        return Err(MsixRouteError::NoCommonConfig);
    }
    Ok(bar.subregion(offset, length))
}

/// How many times [`reset`] reads the status back before giving up (each read is an
/// MMIO exit; QEMU resets at once).
const RESET_POLLS: u32 = 10_000;

/// Resets the device (device status 0), which makes it forget its queues and stop using
/// their memory, and checks that it did (the status reads back 0). False if it did not
/// confirm: the caller must then stop its bus mastering and give up on it.
pub fn reset(transport: &mut PciTransport) -> bool {
    transport.set_status(DeviceStatus::empty());
    (0..RESET_POLLS).any(|_| transport.get_status().is_empty())
}
