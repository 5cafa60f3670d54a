//! Log replay at mount.
//!
//! 1. **Scan** from the committed checkpoint's tail: a block is accepted only with the
//!    right magic, checksum, epoch and sequence number, a commit only with all its
//!    blocks. The first block that fails ends the log.
//! 2. **Verify** the last complete commit's data against the checksums logged with it:
//!    every commit before it was flushed before the next one was written, but the last
//!    one's FLUSH may not have completed, so its data may be missing (its fsyncs were
//!    never acknowledged). If any block reads back different, that commit is dropped.
//! 3. **Apply** the records in order (inode items of a commit first, so names can point
//!    to them), in memory: names, xattrs, directory entries are made exactly what was
//!    logged; file mappings are edited and their reference changes summed. Each record
//!    is applied only if the live operation it stands for would be accepted
//!    ([`crate::synclog::rules`]); a commit that breaks a rule, or whose records do not decode,
//!    is *refused*: replay starts again from the checkpoint and applies only the commits
//!    before it, the refusal is logged and counted (`corruptions`,
//!    `log.refused_commits`), and the mount is read-only, so nothing is written and the
//!    whole log stays on the disk (`docs/durability.md`, "Log commits as input").
//! 4. **Finish**: apply the summed reference changes (new extents get their checksum
//!    items and their blocks allocated; extents left unreferenced are freed), then fix
//!    link counts, directory sizes and index counters of every inode replay touched
//!    (an inode left without names gets an orphan item).
//!
//! A device *read error* is not the end of the log and not missing data: the block may
//! hold an acknowledged commit the device cannot return now. A log block that cannot be
//! read fails the mount with `EIO` (dropping the commits from there on could lose
//! acknowledged changes; a later mount on a healed device replays them). A data block
//! of the last commit that cannot be read does not drop the commit: it is applied, and
//! reading that block gives `EIO` as any read error does (`docs/durability.md`,
//! "Device errors").
//!
//! Every transaction here is [`Txn::unlimited`]: replay charges quota usage for what it
//! changes (the usage follows the inode items, `features/quota.rs`) but never refuses on a
//! limit. The log may hold an inode's growth without the shrink of another that made
//! room for it (never synced), and a mount must not fail on that.
//!
//! Nothing is written here; the caller runs a checkpoint that commits the result and
//! starts a new log epoch. A crash before that checkpoint commits replays the same log
//! again from the same committed checkpoint: replay is idempotent.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec;
use alloc::vec::Vec;

use crate::format::items::{
    decode_dir_entries, encode_csums, encode_dir_entries, DirIndexRec, ExtentItem, FileExtent,
    InodeItem,
};
use crate::format::key::kind;
use crate::format::log::{decode_records, LogBlockHeader, LoggedEntry, LoggedName, Record};
use crate::format::{Corrupt, Key, TreeId, BLOCK_SIZE};
use block::{BlockDevice, IoError};
use vfs::{Errno, FileType, Ino, ROOT_INO};

use crate::core::file::RefChanges;
use crate::core::txn::{inode_key, Core, Step, Stop, Txn};
use crate::synclog::rules::NewExtents;
pub use crate::synclog::rules::Refusal;

/// Symlink targets are stored in chunks of this many bytes (as `inode.rs` does).
pub(crate) const SYMLINK_CHUNK: usize = 2048;

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Sequence number after the last block read (where the next epoch continues).
    pub end: u64,
    /// Commits applied.
    pub commits: u64,
    /// Records applied.
    pub records: u64,
    /// Distinct inodes named by records.
    pub inodes: u64,
    /// Record bytes applied.
    pub bytes: u64,
    /// Complete commits dropped because their data was not on the disk.
    pub dropped: u64,
    /// Commits applied although the device could not read some of their data blocks.
    pub unverified: u64,
}

