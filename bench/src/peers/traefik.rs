//! Traefik v3 (built from Go modules by `bench/peers/traefik/build.sh`): its file provider with
//! `watch`, one dynamic-configuration file rewritten (written aside and renamed into place) for
//! each change — Traefik's own no-reload path, the head-to-head that matters most, since like
//! sluice it never reloads. When a change took effect is read from its API
//! (`/api/http/services/backend@file`), as sluice's is from its admin API.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    CLIENT_IDLE_S, CONNECT_TIMEOUT_S, PeerEnv, PeerError, Proc, Proto, READ_TIMEOUT_S, State,
    TRIES, UPSTREAM_KEEPALIVE,
};

/// How long Traefik waits for more provider events before applying one (its default is 2 s;
/// the file provider then takes 0.5–2 s to apply a change, which would measure the setting,
/// not the proxy).
const THROTTLE: &str = "100ms";

/// A running Traefik.
#[derive(Debug)]
pub struct Traefik {
    dir: PathBuf,
    api: SocketAddr,
    /// TLS, and HTTP/2 on it.
    tls: (bool, bool),
}

/// Where the Traefik binary is: `SLUICE_BENCH_TRAEFIK`, else `target/traefik/traefik` beside
/// the sluice binary's `target/` (where `build.sh` puts it), else `traefik` on the `PATH`.
pub fn binary(env: &PeerEnv) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_BENCH_TRAEFIK") {
        return Some(PathBuf::from(p));
    }
    let built = env
        .sluice_bin
        .parent()
        .and_then(Path::parent)
        .map(|target| target.join("traefik").join("traefik"));
    built
        .filter(|p| p.exists())
        .or_else(|| crate::sys::which("traefik"))
}

pub(super) fn unavailable(env: &PeerEnv) -> Option<String> {
    binary(env).is_none().then(|| {
        "traefik not built (bench/install-peers.sh --with-traefik, or bench/peers/traefik/build.sh)"
            .into()
    })
}

/// How Traefik reaches the Kubernetes API server (controller mode).
#[derive(Debug, Clone)]
pub struct KubeAccess {
    /// `https://ADDR:PORT`.
    pub endpoint: String,
    /// A bearer token.
    pub token: String,
    /// The CA that signed the server's certificate.
    pub ca_file: PathBuf,
}

/// The static configuration: one entry point for the load, one for the API, the file
/// provider (and in controller mode the Kubernetes Ingress provider), and upstream keep-alive
/// and timeouts as the other peers have them.
fn static_config(dir: &Path, port: u16, api: SocketAddr, kube: Option<&KubeAccess>) -> String {
    let file = format!("filename: {}/dynamic.yml", dir.display());
    static_config_with(dir, (port, api), kube, &file)
}

/// [`static_config`] with the file provider's source given (`filename: F` or `directory: D`).
fn static_config_with(
    dir: &Path,
    (port, api): (u16, SocketAddr),
    kube: Option<&KubeAccess>,
    file: &str,
) -> String {
    let d = dir.display();
    // `SLUICE_BENCH_TRAEFIK_LOG=DEBUG` to see what it does (kept in the run's logs/).
    let level = std::env::var("SLUICE_BENCH_TRAEFIK_LOG").unwrap_or_else(|_| "ERROR".into());
    let ingress = kube.map_or(String::new(), |k| {
        format!(
            "  kubernetesIngress:\n    endpoint: \"{}\"\n    token: \"{}\"\n    certAuthFilePath: {}\n    ingressClass: traefik\n",
            k.endpoint,
            k.token,
            k.ca_file.display()
        )
    });
    format!(
        "global:\n  checkNewVersion: false\n  sendAnonymousUsage: false\n\
         log:\n  level: {level}\n  filePath: {d}/traefik.log\n\
         entryPoints:\n  bench:\n    address: \"127.0.0.1:{port}\"\n    transport:\n      \
         respondingTimeouts:\n        readTimeout: 0s\n        idleTimeout: {CLIENT_IDLE_S}s\n      \
         lifeCycle:\n        graceTimeOut: 1s\n  traefik:\n    address: \"{api}\"\n\
         api:\n  insecure: true\n  dashboard: false\n\
         providers:\n  providersThrottleDuration: {THROTTLE}\n{ingress}  file:\n    {file}\n    watch: true\n\
         serversTransport:\n  maxIdleConnsPerHost: {UPSTREAM_KEEPALIVE}\n  forwardingTimeouts:\n    \
         dialTimeout: {CONNECT_TIMEOUT_S}s\n    responseHeaderTimeout: {READ_TIMEOUT_S}s\n    idleConnTimeout: 60s\n"
    )
}

