//! The data cache and readahead through the filesystem: reads never return stale data or
//! another file's data — however small the cache, whatever was read ahead, after writes,
//! truncates, deletes, clones, snapshots, remounts and the reuse of freed blocks; a pass
//! over a file twice the cache's size leaves the hot set; a sequential reader is read
//! ahead of.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use block::{yield_now, MemDisk};
use fsck::{fsck, FsckOptions};
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use ninefs::cache::data::ENTRY_BYTES;
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use proptest::prelude::*;
use proptest::test_runner::Config;
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{run_against_model, CompareOptions, ManualClock};
use vfs::{
    Attr, FileSystem, FsResult, Ino, Owner, ReadCtx, ReadStream, SetAttr, Timespec, ROOT_INO,
};

const OWNER: Owner = Owner { uid: 0, gid: 0 };

fn now() -> Timespec {
    Timespec {
        sec: 1_700_000_000,
        nsec: 0,
    }
}

fn formatted(blocks: u64) -> MemDisk {
    formatted_at(blocks, now())
}

fn formatted_at(blocks: u64, now: Timespec) -> MemDisk {
    let disk = MemDisk::new(4096, blocks);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        secret: 7,
        now,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    disk
}

/// Mount options with a data cache of `blocks` blocks that borrows nothing from the node
/// cache (whose limit is small and mostly used). Freed blocks are not discarded (a
/// discard drops them from the cache too): only the writes that reuse them do.
fn opts(blocks: usize) -> MountOptions {
    MountOptions {
        cache_limit: 64 << 10,
        data_cache: blocks * ENTRY_BYTES,
        discard: None,
        ..MountOptions::default()
    }
}

/// The filesystem, with every read made through one read stream per inode (so
/// sequential reads ask for readahead, carried out at once) and charged to one of three
/// tenants; after every change and every read the whole file is read into the cache
/// too. The cache is kept as full of blocks read ahead of time as it can be, so that
/// every write, truncate, delete and block reuse meets cached copies it must make
/// stale.
struct Eager {
    fs: NineFs<MemDisk>,
    streams: RefCell<HashMap<Ino, Arc<ReadStream>>>,
}

impl Eager {
    fn new(fs: NineFs<MemDisk>) -> Eager {
        Eager {
            fs,
            streams: RefCell::default(),
        }
    }

    async fn fill(&self, ino: Ino) {
        // Failures (a directory, a removed file) are the operation's to report.
        let _ = self.fs.prefetch(ino, 0..u64::MAX, Some(ino % 3)).await;
        let _ = self.fs.readahead_now().await;
    }

    fn check_cache(&self) {
        let cache = self.fs.data_cache();
        cache.check().expect("the cache's books");
        assert_eq!(cache.report().stale, 0, "a block rewritten under the cache");
    }
}

impl FileSystem for Eager {
    vfs::forward_filesystem!(self.fs; except read, write, append, setattr, clone_range);

    async fn read(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        let stream = self.streams.borrow_mut().entry(ino).or_default().clone();
        let ctx = ReadCtx {
            tenant: Some(ino % 3),
            stream: Some(&stream),
        };
        let n = self.fs.read_with(ino, offset, buf, ctx).await;
        self.fs.readahead_now().await;
        self.fill(ino).await;
        n
    }

    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.fill(ino).await;
        let n = self.fs.write(ino, offset, data).await;
        self.fill(ino).await;
        n
    }

    async fn append(&self, ino: Ino, data: &[u8]) -> FsResult<(u64, usize)> {
        self.fill(ino).await;
        let r = self.fs.append(ino, data).await;
        self.fill(ino).await;
        r
    }

    async fn setattr(&self, ino: Ino, changes: SetAttr) -> FsResult<Attr> {
        self.fill(ino).await;
        let r = self.fs.setattr(ino, changes).await;
        self.fill(ino).await;
        r
    }

    async fn clone_range(&self, src: Ino, so: u64, dst: Ino, d: u64, len: u64) -> FsResult<()> {
        self.fill(src).await;
        self.fill(dst).await;
        let r = self.fs.clone_range(src, so, dst, d, len).await;
        self.fill(dst).await;
        r
    }
}

