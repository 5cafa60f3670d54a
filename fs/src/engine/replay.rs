//! Log replay at mount, over the engine: scanning, checking and applying the commits
//! (`synclog::replay` has the steps and the rules, see its documentation).

use alloc::collections::BTreeSet;
use alloc::vec;
use alloc::vec::Vec;

use crate::engine::Engine;
use crate::format::items::decode_csums;
use crate::format::key::kind;
use crate::format::log::Record;
use crate::format::{Corrupt, Key, TreeId, BLOCK_SIZE};
use crate::io::Verified;
use crate::synclog::replay::*;
use crate::synclog::rules::settle;
use crate::util::crc::crc32c;
use block::BlockDevice;
use vfs::{Errno, FsResult, Ino};

impl<D: BlockDevice> Engine<D> {
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
    ///
    /// `reload` loads again, after a restart from the checkpoint, what the allocator
    /// must hold for the snapshots (the features' part of a mount).
    pub(crate) async fn replay(
        &self,
        reload: impl AsyncFn() -> FsResult<()>,
    ) -> FsResult<(ReplaySummary, Option<RefusedCommit>)> {
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
                self.restart_replay();
                reload().await?;
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
    /// written since the mount read it); the caller then loads again what the allocator
    /// must hold for the snapshots.
    fn restart_replay(&self) {
        let mut c = self.core.lock();
        let (sb, max_links) = (c.sb.clone(), c.max_links);
        *c = crate::core::txn::fresh_core(&self.dev, sb, true, max_links);
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
