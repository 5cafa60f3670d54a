//! The real filesystem against the reference model: random operation sequences with
//! clean unmounts and remounts in between, comparing every result and the visible state.

use std::cell::RefCell;
use std::rc::Rc;

use fs::block::MemDisk;
use fs::testing::strategy::{self, GenConfig};
use fs::testing::{run_against_model, CompareOptions, ManualClock};
use fs::vfs::{Clock, Timespec};
use fs::volume::{format, FormatOptions, MountOptions, NineFs};
use proptest::prelude::*;
use proptest::test_runner::Config;

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

fn mount_opts(cache_limit: usize) -> MountOptions {
    MountOptions {
        cache_limit,
        ..MountOptions::default()
    }
}

/// Runs `ops` against the model on a fresh 32 MiB filesystem.
fn check(ops: &[fs::testing::Op], cache_limit: usize) -> Result<(), TestCaseError> {
    let clock: Rc<RefCell<Option<ManualClock>>> = Rc::default();
    let make_clock = clock.clone();
    let make = move |c: ManualClock| {
        *make_clock.borrow_mut() = Some(c.clone());
        let disk = MemDisk::new(4096, 8192);
        pollster::block_on(format(&disk, &format_opts(c.now()))).unwrap();
        pollster::block_on(NineFs::mount(disk, mount_opts(cache_limit), Box::new(c))).unwrap()
    };
    let remount = move |fs: NineFs<MemDisk>| {
        let disk = pollster::block_on(fs.unmount()).expect("clean unmount");
        let c = clock.borrow().clone().expect("clock set");
        pollster::block_on(NineFs::mount(disk, mount_opts(cache_limit), Box::new(c)))
            .expect("remount")
    };
    run_against_model(ops, make, remount, CompareOptions::default())?;
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: cases(), ..Config::default() })]

    #[test]
    fn matches_model(ops in strategy::ops(GenConfig::default(), 1..80)) {
        check(&ops, 16 << 20)?;
    }
}
