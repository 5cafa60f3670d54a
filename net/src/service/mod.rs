//! The serving policy, written once: what happens to a 9P connection from accept to its
//! end, for the appliance (smoltcp sockets served on its CPUs) and `ninefold serve`
//! (tokio streams served on worker threads) alike.
//!
//! Each side supplies only what differs — how its listener accepts, how bytes move and
//! how a socket is closed politely or reset ([`Endpoint`]), how long a task sleeps
//! ([`Runtime`]) and how a task is started on a worker — and keeps its listener; the
//! decisions are here:
//!
//! - **admission** ([`Service::admit`]): some export must allow the client's address
//!   (`Server::admit`); its tenant (`crate::server::tenant`) must hold fewer than
//!   [`ServiceConfig::max_conns_per_tenant`] connections (or give up the slot of its own
//!   quietest connection without fids); at the connection limit a new
//!   client takes the slot of the quietest connection without fids
//!   (`Server::reclaim_slot`: an idle flood cannot keep mounts out) or, if its tenant
//!   holds less than its fair share of the slots, one of the tenant most above its own
//!   (`Server::reclaim_slot_for`), or is refused;
//! - **placement**: the admitted connection is handed whole to the worker serving fewest
//!   ([`placement`]); its fid table, request futures and replies live there for its life;
//! - **a connection's life** ([`Service::serve`]): [`Connection::run`] until the peer
//!   closes or resets or the server closes it, then the close: polite (FIN after the
//!   queued replies, waiting at most [`CLOSE_TIMEOUT`], else a reset) or, for a
//!   connection the server shed (deadline passed, memory or slot reclaimed), a reset at
//!   once — its client is not reading, or has nothing to say;
//! - **deadlines** ([`Service::housekeeping`]: `Server::sweep`, handshake and idle
//!   timeouts, every [`SWEEP_INTERVAL`]);
//! - **shutdown**: [`Service::stop_listening`] ends the listener, [`Service::drain`] asks
//!   every connection to close politely (no new request is read, those in flight are
//!   answered, then FIN), sheds those still open after a grace time and returns once every
//!   connection has ended, so nothing is left running on the filesystem;
//! - **counters** ([`stats`]: per cause, per worker), logged by [`Service::log_stats`].

pub mod placement;
pub mod report;
pub mod stats;

use alloc::sync::Arc;
use core::future::{poll_fn, Future};
use core::net::SocketAddr;
use core::pin::pin;
use core::sync::atomic::{AtomicBool, Ordering};
use core::task::{Context, Poll};
use core::time::Duration;

use vfs::FileSystem;

use crate::conn::{CloseReason, Connection, Transport};
use crate::server::tenant::SlotTicket;
use crate::server::Server;
use crate::sync::Signal;
use stats::ServiceStats;

