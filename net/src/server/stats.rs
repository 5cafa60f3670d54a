//! Per-cause counters of a server, readable at any time, and its requests' latencies by
//! type.
//!
//! Connections on every CPU update them: each is an atomic added to without ordering
//! (`Relaxed`: a count needs no order with anything else, only to lose no update), read
//! once per snapshot.

use alloc::format;
use alloc::string::String;
#[cfg(test)]
use alloc::vec::Vec;
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::Relaxed;

use metrics::{LatencyHistogram, SharedLatencyHistogram};

use crate::wire::{Tmsg, TmsgType};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// A snapshot of a server's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        /// The live counters, shared by every CPU.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $($name: AtomicU64,)*
        }

        impl Counters {
            $(
                pub(crate) fn $name(&self) {
                    self.$name.fetch_add(1, Relaxed);
                }
            )*

            pub(crate) fn snapshot(&self) -> Stats {
                Stats { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Connections accepted.
    connections_opened,
    /// Connections torn down.
    connections_closed,
    /// Requests started (decoded or not).
    requests,
    /// Replies that were `Rlerror`.
    error_replies,
    /// Frames that did not decode (answered `Rlerror`).
    decode_errors,
    /// Frames whose size field was below the header or above msize (connection closed).
    bad_frame_sizes,
    /// Requests reusing a tag still in flight (connection closed).
    duplicate_tags,
    /// Requests refused for the per-connection fid limit (`EMFILE`).
    fid_limit_hits,
    /// Times a connection stopped reading because its in-flight limit was reached.
    in_flight_limit_hits,
    /// `Tflush` requests.
    flushes,
    /// Flushed requests whose reply was still sent (they had completed or could not be
    /// cancelled).
    flushed_replies_sent,
    /// Open fids released at clunk or teardown.
    releases,
    /// `Tfsync` requests answered successfully (the fsyncs a client saw acknowledged).
    fsyncs,
    /// ... of which with `datasync` set (fdatasync).
    datasyncs,
    /// `Twrite` requests answered successfully.
    writes,
    /// `Tversion`s with a version other than 9P2000.L (the session stays unversioned).
    unknown_versions,
    /// Connections closed for not completing `Tversion` in time.
    handshake_timeouts,
    /// Connections without fids closed for being quiet too long.
    idle_timeouts,
    /// Quiet connections without fids closed to give their slot to a new client.
    slot_reclaims,
    /// Connections closed to give back memory they held without using it.
    memory_reclaims,
    /// Times a connection stopped reading because its next frame or reply could not be
    /// charged to the memory budget (backpressure).
    memory_waits,
    /// Requests answered `ENOMEM` because state they would hold (fid, xattr value, lock)
    /// could not be charged.
    enomem_replies,
    /// Times a request waited for memory reclaimed from connections above their share
    /// before taking state it will hold (a fid, an xattr value) rather than answer
    /// `ENOMEM`.
    reclaim_waits,
    /// Times a connection's task gave the CPU to others after its quantum.
    cpu_yields,
    /// Turns a connection let go because its tenant was ahead of another tenant on its
    /// worker (`tenant::CpuShare`).
    cpu_deferrals,
    /// Connections refused at accept: their address had `max_conns_per_client` open.
    client_conn_limit_hits,
    /// Connections refused at accept: no export's allow-list admits the client's address.
    refused_connections,
    /// Attaches refused (`EACCES`) by the export's allow-list.
    refused_attaches,
    /// Lock requests refused for the per-connection lock limit (`ENOLCK`).
    conn_lock_limit_hits,
    /// Lock requests refused for the tenant's lock limit (`ENOLCK`).
    tenant_lock_limit_hits,
    /// Lock requests refused for the server-wide lock limit (`ENOLCK`).
    lock_limit_hits,
    /// Fids refused for the tenant's fid limit (`EMFILE`).
    tenant_fid_limit_hits,
    /// Times a connection stopped reading because its tenant's in-flight limit was
    /// reached.
    tenant_in_flight_waits,
    /// `Tlock`/`Tgetlock` requests refused for a client id over the length limit
    /// (`EINVAL`).
    long_client_ids,
}

/// Time requests spent in the server (from decoding to the reply frame), by kind, when
/// the server has a clock ([`super::Config::clock`]). With the clients' own latencies
/// this splits a request's time into server and transport/client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Timings {
    /// Nanoseconds in `Twrite`s.
    pub write_ns: u64,
    /// Nanoseconds in `Tfsync`s.
    pub fsync_ns: u64,
    /// Nanoseconds in `Tread`s.
    pub read_ns: u64,
    /// Nanoseconds in every other request.
    pub other_ns: u64,
}

/// The live [`Timings`].
#[derive(Debug, Default)]
pub(crate) struct TimingCells {
    write_ns: AtomicU64,
    fsync_ns: AtomicU64,
    read_ns: AtomicU64,
    other_ns: AtomicU64,
}

impl TimingCells {
    /// Adds `ns` to the kind of request whose type byte is `ty`.
    pub(crate) fn add(&self, ty: u8, ns: u64) {
        let cell = match TmsgType::from_byte(ty) {
            Some(TmsgType::Write) => &self.write_ns,
            Some(TmsgType::Fsync) => &self.fsync_ns,
            Some(TmsgType::Read) => &self.read_ns,
            _ => &self.other_ns,
        };
        cell.fetch_add(ns, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Timings {
        Timings {
            write_ns: self.write_ns.load(Relaxed),
            fsync_ns: self.fsync_ns.load(Relaxed),
            read_ns: self.read_ns.load(Relaxed),
            other_ns: self.other_ns.load(Relaxed),
        }
    }
}

/// Slots of [`RequestStats`]: one per T-message of 9P2000.L ([`Tmsg::TYPES`]) and one for
/// type bytes that are none of them.
const TYPE_SLOTS: usize = Tmsg::TYPES.len() + 1;

/// The slot of each type byte (the last slot: not a request type).
const SLOT_OF_TYPE: [u8; 256] = {
    let mut slots = [Tmsg::TYPES.len() as u8; 256];
    let mut i = 0;
    while i < Tmsg::TYPES.len() {
        slots[Tmsg::TYPES[i].0 as usize] = i as u8;
        i += 1;
    }
    slots
};

/// The 9P name of the requests in `slot`: `Twrite`, `Tgetattr`, ... (`unknown` for
/// type bytes that are no request).
fn slot_name(slot: usize) -> String {
    match Tmsg::TYPES.get(slot) {
        Some((_, variant)) => format!("T{}", variant.to_ascii_lowercase()),
        None => String::from("unknown"),
    }
}

/// A request received and not yet answered: its type and when it arrived (server
/// clock), so its latency can be taken when its reply is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Received {
    slot: u8,
    at: u64,
}

/// Requests received, and the time from receipt to their reply being queued, by
/// request type: a snapshot.
///
/// Serialised (feature `serde`) as two fields of the enclosing counters, each a map
/// from the type's name over the types seen: `requests_by_type` (`{"Twrite": 12}`) and
/// `request_latency` (`{"Twrite": LatencyHistogram}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestStats {
    received: [u64; TYPE_SLOTS],
    latency: [LatencyHistogram; TYPE_SLOTS],
}

impl Default for RequestStats {
    fn default() -> Self {
        RequestStats {
            received: [0; TYPE_SLOTS],
            latency: [LatencyHistogram::default(); TYPE_SLOTS],
        }
    }
}

impl RequestStats {
    /// Requests with type byte `ty` received (counted when their frame is complete).
    pub fn received(&self, ty: u8) -> u64 {
        self.received[usize::from(SLOT_OF_TYPE[usize::from(ty)])]
    }

    /// Latencies of the answered requests with type byte `ty`: from receipt to their
    /// reply being queued (empty without [`super::Config::clock`]).
    pub fn latency(&self, ty: u8) -> &LatencyHistogram {
        &self.latency[usize::from(SLOT_OF_TYPE[usize::from(ty)])]
    }

    /// The types seen, by name (`Twrite`), with their counts and latencies.
    pub fn by_type(&self) -> impl Iterator<Item = (String, u64, &LatencyHistogram)> {
        (0..TYPE_SLOTS)
            .filter(|&i| self.received[i] > 0 || !self.latency[i].is_empty())
            .map(|i| (slot_name(i), self.received[i], &self.latency[i]))
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for RequestStats {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeStruct};

        /// One of the two maps, over the types seen.
        struct ByType<'a, T>(&'a RequestStats, fn(&RequestStats, usize) -> T);
        impl<T: serde::Serialize> serde::Serialize for ByType<'_, T> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let seen = |&i: &usize| self.0.received[i] > 0 || !self.0.latency[i].is_empty();
                let mut m = s.serialize_map(None)?;
                for i in (0..TYPE_SLOTS).filter(seen) {
                    m.serialize_entry(slot_name(i).as_str(), &(self.1)(self.0, i))?;
                }
                m.end()
            }
        }
        let mut st = s.serialize_struct("RequestStats", 2)?;
        st.serialize_field("requests_by_type", &ByType(self, |r, i| r.received[i]))?;
        st.serialize_field("request_latency", &ByType(self, |r, i| r.latency[i]))?;
        st.end()
    }
}

