//! The appliance's 9P service over real TCP: QEMU user networking forwards a host port
//! to the appliance's port 564; the net crate's test client talks to it from the host.
//! The appliance serves its real filesystem from an NVMe disk (a virtio-blk one in one
//! test) formatted by `ninefold mkfs`, in 128 MiB, on every vCPU
//! ([`ninefold_tests::serving_cpus`]; the virtio-blk test on one); after each test QEMU is killed and
//! `ninefold fsck` must find the image clean. One test keeps the in-memory development
//! filesystem (`fs=memory`) working.
//!
//! Host ports: 9P on 15811-15815, the counters service on 15821-15825 (one pair per
//! test, so tests run in parallel).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use std::time::Duration;

use ninefold_tests::ninep::{connect, read_frame, stream, Tcp};
use ninefold_tests::{serving_cpus, stats, FsImage, Qemu, Running};
use ninep::testing::Client;
use ninep::wire::{open_flags, Tmsg};
use serde_json::{json, Value};
use vfs::Errno;

const MIB: usize = 1 << 20;
/// How long the appliance may take to boot and get its DHCP lease under TCG.
const UP: Duration = Duration::from_secs(60);

/// What the appliance serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backing {
    /// An NVMe disk formatted by `ninefold mkfs`.
    Nvme,
    /// A virtio-blk disk formatted by `ninefold mkfs`.
    VirtioBlk,
    /// The in-memory development filesystem.
    Memory,
}

/// A booted appliance, its disk image, and its forwarded ports.
struct Appliance {
    vm: Running,
    image: Option<FsImage>,
    stats_port: u16,
}

/// Boots the appliance serving `backing`, its 9P port forwarded from `port` and its
/// counters service from `port + 10`, on [`serving_cpus`] vCPUs (on one for virtio-blk:
/// serving from one CPU stays tested).
fn appliance(port: u16, backing: Backing) -> Appliance {
    let stats_port = port + 10;
    let image = (backing != Backing::Memory).then(|| FsImage::formatted("256M"));
    let cpus = match backing {
        Backing::VirtioBlk => 1,
        _ => serving_cpus(),
    };
    // Every client of a QEMU user-network forward is 10.0.2.2, and one test opens 64.
    let mut q = Qemu::appliance()
        .cpus(cpus)
        .memory("128M")
        .virtio_net_forwards(&[(port, 564), (stats_port, 5641)])
        .append("max_conns_per_client=64")
        .timeout(Duration::from_secs(300));
    q = match (backing, &image) {
        (Backing::Nvme, Some(i)) => q.nvme_image("nf-test", i),
        (Backing::VirtioBlk, Some(i)) => q.virtio_blk_image(i),
        _ => q.append("fs=memory"),
    };
    let mut vm = q.spawn();
    vm.wait_for_event(
        "listening",
        json!({"service": "9p", "address": "10.0.2.15", "port": 564}),
    );
    Appliance {
        vm,
        image,
        stats_port,
    }
}

impl Appliance {
    /// Kills QEMU (the appliance has no shutdown: every stop is a crash), checks the log
    /// and requires `ninefold fsck` to find the image clean.
    fn finish(self) {
        let boot = self.vm.stop();
        boot.expect_no_line("!!!");
        boot.expect_no_line("ERROR");
        if let Some(image) = self.image {
            image.fsck();
        }
    }
}

/// Waits for a `stats` event (every 10 s while the counters change) whose 9P service
/// has accepted `accepted` connections and has `active` open.
fn wait_for_connections(vm: &mut Running, accepted: u64, active: u64) -> Value {
    vm.wait_for_event(
        "stats",
        json!({"counters": {"9p": {"accepted": accepted, "connections": active}}}),
    )
}

/// A recognisable byte pattern for `len` bytes, different per `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn attached(port: u16) -> Client<Tcp> {
    let mut c = connect(port, UP);
    c.attach(0, 0, "").expect("attach");
    c
}

