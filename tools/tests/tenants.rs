//! The tenant suite on `ninefold serve` (issue 26): tenant A, allowed on export `a` from
//! four addresses, attacks every shared limit while tenant B, allowed on export `b` from
//! another, keeps working — and B gets no error A caused and no answer later than the
//! hostile suite's bounds. Loopback has every 127.0.0.0/8 address, so each client binds
//! the source address of its tenant.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ninep::testing::{Client, Exchange};
use ninep::wire::{lock, open_flags, Tmsg};
use vfs::Errno;

/// The hostile suite's bound on an honest client's slowest request.
const SLOWEST: Duration = Duration::from_secs(5);

/// One request, one reply, over a blocking socket.
struct Tcp(TcpStream);

impl Exchange for Tcp {
    /// A connection the server reset answers `ECONNRESET`.
    fn exchange(&mut self, request: &[u8]) -> Vec<u8> {
        let tag = u16::from_le_bytes([request[5], request[6]]);
        self.0
            .write_all(request)
            .and_then(|()| try_read_frame(&mut self.0))
            .unwrap_or_else(|_| ninep::server::lerror(tag, Errno(104)))
    }
}

fn try_read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size)?;
    let mut frame = size.to_vec();
    frame.resize(u32::from_le_bytes(size) as usize, 0);
    s.read_exact(&mut frame[4..])?;
    Ok(frame)
}

fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    try_read_frame(s).unwrap()
}

/// `ninefold serve --model` with exports `a` (clients 127.0.1.0/24) and `b` (clients
/// 127.0.2.0/24), both of the whole tree; killed when dropped.
struct Tenancy {
    child: Child,
    addr: SocketAddr,
    /// The counters port.
    stats: String,
}

impl Drop for Tenancy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tenancy {
    fn start(extra: &[&str]) -> Tenancy {
        let mut args = vec!["--model", "--export", "a:/:allow=127.0.1.0/24"];
        args.extend(["--export", "b:/:allow=127.0.2.0/24"]);
        args.extend(extra);
        Tenancy::serve(&args)
    }

    /// `ninefold serve ARGS`, listening and counting on loopback ports of its choice.
    fn serve(args: &[&str]) -> Tenancy {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ninefold"))
            .args(["serve", "--listen", "127.0.0.1:0", "--log-level", "error"])
            .args(["--stats", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
            line.trim().to_string()
        };
        let (first, second) = (line(), line());
        let addr = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .parse()
            .unwrap();
        let stats = second
            .strip_prefix("counters on ")
            .unwrap_or_else(|| panic!("unexpected second line {second:?}"))
            .to_string();
        Tenancy { child, addr, stats }
    }

    /// Stops the server politely (SIGTERM: a clean unmount).
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        assert!(self.child.wait().unwrap().success());
    }

    /// The `9p` part of the counters document.
    fn counters(&self) -> serde_json::Value {
        self.document()["9p"].clone()
    }

    /// The counters document.
    fn document(&self) -> serde_json::Value {
        let mut s = TcpStream::connect(&self.stats).unwrap();
        write!(s, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
        serde_json::from_str(body).unwrap()
    }

    /// Tenant `name`'s counters (`export:a`, ...).
    fn tenant(&self, name: &str) -> serde_json::Value {
        let doc = self.counters();
        doc["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no tenant {name} in {doc}"))
    }

    /// A TCP connection from `from` (a loopback address).
    fn socket(&self, from: &str) -> std::io::Result<TcpStream> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let stream = runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(format!("{from}:0").parse().unwrap())?;
            socket.connect(self.addr).await
        })?;
        let stream = stream.into_std()?;
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(stream)
    }

    /// A client from `from`, versioned and attached to `export` as fid 0.
    fn client(&self, from: &str, export: &str) -> Result<Client<Tcp>, String> {
        let socket = self.socket(from).map_err(|e| e.to_string())?;
        let mut c = Client::new(Tcp(socket));
        c.version(1 << 20, b"9P2000.L").map_err(|e| e.to_string())?;
        c.attach(0, 0, export).map_err(|e| e.to_string())?;
        Ok(c)
    }
}

/// Tenant A's i-th address (four of them).
fn a_addr(i: usize) -> String {
    format!("127.0.1.{}", 1 + i % 4)
}

const B: &str = "127.0.2.1";

/// Runs `f` and checks it answered within [`SLOWEST`].
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    assert!(t.elapsed() < SLOWEST, "{what} took {:?}", t.elapsed());
    out
}