/// The dynamic configuration: the retry middleware and the TLS options the other peers have;
/// with `eps` (file mode) also one router for every path, the backends and the certificate (in
/// controller mode the Ingress provides those, and the certificate comes from its Secret).
fn dynamic_config(dir: &Path, (tls, http2): (bool, bool), eps: Option<&[SocketAddr]>) -> String {
    let d = dir.display();
    let mut s = String::from("http:\n");
    if eps.is_some() {
        s.push_str(
            "  routers:\n    bench:\n      entryPoints: [bench]\n      rule: \"PathPrefix(`/`)\"\n      service: backend\n      middlewares: [retry]\n",
        );
        if tls {
            s.push_str("      tls: {}\n");
        }
    }
    let _ = write!(
        s,
        "  middlewares:\n    retry:\n      retry:\n        attempts: {TRIES}\n"
    );
    if let Some(eps) = eps {
        s.push_str("  services:\n    backend:\n      loadBalancer:\n        passHostHeader: true\n        servers:\n");
        for a in eps {
            let _ = writeln!(s, "        - url: \"http://{a}\"");
        }
    }
    if tls {
        s.push_str("tls:\n");
        if eps.is_some() {
            let _ = write!(
                s,
                "  certificates:\n    - certFile: {d}/cert.pem\n      keyFile: {d}/key.pem\n  \
                 stores:\n    default:\n      defaultCertificate:\n        certFile: {d}/cert.pem\n        keyFile: {d}/key.pem\n"
            );
        }
        let alpn = if http2 {
            "[h2, http/1.1]"
        } else {
            "[http/1.1]"
        };
        let _ = write!(
            s,
            "  options:\n    default:\n      minVersion: VersionTLS12\n      cipherSuites:\n        \
             - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n        - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n        \
             - TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384\n        - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\n      \
             alpnProtocols: {alpn}\n"
        );
    }
    s
}

/// The settings reported for Traefik.
pub fn settings(workers: usize, http2: bool) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    s.insert("changes".into(), format!("file provider with watch: dynamic.yml written aside and renamed into place; providersThrottleDuration {THROTTLE} (default 2s)"));
    s.insert(
        "retries".into(),
        format!("retry middleware, attempts {TRIES} (Traefik does not retry by default)"),
    );
    s.insert("balance".into(), "weighted round robin (default)".into());
    s.insert(
        "backlog".into(),
        "not configurable: Go uses net.core.somaxconn".into(),
    );
    s.insert("workers".into(), format!("GOMAXPROCS={workers}"));
    s.insert("timeouts".into(), format!("dial {CONNECT_TIMEOUT_S}s, response header {READ_TIMEOUT_S}s, client idle {CLIENT_IDLE_S}s, client read none"));
    s.insert(
        "upstream keep-alive".into(),
        format!("on, maxIdleConnsPerHost {UPSTREAM_KEEPALIVE}, idle 60s"),
    );
    s.insert(
        "proxy headers".into(),
        "X-Forwarded-For/Proto/Host/Port/Server and X-Real-Ip (its own); no X-Request-ID (Traefik has none)".into(),
    );
    s.insert(
        "http2".into(),
        if http2 {
            "ALPN h2, http/1.1".into()
        } else {
            "off (tls options alpnProtocols [http/1.1])".into()
        },
    );
    s.insert(
        "tls".into(),
        "TLS 1.2+ (suites ECDHE-RSA-AES256-GCM-SHA384, ECDHE-RSA-AES128-GCM-SHA256 and their ECDHE-ECDSA twins), certificate from file".into(),
    );
    s.insert("access log".into(), "off (default)".into());
    s
}