/// Reads `len` bytes from `fid` in requests of at most `chunk` bytes.
fn read_all(c: &mut Client<Tcp>, fid: u32, len: usize, chunk: u32) -> Vec<u8> {
    let mut data = Vec::new();
    while data.len() < len {
        let got = c.read(fid, data.len() as u64, chunk).expect("read");
        assert!(!got.is_empty(), "short file: {} of {len} bytes", data.len());
        data.extend_from_slice(&got);
    }
    data
}

/// The file lifecycle over TCP on an NVMe disk.
#[test]
fn file_lifecycle_over_tcp() {
    file_lifecycle(15811, Backing::Nvme);
}

/// The same on a virtio-blk disk, served from one CPU.
#[test]
fn file_lifecycle_on_virtio_blk() {
    file_lifecycle(15815, Backing::VirtioBlk);
}

/// The file lifecycle over TCP: attach, create, write (1 MiB messages and small ones),
/// fsync, read back, readdir, unlink, seen from a second connection too; the counters
/// service shows the fsync and what it cost the device.
fn file_lifecycle(port: u16, backing: Backing) {
    let mut app = appliance(port, backing);
    let before = stats::json(app.stats_port);
    let mut a = attached(port);
    a.walk(0, 1, "").unwrap();
    a.mkdir(0, "dir", 0o755).unwrap();
    a.walk(0, 2, "dir").unwrap();
    a.lcreate(2, "big", open_flags::RDWR, 0o644).unwrap();
    // Three full-size messages and a tail: 3 MiB + 100 bytes.
    let data = pattern(3 * MIB + 100, 7);
    let max = MIB - 24;
    let mut off = 0;
    while off < data.len() {
        let end = (off + max).min(data.len());
        let n = a.write(2, off as u64, &data[off..end]).unwrap() as usize;
        assert!(n > 0);
        off += n;
    }
    a.fsync(2, false).unwrap();
    let after = stats::json(app.stats_port);
    let delta = |p: &str| stats::counter(&after, p) - stats::counter(&before, p);
    assert_eq!(delta("/9p/fsyncs"), 1, "{after}");
    assert!(delta("/9p/writes") >= 4, "{after}");
    // The data reached the device and was made durable: at least one flush or FUA write.
    assert!(
        delta("/devices/0/counters/bytes_written") >= data.len() as u64,
        "{after}"
    );
    assert!(
        delta("/devices/0/counters/flushes") + delta("/devices/0/counters/fua_writes") >= 1,
        "{after}"
    );
    assert!(
        stats::request(app.stats_port, "stat").starts_with(if backing == Backing::Nvme {
            "nvme@"
        } else {
            "virtio@"
        })
    );
    assert_eq!(a.getattr(2).unwrap().size, data.len() as u64);
    assert!(
        read_all(&mut a, 2, data.len(), (MIB - 11) as u32) == data,
        "read back"
    );
    // Small reads at odd offsets.
    assert_eq!(a.read(2, 12345, 10).unwrap(), &data[12345..12355]);
    for i in 0..5 {
        a.walk(0, 10, "dir").unwrap();
        a.lcreate(10, &format!("small{i}"), open_flags::WRONLY, 0o600)
            .unwrap();
        a.write(10, 0, format!("hello {i}").as_bytes()).unwrap();
        a.clunk(10).unwrap();
    }

    // A second connection sees it all.
    let mut b = attached(port);
    b.walk(0, 1, "dir").unwrap();
    b.lopen(1, open_flags::RDONLY).unwrap();
    let mut names: Vec<String> = b
        .readdir_all(1, 4096)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [".", "..", "big", "small0", "small1", "small2", "small3", "small4"]
    );
    b.walk(0, 3, "dir/small3").unwrap();
    b.lopen(3, open_flags::RDONLY).unwrap();
    assert_eq!(b.read(3, 0, 100).unwrap(), b"hello 3");
    b.walk(0, 4, "dir").unwrap();
    b.unlinkat(4, "small3", 0).unwrap();
    // A walk failing after its first name is a short walk.
    assert_eq!(b.walk(0, 5, "dir/small3").unwrap().len(), 1);
    assert_eq!(b.walk(4, 5, "small3"), Err(Errno::ENOENT));
    // The open fid still reads the unlinked file.
    assert_eq!(b.read(3, 0, 100).unwrap(), b"hello 3");
    drop(a);
    drop(b);
    for conn in [1, 2] {
        app.vm.wait_for_event(
            "conn_closed",
            json!({"conn": conn, "how": "closed_by_peer"}),
        );
    }
    app.finish();
}

