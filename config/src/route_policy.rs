//! What the ingress-nginx traffic annotations ask of a route, as plain comparable data: redirects,
//! rewrites, request edits, per-route limits and canaries. The annotations are parsed in
//! [`crate::annotations`]; the data plane compiles these into its route table, so a change is a
//! snapshot swap like any other (no reload).

use std::time::Duration;

use crate::refs::{ObjectRef, RouteAction};

/// A redirect answered by sluice instead of proxying (`permanent-redirect`,
/// `temporal-redirect`): the location is sent as written, as ingress-nginx does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Redirect {
    /// 3xx status (301 for permanent, 302 for temporal unless a `-code` annotation says).
    pub code: u16,
    /// The `Location` value.
    pub location: String,
}

/// Per-route request edits and limits. Every field `None`/`false` means "as the flags say".
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RouteEdits {
    /// Answer every request of the route with this redirect.
    pub redirect: Option<Redirect>,
    /// `app-root`: a request for exactly `/` is redirected (302) here.
    pub app_root: Option<String>,
    /// `rewrite-target`: the request path is replaced by this template, `$1`..`$9` being the
    /// route's regex captures (the route is then a [`crate::PathKind::Regex`] route).
    pub rewrite_target: Option<String>,
    /// `x-forwarded-prefix`: sent upstream as `X-Forwarded-Prefix`.
    pub forwarded_prefix: Option<String>,
    /// `upstream-vhost`: the `Host` sent upstream instead of the client's.
    pub upstream_vhost: Option<String>,
    /// `affinity: cookie`: the session cookie sluice sets when a client has none.
    pub affinity: Option<SessionCookie>,
    /// `whitelist-source-range` / `denylist-source-range`: 403 for other clients.
    pub source_ranges: Option<SourceRanges>,
    /// `enable-cors`: preflights answered, CORS fields on responses.
    pub cors: Option<Cors>,
    /// `from-to-www-redirect`: this route exists only to send its host's requests to this host
    /// (308, scheme and target kept).
    pub host_redirect: Option<String>,
    /// `limit-rps`, `limit-rpm`, `limit-connections`: per client address, per Ingress.
    pub limits: Option<RateLimits>,
    /// `custom-http-errors`: upstream statuses answered by the route's `default-backend`
    /// instead, sorted.
    pub custom_errors: Vec<u16>,
    /// `auth-type: basic` or `auth-url`: who may use the route.
    pub auth: Option<Auth>,
    /// `satisfy: any`: a client the source ranges admit needs no authentication (default
    /// `all`: both must pass).
    pub satisfy_any: bool,
    /// `auth-tls-*`: the client certificate the route requires.
    pub client_cert: Option<ClientCertAuth>,
    /// `limit-rate`, `limit-rate-after`: the pace of each response.
    pub bandwidth: Option<Bandwidth>,
    /// `custom-headers`: fields set on the route's answers, replacing the pod's (checked:
    /// allowed names, no framing fields, values that cannot split a response).
    pub response_headers: Vec<(String, String)>,
}

/// A response's pace (nginx's `limit_rate`, `limit_rate_after`), per response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bandwidth {
    /// Bytes a second after the first `after` bytes.
    pub rate: u64,
    /// Bytes sent at full speed first.
    pub after: u64,
}

/// `auth-tls-verify-client`: whether a client certificate is required and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerifyClient {
    /// `on`: a certificate the CA bundle verifies is required.
    On,
    /// `optional`: a certificate is asked for; one that is sent must verify.
    Optional,
    /// `optional_no_ca`: a certificate is asked for and passed on unverified
    /// (`ssl-client-verify` says whether it verified).
    OptionalNoCa,
}

