//! What Gateway API translation (`crate::gateway`) hands the data plane, inside the same [`crate::Snapshot`] as
//! the Ingress routes: the sockets Gateways listen on, and for each the listeners sharing it
//! and their routing rules, already ordered by the spec's precedence. Plain data with `Eq` and
//! `Hash`, like the rest of the model.

pub mod hostname;

use std::net::IpAddr;

use crate::gateway_model::hostname::Hostname;
use crate::model::{ClusterKey, ObjectRef};

/// One listening socket: an address (the Gateway's own, or every address of the node) and a
/// port, plain HTTP or HTTPS. Listeners of a Gateway that share a port share its socket and
/// are told apart by hostname.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewaySocket {
    /// The address to bind (`None`: the node's wildcard address, when `--gateway-addresses`
    /// gives Gateways none of their own).
    pub addr: Option<IpAddr>,
    /// The port.
    pub port: u16,
    /// HTTPS: TLS terminated with the listeners' certificates (or, with `passthrough`, the
    /// ClientHello read for its server name).
    pub tls: bool,
    /// TLS passthrough: a connection is tunnelled untouched to a backend of the TLSRoute its
    /// server name selects (the listeners' host rules), never terminated.
    pub passthrough: bool,
    /// The listeners served on it, most specific hostname first.
    pub listeners: Vec<GatewayListener>,
}

impl GatewaySocket {
    /// The listener that takes a request for `host` (normalized): the first, in order of
    /// specificity, whose hostname covers it.
    pub fn listener_for(&self, host: Option<&str>) -> Option<&GatewayListener> {
        self.listeners.iter().find(|l| match host {
            Some(h) => l.hostname.matches(h),
            None => l.hostname == Hostname::Any,
        })
    }
}

/// One programmed listener of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayListener {
    /// The Gateway.
    pub gateway: ObjectRef,
    /// `spec.listeners[].name`.
    pub name: String,
    /// Its hostname.
    pub hostname: Hostname,
    /// HTTPS: the Secrets of its `certificateRefs` (all resolved and valid).
    pub certificates: Vec<ObjectRef>,
    /// HTTPS: the client-certificate validation its Gateway's `spec.tls.frontend` asks of
    /// connections to it (per port, else the default).
    pub client_validation: Option<ClientValidation>,
    /// The rules of the routes attached to it, by effective hostname, most specific first.
    pub hosts: Vec<HostRules>,
}

/// Client-certificate validation of an HTTPS listener (a Gateway's `spec.tls.frontend`): the
/// handshake asks for a certificate and, unless `insecure_fallback`, refuses a connection
/// without one that chains to `ca_pem`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientValidation {
    /// The CA bundle (PEM): the `ca.crt` of every usable reference.
    pub ca_pem: Vec<u8>,
    /// The ConfigMaps it came from.
    pub sources: Vec<ObjectRef>,
    /// `AllowInsecureFallback`: a certificate is asked for, but a connection without one or
    /// with one that does not verify is served too (the backend decides).
    pub insecure_fallback: bool,
}

impl GatewayListener {
    /// The first rule, in precedence order, that a request matches: the most specific
    /// hostname's rules first, then less specific ones that also cover the host.
    pub fn find<'a>(
        &'a self,
        host: Option<&str>,
        req: &RequestFacts<'_>,
    ) -> Option<&'a GatewayRule> {
        let (h, r) = self.find_index(host, req)?;
        self.hosts.get(h)?.rules.get(r).map(|r| &**r)
    }

    /// [`Self::find`] as indices: `(host bucket, rule)`.
    pub fn find_index(&self, host: Option<&str>, req: &RequestFacts<'_>) -> Option<(usize, usize)> {
        self.hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| match host {
                Some(name) => h.host.matches(name),
                None => h.host == Hostname::Any,
            })
            .find_map(|(hi, h)| {
                h.rules
                    .iter()
                    .position(|r| r.matches(req))
                    .map(|ri| (hi, ri))
            })
    }
}

/// What rule matching reads of a request.
#[derive(Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The normalized path (no query).
    pub path: &'a str,
    /// The method.
    pub method: &'a str,
    /// The raw query string (after `?`), if any.
    pub query: Option<&'a str>,
    /// Looks a header up by lower-case name: its first value.
    pub header: &'a dyn Fn(&str) -> Option<&'a str>,
}

impl std::fmt::Debug for RequestFacts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestFacts")
            .field("path", &self.path)
            .field("method", &self.method)
            .field("query", &self.query)
            .finish_non_exhaustive()
    }
}

/// The rules of one effective hostname (listener ∩ route), in precedence order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostRules {
    /// The hostname.
    pub host: Hostname,
    /// Its rules, highest precedence first. Shared (`Arc`): the data plane keeps the
    /// compiled backends of a rule the next snapshot hands it again.
    pub rules: Vec<std::sync::Arc<GatewayRule>>,
}

/// How a path is matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathRule {
    /// The whole path.
    Exact(String),
    /// Whole path elements (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`); stored
    /// without a trailing `/` (`/` itself is stored as the empty string).
    Prefix(String),
    /// A regular expression the whole path must match (RE2 syntax, as the `regex` crate).
    Regex(Pattern),
}

impl PathRule {
    /// Whether `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Exact(p) => p == path,
            Self::Prefix(p) => {
                path.starts_with(p.as_str())
                    && (path.len() == p.len() || path.as_bytes().get(p.len()) == Some(&b'/'))
            }
            Self::Regex(re) => re.is_match(path),
        }
    }
}

/// A header or query-parameter condition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ValueMatch {
    /// Header names lower case; query parameter names as written (they are case-sensitive).
    pub name: String,
    /// The value it must equal, or the expression it must match.
    pub value: ValueRule,
}

