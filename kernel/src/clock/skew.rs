//! How far another CPU's TSC is from the boot CPU's: the arithmetic of the check each
//! application processor goes through at bring-up (pure; the exchange itself is
//! `smp::start`'s).
//!
//! [`now`](super::now) scales the TSC of the CPU it runs on, so a CPU whose TSC is offset
//! from CPU 0's would see time jump when a task's timestamps cross CPUs (a deadline set
//! on one CPU checked on another, a request timed across two). Firmware normally starts
//! every TSC together; this check finds out. CPU 0 and the new CPU take turns through a
//! shared word: CPU 0 reads its TSC (`sent`) and hands the turn over, the other CPU reads
//! its own (`echo`) and hands it back, and CPU 0 reads its TSC again (`back`). The echo
//! was read between the two, so the other TSC's offset (its reading minus CPU 0's at the
//! same instant) lies in `[echo - back, echo - sent]`, whatever the delays. Every round
//! narrows the interval ([`Skew::measure`]); if it excludes zero the offset is real and
//! is corrected (its midpoint subtracted from that CPU's TSC in `now`, leaving at most
//! half the interval); otherwise the TSCs agree within the measurement.

use serde::Serialize;

/// One exchange of TSC readings: CPU 0's before (`sent`) and after (`back`) the other
/// CPU's (`echo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundTrip {
    /// CPU 0's TSC when it handed the turn over.
    pub sent: u64,
    /// The other CPU's TSC when it had the turn.
    pub echo: u64,
    /// CPU 0's TSC when it had the turn back.
    pub back: u64,
}

impl RoundTrip {
    /// The offsets this exchange allows: `(lowest, highest)`, in TSC ticks.
    fn bounds(&self) -> (i64, i64) {
        let diff = |a: u64, b: u64| a.wrapping_sub(b) as i64;
        (diff(self.echo, self.back), diff(self.echo, self.sent))
    }

    /// How long the exchange took on CPU 0's TSC.
    fn duration(&self) -> u64 {
        self.back.wrapping_sub(self.sent)
    }
}

/// What the exchanges say about the other CPU's TSC minus CPU 0's, in TSC ticks: it lies
/// in `low..=high`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skew {
    /// The lowest offset every exchange allows.
    pub low: i64,
    /// The highest.
    pub high: i64,
}

impl Skew {
    /// The interval every exchange allows. Exchanges that contradict each other (the
    /// intervals do not meet: the TSCs do not tick at one rate) leave the interval of
    /// the quickest one. `None` without exchanges.
    pub fn measure(trips: &[RoundTrip]) -> Option<Skew> {
        let quickest = trips.iter().min_by_key(|t| t.duration())?;
        let (low, high) = trips
            .iter()
            .map(RoundTrip::bounds)
            .fold((i64::MIN, i64::MAX), |(l, h), (tl, th)| {
                (l.max(tl), h.min(th))
            });
        let (low, high) = if low <= high {
            (low, high)
        } else {
            quickest.bounds()
        };
        Some(Skew { low, high })
    }

    /// Whether the offset is known not to be zero.
    pub fn is_real(&self) -> bool {
        self.low > 0 || self.high < 0
    }

    /// The middle of the interval: the best estimate of the offset.
    pub fn estimate(&self) -> i64 {
        self.low + ((self.high as i128 - self.low as i128) / 2) as i64
    }

    /// What to subtract from the other CPU's TSC: the estimate if the offset is real,
    /// else nothing.
    pub fn correction(&self) -> i64 {
        if self.is_real() {
            self.estimate()
        } else {
            0
        }
    }

    /// How far the other CPU's clock may still be from CPU 0's once the
    /// [`correction`](Skew::correction) is applied, in TSC ticks.
    pub fn residual(&self) -> u64 {
        let c = i128::from(self.correction());
        (i128::from(self.high) - c)
            .abs()
            .max((i128::from(self.low) - c).abs()) as u64
    }
}

