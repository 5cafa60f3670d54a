//! Snapshot streams out of the running appliance (issue 28): the host, an admin client
//! of the `ctl` export, takes snapshot `a`, reads its full stream from the `send` file
//! while another client keeps writing, changes about 1% of the data, takes `b` and reads
//! the incremental stream from `a`; `ninefold receive` applies both to an image on the
//! host, and every file of `b` read back from that image through `ninefold serve` is
//! what the appliance's `.snapshots/b` holds. Snapshot `b` and its incremental stream go
//! through the host tool's `--connect` (no mount, no test client), and its `status` and
//! `snapshot list` read the appliance. Sizes and times are printed
//! (`--nocapture`), not checked. The appliance serves the in-memory filesystem in
//! 256 MiB.
//!
//! Host ports: 9P on 16560.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ninefold_tests::ninep::{connect, serve_on_host};
use ninefold_tests::{tool, FsImage, Qemu};
use ninep::testing::{Client, Exchange};
use ninep::wire::{open_flags, setattr};
use serde_json::json;

/// How long the appliance may take to boot and get its DHCP lease under TCG.
const UP: Duration = Duration::from_secs(60);
/// Files written before snapshot `a`, and the bytes of each.
const FILES: usize = 24;
const FILE_BYTES: usize = 128 * 1024;

fn file_data(i: usize) -> Vec<u8> {
    (0..FILE_BYTES).map(|j| (i * 31 + j / 4096) as u8).collect()
}

/// Writes `line` to `ctl` (the admin export attached at fid 0); its reply.
fn ctl<X: Exchange>(c: &mut Client<X>, line: &str) -> String {
    c.walk(0, 8, "ctl").unwrap();
    c.lopen(8, open_flags::WRONLY | open_flags::TRUNC).unwrap();
    let written = c.write(8, 0, line.as_bytes());
    c.clunk(8).unwrap();
    let reply = String::from_utf8(read_all(c, 0, "ctl")).unwrap();
    assert!(written.is_ok(), "{line}: {reply}");
    reply
}

/// Reads the whole of `path` from the tree attached at `root`, 512 KiB a request.
fn read_all<X: Exchange>(c: &mut Client<X>, root: u32, path: &str) -> Vec<u8> {
    c.walk(root, 9, path).unwrap();
    c.lopen(9, open_flags::RDONLY).unwrap();
    let mut data = Vec::new();
    loop {
        let got = c.read(9, data.len() as u64, 512 * 1024).unwrap();
        if got.is_empty() {
            break;
        }
        data.extend(got);
    }
    c.clunk(9).unwrap();
    data
}

fn write_file<X: Exchange>(c: &mut Client<X>, name: &str, offset: u64, data: &[u8]) {
    c.walk(1, 2, name).unwrap();
    c.lopen(2, open_flags::RDWR).unwrap();
    c.write(2, offset, data).unwrap();
    c.clunk(2).unwrap();
}

/// What a stream carries of `path`: mode, owner, group, links, size, mtime.
fn attrs<X: Exchange>(c: &mut Client<X>, path: &str) -> (u32, u32, u32, u64, u64, (u64, u64)) {
    c.walk(1, 9, path).unwrap();
    let st = c.getattr(9).unwrap();
    c.clunk(9).unwrap();
    (st.mode, st.uid, st.gid, st.nlink, st.size, st.mtime)
}

/// Reads the stream of the running send, timing it.
fn pull<X: Exchange>(c: &mut Client<X>, what: &str) -> Vec<u8> {
    let started = Instant::now();
    let stream = read_all(c, 0, "send");
    println!(
        "{what}: {} bytes in {:.2} s",
        stream.len(),
        started.elapsed().as_secs_f64()
    );
    stream
}

