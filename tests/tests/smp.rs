//! More than one CPU: the appliance starts every vCPU QEMU gives it (INIT-SIPI-SIPI), each
//! has its TSC checked against CPU 0's, runs its own executor and a task sent from CPU 0,
//! and the counters report them all. Each NVMe I/O queue pair belongs to a CPU: the
//! requests of that CPU go through it, complete there and interrupt only it. The 9P work
//! still runs on CPU 0 (docs/kernel.md, "CPUs"); these tests check that the other CPUs'
//! presence changes nothing there.

use std::time::Duration;

use kernel::exit::ExitCode;
use ninefold_tests::ninep::connect;
use ninefold_tests::{stats, FsImage, Qemu};
use ninep::wire::open_flags;
use serde_json::json;

const UP: Duration = Duration::from_secs(120);

/// `-smp 4` under TCG: four CPUs online, each answering a task from CPU 0.
#[test]
fn every_cpu_boots_and_runs_a_task_at_smp_4() {
    let boot = Qemu::appliance().cpus(4).append("poweroff").run();
    boot.expect_exit(ExitCode::Success);
    let cpus = boot.expect_event(
        "cpus",
        json!({
            "reported": 4,
            "online": 4,
            "ran_task": [1, 2, 3],
            "no_answer": [],
            "failed": [],
            "skipped": [],
        }),
    );
    for cpu in 1..4 {
        // Online with its own local APIC id, its TSC checked; QEMU's vCPUs share one.
        let c = &cpus["cpus"][cpu];
        if c["apic_id"] != cpu || c["tsc"]["corrected"] != false {
            boot.fail(&format!("CPU {cpu}: {cpus}"));
        }
    }
}

/// `cpus=2` at `-smp 4`: two start, two stay halted and are named.
#[test]
fn the_cpus_option_leaves_the_rest_halted() {
    let boot = Qemu::appliance().cpus(4).append("cpus=2 poweroff").run();
    boot.expect_exit(ExitCode::Success);
    let cpus = boot.expect_event(
        "cpus",
        json!({"reported": 4, "online": 2, "skipped": [2, 3], "ran_task": [1]}),
    );
    if cpus["cpus"].as_array().map(Vec::len) != Some(2) {
        boot.fail(&format!("expected CPUs 0 and 1 only: {cpus}"));
    }
}

