//! Project quotas: limits (`EDQUOT`), moves between projects (`EXDEV`), labeling an
//! existing subtree, usage exact after log replay and after a crash at any write of a
//! `set_quota`, fsck recomputing the usage, `statfs` of a project, and the reserve that
//! keeps deletes and fsyncs working on a disk one project filled.

use std::collections::BTreeSet;

use block::{BlockDevice, FaultDisk, IoError, MemDisk};
use fsck::{fsck, FsckOptions};
use ninefs::format::features;
use ninefs::format::items::QuotaItem;
use ninefs::format::superblock::Superblock;
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use testkit::testing::ManualClock;
use vfs::{Errno, FileSystem, FileType, Ino, Owner, QuotaLimits, Timespec, ROOT_INO};

const OWNER: Owner = Owner {
    uid: 1000,
    gid: 1000,
};
const BS: u64 = 4096;

fn clock() -> ManualClock {
    ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 0,
    })
}

fn formatted(blocks: u64) -> MemDisk {
    let disk = MemDisk::new(4096, blocks);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        secret: 7,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    disk
}

fn mount<D: BlockDevice>(disk: D) -> NineFs<D> {
    pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(clock()),
    ))
    .unwrap()
}

fn fsck_report<D: BlockDevice>(disk: D) -> fsck::Report {
    pollster::block_on(fsck(disk, &FsckOptions::default())).unwrap()
}

fn assert_clean<D: BlockDevice>(disk: D) -> fsck::Report {
    let r = fsck_report(disk);
    assert!(r.is_clean(), "{:#?}", r.errors);
    r
}

fn limits(bytes: Option<u64>, inodes: Option<u64>) -> QuotaLimits {
    QuotaLimits { bytes, inodes }
}

/// A `setattr` of the size alone.
fn size(size: u64) -> vfs::SetAttr {
    vfs::SetAttr {
        size: Some(size),
        ..vfs::SetAttr::default()
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    pollster::block_on(f)
}

/// What the subtree of quota root `root` holds, counted through the interface: every
/// inode once (hard links too), its data bytes; nested quota roots left out, and so are
/// files of other projects linked in (each inode is charged to one project).
async fn recount<F: FileSystem>(fs: &F, root: Ino) -> (u64, u64) {
    let mut seen = BTreeSet::from([root]);
    let (mut bytes, mut inodes) = (0, 1);
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        let mut offset = 0;
        loop {
            let entries = fs.readdir(dir, offset, 64).await.unwrap();
            let Some(last) = entries.last() else { break };
            offset = last.next_offset;
            for e in entries {
                if e.name == b"." || e.name == b".." || !seen.insert(e.ino) {
                    continue;
                }
                let q = fs.quota(e.ino).await.unwrap().map(|q| q.root);
                if q == Some(e.ino) {
                    continue; // a nested quota root: its own project
                }
                let attr = fs.getattr(e.ino).await.unwrap();
                if q != Some(root) {
                    // Only a hard link to a file of another project may be here.
                    assert!(
                        e.file_type != FileType::Directory && attr.nlink > 1,
                        "inode {} under project {root} is charged to {q:?}",
                        e.ino
                    );
                    continue;
                }
                bytes += attr.blocks * 512;
                inodes += 1;
                if e.file_type == FileType::Directory {
                    dirs.push(e.ino);
                }
            }
        }
    }
    (bytes, inodes)
}

/// The usage `fs` keeps for quota root `root`.
async fn usage<F: FileSystem>(fs: &F, root: Ino) -> (u64, u64) {
    let q = fs.quota(root).await.unwrap().expect("a quota");
    assert_eq!(q.root, root);
    (q.bytes, q.inodes)
}

async fn assert_exact<F: FileSystem>(fs: &F, root: Ino) {
    let kept = usage(fs, root).await;
    let counted = recount(fs, root).await;
    assert_eq!(kept, counted, "usage of project {root}: kept vs counted");
}

