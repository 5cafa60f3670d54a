//! The block-device middleware: recording (with in-flight requests), fault injection,
//! tracing, and the crash-state enumeration on hand-made recordings.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use block::{BlockDevice, Geometry, IoError, MemDisk, WriteFlags};
use block::{Fault, FaultDisk, RecordingDisk, RequestKind, TraceDisk, YieldDisk};
use pollster::block_on;
use testkit::sim::{enumerate, CrashParams, Torn};

const BS: usize = 4096;

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

fn block(fill: u8) -> Vec<u8> {
    vec![fill; BS]
}

#[test]
fn recording_sees_in_flight_requests_and_counts() {
    let (disk, recorder) = RecordingDisk::new(YieldDisk::new(MemDisk::new(BS as u32, 16)));
    let (a, b) = (block(1), vec![2u8; 2 * BS]);
    {
        let mut first = pin!(disk.write(3, &a, WriteFlags::NONE));
        let mut second = pin!(disk.write(4, &b, WriteFlags::FUA));
        assert!(poll_once(first.as_mut()).is_pending());
        assert!(poll_once(second.as_mut()).is_pending());
        // Both issued, neither completed.
        let log = recorder.snapshot();
        assert_eq!(log.requests.len(), 2);
        assert!(log.requests.iter().all(|r| r.completed.is_none()));
        assert!(poll_once(second.as_mut()).is_ready());
        assert!(poll_once(first.as_mut()).is_ready());
    }
    block_on(disk.flush()).unwrap();
    let mut buf = block(0);
    block_on(disk.read(3, &mut buf)).unwrap();
    let log = recorder.snapshot();
    let [w1, w2, f] = &log.requests[..] else {
        panic!("{log:?}")
    };
    assert_eq!(
        (w1.issued, w2.issued, w2.completed, w1.completed),
        (1, 2, Some(3), Some(4))
    );
    assert!(
        matches!(&w2.kind, RequestKind::Write { lba: 4, fua: true, data } if data.len() == 2 * BS)
    );
    assert_eq!(f.kind, RequestKind::Flush);
    assert!(f.issued > w1.completed.unwrap());
    let c = log.counters;
    assert_eq!(
        (c.writes, c.fua_writes, c.bytes_written, c.flushes, c.reads),
        (2, 1, 3 * BS as u64, 1, 1)
    );
    assert_eq!(recorder.now(), 6);
    // The data went through.
    assert_eq!(buf, a);
}

#[test]
fn fault_disk_fails_by_rule_and_flips_bits() {
    let disk = FaultDisk::new(MemDisk::new(BS as u32, 16), 7);
    disk.inject(Fault::NthWrite(1), IoError::Device(0x281));
    disk.inject(Fault::ReadRange(8..10), IoError::Timeout);
    disk.inject(Fault::NthFlush(0), IoError::Dead);
    let data = block(5);
    assert!(block_on(disk.write(0, &data, WriteFlags::NONE)).is_ok());
    assert_eq!(
        block_on(disk.write(1, &data, WriteFlags::NONE)),
        Err(IoError::Device(0x281))
    );
    assert!(block_on(disk.write(1, &data, WriteFlags::NONE)).is_ok());
    assert_eq!(block_on(disk.flush()), Err(IoError::Dead));
    assert!(block_on(disk.flush()).is_ok());
    let mut buf = vec![0u8; 2 * BS];
    assert_eq!(block_on(disk.read(7, &mut buf)), Err(IoError::Timeout));
    assert!(block_on(disk.read(5, &mut buf)).is_ok());
    // The failed write never reached the device.
    let mut buf = block(0);
    block_on(disk.inner().read(1, &mut buf)).unwrap();
    assert_eq!(buf, data, "written by the retry only");

    disk.heal();
    disk.inject(Fault::FlipBits(0..2), IoError::Timeout);
    let mut two = vec![0u8; 2 * BS];
    block_on(disk.read(0, &mut two)).unwrap();
    for half in two.chunks(BS) {
        let flipped: u32 = half
            .iter()
            .zip(&data)
            .map(|(x, y)| (x ^ y).count_ones())
            .sum();
        assert_eq!(flipped, 1);
    }
    let c = disk.counters();
    assert_eq!(
        (c.injected_errors, c.corrupted_blocks, c.writes, c.flushes),
        (3, 2, 3, 2)
    );
}

