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
//! superblocks so a stale leg is never trusted again.
//!
//! **Rebuilding.** A device put in a leg's place ([`MirrorDisk::attach`], or the leg
//! given at assembly) joins with [`BlockDevice::start_rebuild`]: from then on every
//! write and flush reaches it, but no read is served from it, until the caller has
//! copied every block it needs ([`BlockDevice::finish_rebuild`]). A copy must never
//! land over a newer write: the caller opens a *copy window* over the blocks
//! ([`BlockDevice::open_copy_window`], refused while a write over them is in flight),
//! reads them from the legs in service, and writes them with
//! [`BlockDevice::write_copy`], which says whether a write over the window started
//! meanwhile; if one did, the copy may be older than that write and is done again.
//! Every write is tracked from its start to its end for this (a guard, so a dropped
//! request is too).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::sync::Arc;
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
    /// Being rebuilt: every write reaches it, no read is served from it.
    Rebuilding,
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
    /// A device attached is smaller than the mirror.
    TooSmall,
    /// No such place, or the leg there is in service (or being rebuilt).
    InService,
}

impl core::fmt::Display for MirrorError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MirrorError::NoLegs => "no device present",
            MirrorError::TooManyLegs => "more than 64 devices",
            MirrorError::BlockSizes => "devices of different logical block sizes",
            MirrorError::TooSmall => "device smaller than the mirror",
            MirrorError::InService => "no such leg out of service",
        })
    }
}

/// A mirror over legs of type `D` (see the module documentation).
#[derive(Debug)]
pub struct MirrorDisk<D> {
    /// Each place's device (shared with the requests running on it, so a device can
    /// be put in a place while others are served) and counters.
    legs: Mutex<Vec<Slot<D>>>,
    writes: Mutex<Writes>,
    geometry: Geometry,
    read_error_limit: u64,
    /// Opens a device by name for [`BlockDevice::attach_named`] (the owner's way).
    opener: Option<Opener<D>>,
}

/// How the owner of a mirror opens a device by its name, for `ctl replace`: a PCI
/// selector on the appliance, an image path on the host.
pub struct Opener<D>(pub Box<OpenFn<D>>);

/// The function inside an [`Opener`].
pub type OpenFn<D> =
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<D, String>>>> + Send + Sync;

impl<D> core::fmt::Debug for Opener<D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Opener")
    }
}

/// One place of a mirror.
#[derive(Debug)]
struct Slot<D> {
    dev: Option<Arc<D>>,
    counters: LegCounters,
}

