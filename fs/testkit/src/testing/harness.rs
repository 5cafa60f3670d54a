//! Running one op sequence on the model and on another filesystem side by side.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use super::apply::{apply_blocking, Applied, Handles, OpOutcome};
use super::op::{format_ops, Op};
use super::state::VisibleState;
use super::ManualClock;
use crate::model::{ModelConfig, ModelFs};
use vfs::{FileSystem, Ino, Timespec};

/// What [`DualRunner`] compares and keeps.
#[derive(Clone, Copy, Debug)]
pub struct CompareOptions {
    /// Compare atime/mtime/ctime/btime. Both filesystems read the same
    /// [`ManualClock`], which only moves between ops, so equal times are expected.
    pub times: bool,
    /// Capture and compare the visible state after every mutating op (else only after
    /// remounts and at the end).
    pub state_each_op: bool,
    /// Keep the model's visible state after every op in [`DualRunner::model_states`]
    /// (the crash-contract checker needs this history).
    pub keep_model_states: bool,
    /// Limits for the model, to match the filesystem under test.
    pub model: ModelConfig,
}

impl Default for CompareOptions {
    fn default() -> CompareOptions {
        CompareOptions {
            times: true,
            state_each_op: true,
            keep_model_states: false,
            model: ModelConfig::default(),
        }
    }
}

/// One op as both filesystems ran it.
#[derive(Clone, Debug)]
pub struct StepRecord {
    /// The op.
    pub op: Op,
    /// The model's result.
    pub model: Applied,
    /// The filesystem under test's result.
    pub real: Applied,
    /// The clock during the op.
    pub time: Timespec,
}

/// The two runs disagreed.
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// Index of the op after which the difference showed.
    pub index: usize,
    /// The ops up to and including that one.
    pub ops: Vec<Op>,
    /// Model and real outcome of that op, when the outcomes differ.
    pub outcomes: Option<alloc::boxed::Box<(OpOutcome, OpOutcome)>>,
    /// Differences of the visible states (model on the left).
    pub state_diff: Vec<String>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "model and filesystem differ after op {}: {:?}",
            self.index, self.ops[self.index]
        )?;
        if let Some(pair) = &self.outcomes {
            let (model, real) = &**pair;
            writeln!(f, "  model returned {model:?}")?;
            writeln!(f, "  fs returned    {real:?}")?;
        }
        if !self.state_diff.is_empty() {
            writeln!(f, "visible state (model vs fs):")?;
            for line in &self.state_diff {
                writeln!(f, "  {line}")?;
            }
        }
        writeln!(f, "sequence to replay:")?;
        f.write_str(&format_ops(&self.ops))
    }
}

impl From<Mismatch> for proptest::test_runner::TestCaseError {
    fn from(m: Mismatch) -> Self {
        proptest::test_runner::TestCaseError::fail(alloc::format!("{m}"))
    }
}

/// The time during op `index`: distinct seconds and nanoseconds per op, so a filesystem
/// that drops nanoseconds or mixes up ops shows.
pub fn op_time(index: usize) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + index as i64,
        nsec: ((index as u64 * 7_919 + 1) % 1_000_000_000) as u32,
    }
}

/// The model and a filesystem under test, run in lockstep.
#[derive(Debug)]
pub struct DualRunner<F> {
    /// The reference model.
    pub model: ModelFs<ManualClock>,
    fs: Option<F>,
    clock: ManualClock,
    handles: (Handles, Handles),
    options: CompareOptions,
    /// Inode numbers: filesystem under test → model.
    pub ino_map: BTreeMap<Ino, Ino>,
    /// Every op run so far.
    pub records: Vec<StepRecord>,
    /// With [`CompareOptions::keep_model_states`]: the model's state before the first op
    /// (index 0) and after each op (index i + 1).
    pub model_states: Vec<VisibleState>,
}

impl<F: FileSystem> DualRunner<F> {
    /// Starts both filesystems; `make_fs` gets the shared clock.
    pub fn new(make_fs: impl FnOnce(ManualClock) -> F, options: CompareOptions) -> DualRunner<F> {
        let clock = ManualClock::new(op_time(0));
        let model = ModelFs::with_config(clock.clone(), options.model);
        let fs = make_fs(clock.clone());
        let mut runner = DualRunner {
            model,
            fs: Some(fs),
            clock,
            handles: Default::default(),
            options,
            ino_map: BTreeMap::from([(vfs::ROOT_INO, vfs::ROOT_INO)]),
            records: Vec::new(),
            model_states: Vec::new(),
        };
        if options.keep_model_states {
            let state = VisibleState::capture_blocking(&runner.model);
            runner.model_states.push(state);
        }
        runner
    }

