//! Device faults end to end, while a 9P client works: FLUSHes, writes or reads failing,
//! bits flipped, the log unreadable at mount. Faults come from two sides: the
//! appliance's own injector (`fault=` on the kernel command line, `block::FaultDisk`
//! between the real driver and the filesystem) and QEMU's `blkdebug` driver below the
//! emulated device (a disk failing from outside, as hardware would). The policy
//! (`docs/durability.md`, "Device errors"): an fsync whose write or FLUSH failed returns
//! EIO and no later fsync reports success for what it did not make durable; the
//! filesystem then refuses further changes; a bad read is EIO for that file only; after
//! a reboot on a healthy disk, `ninefold fsck` is clean and everything acknowledged
//! before the fault is there.
//!
//! Host ports: 16300-16303, 17000-17019.

use std::time::{Duration, Instant};

use ninefold_tests::blkdebug::Blkdebug;
use ninefold_tests::ninep::{connect, Tcp};
use ninefold_tests::{stats, FsImage, Qemu, Running};
use ninep::testing::Client;
use ninep::wire::open_flags;
use serde_json::json;
use vfs::Errno;

/// Seconds after boot from which every FLUSH fails: room for the boot and the
/// acknowledged part under TCG on a loaded machine.
const FLUSHES_FAIL_AFTER: u64 = 25;
const UP: Duration = Duration::from_secs(120);

/// Where the device's errors come from.
enum Faults {
    /// Nowhere: a healthy disk.
    None,
    /// The appliance's injector, armed with these `fault=` rules.
    Kernel(String),
    /// QEMU's `blkdebug` under the device, with these rules.
    Outside(Blkdebug),
}

impl Faults {
    /// The errors injected so far, from the appliance's counters: its injector's count,
    /// or the device errors its driver saw.
    fn injected(&self, stats_port: u16) -> u64 {
        let v = stats::json(stats_port);
        let n = match self {
            Faults::Kernel(_) => {
                stats::counter(&v, "/devices/0/injected_faults/injected_errors")
                    + stats::counter(&v, "/devices/0/injected_faults/corrupted_blocks")
            }
            _ => stats::counter(&v, "/devices/0/counters/errors"),
        };
        assert!(n >= 1, "no injected error counted: {v}");
        n
    }
}

fn boot(image: &FsImage, disk: &str, port: u16, stats_port: u16, faults: &Faults) -> Running {
    let mut q = Qemu::serving()
        .memory("128M")
        .virtio_net_forwards(&[(port, 564), (stats_port, 5641)])
        .timeout(Duration::from_secs(300));
    if let Faults::Kernel(rules) = faults {
        q = q.append(&format!("fault={rules}"));
    }
    match (disk, faults) {
        ("virtio", Faults::Outside(rules)) => q.virtio_blk_blkdebug(image, rules),
        (_, Faults::Outside(rules)) => q.nvme_blkdebug("nf-faults", image, rules),
        ("virtio", _) => q.virtio_blk_image(image),
        _ => q.nvme_image("nf-faults", image),
    }
    .spawn()
}

/// The appliance's uptime, from its counters.
fn uptime(stats_port: u16) -> Duration {
    let v = stats::json(stats_port);
    Duration::from_millis(stats::counter(&v, "/uptime_ms"))
}

