//! The transport-agnostic connection driver.
//!
//! A [`Connection`] turns a byte stream into request futures and their replies back into
//! bytes. It does no I/O itself: a transport (smoltcp socket, std/tokio TCP stream, a
//! test) hands it input with [`Connection::read_buf`]/[`Connection::advance`] (or
//! [`Connection::receive`]), polls [`Connection::poll_requests`] when woken, and sends
//! what [`Connection::output`] holds. [`Connection::run`] does all of that over any
//! [`Transport`].
//!
//! Every request becomes its own future; all of a connection's futures are polled
//! together (`FuturesUnordered`), so a slow `fsync` on one tag never holds up a `read` on
//! another. Replies go out in completion order.
//!
//! Rules the driver enforces:
//! - A frame whose size is below the header or above the negotiated msize cannot be
//!   skipped safely: the connection closes. So does a request reusing a tag that is
//!   still in flight (its reply could not be told apart).
//! - At [`crate::server::Config::max_in_flight`] outstanding requests (in flight, or
//!   answered but not yet sent) the connection stops taking input until one is sent
//!   (backpressure, not an error).
//! - Memory (see [`crate::memory`]): a frame's bytes are charged to the connection's
//!   account when its size field arrives, the largest reply the request can get
//!   ([`wire::reply_bound`]) when the frame is complete; a reply's charge shrinks to its
//!   real size and goes when it is sent. While a charge is refused the connection takes
//!   no input (backpressure) and retries when memory is given back; if it holds less than
//!   its fair share, the server reclaims memory from a connection that holds more
//!   without using it.
//! - The server may ask a connection to close ([`crate::server::Session::request_close`]:
//!   deadlines, reclaimed memory or slot); it then stops at once, dropping unsent
//!   replies. A shutdown ([`crate::server::Server::shut_down`]) closes politely
//!   instead: no new request is read, those in flight finish and their replies are
//!   sent, then the connection ends.
//! - [`Connection::run`] serves for at most [`crate::server::Config::cpu_quantum_ns`]
//!   (and a bounded number of rounds) before letting other tasks run
//!   ([`Transport::yield_cpu`]), so one pipelining client cannot starve the others.
//! - `Tversion` waits until no request is in flight, and no new request starts until it
//!   is answered (it resets the session).
//! - `Tflush(oldtag)`: requests are never cancelled midway (the filesystem's operations
//!   need not be cancel-safe), so the `Rflush` is sent right after `oldtag`'s reply, or
//!   at once if `oldtag` is not in flight. Nothing for `oldtag` follows the `Rflush`.
//! - On disconnect, [`Connection::shutdown`] lets in-flight requests finish (dropping
//!   their replies), then clunks every fid: open files are released, locks dropped.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::future::{poll_fn, Future};
use core::net::IpAddr;
use core::pin::Pin;
use core::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use vfs::FileSystem;

use crate::memory::{Charge, Refused, Use};
use crate::server::tenant::CpuWaker;
use crate::server::{lerror, reply, Received, Server, Session};
use crate::wire::{self, Header, Rmsg, Tmsg, TmsgType, HEADER_LEN};

/// A request's future: its tag and its reply.
type RequestFuture = Pin<Box<dyn Future<Output = (u16, Reply)>>>;

/// A reply frame and the memory charged for it (none for the driver's own small
/// replies: `Rflush`, errors for malformed frames).
#[derive(Debug)]
struct Reply {
    frame: Vec<u8>,
    _charge: Option<Charge>,
}

impl Reply {
    fn uncharged(frame: Vec<u8>) -> Reply {
        Reply {
            frame,
            _charge: None,
        }
    }
}

