//! The appliance and its disk: what it does with a blank disk, a formatted one and a
//! damaged one, with and without the `mkfs` options. No network: these boots stop at the
//! mount (the appliance is then `ready`, idle, without a NIC).

use std::os::unix::fs::FileExt;
use std::time::Duration;

use ninefold_tests::{any, FsImage, Qemu, Running};
use serde_json::{json, Value};

/// Boots the appliance on `image` (as NVMe) with `options` and waits for it to be ready
/// (idle: there is no NIC).
fn boot(image: &FsImage, options: &str) -> Running {
    let mut vm = Qemu::appliance()
        .nvme_image("nf-storage", image)
        .append(options)
        .timeout(Duration::from_secs(120))
        .spawn();
    vm.wait_for_event("ready", json!({"serving": false}));
    vm
}

/// The `mount_failed` event of a boot that mounted nothing, for `reason`.
fn refused(image: &FsImage, options: &str, reason: &str) -> Value {
    let boot = boot(image, options).stop();
    boot.expect_no_event("mounted", any());
    boot.expect_no_line("!!!");
    boot.expect_event("mount_failed", json!({ "reason": reason }))
}

#[test]
fn a_blank_disk_is_reported_and_left_alone() {
    let image = FsImage::blank(64 << 20);
    let failed = refused(&image, "", "no_filesystem");
    assert!(failed["device"].is_string(), "the disk is named: {failed}");
    let (status, _) = image.fsck_status();
    assert_eq!(status, Some(8), "fsck of a blank image: no superblock");
}

#[test]
fn mkfs_formats_a_blank_disk_and_keeps_a_formatted_one() {
    let image = FsImage::blank(64 << 20);
    let first = boot(&image, "mkfs").stop();
    first.expect_event("mkfs", json!({"formatted": true}));
    first.expect_event("mounted", json!({"label": "ninefold"}));
    first.expect_no_line("!!!");
    image.fsck();

    // A formatted disk: `mkfs` leaves it as it is.
    let image = FsImage::formatted("64M");
    let second = boot(&image, "mkfs").stop();
    second.expect_event("mkfs", json!({"formatted": false}));
    second.expect_no_event("mkfs", json!({"formatted": true}));
    second.expect_event("mounted", json!({"label": "test"}));
    image.fsck();
}

#[test]
fn damaged_superblocks_are_refused_unless_forced() {
    let image = FsImage::formatted("64M");
    // Both superblock copies (filesystem blocks 1 and 2) keep their magic but fail their
    // checksums.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(image.path())
        .unwrap();
    for block in [1u64, 2] {
        f.write_all_at(b"garbage", block * 4096 + 200).unwrap();
    }
    drop(f);
    for options in ["", "mkfs"] {
        refused(&image, options, "damaged");
    }
    let forced = boot(&image, "mkfs=force").stop();
    forced.expect_event("mkfs", json!({"formatted": true}));
    forced.expect_event("mounted", any());
    forced.expect_no_line("!!!");
    image.fsck();
}
