//! One server shared by OS threads, as the appliance shares one between its CPUs: each
//! thread runs several connections (created on that thread), all of them attaching,
//! creating, writing, reading, locking and clunking at once over one filesystem and one
//! lock table, while another thread does the housekeeping readers' work. At the end the
//! shared state must add up: every byte of the memory budget back, no lock left, no
//! session registered, and every counter equal to the sum of what the threads did (a
//! lost update of a counter, a charge never given back or a lock left behind fails it).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::Instant;

use common::{Local, Model};
use ninep::conn::Connection;
use ninep::server::{Config, Server};
use ninep::testing::{Client, Exchange};
use ninep::wire::{lock, open_flags::RDWR, Header, RmsgType, TmsgType};
use vfs::Errno;

const THREADS: usize = 4;
const CONNS_PER_THREAD: usize = 3;
const ROUNDS: usize = 500;
/// The file every connection locks a byte of.
const SHARED: &str = "shared";
/// The byte every connection competes for.
const CONTESTED: u64 = 1 << 20;

/// The server's clock: real time, so request latencies are recorded.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What one connection's client sent and got back, added up by the test.
#[derive(Debug, Default)]
struct Tally {
    /// Requests sent, by type byte.
    sent: BTreeMap<u8, u64>,
    /// `Rlerror` replies.
    errors: u64,
    /// Files opened (each released once, at clunk or teardown).
    opens: u64,
    /// `Twrite`s and `Tfsync`s answered successfully.
    writes: u64,
    fsyncs: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        for (ty, n) in &other.sent {
            *self.sent.entry(*ty).or_default() += n;
        }
        self.errors += other.errors;
        self.opens += other.opens;
        self.writes += other.writes;
        self.fsyncs += other.fsyncs;
    }

    fn sent(&self, ty: TmsgType) -> u64 {
        self.sent.get(&(ty as u8)).copied().unwrap_or(0)
    }
}

/// An in-memory exchange that counts what passes through it.
struct Counted {
    local: Local<Model>,
    tally: Tally,
}

impl Exchange for Counted {
    fn exchange(&mut self, request: &[u8]) -> Vec<u8> {
        let ty = Header::peek(request).expect("a request header").ty;
        *self.tally.sent.entry(ty).or_default() += 1;
        let reply = self.local.exchange(request);
        if Header::peek(&reply).expect("a reply header").ty == RmsgType::Lerror as u8 {
            self.tally.errors += 1;
        }
        reply
    }
}

type TestClient = Client<Counted>;

/// A versioned connection of `server` made on this thread, attached as root (fid 0),
/// with the shared file open (fid 2).
fn connect(server: &Arc<Server<Model>>) -> TestClient {
    let local = Local {
        conn: Connection::new(server.clone()),
    };
    let mut c = Client::new(Counted {
        local,
        tally: Tally::default(),
    });
    c.version(1 << 20, b"9P2000.L").unwrap();
    c.attach(0, 0, "").unwrap();
    c.walk(0, 2, SHARED).unwrap();
    c.lopen(2, RDWR).unwrap();
    c.io.tally.opens += 1;
    c
}

/// The content of round `round`'s file of connection `who`.
fn content(who: usize, round: usize) -> Vec<u8> {
    let len = 100 + (who * 31 + round * 17) % 5000;
    (0..len).map(|i| (who * 7 + round + i) as u8).collect()
}

fn file_name(who: usize, round: usize) -> String {
    format!("f{who}-{round}")
}

