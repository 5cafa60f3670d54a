//! The 9P service: a TCP listener and one task per client connection.
//!
//! smoltcp has no accept queue: a listening socket becomes the connection. So the
//! listener keeps a pool of [`LISTEN_POOL`] listening sockets on the port; each one a
//! client connects to is handed to a new connection task and replaced, and the NIC's
//! SYN gate (`super::syn_gate`) holds back the connection requests of a burst larger than
//! the pool until it is refilled, so clients connecting at the same time are all accepted. A client that connects while the
//! connection limit (`max_conns=`) is reached takes the slot of the quietest connection
//! without fids (`Server::reclaim_slot`: an idle flood cannot keep mounts out), or, if
//! there is none, is refused (reset). The pool stays open at the limit for that, and
//! stops only at the hard cap of [`LISTEN_POOL`] connections beyond the limit (slots
//! given away whose old connection is still closing).
//!
//! A connection task runs [`Connection::run`] over a [`TcpTransport`]; when the peer
//! closes or resets, or the server closes after a protocol violation, `run` lets the
//! requests in flight finish and releases the connection's fids and locks. The task then
//! closes the socket (FIN after the queued replies), waits for the close to finish (at
//! most [`CLOSE_TIMEOUT`], else aborts) and frees it. A connection the server sheds
//! (deadline passed, memory or slot reclaimed) is reset at once: its client is not
//! reading, or has nothing to say.
//!
//! A housekeeping task applies the server's deadlines every [`SWEEP_INTERVAL`]
//! (`Server::sweep`: handshake and idle timeouts).
//!
//! At shutdown (`crate::shutdown`), [`Service::stop_listening`] closes the pool and ends
//! the listener, and [`Service::drain`] asks every connection to close politely
//! (`Server::shut_down`: no new request is read, those in flight are answered, then
//! FIN), sheds those still open after a grace time (`Server::shut_down_now`) and waits
//! until every connection task has ended, so no request is left running on the
//! filesystem.

use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::Cell;
use core::future::{poll_fn, Future};
use core::task::Poll;
use core::time::Duration;

use super::sockets::SockId;
use ninep::conn::{CloseReason, Connection};
use ninep::server::Server;
use smoltcp::socket::tcp::{self, State};
use vfs::FileSystem;

use super::limits::{BURST_HOLD, LISTEN_POOL};
use super::stack::Stack;
use super::stats::ServiceStats;
use super::tcp::TcpTransport;
use crate::exec::IrqEvent;
use crate::{clock, task};

/// How long a closing connection may take to finish its FIN handshake.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Keep-alive probes on idle connections, so a vanished client is noticed...
pub const KEEP_ALIVE: Duration = Duration::from_secs(60);
/// ...and reset after this long without an answer.
pub const DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(180);
/// How often the counters are logged (when they changed).
pub const STATS_INTERVAL: Duration = Duration::from_secs(10);
/// How often the server's deadlines are checked.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The 9P service on one TCP port. See the module documentation.
pub struct Service<F: FileSystem + 'static> {
    stack: Rc<Stack>,
    server: Arc<Server<F>>,
    port: u16,
    buffer: usize,
    max_conns: usize,
    stats: Rc<ServiceStats>,
    /// Signalled when a connection task ends (the pool may grow again).
    ended: IrqEvent,
    /// Signalled when a connection task ends, for [`Service::drain`].
    drained: IrqEvent,
    /// [`Service::stop_listening`] was called.
    stopping: Cell<bool>,
    /// Clients the SYN gate held back and that are expected to retransmit: the pool keeps
    /// a listening socket for each ([`Service::plan_burst`]).
    burst: Cell<usize>,
    /// When the SYN gate last held a request back.
    burst_seen: Cell<Duration>,
    /// Wakes the listener to stop.
    stop: IrqEvent,
}

/// What [`Service::drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Connections asked to close politely.
    pub asked: u64,
    /// ... of which were shed after the grace time.
    pub shed: u64,
}

impl<F: FileSystem + 'static> core::fmt::Debug for Service<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Service")
            .field("port", &self.port)
            .field("buffer", &self.buffer)
            .finish()
    }
}

