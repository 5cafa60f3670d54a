//! Snapshot streams (issue 28): a snapshot sent and received is the same tree (content,
//! holes, hard links, xattrs, times, modes, owners), in full and through chains of
//! incrementals; damaged or truncated streams are refused with nothing applied; an
//! incremental send reads the nodes on the paths to the change, not the filesystem.

use block::{CountingDisk, MemDisk};
use fsck::{fsck, FsckOptions};
use ninefs::features::streams::receive::{ReceiveError, StreamSource};
use ninefs::features::streams::send::{SendStats, RECEIVED_XATTR};
use ninefs::format::stream::{
    decode, DataMode, Encoder, Header, InodeRef, InodeState, Record, StreamError,
};
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use proptest::prelude::*;
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{apply, op_time, Handles, ManualClock, Op, VisibleState};
use vfs::{FileSystem, FileType, Owner, SetAttr, ROOT_INO};

const OWNER: Owner = Owner { uid: 0, gid: 0 };

fn formatted(blocks: u64, secret: u64) -> MemDisk {
    let disk = MemDisk::new(4096, blocks);
    let opts = FormatOptions {
        secret,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    disk
}

fn mount<D: block::BlockDevice>(disk: D, clock: &ManualClock) -> NineFs<D> {
    pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(clock.clone()),
    ))
    .unwrap()
}

fn clock() -> ManualClock {
    ManualClock::new(op_time(0))
}

async fn send<D: block::BlockDevice>(
    fs: &NineFs<D>,
    name: &str,
    base: Option<&str>,
) -> (Vec<u8>, SendStats) {
    let mut out = Vec::new();
    let stats = fs
        .send(name, base, &mut |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        })
        .await
        .unwrap();
    (out, stats)
}

/// The tree of snapshot `name`, without the receive mark, plus each path's block count
/// (so holes are compared too).
async fn tree<D: block::BlockDevice>(fs: &NineFs<D>, name: &str) -> VisibleState {
    let view = fs.snapshot_view(name).await.unwrap();
    let mut state = VisibleState::capture(&*view).await;
    for (path, node) in state.nodes.iter_mut() {
        node.xattrs.remove(RECEIVED_XATTR);
        let blocks = view.getattr(node.ino).await.unwrap().blocks;
        if node.file_type == FileType::Regular {
            node.xattrs
                .insert(b"test.blocks".to_vec(), blocks.to_le_bytes().to_vec());
        }
        let _ = path;
    }
    state
}

async fn assert_same<D: block::BlockDevice, E: block::BlockDevice>(
    src: &NineFs<D>,
    dst: &NineFs<E>,
    name: &str,
) {
    let (a, b) = (tree(src, name).await, tree(dst, name).await);
    assert!(a.anomalies.is_empty(), "{:?}", a.anomalies);
    let diff = a.diff(&b, true);
    assert!(diff.is_empty(), "snapshot {name}: {diff:#?}");
}

fn check(disk: &MemDisk) {
    let report = pollster::block_on(fsck(disk, &FsckOptions::default())).unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
}

fn config() -> GenConfig {
    GenConfig {
        remount: false,
        handles: true,
        durability: true,
        invalid: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: strategy::cases(32), ..ProptestConfig::default() })]

    /// Random trees, snapshotted after each batch of ops: the first sent in full, each
    /// next as an incremental from the one before, received into another filesystem;
    /// every received snapshot equals its source, and a full send of the last does too.
    #[test]
    fn chains_of_incrementals_reproduce_every_snapshot(
        batches in proptest::collection::vec(proptest::collection::vec(strategy::op(config()), 0..60), 1..6)
    ) {
        let (src_disk, dst_disk, full_disk) =
            (formatted(8 * 1024, 1), formatted(8 * 1024, 2), formatted(8 * 1024, 3));
        let c = clock();
        let (src, dst, full) = (mount(&src_disk, &c), mount(&dst_disk, &c), mount(&full_disk, &c));
        pollster::block_on(async {
            let mut handles = Handles::default();
            let mut step = 0;
            let mut prev: Option<String> = None;
            for (i, batch) in batches.iter().enumerate() {
                let ops: Vec<Op> = if i == 0 {
                    strategy::prelude().into_iter().chain(batch.iter().cloned()).collect()
                } else {
                    batch.clone()
                };
                for op in &ops {
                    step += 1;
                    c.set(op_time(step));
                    apply(&src, &mut handles, op).await;
                }
                let name = format!("s{i}");
                src.snapshot_create(&name).await.unwrap();
                let (stream, _) = send(&src, &name, prev.as_deref()).await;
                step += 1;
                c.set(op_time(step));
                dst.receive(&stream).await.unwrap();
                assert_same(&src, &dst, &name).await;
                prev = Some(name);
            }
            let last = prev.unwrap();
            let (stream, _) = send(&src, &last, None).await;
            full.receive(&stream).await.unwrap();
            assert_same(&src, &full, &last).await;
            dst.unmount().await.unwrap();
            full.unmount().await.unwrap();
        });
        check(&dst_disk);
        check(&full_disk);
    }
}

