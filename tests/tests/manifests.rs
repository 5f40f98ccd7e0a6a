//! The deployment manifests, checked without a cluster.
//!
//! Renders `manifests/base`, `manifests/kind`, `manifests/production` (and `manifests/`, which
//! must equal production) with `kubectl kustomize`, the Helm chart `manifests/helm/sluice` with
//! `helm template` (default values and variants), and the benchmark fixtures `manifests/bench`.
//! Every document is deserialized into its k8s-openapi type; a field that the type does not know
//! (a typo, a wrong indentation level) is caught by serializing the typed object again and looking
//! for keys of the original that did not survive. Then the invariants the controller relies on
//! are checked: host network, ports, probes, downward-API env, security context, drain deadline
//! against the grace period, the IngressClass controller name, and RBAC that grants exactly the
//! API calls the controller makes.
//!
//! kubectl is required in CI; where it (or helm) is missing, the affected test prints a note and
//! returns. Set `KUBECTL` or `HELM` to use a binary that is not on PATH.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Probe, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_config::translate::DEFAULT_CONTROLLER_NAME;

/// API calls the controller makes with cluster scope: (API group, resource, verbs).
const CLUSTER_CALLS: &[(&str, &str, &[&str])] = &[
    ("networking.k8s.io", "ingresses", &["get", "list", "watch"]),
    (
        "networking.k8s.io",
        "ingresses/status",
        &["update", "patch"],
    ),
    (
        "networking.k8s.io",
        "ingressclasses",
        &["get", "list", "watch"],
    ),
    ("", "services", &["get", "list", "watch"]),
    ("", "secrets", &["get", "list", "watch"]),
    ("", "configmaps", &["get", "list", "watch"]),
    (
        "discovery.k8s.io",
        "endpointslices",
        &["get", "list", "watch"],
    ),
    ("", "nodes", &["get", "list"]),
    ("", "pods", &["get", "list"]),
    ("", "events", &["create", "patch"]),
    ("events.k8s.io", "events", &["create", "patch"]),
    (
        "gateway.networking.k8s.io",
        "gatewayclasses",
        &["get", "list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "gateways",
        &["get", "list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "httproutes",
        &["get", "list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "grpcroutes",
        &["get", "list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "tlsroutes",
        &["get", "list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "referencegrants",
        &["get", "list", "watch"],
    ),
    (
        "gateway.networking.k8s.io",
        "gatewayclasses/status",
        &["patch"],
    ),
    ("gateway.networking.k8s.io", "gateways/status", &["patch"]),
    ("gateway.networking.k8s.io", "httproutes/status", &["patch"]),
    ("gateway.networking.k8s.io", "grpcroutes/status", &["patch"]),
    ("gateway.networking.k8s.io", "tlsroutes/status", &["patch"]),
    ("", "namespaces", &["get", "list", "watch"]),
];

/// API calls the controller makes in its own namespace only (leader election).
const NAMESPACE_CALLS: &[(&str, &str, &[&str])] = &[(
    "coordination.k8s.io",
    "leases",
    &["get", "create", "update", "patch"],
)];

/// Verbs that change state.
const WRITE_VERBS: &[&str] = &[
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "bind",
    "escalate",
    "impersonate",
];

/// The only resources the controller may write.
const WRITABLE_RESOURCES: &[&str] = &[
    "ingresses/status",
    "events",
    "leases",
    "gatewayclasses/status",
    "gateways/status",
    "httproutes/status",
    "grpcroutes/status",
    "tlsroutes/status",
];

const ADMIN_PORT: i32 = 10254;
const IMAGE_REPOSITORY: &str = "ghcr.io/sluice-dev/sluice";

// ---------------------------------------------------------------------------------------------
// Running the renderers.

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the first of `programs` that exists; `None` when none is installed.
fn run_any(programs: &[String], args: &[&str]) -> Option<Output> {
    for program in programs {
        match Command::new(program)
            .args(args)
            .current_dir(repo_root())
            .output()
        {
            Ok(output) => return Some(output),
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(err) => panic!("could not run `{program}`: {err}"),
        }
    }
    None
}

fn kubectl_programs() -> Vec<String> {
    match std::env::var("KUBECTL") {
        Ok(program) => vec![program],
        Err(_) => vec!["kubectl".to_owned()],
    }
}

fn helm_programs() -> Vec<String> {
    if let Ok(program) = std::env::var("HELM") {
        return vec![program];
    }
    let mut programs = vec!["helm".to_owned()];
    // `go install helm.sh/helm/v3/cmd/helm@...` puts it here, which may not be on PATH.
    if let Some(home) = std::env::var_os("HOME") {
        programs.push(
            Path::new(&home)
                .join("go/bin/helm")
                .to_string_lossy()
                .into_owned(),
        );
    }
    programs
}

/// Runs a renderer that must succeed and returns its stdout. The tests that call it are
/// ignored when `build.rs` did not find the tool, so a missing tool here is a failure.
fn render(tool: &str, programs: &[String], args: &[&str]) -> String {
    let output = run_any(programs, args)
        .unwrap_or_else(|| panic!("{tool} is not installed, but build.rs found it"));
    assert!(
        output.status.success(),
        "`{tool} {}` failed ({}):\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("renderer output is UTF-8")
}

fn kustomize(dir: &str) -> String {
    render("kubectl", &kubectl_programs(), &["kustomize", dir])
}

fn helm_template(sets: &[&str]) -> String {
    let mut args = vec![
        "template",
        "sluice",
        "manifests/helm/sluice",
        "--namespace",
        "sluice-system",
    ];
    for &set in sets {
        args.push("--set");
        args.push(set);
    }
    render("helm", &helm_programs(), &args)
}

// ---------------------------------------------------------------------------------------------
// Parsing, with unknown-field detection.

/// Every object of one render, by kind.
#[derive(Debug, Default)]
struct Rendered {
    source: String,
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    ingress_classes: Vec<IngressClass>,
    daemon_sets: Vec<DaemonSet>,
    config_maps: Vec<ConfigMap>,
    services: Vec<Service>,
    deployments: Vec<Deployment>,
    ingresses: Vec<Ingress>,
    jobs: Vec<Job>,
}

impl Rendered {
    /// How many objects of each kind (kinds with none left out).
    fn kinds(&self) -> BTreeMap<&'static str, usize> {
        let counts = [
            ("Namespace", self.namespaces.len()),
            ("ServiceAccount", self.service_accounts.len()),
            ("ClusterRole", self.cluster_roles.len()),
            ("ClusterRoleBinding", self.cluster_role_bindings.len()),
            ("Role", self.roles.len()),
            ("RoleBinding", self.role_bindings.len()),
            ("IngressClass", self.ingress_classes.len()),
            ("DaemonSet", self.daemon_sets.len()),
            ("ConfigMap", self.config_maps.len()),
            ("Service", self.services.len()),
            ("Deployment", self.deployments.len()),
            ("Ingress", self.ingresses.len()),
            ("Job", self.jobs.len()),
        ];
        counts.into_iter().filter(|(_, n)| *n > 0).collect()
    }

    fn assert_kinds(&self, expected: &[(&'static str, usize)]) {
        let expected: BTreeMap<&'static str, usize> = expected.iter().copied().collect();
        assert_eq!(
            self.kinds(),
            expected,
            "{}: unexpected set of objects",
            self.source
        );
    }
}

/// Splits a multi-document YAML stream into JSON values (empty documents dropped).
fn documents(source: &str, text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document)
            .unwrap_or_else(|err| panic!("{source}: YAML document {index} does not parse: {err}"));
        if !value.is_null() {
            docs.push(value);
        }
    }
    docs
}

/// Deserializes one document into `T` and fails on any field `T` does not know.
fn typed<T: DeserializeOwned + Serialize>(what: &str, original: &Value) -> T {
    let object: T = serde_json::from_value(original.clone())
        .unwrap_or_else(|err| panic!("{what}: does not deserialize: {err}"));
    let round_trip = serde_json::to_value(&object)
        .unwrap_or_else(|err| panic!("{what}: does not serialize again: {err}"));
    let unknown = sluice::serve::yaml::unknown_fields(original, &round_trip);
    assert!(
        unknown.is_empty(),
        "{what}: unknown field(s) {unknown:?} (not in the Kubernetes v1.33 schema)"
    );
    object
}

fn parse(source: &str, text: &str) -> Rendered {
    let mut rendered = Rendered {
        source: source.to_owned(),
        ..Rendered::default()
    };
    for (index, doc) in documents(source, text).iter().enumerate() {
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{source}: document {index} has no kind"));
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("<no name>");
        let what = format!("{source}: {kind} {name}");
        match kind {
            "Namespace" => rendered.namespaces.push(typed(&what, doc)),
            "ServiceAccount" => rendered.service_accounts.push(typed(&what, doc)),
            "ClusterRole" => rendered.cluster_roles.push(typed(&what, doc)),
            "ClusterRoleBinding" => rendered.cluster_role_bindings.push(typed(&what, doc)),
            "Role" => rendered.roles.push(typed(&what, doc)),
            "RoleBinding" => rendered.role_bindings.push(typed(&what, doc)),
            "IngressClass" => rendered.ingress_classes.push(typed(&what, doc)),
            "DaemonSet" => rendered.daemon_sets.push(typed(&what, doc)),
            "ConfigMap" => rendered.config_maps.push(typed(&what, doc)),
            "Service" => rendered.services.push(typed(&what, doc)),
            "Deployment" => rendered.deployments.push(typed(&what, doc)),
            "Ingress" => rendered.ingresses.push(typed(&what, doc)),
            "Job" => rendered.jobs.push(typed(&what, doc)),
            other => panic!(
                "{what}: kind {other} is not expected here (if it should be, teach this test its type)"
            ),
        }
    }
    rendered
}

// ---------------------------------------------------------------------------------------------
// Controller invariants.

fn daemon_set(r: &Rendered) -> &DaemonSet {
    assert_eq!(
        r.daemon_sets.len(),
        1,
        "{}: expected exactly one DaemonSet",
        r.source
    );
    &r.daemon_sets[0]
}

fn pod_spec<'a>(source: &str, ds: &'a DaemonSet) -> &'a PodSpec {
    ds.spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .unwrap_or_else(|| panic!("{source}: the DaemonSet has no pod spec"))
}

fn sluice_container<'a>(source: &str, pod: &'a PodSpec) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == "sluice")
        .unwrap_or_else(|| panic!("{source}: no container named sluice"))
}