/// One CPU's TSC against CPU 0's, as the counters document reports it (`cpus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TscCheck {
    /// The offset measured (its TSC minus CPU 0's), in nanoseconds: the middle of what
    /// the exchanges allow.
    pub offset_ns: i64,
    /// How far its clock may be from CPU 0's now (after the correction, if any), in
    /// nanoseconds.
    pub bound_ns: u64,
    /// The offset was real and is subtracted from its TSC in `clock::now()`.
    pub corrected: bool,
}

impl TscCheck {
    /// The report of `skew`, with `ns_per_tick` (a 32.32 fixed-point number) to convert
    /// ticks.
    pub fn of(skew: &Skew, ns_per_tick: u64) -> TscCheck {
        let ns = |ticks: i128| (ticks * i128::from(ns_per_tick)) >> 32;
        TscCheck {
            offset_ns: ns(i128::from(skew.estimate())) as i64,
            bound_ns: ns(i128::from(skew.residual())) as u64,
            corrected: skew.is_real(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trip(sent: u64, echo: u64, back: u64) -> RoundTrip {
        RoundTrip { sent, echo, back }
    }

    #[test]
    fn agreeing_tscs_show_no_real_offset() {
        // The echo always falls inside CPU 0's window: an offset of zero fits.
        let trips = [
            trip(1000, 1040, 1100),
            trip(2000, 2030, 2050),
            trip(3000, 3070, 3080),
        ];
        let s = Skew::measure(&trips).unwrap();
        // low = max(-60, -20, -10), high = min(40, 30, 70)
        assert_eq!(s, Skew { low: -10, high: 30 });
        assert!(!s.is_real());
        assert_eq!(s.correction(), 0);
        assert_eq!(s.residual(), 30);
    }

    #[test]
    fn an_offset_larger_than_the_round_trip_is_found_and_corrected() {
        // The other TSC runs 5000 ticks ahead; each exchange takes 100-200 ticks.
        let trips = [
            trip(10_000, 15_050, 10_100),
            trip(20_000, 25_120, 20_200),
            trip(30_000, 35_010, 30_150),
        ];
        let s = Skew::measure(&trips).unwrap();
        // low = max(4950, 4920, 4860) = 4950, high = min(5050, 5120, 5010) = 5010
        assert_eq!(
            s,
            Skew {
                low: 4950,
                high: 5010
            }
        );
        assert!(s.is_real());
        assert_eq!(s.correction(), 4980);
        assert_eq!(s.residual(), 30);
        // Behind works the same.
        let s = Skew::measure(&[trip(10_000, 7_000, 10_100)]).unwrap();
        assert_eq!((s.low, s.high, s.correction()), (-3100, -3000, -3050));
    }

    #[test]
    fn contradicting_exchanges_fall_back_to_the_quickest() {
        // Intervals [40, 60] and [140, 160] do not meet: TSCs drifting apart.
        let trips = [
            trip(0, 60, 20),
            trip(1000, 1160, 1020),
            trip(2000, 2100, 2900),
        ];
        let s = Skew::measure(&trips).unwrap();
        assert_eq!(s, Skew { low: 40, high: 60 });
        assert_eq!(Skew::measure(&[]), None);
    }

    #[test]
    fn wrapping_counters_and_extremes_do_not_overflow() {
        let s = Skew::measure(&[trip(u64::MAX - 10, 5, 10)]).unwrap();
        assert_eq!((s.low, s.high), (-5, 16));
        let wide = Skew {
            low: i64::MIN,
            high: i64::MAX,
        };
        assert_eq!(wide.estimate(), -1);
        assert_eq!(wide.correction(), 0);
    }

    #[test]
    fn the_report_is_in_nanoseconds() {
        let skew = Skew {
            low: 4950,
            high: 5010,
        };
        // 2 GHz: half a nanosecond per tick.
        let check = TscCheck::of(&skew, 1 << 31);
        assert_eq!(
            check,
            TscCheck {
                offset_ns: 2490,
                bound_ns: 15,
                corrected: true
            }
        );
    }
}
