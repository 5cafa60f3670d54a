//! A native 9P2000.L load generator (`make bench-load`, driven by tests/bench/load.py):
//! N connections to one server, one thread each, every connection repeating one workload
//! in Linux's request pattern for a fixed time, then one JSON line with what was done.
//! With no emulated client in the way, the server is the bottleneck.
//!
//! Workloads (each loop is one operation, timed from its first request to its last reply):
//!   write64k  `Twrite` 64 KiB + `Tfsync` on the connection's own file (wraps at 64 MiB)
//!   write4k   `Twrite` 4 KiB + `Tfsync` likewise
//!   create    `Twalk` (clone of the directory) + `Tlcreate` + `Twrite` 4 KiB + `Tfsync` +
//!             `Tclunk` of a new file, as fs_mark does through Linux's 9P client
//!   getattr   `Twalk` to a file + `Tgetattr` + `Tclunk`, as `stat` does
//!   read4k    `Tread` of 4 KiB at a random 4 KiB-aligned offset of the shared file
//!   read1m    1 MiB read sequentially through the shared file (each connection starting
//!             at its own offset, wrapping at the end), in `Tread`s of at most msize − 24
//!             as Linux splits them
//!
//! The read workloads share one file of `--file-mib` MiB (12): the first connection's
//! set-up creates it in `load-TAG-read/`, writes it in msize-sized `Twrite`s and fsyncs it
//! once; every connection then opens it read-only. Before the measured part the first
//! connection reads it once whole (untimed), so the measured reads show the server's cache
//! ("warm"), as far as it holds the file.
//!
//! Usage: ninep-load --port PORT --workload W --conns N [--seconds S] [--aname A]
//!        [--uid U] [--tag T] [--idle I] [--file-mib M]
//! `--idle I` also opens I connections that attach and then stay quiet for the run, as
//! mounted guests with nothing to do: what they cost the server's busy connections.
//! The server is on 127.0.0.1:PORT (QEMU forwards reach the guests from there). Output:
//! `{"workload","conns","seconds","ops","ops_per_s","fsyncs","bytes","mib_per_s","p50_us",
//! "p99_us","max_us","file_bytes","warm_s","errors"}` (`file_bytes`, `warm_s`: the read
//! workloads' shared file and how long its untimed pass took); exit status 1 if any connection failed. The line
//! `ninep-load: measuring` on stderr marks the end of the set-up, for a caller that samples
//! CPU use over the measured time only.
#![forbid(unsafe_code)]

use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ninefold_tests::ninep::{Tcp, REPLY_TIMEOUT};
use ninep::testing::Client;
use ninep::wire::open_flags;
use vfs::Errno;

/// What a connection repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Write64k,
    Write4k,
    Create,
    Getattr,
    Read4k,
    Read1m,
}

