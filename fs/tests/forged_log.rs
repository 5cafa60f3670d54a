//! Forged log commits (issue 40, F3): commits sealed exactly as a writer seals them,
//! whose records ask for what no live operation does. The mount refuses each one (a
//! counted corruption; the filesystem read-only as the commits before it left it, the
//! log kept on the disk) and fsck reports it; a forged commit a live operation could
//! have written is replayed, and fsck calls it clean.

use block::MemDisk;
use fsck::{fsck, FsckOptions, Report};
use ninefs::format::items::{FileExtent, InodeItem};
use ninefs::format::layout::Layout;
use ninefs::format::log::{encode_commit, rec, LogBlockHeader};
use ninefs::format::Superblock;
use ninefs::util::crc::crc32c;
use ninefs::volume::{format, CheckpointCause, FormatOptions, MountOptions, NineFs};
use pollster::block_on;
use testkit::testing::ManualClock;
use vfs::{mode, Errno, FileSystem, FileType, Ino, Owner, ROOT_INO};

const OWNER: Owner = Owner { uid: 1, gid: 1 };
const BLOCK: usize = 4096;
/// A readdir index no entry of the base image has yet.
const INDEX: u64 = 1000;

/// A checkpointed filesystem, crashed right after its checkpoint (not clean, an empty
/// log from `sb.log_tail` on): `/d/e` (directories) and `/f` (a file of 3 blocks).
struct Base {
    image: Vec<u8>,
    sb: Superblock,
    d: Ino,
    e: Ino,
    f: Ino,
}

fn mount(disk: MemDisk) -> NineFs<MemDisk> {
    block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(ManualClock::default()),
    ))
    .expect("mounts")
}

fn base() -> Base {
    let disk = MemDisk::new(BLOCK as u32, 4096);
    block_on(format(&disk, &FormatOptions::default())).unwrap();
    let fs = mount(disk);
    let (d, e, f) = block_on(async {
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, OWNER).await.unwrap().ino;
        let e = fs.mkdir(d, b"e", 0o755, OWNER).await.unwrap().ino;
        let f = fs.create(ROOT_INO, b"f", 0o644, OWNER).await.unwrap().ino;
        fs.write(f, 0, &[0x5a; 3 * BLOCK]).await.unwrap();
        fs.checkpoint(CheckpointCause::Sync).await.unwrap();
        (d, e, f)
    });
    let sb = fs.superblock();
    let image = fs.device().snapshot();
    drop(fs);
    Base { image, sb, d, e, f }
}

/// A record: kind, length, body.
fn record(kind: u8, body: Vec<u8>) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(body);
    out
}

/// `(index, child, type, name)` of `dir` as a `DENTRIES` record (nothing removed).
fn dentries(dir: Ino, entries: &[(u64, Ino, FileType, &[u8])]) -> Vec<u8> {
    let mut b = dir.to_le_bytes().to_vec();
    b.extend((entries.len() as u32).to_le_bytes());
    for (index, ino, ft, name) in entries {
        b.extend(index.to_le_bytes());
        b.extend(ino.to_le_bytes());
        b.push(ft.dirent_type());
        b.push(name.len() as u8);
        b.extend(*name);
    }
    b.extend(0u32.to_le_bytes());
    record(rec::DENTRIES, b)
}

/// Every name of directory `ino`: `(parent, index, name)`, as a `NAMES` record.
fn dir_names(ino: Ino, names: &[(Ino, u64, &[u8])]) -> Vec<u8> {
    let mut b = ino.to_le_bytes().to_vec();
    b.extend((names.len() as u32).to_le_bytes());
    for (parent, index, name) in names {
        b.extend(parent.to_le_bytes());
        b.extend(index.to_le_bytes());
        b.push(FileType::Directory.dirent_type());
        b.push(name.len() as u8);
        b.extend(*name);
    }
    record(rec::NAMES, b)
}