/// A small tree with every kind of inode, two snapshots of it.
async fn sample<D: block::BlockDevice>(fs: &NineFs<D>) {
    let f = fs.create(ROOT_INO, b"f", 0o640, OWNER).await.unwrap();
    fs.write(f.ino, 1 << 20, b"after a hole").await.unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, OWNER).await.unwrap();
    fs.link(f.ino, d.ino, b"f2").await.unwrap();
    fs.symlink(d.ino, b"l", b"../f", OWNER).await.unwrap();
    fs.mknod(d.ino, b"p", 0o010644, 0, OWNER).await.unwrap();
    fs.setxattr(f.ino, b"user.k", b"v", vfs::XattrMode::Upsert)
        .await
        .unwrap();
    fs.snapshot_create("a").await.unwrap();
    fs.write(f.ino, 0, b"head").await.unwrap();
    fs.rename(d.ino, b"l", ROOT_INO, b"l").await.unwrap();
    fs.snapshot_create("b").await.unwrap();
}

/// [`sample`] on `src`, then the full stream of `a` and the incremental from `a` to `b`.
async fn sample_streams<D: block::BlockDevice>(src: &NineFs<D>) -> (Vec<u8>, Vec<u8>) {
    sample(src).await;
    (
        send(src, "a", None).await.0,
        send(src, "b", Some("a")).await.0,
    )
}

