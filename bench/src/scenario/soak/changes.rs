//! The soak's configuration changes, the way a standalone user makes them: files in sluice's
//! manifest directory rewritten atomically. In turn, every few seconds: the Ingress under load
//! (a new `proxy-read-timeout`), its TLS Secret (a new key and certificate: a rotation) and the
//! controller ConfigMap; each is then watched until sluice shows it in effect.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::certs::{self, KeyKind};
use crate::peers::sluice::{base_manifests, tls_secret};
use crate::peers::{HOST, admin_request};
use crate::report::soak::ChangeCounts;

/// The ConfigMap `sluice serve` is started with (`--configmap`).
pub const CONFIGMAP: &str = "default/sluice-soak";

/// How long a change may take to show before it is reported as not applied.
const APPLIED_WITHIN: Duration = Duration::from_secs(5);

/// The names the bench certificate covers (as `sluice-bench` generates it at start).
pub const CERT_NAMES: [&str; 4] = ["bench.local", "*.bench.local", "localhost", "127.0.0.1"];

/// The Ingress under load with `proxy-read-timeout` set to `seconds`.
pub fn ingress(seconds: u32) -> String {
    base_manifests(HOST, true).replacen(
        "    sluice.dev/ssl-redirect: \"false\"\n",
        &format!(
            "    sluice.dev/ssl-redirect: \"false\"\n    nginx.ingress.kubernetes.io/proxy-read-timeout: \"{seconds}\"\n"
        ),
        1,
    )
}

/// The controller ConfigMap, `k`-th version.
pub fn configmap(k: u32) -> String {
    let (ns, name) = CONFIGMAP.split_once('/').unwrap_or(("default", CONFIGMAP));
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  proxy-read-timeout: \"{}\"\n  keep-alive-requests: \"{}\"\n",
        60 + k % 5,
        100_000 + k
    )
}

/// A Service `ws` with its EndpointSlice and an Ingress sending `/ws` on the bench host to it
/// (the WebSocket sessions' own pods, which the churn leaves alone).
pub fn websocket_route(eps: &[SocketAddr]) -> String {
    let service = "apiVersion: v1\nkind: Service\nmetadata:\n  name: ws\n  namespace: default\nspec:\n  ports:\n  - name: http\n    port: 80\n---\n";
    let ingress = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: ws\n  namespace: default\nspec:\n  ingressClassName: sluice\n  rules:\n  - host: \"{HOST}\"\n    http:\n      paths:\n      - path: /ws\n        pathType: Prefix\n        backend:\n          service:\n            name: ws\n            port:\n              number: 80\n---\n"
    );
    format!(
        "{service}{ingress}{}",
        crate::peers::sluice::endpoint_slices("ws", eps)
    )
}

fn write(path: &Path, content: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

async fn json(admin: SocketAddr, path: &str) -> Option<serde_json::Value> {
    match admin_request(admin, "GET", path, "").await {
        Ok((200, body)) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

/// The snapshot generation sluice reports.
pub async fn generation(admin: SocketAddr) -> Option<u64> {
    json(admin, "/api/v1/status").await?["generation"].as_u64()
}

/// The serial of the certificate served for the bench host.
async fn serial(admin: SocketAddr) -> Option<String> {
    let v = json(admin, "/api/v1/certificates").await?;
    v.as_array()?
        .iter()
        .find(|c| c["host"].as_str() == Some(HOST))?["serial"]
        .as_str()
        .map(str::to_string)
}

async fn until<F, Fut>(mut done: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < APPLIED_WITHIN {
        if done().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Where and how the changes are made.
#[derive(Debug, Clone)]
pub struct Changer {
    /// sluice's manifest directory.
    pub dir: PathBuf,
    /// Its admin address.
    pub admin: SocketAddr,
    /// Key type of the rotated certificates.
    pub key: KeyKind,
    /// Time between two changes.
    pub every: Duration,
}

impl Changer {
    /// Makes a change every `every` from `t0` until `end`, in turn Ingress, Secret, ConfigMap;
    /// returns the counts and the changes that did not show within 5 s.
    pub async fn run(&self, t0: Instant, end: Instant) -> (ChangeCounts, Vec<String>) {
        let mut c = ChangeCounts::default();
        let mut notes = Vec::new();
        let mut k: u32 = 0;
        let mut next = t0 + self.every;
        while next + APPLIED_WITHIN < end {
            sleep_until(next).await;
            next += self.every;
            let at = t0.elapsed().as_secs_f64();
            let result = match k % 3 {
                0 => {
                    c.ingress += 1;
                    self.generation_change("base.yaml", &ingress(60 + (k / 3) % 5), &mut c)
                        .await
                }
                1 => {
                    c.secret += 1;
                    self.rotate(&mut c).await
                }
                _ => {
                    c.configmap += 1;
                    self.generation_change("configmap.yaml", &configmap(k), &mut c)
                        .await
                }
            };
            if let Err(e) = result {
                notes.push(format!("{at:.1} s: {e}"));
            }
            k += 1;
        }
        (c, notes)
    }

    async fn generation_change(
        &self,
        file: &str,
        content: &str,
        c: &mut ChangeCounts,
    ) -> Result<(), String> {
        let before = generation(self.admin)
            .await
            .ok_or("the admin API did not answer")?;
        write(&self.dir.join(file), content)?;
        let admin = self.admin;
        let took = until(|| async move { generation(admin).await.is_some_and(|g| g > before) })
            .await
            .ok_or(format!("{file}: not applied within 5 s"))?;
        c.applied += 1;
        c.slowest_apply_ms = c.slowest_apply_ms.max(took.as_secs_f64() * 1000.0);
        Ok(())
    }

    async fn rotate(&self, c: &mut ChangeCounts) -> Result<(), String> {
        let before = serial(self.admin).await;
        let cert =
            certs::generate(self.key, &CERT_NAMES).map_err(|e| format!("certificate: {e}"))?;
        write(
            &self.dir.join("secret.yaml"),
            &tls_secret("bench-tls", &cert.cert_pem, &cert.key_pem),
        )?;
        let admin = self.admin;
        let before = &before;
        until(|| async move {
            serial(admin)
                .await
                .is_some_and(|s| Some(&s) != before.as_ref())
        })
        .await
        .ok_or("secret.yaml: the new certificate was not served within 5 s")?;
        c.rotations_seen += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documents_carry_the_change() {
        let i = ingress(63);
        assert!(i.contains("proxy-read-timeout: \"63\""), "{i}");
        assert!(i.contains("secretName: bench-tls"), "{i}");
        let m = configmap(7);
        assert!(
            m.contains("name: sluice-soak") && m.contains("\"62\"") && m.contains("100007"),
            "{m}"
        );
        let w = websocket_route(&["127.0.0.1:4000".parse().unwrap_or_else(|_| unreachable!())]);
        assert!(w.contains("path: /ws") && w.contains("port: 4000"), "{w}");
    }
}