/// A log block the device failed to read: the log cannot be replayed past it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnreadableLog {
    /// Its sequence number.
    pub seq: u64,
    /// Its filesystem block.
    pub block: u64,
    /// What the device said.
    pub error: IoError,
}

impl core::fmt::Display for UnreadableLog {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "log block {} (sequence {}) cannot be read: {}",
            self.block, self.seq, self.error
        )
    }
}

/// What the last commit's data looks like on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DataCheck {
    /// Every block matches its checksum.
    Present,
    /// A block reads back different: the commit's FLUSH never completed.
    Missing,
    /// No block differs, but the device failed to read this many.
    Unreadable(u64),
}

/// A commit replay refused: it breaks a rule of [`crate::synclog::rules`], or its records do
/// not decode. Neither it nor anything after it in the log is replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedCommit {
    /// Sequence number of its first block.
    pub seq: u64,
    /// Commits before it in the log, all replayed.
    pub applied: u64,
    /// Why.
    pub why: Refusal,
}

impl core::fmt::Display for RefusedCommit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "log commit at sequence {} (after {} replayed) refused: {}",
            self.seq, self.applied, self.why
        )
    }
}

/// What [`scan`] found in the log.
#[derive(Debug, Default)]
pub struct LogScan {
    /// The complete commits, in order.
    pub commits: Vec<LoggedCommit>,
    /// The sequence number after the last one.
    pub end: u64,
    /// A complete commit after them whose records do not decode (no writer makes one):
    /// its sequence number and what is wrong. The scan stops there.
    pub undecodable: Option<(u64, Corrupt)>,
}

/// A commit read from the log.
#[derive(Debug)]
pub struct LoggedCommit {
    /// Sequence number of its first block.
    pub seq: u64,
    /// Its records.
    pub records: Vec<Record>,
    /// Payload bytes.
    pub bytes: usize,
}

/// Reads the log of `dev` from `tail` in `epoch`: the complete commits, the sequence
/// number after the last one, and a commit that does not decode if the log goes on
/// with one; or the first block the device failed to read. Also used by fsck.
pub async fn scan<D: BlockDevice>(
    dev: &crate::io::Dev<D>,
    start: u64,
    capacity: u64,
    epoch: u64,
    tail: u64,
) -> Result<LogScan, UnreadableLog> {
    let mut out = Vec::new();
    let mut undecodable = None;
    let mut seq = tail;
    let mut buf = vec![0u8; BLOCK_SIZE];
    let read = ReadLog {
        start,
        capacity,
        epoch,
    };
    'commits: while seq - tail < capacity {
        let Some((h, first)) = read.block(dev, seq, &mut buf).await? else {
            break;
        };
        let n = u64::from(h.commit_blocks);
        if h.commit_seq != seq || seq + n - tail > capacity {
            break;
        }
        let mut payload = first;
        for i in 1..n {
            match read.block(dev, seq + i, &mut buf).await? {
                Some((hi, p)) if hi.commit_seq == seq && hi.commit_blocks == h.commit_blocks => {
                    payload.extend_from_slice(&p);
                }
                _ => break 'commits,
            }
        }
        match decode_records(&payload) {
            Ok(records) => out.push(LoggedCommit {
                seq,
                records,
                bytes: payload.len(),
            }),
            Err(e) => {
                undecodable = Some((seq, e));
                break;
            }
        }
        seq += n;
    }
    Ok(LogScan {
        commits: out,
        end: seq,
        undecodable,
    })
}

/// Where and what to read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadLog {
    pub(crate) start: u64,
    pub(crate) capacity: u64,
    pub(crate) epoch: u64,
}

