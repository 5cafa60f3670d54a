//! The 9P listener on the smoltcp stack: how the appliance accepts connections and
//! hands them to its CPUs. What happens to a connection after that — admission, the
//! CPU it goes to, its life, its close, deadlines, shutdown, counters — is the serving
//! policy both ways of serving share ([`ninep::service`]); this module supplies the
//! appliance's listener, and a connection's socket as its
//! [`Endpoint`](ninep::service::Endpoint) (`super::tcp`).
//!
//! smoltcp has no accept queue: a listening socket becomes the connection. So the
//! listener keeps a pool of [`LISTEN_POOL`] listening sockets on the port; each one a
//! client connects to is handed to a new connection task and replaced, and the NIC's
//! SYN gate (`super::syn_gate`) holds back the connection requests of a burst larger than
//! the pool, keeps them until it is refilled and then lets them in, so clients connecting
//! at the same time are all accepted without waiting for a retransmission. The pool stays
//! open at the connection limit (`max_conns=`: a new client may still take the slot of
//! the quietest connection without fids), and stops only at the hard cap of
//! [`LISTEN_POOL`] connections beyond the limit (slots given away whose old connection is
//! still closing).
//!
//! Each accepted connection is handed whole to one CPU (`serve_cpus=`, default every CPU
//! online): the one serving fewest connections, CPU 0's counting double because it also
//! runs the network stack. Its task is spawned there (`smp::spawn_on`), and its fid
//! table, request futures and replies live there for its whole life; it shares with the
//! other CPUs only what every connection shares — the service and the server (locks,
//! memory budget, sessions), the filesystem, and the stack's socket table, whose socket
//! it uses through its own cell while the stack's poll task, on the CPU of the NIC's
//! interrupt, moves its frames.

use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::Cell;
use core::future::poll_fn;
use core::net::SocketAddr;
use core::task::Poll;
use core::time::Duration;

use ninep::server::Server;
use ninep::service::{Refusal, Runtime, Service, ServiceConfig};
use smoltcp::socket::tcp::{self, State};
use vfs::FileSystem;

use super::limits::{BURST_HOLD, LISTEN_POOL};
use super::sockets::SockId;
use super::stack::Stack;
use super::tcp::TcpTransport;
use crate::config::CpuMask;
use crate::hal::percpu::{self, MAX_CPUS};
use crate::{clock, smp, task};

/// Keep-alive probes on idle connections, so a vanished client is noticed...
pub const KEEP_ALIVE: Duration = Duration::from_secs(60);
/// ...and reset after this long without an answer.
pub const DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(180);
/// How often the counters are logged (when they changed).
pub const STATS_INTERVAL: Duration = Duration::from_secs(10);

/// The appliance's executor as the serving policy's [`Runtime`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Tasks;

impl Runtime for Tasks {
    fn sleep(&self, duration: Duration) -> impl core::future::Future<Output = ()> {
        task::sleep(duration)
    }
}

/// The 9P listener on one TCP port, on the CPU that runs it. See the module
/// documentation.
pub struct Listener<F: FileSystem + 'static> {
    service: Arc<Service<F>>,
    stack: Arc<Stack>,
    port: u16,
    buffer: usize,
    /// The CPUs that may serve connections (`serve_cpus=`); `None`: every CPU online.
    serve_cpus: Option<CpuMask>,
    /// Clients the SYN gate held back and that are expected to retransmit: the pool keeps
    /// a listening socket for each ([`Listener::plan_burst`]).
    burst: Cell<usize>,
    /// When the SYN gate last held a request back.
    burst_seen: Cell<Duration>,
}

impl<F: FileSystem + 'static> core::fmt::Debug for Listener<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Listener")
            .field("port", &self.port)
            .field("buffer", &self.buffer)
            .finish()
    }
}

