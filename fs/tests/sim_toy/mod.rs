//! A toy filesystem for testing the crash simulator and the contract checker: the
//! reference model in memory plus a redo log on a block device.
//!
//! Every successful mutation is encoded as a record and kept in memory; `fsync` and
//! `sync` commit all pending records: append them to the log area in fresh blocks, then
//! write a header block naming the new log length. Mount reads the newest valid header
//! and replays the log into a fresh model. The correct variant flushes the log blocks
//! before writing the header with FUA, and alternates between two header slots so a torn
//! header leaves the other one intact; the buggy variants skip one of those steps.

#![allow(dead_code)]

use std::cell::RefCell;

use block::{BlockDevice, WriteFlags};
use testkit::model::ModelFs;
use testkit::testing::ManualClock;
use vfs::{
    Attr, Clock, DirEntry, Errno, FileSystem, FsResult, Ino, Owner, SetAttr, SetTime, StatFs,
    Timespec, XattrMode,
};

/// Which toy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Log blocks, FLUSH, header with FUA into alternating slots.
    Correct,
    /// Header (FUA) written without flushing the log blocks first.
    CommitBeforeFlush,
    /// No FLUSH and no FUA at all: fsync returns with nothing durable.
    NoFlush,
    /// Like `Correct`, but always the same header slot: a torn header loses everything.
    SingleSlot,
}

const MAGIC: u64 = 0x6e69_6e65_746f_7921;
const LOG_START: u64 = 2;
const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// The toy filesystem over device `D`.
#[derive(Debug)]
pub struct ToyFs<D> {
    model: ModelFs<ManualClock>,
    clock: ManualClock,
    disk: D,
    variant: Variant,
    log: RefCell<Log>,
}

#[derive(Debug, Default)]
struct Log {
    pending: Vec<u8>,
    /// Committed log bytes (a multiple of the block size).
    committed: u64,
    seq: u64,
    created: Timespec,
}

// ---- record encoding ----

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    fn time(&mut self, t: Timespec) -> &mut Self {
        self.u64(t.sec as u64).u32(t.nsec)
    }
    fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            Some(x) => self.u8(1).u64(x),
            None => self.u8(0),
        }
    }
    fn set_time(&mut self, v: Option<SetTime>) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(SetTime::Now) => self.u8(1),
            Some(SetTime::To(t)) => self.u8(2).time(t),
        }
    }
}

