//! Snapshots: a snapshot shows the filesystem as it was when taken, whatever the live
//! filesystem does afterwards; it refuses every change; deleting it frees exactly the
//! blocks it alone held; fsck counts blocks shared between the live trees and snapshots.

use block::MemDisk;
use fsck::{fsck, FsckOptions};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use proptest::prelude::*;
use testkit::testing::ManualClock;
use vfs::{Errno, FileSystem, Ino, Owner, SetAttr, Timespec, ROOT_INO};

const OWNER: Owner = Owner { uid: 0, gid: 0 };

fn formatted(blocks: u64) -> MemDisk {
    let disk = MemDisk::new(4096, blocks);
    let opts = FormatOptions {
        secret: 1,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    disk
}

fn clock() -> Box<ManualClock> {
    Box::new(ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 0,
    }))
}

fn mount(disk: &MemDisk, opts: MountOptions) -> NineFs<&MemDisk> {
    pollster::block_on(NineFs::mount(disk, opts, clock())).unwrap()
}

async fn read_all<F: FileSystem>(fs: &F, dir: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
    let a = fs.lookup(dir, name).await?;
    let mut buf = vec![0u8; a.size as usize];
    let n = fs.read(a.ino, 0, &mut buf).await?;
    buf.truncate(n);
    Ok(buf)
}

async fn names<F: FileSystem>(fs: &F, dir: Ino) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = fs
        .readdir(dir, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    out.sort();
    out
}

fn check(disk: &MemDisk) -> fsck::Report {
    let report = pollster::block_on(fsck(disk, &FsckOptions::default())).unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
    report
}

#[test]
fn a_snapshot_keeps_the_old_contents_and_deleting_it_frees_what_it_alone_held() {
    let disk = formatted(16 * 1024);
    let fs = mount(&disk, MountOptions::default());
    pollster::block_on(async {
        let a = fs.create(ROOT_INO, b"a", 0o644, OWNER).await.unwrap();
        fs.write(a.ino, 0, &vec![1u8; 3 << 20]).await.unwrap();
        let b = fs.create(ROOT_INO, b"b", 0o644, OWNER).await.unwrap();
        fs.write(b.ino, 0, b"short and sweet").await.unwrap();
        fs.symlink(ROOT_INO, b"l", b"a", OWNER).await.unwrap();
        fs.sync().await.unwrap();
        let free_before = fs.statfs().await.unwrap().blocks_free;

        let info = fs.snapshot_create("before").await.unwrap();
        assert_eq!(info.name, "before");
        assert_eq!(fs.snapshots().await.unwrap(), vec![info.clone()]);
        assert_eq!(fs.snapshot_create("before").await, Err(Errno::EEXIST));
        assert_eq!(fs.snapshot_create("no/slash").await, Err(Errno::EINVAL));

        // Overwrite, delete, truncate, add.
        fs.write(a.ino, 4096, &vec![2u8; 1 << 20]).await.unwrap();
        fs.unlink(ROOT_INO, b"b").await.unwrap();
        let size = |s| SetAttr {
            size: Some(s),
            ..SetAttr::default()
        };
        fs.setattr(a.ino, size(8192)).await.unwrap();
        fs.create(ROOT_INO, b"c", 0o644, OWNER).await.unwrap();
        fs.sync().await.unwrap();
        // The live filesystem wrote a new 1 MiB extent and dropped two old ones (the
        // first stays: its first block is still `a`'s): the snapshot pins those 512
        // blocks, so there is less free space than before instead of more.
        let free_live = fs.statfs().await.unwrap().blocks_free;
        assert!(
            free_live + 256 <= free_before,
            "{free_live} vs {free_before}"
        );
        assert!(fs.stats().snapshot_held_blocks >= 512, "{:?}", fs.stats());

        let snap = fs.snapshot_view("before").await.unwrap();
        assert_eq!(
            names(&*snap, ROOT_INO).await,
            vec![b"a".to_vec(), b"b".to_vec(), b"l".to_vec()]
        );
        assert_eq!(
            read_all(&*snap, ROOT_INO, b"a").await.unwrap(),
            vec![1u8; 3 << 20]
        );
        assert_eq!(
            read_all(&*snap, ROOT_INO, b"b").await.unwrap(),
            b"short and sweet"
        );
        let l = snap.lookup(ROOT_INO, b"l").await.unwrap();
        assert_eq!(snap.readlink(l.ino).await.unwrap(), b"a");
        assert_eq!(
            snap.create(ROOT_INO, b"x", 0o644, OWNER).await.map(|_| ()),
            Err(Errno::EROFS)
        );
        assert_eq!(snap.write(a.ino, 0, b"x").await, Err(Errno::EROFS));
        assert_eq!(snap.unlink(ROOT_INO, b"a").await, Err(Errno::EROFS));
        let mut live_a = vec![1u8; 8192];
        live_a[4096..].fill(2);
        assert_eq!(read_all(&fs, ROOT_INO, b"a").await.unwrap(), live_a);
        assert_eq!(
            names(&fs, ROOT_INO).await,
            vec![b"a".to_vec(), b"c".to_vec(), b"l".to_vec()]
        );
        drop(snap);

        let report = check(&disk);
        assert_eq!(report.stats.snapshots, 1);
        assert!(report.stats.snapshot_blocks >= 512, "{:?}", report.stats);

        fs.snapshot_delete("before").await.unwrap();
        assert_eq!(fs.snapshot_delete("before").await, Err(Errno::ENOENT));
        assert!(fs.snapshots().await.unwrap().is_empty());
        fs.sync().await.unwrap();
        let free_after = fs.statfs().await.unwrap().blocks_free;
        assert!(free_after >= free_live + 512, "{free_after} vs {free_live}");
        let report = check(&disk);
        assert_eq!(report.stats.snapshot_blocks, 0);
        assert_eq!(report.stats.free_blocks, fs.superblock().free_blocks);
        let s = fs.stats();
        assert_eq!(
            (s.snapshots_created, s.snapshots_deleted, s.snapshots),
            (1, 1, 0)
        );
        assert_eq!(
            fs.superblock().incompat & ninefs::format::features::INCOMPAT_SNAPSHOTS,
            0
        );
    });
}

