//! The data path over the engine: reading and writing file data with no lock held
//! (planned and committed under the core lock, see `core::file`), truncation, cloning,
//! and freeing unlinked inodes.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use crate::cache::{Part, Who};
use crate::core::file::*;
use crate::core::inode::MAX_FILE_SIZE;
use crate::core::txn::{Stop, Txn};
use crate::engine::Engine;
use crate::format::items::{encode_csums, FileExtent};
use crate::format::key::kind;
use crate::format::{Key, TreeId, BLOCK_SIZE};
use crate::io::Verified;
use crate::util::crc::crc32c;
use block::{BlockDevice, WriteFlags};
use vfs::{Errno, FsResult, Ino};

impl<D: BlockDevice> Engine<D> {
    /// Reads and verifies `buf.len()` bytes (whole blocks) at device block `block`,
    /// whose checksums are `csums`. A checksum mismatch on every copy is reported as
    /// `EAGAIN` (the caller re-plans once before failing).
    pub(crate) async fn read_blocks(
        &self,
        block: u64,
        csums: &[u32],
        buf: &mut [u8],
    ) -> FsResult<()> {
        debug_assert_eq!(buf.len(), csums.len() * BLOCK_SIZE);
        let read = self
            .dev
            .read_verified(block, buf, |b| blocks_match(b, csums))
            .await;
        self.core.lock().stats.data_bytes_read += buf.len() as u64;
        match read {
            Ok(Verified::Good | Verified::Mended) => Ok(()),
            Ok(Verified::Bad) => Err(Errno::EAGAIN),
            Err(e) => {
                log::error!(
                    "reading data blocks {block}..{}: {e}",
                    block + csums.len() as u64
                );
                Err(Errno::EIO)
            }
        }
    }