#[test]
fn writes_stop_at_the_byte_limit_and_overwrites_truncates_deletes_do_not() {
    let fs = mount(formatted(4096));
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        let q = fs
            .set_quota(a.ino, limits(Some(16 * BS), None))
            .await
            .unwrap();
        assert_eq!((q.root, q.bytes, q.inodes), (a.ino, 0, 1));
        let f = fs.create(a.ino, b"f", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, &[1; 16 * BS as usize]).await.unwrap();
        assert_eq!(usage(&fs, a.ino).await, (16 * BS, 2));
        // One block more: refused before any data is written.
        let written = fs.stats().data_bytes_written;
        assert_eq!(fs.write(f.ino, 16 * BS, b"x").await, Err(Errno::EDQUOT));
        assert_eq!(fs.stats().data_bytes_written, written);
        assert_eq!(fs.stats().quota_exceeded, 1);
        // Overwriting what is there adds nothing.
        fs.write(f.ino, 5, &[2; 3 * BS as usize]).await.unwrap();
        let g = fs.create(a.ino, b"g", 0o644, OWNER).await.unwrap();
        assert_eq!(fs.write(g.ino, 0, b"y").await, Err(Errno::EDQUOT));
        // A clone adds the bytes it shares: refused too.
        assert_eq!(
            fs.clone_range(f.ino, 0, g.ino, 0, BS).await,
            Err(Errno::EDQUOT)
        );
        // Extending the size adds no data (a hole).
        let grow = size(64 * BS);
        fs.setattr(g.ino, grow).await.unwrap();
        // A truncation gives bytes back, inside a block too.
        let cut = size(4 * BS + 100);
        fs.setattr(f.ino, cut).await.unwrap();
        assert_eq!(usage(&fs, a.ino).await, (5 * BS, 3));
        fs.write(g.ino, 0, &[3; 11 * BS as usize]).await.unwrap();
        assert_eq!(usage(&fs, a.ino).await, (16 * BS, 3));
        // A write that crosses the limit is short: the chunks before it are in.
        fs.unlink(a.ino, b"g").await.unwrap();
        let big = vec![4u8; 20 * BS as usize];
        let h = fs.create(a.ino, b"h", 0o644, OWNER).await.unwrap();
        let n = fs.write(h.ino, 0, &big).await;
        assert!(matches!(n, Err(Errno::EDQUOT)) || n.unwrap() < big.len());
        assert!(usage(&fs, a.ino).await.0 <= 16 * BS);
        assert_exact(&fs, a.ino).await;
        // Outside the project nothing is limited.
        let o = fs.create(ROOT_INO, b"o", 0o644, OWNER).await.unwrap();
        fs.write(o.ino, 0, &big).await.unwrap();
        assert_eq!(fs.quota(o.ino).await.unwrap(), None);
    });
    let disk = block_on(fs.unmount()).unwrap();
    let r = assert_clean(&disk);
    assert_eq!(r.quotas.len(), 1);
}

#[test]
fn creates_stop_at_the_inode_limit() {
    let fs = mount(formatted(4096));
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        // The root counts: room for three more.
        fs.set_quota(a.ino, limits(None, Some(4))).await.unwrap();
        let d = fs.mkdir(a.ino, b"d", 0o755, OWNER).await.unwrap();
        fs.create(d.ino, b"f", 0o644, OWNER).await.unwrap();
        fs.symlink(a.ino, b"s", b"d/f", OWNER).await.unwrap();
        let refused = [
            fs.create(a.ino, b"x", 0o644, OWNER).await,
            fs.mkdir(d.ino, b"x", 0o755, OWNER).await,
            fs.symlink(a.ino, b"x", b"f", OWNER).await,
            fs.mknod(a.ino, b"x", vfs::mode::S_IFIFO | 0o644, 0, OWNER)
                .await,
        ];
        for r in refused {
            assert_eq!(r.map(|_| ()), Err(Errno::EDQUOT));
        }
        // A hard link is no new inode.
        let f = fs.lookup(d.ino, b"f").await.unwrap();
        fs.link(f.ino, a.ino, b"f2").await.unwrap();
        assert_eq!(usage(&fs, a.ino).await, (0, 4));
        fs.unlink(a.ino, b"s").await.unwrap();
        fs.create(a.ino, b"x", 0o644, OWNER).await.unwrap();
        assert_exact(&fs, a.ino).await;
        // Raised limits apply at once.
        fs.set_quota(a.ino, limits(None, Some(10))).await.unwrap();
        fs.create(a.ino, b"y", 0o644, OWNER).await.unwrap();
        // Statfs from inside the project shows the project.
        let st = fs.statfs_at(f.ino).await.unwrap();
        assert_eq!((st.files, st.files_free), (10, 5));
        let whole = fs.statfs().await.unwrap();
        assert_eq!(fs.statfs_at(ROOT_INO).await.unwrap(), whole);
    });
    let disk = block_on(fs.unmount()).unwrap();
    assert_clean(disk);
}