struct Dec<'a>(&'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("log record truncated".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn time(&mut self) -> Result<Timespec, String> {
        Ok(Timespec {
            sec: self.u64()? as i64,
            nsec: self.u32()?,
        })
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, String> {
        Ok(match self.u8()? {
            0 => None,
            _ => Some(self.u64()?),
        })
    }
    fn opt_u32(&mut self) -> Result<Option<u32>, String> {
        Ok(self.opt_u64()?.map(|v| v as u32))
    }
    fn set_time(&mut self) -> Result<Option<SetTime>, String> {
        Ok(match self.u8()? {
            0 => None,
            1 => Some(SetTime::Now),
            _ => Some(SetTime::To(self.time()?)),
        })
    }
}

mod tag {
    pub const PAD: u8 = 0;
    pub const SETATTR: u8 = 1;
    pub const CREATE: u8 = 2;
    pub const MKDIR: u8 = 3;
    pub const MKNOD: u8 = 4;
    pub const SYMLINK: u8 = 5;
    pub const LINK: u8 = 6;
    pub const UNLINK: u8 = 7;
    pub const RMDIR: u8 = 8;
    pub const RENAME: u8 = 9;
    pub const WRITE: u8 = 10;
    pub const CLONE: u8 = 11;
    pub const SETXATTR: u8 = 12;
    pub const REMOVEXATTR: u8 = 13;
}

fn header(seq: u64, len: u64, created: Timespec, bs: usize) -> Vec<u8> {
    let mut e = Enc(Vec::new());
    e.u64(MAGIC).u64(seq).u64(len).time(created);
    let mut block = e.0;
    block.resize(bs, 0);
    let crc = CRC.checksum(&block[..bs - 4]);
    block[bs - 4..].copy_from_slice(&crc.to_le_bytes());
    block
}

fn parse_header(block: &[u8]) -> Option<(u64, u64, Timespec)> {
    let bs = block.len();
    let crc = u32::from_le_bytes(block[bs - 4..].try_into().unwrap());
    if CRC.checksum(&block[..bs - 4]) != crc {
        return None;
    }
    let mut d = Dec(block);
    if d.u64().ok()? != MAGIC {
        return None;
    }
    Some((d.u64().ok()?, d.u64().ok()?, d.time().ok()?))
}

/// Writes an empty toy filesystem created at `created`.
pub async fn mkfs(disk: &impl BlockDevice, created: Timespec) {
    let bs = disk.geometry().block_size as usize;
    let block = header(1, 0, created, bs);
    disk.write(0, &block, WriteFlags::FUA).await.unwrap();
    disk.write(1, &block, WriteFlags::FUA).await.unwrap();
}

impl<D: BlockDevice> ToyFs<D> {
    /// Mounts: picks the newest valid header and replays the log.
    pub async fn mount(disk: D, clock: ManualClock, variant: Variant) -> Result<ToyFs<D>, String> {
        let bs = disk.geometry().block_size as usize;
        let mut best = None;
        for slot in 0..2 {
            let mut block = vec![0u8; bs];
            disk.read(slot, &mut block)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(h) = parse_header(&block) {
                if best.is_none_or(|(seq, _, _)| h.0 > seq) {
                    best = Some(h);
                }
            }
        }
        let (seq, len, created) = best.ok_or("no valid header")?;
        let mut log = vec![0u8; len as usize];
        if len > 0 {
            disk.read(LOG_START, &mut log)
                .await
                .map_err(|e| e.to_string())?;
        }
        // Replay on the caller's clock, set to each record's time in turn.
        clock.set(created);
        let model = ModelFs::new(clock.clone());
        let mut d = Dec(&log);
        while !d.0.is_empty() {
            if d.0[0] == tag::PAD {
                // Padding runs to the next block boundary.
                let used = log.len() - d.0.len();
                let skip = (bs - used % bs) % bs;
                d.take(skip.max(1))?;
                continue;
            }
            replay_one(&model, &clock, &mut d).await?;
        }
        Ok(ToyFs {
            model,
            clock,
            disk,
            variant,
            log: RefCell::new(Log {
                pending: Vec::new(),
                committed: len,
                seq,
                created,
            }),
        })
    }

    /// The device.
    pub fn disk(&self) -> &D {
        &self.disk
    }

    /// The clock it reads.
    pub fn clock(&self) -> ManualClock {
        self.clock.clone()
    }

    /// Unmounts without committing, returning the device.
    pub fn into_disk(self) -> D {
        self.disk
    }

    /// Whether `ino` has no names: changes to it are lost at any crash, so they are not
    /// logged (replay would not find the inode).
    async fn unlinked(&self, ino: Ino) -> bool {
        self.model.getattr(ino).await.is_ok_and(|a| a.nlink == 0)
    }

    fn record_make(&self, tag: u8, dir: Ino, name: &[u8], perm: u32, o: Owner) {
        self.record(|e| {
            e.u8(tag)
                .time(self.clock.now())
                .u64(dir)
                .bytes(name)
                .u32(perm)
                .u32(o.uid)
                .u32(o.gid);
        });
    }

    fn record(&self, f: impl FnOnce(&mut Enc)) {
        let mut e = Enc(Vec::new());
        f(&mut e);
        let mut log = self.log.borrow_mut();
        log.pending.extend_from_slice(&e.0);
    }

    async fn commit(&self) -> FsResult<()> {
        let bs = self.disk.geometry().block_size as usize;
        let (data, start, seq, len, created) = {
            let mut log = self.log.borrow_mut();
            if log.pending.is_empty() {
                return Ok(());
            }
            let mut data = std::mem::take(&mut log.pending);
            data.resize(data.len().div_ceil(bs) * bs, tag::PAD);
            let start = LOG_START + log.committed / bs as u64;
            log.committed += data.len() as u64;
            log.seq += 1;
            (data, start, log.seq, log.committed, log.created)
        };
        let io = |_| Errno::EIO;
        for (i, chunk) in data.chunks(64 * 1024).enumerate() {
            let lba = start + (i * 64 * 1024 / bs) as u64;
            self.disk
                .write(lba, chunk, WriteFlags::NONE)
                .await
                .map_err(io)?;
        }
        let slot = match self.variant {
            Variant::SingleSlot => 0,
            _ => seq % 2,
        };
        let head = header(seq, len, created, bs);
        match self.variant {
            Variant::Correct | Variant::SingleSlot => {
                self.disk.flush().await.map_err(io)?;
                self.disk
                    .write(slot, &head, WriteFlags::FUA)
                    .await
                    .map_err(io)?;
            }
            Variant::CommitBeforeFlush => {
                self.disk
                    .write(slot, &head, WriteFlags::FUA)
                    .await
                    .map_err(io)?;
            }
            Variant::NoFlush => {
                self.disk
                    .write(slot, &head, WriteFlags::NONE)
                    .await
                    .map_err(io)?;
            }
        }
        Ok(())
    }
}

/// Applies one log record to the model at the record's time.
async fn replay_one(
    model: &ModelFs<ManualClock>,
    clock: &ManualClock,
    d: &mut Dec<'_>,
) -> Result<(), String> {
    let tag = d.u8()?;
    clock.set(d.time()?);
    let owner = |d: &mut Dec| -> Result<Owner, String> {
        Ok(Owner {
            uid: d.u32()?,
            gid: d.u32()?,
        })
    };
    let result = match tag {
        tag::SETATTR => {
            let ino = d.u64()?;
            let changes = SetAttr {
                mode: d.opt_u32()?,
                uid: d.opt_u32()?,
                gid: d.opt_u32()?,
                size: d.opt_u64()?,
                atime: d.set_time()?,
                mtime: d.set_time()?,
            };
            model.setattr(ino, changes).await.map(drop)
        }
        tag::CREATE | tag::MKDIR => {
            let (dir, name, perm, o) = (d.u64()?, d.bytes()?, d.u32()?, owner(d)?);
            if tag == tag::CREATE {
                model.create(dir, &name, perm, o).await.map(drop)
            } else {
                model.mkdir(dir, &name, perm, o).await.map(drop)
            }
        }
        tag::MKNOD => {
            let (dir, name, mode, rdev, o) = (d.u64()?, d.bytes()?, d.u32()?, d.u64()?, owner(d)?);
            model.mknod(dir, &name, mode, rdev, o).await.map(drop)
        }
        tag::SYMLINK => {
            let (dir, name, target, o) = (d.u64()?, d.bytes()?, d.bytes()?, owner(d)?);
            model.symlink(dir, &name, &target, o).await.map(drop)
        }
        tag::LINK => {
            let (ino, dir, name) = (d.u64()?, d.u64()?, d.bytes()?);
            model.link(ino, dir, &name).await.map(drop)
        }
        tag::UNLINK => {
            let (dir, name) = (d.u64()?, d.bytes()?);
            model.unlink(dir, &name).await
        }
        tag::RMDIR => {
            let (dir, name) = (d.u64()?, d.bytes()?);
            model.rmdir(dir, &name).await
        }
        tag::RENAME => {
            let (od, on, nd, nn) = (d.u64()?, d.bytes()?, d.u64()?, d.bytes()?);
            model.rename(od, &on, nd, &nn).await
        }
        tag::WRITE => {
            let (ino, off, data) = (d.u64()?, d.u64()?, d.bytes()?);
            model.write(ino, off, &data).await.map(drop)
        }
        tag::CLONE => {
            let (s, so, dst, doff, len) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?, d.u64()?);
            model.clone_range(s, so, dst, doff, len).await
        }
        tag::SETXATTR => {
            let (ino, name, value, how) = (d.u64()?, d.bytes()?, d.bytes()?, d.u8()?);
            let how = [XattrMode::Upsert, XattrMode::Create, XattrMode::Replace][how as usize % 3];
            model.setxattr(ino, &name, &value, how).await
        }
        tag::REMOVEXATTR => {
            let (ino, name) = (d.u64()?, d.bytes()?);
            model.removexattr(ino, &name).await
        }
        other => return Err(format!("bad log record tag {other}")),
    };
    result.map_err(|e| format!("replaying record {tag}: {e}"))
}

