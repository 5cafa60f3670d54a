//! The block drivers in QEMU: `selftest=block` puts every NVMe and virtio-blk device
//! through the kernel's block checks (kernel/src/selftest/block.rs), with interrupt and
//! with polled completions, and these tests read the verdicts.

use kernel::exit::ExitCode;
use ninefold_tests::{Boot, Qemu};

const CHECKS: [&str; 11] = [
    "open",
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

fn expect_all_ok(boot: &Boot, kind: &str) {
    for mode in ["irq", "poll"] {
        for check in CHECKS {
            let line = verdict(boot, kind, mode, check);
            if !line.contains(&format!("{check}: ok (")) {
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
    boot.expect_line("selftest: 44 passed, 0 failed, 0 skipped");
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
    boot.expect_line("selftest: 22 passed, 0 failed, 0 skipped");
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
