//! Command-line interface. Every flag can also come from an environment variable
//! `SLUICE_<FLAG>` (upper case, dashes as underscores), which suits Kubernetes manifests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// sluice: a Kubernetes Ingress controller whose data plane never reloads.
///
/// Routes, upstream endpoints and certificates are swapped in memory, so pods coming and going
/// never cost a failed request.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Modes.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run standalone from Kubernetes YAML files (no cluster needed).
    ///
    /// Reads Ingress, IngressClass, Service, EndpointSlice and Secret objects from the given files
    /// or directories, watches them, and applies every change without a restart. A file that
    /// fails to parse is reported and its last good objects stay in force.
    ///
    /// Example: sluice serve --manifests examples/ --http-listen 127.0.0.1:8080
    Serve(ServeArgs),
    /// Run in a Kubernetes cluster (in-cluster config, or KUBECONFIG).
    Controller(ControllerArgs),
    /// Report what sluice does with each annotation of your Ingresses (migration check).
    ///
    /// Per Ingress and annotation: honoured, differs (how), unsupported, refused, fails
    /// closed, or invalid (why). Exits 1 when any annotation in use is not honoured (differs
    /// is allowed), 2 when the input cannot be read.
    ///
    /// Example: sluice check manifests/ ; sluice check --cluster --format json
    Check(crate::check::CheckArgs),
    /// Make the directory `--handover` sockets live in, owned by the user sluice runs as.
    ///
    /// For an init container: a hostPath directory is created by the kubelet as root, where
    /// sluice (uid 65532) cannot create its socket. Creates DIR, gives it to --owner and
    /// makes it owner-only (0700). Needs root or CAP_CHOWN.
    ///
    /// Example: sluice prepare-handover /run/sluice --owner 65532:65532
    PrepareHandover(PrepareHandoverArgs),
}

/// `sluice prepare-handover`.
#[derive(Debug, Clone, Args)]
pub struct PrepareHandoverArgs {
    /// The directory.
    pub dir: std::path::PathBuf,
    /// `UID:GID` to own it.
    #[arg(long, default_value = "65532:65532")]
    pub owner: String,
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What the admin listener serves to peers that are not on loopback.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum AdminExpose {
    /// `/metrics` (for an in-cluster Prometheus).
    Metrics,
    /// `/api/v1/*` and the operator's page `/` (pod IPs, hosts, certificate serials: keep it
    /// on loopback unless needed).
    Api,
}

/// Who may add routes to a host.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum HostOwnershipArg {
    /// Rules for a host merge across namespaces (the Ingress API's semantics).
    Shared,
    /// The namespace of the oldest Ingress that names a host keeps it; other namespaces'
    /// rules and certificates for it are ignored with a Warning Event.
    Namespace,
}

/// Balancing policy.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Balance {
    /// Two candidates (the next in round-robin order and a random one); fewer requests in
    /// flight wins, ties go round robin: every pod gets traffic at low load, slow pods less
    /// under load.
    LeastRequest,
    /// Power of two random choices over peak-EWMA latency and in-flight requests.
    Ewma,
    /// Round robin.
    RoundRobin,
}

/// A list of CIDR blocks from one flag value.
#[derive(Debug, Clone, Default)]
pub struct CidrList(pub Vec<sluice_config::Cidr>);

fn parse_cidrs(v: &str) -> Result<CidrList, String> {
    sluice_config::Cidr::parse_list(v)
        .map(CidrList)
        .map_err(|e| e.to_string())
}

fn parse_auth_url_allow(v: &str) -> Result<sluice_config::route_policy::AuthUrlAllow, String> {
    sluice_config::route_policy::AuthUrlAllow::parse(v)
}

fn parse_hash_key(v: &str) -> Result<sluice_config::HashKey, String> {
    sluice_config::HashKey::parse(v)
}