#[test]
fn renames_and_links_between_projects_are_cross_device() {
    let fs = mount(formatted(4096));
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        let b = fs.mkdir(ROOT_INO, b"b", 0o755, OWNER).await.unwrap();
        fs.set_quota(a.ino, limits(None, None)).await.unwrap();
        fs.set_quota(b.ino, limits(None, None)).await.unwrap();
        let f = fs.create(a.ino, b"f", 0o644, OWNER).await.unwrap();
        let sub = fs.mkdir(a.ino, b"sub", 0o755, OWNER).await.unwrap();
        let top = fs.create(ROOT_INO, b"top", 0o644, OWNER).await.unwrap();
        assert_eq!(fs.rename(a.ino, b"f", b.ino, b"f").await, Err(Errno::EXDEV));
        assert_eq!(
            fs.rename(a.ino, b"sub", b.ino, b"sub").await,
            Err(Errno::EXDEV)
        );
        assert_eq!(
            fs.rename(a.ino, b"f", ROOT_INO, b"f").await,
            Err(Errno::EXDEV)
        );
        assert_eq!(
            fs.rename(ROOT_INO, b"top", a.ino, b"top").await,
            Err(Errno::EXDEV)
        );
        assert_eq!(
            fs.link(f.ino, b.ino, b"f").await.map(|_| ()),
            Err(Errno::EXDEV)
        );
        assert_eq!(
            fs.link(top.ino, a.ino, b"t").await.map(|_| ()),
            Err(Errno::EXDEV)
        );
        // Within a project, anything goes.
        fs.rename(a.ino, b"f", sub.ino, b"g").await.unwrap();
        fs.link(f.ino, a.ino, b"h").await.unwrap();
        fs.rename(a.ino, b"h", a.ino, b"i").await.unwrap();
        // A quota root moves with its project.
        fs.rename(ROOT_INO, b"b", a.ino, b"b").await.unwrap();
        assert_eq!(fs.quota(b.ino).await.unwrap().unwrap().root, b.ino);
        assert_exact(&fs, a.ino).await;
        assert_exact(&fs, b.ino).await;
    });
    let disk = block_on(fs.unmount()).unwrap();
    assert_clean(disk);
}

