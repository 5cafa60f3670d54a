//! The fsync log end to end, without crash enumeration: what an fsync writes, and what
//! mount recovers when the filesystem is dropped without unmounting.

use block::RecordingDisk;
use block::{BlockDevice, MemDisk};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use pollster::block_on;
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, ROOT_INO};

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
    let report = block_on(fsck::fsck(&disk, &Default::default())).unwrap();
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
        let report = block_on(fsck::fsck(&disk, &Default::default())).unwrap();
        assert!(report.is_clean(), "{:#?}", report.errors);
    }
}

/// Device read errors at mount are neither the log's end nor missing data.
mod read_errors {
    use super::*;
    use block::{Fault, FaultDisk, IoError};
    use vfs::Errno;

    /// A crashed image holding `keep` (fsynced, the first commit) and then `last`
    /// (fsynced, the last commit), each file's 8 blocks of one repeated byte.
    fn crashed() -> MemDisk {
        let (disk, _rec) = RecordingDisk::new(fresh(4096));
        let fs = mount(disk);
        for (name, byte) in [(&b"keep"[..], 0x11u8), (b"last", 0x77)] {
            let f = block_on(fs.create(ROOT_INO, name, 0o644, OWNER)).unwrap();
            block_on(fs.write(f.ino, 0, &[byte; 8 * 4096])).unwrap();
            block_on(fs.fsync(f.ino, false)).unwrap();
        }
        crash(fs)
    }

    /// The blocks of `image` filled with `byte`.
    fn blocks_of(image: &MemDisk, byte: u8) -> core::ops::Range<u64> {
        let bytes = image.snapshot();
        let found: Vec<u64> = bytes
            .chunks(4096)
            .enumerate()
            .filter(|(_, b)| b.iter().all(|&x| x == byte))
            .map(|(i, _)| i as u64)
            .collect();
        assert_eq!(found.len(), 8, "the file's data is not where expected");
        found[0]..found[7] + 1
    }

    fn read_all(fs: &NineFs<impl BlockDevice>, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let f = block_on(fs.lookup(ROOT_INO, name))?;
        let mut buf = vec![0u8; 8 * 4096 + 1];
        let n = block_on(fs.read(f.ino, 0, &mut buf))?;
        buf.truncate(n);
        Ok(buf)
    }

    /// The last commit's data unreadable: the commit is applied (its fsync may have been
    /// acknowledged), that file's read is EIO, the other file reads back; healed, both.
    #[test]
    fn unreadable_data_of_the_last_commit_keeps_the_commit() {
        let image = crashed();
        let range = blocks_of(&image, 0x77);
        let disk = FaultDisk::new(MemDisk::from_bytes(4096, image.snapshot()), 1);
        disk.inject(Fault::ReadRange(range), IoError::Device(1));
        let fs = mount(&disk);
        assert_eq!(fs.stats().log.unverified_commits, 1);
        assert_eq!(fs.stats().log.dropped_commits, 0);
        assert_eq!(read_all(&fs, b"last"), Err(Errno::EIO));
        assert_eq!(read_all(&fs, b"keep"), Ok(vec![0x11; 8 * 4096]));
        drop(fs);
        disk.heal();
        let fs = mount(disk.inner());
        assert_eq!(read_all(&fs, b"last"), Ok(vec![0x77; 8 * 4096]));
        let disk = block_on(fs.unmount()).unwrap();
        let report = block_on(fsck::fsck(disk, &Default::default())).unwrap();
        assert!(report.is_clean(), "{:#?}", report.errors);
    }

    /// The last commit's data overwritten (its FLUSH never completed) is still dropped,
    /// even when another of its blocks cannot be read.
    #[test]
    fn differing_data_drops_the_commit_even_with_unreadable_blocks() {
        let image = crashed();
        let range = blocks_of(&image, 0x77);
        let mut bytes = image.snapshot();
        bytes[range.start as usize * 4096] ^= 1;
        let disk = FaultDisk::new(MemDisk::from_bytes(4096, bytes), 1);
        disk.inject(
            Fault::ReadRange(range.start + 3..range.start + 4),
            IoError::Device(1),
        );
        let fs = mount(&disk);
        assert_eq!(fs.stats().log.dropped_commits, 1);
        assert_eq!(read_all(&fs, b"last"), Err(Errno::ENOENT));
        assert_eq!(read_all(&fs, b"keep"), Ok(vec![0x11; 8 * 4096]));
    }

    /// An unreadable log block fails the mount (what follows it may be acknowledged);
    /// healed, the mount replays everything.
    #[test]
    fn an_unreadable_log_block_fails_the_mount() {
        let image = crashed();
        let l = mount(MemDisk::from_bytes(4096, image.snapshot()))
            .superblock()
            .layout;
        let disk = FaultDisk::new(MemDisk::from_bytes(4096, image.snapshot()), 1);
        disk.inject(
            Fault::ReadRange(l.log_start..l.log_start + l.log_blocks),
            IoError::Device(1),
        );
        let mounted = block_on(NineFs::mount(
            &disk,
            MountOptions::default(),
            Box::new(ManualClock::default()),
        ));
        assert!(mounted.is_err(), "mounted past an unreadable log");
        disk.heal();
        let fs = mount(disk.inner());
        assert_eq!(read_all(&fs, b"keep"), Ok(vec![0x11; 8 * 4096]));
        assert_eq!(read_all(&fs, b"last"), Ok(vec![0x77; 8 * 4096]));
    }
}

mod malformed {
    //! Records that pass the log's checksums but make no sense must never panic mount:
    //! it recovers, refuses the commit (and serves the filesystem read-only) or fails
    //! with an error; fsck, which replays the log the same way, reports what the mount
    //! refuses.

