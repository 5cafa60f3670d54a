//! The NIC's offloads measured (`make bench-nic`, docs/benchmarks.md, "Network"): the
//! appliance on a tap device with the virtio-net header, which offers checksum offload
//! and TSO, read from the host side by the `ninep` crate's client, with its offloads on
//! (the default) and off (`offload=off`), alternately.
//!
//! Each boot (TCG, 1 vCPU, 512 MiB, `fs=memory`) gets a file of MIB MiB written in 1 MiB
//! messages (and fsynced; timed, with the appliance's CPU time), then one 1 MiB `Tread`
//! alone (the frames its reply took),
//! then the file read PASSES times in 1 MiB `Tread`s, timed. Around the timed reads it
//! takes the appliance's counters (its CPU's idle time, the NIC's frames) and QEMU's CPU
//! time (`/proc/PID/stat`): the appliance's busy share and CPU milliseconds per MiB read,
//! QEMU's (the vCPU and the device emulation, the tap's writes) per MiB, frames sent per
//! MiB. Prints one row per boot and the medians per mode, as Markdown.
//!
//! Needs a network namespace of its own, as root: `make bench-nic` runs it under
//! `unshare -n` (it makes the tap `nf-bench0` there, the host side 10.99.1.1/24, the
//! appliance 10.99.1.2). Usage: `ninep-tap-bench [MIB] [PASSES] [ROUNDS]` (defaults 64,
//! 2, 3).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use ninefold_tests::ninep::{connect_to, Tcp};
use ninefold_tests::{stats, Qemu};
use ninep::testing::Client;
use ninep::wire::open_flags;
use serde_json::{json, Value};

const TAP: &str = "nf-bench0";
const APPLIANCE: [u8; 4] = [10, 99, 1, 2];
const MIB: f64 = (1 << 20) as f64;
/// Bytes per message: msize 1 MiB less the 9P header, as Linux sends.
const CHUNK: usize = (1 << 20) - 24;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip(8)");
    if !out.status.success() {
        eprintln!(
            "ninep-tap-bench: ip {}: {} (run as root in a network namespace of its own: make bench-nic)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::process::exit(2);
    }
}

/// QEMU's CPU time so far (user + system), from `/proc/PID/stat` (USER_HZ ticks: 100/s).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("QEMU's stat");
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn counter(doc: &Value, pointer: &str) -> f64 {
    stats::counter(doc, pointer) as f64
}

/// What one boot measured.
#[derive(Clone, Debug, Default)]
struct Row {
    offload: bool,
    write_mib_s: f64,
    /// Appliance CPU milliseconds per MiB written.
    write_cpu_ms_per_mib: f64,
    read_mib_s: f64,
    /// Share of the appliance's (one) CPU busy during the timed reads.
    busy: f64,
    /// Appliance CPU milliseconds per MiB read.
    cpu_ms_per_mib: f64,
    /// QEMU CPU milliseconds per MiB read.
    qemu_ms_per_mib: f64,
    frames_per_mib: f64,
    gso_per_mib: f64,
    segments_per_gso: f64,
    notifications_per_mib: f64,
    rx_frames_per_mib: f64,
    /// Frames sent while one 1 MiB `Tread` was answered, and of them segmented.
    reply_frames: f64,
    reply_gso: f64,
}

