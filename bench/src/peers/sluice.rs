//! sluice itself: `sluice serve` on a manifest directory; every change is an atomic rewrite of
//! the EndpointSlice file, the same path a user of standalone mode takes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::{BACKLOG, CONNECT_TIMEOUT_S, HOST, PeerEnv, PeerError, Proc, Proto, State, TRIES};

/// A running sluice.
#[derive(Debug)]
pub struct Sluice {
    pub(super) manifests: PathBuf,
    /// Admin API address.
    pub admin: SocketAddr,
}

/// The IngressClass, Service and Ingress (with TLS when `tls`) for `host` → service `bench`.
pub fn base_manifests(host: &str, tls: bool) -> String {
    let mut s = String::from(
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: sluice\nspec:\n  controller: sluice.dev/ingress-controller\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: bench\n  namespace: default\nspec:\n  ports:\n  - name: http\n    port: 80\n---\n",
    );
    s.push_str("apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: bench\n  namespace: default\n");
    if tls {
        s.push_str("  annotations:\n    sluice.dev/ssl-redirect: \"false\"\n");
    }
    s.push_str("spec:\n  ingressClassName: sluice\n");
    if tls {
        let _ = write!(
            s,
            "  tls:\n  - hosts: [\"{host}\"]\n    secretName: bench-tls\n"
        );
    }
    let _ = write!(
        s,
        "  rules:\n  - host: \"{host}\"\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service:\n            name: bench\n            port:\n              number: 80\n"
    );
    s
}

/// A host that asks for client certificates (`auth-tls-verify-client: optional`, the bench
/// certificate as its CA), for the abuse scenario's `cert-subject` attack.
pub fn client_cert_manifests(ca_pem: &str) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let host = crate::load::cert_attack::MTLS_HOST;
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bench-ca\n  namespace: default\ntype: Opaque\nstringData:\n  ca.crt: |\n{}---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: mtls\n  namespace: default\n  annotations:\n    sluice.dev/ssl-redirect: \"false\"\n    nginx.ingress.kubernetes.io/auth-tls-secret: default/bench-ca\n    nginx.ingress.kubernetes.io/auth-tls-verify-client: optional\nspec:\n  ingressClassName: sluice\n  tls:\n  - hosts: [\"{host}\"]\n    secretName: bench-tls\n  rules:\n  - host: \"{host}\"\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service:\n            name: bench\n            port:\n              number: 80\n",
        indent(ca_pem)
    )
}

/// A `kubernetes.io/tls` Secret.
pub fn tls_secret(name: &str, cert_pem: &str, key_pem: &str) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(cert_pem),
        indent(key_pem)
    )
}

