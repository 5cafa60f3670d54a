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
//! Each accepted connection is handed whole to one CPU (`serve_cpus=`, default every CPU
//! online): the one serving fewest connections, CPU 0's counting double because it also
//! runs the network stack (`super::limits::least_loaded_cpu`). Its
//! task is spawned there (`smp::spawn_on`), and its fid table, request futures and
//! replies live there for its whole life; it shares with the other CPUs only what every
//! connection shares — the server ([`Server`]: locks, memory budget, sessions), the
//! filesystem, and the stack's socket table, whose socket it uses through its own cell
//! while the stack's poll task, on the CPU of the NIC's interrupt, moves its frames.
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
use core::sync::atomic::{AtomicBool, Ordering};
use core::task::Poll;
use core::time::Duration;

use super::sockets::SockId;
use ninep::conn::{CloseReason, Connection};
use ninep::server::Server;
use smoltcp::socket::tcp::{self, State};
use vfs::FileSystem;

use super::limits::{least_loaded_cpu, BURST_HOLD, LISTEN_POOL};
use super::stack::Stack;
use super::stats::ServiceStats;
use super::tcp::TcpTransport;
use crate::config::CpuMask;
use crate::exec::IrqEvent;
use crate::hal::percpu::{self, MAX_CPUS};
use crate::{clock, smp, task};

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

/// The 9P service on one TCP port: the listener's state, on the CPU that runs it. See
/// the module documentation.
pub struct Service<F: FileSystem + 'static> {
    conns: Arc<Conns<F>>,
    port: u16,
    buffer: usize,
    max_conns: usize,
    /// The CPUs that may serve connections (`serve_cpus=`); `None`: every CPU online.
    serve_cpus: Option<CpuMask>,
    /// Clients the SYN gate held back and that are expected to retransmit: the pool keeps
    /// a listening socket for each ([`Service::plan_burst`]).
    burst: Cell<usize>,
    /// When the SYN gate last held a request back.
    burst_seen: Cell<Duration>,
    /// Wakes the listener to stop.
    stop: IrqEvent,
}

/// What the listener shares with the connection tasks it hands to CPUs.
struct Conns<F> {
    stack: Arc<Stack>,
    server: Arc<Server<F>>,
    stats: Arc<ServiceStats>,
    /// Signalled when a connection task ends (the pool may grow again).
    ended: IrqEvent,
    /// Signalled when a connection task ends, for [`Service::drain`].
    drained: IrqEvent,
    /// [`Service::stop_listening`] was called.
    stopping: AtomicBool,
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
    /// serving up to `max_conns` connections on the CPUs of `serve_cpus` (`None`: every
    /// CPU online).
    pub fn new(
        stack: Arc<Stack>,
        server: Arc<Server<F>>,
        port: u16,
        buffer: usize,
        max_conns: usize,
        serve_cpus: Option<CpuMask>,
    ) -> Rc<Self> {
        Rc::new(Service {
            conns: Arc::new(Conns {
                stack,
                server,
                stats: Arc::default(),
                ended: IrqEvent::new(),
                drained: IrqEvent::new(),
                stopping: AtomicBool::new(false),
            }),
            port,
            buffer,
            max_conns,
            serve_cpus,
            burst: Cell::new(0),
            burst_seen: Cell::new(Duration::ZERO),
            stop: IrqEvent::new(),
        })
    }

    /// The connection counters.
    pub fn stats(&self) -> &ServiceStats {
        &self.conns.stats
    }

