//! The virtio-net NIC (PCI 1af4:1041, or 1af4:1000 transitional) as a smoltcp [`phy::Device`].
//!
//! Receive and transmit completions raise one MSI-X vector that signals an
//! [`IrqEvent`]; the stack's poll task waits on it. If MSI-X cannot be set up, the NIC
//! still works and the poll task polls it on a short timer instead
//! ([`Nic::interrupts`] says which).
//!
//! smoltcp builds each frame straight in a transmit buffer and reads each received one
//! in its receive buffer (its tokens hand out borrowed slices); the buffers themselves
//! are DMA streams managed by [`NetQueues`] (`drivers::virtio_net`), which the `hal`
//! keeps with the device while it holds them.
//!
//! The checksum and segmentation offloads the device offers (`offload=on`, the
//! default) are negotiated at bring-up: smoltcp is told which checksums to leave out
//! ([`Offloads::checksum_caps`]) and every frame goes through `net::offload` on its way
//! out ([`prepare_tx`]: the virtio-net header that asks the device to complete its
//! checksum) and in ([`check_rx`]: the checksums the device did not vouch for). With
//! TSO, the segments smoltcp emits for one connection in a sending pass are joined into
//! one frame the device segments ([`Gso`]): the first full segment is built in one of
//! the large transmit buffers and held; smoltcp builds each next segment in the same
//! buffer over the last bytes of the payload before it (kept aside and put back), so a
//! segment that continues the frame lands where its payload belongs and costs no copy;
//! one that does not is moved to a buffer of its own and sent after the held frame. The
//! held frame goes to the device when it ends or has no room, before any other frame,
//! and at the end of every sending pass ([`Nic::flush`], which the stack calls).

use alloc::sync::Arc;
use core::cell::RefCell;
use core::fmt;

use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use super::offload::{check_rx, prepare_tx, Gso, Offloads, RxCheck, TxOffload, GSO_MAX_HEADERS};
use super::stats::NicStats;
use super::syn_gate::SynGate;
use crate::drivers::virtio_net::{self, NetQueues, RxFrame, TxFrame};
use crate::exec::IrqEvent;
use crate::hal::virtio;
use crate::irq::{self, IrqHandle};
use crate::mm::DmaDevice;
use crate::pci::device::{self, MsixTable, PciDevice};

/// PCI ids of a virtio-net function: modern, or transitional (what QEMU and libvirt give
/// by default on a conventional PCI bus; it has the modern interface too, which is the one
/// the driver uses).
const VIRTIO_VENDOR: u16 = 0x1af4;
const VIRTIO_NET_MODERN: u16 = 0x1041;
const VIRTIO_NET_TRANSITIONAL: u16 = 0x1000;

/// virtio-net queue numbers.
const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;

/// How the NIC tells the stack that something happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupts {
    /// One MSI-X vector for both queues.
    MsiX {
        /// The CPU vector.
        vector: u8,
    },
    /// None: the stack polls.
    Polling,
}

/// Why the NIC could not be brought up.
#[derive(Debug)]
pub enum NicError {
    /// The virtio PCI transport could not be set up.
    Transport(virtio_drivers::transport::pci::VirtioPciError),
    /// The device refused initialisation or its queues.
    Device(virtio_drivers::Error),
    /// Another driver instance still holds the device's DMA.
    InUse,
}

impl fmt::Display for NicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicError::Transport(e) => write!(f, "virtio PCI transport: {e}"),
            NicError::Device(e) => write!(f, "virtio-net device: {e:?}"),
            NicError::InUse => f.write_str("virtio-net device already in use"),
        }
    }
}

/// The virtio-net device, its queues and its interrupt.
pub struct Nic {
    queues: RefCell<NetQueues>,
    /// The offloads in effect (the queues', copied).
    offloads: Offloads,
    event: Arc<IrqEvent>,
    interrupts: Interrupts,
    pci: PciDevice,
    /// Shared with the stack's reports.
    stats: Arc<NicStats>,
    /// Connection requests no listening socket could take are held back here.
    syn_gate: Arc<SynGate>,
    /// A received frame [`Nic::peek`] looked at, which `receive` hands out first.
    peeked: Option<Received>,
    /// The frame for the device to segment being built (TSO), until [`Nic::flush`].
    held: RefCell<Option<Held>>,
    /// Kept for as long as the NIC lives: they own the vector and the table mapping.
    _irq: Option<(IrqHandle, MsixTable)>,
}