pub(super) async fn start(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    eps: &[SocketAddr],
) -> Result<(Option<Proc>, State, BTreeMap<String, String>), PeerError> {
    let bin = binary(env).ok_or_else(|| PeerError::NotReady("traefik not built".into()))?;
    super::write(&dir.join("cert.pem"), &env.cert.cert_pem)?;
    super::write(&dir.join("key.pem"), &env.cert.key_pem)?;
    let api = SocketAddr::from(([127, 0, 0, 1], super::free_port()?));
    let tls = (env.proto == Proto::Https, env.http2);
    super::write(
        &dir.join("dynamic.yml"),
        &dynamic_config(dir, tls, Some(eps)),
    )?;
    let (proc, version) = spawn(env, &bin, dir, port, api, None)?;
    let state = State::Traefik(Traefik {
        dir: dir.to_path_buf(),
        api,
        tls,
    });
    let mut s = settings(env.workers, env.http2);
    if let Some(v) = version {
        s.insert("version".into(), format!("traefik {v}"));
    }
    Ok((Some(proc), state, s))
}

/// Writes the static configuration and starts Traefik; returns it and its version.
fn spawn(
    env: &PeerEnv,
    bin: &Path,
    dir: &Path,
    port: u16,
    api: SocketAddr,
    kube: Option<&KubeAccess>,
) -> Result<(Proc, Option<String>), PeerError> {
    let proc = launch(env, bin, dir, &static_config(dir, port, api, kube))?;
    Ok((proc, version(bin)))
}

/// Writes `config` as `dir/traefik.yml` and starts Traefik on it, pinned and with
/// `GOMAXPROCS` like the other peers (and `HOME` in `dir`, so no user configuration is read).
fn launch(env: &PeerEnv, bin: &Path, dir: &Path, config: &str) -> Result<Proc, PeerError> {
    let file = dir.join("traefik.yml");
    super::write(&file, config)?;
    let envs = [
        ("GOMAXPROCS", env.workers.to_string()),
        ("HOME", dir.display().to_string()),
    ];
    let args = vec![format!("--configFile={}", file.display())];
    Ok(Proc::spawn(bin, &args, dir, &envs, env.cpus.as_deref())?)
}

/// What `traefik version` says its version is.
fn version(bin: &Path) -> Option<String> {
    let out = std::process::Command::new(bin)
        .arg("version")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        l.trim()
            .strip_prefix("Version:")
            .map(|v| v.trim().to_string())
    })
}

/// Starts Traefik for the scale scenario: plain HTTP on `port`, its file provider watching the
/// directory `dir/dynamic` (one large file for every Ingress but the first, one small file for
/// the first, which each change rewrites).
pub fn spawn_for_scale(env: &PeerEnv, dir: &Path, port: u16) -> Result<Proc, String> {
    let bin = binary(env).ok_or("traefik not built")?;
    let api = SocketAddr::from((
        [127, 0, 0, 1],
        super::free_port().map_err(|e| e.to_string())?,
    ));
    let file = format!("directory: {}/dynamic", dir.display());
    let config = static_config_with(dir, (port, api), None, &file);
    launch(env, &bin, dir, &config).map_err(|e| e.to_string())
}

/// One router (`Host(host)`) and its service with `eps`, as dynamic-configuration YAML lines
/// (under `http:`'s `routers:` and `services:`), for the scale scenario's files.
pub fn scale_route(name: &str, host: &str, eps: &[SocketAddr]) -> (String, String) {
    let router = format!(
        "    {name}:\n      entryPoints: [bench]\n      rule: \"Host(`{host}`)\"\n      service: {name}\n"
    );
    let mut service = format!("    {name}:\n      loadBalancer:\n        servers:\n");
    for a in eps {
        let _ = writeln!(service, "          - url: \"http://{a}\"");
    }
    (router, service)
}

