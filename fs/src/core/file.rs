//! File data: extents, reads, copy-on-write writes, truncation, clones, and freeing an
//! inode's data.
//!
//! Data is never overwritten in place. A write reserves fresh blocks, writes them (with
//! no lock held; partial head and tail blocks are read, merged and rewritten), then one
//! transaction points the file's range at them, adjusts the reference counts of the
//! extents it replaced (freeing those that reach zero) and records the new blocks'
//! checksums. Bytes past a file's size inside its last block are always zero.

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use crate::core::txn::{Core, Step, Stop, Txn};
use crate::format::items::{decode_csums, encode_csums, ExtentItem, FileExtent, InodeItem};
use crate::format::key::kind;
use crate::format::{Key, TreeId, BLOCK_SIZE};
use crate::util::crc::crc32c;
use vfs::{Errno, FileType, Ino, Timespec};

pub(crate) const BS: u64 = BLOCK_SIZE as u64;
/// Extent items changed per transaction when trimming, deleting or cloning, so one
/// transaction never needs more than a few leaves in memory.
pub(crate) const BATCH: usize = 64;
/// Largest write handled in one transaction.
pub(crate) const WRITE_CHUNK: usize = 4 << 20;
/// Fills of the data cache a read waits for (each ended without the blocks it wanted:
/// failed, or spoiled by a write) before it reads past the cache.
pub(crate) const MAX_FILL_WAITS: usize = 8;

/// The key of the file extent item of `ino` starting at file block `block`.
pub(crate) fn extent_key(ino: Ino, block: u64) -> Key {
    Key::new(ino, kind::EXTENT_DATA, block.saturating_mul(BS))
}

/// Changes of reference counts per data extent `(first block, blocks)`.
pub(crate) type RefChanges = BTreeMap<(u64, u32), i64>;

/// One piece of a read plan: file blocks `file_block..+len` live at `disk_block..`, with
/// these checksums (or are a hole when `disk_block` is 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) file_block: u64,
    pub(crate) len: u64,
    pub(crate) disk_block: u64,
    pub(crate) csums: Vec<u32>,
}

/// Adds `delta` bytes to the data an inode references.
pub(crate) fn add_bytes(item: &mut InodeItem, delta: i64) {
    item.bytes = item.bytes.saturating_add_signed(delta);
}

/// Records a content change made in checkpoint interval `seq`: referenced bytes by
/// `delta`, mtime and ctime to `now`.
pub(crate) fn content_changed(item: &mut InodeItem, delta: i64, now: Timespec, seq: u64) {
    add_bytes(item, delta);
    item.mtime = now;
    item.ctime = now;
    item.transid = seq;
}

/// Fails unless `item` is a regular file (`EISDIR` for directories, else `EINVAL`).
pub(crate) fn regular(item: &InodeItem) -> Step<()> {
    match item.file_type() {
        Some(FileType::Regular) => Ok(()),
        Some(FileType::Directory) => Err(Errno::EISDIR.into()),
        _ => Err(Errno::EINVAL.into()),
    }
}

impl Core {
    /// File extents overlapping blocks `b0..b1`, at most `limit`, in order.
    pub(crate) fn extents_in(
        &mut self,
        ino: Ino,
        b0: u64,
        b1: u64,
        limit: usize,
    ) -> Step<Vec<(u64, FileExtent)>> {
        let mut out = Vec::new();
        if b0 >= b1 {
            return Ok(out);
        }
        let layout = self.sb.layout;
        // Every extent a file maps lies in the data area: what is read, written over
        // or freed through one is never a fixed region or past the end.
        let decode = |k: &Key, v: &[u8]| {
            FileExtent::decode(v).filter(|fe| {
                let end = fe.disk_block + u64::from(fe.disk_blocks); // no wrap: decoded
                k.offset.is_multiple_of(BS) && layout.is_data_area(fe.disk_block, end)
            })
        };
        if let Some((k, v)) = self.trees.get_le(TreeId::Fs, &extent_key(ino, b0))? {
            if k.objectid == ino && k.kind == kind::EXTENT_DATA {
                let fe = decode(&k, &v).ok_or(Stop::Corrupt("undecodable file extent"))?;
                let fb = k.offset / BS;
                if fb + u64::from(fe.num_blocks) > b0 {
                    out.push((fb, fe));
                }
            }
        }
        let mut corrupt = false;
        let from = extent_key(ino, b0).successor().expect("not the last key");
        let to = Key::new(
            ino,
            kind::EXTENT_DATA,
            b1.saturating_mul(BS).saturating_sub(1),
        );
        if from <= to && out.len() < limit {
            self.trees.range(TreeId::Fs, from, to, |k, v| {
                match decode(&k, v) {
                    Some(fe) => out.push((k.offset / BS, fe)),
                    None => corrupt = true,
                }
                !corrupt && out.len() < limit
            })?;
        }
        if corrupt {
            return Err(Stop::Corrupt("undecodable file extent"));
        }
        Ok(out)
    }

