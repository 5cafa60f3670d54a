//! Boots the appliance image in QEMU and checks what it reports on its serial console:
//! its events, and the lines of the crash reports and the configuration (for people, so
//! tested as lines). Build the image first (`make test` does); see the harness in
//! `src/lib.rs`.

use std::time::Duration;

use kernel::exit::ExitCode;
use ninefold_tests::{any, Qemu};
use serde_json::json;

const NVME_SERIAL: &str = "nf-test-nvme";

/// Every device is found and every self-check passes, MSI and MSI-X included.
#[test]
fn selftest_passes_with_nvme_virtio_blk_virtio_net_and_edu() {
    let boot = Qemu::appliance()
        .nvme(NVME_SERIAL)
        .virtio_blk()
        .virtio_net()
        .edu()
        .append("selftest")
        .run();
    boot.expect_exit(ExitCode::Success);
    let booted = boot.expect_event("booted", any());
    for (id, class, name) in [
        ("1b36:0010", "01.08", "NVMe controller"),
        ("1af4:1042", "01.00", "virtio-blk"),
        ("1af4:1041", "02.00", "virtio-net"),
        ("1234:11e8", "00.ff", "edu test device"),
    ] {
        let found = booted["pci"].as_array().is_some_and(|pci| {
            pci.iter().any(|f| {
                f["id"] == id
                    && f["class"] == class
                    && f["name"].as_str().is_some_and(|n| n.starts_with(name))
            })
        });
        if !found {
            boot.fail(&format!("no PCI function {id} {class} {name}: {booted}"));
        }
    }
    for check in [
        "heap", "frames", "paging", "clock", "timer", "executor", "ioapic", "msi", "dma", "msix",
    ] {
        boot.expect_event("selftest", json!({"check": check, "result": "ok"}));
    }
    let msix = boot.expect_event("selftest", json!({"check": "msix"}));
    if msix["facts"]["serial"] != NVME_SERIAL {
        boot.fail("the NVMe Identify data did not carry the serial number QEMU was given");
    }
    boot.expect_event(
        "selftest_done",
        json!({"passed": 10, "failed": 0, "skipped": 0}),
    );
    boot.expect_no_event("selftest", json!({"result": "failed"}));
}

/// The heap and frame allocator are sized from the memory map: more RAM, bigger heap.
#[test]
fn memory_scales_from_128_mib_to_1_gib() {
    let heap_of = |mem: &str| {
        let boot = Qemu::appliance().memory(mem).append("poweroff").run();
        boot.expect_exit(ExitCode::Success);
        let booted = boot.expect_event("booted", any());
        let mib = |field: &str| {
            booted[field]
                .as_u64()
                .unwrap_or_else(|| boot.fail(&format!("no {field} in {booted}")))
        };
        let (heap, frames) = (mib("heap_mib"), mib("frames_free_mib"));
        (heap, frames, boot)
    };
    let (small_heap, small_frames, small) = heap_of("128M");
    let (big_heap, big_frames, big) = heap_of("1G");
    if small_heap < 64 {
        small.fail(&format!("only {small_heap} MiB of heap in 128 MiB"));
    }
    if big_heap < 6 * small_heap || big_frames <= small_frames {
        big.fail(&format!(
            "1 GiB gave heap {big_heap} MiB / frames {big_frames} MiB; 128 MiB gave {small_heap} / {small_frames}"
        ));
    }
}

/// The effective configuration is logged; bad options are reported and ignored. A test
/// of the log itself (what an operator reads), and of the `config` event.
#[test]
fn configuration_is_logged_and_bad_options_are_ignored() {
    let boot = Qemu::appliance()
        .append("log=debug ip=10.0.2.15/24 gw=10.0.2.2 port=5640 disk=nvme0")
        .append("frobnicate port=99999 ip=10.0.2.15 poweroff")
        .run();
    boot.expect_exit(ExitCode::Success);
    let effective = "log=debug ip=10.0.2.15/24 gw=10.0.2.2 port=5640 disk=nvme0 poweroff";
    boot.expect_line(&format!("config: {effective}"));
    boot.expect_line("unknown option `frobnicate` ignored");
    boot.expect_line("malformed option `port=99999` ignored");
    boot.expect_line("malformed option `ip=10.0.2.15` ignored");
    let config = boot.expect_event("config", json!({ "effective": effective }));
    let ignored: Vec<(&str, bool)> = config["ignored"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| (i["option"].as_str().unwrap_or(""), i["why"] == "unknown"))
                .collect()
        })
        .unwrap_or_default();
    let expected = [
        ("frobnicate", true),
        ("port=99999", false),
        ("ip=10.0.2.15", false),
    ];
    if ignored != expected {
        boot.fail(&format!("expected {expected:?} ignored: {config}"));
    }
}

/// A page fault is reported with vector, error code, RIP and CR2 (a test of the log: the
/// crash report is for people, and no event is emitted on the way down).
#[test]
fn page_fault_is_reported() {
    let boot = Qemu::appliance().append("crash=pagefault").run();
    boot.expect_exit(ExitCode::Exception);
    boot.expect_line("CPU EXCEPTION: vector 14 (#PF page fault), error code 0x0");
    boot.expect_line("!!! RIP 0x");
    boot.expect_line("!!! CR2 0x0000000000000008: kernel read, page not present");
}

/// Running off the end of the main stack hits its guard page and is called an overflow.
#[test]
fn stack_overflow_hits_the_guard_page() {
    let boot = Qemu::appliance().append("crash=stackoverflow").run();
    boot.expect_exit(ExitCode::StackOverflow);
    boot.expect_line("CPU EXCEPTION: vector 14 (#PF page fault)");
    boot.expect_line("KERNEL STACK OVERFLOW: the main stack");
}

/// A panic prints its message and location.
#[test]
fn panic_is_reported() {
    let boot = Qemu::appliance().append("crash=panic").run();
    boot.expect_exit(ExitCode::Panic);
    boot.expect_line("KERNEL PANIC at kernel/src/crash.rs");
    boot.expect_line("crash=panic requested on the command line");
}

/// Without `selftest` or `poweroff` the appliance stays up (idle); the harness's timeout
/// is what ends such a boot, and it reports it as a hang.
#[test]
fn an_idle_appliance_runs_until_the_timeout() {
    let boot = Qemu::appliance()
        .virtio_net()
        .timeout(Duration::from_secs(3))
        .run();
    if !boot.timed_out {
        boot.fail("the appliance stopped by itself");
    }
    boot.expect_event("ready", any());
    boot.expect_no_line("!!!");
}
