//! The valid structures the targets start from, built once per process with the
//! filesystem's own code (so they follow the format as it is today): a small image with
//! a bit of everything, the same image after a crash with commits in its log, and the
//! pipeline every image target runs (fsck, mount with replay, a client's walk and
//! writes, a clean unmount, fsck again).

use std::sync::OnceLock;

use block::MemDisk;
use fsck::{fsck, FsckOptions, Report};
use ninefs::format::{Superblock, BLOCK_SIZE};
use ninefs::volume::{format, FormatOptions, MountError, MountOptions, NineFs};
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, QuotaLimits, Timespec, XattrMode, ROOT_INO};

use crate::{block_on, walk};

/// Blocks of the images (4 MiB: the smallest filesystem).
pub const BLOCKS: u64 = 1024;
/// Who creates things.
pub const OWNER: Owner = Owner {
    uid: 1000,
    gid: 1000,
};

/// The clock every filesystem here reads (fixed: runs are deterministic).
pub fn clock() -> ManualClock {
    ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 5,
    })
}

/// Mount options: small caches (fast), everything else the default.
pub fn options() -> MountOptions {
    MountOptions {
        cache_limit: 1 << 20,
        data_cache: 256 << 10,
        ..MountOptions::default()
    }
}

/// Mounts an image.
pub fn mount(img: Vec<u8>) -> Result<NineFs<MemDisk>, MountError> {
    block_on(NineFs::mount(
        MemDisk::from_bytes(4096, img),
        options(),
        Box::new(clock()),
    ))
}

/// Checks an image (data included).
pub fn check(img: &[u8]) -> Option<Report> {
    let disk = MemDisk::from_bytes(4096, img.to_vec());
    block_on(fsck(&disk, &FsckOptions::default())).ok()
}

/// A freshly formatted image of [`BLOCKS`] blocks.
pub fn empty_image() -> Vec<u8> {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| {
        let disk = MemDisk::new(4096, BLOCKS);
        let opts = FormatOptions {
            node_size: 16 * 1024,
            uuid: [7; 16],
            secret: 0x5eed,
            now: vfs::Clock::now(&clock()),
            label: b"fuzz".to_vec(),
            ..FormatOptions::default()
        };
        block_on(format(&disk, &opts)).expect("mkfs");
        disk.snapshot()
    })
    .clone()
}

/// Fills a mounted filesystem with a bit of everything: directories, files of several
/// sizes (one with a hole), small and chunked xattrs, a long symlink, a hard link, a
/// device node, a quota root and a snapshot taken before a few more changes.
async fn populate(fs: &NineFs<MemDisk>) {
    let d = fs.mkdir(ROOT_INO, b"dir", 0o755, OWNER).await.unwrap();
    for i in 0..10u32 {
        let f = fs
            .create(d.ino, format!("f{i}").as_bytes(), 0o644, OWNER)
            .await
            .unwrap();
        let data: Vec<u8> = (0..i as usize * 1700)
            .map(|j| (j as u32 * 31 + i) as u8)
            .collect();
        fs.write(f.ino, 0, &data).await.unwrap();
        if i % 3 == 0 {
            fs.setxattr(f.ino, b"user.small", b"value", XattrMode::Upsert)
                .await
                .unwrap();
        }
    }
    let big = fs.create(ROOT_INO, b"big", 0o600, OWNER).await.unwrap();
    fs.write(big.ino, 0, &[0x5a; 20_000]).await.unwrap();
    fs.write(big.ino, 300_000, &[0xa5; 9_000]).await.unwrap();
    fs.setxattr(big.ino, b"user.big", &[3u8; 5000], XattrMode::Upsert)
        .await
        .unwrap();
    fs.symlink(ROOT_INO, b"link", &[b'x'; 2500], OWNER)
        .await
        .unwrap();
    fs.symlink(d.ino, b"up", b"../big", OWNER).await.unwrap();
    let f1 = fs.lookup(d.ino, b"f1").await.unwrap();
    fs.link(f1.ino, ROOT_INO, b"hard").await.unwrap();
    fs.mknod(ROOT_INO, b"dev", 0o20644, 0x0801, OWNER)
        .await
        .unwrap();
    let q = fs.mkdir(ROOT_INO, b"quota", 0o755, OWNER).await.unwrap();
    fs.set_quota(
        q.ino,
        QuotaLimits {
            bytes: Some(1 << 20),
            inodes: Some(100),
        },
    )
    .await
    .unwrap();
    let qf = fs.create(q.ino, b"in", 0o644, OWNER).await.unwrap();
    fs.write(qf.ino, 0, b"quota'd").await.unwrap();
    fs.snapshot_create("s1").await.unwrap();
    fs.write(big.ino, 4096, &[0x11; 4096]).await.unwrap();
    fs.unlink(d.ino, b"f2").await.unwrap();
    fs.rename(d.ino, b"f3", ROOT_INO, b"moved").await.unwrap();
}

/// [`empty_image`] populated and cleanly unmounted.
pub fn rich_image() -> Vec<u8> {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| {
        let fs = mount(empty_image()).expect("mount");
        block_on(populate(&fs));
        block_on(fs.unmount()).expect("unmount").snapshot()
    })
    .clone()
}