/// Why a connection is closing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// A frame's size field was below 7 or above msize.
    BadFrameSize(u32),
    /// A request reused the tag of one still in flight.
    DuplicateTag(u16),
    /// No successful `Tversion` within the handshake deadline.
    HandshakeTimeout,
    /// No fid and no request for the idle deadline.
    IdleTimeout,
    /// Its slot was given to a new client (it had no fid and was quiet).
    SlotReclaimed,
    /// It held memory others needed without using it.
    MemoryReclaimed,
    /// The server is shutting down ([`crate::server::Server::shut_down`]): the requests
    /// in flight finish and their replies are sent, then the connection closes.
    Shutdown,
    /// The server is shutting down and the connection did not finish in time
    /// ([`crate::server::Server::shut_down_now`]): it is shed like the others.
    ShutdownNow,
}

impl CloseReason {
    /// Whether the server closes without sending the replies still queued: the client
    /// is being shed, not told about a protocol violation or a shutdown.
    pub fn drops_output(self) -> bool {
        !matches!(
            self,
            CloseReason::BadFrameSize(_) | CloseReason::DuplicateTag(_) | CloseReason::Shutdown
        )
    }

    /// Whether the connection answers the requests in flight before it closes (else
    /// they still finish, at teardown, but their replies are dropped).
    pub fn finishes_requests(self) -> bool {
        self == CloseReason::Shutdown
    }

    /// Whether `later`, asked for after `self`, replaces it: shedding overrides a close
    /// that would still send replies (a shutdown whose grace ran out), nothing else
    /// does.
    pub fn overridden_by(self, later: CloseReason) -> bool {
        !self.drops_output() && later.drops_output()
    }
}

/// Input waiting for memory.
#[derive(Debug)]
enum Parked {
    /// A frame whose size field has arrived: its bytes are not charged yet.
    Frame { size: u32 },
    /// A complete frame whose reply is not charged yet.
    Request {
        frame: Vec<u8>,
        charge: Charge,
        received: Received,
    },
}

/// A tag in use; each holds its request's receipt, whose latency is taken when the
/// reply is queued.
#[derive(Debug)]
enum TagState {
    /// A request in flight, with the tags of the flushes waiting for it.
    Request {
        flushers: Vec<u16>,
        received: Received,
    },
    /// A flush waiting for the request with tag `target`.
    Flush { target: u16, received: Received },
}

#[derive(Debug)]
enum Version {
    Idle,
    /// A `Tversion` waiting for the in-flight requests to drain.
    Waiting {
        tag: u16,
        msize: u32,
        version: Vec<u8>,
    },
    /// Its future is running.
    Running,
}

/// One client connection's protocol state. See the module documentation.
pub struct Connection<F: FileSystem + 'static> {
    server: Arc<Server<F>>,
    session: Arc<Session>,
    /// The frame being assembled: `input[..filled]` has arrived.
    input: Vec<u8>,
    filled: usize,
    /// The memory charged for the frame being assembled.
    input_charge: Option<Charge>,
    /// Input that waits for memory.
    parked: Option<Parked>,
    in_flight: FuturesUnordered<RequestFuture>,
    tags: BTreeMap<u16, TagState>,
    version: Version,
    output: VecDeque<Reply>,
    /// Bytes of `output.front()` already sent.
    sent: usize,
    closing: Option<CloseReason>,
    /// The in-flight limit stopped input (counted once per stop).
    throttled: bool,
    /// The tenant's in-flight limit stopped input (counted once per stop; the task waits
    /// for one of the tenant's requests to complete).
    tenant_throttled: bool,
    /// What [`Connection::run`]'s task is woken through: its tenant's CPU share
    /// ([`CpuShare`](crate::server::tenant::CpuShare)).
    cpu: Option<Arc<CpuWaker>>,
    /// The worker (CPU, thread) that runs it ([`Connection::on_worker`]).
    worker: usize,
    /// When [`Connection::run`] must let other tasks run (server clock), so a long run of
    /// completing requests yields too.
    yield_at: Option<u64>,
}