    /// Replaces blocks `b0..b1` of `ino` by `pieces` (file block, extent), adjusting
    /// reference counts; returns the change in referenced blocks.
    pub(crate) fn replace_range(
        &mut self,
        tx: &mut Txn,
        ino: Ino,
        b0: u64,
        b1: u64,
        pieces: &[(u64, FileExtent)],
    ) -> Step<i64> {
        let (delta, refs) = self.edit_extents(tx, ino, b0, b1, pieces)?;
        for ((disk, len), d) in refs {
            self.change_refs(tx, ino, disk, len, d)?;
        }
        Ok(delta)
    }

    /// The file-extent half of [`Core::replace_range`]: maps blocks `b0..b1` of `ino`
    /// exactly by `pieces` (splitting extents that cross the edges) and returns the change
    /// in referenced bytes and the change in references per data extent
    /// `(disk block, blocks)`. Log replay applies the reference changes itself.
    pub(crate) fn edit_extents(
        &mut self,
        tx: &mut Txn,
        ino: Ino,
        b0: u64,
        b1: u64,
        pieces: &[(u64, FileExtent)],
    ) -> Step<(i64, RefChanges)> {
        tx.mark_extents(ino, b0..b1);
        let old = self.extents_in(ino, b0, b1, usize::MAX)?;
        let mut refs = RefChanges::new();
        let mut delta = 0i64;
        for (fb, fe) in old {
            let end = fb + u64::from(fe.num_blocks);
            tx.del(TreeId::Fs, extent_key(ino, fb));
            *refs.entry((fe.disk_block, fe.disk_blocks)).or_default() -= 1;
            delta -= i64::from(fe.num_blocks);
            if fb < b0 {
                let left = FileExtent {
                    num_blocks: (b0 - fb) as u32,
                    ..fe
                };
                tx.put(TreeId::Fs, extent_key(ino, fb), left.encode());
                *refs.entry((fe.disk_block, fe.disk_blocks)).or_default() += 1;
                delta += i64::from(left.num_blocks);
            }
            if end > b1 {
                let right = FileExtent {
                    offset_blocks: fe.offset_blocks + (b1 - fb) as u32,
                    num_blocks: (end - b1) as u32,
                    ..fe
                };
                tx.put(TreeId::Fs, extent_key(ino, b1), right.encode());
                *refs.entry((fe.disk_block, fe.disk_blocks)).or_default() += 1;
                delta += i64::from(right.num_blocks);
            }
        }
        for (fb, fe) in pieces {
            tx.put(TreeId::Fs, extent_key(ino, *fb), fe.encode());
            *refs.entry((fe.disk_block, fe.disk_blocks)).or_default() += 1;
            delta += i64::from(fe.num_blocks);
        }
        refs.retain(|_, d| *d != 0);
        Ok((delta * BS as i64, refs))
    }

    /// Changes the reference count of data extent `disk+len` by `d`; an extent left
    /// without references is freed with its checksums.
    pub(crate) fn change_refs(
        &mut self,
        tx: &mut Txn,
        ino: Ino,
        disk: u64,
        len: u32,
        d: i64,
    ) -> Step<()> {
        let key = Key::new(disk, kind::EXTENT, u64::from(len));
        let cur = match tx.get(self, TreeId::Extent, &key)? {
            Some(b) => {
                ExtentItem::decode(&b)
                    .ok_or(Stop::Corrupt("undecodable extent item"))?
                    .refs
            }
            None => 0,
        };
        let now = i64::from(cur) + d;
        if now < 0 {
            return Err(Stop::Corrupt("extent reference count below zero"));
        }
        if now == 0 {
            tx.del(TreeId::Extent, key);
            tx.del(TreeId::Csum, Key::new(disk, kind::CSUM, 0));
            tx.frees.push(disk..disk + u64::from(len));
        } else {
            let owner = if cur == 0 { ino } else { 0 };
            tx.put(
                TreeId::Extent,
                key,
                ExtentItem {
                    refs: now as u32,
                    owner,
                }
                .encode(),
            );
        }
        Ok(())
    }

