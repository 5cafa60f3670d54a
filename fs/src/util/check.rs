//! Production checks: an invariant broken in memory, caught before it reaches the disk.
//!
//! A check that fails gives a [`Violation`] instead of panicking; the filesystem then
//! fails as after a device error (`core::checks` lists the checks and says what
//! failing means).

use alloc::string::String;
use core::fmt;

/// A broken invariant: which rule, and the numbers that broke it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule, in a few fixed words (what the log line and the tests name).
    pub what: &'static str,
    /// The values that broke it.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.what, self.detail)
    }
}

/// `Err` naming `what` unless `ok`; `detail` is only formatted when the check fails,
/// so a check that holds costs its comparison alone.
pub fn ensure(
    ok: bool,
    what: &'static str,
    detail: impl FnOnce() -> String,
) -> Result<(), Violation> {
    if ok {
        Ok(())
    } else {
        Err(Violation {
            what,
            detail: detail(),
        })
    }
}