fn args(container: &Container) -> &[String] {
    container.args.as_deref().unwrap_or(&[])
}

/// The value of `--name=value` in the arguments.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let prefix = format!("--{name}=");
    args.iter()
        .find_map(|arg| arg.strip_prefix(prefix.as_str()))
}

/// "0.0.0.0:80" -> ("0.0.0.0", 80).
fn split_listen(source: &str, addr: &str) -> (String, i32) {
    let (host, port) = addr
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{source}: listen address {addr:?} has no port"));
    let port = port
        .parse()
        .unwrap_or_else(|_| panic!("{source}: listen address {addr:?} has a bad port"));
    (host.to_owned(), port)
}

fn container_port(container: &Container, name: &str) -> Option<i32> {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}

fn check_probe(
    source: &str,
    which: &str,
    container: &Container,
    probe: Option<&Probe>,
    path: &str,
) {
    let http = probe
        .and_then(|p| p.http_get.as_ref())
        .unwrap_or_else(|| panic!("{source}: no httpGet {which} probe"));
    assert_eq!(
        http.path.as_deref(),
        Some(path),
        "{source}: {which} probe path"
    );
    let port = match &http.port {
        IntOrString::Int(port) => *port,
        IntOrString::String(name) => container_port(container, name)
            .unwrap_or_else(|| panic!("{source}: {which} probe names unknown port {name}")),
    };
    assert_eq!(
        port, ADMIN_PORT,
        "{source}: {which} probe must use the admin port"
    );
    assert!(
        http.scheme.as_deref().is_none_or(|s| s == "HTTP"),
        "{source}: {which} probe must be plain HTTP"
    );
}