impl ReadLog {
    /// Block `seq` of the log, if it is a valid block of this epoch with that number.
    pub(crate) async fn block<D: BlockDevice>(
        &self,
        dev: &crate::io::Dev<D>,
        seq: u64,
        buf: &mut [u8],
    ) -> Result<Option<(LogBlockHeader, Vec<u8>)>, UnreadableLog> {
        let block = self.start + seq % self.capacity;
        let ours = |b: &[u8]| {
            LogBlockHeader::decode_block(b)
                .is_ok_and(|(h, _)| h.epoch == self.epoch && h.seq == seq)
        };
        // The end of the log reads as "not ours" too: on a mirror every copy is asked
        // (a crash may have left a commit on one leg only).
        dev.read_verified(block, buf, ours)
            .await
            .map_err(|error| UnreadableLog { seq, block, error })?;
        let Ok((h, p)) = LogBlockHeader::decode_block(buf) else {
            return Ok(None);
        };
        Ok((h.epoch == self.epoch && h.seq == seq).then(|| (h, p.to_vec())))
    }
}

/// Replay's working state.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// Inodes whose link counts, sizes and index counters need fixing.
    pub(crate) touched: BTreeSet<Ino>,
    /// Inodes named by records.
    pub(crate) inodes: BTreeSet<Ino>,
    /// Reference changes per data extent `(disk block, blocks)`.
    pub(crate) refs: RefChanges,
    /// Checksums logged per data extent (by the commits up to the one being applied).
    pub(crate) csums: BTreeMap<u64, Vec<u32>>,
    /// New data extents the records reference so far.
    pub(crate) new: NewExtents,
}

impl Core {
    /// Whether data extent `disk+len` lies in the data area.
    pub(crate) fn in_data_area(&self, disk: u64, len: u32) -> bool {
        let l = self.sb.layout;
        let end = disk.checked_add(u64::from(len));
        disk >= l.data_start() && end.is_some_and(|e| e <= l.total_blocks) && len > 0
    }

    pub(crate) fn replay_inode(&mut self, ino: Ino, item: &[u8]) -> Step<()> {
        let decoded = InodeItem::decode(item).ok_or(Stop::Corrupt("undecodable logged inode"))?;
        let mut tx = Txn::unlimited();
        let existed = tx.get(self, TreeId::Fs, &inode_key(ino))?.is_some();
        tx.put_inode(ino, &decoded);
        if !existed {
            tx.inode_delta = 1;
        }
        self.commit(tx)?;
        self.next_ino = self.next_ino.max(ino + 1);
        Ok(())
    }

    /// A transaction for replaying a record of `ino`, or `None` when `ino` no longer
    /// exists (a later record or the checkpoint removed it: the record has nothing to do).
    pub(crate) fn txn_for(&mut self, ino: Ino) -> Step<Option<Txn>> {
        let tx = Txn::unlimited();
        Ok(self.exists(&tx, ino)?.then_some(tx))
    }

    pub(crate) fn exists(&mut self, tx: &Txn, ino: Ino) -> Step<bool> {
        Ok(tx.get(self, TreeId::Fs, &inode_key(ino))?.is_some())
    }

    /// Removes the entry `name` of `dir` if it names `ino` (any inode if `None`): the
    /// hashed entry, the index entry and the inode's back-reference. Returns the inode
    /// that lost the name.
    pub(crate) fn unbind(
        &mut self,
        tx: &mut Txn,
        dir: Ino,
        hash: u64,
        name: Option<&[u8]>,
        ino: Option<Ino>,
    ) -> Step<Option<Ino>> {
        let key = Key::new(dir, kind::DIR_ENTRY, hash);
        let Some(b) = tx.get(self, TreeId::Fs, &key)? else {
            return Ok(None);
        };
        let mut list =
            decode_dir_entries(&b).ok_or(Stop::Corrupt("undecodable directory entry"))?;
        let Some(pos) = list
            .iter()
            .position(|e| name.is_none_or(|n| e.name == n) && ino.is_none_or(|i| e.ino == i))
        else {
            return Ok(None);
        };
        let e = list.remove(pos);
        if list.is_empty() {
            tx.del(TreeId::Fs, key);
        } else {
            tx.put(TreeId::Fs, key, encode_dir_entries(&list));
        }
        tx.del(TreeId::Fs, Key::new(dir, kind::DIR_INDEX, e.index));
        self.remove_name_ref(tx, e.ino, dir, &e.name, e.index)?;
        Ok(Some(e.ino))
    }

