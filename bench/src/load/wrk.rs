//! wrk as the load generator of a closed-loop capacity run (`--generator wrk`): the tool the
//! published proxy comparisons use, so a figure can be checked without trusting our own
//! generator. wrk runs as a child process, inheriting the load CPUs this process is pinned to,
//! and its summary is turned into a [`LoadReport`]. wrk gives fewer facts than our generator:
//! no per-request truth beyond its error classes, no timeline, no p99.9 (reported as NaN).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::record::WrkErrors;
use super::{Hooks, LoadError, LoadReport, LoadSpec, Mode, Percentiles, Truth};

/// wrk's figures parsed from its `--latency` output.
#[derive(Debug, Default, PartialEq)]
pub struct WrkOut {
    /// Requests/sec.
    pub rps: f64,
    /// Requests completed.
    pub requests: u64,
    /// Length of the run (s).
    pub duration_s: f64,
    /// Bytes read.
    pub bytes: u64,
    /// p50 (ms).
    pub p50_ms: f64,
    /// p90 (ms).
    pub p90_ms: f64,
    /// p99 (ms).
    pub p99_ms: f64,
    /// Mean latency (ms).
    pub mean_ms: f64,
    /// Largest latency (ms).
    pub max_ms: f64,
    /// Socket errors and statuses above 399.
    pub errors: WrkErrors,
}

impl WrkOut {
    /// Socket errors plus non-2xx/3xx responses.
    pub fn error_count(&self) -> u64 {
        self.errors.total()
    }
}

/// A wrk duration (`412.00us`, `2.10ms`, `1.5s`, `2m`) in milliseconds.
fn wrk_ms(v: &str) -> f64 {
    let v = v.trim();
    let num = |s: &str| s.parse::<f64>().unwrap_or(0.0);
    if let Some(x) = v.strip_suffix("us") {
        num(x) / 1000.0
    } else if let Some(x) = v.strip_suffix("ms") {
        num(x)
    } else if let Some(x) = v.strip_suffix('s') {
        num(x) * 1000.0
    } else if let Some(x) = v.strip_suffix('m') {
        num(x) * 60_000.0
    } else {
        num(v)
    }
}

/// A wrk size (`400.00MB`, `12.5KB`, `10B`) in bytes.
fn wrk_bytes(v: &str) -> u64 {
    let v = v.trim();
    let (num, scale) = [
        ("TB", 1u64 << 40),
        ("GB", 1 << 30),
        ("MB", 1 << 20),
        ("KB", 1 << 10),
    ]
    .iter()
    .find_map(|(u, s)| v.strip_suffix(u).map(|n| (n, *s)))
    .unwrap_or((v.strip_suffix('B').unwrap_or(v), 1));
    (num.trim().parse::<f64>().unwrap_or(0.0) * scale as f64) as u64
}

