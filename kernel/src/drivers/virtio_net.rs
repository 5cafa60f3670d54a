//! [`NetQueues`]: a virtio-net device's receive and transmit buffers.
//!
//! Every buffer is a DMA stream sized for the MTU, but for [`GSO_BUFFERS`] transmit
//! buffers of 64 KiB set aside when the device segments for us (TSO: `net::offload`).
//! The device holds all receive buffers until a frame arrives in one; the frame is
//! handed out as an [`RxFrame`] (with the virtio-net header the device wrote) and its
//! buffer goes back to the device when the frame is recycled. Transmit buffers come from
//! a free list (the device returns them when a frame has been sent; the large ones to a
//! list of their own, so at most [`GSO_BUFFERS`] exist), are filled as a [`TxFrame`]
//! (with a header saying what the device is to do) and handed to the device. Who holds
//! a buffer while the device does is `hal::virtio::NetDevice`'s business; nothing here
//! waits: completions are noticed by polling, typically after a queue interrupt.

use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use virtio_drivers::transport::pci::PciTransport;
use virtio_drivers::Error;

use crate::hal::virtio::{Doorbells, NetDevice, RxError, NET_QUEUE_SIZE};
use crate::mm::{DmaDevice, DmaStream};
use crate::net::offload::{NetHeader, Offloads, GSO_MAX_FRAME};

/// Ethernet header length (no VLAN tag): a frame is this plus the IP packet.
pub const ETHERNET_HEADER: usize = 14;
/// Room for the virtio-net header (12 bytes) in front of each frame in a buffer.
const VIRTIO_HEADER_ROOM: usize = 16;
/// Descriptors per queue.
pub const QUEUE_SIZE: usize = NET_QUEUE_SIZE;
/// Transmit buffers for frames the device segments (TSO), allocated when TSO is
/// negotiated: 16 of 64 KiB, 1 MiB in all, a whole 1 MiB read reply in flight. While
/// every one is with the device, segments go out one by one in ordinary buffers.
pub const GSO_BUFFERS: usize = 16;
/// Size of each of them: the longest frame smoltcp may build for segmentation and the
/// virtio-net header's room.
const GSO_BUFFER_LEN: usize = GSO_MAX_FRAME + VIRTIO_HEADER_ROOM;

/// Size of each receive and transmit buffer for IP MTU `mtu`: the longest frame plus the
/// virtio-net header, rounded up to 64 bytes. Without mergeable or large receive buffers
/// negotiated, the device never delivers a frame longer than the buffer.
fn buffer_len(mtu: u16) -> usize {
    (usize::from(mtu) + ETHERNET_HEADER + VIRTIO_HEADER_ROOM).next_multiple_of(64)
}

/// A received Ethernet frame; give it back with [`NetQueues::recycle`].
pub struct RxFrame {
    buf: DmaStream,
    frame: Range<usize>,
}

impl fmt::Debug for RxFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RxFrame({} bytes)", self.frame.len())
    }
}

impl RxFrame {
    /// The frame, from the destination MAC address on.
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[self.frame.clone()]
    }

    /// The frame, to complete a checksum in it (`net::offload::check_rx`).
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[self.frame.clone()]
    }

    /// The virtio-net header the device wrote in front of the frame.
    pub fn header(&self) -> NetHeader {
        NetHeader::read(&self.buf.as_slice()[..self.frame.start])
    }
}

/// A transmit buffer with the virtio-net header already written; fill it and pass it to
/// [`NetQueues::transmit`] (or [`NetQueues::discard`], which keeps the buffer).
pub struct TxFrame {
    buf: DmaStream,
    header: usize,
}

impl fmt::Debug for TxFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TxFrame(header {})", self.header)
    }
}

impl TxFrame {
    /// The first `len` bytes of the frame, to fill (`len` at most what the buffer was
    /// asked for: [`NetQueues::tx_buffer`]).
    pub fn frame_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[self.header..self.header + len]
    }

    /// Sets the virtio-net header's fields (checksum and segmentation offload); it says
    /// nothing unless set.
    pub fn set_header(&mut self, header: &NetHeader) {
        header.write(self.buf.as_mut_slice());
    }
}

/// The receive and transmit buffers of a virtio-net device. See the module documentation.
pub struct NetQueues {
    device: NetDevice,
    dma: DmaDevice,
    /// Transmit buffers ready for reuse.
    tx_free: Vec<DmaStream>,
    /// The large transmit buffers ready for reuse (only with TSO).
    gso_free: Vec<DmaStream>,
    tx_in_flight: usize,
    /// Longest frame (without FCS) sent or received, but for frames the device segments.
    max_frame: usize,
    /// Size of every buffer but the large transmit ones.
    buffer_len: usize,
    /// The offloads negotiated (TSO only if its buffers could be allocated).
    offloads: Offloads,
}

impl fmt::Debug for NetQueues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetQueues")
            .field("tx_in_flight", &self.tx_in_flight)
            .finish()
    }
}

