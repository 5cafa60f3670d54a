//! Honest clients: threads that keep doing what a mount does — create a file, write
//! 4 KiB, fsync, read it back, getattr, clunk, unlink — and time every request, so a
//! probe's effect on everyone else shows as their latency.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ninep::testing::Client;
use ninep::wire::open_flags;
use vfs::Errno;

use super::raw::{attached, attached_timed, is_gone};
use crate::ninep::Lossy;

/// Where honest client `id` works: `HONEST_DIR/id`, made by [`prepare`].
pub const HONEST_DIR: &str = "honest";
/// Bytes each honest cycle writes, fsyncs and reads back.
pub const WRITE_SIZE: usize = 4096;

/// Makes the honest clients' directories, `HONEST_DIR/0..clients`, over `c` (attached as
/// root with fid 0 at the root).
pub fn prepare(c: &mut Client<Lossy>, clients: usize) -> Result<(), Errno> {
    c.walk(0, 1, "")?;
    match c.mkdir(1, HONEST_DIR, 0o755) {
        Ok(_) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e),
    }
    c.clunk(1)?;
    c.walk(0, 1, HONEST_DIR)?;
    for id in 0..clients {
        match c.mkdir(1, &id.to_string(), 0o755) {
            Ok(_) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e),
        }
    }
    c.clunk(1)
}

/// Latency percentiles of a set of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// Requests.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Slowest.
    pub max: Duration,
}

impl Percentiles {
    /// Of `samples` (any order).
    pub fn of(samples: &[Duration]) -> Percentiles {
        let mut v = samples.to_vec();
        v.sort_unstable();
        let rank = |p: usize| v[(v.len() * p).div_ceil(100).max(1) - 1];
        if v.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: v.len(),
            p50: rank(50),
            p99: rank(99),
            max: v[v.len() - 1],
        }
    }
}

/// What the honest clients saw during one run.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// How long they ran.
    pub elapsed: Duration,
    /// Complete create-to-unlink cycles.
    pub cycles: usize,
    /// Every request.
    pub all: Percentiles,
    /// By request kind (`create`, `write`, `fsync`, ...; `attach` is connect, version and
    /// attach of a new connection).
    pub by_op: BTreeMap<&'static str, Percentiles>,
    /// The parts of the `attach` requests (`connect`, `version`, `attach`, `retrying`:
    /// [`AttachSplit`]).
    pub attach_parts: BTreeMap<&'static str, Percentiles>,
    /// The slowest `attach`, in parts.
    pub slowest_attach: Option<AttachSplit>,
    /// Everything that went wrong: errors, wrong data, lost connections.
    pub errors: Vec<String>,
}

/// One `attach` (connect, version, attach and walk of a new connection) in parts, so a
/// slow one says where its time went (`crate::ninep::Handshake`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttachSplit {
    /// The whole of it.
    pub total: Duration,
    /// Connection tries (a refused or reset try is tried again after 100 ms).
    pub tries: u32,
    /// Time lost to failed tries.
    pub retrying: Duration,
    /// The successful try's `connect()`.
    pub connect: Duration,
    /// Its `Tversion` exchange.
    pub version: Duration,
    /// `Tattach` and the walk to the client's directory.
    pub attach: Duration,
}

impl AttachSplit {
    /// The parts by name, as [`LoadReport::attach_parts`] keys them.
    pub fn parts(&self) -> [(&'static str, Duration); 4] {
        [
            ("retrying", self.retrying),
            ("connect", self.connect),
            ("version", self.version),
            ("attach", self.attach),
        ]
    }
}

/// Honest clients at work; [`HonestLoad::stop`] ends them and reports.
#[derive(Debug)]
pub struct HonestLoad {
    stop: Arc<AtomicBool>,
    started: Instant,
    threads: Vec<JoinHandle<Record>>,
}

/// One client's requests and errors.
#[derive(Debug, Default)]
struct Record {
    samples: Vec<(&'static str, Duration)>,
    attaches: Vec<AttachSplit>,
    cycles: usize,
    errors: Vec<String>,
}

impl Record {
    /// Times `f` as a request of kind `op`; an error is recorded and returned.
    fn timed<T>(
        &mut self,
        op: &'static str,
        f: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, String> {
        let t = Instant::now();
        let r = f();
        self.samples.push((op, t.elapsed()));
        r.map_err(|e| format!("{op}: {e}"))
    }
}

impl HonestLoad {
    /// Starts `clients` honest clients against `127.0.0.1:port` (their directories made
    /// by [`prepare`]).
    pub fn start(port: u16, clients: usize) -> HonestLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..clients)
            .map(|id| {
                let stop = stop.clone();
                std::thread::spawn(move || work(port, id, &stop))
            })
            .collect();
        HonestLoad {
            stop,
            started: Instant::now(),
            threads,
        }
    }