/// `type: Exact` or `type: RegularExpression`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ValueRule {
    /// Equal, byte for byte.
    Exact(String),
    /// Matches the expression as a whole.
    Regex(Pattern),
}

impl ValueMatch {
    fn accepts(&self, v: &str) -> bool {
        match &self.value {
            ValueRule::Exact(want) => want == v,
            ValueRule::Regex(re) => re.is_match(v),
        }
    }
}

/// A compiled regular expression that must match a whole value, compared and hashed by its
/// source text (so rules stay plain comparable data). Compiled once, at translation: the
/// `regex` crate matches in time linear in the input, so a client cannot make it slow.
#[derive(Debug, Clone)]
pub struct Pattern {
    source: String,
    re: regex::Regex,
}

impl Pattern {
    /// Compiles `source`, anchored at both ends.
    pub fn new(source: &str) -> Result<Self, String> {
        regex::RegexBuilder::new(&format!("^(?:{source})$"))
            .size_limit(1 << 20)
            .build()
            .map(|re| Self {
                source: source.to_string(),
                re,
            })
            .map_err(|e| e.to_string())
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the whole of `v` matches.
    pub fn is_match(&self, v: &str) -> bool {
        self.re.is_match(v)
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}
impl Eq for Pattern {}
impl PartialOrd for Pattern {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pattern {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.source.cmp(&other.source)
    }
}
impl std::hash::Hash for Pattern {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.source.hash(state);
    }
}

/// One match of one rule of an HTTPRoute, with what the rule does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayRule {
    /// The HTTPRoute.
    pub source: ObjectRef,
    /// The rule's index in `spec.rules`.
    pub rule: u32,
    /// The path condition.
    pub path: PathRule,
    /// The method condition.
    pub method: Option<String>,
    /// Header conditions (all must hold; the first value of a repeated header is read).
    pub headers: Vec<ValueMatch>,
    /// Query parameter conditions (all must hold; the first value of a repeated one).
    pub query: Vec<ValueMatch>,
    /// Filters of the rule.
    pub filters: Filters,
    /// Where requests go, by weight. Empty: 500 (a rule with no usable backend).
    pub backends: Vec<WeightedBackend>,
    /// `timeouts`: how long the response head may take (the shorter of `request` and
    /// `backendRequest`); `Some(ZERO)`: no limit (`0s`); `None`: `--request-timeout`.
    pub timeout: Option<std::time::Duration>,
}

impl GatewayRule {
    /// Whether a request meets every condition of this match.
    pub fn matches(&self, req: &RequestFacts<'_>) -> bool {
        self.path.matches(req.path)
            && self.method.as_deref().is_none_or(|m| m == req.method)
            && self
                .headers
                .iter()
                .all(|h| (req.header)(&h.name).is_some_and(|v| h.accepts(v)))
            && self
                .query
                .iter()
                .all(|q| query_value(req.query, &q.name).is_some_and(|v| q.accepts(&v)))
    }
}

/// The first value of a query parameter, percent-decoded (`+` read as a space).
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k) == name).then(|| decode(v))
    })
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |j: usize| (b.get(j).copied().map(char::from)?).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => match (hex(i + 1), hex(i + 2)) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A backend and its share.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WeightedBackend {
    /// The pool, or why there is none (its share of requests gets 500).
    pub target: BackendTarget,
    /// Relative weight (0 takes no requests).
    pub weight: u32,
    /// The backendRef's own header modifiers (applied after the rule's).
    pub filters: Filters,
}

/// Where one backendRef sends requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BackendTarget {
    /// A Service port's pool.
    Cluster(ClusterKey),
    /// The reference cannot be used (missing Service, kind, grant): 500, with the reason
    /// for the log.
    Invalid(String),
}

/// Header edits of a `RequestHeaderModifier` or `ResponseHeaderModifier` filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct HeaderEdits {
    /// Replace (or add) these fields; names lower case.
    pub set: Vec<(String, String)>,
    /// Append these values.
    pub add: Vec<(String, String)>,
    /// Remove these fields.
    pub remove: Vec<String>,
}

impl HeaderEdits {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// How a redirect or rewrite changes the path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathModifier {
    /// Replace the whole path.
    Full(String),
    /// Replace the part the rule's `PathPrefix` matched.
    Prefix(String),
}

/// A `RequestRedirect` filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RedirectFilter {
    /// `http` or `https`; `None` keeps the request's.
    pub scheme: Option<String>,
    /// The host; `None` keeps the request's.
    pub hostname: Option<String>,
    /// The port; `None` follows the spec's defaults (the scheme's well-known port is left out).
    pub port: Option<u16>,
    /// The path; `None` keeps the request's.
    pub path: Option<PathModifier>,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
}

/// A `URLRewrite` filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RewriteFilter {
    /// The `Host` sent upstream.
    pub hostname: Option<String>,
    /// The path sent upstream.
    pub path: Option<PathModifier>,
}

/// The filters of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Filters {
    /// `RequestHeaderModifier`.
    pub request_headers: HeaderEdits,
    /// `ResponseHeaderModifier`.
    pub response_headers: HeaderEdits,
    /// `RequestRedirect`: answered by sluice, no backend.
    pub redirect: Option<RedirectFilter>,
    /// `URLRewrite`.
    pub rewrite: Option<RewriteFilter>,
    /// `RequestMirror`: copies of each request sent to these pools, their answers ignored.
    pub mirrors: Vec<MirrorFilter>,
}

/// A `RequestMirror` filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MirrorFilter {
    /// The pool copies go to.
    pub target: ClusterKey,
    /// The share of requests mirrored: `numerator` in `denominator`.
    pub numerator: u32,
    /// See `numerator` (never 0).
    pub denominator: u32,
}