    /// Makes `dir/name` name `ino` with readdir index `index`, replacing whatever had
    /// that name or index. Returns the inodes touched; nothing if `dir` does not exist.
    pub(crate) fn bind(
        &mut self,
        tx: &mut Txn,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        ft: FileType,
        index: u64,
    ) -> Step<Vec<Ino>> {
        if !self.exists(tx, dir)? || !self.exists(tx, ino)? {
            // The rules refused such a record before it got here.
            return Err(Stop::Corrupt("log replay: an entry for a missing inode"));
        }
        let hash = self.name_hash(name);
        if let Some(e) = self.find_entry(tx, dir, name)? {
            if e.ino == ino && e.index == index {
                return Ok(Vec::new());
            }
        }
        let mut touched = vec![dir, ino];
        touched.extend(self.unbind(tx, dir, hash, Some(name), None)?);
        if let Some(b) = tx.get(self, TreeId::Fs, &Key::new(dir, kind::DIR_INDEX, index))? {
            let old =
                DirIndexRec::decode(&b).ok_or(Stop::Corrupt("undecodable directory index"))?;
            let h = self.name_hash(&old.name);
            touched.extend(self.unbind(tx, dir, h, Some(&old.name), Some(old.ino))?);
        }
        self.put_name_items(tx, dir, name, ino, ft, index)?;
        Ok(touched)
    }

    /// Makes the names of `ino` exactly `names`.
    pub(crate) fn replay_names(&mut self, ino: Ino, names: &[LoggedName]) -> Step<Vec<Ino>> {
        let Some(mut tx) = self.txn_for(ino)? else {
            return Ok(Vec::new());
        };
        let mut touched = vec![ino];
        for r in self.names_of(&tx, ino)? {
            let keep = names
                .iter()
                .any(|n| n.parent == r.parent && n.index == r.index && n.name == r.name);
            if !keep {
                let hash = self.name_hash(&r.name);
                self.unbind(&mut tx, r.parent, hash, Some(&r.name), Some(ino))?;
                touched.push(r.parent);
            }
        }
        for n in names {
            touched.extend(self.bind(&mut tx, n.parent, &n.name, ino, n.file_type, n.index)?);
        }
        self.commit(tx)?;
        Ok(touched)
    }

    /// Makes the xattr items of `ino` exactly `items`.
    pub(crate) fn replay_xattrs(&mut self, ino: Ino, items: &[(u8, u64, Vec<u8>)]) -> Step<()> {
        let Some(mut tx) = self.txn_for(ino)? else {
            return Ok(());
        };
        let old = tx.range(
            self,
            TreeId::Fs,
            Key::new(ino, kind::XATTR, 0),
            Key::new(ino, kind::XATTR_CHUNK, u64::MAX),
        )?;
        for (k, _) in old {
            tx.del(TreeId::Fs, k);
        }
        for (k, off, v) in items {
            tx.put(TreeId::Fs, Key::new(ino, *k, *off), v.clone());
        }
        self.commit(tx)
    }

    /// Maps file blocks `start..end` of `ino` exactly by `pieces`; returns the reference
    /// changes (applied at the end of replay).
    pub(crate) fn replay_extents(
        &mut self,
        ino: Ino,
        start: u64,
        end: u64,
        pieces: &[(u64, FileExtent)],
    ) -> Step<RefChanges> {
        let Some(mut tx) = self.txn_for(ino)? else {
            return Ok(RefChanges::new());
        };
        let (_, refs) = self.edit_extents(&mut tx, ino, start, end, pieces)?;
        self.commit(tx)?;
        Ok(refs)
    }

