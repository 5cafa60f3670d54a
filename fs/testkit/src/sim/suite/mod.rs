//! The crash suite of the real filesystem (feature `testing`).
//!
//! For a [`Workload`]: make the prelude durable, record every write, FLUSH and FUA the
//! workload's steps issue (syncs of a [`Step::Together`] run concurrently over a
//! [`YieldDisk`](super::YieldDisk)), enumerate the crash states of that recording
//! ([`enumerate`](super::enumerate)), and for each state: mount it (log replay), run
//! fsck on what mount committed, capture what a client sees and ask the contract
//! [`Checker`] whether it is allowed. [`run`] spreads workloads over threads (each with
//! its own executor: the filesystem's futures are not `Send`).
//!
//! Everything is deterministic: a workload id and a seed reproduce a failure exactly.

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::contract::{failure_report, Checker, RecordedOp, RecordedRun};
use super::{enumerate, CrashParams};
use crate::testing::{
    format_ops, op_time, CompareOptions, DualRunner, ManualClock, Op, VisibleState,
};
use block::{BlockDevice, MemDisk};
use block::{RecordingDisk, YieldDisk};
use fsck::{fsck, FsckOptions};
use ninefs::volume::{format as mkfs, FormatOptions, MountOptions, NineFs};

mod workloads;

pub use workloads::{ace, alphabet, fsx, prelude, scenarios, Step, Workload};

/// Device size of every workload, in 4 KiB blocks (8 MiB: a 32-block log, so log
/// reclaim and wrap-around happen in longer workloads).
pub const DISK_BLOCKS: u64 = 2048;

/// What checking one workload found.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The workload.
    pub id: String,
    /// Crash states checked (those of the workload and those of recoveries).
    pub states: usize,
    /// Of those, crash states of a recovery (a crash during log replay).
    pub recovery_states: usize,
    /// States whose recovered view broke the contract (or that did not mount).
    pub violations: usize,
    /// States whose committed image fsck found damaged.
    pub fsck_errors: usize,
    /// The first failure, fully described, with the command that replays it.
    pub failure: Option<String>,
}

type Disk = RecordingDisk<YieldDisk<MemDisk>>;

fn mount<D: BlockDevice>(disk: D, clock: ManualClock) -> Result<NineFs<D>, String> {
    pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(clock),
    ))
    .map_err(|e| format!("mount failed: {e}"))
}

/// A freshly made image (made once).
fn image() -> Vec<u8> {
    static IMAGE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    IMAGE.get_or_init(make_image).clone()
}

fn make_image() -> Vec<u8> {
    let disk = MemDisk::new(4096, DISK_BLOCKS);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        secret: 0x5eed,
        uuid: [9; 16],
        now: op_time(0),
        ..FormatOptions::default()
    };
    pollster::block_on(mkfs(&disk, &opts)).expect("format");
    // The root is a quota root (no limits): every inode is charged to its project, so
    // fsck checks in every crash state that mount left the usage exact.
    let fs = mount(&disk, ManualClock::new(op_time(0))).expect("mounts the fresh image");
    pollster::block_on(vfs::FileSystem::set_quota(
        &fs,
        vfs::ROOT_INO,
        vfs::QuotaLimits::default(),
    ))
    .expect("a quota on the root");
    pollster::block_on(fs.unmount()).expect("unmount");
    disk.snapshot()
}

/// The command that replays a workload.
pub fn replay_command(id: &str, seed: u64) -> String {
    format!(
        "cargo run --release -p ninefold-tools --bin ninefold-crash -- --replay {id} --seed {seed}"
    )
}

