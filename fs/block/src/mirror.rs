//! [`MirrorDisk`]: one device over several devices (legs) that each hold a copy of every
//! block, so no single device loses data (RAID 1).
//!
//! - **Writes, flushes and discards** go to every leg in service, concurrently, and
//!   complete when all of them have: a write is on every leg before the FLUSH that
//!   makes it durable. A leg that fails a write or a flush while another leg took it is
//!   taken out of service at once (it no longer holds the data; md does the same), and
//!   the request succeeds on the others. When every leg fails, the request fails and
//!   no leg is taken out: the volume as a whole is then failed, as a single disk would be.
//! - **Reads** go to the first leg in service; a read error there is retried on the
//!   next, and the data read good is written back over the leg that failed (a
//!   *repair*). A leg whose read errors reach the limit is taken out of service.
//! - **Copies**: [`BlockDevice::read_copy`] reads one leg, [`BlockDevice::repair_copy`]
//!   mends one, so the filesystem, which verifies checksums, can do for a block that
//!   reads wrong what the mirror does for one that does not read at all.
//!
//! A repair never overwrites a block written recently (among the last
//! [`RECENT_WRITES`] writes, in flight or done): the reader that found it bad may have
//! read it before that write, through a pointer that has gone stale since, and its
//! "good" copy would be the old content. Such a block is left for a later read or
//! scrub to mend (every read is verified, so a leg that still differs is found again).
//!
//! A leg is out of service when it is missing (not given), failed, or found stale by
//! the caller ([`BlockDevice::fail_copy`]); the filesystem records that in its
//! superblocks so a stale leg is never trusted again. Rebuilding a replaced leg is later.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::future::{poll_fn, Future};
use core::ops::Range;
use core::pin::Pin;
use core::task::Poll;

use spin::Mutex;

use crate::{check_request, BlockDevice, Geometry, IoError, WriteFlags};

/// How many of the latest writes' ranges are kept to refuse repairs over them.
pub const RECENT_WRITES: usize = 256;

/// Read errors after which a leg is taken out of service, by default.
pub const DEFAULT_READ_ERROR_LIMIT: u64 = 16;

/// Whether a leg serves requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum LegState {
    /// In service: every write reaches it.
    Active,
    /// Taken out of service (errors, or found stale); it misses every later write.
    Failed,
    /// Not given when the mirror was assembled.
    Missing,
}

/// What happened on one leg.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LegCounters {
    /// Whether the leg is in service.
    pub state: LegState,
    /// Reads that failed on it.
    pub read_errors: u64,
    /// Writes and flushes that failed on it.
    pub write_errors: u64,
    /// Blocks read bad from it (an error or, as the caller found, a wrong checksum) and
    /// rewritten with a good copy from another leg.
    pub repairs: u64,
}

/// Why legs cannot make a mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorError {
    /// No leg is present.
    NoLegs,
    /// More legs than the 64 a failure mask holds.
    TooManyLegs,
    /// The legs' logical block sizes differ.
    BlockSizes,
}

impl core::fmt::Display for MirrorError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MirrorError::NoLegs => "no device present",
            MirrorError::TooManyLegs => "more than 64 devices",
            MirrorError::BlockSizes => "devices of different logical block sizes",
        })
    }
}

/// A mirror over legs of type `D` (see the module documentation).
#[derive(Debug)]
pub struct MirrorDisk<D> {
    legs: Vec<Option<D>>,
    health: Mutex<Vec<LegCounters>>,
    /// The ranges of the latest [`RECENT_WRITES`] writes (a ring).
    recent: Mutex<VecDeque<Range<u64>>>,
    geometry: Geometry,
    read_error_limit: u64,
}