#[test]
fn a_tenant_that_fills_the_memory_budget_leaves_the_other_served() {
    let t = Tenancy::start(&["--memory-mib", "16"]);
    let mut b = t.client(B, "b").unwrap();
    b.walk(0, 1, "").unwrap();
    b.lcreate(1, "b-file", open_flags::RDWR, 0o644).unwrap();

    let mut setup = t.client(&a_addr(0), "a").unwrap();
    setup.walk(0, 1, "").unwrap();
    setup.lcreate(1, "x", open_flags::RDWR, 0o644).unwrap();
    setup.clunk(1).unwrap();
    setup.walk(0, 1, "x").unwrap();
    setup
        .xattrcreate(1, "user.big", 64 << 10, ninep::wire::XATTR_CREATE)
        .unwrap();
    setup.write(1, 0, &vec![3u8; 64 << 10]).unwrap();
    setup.clunk(1).unwrap();
    // Twelve connections from four addresses walk the 64 KiB value into fids until the
    // budget refuses.
    let mut a: Vec<_> = (0..12)
        .map(|i| {
            let mut c = t.client(&a_addr(i), "a").unwrap();
            c.walk(0, 1, "x").unwrap();
            c
        })
        .collect();
    for c in &mut a {
        for fid in 2.. {
            match c.xattrwalk(1, fid, "user.big") {
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e, Errno::ENOMEM);
                    break;
                }
            }
            assert!(fid < 10_000, "no memory limit");
        }
    }
    // B's 512 KiB write in one frame, on the connection it had, and its next request.
    timed("B's write", || {
        assert_eq!(b.write(1, 0, &vec![5u8; 512 << 10]), Ok(512 << 10));
    });
    timed("B's getattr", || b.getattr(1).unwrap());
    // A new connection of B's is served too.
    timed("B's new attach", || t.client(B, "b").unwrap());
    drop(a);
}

#[test]
fn a_tenant_that_takes_every_lock_it_may_leaves_the_other_its_locks() {
    let t = Tenancy::start(&["--max-locks-per-tenant", "3000"]);
    let mut setup = t.client(&a_addr(0), "a").unwrap();
    setup.walk(0, 1, "").unwrap();
    setup.lcreate(1, "locked", open_flags::RDWR, 0o644).unwrap();
    // A, from three connections on three addresses, takes one-byte write locks until
    // refused.
    let mut taken = 0u64;
    let mut refused = None;
    let mut a: Vec<_> = (0..3)
        .map(|i| {
            let mut c = t.client(&a_addr(i), "a").unwrap();
            c.walk(0, 1, "locked").unwrap();
            c.lopen(1, open_flags::RDWR).unwrap();
            c
        })
        .collect();
    'flood: for (i, c) in a.iter_mut().enumerate() {
        for n in 0..2000u64 {
            // Every other byte, so that no two locks merge.
            match c.lock(1, lock::WRLCK, 2 * (n + 2000 * i as u64), 1, 1) {
                Ok(status) => {
                    assert_eq!(status, lock::SUCCESS);
                    taken += 1;
                }
                Err(e) => {
                    refused = Some(e);
                    break 'flood;
                }
            }
        }
    }
    assert_eq!(refused, Some(Errno::ENOLCK), "after {taken} locks");
    assert_eq!(taken, 3000, "the tenant's share");
    // B locks a byte of its own at once.
    let mut b = t.client(B, "b").unwrap();
    b.walk(0, 1, "locked").unwrap();
    b.lopen(1, open_flags::RDWR).unwrap();
    let status = timed("B's lock", || b.lock(1, lock::WRLCK, 1, 1, 7));
    assert_eq!(status, Ok(lock::SUCCESS));
    drop(a);
}

#[test]
fn a_tenant_on_four_addresses_cannot_keep_the_other_out() {
    let t = Tenancy::start(&["--max-connections", "16"]);
    // A holds every slot with mounts: four connections from each of four addresses.
    let a: Vec<_> = (0..16)
        .map(|i| t.client(&a_addr(i), "a").unwrap())
        .collect();
    // B connects and is served: a connection of A's (above its fair share of 8) gives
    // its slot up.
    let mut b = timed("B's attach", || t.client(B, "b").unwrap());
    b.walk(0, 1, "").unwrap();
    // A, now holding 15, is above its share: its next connection is refused.
    let more = t.client(&a_addr(0), "a");
    assert!(more.is_err(), "A took a seventeenth slot");
    // B's second connection, still below its share, is let in.
    let b2 = timed("B's second attach", || t.client(B, "b"));
    assert!(b2.is_ok(), "{:?}", b2.err());
    drop(a);
}

