//! What a run reports: `report.json`, `report.md`, the plots, and the terminal table.

pub mod html;
pub mod rounds;
pub mod soak;
pub mod svg;
mod table;
pub mod worst;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::load::{LoadReport, Percentiles, SecondStats, Seen, Truth, WrkErrors};
pub use table::{markdown_table, terminal_footer, terminal_table};

/// A configuration change during a run.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Seconds from the start of the load.
    pub t_s: f64,
    /// What changed, e.g. `5→7 +pod-6,pod-7` or `SIGTERM pod-6,pod-7`.
    pub what: String,
    /// Whether the endpoint list changed (false for a SIGTERM/kill alone).
    pub endpoint_change: bool,
    /// When the peer reported the change applied (s from start), where it can tell.
    pub applied_s: Option<f64>,
    /// When the change was handed over (s from start): the API server acknowledged the write,
    /// the file was renamed into place, the reload was signalled. Propagation counts from here.
    pub acked_s: Option<f64>,
}

/// Time from a pod's endpoint being added to the first response it served.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Propagation {
    /// Median over scale-ups (ms).
    pub median_ms: f64,
    /// 99th percentile over scale-ups (ms; the maximum below 100 of them).
    pub p99_ms: f64,
    /// Median counted from when the change was sent instead (ms): the two differ by how long
    /// the hand-over took (an API write's round trip; the watch may deliver the change to the
    /// controller before the writer sees the acknowledgement, so the figure above can be < 0).
    pub from_sent_median_ms: f64,
    /// Largest (ms).
    pub max_ms: f64,
    /// Longest a removed pod still answered after its endpoint was removed (ms).
    pub removed_pod_last_response_after_ms: f64,
}

/// One peer (and variant) in one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeerResult {
    /// Peer name.
    pub name: String,
    /// Variant, e.g. `https`, `http`, `tls1.2`.
    pub variant: String,
    /// `null`, or why the peer did not run.
    pub skipped: Option<String>,
    /// Requested rate (open loop).
    pub requested_rps: Option<f64>,
    /// Achieved rate (requests, failed ones included, per second).
    pub achieved_rps: f64,
    /// Requests.
    pub requests: u64,
    /// Configuration changes applied.
    pub changes: u64,
    /// wrk2's error classes.
    pub errors: WrkErrors,
    /// Requests without a 2xx response.
    pub requests_failed: u64,
    /// Idle keep-alive connections closed by the server (not failed requests).
    pub idle_closed_by_server: u64,
    /// Latency (ms).
    pub latency_ms: Percentiles,
    /// Proxy CPU seconds (user + system of its process tree) during the load.
    pub cpu_seconds: f64,
    /// Proxy CPU milliseconds per 1,000 requests.
    pub cpu_ms_per_1k_requests: f64,
    /// Proxy CPU seconds / (duration × cores it was given): near 1 means the proxy was the
    /// bottleneck (closed-loop scenarios).
    pub proxy_cpu_utilization: Option<f64>,
    /// Peak resident memory of the proxy's process tree (bytes).
    pub peak_rss_bytes: u64,
    /// Response bytes per second, in Mbit/s.
    pub throughput_mbit_s: f64,
    /// Settings that matter for the comparison.
    pub settings: BTreeMap<String, String>,
    /// Per-request truth.
    pub truth: Truth,
    /// Responses by status code.
    pub status: BTreeMap<u16, u64>,
    /// Rate kept (open loop).
    pub rate_kept: bool,
    /// Why the rate was not kept.
    pub rate_note: Option<String>,
    /// Scheduled requests never sent.
    pub missed: u64,
    /// Changes during the run.
    pub events: Vec<Event>,
    /// Scale-up propagation measured from traffic (`x-backend`).
    pub propagation: Option<Propagation>,
    /// Remarks (change failures, pinning, ...).
    pub notes: Vec<String>,
    /// Per-second timeline.
    pub timeline: Vec<SecondStats>,
    /// Latency by percentile.
    pub latency_curve: Vec<[f64; 2]>,
    /// Backends seen.
    pub backends_seen: BTreeMap<String, Seen>,
}

