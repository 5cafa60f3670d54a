//! Per-cause counters of the network stack. The 9P service's are the serving policy's
//! (`ninep::service::stats`), whose [`Counter`] these use too. Interrupt handlers count
//! in the kernel's own per-vector counters (`irq::count`), not here.
//!
//! The NIC's counters are defined once, in the list below: the live counters
//! ([`NicStats`]) and their values at one moment ([`NicCounts`], the counters document's
//! `nic`, hence `/metrics`, and the `stats` event's `nic`) come from it.

use core::fmt;

pub use ninep::service::stats::Counter;
use serde::Serialize;

macro_rules! nic_counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// The NIC's counters, shared by every CPU that sends.
        #[derive(Debug, Default)]
        pub struct NicStats {
            $($(#[$doc])* pub $name: Counter,)*
        }

        /// The NIC's counters at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct NicCounts {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl NicStats {
            /// Their values now.
            pub fn counts(&self) -> NicCounts {
                NicCounts { $($name: self.$name.get(),)* }
            }
        }
    };
}

nic_counters! {
    /// Frames received.
    rx_frames,
    /// Bytes received (Ethernet frames).
    rx_bytes,
    /// Longest frame received, in bytes (above 1514: jumbo frames, `mtu=`).
    rx_longest,
    /// Receive completions the device got wrong, or buffers that could not be reposted.
    rx_errors,
    /// Frames received whose checksum the device vouched for (GUEST_CSUM: `DATA_VALID`,
    /// or a partial TCP checksum from a sender inside the host): not verified by the CPU.
    rx_csum_validated,
    /// TCP frames received whose checksum the NIC layer verified because the device had
    /// not (GUEST_CSUM negotiated; without it smoltcp verifies every one, uncounted).
    rx_csum_verified,
    /// Partial checksums of other protocols (UDP) completed for smoltcp.
    rx_csum_completed,
    /// Frames received and dropped for a wrong TCP checksum found by the NIC layer.
    rx_csum_errors,
    /// Frames handed to the device (a frame it segments counts once).
    tx_frames,
    /// Bytes handed to the device (Ethernet frames; a frame it segments with its
    /// headers once).
    tx_bytes,
    /// Frames sent whose TCP checksum the device completes (CSUM; segmented ones too).
    tx_csum_offloaded,
    /// Frames the device segments (TSO: segments smoltcp built one after another for
    /// one connection, joined).
    tx_gso_frames,
    /// The segments those frames carried (and become again on the wire).
    tx_gso_segments,
    /// Frames dropped: oversized, refused by the device, or unfit for the offload asked.
    tx_dropped,
    /// Times smoltcp found the transmit queue full.
    tx_queue_full,
}

impl fmt::Display for NicStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rx {} frames {} B (longest {} B, {} errors; checksums: {} by the device, {} verified, {} bad), \
             tx {} frames {} B ({} checksummed by the device, {} segmented into {}; {} dropped, queue full {}x)",
            self.rx_frames.get(),
            self.rx_bytes.get(),
            self.rx_longest.get(),
            self.rx_errors.get(),
            self.rx_csum_validated.get(),
            self.rx_csum_verified.get(),
            self.rx_csum_errors.get(),
            self.tx_frames.get(),
            self.tx_bytes.get(),
            self.tx_csum_offloaded.get(),
            self.tx_gso_frames.get(),
            self.tx_gso_segments.get(),
            self.tx_dropped.get(),
            self.tx_queue_full.get()
        )
    }
}
