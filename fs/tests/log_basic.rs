//! The fsync log end to end, without crash enumeration: what an fsync writes, and what
//! mount recovers when the filesystem is dropped without unmounting.

use fs::block::{BlockDevice, MemDisk};
use fs::sim::RecordingDisk;
use fs::testing::ManualClock;
use fs::vfs::{FileSystem, Owner, ROOT_INO};
use fs::volume::{format, FormatOptions, MountOptions, NineFs};
use pollster::block_on;

const OWNER: Owner = Owner { uid: 1, gid: 1 };

fn fresh(blocks: u64) -> MemDisk {
    let disk = MemDisk::new(4096, blocks);
    block_on(format(
        &disk,
        &FormatOptions {
            node_size: 16 * 1024,
            ..FormatOptions::default()
        },
    ))
    .unwrap();
    disk
}

fn mount<D: BlockDevice>(disk: D) -> NineFs<D> {
    block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(ManualClock::default()),
    ))
    .unwrap()
}

/// "Crash": take the device's content as it is now (MemDisk writes are immediate).
fn crash(fs: NineFs<RecordingDisk<MemDisk>>) -> MemDisk {
    let bytes = fs.device().inner().snapshot();
    drop(fs);
    MemDisk::from_bytes(4096, bytes)
}

#[test]
fn fsync_is_one_flush_and_no_node_writes_and_survives() {
    let (disk, rec) = RecordingDisk::new(fresh(4096));
    let fs = mount(disk);
    let d = block_on(fs.mkdir(ROOT_INO, b"d", 0o755, OWNER)).unwrap();
    let f = block_on(fs.create(d.ino, b"f", 0o644, OWNER)).unwrap();
    block_on(fs.write(f.ino, 0, &[7u8; 10_000])).unwrap();
    let before = (rec.counters(), fs.stats());
    block_on(fs.fsync(f.ino, false)).unwrap();
    let after = (rec.counters(), fs.stats());
    assert_eq!(after.0.flushes - before.0.flushes, 1, "one flush per fsync");
    assert_eq!(after.0.fua_writes, before.0.fua_writes, "no FUA");
    assert_eq!(
        after.1.node_writes.total_writes(),
        before.1.node_writes.total_writes(),
        "no node writes"
    );
    assert_eq!(after.1.total_checkpoints(), before.1.total_checkpoints());
    assert_eq!(after.1.log.commits, 1);
    // Everything this fsync wrote: one log block (the new directory included).
    assert_eq!(after.0.bytes_written - before.0.bytes_written, 4096);

    let fs = mount(crash(fs));
    let s = fs.stats().log;
    assert_eq!(s.replayed_commits, 1);
    assert!(s.replayed_inodes >= 2, "the file and its new directory");
    let d2 = block_on(fs.lookup(ROOT_INO, b"d")).unwrap();
    let f2 = block_on(fs.lookup(d2.ino, b"f")).unwrap();
    assert_eq!(f2.size, 10_000);
    let mut buf = vec![0u8; 10_000];
    assert_eq!(block_on(fs.read(f2.ino, 0, &mut buf)).unwrap(), 10_000);
    assert!(buf.iter().all(|&b| b == 7));
    let disk = block_on(fs.unmount()).unwrap();
    let report = block_on(fs::fsck::fsck(&disk, &Default::default())).unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
}

#[test]
fn unsynced_changes_are_lost_whole_and_replay_is_idempotent() {
    let (disk, _rec) = RecordingDisk::new(fresh(4096));
    let fs = mount(disk);
    let a = block_on(fs.create(ROOT_INO, b"a", 0o644, OWNER)).unwrap();
    block_on(fs.write(a.ino, 0, b"hello")).unwrap();
    block_on(fs.fsync(a.ino, false)).unwrap();
    block_on(fs.write(a.ino, 0, b"HELLO world")).unwrap();
    let b = block_on(fs.create(ROOT_INO, b"b", 0o644, OWNER)).unwrap();
    block_on(fs.write(b.ino, 0, b"not synced")).unwrap();
    let image = crash(fs);
    // Mount twice from the same crashed image: the same result (a crash during replay
    // replays again).
    for _ in 0..2 {
        let copy = MemDisk::from_bytes(4096, image.snapshot());
        let fs = mount(copy);
        let a2 = block_on(fs.lookup(ROOT_INO, b"a")).unwrap();
        let mut buf = vec![0u8; 64];
        let n = block_on(fs.read(a2.ino, 0, &mut buf)).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert!(block_on(fs.lookup(ROOT_INO, b"b")).is_err());
        let disk = block_on(fs.unmount()).unwrap();
        let report = block_on(fs::fsck::fsck(&disk, &Default::default())).unwrap();
        assert!(report.is_clean(), "{:#?}", report.errors);
    }
}