impl Workload {
    fn parse(name: &str) -> Option<Workload> {
        Some(match name {
            "write64k" => Workload::Write64k,
            "write4k" => Workload::Write4k,
            "create" => Workload::Create,
            "getattr" => Workload::Getattr,
            "read4k" => Workload::Read4k,
            "read1m" => Workload::Read1m,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Workload::Write64k => "write64k",
            Workload::Write4k => "write4k",
            Workload::Create => "create",
            Workload::Getattr => "getattr",
            Workload::Read4k => "read4k",
            Workload::Read1m => "read1m",
        }
    }

    /// Reads one shared file, written once at set-up.
    fn reads(self) -> bool {
        matches!(self, Workload::Read4k | Workload::Read1m)
    }
}

/// The command line.
#[derive(Clone, Debug)]
struct Args {
    port: u16,
    workload: Workload,
    conns: usize,
    seconds: f64,
    aname: String,
    uid: u32,
    /// Names this run's files apart from earlier runs' on the same server.
    tag: String,
    /// Connections attached and kept quiet during the run.
    idle: usize,
    /// Size of the read workloads' shared file.
    file_bytes: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        port: 0,
        workload: Workload::Write4k,
        conns: 1,
        seconds: 10.0,
        aname: String::new(),
        uid: 0,
        tag: format!("{}", std::process::id()),
        idle: 0,
        file_bytes: 12 << 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--port" => a.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--workload" => {
                let w = value()?;
                a.workload = Workload::parse(&w).ok_or(format!("unknown workload {w}"))?;
            }
            "--conns" => a.conns = value()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--aname" => a.aname = value()?,
            "--uid" => a.uid = value()?.parse().map_err(|e| format!("--uid: {e}"))?,
            "--tag" => a.tag = value()?,
            "--idle" => a.idle = value()?.parse().map_err(|e| format!("--idle: {e}"))?,
            "--file-mib" => {
                let mib: u64 = value()?.parse().map_err(|e| format!("--file-mib: {e}"))?;
                a.file_bytes = mib << 20;
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if a.port == 0 || a.conns == 0 || a.seconds <= 0.0 {
        return Err("--port, --conns > 0 and --seconds > 0 are needed".into());
    }
    if a.file_bytes < READ1M as u64 {
        return Err("--file-mib must be at least 1".into());
    }
    Ok(a)
}

/// What one connection did.
#[derive(Debug, Default)]
struct Tally {
    /// Latency of every operation, in microseconds.
    latencies_us: Vec<u32>,
    fsyncs: u64,
    bytes: u64,
    error: Option<String>,
}

const ROOT: u32 = 0;
const DIR: u32 = 1;
const FILE: u32 = 2;
const SCRATCH: u32 = 3;
/// A connection's file wraps around at this size, so a long run does not fill the disk.
const FILE_SPAN: u64 = 64 << 20;
/// What read1m reads per operation, and read4k.
const READ1M: usize = 1 << 20;
const READ4K: usize = 4 << 10;

/// A small, seeded generator for read4k's offsets (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// One connection's run: wait for the others, then repeat the workload for `run_for`.
fn connection(a: &Args, index: usize, mut conn: Conn, start: &Barrier, run_for: Duration) -> Tally {
    let mut tally = Tally::default();
    start.wait();
    let deadline = Instant::now() + run_for;
    let block = vec![0x5a_u8; 64 << 10];
    let mut n: u64 = 0;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (index as u64 + 1).wrapping_mul(0x1000_0000_01b3));
    // read1m: the connections start spread over the file.
    let blocks_1m = a.file_bytes / READ1M as u64;
    let mut next_1m = index as u64 * blocks_1m / a.conns as u64;
    while Instant::now() < deadline {
        let began = Instant::now();
        let done = match a.workload {
            Workload::Write64k | Workload::Write4k => {
                let len = if a.workload == Workload::Write64k {
                    64 << 10
                } else {
                    4 << 10
                };
                let offset = (n * len as u64) % FILE_SPAN;
                conn.write_all(FILE, offset, &block[..len])
                    .and_then(|()| conn.client.fsync(FILE, false))
                    .map(|()| (1, len as u64))
            }
            Workload::Create => {
                let name = format!("f{n}");
                let c = &mut conn;
                c.client
                    .walk(DIR, SCRATCH, "")
                    .and_then(|_| c.client.lcreate(SCRATCH, &name, open_flags::RDWR, 0o644))
                    .and_then(|_| c.write_all(SCRATCH, 0, &block[..4096]))
                    .and_then(|()| c.client.fsync(SCRATCH, false))
                    .and_then(|()| c.client.clunk(SCRATCH))
                    .map(|()| (1, 4096))
            }
            Workload::Getattr => conn
                .client
                .walk(DIR, SCRATCH, "target")
                .and_then(|_| conn.client.getattr(SCRATCH))
                .and_then(|_| conn.client.clunk(SCRATCH))
                .map(|()| (0, 0)),
            Workload::Read4k => {
                let offset = rng.next() % (a.file_bytes / READ4K as u64) * READ4K as u64;
                conn.read_all(FILE, offset, READ4K).map(|got| (0, got))
            }
            Workload::Read1m => {
                let offset = next_1m * READ1M as u64;
                next_1m = (next_1m + 1) % blocks_1m;
                conn.read_all(FILE, offset, READ1M).map(|got| (0, got))
            }
        };
        match done {
            Ok((fsyncs, bytes)) => {
                let us = began.elapsed().as_micros().min(u32::MAX as u128) as u32;
                tally.latencies_us.push(us);
                tally.fsyncs += fsyncs;
                tally.bytes += bytes;
            }
            Err(e) => {
                tally.error = Some(format!("connection {index}: operation {n}: {e:?}"));
                break;
            }
        }
        n += 1;
    }
    tally
}

/// A connection: the client and what one `Twrite` may carry at its negotiated msize
/// (diod, for one, offers at most 64 KiB messages).
struct Conn {
    client: Client<Tcp>,
    max_payload: usize,
}

impl Conn {
    /// `Twrite`s of `data` at `offset`, each within the msize.
    fn write_all(&mut self, fid: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let mut done = 0;
        while done < data.len() {
            let end = data.len().min(done + self.max_payload);
            let n = self
                .client
                .write(fid, offset + done as u64, &data[done..end])? as usize;
            if n == 0 {
                return Err(Errno::EIO);
            }
            done += n;
        }
        Ok(())
    }

