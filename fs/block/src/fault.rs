//! [`FaultDisk`]: injects I/O errors and corrupts read data, by rule: for tests of the
//! filesystem's error paths (EIO, checksum failures), and in the appliance over its real
//! disk (`fault=` on the kernel command line), as smoltcp's `FaultInjector` sits over a
//! `phy::Device`. Rules have a text form ([`Fault::parse`], [`Fault`]'s `Display`).

use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use spin::Mutex;

use crate::{BlockDevice, Geometry, IoError, WriteFlags};

/// When to inject a fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fail the `n`-th write request (counting from 0 over the disk's life).
    NthWrite(u64),
    /// Fail the `n`-th flush request.
    NthFlush(u64),
    /// Fail the `n`-th read request.
    NthRead(u64),
    /// Fail every flush from `ns` nanoseconds after the disk was wrapped on (needs a
    /// clock: [`FaultDisk::with_clock`]).
    FlushesAfter(u64),
    /// Fail every write from `ns` nanoseconds after the disk was wrapped on.
    WritesAfter(u64),
    /// Fail every write touching these blocks.
    WriteRange(Range<u64>),
    /// Fail every read touching these blocks.
    ReadRange(Range<u64>),
    /// Fail each write with this probability, in parts per million (seeded RNG).
    RandomWrites(u32),
    /// Fail each read with this probability, in parts per million (seeded RNG).
    RandomReads(u32),
    /// Reads succeed, but one (seeded-random) bit of every block read from these blocks
    /// is flipped in the returned data; the device content is untouched.
    FlipBits(Range<u64>),
}

impl Fault {
    /// Parses the text form: `write:N`, `flush:N`, `read:N` (the N-th request of that
    /// kind, from 0), `writes:PPM`, `reads:PPM` (a fraction, in parts per million),
    /// `write-range:A-B`, `read-range:A-B` (blocks A..B), `flip:A-B` (a flipped bit in
    /// every block read from A..B), `flush-after:S`, `write-after:S` (every request of
    /// that kind from S seconds on).
    pub fn parse(text: &str) -> Result<Fault, &'static str> {
        let (kind, arg) = text
            .split_once(':')
            .ok_or("expected KIND:ARG (write:N, flush-after:S, ...)")?;
        let number = || arg.parse::<u64>().map_err(|_| "expected a number");
        let range = || -> Result<Range<u64>, &'static str> {
            let (a, b) = arg.split_once('-').ok_or("expected a block range A-B")?;
            let (a, b) = (a.parse::<u64>(), b.parse::<u64>());
            match (a, b) {
                (Ok(a), Ok(b)) if a < b => Ok(a..b),
                _ => Err("expected a block range A-B with A < B"),
            }
        };
        let ppm = || {
            number()
                .ok()
                .filter(|p| *p <= 1_000_000)
                .map(|p| p as u32)
                .ok_or("expected parts per million, 0-1000000")
        };
        let seconds = || number().map(|s| s.saturating_mul(1_000_000_000));
        Ok(match kind {
            "write" => Fault::NthWrite(number()?),
            "flush" => Fault::NthFlush(number()?),
            "read" => Fault::NthRead(number()?),
            "writes" => Fault::RandomWrites(ppm()?),
            "reads" => Fault::RandomReads(ppm()?),
            "write-range" => Fault::WriteRange(range()?),
            "read-range" => Fault::ReadRange(range()?),
            "flip" => Fault::FlipBits(range()?),
            "flush-after" => Fault::FlushesAfter(seconds()?),
            "write-after" => Fault::WritesAfter(seconds()?),
            _ => return Err("unknown fault kind"),
        })
    }

    /// Whether the rule needs a clock ([`FaultDisk::with_clock`]).
    pub fn is_timed(&self) -> bool {
        matches!(self, Fault::FlushesAfter(_) | Fault::WritesAfter(_))
    }
}

/// The text form [`Fault::parse`] reads (times in whole seconds).
impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NS: u64 = 1_000_000_000;
        match self {
            Fault::NthWrite(n) => write!(f, "write:{n}"),
            Fault::NthFlush(n) => write!(f, "flush:{n}"),
            Fault::NthRead(n) => write!(f, "read:{n}"),
            Fault::RandomWrites(p) => write!(f, "writes:{p}"),
            Fault::RandomReads(p) => write!(f, "reads:{p}"),
            Fault::WriteRange(r) => write!(f, "write-range:{}-{}", r.start, r.end),
            Fault::ReadRange(r) => write!(f, "read-range:{}-{}", r.start, r.end),
            Fault::FlipBits(r) => write!(f, "flip:{}-{}", r.start, r.end),
            Fault::FlushesAfter(ns) => write!(f, "flush-after:{}", ns / NS),
            Fault::WritesAfter(ns) => write!(f, "write-after:{}", ns / NS),
        }
    }
}

