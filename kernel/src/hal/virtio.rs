//! What the `virtio-drivers` crate needs from the kernel, in one place:
//!
//! - [`VirtioHal`], its [`Hal`]: DMA pages from the frame allocator, MMIO through the
//!   uncached identity mapping, and buffer sharing as the identity (a kernel address is
//!   its bus address, x86 DMA is coherent, so nothing is copied);
//! - [`PciConfig`], its [`ConfigurationAccess`] over the kernel's port-I/O configuration
//!   mechanism (to build a [`PciTransport`]);
//! - [`BlkRing`], a virtqueue of block requests that confines the crate's `unsafe` queue
//!   API (buffers lent to the device) behind one documented contract.
//!
//! Every virtio driver (block here, network in `net/`) uses these; none needs its own.

use core::ptr::NonNull;

use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::pci::bus::{ConfigurationAccess, DeviceFunction, PciRoot};
use virtio_drivers::transport::pci::{PciTransport, VirtioPciError};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

use super::dma::{phys_addr_of, DmaBuffer};
use super::{memory, paging};
use crate::drivers::inflight::{Request, SlotQueue};
use crate::mm::PAGE_SIZE;
use crate::pci::caps::CAP_VENDOR;
use crate::pci::config::ConfigAccess;
use crate::pci::device::{MapBarError, PciDevice};
use crate::pci::port_io::PortIo;
use crate::pci::PciAddress;

/// The kernel's implementation of the crate's [`Hal`].
#[derive(Debug)]
pub struct VirtioHal;

// SAFETY: `dma_alloc` returns zeroed, page-aligned, physically contiguous frames that
// nothing else owns until `dma_dealloc`, identity-mapped (so the pointer is valid and the
// physical address is the pointer). `mmio_phys_to_virt` returns the identity mapping that
// `paging::map_mmio` made uncached. Sharing is the identity because kernel memory is
// identity-mapped and x86 DMA is cache-coherent.
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
        phys_addr_of(buffer.as_ptr())
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
    const COMMON_CFG: u8 = 1;
    const MSIX_CONFIG: usize = 0x10;
    const QUEUE_SELECT: usize = 0x16;
    const QUEUE_MSIX_VECTOR: usize = 0x1a;
    const NO_VECTOR: u16 = 0xffff;
    let cap = dev
        .capabilities()
        .find(|&(id, off)| id == CAP_VENDOR && dev.read8(off + 3) == COMMON_CFG)
        .map(|(_, off)| off)
        .ok_or(MsixRouteError::NoCommonConfig)?;
    let bar = dev.read8(cap + 4);
    let offset = dev.read32(cap + 8) as usize;
    let length = dev.read32(cap + 12) as usize;
    if length < QUEUE_MSIX_VECTOR + 2 {
        return Err(MsixRouteError::NoCommonConfig);
    }
    let bar = dev.map_bar(bar).map_err(MsixRouteError::Bar)?;
    if offset.checked_add(length).is_none_or(|end| end > bar.len()) {
        return Err(MsixRouteError::NoCommonConfig);
    }
    let regs = bar.subregion(offset, length);
    regs.write16(MSIX_CONFIG, NO_VECTOR);
    regs.write16(QUEUE_SELECT, queue);
    regs.write16(QUEUE_MSIX_VECTOR, entry);
    if regs.read16(QUEUE_MSIX_VECTOR) != entry {
        return Err(MsixRouteError::Refused);
    }
    Ok(())
}

/// Bytes of request header (`virtio_blk_req` up to the data).
pub const BLK_HEADER: usize = 16;
/// Bytes of per-slot extra device-readable data (one discard segment).
pub const BLK_EXTRA: usize = 16;

/// The data part of a block request.
#[derive(Debug)]
pub enum BlkData<'a> {
    /// No data (flush).
    None,
    /// The device reads this buffer (write).
    ToDevice(&'a [u8]),
    /// The device writes this buffer (read).
    FromDevice(&'a mut [u8]),
    /// The device reads the slot's extra area (a discard segment), `len` bytes of it.
    Extra(usize),
}

/// A request the device holds: its slot and where its data is.
#[derive(Clone, Copy, Debug)]
struct Lent {
    slot: u16,
    data: LentData,
}

#[derive(Clone, Copy, Debug)]
enum LentData {
    None,
    ToDevice(*const u8, usize),
    FromDevice(*mut u8, usize),
    Extra(usize),
}

/// Why a request could not be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Not enough free descriptors.
    Full,
    /// The crate refused the request.
    Virtio(virtio_drivers::Error),
}

