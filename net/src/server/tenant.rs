//! Tenants: whom the server's shared limits are divided between.
//!
//! **An export is a tenant.** A client whose address an export's own allow-list admits
//! belongs to that export's tenant (the first such export, in configuration order, if
//! several admit it; the administration export is never one). A client admitted only
//! through exports without an allow-list of their own — the anonymous case — is a tenant
//! by itself, keyed on its address; so is each connection whose peer is unknown (an
//! in-memory transport).
//!
//! Every shared limit has a per-tenant share beside its global cap, so that one tenant,
//! however many connections or addresses it uses, leaves the others theirs:
//!
//! | what | global cap | per tenant | past it |
//! |---|---|---|---|
//! | connection slots | the service's `max_conns` | `ServiceConfig::max_conns_per_tenant`; at the global cap a tenant below its fair share takes a slot from the tenant most above its own | refused (reset) |
//! | memory | `MemoryConfig::limit` | `MemoryConfig::per_tenant`; a tenant below its fair share gets memory reclaimed from one above | backpressure, `ENOMEM` |
//! | POSIX locks | `Config::max_locks` | [`TenantLimits::max_locks`] | `ENOLCK` |
//! | fids | (memory) | [`TenantLimits::max_fids`] | `EMFILE` |
//! | requests in flight | (memory) | [`TenantLimits::max_in_flight`] | backpressure |
//! | CPU | the CPUs | fair ([`CpuShare`]) | its connections' turns are shorter |
//!
//! Shares that can be taken back (connection slots, memory) are **weighted fair**: a
//! tenant may use what others leave idle, and gives it back when a tenant below its fair
//! share needs it. Shares that cannot (locks, fids, requests in flight, which belong to
//! running applications) are **capped**: a tenant never holds more than its cap, so
//! the rest stays for the others.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::fmt;
use core::net::IpAddr;
use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicU64, AtomicUsize};
use core::task::Waker;

use super::export::{Export, ADMIN_EXPORT};
use crate::memory::Group;
use crate::sync::Locked;

/// Who a tenant is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TenantKey {
    /// The clients an export's own allow-list admits (the export's name).
    Export(String),
    /// One client admitted only through exports open to every allowed address.
    Client(IpAddr),
    /// A connection whose peer is not known (in-memory transports, tests): each is a
    /// tenant by itself.
    Local,
}

impl fmt::Display for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantKey::Export(name) => write!(f, "export:{name}"),
            TenantKey::Client(ip) => write!(f, "client:{ip}"),
            TenantKey::Local => f.write_str("local"),
        }
    }
}

/// The per-tenant caps of the shares that cannot be taken back (see the module
/// documentation; memory's is [`crate::memory::MemoryConfig::per_tenant`], connection
/// slots' the service's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    /// Most fids all connections of one tenant may hold; more get `EMFILE`.
    pub max_fids: usize,
    /// Most POSIX locks one tenant may hold; more get `ENOLCK`.
    pub max_locks: usize,
    /// Most requests one tenant may have in flight; past it its connections stop
    /// reading until one completes.
    pub max_in_flight: usize,
}

impl TenantLimits {
    /// Defaults for a server with per-connection limits `max_fids` and `max_in_flight`
    /// and `max_locks` locks in all: a tenant may hold the fids and requests in flight of
    /// sixteen busy connections (the default connections per client address), and a
    /// quarter of the lock table (so three tenants at their caps leave the others a
    /// quarter).
    pub fn for_server(max_fids: usize, max_in_flight: usize, max_locks: usize) -> Self {
        TenantLimits {
            max_fids: 16 * max_fids,
            max_locks: max_locks / 4,
            max_in_flight: 16 * max_in_flight,
        }
    }
}

