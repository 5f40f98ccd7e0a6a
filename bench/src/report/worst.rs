//! The abuse scenario's worst second: per attack and peer, the highest per-second p99 of the
//! legitimate load, and its ratio to nginx's in the same run. A run's p99 hides the second the
//! attackers connect; this is the figure for "established traffic keeps its latency while
//! handshakes queue".

use std::fmt::Write as _;

use super::{PeerResult, Report};

/// The peer every other is compared with, when it ran.
const REFERENCE: &str = "nginx-reload";

/// The highest per-second p99 of a run (ms), seconds without answers aside.
pub fn worst_second_p99(p: &PeerResult) -> Option<f64> {
    p.timeline
        .iter()
        .filter(|s| s.requests > 0)
        .map(|s| s.p99_ms)
        .max_by(f64::total_cmp)
}

/// The markdown section: one row per attack, one column per peer, `-` where a peer did not
/// run; `×` is the ratio to nginx-reload's worst second in the same attack.
pub fn markdown(r: &Report) -> String {
    let mut attacks: Vec<&str> = Vec::new();
    let mut peers: Vec<&str> = Vec::new();
    for p in r.peers.iter().filter(|p| p.skipped.is_none()) {
        if !attacks.contains(&p.variant.as_str()) {
            attacks.push(&p.variant);
        }
        if !peers.contains(&p.name.as_str()) {
            peers.push(&p.name);
        }
    }
    if attacks.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## Worst second\n\nThe highest per-second p99 of the legitimate load (ms) in each run; in brackets, the ratio to nginx-reload's in the same attack.\n\n| attack |",
    );
    for p in &peers {
        let _ = write!(s, " {p} |");
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(peers.len()));
    s.push('\n');
    let find = |attack: &str, peer: &str| {
        r.peers
            .iter()
            .find(|p| p.variant == attack && p.name == peer && p.skipped.is_none())
            .and_then(worst_second_p99)
    };
    for a in attacks {
        let reference = find(a, REFERENCE).filter(|v| *v > 0.0);
        let _ = write!(s, "| {a} |");
        for p in &peers {
            match (find(a, p), reference) {
                (Some(v), Some(n)) if *p != REFERENCE => {
                    let _ = write!(s, " {v:.2} ({:.1}×) |", v / n);
                }
                (Some(v), _) => {
                    let _ = write!(s, " {v:.2} |");
                }
                (None, _) => s.push_str(" - |"),
            }
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::SecondStats;

    fn run(name: &str, attack: &str, p99s: &[f64]) -> PeerResult {
        PeerResult {
            name: name.into(),
            variant: attack.into(),
            timeline: p99s
                .iter()
                .enumerate()
                .map(|(i, p)| SecondStats {
                    t: u32::try_from(i).unwrap_or(0),
                    requests: 10,
                    p99_ms: *p,
                    ..SecondStats::default()
                })
                .collect(),
            ..PeerResult::default()
        }
    }

    #[test]
    fn the_worst_second_is_compared_with_nginx_in_the_same_attack() {
        let r = Report {
            peers: vec![
                run("sluice", "slowloris", &[1.0, 12.0, 2.0]),
                run("nginx-reload", "slowloris", &[1.0, 3.0, 2.0]),
                PeerResult::skipped("caddy", "slowloris", "not installed".into()),
            ],
            ..Report::default()
        };
        let md = markdown(&r);
        assert!(md.contains("| slowloris | 12.00 (4.0×) | 3.00 |"), "{md}");
        assert!(!md.contains("caddy"), "{md}");
        assert_eq!(markdown(&Report::default()), "");
    }
}