/// The names of the snapshots of `fs`.
async fn snapshot_names<D: block::BlockDevice>(fs: &NineFs<D>) -> Vec<String> {
    fs.snapshots()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

#[test]
fn damaged_and_truncated_streams_are_refused_and_nothing_is_applied() {
    let (src_disk, dst_disk) = (formatted(4096, 1), formatted(4096, 2));
    let c = clock();
    let (src, dst) = (mount(&src_disk, &c), mount(&dst_disk, &c));
    pollster::block_on(async {
        let (full, incr) = sample_streams(&src).await;
        // An incremental without its base.
        assert_eq!(
            dst.receive(&incr).await,
            Err(ReceiveError::BaseMissing("a".into()))
        );
        let empty = VisibleState::capture(&dst).await;
        // Every truncation, and a flipped bit at many places.
        for n in (0..full.len()).step_by(97) {
            match dst.receive(&full[..n]).await {
                Err(ReceiveError::Stream(_)) => {}
                other => panic!("truncated at {n}: {other:?}"),
            }
            let mut d = full.clone();
            d[n] ^= 4;
            assert!(matches!(
                dst.receive(&d).await,
                Err(ReceiveError::Stream(_))
            ));
        }
        assert_eq!(
            dst.receive(&full[..full.len() - 1]).await,
            Err(ReceiveError::Stream(StreamError::Truncated(dst_records(
                &full
            ))))
        );
        // Checksums right, but records the receiver could not apply: refused before
        // anything changes.
        let header = decode(&full).unwrap().0;
        let file = |ino| InodeState {
            ino,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 10,
            atime: op_time(1),
            mtime: op_time(1),
            ctime: op_time(1),
            btime: op_time(1),
            data: DataMode::Whole,
            target: Vec::new(),
        };
        let new = InodeRef::New(77);
        let link = Record::Link(InodeRef::root(), b"x".to_vec(), new.clone());
        for bad in [
            vec![link.clone()],
            vec![
                Record::Inode(file(new.clone())),
                Record::Data(new.clone(), 8, vec![1; 4]),
            ],
            vec![
                Record::Inode(file(new.clone())),
                link.clone(),
                Record::Data(new.clone(), 0, vec![1]),
            ],
            vec![
                Record::Inode(file(new.clone())),
                Record::Link(InodeRef::root(), b"a/b".to_vec(), new.clone()),
            ],
            vec![Record::Inode(file(InodeRef::Base(vec![b"f".to_vec()])))],
        ] {
            let (mut enc, mut stream) = Encoder::start();
            stream.extend(enc.record(&Record::Begin(header.clone())));
            for r in &bad {
                stream.extend(enc.record(r));
            }
            stream.extend(enc.finish());
            match dst.receive(&stream).await {
                Err(ReceiveError::Inconsistent(_)) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert_eq!(VisibleState::capture(&dst).await, empty);
        assert!(dst.snapshots().await.unwrap().is_empty());
        // Whole, both apply; the same again is refused.
        dst.receive(&full).await.unwrap();
        dst.receive(&incr).await.unwrap();
        assert_same(&src, &dst, "a").await;
        assert_same(&src, &dst, "b").await;
        assert!(matches!(
            dst.receive(&incr).await,
            Err(ReceiveError::Exists(_))
        ));
    });
}

/// The number of records before the trailer (what a stream cut inside it reports).
fn dst_records(stream: &[u8]) -> u64 {
    decode(stream).unwrap().1.len() as u64 + 1
}

#[test]
fn a_live_tree_that_diverged_from_the_base_is_refused_until_rolled_back() {
    let (src_disk, dst_disk) = (formatted(4096, 1), formatted(4096, 2));
    let c = clock();
    let (src, dst) = (mount(&src_disk, &c), mount(&dst_disk, &c));
    pollster::block_on(async {
        let (full, incr) = sample_streams(&src).await;
        dst.receive(&full).await.unwrap();
        assert_eq!(
            dst.receive(&full).await,
            Err(ReceiveError::Exists("a".into()))
        );
        dst.create(ROOT_INO, b"local", 0o644, OWNER).await.unwrap();
        assert!(matches!(
            dst.receive(&incr).await,
            Err(ReceiveError::Diverged(_))
        ));
        dst.unlink(ROOT_INO, b"local").await.unwrap();
        // Removing it again is not the same tree either (the root's times changed).
        assert!(matches!(
            dst.receive(&incr).await,
            Err(ReceiveError::Diverged(_))
        ));
        // A rollback makes the live tree the last received snapshot again (and drops
        // its temporary snapshots); then the incremental applies.
        assert_eq!(dst.receive_rollback().await, Ok(Some("a".to_string())));
        assert_eq!(snapshot_names(&dst).await, ["a"]);
        assert_same(&src, &dst, "a").await;
        dst.receive(&incr).await.unwrap();
        assert_same(&src, &dst, "b").await;
        assert_eq!(dst.receive_rollback().await, Ok(Some("b".to_string())));
    });
}

#[test]
fn an_incremental_send_costs_the_change_not_the_filesystem() {
    let disk = CountingDisk::new(formatted(64 * 1024, 1));
    let c = clock();
    let fs = mount(&disk, &c);
    pollster::block_on(async {
        let mut files = Vec::new();
        for d in 0..100u32 {
            let dir = fs
                .mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, OWNER)
                .await
                .unwrap();
            for f in 0..100u32 {
                let a = fs
                    .create(dir.ino, format!("f{f}").as_bytes(), 0o644, OWNER)
                    .await
                    .unwrap();
                fs.write(a.ino, 0, &vec![(d + f) as u8; 4096])
                    .await
                    .unwrap();
                files.push(a.ino);
            }
        }
        fs.snapshot_create("a").await.unwrap();
        // 1% of the data rewritten (in one directory), one directory renamed, one file
        // chmodded.
        for &ino in &files[5000..5100] {
            fs.write(ino, 0, &[9u8; 4096]).await.unwrap();
        }
        fs.rename(ROOT_INO, b"d3", ROOT_INO, b"moved")
            .await
            .unwrap();
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        fs.setattr(files[7], set).await.unwrap();
        fs.snapshot_create("b").await.unwrap();

        let before = disk.counters().reads;
        let (full_stream, full) = send(&fs, "b", None).await;
        let full_reads = disk.counters().reads - before;
        let before = disk.counters().reads;
        let (incr_stream, incr) = send(&fs, "b", Some("a")).await;
        let incr_reads = disk.counters().reads - before;
        println!(
            "full: {} nodes, {} device reads, {} bytes; incremental (1% of files): {} nodes, {} device reads, {} bytes ({:.2}%)",
            full.nodes_read,
            full_reads,
            full_stream.len(),
            incr.nodes_read,
            incr_reads,
            incr_stream.len(),
            100.0 * incr_stream.len() as f64 / full_stream.len() as f64
        );
        assert!(
            incr.nodes_read * 10 < full.nodes_read,
            "{incr:?} vs {full:?}"
        );
        assert!(incr_reads * 10 < full_reads, "{incr_reads} vs {full_reads}");
        assert!(incr_stream.len() * 30 < full_stream.len());

        // And it is right: received into another filesystem, both equal the source.
        let dst_disk = formatted(64 * 1024, 2);
        let dst = mount(&dst_disk, &c);
        let (a_stream, _) = send(&fs, "a", None).await;
        dst.receive(&a_stream).await.unwrap();
        dst.receive(&incr_stream).await.unwrap();
        assert_same(&fs, &dst, "b").await;
    });
}

/// A crash at any point of an incremental receive: the received snapshot is there whole
/// or not at all, the base is intact, and (after a rollback when it is not there) the
/// same stream then applies, leaving a filesystem fsck finds clean.
#[test]
fn a_crash_during_a_receive_leaves_the_snapshot_whole_or_absent() {
    use block::{BlockDevice, RecordingDisk};
    use std::sync::Arc;
    use testkit::sim::{enumerate, CrashParams};

    let src_disk = formatted(4096, 1);
    let c = clock();
    let src = mount(&src_disk, &c);
    let (full, incr) = pollster::block_on(async {
        sample(&src).await;
        (
            send(&src, "a", None).await.0,
            send(&src, "b", Some("a")).await.0,
        )
    });
    let dst_disk = formatted(4096, 2);
    pollster::block_on(async {
        let dst = mount(&dst_disk, &c);
        dst.receive(&full).await.unwrap();
        dst.unmount().await.unwrap();
    });
    let base: Arc<[u8]> = dst_disk.snapshot().into();
    let (disk, recorder) = RecordingDisk::new(MemDisk::from_bytes(4096, base.to_vec()));
    let geometry = disk.geometry();
    pollster::block_on(async {
        // A cache too small for one operation's nodes: checkpoints run in the middle of
        // the receive, so crashes find the live tree half changed.
        let opts = MountOptions {
            cache_limit: 1,
            ..MountOptions::default()
        };
        let dst = NineFs::mount(disk, opts, Box::new(c.clone()))
            .await
            .unwrap();
        dst.receive(&incr).await.unwrap();
    });
    let params = CrashParams {
        exhaustive_max: 2,
        random_subsets: 1,
        max_prefixes: 1,
        torn_writes: 1,
        torn_sectors: 0,
        max_per_point: 4,
        ..CrashParams::default()
    };
    let (mut states, mut whole, mut half) = (0, 0, 0);
    for state in enumerate(base, geometry, &recorder.snapshot(), &params) {
        states += 1;
        let (desc, disk) = (state.desc, state.disk);
        pollster::block_on(async {
            let fs = NineFs::mount(&disk, MountOptions::default(), Box::new(c.clone()))
                .await
                .unwrap_or_else(|e| panic!("{desc}: mount: {e}"));
            assert_same(&src, &fs, "a").await;
            if snapshot_names(&fs).await.iter().any(|n| n == "b") {
                whole += 1;
            } else {
                if fs.lookup(ROOT_INO, b".ninefold-receive").await.is_ok() {
                    half += 1;
                }
                fs.receive_rollback().await.unwrap();
                fs.receive(&incr)
                    .await
                    .unwrap_or_else(|e| panic!("{desc}: receive after rollback: {e}"));
            }
            assert_same(&src, &fs, "b").await;
            fs.unmount().await.unwrap();
            let report = fsck(&disk, &FsckOptions::default()).await.unwrap();
            assert!(report.is_clean(), "{desc}: {:#?}", report.errors);
        });
    }
    println!("{states} crash states: {whole} with the snapshot whole, {half} half applied");
    assert!(
        whole > 0 && half > 0 && whole + half < states,
        "{states} {whole} {half}"
    );
}

/// Large sparse files through a full and two incremental sends: data past several
/// records, holes kept where they were, a rewrite in the middle sent alone, a hole
/// punched by truncating and extending, clones.
#[test]
fn sparse_and_cloned_files_keep_their_holes() {
    let (src_disk, dst_disk) = (formatted(16 * 1024, 1), formatted(16 * 1024, 2));
    let c = clock();
    let (src, dst) = (mount(&src_disk, &c), mount(&dst_disk, &c));
    pollster::block_on(async {
        let f = src.create(ROOT_INO, b"big", 0o644, OWNER).await.unwrap();
        src.write(f.ino, 0, &vec![1; 700_000]).await.unwrap();
        src.write(f.ino, 3 << 20, &vec![2; 1_000_001])
            .await
            .unwrap();
        let g = src.create(ROOT_INO, b"clone", 0o644, OWNER).await.unwrap();
        src.clone_range(f.ino, 0, g.ino, 1 << 20, 512 << 10)
            .await
            .unwrap();
        src.snapshot_create("a").await.unwrap();
        c.set(op_time(5));
        src.write(f.ino, 3 << 20, &[3; 4096]).await.unwrap();
        src.snapshot_create("b").await.unwrap();
        c.set(op_time(6));
        let set = |size| SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        src.setattr(f.ino, set(100)).await.unwrap();
        src.setattr(f.ino, set(5 << 20)).await.unwrap();
        src.write(g.ino, 0, b"x").await.unwrap();
        src.snapshot_create("c").await.unwrap();

        dst.receive(&send(&src, "a", None).await.0).await.unwrap();
        let (b, stats) = send(&src, "b", Some("a")).await;
        assert!(b.len() < 8192 + 1024, "{} bytes, {stats:?}", b.len());
        dst.receive(&b).await.unwrap();
        dst.receive(&send(&src, "c", Some("b")).await.0)
            .await
            .unwrap();
        for name in ["a", "b", "c"] {
            assert_same(&src, &dst, name).await;
        }
        // Sent on from the copy: a third filesystem gets the same (the copy's marks
        // are not sent; the third keeps its own).
        let third_disk = formatted(16 * 1024, 3);
        let third = mount(&third_disk, &c);
        third.receive(&send(&dst, "a", None).await.0).await.unwrap();
        third
            .receive(&send(&dst, "c", Some("a")).await.0)
            .await
            .unwrap();
        assert_same(&src, &third, "c").await;
        let mark = third.snapshot_view("c").await.unwrap();
        let mark = mark.getxattr(ROOT_INO, RECEIVED_XATTR).await.unwrap();
        let dst_c = dst.snapshots().await.unwrap().into_iter().last().unwrap();
        assert_eq!(mark[16..], dst_c.seq.to_le_bytes());
    });
}

// Forged streams (issue 40): checksums resealed, records that the filesystem's own
// operations would refuse half way. Each is refused by the check, before anything
// changes, and the valid stream is received right after.

/// `records` after `header`, encoded as a stream (checksums and trailer resealed).
fn reseal(header: &Header, records: &[Record]) -> Vec<u8> {
    let (mut enc, mut stream) = Encoder::start();
    stream.extend(enc.record(&Record::Begin(header.clone())));
    for r in records {
        stream.extend(enc.record(r));
    }
    stream.extend(enc.finish());
    stream
}

/// A base path.
fn at(path: &[&str]) -> InodeRef {
    InodeRef::Base(path.iter().map(|n| n.as_bytes().to_vec()).collect())
}

/// An INODE record: `mode` (type and permissions), with a symlink's `target`.
fn inode(ino: InodeRef, mode: u32, target: &[u8]) -> Record {
    Record::Inode(InodeState {
        ino,
        mode,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 0,
        atime: op_time(1),
        mtime: op_time(1),
        ctime: op_time(1),
        btime: op_time(1),
        data: DataMode::Keep,
        target: target.to_vec(),
    })
}

fn link(dir: InodeRef, name: &str, child: InodeRef) -> Record {
    Record::Link(dir, name.as_bytes().to_vec(), child)
}

fn unlink(dir: InodeRef, name: &str) -> Record {
    Record::Unlink(dir, name.as_bytes().to_vec())
}

const FILE: u32 = 0o100644;
const DIR: u32 = 0o040755;
const SYMLINK: u32 = 0o120777;
const CHARDEV: u32 = 0o020644;

/// What a receive must not change: the live tree (times too) and the snapshots.
async fn observed<D: block::BlockDevice>(fs: &NineFs<D>) -> (VisibleState, Vec<String>) {
    (VisibleState::capture(fs).await, snapshot_names(fs).await)
}

/// Asserts that `fs` is as `before` says.
async fn unchanged<D: block::BlockDevice>(
    fs: &NineFs<D>,
    before: &(VisibleState, Vec<String>),
    what: &str,
) {
    let after = observed(fs).await;
    let diff = before.0.diff(&after.0, true);
    assert!(diff.is_empty(), "{what}: the live tree changed: {diff:#?}");
    assert_eq!(before.1, after.1, "{what}: the snapshots changed");
}

/// The source of the forgery tests: [`sample`]'s `a` and `b`, then `c` adds a character
/// device, `e` rewrites a file and adds one. Returns the streams `a` (full), `a→b`,
/// `b→c`, `c→e`.
async fn forge_source<D: block::BlockDevice>(src: &NineFs<D>) -> [Vec<u8>; 4] {
    sample(src).await;
    src.mknod(ROOT_INO, b"cdev", CHARDEV, 0x0501, OWNER)
        .await
        .unwrap();
    src.snapshot_create("c").await.unwrap();
    let f = src.lookup(ROOT_INO, b"f").await.unwrap();
    src.write(f.ino, 0, b"changed").await.unwrap();
    let g = src.create(ROOT_INO, b"g", 0o600, OWNER).await.unwrap();
    src.write(g.ino, 0, b"new file").await.unwrap();
    src.snapshot_create("e").await.unwrap();
    [
        send(src, "a", None).await.0,
        send(src, "b", Some("a")).await.0,
        send(src, "c", Some("b")).await.0,
        send(src, "e", Some("c")).await.0,
    ]
}

/// Forged incremental streams, on a target holding `c` (the base of the valid `c→e`):
/// each refused with the reason given, nothing changed, and `c→e` received after it.
#[test]
fn forged_incremental_streams_are_refused_before_anything_changes() {
    let c = clock();
    let src_disk = formatted(4096, 1);
    let src = mount(&src_disk, &c);
    let [full, ab, bc, ce] = pollster::block_on(forge_source(&src));
    let prepared = formatted(4096, 2);
    pollster::block_on(async {
        let dst = mount(&prepared, &c);
        for s in [&full, &ab, &bc] {
            dst.receive(s).await.unwrap();
        }
        dst.unmount().await.unwrap();
    });
    let image = prepared.snapshot();
    let (header, valid) = decode(&ce).unwrap();
    let new = InodeRef::New(900);
    let new2 = InodeRef::New(901);
    let root = InodeRef::root;
    let mut bad_name = header.clone();
    bad_name.snapshot.name = "../x".into();
    let mut device = match inode(at(&["cdev"]), CHARDEV, b"") {
        Record::Inode(s) => s,
        _ => unreachable!(),
    };
    device.rdev = 0x0502;
    let cases: Vec<(&str, Header, Vec<Record>, &str)> = vec![
        (
            "link into a file",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b""),
                link(at(&["f"]), "x", new.clone()),
            ],
            "not a directory",
        ),
        (
            "link into a symlink",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b""),
                link(at(&["l"]), "x", new.clone()),
            ],
            "not a directory",
        ),
        (
            "link into a fifo",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b""),
                link(at(&["d", "p"]), "x", new.clone()),
            ],
            "not a directory",
        ),
        (
            "a directory under itself",
            header.clone(),
            vec![unlink(root(), "d"), link(at(&["d"]), "d", at(&["d"]))],
            "under itself",
        ),
        (
            "two new directories in each other",
            header.clone(),
            vec![
                inode(new.clone(), DIR, b""),
                inode(new2.clone(), DIR, b""),
                link(root(), "n", new.clone()),
                link(new.clone(), "m", new2.clone()),
                link(new2.clone(), "n", new.clone()),
            ],
            "directory",
        ),
        (
            "a cycle of removed directories",
            header.clone(),
            vec![
                unlink(root(), "d"),
                inode(new.clone(), DIR, b""),
                link(new.clone(), "d", at(&["d"])),
                link(at(&["d"]), "n", new.clone()),
            ],
            "under itself",
        ),
        (
            ".snapshots as a name",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b""),
                link(root(), ".snapshots", new.clone()),
            ],
            "snapshots",
        ),
        (
            "the staging directory removed",
            header.clone(),
            vec![unlink(root(), ".ninefold-receive")],
            "not there",
        ),
        (
            "an entry removed that is not there",
            header.clone(),
            vec![unlink(root(), "nosuch")],
            "not there",
        ),
        (
            "an entry removed twice",
            header.clone(),
            vec![
                unlink(at(&["d"]), "p"),
                unlink(at(&["d"]), "p"),
                link(root(), "p", at(&["d", "p"])),
            ],
            "not there",
        ),
        (
            "a link over an entry",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b""),
                link(root(), "f", new.clone()),
            ],
            "where one is",
        ),
        (
            "a second name for a directory",
            header.clone(),
            vec![link(root(), "d2", at(&["d"]))],
            "second name",
        ),
        (
            "a name for the root",
            header.clone(),
            vec![link(at(&["d"]), "r", root())],
            "second name",
        ),
        (
            "an inode described, never linked",
            header.clone(),
            vec![inode(new.clone(), FILE, b"")],
            "without a name",
        ),
        (
            "a base inode described, then unlinked",
            header.clone(),
            vec![
                unlink(at(&["d"]), "p"),
                inode(at(&["d", "p"]), 0o010644, b""),
            ],
            "without a name",
        ),
        (
            "a removed directory that keeps entries",
            header.clone(),
            vec![unlink(root(), "d")],
            "keeps entries",
        ),
        (
            "a path that names nothing",
            header.clone(),
            vec![inode(at(&["nosuch"]), FILE, b"")],
            "names nothing",
        ),
        (
            "a path through a file",
            header.clone(),
            vec![inode(at(&["f", "x"]), FILE, b"")],
            "names nothing",
        ),
        (
            "an inode described twice",
            header.clone(),
            vec![inode(at(&["f"]), FILE, b""), inode(at(&["f"]), FILE, b"")],
            "twice",
        ),
        (
            "the receive mark as an xattr",
            header.clone(),
            vec![
                inode(root(), DIR, b""),
                Record::Xattrs(root(), vec![(RECEIVED_XATTR.to_vec(), vec![0; 24])]),
            ],
            "mark",
        ),
        (
            "BEGIN naming the snapshot ../x",
            bad_name,
            valid.clone(),
            "not one a snapshot may have",
        ),
        // Type changes: an inode keeps its type for life (a replaced file is a new inode).
        (
            "the root made a file",
            header.clone(),
            vec![inode(root(), FILE, b"")],
            "type",
        ),
        (
            "the root made a symlink",
            header.clone(),
            vec![inode(root(), SYMLINK, b"x")],
            "type",
        ),
        (
            "a file made a symlink",
            header.clone(),
            vec![inode(at(&["f"]), SYMLINK, b"t")],
            "type",
        ),
        (
            "a file made a directory",
            header.clone(),
            vec![inode(at(&["f"]), DIR, b"")],
            "type",
        ),
        (
            "a file made a device",
            header.clone(),
            vec![inode(at(&["f"]), CHARDEV, b"")],
            "type",
        ),
        (
            "a directory made a file",
            header.clone(),
            vec![inode(at(&["d"]), FILE, b"")],
            "type",
        ),
        (
            "a symlink made a file",
            header.clone(),
            vec![inode(at(&["l"]), FILE, b"")],
            "type",
        ),
        (
            "a symlink's target changed",
            header.clone(),
            vec![inode(at(&["l"]), SYMLINK, b"elsewhere")],
            "symlink's target",
        ),
        (
            "a symlink target on a file",
            header.clone(),
            vec![inode(at(&["f"]), FILE, b"t")],
            "not a symlink",
        ),
        (
            "a fifo made a device",
            header.clone(),
            vec![inode(at(&["d", "p"]), CHARDEV, b"")],
            "type",
        ),
        (
            "a device number changed",
            header.clone(),
            vec![Record::Inode(device)],
            "device number",
        ),
    ];
    for (what, header, records, reason) in cases {
        let disk = MemDisk::from_bytes(4096, image.clone());
        let dst = mount(&disk, &c);
        pollster::block_on(async {
            let before = observed(&dst).await;
            let err = dst.receive(&reseal(&header, &records)).await.unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(
                    err,
                    ReceiveError::Inconsistent(_) | ReceiveError::BadName(_)
                ),
                "{what}: {err:?}"
            );
            assert!(
                text.contains(reason) && text.contains("nothing applied"),
                "{what}: {text}"
            );
            unchanged(&dst, &before, what).await;
            // Nothing to roll back: the live tree is still the base.
            let back = dst.receive_rollback().await;
            assert_eq!(back, Ok(Some("c".to_string())), "{what}");
            dst.receive(&ce)
                .await
                .unwrap_or_else(|e| panic!("{what}: the valid stream after it: {e}"));
            assert_same(&src, &dst, "e").await;
            let back = dst.receive_rollback().await;
            assert_eq!(back, Ok(Some("e".to_string())), "{what}");
            dst.unmount().await.unwrap();
        });
        check(&disk);
    }
}