    /// The 9P server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.conns.server
    }

    /// The network stack it listens on.
    pub fn stack(&self) -> &Arc<Stack> {
        &self.conns.stack
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
            self.conns.stats.listen_errors.inc();
            return None;
        }
        Some(self.conns.stack.add(s))
    }

    /// The CPU to serve a new connection: of those `serve_cpus=` names and that are
    /// online, the one serving fewest; CPU 0 when none is.
    fn serving_cpu(&self) -> usize {
        let stats = &self.conns.stats;
        let candidates = (0..MAX_CPUS)
            .filter(|&cpu| smp::is_online(cpu))
            .filter(|&cpu| self.serve_cpus.is_none_or(|m| m.contains(cpu)))
            .map(|cpu| (cpu, stats.cpu(cpu).active()));
        least_loaded_cpu(candidates).unwrap_or(0)
    }

    /// Stops accepting connections: the listener closes its pool (a client caught
    /// mid-handshake is reset) and ends.
    pub fn stop_listening(&self) {
        self.conns.stopping.store(true, Ordering::Release);
        self.stop.signal();
    }

    /// Lets as many connection requests through as the pool has sockets listening;
    /// those past it are held back until the pool is refilled (`super::syn_gate`).
    fn arm_syn_gate(&self, pool: &[SockId]) {
        let listening = pool.iter().filter(|&&h| self.listening(h)).count();
        self.conns.stack.syn_gate().arm(self.port, listening);
    }

    /// Frees the pool's sockets, resetting those a client has reached.
    async fn close_pool(&self, pool: Vec<SockId>) {
        // Nothing will listen again: clients are refused at once.
        self.conns.stack.syn_gate().open();
        for h in pool {
            if self.listening(h) {
                self.conns.stack.remove(h);
            } else {
                self.conns.stack.reset_and_remove(h).await;
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
            asked: self.conns.server.shut_down() as u64,
            shed: 0,
        };
        if task::timeout(grace, self.all_ended()).await.is_err() {
            done.shed = self.conns.server.shut_down_now() as u64;
            self.all_ended().await;
        }
        done
    }

    /// Completes when no connection task is left.
    async fn all_ended(&self) {
        while self.conns.stats.active() > 0 {
            self.conns.drained.wait().await;
        }
    }

    /// Takes the pool sockets a client has connected to out of the pool.
    fn accept(&self, pool: &mut Vec<SockId>) -> Vec<SockId> {
        let mut accepted = Vec::new();
        pool.retain(|&h| match self.conns.stack.peek_tcp(h, |s| s.state()) {
            State::Listen | State::SynReceived => true,
            State::Closed => {
                // A handshake that was reset or timed out: listen again.
                if self
                    .conns
                    .stack
                    .with_tcp(h, |s| s.listen(self.port))
                    .is_err()
                {
                    self.conns.stack.remove(h);
                    return false;
                }
                true
            }
            _ => {
                accepted.push(h);
                false
            }
        });
        accepted
    }

    /// Whether pool socket `h` is still waiting for a client.
    fn listening(&self, h: SockId) -> bool {
        self.conns.stack.peek_tcp(h, |s| s.state()) == State::Listen
    }

    /// Whether the client of a just-accepted socket may stay: some export allows its
    /// address (`ninep::server::Server::admit`, which counts refusals). If not, the
    /// connection is reset and the socket freed.
    async fn admitted(&self, handle: SockId) -> bool {
        let peer = self.conns.stack.peek_tcp(handle, |s| s.remote_endpoint());
        if self.conns.server.admit(peer.map(|ep| ip_of(ep.addr))) {
            return true;
        }
        log::debug!("9p: {peer:?} refused: no export allows its address");
        self.conns.stack.reset_and_remove(handle).await;
        false
    }

    /// Resets a client that connected at the connection limit, when no slot could be
    /// reclaimed for it.
    async fn refuse(&self, handle: SockId) {
        self.conns.stats.refused.inc();
        let peer = self.conns.stack.peek_tcp(handle, |s| s.remote_endpoint());
        log::warn!(
            "9p: {peer:?}: refused: {} connections open, none idle",
            self.conns.stats.active()
        );
        self.conns.stack.reset_and_remove(handle).await;
    }

    /// Counts the clients the SYN gate held back: they retransmit (Linux after 1, 3, 7, 15
    /// s), so the pool keeps a listening socket for each until [`BURST_HOLD`] has passed
    /// without one held back. A retransmission held back again counts again, which only
    /// makes the pool larger for a while; the connection limit bounds it.
    fn plan_burst(&self) {
        let held = self.conns.stack.syn_gate().take_held();
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
            .saturating_sub(self.conns.stats.active() as usize)
            .min(LISTEN_POOL + self.burst.get());
        while pool.len() < allowance {
            match self.listener() {
                Some(h) => pool.push(h),
                None => break,
            }
        }
        while pool.len() > allowance {
            let Some(i) = pool.iter().position(|&h| self.listening(h)) else {
                break;
            };
            self.conns.stack.remove(pool.swap_remove(i));
        }
    }

    /// Applies the server's deadlines every [`SWEEP_INTERVAL`], for as long as the
    /// appliance runs.
    pub async fn housekeeping(self: Rc<Self>) {
        loop {
            task::sleep(SWEEP_INTERVAL).await;
            self.conns.server.sweep();
        }
    }

    /// Logs the counters every [`STATS_INTERVAL`] when they changed.
    pub async fn report(self: Rc<Self>) {
        let mut last = (u64::MAX, 0, 0, 0);
        loop {
            task::sleep(STATS_INTERVAL).await;
            let s = &self.conns.stats;
            let now = (s.accepted.get(), s.closed.get(), s.rx_bytes(), s.tx_bytes());
            if now != last {
                last = now;
                self.log_stats();
            }
        }
    }

    /// Logs the service's, the 9P server's and the NIC's counters.
    pub fn log_stats(&self) {
        let p = self.conns.server.stats();
        log::info!("9p: stats: connections: {}", self.conns.stats);
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
            self.conns.stack.nic_stats(),
            self.conns.stack.polls()
        );
    }
}