    /// The filesystem under test.
    pub fn fs(&self) -> &F {
        self.fs.as_ref().expect("present between ops")
    }

    /// Takes the filesystem under test out (e.g. to crash it).
    pub fn into_fs(self) -> F {
        self.fs.expect("present between ops")
    }

    /// Runs `op` on both, compares outcomes and (if configured) visible states.
    /// [`Op::Remount`] releases every handle and then calls `remount`.
    pub fn step(&mut self, op: &Op, remount: &mut impl FnMut(F) -> F) -> Result<(), Mismatch> {
        let index = self.records.len();
        let time = op_time(index + 1);
        self.clock.set(time);
        let (model, real) = if *op == Op::Remount {
            self.remount(remount)
        } else {
            let fs = self.fs.as_ref().expect("present between ops");
            let model = apply_blocking(&self.model, &mut self.handles.0, op);
            let real = apply_blocking(fs, &mut self.handles.1, op);
            (model, real)
        };
        self.learn(&model, &real);
        self.records.push(StepRecord {
            op: op.clone(),
            model: model.clone(),
            real: real.clone(),
            time,
        });
        if !model.outcome.same(&real.outcome, self.options.times) {
            return Err(self.mismatch(Some((model.outcome, real.outcome)), Vec::new()));
        }
        let compare = *op == Op::Remount || (self.options.state_each_op && op.mutates());
        if compare || self.options.keep_model_states {
            let model_state = VisibleState::capture_blocking(&self.model);
            if compare {
                self.compare_states(&model_state)?;
            }
            if self.options.keep_model_states {
                self.model_states.push(model_state);
            }
        }
        Ok(())
    }

    /// Runs `ops` — syncs only (fsync, fdatasync, directory fsync, sync), which change
    /// nothing a client sees — on the model one after another and on the filesystem all
    /// at once (their futures polled together, so a filesystem may serve them with one
    /// commit). `done(i)` is called the moment op `i` completes on the filesystem.
    /// Records them in the order they completed.
    pub fn step_concurrent(
        &mut self,
        ops: &[Op],
        mut done: impl FnMut(usize),
    ) -> Result<Vec<usize>, Mismatch> {
        assert!(
            ops.iter()
                .all(|op| matches!(op, Op::Fsync { .. } | Op::FsyncDir { .. } | Op::Sync)),
            "only syncs run concurrently"
        );
        let index = self.records.len();
        let time = op_time(index + 1);
        self.clock.set(time);
        let fs = self.fs.as_ref().expect("present between ops");
        let mut handles: Vec<Handles> = ops.iter().map(|_| self.handles.1.clone()).collect();
        let mut order = Vec::new();
        let real: Vec<Applied> = {
            let futs: Vec<_> = ops
                .iter()
                .zip(handles.iter_mut())
                .map(|(op, h)| alloc::boxed::Box::pin(super::apply::apply(fs, h, op)))
                .collect();
            pollster::block_on(JoinAll {
                futs: futs.into_iter().map(Some).collect(),
                out: ops.iter().map(|_| None).collect(),
                done: &mut |i| {
                    order.push(i);
                    done(i)
                },
            })
        };
        for &i in &order {
            let op = &ops[i];
            let model = apply_blocking(&self.model, &mut self.handles.0, op);
            let real = real[i].clone();
            self.learn(&model, &real);
            self.records.push(StepRecord {
                op: op.clone(),
                model: model.clone(),
                real: real.clone(),
                time,
            });
            if !model.outcome.same(&real.outcome, self.options.times) {
                return Err(self.mismatch(Some((model.outcome, real.outcome)), Vec::new()));
            }
            if self.options.keep_model_states {
                let state = VisibleState::capture_blocking(&self.model);
                self.model_states.push(state);
            }
        }
        Ok(order)
    }

    /// Compares the visible states now.
    pub fn check_state(&mut self) -> Result<(), Mismatch> {
        let model_state = VisibleState::capture_blocking(&self.model);
        self.compare_states(&model_state)
    }

