//! [`Virtqueue`]: the crate's split virtqueue with ownership in place of its `unsafe`
//! contract.
//!
//! The crate's `VirtQueue::add` lends the device plain slices and is `unsafe`: the caller
//! must keep them valid and untouched until `pop_used` returns them. Here a request is a
//! [`Chain`]: byte ranges of coherent memory of the queue's device (never freed while the
//! device may reach it) and of at most one data [`DmaStream`], which the queue owns, lent,
//! from [`Virtqueue::add`] until [`Virtqueue::pop_used`] hands it back. Nothing else can
//! touch it meanwhile, and dropping the queue parks it (and the crate's ring memory) with
//! the [`DmaDevice`] until bus mastering is off.

use alloc::vec::Vec;
use core::fmt;
use core::marker::PhantomData;
use core::ops::Range;

use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::pci::PciTransport;
use virtio_drivers::Error;

use super::VirtioHal;
use crate::hal::dma::{DmaCoherent, DmaDevice, DmaStream, LentStream};

/// Descriptors in one chain, at most.
const MAX_PARTS: usize = 4;

/// What a descriptor points at.
#[derive(Clone, Copy, Debug)]
enum Memory {
    /// Coherent memory of the queue's device, at this address.
    Coherent(u64),
    /// The chain's data stream, from this offset.
    Stream(usize),
}

#[derive(Clone, Copy, Debug)]
struct Part {
    memory: Memory,
    len: usize,
    device_writes: bool,
}

/// The buffers of one request, in descriptor order: first the parts the device reads,
/// then the parts it writes. A part is a byte range of coherent memory of the queue's
/// device (headers, status bytes), or of the chain's data stream, which the chain owns.
pub struct Chain<'a> {
    stream: Option<DmaStream>,
    parts: [Option<Part>; MAX_PARTS],
    /// The device of the coherent parts, checked against the queue's.
    device: Option<&'a DmaDevice>,
    _coherent: PhantomData<&'a DmaCoherent>,
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field("stream", &self.stream)
            .field("parts", &self.parts.iter().flatten().collect::<Vec<_>>())
            .finish()
    }
}

impl<'a> Chain<'a> {
    /// An empty chain with `stream` (if any) as its data.
    pub fn new(stream: Option<DmaStream>) -> Chain<'a> {
        Chain {
            stream,
            parts: [None; MAX_PARTS],
            device: None,
            _coherent: PhantomData,
        }
    }

    /// The device reads `range` of `memory`.
    pub fn readable(self, memory: &'a DmaCoherent, range: Range<usize>) -> Chain<'a> {
        self.coherent(memory, range, false)
    }

    /// The device writes `range` of `memory`.
    pub fn writable(self, memory: &'a DmaCoherent, range: Range<usize>) -> Chain<'a> {
        self.coherent(memory, range, true)
    }

    /// The device reads `range` of the data stream.
    pub fn readable_data(self, range: Range<usize>) -> Chain<'a> {
        self.data(range, false)
    }

    /// The device writes `range` of the data stream.
    pub fn writable_data(self, range: Range<usize>) -> Chain<'a> {
        self.data(range, true)
    }

    /// Takes the data stream back (a chain that was not queued).
    pub fn into_data(self) -> Option<DmaStream> {
        self.stream
    }

    fn coherent(mut self, memory: &'a DmaCoherent, range: Range<usize>, writes: bool) -> Self {
        assert!(
            range.end <= memory.len(),
            "descriptor {range:?} outside {memory:?}"
        );
        assert!(
            self.device.is_none_or(|d| d.same(memory.device())),
            "a chain's coherent memory belongs to two devices"
        );
        self.device = Some(memory.device());
        let addr = memory.device_addr() + range.start as u64;
        self.push(Memory::Coherent(addr), range.len(), writes)
    }

    fn data(self, range: Range<usize>, writes: bool) -> Self {
        let len = self.stream.as_ref().map_or(0, DmaStream::len);
        assert!(
            range.end <= len,
            "descriptor {range:?} outside the data ({len} bytes)"
        );
        self.push(Memory::Stream(range.start), range.len(), writes)
    }

    fn push(mut self, memory: Memory, len: usize, device_writes: bool) -> Self {
        assert!(len > 0, "empty descriptor");
        let last = self.parts.iter().flatten().last();
        assert!(
            device_writes || last.is_none_or(|p| !p.device_writes),
            "a device-readable part after a device-writable one"
        );
        let free = self.parts.iter_mut().find(|p| p.is_none());
        *free.expect("too many descriptors in a chain") = Some(Part {
            memory,
            len,
            device_writes,
        });
        self
    }
}

/// A chain the device holds.
struct InFlight {
    stream: Option<LentStream>,
    parts: [Option<Part>; MAX_PARTS],
}

/// A request the device has finished with.
#[derive(Debug)]
pub struct Used {
    /// The token [`Virtqueue::add`] returned for it.
    pub token: u16,
    /// Its data stream, back in the CPU's hands.
    pub data: Option<DmaStream>,
    /// Bytes the device says it wrote.
    pub written: u32,
}

/// A virtqueue of `N` descriptors whose requests are [`Chain`]s (see the module
/// documentation).
pub struct Virtqueue<const N: usize> {
    /// `None` only while being dropped.
    queue: Option<VirtQueue<VirtioHal, N>>,
    device: DmaDevice,
    /// By descriptor head (the token): the chain the device holds there.
    in_flight: Vec<Option<InFlight>>,
}

// SAFETY: the crate's queue holds raw pointers into its own DMA memory (descriptor table
// and rings, identity-mapped frames no CPU owns) and plain indexes; nothing in it is tied
// to a CPU. Moving it to another CPU moves the only handle on that memory: every access
// still goes through `&mut self` (a driver used from several CPUs keeps it under a lock).
unsafe impl<const N: usize> Send for Virtqueue<N> {}