impl PeerResult {
    /// A skipped entry.
    pub fn skipped(name: &str, variant: &str, why: String) -> Self {
        Self {
            name: name.into(),
            variant: variant.into(),
            skipped: Some(why),
            ..Self::default()
        }
    }

    /// Fills the load fields from a load report.
    pub fn with_load(mut self, l: &LoadReport) -> Self {
        self.requested_rps = l.requested_rps;
        self.achieved_rps = l.achieved_rps;
        self.requests = l.requests;
        self.errors = l.errors;
        self.requests_failed = l.requests_failed;
        self.idle_closed_by_server = l.idle_closed_by_server;
        self.latency_ms = l.latency_ms;
        self.truth = l.truth;
        self.status.clone_from(&l.status);
        self.rate_kept = l.rate_kept;
        self.rate_note.clone_from(&l.rate_note);
        self.missed = l.missed;
        self.timeline.clone_from(&l.timeline);
        self.latency_curve.clone_from(&l.latency_curve);
        self.backends_seen.clone_from(&l.backends_seen);
        self.throughput_mbit_s = l.bytes_received as f64 * 8.0 / 1e6 / l.duration_s.max(1e-9);
        self
    }
}

/// One row of the scale scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    /// Peer.
    pub name: String,
    /// Ingresses or HTTPRoutes (each with its own Service and EndpointSlice, or server block +
    /// upstream).
    pub ingresses: usize,
    /// What the routes are: `Ingress` or `HTTPRoute`.
    pub objects: String,
    /// `null`, or why it did not run.
    pub skipped: Option<String>,
    /// Process start → first 200 on the last host (s).
    pub ready_s: f64,
    /// CPU seconds spent until ready.
    pub cpu_seconds_to_ready: f64,
    /// One endpoint change (file written / reload signalled) → first response from the new
    /// backend: median over the changes (ms).
    pub change_median_ms: f64,
    /// Same, largest (ms).
    pub change_max_ms: f64,
    /// Changes measured.
    pub changes: usize,
    /// One route change (sluice: the object of host 0 pointed at another Service) → first
    /// response from the new backend: median (ms; 0 where not measured).
    pub route_change_median_ms: f64,
    /// Same, largest (ms).
    pub route_change_max_ms: f64,
    /// Route changes measured (0: the peer has none apart from endpoint changes).
    pub route_changes: usize,
    /// Peak resident memory of the process tree (bytes).
    pub peak_rss_bytes: u64,
    /// Size of the configuration written (bytes).
    pub config_bytes: u64,
    /// Remarks.
    pub notes: Vec<String>,
}

impl ScaleRow {
    /// A row with nothing measured yet (or never measured, when `skipped` is set).
    pub fn new(name: &str, ingresses: usize, skipped: Option<String>) -> Self {
        Self {
            name: name.into(),
            ingresses,
            objects: "Ingress".into(),
            skipped,
            ready_s: 0.0,
            cpu_seconds_to_ready: 0.0,
            change_median_ms: 0.0,
            change_max_ms: 0.0,
            changes: 0,
            route_change_median_ms: 0.0,
            route_change_max_ms: 0.0,
            route_changes: 0,
            peak_rss_bytes: 0,
            config_bytes: 0,
            notes: Vec::new(),
        }
    }
}

/// One row of the idle-connection scenario: one peer, one client protocol.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IdleRow {
    /// Peer.
    pub name: String,
    /// Client protocol: `http`, `https` or `h2`.
    pub variant: String,
    /// `null`, or why it did not run.
    pub skipped: Option<String>,
    /// Connections opened.
    pub connections: usize,
    /// Connections whose one request was answered.
    pub answered: usize,
    /// Answered connections still open at the last reading.
    pub open: usize,
    /// RSS of the peer's process tree before the first connection (bytes).
    pub rss_base_bytes: u64,
    /// RSS just after the last answer (bytes).
    pub rss_answered_bytes: u64,
    /// RSS after the settling time (bytes).
    pub rss_settled_bytes: u64,
    /// (answered - base) / open, KB.
    pub kb_per_connection_answered: f64,
    /// (settled - base) / open, KB: the figure to quote.
    pub kb_per_connection: f64,
    /// RSS after every connection was closed and the settling time passed again (bytes):
    /// what holding them left behind.
    pub rss_closed_bytes: u64,
    /// RSS after a second round of as many connections, closed and settled the same way:
    /// above the first round's, memory is kept (a leak), not cached.
    pub rss_closed_again_bytes: u64,
    /// Connections on the peer's port (any state but listening) after the clients closed.
    pub clients_left: usize,
    /// Open descriptors of the peer's tree before the first connection.
    pub fds_base: u64,
    /// … while the connections were held.
    pub fds_settled: u64,
    /// … after they were closed and the settling time passed (a leak stays above base).
    pub fds_closed: u64,
    /// Remarks (failed connections, closes, non-2xx answers).
    pub notes: Vec<String>,
}

