//! The soak's part of a report: one row per sampling interval (legitimate requests and their
//! failures per client kind, p99, and the proxy's RSS, descriptors, tasks and upstream
//! connections read at the interval's end), the verdict, its markdown table and its plots.

use std::fmt::Write as _;

use serde::Serialize;

use super::svg::esc;

/// Growth over the second half above which memory or descriptors are not "flat".
pub const MAX_GROWTH: f64 = 0.05;

/// Legitimate traffic of one client kind in one interval.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Traffic {
    /// Requests (HTTP) or messages (WebSocket) finished: answered or failed.
    pub requests: u64,
    /// Of those, failed.
    pub failed: u64,
    /// p99 latency of the answered ones (ms; 0 when none).
    pub p99_ms: f64,
}

/// One sampling interval.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SoakSample {
    /// End of the interval, seconds from the start of the load.
    pub t_s: f64,
    /// HTTPS keep-alive (HTTP/1.1) requests.
    pub https: Traffic,
    /// HTTP/2 requests.
    pub h2: Traffic,
    /// WebSocket echo messages (and handshakes).
    pub ws: Traffic,
    /// The proxy's resident memory at the interval's end (bytes).
    pub rss_bytes: u64,
    /// Its open descriptors.
    pub fds: u64,
    /// Tasks alive on its runtime (`sluice_runtime_tasks`; 0 when the scrape failed).
    pub tasks: u64,
    /// Its established connections to backends.
    pub upstream_connections: u64,
    /// Problems `/api/v1/status` listed.
    pub problems: usize,
    /// An attack ran in this interval (its name).
    pub attack: Option<String>,
}

impl SoakSample {
    /// Legitimate requests failed in the interval, every kind.
    pub fn failed(&self) -> u64 {
        self.https.failed + self.h2.failed + self.ws.failed
    }
}

/// Configuration changes made during the soak and how they took effect.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChangeCounts {
    /// Ingress rewrites (the route under load changes an annotation).
    pub ingress: u64,
    /// TLS Secret rewrites with a new certificate.
    pub secret: u64,
    /// Of those, seen served (`/api/v1/certificates` shows the new serial) within 5 s.
    pub rotations_seen: u64,
    /// ConfigMap rewrites.
    pub configmap: u64,
    /// Ingress and ConfigMap changes seen applied (the generation moved) within 5 s.
    pub applied: u64,
    /// Slowest of the changes seen applied, write to applied (ms).
    pub slowest_apply_ms: f64,
    /// Backend scale steps (up and down) the churn made.
    pub endpoint_changes: u64,
    /// Attacks run.
    pub attacks: u64,
}

/// The proxy read before the load starts and once every client has gone: descriptors and
/// tasks the run left behind show as the difference.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Leftover {
    /// Resident memory (bytes).
    pub rss_bytes: u64,
    /// Open descriptors.
    pub fds: u64,
    /// Runtime tasks.
    pub tasks: u64,
    /// Established upstream connections (kept in the pool while idle, up to its timeout).
    pub upstream_connections: u64,
    /// Sockets still on the client listener's port, listening one aside (after: the clients'
    /// connections the proxy has not closed).
    pub client_connections: u64,
}

impl Leftover {
    /// Descriptors other than pooled upstream connections.
    fn own_fds(&self) -> u64 {
        self.fds.saturating_sub(self.upstream_connections)
    }
}

/// Descriptors the run may leave above the reading before it (the proxy's log file reopened,
/// a resolver socket) before it counts as a leak.
pub const FD_SLACK: u64 = 2;

/// The soak's own section of the report.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SoakSummary {
    /// Seconds per sample.
    pub interval_s: f64,
    /// Samples, in time order.
    pub samples: Vec<SoakSample>,
    /// What was changed.
    pub changes: ChangeCounts,
    /// RSS growth over the second half (fraction; `None` with too few samples).
    pub rss_growth: Option<f64>,
    /// Growth over the second half of the descriptors other than established upstream
    /// connections (which follow the pod count the churn is at).
    pub fd_growth: Option<f64>,
    /// The proxy before the load started.
    pub before: Option<Leftover>,
    /// The proxy a few seconds after every client had gone.
    pub after: Option<Leftover>,
    /// The proxy was still running at the end.
    pub survived: bool,
    /// It held: no legitimate request failed, the proxy survived, RSS and descriptors grew
    /// less than [`MAX_GROWTH`] over the second half.
    pub held: bool,
    /// Why it did not hold (empty when it held).
    pub why_not: Vec<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n.is_multiple_of(2) {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
}