/// 64 clients connected at once, each with its own files, all served; then all close.
#[test]
fn sixty_four_concurrent_connections() {
    let port = 15812;
    let mut app = appliance(port, Backing::Nvme);
    let mut clients: Vec<Client<Tcp>> = (0..64).map(|_| attached(port)).collect();
    // Interleave the clients' requests so every connection is open and busy together.
    for (i, c) in clients.iter_mut().enumerate() {
        c.walk(0, 1, "").unwrap();
        c.lcreate(1, &format!("f{i}"), open_flags::RDWR, 0o644)
            .unwrap();
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let data = pattern(20_000 + i, i as u8);
        assert_eq!(c.write(1, 0, &data).unwrap() as usize, data.len());
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let data = pattern(20_000 + i, i as u8);
        assert!(c.read(1, 0, 65536).unwrap() == data, "client {i} read back");
    }
    // Everyone sees all 64 files.
    clients[63].walk(0, 2, "").unwrap();
    clients[63].lopen(2, open_flags::RDONLY).unwrap();
    assert_eq!(clients[63].readdir_all(2, 8192).unwrap().len(), 64 + 2);
    // Every connection fsyncs its file at once: one group of concurrent fsyncs.
    for c in clients.iter_mut() {
        c.fsync(1, false).unwrap();
    }
    wait_for_connections(&mut app.vm, 64, 64);
    // They were spread over every CPU (CPU 0, which also runs the network stack, gets
    // fewer), each of which served requests.
    let doc = stats::json(app.stats_port);
    let cpus = doc["cpus"].as_array().expect("cpus");
    assert_eq!(cpus.len(), serving_cpus() as usize, "{doc}");
    for cpu in cpus {
        let serving = &cpu["serving"];
        let (open, rx) = (
            serving["connections"].as_u64(),
            serving["rx_bytes"].as_u64(),
        );
        let fair = 64 / (2 * cpus.len() as u64);
        assert!(
            open.is_some_and(|n| n >= fair) && rx.is_some_and(|b| b >= fair * 20_000),
            "CPU {} serves {open:?} connections, received {rx:?} bytes: {doc}",
            cpu["cpu"]
        );
    }
    drop(clients);
    wait_for_connections(&mut app.vm, 64, 0);
    // And the service takes new connections afterwards.
    let mut c = attached(port);
    c.walk(0, 1, "f17").unwrap();
    assert_eq!(c.getattr(1).unwrap().size, 20_017);
    drop(c);
    app.finish();
}