    /// Removes up to [`BATCH`] extents at or after block `from`; returns whether nothing
    /// is left there.
    pub(crate) fn trim_step(&mut self, ino: Ino, from: u64) -> Step<bool> {
        let found = self.extents_in(ino, from, u64::MAX / BS, BATCH)?;
        if found.is_empty() {
            return Ok(true);
        }
        let done = found.len() < BATCH;
        let to = if done {
            u64::MAX / BS
        } else {
            let (fb, fe) = found.last().expect("not empty");
            fb + u64::from(fe.num_blocks)
        };
        let mut tx = Txn::new();
        let delta = self.replace_range(&mut tx, ino, from, to, &[])?;
        let mut item = tx.inode(self, ino)?;
        add_bytes(&mut item, delta);
        tx.put_inode(ino, &item);
        self.commit(tx)?;
        Ok(done)
    }

    /// A plan to read blocks `b0..b1` of `ino`.
    pub(crate) fn read_plan(&mut self, ino: Ino, b0: u64, b1: u64) -> Step<Vec<Piece>> {
        let mut out = Vec::new();
        for (fb, fe) in self.extents_in(ino, b0, b1, usize::MAX)? {
            let start = fb.max(b0);
            let end = (fb + u64::from(fe.num_blocks)).min(b1);
            let skip = start - fb;
            let ckey = Key::new(fe.disk_block, kind::CSUM, 0);
            let all = self
                .trees
                .get(TreeId::Csum, &ckey)?
                .ok_or(Stop::Corrupt("data extent without checksums"))?;
            let all = decode_csums(&all).ok_or(Stop::Corrupt("undecodable checksum item"))?;
            let first = fe.offset_blocks as usize + skip as usize;
            let csums = all
                .get(first..first + (end - start) as usize)
                .ok_or(Stop::Corrupt("checksum item shorter than its extent"))?
                .to_vec();
            out.push(Piece {
                file_block: start,
                len: end - start,
                disk_block: fe.disk_block + u64::from(fe.offset_blocks) + skip,
                csums,
            });
        }
        Ok(out)
    }
}

/// Whether every 4 KiB block of `buf` has its checksum in `csums`.
pub(crate) fn blocks_match(buf: &[u8], csums: &[u32]) -> bool {
    buf.chunks(BLOCK_SIZE)
        .zip(csums)
        .all(|(block, &sum)| crc32c(block) == sum)
}

/// Where the blocks of a [`Piece`] being read go: block `i` of the piece belongs at byte
/// `at + i * BLOCK_SIZE` of `out` (`at` is negative for a read that starts inside the
/// piece's first block), and only the part of it inside `out` is kept.
pub(crate) struct Dest<'a> {
    pub(crate) out: &'a mut [u8],
    pub(crate) at: i128,
}

impl Dest<'_> {
    /// Where in `out` block `i` starts.
    pub(crate) fn start(&self, i: usize) -> i128 {
        self.at + (i * BLOCK_SIZE) as i128
    }

    /// Copies `data`, blocks `i..` of the piece, where they belong.
    pub(crate) fn put(&mut self, i: usize, data: &[u8]) {
        let start = self.start(i);
        let from = start.max(0);
        let to = (start + data.len() as i128).min(self.out.len() as i128);
        if from < to {
            self.out[from as usize..to as usize]
                .copy_from_slice(&data[(from - start) as usize..(to - start) as usize]);
        }
    }

    /// The part of `out` blocks `i..i + n` fill, if they fall whole inside it.
    pub(crate) fn whole(&mut self, i: usize, n: usize) -> Option<&mut [u8]> {
        let start = self.start(i);
        let end = start + (n * BLOCK_SIZE) as i128;
        (start >= 0 && end <= self.out.len() as i128)
            .then(|| &mut self.out[start as usize..end as usize])
    }
}

/// Inodes known to have nothing past their end of file since mount, so that a write need
/// not look ([`Engine::trim_past_eof`](crate::engine::Engine::trim_past_eof)): only a cut of the size leaves blocks there until
/// its last step (and a crash or a failed device can stop it before that), and inode
/// numbers are never reused. A direct-mapped table of [`TRIMMED_SLOTS`] inodes: a
/// collision only costs the look. On the heap: the filesystem is moved by value while it
/// mounts, on a kernel stack.
#[derive(Debug)]
pub(crate) struct TrimmedInodes(Vec<Ino>);

/// The inodes [`TrimmedInodes`] remembers at most.
pub(crate) const TRIMMED_SLOTS: usize = 256;

