//! The console is for people (issue 37): an idle appliance writes nothing on it, and one
//! that serves writes at most one short status line a minute. The structured events go
//! to the event channel (the second serial port), where the harness reads them; none
//! reaches the console.
//!
//! These are tests of the log itself, so they read the console's lines. The two run
//! side by side (each waits a minute of host time), so the file costs about one boot and
//! a minute.
//!
//! Host ports: 9P on 15891 and 15892, the counters service on 15893 and 15894.

use std::time::{Duration, Instant};

use ninefold_tests::ninep::connect;
use ninefold_tests::{FsImage, Qemu};
use ninep::wire::open_flags;
use serde_json::json;

/// How long the appliance may take to boot and get its DHCP lease under TCG.
const UP: Duration = Duration::from_secs(60);
/// How long the console must stay silent, and how often a status line may come.
const MINUTE: Duration = Duration::from_secs(60);

/// The seconds of a console line's timestamp (`[   61.234567] INFO  ...`).
fn seconds(line: &str) -> Option<f64> {
    let stamp = line.strip_prefix('[')?.split(']').next()?;
    stamp.trim().parse().ok()
}

/// An idle appliance, as `make run` boots it (an NVMe disk formatted by `ninefold
/// mkfs`, a NIC, the counters service), writes not one byte on its console for a
/// minute (of host time) after it is ready; events still reach the event channel.
#[test]
fn an_idle_appliance_keeps_its_console_silent() {
    let image = FsImage::formatted("256M");
    let mut vm = Qemu::serving()
        .memory("256M")
        .nvme_image("idle", &image)
        .virtio_net_forwards(&[(15891, 564), (15893, 5641)])
        .timeout(UP + MINUTE + Duration::from_secs(60))
        .spawn();
    vm.wait_for_event("ready", json!({"serving": true}));
    // The console's `ready` line is written just before the event; QEMU may pass the
    // two ports' bytes on in either order.
    let seen = Instant::now();
    while !vm.serial().contains("ready: serving") && seen.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (before, text_before) = (vm.console_bytes(), vm.serial());
    let quiet_since = Instant::now();
    std::thread::sleep(MINUTE);
    let after = vm.console_bytes();
    let quiet_for = quiet_since.elapsed();
    let console = vm.serial();
    let events = vm.event_log();
    let boot = vm.stop();
    if after != before {
        boot.fail(&format!(
            "the idle console wrote {} bytes in {quiet_for:?}: {:?}",
            after - before,
            &console[text_before.len().min(console.len())..]
        ));
    }
    eprintln!("console: {before} bytes up to `ready`, then 0 bytes in {quiet_for:?} of idling");
    assert!(
        text_before
            .trim_end()
            .ends_with("events on the second serial port (COM2)"),
        "the `ready` line is the console's last: {text_before}"
    );
    if let Some(l) = console.lines().find(|l| l.contains("EVENT ")) {
        boot.fail(&format!("an event on the console: {l:?}"));
    }
    if console.contains("stats: {") {
        boot.fail("the counters document on the console at log=info");
    }
    // The boot's summary is there for people, and the events for programs.
    boot.expect_line(
        "ready: serving 9P on port 564; counters on port 5641; events on the second serial port",
    );
    assert!(events.lines().all(|l| l.starts_with("EVENT {")), "{events}");
    for e in boot.all_events() {
        assert!(e["time_ms"].is_u64(), "an event without its time: {e}");
    }
    boot.expect_no_line("!!!");
}

/// While clients work, the console gets a status line at most once a minute (one line,
/// short, with the rates), and nothing else once the appliance is ready.
#[test]
fn a_serving_appliance_writes_one_status_line_a_minute() {
    let mut vm = Qemu::appliance()
        .memory("256M")
        .append("fs=memory")
        .virtio_net_forwards(&[(15892, 564), (15894, 5641)])
        .timeout(UP + 2 * MINUTE + Duration::from_secs(60))
        .spawn();
    vm.wait_for_event("ready", json!({"serving": true}));
    let mut c = connect(15892, UP);
    c.attach(0, 0, "").expect("attach");
    c.walk(0, 1, "").expect("walk");
    c.lcreate(1, "work", open_flags::RDWR, 0o644)
        .expect("create");
    // Work for a little over a minute: the monitor's first minute ends in it.
    let data = vec![7u8; 4096];
    let began = Instant::now();
    let mut i = 0u64;
    while began.elapsed() < MINUTE + Duration::from_secs(15) {
        c.write(1, i * 4096 % (1 << 20), &data).expect("write");
        c.fsync(1, false).expect("fsync");
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let boot = vm.stop();
    let after_ready: Vec<&str> = boot
        .serial
        .lines()
        .skip_while(|l| !l.contains("ready: serving"))
        .skip(1)
        .collect();
    let status: Vec<&str> = after_ready
        .iter()
        .copied()
        .filter(|l| l.contains("serving: "))
        .collect();
    if status.is_empty() {
        boot.fail(&format!("no status line after {i} writes and fsyncs"));
    }
    if let Some(l) = after_ready.iter().find(|l| !l.contains("serving: ")) {
        boot.fail(&format!(
            "a line other than the status line while serving: {l:?}"
        ));
    }
    for pair in status.windows(2) {
        let (a, b) = (seconds(pair[0]), seconds(pair[1]));
        assert!(
            matches!((a, b), (Some(a), Some(b)) if b - a >= 59.0),
            "status lines less than a minute apart: {pair:?}"
        );
    }
    for l in &status {
        eprintln!("status line: {l}");
        assert!(l.len() < 160 + 22, "a long status line: {l:?}");
        assert!(
            l.contains("ops/s") && l.contains("MiB/s") && l.contains("fsyncs/s (p99"),
            "{l:?}"
        );
    }
    boot.expect_no_line("!!!");
}
