//! Building an fsync's records, under the core lock, into a buffer reserved before it.
//!
//! Starting from the fsynced inode, a worklist visits every inode the contract needs:
//!
//! - the **target**: logged if it changed since it was last logged (or is not in the
//!   committed checkpoint at all): its inode item, xattrs if they changed, names if they
//!   changed (not for `fdatasync` of an inode the checkpoint has), the file blocks whose
//!   mapping changed with the checksums of the extents they use, a new symlink's target;
//!   for a directory also its new entries and the names it lost;
//! - **ancestors**: the parent of every name logged, up to the root. An ancestor that is
//!   new or was renamed since is logged the same way (its names make the path);
//! - **conflicts**: an inode whose entry was removed from a directory in which a logged
//!   name now lives, under the same name, and which still has names elsewhere: replay
//!   drops its old entry, so its current names are logged too (else a rename followed by
//!   a new file under the old name would lose the renamed file);
//! - **children** of an fsynced directory that are new or were moved in.
//!
//! Whatever inode is logged is logged whole (every unlogged change), so a record never
//! pairs new metadata with old data. The build has no side effects until it has
//! succeeded; then it clears the marks it logged and appends the buffer to the open
//! batch, under the log lock, before the core lock is released (so records of one inode
//! are appended in the order they were built).

use alloc::vec;
use alloc::vec::Vec;
use spin::Mutex;

use crate::core::track::{Changes, View};
use crate::format::items::{decode_dir_entries, DirIndexRec, InodeItem, InodeRefRec};
use crate::format::key::kind;
use crate::format::log::{put_name, rec, RecordWriter};
use crate::format::{Key, TreeId};
use crate::synclog::LogState;
use crate::util::scratch::Scratch;
use vfs::{Errno, FileType, Ino, ROOT_INO};

pub use crate::core::counters::Fallback;
use crate::core::txn::{Core, Step, Stop, Txn};

/// Most inodes one sync may log before it falls back to a checkpoint.
const MAX_INODES: usize = 256;

/// What building found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Built {
    /// Records were appended to batch `.0`: the sync is done when it is durable.
    Appended(u64),
    /// Nothing to log; the sync is done when batch `.0` is durable (0: at once).
    Clean(u64),
    /// The reserved buffer is too small: this many bytes are needed.
    NeedScratch(usize),
    /// Some changes belong to the checkpoint in flight: wait for it and try again.
    WaitCheckpoint,
    /// Not logged: run a checkpoint.
    Fallback(Fallback),
}

/// Why an inode is visited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Target { datasync: bool },
    Ancestor,
    Conflict,
    Child,
}

/// An inode the build logged, for the side effects on success.
#[derive(Debug)]
struct Logged {
    ino: Ino,
    /// Its names were dirty but not logged (fdatasync).
    names_left: bool,
    /// Its new entries were logged.
    entries: bool,
    /// What an xattr search found out (`Some(true)`: none).
    no_xattrs: Option<bool>,
}

/// Counters of one build, added on success.
#[derive(Debug, Default)]
struct Tally {
    records: u64,
    csum_lookups: u64,
    csum_skipped: u64,
    csum_dedups: u64,
    xattr_searches: u64,
    xattr_skipped: u64,
}

/// One build's working state.
struct Build<'a> {
    scratch: &'a mut Scratch,
    log: &'a Mutex<LogState>,
    cur: u64,
    committed: u64,
    work: Vec<(Ino, Why)>,
    seen: Vec<Ino>,
    logged: Vec<Logged>,
    /// Extents whose checksums this build logs.
    csums: Vec<u64>,
    /// Of those, the ones to add to the log's checksum index.
    indexed: Vec<u64>,
    wait: u64,
    tally: Tally,
}

