//! The 9P2000.L server: sessions, fids, exports, permissions, locks, and the mapping of
//! each request onto [`FileSystem`].
//!
//! One [`Server`] serves one filesystem to any number of connections
//! ([`crate::conn::Connection`]); it holds what connections share (configuration, POSIX
//! locks, the memory budget, counters) and a registry of their sessions for housekeeping
//! ([`housekeeping`]: handshake and idle deadlines, reclaiming memory and connection
//! slots from clients that hold them without using them). A connection's [`Session`]
//! holds its fid table and memory account.
//!
//! # Concurrency
//!
//! A server is shared (`Arc<Server>`) by connections running on several CPUs: each
//! [`crate::conn::Connection`] lives on the CPU that runs it, with its request futures
//! (polled together, so a slow request does not hold up the others), and reaches what
//! it shares with the others — this server, its [`Session`] (which housekeeping reads
//! from any CPU) — through `Sync` types: `Server<F>` is `Send + Sync` when `F` is.
//!
//! - Counters, timings and latency histograms are atomics ([`Stats`]).
//! - The memory budget is exact and global: compare-and-swap against the limit, each
//!   account's books under its own lock ([`crate::memory`]).
//! - The POSIX lock table, the session registry, a session's fid table, activity record
//!   and close signal, an xattr writer's value and the administration tree's last reply
//!   are behind short spin locks (`sync::Locked`), reached only through closures, so
//!   none is held across an `.await`; a critical section does a few map operations and
//!   wakes no task (wakers and charges that may wake are let go after it).
//! - Wakers (a connection waiting for memory or for a close) may be registered on one
//!   CPU and woken from another: each is registered before the last check of what it
//!   waits for, and the check and the wake meet under one lock, so no wake is lost in
//!   between.
//!
//! Lock order, where two nest: a session's fid table, then its account's books (binding
//! a fid checks and charges it in one step). No other lock of the server is taken while
//! one is held (the heap's, in the appliance, is a leaf below them all).

pub mod access;
mod attr;
mod dir;
pub mod export;
mod fid;
mod file;
pub mod housekeeping;
pub mod locks;
pub mod perm;
mod session;
mod stats;
pub mod tenant;
mod walk;
mod xattr;

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::sync::{Arc, Weak};
use alloc::vec;
use alloc::vec::Vec;
use core::net::IpAddr;
use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicBool, AtomicU64};

use vfs::{Attr, Errno, FileSystem, FileType};

use crate::conn::CloseReason;
use crate::memory::{Budget, MemoryConfig, MemoryStats, Refused};
use crate::sync::Locked;
use crate::wire::{self, qid_type, DecodeError, Qid, Rmsg, RmsgType, Tmsg};
pub use access::{AccessConfig, AllowList, Cidr};
pub use export::{Export, Squash};
pub use housekeeping::Timeouts;
pub use session::{Activity, Session};
pub(crate) use stats::Received;
use stats::{Counters, RequestCells, TimingCells};
pub use stats::{RequestStats, Stats, Timings};
pub use tenant::{Tenant, TenantKey, TenantLimits, TenantStats, Tenants};

/// Largest msize the server agrees to by default (what Linux asks for with
/// `msize=1048576`).
pub const DEFAULT_MAX_MSIZE: u32 = 1 << 20;
/// Smallest msize the server accepts: room for a useful `Rread`/`Rreaddir`.
pub const MIN_MSIZE: u32 = 512;

