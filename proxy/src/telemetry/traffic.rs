//! Each route's traffic over the last minutes, for the operator's page and
//! `GET /api/v1/traffic`: request rate, 5xx rate and latency percentiles per route
//! (Ingress or HTTPRoute → Service port), without Prometheus.
//!
//! A request touches only atomics it already touched (the status-class counters of
//! `sluice_requests_total`) plus one more lock-free histogram per route (the Prometheus
//! histogram is per Service, which cannot tell two Ingresses on one Service apart). Every
//! [`SAMPLE_EVERY`] a sampler reads the cumulative counters and keeps the differences: the
//! last [`KEPT`] intervals as figures, and the last minute's readings to compute exact
//! last-minute percentiles. Memory is bounded by routes × [`KEPT`], and a route that leaves
//! the configuration leaves the registry at the next sample.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

use super::histogram::{AtomicHistogram, LATENCY_BUCKETS};

/// How often the counters are read.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Intervals kept (ten minutes).
pub const KEPT: usize = 60;
/// Intervals in the last-minute figures.
const MINUTE: usize = 6;
/// Routes whose series the report carries (the busiest over the kept intervals).
pub const SERIES_ROUTES: usize = 10;

/// A route as the page names it: the Ingress or HTTPRoute (`namespace/name`) and the pool
/// (`namespace/service:port`, empty when the route has none).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    /// `namespace/name` of the Ingress or HTTPRoute.
    pub route: Arc<str>,
    /// `namespace/service:port`.
    pub service: Arc<str>,
}

/// What the sampler reads of one route.
#[derive(Debug, Clone)]
struct RouteCounters {
    /// `sluice_requests_total`'s counters for the route, by status class (1xx..5xx).
    by_class: [Counter; 5],
    /// Their values when the route entered the registry (the Prometheus counters outlive
    /// a route that leaves and comes back).
    base: [u64; 5],
    /// The route's own latency histogram.
    duration: AtomicHistogram,
}

/// Cumulative counts of one route at one sample.
#[derive(Debug, Clone, Default, PartialEq)]
struct Reading {
    classes: [u64; 5],
    /// Per bucket, not cumulated; the last slot is above every bound.
    buckets: Vec<u64>,
}

impl Reading {
    fn minus(&self, before: Option<&Reading>) -> Reading {
        let Some(b) = before else {
            return self.clone();
        };
        let mut d = self.clone();
        for (x, y) in d.classes.iter_mut().zip(b.classes) {
            *x = x.saturating_sub(y);
        }
        for (x, y) in d.buckets.iter_mut().zip(&b.buckets) {
            *x = x.saturating_sub(*y);
        }
        d
    }

    fn add(&mut self, o: &Reading) {
        for (x, y) in self.classes.iter_mut().zip(o.classes) {
            *x += y;
        }
        if self.buckets.len() < o.buckets.len() {
            self.buckets.resize(o.buckets.len(), 0);
        }
        for (x, y) in self.buckets.iter_mut().zip(&o.buckets) {
            *x += y;
        }
    }

    fn figures(&self, seconds: f64) -> Figures {
        let requests: u64 = self.classes.iter().sum();
        let errors = self.classes[4];
        let per_s = |n: u64| {
            if seconds > 0.0 {
                round3(n as f64 / seconds)
            } else {
                0.0
            }
        };
        Figures {
            requests,
            rps: per_s(requests),
            errors,
            error_ratio: if requests == 0 {
                0.0
            } else {
                round3(errors as f64 / requests as f64)
            },
            p50_ms: quantile_ms(&self.buckets, 0.50),
            p99_ms: quantile_ms(&self.buckets, 0.99),
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The `q` quantile of per-bucket counts over [`LATENCY_BUCKETS`], in milliseconds,
/// interpolated linearly inside its bucket (as Prometheus's `histogram_quantile`); above the
/// last bound it is the last bound. `None` without observations.
fn quantile_ms(buckets: &[u64], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut seen = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        if n > 0 && (seen + n) as f64 >= rank {
            let Some(&upper) = LATENCY_BUCKETS.get(i) else {
                return LATENCY_BUCKETS.last().map(|b| round3(b * 1000.0));
            };
            let lower = if i == 0 { 0.0 } else { LATENCY_BUCKETS[i - 1] };
            let inside = ((rank - seen as f64) / n as f64).clamp(0.0, 1.0);
            return Some(round3((lower + (upper - lower) * inside) * 1000.0));
        }
        seen += n;
    }
    LATENCY_BUCKETS.last().map(|b| round3(b * 1000.0))
}

/// Requests, their rate, the 5xx answers among them and latency percentiles over a span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Requests answered.
    pub requests: u64,
    /// Requests per second.
    pub rps: f64,
    /// Answers with a 5xx status.
    pub errors: u64,
    /// `errors / requests` (0 without requests).
    pub error_ratio: f64,
    /// Median time from request head to response head (ms), estimated from the buckets.
    pub p50_ms: Option<f64>,
    /// 99th percentile (ms), estimated from the buckets.
    pub p99_ms: Option<f64>,
}

/// One interval of a series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// When the interval ended (Unix ms).
    pub at_unix_ms: u64,
    /// Its figures.
    #[serde(flatten)]
    pub figures: Figures,
}