impl Core {
    /// Builds the records an `fsync` (or `fdatasync`) of `target` needs into `scratch`
    /// and, if that succeeds, appends them to the open batch of `log`.
    pub fn build_log(
        &mut self,
        target: Ino,
        datasync: bool,
        scratch: &mut Scratch,
        log: &Mutex<LogState>,
    ) -> Step<Built> {
        scratch.clear();
        if self.inode(target)?.nlink == 0 {
            // Unlinked (open) files are gone after a crash whatever we write.
            return Ok(Built::Clean(0));
        }
        let mut b = Build {
            scratch,
            log,
            cur: self.seq,
            committed: self.committed_seq,
            work: vec![(target, Why::Target { datasync })],
            seen: Vec::new(),
            logged: Vec::new(),
            csums: Vec::new(),
            indexed: Vec::new(),
            wait: 0,
            tally: Tally::default(),
        };
        while let Some((ino, why)) = b.work.pop() {
            if b.seen.contains(&ino) {
                continue;
            }
            b.seen.push(ino);
            if b.seen.len() > MAX_INODES {
                return Ok(Built::Fallback(Fallback::TooManyInodes));
            }
            if let Some(out) = self.visit(&mut b, ino, why)? {
                return Ok(out);
            }
        }
        let max = b.log.lock().max_record();
        if b.scratch.needed() > max {
            return Ok(Built::Fallback(Fallback::RecordTooLarge));
        }
        if b.scratch.overflowed() {
            return Ok(Built::NeedScratch(b.scratch.needed()));
        }
        Ok(self.finish(b))
    }

