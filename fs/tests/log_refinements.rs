//! The fsync log's refinements, each shown by its counter (and the result checked after
//! a crash and replay): `last_reflink_trans`, `no_xattrs`, scratch buffers reserved
//! before locks, group commit, log reclaim, and the checkpoint fallbacks.

use block::{BlockDevice, MemDisk};
use block::{RecordingDisk, YieldDisk};
use ninefs::synclog::Fallback;
use ninefs::volume::{
    format, CheckpointCause, FormatOptions, MountOptions, NineFs, Pressure, WritePolicy,
};
use pollster::block_on;
use testkit::testing::ManualClock;
use vfs::{FileSystem, Ino, Owner, XattrMode, ROOT_INO};

const OWNER: Owner = Owner { uid: 1, gid: 1 };

type Disk = RecordingDisk<YieldDisk<MemDisk>>;

fn image(blocks: u64) -> MemDisk {
    let disk = MemDisk::new(4096, blocks);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        ..FormatOptions::default()
    };
    block_on(format(&disk, &opts)).unwrap();
    disk
}

fn mount_with<D: BlockDevice>(disk: D, policy: Box<dyn WritePolicy>) -> NineFs<D> {
    let opts = MountOptions {
        policy,
        ..MountOptions::default()
    };
    block_on(NineFs::mount(disk, opts, Box::new(ManualClock::default()))).unwrap()
}

fn fresh(blocks: u64) -> (NineFs<Disk>, block::Recorder) {
    let (disk, rec) = RecordingDisk::new(YieldDisk::new(image(blocks)));
    (
        mount_with(disk, Box::new(ninefs::volume::PressurePolicy)),
        rec,
    )
}

/// Drops the filesystem without unmounting and mounts what the device holds (every
/// completed write: the memory disk has no cache to lose).
fn crash_and_mount(fs: NineFs<Disk>) -> NineFs<MemDisk> {
    let bytes = fs.device().inner().inner().snapshot();
    drop(fs);
    let fs = mount_with(
        MemDisk::from_bytes(4096, bytes),
        Box::new(ninefs::volume::PressurePolicy),
    );
    assert!(
        fs.stats().log.replayed_commits > 0,
        "something was replayed"
    );
    fs
}

fn file(fs: &impl FileSystem, dir: Ino, name: &str, data: &[u8]) -> Ino {
    let a = block_on(fs.create(dir, name.as_bytes(), 0o644, OWNER)).unwrap();
    if !data.is_empty() {
        block_on(fs.write(a.ino, 0, data)).unwrap();
    }
    a.ino
}

fn content(fs: &impl FileSystem, dir: Ino, name: &str) -> Vec<u8> {
    let a = block_on(fs.lookup(dir, name.as_bytes())).unwrap();
    let mut buf = vec![0u8; a.size as usize];
    let n = block_on(fs.read(a.ino, 0, &mut buf)).unwrap();
    buf.truncate(n);
    buf
}

fn fsck_clean(fs: NineFs<MemDisk>) {
    let disk = block_on(fs.unmount()).unwrap();
    let r = block_on(fsck::fsck(&disk, &Default::default())).unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
}

#[test]
fn last_reflink_trans_skips_the_checksum_index() {
    let (fs, _) = fresh(4096);
    let data: Vec<u8> = (0..16384u32).map(|i| (i % 251) as u8).collect();
    let a = file(&fs, ROOT_INO, "a", &data);
    block_on(fs.fsync(a, false)).unwrap();
    let s = fs.stats().log;
    assert!(s.csum_lookups_skipped >= 1, "no shared extents: no lookup");
    assert_eq!(s.csum_lookups, 0);

    // Clones make a's extent shared in this interval: b and c look the index up, and c
    // finds the checksums b logged.
    let b = file(&fs, ROOT_INO, "b", &[]);
    let c = file(&fs, ROOT_INO, "c", &[]);
    block_on(fs.clone_range(a, 0, b, 0, 16384)).unwrap();
    block_on(fs.clone_range(a, 0, c, 0, 16384)).unwrap();
    assert!(fs.inode_state(b).unwrap().last_reflink_trans > 0);
    block_on(fs.fsync(b, false)).unwrap();
    block_on(fs.fsync(c, false)).unwrap();
    let s = fs.stats().log;
    assert_eq!(s.csum_lookups, 2);
    assert_eq!(s.csum_dedups, 1, "c's record leaves out what b's has");

    let fs = crash_and_mount(fs);
    for name in ["a", "b", "c"] {
        assert_eq!(content(&fs, ROOT_INO, name), data, "{name}");
    }
    fsck_clean(fs);
}

