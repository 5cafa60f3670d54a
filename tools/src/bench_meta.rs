//! `ninefold-bench-meta`: metadata writes of an fs_mark-like workload under the
//! reclaim-driven write policy and under bcachefs's old "write a node once 4 KiB of it
//! is dirty" baseline, and group commit with 1, 4 and 16 concurrent fsyncers.
//! Writes `build/bench/btree-writes.json` (`make bench-meta`).
//!
//! The numbers are counts (writes, bytes, flushes), not times: they do not depend on the
//! machine.
#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};

use block::MemDisk;
use block::{CounterHandle, CountingDisk, DeviceCounters, YieldDisk};
use clap::Parser;
use serde::Serialize;

use ninefs::volume::{
    format, DirtyThresholdPolicy, FormatOptions, FsStats, MountOptions, NineFs, PressurePolicy,
    WritePolicy,
};
use pollster::block_on;
use testkit::testing::ManualClock;
use vfs::{FileSystem, Owner, ROOT_INO};

/// fs_mark-like metadata benchmark.
#[derive(Debug, Parser)]
#[command(name = "ninefold-bench-meta", about)]
struct Args {
    /// Files created, written, fsynced (then all deleted).
    #[arg(long, default_value_t = 20_000)]
    files: u32,
    /// Bytes per file.
    #[arg(long, default_value_t = 16_384)]
    size: usize,
    /// Directories the files are spread over.
    #[arg(long, default_value_t = 16)]
    dirs: u32,
    /// Device size in MiB.
    #[arg(long, default_value_t = 1024)]
    device_mib: u64,
    /// fsyncs per fsyncer in the group-commit runs.
    #[arg(long, default_value_t = 200)]
    rounds: u32,
    /// Where to write the JSON.
    #[arg(long, default_value = "build/bench/btree-writes.json")]
    out: std::path::PathBuf,
}

const OWNER: Owner = Owner {
    uid: 1000,
    gid: 1000,
};

type Disk = CountingDisk<YieldDisk<MemDisk>>;

fn fresh(mib: u64, policy: Box<dyn WritePolicy>) -> (NineFs<Disk>, CounterHandle) {
    let mem = MemDisk::new(4096, mib * 256);
    block_on(format(&mem, &FormatOptions::default())).expect("format");
    let disk = CountingDisk::new(YieldDisk::new(mem));
    let counters = disk.handle();
    let opts = MountOptions {
        policy,
        ..MountOptions::default()
    };
    let fs = block_on(NineFs::mount(disk, opts, Box::new(ManualClock::default()))).expect("mount");
    (fs, counters)
}

/// What one policy run cost.
#[derive(Debug)]
struct Run {
    stats: FsStats,
    device: DeviceCounters,
    fsyncs: u64,
}

impl Run {
    fn node_writes(&self) -> u64 {
        self.stats.node_writes.total_writes()
    }

    fn node_bytes(&self) -> u64 {
        self.stats.node_writes.total_bytes()
    }

    /// Everything written that is not file data: nodes, bitmaps, superblocks, log.
    fn metadata_bytes(&self) -> u64 {
        self.device.bytes_written - self.stats.data_bytes_written
    }

    /// The run's figures as the report gives them.
    fn report(&self) -> RunReport {
        let s = &self.stats;
        let f = self.fsyncs.max(1) as f64;
        RunReport {
            node_writes: self.node_writes(),
            metadata_bytes: self.metadata_bytes(),
            node_bytes: self.node_bytes(),
            log_bytes: s.log.blocks * 4096,
            bitmap_writes: s.group_writes,
            superblock_writes: s.superblock_writes,
            data_bytes: s.data_bytes_written,
            fsyncs: self.fsyncs,
            log_commits: s.log.commits,
            device_flushes: self.device.flushes,
            device_fua_writes: self.device.fua_writes,
            flushes_per_fsync: round(self.device.flushes as f64 / f, 3),
            fua_per_fsync: round(self.device.fua_writes as f64 / f, 3),
            log_bytes_per_fsync: round((s.log.blocks * 4096) as f64 / f, 0),
            log_record_bytes_per_fsync: round(s.log.record_bytes as f64 / f, 0),
            node_writes_per_fsync: round(self.node_writes() as f64 / f, 3),
            stats: self.stats,
        }
    }
}