/// An `INODE` record.
fn inode(ino: Ino, item: &InodeItem) -> Vec<u8> {
    let mut b = ino.to_le_bytes().to_vec();
    b.extend(item.encode());
    record(rec::INODE, b)
}

/// The image of `b` with `commits` (each a list of records) in its log from the
/// checkpoint's tail on, sealed as the log writer seals them.
fn forge(b: &Base, commits: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let mut image = b.image.clone();
    let l = b.sb.layout;
    let mut seq = b.sb.log_tail;
    for records in commits {
        let mut out = Vec::new();
        let n = encode_commit(records, seq, b.sb.log_epoch, b.sb.checkpoint_seq, &mut out);
        for (i, block) in out.chunks(BLOCK).enumerate() {
            let at = (l.log_start + (seq + i as u64) % l.log_blocks) as usize * BLOCK;
            image[at..at + BLOCK].copy_from_slice(block);
        }
        seq += n;
    }
    image
}

fn disk(image: &[u8]) -> MemDisk {
    MemDisk::from_bytes(BLOCK as u32, image.to_vec())
}

fn check(image: &[u8]) -> Report {
    block_on(fsck(&disk(image), &FsckOptions::default())).expect("fsck runs")
}

/// Mounts the forged `image` and checks the refusal: the rule broken mentions `rule`,
/// the `applied` commits before it are replayed, the refusal is counted, and the
/// filesystem is read-only. Returns it, to look at what it serves.
fn refused(image: &[u8], rule: &str, applied: u64) -> NineFs<MemDisk> {
    let fs = mount(disk(image));
    let r = fs
        .refused_log_commit()
        .expect("the forged commit is refused");
    assert!(r.why.rule.contains(rule), "{r}");
    assert_eq!(r.applied, applied, "{r}");
    let s = fs.stats();
    assert_eq!(s.log.refused_commits, 1);
    assert_eq!(s.log.replayed_commits, applied);
    assert_eq!(s.corruptions, 1);
    assert_eq!(
        block_on(fs.mkdir(ROOT_INO, b"new", 0o755, OWNER)).unwrap_err(),
        Errno::EROFS
    );
    fs
}

/// fsck on the forged `image` reports the refused commit, naming `rule`.
fn fsck_reports(image: &[u8], rule: &str) {
    let report = check(image);
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.contains("fsync log") && e.contains("refused") && e.contains(rule)),
        "{:#?}",
        report
    );
}

/// The forged `image`: refused by the mount (rule `rule`, nothing before it), reported
/// by fsck, and the same again at the next mount (the log stays).
fn refused_everywhere(image: &[u8], rule: &str) -> NineFs<MemDisk> {
    fsck_reports(image, rule);
    let fs = refused(image, rule, 0);
    let again = disk(&fs.device().snapshot());
    drop(fs);
    let again = mount(again);
    assert!(again.refused_log_commit().is_some(), "the log is kept");
    drop(again);
    refused(image, rule, 0)
}

#[test]
fn a_forged_commit_a_live_link_could_write_is_replayed() {
    let b = base();
    let image = forge(
        &b,
        &[vec![dentries(
            ROOT_INO,
            &[(INDEX, b.f, FileType::Regular, b"g")],
        )]],
    );
    let report = check(&image);
    assert!(report.is_clean(), "{:#?}", report.errors);
    let fs = mount(disk(&image));
    assert_eq!(fs.refused_log_commit(), None);
    assert_eq!(fs.stats().log.replayed_commits, 1);
    let g = block_on(fs.lookup(ROOT_INO, b"g")).unwrap();
    assert_eq!(g.ino, b.f);
    assert_eq!(g.nlink, 2);
    block_on(fs.mkdir(ROOT_INO, b"new", 0o755, OWNER)).unwrap();
    let disk = block_on(fs.unmount()).unwrap();
    let report = block_on(fsck(&disk, &FsckOptions::default())).unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
}

