//! One filesystem shared by several OS threads: the `Send + Sync` handle under a
//! randomized workload, as the appliance's CPUs share it.
//!
//! One `Arc<NineFs>` over a device stack (`CountingDisk<YieldDisk<MemDisk>>`). Each
//! worker thread runs a seeded op sequence (the model harness's: creates, overlapping
//! and extending writes, truncates, renames, links, unlinks, mkdir/rmdir, xattrs,
//! fsync, fdatasync, ...) in a directory of its own, compared op by op with a model of
//! its own ([`Subtree`] makes the directory a root). Every few ops it also races the
//! others in one shared directory (uniquely named creates, renames, links, unlinks,
//! mkdir/rmdir, xattrs, truncates) and on two shared files (appends, and writes that
//! extend the file from every thread at once), whose outcome is known whatever the
//! interleaving. One more thread checkpoints, runs housekeeping (discarding freed
//! blocks at once), scrubs and takes, reads and deletes snapshots meanwhile.
//!
//! Before it ends, each worker fsyncs everything it made. Afterwards every subtree is
//! compared with its model and the shared directory with the union of what the workers
//! did — as the threads left it, after a clean unmount (fsck must be clean) and mount,
//! and after a "crash": the device's content taken without unmounting, mounted again
//! by replaying the log, where nothing fsync'd may be missing.
//!
//! `cargo test` runs a short setting (about a second); `NINEFOLD_THREADS`,
//! `NINEFOLD_THREAD_OPS` and `NINEFOLD_THREAD_SEED` change it, and the ignored
//! `threads_long` runs a bigger one. The core lock's counters are printed (`--nocapture`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use block::{CountingDisk, MemDisk, YieldDisk};
use fsck::{fsck, FsckOptions};
use ninefs::volume::{
    format, CheckpointCause, DirtyThresholdPolicy, FormatOptions, MountOptions, NineFs,
    PressurePolicy,
};
use pollster::block_on;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use testkit::model::ModelFs;
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{
    op_time, pattern, CompareOptions, DualRunner, ManualClock, Op, Subtree, VisibleState,
};
use vfs::{FileSystem, FileType, FsResult, Ino, Owner, SetAttr, XattrMode, ROOT_INO};

/// The device every thread's requests go through.
type Disk = CountingDisk<YieldDisk<MemDisk>>;
type Fs = NineFs<Disk>;

const BS: u32 = 4096;
/// Bytes of one record appended to the shared log file.
const RECORD: usize = 32;
/// The shared directory and the two shared files in it.
const SHARED: &[u8] = b"shared";
const LOG: &[u8] = b"log";
const BLOCKS_FILE: &[u8] = b"blocks";
/// The xattr each thread puts on its shared files.
const XATTR: &[u8] = b"user.thread";
/// A worker compares its whole subtree with its model every this many ops.
const CHECK_EVERY: usize = 64;

/// How big a run is.
#[derive(Clone, Copy, Debug)]
struct Setting {
    /// Worker threads.
    threads: usize,
    /// Generated ops per worker (after the harness's prelude).
    ops: usize,
    /// A worker plays one round in the shared directory every this many ops.
    shared_every: usize,
    /// Seeds every worker's sequence (worker `t` uses `seed + t`).
    seed: u64,
    /// The node cache's limit: small, so nodes are evicted and read back under load.
    cache_limit: usize,
    /// Write nodes ahead of checkpoints (`DirtyThresholdPolicy`).
    early_writes: bool,
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Setting {
    /// The short setting, or what the environment asks for.
    fn from_env(cache_limit: usize, early_writes: bool) -> Setting {
        Setting {
            threads: env("NINEFOLD_THREADS", 4) as usize,
            ops: env("NINEFOLD_THREAD_OPS", 300) as usize,
            shared_every: 3,
            seed: env("NINEFOLD_THREAD_SEED", 0x5eed_0025),
            cache_limit,
            early_writes,
        }
    }
}

/// The device's size: at least 64 MiB, and 16 KiB per op of every worker (what a run
/// keeps is far less). The model never runs out of space, so neither may the
/// filesystem.
fn device_blocks(s: &Setting) -> u64 {
    (16 * 1024).max(4 * (s.threads * s.ops) as u64)
}

/// A monotonic clock in nanoseconds for the core lock's hold times.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn mount_options(s: &Setting) -> MountOptions {
    MountOptions {
        cache_limit: s.cache_limit,
        policy: if s.early_writes {
            Box::new(DirtyThresholdPolicy)
        } else {
            Box::new(PressurePolicy)
        },
        // Freed blocks are discarded (zeroed, on a memory disk) as soon as housekeeping
        // runs: a block still in use after it was freed reads back as garbage.
        discard: Some(Duration::ZERO),
        hold_clock: Some(now_ns),
        ..MountOptions::default()
    }
}