/// Forged full streams into an empty filesystem: refused, nothing changed, and the
/// valid full stream received after each.
#[test]
fn forged_full_streams_are_refused_before_anything_changes() {
    let c = clock();
    let src_disk = formatted(4096, 1);
    let src = mount(&src_disk, &c);
    let [full, ..] = pollster::block_on(forge_source(&src));
    let (header, valid) = decode(&full).unwrap();
    let (new, new2) = (InodeRef::New(900), InodeRef::New(901));
    let root = InodeRef::root;
    let mut bad_name = header.clone();
    bad_name.snapshot.name = ".hidden".into();
    let with = |extra: Vec<Record>| -> Vec<Record> {
        // The valid records, then forged links (links come last).
        valid.iter().cloned().chain(extra).collect()
    };
    let cases: Vec<(&str, Header, Vec<Record>, &str)> = vec![
        (
            "link into a new file",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b""),
                inode(new2.clone(), FILE, b""),
                link(root(), "a", new.clone()),
                link(new.clone(), "x", new2.clone()),
            ],
            "not a directory",
        ),
        (
            "two new directories in each other",
            header.clone(),
            vec![
                inode(new.clone(), DIR, b""),
                inode(new2.clone(), DIR, b""),
                link(new.clone(), "m", new2.clone()),
                link(new2.clone(), "n", new.clone()),
            ],
            "under itself",
        ),
        (
            ".snapshots as a name",
            header.clone(),
            with(vec![link(
                root(),
                ".snapshots",
                InodeRef::New(valid_new(&valid)),
            )]),
            "snapshots",
        ),
        (
            "a second link to the same name",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b""),
                inode(new2.clone(), FILE, b""),
                link(root(), "a", new.clone()),
                link(root(), "a", new2.clone()),
            ],
            "where one is",
        ),
        (
            "an inode described, never linked",
            header.clone(),
            vec![inode(new.clone(), FILE, b"")],
            "without a name",
        ),
        (
            "a new directory linked twice",
            header.clone(),
            vec![
                inode(new.clone(), DIR, b""),
                link(root(), "a", new.clone()),
                link(root(), "b", new.clone()),
            ],
            "second name",
        ),
        (
            "an entry removed from the empty root",
            header.clone(),
            vec![unlink(root(), "x")],
            "not there",
        ),
        (
            "the root made a file",
            header.clone(),
            vec![inode(root(), FILE, b"")],
            "type",
        ),
        (
            "the root made a symlink",
            header.clone(),
            vec![inode(root(), SYMLINK, b"x")],
            "type",
        ),
        (
            "a symlink target on a new file",
            header.clone(),
            vec![
                inode(new.clone(), FILE, b"t"),
                link(root(), "a", new.clone()),
            ],
            "not a symlink",
        ),
        (
            "a bad snapshot name",
            bad_name,
            valid.clone(),
            "not one a snapshot may have",
        ),
    ];
    for (what, header, records, reason) in cases {
        let disk = formatted(4096, 2);
        let dst = mount(&disk, &c);
        pollster::block_on(async {
            let before = observed(&dst).await;
            let err = dst.receive(&reseal(&header, &records)).await.unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(reason) && text.contains("nothing applied"),
                "{what}: {text}"
            );
            unchanged(&dst, &before, what).await;
            // Nothing received and nothing half way: nothing to roll back.
            let back = dst.receive_rollback().await;
            assert!(
                matches!(back, Err(ReceiveError::NothingToRollBack)),
                "{what}: {back:?}"
            );
            dst.receive(&full)
                .await
                .unwrap_or_else(|e| panic!("{what}: the valid stream after it: {e}"));
            assert_same(&src, &dst, "a").await;
            let back = dst.receive_rollback().await;
            assert_eq!(back, Ok(Some("a".to_string())), "{what}");
            dst.unmount().await.unwrap();
        });
        check(&disk);
    }
}