/// A virtqueue of `N` descriptors carrying block requests: a 16-byte header and an optional
/// data buffer the device reads or writes, then a status byte the device writes. Headers,
/// discard segments and status bytes live in the ring's own DMA memory, one set per slot
/// (slots are the driver's request numbers, fewer than `N / 3`).
pub struct BlkRing<const N: usize> {
    queue: VirtQueue<VirtioHal, N>,
    /// Per slot: header, then extra; after all slots, one status byte per slot.
    mem: DmaBuffer,
    slots: usize,
    /// By descriptor head (the crate's token): the request the device holds there.
    lent: [Option<Lent>; N],
}

impl<const N: usize> core::fmt::Debug for BlkRing<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BlkRing")
            .field("size", &N)
            .field("slots", &self.slots)
            .field("lent", &self.lent.iter().filter(|l| l.is_some()).count())
            .finish()
    }
}

impl<const N: usize> BlkRing<N> {
    /// Sets up virtqueue `index` of `transport` for `slots` requests.
    pub fn new(
        transport: &mut PciTransport,
        index: u16,
        slots: usize,
    ) -> Result<BlkRing<N>, virtio_drivers::Error> {
        assert!(
            slots * 3 <= N,
            "{slots} requests do not fit {N} descriptors"
        );
        let queue = VirtQueue::new(transport, index, false, false)?;
        let bytes = slots * (BLK_HEADER + BLK_EXTRA + 1);
        let mem = DmaBuffer::new(bytes.next_multiple_of(PAGE_SIZE as usize))
            .map_err(|_| virtio_drivers::Error::DmaError)?;
        Ok(BlkRing {
            queue,
            mem,
            slots,
            lent: [None; N],
        })
    }

    fn header_at(&self, slot: u16) -> usize {
        usize::from(slot) * (BLK_HEADER + BLK_EXTRA)
    }

    fn status_at(&self, slot: u16) -> usize {
        self.slots * (BLK_HEADER + BLK_EXTRA) + usize::from(slot)
    }

    /// The slot's extra area (write a discard segment here before pushing).
    pub fn extra_mut(&mut self, slot: u16) -> &mut [u8] {
        let at = self.header_at(slot) + BLK_HEADER;
        &mut self.mem.as_mut_slice()[at..at + BLK_EXTRA]
    }