/// A tree of `dirs` directories with `files` files each (every third one with data)
/// and a hard link, under `parent`.
async fn populate<F: FileSystem>(fs: &F, parent: Ino, dirs: u32, files: u32) {
    for d in 0..dirs {
        let dir = fs
            .mkdir(parent, format!("d{d}").as_bytes(), 0o755, OWNER)
            .await
            .unwrap();
        let inner = fs.mkdir(dir.ino, b"inner", 0o755, OWNER).await.unwrap();
        for i in 0..files {
            let at = if i % 2 == 0 { dir.ino } else { inner.ino };
            let f = fs
                .create(at, format!("f{i}").as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            if i % 3 == 0 {
                fs.write(f.ino, 0, &vec![i as u8; (i as usize + 1) * 1000])
                    .await
                    .unwrap();
            }
            if i == 1 {
                fs.link(f.ino, parent, format!("link{d}").as_bytes())
                    .await
                    .unwrap();
            }
        }
    }
}

#[test]
fn a_new_quota_root_charges_its_subtree_but_nested_roots() {
    let fs = mount(formatted(8192));
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        populate(&fs, a.ino, 6, 60).await;
        let inner = fs.lookup(a.ino, b"d2").await.unwrap();
        fs.set_quota(inner.ino, limits(None, None)).await.unwrap();
        assert_exact(&fs, inner.ino).await;
        // Set below what is already there: labeling never fails, growth does.
        let q = fs
            .set_quota(a.ino, limits(Some(BS), Some(10)))
            .await
            .unwrap();
        assert!(q.inodes > 10 && q.bytes > BS, "{q:?}");
        assert_exact(&fs, a.ino).await;
        assert_exact(&fs, inner.ino).await;
        assert_eq!(
            fs.create(a.ino, b"more", 0o644, OWNER).await.map(|_| ()),
            Err(Errno::EDQUOT)
        );
        // The nested root's project is its own (unlimited).
        fs.create(inner.ino, b"more", 0o644, OWNER).await.unwrap();
        // A quota root over everything, and a root quota: / nests a and a/d2.
        fs.set_quota(ROOT_INO, limits(None, None)).await.unwrap();
        assert_exact(&fs, ROOT_INO).await;
        assert_exact(&fs, a.ino).await;
    });
    let disk = block_on(fs.unmount()).unwrap();
    let r = assert_clean(&disk);
    assert_eq!(r.quotas.len(), 3);
    assert!(r.warnings.is_empty(), "{:#?}", r.warnings);
    // Another mount sees the same.
    let fs = mount(&disk);
    block_on(assert_exact(&fs, ROOT_INO));
}

/// Crashes (takes the disk as it is) after every step of a workload in a project with
/// fsyncs in between, so what mount finds is the last checkpoint plus the log: usage
/// is exact after every replay.
#[test]
fn usage_is_exact_after_log_replay() {
    let disk = formatted(4096);
    let fs = mount(&disk);
    let mut crashes = Vec::new();
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        fs.set_quota(a.ino, limits(Some(1 << 30), None))
            .await
            .unwrap();
        let d = fs.mkdir(a.ino, b"d", 0o755, OWNER).await.unwrap();
        let mut files = Vec::new();
        for i in 0..12u32 {
            let f = fs
                .create(d.ino, format!("f{i}").as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            fs.write(f.ino, u64::from(i) * 3000, &vec![i as u8; 9000])
                .await
                .unwrap();
            files.push(f.ino);
            match i % 4 {
                0 => fs.fsync(f.ino, false).await.unwrap(),
                1 => fs.fsync(f.ino, true).await.unwrap(),
                2 => {
                    let prev = files[i as usize - 1];
                    let cut = size(100);
                    fs.setattr(prev, cut).await.unwrap();
                    fs.fsync(prev, false).await.unwrap();
                }
                _ => {
                    fs.unlink(d.ino, format!("f{}", i - 3).as_bytes())
                        .await
                        .unwrap();
                    let src = files[i as usize - 1];
                    fs.clone_range(src, 0, f.ino, 0, 2 * BS).await.unwrap();
                    fs.fsync(d.ino, false).await.unwrap();
                    fs.fsync(f.ino, false).await.unwrap();
                }
            }
            crashes.push(disk.snapshot());
        }
    });
    assert!(fs.stats().log.commits > 0);
    drop(fs);
    for (i, image) in crashes.into_iter().enumerate() {
        let disk = MemDisk::from_bytes(4096, image);
        let fs = mount(&disk);
        let a = block_on(fs.lookup(ROOT_INO, b"a")).unwrap();
        block_on(assert_exact(&fs, a.ino));
        assert!(fs.stats().log.replayed_commits > 0, "crash {i}");
        let disk = block_on(fs.unmount()).unwrap();
        assert_clean(disk);
    }
}

