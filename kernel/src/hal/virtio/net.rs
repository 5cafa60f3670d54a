//! [`NetDevice`]: the crate's raw virtio-net device with ownership in place of its
//! `unsafe` contract.
//!
//! `VirtIONetRaw` hands frames to the device with `receive_begin`/`transmit_begin`, which
//! are `unsafe` because the buffer must stay alive and untouched until the matching
//! `*_complete`. Here every buffer is a [`DmaStream`] that the device owns, lent, from
//! the moment it is posted until the device hands it back (indexed by the crate's
//! token), and dropping the device parks them all with its [`DmaDevice`].

use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::pci::PciTransport;
use virtio_drivers::Error;

use super::event_idx::{EventIdxTransport, KickStats};
use super::{Doorbells, VirtioHal};
use crate::hal::dma::{DmaDevice, DmaStream, LentStream};

/// Descriptors per queue (QEMU's default virtio-net queue size).
pub const NET_QUEUE_SIZE: usize = 256;

/// The NIC's queue notifications (one NIC per appliance).
static KICKS: KickStats = KickStats::new();

/// Queue notifications written to the NIC, and those the device had not asked for and
/// were skipped (see `event_idx`).
pub fn kick_counts() -> (u64, u64) {
    (
        KICKS.sent.load(core::sync::atomic::Ordering::Relaxed),
        KICKS.suppressed.load(core::sync::atomic::Ordering::Relaxed),
    )
}

/// Why [`NetDevice::receive`] has no frame to give.
#[derive(Debug)]
pub enum RxError {
    /// The device returned a buffer it was never given (a protocol error; no buffer).
    UnknownToken(u16),
    /// The device returned the buffer without a valid frame in it.
    Device(DmaStream, Error),
}

/// A virtio-net device and every buffer it holds. See the module documentation.
pub struct NetDevice {
    /// `None` only while being dropped.
    raw: Option<VirtIONetRaw<VirtioHal, EventIdxTransport<PciTransport>, NET_QUEUE_SIZE>>,
    device: DmaDevice,
    /// Receive buffers the device holds, by token.
    rx: Vec<Option<LentStream>>,
    /// Transmit buffers the device holds, with the length handed over, by token.
    tx: Vec<Option<(LentStream, usize)>>,
    /// The feature bits negotiated.
    features: u64,
}

impl fmt::Debug for NetDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetDevice")
            .field("rx_posted", &self.rx.iter().flatten().count())
            .field("tx_in_flight", &self.tx.iter().flatten().count())
            .finish()
    }
}

