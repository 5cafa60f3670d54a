//! The probes: each one function that attacks the appliance for about a window's time
//! and checks what the attack itself should get (refusals, closed connections, errnos);
//! the suite checks everything else around it (the appliance alive, the honest clients
//! served, the memory budget kept).
//!
//! | module | probes |
//! |---|---|
//! | [`memory`] | xattr-walk flood, unread-read flood, fid flood, data cache flood |
//! | [`connections`] | silent connections, slowloris, CPU fairness |
//! | [`protocol`] | unknown version, flush storm and tag reuse, deep walks and wide readdirs, fuzzed frames |
//! | [`locks`] | lock flood, long client ids, `Tgetlock` with `UNLCK` |
//! | [`access`] | group escalation, squashed users, allow-lists |

pub mod access;
pub mod connections;
pub mod locks;
pub mod memory;
pub mod protocol;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ninep::testing::Client;
use ninep::wire::{open_flags, XATTR_CREATE};
use vfs::Errno;

use super::raw::{errno_name, Tally};
use super::{Limits, Scale};
use crate::ninep::Lossy;
use crate::stats;

/// The probes' files and directories, made by [`prepare`] (as root).
pub mod fixture {
    /// Directory of everything below (root's, 0755).
    pub const DIR: &str = "hostile";
    /// A 1 MiB file.
    pub const BIG: &str = "hostile/big";
    /// Size of [`BIG`].
    pub const BIG_SIZE: usize = 1 << 20;
    /// A small file with a 64 KiB `user.big` xattr.
    pub const XATTR: &str = "hostile/xattr";
    /// The xattr's name.
    pub const XATTR_NAME: &str = "user.big";
    /// The xattr's size.
    pub const XATTR_SIZE: usize = 64 << 10;
    /// A file larger than a 128 MiB appliance's data cache, for the cache flood
    /// (`Scale::cache_flood_bytes` long): byte `i` is [`stream_byte`]`(i)`.
    pub const STREAM: &str = "hostile/stream";
    /// What byte `i` of [`STREAM`] holds: every 4 KiB block differs from the others.
    pub fn stream_byte(i: u64) -> u8 {
        ((i >> 12).wrapping_mul(131) ^ (i % 251)) as u8
    }
    /// A file for locks (mode 0666).
    pub const LOCKS: &str = "hostile/locks";
    /// A directory owned by uid/gid [`super::access::USER`] (0755).
    pub const USER_DIR: &str = "hostile/user";
    /// A directory anyone may create in (0777).
    pub const OPEN_DIR: &str = "hostile/open";
    /// The fuzzer's directory, owned by [`super::protocol::FUZZ_UID`].
    pub const FUZZ_DIR: &str = "hostile/fuzz";
}

/// What a probe gets: where the appliance is, how hard to push, the limits it runs with.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// Host port forwarded to the appliance's 9P port.
    pub port: u16,
    /// Host port forwarded to its counters service.
    pub stats_port: u16,
    /// How hard to push.
    pub scale: &'a Scale,
    /// The limits it was booted with.
    pub limits: Limits,
    /// The 9P server's memory budget for clients (bytes).
    pub memory_limit: u64,
    /// How long a new client may take to connect and attach.
    pub attach_bound: Duration,
    /// When the probe started.
    pub started: Instant,
}

impl Ctx<'_> {
    /// The end of the probe's window: attacks that hold something hold it until then.
    pub fn deadline(&self) -> Instant {
        self.started + self.scale.window
    }

    /// The counters now, retried for up to a minute (under attack the service may be
    /// slow to answer).
    pub fn counters(&self) -> Result<serde_json::Value, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match stats::try_json(self.stats_port, Duration::from_secs(20)) {
                Ok(v) => return Ok(v),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// A 9P server counter (`/9p/NAME`) now (0 if the appliance does not keep it);
    /// `None` if the counters could not be read.
    pub fn counter(&self, name: &str) -> Option<u64> {
        let v = self.counters().ok()?;
        Some(stats::counter_or_zero(&v, &format!("/9p/{name}")))
    }

    /// How much counter `name` grew since it read `before` ([`Ctx::counter`]).
    pub fn counter_change(&self, name: &str, before: Option<u64>) -> Result<u64, String> {
        match (before, self.counter(name)) {
            (Some(before), Some(now)) => Ok(now.saturating_sub(before)),
            _ => Err(format!(
                "the counters service did not answer (reading {name})"
            )),
        }
    }

    /// Sleeps until the window's end.
    pub fn hold(&self) {
        std::thread::sleep(self.deadline().saturating_duration_since(Instant::now()));
    }
}

/// What a probe found: numbers for the report, and the expectations that failed.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Named numbers (requests sent, refusals by errno, connections shed, ...).
    pub findings: BTreeMap<String, u64>,
    /// Failed expectations, each a sentence.
    pub failures: Vec<String>,
}

impl Outcome {
    /// Records `key = value`.
    pub fn note(&mut self, key: impl Into<String>, value: u64) {
        self.findings.insert(key.into(), value);
    }