fn assert_fsck_clean(disk: &MemDisk) {
    let report = pollster::block_on(fsck(disk, &FsckOptions::default())).expect("fsck runs");
    assert!(report.is_clean(), "fsck: {:#?}", report.errors);
}

/// Runs `ops` against the model through [`Eager`] over a data cache of `blocks` blocks
/// on a small filesystem (so freed blocks are soon reused).
fn check(ops: &[testkit::testing::Op], blocks: usize) -> Result<(), TestCaseError> {
    let clock: Rc<RefCell<Option<ManualClock>>> = Rc::default();
    let make_clock = clock.clone();
    let make = move |c: ManualClock| {
        *make_clock.borrow_mut() = Some(c.clone());
        let disk = formatted_at(4096, vfs::Clock::now(&c));
        Eager::new(pollster::block_on(NineFs::mount(disk, opts(blocks), Box::new(c))).unwrap())
    };
    let remount = move |e: Eager| {
        e.check_cache();
        let disk = pollster::block_on(e.fs.unmount()).expect("clean unmount");
        assert_fsck_clean(&disk);
        let c = clock.borrow().clone().expect("clock set");
        Eager::new(
            pollster::block_on(NineFs::mount(disk, opts(blocks), Box::new(c))).expect("remount"),
        )
    };
    let runner = run_against_model(ops, make, remount, CompareOptions::default())?;
    let e = runner.into_fs();
    e.check_cache();
    let disk = pollster::block_on(e.fs.unmount()).expect("clean unmount");
    assert_fsck_clean(&disk);
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: strategy::cases(96), ..Config::default() })]

    /// A cache of 24 blocks: every block is evicted and read again over and over.
    #[test]
    fn matches_the_model_through_a_tiny_cache(ops in strategy::ops(GenConfig::default(), 1..80)) {
        check(&ops, 24)?;
    }

    /// A cache larger than the files: blocks stay cached until written over or freed.
    #[test]
    fn matches_the_model_through_a_cache_that_holds_everything(
        ops in strategy::ops(GenConfig::default(), 1..80)
    ) {
        check(&ops, 4096)?;
    }
}

/// What the reuse test does to one of its files.
#[derive(Clone, Debug)]
enum Step {
    Write {
        file: usize,
        at: u32,
        len: u32,
        seed: u8,
    },
    Read {
        file: usize,
        at: u32,
        len: u32,
    },
    Truncate {
        file: usize,
        len: u32,
    },
    Clone {
        from: usize,
        to: usize,
    },
    Delete {
        file: usize,
    },
    /// A checkpoint: what was freed may be allocated again.
    Sync,
}

fn step() -> impl Strategy<Value = Step> {
    let file = 0..4usize;
    prop_oneof![
        4 => (file.clone(), 0..256u32 << 10, 1..512u32 << 10, any::<u8>())
            .prop_map(|(file, at, len, seed)| Step::Write { file, at, len, seed }),
        4 => (file.clone(), 0..512u32 << 10, 1..512u32 << 10)
            .prop_map(|(file, at, len)| Step::Read { file, at, len }),
        1 => (file.clone(), 0..300u32 << 10).prop_map(|(file, len)| Step::Truncate { file, len }),
        1 => (file.clone(), file.clone()).prop_map(|(from, to)| Step::Clone { from, to }),
        2 => file.prop_map(|file| Step::Delete { file }),
        2 => Just(Step::Sync),
    ]
}