/// With hostNetwork: a rolling update hands the listening sockets over. No container port
/// (each would be a host port the surge pod could not get), `--handover` in a hostPath
/// directory the sluice container mounts, and an init container that gives that directory to
/// uid 65532 with no capability but CHOWN.
fn check_handover(source: &str, pod: &PodSpec, container: &Container) {
    assert!(
        container.ports.as_ref().is_none_or(Vec::is_empty),
        "{source}: with hostNetwork, no container ports (they are host ports the surge pod of a rolling update could not get)"
    );
    let path =
        flag(args(container), "handover").unwrap_or_else(|| panic!("{source}: no --handover=PATH"));
    let dir = path
        .rsplit_once('/')
        .map(|(d, _)| d)
        .unwrap_or_else(|| panic!("{source}: --handover {path} is not in a directory"));
    let mounted = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == dir)
            .map(|m| m.name.clone())
    };
    let volume = mounted(container)
        .unwrap_or_else(|| panic!("{source}: nothing mounted at {dir}, where --handover lives"));
    let host_path = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume)
        .and_then(|v| v.host_path.as_ref())
        .unwrap_or_else(|| {
            panic!("{source}: volume {volume} must be a hostPath (old and new pod share it)")
        });
    assert_eq!(
        host_path.type_.as_deref(),
        Some("DirectoryOrCreate"),
        "{source}: the handover hostPath"
    );
    let init = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| args(c).first().map(String::as_str) == Some("prepare-handover"))
        .unwrap_or_else(|| panic!("{source}: no prepare-handover init container"));
    assert_eq!(
        args(init).get(1).map(String::as_str),
        Some(dir),
        "{source}: prepare-handover directory"
    );
    assert!(
        args(init).iter().any(|a| a == "--owner=65532:65532"),
        "{source}: prepare-handover --owner"
    );
    assert_eq!(
        mounted(init),
        Some(volume),
        "{source}: prepare-handover mounts it"
    );
    assert_eq!(
        init.image, container.image,
        "{source}: prepare-handover image"
    );
    let sc = init
        .security_context
        .as_ref()
        .unwrap_or_else(|| panic!("{source}: prepare-handover has no securityContext"));
    let caps = sc.capabilities.as_ref();
    let added: Vec<&str> = caps
        .and_then(|c| c.add.as_ref())
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    assert_eq!(
        added,
        ["CHOWN"],
        "{source}: prepare-handover capabilities.add"
    );
    assert!(
        caps.and_then(|c| c.drop.as_ref())
            .is_some_and(|d| d.iter().any(|c| c == "ALL")),
        "{source}: prepare-handover drops ALL"
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{source}: prepare-handover allowPrivilegeEscalation"
    );
}