/// [`rich_image`] mounted, changed with fsyncs between (so the log holds commits of
/// every record kind), and taken as it is, without unmounting: a crash.
pub fn crashed_image() -> Vec<u8> {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| {
        let fs = mount(rich_image()).expect("mount");
        block_on(async {
            let n = fs.create(ROOT_INO, b"new", 0o640, OWNER).await.unwrap();
            fs.write(n.ino, 0, &[0x42; 10_000]).await.unwrap();
            fs.fsync(n.ino, false).await.unwrap();
            let nd = fs.mkdir(ROOT_INO, b"nd", 0o700, OWNER).await.unwrap();
            let f = fs.create(nd.ino, b"inner", 0o644, OWNER).await.unwrap();
            fs.write(f.ino, 0, b"inner data").await.unwrap();
            fs.setxattr(f.ino, b"user.x", b"y", XattrMode::Upsert)
                .await
                .unwrap();
            fs.fsync(f.ino, false).await.unwrap();
            let s = fs.symlink(nd.ino, b"sym", b"../new", OWNER).await.unwrap();
            fs.fsync(s.ino, false).await.unwrap();
            let d = fs.lookup(ROOT_INO, b"dir").await.unwrap();
            fs.rename(d.ino, b"f4", nd.ino, b"f4").await.unwrap();
            fs.unlink(d.ino, b"f5").await.unwrap();
            fs.fsync(nd.ino, false).await.unwrap();
            fs.fsync(d.ino, false).await.unwrap();
            let f6 = fs.lookup(d.ino, b"f6").await.unwrap();
            fs.write(f6.ino, 100, &[9; 3000]).await.unwrap();
            fs.fsync(f6.ino, true).await.unwrap();
        });
        fs.device().snapshot()
    })
    .clone()
}

/// The current superblock of an image (the valid copy with the higher generation).
pub fn superblock_of(img: &[u8]) -> Option<Superblock> {
    [1usize, 2]
        .iter()
        .filter_map(|&b| Superblock::decode(&img[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE]).ok())
        .max_by_key(|sb| sb.generation)
}

/// A client's work on a mounted filesystem: what a forged image is put through after
/// the walk. Errors are fine (the image may be damaged); panics are not.
async fn exercise(fs: &NineFs<MemDisk>) {
    if let Ok(f) = fs.create(ROOT_INO, b"fuzz-new", 0o644, OWNER).await {
        let _ = fs.write(f.ino, 0, &[0xee; 6000]).await;
        let _ = fs.fsync(f.ino, false).await;
    }
    if let Ok(d) = fs.mkdir(ROOT_INO, b"fuzz-dir", 0o755, OWNER).await {
        let _ = fs.rename(ROOT_INO, b"fuzz-new", d.ino, b"moved").await;
        let _ = fs.fsync(d.ino, false).await;
    }
    if let Ok(dir) = fs.lookup(ROOT_INO, b"dir").await {
        let _ = fs.unlink(dir.ino, b"f1").await;
        if let Ok(f) = fs.lookup(dir.ino, b"f7").await {
            let _ = fs.write(f.ino, 1000, b"overwrite").await;
            let _ = fs
                .setattr(
                    f.ino,
                    vfs::SetAttr {
                        size: Some(5),
                        ..Default::default()
                    },
                )
                .await;
        }
    }
    let _ = fs.sync().await;
}

/// What [`cycle`] found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// fsck before the mount: `None` if it could not open the image; else clean or not.
    pub fsck_before: Option<bool>,
    /// The mount worked.
    pub mounted: bool,
    /// Why the mount refused, if it did.
    pub mount_error: Option<String>,
    /// The walk's errors.
    pub walk_errors: Vec<String>,
    /// The clean unmount worked.
    pub unmounted: bool,
    /// fsck after the unmount: clean or not, and its first errors.
    pub fsck_after: Option<(bool, Vec<String>)>,
}

/// The pipeline of a forged image: fsck; mount (replaying the log); walk; a client's
/// writes; a clean unmount; fsck again. Returns what happened; the callers decide what
/// must hold.
pub fn cycle(img: Vec<u8>) -> Outcome {
    // Triage: `NINEFOLD_FUZZ_DUMP=FILE` keeps the image a reproducer forged, for
    // `ninefold fsck`, `dump` and `serve` to look at.
    if let Some(path) = std::env::var_os("NINEFOLD_FUZZ_DUMP") {
        std::fs::write(&path, &img).expect("NINEFOLD_FUZZ_DUMP: writing the image");
    }
    let mut out = Outcome {
        fsck_before: check(&img).map(|r| r.is_clean()),
        ..Outcome::default()
    };
    let fs = match mount(img) {
        Ok(fs) => fs,
        Err(e) => {
            out.mount_error = Some(e.to_string());
            return out;
        }
    };
    out.mounted = true;
    let seen = block_on(walk::walk(&fs));
    out.walk_errors = seen.errors;
    block_on(exercise(&fs));
    let Ok(disk) = block_on(fs.unmount()) else {
        return out;
    };
    out.unmounted = true;
    out.fsck_after = check(&disk.snapshot()).map(|r| {
        let first: Vec<String> = r.errors.iter().take(5).cloned().collect();
        (r.is_clean(), first)
    });
    out
}

/// The rule of issue 40: what fsck calls clean, the mount serves correctly. Checked
/// after [`cycle`]: an image fsck found clean must mount, be read without errors, take
/// a client's writes, unmount cleanly and still be clean.
pub fn assert_rule(o: &Outcome, what: &str) {
    if o.fsck_before == Some(true) {
        assert!(
            o.mounted,
            "{what}: fsck clean but the mount refuses: {}",
            o.mount_error.as_deref().unwrap_or("?")
        );
        assert!(
            o.walk_errors.is_empty(),
            "{what}: fsck clean but reads fail: {:?}",
            o.walk_errors
        );
        assert!(o.unmounted, "{what}: fsck clean but the unmount fails");
        if let Some((clean, errors)) = &o.fsck_after {
            assert!(
                clean,
                "{what}: fsck clean, mounted, written, unmounted: now {errors:?}"
            );
        }
    }
}
