//! The block drivers in QEMU: `selftest=block` puts every NVMe and virtio-blk device
//! through the kernel's block checks (kernel/src/selftest/block.rs), with interrupt and
//! with polled completions, and these tests read the verdicts.

use kernel::exit::ExitCode;
use ninefold_tests::{Boot, Qemu};

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

/// The verdict line of `check` for the `kind` device in `mode`.
fn verdict<'a>(boot: &'a Boot, kind: &str, mode: &str, check: &str) -> &'a str {
    let prefix = format!("selftest: block {kind} ");
    let suffix = format!(" {mode}: {check}: ");
    boot.serial
        .lines()
        .find(|l| l.contains(&prefix) && l.contains(&suffix))
        .unwrap_or_else(|| boot.fail(&format!("no verdict for {kind} {mode} {check}")))
}

/// Checks that do not apply to a kind of device (and say so).
fn skipped(kind: &str, check: &str) -> bool {
    // virtio-blk has one queue.
    kind == "virtio" && check == "queues"
}

fn expect_all_ok(boot: &Boot, kind: &str) {
    for mode in ["irq", "poll"] {
        for check in CHECKS {
            let line = verdict(boot, kind, mode, check);
            let want = if skipped(kind, check) {
                "skipped ("
            } else {
                "ok ("
            };
            if !line.contains(&format!("{check}: {want}")) {
                boot.fail(&format!("{kind} {mode} {check}: {line}"));
            }
        }
        // The spread check reports how many requests were in the device at once.
        let spread = verdict(boot, kind, mode, "spread");
        let peak: usize = spread
            .split("up to ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| boot.fail(&format!("no in-flight count in {spread:?}")));
        if peak < 32 {
            boot.fail(&format!("{kind} {mode}: only {peak} requests in flight"));
        }
    }
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
    boot.expect_line("serial \"nf-block\"");
    // One I/O queue pair by default.
    boot.expect_line("1 I/O queue pair (requested 1, controller granted ");
    for mode in ["irq", "poll"] {
        let queues = verdict(&boot, "nvme", mode, "queues");
        if !queues.contains("ok (1 I/O queue pair:") {
            boot.fail(&format!("{mode}: {queues}"));
        }
    }
    // The per-CPU check is skipped everywhere with one CPU.
    boot.expect_line("selftest: 46 passed, 0 failed, 6 skipped");
    boot.expect_no_line("FAILED");
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
    if !large.contains("4092 KiB transfers") {
        boot.fail(&format!("expected 4092 KiB transfers: {large}"));
    }
    boot.expect_line("selftest: 24 passed, 0 failed, 2 skipped");
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
    let config = boot.expect_line("config: ");
    if !config.contains(" nvme_queues=3") {
        boot.fail(&format!("nvme_queues=3 not in {config:?}"));
    }
    // Four bring-ups (irq, irq with a short timeout, poll, poll with a short timeout),
    // each with three pairs: on MSI-X entries 1-3 with interrupts, none when polling.
    let bring_ups: Vec<&str> = boot
        .serial
        .lines()
        .filter(|l| l.contains(" 3 I/O queue pairs (requested 3, controller granted "))
        .collect();
    let irq = bring_ups
        .iter()
        .filter(|l| l.ends_with("), MSI-X entries 1-3"));
    let polled = bring_ups.iter().filter(|l| l.ends_with("), polled"));
    if bring_ups.len() != 4 || irq.count() != 2 || polled.count() != 2 {
        boot.fail(&format!(
            "expected 2 + 2 bring-ups with 3 pairs: {bring_ups:?}"
        ));
    }
    let granted: u32 = bring_ups[0]
        .split("controller granted ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| boot.fail(&format!("no granted count in {:?}", bring_ups[0])));
    if granted < 3 {
        boot.fail(&format!("the controller granted {granted} queue pairs"));
    }
    expect_all_ok(&boot, "nvme");
    for mode in ["irq", "poll"] {
        let queues = verdict(&boot, "nvme", mode, "queues");
        if !queues.contains(
            "ok (3 I/O queue pairs: a block written through each read back through the next",
        ) {
            boot.fail(&format!("{mode}: {queues}"));
        }
    }
    if !verdict(&boot, "nvme", "irq", "queues").contains("MSI-X entries [1, 2, 3]") {
        boot.fail("the irq run's queues are not on MSI-X entries 1, 2, 3");
    }
    // With 4 CPUs the per-CPU check runs too (CPU 3 shares pair 1 with CPU 0).
    boot.expect_line("selftest: 26 passed, 0 failed, 0 skipped");
    boot.expect_no_line("FAILED");
}

/// `bench=dev disk=virtio0` opens just that device (through the disk selection) and
/// reports every workload in the machine-readable form `make bench-dev` reads. Only the
/// form is checked here, never the figures: timing stays out of pass/fail tests.
#[test]
fn the_device_benchmark_runs_on_the_selected_disk() {
    let boot = Qemu::appliance()
        .nvme("nf-bench")
        .virtio_blk()
        .append("bench=dev benchtime=1 disk=virtio0")
        .run();
    boot.expect_exit(ExitCode::Success);
    let results: Vec<&str> = boot
        .serial
        .lines()
        .filter_map(|l| l.split("bench-result: ").nth(1))
        .collect();
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
        let ops: u64 = r
            .split("\"ops\":")
            .nth(1)
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if !r.starts_with(&format!("{{\"device\":\"virtio-blk\",\"workload\":\"{w}\""))
            || ops == 0
            || r.contains("error")
            || !r.ends_with('}')
        {
            boot.fail(&format!("bad result line for {w}: {r}"));
        }
    }
    boot.expect_no_line("bench: nvme");
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
    boot.expect_line(
        " 2 I/O queue pairs (requested 3, controller granted 2), MSI-X entries 1-1, shared",
    );
    expect_all_ok(&boot, "nvme");
    let queues = verdict(&boot, "nvme", "irq", "queues");
    if !queues.contains("ok (2 I/O queue pairs:") || !queues.contains("MSI-X entries [1, 1]") {
        boot.fail(&format!("irq: {queues}"));
    }
    boot.expect_line("selftest: 24 passed, 0 failed, 2 skipped");
}
