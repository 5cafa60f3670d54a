//! Crash states of the real filesystem: record a run, enumerate what a power failure
//! could leave on the device (every flush boundary, subsets and reorderings of in-flight
//! writes, torn writes and sectors), and require that each state mounts, passes fsck, and
//! shows a state the crash contract allows. Until the fsync log exists, fsync is a
//! checkpoint, so this checks the checkpoint protocol.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use block::RecordingDisk;
use block::{BlockDevice, MemDisk};
use fsck::{fsck, FsckOptions};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use pollster::block_on;
use proptest::prelude::*;
use proptest::test_runner::Config;
use testkit::sim::contract::{failure_report, record_run, Checker};
use testkit::sim::{enumerate, CrashParams};
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{op_time, CompareOptions, ManualClock, VisibleState};

const BS: u32 = 4096;
const BLOCKS: u64 = 2048;

fn mount<D: BlockDevice>(disk: D, clock: ManualClock) -> NineFs<D> {
    block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(clock),
    ))
    .expect("mount")
}

/// Runs `ops`, then checks every crash state; returns how many there were.
fn crash_test(ops: &[testkit::testing::Op], seed: u64) -> Result<usize, TestCaseError> {
    let image = MemDisk::new(BS, BLOCKS);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        secret: 11,
        now: op_time(0),
        ..FormatOptions::default()
    };
    block_on(format(&image, &opts)).unwrap();
    let base: Arc<[u8]> = image.snapshot().into();
    let (disk, recorder) = RecordingDisk::new(MemDisk::from_bytes(BS, base.to_vec()));
    let geometry = disk.geometry();
    let clock: Rc<RefCell<Option<ManualClock>>> = Rc::default();
    let (run, fs) = record_run(
        ops,
        |c| {
            *clock.borrow_mut() = Some(c.clone());
            mount(disk, c)
        },
        |fs| {
            let disk = block_on(fs.unmount()).expect("unmount");
            mount(disk, clock.borrow().clone().expect("clock"))
        },
        &recorder,
        CompareOptions::default(),
    )?;
    drop(fs); // the crash
    let checker = Checker::new(run);
    let params = CrashParams {
        seed,
        ..CrashParams::default()
    };
    let mut states = 0;
    for state in enumerate(base, geometry, &recorder.snapshot(), &params) {
        states += 1;
        let desc = state.desc;
        let fs = match block_on(NineFs::mount(
            state.disk,
            MountOptions::default(),
            Box::new(ManualClock::default()),
        )) {
            Ok(fs) => fs,
            Err(e) => return Err(TestCaseError::fail(format!("{desc}\nmount failed: {e}"))),
        };
        let recovered = VisibleState::capture_blocking(&fs);
        if let Err(v) = checker.check(desc.time, &recovered) {
            return Err(TestCaseError::fail(failure_report(&desc, &v, &recovered)));
        }
        let disk = block_on(fs.unmount())
            .map_err(|e| TestCaseError::fail(format!("{desc}\nunmount: {e}")))?;
        let report = block_on(fsck(&disk, &FsckOptions::default())).expect("fsck runs");
        prop_assert!(report.is_clean(), "{desc}\nfsck: {:#?}", report.errors);
    }
    Ok(states)
}

static STATES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The proptest below, with a count of the states it checked.
#[test]
fn crash_states_were_enumerated() {
    every_crash_state_recovers();
    let n = STATES.load(std::sync::atomic::Ordering::Relaxed);
    println!("{n} crash states checked");
    assert!(n >= 10, "only {n} crash states");
}

proptest! {
    #![proptest_config(Config { cases: strategy::cases(12), ..Config::default() })]

    fn every_crash_state_recovers(ops in strategy::ops(GenConfig::default(), 1..30), seed in any::<u64>()) {
        let states = crash_test(&ops, seed)?;
        prop_assert!(states > 0);
        STATES.fetch_add(states, std::sync::atomic::Ordering::Relaxed);
    }
}