/// What a [`FaultDisk`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FaultCounters {
    /// Write requests seen.
    pub writes: u64,
    /// Flush requests seen.
    pub flushes: u64,
    /// Read requests seen.
    pub reads: u64,
    /// Requests failed on purpose.
    pub injected_errors: u64,
    /// Blocks returned with a flipped bit.
    pub corrupted_blocks: u64,
}

#[derive(Debug)]
struct State {
    rules: Vec<(Fault, IoError)>,
    rng: oorandom::Rand64,
    counters: FaultCounters,
}

/// A device that fails or corrupts requests to `D` according to its rules. A failed
/// write or flush is not passed down (the device rejected it).
#[derive(Debug)]
pub struct FaultDisk<D> {
    inner: D,
    state: Mutex<State>,
    /// Nanoseconds on some monotonic clock, for the timed rules; none: they never apply.
    clock: Option<fn() -> u64>,
    /// The clock's reading when the disk was wrapped.
    started: u64,
}

fn overlaps(range: &Range<u64>, lba: u64, blocks: u64) -> bool {
    lba < range.end && range.start < lba + blocks
}

impl<D: BlockDevice> FaultDisk<D> {
    /// Wraps `inner` with no rules; `seed` drives the random rules.
    pub fn new(inner: D, seed: u64) -> FaultDisk<D> {
        FaultDisk {
            inner,
            state: Mutex::new(State {
                rules: Vec::new(),
                rng: oorandom::Rand64::new(u128::from(seed)),
                counters: FaultCounters::default(),
            }),
            clock: None,
            started: 0,
        }
    }

    /// Like [`FaultDisk::new`], with a clock (nanoseconds) for the timed rules, which
    /// count from now.
    pub fn with_clock(inner: D, seed: u64, clock: fn() -> u64) -> FaultDisk<D> {
        FaultDisk {
            clock: Some(clock),
            started: clock(),
            ..Self::new(inner, seed)
        }
    }

    /// Whether any rule is set.
    pub fn is_armed(&self) -> bool {
        !self.state.lock().rules.is_empty()
    }

    /// Adds a rule: when `fault` applies, the request fails with `error`.
    pub fn inject(&self, fault: Fault, error: IoError) {
        self.state.lock().rules.push((fault, error));
    }

    /// Removes every rule.
    pub fn heal(&self) {
        self.state.lock().rules.clear();
    }

