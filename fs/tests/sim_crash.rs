//! The crash simulator and the contract checker end to end, on a toy filesystem with a
//! correct and three buggy commit protocols: the correct one passes every crash state,
//! each buggy one is caught.

mod sim_toy;

use std::sync::Arc;

use block::RecordingDisk;
use block::{BlockDevice, MemDisk};
use pollster::block_on;
use proptest::prelude::*;
use sim_toy::{mkfs, ToyFs, Variant};
use testkit::sim::contract::{failure_report, record_run, Checker};
use testkit::sim::{enumerate, CrashParams};
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{
    op_time, CompareOptions, ManualClock, Name, Op, Path, Target, VisibleState,
};

const BS: u32 = 4096;
const BLOCKS: u64 = 4096;

/// What a crash test saw.
#[derive(Debug)]
struct Report {
    states: usize,
    /// The first violation (or mount failure), fully described.
    failure: Option<String>,
}

fn crash_test(variant: Variant, ops: &[Op], params: &CrashParams) -> Report {
    let image = MemDisk::new(BS, BLOCKS);
    block_on(mkfs(&image, op_time(0)));
    let base: Arc<[u8]> = image.snapshot().into();
    let (disk, recorder) = RecordingDisk::new(MemDisk::from_bytes(BS, base.to_vec()));
    let geometry = disk.geometry();
    let (run, fs) = record_run(
        ops,
        |clock| block_on(ToyFs::mount(disk, clock, variant)).unwrap(),
        |fs| {
            block_on(vfs::FileSystem::sync(&fs)).unwrap();
            let clock = fs.clock();
            block_on(ToyFs::mount(fs.into_disk(), clock, variant)).unwrap()
        },
        &recorder,
        CompareOptions::default(),
    )
    .unwrap_or_else(|m| panic!("the toy differs from the model:\n{m}"));
    drop(fs);
    let recording = recorder.snapshot();
    let checker = Checker::new(run);
    let mut states = 0;
    for state in enumerate(base, geometry, &recording, params) {
        states += 1;
        let desc = state.desc;
        let fs = match block_on(ToyFs::mount(state.disk, ManualClock::default(), variant)) {
            Ok(fs) => fs,
            Err(e) => {
                return Report {
                    states,
                    failure: Some(format!("{desc}\nmount failed: {e}")),
                }
            }
        };
        let recovered = VisibleState::capture_blocking(&fs);
        if let Err(v) = checker.check(desc.time, &recovered) {
            return Report {
                states,
                failure: Some(failure_report(&desc, &v, &recovered)),
            };
        }
    }
    Report {
        states,
        failure: None,
    }
}

fn path(names: &[u8]) -> Target {
    Target::Path(Path::of(names))
}

/// A scenario in the style of the fstests fsync tests: create, write, fsync, rename,
/// link, fsync a directory, overwrite, fdatasync, xattrs, sync.
fn scenario() -> Vec<Op> {
    let (a, c, d) = (Name::Plain(0), Name::Plain(2), Name::Plain(3));
    vec![
        Op::Mkdir {
            dir: Path::root(),
            name: a,
            perm: 0o755,
        },
        Op::Create {
            dir: Path::of(&[0]),
            name: c,
            perm: 0o644,
        },
        Op::Write {
            target: path(&[0, 2]),
            offset: 0,
            len: 10_000,
            seed: 1,
        },
        Op::Fsync {
            target: path(&[0, 2]),
            datasync: false,
        },
        Op::Rename {
            from_dir: Path::of(&[0]),
            from: c,
            to_dir: Path::root(),
            to: d,
        },
        Op::Link {
            target: path(&[3]),
            dir: Path::of(&[0]),
            name: c,
        },
        Op::FsyncDir { dir: Path::root() },
        Op::Write {
            target: path(&[3]),
            offset: 4096,
            len: 5000,
            seed: 2,
        },
        Op::Setxattr {
            target: path(&[3]),
            name: testkit::testing::XName(0),
            len: 40,
            seed: 3,
            how: vfs::XattrMode::Upsert,
        },
        Op::Fsync {
            target: path(&[3]),
            datasync: true,
        },
        Op::Create {
            dir: Path::root(),
            name: c,
            perm: 0o600,
        },
        Op::Unlink {
            dir: Path::of(&[0]),
            name: c,
        },
        Op::Sync,
        Op::Write {
            target: path(&[2]),
            offset: 0,
            len: 100,
            seed: 4,
        },
        Op::Rename {
            from_dir: Path::root(),
            from: c,
            to_dir: Path::root(),
            to: d,
        },
        Op::Fsync {
            target: path(&[3]),
            datasync: false,
        },
    ]
}

#[test]
fn correct_commit_protocol_passes_every_crash_state() {
    let report = crash_test(Variant::Correct, &scenario(), &CrashParams::default());
    assert!(report.failure.is_none(), "{}", report.failure.unwrap());
    assert!(report.states > 30, "only {} states", report.states);
}

#[test]
fn commit_before_flush_is_caught() {
    let report = crash_test(
        Variant::CommitBeforeFlush,
        &scenario(),
        &CrashParams::default(),
    );
    let failure = report.failure.expect("bug not caught");
    eprintln!("{failure}");
    // Either the replay trips over the missing log or an fsynced file is lost.
    assert!(
        failure.contains("mount failed") || failure.contains("R"),
        "{failure}"
    );
}

#[test]
fn missing_flush_is_caught() {
    let report = crash_test(Variant::NoFlush, &scenario(), &CrashParams::default());
    let failure = report.failure.expect("bug not caught");
    eprintln!("{failure}");
    assert!(failure.contains("crash contract violated"), "{failure}");
}

#[test]
fn single_header_slot_is_caught_by_torn_sectors() {
    let report = crash_test(Variant::SingleSlot, &scenario(), &CrashParams::default());
    let failure = report.failure.expect("bug not caught");
    eprintln!("{failure}");
    assert!(failure.contains("torn"), "{failure}");
    // Without torn states the same toy passes: the tear is what breaks it.
    let params = CrashParams {
        torn_sectors: 0,
        torn_writes: 0,
        ..CrashParams::default()
    };
    let report = crash_test(Variant::SingleSlot, &scenario(), &params);
    assert!(report.failure.is_none(), "{}", report.failure.unwrap());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: strategy::cases(12), failure_persistence: None, ..ProptestConfig::default() })]

    /// Random sequences: the correct toy passes every crash state.
    #[test]
    fn correct_toy_passes_random_sequences(ops in strategy::ops(GenConfig::default(), 1..30), seed in any::<u64>()) {
        let params = CrashParams { seed, ..CrashParams::default() };
        let report = crash_test(Variant::Correct, &ops, &params);
        prop_assert!(report.failure.is_none(), "{}", report.failure.unwrap());
    }
}
