//! Bounded memory, running out of space, crashes in the middle of a checkpoint, orphans,
//! and concurrent operations.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use block::YieldDisk;
use block::{BlockDevice, Geometry, IoError, MemDisk, WriteFlags};
use fsck::{fsck, FsckOptions};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use testkit::testing::{ManualClock, VisibleState};
use vfs::{Errno, FileSystem, Owner, Timespec, ROOT_INO};

const OWNER: Owner = Owner { uid: 0, gid: 0 };

fn clock() -> Box<ManualClock> {
    Box::new(ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 0,
    }))
}

fn formatted(blocks: u64, node_size: u32) -> MemDisk {
    let disk = MemDisk::new(4096, blocks);
    let opts = FormatOptions {
        node_size,
        secret: 1,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    disk
}

fn mount<D: BlockDevice>(disk: D, cache_limit: usize) -> NineFs<D> {
    let opts = MountOptions {
        cache_limit,
        ..MountOptions::default()
    };
    pollster::block_on(NineFs::mount(disk, opts, clock())).unwrap()
}

fn assert_clean(disk: &impl BlockDevice) {
    let r = pollster::block_on(fsck(disk, &FsckOptions::default())).unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
}

#[test]
fn metadata_far_larger_than_the_cache() {
    const LIMIT: usize = 256 * 1024;
    let fs = mount(formatted(64 * 1024, 16 * 1024), LIMIT);
    let mut peak = 0;
    pollster::block_on(async {
        for d in 0..20u32 {
            let dir = fs
                .mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, OWNER)
                .await
                .unwrap();
            for f in 0..400u32 {
                let name = format!("a-rather-long-file-name-{f:05}");
                let attr = fs
                    .create(dir.ino, name.as_bytes(), 0o644, OWNER)
                    .await
                    .unwrap();
                if f % 50 == 0 {
                    fs.write(attr.ino, 0, &[f as u8; 100]).await.unwrap();
                }
                peak = peak.max(fs.cache_usage().0);
            }
        }
    });
    let stats = fs.stats();
    assert!(peak <= LIMIT + 64 * 1024, "cache grew to {peak} bytes");
    assert!(stats.evictions > 100, "{stats:?}");
    assert!(
        stats.checkpoints[3] > 0,
        "no checkpoint under memory pressure: {stats:?}"
    );
    // Everything is still there, read back through the small cache.
    pollster::block_on(async {
        for d in (0..20u32).step_by(7) {
            let dir = fs
                .lookup(ROOT_INO, format!("d{d}").as_bytes())
                .await
                .unwrap();
            let mut n = 0;
            let mut off = 0;
            loop {
                let batch = fs.readdir(dir.ino, off, 100).await.unwrap();
                let Some(last) = batch.last() else { break };
                off = last.next_offset;
                n += batch.len();
            }
            assert_eq!(n, 402);
            let f = fs
                .lookup(dir.ino, b"a-rather-long-file-name-00350")
                .await
                .unwrap();
            let mut buf = [0u8; 200];
            assert_eq!(fs.read(f.ino, 0, &mut buf).await.unwrap(), 100);
            assert!(buf[..100].iter().all(|&b| b == 94));
        }
    });
    assert!(fs.stats().node_loads > 10, "{:?}", fs.stats());
    assert!(fs.cache_usage().0 <= LIMIT + 64 * 1024);
    let total_nodes = {
        let disk = pollster::block_on(fs.unmount()).unwrap();
        let r = pollster::block_on(fsck(&disk, &FsckOptions::default())).unwrap();
        assert!(r.is_clean(), "{:#?}", r.errors);
        r.stats.nodes
    };
    assert!(
        total_nodes * 16 * 1024 > 4 * LIMIT as u64,
        "tree too small to prove anything"
    );
}

