//! The crash contract as a checker (feature `testing`).
//!
//! [`record_run`] runs an op sequence on the model and on a filesystem over a
//! [`RecordingDisk`](super::RecordingDisk), noting the recording's clock around every op
//! and keeping the model's visible state after every op. [`Checker::check`] then takes a
//! crash time and the [`VisibleState`] the filesystem recovered from a crash state, and
//! decides whether the crash contract allows it. The rules are listed in
//! `docs/testing.md` ("The contract checker"); each is named in the code as R0..R5.
//!
//! States are indexed by the number of ops applied: state `k` is the model after ops
//! `0..k`. With `n` ops acknowledged at the crash and op `n` possibly in flight, states
//! up to `last = n + 1` (in flight) or `n` may show. An acknowledged fsync-like op `j`
//! makes state `j + 1` a *durable point* for what it covers.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::testing::{
    format_ops, show_path, CompareOptions, Content, DualRunner, ManualClock, Mismatch, Op,
    OpOutcome, StepRecord, VisibleState,
};
use block::Recorder;
use vfs::{FileSystem, FileType, Ino, Timespec, ROOT_INO};

/// One op of a recorded run, with the recording's clock before and after it.
#[derive(Clone, Debug)]
pub struct RecordedOp {
    /// The op and both outcomes.
    pub step: StepRecord,
    /// Recording time when the op started.
    pub start: u64,
    /// Recording time when it returned.
    pub end: u64,
}

/// Everything the checker needs from a run.
#[derive(Clone, Debug)]
pub struct RecordedRun {
    /// The ops in order.
    pub ops: Vec<RecordedOp>,
    /// The model's visible state before the first op and after each op.
    pub model_states: Vec<VisibleState>,
    /// Inode numbers: filesystem under test → model.
    pub ino_map: BTreeMap<Ino, Ino>,
}

/// Runs `ops` on the model and on `make_fs(clock)` (a filesystem whose device is wrapped
/// in the [`RecordingDisk`](super::RecordingDisk) that `recorder` reads), comparing them
/// as [`DualRunner`] does. Returns the run and the filesystem (to drop, or to go on
/// with). [`Op::Remount`] calls `remount`.
pub fn record_run<F: FileSystem>(
    ops: &[Op],
    make_fs: impl FnOnce(ManualClock) -> F,
    mut remount: impl FnMut(F) -> F,
    recorder: &Recorder,
    options: CompareOptions,
) -> Result<(RecordedRun, F), Mismatch> {
    let options = CompareOptions {
        keep_model_states: true,
        ..options
    };
    let mut runner = DualRunner::new(make_fs, options);
    let mut marks = Vec::new();
    for op in ops {
        let start = recorder.now();
        runner.step(op, &mut remount)?;
        marks.push((start, recorder.now()));
    }
    let recorded = runner
        .records
        .iter()
        .zip(marks)
        .map(|(step, (start, end))| RecordedOp {
            step: step.clone(),
            start,
            end,
        })
        .collect();
    let run = RecordedRun {
        ops: recorded,
        model_states: core::mem::take(&mut runner.model_states),
        ino_map: core::mem::take(&mut runner.ino_map),
    };
    Ok((run, runner.into_fs()))
}

/// The parts of an inode the contract talks about.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    target: Option<Vec<u8>>,
}

#[derive(Clone, Debug)]
struct Summary {
    file_type: FileType,
    meta: Meta,
    /// Size and content of regular files.
    data: Option<(u64, Content)>,
    times: [Timespec; 4],
    nlink: u32,
    /// One path, for reports.
    path: Vec<u8>,
}

/// A visible state indexed by (model) inode.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    inodes: BTreeMap<Ino, Summary>,
    dirs: BTreeMap<Ino, BTreeMap<Vec<u8>, Ino>>,
    paths: BTreeMap<Ino, Vec<Vec<u8>>>,
}

