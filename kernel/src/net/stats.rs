//! Per-cause counters of the network stack and the 9P service.
//!
//! Connections are served on every CPU, so the counters are atomics (relaxed: each is a
//! count on its own, read for reports), and what every request touches — bytes moved,
//! connections open — is kept per CPU ([`CpuServing`]) so CPUs do not share a cache line
//! per request; the totals are summed once, here. Interrupt handlers count in the
//! kernel's own per-vector counters (`irq::count`), not here.

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::hal::percpu::{self, MAX_CPUS};

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

/// The NIC's counters.
#[derive(Debug, Default)]
pub struct NicStats {
    /// Frames received.
    pub rx_frames: Counter,
    /// Bytes received (Ethernet frames).
    pub rx_bytes: Counter,
    /// Longest frame received, in bytes (above 1514: jumbo frames, `mtu=`).
    pub rx_longest: Counter,
    /// Receive completions the device got wrong, or buffers that could not be reposted.
    pub rx_errors: Counter,
    /// Frames sent.
    pub tx_frames: Counter,
    /// Bytes sent (Ethernet frames).
    pub tx_bytes: Counter,
    /// Frames dropped: oversized, or refused by the device.
    pub tx_dropped: Counter,
    /// Times smoltcp found the transmit queue full.
    pub tx_queue_full: Counter,
}

impl fmt::Display for NicStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rx {} frames {} B (longest {} B, {} errors), tx {} frames {} B ({} dropped, queue full {}x)",
            self.rx_frames.get(),
            self.rx_bytes.get(),
            self.rx_longest.get(),
            self.rx_errors.get(),
            self.tx_frames.get(),
            self.tx_bytes.get(),
            self.tx_dropped.get(),
            self.tx_queue_full.get()
        )
    }
}

/// The 9P service's connection counters (the protocol's own are in
/// `ninep::server::Stats`).
#[derive(Debug, Default)]
pub struct ServiceStats {
    /// Connections accepted.
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
    /// Listening sockets that could not be created (memory) or bound.
    pub listen_errors: Counter,
    /// What the connections of each CPU did, by CPU index.
    per_cpu: [CpuServing; MAX_CPUS],
}

impl ServiceStats {
    /// Connections open now.
    pub fn active(&self) -> u64 {
        self.accepted.get() - self.closed.get()
    }

    /// The counters of the connections CPU `cpu` serves.
    pub fn cpu(&self, cpu: usize) -> &CpuServing {
        &self.per_cpu[cpu]
    }

    /// The counters of the connections served on the CPU we run on.
    pub fn local(&self) -> &CpuServing {
        self.cpu(percpu::index())
    }

    /// Bytes received from clients, on every CPU.
    pub fn rx_bytes(&self) -> u64 {
        self.per_cpu.iter().map(|c| c.rx_bytes.get()).sum()
    }

    /// Bytes sent to clients, on every CPU.
    pub fn tx_bytes(&self) -> u64 {
        self.per_cpu.iter().map(|c| c.tx_bytes.get()).sum()
    }
}

/// What the connections served on one CPU did: bumped by every request, so each CPU
/// has its own (on its own cache line).
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct CpuServing {
    /// Connections handed to this CPU.
    pub accepted: Counter,
    /// ... whose task has ended.
    pub closed: Counter,
    /// Bytes received from their clients.
    pub rx_bytes: Counter,
    /// Bytes sent to their clients.
    pub tx_bytes: Counter,
}

impl CpuServing {
    /// Connections this CPU serves now.
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