/// The sender's number of some new inode of a full stream.
fn valid_new(records: &[Record]) -> u64 {
    records
        .iter()
        .find_map(|r| match r {
            Record::Inode(InodeState {
                ino: InodeRef::New(n),
                ..
            }) => Some(*n),
            _ => None,
        })
        .unwrap()
}

/// Entries named as a staging directory at the root are ordinary names of the sent
/// tree: received as they are (the staging directory takes a name the stream leaves
/// free), in full and incrementally.
#[test]
fn a_stream_may_name_an_entry_as_the_staging_directory() {
    let c = clock();
    let (src_disk, dst_disk) = (formatted(4096, 1), formatted(4096, 2));
    let (src, dst) = (mount(&src_disk, &c), mount(&dst_disk, &c));
    pollster::block_on(async {
        let f = src
            .create(ROOT_INO, b".ninefold-receive", 0o644, OWNER)
            .await
            .unwrap();
        src.write(f.ino, 0, b"mine").await.unwrap();
        src.mkdir(ROOT_INO, b".ninefold-receive.1", 0o755, OWNER)
            .await
            .unwrap();
        src.snapshot_create("a").await.unwrap();
        src.mkdir(ROOT_INO, b".ninefold-receive.2", 0o755, OWNER)
            .await
            .unwrap();
        src.snapshot_create("b").await.unwrap();
        dst.receive(&send(&src, "a", None).await.0).await.unwrap();
        assert_same(&src, &dst, "a").await;
        dst.receive(&send(&src, "b", Some("a")).await.0)
            .await
            .unwrap();
        assert_same(&src, &dst, "b").await;
        dst.unmount().await.unwrap();
    });
    check(&dst_disk);
}