/// Server-wide settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest msize offered in `Rversion` (clamped to at least [`MIN_MSIZE`]).
    pub max_msize: u32,
    /// Most fids one connection may hold; more get `EMFILE`.
    pub max_fids: usize,
    /// Most requests one connection may have in flight; past it the connection stops
    /// reading (backpressure) until one completes.
    pub max_in_flight: usize,
    /// Most connections open at once from one client address; more are refused at
    /// accept ([`Server::admit`]), so one guest cannot take every connection slot.
    pub max_conns_per_client: usize,
    /// Most POSIX locks one connection may hold; a request that would need more gets
    /// `ENOLCK`.
    pub max_locks_per_conn: usize,
    /// Most POSIX locks all connections together may hold; past it, `ENOLCK`.
    pub max_locks: usize,
    /// What one tenant's connections may hold together ([`tenant`]).
    pub tenant: TenantLimits,
    /// Longest client id a `Tlock`/`Tgetlock` may carry, in bytes (Linux sends its
    /// nodename: at most 64); longer gets `EINVAL`.
    pub max_lock_client_id: usize,
    /// What attaching clients can select with `aname`.
    pub exports: Vec<Export>,
    /// The clients that may attach to exports that have no allow-list of their own.
    pub allow: AllowList,
    /// Group membership by uid (9P carries only a uid; without an entry a user is in no
    /// group, so only owner and other permission bits apply to it).
    pub groups: BTreeMap<u32, Vec<u32>>,
    /// A monotonic clock in nanoseconds: with one, the server keeps [`Timings`] and the
    /// latencies of [`RequestStats`], and enforces [`Config::timeouts`].
    pub clock: Option<fn() -> u64>,
    /// What the server may allocate on clients' behalf ([`crate::memory`]).
    pub memory: MemoryConfig,
    /// Deadlines for connections that do not use what they hold.
    pub timeouts: Timeouts,
    /// Most time one connection's task spends serving before it lets other connections
    /// run (nanoseconds on [`Config::clock`]; without a clock only a round count limits
    /// it).
    pub cpu_quantum_ns: u64,
}

/// Default of [`Config::memory`]'s limit for the host server: the appliance sizes it
/// from its heap.
pub const DEFAULT_MEMORY_LIMIT: usize = 256 << 20;
/// Default of [`Config::max_conns_per_client`]: a quarter of the appliance's default
/// connection limit.
pub const DEFAULT_MAX_CONNS_PER_CLIENT: usize = 16;
/// Default of [`Config::cpu_quantum_ns`].
pub const DEFAULT_CPU_QUANTUM_NS: u64 = 2_000_000;

impl Config {
    /// Memory sizes for a server that may spend `limit` bytes on clients, with this
    /// configuration's msize.
    pub fn memory_for(&self, limit: usize) -> MemoryConfig {
        MemoryConfig::for_limit(limit, min_connection_memory(self.max_msize))
    }
}

/// What one connection needs to be served at all with `msize`: one request frame of the
/// largest size and the largest reply, with room to spare.
pub fn min_connection_memory(msize: u32) -> usize {
    2 * msize.max(MIN_MSIZE) as usize + crate::memory::MemoryConfig::DEFAULT_RESERVE
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_msize: DEFAULT_MAX_MSIZE,
            max_fids: 4096,
            max_in_flight: 128,
            max_conns_per_client: DEFAULT_MAX_CONNS_PER_CLIENT,
            max_locks_per_conn: 4096,
            max_locks: 32768,
            tenant: TenantLimits::for_server(4096, 128, 32768),
            max_lock_client_id: 256,
            exports: vec![Export::root("")],
            allow: AllowList::Any,
            groups: BTreeMap::new(),
            clock: None,
            memory: MemoryConfig::for_limit(
                DEFAULT_MEMORY_LIMIT,
                min_connection_memory(DEFAULT_MAX_MSIZE),
            ),
            timeouts: Timeouts::default(),
            cpu_quantum_ns: DEFAULT_CPU_QUANTUM_NS,
        }
    }
}

impl Config {
    /// The clients that may attach to `export`: its own list, else [`Config::allow`].
    pub fn allow_list<'a>(&'a self, export: &'a Export) -> &'a AllowList {
        export.allow.as_ref().unwrap_or(&self.allow)
    }
}

