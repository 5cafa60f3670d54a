//! `ninefold crash-trace`: crash states from recorded block traces of the real appliance.
//!
//! A *recording* is a directory holding `base.img` (the image when recording started),
//! `trace.log` (the dm-log-writes log QEMU's `blklogwrites` driver wrote while the
//! appliance ran on it) and `acks.jsonl` (the client's acknowledgement log,
//! `logwrites::acks`). The trace becomes a `block::Recording` and the crash simulator's
//! enumeration (`testkit::sim::enumerate`: the disk at every FLUSH, subsets and
//! reorderings of the writes since, torn writes and sectors, FUA writes durable on
//! completion) makes each crash state an overlay over the FLUSH-boundary disk. Every
//! state is mounted (log replay), fsck'd, and every path of the acknowledgement log is
//! read and checked against the versions the crash contract allows at that moment.
//!
//! States are numbered per recording; `--state N` checks one state and prints it, which
//! is the command every violation prints. The last line is always
//! `trace crash states: N, violations: V, fsck errors: E`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use block::{BlockDevice, Geometry};
use clap::Args;
use fsck::{fsck, FsckOptions};
use logwrites::acks::{AckLog, Content};
use logwrites::replay::{entries_by, to_recording};
use logwrites::Trace;
use ninefs::format::layout::SUPERBLOCK_BLOCKS;
use ninefs::volume::{MountOptions, NineFs};
use testkit::sim::{enumerate, CrashDesc, CrashParams};
use testkit::testing::ManualClock;
use vfs::{FileSystem, ROOT_INO};

/// File names inside a recording directory.
pub const BASE: &str = "base.img";
/// The dm-log-writes log.
pub const TRACE: &str = "trace.log";
/// The acknowledgement log.
pub const ACKS: &str = "acks.jsonl";

/// Arguments of `ninefold crash-trace`.
#[derive(Debug, Args)]
pub struct CrashTraceArgs {
    /// Recording directories (each with base.img, trace.log, acks.jsonl).
    #[arg(required = true)]
    pub recordings: Vec<PathBuf>,
    /// Check only this state (of the single recording given) and describe it.
    #[arg(long)]
    pub state: Option<usize>,
    /// Seed of the enumeration's random choices.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most crash states per crash point (FLUSH or FUA write).
    #[arg(long, default_value_t = CrashParams::default().max_per_point)]
    pub per_point: usize,
    /// Stop each recording after this many states (0: all).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Failure reports printed per recording.
    #[arg(long, default_value_t = 3)]
    pub reports: usize,
    /// fsck skips reading every data block (file data is still read, and its checksums
    /// verified, for every path of the acknowledgement log): several times faster on
    /// data-heavy traces.
    #[arg(long)]
    pub no_fsck_data: bool,
    /// Blocks the filesystem only ever writes with FUA (default: its superblock copies).
    /// QEMU 7.2's blklogwrites drops the FUA flag, so writes wholly inside these blocks
    /// are taken as FUA (durable on completion); `--fua-blocks 0` (a block ninefs never
    /// writes after mkfs) trusts the log alone.
    #[arg(long, value_delimiter = ',', default_values_t = SUPERBLOCK_BLOCKS)]
    pub fua_blocks: Vec<u64>,
}

/// One recording, loaded.
struct Recorded {
    dir: PathBuf,
    base: Arc<[u8]>,
    trace: Trace,
    acks: AckLog,
}

impl Recorded {
    fn load(dir: &Path) -> Result<Recorded, String> {
        let base = std::fs::read(dir.join(BASE))
            .map_err(|e| format!("{}: {e}", dir.join(BASE).display()))?;
        Ok(Recorded {
            dir: dir.to_path_buf(),
            base: base.into(),
            trace: Trace::open(&dir.join(TRACE))?,
            acks: AckLog::open(&dir.join(ACKS))?,
        })
    }
}

/// What checking found.
#[derive(Debug, Default)]
struct Totals {
    states: usize,
    violations: usize,
    fsck_errors: usize,
    reports: Vec<String>,
}

