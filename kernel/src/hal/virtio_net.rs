//! Buffer ownership for a virtio-net device's queues: the one `unsafe` contract of
//! `virtio-drivers`' raw network API kept in one place.
//!
//! [`VirtIONetRaw`] hands buffers to the device with `receive_begin`/`transmit_begin`,
//! which are `unsafe` because the buffer must stay alive and untouched until the matching
//! `*_complete`. [`NetQueues`] owns every buffer the device holds (indexed by the
//! queue token the driver returned), so the rest of the kernel gets a safe interface:
//! take a received frame, give its buffer back, fill and send a transmit buffer, reap
//! finished transmissions. Nothing here waits: completions are noticed by polling,
//! typically after a queue interrupt.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::Transport;
use virtio_drivers::Error;

use super::virtio::VirtioHal;

/// Descriptors per queue (QEMU's default virtio-net queue size).
pub const QUEUE_SIZE: usize = 256;
/// Ethernet header length (no VLAN tag): a frame is this plus the IP packet.
pub const ETHERNET_HEADER: usize = 14;
/// Room for the virtio-net header (12 bytes) in front of each frame in a buffer.
const VIRTIO_HEADER_ROOM: usize = 16;

/// Size of each receive and transmit buffer for IP MTU `mtu`: the longest frame plus the
/// virtio-net header, rounded up to 64 bytes. Without mergeable or large receive buffers
/// negotiated, the device never delivers a frame longer than the buffer.
fn buffer_len(mtu: u16) -> usize {
    (usize::from(mtu) + ETHERNET_HEADER + VIRTIO_HEADER_ROOM).next_multiple_of(64)
}

/// A received Ethernet frame; give it back with [`NetQueues::recycle`].
pub struct RxFrame {
    buf: Box<[u8]>,
    start: usize,
    len: usize,
}

impl fmt::Debug for RxFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RxFrame({} bytes)", self.len)
    }
}

impl RxFrame {
    /// The frame, from the destination MAC address on.
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

/// A transmit buffer with the virtio-net header already written; fill it and pass it to
/// [`NetQueues::transmit`] (or drop it).
pub struct TxFrame {
    buf: Box<[u8]>,
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
        &mut self.buf[self.header..self.header + len]
    }
}

/// The receive and transmit queues of a virtio-net device with every buffer the device
/// holds. See the module documentation.
pub struct NetQueues<T: Transport> {
    raw: VirtIONetRaw<VirtioHal, T, QUEUE_SIZE>,
    /// Receive buffers the device holds, by token.
    rx: Vec<Option<Box<[u8]>>>,
    /// Transmit buffers the device holds, with the length handed over, by token.
    tx: Vec<Option<(Box<[u8]>, usize)>>,
    /// Transmit buffers ready for reuse.
    tx_free: Vec<Box<[u8]>>,
    tx_in_flight: usize,
    /// Longest frame (without FCS) sent or received.
    max_frame: usize,
    /// Size of every buffer.
    buffer_len: usize,
}

impl<T: Transport> fmt::Debug for NetQueues<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetQueues")
            .field("tx_in_flight", &self.tx_in_flight)
            .finish()
    }
}

impl<T: Transport> NetQueues<T> {
    /// Initialises the device behind `transport` for IP MTU `mtu` and gives it a full
    /// receive queue.
    pub fn new(transport: T, mtu: u16) -> Result<Self, Error> {
        let raw = VirtIONetRaw::new(transport)?;
        let mut q = NetQueues {
            raw,
            rx: (0..QUEUE_SIZE).map(|_| None).collect(),
            tx: (0..QUEUE_SIZE).map(|_| None).collect(),
            tx_free: Vec::new(),
            tx_in_flight: 0,
            max_frame: usize::from(mtu) + ETHERNET_HEADER,
            buffer_len: buffer_len(mtu),
        };
        for _ in 0..QUEUE_SIZE {
            let buf = q.buffer();
            q.post_rx(buf)?;
        }
        Ok(q)
    }