fn mount(image: MemDisk, s: &Setting) -> Fs {
    let disk = CountingDisk::new(YieldDisk::new(image));
    let clock = ManualClock::new(op_time(0));
    block_on(NineFs::mount(disk, mount_options(s), Box::new(clock))).expect("mount")
}

/// Unmounts cleanly; returns (a copy of) the memory disk under the stack.
fn unmount(fs: Fs) -> MemDisk {
    let disk = block_on(fs.unmount()).expect("clean unmount");
    MemDisk::from_bytes(BS, disk.inner().inner().snapshot())
}

fn assert_fsck_clean(image: &MemDisk, when: &str) {
    let report = block_on(fsck(image, &FsckOptions::default())).expect("fsck runs");
    assert!(report.is_clean(), "fsck {when}: {:#?}", report.errors);
    assert!(
        report.warnings.is_empty(),
        "fsck {when}: {:#?}",
        report.warnings
    );
}

/// What one worker leaves behind.
#[derive(Debug)]
struct Outcome {
    /// Its directory (the root of its subtree).
    base: Ino,
    /// The model of its subtree, after its last op.
    model: ModelFs<ManualClock>,
    /// What it left in the shared directory, by name.
    shared: BTreeMap<Vec<u8>, Expect>,
    /// Rounds it played in the shared directory.
    rounds: usize,
}

/// An entry a worker left in the shared directory.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expect {
    /// A regular file: content, link count and the value of [`XATTR`].
    File {
        data: Vec<u8>,
        nlink: u32,
        xattr: Vec<u8>,
    },
    /// An empty directory.
    Dir,
}

/// The shared directory and files, by inode.
#[derive(Clone, Copy, Debug)]
struct Shared {
    dir: Ino,
    log: Ino,
    blocks: Ino,
}

const ROOT_OWNER: Owner = Owner { uid: 0, gid: 0 };

fn check<T>(what: &str, r: FsResult<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// A worker's generated sequence: the harness's prelude and `ops` ops, without
/// remounts (the filesystem is shared).
fn sequence(seed: u64, ops: usize) -> Vec<Op> {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &key);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let config = GenConfig {
        remount: false,
        ..GenConfig::default()
    };
    strategy::ops(config, ops..ops + 1)
        .new_tree(&mut runner)
        .expect("a sequence")
        .current()
}

/// One worker: its sequence in its own directory against its model, with a shared
/// round every few ops. The last few ops run once every thread has run the others
/// and the maintenance thread has stopped; then the worker fsyncs everything it made.
fn worker(fs: &Fs, t: usize, s: Setting, shared: Shared, end: &End) -> Result<Outcome, String> {
    let ops = sequence(s.seed + t as u64, s.ops);
    let (most, last) = ops.split_at(ops.len() - (s.ops / 8).max(4));
    let mut worker = {
        let _arrival = Arrival { end, worker: true };
        let mut worker = Worker::new(fs, t, s, shared)?;
        worker.play(most)?;
        worker
    };
    worker.play(last)?;
    worker.finish()
}

