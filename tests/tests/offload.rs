//! The NIC's checksum and segmentation offloads (docs/network.md, "Offloads"), where
//! QEMU offers them — a tap device carrying the virtio-net header — and where it does
//! not (user networking).
//!
//! A tap needs a network of its own: `tap_offloads` runs this test binary again under
//! `unshare -n`, in a new network namespace (no system configuration is touched; the
//! namespace and everything in it go when the process ends), where
//! `inside_a_namespace` makes a tap with `vnet_hdr`, gives the host side 10.99.0.1/24,
//! and boots the appliance on it at 10.99.0.2 twice: with the offloads (the default)
//! and with `offload=off`. Each time a 9P client on the host side writes 4 MiB and
//! reads them back over TCP, comparing every byte, and the appliance's counters say
//! what the NIC did: with the offloads, CSUM, GUEST_CSUM and HOST_TSO4 negotiated,
//! frames the device segments (`tx_gso_frames`), checksums it completes and received
//! ones it vouched for; without, none of it. Where a namespace or a tap cannot be made
//! (not root, no /dev/net/tun, no `ip`), the test says why on stderr and passes.
//!
//! `user_networking_offers_no_offloads` checks that under QEMU's user networking,
//! which offers no offloads, nothing is offloaded and the same round trip compares.
//!
//! Host ports (user networking): 9P on 15880, the counters service on 15881.

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use ninefold_tests::ninep::{connect_to, Tcp};
use ninefold_tests::{stats, Qemu};
use ninep::testing::Client;
use ninep::wire::open_flags;
use serde_json::{json, Value};

/// Set in the environment of the test binary run inside the namespace.
const INSIDE: &str = "NINEFOLD_OFFLOAD_NAMESPACE";
/// The tap device in the namespace, and the addresses on it.
const TAP: &str = "nf-tap0";
const HOST: &str = "10.99.0.1/24";
const APPLIANCE: [u8; 4] = [10, 99, 0, 2];
/// Bytes written and read back per boot.
const DATA: usize = 4 << 20;
/// How long the appliance may take to boot and listen under TCG.
const UP: Duration = Duration::from_secs(60);

/// Says on stderr (past the test harness's capture) why the tap test did not run.
fn skipped(why: &str) {
    let _ = writeln!(std::io::stderr(), "offload: tap test skipped: {why}");
}

/// A recognisable byte pattern, different per `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

/// Writes [`DATA`] bytes to a new file in 1 MiB messages, fsyncs, reads them back in
/// 1 MiB messages and compares.
fn round_trip(c: &mut Client<Tcp>, name: &str, seed: u8) {
    c.attach(0, 0, "").expect("attach");
    c.walk(0, 1, "").expect("walk");
    c.lcreate(1, name, open_flags::RDWR, 0o644).expect("create");
    let data = pattern(DATA, seed);
    let chunk = (1 << 20) - 24;
    let mut off = 0;
    while off < data.len() {
        let end = (off + chunk).min(data.len());
        off += c.write(1, off as u64, &data[off..end]).expect("write") as usize;
    }
    c.fsync(1, false).expect("fsync");
    let mut back = Vec::with_capacity(DATA);
    while back.len() < DATA {
        let got = c.read(1, back.len() as u64, chunk as u32).expect("read");
        assert!(
            !got.is_empty(),
            "short file: {} of {DATA} bytes",
            back.len()
        );
        back.extend_from_slice(&got);
    }
    assert!(
        back == data,
        "the data read back differs from what was written"
    );
    c.clunk(1).expect("clunk");
}

/// The NIC's part of the counters document.
fn nic(counters: &Value) -> &Value {
    &counters["nic"]
}