/// Flags shared by `serve` and `controller`.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Plain-HTTP listen address (default 0.0.0.0:80 for controller, 127.0.0.1:8080 for serve);
    /// "off" disables it.
    #[arg(long, env = "SLUICE_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// HTTPS listen address (default 0.0.0.0:443 for controller, 127.0.0.1:8443 for serve);
    /// "off" disables it.
    #[arg(long, env = "SLUICE_HTTPS_LISTEN")]
    pub https_listen: Option<String>,
    /// Admin listen address: the operator's page (/), /healthz, /readyz, /metrics and the JSON
    /// API (/api/v1/status, upstreams, routes, traffic, certificates, changes).
    #[arg(long, env = "SLUICE_ADMIN_LISTEN", default_value = "127.0.0.1:10254")]
    pub admin_listen: SocketAddr,
    /// Worker threads (default: available cores).
    #[arg(long, env = "SLUICE_WORKERS")]
    pub workers: Option<usize>,
    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "sluice=debug".
    #[arg(long, env = "SLUICE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// IngressClass `spec.controller` value this instance owns.
    #[arg(long, env = "SLUICE_CONTROLLER_NAME", default_value = sluice_config::translate::DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,
    /// Class name matched against the legacy `kubernetes.io/ingress.class` annotation.
    #[arg(long, env = "SLUICE_INGRESS_CLASS", default_value = sluice_config::translate::DEFAULT_INGRESS_CLASS)]
    pub ingress_class: String,
    /// Only Ingresses in this namespace.
    #[arg(long, env = "SLUICE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Secret `NAMESPACE/NAME` whose certificate is served for unknown or missing SNI.
    #[arg(long, env = "SLUICE_DEFAULT_SSL_CERTIFICATE")]
    pub default_ssl_certificate: Option<String>,
    /// The controller ConfigMap `NAMESPACE/NAME`, in ingress-nginx's keys (watched; in `serve`
    /// mode a ConfigMap among the manifests). Its values override the flags; an Ingress's
    /// annotations override it.
    #[arg(long, env = "SLUICE_CONFIGMAP")]
    pub configmap: Option<String>,
    /// Whether a host's rules merge across namespaces (`shared`, the Ingress API) or belong to
    /// the first namespace that claimed the host (`namespace`, for clusters shared by teams).
    #[arg(long, env = "SLUICE_HOST_OWNERSHIP", value_enum, default_value_t = HostOwnershipArg::Shared)]
    pub host_ownership: HostOwnershipArg,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, env = "SLUICE_SHUTDOWN_TIMEOUT", default_value_t = 25)]
    pub shutdown_timeout: u64,
    /// A unix socket through which a new sluice takes this one's listening sockets over
    /// (the very sockets: no connection refused or reset), then tells it to drain; this one
    /// took them from the process serving there, if any. Old and new must see the same path
    /// (a hostPath directory in the DaemonSet).
    #[arg(long, env = "SLUICE_HANDOVER")]
    pub handover: Option<std::path::PathBuf>,
    /// Most client connections open at once.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = 50_000)]
    pub max_connections: usize,
    /// Seconds allowed to receive a request head.
    #[arg(long, env = "SLUICE_HEADER_READ_TIMEOUT", default_value_t = 30)]
    pub header_read_timeout: u64,
    /// Largest request head in bytes (larger gets 431).
    #[arg(long, env = "SLUICE_MAX_HEADER_SIZE", default_value_t = 65_536)]
    pub max_header_size: usize,
    /// Largest request body in bytes (larger gets 413).
    #[arg(long, env = "SLUICE_MAX_BODY_SIZE", default_value_t = 64 * 1024 * 1024)]
    pub max_body_size: u64,
    /// Seconds to wait for an upstream response head (504 after).
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT", default_value_t = 60)]
    pub request_timeout: u64,
    /// Milliseconds allowed to connect to an upstream endpoint.
    #[arg(
        long,
        env = "SLUICE_UPSTREAM_CONNECT_TIMEOUT_MS",
        default_value_t = 2000
    )]
    pub upstream_connect_timeout_ms: u64,
    /// Seconds an upstream may send nothing while its response body is streamed (the
    /// client's response is then cut off and its connection closed).
    #[arg(long, env = "SLUICE_UPSTREAM_READ_TIMEOUT", default_value_t = 60)]
    pub upstream_read_timeout: u64,
    /// Seconds an idle upstream connection is kept.
    #[arg(long, env = "SLUICE_UPSTREAM_IDLE_TIMEOUT", default_value_t = 60)]
    pub upstream_idle_timeout: u64,
    /// Endpoints tried per request when connecting fails.
    #[arg(long, env = "SLUICE_UPSTREAM_TRIES", default_value_t = 3)]
    pub upstream_tries: u32,
    /// PEM CA bundle to verify HTTPS upstreams (verification is off without it).
    #[arg(long, env = "SLUICE_UPSTREAM_CA_FILE")]
    pub upstream_ca_file: Option<PathBuf>,
    /// Access log on stdout, one line per request with ingress-nginx's fields (JSON with
    /// --log-format json). Off by default.
    #[arg(long, env = "SLUICE_ACCESS_LOG", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub access_log: bool,
    /// Seconds of silence (no bytes either way) after which an HTTP/2, h2c or hyper-served
    /// HTTP/1 client connection is closed (nginx keepalive_timeout: 75).
    #[arg(long, env = "SLUICE_CLIENT_IDLE_TIMEOUT", default_value_t = 75)]
    pub client_idle_timeout: u64,
    /// Seconds a write to a client may stay blocked (the client not reading) before its
    /// connection is closed (nginx send_timeout: 60).
    #[arg(long, env = "SLUICE_CLIENT_SEND_TIMEOUT", default_value_t = 60)]
    pub client_send_timeout: u64,
    /// Seconds of silence after which a WebSocket or other upgraded tunnel is closed
    /// (ingress-nginx proxy-read-timeout: 60).
    #[arg(long, env = "SLUICE_TUNNEL_IDLE_TIMEOUT", default_value_t = 60)]
    pub tunnel_idle_timeout: u64,
    /// `Upgrade` protocols tunnelled to backends (comma-separated); any other offer (`h2c`
    /// first of all) is dropped and the request forwarded as a plain one.
    #[arg(
        long,
        env = "SLUICE_ALLOWED_UPGRADES",
        value_delimiter = ',',
        default_value = "websocket"
    )]
    pub allowed_upgrades: Vec<String>,
    /// Status answered to a request over an Ingress's `limit-rps`, `limit-rpm` or
    /// `limit-connections` (ingress-nginx's `limit-req-status-code`; 429 is the other common
    /// choice).
    #[arg(long, env = "SLUICE_LIMIT_REQ_STATUS_CODE", default_value_t = 503, value_parser = clap::value_parser!(u16).range(400..600))]
    pub limit_req_status_code: u16,
    /// What the admin listener serves to peers that are not on loopback, comma-separated
    /// (`metrics`, `api`). `/healthz` and `/readyz` answer everyone; the rest answers loopback
    /// only by default (with hostNetwork the admin port is open on the node's address).
    #[arg(long, env = "SLUICE_ADMIN_EXPOSE", value_enum, value_delimiter = ',')]
    pub admin_expose: Vec<AdminExpose>,
    /// Peers whose X-Forwarded-For, X-Real-IP and Forwarded headers are believed (comma-separated
    /// CIDR blocks, e.g. the L4 load balancer in front of sluice). From any other client those
    /// headers are replaced with the address sluice saw. Empty (the default): nobody.
    #[arg(long, env = "SLUICE_TRUSTED_PROXIES", value_parser = parse_cidrs, default_value = "")]
    pub trusted_proxies: CidrList,
    /// Hosts outside the cluster an `auth-url` may call (comma-separated): names
    /// (`auth.example.com`, `*.example.com`), whatever they resolve to, and address blocks
    /// (`192.0.2.0/24`), which an IP literal must be in and every address of an unlisted name
    /// must resolve into at each call. Empty (the default): an `auth-url` naming a host sluice
    /// does not route answers 500, and sluice sends no request to an address no one chose.
    #[arg(long, env = "SLUICE_AUTH_URL_ALLOW", value_parser = parse_auth_url_allow, default_value = "")]
    pub auth_url_allow: sluice_config::route_policy::AuthUrlAllow,
    /// Every connection to the HTTP and HTTPS listeners starts with a PROXY protocol header
    /// (v1 or v2) from an L4 load balancer, naming the client; connections without one are
    /// closed (ingress-nginx: use-proxy-protocol). Only for listeners every client reaches
    /// through that balancer.
    #[arg(long, env = "SLUICE_PROXY_PROTOCOL", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub proxy_protocol: bool,
    /// Act on the `ssl-passthrough` annotation: the HTTPS listener reads each ClientHello and
    /// sends the connections of passthrough hosts to their backend untouched (the backend's
    /// certificate reaches the client). Off, the annotation is reported and ignored.
    #[arg(long, env = "SLUICE_ENABLE_SSL_PASSTHROUGH", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_ssl_passthrough: bool,
    /// Balancing policy of every pool (an Ingress may choose its own with the `load-balance`
    /// annotation).
    #[arg(long, env = "SLUICE_BALANCE", value_enum, default_value_t = Balance::LeastRequest)]
    pub balance: Balance,
    /// Consistent hashing for every pool, on an nginx variable: `$remote_addr`,
    /// `$request_uri`, `$http_<header>` or `$cookie_<name>` (overrides --balance; an Ingress
    /// may choose its own with `upstream-hash-by`).
    #[arg(long, env = "SLUICE_UPSTREAM_HASH_BY", value_parser = parse_hash_key)]
    pub upstream_hash_by: Option<sluice_config::HashKey>,
    /// Most requests in flight (for HTTP/1 upstreams: connections) to one endpoint; 0 for no
    /// limit (nginx's max_conns). An Ingress may set its pools' own with
    /// `sluice.dev/upstream-max-connections`. A request that finds every endpoint at its limit
    /// is answered 503.
    #[arg(long, env = "SLUICE_UPSTREAM_MAX_CONNECTIONS", default_value_t = 0)]
    pub upstream_max_connections: u32,
    /// Serve HTTP/1.1 on sluice's own fast reader where it can (the default); `false` has
    /// hyper serve every connection. A diagnostic switch (the differential test compares the
    /// two), not a tuning knob.
    #[arg(long, env = "SLUICE_FAST_PATH", default_value_t = true, action = clap::ArgAction::Set)]
    pub fast_path: bool,
    /// Serve HTTP/2 (h2 via ALPN, h2c with prior knowledge).
    #[arg(long, env = "SLUICE_HTTP2", default_value_t = true, action = clap::ArgAction::Set)]
    pub http2: bool,
    /// Redirect HTTP to HTTPS for hosts with TLS unless an Ingress says otherwise.
    #[arg(long, env = "SLUICE_SSL_REDIRECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub ssl_redirect: bool,
    /// TLS session resumption with tickets.
    #[arg(long, env = "SLUICE_TLS_SESSION_RESUMPTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub tls_session_resumption: bool,
}