#[test]
fn a_name_for_the_root_is_refused() {
    let b = base();
    let image = forge(
        &b,
        &[vec![dentries(
            ROOT_INO,
            &[(INDEX, ROOT_INO, FileType::Directory, b"loop")],
        )]],
    );
    let fs = refused_everywhere(&image, "root");
    assert_eq!(
        block_on(fs.lookup(ROOT_INO, b"loop")).unwrap_err(),
        Errno::ENOENT
    );
}

#[test]
fn a_directory_cycle_is_refused() {
    // `d` moved into its own child `e`: `d/e/d/e/...`, cut off from the root.
    let b = base();
    let image = forge(&b, &[vec![dir_names(b.d, &[(b.e, INDEX, b"d")])]]);
    let fs = refused_everywhere(&image, "cycle");
    let d = block_on(fs.lookup(ROOT_INO, b"d")).unwrap();
    assert_eq!(d.ino, b.d);
    assert_eq!(block_on(fs.lookup(b.e, b"d")).unwrap_err(), Errno::ENOENT);
}

#[test]
fn a_second_name_for_a_directory_is_refused() {
    let b = base();
    let image = forge(
        &b,
        &[vec![dentries(
            ROOT_INO,
            &[(INDEX, b.e, FileType::Directory, b"again")],
        )]],
    );
    let fs = refused_everywhere(&image, "more than one name");
    assert_eq!(
        block_on(fs.lookup(ROOT_INO, b"again")).unwrap_err(),
        Errno::ENOENT
    );
    drop(fs);
    // The same as the names of `e`: its own and one more.
    let image = forge(
        &b,
        &[vec![dir_names(
            b.e,
            &[(b.d, INDEX, b"e"), (ROOT_INO, INDEX, b"again")],
        )]],
    );
    refused_everywhere(&image, "more than one name");
}

#[test]
fn a_second_dotdot_is_refused() {
    let b = base();
    let image = forge(
        &b,
        &[vec![dentries(
            b.e,
            &[(INDEX, ROOT_INO, FileType::Directory, b"..")],
        )]],
    );
    refused_everywhere(&image, "name");
    let image = forge(
        &b,
        &[vec![dentries(
            ROOT_INO,
            &[(INDEX, b.e, FileType::Directory, b"..")],
        )]],
    );
    refused_everywhere(&image, "name");
}

#[test]
fn names_no_live_operation_accepts_are_refused() {
    let b = base();
    for name in [&b"a/b"[..], b".", b"a\0b", b".snapshots"] {
        let image = forge(
            &b,
            &[vec![dentries(
                ROOT_INO,
                &[(INDEX, b.f, FileType::Regular, name)],
            )]],
        );
        let fs = refused_everywhere(&image, "name");
        assert_eq!(
            block_on(fs.lookup(ROOT_INO, b"a")).unwrap_err(),
            Errno::ENOENT
        );
    }
}

#[test]
fn the_root_turned_into_a_regular_file_is_refused() {
    let b = base();
    let item = InodeItem {
        mode: mode::S_IFREG | 0o644,
        nlink: 1,
        generation: 1,
        ..InodeItem::default()
    };
    let image = forge(&b, &[vec![inode(ROOT_INO, &item)]]);
    let fs = refused_everywhere(&image, "type");
    let root = block_on(fs.getattr(ROOT_INO)).unwrap();
    assert_eq!(FileType::from_mode(root.mode), Some(FileType::Directory));
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"d")).unwrap().ino, b.d);
}

#[test]
fn an_entry_of_the_wrong_type_or_outside_the_live_inodes_is_refused() {
    let b = base();
    let image = forge(
        &b,
        &[vec![dentries(
            ROOT_INO,
            &[(INDEX, b.f, FileType::Directory, b"h")],
        )]],
    );
    refused_everywhere(&image, "type");
    let image = forge(
        &b,
        &[vec![dentries(
            ROOT_INO,
            &[(INDEX, 1 << 50, FileType::Regular, b"h")],
        )]],
    );
    refused_everywhere(&image, "outside the live");
}