impl<F: FileSystem + 'static> Listener<F> {
    /// A listener for `server` on TCP `port`, with `buffer`-byte socket buffers each way,
    /// serving up to `max_conns` connections on the CPUs of `serve_cpus` (`None`: every
    /// CPU online).
    pub fn new(
        stack: Arc<Stack>,
        server: Arc<Server<F>>,
        port: u16,
        buffer: usize,
        max_conns: usize,
        max_conns_per_tenant: usize,
        serve_cpus: Option<CpuMask>,
    ) -> Rc<Self> {
        let config = ServiceConfig {
            max_conns,
            max_conns_per_tenant,
            workers: MAX_CPUS,
            // The stack's poll task runs on the CPU of the NIC's interrupt, CPU 0.
            stack_worker: Some(0),
            worker_noun: "CPU",
        };
        Rc::new(Listener {
            service: Arc::new(Service::new(server, config)),
            stack,
            port,
            buffer,
            serve_cpus,
            burst: Cell::new(0),
            burst_seen: Cell::new(Duration::ZERO),
        })
    }

    /// The serving policy: counters, server, shutdown.
    pub fn service(&self) -> &Arc<Service<F>> {
        &self.service
    }

    /// The 9P server.
    pub fn server(&self) -> &Arc<Server<F>> {
        self.service.server()
    }

    /// The network stack it listens on.
    pub fn stack(&self) -> &Arc<Stack> {
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
            self.service.stats().listen_errors.inc();
            return None;
        }
        Some(self.stack.add(s))
    }

    /// The CPUs that may serve a new connection: those `serve_cpus=` names that are
    /// online.
    fn serving_cpus(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_CPUS)
            .filter(|&cpu| smp::is_online(cpu))
            .filter(|&cpu| self.serve_cpus.is_none_or(|m| m.contains(cpu)))
    }

    /// Lets as many connection requests in as the pool has sockets listening, those the
    /// gate kept first; those past it are held back and kept until the pool is refilled
    /// (`super::syn_gate`). With no pool at all (the hard cap) the gate opens: clients
    /// are refused at once.
    fn arm_syn_gate(&self, pool: &[SockId]) {
        let replay = if pool.is_empty() {
            self.stack.syn_gate().open()
        } else {
            // Sockets mid-handshake are in the pool but take no new SYN.
            let listening = pool.iter().filter(|&&h| self.listening(h)).count();
            self.stack.syn_gate().arm(self.port, listening, pool.len())
        };
        if replay {
            // Kept SYNs can go in: the stack's poll takes them before the device's frames.
            self.stack.kick();
        }
    }

    /// Frees the pool's sockets, resetting those a client has reached.
    async fn close_pool(&self, pool: Vec<SockId>) {
        // Nothing will listen again: clients are refused at once, the kept ones too.
        if self.stack.syn_gate().open() {
            self.stack.kick();
        }
        for h in pool {
            if self.listening(h) {
                self.stack.remove(h);
            } else {
                self.stack.reset_and_remove(h).await;
            }
        }
        log::info!("9p: listener on port {} closed", self.port);
    }

    /// Takes the pool sockets a client has connected to out of the pool.
    fn accept(&self, pool: &mut Vec<SockId>) -> Vec<SockId> {
        let mut accepted = Vec::new();
        pool.retain(|&h| match self.stack.peek_tcp(h, |s| s.state()) {
            State::Listen | State::SynReceived => true,
            State::Closed => {
                // A handshake that was reset or timed out: listen again.
                if self.stack.with_tcp(h, |s| s.listen(self.port)).is_err() {
                    self.stack.remove(h);
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
        self.stack.peek_tcp(h, |s| s.state()) == State::Listen
    }

    /// Counts the clients the SYN gate held back: the gate keeps their SYNs (or they
    /// retransmit, if its backlog was full), so the pool keeps a listening socket for each
    /// until [`BURST_HOLD`] has passed without one held back. The connection limit bounds
    /// it.
    fn plan_burst(&self) {
        let held = self.stack.syn_gate().take_held();
        let now = clock::uptime();
        let max_conns = self.service.config().max_conns;
        if held > 0 {
            let expected = (self.burst.get() + held).min(max_conns);
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
    /// expected ([`Listener::plan_burst`]), while fewer than the limit plus
    /// [`LISTEN_POOL`] connections exist (past the limit, a new client may still take a
    /// reclaimed slot).
    fn resize_pool(&self, pool: &mut Vec<SockId>) {
        let allowance = (self.service.config().max_conns + LISTEN_POOL)
            .saturating_sub(self.service.stats().active() as usize)
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
            self.stack.remove(pool.swap_remove(i));
        }
    }

    /// Applies the server's deadlines, for as long as the appliance runs.
    pub async fn housekeeping(self: Rc<Self>) {
        self.service.housekeeping(&Tasks).await
    }

    /// Logs the counters every [`STATS_INTERVAL`] when they changed.
    pub async fn report(self: Rc<Self>) {
        let mut last = (u64::MAX, 0, 0, 0);
        loop {
            task::sleep(STATS_INTERVAL).await;
            let s = self.service.stats();
            let now = (s.accepted.get(), s.closed.get(), s.rx_bytes(), s.tx_bytes());
            if now != last {
                last = now;
                self.log_stats();
            }
        }
    }

    /// Logs the service's, the 9P server's and the NIC's counters.
    pub fn log_stats(&self) {
        self.service.log_stats();
        log::debug!(
            "9p: stats: nic: {}; {} stack polls",
            self.stack.nic_stats(),
            self.stack.polls()
        );
    }
}

/// What takes a connection to another CPU: there the filesystem and the server are
/// shared, so they must be `Send + Sync`.
impl<F: FileSystem + Send + Sync + 'static> Listener<F> {
    /// The listener: runs until `Service::stop_listening`.
    pub async fn run(self: Rc<Self>) {
        let mut pool: Vec<SockId> = Vec::new();
        loop {
            if self.service.stopping() {
                self.close_pool(pool).await;
                return;
            }
            self.service.clear_ended();
            for handle in self.accept(&mut pool) {
                self.admit(handle).await;
            }
            self.plan_burst();
            self.resize_pool(&mut pool);
            self.arm_syn_gate(&pool);
            if pool.is_empty() && self.service.stats().active() == 0 {
                // Cannot listen at all: nothing will wake us but a retry.
                task::sleep(Duration::from_secs(1)).await;
                continue;
            }
            // Sleep until a pool socket changes state, a connection ends or we stop.
            let mut registered = false;
            poll_fn(|cx| {
                if registered {
                    return Poll::Ready(());
                }
                registered = true;
                for &h in &pool {
                    self.stack
                        .peek_tcp(h, |s| s.register_recv_waker(cx.waker()));
                }
                self.stack.syn_gate().register_listener(cx.waker());
                let ended = self.service.poll_ended(cx);
                let stop = self.service.poll_stop(cx);
                if ended.is_ready() || stop.is_ready() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }

    /// Admits the client of just-accepted socket `handle` and hands its connection to the
    /// CPU the service chose, where its task runs until the socket is freed; or resets it.
    async fn admit(&self, handle: SockId) {
        let peer = self.stack.peek_tcp(handle, |s| s.remote_endpoint());
        let peer = peer.map(|ep| SocketAddr::new(ip_of(ep.addr), ep.port));
        let admitted = match self.service.admit(peer, self.serving_cpus()) {
            Ok(admitted) => admitted,
            Err(Refusal::NotAllowed | Refusal::TenantFull | Refusal::Full) => {
                self.stack.reset_and_remove(handle).await;
                return;
            }
        };
        let cpu = admitted.worker;
        let (service, stack) = (self.service.clone(), self.stack.clone());
        let serve = move |admitted| async move {
            let io = TcpTransport::new(stack, handle, service.stats().clone(), cpu);
            let served = service.serve(&Tasks, io, peer, admitted).await;
            crate::event::emit(crate::event::conn_closed(&served));
        };
        if cpu == percpu::index() {
            task::spawn(serve(admitted));
        } else if smp::spawn_on(cpu, move || serve(admitted)).is_err() {
            // Chosen among the CPUs online, which never go offline: the client is reset
            // (its slot went back with the closure).
            self.service.abandon(cpu);
            self.stack.reset_and_remove(handle).await;
        }
    }
}

/// A smoltcp address as a `core::net` one.
fn ip_of(addr: smoltcp::wire::IpAddress) -> core::net::IpAddr {
    match addr {
        smoltcp::wire::IpAddress::Ipv4(a) => core::net::IpAddr::V4(a),
    }
}
