//! More than one CPU: the appliance starts every vCPU QEMU gives it (INIT-SIPI-SIPI), each
//! runs its own executor and a task sent from CPU 0, and the counters report them all.
//! The 9P work still runs on CPU 0 (docs/kernel.md, "CPUs"); these tests check that the
//! other CPUs' presence changes nothing there.

use std::time::Duration;

use kernel::exit::ExitCode;
use ninefold_tests::ninep::connect;
use ninefold_tests::{stats, FsImage, Qemu};
use ninep::wire::open_flags;

const UP: Duration = Duration::from_secs(120);

/// `-smp 4` under TCG: four CPUs online, each answering a task from CPU 0.
#[test]
fn every_cpu_boots_and_runs_a_task_at_smp_4() {
    let boot = Qemu::appliance().cpus(4).append("poweroff").run();
    boot.expect_exit(ExitCode::Success);
    boot.expect_line("4 CPU(s) in MADT");
    for cpu in 1..4 {
        boot.expect_line(&format!("smp: CPU {cpu} online (local APIC id {cpu})"));
    }
    boot.expect_line("smp: 4 of 4 CPU(s) online");
    boot.expect_line("smp: CPUs with local APIC ids [1, 2, 3] each ran a task sent from CPU 0");
    boot.expect_no_line("did not");
}

/// `cpus=2` at `-smp 4`: two start, two stay halted and are named.
#[test]
fn the_cpus_option_leaves_the_rest_halted() {
    let boot = Qemu::appliance().cpus(4).append("cpus=2 poweroff").run();
    boot.expect_exit(ExitCode::Success);
    boot.expect_line("smp: 2 of 4 CPU(s) online");
    boot.expect_line("local APIC ids [2, 3]");
    boot.expect_line("smp: CPUs with local APIC ids [1] each ran a task sent from CPU 0");
    boot.expect_no_line("smp: CPU 2 online");
}

/// `-smp 2` serving 9P from an NVMe disk with one I/O queue pair per CPU: fsync'd writes
/// read back, and the counters document lists both CPUs, the second having run the task CPU 0 sent it
/// and its queue pair's reaper.
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
    vm.wait_for_line("9p: listening on 10.0.2.15:564");
    // One NVMe I/O queue pair per CPU by default.
    vm.wait_for_line("2 I/O queue pairs (requested 2,");
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
    // The task CPU 0 sent it at boot, and the reaper of NVMe I/O queue pair 2 (its own).
    assert_eq!(stats::counter(&json, "/cpus/1/remote_tasks"), 2);
    // The second CPU has nothing to do but its inbox: it idles nearly all the time.
    let uptime = stats::counter(&json, "/uptime_ms");
    let idle = stats::counter(&json, "/cpus/1/idle_ms");
    if idle * 2 < uptime {
        vm.fail(&format!("CPU 1 idle {idle} ms of {uptime} ms"));
    }
    drop(c);
    vm.stop();
    image.fsck();
}