impl<D: BlockDevice> MirrorDisk<D> {
    /// A mirror over `legs`, in their places in the volume (`None`: missing). Its
    /// capacity is the smallest leg's; FUA is native and discard supported only when
    /// every leg's is.
    pub fn new(legs: Vec<Option<D>>) -> Result<MirrorDisk<D>, MirrorError> {
        if legs.len() > 64 {
            return Err(MirrorError::TooManyLegs);
        }
        let mut present = legs.iter().flatten().map(|d| d.geometry());
        let mut g = present.next().ok_or(MirrorError::NoLegs)?;
        for other in present {
            if other.block_size != g.block_size {
                return Err(MirrorError::BlockSizes);
            }
            g.num_blocks = g.num_blocks.min(other.num_blocks);
            g.max_transfer = g.max_transfer.min(other.max_transfer);
            g.native_fua &= other.native_fua;
            g.volatile_cache |= other.volatile_cache;
            g.discard &= other.discard;
        }
        let health = legs
            .iter()
            .map(|l| LegCounters {
                state: if l.is_some() {
                    LegState::Active
                } else {
                    LegState::Missing
                },
                read_errors: 0,
                write_errors: 0,
                repairs: 0,
            })
            .collect();
        Ok(MirrorDisk {
            legs,
            health: Mutex::new(health),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_WRITES)),
            geometry: g,
            read_error_limit: DEFAULT_READ_ERROR_LIMIT,
        })
    }

    /// Sets how many read errors take a leg out of service.
    pub fn with_read_error_limit(mut self, limit: u64) -> MirrorDisk<D> {
        self.read_error_limit = limit.max(1);
        self
    }

    /// Logical blocks in `len` bytes.
    fn blocks(&self, len: usize) -> u64 {
        (len / self.geometry.block_size as usize) as u64
    }

    /// Leg `i`, if present.
    pub fn leg(&self, i: usize) -> Option<&D> {
        self.legs.get(i)?.as_ref()
    }

    /// Each leg's state and counters, in place order.
    pub fn legs(&self) -> Vec<LegCounters> {
        self.health.lock().clone()
    }

    /// The legs in service, in place order.
    fn active(&self) -> Vec<(usize, &D)> {
        let health = self.health.lock();
        self.legs
            .iter()
            .enumerate()
            .filter(|(i, _)| health[*i].state == LegState::Active)
            .filter_map(|(i, l)| Some((i, l.as_ref()?)))
            .collect()
    }

    /// Takes leg `i` out of service unless it is the last one in it; says whether it did.
    fn take_out(health: &mut [LegCounters], i: usize, why: &str) -> bool {
        let others = health
            .iter()
            .enumerate()
            .any(|(j, h)| j != i && h.state == LegState::Active);
        if !others || health[i].state != LegState::Active {
            return false;
        }
        health[i].state = LegState::Failed;
        log::error!("mirror: leg {i} taken out of service ({why}); the others serve");
        true
    }

    /// Counts a failed read on leg `i`, taking it out at the limit.
    fn read_failed(&self, i: usize, e: IoError) {
        let mut health = self.health.lock();
        health[i].read_errors += 1;
        log::warn!("mirror: leg {i}: read error: {e}");
        if health[i].read_errors >= self.read_error_limit {
            Self::take_out(&mut health, i, "too many read errors");
        }
    }

    /// Runs `request` on every leg in service at once. Legs that fail while another
    /// succeeds are taken out of service; fails only when every leg failed.
    async fn on_all<'a, F, Fut>(&'a self, request: F) -> Result<(), IoError>
    where
        F: Fn(&'a D) -> Fut,
        Fut: Future<Output = Result<(), IoError>> + 'a,
    {
        let legs = self.active();
        if legs.is_empty() {
            return Err(IoError::Dead);
        }
        let results = join_all(legs.iter().map(|(_, d)| request(d)).collect()).await;
        let Some(err) = results.iter().find_map(|r| r.err()) else {
            return Ok(());
        };
        if results.iter().all(Result::is_err) {
            return Err(err);
        }
        let mut health = self.health.lock();
        for ((i, _), r) in legs.iter().zip(&results) {
            if let Err(e) = r {
                health[*i].write_errors += 1;
                log::error!("mirror: leg {i}: {e}");
                Self::take_out(&mut health, *i, "write or flush failed");
            }
        }
        Ok(())
    }
}

/// Polls every future to completion, together.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    poll_fn(|cx| {
        for (slot, result) in pending.iter_mut().zip(out.iter_mut()) {
            if let Some(f) = slot {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    *result = Some(v);
                    *slot = None;
                }
            }
        }
        if pending.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