/// A 9P2000.L server over filesystem `F`, shared by connections on any number of CPUs
/// (see the module documentation).
#[derive(Debug)]
pub struct Server<F> {
    fs: F,
    config: Config,
    locks: Locked<locks::LockTable>,
    counters: Counters,
    timings: TimingCells,
    requests: RequestCells,
    next_conn: AtomicU64,
    budget: Arc<Budget>,
    tenants: Arc<Tenants>,
    /// Open sessions, for housekeeping.
    sessions: Locked<BTreeMap<u64, Weak<Session>>>,
    /// [`Server::shut_down`] was called: every connection, new ones too, is closing.
    /// Set under the registry's lock and read there by [`Server::new_session`], so a
    /// session registered at the same time is asked to close by the shutdown or sees it.
    shutting_down: AtomicBool,
}

/// `Server`, `Session`, the budget and the administration tree are `Send + Sync` for
/// any filesystem that is: checked here, at compile time.
fn _shared_between_cpus<F: FileSystem + Send + Sync>() {
    fn is<T: Send + Sync>() {}
    is::<Server<F>>();
    is::<Session>();
    is::<Budget>();
    is::<crate::memory::Account>();
    is::<crate::admin::AdminFs<F>>();
}

impl<F: FileSystem> Server<F> {
    /// A server for `fs` (already mounted) with `config`.
    pub fn new(fs: F, config: Config) -> Self {
        let limits = locks::LockLimits {
            per_conn: config.max_locks_per_conn,
            per_tenant: config.tenant.max_locks,
            total: config.max_locks,
            client_id_len: config.max_lock_client_id,
        };
        Server {
            fs,
            locks: Locked::new(locks::LockTable::new(limits)),
            counters: Counters::default(),
            timings: TimingCells::default(),
            requests: RequestCells::default(),
            next_conn: AtomicU64::new(1),
            budget: Budget::new(config.memory),
            // A tenant may run a quarter quantum ahead of another on a worker.
            tenants: Arc::new(Tenants::new(&config.exports, config.cpu_quantum_ns / 4)),
            sessions: Locked::new(BTreeMap::new()),
            shutting_down: AtomicBool::new(false),
            config,
        }
    }

    /// The filesystem served.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// Time spent in requests so far (all zero without [`Config::clock`]).
    pub fn timings(&self) -> Timings {
        self.timings.snapshot()
    }

    /// Requests received and their latencies, by request type.
    pub fn request_stats(&self) -> RequestStats {
        self.requests.snapshot()
    }

    /// Counts a request whose frame is complete; hand the result to
    /// [`Server::answered`] when its reply is queued.
    pub(crate) fn received(&self, ty: u8) -> Received {
        self.requests.receive(ty, self.now())
    }

    /// Records the latency of a request whose reply was just queued (with a clock).
    pub(crate) fn answered(&self, request: Received) {
        if self.config.clock.is_some() {
            self.requests.answer(request, self.now());
        }
    }

    /// The tenants.
    pub fn tenants(&self) -> &Arc<Tenants> {
        &self.tenants
    }

    /// The name (`export:NAME`, `client:ADDR`, `local`) of the tenant with id `id`, if it
    /// still has connections or is an export's (what the filesystem's per-tenant
    /// counters are labelled with).
    pub fn tenant_name(&self, id: u64) -> Option<String> {
        let tenants = self.tenants.all();
        let t = tenants.iter().find(|t| t.id() == id)?;
        Some(t.key().to_string())
    }

    /// The tenant of a client at `peer` ([`tenant`]).
    pub fn tenant_of(&self, peer: Option<IpAddr>) -> Arc<Tenant> {
        self.tenants.tenant_of(&self.config.exports, peer)
    }

    /// What every tenant holds and was refused.
    pub fn tenant_stats(&self) -> Vec<TenantStats> {
        let tenants = self.tenants.all();
        let locks: Vec<usize> =
            self.with_locks(|t| tenants.iter().map(|x| t.tenant_len(x.id())).collect());
        tenants
            .iter()
            .zip(locks)
            .map(|(t, locks)| TenantStats {
                locks: locks as u64,
                ..t.stats()
            })
            .collect()
    }

