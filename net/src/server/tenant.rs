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

use super::export::{Export, ADMIN_EXPORT, DEFAULT_CPU_WEIGHT};
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
    /// CPU weight ([`Export::weight`]; [`DEFAULT_CPU_WEIGHT`] for client tenants).
    weight: u32,
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
    fn new(id: u64, key: TenantKey, weight: u32) -> Tenant {
        Tenant {
            id,
            key,
            weight: weight.max(1),
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

    /// Its CPU weight.
    pub fn weight(&self) -> u32 {
        self.weight
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
            cpu_weight: u64::from(self.weight),
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
    /// Its CPU weight ([`Export::weight`]).
    pub cpu_weight: u64,
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

impl Drop for SlotTicket {
    fn drop(&mut self) {
        lower(&self.0.conns, 1);
    }
}

/// A tenant's CPU share: weighted fair between tenants (by virtual time, as group
/// scheduling does; [`Export::weight`]), then fair between a tenant's connections (the
/// executor's round robin).
///
/// Each turn a connection serves ([`crate::conn::Connection::run`]) adds its time, divided
/// by its tenant's weight relative to the default, to its tenant's virtual time. On each worker (CPU or thread), a tenant is *runnable* while
/// one of its connections there is in a turn or yielded with work left; a connection
/// whose tenant is more than a slack ahead of the least of the other tenants runnable on
/// its worker lets its turn go (it yields without serving) until they catch up. So
/// tenants competing for a worker share it evenly however many connections each has,
/// while a worker with one tenant's work only serves it to the full (the comparison is
/// per worker, the virtual time global: a tenant busy on two workers is ahead of one busy
/// on one, and yields to it where they meet). A tenant that becomes runnable starts no
/// further behind than the slack, so idling banks no CPU time. The grain is one turn.
#[derive(Debug, Default)]
pub struct CpuShare {
    /// Service time, ns.
    used_ns: AtomicU64,
    /// Virtual time: service time, ns, plus the catch-ups when it became runnable.
    vtime: AtomicU64,
}

impl CpuShare {
    /// Time its connections spent serving, ns.
    pub fn used_ns(&self) -> u64 {
        self.used_ns.load(Relaxed)
    }

    fn vtime(&self) -> u64 {
        self.vtime.load(Relaxed)
    }
}

/// The tenants runnable on one worker: their runnable connections there.
type Busy = BTreeMap<u64, (usize, Arc<Tenant>)>;

/// The tenants of a server. See the module documentation.
#[derive(Debug)]
pub struct Tenants {
    /// Export tenants, created with the server and kept (their counters persist).
    exports: Vec<Arc<Tenant>>,
    /// Client and local tenants, while they have connections.
    others: Locked<BTreeMap<TenantKey, Weak<Tenant>>>,
    next_id: AtomicU64,
    /// Per worker, the tenants runnable there ([`CpuShare`]).
    busy: Locked<BTreeMap<usize, Busy>>,
    /// How far ahead of the others a tenant may run on a worker, ns.
    cpu_slack_ns: u64,
}

impl Tenants {
    /// The tenants of a server with `exports`; a tenant may run
    /// `cpu_slack_ns` ahead of the others on a worker ([`CpuShare`]).
    pub fn new(exports: &[Export], cpu_slack_ns: u64) -> Tenants {
        let exports: Vec<Arc<Tenant>> = exports
            .iter()
            .filter(|e| e.allow.is_some() && e.name != ADMIN_EXPORT)
            .enumerate()
            .map(|(i, e)| {
                let key = TenantKey::Export(e.name.clone());
                Arc::new(Tenant::new(i as u64, key, e.weight))
            })
            .collect();
        Tenants {
            next_id: AtomicU64::new(exports.len() as u64),
            exports,
            others: Locked::new(BTreeMap::new()),
            busy: Locked::new(BTreeMap::new()),
            cpu_slack_ns,
        }
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
                DEFAULT_CPU_WEIGHT,
            ));
        };
        let key = TenantKey::Client(peer);
        self.others.with(|others| {
            others.retain(|_, w| w.strong_count() > 0);
            if let Some(t) = others.get(&key).and_then(Weak::upgrade) {
                return t;
            }
            let id = self.next_id.fetch_add(1, Relaxed);
            let t = Arc::new(Tenant::new(id, key.clone(), DEFAULT_CPU_WEIGHT));
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

    /// A connection of `tenant` on `worker` became runnable (woken, or starting a turn
    /// unannounced): if the tenant was not runnable there, its virtual time catches up to
    /// within the slack of the least of the others'.
    fn cpu_runnable(&self, tenant: &Arc<Tenant>, worker: usize) {
        let slack = self.cpu_slack_ns;
        self.busy.with(|busy| {
            let here = busy.entry(worker).or_default();
            let least = least_other(here, tenant.id);
            let (n, _) = here.entry(tenant.id).or_insert((0, tenant.clone()));
            *n += 1;
            if let (1, Some(least)) = (*n, least) {
                tenant
                    .cpu
                    .vtime
                    .fetch_max(least.saturating_sub(slack), Relaxed);
            }
        });
    }

    /// Whether a runnable connection of `tenant` on `worker` may take its turn: its tenant
    /// is not more than the slack ahead of any other tenant runnable there.
    pub fn cpu_may_serve(&self, tenant: &Tenant, worker: usize) -> bool {
        let mine = tenant.cpu.vtime();
        self.busy.with(|busy| {
            busy.get(&worker)
                .and_then(|here| least_other(here, tenant.id))
                .is_none_or(|least| mine <= least.saturating_add(self.cpu_slack_ns))
        })
    }

    /// A turn of a connection of `tenant` served for `ns`: its virtual time advances
    /// by `ns` scaled by the default weight over its own, so a tenant of twice the
    /// weight runs twice as long for the same virtual time.
    pub fn cpu_used(&self, tenant: &Tenant, ns: u64) {
        tenant.cpu.used_ns.fetch_add(ns, Relaxed);
        let scaled = u128::from(ns) * u128::from(DEFAULT_CPU_WEIGHT) / u128::from(tenant.weight);
        let scaled = u64::try_from(scaled).unwrap_or(u64::MAX);
        tenant.cpu.vtime.fetch_add(scaled, Relaxed);
    }

    /// A runnable connection of `tenant` on `worker` waits for its client, or ended.
    fn cpu_idle(&self, tenant: &Tenant, worker: usize) {
        self.busy.with(|busy| {
            let Some(here) = busy.get_mut(&worker) else {
                return;
            };
            if let Some((n, _)) = here.get_mut(&tenant.id) {
                *n -= 1;
                if *n == 0 {
                    here.remove(&tenant.id);
                }
            }
            if here.is_empty() {
                busy.remove(&worker);
            }
        });
    }
}

/// The least virtual time among the tenants runnable on a worker but `tenant`.
fn least_other(here: &Busy, tenant: u64) -> Option<u64> {
    here.values()
        .filter(|(_, t)| t.id != tenant)
        .map(|(_, t)| t.cpu.vtime())
        .min()
}

/// What a connection's task is woken through: it counts the connection among its
/// tenant's runnable ones on its worker from the wake (or the start of a turn) until its
/// turn ends with nothing to do ([`CpuWaker::idle`]), so that tenants waiting for the CPU
/// are seen by the turns of the others ([`CpuShare`]).
#[derive(Debug)]
pub struct CpuWaker {
    tenants: Arc<Tenants>,
    tenant: Arc<Tenant>,
    worker: usize,
    /// Counted as runnable.
    runnable: core::sync::atomic::AtomicBool,
    /// The task's own waker.
    inner: Locked<Option<Waker>>,
}

impl CpuWaker {
    /// For a connection of `tenant` on `worker`.
    pub fn new(tenants: Arc<Tenants>, tenant: Arc<Tenant>, worker: usize) -> Arc<CpuWaker> {
        Arc::new(CpuWaker {
            tenants,
            tenant,
            worker,
            runnable: core::sync::atomic::AtomicBool::new(false),
            inner: Locked::new(None),
        })
    }

    /// The waker to poll with, waking `task` (updated when the task's waker changes).
    pub fn wrap(self: &Arc<Self>, task: &Waker) -> Waker {
        self.inner.with(|w| {
            if !w.as_ref().is_some_and(|old| old.will_wake(task)) {
                *w = Some(task.clone());
            }
        });
        Waker::from(self.clone())
    }

    /// Counts the connection runnable (if it was not).
    pub fn runnable(&self) {
        if !self.runnable.swap(true, Relaxed) {
            self.tenants.cpu_runnable(&self.tenant, self.worker);
        }
    }

    /// The connection has nothing to do until woken, or ended.
    pub fn idle(&self) {
        if self.runnable.swap(false, Relaxed) {
            self.tenants.cpu_idle(&self.tenant, self.worker);
        }
    }

    /// Whether the connection may take its turn now ([`Tenants::cpu_may_serve`]).
    pub fn may_serve(&self) -> bool {
        self.tenants.cpu_may_serve(&self.tenant, self.worker)
    }

    /// A turn served for `ns`.
    pub fn used(&self, ns: u64) {
        self.tenants.cpu_used(&self.tenant, ns);
    }
}

impl alloc::task::Wake for CpuWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.runnable();
        let task = self.inner.with(|w| w.clone());
        if let Some(task) = task {
            task.wake();
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::AllowList;

    fn exports() -> Vec<Export> {
        let export = |name: &str, allow: &str| Export {
            allow: Some(AllowList::parse(allow).unwrap()),
            ..Export::root(name)
        };
        vec![
            Export::admin(AllowList::parse("10.0.0.0/8").unwrap()),
            export("a", "10.1.0.0/16"),
            export("b", "10.2.0.0/16"),
            Export::root("open"),
        ]
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_export_with_its_own_allow_list_is_a_tenant_else_a_client_address() {
        let e = exports();
        let t = Tenants::new(&e, 1000);
        let a1 = t.tenant_of(&e, ip("10.1.0.1"));
        let a2 = t.tenant_of(&e, ip("10.1.9.9"));
        assert!(Arc::ptr_eq(&a1, &a2), "one tenant from two addresses");
        assert_eq!(*a1.key(), TenantKey::Export("a".into()));
        // The administration export is never a tenant: its clients are by address.
        let admin = t.tenant_of(&e, ip("10.9.0.1"));
        assert_eq!(*admin.key(), TenantKey::Client("10.9.0.1".parse().unwrap()));
        assert!(Arc::ptr_eq(&admin, &t.tenant_of(&e, ip("10.9.0.1"))));
        // Unknown peers are each a tenant by themselves.
        let (x, y) = (t.tenant_of(&e, None), t.tenant_of(&e, None));
        assert_ne!(x.id(), y.id());
        // Client tenants go when their last holder does; export tenants stay.
        drop(admin);
        let keys: Vec<_> = t.all().iter().map(|t| t.key().clone()).collect();
        assert_eq!(
            keys,
            [TenantKey::Export("a".into()), TenantKey::Export("b".into())]
        );
    }

    /// Two tenants always runnable on one worker, each turn as long as the other's:
    /// turns go in proportion to their weights.
    #[test]
    fn tenants_share_a_worker_in_proportion_to_their_weights() {
        let mut e = exports();
        e[1].weight = 300; // a
        let t = Arc::new(Tenants::new(&e, 1000));
        let (a, b) = (
            t.tenant_of(&e, ip("10.1.0.1")),
            t.tenant_of(&e, ip("10.2.0.1")),
        );
        assert_eq!((a.weight(), b.weight()), (300, DEFAULT_CPU_WEIGHT));
        let (a0, b0) = (
            CpuWaker::new(t.clone(), a.clone(), 0),
            CpuWaker::new(t.clone(), b.clone(), 0),
        );
        a0.runnable();
        b0.runnable();
        let mut turns = [0u32; 2];
        for _ in 0..4000 {
            // The executor's round robin: each in turn, if its tenant may serve.
            for (i, w) in [&a0, &b0].into_iter().enumerate() {
                if w.may_serve() {
                    w.used(10_000);
                    turns[i] += 1;
                }
            }
        }
        let ratio = f64::from(turns[0]) / f64::from(turns[1]);
        assert!((2.9..3.1).contains(&ratio), "turns {turns:?}");
        assert_eq!(a.stats().cpu_weight, 300);
    }

    #[test]
    fn a_tenant_ahead_of_another_on_its_worker_lets_its_turn_go() {
        let e = exports();
        let t = Arc::new(Tenants::new(&e, 1000));
        let (a, b) = (
            t.tenant_of(&e, ip("10.1.0.1")),
            t.tenant_of(&e, ip("10.2.0.1")),
        );
        let a0 = CpuWaker::new(t.clone(), a.clone(), 0);
        let b0 = CpuWaker::new(t.clone(), b.clone(), 0);
        a0.runnable();
        assert!(a0.may_serve(), "alone on the worker");
        a0.used(10_000);
        // B becomes runnable 10 µs behind: it catches up to the slack (1 µs) behind.
        b0.runnable();
        assert_eq!(b.cpu().vtime(), 9_000);
        assert!(b0.may_serve() && a0.may_serve());
        a0.used(1);
        assert!(!a0.may_serve(), "more than the slack ahead of B");
        assert!(b0.may_serve());
        // On a worker where B is not runnable, A serves to the full.
        let a1 = CpuWaker::new(t.clone(), a.clone(), 1);
        a1.runnable();
        assert!(a1.may_serve());
        b0.used(2_000);
        assert!(a0.may_serve() && b0.may_serve());
        // B goes idle: A is alone again; B banks nothing for its idle time.
        b0.idle();
        a0.used(100_000);
        assert!(a0.may_serve());
        b0.runnable();
        assert_eq!(b.cpu().vtime(), a.cpu().vtime() - 1_000);
        // A waker wakes its task and counts it runnable.
        b0.idle();
        let woken = Arc::new(core::sync::atomic::AtomicUsize::new(0));
        struct Count(Arc<core::sync::atomic::AtomicUsize>);
        impl alloc::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Relaxed);
            }
        }
        let waker = b0.wrap(&Waker::from(Arc::new(Count(woken.clone()))));
        waker.wake_by_ref();
        assert_eq!(woken.load(Relaxed), 1);
        a0.used(2_000);
        assert!(!a0.may_serve(), "B, woken, is runnable and behind");
        b0.idle();
        a0.idle();
        a1.idle();
        assert!(t.busy.with(|b| b.is_empty()), "nothing left runnable");
    }
}