/// One round of connection `who`: a file created, written, read back, locked, maybe
/// fsynced, clunked, and every other one removed; a byte of the shared file locked and
/// unlocked, the contested byte tried; a walk that fails.
fn round(c: &mut TestClient, who: usize, round: usize) {
    let name = file_name(who, round);
    let data = content(who, round);
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, &name, RDWR, 0o644).unwrap();
    c.io.tally.opens += 1;
    assert_eq!(c.write(1, 0, &data).unwrap() as usize, data.len());
    c.io.tally.writes += 1;
    assert_eq!(c.read(1, 0, 8192).unwrap(), data, "{name} reads back");
    assert_eq!(c.lock(1, lock::WRLCK, 0, 0, 1).unwrap(), lock::SUCCESS);
    if round.is_multiple_of(4) {
        c.fsync(1, round.is_multiple_of(8)).unwrap();
        c.io.tally.fsyncs += 1;
    }
    assert_eq!(c.getattr(1).unwrap().size, data.len() as u64);

    // Distinct bytes of one file: granted whatever the others hold.
    let mine = who as u64;
    assert_eq!(c.lock(2, lock::WRLCK, mine, 1, 1).unwrap(), lock::SUCCESS);
    // One byte for all: granted or blocked, as the others' timing has it.
    let contested = c.lock(2, lock::WRLCK, CONTESTED, 1, 1).unwrap();
    assert!(contested == lock::SUCCESS || contested == lock::BLOCKED);
    c.getlock(2, lock::WRLCK, 0, 0, 1).unwrap();
    assert_eq!(
        c.lock(2, lock::UNLCK, CONTESTED, 1, 1).unwrap(),
        lock::SUCCESS
    );
    assert_eq!(c.lock(2, lock::UNLCK, mine, 1, 1).unwrap(), lock::SUCCESS);

    assert_eq!(c.walk(0, 3, "no-such-file"), Err(Errno::ENOENT));
    // The clunk releases the file and its lock.
    c.clunk(1).unwrap();
    if round % 2 == 1 {
        c.walk(0, 4, &name).unwrap();
        c.remove(4).unwrap();
    }
}

/// Files that stay after every round of connection `who`.
fn kept(who: usize) -> impl Iterator<Item = (String, usize)> {
    (0..ROUNDS)
        .filter(|r| r.is_multiple_of(2))
        .map(move |r| (file_name(who, r), content(who, r).len()))
}

/// Serves `CONNS_PER_THREAD` connections numbered from `first`, a round of each in
/// turn; the last round leaves a lock for the teardown to release on every other
/// connection. Returns what they sent.
fn serve_thread(server: &Arc<Server<Model>>, first: usize, start: &Barrier) -> Tally {
    let mut clients: Vec<TestClient> = (0..CONNS_PER_THREAD).map(|_| connect(server)).collect();
    start.wait();
    for r in 0..ROUNDS {
        for (i, c) in clients.iter_mut().enumerate() {
            round(c, first + i, r);
        }
    }
    let mut tally = Tally::default();
    for (i, mut c) in clients.into_iter().enumerate() {
        if i.is_multiple_of(2) {
            assert_eq!(
                c.lock(2, lock::RDLCK, 1000 + (first + i) as u64, 1, 2)
                    .unwrap(),
                lock::SUCCESS
            );
        }
        tally.add(&c.io.tally);
        pollster::block_on(c.io.local.conn.shutdown());
    }
    tally
}

/// What the housekeeping and the counters' readers do meanwhile, on their own thread:
/// every reader walks the shared state while it changes.
fn watch(server: &Server<Model>, done: &AtomicBool) -> u64 {
    let limit = server.memory().limit;
    let peer = IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2));
    let mut passes = 0;
    while !done.load(Ordering::Relaxed) {
        assert_eq!(server.sweep(), 0, "no deadline passes in this test");
        assert!(server.admit(Some(peer)));
        assert!(server.memory().committed <= limit);
        let _ = (server.stats(), server.request_stats(), server.timings());
        let _ = (server.connection_count(), server.lock_count());
        passes += 1;
    }
    passes
}