/// Client certificates a route requires (ingress-nginx's `auth-tls-*`). The TLS handshake of
/// the route's host asks for a certificate; the route checks what the connection presented.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientCertAuth {
    /// `ca.crt` of the `auth-tls-secret`: the CAs client certificates must chain to (PEM).
    pub ca_pem: Vec<u8>,
    /// The Secret it came from.
    pub ca_source: ObjectRef,
    /// `auth-tls-verify-client` (`off` means no `ClientCertAuth` at all).
    pub verify: VerifyClient,
    /// `auth-tls-verify-depth` (default 1): certificates allowed above the client's own.
    pub depth: u32,
    /// `auth-tls-error-page`: where a client without a valid certificate is redirected (302)
    /// instead of the 400.
    pub error_page: Option<String>,
    /// `auth-tls-pass-certificate-to-upstream`: the PEM goes upstream in `ssl-client-cert`.
    pub pass_certificate: bool,
    /// `auth-tls-match-cn`: a regular expression the subject DN must match (else 403).
    pub match_cn: Option<String>,
}

/// Authentication a route requires (ingress-nginx's `auth-type` or `auth-url`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Auth {
    /// `auth-type: basic` with `auth-secret`.
    Basic(BasicAuth),
    /// `auth-type: digest` with `auth-secret` (an htdigest file).
    Digest(DigestAuth),
    /// `auth-url`: a subrequest decides.
    External(Box<ExternalAuth>),
}

/// HTTP Basic authentication against the users of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BasicAuth {
    /// `auth-realm`, sent in `WWW-Authenticate`.
    pub realm: String,
    /// The users that may log in.
    pub users: crate::htpasswd::Users,
}

/// HTTP Digest authentication (RFC 7616, MD5, `qop=auth`) against the users of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DigestAuth {
    /// `auth-realm`: part of every HA1, so the file's lines must name it.
    pub realm: String,
    /// The users that may log in.
    pub users: crate::htpasswd::DigestUsers,
}

/// External authentication (`auth-url`, as oauth2-proxy deployments use it): a subrequest
/// carrying the original method, URI and headers goes to `target`; 2xx lets the request through,
/// 401/403 answers (or redirects to `signin`), anything else is a 500.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExternalAuth {
    /// Who answers the subrequest.
    pub target: AuthTarget,
    /// The URL as written (its host goes upstream as `Host`).
    pub url: String,
    /// Path and query the subrequest asks for.
    pub path: String,
    /// What the annotations ask of the subrequest and its answer.
    pub options: ExternalOptions,
    /// A host outside sluice's routes that the operator allows: called directly when no
    /// route of sluice's serves the URL's host and path.
    pub remote: Option<Remote>,
}

/// Who answers an `auth-url` subrequest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AuthTarget {
    /// The pool of the Service the URL names.
    Pool(RouteAction),
    /// Whatever sluice's routes send this host (`None`: the request's own) and the URL's path
    /// to, looked up per request in the same route table.
    Routed(Option<String>),
}

/// Where an `auth-url` outside the cluster is: scheme, host (a name or an IP literal) and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// `https://`.
    pub https: bool,
    /// The host, lower case.
    pub host: String,
    /// The port (the scheme's when the URL names none).
    pub port: u16,
}

/// An `auth-url` sluice may call outside its own routes, because the operator allows its host
/// (`--auth-url-allow`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Remote {
    /// Where.
    pub origin: Origin,
    /// Allowed by name: whatever addresses the name resolves to. Otherwise every address it
    /// resolves to must be in `cidrs`, checked at each call (so a name re-pointed elsewhere
    /// is refused).
    pub by_name: bool,
    /// The operator's allowed blocks.
    pub cidrs: Vec<crate::cidr::Cidr>,
}

/// The operator's `--auth-url-allow`: the hosts an `auth-url` may name outside the cluster
/// (`auth.example.com`, `*.example.com` for any name below it) and the address blocks its
/// name may resolve to (or its IP literal be in). Empty: sluice calls no host it does not
/// route itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AuthUrlAllow {
    /// Host names, lower case; `*.suffix` allows every name ending in `.suffix`.
    pub names: Vec<String>,
    /// Address blocks.
    pub cidrs: Vec<crate::cidr::Cidr>,
}

