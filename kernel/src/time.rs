//! Monotonic time as the kernel sees it: nanoseconds since the clock was calibrated.
//!
//! [`Instant`] is pure data; the kernel's clock (TSC-based, see `clock`) produces them, and
//! the executor's timers compare them.

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point on the monotonic clock, in nanoseconds since boot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant(0);
    /// The far future: a deadline that never comes.
    pub const MAX: Instant = Instant(u64::MAX);

    /// An instant `nanos` nanoseconds after boot.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds since boot.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating at [`Instant::MAX`].
    pub fn saturating_add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl Sub for Instant {
    type Output = Duration;
    /// Saturating: an earlier minus a later instant is zero.
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// Seconds with microseconds, the format of log timestamps: `12.345678`.
impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0 / 1_000;
        write!(f, "{}.{:06}", micros / 1_000_000, micros % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_nanos(1_500);
        assert_eq!((t + Duration::from_nanos(500)).as_nanos(), 2_000);
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(t - Instant::from_nanos(2_000), Duration::ZERO);
        assert_eq!(Instant::from_nanos(3_000) - t, Duration::from_nanos(1_500));
    }

    #[test]
    fn displays_seconds_and_micros() {
        assert_eq!(Instant::from_nanos(12_345_678_901).to_string(), "12.345678");
        assert_eq!(Instant::ZERO.to_string(), "0.000000");
    }
}