/// A stream source that gives one stream in the checking pass and another when it is
/// applied (as a client writing `receive` twice may).
struct TwoPasses<'a> {
    passes: [&'a [u8]; 2],
    pass: usize,
    at: usize,
}

impl<'a> TwoPasses<'a> {
    fn new(first: &'a [u8], second: &'a [u8]) -> TwoPasses<'a> {
        TwoPasses {
            passes: [first, second],
            pass: 0,
            at: 0,
        }
    }
}

impl StreamSource for TwoPasses<'_> {
    async fn rewind(&mut self) -> Result<(), vfs::Errno> {
        self.pass += 1;
        self.at = 0;
        Ok(())
    }

    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, vfs::Errno> {
        let bytes = self.passes[(self.pass - 1).min(1)];
        let n = buf.len().min(bytes.len() - self.at).min(1000);
        buf[..n].copy_from_slice(&bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// What the check cannot see fails while applying: a second pass other than the
/// first. What was applied is rolled back, incremental or full, and the valid stream is
/// received after it.
#[test]
fn a_failure_while_applying_is_rolled_back() {
    let c = clock();
    let src_disk = formatted(4096, 1);
    let src = mount(&src_disk, &c);
    let [full, ab, bc, ce] = pollster::block_on(forge_source(&src));
    pollster::block_on(async {
        // Incremental: the valid records applied, then a link over an entry.
        let dst_disk = formatted(4096, 2);
        let dst = mount(&dst_disk, &c);
        for s in [&full, &ab, &bc] {
            dst.receive(s).await.unwrap();
        }
        let (header, mut records) = decode(&ce).unwrap();
        records.push(link(InodeRef::root(), "f", at(&["d", "p"])));
        let forged = reseal(&header, &records);
        let before = observed(&dst).await;
        let err = dst
            .receive_from(&mut TwoPasses::new(&ce, &forged))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ReceiveError::RolledBack(e) if matches!(**e, ReceiveError::Inconsistent(_))),
            "{err:?}"
        );
        assert!(err.to_string().contains("rolled back"), "{err}");
        unchanged(&dst, &before, "incremental").await;
        dst.receive(&ce).await.unwrap();
        assert_same(&src, &dst, "e").await;
        dst.unmount().await.unwrap();
        check(&dst_disk);

        // Full: every valid record applied, then a cycle.
        let dst_disk = formatted(4096, 3);
        let dst = mount(&dst_disk, &c);
        let (header, mut records) = decode(&full).unwrap();
        records.push(link(at(&[]), "self", at(&[])));
        let forged = reseal(&header, &records);
        let before = observed(&dst).await;
        let err = dst
            .receive_from(&mut TwoPasses::new(&full, &forged))
            .await
            .unwrap_err();
        assert!(matches!(err, ReceiveError::RolledBack(_)), "{err:?}");
        unchanged(&dst, &before, "full").await;
        dst.receive(&full).await.unwrap();
        assert_same(&src, &dst, "a").await;
        // A second pass cut short is rolled back too.
        let before = observed(&dst).await;
        let err = dst
            .receive_from(&mut TwoPasses::new(&ab, &ab[..ab.len() / 2]))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ReceiveError::RolledBack(e) if matches!(**e, ReceiveError::Stream(_))),
            "{err:?}"
        );
        unchanged(&dst, &before, "truncated second pass").await;
        dst.receive(&ab).await.unwrap();
        assert_same(&src, &dst, "b").await;
        dst.unmount().await.unwrap();
        check(&dst_disk);
    });
}