/// A worker's state between its ops.
struct Worker<'a> {
    fs: &'a Fs,
    t: usize,
    setting: Setting,
    shared: Shared,
    /// Its directory.
    base: Ino,
    /// The directory as a filesystem, and its model.
    runner: DualRunner<Subtree<'a, Fs>>,
    /// Ops run.
    done: usize,
    /// What it left in the shared directory.
    left: BTreeMap<Vec<u8>, Expect>,
    /// Rounds it played there.
    rounds: usize,
}

impl<'a> Worker<'a> {
    /// Worker `t`, with its directory made.
    fn new(fs: &'a Fs, t: usize, s: Setting, shared: Shared) -> Result<Worker<'a>, String> {
        let name = format!("t{t}");
        let made = fs.mkdir(ROOT_INO, name.as_bytes(), 0o755, ROOT_OWNER);
        let base = check("mkdir", block_on(made))?.ino;
        let options = CompareOptions {
            // One clock for the filesystem, one per model: times cannot agree.
            times: false,
            state_each_op: false,
            ..CompareOptions::default()
        };
        Ok(Worker {
            fs,
            t,
            setting: s,
            shared,
            base,
            runner: DualRunner::new(|_| Subtree::new(fs, base), options),
            done: 0,
            left: BTreeMap::new(),
            rounds: 0,
        })
    }

    /// How a mismatch with the model is reported.
    fn failed(&self) -> impl Fn(testkit::testing::Mismatch) -> String {
        let (t, seed) = (self.t, self.setting.seed + self.t as u64);
        move |m| format!("thread {t}, seed {seed}: {m}")
    }

    /// Releases every handle on both sides (a remount that changes nothing: unlinked
    /// open files go), compares the states and fsyncs everything the worker made.
    fn finish(mut self) -> Result<Outcome, String> {
        let failed = self.failed();
        self.runner.step(&Op::Remount, &mut |f| f).map_err(failed)?;
        let made = fsync_everything(self.runner.fs(), self.fs, self.shared, &self.left);
        block_on(made)?;
        Ok(Outcome {
            base: self.base,
            model: self.runner.model,
            shared: self.left,
            rounds: self.rounds,
        })
    }

    /// Runs `ops`, a shared round every [`Setting::shared_every`].
    fn play(&mut self, ops: &[Op]) -> Result<(), String> {
        let failed = self.failed();
        for op in ops {
            self.runner.step(op, &mut |f| f).map_err(&failed)?;
            if self.done.is_multiple_of(self.setting.shared_every) {
                let round = shared_round(
                    self.fs,
                    self.shared,
                    self.setting.threads,
                    self.t,
                    self.rounds,
                    &mut self.left,
                );
                block_on(round)?;
                self.rounds += 1;
            }
            self.done += 1;
            if self.done.is_multiple_of(CHECK_EVERY) {
                self.runner.check_state().map_err(&failed)?;
            }
        }
        Ok(())
    }
}

/// Round `i` of worker `t` in the shared directory: names unique to the round, so
/// every operation must succeed, and `expect` follows what it leaves.
async fn shared_round(
    fs: &Fs,
    shared: Shared,
    threads: usize,
    t: usize,
    i: usize,
    expect: &mut BTreeMap<Vec<u8>, Expect>,
) -> Result<(), String> {
    let named = |prefix: &str| format!("{prefix}.t{t}.{i}").into_bytes();
    let seed = (t * 31 + i) as u8;
    // A file: written, overwritten across its end (overlapping and extending), given
    // an xattr, sometimes truncated, renamed, then unlinked, hard-linked or kept.
    let (new, kept) = (named("n"), named("r"));
    let f = check(
        "create",
        fs.create(shared.dir, &new, 0o644, ROOT_OWNER).await,
    )?
    .ino;
    let mut data = pattern(seed, 3000);
    check("write", fs.write(f, 0, &data).await)?;
    let more = pattern(seed.wrapping_add(1), 5000);
    check("write", fs.write(f, 2000, &more).await)?;
    data.truncate(2000);
    data.extend_from_slice(&more);
    let xattr = vec![t as u8 + 1; 1 + i % 7];
    check(
        "setxattr",
        fs.setxattr(f, XATTR, &xattr, XattrMode::Upsert).await,
    )?;
    if i.is_multiple_of(5) {
        let size = SetAttr {
            size: Some(2500),
            ..SetAttr::default()
        };
        check("truncate", fs.setattr(f, size).await)?;
        data.truncate(2500);
    }
    check(
        "rename",
        fs.rename(shared.dir, &new, shared.dir, &kept).await,
    )?;
    match i % 3 {
        0 => check("unlink", fs.unlink(shared.dir, &kept).await)?,
        1 => {
            let link = named("l");
            check("link", fs.link(f, shared.dir, &link).await)?;
            let file = Expect::File {
                data,
                nlink: 2,
                xattr,
            };
            expect.insert(link, file.clone());
            expect.insert(kept, file);
        }
        _ => {
            let file = Expect::File {
                data,
                nlink: 1,
                xattr,
            };
            expect.insert(kept, file);
        }
    }
    // A directory: made, renamed, and every other time removed.
    if i.is_multiple_of(2) {
        let (made, moved) = (named("d"), named("e"));
        check(
            "mkdir",
            fs.mkdir(shared.dir, &made, 0o755, ROOT_OWNER).await,
        )?;
        check(
            "rename",
            fs.rename(shared.dir, &made, shared.dir, &moved).await,
        )?;
        if i.is_multiple_of(4) {
            check("rmdir", fs.rmdir(shared.dir, &moved).await)?;
        } else {
            expect.insert(moved, Expect::Dir);
        }
    }
    // The shared files: one record appended, one block of its own written (most of
    // them past the end of file, extending it while the others do too).
    check("append", fs.append(shared.log, &record(t, i)).await)?;
    let block = (i * threads + t) as u64;
    let content = pattern(seed, BS as usize);
    check(
        "write",
        fs.write(shared.blocks, block * u64::from(BS), &content)
            .await,
    )?;
    Ok(())
}

/// The record worker `t` appends in round `i`.
fn record(t: usize, i: usize) -> Vec<u8> {
    let mut r = format!("thread {t} round {i}").into_bytes();
    r.resize(RECORD - 1, b' ');
    r.push(b'\n');
    r
}

/// fsyncs every inode of the worker's subtree (as it sees it), the shared files it
/// left, the shared directory and the shared files: after this, a crash loses none of
/// it. Every worker's changes in the shared directory precede its own fsyncs of it,
/// so the last of those to start makes all of them durable.
async fn fsync_everything(
    subtree: &Subtree<'_, Fs>,
    fs: &Fs,
    shared: Shared,
    expect: &BTreeMap<Vec<u8>, Expect>,
) -> Result<(), String> {
    let state = VisibleState::capture(subtree).await;
    for node in state.nodes.values() {
        check("fsync", subtree.fsync(node.ino, false).await)?;
    }
    // Its shared files whole (content, xattr, link count: fsync, not fdatasync).
    for name in expect.keys() {
        let ino = check("lookup", fs.lookup(shared.dir, name).await)?.ino;
        check("fsync", fs.fsync(ino, false).await)?;
    }
    // Only the content and size of these two is compared: fdatasync is enough.
    check("fsync", fs.fsync(shared.log, true).await)?;
    check("fsync", fs.fsync(shared.blocks, true).await)?;
    check("fsync", fs.fsync(shared.dir, false).await)
}

/// How the threads end: when every worker has run most of its ops, the maintenance
/// thread stops, and only then do the workers run their last ops and fsync everything,
/// so what the device sees last is their fsyncs (the crash image then needs the log).
#[derive(Debug)]
struct End {
    /// Worker threads.
    workers: usize,
    /// Workers done with their ops.
    finished: AtomicUsize,
    /// Every worker and the maintenance thread meet here.
    fsyncs: Barrier,
}

/// A thread's arrival at the end of most ops, when dropped: also when it failed or
/// panicked, so no other thread waits for it forever.
struct Arrival<'a> {
    end: &'a End,
    /// A worker (else the maintenance thread, which waits for the workers).
    worker: bool,
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if self.worker {
            self.end.finished.fetch_add(1, Ordering::AcqRel);
        } else {
            while self.end.finished.load(Ordering::Acquire) < self.end.workers {
                thread::sleep(Duration::from_millis(1));
            }
        }
        self.end.fsyncs.wait();
    }
}