#[test]
fn full_and_incremental_streams_out_of_the_appliance_restore_on_the_host() {
    let port = 16560;
    let mut vm = Qemu::serving()
        .memory("256M")
        .virtio_net_forwards(&[(port, 564)])
        .append("fs=memory admin_allow=10.0.2.2 stream_rate=64")
        .timeout(Duration::from_secs(300))
        .spawn();
    vm.wait_for_event(
        "listening",
        json!({"service": "9p", "address": "10.0.2.15", "port": 564}),
    );
    let mut c = connect(port, UP);
    c.attach(1, 0, "").unwrap();
    for i in 0..FILES {
        c.walk(1, 2, "").unwrap();
        c.lcreate(2, &format!("f{i}"), open_flags::RDWR, 0o644)
            .unwrap();
        c.write(2, 0, &file_data(i)).unwrap();
        c.clunk(2).unwrap();
    }
    // Attributes a stream must carry: modes and owners, an xattr, a hard link.
    c.walk(1, 2, "f1").unwrap();
    let owner = setattr::MODE | setattr::UID | setattr::GID;
    c.setattr(2, owner, 0o100640, 1000, 100, 0).unwrap();
    c.clunk(2).unwrap();
    c.walk(1, 2, "f2").unwrap();
    c.xattrcreate(2, "user.tag", 5, 0).unwrap();
    c.write(2, 0, b"kept!").unwrap();
    c.clunk(2).unwrap();
    c.walk(1, 2, "f3").unwrap();
    c.link(1, 2, "f3-link").unwrap();
    c.clunk(2).unwrap();
    c.attach(0, 0, "ctl").unwrap();
    assert!(ctl(&mut c, "snapshot create a\n").starts_with("created snapshot"));

    // A client writes on its own connection while the stream is read.
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, writes) = (stop.clone(), writes.clone());
        std::thread::spawn(move || {
            let mut w = connect(port, UP);
            w.attach(1, 0, "").unwrap();
            w.walk(1, 2, "").unwrap();
            w.lcreate(2, "busy", open_flags::RDWR, 0o644).unwrap();
            let mut at = 0u64;
            while !stop.load(Ordering::Relaxed) {
                w.write(2, at % (1 << 20), &[7; 16384]).unwrap();
                w.fsync(2, false).unwrap();
                at += 16384;
                writes.fetch_add(1, Ordering::Relaxed);
            }
            w.clunk(2).unwrap();
            // Gone before b: the increment is the 1% below.
            w.unlinkat(1, "busy", 0).unwrap();
        })
    };
    assert!(ctl(&mut c, "send start a\n").starts_with("sending \"a\""));
    let before = writes.load(Ordering::Relaxed);
    let full = pull(&mut c, "full stream of a");
    let during = writes.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    println!("writes acknowledged to the other client while it was read: {during}");
    let status = String::from_utf8(read_all(&mut c, 0, "status")).unwrap();
    assert!(status.contains("send done "), "{status}");
    assert!(status.contains("send_result sent \"a\""), "{status}");

    // About 1% of the data changes: 4 KiB in 8 of the 24 files of 128 KiB.
    for i in (0..FILES).step_by(3) {
        write_file(&mut c, &format!("f{i}"), 8192, &[0xa5; 4096]);
    }
    // The host tool against the appliance (`--connect`): b and its increment from a.
    let appliance = format!("127.0.0.1:{port}");
    let cli = |args: &[&str]| {
        let out = Command::new(tool()).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "ninefold {args:?}: {stderr}");
        (String::from_utf8(out.stdout).unwrap(), stderr)
    };
    let (out, _) = cli(&["snapshot", "create", "--connect", &appliance, "b"]);
    assert!(out.starts_with("created snapshot"), "{out}");
    let increment_file =
        std::env::temp_dir().join(format!("ninefold-send-ctl-b-{}", std::process::id()));
    let started = Instant::now();
    let (_, said) = cli(&[
        "send",
        "--connect",
        &appliance,
        "b",
        "--from",
        "a",
        "-o",
        increment_file.to_str().unwrap(),
    ]);
    assert!(said.contains("sent b (from a)"), "{said}");
    let incremental = std::fs::read(&increment_file).unwrap();
    let _ = std::fs::remove_file(&increment_file);
    println!(
        "incremental stream b from a (ninefold send --connect): {} bytes in {:.2} s",
        incremental.len(),
        started.elapsed().as_secs_f64()
    );
    let (out, _) = cli(&["snapshot", "list", "--connect", &appliance]);
    assert!(
        out.starts_with("2 snapshot(s)") && out.contains(" b "),
        "{out}"
    );
    let (out, _) = cli(&["status", "--connect", &appliance]);
    assert!(out.contains("send_result  sent \"b\""), "{out}");
    // A quota set on the running appliance and shown back.
    let (out, _) = cli(&["quota", "--connect", &appliance, "/", "--inodes", "100000"]);
    assert!(
        out.starts_with("/: root 1: bytes ") && out.trim_end().ends_with(" of 100000"),
        "{out}"
    );
    let (out, _) = cli(&["quota", "--connect", &appliance]);
    assert!(out.starts_with("1 quota root(s)"), "{out}");
    println!(
        "incremental / full: {:.3}",
        incremental.len() as f64 / full.len() as f64
    );
    // What copying the changed files through a mount moves instead (knowing which).
    let started = Instant::now();
    let copied: usize = (0..FILES)
        .step_by(3)
        .map(|i| read_all(&mut c, 1, &format!(".snapshots/b/f{i}")).len())
        .sum();
    println!(
        "copying the changed files through the mount: {copied} bytes in {:.2} s ({:.1}x the incremental)",
        started.elapsed().as_secs_f64(),
        copied as f64 / incremental.len() as f64
    );
    assert!(incremental.len() * 10 < full.len());

    // Received on the host, b holds what the appliance's b holds.
    let dir = std::env::temp_dir().join(format!("ninefold-send-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = FsImage::formatted("128M");
    for (name, stream) in [("full", &full), ("incremental", &incremental)] {
        let path = dir.join(name);
        std::fs::write(&path, stream).unwrap();
        let out = Command::new(tool())
            .arg("receive")
            .arg(image.path())
            .arg("-i")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ninefold receive {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (mut server, mut h) = serve_on_host(image.path());
    h.attach(1, 0, "").unwrap();
    for i in 0..FILES {
        let path = format!(".snapshots/b/f{i}");
        let there = read_all(&mut c, 1, &path);
        let here = read_all(&mut h, 1, &path);
        assert_eq!(there.len(), FILE_BYTES, "{path}");
        assert!(there == here, "{path} differs on the host");
        let (a, b) = (attrs(&mut c, &path), attrs(&mut h, &path));
        assert_eq!(a, b, "{path}: attributes differ on the host");
    }
    assert_eq!(attrs(&mut h, ".snapshots/b/f1").0, 0o100640);
    assert_eq!(
        attrs(&mut h, ".snapshots/b/f3").3,
        2,
        "the hard link came as a link"
    );
    h.walk(1, 2, ".snapshots/b/f2").unwrap();
    assert_eq!(h.xattrwalk(2, 3, "user.tag"), Ok(5));
    assert_eq!(h.read(3, 0, 5).unwrap(), b"kept!");
    h.clunk(3).unwrap();
    h.clunk(2).unwrap();
    assert_eq!(read_all(&mut c, 1, ".snapshots/b/f0")[8192], 0xa5);
    assert_eq!(
        read_all(&mut h, 1, ".snapshots/a/f0")[8192],
        file_data(0)[8192]
    );
    let _ = server.kill();
    let _ = server.wait();
}