impl<F: FileSystem + 'static> core::fmt::Debug for Connection<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Connection")
            .field("session", &self.session.id())
            .field("in_flight", &self.in_flight.len())
            .field("queued_replies", &self.output.len())
            .field("closing", &self.closing)
            .finish()
    }
}

impl<F: FileSystem + 'static> Drop for Connection<F> {
    /// A connection dropped without [`Connection::shutdown`] (a transport that gave up,
    /// a test) still drops its POSIX locks, which would otherwise block other clients
    /// forever. (Its open files are not released: that takes the filesystem's async
    /// `release`.)
    fn drop(&mut self) {
        self.server.drop_locks(&self.session);
        if let Some(cpu) = &self.cpu {
            cpu.idle();
        }
    }
}

/// A byte stream a [`Connection`] can [`Connection::run`] over (poll-style, so it maps
/// directly onto smoltcp's socket wakers or tokio's `AsyncRead`/`AsyncWrite`).
pub trait Transport {
    /// The transport's error.
    type Error: core::fmt::Debug;
    /// Reads into `buf`; `Ok(0)` means the peer closed.
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<Result<usize, Self::Error>>;
    /// Writes some of `buf`; `Ok(0)` means the peer is gone. A transport may hold what
    /// it was given until [`Transport::flush`].
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize, Self::Error>>;
    /// Sends what [`Transport::poll_write`] took and still holds. The connection calls it
    /// once it has written every reply it has (or the transport took no more), so replies
    /// made together leave together: fewer, fuller segments for the client to take in.
    fn flush(&mut self) {}
    /// The connection used up its CPU quantum with work left and returns `Pending`:
    /// arrange for it to be polled again after other work. The default wakes the task at
    /// once (the back of a FIFO run queue); a transport on an executor that can hold
    /// CPU-bound tasks back until event-driven ones have run (the appliance's) does so, so
    /// a pipelining client's turn never delays another client's request by more than a
    /// quantum.
    fn yield_cpu(&mut self, cx: &mut Context<'_>) {
        cx.waker().wake_by_ref();
    }
}

/// [`Connection::run`]'s buffer for small frames: `buf[from..to]` arrived and is not
/// taken yet.
struct Staging {
    buf: Vec<u8>,
    from: usize,
    to: usize,
}

/// How a turn of [`Connection::run`] ended.
enum Turn<E> {
    /// Nothing can progress until a waker fires.
    Waiting,
    /// The turn's budget or quantum is used up with work left.
    Yielded,
    /// The connection is over.
    Done(Result<Option<CloseReason>, E>),
}

/// Reads at least this large go straight into the frame being assembled (no staging
/// copy): the payload of a big `Twrite`.
const DIRECT_READ_MIN: usize = 16 * 1024;
/// Size of [`Connection::run`]'s staging buffer for small frames.
const STAGING: usize = 64 * 1024;
/// Rounds of work [`Connection::run`] does before yielding to other tasks.
const BUDGET: usize = 64;