impl NetDevice {
    /// Initialises the device behind `transport`, whose bus mastering `device` holds;
    /// queue notifications go through the doorbells `doorbells` locates
    /// ([`super::Doorbells`]) if given. Besides the features the crate negotiates (MAC,
    /// STATUS, indirect descriptors, event index, VERSION_1), those `extra` picks from
    /// the device's offer are accepted (only offered ones): it gets the offer and
    /// returns the bits wanted. The crate leaves the header fields they concern at
    /// zero; the driver sets them ([`NetDevice::fill_header`] then its own writes).
    pub fn new(
        transport: PciTransport,
        device: &DmaDevice,
        doorbells: Option<Doorbells>,
        extra: impl Fn(u64) -> u64 + Send + 'static,
    ) -> Result<NetDevice, Error> {
        let (transport, negotiated) =
            EventIdxTransport::new(transport, &KICKS, doorbells).with_features(extra);
        let raw = VirtIONetRaw::new(transport)?;
        Ok(NetDevice {
            raw: Some(raw),
            device: device.clone(),
            rx: (0..NET_QUEUE_SIZE).map(|_| None).collect(),
            tx: (0..NET_QUEUE_SIZE).map(|_| None).collect(),
            features: negotiated.load(core::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The feature bits negotiated with the device.
    pub fn features(&self) -> u64 {
        self.features
    }

    fn raw(&self) -> &VirtIONetRaw<VirtioHal, EventIdxTransport<PciTransport>, NET_QUEUE_SIZE> {
        self.raw.as_ref().expect("only None while dropping")
    }

    fn raw_mut(
        &mut self,
    ) -> &mut VirtIONetRaw<VirtioHal, EventIdxTransport<PciTransport>, NET_QUEUE_SIZE> {
        self.raw.as_mut().expect("only None while dropping")
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.raw().mac_address()
    }

    /// Acknowledges a (legacy or config) interrupt by reading the ISR register.
    pub fn ack_interrupt(&mut self) {
        self.raw_mut().ack_interrupt();
    }

    /// Whether the transmit queue has room for a frame.
    pub fn can_send(&self) -> bool {
        self.raw().can_send()
    }

    /// Writes the virtio-net header at the start of `buf`; returns its length.
    pub fn fill_header(&self, buf: &mut DmaStream) -> Result<usize, Error> {
        self.raw().fill_buffer_header(buf.as_mut_slice())
    }

    /// Gives `buf` to the device to receive a frame into. On failure the buffer (which the
    /// device never saw) is dropped.
    pub fn post_rx(&mut self, buf: DmaStream) -> Result<(), Error> {
        let buf = buf.lend();
        // SAFETY: the slice is the lent stream's memory, which `self.rx[token]` owns from
        // here until `receive` passes the same slice to `receive_complete` (or the device
        // is dropped, parking it); nothing else can access it meanwhile.
        let token = unsafe { self.raw_mut().receive_begin(lent_slice_mut(&buf)) };
        let token = match token {
            Ok(t) => t,
            Err(e) => {
                // Refused before the device saw it.
                drop(buf.reclaim());
                return Err(e);
            }
        };
        let entry = &mut self.rx[usize::from(token)];
        assert!(entry.is_none(), "virtio-net: rx token {token} reused");
        *entry = Some(buf);
        Ok(())
    }

    /// The next received frame, if one has arrived: its buffer and where the frame lies
    /// in it.
    pub fn receive(&mut self) -> Option<Result<(DmaStream, Range<usize>), RxError>> {
        let token = look_twice(|| self.raw().poll_receive())?;
        let Some(buf) = self.rx.get_mut(usize::from(token)).and_then(Option::take) else {
            return Some(Err(RxError::UnknownToken(token)));
        };
        // SAFETY: `buf` is the buffer posted with this token (see `post_rx`).
        let done = unsafe { self.raw_mut().receive_complete(token, lent_slice_mut(&buf)) };
        // The token was just peeked, so the device did hand the buffer back; only the
        // frame length can be wrong.
        let buf = buf.reclaim();
        Some(match done {
            Ok((start, len)) if start + len <= buf.len() => Ok((buf, start..start + len)),
            Ok(_) => Err(RxError::Device(buf, Error::IoError)),
            Err(e) => Err(RxError::Device(buf, e)),
        })
    }

    /// Sends the first `len` bytes of `buf` (header included). On failure the buffer
    /// comes back.
    pub fn transmit(&mut self, buf: DmaStream, len: usize) -> Result<(), (DmaStream, Error)> {
        assert!(len <= buf.len(), "transmitting {len} bytes of {buf:?}");
        let buf = buf.lend();
        // SAFETY: as for receive buffers: `self.tx[token]` owns the lent stream until
        // `transmitted` passes the same slice to `transmit_complete`.
        let token = match unsafe { self.raw_mut().transmit_begin(&lent_slice(&buf)[..len]) } {
            Ok(t) => t,
            Err(e) => return Err((buf.reclaim(), e)),
        };
        let entry = &mut self.tx[usize::from(token)];
        assert!(entry.is_none(), "virtio-net: tx token {token} reused");
        *entry = Some((buf, len));
        Ok(())
    }

    /// The buffer of the next finished transmission, if there is one. An `Err` is a
    /// device that broke the protocol (the transmission's buffer stays with it).
    pub fn transmitted(&mut self) -> Option<Result<DmaStream, Error>> {
        let token = look_twice(|| self.raw_mut().poll_transmit())?;
        let Some((buf, len)) = self.tx.get_mut(usize::from(token)).and_then(Option::take) else {
            return Some(Err(Error::WrongToken));
        };
        // SAFETY: `buf[..len]` is exactly the slice given to `transmit_begin` for this
        // token (see `transmit`).
        let done = unsafe {
            self.raw_mut()
                .transmit_complete(token, &lent_slice(&buf)[..len])
        };
        Some(match done {
            // The token was just peeked: the device handed the buffer back.
            Ok(_) => Ok(buf.reclaim()),
            Err(e) => {
                self.tx[usize::from(token)] = Some((buf, len));
                Err(e)
            }
        })
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        // The PCI transport cannot take queues back from a running device: the rings and
        // the buffers they list are freed only once bus mastering is off (lent buffers
        // retire themselves).
        if let Some(raw) = self.raw.take() {
            self.device.retire(raw);
        }
    }
}

/// A queue's next used token from `peek`, which looks again after a full fence when it
/// first finds the queue empty.
///
/// With `VIRTIO_F_EVENT_IDX` the crate publishes `used_event` ("interrupt me once the
/// used index passes this") with a release store when it pops, and the next peek loads
/// the used index. x86 may satisfy that load before the store is visible to the device:
/// the driver sees the queue empty while the device, reading the old `used_event`,
/// skips the interrupt for the buffer it just returned. Nothing then wakes the driver
/// for that queue (seen as a transmit queue that stayed full with the appliance idle).
/// Linux's `virtqueue_poll` orders the two with a full barrier; the second look here
/// does the same, at the cost of a fence only when the queue seems empty.
fn look_twice(mut peek: impl FnMut() -> Option<u16>) -> Option<u16> {
    peek().or_else(|| {
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        peek()
    })
}

/// The lent stream's memory as the crate takes it.
fn lent_slice(buf: &LentStream) -> &[u8] {
    // SAFETY: identity-mapped DMA memory owned by `buf`, which the caller keeps lent for
    // as long as the device uses it; the crate only takes the address and length.
    unsafe { core::slice::from_raw_parts(buf.device_addr() as *const u8, buf.len()) }
}

/// [`lent_slice`], for a buffer the device writes.
#[allow(clippy::mut_from_ref)]
fn lent_slice_mut(buf: &LentStream) -> &mut [u8] {
    // SAFETY: as for `lent_slice`; no other reference to the memory exists (the stream is
    // lent), and the crate only takes the address and length.
    unsafe { core::slice::from_raw_parts_mut(buf.device_addr() as *mut u8, buf.len()) }
}
