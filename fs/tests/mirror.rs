//! A filesystem on a mirror of two devices (`block::MirrorDisk`): each leg is a whole
//! filesystem; bad copies on one leg (flipped bits, read errors) are served from the
//! other and mended, by reads and by scrub; a leg whose writes fail is taken out,
//! recorded in the superblock before the fsync that follows is acknowledged, and never
//! trusted again; a leg missing at mount leaves the volume serving (or refused, on
//! request); crashes that leave the legs different (each leg its own subset of the
//! writes since the last FLUSH, a torn block on one) keep every acknowledged fsync.

use block::{Fault, FaultDisk, IoError, LegState, MemDisk, MirrorDisk};
use fsck::{fsck, FsckOptions};
use ninefs::volume::{format, FormatOptions, MountError, MountOptions, NineFs};
use testkit::testing::ManualClock;
use vfs::{FileSystem, Ino, Owner, Timespec, ROOT_INO};

const OWNER: Owner = Owner { uid: 1, gid: 2 };
const BLOCKS: u64 = 4096;

/// Past the superblocks: a leg whose superblocks are all bad is no leg at all.
const FIRST_BITMAP_BLOCK: u64 = 3;

type Leg = FaultDisk<MemDisk>;
type Mirror = MirrorDisk<Leg>;

fn clock() -> ManualClock {
    ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 5,
    })
}

fn leg(image: Vec<u8>) -> Leg {
    FaultDisk::new(MemDisk::from_bytes(4096, image), 1)
}

fn mirror(legs: Vec<Option<Vec<u8>>>) -> Mirror {
    MirrorDisk::new(legs.into_iter().map(|l| l.map(leg)).collect()).unwrap()
}

fn mount_with(dev: Mirror, opts: MountOptions) -> Result<NineFs<Mirror>, MountError> {
    pollster::block_on(NineFs::mount(dev, opts, Box::new(clock())))
}

fn mount(dev: Mirror) -> NineFs<Mirror> {
    mount_with(dev, MountOptions::default()).expect("mounts")
}

/// The content of file `i`.
fn content(i: u32) -> Vec<u8> {
    (0..(i as usize * 3000 + 100))
        .map(|j| (j as u32 * 31 + i) as u8)
        .collect()
}

/// A mirrored filesystem with 30 files and a snapshot, cleanly unmounted: the two legs'
/// images.
fn build() -> Vec<Vec<u8>> {
    let dev = mirror(vec![Some(vec![0; 4096 * BLOCKS as usize]); 2]);
    let opts = FormatOptions {
        node_size: 16 * 1024,
        uuid: [9; 16],
        secret: 77,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&dev, &opts)).unwrap();
    let fs = mount(dev);
    pollster::block_on(async {
        let d = fs.mkdir(ROOT_INO, b"dir", 0o755, OWNER).await.unwrap();
        for i in 0..30u32 {
            let name = format!("file{i}");
            let f = fs
                .create(d.ino, name.as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            fs.write(f.ino, 0, &content(i)).await.unwrap();
        }
        // Its nodes are walked at every mount.
        fs.snapshot_create("made").await.unwrap();
    });
    images(pollster::block_on(fs.unmount()).unwrap())
}

fn images(m: Mirror) -> Vec<Vec<u8>> {
    (0..m.copies())
        .filter_map(|i| Some(m.leg(i)?.inner().snapshot()))
        .collect()
}

use block::BlockDevice;

/// Every file's content is what was written (no error, no wrong byte).
fn check_files<D: BlockDevice>(fs: &NineFs<D>, files: u32) {
    pollster::block_on(async {
        let d = fs.lookup(ROOT_INO, b"dir").await.unwrap();
        for i in 0..files {
            let f = fs
                .lookup(d.ino, format!("file{i}").as_bytes())
                .await
                .unwrap();
            let want = content(i);
            let mut buf = vec![0u8; want.len() + 10];
            let n = fs.read(f.ino, 0, &mut buf).await.unwrap();
            assert_eq!(&buf[..n], &want[..], "file{i}");
        }
    });
}