/// The maintenance thread: until every worker has run its ops, checkpoints,
/// housekeeping, scrub steps and a snapshot taken, read through its view and deleted,
/// in turn. Returns the ticks.
fn maintenance(fs: &Fs, end: &End) -> Result<u64, String> {
    let _arrival = Arrival { end, worker: false };
    let mut tick = 0u64;
    while end.finished.load(Ordering::Acquire) < end.workers {
        block_on(async {
            match tick % 4 {
                0 => check("checkpoint", fs.checkpoint(CheckpointCause::Sync).await),
                1 => check("housekeeping", fs.housekeeping().await),
                2 => {
                    if !fs.scrub_running() {
                        check("scrub start", fs.scrub_start().await)?;
                    }
                    check("scrub step", fs.scrub_step(256 << 10).await).map(drop)
                }
                _ => {
                    let name = format!("s{tick}");
                    check("snapshot", fs.snapshot_create(&name).await)?;
                    let view = check("snapshot view", fs.snapshot_view(&name).await)?;
                    check("snapshot readdir", view.readdir(ROOT_INO, 0, 64).await)?;
                    drop(view);
                    check("snapshot delete", fs.snapshot_delete(&name).await)
                }
            }
        })?;
        tick += 1;
        thread::sleep(Duration::from_millis(2));
    }
    Ok(tick)
}