/// Runs `steps` on a filesystem small enough that the allocator wraps around within a
/// few MiB, so blocks freed by deletes, truncates and copy-on-write are soon written
/// again, with every file read into a cache of `blocks` blocks (ahead of time, as
/// readahead does) after every step; every read is compared with what was written.
fn reuse(steps: &[Step], blocks: usize) {
    let fs = mount(formatted(1024), opts(blocks));
    let mut files: Vec<Option<(Ino, Vec<u8>)>> = vec![None; 4];
    pollster::block_on(async {
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Step::Write {
                    file,
                    at,
                    len,
                    seed,
                } => {
                    let name = [b'f', b'0' + file as u8];
                    let (ino, data) = match files[file].take() {
                        Some(f) => f,
                        None => match fs.create(ROOT_INO, &name, 0o644, OWNER).await {
                            Ok(a) => (a.ino, Vec::new()),
                            Err(vfs::Errno::ENOSPC) => continue,
                            Err(e) => panic!("step {i}: create: {e}"),
                        },
                    };
                    let mut data = data;
                    let bytes = pattern(seed, len as usize);
                    match fs.write(ino, u64::from(at), &bytes).await {
                        Ok(n) => {
                            assert_eq!(n, bytes.len());
                            let end = at as usize + bytes.len();
                            if data.len() < end {
                                data.resize(end, 0);
                            }
                            data[at as usize..end].copy_from_slice(&bytes);
                        }
                        Err(vfs::Errno::ENOSPC) => {}
                        Err(e) => panic!("step {i}: write: {e}"),
                    }
                    files[file] = Some((ino, data));
                }
                Step::Read { file, at, len } => {
                    if let Some((ino, data)) = &files[file] {
                        let got =
                            read_at(&fs, *ino, u64::from(at), len as usize, Some(file as u64))
                                .await;
                        let from = (at as usize).min(data.len());
                        let to = (at as usize + len as usize).min(data.len());
                        assert!(
                            got == data[from..to],
                            "step {i}: read of file {file} at {at}"
                        );
                    }
                }
                Step::Truncate { file, len } => {
                    if let Some((ino, data)) = &mut files[file] {
                        let set = SetAttr {
                            size: Some(u64::from(len)),
                            ..SetAttr::default()
                        };
                        match fs.setattr(*ino, set).await {
                            Ok(_) => data.resize(len as usize, 0),
                            Err(vfs::Errno::ENOSPC) => {}
                            Err(e) => panic!("step {i}: truncate: {e}"),
                        }
                    }
                }
                Step::Clone { from, to } => {
                    if from == to {
                        continue;
                    }
                    if let (Some((src, sdata)), Some((dst, _))) = (files[from].clone(), &files[to])
                    {
                        let len = (sdata.len() as u64) / 4096 * 4096;
                        match fs.clone_range(src, 0, *dst, 0, len).await {
                            Ok(()) => {
                                let (_, ddata) = files[to].as_mut().unwrap();
                                if ddata.len() < len as usize {
                                    ddata.resize(len as usize, 0);
                                }
                                ddata[..len as usize].copy_from_slice(&sdata[..len as usize]);
                            }
                            Err(vfs::Errno::ENOSPC) => {}
                            Err(e) => panic!("step {i}: clone: {e}"),
                        }
                    }
                }
                Step::Delete { file } => {
                    if files[file].take().is_some() {
                        fs.unlink(ROOT_INO, &[b'f', b'0' + file as u8])
                            .await
                            .unwrap();
                    }
                }
                Step::Sync => fs.sync().await.unwrap(),
            }
            for (k, f) in files.iter().enumerate() {
                if let Some((ino, _)) = f {
                    fs.prefetch(*ino, 0..u64::MAX, Some(k as u64))
                        .await
                        .unwrap();
                }
            }
        }
        for (k, f) in files.iter().enumerate() {
            if let Some((ino, data)) = f {
                assert!(
                    read_at(&fs, *ino, 0, data.len() + 1, None).await == *data,
                    "file {k} at the end"
                );
            }
        }
    });
    let cache = fs.data_cache();
    cache.check().unwrap();
    assert_eq!(
        cache.report().stale,
        0,
        "a cached block outlived a write over it"
    );
    assert_fsck_clean(&pollster::block_on(fs.unmount()).unwrap());
}