/// One tenant: what its connections hold together. Shared (`Arc`) by its sessions on
/// every CPU; its counts are atomics, raised against their caps by compare-and-swap.
#[derive(Debug)]
pub struct Tenant {
    id: u64,
    key: TenantKey,
    memory: Arc<Group>,
    /// Connection slots taken ([`SlotTicket`]s alive).
    conns: AtomicUsize,
    fids: AtomicUsize,
    in_flight: AtomicUsize,
    /// Connections that stopped reading at the in-flight cap, woken when one of the
    /// tenant's requests completes.
    in_flight_waiters: Locked<Vec<Waker>>,
    cpu: CpuShare,
    refused: Refusals,
}

/// Times a tenant was refused, by limit.
#[derive(Debug, Default)]
struct Refusals {
    conns: AtomicU64,
    fids: AtomicU64,
    locks: AtomicU64,
    in_flight: AtomicU64,
}

impl Tenant {
    fn new(id: u64, key: TenantKey) -> Tenant {
        Tenant {
            id,
            key,
            memory: Arc::new(Group::default()),
            conns: AtomicUsize::new(0),
            fids: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            in_flight_waiters: Locked::new(Vec::new()),
            cpu: CpuShare::default(),
            refused: Refusals::default(),
        }
    }

    /// Its number (unique among the server's tenants, never reused).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Who it is.
    pub fn key(&self) -> &TenantKey {
        &self.key
    }

    /// The memory group its connections' accounts belong to.
    pub fn memory(&self) -> &Arc<Group> {
        &self.memory
    }

    /// Connection slots it holds.
    pub fn conns(&self) -> usize {
        self.conns.load(Relaxed)
    }

    /// Fids its connections hold.
    pub fn fids(&self) -> usize {
        self.fids.load(Relaxed)
    }

    /// Requests of its connections in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Relaxed)
    }

    /// Its CPU share's state.
    pub fn cpu(&self) -> &CpuShare {
        &self.cpu
    }

    /// Takes `n` fids if that keeps it within `max` (counted when not).
    pub(crate) fn take_fids(&self, n: usize, max: usize) -> bool {
        let ok = try_raise(&self.fids, n, max);
        if !ok {
            self.refused.fids.fetch_add(1, Relaxed);
        }
        ok
    }

    /// Gives `n` fids back.
    pub(crate) fn release_fids(&self, n: usize) {
        lower(&self.fids, n);
    }

    /// Counts a lock request refused for the tenant's lock cap.
    pub(crate) fn lock_refused(&self) {
        self.refused.locks.fetch_add(1, Relaxed);
    }

    /// Whether its requests in flight are at `max`: its connections stop reading.
    pub(crate) fn in_flight_full(&self, max: usize) -> bool {
        self.in_flight() >= max
    }

    /// Counts a connection that stopped reading at the in-flight cap.
    pub(crate) fn in_flight_stopped(&self) {
        self.refused.in_flight.fetch_add(1, Relaxed);
    }

    /// Wakes `waker` once one of its requests completes. Register before the last check
    /// of [`Tenant::in_flight_full`], so a completion on another CPU in between wakes it.
    pub(crate) fn wait_in_flight(&self, waker: &Waker) {
        self.in_flight_waiters.with(|w| {
            if !w.iter().any(|x| x.will_wake(waker)) {
                w.push(waker.clone());
            }
        });
    }

    /// A request of its connections starts: in flight until the token is dropped. Not
    /// refused: the cap stops its connections' input ([`Tenant::in_flight_full`]), so it
    /// is passed by at most the frames already read when it was reached.
    pub(crate) fn enter(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(self.clone())
    }

    /// What it holds and was refused, for the counters.
    pub fn stats(&self) -> TenantStats {
        TenantStats {
            tenant: alloc::format!("{}", self.key),
            conns: self.conns() as u64,
            memory: self.memory.charged() as u64,
            fids: self.fids() as u64,
            in_flight: self.in_flight() as u64,
            locks: 0,
            cpu_ns: self.cpu.used_ns(),
            refused_conns: self.refused.conns.load(Relaxed),
            refused_fids: self.refused.fids.load(Relaxed),
            refused_locks: self.refused.locks.load(Relaxed),
            in_flight_waits: self.refused.in_flight.load(Relaxed),
        }
    }
}