/// Records `w` and checks every crash state (see the module documentation). Every
/// `recovery_every`-th state whose mount replays the log (0: none) is also crashed
/// *during* that recovery: the recovery's writes are recorded and each of their crash
/// states is mounted and checked against the same crash time (a crash during replay
/// must lead to the same guarantees).
pub fn check(w: &Workload, params: &CrashParams, recovery_every: usize) -> Outcome {
    let mut out = Outcome {
        id: w.id.clone(),
        ..Outcome::default()
    };
    let fail = |out: &mut Outcome, what: String| {
        if out.failure.is_none() {
            out.failure = Some(format!(
                "workload {} (seed {}):\n{what}\nworkload steps:\n{}replay: {}\n",
                w.id,
                params.seed,
                show_steps(w),
                replay_command(&w.id, params.seed)
            ));
        }
    };
    let recorded = match record(w) {
        Ok(r) => r,
        Err(e) => {
            out.violations += 1;
            fail(&mut out, e);
            return out;
        }
    };
    let Recorded {
        base,
        run,
        snapshots,
        recording,
        geometry,
    } = recorded;
    let oracle = Oracle {
        contract: Checker::new(run),
        snapshots,
    };
    for (i, state) in enumerate(base, geometry, &recording, params).enumerate() {
        let desc = state.desc;
        let sample = recovery_every > 0 && i % recovery_every == 0;
        let image = sample.then(|| state.disk.to_mem_disk().snapshot());
        let replayed = check_state(&mut out, &oracle, state.disk, &desc, &|o, what| {
            fail(o, format!("{desc}\n{what}"))
        });
        if let (Some(image), true) = (image, replayed) {
            check_recovery(
                &mut out,
                &oracle,
                image,
                geometry,
                &desc,
                params,
                &|o, what| fail(o, what),
            );
        }
    }
    out
}

/// Mounts one crash state, runs fsck on what mount committed, and checks what a client
/// sees against the contract at `desc.time`. Returns whether mount replayed the log.
fn check_state<D: BlockDevice>(
    out: &mut Outcome,
    oracle: &Oracle,
    disk: D,
    desc: &super::CrashDesc,
    fail: &dyn Fn(&mut Outcome, String),
) -> bool {
    out.states += 1;
    let fs = match mount(disk, ManualClock::default()) {
        Ok(fs) => fs,
        Err(e) => {
            out.violations += 1;
            fail(out, e);
            return false;
        }
    };
    let report = pollster::block_on(fsck(fs.device(), &FsckOptions::default())).expect("fsck runs");
    if !report.is_clean() {
        out.fsck_errors += 1;
        fail(out, format!("fsck: {:#?}", report.errors));
    }
    let recovered = VisibleState::capture_blocking(&fs);
    if let Err(v) = oracle.contract.check(desc.time, &recovered) {
        out.violations += 1;
        fail(out, failure_report(desc, &v, &recovered));
    }
    if let Err(what) = check_snapshots(&fs, &oracle.snapshots, desc.time) {
        out.violations += 1;
        fail(out, format!("{desc}\n{what}"));
    }
    fs.stats().log.replayed_commits > 0
}

/// Crashes the recovery of crash state `image` (taken at `outer.time`) at every point
/// and checks each result like the original state.
fn check_recovery(
    out: &mut Outcome,
    oracle: &Oracle,
    image: Vec<u8>,
    geometry: block::Geometry,
    outer: &super::CrashDesc,
    params: &CrashParams,
    fail: &dyn Fn(&mut Outcome, String),
) {
    let base: Arc<[u8]> = image.clone().into();
    let (disk, recorder) = RecordingDisk::new(MemDisk::from_bytes(geometry.block_size, image));
    match mount(disk, ManualClock::default()) {
        Ok(fs) => drop(fs), // crashed right after mounting
        Err(e) => {
            out.violations += 1;
            fail(out, format!("{outer}\nrecording the recovery: {e}"));
            return;
        }
    }
    let recording = recorder.snapshot();
    for state in enumerate(base, geometry, &recording, params) {
        out.recovery_states += 1;
        let inner = state.desc.clone();
        let what = |o: &mut Outcome, w: String| {
            fail(
                o,
                format!("{outer}\nthen a crash during its recovery: {inner}\n{w}"),
            )
        };
        check_state(out, oracle, state.disk, outer, &what);
    }
}

/// A snapshot created or deleted by a workload, between recorder times `start` and `end`.
#[derive(Clone, Debug)]
struct SnapshotEvent {
    name: String,
    /// What a client saw when it was taken (`None`: a deletion).
    taken: Option<VisibleState>,
    start: u64,
    end: u64,
}