/// `sluice serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// YAML/JSON files or directories with Kubernetes objects (repeatable).
    #[arg(long, env = "SLUICE_MANIFESTS", required = true, num_args = 1.., value_delimiter = ',')]
    pub manifests: Vec<PathBuf>,
    /// Certificate (PEM) served for unknown or missing SNI instead of the generated one.
    #[arg(long, env = "SLUICE_DEFAULT_CERT_FILE", requires = "default_key_file")]
    pub default_cert_file: Option<PathBuf>,
    /// Private key (PEM) for --default-cert-file.
    #[arg(long, env = "SLUICE_DEFAULT_KEY_FILE", requires = "default_cert_file")]
    pub default_key_file: Option<PathBuf>,
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `sluice controller`.
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// Address(es) written to Ingress status (comma-separated IPs or host names); default: the
    /// addresses of the nodes running sluice.
    #[arg(long, env = "SLUICE_PUBLISH_STATUS_ADDRESS", value_delimiter = ',')]
    pub publish_status_address: Vec<String>,
    /// Namespace of the leader-election Lease (default: POD_NAMESPACE, else "default").
    #[arg(long, env = "SLUICE_ELECTION_NAMESPACE")]
    pub election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, env = "SLUICE_ELECTION_ID", default_value = "sluice-leader")]
    pub election_id: String,
    /// Addresses Gateways may be given, one per Gateway (comma-separated addresses and
    /// CIDR blocks, e.g. 198.18.0.16/28): each Gateway listens on its own and writes it to
    /// `status.addresses`. Without it Gateways share the node's addresses.
    #[arg(long, env = "SLUICE_GATEWAY_ADDRESSES", value_parser = parse_gateway_addresses, default_value = "")]
    pub gateway_addresses: GatewayAddresses,
    /// GatewayClasses whose `spec.controllerName` is this are run by sluice.
    #[arg(long, env = "SLUICE_GATEWAY_CONTROLLER_NAME", default_value = sluice_config::gateway::DEFAULT_GATEWAY_CONTROLLER)]
    pub gateway_controller_name: String,
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The pool of `--gateway-addresses`, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayAddresses(pub Vec<std::net::IpAddr>);

