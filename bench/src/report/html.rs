//! The page a person opens (`index.html`: every report's table and plots together, the plots
//! inline so the page stands alone) and `summary.md` (one row per peer per scenario, across
//! the scenarios of a run or a seed).
//!
//! The page ends with a few lines of script that count the plots the browser laid out (an
//! `<svg>` with a non-empty box and something drawn in it) into `data-plots` and
//! `data-plots-drawn` on `<body>`; `tests/tests/report_page.rs` loads the page in headless Chromium and
//! reads them back, so "the plots render" is checked by a browser, not assumed.

use std::fmt::Write as _;

use super::svg::esc;
use super::{PeerResult, Report, svg, table};

const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}\
th:first-child,td:first-child,th:nth-child(2),td:nth-child(2){text-align:left}th{background:#f3f3f3}\
svg{max-width:100%;height:auto;display:block;margin:1em 0}code{background:#f3f3f3;padding:0 3px}";

const COUNT_PLOTS: &str = "<script>\n(function(){\n  var svgs = Array.prototype.slice.call(document.querySelectorAll('svg'));\n  var drawn = svgs.filter(function(s){\n    var b = s.getBoundingClientRect();\n    return b.width > 0 && b.height > 0 && s.querySelector('polyline,path,line,rect,circle') !== null;\n  });\n  document.body.setAttribute('data-plots', String(svgs.length));\n  document.body.setAttribute('data-plots-drawn', String(drawn.length));\n})();\n</script>\n";

/// An HTML table of a report's rows (the same columns as `report.md`).
fn report_table(r: &Report) -> String {
    let (head, rows) = table::rows(r, true);
    let mut s = String::from("<table><thead><tr>");
    for h in &head {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s.push_str("</tr></thead><tbody>");
    for row in rows {
        s.push_str("<tr>");
        for i in 0..head.len() {
            let _ = write!(s, "<td>{}</td>", esc(row.get(i).map_or("", String::as_str)));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>\n");
    s
}

/// One report's section: what it shows, the table, the skipped peers, the two plots.
fn section(label: &str, r: &Report) -> String {
    let mut s = format!(
        "<section id=\"{id}\"><h2>{title}{quick}</h2>\n<p>{what}</p>\n<p><code>{cmd}</code> · started {started} · <a href=\"{label}report.md\">report.md</a> · <a href=\"{label}report.json\">report.json</a></p>\n",
        id = esc(if label.is_empty() {
            &r.scenario
        } else {
            label.trim_end_matches('/')
        }),
        title = esc(&r.scenario),
        quick = if r.quick { " (quick)" } else { "" },
        what = esc(&r.what_it_shows),
        cmd = esc(&r.command),
        started = esc(&r.started_utc),
        label = esc(label),
    );
    s.push_str(&report_table(r));
    let skipped: Vec<&PeerResult> = r.peers.iter().filter(|p| p.skipped.is_some()).collect();
    if !skipped.is_empty() {
        s.push_str("<ul>");
        for p in skipped {
            let _ = write!(
                s,
                "<li>{} {}: skipped: {}</li>",
                esc(&p.name),
                esc(&p.variant),
                esc(p.skipped.as_deref().unwrap_or_default())
            );
        }
        s.push_str("</ul>\n");
    }
    let ran: Vec<&PeerResult> = r.peers.iter().filter(|p| p.skipped.is_none()).collect();
    if let Some(soak) = &r.soak {
        let verdict = if soak.held {
            "Held".to_string()
        } else {
            format!("Did not hold: {}", soak.why_not.join("; "))
        };
        let _ = writeln!(s, "<p><strong>{}</strong></p>", esc(&verdict));
        s.push_str(&super::soak::svg(soak));
        s.push('\n');
    }
    if !ran.is_empty() && r.scale.is_empty() {
        s.push_str(&svg::latency(r, &ran));
        s.push('\n');
        if r.soak.is_none() {
            s.push_str(&svg::timeline(r, &ran));
            s.push('\n');
        }
    }
    s.push_str("</section>\n");
    s
}

/// The whole page: `intro` (already HTML) and then each report, labelled by the directory
/// (relative, ending in `/`, or empty for the page's own) its files are in.
pub fn index(title: &str, intro: &str, reports: &[(String, &Report)]) -> String {
    let mut s = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head>\n<body>\n<h1>{t}</h1>\n{intro}\n",
        t = esc(title)
    );
    if reports.len() > 1 {
        s.push_str("<ul>");
        for (label, r) in reports {
            let _ = write!(
                s,
                "<li><a href=\"#{id}\">{id}</a> ({})</li>",
                esc(&r.scenario),
                id = esc(label.trim_end_matches('/'))
            );
        }
        s.push_str("</ul>\n");
    }
    for (label, r) in reports {
        s.push_str(&section(label, r));
    }
    s.push_str(COUNT_PLOTS);
    s.push_str("</body></html>\n");
    s
}

/// The small markdown subset the seed tables use, as HTML: `#` headings, `|` tables,
/// paragraphs.
pub fn markdown_tables(md: &str) -> String {
    let mut s = String::new();
    let mut in_table = false;
    for line in md.lines() {
        let line = line.trim();
        if let Some(cells) = line.strip_prefix('|') {
            let cells: Vec<&str> = cells
                .trim_end_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            if cells.iter().all(|c| c.chars().all(|ch| ch == '-')) {
                continue;
            }
            let tag = if in_table { "td" } else { "th" };
            if !in_table {
                s.push_str("<table>");
                in_table = true;
            }
            s.push_str("<tr>");
            for c in cells {
                let _ = write!(s, "<{tag}>{}</{tag}>", esc(c));
            }
            s.push_str("</tr>\n");
            continue;
        }
        if in_table {
            s.push_str("</table>\n");
            in_table = false;
        }
        if let Some(h) = line.strip_prefix("# ") {
            let _ = writeln!(s, "<h2>{}</h2>", esc(h));
        } else if !line.is_empty() {
            let _ = writeln!(s, "<p>{}</p>", esc(line));
        }
    }
    if in_table {
        s.push_str("</table>\n");
    }
    s
}

/// `summary.md`: one row per peer per scenario.
pub fn summary(reports: &[(String, &Report)]) -> String {
    let mut s = String::from(
        "| run | scenario | peer | variant | req/s | failed | p99 ms | p99.9 ms | CPU ms/1k req | peak RSS MB | note |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (label, r) in reports {
        let run = if label.is_empty() {
            r.scenario.clone()
        } else {
            label.trim_end_matches('/').to_string()
        };
        for p in &r.peers {
            match &p.skipped {
                Some(why) => {
                    let _ = writeln!(
                        s,
                        "| {run} | {} | {} | {} | | | | | | | skipped: {why} |",
                        r.scenario, p.name, p.variant
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "| {run} | {} | {} | {} | {:.0} | {} | {:.2} | {:.2} | {:.1} | {:.0} | {} |",
                        r.scenario,
                        p.name,
                        p.variant,
                        p.achieved_rps,
                        p.requests_failed,
                        p.latency_ms.p99,
                        p.latency_ms.p99_9,
                        p.cpu_ms_per_1k_requests,
                        p.peak_rss_bytes as f64 / 1e6,
                        p.rate_note.as_deref().unwrap_or_default()
                    );
                }
            }
        }
    }
    s
}
