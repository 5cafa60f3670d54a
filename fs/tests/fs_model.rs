//! The real filesystem against the reference model: random operation sequences with
//! clean unmounts and remounts in between, comparing every result and the visible state.

use std::cell::RefCell;
use std::rc::Rc;

use block::MemDisk;
use fsck::{fsck, FsckOptions};
use ninefs::volume::{
    format, DirtyThresholdPolicy, FormatOptions, MountOptions, NineFs, PressurePolicy,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{run_against_model, CompareOptions, ManualClock};
use vfs::{Clock, Timespec};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn format_opts(now: Timespec) -> FormatOptions {
    FormatOptions {
        node_size: 16 * 1024,
        uuid: [3; 16],
        secret: 0x5eed,
        now,
        ..FormatOptions::default()
    }
}

fn mount_opts(cache_limit: usize, early_writes: bool) -> MountOptions {
    MountOptions {
        cache_limit,
        policy: if early_writes {
            Box::new(DirtyThresholdPolicy)
        } else {
            Box::new(PressurePolicy)
        },
        ..MountOptions::default()
    }
}

/// Runs `ops` against the model on a fresh 32 MiB filesystem.
fn check(
    ops: &[testkit::testing::Op],
    cache_limit: usize,
    early: bool,
) -> Result<(), TestCaseError> {
    check_with(ops, cache_limit, early, false)
}

/// [`check`], with the root made a quota root (no limits) first when `quota`: every
/// inode is charged, and fsck at each remount and at the end recomputes the usage.
fn check_with(
    ops: &[testkit::testing::Op],
    cache_limit: usize,
    early: bool,
    quota: bool,
) -> Result<(), TestCaseError> {
    let clock: Rc<RefCell<Option<ManualClock>>> = Rc::default();
    let make_clock = clock.clone();
    let make = move |c: ManualClock| {
        *make_clock.borrow_mut() = Some(c.clone());
        let disk = MemDisk::new(4096, 8192);
        pollster::block_on(format(&disk, &format_opts(c.now()))).unwrap();
        let fs = pollster::block_on(NineFs::mount(
            disk,
            mount_opts(cache_limit, early),
            Box::new(c),
        ))
        .unwrap();
        if quota {
            let limits = vfs::QuotaLimits::default();
            pollster::block_on(vfs::FileSystem::set_quota(&fs, vfs::ROOT_INO, limits)).unwrap();
        }
        fs
    };
    let remount = move |fs: NineFs<MemDisk>| {
        let disk = pollster::block_on(fs.unmount()).expect("clean unmount");
        assert_fsck_clean(&disk);
        let c = clock.borrow().clone().expect("clock set");
        pollster::block_on(NineFs::mount(
            disk,
            mount_opts(cache_limit, early),
            Box::new(c),
        ))
        .expect("remount")
    };
    let runner = run_against_model(ops, make, remount, CompareOptions::default())?;
    let disk = pollster::block_on(runner.into_fs().unmount()).expect("clean unmount");
    assert_fsck_clean(&disk);
    Ok(())
}

/// fsck finds nothing wrong with a cleanly unmounted image.
fn assert_fsck_clean(disk: &MemDisk) {
    let report = pollster::block_on(fsck(disk, &FsckOptions::default())).expect("fsck runs");
    assert!(report.is_clean(), "fsck: {:#?}", report.errors);
    assert!(report.warnings.is_empty(), "fsck: {:#?}", report.warnings);
}

proptest! {
    #![proptest_config(Config { cases: cases(), ..Config::default() })]

    #[test]
    fn matches_model(ops in strategy::ops(GenConfig::default(), 1..80)) {
        check(&ops, 16 << 20, false)?;
    }
}

proptest! {
    #![proptest_config(Config { cases: cases() / 4, ..Config::default() })]

    /// With a node cache far too small for the tree: nodes are evicted and re-read, and
    /// checkpoints run under memory pressure between operations.
    #[test]
    fn matches_model_with_tiny_cache(ops in strategy::ops(GenConfig::default(), 1..80)) {
        check(&ops, 48 * 1024, false)?;
    }

    /// Every inode charged to a project: the usage fsck recomputes matches.
    #[test]
    fn matches_model_under_a_quota(ops in strategy::ops(GenConfig::default(), 1..80)) {
        check_with(&ops, 16 << 20, false, true)?;
    }

    /// Nodes written ahead of checkpoints whenever 4 KiB of them is dirty.
    #[test]
    fn matches_model_with_early_node_writes(ops in strategy::ops(GenConfig::default(), 1..80)) {
        check(&ops, 1 << 20, true)?;
    }
}
