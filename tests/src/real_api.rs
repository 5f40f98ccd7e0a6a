//! A real kube-apiserver (embedded etcd + `k8s.io/kubernetes`' kube-apiserver as a library),
//! built from Go modules by `tests/kube-apiserver/build.sh` into
//! `target/kube-apiserver/kube-apiserver`, started as a child process for one test.
//!
//! The child prints `READY https://ADDR:PORT` once `/readyz` answers and has written a kubeconfig
//! for a static admin token into its work directory; it exits when its stdin closes, so a test
//! that panics or is killed leaves no server behind. Its log (and the audit log of every request,
//! which the tests read the way they read the fake's request log) stays in the work directory,
//! which is removed with the [`RealApi`].
//!
//! EndpointSlice validation refuses loopback addresses, so tests against this server run inside
//! a network namespace of their own ([`in_private_network`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::fake_api::Logged;

/// The first address of the private block the network namespace adds to `lo`.
pub const PRIVATE_NET: &str = "198.18.0";

/// Where `tests/kube-apiserver/build.sh` puts the server.
pub fn binary() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kube-apiserver/kube-apiserver")
}

/// Runs the test named `test` of the current test binary again inside a new network namespace
/// that has only `lo`, with `198.18.0.0/24` added to it: every address of that block is local
/// there and nothing else is reachable, so no packet of the test can leave the machine. The
/// namespace (made by `unshare --net`) goes away with the process; there is nothing to clean up.
///
/// Returns `true` in the child, where the caller runs the test body; in the parent it waits for
/// the child, fails the test if the child failed, and returns `false`.
pub fn in_private_network(test: &str) -> bool {
    if std::env::var_os("SLUICE_IN_NETNS").is_some() {
        return true;
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let script =
        format!("ip link set lo up && ip addr add {PRIVATE_NET}.1/24 dev lo && exec \"$0\" \"$@\"");
    let out = std::process::Command::new("unshare")
        .args(["--net", "--", "sh", "-c", &script])
        .arg(&exe)
        .args([
            test,
            "--exact",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env("SLUICE_IN_NETNS", "1")
        .output()
        .unwrap_or_else(|e| panic!("unshare: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Shown with --nocapture: what ran in the namespace.
    println!("--- {test} in a private network namespace ---\n{text}");
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test} in its network namespace failed ({}):\n{text}",
        out.status
    );
    false
}

/// A running kube-apiserver.
pub struct RealApi {
    /// The server process (replaced by [`RealApi::restart`]).
    child: tokio::sync::Mutex<Child>,
    dir: tempfile::TempDir,
    /// `https://ADDR:PORT`.
    pub url: String,
    admin: kube::Client,
    address: IpAddr,
    port: u16,
    /// The admin user's bearer token (the same across restarts).
    token: String,
}

impl std::fmt::Debug for RealApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealApi")
            .field("url", &self.url)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// Starts the server on `dir` and waits for its `READY` line; returns it and its URL.
/// `keep_cert`: a restart, reusing the serving certificate (so clients still trust it).
async fn spawn_server(
    dir: &Path,
    address: IpAddr,
    port: u16,
    token: &str,
    keep_cert: bool,
) -> (Child, String) {
    let bin = binary();
    assert!(
        bin.exists(),
        "{} is missing: run tests/kube-apiserver/build.sh",
        bin.display()
    );
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("apiserver.log"))
        .unwrap_or_else(|e| panic!("log file: {e}"));
    // Every request at Metadata level: the tests' request log, and the proof of no 403.
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
    )
    .unwrap_or_else(|e| panic!("audit policy: {e}"));
    let audit_log = dir.join("audit.log");
    let mut child = Command::new(&bin)
        .arg("--dir")
        .arg(dir.join("work"))
        .args([
            "--address",
            &address.to_string(),
            "--port",
            &port.to_string(),
        ])
        .args(["--token", token])
        .arg(format!("--keep-serving-cert={keep_cert}"))
        .arg("--")
        .arg(format!("--audit-policy-file={}", policy.display()))
        .arg(format!("--audit-log-path={}", audit_log.display()))
        .args(["--audit-log-mode=blocking", "--audit-log-format=json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let stdout = child.stdout.take().unwrap_or_else(|| unreachable!());
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = line.strip_prefix("READY ") {
                return Some(url.to_string());
            }
        }
        None
    })
    .await;
    match ready {
        Ok(Some(url)) => (child, url),
        _ => panic!(
            "kube-apiserver did not get ready; its log:\n{}",
            tail(&dir.join("apiserver.log"))
        ),
    }
}