    /// Stops the clients (each finishes its request in flight) and reports what they saw.
    pub fn stop(self) -> LoadReport {
        self.stop.store(true, Ordering::SeqCst);
        let mut samples = Vec::new();
        let mut attaches = Vec::new();
        let mut report = LoadReport::default();
        for t in self.threads {
            match t.join() {
                Ok(r) => {
                    samples.extend(r.samples);
                    attaches.extend(r.attaches);
                    report.cycles += r.cycles;
                    report.errors.extend(r.errors);
                }
                Err(_) => report.errors.push("an honest client panicked".into()),
            }
        }
        report.elapsed = self.started.elapsed();
        let all: Vec<Duration> = samples.iter().map(|&(_, d)| d).collect();
        report.all = Percentiles::of(&all);
        let mut by_op: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
        for (op, d) in samples {
            by_op.entry(op).or_default().push(d);
        }
        report.by_op = by_op
            .into_iter()
            .map(|(op, v)| (op, Percentiles::of(&v)))
            .collect();
        let mut parts: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
        for a in &attaches {
            for (part, d) in a.parts() {
                parts.entry(part).or_default().push(d);
            }
        }
        report.attach_parts = parts
            .into_iter()
            .map(|(part, v)| (part, Percentiles::of(&v)))
            .collect();
        report.slowest_attach = attaches.into_iter().max_by_key(|a| a.total);
        report
    }
}

/// A recognisable 4 KiB for cycle `i` of client `id`.
fn pattern(id: usize, i: usize) -> Vec<u8> {
    (0..WRITE_SIZE)
        .map(|k| (k as u8).wrapping_mul(13) ^ (i as u8) ^ ((id as u8) << 5))
        .collect()
}

/// One honest client: attach, then cycles until told to stop; a lost connection is an
/// error, and the client attaches again.
fn work(port: u16, id: usize, stop: &AtomicBool) -> Record {
    let mut rec = Record::default();
    let dir = format!("{HONEST_DIR}/{id}");
    let mut client: Option<Client<Lossy>> = None;
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        let c = match client.as_mut() {
            Some(c) if !c.io.is_gone() => c,
            _ => {
                let t = Instant::now();
                let connected = rec.timed("attach", || {
                    let (mut c, handshake, attach) = attached_timed(port, 0, "")?;
                    let walk = Instant::now();
                    c.walk(0, 1, &dir)?;
                    Ok((c, handshake, attach + walk.elapsed()))
                });
                let connected = connected.map(|(c, handshake, attach)| {
                    rec.attaches.push(AttachSplit {
                        total: t.elapsed(),
                        tries: handshake.tries,
                        retrying: handshake.retrying,
                        connect: handshake.connect,
                        version: handshake.version,
                        attach,
                    });
                    c
                });
                match connected {
                    Ok(c) => client.insert(c),
                    Err(e) => {
                        rec.errors.push(format!("client {id}: {e}"));
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                }
            }
        };
        match cycle(c, &mut rec, id, i) {
            Ok(()) => rec.cycles += 1,
            Err(e) => {
                rec.errors.push(format!("client {id}, cycle {i}: {e}"));
                // Leave no fid behind for the next cycle (it may be bound or not).
                let _ = c.clunk(2);
                if c.io.is_gone() {
                    rec.errors.push(format!("client {id}: connection lost"));
                }
            }
        }
        i += 1;
    }
    rec
}

/// One create / write / fsync / read / getattr / clunk / unlink cycle on file `f{i}` of
/// the client's directory (fid 1).
fn cycle(c: &mut Client<Lossy>, rec: &mut Record, id: usize, i: usize) -> Result<(), String> {
    let name = format!("f{i}");
    let data = pattern(id, i);
    rec.timed("walk", || c.walk(1, 2, ""))?;
    rec.timed("create", || c.lcreate(2, &name, open_flags::RDWR, 0o644))?;
    let n = rec.timed("write", || c.write(2, 0, &data))?;
    if n as usize != data.len() {
        return Err(format!("short write: {n} of {}", data.len()));
    }
    rec.timed("fsync", || c.fsync(2, false))?;
    let back = rec.timed("read", || c.read(2, 0, WRITE_SIZE as u32))?;
    if back != data {
        return Err(format!("read back {} bytes that differ", back.len()));
    }
    let st = rec.timed("getattr", || c.getattr(2))?;
    if st.size != data.len() as u64 {
        return Err(format!("size {} after writing {}", st.size, data.len()));
    }
    rec.timed("clunk", || c.clunk(2))?;
    rec.timed("unlink", || c.unlinkat(1, &name, 0))?;
    Ok(())
}

/// How long a new client takes to connect, version and attach (and whether it could):
/// what "held out" means for someone mounting now.
pub fn time_to_attach(port: u16) -> Result<Duration, String> {
    let t = Instant::now();
    let mut c = attached(port, 0, "").map_err(|e| {
        if is_gone(e) {
            "no connection".to_string()
        } else {
            format!("attach: {e}")
        }
    })?;
    let took = t.elapsed();
    c.clunk(0).map_err(|e| format!("clunk: {e}"))?;
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let ms = |n: u64| Duration::from_millis(n);
        let v: Vec<Duration> = (1..=200).rev().map(ms).collect();
        let p = Percentiles::of(&v);
        assert_eq!(
            (p.count, p.p50, p.p99, p.max),
            (200, ms(100), ms(198), ms(200))
        );
        assert_eq!(Percentiles::of(&[ms(7)]).p99, ms(7));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }
}