    /// What was seen and done so far.
    pub fn counters(&self) -> FaultCounters {
        self.state.lock().counters
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn blocks(&self, len: usize) -> u64 {
        (len / self.inner.geometry().block_size as usize) as u64
    }

    /// The error to inject into a request, if any rule says so.
    fn decide(&self, is_write: bool, is_flush: bool, lba: u64, blocks: u64) -> Option<IoError> {
        let mut st = self.state.lock();
        let State {
            rules,
            rng,
            counters,
        } = &mut *st;
        let (writes, flushes, reads) = (counters.writes, counters.flushes, counters.reads);
        let elapsed = self.clock.map(|now| now().saturating_sub(self.started));
        let past = |ns: &u64| elapsed.is_some_and(|e| e >= *ns);
        let is_read = !is_write && !is_flush;
        let mut chance = |ppm: u32| rng.rand_range(0..1_000_000) < u64::from(ppm);
        let hit = rules.iter().find_map(|(fault, error)| {
            let applies = match fault {
                Fault::NthWrite(n) => is_write && writes == *n,
                Fault::NthFlush(n) => is_flush && flushes == *n,
                Fault::NthRead(n) => is_read && reads == *n,
                Fault::FlushesAfter(ns) => is_flush && past(ns),
                Fault::WritesAfter(ns) => is_write && past(ns),
                Fault::WriteRange(r) => is_write && overlaps(r, lba, blocks),
                Fault::ReadRange(r) => !is_write && !is_flush && overlaps(r, lba, blocks),
                Fault::RandomWrites(ppm) => is_write && chance(*ppm),
                Fault::RandomReads(ppm) => !is_write && !is_flush && chance(*ppm),
                Fault::FlipBits(_) => false,
            };
            applies.then_some(*error)
        });
        if is_write {
            counters.writes += 1;
        } else if is_flush {
            counters.flushes += 1;
        } else {
            counters.reads += 1;
        }
        counters.injected_errors += u64::from(hit.is_some());
        hit
    }

    fn corrupt(&self, lba: u64, buf: &mut [u8]) {
        let block = self.inner.geometry().block_size as usize;
        let mut st = self.state.lock();
        let ranges: Vec<Range<u64>> = st
            .rules
            .iter()
            .filter_map(|(f, _)| match f {
                Fault::FlipBits(r) => Some(r.clone()),
                _ => None,
            })
            .collect();
        for (i, chunk) in buf.chunks_mut(block).enumerate() {
            let b = lba + i as u64;
            if ranges.iter().any(|r| r.contains(&b)) {
                let bit = st.rng.rand_range(0..(block as u64 * 8)) as usize;
                chunk[bit / 8] ^= 1 << (bit % 8);
                st.counters.corrupted_blocks += 1;
            }
        }
    }
}

impl<D: BlockDevice> BlockDevice for FaultDisk<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        if let Some(error) = self.decide(false, false, lba, self.blocks(buf.len())) {
            return Err(error);
        }
        self.inner.read(lba, buf).await?;
        self.corrupt(lba, buf);
        Ok(())
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        if let Some(error) = self.decide(true, false, lba, self.blocks(buf.len())) {
            return Err(error);
        }
        self.inner.write(lba, buf, flags).await
    }

    async fn flush(&self) -> Result<(), IoError> {
        if let Some(error) = self.decide(false, true, 0, 0) {
            return Err(error);
        }
        self.inner.flush().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        self.inner.discard(lba, blocks).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;
    use core::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn the_text_form_round_trips_and_bad_rules_are_refused() {
        for text in [
            "write:3",
            "flush:0",
            "read:17",
            "writes:1000",
            "reads:1000000",
            "write-range:8-16",
            "read-range:0-1",
            "flip:100-200",
            "flush-after:60",
            "write-after:5",
        ] {
            let fault = Fault::parse(text).unwrap();
            assert_eq!(alloc::format!("{fault}"), text);
        }
        assert_eq!(
            Fault::parse("flush-after:2"),
            Ok(Fault::FlushesAfter(2_000_000_000))
        );
        for bad in [
            "write",
            "write:x",
            "writes:1000001",
            "flip:5-5",
            "flip:9-2",
            "tear:1",
            "",
        ] {
            assert!(Fault::parse(bad).is_err(), "{bad}");
        }
    }

    static NOW: AtomicU64 = AtomicU64::new(1_000);

    #[test]
    fn timed_rules_apply_from_their_time_on() {
        let disk = FaultDisk::with_clock(MemDisk::new(512, 64), 1, || NOW.load(Ordering::Relaxed));
        disk.inject(Fault::parse("flush-after:2").unwrap(), IoError::Device(6));
        let block = [7u8; 512];
        pollster::block_on(async {
            assert_eq!(disk.flush().await, Ok(()));
            NOW.fetch_add(1_999_999_999, Ordering::Relaxed);
            assert_eq!(disk.flush().await, Ok(()));
            NOW.fetch_add(1, Ordering::Relaxed);
            assert_eq!(disk.flush().await, Err(IoError::Device(6)));
            assert_eq!(disk.flush().await, Err(IoError::Device(6)));
            // Writes and reads are not affected by a flush rule.
            assert_eq!(disk.write(3, &block, WriteFlags::NONE).await, Ok(()));
        });
        let c = disk.counters();
        assert_eq!((c.flushes, c.writes, c.injected_errors), (4, 1, 2));
    }

    #[test]
    fn the_nth_read_fails_once() {
        let disk = FaultDisk::new(MemDisk::new(512, 64), 1);
        disk.inject(Fault::NthRead(1), IoError::Device(1));
        let mut buf = [0u8; 512];
        pollster::block_on(async {
            assert_eq!(disk.read(0, &mut buf).await, Ok(()));
            assert_eq!(disk.read(0, &mut buf).await, Err(IoError::Device(1)));
            assert_eq!(disk.read(0, &mut buf).await, Ok(()));
        });
    }
}