/// Parses wrk's `--latency` output.
pub fn parse(out: &str) -> WrkOut {
    let mut w = WrkOut::default();
    for line in out.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            w.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = line.strip_prefix("Latency ") {
            // "Latency  3.06ms  1.20ms  12.00ms  90.00%": avg, stdev, max.
            let cols: Vec<&str> = v.split_whitespace().collect();
            if let (Some(avg), Some(max)) = (cols.first(), cols.get(2)) {
                w.mean_ms = wrk_ms(avg);
                w.max_ms = wrk_ms(max);
            }
        } else if let Some(v) = line.strip_prefix("50%") {
            w.p50_ms = wrk_ms(v);
        } else if let Some(v) = line.strip_prefix("90%") {
            w.p90_ms = wrk_ms(v);
        } else if let Some(v) = line.strip_prefix("99%") {
            w.p99_ms = wrk_ms(v);
        } else if let Some((n, rest)) = line.split_once(" requests in ") {
            w.requests = n.trim().parse().unwrap_or(0);
            if let Some((d, read)) = rest.split_once(',') {
                w.duration_s = wrk_ms(d) / 1000.0;
                w.bytes = wrk_bytes(read.trim().trim_end_matches("read"));
            }
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            for part in v.split(',') {
                let mut it = part.split_whitespace();
                let (Some(class), Some(n)) = (it.next(), it.next()) else {
                    continue;
                };
                let n = n.parse::<u64>().unwrap_or(0);
                match class {
                    "connect" => w.errors.connect += n,
                    "read" => w.errors.read += n,
                    "write" => w.errors.write += n,
                    "timeout" => w.errors.timeout += n,
                    _ => {}
                }
            }
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            w.errors.status_non2xx += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    w
}

/// Runs wrk closed loop with `threads` threads against the first address of `spec`.
pub async fn run(spec: &LoadSpec, threads: usize, hooks: Hooks) -> Result<LoadReport, LoadError> {
    if !matches!(spec.mode, Mode::Closed) || !spec.keep_alive {
        return Err(LoadError::Invalid(
            "wrk runs closed loop over keep-alive connections only".into(),
        ));
    }
    let Tool {
        addr,
        mut cmd,
        threads,
        secs,
    } = tool(spec, threads, "wrk", "bench/install-peers.sh")?;
    let scheme = if spec.tls.is_some() { "https" } else { "http" };
    cmd.args([
        format!("-t{threads}"),
        format!("-c{}", spec.connections),
        format!("-d{secs}s"),
        format!("--timeout={}s", spec.timeout.as_secs().max(1)),
        "--latency".into(),
        "-H".into(),
        format!("Host: {}", spec.host),
        format!("{scheme}://{addr}{}", spec.path),
    ])
    .kill_on_drop(true);
    let (text, stderr) = run_tool(cmd, secs, "wrk", hooks).await?;
    let w = parse(&text);
    if w.requests == 0 {
        return Err(LoadError::Invalid(format!(
            "wrk completed no request: {}{}",
            text.trim(),
            stderr.trim()
        )));
    }
    Ok(tool_report(ToolSummary {
        mode: "closed-loop (wrk)".into(),
        rps: w.rps,
        duration_s: w.duration_s,
        connections: spec.connections,
        requests: w.requests,
        responses: w.requests,
        ok_2xx: w.requests.saturating_sub(w.errors.status_non2xx),
        failed: w.error_count(),
        errors: w.errors,
        latency: [w.p50_ms, w.p90_ms, w.p99_ms, w.max_ms, w.mean_ms],
        bytes: w.bytes,
    }))
}

/// What running an external generator starts from.
pub(super) struct Tool {
    /// The target: the first address of the spec.
    pub addr: std::net::SocketAddr,
    /// The tool's command, arguments still to add.
    pub cmd: tokio::process::Command,
    /// Threads, at least one and at most one per connection.
    pub threads: usize,
    /// Whole seconds to run (at least one).
    pub secs: u64,
}

/// Finds `name` on the PATH (`install` says how to get it) and sets up its run against `spec`.
pub(super) fn tool(
    spec: &LoadSpec,
    threads: usize,
    name: &str,
    install: &str,
) -> Result<Tool, LoadError> {
    let addr = *spec
        .addrs
        .first()
        .ok_or_else(|| LoadError::Invalid("no address".into()))?;
    let bin = crate::sys::which(name)
        .ok_or_else(|| LoadError::Invalid(format!("{name} is not installed ({install})")))?;
    Ok(Tool {
        addr,
        cmd: tokio::process::Command::new(bin),
        threads: threads.clamp(1, spec.connections.max(1)),
        secs: spec.duration.as_secs().max(1),
    })
}

/// Runs an external load generator to completion (its run is `secs` long; it gets 30 s more
/// before it counts as hung), telling `hooks` when it starts; returns its stdout and stderr.
pub(super) async fn run_tool(
    mut cmd: tokio::process::Command,
    secs: u64,
    name: &str,
    hooks: Hooks,
) -> Result<(String, String), LoadError> {
    if let Some(tx) = hooks.started {
        let _ = tx.send(Instant::now());
    }
    let out = tokio::time::timeout(Duration::from_secs(secs + 30), cmd.output())
        .await
        .map_err(|_| LoadError::Invalid(format!("{name} did not finish")))?
        .map_err(|e| LoadError::Invalid(format!("{name}: {e}")))?;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// What an external generator's summary says, for [`tool_report`].
pub(super) struct ToolSummary {
    pub mode: String,
    pub rps: f64,
    pub duration_s: f64,
    pub connections: usize,
    pub requests: u64,
    pub responses: u64,
    pub ok_2xx: u64,
    pub failed: u64,
    pub errors: WrkErrors,
    /// p50, p90, p99, max, mean (ms); NaN where the tool does not say.
    pub latency: [f64; 5],
    pub bytes: u64,
}

/// A closed-loop keep-alive [`LoadReport`] from an external generator's summary: no
/// per-request truth, timeline or percentiles beyond p99.
pub(super) fn tool_report(t: ToolSummary) -> LoadReport {
    let [p50, p90, p99, max, mean] = t.latency;
    LoadReport {
        mode: t.mode,
        requested_rps: None,
        achieved_rps: t.rps,
        duration_s: t.duration_s,
        connections: t.connections,
        keep_alive: true,
        requests: t.requests,
        responses: t.responses,
        requests_failed: t.failed,
        idle_closed_by_server: 0,
        missed: 0,
        errors: t.errors,
        truth: Truth::default(),
        status: BTreeMap::from([(200, t.ok_2xx)]),
        latency_ms: Percentiles {
            p50,
            p90,
            p99,
            p99_9: f64::NAN,
            p99_99: f64::NAN,
            p99_999: f64::NAN,
            p99_9999: f64::NAN,
            max,
            mean,
        },
        latency_curve: Vec::new(),
        bytes_received: t.bytes,
        rate_kept: true,
        rate_note: None,
        generator_lag_p99_ms: 0.0,
        timeline: Vec::new(),
        backends_seen: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_wrk() {
        let out = "Running 5s test @ http://127.0.0.1:1/\n  1 threads and 10 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   500.00us  100.00us   3.50ms   90.00%\n  Latency Distribution\n     50%  412.00us\n     75%  500.00us\n     90%  800.00us\n     99%    2.10ms\n  100000 requests in 5.00s, 110.00MB read\n  Socket errors: connect 0, read 3, write 0, timeout 1\n  Non-2xx or 3xx responses: 2\nRequests/sec:  20000.50\n";
        let w = super::parse(out);
        assert_eq!(w.rps, 20000.5);
        assert_eq!(w.requests, 100_000);
        assert!((w.duration_s - 5.0).abs() < 1e-9);
        assert_eq!(w.bytes, 110 * 1024 * 1024);
        assert!((w.p50_ms - 0.412).abs() < 1e-9);
        assert!((w.p90_ms - 0.8).abs() < 1e-9);
        assert!((w.p99_ms - 2.1).abs() < 1e-9);
        assert!((w.max_ms - 3.5).abs() < 1e-9 && (w.mean_ms - 0.5).abs() < 1e-9);
        assert_eq!((w.errors.read, w.errors.timeout), (3, 1));
        assert_eq!(w.error_count(), 6);
    }
}
