//! The virtio-net NIC (PCI 1af4:1041, or 1af4:1000 transitional) as a smoltcp [`phy::Device`].
//!
//! Receive and transmit completions raise one MSI-X vector that signals an
//! [`IrqEvent`]; the stack's poll task waits on it. If MSI-X cannot be set up, the NIC
//! still works and the poll task polls it on a short timer instead
//! ([`Nic::interrupts`] says which).
//!
//! Frames are copied once each way between the device's buffers and smoltcp (smoltcp's
//! tokens hand out borrowed slices); the buffers themselves are DMA streams managed by
//! [`NetQueues`] (`drivers::virtio_net`), which the `hal` keeps with the device while it
//! holds them.

use alloc::sync::Arc;
use core::cell::RefCell;
use core::fmt;

use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use super::stats::NicStats;
use super::syn_gate::SynGate;
use crate::drivers::virtio_net::{self, NetQueues, RxFrame};
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
    event: Arc<IrqEvent>,
    interrupts: Interrupts,
    pci: PciDevice,
    /// Shared with the stack's reports.
    stats: Arc<NicStats>,
    /// Connection requests no listening socket could take are held back here.
    syn_gate: Arc<SynGate>,
    /// A received frame [`Nic::peek`] looked at, which `receive` hands out first.
    peeked: Option<Received>,
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

    /// Brings up `dev` for IP MTU `mtu`: queues, receive buffers, MSI-X (or polling).
    pub fn new(dev: PciDevice, mtu: u16) -> Result<Nic, NicError> {
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
        let queues = NetQueues::new(transport, &dma, mtu, doorbells).map_err(NicError::Device)?;
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
            event,
            interrupts,
            pci: dev,
            stats: Arc::default(),
            syn_gate: Arc::default(),
            peeked: None,
            _irq: irq,
        })
    }

    /// The gate that holds back connection requests no listening socket could take
    /// ([`SynGate`]); the listener arms it.
    pub fn syn_gate(&self) -> Arc<SynGate> {
        self.syn_gate.clone()
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
            let frame = match self.queues.get_mut().receive()? {
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
            if self.syn_gate.admits(frame.data()) {
                return Some(Received::Device(frame));
            }
            self.recycle(frame);
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
        let mut queues = self.nic.queues.borrow_mut();
        let fits = len <= queues.max_frame();
        let buffer = queues.tx_buffer();
        drop(queues);
        let Some(mut frame) = buffer.filter(|_| fits) else {
            // `transmit` checked for room, so only an oversized frame gets here; smoltcp
            // needs a buffer to build it in regardless.
            self.nic.stats.tx_dropped.inc();
            let mut scratch = alloc::vec![0u8; len];
            return f(&mut scratch);
        };
        let r = f(frame.frame_mut(len));
        match self.nic.queues.borrow_mut().transmit(frame, len) {
            Ok(()) => {
                self.nic.stats.tx_frames.inc();
                self.nic.stats.tx_bytes.add(len as u64);
            }
            Err(e) => {
                self.nic.stats.tx_dropped.inc();
                log::warn!("net: transmit: {e:?}");
            }
        }
        r
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
        // Room for one frame: `tx_buffer` checks again when the token is used.
        if q.tx_in_flight() + 2 > virtio_net::QUEUE_SIZE {
            self.stats.tx_queue_full.inc();
            return None;
        }
        Some(TxToken { nic: self })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.queues.borrow().max_frame();
        caps
    }
}