/// A crash at every write of a `set_quota` that labels a subtree: the image is
/// consistent (fsck), and the next mount finishes the labeling with exact usage.
#[test]
fn a_crash_while_labeling_is_finished_by_the_next_mount() {
    let disk = formatted(8192);
    let fs = mount(&disk);
    let a = block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        populate(&fs, a.ino, 4, 100).await;
        a.ino
    });
    let image = block_on(fs.unmount()).unwrap().snapshot();
    let mut outcomes = [0usize; 3];
    for n in 0.. {
        let disk = MemDisk::from_bytes(4096, image.clone());
        let faulty = FaultDisk::new(&disk, 1);
        faulty.inject(block::Fault::NthWrite(n), IoError::Device(1));
        // A failed write is a crash there: nothing after it reaches the disk.
        let done = match block_on(NineFs::mount(
            &faulty,
            MountOptions::default(),
            Box::new(clock()),
        )) {
            Ok(fs) => block_on(fs.set_quota(a, limits(None, Some(100_000)))).is_ok(),
            Err(_) => false,
        };
        let r = assert_clean(&disk);
        // No item, an item still labeling, or the whole project.
        let state = match r.quotas.first() {
            None => 0,
            Some((_, q)) if q.flags & QuotaItem::LABELING != 0 => 1,
            Some(_) => 2,
        };
        outcomes[state] += 1;
        let fs = mount(&disk);
        match state {
            0 => assert_eq!(block_on(fs.quota(a)).unwrap(), None),
            _ => block_on(assert_exact(&fs, a)),
        }
        let disk = block_on(fs.unmount()).unwrap();
        let r = assert_clean(disk);
        assert!(r.quotas.iter().all(|(_, q)| q.flags == 0), "write {n}");
        if done && faulty.counters().injected_errors == 0 {
            break;
        }
    }
    assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
}

/// Writes a new superblock (both copies) with `f` applied: what other code or damage
/// could leave.
fn edit_superblock(disk: &MemDisk, f: impl Fn(&mut Superblock)) {
    for block in [1u64, 2] {
        let mut buf = vec![0u8; 4096];
        block_on(disk.read(block, &mut buf)).unwrap();
        if let Ok(mut sb) = Superblock::decode(&buf) {
            f(&mut sb);
            block_on(disk.write(block, &sb.encode(), block::WriteFlags::NONE)).unwrap();
        }
    }
}

/// Code that does not know quotas (the feature bit cleared: it would ignore it) lets
/// the usage drift; fsck notices.
#[test]
fn fsck_finds_a_usage_that_does_not_match() {
    let disk = formatted(4096);
    let fs = mount(&disk);
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        fs.set_quota(a.ino, limits(None, None)).await.unwrap();
    });
    block_on(fs.unmount()).unwrap();
    edit_superblock(&disk, |sb| sb.ro_compat &= !features::RO_COMPAT_QUOTA);
    let fs = mount(&disk);
    block_on(async {
        let a = fs.lookup(ROOT_INO, b"a").await.unwrap();
        let f = fs.create(a.ino, b"f", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, &[1; 8192]).await.unwrap();
    });
    block_on(fs.unmount()).unwrap();
    edit_superblock(&disk, |sb| sb.ro_compat |= features::RO_COMPAT_QUOTA);
    let r = fsck_report(&disk);
    assert_eq!(r.errors.len(), 1, "{:#?}", r.errors);
    assert!(
        r.errors[0].contains(
            "quota item records 0 bytes and 1 inodes, its inodes hold 8192 bytes and 2 inodes"
        ),
        "{:#?}",
        r.errors
    );
}

/// An image with quotas and a feature bit this code does not know mounts read-only;
/// one with quotas mounts writable here.
#[test]
fn the_quota_feature_is_read_only_compatible() {
    let disk = formatted(4096);
    let fs = mount(&disk);
    block_on(fs.set_quota(ROOT_INO, limits(None, None))).unwrap();
    assert_ne!(fs.superblock().ro_compat & features::RO_COMPAT_QUOTA, 0);
    block_on(fs.unmount()).unwrap();
    assert_eq!(
        features::RO_COMPAT_SUPPORTED & features::RO_COMPAT_QUOTA,
        features::RO_COMPAT_QUOTA
    );
    let fs = mount(&disk);
    block_on(fs.create(ROOT_INO, b"f", 0o644, OWNER)).unwrap();
}

