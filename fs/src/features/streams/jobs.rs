//! The stream jobs of the administration tree: `send start NAME [from BASE]` streams a
//! snapshot out through the `send` file and `receive start` takes one in through the
//! `receive` file, while the filesystem goes on serving.
//!
//! A job is a background task of the owner's
//! ([`NineFs::send_worker`](crate::volume::NineFs::send_worker),
//! [`NineFs::receive_worker`](crate::volume::NineFs::receive_worker), spawned once
//! beside the scrub task; [`Streams`] holds the jobs) at one end of a bounded buffer
//! ([`MountOptions::stream_buffer`](crate::volume::MountOptions::stream_buffer)) and a
//! 9P client at the other:
//! - send: the worker writes the stream into the buffer and waits while it is full; the
//!   client reads `send` in order, each read waiting while the buffer is empty and
//!   returning 0 at the stream's end. Nobody reading stalls the worker, not memory.
//! - receive: the client's writes to `receive` fill the buffer (short writes when it is
//!   nearly full, a wait when it is full) and the worker reads it. The receiver reads a
//!   stream twice, checked whole and then applied (`features::streams::receive`), so the client
//!   writes it twice from offset 0, each pass ending when it closes the file (or starts
//!   the next pass); a damaged stream is refused after the first pass, nothing applied.
//!
//! The worker moves at most the bytes the owner grants every tick
//! ([`NineFs::stream_grant`](crate::volume::NineFs::stream_grant), `stream_rate=`
//! MiB/s), so its device reads and writes leave the device to clients. A job's
//! generation changes when it is started again or stopped; a worker whose job's
//! generation changed stops at its next step. Progress and results are `status` lines.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use core::fmt::Write;

use event_listener::Event;
use spin::Mutex;

use crate::features::streams::host::StreamHost;
use crate::features::streams::receive::StreamSource;
use crate::features::streams::send::{self, StreamSink};
use crate::features::streams::Streams;
use vfs::{Errno, FsResult};

/// Default of [`MountOptions::stream_buffer`](crate::volume::MountOptions::stream_buffer)
/// (`stream_buffer=` KiB, `ninefold serve --stream-buffer-kib`): what one job may hold.
pub const DEFAULT_STREAM_BUFFER: usize = 1 << 20;
/// Default rate of the stream jobs' workers, in MiB per second (`stream_rate=`,
/// `ninefold serve --stream-rate`), each of send and receive.
pub const DEFAULT_STREAM_RATE_MIB: u32 = 32;

/// Where a job stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Never started.
    #[default]
    Never,
    /// Started; the worker has not taken it yet.
    Waiting,
    /// Sending, or (receive) checking the first pass.
    Running,
    /// Receive: applying the second pass.
    Applying,
    /// Finished; what it did.
    Done(String),
    /// Failed or refused; why.
    Failed(String),
    /// Stopped by `stop` (or replaced by a new start).
    Stopped,
}

/// One job and its buffer.
#[derive(Debug, Default)]
struct Job {
    /// Changed by every start and stop.
    generation: u64,
    phase: Phase,
    /// A send job for the worker to take: the snapshot and its base (receive: empty).
    request: Option<(String, Option<String>)>,
    /// The job's subject (what `request` was), while it is not over.
    subject: Option<(String, Option<String>)>,
    buf: VecDeque<u8>,
    /// The client's next stream offset in its pass.
    client_at: u64,
    /// Receive: the pass the client writes (1 or 2), the one the worker reads, the last
    /// one the client closed.
    client_pass: u8,
    worker_pass: u8,
    closed_pass: u8,
    /// Bytes the worker may still move before the next grant.
    budget: u64,
    /// Stream bytes moved through the buffer (both passes for a receive).
    bytes: u64,
    /// Times the side that fills the buffer found it full.
    stalls: u64,
    /// Jobs started.
    started: u64,
    /// Since the mount, for the counters: every job's bytes and stalls.
    total_bytes: u64,
    total_stalls: u64,
}

/// One kind of stream job's counters since the mount (`FsReport::streams`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct JobCounters {
    /// Jobs started.
    pub jobs: u64,
    /// Stream bytes moved through the buffer (a receive's two passes both count).
    pub bytes: u64,
    /// Times the side filling the buffer found it full (the other side is slow:
    /// `stream_buffer=` bounds the memory, this counts the waits).
    pub stalls: u64,
    /// Bytes in the buffer now.
    pub buffered: u64,
    /// 1 while a job runs.
    pub running: u64,
}

/// The send and receive jobs' counters (`FsReport::streams`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StreamCounters {
    /// `send` jobs.
    pub send: JobCounters,
    /// `receive` jobs.
    pub receive: JobCounters,
}

impl Job {
    fn active(&self) -> bool {
        matches!(
            self.phase,
            Phase::Waiting | Phase::Running | Phase::Applying
        )
    }

