//! [`NetQueues`]: a virtio-net device's receive and transmit buffers.
//!
//! Every buffer is a DMA stream sized for the MTU. The device holds all receive buffers
//! until a frame arrives in one; the frame is handed out as an [`RxFrame`] and its buffer
//! goes back to the device when the frame is recycled. Transmit buffers come from a free
//! list (the device returns them when a frame has been sent), are filled as a [`TxFrame`]
//! and handed to the device. Who holds a buffer while the device does is
//! `hal::virtio::NetDevice`'s business; nothing here waits: completions are noticed by
//! polling, typically after a queue interrupt.

use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use virtio_drivers::transport::pci::PciTransport;
use virtio_drivers::Error;

use crate::hal::virtio::{Doorbells, NetDevice, RxError, NET_QUEUE_SIZE};
use crate::mm::{DmaDevice, DmaStream};

/// Ethernet header length (no VLAN tag): a frame is this plus the IP packet.
pub const ETHERNET_HEADER: usize = 14;
/// Room for the virtio-net header (12 bytes) in front of each frame in a buffer.
const VIRTIO_HEADER_ROOM: usize = 16;
/// Descriptors per queue.
pub const QUEUE_SIZE: usize = NET_QUEUE_SIZE;

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
}

/// A transmit buffer with the virtio-net header already written; fill it and pass it to
/// [`NetQueues::transmit`] (or drop it).
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
    /// The first `len` bytes of the frame, to fill (`len` ≤ [`NetQueues::max_frame`]).
    pub fn frame_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[self.header..self.header + len]
    }
}

/// The receive and transmit buffers of a virtio-net device. See the module documentation.
pub struct NetQueues {
    device: NetDevice,
    dma: DmaDevice,
    /// Transmit buffers ready for reuse.
    tx_free: Vec<DmaStream>,
    tx_in_flight: usize,
    /// Longest frame (without FCS) sent or received.
    max_frame: usize,
    /// Size of every buffer.
    buffer_len: usize,
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
    /// (`hal::virtio::Doorbells`: each read when its queue is set up).
    pub fn new(
        transport: PciTransport,
        dma: &DmaDevice,
        mtu: u16,
        doorbells: Option<Doorbells>,
    ) -> Result<Self, Error> {
        let device = NetDevice::new(transport, dma, doorbells)?;
        dma.start();
        let mut q = NetQueues {
            device,
            dma: dma.clone(),
            tx_free: Vec::new(),
            tx_in_flight: 0,
            max_frame: usize::from(mtu) + ETHERNET_HEADER,
            buffer_len: buffer_len(mtu),
        };
        for _ in 0..QUEUE_SIZE {
            let buf = q.buffer()?;
            q.device.post_rx(buf)?;
        }
        Ok(q)
    }

    /// The longest frame (from the destination MAC address on, without FCS) this NIC
    /// sends and receives.
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
                    self.tx_free.push(buf);
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

    /// A transmit buffer, if the queue has room for another frame (and there is memory
    /// for it).
    pub fn tx_buffer(&mut self) -> Option<TxFrame> {
        self.reap_tx();
        if !self.device.can_send() {
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

    /// Sends the first `len` bytes of `frame`'s frame.
    pub fn transmit(&mut self, frame: TxFrame, len: usize) -> Result<(), Error> {
        assert!(len <= self.max_frame, "frame of {len} bytes");
        match self.device.transmit(frame.buf, frame.header + len) {
            Ok(()) => {
                self.tx_in_flight += 1;
                Ok(())
            }
            Err((buf, e)) => {
                self.tx_free.push(buf);
                Err(e)
            }
        }
    }
}