    /// `Tread`s of `len` bytes at `offset`, each within the msize (as Linux splits a read);
    /// the bytes read. A short read (the end of the file) is an error: the file is
    /// written whole at set-up.
    fn read_all(&mut self, fid: u32, offset: u64, len: usize) -> Result<u64, Errno> {
        let mut done = 0;
        while done < len {
            let count = (len - done).min(self.max_payload) as u32;
            let n = self.client.read(fid, offset + done as u64, count)?.len();
            if n == 0 {
                return Err(Errno::EIO);
            }
            done += n;
        }
        Ok(done as u64)
    }
}

/// The read workloads' shared file, under the root: `load-TAG-read/data`.
fn shared_dir(a: &Args) -> String {
    format!("load-{}-read", a.tag)
}

/// The first connection's part of a read workload's set-up: the shared file, written in
/// msize-sized `Twrite`s and fsynced once.
fn write_shared(a: &Args, c: &mut Conn) -> Result<(), String> {
    let step = |what: &str, e: Errno| format!("connection 0: shared file: {what}: {e:?}");
    let dir = shared_dir(a);
    c.client
        .mkdir(ROOT, &dir, 0o755)
        .map_err(|e| step("mkdir", e))?;
    c.client
        .walk(ROOT, SCRATCH, &dir)
        .map_err(|e| step("walk", e))?;
    c.client
        .lcreate(SCRATCH, "data", open_flags::RDWR, 0o644)
        .map_err(|e| step("lcreate", e))?;
    let chunk: Vec<u8> = (0..READ1M).map(|i| (i * 7 + 13) as u8).collect();
    let mut offset = 0;
    while offset < a.file_bytes {
        let len = (a.file_bytes - offset).min(READ1M as u64) as usize;
        c.write_all(SCRATCH, offset, &chunk[..len])
            .map_err(|e| step("write", e))?;
        offset += len as u64;
    }
    c.client
        .fsync(SCRATCH, false)
        .map_err(|e| step("fsync", e))?;
    c.client.clunk(SCRATCH).map_err(|e| step("clunk", e))
}

/// One untimed pass over the shared file (by the first connection): the measured reads
/// then find it wherever the server keeps what it read. Returns the seconds it took.
fn warm(a: &Args, c: &mut Conn) -> Result<f64, String> {
    let began = Instant::now();
    let mut offset = 0;
    while offset < a.file_bytes {
        let len = (a.file_bytes - offset).min(READ1M as u64) as usize;
        offset += c
            .read_all(FILE, offset, len)
            .map_err(|e| format!("connection 0: warming the shared file: {e:?}"))?;
    }
    Ok(began.elapsed().as_secs_f64())
}

/// Connects, negotiates, attaches and makes this connection's directory and files.
fn setup(a: &Args, index: usize) -> Result<Conn, String> {
    let s = TcpStream::connect(("127.0.0.1", a.port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(REPLY_TIMEOUT)).ok();
    s.set_nodelay(true).ok();
    let mut c = Client::new(Tcp(s));
    let (msize, _) = c
        .version(1 << 20, b"9P2000.L")
        .map_err(|e| format!("version: {e:?}"))?;
    let step = |what: &str, e: Errno| format!("connection {index}: {what}: {e:?}");
    c.attach(ROOT, a.uid, &a.aname)
        .map_err(|e| step("attach", e))?;
    // As Linux: msize less P9_IOHDRSZ (24), one byte more than Twrite's header
    // (diod answers EIO to a Twrite past that).
    let max_payload = msize as usize - 24;
    if a.workload.reads() {
        let mut conn = Conn {
            client: c,
            max_payload,
        };
        if index == 0 {
            write_shared(a, &mut conn)?;
        }
        let path = format!("{}/data", shared_dir(a));
        conn.client
            .walk(ROOT, FILE, &path)
            .map_err(|e| step("walk", e))?;
        conn.client
            .lopen(FILE, open_flags::RDONLY)
            .map_err(|e| step("lopen", e))?;
        return Ok(conn);
    }
    let dir = format!("load-{}-{index}", a.tag);
    c.mkdir(ROOT, &dir, 0o755).map_err(|e| step("mkdir", e))?;
    c.walk(ROOT, DIR, &dir).map_err(|e| step("walk", e))?;
    c.walk(DIR, FILE, "").map_err(|e| step("walk", e))?;
    let name = match a.workload {
        Workload::Getattr => "target",
        _ => "data",
    };
    c.lcreate(FILE, name, open_flags::RDWR, 0o644)
        .map_err(|e| step("lcreate", e))?;
    Ok(Conn {
        client: c,
        max_payload,
    })
}

/// Connects, negotiates and attaches a connection that will stay quiet.
fn idle(a: &Args, index: usize) -> Result<Client<Tcp>, String> {
    let s = TcpStream::connect(("127.0.0.1", a.port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(REPLY_TIMEOUT)).ok();
    let mut c = Client::new(Tcp(s));
    c.version(1 << 20, b"9P2000.L")
        .map_err(|e| format!("idle connection {index}: version: {e:?}"))?;
    c.attach(ROOT, a.uid, &a.aname)
        .map_err(|e| format!("idle connection {index}: attach: {e:?}"))?;
    Ok(c)
}

/// `open(0..n)`, one after the other; on the first failure, the error line and exit
/// status 1.
fn open_all<T>(n: usize, open: impl Fn(usize) -> Result<T, String>) -> Vec<T> {
    (0..n)
        .map(|i| {
            // The test client panics when the server closes the connection.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open(i)))
                .unwrap_or_else(|_| {
                    Err(format!("connection {i}: closed by the server during setup"))
                })
                .unwrap_or_else(|e| {
                    println!("{}", serde_json::json!({ "errors": [e] }));
                    std::process::exit(1);
                })
        })
        .collect()
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ninep-load: {e}");
            std::process::exit(2);
        }
    };
    let run_for = Duration::from_secs_f64(a.seconds);
    // Connections are set up one after the other, as clients mounting at different
    // moments would be, and only then measured together.
    let mut conns = open_all(a.conns, |i| setup(&a, i));
    let quiet = open_all(a.idle, |i| idle(&a, i));
    let warm_s = if a.workload.reads() {
        match warm(&a, &mut conns[0]) {
            Ok(s) => Some(s),
            Err(e) => {
                println!("{}", serde_json::json!({ "errors": [e] }));
                std::process::exit(1);
            }
        }
    } else {
        None
    };
    let start = Arc::new(Barrier::new(a.conns + 1));
    let threads: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, conn)| {
            let (a, start) = (a.clone(), start.clone());
            std::thread::spawn(move || connection(&a, i, conn, &start, run_for))
        })
        .collect();
    start.wait();
    let began = Instant::now();
    eprintln!("ninep-load: measuring");
    let tallies: Vec<Tally> = threads
        .into_iter()
        .map(|t| {
            t.join().unwrap_or_else(|_| Tally {
                error: Some("a connection's thread panicked (connection lost?)".into()),
                ..Tally::default()
            })
        })
        .collect();
    let elapsed = began.elapsed().as_secs_f64();
    drop(quiet);
    let mut all: Vec<u32> = tallies
        .iter()
        .flat_map(|t| t.latencies_us.iter().copied())
        .collect();
    all.sort_unstable();
    let errors: Vec<&str> = tallies.iter().filter_map(|t| t.error.as_deref()).collect();
    let bytes: u64 = tallies.iter().map(|t| t.bytes).sum();
    let report = serde_json::json!({
        "workload": a.workload.name(),
        "conns": a.conns,
        "idle": a.idle,
        "seconds": (elapsed * 1000.0).round() / 1000.0,
        "ops": all.len(),
        "ops_per_s": (all.len() as f64 / elapsed * 10.0).round() / 10.0,
        "fsyncs": tallies.iter().map(|t| t.fsyncs).sum::<u64>(),
        "bytes": bytes,
        "mib_per_s": (bytes as f64 / elapsed / f64::from(1 << 20) * 100.0).round() / 100.0,
        "p50_us": percentile(&all, 0.5),
        "p99_us": percentile(&all, 0.99),
        "max_us": all.last().copied().unwrap_or(0),
        "file_bytes": if a.workload.reads() { a.file_bytes } else { 0 },
        "warm_s": warm_s.map(|s| (s * 1000.0).round() / 1000.0),
        "errors": errors,
    });
    println!("{report}");
    if !errors.is_empty() {
        std::process::exit(1);
    }
}