    fn counters(&self) -> JobCounters {
        JobCounters {
            jobs: self.started,
            bytes: self.total_bytes + self.bytes,
            stalls: self.total_stalls + self.stalls,
            buffered: self.buf.len() as u64,
            running: u64::from(self.active()),
        }
    }

    /// Starts a job over an empty buffer (stopping the one running).
    fn restart(&mut self, request: (String, Option<String>)) {
        self.generation += 1;
        self.phase = Phase::Waiting;
        self.subject = Some(request.clone());
        self.request = Some(request);
        self.buf = VecDeque::new();
        self.client_at = 0;
        (self.client_pass, self.worker_pass, self.closed_pass) = (1, 0, 0);
        self.total_bytes += self.bytes;
        self.total_stalls += self.stalls;
        self.bytes = 0;
        self.stalls = 0;
        self.started += 1;
    }

    fn stop(&mut self) -> bool {
        if !self.active() {
            return false;
        }
        self.generation += 1;
        self.phase = Phase::Stopped;
        self.request = None;
        self.subject = None;
        self.buf = VecDeque::new();
        true
    }

    /// The `status` lines of job `name`.
    fn status(&self, name: &str, out: &mut String) {
        let state = match (&self.phase, name) {
            (Phase::Never, _) => "never",
            (Phase::Waiting, _) => "waiting",
            (Phase::Running, "send") => "running",
            (Phase::Running, _) => "checking",
            (Phase::Applying, _) => "applying",
            (Phase::Done(_), _) => "done",
            (Phase::Failed(_), _) => "failed",
            (Phase::Stopped, _) => "stopped",
        };
        let _ = writeln!(
            out,
            "{name} {state} bytes {} buffered {} stalls {}",
            self.bytes,
            self.buf.len(),
            self.stalls
        );
        if let Phase::Done(m) | Phase::Failed(m) = &self.phase {
            let _ = writeln!(out, "{name}_result {m}");
        }
        let _ = writeln!(out, "{name}_jobs {}", self.started);
    }
}

/// The send and receive jobs of a mounted filesystem.
#[derive(Debug)]
pub(crate) struct StreamJobs {
    send: Mutex<Job>,
    receive: Mutex<Job>,
    /// Notified whenever a job or its buffer changes.
    changed: Event,
    /// Most bytes a buffer holds.
    capacity: usize,
}

impl StreamJobs {
    pub(crate) fn new(capacity: usize) -> StreamJobs {
        StreamJobs {
            send: Mutex::new(Job::default()),
            receive: Mutex::new(Job::default()),
            changed: Event::new(),
            capacity: capacity.max(1),
        }
    }

    /// Runs `step` on `job` until it returns `Some`, waiting for a change between tries;
    /// a step that returns `Some` changed something, so the others are woken.
    async fn until<R>(&self, job: &Mutex<Job>, mut step: impl FnMut(&mut Job) -> Option<R>) -> R {
        loop {
            let listener = self.changed.listen();
            let done = step(&mut job.lock());
            if let Some(r) = done {
                self.changed.notify(usize::MAX);
                return r;
            }
            listener.await;
        }
    }

    /// Changes `job` with `f` and wakes whoever waits on it.
    fn change<R>(&self, job: &Mutex<Job>, f: impl FnOnce(&mut Job) -> R) -> R {
        let r = f(&mut job.lock());
        self.changed.notify(usize::MAX);
        r
    }

    /// Ends the job of generation `generation` (unless it was stopped or replaced).
    fn finish(&self, job: &Mutex<Job>, generation: u64, result: Result<String, String>) {
        self.change(job, |j| {
            if j.generation == generation {
                match &result {
                    Ok(m) => log::info!("{m}"),
                    Err(m) => log::warn!("{m}"),
                }
                j.phase = match result {
                    Ok(m) => Phase::Done(m),
                    Err(m) => {
                        // Nothing more will be read or written through it.
                        j.buf = VecDeque::new();
                        Phase::Failed(m)
                    }
                };
                j.subject = None;
            }
        });
    }
}

/// The send worker's end of the buffer.
struct JobSink<'a> {
    jobs: &'a StreamJobs,
    generation: u64,
}

impl StreamSink for JobSink<'_> {
    async fn put(&mut self, mut bytes: &[u8]) -> FsResult<()> {
        let (cap, generation) = (self.jobs.capacity, self.generation);
        while !bytes.is_empty() {
            let mut stalled = false;
            let n = self
                .jobs
                .until(&self.jobs.send, |j| {
                    if j.generation != generation {
                        return Some(Err(Errno::EBUSY));
                    }
                    let room = cap.saturating_sub(j.buf.len());
                    if room == 0 && !stalled {
                        stalled = true;
                        j.stalls += 1;
                    }
                    let n = bytes.len().min(room).min(budget(j.budget));
                    if n == 0 {
                        return None;
                    }
                    j.buf.extend(&bytes[..n]);
                    j.budget -= n as u64;
                    j.bytes += n as u64;
                    Some(Ok(n))
                })
                .await?;
            bytes = &bytes[n..];
        }
        Ok(())
    }
}