/// Checks the DaemonSet, ServiceAccount, IngressClass and RBAC of one controller render.
fn check_controller(r: &Rendered, host_network: bool, metrics: bool) {
    let source = r.source.as_str();
    let ds = daemon_set(r);
    let namespace = ds
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_else(|| panic!("{source}: the DaemonSet has no namespace"));
    let pod = pod_spec(source, ds);
    let container = sluice_container(source, pod);
    let args = args(container);

    // The controller ConfigMap the flag names is part of the install, in the controller's
    // namespace (the Role grants ConfigMaps there only).
    let cm = flag(args, "configmap").unwrap_or_else(|| panic!("{source}: no --configmap"));
    assert!(
        r.config_maps.iter().any(|c| format!(
            "{}/{}",
            c.metadata.namespace.as_deref().unwrap_or_default(),
            c.metadata.name.as_deref().unwrap_or_default()
        ) == cm
            && cm.starts_with(&format!("{namespace}/"))),
        "{source}: --configmap {cm} is not a ConfigMap of this install in {namespace}"
    );

    // Network.
    if host_network {
        assert_eq!(pod.host_network, Some(true), "{source}: hostNetwork");
        assert_eq!(
            pod.dns_policy.as_deref(),
            Some("ClusterFirstWithHostNet"),
            "{source}: with hostNetwork, dnsPolicy must be ClusterFirstWithHostNet"
        );
    } else {
        assert_ne!(pod.host_network, Some(true), "{source}: hostNetwork");
    }

    // Arguments, listeners and ports.
    assert_eq!(
        args.first().map(String::as_str),
        Some("controller"),
        "{source}: first argument"
    );
    for (flag_name, port_name, port) in [
        ("http-listen", "http", 80),
        ("https-listen", "https", 443),
        ("admin-listen", "admin", ADMIN_PORT),
    ] {
        let addr = flag(args, flag_name)
            .unwrap_or_else(|| panic!("{source}: missing --{flag_name}=ADDR:PORT"));
        let (host, listen_port) = split_listen(source, addr);
        assert_eq!(listen_port, port, "{source}: --{flag_name} port");
        assert!(
            host == "0.0.0.0" || host == "[::]",
            "{source}: --{flag_name} must listen on all addresses (probes come from the kubelet), got {host}"
        );
        if !host_network {
            assert_eq!(
                container_port(container, port_name),
                Some(port),
                "{source}: containerPort {port_name}"
            );
        }
    }
    if host_network {
        check_handover(source, pod, container);
    }
    assert_eq!(
        flag(args, "log-format"),
        Some("json"),
        "{source}: --log-format"
    );

    // Image: a release tag, never latest.
    let image = container
        .image
        .as_deref()
        .unwrap_or_else(|| panic!("{source}: no image"));
    let tag = image
        .strip_prefix(IMAGE_REPOSITORY)
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{source}: image {image} is not {IMAGE_REPOSITORY}:TAG"));
    assert!(
        !tag.is_empty() && tag != "latest",
        "{source}: image tag {tag:?}"
    );

    // Probes on the admin port.
    check_probe(
        source,
        "readiness",
        container,
        container.readiness_probe.as_ref(),
        "/readyz",
    );
    check_probe(
        source,
        "liveness",
        container,
        container.liveness_probe.as_ref(),
        "/healthz",
    );

    // Downward API.
    for (name, field_path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("NODE_NAME", "spec.nodeName"),
    ] {
        let var = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{source}: env {name} missing"));
        let from = var
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(
            from,
            Some(field_path),
            "{source}: env {name} must come from fieldRef {field_path}"
        );
    }

    // Security context (container level, pod level as fallback where Kubernetes allows it).
    let sc = container
        .security_context
        .as_ref()
        .unwrap_or_else(|| panic!("{source}: container has no securityContext"));
    let psc = pod.security_context.as_ref();
    assert_eq!(
        sc.run_as_non_root
            .or_else(|| psc.and_then(|p| p.run_as_non_root)),
        Some(true),
        "{source}: runAsNonRoot"
    );
    assert_eq!(
        sc.run_as_user.or_else(|| psc.and_then(|p| p.run_as_user)),
        Some(65532),
        "{source}: runAsUser"
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{source}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{source}: readOnlyRootFilesystem"
    );
    assert_ne!(sc.privileged, Some(true), "{source}: privileged");
    let caps = sc
        .capabilities
        .as_ref()
        .unwrap_or_else(|| panic!("{source}: no capabilities"));
    let added: Vec<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(
        added,
        ["NET_BIND_SERVICE"],
        "{source}: capabilities.add must be exactly NET_BIND_SERVICE"
    );
    assert!(
        caps.drop.iter().flatten().any(|c| c == "ALL"),
        "{source}: capabilities.drop must contain ALL"
    );
    let seccomp = sc
        .seccomp_profile
        .as_ref()
        .or_else(|| psc.and_then(|p| p.seccomp_profile.as_ref()))
        .map(|s| s.type_.as_str());
    assert_eq!(seccomp, Some("RuntimeDefault"), "{source}: seccompProfile");

    // Resources.
    let resources = container
        .resources
        .as_ref()
        .unwrap_or_else(|| panic!("{source}: no resources"));
    let requests = resources.requests.as_ref();
    for name in ["cpu", "memory"] {
        assert!(
            requests.is_some_and(|r| r.contains_key(name)),
            "{source}: resources.requests.{name}"
        );
    }
    assert!(
        resources
            .limits
            .as_ref()
            .is_some_and(|l| l.contains_key("memory")),
        "{source}: resources.limits.memory"
    );

    // Drain deadline versus grace period.
    let shutdown: i64 = flag(args, "shutdown-timeout")
        .unwrap_or_else(|| panic!("{source}: missing --shutdown-timeout=SECONDS"))
        .parse()
        .unwrap_or_else(|_| {
            panic!("{source}: --shutdown-timeout is not a whole number of seconds")
        });
    let grace = pod
        .termination_grace_period_seconds
        .unwrap_or_else(|| panic!("{source}: terminationGracePeriodSeconds unset"));
    assert!(
        grace > shutdown,
        "{source}: terminationGracePeriodSeconds ({grace}) must exceed --shutdown-timeout ({shutdown})"
    );

    // Rolling update: the new pod surges beside the old one (it takes the sockets over).
    let strategy = ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .unwrap_or_else(|| panic!("{source}: no updateStrategy"));
    assert_eq!(
        strategy.type_.as_deref(),
        Some("RollingUpdate"),
        "{source}: updateStrategy.type"
    );
    let rolling = strategy
        .rolling_update
        .as_ref()
        .unwrap_or_else(|| panic!("{source}: no rollingUpdate"));
    assert_eq!(
        rolling.max_unavailable,
        Some(IntOrString::Int(0)),
        "{source}: maxUnavailable must be 0 (the old pod serves until the new one took over)"
    );
    assert_eq!(
        rolling.max_surge,
        Some(IntOrString::Int(1)),
        "{source}: maxSurge must be 1 (the new pod starts beside the old one)"
    );

    // Metrics annotations.
    let annotations = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    // With hostNetwork the admin port is on the node's address: /api/v1 stays on loopback, and
    // /metrics is exposed only when Prometheus is told to scrape it.
    let container_args = args;
    assert!(
        !container_args
            .iter()
            .any(|a| a.starts_with("--admin-expose") && a.contains("api")),
        "{source}: the admin API must not be exposed off the node"
    );
    assert_eq!(
        container_args.iter().any(|a| a == "--admin-expose=metrics"),
        metrics,
        "{source}: --admin-expose=metrics exactly when metrics are scraped"
    );
    if metrics {
        let admin_port = ADMIN_PORT.to_string();
        for (key, value) in [
            ("prometheus.io/scrape", "true"),
            ("prometheus.io/port", admin_port.as_str()),
            ("prometheus.io/path", "/metrics"),
        ] {
            assert_eq!(
                annotations.get(key).map(String::as_str),
                Some(value),
                "{source}: pod annotation {key}"
            );
        }
    } else {
        assert!(
            !annotations.keys().any(|k| k.starts_with("prometheus.io/")),
            "{source}: metrics disabled but scrape annotations present"
        );
    }

    // ServiceAccount.
    assert_eq!(
        r.service_accounts.len(),
        1,
        "{source}: expected one ServiceAccount"
    );
    let sa = &r.service_accounts[0];
    let sa_name = sa.metadata.name.as_deref().unwrap_or_default();
    assert_eq!(
        sa.metadata.namespace.as_deref(),
        Some(namespace),
        "{source}: ServiceAccount namespace"
    );
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some(sa_name),
        "{source}: serviceAccountName"
    );

    // IngressClass.
    assert_eq!(
        r.ingress_classes.len(),
        1,
        "{source}: expected one IngressClass"
    );
    let class = &r.ingress_classes[0];
    let controller = class.spec.as_ref().and_then(|s| s.controller.as_deref());
    assert_eq!(
        controller,
        Some(DEFAULT_CONTROLLER_NAME),
        "{source}: IngressClass spec.controller"
    );
    if let Some(name) = flag(args, "controller-name") {
        assert_eq!(
            Some(name),
            controller,
            "{source}: --controller-name and the IngressClass disagree"
        );
    }
    if let Some(name) = flag(args, "ingress-class") {
        assert_eq!(
            Some(name),
            class.metadata.name.as_deref(),
            "{source}: --ingress-class and the IngressClass disagree"
        );
    }

    check_rbac(r, sa_name, namespace);
}

