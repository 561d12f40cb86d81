//! A latency histogram whose recording is a bucket search and two or three atomic
//! updates: no lock, no allocation, on the request path. `/metrics` reads it as a
//! Prometheus histogram.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Times one call for a latency histogram. Reads the CPU's timestamp counter where it is
/// invariant (quanta checks; elsewhere it reads the monotonic clock): a pair of readings
/// costs about a third of a pair of `Instant::now` here, and a selection takes several.
pub struct Stopwatch {
    start: u64,
}

static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();

fn clock() -> &'static quanta::Clock {
    CLOCK.get_or_init(quanta::Clock::new)
}

impl Stopwatch {
    /// Calibrates the clock (up to 200 ms, once per process): at startup, so that no
    /// request waits for it.
    pub fn calibrate() {
        clock();
    }

    #[inline]
    pub fn start() -> Self {
        Stopwatch {
            start: clock().raw(),
        }
    }

    #[inline]
    pub fn elapsed_nanos(&self) -> u64 {
        let clock = clock();
        clock.delta_as_nanos(self.start, clock.raw())
    }

    #[inline]
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_nanos())
    }
}

/// Upper bounds (inclusive, seconds) of every latency histogram: from a microsecond (a
/// small selection) to ten seconds (a slow engine's first byte).
pub const BOUNDS_SECONDS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const BOUNDS_NANOS: [u64; 22] = {
    let mut nanos = [0u64; 22];
    let mut i = 0;
    while i < 22 {
        nanos[i] = (BOUNDS_SECONDS[i] * 1e9) as u64;
        i += 1;
    }
    nanos
};

/// Counts per bucket (the last one past the largest bound) and the sum, in nanoseconds.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; 23],
    sum_nanos: AtomicU64,
}

/// What a scrape reads: per-bucket (not cumulative) counts by upper bound, and the sum.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

fn bucket(nanos: u64) -> usize {
    BOUNDS_NANOS.partition_point(|&bound| bound < nanos)
}

impl LatencyHistogram {
    /// Records from any thread.
    #[inline]
    pub fn record(&self, nanos: u64) {
        self.buckets[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Records where the caller is the only writer (a stage, under its selector's lock):
    /// plain loads and stores, no read-modify-write.
    #[inline]
    pub fn record_exclusive(&self, nanos: u64) {
        let add = |counter: &AtomicU64, n: u64| {
            counter.store(
                counter.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            )
        };
        add(&self.buckets[bucket(nanos)], 1);
        add(&self.sum_nanos, nanos);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let bounds = BOUNDS_SECONDS.iter().copied().chain([f64::INFINITY]);
        HistogramSnapshot {
            count: counts.iter().sum(),
            buckets: bounds.zip(counts).collect(),
            sum_seconds: self.sum_seconds(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_the_bucket_whose_bound_includes_them() {
        let h = LatencyHistogram::default();
        h.record(1_000); // exactly 1 us: the first bucket (le="1e-06")
        h.record(1_001);
        h.record_exclusive(20_000_000_000); // 20 s: past the largest bound
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (1e-6, 1));
        assert_eq!(s.buckets[1], (2.5e-6, 1));
        assert_eq!(s.buckets[22], (f64::INFINITY, 1));
        assert!((s.sum_seconds - 20.000002001).abs() < 1e-9);
    }
}