    /// The longest frame (from the destination MAC address on, without FCS) this NIC
    /// sends and receives.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn buffer(&self) -> Box<[u8]> {
        vec![0u8; self.buffer_len].into_boxed_slice()
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.raw.mac_address()
    }

    /// Acknowledges a (legacy or config) interrupt by reading the ISR register.
    pub fn ack_interrupt(&mut self) {
        self.raw.ack_interrupt();
    }

    /// Frames the device is still sending.
    pub fn tx_in_flight(&self) -> usize {
        self.tx_in_flight
    }

    fn post_rx(&mut self, mut buf: Box<[u8]>) -> Result<(), Error> {
        // SAFETY: the buffer's heap memory stays alive and untouched until
        // `receive_complete` for this token: it is stored in `self.rx[token]` (moving a
        // `Box` does not move its contents) and only taken out in `receive`, right before
        // `receive_complete`; `Drop` leaks what the device still holds.
        let token = unsafe { self.raw.receive_begin(&mut buf)? };
        let slot = &mut self.rx[usize::from(token)];
        assert!(slot.is_none(), "virtio-net: rx token {token} reused");
        *slot = Some(buf);
        Ok(())
    }

    /// The next received frame, if one has arrived. An `Err` is a device that broke the
    /// protocol (the buffer is reposted).
    pub fn receive(&mut self) -> Option<Result<RxFrame, Error>> {
        let token = self.raw.poll_receive()?;
        let Some(mut buf) = self.rx.get_mut(usize::from(token)).and_then(Option::take) else {
            return Some(Err(Error::WrongToken));
        };
        // SAFETY: `buf` is the buffer posted with this token (see `post_rx`).
        match unsafe { self.raw.receive_complete(token, &mut buf) } {
            Ok((start, len)) if start + len <= buf.len() => Some(Ok(RxFrame { buf, start, len })),
            Ok(_) => Some(self.post_rx(buf).and(Err(Error::IoError))),
            Err(e) => Some(self.post_rx(buf).and(Err(e))),
        }
    }

    /// Gives a received frame's buffer back to the device.
    pub fn recycle(&mut self, frame: RxFrame) -> Result<(), Error> {
        self.post_rx(frame.buf)
    }

    /// Returns buffers of finished transmissions to the free list; returns how many.
    pub fn reap_tx(&mut self) -> usize {
        let mut n = 0;
        while let Some(token) = self.raw.poll_transmit() {
            let Some((buf, len)) = self.tx.get_mut(usize::from(token)).and_then(Option::take)
            else {
                log::error!("virtio-net: tx completion for unknown token {token}");
                break;
            };
            // SAFETY: `buf[..len]` is exactly the slice given to `transmit_begin` for this
            // token (see `transmit`).
            if let Err(e) = unsafe { self.raw.transmit_complete(token, &buf[..len]) } {
                log::error!("virtio-net: tx completion {token}: {e:?}");
            }
            self.tx_in_flight -= 1;
            self.tx_free.push(buf);
            n += 1;
        }
        n
    }

    /// A transmit buffer, if the queue has room for another frame.
    pub fn tx_buffer(&mut self) -> Option<TxFrame> {
        self.reap_tx();
        if !self.raw.can_send() {
            return None;
        }
        let mut buf = self.tx_free.pop().unwrap_or_else(|| self.buffer());
        let header = self
            .raw
            .fill_buffer_header(&mut buf)
            .expect("a buffer holds the header");
        Some(TxFrame { buf, header })
    }

    /// Sends the first `len` bytes of `frame`'s frame.
    pub fn transmit(&mut self, frame: TxFrame, len: usize) -> Result<(), Error> {
        assert!(len <= self.max_frame, "frame of {len} bytes");
        let total = frame.header + len;
        let buf = frame.buf;
        // SAFETY: as for receive buffers: `buf` is kept in `self.tx[token]` until
        // `reap_tx` hands exactly `buf[..total]` to `transmit_complete`.
        let token = match unsafe { self.raw.transmit_begin(&buf[..total]) } {
            Ok(t) => t,
            Err(e) => {
                self.tx_free.push(buf);
                return Err(e);
            }
        };
        let slot = &mut self.tx[usize::from(token)];
        assert!(slot.is_none(), "virtio-net: tx token {token} reused");
        *slot = Some((buf, total));
        self.tx_in_flight += 1;
        Ok(())
    }
}

impl<T: Transport> Drop for NetQueues<T> {
    fn drop(&mut self) {
        // The PCI transport cannot take queues back from the device (virtio has no
        // per-queue reset there), so the buffers it holds must never be freed.
        core::mem::forget(core::mem::take(&mut self.rx));
        core::mem::forget(core::mem::take(&mut self.tx));
    }
}