/// What is wrong with one state (empty: nothing).
#[derive(Debug, Default)]
struct Verdict {
    fsck_errors: Vec<String>,
    violations: Vec<String>,
}

/// Reads `path` (components from the root); `None` if a component is missing.
async fn read_path<F: FileSystem>(fs: &F, path: &str) -> Result<Option<Vec<u8>>, String> {
    let mut ino = ROOT_INO;
    for name in path.split('/') {
        match fs.lookup(ino, name.as_bytes()).await {
            Ok(attr) => ino = attr.ino,
            Err(e) if e == vfs::Errno::ENOENT => return Ok(None),
            Err(e) => return Err(format!("lookup {name}: {e}")),
        }
    }
    let size = fs
        .getattr(ino)
        .await
        .map_err(|e| format!("getattr: {e}"))?
        .size;
    let mut data = vec![0u8; size as usize];
    let mut at = 0;
    while at < data.len() {
        let n = fs
            .read(ino, at as u64, &mut data[at..])
            .await
            .map_err(|e| format!("read at {at}: {e}"))?;
        if n == 0 {
            return Err(format!("short read: {at} of {size} bytes"));
        }
        at += n;
    }
    Ok(Some(data))
}

fn show(content: Option<Content>) -> String {
    content.map_or("absent".into(), |c| {
        format!("{} bytes, crc {:016x}", c.len, c.crc)
    })
}

/// Mounts `disk`, runs fsck on what mount committed and checks every acknowledged path.
fn check_state<D: BlockDevice>(
    r: &Recorded,
    disk: D,
    desc: &CrashDesc,
    fsck_opts: &FsckOptions,
) -> Verdict {
    let mut v = Verdict::default();
    let fs = match pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(ManualClock::default()),
    )) {
        Ok(fs) => fs,
        Err(e) => {
            v.violations.push(format!("mount failed: {e}"));
            return v;
        }
    };
    match pollster::block_on(fsck(fs.device(), fsck_opts)) {
        Ok(report) => v
            .fsck_errors
            .extend(report.errors.iter().map(|e| e.to_string())),
        Err(e) => v.fsck_errors.push(format!("fsck could not run: {e}")),
    }
    // Entries completed at the crash: those before the one the crash interrupted.
    let completed_entries = entries_by(desc.time);
    let completed = |log_len: u64| r.trace.entries_within(log_len) <= completed_entries;
    for (path, history) in &r.acks.paths {
        let seen = match pollster::block_on(read_path(&fs, path)) {
            Ok(data) => data.map(|d| Content::of(&d)),
            Err(e) => {
                v.violations.push(format!("/{path}: {e}"));
                continue;
            }
        };
        let (allowed, ack) = history.allowed(completed);
        if !allowed.iter().any(|a| a.content == seen) {
            let versions: Vec<String> = allowed
                .iter()
                .map(|a| format!("v{} ({})", a.version, show(a.content)))
                .collect();
            let why = ack.map_or("no acknowledged sync yet".into(), |(at, version, op)| {
                format!("{op} of v{version} acknowledged at log byte {at}")
            });
            v.violations.push(format!(
                "/{path}: shows {}; allowed: {} ({why})",
                show(seen),
                versions.join(", ")
            ));
        }
    }
    v
}

/// The command that checks one state again.
fn replay_command(dir: &Path, index: usize, args: &CrashTraceArgs) -> String {
    format!(
        "ninefold crash-trace {} --state {index} --seed {} --per-point {}",
        dir.display(),
        args.seed,
        args.per_point
    )
}

fn params(args: &CrashTraceArgs) -> CrashParams {
    CrashParams {
        seed: args.seed,
        max_per_point: args.per_point,
        ..CrashParams::default()
    }
}

fn geometry(r: &Recorded) -> Geometry {
    Geometry {
        block_size: 4096,
        num_blocks: r.base.len() as u64 / 4096,
        max_transfer: 1 << 20,
        native_fua: false,
        volatile_cache: true,
        discard: true,
    }
}