/// One EndpointSlice for service `svc` holding every address (ports may differ, so one slice
/// per port).
pub fn endpoint_slices(svc: &str, eps: &[SocketAddr]) -> String {
    let mut by_port: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for a in eps {
        by_port
            .entry(a.port())
            .or_default()
            .push(a.ip().to_string());
    }
    if by_port.is_empty() {
        // An empty slice keeps the service known with no endpoints.
        return format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-empty\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {svc}\naddressType: IPv4\nports:\n- name: http\n  port: 80\nendpoints: []\n"
        );
    }
    by_port
        .iter()
        .map(|(port, ips)| {
            let list = ips.iter().map(|ip| format!("- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n")).collect::<String>();
            format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-{port}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {svc}\naddressType: IPv4\nports:\n- name: http\n  port: {port}\nendpoints:\n{list}")
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Arguments for `sluice serve`.
pub fn serve_args(
    manifests: &Path,
    http: &str,
    https: &str,
    admin: SocketAddr,
    workers: (usize, bool),
    log_level: &str,
) -> Vec<String> {
    let mut args = vec![
        "serve".to_string(),
        "--manifests".to_string(),
        manifests.display().to_string(),
    ];
    args.extend(proxy_args(http, https, admin, workers, log_level));
    args
}

/// The listener, worker, logging and upstream flags every sluice peer runs with (the same
/// for `serve` and `controller`, so the two compare like with like).
pub fn proxy_args(
    http: &str,
    https: &str,
    admin: SocketAddr,
    (workers, http2): (usize, bool),
    log_level: &str,
) -> Vec<String> {
    [
        "--http-listen",
        http,
        "--https-listen",
        https,
        "--admin-listen",
        &admin.to_string(),
        "--workers",
        &workers.to_string(),
        "--log-level",
        log_level,
        "--http2",
        if http2 { "true" } else { "false" },
        "--upstream-tries",
        &TRIES.to_string(),
        "--upstream-connect-timeout-ms",
        &(CONNECT_TIMEOUT_S * 1000).to_string(),
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

pub(super) async fn start(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    eps: &[SocketAddr],
) -> Result<(Option<Proc>, State, BTreeMap<String, String>), PeerError> {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(|e| PeerError::Io("manifests".into(), e))?;
    let tls = env.proto == Proto::Https;
    super::write(&manifests.join("base.yaml"), &base_manifests(HOST, tls))?;
    if tls {
        super::write(
            &manifests.join("secret.yaml"),
            &tls_secret("bench-tls", &env.cert.cert_pem, &env.cert.key_pem),
        )?;
    }
    super::write(
        &manifests.join("endpoints.yaml"),
        &endpoint_slices("bench", eps),
    )?;
    if tls && env.client_cert_host {
        super::write(
            &manifests.join("mtls.yaml"),
            &client_cert_manifests(&env.cert.cert_pem),
        )?;
    }
    let admin = SocketAddr::from(([127, 0, 0, 1], super::free_port()?));
    let listen = format!("127.0.0.1:{port}");
    let other = format!("127.0.0.1:{}", super::free_port()?);
    let (http, https) = if tls {
        (other.as_str(), listen.as_str())
    } else {
        (listen.as_str(), "off")
    };
    let mut args = serve_args(
        &manifests,
        http,
        https,
        admin,
        (env.workers, env.http2),
        &env.sluice_log_level,
    );
    if let Some(n) = env.max_connections {
        args.push("--max-connections".into());
        args.push((n + 1_000).max(50_000).to_string());
    }
    args.extend(env.sluice_extra_args.iter().cloned());
    if env.handover {
        args.push("--handover".into());
        args.push(dir.join("handover.sock").display().to_string());
    }
    let proc = Proc::spawn(&env.sluice_bin, &args, dir, &[], env.cpus.as_deref())?;
    let mut s = BTreeMap::new();
    s.insert(
        "changes".into(),
        "EndpointSlice file rewritten atomically (write + rename); sluice watches the directory"
            .into(),
    );
    s.insert("retries".into(), format!("--upstream-tries {TRIES} (a connect error, or an idempotent request's connection breaking before any response byte, moves to another endpoint)"));
    s.insert(
        "balance".into(),
        "default (least request over round robin)".into(),
    );
    s.insert("backlog".into(), format!("{BACKLOG} (built in)"));
    s.insert("workers".into(), format!("--workers {}", env.workers));
    s.insert("timeouts".into(), format!("upstream connect {CONNECT_TIMEOUT_S}s, request 60s (default), client header 30s (default)"));
    s.insert(
        "upstream keep-alive".into(),
        "on (default), idle 60s".into(),
    );
    s.insert("http2".into(), format!("--http2 {}", env.http2));
    s.insert(
        "access log".into(),
        format!("none (--log-level {})", env.sluice_log_level),
    );
    Ok((Some(proc), State::Sluice(Sluice { manifests, admin }), s))
}

impl Sluice {
    pub(super) fn set(&mut self, eps: &[SocketAddr]) -> Result<(), PeerError> {
        super::write(
            &self.manifests.join("endpoints.yaml"),
            &endpoint_slices("bench", eps),
        )
    }

    /// Polls `/api/v1/upstreams` until the pool holds exactly `eps`.
    pub(super) async fn wait_applied(&self, eps: &[SocketAddr], within: Duration) -> bool {
        pool_holds(self.admin, eps, within).await
    }
}

/// Polls sluice's `/api/v1/upstreams` at `admin` until the `bench` Service's pools hold
/// exactly `eps` (draining endpoints aside; other Services' pools, such as the soak's
/// WebSocket pods, are not looked at).
pub async fn pool_holds(admin: SocketAddr, eps: &[SocketAddr], within: Duration) -> bool {
    let want: BTreeSet<String> = eps.iter().map(ToString::to_string).collect();
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Ok((200, body)) = super::admin_request(admin, "GET", "/api/v1/upstreams", "").await
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&body)
        {
            let have: BTreeSet<String> = v
                .as_array()
                .into_iter()
                .flatten()
                .filter(|pool| {
                    pool["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("default/bench:"))
                })
                .flat_map(|pool| pool["endpoints"].as_array().cloned().unwrap_or_default())
                .filter(|e| e["state"].as_str() != Some("draining"))
                .filter_map(|e| e["address"].as_str().map(str::to_string))
                .collect();
            if have == want {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}