impl fmt::Debug for Nic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nic")
            .field("pci", &self.pci)
            .field("interrupts", &self.interrupts)
            .finish()
    }
}

impl Nic {
    /// The first virtio-net function (a modern one before a transitional one), if any.
    pub fn find() -> Option<PciDevice> {
        device::find(VIRTIO_VENDOR, VIRTIO_NET_MODERN)
            .next()
            .or_else(|| device::find(VIRTIO_VENDOR, VIRTIO_NET_TRANSITIONAL).next())
    }

    /// Brings up `dev` for IP MTU `mtu`: queues, receive buffers, MSI-X (or polling);
    /// with `offload`, the checksum and segmentation offloads the device offers.
    pub fn new(dev: PciDevice, mtu: u16, offload: bool) -> Result<Nic, NicError> {
        // The transport maps the BARs; the queues start bus mastering.
        let dma = DmaDevice::new(dev).map_err(|_| NicError::InUse)?;
        let transport = virtio::pci_transport(&dev).map_err(NicError::Transport)?;
        let doorbells = virtio::Doorbells::find(&dev);
        if doorbells.is_none() {
            log::warn!(
                "net: {}: no queue doorbells found; notifying through the crate",
                dev.address()
            );
        }
        let queues =
            NetQueues::new(transport, &dma, mtu, doorbells, offload).map_err(NicError::Device)?;
        let offloads = queues.offloads();
        let event = Arc::new(IrqEvent::new());
        let (irq, interrupts) = match route_msix(&dev, &event) {
            Ok((handle, table)) => {
                let vector = handle.vector();
                (Some((handle, table)), Interrupts::MsiX { vector })
            }
            Err(why) => {
                log::warn!("net: {}: no MSI-X ({why}); polling the NIC", dev.address());
                (None, Interrupts::Polling)
            }
        };
        Ok(Nic {
            queues: RefCell::new(queues),
            offloads,
            event,
            interrupts,
            pci: dev,
            stats: Arc::default(),
            syn_gate: Arc::default(),
            peeked: None,
            held: RefCell::new(None),
            _irq: irq,
        })
    }

    /// The gate that holds back connection requests no listening socket could take
    /// ([`SynGate`]); the listener arms it.
    pub fn syn_gate(&self) -> Arc<SynGate> {
        self.syn_gate.clone()
    }