#[test]
fn a_new_extent_over_used_blocks_is_refused() {
    let b = base();
    // A new one-block extent inside `/f`'s data, with the right checksum.
    let used = check(&b.image)
        .data_blocks
        .iter()
        .find(|&&(_, n)| n >= 2)
        .map(|&(first, _)| first + 1)
        .expect("f's data");
    let at = used as usize * BLOCK;
    let sum = crc32c(&b.image[at..at + BLOCK]);
    let fe = FileExtent {
        disk_block: used,
        disk_blocks: 1,
        offset_blocks: 0,
        num_blocks: 1,
    };
    let mut body = b.f.to_le_bytes().to_vec();
    for v in [3u64, 4] {
        body.extend(v.to_le_bytes());
    }
    body.extend(1u32.to_le_bytes());
    body.extend(3u64.to_le_bytes());
    body.extend(fe.encode());
    let mut csum = used.to_le_bytes().to_vec();
    csum.extend(1u32.to_le_bytes());
    csum.extend(sum.to_le_bytes());
    let image = forge(
        &b,
        &[vec![record(rec::CSUM, csum), record(rec::EXTENTS, body)]],
    );
    let fs = refused_everywhere(&image, "blocks the checkpoint uses");
    assert_eq!(block_on(fs.getattr(b.f)).unwrap().size, 3 * BLOCK as u64);
}

#[test]
fn the_commits_before_a_refused_one_are_replayed() {
    let b = base();
    let image = forge(
        &b,
        &[
            vec![dentries(ROOT_INO, &[(INDEX, b.f, FileType::Regular, b"g")])],
            vec![dentries(
                ROOT_INO,
                &[(INDEX + 1, ROOT_INO, FileType::Directory, b"loop")],
            )],
        ],
    );
    fsck_reports(&image, "root");
    let fs = refused(&image, "root", 1);
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"g")).unwrap().ino, b.f);
    assert_eq!(
        block_on(fs.lookup(ROOT_INO, b"loop")).unwrap_err(),
        Errno::ENOENT
    );
}

/// Found by the `log_replay` fuzz target (fuzz/regressions/log_replay/): a logged inode
/// item of a regular file whose `bytes` is not what its extents hold was replayed as
/// it said (replayed extents do not adjust it), so the mount served a wrong block
/// count and the next checkpoint wrote an inode fsck reports. Replay sets a file's
/// bytes from its extents, as every live change keeps them.
#[test]
fn a_logged_inode_with_a_forged_byte_count_gets_its_extents_bytes() {
    let b = base();
    for forged in [0, 5, 14_627_691_589_699_379_200, u64::MAX] {
        let item = InodeItem {
            mode: mode::S_IFREG | 0o644,
            nlink: 1,
            generation: 1,
            size: 3 * BLOCK as u64,
            bytes: forged,
            ..InodeItem::default()
        };
        let image = forge(&b, &[vec![inode(b.f, &item)]]);
        let report = check(&image);
        assert!(report.is_clean(), "{forged}: {:#?}", report.errors);
        let fs = mount(disk(&image));
        assert_eq!(fs.refused_log_commit(), None, "{forged}");
        let f = block_on(fs.getattr(b.f)).unwrap();
        assert_eq!(f.blocks, 3 * BLOCK as u64 / 512, "{forged}");
        block_on(fs.write(b.f, 3 * BLOCK as u64, &[1; BLOCK])).unwrap();
        let disk = block_on(fs.unmount()).unwrap();
        let report = block_on(fsck(&disk, &FsckOptions::default())).unwrap();
        assert!(report.is_clean(), "{forged}: {:#?}", report.errors);
    }
}

