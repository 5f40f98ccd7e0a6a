//! sluice as it runs in a cluster: `sluice controller` watching a real kube-apiserver (embedded
//! etcd + `k8s.io/kubernetes`' kube-apiserver, built from Go modules by
//! `tests/kube-apiserver/build.sh`). Every change is an EndpointSlice written through the API
//! (server-side apply), so the controller's EndpointSlice fast path is what is measured: watch
//! delivery, decoding, the rebuild loop and the pool swap.
//!
//! The API server refuses loopback endpoint addresses, so `--source api` runs the whole
//! benchmark inside a network namespace of its own that has only `lo` with `198.18.0.0/24`
//! added (see [`enter_private_network`]); the backends listen on `198.18.0.1`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{HOST, PeerEnv, PeerError, Proc, Proto, State, TRIES};

/// Set in the re-executed benchmark, inside its network namespace.
pub const NETNS_ENV: &str = "SLUICE_BENCH_NETNS";
/// The address backends and the API server use inside the namespace.
pub const PRIVATE_IP: [u8; 4] = [198, 18, 0, 1];

/// Whether this process runs inside the namespace [`enter_private_network`] made.
pub fn in_private_network() -> bool {
    std::env::var_os(NETNS_ENV).is_some()
}

/// Runs this very command again inside a new network namespace (`unshare --net`, root only)
/// with `lo` up and `198.18.0.0/24` on it, and returns its exit status. Nothing in it can reach
/// anything outside the machine; the namespace ends with the process.
pub fn enter_private_network() -> Result<std::process::ExitStatus, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let ip = PRIVATE_IP.map(|o| o.to_string()).join(".");
    let script = format!("ip link set lo up && ip addr add {ip}/24 dev lo && exec \"$0\" \"$@\"");
    std::process::Command::new("unshare")
        .args(["--net", "--", "sh", "-c", &script])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(NETNS_ENV, "1")
        .status()
        .map_err(|e| format!("unshare (root and util-linux needed for --source api): {e}"))
}

/// The kube-apiserver built by `tests/kube-apiserver/build.sh`, next to the sluice binary's
/// `target/` directory.
pub fn default_apiserver(sluice_bin: &Path) -> PathBuf {
    sluice_bin
        .parent()
        .and_then(Path::parent)
        .map(|target| target.join("kube-apiserver/kube-apiserver"))
        .unwrap_or_default()
}

/// `None` when the peer can run here, else why not.
pub fn unavailable(env: &PeerEnv, controller: Controller) -> Option<String> {
    if controller == Controller::Traefik {
        if let Some(why) = super::traefik::unavailable(env) {
            return Some(why);
        }
    } else if !env.sluice_bin.exists() {
        return Some(format!(
            "sluice binary not found at {}",
            env.sluice_bin.display()
        ));
    }
    if !env.kube_apiserver.exists() {
        return Some(format!(
            "kube-apiserver not built at {} (tests/kube-apiserver/build.sh)",
            env.kube_apiserver.display()
        ));
    }
    (!in_private_network()).then(|| "runs only with --source api (in its network namespace)".into())
}

/// Which controller watches the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// `sluice controller`.
    Sluice,
    /// Traefik's Kubernetes Ingress provider.
    Traefik,
}

impl Controller {
    /// The IngressClass name and its `spec.controller`.
    fn class(self) -> (&'static str, &'static str) {
        match self {
            Controller::Sluice => ("sluice", "sluice.dev/ingress-controller"),
            Controller::Traefik => ("traefik", "traefik.io/ingress-controller"),
        }
    }
}

/// A running controller and its API server.
pub struct SluiceApi {
    server: Child,
    client: kube::Client,
    /// sluice's admin API, or Traefik's API.
    admin: SocketAddr,
    controller: Controller,
    slices: BTreeSet<String>,
}

impl std::fmt::Debug for SluiceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SluiceApi")
            .field("admin", &self.admin)
            .field("slices", &self.slices)
            .finish_non_exhaustive()
    }
}

fn resource(kind: &str) -> ApiResource {
    let (group, plural) = match kind {
        "Ingress" => ("networking.k8s.io", "ingresses"),
        "IngressClass" => ("networking.k8s.io", "ingressclasses"),
        "EndpointSlice" => ("discovery.k8s.io", "endpointslices"),
        "Service" => ("", "services"),
        _ => ("", "secrets"),
    };
    ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: if group.is_empty() {
            "v1".into()
        } else {
            format!("{group}/v1")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn apply(client: &kube::Client, obj: Value) -> Result<(), PeerError> {
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ar = resource(&kind);
    let api: Api<DynamicObject> = if kind == "IngressClass" {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), "default", &ar)
    };
    let o: DynamicObject =
        serde_json::from_value(obj).map_err(|e| PeerError::Change(format!("{kind}: {e}")))?;
    api.patch(
        &name,
        &PatchParams::apply("sluice-bench").force(),
        &Patch::Apply(&o),
    )
    .await
    .map(|_| ())
    .map_err(|e| PeerError::Change(format!("{kind} {name}: {e}")))
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"ports": [{"name": "http", "port": 80}]}})
}