/// How long a closing connection may take to finish its FIN handshake.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the server's deadlines are checked.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A connection's socket, as the service closes it. Reading and writing are the
/// [`Transport`]'s.
#[allow(async_fn_in_trait)]
pub trait Endpoint: Transport {
    /// Starts a polite close: FIN once the queued replies are sent.
    fn close(&mut self);
    /// Ready once a close started by [`Endpoint::close`] has finished: both sides' FINs
    /// exchanged, or, when `stopping` (a shutdown, whose clients may send theirs only when
    /// their users unmount), ours acknowledged.
    fn poll_closed(&mut self, cx: &mut Context<'_>, stopping: bool) -> Poll<()>;
    /// Resets the connection; the socket may be released once this returns.
    async fn abort(&mut self);
    /// After [`Connection::run`] ended with no reason of the server's: whether the
    /// connection was reset or timed out (no FIN from the peer).
    fn was_reset(&mut self) -> bool;
    /// Bytes received on this connection.
    fn rx_bytes(&self) -> u64;
    /// Bytes sent on this connection.
    fn tx_bytes(&self) -> u64;
    /// Frees the socket: the connection is over.
    fn release(self)
    where
        Self: Sized,
    {
    }
}

/// What the service needs of the executor it runs on.
pub trait Runtime {
    /// Completes after `duration`.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()>;
}

/// `future`, or `Err(TimedOut)` if it has not completed after `duration` on `rt`.
pub async fn timeout<R: Runtime, T>(
    rt: &R,
    duration: Duration,
    future: impl Future<Output = T>,
) -> Result<T, TimedOut> {
    let mut future = pin!(future);
    let mut sleep = pin!(rt.sleep(duration));
    poll_fn(|cx| {
        if let Poll::Ready(v) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        sleep.as_mut().poll(cx).map(|()| Err(TimedOut))
    })
    .await
}

/// A [`timeout`] passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut;

/// How the service is set up.
#[derive(Clone, Copy, Debug)]
pub struct ServiceConfig {
    /// Most connections open at once; past it a new client takes a reclaimed slot or is
    /// refused.
    pub max_conns: usize,
    /// Most connections one tenant may have open at once; past it its clients are
    /// refused.
    pub max_conns_per_tenant: usize,
    /// Workers that serve connections (indices `0..workers`).
    pub workers: usize,
    /// The worker that also runs the network stack for every connection (the appliance's
    /// CPU 0), whose own connections weigh more in placement; `None` where the OS runs
    /// TCP.
    pub stack_worker: Option<usize>,
    /// What the log calls a worker: "CPU", "thread".
    pub worker_noun: &'static str,
}

/// How a connection ended ([`Served::how`]): what the log line says, counted per cause in
/// [`stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The peer closed it (FIN).
    ByPeer,
    /// The peer reset it, or it timed out (no FIN).
    Reset,
    /// Reading or writing the socket failed.
    SocketError,
    /// The server closed it for a protocol violation (a bad frame size, a duplicate tag).
    ProtocolViolation,
    /// The server shed it (deadline passed, memory or slot reclaimed): reset at once.
    Shed,
    /// Closed politely for a shutdown.
    Shutdown,
    /// Reset for a shutdown: it had not finished within the grace time.
    ShutdownReset,
}

impl Closed {
    /// What the log says.
    pub fn describe(self) -> &'static str {
        match self {
            Closed::ByPeer => "closed by peer",
            Closed::Reset => "reset or timed out",
            Closed::SocketError => "socket error",
            Closed::ProtocolViolation => "closed by server (protocol violation)",
            Closed::Shed => "shed by server",
            Closed::Shutdown => "closed for shutdown",
            Closed::ShutdownReset => "reset for shutdown (grace time over)",
        }
    }
}

/// What [`Service::serve`] did with a connection, once it is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// The connection's (session's) id, as the log names it.
    pub conn: u64,
    /// The worker that served it.
    pub worker: usize,
    /// How it ended.
    pub how: Closed,
    /// The server's reason, when the server closed it.
    pub reason: Option<CloseReason>,
    /// Bytes received and sent on it.
    pub rx: u64,
    /// See [`Served::rx`].
    pub tx: u64,
    /// Connections still open once it was counted as ended.
    pub active: u64,
}

/// A connection [`Service::admit`] let in: the worker to serve it on and its tenant's
/// slot, which it holds until [`Service::serve`] returns or it is
/// [`Service::abandon`]ed.
#[derive(Debug)]
pub struct Admitted {
    /// The worker chosen to serve it.
    pub worker: usize,
    slot: SlotTicket,
}

/// Why [`Service::admit`] turned a client away: the caller resets the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No export allows the client's address (counted by the server,
    /// `refused_connections`).
    NotAllowed,
    /// The client's tenant has [`ServiceConfig::max_conns_per_tenant`] connections open
    /// (counted: `tenant_refused`).
    TenantFull,
    /// The connection limit is reached and no slot could be reclaimed (counted:
    /// `refused`).
    Full,
}

/// What [`Service::drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Connections asked to close politely.
    pub asked: u64,
    /// ... of which were shed after the grace time.
    pub shed: u64,
}

/// The 9P service over one server. See the module documentation.
pub struct Service<F: FileSystem + 'static> {
    server: Arc<Server<F>>,
    stats: Arc<ServiceStats>,
    config: ServiceConfig,
    /// Set when a connection ends (the listener may accept again).
    ended: Signal,
    /// Set when a connection ends, for [`Service::drain`].
    drained: Signal,
    /// Set by [`Service::stop_listening`].
    stop: Signal,
    stopping: AtomicBool,
}