#[test]
fn a_tenant_that_takes_every_fid_it_may_leaves_the_other_its_fids() {
    let t = Tenancy::start(&["--max-fids-per-tenant", "1000"]);
    let mut a: Vec<_> = (0..4).map(|i| t.client(&a_addr(i), "a").unwrap()).collect();
    let mut held = 4; // the attach fids
    'flood: for c in &mut a {
        for fid in 1..1000 {
            match c.walk(0, fid, "") {
                Ok(_) => held += 1,
                Err(e) => {
                    assert_eq!(e, Errno::EMFILE);
                    break 'flood;
                }
            }
        }
    }
    assert_eq!(held, 1000, "the tenant's share");
    let mut b = timed("B's attach", || t.client(B, "b").unwrap());
    for fid in 1..100 {
        assert_eq!(b.walk(0, fid, "").map(|_| ()), Ok(()));
    }
    drop(a);
}

/// Pipelines reads of the directory open as fid 1 on each of `sockets` from one thread
/// (so that each tenant's load has the same client CPU), `depth` outstanding on each,
/// for `time`; returns how many were answered. Reading a large directory costs the
/// server far more than the client (which never decodes the entries), so the server's
/// worker is what the tenants compete for.
fn pipeline_readdirs(mut sockets: Vec<TcpStream>, depth: u16, time: Duration) -> u64 {
    let request = |tag: u16| {
        let mut out = Vec::new();
        Tmsg::Readdir {
            fid: 1,
            offset: 0,
            count: 16 << 10,
        }
        .encode(tag, &mut out)
        .unwrap();
        out
    };
    let start = Instant::now();
    for socket in &mut sockets {
        for tag in 0..depth {
            socket.write_all(&request(tag)).unwrap();
        }
    }
    let mut answered = 0;
    while start.elapsed() < time {
        for socket in &mut sockets {
            let frame = read_frame(socket);
            let tag = u16::from_le_bytes([frame[5], frame[6]]);
            assert_eq!(frame[4], 41, "Rreaddir");
            answered += 1;
            socket.write_all(&request(tag)).unwrap();
        }
    }
    answered
}

/// A tenant pipelining expensive requests on eight connections leaves the other's
/// requests answered within the honest-client bounds (one worker thread, so they compete
/// for one CPU; CPU is shared between tenants before connections).
#[test]
fn a_tenant_that_hogs_the_cpu_leaves_the_other_served() {
    let t = Tenancy::start(&["--threads", "1"]);
    let mut setup = t.client(&a_addr(0), "a").unwrap();
    setup.walk(0, 1, "").unwrap();
    setup.mkdir(1, "wide", 0o755).unwrap();
    setup.walk(1, 2, "wide").unwrap();
    for i in 0..300 {
        setup
            .lcreate(2, &format!("entry-{i:04}"), open_flags::RDWR, 0o644)
            .unwrap();
        setup.clunk(2).unwrap();
        setup.walk(1, 2, "wide").unwrap();
    }
    let time = Duration::from_secs(3);
    let socket = |from: &str, export: &str| {
        let mut c = t.client(from, export).unwrap();
        c.walk(0, 1, "wide").unwrap();
        c.lopen(1, open_flags::RDONLY).unwrap();
        let Tcp(socket) = c.io;
        socket
    };
    let a: Vec<_> = (0..8)
        .map(|i| {
            let s = vec![socket(&a_addr(i), "a")];
            std::thread::spawn(move || pipeline_readdirs(s, 64, time))
        })
        .collect();
    // B: one request at a time, each timed.
    let mut b = t.client(B, "b").unwrap();
    b.walk(0, 1, "wide").unwrap();
    b.lopen(1, open_flags::RDONLY).unwrap();
    let start = Instant::now();
    let mut latencies = Vec::new();
    while start.elapsed() < time {
        let t0 = Instant::now();
        b.readdir(1, 0, 16 << 10).unwrap();
        latencies.push(t0.elapsed());
    }
    let a: u64 = a.into_iter().map(|h| h.join().unwrap()).sum();
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    let slowest = *latencies.last().unwrap();
    let (ta, tb) = (t.tenant("export:a"), t.tenant("export:b"));
    eprintln!(
        "A: {a} readdirs pipelined over 8 connections; B: {} one at a time, p99 {p99:?}, slowest {slowest:?}; server CPU ns A {} B {}; turns deferred {}",
        latencies.len(),
        ta["cpu_ns"],
        tb["cpu_ns"],
        t.counters()["cpu_deferrals"]
    );
    assert!(p99 < Duration::from_secs(2), "B's p99 {p99:?}");
    assert!(slowest < SLOWEST, "B's slowest {slowest:?}");
}

