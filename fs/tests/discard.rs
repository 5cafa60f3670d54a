//! Freed blocks go back to the device: discarded once their release is durable (never
//! before), within the discard delay even when nothing else checkpoints, and never while
//! they could be reused.

use block::{BlockDevice, MemDisk};
use fsck::{fsck, FsckOptions};
use ninefs::volume::{format, CheckpointCause, FormatOptions, MountOptions, NineFs};
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, Timespec, ROOT_INO};

const OWNER: Owner = Owner { uid: 0, gid: 0 };
const START: i64 = 1_700_000_000;

fn formatted() -> MemDisk {
    let disk = MemDisk::new(4096, 16 * 1024);
    let opts = FormatOptions {
        secret: 1,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    disk
}

/// Blocks of `disk` that hold anything but zeros.
fn nonzero_blocks(disk: &MemDisk) -> usize {
    let mut buf = vec![0u8; 4096];
    (0..disk.geometry().num_blocks)
        .filter(|&b| {
            pollster::block_on(disk.read(b, &mut buf)).unwrap();
            buf.iter().any(|&x| x != 0)
        })
        .count()
}

#[test]
fn deleted_files_are_discarded_after_the_delay_and_not_before() {
    let disk = formatted();
    let clock = ManualClock::new(Timespec {
        sec: START,
        nsec: 0,
    });
    let fs = pollster::block_on(NineFs::mount(
        &disk,
        MountOptions::default(),
        Box::new(clock.clone()),
    ))
    .unwrap();
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"big", 0o644, OWNER).await.unwrap();
        let data = vec![0x5au8; 8 << 20];
        fs.write(f.ino, 0, &data).await.unwrap();
        fs.sync().await.unwrap();
        let full = nonzero_blocks(&disk);
        assert!(full >= 2048, "{full} blocks in use after writing 8 MiB");

        fs.unlink(ROOT_INO, b"big").await.unwrap();
        fs.housekeeping().await.unwrap();
        // Within the delay: nothing is given back yet (the release is not durable).
        clock.set(Timespec {
            sec: START + 10,
            nsec: 0,
        });
        fs.housekeeping().await.unwrap();
        assert_eq!(fs.stats().discards, 0);
        assert!(nonzero_blocks(&disk) >= 2048);

        // Past it: a Discard checkpoint commits the release, then the blocks go back.
        clock.set(Timespec {
            sec: START + 25,
            nsec: 0,
        });
        fs.housekeeping().await.unwrap();
        let s = fs.stats();
        assert_eq!(s.checkpoints[CheckpointCause::Discard.index()], 1);
        assert!(s.discarded_blocks >= 2048, "{s:?}");
        let left = nonzero_blocks(&disk);
        assert!(
            left + 2000 <= full,
            "{left} of {full} blocks still hold data"
        );

        // The freed blocks are reusable, the filesystem whole.
        let g = fs.create(ROOT_INO, b"again", 0o644, OWNER).await.unwrap();
        fs.write(g.ino, 0, &data).await.unwrap();
        fs.sync().await.unwrap();
        let mut back = vec![0u8; data.len()];
        let n = fs.read(g.ino, 0, &mut back).await.unwrap();
        assert!(
            n == data.len() && back == data,
            "the rewritten file reads back wrong"
        );
    });
    drop(fs);
    let report = pollster::block_on(fsck(&disk, &FsckOptions::default())).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn discard_can_be_turned_off() {
    let disk = formatted();
    let clock = ManualClock::new(Timespec {
        sec: START,
        nsec: 0,
    });
    let opts = MountOptions {
        discard: None,
        ..MountOptions::default()
    };
    let fs = pollster::block_on(NineFs::mount(&disk, opts, Box::new(clock.clone()))).unwrap();
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"big", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, &vec![1u8; 1 << 20]).await.unwrap();
        fs.unlink(ROOT_INO, b"big").await.unwrap();
        fs.sync().await.unwrap();
        clock.set(Timespec {
            sec: START + 100,
            nsec: 0,
        });
        fs.housekeeping().await.unwrap();
    });
    assert_eq!(fs.stats().discards, 0);
    assert_eq!(fs.stats().checkpoints[CheckpointCause::Discard.index()], 0);
}