/// Compares every worker's subtree with its model and the shared directory with what
/// the workers left there.
fn compare(fs: &Fs, outcomes: &[Outcome], s: &Setting, when: &str) {
    for (t, o) in outcomes.iter().enumerate() {
        let want = VisibleState::capture_blocking(&o.model);
        let got = VisibleState::capture_blocking(&Subtree::new(fs, o.base));
        let diff = want.diff(&got, false);
        assert!(
            diff.is_empty(),
            "{when}: thread {t}'s directory differs from its model (seed {}):\n{}",
            s.seed + t as u64,
            diff.join("\n")
        );
    }
    block_on(compare_shared(fs, outcomes, s)).unwrap_or_else(|e| panic!("{when}: {e}"));
}

async fn compare_shared(fs: &Fs, outcomes: &[Outcome], s: &Setting) -> Result<(), String> {
    let dir = check("lookup", fs.lookup(ROOT_INO, SHARED).await)?.ino;
    let mut want: BTreeMap<Vec<u8>, Expect> = BTreeMap::new();
    for o in outcomes {
        want.extend(o.shared.clone());
    }
    let mut listed = Vec::new();
    let mut offset = 0;
    loop {
        let batch = check("readdir", fs.readdir(dir, offset, 100).await)?;
        let Some(last) = batch.last() else { break };
        offset = last.next_offset;
        listed.extend(batch.into_iter().map(|e| e.name));
    }
    listed.retain(|n| ![&b"."[..], b"..", LOG, BLOCKS_FILE].contains(&n.as_slice()));
    listed.sort();
    let names: Vec<Vec<u8>> = want.keys().cloned().collect();
    if listed != names {
        let show = |v: Vec<&Vec<u8>>| {
            v.into_iter()
                .map(|n| n.escape_ascii().to_string())
                .collect::<Vec<_>>()
        };
        let missing = show(names.iter().filter(|n| !listed.contains(n)).collect());
        let unexpected = show(listed.iter().filter(|n| !names.contains(n)).collect());
        return Err(format!(
            "the shared directory lacks {missing:?} and has {unexpected:?} it should not"
        ));
    }
    for (name, expect) in &want {
        let shown = name.escape_ascii();
        let attr = check("lookup", fs.lookup(dir, name).await)?;
        match expect {
            Expect::Dir => {
                if attr.file_type() != FileType::Directory || attr.nlink != 2 {
                    return Err(format!("shared/{shown}: {attr:?}, not an empty directory"));
                }
            }
            Expect::File { data, nlink, xattr } => {
                let mut buf = vec![0u8; data.len() + 1];
                let n = check("read", fs.read(attr.ino, 0, &mut buf).await)?;
                if &buf[..n] != data.as_slice() || attr.nlink != *nlink {
                    return Err(format!(
                        "shared/{shown}: {n} bytes, nlink {} (want {} bytes, nlink {nlink}){}",
                        attr.nlink,
                        data.len(),
                        if n == data.len() {
                            ", content differs"
                        } else {
                            ""
                        }
                    ));
                }
                let value = check("getxattr", fs.getxattr(attr.ino, XATTR).await)?;
                if &value != xattr {
                    return Err(format!("shared/{shown}: xattr {value:?}, want {xattr:?}"));
                }
            }
        }
    }
    // The log: every record whole, each worker's in the order it appended them.
    let rounds: usize = outcomes.iter().map(|o| o.rounds).sum();
    let log = check("lookup", fs.lookup(dir, LOG).await)?;
    let mut buf = vec![0u8; rounds * RECORD + 1];
    let n = check("read", fs.read(log.ino, 0, &mut buf).await)?;
    if n != rounds * RECORD {
        return Err(format!("the log has {n} bytes, want {}", rounds * RECORD));
    }
    let mut next = vec![0usize; outcomes.len()];
    for r in buf[..n].chunks(RECORD) {
        let t = (0..outcomes.len())
            .find(|&t| r == record(t, next[t]).as_slice())
            .ok_or_else(|| {
                format!(
                    "log record {:?} out of order or torn",
                    r.escape_ascii().to_string()
                )
            })?;
        next[t] += 1;
    }
    // The blocks file: each worker's blocks, and as long as the furthest one.
    let blocks = check("lookup", fs.lookup(dir, BLOCKS_FILE).await)?;
    let last = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.rounds > 0)
        .map(|(t, o)| ((o.rounds - 1) * s.threads + t + 1) as u64)
        .max()
        .unwrap_or(0);
    if blocks.size != last * u64::from(BS) {
        return Err(format!(
            "the blocks file is {} bytes, want {}",
            blocks.size,
            last * u64::from(BS)
        ));
    }
    let mut block = vec![0u8; BS as usize];
    for (t, o) in outcomes.iter().enumerate() {
        for i in 0..o.rounds {
            let at = ((i * s.threads + t) as u64) * u64::from(BS);
            check("read", fs.read(blocks.ino, at, &mut block).await)?;
            if block != pattern((t * 31 + i) as u8, BS as usize) {
                return Err(format!(
                    "block {} of the blocks file (thread {t}, round {i}) differs",
                    at / u64::from(BS)
                ));
            }
        }
    }
    Ok(())
}