/// The receive worker's end of the buffer.
struct JobSource<'a> {
    jobs: &'a StreamJobs,
    generation: u64,
    pass: u8,
}

impl StreamSource for JobSource<'_> {
    async fn rewind(&mut self) -> Result<(), Errno> {
        self.pass += 1;
        let (pass, generation) = (self.pass, self.generation);
        self.jobs.change(&self.jobs.receive, |j| {
            if j.generation != generation {
                return Err(Errno::EBUSY);
            }
            j.worker_pass = pass;
            if pass > 1 {
                j.phase = Phase::Applying;
            }
            Ok(())
        })
    }

    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Errno> {
        let (pass, generation) = (self.pass, self.generation);
        self.jobs
            .until(&self.jobs.receive, |j| {
                if j.generation != generation {
                    return Some(Err(Errno::EBUSY));
                }
                if j.buf.is_empty() {
                    return (j.closed_pass >= pass).then_some(Ok(0));
                }
                let n = buf.len().min(j.buf.len()).min(budget(j.budget));
                if n == 0 {
                    return None;
                }
                for (d, s) in buf.iter_mut().zip(j.buf.drain(..n)) {
                    *d = s;
                }
                j.budget -= n as u64;
                Some(Ok(n))
            })
            .await
    }
}

/// A budget as a length.
fn budget(b: u64) -> usize {
    usize::try_from(b).unwrap_or(usize::MAX)
}

impl Streams {
    /// `send start`: streams snapshot `name` (with `base`, the changes since that one)
    /// through the `send` file, replacing the send running.
    pub(crate) async fn send_start(
        &self,
        host: &impl StreamHost,
        name: &str,
        base: Option<&str>,
    ) -> Result<String, String> {
        let names = host
            .snaps()
            .snapshots()
            .await
            .map_err(|e| format!("failed: {e}"))?;
        for n in core::iter::once(name).chain(base) {
            if !names.iter().any(|s| s.name == n) {
                return Err(format!("no snapshot {n:?}"));
            }
        }
        let replaced = self.jobs.change(&self.jobs.send, |j| {
            let was = j.active();
            j.restart((name.into(), base.map(String::from)));
            was
        });
        Ok(format!(
            "sending {name:?}{}: read the send file{}",
            base.map(|b| format!(" from {b:?}")).unwrap_or_default(),
            if replaced {
                " (the send running was stopped)"
            } else {
                ""
            }
        ))
    }

    /// `send stop`: whether a send was running.
    pub(crate) fn send_stop(&self) -> bool {
        self.jobs.change(&self.jobs.send, Job::stop)
    }

    /// `receive start`: takes a stream through the `receive` file. Refused while one
    /// runs (stopping one half applied leaves the live tree for `receive rollback`, so
    /// that takes `receive stop`).
    pub(crate) fn receive_start(&self) -> Result<String, String> {
        self.jobs.change(&self.jobs.receive, |j| {
            if j.active() {
                return Err("a receive is running (receive stop first)".into());
            }
            j.restart((String::new(), None));
            Ok(
                "receiving: write the stream to the receive file twice (checked, then applied)"
                    .into(),
            )
        })
    }

    /// `receive stop`: whether a receive was running.
    pub(crate) fn receive_stop(&self) -> bool {
        self.jobs.change(&self.jobs.receive, Job::stop)
    }

    /// Whether the running send reads snapshot `name` (which may not be deleted).
    pub(crate) fn sending(&self, name: &str) -> bool {
        self.jobs
            .send
            .lock()
            .subject
            .as_ref()
            .is_some_and(|(n, b)| n == name || b.as_deref() == Some(name))
    }

    /// Lets each job's worker move `budget` more bytes (the owner calls it every tick,
    /// `stream_rate=`); what a tick leaves unused is not kept.
    pub(crate) fn stream_grant(&self, budget: u64) {
        for job in [&self.jobs.send, &self.jobs.receive] {
            let active = job.lock().active();
            if active {
                self.jobs.change(job, |j| j.budget = budget);
            }
        }
    }