type Grant = (String, String, String);

fn expected_grants(calls: &[(&str, &str, &[&str])]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for (group, resource, verbs) in calls {
        for verb in *verbs {
            out.insert((
                String::from(*group),
                String::from(*resource),
                String::from(*verb),
            ));
        }
    }
    out
}

fn grants(source: &str, owner: &str, rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules {
        assert!(
            rule.non_resource_urls.is_none(),
            "{source}: {owner} grants nonResourceURLs"
        );
        let groups = rule.api_groups.as_deref().unwrap_or(&[]);
        let resources = rule.resources.as_deref().unwrap_or(&[]);
        assert!(
            !groups.is_empty() && !resources.is_empty() && !rule.verbs.is_empty(),
            "{source}: {owner} has a rule without apiGroups, resources or verbs"
        );
        for group in groups {
            for resource in resources {
                for verb in &rule.verbs {
                    for part in [group, resource, verb] {
                        assert!(
                            !part.contains('*'),
                            "{source}: {owner} grants a wildcard ({group:?}, {resource:?}, {verb:?})"
                        );
                    }
                    out.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

fn assert_exact(source: &str, scope: &str, granted: &BTreeSet<Grant>, expected: &BTreeSet<Grant>) {
    let missing: Vec<&Grant> = expected.difference(granted).collect();
    assert!(
        missing.is_empty(),
        "{source}: {scope} RBAC does not allow these controller calls (group, resource, verb): {missing:?}"
    );
    let extra: Vec<&Grant> = granted.difference(expected).collect();
    assert!(
        extra.is_empty(),
        "{source}: {scope} RBAC grants more than the controller uses (group, resource, verb): {extra:?}"
    );
    for (group, resource, verb) in granted {
        if WRITE_VERBS.contains(&verb.as_str()) {
            assert!(
                WRITABLE_RESOURCES.contains(&resource.as_str()),
                "{source}: {scope} RBAC lets the controller {verb} {group}/{resource}"
            );
        }
        if resource == "secrets" {
            assert!(
                ["get", "list", "watch"].contains(&verb.as_str()),
                "{source}: Secrets must stay read-only, found verb {verb}"
            );
        }
    }
}

fn check_rbac(r: &Rendered, sa_name: &str, namespace: &str) {
    let source = r.source.as_str();
    let is_our_sa = |kind: &str, name: &str, ns: Option<&str>| {
        kind == "ServiceAccount" && name == sa_name && ns == Some(namespace)
    };

    // Cluster scope: every ClusterRole bound to the controller, every binding to a role here.
    let role_names: BTreeSet<&str> = r
        .cluster_roles
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    for binding in &r.cluster_role_bindings {
        assert!(
            binding.role_ref.kind == "ClusterRole"
                && role_names.contains(binding.role_ref.name.as_str()),
            "{source}: ClusterRoleBinding {:?} refers to {} {} that this install does not define",
            binding.metadata.name,
            binding.role_ref.kind,
            binding.role_ref.name
        );
        assert!(
            binding.subjects.iter().flatten().all(|s| is_our_sa(
                &s.kind,
                &s.name,
                s.namespace.as_deref()
            )),
            "{source}: ClusterRoleBinding {:?} binds something other than {namespace}/{sa_name}",
            binding.metadata.name
        );
    }
    let mut cluster_granted = BTreeSet::new();
    for role in &r.cluster_roles {
        let name = role.metadata.name.as_deref().unwrap_or_default();
        assert!(
            role.aggregation_rule.is_none(),
            "{source}: ClusterRole {name} aggregates other roles"
        );
        let bound = r.cluster_role_bindings.iter().any(|b| {
            b.role_ref.name == name
                && b.subjects
                    .iter()
                    .flatten()
                    .any(|s| is_our_sa(&s.kind, &s.name, s.namespace.as_deref()))
        });
        assert!(
            bound,
            "{source}: ClusterRole {name} is not bound to {namespace}/{sa_name}"
        );
        let rules = role.rules.as_deref().unwrap_or(&[]);
        cluster_granted.extend(grants(source, &format!("ClusterRole {name}"), rules));
    }
    assert_exact(
        source,
        "cluster",
        &cluster_granted,
        &expected_grants(CLUSTER_CALLS),
    );

    // Namespace scope: Roles and RoleBindings only in the controller's namespace.
    let role_names: BTreeSet<&str> = r
        .roles
        .iter()
        .filter_map(|role| role.metadata.name.as_deref())
        .collect();
    for binding in &r.role_bindings {
        assert_eq!(
            binding.metadata.namespace.as_deref(),
            Some(namespace),
            "{source}: RoleBinding {:?} outside the controller namespace",
            binding.metadata.name
        );
        assert!(
            binding.role_ref.kind == "Role" && role_names.contains(binding.role_ref.name.as_str()),
            "{source}: RoleBinding {:?} refers to {} {} that this install does not define",
            binding.metadata.name,
            binding.role_ref.kind,
            binding.role_ref.name
        );
        assert!(
            binding.subjects.iter().flatten().all(|s| is_our_sa(
                &s.kind,
                &s.name,
                s.namespace.as_deref()
            )),
            "{source}: RoleBinding {:?} binds something other than {namespace}/{sa_name}",
            binding.metadata.name
        );
    }
    let mut namespace_granted = BTreeSet::new();
    for role in &r.roles {
        let name = role.metadata.name.as_deref().unwrap_or_default();
        assert_eq!(
            role.metadata.namespace.as_deref(),
            Some(namespace),
            "{source}: Role {name} outside the controller namespace"
        );
        let bound = r.role_bindings.iter().any(|b| {
            b.role_ref.name == name
                && b.subjects
                    .iter()
                    .flatten()
                    .any(|s| is_our_sa(&s.kind, &s.name, s.namespace.as_deref()))
        });
        assert!(
            bound,
            "{source}: Role {name} is not bound to {namespace}/{sa_name}"
        );
        let rules = role.rules.as_deref().unwrap_or(&[]);
        namespace_granted.extend(grants(source, &format!("Role {name}"), rules));
    }
    assert_exact(
        source,
        "namespace",
        &namespace_granted,
        &expected_grants(NAMESPACE_CALLS),
    );
}

/// The kustomize renders create the namespace, labelled to admit hostNetwork pods.
fn check_namespace(r: &Rendered) {
    let source = r.source.as_str();
    let ds_namespace = daemon_set(r).metadata.namespace.as_deref();
    assert_eq!(ds_namespace, Some("sluice-system"), "{source}: namespace");
    assert_eq!(r.namespaces.len(), 1, "{source}: expected one Namespace");
    let ns = &r.namespaces[0];
    assert_eq!(
        ns.metadata.name.as_deref(),
        ds_namespace,
        "{source}: Namespace name"
    );
    let level = ns
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-security.kubernetes.io/enforce"))
        .map(String::as_str);
    assert_eq!(
        level,
        Some("privileged"),
        "{source}: hostNetwork needs the privileged Pod Security level"
    );
}

const KUSTOMIZE_KINDS: &[(&str, usize)] = &[
    ("Namespace", 1),
    ("ServiceAccount", 1),
    ("ClusterRole", 1),
    ("ClusterRoleBinding", 1),
    ("Role", 1),
    ("RoleBinding", 1),
    ("IngressClass", 1),
    ("DaemonSet", 1),
    ("ConfigMap", 1),
];

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed (set KUBECTL or put kubectl on PATH)"
)]
fn kustomize_base() {
    let text = kustomize("manifests/base");
    let r = parse("manifests/base", &text);
    r.assert_kinds(KUSTOMIZE_KINDS);
    check_controller(&r, true, true);
    check_namespace(&r);
    let pod = pod_spec(&r.source, daemon_set(&r));
    assert!(pod.node_selector.is_none(), "base: no nodeSelector");
    assert!(pod.tolerations.is_none(), "base: no tolerations");
    assert_eq!(
        pod.termination_grace_period_seconds,
        Some(40),
        "base: grace period"
    );
    let class = &r.ingress_classes[0];
    assert_eq!(
        class.metadata.name.as_deref(),
        Some("sluice"),
        "base: IngressClass name"
    );
    let container = sluice_container(&r.source, pod);
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/sluice-dev/sluice:0.1.0"),
        "base: image"
    );
    assert_eq!(
        args(container),
        [
            "controller",
            "--http-listen=0.0.0.0:80",
            "--https-listen=0.0.0.0:443",
            "--admin-listen=0.0.0.0:10254",
            "--admin-expose=metrics",
            "--shutdown-timeout=25",
            "--log-format=json",
            "--configmap=sluice-system/sluice",
            "--handover=/run/sluice/handover.sock",
        ],
        "base: arguments"
    );
}

#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed (set KUBECTL or put kubectl on PATH)"
)]
fn kustomize_kind_overlay() {
    let text = kustomize("manifests/kind");
    let r = parse("manifests/kind", &text);
    r.assert_kinds(KUSTOMIZE_KINDS);
    check_controller(&r, true, true);
    check_namespace(&r);
    let pod = pod_spec(&r.source, daemon_set(&r));
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get("ingress-ready"))
            .map(String::as_str),
        Some("true"),
        "kind: nodeSelector ingress-ready"
    );
    assert!(
        pod.tolerations.iter().flatten().any(|t| {
            t.key.as_deref() == Some("node-role.kubernetes.io/control-plane")
                && t.effect.as_deref() == Some("NoSchedule")
        }),
        "kind: toleration for the control-plane taint"
    );
}

