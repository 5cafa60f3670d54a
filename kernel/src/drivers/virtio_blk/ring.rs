//! [`BlkRing`]: virtio-blk requests on a virtqueue.
//!
//! A request is a 16-byte header (and for a discard, one 16-byte segment) that the device
//! reads, the request's data stream, which the device reads (write) or fills (read), and a
//! status byte the device writes. Headers, segments and status bytes live in the ring's
//! coherent memory, one set per slot (slots are the driver's request numbers); the data
//! stream is the request's own, and the virtqueue holds it from [`BlkRing::push`] until
//! [`BlkRing::pop`] gives it back with the completion. Completions may come in any order:
//! the ring maps the queue's tokens back to slots.

use alloc::vec::Vec;
use core::fmt;

use virtio_drivers::transport::pci::PciTransport;

use zerocopy::IntoBytes;

use super::wire::{DiscardSegment, RequestHeader, HEADER_LEN, SEGMENT_LEN};
use crate::hal::virtio::{Chain, Virtqueue};
use crate::mm::{DmaCoherent, DmaDevice, DmaStream};

/// Per-slot bytes of ring memory: header, then segment.
const PER_SLOT: usize = HEADER_LEN + SEGMENT_LEN;

/// The data part of a block request.
#[derive(Debug)]
pub enum BlkData {
    /// No data (flush).
    None,
    /// The device reads this stream (write).
    ToDevice(DmaStream),
    /// The device fills this stream (read).
    FromDevice(DmaStream),
    /// The device reads this discard segment.
    Segment(DiscardSegment),
}

/// A request the device has completed.
#[derive(Debug)]
pub struct Popped {
    /// Its slot.
    pub slot: u16,
    /// The status byte the device wrote.
    pub status: u8,
    /// Its data stream, back from the device.
    pub data: Option<DmaStream>,
}

/// A virtqueue of `N` descriptors carrying block requests. See the module documentation.
pub struct BlkRing<const N: usize> {
    queue: Virtqueue<N>,
    /// Per slot: header and segment; after all slots, one status byte per slot.
    mem: DmaCoherent,
    slots: usize,
    /// By token (descriptor head): the slot of the request the device holds there.
    by_token: Vec<Option<u16>>,
}

impl<const N: usize> fmt::Debug for BlkRing<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlkRing")
            .field("queue", &self.queue)
            .field("slots", &self.slots)
            .finish()
    }
}

impl<const N: usize> BlkRing<N> {
    /// Sets up virtqueue `index` of `transport` for `slots` requests, in DMA memory of
    /// `dma`.
    pub fn new(
        transport: &mut PciTransport,
        index: u16,
        slots: usize,
        dma: &DmaDevice,
    ) -> Result<BlkRing<N>, virtio_drivers::Error> {
        assert!(
            slots * 3 <= N,
            "{slots} requests do not fit {N} descriptors"
        );
        let mem = DmaCoherent::alloc(dma, slots * (PER_SLOT + 1))
            .map_err(|_| virtio_drivers::Error::DmaError)?;
        Ok(BlkRing {
            queue: Virtqueue::new(transport, index, dma)?,
            mem,
            slots,
            by_token: (0..N).map(|_| None).collect(),
        })
    }

    fn header_at(&self, slot: u16) -> usize {
        usize::from(slot) * PER_SLOT
    }

    fn status_at(&self, slot: u16) -> usize {
        self.slots * PER_SLOT + usize::from(slot)
    }

    /// Queues a request for `slot` (which must not be in the ring already). The device
    /// learns of it at the next notification. On failure the data stream comes back.
    pub fn push(
        &mut self,
        slot: u16,
        header: RequestHeader,
        data: BlkData,
    ) -> Result<(), (Option<DmaStream>, virtio_drivers::Error)> {
        assert!(usize::from(slot) < self.slots, "slot {slot} out of range");
        let (h, s) = (self.header_at(slot), self.status_at(slot));
        let segment = h + HEADER_LEN;
        self.mem.write_bytes(h, header.as_bytes());
        self.mem.write::<u8>(s, 0xff);
        let chain = match data {
            BlkData::None => Chain::new(None).readable(&self.mem, h..h + HEADER_LEN),
            BlkData::ToDevice(stream) => {
                let len = stream.len();
                Chain::new(Some(stream))
                    .readable(&self.mem, h..h + HEADER_LEN)
                    .readable_data(0..len)
            }
            BlkData::FromDevice(stream) => {
                let len = stream.len();
                Chain::new(Some(stream))
                    .readable(&self.mem, h..h + HEADER_LEN)
                    .writable_data(0..len)
            }
            BlkData::Segment(discard) => {
                self.mem.write_bytes(segment, discard.as_bytes());
                Chain::new(None)
                    .readable(&self.mem, h..h + HEADER_LEN)
                    .readable(&self.mem, segment..segment + SEGMENT_LEN)
            }
        };
        let token = self.queue.add(chain.writable(&self.mem, s..s + 1))?;
        let entry = &mut self.by_token[usize::from(token)];
        assert!(entry.is_none(), "descriptor {token} holds two requests");
        *entry = Some(slot);
        Ok(())
    }

    /// The next request the device has completed. An error (with the descriptor number)
    /// means the device returned a descriptor it was never given; the ring cannot be
    /// trusted any more and the device must be reset.
    pub fn pop(&mut self) -> Option<Result<Popped, u16>> {
        let used = match self.queue.pop_used()? {
            Ok(used) => used,
            Err(token) => return Some(Err(token)),
        };
        let slot = self.by_token[usize::from(used.token)]
            .take()
            .expect("every queued chain has a slot");
        Some(Ok(Popped {
            slot,
            status: self.mem.read::<u8>(self.status_at(slot)),
            data: used.data,
        }))
    }

    /// Whether the device wants to be notified of new requests.
    pub fn should_notify(&self) -> bool {
        self.queue.should_notify()
    }

    /// Stops (`false`) or restarts used-buffer interrupts from the device.
    pub fn set_interrupts(&mut self, on: bool) {
        self.queue.set_interrupts(on);
    }
}
