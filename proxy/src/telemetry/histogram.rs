//! [`AtomicHistogram`]: the lock-free duration histogram behind sluice's latency metrics and
//! the operator's page's per-route percentiles.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram of durations whose `observe` is lock-free (prometheus-client's own histogram
/// takes a mutex). Sum is kept in nanoseconds.
///
/// Buckets are stored per bucket, not cumulated: prometheus-client's text encoder adds them up
/// itself. The last slot counts observations above every bound (the `+Inf` bucket), and the
/// total count is the sum of the slots, so `_count` always equals the `+Inf` bucket even while
/// observations race a scrape.
#[derive(Debug, Clone)]
pub struct AtomicHistogram {
    inner: Arc<HistInner>,
}

#[derive(Debug)]
struct HistInner {
    bounds: Vec<f64>,
    /// One slot per bound, plus one for observations above the last bound.
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

/// Request-latency buckets (seconds).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Buckets for control-plane work (apply duration, propagation delay), finer at the low end.
pub const FAST_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.0001, 0.000_25, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 1.0,
];

impl AtomicHistogram {
    /// A histogram with these upper bounds (seconds, ascending).
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            inner: Arc::new(HistInner {
                bounds: bounds.to_vec(),
                counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum_nanos: AtomicU64::new(0),
            }),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = &self.inner;
        let slot = i
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(i.bounds.len());
        if let Some(c) = i.counts.get(slot) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        i.sum_nanos.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Per-bucket counts (not cumulated), the last above every bound.
    pub fn buckets(&self) -> Vec<u64> {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Whether a clone of this histogram lives elsewhere (a compiled route still observes it).
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let i = &self.inner;
        // Per-bucket counts: the encoder cumulates them. `INFINITY` is what it renders `+Inf`.
        let buckets: Vec<(f64, u64)> = i
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&i.counts)
            .map(|(b, c)| (b, c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = i.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}
