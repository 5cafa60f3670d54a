//! Boot self-checks (`selftest` on the command line; `selftest=block` runs the
//! block-device checks of [`block`] instead).
//!
//! Each check exercises one piece of the kernel on the real (virtual) hardware and logs
//! `selftest: NAME: ok (details)` or `selftest: NAME: FAILED: why`; checks whose device is
//! absent log `skipped`. The run ends with `selftest: N passed, M failed, K skipped` and
//! powers off with [`ExitCode::Success`] or [`ExitCode::SelftestFailed`]. The QEMU boot
//! tests (`tests/`) read these lines.

mod block;
mod clock;
mod devices;
mod dma;
mod memory;

pub use block::run as run_block;

use alloc::string::String;

use crate::exit::ExitCode;
use crate::mm::setup::MemorySummary;

/// What a check concluded.
pub enum Verdict {
    /// It worked; the string says what was measured.
    Pass(String),
    /// It did not; the string says why.
    Fail(String),
    /// What it checks is not present.
    Skip(&'static str),
}

/// Counts verdicts and logs each one.
#[derive(Debug, Default)]
pub struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Tally {
    /// Logs `selftest: NAME: ok (...)`, `FAILED: ...` or `skipped (...)`.
    pub fn record(&mut self, name: &str, v: Verdict) {
        match v {
            Verdict::Pass(detail) => {
                self.passed += 1;
                log::info!("selftest: {name}: ok ({detail})");
            }
            Verdict::Fail(why) => {
                self.failed += 1;
                log::error!("selftest: {name}: FAILED: {why}");
            }
            Verdict::Skip(why) => {
                self.skipped += 1;
                log::info!("selftest: {name}: skipped ({why})");
            }
        }
    }

    /// Logs the summary line and returns the exit code for it.
    pub fn finish(self) -> ExitCode {
        let Tally {
            passed,
            failed,
            skipped,
        } = self;
        log::info!("selftest: {passed} passed, {failed} failed, {skipped} skipped");
        if failed == 0 {
            ExitCode::Success
        } else {
            ExitCode::SelftestFailed
        }
    }
}

/// Runs every kernel check (`selftest`); returns the exit code for the result.
pub async fn run(mem: &MemorySummary) -> ExitCode {
    let mut tally = Tally::default();
    let mut record = |name: &str, v: Verdict| tally.record(name, v);
    record("heap", memory::heap(mem).await);
    record("frames", memory::frames());
    record("paging", memory::paging());
    record("clock", clock::clock().await);
    record("timer", clock::timer().await);
    record("executor", clock::executor().await);
    record("ioapic", devices::ioapic().await);
    record("msi", devices::msi().await);
    record("dma", dma::dma().await);
    record("msix", devices::msix().await);
    tally.finish()
}

/// `return Verdict::Fail(format!(...))` unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return $crate::selftest::Verdict::Fail(alloc::format!($($fmt)+));
        }
    };
}
pub(crate) use ensure;