#[test]
fn snapshots_survive_remount_and_the_held_blocks_stay_held() {
    let disk = formatted(16 * 1024);
    {
        let fs = mount(&disk, MountOptions::default());
        pollster::block_on(async {
            let a = fs.create(ROOT_INO, b"a", 0o644, OWNER).await.unwrap();
            fs.write(a.ino, 0, &vec![7u8; 1 << 20]).await.unwrap();
            fs.snapshot_create("one").await.unwrap();
            fs.unlink(ROOT_INO, b"a").await.unwrap();
            fs.snapshot_create("two").await.unwrap();
            fs.unmount().await.unwrap();
        });
    }
    check(&disk);
    let fs = mount(&disk, MountOptions::default());
    pollster::block_on(async {
        let list: Vec<String> = fs
            .snapshots()
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(list, ["one", "two"]);
        // Reuse all the free space: nothing the snapshot holds may be handed out.
        let f = fs.create(ROOT_INO, b"fill", 0o644, OWNER).await.unwrap();
        let mut off = 0u64;
        loop {
            match fs.write(f.ino, off, &vec![9u8; 1 << 20]).await {
                Ok(n) => off += n as u64,
                Err(Errno::ENOSPC) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let one = fs.snapshot_view("one").await.unwrap();
        assert_eq!(
            read_all(&*one, ROOT_INO, b"a").await.unwrap(),
            vec![7u8; 1 << 20]
        );
        let two = fs.snapshot_view("two").await.unwrap();
        assert_eq!(
            two.lookup(ROOT_INO, b"a").await.map(|_| ()),
            Err(Errno::ENOENT)
        );
        drop((one, two));
        fs.unlink(ROOT_INO, b"fill").await.unwrap();
        fs.sync().await.unwrap();
        check(&disk);
        fs.snapshot_delete("two").await.unwrap();
        fs.snapshot_delete("one").await.unwrap();
        fs.unmount().await.unwrap();
    });
    let report = check(&disk);
    assert_eq!(
        (report.stats.snapshots, report.stats.snapshot_blocks),
        (0, 0)
    );
}

#[test]
fn the_snapshot_limit_is_enforced_and_counted() {
    let disk = formatted(8 * 1024);
    let opts = MountOptions {
        max_snapshots: 2,
        ..MountOptions::default()
    };
    let fs = mount(&disk, opts);
    pollster::block_on(async {
        fs.snapshot_create("a").await.unwrap();
        fs.snapshot_create("b").await.unwrap();
        assert_eq!(
            fs.snapshot_create("c").await,
            Err(Errno::ENOSPC).map(|()| unreachable!())
        );
        assert_eq!(fs.stats().snapshot_limit_hits, 1);
        fs.snapshot_delete("a").await.unwrap();
        fs.snapshot_create("c").await.unwrap();
    });
    check(&disk);
}

#[test]
fn names_are_validated() {
    use ninefs::features::snapshots::valid_name;
    assert!(valid_name("nightly-2026.11.23_0300"));
    for bad in ["", ".hidden", "..", "a/b", "a b", "é", &"x".repeat(65)] {
        assert!(!valid_name(bad), "{bad:?}");
    }
}

/// One step of the property test.
#[derive(Clone, Debug)]
enum Step {
    Write {
        file: u8,
        block: u8,
        blocks: u8,
        byte: u8,
    },
    Truncate {
        file: u8,
        blocks: u8,
    },
    Unlink {
        file: u8,
    },
    Snapshot,
    DeleteSnapshot {
        which: u8,
    },
    Remount,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..4u8, 0..64u8, 1..32u8, any::<u8>())
            .prop_map(|(file, block, blocks, byte)| Step::Write { file, block, blocks, byte }),
        1 => (0..4u8, 0..64u8).prop_map(|(file, blocks)| Step::Truncate { file, blocks }),
        1 => (0..4u8).prop_map(|file| Step::Unlink { file }),
        1 => Just(Step::Snapshot),
        1 => any::<u8>().prop_map(|which| Step::DeleteSnapshot { which }),
        1 => Just(Step::Remount),
    ]
}

