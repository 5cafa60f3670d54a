//! The block drivers in QEMU: `selftest=block` puts every NVMe and virtio-blk device
//! through the kernel's block checks (kernel/src/selftest/block.rs), with interrupt and
//! with polled completions, and these tests read the verdicts (`selftest` events).

use kernel::exit::ExitCode;
use ninefold_tests::{Boot, Qemu};
use serde_json::{json, Value};

const CHECKS: [&str; 12] = [
    "open",
    "queues",
    "spread",
    "fua",
    "large",
    "unaligned",
    "errors",
    "discard",
    "drop",
    "forget",
    "backpressure",
    "timeout",
];

/// The verdict (`selftest` event) of `check` for the `kind` device in `mode`.
fn verdict(boot: &Boot, kind: &str, mode: &str, check: &str) -> Value {
    boot.expect_event(
        "selftest",
        json!({"kind": kind, "mode": mode, "check": check}),
    )
}

/// Checks that do not apply to a kind of device (and say so).
fn skipped(kind: &str, check: &str) -> bool {
    // virtio-blk has one queue.
    kind == "virtio" && check == "queues"
}

fn expect_all_ok(boot: &Boot, kind: &str) {
    for mode in ["irq", "poll"] {
        for check in CHECKS {
            let v = verdict(boot, kind, mode, check);
            let want = if skipped(kind, check) {
                "skipped"
            } else {
                "ok"
            };
            if v["result"] != want {
                boot.fail(&format!("{kind} {mode} {check}: {v}"));
            }
        }
        // The spread check reports how many requests were in the device at once.
        let spread = verdict(boot, kind, mode, "spread");
        let peak = spread["facts"]["in_flight"]
            .as_u64()
            .unwrap_or_else(|| boot.fail(&format!("no in-flight count in {spread}")));
        if peak < 32 {
            boot.fail(&format!("{kind} {mode}: only {peak} requests in flight"));
        }
    }
}

/// Expects the self-test run to end with these counts, and no check to have failed.
fn expect_done(boot: &Boot, passed: u32, skipped: u32) {
    boot.expect_event(
        "selftest_done",
        json!({"passed": passed, "failed": 0, "skipped": skipped}),
    );
    boot.expect_no_event("selftest", json!({"result": "failed"}));
}

/// Both drivers, both completion modes: every check passes, with at least 32 requests in
/// flight and every byte verified, and a lost completion ends in a timeout, a device
/// reset and a working device.
#[test]
fn nvme_and_virtio_blk_pass_every_block_check() {
    let boot = Qemu::appliance()
        .nvme("nf-block")
        .virtio_blk()
        .append("selftest=block")
        .run();
    boot.expect_exit(ExitCode::Success);
    expect_all_ok(&boot, "nvme");
    expect_all_ok(&boot, "virtio");
    // One I/O queue pair by default.
    boot.expect_event(
        "nvme",
        json!({"serial": "nf-block", "pairs": 1, "requested": 1}),
    );
    for mode in ["irq", "poll"] {
        let queues = verdict(&boot, "nvme", mode, "queues");
        if queues["facts"]["pairs"] != 1 {
            boot.fail(&format!("{mode}: {queues}"));
        }
    }
    // The per-CPU check is skipped everywhere with one CPU.
    expect_done(&boot, 46, 6);
}

/// A controller with a 4 MiB MDTS: the largest transfers (1023 pages, see the NVMe
/// driver's cap) need two chained PRP list pages.
#[test]
fn nvme_transfers_up_to_a_4_mib_mdts_use_chained_prp_lists() {
    let boot = Qemu::appliance()
        .memory("256M")
        .nvme_with("nf-mdts", ",mdts=10")
        .append("selftest=block")
        .run();
    boot.expect_exit(ExitCode::Success);
    expect_all_ok(&boot, "nvme");
    let large = verdict(&boot, "nvme", "irq", "large");
    if large["facts"]["transfer_kib"] != 4092 {
        boot.fail(&format!("expected 4092 KiB transfers: {large}"));
    }
    expect_done(&boot, 24, 2);
}

