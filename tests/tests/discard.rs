//! Space given back: files deleted over 9P are discarded on the device within the
//! `discard=` delay, so the sparse image behind the appliance's disk shrinks (QEMU's
//! `discard=unmap` punches holes), on NVMe (Deallocate) and virtio-blk (DISCARD);
//! `discard=off` keeps it.
//!
//! Host ports: 16310-16312.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use ninefold_tests::ninep::connect;
use ninefold_tests::{FsImage, Qemu};
use ninep::wire::open_flags;
use serde_json::json;

const UP: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;
const FILE: usize = 32 << 20;

/// Bytes the image file occupies on the host.
fn allocated(image: &FsImage) -> u64 {
    std::fs::metadata(image.path()).unwrap().blocks() * 512
}

/// Writes a 32 MiB file, deletes it, and returns the image's allocated bytes with the
/// file in place and `wait` after the deletion.
fn write_delete_wait(disk: &str, port: u16, append: &str, wait: Duration) -> (u64, u64) {
    let image = FsImage::formatted("256M");
    let q = Qemu::serving()
        .memory("128M")
        .virtio_net_forward(port, 564)
        .append(append)
        .timeout(Duration::from_secs(300));
    let mut vm = match disk {
        "virtio" => q.virtio_blk_image(&image),
        _ => q.nvme_image("nf-discard", &image),
    }
    .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "big", open_flags::RDWR, 0o644).unwrap();
    // Well under the negotiated msize (1 MiB) with the Twrite header.
    let chunk = vec![0xa5u8; 512 << 10];
    for i in 0..FILE / chunk.len() {
        c.write(1, (i * chunk.len()) as u64, &chunk).unwrap();
    }
    c.fsync(1, false).unwrap();
    c.clunk(1).unwrap();
    let full = allocated(&image);
    assert!(
        full >= FILE as u64,
        "the image holds {full} bytes after a 32 MiB write"
    );
    c.unlinkat(0, "big", 0).unwrap();
    let start = Instant::now();
    let mut now = full;
    while start.elapsed() < wait {
        std::thread::sleep(Duration::from_secs(1));
        now = allocated(&image);
        if now + 24 * MIB <= full && append.is_empty() {
            break;
        }
    }
    let boot = vm.stop();
    boot.expect_no_panic();
    image.fsck();
    (full, now)
}

fn deleted_files_shrink_the_image(disk: &str, port: u16) {
    // The default delay (20 s) plus the housekeeping interval (5 s), and room for TCG.
    let (full, after) = write_delete_wait(disk, port, "", Duration::from_secs(90));
    assert!(
        after + 24 * MIB <= full,
        "the image still holds {} MiB of {} MiB after deleting 32 MiB",
        after / MIB,
        full / MIB
    );
}

#[test]
fn deleted_files_shrink_an_nvme_image() {
    deleted_files_shrink_the_image("nvme", 16310);
}

#[test]
fn deleted_files_shrink_a_virtio_blk_image() {
    deleted_files_shrink_the_image("virtio", 16311);
}

#[test]
fn discard_off_keeps_the_space() {
    let (full, after) = write_delete_wait("nvme", 16312, "discard=off", Duration::from_secs(35));
    assert!(
        after + 4 * MIB > full,
        "with discard=off the image shrank from {} to {} MiB",
        full / MIB,
        after / MIB
    );
}