    pub(crate) fn replay_symlink(&mut self, ino: Ino, target: &[u8]) -> Step<()> {
        let Some(mut tx) = self.txn_for(ino)? else {
            return Ok(());
        };
        let old = tx.range(
            self,
            TreeId::Fs,
            Key::new(ino, kind::SYMLINK, 0),
            Key::new(ino, kind::SYMLINK, u64::MAX),
        )?;
        for (k, _) in old {
            tx.del(TreeId::Fs, k);
        }
        for (i, chunk) in target.chunks(SYMLINK_CHUNK).enumerate() {
            tx.put(
                TreeId::Fs,
                Key::new(ino, kind::SYMLINK, i as u64),
                chunk.to_vec(),
            );
        }
        self.commit(tx)
    }

    /// Removes the listed entries of `dir` and adds the logged ones.
    pub(crate) fn replay_dentries(
        &mut self,
        dir: Ino,
        entries: &[LoggedEntry],
        removed: &[(u64, Ino)],
    ) -> Step<Vec<Ino>> {
        let Some(mut tx) = self.txn_for(dir)? else {
            return Ok(Vec::new());
        };
        let mut touched = vec![dir];
        for &(hash, ino) in removed {
            touched.extend(self.unbind(&mut tx, dir, hash, None, Some(ino))?);
        }
        for e in entries {
            touched.extend(self.bind(&mut tx, dir, &e.name, e.ino, e.file_type, e.index)?);
        }
        self.commit(tx)?;
        Ok(touched)
    }

    /// Applies the summed reference change `d` of data extent `disk+len`. Returns whether
    /// that made a new extent (one the checkpoint does not have).
    pub(crate) fn replay_refs(
        &mut self,
        disk: u64,
        len: u32,
        d: i64,
        sums: Option<&Vec<u32>>,
    ) -> Step<bool> {
        if !self.in_data_area(disk, len) {
            return Err(Stop::Corrupt(
                "log replay: data extent outside the data area",
            ));
        }
        let key = Key::new(disk, kind::EXTENT, u64::from(len));
        let cur = match self.trees.get(TreeId::Extent, &key)? {
            Some(b) => i64::from(
                ExtentItem::decode(&b)
                    .ok_or(Stop::Corrupt("undecodable extent item"))?
                    .refs,
            ),
            None => 0,
        };
        let now = cur + d;
        if now < 0 {
            return Err(Stop::Corrupt(
                "log replay: extent reference count below zero",
            ));
        }
        let range = disk..disk + u64::from(len);
        let mut tx = Txn::unlimited();
        if now == 0 {
            tx.del(TreeId::Extent, key);
            tx.del(TreeId::Csum, Key::new(disk, kind::CSUM, 0));
            tx.frees.push(range);
            return self.commit(tx).map(|()| false);
        }
        tx.put(
            TreeId::Extent,
            key,
            ExtentItem {
                refs: now as u32,
                owner: 0,
            }
            .encode(),
        );
        if cur > 0 {
            return self.commit(tx).map(|()| false);
        }
        // A new extent: its checksums come from the log, its blocks were free in the
        // checkpoint.
        let sums = sums.ok_or(Stop::Corrupt("log replay: new extent without checksums"))?;
        if sums.len() != len as usize {
            return Err(Stop::Corrupt("log replay: checksum count"));
        }
        tx.put(
            TreeId::Csum,
            Key::new(disk, kind::CSUM, 0),
            encode_csums(sums),
        );
        self.space.ensure_groups(range.clone())?;
        self.commit(tx)?;
        if !self.space.claim_replayed(range) {
            self.failed = true;
            return Err(Stop::Corrupt(
                "log replay: a logged extent's blocks are in use in the checkpoint",
            ));
        }
        Ok(true)
    }