fn boot(offload: bool, mib: usize, passes: usize) -> Row {
    let mut q = Qemu::appliance()
        .memory("512M")
        .virtio_net_tap(TAP)
        .append("ip=10.99.1.2/24 fs=memory")
        .timeout(Duration::from_secs(3600));
    if !offload {
        q = q.append("offload=off");
    }
    let mut vm = q.spawn();
    vm.wait_for_event("listening", json!({"service": "9p", "port": 564}));
    let stats_at = SocketAddr::from((APPLIANCE, 5641));
    let mut c: Client<Tcp> =
        connect_to(SocketAddr::from((APPLIANCE, 564)), Duration::from_secs(60));
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "bench", open_flags::RDWR, 0o644).unwrap();
    let data: Vec<u8> = (0..CHUNK).map(|i| (i * 7) as u8).collect();
    let total = mib * CHUNK;
    let before = stats::json_at(stats_at);
    let t = Instant::now();
    let mut off = 0;
    while off < total {
        off += c.write(1, off as u64, &data).unwrap() as usize;
    }
    c.fsync(1, false).unwrap();
    let write = t.elapsed();
    let after = stats::json_at(stats_at);
    let d = |p: &str| counter(&after, p) - counter(&before, p);
    let write_cpu_ms_per_mib = (d("/uptime_ms") - d("/idle_ms")) / (total as f64 / MIB);

    // One 1 MiB reply on its own.
    let before = stats::json_at(stats_at);
    assert_eq!(c.read(1, 0, CHUNK as u32).unwrap().len(), CHUNK);
    let after = stats::json_at(stats_at);
    let reply_frames = counter(&after, "/nic/tx_frames") - counter(&before, "/nic/tx_frames");
    let reply_gso = counter(&after, "/nic/tx_gso_frames") - counter(&before, "/nic/tx_gso_frames");

    let before = stats::json_at(stats_at);
    let qemu_before = cpu_time(vm.pid());
    let t = Instant::now();
    for _ in 0..passes {
        let mut off = 0;
        while off < total {
            let got = c.read(1, off as u64, CHUNK as u32).unwrap();
            assert!(!got.is_empty());
            off += got.len();
        }
    }
    let read = t.elapsed();
    let qemu = cpu_time(vm.pid()) - qemu_before;
    let after = stats::json_at(stats_at);
    drop(c);
    let d = |p: &str| counter(&after, p) - counter(&before, p);
    let read_mib = (passes * total) as f64 / MIB;
    let busy = (1.0 - d("/idle_ms") / d("/uptime_ms")).clamp(0.0, 1.0);
    let row = Row {
        offload,
        write_mib_s: total as f64 / MIB / write.as_secs_f64(),
        write_cpu_ms_per_mib,
        read_mib_s: read_mib / read.as_secs_f64(),
        busy,
        cpu_ms_per_mib: busy * d("/uptime_ms") / read_mib,
        qemu_ms_per_mib: qemu.as_secs_f64() * 1e3 / read_mib,
        frames_per_mib: d("/nic/tx_frames") / read_mib,
        gso_per_mib: d("/nic/tx_gso_frames") / read_mib,
        segments_per_gso: d("/nic/tx_gso_segments") / d("/nic/tx_gso_frames").max(1.0),
        notifications_per_mib: d("/nic/notifications") / read_mib,
        rx_frames_per_mib: d("/nic/rx_frames") / read_mib,
        reply_frames,
        reply_gso,
    };
    let boot = vm.stop();
    assert!(boot.line("!!!").is_none(), "the appliance crashed");
    row
}

fn print_row(label: &str, r: &Row) {
    println!(
        "| {label} | {} | {:.1} | {:.1} | {:.1} | {:.0}% | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} ({:.0} GSO) |",
        if r.offload { "on" } else { "off" },
        r.read_mib_s,
        r.write_mib_s,
        r.write_cpu_ms_per_mib,
        r.busy * 100.0,
        r.cpu_ms_per_mib,
        r.qemu_ms_per_mib,
        r.frames_per_mib,
        r.gso_per_mib,
        r.segments_per_gso,
        r.notifications_per_mib,
        r.rx_frames_per_mib,
        r.reply_frames,
        r.reply_gso,
    );
}

fn median(rows: &[&Row], f: impl Fn(&Row) -> f64) -> f64 {
    let mut v: Vec<f64> = rows.iter().map(|r| f(r)).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(64, |a| a.parse().expect("MIB"));
    let passes: usize = args.next().map_or(2, |a| a.parse().expect("PASSES"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    ip(&["link", "set", "lo", "up"]);
    ip(&["tuntap", "add", "dev", TAP, "mode", "tap", "vnet_hdr"]);
    ip(&["addr", "add", "10.99.1.1/24", "dev", TAP]);
    ip(&["link", "set", TAP, "up"]);

    println!(
        "| boot | offload | read MiB/s | write MiB/s | appliance CPU ms/MiB written | appliance CPU busy (reads) | appliance CPU ms/MiB | QEMU CPU ms/MiB | frames sent/MiB | GSO frames/MiB | segments/GSO frame | notifications/MiB | frames received/MiB | one 1 MiB reply: frames |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for round in 0..rounds {
        for offload in [true, false] {
            let r = boot(offload, mib, passes);
            print_row(&format!("{}", round + 1), &r);
            rows.push(r);
        }
    }
    for offload in [true, false] {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.offload == offload).collect();
        let m = Row {
            offload,
            write_mib_s: median(&mine, |r| r.write_mib_s),
            write_cpu_ms_per_mib: median(&mine, |r| r.write_cpu_ms_per_mib),
            read_mib_s: median(&mine, |r| r.read_mib_s),
            busy: median(&mine, |r| r.busy),
            cpu_ms_per_mib: median(&mine, |r| r.cpu_ms_per_mib),
            qemu_ms_per_mib: median(&mine, |r| r.qemu_ms_per_mib),
            frames_per_mib: median(&mine, |r| r.frames_per_mib),
            gso_per_mib: median(&mine, |r| r.gso_per_mib),
            segments_per_gso: median(&mine, |r| r.segments_per_gso),
            notifications_per_mib: median(&mine, |r| r.notifications_per_mib),
            rx_frames_per_mib: median(&mine, |r| r.rx_frames_per_mib),
            reply_frames: median(&mine, |r| r.reply_frames),
            reply_gso: median(&mine, |r| r.reply_gso),
        };
        print_row("median", &m);
    }
    println!(
        "\n{mib} MiB file, read {passes} times per boot, {rounds} boots per mode; TCG, 1 vCPU, 512 MiB, fs=memory, tap with vnet_hdr."
    );
}
