//! Logging via tracing: text or JSON lines, filter from `--log-level` (or `RUST_LOG`). Text is
//! coloured only when stderr is a terminal: a log written to a file, a pipe or a container
//! runtime's log must not carry ANSI escape codes.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber. Errors if the filter does not parse.
pub fn init(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v)?,
        _ => EnvFilter::try_new(level)?,
    };
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let r = match format {
        LogFormat::Text => b.try_init(),
        LogFormat::Json => b.json().flatten_event(true).try_init(),
    };
    r.map_err(|e| anyhow::anyhow!("logging: {e}"))
}