/// fsck of one leg's image alone: a leg is a whole filesystem.
fn fsck_clean(image: &[u8]) {
    let disk = MemDisk::from_bytes(4096, image.to_vec());
    let report = pollster::block_on(fsck(&disk, &FsckOptions::default())).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

#[test]
fn every_leg_holds_the_whole_filesystem() {
    let legs = build();
    assert_eq!(legs[0], legs[1], "both legs got every write");
    fsck_clean(&legs[0]);
    let fs = mount(mirror(legs.into_iter().map(Some).collect()));
    assert_eq!(fs.stats().legs, 2);
    assert_eq!(fs.stats().failed_legs, 0);
    check_files(&fs, 30);
}

#[test]
fn flipped_bits_on_one_leg_are_served_from_the_other_and_mended() {
    let mut legs = build();
    let data_start = FIRST_BITMAP_BLOCK;
    // A flipped bit in every block of leg 0 past the superblocks.
    for b in data_start..BLOCKS {
        legs[0][b as usize * 4096 + 100] ^= 0x10;
    }
    let fs = mount(mirror(legs.into_iter().map(Some).collect()));
    check_files(&fs, 30);
    let repaired = fs.device().legs()[0].repairs;
    assert!(repaired > 0, "reads mended leg 0");
    assert_eq!(fs.device().legs()[1].repairs, 0);
    assert_eq!(fs.stats().corruptions, 0, "the client never saw one");
    // Scrub finds and mends the rest (nodes and data no read reached).
    let report = pollster::block_on(fs.scrub_all()).unwrap();
    assert_eq!(report.error_count, 0, "{report}");
    let images = images(pollster::block_on(fs.unmount()).unwrap());
    fsck_clean(&images[0]);
    fsck_clean(&images[1]);
}

#[test]
fn flipped_bits_on_one_leg_after_a_crash_are_served_from_the_other_and_mended() {
    let fs = mount(mirror(build().into_iter().map(Some).collect()));
    create_synced(&fs, b"synced", &content(7));
    // A crash: the legs as they are, not unmounted (the mount replays the log and
    // rewrites the bitmap groups), then a flipped bit in every block of leg 0 past the
    // superblocks — its committed bitmap slots included, which alone would look torn.
    let mut legs: Vec<Vec<u8>> = (0..2)
        .map(|i| fs.device().leg(i).unwrap().inner().snapshot())
        .collect();
    drop(fs);
    for b in FIRST_BITMAP_BLOCK..BLOCKS {
        legs[0][b as usize * 4096 + 100] ^= 0x10;
    }
    let fs = mount(mirror(legs.into_iter().map(Some).collect()));
    check_files(&fs, 30);
    assert_eq!(read_all(&fs, b"synced"), content(7));
    assert_eq!(fs.stats().corruptions, 0, "the client never saw one");
    assert_eq!(fs.stats().failed_legs, 0);
    let report = pollster::block_on(fs.scrub_all()).unwrap();
    assert_eq!(report.error_count, 0, "{report}");
    let images = images(pollster::block_on(fs.unmount()).unwrap());
    fsck_clean(&images[0]);
    fsck_clean(&images[1]);
}

/// The block of `image` that holds the first 4 KiB of file `i`.
fn first_block_of(image: &[u8], i: u32) -> usize {
    let want = &content(i)[..4096];
    (0..BLOCKS as usize)
        .find(|&b| &image[b * 4096..(b + 1) * 4096] == want)
        .expect("the file's first block")
}

#[test]
fn what_neither_leg_holds_good_is_an_error_for_scrub() {
    let mut legs = build();
    // file29's first block is bad on both legs; file28's on leg 1 only.
    let both = first_block_of(&legs[0], 29);
    let one = first_block_of(&legs[1], 28);
    for image in legs.iter_mut() {
        image[both * 4096 + 7] ^= 1;
    }
    legs[1][one * 4096 + 7] ^= 1;
    let fs = mount(mirror(legs.into_iter().map(Some).collect()));
    let report = pollster::block_on(fs.scrub_all()).unwrap();
    assert_eq!(report.error_count, 1, "{report}");
    assert_eq!(report.repaired, 1, "{report}");
    assert_eq!(fs.device().legs()[1].repairs, 1);
}

#[test]
fn read_errors_on_one_leg_are_served_and_take_it_out_past_the_limit() {
    let legs = build();
    let m = mirror(legs.into_iter().map(Some).collect()).with_read_error_limit(1000);
    let data_start = FIRST_BITMAP_BLOCK;
    m.leg(0)
        .unwrap()
        .inject(Fault::ReadRange(data_start..BLOCKS), IoError::Device(0x281));
    let fs = mount(m);
    check_files(&fs, 30);
    let l = fs.device().legs();
    assert!(l[0].read_errors > 0);
    assert!(l[0].repairs > 0, "written back where it could not be read");
    assert_eq!(l[0].state, LegState::Active);
    drop(fs);

    let legs = build();
    let m = mirror(legs.into_iter().map(Some).collect()).with_read_error_limit(3);
    m.leg(0)
        .unwrap()
        .inject(Fault::ReadRange(data_start..BLOCKS), IoError::Timeout);
    let fs = mount(m);
    check_files(&fs, 30);
    assert_eq!(fs.device().legs()[0].state, LegState::Failed);
    assert_eq!(fs.stats().failed_legs, 1);
    assert!(fs.status_text().lines().any(|l| l == "legs 2 failed 1"));
}

/// Creates `name` with `data`, fsyncs it; returns the inode.
fn create_synced<D: BlockDevice>(fs: &NineFs<D>, name: &[u8], data: &[u8]) -> Ino {
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, name, 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, data).await.unwrap();
        fs.fsync(f.ino, false).await.unwrap();
        fs.fsync(ROOT_INO, false).await.unwrap();
        f.ino
    })
}