impl<F: FileSystem + 'static> core::fmt::Debug for Service<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Service")
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<F: FileSystem + 'static> Service<F> {
    /// A service for `server`.
    pub fn new(server: Arc<Server<F>>, config: ServiceConfig) -> Self {
        Service {
            server,
            stats: Arc::new(ServiceStats::new(config.workers)),
            config,
            ended: Signal::new(),
            drained: Signal::new(),
            stop: Signal::new(),
            stopping: AtomicBool::new(false),
        }
    }

    /// The 9P server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    /// The connection counters (transports count their bytes in their worker's).
    pub fn stats(&self) -> &Arc<ServiceStats> {
        &self.stats
    }

    /// How the service is set up.
    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// Whether a client at `peer` may have a connection, and if so the worker to serve it
    /// on, chosen among `workers` (those allowed to serve); the connection is counted
    /// from here on, and the caller then runs [`Service::serve`] on that worker, or
    /// [`Service::abandon`]s it. A refused client is logged, counted and to be reset.
    pub fn admit(
        &self,
        peer: Option<SocketAddr>,
        workers: impl IntoIterator<Item = usize>,
    ) -> Result<Admitted, Refusal> {
        let ip = peer.map(|p| p.ip());
        if !self.server.admit(ip) {
            log::debug!("9p: {peer:?} refused: no export allows its address");
            return Err(Refusal::NotAllowed);
        }
        let tenant = self.server.tenant_of(ip);
        let tenants = self.server.tenants();
        let cap = self.config.max_conns_per_tenant;
        let slot = tenants.take_slot(&tenant, cap).or_else(|| {
            // At its cap, the tenant's own quietest connection without fids gives way.
            self.server
                .reclaim_slot_in(&tenant)
                .then(|| tenants.take_slot(&tenant, usize::MAX))
                .flatten()
        });
        let Some(slot) = slot else {
            self.stats.tenant_refused.inc();
            tenants.slot_refused(&tenant);
            log::debug!(
                "9p: {peer:?}: refused: tenant {} has {} connections open",
                tenant.key(),
                tenant.conns()
            );
            return Err(Refusal::TenantFull);
        };
        let max = self.config.max_conns;
        if self.stats.active() as usize >= max
            && !self.server.reclaim_slot()
            && !self.server.reclaim_slot_for(&tenant, max)
        {
            self.stats.refused.inc();
            tenants.slot_refused(&tenant);
            log::debug!(
                "9p: {peer:?}: refused: {} connections open, none idle",
                self.stats.active()
            );
            return Err(Refusal::Full);
        }
        let candidates = workers
            .into_iter()
            .filter(|&w| w < self.stats.workers())
            .map(|w| (w, self.stats.worker(w).active()));
        let worker = placement::least_loaded(candidates, self.config.stack_worker).unwrap_or(0);
        self.stats.accepted.inc();
        self.stats.worker(worker).accepted.inc();
        Ok(Admitted { worker, slot })
    }

    /// An admitted connection that never reached its worker `worker` (the worker is
    /// gone): it counts as closed; the caller resets it (its [`Admitted`], dropped, gives
    /// the tenant's slot back).
    pub fn abandon(&self, worker: usize) {
        log::error!(
            "9p: a connection could not be handed to {} {worker}",
            self.config.worker_noun
        );
        self.stats.reset.inc();
        self.ended(worker);
    }

    /// Serves one admitted connection on `worker`, from its first byte to the socket's
    /// release, and says how it ended. See the module documentation.
    pub async fn serve<E: Endpoint, R: Runtime>(
        &self,
        rt: &R,
        mut io: E,
        peer: Option<SocketAddr>,
        admitted: Admitted,
    ) -> Served {
        let Admitted { worker, slot } = admitted;
        let conn = match peer {
            Some(p) => Connection::from_peer(self.server.clone(), p.ip()),
            None => Connection::new(self.server.clone()),
        }
        .on_worker(worker);
        let id = conn.session().id();
        let noun = self.config.worker_noun;
        log::debug!("9p: conn {id}: accepted from {peer:?}, served on {noun} {worker}");
        let result = conn.run(&mut io).await;
        let s = &self.stats;
        let mut shed = false;
        let reason = result.as_ref().ok().copied().flatten();
        let how = match result {
            Err(e) => {
                s.reset.inc();
                log::warn!("9p: conn {id}: socket error {e:?}");
                Closed::SocketError
            }
            Ok(Some(CloseReason::Shutdown)) => {
                s.shutdown_closed.inc();
                Closed::Shutdown
            }
            Ok(Some(CloseReason::ShutdownNow)) => {
                s.shutdown_shed.inc();
                shed = true;
                Closed::ShutdownReset
            }
            Ok(Some(reason)) if reason.drops_output() => {
                s.shed.inc();
                shed = true;
                Closed::Shed
            }
            Ok(Some(_)) => {
                s.protocol_closed.inc();
                Closed::ProtocolViolation
            }
            Ok(None) if io.was_reset() => {
                s.reset.inc();
                Closed::Reset
            }
            Ok(None) => {
                s.peer_closed.inc();
                Closed::ByPeer
            }
        };
        if shed {
            io.abort().await;
        } else {
            self.close(rt, &mut io).await;
        }
        let (rx, tx) = (io.rx_bytes(), io.tx_bytes());
        io.release();
        drop(slot);
        self.ended(worker);
        let active = s.active();
        log::debug!(
            "9p: conn {id}: {} (served on {noun} {worker}; rx {rx} B, tx {tx} B); {active} active",
            how.describe()
        );
        Served {
            conn: id,
            worker,
            how,
            reason,
            rx,
            tx,
            active,
        }
    }

    /// Closes politely and waits for the close to finish, resetting the connection after
    /// [`CLOSE_TIMEOUT`].
    async fn close<E: Endpoint, R: Runtime>(&self, rt: &R, io: &mut E) {
        io.close();
        let stopping = self.stopping();
        if timeout(
            rt,
            CLOSE_TIMEOUT,
            poll_fn(|cx| io.poll_closed(cx, stopping)),
        )
        .await
        .is_err()
        {
            self.stats.aborted.inc();
            io.abort().await;
        }
    }

    /// Counts a connection of `worker` as ended and wakes whoever waits for one.
    fn ended(&self, worker: usize) {
        self.stats.worker(worker).closed.inc();
        self.stats.closed.inc();
        self.ended.signal();
        self.drained.signal();
    }

    /// For the listener: ready (clearing it) when a connection has ended since the last
    /// time, else registers `cx`'s waker.
    pub fn poll_ended(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.ended.poll_wait(cx)
    }

    /// For the listener: forgets the connections that ended so far (it is about to look
    /// at the count).
    pub fn clear_ended(&self) {
        self.ended.take();
    }

    /// Stops accepting connections: the listener, waiting in [`Service::poll_stop`],
    /// closes and ends.
    pub fn stop_listening(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stop.signal();
    }

    /// Whether [`Service::stop_listening`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// For the listener: ready once [`Service::stop_listening`] was called, else registers
    /// `cx`'s waker.
    pub fn poll_stop(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.stopping() {
            return Poll::Ready(());
        }
        self.stop.poll_wait(cx)
    }

    /// Closes every connection for a shutdown: politely first (requests in flight are
    /// answered), shedding those still open after `grace`; returns once every connection
    /// has ended (their requests have finished: the filesystem is idle). The caller
    /// bounds the whole with its own deadline.
    pub async fn drain<R: Runtime>(&self, rt: &R, grace: Duration) -> Drained {
        let mut done = Drained {
            asked: self.server.shut_down() as u64,
            shed: 0,
        };
        if timeout(rt, grace, self.all_ended()).await.is_err() {
            done.shed = self.server.shut_down_now() as u64;
            self.all_ended().await;
        }
        done
    }

    /// Completes when no connection is left.
    pub async fn all_ended(&self) {
        while self.stats.active() > 0 {
            self.drained.wait().await;
        }
    }

    /// Applies the server's deadlines every [`SWEEP_INTERVAL`], forever.
    pub async fn housekeeping<R: Runtime>(&self, rt: &R) {
        loop {
            rt.sleep(SWEEP_INTERVAL).await;
            self.server.sweep();
        }
    }

    /// Logs the connection counters and the protocol's.
    pub fn log_stats(&self) {
        let p = self.server.stats();
        log::debug!("9p: stats: connections: {}", self.stats);
        log::debug!(
            "9p: stats: protocol: {} requests, {} error replies, {} undecodable, {} bad frame sizes, {} duplicate tags, {} flushes",
            p.requests,
            p.error_replies,
            p.decode_errors,
            p.bad_frame_sizes,
            p.duplicate_tags,
            p.flushes
        );
    }
}
