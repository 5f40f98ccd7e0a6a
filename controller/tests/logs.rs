//! The `sluice` binary's log as a file or pipe receives it: no ANSI colour codes (they are for
//! terminals only) and plain field values (`http=127.0.0.1:8080`, not `Some(…)`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

mod common;
use common::{args, lines_of, serve};

#[test]
fn log_to_a_pipe_has_no_colour_codes_and_plain_values() {
    let dir = tempfile::tempdir().unwrap();
    // A rejected file makes an error line too (levels are what colour codes wrap first).
    std::fs::write(dir.path().join("bad.yaml"), "kind: [unclosed").unwrap();
    let listen = [
        "--http-listen",
        "127.0.0.1:0",
        "--https-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    let mut child = serve(dir.path(), &args(&listen), Stdio::null());
    let rx = lines_of(child.stderr.take().unwrap());
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
        lines.push(line);
        let seen = |what: &str| lines.iter().any(|l| l.contains(what));
        if seen("listening") && seen("manifest rejected") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = lines.join("\n");
    let listening = lines
        .iter()
        .find(|l| l.contains("listening"))
        .unwrap_or_else(|| panic!("no 'listening' line in:\n{log}"));
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a piped log:\n{log}"
    );
    assert!(
        !log.contains("Some("),
        "Option debug output in the log:\n{log}"
    );
    assert!(listening.contains("http=127.0.0.1:"), "{listening}");
    assert!(log.contains("manifest rejected"), "{log}");
}
