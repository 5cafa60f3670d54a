//! Latency histograms with fixed buckets: bounded memory, no allocation to record.
//!
//! Every [`LatencyHistogram`] has the same upper bounds, [`BOUNDS_NS`]: 50 µs to 10 s in
//! 1-2.5-5 steps (as Prometheus' default buckets, extended down to what an NVMe flush or
//! a cached 9P request takes), plus an overflow bucket. Fixed bounds keep a histogram a
//! plain array, let histograms of different sources be added, and give every series of
//! a family the same `le` labels (which `histogram_quantile` across them needs).
//!
//! [`SharedLatencyHistogram`] is the same histogram for recorders on several CPUs: its
//! counts are atomics, read into a [`LatencyHistogram`] to be reported.

use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::Relaxed;

/// Upper bounds of the buckets, in nanoseconds (the last bucket, past these, is `+Inf`).
pub const BOUNDS_NS: [u64; 17] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets of a histogram: one per bound and the overflow bucket.
pub const BUCKETS: usize = BOUNDS_NS.len() + 1;

/// Durations observed, counted in the buckets of [`BOUNDS_NS`].
///
/// With the `serde` feature it serialises as `{"count": N, "sum_ns": S, "buckets": [..]}`,
/// `buckets[i]` counting the observations in `(BOUNDS_NS[i-1], BOUNDS_NS[i]]` (not
/// cumulative; the last one those above 10 s) — the shape [`crate::document`] turns
/// into a Prometheus histogram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LatencyHistogram {
    /// Observations.
    pub count: u64,
    /// Their sum, in nanoseconds.
    pub sum_ns: u64,
    /// Observations per bucket (see the type's documentation).
    pub buckets: [u64; BUCKETS],
}

impl LatencyHistogram {
    /// Counts one duration of `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        self.buckets[bucket_of(ns)] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// Adds `other`'s observations to these.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.count += other.count;
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
    }

    /// Observations at or below each bound, then the total: the cumulative counts of
    /// Prometheus' `_bucket{le=...}` series (the last one is `le="+Inf"`).
    pub fn cumulative(&self) -> [u64; BUCKETS] {
        let mut out = self.buckets;
        for i in 1..BUCKETS {
            out[i] += out[i - 1];
        }
        out
    }

    /// Whether nothing was observed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// The bucket a duration of `ns` nanoseconds is counted in.
fn bucket_of(ns: u64) -> usize {
    // At most 17 comparisons; a binary search would save little and read worse.
    BOUNDS_NS
        .iter()
        .position(|&bound| ns <= bound)
        .unwrap_or(BOUNDS_NS.len())
}

/// A [`LatencyHistogram`] several CPUs record into at once (each count an atomic,
/// updated without ordering: a snapshot may see one observation's bucket before its
/// sum, never lose one).
#[derive(Debug, Default)]
pub struct SharedLatencyHistogram {
    count: AtomicU64,
    sum_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl SharedLatencyHistogram {
    /// Counts one duration of `ns` nanoseconds.
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        // Saturating, as `LatencyHistogram::record`: the closure never refuses.
        let _ = self
            .sum_ns
            .fetch_update(Relaxed, Relaxed, |sum| Some(sum.saturating_add(ns)));
    }

    /// The observations so far.
    pub fn snapshot(&self) -> LatencyHistogram {
        LatencyHistogram {
            count: self.count.load(Relaxed),
            sum_ns: self.sum_ns.load(Relaxed),
            buckets: core::array::from_fn(|i| self.buckets[i].load(Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_grow_and_end_at_ten_seconds() {
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(BOUNDS_NS[0], 50_000);
        assert_eq!(*BOUNDS_NS.last().unwrap(), 10_000_000_000);
    }

    #[test]
    fn records_into_the_first_bucket_whose_bound_is_not_below() {
        let mut h = LatencyHistogram::default();
        h.record(0);
        h.record(50_000); // on the bound: that bucket (`le` is inclusive)
        h.record(50_001);
        h.record(3_000_000);
        h.record(u64::MAX);
        assert_eq!(h.count, 5);
        assert_eq!(h.buckets[0], 2);
        assert_eq!(h.buckets[1], 1);
        assert_eq!(h.buckets[6], 1, "3 ms is in (2.5 ms, 5 ms]");
        assert_eq!(h.buckets[BUCKETS - 1], 1, "above 10 s: overflow");
        assert_eq!(h.sum_ns, u64::MAX, "the sum saturates");
        let c = h.cumulative();
        assert!(c.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(c[BUCKETS - 1], h.count);
    }

    #[test]
    fn a_shared_histogram_records_as_a_plain_one() {
        let (mut plain, shared) = (
            LatencyHistogram::default(),
            SharedLatencyHistogram::default(),
        );
        for ns in [0, 50_000, 50_001, 3_000_000, u64::MAX] {
            plain.record(ns);
            shared.record(ns);
        }
        assert_eq!(shared.snapshot(), plain);
    }

    #[test]
    fn merge_adds() {
        let (mut a, mut b) = (LatencyHistogram::default(), LatencyHistogram::default());
        a.record(10);
        b.record(20_000_000);
        b.record(30);
        a.merge(&b);
        assert_eq!((a.count, a.sum_ns), (3, 20_000_040));
        assert_eq!(a.buckets[0], 2);
        assert_eq!(a.cumulative()[BUCKETS - 1], 3);
    }
}
