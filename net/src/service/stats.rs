//! The service's connection counters (the protocol's own are the server's,
//! [`crate::server::Stats`]).
//!
//! Connections are served on several workers (the appliance's CPUs, `ninefold serve`'s
//! threads), so every counter is an atomic (relaxed: each is a count on its own, read for
//! reports), and what every request touches — bytes moved — is kept per worker
//! ([`WorkerServing`], each on its own cache line) so workers do not share a line per
//! request; the totals are summed once, here.

use alloc::boxed::Box;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// Raises the count to `n` if it is lower (for a high-water mark).
    pub fn raise_to(&self, n: u64) {
        self.0.fetch_max(n, Relaxed);
    }

    /// The count.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// What the service did with connections, in all and per worker.
#[derive(Debug)]
pub struct ServiceStats {
    /// Connections accepted (admitted and handed to a worker).
    pub accepted: Counter,
    /// Connections whose task has ended.
    pub closed: Counter,
    /// ... of which the peer closed cleanly (FIN) first.
    pub peer_closed: Counter,
    /// ... of which ended by a reset or timeout (no FIN).
    pub reset: Counter,
    /// ... of which the server closed after a protocol violation.
    pub protocol_closed: Counter,
    /// ... of which did not finish closing in time and were aborted.
    pub aborted: Counter,
    /// ... of which the server shed (reset): deadline passed, memory or slot reclaimed.
    pub shed: Counter,
    /// ... of which the server closed for a shutdown, their requests answered first.
    pub shutdown_closed: Counter,
    /// ... of which the server shed for a shutdown: not finished within the grace time.
    pub shutdown_shed: Counter,
    /// Clients reset at once: the connection limit was reached and no slot could be
    /// reclaimed.
    pub refused: Counter,
    /// Clients reset at once: their tenant had its share of connections open.
    pub tenant_refused: Counter,
    /// Listening sockets that could not be created (memory) or bound.
    pub listen_errors: Counter,
    /// What the connections of each worker did, by worker index.
    workers: Box<[WorkerServing]>,
}

impl ServiceStats {
    /// Counters for a service with `workers` workers (at least one).
    pub fn new(workers: usize) -> Self {
        ServiceStats {
            accepted: Counter::default(),
            closed: Counter::default(),
            peer_closed: Counter::default(),
            reset: Counter::default(),
            protocol_closed: Counter::default(),
            aborted: Counter::default(),
            shed: Counter::default(),
            shutdown_closed: Counter::default(),
            shutdown_shed: Counter::default(),
            refused: Counter::default(),
            tenant_refused: Counter::default(),
            listen_errors: Counter::default(),
            workers: (0..workers.max(1))
                .map(|_| WorkerServing::default())
                .collect(),
        }
    }

    /// Connections open now.
    pub fn active(&self) -> u64 {
        self.accepted.get() - self.closed.get()
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The counters of the connections worker `worker` serves (the last worker's for an
    /// index past it: a caller's bug must not take the service down).
    pub fn worker(&self, worker: usize) -> &WorkerServing {
        debug_assert!(
            worker < self.workers.len(),
            "worker {worker} of {}",
            self.workers.len()
        );
        &self.workers[worker.min(self.workers.len() - 1)]
    }

    /// Bytes received from clients, on every worker.
    pub fn rx_bytes(&self) -> u64 {
        self.workers.iter().map(|c| c.rx_bytes.get()).sum()
    }

    /// Bytes sent to clients, on every worker.
    pub fn tx_bytes(&self) -> u64 {
        self.workers.iter().map(|c| c.tx_bytes.get()).sum()
    }
}

/// What the connections served on one worker did: bumped by every request, so each
/// worker has its own (on its own cache line).
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct WorkerServing {
    /// Connections handed to this worker.
    pub accepted: Counter,
    /// ... whose task has ended.
    pub closed: Counter,
    /// Bytes received from their clients.
    pub rx_bytes: Counter,
    /// Bytes sent to their clients.
    pub tx_bytes: Counter,
}

impl WorkerServing {
    /// Connections this worker serves now.
    pub fn active(&self) -> u64 {
        self.accepted.get() - self.closed.get()
    }
}

impl fmt::Display for ServiceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} accepted, {} active, {} closed ({} by peer, {} reset, {} protocol, {} aborted, {} shed, {} for shutdown, {} shed for shutdown), {} refused, rx {} B, tx {} B, {} listen errors",
            self.accepted.get(),
            self.active(),
            self.closed.get(),
            self.peer_closed.get(),
            self.reset.get(),
            self.protocol_closed.get(),
            self.aborted.get(),
            self.shed.get(),
            self.shutdown_closed.get(),
            self.shutdown_shed.get(),
            self.refused.get(),
            self.rx_bytes(),
            self.tx_bytes(),
            self.listen_errors.get()
        )
    }
}
