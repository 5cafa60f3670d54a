//! Growth: a filesystem on a device that got bigger uses the new space at the next mount
//! (within its last group, and with groups added), keeps its data, checks clean, and a
//! crash at any write of the grow leaves the old size or the new, never a broken image.

use block::{FaultDisk, FileDisk, IoError, MemDisk};
use fsck::{fsck, FsckOptions};
use ninefs::format::bitmap::BLOCKS_PER_GROUP;
use ninefs::format::features;
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, Timespec, ROOT_INO};

const OWNER: Owner = Owner { uid: 1, gid: 2 };
const SMALL: u64 = 4096;

fn clock() -> ManualClock {
    ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 5,
    })
}

fn mount<D: block::BlockDevice>(disk: D) -> Result<NineFs<D>, ninefs::volume::MountError> {
    pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(clock()),
    ))
}

fn payload(i: u32) -> Vec<u8> {
    (0..(i as usize * 7000 + 10))
        .map(|j| (j as u32 * 13 + i) as u8)
        .collect()
}

/// Makes a filesystem filling `disk` with files `f0..f9`, cleanly unmounted.
fn populate<D: block::BlockDevice>(disk: D) -> D {
    let opts = FormatOptions {
        node_size: 16 * 1024,
        now: vfs::Clock::now(&clock()),
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    let fs = mount(disk).unwrap();
    pollster::block_on(async {
        for i in 0..10u32 {
            let f = fs
                .create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            fs.write(f.ino, 0, &payload(i)).await.unwrap();
        }
        fs.unmount().await.unwrap()
    })
}

/// Asserts the files are intact and fsck is clean; returns the size in blocks.
fn verify<D: block::BlockDevice>(fs: &NineFs<D>) -> u64 {
    pollster::block_on(async {
        for i in 0..10u32 {
            let a = fs
                .lookup(ROOT_INO, format!("f{i}").as_bytes())
                .await
                .unwrap();
            let want = payload(i);
            let mut got = vec![0u8; want.len() + 10];
            let n = fs.read(a.ino, 0, &mut got).await.unwrap();
            assert_eq!(&got[..n], &want[..], "f{i}");
        }
    });
    fs.superblock().layout.total_blocks
}

/// `disk`'s content on a device of `blocks` blocks.
fn grown(disk: MemDisk, blocks: u64) -> MemDisk {
    let mut bytes = disk.snapshot();
    bytes.resize(blocks as usize * 4096, 0);
    MemDisk::from_bytes(4096, bytes)
}

fn fsck_clean<D: block::BlockDevice>(disk: D) {
    let r = pollster::block_on(fsck(disk, &FsckOptions::default())).unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
}

#[test]
fn a_bigger_device_is_used_at_mount_within_the_last_group() {
    let disk = grown(populate(MemDisk::new(4096, SMALL)), 3 * SMALL);
    let fs = mount(&disk).unwrap();
    let statfs = pollster::block_on(fs.statfs()).unwrap();
    assert_eq!(verify(&fs), 3 * SMALL);
    let s = fs.stats();
    assert_eq!((s.grows, s.grown_blocks), (1, 2 * SMALL));
    assert_eq!(
        s.checkpoints[ninefs::volume::CheckpointCause::Grow.index()],
        1
    );
    assert!(statfs.blocks_free > 2 * SMALL, "{statfs:?}");
    // The new space is usable: a file larger than the old filesystem.
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"big", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, &vec![7u8; (SMALL as usize + 100) * 4096])
            .await
            .unwrap();
    });
    assert_eq!(fs.superblock().incompat & features::INCOMPAT_GROWN, 0);
    pollster::block_on(fs.unmount()).unwrap();
    fsck_clean(&disk);
    // Mounting again grows nothing.
    assert_eq!(mount(&disk).unwrap().stats().grows, 0);
}

#[test]
fn groups_are_added_with_their_bitmaps_in_place() {
    let dir = std::env::temp_dir().join(format!("ninefold-grow-{}", std::process::id()));
    let path = dir.with_extension("img");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(SMALL * 4096).unwrap();
    populate(FileDisk::open(&path, 4096, true).unwrap());
    // The backing file grows (sparse): two more groups and a bit.
    let big = 3 * BLOCKS_PER_GROUP + 100;
    file.set_len(big * 4096).unwrap();
    let fs = mount(FileDisk::open(&path, 4096, true).unwrap()).unwrap();
    assert_eq!(verify(&fs), big);
    let sb = fs.superblock();
    assert_eq!(sb.layout.groups, 4);
    assert_ne!(sb.incompat & features::INCOMPAT_GROWN, 0);
    let free = pollster::block_on(fs.statfs()).unwrap().blocks_free;
    assert!(free > big - SMALL - 10, "{free}");
    let disk = pollster::block_on(fs.unmount()).unwrap();
    fsck_clean(&disk);
    drop(disk);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_crash_during_the_grow_leaves_the_old_size_or_the_new() {
    let image = grown(populate(MemDisk::new(4096, SMALL)), 2 * SMALL).snapshot();
    let mut outcomes = [0usize; 2];
    for n in 0..40 {
        let disk = MemDisk::from_bytes(4096, image.clone());
        let faulty = FaultDisk::new(&disk, 1);
        faulty.inject(block::Fault::NthWrite(n), IoError::Device(1));
        // A failed write stops the mount: nothing after it reaches the disk, as if the
        // power went at that write.
        let finished = mount(&faulty).is_ok();
        // What the crash left, before a mount grows it again.
        let size = pollster::block_on(fsck::inspect::Image::open(&disk))
            .unwrap()
            .sb
            .layout
            .total_blocks;
        assert!(size == SMALL || size == 2 * SMALL, "write {n}: {size}");
        outcomes[usize::from(size == 2 * SMALL)] += 1;
        fsck_clean(&disk);
        let fs = mount(&disk).unwrap_or_else(|e| panic!("write {n}: {e}"));
        assert_eq!(verify(&fs), 2 * SMALL);
        if finished && faulty.counters().injected_errors == 0 {
            break;
        }
    }
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}