fn read_all<D: BlockDevice>(fs: &NineFs<D>, name: &[u8]) -> Vec<u8> {
    pollster::block_on(async {
        let f = fs.lookup(ROOT_INO, name).await.unwrap();
        let mut buf = vec![0u8; f.size as usize];
        let n = fs.read(f.ino, 0, &mut buf).await.unwrap();
        buf.truncate(n);
        buf
    })
}

#[test]
fn a_leg_whose_writes_fail_is_taken_out_recorded_and_never_trusted_again() {
    for bad in [0, 1] {
        let legs = build();
        let fs = mount(mirror(legs.into_iter().map(Some).collect()));
        // From now on every write to leg `bad` fails.
        fs.device()
            .leg(bad)
            .unwrap()
            .inject(Fault::WriteRange(0..BLOCKS), IoError::Device(0x2));
        let data = vec![0x5a; 50_000];
        create_synced(&fs, b"after", &data);
        assert_eq!(fs.stats().failed_legs, 1);
        assert_eq!(fs.stats().failed, 0, "the volume serves on");
        // A crash now (no unmount): the bad leg missed the fsynced file, and its
        // superblocks still say it is in service, as of an older generation; the good
        // leg's, newer, say it failed.
        let images: Vec<Vec<u8>> = (0..2)
            .map(|i| fs.device().leg(i).unwrap().inner().snapshot())
            .collect();
        drop(fs);
        let fs = mount(mirror(images.iter().cloned().map(Some).collect()));
        assert_eq!(fs.device().legs()[bad].state, LegState::Failed, "leg {bad}");
        assert_eq!(read_all(&fs, b"after"), data);
        check_files(&fs, 30);
        fsck_clean(&images[1 - bad]);
    }
}

#[test]
fn a_leg_missing_at_mount_serves_degraded_or_is_refused() {
    let legs = build();
    let refuse = MountOptions {
        refuse_degraded: true,
        ..MountOptions::default()
    };
    let err = mount_with(mirror(vec![Some(legs[0].clone()), None]), refuse).err();
    assert_eq!(err, Some(MountError::Degraded(0b10)));
    let fs = mount(mirror(vec![Some(legs[0].clone()), None]));
    assert_eq!(fs.stats().failed_legs, 1);
    check_files(&fs, 30);
    let data = vec![7u8; 9000];
    create_synced(&fs, b"alone", &data);
    let leg0 = images(pollster::block_on(fs.unmount()).unwrap()).remove(0);
    // The old leg 1 comes back: stale (the table says so), never read.
    let fs = mount(mirror(vec![Some(leg0.clone()), Some(legs[1].clone())]));
    assert_eq!(fs.device().legs()[1].state, LegState::Failed);
    assert_eq!(read_all(&fs, b"alone"), data);
    // Alone, the old leg is its old self (it would mount as the volume was).
    let fs = mount(mirror(vec![None, Some(legs[1].clone())]));
    check_files(&fs, 30);
}

#[test]
fn a_crash_that_loses_one_legs_writes_since_the_flush_keeps_every_fsync() {
    let legs = build();
    let fs = mount(mirror(legs.into_iter().map(Some).collect()));
    let synced = vec![0x33; 20_000];
    create_synced(&fs, b"synced", &synced);
    // Leg 1 as of that fsync's FLUSH. The next fsync's writes and FLUSH complete on
    // leg 0; leg 1 loses all of them (its volatile cache, at a power cut before its
    // FLUSH completed): so that fsync was never acknowledged.
    let at_flush = fs.device().leg(1).unwrap().inner().snapshot();
    let later = vec![1u8; 30_000];
    pollster::block_on(async {
        let f = fs.create(ROOT_INO, b"later", 0o644, OWNER).await.unwrap();
        fs.write(f.ino, 0, &later).await.unwrap();
        fs.fsync(f.ino, false).await.unwrap();
        fs.fsync(ROOT_INO, false).await.unwrap();
    });
    let leg0 = fs.device().leg(0).unwrap().inner().snapshot();
    drop(fs);
    for legs in [
        vec![Some(leg0.clone()), Some(at_flush.clone())],
        vec![Some(at_flush.clone()), Some(leg0.clone())],
    ] {
        let fs = mount(mirror(legs));
        assert_eq!(
            fs.stats().failed_legs,
            0,
            "both legs in step as of the flush"
        );
        assert_eq!(read_all(&fs, b"synced"), synced);
        // The unacknowledged fsync: whole or not at all (here whole: the log is read
        // from whichever leg has it).
        assert_eq!(read_all(&fs, b"later"), later);
        check_files(&fs, 30);
        let report = pollster::block_on(fs.scrub_all()).unwrap();
        assert_eq!(report.error_count, 0, "{report}");
        let images = images(pollster::block_on(fs.unmount()).unwrap());
        fsck_clean(&images[0]);
        fsck_clean(&images[1]);
    }
}

