//! The HPET's main counter, as an independent time reference.

use crate::hal::mmio::MmioRegion;
use crate::hal::paging;

const CAPABILITIES: usize = 0x00;
const CONFIG: usize = 0x10;
const COUNTER: usize = 0xf0;

/// A running HPET main counter.
#[derive(Debug)]
pub struct Hpet {
    regs: MmioRegion,
    period_fs: u64,
}

impl Hpet {
    /// Maps the HPET at `phys` and starts its main counter. `None` if it reports a
    /// nonsensical period.
    pub fn start(phys: u64) -> Option<Hpet> {
        let regs = paging::map_mmio(phys, 0x400).ok()?;
        let period_fs = regs.read64(CAPABILITIES) >> 32;
        // The spec bounds the period to (0, 100 ns].
        if period_fs == 0 || period_fs > 100_000_000 {
            return None;
        }
        regs.write64(CONFIG, regs.read64(CONFIG) | 1);
        Some(Hpet { regs, period_fs })
    }

    /// Nanoseconds on the HPET's counter (since it started; arbitrary origin).
    pub fn nanos(&self) -> u64 {
        (u128::from(self.regs.read64(COUNTER)) * u128::from(self.period_fs) / 1_000_000) as u64
    }

    /// The counter's frequency in Hz.
    pub fn hz(&self) -> u64 {
        1_000_000_000_000_000 / self.period_fs
    }
}