type Files = std::collections::BTreeMap<u8, Vec<u8>>;

fn file_name(f: u8) -> Vec<u8> {
    format!("f{f}").into_bytes()
}

async fn assert_contents<F: FileSystem>(fs: &F, want: &Files) {
    let want_names: Vec<Vec<u8>> = want.keys().map(|&f| file_name(f)).collect();
    assert_eq!(names(fs, ROOT_INO).await, want_names);
    for (&f, data) in want {
        assert_eq!(
            &read_all(fs, ROOT_INO, &file_name(f)).await.unwrap(),
            data,
            "file {f}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Any mix of writes, truncations, unlinks, snapshots, snapshot deletions (oldest,
    /// newest or in between) and remounts: every snapshot shows the files as they were
    /// when it was taken, fsck is clean after every deletion (no block leaked or freed
    /// while referenced), and once every snapshot is gone the free space is what the
    /// live files leave.
    #[test]
    fn snapshots_match_a_model(steps in proptest::collection::vec(step(), 1..40)) {
        let disk = formatted(8 * 1024);
        let mut fs = mount(&disk, MountOptions::default());
        pollster::block_on(async {
            let mut live = Files::new();
            let mut snaps: Vec<(String, Files)> = Vec::new();
            let mut next = 0;
            for s in steps {
                match s {
                    Step::Write { file, block, blocks, byte } => {
                        let name = file_name(file);
                        let ino = match fs.lookup(ROOT_INO, &name).await {
                            Ok(a) => a.ino,
                            Err(_) => fs.create(ROOT_INO, &name, 0o644, OWNER).await.unwrap().ino,
                        };
                        let off = usize::from(block) * 4096;
                        let len = usize::from(blocks) * 4096;
                        fs.write(ino, off as u64, &vec![byte; len]).await.unwrap();
                        let d = live.entry(file).or_default();
                        if d.len() < off + len {
                            d.resize(off + len, 0);
                        }
                        d[off..off + len].fill(byte);
                    }
                    Step::Truncate { file, blocks } => {
                        if let Some(d) = live.get_mut(&file) {
                            let ino = fs.lookup(ROOT_INO, &file_name(file)).await.unwrap().ino;
                            let len = usize::from(blocks) * 4096;
                            let attr = SetAttr { size: Some(len as u64), ..SetAttr::default() };
                            fs.setattr(ino, attr).await.unwrap();
                            d.resize(len, 0);
                        }
                    }
                    Step::Unlink { file } => {
                        if live.remove(&file).is_some() {
                            fs.unlink(ROOT_INO, &file_name(file)).await.unwrap();
                        }
                    }
                    Step::Snapshot => {
                        let name = format!("s{next}");
                        next += 1;
                        fs.snapshot_create(&name).await.unwrap();
                        snaps.push((name, live.clone()));
                    }
                    Step::DeleteSnapshot { which } => {
                        if !snaps.is_empty() {
                            let (name, _) = snaps.remove(usize::from(which) % snaps.len());
                            fs.snapshot_delete(&name).await.unwrap();
                            fs.sync().await.unwrap();
                            check(&disk);
                        }
                    }
                    Step::Remount => {
                        fs.unmount().await.unwrap();
                        fs = NineFs::mount(&disk, MountOptions::default(), clock()).await.unwrap();
                    }
                }
            }
            assert_contents(&fs, &live).await;
            for (name, files) in &snaps {
                let view = fs.snapshot_view(name).await.unwrap();
                assert_contents(&*view, files).await;
            }
            fs.sync().await.unwrap();
            check(&disk);
            for (name, _) in snaps.drain(..) {
                fs.snapshot_delete(&name).await.unwrap();
            }
            fs.unmount().await.unwrap();
        });
        // Every block the deleted snapshots alone held is free again: fsck reports any
        // allocated block that neither the live trees nor a snapshot reference.
        let report = check(&disk);
        prop_assert_eq!(report.stats.snapshot_blocks, 0);
        prop_assert_eq!(report.stats.snapshots, 0);
    }
}

#[test]
fn every_snapshot_is_reachable_read_only_under_the_hidden_snapshots_directory() {
    use ninefs::features::snapshots::snapdir::SNAPSHOTS_DIR_INO;
    let disk = formatted(8 * 1024);
    let fs = mount(&disk, MountOptions::default());
    pollster::block_on(async {
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, OWNER).await.unwrap();
        let f = fs.create(d.ino, b"f", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, b"old").await.unwrap();
        fs.snapshot_create("nightly").await.unwrap();
        fs.write(f.ino, 0, b"new").await.unwrap();

        // Hidden from the root's listing, found by name.
        assert_eq!(names(&fs, ROOT_INO).await, vec![b"d".to_vec()]);
        let dir = fs.lookup(ROOT_INO, b".snapshots").await.unwrap();
        assert_eq!(dir.ino, SNAPSHOTS_DIR_INO);
        assert_eq!(names(&fs, dir.ino).await, vec![b"nightly".to_vec()]);
        let snap = fs.lookup(dir.ino, b"nightly").await.unwrap();
        assert_ne!(snap.ino, ROOT_INO);
        let sd = fs.lookup(snap.ino, b"d").await.unwrap();
        assert_ne!(sd.ino, d.ino);
        assert_eq!(read_all(&fs, sd.ino, b"f").await.unwrap(), b"old");
        assert_eq!(read_all(&fs, d.ino, b"f").await.unwrap(), b"new");
        assert_eq!(
            fs.lookup(snap.ino, b"..").await.unwrap().ino,
            SNAPSHOTS_DIR_INO
        );
        assert_eq!(fs.lookup(dir.ino, b"..").await.unwrap().ino, ROOT_INO);
        assert_eq!(fs.lookup(sd.ino, b"..").await.unwrap().ino, snap.ino);
        let listed = fs.readdir(sd.ino, 0, 10).await.unwrap();
        assert!(listed.iter().any(|e| e.name == b".." && e.ino == snap.ino));
        let sf = fs.lookup(sd.ino, b"f").await.unwrap();
        assert_eq!(fs.getattr(sf.ino).await.unwrap().size, 3);

        // Nothing under it changes, and its name is taken.
        let ro = Err(Errno::EROFS);
        assert_eq!(fs.write(sf.ino, 0, b"x").await.map(|_| ()), ro);
        assert_eq!(fs.create(sd.ino, b"g", 0o644, OWNER).await.map(|_| ()), ro);
        assert_eq!(fs.unlink(sd.ino, b"f").await, ro);
        assert_eq!(fs.rename(sd.ino, b"f", d.ino, b"g").await, ro);
        assert_eq!(
            fs.setxattr(sf.ino, b"user.a", b"1", vfs::XattrMode::Upsert)
                .await,
            ro
        );
        assert_eq!(fs.rmdir(ROOT_INO, b".snapshots").await, ro);
        let taken = fs.mkdir(ROOT_INO, b".snapshots", 0o755, OWNER).await;
        assert_eq!(taken.map(|_| ()), Err(Errno::EEXIST));

        // A deleted snapshot is gone from the directory, and its inodes with it.
        fs.snapshot_delete("nightly").await.unwrap();
        assert!(names(&fs, dir.ino).await.is_empty());
        assert_eq!(fs.getattr(sf.ino).await.map(|_| ()), Err(Errno::ENOENT));
        fs.unmount().await.unwrap();
    });
    check(&disk);
}

#[test]
fn the_crash_suite_takes_and_deletes_snapshots_and_they_survive_every_crash_state() {
    use testkit::sim::suite::{check, fsx, scenarios, Step};
    use testkit::sim::CrashParams;
    let random: Vec<_> = (0..100).map(fsx).collect();
    let count = |f: fn(&Step) -> bool| random.iter().filter(|w| w.steps.iter().any(f)).count();
    assert!(count(|s| matches!(s, Step::Snapshot(_))) >= 10);
    assert!(count(|s| matches!(s, Step::DeleteSnapshot(_))) >= 3);
    let named: Vec<_> = scenarios()
        .into_iter()
        .filter(|w| w.id.contains("snapshot"))
        .collect();
    assert_eq!(named.len(), 2);
    for w in &named {
        let out = check(w, &CrashParams::default(), 8);
        assert_eq!(
            (out.violations, out.fsck_errors),
            (0, 0),
            "{}",
            out.failure.unwrap_or_default()
        );
        assert!(out.states > 100, "{} states", out.states);
    }
}

/// Snapshots scale: with a thousand snapshots (each a checkpoint apart, with a file
/// changed in between), mount reads less than twice what it reads with one, and
/// deleting one reads a few walks of the trees, not one per snapshot (issue 26's "1,000
/// snapshots mount in about the time of one"; counted in bytes read, not timed).
#[test]
fn a_thousand_snapshots_cost_mount_and_delete_about_what_one_does() {
    use block::CountingDisk;
    const SNAPSHOTS: usize = 1000;
    let disk = MemDisk::new(4096, 64 * 1024);
    let opts = FormatOptions {
        secret: 1,
        node_size: 16 * 1024,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    let many = || MountOptions {
        max_snapshots: SNAPSHOTS,
        ..MountOptions::default()
    };
    // Bytes read by a mount.
    let mount_reads = || {
        let counted = CountingDisk::new(&disk);
        let handle = counted.handle();
        let started = std::time::Instant::now();
        let fs =
            pollster::block_on(NineFs::mount(counted, MountOptions::default(), clock())).unwrap();
        let read = handle.get().bytes_read;
        // Timed for the log only: the check counts bytes.
        eprintln!("mount: {read} bytes read in {:?}", started.elapsed());
        pollster::block_on(fs.unmount()).unwrap();
        read
    };
    let fs = mount(&disk, many());
    let files: Vec<Ino> = pollster::block_on(async {
        let mut inos = Vec::new();
        for i in 0..2000 {
            let name = format!("file-{i:04}");
            let a = fs
                .create(ROOT_INO, name.as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            fs.write(a.ino, 0, &[i as u8; 3000]).await.unwrap();
            inos.push(a.ino);
        }
        fs.snapshot_create("first").await.unwrap();
        fs.unmount().await.unwrap();
        inos
    });
    let with_one = mount_reads();

    let fs = mount(&disk, many());
    pollster::block_on(async {
        for n in 1..SNAPSHOTS {
            let ino = files[n % files.len()];
            fs.write(ino, 0, format!("change {n}").as_bytes())
                .await
                .unwrap();
            fs.snapshot_create(&format!("s{n:04}")).await.unwrap();
        }
        assert_eq!(fs.snapshots().await.unwrap().len(), SNAPSHOTS);
        fs.unmount().await.unwrap();
    });
    let with_many = mount_reads();
    eprintln!("mount reads: {with_one} bytes with one snapshot, {with_many} with {SNAPSHOTS}");
    assert!(
        with_many < 2 * with_one,
        "mount with {SNAPSHOTS} snapshots read {with_many} bytes, with one {with_one}"
    );

    // Deleting one in the middle, the oldest and the newest: each a few tree walks.
    let counted = CountingDisk::new(&disk);
    let handle = counted.handle();
    let fs = pollster::block_on(NineFs::mount(counted, many(), clock())).unwrap();
    pollster::block_on(async {
        for name in ["s0500", "first", "s0999"] {
            let before = handle.get().bytes_read;
            fs.snapshot_delete(name).await.unwrap();
            let read = handle.get().bytes_read - before;
            eprintln!("deleting {name} read {read} bytes");
            assert!(read < 4 * with_one, "deleting {name} read {read} bytes");
        }
        fs.unmount().await.unwrap();
    });
    check(&disk);
}

/// Reading more snapshots than may be open at once closes the least recently read
/// (counted); a closed one reads again as before, and the inode numbers a client holds
/// into it stay valid.
#[test]
fn reading_many_snapshots_keeps_a_bounded_number_open() {
    use ninefs::features::snapshots::MAX_OPEN_VIEWS;
    let disk = formatted(8 * 1024);
    let fs = mount(&disk, MountOptions::default());
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"f", 0o644, OWNER).await.unwrap();
        let count = MAX_OPEN_VIEWS + 3;
        for n in 0..count {
            fs.write(f.ino, 0, format!("version {n:02}").as_bytes())
                .await
                .unwrap();
            fs.snapshot_create(&format!("s{n:02}")).await.unwrap();
        }
        let dir = fs.lookup(ROOT_INO, b".snapshots").await.unwrap();
        let mut held = Vec::new();
        for n in 0..count {
            let snap = fs
                .lookup(dir.ino, format!("s{n:02}").as_bytes())
                .await
                .unwrap();
            assert_eq!(
                read_all(&fs, snap.ino, b"f").await.unwrap(),
                format!("version {n:02}").as_bytes()
            );
            held.push(fs.lookup(snap.ino, b"f").await.unwrap().ino);
        }
        assert_eq!(fs.stats().snapshot_views_closed, 3);
        // The first views were closed: numbers into them still read.
        for (n, ino) in held.iter().enumerate() {
            let mut buf = [0u8; 10];
            fs.read(*ino, 0, &mut buf).await.unwrap();
            assert_eq!(&buf, format!("version {n:02}").as_bytes());
        }
        fs.unmount().await.unwrap();
    });
    check(&disk);
}