/// `nvme_queues=3` on a machine with 4 CPUs: the controller (QEMU's grants 64) gets three
/// I/O queue pairs, each with its own MSI-X entry; every check passes with them (the
/// timeout check's reset recreates all three), and the queues check drives I/O through
/// each pair.
#[test]
fn nvme_creates_the_io_queue_pairs_asked_for() {
    let boot = Qemu::appliance()
        .args(&["-smp", "4"])
        .nvme("nf-queues")
        .append("selftest=block nvme_queues=3")
        .run();
    boot.expect_exit(ExitCode::Success);
    let config = boot.expect_event("config", ninefold_tests::any());
    let effective = config["effective"].as_str().unwrap_or_default();
    if !effective.split(' ').any(|o| o == "nvme_queues=3") {
        boot.fail(&format!("nvme_queues=3 not in {config}"));
    }
    // Four bring-ups (irq, irq with a short timeout, poll, poll with a short timeout),
    // each with three pairs: on MSI-X entries 1-3 with interrupts, none when polling.
    let bring_ups: Vec<Value> = boot
        .events("nvme")
        .into_iter()
        .filter(|e| e["pairs"] == 3 && e["requested"] == 3)
        .collect();
    let irq = bring_ups
        .iter()
        .filter(|e| e["completions"] == "interrupt" && e["msix_entries"] == json!([1, 2, 3]));
    let polled = bring_ups
        .iter()
        .filter(|e| e["completions"] == "poll" && e["msix_entries"] == json!([]));
    if bring_ups.len() != 4 || irq.count() != 2 || polled.count() != 2 {
        boot.fail(&format!(
            "expected 2 + 2 bring-ups with 3 pairs: {bring_ups:?}"
        ));
    }
    let granted = bring_ups[0]["granted"]
        .as_u64()
        .unwrap_or_else(|| boot.fail(&format!("no granted count in {}", bring_ups[0])));
    if granted < 3 {
        boot.fail(&format!("the controller granted {granted} queue pairs"));
    }
    expect_all_ok(&boot, "nvme");
    for mode in ["irq", "poll"] {
        // A block written through each pair read back through the next.
        let queues = verdict(&boot, "nvme", mode, "queues");
        if queues["facts"]["pairs"] != 3 {
            boot.fail(&format!("{mode}: {queues}"));
        }
    }
    if verdict(&boot, "nvme", "irq", "queues")["facts"]["msix_entries"] != json!([1, 2, 3]) {
        boot.fail("the irq run's queues are not on MSI-X entries 1, 2, 3");
    }
    // With 4 CPUs the per-CPU check runs too (CPU 3 shares pair 1 with CPU 0).
    expect_done(&boot, 26, 0);
}

/// `bench=dev disk=virtio0` opens just that device (through the disk selection) and
/// reports every workload in the machine-readable form `make bench-dev` reads (a
/// `bench_result` event each). Only the form is checked here, never the figures: timing
/// stays out of pass/fail tests.
#[test]
fn the_device_benchmark_runs_on_the_selected_disk() {
    let boot = Qemu::appliance()
        .nvme("nf-bench")
        .virtio_blk()
        .append("bench=dev benchtime=1 disk=virtio0")
        .run();
    boot.expect_exit(ExitCode::Success);
    let results = boot.events("bench_result");
    let workloads = [
        "randwrite-4k-qd1",
        "randwrite-4k-qd32",
        "write-128k",
        "write-flush-4k",
    ];
    if results.len() != workloads.len() {
        boot.fail(&format!(
            "expected {} results, got {results:?}",
            workloads.len()
        ));
    }
    for (r, w) in results.iter().zip(workloads) {
        let ops = r["ops"].as_u64().unwrap_or(0);
        if r["device"] != "virtio-blk" || r["workload"] != w || ops == 0 || r.get("error").is_some()
        {
            boot.fail(&format!("bad result for {w}: {r}"));
        }
    }
    boot.expect_no_event("bench_result", json!({"device": "nvme"}));
}

/// A controller that grants fewer queue pairs than asked for (`max_ioqpairs=2`) and has
/// one MSI-X entry for I/O (`msix_qsize=2`: entry 0 is the admin queue's): the driver
/// creates the two pairs granted, both completing on entry 1, and every check passes.
#[test]
fn nvme_takes_the_queue_pairs_granted_and_shares_msix_entries() {
    let boot = Qemu::appliance()
        .nvme_with("nf-few", ",max_ioqpairs=2,msix_qsize=2")
        .append("selftest=block nvme_queues=3")
        .run();
    boot.expect_exit(ExitCode::Success);
    boot.expect_event(
        "nvme",
        json!({"pairs": 2, "requested": 3, "granted": 2, "msix_entries": [1, 1]}),
    );
    expect_all_ok(&boot, "nvme");
    let queues = verdict(&boot, "nvme", "irq", "queues");
    if queues["facts"]["pairs"] != 2 || queues["facts"]["msix_entries"] != json!([1, 1]) {
        boot.fail(&format!("irq: {queues}"));
    }
    expect_done(&boot, 24, 2);
}