#[test]
fn enospc_leaves_the_filesystem_intact() {
    let fs = mount(formatted(2048, 16 * 1024), 4 << 20);
    let data = vec![7u8; 256 * 1024];
    let mut written = Vec::new();
    pollster::block_on(async {
        let mut i = 0;
        loop {
            let f = match fs
                .create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, OWNER)
                .await
            {
                Ok(f) => f,
                Err(e) => {
                    assert_eq!(e, Errno::ENOSPC);
                    break;
                }
            };
            match fs.write(f.ino, 0, &data).await {
                Ok(n) => {
                    assert_eq!(n, data.len());
                    written.push(f.ino);
                }
                Err(e) => {
                    assert_eq!(e, Errno::ENOSPC);
                    // The failed write changed nothing.
                    assert_eq!(fs.getattr(f.ino).await.unwrap().size, 0);
                    break;
                }
            }
            i += 1;
        }
        assert!(written.len() > 5);
        // Small metadata operations still fail cleanly or succeed; nothing breaks.
        for j in 0..50 {
            let r = fs
                .mkdir(ROOT_INO, format!("dir{j}").as_bytes(), 0o755, OWNER)
                .await;
            assert!(r.is_ok() || r == Err(Errno::ENOSPC), "{r:?}");
        }
        // Deleting makes room again (after the checkpoint that frees the blocks).
        for j in 0..3 {
            fs.unlink(ROOT_INO, format!("f{j}").as_bytes())
                .await
                .unwrap();
        }
        let f = fs.create(ROOT_INO, b"again", 0o644, OWNER).await.unwrap();
        assert_eq!(fs.write(f.ino, 0, &data).await, Ok(data.len()));
        let mut buf = vec![0u8; data.len()];
        let last = *written.last().unwrap();
        assert_eq!(fs.read(last, 0, &mut buf).await, Ok(data.len()));
        assert_eq!(buf, data);
    });
    let disk = pollster::block_on(fs.unmount()).unwrap();
    assert_clean(&disk);
}

/// A device that records writes and can "crash": from a chosen write on, nothing more
/// reaches the medium, and that write itself is torn (only its first half lands).
#[derive(Debug)]
struct CrashDisk {
    inner: MemDisk,
    writes: Cell<u64>,
    crash_at: Cell<Option<u64>>,
}

impl BlockDevice for CrashDisk {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: 512,
            num_blocks: self.inner.geometry().num_blocks * 8,
            ..self.inner.geometry()
        }
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.inner.read_bytes(lba * 512, buf);
        Ok(())
    }

    async fn write(&self, lba: u64, buf: &[u8], _flags: WriteFlags) -> Result<(), IoError> {
        let n = self.writes.get();
        self.writes.set(n + 1);
        match self.crash_at.get() {
            Some(at) if n > at => {}
            Some(at) if n == at => {
                let half = (buf.len() / 1024).max(1) * 512;
                self.inner
                    .write_bytes(lba * 512, &buf[..half.min(buf.len())]);
            }
            _ => self.inner.write_bytes(lba * 512, buf),
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        Ok(())
    }

    async fn discard(&self, _lba: u64, _blocks: u64) -> Result<(), IoError> {
        Err(IoError::Unsupported)
    }
}

trait Bytes {
    fn read_bytes(&self, at: u64, buf: &mut [u8]);
    fn write_bytes(&self, at: u64, buf: &[u8]);
}

impl Bytes for MemDisk {
    fn read_bytes(&self, at: u64, buf: &mut [u8]) {
        self.with_bytes(|b| buf.copy_from_slice(&b[at as usize..at as usize + buf.len()]));
    }

    fn write_bytes(&self, at: u64, buf: &[u8]) {
        self.with_bytes(|b| b[at as usize..at as usize + buf.len()].copy_from_slice(buf));
    }
}

async fn populate(fs: &impl FileSystem, round: u32) {
    for i in 0..30u32 {
        let name = format!("r{round}-{i}");
        let f = fs
            .create(ROOT_INO, name.as_bytes(), 0o644, OWNER)
            .await
            .unwrap();
        fs.write(
            f.ino,
            u64::from(i) * 1000,
            &vec![(round * 7 + i) as u8; 3000],
        )
        .await
        .unwrap();
    }
    for i in (0..30u32).step_by(3) {
        fs.unlink(ROOT_INO, format!("r{round}-{i}").as_bytes())
            .await
            .unwrap();
    }
}