/// Checks the snapshots of a crash state at `time`: a snapshot created before the crash
/// (the call returned) exists and shows exactly what the live filesystem showed when it
/// was taken; one whose creation had not started does not exist; one deleted before the
/// crash is gone; in between, either.
fn check_snapshots<D: BlockDevice>(
    fs: &NineFs<D>,
    events: &[SnapshotEvent],
    time: u64,
) -> Result<(), String> {
    let names: Vec<String> = pollster::block_on(fs.snapshots())
        .map_err(|e| format!("listing snapshots: {e}"))?
        .into_iter()
        .map(|s| s.name)
        .collect();
    // What each snapshot must be at `time`: present, absent, or either (`None`, while
    // its creation or deletion ran). Events run one after another.
    let mut expect: alloc::collections::BTreeMap<&str, Option<bool>> = Default::default();
    for e in events {
        if time < e.start {
            break;
        }
        let done = time >= e.end;
        expect.insert(&e.name, done.then_some(e.taken.is_some()));
        if !done {
            break;
        }
    }
    for (name, must) in &expect {
        let present = names.iter().any(|n| n == name);
        if must.is_some_and(|m| m != present) {
            return Err(format!(
                "snapshot {name}: present {present}, but the crash came after its {} returned",
                if present { "deletion" } else { "creation" }
            ));
        }
    }
    for name in &names {
        if !expect.contains_key(name.as_str()) {
            return Err(format!("snapshot {name} exists before it was taken"));
        }
        let taken = events
            .iter()
            .rev()
            .find_map(|e| (e.name == *name).then_some(e.taken.as_ref()).flatten())
            .ok_or_else(|| format!("snapshot {name} was never taken"))?;
        let view = pollster::block_on(fs.snapshot_view(name))
            .map_err(|e| format!("snapshot {name}: view: {e}"))?;
        let seen = VisibleState::capture_blocking(&*view);
        if seen != *taken {
            return Err(format!(
                "snapshot {name} differs from the state it was taken of:\nsnapshot: {seen:#?}\ntaken: {taken:#?}"
            ));
        }
    }
    Ok(())
}

/// What a crash state is checked against: the contract for the live filesystem, the
/// snapshot events for the snapshots.
struct Oracle {
    contract: Checker,
    snapshots: Vec<SnapshotEvent>,
}

/// A recorded workload.
struct Recorded {
    base: Arc<[u8]>,
    run: RecordedRun,
    snapshots: Vec<SnapshotEvent>,
    recording: block::Recording,
    geometry: block::Geometry,
}

/// Runs the prelude (made durable by a clean remount) and the workload, recording what
/// the workload writes.
fn record(w: &Workload) -> Result<Recorded, String> {
    let (disk, recorder) = RecordingDisk::new(YieldDisk::new(MemDisk::from_bytes(4096, image())));
    let geometry = disk.geometry();
    let options = CompareOptions {
        keep_model_states: true,
        state_each_op: false,
        ..CompareOptions::default()
    };
    let clock: Arc<Mutex<Option<ManualClock>>> = Arc::default();
    let mut runner = {
        let clock = clock.clone();
        DualRunner::new(
            move |c| {
                *clock.lock().expect("clock") = Some(c.clone());
                mount(disk, c).expect("mounts the fresh image")
            },
            options,
        )
    };
    let mut remount = |fs: NineFs<Disk>| -> NineFs<Disk> {
        let disk = pollster::block_on(fs.unmount()).expect("unmount");
        let c = clock.lock().expect("clock").clone().expect("set");
        mount(disk, c).expect("remount")
    };
    let mut marks: Vec<(u64, u64)> = Vec::new();
    let mut prelude = prelude();
    prelude.push(Op::Remount);
    for op in &prelude {
        let start = recorder.now();
        runner.step(op, &mut remount).map_err(|m| format!("{m}"))?;
        marks.push((start, recorder.now()));
    }
    let base: Arc<[u8]> = runner.fs().device().inner().inner().snapshot().into();
    recorder.clear();
    let mut snapshots = Vec::new();
    for step in &w.steps {
        let start = recorder.now();
        match step {
            Step::Op(op) => {
                runner.step(op, &mut remount).map_err(|m| format!("{m}"))?;
                marks.push((start, recorder.now()));
            }
            Step::Together(ops) => {
                let mut ends = alloc::vec![0u64; ops.len()];
                let order = runner
                    .step_concurrent(ops, |i| ends[i] = recorder.now())
                    .map_err(|m| format!("{m}"))?;
                marks.extend(order.into_iter().map(|i| (start, ends[i])));
            }
            Step::Snapshot(name) => {
                let taken = VisibleState::capture_blocking(runner.fs());
                pollster::block_on(runner.fs().snapshot_create(name))
                    .map_err(|e| format!("snapshot create {name}: {e}"))?;
                snapshots.push(SnapshotEvent {
                    name: name.clone(),
                    taken: Some(taken),
                    start,
                    end: recorder.now(),
                });
            }
            Step::Quota(path) => {
                let fs = runner.fs();
                pollster::block_on(async {
                    let dir = crate::testing::resolve(fs, path).await?;
                    vfs::FileSystem::set_quota(fs, dir, vfs::QuotaLimits::default()).await
                })
                .map_err(|e| format!("set_quota {path:?}: {e}"))?;
            }
            Step::DeleteSnapshot(name) => {
                pollster::block_on(runner.fs().snapshot_delete(name))
                    .map_err(|e| format!("snapshot delete {name}: {e}"))?;
                snapshots.push(SnapshotEvent {
                    name: name.clone(),
                    taken: None,
                    start,
                    end: recorder.now(),
                });
            }
        }
    }
    let recording = recorder.snapshot();
    let run = RecordedRun {
        ops: runner
            .records
            .iter()
            .zip(&marks)
            .map(|(step, &(start, end))| RecordedOp {
                step: step.clone(),
                start,
                end,
            })
            .collect(),
        model_states: core::mem::take(&mut runner.model_states),
        ino_map: core::mem::take(&mut runner.ino_map),
    };
    drop(runner); // the crash
    Ok(Recorded {
        base,
        run,
        snapshots,
        recording,
        geometry,
    })
}