impl Default for TrimmedInodes {
    fn default() -> Self {
        // 0 is no inode.
        TrimmedInodes(vec![0; TRIMMED_SLOTS])
    }
}

impl TrimmedInodes {
    pub(crate) fn slot(ino: Ino) -> usize {
        (ino % TRIMMED_SLOTS as u64) as usize
    }

    pub(crate) fn contains(&self, ino: Ino) -> bool {
        self.0[Self::slot(ino)] == ino
    }

    pub(crate) fn insert(&mut self, ino: Ino) {
        self.0[Self::slot(ino)] = ino;
    }

    pub(crate) fn forget(&mut self, ino: Ino) {
        if self.contains(ino) {
            self.0[Self::slot(ino)] = 0;
        }
    }
}

/// What a write found and reserved.
pub(crate) struct WritePlan {
    /// Partially overwritten blocks with old data: (index in the new extent, piece).
    pub(crate) old: Vec<(usize, Piece)>,
    /// Reserved runs for the new data.
    pub(crate) runs: Vec<Range<u64>>,
}

/// A copy of a file's last block with its tail past a truncation zeroed, written to a new
/// block ([`Engine::zero_tail`](crate::engine::Engine::zero_tail)).
pub(crate) struct ZeroedTail {
    /// The file block it replaces.
    pub(crate) block_no: u64,
    /// The new block.
    pub(crate) run: Range<u64>,
    /// Its checksum.
    pub(crate) csum: u32,
}

impl ZeroedTail {
    /// Maps the new block in place of the file's block, with its checksum, in `tx`.
    /// Returns the change in the file's bytes.
    pub(crate) fn map_into(&self, c: &mut Core, tx: &mut Txn, ino: Ino) -> Result<i64, Stop> {
        let fe = FileExtent {
            disk_block: self.run.start,
            disk_blocks: 1,
            offset_blocks: 0,
            num_blocks: 1,
        };
        tx.put(
            TreeId::Csum,
            Key::new(self.run.start, kind::CSUM, 0),
            encode_csums(&[self.csum]),
        );
        tx.claims.push(self.run.clone());
        let b = self.block_no;
        c.replace_range(tx, ino, b, b + 1, &[(b, fe)])
    }
}

/// A `clone_range` of whole blocks, done in bounded steps ([`CloneRange::step`]).
pub(crate) struct CloneRange {
    pub(crate) src: Ino,
    pub(crate) dst: Ino,
    /// The source's blocks.
    pub(crate) src_blocks: Range<u64>,
    /// Where they go in the destination.
    pub(crate) dst_block: u64,
    /// The destination's size afterwards, at least.
    pub(crate) dst_end: u64,
    pub(crate) now: Timespec,
}

impl CloneRange {
    /// Shares the source's extents from block `s` on (at most [`BATCH`] of them) into the
    /// destination, in one commit. Returns where the next step starts.
    pub(crate) fn step(&self, c: &mut Core, s: u64) -> Result<u64, Stop> {
        let (sb0, sb1, db0) = (self.src_blocks.start, self.src_blocks.end, self.dst_block);
        c.check_user_space()?;
        let found = c.extents_in(self.src, s, sb1, BATCH)?;
        let next = match found.last() {
            Some((fb, fe)) if found.len() >= BATCH => (fb + u64::from(fe.num_blocks)).min(sb1),
            _ => sb1,
        };
        let pieces: Vec<(u64, FileExtent)> = found
            .iter()
            .map(|&(fb, fe)| {
                let start = fb.max(s);
                let end = (fb + u64::from(fe.num_blocks)).min(next);
                let piece = FileExtent {
                    offset_blocks: fe.offset_blocks + (start - fb) as u32,
                    num_blocks: (end - start) as u32,
                    ..fe
                };
                (db0 + (start - sb0), piece)
            })
            .filter(|(_, p)| p.num_blocks > 0)
            .collect();
        let mut tx = Txn::new();
        let (from, to) = (db0 + (s - sb0), db0 + (next - sb0));
        let delta = c.replace_range(&mut tx, self.dst, from, to, &pieces)?;
        let mut item = tx.inode(c, self.dst)?;
        item.size = item.size.max(self.dst_end);
        content_changed(&mut item, delta, self.now, c.seq);
        tx.put_inode(self.dst, &item);
        c.commit(tx)?;
        let seq = c.seq;
        c.state(self.src).last_reflink_trans = seq;
        c.state(self.dst).last_reflink_trans = seq;
        Ok(next)
    }
}