    use super::*;
    use ninefs::format::items::FileExtent;
    use ninefs::format::log::{encode_commit, put_name, rec, RecordWriter};
    use ninefs::util::scratch::Scratch;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = (u8, Vec<u64>, Vec<u8>)> {
        (
            1u8..=7,
            prop::collection::vec(0u64..40, 1..12),
            prop::collection::vec(any::<u8>(), 0..160),
        )
    }

    fn encode(s: &mut Scratch, (kind, nums, bytes): &(u8, Vec<u64>, Vec<u8>)) {
        let n = |i: usize| nums[i % nums.len()];
        let mut w = RecordWriter::begin(s, *kind);
        match *kind {
            rec::INODE => {
                let mut item = bytes.clone();
                item.resize(128, 0);
                // Mostly a plausible mode.
                item[..4].copy_from_slice(&(0o100644u32 | (n(1) as u32 & 0o40000)).to_le_bytes());
                w.buf().u64(n(0)).bytes(&item);
            }
            rec::NAMES => {
                w.buf().u64(n(0)).u32(2);
                for i in 0..2 {
                    w.buf().u64(n(i + 1)).u64(n(i + 3)).u8(8);
                    put_name(w.buf(), b"x");
                }
            }
            rec::XATTRS => {
                w.buf()
                    .u64(n(0))
                    .u32(1)
                    .u8(24)
                    .u64(n(1))
                    .u32(bytes.len() as u32)
                    .bytes(bytes);
            }
            rec::EXTENTS => {
                let fe = FileExtent {
                    disk_block: 100 + n(1) * 5,
                    disk_blocks: 4,
                    offset_blocks: (n(2) % 4) as u32,
                    num_blocks: 1,
                };
                w.buf()
                    .u64(n(0))
                    .u64(0)
                    .u64(64)
                    .u32(1)
                    .u64(n(3))
                    .bytes(&fe.encode());
            }
            rec::CSUM => {
                w.buf()
                    .u64(100 + n(1) * 5)
                    .u32(4)
                    .u32(1)
                    .u32(2)
                    .u32(3)
                    .u32(4);
            }
            rec::SYMLINK => {
                w.buf().u64(n(0)).u32(bytes.len() as u32).bytes(bytes);
            }
            _ => {
                w.buf().u64(n(0)).u32(1).u64(n(1)).u64(n(2)).u8(4);
                put_name(w.buf(), b"y");
                w.buf().u32(1).u64(n(3)).u64(n(4));
            }
        }
        w.end();
    }

    /// Appends a commit of `records` at sequence number `seq`; returns the next one.
    fn append(
        image: &MemDisk,
        sb: &ninefs::format::Superblock,
        seq: u64,
        records: Vec<Vec<u8>>,
    ) -> u64 {
        let l = sb.layout;
        let mut out = Vec::new();
        let blocks = encode_commit(&records, seq, sb.log_epoch, 0, &mut out);
        for b in 0..blocks {
            let at = l.log_start + (seq + b) % l.log_blocks;
            block_on(image.write(at, &out[b as usize * 4096..][..4096], Default::default()))
                .unwrap();
        }
        seq + blocks
    }

    #[test]
    fn mount_never_panics() {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: testkit::testing::strategy::cases(96),
            ..ProptestConfig::default()
        });
        let applied = std::cell::Cell::new(0);
        let refused = std::cell::Cell::new(0);
        let failed = std::cell::Cell::new(0);
        runner
            .run(&prop::collection::vec(record(), 1..8), |records| {
                // An image with a file, crashed with one commit in the log.
                let (disk, _rec) = RecordingDisk::new(fresh(2048));
                let fs = mount(disk);
                let a = block_on(fs.create(ROOT_INO, b"a", 0o644, OWNER)).unwrap();
                block_on(fs.write(a.ino, 0, &[1u8; 8192])).unwrap();
                block_on(fs.fsync(a.ino, false)).unwrap();
                let image = crash(fs);
                let dev = ninefs::io::Dev::new(&image).unwrap();
                let sb = block_on(ninefs::volume::read_superblock(&dev)).unwrap().0;
                // A commit of made-up records after it, then an empty commit (so the
                // made-up one is not the last, whose data replay verifies).
                let mut s = Scratch::with_capacity(64 << 10);
                for r in &records {
                    encode(&mut s, r);
                }
                prop_assert!(!s.overflowed());
                let next = append(&image, &sb, sb.log_tail + 1, vec![s.into_vec()]);
                append(&image, &sb, next, vec![]);
                let report = block_on(fsck::fsck(&image, &Default::default())).unwrap();
                let reported = report
                    .errors
                    .iter()
                    .any(|e| e.starts_with("fsync log") && e.contains("refused"));
                match block_on(NineFs::mount(
                    image,
                    MountOptions::default(),
                    Box::new(ManualClock::default()),
                )) {
                    Ok(fs) => {
                        let refusal = fs.refused_log_commit();
                        prop_assert_eq!(reported, refusal.is_some(), "{:#?}", report);
                        if refusal.is_some() {
                            refused.set(refused.get() + 1);
                        } else if fs.stats().log.replayed_commits == 3 {
                            applied.set(applied.get() + 1);
                        }
                        let _ = testkit::testing::VisibleState::capture_blocking(&fs);
                        let _ = block_on(fs.unmount());
                    }
                    Err(_) => failed.set(failed.get() + 1),
                }
                Ok(())
            })
            .unwrap();
        println!(
            "made-up commits: {} replayed, {} refused, {} failed the mount",
            applied.get(),
            refused.get(),
            failed.get()
        );
        assert!(applied.get() > 0 && refused.get() > 0);
    }
}