impl Snapshot {
    /// Indexes `state`, translating inode numbers with `map` (unknown ones are reported
    /// in `unknown` and left out).
    fn of(
        state: &VisibleState,
        map: impl Fn(Ino) -> Option<Ino>,
        unknown: &mut Vec<String>,
    ) -> Snapshot {
        let mut snap = Snapshot::default();
        for (path, node) in &state.nodes {
            let Some(ino) = map(node.ino) else {
                unknown.push(format!(
                    "{}: inode {} was never created by the run",
                    show_path(path),
                    node.ino
                ));
                continue;
            };
            snap.paths.entry(ino).or_default().push(path.clone());
            if !path.is_empty() {
                let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
                    Some(i) => (&path[..i], &path[i + 1..]),
                    None => (&[][..], &path[..]),
                };
                if let Some(p) = state.nodes.get(parent).and_then(|n| map(n.ino)) {
                    snap.dirs.entry(p).or_default().insert(name.to_vec(), ino);
                }
            }
            if node.file_type == FileType::Directory {
                snap.dirs.entry(ino).or_default();
            }
            snap.inodes.entry(ino).or_insert_with(|| Summary {
                file_type: node.file_type,
                meta: Meta {
                    mode: node.attr.mode,
                    uid: node.attr.uid,
                    gid: node.attr.gid,
                    rdev: node.attr.rdev,
                    xattrs: node.xattrs.clone(),
                    target: node.target.clone(),
                },
                data: node
                    .content
                    .as_ref()
                    .map(|c| (node.attr.size.unwrap_or(0), c.clone())),
                times: node.attr.times,
                nlink: node.attr.nlink,
                path: path.clone(),
            });
        }
        snap
    }

    fn binding(&self, dir: Ino, name: &[u8]) -> Option<Ino> {
        self.dirs.get(&dir).and_then(|d| d.get(name)).copied()
    }
}

/// Why a recovered state is not allowed.
#[derive(Clone, Debug)]
pub struct Violation {
    /// One line per broken rule instance.
    pub problems: Vec<String>,
    /// Ops acknowledged at the crash.
    pub acknowledged: usize,
    /// The op in flight at the crash, if any.
    pub in_flight: Option<usize>,
    /// The whole sequence.
    pub ops: Vec<Op>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "crash contract violated:")?;
        for p in &self.problems {
            writeln!(f, "  - {p}")?;
        }
        write!(f, "ops 0..{} were acknowledged", self.acknowledged)?;
        match self.in_flight {
            Some(i) => writeln!(f, ", op {i} was in flight")?,
            None => writeln!(f)?,
        }
        writeln!(f, "sequence:")?;
        f.write_str(&format_ops(&self.ops))
    }
}

/// Durable points at one crash time (state indices; 0 when none).
#[derive(Debug, Default)]
struct Durable {
    /// Last acknowledged `sync`.
    global: usize,
    data: BTreeMap<Ino, usize>,
    meta: BTreeMap<Ino, usize>,
    entries: BTreeMap<Ino, usize>,
    bindings: BTreeMap<(Ino, Vec<u8>), usize>,
    /// Inode → the latest point it was made durably linked (fsync of it or of a
    /// directory holding it).
    linked: BTreeMap<Ino, usize>,
    /// Latest acknowledged fdatasync per inode.
    datasync: BTreeMap<Ino, usize>,
    /// Latest acknowledged fsync of a directory.
    last_dir_fsync: usize,
}

fn raise<K: Ord>(map: &mut BTreeMap<K, usize>, key: K, point: usize) {
    let v = map.entry(key).or_default();
    *v = (*v).max(point);
}

/// Checks recovered states against a [`RecordedRun`].
#[derive(Debug)]
pub struct Checker {
    run: RecordedRun,
    states: Vec<Snapshot>,
    /// Compare timestamps (see `docs/testing.md`).
    pub times: bool,
}

impl Checker {
    /// Prepares the checker (indexes every model state once).
    pub fn new(run: RecordedRun) -> Checker {
        let mut unknown = Vec::new();
        let states = run
            .model_states
            .iter()
            .map(|s| Snapshot::of(s, Some, &mut unknown))
            .collect();
        Checker {
            run,
            states,
            times: true,
        }
    }

    /// The run being checked against.
    pub fn run(&self) -> &RecordedRun {
        &self.run
    }

    /// `(acknowledged ops, op in flight)` at recording time `time`.
    pub fn acknowledged_at(&self, time: u64) -> (usize, Option<usize>) {
        let n = self.run.ops.iter().take_while(|o| o.end <= time).count();
        let in_flight = self.run.ops.get(n).filter(|o| o.start <= time).map(|_| n);
        (n, in_flight)
    }