    /// Adds `value` to `key`.
    pub fn add(&mut self, key: impl Into<String>, value: u64) {
        *self.findings.entry(key.into()).or_default() += value;
    }

    /// A failure unless `ok`.
    pub fn check(&mut self, ok: bool, why: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(why());
        }
    }

    /// A failure.
    pub fn fail(&mut self, why: impl Into<String>) {
        self.failures.push(why.into());
    }

    /// Records a tally of replies as `{prefix}ok`, `{prefix}ERRNO`, and checks that every
    /// reply decoded and that no errno outside `allowed` came back.
    pub fn tally(&mut self, prefix: &str, t: &Tally, allowed: &[Errno]) {
        self.add(format!("{prefix}ok"), t.ok);
        for (e, n) in &t.errors {
            self.add(format!("{prefix}{}", errno_name(*e)), *n);
        }
        self.check(t.undecodable == 0, || {
            format!("{} replies did not decode", t.undecodable)
        });
        let unexpected = t.unexpected(allowed);
        self.check(unexpected.is_empty(), || {
            format!("{prefix}unexpected errors: {}", unexpected.join(", "))
        });
    }

    /// Folds in a hostile connection's setup failure (`Err`) or its outcome.
    pub fn merge(&mut self, other: Outcome) {
        for (k, v) in other.findings {
            self.add(k, v);
        }
        self.failures.extend(other.failures);
    }
}

/// A probe: a name for the report, a line saying what it does, and the attack.
pub struct Probe {
    /// Short name (the report's first column).
    pub name: String,
    /// What it does, in one line.
    pub about: String,
    /// Runs the attack.
    pub run: Box<dyn Fn(&Ctx<'_>) -> Outcome>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").field("name", &self.name).finish()
    }
}