    /// The offloads in effect.
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// The MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.queues.borrow().mac()
    }

    /// The PCI function.
    pub fn pci(&self) -> PciDevice {
        self.pci
    }

    /// How completions are signalled.
    pub fn interrupts(&self) -> Interrupts {
        self.interrupts
    }

    /// The event the NIC's interrupt signals.
    pub fn event(&self) -> Arc<IrqEvent> {
        self.event.clone()
    }

    /// Frame and error counters.
    pub fn stats(&self) -> Arc<NicStats> {
        self.stats.clone()
    }

    /// The next received frame, without taking it: smoltcp's next `receive` gets it. The
    /// stack routes the frame to its socket's set with this (`super::sockets`).
    pub fn peek(&mut self) -> Option<&[u8]> {
        if self.peeked.is_none() {
            self.peeked = self.next_frame();
        }
        self.peeked.as_ref().map(Received::data)
    }

    /// The next frame for the stack: a connection request the SYN gate kept, if a
    /// socket listens for it now, before the device's; of the device's, those the gate
    /// lets through (it copies those it holds back, and their buffers go back to the
    /// device at once). Frames are counted as the device delivers them.
    fn next_frame(&mut self) -> Option<Received> {
        if let Some(kept) = self.syn_gate.replay() {
            return Some(Received::Kept(kept));
        }
        loop {
            let mut frame = match self.queues.get_mut().receive()? {
                Ok(frame) => frame,
                Err(e) => {
                    self.stats.rx_errors.inc();
                    log::warn!("net: receive: {e:?}");
                    continue;
                }
            };
            let len = frame.data().len() as u64;
            self.stats.rx_frames.inc();
            self.stats.rx_bytes.add(len);
            self.stats.rx_longest.raise_to(len);
            let header = frame.header();
            match check_rx(frame.data_mut(), &header, self.offloads) {
                RxCheck::Smoltcp => {}
                RxCheck::Validated => self.stats.rx_csum_validated.inc(),
                RxCheck::Verified => self.stats.rx_csum_verified.inc(),
                RxCheck::Completed => self.stats.rx_csum_completed.inc(),
                RxCheck::Bad => {
                    self.stats.rx_csum_errors.inc();
                    self.recycle(frame);
                    continue;
                }
            }
            if self.syn_gate.admits(frame.data()) {
                return Some(Received::Device(frame));
            }
            self.recycle(frame);
        }
    }

    /// Sends the frame being built for the device to segment, if there is one: at the end
    /// of every sending pass (it would wait for the next one otherwise).
    pub fn flush(&self) {
        let held = self.held.borrow_mut().take();
        if let Some(held) = held {
            self.send_held(held);
        }
    }

    /// Sends a frame built for the device to segment (one segment: as a frame of its own).
    fn send_held(&self, mut held: Held) {
        let len = held.gso.len();
        let (header, done) = held.gso.finish(held.frame.frame_mut(len));
        held.frame.set_header(&header);
        self.send(held.frame, len, done);
    }

    /// Sends the `len`-byte frame in `frame`, its checksum completed by the device when
    /// it can ([`prepare_tx`]); a frame unfit for that is dropped, never sent wrong.
    fn send_single(&self, mut frame: TxFrame, len: usize) {
        match prepare_tx(frame.frame_mut(len), self.offloads) {
            Ok((header, done)) => {
                frame.set_header(&header);
                self.send(frame, len, done);
            }
            Err(why) => {
                self.stats.tx_dropped.inc();
                log::warn!("net: transmit: {why:?} frame of {len} bytes dropped");
                self.queues.borrow_mut().discard(frame);
            }
        }
    }

    /// Hands a frame, its header written, to the device, and counts it.
    fn send(&self, frame: TxFrame, len: usize, done: TxOffload) {
        let stats = &self.stats;
        if let Err(e) = self.queues.borrow_mut().transmit(frame, len) {
            stats.tx_dropped.inc();
            log::warn!("net: transmit: {e:?}");
            return;
        }
        stats.tx_frames.inc();
        stats.tx_bytes.add(len as u64);
        match done {
            TxOffload::None => {}
            TxOffload::Checksum => stats.tx_csum_offloaded.inc(),
            TxOffload::Segments(n) => {
                stats.tx_csum_offloaded.inc();
                stats.tx_gso_frames.inc();
                stats.tx_gso_segments.add(u64::from(n));
            }
        }
    }

    /// Gives a receive buffer back to the device.
    fn recycle(&self, frame: RxFrame) {
        if let Err(e) = self.queues.borrow_mut().recycle(frame) {
            self.stats.rx_errors.inc();
            log::error!("net: reposting a receive buffer: {e:?}");
        }
    }
}

/// A frame for the device to segment, being built in a large transmit buffer.
#[derive(Debug)]
struct Held {
    frame: TxFrame,
    gso: Gso,
}

/// Where smoltcp builds the frame a transmit token is used for.
enum Build {
    /// At the end of the held frame, which it may continue.
    Continue(Held),
    /// In a large buffer: it may start a frame to segment.
    Start(TxFrame),
    /// In a buffer of its own.
    Alone(TxFrame),
    /// In no buffer: it cannot be sent.
    Nowhere,
}

/// A frame for the stack.
#[derive(Debug)]
enum Received {
    /// In a receive buffer of the device, which gets it back once the stack has read it.
    Device(RxFrame),
    /// A connection request the SYN gate held back and kept, now let in.
    Kept(alloc::vec::Vec<u8>),
}

impl Received {
    fn data(&self) -> &[u8] {
        match self {
            Received::Device(frame) => frame.data(),
            Received::Kept(frame) => frame,
        }
    }
}

/// Points both queues at one MSI-X vector whose handler signals `event`.
fn route_msix(
    dev: &PciDevice,
    event: &Arc<IrqEvent>,
) -> Result<(IrqHandle, MsixTable), &'static str> {
    let table = dev.msix().map_err(|_| "no MSI-X capability")?;
    let e = event.clone();
    let handle = irq::allocate(move || e.signal()).map_err(|_| "no free vector")?;
    table.set(0, &handle);
    table.enable();
    for queue in [RX_QUEUE, TX_QUEUE] {
        if let Err(why) = virtio::route_queue_msix(dev, queue, 0) {
            table.disable();
            return Err(match why {
                virtio::MsixRouteError::NoCommonConfig => {
                    "no virtio common configuration capability"
                }
                virtio::MsixRouteError::Bar(_) => "cannot map the common configuration",
                virtio::MsixRouteError::Refused => "the device refused the MSI-X vector",
            });
        }
    }
    Ok((handle, table))
}

