//! Forged images (issue 40): fields changed on purpose with every checksum resealed, as
//! a forger, a bad drive or a bug may leave them. Checksums cannot catch these; the
//! bounds and cross-checks must. Each test forges one finding's bytes and shows the
//! clean refusal (a mount error naming the field, `EIO` with a counted corruption) or
//! fsck's report — never an abort, a silent wrap, or a state fsck calls clean that the
//! mount serves wrong.

use std::collections::BTreeMap;

use block::MemDisk;
use fsck::{fsck, FsckError, FsckOptions, Report};
use ninefs::format::bset::{self, parse_node, NodeId, HEADER_LEN};
use ninefs::format::items::{
    encode_dir_entries, encode_inode_refs, DirEntryRec, DirIndexRec, InodeItem, InodeRefRec,
    SnapshotItem,
};
use ninefs::format::key::kind;
use ninefs::format::layout::SUPERBLOCK_BLOCKS;
use ninefs::format::superblock::{Root, Superblock, MAX_INO, MAX_SEQ, SEQ_HEADROOM};
use ninefs::format::{features, Corrupt, Key, TreeId, BLOCK_SIZE};
use ninefs::util::crc::crc32c;
use ninefs::util::hash::{domain, keyed_hash, name_ref_hash};
use ninefs::volume::{format, FormatOptions, MountError, MountOptions, NineFs, MAX_FILE_SIZE};
use testkit::testing::ManualClock;
use vfs::{Errno, FileSystem, FileType, Owner, Timespec, ROOT_INO};

const OWNER: Owner = Owner { uid: 1, gid: 2 };
const NODE_SIZE: u32 = 16 * 1024;
const DISK_BLOCKS: u64 = 4096;

fn clock() -> Box<ManualClock> {
    Box::new(ManualClock::new(Timespec {
        sec: 1_700_000_000,
        nsec: 5,
    }))
}

/// An image being forged.
struct Image(Vec<u8>);

impl Image {
    /// A small filesystem, cleanly unmounted: a directory `d` and a file `f` of 10,000
    /// bytes in the root. Its fs tree is one leaf.
    fn build() -> Image {
        let disk = MemDisk::new(4096, DISK_BLOCKS);
        let opts = FormatOptions {
            node_size: NODE_SIZE,
            uuid: [4; 16],
            secret: 0x5eed,
            now: vfs::Clock::now(&*clock()),
            ..FormatOptions::default()
        };
        pollster::block_on(format(&disk, &opts)).unwrap();
        let fs =
            pollster::block_on(NineFs::mount(&disk, MountOptions::default(), clock())).unwrap();
        pollster::block_on(async {
            fs.mkdir(ROOT_INO, b"d", 0o755, OWNER).await.unwrap();
            let f = fs.create(ROOT_INO, b"f", 0o644, OWNER).await.unwrap();
            fs.write(f.ino, 0, &[7u8; 10_000]).await.unwrap();
            fs.unmount().await.unwrap();
        });
        let image = Image(disk.snapshot());
        assert_eq!(image.superblock().root(TreeId::Fs).level, 0);
        image
    }

    fn block(&self, b: u64) -> &[u8] {
        &self.0[b as usize * BLOCK_SIZE..(b as usize + 1) * BLOCK_SIZE]
    }

    fn block_mut(&mut self, b: u64) -> &mut [u8] {
        &mut self.0[b as usize * BLOCK_SIZE..(b as usize + 1) * BLOCK_SIZE]
    }

    /// The current superblock (both copies are valid on a clean image).
    fn superblock(&self) -> Superblock {
        SUPERBLOCK_BLOCKS
            .iter()
            .map(|&b| Superblock::decode(self.block(b)).unwrap())
            .max_by_key(|sb| sb.generation)
            .unwrap()
    }

    /// Changes both superblock copies (each keeps its generation) and reseals them.
    fn forge_superblock(&mut self, f: impl Fn(&mut Superblock)) {
        for b in SUPERBLOCK_BLOCKS {
            let mut sb = Superblock::decode(self.block(b)).unwrap();
            f(&mut sb);
            self.block_mut(b).copy_from_slice(&sb.encode());
        }
    }

    /// The fs tree's items (its root is a leaf).
    fn fs_items(&self) -> BTreeMap<Key, Vec<u8>> {
        let ptr = self.superblock().root(TreeId::Fs).ptr;
        let id = NodeId {
            tree: TreeId::Fs,
            level: 0,
            nonce: ptr.nonce,
        };
        let start = ptr.addr as usize * BLOCK_SIZE;
        let buf = &self.0[start..start + ptr.blocks as usize * BLOCK_SIZE];
        let mut items = BTreeMap::new();
        for set in parse_node(buf, id, ptr.blocks).unwrap() {
            for e in set.entries {
                match e.val {
                    Some(v) => items.insert(e.key, v.to_vec()),
                    None => items.remove(&e.key),
                };
            }
        }
        items
    }