    /// Reads the blocks of `piece` through the data cache for `who` into `dest`: cached
    /// blocks are copied at once, the others once a device read has verified them (and
    /// kept them in the cache; runs that land whole in `dest` are read straight into
    /// it). Blocks another read is already bringing in are waited for, not read twice.
    /// A checksum mismatch is `EAGAIN`, as in [`Engine::read_blocks`].
    async fn read_piece(&self, piece: &Piece, who: Who, dest: &mut Dest<'_>) -> FsResult<()> {
        let cache = self.dev.cache();
        // Runs of the piece's blocks still to get.
        let mut todo: Vec<Range<usize>> = Vec::new();
        todo.push(0..piece.len as usize);
        let mut waits = 0;
        while let Some(range) = todo.pop() {
            let first = piece.disk_block + range.start as u64;
            let csums = &piece.csums[range.clone()];
            if waits > MAX_FILL_WAITS {
                // Fills keep failing under us: read it alone, past the cache.
                let mut buf = vec![0u8; csums.len() * BLOCK_SIZE];
                self.read_blocks(first, csums, &mut buf).await?;
                dest.put(range.start, &buf);
                continue;
            }
            for part in cache.lookup(who, first, csums, true) {
                match part {
                    Part::Hit { at, data } => dest.put(range.start + at, &data),
                    Part::Wait { at, len, fill } => {
                        cache.wait(fill).await;
                        waits += 1;
                        todo.push(range.start + at..range.start + at + len);
                    }
                    Part::Read { at, len, fill } => {
                        let (i, sums) = (range.start + at, &csums[at..at + len]);
                        let block = first + at as u64;
                        if let Some(out) = dest.whole(i, len) {
                            self.read_blocks(block, sums, out).await?;
                            fill.complete(who, out, sums, false);
                        } else {
                            let mut buf = vec![0u8; len * BLOCK_SIZE];
                            self.read_blocks(block, sums, &mut buf).await?;
                            fill.complete(who, &buf, sums, false);
                            dest.put(i, &buf);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `read` for `who`.
    pub(crate) async fn read_data(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        who: Who,
    ) -> FsResult<usize> {
        let mut retried = false;
        loop {
            let plan = self
                .run(|c| {
                    let item = c.inode(ino)?;
                    regular(&item)?;
                    if offset >= item.size || buf.is_empty() {
                        return Ok(None);
                    }
                    let len = (buf.len() as u64).min(item.size - offset);
                    let (b0, b1) = (offset / BS, (offset + len).div_ceil(BS));
                    Ok(Some((len as usize, c.read_plan(ino, b0, b1)?)))
                })
                .await?;
            let Some((len, pieces)) = plan else {
                return Ok(0);
            };
            // Holes read as zeros, with no device I/O: only what no piece covers is
            // zeroed (the pieces are in file order and do not overlap).
            let mut covered = 0;
            for p in &pieces {
                let start = (p.file_block * BS).saturating_sub(offset) as usize;
                buf[covered.min(len)..start.min(len)].fill(0);
                covered = covered.max(((p.file_block + p.len) * BS - offset) as usize);
            }
            buf[covered.min(len)..len].fill(0);
            let mut bad = None;
            for p in &pieces {
                let mut dest = Dest {
                    out: &mut buf[..len],
                    at: (p.file_block * BS) as i128 - i128::from(offset),
                };
                match self.read_piece(p, who, &mut dest).await {
                    Ok(()) => {}
                    Err(Errno::EAGAIN) => {
                        bad = Some(p.disk_block);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            match bad {
                None => return Ok(len),
                Some(block) if retried => {
                    log::error!("inode {ino}: data checksum mismatch in blocks from {block}");
                    self.core.lock().stats.corruptions += 1;
                    return Err(Errno::EIO);
                }
                Some(_) => retried = true,
            }
        }
    }

    /// `write` at `offset`, or with `None` `append`: then the size is read under the
    /// inode's lock, which every writer and size change of the inode holds, so nothing
    /// comes between reading it and writing there. Returns the offset written at and
    /// the bytes written.
    pub(crate) async fn write_data(
        &self,
        ino: Ino,
        offset: Option<u64>,
        data: &[u8],
    ) -> FsResult<(u64, usize)> {
        let lock = self.inode_lock(ino);
        let _guard = lock.lock().await;
        // One look under the inode's lock: its type, the offset of an append, and whether
        // the filesystem takes writes.
        let offset = self
            .run(|c| {
                let item = c.inode(ino)?;
                regular(&item)?;
                let offset = offset.unwrap_or(item.size);
                if !data.is_empty() && offset < MAX_FILE_SIZE {
                    c.writable()?;
                }
                Ok(offset)
            })
            .await?;
        if data.is_empty() {
            return Ok((offset, 0));
        }
        if offset >= MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let n = data
            .len()
            .min((MAX_FILE_SIZE - offset).min(usize::MAX as u64) as usize);
        self.trim_past_eof(ino).await?;
        let mut done = 0;
        while done < n {
            let chunk = (n - done).min(WRITE_CHUNK);
            match self
                .write_chunk(ino, offset + done as u64, &data[done..done + chunk])
                .await
            {
                Ok(()) => done += chunk,
                // Earlier chunks are in: a short write, as POSIX has it.
                Err(_) if done > 0 => return Ok((offset, done)),
                Err(e) => return Err(e),
            }
        }
        Ok((offset, n))
    }

    /// Removes extents past the end of file left by a truncation a crash (or a failed
    /// device) interrupted, so extending the file cannot expose them. Once done, the
    /// inode is remembered ([`TrimmedInodes`]) until its size is next cut.
    async fn trim_past_eof(&self, ino: Ino) -> FsResult<()> {
        if self.trimmed.lock().contains(ino) {
            return Ok(());
        }
        loop {
            let done = self
                .run(|c| {
                    let size = c.inode(ino)?.size;
                    c.trim_step(ino, size.div_ceil(BS))
                })
                .await?;
            if done {
                self.trimmed.lock().insert(ino);
                return Ok(());
            }
        }
    }

    async fn write_chunk(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<()> {
        let end = offset + data.len() as u64;
        let (b0, b1) = (offset / BS, end.div_ceil(BS));
        let nblocks = b1 - b0;
        let plan = self
            .run(|c| {
                let item = c.inode(ino)?;
                regular(&item)?;
                // Blocks only partly overwritten keep their other bytes.
                let mut partial = Vec::new();
                if !offset.is_multiple_of(BS) || (b1 - b0 == 1 && !end.is_multiple_of(BS)) {
                    partial.push(b0);
                }
                if !end.is_multiple_of(BS) && b1 - 1 != b0 {
                    partial.push(b1 - 1);
                }
                let mut old = Vec::new();
                for b in partial {
                    if b * BS < item.size {
                        for p in c.read_plan(ino, b, b + 1)? {
                            old.push(((b - b0) as usize, p));
                        }
                    }
                }
                c.check_write_quota(ino, &item, b0, b1)?;
                // New data leaves both reserves free; the copy of a truncated last
                // block (`zero_tail`) only the metadata reserve.
                let keep = c.data_keep();
                let runs = c.space.alloc_data(nblocks, keep)?;
                Ok(WritePlan { old, runs })
            })
            .await?;
        let result = self.fill_and_write(&plan, offset - b0 * BS, data).await;
        let csums = match result {
            Ok(csums) => csums,
            Err(e) => {
                self.release_runs(&plan.runs);
                return Err(e);
            }
        };
        let now = self.now();
        let applied = self
            .run(|c| {
                let mut tx = Txn::new();
                let mut pieces = Vec::new();
                let mut fb = b0;
                let mut ci = 0;
                for r in &plan.runs {
                    let len = r.end - r.start;
                    pieces.push((
                        fb,
                        FileExtent {
                            disk_block: r.start,
                            disk_blocks: len as u32,
                            offset_blocks: 0,
                            num_blocks: len as u32,
                        },
                    ));
                    tx.put(
                        TreeId::Csum,
                        Key::new(r.start, kind::CSUM, 0),
                        encode_csums(&csums[ci..ci + len as usize]),
                    );
                    tx.claims.push(r.clone());
                    fb += len;
                    ci += len as usize;
                }
                let delta = c.replace_range(&mut tx, ino, b0, b1, &pieces)?;
                let mut item = tx.inode(c, ino)?;
                item.size = item.size.max(end);
                content_changed(&mut item, delta, now, c.seq);
                tx.put_inode(ino, &item);
                c.commit(tx)
            })
            .await;
        if applied.is_err() {
            self.release_runs(&plan.runs);
        }
        applied?;
        self.core.lock().stats.data_bytes_written += nblocks * BS;
        Ok(())
    }

    fn release_runs(&self, runs: &[Range<u64>]) {
        let mut c = self.core.lock();
        for r in runs {
            c.space.unreserve(r.clone());
        }
        // The operation already failed; a broken rule fails the filesystem too.
        let _ = c.check_space();
    }

    /// Builds the new blocks (old partial blocks merged with `data` at byte `skip` of the
    /// first block), writes them to the reserved runs and returns their checksums.
    async fn fill_and_write(&self, plan: &WritePlan, skip: u64, data: &[u8]) -> FsResult<Vec<u32>> {
        let nblocks: u64 = plan.runs.iter().map(|r| r.end - r.start).sum();
        let mut buf = vec![0u8; (nblocks * BS) as usize];
        for (index, piece) in &plan.old {
            let at = index * BLOCK_SIZE;
            let mut dest = Dest {
                out: &mut buf[at..at + BLOCK_SIZE],
                at: 0,
            };
            match self.read_piece(piece, None, &mut dest).await {
                Ok(()) => {}
                Err(Errno::EAGAIN) => {
                    log::error!("data checksum mismatch at block {}", piece.disk_block);
                    self.core.lock().stats.corruptions += 1;
                    return Err(Errno::EIO);
                }
                Err(e) => return Err(e),
            }
        }
        buf[skip as usize..skip as usize + data.len()].copy_from_slice(data);
        let csums: Vec<u32> = buf.chunks(BLOCK_SIZE).map(crc32c).collect();
        let mut at = 0usize;
        for r in &plan.runs {
            let len = ((r.end - r.start) * BS) as usize;
            if let Err(e) = self
                .dev
                .write(r.start, &buf[at..at + len], WriteFlags::NONE)
                .await
            {
                log::error!("writing data blocks {}..{}: {e}", r.start, r.end);
                return Err(Errno::EIO);
            }
            at += len;
        }
        Ok(csums)
    }

    /// Changes the size of regular file `ino` (truncate or extend), setting mtime and
    /// ctime if it changed.
    pub(crate) async fn set_size(&self, ino: Ino, size: u64) -> FsResult<()> {
        let lock = self.inode_lock(ino);
        let _guard = lock.lock().await;
        let old = self.run(|c| Ok(c.inode(ino)?.size)).await?;
        if old == size {
            return Ok(());
        }
        self.trim_past_eof(ino).await?;
        // From the size's commit until the last trim step, blocks sit past the end.
        self.trimmed.lock().forget(ino);
        let now = self.now();
        let zeroed = if size < old && !size.is_multiple_of(BS) {
            self.zero_tail(ino, size).await?
        } else {
            None
        };
        let applied = self
            .run(|c| {
                let mut tx = Txn::new();
                let mut item = tx.inode(c, ino)?;
                if let Some(tail) = &zeroed {
                    let delta = tail.map_into(c, &mut tx, ino)?;
                    add_bytes(&mut item, delta);
                }
                item.size = size;
                content_changed(&mut item, 0, now, c.seq);
                tx.put_inode(ino, &item);
                c.commit(tx)
            })
            .await;
        if applied.is_err() {
            if let Some(tail) = &zeroed {
                self.release_runs(core::slice::from_ref(&tail.run));
            }
        }
        applied?;
        // Whole blocks past the new end go in bounded steps; a crash in between leaves
        // them past the end of file, where nothing reads them and the next extension or
        // deletion removes them.
        self.trim_past_eof(ino).await
    }

    /// A cut at `size`, inside a block: writes a copy of that block with its tail zeroed
    /// to a new block, to be mapped in its place ([`ZeroedTail::map_into`]). `None` if
    /// the block holds no data (a hole reads as zeros anyway).
    async fn zero_tail(&self, ino: Ino, size: u64) -> FsResult<Option<ZeroedTail>> {
        let block_no = size / BS;
        let plan = self
            .run(|c| {
                let pieces = c.read_plan(ino, block_no, block_no + 1)?;
                if pieces.is_empty() {
                    return Ok(None);
                }
                let keep = c.meta_reserve();
                let runs = c.space.alloc_data(1, keep)?;
                Ok(Some(WritePlan {
                    old: pieces.into_iter().map(|p| (0, p)).collect(),
                    runs,
                }))
            })
            .await?;
        let Some(plan) = plan else {
            return Ok(None);
        };
        let mut block = vec![0u8; BLOCK_SIZE];
        let mut dest = Dest {
            out: &mut block,
            at: 0,
        };
        let read = match self.read_piece(&plan.old[0].1, None, &mut dest).await {
            Err(Errno::EAGAIN) => {
                let at = plan.old[0].1.disk_block;
                log::error!("data checksum mismatch at block {at}");
                Err(Errno::EIO)
            }
            r => r,
        };
        let wrote = match read {
            Ok(()) => {
                block[(size % BS) as usize..].fill(0);
                self.dev
                    .write(plan.runs[0].start, &block, WriteFlags::NONE)
                    .await
                    .map_err(|_| Errno::EIO)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = wrote {
            self.release_runs(&plan.runs);
            return Err(e);
        }
        Ok(Some(ZeroedTail {
            block_no,
            run: plan.runs[0].clone(),
            csum: crc32c(&block),
        }))
    }

    /// `clone_range` (arguments already validated against the model's rules here).
    pub(crate) async fn clone_data(
        &self,
        src: Ino,
        so: u64,
        dst: Ino,
        dof: u64,
        len: u64,
    ) -> FsResult<()> {
        // Type checks first (source, then destination).
        self.run(|c| {
            regular(&c.inode(src)?)?;
            regular(&c.inode(dst)?)
        })
        .await?;
        if len == 0 {
            return Ok(());
        }
        let (Some(src_end), Some(dst_end)) = (so.checked_add(len), dof.checked_add(len)) else {
            return Err(Errno::EINVAL);
        };
        self.run(|c| c.writable()).await?;
        let (first, second) = if src <= dst { (src, dst) } else { (dst, src) };
        let locks = (
            self.inode_lock(first),
            (src != dst).then(|| self.inode_lock(second)),
        );
        let _g1 = locks.0.lock().await;
        let _g2 = match &locks.1 {
            Some(l) => Some(l.lock().await),
            None => None,
        };
        let (src_size, dst_size) = self
            .run(|c| Ok((c.inode(src)?.size, c.inode(dst)?.size)))
            .await?;
        let aligned = |x: u64| x.is_multiple_of(BS);
        if !aligned(so) || !aligned(dof) || src_end > src_size {
            return Err(Errno::EINVAL);
        }
        if !aligned(len) && (src_end != src_size || dst_end < dst_size) {
            return Err(Errno::EINVAL);
        }
        let span = len.div_ceil(BS) * BS;
        if src == dst && so < dof + span && dof < so + span {
            return Err(Errno::EINVAL);
        }
        if dst_end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        self.trim_past_eof(dst).await?;
        let clone = CloneRange {
            src,
            dst,
            src_blocks: so / BS..src_end.div_ceil(BS),
            dst_block: dof / BS,
            dst_end,
            now: self.now(),
        };
        let mut s = clone.src_blocks.start;
        let mut first = true;
        while s < clone.src_blocks.end || first {
            s = self.run(|c| clone.step(c, s)).await?;
            first = false;
        }
        Ok(())
    }

    /// Frees `ino` if it has no links and nobody has it open: its data in bounded steps,
    /// then its remaining items, its inode item and its orphan item together.
    pub(crate) async fn free_if_unlinked(&self, ino: Ino) -> FsResult<()> {
        let lock = self.inode_lock(ino);
        let _guard = lock.lock().await;
        let doomed = self
            .run(|c| match c.inode(ino) {
                Ok(item) => Ok(item.nlink == 0 && !c.is_open(ino)),
                Err(Stop::Errno(Errno::ENOENT)) => Ok(false),
                Err(e) => Err(e),
            })
            .await?;
        if !doomed {
            return Ok(());
        }
        while !self.run(|c| c.trim_step(ino, 0)).await? {}
        loop {
            let done = self
                .run(|c| {
                    let mut tx = Txn::new();
                    let mut keys = Vec::new();
                    c.trees.range(
                        TreeId::Fs,
                        Key::new(ino, 0, 0),
                        Key::new(ino, u8::MAX, u64::MAX),
                        |k, _| {
                            keys.push(k);
                            keys.len() < 4 * BATCH
                        },
                    )?;
                    let last = keys.len() < 4 * BATCH;
                    for k in keys {
                        if k.kind != kind::INODE || last {
                            tx.del(TreeId::Fs, k);
                        }
                    }
                    if last {
                        tx.del(TreeId::Fs, Key::new(0, kind::ORPHAN, ino));
                        tx.inode_delta = -1;
                    }
                    c.commit(tx)?;
                    if last {
                        // A removed directory's list of removed names stays until the
                        // checkpoint: a log record removing the directory must account
                        // for the entries it had in the checkpoint.
                        let committed = c.committed_seq;
                        let keep = c.inodes.get(&ino).is_some_and(|s| {
                            s.log
                                .removed
                                .since(committed)
                                .is_none_or(|mut r| r.next().is_some())
                        });
                        if !keep {
                            c.inodes.remove(&ino);
                        }
                    }
                    Ok(last)
                })
                .await?;
            if done {
                return Ok(());
            }
        }
    }

    /// Frees every orphan (run at mount: after a crash, inodes unlinked while open).
    pub(crate) async fn clean_orphans(&self) -> FsResult<()> {
        loop {
            let batch = self
                .run(|c| {
                    let mut inos = Vec::new();
                    c.trees.range(
                        TreeId::Fs,
                        Key::new(0, kind::ORPHAN, 0),
                        Key::new(0, kind::ORPHAN, u64::MAX),
                        |k, _| {
                            inos.push(k.offset);
                            inos.len() < BATCH
                        },
                    )?;
                    Ok(inos)
                })
                .await?;
            if batch.is_empty() {
                return Ok(());
            }
            for ino in batch {
                self.free_if_unlinked(ino).await?;
                // An orphan item for an inode that is gone or linked: just drop it.
                self.run(|c| {
                    let key = Key::new(0, kind::ORPHAN, ino);
                    if c.trees.get(TreeId::Fs, &key)?.is_some() {
                        let mut tx = Txn::new();
                        tx.del(TreeId::Fs, key);
                        c.commit(tx)?;
                    }
                    Ok(())
                })
                .await?;
            }
        }
    }
}