/// The steps, one per line.
pub fn show_steps(w: &Workload) -> String {
    let mut flat = Vec::new();
    let mut together = Vec::new();
    let mut notes: Vec<(usize, String)> = Vec::new();
    for s in &w.steps {
        match s {
            Step::Op(op) => flat.push(op.clone()),
            Step::Together(ops) => {
                together.push((flat.len(), ops.len()));
                flat.extend(ops.iter().cloned());
            }
            Step::Snapshot(name) => notes.push((flat.len(), format!("snapshot create {name}"))),
            Step::DeleteSnapshot(name) => {
                notes.push((flat.len(), format!("snapshot delete {name}")))
            }
            Step::Quota(path) => notes.push((flat.len(), format!("set_quota {path:?}"))),
        }
    }
    let mut text = format_ops(&flat);
    for (at, n) in together {
        text.push_str(&format!("  (ops {at}..{} ran concurrently)\n", at + n));
    }
    for (at, what) in notes {
        text.push_str(&format!("  ({what} before op {at})\n"));
    }
    text
}

/// Totals of a suite run.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// Workloads checked.
    pub workloads: usize,
    /// Crash states checked.
    pub states: usize,
    /// Of those, crash states during a recovery.
    pub recovery_states: usize,
    /// Contract violations (and mount failures).
    pub violations: usize,
    /// States with fsck errors.
    pub fsck_errors: usize,
    /// Failure reports (the first of each failing workload), at most `max_reports`.
    pub reports: Vec<String>,
}

/// Checks `workloads` on `threads` threads; `progress` is called after each workload.
pub fn run(
    workloads: Vec<Workload>,
    params: CrashParams,
    recovery_every: usize,
    threads: usize,
    max_reports: usize,
    progress: &(dyn Fn(&Outcome, &Totals) + Sync),
) -> Totals {
    let workloads = Arc::new(workloads);
    let next = AtomicUsize::new(0);
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(w) = workloads.get(i) else {
                    break;
                };
                let o = check(w, &params, recovery_every);
                let mut t = totals.lock().expect("totals");
                t.workloads += 1;
                t.states += o.states;
                t.recovery_states += o.recovery_states;
                t.violations += o.violations;
                t.fsck_errors += o.fsck_errors;
                if let Some(f) = &o.failure {
                    if t.reports.len() < max_reports {
                        t.reports.push(f.clone());
                    }
                }
                progress(&o, &t);
            });
        }
    });
    totals.into_inner().expect("totals")
}