/// A target too small for the stream: `ENOSPC` half way, rolled back (full and
/// incremental), and a stream that fits received after it.
#[test]
fn a_target_that_fills_up_is_rolled_back() {
    let c = clock();
    let src_disk = formatted(16 * 1024, 1);
    let src = mount(&src_disk, &c);
    let streams = pollster::block_on(async {
        let f = src.create(ROOT_INO, b"small", 0o644, OWNER).await.unwrap();
        src.write(f.ino, 0, &[1; 10_000]).await.unwrap();
        src.snapshot_create("small").await.unwrap();
        let g = src.create(ROOT_INO, b"big", 0o644, OWNER).await.unwrap();
        for i in 0..24u64 {
            src.write(g.ino, i << 20, &vec![i as u8 + 1; 1 << 20])
                .await
                .unwrap();
        }
        src.snapshot_create("big").await.unwrap();
        src.unlink(ROOT_INO, b"big").await.unwrap();
        src.write(f.ino, 0, &[2; 5000]).await.unwrap();
        src.snapshot_create("fits").await.unwrap();
        [
            send(&src, "big", None).await.0,
            send(&src, "small", None).await.0,
            send(&src, "big", Some("small")).await.0,
            send(&src, "fits", Some("small")).await.0,
        ]
    });
    let [big_full, small_full, big_incr, fits_incr] = streams;
    pollster::block_on(async {
        let dst_disk = formatted(4096, 2);
        let dst = mount(&dst_disk, &c);
        let before = observed(&dst).await;
        let err = dst.receive(&big_full).await.unwrap_err();
        assert!(
            matches!(&err, ReceiveError::RolledBack(e) if **e == ReceiveError::Fs(vfs::Errno::ENOSPC)),
            "{err:?}"
        );
        unchanged(&dst, &before, "full").await;
        dst.receive(&small_full).await.unwrap();
        assert_same(&src, &dst, "small").await;
        let before = observed(&dst).await;
        let err = dst.receive(&big_incr).await.unwrap_err();
        assert!(
            matches!(&err, ReceiveError::RolledBack(e) if **e == ReceiveError::Fs(vfs::Errno::ENOSPC)),
            "{err:?}"
        );
        unchanged(&dst, &before, "incremental").await;
        dst.receive(&fits_incr).await.unwrap();
        assert_same(&src, &dst, "fits").await;
        dst.unmount().await.unwrap();
        check(&dst_disk);
    });
}