fn ingress(name: &str, host: &str, svc: &str, tls: bool, controller: Controller) -> Value {
    let mut o = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"ingressClassName": controller.class().0, "rules": [{"host": host, "http": {"paths": [{
            "path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": svc, "port": {"number": 80}}}}]}}]}});
    o["metadata"]["annotations"] = match controller {
        Controller::Sluice => json!({"sluice.dev/ssl-redirect": "false"}),
        Controller::Traefik => json!({
            "traefik.ingress.kubernetes.io/router.middlewares": "retry@file",
            "traefik.ingress.kubernetes.io/router.entrypoints": "bench"}),
    };
    if tls {
        o["spec"]["tls"] = json!([{"hosts": [host], "secretName": "bench-tls"}]);
        if controller == Controller::Traefik {
            // Traefik loads the Secret from `spec.tls`, but serves the router over TLS only
            // when told so.
            o["metadata"]["annotations"]["traefik.ingress.kubernetes.io/router.tls"] =
                json!("true");
        }
    }
    o
}

/// One slice per port (ports may differ), named `{svc}-{port}`.
fn slices(svc: &str, eps: &[SocketAddr]) -> Vec<(String, Value)> {
    let mut by_port: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for a in eps {
        by_port
            .entry(a.port())
            .or_default()
            .push(a.ip().to_string());
    }
    by_port
        .into_iter()
        .map(|(port, ips)| {
            let name = format!("{svc}-{port}");
            let endpoints: Vec<Value> = ips
                .iter()
                .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
                .collect();
            let o = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": "default",
                    "labels": {"kubernetes.io/service-name": svc}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": port}],
                "endpoints": endpoints});
            (name, o)
        })
        .collect()
}

async fn start_server(
    env: &PeerEnv,
    dir: &Path,
) -> Result<(Child, kube::Client, String), PeerError> {
    let ip = PRIVATE_IP.map(|o| o.to_string()).join(".");
    let log = std::fs::File::create(dir.join("kube-apiserver.log"))
        .map_err(|e| PeerError::Io("kube-apiserver log".into(), e))?;
    let work = dir.join("apiserver");
    let mut server = Command::new(&env.kube_apiserver)
        .arg("--dir")
        .arg(&work)
        .args(["--address", &ip, "--port", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| PeerError::Io(env.kube_apiserver.display().to_string(), e))?;
    let stdout = server
        .stdout
        .take()
        .ok_or_else(|| PeerError::NotReady("kube-apiserver: no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(90), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = line.strip_prefix("READY ") {
                return Some(url.trim().to_string());
            }
        }
        None
    })
    .await;
    let Ok(Some(endpoint)) = ready else {
        let log = std::fs::read_to_string(dir.join("kube-apiserver.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        return Err(PeerError::NotReady(format!(
            "kube-apiserver did not get ready:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(work.join("kubeconfig"))
        .map_err(|e| PeerError::NotReady(format!("kubeconfig: {e}")))?;
    let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| PeerError::NotReady(format!("kubeconfig: {e}")))?;
    let client =
        kube::Client::try_from(cfg).map_err(|e| PeerError::NotReady(format!("client: {e}")))?;
    Ok((server, client, endpoint))
}

/// The objects for `ingresses` Ingresses: `bench` (the one the load goes to) and `ingresses - 1`
/// more, each with its own Service and a slice naming the first backend, written concurrently.
async fn populate(
    client: &kube::Client,
    env: &PeerEnv,
    eps: &[SocketAddr],
    (ingresses, controller): (usize, Controller),
) -> Result<(), PeerError> {
    let tls = env.proto == Proto::Https;
    let (class, implementation) = controller.class();
    apply(
        client,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": class}, "spec": {"controller": implementation}}),
    )
    .await?;
    if tls {
        apply(
            client,
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "bench-tls", "namespace": "default"},
                "type": "kubernetes.io/tls",
                "stringData": {"tls.crt": env.cert.cert_pem, "tls.key": env.cert.key_pem}}),
        )
        .await?;
    }
    let mut objects = vec![
        service("bench"),
        ingress("bench", HOST, "bench", tls, controller),
    ];
    objects.extend(slices("bench", eps).into_iter().map(|(_, o)| o));
    let first = eps.first().copied();
    for i in 1..ingresses {
        let svc = format!("svc-{i}");
        objects.push(service(&svc));
        objects.push(ingress(
            &format!("ing-{i}"),
            &format!("h{i}.{HOST}"),
            &svc,
            false,
            controller,
        ));
        objects.extend(slices(&svc, first.as_slice()).into_iter().map(|(_, o)| o));
    }
    let limit = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for o in objects {
        let (client, limit) = (client.clone(), Arc::clone(&limit));
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            apply(&client, o).await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| PeerError::Change(format!("writing objects: {e}")))??;
    }
    Ok(())
}