    fn durable(&self, acknowledged: usize) -> Durable {
        let mut d = Durable::default();
        for (j, rec) in self.run.ops[..acknowledged].iter().enumerate() {
            let point = j + 1;
            if rec.step.op == Op::Remount {
                // A clean unmount persists everything.
                d.global = point;
                continue;
            }
            if rec.step.model.outcome != OpOutcome::Unit {
                continue;
            }
            let state = &self.states[point];
            let target = rec.step.model.ino;
            let (full, datasync) = match &rec.step.op {
                Op::Sync => {
                    d.global = point;
                    continue;
                }
                Op::Fsync { datasync, .. } => (!datasync, *datasync),
                Op::FsyncDir { .. } => (true, false),
                _ => continue,
            };
            let Some(x) = target else { continue };
            let is_dir = state
                .inodes
                .get(&x)
                .is_some_and(|s| s.file_type == FileType::Directory);
            raise(&mut d.data, x, point);
            if datasync {
                raise(&mut d.datasync, x, point);
            }
            if is_dir {
                raise(&mut d.entries, x, point);
                d.last_dir_fsync = d.last_dir_fsync.max(point);
            }
            if !full {
                continue;
            }
            raise(&mut d.meta, x, point);
            let Some(paths) = state.paths.get(&x) else {
                continue; // not linked (e.g. unlinked but open): no path to keep
            };
            raise(&mut d.linked, x, point);
            if is_dir {
                for child in state.dirs.get(&x).into_iter().flat_map(|e| e.values()) {
                    raise(&mut d.linked, *child, point);
                }
            }
            if paths.len() == 1 {
                // The one path to it, new or renamed ancestors included, is kept.
                let mut dir = ROOT_INO;
                for name in paths[0].split(|&b| b == b'/').filter(|n| !n.is_empty()) {
                    raise(&mut d.bindings, (dir, name.to_vec()), point);
                    match state.binding(dir, name) {
                        Some(next) => dir = next,
                        None => break,
                    }
                }
            }
        }
        d
    }

    /// Decides whether `recovered` (what the filesystem shows after mounting a crash
    /// state taken at recording time `time`) is allowed.
    pub fn check(&self, time: u64, recovered: &VisibleState) -> Result<(), Violation> {
        let (acknowledged, in_flight) = self.acknowledged_at(time);
        self.check_acknowledged(acknowledged, in_flight.is_some(), recovered)
    }