    fn compare_states(&mut self, model_state: &VisibleState) -> Result<(), Mismatch> {
        let real_state = VisibleState::capture_blocking(self.fs());
        for (path, node) in &real_state.nodes {
            if let Some(m) = model_state.nodes.get(path) {
                self.ino_map.entry(node.ino).or_insert(m.ino);
            }
        }
        let diff = model_state.diff(&real_state, self.options.times);
        if diff.is_empty() {
            Ok(())
        } else {
            Err(self.mismatch(None, diff))
        }
    }

    fn remount(&mut self, remount: &mut impl FnMut(F) -> F) -> (Applied, Applied) {
        let fs = self.fs.take().expect("present between ops");
        for ino in core::mem::take(&mut self.handles.0 .0) {
            pollster::block_on(self.model.release(ino)).expect("model release");
        }
        let mut failed = None;
        for ino in core::mem::take(&mut self.handles.1 .0) {
            if let Err(e) = pollster::block_on(fs.release(ino)) {
                failed.get_or_insert(e);
            }
        }
        self.fs = Some(remount(fs));
        let skipped = Applied {
            outcome: OpOutcome::Skipped,
            ino: None,
        };
        let real = match failed {
            Some(e) => Applied {
                outcome: OpOutcome::Broken(format!("release before remount: {e}")),
                ino: None,
            },
            None => skipped.clone(),
        };
        (skipped, real)
    }

    /// Learns inode pairs from two results of the same op.
    fn learn(&mut self, model: &Applied, real: &Applied) {
        if let (Some(m), Some(r)) = (model.ino, real.ino) {
            self.ino_map.entry(r).or_insert(m);
        }
        if let (OpOutcome::Attr(m), OpOutcome::Attr(r)) = (&model.outcome, &real.outcome) {
            self.ino_map.entry(r.ino).or_insert(m.ino);
        }
    }

    fn mismatch(
        &self,
        outcomes: Option<(OpOutcome, OpOutcome)>,
        state_diff: Vec<String>,
    ) -> Mismatch {
        Mismatch {
            index: self.records.len() - 1,
            ops: self.records.iter().map(|r| r.op.clone()).collect(),
            outcomes: outcomes.map(alloc::boxed::Box::new),
            state_diff,
        }
    }
}

/// Polls futures together until all are done, reporting each completion.
struct JoinAll<'a, F: core::future::Future> {
    futs: Vec<Option<core::pin::Pin<alloc::boxed::Box<F>>>>,
    out: Vec<Option<F::Output>>,
    done: &'a mut dyn FnMut(usize),
}

impl<F: core::future::Future> core::future::Future for JoinAll<'_, F>
where
    F::Output: Clone + Unpin,
{
    type Output = Vec<F::Output>;

    fn poll(
        self: core::pin::Pin<&mut Self>,
        cx: &mut core::task::Context<'_>,
    ) -> core::task::Poll<Vec<F::Output>> {
        // Every field is Unpin (futures are boxed).
        let this = self.get_mut();
        for i in 0..this.futs.len() {
            if let Some(f) = this.futs[i].as_mut() {
                if let core::task::Poll::Ready(v) = f.as_mut().poll(cx) {
                    this.futs[i] = None;
                    this.out[i] = Some(v);
                    (this.done)(i);
                }
            }
        }
        if this.futs.iter().all(Option::is_none) {
            core::task::Poll::Ready(this.out.iter().map(|o| o.clone().expect("done")).collect())
        } else {
            core::task::Poll::Pending
        }
    }
}

/// Runs `ops` on a fresh model and on `make_fs(clock)`, comparing every outcome and the
/// visible states (after every mutating op if `options.state_each_op`, after every
/// [`Op::Remount`], and at the end). `remount` unmounts and mounts the filesystem again
/// (for a filesystem without persistence, the identity).
pub fn run_against_model<F: FileSystem>(
    ops: &[Op],
    make_fs: impl FnOnce(ManualClock) -> F,
    mut remount: impl FnMut(F) -> F,
    options: CompareOptions,
) -> Result<DualRunner<F>, Mismatch> {
    let mut runner = DualRunner::new(make_fs, options);
    for op in ops {
        runner.step(op, &mut remount)?;
    }
    if !runner.records.is_empty() {
        runner.check_state()?;
    }
    Ok(runner)
}