    /// Runs the send jobs `send start` asks for, one at a time, for ever (the owner
    /// spawns it once).
    pub(crate) async fn send_worker(&self, host: &impl StreamHost) {
        loop {
            let (generation, (name, base)) = self
                .jobs
                .until(&self.jobs.send, |j| {
                    let r = j.request.take()?;
                    j.phase = Phase::Running;
                    Some((j.generation, r))
                })
                .await;
            let what = match &base {
                Some(b) => format!("{name:?} from {b:?}"),
                None => format!("{name:?}"),
            };
            log::info!("send: {what} started");
            let mut sink = JobSink {
                jobs: &self.jobs,
                generation,
            };
            let result = send::send_to(host, &name, base.as_deref(), &mut sink).await;
            let result = result
                .map(|s| {
                    format!(
                        "sent {what}: {} bytes, {} records, {} inodes",
                        s.bytes, s.records, s.inodes
                    )
                })
                .map_err(|e| format!("send {what}: failed: {e}"));
            self.jobs.finish(&self.jobs.send, generation, result);
        }
    }

    /// Runs the receive jobs `receive start` asks for, one at a time, for ever (the owner
    /// spawns it once).
    pub(crate) async fn receive_worker(&self, host: &impl StreamHost) {
        loop {
            let generation = self
                .jobs
                .until(&self.jobs.receive, |j| {
                    j.request.take()?;
                    j.phase = Phase::Running;
                    Some(j.generation)
                })
                .await;
            let mut source = JobSource {
                jobs: &self.jobs,
                generation,
                pass: 0,
            };
            let result = self.receive_from(host, &mut source).await;
            let result = result
                .map(|s| format!("received snapshot {:?} at checkpoint {}", s.name, s.seq))
                .map_err(|e| format!("receive refused: {e}"));
            self.jobs.finish(&self.jobs.receive, generation, result);
        }
    }

    /// The `send` file: the next bytes of the stream at `offset` (read in order), waiting
    /// while none are ready; 0 at its end or with no send running; `EIO` if the send
    /// failed (`status` says why), `EINVAL` out of order.
    pub(crate) async fn send_read(&self, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        self.jobs
            .until(&self.jobs.send, |j| {
                if offset != j.client_at {
                    return Some(Err(Errno::EINVAL));
                }
                if !j.buf.is_empty() {
                    let n = buf.len().min(j.buf.len());
                    for (d, s) in buf.iter_mut().zip(j.buf.drain(..n)) {
                        *d = s;
                    }
                    j.client_at += n as u64;
                    return Some(Ok(n));
                }
                match j.phase {
                    Phase::Waiting | Phase::Running | Phase::Applying => None,
                    Phase::Failed(_) => Some(Err(Errno::EIO)),
                    _ => Some(Ok(0)),
                }
            })
            .await
    }

    /// The `receive` file: takes the stream's bytes at `offset` (in order; offset 0
    /// again starts the second pass once the first is checked), as many as the buffer
    /// has room for, waiting while it has none. `EINVAL` with no receive running (or it
    /// failed: `status` says why), out of order, or past the second pass.
    pub(crate) async fn receive_write(&self, offset: u64, data: &[u8]) -> FsResult<usize> {
        // Writing offset 0 again ends the pass written so far.
        self.jobs.change(&self.jobs.receive, |j| {
            if offset == 0 && j.client_at > 0 {
                j.closed_pass = j.closed_pass.max(j.client_pass);
            }
        });
        let cap = self.jobs.capacity;
        let mut stalled = false;
        self.jobs
            .until(&self.jobs.receive, |j| {
                if !j.active() {
                    return Some(Err(Errno::EINVAL));
                }
                if offset == 0 && j.client_at > 0 {
                    if j.client_pass >= 2 {
                        return Some(Err(Errno::EINVAL));
                    }
                    if j.worker_pass <= j.client_pass {
                        return None;
                    }
                    j.client_pass += 1;
                    j.client_at = 0;
                }
                if j.worker_pass < j.client_pass {
                    return None;
                }
                if offset != j.client_at || j.closed_pass >= j.client_pass {
                    return Some(Err(Errno::EINVAL));
                }
                let n = data.len().min(cap.saturating_sub(j.buf.len()));
                if n == 0 {
                    if !stalled {
                        stalled = true;
                        j.stalls += 1;
                    }
                    return None;
                }
                j.buf.extend(&data[..n]);
                j.client_at += n as u64;
                j.bytes += n as u64;
                Some(Ok(n))
            })
            .await
    }

    /// The writer of `receive` closed it: the pass it wrote ends.
    pub(crate) fn receive_closed(&self) {
        self.jobs.change(&self.jobs.receive, |j| {
            if j.client_at > 0 {
                j.closed_pass = j.closed_pass.max(j.client_pass);
            }
        });
    }

    /// The jobs' `status` lines.
    pub(crate) fn stream_status(&self, out: &mut String) {
        self.jobs.send.lock().status("send", out);
        self.jobs.receive.lock().status("receive", out);
    }

    /// The stream jobs' counters since the mount.
    pub(crate) fn stream_counters(&self) -> StreamCounters {
        StreamCounters {
            send: self.jobs.send.lock().counters(),
            receive: self.jobs.receive.lock().counters(),
        }
    }
}
