//! Per-cause counters of a server, readable at any time.

use core::cell::Cell;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// A snapshot of a server's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        /// The live counters (single-threaded: plain cells).
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $($name: Cell<u64>,)*
        }

        impl Counters {
            $(
                pub(crate) fn $name(&self) {
                    self.$name.set(self.$name.get() + 1);
                }
            )*

            pub(crate) fn snapshot(&self) -> Stats {
                Stats { $($name: self.$name.get(),)* }
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
    /// Times a connection's task gave the CPU to others after its quantum.
    cpu_yields,
    /// Connections refused at accept: their address had `max_conns_per_client` open.
    client_conn_limit_hits,
    /// Connections refused at accept: no export's allow-list admits the client's address.
    refused_connections,
    /// Attaches refused (`EACCES`) by the export's allow-list.
    refused_attaches,
    /// Lock requests refused for the per-connection lock limit (`ENOLCK`).
    conn_lock_limit_hits,
    /// Lock requests refused for the server-wide lock limit (`ENOLCK`).
    lock_limit_hits,
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
    write_ns: Cell<u64>,
    fsync_ns: Cell<u64>,
    read_ns: Cell<u64>,
    other_ns: Cell<u64>,
}

impl TimingCells {
    /// Adds `ns` to the kind of request whose type byte is `ty`.
    pub(crate) fn add(&self, ty: u8, ns: u64) {
        // Type bytes of Tread, Twrite and Tfsync (`wire::Tmsg`).
        let cell = match ty {
            118 => &self.write_ns,
            50 => &self.fsync_ns,
            116 => &self.read_ns,
            _ => &self.other_ns,
        };
        cell.set(cell.get() + ns);
    }

    pub(crate) fn snapshot(&self) -> Timings {
        Timings {
            write_ns: self.write_ns.get(),
            fsync_ns: self.fsync_ns.get(),
            read_ns: self.read_ns.get(),
            other_ns: self.other_ns.get(),
        }
    }
}
