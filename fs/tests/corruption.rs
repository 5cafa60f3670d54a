//! Flipping bytes of an image: fsck must report every flip in live metadata or data,
//! and the mounted filesystem must answer with correct data or EIO — never wrong data,
//! never a panic.

use block::MemDisk;
use fsck::{fsck, FsckOptions, Report};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use testkit::testing::{ManualClock, VisibleState};
use vfs::{Errno, FileSystem, Owner, Timespec, XattrMode, ROOT_INO};

const OWNER: Owner = Owner { uid: 1, gid: 2 };

fn clock() -> ManualClock {
    ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 5,
    })
}

fn mount(disk: MemDisk) -> Result<NineFs<MemDisk>, ninefs::volume::MountError> {
    pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(clock()),
    ))
}

/// A small filesystem with a bit of everything, cleanly unmounted.
fn build() -> Vec<u8> {
    let disk = MemDisk::new(4096, 4096);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        uuid: [9; 16],
        secret: 77,
        now: vfs::Clock::now(&clock()),
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    let fs = mount(disk).unwrap();
    pollster::block_on(async {
        let d = fs.mkdir(ROOT_INO, b"dir", 0o755, OWNER).await.unwrap();
        for i in 0..40u32 {
            let name = format!("file{i}");
            let f = fs
                .create(d.ino, name.as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            let data: Vec<u8> = (0..(i as usize * 1500))
                .map(|j| (j as u32 * 31 + i) as u8)
                .collect();
            fs.write(f.ino, 0, &data).await.unwrap();
            if i % 5 == 0 {
                fs.setxattr(f.ino, b"user.small", b"value", XattrMode::Upsert)
                    .await
                    .unwrap();
                fs.setxattr(f.ino, b"user.big", &vec![i as u8; 5000], XattrMode::Upsert)
                    .await
                    .unwrap();
            }
        }
        let src = fs.lookup(d.ino, b"file30").await.unwrap();
        let dst = fs.create(ROOT_INO, b"clone", 0o600, OWNER).await.unwrap();
        fs.clone_range(src.ino, 0, dst.ino, 0, src.size)
            .await
            .unwrap();
        fs.symlink(ROOT_INO, b"link", &vec![b'x'; 3000], OWNER)
            .await
            .unwrap();
    });
    let disk = pollster::block_on(fs.unmount()).unwrap();
    disk.snapshot()
}

fn check(image: &[u8]) -> Report {
    let disk = MemDisk::from_bytes(4096, image.to_vec());
    pollster::block_on(fsck(&disk, &FsckOptions::default())).expect("fsck runs")
}

/// Mounts the corrupted image and walks it: whatever it returns must match the original
/// or be an EIO.
fn assert_no_wrong_data(image: Vec<u8>, original: &VisibleState, what: &str) {
    let Ok(fs) = mount(MemDisk::from_bytes(4096, image)) else {
        return; // refusing to mount is fine
    };
    let state = VisibleState::capture_blocking(&fs);
    for a in &state.anomalies {
        assert!(a.contains("EIO"), "{what}: anomaly other than EIO: {a}");
    }
    for (path, node) in &state.nodes {
        let orig = original
            .nodes
            .get(path)
            .unwrap_or_else(|| panic!("{what}: new path {path:?}"));
        if node != orig {
            let p = testkit::testing::show_path(path);
            assert!(
                state
                    .anomalies
                    .iter()
                    .any(|a| a.starts_with(&format!("{p}:"))),
                "{what}: {p} differs without an error"
            );
        }
    }
}

#[test]
fn flips_in_live_metadata_and_data_are_caught() {
    let image = build();
    let report = check(&image);
    assert!(report.is_clean(), "{:#?}", report.errors);
    let original = {
        let fs = mount(MemDisk::from_bytes(4096, image.clone())).unwrap();
        VisibleState::capture_blocking(&fs)
    };
    assert!(original.anomalies.is_empty());
    let mut rng = oorandom::Rand64::new(0x0bad_5eed);
    let trials: u64 = std::env::var("CORRUPTION_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let meta_blocks: u64 = report.metadata_blocks.iter().map(|r| r.1).sum();
    let data_blocks: u64 = report.data_blocks.iter().map(|r| r.1).sum();
    assert!(meta_blocks > 10 && data_blocks > 50);
    for t in 0..trials {
        // Alternate metadata and data; pick a block uniformly within the live ones.
        let (ranges, n) = if t % 2 == 0 {
            (&report.metadata_blocks, meta_blocks)
        } else {
            (&report.data_blocks, data_blocks)
        };
        let mut pick = rng.rand_range(0..n);
        let block = ranges
            .iter()
            .find_map(|&(start, len)| {
                if pick < len {
                    Some(start + pick)
                } else {
                    pick -= len;
                    None
                }
            })
            .unwrap();
        let byte = rng.rand_range(0..4096) as usize;
        let bit = 1u8 << rng.rand_range(0..8);
        let mut bad = image.clone();
        bad[block as usize * 4096 + byte] ^= bit;
        let what = format!("trial {t}: flip of bit {bit:#x} at block {block} byte {byte}");
        let r = check(&bad);
        assert!(!r.is_clean(), "{what}: fsck found nothing");
        assert_no_wrong_data(bad, &original, &what);
    }
}

#[test]
fn corrupt_data_block_reads_eio() {
    let image = build();
    let report = check(&image);
    let (start, _) = report.data_blocks[report.data_blocks.len() / 2];
    let mut bad = image.clone();
    bad[start as usize * 4096 + 100] ^= 0xff;
    let fs = mount(MemDisk::from_bytes(4096, bad)).unwrap();
    let state = VisibleState::capture_blocking(&fs);
    assert!(
        state.anomalies.iter().any(|a| a.contains("EIO")),
        "no read failed: {:?}",
        state.anomalies
    );
    assert!(fs.stats().corruptions > 0);
    // Other files still read fine.
    assert!(state.nodes.len() > 10);
    let _ = Errno::EIO;
}

#[test]
fn both_superblocks_gone_is_an_operational_error() {
    let mut image = build();
    image[4096 + 20] ^= 1;
    image[8192 + 20] ^= 1;
    let disk = MemDisk::from_bytes(4096, image);
    assert!(pollster::block_on(fsck(&disk, &FsckOptions::default())).is_err());
    assert!(mount(disk).is_err());
}