fn count(nic: &Value, name: &str) -> u64 {
    nic[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no nic.{name} in {nic}"))
}

/// Nothing offloaded: nothing negotiated, no frame segmented or checksummed by the
/// device, every received checksum left to smoltcp.
fn expect_nothing_offloaded(nic: &Value) {
    assert_eq!(
        nic["offloads"],
        json!({"csum": false, "guest_csum": false, "tso4": false}),
        "{nic}"
    );
    for name in [
        "tx_csum_offloaded",
        "tx_gso_frames",
        "tx_gso_segments",
        "rx_csum_validated",
        "rx_csum_verified",
        "rx_csum_completed",
        "rx_csum_errors",
        "tx_dropped",
    ] {
        assert_eq!(count(nic, name), 0, "nic.{name}: {nic}");
    }
    assert!(count(nic, "tx_frames") > (DATA / 1460) as u64, "{nic}");
}

#[test]
fn tap_offloads() {
    match Command::new("unshare").args(["-n", "true"]).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return skipped(&format!(
                "no network namespace (unshare -n: {})",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) => return skipped(&format!("no unshare(1): {e}")),
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new("unshare")
        .arg("-n")
        .arg("--")
        .arg(exe)
        .args([
            "--exact",
            "inside_a_namespace",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INSIDE, "1")
        .output()
        .expect("running the test in a namespace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the test in its own network namespace failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Its findings (or why it skipped), past the harness's capture.
    for line in stdout.lines().chain(stderr.lines()) {
        if let Some(at) = line.find("offload: ") {
            let _ = writeln!(std::io::stderr(), "{}", &line[at..]);
        }
    }
}

/// Runs `ip ARGS`, or says why it failed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("no ip(8): {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Boots the appliance on the tap (offloads on or `offload=off`), runs the round trip
/// from the host side, and returns the NIC's counters.
fn over_tap(offload: bool) -> Value {
    let mut q = Qemu::appliance()
        .memory("256M")
        .virtio_net_tap(TAP)
        .append("ip=10.99.0.2/24 fs=memory")
        .timeout(Duration::from_secs(300));
    if !offload {
        q = q.append("offload=off");
    }
    let mut vm = q.spawn();
    vm.wait_for_event(
        "listening",
        json!({"service": "9p", "address": "10.99.0.2", "port": 564}),
    );
    let mut c = connect_to(SocketAddr::from((APPLIANCE, 564)), UP);
    round_trip(&mut c, if offload { "on" } else { "off" }, 7);
    drop(c);
    let counters = stats::json_at(SocketAddr::from((APPLIANCE, 5641)));
    let boot = vm.stop();
    boot.expect_no_line("!!!");
    nic(&counters).clone()
}

#[test]
#[ignore = "changes the devices of its network namespace: tap_offloads runs it in one of its own"]
fn inside_a_namespace() {
    if std::env::var_os(INSIDE).is_none() {
        return skipped("inside_a_namespace runs only in the namespace tap_offloads makes");
    }
    if let Err(why) = ip(&["link", "set", "lo", "up"]) {
        return skipped(&why);
    }
    if let Err(why) = ip(&["tuntap", "add", "dev", TAP, "mode", "tap", "vnet_hdr"]) {
        return skipped(&format!("no tap device ({why})"));
    }
    ip(&["addr", "add", HOST, "dev", TAP]).expect("the host's address");
    ip(&["link", "set", TAP, "up"]).expect("the tap up");

    let on = over_tap(true);
    assert_eq!(
        on["offloads"],
        json!({"csum": true, "guest_csum": true, "tso4": true}),
        "a tap with vnet_hdr offers every offload: {on}"
    );
    let frames = count(&on, "tx_frames");
    let gso = count(&on, "tx_gso_frames");
    let segments = count(&on, "tx_gso_segments");
    assert!(
        gso > 0 && segments >= 2 * gso,
        "no segmentation offload: {on}"
    );
    // The 4 MiB read back (and little else) went out in frames of many segments.
    assert!(
        segments > (DATA / 1460) as u64 && frames < (DATA / 1460 / 4) as u64,
        "the read replies were not segmented by the device: {on}"
    );
    assert!(count(&on, "tx_csum_offloaded") >= gso, "{on}");
    // The host's segments (the writes) come with partial checksums or validated ones.
    assert!(
        count(&on, "rx_csum_validated") > (DATA / 1460) as u64,
        "{on}"
    );
    for name in ["rx_csum_errors", "tx_dropped", "rx_errors"] {
        assert_eq!(count(&on, name), 0, "nic.{name}: {on}");
    }

    let off = over_tap(false);
    expect_nothing_offloaded(&off);
    println!(
        "offload: 4 MiB written and read back over a tap: {frames} frames sent with offloads \
         ({gso} segmented into {segments}), {} without",
        count(&off, "tx_frames")
    );
    println!("offload: the NIC's counters with offloads: {on}");
    println!("offload: and without: {off}");
}

#[test]
fn user_networking_offers_no_offloads() {
    let (port, stats_port) = (15880, 15881);
    let mut vm = Qemu::appliance()
        .memory("256M")
        .virtio_net_forwards(&[(port, 564), (stats_port, 5641)])
        .append("fs=memory")
        .timeout(Duration::from_secs(300))
        .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect_to(SocketAddr::from(([127, 0, 0, 1], port)), UP);
    round_trip(&mut c, "slirp", 3);
    drop(c);
    let counters = stats::json(stats_port);
    let boot = vm.stop();
    boot.expect_no_line("!!!");
    expect_nothing_offloaded(nic(&counters));
}