/// Crashing at every write of a checkpoint (with that write torn) leaves the state of
/// the previous or of the new checkpoint, and a clean fsck after mounting.
#[test]
fn crash_at_every_write_of_a_checkpoint() {
    let base = formatted(4096, 16 * 1024).snapshot();
    // A dry run counts the writes of the second checkpoint.
    let (before, after, writes) = {
        let disk = CrashDisk {
            inner: MemDisk::from_bytes(4096, base.clone()),
            writes: Cell::new(0),
            crash_at: Cell::new(None),
        };
        let fs = mount(disk, 1 << 20);
        pollster::block_on(populate(&fs, 0));
        pollster::block_on(fs.sync()).unwrap();
        let before = VisibleState::capture_blocking(&fs);
        let start = fs.device().writes.get();
        pollster::block_on(populate(&fs, 1));
        pollster::block_on(fs.sync()).unwrap();
        let end = fs.device().writes.get();
        (before, VisibleState::capture_blocking(&fs), start..end)
    };
    assert!(writes.end - writes.start > 5);
    for at in writes {
        let disk = CrashDisk {
            inner: MemDisk::from_bytes(4096, base.clone()),
            writes: Cell::new(0),
            crash_at: Cell::new(Some(at)),
        };
        let fs = mount(disk, 1 << 20);
        pollster::block_on(populate(&fs, 0));
        pollster::block_on(fs.sync()).unwrap();
        pollster::block_on(populate(&fs, 1));
        pollster::block_on(fs.sync()).unwrap();
        // Power fails: whatever reached the disk is what there is.
        let image = fs.device().inner.snapshot();
        drop(fs);
        let disk = MemDisk::from_bytes(4096, image);
        let fs = mount(&disk, 1 << 20);
        let state = VisibleState::capture_blocking(&fs);
        assert!(
            state.anomalies.is_empty(),
            "crash at write {at}: {:?}",
            state.anomalies
        );
        let strip = |s: &VisibleState| s.nodes.keys().cloned().collect::<Vec<_>>();
        assert!(
            strip(&state) == strip(&before) || strip(&state) == strip(&after),
            "crash at write {at}: neither the old nor the new state"
        );
        pollster::block_on(fs.unmount()).unwrap();
        assert_clean(&disk);
    }
}

#[test]
fn unlinked_open_files_survive_until_release_and_crashes() {
    let disk = formatted(4096, 16 * 1024);
    let fs = mount(&disk, 1 << 20);
    let image = pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"tmp", 0o600, OWNER).await.unwrap();
        fs.write(f.ino, 0, &[1u8; 50_000]).await.unwrap();
        fs.open(f.ino).await.unwrap();
        fs.unlink(ROOT_INO, b"tmp").await.unwrap();
        fs.write(f.ino, 50_000, &[2u8; 10]).await.unwrap();
        let mut buf = [0u8; 10];
        fs.read(f.ino, 49_995, &mut buf).await.unwrap();
        assert_eq!(buf, [1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
        assert_eq!(fs.getattr(f.ino).await.unwrap().nlink, 0);
        fs.sync().await.unwrap();
        // Crash here (the orphan is on disk).
        let image = disk.snapshot();
        fs.release(f.ino).await.unwrap();
        assert_eq!(fs.getattr(f.ino).await, Err(Errno::ENOENT));
        image
    });
    pollster::block_on(fs.unmount()).unwrap();
    assert_clean(&disk);
    // After the crash, mount frees the orphan.
    let crashed = MemDisk::from_bytes(4096, image);
    let free_before = pollster::block_on(fsck(&crashed, &FsckOptions::default()))
        .unwrap()
        .stats
        .free_blocks;
    let fs = mount(&crashed, 1 << 20);
    assert_eq!(
        pollster::block_on(fs.readdir(ROOT_INO, 2, 10)).unwrap(),
        vec![]
    );
    pollster::block_on(fs.unmount()).unwrap();
    let r = pollster::block_on(fsck(&crashed, &FsckOptions::default())).unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
    assert!(
        r.stats.free_blocks >= free_before + 13,
        "orphan's blocks not freed"
    );
}