/// `-smp 2` serving 9P from an NVMe disk with one I/O queue pair per CPU: fsync'd writes
/// read back, and the counters document lists both CPUs, the second having run the task
/// CPU 0 sent it, its queue pair's reaper and the one connection (served by CPU 1: of two
/// CPUs serving none, the one that does not also run the network stack).
#[test]
fn two_cpus_serve_9p_and_report_both() {
    let (port, stats_port) = (16450, 16451);
    let image = FsImage::formatted("128M");
    let mut vm = Qemu::appliance()
        .cpus(2)
        .virtio_net_forwards(&[(port, 564), (stats_port, 5641)])
        .nvme_image("nf-smp", &image)
        .timeout(Duration::from_secs(180))
        .spawn();
    vm.wait_for_event(
        "listening",
        json!({"service": "9p", "address": "10.0.2.15", "port": 564}),
    );
    // One NVMe I/O queue pair per CPU by default.
    vm.wait_for_event("nvme", json!({"pairs": 2, "requested": 2}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", open_flags::RDWR, 0o644).unwrap();
    for i in 0..8u64 {
        c.write(1, i * 4096, &[i as u8; 4096]).unwrap();
        c.fsync(1, false).unwrap();
    }
    assert_eq!(c.read(1, 7 * 4096, 4096).unwrap(), [7u8; 4096]);
    let json = stats::json(stats_port);
    let cpus = json["cpus"].as_array().expect("a cpus array");
    if cpus.len() != 2 {
        vm.fail(&format!("expected 2 CPUs in the counters, got {cpus:?}"));
    }
    assert_eq!(stats::counter(&json, "/cpus/1/apic_id"), 1);
    // The task CPU 0 sent it at boot, the reaper of NVMe I/O queue pair 2 (its own), and
    // the connection.
    assert_eq!(stats::counter(&json, "/cpus/1/remote_tasks"), 3, "{json}");
    assert_eq!(
        stats::counter(&json, "/cpus/1/serving/accepted"),
        1,
        "{json}"
    );
    assert_eq!(
        stats::counter(&json, "/cpus/1/serving/connections"),
        1,
        "{json}"
    );
    assert!(
        stats::counter(&json, "/cpus/1/serving/rx_bytes") > 8 * 4096,
        "{json}"
    );
    assert_eq!(
        stats::counter(&json, "/cpus/0/serving/accepted"),
        0,
        "{json}"
    );
    assert_eq!(
        json.pointer("/cpus/1/tsc/corrected")
            .and_then(|v| v.as_bool()),
        Some(false),
        "{json}"
    );
    // The wake-up IPIs it got, and the wakes that needed none, are counted.
    stats::counter(&json, "/cpus/1/wakes/ipis");
    stats::counter(&json, "/cpus/1/wakes/ipis_skipped");
    // The second CPU's idle time is counted: it halted between the client's requests
    // (how much is the host's business: under TCG on a loaded machine its thread may
    // not run when the guest would be busy, so no share is asserted).
    let uptime = stats::counter(&json, "/uptime_ms");
    let idle = stats::counter(&json, "/cpus/1/idle_ms");
    if idle == 0 || idle > uptime {
        vm.fail(&format!("CPU 1 idle {idle} ms of {uptime} ms up"));
    }
    drop(c);
    vm.stop();
    image.fsck();
}

/// `-smp 4` with an NVMe controller and its default of one I/O queue pair per CPU: in the
/// block self-test every CPU does I/O at once, and each pair's commands came only from
/// its CPU, were completed there and (with interrupts) interrupted only that CPU, as the
/// `block-cpus` events count them, with interrupts and with polling. Every other block
/// check passes with the pairs spread too (the timeout check resets all four).
#[test]
fn each_cpu_s_requests_complete_and_interrupt_on_that_cpu() {
    let boot = Qemu::appliance()
        .cpus(4)
        .nvme("nf-percpu")
        .append("selftest=block")
        .run();
    boot.expect_exit(ExitCode::Success);
    boot.expect_event(
        "nvme",
        json!({"pairs": 4, "requested": 4, "cpus": [0, 1, 2, 3]}),
    );
    let events = boot.events("block_cpus");
    if events.len() != 2 {
        boot.fail(&format!("expected an irq and a poll event: {events:?}"));
    }
    for e in &events {
        let check = e["check"].as_str().unwrap_or_default();
        let irq = check.ends_with(" irq");
        let pairs = e["pairs"].as_array().cloned().unwrap_or_default();
        if e["cpus"] != 4 || pairs.len() != 4 {
            boot.fail(&format!("expected 4 CPUs and 4 pairs: {e}"));
        }
        for (i, p) in pairs.iter().enumerate() {
            let count = |what: &str, cpu: usize| p[what][cpu].as_u64().unwrap_or(u64::MAX);
            if p["cpu"] != i {
                boot.fail(&format!("pair {} is not CPU {i}'s: {e}", i + 1));
            }
            for cpu in 0..4 {
                let own = cpu == i;
                let submitted = count("submitted_by_cpu", cpu);
                let completed = count("completed_by_cpu", cpu);
                let interrupts = count("interrupts_by_cpu", cpu);
                let ok = if own {
                    submitted > 0 && completed > 0 && (interrupts > 0) == irq
                } else {
                    submitted == 0 && completed == 0 && interrupts == 0
                };
                if !ok {
                    boot.fail(&format!("{check}: pair {} on CPU {cpu}: {p}", i + 1));
                }
            }
        }
    }
    boot.expect_event(
        "selftest_done",
        json!({"passed": 26, "failed": 0, "skipped": 0}),
    );
    boot.expect_no_event("selftest", json!({"result": "failed"}));
}