impl<F: FileSystem + 'static> Service<F> {
    /// A service for `server` on TCP `port`, with `buffer`-byte socket buffers each way,
    /// serving up to `max_conns` connections.
    pub fn new(
        stack: Rc<Stack>,
        server: Arc<Server<F>>,
        port: u16,
        buffer: usize,
        max_conns: usize,
    ) -> Rc<Self> {
        Rc::new(Service {
            stack,
            server,
            port,
            buffer,
            max_conns,
            stats: Rc::new(ServiceStats::default()),
            ended: IrqEvent::new(),
            drained: IrqEvent::new(),
            stopping: Cell::new(false),
            burst: Cell::new(0),
            burst_seen: Cell::new(Duration::ZERO),
            stop: IrqEvent::new(),
        })
    }

    /// The connection counters.
    pub fn stats(&self) -> &ServiceStats {
        &self.stats
    }

    /// The 9P server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    /// The network stack it listens on.
    pub fn stack(&self) -> &Rc<Stack> {
        &self.stack
    }

    /// A new socket listening on the port.
    fn listener(&self) -> Option<SockId> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; self.buffer]),
            tcp::SocketBuffer::new(vec![0u8; self.buffer]),
        );
        // Replies go out as soon as they are complete: no Nagle delay on small replies.
        s.set_nagle_enabled(false);
        s.set_keep_alive(Some(KEEP_ALIVE.into()));
        s.set_timeout(Some(DEAD_PEER_TIMEOUT.into()));
        if let Err(e) = s.listen(self.port) {
            log::error!("9p: listen on port {}: {e:?}", self.port);
            self.stats.listen_errors.inc();
            return None;
        }
        Some(self.stack.sockets.borrow_mut().add(s))
    }

    /// The listener: runs until [`Service::stop_listening`].
    pub async fn run(self: Rc<Self>) {
        let mut pool: Vec<SockId> = Vec::new();
        loop {
            if self.stopping.get() {
                self.close_pool(pool).await;
                return;
            }
            self.ended.take();
            let accepted = self.accept(&mut pool);
            for handle in accepted {
                if !self.admitted(handle).await {
                    continue;
                }
                if self.stats.active() as usize >= self.max_conns && !self.server.reclaim_slot() {
                    self.refuse(handle).await;
                    continue;
                }
                self.stats.accepted.inc();
                task::spawn(self.clone().connection(handle));
            }
            self.plan_burst();
            self.resize_pool(&mut pool);
            self.arm_syn_gate(&pool);
            if pool.is_empty() && self.stats.active() == 0 {
                // Cannot listen at all: nothing will wake us but a retry.
                task::sleep(Duration::from_secs(1)).await;
                continue;
            }
            // Sleep until a pool socket changes state or a connection ends.
            let mut registered = false;
            poll_fn(|cx| {
                if registered {
                    return Poll::Ready(());
                }
                registered = true;
                let mut sockets = self.stack.sockets.borrow_mut();
                for &h in &pool {
                    sockets
                        .get_mut::<tcp::Socket>(h)
                        .register_recv_waker(cx.waker());
                }
                self.stack.syn_gate.register_listener(cx.waker());
                let ended = core::pin::pin!(self.ended.wait()).poll(cx);
                let stop = core::pin::pin!(self.stop.wait()).poll(cx);
                if ended.is_ready() || stop.is_ready() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }

    /// Stops accepting connections: the listener closes its pool (a client caught
    /// mid-handshake is reset) and ends.
    pub fn stop_listening(&self) {
        self.stopping.set(true);
        self.stop.signal();
    }

    /// Lets as many connection requests through as the pool has sockets listening;
    /// those past it are held back until the pool is refilled (`super::syn_gate`).
    fn arm_syn_gate(&self, pool: &[SockId]) {
        let sockets = self.stack.sockets.borrow();
        let listening = pool
            .iter()
            .filter(|&&h| sockets.get::<tcp::Socket>(h).state() == State::Listen)
            .count();
        self.stack.syn_gate.arm(self.port, listening);
    }

    /// Frees the pool's sockets, resetting those a client has reached.
    async fn close_pool(&self, pool: Vec<SockId>) {
        // Nothing will listen again: clients are refused at once.
        self.stack.syn_gate.open();
        for h in pool {
            let listening =
                self.stack.sockets.borrow().get::<tcp::Socket>(h).state() == State::Listen;
            if listening {
                self.stack.sockets.borrow_mut().remove(h);
            } else {
                self.stack.reset_and_remove(h).await;
            }
        }
        log::info!("9p: listener on port {} closed", self.port);
    }

    /// Closes every connection for a shutdown: politely first (requests in flight are
    /// answered), shedding those still open after `grace`; returns once every
    /// connection task has ended (their requests have finished: the filesystem is
    /// idle). The caller bounds the whole with its own deadline.
    pub async fn drain(&self, grace: Duration) -> Drained {
        let mut done = Drained {
            asked: self.server.shut_down() as u64,
            shed: 0,
        };
        if task::timeout(grace, self.all_ended()).await.is_err() {
            done.shed = self.server.shut_down_now() as u64;
            self.all_ended().await;
        }
        done
    }

    /// Completes when no connection task is left.
    async fn all_ended(&self) {
        while self.stats.active() > 0 {
            self.drained.wait().await;
        }
    }

    /// Takes the pool sockets a client has connected to out of the pool.
    fn accept(&self, pool: &mut Vec<SockId>) -> Vec<SockId> {
        let mut sockets = self.stack.sockets.borrow_mut();
        let mut accepted = Vec::new();
        pool.retain(|&h| {
            let s = sockets.get_mut::<tcp::Socket>(h);
            match s.state() {
                State::Listen | State::SynReceived => true,
                State::Closed => {
                    // A handshake that was reset or timed out: listen again.
                    if s.listen(self.port).is_err() {
                        sockets.remove(h);
                        return false;
                    }
                    true
                }
                _ => {
                    accepted.push(h);
                    false
                }
            }
        });
        accepted
    }

    /// Whether the client of a just-accepted socket may stay: some export allows its
    /// address (`ninep::server::Server::admit`, which counts refusals). If not, the
    /// connection is reset and the socket freed.
    async fn admitted(&self, handle: SockId) -> bool {
        let peer = self
            .stack
            .sockets
            .borrow()
            .get::<tcp::Socket>(handle)
            .remote_endpoint();
        if self.server.admit(peer.map(|ep| ip_of(ep.addr))) {
            return true;
        }
        log::debug!("9p: {peer:?} refused: no export allows its address");
        self.stack.reset_and_remove(handle).await;
        false
    }

    /// Resets a client that connected at the connection limit, when no slot could be
    /// reclaimed for it.
    async fn refuse(&self, handle: SockId) {
        self.stats.refused.inc();
        let peer = self
            .stack
            .sockets
            .borrow()
            .get::<tcp::Socket>(handle)
            .remote_endpoint();
        log::warn!(
            "9p: {peer:?}: refused: {} connections open, none idle",
            self.stats.active()
        );
        self.stack.reset_and_remove(handle).await;
    }

    /// Counts the clients the SYN gate held back: they retransmit (Linux after 1, 3, 7, 15
    /// s), so the pool keeps a listening socket for each until [`BURST_HOLD`] has passed
    /// without one held back. A retransmission held back again counts again, which only
    /// makes the pool larger for a while; the connection limit bounds it.
    fn plan_burst(&self) {
        let held = self.stack.syn_gate.take_held();
        let now = clock::uptime();
        if held > 0 {
            let expected = (self.burst.get() + held).min(self.max_conns);
            log::info!(
                "9p: {held} connection request(s) held back: no socket listening; keeping {expected} more listening for them"
            );
            self.burst.set(expected);
            self.burst_seen.set(now);
        } else if self.burst.get() > 0 && now - self.burst_seen.get() > BURST_HOLD {
            self.burst.set(0);
        }
    }

    /// Keeps [`LISTEN_POOL`] sockets listening, plus one per client of a burst still
    /// expected ([`Service::plan_burst`]), while fewer than the limit plus [`LISTEN_POOL`]
    /// connections exist (past the limit, a new client may still take a reclaimed slot).
    fn resize_pool(&self, pool: &mut Vec<SockId>) {
        let allowance = (self.max_conns + LISTEN_POOL)
            .saturating_sub(self.stats.active() as usize)
            .min(LISTEN_POOL + self.burst.get());
        while pool.len() < allowance {
            match self.listener() {
                Some(h) => pool.push(h),
                None => break,
            }
        }
        while pool.len() > allowance {
            let mut sockets = self.stack.sockets.borrow_mut();
            let idle = pool
                .iter()
                .position(|&h| sockets.get::<tcp::Socket>(h).state() == State::Listen);
            let Some(i) = idle else { break };
            sockets.remove(pool.swap_remove(i));
        }
    }

    /// One client connection, from accept to the socket's release.
    async fn connection(self: Rc<Self>, handle: SockId) {
        let mut io = TcpTransport::new(self.stack.clone(), handle, self.stats.clone());
        let peer = io.with(|s| s.remote_endpoint());
        let conn = match peer {
            Some(ep) => Connection::from_peer(self.server.clone(), ip_of(ep.addr)),
            None => Connection::new(self.server.clone()),
        };
        let id = conn.session().id();
        log::debug!("9p: conn {id}: accepted from {peer:?}");
        let (rx0, tx0) = (self.stats.rx_bytes.get(), self.stats.tx_bytes.get());
        let result = conn.run(&mut io).await;
        let state = io.with(|s| s.state());
        let mut shed = false;
        let how = match result {
            Err(e) => {
                self.stats.reset.inc();
                log::warn!("9p: conn {id}: socket error {e:?}");
                "socket error"
            }
            Ok(Some(CloseReason::Shutdown)) => {
                self.stats.shutdown_closed.inc();
                "closed for shutdown"
            }
            Ok(Some(CloseReason::ShutdownNow)) => {
                self.stats.shutdown_shed.inc();
                shed = true;
                "reset for shutdown (grace time over)"
            }
            Ok(Some(reason)) if reason.drops_output() => {
                self.stats.shed.inc();
                shed = true;
                "shed by server"
            }
            Ok(Some(_)) => {
                self.stats.protocol_closed.inc();
                "closed by server (protocol violation)"
            }
            Ok(None) if state == State::Closed => {
                self.stats.reset.inc();
                "reset or timed out"
            }
            Ok(None) => {
                self.stats.peer_closed.inc();
                "closed by peer"
            }
        };
        if shed {
            self.abort(&io).await;
        } else {
            self.close(&io).await;
        }
        self.stack.sockets.borrow_mut().remove(handle);
        self.stats.closed.inc();
        log::info!(
            "9p: conn {id}: {how} (this connection: rx ~{} B, tx ~{} B); {} active",
            self.stats.rx_bytes.get() - rx0,
            self.stats.tx_bytes.get() - tx0,
            self.stats.active()
        );
        self.ended.signal();
        self.drained.signal();
    }

    /// Closes the socket (FIN after the queued data) and waits for the close to finish,
    /// aborting it after [`CLOSE_TIMEOUT`].
    async fn close(&self, io: &TcpTransport) {
        io.with(|s| s.close());
        self.stack.kick();
        // At shutdown, the peer having acknowledged our FIN is enough: every reply has
        // arrived, and its own FIN may come only when its user unmounts.
        let stopping = self.stopping.get();
        let finished = poll_fn(|cx| {
            io.with(|s| match s.state() {
                State::Closed | State::TimeWait => Poll::Ready(()),
                State::FinWait2 if stopping => Poll::Ready(()),
                _ => {
                    s.register_send_waker(cx.waker());
                    Poll::Pending
                }
            })
        });
        if task::timeout(CLOSE_TIMEOUT, finished).await.is_err() {
            self.stats.aborted.inc();
            self.abort(io).await;
        }
    }

    /// Resets the connection (the socket may be freed once this returns).
    async fn abort(&self, io: &TcpTransport) {
        self.stack.reset(io.handle()).await;
    }

    /// Applies the server's deadlines every [`SWEEP_INTERVAL`], for as long as the
    /// appliance runs.
    pub async fn housekeeping(self: Rc<Self>) {
        loop {
            task::sleep(SWEEP_INTERVAL).await;
            self.server.sweep();
        }
    }

    /// Logs the counters every [`STATS_INTERVAL`] when they changed.
    pub async fn report(self: Rc<Self>) {
        let mut last = (u64::MAX, 0, 0, 0);
        loop {
            task::sleep(STATS_INTERVAL).await;
            let s = &self.stats;
            let now = (
                s.accepted.get(),
                s.closed.get(),
                s.rx_bytes.get(),
                s.tx_bytes.get(),
            );
            if now != last {
                last = now;
                self.log_stats();
            }
        }
    }

    /// Logs the service's, the 9P server's and the NIC's counters.
    pub fn log_stats(&self) {
        let p = self.server.stats();
        log::info!("9p: stats: connections: {}", self.stats);
        log::info!(
            "9p: stats: protocol: {} requests, {} error replies, {} undecodable, {} bad frame sizes, {} duplicate tags, {} flushes",
            p.requests,
            p.error_replies,
            p.decode_errors,
            p.bad_frame_sizes,
            p.duplicate_tags,
            p.flushes
        );
        log::info!(
            "9p: stats: nic: {}; {} stack polls",
            self.stack.nic_stats(),
            self.stack.polls()
        );
    }
}

/// A smoltcp address as a `core::net` one.
fn ip_of(addr: smoltcp::wire::IpAddress) -> core::net::IpAddr {
    match addr {
        smoltcp::wire::IpAddress::Ipv4(a) => core::net::IpAddr::V4(a),
    }
}