/// One project fills the disk: its writes and creates fail with ENOSPC while the
/// reserve stays free, so another project's fsync of data it wrote, deletes, renames
/// and truncations still work, and once space is freed creates work again.
#[test]
fn a_full_disk_leaves_deletes_and_fsyncs_working() {
    let disk = formatted(4096);
    let fs = mount(&disk);
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        let b = fs.mkdir(ROOT_INO, b"b", 0o755, OWNER).await.unwrap();
        fs.set_quota(a.ino, limits(None, None)).await.unwrap();
        fs.set_quota(b.ino, limits(None, None)).await.unwrap();
        // B wrote data and has not synced it yet.
        let mine = fs.create(b.ino, b"mine", 0o644, OWNER).await.unwrap();
        fs.write(mine.ino, 0, &[9; 40_000]).await.unwrap();
        // A fills the disk.
        let chunk = vec![1u8; 256 * 1024];
        let mut n = 0;
        'fill: for i in 0.. {
            let f = match fs
                .create(a.ino, format!("f{i}").as_bytes(), 0o644, OWNER)
                .await
            {
                Ok(f) => f,
                Err(e) => {
                    assert_eq!(e, Errno::ENOSPC);
                    break;
                }
            };
            for off in 0..16u64 {
                match fs.write(f.ino, off * chunk.len() as u64, &chunk).await {
                    Ok(w) if w == chunk.len() => n += w,
                    Ok(w) => {
                        n += w;
                        break 'fill;
                    }
                    Err(e) => {
                        assert_eq!(e, Errno::ENOSPC);
                        break 'fill;
                    }
                }
            }
        }
        assert!(n > 8 << 20, "wrote only {n} bytes");
        let st = fs.statfs().await.unwrap();
        assert!(st.blocks_avail < 64, "{st:?}");
        // Writes and creates fail for everyone now.
        assert_eq!(
            fs.write(mine.ino, 1 << 20, &chunk).await,
            Err(Errno::ENOSPC)
        );
        assert_eq!(
            fs.create(b.ino, b"new", 0o644, OWNER).await.map(|_| ()),
            Err(Errno::ENOSPC)
        );
        // B's fsync of what it wrote, a truncation, a rename and a delete work.
        fs.fsync(mine.ino, false).await.unwrap();
        let cut = size(5000);
        fs.setattr(mine.ino, cut).await.unwrap();
        fs.fsync(mine.ino, true).await.unwrap();
        fs.rename(b.ino, b"mine", b.ino, b"kept").await.unwrap();
        fs.fsync(b.ino, false).await.unwrap();
        fs.unlink(a.ino, b"f0").await.unwrap();
        fs.unlink(a.ino, b"f1").await.unwrap();
        fs.sync().await.unwrap();
        fs.create(b.ino, b"new", 0o644, OWNER).await.unwrap();
        let mut buf = vec![0u8; 6000];
        let kept = fs.lookup(b.ino, b"kept").await.unwrap();
        assert_eq!(fs.read(kept.ino, 0, &mut buf).await.unwrap(), 5000);
        assert!(buf[..5000].iter().all(|&x| x == 9));
        assert_exact(&fs, a.ino).await;
        assert_exact(&fs, b.ino).await;
    });
    let disk = block_on(fs.unmount()).unwrap();
    assert_clean(disk);
}