/// A full receive a crash left half way (its staging directory at the root, some of the
/// tree applied): the valid full stream is refused until a rollback empties the live
/// tree; with nothing received and nothing half way, a rollback has nothing to do.
#[test]
fn a_full_receive_left_half_way_is_undone_by_a_rollback() {
    let c = clock();
    let (src_disk, dst_disk) = (formatted(4096, 1), formatted(4096, 2));
    let (src, dst) = (mount(&src_disk, &c), mount(&dst_disk, &c));
    pollster::block_on(async {
        let (full, _) = sample_streams(&src).await;
        assert_eq!(
            dst.receive_rollback().await,
            Err(ReceiveError::NothingToRollBack)
        );
        // What a crash after the first records leaves.
        let staging = dst
            .mkdir(ROOT_INO, b".ninefold-receive", 0o700, OWNER)
            .await
            .unwrap();
        let f = dst.create(staging.ino, b"1", 0o644, OWNER).await.unwrap();
        dst.write(f.ino, 0, b"half").await.unwrap();
        dst.mkdir(ROOT_INO, b"d", 0o755, OWNER).await.unwrap();
        assert_eq!(dst.receive(&full).await, Err(ReceiveError::NotEmpty));
        assert_eq!(dst.receive_rollback().await, Ok(None));
        assert!(dst.readdir(ROOT_INO, 2, 8).await.unwrap().is_empty());
        dst.receive(&full).await.unwrap();
        assert_same(&src, &dst, "a").await;
        dst.unmount().await.unwrap();
    });
    check(&dst_disk);
}