/// `x` rounded to `digits` decimals (for a readable report).
fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// One policy run in the report: the figures, and the filesystem's own counters
/// (checkpoints and node writes per cause among them).
#[derive(Debug, Serialize)]
struct RunReport {
    node_writes: u64,
    metadata_bytes: u64,
    node_bytes: u64,
    log_bytes: u64,
    bitmap_writes: u64,
    superblock_writes: u64,
    data_bytes: u64,
    fsyncs: u64,
    log_commits: u64,
    device_flushes: u64,
    device_fua_writes: u64,
    flushes_per_fsync: f64,
    fua_per_fsync: f64,
    log_bytes_per_fsync: f64,
    log_record_bytes_per_fsync: f64,
    node_writes_per_fsync: f64,
    /// `ninefs::core::counters::FsStats`, as the appliance reports them.
    stats: FsStats,
}

/// One group-commit measurement.
#[derive(Debug, Serialize)]
struct GroupCommit {
    fsyncers: u32,
    fsyncs: u32,
    log_commits: u64,
    device_flushes: u64,
    flushes_per_fsync: f64,
    fua_per_fsync: f64,
    log_bytes_per_fsync: f64,
    node_writes: u64,
}

/// `build/bench/btree-writes.json`.
#[derive(Debug, Serialize)]
struct Report {
    workload: String,
    reclaim: RunReport,
    baseline_4k: RunReport,
    node_write_ratio: f64,
    metadata_bytes_ratio: f64,
    group_commit: Vec<GroupCommit>,
}

/// fs_mark-like: every file created, written and fsynced in turn; then all deleted;
/// then a sync (its checkpoint counts) and a clean unmount.
fn fs_mark(args: &Args, policy: Box<dyn WritePolicy>) -> Run {
    let (fs, counters) = fresh(args.device_mib, policy);
    let data = vec![0x5au8; args.size];
    let mut fsyncs = 0;
    block_on(async {
        let mut dirs = Vec::new();
        for d in 0..args.dirs {
            let a = fs
                .mkdir(ROOT_INO, format!("d{d:03}").as_bytes(), 0o755, OWNER)
                .await
                .expect("mkdir");
            dirs.push(a.ino);
        }
        for i in 0..args.files {
            let dir = dirs[(i % args.dirs) as usize];
            let name = format!("file-{i:08}");
            let f = fs
                .create(dir, name.as_bytes(), 0o644, OWNER)
                .await
                .expect("create");
            fs.write(f.ino, 0, &data).await.expect("write");
            fs.fsync(f.ino, false).await.expect("fsync");
            fsyncs += 1;
        }
        for i in 0..args.files {
            let dir = dirs[(i % args.dirs) as usize];
            let name = format!("file-{i:08}");
            fs.unlink(dir, name.as_bytes()).await.expect("unlink");
        }
    });
    // The last checkpoint as a sync, so its node writes are in the counters; the
    // unmount after it only marks the image clean.
    block_on(fs.sync()).expect("sync");
    let stats = fs.stats();
    block_on(fs.unmount()).expect("unmount");
    let device = counters.get();
    Run {
        stats,
        device,
        fsyncs,
    }
}

/// Polls futures together until all are done (one thread, one executor).
struct JoinAll<F: Future>(Vec<Option<Pin<Box<F>>>>);

impl<F: Future<Output = ()>> Future for JoinAll<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        for slot in self.0.iter_mut() {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                }
            }
        }
        if self.0.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// `n` fsyncers, each writing 4 KiB to its own file and fsyncing it, `rounds` times,