impl IdleRow {
    /// A row for a peer that did not run.
    pub fn skipped(name: &str, variant: &str, why: String) -> Self {
        Self {
            name: name.into(),
            variant: variant.into(),
            skipped: Some(why),
            ..Self::default()
        }
    }
}

/// A whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Quick mode.
    pub quick: bool,
    /// Start time (UTC).
    pub started_utc: String,
    /// The command line.
    pub command: String,
    /// Plain words on what this run shows and does not show.
    pub what_it_shows: String,
    /// Machine facts (cores, pinning, fd limit).
    pub machine: BTreeMap<String, String>,
    /// Scenario settings (load, churn timing, removal order).
    pub settings: BTreeMap<String, String>,
    /// Per peer and variant.
    pub peers: Vec<PeerResult>,
    /// Scale scenario rows.
    pub scale: Vec<ScaleRow>,
    /// Extra rows (the wrk comparison).
    pub extra: Vec<BTreeMap<String, String>>,
    /// Idle-connection scenario rows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub idle: Vec<IdleRow>,
    /// Medians over repeated rounds (capacity scenarios with `--rounds`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<rounds::RoundSummary>,
    /// The soak's samples and verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<soak::SoakSummary>,
}

/// Writes report.json, report.md, latency.svg, timeline.svg, summary.md and index.html into
/// `dir`.
pub fn write_all(dir: &Path, r: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_string_pretty(r).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), json)?;
    std::fs::write(dir.join("report.md"), markdown(r))?;
    let ran: Vec<&PeerResult> = r.peers.iter().filter(|p| p.skipped.is_none()).collect();
    if let Some(s) = &r.soak {
        std::fs::write(dir.join("soak.svg"), soak::svg(s))?;
    }
    if !ran.is_empty() {
        std::fs::write(dir.join("latency.svg"), svg::latency(r, &ran))?;
        // The soak's timeline is per interval, in soak.svg.
        if r.soak.is_none() {
            std::fs::write(dir.join("timeline.svg"), svg::timeline(r, &ran))?;
        }
    }
    let one = [(String::new(), r)];
    std::fs::write(dir.join("summary.md"), html::summary(&one))?;
    std::fs::write(
        dir.join("index.html"),
        html::index(&format!("sluice-bench {}", r.scenario), "", &one),
    )?;
    Ok(())
}