#[test]
fn remount_read_only_leaves_a_clean_image_while_still_mounted() {
    let disk = formatted(4096, 16 * 1024);
    let fs = mount(&disk, 1 << 20);
    let (kept, orphan) = pollster::block_on(async {
        let kept = fs.create(ROOT_INO, b"kept", 0o644, OWNER).await.unwrap();
        fs.write(kept.ino, 0, b"fsynced").await.unwrap();
        fs.fsync(kept.ino, false).await.unwrap();
        fs.write(kept.ino, 7, b", then written").await.unwrap();
        let orphan = fs.create(ROOT_INO, b"tmp", 0o600, OWNER).await.unwrap();
        fs.write(orphan.ino, 0, &[3u8; 40_000]).await.unwrap();
        fs.open(orphan.ino).await.unwrap();
        fs.unlink(ROOT_INO, b"tmp").await.unwrap();
        fs.remount_read_only().await.unwrap();
        (kept, orphan)
    });
    // Still mounted, for reading only: what the shutdown leaves behind it.
    pollster::block_on(async {
        let mut buf = [0u8; 32];
        let n = fs.read(kept.ino, 0, &mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"fsynced, then written");
        assert_eq!(fs.write(kept.ino, 0, b"x").await, Err(Errno::EROFS));
        assert_eq!(
            fs.create(ROOT_INO, b"new", 0o644, OWNER).await.map(|_| ()),
            Err(Errno::EROFS)
        );
        fs.remount_read_only().await.unwrap();
    });
    // The power goes off now: the image is clean, with nothing to replay.
    let image = MemDisk::from_bytes(4096, disk.snapshot());
    let r = pollster::block_on(fsck(&image, &FsckOptions::default())).unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
    assert!(r.warnings.is_empty(), "{:#?}", r.warnings);
    let fs = mount(&image, 1 << 20);
    pollster::block_on(async {
        let found = fs.lookup(ROOT_INO, b"kept").await.unwrap();
        let mut buf = [0u8; 32];
        let n = fs.read(found.ino, 0, &mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"fsynced, then written");
        assert_eq!(fs.getattr(orphan.ino).await, Err(Errno::ENOENT));
    });
}

#[test]
fn concurrent_operations_interleave_and_agree() {
    let disk = YieldDisk::new(formatted(8192, 16 * 1024));
    // A small cache, so operations also wait for node reads.
    let fs = mount(disk, 64 * 1024);
    let progress = RefCell::new(BTreeMap::new());
    pollster::block_on(async {
        let workers = (0..8u32).map(|w| {
            let fs = &fs;
            let progress = &progress;
            async move {
                let dir = fs
                    .mkdir(ROOT_INO, format!("w{w}").as_bytes(), 0o755, OWNER)
                    .await
                    .unwrap();
                let shared = match fs.create(ROOT_INO, b"shared", 0o644, OWNER).await {
                    Ok(a) => a.ino,
                    Err(Errno::EEXIST) => fs.lookup(ROOT_INO, b"shared").await.unwrap().ino,
                    Err(e) => panic!("{e}"),
                };
                for i in 0..40u32 {
                    let f = fs
                        .create(dir.ino, format!("f{i}").as_bytes(), 0o644, OWNER)
                        .await
                        .unwrap();
                    fs.write(f.ino, 0, &[(w * 40 + i) as u8; 5000])
                        .await
                        .unwrap();
                    fs.write(shared, u64::from(w) * 4096, &[w as u8; 4096])
                        .await
                        .unwrap();
                    if i % 4 == 0 {
                        fs.rename(
                            dir.ino,
                            format!("f{i}").as_bytes(),
                            ROOT_INO,
                            format!("m{w}-{i}").as_bytes(),
                        )
                        .await
                        .unwrap();
                    }
                    if i % 10 == 9 {
                        fs.sync().await.unwrap();
                    }
                    progress.borrow_mut().insert(w, i);
                }
            }
        });
        futures::future::join_all(workers).await;
    });
    assert!(progress.borrow().values().all(|&i| i == 39));
    pollster::block_on(async {
        let shared = fs.lookup(ROOT_INO, b"shared").await.unwrap();
        let mut buf = vec![0u8; 8 * 4096];
        assert_eq!(fs.read(shared.ino, 0, &mut buf).await.unwrap(), buf.len());
        for w in 0..8 {
            assert!(buf[w * 4096..(w + 1) * 4096].iter().all(|&b| b == w as u8));
        }
        for w in 0..8u32 {
            let f = fs
                .lookup(ROOT_INO, format!("m{w}-36").as_bytes())
                .await
                .unwrap();
            let mut b = [0u8; 5000];
            fs.read(f.ino, 0, &mut b).await.unwrap();
            assert!(b.iter().all(|&x| x == (w * 40 + 36) as u8));
        }
    });
    let disk = pollster::block_on(fs.unmount()).unwrap();
    assert_clean(disk.inner());
}

