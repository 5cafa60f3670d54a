//! The appliance and its disk: what it does with a blank disk, a formatted one and a
//! damaged one, with and without the `mkfs` options. No network: these boots stop at the
//! mount (the log says `ready: idle` without a NIC).

use std::os::unix::fs::FileExt;
use std::time::Duration;

use ninefold_tests::{FsImage, Qemu, Running};

/// Boots the appliance on `image` (as NVMe) with `options` and waits for `line`.
fn boot(image: &FsImage, options: &str, line: &str) -> Running {
    let mut vm = Qemu::appliance()
        .nvme_image("nf-storage", image)
        .append(options)
        .timeout(Duration::from_secs(120))
        .spawn();
    vm.wait_for_line(line);
    vm.wait_for_line("ready: idle");
    vm
}

#[test]
fn a_blank_disk_is_reported_and_left_alone() {
    let image = FsImage::blank(64 << 20);
    let boot = boot(&image, "", "holds no ninefold filesystem").stop();
    boot.expect_line("boot with `mkfs` to format it here");
    boot.expect_no_line("fs: mounted");
    boot.expect_no_line("!!!");
    let (status, _) = image.fsck_status();
    assert_eq!(status, Some(8), "fsck of a blank image: no superblock");
}

#[test]
fn mkfs_formats_a_blank_disk_and_keeps_a_formatted_one() {
    let image = FsImage::blank(64 << 20);
    let first = boot(&image, "mkfs", "fs: mounted").stop();
    first.expect_line("fs: mkfs: formatting");
    first.expect_line("label \"ninefold\"");
    first.expect_no_line("!!!");
    image.fsck();

    // A formatted disk: `mkfs` leaves it as it is.
    let image = FsImage::formatted("64M");
    let second = boot(&image, "mkfs", "fs: mounted").stop();
    second.expect_line("already holds a ninefold filesystem");
    second.expect_no_line("fs: mkfs: formatting");
    second.expect_line("label \"test\"");
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
        let b = boot(&image, options, "both superblocks are damaged").stop();
        b.expect_line("mkfs=force");
        b.expect_no_line("fs: mounted");
        b.expect_no_line("!!!");
    }
    let forced = boot(&image, "mkfs=force", "fs: mounted").stop();
    forced.expect_line("fs: mkfs: formatting");
    forced.expect_no_line("!!!");
    image.fsck();
}
