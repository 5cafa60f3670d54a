//! [`EventIdxTransport`]: a transport that sends a queue notification only when the
//! device asked for it (virtio 1.1, 2.6.7.2 "Driver Requirements: Available Buffer
//! Notification Suppression").
//!
//! With `VIRTIO_F_EVENT_IDX` the device writes `avail_event` in the used ring: "notify me
//! once the available index passes this". The driver must notify when that index lies
//! between the available index at its previous check and the one it just published
//! (Linux's `vring_need_event`). `virtio-drivers` 0.13 checks `avail_idx >= avail_event +
//! 1` instead: once the index has passed `avail_event`, *every* later buffer notifies
//! until the device next updates it. Under QEMU each notification is a trapped MMIO
//! write (a VM exit under KVM); the network stack queues frames one by one, so most of
//! them were needless (three in four at 16 connections of write + fsync;
//! docs/benchmarks.md). This wrapper sits under the crate's `VirtIONetRaw`: it records
//! each queue's rings when the crate sets the queue up and, when the crate calls
//! `notify`, applies the specification's test (after a full fence: the published index
//! must be visible before `avail_event` is read, or a notification could be lost) and
//! drops the notification if the device did not ask for it. The crate notifies on a
//! superset of the occasions the specification requires, so dropping never loses one.
//!
//! Given where the queues' doorbells are ([`super::Doorbells`]), it reads each queue's
//! when the queue is set up and sends the notifications that remain itself, in one MMIO
//! write: the crate's transport finds the register anew each time, in three trapped
//! accesses.
//!
//! It also negotiates the features the crate does not know: the crate accepts a fixed
//! set (`SUPPORTED_FEATURES` of its net device: no checksum or segmentation offload), so
//! when the crate writes the driver's features this adds the ones the driver asked for
//! ([`EventIdxTransport::with_features`]) that the device offers, filtered by a rule
//! the driver gives, and records what was written. The crate's own handling of the
//! device does not change with them: they only allow the driver to set fields of the
//! virtio-net header the crate leaves at zero.

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::fmt;
use core::sync::atomic::{fence, AtomicU64, Ordering};

use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{PhysAddr, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::Doorbells;
use crate::drivers::virtq::need_event;
use crate::hal::mmio::MmioRegion;

/// `VIRTIO_F_EVENT_IDX`.
const EVENT_IDX: u64 = 1 << 29;
/// Queues tracked (virtio-net without multiqueue has receive, transmit and control).
const QUEUES: usize = 3;

/// Where one queue's rings are (identity-mapped, so physical = virtual).
#[derive(Clone, Copy, Debug)]
struct Rings {
    /// The available ring: `flags: u16, idx: u16, ring: [u16; size], used_event: u16`.
    avail: PhysAddr,
    /// The used ring: `flags: u16, idx: u16, ring: [(u32, u32); size], avail_event: u16`.
    used: PhysAddr,
    size: u32,
    /// The available index at the previous notification check.
    checked: u16,
}

/// Notifications sent and suppressed.
#[derive(Debug)]
pub struct KickStats {
    /// Notifications written to the device.
    pub sent: AtomicU64,
    /// Notifications the crate asked for that the device had not requested.
    pub suppressed: AtomicU64,
}

/// A transport that filters the notifications of its queues by the device's
/// `avail_event` (see the module documentation).
pub struct EventIdxTransport<T: Transport> {
    inner: T,
    event_idx: bool,
    rings: [Option<Rings>; QUEUES],
    /// Where the queues' notification registers are, if the device says.
    locator: Option<Doorbells>,
    /// Each queue's notification register, found at its setup (`queue_set`).
    doorbells: [Option<MmioRegion>; QUEUES],
    stats: &'static KickStats,
    /// Features to add when the device offers them: the device's offer goes through
    /// the rule, whose result is added ([`EventIdxTransport::with_features`]).
    extra: Option<Box<dyn Fn(u64) -> u64 + Send>>,
    /// The features written to the device, once negotiated.
    negotiated: Arc<AtomicU64>,
}

impl<T: Transport> fmt::Debug for EventIdxTransport<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventIdxTransport")
            .field("event_idx", &self.event_idx)
            .field("rings", &self.rings)
            .finish()
    }
}