#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed (set KUBECTL or put kubectl on PATH)"
)]
fn kustomize_production_overlay() {
    let text = kustomize("manifests/production");
    let r = parse("manifests/production", &text);
    r.assert_kinds(KUSTOMIZE_KINDS);
    check_controller(&r, true, true);
    check_namespace(&r);
    let pod = pod_spec(&r.source, daemon_set(&r));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical"),
        "production: priorityClassName"
    );
    assert!(pod.tolerations.is_none(), "production: no tolerations");

    // `kubectl apply -k manifests/` installs exactly the production overlay.
    let root = kustomize("manifests");
    assert_eq!(root, text, "manifests/ must render the production overlay");
}

#[test]
#[cfg_attr(
    any(no_helm, no_kubectl),
    ignore = "helm or kubectl is not installed (the chart is compared with the kustomize base)"
)]
fn helm_chart_default_values() {
    let text = helm_template(&[]);
    let r = parse("helm template (defaults)", &text);
    r.assert_kinds(&[
        ("ServiceAccount", 1),
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        ("Role", 1),
        ("RoleBinding", 1),
        ("IngressClass", 1),
        ("DaemonSet", 1),
        ("ConfigMap", 1),
    ]);
    check_controller(&r, true, true);
    let class = &r.ingress_classes[0];
    assert!(
        class
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("ingressclass.kubernetes.io/is-default-class")),
        "helm: not the default class unless asked"
    );

    // The chart runs the same command line as the kustomize base (plus explicit class flags).
    let base_text = kustomize("manifests/base");
    let base = parse("manifests/base", &base_text);
    let base_args = args(sluice_container(
        &base.source,
        pod_spec(&base.source, daemon_set(&base)),
    ));
    let helm_args = args(sluice_container(
        &r.source,
        pod_spec(&r.source, daemon_set(&r)),
    ));
    for arg in base_args {
        assert!(
            helm_args.contains(arg),
            "helm: argument {arg} of the base is missing from the chart"
        );
    }
}