    /// Rewrites the fs tree's root leaf in place with the items `f` leaves, sealed as
    /// the filesystem seals them: one bset of the items, then empty bsets up to the
    /// whole node, so the pointer (in the superblock, and in any forged snapshot item)
    /// commits all of the node's blocks.
    fn forge_fs_items(&mut self, f: impl FnOnce(&mut BTreeMap<Key, Vec<u8>>)) {
        let mut items = self.fs_items();
        f(&mut items);
        let sb = self.superblock();
        let ptr = sb.root(TreeId::Fs).ptr;
        let id = NodeId {
            tree: TreeId::Fs,
            level: 0,
            nonce: ptr.nonce,
        };
        let seq = sb.checkpoint_seq;
        let mut node = bset::encode(id, seq, 0, items.iter().map(|(k, v)| (*k, Some(&v[..]))));
        let node_blocks = NODE_SIZE as usize / BLOCK_SIZE;
        while node.len() < NODE_SIZE as usize {
            let at = (node.len() / BLOCK_SIZE) as u32;
            node.extend(bset::encode(id, seq, at, []));
        }
        assert_eq!(
            node.len(),
            NODE_SIZE as usize,
            "the forged leaf fits its node"
        );
        let start = ptr.addr as usize * BLOCK_SIZE;
        self.0[start..start + node.len()].copy_from_slice(&node);
        self.forge_superblock(|sb| sb.roots[TreeId::Fs as usize].ptr.blocks = node_blocks as u32);
    }

    /// Adds a snapshot item `(0, SNAPSHOT, id)` named `name` keeping the live trees
    /// (as a snapshot of the last checkpoint would), and the feature bit.
    fn forge_snapshot(&mut self, id: u64, name: &[u8]) {
        self.forge_snapshots(&[(id, name)]);
    }

    /// [`Image::forge_snapshot`] of several at once.
    fn forge_snapshots(&mut self, snaps: &[(u64, &[u8])]) {
        self.forge_superblock(|sb| sb.incompat |= features::INCOMPAT_SNAPSHOTS);
        let node_blocks = NODE_SIZE / BLOCK_SIZE as u32;
        let sb = self.superblock();
        let root = |t: TreeId| sb.root(t);
        let mut fs_root = root(TreeId::Fs);
        fs_root.ptr.blocks = node_blocks; // what forge_fs_items commits
        let roots: [Root; 3] = [fs_root, root(TreeId::Extent), root(TreeId::Csum)];
        self.forge_fs_items(|items| {
            for &(id, name) in snaps {
                let item = SnapshotItem {
                    name: name.to_vec(),
                    created: Timespec { sec: 1, nsec: 0 },
                    seq: sb.checkpoint_seq,
                    inode_count: sb.inode_count,
                    roots,
                };
                items.insert(Key::new(0, kind::SNAPSHOT, id), item.encode());
            }
        });
    }

    /// The inode item of `ino`.
    fn inode(&self, ino: u64) -> InodeItem {
        InodeItem::decode(&self.fs_items()[&Key::new(ino, kind::INODE, 0)]).unwrap()
    }

    fn mount(&self) -> Result<NineFs<MemDisk>, MountError> {
        self.mount_with(MountOptions::default())
    }

    fn mount_with(&self, opts: MountOptions) -> Result<NineFs<MemDisk>, MountError> {
        let disk = MemDisk::from_bytes(4096, self.0.clone());
        pollster::block_on(NineFs::mount(disk, opts, clock()))
    }

    fn fsck(&self) -> Result<Report, FsckError> {
        let disk = MemDisk::from_bytes(4096, self.0.clone());
        pollster::block_on(fsck(&disk, &FsckOptions::default()))
    }

    /// fsck's report, which must list an error containing `what`.
    fn fsck_reports(&self, what: &str) -> Report {
        let report = self.fsck().expect("fsck runs");
        assert!(
            report.errors.iter().any(|e| e.contains(what)),
            "fsck does not report {what:?}: errors {:#?}, warnings {:#?}",
            report.errors,
            report.warnings
        );
        report
    }
}

fn lookup(fs: &NineFs<MemDisk>, name: &[u8]) -> Result<vfs::Attr, Errno> {
    pollster::block_on(fs.lookup(ROOT_INO, name))
}

#[test]
fn the_unforged_image_is_clean_and_mounts() {
    let image = Image::build();
    let report = image.fsck().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
    // Forging without changing anything keeps it so (the helpers themselves are sound).
    let mut same = Image(image.0.clone());
    same.forge_fs_items(|_| {});
    same.forge_superblock(|_| {});
    let report = same.fsck().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
    let fs = same.mount().unwrap();
    assert_eq!(lookup(&fs, b"f").unwrap().size, 10_000);
}

