//! The results table, for the terminal (aligned columns) and for markdown. Churn-like scenarios
//! lead with the error classes; capacity scenarios with rates and CPU.

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

/// Header and rows of the main table.
fn rows(r: &Report) -> (Vec<&'static str>, Vec<Vec<String>>) {
    if !r.scale.is_empty() {
        let head = vec![
            "peer",
            "ingresses",
            "ready s",
            "cpu s to ready",
            "change→first req ms (median)",
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
                    s.ingresses.to_string(),
                    format!("skipped: {w}"),
                ],
                None => vec![
                    s.name.clone(),
                    s.ingresses.to_string(),
                    f(s.ready_s),
                    f(s.cpu_seconds_to_ready),
                    f(s.change_median_ms),
                    f(s.change_max_ms),
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

/// Aligned columns for the terminal.
pub fn terminal_table(r: &Report) -> String {
    let (head, rows) = rows(r);
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
    let (head, rows) = rows(r);
    let mut s = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for row in rows {
        let mut cells = row;
        cells.resize(head.len(), String::new());
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    s
}