/// Creates `name` in the root holding `data` and fsyncs it; fid 1 stays open on it.
fn create_and_fsync(c: &mut Client<Tcp>, name: &str, data: &[u8]) -> Result<(), Errno> {
    c.walk(0, 1, "")?;
    c.lcreate(1, name, open_flags::RDWR, 0o644)?;
    let n = c.write(1, 0, data)?;
    assert_eq!(n as usize, data.len(), "short write");
    c.fsync(1, false)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// After a failure: the second fsync of fid 1 gets `EIO`, a create is refused, the
/// counters and the console (an `fs_failed` event) say the filesystem failed, and
/// nothing panicked. Stops the machine.
fn expect_failed(mut c: Client<Tcp>, mut vm: Running, stats_port: u16) {
    assert_eq!(
        c.fsync(1, false),
        Err(Errno::EIO),
        "a later fsync of the same file"
    );
    c.walk(0, 2, "").unwrap();
    assert!(
        c.lcreate(2, "after", open_flags::RDWR, 0o644).is_err(),
        "a create after the failure succeeded"
    );
    let v = stats::json(stats_port);
    assert_eq!(
        stats::counter(&v, "/fs/failed"),
        1,
        "not counted as failed: {v}"
    );
    // Seen within 0.1 s of the failure (`storage::FAILURE_CHECK`).
    let failed = vm.wait_for_event("fs_failed", ninefold_tests::any());
    assert!(
        failed["device_errors"].as_u64() >= Some(1),
        "no device error counted: {failed}"
    );
    let boot = vm.stop();
    boot.expect_no_panic();
}

/// The disk healthy again: `ninefold fsck` before and after a reboot without faults,
/// and every acknowledged file read back. Prints the line `make crash` adds up and
/// fails on any loss or fsck error.
fn expect_healed(
    image: &FsImage,
    disk: &str,
    (port, stats_port): (u16, u16),
    acked: &[(String, Vec<u8>)],
    injected: u64,
    what: &str,
) {
    let (status, after_fault) = image.fsck_status();
    let mut fsck_errors = usize::from(status != Some(0));
    let mut vm = boot(image, disk, port, stats_port, &Faults::None);
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    let lost: Vec<&str> = acked
        .iter()
        .filter(|(name, data)| read_file(&mut c, 1, name).as_deref() != Ok(&data[..]))
        .map(|(name, _)| name.as_str())
        .collect();
    vm.stop();
    let (status, after_reboot) = image.fsck_status();
    fsck_errors += usize::from(status != Some(0));
    println!(
        "device faults: {injected} injected, acknowledged-and-lost: {}, fsck errors: {fsck_errors} ({disk}, {what})",
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "acknowledged files came back different: {lost:?}"
    );
    assert_eq!(
        fsck_errors, 0,
        "ninefold fsck after the fault:\n{after_fault}\nafter the reboot:\n{after_reboot}"
    );
}

/// Reads `name` whole through fid `fid`.
fn read_file(c: &mut Client<Tcp>, fid: u32, name: &str) -> Result<Vec<u8>, Errno> {
    c.walk(0, fid, name)?;
    c.lopen(fid, open_flags::RDONLY)?;
    let mut back = Vec::new();
    let result = loop {
        match c.read(fid, back.len() as u64, 65536) {
            Ok(chunk) if chunk.is_empty() => break Ok(back),
            Ok(chunk) => back.extend_from_slice(&chunk),
            Err(e) => break Err(e),
        }
    };
    c.clunk(fid).unwrap();
    result
}

/// `rule` fails the device from `FLUSHES_FAIL_AFTER` seconds after boot on; `what` names
/// the scenario in the printed line.
fn failing_device_loses_nothing_acknowledged(
    disk: &str,
    port: u16,
    stats_port: u16,
    rule: &str,
    what: &str,
) {
    let image = FsImage::formatted("256M");
    let acked = pattern(7, 200_000);
    let faults = Faults::Kernel(format!("{rule}:{FLUSHES_FAIL_AFTER}"));
    let mut vm = boot(&image, disk, port, stats_port, &faults);
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    create_and_fsync(&mut c, "acked", &acked).expect("fsync before the fault");
    let done = uptime(stats_port);
    assert!(
        done < Duration::from_secs(FLUSHES_FAIL_AFTER),
        "the acknowledged part ended {done:?} after boot, past the fault's start: the machine is too slow for this test"
    );
    c.clunk(1).unwrap();

    // Wait until flushes fail, then write and fsync: EIO, and EIO again.
    let deadline = Instant::now() + Duration::from_secs(120);
    while uptime(stats_port) <= Duration::from_secs(FLUSHES_FAIL_AFTER + 1) {
        assert!(
            Instant::now() < deadline,
            "the appliance's clock stands still"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let lost = create_and_fsync(&mut c, "lost", &pattern(9, 50_000));
    assert_eq!(
        lost,
        Err(Errno::EIO),
        "write + fsync after the fault ({what})"
    );
    let injected = faults.injected(stats_port);
    expect_failed(c, vm, stats_port);
    let acked = [("acked".to_string(), acked)];
    expect_healed(&image, disk, (port, stats_port), &acked, injected, what);
}

#[test]
fn failed_flushes_on_nvme_lose_nothing_acknowledged() {
    failing_device_loses_nothing_acknowledged(
        "nvme",
        16300,
        16301,
        "flush-after",
        "every FLUSH failing",
    );
}

#[test]
fn failed_flushes_on_virtio_blk_lose_nothing_acknowledged() {
    failing_device_loses_nothing_acknowledged(
        "virtio",
        16302,
        16303,
        "flush-after",
        "every FLUSH failing",
    );
}

/// A failed data write: from the fault on, every write fails, the first one being the
/// `Twrite`'s extent; the `Twrite` or its fsync gets `EIO`, and no later fsync succeeds.
#[test]
fn failed_writes_on_nvme_lose_nothing_acknowledged() {
    failing_device_loses_nothing_acknowledged(
        "nvme",
        17000,
        17001,
        "write-after",
        "every write failing",
    );
}

#[test]
fn failed_writes_on_virtio_blk_lose_nothing_acknowledged() {
    failing_device_loses_nothing_acknowledged(
        "virtio",
        17002,
        17003,
        "write-after",
        "every write failing",
    );
}

/// How one file's data blocks go bad.
#[derive(Clone, Copy, Debug)]
enum BadBlocks {
    /// Reads of them fail in the appliance's injector (`fault=read-range:A-B`).
    ReadError,
    /// Reads of them fail below the device (QEMU's `blkdebug`).
    ReadErrorOutside,
    /// Reads of them return a flipped bit (`fault=flip:A-B`): a checksum mismatch.
    FlippedBits,
}

impl BadBlocks {
    /// The faults for data at 512-byte sectors `sectors`.
    fn faults(self, sectors: std::ops::Range<usize>) -> Faults {
        let (a, b) = (sectors.start, sectors.end);
        match self {
            BadBlocks::ReadError => Faults::Kernel(format!("read-range:{a}-{b}")),
            BadBlocks::ReadErrorOutside => {
                Faults::Outside(Blkdebug::default().reads_fail_at(a as u64))
            }
            BadBlocks::FlippedBits => Faults::Kernel(format!("flip:{a}-{b}")),
        }
    }

    /// What the printed line calls it.
    fn what(self) -> &'static str {
        match self {
            BadBlocks::ReadError => "a read error on one file",
            BadBlocks::ReadErrorOutside => "a read error from outside on one file",
            BadBlocks::FlippedBits => "a flipped bit in one file",
        }
    }

    /// Whether the bad file is the last one fsynced before the crash, so that mount
    /// checks its data while replaying the log. A flipped bit there cannot be told from
    /// data whose FLUSH never completed and drops the commit (docs/durability.md,
    /// "Device errors"), so that case puts the bad file first.
    fn bad_last(self) -> bool {
        !matches!(self, BadBlocks::FlippedBits)
    }
}

/// One file's data blocks bad (found by looking for its data in the image after a
/// crash): `EIO` for that file only, other files read fine, the filesystem is not failed
/// (a create + fsync succeeds, nothing logged); rebooted without faults, both files whole
/// and fsck clean.
fn bad_blocks_fail_one_file(disk: &str, port: u16, stats_port: u16, how: BadBlocks) {
    let image = FsImage::formatted("256M");
    let good = pattern(3, 32768);
    let bad = pattern(200, 32768);
    let mut vm = boot(&image, disk, port, stats_port, &Faults::None);
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    let mut files = [("good", &good), ("bad", &bad)];
    if !how.bad_last() {
        files.reverse();
    }
    for (name, data) in files {
        create_and_fsync(&mut c, name, data).unwrap_or_else(|e| panic!("fsync of {name}: {e}"));
        c.clunk(1).unwrap();
    }
    vm.stop();

    // Where the bad file's data is: every 4 KiB block of it is the same (the pattern
    // repeats every 256 bytes).
    let bytes = std::fs::read(image.path()).unwrap();
    let blocks: Vec<usize> = bytes
        .chunks(4096)
        .enumerate()
        .filter(|(_, b)| *b == &bad[..4096])
        .map(|(i, _)| i)
        .collect();
    assert!(
        !blocks.is_empty(),
        "the bad file's data is not in the image"
    );
    let sectors = blocks[0] * 8..(blocks[blocks.len() - 1] + 1) * 8;
    drop(bytes);

    let faults = how.faults(sectors.clone());
    let mut vm = boot(&image, disk, port, stats_port, &faults);
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    assert_eq!(
        read_file(&mut c, 1, "bad").map(|b| b.len()),
        Err(Errno::EIO),
        "reading the file on the bad sectors {sectors:?} ({how:?})"
    );
    assert_eq!(
        read_file(&mut c, 1, "good").as_deref(),
        Ok(&good[..]),
        "the other file"
    );
    create_and_fsync(&mut c, "after", &pattern(5, 10_000))
        .expect("a create + fsync after the bad read: the filesystem is failed");
    c.clunk(1).unwrap();
    let injected = faults.injected(stats_port);
    let v = stats::json(stats_port);
    assert_eq!(
        stats::counter(&v, "/fs/failed"),
        0,
        "a bad read failed the filesystem: {v}"
    );
    if matches!(how, BadBlocks::FlippedBits) {
        assert!(
            stats::counter(&v, "/fs/corruptions") >= 1,
            "no checksum mismatch counted: {v}"
        );
    } else {
        // The bad file's commit was the last: replay kept it without reading its data.
        assert_eq!(
            stats::counter(&v, "/fs/log/unverified_commits"),
            1,
            "the last commit's unreadable data: {v}"
        );
    }
    let boot1 = vm.stop();
    boot1.expect_no_event("fs_failed", ninefold_tests::any());
    boot1.expect_no_panic();

    let acked = files.map(|(name, data)| (name.to_string(), data.clone()));
    expect_healed(
        &image,
        disk,
        (port, stats_port),
        &acked,
        injected,
        how.what(),
    );
}

#[test]
fn read_error_on_nvme_fails_one_file() {
    bad_blocks_fail_one_file("nvme", 17004, 17005, BadBlocks::ReadError);
}

#[test]
fn read_error_on_virtio_blk_fails_one_file() {
    bad_blocks_fail_one_file("virtio", 17006, 17007, BadBlocks::ReadError);
}

#[test]
fn flipped_bits_on_nvme_fail_one_file() {
    bad_blocks_fail_one_file("nvme", 17008, 17009, BadBlocks::FlippedBits);
}

/// A read error from outside, on the emulated disk.
#[test]
fn read_error_from_outside_on_virtio_blk_fails_one_file() {
    bad_blocks_fail_one_file("virtio", 17010, 17011, BadBlocks::ReadErrorOutside);
}

/// The disk fails every FLUSH from outside (QEMU's `blkdebug`) from its
/// `FLUSHES_BEFORE_FAILING`-th on: the client creates and fsyncs file after file until
/// an fsync gets `EIO`; then a second fsync gets `EIO`, a create is refused and the
/// filesystem says it failed; rebooted on a healthy disk, every file whose fsync
/// succeeded is whole and fsck is clean.
fn flushes_failing_from_outside(disk: &str, port: u16, stats_port: u16) {
    /// More than the mount's own FLUSHes, so that some fsyncs succeed first.
    const FLUSHES_BEFORE_FAILING: u32 = 12;
    let image = FsImage::formatted("256M");
    let faults = Faults::Outside(Blkdebug::default().flushes_fail_from(FLUSHES_BEFORE_FAILING));
    let mut vm = boot(&image, disk, port, stats_port, &faults);
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    let mut acked = Vec::new();
    let failed = (0..3 * FLUSHES_BEFORE_FAILING as u8).find_map(|i| {
        let name = format!("acked{i}");
        match create_and_fsync(&mut c, &name, &pattern(i, 20_000)) {
            Ok(()) => {
                acked.push((name, pattern(i, 20_000)));
                c.clunk(1).unwrap();
                None
            }
            Err(e) => Some(e),
        }
    });
    assert_eq!(
        failed,
        Some(Errno::EIO),
        "no fsync failed ({} acknowledged)",
        acked.len()
    );
    assert!(
        !acked.is_empty(),
        "the first fsync failed already: the mount used more FLUSHes than expected"
    );
    let injected = faults.injected(stats_port);
    expect_failed(c, vm, stats_port);
    let what = format!(
        "every FLUSH failing from outside after {} acknowledged fsyncs",
        acked.len()
    );
    expect_healed(&image, disk, (port, stats_port), &acked, injected, &what);
}

#[test]
fn failed_flushes_from_outside_on_nvme_lose_nothing_acknowledged() {
    flushes_failing_from_outside("nvme", 17012, 17013);
}

#[test]
fn failed_flushes_from_outside_on_virtio_blk_lose_nothing_acknowledged() {
    flushes_failing_from_outside("virtio", 17014, 17015);
}

/// The log unreadable at mount (`fault=read-range` over the log area, from
/// `ninefold dump`): the mount fails with the block named instead of dropping the
/// acknowledged commits after it; rebooted on a healthy disk, they are all there.
#[test]
fn an_unreadable_log_fails_the_mount_and_loses_nothing() {
    let (port, stats_port) = (17016, 17017);
    let image = FsImage::formatted("256M");
    let data = pattern(11, 20_000);
    let mut vm = boot(&image, "nvme", port, stats_port, &Faults::None);
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    create_and_fsync(&mut c, "acked", &data).expect("fsync");
    vm.stop();

    // "log START+BLOCKS" in the superblock's dump, in 4 KiB blocks.
    let dump = std::process::Command::new(ninefold_tests::tool())
        .arg("dump")
        .arg(image.path())
        .output()
        .expect("running ninefold dump");
    let dump = String::from_utf8_lossy(&dump.stdout);
    let (start, blocks) = dump
        .split_whitespace()
        .skip_while(|w| *w != "log")
        .nth(1)
        .and_then(|w| w.split_once('+'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .unwrap_or_else(|| panic!("no log area in the dump:\n{dump}"));
    let faults = Faults::Kernel(format!("read-range:{}-{}", start * 8, (start + blocks) * 8));
    let mut vm = boot(&image, "nvme", port, stats_port, &faults);
    vm.wait_for_event(
        "ready",
        json!({"serving": false, "reason": "no_filesystem"}),
    );
    let boot1 = vm.stop();
    // The read error that stopped the mount, injected in the log area.
    let failed = boot1.expect_event("mount_failed", json!({"reason": "mount_failed"}));
    let injected = failed["injected_errors"].as_u64().unwrap_or(0);
    assert!(
        injected >= 1,
        "no injected error stopped the mount: {failed}"
    );
    boot1.expect_no_panic();

    let acked = [("acked".to_string(), data)];
    let what = "the log unreadable at mount";
    expect_healed(&image, "nvme", (port, stats_port), &acked, injected, what);
}
