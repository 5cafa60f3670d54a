//! Snapshot streams at a few GiB (issue 28): a filesystem of 2 GiB in 2,048 files of
//! 1 MiB, 1% of them rewritten (plus a rename and a chmod) between two snapshots; the
//! full send of the second against the incremental one and against reading the changed
//! files whole (what copying them through a mount reads). Bytes and device reads are
//! counted; times are the host's (`make bench-host`). Nothing passes or fails here.

use std::time::Instant;

use block::{CountingDisk, MemDisk};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, SetAttr, ROOT_INO};

const FILES: u32 = 2048;
const FILE_BYTES: usize = 1 << 20;
/// 1% of the files.
const CHANGED: u32 = FILES / 100;

fn main() {
    // 2 GiB of data and room for two snapshots' worth of change.
    let disk = CountingDisk::new(MemDisk::new(4096, (2u64 << 30) / 4096 + 256 * 1024));
    pollster::block_on(format(&disk, &FormatOptions::default())).unwrap();
    let fs = pollster::block_on(NineFs::mount(
        &disk,
        MountOptions::default(),
        Box::new(ManualClock::default()),
    ))
    .unwrap();
    let owner = Owner::default();
    let t = Instant::now();
    let files = pollster::block_on(async {
        let mut files = Vec::new();
        for d in 0..(FILES / 64) {
            let dir = fs
                .mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, owner)
                .await
                .unwrap();
            for f in 0..64u32 {
                let file = fs
                    .create(dir.ino, format!("f{f}").as_bytes(), 0o644, owner)
                    .await
                    .unwrap();
                fs.write(file.ino, 0, &vec![(d * 64 + f) as u8; FILE_BYTES])
                    .await
                    .unwrap();
                files.push(file.ino);
            }
        }
        fs.snapshot_create("a").await.unwrap();
        // 1% rewritten, spread over the tree; a directory renamed; a file chmodded.
        for i in 0..CHANGED {
            let ino = files[(i * 100) as usize];
            fs.write(ino, 0, &vec![0xeeu8; FILE_BYTES]).await.unwrap();
        }
        fs.rename(ROOT_INO, b"d3", ROOT_INO, b"moved")
            .await
            .unwrap();
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        fs.setattr(files[7], set).await.unwrap();
        fs.snapshot_create("b").await.unwrap();
        files
    });
    println!(
        "made {} files of {} KiB ({} MiB), {} rewritten, in {:.1?}",
        FILES,
        FILE_BYTES >> 10,
        (FILES as usize * FILE_BYTES) >> 20,
        CHANGED,
        t.elapsed()
    );

    let measure = |what: &str, base: Option<&str>| {
        let reads = disk.counters().bytes_read;
        let t = Instant::now();
        let mut bytes = 0u64;
        let stats = pollster::block_on(fs.send("b", base, &mut |b: &[u8]| {
            bytes += b.len() as u64;
            Ok(())
        }))
        .unwrap();
        let read = disk.counters().bytes_read - reads;
        println!(
            "{what}: stream {:.1} MiB, device read {:.1} MiB, {} nodes, in {:.2?}",
            bytes as f64 / (1 << 20) as f64,
            read as f64 / (1 << 20) as f64,
            stats.nodes_read,
            t.elapsed()
        );
        (bytes, read)
    };
    let (full, full_read) = measure("full send of b", None);
    let (incr, incr_read) = measure("incremental send a -> b", Some("a"));
    // Copying the changed files through a mount reads them whole (and the client must
    // know which they are: a stream says so itself).
    let reads = disk.counters().bytes_read;
    let t = Instant::now();
    let mut copied = 0u64;
    pollster::block_on(async {
        let mut buf = vec![0u8; FILE_BYTES];
        for i in 0..CHANGED {
            copied += fs
                .read(files[(i * 100) as usize], 0, &mut buf)
                .await
                .unwrap() as u64;
        }
    });
    let copy_read = disk.counters().bytes_read - reads;
    println!(
        "copying the {CHANGED} changed files: {:.1} MiB, device read {:.1} MiB, in {:.2?}",
        copied as f64 / (1 << 20) as f64,
        copy_read as f64 / (1 << 20) as f64,
        t.elapsed()
    );
    println!(
        "incremental / full: stream {:.2}%, device reads {:.2}%; incremental / copying the changed files: {:.2}x the bytes",
        100.0 * incr as f64 / full as f64,
        100.0 * incr_read as f64 / full_read as f64,
        incr as f64 / copied as f64
    );
}