/// What one tenant holds and was refused (the `tenants` part of the counters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TenantStats {
    /// Who ([`TenantKey`]'s display form: `export:NAME`, `client:ADDR`, `local`).
    pub tenant: String,
    /// Connection slots held.
    pub conns: u64,
    /// Bytes of the memory budget held.
    pub memory: u64,
    /// Fids held.
    pub fids: u64,
    /// Requests in flight.
    pub in_flight: u64,
    /// POSIX locks held.
    pub locks: u64,
    /// Time its connections spent serving (ns, with a clock).
    pub cpu_ns: u64,
    /// Connections refused or shed for the tenant's slot share.
    pub refused_conns: u64,
    /// Fids refused for the tenant's cap (`EMFILE`).
    pub refused_fids: u64,
    /// Locks refused for the tenant's cap (`ENOLCK`).
    pub refused_locks: u64,
    /// Times a connection stopped reading at the tenant's in-flight cap.
    pub in_flight_waits: u64,
}

/// A request of a tenant in flight: its slot is given back, and a connection waiting
/// for one woken, when this is dropped (the request's reply was made or dropped).
#[derive(Debug)]
pub struct InFlight(Arc<Tenant>);

impl Drop for InFlight {
    fn drop(&mut self) {
        lower(&self.0.in_flight, 1);
        // Woken outside the lock: a waker may run arbitrary code.
        let waiters = self.0.in_flight_waiters.with(core::mem::take);
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// A connection slot of a tenant, taken at admission and given back when dropped (the
/// connection ended, or never reached its worker).
#[derive(Debug)]
pub struct SlotTicket(Arc<Tenant>);

impl SlotTicket {
    /// The tenant whose slot it is.
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.0
    }
}

impl Drop for SlotTicket {
    fn drop(&mut self) {
        lower(&self.0.conns, 1);
    }
}

/// A tenant's CPU share: fair between tenants, then between a tenant's connections.
///
/// A connection serves for at most a quantum per turn before the executor runs the next
/// task in its round robin (`crate::conn`); per tenant, that quantum is divided among the
/// tenant's connections that want the CPU now (*runnable*: in a turn, or yielded with
/// work left), so that in one round a tenant's connections together get about one
/// quantum, however many there are. Where tenants compete on a CPU they share it about
/// evenly; a CPU with one tenant's work only is still used to the full (the shares
/// never leave a CPU idle, and no task spins waiting for its turn). The grain is one
/// request: a turn serves at least one, so a tenant whose requests each take longer
/// than its divided quantum gets more than its share.
#[derive(Debug, Default)]
pub struct CpuShare {
    /// Service time, ns.
    used_ns: AtomicU64,
    /// Its connections in a turn or waiting for one.
    runnable: AtomicUsize,
}

impl CpuShare {
    /// Time its connections spent serving, ns.
    pub fn used_ns(&self) -> u64 {
        self.used_ns.load(Relaxed)
    }

    /// Its connections waiting for the CPU or in a turn.
    pub fn runnable(&self) -> usize {
        self.runnable.load(Relaxed)
    }

    /// A connection becomes runnable.
    pub(crate) fn wake(&self) {
        self.runnable.fetch_add(1, Relaxed);
    }

    /// A runnable connection waits for its client, or ended.
    pub(crate) fn idle(&self) {
        lower(&self.runnable, 1);
    }

    /// A turn's quantum for one of its runnable connections: `quantum` divided among
    /// them.
    pub(crate) fn quantum(&self, quantum: u64) -> u64 {
        quantum / self.runnable().max(1) as u64
    }

