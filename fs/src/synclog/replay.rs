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
    decode_csums, decode_dir_entries, encode_csums, encode_dir_entries, DirIndexRec, ExtentItem,
    FileExtent, InodeItem,
};
use crate::format::key::kind;
use crate::format::log::{decode_records, LogBlockHeader, LoggedEntry, LoggedName, Record};
use crate::format::{Corrupt, Key, TreeId, BLOCK_SIZE};
use crate::io::Verified;
use crate::util::crc::crc32c;
use block::{BlockDevice, IoError};
use vfs::{Errno, FileType, FsResult, Ino, ROOT_INO};

use crate::core::file::RefChanges;
use crate::core::txn::{inode_key, Core, Step, Stop, Txn};
pub use crate::synclog::rules::Refusal;
use crate::synclog::rules::{settle, NewExtents};
use crate::volume::NineFs;

/// Symlink targets are stored in chunks of this many bytes (as `inode.rs` does).
const SYMLINK_CHUNK: usize = 2048;

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
enum DataCheck {
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
struct ReadLog {
    start: u64,
    capacity: u64,
    epoch: u64,
}

impl ReadLog {
    /// Block `seq` of the log, if it is a valid block of this epoch with that number.
    async fn block<D: BlockDevice>(
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
struct Replay {
    /// Inodes whose link counts, sizes and index counters need fixing.
    touched: BTreeSet<Ino>,
    /// Inodes named by records.
    inodes: BTreeSet<Ino>,
    /// Reference changes per data extent `(disk block, blocks)`.
    refs: RefChanges,
    /// Checksums logged per data extent (by the commits up to the one being applied).
    csums: BTreeMap<u64, Vec<u32>>,
    /// New data extents the records reference so far.
    new: NewExtents,
}

impl<D: BlockDevice> NineFs<D> {
    /// The log commit replay refused at mount, if it refused one (the filesystem is then
    /// read-only, as the commits before it left it).
    pub fn refused_log_commit(&self) -> Option<RefusedCommit> {
        self.log.lock().refused.clone()
    }

    /// The data extents log replay added at this mount (written and fsynced since the
    /// checkpoint, which does not have them), each with the checksums the log gave it:
    /// `(first block, one checksum per block)`. Replay verified only the last commit's
    /// data (whose FLUSH may not have completed); the earlier commits' data was on the
    /// disk before the next commit was written, so a block of theirs that no longer
    /// matches is damage, which reading it reports (`EIO`). fsck checks these blocks as
    /// it checks the checkpoint's (`tools/fsck/src/log.rs`). Kept by a read-only mount
    /// only: a writable one commits them with its first checkpoint, and then they are
    /// the checkpoint's. Empty without replay.
    pub async fn replayed_extents(&self) -> FsResult<Vec<(u64, Vec<u32>)>> {
        let extents = self.log.lock().replayed_extents.clone();
        let mut out = Vec::with_capacity(extents.len());
        for (disk, len) in extents {
            let key = Key::new(disk, kind::CSUM, 0);
            let got = self.run(|c| Ok(c.trees.get(TreeId::Csum, &key)?)).await?;
            match got.as_deref().and_then(decode_csums) {
                Some(sums) if sums.len() == len as usize => out.push((disk, sums)),
                _ => return Err(Errno::EIO),
            }
        }
        Ok(out)
    }

    /// Replays the log (see the module documentation) into memory. Returns what it did,
    /// and the commit it refused if it refused one: then the filesystem holds the
    /// commits before that one and is read-only.
    pub(crate) async fn replay(&self) -> FsResult<(ReplaySummary, Option<RefusedCommit>)> {
        let (start, capacity, epoch, tail) = {
            let c = self.core.lock();
            let l = c.sb.layout;
            (l.log_start, l.log_blocks, c.sb.log_epoch, c.sb.log_tail)
        };
        let found = scan(&self.dev, start, capacity, epoch, tail)
            .await
            .map_err(|e| {
                log::error!(
                    "log replay: {e}; the commits from there on cannot be replayed, so the mount fails rather than drop changes that may have been acknowledged"
                );
                Errno::EIO
            })?;
        let commits = &found.commits;
        // The last commit's data is checked only if it ends the log.
        let verify_last = found.undecodable.is_none();
        let (mut summary, refused) = match self.replay_commits(commits, verify_last).await? {
            Ok(summary) => {
                let refused = found.undecodable.map(|(seq, e)| RefusedCommit {
                    seq,
                    applied: commits.len() as u64,
                    why: Refusal {
                        rule: match e {
                            Corrupt::Truncated => "records cut short",
                            _ => "records that do not decode",
                        },
                        ino: 0,
                        name: None,
                    },
                });
                (summary, refused)
            }
            Err((applied, why)) => {
                // The refused commit may be applied in part, in memory only: start again
                // from the checkpoint and replay the commits before it.
                self.restart_replay().await?;
                let summary = match self.replay_commits(&commits[..applied], false).await? {
                    Ok(s) => s,
                    Err((_, again)) => {
                        log::error!("log replay: a commit refused the second time: {again}");
                        return Err(Errno::EIO);
                    }
                };
                let seq = commits[applied].seq;
                let refused = RefusedCommit {
                    seq,
                    applied: applied as u64,
                    why,
                };
                (summary, Some(refused))
            }
        };
        summary.end = found.end;
        if let Some(r) = &refused {
            log::error!(
                "{r}: no live operation does this, so the commit is forged or written by a bug; the filesystem is mounted read-only as the commits before it left it, and the log is kept whole on the disk (run `ninefold fsck`)"
            );
            let mut c = self.core.lock();
            c.read_only = true;
            c.stats.corruptions += 1;
        }
        if summary.commits > 0 || refused.is_some() {
            log::info!(
                "log replay: {} commits, {} records, {} inodes, {} bytes replayed ({} dropped, {} refused)",
                summary.commits,
                summary.records,
                summary.inodes,
                summary.bytes,
                summary.dropped,
                u64::from(refused.is_some()),
            );
        }
        Ok((summary, refused))
    }

    /// Replays `commits` (the whole log, or those before a refused one): checks and
    /// applies them, then finishes. `Err((i, why))` if commit `i` is refused; the trees
    /// then hold the commits before it and part of it, unfinished.
    async fn replay_commits(
        &self,
        commits: &[LoggedCommit],
        verify_last: bool,
    ) -> FsResult<Result<ReplaySummary, (usize, Refusal)>> {
        let mut summary = ReplaySummary::default();
        let mut r = Replay::default();
        for (i, c) in commits.iter().enumerate() {
            for rec in &c.records {
                if let Record::Csum { disk_block, csums } = rec {
                    r.csums.insert(*disk_block, csums.clone());
                }
            }
            if verify_last && i + 1 == commits.len() {
                match self.check_data(&r, c).await? {
                    DataCheck::Present => {}
                    DataCheck::Unreadable(blocks) => {
                        log::warn!(
                            "log replay: the last commit (sequence {}) has {blocks} data blocks the device cannot read; it is applied (it may have been acknowledged) and reading those blocks gives EIO",
                            c.seq
                        );
                        summary.unverified += 1;
                    }
                    DataCheck::Missing => {
                        log::warn!(
                            "log replay: the last commit (sequence {}) lacks its data on disk; it was never acknowledged and is dropped",
                            c.seq
                        );
                        summary.dropped += 1;
                        break;
                    }
                }
            }
            if let Err(why) = self.apply_commit(&mut r, c, &mut summary).await? {
                return Ok(Err((i, why)));
            }
        }
        self.finish_replay(&r).await?;
        summary.inodes = r.inodes.len() as u64;
        Ok(Ok(summary))
    }

    /// Puts the filesystem back as the checkpoint left it, read-only (nothing was
    /// written since the mount read it).
    async fn restart_replay(&self) -> FsResult<()> {
        {
            let mut c = self.core.lock();
            let (sb, max_links) = (c.sb.clone(), c.max_links);
            *c = crate::core::txn::fresh_core(&self.dev, sb, true, max_links);
        }
        self.load_snapshots().await
    }

    /// Whether every data block the records of `commit` map is on the disk (matches its
    /// logged or committed checksum).
    async fn check_data(&self, r: &Replay, commit: &LoggedCommit) -> FsResult<DataCheck> {
        let mut unreadable = 0;
        for rec in &commit.records {
            let Record::Extents { pieces, .. } = rec else {
                continue;
            };
            for (_, fe) in pieces {
                let sums = match r.csums.get(&fe.disk_block) {
                    Some(s) => s.clone(),
                    None => {
                        let key = Key::new(fe.disk_block, kind::CSUM, 0);
                        let got = self.run(|c| Ok(c.trees.get(TreeId::Csum, &key)?)).await?;
                        match got.as_deref().and_then(decode_csums) {
                            Some(s) => s,
                            None => return Ok(DataCheck::Missing),
                        }
                    }
                };
                let first = fe.offset_blocks as usize;
                let n = fe.num_blocks as usize;
                let Some(want) = sums.get(first..first + n) else {
                    return Ok(DataCheck::Missing);
                };
                let mut buf = vec![0u8; n * BLOCK_SIZE];
                let good = |b: &[u8]| {
                    b.chunks(BLOCK_SIZE)
                        .zip(want)
                        .all(|(block, &sum)| crc32c(block) == sum)
                };
                // Every copy: a crash may have left the last commit's data on one leg
                // of a mirror only, and replay is about to make it part of the trees.
                let checked = self
                    .dev
                    .check_copies(fe.first_block(), &mut buf, good)
                    .await;
                let whole = checked.is_ok();
                // A leg being rebuilt is never read: it gets the good copy as well, or
                // its copy below the rebuild's cursor would stay what the crash left.
                let verified = matches!(checked, Ok(Verified::Good | Verified::Mended));
                if verified && self.dev.rebuilding_copies() != 0 {
                    self.dev
                        .copy_to_rebuilding(fe.first_block(), &buf)
                        .await
                        .map_err(|e| {
                            log::error!("replay: copying data to the leg being rebuilt: {e}");
                            Errno::EIO
                        })?;
                }
                for (i, (b, &c)) in buf.chunks_mut(BLOCK_SIZE).zip(want).enumerate() {
                    // After a failed read, block by block: which ones the device cannot
                    // read, and whether any readable one differs.
                    if !whole && self.dev.read(fe.first_block() + i as u64, b).await.is_err() {
                        unreadable += 1;
                    } else if crc32c(b) != c {
                        return Ok(DataCheck::Missing);
                    }
                }
            }
        }
        Ok(match unreadable {
            0 => DataCheck::Present,
            n => DataCheck::Unreadable(n),
        })
    }

    /// Checks `record` ([`Core::check_record`]) against what replay has made so far.
    async fn check(&self, r: &mut Replay, record: &Record) -> FsResult<Result<(), Refusal>> {
        let Replay { csums, new, .. } = r;
        self.run(|c| settle(c.check_record(record, csums, new)))
            .await
    }

    /// Checks and applies the records of `commit`; a refusal stops it where it is.
    async fn apply_commit(
        &self,
        r: &mut Replay,
        commit: &LoggedCommit,
        summary: &mut ReplaySummary,
    ) -> FsResult<Result<(), Refusal>> {
        // Inodes whose names the commit changes.
        let mut named = BTreeSet::new();
        // Inode items first: names may point to inodes logged later in the commit.
        for rec in &commit.records {
            if let Record::Inode { ino, item } = rec {
                if let Err(why) = self.check(r, rec).await? {
                    return Ok(Err(why));
                }
                self.run(|c| c.replay_inode(*ino, item)).await?;
                r.touched.insert(*ino);
                r.inodes.insert(*ino);
            }
        }
        for rec in &commit.records {
            if matches!(rec, Record::Inode { .. }) {
                continue;
            }
            if let Err(why) = self.check(r, rec).await? {
                return Ok(Err(why));
            }
            match rec {
                Record::Inode { .. } | Record::Csum { .. } => {}
                Record::Names { ino, names } => {
                    let t = self.run(|c| c.replay_names(*ino, names)).await?;
                    named.extend(t.iter().copied());
                    r.touched.extend(t);
                    r.inodes.insert(*ino);
                }
                Record::Xattrs { ino, items } => {
                    self.run(|c| c.replay_xattrs(*ino, items)).await?;
                    r.inodes.insert(*ino);
                }
                Record::Extents {
                    ino,
                    start,
                    end,
                    pieces,
                } => {
                    let refs = self
                        .run(|c| c.replay_extents(*ino, *start, *end, pieces))
                        .await?;
                    for (k, d) in refs {
                        *r.refs.entry(k).or_default() += d;
                    }
                    r.inodes.insert(*ino);
                }
                Record::Symlink { ino, target } => {
                    self.run(|c| c.replay_symlink(*ino, target)).await?;
                    r.inodes.insert(*ino);
                }
                Record::Dentries {
                    dir,
                    entries,
                    removed,
                } => {
                    let t = self
                        .run(|c| c.replay_dentries(*dir, entries, removed))
                        .await?;
                    named.extend(t.iter().copied());
                    r.touched.extend(t);
                    r.inodes.insert(*dir);
                }
            }
        }
        if let Err(why) = self.run(|c| settle(c.check_shape(&named))).await? {
            return Ok(Err(why));
        }
        summary.commits += 1;
        summary.records += commit.records.len() as u64;
        summary.bytes += commit.bytes as u64;
        Ok(Ok(()))
    }

    async fn finish_replay(&self, r: &Replay) -> FsResult<()> {
        let mut added = Vec::new();
        for (&(disk, len), &d) in &r.refs {
            if d != 0
                && self
                    .run(|c| c.replay_refs(disk, len, d, r.csums.get(&disk)))
                    .await?
            {
                added.push((disk, len));
            }
        }
        // Replay finishes once per mount (after a refusal, only the replay of the commits
        // before it finishes): these are the extents the mount serves from the log.
        self.log.lock().replayed_extents = added;
        let mut work: Vec<Ino> = r.touched.iter().copied().collect();
        let mut done = BTreeSet::new();
        while let Some(ino) = work.pop() {
            if done.insert(ino) {
                work.extend(self.run(|c| c.replay_fixup(ino)).await?);
            }
        }
        Ok(())
    }
}

impl Core {
    /// Whether data extent `disk+len` lies in the data area.
    pub(super) fn in_data_area(&self, disk: u64, len: u32) -> bool {
        let l = self.sb.layout;
        let end = disk.checked_add(u64::from(len));
        disk >= l.data_start() && end.is_some_and(|e| e <= l.total_blocks) && len > 0
    }

    fn replay_inode(&mut self, ino: Ino, item: &[u8]) -> Step<()> {
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
    fn txn_for(&mut self, ino: Ino) -> Step<Option<Txn>> {
        let tx = Txn::unlimited();
        Ok(self.exists(&tx, ino)?.then_some(tx))
    }

    fn exists(&mut self, tx: &Txn, ino: Ino) -> Step<bool> {
        Ok(tx.get(self, TreeId::Fs, &inode_key(ino))?.is_some())
    }

    /// Removes the entry `name` of `dir` if it names `ino` (any inode if `None`): the
    /// hashed entry, the index entry and the inode's back-reference. Returns the inode
    /// that lost the name.
    fn unbind(
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
    fn bind(
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
    fn replay_names(&mut self, ino: Ino, names: &[LoggedName]) -> Step<Vec<Ino>> {
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
    fn replay_xattrs(&mut self, ino: Ino, items: &[(u8, u64, Vec<u8>)]) -> Step<()> {
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
    fn replay_extents(
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

    fn replay_symlink(&mut self, ino: Ino, target: &[u8]) -> Step<()> {
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
    fn replay_dentries(
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
    fn replay_refs(&mut self, disk: u64, len: u32, d: i64, sums: Option<&Vec<u32>>) -> Step<bool> {
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
    fn replay_fixup(&mut self, ino: Ino) -> Step<Vec<Ino>> {
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