/// One route in `GET /api/v1/traffic`.
#[derive(Debug, Clone, Serialize)]
pub struct RouteTraffic {
    /// `namespace/name` of the Ingress or HTTPRoute.
    pub route: String,
    /// `namespace/service:port`.
    pub service: String,
    /// Over the last minute.
    pub last_minute: Figures,
    /// Per interval over the kept minutes, oldest first: only for the busiest
    /// [`SERIES_ROUTES`] routes (so the document stays small with thousands of routes).
    pub series: Option<Vec<SeriesPoint>>,
}

/// `GET /api/v1/traffic`.
#[derive(Debug, Clone, Serialize)]
pub struct TrafficReport {
    /// Seconds between samples.
    pub interval_s: u64,
    /// When the newest sample was taken (Unix ms; 0 before the first).
    pub sampled_at_unix_ms: u64,
    /// Every route together, over the last minute.
    pub total_last_minute: Figures,
    /// Every route together, per interval.
    pub total_series: Vec<SeriesPoint>,
    /// Each route in the configuration, busiest over the last minute first.
    pub routes: Vec<RouteTraffic>,
}

#[derive(Debug)]
struct Point {
    at_unix_ms: u64,
    total: Figures,
    routes: HashMap<RouteKey, Figures>,
}

#[derive(Debug, Default)]
struct History {
    /// Cumulative readings of the last `MINUTE + 1` samples, newest last.
    recent: VecDeque<(u64, HashMap<RouteKey, Reading>)>,
    /// Figures per interval, newest last, at most [`KEPT`].
    points: VecDeque<Point>,
}

/// The route registry and the sampled history.
#[derive(Debug, Default)]
pub struct Traffic {
    registry: Mutex<BTreeMap<RouteKey, RouteCounters>>,
    history: Mutex<History>,
}

impl Traffic {
    /// The latency histogram a compiled route observes; routes with the same key share one.
    /// Called when a route table is compiled, never per request.
    pub fn register(&self, route: &str, service: &str, by_class: &[Counter; 5]) -> AtomicHistogram {
        let mut reg = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let key = RouteKey {
            route: Arc::from(route),
            service: Arc::from(service),
        };
        reg.entry(key)
            .or_insert_with(|| RouteCounters {
                base: by_class.each_ref().map(Counter::get),
                by_class: by_class.clone(),
                duration: AtomicHistogram::new(LATENCY_BUCKETS),
            })
            .duration
            .clone()
    }

    /// Reads every route's counters (forgetting routes no compiled table holds any more) and
    /// records the interval since the last sample.
    pub fn sample(&self, now_unix_ms: u64) {
        let readings: HashMap<RouteKey, Reading> = {
            let mut reg = self.registry.lock().unwrap_or_else(|p| p.into_inner());
            reg.retain(|_, c| c.duration.is_shared());
            reg.iter()
                .map(|(k, c)| {
                    let mut classes = [0u64; 5];
                    for ((x, counter), base) in classes.iter_mut().zip(&c.by_class).zip(c.base) {
                        *x = counter.get().saturating_sub(base);
                    }
                    let r = Reading {
                        classes,
                        buckets: c.duration.buckets(),
                    };
                    (k.clone(), r)
                })
                .collect()
        };
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((before_ms, before)) = h.recent.back() {
            let seconds = now_unix_ms.saturating_sub(*before_ms) as f64 / 1000.0;
            let mut total = Reading::default();
            let mut routes = HashMap::new();
            for (k, r) in &readings {
                let d = r.minus(before.get(k));
                if d.classes.iter().any(|&n| n > 0) {
                    total.add(&d);
                    routes.insert(k.clone(), d.figures(seconds));
                }
            }
            h.points.push_back(Point {
                at_unix_ms: now_unix_ms,
                total: total.figures(seconds),
                routes,
            });
            while h.points.len() > KEPT {
                h.points.pop_front();
            }
        }
        h.recent.push_back((now_unix_ms, readings));
        while h.recent.len() > MINUTE + 1 {
            h.recent.pop_front();
        }
    }

