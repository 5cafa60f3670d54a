//! Per-cause counters of the network stack. The 9P service's are the serving policy's
//! (`ninep::service::stats`), whose [`Counter`] these use too. Interrupt handlers count
//! in the kernel's own per-vector counters (`irq::count`), not here.

use core::fmt;

pub use ninep::service::stats::Counter;

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

impl NicStats {
    /// Their values now, for the `stats` event.
    pub fn counts(&self) -> crate::event::NicCounts {
        crate::event::NicCounts {
            rx_frames: self.rx_frames.get(),
            rx_bytes: self.rx_bytes.get(),
            rx_longest: self.rx_longest.get(),
            rx_errors: self.rx_errors.get(),
            tx_frames: self.tx_frames.get(),
            tx_bytes: self.tx_bytes.get(),
            tx_dropped: self.tx_dropped.get(),
            tx_queue_full: self.tx_queue_full.get(),
        }
    }
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