/// Growth over the second half of `samples` (those at or after `half_s`): the median of its
/// last three readings against the median of its first three, so that one noisy reading
/// neither hides nor invents a trend. `None` with fewer than two readings in that half.
pub fn growth(samples: &[(f64, f64)], half_s: f64) -> Option<f64> {
    let half: Vec<f64> = samples
        .iter()
        .filter(|(t, _)| *t >= half_s)
        .map(|(_, v)| *v)
        .collect();
    if half.len() < 2 {
        return None;
    }
    let k = (half.len() / 2).clamp(1, 3);
    let first = median(half[..k].to_vec());
    let last = median(half[half.len() - k..].to_vec());
    (first > 0.0).then(|| (last - first) / first)
}

impl SoakSummary {
    /// Fills in the growth figures and the verdict from the samples.
    pub fn judge(&mut self, duration_s: f64, survived: bool) {
        let half = duration_s / 2.0;
        let series = |f: fn(&SoakSample) -> u64| -> Vec<(f64, f64)> {
            self.samples.iter().map(|s| (s.t_s, f(s) as f64)).collect()
        };
        self.rss_growth = growth(&series(|s| s.rss_bytes), half);
        // Established upstream connections follow the churn's pod count from one reading to
        // the next; the rest (listeners, clients, files, and upstream sockets left half
        // closed) is what must stay flat.
        self.fd_growth = growth(
            &series(|s| s.fds.saturating_sub(s.upstream_connections)),
            half,
        );
        self.survived = survived;
        let mut why = Vec::new();
        let failed: u64 = self.samples.iter().map(SoakSample::failed).sum();
        if failed > 0 {
            why.push(format!("{failed} legitimate requests failed"));
        }
        if !survived {
            why.push("the proxy exited".into());
        }
        if let (Some(b), Some(a)) = (self.before, self.after) {
            if a.own_fds() > b.own_fds() + FD_SLACK {
                why.push(format!(
                    "{} descriptors left behind after the clients had gone ({} before the load, {} after, pooled upstream connections aside)",
                    a.own_fds() - b.own_fds(),
                    b.own_fds(),
                    a.own_fds()
                ));
            }
            if a.client_connections > 0 {
                why.push(format!(
                    "{} client connections still open after the clients had gone",
                    a.client_connections
                ));
            }
            if a.tasks > b.tasks + a.upstream_connections {
                why.push(format!(
                    "{} runtime tasks after the run against {} before it",
                    a.tasks, b.tasks
                ));
            }
        }
        for (what, g) in [("RSS", self.rss_growth), ("descriptors", self.fd_growth)] {
            match g {
                Some(g) if g >= MAX_GROWTH => why.push(format!(
                    "{what} grew {:.1}% over the second half (limit {:.0}%)",
                    g * 100.0,
                    MAX_GROWTH * 100.0
                )),
                Some(_) => {}
                None => why.push(format!(
                    "too few samples in the second half to judge {what}"
                )),
            }
        }
        self.held = why.is_empty();
        self.why_not = why;
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// The report.md section: the verdict, the changes, and one row per interval.
pub fn markdown(s: &SoakSummary) -> String {
    let pct = |g: Option<f64>| g.map_or("n/a".into(), |g| format!("{:+.1}%", g * 100.0));
    let mut out = format!(
        "\n## Soak\n\n**{}**{} · RSS over the second half {} · descriptors (established upstream connections aside) {} · the proxy {}\n\n",
        if s.held { "Held" } else { "Did not hold" },
        if s.why_not.is_empty() {
            String::new()
        } else {
            format!(": {}", s.why_not.join("; "))
        },
        pct(s.rss_growth),
        pct(s.fd_growth),
        if s.survived {
            "ran to the end"
        } else {
            "exited"
        },
    );
    if let (Some(b), Some(a)) = (s.before, s.after) {
        let _ = writeln!(
            out,
            "Before the load: RSS {:.1} MB, {} descriptors, {} tasks. A few seconds after every client had gone: RSS {:.1} MB, {} descriptors ({} of them pooled upstream connections), {} tasks, {} client connections left.\n",
            mb(b.rss_bytes),
            b.fds,
            b.tasks,
            mb(a.rss_bytes),
            a.fds,
            a.upstream_connections,
            a.tasks,
            a.client_connections
        );
    }
    let c = &s.changes;
    let _ = writeln!(
        out,
        "Changes: {} Ingress, {} Secret (certificate rotations; {} seen served within 5 s), {} ConfigMap ({} of the Ingress and ConfigMap changes seen applied within 5 s, the slowest in {:.0} ms), {} backend scale steps; attacks run: {}.\n",
        c.ingress,
        c.secret,
        c.rotations_seen,
        c.configmap,
        c.applied,
        c.slowest_apply_ms,
        c.endpoint_changes,
        c.attacks
    );
    out.push_str("| t (s) | HTTPS req | failed | p99 ms | h2 req | failed | p99 ms | WS msg | failed | p99 ms | RSS MB | fds | tasks | upstream conns | problems | attack |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for x in &s.samples {
        let _ = writeln!(
            out,
            "| {:.0} | {} | {} | {:.2} | {} | {} | {:.2} | {} | {} | {:.2} | {:.1} | {} | {} | {} | {} | {} |",
            x.t_s,
            x.https.requests,
            x.https.failed,
            x.https.p99_ms,
            x.h2.requests,
            x.h2.failed,
            x.h2.p99_ms,
            x.ws.requests,
            x.ws.failed,
            x.ws.p99_ms,
            mb(x.rss_bytes),
            x.fds,
            x.tasks,
            x.upstream_connections,
            x.problems,
            x.attack.as_deref().unwrap_or("")
        );
    }
    out.push_str("\n![the soak over time](soak.svg)\n");
    out
}

/// One plotted line: its name, its colour and its `(t, value)` points.
type Line<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// One panel: a title, lines over time, the y axis from 0 to the largest value.
fn panel(
    out: &mut String,
    (x0, y0, w, h): (f64, f64, f64, f64),
    title: &str,
    lines: &[Line],
    t_max: f64,
) {
    let hi = lines
        .iter()
        .flat_map(|(_, _, pts)| pts.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let hi = if hi > 0.0 { hi * 1.1 } else { 1.0 };
    let x = |t: f64| x0 + t / t_max.max(1.0) * w;
    let y = |v: f64| y0 + h - v / hi * h;
    let _ = write!(
        out,
        "<rect x=\"{x0}\" y=\"{y0}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#999\"/>\
         <text x=\"{x0}\" y=\"{}\" font-size=\"13\">{}</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\">{}</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\">0</text>",
        y0 - 6.0,
        esc(title),
        x0 - 4.0,
        y0 + 10.0,
        esc(&format!("{:.4}", hi))
            .trim_end_matches('0')
            .trim_end_matches('.'),
        x0 - 4.0,
        y0 + h
    );
    let mut legend_x = x0 + w;
    for (name, color, pts) in lines.iter().rev() {
        if pts.is_empty() {
            continue;
        }
        let points: Vec<String> = pts
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect();
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\
             <text x=\"{legend_x}\" y=\"{}\" font-size=\"11\" fill=\"{color}\" text-anchor=\"end\">{}</text>",
            points.join(" "),
            y0 - 6.0,
            esc(name)
        );
        legend_x -= 8.0 * name.len() as f64 + 16.0;
    }
}

/// `soak.svg`: failed requests, p99 per client kind, RSS, descriptors, tasks and upstream
/// connections over time, one panel each, attacks marked.
pub fn svg(s: &SoakSummary) -> String {
    let (w, ph, gap, l, t) = (960.0, 120.0, 50.0, 70.0, 40.0);
    let pw = w - l - 30.0;
    let t_max = s.samples.last().map_or(1.0, |x| x.t_s);
    let series = |f: &dyn Fn(&SoakSample) -> f64| -> Vec<(f64, f64)> {
        s.samples.iter().map(|x| (x.t_s, f(x))).collect()
    };
    let panels: Vec<(&str, Vec<Line>)> = vec![
        (
            "legitimate requests failed per interval",
            vec![("failed", "#d62728", series(&|x| x.failed() as f64))],
        ),
        (
            "p99 latency (ms)",
            vec![
                ("HTTPS", "#1f77b4", series(&|x| x.https.p99_ms)),
                ("HTTP/2", "#2ca02c", series(&|x| x.h2.p99_ms)),
                ("WebSocket", "#ff7f0e", series(&|x| x.ws.p99_ms)),
            ],
        ),
        (
            "RSS (MB)",
            vec![("RSS", "#9467bd", series(&|x| mb(x.rss_bytes)))],
        ),
        (
            "open descriptors",
            vec![("fds", "#8c564b", series(&|x| x.fds as f64))],
        ),
        (
            "runtime tasks",
            vec![("tasks", "#e377c2", series(&|x| x.tasks as f64))],
        ),
        (
            "upstream connections",
            vec![(
                "upstream",
                "#17becf",
                series(&|x| x.upstream_connections as f64),
            )],
        ),
    ];
    let h = t + panels.len() as f64 * (ph + gap);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\">"
    );
    for (i, (title, lines)) in panels.iter().enumerate() {
        let y0 = t + i as f64 * (ph + gap);
        // Attacks: a shaded band over the interval each ran in.
        for x in s.samples.iter().filter(|x| x.attack.is_some()) {
            let x1 = l + x.t_s / t_max.max(1.0) * pw;
            let bw = s.interval_s / t_max.max(1.0) * pw;
            let _ = write!(
                out,
                "<rect x=\"{:.1}\" y=\"{y0}\" width=\"{bw:.1}\" height=\"{ph}\" fill=\"#f5d5d5\"><title>{}</title></rect>",
                x1 - bw,
                esc(x.attack.as_deref().unwrap_or_default())
            );
        }
        panel(&mut out, (l, y0, pw, ph), title, lines, t_max);
    }
    let _ = write!(
        out,
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">seconds ({:.0} s per sample; red bands: attacks)</text></svg>",
        l + pw,
        h - 8.0,
        s.interval_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, rss_mb: u64, fds: u64, failed: u64) -> SoakSample {
        SoakSample {
            t_s: t,
            https: Traffic {
                requests: 100,
                failed,
                p99_ms: 1.0,
            },
            rss_bytes: rss_mb * 1_000_000,
            fds,
            ..SoakSample::default()
        }
    }

    #[test]
    fn growth_compares_the_second_half_s_ends_by_their_medians() {
        let flat = [
            (0.0, 10.0),
            (50.0, 20.0),
            (60.0, 20.0),
            (70.0, 21.0),
            (80.0, 20.0),
        ];
        // First half ignored (10 → 20 is warm-up); 20 → 20.5.
        assert_eq!(growth(&flat, 50.0), Some(0.025));
        let leak = [(50.0, 20.0), (60.0, 20.0), (70.0, 22.0), (80.0, 22.0)];
        assert_eq!(growth(&leak, 50.0), Some(0.1));
        // One spike at the end does not count as growth over three readings.
        let spike = [
            (50.0, 20.0),
            (60.0, 20.0),
            (70.0, 20.0),
            (80.0, 20.0),
            (90.0, 20.0),
            (100.0, 40.0),
        ];
        assert_eq!(growth(&spike, 50.0), Some(0.0));
        assert_eq!(growth(&[(90.0, 1.0)], 50.0), None);
    }

    #[test]
    fn the_verdict_names_every_reason() {
        let mut s = SoakSummary {
            samples: (0..10)
                .map(|i| sample(f64::from(i) * 10.0, 20, 100, 0))
                .collect(),
            ..SoakSummary::default()
        };
        s.judge(90.0, true);
        assert!(s.held, "{:?}", s.why_not);
        s.samples[9].https.failed = 2;
        s.samples[8].rss_bytes = 30_000_000;
        s.samples[9].rss_bytes = 30_000_000;
        s.samples[7].rss_bytes = 30_000_000;
        s.judge(90.0, false);
        assert!(!s.held);
        let why = s.why_not.join("; ");
        assert!(why.contains("2 legitimate requests failed"), "{why}");
        assert!(why.contains("the proxy exited"), "{why}");
        assert!(why.contains("RSS grew 50.0%"), "{why}");
        assert!(!why.contains("descriptors"), "{why}");
        let md = markdown(&s);
        assert!(md.contains("Did not hold"), "{md}");
        assert!(svg(&s).contains("<polyline"));
    }
}