/// Starts Traefik in controller mode: its Kubernetes Ingress provider watching the API server
/// `kube` names (Ingresses of class `traefik`), the retry middleware and TLS options from a
/// file. Returns the process, its API address and the settings to report.
pub(super) fn start_for_api(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    kube: &KubeAccess,
) -> Result<(Proc, SocketAddr, BTreeMap<String, String>), PeerError> {
    let bin = binary(env).ok_or_else(|| PeerError::NotReady("traefik not built".into()))?;
    let api = SocketAddr::from(([127, 0, 0, 1], super::free_port()?));
    let tls = (env.proto == Proto::Https, env.http2);
    super::write(&dir.join("dynamic.yml"), &dynamic_config(dir, tls, None))?;
    let (proc, version) = spawn(env, &bin, dir, port, api, Some(kube))?;
    let mut s = settings(env.workers, env.http2);
    s.insert(
        "changes".into(),
        format!("EndpointSlice written through a real kube-apiserver (server-side apply); Traefik's Kubernetes Ingress provider watches it; providersThrottleDuration {THROTTLE}; a change counts from the API's acknowledgement"),
    );
    s.insert(
        "retries".into(),
        format!("retry middleware (attempts {TRIES}) from a file, on the Ingress by the router.middlewares annotation"),
    );
    if let Some(v) = version {
        s.insert("version".into(), format!("traefik {v}"));
    }
    Ok((proc, api, s))
}

/// The backend URLs Traefik's API at `api` reports for `service`, if it answers.
async fn servers_of(api: SocketAddr, service: &str) -> Option<BTreeSet<String>> {
    let (status, body) =
        super::admin_request(api, "GET", &format!("/api/http/services/{service}"), "")
            .await
            .ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let servers = v.pointer("/loadBalancer/servers")?.as_array()?;
    Some(
        servers
            .iter()
            .filter_map(|s| s.get("url")?.as_str().map(str::to_string))
            .collect(),
    )
}

/// Waits (up to `within`) until Traefik's API at `api` reports exactly `eps` for `service`.
pub(super) async fn wait_servers(
    api: SocketAddr,
    service: &str,
    eps: &[SocketAddr],
    within: Duration,
) -> bool {
    let want: BTreeSet<String> = eps.iter().map(|a| format!("http://{a}")).collect();
    let until = tokio::time::Instant::now() + within;
    loop {
        if servers_of(api, service).await.as_ref() == Some(&want) {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Traefik {
    pub(super) fn set(&mut self, eps: &[SocketAddr]) -> Result<(), PeerError> {
        super::write(
            &self.dir.join("dynamic.yml"),
            &dynamic_config(&self.dir, self.tls, Some(eps)),
        )
    }

    /// Waits until the API reports exactly `eps`.
    pub(super) async fn wait_applied(&self, eps: &[SocketAddr], within: Duration) -> bool {
        wait_servers(self.api, "backend@file", eps, within).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dynamic_file_lists_every_backend_and_tls_only_when_asked() {
        let eps: Vec<SocketAddr> = vec![
            "127.0.0.1:9001"
                .parse()
                .unwrap_or(SocketAddr::from(([0; 4], 0))),
            "127.0.0.1:9002"
                .parse()
                .unwrap_or(SocketAddr::from(([0; 4], 0))),
        ];
        let plain = dynamic_config(Path::new("/d"), (false, false), Some(&eps));
        assert!(plain.contains("- url: \"http://127.0.0.1:9001\"\n"));
        assert!(plain.contains("- url: \"http://127.0.0.1:9002\"\n"));
        assert!(!plain.contains("tls"));
        let tls = dynamic_config(Path::new("/d"), (true, true), Some(&eps));
        assert!(tls.contains("      tls: {}\n") && tls.contains("alpnProtocols: [h2, http/1.1]"));
        assert!(tls.contains("certFile: /d/cert.pem"));
        // Controller mode: the Ingress provides routers, services and the certificate.
        let ctl = dynamic_config(Path::new("/d"), (true, false), None);
        assert!(ctl.contains("retry:") && ctl.contains("alpnProtocols: [http/1.1]"));
        assert!(!ctl.contains("routers") && !ctl.contains("servers") && !ctl.contains("certFile"));
    }
}