impl AuthUrlAllow {
    /// Reads a comma-separated list of names, `*.suffix` wildcards and CIDR blocks (an address
    /// alone is a block of one).
    pub fn parse(v: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if let Ok(c) = item.parse::<crate::cidr::Cidr>() {
                out.cidrs.push(c);
                continue;
            }
            let name = item.strip_prefix("*.").unwrap_or(item).to_ascii_lowercase();
            let label = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            };
            if !name.contains('.') && name != "localhost" || !name.split('.').all(label) {
                return Err(format!(
                    "{item:?} is not a host name (auth.example.com, *.example.com) or an address block"
                ));
            }
            out.names.push(item.to_ascii_lowercase());
        }
        Ok(out)
    }

    /// What the list allows for `origin`: `None` when nothing.
    pub fn remote(&self, origin: &Origin) -> Option<Remote> {
        let by_name = self.names.iter().any(|n| match n.strip_prefix("*.") {
            Some(suffix) => origin
                .host
                .strip_suffix(suffix)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            None => *n == origin.host,
        });
        (by_name || !self.cidrs.is_empty()).then(|| Remote {
            origin: origin.clone(),
            by_name,
            cidrs: self.cidrs.clone(),
        })
    }
}

/// The `auth-url` companions: `auth-method`, `auth-signin` and the rest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExternalOptions {
    /// `auth-method` (default: the request's own).
    pub method: Option<String>,
    /// `auth-signin`: where a 401 is redirected (302), with the original URL appended.
    pub signin: Option<String>,
    /// `auth-signin-redirect-param` (default `rd`).
    pub signin_redirect_param: String,
    /// `auth-response-headers`: copied from the auth answer onto the request, lower case.
    pub response_headers: Vec<String>,
    /// `auth-request-redirect`: sent as `X-Auth-Request-Redirect`.
    pub request_redirect: Option<String>,
    /// `auth-always-set-cookie`: the auth answer's `Set-Cookie` reaches the client on every
    /// answer, not only on 2xx/3xx ones.
    pub always_set_cookie: bool,
    /// `auth-cache-key`, `auth-cache-duration`: answers remembered per key.
    pub cache: Option<AuthCache>,
}

/// ingress-nginx's request limits of one Ingress, per client address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimits {
    /// `limit-rps`: requests per second.
    pub rps: Option<u32>,
    /// `limit-rpm`: requests per minute.
    pub rpm: Option<u32>,
    /// `limit-burst-multiplier` (default 5): the burst allowed above the rate, as a multiple
    /// of it.
    pub burst_multiplier: u32,
    /// `limit-connections`: requests in flight at once.
    pub connections: Option<u32>,
    /// `limit-whitelist` / `limit-allowlist`: clients the limits do not apply to.
    pub exempt: Vec<crate::cidr::Cidr>,
}

/// Which client addresses may use a route: not in `deny`, and in `allow` when it is not empty.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceRanges {
    /// Allowed blocks (empty: everyone not denied).
    pub allow: Vec<crate::cidr::Cidr>,
    /// Denied blocks.
    pub deny: Vec<crate::cidr::Cidr>,
}

impl SourceRanges {
    /// Whether a client at `ip` may use the route.
    pub fn admits(&self, ip: std::net::IpAddr) -> bool {
        !self.deny.iter().any(|c| c.contains(ip))
            && (self.allow.is_empty() || self.allow.iter().any(|c| c.contains(ip)))
    }
}

/// CORS as ingress-nginx configures it (`enable-cors`, `cors-*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cors {
    /// `*`, or origins (`https://a.test`, `https://*.b.test` for any one label).
    pub origins: Vec<String>,
    /// `Access-Control-Allow-Methods`.
    pub methods: String,
    /// `Access-Control-Allow-Headers`.
    pub headers: String,
    /// `Access-Control-Expose-Headers` (empty: not sent).
    pub expose: String,
    /// `Access-Control-Allow-Credentials: true`.
    pub credentials: bool,
    /// `Access-Control-Max-Age` of preflights.
    pub max_age: u64,
}

