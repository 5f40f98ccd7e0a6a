//! Hand-written SVG plots (no font or rendering dependencies): latency by percentile on a log
//! axis, one line per peer, as in the published charts; and per-second errors and p99 with the
//! change events marked, one panel per peer.

use std::fmt::Write as _;

use super::{PeerResult, Report};

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Text for SVG and HTML, in element content and in quoted attributes.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn label(p: &PeerResult) -> String {
    if p.variant.is_empty() {
        p.name.clone()
    } else {
        format!("{} {}", p.name, p.variant)
    }
}

fn fmt_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}s", v / 1000.0)
    } else {
        format!("{v}ms")
    }
}

/// Latency by percentile: x = log10(1 / (1 - p)), y = log10(ms).
pub fn latency(r: &Report, ran: &[&PeerResult]) -> String {
    let (w, h, l, rt, t, b) = (960.0, 540.0, 80.0, 230.0, 50.0, 60.0);
    let (pw, ph) = (w - l - rt, h - t - b);
    let vals = ran
        .iter()
        .flat_map(|p| p.latency_curve.iter().map(|c| c[1]));
    let (mut lo, mut hi) = (f64::MAX, 0.0f64);
    for v in vals.filter(|v| *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi <= 0.0 {
        (lo, hi) = (0.1, 1.0);
    }
    let (ylo, yhi) = (
        lo.max(0.01).log10().floor(),
        hi.log10().ceil().max(lo.max(0.01).log10().floor() + 1.0),
    );
    let x = |pct: f64| {
        let q = (pct / 100.0).min(1.0 - 1e-6);
        l + (-(1.0 - q).log10() / 6.0) * pw
    };
    let y = |ms: f64| t + ph - (ms.max(0.01).log10() - ylo) / (yhi - ylo) * ph;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    let _ = write!(
        s,
        r#"<text x="{l}" y="25" font-size="16">Latency by percentile — {} {}</text>"#,
        esc(&r.scenario),
        if r.quick {
            "(quick run: short, loopback, one machine)"
        } else {
            ""
        }
    );
    for (i, name) in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"]
        .iter()
        .enumerate()
    {
        let xx = l + i as f64 / 6.0 * pw;
        let _ = write!(
            s,
            r##"<line x1="{xx}" y1="{t}" x2="{xx}" y2="{}" stroke="#ddd"/><text x="{xx}" y="{}" text-anchor="middle">{name}</text>"##,
            t + ph,
            t + ph + 18.0
        );
    }
    let mut d = ylo;
    while d <= yhi + 1e-9 {
        let yy = y(10f64.powf(d));
        let _ = write!(
            s,
            r##"<line x1="{l}" y1="{yy}" x2="{}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            l + pw,
            l - 6.0,
            yy + 4.0,
            fmt_ms(10f64.powf(d))
        );
        d += 1.0;
    }
    let _ = write!(
        s,
        r##"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="#333"/><text x="{}" y="{}" text-anchor="middle">percentile</text><text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">latency (log scale)</text>"##,
        l + pw / 2.0,
        h - 15.0,
        t + ph / 2.0,
        t + ph / 2.0
    );
    for (i, p) in ran.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = p
            .latency_curve
            .iter()
            .map(|pt| format!("{:.1},{:.1}", x(pt[0]), y(pt[1])))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = t + 10.0 + i as f64 * 36.0;
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text><text x="{}" y="{}" fill="#555">{} failed, p99 {}</text>"##,
            l + pw + 12.0,
            l + pw + 32.0,
            l + pw + 38.0,
            ly + 4.0,
            esc(&label(p)),
            l + pw + 38.0,
            ly + 18.0,
            p.requests_failed,
            fmt_ms((p.latency_ms.p99 * 100.0).round() / 100.0)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The left axis of a timeline panel: request counts per second (bars), ticks at 0, half and
/// the panel's own maximum, and the axis title.
fn left_axis(s: &mut String, (l, y0, ph): (f64, f64, f64), maxbar: f64) {
    let mut ticks = vec![0.0, maxbar];
    if maxbar >= 2.0 {
        ticks.push((maxbar / 2.0).round());
    }
    for v in ticks {
        let y = y0 + ph - v / maxbar * ph;
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{y:.1}" x2="{l}" y2="{y:.1}" stroke="#333"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            l - 4.0,
            l - 6.0,
            y + 4.0
        );
    }
    let cy = y0 + ph / 2.0;
    let _ = write!(
        s,
        r##"<text x="{}" y="{cy}" transform="rotate(-90 {} {cy})" text-anchor="middle" font-size="11">failed, idle closes / s</text>"##,
        l - 48.0,
        l - 48.0
    );
}

/// The right axis of a timeline panel: p99 on a log scale, one labelled tick per decade.
fn right_axis(
    s: &mut String,
    (x, y0, ph): (f64, f64, f64),
    (ylo, yhi): (f64, f64),
    py: &dyn Fn(f64) -> f64,
) {
    let mut d = ylo;
    while d <= yhi + 1e-9 {
        let ms = 10f64.powf(d);
        let y = py(ms);
        let _ = write!(
            s,
            r##"<line x1="{x}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#1f77b4"/><text x="{}" y="{:.1}" fill="#1f77b4" font-size="10">{}</text>"##,
            x + 4.0,
            x + 6.0,
            y + 3.5,
            fmt_ms((ms * 10.0).round() / 10.0)
        );
        d += 1.0;
    }
    let cy = y0 + ph / 2.0;
    let _ = write!(
        s,
        r##"<text x="{}" y="{cy}" transform="rotate(90 {} {cy})" text-anchor="middle" font-size="11" fill="#1f77b4">p99 latency (log)</text>"##,
        x + 60.0,
        x + 60.0
    );
}

/// Errors and p99 per second, one panel per run, change events as vertical lines.
pub fn timeline(r: &Report, ran: &[&PeerResult]) -> String {
    let (w, ph, gap, l, rt, top) = (960.0, 120.0, 42.0, 80.0, 90.0, 50.0);
    let pw = w - l - rt;
    let h = top + ran.len() as f64 * (ph + gap) + 20.0;
    let secs = ran
        .iter()
        .map(|p| p.timeline.len())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let p99max = ran
        .iter()
        .flat_map(|p| p.timeline.iter().map(|s| s.p99_ms))
        .fold(1.0f64, f64::max);
    let (ylo, yhi) = (-1.0f64, p99max.log10().ceil().max(0.0));
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    let _ = write!(
        s,
        r##"<text x="{l}" y="22" font-size="16">Per second: failed requests (red), idle connections closed by the server (orange), p99 (blue, log, right axis)</text><text x="{l}" y="40" fill="#555">dashed green: endpoint change; dotted grey: pod stopped (SIGTERM, reset or kill) or vanished — {}</text>"##,
        esc(&r.scenario)
    );
    for (i, p) in ran.iter().enumerate() {
        let y0 = top + i as f64 * (ph + gap) + 18.0;
        let maxbar = p
            .timeline
            .iter()
            .map(|s| s.failed + s.idle_closed)
            .max()
            .unwrap_or(0)
            .max(1) as f64;
        let bw = pw / secs;
        let _ = write!(
            s,
            r##"<text x="{l}" y="{}" font-weight="bold">{} — {} failed, {} idle closes, p99 {:.2} ms, max {:.1} ms</text><rect x="{l}" y="{y0}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#333"/>"##,
            y0 - 5.0,
            esc(&label(p)),
            p.requests_failed,
            p.idle_closed_by_server,
            p.latency_ms.p99,
            p.latency_ms.max,
        );
        left_axis(&mut s, (l, y0, ph), maxbar);
        for sec in &p.timeline {
            let x = l + f64::from(sec.t) * bw;
            let fh = sec.failed as f64 / maxbar * ph;
            let ih = sec.idle_closed as f64 / maxbar * ph;
            if fh > 0.0 {
                let _ = write!(
                    s,
                    r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{fh:.1}" fill="#d62728"/>"##,
                    y0 + ph - fh,
                    bw * 0.9
                );
            }
            if ih > 0.0 {
                let _ = write!(
                    s,
                    r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{ih:.1}" fill="#ff7f0e"/>"##,
                    y0 + ph - fh - ih,
                    bw * 0.9
                );
            }
        }
        let py = |ms: f64| y0 + ph - (ms.max(0.1).log10() - ylo) / (yhi - ylo) * ph;
        let pts: Vec<String> = p
            .timeline
            .iter()
            .filter(|sec| sec.p99_ms > 0.0)
            .map(|sec| {
                format!(
                    "{:.1},{:.1}",
                    l + (f64::from(sec.t) + 0.5) * bw,
                    py(sec.p99_ms)
                )
            })
            .collect();
        let _ = write!(
            s,
            r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##,
            pts.join(" ")
        );
        right_axis(&mut s, (l + pw, y0, ph), (ylo, yhi), &py);
        for e in &p.events {
            let x = l + e.t_s / secs * pw;
            let (c, dash) = if e.endpoint_change {
                ("#2ca02c", "6,3")
            } else {
                ("#888", "2,3")
            };
            let _ = write!(
                s,
                r#"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{}" stroke="{c}" stroke-dasharray="{dash}"/>"#,
                y0 + ph
            );
        }
        if i + 1 == ran.len() {
            let _ = write!(
                s,
                r##"<text x="{}" y="{}" text-anchor="middle" fill="#555">seconds from the start of the load</text>"##,
                l + pw / 2.0,
                y0 + ph + 28.0
            );
        }
        let step = if secs <= 20.0 {
            1
        } else if secs <= 100.0 {
            10
        } else {
            30
        };
        for k in (0..=(secs as u32)).step_by(step) {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#777" font-size="10">{k}</text>"##,
                l + f64::from(k) * bw,
                y0 + ph + 12.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::SecondStats;

    #[test]
    fn every_timeline_axis_has_values_and_units() {
        let seconds = (0..10)
            .map(|t| SecondStats {
                t,
                requests: 3000,
                failed: u64::from(t % 3),
                idle_closed: 10,
                p99_ms: 0.5 + f64::from(t) * 30.0,
                ..SecondStats::default()
            })
            .collect();
        let p = PeerResult {
            name: "sluice".into(),
            variant: "https".into(),
            timeline: seconds,
            ..PeerResult::default()
        };
        let r = Report {
            scenario: "churn".into(),
            ..Report::default()
        };
        let svg = timeline(&r, &[&p]);
        for want in [
            "failed, idle closes / s",
            "p99 latency (log)",
            ">0.1ms<",
            ">1ms<",
            ">10ms<",
            ">100ms<",
            ">1s<",
            ">12<",
            ">6<",
            "seconds from the start of the load",
        ] {
            assert!(svg.contains(want), "{want} missing");
        }
    }
}