proptest! {
    #![proptest_config(Config { cases: strategy::cases(64), ..Config::default() })]

    /// Freed blocks written again, with a cache that holds the whole device.
    #[test]
    fn reused_blocks_are_never_served_stale(steps in proptest::collection::vec(step(), 1..60)) {
        reuse(&steps, 1024);
    }

    /// The same through a cache of 48 blocks.
    #[test]
    fn reused_blocks_are_never_served_stale_by_a_small_cache(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        reuse(&steps, 48);
    }
}

fn mount(disk: MemDisk, opts: MountOptions) -> NineFs<MemDisk> {
    pollster::block_on(NineFs::mount(disk, opts, Box::new(ManualClock::new(now())))).unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

async fn read_at(
    fs: &NineFs<MemDisk>,
    ino: Ino,
    offset: u64,
    len: usize,
    who: Option<u64>,
) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let ctx = ReadCtx {
        tenant: who,
        stream: None,
    };
    let n = fs.read_with(ino, offset, &mut buf, ctx).await.unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn a_freed_block_reused_by_another_file_is_read_as_the_new_file() {
    // A cache larger than the device: every block freed is still cached when reused.
    let fs = mount(formatted(2048), opts(4096));
    pollster::block_on(async {
        let mut seen = 0;
        for round in 0..40u8 {
            let name = [b'f', b'a' + round];
            let a = fs.create(ROOT_INO, &name, 0o644, OWNER).await.unwrap();
            let data = pattern(round, 256 << 10);
            fs.write(a.ino, 0, &data).await.unwrap();
            assert_eq!(read_at(&fs, a.ino, 0, data.len(), None).await, data);
            assert_eq!(
                read_at(&fs, a.ino, 0, data.len(), None).await,
                data,
                "cached"
            );
            fs.unlink(ROOT_INO, &name).await.unwrap();
            // The release committed: the blocks are free for the next round.
            fs.sync().await.unwrap();
            seen = fs.data_cache().counters().invalidations.max(seen);
        }
        assert!(
            seen > 0,
            "freed blocks were written over and dropped from the cache"
        );
        assert_eq!(fs.data_cache().report().stale, 0);
        assert!(fs.data_cache().counters().hits > 0);
    });
    assert_fsck_clean(&pollster::block_on(fs.unmount()).unwrap());
}

#[test]
fn snapshots_and_clones_share_cached_blocks_and_keep_their_own_data() {
    let fs = mount(formatted(8192), opts(2048));
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"f", 0o644, OWNER).await.unwrap();
        let old = pattern(1, 512 << 10);
        fs.write(f.ino, 0, &old).await.unwrap();
        fs.sync().await.unwrap();
        assert_eq!(read_at(&fs, f.ino, 0, old.len(), Some(1)).await, old);
        fs.snapshot_create("s").await.unwrap();
        let snaps = fs.lookup(ROOT_INO, b".snapshots").await.unwrap();
        let s = fs.lookup(snaps.ino, b"s").await.unwrap();
        let sf = fs.lookup(s.ino, b"f").await.unwrap();
        // The snapshot's file is the same blocks: read from the cache.
        let misses = fs.data_cache().counters().misses;
        assert_eq!(read_at(&fs, sf.ino, 0, old.len(), Some(2)).await, old);
        assert_eq!(
            fs.data_cache().counters().misses,
            misses,
            "shared blocks hit"
        );
        // A clone too.
        let g = fs.create(ROOT_INO, b"g", 0o644, OWNER).await.unwrap();
        fs.clone_range(f.ino, 0, g.ino, 0, old.len() as u64)
            .await
            .unwrap();
        assert_eq!(read_at(&fs, g.ino, 0, old.len(), Some(1)).await, old);
        assert_eq!(
            fs.data_cache().counters().misses,
            misses,
            "cloned blocks hit"
        );
        // Overwritten in the live file: the snapshot and the clone keep the old data.
        let new = pattern(9, 512 << 10);
        fs.write(f.ino, 4096, &new[4096..200 << 10]).await.unwrap();
        let mut want = old.clone();
        want[4096..200 << 10].copy_from_slice(&new[4096..200 << 10]);
        assert_eq!(read_at(&fs, f.ino, 0, old.len(), Some(1)).await, want);
        assert_eq!(read_at(&fs, sf.ino, 0, old.len(), Some(2)).await, old);
        assert_eq!(read_at(&fs, g.ino, 0, old.len(), Some(1)).await, old);
        // The snapshot deleted and its blocks reused: still right everywhere.
        fs.snapshot_delete("s").await.unwrap();
        fs.unlink(ROOT_INO, b"g").await.unwrap();
        fs.sync().await.unwrap();
        let h = fs.create(ROOT_INO, b"h", 0o644, OWNER).await.unwrap();
        let other = pattern(77, 1 << 20);
        fs.write(h.ino, 0, &other).await.unwrap();
        assert_eq!(read_at(&fs, h.ino, 0, other.len(), None).await, other);
        assert_eq!(read_at(&fs, f.ino, 0, old.len(), None).await, want);
        assert_eq!(fs.data_cache().report().stale, 0);
        fs.data_cache().check().unwrap();
    });
    assert_fsck_clean(&pollster::block_on(fs.unmount()).unwrap());
}