/// Quotas: tenant A fills its export's space and inode quotas and gets `EDQUOT`; tenant
/// B, on another export of the same filesystem, still writes and creates, and each sees
/// its own export's size in `Tstatfs`.
#[test]
fn a_tenant_that_fills_its_quota_leaves_the_other_space_and_inodes() {
    let dir = std::env::temp_dir().join(format!("ninefold-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("quota.img");
    let mkfs = Command::new(env!("CARGO_BIN_EXE_ninefold"))
        .args(["mkfs", image.to_str().unwrap(), "--size", "64M"])
        .output()
        .unwrap();
    assert!(mkfs.status.success(), "{mkfs:?}");
    let image = image.to_str().unwrap();
    // The exports' directories, made over 9P.
    let plain = Tenancy::serve(&[image, "--export", ":/"]);
    let mut c = Client::new(Tcp(plain.socket("127.0.0.1").unwrap()));
    c.version(1 << 20, b"9P2000.L").unwrap();
    c.attach(0, 0, "").unwrap();
    c.mkdir(0, "a", 0o777).unwrap();
    c.mkdir(0, "b", 0o777).unwrap();
    drop(c);
    plain.stop();

    let t = Tenancy::serve(&[
        image,
        "--export",
        "a:/a:allow=127.0.1.0/24:quota=1M:inodes=20",
        "--export",
        "b:/b:allow=127.0.2.0/24",
    ]);
    let mut a = t.client(&a_addr(0), "a").unwrap();
    let mut b = t.client(B, "b").unwrap();
    // What each sees as its filesystem's size.
    let (bsize, a_blocks, _) = a.statfs(0).unwrap();
    assert_eq!(
        u64::from(bsize) * a_blocks,
        1 << 20,
        "A's export is its quota"
    );
    let (bsize, b_blocks, _) = b.statfs(0).unwrap();
    assert!(
        u64::from(bsize) * b_blocks > 32 << 20,
        "B's is the filesystem"
    );
    // Space: A writes until refused, with 1 MiB at most.
    a.walk(0, 1, "").unwrap();
    a.lcreate(1, "big", open_flags::RDWR, 0o644).unwrap();
    let chunk = vec![1u8; 64 << 10];
    let mut written = 0u64;
    let refused = loop {
        match a.write(1, written, &chunk) {
            Ok(0) => break None,
            Ok(n) => written += u64::from(n),
            Err(e) => break Some(e),
        }
        assert!(
            written <= 1 << 20,
            "wrote {written} bytes under a 1 MiB quota"
        );
    };
    assert_eq!(refused, Some(Errno::EDQUOT), "after {written} bytes");
    // Inodes: A creates until refused.
    let mut created = 0;
    let refused = loop {
        a.walk(0, 2, "").unwrap();
        match a.lcreate(2, &format!("f{created}"), open_flags::RDWR, 0o644) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        a.clunk(2).unwrap();
        assert!(
            created <= 20,
            "created {created} files under a 20-inode quota"
        );
    };
    assert_eq!(refused, Errno::EDQUOT, "after {created} files");
    // A's fsync of what it wrote still works; B writes and creates as it likes.
    a.fsync(1, false).unwrap();
    b.walk(0, 1, "").unwrap();
    b.lcreate(1, "big", open_flags::RDWR, 0o644).unwrap();
    for i in 0..48u64 {
        assert_eq!(b.write(1, i * (64 << 10), &chunk), Ok(64 << 10));
    }
    b.fsync(1, false).unwrap();
    for i in 0..40 {
        b.walk(0, 2, "").unwrap();
        b.lcreate(2, &format!("f{i}"), open_flags::RDWR, 0o644)
            .unwrap();
        b.clunk(2).unwrap();
    }
    // The export's usage in the counters, under its name.
    let quotas = t.document()["fs"]["quotas"].clone();
    assert_eq!(quotas.as_array().map(Vec::len), Some(1), "{quotas}");
    assert_eq!(quotas[0]["name"], "a", "{quotas}");
    assert_eq!(quotas[0]["inodes"], 20, "at its limit: {quotas}");
    drop((a, b));
    t.stop();
    // The export's quota root, as `ctl` lists it.
    let listed = Command::new(env!("CARGO_BIN_EXE_ninefold"))
        .args(["ctl", image, "quota", "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.starts_with("1 quota root(s)"), "{listed}");
    assert!(listed.contains("of 1048576, inodes 20 of 20"), "{listed}");
    let _ = std::fs::remove_dir_all(&dir);
}