/// A leg that keeps an image of itself at every point where what it holds becomes
/// durable (each FLUSH and FUA write): a crash between two points leaves the first
/// plus any subset of the blocks written since.
#[derive(Debug)]
struct Snapping {
    disk: MemDisk,
    points: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Snapping {
    fn new(image: Vec<u8>) -> Snapping {
        Snapping {
            points: std::sync::Mutex::new(vec![image.clone()]),
            disk: MemDisk::from_bytes(4096, image),
        }
    }

    fn point(&self) {
        self.points.lock().unwrap().push(self.disk.snapshot());
    }
}

impl BlockDevice for Snapping {
    fn geometry(&self) -> block::Geometry {
        self.disk.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.disk.read(lba, buf).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: block::WriteFlags) -> Result<(), IoError> {
        self.disk.write(lba, buf, flags).await?;
        if flags.fua {
            self.point();
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.disk.flush().await?;
        self.point();
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        self.disk.discard(lba, blocks).await
    }
}

/// `from` with the blocks of `chosen` (a subset of those that differ) taken from `to`.
fn between(from: &[u8], to: &[u8], differ: &[usize], chosen: u64) -> Vec<u8> {
    let mut image = from.to_vec();
    for (k, &b) in differ.iter().enumerate() {
        if chosen & 1 << (k % 64) != 0 {
            image[b * 4096..(b + 1) * 4096].copy_from_slice(&to[b * 4096..(b + 1) * 4096]);
        }
    }
    image
}

#[test]
fn crashes_that_leave_the_legs_different_keep_every_acknowledged_fsync() {
    let base = build();
    let legs = MirrorDisk::new(
        base.iter()
            .cloned()
            .map(|i| Some(Snapping::new(i)))
            .collect(),
    )
    .unwrap();
    let fs = pollster::block_on(NineFs::mount(
        legs,
        MountOptions::default(),
        Box::new(clock()),
    ))
    .unwrap();
    // File `i` is acknowledged once leg 0 has `acked[i]` points.
    let mut acked = Vec::new();
    let data = |i: usize| vec![i as u8 + 1; 5000 + i * 3000];
    for i in 0..12 {
        pollster::block_on(async {
            let name = format!("s{i}");
            let f = fs
                .create(ROOT_INO, name.as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
            fs.write(f.ino, 0, &data(i)).await.unwrap();
            fs.fsync(f.ino, false).await.unwrap();
            fs.fsync(ROOT_INO, false).await.unwrap();
            if i % 4 == 3 {
                fs.sync().await.unwrap();
            }
        });
        acked.push(fs.device().leg(0).unwrap().points.lock().unwrap().len());
    }
    let points: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|l| fs.device().leg(l).unwrap().points.lock().unwrap().clone())
        .collect();
    drop(fs);
    assert_eq!(
        points[0].len(),
        points[1].len(),
        "every FLUSH reached both legs"
    );
    let mut rng = oorandom::Rand64::new(27);
    let mut states = 0;
    for p in 0..points[0].len() - 1 {
        let (from, to) = (&points[0][p], &points[0][p + 1]);
        assert_eq!(from, &points[1][p]);
        let differ: Vec<usize> = (0..BLOCKS as usize)
            .filter(|&b| from[b * 4096..(b + 1) * 4096] != to[b * 4096..(b + 1) * 4096])
            .collect();
        // Each leg keeps its own subset of what was written since point `p`: none,
        // all, and random ones.
        let mut choices = vec![(0, u64::MAX), (u64::MAX, 0), (0, 0)];
        choices.extend((0..4).map(|_| (rng.rand_u64(), rng.rand_u64())));
        for (c0, c1) in choices {
            states += 1;
            let mut crashed = vec![
                Some(between(from, to, &differ, c0)),
                Some(between(from, to, &differ, c1)),
            ];
            // And a torn write on one leg: one block half new, half old.
            if let (Some(leg), false) = (crashed[(c0 % 2) as usize].as_mut(), differ.is_empty()) {
                let b = differ[(c1 as usize) % differ.len()] * 4096;
                let (first, second) = if c0 & 4 != 0 { (to, from) } else { (from, to) };
                leg[b..b + 2048].copy_from_slice(&first[b..b + 2048]);
                leg[b + 2048..b + 4096].copy_from_slice(&second[b + 2048..b + 4096]);
            }
            let fs = mount(mirror(crashed));
            pollster::block_on(async {
                for (i, &at) in acked.iter().enumerate() {
                    let name = format!("s{i}");
                    match fs.lookup(ROOT_INO, name.as_bytes()).await {
                        Ok(f) => {
                            let mut buf = vec![0u8; f.size as usize];
                            let n = fs.read(f.ino, 0, &mut buf).await.unwrap();
                            assert_eq!(buf[..n], data(i)[..], "{name} at point {p}");
                        }
                        Err(e) => assert!(at > p + 1, "{name} lost at point {p}: {e}"),
                    }
                }
            });
            check_files(&fs, 30);
            let images = images(pollster::block_on(fs.unmount()).unwrap());
            fsck_clean(&images[0]);
            fsck_clean(&images[1]);
        }
    }
    eprintln!("{states} crash states: each leg its own subset of the writes since a FLUSH, one torn block");
    assert!(states > 100, "{states} crash states");
}

// ---- Replacing a leg and rebuilding it ----

/// A blank device as large as a leg.
fn blank() -> Vec<u8> {
    vec![0; 4096 * BLOCKS as usize]
}

/// The label in block 0 of `image`.
fn label_of(image: &[u8]) -> Option<ninefs::format::label::DeviceLabel> {
    ninefs::format::label::DeviceLabel::decode(&image[..4096]).unwrap()
}

/// The rebuilt leg alone (the other removed) holds the whole volume: it mounts, every
/// file reads back, fsck is clean.
fn alone_holds_everything(image: &[u8], place: usize, files: u32, also: &[(&[u8], &[u8])]) {
    fsck_clean(image);
    let mut legs = vec![None, None];
    legs[place] = Some(image.to_vec());
    let fs = mount(mirror(legs));
    check_files(&fs, files);
    for (name, data) in also {
        assert_eq!(
            &read_all(&fs, name)[..],
            *data,
            "{:?}",
            String::from_utf8_lossy(name)
        );
    }
}

#[test]
fn a_leg_replaced_by_a_blank_device_is_rebuilt_and_then_holds_everything_alone() {
    let legs = build();
    // Offline: the volume assembled with a blank device in leg 1's place.
    let fs = mount(mirror(vec![Some(legs[0].clone()), Some(blank())]));
    assert_eq!(fs.stats().failed_legs, 1, "a blank device is no leg");
    pollster::block_on(fs.replace(1)).unwrap();
    assert_eq!(fs.device().legs()[1].state, LegState::Rebuilding);
    assert!(fs.status_text().contains("rebuild leg 1 blocks "));
    assert_eq!(pollster::block_on(fs.replace(1)), Err(vfs::Errno::EBUSY));
    let data = vec![0x42; 12_000];
    create_synced(&fs, b"during", &data);
    pollster::block_on(fs.rebuild_all()).unwrap();
    let s = fs.stats();
    assert_eq!((s.rebuilds, s.rebuild_running, s.failed_legs), (1, 0, 0));
    assert!(s.rebuild_blocks > 100, "{s:?}");
    assert_eq!(s.rebuild_unverified, 0);
    assert_eq!(fs.device().legs()[1].state, LegState::Active);
    assert!(fs.rebuild_progress().is_none());
    assert_eq!(fs.superblock().legs[..2], [1, 1]);
    let images = images(pollster::block_on(fs.unmount()).unwrap());
    let label = label_of(&images[1]).expect("the new leg is labelled");
    assert_eq!((label.place, label.legs, label.uuid), (1, 2, [9; 16]));
    alone_holds_everything(&images[1], 1, 30, &[(b"during", &data)]);
    // And both together again are a healthy mirror.
    let fs = mount(mirror(images.into_iter().map(Some).collect()));
    assert_eq!(fs.stats().failed_legs, 0);
    check_files(&fs, 30);
}

#[test]
fn a_rebuild_goes_on_after_a_clean_shutdown_from_its_recorded_cursor() {
    let legs = build();
    let opts = || MountOptions {
        rebuild_record_blocks: 100,
        ..MountOptions::default()
    };
    let fs = mount_with(mirror(vec![Some(legs[0].clone()), Some(blank())]), opts()).unwrap();
    pollster::block_on(fs.replace(1)).unwrap();
    while fs.rebuild_progress().unwrap().cursor < 200 {
        pollster::block_on(fs.rebuild_step(16 * 1024)).unwrap();
    }
    let before = fs.rebuild_progress().unwrap();
    assert!(
        before.recorded > 1 && before.cursor < before.total,
        "{before:?}"
    );
    let half = images(pollster::block_on(fs.unmount()).unwrap());
    assert_eq!(label_of(&half[1]).unwrap().place, 1);
    let fs = mount_with(mirror(half.into_iter().map(Some).collect()), opts()).unwrap();
    let after = fs.rebuild_progress().expect("goes on");
    assert_eq!((after.place, after.cursor), (1, before.recorded));
    assert_eq!(after.recorded, fs.superblock().rebuild_cursor);
    pollster::block_on(fs.rebuild_all()).unwrap();
    assert_eq!(fs.stats().rebuilds, 1);
    let done = images(pollster::block_on(fs.unmount()).unwrap());
    alone_holds_everything(&done[1], 1, 30, &[]);
}

#[test]
fn a_failed_leg_is_replaced_online_by_a_new_device() {
    let legs = build();
    let fs = mount(mirror(legs.into_iter().map(Some).collect()));
    fs.device()
        .leg(0)
        .unwrap()
        .inject(Fault::WriteRange(0..BLOCKS), IoError::Device(0x2));
    let data = vec![0x17; 40_000];
    create_synced(&fs, b"before", &data);
    assert_eq!(fs.device().legs()[0].state, LegState::Failed);
    // No device there but the failed one's: attach a new one, then replace.
    fs.device().attach(0, leg(blank())).unwrap();
    pollster::block_on(fs.replace(0)).unwrap();
    // The replaced leg is being rebuilt, not in service: a read never comes from it.
    check_files(&fs, 30);
    assert_eq!(fs.device().legs()[0].read_errors, 0);
    pollster::block_on(fs.rebuild_all()).unwrap();
    assert_eq!(fs.device().legs()[0].state, LegState::Active);
    let images = images(pollster::block_on(fs.unmount()).unwrap());
    alone_holds_everything(&images[0], 0, 30, &[(b"before", &data)]);
    // The last leg in service is never replaced; a single leg is no mirror.
    let fs = mount(mirror(vec![Some(images[0].clone()), None]));
    assert_eq!(pollster::block_on(fs.replace(0)), Err(vfs::Errno::EBUSY));
    assert_eq!(pollster::block_on(fs.replace(1)), Err(vfs::Errno::ENOENT));
    assert_eq!(pollster::block_on(fs.replace(5)), Err(vfs::Errno::EINVAL));
}

/// Legs whose every request yields once, so writes and rebuild copies overlap.
type Yielding = MirrorDisk<block::YieldDisk<MemDisk>>;

#[test]
fn writes_during_a_rebuild_reach_the_new_leg_and_no_stale_copy_lands_over_them() {
    let legs = build();
    let dev: Yielding = MirrorDisk::new(vec![
        Some(block::YieldDisk::new(MemDisk::from_bytes(
            4096,
            legs[0].clone(),
        ))),
        Some(block::YieldDisk::new(MemDisk::from_bytes(4096, blank()))),
    ])
    .unwrap();
    let opts = MountOptions {
        // Discards reach the legs in service only: the legs would differ there.
        discard: None,
        ..MountOptions::default()
    };
    let fs = pollster::block_on(NineFs::mount(dev, opts, Box::new(clock()))).unwrap();
    pollster::block_on(fs.replace(1)).unwrap();
    let gen = |round: usize, i: usize| vec![(round * 7 + i) as u8; 3000 + i * 1000];
    // A writer rewriting files and fsyncing (log blocks, node appends, bitmap and
    // superblock slots: the blocks written in place) while small rebuild steps run.
    let writer = async {
        for round in 0..12 {
            for i in 0..4 {
                let name = format!("w{i}");
                let f = match fs.lookup(ROOT_INO, name.as_bytes()).await {
                    Ok(f) => f,
                    Err(_) => fs
                        .create(ROOT_INO, name.as_bytes(), 0o644, OWNER)
                        .await
                        .unwrap(),
                };
                fs.write(f.ino, 0, &gen(round, i)).await.unwrap();
                fs.fsync(f.ino, false).await.unwrap();
                fs.fsync(ROOT_INO, false).await.unwrap();
            }
            if round % 5 == 4 {
                fs.sync().await.unwrap();
            }
        }
    };
    let rebuilder = async {
        while fs.rebuild_step(64 * 1024).await.unwrap()
            == ninefs::features::redundancy::rebuild::RebuildStep::Running
        {}
    };
    pollster::block_on(futures::future::join(writer, rebuilder));
    assert_eq!(fs.stats().rebuilds, 1);
    let images: Vec<Vec<u8>> = {
        let m = pollster::block_on(fs.unmount()).unwrap();
        (0..2)
            .map(|i| m.leg(i).unwrap().inner().snapshot())
            .collect()
    };
    // Every block of the new leg is the old leg's, or never written (free): a copy of
    // old data that landed over a newer write would differ.
    for b in 1..BLOCKS as usize {
        let (old, new) = (
            &images[0][b * 4096..(b + 1) * 4096],
            &images[1][b * 4096..(b + 1) * 4096],
        );
        assert!(
            old == new || new.iter().all(|&x| x == 0),
            "block {b} differs"
        );
    }
    let last: Vec<(Vec<u8>, Vec<u8>)> = (0..4)
        .map(|i| (format!("w{i}").into_bytes(), gen(11, i)))
        .collect();
    let also: Vec<(&[u8], &[u8])> = last.iter().map(|(n, d)| (&n[..], &d[..])).collect();
    alone_holds_everything(&images[1], 1, 30, &also);
}

/// A leg over a shared memory disk; leg 0's also keeps both legs' images at every point
/// where it made something durable (each FLUSH and FUA write), so a crash between two
/// points leaves each leg the first plus its own subset of the blocks written since.
#[derive(Debug)]
struct PairLeg {
    disk: std::sync::Arc<MemDisk>,
    /// Leg 1's disk and the points, on leg 0.
    record: Option<(std::sync::Arc<MemDisk>, PairPoints)>,
}

type PairPoints = std::sync::Arc<std::sync::Mutex<Vec<[Vec<u8>; 2]>>>;

impl PairLeg {
    fn point(&self) {
        if let Some((peer, points)) = &self.record {
            points
                .lock()
                .unwrap()
                .push([self.disk.snapshot(), peer.snapshot()]);
        }
    }
}

impl BlockDevice for PairLeg {
    fn geometry(&self) -> block::Geometry {
        self.disk.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.disk.read(lba, buf).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: block::WriteFlags) -> Result<(), IoError> {
        self.disk.write(lba, buf, flags).await?;
        if flags.fua {
            self.point();
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.disk.flush().await?;
        self.point();
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        self.disk.discard(lba, blocks).await
    }
}

/// The acknowledged files (`s{i}` acknowledged once `acked[i]` points were taken) are
/// whole on `fs`, crashed between points `p` and `p + 1`, with the 30 files of `build`.
fn acked_files_survive<D: BlockDevice>(fs: &NineFs<D>, acked: &[usize], p: usize, what: &str) {
    check_files(fs, 30);
    pollster::block_on(async {
        for (i, &at) in acked.iter().enumerate() {
            let name = format!("s{i}");
            match fs.lookup(ROOT_INO, name.as_bytes()).await {
                Ok(f) => {
                    let mut buf = vec![0u8; f.size as usize];
                    let n = fs.read(f.ino, 0, &mut buf).await.unwrap();
                    assert_eq!(buf[..n], synced_data(i)[..], "{name} at point {p} ({what})");
                }
                Err(e) => assert!(at > p + 1, "{name} lost at point {p} ({what}): {e}"),
            }
        }
    });
}

fn synced_data(i: usize) -> Vec<u8> {
    vec![i as u8 + 1; 5000 + i * 3000]
}

#[test]
fn a_crash_in_the_middle_of_a_rebuild_resumes_it_and_keeps_every_fsync() {
    let base = build();
    let d0 = std::sync::Arc::new(MemDisk::from_bytes(4096, base[0].clone()));
    let d1 = std::sync::Arc::new(MemDisk::from_bytes(4096, blank()));
    let points: PairPoints = Default::default();
    let legs = vec![
        Some(PairLeg {
            disk: d0.clone(),
            record: Some((d1.clone(), points.clone())),
        }),
        Some(PairLeg {
            disk: d1.clone(),
            record: None,
        }),
    ];
    let opts = MountOptions {
        // The cursor is recorded several times over this small volume.
        rebuild_record_blocks: 300,
        discard: None,
        ..MountOptions::default()
    };
    let fs = pollster::block_on(NineFs::mount(
        MirrorDisk::new(legs).unwrap(),
        opts,
        Box::new(clock()),
    ))
    .unwrap();
    pollster::block_on(fs.replace(1)).unwrap();
    // Small rebuild steps between acknowledged fsyncs, until it is done, and after.
    let mut acked = Vec::new();
    let mut i = 0;
    let mut after = 0;
    while after < 3 {
        let step = pollster::block_on(fs.rebuild_step(16 * 1024)).unwrap();
        if step == ninefs::features::redundancy::rebuild::RebuildStep::Idle {
            after += 1;
        }
        create_synced(&fs, format!("s{i}").as_bytes(), &synced_data(i));
        acked.push(points.lock().unwrap().len());
        i += 1;
    }
    assert_eq!(fs.stats().rebuilds, 1);
    drop(fs);
    let points = points.lock().unwrap().clone();
    let mut rng = oorandom::Rand64::new(4);
    let (mut states, mut resumed, mut active, mut from_cursor) = (0, 0, 0, 0);
    for p in 0..points.len() - 1 {
        let (from, to) = (&points[p], &points[p + 1]);
        let differ: Vec<Vec<usize>> = (0..2)
            .map(|l| {
                (0..BLOCKS as usize)
                    .filter(|&b| {
                        from[l][b * 4096..(b + 1) * 4096] != to[l][b * 4096..(b + 1) * 4096]
                    })
                    .collect()
            })
            .collect();
        let mut choices = vec![(0, 0), (u64::MAX, 0), (0, u64::MAX)];
        choices.push((rng.rand_u64(), rng.rand_u64()));
        for (c0, c1) in choices {
            states += 1;
            let crashed = vec![
                Some(between(&from[0], &to[0], &differ[0], c0)),
                Some(between(&from[1], &to[1], &differ[1], c1)),
            ];
            let fs = mount(mirror(crashed));
            acked_files_survive(&fs, &acked, p, "remounted");
            match fs.device().legs()[1].state {
                // The table said active: the leg holds everything, alone.
                LegState::Active => active += 1,
                // After a crash it goes on from its recorded cursor (replay copied the
                // last commit's data to it: see `rebuild::resume_rebuild`).
                LegState::Rebuilding => {
                    let r = fs.rebuild_progress().expect("resumed");
                    assert!(r.cursor >= 1 && r.cursor == r.recorded.max(1), "{r:?}");
                    if r.recorded > 0 {
                        from_cursor += 1;
                    }
                    resumed += 1;
                    pollster::block_on(fs.rebuild_all()).unwrap();
                    assert_eq!(fs.device().legs()[1].state, LegState::Active);
                }
                // Crashed before the table said rebuilding: out, as it was.
                LegState::Failed => continue,
                LegState::Missing => unreachable!(),
            }
            let images = images(pollster::block_on(fs.unmount()).unwrap());
            fsck_clean(&images[1]);
            let alone = mount(mirror(vec![None, Some(images[1].clone())]));
            acked_files_survive(&alone, &acked, p, "the rebuilt leg alone");
        }
    }
    eprintln!(
        "{states} crash states during a rebuild: {resumed} resumed ({from_cursor} from a recorded cursor), {active} active"
    );
    assert!(
        resumed > 10 && active > 3 && from_cursor > 0,
        "{resumed} resumed ({from_cursor} from a cursor), {active} active"
    );
}

/// The data cache over a mirror: cached blocks are served without the device (bits
/// flipped on a leg afterwards are not seen, nor mended, until the cache lets them
/// go); a repair and a rebuild's copies keep it right; after a rebuild the new leg
/// alone serves what the cache held.
#[test]
fn the_data_cache_stays_right_through_repairs_and_a_rebuild() {
    let legs = build();
    let fs = mount(mirror(vec![Some(legs[0].clone()), Some(blank())]));
    check_files(&fs, 30);
    let read = fs.stats().data_bytes_read;
    check_files(&fs, 30);
    assert_eq!(fs.stats().data_bytes_read, read, "served from the cache");
    // Rebuild leg 1 while the cache holds every file.
    pollster::block_on(fs.replace(1)).unwrap();
    pollster::block_on(fs.rebuild_all()).unwrap();
    assert_eq!(fs.stats().rebuild_unverified, 0);
    check_files(&fs, 30);
    // Bits flipped on leg 0: the cache still serves the right bytes; once it forgets
    // them, reads find the bad copies, serve leg 1's and mend leg 0.
    let leg0 = fs.device().leg(0).unwrap();
    leg0.inner().with_bytes(|b| {
        for blk in FIRST_BITMAP_BLOCK..BLOCKS {
            b[blk as usize * 4096 + 7] ^= 0x01;
        }
    });
    check_files(&fs, 30);
    assert_eq!(
        fs.device().legs()[0].repairs,
        0,
        "nothing read from the device"
    );
    fs.data_cache().clear();
    check_files(&fs, 30);
    assert!(fs.device().legs()[0].repairs > 0, "reads mended leg 0");
    check_files(&fs, 30);
    // Leg 0 out: the rebuilt leg alone serves everything, cache dropped or not.
    BlockDevice::fail_copy(fs.device(), 0);
    check_files(&fs, 30);
    fs.data_cache().clear();
    check_files(&fs, 30);
    assert_eq!(fs.data_cache().report().stale, 0);
    assert_eq!(fs.stats().corruptions, 0);
    fs.data_cache().check().unwrap();
}