#[test]
#[cfg_attr(
    no_helm,
    ignore = "helm is not installed (set HELM, or put helm on PATH or in ~/go/bin)"
)]
fn helm_chart_variants() {
    let text = helm_template(&[
        "hostNetwork=false",
        "service.type=LoadBalancer",
        "ingressClass.default=true",
        "metrics.enabled=false",
        "namespace.create=true",
        "extraArgs={--watch-namespace=apps}",
        "nodeSelector.role=edge",
    ]);
    let r = parse("helm template (variants)", &text);
    r.assert_kinds(&[
        ("Namespace", 1),
        ("ServiceAccount", 1),
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        ("Role", 1),
        ("RoleBinding", 1),
        ("IngressClass", 1),
        ("DaemonSet", 1),
        ("ConfigMap", 1),
        ("Service", 1),
    ]);
    check_controller(&r, false, false);
    let source = r.source.as_str();
    let ds = daemon_set(&r);
    let pod = pod_spec(source, ds);
    let container = sluice_container(source, pod);
    assert!(
        args(container)
            .iter()
            .any(|a| a == "--watch-namespace=apps"),
        "{source}: extraArgs"
    );
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get("role"))
            .map(String::as_str),
        Some("edge"),
        "{source}: nodeSelector"
    );
    let class = &r.ingress_classes[0];
    assert_eq!(
        class
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("ingressclass.kubernetes.io/is-default-class"))
            .map(String::as_str),
        Some("true"),
        "{source}: ingressClass.default"
    );

    // The Service fronts the DaemonSet's pods on named ports that exist.
    let service = &r.services[0];
    let spec = service
        .spec
        .as_ref()
        .unwrap_or_else(|| panic!("{source}: Service without spec"));
    assert_eq!(
        spec.type_.as_deref(),
        Some("LoadBalancer"),
        "{source}: service.type"
    );
    let pod_labels = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selector = spec.selector.clone().unwrap_or_default();
    assert!(
        !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "{source}: the Service selector {selector:?} does not select the pods {pod_labels:?}"
    );
    for port in spec.ports.iter().flatten() {
        if let Some(IntOrString::String(name)) = &port.target_port {
            assert!(
                container_port(container, name).is_some(),
                "{source}: Service targetPort {name} is not a container port"
            );
        }
    }
    let service_ports: BTreeSet<i32> = spec.ports.iter().flatten().map(|p| p.port).collect();
    assert_eq!(
        service_ports,
        BTreeSet::from([80, 443]),
        "{source}: Service ports"
    );
}

