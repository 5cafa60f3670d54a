//! Bounce buffers: how a request's data reaches the device.
//!
//! The filesystem lends a driver its buffer for one call (`&[u8]`, `&mut [u8]`), and the
//! call's future may be dropped, or forgotten, at any `await`. A device given that buffer
//! could then write into memory that has since been freed or reused, and nothing in the
//! future's destructor could prevent it (a forgotten future runs none). So no device is
//! ever given a caller's buffer: every transfer is copied through a [`DmaStream`] that the
//! request owns, into it before a write and out of it after a read. The stream goes to
//! the device lent and comes back with the completion; if the request was abandoned
//! meanwhile, the driver frees it then.
//!
//! [`Bounce`] keeps the streams of finished requests for the next ones (most recently
//! returned first, so their pages are warm): new frames cost an allocator search and, the
//! first time, the host's page faults, which at the device's queue depths costs more than
//! the copy. It keeps at most [`Bounce::new`]'s `limit` bytes (the drivers' `bounce_pool`
//! option, [`DEFAULT_BOUNCE_POOL`](super::DEFAULT_BOUNCE_POOL) by default) in at most
//! [`POOL_STREAMS`] streams. A reused stream is not zeroed: a read's data is only
//! copied out after the device reported success, and a successful read fills every byte.
//! A new read stream is zeroed, so it never holds another owner's data.
//!
//! One pool serves every queue of a device and every CPU: the pool is under a short
//! [`IrqLock`] (taken once to reuse and once to give back a stream), the counters are
//! atomics.
//!
//! Streams come from the frame allocator. When it runs short, a request waits for the
//! device to complete others (which frees their streams) instead of failing; with nothing
//! lent to the device to wait for, it fails with [`IoError::NoMemory`].

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

use block::IoError;

use crate::mm::{DmaDevice, DmaStream, PAGE_SIZE};
use crate::sync::IrqLock;
use crate::task;

/// Streams a device keeps for reuse, at most.
pub const POOL_STREAMS: usize = 64;
/// How long a request waits before trying again for DMA memory.
const MEMORY_RETRY: Duration = Duration::from_millis(1);

/// Counters of a device's bounce buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BounceStats {
    /// Bytes copied into streams (writes).
    pub bytes_in: u64,
    /// Bytes copied out of streams (reads).
    pub bytes_out: u64,
    /// Streams taken from the pool.
    pub reused: u64,
    /// Streams allocated (the pool had none of the size).
    pub allocated: u64,
    /// Waits for DMA memory (the frame allocator was short).
    pub memory_waits: u64,
}

/// A device's bounce buffers: copies in and out, and the pool. See the module
/// documentation.
#[derive(Debug)]
pub struct Bounce {
    dma: DmaDevice,
    pool: IrqLock<Pool>,
    limit: usize,
    counters: Counters,
}

/// Streams of finished requests.
#[derive(Debug, Default)]
struct Pool {
    /// Most recently returned last.
    streams: Vec<DmaStream>,
    /// Their capacity in bytes.
    bytes: usize,
}

/// [`BounceStats`], updated from any CPU.
#[derive(Debug, Default)]
struct Counters {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    reused: AtomicU64,
    allocated: AtomicU64,
    memory_waits: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Bounce {
    /// Bounce buffers for `dma`'s device, keeping up to `limit` bytes for reuse.
    pub fn new(dma: &DmaDevice, limit: usize) -> Bounce {
        Bounce {
            dma: dma.clone(),
            pool: IrqLock::new(Pool::default()),
            limit,
            counters: Counters::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> BounceStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BounceStats {
            bytes_in: get(&c.bytes_in),
            bytes_out: get(&c.bytes_out),
            reused: get(&c.reused),
            allocated: get(&c.allocated),
            memory_waits: get(&c.memory_waits),
        }
    }

    /// A stream of `len` bytes for the device to read into.
    pub async fn for_read(&self, len: usize) -> Result<DmaStream, IoError> {
        match self.reuse(len) {
            Some(stream) => Ok(stream),
            None => self.alloc(|| DmaStream::alloc(&self.dma, len)).await,
        }
    }

    /// A copy of `data` for the device to write out.
    pub async fn for_write(&self, data: &[u8]) -> Result<DmaStream, IoError> {
        let stream = match self.reuse(data.len()) {
            Some(mut stream) => {
                stream.as_mut_slice().copy_from_slice(data);
                stream
            }
            None => self.alloc(|| DmaStream::copy_of(&self.dma, data)).await?,
        };
        add(&self.counters.bytes_in, data.len() as u64);
        Ok(stream)
    }

    /// Copies a finished read's data out of its stream, and keeps the stream.
    pub fn copy_out(&self, stream: DmaStream, dst: &mut [u8]) {
        dst.copy_from_slice(stream.as_slice());
        add(&self.counters.bytes_out, dst.len() as u64);
        self.give_back(stream);
    }

    /// Keeps a finished request's stream for reuse (or frees it if the pool is full).
    pub fn give_back(&self, stream: DmaStream) {
        let bytes = stream.capacity();
        let unwanted = self.pool.lock(|pool| {
            if pool.streams.len() < POOL_STREAMS && pool.bytes + bytes <= self.limit {
                pool.bytes += bytes;
                pool.streams.push(stream);
                None
            } else {
                Some(stream)
            }
        });
        // Freed outside the lock.
        drop(unwanted);
    }

    /// The most recently returned stream of the right number of pages, sized to `len`.
    fn reuse(&self, len: usize) -> Option<DmaStream> {
        let bytes = len.max(1).div_ceil(PAGE_SIZE as usize) * PAGE_SIZE as usize;
        let mut stream = self.pool.lock(|pool| {
            let at = pool.streams.iter().rposition(|s| s.capacity() == bytes)?;
            pool.bytes -= bytes;
            Some(pool.streams.remove(at))
        })?;
        stream.set_len(len);
        add(&self.counters.reused, 1);
        Some(stream)
    }

    /// A new stream from `alloc`. If DMA memory is short it frees the pool and tries
    /// again, then waits while the device holds streams it will give back.
    async fn alloc<E>(
        &self,
        mut alloc: impl FnMut() -> Result<DmaStream, E>,
    ) -> Result<DmaStream, IoError> {
        loop {
            match alloc() {
                Ok(stream) => {
                    add(&self.counters.allocated, 1);
                    return Ok(stream);
                }
                Err(_) if self.pool.lock(|p| p.bytes) > 0 => {
                    let freed = self.pool.lock(core::mem::take);
                    drop(freed);
                }
                Err(_) if self.dma.stats().lent > 0 => {
                    add(&self.counters.memory_waits, 1);
                    task::sleep(MEMORY_RETRY).await;
                }
                Err(_) => return Err(IoError::NoMemory),
            }
        }
    }
}