/// The same workload under the default policy (write only at checkpoints) and under the
/// "write a node when 4 KiB of it is dirty" baseline: same result, and the counters show
/// what each cost.
#[test]
fn write_policies_are_pluggable_and_counted() {
    let run = |policy: Box<dyn ninefs::volume::WritePolicy>| {
        let opts = MountOptions {
            cache_limit: 8 << 20,
            policy,
            ..MountOptions::default()
        };
        let fs =
            pollster::block_on(NineFs::mount(formatted(8192, 64 * 1024), opts, clock())).unwrap();
        pollster::block_on(async {
            for round in 0..3u32 {
                populate(&fs, round).await;
                for i in 0..200u32 {
                    let a = fs
                        .create(ROOT_INO, format!("x{round}-{i}").as_bytes(), 0o644, OWNER)
                        .await
                        .unwrap();
                    fs.setattr(
                        a.ino,
                        vfs::SetAttr {
                            mode: Some(0o600),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap();
                }
            }
            fs.sync().await.unwrap();
        });
        let stats = fs.stats();
        let state = VisibleState::capture_blocking(&fs);
        let disk = pollster::block_on(fs.unmount()).unwrap();
        assert_clean(&disk);
        (stats, state)
    };
    let (lazy, lazy_state) = run(Box::new(ninefs::volume::PressurePolicy));
    let (eager, eager_state) = run(Box::new(ninefs::volume::DirtyThresholdPolicy));
    println!(
        "checkpoint-only: {:?}\n4 KiB-dirty:     {:?}",
        lazy.node_writes, eager.node_writes
    );
    assert_eq!(lazy_state, eager_state);
    let dirty = ninefs::btree::WriteCause::ALL
        .iter()
        .position(|&c| c == ninefs::btree::WriteCause::Dirty)
        .unwrap();
    assert_eq!(lazy.node_writes.writes[dirty], 0);
    assert!(eager.node_writes.writes[dirty] > 0, "{eager:?}");
    assert!(
        eager.node_writes.total_writes() > lazy.node_writes.total_writes(),
        "eager {:?} lazy {:?}",
        eager.node_writes,
        lazy.node_writes
    );
}

/// Device errors (failed writes, reads, flushes; bits flipped on the way in) give EIO and
/// never a panic; a failed checkpoint fails the filesystem, and what is on the device
/// afterwards still mounts and checks clean (nothing uncommitted became visible).
#[test]
fn device_errors_give_eio_and_leave_the_image_consistent() {
    use block::{Fault, FaultDisk};
    for seed in 0..12u64 {
        let base = formatted(4096, 16 * 1024);
        let disk = FaultDisk::new(base, seed);
        let fs = mount(&disk, 128 * 1024);
        disk.inject(Fault::RandomWrites(30_000), IoError::Device(1));
        disk.inject(Fault::RandomReads(20_000), IoError::Timeout);
        if seed % 3 == 0 {
            disk.inject(Fault::FlipBits(0..u64::MAX), IoError::Device(2));
        }
        let mut eio = 0;
        pollster::block_on(async {
            for i in 0..200u32 {
                let name = format!("f{}", i % 40);
                let r = async {
                    let f = match fs.create(ROOT_INO, name.as_bytes(), 0o644, OWNER).await {
                        Err(Errno::EEXIST) => fs.lookup(ROOT_INO, name.as_bytes()).await?,
                        r => r?,
                    };
                    fs.write(f.ino, u64::from(i) * 512, &[i as u8; 3000])
                        .await?;
                    let mut buf = [0u8; 100];
                    fs.read(f.ino, 0, &mut buf).await?;
                    if i % 7 == 0 {
                        fs.unlink(ROOT_INO, name.as_bytes()).await?;
                    }
                    if i % 25 == 0 {
                        fs.sync().await?;
                    }
                    Ok::<(), Errno>(())
                }
                .await;
                match r {
                    Ok(()) => {}
                    Err(Errno::EIO) => eio += 1,
                    Err(e) => panic!("seed {seed} op {i}: unexpected {e}"),
                }
            }
        });
        assert!(eio > 0, "seed {seed}: no fault hit");
        drop(fs); // as if the power failed: nothing more is written
        disk.heal();
        let fs = mount(disk.inner(), 1 << 20);
        let state = VisibleState::capture_blocking(&fs);
        assert!(
            state.anomalies.is_empty(),
            "seed {seed}: {:?}",
            state.anomalies
        );
        pollster::block_on(fs.unmount()).unwrap();
        assert_clean(disk.inner());
    }
}

/// An inode reaches the link limit with every name in one directory (each name is its
/// own back-reference item, so no item outgrows a node); one more link is `EMLINK`. The
/// names survive an fsync and a crash (log replay), a clean remount and fsck.
#[test]
fn hard_links_reach_the_limit_in_one_directory() {
    use ninefs::volume::MAX_LINKS;
    const LINKS: u32 = MAX_LINKS;
    // 1 GiB (allocated lazily): a 16 MiB log, so all the names fit in one log commit.
    let disk = formatted(256 * 1024, 64 * 1024);
    let opts = || MountOptions {
        cache_limit: 256 << 20,
        ..MountOptions::default()
    };
    let name = |i: u32| format!("link-{i:05}");
    let fs = pollster::block_on(NineFs::mount(&disk, opts(), clock())).unwrap();
    let (dir, file) = pollster::block_on(async {
        let dir = fs.mkdir(ROOT_INO, b"d", 0o755, OWNER).await.unwrap().ino;
        let file = fs
            .create(dir, &name(0).into_bytes(), 0o644, OWNER)
            .await
            .unwrap();
        fs.write(file.ino, 0, b"linked").await.unwrap();
        fs.sync().await.unwrap();
        (dir, file.ino)
    });
    let checkpoints = fs.stats().total_checkpoints();
    pollster::block_on(async {
        for i in 1..LINKS {
            let a = fs.link(file, dir, name(i).as_bytes()).await.unwrap();
            assert_eq!(a.nlink, i + 1);
        }
        assert_eq!(
            fs.link(file, dir, b"one-too-many").await,
            Err(Errno::EMLINK)
        );
        assert_eq!(
            fs.link(file, ROOT_INO, b"elsewhere").await,
            Err(Errno::EMLINK)
        );
        assert_eq!(fs.getattr(file).await.unwrap().nlink, LINKS);
        fs.fsync(file, false).await.unwrap();
    });
    let stats = fs.stats();
    assert_eq!(stats.link_limit_hits, 2);
    assert_eq!(
        stats.total_checkpoints(),
        checkpoints,
        "the names must reach the disk through the log alone: {stats:?}"
    );
    assert!(stats.log.commits > 0, "{:?}", stats.log);
    // Power fails: mount replays the log.
    drop(fs);
    let check = |fs: &NineFs<&MemDisk>| {
        pollster::block_on(async {
            assert_eq!(fs.getattr(file).await.unwrap().nlink, LINKS);
            for i in [0, 1, LINKS / 2, LINKS - 1] {
                assert_eq!(fs.lookup(dir, name(i).as_bytes()).await.unwrap().ino, file);
            }
            assert_eq!(fs.lookup(dir, b"one-too-many").await, Err(Errno::ENOENT));
            let mut names = 0;
            let mut offset = 0;
            loop {
                let batch = fs.readdir(dir, offset, 1000).await.unwrap();
                let Some(last) = batch.last() else { break };
                offset = last.next_offset;
                names += batch.iter().filter(|e| e.ino == file).count();
            }
            assert_eq!(names, LINKS as usize);
            let mut buf = [0u8; 6];
            fs.read(file, 0, &mut buf).await.unwrap();
            assert_eq!(&buf, b"linked");
        });
    };
    let fs = pollster::block_on(NineFs::mount(&disk, opts(), clock())).unwrap();
    assert!(
        fs.stats().log.replayed_commits > 0,
        "nothing replayed: {:?}",
        fs.stats().log
    );
    check(&fs);
    pollster::block_on(fs.unmount()).unwrap();
    assert_clean(&disk);
    // A clean remount: still at the limit, and a removed name frees one link.
    let fs = pollster::block_on(NineFs::mount(&disk, opts(), clock())).unwrap();
    check(&fs);
    pollster::block_on(async {
        assert_eq!(
            fs.link(file, dir, b"one-too-many").await,
            Err(Errno::EMLINK)
        );
        fs.unlink(dir, name(7).as_bytes()).await.unwrap();
        let a = fs.link(file, ROOT_INO, b"elsewhere").await.unwrap();
        assert_eq!(a.nlink, LINKS);
    });
    pollster::block_on(fs.unmount()).unwrap();
    assert_clean(&disk);
}

/// Creates files of `data` until the filesystem is full; returns how many are whole.
async fn fill(fs: &impl FileSystem, data: &[u8]) -> u32 {
    for i in 0.. {
        let f = match fs
            .create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, OWNER)
            .await
        {
            Ok(f) => f,
            Err(e) => {
                assert_eq!(e, Errno::ENOSPC);
                return i;
            }
        };
        match fs.write(f.ino, 0, data).await {
            Ok(n) if n == data.len() => {}
            Ok(_) | Err(Errno::ENOSPC) => {
                fs.unlink(ROOT_INO, format!("f{i}").as_bytes())
                    .await
                    .unwrap();
                return i;
            }
            Err(e) => panic!("{e}"),
        }
    }
    unreachable!()
}

/// `statfs` counts the space an unlink frees at once, before the checkpoint that makes
/// it reusable; a full filesystem gets exactly that space back (the allocation that
/// finds no room commits the frees first) and hands out what `statfs` promised.
#[test]
fn unlinked_space_is_free_at_once_and_refillable() {
    let fs = mount(formatted(4096, 16 * 1024), 4 << 20);
    let data = vec![7u8; 1 << 20];
    pollster::block_on(async {
        let files = fill(&fs, &data).await;
        assert!(files >= 8, "{files}");
        fs.sync().await.unwrap();
        let full = fs.statfs().await.unwrap();
        let checkpoints = fs.stats().total_checkpoints();
        for i in 0..3 {
            fs.unlink(ROOT_INO, format!("f{i}").as_bytes())
                .await
                .unwrap();
        }
        let freed = fs.statfs().await.unwrap();
        assert_eq!(
            fs.stats().total_checkpoints(),
            checkpoints,
            "no checkpoint ran, yet the space shows"
        );
        let blocks = 3 * data.len() as u64 / 4096;
        assert!(
            freed.blocks_free >= full.blocks_free + blocks,
            "{full:?} -> {freed:?}"
        );
        assert!(freed.blocks_avail >= blocks, "{freed:?}");
        // Refill with exactly what statfs says is available.
        let g = fs.create(ROOT_INO, b"refill", 0o644, OWNER).await.unwrap();
        let want = vec![9u8; (freed.blocks_avail * 4096) as usize];
        assert_eq!(fs.write(g.ino, 0, &want).await, Ok(want.len()));
        let space = ninefs::volume::CheckpointCause::Space.index();
        assert!(fs.stats().checkpoints[space] > 0, "{:?}", fs.stats());
        let mut back = vec![0u8; want.len()];
        assert_eq!(fs.read(g.ino, 0, &mut back).await, Ok(want.len()));
        assert!(back == want);
        // Full again, and the untouched files are intact.
        assert_eq!(
            fs.write(g.ino, want.len() as u64, &data).await,
            Err(Errno::ENOSPC)
        );
        let f = fs
            .lookup(ROOT_INO, format!("f{}", files - 1).as_bytes())
            .await
            .unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(fs.read(f.ino, 0, &mut back).await, Ok(data.len()));
        assert!(back == data);
    });
    let disk = pollster::block_on(fs.unmount()).unwrap();
    assert_clean(&disk);
}

/// Blocks an unlink frees are reused only once the checkpoint that frees them has
/// committed: crashing at every write of "unlink on a full disk, write a new file into
/// the freed space, fsync it" leaves the unlinked file either gone or whole (never
/// overwritten under a name that still shows), and a clean fsck.
#[test]
fn freed_space_is_reused_only_after_the_free_is_durable() {
    let data = |i: u32| vec![(i + 1) as u8; 256 * 1024];
    let base = {
        let disk = formatted(2048, 16 * 1024);
        let fs = mount(&disk, 1 << 20);
        let files = pollster::block_on(async {
            let mut i = 0;
            loop {
                let f = fs
                    .create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, OWNER)
                    .await
                    .unwrap();
                if fs.write(f.ino, 0, &data(i)).await != Ok(data(i).len()) {
                    fs.unlink(ROOT_INO, format!("f{i}").as_bytes())
                        .await
                        .unwrap();
                    return i;
                }
                i += 1;
            }
        });
        assert!(files > 3, "{files}");
        pollster::block_on(fs.unmount()).unwrap();
        disk.snapshot()
    };
    let refill = vec![0xEE; 256 * 1024];
    let run = |crash_at: Option<u64>| {
        let disk = CrashDisk {
            inner: MemDisk::from_bytes(4096, base.clone()),
            writes: Cell::new(0),
            crash_at: Cell::new(crash_at),
        };
        let fs = mount(disk, 1 << 20);
        let start = fs.device().writes.get();
        pollster::block_on(async {
            fs.unlink(ROOT_INO, b"f0").await.unwrap();
            let g = fs.create(ROOT_INO, b"g", 0o644, OWNER).await.unwrap();
            assert_eq!(fs.write(g.ino, 0, &refill).await, Ok(refill.len()));
            fs.fsync(g.ino, false).await.unwrap();
        });
        let space = ninefs::volume::CheckpointCause::Space.index();
        assert!(
            fs.stats().checkpoints[space] > 0,
            "the refill needed f0's space"
        );
        (
            start..fs.device().writes.get(),
            fs.device().inner.snapshot(),
        )
    };
    let (writes, _) = run(None);
    assert!(writes.end - writes.start > 5);
    for at in writes {
        let (_, image) = run(Some(at));
        let disk = MemDisk::from_bytes(4096, image);
        let fs = mount(&disk, 1 << 20);
        pollster::block_on(async {
            if let Ok(f) = fs.lookup(ROOT_INO, b"f0").await {
                let mut back = vec![0u8; 256 * 1024];
                assert_eq!(
                    fs.read(f.ino, 0, &mut back).await,
                    Ok(back.len()),
                    "crash at write {at}: f0 is still named but unreadable"
                );
                assert!(back == data(0), "crash at write {at}: f0 was overwritten");
            }
            if let Ok(g) = fs.lookup(ROOT_INO, b"g").await {
                let mut back = vec![0u8; 256 * 1024];
                let n = fs.read(g.ino, 0, &mut back).await.unwrap();
                assert!(n == 0 || back == refill, "crash at write {at}: g is torn");
            }
        });
        pollster::block_on(fs.unmount()).unwrap();
        assert_clean(&disk);
    }
}