/// Found by the `log_replay` fuzz target (fuzz/regressions/log_replay/): a logged
/// symlink item whose size is not its target's length was replayed as logged, so
/// `readlink` failed (`EIO`, since it no longer trusts the size for its buffer) on an
/// image fsck called clean. Replay sets a symlink's size from its target.
#[test]
fn a_logged_symlink_with_a_forged_size_gets_its_targets_length() {
    let fresh = MemDisk::new(BLOCK as u32, 4096);
    block_on(format(&fresh, &FormatOptions::default())).unwrap();
    let fs = mount(fresh);
    let s = block_on(async {
        let s = fs
            .symlink(ROOT_INO, b"s", b"target", OWNER)
            .await
            .unwrap()
            .ino;
        fs.checkpoint(CheckpointCause::Sync).await.unwrap();
        s
    });
    let sb = fs.superblock();
    let image = fs.device().snapshot();
    drop(fs);
    let b = Base {
        image,
        sb,
        d: ROOT_INO,
        e: ROOT_INO,
        f: s,
    };
    for forged in [0, 5, 1 << 60] {
        let item = InodeItem {
            mode: mode::S_IFLNK | 0o777,
            nlink: 1,
            generation: 1,
            size: forged,
            ..InodeItem::default()
        };
        let image = forge(&b, &[vec![inode(s, &item)]]);
        let report = check(&image);
        assert!(report.is_clean(), "{forged}: {:#?}", report.errors);
        let fs = mount(disk(&image));
        assert_eq!(fs.refused_log_commit(), None, "{forged}");
        assert_eq!(block_on(fs.readlink(s)).unwrap(), b"target", "{forged}");
        assert_eq!(block_on(fs.getattr(s)).unwrap().size, 6, "{forged}");
        let after = block_on(fs.unmount()).unwrap();
        let report = block_on(fsck(&after, &FsckOptions::default())).unwrap();
        assert!(report.is_clean(), "{forged}: {:#?}", report.errors);
    }
}

/// [`base`] mounted, then two files written and fsynced one after the other, and the
/// disk taken as it is (a crash): `/n` (3 blocks of `0x77`, in the first commit: its
/// data was on the disk before the second commit was written) and `/m` (a block of
/// `0x66`, in the last commit).
struct Crashed {
    image: Vec<u8>,
    n: Ino,
    /// First block of `/n`'s data.
    n_data: u64,
    m: Ino,
    /// `/m`'s data block.
    m_data: u64,
    /// Where the log is.
    layout: Layout,
}

fn crashed() -> Crashed {
    let b = base();
    let fs = mount(disk(&b.image));
    let (n, m) = block_on(async {
        let n = fs.create(ROOT_INO, b"n", 0o644, OWNER).await.unwrap().ino;
        fs.write(n, 0, &[0x77; 3 * BLOCK]).await.unwrap();
        fs.fsync(n, false).await.unwrap();
        let m = fs.create(ROOT_INO, b"m", 0o644, OWNER).await.unwrap().ino;
        fs.write(m, 0, &[0x66; BLOCK]).await.unwrap();
        fs.fsync(m, false).await.unwrap();
        (n, m)
    });
    let image = fs.device().snapshot();
    drop(fs);
    let find = |byte: u8| {
        image
            .chunks(BLOCK)
            .position(|c| c.iter().all(|&x| x == byte))
            .expect("the data is on the disk") as u64
    };
    let (n_data, m_data) = (find(0x77), find(0x66));
    let report = check(&image);
    assert!(report.is_clean(), "{:#?}", report.errors);
    assert!(
        report.warnings.iter().any(|w| w.contains("2 commits")),
        "{:#?}",
        report.warnings
    );
    Crashed {
        image,
        n,
        n_data,
        m,
        m_data,
        layout: b.sb.layout,
    }
}

/// fsck on `image` reports data block `block` of an extent the log adds.
fn fsck_reports_logged_data(image: &[u8], block: u64) {
    let report = check(image);
    let want = format!("data block {block} ");
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.contains("fsync log") && e.contains(&want) && e.contains("checksum")),
        "{:#?}",
        report
    );
}

