//! The checks a commit passes before any of it is written, in every build.
//!
//! Each is cheap — a comparison per node, group, range or record that the commit
//! handles anyway — so, as in TigerBeetle, they stay in the product: a bug that breaks
//! one stops the filesystem before its commit reaches the disk, instead of being
//! written down for the next mount to trust.
//!
//! - **The allocator's books**, on every change (`space`): blocks a transaction or a
//!   checkpoint places were reserved (owned by nobody else); blocks freed are not
//!   already waiting to be freed (no double free); no block is allocated twice or
//!   freed while free; reserved blocks given back were reserved.
//! - **A checkpoint**, once it is prepared and before its first write
//!   ([`Core::prepare_checkpoint`](crate::core::txn::Core), `Engine::checkpoint`):
//!   [`node_write`] for every node it writes; each bitmap group it writes says as many
//!   blocks free as its bits show; the allocator's books above; [`superblock`] for the
//!   superblock it commits, and its log tail does not move backwards.
//! - **An early node write** (the `DirtyThresholdPolicy` baseline): [`node_write`].
//! - **A log commit**, before its first block is written: [`log_commit`].
//! - **Quota usage**, in every transaction that charges a project
//!   (`features/quota.rs`): it never goes below zero.
//!
//! A failed check is handled as a failed device write is (`docs/durability.md`,
//! "Device errors" and "Broken invariants"): it is logged with what failed and the
//! values, the filesystem is marked failed (every request from then on gets `EIO`),
//! and nothing of that commit, nor anything after it, is written; the disk keeps its
//! last durable state.
//!
//! What costs more than the commit's own work stays in builds with debug assertions
//! (tests, the crash suite): the whole-tree and tracked-block checks after a
//! transaction ([`Core::check_invariants`](crate::core::txn::Core::check_invariants)), key
//! order within a node's sets, every block of the allocator's sets against the bitmap.

use alloc::format;
use alloc::vec::Vec;

use crate::btree::NodeWrite;
use crate::format::log::{rec, RECORD_HEADER_LEN};
use crate::format::superblock::Superblock;
use crate::format::{Layout, BLOCK_SIZE};
use crate::util::check::{ensure, Violation};

/// A node write stays inside its node's extent (`node_blocks` from the node's
/// location: an append never runs into the next extent), and that extent lies in the
/// data area (never over a superblock, bitmap slot or the log, never past the end).
pub fn node_write(w: &NodeWrite, layout: &Layout, node_blocks: u64) -> Result<(), Violation> {
    let blocks = w.bset.size().div_ceil(BLOCK_SIZE) as u64;
    ensure(
        blocks > 0 && w.block >= w.node && w.block + blocks <= w.node + node_blocks,
        "node write outside its node",
        || {
            format!(
                "{} blocks at {} for the node at {} ({node_blocks} blocks)",
                blocks, w.block, w.node
            )
        },
    )?;
    ensure(
        layout.is_data_area(w.node, w.node.saturating_add(node_blocks)),
        "node outside the data area",
        || {
            format!(
                "node at {}..{}, data area {}..{}",
                w.node,
                w.node + node_blocks,
                layout.data_start(),
                layout.total_blocks
            )
        },
    )
}

/// The superblock a checkpoint commits, against the one before it: the next
/// generation and checkpoint sequence; inode numbers never handed out twice
/// (`next_ino` does not go back, and exceeds the inode count); and every field as a
/// mount accepts it ([`Superblock::check`]: no more blocks free than the data area
/// has, every tree's root a node of the data area, sequences and counters below their
/// bound), so the filesystem never commits a superblock the next mount would refuse.
pub fn superblock(new: &Superblock, old: &Superblock) -> Result<(), Violation> {
    ensure(
        old.generation.checked_add(1) == Some(new.generation)
            && old.checkpoint_seq.checked_add(1) == Some(new.checkpoint_seq),
        "superblock out of sequence",
        || {
            format!(
                "generation {} after {}, checkpoint {} after {}",
                new.generation, old.generation, new.checkpoint_seq, old.checkpoint_seq
            )
        },
    )?;
    ensure(
        new.next_ino >= old.next_ino && new.inode_count < new.next_ino,
        "inode counters inconsistent",
        || {
            format!(
                "next inode {} (was {}), {} inodes",
                new.next_ino, old.next_ino, new.inode_count
            )
        },
    )?;
    match new.check() {
        Ok(()) => Ok(()),
        Err(e) => ensure(false, "superblock a mount would refuse", || format!("{e}")),
    }
}