#[test]
fn threads_share_one_server_and_its_books_add_up() {
    let mut config = Config {
        clock: Some(now_ns),
        ..Config::default()
    };
    config.memory = config.memory_for(64 << 20);
    let server = common::model_server(config);
    {
        let mut c = common::client(&server);
        c.attach(0, 0, "").unwrap();
        c.lcreate(0, SHARED, RDWR, 0o666).unwrap();
        pollster::block_on(c.io.conn.shutdown());
    }
    let before = server.stats();
    let requests_before = server.request_stats();

    let start = Barrier::new(THREADS);
    let done = AtomicBool::new(false);
    let total = Mutex::new(Tally::default());
    let watched = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch(&server, &done));
        let servers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (server, start, total) = (&server, &start, &total);
                scope.spawn(move || {
                    let tally = serve_thread(server, t * CONNS_PER_THREAD, start);
                    total.lock().unwrap().add(&tally);
                })
            })
            .collect();
        for s in servers {
            s.join().expect("a serving thread failed");
        }
        done.store(true, Ordering::Relaxed);
        watcher.join().expect("the watcher failed")
    });
    assert!(watched > 0);
    let t = total.into_inner().unwrap();

    // Nothing held: memory, locks, sessions.
    let memory = server.memory();
    assert_eq!(
        memory.committed, 0,
        "the budget is back to zero: {memory:?}"
    );
    assert_eq!(memory.charged, Default::default());
    assert!(memory.peak > 0);
    assert_eq!(server.lock_count(), 0, "the teardowns released every lock");
    assert_eq!(server.connection_count(), 0, "the registry is empty");

    // Every counter is the sum of what the threads did.
    let conns = (THREADS * CONNS_PER_THREAD) as u64;
    let s = server.stats();
    let did = |after: u64, before: u64| after - before;
    assert_eq!(did(s.connections_opened, before.connections_opened), conns);
    assert_eq!(did(s.connections_closed, before.connections_closed), conns);
    let versions = t.sent(TmsgType::Version);
    assert_eq!(versions, conns);
    let sent: u64 = t.sent.values().sum();
    assert_eq!(
        did(s.requests, before.requests),
        sent - versions,
        "requests (Tversion is the connection's own)"
    );
    assert_eq!(did(s.error_replies, before.error_replies), t.errors);
    assert_eq!(t.errors, conns * ROUNDS as u64, "one failed walk per round");
    assert_eq!(did(s.writes, before.writes), t.writes);
    assert_eq!(did(s.fsyncs, before.fsyncs), t.fsyncs);
    assert_eq!(did(s.releases, before.releases), t.opens);
    let r = server.request_stats();
    for (&ty, &n) in &t.sent {
        let received = r.received(ty) - requests_before.received(ty);
        assert_eq!(received, n, "received of type {ty}");
        let answered = r.latency(ty).count - requests_before.latency(ty).count;
        assert_eq!(answered, n, "latencies of type {ty}");
    }

    // And the filesystem holds what the connections left.
    let mut c = common::client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lopen(1, 0).unwrap();
    let names: Vec<Vec<u8>> = c
        .readdir_all(1, 8192)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    let expected: Vec<(String, usize)> = (0..THREADS * CONNS_PER_THREAD).flat_map(kept).collect();
    assert_eq!(
        names.len(),
        expected.len() + 1,
        "the kept files and {SHARED}"
    );
    for (i, (name, len)) in expected.iter().enumerate() {
        let fid = 10 + i as u32;
        c.walk(0, fid, name).unwrap();
        assert_eq!(c.getattr(fid).unwrap().size, *len as u64, "{name}");
        c.clunk(fid).unwrap();
    }
}

#[test]
fn a_close_asked_for_on_another_thread_wakes_the_connection() {
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Wake, Waker};

    /// Counts wakes, from any thread.
    struct Wakes(AtomicUsize);
    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    let server = common::model_server(Config::default());
    let mut conn = Connection::new(server.clone());
    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    // Waiting for its (no) requests registers the task with the session.
    assert!(conn
        .poll_requests(&mut Context::from_waker(&waker))
        .is_ready());
    std::thread::scope(|scope| {
        scope.spawn(|| assert_eq!(server.shut_down(), 1));
    });
    assert_eq!(
        wakes.0.load(Ordering::Relaxed),
        1,
        "woken from the other thread"
    );
    assert!(!conn.wants_input(), "and closing");
    assert_eq!(
        conn.closing(),
        Some(ninep::conn::CloseReason::Shutdown),
        "for the shutdown"
    );
}
