//! [`DmaDevice`]: a PCI function's bus mastering, and the DMA memory it may reach.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::Any;
use core::fmt;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::pci::device::PciDevice;
use crate::pci::PciAddress;
use crate::sync::IrqLock;

/// Functions with a live [`DmaDevice`]: one owner of a function's bus mastering at a time.
static OWNED: IrqLock<Vec<PciAddress>> = IrqLock::new(Vec::new());

/// The function already has a [`DmaDevice`] (a driver for it is still alive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaInUse(pub PciAddress);

/// Counters of one device's DMA memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaStats {
    /// Streams lent to the device now.
    pub lent: usize,
    /// Streams lent so far.
    pub lends: u64,
    /// DMA objects dropped while the device could still reach them, kept until bus
    /// mastering went off (abandoned lent streams, queues of a device being torn down).
    pub parked: u64,
    /// Parked objects freed when bus mastering went off.
    pub released: u64,
    /// Times bus mastering was turned off.
    pub stops: u64,
    /// Allocations refused for lack of frames (the caller may wait and retry).
    pub alloc_failures: u64,
}

/// One PCI function's permission to master the bus (DMA, and the memory writes that
/// deliver its MSIs), and the owner of every DMA object allocated for it. Cloning shares
/// it.
///
/// Bus mastering starts off; [`DmaDevice::start`] turns it on. While it is on, a DMA
/// object that is dropped is *parked* here instead of being freed, because the device
/// may still hold its address; [`DmaDevice::stop`] turns bus mastering off (the device
/// can then reach no memory at all) and frees what was parked. Dropping the last handle
/// stops the device the same way. So no drop, early or late, and no `mem::forget`, can
/// free memory a running device may write.
///
/// It is `Send + Sync`: a driver used from several CPUs lends, reclaims and parks from
/// any of them (the parked list and the counters are under one short [`IrqLock`]).
#[derive(Clone)]
pub struct DmaDevice {
    domain: Arc<Domain>,
}

struct Domain {
    pci: PciDevice,
    mastering: AtomicBool,
    /// Objects dropped while the device could reach them; dropped in turn once it cannot.
    parked: IrqLock<Vec<Parked>>,
    stats: IrqLock<DmaStats>,
}

/// A DMA object parked until its device cannot reach it any more.
struct Parked(#[allow(dead_code)] Box<dyn Any>);

// SAFETY: only hal code parks objects (`DmaDevice::retire` is private to the hal), and
// what it parks is DMA memory and the bookkeeping over it: frames, and the
// `virtio-drivers` queues and devices built on them (addresses into memory no CPU owns,
// with no CPU affinity and nothing thread-local). Dropping one on any CPU frees frames
// through the global frame allocator.
unsafe impl Send for Parked {}

impl fmt::Debug for DmaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaDevice")
            .field("pci", &self.domain.pci.address())
            .field("mastering", &self.is_mastering())
            .field("stats", &self.stats())
            .finish()
    }
}

impl DmaDevice {
    /// Takes over `pci`'s bus mastering, which is turned off until [`DmaDevice::start`].
    /// Fails if another `DmaDevice` for the function is still alive.
    pub fn new(pci: PciDevice) -> Result<DmaDevice, DmaInUse> {
        let addr = pci.address();
        OWNED.lock(|owned| {
            if owned.contains(&addr) {
                return Err(DmaInUse(addr));
            }
            owned.push(addr);
            Ok(())
        })?;
        pci.set_bus_master(false);
        Ok(DmaDevice {
            domain: Arc::new(Domain {
                pci,
                mastering: AtomicBool::new(false),
                parked: IrqLock::new(Vec::new()),
                stats: IrqLock::new(DmaStats::default()),
            }),
        })
    }

    /// The PCI function.
    pub fn pci(&self) -> PciDevice {
        self.domain.pci
    }

    /// Lets the device master the bus. After a [`DmaDevice::stop`], only once the device
    /// has been reset: it must not use addresses it was given before (their memory may
    /// have been freed).
    pub fn start(&self) {
        self.domain.pci.set_bus_master(true);
        self.domain.mastering.store(true, Ordering::SeqCst);
    }

    /// Turns bus mastering off, so the device can no longer reach memory, and frees every
    /// parked object. Lent streams may then be reclaimed whatever the device's state.
    pub fn stop(&self) {
        self.domain.stop();
    }

    /// Whether the device may master the bus now.
    pub fn is_mastering(&self) -> bool {
        self.domain.mastering.load(Ordering::SeqCst)
    }

    /// The counters.
    pub fn stats(&self) -> DmaStats {
        self.domain.stats.lock(|s| *s)
    }

    /// Whether `other` is a handle on the same device.
    pub(in crate::hal) fn same(&self, other: &DmaDevice) -> bool {
        Arc::ptr_eq(&self.domain, &other.domain)
    }

    /// Drops `object` (DMA memory, or something that owns some) now if the device cannot
    /// reach memory, or once it can no longer do so.
    pub(in crate::hal) fn retire<T: 'static>(&self, object: T) {
        let parked = Parked(Box::new(object));
        // Checked under the lock `Domain::stop` empties the list under: an object parked
        // after bus mastering went off would wait for the next stop.
        let late = self.domain.parked.lock(|p| {
            if self.domain.mastering.load(Ordering::SeqCst) {
                p.push(parked);
                None
            } else {
                Some(parked)
            }
        });
        match late {
            None => self.bump(|s| s.parked += 1),
            Some(object) => drop(object),
        }
    }

    pub(super) fn bump(&self, f: impl FnOnce(&mut DmaStats)) {
        self.domain.stats.lock(f);
    }
}

impl Domain {
    fn stop(&self) {
        self.pci.set_bus_master(false);
        // Dropping a parked object may retire others (a queue's buffers): take them all
        // out before dropping any, outside the lock.
        let parked = self.parked.lock(|p| {
            self.mastering.store(false, Ordering::SeqCst);
            core::mem::take(p)
        });
        self.stats.lock(|s| {
            s.stops += 1;
            s.released += parked.len() as u64;
        });
        drop(parked);
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        self.stop();
        let addr = self.pci.address();
        OWNED.lock(|owned| owned.retain(|a| *a != addr));
    }
}
