//! Readahead requests: what the read path asks to have read ahead of a sequential reader
//! ([`vfs::ReadStream`]), queued here and carried out by the filesystem's readahead
//! workers (`NineFs::readahead_worker`), which the host runs as tasks.
//!
//! Bounded: at most [`MAX_QUEUED`] requests wait, at most [`MAX_QUEUED_PER_TENANT`] of one
//! tenant; more are dropped (and counted) — readahead is a hint, the reader reads what
//! it needs itself. A request whose stream has moved on (a random read ended the run)
//! is dropped when its turn comes. What a worker reads lands in the data cache, so the
//! memory it holds is the cache's, plus one device read per worker in flight.

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use core::ops::Range;

use event_listener::Event;
use spin::Mutex;
use vfs::{Ino, ReadStream};

use super::data::Who;

/// Most requests waiting.
pub const MAX_QUEUED: usize = 64;
/// Most requests of one tenant waiting.
pub const MAX_QUEUED_PER_TENANT: usize = 16;

/// A range of a file to read into the data cache.
#[derive(Debug)]
pub struct ReadaheadRequest {
    /// The file (as the reader named it: a snapshot's files too).
    pub ino: Ino,
    /// Bytes of it.
    pub range: Range<u64>,
    /// Whom it is for (charged with what it brings in).
    pub who: Who,
    /// The stream it is for, and its epoch when asked.
    pub stream: Arc<ReadStream>,
    /// See `stream`.
    pub epoch: u64,
}

impl ReadaheadRequest {
    /// Whether the reader it was asked for is still reading sequentially there.
    pub fn current(&self) -> bool {
        self.stream.epoch() == self.epoch
    }
}

/// Readahead's counters (the `readahead` object of the filesystem's counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ReadaheadCounters {
    /// Requests queued.
    pub requests: u64,
    /// Requests dropped because the queue (or the tenant's part of it) was full.
    pub dropped: u64,
    /// Requests dropped because their reader stopped reading sequentially.
    pub cancelled: u64,
    /// Device reads made (each of one or more adjacent runs of blocks).
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Blocks found cached or already being read (not read again).
    pub skipped_blocks: u64,
    /// Reads that failed or whose blocks failed their checksums (nothing kept: the
    /// reader's own read reports what is wrong).
    pub failed: u64,
}

/// The queue of requests. See the module documentation.
#[derive(Debug, Default)]
pub struct ReadaheadQueue {
    queue: Mutex<VecDeque<ReadaheadRequest>>,
    counters: Mutex<ReadaheadCounters>,
    ready: Event,
}

impl ReadaheadQueue {
    /// An empty queue.
    pub fn new() -> ReadaheadQueue {
        ReadaheadQueue::default()
    }

    /// Queues `r` unless the queue (or its tenant's part) is full; whether it was.
    pub fn push(&self, r: ReadaheadRequest) -> bool {
        let taken = {
            let mut q = self.queue.lock();
            let theirs = q.iter().filter(|x| x.who == r.who).count();
            let room = q.len() < MAX_QUEUED && theirs < MAX_QUEUED_PER_TENANT;
            if room {
                q.push_back(r);
            }
            room
        };
        {
            let mut c = self.counters.lock();
            c.requests += u64::from(taken);
            c.dropped += u64::from(!taken);
        }
        if taken {
            self.ready.notify(1);
        }
        taken
    }

    /// The next current request, waiting for one; stale ones are dropped on the way.
    pub async fn pop(&self) -> ReadaheadRequest {
        loop {
            let listener = self.ready.listen();
            if let Some(r) = self.try_pop() {
                return r;
            }
            listener.await;
        }
    }

    /// The next current request, if one is waiting; stale ones are dropped on the way.
    pub fn try_pop(&self) -> Option<ReadaheadRequest> {
        loop {
            let r = self.queue.lock().pop_front()?;
            if r.current() {
                return Some(r);
            }
            self.counters.lock().cancelled += 1;
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.queue.lock().len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Updates the counters.
    pub fn count(&self, f: impl FnOnce(&mut ReadaheadCounters)) {
        f(&mut self.counters.lock())
    }

    /// The counters.
    pub fn counters(&self) -> ReadaheadCounters {
        *self.counters.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(who: Who, stream: &Arc<ReadStream>) -> ReadaheadRequest {
        ReadaheadRequest {
            ino: 5,
            range: 0..4096,
            who,
            stream: stream.clone(),
            epoch: stream.epoch(),
        }
    }

    #[test]
    fn bounded_per_tenant_and_in_all() {
        let q = ReadaheadQueue::new();
        let s = Arc::new(ReadStream::new());
        for _ in 0..MAX_QUEUED_PER_TENANT {
            assert!(q.push(request(Some(1), &s)));
        }
        assert!(!q.push(request(Some(1), &s)), "tenant 1's part is full");
        let mut tenant = 2;
        while q.len() < MAX_QUEUED {
            assert!(q.push(request(Some(tenant), &s)));
            tenant += 1;
        }
        assert!(!q.push(request(Some(999), &s)), "full");
        assert_eq!(q.counters().dropped, 2);
    }

    #[test]
    fn stale_requests_are_dropped() {
        let q = ReadaheadQueue::new();
        let (a, b) = (Arc::new(ReadStream::new()), Arc::new(ReadStream::new()));
        // Stream a goes sequential, then random: its request is stale.
        let w = vfs::Window {
            initial: 4096,
            max: 1 << 20,
        };
        a.advance(0, 4096, w);
        q.push(request(None, &a));
        a.advance(1 << 30, 4096, w);
        q.push(request(None, &b));
        let r = pollster::block_on(q.pop());
        assert!(Arc::ptr_eq(&r.stream, &b));
        assert_eq!(q.counters().cancelled, 1);
    }
}
