//! h2load (nghttp2) as the load generator for HTTP/2 from the client (`rps --proto h2`): TLS
//! with ALPN `h2`, a few connections each carrying many concurrent streams, as browsers and
//! API clients do. h2load runs as a child process on the load CPUs; its summary becomes a
//! [`LoadReport`]. h2load reports no latency percentiles (min, max, mean only): p50 and above
//! are NaN.

use super::record::WrkErrors;
use super::wrk::{Tool, ToolSummary, run_tool, tool, tool_report};
use super::{Hooks, LoadError, LoadReport, LoadSpec, Mode};

/// h2load's figures.
#[derive(Debug, Default, PartialEq)]
pub struct H2loadOut {
    /// Requests per second over the measured duration.
    pub rps: f64,
    /// Length of the measured run (s).
    pub duration_s: f64,
    /// Requests done.
    pub done: u64,
    /// Requests that got an answer of any status.
    pub succeeded: u64,
    /// Requests that failed (stream or connection errors, timeouts).
    pub failed: u64,
    /// Answers by status class: 2xx, 3xx, 4xx, 5xx.
    pub classes: [u64; 4],
    /// Bytes received (frames included).
    pub bytes: u64,
    /// Mean and largest request time (ms).
    pub mean_ms: f64,
    /// Largest request time (ms).
    pub max_ms: f64,
}

/// An h2load time (`187us`, `4.67ms`, `1.2s`) in milliseconds.
fn ms(v: &str) -> f64 {
    let num = |s: &str| s.parse::<f64>().unwrap_or(f64::NAN);
    if let Some(x) = v.strip_suffix("us") {
        num(x) / 1000.0
    } else if let Some(x) = v.strip_suffix("ms") {
        num(x)
    } else if let Some(x) = v.strip_suffix('s') {
        num(x) * 1000.0
    } else {
        num(v)
    }
}

/// The number before `word` in `line` (`"100 succeeded"` → 100).
fn count(line: &str, word: &str) -> u64 {
    line.split(',')
        .map(str::trim)
        .find_map(|part| part.strip_suffix(word).map(str::trim))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Parses h2load's summary.
pub fn parse(out: &str) -> H2loadOut {
    let mut h = H2loadOut::default();
    for line in out.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("finished in ") {
            let mut parts = rest.split(',').map(str::trim);
            h.duration_s = parts.next().map_or(0.0, |d| ms(d) / 1000.0);
            h.rps = parts
                .next()
                .and_then(|r| r.strip_suffix(" req/s"))
                .and_then(|r| r.parse().ok())
                .unwrap_or(0.0);
        } else if let Some(rest) = line.strip_prefix("requests:") {
            h.done = count(rest, "done");
            h.succeeded = count(rest, "succeeded");
            h.failed = count(rest, "failed") + count(rest, "errored") + count(rest, "timeout");
        } else if let Some(rest) = line.strip_prefix("status codes:") {
            for (i, class) in ["2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                h.classes[i] = count(rest, class);
            }
        } else if let Some(rest) = line.strip_prefix("traffic:") {
            // "112.78MB (118262344) total, ...": the exact count in parentheses.
            h.bytes = rest
                .split_once('(')
                .and_then(|(_, r)| r.split_once(')'))
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("time for request:") {
            // min, max, mean, sd, +/- sd
            let cols: Vec<&str> = rest.split_whitespace().collect();
            if let (Some(max), Some(mean)) = (cols.get(1), cols.get(2)) {
                h.max_ms = ms(max);
                h.mean_ms = ms(mean);
            }
        }
    }
    h
}

/// Runs h2load closed loop: `spec.connections` connections with `streams` concurrent streams
/// each, `threads` threads, against the first address of `spec` (TLS, ALPN h2; the server
/// name and `:authority` are `spec.host`).
pub async fn run(
    spec: &LoadSpec,
    threads: usize,
    streams: usize,
    hooks: Hooks,
) -> Result<LoadReport, LoadError> {
    if !matches!(spec.mode, Mode::Closed) || spec.tls.is_none() {
        return Err(LoadError::Invalid(
            "h2load runs closed loop over TLS (ALPN h2) only".into(),
        ));
    }
    let Tool {
        addr,
        mut cmd,
        threads,
        secs,
    } = tool(spec, threads, "h2load", "apt-get install nghttp2-client")?;
    cmd.args([
        format!("--threads={threads}"),
        format!("--clients={}", spec.connections),
        format!("--max-concurrent-streams={streams}"),
        format!("--duration={secs}"),
        "--warm-up-time=1".into(),
        format!("--connect-to={addr}"),
        format!("https://{}:{}{}", spec.host, addr.port(), spec.path),
    ])
    .kill_on_drop(true);
    let (text, stderr) = run_tool(cmd, secs, "h2load", hooks).await?;
    let h = parse(&text);
    if h.done == 0 {
        return Err(LoadError::Invalid(format!(
            "h2load completed no request: {}{}",
            text.trim(),
            stderr.trim()
        )));
    }
    let non2xx = h.classes[1] + h.classes[2] + h.classes[3];
    Ok(tool_report(ToolSummary {
        mode: format!("closed-loop (h2load, {streams} streams per connection)"),
        rps: h.rps,
        duration_s: h.duration_s,
        connections: spec.connections,
        requests: h.done,
        responses: h.succeeded,
        ok_2xx: h.classes[0],
        failed: h.failed + non2xx,
        errors: WrkErrors {
            status_non2xx: non2xx,
            read: h.failed,
            ..WrkErrors::default()
        },
        latency: [f64::NAN, f64::NAN, f64::NAN, h.max_ms, h.mean_ms],
        bytes: h.bytes,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_h2load() {
        let out = "starting benchmark...\nfinished in 5.00s, 21234.40 req/s, 22.56MB/s\nrequests: 106172 total, 106272 started, 106172 done, 106170 succeeded, 2 failed, 1 errored, 0 timeout\nstatus codes: 106160 2xx, 0 3xx, 4 4xx, 6 5xx\ntraffic: 112.78MB (118262344) total, 1.03MB (1076720) headers (space savings 94.96%), 103.69MB (108724128) data\n                     min         max         mean         sd        +/- sd\ntime for request:      187us     29.98ms      4.67ms      1.29ms    82.30%\ntime for connect:     5.34ms     11.42ms      8.53ms      2.19ms    60.00%\n";
        let h = super::parse(out);
        assert_eq!(h.rps, 21234.4);
        assert!((h.duration_s - 5.0).abs() < 1e-9);
        assert_eq!((h.done, h.succeeded, h.failed), (106_172, 106_170, 3));
        assert_eq!(h.classes, [106_160, 0, 4, 6]);
        assert_eq!(h.bytes, 118_262_344);
        assert!((h.max_ms - 29.98).abs() < 1e-9 && (h.mean_ms - 4.67).abs() < 1e-9);
    }
}