/// What takes a connection to another CPU: there the filesystem and the server are
/// shared, so they must be `Send + Sync`.
impl<F: FileSystem + Send + Sync + 'static> Service<F> {
    /// The listener: runs until [`Service::stop_listening`].
    pub async fn run(self: Rc<Self>) {
        let mut pool: Vec<SockId> = Vec::new();
        loop {
            if self.conns.stopping.load(Ordering::Acquire) {
                self.close_pool(pool).await;
                return;
            }
            self.conns.ended.take();
            let accepted = self.accept(&mut pool);
            for handle in accepted {
                if !self.admitted(handle).await {
                    continue;
                }
                if self.conns.stats.active() as usize >= self.max_conns
                    && !self.conns.server.reclaim_slot()
                {
                    self.refuse(handle).await;
                    continue;
                }
                self.hand_off(handle);
            }
            self.plan_burst();
            self.resize_pool(&mut pool);
            self.arm_syn_gate(&pool);
            if pool.is_empty() && self.conns.stats.active() == 0 {
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
                for &h in &pool {
                    self.conns
                        .stack
                        .peek_tcp(h, |s| s.register_recv_waker(cx.waker()));
                }
                self.conns.stack.syn_gate().register_listener(cx.waker());
                let ended = core::pin::pin!(self.conns.ended.wait()).poll(cx);
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

    /// Hands the accepted connection on socket `handle` to the CPU that serves fewest
    /// connections (of `serve_cpus=`; CPU 0's count double), where its task runs until
    /// the socket is freed.
    fn hand_off(&self, handle: SockId) {
        let cpu = self.serving_cpu();
        self.conns.stats.accepted.inc();
        self.conns.stats.cpu(cpu).accepted.inc();
        let conns = self.conns.clone();
        let serve = move || conns.serve(handle, cpu);
        if cpu == percpu::index() {
            task::spawn(serve());
        } else if let Err(e) = smp::spawn_on(cpu, serve) {
            // Chosen among the CPUs online, which never go offline: the client is reset.
            log::error!("9p: a connection handed to CPU {}, which is offline", e.0);
            self.conns.stats.cpu(cpu).closed.inc();
            self.conns.stats.closed.inc();
            let stack = self.conns.stack.clone();
            task::spawn(async move { stack.reset_and_remove(handle).await });
        }
    }
}

impl<F: FileSystem + Send + Sync + 'static> Conns<F> {
    /// One client connection, from accept to the socket's release.
    async fn serve(self: Arc<Self>, handle: SockId, cpu: usize) {
        let mut io = TcpTransport::new(self.stack.clone(), handle, self.stats.clone());
        let peer = io.with(|s| s.remote_endpoint());
        let conn = match peer {
            Some(ep) => Connection::from_peer(self.server.clone(), ip_of(ep.addr)),
            None => Connection::new(self.server.clone()),
        };
        let id = conn.session().id();
        log::debug!("9p: conn {id}: accepted from {peer:?}, served on CPU {cpu}");
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
        self.stack.remove(handle);
        self.stats.cpu(cpu).closed.inc();
        self.stats.closed.inc();
        log::info!(
            "9p: conn {id}: {how} (served on CPU {cpu}; rx {} B, tx {} B); {} active",
            io.rx_bytes(),
            io.tx_bytes(),
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
        let stopping = self.stopping.load(Ordering::Acquire);
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
}

/// A smoltcp address as a `core::net` one.
fn ip_of(addr: smoltcp::wire::IpAddress) -> core::net::IpAddr {
    match addr {
        smoltcp::wire::IpAddress::Ipv4(a) => core::net::IpAddr::V4(a),
    }
}