    /// The document `GET /api/v1/traffic` returns.
    pub fn report(&self) -> TrafficReport {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let (Some((first_ms, first)), Some((last_ms, last))) = (h.recent.front(), h.recent.back())
        else {
            return TrafficReport {
                interval_s: SAMPLE_EVERY.as_secs(),
                sampled_at_unix_ms: 0,
                total_last_minute: Figures::default(),
                total_series: Vec::new(),
                routes: Vec::new(),
            };
        };
        let seconds = last_ms.saturating_sub(*first_ms) as f64 / 1000.0;
        let mut total = Reading::default();
        let mut routes: Vec<(RouteKey, Figures)> = last
            .iter()
            .map(|(k, r)| {
                let d = if h.recent.len() > 1 {
                    r.minus(first.get(k))
                } else {
                    Reading::default()
                };
                total.add(&d);
                (k.clone(), d.figures(seconds))
            })
            .collect();
        routes.sort_by(|(ka, a), (kb, b)| b.requests.cmp(&a.requests).then(ka.cmp(kb)));
        // The busiest over every kept interval get a series.
        let mut kept_requests: HashMap<&RouteKey, u64> = HashMap::new();
        for p in &h.points {
            for (k, f) in &p.routes {
                *kept_requests.entry(k).or_default() += f.requests;
            }
        }
        let mut busiest: Vec<(&RouteKey, u64)> = kept_requests.into_iter().collect();
        busiest.sort_by(|(ka, a), (kb, b)| b.cmp(a).then(ka.cmp(kb)));
        busiest.truncate(SERIES_ROUTES);
        let series_of = |k: &RouteKey| -> Vec<SeriesPoint> {
            h.points
                .iter()
                .map(|p| SeriesPoint {
                    at_unix_ms: p.at_unix_ms,
                    figures: p.routes.get(k).copied().unwrap_or_default(),
                })
                .collect()
        };
        TrafficReport {
            interval_s: SAMPLE_EVERY.as_secs(),
            sampled_at_unix_ms: *last_ms,
            total_last_minute: total.figures(seconds),
            total_series: h
                .points
                .iter()
                .map(|p| SeriesPoint {
                    at_unix_ms: p.at_unix_ms,
                    figures: p.total,
                })
                .collect(),
            routes: routes
                .into_iter()
                .map(|(k, f)| RouteTraffic {
                    series: busiest.iter().any(|(b, _)| **b == k).then(|| series_of(&k)),
                    route: k.route.to_string(),
                    service: k.service.to_string(),
                    last_minute: f,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn counters() -> [Counter; 5] {
        std::array::from_fn(|_| Counter::default())
    }

    #[test]
    fn rates_errors_and_percentiles_per_interval_and_over_the_minute() {
        let t = Traffic::default();
        let c = counters();
        let hist = t.register("ns/web", "ns/web:80", &c);
        t.sample(1_000);
        for i in 0..100u64 {
            c[if i < 5 { 4 } else { 1 }].inc();
            hist.observe(Duration::from_micros(if i < 99 { 800 } else { 400_000 }));
        }
        t.sample(11_000);
        let r = t.report();
        assert_eq!(r.sampled_at_unix_ms, 11_000);
        let route = &r.routes[0];
        assert_eq!(&*route.route, "ns/web");
        let f = route.last_minute;
        assert_eq!((f.requests, f.errors), (100, 5));
        assert!((f.rps - 10.0).abs() < 1e-9, "{f:?}");
        assert!((f.error_ratio - 0.05).abs() < 1e-9);
        // 99 requests in (0.5, 1] ms: the median is inside that bucket.
        let p50 = f.p50_ms.unwrap();
        assert!(p50 > 0.5 && p50 <= 1.0, "{p50}");
        // The 99th request is the last of that bucket; the 100th is slow.
        assert!(f.p99_ms.unwrap() <= 1.0);
        assert_eq!(r.total_last_minute, f);
        let series = route.series.as_ref().unwrap();
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].figures, f);
    }

    #[test]
    fn a_route_that_leaves_the_configuration_leaves_the_registry() {
        let t = Traffic::default();
        let c = counters();
        let hist = t.register("ns/gone", "ns/gone:80", &c);
        t.sample(0);
        assert_eq!(t.report().routes.len(), 1);
        drop(hist);
        t.sample(10_000);
        assert!(t.report().routes.is_empty());
    }

    #[test]
    fn a_route_that_comes_back_counts_from_its_return() {
        let t = Traffic::default();
        let c = counters();
        for _ in 0..50 {
            c[1].inc();
        }
        let _hist = t.register("ns/back", "ns/back:80", &c);
        t.sample(0);
        c[1].inc();
        t.sample(10_000);
        assert_eq!(t.report().routes[0].last_minute.requests, 1);
    }

    #[test]
    fn history_is_bounded() {
        let t = Traffic::default();
        let c = counters();
        let _hist = t.register("ns/a", "ns/a:80", &c);
        for i in 0..(KEPT as u64 + 20) {
            c[1].inc();
            t.sample(i * 10_000);
        }
        let r = t.report();
        assert_eq!(r.total_series.len(), KEPT);
        // The minute spans the last MINUTE intervals: one request in each.
        assert_eq!(r.total_last_minute.requests, MINUTE as u64);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let mut b = vec![0u64; LATENCY_BUCKETS.len() + 1];
        assert_eq!(quantile_ms(&b, 0.5), None);
        b[0] = 10; // ≤ 0.5 ms
        assert_eq!(quantile_ms(&b, 0.5), Some(0.25));
        let last = b.len() - 1;
        b[last] = 1000; // above every bound
        assert_eq!(quantile_ms(&b, 0.99), Some(10_000.0));
    }
}
