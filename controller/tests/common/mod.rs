//! What the `sluice` binary's end-to-end tests share: a pod, the manifests that route
//! `app.test` to it, and a child's output read line by line.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

/// A pod that answers every request on a connection with 200 "ok".
pub fn pod() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                loop {
                    let n = match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
                        let body = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() < end + 4 + body {
                            break;
                        }
                        seen.drain(..end + 4 + body);
                        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(r).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

pub fn manifests(dir: &std::path::Path, pod: SocketAddr) {
    let yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {{name: sluice}}\nspec: {{controller: sluice.dev/ingress-controller}}\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {{name: svc, namespace: default}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-1, namespace: default, labels: {{kubernetes.io/service-name: svc}}}}\naddressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n\
apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: web, namespace: default}}\nspec:\n  ingressClassName: sluice\n  rules:\n  - host: app.test\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: svc, port: {{number: 80}}}}}}}}]}}\n  - host: ghost.test\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: nope, port: {{number: 80}}}}}}}}]}}\n",
        port = pod.port()
    );
    std::fs::write(dir.join("all.yaml"), yaml).unwrap();
}

pub fn lines_of(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Starts the `sluice` binary as `sluice serve --manifests DIR ARGS...` with the log level of its
/// defaults (no `RUST_LOG`), stderr piped, stdout as asked.
pub fn serve(manifests: &Path, args: &[String], stdout: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--manifests"])
        .arg(manifests)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `["--flag", "value", ...]` as owned strings.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}