fn markdown(r: &Report) -> String {
    let mut s = format!(
        "# sluice-bench {}{}\n\n{}\n\nStarted {} · `{}`\n\n",
        r.scenario,
        if r.quick { " (quick)" } else { "" },
        r.what_it_shows,
        r.started_utc,
        r.command
    );
    s.push_str(&markdown_table(r));
    if !r.rounds.is_empty() {
        s.push_str("\n## Medians over rounds\n\n```\n");
        s.push_str(rounds::text(&r.rounds).trim_start());
        s.push_str("```\n");
    }
    let skipped: Vec<String> = r
        .peers
        .iter()
        .filter_map(|p| {
            p.skipped
                .as_ref()
                .map(|w| format!("- {} {}: skipped: {w}\n", p.name, p.variant))
        })
        .collect();
    if !skipped.is_empty() {
        s.push_str("\n## Skipped\n\n");
        s.extend(skipped);
    }
    let flagged: Vec<String> = r
        .peers
        .iter()
        .filter_map(|p| {
            p.rate_note
                .as_ref()
                .map(|n| format!("- {} {}: {n}\n", p.name, p.variant))
        })
        .collect();
    if !flagged.is_empty() {
        s.push_str("\n## Runs where the requested rate was not kept\n\n");
        s.extend(flagged);
    }
    if !r.peers.is_empty() {
        s.push_str("\n## Per-request truth (requests without a 2xx, by cause)\n\n| peer | variant | refused | connect timeout | handshake | failed after send (retryable) | response timeout | 5xx | other non-2xx | idle closed |\n|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for p in r.peers.iter().filter(|p| p.skipped.is_none()) {
        let c = p.truth.causes();
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} |\n",
            p.name,
            p.variant,
            c.refused,
            c.connect_timeout,
            c.handshake,
            c.failed_after_send,
            c.retryable,
            c.response_timeout,
            c.status_5xx,
            c.other_non2xx,
            p.idle_closed_by_server
        ));
    }
    let with_events: Vec<&PeerResult> = r.peers.iter().filter(|p| !p.events.is_empty()).collect();
    if !with_events.is_empty() {
        s.push_str("\n## Changes and propagation\n\n");
        for p in with_events {
            let prop = p.propagation.map_or("n/a".to_string(), |pr| {
                let removed = if pr.removed_pod_last_response_after_ms > 0.0 {
                    format!("; a removed pod still answered up to {:.0} ms after its endpoint was removed", pr.removed_pod_last_response_after_ms)
                } else {
                    String::new()
                };
                format!(
                    "a new pod's first response came {:.1} ms after its endpoint was handed over (median; p99 {:.1} ms, max {:.1} ms; {:.1} ms after the change was sent, median){removed}",
                    pr.median_ms, pr.p99_ms, pr.max_ms, pr.from_sent_median_ms
                )
            });
            s.push_str(&format!(
                "- **{}** ({} changes): {prop}\n",
                p.name, p.changes
            ));
            if p.events.iter().any(|e| e.applied_s.is_some()) {
                s.push_str("  - \"applied at\": when the peer itself reported the change in effect (sluice's admin API listing the new endpoints; HAProxy's runtime API and Caddy's admin API answering). Reload-based peers cannot tell when their new workers took over, so they show none; the first-response figure above measures every peer the same way.\n");
            }
            for e in &p.events {
                let ap = match (e.acked_s, e.applied_s) {
                    (Some(k), Some(a)) => {
                        format!(" (handed over at {k:.3} s, applied at {a:.3} s)")
                    }
                    (Some(k), None) => format!(" (handed over at {k:.3} s)"),
                    (None, Some(a)) => format!(" (applied at {a:.3} s)"),
                    (None, None) => String::new(),
                };
                s.push_str(&format!("  - {:.3} s: {}{ap}\n", e.t_s, e.what));
            }
        }
    }
    let idle_notes: Vec<String> = r
        .idle
        .iter()
        .flat_map(|i| {
            i.notes
                .iter()
                .map(move |n| format!("- {} {}: {n}\n", i.name, i.variant))
        })
        .collect();
    if !idle_notes.is_empty() {
        s.push_str("\n## Notes\n\n");
        s.extend(idle_notes);
    }
    if let Some(soak) = &r.soak {
        s.push_str(&soak::markdown(soak));
    }
    if r.scenario == "abuse" {
        s.push_str(&worst::markdown(r));
    }
    s.push_str("\n## Settings\n\n");
    for (k, v) in r.settings.iter().chain(r.machine.iter()) {
        s.push_str(&format!("- {k}: {v}\n"));
    }
    for p in r.peers.iter().filter(|p| !p.settings.is_empty()) {
        s.push_str(&format!("\n### {} {}\n\n", p.name, p.variant));
        for (k, v) in &p.settings {
            s.push_str(&format!("- {k}: {v}\n"));
        }
        for n in &p.notes {
            s.push_str(&format!("- note: {n}\n"));
        }
    }
    if !r.peers.is_empty() && r.soak.is_some() {
        s.push_str("\n## Plots\n\n![latency by percentile](latency.svg)\n");
    } else if !r.peers.is_empty() {
        s.push_str("\n## Plots\n\n![latency by percentile](latency.svg)\n\n![errors and p99 per second](timeline.svg)\n");
    }
    s
}