/// The log may hold a file's growth without the shrink of another that made room for it
/// (never synced): replay takes the project past its limit rather than fail the mount,
/// with exact usage, and growth is refused from then on.
#[test]
fn replay_may_pass_a_limit_and_never_fails_on_one() {
    let disk = formatted(4096);
    let fs = mount(&disk);
    let a = block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        fs.set_quota(a.ino, limits(Some(16 * BS), None))
            .await
            .unwrap();
        let y = fs.create(a.ino, b"y", 0o644, OWNER).await.unwrap();
        fs.write(y.ino, 0, &[1; 12 * BS as usize]).await.unwrap();
        fs.sync().await.unwrap();
        // Room made, not synced; the growth it made room for is.
        fs.setattr(y.ino, size(0)).await.unwrap();
        let x = fs.create(a.ino, b"x", 0o644, OWNER).await.unwrap();
        fs.write(x.ino, 0, &[2; 12 * BS as usize]).await.unwrap();
        fs.fsync(x.ino, false).await.unwrap();
        a.ino
    });
    let crashed = MemDisk::from_bytes(4096, disk.snapshot());
    drop(fs);
    let fs = mount(&crashed);
    block_on(async {
        assert_eq!(usage(&fs, a).await, (24 * BS, 3));
        assert_exact(&fs, a).await;
        let x = fs.lookup(a, b"x").await.unwrap();
        assert_eq!(fs.write(x.ino, 12 * BS, b"z").await, Err(Errno::EDQUOT));
        // Shrinking is allowed over the limit, and makes room again.
        let y = fs.lookup(a, b"y").await.unwrap();
        fs.setattr(y.ino, size(0)).await.unwrap();
        fs.write(x.ino, 12 * BS, b"z").await.unwrap();
    });
    let disk = block_on(fs.unmount()).unwrap();
    assert_clean(disk);
}

/// Removing a quota root ends its project: its item goes with the last inode charged to
/// it (a file linked elsewhere keeps it until then).
#[test]
fn a_removed_quota_root_takes_its_item_with_its_last_inode() {
    let fs = mount(formatted(4096));
    block_on(async {
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
        let b = fs.mkdir(ROOT_INO, b"b", 0o755, OWNER).await.unwrap();
        fs.set_quota(a.ino, limits(None, None)).await.unwrap();
        fs.set_quota(b.ino, limits(None, None)).await.unwrap();
        let f = fs.create(b.ino, b"f", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, &[1; 5000]).await.unwrap();
        let keep = fs.create(ROOT_INO, b"keep", 0o644, OWNER).await.unwrap();
        fs.rmdir(ROOT_INO, b"a").await.unwrap();
        assert_eq!(fs.quotas().await.unwrap().len(), 1);
        fs.unlink(b.ino, b"f").await.unwrap();
        assert_eq!(usage(&fs, b.ino).await, (0, 1));
        fs.rmdir(ROOT_INO, b"b").await.unwrap();
        assert!(fs.quotas().await.unwrap().is_empty());
        assert_eq!(fs.quota(keep.ino).await.unwrap(), None);
    });
    let disk = block_on(fs.unmount()).unwrap();
    assert_clean(&disk);
    // A root removed while a file of its project is linked elsewhere.
    let fs = mount(&disk);
    block_on(async {
        let c = fs.mkdir(ROOT_INO, b"c", 0o755, OWNER).await.unwrap();
        let d = fs.mkdir(c.ino, b"d", 0o755, OWNER).await.unwrap();
        let f = fs.create(d.ino, b"f", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, &[2; 5000]).await.unwrap();
        fs.link(f.ino, c.ino, b"g").await.unwrap();
        fs.set_quota(d.ino, limits(None, None)).await.unwrap();
        fs.unlink(d.ino, b"f").await.unwrap();
        fs.rmdir(c.ino, b"d").await.unwrap();
        let q = fs.quota(f.ino).await.unwrap().unwrap();
        assert_eq!((q.root, q.bytes, q.inodes), (d.ino, 8192, 1));
        fs.unlink(c.ino, b"g").await.unwrap();
        assert!(fs.quotas().await.unwrap().is_empty());
    });
    let disk = block_on(fs.unmount()).unwrap();
    assert_clean(disk);
}

/// One step of [`limits_are_exact`].
#[derive(Clone, Debug)]
enum QuotaOp {
    Create(u8),
    Mkdir(u8),
    /// File, offset, length in bytes.
    Write(u8, u64, usize),
    Truncate(u8, u64),
    Unlink(u8),
    /// Source, destination, blocks.
    Clone(u8, u8, u64),
}