#[test]
#[cfg_attr(
    no_helm,
    ignore = "helm is not installed (set HELM, or put helm on PATH or in ~/go/bin)"
)]
fn helm_chart_refuses_latest_and_short_grace() {
    for sets in [
        ["--set", "image.tag=latest"],
        ["--set", "terminationGracePeriodSeconds=20"],
    ] {
        let mut args = vec!["template", "sluice", "manifests/helm/sluice"];
        args.extend(sets);
        let output = run_any(&helm_programs(), &args).expect("helm runs");
        assert!(
            !output.status.success(),
            "helm template with {sets:?} should fail"
        );
    }
}

#[test]
fn bench_load_job() {
    // The load Job template is read directly: it needs no renderer.
    let path = repo_root().join("manifests/bench/load-job.yaml");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let jobs = parse("manifests/bench/load-job.yaml", &text);
    jobs.assert_kinds(&[("Job", 1)]);
    let pod = jobs.jobs[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("the load Job has a pod spec");
    assert!(
        pod.host_aliases.iter().flatten().any(|h| h
            .hostnames
            .iter()
            .flatten()
            .any(|n| n == "bench.local")),
        "load Job: bench.local must resolve to the controller"
    );
    let load = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "load")
        .expect("load Job: init container `load`");
    for needed in [
        "load",
        "--url",
        "--rate",
        "--connections",
        "--duration",
        "--json",
    ] {
        assert!(
            args(load).iter().any(|a| a == needed),
            "load Job: argument {needed}"
        );
    }
}

#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed (set KUBECTL or put kubectl on PATH)"
)]
fn bench_kustomization() {
    let text = kustomize("manifests/bench");
    let r = parse("manifests/bench", &text);
    r.assert_kinds(&[
        ("Namespace", 1),
        ("ConfigMap", 1),
        ("Deployment", 1),
        ("Service", 1),
        ("Ingress", 5),
    ]);
    let page = r.config_maps[0]
        .data
        .as_ref()
        .and_then(|d| d.get("index.html"))
        .expect("bench: index.html");
    assert_eq!(page.len(), 1024, "bench: the backend page is 1 KiB");
    assert_eq!(
        r.deployments[0].spec.as_ref().and_then(|s| s.replicas),
        Some(5),
        "bench: 5 backend replicas"
    );
    let classes: BTreeSet<&str> = r
        .ingresses
        .iter()
        .filter_map(|i| i.spec.as_ref()?.ingress_class_name.as_deref())
        .collect();
    assert_eq!(
        classes,
        BTreeSet::from(["sluice", "nginx", "nginx-inc", "haproxy", "traefik"]),
        "bench: one Ingress per controller class"
    );
    for ingress in &r.ingresses {
        let spec = ingress.spec.as_ref().expect("bench: Ingress spec");
        assert!(
            spec.rules
                .iter()
                .flatten()
                .all(|rule| rule.host.as_deref() == Some("bench.local")),
            "bench: host bench.local"
        );
        assert!(
            spec.tls
                .iter()
                .flatten()
                .any(|t| t.secret_name.as_deref() == Some("bench-tls")),
            "bench: TLS from bench-tls"
        );
    }
    assert!(
        r.service_accounts.is_empty()
            && r.cluster_roles.is_empty()
            && r.cluster_role_bindings.is_empty()
            && r.roles.is_empty()
            && r.role_bindings.is_empty()
            && r.ingress_classes.is_empty()
            && r.daemon_sets.is_empty()
            && r.namespaces.len() == 1
            && r.services.len() == 1,
        "bench: fixtures only"
    );
}

#[test]
fn unknown_fields_are_caught() {
    // The detector itself: a misplaced field must be reported.
    let doc: Value = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "x", "namespace": "y", "lables": {"a": "b"}},
    });
    let sa: ServiceAccount = serde_json::from_value(doc.clone()).unwrap();
    let unknown = sluice::serve::yaml::unknown_fields(&doc, &serde_json::to_value(sa).unwrap());
    assert_eq!(unknown, ["metadata.lables"]);
}
