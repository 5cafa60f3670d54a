//! Rough measurements of the filesystem on a RAM disk: sequential write and read of
//! 256 MiB, 20,000 small files. `make bench-host` (or `cargo bench -p ninefold-fs
//! --bench fs_measure`) prints the figures; nothing here passes or fails on time.

use std::sync::OnceLock;
use std::time::Instant;

use block::MemDisk;
use ninefs::volume::{format, FormatOptions, LockStats, MountOptions, NineFs};
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, ROOT_INO};

/// Nanoseconds since the first call: times the core lock's holds.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn fresh(blocks: u64) -> NineFs<MemDisk> {
    let disk = MemDisk::new(4096, blocks);
    pollster::block_on(format(&disk, &FormatOptions::default())).unwrap();
    let options = MountOptions {
        hold_clock: Some(now_ns),
        ..MountOptions::default()
    };
    pollster::block_on(NineFs::mount(
        disk,
        options,
        Box::new(ManualClock::default()),
    ))
    .unwrap()
}

/// The core lock's use between `before` and `after`, one line.
fn lock_use(before: LockStats, after: LockStats) -> String {
    let acquisitions = after.acquisitions - before.acquisitions;
    let hold_ns = after.hold_ns - before.hold_ns;
    format!(
        "core lock: {acquisitions} acquisitions, held {:.1} ms, mean {} ns, longest so far {} us",
        hold_ns as f64 / 1e6,
        hold_ns.checked_div(acquisitions).unwrap_or(0),
        after.max_hold_ns / 1000
    )
}

fn main() {
    let owner = Owner::default();
    let fs = fresh(256 * 1024);
    let data = vec![0x5au8; 1 << 20];
    let before = fs.stats().core_lock;
    let t = Instant::now();
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"big", 0o644, owner).await.unwrap();
        for i in 0..256u64 {
            fs.write(f.ino, i << 20, &data).await.unwrap();
        }
        fs.sync().await.unwrap();
    });
    let s = fs.stats();
    println!(
        "sequential write 256 MiB (1 MiB writes) + sync: {:?}, {} checkpoints, {} node writes, {} node bytes",
        t.elapsed(),
        s.total_checkpoints(),
        s.node_writes.total_writes(),
        s.node_writes.total_bytes()
    );
    println!("  {}", lock_use(before, s.core_lock));
    let before = s.core_lock;
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    pollster::block_on(async {
        let f = fs.lookup(ROOT_INO, b"big").await.unwrap();
        for i in 0..256u64 {
            fs.read(f.ino, i << 20, &mut buf).await.unwrap();
        }
    });
    println!(
        "sequential read 256 MiB (1 MiB reads, checksums verified): {:?}",
        t.elapsed()
    );
    println!("  {}", lock_use(before, fs.stats().core_lock));

    let fs = fresh(64 * 1024);
    let before = fs.stats().core_lock;
    let t = Instant::now();
    pollster::block_on(async {
        for d in 0..10u32 {
            let dir = fs
                .mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, owner)
                .await
                .unwrap();
            for i in 0..2000u32 {
                let f = fs
                    .create(dir.ino, format!("file-{i}").as_bytes(), 0o644, owner)
                    .await
                    .unwrap();
                fs.write(f.ino, 0, &[1u8; 100]).await.unwrap();
            }
        }
        fs.sync().await.unwrap();
    });
    let s = fs.stats();
    println!(
        "20k creates + 100-byte writes + sync: {:?}, {} checkpoints, node writes per cause {:?}, bytes {}",
        t.elapsed(),
        s.total_checkpoints(),
        s.node_writes.writes,
        s.node_writes.total_bytes()
    );
    println!("  {}", lock_use(before, s.core_lock));
}