/// The writes a mirror tracks: recent ones (to refuse repairs over them) and those in
/// flight (to order rebuild copies after them).
#[derive(Debug, Default)]
struct Writes {
    /// The ranges of the latest [`RECENT_WRITES`] writes (a ring).
    recent: VecDeque<Range<u64>>,
    /// Writes started and not ended, by id.
    in_flight: Vec<(u64, Range<u64>)>,
    next_id: u64,
    /// The open copy window: its leg, its blocks, and whether a write over them has
    /// started since it opened.
    window: Option<(usize, Range<u64>, bool)>,
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Ends a write's tracking when the request ends or is dropped.
struct Tracked<'a> {
    writes: &'a Mutex<Writes>,
    id: u64,
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        let mut w = self.writes.lock();
        if let Some(i) = w.in_flight.iter().position(|(id, _)| *id == self.id) {
            w.in_flight.swap_remove(i);
        }
    }
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
        let slots = legs
            .into_iter()
            .map(|l| Slot {
                counters: LegCounters::new(if l.is_some() {
                    LegState::Active
                } else {
                    LegState::Missing
                }),
                dev: l.map(Arc::new),
            })
            .collect();
        Ok(MirrorDisk {
            legs: Mutex::new(slots),
            writes: Mutex::new(Writes::default()),
            geometry: g,
            read_error_limit: DEFAULT_READ_ERROR_LIMIT,
            opener: None,
        })
    }

    /// Puts `dev` in place `place`, whose leg is out of service (failed or missing; the
    /// device there, if any, is let go once its requests end). It stays out of service
    /// until [`BlockDevice::start_rebuild`]; its counters start at zero.
    pub fn attach(&self, place: usize, dev: D) -> Result<(), MirrorError> {
        self.fits(&dev)?;
        let mut legs = self.legs.lock();
        let slot = legs.get_mut(place).ok_or(MirrorError::InService)?;
        if !matches!(slot.counters.state, LegState::Failed | LegState::Missing) {
            return Err(MirrorError::InService);
        }
        Self::put(slot, place, dev);
        Ok(())
    }

    /// Whether `dev` can be a leg: the same logical block size, no smaller.
    fn fits(&self, dev: &D) -> Result<(), MirrorError> {
        let g = dev.geometry();
        if g.block_size != self.geometry.block_size {
            return Err(MirrorError::BlockSizes);
        }
        if g.num_blocks < self.geometry.num_blocks || g.max_transfer < self.geometry.max_transfer {
            return Err(MirrorError::TooSmall);
        }
        Ok(())
    }

    fn put(slot: &mut Slot<D>, place: usize, dev: D) {
        *slot = Slot {
            dev: Some(Arc::new(dev)),
            counters: LegCounters::new(LegState::Failed),
        };
        log::info!("mirror: a device was put in place {place}");
    }

    /// Lets [`BlockDevice::attach_named`] open devices by name with `opener`.
    pub fn with_opener(mut self, opener: Opener<D>) -> MirrorDisk<D> {
        self.opener = Some(opener);
        self
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

    /// Leg `i`'s device, if present.
    pub fn leg(&self, i: usize) -> Option<Arc<D>> {
        self.legs.lock().get(i)?.dev.clone()
    }

    /// Each leg's state and counters, in place order.
    pub fn legs(&self) -> Vec<LegCounters> {
        self.legs.lock().iter().map(|s| s.counters).collect()
    }

    /// The legs in one of `states`, in place order.
    fn in_state(&self, states: &[LegState]) -> Vec<(usize, LegState, Arc<D>)> {
        self.legs
            .lock()
            .iter()
            .enumerate()
            .filter(|(_, s)| states.contains(&s.counters.state))
            .filter_map(|(i, s)| Some((i, s.counters.state, s.dev.clone()?)))
            .collect()
    }

    /// The legs in service, in place order.
    fn active(&self) -> Vec<(usize, LegState, Arc<D>)> {
        self.in_state(&[LegState::Active])
    }

    /// The legs every write reaches: those in service and those being rebuilt.
    fn written(&self) -> Vec<(usize, LegState, Arc<D>)> {
        self.in_state(&[LegState::Active, LegState::Rebuilding])
    }

    /// Takes leg `i` out of service unless it is the last one in it; says whether it
    /// did. A leg being rebuilt is always taken out (it serves no read).
    fn take_out(legs: &mut [Slot<D>], i: usize, why: &str) -> bool {
        let others = legs
            .iter()
            .enumerate()
            .any(|(j, s)| j != i && s.counters.state == LegState::Active);
        match legs[i].counters.state {
            LegState::Active if others => {}
            LegState::Rebuilding => {}
            _ => return false,
        }
        legs[i].counters.state = LegState::Failed;
        log::error!("mirror: leg {i} taken out of service ({why}); the others serve");
        true
    }

    /// Counts a failed read on leg `i`, taking it out at the limit.
    fn read_failed(&self, i: usize, e: IoError) {
        let mut legs = self.legs.lock();
        legs[i].counters.read_errors += 1;
        log::warn!("mirror: leg {i}: read error: {e}");
        if legs[i].counters.read_errors >= self.read_error_limit {
            Self::take_out(&mut legs, i, "too many read errors");
        }
    }

    /// The leg in service `copy`, if it is.
    fn active_leg(&self, copy: usize) -> Result<Arc<D>, IoError> {
        let legs = self.legs.lock();
        let slot = legs.get(copy).ok_or(IoError::Dead)?;
        match (&slot.dev, slot.counters.state) {
            (Some(d), LegState::Active) => Ok(d.clone()),
            _ => Err(IoError::Dead),
        }
    }

    /// Runs `request` on every leg written (in service or being rebuilt) at once.
    /// Legs that fail while a leg in service succeeds are taken out of service; fails
    /// when every leg in service failed (a leg being rebuilt does not count: it holds
    /// no whole copy yet).
    async fn on_all<F, Fut>(&self, request: F) -> Result<(), IoError>
    where
        F: Fn(Arc<D>) -> Fut,
        Fut: Future<Output = Result<(), IoError>>,
    {
        let legs = self.written();
        let results = join_all(legs.iter().map(|(_, _, d)| request(d.clone())).collect()).await;
        let served = legs
            .iter()
            .zip(&results)
            .any(|((_, state, _), r)| *state == LegState::Active && r.is_ok());
        if !served {
            let err = legs
                .iter()
                .zip(&results)
                .filter(|((_, state, _), _)| *state == LegState::Active)
                .find_map(|(_, r)| r.err());
            return Err(err.unwrap_or(IoError::Dead));
        }
        let mut slots = self.legs.lock();
        for ((i, _, _), r) in legs.iter().zip(&results) {
            if let Err(e) = r {
                slots[*i].counters.write_errors += 1;
                log::error!("mirror: leg {i}: {e}");
                Self::take_out(&mut slots, *i, "write or flush failed");
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

impl LegCounters {
    /// A leg in `state` with nothing counted yet.
    fn new(state: LegState) -> LegCounters {
        LegCounters {
            state,
            read_errors: 0,
            write_errors: 0,
            repairs: 0,
        }
    }
}

impl<D: BlockDevice> BlockDevice for MirrorDisk<D> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        let mut failed = Vec::new();
        let mut last = IoError::Dead;
        for (i, _, leg) in self.active() {
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
        let range = lba..lba + self.blocks(buf.len());
        let _tracked = {
            let mut w = self.writes.lock();
            if w.recent.len() == RECENT_WRITES {
                w.recent.pop_front();
            }
            w.recent.push_back(range.clone());
            if let Some((_, window, dirty)) = w.window.as_mut() {
                *dirty |= overlaps(window, &range);
            }
            let id = w.next_id;
            w.next_id += 1;
            w.in_flight.push((id, range));
            Tracked {
                writes: &self.writes,
                id,
            }
        };
        self.on_all(|d| async move { d.write(lba, buf, flags).await })
            .await
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.on_all(|d| async move { d.flush().await }).await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        if !self.geometry.discard {
            return Err(IoError::Unsupported);
        }
        // Discarded content is unspecified: a leg that keeps the old data is no worse
        // (one being rebuilt included).
        let legs = self.active();
        let results = join_all(
            legs.iter()
                .map(|(_, _, d)| d.discard(lba, blocks))
                .collect(),
        )
        .await;
        match results.iter().find(|r| r.is_ok()) {
            Some(_) => Ok(()),
            None => results.into_iter().next().unwrap_or(Err(IoError::Dead)),
        }
    }

    fn copies(&self) -> usize {
        self.legs.lock().len()
    }

    async fn read_copy(&self, copy: usize, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        check_request(&self.geometry, lba, buf.len())?;
        let leg = self.active_leg(copy)?;
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
            .writes
            .lock()
            .recent
            .iter()
            .any(|r| overlaps(r, &(lba..end)))
        {
            log::info!("mirror: leg {copy}: blocks at {lba} written lately; repair left for later");
            return Ok(());
        }
        let leg = self.active_leg(copy)?;
        let r = leg.write(lba, buf, WriteFlags::NONE).await;
        let mut legs = self.legs.lock();
        match r {
            Ok(()) => {
                legs[copy].counters.repairs += 1;
                log::warn!("mirror: leg {copy}: repaired blocks {lba}..{end}");
            }
            Err(e) => {
                legs[copy].counters.write_errors += 1;
                log::error!("mirror: leg {copy}: repair at {lba}: {e}");
                Self::take_out(&mut legs, copy, "repair failed");
            }
        }
        r
    }

    fn failed_copies(&self) -> u64 {
        self.legs
            .lock()
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s.counters.state, LegState::Failed | LegState::Missing))
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    fn fail_copy(&self, copy: usize) {
        let mut legs = self.legs.lock();
        if copy < legs.len() {
            Self::take_out(&mut legs, copy, "stale");
        }
    }

    fn rebuilding_copies(&self) -> u64 {
        self.legs
            .lock()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.counters.state == LegState::Rebuilding)
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    fn start_rebuild(&self, copy: usize) -> bool {
        let mut legs = self.legs.lock();
        // One rebuild at a time: the copy window is the mirror's.
        if legs
            .iter()
            .any(|s| s.counters.state == LegState::Rebuilding)
        {
            return false;
        }
        match legs.get_mut(copy) {
            Some(s) if s.dev.is_some() && s.counters.state != LegState::Rebuilding => {
                s.counters.state = LegState::Rebuilding;
                log::info!("mirror: leg {copy} is being rebuilt: written, not read");
                true
            }
            _ => false,
        }
    }

    fn finish_rebuild(&self, copy: usize) {
        let mut legs = self.legs.lock();
        if let Some(s) = legs.get_mut(copy) {
            if s.counters.state == LegState::Rebuilding {
                s.counters.state = LegState::Active;
                log::info!("mirror: leg {copy} rebuilt: in service");
            }
        }
    }

    fn open_copy_window(&self, copy: usize, lba: u64, blocks: u64) -> bool {
        let range = lba..lba + blocks;
        let mut w = self.writes.lock();
        // A window left open (its copy was given up) is simply replaced.
        if w.in_flight.iter().any(|(_, r)| overlaps(r, &range)) {
            return false;
        }
        w.window = Some((copy, range, false));
        true
    }

    async fn write_copy(&self, copy: usize, lba: u64, buf: &[u8]) -> Result<bool, IoError> {
        let leg = {
            let legs = self.legs.lock();
            legs.get(copy)
                .filter(|s| s.counters.state == LegState::Rebuilding)
                .and_then(|s| s.dev.clone())
        };
        let written = match (leg, check_request(&self.geometry, lba, buf.len())) {
            (_, Err(e)) => Err(e),
            (None, _) => Err(IoError::Dead),
            (Some(leg), Ok(())) => leg.write(lba, buf, WriteFlags::NONE).await,
        };
        let window = self.writes.lock().window.take();
        let end = lba + self.blocks(buf.len());
        // No window over these blocks (none opened, or another replaced it): nothing
        // says the copy is not stale.
        let stale = !window.is_some_and(|(c, range, dirty)| {
            c == copy && range.start <= lba && end <= range.end && !dirty
        });
        if let Err(e) = written {
            let mut legs = self.legs.lock();
            if let Some(s) = legs.get_mut(copy) {
                s.counters.write_errors += 1;
            }
            log::error!("mirror: leg {copy}: rebuild write at {lba}: {e}");
            Self::take_out(&mut legs, copy, "rebuild write failed");
            return Err(e);
        }
        Ok(!stale)
    }

    async fn attach_named(&self, copy: usize, name: &str) -> Result<(), String> {
        let Some(Opener(open)) = &self.opener else {
            return Err("devices cannot be opened here".into());
        };
        if copy >= self.copies() {
            return Err(alloc::format!("no leg {copy}"));
        }
        // Opened and checked before the leg there is let go: a device that cannot be
        // used changes nothing.
        let dev = open(name.into()).await?;
        self.fits(&dev).map_err(|e| alloc::format!("{name}: {e}"))?;
        let mut legs = self.legs.lock();
        let state = legs[copy].counters.state;
        match state {
            LegState::Rebuilding => return Err(alloc::format!("leg {copy} is being rebuilt")),
            LegState::Active if !Self::take_out(&mut legs, copy, "replaced") => {
                return Err(alloc::format!("leg {copy} is the last in service"))
            }
            _ => {}
        }
        Self::put(&mut legs[copy], copy, dev);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fault, FaultDisk, MemDisk, YieldDisk};
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
    fn a_leg_being_rebuilt_is_written_never_read() {
        let m = MirrorDisk::new(vec![Some(MemDisk::new(512, 64)), None]).unwrap();
        let data = vec![4u8; 512];
        pollster::block_on(m.write(2, &data, WriteFlags::NONE)).unwrap();
        assert!(!m.start_rebuild(1), "no device there yet");
        assert_eq!(
            m.attach(0, MemDisk::new(512, 64)),
            Err(MirrorError::InService)
        );
        assert_eq!(
            m.attach(1, MemDisk::new(512, 32)),
            Err(MirrorError::TooSmall)
        );
        m.attach(1, MemDisk::new(512, 64)).unwrap();
        assert_eq!((m.failed_copies(), m.rebuilding_copies()), (0b10, 0));
        // Attached, not rebuilding: not written.
        pollster::block_on(m.write(3, &data, WriteFlags::NONE)).unwrap();
        assert_eq!(m.leg(1).unwrap().snapshot()[3 * 512], 0);
        assert!(m.start_rebuild(1));
        assert!(!m.start_rebuild(1), "one rebuild at a time");
        assert_eq!((m.failed_copies(), m.rebuilding_copies()), (0, 0b10));
        assert_eq!(m.legs()[1].state, LegState::Rebuilding);
        pollster::block_on(m.write(5, &data, WriteFlags::NONE)).unwrap();
        pollster::block_on(m.flush()).unwrap();
        assert_eq!(m.leg(1).unwrap().snapshot()[5 * 512], 4, "written");
        let mut back = vec![0u8; 512];
        assert_eq!(
            pollster::block_on(m.read_copy(1, 5, &mut back)),
            Err(IoError::Dead),
            "never read"
        );
        // Block 2 is not on leg 1 yet: a read is served by leg 0 alone.
        pollster::block_on(m.read(2, &mut back)).unwrap();
        assert_eq!(back, data);
        // Copied through a window, then in service.
        assert!(m.open_copy_window(1, 2, 1));
        pollster::block_on(m.read(2, &mut back)).unwrap();
        assert_eq!(pollster::block_on(m.write_copy(1, 2, &back)), Ok(true));
        m.finish_rebuild(1);
        assert_eq!(m.legs()[1].state, LegState::Active);
        assert_eq!(pollster::block_on(m.read_copy(1, 2, &mut back)), Ok(()));
        assert_eq!(back, data);
    }

    #[test]
    fn a_failing_leg_being_rebuilt_is_taken_out_and_the_volume_serves() {
        let legs = vec![Some(FaultDisk::new(MemDisk::new(512, 64), 0)), None];
        let m = MirrorDisk::new(legs).unwrap();
        let new = FaultDisk::new(MemDisk::new(512, 64), 1);
        new.inject(Fault::WriteRange(0..64), IoError::Device(3));
        m.attach(1, new).unwrap();
        assert!(m.start_rebuild(1));
        pollster::block_on(m.write(1, &[1u8; 512], WriteFlags::NONE)).unwrap();
        assert_eq!(m.legs()[1].state, LegState::Failed);
        // The leg in service failing fails the write, though the rebuilt one took it.
        let m = mirror(2);
        m.fail_copy(1);
        m.attach(1, FaultDisk::new(MemDisk::new(512, 64), 1))
            .unwrap();
        assert!(m.start_rebuild(1));
        m.leg(0)
            .unwrap()
            .inject(Fault::WriteRange(0..64), IoError::Device(3));
        assert_eq!(
            pollster::block_on(m.write(1, &[1u8; 512], WriteFlags::NONE)),
            Err(IoError::Device(3))
        );
        assert_eq!(m.legs()[0].state, LegState::Active);
    }

    #[test]
    fn a_copy_is_never_taken_for_current_over_a_write() {
        use core::future::Future;
        use core::task::{Context, Waker};
        let legs = vec![Some(YieldDisk::new(MemDisk::new(512, 64))), None];
        let m = MirrorDisk::new(legs).unwrap();
        m.attach(1, YieldDisk::new(MemDisk::new(512, 64))).unwrap();
        assert!(m.start_rebuild(1));
        let old = vec![1u8; 512];
        let new = vec![2u8; 512];
        // A write over block 8 started and not ended: no window opens over it.
        let mut cx = Context::from_waker(Waker::noop());
        let mut w = Box::pin(m.write(8, &new, WriteFlags::NONE));
        assert!(w.as_mut().poll(&mut cx).is_pending());
        assert!(!m.open_copy_window(1, 6, 4));
        assert!(m.open_copy_window(1, 9, 4), "past it");
        assert!(w.as_mut().poll(&mut cx).is_ready());
        drop(w);
        // A write that starts while a window is open makes its copy stale: the copy
        // (old data, read before the write) may have landed after it.
        assert!(m.open_copy_window(1, 6, 4));
        pollster::block_on(m.write(8, &new, WriteFlags::NONE)).unwrap();
        assert_eq!(pollster::block_on(m.write_copy(1, 8, &old)), Ok(false));
        // Done again, with no write meanwhile: current.
        assert!(m.open_copy_window(1, 6, 4));
        let mut back = vec![0u8; 512];
        pollster::block_on(m.read(8, &mut back)).unwrap();
        assert_eq!(pollster::block_on(m.write_copy(1, 8, &back)), Ok(true));
        assert_eq!(m.leg(1).unwrap().inner().snapshot()[8 * 512], 2);
        // A dropped write ends too; a copy without a window is never current.
        let mut w = Box::pin(m.write(20, &new, WriteFlags::NONE));
        assert!(w.as_mut().poll(&mut cx).is_pending());
        drop(w);
        assert!(m.open_copy_window(1, 20, 1));
        assert_eq!(pollster::block_on(m.write_copy(1, 30, &old)), Ok(false));
    }

    #[test]
    fn a_mirror_is_a_device() {
        pollster::block_on(crate::tests::exercise(&mirror(2)));
    }
}