/// Most addresses `--gateway-addresses` may name (a /20 of IPv4).
const MAX_GATEWAY_ADDRESSES: u128 = 4096;

/// Parses `--gateway-addresses`: addresses and CIDR blocks, comma-separated (a block gives
/// every address in it, the network and broadcast addresses of an IPv4 block larger than a
/// /31 left out).
pub fn parse_gateway_addresses(v: &str) -> Result<GatewayAddresses, String> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut out: Vec<IpAddr> = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (ip, bits) = match item.split_once('/') {
            None => (item, None),
            Some((ip, b)) => (
                ip,
                Some(
                    b.parse::<u8>()
                        .map_err(|_| format!("{item:?}: bad prefix length"))?,
                ),
            ),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|e| format!("{item:?} is not an address or CIDR block ({e})"))?;
        let width: u8 = if ip.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(width);
        if bits > width {
            return Err(format!("{item:?}: prefix length over {width}"));
        }
        let count = 1u128 << (width - bits);
        if count > MAX_GATEWAY_ADDRESSES {
            return Err(format!(
                "{item:?} holds {count} addresses; at most {MAX_GATEWAY_ADDRESSES} may be given"
            ));
        }
        let base: u128 = match ip {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        } & !(count - 1);
        let (first, last) = if ip.is_ipv4() && count > 2 {
            (1, count - 1)
        } else {
            (0, count)
        };
        for i in first..last {
            let n = base + i;
            let a = match ip {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(
                    u32::try_from(n).map_err(|_| format!("{item:?}: out of range"))?,
                )),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
            };
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    Ok(GatewayAddresses(out))
}

