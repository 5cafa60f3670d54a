//! The 9P service's part of a counters document (`9p` in the appliance's and in
//! `ninefold serve`'s): the connections and the protocol's own counters, and how they
//! become metrics ([`METRIC_RULES`], applied by `metrics::document`).

use metrics::rule::Rule;
use vfs::FileSystem;

use super::Service;

/// The 9P service's counters: the connections ([`super::stats::ServiceStats`]) and the
/// protocol's own (`server::Stats`, `Timings`, `RequestStats`, `MemoryStats`, defined
/// once there and flattened into this object).
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct NinepReport {
    /// Connections open now.
    pub connections: u64,
    /// Connections accepted since the start.
    pub accepted: u64,
    /// Connections the server shed (reset): deadline passed, memory or slot reclaimed.
    pub shed: u64,
    /// Clients reset at once at the connection limit (no slot could be reclaimed).
    pub refused: u64,
    /// Clients reset at once because their tenant had its share of connections open.
    pub tenant_refused: u64,
    /// Connection requests held back because no listening socket was free (the
    /// appliance's SYN gate: a burst of clients connecting together; the gate keeps
    /// them and lets them in once a socket listens, or the client retransmits). 0 where
    /// the OS accepts.
    pub syns_held: u64,
    /// Bytes received from clients.
    pub rx_bytes: u64,
    /// Bytes sent to clients.
    pub tx_bytes: u64,
    /// The server's counters: requests, error replies, acknowledged writes and fsyncs,
    /// limits hit, connections shed per cause.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub server: crate::server::Stats,
    /// Nanoseconds requests spent in the server (decode to reply), by kind.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub timings: crate::server::Timings,
    /// Requests received by type (`requests_by_type`) and their latencies from receipt
    /// to reply (`request_latency`).
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub requests: crate::server::RequestStats,
    /// The memory budget for clients: limit, committed and peak bytes, bytes charged and
    /// charges refused per use.
    pub memory: crate::memory::MemoryStats,
    /// What each tenant holds and was refused (`crate::server::tenant`).
    pub tenants: alloc::vec::Vec<crate::server::TenantStats>,
}

impl<F: FileSystem + 'static> Service<F> {
    /// The service's counters now (`syns_held` is the listener's to fill in).
    pub fn report(&self) -> NinepReport {
        let (s, server) = (&self.stats, &self.server);
        NinepReport {
            connections: s.active(),
            accepted: s.accepted.get(),
            shed: s.shed.get(),
            refused: s.refused.get(),
            tenant_refused: s.tenant_refused.get(),
            syns_held: 0,
            rx_bytes: s.rx_bytes(),
            tx_bytes: s.tx_bytes(),
            server: server.stats(),
            timings: server.timings(),
            requests: server.request_stats(),
            memory: server.memory(),
            tenants: server.tenant_stats(),
        }
    }
}

/// How the `9p` object becomes metrics (`metrics::document`): what its paths alone do
/// not say. A counter without a rule is still exposed, as `ninefold_9p_<path>_total`.
pub const METRIC_RULES: &[Rule] = &[
    Rule::gauge("9p.connections")
        .named("9p_connections")
        .help("9P connections open."),
    Rule::counter("9p.accepted")
        .named("9p_connections_accepted")
        .help("9P connections accepted."),
    Rule::counter("9p.shed")
        .named("9p_connections_shed")
        .help("9P connections the server reset: deadline passed, memory or slot reclaimed."),
    Rule::counter("9p.syns_held")
        .named("9p_syns_held")
        .help("Connection requests held back until a listening socket was free (clients connecting together; kept and let in then, or retransmitted)."),
    Rule::counter("9p.refused")
        .named("9p_connections_refused")
        .help("9P clients reset at once at the connection limit (max_conns=)."),
    Rule::counter("9p.fsyncs")
        .named("fsyncs")
        .help("fsync and fdatasync requests acknowledged to 9P clients."),
    // The total is the sum of the series by type.
    Rule::skip("9p.requests"),
    Rule::keys("9p.requests_by_type", "type")
        .named("9p_requests")
        .help("9P requests received, by type."),
    Rule::keys("9p.request_latency", "type")
        .named("9p_request_duration_seconds")
        .help("Time from receipt of a 9P request to its reply being queued, by type."),
    Rule::gauge("9p.memory.limit")
        .named("9p_memory_limit_bytes")
        .help("Memory the 9P server may hold for clients (the memory budget)."),
    Rule::gauge("9p.memory.committed")
        .named("9p_memory_committed_bytes")
        .help("Memory committed to 9P clients now."),
    Rule::gauge("9p.memory.peak")
        .named("9p_memory_peak_bytes")
        .help("Most memory ever committed to 9P clients."),
    Rule::keys("9p.memory.charged", "use"),
    Rule::gauge("9p.memory.charged.*")
        .named("9p_memory_charged_bytes")
        .help("Memory charged to 9P clients now, by use."),
    Rule::keys("9p.memory.refused", "use")
        .named("9p_memory_refused")
        .help("Charges to the 9P memory budget refused, by use."),
    Rule::counter("9p.tenant_refused")
        .named("9p_connections_tenant_refused")
        .help("9P clients reset at once because their tenant had its share of connections open (max_conns_per_tenant=)."),
    Rule::elements("9p.tenants", "tenant", "tenant").named("9p_tenant"),
    Rule::gauge("9p.tenants.*.conns")
        .named("9p_tenant_connections")
        .help("9P connections open, by tenant."),
    Rule::gauge("9p.tenants.*.memory")
        .named("9p_tenant_memory_bytes")
        .help("Memory of the 9P budget held, by tenant."),
    Rule::gauge("9p.tenants.*.fids")
        .named("9p_tenant_fids")
        .help("Fids held, by tenant."),
    Rule::gauge("9p.tenants.*.in_flight")
        .named("9p_tenant_requests_in_flight")
        .help("Requests in flight, by tenant."),
    Rule::gauge("9p.tenants.*.locks")
        .named("9p_tenant_locks")
        .help("POSIX locks held, by tenant."),
    Rule::counter("9p.tenants.*.cpu_ns")
        .named("9p_tenant_cpu_seconds")
        .help("Time spent serving each tenant's connections."),
    Rule::gauge("9p.tenants.*.cpu_weight")
        .named("9p_tenant_cpu_weight")
        .help("A tenant's CPU weight (its export's weight=; 100 by default)."),
    Rule::counter("9p.tenants.*.refused_conns")
        .named("9p_tenant_connections_refused")
        .help("Connections refused or shed for the tenant's share of slots."),
    Rule::counter("9p.tenants.*.refused_fids")
        .named("9p_tenant_fids_refused")
        .help("Fids refused for the tenant's cap (EMFILE)."),
    Rule::counter("9p.tenants.*.refused_locks")
        .named("9p_tenant_locks_refused")
        .help("Locks refused for the tenant's cap (ENOLCK)."),
    Rule::counter("9p.tenants.*.in_flight_waits")
        .named("9p_tenant_in_flight_waits")
        .help("Times a connection stopped reading at its tenant's in-flight cap."),
];
