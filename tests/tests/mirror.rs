//! A mirrored volume on the appliance (`disk=nvme0,nvme1`): two NVMe images made one
//! volume by `ninefold mkfs A B` (given to QEMU in the other order: each leg is put in the
//! place its label names), a file written and fsynced over 9P, both legs clean by fsck
//! afterwards; then a boot with one leg only serves the file, degraded, and its counters
//! say which leg is missing; with `degraded=refuse` that boot serves nothing.
//!
//! Host ports: 15870 (9P), 15871 (counters).

use std::process::Command;
use std::time::Duration;

use ninefold_tests::ninep::connect;
use ninefold_tests::{stats, FsImage, Qemu};
use ninep::wire::open_flags;
use serde_json::json;

const DATA: &[u8] = b"on every leg\n";

#[test]
fn a_mirrored_volume_serves_from_both_legs_and_from_one() {
    let port = 15870;
    let (a, b) = (FsImage::blank(64 << 20), FsImage::blank(64 << 20));
    let out = Command::new(ninefold_tests::tool())
        .arg("mkfs")
        .args([a.path(), b.path()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut vm = Qemu::serving()
        .memory("128M")
        .nvme_image("nf-leg-b", &b)
        .nvme_image("nf-leg-a", &a)
        .append("disk=nvme0,nvme1")
        .virtio_net_forward(port, 564)
        .timeout(Duration::from_secs(300))
        .spawn();
    let mounted = vm.wait_for_event("mounted", ninefold_tests::any());
    assert!(
        mounted["device"]
            .as_str()
            .is_some_and(|d| d.starts_with("mirror(")),
        "{mounted}"
    );
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, Duration::from_secs(60));
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "kept", open_flags::RDWR, 0o644).unwrap();
    assert_eq!(c.write(1, 0, DATA), Ok(DATA.len() as u32));
    c.fsync(1, false).unwrap();
    drop(c);
    let serial = vm.stop();
    serial.expect_no_line("!!!");
    // Each leg alone is a whole filesystem with the file.
    for leg in [&a, &b] {
        let out = Command::new(ninefold_tests::tool())
            .arg("fsck")
            .arg(leg.path())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "fsck of one leg: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Leg b gone: the volume serves from a, degraded.
    let mut vm = Qemu::serving()
        .memory("128M")
        .nvme_image("nf-leg-a", &a)
        .append("disk=nvme0,nvme1")
        .virtio_net_forwards(&[(port, 564), (port + 1, 5641)])
        .timeout(Duration::from_secs(300))
        .spawn();
    vm.wait_for_event("mounted", ninefold_tests::any());
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, Duration::from_secs(60));
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "kept").unwrap();
    c.lopen(1, open_flags::RDONLY).unwrap();
    assert_eq!(c.read(1, 0, 4096).unwrap(), DATA);
    drop(c);
    let counters = stats::json(port + 1);
    let states: Vec<_> = (0..2)
        .map(|i| counters["devices"][0]["legs"][i]["state"].clone())
        .collect();
    // `mkfs A B` put b in place 1.
    assert_eq!(states, ["active", "missing"], "{counters}");
    assert_eq!(stats::counter(&counters, "/fs/failed_legs"), 1);
    let serial = vm.stop();
    serial.expect_no_line("!!!");

    // Unless told not to serve a degraded volume.
    let mut vm = Qemu::serving()
        .memory("128M")
        .nvme_image("nf-leg-a", &a)
        .append("disk=nvme0,nvme1 degraded=refuse")
        .timeout(Duration::from_secs(300))
        .spawn();
    vm.wait_for_event("ready", json!({"serving": false}));
    let serial = vm.stop();
    serial.expect_no_event("mounted", ninefold_tests::any());
    serial.expect_event("mount_failed", json!({"reason": "mount_failed"}));
}