    /// Visits one inode; `Some` ends the build early.
    fn visit(&mut self, b: &mut Build<'_>, ino: Ino, why: Why) -> Step<Option<Built>> {
        let item = match self.inode(ino) {
            Ok(i) => i,
            Err(Stop::Errno(Errno::ENOENT)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let (changes, in_log, batch, reflinked) = match self.inodes.get(&ino) {
            Some(st) => {
                let changes = match st.log.changes.view(b.cur, b.committed) {
                    View::Wait => return Ok(Some(Built::WaitCheckpoint)),
                    View::Covered => Changes::default(),
                    View::Dirty(c) => c.clone(),
                };
                let reflinked = st.last_reflink_trans > b.committed;
                (changes, st.log.in_log, st.log.batch, reflinked)
            }
            None => (Changes::default(), false, 0, false),
        };
        b.wait = b.wait.max(batch);
        let is_new = item.generation > b.committed && !in_log;
        let is_dir = item.is_dir();
        let (log_it, want_names) = match why {
            Why::Target { datasync } => {
                (is_new || !changes.is_empty(), is_dir || !datasync || is_new)
            }
            Why::Ancestor | Why::Conflict | Why::Child => (is_new || changes.names, true),
        };
        let names = if want_names {
            self.names_of(&Txn::new(), ino)?
        } else {
            Vec::new()
        };
        if log_it {
            let names_logged = want_names && (is_new || changes.names);
            let no_xattrs = self.log_inode(b, ino, &item, &changes, is_new, reflinked)?;
            if names_logged {
                if let Some(out) = self.log_names(b, ino, &item, &names)? {
                    return Ok(Some(out));
                }
            }
            b.logged.push(Logged {
                ino,
                names_left: changes.names && !names_logged,
                entries: false,
                no_xattrs,
            });
        }
        if is_dir && matches!(why, Why::Target { .. }) {
            if let Some(out) = self.log_entries(b, ino)? {
                return Ok(Some(out));
            }
        }
        // The path: every parent, up to the root (an unchanged ancestor may still have a
        // renamed one above it).
        let walk_up = match why {
            Why::Target { .. } | Why::Ancestor => want_names,
            Why::Conflict | Why::Child => log_it,
        };
        if walk_up {
            // Many names may share a parent: queue each parent once.
            let mut parents: Vec<Ino> = names.iter().map(|r| r.parent).collect();
            parents.sort_unstable();
            parents.dedup();
            for parent in parents {
                if parent != ROOT_INO {
                    b.work.push((parent, Why::Ancestor));
                }
            }
        }
        Ok(None)
    }

    /// Logs `ino`'s inode item, changed xattrs, changed file blocks and (if new) symlink
    /// target. Returns what an xattr search found.
    fn log_inode(
        &mut self,
        b: &mut Build<'_>,
        ino: Ino,
        item: &InodeItem,
        changes: &Changes,
        is_new: bool,
        reflinked: bool,
    ) -> Step<Option<bool>> {
        let mut w = RecordWriter::begin(b.scratch, rec::INODE);
        w.buf().u64(ino).bytes(&item.encode());
        w.end();
        b.tally.records += 1;
        let mut no_xattrs = None;
        if is_new || changes.xattrs {
            let known_none = self.inodes.get(&ino).is_some_and(|s| s.no_xattrs);
            if known_none {
                // NO_XATTRS: no search. A new inode has none in the checkpoint either,
                // so there is nothing to delete at replay.
                b.tally.xattr_skipped += 1;
                if !is_new {
                    let mut w = RecordWriter::begin(b.scratch, rec::XATTRS);
                    w.buf().u64(ino).u32(0);
                    w.end();
                    b.tally.records += 1;
                }
            } else {
                b.tally.xattr_searches += 1;
                let found = self.log_xattrs(b, ino)?;
                no_xattrs = Some(found == 0);
            }
        }
        if item.file_type() == Some(FileType::Regular) {
            for r in changes.extents.iter() {
                self.log_extents(b, ino, r.start, r.end, reflinked)?;
            }
        }
        if is_new && item.file_type() == Some(FileType::Symlink) {
            let start = b.scratch.len();
            let mut w = RecordWriter::begin(b.scratch, rec::SYMLINK);
            w.buf().u64(ino).u32(item.size as u32);
            let mut len = 0u64;
            self.trees.range(
                TreeId::Fs,
                Key::new(ino, kind::SYMLINK, 0),
                Key::new(ino, kind::SYMLINK, u64::MAX),
                |_, v| {
                    w.buf().bytes(v);
                    len += v.len() as u64;
                    true
                },
            )?;
            w.end();
            if len != item.size {
                b.scratch.truncate(start);
                return Err(Stop::Corrupt("symlink target length"));
            }
            b.tally.records += 1;
        }
        Ok(no_xattrs)
    }

    /// Logs every xattr item of `ino`; returns how many xattr names it has.
    fn log_xattrs(&mut self, b: &mut Build<'_>, ino: Ino) -> Step<usize> {
        let at = b.scratch.len();
        let mut w = RecordWriter::begin(b.scratch, rec::XATTRS);
        w.buf().u64(ino).u32(0);
        let mut n = 0u32;
        let mut names = 0usize;
        self.trees.range(
            TreeId::Fs,
            Key::new(ino, kind::XATTR, 0),
            Key::new(ino, kind::XATTR_CHUNK, u64::MAX),
            |k, v| {
                w.buf()
                    .u8(k.kind)
                    .u64(k.offset)
                    .u32(v.len() as u32)
                    .bytes(v);
                n += 1;
                names += usize::from(k.kind == kind::XATTR);
                true
            },
        )?;
        w.end();
        // The count sits after the record header and the inode number.
        b.scratch.patch(
            at + crate::format::log::RECORD_HEADER_LEN + 8,
            &n.to_le_bytes(),
        );
        b.tally.records += 1;
        Ok(names)
    }

    /// Logs the mapping of file blocks `start..end` of `ino` and the checksums of the
    /// extents it uses.
    fn log_extents(
        &mut self,
        b: &mut Build<'_>,
        ino: Ino,
        start: u64,
        end: u64,
        reflinked: bool,
    ) -> Step<()> {
        let found = self.extents_in(ino, start, end, usize::MAX)?;
        let mut w = RecordWriter::begin(b.scratch, rec::EXTENTS);
        w.buf().u64(ino).u64(start).u64(end).u32(found.len() as u32);
        let mut disks = Vec::new();
        for (fb, fe) in &found {
            let s = (*fb).max(start);
            let e = (fb + u64::from(fe.num_blocks)).min(end);
            let piece = crate::format::items::FileExtent {
                offset_blocks: fe.offset_blocks + (s - fb) as u32,
                num_blocks: (e - s) as u32,
                ..*fe
            };
            w.buf().u64(s).bytes(&piece.encode());
            disks.push(fe.disk_block);
        }
        w.end();
        b.tally.records += 1;
        for disk in disks {
            if b.csums.contains(&disk) {
                continue;
            }
            if reflinked {
                // Extents of this inode became shared since the last checkpoint: another
                // inode's record may hold these checksums already.
                b.tally.csum_lookups += 1;
                if b.log.lock().has_csum(disk) {
                    b.tally.csum_dedups += 1;
                    continue;
                }
                b.indexed.push(disk);
            } else {
                // `last_reflink_trans`: nothing shared since the checkpoint, so no other
                // record can hold these checksums; skip the shared index.
                b.tally.csum_skipped += 1;
            }
            b.csums.push(disk);
            let sums = self
                .trees
                .get(TreeId::Csum, &Key::new(disk, kind::CSUM, 0))?
                .ok_or(Stop::Corrupt("data extent without checksums"))?;
            let mut w = RecordWriter::begin(b.scratch, rec::CSUM);
            w.buf().u64(disk).u32((sums.len() / 4) as u32).bytes(&sums);
            w.end();
            b.tally.records += 1;
        }
        Ok(())
    }

    /// Logs all names of `ino`, and queues the inodes whose old entries they replace.
    fn log_names(
        &mut self,
        b: &mut Build<'_>,
        ino: Ino,
        item: &InodeItem,
        names: &[InodeRefRec],
    ) -> Step<Option<Built>> {
        let ft = item.file_type().ok_or(Stop::Corrupt("inode type"))?;
        let mut w = RecordWriter::begin(b.scratch, rec::NAMES);
        w.buf().u64(ino).u32(names.len() as u32);
        for r in names {
            w.buf().u64(r.parent).u64(r.index).u8(ft.dirent_type());
            put_name(w.buf(), &r.name);
        }
        w.end();
        b.tally.records += 1;
        for r in names {
            let hash = self.name_hash(&r.name);
            let Some(out) = self.conflicts(b, r.parent, Some((hash, ino)))? else {
                return Ok(Some(Built::Fallback(Fallback::RemovedOverflow)));
            };
            for y in out {
                b.work.push((y, Why::Conflict));
            }
        }
        // Names it lost: replay removes them, so whoever holds such a name now (a rename
        // over it) must have its names logged too, or the rename shows half done.
        let lost: Vec<(u64, Ino)> = match self.inodes.get(&ino) {
            None => Vec::new(),
            Some(st) => match st.log.lost.since(b.committed) {
                None => return Ok(Some(Built::Fallback(Fallback::RemovedOverflow))),
                Some(it) => it.collect(),
            },
        };
        for (hash, dir) in lost {
            let key = Key::new(dir, kind::DIR_ENTRY, hash);
            if let Some(v) = self.trees.get(TreeId::Fs, &key)? {
                let list =
                    decode_dir_entries(&v).ok_or(Stop::Corrupt("undecodable directory entry"))?;
                for e in list.into_iter().filter(|e| e.ino != ino) {
                    b.work.push((e.ino, Why::Conflict));
                }
            }
        }
        Ok(None)
    }

    /// Inodes removed from `dir` since the checkpoint (with name hash `only.0`, other
    /// than `only.1`, if given) that still have names: replay drops their old entries,
    /// so their names must be logged. A removed directory that is gone had entries in
    /// the checkpoint that replay drops with it; its removed inodes count too. `None` if
    /// a directory lost too many names to know.
    fn conflicts(
        &mut self,
        b: &Build<'_>,
        dir: Ino,
        only: Option<(u64, Ino)>,
    ) -> Step<Option<Vec<Ino>>> {
        let mut out = Vec::new();
        let mut dirs = vec![(dir, only)];
        let mut visited = Vec::new();
        while let Some((d, only)) = dirs.pop() {
            if visited.contains(&d) || visited.len() > MAX_INODES {
                continue;
            }
            visited.push(d);
            let removed: Vec<(u64, Ino)> = match self.inodes.get(&d) {
                None => Vec::new(),
                Some(st) => match st.log.removed.since(b.committed) {
                    None => return Ok(None),
                    Some(it) => it.collect(),
                },
            };
            for (hash, y) in removed {
                if only.is_some_and(|(h, x)| h != hash || x == y) {
                    continue;
                }
                match self.inode(y) {
                    Ok(i) if i.nlink > 0 => out.push(y),
                    Ok(_) => {}
                    // Gone: if it was a directory, what it held goes with it.
                    Err(Stop::Errno(Errno::ENOENT)) => dirs.push((y, None)),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Some(out))
    }

    /// Directory fsync: logs the entries `dir` gained and the names it lost since they
    /// were last logged, and queues the children that need their names logged.
    fn log_entries(&mut self, b: &mut Build<'_>, dir: Ino) -> Step<Option<Built>> {
        let first = match self.inodes.get(&dir) {
            None => None,
            Some(st) => match st.log.entries.view(b.cur, b.committed) {
                View::Wait => return Ok(Some(Built::WaitCheckpoint)),
                View::Covered => None,
                View::Dirty(e) => e.first_index,
            },
        };
        let removed: Vec<(u64, Ino)> = match self.inodes.get(&dir) {
            None => Vec::new(),
            Some(st) => match st.log.removed.since(b.committed) {
                None => return Ok(Some(Built::Fallback(Fallback::RemovedOverflow))),
                Some(it) => it.collect(),
            },
        };
        if first.is_none() && removed.is_empty() {
            return Ok(None);
        }
        let mut entries: Vec<(u64, DirIndexRec)> = Vec::new();
        if let Some(first) = first {
            let mut corrupt = false;
            self.trees.range(
                TreeId::Fs,
                Key::new(dir, kind::DIR_INDEX, first),
                Key::new(dir, kind::DIR_INDEX, u64::MAX),
                |k, v| {
                    match DirIndexRec::decode(v) {
                        Some(e) => entries.push((k.offset, e)),
                        None => corrupt = true,
                    }
                    !corrupt
                },
            )?;
            if corrupt {
                return Err(Stop::Corrupt("undecodable directory index"));
            }
        }
        let mut w = RecordWriter::begin(b.scratch, rec::DENTRIES);
        w.buf().u64(dir).u32(entries.len() as u32);
        for (index, e) in &entries {
            w.buf().u64(*index).u64(e.ino).u8(e.file_type.dirent_type());
            put_name(w.buf(), &e.name);
        }
        w.buf().u32(removed.len() as u32);
        for (hash, ino) in &removed {
            w.buf().u64(*hash).u64(*ino);
        }
        w.end();
        b.tally.records += 1;
        if let Some(l) = b.logged.iter_mut().find(|l| l.ino == dir) {
            l.entries = true;
        } else {
            b.logged.push(Logged {
                ino: dir,
                names_left: false,
                entries: true,
                no_xattrs: None,
            });
        }
        for (_, e) in &entries {
            b.work.push((e.ino, Why::Child));
        }
        let Some(linked) = self.conflicts(b, dir, None)? else {
            return Ok(Some(Built::Fallback(Fallback::RemovedOverflow)));
        };
        for y in linked {
            b.work.push((y, Why::Conflict));
        }
        Ok(None)
    }

    /// Success: clears what was logged and appends the records to the open batch.
    fn finish(&mut self, b: Build<'_>) -> Built {
        let (cur, committed) = (b.cur, b.committed);
        let mut log = b.log.lock();
        let batch = if !b.scratch.is_empty() {
            log.append(core::mem::take(b.scratch).into_vec())
        } else {
            0
        };
        for d in &b.indexed {
            log.note_csum(*d);
        }
        let s = &mut log.stats;
        s.records += b.tally.records;
        s.inodes += b.logged.len() as u64;
        s.csum_lookups += b.tally.csum_lookups;
        s.csum_lookups_skipped += b.tally.csum_skipped;
        s.csum_dedups += b.tally.csum_dedups;
        s.xattr_searches += b.tally.xattr_searches;
        s.xattr_searches_skipped += b.tally.xattr_skipped;
        drop(log);
        for l in &b.logged {
            let st = self.state(l.ino);
            st.log.changes.logged(cur);
            if l.names_left {
                st.log.changes.mark(cur, committed).names = true;
            }
            if l.entries {
                st.log.entries.logged(cur);
            }
            if let Some(none) = l.no_xattrs {
                st.no_xattrs = none;
            }
            st.log.in_log = true;
            st.logged_trans = cur;
            if batch != 0 {
                st.log.batch = batch;
            }
        }
        if batch != 0 {
            Built::Appended(batch)
        } else {
            Built::Clean(b.wait)
        }
    }
}