impl Probe {
    fn new(
        name: impl Into<String>,
        about: impl Into<String>,
        run: impl Fn(&Ctx<'_>) -> Outcome + 'static,
    ) -> Probe {
        Probe {
            name: name.into(),
            about: about.into(),
            run: Box::new(run),
        }
    }
}

/// Every probe at `scale`, in the order the suite runs them.
pub fn all(scale: &Scale) -> Vec<Probe> {
    let mut v = Vec::new();
    for &n in scale.xattr_flood_conns {
        v.push(Probe::new(
            format!("xattr-walk flood x{n}"),
            format!(
                "Txattrwalk of a 64 KiB xattr pipelined into every free fid on {n} connections"
            ),
            move |ctx| memory::xattr_flood(ctx, n),
        ));
    }
    v.push(Probe::new(
        "parked writer",
        "12 connections hold 64 KiB xattr values until ENOMEM; a connection attached before sends a 512 KiB Twrite in one frame",
        memory::parked_writer,
    ));
    for &n in scale.read_flood_conns {
        v.push(Probe::new(
            format!("unread reads x{n}"),
            format!(
                "Tread(msize-11) of a 1 MiB file pipelined {} deep, replies never read, on {n} connections",
                scale.read_flood_depth
            ),
            move |ctx| memory::read_flood(ctx, n),
        ));
    }
    v.push(Probe::new(
        format!("cache flood x{}", scale.cache_flood_conns),
        format!(
            "{} connections read a {} MiB file as fast as they can, sequentially (1 MiB) and at random (4 KiB), checking every byte",
            scale.cache_flood_conns,
            scale.cache_flood_bytes >> 20
        ),
        memory::cache_flood,
    ));
    v.push(Probe::new(
        "fid flood",
        format!(
            "walks into every fid allowed and more, on {} connections, held",
            scale.fid_flood_conns
        ),
        memory::fid_flood,
    ));
    v.push(Probe::new(
        "silent connections",
        format!(
            "{} TCP connections that never send a byte; a new client must attach meanwhile",
            scale.silent_conns
        ),
        connections::silent_flood,
    ));
    v.push(Probe::new(
        "slowloris",
        format!(
            "{} connections sending frames that never finish (size fields, dripped Tversions, half Twrites)",
            scale.slowloris_conns
        ),
        connections::slowloris,
    ));
    v.push(Probe::new(
        "cpu fairness",
        format!(
            "{} connections pipelining Tgetattr at full speed",
            scale.fairness_conns
        ),
        connections::fairness,
    ));
    v.push(Probe::new(
        "lock flood",
        format!(
            "{} one-byte locks over {} connections, {} locks with 65,535-byte client ids, Tgetlock(UNLCK)",
            scale.locks, scale.lock_conns, scale.long_id_locks
        ),
        locks::lock_flood,
    ));
    v.push(Probe::new(
        "group escalation",
        "uid 1000 creates with gid 0 and mode 02755, chowns to root; a squashed root creates",
        access::group_escalation,
    ));
    v.push(Probe::new(
        "allow-list",
        "attach to an export whose allow= list leaves the client out",
        access::allow_list,
    ));
    v.push(Probe::new(
        "unknown version",
        "Tversion 9P2000.u, then requests; msize below the minimum; requests before Tversion",
        protocol::unknown_version,
    ));
    v.push(Probe::new(
        "flush storm",
        format!(
            "{} Tread+Tflush pairs, flushes of idle tags; two requests with one tag",
            scale.flush_pairs
        ),
        protocol::flush_storm,
    ));
    v.push(Probe::new(
        "deep and wide",
        format!(
            "16-name walks down a {}-level tree, .. walks, Treaddir(msize) of {} entries, pipelined",
            scale.deep_levels, scale.wide_entries
        ),
        protocol::deep_and_wide,
    ));
    v.push(Probe::new(
        "fuzzed frames",
        format!(
            "{} random and mutated frames over {} connections through smoltcp (seeded)",
            scale.fuzz_frames, scale.fuzz_conns
        ),
        protocol::fuzzed_frames,
    ));
    v
}

/// Makes the [`fixture`]s over `c` (attached as root, fid 0 at the root).
pub fn prepare(c: &mut Client<Lossy>, scale: &Scale) -> Result<(), String> {
    let e = |what: &'static str| move |e: Errno| format!("preparing {what}: {e}");
    c.walk(0, 1, "").map_err(e("the root"))?;
    c.mkdir(1, fixture::DIR, 0o755).map_err(e(fixture::DIR))?;
    c.clunk(1).map_err(e("the root"))?;
    c.walk(0, 1, fixture::DIR).map_err(e(fixture::DIR))?;
    // The 1 MiB file.
    c.walk(1, 2, "").map_err(e(fixture::BIG))?;
    c.lcreate(2, "big", open_flags::RDWR, 0o644)
        .map_err(e(fixture::BIG))?;
    let chunk: Vec<u8> = (0..256 << 10).map(|i| (i % 251) as u8).collect();
    for off in (0..fixture::BIG_SIZE).step_by(chunk.len()) {
        c.write(2, off as u64, &chunk).map_err(e(fixture::BIG))?;
    }
    c.clunk(2).map_err(e(fixture::BIG))?;
    // The cache flood's file.
    c.walk(1, 2, "").map_err(e(fixture::STREAM))?;
    c.lcreate(2, "stream", open_flags::RDWR, 0o644)
        .map_err(e(fixture::STREAM))?;
    for off in (0..scale.cache_flood_bytes as u64).step_by(512 << 10) {
        let chunk: Vec<u8> = (off..off + (512 << 10)).map(fixture::stream_byte).collect();
        c.write(2, off, &chunk).map_err(e(fixture::STREAM))?;
    }
    c.clunk(2).map_err(e(fixture::STREAM))?;
    // The file with a 64 KiB xattr.
    c.walk(1, 2, "").map_err(e(fixture::XATTR))?;
    c.lcreate(2, "xattr", open_flags::RDWR, 0o644)
        .map_err(e(fixture::XATTR))?;
    c.clunk(2).map_err(e(fixture::XATTR))?;
    c.walk(1, 2, "xattr").map_err(e(fixture::XATTR))?;
    c.xattrcreate(
        2,
        fixture::XATTR_NAME,
        fixture::XATTR_SIZE as u64,
        XATTR_CREATE,
    )
    .map_err(e(fixture::XATTR))?;
    let value = vec![0x5a; fixture::XATTR_SIZE];
    c.write(2, 0, &value).map_err(e(fixture::XATTR))?;
    c.clunk(2).map_err(e(fixture::XATTR))?;
    // The lock file, and the directories of other users.
    c.walk(1, 2, "").map_err(e(fixture::LOCKS))?;
    c.lcreate(2, "locks", open_flags::RDWR, 0o666)
        .map_err(e(fixture::LOCKS))?;
    c.clunk(2).map_err(e(fixture::LOCKS))?;
    let setattr_uid_gid_mode =
        ninep::wire::setattr::UID | ninep::wire::setattr::GID | ninep::wire::setattr::MODE;
    for (name, mode, owner) in [
        ("user", 0o755, access::USER),
        ("open", 0o777, 0),
        ("fuzz", 0o755, protocol::FUZZ_UID),
    ] {
        c.mkdir(1, name, mode).map_err(e("a directory"))?;
        c.walk(1, 2, name).map_err(e("a directory"))?;
        c.setattr(2, setattr_uid_gid_mode, mode, owner, owner, 0)
            .map_err(e("a directory's owner"))?;
        c.clunk(2).map_err(e("a directory"))?;
    }
    c.clunk(1).map_err(e(fixture::DIR))?;
    Ok(())
}

/// Runs `f(0..n)` on `n` threads, started [`STAGGER`] apart, and collects the results
/// in order.
pub fn in_parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || {
                    std::thread::sleep(STAGGER * i as u32);
                    f(i)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a probe thread panicked"))
            .collect()
    })
}

/// How far apart threads that connect start. QEMU's user network takes connections from
/// the host one at a time with a short backlog; a burst overflows it, and the host's TCP
/// then retries the rest seconds apart (the silent-connection probe is that burst, on
/// purpose). Elsewhere a burst would measure QEMU, not the appliance.
pub const STAGGER: Duration = Duration::from_millis(100);

/// How long a hostile writer waits for the server to take more bytes before it counts
/// as stopped (backpressure).
pub const STALL: Duration = Duration::from_secs(3);
