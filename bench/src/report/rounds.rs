//! Repeated rounds of a capacity scenario, summarised by medians.
//!
//! On a shared, noisy machine the same proxy can measure twice as fast in one minute as in the
//! next, so a single run says little and runs minutes apart say less. With `--rounds N` every
//! peer runs N times, the order alternating each round, and the summary gives each peer's
//! median rate and — the figure to quote — the median of its *same-round* ratios to the first
//! peer listed.

use std::collections::BTreeMap;

use serde::Serialize;

/// One peer and variant over all rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundSummary {
    /// Peer name.
    pub peer: String,
    /// Variant (without the round number).
    pub variant: String,
    /// Rounds that produced a result.
    pub runs: usize,
    /// Median requests (or handshakes) per second.
    pub median_rps: f64,
    /// Median CPU milliseconds per 1,000 requests.
    pub median_cpu_ms_per_1k: f64,
    /// Median of this peer's rate divided by the first peer's rate in the same round (`None`
    /// for the first peer itself, or with no common round).
    pub median_ratio_to_first: Option<f64>,
    /// Which peer the ratios are to.
    pub first: String,
}

/// One measured run: round number, peer, variant (without round), rate, CPU per 1k requests.
#[derive(Debug, Clone)]
pub struct RoundRun {
    /// Round, from 0.
    pub round: usize,
    /// Peer name.
    pub peer: String,
    /// Variant.
    pub variant: String,
    /// Achieved rate.
    pub rps: f64,
    /// CPU milliseconds per 1,000 requests.
    pub cpu_ms_per_1k: f64,
}

/// The median of `v` (the mean of the middle two for an even count); 0 for none.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Summarises `runs` per variant and peer; ratios are to `first` (the first peer listed).
pub fn summarize(runs: &[RoundRun], first: &str) -> Vec<RoundSummary> {
    let mut by: BTreeMap<(String, String), Vec<&RoundRun>> = BTreeMap::new();
    for r in runs {
        by.entry((r.variant.clone(), r.peer.clone()))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((variant, peer), rs) in &by {
        let mut rates: Vec<f64> = rs.iter().map(|r| r.rps).collect();
        let mut cpu: Vec<f64> = rs.iter().map(|r| r.cpu_ms_per_1k).collect();
        let mut ratios: Vec<f64> = rs
            .iter()
            .filter_map(|r| {
                let base = by.get(&(variant.clone(), first.to_string()))?;
                let b = base.iter().find(|b| b.round == r.round)?;
                (b.rps > 0.0).then(|| r.rps / b.rps)
            })
            .collect();
        out.push(RoundSummary {
            peer: peer.clone(),
            variant: variant.clone(),
            runs: rs.len(),
            median_rps: median(&mut rates),
            median_cpu_ms_per_1k: median(&mut cpu),
            median_ratio_to_first: (peer != first && !ratios.is_empty())
                .then(|| median(&mut ratios)),
            first: first.to_string(),
        });
    }
    out
}

/// The summary as aligned text (empty without rounds).
pub fn text(s: &[RoundSummary]) -> String {
    if s.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nmedians over rounds (ratio: same-round rate / {}'s)\n{:<16} {:<8} {:>6} {:>12} {:>14} {:>8}\n",
        s[0].first, "peer", "variant", "rounds", "median req/s", "cpu ms/1k req", "ratio"
    );
    for r in s {
        out.push_str(&format!(
            "{:<16} {:<8} {:>6} {:>12.0} {:>14.1} {:>8}\n",
            r.peer,
            r.variant,
            r.runs,
            r.median_rps,
            r.median_cpu_ms_per_1k,
            r.median_ratio_to_first
                .map_or("-".to_string(), |x| format!("{x:.2}"))
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(round: usize, peer: &str, rps: f64) -> RoundRun {
        RoundRun {
            round,
            peer: peer.into(),
            variant: "http".into(),
            rps,
            cpu_ms_per_1k: 1000.0 / rps,
        }
    }

    #[test]
    fn ratios_are_taken_within_a_round_then_the_median() {
        // The machine doubles its speed in round 1: per-peer medians hide nothing of that, the
        // same-round ratios are stable.
        let runs = [
            run(0, "sluice", 30.0),
            run(0, "nginx", 40.0),
            run(1, "nginx", 80.0),
            run(1, "sluice", 60.0),
            run(2, "sluice", 45.0),
            run(2, "nginx", 50.0),
        ];
        let s = summarize(&runs, "sluice");
        let nginx = s
            .iter()
            .find(|r| r.peer == "nginx")
            .unwrap_or_else(|| panic!("{s:?}"));
        let sluice = s
            .iter()
            .find(|r| r.peer == "sluice")
            .unwrap_or_else(|| panic!("{s:?}"));
        assert_eq!(nginx.runs, 3);
        assert_eq!(nginx.median_rps, 50.0);
        assert_eq!(sluice.median_rps, 45.0);
        // 40/30, 80/60, 50/45 → 1.33, 1.33, 1.11: median 1.33.
        let r = nginx.median_ratio_to_first.unwrap_or_default();
        assert!((r - 4.0 / 3.0).abs() < 1e-9, "{r}");
        assert_eq!(sluice.median_ratio_to_first, None);
        assert!(text(&s).contains("1.33"));
    }

    #[test]
    fn medians_of_even_and_empty_sets() {
        assert_eq!(median(&mut [3.0, 1.0, 4.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
