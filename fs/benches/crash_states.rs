//! Throughput of crash-state enumeration and checking: `make bench-host` (or `cargo
//! bench -p ninefold-fs --bench crash_states`) prints the figures docs/testing.md quotes;
//! nothing here passes or fails on time.

#[path = "../tests/sim_toy/mod.rs"]
mod sim_toy;

use std::sync::Arc;
use std::time::Instant;

use block::RecordingDisk;
use block::{BlockDevice, MemDisk, WriteFlags};
use pollster::block_on;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
use sim_toy::{mkfs, ToyFs, Variant};
use testkit::sim::contract::{record_run, Checker};
use testkit::sim::{enumerate, CrashParams};
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{op_time, CompareOptions, ManualClock, VisibleState};

fn main() {
    enumeration_throughput();
    toy_pipeline_throughput();
}

/// Enumerating the crash states of a recorded checkpoint-like workload.
fn enumeration_throughput() {
    // A checkpoint-like workload on a 256 MiB disk: bursts of 64 random 4-16 KiB writes,
    // a flush, then a FUA commit block.
    let bs = 4096u32;
    let image = MemDisk::new(bs, 65_536);
    let base: Arc<[u8]> = image.snapshot().into();
    let (disk, recorder) = RecordingDisk::new(image);
    let mut rng = oorandom::Rand64::new(1);
    block_on(async {
        for _ in 0..100 {
            for _ in 0..64 {
                let blocks = rng.rand_range(1..5) as usize;
                let lba = rng.rand_range(2..65_000);
                let data = vec![rng.rand_u64() as u8; blocks * bs as usize];
                disk.write(lba, &data, WriteFlags::NONE).await.unwrap();
            }
            disk.flush().await.unwrap();
            disk.write(0, &vec![1u8; bs as usize], WriteFlags::FUA)
                .await
                .unwrap();
        }
    });
    let recording = recorder.snapshot();
    let start = Instant::now();
    let mut states = 0usize;
    let mut checksum = 0u64;
    for state in enumerate(base, disk.geometry(), &recording, &CrashParams::default()) {
        let mut b = vec![0u8; bs as usize];
        block_on(state.disk.read(3, &mut b)).unwrap();
        checksum += u64::from(b[0]) + state.disk.overlay_blocks() as u64;
        states += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "enumeration: {states} states in {secs:.2} s = {:.1} us/state (checksum {checksum})",
        secs * 1e6 / states as f64
    );
}

/// The whole pipeline on the toy filesystem: enumerate, mount (replay), capture, check.
fn toy_pipeline_throughput() {
    let mut runner = TestRunner::new_with_rng(
        Default::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = strategy::ops(
        GenConfig {
            remount: false,
            ..GenConfig::default()
        },
        100..101,
    );
    let (mut states, mut check_time, total) = (0usize, 0f64, Instant::now());
    for _ in 0..20 {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        let image = MemDisk::new(4096, 4096);
        block_on(mkfs(&image, op_time(0)));
        let base: Arc<[u8]> = image.snapshot().into();
        let (disk, recorder) = RecordingDisk::new(MemDisk::from_bytes(4096, base.to_vec()));
        let geometry = disk.geometry();
        let (run, _fs) = record_run(
            &ops,
            |clock| block_on(ToyFs::mount(disk, clock, Variant::Correct)).unwrap(),
            |fs| fs,
            &recorder,
            CompareOptions {
                state_each_op: false,
                ..CompareOptions::default()
            },
        )
        .unwrap();
        let checker = Checker::new(run);
        for state in enumerate(
            base,
            geometry,
            &recorder.snapshot(),
            &CrashParams::default(),
        ) {
            let fs = block_on(ToyFs::mount(
                state.disk,
                ManualClock::default(),
                Variant::Correct,
            ))
            .unwrap();
            let recovered = VisibleState::capture_blocking(&fs);
            let t = Instant::now();
            checker.check(state.desc.time, &recovered).unwrap();
            check_time += t.elapsed().as_secs_f64();
            states += 1;
        }
    }
    let secs = total.elapsed().as_secs_f64();
    eprintln!(
        "toy pipeline: {states} states in {secs:.2} s = {:.1} us/state, of which check {:.1} us",
        secs * 1e6 / states as f64,
        check_time * 1e6 / states as f64
    );
}
