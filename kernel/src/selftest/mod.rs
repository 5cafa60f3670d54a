//! Boot self-checks (`selftest` on the command line; `selftest=block` runs the
//! block-device checks of [`block`] instead).
//!
//! Each check exercises one piece of the kernel on the real (virtual) hardware and logs
//! `selftest: NAME: ok (details)` or `selftest: NAME: FAILED: why`; checks whose device is
//! absent log `skipped`. The run ends with `selftest: N passed, M failed, K skipped` and
//! powers off with [`ExitCode::Success`] or [`ExitCode::SelftestFailed`]. Each verdict is
//! also a `selftest` event, and the summary a `selftest_done` one ([`crate::event`]):
//! the QEMU boot tests (`tests/`) read those.

mod block;
mod clock;
mod devices;
mod dma;
mod memory;

pub use block::run as run_block;

use alloc::string::String;

use crate::event::{self, Event, Facts};
use crate::exit::ExitCode;
use crate::mm::setup::MemorySummary;

/// What a check concluded.
pub enum Verdict {
    /// It worked; the string says what was measured.
    Pass(String),
    /// It worked; the string says what was measured, the facts give the figures
    /// programs read (the event's `facts`).
    Measured(String, Facts),
    /// It did not; the string says why.
    Fail(String),
    /// What it checks is not present.
    Skip(&'static str),
}

/// What the checks being recorded run on: a block device in a completion mode.
#[derive(Clone, Debug)]
pub struct Subject {
    /// `nvme` or `virtio`.
    pub kind: &'static str,
    /// Its PCI address.
    pub device: String,
    /// `irq` or `poll`.
    pub mode: &'static str,
}

/// Counts verdicts and logs each one.
#[derive(Debug, Default)]
pub struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
    /// What the checks recorded now run on, if not the machine as a whole.
    subject: Option<Subject>,
}

impl Tally {
    /// The checks recorded from now on run on `subject`.
    pub fn subject(&mut self, subject: Option<Subject>) {
        self.subject = subject;
    }

    /// Logs `selftest: NAME: ok (...)`, `FAILED: ...` or `skipped (...)` (NAME prefixed
    /// with the subject: `block nvme 00:04.0 irq: spread`), and emits its `selftest`
    /// event.
    pub fn record(&mut self, check: &str, v: Verdict) {
        let name = match &self.subject {
            Some(s) => alloc::format!("block {} {} {}: {check}", s.kind, s.device, s.mode),
            None => check.into(),
        };
        let (result, detail, facts) = match v {
            Verdict::Pass(detail) => {
                self.passed += 1;
                log::info!("selftest: {name}: ok ({detail})");
                ("ok", detail, Facts::new())
            }
            Verdict::Measured(detail, facts) => {
                self.passed += 1;
                log::info!("selftest: {name}: ok ({detail})");
                ("ok", detail, facts)
            }
            Verdict::Fail(why) => {
                self.failed += 1;
                log::error!("selftest: {name}: FAILED: {why}");
                ("failed", why, Facts::new())
            }
            Verdict::Skip(why) => {
                self.skipped += 1;
                log::info!("selftest: {name}: skipped ({why})");
                ("skipped", why.into(), Facts::new())
            }
        };
        let s = self.subject.as_ref();
        event::emit(Event::Selftest {
            check: check.into(),
            kind: s.map(|s| s.kind),
            device: s.map(|s| s.device.as_str().into()),
            mode: s.map(|s| s.mode),
            result,
            detail: detail.into(),
            facts,
        });
    }

    /// Logs the summary line and returns the exit code for it.
    pub fn finish(self) -> ExitCode {
        let Tally {
            passed,
            failed,
            skipped,
            ..
        } = self;
        log::info!("selftest: {passed} passed, {failed} failed, {skipped} skipped");
        event::emit(Event::SelftestDone {
            passed,
            failed,
            skipped,
        });
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