/// concurrently: device flushes, FUA writes and log bytes per fsync.
fn group_commit(n: u32, rounds: u32, mib: u64) -> GroupCommit {
    let (fs, counters) = fresh(mib, Box::new(PressurePolicy));
    let files: Vec<u64> = block_on(async {
        let mut v = Vec::new();
        for i in 0..n {
            let f = fs
                .create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, OWNER)
                .await
                .expect("create");
            v.push(f.ino);
        }
        fs.sync().await.expect("sync");
        v
    });
    let before = (counters.get(), fs.stats());
    let block = vec![0xa5u8; 4096];
    let fsyncer = |ino: u64| {
        let fs = &fs;
        let block = &block;
        async move {
            for r in 0..rounds {
                fs.write(ino, u64::from(r) * 4096, block)
                    .await
                    .expect("write");
                fs.fsync(ino, false).await.expect("fsync");
            }
        }
    };
    block_on(JoinAll(
        files
            .iter()
            .map(|&ino| Some(Box::pin(fsyncer(ino))))
            .collect(),
    ));
    let after = (counters.get(), fs.stats());
    let fsyncs = f64::from(n * rounds);
    let flushes = after.0.flushes - before.0.flushes;
    let fua = after.0.fua_writes - before.0.fua_writes;
    let log_bytes = (after.1.log.blocks - before.1.log.blocks) * 4096;
    let commits = after.1.log.commits - before.1.log.commits;
    let nodes = after.1.node_writes.total_writes() - before.1.node_writes.total_writes();
    GroupCommit {
        fsyncers: n,
        fsyncs: n * rounds,
        log_commits: commits,
        device_flushes: flushes,
        flushes_per_fsync: round(flushes as f64 / fsyncs, 3),
        fua_per_fsync: round(fua as f64 / fsyncs, 3),
        log_bytes_per_fsync: round(log_bytes as f64 / fsyncs, 0),
        node_writes: nodes,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let workload = format!(
        "fs_mark-like: {} files of {} bytes in {} directories, each created, written and fsynced; \
         then all deleted; then sync and unmount ({} MiB device, 64 KiB nodes, 16 MiB node cache)",
        args.files, args.size, args.dirs, args.device_mib
    );
    println!("{workload}");
    let reclaim = fs_mark(&args, Box::new(PressurePolicy));
    println!(
        "reclaim:     {} node writes, {} metadata bytes",
        reclaim.node_writes(),
        reclaim.metadata_bytes()
    );
    let baseline = fs_mark(&args, Box::new(DirtyThresholdPolicy));
    println!(
        "baseline_4k: {} node writes, {} metadata bytes",
        baseline.node_writes(),
        baseline.metadata_bytes()
    );
    let ratio = reclaim.node_writes() as f64 / baseline.node_writes().max(1) as f64;
    let bytes_ratio = reclaim.metadata_bytes() as f64 / baseline.metadata_bytes().max(1) as f64;
    println!("node_write_ratio: {ratio:.3}, metadata_bytes_ratio: {bytes_ratio:.3}");
    let mut group_commit_runs = Vec::new();
    for n in [1, 4, 16] {
        let g = group_commit(n, args.rounds, 256);
        println!(
            "group commit: {} fsyncers: {} flushes per fsync, {} log bytes per fsync",
            g.fsyncers, g.flushes_per_fsync, g.log_bytes_per_fsync
        );
        group_commit_runs.push(g);
    }
    let report = Report {
        workload,
        reclaim: reclaim.report(),
        baseline_4k: baseline.report(),
        node_write_ratio: round(ratio, 4),
        metadata_bytes_ratio: round(bytes_ratio, 4),
        group_commit: group_commit_runs,
    };
    let json = match serde_json::to_string_pretty(&report) {
        Ok(j) => j + "\n",
        Err(e) => {
            eprintln!("ninefold-bench-meta: report: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(dir) = args.out.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("ninefold-bench-meta: {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = std::fs::write(&args.out, json) {
        eprintln!("ninefold-bench-meta: {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", args.out.display());
    ExitCode::SUCCESS
}