/// A frame whose size field exceeds msize closes that connection only; a well-framed
/// request that does not decode gets an error reply and the connection continues. (On
/// the in-memory filesystem: this keeps the development mode tested.)
#[test]
fn malformed_frame_closes_only_its_connection() {
    let port = 15813;
    let Appliance { mut vm, .. } = appliance(port, Backing::Memory);
    let mut good = attached(port);
    good.walk(0, 1, "").unwrap();
    good.lcreate(1, "keep", open_flags::RDWR, 0o644).unwrap();
    good.write(1, 0, b"still here").unwrap();

    // Undecodable but well framed: Twalk (110) with a lying name count.
    let mut weird = attached(port);
    let frame = [11u8, 0, 0, 0, 110, 7, 0, 0, 0, 0, 0];
    let mut frame = frame.to_vec();
    frame.extend_from_slice(&[1, 0, 0, 0, 9, 0]);
    frame[0] = frame.len() as u8;
    weird.io.0.write_all(&frame).unwrap();
    let reply = read_frame(&mut weird.io.0).unwrap();
    assert_eq!(reply[4], 7, "Rlerror expected, got type {}", reply[4]);
    assert_eq!(weird.walk(0, 1, "keep").unwrap().len(), 1);

    // Oversized: the server closes the connection.
    let mut bad = connect(port, UP);
    bad.io
        .0
        .write_all(&[0xff, 0xff, 0xff, 0x7f, 118, 1, 0])
        .unwrap();
    let mut rest = Vec::new();
    match bad.io.0.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "got bytes after an oversized frame"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let closed = vm.wait_for_event("conn_closed", json!({"how": "protocol_violation"}));

    // The others carry on.
    assert_eq!(good.read(1, 0, 100).unwrap(), b"still here");
    assert_eq!(weird.walk(0, 2, "keep").unwrap().len(), 1);
    let mut fresh = attached(port);
    fresh.walk(0, 1, "keep").unwrap();
    drop((good, weird, fresh));
    assert_eq!(
        (closed["conn"].as_u64(), closed["reason"].as_str()),
        (Some(3), Some("bad_frame_size")),
        "{closed}"
    );
    let boot = vm.stop();
    boot.expect_no_line("!!!");
}

/// Clients that vanish mid-request — half a 1 MiB `Twrite` then FIN, or then RST, or
/// with an open file and a request in flight — leave the server healthy: their
/// connections are torn down and others work.
#[test]
fn dropped_connections_leave_the_server_healthy() {
    let port = 15814;
    let mut app = appliance(port, Backing::Nvme);
    let vm = &mut app.vm;
    let mut setup = attached(port);
    setup.walk(0, 1, "").unwrap();
    setup.lcreate(1, "target", open_flags::RDWR, 0o644).unwrap();
    setup.clunk(1).unwrap();

    let half_write = |rst: bool| {
        let mut c = attached(port);
        c.walk(0, 1, "target").unwrap();
        c.lopen(1, open_flags::RDWR).unwrap();
        let data = pattern(MIB - 100, 3);
        let mut frame = Vec::new();
        Tmsg::Write {
            fid: 1,
            offset: 0,
            data: ninep::wire::Data(&data),
        }
        .encode(99, &mut frame)
        .unwrap();
        let s: &mut TcpStream = &mut c.io.0;
        if rst {
            // Closing a socket with unread data makes the host reset the connection
            // (what QEMU's forward then passes on): leave a reply unread.
            let mut getattr = Vec::new();
            Tmsg::Getattr {
                fid: 1,
                request_mask: 0x7ff,
            }
            .encode(98, &mut getattr)
            .unwrap();
            s.write_all(&getattr).unwrap();
            s.peek(&mut [0u8; 1]).unwrap();
        }
        s.write_all(&frame[..frame.len() / 2]).unwrap();
        drop(c);
    };
    half_write(false);
    half_write(true);

    // A complete request in flight when the client goes.
    {
        let mut c = stream(port);
        let mut cl = Client::new(Tcp(c.try_clone().unwrap()));
        cl.version(1 << 20, b"9P2000.L").unwrap();
        cl.attach(0, 0, "").unwrap();
        cl.walk(0, 1, "target").unwrap();
        cl.lopen(1, open_flags::RDONLY).unwrap();
        let mut frame = Vec::new();
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: (MIB - 11) as u32,
        }
        .encode(5, &mut frame)
        .unwrap();
        c.write_all(&frame).unwrap();
        c.shutdown(Shutdown::Both).unwrap();
    }
    wait_for_connections(vm, 4, 1);

    // The server still works, and nothing of the half writes landed.
    let mut c = attached(port);
    c.walk(0, 1, "target").unwrap();
    assert_eq!(c.getattr(1).unwrap().size, 0);
    c.lopen(1, open_flags::RDWR).unwrap();
    assert_eq!(c.write(1, 0, b"ok").unwrap(), 2);
    drop((c, setup));
    wait_for_connections(vm, 5, 0);
    app.finish();
}
