//! [`RecordingDisk`]: remembers every write, FLUSH and discard with the logical times
//! they were issued and completed, so crash states can be computed afterwards.

use alloc::sync::Arc;
use alloc::vec::Vec;

use spin::Mutex;

use crate::counting::{Counted, DeviceCounters};
use crate::{BlockDevice, Geometry, IoError, WriteFlags};

/// What a recorded request did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A write of `data` at `lba`.
    Write {
        /// First block.
        lba: u64,
        /// The bytes (a whole number of blocks).
        data: Arc<[u8]>,
        /// Issued with FUA.
        fua: bool,
    },
    /// A cache flush.
    Flush,
    /// A discard of `blocks` blocks at `lba`.
    Discard {
        /// First block.
        lba: u64,
        /// Number of blocks.
        blocks: u64,
    },
}

/// One request as the recorder saw it. Times are values of the recording's logical clock,
/// which ticks once at every issue and every completion, so "A completed before B was
/// issued" is `a.completed < Some(b.issued)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// What it was.
    pub kind: RequestKind,
    /// When it was issued.
    pub issued: u64,
    /// When it completed; `None` while in flight (or if its future was dropped).
    pub completed: Option<u64>,
    /// Whether it completed successfully.
    pub ok: bool,
}

impl Request {
    /// Whether it completed, successfully, at or before `time`.
    pub fn done_by(&self, time: u64) -> bool {
        self.ok && self.completed.is_some_and(|c| c <= time)
    }
}

/// The recorded requests, in issue order, and the counters.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// Every write, flush and discard (reads are only counted).
    pub requests: Vec<Request>,
    /// Counters of every request, reads included (counted as they complete).
    pub counters: DeviceCounters,
    /// The logical clock's current value.
    pub now: u64,
}

impl Recording {
    fn tick(&mut self) -> u64 {
        self.now += 1;
        self.now
    }
}

/// A shared view of a [`RecordingDisk`]'s log, usable while the filesystem owns the disk.
#[derive(Clone, Debug, Default)]
pub struct Recorder(Arc<Mutex<Recording>>);

impl Recorder {
    /// The logical time now (to mark the start and end of operations).
    pub fn now(&self) -> u64 {
        self.0.lock().now
    }

    /// A copy of the log so far.
    pub fn snapshot(&self) -> Recording {
        self.0.lock().clone()
    }

    /// The counters so far.
    pub fn counters(&self) -> DeviceCounters {
        self.0.lock().counters
    }

    /// Forgets everything recorded so far (e.g. after mkfs, whose result becomes the
    /// base image). The clock keeps running.
    pub fn clear(&self) {
        let mut log = self.0.lock();
        log.requests.clear();
        log.counters = DeviceCounters::default();
    }

    fn issue(&self, kind: RequestKind) -> usize {
        let mut log = self.0.lock();
        let issued = log.tick();
        log.requests.push(Request {
            kind,
            issued,
            completed: None,
            ok: false,
        });
        log.requests.len() - 1
    }

    fn complete(&self, id: usize, what: Counted, ok: bool) {
        let mut log = self.0.lock();
        let completed = log.tick();
        log.counters.count(what, ok, None);
        // `clear` may have dropped the request meanwhile.
        if let Some(request) = log.requests.get_mut(id) {
            request.completed = Some(completed);
            request.ok = ok;
        }
    }
}

/// A device that records every write, FLUSH and discard it passes to `D`.
#[derive(Debug)]
pub struct RecordingDisk<D> {
    inner: D,
    recorder: Recorder,
}

impl<D: BlockDevice> RecordingDisk<D> {
    /// Wraps `inner`; the returned [`Recorder`] reads the log.
    pub fn new(inner: D) -> (RecordingDisk<D>, Recorder) {
        let recorder = Recorder::default();
        (
            RecordingDisk {
                inner,
                recorder: recorder.clone(),
            },
            recorder,
        )
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: BlockDevice> BlockDevice for RecordingDisk<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let result = self.inner.read(lba, buf).await;
        let what = Counted::Read(buf.len());
        self.recorder
            .0
            .lock()
            .counters
            .count(what, result.is_ok(), None);
        result
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        let id = self.recorder.issue(RequestKind::Write {
            lba,
            data: Arc::from(buf),
            fua: flags.fua,
        });
        let result = self.inner.write(lba, buf, flags).await;
        let what = Counted::Write(buf.len(), flags);
        self.recorder.complete(id, what, result.is_ok());
        result
    }

    async fn flush(&self) -> Result<(), IoError> {
        let id = self.recorder.issue(RequestKind::Flush);
        let result = self.inner.flush().await;
        self.recorder.complete(id, Counted::Flush, result.is_ok());
        result
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        let id = self.recorder.issue(RequestKind::Discard { lba, blocks });
        let result = self.inner.discard(lba, blocks).await;
        self.recorder
            .complete(id, Counted::Discard(blocks), result.is_ok());
        result
    }
}