#[test]
fn no_xattrs_skips_the_xattr_search() {
    let (fs, _) = fresh(4096);
    let a = file(&fs, ROOT_INO, "a", b"x");
    block_on(fs.fsync(a, false)).unwrap();
    let s = fs.stats().log;
    assert_eq!(s.xattr_searches, 0, "a new inode is known to have none");
    assert_eq!(s.xattr_searches_skipped, 1);

    block_on(fs.setxattr(a, b"user.k", b"v", XattrMode::Upsert)).unwrap();
    assert!(!fs.inode_state(a).unwrap().no_xattrs);
    block_on(fs.fsync(a, false)).unwrap();
    assert_eq!(fs.stats().log.xattr_searches, 1);

    // The search finds none left: the inode is known to have none again.
    block_on(fs.removexattr(a, b"user.k")).unwrap();
    block_on(fs.fsync(a, false)).unwrap();
    assert_eq!(fs.stats().log.xattr_searches, 2);
    assert!(fs.inode_state(a).unwrap().no_xattrs);

    let fs = crash_and_mount(fs);
    let a2 = block_on(fs.lookup(ROOT_INO, b"a")).unwrap();
    assert!(
        block_on(fs.listxattr(a2.ino)).unwrap().is_empty(),
        "removed xattr stays removed"
    );
    fsck_clean(fs);
}

#[test]
fn record_buffers_are_reserved_before_the_lock_and_reused() {
    let (fs, _) = fresh(4096);
    let a = file(&fs, ROOT_INO, "a", b"x");
    // Forty 1 KiB xattrs: a record larger than the default 4 KiB buffer.
    for i in 0..40 {
        let name = format!("user.{i:02}");
        block_on(fs.setxattr(a, name.as_bytes(), &[i as u8; 1000], XattrMode::Upsert)).unwrap();
    }
    block_on(fs.fsync(a, false)).unwrap();
    let s = fs.stats().log;
    assert_eq!(
        s.scratch_regrown, 1,
        "one retry with the size the first try counted"
    );
    // Small fsyncs afterwards reuse pooled buffers: nothing allocated.
    let allocated = s.scratch_allocated;
    for i in 0..50u64 {
        block_on(fs.write(a, i * 10, b"y")).unwrap();
        block_on(fs.fsync(a, false)).unwrap();
    }
    let s = fs.stats().log;
    assert_eq!(s.scratch_allocated, allocated, "pooled buffers reused");
    assert!(s.scratch_reused >= 50);
    assert!(s.commit_buffer_reused >= 50);

    let fs = crash_and_mount(fs);
    let a2 = block_on(fs.lookup(ROOT_INO, b"a")).unwrap();
    assert_eq!(block_on(fs.listxattr(a2.ino)).unwrap().len(), 40);
    assert_eq!(
        block_on(fs.getxattr(a2.ino, b"user.39")).unwrap(),
        vec![39u8; 1000]
    );
    fsck_clean(fs);
}

/// Polls futures together (one thread).
fn join_all<F: std::future::Future<Output = ()>>(futs: Vec<F>) {
    let mut futs: Vec<_> = futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    block_on(std::future::poll_fn(|cx| {
        for slot in futs.iter_mut() {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                }
            }
        }
        if futs.iter().all(Option::is_none) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    }));
}

/// `n` fsyncers, `rounds` write+fsync each: device flushes per fsync.
fn flushes_per_fsync(n: usize, rounds: u64) -> f64 {
    let (fs, rec) = fresh(16384);
    let files: Vec<Ino> = (0..n)
        .map(|i| file(&fs, ROOT_INO, &format!("f{i}"), &[]))
        .collect();
    block_on(fs.sync()).unwrap();
    let before = (rec.counters(), fs.stats());
    join_all(
        files
            .iter()
            .map(|&ino| {
                let fs = &fs;
                async move {
                    for r in 0..rounds {
                        fs.write(ino, r * 4096, &[r as u8; 4096]).await.unwrap();
                        fs.fsync(ino, false).await.unwrap();
                    }
                }
            })
            .collect(),
    );
    let after = (rec.counters(), fs.stats());
    assert_eq!(after.0.fua_writes, before.0.fua_writes, "no FUA");
    assert_eq!(
        after.1.node_writes.total_writes(),
        before.1.node_writes.total_writes(),
        "no node writes"
    );
    let fsyncs = (n as u64 * rounds) as f64;
    let flushes = after.0.flushes - before.0.flushes;
    println!("{n} fsyncers: {flushes} flushes for {fsyncs} fsyncs");
    if n > 1 {
        assert!(
            after.1.log.joined > 0,
            "some fsyncs joined another's commit"
        );
    }
    let fs = crash_and_mount(fs);
    for i in 0..n {
        assert_eq!(
            content(&fs, ROOT_INO, &format!("f{i}")).len() as u64,
            rounds * 4096
        );
    }
    fsck_clean(fs);
    flushes as f64 / fsyncs
}