/// The whole test: the run, then the comparisons as the threads left it, after a
/// clean unmount and mount, and after a crash.
/// The filesystem's warnings and errors, on stderr: a failure then shows what the
/// filesystem saw (corruption, inconsistent metadata) before a comparison did.
#[derive(Debug)]
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("{}: {}", r.level(), r.args());
        }
    }

    fn flush(&self) {}
}

fn run(s: Setting) {
    // Set once per process (the tests share it); a second set fails and changes nothing.
    if log::set_logger(&Stderr).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    eprintln!("threads: {s:?}");
    let image = MemDisk::new(BS, device_blocks(&s));
    let format_options = FormatOptions {
        node_size: 16 * 1024,
        uuid: [25; 16],
        secret: 0x25,
        now: op_time(0),
        ..FormatOptions::default()
    };
    block_on(format(&image, &format_options)).expect("mkfs");
    let fs = Arc::new(mount(image, &s));
    let shared = block_on(async {
        let dir = fs.mkdir(ROOT_INO, SHARED, 0o755, ROOT_OWNER).await?.ino;
        let log = fs.create(dir, LOG, 0o644, ROOT_OWNER).await?.ino;
        let blocks = fs.create(dir, BLOCKS_FILE, 0o644, ROOT_OWNER).await?.ino;
        FsResult::Ok(Shared { dir, log, blocks })
    })
    .expect("the shared directory");

    let started = Instant::now();
    let end = Arc::new(End {
        workers: s.threads,
        finished: AtomicUsize::new(0),
        fsyncs: Barrier::new(s.threads + 1),
    });
    let maintainer = {
        let (fs, end) = (fs.clone(), end.clone());
        thread::spawn(move || maintenance(&fs, &end))
    };
    let workers: Vec<_> = (0..s.threads)
        .map(|t| {
            let (fs, end) = (fs.clone(), end.clone());
            thread::spawn(move || worker(&fs, t, s, shared, &end))
        })
        .collect();
    let outcomes: Result<Vec<Outcome>, String> = workers
        .into_iter()
        .map(|w| w.join().expect("a worker panicked"))
        .collect();
    let ticks = maintainer.join().expect("the maintenance thread panicked");
    let outcomes = outcomes.unwrap_or_else(|e| panic!("{e}"));
    let ticks = ticks.unwrap_or_else(|e| panic!("maintenance: {e}"));
    let took = started.elapsed();

    let stats = fs.stats();
    let lock = stats.core_lock;
    eprintln!(
        "threads: {} workers x {} ops in {took:?}, {ticks} maintenance ticks; {} checkpoints, {} log commits; core lock: {} acquisitions, {} contended ({:.2}%), held {:.1} ms in total ({:.1}% of the run), mean {} ns, longest {} us",
        s.threads,
        s.ops,
        stats.total_checkpoints(),
        stats.log.commits,
        lock.acquisitions,
        lock.contended,
        100.0 * lock.contended as f64 / lock.acquisitions.max(1) as f64,
        lock.hold_ns as f64 / 1e6,
        100.0 * lock.hold_ns as f64 / took.as_nanos() as f64,
        lock.mean_hold_ns(),
        lock.max_hold_ns / 1000,
    );
    assert!(lock.acquisitions > 0 && lock.hold_ns > 0, "{lock:?}");
    assert_eq!(
        (stats.corruptions, stats.scrub_errors, stats.failed),
        (0, 0, 0),
        "{stats:?}"
    );
    compare(&fs, &outcomes, &s, "as the threads left it");

    // Everything was fsync'd: a power cut now loses nothing (a memory disk has no
    // cache to lose; what it holds is what survives).
    let crashed = fs.device().inner().inner().snapshot();

    let fs = Arc::into_inner(fs).expect("every thread let go of the filesystem");
    let image = unmount(fs);
    assert_fsck_clean(&image, "after the run");
    let fs = mount(image, &s);
    compare(&fs, &outcomes, &s, "after a clean remount");
    assert_fsck_clean(&unmount(fs), "after the remount");

    let fs = mount(MemDisk::from_bytes(BS, crashed), &s);
    let log = fs.stats().log;
    eprintln!(
        "threads: after the crash, replayed {} log commits ({} records)",
        log.replayed_commits, log.replayed_records
    );
    compare(&fs, &outcomes, &s, "after a crash");
    assert_fsck_clean(&unmount(fs), "after the crash");
}

/// The short setting, with the default write policy and a small node cache.
#[test]
fn threads_share_one_filesystem() {
    run(Setting::from_env(256 << 10, false));
}

/// The same with nodes written ahead of checkpoints and a cache too small for the tree.
#[test]
fn threads_share_one_filesystem_with_early_writes_and_a_tiny_cache() {
    let s = Setting::from_env(64 << 10, true);
    run(Setting {
        seed: s.seed ^ 0xeeee,
        ops: s.ops / 2,
        ..s
    });
}

/// A long run: `cargo test -p ninefold-fs --release --test threads -- --ignored
/// --nocapture` (8 threads of 2000 ops unless the environment says otherwise).
#[test]
#[ignore]
fn threads_long() {
    run(Setting {
        threads: env("NINEFOLD_THREADS", 8) as usize,
        ops: env("NINEFOLD_THREAD_OPS", 2000) as usize,
        ..Setting::from_env(1 << 20, false)
    });
}
