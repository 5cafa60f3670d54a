//! The hostile-client suite: probes that attack the appliance the way a buggy or
//! malicious 9P client can, each while honest clients keep working, and the checks that
//! the appliance stays up, keeps serving the honest clients within a bounded latency,
//! keeps its memory budget and leaves a clean filesystem (`docs/testing.md`, "Hostile
//! clients").
//!
//! | module | what |
//! |---|---|
//! | [`raw`] | raw frames over TCP: pipelining without reading replies, tallies |
//! | [`honest`] | honest clients and their latency percentiles |
//! | [`probes`] | the probes, one function each |
//! | [`fuzz`] | seeded random and mutated frames |
//! | [`suite`] | booting the appliance, running probes under honest load, the checks, the report |
//!
//! `tests/tests/hostile.rs` runs a short slice (`make test`) and the soak (`make soak`).

pub mod fuzz;
pub mod honest;
pub mod probes;
pub mod raw;
pub mod suite;

use std::time::Duration;

/// How hard the probes push: [`Scale::short`] for `make test`, [`Scale::full`] for
/// `make soak`.
#[derive(Clone, Debug)]
pub struct Scale {
    /// `"short"` or `"full"`.
    pub name: &'static str,
    /// How long each attack (and the honest load around it) lasts, at least.
    pub window: Duration,
    /// Honest clients running during each probe.
    pub honest_clients: usize,
    /// Connection counts of the xattr-walk flood (one probe each).
    pub xattr_flood_conns: &'static [usize],
    /// Connection counts of the unread-read flood (one probe each).
    pub read_flood_conns: &'static [usize],
    /// Reads pipelined per connection by the unread-read flood.
    pub read_flood_depth: usize,
    /// Connections reading everything they can (the data cache flood), and the size of
    /// the file they read (more than the data cache of a 128 MiB appliance holds).
    pub cache_flood_conns: usize,
    /// See [`Scale::cache_flood_conns`].
    pub cache_flood_bytes: usize,
    /// Connections that never send a byte.
    pub silent_conns: usize,
    /// Connections sending frames that never finish.
    pub slowloris_conns: usize,
    /// One-byte locks taken in all, and the connections they are spread over.
    pub locks: usize,
    /// See [`Scale::locks`].
    pub lock_conns: usize,
    /// Locks with 65,535-byte client ids.
    pub long_id_locks: usize,
    /// Connections pipelining getattrs at full speed.
    pub fairness_conns: usize,
    /// Connections walking into every fid they may have.
    pub fid_flood_conns: usize,
    /// Frames sent by the fuzzer, and the connections sending them at once.
    pub fuzz_frames: usize,
    /// See [`Scale::fuzz_frames`].
    pub fuzz_conns: usize,
    /// Request/flush pairs of the flush storm.
    pub flush_pairs: usize,
    /// Entries of the wide directory, and levels of the deep one.
    pub wide_entries: usize,
    /// See [`Scale::wide_entries`].
    pub deep_levels: usize,
    /// Seconds a new connection has to complete `Tversion` (`handshake_timeout=`).
    pub handshake_timeout: Duration,
}

impl Scale {
    /// The slice `make test` runs: every probe, reduced, in a few minutes.
    pub fn short() -> Scale {
        Scale {
            name: "short",
            window: Duration::from_secs(8),
            honest_clients: 3,
            xattr_flood_conns: &[2],
            read_flood_conns: &[5],
            read_flood_depth: 1000,
            cache_flood_conns: 3,
            cache_flood_bytes: 40 << 20,
            silent_conns: 70,
            slowloris_conns: 12,
            locks: 4_000,
            lock_conns: 4,
            long_id_locks: 20,
            fairness_conns: 8,
            fid_flood_conns: 2,
            fuzz_frames: 3_000,
            fuzz_conns: 2,
            flush_pairs: 200,
            wide_entries: 300,
            deep_levels: 40,
            handshake_timeout: Duration::from_secs(3),
        }
    }

    /// `make soak`: every probe in full, with longer honest load.
    pub fn full() -> Scale {
        Scale {
            name: "full",
            window: Duration::from_secs(40),
            honest_clients: 6,
            xattr_flood_conns: &[2, 5],
            read_flood_conns: &[2, 5],
            read_flood_depth: 1000,
            cache_flood_conns: 8,
            cache_flood_bytes: 64 << 20,
            silent_conns: 100,
            slowloris_conns: 40,
            locks: 40_000,
            lock_conns: 10,
            long_id_locks: 500,
            fairness_conns: 32,
            fid_flood_conns: 4,
            fuzz_frames: 60_000,
            fuzz_conns: 4,
            flush_pairs: 2_000,
            wide_entries: 2_000,
            deep_levels: 200,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// The 9P limits the suite boots the appliance with (the defaults, except the handshake
/// deadline), which the probes push against.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// msize offered (`msize=`).
    pub msize: u32,
    /// Fids per connection (`max_fids=`).
    pub max_fids: u32,
    /// Connections (`max_conns=`).
    pub max_conns: usize,
    /// The handshake deadline (`handshake_timeout=`).
    pub handshake_timeout: Duration,
}

impl Limits {
    /// The limits for `scale`.
    pub fn for_scale(scale: &Scale) -> Limits {
        Limits {
            msize: 1 << 20,
            max_fids: 4096,
            max_conns: 64,
            handshake_timeout: scale.handshake_timeout,
        }
    }

    /// As kernel command-line options.
    pub fn kernel_options(&self) -> String {
        format!(
            // Every client of a QEMU user-network forward is 10.0.2.2: the per-address
            // limit must not get in the way of the probes.
            "msize={} max_fids={} max_conns={} max_conns_per_client={} handshake_timeout={}",
            self.msize,
            self.max_fids,
            self.max_conns,
            self.max_conns,
            self.handshake_timeout.as_secs()
        )
    }
}