impl<const N: usize> fmt::Debug for Virtqueue<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Virtqueue")
            .field("size", &N)
            .field("in_flight", &self.in_flight.iter().flatten().count())
            .finish()
    }
}

impl<const N: usize> Virtqueue<N> {
    /// Sets up queue `index` of `transport`, whose bus mastering `device` holds (neither
    /// indirect descriptors nor event indexes).
    pub fn new(
        transport: &mut PciTransport,
        index: u16,
        device: &DmaDevice,
    ) -> Result<Virtqueue<N>, Error> {
        Ok(Virtqueue {
            queue: Some(VirtQueue::new(transport, index, false, false)?),
            device: device.clone(),
            in_flight: (0..N).map(|_| None).collect(),
        })
    }

    fn queue(&mut self) -> &mut VirtQueue<VirtioHal, N> {
        self.queue.as_mut().expect("only None while dropping")
    }

    /// Puts `chain` in the ring (the device learns of it at the next notification);
    /// returns its token. On failure the chain's data comes back.
    ///
    /// # Panics
    /// If the chain is empty or its memory belongs to another device.
    pub fn add(&mut self, chain: Chain<'_>) -> Result<u16, (Option<DmaStream>, Error)> {
        assert!(chain.parts[0].is_some(), "an empty chain");
        assert!(
            chain.device.is_none_or(|d| d.same(&self.device))
                && chain
                    .stream
                    .as_ref()
                    .is_none_or(|s| s.device().same(&self.device)),
            "a chain's memory belongs to another device"
        );
        let stream = chain.stream.map(DmaStream::lend);
        let base = stream.as_ref().map(LentStream::device_addr);
        let added = with_slices(&chain.parts, base, |inputs, outputs| {
            // SAFETY: the slices are the chain's memory: coherent memory of this queue's
            // device, which is not freed while the device may reach it (dropping it parks
            // it), and the lent stream, which `self.in_flight` owns from here until
            // `pop_used` gives exactly these slices back (or the queue is dropped, parking
            // it). Nothing reads or writes the stream meanwhile: only the `LentStream`
            // knows it. The crate only takes the slices' addresses and lengths.
            unsafe { self.queue().add(inputs, outputs) }
        });
        match added {
            Ok(token) => {
                let entry = &mut self.in_flight[usize::from(token)];
                assert!(entry.is_none(), "descriptor {token} lent twice");
                *entry = Some(InFlight {
                    stream,
                    parts: chain.parts,
                });
                Ok(token)
            }
            // The crate refused before writing a descriptor: the device never saw it.
            Err(e) => Err((stream.map(LentStream::reclaim), e)),
        }
    }

    /// The next request the device has finished, with its data stream. An `Err` (with the
    /// token) is a device that returned a descriptor chain it was never given: the ring
    /// cannot be trusted any more and the device must be reset.
    pub fn pop_used(&mut self) -> Option<Result<Used, u16>> {
        let token = self.queue().peek_used()?;
        let Some(chain) = self
            .in_flight
            .get_mut(usize::from(token))
            .and_then(Option::take)
        else {
            return Some(Err(token));
        };
        let base = chain.stream.as_ref().map(LentStream::device_addr);
        let written = with_slices(&chain.parts, base, |inputs, outputs| {
            // SAFETY: exactly the slices `add` gave the crate for this token (see there).
            unsafe { self.queue().pop_used(token, inputs, outputs) }
        })
        .expect("the peeked token is next in the used ring");
        Some(Ok(Used {
            token,
            // The device handed the chain back.
            data: chain.stream.map(LentStream::reclaim),
            written,
        }))
    }

    /// Whether the device wants to be notified of new requests.
    pub fn should_notify(&self) -> bool {
        self.queue.as_ref().is_some_and(VirtQueue::should_notify)
    }

    /// Stops (`false`) or restarts used-buffer interrupts from the device.
    pub fn set_interrupts(&mut self, on: bool) {
        self.queue().set_dev_notify(on);
    }
}

impl<const N: usize> Drop for Virtqueue<N> {
    fn drop(&mut self) {
        // The device may still use the ring and what it lists (unless bus mastering is
        // off): `retire` frees them only once it cannot. Lent streams retire themselves.
        if let Some(queue) = self.queue.take() {
            self.device.retire(queue);
        }
    }
}

/// Runs `f` with the chain's parts as the crate wants them: device-readable slices and
/// device-writable slices. `stream` is the data stream's address.
fn with_slices<R>(
    parts: &[Option<Part>; MAX_PARTS],
    stream: Option<u64>,
    f: impl for<'a> FnOnce(&'a [&'a [u8]], &'a mut [&'a mut [u8]]) -> R,
) -> R {
    let mut inputs: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
    let mut outputs: [&mut [u8]; MAX_PARTS] = [(); MAX_PARTS].map(|_| &mut [][..]);
    let (mut reads, mut writes) = (0, 0);
    for part in parts.iter().flatten() {
        let addr = match part.memory {
            Memory::Coherent(addr) => addr,
            Memory::Stream(offset) => {
                stream.expect("a chain with data has a stream") + offset as u64
            }
        };
        if part.device_writes {
            // SAFETY: `addr..addr + len` is DMA memory the chain's owner keeps alive (see
            // `Virtqueue::add`), identity-mapped; the slice lives only for this call, and
            // the crate uses only its address and length.
            outputs[writes] = unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, part.len) };
            writes += 1;
        } else {
            // SAFETY: as above.
            inputs[reads] = unsafe { core::slice::from_raw_parts(addr as *const u8, part.len) };
            reads += 1;
        }
    }
    f(&inputs[..reads], &mut outputs[..writes])
}
