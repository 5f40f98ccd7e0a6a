//! The results table, for the terminal (aligned columns) and for markdown. Churn-like scenarios
//! lead with the error classes; capacity scenarios with rates and CPU. The terminal table is
//! compact by default (it fits 100 columns; wrk2's four socket-error classes share one cell) and
//! complete with `--wide`; markdown always has every column.

use super::{PeerResult, Report};

fn mb(b: u64) -> String {
    format!("{:.0}", b as f64 / 1_048_576.0)
}

fn f(v: f64) -> String {
    if v.is_nan() {
        // Not measured (wrk gives no p99.9).
        "-".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Header and rows of the main table; `wide` keeps every column.
pub(crate) fn rows(r: &Report, wide: bool) -> (Vec<&'static str>, Vec<Vec<String>>) {
    if !r.idle.is_empty() {
        let head = vec![
            "peer",
            "variant",
            "open",
            "RSS before MB",
            "answered MB",
            "settled MB",
            "KB/conn answered",
            "KB/conn settled",
            "closed MB (round 1/2)",
            "fds base/held/closed",
            "conns left",
        ];
        let rows = r
            .idle
            .iter()
            .map(|i| match &i.skipped {
                Some(w) => vec![i.name.clone(), i.variant.clone(), format!("skipped: {w}")],
                None => vec![
                    i.name.clone(),
                    i.variant.clone(),
                    format!("{}/{}", i.open, i.connections),
                    mb(i.rss_base_bytes),
                    mb(i.rss_answered_bytes),
                    mb(i.rss_settled_bytes),
                    f(i.kb_per_connection_answered),
                    f(i.kb_per_connection),
                    format!(
                        "{}/{}",
                        mb(i.rss_closed_bytes),
                        mb(i.rss_closed_again_bytes)
                    ),
                    format!("{}/{}/{}", i.fds_base, i.fds_settled, i.fds_closed),
                    i.clients_left.to_string(),
                ],
            })
            .collect();
        return (head, rows);
    }
    if !r.scale.is_empty() {
        let head = vec![
            "peer",
            "objects",
            "ready s",
            "cpu s to ready",
            "endpoint change→first req ms (median)",
            "max ms",
            "route change ms (median)",
            "max ms",
            "peak RSS MB",
            "config MB",
        ];
        let rows = r
            .scale
            .iter()
            .map(|s| match &s.skipped {
                Some(w) => vec![
                    s.name.clone(),
                    format!("{} {}", s.ingresses, s.objects),
                    format!("skipped: {w}"),
                ],
                None => vec![
                    s.name.clone(),
                    format!("{} {}", s.ingresses, s.objects),
                    f(s.ready_s),
                    f(s.cpu_seconds_to_ready),
                    f(s.change_median_ms),
                    f(s.change_max_ms),
                    if s.route_changes > 0 {
                        f(s.route_change_median_ms)
                    } else {
                        "-".into()
                    },
                    if s.route_changes > 0 {
                        f(s.route_change_max_ms)
                    } else {
                        "-".into()
                    },
                    mb(s.peak_rss_bytes),
                    f(s.config_bytes as f64 / 1_048_576.0),
                ],
            })
            .collect();
        return (head, rows);
    }
    if !r.extra.is_empty() {
        let head = vec![
            "target",
            "tool",
            "connections",
            "req/s",
            "p50 ms",
            "p99 ms",
            "errors",
        ];
        let keys = [
            "target",
            "tool",
            "connections",
            "rps",
            "p50_ms",
            "p99_ms",
            "errors",
        ];
        let rows = r
            .extra
            .iter()
            .map(|m| {
                keys.iter()
                    .map(|k| m.get(*k).cloned().unwrap_or_default())
                    .collect()
            })
            .collect();
        return (head, rows);
    }
    let churn = r.scenario == "churn" || r.scenario == "static";
    let skip = |p: &PeerResult| {
        p.skipped
            .as_ref()
            .map(|w| vec![p.name.clone(), p.variant.clone(), format!("skipped: {w}")])
    };
    if churn && !wide {
        let head = vec![
            "peer",
            "variant",
            "req/s",
            "changes",
            "FAILED",
            "wrk2 c/r/w/t",
            "p50",
            "p99",
            "p99.9",
            "max",
            "cpu s",
        ];
        let rows = r
            .peers
            .iter()
            .map(|p| {
                skip(p).unwrap_or_else(|| {
                    let e = &p.errors;
                    vec![
                        p.name.clone(),
                        p.variant.clone(),
                        format!(
                            "{:.0}{}",
                            p.achieved_rps,
                            if p.rate_kept { "" } else { " !" }
                        ),
                        p.changes.to_string(),
                        p.requests_failed.to_string(),
                        format!("{}/{}/{}/{}", e.connect, e.read, e.write, e.timeout),
                        f(p.latency_ms.p50),
                        f(p.latency_ms.p99),
                        f(p.latency_ms.p99_9),
                        f(p.latency_ms.max),
                        f(p.cpu_seconds),
                    ]
                })
            })
            .collect();
        return (head, rows);
    }
    if churn {
        let head = vec![
            "peer",
            "variant",
            "req/s",
            "requests",
            "changes",
            "connect",
            "read",
            "write",
            "timeout",
            "non-2xx",
            "FAILED",
            "idle-closed",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "p99.99 ms",
            "max ms",
            "cpu s",
            "RSS MB",
        ];
        let rows = r
            .peers
            .iter()
            .map(|p| {
                skip(p).unwrap_or_else(|| {
                    let e = &p.errors;
                    let rate = match p.requested_rps {
                        Some(req) => format!(
                            "{:.0}/{:.0}{}",
                            p.achieved_rps,
                            req,
                            if p.rate_kept { "" } else { " !" }
                        ),
                        None => format!("{:.0}", p.achieved_rps),
                    };
                    vec![
                        p.name.clone(),
                        p.variant.clone(),
                        rate,
                        p.requests.to_string(),
                        p.changes.to_string(),
                        e.connect.to_string(),
                        e.read.to_string(),
                        e.write.to_string(),
                        e.timeout.to_string(),
                        e.status_non2xx.to_string(),
                        p.requests_failed.to_string(),
                        p.idle_closed_by_server.to_string(),
                        f(p.latency_ms.p50),
                        f(p.latency_ms.p99),
                        f(p.latency_ms.p99_9),
                        f(p.latency_ms.p99_99),
                        f(p.latency_ms.max),
                        f(p.cpu_seconds),
                        mb(p.peak_rss_bytes),
                    ]
                })
            })
            .collect();
        return (head, rows);
    }
    let head = vec![
        "peer",
        "variant",
        "req/s",
        "Mbit/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "failed",
        "proxy CPU %",
        "cpu ms/1k req",
        "RSS MB",
    ];
    let rows = r
        .peers
        .iter()
        .map(|p| {
            skip(p).unwrap_or_else(|| {
                vec![
                    p.name.clone(),
                    p.variant.clone(),
                    format!("{:.0}", p.achieved_rps),
                    f(p.throughput_mbit_s),
                    f(p.latency_ms.p50),
                    f(p.latency_ms.p99),
                    f(p.latency_ms.p99_9),
                    p.requests_failed.to_string(),
                    p.proxy_cpu_utilization
                        .map_or("-".into(), |u| format!("{:.0}", u * 100.0)),
                    f(p.cpu_ms_per_1k_requests),
                    mb(p.peak_rss_bytes),
                ]
            })
        })
        .collect();
    (head, rows)
}

/// Aligned columns for the terminal: compact unless `wide`.
pub fn terminal_table(r: &Report, wide: bool) -> String {
    let (head, rows) = rows(r, wide);
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        // Skipped rows span the table; they do not widen the columns.
        if row.len() == head.len() {
            for (i, c) in row.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let width = if cells.len() == head.len() { w[i] } else { 0 };
                if i < 2 || cells.len() != head.len() {
                    format!("{c:<width$}")
                } else {
                    format!("{c:>width$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut s = line(&head.iter().map(|h| (*h).to_string()).collect::<Vec<_>>());
    s.push('\n');
    s.push_str(&"-".repeat(w.iter().sum::<usize>() + 2 * w.len().saturating_sub(1)));
    s.push('\n');
    for row in &rows {
        s.push_str(line(row).trim_end());
        s.push('\n');
    }
    s
}

/// A markdown table.
pub fn markdown_table(r: &Report) -> String {
    let (head, rows) = rows(r, true);
    let mut s = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for row in rows {
        let mut cells = row;
        cells.resize(head.len(), String::new());
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    s
}

/// What the terminal table's columns and flags mean, in lines under 100 columns: the reader
/// should not need `report.md` to know whether to trust a row.
pub fn terminal_footer(r: &Report, wide: bool) -> String {
    let ran: Vec<&PeerResult> = r.peers.iter().filter(|p| p.skipped.is_none()).collect();
    if ran.is_empty() {
        return String::new();
    }
    let mut s = String::new();
    if r.scenario == "churn" || r.scenario == "static" {
        if let Some(rate) = ran.iter().find_map(|p| p.requested_rps) {
            s.push_str(&format!(
                "req/s: achieved rate; {rate:.0}/s was requested of every peer (open loop).\n"
            ));
        }
        s.push_str(
            "FAILED: requests that got no 2xx answer, counted per request: the number that matters.\n",
        );
        if !wide {
            s.push_str(
                "p50, p99, p99.9, max: latency in ms, from each request's scheduled send time.\n",
            );
        }
        s.push_str(if wide {
            "connect/read/write/timeout, non-2xx: wrk2's error classes, as published runs give them.\n"
        } else {
            "wrk2 c/r/w/t: wrk2's connect/read/write/timeout errors, as published runs give them.\n"
        });
        s.push_str(
            "  wrk2 counts every connection the server closes as a read error, even an idle one\n  \
             between requests, so read can be far above FAILED (a reload closes every connection).\n",
        );
    } else {
        s.push_str("failed: requests that got no 2xx answer.\n");
    }
    if ran.iter().any(|p| !p.rate_kept) {
        s.push_str(
            "!: the load generator fell behind its timetable (short of CPU). Latency still counts\n  \
             from each scheduled send, so that row's percentiles include the generator's own delay\n  \
             (they overstate the peer's) and the peer got less load than asked: compare with care.\n",
        );
    }
    if !wide && (r.scenario == "churn" || r.scenario == "static") {
        s.push_str("--wide: every column (requests, non-2xx, idle closes, p99.99, RSS).\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::PeerKind;

    /// A churn report as the quick run makes it, with the widest realistic cells.
    fn churn_report() -> Report {
        let mut peers: Vec<PeerResult> = PeerKind::ALL
            .iter()
            .map(|k| {
                let mut p = PeerResult {
                    name: k.name().into(),
                    variant: "https".into(),
                    requested_rps: Some(3000.0),
                    achieved_rps: 2999.4,
                    rate_kept: true,
                    requests: 21_000,
                    changes: 4,
                    requests_failed: 38_123,
                    cpu_seconds: 12.5,
                    ..PeerResult::default()
                };
                p.errors.connect = 1234;
                p.errors.read = 79_700;
                p.errors.timeout = 309;
                p.latency_ms.p50 = 1.25;
                p.latency_ms.p99 = 1234.5;
                p.latency_ms.p99_9 = 32_000.0;
                p.latency_ms.max = 32_000.0;
                p
            })
            .collect();
        peers[1].rate_kept = false;
        peers.push(PeerResult::skipped(
            "nginx-lua",
            "https",
            "needs libnginx-mod-http-lua".into(),
        ));
        Report {
            scenario: "churn".into(),
            peers,
            ..Report::default()
        }
    }

    #[test]
    fn the_default_terminal_table_and_footer_fit_100_columns() {
        let r = churn_report();
        let text = terminal_table(&r, false) + &terminal_footer(&r, false);
        for line in text.lines() {
            assert!(
                line.chars().count() <= 100,
                "{} columns: {line}",
                line.len()
            );
        }
        assert!(text.contains("FAILED:"), "{text}");
        assert!(text.contains("!: the load generator fell behind"), "{text}");
        assert!(text.contains("2999 !"), "{text}");
        assert!(text.contains("1234/79700/0/309"), "{text}");
        // Wide mode keeps every column.
        let wide = terminal_table(&r, true);
        assert!(
            wide.lines()
                .next()
                .unwrap_or_default()
                .contains("idle-closed")
        );
        assert!(!terminal_footer(&r, true).contains("--wide"));
    }

    #[test]
    fn no_flag_explanation_when_every_rate_was_kept() {
        let mut r = churn_report();
        for p in &mut r.peers {
            p.rate_kept = true;
        }
        assert!(!terminal_footer(&r, false).contains("!:"));
    }
}
