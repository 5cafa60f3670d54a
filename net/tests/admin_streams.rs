//! The stream jobs of the administration export over in-memory connections: a snapshot
//! read out of `send` (full and incremental) is the stream `NineFs::send` writes and
//! receives elsewhere; the send buffer stays bounded while nobody reads; `send stop`
//! and a new `send start` stop a send; a stream written twice to `receive` becomes a
//! snapshot; a damaged one is refused with its reason in `status`, nothing applied.
//! The jobs' workers run on threads of their own, as the owner's background tasks.

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use block::MemDisk;
use common::Ticks;
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use ninep::admin::AdminFs;
use ninep::conn::Connection;
use ninep::server::{AccessConfig, Config, Export, Server};
use ninep::testing::{Client, Exchange};
use ninep::wire::open_flags as of;
use vfs::{Errno, FileSystem, Owner, ROOT_INO};

type Fs = AdminFs<NineFs<MemDisk>>;

/// The buffer of the stream jobs in these tests.
const BUFFER: usize = 64 * 1024;

/// Drives a connection until its reply comes: a request on `send` or `receive` waits
/// for the worker thread.
struct Patient(Connection<Fs>);

impl Exchange for Patient {
    fn exchange(&mut self, request: &[u8]) -> Vec<u8> {
        assert_eq!(self.0.receive(request), request.len(), "request taken");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let _ = self
                .0
                .poll_requests(&mut Context::from_waker(Waker::noop()));
            if let Some(out) = self.0.take_output() {
                return out;
            }
            assert!(Instant::now() < deadline, "no reply within 30 s");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// A served filesystem with its stream workers running and a budget granted every
/// millisecond.
fn served() -> Arc<Server<Fs>> {
    let disk = MemDisk::new(4096, 8192);
    pollster::block_on(format(&disk, &FormatOptions::default())).unwrap();
    let opts = MountOptions {
        stream_buffer: BUFFER,
        ..MountOptions::default()
    };
    let fs = pollster::block_on(NineFs::mount(disk, opts, Box::new(Ticks::default()))).unwrap();
    let mut access = AccessConfig::default();
    access.set_admin_allow("10.0.2.2").unwrap();
    let config = access.server_config(Export::root(""), Config::default());
    let server = Arc::new(Server::new(AdminFs::new(fs), config));
    let s = server.clone();
    std::thread::spawn(move || pollster::block_on(s.fs().inner().send_worker()));
    let s = server.clone();
    std::thread::spawn(move || pollster::block_on(s.fs().inner().receive_worker()));
    let s = server.clone();
    std::thread::spawn(move || loop {
        s.fs().inner().stream_grant(256 * 1024);
        std::thread::sleep(Duration::from_millis(1));
    });
    server
}

fn admin(server: &Arc<Server<Fs>>) -> Client<Patient> {
    let peer: IpAddr = "10.0.2.2".parse().unwrap();
    let mut c = Client::new(Patient(Connection::from_peer(server.clone(), peer)));
    c.version(1 << 20, b"9P2000.L").unwrap();
    c.attach(0, 0, "ctl").unwrap();
    c
}

fn command(c: &mut Client<Patient>, line: &str) -> Result<String, String> {
    c.walk(0, 8, "ctl").unwrap();
    c.lopen(8, of::WRONLY | of::TRUNC).unwrap();
    let r = c.write(8, 0, line.as_bytes());
    c.clunk(8).unwrap();
    let reply = read_small(c, "ctl");
    r.map(|_| reply.clone()).map_err(|_| reply)
}

fn read_small(c: &mut Client<Patient>, name: &str) -> String {
    c.walk(0, 9, name).unwrap();
    c.lopen(9, of::RDONLY).unwrap();
    let data = c.read(9, 0, 65536).unwrap();
    c.clunk(9).unwrap();
    String::from_utf8(data).unwrap()
}

/// The `status` line that starts with `key `.
fn status_line(c: &mut Client<Patient>, key: &str) -> String {
    let status = read_small(c, "status");
    status
        .lines()
        .find(|l| l.starts_with(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no {key} line in {status}"))
        .to_string()
}

/// A number after `word` in `line`.
fn field(line: &str, word: &str) -> u64 {
    let mut words = line.split_whitespace();
    words.find(|w| *w == word);
    words.next().unwrap().parse().unwrap()
}

/// Waits until the status line of `key` says `state`.
fn wait_for(c: &mut Client<Patient>, key: &str, state: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = status_line(c, key);
        if line.starts_with(&format!("{key} {state} ")) {
            return read_small(c, "status");
        }
        assert!(Instant::now() < deadline, "{key} never {state}: {line}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reads the whole `send` stream, `chunk` bytes a request.
fn read_stream(c: &mut Client<Patient>, chunk: u32) -> Vec<u8> {
    c.walk(0, 10, "send").unwrap();
    c.lopen(10, of::RDONLY).unwrap();
    let mut out = Vec::new();
    loop {
        let got = c.read(10, out.len() as u64, chunk).unwrap();
        if got.is_empty() {
            break;
        }
        out.extend_from_slice(&got);
    }
    c.clunk(10).unwrap();
    out
}

/// Writes `stream` to `receive` once (one pass), `chunk` bytes a request; the first
/// error.
fn write_pass(c: &mut Client<Patient>, stream: &[u8], chunk: usize) -> Result<(), Errno> {
    c.walk(0, 11, "receive").unwrap();
    c.lopen(11, of::WRONLY | of::TRUNC).unwrap();
    let mut at = 0;
    let mut result = Ok(());
    while at < stream.len() {
        let end = (at + chunk).min(stream.len());
        match c.write(11, at as u64, &stream[at..end]) {
            Ok(n) => at += n as usize,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    c.clunk(11).unwrap();
    result
}

const ROOT: Owner = Owner { uid: 0, gid: 0 };

/// Makes file `name` of `len` bytes of `byte` (or rewrites its first 4 KiB).
fn put(fs: &NineFs<MemDisk>, name: &str, byte: u8, len: usize) {
    pollster::block_on(async {
        let ino = match fs.lookup(ROOT_INO, name.as_bytes()).await {
            Ok(a) => a.ino,
            Err(_) => {
                fs.create(ROOT_INO, name.as_bytes(), 0o644, ROOT)
                    .await
                    .unwrap()
                    .ino
            }
        };
        fs.write(ino, 0, &vec![byte; len]).await.unwrap();
    });
}

/// What `NineFs::send` writes for `name` (from `base`).
fn direct(fs: &NineFs<MemDisk>, name: &str, base: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    pollster::block_on(fs.send(name, base, &mut |b: &[u8]| {
        out.extend_from_slice(b);
        Ok(())
    }))
    .unwrap();
    out
}

#[test]
fn send_streams_snapshots_through_a_bounded_buffer() {
    let server = served();
    let fs = server.fs().inner();
    put(fs, "big", 1, 600_000);
    put(fs, "small", 2, 5000);
    let mut c = admin(&server);
    assert_eq!(
        read_small(&mut c, "status")
            .lines()
            .filter(|l| l.starts_with("send"))
            .count(),
        2,
        "send never, send_jobs 0"
    );
    assert!(command(&mut c, "snapshot create a").is_ok());
    put(fs, "small", 3, 4096);
    put(fs, "new", 4, 10_000);
    assert!(command(&mut c, "snapshot create b").is_ok());

    // Nobody reads: the worker fills the buffer and waits; memory stays at the buffer.
    let reply = command(&mut c, "send start a").unwrap();
    assert!(
        reply.starts_with("sending \"a\": read the send file"),
        "{reply}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        let line = status_line(&mut c, "send");
        if field(&line, "stalls") > 0 {
            break line;
        }
        assert!(Instant::now() < deadline, "never stalled: {line}");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert!(line.starts_with("send running "), "{line}");
    std::thread::sleep(Duration::from_millis(50));
    let line = status_line(&mut c, "send");
    assert_eq!(field(&line, "buffered"), BUFFER as u64, "{line}");
    assert_eq!(field(&line, "bytes"), BUFFER as u64, "{line}");
    // The snapshot being sent cannot go.
    let refused = command(&mut c, "snapshot delete a").unwrap_err();
    assert!(refused.contains("being sent"), "{refused}");

    // A new send replaces it; read whole, it is what `NineFs::send` writes.
    let reply = command(&mut c, "send start a").unwrap();
    assert!(reply.contains("the send running was stopped"), "{reply}");
    let full = read_stream(&mut c, 8192);
    assert_eq!(full, direct(fs, "a", None));
    let status = wait_for(&mut c, "send", "done");
    assert!(status.contains("send_result sent \"a\": "), "{status}");
    assert!(status.contains("send_jobs 2\n"), "{status}");
    // Read again at its start: the stream is read once, in order.
    c.walk(0, 10, "send").unwrap();
    c.lopen(10, of::RDONLY).unwrap();
    assert_eq!(c.read(10, 0, 100), Err(Errno::EINVAL));
    c.clunk(10).unwrap();

    // The counters keep every job's bytes and stalls (status shows the last job's).
    let counters = fs.stream_counters().send;
    assert_eq!(counters.jobs, 2);
    assert_eq!(counters.bytes, BUFFER as u64 + full.len() as u64);
    assert!(counters.stalls >= 1, "{counters:?}");
    assert_eq!((counters.running, counters.buffered), (0, 0));

    assert!(command(&mut c, "send start b from a").is_ok());
    let incremental = read_stream(&mut c, 1 << 20);
    assert_eq!(incremental, direct(fs, "b", Some("a")));
    assert!(
        incremental.len() < full.len() / 10,
        "{} of {}",
        incremental.len(),
        full.len()
    );

    // Both received elsewhere give snapshot b.
    let target = served();
    let mut t = admin(&target);
    for stream in [&full, &incremental] {
        assert!(command(&mut t, "receive start").is_ok());
        write_pass(&mut t, stream, 100_000).unwrap();
        write_pass(&mut t, stream, 100_000).unwrap();
        let status = wait_for(&mut t, "receive", "done");
        assert!(
            status.contains("receive_result received snapshot"),
            "{status}"
        );
    }
    let tfs = target.fs().inner();
    let view = pollster::block_on(tfs.snapshot_view("b")).unwrap();
    pollster::block_on(async {
        for (name, byte, len) in [("big", 1, 600_000), ("new", 4, 10_000)] {
            let a = view.lookup(ROOT_INO, name.as_bytes()).await.unwrap();
            let mut buf = vec![0; len + 10];
            assert_eq!(view.read(a.ino, 0, &mut buf).await.unwrap(), len);
            assert!(buf[..len].iter().all(|b| *b == byte), "{name}");
        }
        let a = view.lookup(ROOT_INO, b"small").await.unwrap();
        let mut buf = vec![0; 6000];
        assert_eq!(view.read(a.ino, 0, &mut buf).await.unwrap(), 5000);
        assert!(buf[..4096].iter().all(|b| *b == 3) && buf[4096..5000].iter().all(|b| *b == 2));
    });

    // Stopped: the reader sees the end; nothing runs any more.
    assert!(command(&mut c, "send start a").is_ok());
    let reply = command(&mut c, "send stop").unwrap();
    assert_eq!(reply, "send stopped\n");
    assert!(status_line(&mut c, "send").starts_with("send stopped "));
    assert_eq!(read_stream(&mut c, 4096), b"");
    assert_eq!(
        command(&mut c, "send stop").unwrap_err(),
        "error: no send is running\n"
    );
    assert!(command(&mut c, "send start nosuch")
        .unwrap_err()
        .contains("no snapshot \"nosuch\""));
    assert!(command(&mut c, "snapshot delete a").is_ok());
}

#[test]
fn receive_refuses_a_damaged_stream_with_nothing_applied() {
    let source = served();
    let fs = source.fs().inner();
    put(fs, "f", 7, 300_000);
    let mut c = admin(&source);
    assert!(command(&mut c, "snapshot create a").is_ok());
    let mut stream = direct(fs, "a", None);
    let target = served();
    let mut t = admin(&target);

    // Nothing to receive: writes are refused.
    assert_eq!(write_pass(&mut t, &stream, 4096), Err(Errno::EINVAL));
    // A flipped bit is refused after the first pass.
    let at = stream.len() / 2;
    stream[at] ^= 0x10;
    assert!(command(&mut t, "receive start").is_ok());
    assert!(command(&mut t, "receive start")
        .unwrap_err()
        .contains("a receive is running"));
    let written = write_pass(&mut t, &stream, 65536);
    let status = wait_for(&mut t, "receive", "failed");
    assert!(
        status.contains("receive_result receive refused: stream damaged: record"),
        "{status}"
    );
    assert!(status.contains("nothing applied"), "{status}");
    assert!(written.is_err() || write_pass(&mut t, &stream, 65536) == Err(Errno::EINVAL));
    let tfs = target.fs().inner();
    let root = pollster::block_on(tfs.readdir(ROOT_INO, 0, 10)).unwrap();
    assert_eq!(root.len(), 2, "nothing applied: {root:?}");

    // A truncated stream (the writer closed the file early) is refused too.
    stream[at] ^= 0x10;
    assert!(command(&mut t, "receive start").is_ok());
    write_pass(&mut t, &stream[..stream.len() - 20], 65536).unwrap();
    let status = wait_for(&mut t, "receive", "failed");
    assert!(status.contains("truncated"), "{status}");

    // Stopped while nobody writes; then the whole stream, twice, is received.
    assert!(command(&mut t, "receive start").is_ok());
    assert_eq!(
        command(&mut t, "receive stop").unwrap(),
        "receive stopped\n"
    );
    assert!(command(&mut t, "receive start").is_ok());
    write_pass(&mut t, &stream, 65536).unwrap();
    write_pass(&mut t, &stream, 65536).unwrap();
    let status = wait_for(&mut t, "receive", "done");
    assert!(
        status.contains("receive_result received snapshot \"a\""),
        "{status}"
    );
    // A third pass has nowhere to go.
    assert_eq!(write_pass(&mut t, &stream, 65536), Err(Errno::EINVAL));
}