/// smoltcp's receive token: a received frame, returned to the device after use.
#[derive(Debug)]
pub struct RxToken<'a> {
    nic: &'a Nic,
    frame: Received,
}

/// smoltcp's transmit token.
#[derive(Debug)]
pub struct TxToken<'a> {
    nic: &'a Nic,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(self.frame.data());
        // smoltcp may have transmitted with the paired token inside `f`: borrow only now.
        if let Received::Device(frame) = self.frame {
            self.nic.recycle(frame);
        }
        r
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let nic = self.nic;
        let held = nic.held.borrow_mut().take();
        let build = match held {
            Some(held) if held.gso.has_room(len) => Build::Continue(held),
            held => {
                // Whatever this frame is, it goes out after the held one.
                if let Some(held) = held {
                    nic.send_held(held);
                }
                let mut queues = nic.queues.borrow_mut();
                let large = (len >= Gso::MIN_START)
                    .then(|| queues.gso_buffer())
                    .flatten();
                match large {
                    Some(frame) => Build::Start(frame),
                    None => queues.tx_buffer(len).map_or(Build::Nowhere, Build::Alone),
                }
            }
        };
        match build {
            Build::Continue(mut held) => {
                // Built over the end of the frame: its payload follows the frame's. The
                // bytes its headers cover are kept and put back.
                let (at, hdr) = (held.gso.next_at(), held.gso.hdr_len());
                let mut kept = [0u8; GSO_MAX_HEADERS];
                let buf = &mut held.frame.frame_mut(at + len)[at..];
                kept[..hdr].copy_from_slice(&buf[..hdr]);
                let r = f(buf);
                if held.gso.accepts(buf) {
                    buf[..hdr].copy_from_slice(&kept[..hdr]);
                    match held.gso.is_ended() {
                        true => nic.send_held(held),
                        false => *nic.held.borrow_mut() = Some(held),
                    }
                    return r;
                }
                // It does not continue the frame: moved to a buffer of its own, sent after.
                let own = nic.queues.borrow_mut().tx_buffer(len);
                let own = own.map(|mut own| {
                    own.frame_mut(len).copy_from_slice(buf);
                    own
                });
                buf[..hdr].copy_from_slice(&kept[..hdr]);
                nic.send_held(held);
                match own {
                    Some(own) => nic.send_single(own, len),
                    None => nic.stats.tx_dropped.inc(),
                }
                r
            }
            Build::Start(mut frame) => {
                let r = f(frame.frame_mut(len));
                match Gso::start(frame.frame_mut(len)) {
                    Some(gso) => *nic.held.borrow_mut() = Some(Held { frame, gso }),
                    None => nic.send_single(frame, len),
                }
                r
            }
            Build::Alone(mut frame) => {
                let r = f(frame.frame_mut(len));
                nic.send_single(frame, len);
                r
            }
            Build::Nowhere => {
                // `transmit` checked for room, so only an oversized frame gets here;
                // smoltcp needs a buffer to build it in regardless.
                nic.stats.tx_dropped.inc();
                let mut scratch = alloc::vec![0u8; len];
                f(&mut scratch)
            }
        }
    }
}

impl phy::Device for Nic {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        let frame = match self.peeked.take() {
            Some(frame) => frame,
            None => self.next_frame()?,
        };
        Some((RxToken { nic: self, frame }, TxToken { nic: self }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        let q = self.queues.get_mut();
        q.reap_tx();
        // Room for one frame after the held one (sent first if this one does not
        // continue it): the buffers' own checks apply again when the token is used.
        let held = usize::from(self.held.get_mut().is_some());
        if q.tx_in_flight() + held + 2 > virtio_net::QUEUE_SIZE {
            self.stats.tx_queue_full.inc();
            return None;
        }
        Some(TxToken { nic: self })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.queues.borrow().max_frame();
        caps.checksum = self.offloads.checksum_caps();
        caps
    }
}