impl KickStats {
    /// Zero counts.
    pub const fn new() -> Self {
        KickStats {
            sent: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl<T: Transport> EventIdxTransport<T> {
    /// Wraps `inner`, counting into `stats`; notifies each queue through its doorbell
    /// (found by `locator` when the queue is set up) where it has one.
    pub fn new(inner: T, stats: &'static KickStats, locator: Option<Doorbells>) -> Self {
        EventIdxTransport {
            inner,
            event_idx: false,
            rings: [None; QUEUES],
            locator,
            doorbells: [const { None }; QUEUES],
            stats,
            extra: None,
            negotiated: Arc::default(),
        }
    }

    /// Also negotiates the features `rule` picks from those the device offers (it gets
    /// the device's offer and returns the bits to add), beyond the ones the crate asks
    /// for; the features written in the end are readable through the returned cell
    /// once the crate has initialised the device.
    pub fn with_features(
        mut self,
        rule: impl Fn(u64) -> u64 + Send + 'static,
    ) -> (Self, Arc<AtomicU64>) {
        self.extra = Some(Box::new(rule));
        let negotiated = self.negotiated.clone();
        (self, negotiated)
    }

    /// Whether the device asked to be notified of queue `queue`'s new buffers.
    fn device_wants(&mut self, queue: u16) -> bool {
        if !self.event_idx {
            return true;
        }
        let Some(Some(rings)) = self.rings.get_mut(usize::from(queue)) else {
            return true;
        };
        fence(Ordering::SeqCst);
        let avail_event_at = rings.used + 4 + 8 * u64::from(rings.size);
        // SAFETY: both rings were handed to the device by the crate in `queue_set` and
        // stay allocated (DMA memory from `VirtioHal`, identity-mapped) until
        // `queue_unset`, which forgets them here first; the fields read are aligned u16s
        // inside them, read volatile because the device writes `avail_event` at any time.
        let (new, event) = unsafe {
            (
                core::ptr::read_volatile((rings.avail + 2) as *const u16),
                core::ptr::read_volatile(avail_event_at as *const u16),
            )
        };
        let old = core::mem::replace(&mut rings.checked, new);
        need_event(event, new, old)
    }
}

impl<T: Transport> Transport for EventIdxTransport<T> {
    fn device_type(&self) -> DeviceType {
        self.inner.device_type()
    }

    fn read_device_features(&mut self) -> u64 {
        self.inner.read_device_features()
    }

    fn write_driver_features(&mut self, driver_features: u64) {
        self.event_idx = driver_features & EVENT_IDX != 0;
        let offered = self.inner.read_device_features();
        // Only bits the device offers: a driver must not accept others.
        let extra = self
            .extra
            .as_ref()
            .map_or(0, |rule| rule(offered) & offered);
        let features = driver_features | extra;
        self.negotiated.store(features, Ordering::Relaxed);
        self.inner.write_driver_features(features)
    }

    fn max_queue_size(&mut self, queue: u16) -> u32 {
        self.inner.max_queue_size(queue)
    }

    fn notify(&mut self, queue: u16) {
        if self.device_wants(queue) {
            self.stats.sent.fetch_add(1, Ordering::Relaxed);
            match self.doorbells.get(usize::from(queue)) {
                Some(Some(doorbell)) => doorbell.write16(0, queue),
                _ => self.inner.notify(queue),
            }
        } else {
            self.stats.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn get_status(&self) -> DeviceStatus {
        self.inner.get_status()
    }

    fn set_status(&mut self, status: DeviceStatus) {
        self.inner.set_status(status)
    }

    fn set_guest_page_size(&mut self, guest_page_size: u32) {
        self.inner.set_guest_page_size(guest_page_size)
    }

    fn requires_legacy_layout(&self) -> bool {
        self.inner.requires_legacy_layout()
    }

    fn queue_set(
        &mut self,
        queue: u16,
        size: u32,
        descriptors: PhysAddr,
        driver_area: PhysAddr,
        device_area: PhysAddr,
    ) {
        if let Some(slot) = self.rings.get_mut(usize::from(queue)) {
            *slot = Some(Rings {
                avail: driver_area,
                used: device_area,
                size,
                checked: 0,
            });
        }
        self.inner
            .queue_set(queue, size, descriptors, driver_area, device_area);
        // The queue's notification register, read during its setup as the
        // specification places it (after feature negotiation).
        if let (Some(slot), Some(locator)) =
            (self.doorbells.get_mut(usize::from(queue)), &self.locator)
        {
            *slot = locator.of_queue(queue);
            if slot.is_none() {
                log::warn!("virtio: queue {queue}: notification register outside its capability; notifying through the crate");
            }
        }
    }

    fn queue_unset(&mut self, queue: u16) {
        if let Some(slot) = self.rings.get_mut(usize::from(queue)) {
            *slot = None;
        }
        if let Some(slot) = self.doorbells.get_mut(usize::from(queue)) {
            *slot = None;
        }
        self.inner.queue_unset(queue)
    }

    fn queue_used(&mut self, queue: u16) -> bool {
        self.inner.queue_used(queue)
    }

    fn ack_interrupt(&mut self) -> InterruptStatus {
        self.inner.ack_interrupt()
    }

    fn read_config_generation(&self) -> u32 {
        self.inner.read_config_generation()
    }

    fn read_config_space<V: FromBytes + IntoBytes>(&self, offset: usize) -> Result<V> {
        self.inner.read_config_space(offset)
    }

    fn write_config_space<V: IntoBytes + Immutable>(
        &mut self,
        offset: usize,
        value: V,
    ) -> Result<()> {
        self.inner.write_config_space(offset, value)
    }
}