fn how_tag(how: XattrMode) -> u8 {
    match how {
        XattrMode::Upsert => 0,
        XattrMode::Create => 1,
        XattrMode::Replace => 2,
    }
}

impl<D: BlockDevice> FileSystem for ToyFs<D> {
    async fn lookup(&self, dir: Ino, name: &[u8]) -> FsResult<Attr> {
        self.model.lookup(dir, name).await
    }
    async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.model.getattr(ino).await
    }
    async fn setattr(&self, ino: Ino, c: SetAttr) -> FsResult<Attr> {
        let attr = self.model.setattr(ino, c).await?;
        if attr.nlink == 0 {
            return Ok(attr);
        }
        self.record(|e| {
            e.u8(tag::SETATTR).time(self.clock.now()).u64(ino);
            e.opt_u64(c.mode.map(u64::from))
                .opt_u64(c.uid.map(u64::from))
                .opt_u64(c.gid.map(u64::from))
                .opt_u64(c.size)
                .set_time(c.atime)
                .set_time(c.mtime);
        });
        Ok(attr)
    }
    async fn create(&self, dir: Ino, name: &[u8], perm: u32, o: Owner) -> FsResult<Attr> {
        let attr = self.model.create(dir, name, perm, o).await?;
        self.record_make(tag::CREATE, dir, name, perm, o);
        Ok(attr)
    }
    async fn mkdir(&self, dir: Ino, name: &[u8], perm: u32, o: Owner) -> FsResult<Attr> {
        let attr = self.model.mkdir(dir, name, perm, o).await?;
        self.record_make(tag::MKDIR, dir, name, perm, o);
        Ok(attr)
    }
    async fn mknod(&self, dir: Ino, name: &[u8], mode: u32, rdev: u64, o: Owner) -> FsResult<Attr> {
        let attr = self.model.mknod(dir, name, mode, rdev, o).await?;
        self.record(|e| {
            e.u8(tag::MKNOD)
                .time(self.clock.now())
                .u64(dir)
                .bytes(name)
                .u32(mode)
                .u64(rdev)
                .u32(o.uid)
                .u32(o.gid);
        });
        Ok(attr)
    }
    async fn symlink(&self, dir: Ino, name: &[u8], target: &[u8], o: Owner) -> FsResult<Attr> {
        let attr = self.model.symlink(dir, name, target, o).await?;
        self.record(|e| {
            e.u8(tag::SYMLINK)
                .time(self.clock.now())
                .u64(dir)
                .bytes(name)
                .bytes(target)
                .u32(o.uid)
                .u32(o.gid);
        });
        Ok(attr)
    }
    async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.model.readlink(ino).await
    }
    async fn link(&self, ino: Ino, dir: Ino, name: &[u8]) -> FsResult<Attr> {
        let attr = self.model.link(ino, dir, name).await?;
        self.record(|e| {
            e.u8(tag::LINK)
                .time(self.clock.now())
                .u64(ino)
                .u64(dir)
                .bytes(name);
        });
        Ok(attr)
    }
    async fn unlink(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        self.model.unlink(dir, name).await?;
        self.record(|e| {
            e.u8(tag::UNLINK)
                .time(self.clock.now())
                .u64(dir)
                .bytes(name);
        });
        Ok(())
    }
    async fn rmdir(&self, dir: Ino, name: &[u8]) -> FsResult<()> {
        self.model.rmdir(dir, name).await?;
        self.record(|e| {
            e.u8(tag::RMDIR).time(self.clock.now()).u64(dir).bytes(name);
        });
        Ok(())
    }
    async fn rename(&self, od: Ino, on: &[u8], nd: Ino, nn: &[u8]) -> FsResult<()> {
        self.model.rename(od, on, nd, nn).await?;
        self.record(|e| {
            e.u8(tag::RENAME)
                .time(self.clock.now())
                .u64(od)
                .bytes(on)
                .u64(nd)
                .bytes(nn);
        });
        Ok(())
    }
    async fn readdir(&self, dir: Ino, offset: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        self.model.readdir(dir, offset, max).await
    }
    async fn read_with(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        ctx: vfs::ReadCtx<'_>,
    ) -> FsResult<usize> {
        self.model.read_with(ino, offset, buf, ctx).await
    }
    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        let n = self.model.write(ino, offset, data).await?;
        if n > 0 && !self.unlinked(ino).await {
            self.record(|e| {
                e.u8(tag::WRITE)
                    .time(self.clock.now())
                    .u64(ino)
                    .u64(offset)
                    .bytes(&data[..n]);
            });
        }
        Ok(n)
    }
    async fn append(&self, ino: Ino, data: &[u8]) -> FsResult<(u64, usize)> {
        let (offset, n) = self.model.append(ino, data).await?;
        // Replayed as the write it was.
        if n > 0 && !self.unlinked(ino).await {
            self.record(|e| {
                e.u8(tag::WRITE)
                    .time(self.clock.now())
                    .u64(ino)
                    .u64(offset)
                    .bytes(&data[..n]);
            });
        }
        Ok((offset, n))
    }
    async fn clone_range(&self, s: Ino, so: u64, d: Ino, doff: u64, len: u64) -> FsResult<()> {
        self.model.clone_range(s, so, d, doff, len).await?;
        self.record(|e| {
            e.u8(tag::CLONE)
                .time(self.clock.now())
                .u64(s)
                .u64(so)
                .u64(d)
                .u64(doff)
                .u64(len);
        });
        Ok(())
    }
    async fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        self.model.getxattr(ino, name).await
    }
    async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrMode) -> FsResult<()> {
        self.model.setxattr(ino, name, value, how).await?;
        if self.unlinked(ino).await {
            return Ok(());
        }
        self.record(|e| {
            e.u8(tag::SETXATTR)
                .time(self.clock.now())
                .u64(ino)
                .bytes(name)
                .bytes(value)
                .u8(how_tag(how));
        });
        Ok(())
    }
    async fn listxattr(&self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        self.model.listxattr(ino).await
    }
    async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.model.removexattr(ino, name).await?;
        if self.unlinked(ino).await {
            return Ok(());
        }
        self.record(|e| {
            e.u8(tag::REMOVEXATTR)
                .time(self.clock.now())
                .u64(ino)
                .bytes(name);
        });
        Ok(())
    }
    async fn statfs(&self) -> FsResult<StatFs> {
        self.model.statfs().await
    }
    async fn open(&self, ino: Ino) -> FsResult<()> {
        self.model.open(ino).await
    }
    async fn release(&self, ino: Ino) -> FsResult<()> {
        self.model.release(ino).await
    }
    async fn fsync(&self, ino: Ino, _datasync: bool) -> FsResult<()> {
        self.model.getattr(ino).await?;
        self.commit().await
    }
    async fn sync(&self) -> FsResult<()> {
        self.commit().await
    }
}