/// A log commit about to be written, as [`log_commit`] sees it (the log, a layer above,
/// hands it over: `synclog::Batch::as_commit`).
#[derive(Clone, Copy, Debug)]
pub struct LogCommit<'a> {
    /// Sequence number of the batch's first block.
    pub first_seq: u64,
    /// Blocks reserved for the batch.
    pub blocks: u64,
    /// The batch's records, one buffer per fsync.
    pub records: &'a [Vec<u8>],
    /// The ring: the next sequence number to write.
    pub head: u64,
    /// The ring: the oldest sequence number the committed checkpoint's log still needs.
    pub tail: u64,
    /// The ring's size in blocks.
    pub capacity: u64,
}

/// A log commit about to be written (`encoded` blocks, framed from `batch`): exactly
/// the blocks reserved for it; the newest commit (it ends at the log head, so commits
/// follow one another with no gap, which replay needs); within the ring's free space
/// (it overwrites no block the committed checkpoint's log still needs); and each
/// fsync's records framed whole — known kinds, lengths that end exactly at the end of
/// its buffer (a malformed record would end replay early).
pub fn log_commit(batch: &LogCommit<'_>, encoded: u64) -> Result<(), Violation> {
    let log = batch;
    let end = batch.first_seq + batch.blocks;
    ensure(
        encoded == batch.blocks,
        "log commit encoded into other blocks than it was given",
        || format!("{encoded} blocks encoded, {} reserved", batch.blocks),
    )?;
    ensure(end == log.head, "log commit is not the newest", || {
        format!("blocks {}..{end}, log head {}", batch.first_seq, log.head)
    })?;
    ensure(
        end <= log.tail + log.capacity,
        "log commit overwrites blocks the log still needs",
        || {
            format!(
                "blocks {}..{end}, tail {} of a {}-block ring",
                batch.first_seq, log.tail, log.capacity
            )
        },
    )?;
    for records in batch.records {
        let mut at = 0;
        while at < records.len() {
            let kind = records[at];
            let len = records
                .get(at + 1..at + RECORD_HEADER_LEN)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
            let next = len.map(|len| at + RECORD_HEADER_LEN + len);
            ensure(
                (rec::INODE..=rec::DENTRIES).contains(&kind)
                    && next.is_some_and(|n| n <= records.len()),
                "log record malformed",
                || {
                    format!(
                        "kind {kind}, length {len:?} at byte {at} of {}",
                        records.len()
                    )
                },
            )?;
            at = next.unwrap_or(records.len());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Each test breaks the in-memory state the way a bug would, then shows that the
    //! commit it reaches is refused: `EIO`, the filesystem failed (every later request
    //! `EIO` too), the broken rule named, and not one write or flush more to the device.

    use alloc::boxed::Box;
    use alloc::vec;
    use alloc::vec::Vec;

    use block::{CounterHandle, CountingDisk, DeviceCounters, MemDisk};
    use vfs::{Errno, FileSystem, Owner, Timespec, ROOT_INO};

    use super::*;
    use crate::core::txn::Txn;
    use crate::format::bitmap::BLOCKS_PER_GROUP;
    use crate::format::bset::{NodeId, UnsealedBset};
    use crate::format::TreeId;
    use crate::synclog::{Batch, LogState};
    use crate::volume::{format, FormatOptions, MountOptions, NineFs};

    type Fs = NineFs<CountingDisk<MemDisk>>;

    const OWNER: Owner = Owner { uid: 1, gid: 1 };

    struct Fixed;

    impl vfs::Clock for Fixed {
        fn now(&self) -> Timespec {
            Timespec {
                sec: 1_700_000_000,
                nsec: 0,
            }
        }
    }

    /// A fresh filesystem on a counted RAM disk, one file `f` written and checkpointed.
    fn mounted() -> (Fs, CounterHandle, u64) {
        let disk = CountingDisk::new(MemDisk::new(4096, 8192));
        let handle = disk.handle();
        pollster::block_on(async {
            format(&disk, &FormatOptions::default()).await.unwrap();
            let fs = NineFs::mount(disk, MountOptions::default(), Box::new(Fixed))
                .await
                .unwrap();
            let f = fs.create(ROOT_INO, b"f", 0o644, OWNER).await.unwrap();
            fs.write(f.ino, 0, &vec![7u8; 10_000]).await.unwrap();
            fs.sync().await.unwrap();
            (fs, handle, f.ino)
        })
    }

    /// What reached the device: writes and flushes.
    fn sent(c: &DeviceCounters) -> (u64, u64, u64) {
        (c.writes, c.bytes_written, c.flushes)
    }

    /// `fs` is failed by the check named `what`, every request gets `EIO`, and the
    /// device saw nothing more since `before`.
    fn refused(fs: &Fs, disk: &CounterHandle, before: DeviceCounters, ino: u64, what: &str) {
        assert_eq!(fs.stats().failed, 1, "marked failed");
        let broken = fs
            .engine
            .core
            .lock()
            .broken
            .clone()
            .expect("a check failed");
        assert_eq!(broken.what, what, "{broken}");
        pollster::block_on(async {
            assert_eq!(fs.getattr(ino).await, Err(Errno::EIO));
            assert_eq!(fs.write(ino, 0, b"more").await, Err(Errno::EIO));
            assert_eq!(fs.fsync(ino, false).await, Err(Errno::EIO));
            assert_eq!(fs.sync().await, Err(Errno::EIO));
            let made = fs.create(ROOT_INO, b"g", 0o644, OWNER).await;
            assert_eq!(made.map(|_| ()), Err(Errno::EIO));
            assert_eq!(fs.remount_read_only().await, Err(Errno::EIO));
        });
        assert_eq!(
            sent(&disk.get()),
            sent(&before),
            "nothing written after the check"
        );
    }

    #[test]
    fn a_quota_usage_going_below_zero_fails_the_transaction() {
        let (fs, disk, ino) = mounted();
        pollster::block_on(fs.set_quota(ROOT_INO, vfs::QuotaLimits::default())).unwrap();
        {
            // The project's item forgets what it holds, as a bug would.
            let mut c = fs.engine.core.lock();
            let key = crate::features::quota::quota_key(ROOT_INO);
            let mut tx = Txn::new();
            let q = c.quota_item(&tx, ROOT_INO).unwrap().unwrap();
            let lost = crate::format::items::QuotaItem {
                bytes: 0,
                inodes: 0,
                ..q
            };
            tx.put(TreeId::Fs, key, lost.encode());
            c.commit(tx).unwrap();
        }
        let before = disk.get();
        assert_eq!(
            pollster::block_on(fs.unlink(ROOT_INO, b"f")),
            Err(Errno::EIO)
        );
        refused(&fs, &disk, before, ino, "quota usage never negative");
    }

    #[test]
    fn a_double_free_fails_the_checkpoint_before_it_is_written() {
        let (fs, disk, ino) = mounted();
        {
            let mut c = fs.engine.core.lock();
            let root = c.sb.roots[TreeId::Fs as usize].ptr.addr;
            c.space.free(root..root + 1);
            c.space.free(root..root + 1);
            c.changed = true;
        }
        let before = disk.get();
        assert_eq!(pollster::block_on(fs.sync()), Err(Errno::EIO));
        refused(&fs, &disk, before, ino, "double free");
    }

    #[test]
    fn a_node_placed_over_the_log_fails_the_checkpoint_before_it_is_written() {
        let (fs, disk, ino) = mounted();
        pollster::block_on(async {
            // Enough names that the root directory's leaf splits: the new node needs a
            // location from the node pool.
            for i in 0..400u32 {
                let name = alloc::format!("a-rather-long-file-name-{i:04}");
                fs.create(ROOT_INO, name.as_bytes(), 0o644, OWNER)
                    .await
                    .unwrap();
            }
        });
        {
            // The pool hands out the log's first block, which nobody reserved.
            let mut c = fs.engine.core.lock();
            while c.space.take_node().is_some() {}
            let log = c.sb.layout.log_start;
            c.space.return_node(log);
        }
        let before = disk.get();
        assert_eq!(pollster::block_on(fs.sync()), Err(Errno::EIO));
        refused(&fs, &disk, before, ino, "node outside the data area");
    }

    #[test]
    fn inode_counters_that_disagree_fail_the_checkpoint_before_it_is_written() {
        let (fs, disk, ino) = mounted();
        {
            let mut c = fs.engine.core.lock();
            c.inode_count = c.next_ino + 5;
            c.changed = true;
        }
        let before = disk.get();
        assert_eq!(pollster::block_on(fs.sync()), Err(Errno::EIO));
        refused(&fs, &disk, before, ino, "inode counters inconsistent");
    }

    #[test]
    fn a_malformed_log_record_fails_the_log_commit_before_it_is_written() {
        let (fs, disk, ino) = mounted();
        pollster::block_on(fs.write(ino, 0, b"logged")).unwrap();
        // A record of no known kind in the open batch, as a build that framed its
        // records wrong would leave there; the fsync's own records join it.
        fs.engine.log.lock().append(vec![0xEE, 1, 0, 0, 0, 9]);
        let before = disk.get();
        assert_eq!(pollster::block_on(fs.fsync(ino, false)), Err(Errno::EIO));
        assert_eq!(fs.engine.log.lock().stats.commits, 0, "no log commit");
        refused(&fs, &disk, before, ino, "log record malformed");
    }

    /// [`super::log_commit`] of `batch` going into `log`.
    fn log_commit(batch: &Batch, encoded: u64, log: &LogState) -> Result<(), Violation> {
        super::log_commit(&batch.as_commit(log), encoded)
    }

    #[test]
    fn log_commits_are_the_newest_inside_the_ring_and_framed() {
        // A 16-block ring whose committed checkpoint needs blocks from 20 on; 30 taken.
        let mut log = LogState::new(100, 16, 1, 20);
        log.head = 30;
        let record = |kind: u8, len: u32, body: usize| {
            let mut r = vec![kind];
            r.extend_from_slice(&len.to_le_bytes());
            r.resize(RECORD_HEADER_LEN + body, 0);
            r
        };
        let batch = |first_seq: u64, blocks: u64, records: Vec<Vec<u8>>| Batch {
            id: 1,
            records,
            first_seq,
            blocks,
        };
        let two = vec![record(rec::INODE, 3, 3), record(rec::CSUM, 0, 0)];
        let whole: Vec<u8> = two.concat();
        assert_eq!(log_commit(&batch(28, 2, two.clone()), 2, &log), Ok(()));
        assert_eq!(log_commit(&batch(28, 2, vec![whole]), 2, &log), Ok(()));
        let cases = [
            (
                batch(28, 2, two.clone()),
                3,
                "log commit encoded into other blocks than it was given",
            ),
            (batch(27, 2, two.clone()), 2, "log commit is not the newest"),
            (
                batch(28, 2, vec![record(0, 0, 0)]),
                2,
                "log record malformed",
            ),
            (
                batch(28, 2, vec![record(rec::INODE, 9, 3)]),
                2,
                "log record malformed",
            ),
            (
                batch(28, 2, vec![vec![rec::INODE, 0, 0]]),
                2,
                "log record malformed",
            ),
        ];
        for (b, encoded, what) in cases {
            assert_eq!(log_commit(&b, encoded, &log).unwrap_err().what, what);
        }
        log.head = 40;
        let past = log_commit(&batch(37, 3, two), 3, &log).unwrap_err();
        assert_eq!(
            past.what,
            "log commit overwrites blocks the log still needs"
        );
    }

    fn layout() -> Layout {
        Layout::for_size(3 * BLOCKS_PER_GROUP)
    }

    fn write_at(block: u64, node: u64, blocks: usize) -> NodeWrite {
        let id = NodeId {
            tree: TreeId::Fs,
            level: 0,
            nonce: 1,
        };
        let mut w = NodeWrite {
            block,
            node,
            bset: UnsealedBset::new(id, 1, 0, 0, core::iter::empty()),
            cause: crate::btree::WriteCause::Sync,
            relocated: false,
            tree: TreeId::Fs,
        };
        while w.bset.size() < blocks * BLOCK_SIZE {
            // A bset of `blocks` blocks: its size is what is checked.
            let entries: Vec<_> = (0..(blocks * BLOCK_SIZE / 64) as u64)
                .map(|i| (crate::format::Key::new(i, 1, 0), Some(&[0u8; 40][..])))
                .collect();
            w.bset = UnsealedBset::new(id, 1, 0, 0, entries);
        }
        w
    }

    #[test]
    fn node_writes_stay_in_their_node_and_the_data_area() {
        let l = layout();
        let d = l.data_start();
        assert_eq!(node_write(&write_at(d, d, 1), &l, 4), Ok(()));
        assert_eq!(node_write(&write_at(d + 3, d, 1), &l, 4), Ok(()));
        let past_end = node_write(&write_at(d + 3, d, 2), &l, 4).unwrap_err();
        assert_eq!(past_end.what, "node write outside its node");
        let before = node_write(&write_at(d, d + 1, 1), &l, 4).unwrap_err();
        assert_eq!(before.what, "node write outside its node");
        for node in [1, l.log_start, d - 1, l.total_blocks - 3] {
            let outside = node_write(&write_at(node, node, 1), &l, 4).unwrap_err();
            assert_eq!(outside.what, "node outside the data area", "node at {node}");
        }
        // A group added by growth keeps its bitmap slots in its first two blocks.
        let grown = Layout::for_size(BLOCKS_PER_GROUP)
            .grown(3 * BLOCKS_PER_GROUP)
            .unwrap();
        let g2 = 2 * BLOCKS_PER_GROUP;
        for node in [g2 - 2, g2 + 1] {
            let w = write_at(node, node, 1);
            assert!(node_write(&w, &grown, 4).is_err(), "node at {node}");
        }
        assert_eq!(node_write(&write_at(g2 + 2, g2 + 2, 1), &grown, 4), Ok(()));
    }
}