/// `SameSite` of the session cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SameSite {
    /// `SameSite=None`.
    None,
    /// `SameSite=Lax`.
    Lax,
    /// `SameSite=Strict`.
    Strict,
}

/// The session cookie of `affinity: cookie` (ingress-nginx's `session-cookie-*`). Its value is a
/// random key the pool hashes (rendezvous) to an endpoint, so a client keeps its pod while the
/// pod exists, and only the sessions of a pod that goes move.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionCookie {
    /// `session-cookie-name` (default `INGRESSCOOKIE`).
    pub name: String,
    /// `session-cookie-path` (default: the route's path, `/` for regex routes).
    pub path: Option<String>,
    /// `session-cookie-domain`.
    pub domain: Option<String>,
    /// `session-cookie-max-age` (seconds).
    pub max_age: Option<u64>,
    /// `session-cookie-expires` (seconds from now).
    pub expires: Option<u64>,
    /// `session-cookie-samesite`.
    pub samesite: Option<SameSite>,
    /// `session-cookie-secure`: the cookie is sent over HTTPS only.
    pub secure: bool,
}

/// Per-route limits: from the route's annotation, else the controller ConfigMap, else (`None`)
/// the flag. Both request paths honour them, so they do not cost a route its direct path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RouteLimits {
    /// `proxy-body-size`: largest request body (`Some(u64::MAX)` for `0`, no limit).
    pub max_body_size: Option<u64>,
    /// `proxy-read-timeout`: how long to wait for the upstream's response head.
    pub read_timeout: Option<Duration>,
}

impl RouteEdits {
    /// Whether any edit is set: routes without edits keep the data plane's direct path.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// How a request's header selects the canary (`canary-by-header` and its refinements).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HeaderRule {
    /// No value annotation: `always` selects the canary, `never` the main backend, anything
    /// else falls through to the cookie and the weight.
    AlwaysNever,
    /// `canary-by-header-value`: this exact value selects the canary; anything else falls
    /// through.
    Value(String),
    /// `canary-by-header-pattern`: a value matching this regular expression selects the canary;
    /// anything else falls through.
    Pattern(String),
}

/// A canary backend attached to a main route: ingress-nginx's order is header, then cookie,
/// then weight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Canary {
    /// Where canary requests go.
    pub action: RouteAction,
    /// The canary Ingress.
    pub source: ObjectRef,
    /// `canary-by-header`: the header's name (lower case) and how its value is read.
    pub header: Option<(String, HeaderRule)>,
    /// `canary-by-cookie`: a cookie whose value `always`/`never` decides.
    pub cookie: Option<String>,
    /// `canary-weight`: requests out of `weight_total` sent to the canary.
    pub weight: u32,
    /// `canary-weight-total` (default 100).
    pub weight_total: u32,
}

/// One piece of an `auth-cache-key` template.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// Text as written.
    Literal(String),
    /// `$http_NAME`: a request header (lower case, `-` for `_`).
    Header(String),
    /// `$cookie_NAME`.
    Cookie(String),
    /// `$arg_NAME`: a query parameter.
    Arg(String),
    /// `$remote_addr`: the client address (as the trusted-proxy rules resolve it).
    RemoteAddr,
    /// `$remote_user`: the user of a Basic `Authorization`.
    RemoteUser,
    /// `$host`.
    Host,
    /// `$request_uri`: path and query as sent.
    RequestUri,
    /// `$uri`: the path.
    Uri,
    /// `$args`: the query.
    Args,
    /// `$request_method`.
    Method,
}

/// What to remember of `auth-url` answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AuthCache {
    /// The key template.
    pub key: Vec<KeyPart>,
    /// Statuses (empty: any) and how long an answer with one of them is remembered.
    pub valid: Vec<(Vec<u16>, std::time::Duration)>,
}