/// Checks the states of `r` whose index is `worker` modulo `workers`.
fn check_part(
    r: &Recorded,
    args: &CrashTraceArgs,
    worker: usize,
    workers: usize,
    only: Option<usize>,
) -> Result<Totals, String> {
    let recording = to_recording(&r.trace, 4096, &args.fua_blocks)?;
    let mut t = Totals::default();
    let fsck_opts = FsckOptions {
        check_data: !args.no_fsck_data,
    };
    let states = enumerate(r.base.clone(), geometry(r), &recording, &params(args));
    let limit = if args.limit == 0 {
        usize::MAX
    } else {
        args.limit
    };
    for state in states.take(limit) {
        let index = state.desc.index;
        if only.is_some_and(|o| o != index) || (only.is_none() && index % workers != worker) {
            continue;
        }
        let desc = state.desc.clone();
        let verdict = check_state(r, state.disk, &desc, &fsck_opts);
        t.states += 1;
        t.fsck_errors += usize::from(!verdict.fsck_errors.is_empty());
        t.violations += usize::from(!verdict.violations.is_empty());
        let failed = !verdict.fsck_errors.is_empty() || !verdict.violations.is_empty();
        if only.is_some() || (failed && t.reports.len() < args.reports) {
            let mut report = format!(
                "{}: {desc}\n  crash after log entry {} of {}",
                r.dir.display(),
                entries_by(desc.time),
                r.trace.entries().len()
            );
            for line in verdict.fsck_errors.iter().map(|e| format!("fsck: {e}")) {
                report += &format!("\n  {line}");
            }
            for line in &verdict.violations {
                report += &format!("\n  {line}");
            }
            if !failed {
                report += "\n  mount, fsck and every acknowledged path: ok";
            }
            report += &format!("\n  replay: {}", replay_command(&r.dir, index, args));
            t.reports.push(report);
        }
    }
    Ok(t)
}

/// Runs `crash-trace`.
pub fn run(args: CrashTraceArgs) -> ExitCode {
    if args.state.is_some() && args.recordings.len() != 1 {
        eprintln!("ninefold crash-trace: --state needs exactly one recording");
        return ExitCode::from(2);
    }
    let started = Instant::now();
    let mut totals = Totals::default();
    for dir in &args.recordings {
        let r = match Recorded::load(dir) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ninefold crash-trace: {e}");
                return ExitCode::FAILURE;
            }
        };
        let workers = if args.state.is_some() {
            1
        } else {
            args.threads.max(1)
        };
        let parts: Vec<Result<Totals, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    let (r, args) = (&r, &args);
                    s.spawn(move || check_part(r, args, w, workers, args.state))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("worker"))
                .collect()
        });
        let mut here = Totals::default();
        for part in parts {
            match part {
                Ok(p) => {
                    here.states += p.states;
                    here.violations += p.violations;
                    here.fsck_errors += p.fsck_errors;
                    here.reports.extend(p.reports);
                }
                Err(e) => {
                    eprintln!("ninefold crash-trace: {}: {e}", dir.display());
                    return ExitCode::FAILURE;
                }
            }
        }
        println!(
            "{}: {}; {} acknowledged syncs of {} paths; {} states, {} violations, {} fsck errors ({:.0} s)",
            dir.display(),
            r.trace.summary(),
            r.acks.ack_count(),
            r.acks.paths.len(),
            here.states,
            here.violations,
            here.fsck_errors,
            started.elapsed().as_secs_f64()
        );
        for report in here.reports.iter().take(args.reports.max(1)) {
            println!("{report}");
        }
        totals.states += here.states;
        totals.violations += here.violations;
        totals.fsck_errors += here.fsck_errors;
    }
    let t = totals;
    if args.state.is_some() && t.states == 0 {
        eprintln!("ninefold crash-trace: no state {}", args.state.unwrap_or(0));
        return ExitCode::FAILURE;
    }
    println!(
        "trace crash states: {}, violations: {}, fsck errors: {}",
        t.states, t.violations, t.fsck_errors
    );
    if t.violations + t.fsck_errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
