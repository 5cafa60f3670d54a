//! Per-cause counters of the network stack and the 9P service.
//!
//! Single CPU, task context only: plain cells. Interrupt handlers count in the kernel's
//! own per-vector counters (`irq::count`), not here.

use core::cell::Cell;
use core::fmt;

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(Cell<u64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.set(self.0.get() + n);
    }

    /// Raises the count to `n` if it is lower (for a high-water mark).
    pub fn raise_to(&self, n: u64) {
        self.0.set(self.0.get().max(n));
    }

    /// The count.
    pub fn get(&self) -> u64 {
        self.0.get()
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
    /// Bytes received from clients.
    pub rx_bytes: Counter,
    /// Bytes sent to clients.
    pub tx_bytes: Counter,
    /// Listening sockets that could not be created (memory) or bound.
    pub listen_errors: Counter,
}

impl ServiceStats {
    /// Connections open now.
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
            self.rx_bytes.get(),
            self.tx_bytes.get(),
            self.listen_errors.get()
        )
    }
}