impl<F: FileSystem + 'static> Connection<F> {
    /// A new connection of `server` whose peer's address is unknown (an in-memory
    /// transport, a test): only exports that allow every address accept its attach.
    pub fn new(server: Arc<Server<F>>) -> Self {
        Self::with_session(server.clone(), server.new_session(None))
    }

    /// A new connection of `server` from a client at `peer` (its address decides which
    /// exports it may attach to).
    pub fn from_peer(server: Arc<Server<F>>, peer: IpAddr) -> Self {
        Self::with_session(server.clone(), server.new_session(Some(peer)))
    }

    fn with_session(server: Arc<Server<F>>, session: Arc<Session>) -> Self {
        Connection {
            server,
            session,
            input: Vec::new(),
            filled: 0,
            input_charge: None,
            parked: None,
            in_flight: FuturesUnordered::new(),
            tags: BTreeMap::new(),
            version: Version::Idle,
            output: VecDeque::new(),
            sent: 0,
            closing: None,
            throttled: false,
            tenant_throttled: false,
            cpu: None,
            worker: 0,
            yield_at: None,
        }
    }

    /// Says which worker (CPU, thread) runs the connection: its tenant's CPU share is
    /// compared with the other tenants' on that worker (default 0).
    pub fn on_worker(mut self, worker: usize) -> Self {
        self.worker = worker;
        self
    }

    /// The connection's session (fids, msize).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Requests in flight (flushes not counted).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Why the connection is closing, if it is. A closing connection takes no input;
    /// the transport should send the remaining output, then call
    /// [`Connection::shutdown`].
    pub fn closing(&self) -> Option<CloseReason> {
        self.closing
    }

    /// Whether the connection takes input now.
    pub fn wants_input(&mut self) -> bool {
        if let Some(reason) = self.session.close_requested() {
            self.close(reason);
        }
        if self.closing.is_some() || self.parked.is_some() || !matches!(self.version, Version::Idle)
        {
            return false;
        }
        // Replies not yet taken by the transport count too: a client that sends but
        // never reads cannot make the server queue unbounded replies.
        let outstanding = self.in_flight.len() + self.output.len();
        let below_limit = outstanding < self.server.config().max_in_flight;
        if !below_limit && !self.throttled {
            self.server.counters().in_flight_limit_hits();
        }
        self.throttled = !below_limit;
        let tenant = self.session.tenant();
        let tenant_full = tenant.in_flight_full(self.server.config().tenant.max_in_flight);
        if below_limit && tenant_full && !self.tenant_throttled {
            self.server.counters().tenant_in_flight_waits();
            tenant.in_flight_stopped();
        }
        self.tenant_throttled = tenant_full;
        below_limit && !tenant_full
    }

    /// Space for the next input bytes: the rest of the frame being assembled (or of its
    /// size field). Empty when the connection takes no input now.
    pub fn read_buf(&mut self) -> &mut [u8] {
        if !self.wants_input() {
            return &mut [];
        }
        if self.input.is_empty() {
            self.input.resize(4, 0);
        }
        &mut self.input[self.filled..]
    }

    /// Marks `n` bytes of [`Connection::read_buf`] as received, and starts the request
    /// if its frame is complete.
    pub fn advance(&mut self, n: usize) {
        self.filled += n;
        assert!(self.filled <= self.input.len(), "advanced past read_buf");
        if n > 0 && self.filled >= 4 {
            // Bytes of a frame arrived: whatever waits for the rest has waited since now.
            let now = self.server.now();
            self.session.note(|a| a.input_stalled_since = Some(now));
        }
        if self.filled == 4 && self.input.len() == 4 {
            let size = wire::frame_size(&self.input).unwrap_or(0);
            let max = self.session.msize();
            if (size as usize) < HEADER_LEN || size > max {
                self.server.counters().bad_frame_sizes();
                log::debug!(
                    "9p: conn {}: frame size {size} (msize {max})",
                    self.session.id()
                );
                self.close(CloseReason::BadFrameSize(size));
                return;
            }
            if !self.try_grow_input(size) {
                self.parked = Some(Parked::Frame { size });
            }
        }
        if self.filled == self.input.len() && self.filled > 4 {
            let frame = core::mem::take(&mut self.input);
            let charge = self
                .input_charge
                .take()
                .expect("a complete frame was charged");
            self.filled = 0;
            self.start(frame, charge);
        }
    }

    /// Charges and allocates room for a frame of `size` bytes whose size field has
    /// arrived; false (counted) when memory is short.
    fn try_grow_input(&mut self, size: u32) -> bool {
        let size = size as usize;
        let charge = match self.session.account().charge(Use::Frames, size) {
            Ok(c) => c,
            Err(r) => {
                self.memory_refused(r);
                return false;
            }
        };
        if self
            .input
            .try_reserve_exact(size - self.input.len())
            .is_err()
        {
            // The budget allowed it but the heap is short: wait like for the budget.
            self.server.counters().memory_waits();
            return false;
        }
        self.input.resize(size, 0);
        self.input_charge = Some(charge);
        true
    }

    /// Counts a refused charge that stops input, and asks the server to reclaim memory
    /// when this connection holds less than its share.
    fn memory_refused(&self, r: Refused) {
        self.server.counters().memory_waits();
        log::debug!("9p: conn {}: waiting for memory: {r}", self.session.id());
        self.server.reclaim_for(&self.session, r);
    }

    /// Takes input from `bytes` (copying it); returns how many bytes were taken, which is
    /// fewer than offered when the connection stops taking input.
    pub fn receive(&mut self, mut bytes: &[u8]) -> usize {
        let total = bytes.len();
        while !bytes.is_empty() {
            let buf = self.read_buf();
            if buf.is_empty() {
                break;
            }
            let n = buf.len().min(bytes.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.advance(n);
        }
        total - bytes.len()
    }

    fn close(&mut self, reason: CloseReason) {
        let reason = match self.closing {
            Some(first) if !first.overridden_by(reason) => first,
            _ => reason,
        };
        self.closing = Some(reason);
        self.input = Vec::new();
        self.input_charge = None;
        self.parked = None;
        self.filled = 0;
        if reason.drops_output() {
            self.output.clear();
            self.sent = 0;
        }
    }

    /// Starts one complete frame, `charge` paying for its bytes.
    fn start(&mut self, frame: Vec<u8>, charge: Charge) {
        let header = Header::peek(&frame).expect("frame has a header");
        let tag = header.tag;
        if self.tags.contains_key(&tag) {
            self.server.counters().duplicate_tags();
            log::debug!("9p: conn {}: duplicate tag {tag}", self.session.id());
            self.close(CloseReason::DuplicateTag(tag));
            return;
        }
        let received = self.server.received(header.ty);
        match TmsgType::from_byte(header.ty) {
            Some(TmsgType::Version) => match Tmsg::decode(&frame) {
                Ok((_, Tmsg::Version { msize, version })) => {
                    let flushers = vec![];
                    self.tags
                        .insert(tag, TagState::Request { flushers, received });
                    self.version = Version::Waiting {
                        tag,
                        msize,
                        version: version.to_vec(),
                    };
                }
                _ => self.malformed(tag, received),
            },
            Some(TmsgType::Flush) => match Tmsg::decode(&frame) {
                Ok((_, Tmsg::Flush { oldtag })) => self.flush(tag, oldtag, received),
                _ => self.malformed(tag, received),
            },
            _ => self.spawn_or_park(frame, charge, received),
        }
    }

    /// Starts a request if its reply can be charged, else parks it until memory is
    /// given back.
    fn spawn_or_park(&mut self, frame: Vec<u8>, frame_charge: Charge, received: Received) {
        let bound = match Tmsg::decode(&frame) {
            Ok((_, msg)) => wire::reply_bound(&msg, self.session.msize()),
            // The handler answers it with an error.
            Err(_) => wire::SMALL_REPLY,
        };
        let mut reply_charge = match self.session.account().charge(Use::Replies, bound) {
            Ok(c) => c,
            Err(r) => {
                self.memory_refused(r);
                self.parked = Some(Parked::Request {
                    frame,
                    charge: frame_charge,
                    received,
                });
                return;
            }
        };
        let tag = Header::peek(&frame).expect("frame has a header").tag;
        let flushers = vec![];
        self.tags
            .insert(tag, TagState::Request { flushers, received });
        let now = self.server.now();
        let outstanding = self.outstanding() + 1;
        self.session.note(|a| {
            a.last = now;
            a.outstanding = outstanding;
        });
        let (server, session) = (self.server.clone(), self.session.clone());
        let in_flight = session.tenant().enter();
        self.in_flight.push(Box::pin(async move {
            let mut out = server.handle(&session, &frame).await;
            drop((frame, frame_charge, in_flight));
            // A reply built in place may be shorter than the room it was given.
            if out.capacity() > out.len() + out.len() / 4 {
                out.shrink_to_fit();
            }
            reply_charge.shrink_to(out.capacity());
            (
                tag,
                Reply {
                    frame: out,
                    _charge: Some(reply_charge),
                },
            )
        }));
    }

    /// Requests in flight plus replies not yet sent.
    fn outstanding(&self) -> usize {
        self.in_flight.len() + self.output.len()
    }

    /// Retries the input parked for memory; `cx` is woken when memory is given back if it
    /// still does not fit.
    fn unpark(&mut self, cx: &mut Context<'_>) {
        if self.parked.is_none() {
            return;
        }
        // Registered before the retry, not after it fails: memory given back in between
        // (by a connection on another CPU) then wakes this task (see `Budget::wait`).
        self.session.account().budget().wait(cx.waker());
        match self.parked.take() {
            None => {}
            Some(Parked::Frame { size }) if !self.try_grow_input(size) => {
                self.parked = Some(Parked::Frame { size });
            }
            Some(Parked::Frame { .. }) => {}
            Some(Parked::Request {
                frame,
                charge,
                received,
            }) => self.spawn_or_park(frame, charge, received),
        }
    }

    fn malformed(&mut self, tag: u16, received: Received) {
        self.server.counters().decode_errors();
        self.server.counters().error_replies();
        self.queue(Reply::uncharged(lerror(tag, vfs::Errno::EPROTO)));
        self.server.answered(received);
    }

    /// Queues a reply to be sent.
    fn queue(&mut self, reply: Reply) {
        if self.output.is_empty() {
            let now = self.server.now();
            self.session.note(|a| a.output_stalled_since = Some(now));
        }
        self.output.push_back(reply);
    }

    fn flush(&mut self, tag: u16, oldtag: u16, received: Received) {
        self.server.counters().flushes();
        let target = match self.tags.get(&oldtag) {
            Some(TagState::Request { .. }) => oldtag,
            // Flushing a flush waits for what that flush waits for.
            Some(TagState::Flush { target, .. }) => *target,
            None => {
                self.queue(Reply::uncharged(reply(tag, &Rmsg::Flush {})));
                self.server.answered(received);
                return;
            }
        };
        if let Some(TagState::Request { flushers, .. }) = self.tags.get_mut(&target) {
            flushers.push(tag);
        }
        self.tags.insert(tag, TagState::Flush { target, received });
    }

    /// Queues a finished request's reply, then the `Rflush`es waiting for it.
    fn complete(&mut self, tag: u16, frame: Reply) {
        if matches!(self.version, Version::Running) {
            self.version = Version::Idle;
        }
        let (flushers, received) = match self.tags.remove(&tag) {
            Some(TagState::Request { flushers, received }) => (flushers, Some(received)),
            other => {
                debug_assert!(false, "completion for tag {tag} in state {other:?}");
                (Vec::new(), None)
            }
        };
        if self.closing.is_some_and(CloseReason::drops_output) {
            return;
        }
        self.queue(frame);
        if let Some(received) = received {
            self.server.answered(received);
        }
        if !flushers.is_empty() {
            self.server.counters().flushed_replies_sent();
        }
        for f in flushers {
            let flush = self.tags.remove(&f);
            self.queue(Reply::uncharged(reply(f, &Rmsg::Flush {})));
            if let Some(TagState::Flush { received, .. }) = flush {
                self.server.answered(received);
            }
        }
        let (now, outstanding) = (self.server.now(), self.outstanding());
        self.session.note(|a| {
            a.last = now;
            a.outstanding = outstanding;
        });
    }

    /// Polls the in-flight requests, queueing the replies of those that finish. Ready
    /// when nothing is in flight; otherwise the waker is registered with every request.
    pub fn poll_requests(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.session.register_waker(cx.waker());
        if let Some(reason) = self.session.close_requested() {
            self.close(reason);
        }
        if self.closing.is_none() {
            self.unpark(cx);
        }
        if self.tenant_throttled {
            // Registered, then checked again: a request of the tenant that completed on
            // another CPU before the registration is seen here, and the task polls again.
            let tenant = self.session.tenant();
            tenant.wait_in_flight(cx.waker());
            if !tenant.in_flight_full(self.server.config().tenant.max_in_flight) {
                self.tenant_throttled = false;
                cx.waker().wake_by_ref();
            }
        }
        loop {
            if self.in_flight.is_empty() {
                if let Version::Waiting { .. } = self.version {
                    let Version::Waiting {
                        tag,
                        msize,
                        version,
                    } = core::mem::replace(&mut self.version, Version::Running)
                    else {
                        unreachable!()
                    };
                    let (server, session) = (self.server.clone(), self.session.clone());
                    self.in_flight.push(Box::pin(async move {
                        let frame = server.version(&session, tag, msize, &version).await;
                        (tag, Reply::uncharged(frame))
                    }));
                }
            }
            match self.in_flight.poll_next_unpin(cx) {
                Poll::Ready(Some((tag, frame))) => {
                    self.complete(tag, frame);
                    if self.past_quantum() {
                        // The rest are served at the task's next turn.
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Whether the task has used its quantum of this turn.
    fn past_quantum(&self) -> bool {
        self.yield_at.is_some_and(|t| self.server.now() >= t)
    }

    /// The bytes to send next (empty if none).
    pub fn output(&self) -> &[u8] {
        self.output.front().map_or(&[], |r| &r.frame[self.sent..])
    }

    /// Marks `n` bytes of [`Connection::output`] as sent.
    pub fn consume_output(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.sent += n;
        if let Some(front) = self.output.front() {
            assert!(self.sent <= front.frame.len(), "consumed past output");
            if self.sent == front.frame.len() {
                self.output.pop_front();
                self.sent = 0;
            }
        }
        self.output_progressed();
    }

    /// Takes the next whole reply frame (for transports that take ownership of buffers).
    /// Must not be mixed with a partially consumed [`Connection::output`].
    pub fn take_output(&mut self) -> Option<Vec<u8>> {
        debug_assert_eq!(self.sent, 0);
        let frame = self.output.pop_front().map(|r| r.frame);
        self.output_progressed();
        frame
    }

    /// The client took output: what still waits has waited since now.
    fn output_progressed(&mut self) {
        let since = (!self.output.is_empty()).then(|| self.server.now());
        let outstanding = self.outstanding();
        self.session.note(|a| {
            a.output_stalled_since = since;
            a.outstanding = outstanding;
        });
    }

    /// Tears the connection down: waits for the requests in flight (their replies are
    /// dropped), then clunks every fid, releasing open files and locks.
    pub async fn shutdown(mut self) {
        self.output.clear();
        self.parked = None;
        while self.in_flight.next().await.is_some() {}
        self.server.close(&self.session).await;
    }

    /// Serves the connection over `io` until the peer closes (`Ok(None)`), the transport
    /// fails, or the server closes it (`Ok(Some(reason))`: a protocol violation, or the
    /// server shedding it), then [`Connection::shutdown`]s.
    ///
    /// Each poll is a *turn* of at most a quantum ([`crate::server::Config::cpu_quantum_ns`]),
    /// taken when the tenant's CPU share allows
    /// ([`CpuShare`](crate::server::tenant::CpuShare)): else the turn is let go.
    pub async fn run<T: Transport>(mut self, io: &mut T) -> Result<Option<CloseReason>, T::Error> {
        let mut staging = Staging {
            buf: vec![0u8; STAGING],
            from: 0,
            to: 0,
        };
        let quantum = self.server.config().cpu_quantum_ns;
        let cpu = CpuWaker::new(
            self.server.tenants().clone(),
            self.session.tenant().clone(),
            self.worker,
        );
        self.cpu = Some(cpu.clone());
        let result = poll_fn(|cx| {
            let waker = cpu.wrap(cx.waker());
            let cx = &mut Context::from_waker(&waker);
            cpu.runnable();
            if !cpu.may_serve() && self.closing.is_none() {
                // Another tenant waits for this worker and is behind: it goes first.
                self.server.counters().cpu_deferrals();
                io.yield_cpu(cx);
                return Poll::Pending;
            }
            let started = self.server.now();
            self.yield_at = Some(started.saturating_add(quantum));
            let turn = self.turn(io, cx, &mut staging);
            cpu.used(self.server.now().saturating_sub(started));
            match turn {
                Turn::Yielded => {
                    // Out of budget or quantum: let other connections run, then continue.
                    io.yield_cpu(cx);
                    Poll::Pending
                }
                Turn::Waiting => {
                    cpu.idle();
                    Poll::Pending
                }
                Turn::Done(result) => {
                    cpu.idle();
                    Poll::Ready(result)
                }
            }
        })
        .await;
        if let Ok(Some(reason)) = result {
            log::debug!("9p: conn {}: closed: {reason:?}", self.session.id());
        }
        self.shutdown().await;
        result
    }

    /// One turn of [`Connection::run`]: moves bytes and serves requests until nothing
    /// can progress (waiting for the client or the filesystem), the connection ends, or
    /// the turn's budget or quantum is used up with work left.
    fn turn<T: Transport>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
        staging: &mut Staging,
    ) -> Turn<T::Error> {
        for _ in 0..BUDGET {
            let mut progress = false;
            if staging.from < staging.to {
                let n = self.receive(&staging.buf[staging.from..staging.to]);
                staging.from += n;
                progress |= n > 0;
            }
            let parked = self.parked.is_some();
            let _ = self.poll_requests(cx);
            // Input parked for memory was resumed: bytes already staged may now be
            // taken. That is progress, or the task would sleep with them unread,
            // waiting for a client that sent everything (issue 26).
            progress |= parked && self.parked.is_none();
            let mut wrote = false;
            while !self.output().is_empty() {
                match io.poll_write(cx, self.output()) {
                    Poll::Ready(Ok(0)) => return Turn::Done(Ok(None)),
                    Poll::Ready(Ok(n)) => {
                        self.consume_output(n);
                        progress = true;
                        wrote = true;
                    }
                    Poll::Ready(Err(e)) => return Turn::Done(Err(e)),
                    Poll::Pending => break,
                }
            }
            if wrote {
                io.flush();
            }
            if let Some(reason) = self.closing {
                let answered = !reason.finishes_requests() || self.in_flight.is_empty();
                if self.output().is_empty() && answered {
                    return Turn::Done(Ok(Some(reason)));
                }
            }
            if staging.from == staging.to && self.wants_input() {
                let direct = self.read_buf().len() >= DIRECT_READ_MIN;
                let buf = if direct {
                    self.read_buf()
                } else {
                    &mut staging.buf[..]
                };
                match io.poll_read(cx, buf) {
                    Poll::Ready(Ok(0)) => return Turn::Done(Ok(None)),
                    Poll::Ready(Ok(n)) if direct => {
                        self.advance(n);
                        progress = true;
                    }
                    Poll::Ready(Ok(n)) => {
                        (staging.from, staging.to) = (0, n);
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => return Turn::Done(Err(e)),
                    Poll::Pending => {}
                }
            }
            if !progress {
                return Turn::Waiting;
            }
            if self.past_quantum() {
                self.server.counters().cpu_yields();
                break;
            }
        }
        Turn::Yielded
    }
}