/// The live [`RequestStats`]: a fixed array per type, so counting allocates nothing.
#[derive(Debug)]
pub(crate) struct RequestCells {
    received: [AtomicU64; TYPE_SLOTS],
    latency: [SharedLatencyHistogram; TYPE_SLOTS],
}

impl Default for RequestCells {
    fn default() -> Self {
        RequestCells {
            received: core::array::from_fn(|_| AtomicU64::new(0)),
            latency: core::array::from_fn(|_| SharedLatencyHistogram::default()),
        }
    }
}

impl RequestCells {
    /// Counts a request with type byte `ty` received at `now`.
    pub(crate) fn receive(&self, ty: u8, now: u64) -> Received {
        let slot = SLOT_OF_TYPE[usize::from(ty)];
        self.received[usize::from(slot)].fetch_add(1, Relaxed);
        Received { slot, at: now }
    }

    /// Records the latency of `request`, answered at `now`.
    pub(crate) fn answer(&self, request: Received, now: u64) {
        self.latency[usize::from(request.slot)].record(now.saturating_sub(request.at));
    }

    pub(crate) fn snapshot(&self) -> RequestStats {
        RequestStats {
            received: core::array::from_fn(|i| self.received[i].load(Relaxed)),
            latency: core::array::from_fn(|i| self.latency[i].snapshot()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_type_has_a_slot_and_a_9p_name() {
        let cells = RequestCells::default();
        let write = cells.receive(TmsgType::Write as u8, 1_000);
        cells.receive(TmsgType::Write as u8, 2_000);
        let unknown = cells.receive(7, 0); // Rlerror is no request
        cells.answer(write, 81_000);
        cells.answer(unknown, 10);
        let s = cells.snapshot();
        assert_eq!(s.received(TmsgType::Write as u8), 2);
        assert_eq!(s.latency(TmsgType::Write as u8).count, 1);
        assert_eq!(s.latency(TmsgType::Write as u8).sum_ns, 80_000);
        assert_eq!(s.received(7), 1);
        assert_eq!(s.received(255), 1, "every unknown type shares a slot");
        let seen: Vec<(String, u64, u64)> =
            s.by_type().map(|(name, n, h)| (name, n, h.count)).collect();
        assert_eq!(
            seen,
            [("Twrite".into(), 2, 1), ("unknown".into(), 1, 1)],
            "only the types seen"
        );
        let names: Vec<String> = (0..TYPE_SLOTS).map(slot_name).collect();
        for name in [
            "Tversion",
            "Tlopen",
            "Tgetattr",
            "Txattrwalk",
            "Tunlinkat",
            "Tfsync",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }
}