impl RealApi {
    /// Starts a server on `address` (a free port) and waits until it is ready.
    pub async fn start(address: IpAddr) -> Self {
        sluice_proxy::crypto::install_default_provider();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let token: String = (0..24)
            .map(|_| format!("{:02x}", fastrand::u8(..)))
            .collect();
        let (child, url) = spawn_server(dir.path(), address, 0, &token, false).await;
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {url}"));
        let admin = client_from(&dir.path().join("work/kubeconfig"), None).await;
        Self {
            child: tokio::sync::Mutex::new(child),
            dir,
            url,
            admin,
            address,
            port,
            token,
        }
    }

    /// Kills the server (SIGKILL: no graceful shutdown, watches cut mid-stream), keeps it down
    /// for `down`, and starts it again on the same etcd data, address, port, token and serving
    /// certificate; returns once it is ready again.
    pub async fn restart(&self, down: Duration) {
        let mut child = self.child.lock().await;
        let _ = child.start_kill();
        let _ = child.wait().await;
        tokio::time::sleep(down).await;
        let (next, url) =
            spawn_server(self.dir.path(), self.address, self.port, &self.token, true).await;
        assert_eq!(url, self.url, "restarted on the same address");
        *child = next;
    }

    /// The admin (system:masters) client.
    pub fn admin(&self) -> kube::Client {
        self.admin.clone()
    }

