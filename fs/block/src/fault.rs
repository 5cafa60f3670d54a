//! [`FaultDisk`]: injects I/O errors and corrupts read data, by rule, for tests of the
//! filesystem's error paths (EIO, checksum failures).

use alloc::vec::Vec;
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

/// What a [`FaultDisk`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
        }
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
        let (writes, flushes) = (counters.writes, counters.flushes);
        let mut chance = |ppm: u32| rng.rand_range(0..1_000_000) < u64::from(ppm);
        let hit = rules.iter().find_map(|(fault, error)| {
            let applies = match fault {
                Fault::NthWrite(n) => is_write && writes == *n,
                Fault::NthFlush(n) => is_flush && flushes == *n,
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