#[test]
fn random_faults_are_seeded() {
    let run = |seed| {
        let disk = FaultDisk::new(MemDisk::new(BS as u32, 4), seed);
        disk.inject(Fault::RandomWrites(250_000), IoError::Device(1));
        let data = block(1);
        (0..400)
            .map(|_| block_on(disk.write(0, &data, WriteFlags::NONE)).is_err())
            .collect::<Vec<_>>()
    };
    let a = run(1);
    assert_eq!(a, run(1));
    assert_ne!(a, run(2));
    let failures = a.iter().filter(|&&f| f).count();
    assert!((60..140).contains(&failures), "{failures} of 400 at 25%");
}

#[derive(Default)]
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{} {}", record.level(), record.args()));
    }
    fn flush(&self) {}
}

#[test]
fn trace_disk_logs_requests() {
    let capture: &'static Capture = Box::leak(Box::default());
    log::set_logger(capture).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let faulty = FaultDisk::new(MemDisk::new(BS as u32, 4), 0);
    faulty.inject(Fault::NthFlush(0), IoError::Timeout);
    let disk = TraceDisk::new(faulty, "nvme0");
    block_on(disk.write(2, &block(1), WriteFlags::FUA)).unwrap();
    assert!(block_on(disk.flush()).is_err());
    let lines = capture.0.lock().unwrap().clone();
    assert!(
        lines.contains(&"TRACE nvme0: write lba 2 len 4096 fua".to_string()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"TRACE nvme0: write lba 2 fua ok".to_string()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"WARN nvme0: flush failed: request timed out".to_string()),
        "{lines:?}"
    );
}

/// A recording made by hand: the base is zeros; block contents are their writer's tag.
fn recorded(
    script: impl AsyncFnOnce(&RecordingDisk<YieldDisk<MemDisk>>),
) -> (Arc<[u8]>, Geometry, block::Recording) {
    let base = MemDisk::new(BS as u32, 8);
    let image: Arc<[u8]> = base.snapshot().into();
    let (disk, recorder) = RecordingDisk::new(YieldDisk::new(base));
    block_on(script(&disk));
    (image, disk.geometry(), recorder.snapshot())
}

fn first_bytes(disk: &impl BlockDevice) -> Vec<u8> {
    (0..8)
        .map(|lba| {
            let mut b = block(0);
            block_on(disk.read(lba, &mut b)).unwrap();
            b[0]
        })
        .collect()
}

#[test]
fn flush_boundaries_and_exhaustive_subsets() {
    let (base, g, rec) = recorded(async |d| {
        d.write(0, &block(1), WriteFlags::NONE).await.unwrap();
        d.write(1, &block(2), WriteFlags::NONE).await.unwrap();
        d.flush().await.unwrap();
        d.write(2, &block(3), WriteFlags::NONE).await.unwrap();
        d.write(3, &block(4), WriteFlags::FUA).await.unwrap();
        d.write(4, &block(5), WriteFlags::NONE).await.unwrap();
    });
    let params = CrashParams {
        torn_sectors: 0,
        ..CrashParams::default()
    };
    let states: Vec<_> = enumerate(base, g, &rec, &params).collect();
    let images: Vec<(u64, Vec<u8>)> = states
        .iter()
        .map(|s| (s.desc.time, first_bytes(&s.disk)))
        .collect();
    // Before the flush completes: any subset of the two writes.
    for want in [[0, 0], [1, 0], [0, 2], [1, 2]] {
        assert!(
            images.iter().any(|(_, i)| i[..2] == want),
            "{want:?} missing"
        );
    }
    // After the flush, blocks 0 and 1 are always there; after the FUA write completes,
    // block 3 is too.
    let fua_done = rec.requests[4].completed.unwrap();
    for (time, image) in &images {
        if *time >= rec.requests[2].completed.unwrap() {
            assert_eq!(image[..2], [1, 2], "at {time}");
        }
        if *time >= fua_done {
            assert_eq!(image[3], 4, "at {time}");
        }
    }
    // At the end, blocks 2 and 4 are volatile: all four combinations.
    let end: Vec<_> = images
        .iter()
        .filter(|(t, _)| *t == rec.now)
        .map(|(_, i)| (i[2], i[4]))
        .collect();
    assert_eq!(end.len(), 4);
    for want in [(0, 0), (3, 0), (0, 5), (3, 5)] {
        assert!(end.contains(&want), "{want:?} not in {end:?}");
    }
    // Writing to a state does not leak into another.
    block_on(states[0].disk.write(7, &block(9), WriteFlags::NONE)).unwrap();
    assert_eq!(first_bytes(&states[1].disk)[7], 0);
    assert_eq!(states[0].disk.written_blocks(), [7]);
}