    /// A client that authenticates as a ServiceAccount, with a token from the TokenRequest API.
    pub async fn client_as(&self, namespace: &str, account: &str) -> kube::Client {
        let req = http::Request::post(format!(
            "/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        ))
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(&json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600}
            }))
            .unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("token request: {e}"));
        let answer: Value = self
            .admin
            .request(req)
            .await
            .unwrap_or_else(|e| panic!("token for {namespace}/{account}: {e}"));
        let token = answer["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {answer}"))
            .to_string();
        client_from(&self.dir.path().join("work/kubeconfig"), Some(&token)).await
    }

    /// Creates or updates an object (server-side apply, as `kubectl apply --server-side`).
    pub async fn apply(&self, obj: Value) {
        let (api, name) = self.api_for(&obj);
        let dynamic: DynamicObject =
            serde_json::from_value(obj.clone()).unwrap_or_else(|e| panic!("{e}: {obj}"));
        api.patch(
            &name,
            &PatchParams::apply("sluice-tests").force(),
            &Patch::Apply(&dynamic),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {obj}: {e}"));
    }

    /// Deletes an object; `false` when it was not there.
    pub async fn delete(&self, kind: &str, ns: &str, name: &str) -> bool {
        let api = self.api(kind, ns);
        api.delete(name, &DeleteParams::default()).await.is_ok()
    }

    /// An object as JSON.
    pub async fn get(&self, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let api = self.api(kind, ns);
        let o = api.get_opt(name).await.ok()??;
        serde_json::to_value(o).ok()
    }

    /// Every object of a kind, in every namespace.
    pub async fn list(&self, kind: &str) -> Vec<Value> {
        let ar = resource(kind);
        let api: Api<DynamicObject> = Api::all_with(self.admin.clone(), &ar);
        api.list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|o| serde_json::to_value(o).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The requests the server has answered, from its audit log, in the fake's shape (the
    /// `query` holds the whole request URI's query string; `user` and `code` are extra).
    pub fn requests(&self) -> Vec<Audited> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .map(|e| {
                let uri = e["requestURI"].as_str().unwrap_or_default();
                let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
                Audited {
                    request: Logged {
                        method: verb_to_method(e["verb"].as_str().unwrap_or_default()),
                        path: path.to_string(),
                        query: query.to_string(),
                        body: String::new(),
                    },
                    user: e["user"]["username"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    code: e["responseStatus"]["code"].as_u64().unwrap_or(0),
                }
            })
            .collect()
    }

    /// Stops the server in its tracks (SIGSTOP): connections stay open and nothing answers,
    /// as when an API server hangs or its node is partitioned away.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self
            .child
            .try_lock()
            .ok()
            .and_then(|c| c.id())
            .unwrap_or_else(|| panic!("kube-apiserver exited or restarting"));
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// The last lines of the server's log (for failure messages).
    pub fn log_tail(&self) -> String {
        tail(&self.dir.path().join("apiserver.log"))
    }

    fn api(&self, kind: &str, ns: &str) -> Api<DynamicObject> {
        let ar = resource(kind);
        if namespaced(kind) {
            Api::namespaced_with(self.admin.clone(), ns, &ar)
        } else {
            Api::all_with(self.admin.clone(), &ar)
        }
    }

    fn api_for(&self, obj: &Value) -> (Api<DynamicObject>, String) {
        let kind = obj["kind"].as_str().unwrap_or_default();
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        (self.api(kind, ns), name.to_string())
    }
}

impl Drop for RealApi {
    fn drop(&mut self) {
        // Closing stdin asks the server to stop; the kill is for one that does not.
        let child = self.child.get_mut();
        drop(child.stdin.take());
        let _ = child.start_kill();
    }
}

/// One request from the audit log.
#[derive(Debug, Clone)]
pub struct Audited {
    /// Method, path and query, as the fake logs them.
    pub request: Logged,
    /// Who made it.
    pub user: String,
    /// The status the server answered.
    pub code: u64,
}

fn verb_to_method(verb: &str) -> String {
    match verb {
        "get" | "list" | "watch" => "GET",
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        other => other,
    }
    .to_string()
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

async fn client_from(kubeconfig: &Path, token: Option<&str>) -> kube::Client {
    let mut kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    if let Some(token) = token {
        for a in &mut kc.auth_infos {
            if let Some(info) = a.auth_info.as_mut() {
                info.token = Some(token.to_string().into());
            }
        }
    }
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    kube::Client::try_from(cfg).unwrap_or_else(|e| panic!("client: {e}"))
}

fn namespaced(kind: &str) -> bool {
    !matches!(
        kind,
        "IngressClass"
            | "Namespace"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "Node"
            | "CustomResourceDefinition"
            | "GatewayClass"
    )
}

/// The API resource of a kind the tests use (no discovery round trip).
pub fn resource(kind: &str) -> ApiResource {
    let (group, version, plural) = match kind {
        "Ingress" => ("networking.k8s.io", "v1", "ingresses"),
        "IngressClass" => ("networking.k8s.io", "v1", "ingressclasses"),
        "Service" => ("", "v1", "services"),
        "Secret" => ("", "v1", "secrets"),
        "ConfigMap" => ("", "v1", "configmaps"),
        "Namespace" => ("", "v1", "namespaces"),
        "ServiceAccount" => ("", "v1", "serviceaccounts"),
        "Event" => ("", "v1", "events"),
        "Node" => ("", "v1", "nodes"),
        "EndpointSlice" => ("discovery.k8s.io", "v1", "endpointslices"),
        "Lease" => ("coordination.k8s.io", "v1", "leases"),
        "ClusterRole" => ("rbac.authorization.k8s.io", "v1", "clusterroles"),
        "ClusterRoleBinding" => ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"),
        "Role" => ("rbac.authorization.k8s.io", "v1", "roles"),
        "RoleBinding" => ("rbac.authorization.k8s.io", "v1", "rolebindings"),
        "CustomResourceDefinition" => ("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
        "GatewayClass" => ("gateway.networking.k8s.io", "v1", "gatewayclasses"),
        "Gateway" => ("gateway.networking.k8s.io", "v1", "gateways"),
        "HTTPRoute" => ("gateway.networking.k8s.io", "v1", "httproutes"),
        "ReferenceGrant" => ("gateway.networking.k8s.io", "v1beta1", "referencegrants"),
        other => panic!("no API resource known for kind {other}"),
    };
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}