    /// [`Checker::check`] with the crash point given as ops: `acknowledged` ops done, and
    /// the next one in flight if `in_flight`.
    pub fn check_acknowledged(
        &self,
        acknowledged: usize,
        in_flight: bool,
        recovered: &VisibleState,
    ) -> Result<(), Violation> {
        let last = (acknowledged + usize::from(in_flight)).min(self.states.len() - 1);
        let mut problems: Vec<String> = recovered
            .anomalies
            .iter()
            .map(|a| format!("R0 inconsistent: {a}"))
            .collect();
        let map = |ino: Ino| self.run.ino_map.get(&ino).copied();
        let r = Snapshot::of(recovered, map, &mut problems);
        let d = self.durable(acknowledged);
        let g = d.global;
        let window = |lo: usize| lo..=last;
        let at = |k: usize, x: Ino| self.states[k].inodes.get(&x);

        for (&x, got) in &r.inodes {
            let p = show_path(&got.path);
            // R1: the inode existed by the crash, with this type and birth time.
            let Some(first) = (0..=last).find_map(|k| at(k, x)) else {
                problems.push(format!("R1 {p}: inode did not exist before the crash"));
                continue;
            };
            if first.file_type != got.file_type || (self.times && first.times[3] != got.times[3]) {
                problems.push(format!("R1 {p}: type or birth time changed"));
                continue;
            }
            let lo_meta = g.max(d.meta.get(&x).copied().unwrap_or(0));
            let lo_data = g.max(d.data.get(&x).copied().unwrap_or(0));
            let meta_ks: BTreeSet<usize> = window(lo_meta)
                .filter(|&k| at(k, x).is_some_and(|s| s.meta == got.meta))
                .collect();
            let data_ks: BTreeSet<usize> = window(lo_data)
                .filter(|&k| at(k, x).is_some_and(|s| s.data == got.data))
                .collect();
            let seen: Vec<usize> = window(lo_meta.min(lo_data))
                .filter(|&k| at(k, x).is_some())
                .collect();
            if seen.is_empty() {
                problems.push(format!(
                    "R2 {p}: inode was gone at its last durable point (state {}) and never came back",
                    lo_meta.min(lo_data)
                ));
                continue;
            }
            // R2: metadata and data are ones it had since they were made durable.
            if meta_ks.is_empty() {
                problems.push(format!(
                    "R2 {p}: metadata {:?} is not one it had in states {lo_meta}..={last}",
                    got.meta_brief()
                ));
            }
            if data_ks.is_empty() {
                let (size, _) = got.data.as_ref().expect("only files have data");
                problems.push(format!(
                    "R2 {p}: content (size {size}) is not one it had in states {lo_data}..={last}"
                ));
            }
            // R2: ...and from one moment, unless an fdatasync moved the data ahead.
            let datasync_split = d.datasync.get(&x).is_some_and(|&s| s > lo_meta);
            if !meta_ks.is_empty()
                && !data_ks.is_empty()
                && meta_ks.is_disjoint(&data_ks)
                && !datasync_split
            {
                problems.push(format!(
                    "R2 {p}: content is from states {data_ks:?} but metadata from {meta_ks:?}: never together"
                ));
            }
            // R2: timestamps are ones it had.
            if self.times {
                for (i, which) in ["atime", "mtime", "ctime"].iter().enumerate() {
                    if !seen
                        .iter()
                        .any(|&k| at(k, x).is_some_and(|s| s.times[i] == got.times[i]))
                    {
                        problems.push(format!("R2 {p}: {which} {:?} never seen", got.times[i]));
                    }
                }
            }
            // R5: a non-directory's link count is one it had (a rename is atomic), unless
            // a directory fsync may have persisted some of its names alone.
            if got.file_type != FileType::Directory && d.last_dir_fsync <= lo_meta {
                let lo_link = lo_meta;
                if !window(lo_link).any(|k| at(k, x).is_some_and(|s| s.nlink == got.nlink)) {
                    problems.push(format!(
                        "R5 {p}: {} names, a count it never had in states {lo_link}..={last}",
                        got.nlink
                    ));
                }
            }
        }

        // R3: every (directory, name) binding is one it had since its durable point.
        for (&dir, entries) in &r.dirs {
            let lo_dir = g.max(d.entries.get(&dir).copied().unwrap_or(0));
            let mut names: BTreeSet<&[u8]> = entries.keys().map(|n| n.as_slice()).collect();
            for k in window(lo_dir) {
                if let Some(e) = self.states[k].dirs.get(&dir) {
                    names.extend(e.keys().map(|n| n.as_slice()));
                }
            }
            for name in names {
                let lo = lo_dir.max(d.bindings.get(&(dir, name.to_vec())).copied().unwrap_or(0));
                let got = entries.get(name).copied();
                if !window(lo).any(|k| self.states[k].binding(dir, name) == got) {
                    let had: BTreeSet<Option<Ino>> = window(lo)
                        .map(|k| self.states[k].binding(dir, name))
                        .collect();
                    let dir_path = r
                        .inodes
                        .get(&dir)
                        .map(|s| show_path(&s.path))
                        .unwrap_or_default();
                    problems.push(format!(
                        "R3 {dir_path} entry {}: recovered {} but since state {lo} it was only {}",
                        name.escape_ascii(),
                        self.describe(got, last),
                        had.iter()
                            .map(|b| self.describe(*b, last))
                            .collect::<Vec<_>>()
                            .join(" or ")
                    ));
                }
            }
        }

        // R4: what was made durably linked, and stayed linked, is still there.
        let mut must: BTreeMap<Ino, usize> = d.linked.clone();
        for &x in self.states[g].paths.keys() {
            raise(&mut must, x, g);
        }
        for (&x, &since) in &must {
            if since > last || r.inodes.contains_key(&x) {
                continue;
            }
            if window(since).all(|k| self.states[k].paths.contains_key(&x)) {
                let path = at(since, x).map(|s| show_path(&s.path)).unwrap_or_default();
                problems.push(format!(
                    "R4 {path}: durable since state {since} and never removed, but missing"
                ));
            }
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(Violation {
                problems,
                acknowledged,
                in_flight: in_flight.then_some(acknowledged),
                ops: self.run.ops.iter().map(|o| o.step.op.clone()).collect(),
            })
        }
    }

    fn describe(&self, binding: Option<Ino>, last: usize) -> String {
        match binding {
            None => "absent".into(),
            Some(x) => match (0..=last).rev().find_map(|k| self.states[k].inodes.get(&x)) {
                Some(s) => format!("inode {x} (model; e.g. {})", show_path(&s.path)),
                None => format!("inode {x} (model)"),
            },
        }
    }
}

/// The full report for a failed crash state: what the state was, what was violated, the
/// sequence, and what the filesystem showed.
pub fn failure_report(
    desc: &super::CrashDesc,
    violation: &Violation,
    recovered: &VisibleState,
) -> String {
    format!("{desc}\n{violation}recovered state:\n{recovered}")
}

impl Summary {
    fn meta_brief(&self) -> String {
        format!(
            "mode {:o} owner {}:{} rdev {} {} xattrs",
            self.meta.mode,
            self.meta.uid,
            self.meta.gid,
            self.meta.rdev,
            self.meta.xattrs.len()
        )
    }
}