/// F1: a bset header claiming 2^32 - 1 keys (header checksum resealed) made every
/// reader allocate 160 GiB and abort. The count is bounded by the payload: the node is
/// corrupt, `EIO` and a counted corruption; fsck names it.
#[test]
fn f1_a_bset_claiming_more_keys_than_its_payload_holds_is_corruption() {
    let mut image = Image::build();
    let root = image.superblock().root(TreeId::Fs).ptr.addr;
    let header = image.block_mut(root);
    header[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32c(&header[8..HEADER_LEN]);
    header[4..8].copy_from_slice(&crc.to_le_bytes());

    image.fsck_reports("bad field key count");
    // The mount reads the root directory from the (only) leaf: refused, cleanly.
    assert_eq!(image.mount().err(), Some(MountError::Errno(Errno::EIO)));
}

/// A superblock sequence or counter, by name.
type Counter = fn(&mut Superblock) -> &mut u64;

/// Every sequence and counter of the superblock, in the order `Superblock::exhausted`
/// names them.
const COUNTERS: [(&str, Counter); 5] = [
    ("generation", |sb| &mut sb.generation),
    ("checkpoint_seq", |sb| &mut sb.checkpoint_seq),
    ("log_tail", |sb| &mut sb.log_tail),
    ("log_epoch", |sb| &mut sb.log_epoch),
    ("mount_count", |sb| &mut sb.mount_count),
];

/// F2: a sequence or counter at `u64::MAX` (both copies, resealed) mounted and wrapped
/// at the next write, losing the whole filesystem. Each is refused, naming the field.
#[test]
fn f2_sequences_and_counters_past_their_bound_are_refused() {
    let clean = Image::build();
    for (name, field) in COUNTERS {
        for value in [u64::MAX, MAX_SEQ] {
            let mut image = Image(clean.0.clone());
            image.forge_superblock(|sb| *field(sb) = value);
            let err = image
                .mount()
                .err()
                .unwrap_or_else(|| panic!("{name} {value} mounts"));
            assert!(
                err.to_string().contains(&format!("bad field {name}")),
                "{name} {value}: {err}"
            );
            let err = image
                .fsck()
                .err()
                .unwrap_or_else(|| panic!("fsck of {name} runs"));
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
    }
    // The log epoch is the generation of a superblock written before: never above it.
    let mut image = Image(clean.0.clone());
    image.forge_superblock(|sb| sb.log_epoch = sb.generation + 1);
    assert!(image.mount().is_err());
}

/// F2: a writable mount needs room to run: a sequence or counter with less than
/// `SEQ_HEADROOM` (2^32) left below the bound would take a checkpoint or the unmount's
/// superblock to it (the fuzz target `superblock` found `checkpoint_seq` at `MAX_SEQ -
/// 1`: fsck called it clean, the mount's replay checkpoint failed with `EIO`). The
/// mount refuses it, naming the field and writing nothing; fsck reports it; a
/// read-only mount serves the filesystem whole. With room left, it mounts and runs.
#[test]
fn f2_a_counter_without_room_to_run_is_refused_writable_and_reported_by_fsck() {
    let clean = Image::build();
    for (name, field) in COUNTERS {
        for value in [MAX_SEQ - 1, MAX_SEQ - SEQ_HEADROOM] {
            let mut image = Image(clean.0.clone());
            image.forge_superblock(|sb| {
                *field(sb) = value;
                // The log epoch is never above the generation (a superblock's own).
                sb.generation = sb.generation.max(sb.log_epoch);
            });
            let disk = MemDisk::from_bytes(4096, image.0.clone());
            let err = pollster::block_on(NineFs::mount(&disk, MountOptions::default(), clock()))
                .err()
                .unwrap_or_else(|| panic!("{name} at {value} mounts writable"));
            // A forged epoch takes the generation with it, which is named first.
            let named = if name == "log_epoch" {
                "generation"
            } else {
                name
            };
            assert!(
                err.to_string()
                    .contains(&format!("bad field {named}: at its bound")),
                "{name} {value}: {err}"
            );
            assert!(
                disk.snapshot() == image.0,
                "{name}: the refused mount wrote"
            );
            let report = image.fsck().unwrap();
            assert!(
                report
                    .errors
                    .iter()
                    .any(|e| e.contains("within 2^32 of its bound")),
                "{name} {value}: fsck says {:?}",
                report.errors
            );
            let fs = image
                .mount_with(MountOptions {
                    read_only: true,
                    ..MountOptions::default()
                })
                .unwrap();
            assert_eq!(lookup(&fs, b"f").unwrap().size, 10_000);
        }
    }
    // With room to run (a headroom's worth below it): the mount runs, checkpoints and
    // unmounts, and fsck calls it clean.
    let mut image = Image(clean.0.clone());
    image.forge_superblock(|sb| sb.checkpoint_seq = MAX_SEQ - 2 * SEQ_HEADROOM);
    let disk = MemDisk::from_bytes(4096, image.0.clone());
    pollster::block_on(async {
        let fs = NineFs::mount(&disk, MountOptions::default(), clock())
            .await
            .unwrap();
        let g = fs.create(ROOT_INO, b"g", 0o644, OWNER).await.unwrap();
        fs.write(g.ino, 0, b"written").await.unwrap();
        fs.sync().await.unwrap();
        fs.unmount().await.unwrap();
    });
    let after = Image(disk.snapshot());
    assert!(after.superblock().checkpoint_seq > MAX_SEQ - 2 * SEQ_HEADROOM);
    let report = after.fsck().unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
}

/// F5: `next_ino` in the snapshot inode space (bit 63) or at `u64::MAX` handed out
/// inode numbers that collide with snapshots' or wrap to 0. Refused at mount and by
/// fsck.
#[test]
fn f5_next_ino_past_the_live_inode_space_is_refused() {
    let clean = Image::build();
    for next in [1 << 63, u64::MAX, MAX_INO + 1, 0, 1] {
        let mut image = Image(clean.0.clone());
        image.forge_superblock(|sb| sb.next_ino = next);
        let err = image
            .mount()
            .err()
            .unwrap_or_else(|| panic!("next_ino {next:#x} mounts"));
        assert!(
            err.to_string().contains("bad field next_ino"),
            "{next:#x}: {err}"
        );
        let err = image.fsck().expect_err("fsck refuses");
        assert!(err.to_string().contains("next_ino"), "{err}");
    }
}

/// F5: inode numbers run out with `ENOSPC` at the top of the live space, never into
/// the snapshots' space; the filesystem stays whole.
#[test]
fn f5_inode_numbers_run_out_with_enospc() {
    let mut image = Image::build();
    image.forge_superblock(|sb| sb.next_ino = MAX_INO - 1);
    let disk = MemDisk::from_bytes(4096, image.0.clone());
    pollster::block_on(async {
        let fs = NineFs::mount(&disk, MountOptions::default(), clock())
            .await
            .unwrap();
        let last = fs.create(ROOT_INO, b"last", 0o644, OWNER).await.unwrap();
        assert_eq!(last.ino, MAX_INO - 1);
        assert_eq!(
            fs.create(ROOT_INO, b"more", 0o644, OWNER)
                .await
                .unwrap_err(),
            Errno::ENOSPC
        );
        assert_eq!(
            fs.mkdir(ROOT_INO, b"more", 0o755, OWNER).await.unwrap_err(),
            Errno::ENOSPC
        );
        assert_eq!(fs.lookup(ROOT_INO, b"last").await.unwrap().ino, MAX_INO - 1);
        fs.unmount().await.unwrap();
    });
    let after = Image(disk.snapshot());
    assert_eq!(after.superblock().next_ino, MAX_INO);
    let report = after.fsck().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
}

/// Counters of an inode at their end (a directory's readdir index, a file's xattr
/// ids) were forged, never made: the operation that would move them on is a counted
/// corruption (`EIO`), not a wrap to index 0 (which is `.`'s) or to a used xattr id.
#[test]
fn inode_counters_at_their_end_are_corruption_not_wrapped() {
    let mut image = Image::build();
    let (d, f) = image
        .mount()
        .map(|fs| {
            (
                lookup(&fs, b"d").unwrap().ino,
                lookup(&fs, b"f").unwrap().ino,
            )
        })
        .unwrap();
    let (mut dir, mut file) = (image.inode(d), image.inode(f));
    dir.next_seq = u64::MAX;
    file.next_seq = u64::MAX;
    image.forge_fs_items(|items| {
        items.insert(Key::new(d, kind::INODE, 0), dir.encode());
        items.insert(Key::new(f, kind::INODE, 0), file.encode());
    });
    let fs = image.mount().unwrap();
    pollster::block_on(async {
        assert_eq!(
            fs.create(d, b"x", 0o644, OWNER).await.unwrap_err(),
            Errno::EIO
        );
        assert_eq!(fs.lookup(d, b"x").await.unwrap_err(), Errno::ENOENT);
        let set = fs
            .setxattr(f, b"user.a", b"v", vfs::XattrMode::Upsert)
            .await;
        assert_eq!(set, Err(Errno::EIO));
    });
    assert_eq!(fs.stats().corruptions, 2);
}

/// A bitmap group whose free count is not what its bits show (resealed) took the
/// allocator's books below zero when its blocks were allocated. The group is refused
/// like a damaged one: fsck reports it, and a change that needs it is `EIO`.
#[test]
fn a_bitmap_group_with_a_forged_free_count_is_refused() {
    let mut image = Image::build();
    let layout = image.superblock().layout;
    for slot in 0..2 {
        let b = image.block_mut(layout.bitmap_block(0, slot));
        // No block free, says the header; thousands, say the bits.
        b[12..16].copy_from_slice(&0u32.to_le_bytes());
        let crc = crc32c(&b[8..]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
    }
    // Resealed: only the free count makes the slots invalid.
    let block = layout.bitmap_block(0, 0);
    image.fsck_reports(&format!(
        "bitmap group 0 at block {block}: bitmap slot invalid"
    ));
    let fs = image.mount().unwrap();
    // Reads need no group; a write allocates in the (only) group.
    assert_eq!(lookup(&fs, b"f").unwrap().size, 10_000);
    pollster::block_on(async {
        let g = fs.create(ROOT_INO, b"g", 0o644, OWNER).await.unwrap();
        let written = fs.write(g.ino, 0, &[1u8; 8192]).await;
        assert_eq!(written, Err(Errno::EIO));
    });
    assert!(fs.stats().corruptions > 0);
}

/// F6: an inode larger than the largest file.
#[test]
fn f6_fsck_reports_an_inode_size_past_the_largest_file() {
    let mut image = Image::build();
    let f = image
        .mount()
        .map(|fs| lookup(&fs, b"f").unwrap().ino)
        .unwrap();
    let mut item = image.inode(f);
    item.size = MAX_FILE_SIZE + 1;
    image.forge_fs_items(|items| {
        items.insert(Key::new(f, kind::INODE, 0), item.encode());
    });
    image.fsck_reports("larger than the largest file");
}

/// F6: snapshot items the mount cannot serve (a name that is no file name, two of one
/// name, an id past the 15 bits of the snapshot inode space, id 0) are reported by
/// fsck, and the mount, which reads them, refuses them with `EIO`.
#[test]
fn f6_fsck_reports_the_snapshot_items_the_mount_refuses() {
    let clean = Image::build();
    let mut valid = Image(clean.0.clone());
    valid.forge_snapshots(&[(1, b"nightly"), (2, b"weekly")]);
    let report = valid.fsck().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
    let fs = valid.mount().unwrap();
    let names: Vec<String> = pollster::block_on(fs.snapshots())
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["nightly", "weekly"]);

    // Snapshot items (id, name), and fsck's report of them.
    type Case<'a> = (&'a [(u64, &'a [u8])], &'a str);
    let cases: [Case; 5] = [
        (&[(1, b"../x")], "snapshot item 1: snapshot name invalid"),
        (&[(1, b"a/b")], "snapshot item 1: snapshot name invalid"),
        (
            &[(1, b"same"), (2, b"same")],
            "snapshot item 2: snapshot name used twice",
        ),
        (
            &[(1 << 20, b"far")],
            "snapshot item 1048576: snapshot id out of range",
        ),
        (&[(0, b"zero")], "snapshot item 0: snapshot id out of range"),
    ];
    for (snaps, what) in cases {
        let mut image = Image(clean.0.clone());
        image.forge_snapshots(snaps);
        image.fsck_reports(what);
        assert_eq!(
            image.mount().err(),
            Some(MountError::Errno(Errno::EIO)),
            "{snaps:?}"
        );
    }
}

/// Beyond F6: snapshot items without the feature bit, which a mount does not read, so
/// it would free the blocks they hold.
#[test]
fn fsck_reports_snapshot_items_without_the_feature() {
    let mut image = Image::build();
    image.forge_snapshot(1, b"nightly");
    image.forge_superblock(|sb| sb.incompat &= !features::INCOMPAT_SNAPSHOTS);
    image.fsck_reports("lacks the SNAPSHOTS feature");
}

/// F6: an orphan item for an inode that does not exist (the filesystem deletes both in
/// one transaction, so none is ever left).
#[test]
fn f6_fsck_reports_an_orphan_item_for_a_missing_inode() {
    let mut image = Image::build();
    image.forge_fs_items(|items| {
        items.insert(Key::new(0, kind::ORPHAN, 999), Vec::new());
    });
    image.fsck_reports("orphan item for missing inode 999");
}

/// F6: an incompatible feature this code does not know: the mount refuses the image,
/// so fsck reports it (and goes on checking what it can).
#[test]
fn f6_fsck_reports_an_unknown_incompatible_feature() {
    let mut image = Image::build();
    image.forge_superblock(|sb| sb.incompat |= 1 << 40);
    assert_eq!(image.mount().err(), Some(MountError::Features(1 << 40)));
    let report = image.fsck_reports("unknown incompatible features 0x10000000000");
    assert_eq!(report.stats.inodes, 3, "the rest is still checked");
}

/// Records name `name` of `ino` (of type `ft`) in `dir` at readdir index `index`, in
/// the three places a name is: the hashed entry, the index, the back-reference.
fn add_name(
    items: &mut BTreeMap<Key, Vec<u8>>,
    secret: u64,
    (dir, index, name): (u64, u64, &[u8]),
    ino: u64,
    file_type: FileType,
) {
    let entry = DirEntryRec {
        ino,
        file_type,
        index,
        name: name.to_vec(),
    };
    let hash = keyed_hash(secret, domain::DIR_NAME, name);
    items.insert(
        Key::new(dir, kind::DIR_ENTRY, hash),
        encode_dir_entries(&[entry]),
    );
    let by_index = DirIndexRec {
        ino,
        file_type,
        name: name.to_vec(),
    };
    items.insert(Key::new(dir, kind::DIR_INDEX, index), by_index.encode());
    let back = InodeRefRec {
        parent: dir,
        index,
        name: name.to_vec(),
    };
    items.insert(
        Key::new(ino, kind::INODE_REF, name_ref_hash(secret, dir, name)),
        encode_inode_refs(&[back]),
    );
}

/// Beyond F6: a name no operation would take (`/` or NUL in it, `.`, `..`, or the
/// root's reserved `.snapshots`), with every item that records it consistent.
#[test]
fn fsck_reports_names_the_filesystem_never_makes() {
    let clean = Image::build();
    let secret = clean.superblock().secret;
    let f = clean
        .mount()
        .map(|fs| lookup(&fs, b"f").unwrap().ino)
        .unwrap();
    for bad in [&b"a/b"[..], b"..", b".", b"a\0b", b".snapshots"] {
        let mut image = Image(clean.0.clone());
        image.forge_fs_items(|items| {
            // Rename `f` to `bad`: its three records of the name go, new ones come.
            let old = keyed_hash(secret, domain::DIR_NAME, b"f");
            items
                .remove(&Key::new(ROOT_INO, kind::DIR_ENTRY, old))
                .unwrap();
            let old_ref = name_ref_hash(secret, ROOT_INO, b"f");
            items
                .remove(&Key::new(f, kind::INODE_REF, old_ref))
                .unwrap();
            let index = items
                .iter()
                .find(|(k, v)| {
                    k.objectid == ROOT_INO
                        && k.kind == kind::DIR_INDEX
                        && DirIndexRec::decode(v).unwrap().name == b"f"
                })
                .map(|(k, _)| k.offset)
                .unwrap();
            add_name(items, secret, (ROOT_INO, index, bad), f, FileType::Regular);
        });
        image.fsck_reports("a name the filesystem never makes");
    }
}

/// Beyond F6 (F3's directory cycle, made in the checkpoint rather than by replay): an
/// entry `d/loop` naming the root, every count consistent, made `d/loop/loop/...`
/// walk forever; the root never has a name.
#[test]
fn fsck_reports_a_directory_that_loops_to_the_root() {
    let mut image = Image::build();
    let secret = image.superblock().secret;
    let d = image
        .mount()
        .map(|fs| lookup(&fs, b"d").unwrap().ino)
        .unwrap();
    let mut dir = image.inode(d);
    image.forge_fs_items(|items| {
        add_name(
            items,
            secret,
            (d, dir.next_seq, b"loop"),
            ROOT_INO,
            FileType::Directory,
        );
        dir.next_seq += 1;
        dir.nlink += 1;
        dir.size += 1;
        items.insert(Key::new(d, kind::INODE, 0), dir.encode());
    });
    image.fsck_reports(&format!("entry \"loop\" in dir {d} names the root"));
}

/// Found by the `superblock` and `image` fuzz targets (fuzz/regressions/): a
/// superblock whose free-block total disagrees with the bitmap groups was trusted as
/// the allocator's total (the invariant check after a commit panicked in debug builds;
/// in release the total was wrong, and one below what is free could underflow). The
/// total is checked as the groups are read: a change that needs the group fails with
/// `EIO` and commits nothing (a total of 0 is `ENOSPC` before that); reads still work;
/// fsck reports the superblock.
#[test]
fn a_superblock_free_total_the_bitmap_disagrees_with_is_refused() {
    let clean = Image::build();
    let free = clean.superblock().free_blocks;
    for forged in [free - 174, free + 1, 0] {
        let mut image = Image(clean.0.clone());
        image.forge_superblock(|sb| sb.free_blocks = forged);
        image.fsck_reports(&format!(
            "superblock says {forged} blocks free, the bitmap has {free}"
        ));
        let Ok(fs) = image.mount() else {
            continue; // refused at once is fine too
        };
        assert_eq!(lookup(&fs, b"f").unwrap().size, 10_000, "{forged}");
        pollster::block_on(async {
            let r = async {
                let g = fs.create(ROOT_INO, b"g", 0o644, OWNER).await?;
                fs.write(g.ino, 0, &[1u8; 8192]).await?;
                fs.fsync(g.ino, false).await
            }
            .await;
            // A total of 0 is refused before any group is read: no space.
            let want = if forged == 0 {
                Errno::ENOSPC
            } else {
                Errno::EIO
            };
            assert_eq!(r, Err(want), "{forged}");
        });
        if forged != 0 {
            let disk = pollster::block_on(fs.unmount());
            assert!(
                disk.is_err(),
                "{forged}: a failed filesystem's unmount fails"
            );
        }
    }
}

/// Found by the `superblock` fuzz target (fuzz/regressions/superblock/): a resealed
/// superblock whose log starts before the bitmap region, or whose log end overflows,
/// made the decoder's own layout check overflow (`fixed_groups` before
/// `is_consistent`). Both are a bad `layout` field now, for the mount and fsck alike.
#[test]
fn a_layout_whose_arithmetic_overflows_is_refused() {
    let clean = Image::build();
    type Forge = fn(&mut Superblock);
    let forgeries: [Forge; 3] = [
        |sb| sb.layout.log_start = 0,
        |sb| sb.layout.log_blocks = u64::MAX - 3,
        |sb| sb.layout.log_start = u64::MAX - 1,
    ];
    for forge in forgeries {
        let mut image = Image(clean.0.clone());
        for b in SUPERBLOCK_BLOCKS {
            let mut sb = Superblock::decode(image.block(b)).unwrap();
            forge(&mut sb);
            image.block_mut(b).copy_from_slice(&sb.encode());
            let err = Superblock::decode(image.block(b)).unwrap_err();
            assert!(matches!(err, Corrupt::Field("layout")), "{err}");
        }
        assert!(image.mount().is_err());
        assert!(image.fsck().is_err());
    }
}

/// Found by the `log_replay` fuzz target (fuzz/regressions/log_replay/): `readlink`
/// sized its buffer by the inode's size, so a symlink item claiming an enormous size
/// aborted the process on the allocation. It is corruption (`EIO`) now.
#[test]
fn a_symlink_claiming_an_enormous_size_is_corruption() {
    let mut image = Image::build();
    let f = lookup(&image.mount().unwrap(), b"f").unwrap().ino;
    let mut item = image.inode(f);
    item.mode = vfs::mode::S_IFLNK | 0o777;
    item.size = 1 << 60;
    image.forge_fs_items(|items| {
        items.insert(Key::new(f, kind::INODE, 0), item.encode());
    });
    let fs = image.mount().unwrap();
    assert_eq!(pollster::block_on(fs.readlink(f)), Err(Errno::EIO));
}

/// Found by the `image` fuzz target (fuzz/regressions/image/): a directory entry or
/// an xattr moved to another hash bucket (its item's key changed, resealed) is listed
/// (readdir, listxattr) but never found (lookup, getxattr: the bucket of its name's
/// hash), and fsck called such an image clean. It reports both now.
#[test]
fn fsck_reports_names_and_xattrs_in_the_wrong_hash_bucket() {
    let clean = Image::build();
    let secret = clean.superblock().secret;
    let f = lookup(&clean.mount().unwrap(), b"f").unwrap().ino;
    let mut image = Image(clean.0.clone());
    image.forge_fs_items(|items| {
        let at = keyed_hash(secret, domain::DIR_NAME, b"f");
        let entry = items
            .remove(&Key::new(ROOT_INO, kind::DIR_ENTRY, at))
            .unwrap();
        items.insert(Key::new(ROOT_INO, kind::DIR_ENTRY, at ^ 1), entry);
    });
    image.fsck_reports("name \"f\" is in the wrong hash bucket");
    let fs = image.mount().unwrap();
    assert_eq!(lookup(&fs, b"f").unwrap_err(), Errno::ENOENT);

    let mut image = Image(clean.0.clone());
    let fs = image.mount().unwrap();
    pollster::block_on(fs.setxattr(f, b"user.x", b"v", vfs::XattrMode::Upsert)).unwrap();
    image.0 = pollster::block_on(fs.unmount()).unwrap().snapshot();
    assert!(image.fsck().unwrap().is_clean());
    image.forge_fs_items(|items| {
        let at = keyed_hash(secret, domain::XATTR_NAME, b"user.x");
        let xattr = items.remove(&Key::new(f, kind::XATTR, at)).unwrap();
        items.insert(Key::new(f, kind::XATTR, at.wrapping_add(7)), xattr);
    });
    image.fsck_reports("xattr \"user.x\" is in the wrong hash bucket");
    let fs = image.mount().unwrap();
    assert_eq!(
        pollster::block_on(fs.getxattr(f, b"user.x")).unwrap_err(),
        Errno::ENODATA
    );
}

/// Found by the `image` fuzz target (fuzz/regressions/image/): a bset whose sequence is
/// after the checkpoint the superblock commits (header resealed). The node parsed, so
/// fsck called the image clean and the mount served it; but the next checkpoint that
/// changed the node appended a bset with its own, lower sequence, which every reader
/// then refuses (sequences must not decrease): a clean image fsck found damaged after a
/// few writes and a clean unmount. No checkpoint writes a bset after itself, so such a
/// node is corrupt: `EIO` and a counted corruption when read, and fsck names it.
#[test]
fn a_bset_written_after_the_last_checkpoint_is_corruption() {
    let sb = Image::build().superblock();
    // Every bset of the root leaf given sequence `seq` (so they do not decrease).
    let forge = |seq: u64| {
        let mut image = Image::build();
        let ptr = sb.root(TreeId::Fs).ptr;
        for b in ptr.addr..ptr.addr + u64::from(ptr.blocks) {
            let header = image.block_mut(b);
            if header[..4] == bset::MAGIC {
                header[24..32].copy_from_slice(&seq.to_le_bytes());
                let crc = crc32c(&header[8..HEADER_LEN]);
                header[4..8].copy_from_slice(&crc.to_le_bytes());
            }
        }
        image
    };
    let image = forge(sb.checkpoint_seq + (4 << 40));
    image.fsck_reports("bset sequence after the last checkpoint");
    // The mount reads the root directory from the (only) leaf: refused, cleanly.
    assert_eq!(image.mount().err(), Some(MountError::Errno(Errno::EIO)));
    // Bsets of the last checkpoint itself are fine, and a change appends after them.
    let image = forge(sb.checkpoint_seq);
    let report = image.fsck().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
    let fs = image.mount().unwrap();
    pollster::block_on(fs.mkdir(ROOT_INO, b"e", 0o755, OWNER)).unwrap();
    let disk = pollster::block_on(fs.unmount()).unwrap();
    let report = pollster::block_on(fsck(&disk, &FsckOptions::default())).unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
}

/// Found by the `image` fuzz target (fuzz/regressions/image/): a leaf holding a key past
/// the bound its parent's separators give it (resealed). Loaded as it was, it was served
/// (a lookup of that key never reaches it) until the first change to the leaf, after
/// which the tree's invariants were broken: a panic in builds with debug assertions
/// (fsck's own replay mount included), a tree silently out of order in release. The
/// first descent through a node read from the disk checks its keys against the bounds:
/// corruption, `EIO` and a counted corruption; fsck reports the node.
#[test]
fn a_node_with_keys_outside_its_parents_bounds_is_corruption() {
    let disk = MemDisk::new(4096, DISK_BLOCKS);
    let opts = FormatOptions {
        node_size: NODE_SIZE,
        uuid: [4; 16],
        secret: 0x5eed,
        now: vfs::Clock::now(&*clock()),
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    let fs = pollster::block_on(NineFs::mount(&disk, MountOptions::default(), clock())).unwrap();
    pollster::block_on(async {
        for i in 0..300 {
            let name = format!("file-with-a-longish-name-{i}");
            fs.create(ROOT_INO, name.as_bytes(), 0o644, OWNER)
                .await
                .unwrap();
        }
        fs.unmount().await.unwrap();
    });
    let mut image = Image(disk.snapshot());
    let sb = image.superblock();
    let root = sb.root(TreeId::Fs);
    assert!(root.level >= 1, "the fs tree has interior nodes");
    // The root's children, by separator.
    let node_bytes = |image: &Image, addr: u64, blocks: u32| {
        image.0[addr as usize * BLOCK_SIZE..(addr + u64::from(blocks)) as usize * BLOCK_SIZE]
            .to_vec()
    };
    let id = |level: u8, nonce: u64| NodeId {
        tree: TreeId::Fs,
        level,
        nonce,
    };
    let buf = node_bytes(&image, root.ptr.addr, root.ptr.blocks);
    let mut children = BTreeMap::new();
    for set in parse_node(&buf, id(root.level, root.ptr.nonce), root.ptr.blocks).unwrap() {
        for e in set.entries {
            match e.val {
                Some(v) => children.insert(e.key, v.to_vec()),
                None => children.remove(&e.key),
            };
        }
    }
    let mut seps = children.iter();
    let (_, first) = seps.next().unwrap();
    let (&upper, _) = seps.next().expect("two children");
    let child = ninefs::format::superblock::NodePtr::from_bytes(first).unwrap();
    // The first bset of the first child: its last entry's key moved past `upper` (still
    // the bset's largest, so the bset stays sorted), both checksums resealed.
    let buf = node_bytes(&image, child.addr, child.blocks);
    let sets = parse_node(&buf, id(root.level - 1, child.nonce), child.blocks).unwrap();
    let set = &sets[0];
    let n = set.entries.len();
    let at = HEADER_LEN
        + set.entries[..n - 1]
            .iter()
            .map(|e| bset::entry_len(e.val.map_or(0, <[u8]>::len)))
            .sum::<usize>();
    let moved = Key::new(upper.objectid + 1_000_000, kind::INODE, 0);
    assert!(moved > set.entries[n - 1].key && moved >= upper);
    let end = set.header.blocks() as usize * BLOCK_SIZE;
    let start = child.addr as usize * BLOCK_SIZE;
    let node = &mut image.0[start..start + end];
    node[at..at + Key::ENCODED_LEN].copy_from_slice(&moved.to_bytes());
    let body = crc32c(&node[HEADER_LEN..]);
    node[8..12].copy_from_slice(&body.to_le_bytes());
    let header = crc32c(&node[8..HEADER_LEN]);
    node[4..8].copy_from_slice(&header.to_le_bytes());

    let report = image.fsck().unwrap();
    assert!(!report.is_clean(), "fsck reports the node");
    // The root directory's items are in that leaf: the mount, or the first operation
    // on the root, refuses it.
    let fs = match image.mount() {
        Err(e) => {
            assert_eq!(e, MountError::Errno(Errno::EIO));
            return;
        }
        Ok(fs) => fs,
    };
    assert_eq!(
        pollster::block_on(fs.create(ROOT_INO, b"new", 0o644, OWNER)).unwrap_err(),
        Errno::EIO
    );
    assert!(fs.stats().corruptions >= 1);
}