#[test]
fn overwrites_keep_their_order_unless_concurrent() {
    let (base, g, rec) = recorded(async |d| {
        // Sequential overwrites of block 0: the later one always wins when both land.
        d.write(0, &block(1), WriteFlags::NONE).await.unwrap();
        d.write(0, &block(2), WriteFlags::NONE).await.unwrap();
        // Concurrent overwrites of block 1: either may win.
        let a = block(3);
        let b = block(4);
        let (mut x, mut y) = (
            pin!(d.write(1, &a, WriteFlags::NONE)),
            pin!(d.write(1, &b, WriteFlags::NONE)),
        );
        while poll_once(x.as_mut()).is_pending() | poll_once(y.as_mut()).is_pending() {}
    });
    let params = CrashParams {
        exhaustive_max: 0, // force the sampled path, where reorderings are made
        random_subsets: 30,
        torn_sectors: 0,
        ..CrashParams::default()
    };
    let states: Vec<_> = enumerate(base, g, &rec, &params).collect();
    let mut block0 = std::collections::BTreeSet::new();
    let mut block1 = std::collections::BTreeSet::new();
    for s in &states {
        let image = first_bytes(&s.disk);
        block0.insert(image[0]);
        if s.desc.applied.len() == 4 {
            block1.insert(image[1]);
            assert_eq!(image[0], 2, "the later sequential write wins: {}", s.desc);
        }
    }
    assert_eq!(block0, [0, 1, 2].into());
    assert_eq!(
        block1,
        [3, 4].into(),
        "both orders of the concurrent writes"
    );
    assert!(states.iter().any(|s| s.desc.reordered));
}

#[test]
fn torn_writes_and_torn_sectors() {
    let (base, g, rec) = recorded(async |d| {
        d.write(
            0,
            &[block(1), block(2), block(3), block(4)].concat(),
            WriteFlags::NONE,
        )
        .await
        .unwrap();
    });
    let params = CrashParams {
        torn_writes: 1,
        torn_sectors: 4,
        ..CrashParams::default()
    };
    let states: Vec<_> = enumerate(base, g, &rec, &params).collect();
    let torn_blocks: Vec<_> = states
        .iter()
        .filter_map(|s| match &s.desc.torn {
            Some(Torn::Blocks { landed, .. }) => Some((landed.clone(), first_bytes(&s.disk))),
            _ => None,
        })
        .collect();
    assert_eq!(torn_blocks.len(), 2, "a random subset and a prefix");
    for (landed, image) in &torn_blocks {
        assert!(!landed.is_empty() && landed.len() < 4);
        for b in 0..4u64 {
            let want = if landed.contains(&b) { b as u8 + 1 } else { 0 };
            assert_eq!(image[b as usize], want);
        }
    }
    let sectors: Vec<_> = states
        .iter()
        .filter(|s| matches!(s.desc.torn, Some(Torn::Sector { .. })))
        .collect();
    assert_eq!(sectors.len(), 4);
    for s in sectors {
        let Some(Torn::Sector {
            block: b,
            split,
            new_first,
            ..
        }) = s.desc.torn
        else {
            unreachable!()
        };
        let mut data = block(0);
        block_on(s.disk.read(b, &mut data)).unwrap();
        let new = b as u8 + 1;
        let (first, second) = data.split_at(split as usize);
        let (want_first, want_second) = if new_first { (new, 0) } else { (0, new) };
        assert!(first.iter().all(|&x| x == want_first) && second.iter().all(|&x| x == want_second));
        assert!(split % 512 == 0 && split > 0 && (split as usize) < BS);
        assert!(s.desc.to_string().contains("torn at byte"));
    }
}

#[test]
fn large_volatile_sets_are_sampled_within_bounds() {
    let (base, g, rec) = recorded(async |d| {
        for i in 0..8u8 {
            d.write(u64::from(i), &block(i + 1), WriteFlags::NONE)
                .await
                .unwrap();
        }
    });
    let params = CrashParams {
        exhaustive_max: 4,
        random_subsets: 5,
        max_prefixes: 3,
        reorder: false,
        torn_writes: 0,
        torn_sectors: 0,
        ..CrashParams::default()
    };
    let states: Vec<_> = enumerate(base.clone(), g, &rec, &params).collect();
    // empty + full + 3 prefixes + 5 random subsets.
    assert_eq!(states.len(), 10);
    let again: Vec<_> = enumerate(base, g, &rec, &params).map(|s| s.desc).collect();
    assert_eq!(
        states.iter().map(|s| s.desc.clone()).collect::<Vec<_>>(),
        again,
        "reproducible"
    );
    let prefix = &states[2].desc;
    assert!(prefix.applied.windows(2).all(|w| w[0] < w[1]));
}