    /// Recomputes what replay may have left inconsistent about `ino`: a file's link
    /// count (an orphan item if it has no names left), a directory's link count, size
    /// and index counter. A directory left without a name (removed by the log) loses
    /// its remaining entries and becomes an orphan; returns the inodes that lost those
    /// names (to fix up in turn).
    pub(crate) fn replay_fixup(&mut self, ino: Ino) -> Step<Vec<Ino>> {
        let mut tx = Txn::unlimited();
        let mut item = match tx.inode(self, ino) {
            Ok(i) => i,
            Err(Stop::Errno(Errno::ENOENT)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut detached = Vec::new();
        let before = item;
        let names = self.names_of(&tx, ino)?.len() as u32;
        if item.is_dir() {
            let entries = tx.range(
                self,
                TreeId::Fs,
                Key::new(ino, kind::DIR_INDEX, 0),
                Key::new(ino, kind::DIR_INDEX, u64::MAX),
            )?;
            let mut subdirs = 0;
            let nameless = names == 0 && ino != ROOT_INO;
            for (k, v) in &entries {
                let e =
                    DirIndexRec::decode(v).ok_or(Stop::Corrupt("undecodable directory index"))?;
                subdirs += u32::from(e.file_type == FileType::Directory);
                item.next_seq = item.next_seq.max(k.offset + 1);
                if nameless {
                    let hash = self.name_hash(&e.name);
                    detached.extend(self.unbind(&mut tx, ino, hash, Some(&e.name), Some(e.ino))?);
                }
            }
            if nameless {
                // Removed (rmdir) as the log says: an orphan, freed after mount.
                item.size = 0;
                item.nlink = 0;
                let orphan = Key::new(0, kind::ORPHAN, ino);
                if tx.get(self, TreeId::Fs, &orphan)?.is_none() {
                    tx.put(TreeId::Fs, orphan, Vec::new());
                }
            } else {
                item.size = entries.len() as u64;
                item.nlink = 2 + subdirs;
            }
        } else {
            item.nlink = names;
            if item.file_type() == Some(FileType::Regular) {
                // The bytes a file references are its extents' (what every live
                // change keeps, and fsck checks): not what a logged inode item says,
                // which replayed extents do not adjust and a forged one may set to
                // anything.
                let mut blocks = 0u64;
                let mut undecodable = false;
                self.trees.range(
                    TreeId::Fs,
                    Key::new(ino, kind::EXTENT_DATA, 0),
                    Key::new(ino, kind::EXTENT_DATA, u64::MAX),
                    |_, v| {
                        match FileExtent::decode(v) {
                            Some(e) => blocks += u64::from(e.num_blocks),
                            None => undecodable = true,
                        }
                        !undecodable
                    },
                )?;
                if undecodable {
                    return Err(Stop::Corrupt("undecodable file extent"));
                }
                item.bytes = blocks * BLOCK_SIZE as u64;
            } else if item.file_type() == Some(FileType::Symlink) {
                // Likewise a symlink's size is its target's length (`readlink` refuses
                // any other), not what a logged item says.
                let mut len = 0u64;
                self.trees.range(
                    TreeId::Fs,
                    Key::new(ino, kind::SYMLINK, 0),
                    Key::new(ino, kind::SYMLINK, u64::MAX),
                    |_, v| {
                        len += v.len() as u64;
                        true
                    },
                )?;
                item.size = len;
            }
            let orphan = Key::new(0, kind::ORPHAN, ino);
            let has_orphan = tx.get(self, TreeId::Fs, &orphan)?.is_some();
            if names == 0 && !has_orphan {
                tx.put(TreeId::Fs, orphan, Vec::new());
            } else if names > 0 && has_orphan {
                tx.del(TreeId::Fs, orphan);
            }
        }
        if item != before {
            tx.put_inode(ino, &item);
        }
        if !tx.is_empty() {
            self.commit(tx)?;
        }
        Ok(detached)
    }
}