#[test]
fn group_commit_shares_flushes() {
    let one = flushes_per_fsync(1, 40);
    let four = flushes_per_fsync(4, 40);
    let sixteen = flushes_per_fsync(16, 40);
    println!("flushes per fsync: 1 fsyncer {one:.3}, 4: {four:.3}, 16: {sixteen:.3}");
    assert_eq!(one, 1.0, "one flush per fsync alone");
    assert!(four <= 0.5 && sixteen <= 0.25, "{four} {sixteen}");
}

#[test]
fn the_log_is_reclaimed_by_checkpoints() {
    // A 4 MiB device has a 16-block log: 40 fsyncs wrap it several times.
    let (fs, _) = fresh(1024);
    let a = file(&fs, ROOT_INO, "a", &[]);
    for i in 0..40u64 {
        block_on(fs.write(a, i * 100, &[i as u8 + 1; 100])).unwrap();
        block_on(fs.fsync(a, false)).unwrap();
        let (used, cap) = fs.log_usage();
        assert!(used <= cap);
    }
    let s = fs.stats();
    assert!(s.checkpoints[CheckpointCause::LogReclaim.index()] >= 2);
    assert_eq!(s.log.commits, 40);
    let fs = crash_and_mount(fs);
    let got = content(&fs, ROOT_INO, "a");
    assert_eq!(got.len(), 4000);
    assert!(got
        .chunks(100)
        .enumerate()
        .all(|(i, c)| c == [i as u8 + 1; 100]));
    fsck_clean(fs);
}

/// Never checkpoints on its own: the log fills up.
#[derive(Debug)]
struct NoReclaim;

impl WritePolicy for NoReclaim {
    fn checkpoint_due(&self, _: &Pressure) -> Option<CheckpointCause> {
        None
    }
}

#[test]
fn a_full_log_checkpoints_before_the_commit() {
    let (disk, _) = RecordingDisk::new(YieldDisk::new(image(1024)));
    let fs = mount_with(disk, Box::new(NoReclaim));
    let a = file(&fs, ROOT_INO, "a", &[]);
    for i in 0..40u64 {
        block_on(fs.write(a, i * 100, &[7; 100])).unwrap();
        block_on(fs.fsync(a, false)).unwrap();
    }
    let s = fs.stats();
    assert!(s.log.full >= 2, "{:?}", s.log);
    assert_eq!(
        s.checkpoints[CheckpointCause::LogReclaim.index()],
        s.log.full
    );
    let fs = crash_and_mount(fs);
    assert_eq!(content(&fs, ROOT_INO, "a"), vec![7u8; 4000]);
    fsck_clean(fs);
}

#[test]
fn too_many_removed_names_fall_back_to_a_checkpoint() {
    let (fs, _) = fresh(4096);
    let d = block_on(fs.mkdir(ROOT_INO, b"d", 0o755, OWNER))
        .unwrap()
        .ino;
    for i in 0..80 {
        file(&fs, d, &format!("f{i}"), b"z");
    }
    block_on(fs.sync()).unwrap();
    for i in 0..70 {
        block_on(fs.unlink(d, format!("f{i}").as_bytes())).unwrap();
    }
    let before = fs.stats();
    block_on(fs.fsync(d, false)).unwrap();
    let after = fs.stats();
    assert_eq!(
        after.log.fallbacks[Fallback::RemovedOverflow.index()],
        before.log.fallbacks[Fallback::RemovedOverflow.index()] + 1
    );
    assert_eq!(
        after.checkpoints[CheckpointCause::Fsync.index()],
        before.checkpoints[CheckpointCause::Fsync.index()] + 1
    );
    // Without the overflow, a directory fsync after removals is logged, not checkpointed.
    block_on(fs.unlink(d, b"f70")).unwrap();
    block_on(fs.fsync(d, false)).unwrap();
    let last = fs.stats();
    assert_eq!(last.total_checkpoints(), after.total_checkpoints());
    assert_eq!(last.log.commits, after.log.commits + 1);
    let fs = crash_and_mount(fs);
    let d2 = block_on(fs.lookup(ROOT_INO, b"d")).unwrap().ino;
    let names = block_on(fs.readdir(d2, 0, 1000)).unwrap();
    assert_eq!(names.len(), 2 + 9, "f71..f79 left");
    fsck_clean(fs);
}