/// Parses "off" / an address.
pub fn listen_addr(v: Option<&str>, default: &str) -> Result<Option<SocketAddr>, String> {
    match v.unwrap_or(default) {
        "off" | "none" | "" => Ok(None),
        s => s
            .parse()
            .map(Some)
            .map_err(|e| format!("{s:?} is not ADDRESS:PORT ({e})")),
    }
}

impl CommonArgs {
    /// The shutdown deadline.
    pub fn shutdown_deadline(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout)
    }
}

#[cfg(test)]
mod gateway_address_tests {
    use super::parse_gateway_addresses as p;

    #[test]
    fn blocks_and_addresses_expand_in_order_without_network_and_broadcast() {
        let a = p("198.18.0.16/30, 10.0.0.9").unwrap_or_default().0;
        let s: Vec<String> = a.iter().map(ToString::to_string).collect();
        assert_eq!(s, ["198.18.0.17", "198.18.0.18", "10.0.0.9"]);
        assert_eq!(p("").unwrap_or_default().0.len(), 0);
        assert_eq!(p("fd00::/126").map(|a| a.0.len()).ok(), Some(4));
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        assert!(p("10.0.0.0/8").is_err_and(|e| e.contains("at most")));
        assert!(p("10.0.0.1/33").is_err());
        assert!(p("nope").is_err_and(|e| e.contains("not an address")));
    }
}