    /// A turn served for `ns`.
    pub(crate) fn used(&self, ns: u64) {
        self.used_ns.fetch_add(ns, Relaxed);
    }
}

/// The tenants of a server. See the module documentation.
#[derive(Debug)]
pub struct Tenants {
    limits: TenantLimits,
    /// Export tenants, created with the server and kept (their counters persist).
    exports: Vec<Arc<Tenant>>,
    /// Client and local tenants, while they have connections.
    others: Locked<BTreeMap<TenantKey, Weak<Tenant>>>,
    next_id: AtomicU64,
}

impl Tenants {
    /// The tenants of a server with `exports` and `limits`.
    pub fn new(exports: &[Export], limits: TenantLimits) -> Tenants {
        let exports: Vec<Arc<Tenant>> = exports
            .iter()
            .filter(|e| e.allow.is_some() && e.name != ADMIN_EXPORT)
            .enumerate()
            .map(|(i, e)| Arc::new(Tenant::new(i as u64, TenantKey::Export(e.name.clone()))))
            .collect();
        Tenants {
            limits,
            next_id: AtomicU64::new(exports.len() as u64),
            exports,
            others: Locked::new(BTreeMap::new()),
        }
    }

    /// The caps.
    pub fn limits(&self) -> &TenantLimits {
        &self.limits
    }

    /// The tenant of a client at `peer`, given the server's `exports` (see the module
    /// documentation).
    pub fn tenant_of(&self, exports: &[Export], peer: Option<IpAddr>) -> Arc<Tenant> {
        let own = exports
            .iter()
            .filter(|e| e.name != ADMIN_EXPORT)
            .filter_map(|e| e.allow.as_ref().map(|a| (e, a)))
            .find(|(_, a)| a.admits(peer));
        if let Some((export, _)) = own {
            if let Some(t) = self
                .exports
                .iter()
                .find(|t| t.key == TenantKey::Export(export.name.clone()))
            {
                return t.clone();
            }
        }
        let Some(peer) = peer else {
            // Not registered: nobody else can be told apart from it to share with.
            return Arc::new(Tenant::new(
                self.next_id.fetch_add(1, Relaxed),
                TenantKey::Local,
            ));
        };
        let key = TenantKey::Client(peer);
        self.others.with(|others| {
            others.retain(|_, w| w.strong_count() > 0);
            if let Some(t) = others.get(&key).and_then(Weak::upgrade) {
                return t;
            }
            let t = Arc::new(Tenant::new(self.next_id.fetch_add(1, Relaxed), key.clone()));
            others.insert(key, Arc::downgrade(&t));
            t
        })
    }

    /// Every tenant with connections, and every export tenant.
    pub fn all(&self) -> Vec<Arc<Tenant>> {
        let mut all = self.exports.clone();
        self.others
            .with(|o| all.extend(o.values().filter_map(Weak::upgrade)));
        all
    }

    /// Takes a connection slot for `tenant` if it holds fewer than `max`.
    pub fn take_slot(&self, tenant: &Arc<Tenant>, max: usize) -> Option<SlotTicket> {
        try_raise(&tenant.conns, 1, max).then(|| SlotTicket(tenant.clone()))
    }

    /// Counts a connection of `tenant` refused (at its cap or the global one) or shed
    /// for another tenant's share.
    pub fn slot_refused(&self, tenant: &Tenant) {
        tenant.refused.conns.fetch_add(1, Relaxed);
    }

    /// A tenant's fair share of `total` slots: `total` divided among the tenants holding
    /// slots, `tenant` counted among them.
    pub fn fair_slots(&self, tenant: &Tenant, total: usize) -> usize {
        let holders = self
            .all()
            .iter()
            .filter(|t| t.conns() > 0 || t.id == tenant.id)
            .count();
        total / holders.max(1)
    }
}

/// Raises `cell` by `n` if that keeps it at most `max`.
fn try_raise(cell: &AtomicUsize, n: usize, max: usize) -> bool {
    cell.fetch_update(Relaxed, Relaxed, |now| {
        (now.saturating_add(n) <= max).then_some(now + n)
    })
    .is_ok()
}

/// Lowers `cell` by `n`.
fn lower(cell: &AtomicUsize, n: usize) {
    let before = cell.fetch_sub(n, Relaxed);
    debug_assert!(before >= n, "a tenant gave back more than it held");
}