impl<D: BlockDevice> BlockDevice for MirrorDisk<D> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        let mut failed = Vec::new();
        let mut last = IoError::Dead;
        for (i, leg) in self.active() {
            match leg.read(lba, buf).await {
                Ok(()) => {
                    for bad in failed {
                        // A failed repair takes the leg out: nothing more to do here.
                        let _ = self.repair_copy(bad, lba, buf).await;
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.read_failed(i, e);
                    failed.push(i);
                    last = e;
                }
            }
        }
        Err(last)
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        {
            let mut recent = self.recent.lock();
            if recent.len() == RECENT_WRITES {
                recent.pop_front();
            }
            recent.push_back(lba..lba + self.blocks(buf.len()));
        }
        self.on_all(|d| d.write(lba, buf, flags)).await
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.on_all(|d| d.flush()).await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        if !self.geometry.discard {
            return Err(IoError::Unsupported);
        }
        // Discarded content is unspecified: a leg that keeps the old data is no worse.
        let results = join_all(
            self.active()
                .iter()
                .map(|(_, d)| d.discard(lba, blocks))
                .collect(),
        )
        .await;
        match results.iter().find(|r| r.is_ok()) {
            Some(_) => Ok(()),
            None => results.into_iter().next().unwrap_or(Err(IoError::Dead)),
        }
    }

    fn copies(&self) -> usize {
        self.legs.len()
    }

    async fn read_copy(&self, copy: usize, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        let leg = self.active().into_iter().find(|(i, _)| *i == copy);
        let (_, leg) = leg.ok_or(IoError::Dead)?;
        let r = leg.read(lba, buf).await;
        if let Err(e) = r {
            self.read_failed(copy, e);
        }
        r
    }

    async fn repair_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        let end = lba + self.blocks(buf.len());
        if self
            .recent
            .lock()
            .iter()
            .any(|r| r.start < end && lba < r.end)
        {
            log::info!("mirror: leg {copy}: blocks at {lba} written lately; repair left for later");
            return Ok(());
        }
        let leg = self.active().into_iter().find(|(i, _)| *i == copy);
        let (_, leg) = leg.ok_or(IoError::Dead)?;
        let r = leg.write(lba, buf, WriteFlags::NONE).await;
        let mut health = self.health.lock();
        match r {
            Ok(()) => {
                health[copy].repairs += 1;
                log::warn!("mirror: leg {copy}: repaired blocks {lba}..{end}");
            }
            Err(e) => {
                health[copy].write_errors += 1;
                log::error!("mirror: leg {copy}: repair at {lba}: {e}");
                Self::take_out(&mut health, copy, "repair failed");
            }
        }
        r
    }

    fn failed_copies(&self) -> u64 {
        let health = self.health.lock();
        health
            .iter()
            .enumerate()
            .filter(|(_, h)| h.state != LegState::Active)
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    fn fail_copy(&self, copy: usize) {
        if copy < self.legs.len() {
            Self::take_out(&mut self.health.lock(), copy, "stale");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fault, FaultDisk, MemDisk};
    use alloc::vec;

    fn mirror(n: usize) -> MirrorDisk<FaultDisk<MemDisk>> {
        let legs = (0..n)
            .map(|i| Some(FaultDisk::new(MemDisk::new(512, 64), i as u64)))
            .collect();
        MirrorDisk::new(legs).unwrap()
    }

    fn leg_bytes(m: &MirrorDisk<FaultDisk<MemDisk>>, i: usize) -> Vec<u8> {
        m.leg(i).unwrap().inner().snapshot()
    }

    #[test]
    fn writes_reach_every_leg() {
        let m = mirror(3);
        let data = vec![7u8; 1024];
        pollster::block_on(m.write(4, &data, WriteFlags::FUA)).unwrap();
        pollster::block_on(m.flush()).unwrap();
        for i in 0..3 {
            assert_eq!(&leg_bytes(&m, i)[4 * 512..6 * 512], &data[..]);
        }
        assert_eq!(m.copies(), 3);
        assert_eq!(m.failed_copies(), 0);
        assert_eq!(
            pollster::block_on(m.write(63, &data, WriteFlags::NONE)),
            Err(IoError::OutOfRange)
        );
        assert_eq!(m.failed_copies(), 0, "a bad request is no leg's fault");
    }

    #[test]
    fn a_read_error_is_served_by_another_leg_and_repaired() {
        let m = mirror(2);
        let data = vec![9u8; 512];
        // Written long ago (not through the mirror); leg 0 lost it and fails to read
        // it once.
        m.leg(1)
            .unwrap()
            .inner()
            .with_bytes(|b| b[3 * 512..4 * 512].fill(9));
        m.leg(0)
            .unwrap()
            .inject(Fault::NthRead(0), IoError::Device(0x281));
        let mut back = vec![0u8; 512];
        pollster::block_on(m.read(3, &mut back)).unwrap();
        assert_eq!(back, data);
        assert_eq!(leg_bytes(&m, 0)[3 * 512], 9, "written back");
        let l = m.legs();
        assert_eq!(
            (l[0].read_errors, l[0].repairs, l[0].state),
            (1, 1, LegState::Active)
        );
        assert_eq!(l[1].repairs, 0);
    }

    #[test]
    fn a_failed_write_takes_the_leg_out_and_the_rest_serve() {
        let m = mirror(2);
        m.leg(1)
            .unwrap()
            .inject(Fault::WriteRange(0..64), IoError::Device(1));
        let data = vec![5u8; 512];
        pollster::block_on(m.write(1, &data, WriteFlags::NONE)).unwrap();
        assert_eq!(m.failed_copies(), 0b10);
        assert_eq!(m.legs()[1].state, LegState::Failed);
        // Later requests skip it; reading it alone says it is out of service.
        pollster::block_on(m.write(2, &data, WriteFlags::NONE)).unwrap();
        pollster::block_on(m.flush()).unwrap();
        let mut back = vec![0u8; 512];
        assert_eq!(
            pollster::block_on(m.read_copy(1, 1, &mut back)),
            Err(IoError::Dead)
        );
        pollster::block_on(m.read(2, &mut back)).unwrap();
        assert_eq!(back, data);
        // The last leg is never taken out: its errors are the volume's.
        m.leg(0)
            .unwrap()
            .inject(Fault::WriteRange(0..64), IoError::Device(1));
        assert_eq!(
            pollster::block_on(m.write(2, &data, WriteFlags::NONE)),
            Err(IoError::Device(1))
        );
        m.fail_copy(0);
        assert_eq!(m.failed_copies(), 0b10);
    }

    #[test]
    fn no_repair_over_a_recent_write() {
        let m = mirror(2);
        let data = vec![3u8; 512];
        pollster::block_on(m.write(8, &data, WriteFlags::NONE)).unwrap();
        pollster::block_on(m.repair_copy(0, 8, &[0u8; 512])).unwrap();
        assert_eq!(leg_bytes(&m, 0)[8 * 512], 3, "left alone");
        assert_eq!(m.legs()[0].repairs, 0);
        pollster::block_on(m.repair_copy(0, 9, &data)).unwrap();
        assert_eq!((leg_bytes(&m, 0)[9 * 512], m.legs()[0].repairs), (3, 1));
    }

    #[test]
    fn read_errors_past_the_limit_take_a_leg_out() {
        let m = mirror(2).with_read_error_limit(2);
        m.leg(0)
            .unwrap()
            .inject(Fault::ReadRange(0..64), IoError::Timeout);
        let mut buf = vec![0u8; 512];
        pollster::block_on(m.read(0, &mut buf)).unwrap();
        assert_eq!(m.failed_copies(), 0);
        pollster::block_on(m.read(0, &mut buf)).unwrap();
        assert_eq!(m.failed_copies(), 0b01);
    }

    #[test]
    fn missing_legs_and_geometry() {
        let m = MirrorDisk::new(vec![None, Some(MemDisk::new(512, 64))]).unwrap();
        assert_eq!(m.failed_copies(), 0b01);
        assert_eq!(m.legs()[0].state, LegState::Missing);
        assert_eq!(m.geometry().num_blocks, 64);
        let none: Vec<Option<MemDisk>> = vec![None];
        assert_eq!(MirrorDisk::new(none).err(), Some(MirrorError::NoLegs));
        let mixed = vec![Some(MemDisk::new(512, 64)), Some(MemDisk::new(4096, 8))];
        assert_eq!(MirrorDisk::new(mixed).err(), Some(MirrorError::BlockSizes));
        let sizes = vec![Some(MemDisk::new(512, 64)), Some(MemDisk::new(512, 32))];
        assert_eq!(MirrorDisk::new(sizes).unwrap().geometry().num_blocks, 32);
    }

    #[test]
    fn a_mirror_is_a_device() {
        pollster::block_on(crate::tests::exercise(&mirror(2)));
    }
}