fn quota_op() -> impl proptest::strategy::Strategy<Value = QuotaOp> {
    use proptest::prelude::*;
    let f = 0u8..5;
    prop_oneof![
        f.clone().prop_map(QuotaOp::Create),
        f.clone().prop_map(QuotaOp::Mkdir),
        (f.clone(), 0u64..12 * BS, 1usize..6 * BS as usize)
            .prop_map(|(i, o, n)| QuotaOp::Write(i, o, n)),
        (f.clone(), 0u64..10 * BS).prop_map(|(i, s)| QuotaOp::Truncate(i, s)),
        f.clone().prop_map(QuotaOp::Unlink),
        (f.clone(), f, 1u64..4).prop_map(|(s, d, n)| QuotaOp::Clone(s, d, n)),
    ]
}

async fn apply_quota_op<F: FileSystem>(fs: &F, dir: Ino, op: &QuotaOp) -> Result<(), Errno> {
    let name = |i: &u8| format!("n{i}").into_bytes();
    let ino = |i: &u8| {
        let n = name(i);
        async move { fs.lookup(dir, &n).await.map(|a| a.ino) }
    };
    match op {
        QuotaOp::Create(i) => fs.create(dir, &name(i), 0o644, OWNER).await.map(|_| ()),
        QuotaOp::Mkdir(i) => fs.mkdir(dir, &name(i), 0o755, OWNER).await.map(|_| ()),
        QuotaOp::Write(i, off, len) => {
            let data = vec![*i + 1; *len];
            let n = fs.write(ino(i).await?, *off, &data).await?;
            assert_eq!(n, *len, "one chunk: whole or refused");
            Ok(())
        }
        QuotaOp::Truncate(i, s) => fs.setattr(ino(i).await?, size(*s)).await.map(|_| ()),
        QuotaOp::Unlink(i) => match fs.unlink(dir, &name(i)).await {
            Err(Errno::EISDIR) => fs.rmdir(dir, &name(i)).await,
            r => r,
        },
        QuotaOp::Clone(s, d, n) => {
            let (src, dst) = (ino(s).await?, ino(d).await?);
            fs.clone_range(src, 0, dst, 0, n * BS).await
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 96, ..Default::default() })]

    /// Random operations in a project with small limits: after each, the usage is what
    /// the inodes hold; growth stays within the limits; and an operation refused with
    /// `EDQUOT` changed nothing and, run again with the limits lifted, does take the
    /// project past a limit (so `EDQUOT` is exactly "would pass a limit").
    #[test]
    fn limits_are_exact(ops in proptest::collection::vec(quota_op(), 1..40)) {
        let fs = mount(formatted(4096));
        let (byte_limit, inode_limit) = (14 * BS, 5);
        let set = limits(Some(byte_limit), Some(inode_limit));
        block_on(async {
            let a = fs.mkdir(ROOT_INO, b"a", 0o755, OWNER).await.unwrap();
            fs.set_quota(a.ino, set).await.unwrap();
            for i in 0..3 {
                apply_quota_op(&fs, a.ino, &QuotaOp::Create(i)).await.unwrap();
            }
            for op in &ops {
                let before = usage(&fs, a.ino).await;
                match apply_quota_op(&fs, a.ino, op).await {
                    Ok(()) => {
                        let after = usage(&fs, a.ino).await;
                        assert!(after.0 <= before.0 || after.0 <= byte_limit, "{op:?}: {after:?}");
                        assert!(after.1 <= before.1 || after.1 <= inode_limit, "{op:?}: {after:?}");
                    }
                    Err(Errno::EDQUOT) => {
                        assert_eq!(usage(&fs, a.ino).await, before, "{op:?} refused");
                        fs.set_quota(a.ino, limits(None, None)).await.unwrap();
                        apply_quota_op(&fs, a.ino, op).await.unwrap();
                        let after = usage(&fs, a.ino).await;
                        assert!(
                            after.0 > byte_limit || after.1 > inode_limit,
                            "{op:?} was refused but fits: {before:?} -> {after:?}"
                        );
                        fs.set_quota(a.ino, set).await.unwrap();
                    }
                    Err(_) => assert_eq!(usage(&fs, a.ino).await, before, "{op:?} failed"),
                }
                assert_exact(&fs, a.ino).await;
            }
        });
        let disk = block_on(fs.unmount()).unwrap();
        assert_clean(disk);
    }
}