    /// Queues `req`'s request in its slot and marks it submitted. The device learns of it
    /// on the next notification. `data` must live as long as the request can: the guard's
    /// drop waits for the device when caller memory is lent (see
    /// [`Request`]), so the memory is not reused under the device. (Leaking the request
    /// future with `mem::forget` would defeat that, as for any zero-copy borrowed-buffer
    /// I/O; the kernel never does.)
    pub fn push_request<'q, Q: SlotQueue>(
        &mut self,
        req: &mut Request<'q, Q>,
        header: [u8; BLK_HEADER],
        data: BlkData<'q>,
    ) -> Result<(), RingError> {
        let borrows = matches!(data, BlkData::ToDevice(_) | BlkData::FromDevice(_));
        // SAFETY: `data` outlives the request guard (`'q`), and `submitted` arms the guard
        // right after, before anything else can run: from then on the guard (or its
        // completion) keeps the lent memory valid until `pop` returns the slot or the
        // device is reset.
        unsafe { self.push(req.slot(), header, data)? };
        req.submitted(borrows);
        Ok(())
    }

    /// Stops (`false`) or restarts used-buffer interrupts from the device.
    pub fn set_interrupts(&mut self, on: bool) {
        self.queue.set_dev_notify(on);
    }

    /// Queues a request for `slot` (which must not be in the ring already).
    ///
    /// # Safety
    /// The memory of `data` is lent to the device: the caller must keep it valid, and not
    /// access it (if the device writes it) or modify it (if the device reads it), until
    /// [`BlkRing::pop`] has returned `slot`, or the device has been reset.
    unsafe fn push(
        &mut self,
        slot: u16,
        header: [u8; BLK_HEADER],
        data: BlkData<'_>,
    ) -> Result<(), RingError> {
        assert!(usize::from(slot) < self.slots, "slot {slot} out of range");
        let (h, s) = (self.header_at(slot), self.status_at(slot));
        let mem = self.mem.as_mut_slice();
        mem[h..h + BLK_HEADER].copy_from_slice(&header);
        mem[s] = 0xff;
        let (front, statuses) = mem.split_at_mut(self.slots * (BLK_HEADER + BLK_EXTRA));
        let status = core::slice::from_mut(&mut statuses[usize::from(slot)]);
        let (head, extra) = front[h..h + BLK_HEADER + BLK_EXTRA].split_at(BLK_HEADER);
        let (lent, token) = match data {
            BlkData::None => (LentData::None, {
                // SAFETY: header and status are ring memory, kept until the ring drops
                // (after the device is reset); they stay untouched until `pop`.
                unsafe { self.queue.add(&[head], &mut [status]) }
            }),
            BlkData::ToDevice(buf) => (LentData::ToDevice(buf.as_ptr(), buf.len()), {
                // SAFETY: as above for ring memory; the caller lends `buf` until `pop`.
                unsafe { self.queue.add(&[head, buf], &mut [status]) }
            }),
            BlkData::FromDevice(buf) => {
                let l = LentData::FromDevice(buf.as_mut_ptr(), buf.len());
                // SAFETY: as above; the caller lends `buf` until `pop`.
                (l, unsafe { self.queue.add(&[head], &mut [buf, status]) })
            }
            BlkData::Extra(len) => (LentData::Extra(len), {
                // SAFETY: as above; the extra area is ring memory.
                unsafe { self.queue.add(&[head, &extra[..len]], &mut [status]) }
            }),
        };
        let token = token.map_err(|e| match e {
            virtio_drivers::Error::QueueFull => RingError::Full,
            e => RingError::Virtio(e),
        })?;
        let entry = &mut self.lent[usize::from(token)];
        assert!(entry.is_none(), "descriptor {token} lent twice");
        *entry = Some(Lent { slot, data: lent });
        Ok(())
    }

    /// Whether the device wants to be notified of new requests.
    pub fn should_notify(&self) -> bool {
        self.queue.should_notify()
    }

    /// The next request the device has completed: its slot and status byte. An error
    /// (with the descriptor number) means the device returned a descriptor it was never
    /// given; the ring cannot be trusted any more and the device must be reset.
    pub fn pop(&mut self) -> Option<Result<(u16, u8), u16>> {
        let token = self.queue.peek_used()?;
        let Some(lent) = self.lent.get_mut(usize::from(token)).and_then(Option::take) else {
            return Some(Err(token));
        };
        let (h, s) = (self.header_at(lent.slot), self.status_at(lent.slot));
        let mem = self.mem.as_mut_slice();
        let (front, statuses) = mem.split_at_mut(self.slots * (BLK_HEADER + BLK_EXTRA));
        let status = core::slice::from_mut(&mut statuses[usize::from(lent.slot)]);
        let (head, extra) = front[h..h + BLK_HEADER + BLK_EXTRA].split_at(BLK_HEADER);
        // SAFETY (every arm): these are exactly the buffers `push` gave for this token; the
        // lent ones are still valid by `push`'s contract, and our `unshare` is a no-op.
        let result = match lent.data {
            LentData::None => {
                // SAFETY: see above.
                unsafe { self.queue.pop_used(token, &[head], &mut [status]) }
            }
            LentData::ToDevice(p, len) => {
                // SAFETY: see above; `p..p + len` is the lent buffer.
                let buf = unsafe { core::slice::from_raw_parts(p, len) };
                // SAFETY: see above.
                unsafe { self.queue.pop_used(token, &[head, buf], &mut [status]) }
            }
            LentData::FromDevice(p, len) => {
                // SAFETY: see above; `p..p + len` is the lent buffer, which nobody else
                // accesses until its request completes.
                let buf = unsafe { core::slice::from_raw_parts_mut(p, len) };
                // SAFETY: see above.
                unsafe { self.queue.pop_used(token, &[head], &mut [buf, status]) }
            }
            LentData::Extra(len) => {
                // SAFETY: see above.
                unsafe {
                    self.queue
                        .pop_used(token, &[head, &extra[..len]], &mut [status])
                }
            }
        };
        result.expect("the peeked token is next in the used ring");
        Some(Ok((lent.slot, self.mem.as_slice()[s])))
    }
}
