//! Network benchmark of the appliance's 9P service (`make bench-net`): boots
//! build/appliance.elf in QEMU (TCG unless NINEFOLD_ACCEL says otherwise) serving the
//! in-memory filesystem, and measures from the host over the forwarded TCP port:
//! sequential 1 MiB-message writes and reads (msize 1 MiB; each message carries
//! msize − 24 bytes, as Linux sends), and the round-trip latency of small requests.
//! Prints a Markdown table and the appliance's counters (9P requests, the NIC's frames)
//! from its last `stats` event.
//!
//! Usage: ninep-bench [PORT] [MIB] [memory|disk]   (defaults 15870, 64, memory): `disk`
//! serves a fresh image made by `ninefold mkfs` on an NVMe disk instead, and adds a
//! `Twrite 4 KiB + Tfsync` latency row.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use ninefold_tests::ninep::connect;
use ninefold_tests::{FsImage, Qemu};
use ninep::wire::open_flags;
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn latency(name: &str, n: usize, mut op: impl FnMut(usize)) {
    let mut t = Vec::with_capacity(n);
    for i in 0..n {
        let s = Instant::now();
        op(i);
        t.push(s.elapsed());
    }
    t.sort();
    let mean = t.iter().sum::<Duration>() / n as u32;
    println!(
        "| {name} | {n} | {:.0} | {:.0} | {:.0} |",
        mean.as_secs_f64() * 1e6,
        percentile(&t, 0.5).as_secs_f64() * 1e6,
        percentile(&t, 0.99).as_secs_f64() * 1e6
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().map_or(15870, |a| a.parse().expect("PORT"));
    let mib: usize = args.next().map_or(64, |a| a.parse().expect("MIB"));
    let disk = args.next().is_some_and(|a| a == "disk");
    let image = disk.then(|| FsImage::formatted("2G"));
    let q = Qemu::appliance()
        .memory("512M")
        .virtio_net_forward(port, 564)
        .timeout(Duration::from_secs(3600));
    let mut vm = match &image {
        Some(i) => q.nvme_image("bench", i),
        None => q.append("fs=memory"),
    }
    .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, Duration::from_secs(60));
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "bench", open_flags::RDWR, 0o644).unwrap();

    let chunk = (1 << 20) - 24;
    let data: Vec<u8> = (0..chunk).map(|i| (i * 7) as u8).collect();
    let total = mib * chunk;
    let t = Instant::now();
    let mut off = 0;
    while off < total {
        off += c.write(1, off as u64, &data).unwrap() as usize;
    }
    c.fsync(1, false).unwrap();
    let write = t.elapsed();
    let t = Instant::now();
    let mut off = 0;
    while off < total {
        let got = c.read(1, off as u64, chunk as u32).unwrap();
        assert!(!got.is_empty());
        off += got.len();
    }
    let read = t.elapsed();
    let mibs = |d: Duration| total as f64 / (1 << 20) as f64 / d.as_secs_f64();
    println!("| sequential, {mib} messages of {chunk} B | MiB/s |");
    println!("|---|---|");
    println!("| write (then fsync) | {:.1} |", mibs(write));
    println!("| read | {:.1} |", mibs(read));
    println!();

    println!("| request | count | mean µs | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    latency("Tgetattr", 2000, |_| {
        c.getattr(1).unwrap();
    });
    latency("Tread 4 KiB", 2000, |i| {
        c.read(1, (i * 4096 % total) as u64, 4096).unwrap();
    });
    latency("Twrite 4 KiB", 2000, |i| {
        c.write(1, (i * 4096) as u64, &data[..4096]).unwrap();
    });
    latency("Twalk + Tclunk", 1000, |_| {
        c.walk(0, 2, "bench").unwrap();
        c.clunk(2).unwrap();
    });
    if disk {
        latency("Twrite 4 KiB + Tfsync", 300, |i| {
            c.write(1, (i * 4096) as u64, &data[..4096]).unwrap();
            c.fsync(1, false).unwrap();
        });
    }
    drop(c);
    // The appliance emits its counters every 10 s when something happened: the first
    // `stats` event after the connection closed has all the work.
    let closed = vm.wait_for_event("conn_closed", json!({"how": "closed_by_peer"}));
    let stats = vm.wait_for_event_following(&closed, "stats", ninefold_tests::any());
    vm.stop();
    println!();
    let ninep = &stats["counters"]["9p"];
    println!(
        "    9p: {} connections, {} requests, {} error replies, rx {} B, tx {} B",
        ninep["accepted"],
        ninep["requests"],
        ninep["error_replies"],
        ninep["rx_bytes"],
        ninep["tx_bytes"]
    );
    println!("    nic: {}", stats["counters"]["nic"]);
}