    /// Number of POSIX locks held by all connections.
    pub fn lock_count(&self) -> usize {
        self.with_locks(|t| t.len())
    }

    /// Bytes of lock records `session`'s connection holds (its locks and their interned
    /// client ids; see [`locks::LockTable::conn_bytes`]).
    pub fn lock_bytes(&self, session: &Session) -> usize {
        self.with_locks(|t| t.conn_bytes(session.id()))
    }

    /// Runs `f` on the lock table, locked.
    fn with_locks<R>(&self, f: impl FnOnce(&mut locks::LockTable) -> R) -> R {
        self.locks.with(f)
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Whether a client at `peer` may connect: some export's allow-list admits it. A
    /// transport closes connections refused here right after accepting them (counted).
    ///
    /// A client that already has [`Config::max_conns_per_client`] connections open (not
    /// counting those being shed) is refused too (counted `client_conn_limit_hits`).
    pub fn admit(&self, peer: Option<IpAddr>) -> bool {
        let c = &self.config;
        if !c.exports.iter().any(|e| c.allow_list(e).admits(peer)) {
            self.counters.refused_connections();
            return false;
        }
        let Some(peer) = peer else {
            return true;
        };
        let open = self
            .live_sessions()
            .iter()
            .filter(|s| s.peer() == Some(peer) && s.close_requested().is_none())
            .count();
        if open >= c.max_conns_per_client {
            self.counters.client_conn_limit_hits();
            log::debug!("9p: {peer}: refused: {open} connections from this address already");
            return false;
        }
        true
    }

    /// The memory budget's state and counters.
    pub fn memory(&self) -> MemoryStats {
        self.budget.stats()
    }

    /// Connections open now.
    pub fn connection_count(&self) -> usize {
        self.sessions.with(|s| s.len())
    }

    /// Now on the server's clock (0 without one).
    pub(crate) fn now(&self) -> u64 {
        self.config.clock.map_or(0, |now| now())
    }

    /// A new session with a fresh connection id and memory account, for a client at
    /// `peer` (`None`: not known, as for in-memory transports).
    pub fn new_session(&self, peer: Option<IpAddr>) -> Arc<Session> {
        let id = self.next_conn.fetch_add(1, Relaxed);
        self.counters.connections_opened();
        let tenant = self.tenant_of(peer);
        let session = Arc::new(Session::new(
            id,
            peer,
            self.config.max_msize.max(MIN_MSIZE),
            self.budget.open_in(tenant.memory()),
            tenant,
            self.now(),
        ));
        let shutting_down = self.sessions.with(|registry| {
            registry.insert(id, Arc::downgrade(&session));
            self.shutting_down.load(Relaxed)
        });
        if shutting_down {
            // Accepted while the server shuts down: closed before it reads anything.
            session.request_close(CloseReason::Shutdown);
        }
        session
    }

    /// Answers `Tversion`: negotiates msize and version and resets the session (every
    /// fid clunked). Callers make sure no other request of the session is in flight.
    pub async fn version(
        &self,
        session: &Session,
        tag: u16,
        msize: u32,
        version: &[u8],
    ) -> Vec<u8> {
        self.reset(session).await;
        // Until this `Tversion` succeeds the session is unversioned: every request but
        // another `Tversion` gets `EPROTO` (the reset left no fid to use anyway).
        session.set_versioned(false);
        let max = self.config.max_msize.max(MIN_MSIZE);
        if msize < MIN_MSIZE {
            return lerror(tag, Errno::EINVAL);
        }
        let msize = msize.min(max);
        let version = if version == wire::VERSION_9P2000_L {
            session.set_msize(msize);
            session.set_versioned(true);
            wire::VERSION_9P2000_L
        } else {
            self.counters.unknown_versions();
            wire::VERSION_UNKNOWN
        };
        reply(tag, &Rmsg::Version { msize, version })
    }

    /// Clunks every fid of `session` (releasing open files and their locks).
    pub async fn reset(&self, session: &Session) {
        for (fid, state) in session.take_all() {
            self.forget_fid(session, fid, &state).await;
        }
        self.drop_locks(session);
    }

    /// Drops every POSIX lock of `session`, and their memory.
    pub(crate) fn drop_locks(&self, session: &Session) {
        let held = self.with_locks(|t| {
            t.release_conn(session.id());
            t.conn_bytes(session.id())
        });
        self.settle_lock_memory(session, held);
    }

    /// Tears a session down at disconnect: as [`Server::reset`], and counted.
    pub async fn close(&self, session: &Session) {
        self.reset(session).await;
        self.sessions.with(|r| r.remove(&session.id()));
        self.counters.connections_closed();
    }

    /// Answers one request frame other than `Tversion` and `Tflush` (which the connection
    /// handles). Never fails: errors become `Rlerror`.
    pub async fn handle(&self, session: &Session, frame: &[u8]) -> Vec<u8> {
        self.counters.requests();
        let started = self.config.clock.map(|now| now());
        let tag = wire::Header::peek(frame).map_or(wire::NOTAG, |h| h.tag);
        let out = match Tmsg::decode(frame) {
            Ok((_, msg)) if !session.versioned() => {
                let _ = msg;
                lerror(tag, Errno::EPROTO)
            }
            Ok((_, msg)) => match self.dispatch(session, tag, msg).await {
                Ok(frame) => frame,
                Err(e) => lerror(tag, e),
            },
            Err(DecodeError::UnknownType(ty)) => {
                log::debug!("9p: conn {}: unknown message type {ty}", session.id());
                self.counters.decode_errors();
                lerror(tag, Errno::EOPNOTSUPP)
            }
            Err(e) => {
                log::debug!("9p: conn {}: malformed request: {e}", session.id());
                self.counters.decode_errors();
                lerror(tag, Errno::EPROTO)
            }
        };
        if wire::Header::peek(&out).is_some_and(|h| h.ty == RmsgType::Lerror as u8) {
            self.counters.error_replies();
        }
        let ty = wire::Header::peek(frame).map(|h| h.ty);
        if let (Some(now), Some(t0), Some(ty)) = (self.config.clock, started, ty) {
            self.timings.add(ty, now().saturating_sub(t0));
        }
        out
    }

    async fn dispatch(&self, s: &Session, tag: u16, msg: Tmsg<'_>) -> Result<Vec<u8>, Errno> {
        match msg {
            // The connection answers these two itself.
            Tmsg::Version { .. } | Tmsg::Flush { .. } => Err(Errno::EPROTO),
            Tmsg::Auth { .. } => Err(Errno::EOPNOTSUPP),
            Tmsg::Attach {
                fid,
                uname,
                aname,
                n_uname,
                ..
            } => self.attach(s, tag, fid, uname, aname, n_uname).await,
            Tmsg::Walk { fid, newfid, names } => self.walk(s, tag, fid, newfid, &names).await,
            Tmsg::Lopen { fid, flags } => self.lopen(s, tag, fid, flags).await,
            Tmsg::Lcreate {
                fid,
                name,
                flags,
                mode,
                gid,
            } => self.lcreate(s, tag, fid, name, flags, mode, gid).await,
            Tmsg::Read { fid, offset, count } => self.read(s, tag, fid, offset, count).await,
            Tmsg::Write { fid, offset, data } => self.write(s, tag, fid, offset, data.0).await,
            Tmsg::Clunk { fid } => self.clunk(s, tag, fid).await,
            Tmsg::Remove { fid } => self.remove(s, tag, fid).await,
            Tmsg::Fsync { fid, datasync } => self.fsync(s, tag, fid, datasync != 0).await,
            Tmsg::Statfs { fid } => self.statfs(s, tag, fid).await,
            Tmsg::Getattr { fid, .. } => self.getattr(s, tag, fid).await,
            msg @ Tmsg::Setattr { .. } => self.dispatch_setattr(s, tag, msg).await,
            Tmsg::Readdir { fid, offset, count } => self.readdir(s, tag, fid, offset, count).await,
            Tmsg::Mkdir {
                dfid,
                name,
                mode,
                gid,
            } => self.mkdir(s, tag, dfid, name, mode, gid).await,
            Tmsg::Mknod {
                dfid,
                name,
                mode,
                major,
                minor,
                gid,
            } => {
                self.mknod(s, tag, dfid, name, mode, (major, minor), gid)
                    .await
            }
            Tmsg::Symlink {
                fid,
                name,
                target,
                gid,
            } => self.symlink(s, tag, fid, name, target, gid).await,
            Tmsg::Readlink { fid } => self.readlink(s, tag, fid).await,
            Tmsg::Link { dfid, fid, name } => self.link(s, tag, dfid, fid, name).await,
            Tmsg::Rename { fid, dfid, name } => self.rename(s, tag, fid, dfid, name).await,
            Tmsg::Renameat {
                olddirfid,
                oldname,
                newdirfid,
                newname,
            } => {
                self.renameat(s, tag, olddirfid, oldname, newdirfid, newname)
                    .await
            }
            Tmsg::Unlinkat {
                dirfid,
                name,
                flags,
            } => self.unlinkat(s, tag, dirfid, name, flags).await,
            Tmsg::Xattrwalk { fid, newfid, name } => {
                self.xattrwalk(s, tag, fid, newfid, name).await
            }
            Tmsg::Xattrcreate {
                fid,
                name,
                attr_size,
                flags,
            } => self.xattrcreate(s, tag, fid, name, attr_size, flags).await,
            msg @ (Tmsg::Lock { .. } | Tmsg::Getlock { .. }) => {
                self.dispatch_lock(s, tag, msg).await
            }
        }
    }

    /// `Tsetattr`: its fields as one request. [`Server::dispatch`] routes only `Tsetattr`
    /// here.
    async fn dispatch_setattr(
        &self,
        s: &Session,
        tag: u16,
        msg: Tmsg<'_>,
    ) -> Result<Vec<u8>, Errno> {
        let Tmsg::Setattr {
            fid,
            valid,
            mode,
            uid,
            gid,
            size,
            atime_sec,
            atime_nsec,
            mtime_sec,
            mtime_nsec,
        } = msg
        else {
            return Err(Errno::EPROTO);
        };
        let req = attr::SetattrReq {
            valid,
            mode,
            uid,
            gid,
            size,
            atime: (atime_sec, atime_nsec),
            mtime: (mtime_sec, mtime_nsec),
        };
        self.setattr(s, tag, fid, req).await
    }

    /// `Tlock` and `Tgetlock`, which describe a lock the same way. [`Server::dispatch`]
    /// routes only these two here.
    async fn dispatch_lock(&self, s: &Session, tag: u16, msg: Tmsg<'_>) -> Result<Vec<u8>, Errno> {
        match msg {
            Tmsg::Lock {
                fid,
                lock_type,
                flags: _,
                start,
                length,
                proc_id,
                client_id,
            } => {
                let req = file::LockReq {
                    lock_type,
                    start,
                    length,
                    proc_id,
                    client_id,
                };
                self.lock(s, tag, fid, req).await
            }
            Tmsg::Getlock {
                fid,
                lock_type,
                start,
                length,
                proc_id,
                client_id,
            } => {
                let req = file::LockReq {
                    lock_type,
                    start,
                    length,
                    proc_id,
                    client_id,
                };
                self.getlock(s, tag, fid, req).await
            }
            _ => Err(Errno::EPROTO),
        }
    }
}

/// How many times [`Server::hold`] waits for reclaimed memory before answering `ENOMEM`.
const RECLAIM_WAITS: u32 = 4;

/// Why an attempt to take state for a request failed: the protocol's answer, or the
/// memory budget's refusal (which [`Server::hold`] may wait out).
pub(crate) enum Refusal {
    /// Answered as it is.
    Errno(Errno),
    /// Memory was refused.
    Memory(Refused),
}

impl From<Refused> for Refusal {
    fn from(r: Refused) -> Refusal {
        Refusal::Memory(r)
    }
}

impl<F: FileSystem> Server<F> {
    /// The answer to a refused charge for state a request would hold: `ENOMEM`
    /// (counted), after asking for memory to be reclaimed if the connection was below its
    /// fair share (so that a retry can succeed).
    pub(crate) fn refused(&self, s: &Session, r: Refused) -> Errno {
        self.reclaim_for(s, r);
        self.enomem(s, r)
    }