/// Appends to one file from many futures polled together, their device requests
/// interleaved (each yields): each lands whole at an offset of its own, in its writer's
/// order; none overwrites another and none leaves a gap.
#[test]
fn concurrent_appends_never_overlap() {
    const WRITERS: usize = 6;
    const RECORDS: usize = 12;
    const LEN: usize = 1000;
    let fs = mount(YieldDisk::new(formatted(8192, 16 * 1024)), 1 << 20);
    let record = |w: usize, i: usize| {
        let mut r = format!("[writer {w} record {i}]").into_bytes();
        r.resize(LEN, b'-');
        r
    };
    let file = pollster::block_on(fs.create(ROOT_INO, b"log", 0o644, OWNER))
        .unwrap()
        .ino;
    let placed: Vec<Vec<u64>> =
        pollster::block_on(futures::future::join_all((0..WRITERS).map(|w| {
            let fs = &fs;
            async move {
                let mut offsets = Vec::new();
                for i in 0..RECORDS {
                    let (at, n) = fs.append(file, &record(w, i)).await.unwrap();
                    assert_eq!(n, LEN);
                    offsets.push(at);
                }
                offsets
            }
        })));
    let mut all: Vec<u64> = placed.iter().flatten().copied().collect();
    all.sort_unstable();
    let expected: Vec<u64> = (0..WRITERS * RECORDS).map(|k| (k * LEN) as u64).collect();
    assert_eq!(all, expected, "appends overlapped or left gaps");
    pollster::block_on(async {
        assert_eq!(
            fs.getattr(file).await.unwrap().size,
            (WRITERS * RECORDS * LEN) as u64
        );
        for (w, offsets) in placed.iter().enumerate() {
            // Each writer's records are in its order.
            assert!(offsets.windows(2).all(|p| p[0] < p[1]));
            for (i, &at) in offsets.iter().enumerate() {
                let mut back = vec![0u8; LEN];
                assert_eq!(fs.read(file, at, &mut back).await, Ok(LEN));
                assert!(back == record(w, i), "record {w}/{i} at {at} overwritten");
            }
        }
    });
    let disk = pollster::block_on(fs.unmount()).unwrap();
    assert_clean(disk.inner());
}
