//! `ninefold-bench-meta`: metadata writes of an fs_mark-like workload under the
//! reclaim-driven write policy and under bcachefs's old "write a node once 4 KiB of it
//! is dirty" baseline, and group commit with 1, 4 and 16 concurrent fsyncers.
//! Writes `build/bench/btree-writes.json` (`make bench-meta`).
//!
//! The numbers are counts (writes, bytes, flushes), not times: they do not depend on the
//! machine.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};

use clap::Parser;
use fs::block::MemDisk;
use fs::btree::WriteCause;
use fs::sim::{Counters, CountingDisk, YieldDisk};
use fs::testing::ManualClock;
use fs::vfs::{FileSystem, Owner, ROOT_INO};
use fs::volume::{
    format, CheckpointCause, DirtyThresholdPolicy, FormatOptions, FsStats, MountOptions, NineFs,
    PressurePolicy, WritePolicy,
};
use pollster::block_on;

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

fn fresh(
    mib: u64,
    policy: Box<dyn WritePolicy>,
) -> (NineFs<Disk>, std::sync::Arc<spin::Mutex<Counters>>) {
    let mem = MemDisk::new(4096, mib * 256);
    block_on(format(&mem, &FormatOptions::default())).expect("format");
    let (disk, counters) = CountingDisk::new(YieldDisk::new(mem));
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
    device: Counters,
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

    fn json(&self) -> String {
        let s = &self.stats;
        let f = self.fsyncs.max(1) as f64;
        let mut causes = String::new();
        for (i, c) in WriteCause::ALL.iter().enumerate() {
            let _ = write!(
                causes,
                "{}\"{}\": {{\"writes\": {}, \"bytes\": {}}}",
                if i > 0 { ", " } else { "" },
                c.name(),
                s.node_writes.writes[i],
                s.node_writes.bytes[i]
            );
        }
        let mut checkpoints = String::new();
        for (i, c) in CheckpointCause::ALL.iter().enumerate() {
            let _ = write!(
                checkpoints,
                "{}\"{}\": {}",
                if i > 0 { ", " } else { "" },
                c.name(),
                s.checkpoints[i]
            );
        }
        format!(
            "{{\"node_writes\": {}, \"metadata_bytes\": {}, \"node_bytes\": {}, \
             \"log_bytes\": {}, \"bitmap_writes\": {}, \"superblock_writes\": {}, \
             \"data_bytes\": {}, \"fsyncs\": {}, \"log_commits\": {}, \"device_flushes\": {}, \
             \"device_fua_writes\": {}, \"flushes_per_fsync\": {:.3}, \"fua_per_fsync\": {:.3}, \
             \"log_bytes_per_fsync\": {:.0}, \"log_record_bytes_per_fsync\": {:.0}, \
             \"node_writes_per_fsync\": {:.3}, \"checkpoints\": {{{checkpoints}}}, \
             \"node_writes_by_cause\": {{{causes}}}}}",
            self.node_writes(),
            self.metadata_bytes(),
            self.node_bytes(),
            s.log.blocks * 4096,
            s.group_writes,
            s.superblock_writes,
            s.data_bytes_written,
            self.fsyncs,
            s.log.commits,
            self.device.flushes,
            self.device.fua_writes,
            self.device.flushes as f64 / f,
            self.device.fua_writes as f64 / f,
            (s.log.blocks * 4096) as f64 / f,
            s.log.record_bytes as f64 / f,
            self.node_writes() as f64 / f,
        )
    }
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
    let device = *counters.lock();
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
fn group_commit(n: u32, rounds: u32, mib: u64) -> String {
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
    let before = (*counters.lock(), fs.stats());
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
    let after = (*counters.lock(), fs.stats());
    let fsyncs = f64::from(n * rounds);
    let flushes = after.0.flushes - before.0.flushes;
    let fua = after.0.fua_writes - before.0.fua_writes;
    let log_bytes = (after.1.log.blocks - before.1.log.blocks) * 4096;
    let commits = after.1.log.commits - before.1.log.commits;
    let nodes = after.1.node_writes.total_writes() - before.1.node_writes.total_writes();
    format!(
        "{{\"fsyncers\": {n}, \"fsyncs\": {}, \"log_commits\": {commits}, \"device_flushes\": {flushes}, \
         \"flushes_per_fsync\": {:.3}, \"fua_per_fsync\": {:.3}, \"log_bytes_per_fsync\": {:.0}, \
         \"node_writes\": {nodes}}}",
        n * rounds,
        flushes as f64 / fsyncs,
        fua as f64 / fsyncs,
        log_bytes as f64 / fsyncs,
    )
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
    let mut groups = Vec::new();
    for n in [1, 4, 16] {
        let g = group_commit(n, args.rounds, 256);
        println!("group commit: {g}");
        groups.push(g);
    }
    let json = format!(
        "{{\n  \"workload\": \"{workload}\",\n  \"reclaim\": {},\n  \"baseline_4k\": {},\n  \
         \"node_write_ratio\": {ratio:.4},\n  \"metadata_bytes_ratio\": {bytes_ratio:.4},\n  \
         \"group_commit\": [\n    {}\n  ]\n}}\n",
        reclaim.json(),
        baseline.json(),
        groups.join(",\n    ")
    );
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