/// Reads `ino` from the start in `chunk`-byte reads through one stream, as `who`,
/// checking the bytes against `want`; lets other tasks run after each read.
async fn read_sequentially(
    fs: &NineFs<MemDisk>,
    ino: Ino,
    want: &[u8],
    chunk: usize,
    who: Option<u64>,
) {
    let stream = Arc::new(ReadStream::new());
    let mut buf = vec![0u8; chunk];
    let mut at = 0;
    while at < want.len() {
        let ctx = ReadCtx {
            tenant: who,
            stream: Some(&stream),
        };
        let n = fs.read_with(ino, at as u64, &mut buf, ctx).await.unwrap();
        assert!(n > 0);
        assert!(buf[..n] == want[at..at + n], "bytes at {at}");
        at += n;
        yield_now().await;
    }
}

#[test]
fn a_sequential_reader_is_read_ahead_of_by_a_worker() {
    let fs = Rc::new(mount(formatted(8192), opts(4096)));
    let data = pattern(3, 8 << 20);
    let ino = pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"big", 0o644, OWNER).await.unwrap();
        // Written in 256 KiB pieces: extents that are adjacent on the device.
        for (i, piece) in data.chunks(256 << 10).enumerate() {
            fs.write(f.ino, (i * piece.len()) as u64, piece)
                .await
                .unwrap();
        }
        fs.sync().await.unwrap();
        fs.data_cache().clear();
        f.ino
    });
    let mut pool = LocalPool::new();
    for _ in 0..2 {
        let worker = fs.clone();
        pool.spawner()
            .spawn_local(async move { worker.readahead_worker().await })
            .unwrap();
    }
    let reader = fs.clone();
    pool.run_until(async move { read_sequentially(&reader, ino, &data, 128 << 10, Some(5)).await });
    let c = fs.data_cache().tenant_counters(Some(5));
    let ra = fs.readahead_counters();
    assert!(c.prefetched > 0 && c.prefetch_hits > 0, "{c:?}");
    assert!(ra.reads > 0 && ra.bytes >= ra.reads * 4096, "{ra:?}");
    // Merged: fewer device reads than extents read ahead.
    assert!(ra.reads < ra.bytes / (256 << 10), "{ra:?}");
    assert!(c.hits > c.misses, "most of the file was read ahead: {c:?}");
}

