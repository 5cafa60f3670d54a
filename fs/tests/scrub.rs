//! Scrub finds every flipped byte in the committed trees' nodes and in file data, names
//! the tree and level of a node and the file of a data block, and reports nothing on a
//! sound image.

use block::MemDisk;
use fsck::{fsck, FsckOptions, Report};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs, ScrubError, ScrubProgress};
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, Timespec, ROOT_INO};

const OWNER: Owner = Owner { uid: 1, gid: 2 };

fn clock() -> ManualClock {
    ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 5,
    })
}

fn mount(disk: &MemDisk) -> NineFs<&MemDisk> {
    pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(clock()),
    ))
    .expect("mounts")
}

/// A small, cleanly unmounted filesystem: `/dir/fileN` of various sizes.
fn build() -> Vec<u8> {
    let disk = MemDisk::new(4096, 4096);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        now: vfs::Clock::now(&clock()),
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    let fs = mount(&disk);
    pollster::block_on(async {
        let d = fs.mkdir(ROOT_INO, b"dir", 0o755, OWNER).await.unwrap();
        for i in 0..60u32 {
            let name = format!("file{i}");
            let f = fs
                .create(d.ino, name.as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            let data: Vec<u8> = (0..(i as usize * 1500))
                .map(|j| (j as u32 * 31 + i) as u8)
                .collect();
            fs.write(f.ino, 0, &data).await.unwrap();
        }
        fs.unmount().await.unwrap();
    });
    disk.snapshot()
}

fn check(image: &[u8]) -> Report {
    let disk = MemDisk::from_bytes(4096, image.to_vec());
    pollster::block_on(fsck(&disk, &FsckOptions::default())).expect("fsck runs")
}

/// Mounts `image`, flips a byte in each of `blocks` underneath the mounted filesystem,
/// scrubs in small steps and returns the errors.
fn scrub_with_flips(image: &[u8], blocks: &[u64]) -> Vec<ScrubError> {
    let disk = MemDisk::from_bytes(4096, image.to_vec());
    let fs = mount(&disk);
    disk.with_bytes(|b| {
        for &blk in blocks {
            b[blk as usize * 4096 + 1234] ^= 0x40;
        }
    });
    pollster::block_on(async {
        assert!(fs.scrub_start().await.unwrap());
        assert!(fs.scrub_running());
        while fs.scrub_step(64 * 1024).await.unwrap() == ScrubProgress::Running {}
        let report = fs.scrub_report().unwrap();
        assert!(report.complete && !fs.scrub_running());
        assert_eq!(report.error_count as usize, report.errors.len());
        let stats = fs.stats();
        assert_eq!(stats.scrub_runs, 1);
        assert_eq!(stats.scrub_errors, report.error_count);
        assert_eq!(stats.scrub_bytes, report.bytes);
        report.errors
    })
}

/// The committed node extents of `report` (past the fixed regions).
fn nodes(report: &Report, image: &[u8]) -> Vec<(u64, u64)> {
    let disk = MemDisk::from_bytes(4096, image.to_vec());
    let data_start = mount(&disk).superblock().layout.data_start();
    report
        .metadata_blocks
        .iter()
        .copied()
        .filter(|&(a, _)| a >= data_start)
        .collect()
}

#[test]
fn a_sound_image_scrubs_clean_and_reads_everything() {
    let image = build();
    let report = check(&image);
    assert!(report.is_clean(), "{:#?}", report.errors);
    let disk = MemDisk::from_bytes(4096, image.clone());
    let fs = mount(&disk);
    let r = pollster::block_on(fs.scrub_all()).unwrap();
    assert!(
        r.complete && r.errors.is_empty() && r.skipped == 0,
        "{r:#?}"
    );
    let data: u64 = report.data_blocks.iter().map(|r| r.1).sum();
    assert_eq!(r.data_blocks, data);
    assert_eq!(r.nodes as usize, nodes(&report, &image).len());
    // A pass can be stopped, and a new one started; a small budget takes several steps.
    pollster::block_on(async {
        assert!(fs.scrub_start().await.unwrap());
        let mut steps = 1;
        while fs.scrub_step(64 * 1024).await.unwrap() == ScrubProgress::Running {
            steps += 1;
        }
        assert!(steps as u64 > r.bytes / (64 * 1024) / 2, "{steps} steps");
        assert_eq!(fs.stats().scrub_runs, 2);
        assert!(fs.scrub_start().await.unwrap());
        assert!(!fs.scrub_start().await.unwrap());
        assert!(fs.scrub_stop());
        assert!(fs.scrub_report().unwrap().stopped);
        assert_eq!(fs.scrub_step(1).await.unwrap(), ScrubProgress::Idle);
    });
}

#[test]
fn every_flipped_data_block_is_found_and_named_by_its_file() {
    let image = build();
    let report = check(&image);
    // One block out of every data extent, all at once.
    let flipped: Vec<u64> = report.data_blocks.iter().map(|&(s, n)| s + n / 2).collect();
    assert!(flipped.len() > 20);
    let errors = scrub_with_flips(&image, &flipped);
    assert_eq!(errors.len(), flipped.len(), "{errors:#?}");
    for b in &flipped {
        let e = errors
            .iter()
            .find(|e| matches!(e, ScrubError::Data { block, .. } if block == b))
            .unwrap_or_else(|| panic!("block {b} not reported: {errors:#?}"));
        let ScrubError::Data { owner, .. } = e else {
            unreachable!()
        };
        let owner = owner.as_ref().expect("owner found");
        let path = owner.path.as_deref().expect("path found");
        assert!(path.starts_with("/dir/file"), "{path}");
        assert_eq!(owner.offset % 4096, 0);
        assert!(e.to_string().contains(path));
    }
}

#[test]
fn every_flipped_node_is_found_with_its_tree_and_level() {
    let image = build();
    let report = check(&image);
    let nodes = nodes(&report, &image);
    assert!(nodes.len() >= 3);
    for &(addr, blocks) in &nodes {
        // The flip lands in the node's last committed block.
        let errors = scrub_with_flips(&image, &[addr + blocks - 1]);
        assert!(
            errors
                .iter()
                .any(|e| matches!(e, ScrubError::Node { addr: a, .. } if *a == addr)),
            "node at {addr}: {errors:#?}"
        );
    }
}