pub(super) async fn start(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    eps: &[SocketAddr],
    (ingresses, controller): (usize, Controller),
) -> Result<(Option<Proc>, State, BTreeMap<String, String>), PeerError> {
    let (server, client, endpoint) = start_server(env, dir).await?;
    let started = std::time::Instant::now();
    populate(&client, env, eps, (ingresses.max(1), controller)).await?;
    let populate_s = started.elapsed().as_secs_f64();
    if controller == Controller::Traefik {
        let work = dir.join("apiserver");
        let tokens = std::fs::read_to_string(work.join("tokens.csv"))
            .map_err(|e| PeerError::Io("tokens.csv".into(), e))?;
        let access = super::traefik::KubeAccess {
            endpoint,
            token: tokens.split(',').next().unwrap_or_default().to_string(),
            ca_file: work.join("certs/apiserver.crt"),
        };
        let (proc, api, mut s) = super::traefik::start_for_api(env, dir, port, &access)?;
        s.insert(
            "ingresses".into(),
            format!(
                "{} (each with its Service and EndpointSlice; written in {populate_s:.1} s)",
                ingresses.max(1)
            ),
        );
        let slices_written = slices("bench", eps).into_iter().map(|(n, _)| n).collect();
        return Ok((
            Some(proc),
            State::SluiceApi(Box::new(SluiceApi {
                server,
                client,
                admin: api,
                controller,
                slices: slices_written,
            })),
            s,
        ));
    }
    let admin = SocketAddr::from(([127, 0, 0, 1], super::free_port()?));
    let listen = format!("127.0.0.1:{port}");
    let other = format!("127.0.0.1:{}", super::free_port()?);
    let (http, https) = if env.proto == Proto::Https {
        (other.as_str(), listen.as_str())
    } else {
        (listen.as_str(), "off")
    };
    let mut args = vec!["controller".to_string()];
    args.extend(super::sluice::proxy_args(
        http,
        https,
        admin,
        (env.workers, env.http2),
        &env.sluice_log_level,
    ));
    args.extend([
        "--publish-status-address".to_string(),
        PRIVATE_IP.map(|o| o.to_string()).join("."),
        "--election-namespace".to_string(),
        "default".to_string(),
    ]);
    let kubeconfig = dir.join("apiserver/kubeconfig").display().to_string();
    let proc = Proc::spawn(
        &env.sluice_bin,
        &args,
        dir,
        &[("KUBECONFIG", kubeconfig)],
        env.cpus.as_deref(),
    )?;
    let mut s = BTreeMap::new();
    s.insert(
        "changes".into(),
        "EndpointSlice written through a real kube-apiserver (server-side apply); sluice controller watches it; a change counts from the API's acknowledgement".into(),
    );
    s.insert(
        "api server".into(),
        "kube-apiserver + embedded etcd from Go modules (tests/kube-apiserver), in the benchmark's network namespace".into(),
    );
    s.insert(
        "ingresses".into(),
        format!(
            "{} (each with its Service and EndpointSlice; written in {populate_s:.1} s)",
            ingresses.max(1)
        ),
    );
    s.insert("retries".into(), format!("--upstream-tries {TRIES}"));
    s.insert("workers".into(), format!("--workers {}", env.workers));
    s.insert("http2".into(), format!("--http2 {}", env.http2));
    let slices_written = slices("bench", eps).into_iter().map(|(n, _)| n).collect();
    Ok((
        Some(proc),
        State::SluiceApi(Box::new(SluiceApi {
            server,
            client,
            admin,
            controller,
            slices: slices_written,
        })),
        s,
    ))
}

impl SluiceApi {
    /// Writes the `bench` Service's slices and deletes the ones no longer needed; returns once
    /// the API server acknowledged every write.
    pub(super) async fn set(&mut self, eps: &[SocketAddr]) -> Result<(), PeerError> {
        let next = slices("bench", eps);
        let names: BTreeSet<String> = next.iter().map(|(n, _)| n.clone()).collect();
        for (_, o) in next {
            apply(&self.client, o).await?;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), "default", &resource("EndpointSlice"));
        for gone in self.slices.difference(&names) {
            api.delete(gone, &DeleteParams::default())
                .await
                .map_err(|e| PeerError::Change(format!("deleting {gone}: {e}")))?;
        }
        self.slices = names;
        Ok(())
    }

    /// Polls sluice's admin API (or Traefik's) until the pool holds exactly `eps`.
    pub(super) async fn wait_applied(&self, eps: &[SocketAddr], within: Duration) -> bool {
        match self.controller {
            Controller::Sluice => super::sluice::pool_holds(self.admin, eps, within).await,
            // Traefik names an Ingress backend namespace-service-port.
            Controller::Traefik => {
                super::traefik::wait_servers(self.admin, "default-bench-80@kubernetes", eps, within)
                    .await
            }
        }
    }

    /// Stops the API server (end of stdin, then a kill if it lingers).
    pub(super) async fn stop(mut self) {
        drop(self.server.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.server.wait())
            .await
            .is_err()
        {
            let _ = self.server.start_kill();
        }
    }
}