    fn enomem(&self, s: &Session, r: Refused) -> Errno {
        self.counters.enomem_replies();
        log::debug!("9p: conn {}: ENOMEM: {r}", s.id());
        Errno::ENOMEM
    }

    /// Takes state a request will hold through `attempt`. When the budget refuses it while
    /// the connection (or its tenant) is below its fair share, memory is reclaimed from a
    /// connection holding more than its share and the attempt is repeated when memory
    /// comes back (at most [`RECLAIM_WAITS`] times): a lean client — a fresh mount's
    /// `Tattach` — is not answered `ENOMEM` because others of its tenant filled the budget.
    /// Any other refusal is `ENOMEM` at once.
    pub(crate) async fn hold<T>(
        &self,
        s: &Session,
        mut attempt: impl FnMut() -> Result<T, Refusal>,
    ) -> Result<T, Errno> {
        let mut waits = 0;
        // A waker registered before the latest attempt: a release after it wakes us.
        let mut armed = false;
        core::future::poll_fn(|cx| loop {
            match attempt() {
                Ok(v) => return core::task::Poll::Ready(Ok(v)),
                Err(Refusal::Errno(e)) => return core::task::Poll::Ready(Err(e)),
                Err(Refusal::Memory(_)) if armed => {
                    armed = false;
                    return core::task::Poll::Pending;
                }
                Err(Refusal::Memory(r)) => {
                    if waits == RECLAIM_WAITS || !self.reclaim_for(s, r) {
                        return core::task::Poll::Ready(Err(self.enomem(s, r)));
                    }
                    waits += 1;
                    self.counters.reclaim_waits();
                    // Registered before the next attempt (see `Budget::wait`).
                    self.budget.wait(cx.waker());
                    armed = true;
                }
            }
        })
        .await
    }
}

/// Encodes a reply; a reply that cannot be encoded (a field past 9P's limits) becomes
/// `Rlerror(EIO)` rather than a panic.
pub(crate) fn reply(tag: u16, msg: &Rmsg<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match msg.encode(tag, &mut out) {
        Ok(_) => out,
        Err(e) => {
            log::warn!("9p: reply {} not encodable: {e}", msg.msg_type());
            lerror(tag, Errno::EIO)
        }
    }
}

/// An `Rlerror` frame.
pub fn lerror(tag: u16, errno: Errno) -> Vec<u8> {
    let mut out = Vec::with_capacity(11);
    Rmsg::Lerror { ecode: errno.0 }
        .encode(tag, &mut out)
        .expect("Rlerror always encodes");
    out
}

/// The qid of an inode: path = inode number, version = low bits of its generation, type
/// from the file type.
pub fn qid_of(attr: &Attr) -> Qid {
    Qid {
        ty: qid_type_of(attr.file_type()),
        version: attr.generation as u32,
        path: attr.ino,
    }
}

/// Qid type bits for a file type.
pub fn qid_type_of(t: FileType) -> u8 {
    match t {
        FileType::Directory => qid_type::DIR,
        FileType::Symlink => qid_type::SYMLINK,
        _ => qid_type::FILE,
    }
}

/// Checks a name a request wants to create or look up: non-empty, no `/`, no NUL (the
/// filesystem checks length and `.`/`..` for new names).
pub(crate) fn check_name(name: &[u8]) -> Result<(), Errno> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        Err(Errno::EINVAL)
    } else {
        Ok(())
    }
}