/// Found by the `image` fuzz target (fuzz/regressions/image/): a byte of a file's data
/// changed on the disk after the fsync that logged it, in a commit before the last.
/// Replay verifies only the last commit's data (the earlier ones' was on the disk
/// before the next commit was written), so the mount serves the file and reading the
/// block gives `EIO`, as for damaged data of the checkpoint; but fsck checked the data
/// of the checkpoint's extents only, not of those the log adds, and called the image
/// clean. fsck checks them now, against the checksums the log gave them.
#[test]
fn damaged_data_of_a_replayed_commit_is_reported_by_fsck() {
    let c = crashed();
    let mut image = c.image.clone();
    image[(c.n_data as usize + 1) * BLOCK + 1108] ^= 0x23;
    fsck_reports_logged_data(&image, c.n_data + 1);
    // What fsck reports is what the mount cannot serve.
    let fs = mount(disk(&image));
    assert_eq!(fs.refused_log_commit(), None);
    assert_eq!(fs.stats().log.replayed_commits, 2);
    let mut buf = vec![0; 3 * BLOCK];
    assert_eq!(block_on(fs.read(c.n, 0, &mut buf)).unwrap_err(), Errno::EIO);
    assert_eq!(block_on(fs.read(c.m, 0, &mut buf)).unwrap(), BLOCK);
    drop(fs);
    // Without `check_data`, fsck reads no data, the log's as little as the trees'.
    let quick = block_on(fsck(&disk(&image), &FsckOptions { check_data: false })).unwrap();
    assert!(quick.is_clean(), "{:#?}", quick.errors);
    // The last commit's data is another matter: it may never have reached the disk
    // (its FLUSH may not have completed), so replay drops the commit, and fsck, which
    // replays the same way, has nothing to report.
    let mut image = c.image.clone();
    image[c.m_data as usize * BLOCK] ^= 1;
    let report = check(&image);
    assert!(report.is_clean(), "{:#?}", report.errors);
    let fs = mount(disk(&image));
    assert_eq!(fs.stats().log.dropped_commits, 1);
    assert_eq!(block_on(fs.read(c.n, 0, &mut buf)).unwrap(), 3 * BLOCK);
    assert_eq!(
        block_on(fs.lookup(ROOT_INO, b"m")).unwrap_err(),
        Errno::ENOENT
    );
}

/// Found by the `log_replay` fuzz target (fuzz/regressions/log_replay/): a forged
/// commit (resealed) whose `CSUM` record gives a block of a new extent a checksum its
/// data does not have, followed by another commit. The same as damaged data to the
/// mount (the block reads as `EIO`) and now to fsck.
#[test]
fn a_logged_checksum_the_data_does_not_have_is_reported_by_fsck() {
    let c = crashed();
    let mut image = c.image.clone();
    // The CSUM record of `/n`'s extent: its first block, 3 checksums, the first one.
    let sum = crc32c(&[0x77; BLOCK]);
    let mut pattern = c.n_data.to_le_bytes().to_vec();
    pattern.extend(3u32.to_le_bytes());
    pattern.extend(sum.to_le_bytes());
    let l = c.layout;
    let log = l.log_start as usize * BLOCK..(l.log_start + l.log_blocks) as usize * BLOCK;
    let at = log.start
        + image[log.clone()]
            .windows(pattern.len())
            .position(|w| w == pattern)
            .expect("the CSUM record is in the log");
    let first = at + 12;
    image[first..first + 4].copy_from_slice(&(sum ^ 0x5a5a).to_le_bytes());
    // Resealed, as a forger would.
    let block = at / BLOCK * BLOCK;
    let (h, _) = LogBlockHeader::decode_block(&c.image[block..block + BLOCK]).unwrap();
    h.frame_in_place(&mut image[block..block + BLOCK]);
    fsck_reports_logged_data(&image, c.n_data);
    let fs = mount(disk(&image));
    assert_eq!(fs.refused_log_commit(), None);
    let mut buf = vec![0; BLOCK];
    assert_eq!(block_on(fs.read(c.n, 0, &mut buf)).unwrap_err(), Errno::EIO);
    assert_eq!(
        block_on(fs.read(c.n, BLOCK as u64, &mut buf)).unwrap(),
        BLOCK
    );
}