impl NetQueues {
    /// Initialises the device behind `transport`, whose bus mastering `dma` holds, for IP
    /// MTU `mtu`, and gives it a full receive queue. Starts its bus mastering. Queue
    /// notifications go through the doorbells `doorbells` locates, if given
    /// (`hal::virtio::Doorbells`: each read when its queue is set up). With `offload`
    /// (`offload=on`), the checksum and segmentation offloads the device offers are
    /// negotiated ([`NetQueues::offloads`]).
    pub fn new(
        transport: PciTransport,
        dma: &DmaDevice,
        mtu: u16,
        doorbells: Option<Doorbells>,
        offload: bool,
    ) -> Result<Self, Error> {
        let wanted = Offloads::wanted(offload);
        let device = NetDevice::new(transport, dma, doorbells, move |offered| {
            Offloads::negotiate(offered, wanted)
        })?;
        dma.start();
        let mut q = NetQueues {
            offloads: Offloads::from_features(device.features()),
            device,
            dma: dma.clone(),
            tx_free: Vec::new(),
            gso_free: Vec::new(),
            tx_in_flight: 0,
            max_frame: usize::from(mtu) + ETHERNET_HEADER,
            buffer_len: buffer_len(mtu),
        };
        for _ in 0..QUEUE_SIZE {
            let buf = q.buffer()?;
            q.device.post_rx(buf)?;
        }
        if q.offloads.tso4 {
            // Negotiated TSO need not be used: without its buffers, it is not.
            let bufs: Result<Vec<_>, _> = (0..GSO_BUFFERS)
                .map(|_| DmaStream::alloc(dma, GSO_BUFFER_LEN))
                .collect();
            match bufs {
                Ok(bufs) => q.gso_free = bufs,
                Err(_) => {
                    log::warn!(
                        "virtio-net: no memory for the TSO transmit buffers; not segmenting"
                    );
                    q.offloads.tso4 = false;
                }
            }
        }
        Ok(q)
    }

    /// The offloads in effect.
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// A large transmit buffer, for a frame the device segments (TSO: `net::offload::Gso`,
    /// up to [`GSO_MAX_FRAME`] bytes), if TSO is in effect, the queue has room and one is
    /// free.
    pub fn gso_buffer(&mut self) -> Option<TxFrame> {
        if !self.offloads.tso4 {
            return None;
        }
        self.reap_tx();
        if !self.device.can_send() {
            return None;
        }
        let mut buf = self.gso_free.pop()?;
        let header = self
            .device
            .fill_header(&mut buf)
            .expect("a buffer holds the header");
        Some(TxFrame { buf, header })
    }

    /// The longest frame (from the destination MAC address on, without FCS) this NIC
    /// sends and receives, but for frames the device segments.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn buffer(&self) -> Result<DmaStream, Error> {
        DmaStream::alloc(&self.dma, self.buffer_len).map_err(|_| Error::DmaError)
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.device.mac()
    }

    /// Acknowledges a (legacy or config) interrupt by reading the ISR register.
    pub fn ack_interrupt(&mut self) {
        self.device.ack_interrupt();
    }

    /// Frames the device is still sending.
    pub fn tx_in_flight(&self) -> usize {
        self.tx_in_flight
    }

    /// The next received frame, if one has arrived. An `Err` is a device that broke the
    /// protocol (the buffer, if it came back, is reposted).
    pub fn receive(&mut self) -> Option<Result<RxFrame, Error>> {
        Some(match self.device.receive()? {
            Ok((buf, frame)) => Ok(RxFrame { buf, frame }),
            Err(RxError::UnknownToken(_)) => Err(Error::WrongToken),
            Err(RxError::Device(buf, e)) => self.device.post_rx(buf).and(Err(e)),
        })
    }

    /// Gives a received frame's buffer back to the device.
    pub fn recycle(&mut self, frame: RxFrame) -> Result<(), Error> {
        self.device.post_rx(frame.buf)
    }

    /// Returns buffers of finished transmissions to the free list; returns how many.
    pub fn reap_tx(&mut self) -> usize {
        let mut n = 0;
        while let Some(done) = self.device.transmitted() {
            match done {
                Ok(buf) => {
                    self.tx_in_flight -= 1;
                    self.give_back(buf);
                    n += 1;
                }
                Err(e) => {
                    log::error!("virtio-net: tx completion: {e:?}");
                    break;
                }
            }
        }
        n
    }

    /// A transmit buffer for a frame of `len` bytes (at most [`NetQueues::max_frame`]),
    /// if the queue has room for another frame (and there is memory for it).
    pub fn tx_buffer(&mut self, len: usize) -> Option<TxFrame> {
        self.reap_tx();
        if !self.device.can_send() || len > self.max_frame {
            return None;
        }
        let mut buf = match self.tx_free.pop() {
            Some(buf) => buf,
            None => self.buffer().ok()?,
        };
        let header = self
            .device
            .fill_header(&mut buf)
            .expect("a buffer holds the header");
        Some(TxFrame { buf, header })
    }

    /// Gives back a transmit buffer that will not be sent.
    pub fn discard(&mut self, frame: TxFrame) {
        self.give_back(frame.buf);
    }

    /// Puts a transmit buffer back on its free list.
    fn give_back(&mut self, buf: DmaStream) {
        match buf.len() {
            GSO_BUFFER_LEN => self.gso_free.push(buf),
            _ => self.tx_free.push(buf),
        }
    }

    /// Sends the first `len` bytes of `frame`'s frame.
    pub fn transmit(&mut self, frame: TxFrame, len: usize) -> Result<(), Error> {
        assert!(
            frame.header + len <= frame.buf.len(),
            "frame of {len} bytes"
        );
        match self.device.transmit(frame.buf, frame.header + len) {
            Ok(()) => {
                self.tx_in_flight += 1;
                Ok(())
            }
            Err((buf, e)) => {
                self.give_back(buf);
                Err(e)
            }
        }
    }
}