#[test]
fn a_pass_over_twice_the_cache_leaves_the_hot_set() {
    // 512 blocks of cache (2 MiB); a hot file of 64 blocks; a file of twice the cache.
    let fs = mount(formatted(8192), opts(512));
    pollster::block_on(async {
        let hot = pattern(1, 256 << 10);
        let cold = pattern(2, 2 * 512 * 4096);
        let h = fs.create(ROOT_INO, b"hot", 0o644, OWNER).await.unwrap();
        fs.write(h.ino, 0, &hot).await.unwrap();
        let c = fs.create(ROOT_INO, b"cold", 0o644, OWNER).await.unwrap();
        fs.write(c.ino, 0, &cold).await.unwrap();
        fs.sync().await.unwrap();
        for _ in 0..3 {
            assert_eq!(read_at(&fs, h.ino, 0, hot.len(), Some(1)).await, hot);
        }
        // One pass over the cold file, read ahead as a sequential reader is.
        let stream = Arc::new(ReadStream::new());
        let mut at = 0;
        while at < cold.len() {
            let mut buf = vec![0u8; 64 << 10];
            let ctx = ReadCtx {
                tenant: Some(1),
                stream: Some(&stream),
            };
            let n = fs.read_with(c.ino, at as u64, &mut buf, ctx).await.unwrap();
            assert!(buf[..n] == cold[at..at + n]);
            fs.readahead_now().await;
            at += n;
        }
        let before = fs.data_cache().tenant_counters(Some(1));
        assert_eq!(read_at(&fs, h.ino, 0, hot.len(), Some(1)).await, hot);
        let after = fs.data_cache().tenant_counters(Some(1));
        let (hits, misses) = (after.hits - before.hits, after.misses - before.misses);
        let ratio = hits as f64 / (hits + misses) as f64;
        assert!(
            ratio >= 0.9,
            "hot set hit ratio {ratio:.2} ({hits} hits, {misses} misses)"
        );
    });
}

#[test]
fn a_streaming_tenant_leaves_another_its_hot_blocks() {
    let fs = mount(formatted(8192), opts(512));
    pollster::block_on(async {
        let hot = pattern(1, 512 << 10);
        let big = pattern(2, 4 * 512 * 4096);
        let h = fs.create(ROOT_INO, b"hot", 0o644, OWNER).await.unwrap();
        fs.write(h.ino, 0, &hot).await.unwrap();
        let b = fs.create(ROOT_INO, b"big", 0o644, OWNER).await.unwrap();
        fs.write(b.ino, 0, &big).await.unwrap();
        for _ in 0..2 {
            assert_eq!(read_at(&fs, h.ino, 0, hot.len(), Some(1)).await, hot);
        }
        // Tenant 2 reads its big file twice over, in pieces read twice each (so its
        // blocks look hot too).
        for _ in 0..2 {
            for at in (0..big.len()).step_by(128 << 10) {
                for _ in 0..2 {
                    let got = read_at(&fs, b.ino, at as u64, 128 << 10, Some(2)).await;
                    assert!(got == big[at..at + got.len()]);
                }
            }
        }
        let before = fs.data_cache().tenant_counters(Some(1));
        assert_eq!(read_at(&fs, h.ino, 0, hot.len(), Some(1)).await, hot);
        let after = fs.data_cache().tenant_counters(Some(1));
        assert_eq!(
            after.misses, before.misses,
            "tenant 1's 128 blocks are within its half"
        );
        assert!(fs.data_cache().tenant_counters(Some(2)).evictions > 0);
    });
}

#[test]
fn off_means_no_cache_and_reads_still_right() {
    let fs = mount(
        formatted(4096),
        MountOptions {
            data_cache: 0,
            readahead: 0,
            ..MountOptions::default()
        },
    );
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"f", 0o644, OWNER).await.unwrap();
        let data = pattern(4, 300 << 10);
        fs.write(f.ino, 0, &data).await.unwrap();
        for _ in 0..2 {
            read_sequentially(&fs, f.ino, &data, 64 << 10, None).await;
        }
        let c = fs.data_cache().counters();
        assert_eq!((c.hits, c.inserted), (0, 0));
        assert_eq!(fs.readahead_counters().requests, 0);
        assert_eq!(fs.data_cache().usage().0, 0);
    });
}

#[test]
fn holes_read_as_zeros_without_the_device() {
    let fs = mount(formatted(4096), opts(256));
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"sparse", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 8 << 20, b"end").await.unwrap();
        let read = fs.stats().data_bytes_read;
        let got = read_at(&fs, f.ino, 0, 4 << 20, None).await;
        assert!(got.iter().all(|&b| b == 0));
        assert_eq!(fs.stats().data_bytes_read, read);
    });
}
