//! Every ingress-nginx annotation and what sluice does with it: the one table that `sluice
//! check`, the controller's Warning Events and the migration page's table (`docs/migration.md`) are all made from,
//! so they cannot disagree. A test keeps that page's copy equal to [`markdown_table`].

use std::fmt::Write as _;

/// What sluice does with an annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Support {
    /// Behaves as ingress-nginx documents it.
    Honoured,
    /// Understood, with a difference the note states.
    Differs,
    /// Not acted on: the Ingress is served as if the annotation were absent.
    Unsupported,
    /// Never executed (raw nginx configuration); reported as a Warning.
    Refused,
    /// Access control sluice does not enforce yet: the Ingress's routes answer 503 instead of
    /// serving without it.
    FailsClosed,
}

impl Support {
    /// The word `sluice check` and the migration page use.
    pub fn word(self) -> &'static str {
        match self {
            Support::Honoured => "honoured",
            Support::Differs => "differs",
            Support::Unsupported => "unsupported",
            Support::Refused => "refused",
            Support::FailsClosed => "fails closed",
        }
    }

    /// Whether an Ingress using it behaves differently enough that a migration must look.
    pub fn blocks_migration(self) -> bool {
        matches!(
            self,
            Support::Unsupported | Support::Refused | Support::FailsClosed
        )
    }
}

/// One annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The name after the prefix, e.g. `rewrite-target`.
    pub name: &'static str,
    /// Whether ingress-nginx has it (`false`: a `sluice.dev/`-only annotation).
    pub nginx: bool,
    /// What sluice does.
    pub support: Support,
    /// How it differs, or why it is not supported.
    pub note: &'static str,
}

/// An entry ingress-nginx has (the ConfigMap's key table uses it too).
pub(crate) const fn e(name: &'static str, support: Support, note: &'static str) -> Entry {
    Entry {
        name,
        nginx: true,
        support,
        note,
    }
}

use Support::{Differs, FailsClosed, Honoured, Refused, Unsupported};

const AUTH_POOL: &str =
    "the subrequest uses the auth Service's pool, whose connections are kept alive";
const NOT_YET: &str = "not implemented yet: served as if the annotation were absent";
const ACCESS: &str = "not enforced yet: the Ingress answers 503 rather than serve open";
const RANGES: &str = "403 for other clients; an unreadable list answers 503; the client is the TCP peer, or behind --trusted-proxies the last untrusted X-Forwarded-For address";
const LIMITS: &str = "per client address and Ingress (GCRA, burst = rate x multiplier); --limit-req-status-code (503) when exceeded; 256 KiB of state per limited Ingress whatever the number of clients";
const SNIPPET: &str = "raw nginx configuration is never executed; use the typed annotations";
const NGINX_ONLY: &str = "an nginx tuning knob with no counterpart in sluice";

/// The catalog, sorted by name.
pub const CATALOG: &[Entry] = &[
    e(
        "affinity",
        Honoured,
        "cookie: a random session key hashed (rendezvous) to a pod; only a gone pod's sessions move",
    ),
    e("affinity-canary-behavior", Unsupported, NOT_YET),
    e(
        "affinity-mode",
        Differs,
        "persistent behaves as balanced: when pods are added, about 1/n of sessions move to them",
    ),
    e("allowlist-source-range", Honoured, RANGES),
    e("app-root", Honoured, ""),
    e(
        "auth-always-set-cookie",
        Honoured,
        "the auth answer's Set-Cookie reaches the client on every answer, not only on 2xx/3xx ones",
    ),
    e(
        "auth-cache-duration",
        Honoured,
        "status groups and a time, as proxy_cache_valid (default 200 202 401 5m)",
    ),
    e(
        "auth-cache-key",
        Differs,
        "the variables $remote_addr, $remote_user, $host, $request_uri, $uri, $args, $request_method, $http_*, $cookie_*, $arg_*; any other makes the key invalid; 1,024 answers per route",
    ),
    e("auth-keepalive", Differs, AUTH_POOL),
    e("auth-keepalive-requests", Differs, AUTH_POOL),
    e("auth-keepalive-share-vars", Differs, AUTH_POOL),
    e("auth-keepalive-timeout", Differs, AUTH_POOL),
    e("auth-method", Honoured, "default: the request's own method"),
    e("auth-proxy-set-headers", FailsClosed, ACCESS),
    e(
        "auth-realm",
        Honoured,
        "default \"Authentication Required\"",
    ),
    e(
        "auth-request-redirect",
        Honoured,
        "sent to the auth service as X-Auth-Request-Redirect (default: the request URI)",
    ),
    e(
        "auth-response-headers",
        Honoured,
        "copied onto the request; a client's own copies are removed first",
    ),
    e(
        "auth-secret",
        Honoured,
        "NAME or NAMESPACE/NAME; a missing or unreadable Secret answers 503",
    ),
    e(
        "auth-secret-type",
        Honoured,
        "auth-file (key auth) or auth-map",
    ),
    e(
        "auth-signin",
        Honoured,
        "a 401 becomes a 302 to it ($host, $scheme, $request_uri, $escaped_request_uri filled in), the original URL in the redirect parameter unless present",
    ),
    e("auth-signin-redirect-param", Honoured, "default rd"),
    e("auth-snippet", FailsClosed, SNIPPET),
    e(
        "auth-tls-error-page",
        Honoured,
        "a client without a certificate, or with one the CAs do not verify, is redirected (302)",
    ),
    e(
        "auth-tls-match-cn",
        Honoured,
        "a regular expression on the subject DN (RFC 2253); 403 otherwise",
    ),
    e(
        "auth-tls-pass-certificate-to-upstream",
        Honoured,
        "ssl-client-cert (URL-encoded PEM); ssl-client-verify and the DNs are always sent, a client's own copies removed",
    ),
    e(
        "auth-tls-secret",
        Honoured,
        "NAMESPACE/NAME or NAME, key ca.crt; covers every path of the host, as nginx's server-level ssl_verify_client (the oldest Ingress's settings win); a missing Secret, or one with a ca.crl (no revocation checks), answers 503",
    ),
    e(
        "auth-tls-verify-client",
        Honoured,
        "on (default), optional, optional_no_ca, off; no or an unverified certificate is a 400; a request on a connection whose TLS server name is another host is a 421",
    ),
    e(
        "auth-tls-verify-depth",
        Differs,
        "counts the certificates a client sends above its own (default 1: none)",
    ),
    e(
        "auth-type",
        Honoured,
        "basic: bcrypt, $apr1$, {SHA}, {SSHA}, {PLAIN}, crypt $1$/$5$/$6$/DES; digest: an htdigest file, MD5 with qop=auth, nonces live 5 minutes and their counts must grow",
    ),
    e(
        "auth-url",
        Differs,
        "http://SERVICE.NAMESPACE.svc[:PORT]/path goes to that Service's pool; any other host, or $host, through sluice's own routes (as oauth2-proxy's https://$host/oauth2/auth); a host sluice does not route is a 500, never a DNS lookup",
    ),
    e(
        "backend-protocol",
        Differs,
        "HTTP, HTTPS, GRPC (h2c), H2C and GRPCS (h2 over TLS, ALPN h2); AJP and FCGI are invalid",
    ),
    e("canary", Honoured, "weights change without a reload"),
    e("canary-by-cookie", Honoured, ""),
    e("canary-by-header", Honoured, ""),
    e(
        "canary-by-header-pattern",
        Differs,
        "Rust regex syntax: no look-around or back-references (such a pattern is invalid)",
    ),
    e("canary-by-header-value", Honoured, ""),
    e("canary-weight", Honoured, ""),
    e("canary-weight-total", Honoured, ""),
    e(
        "client-body-buffer-size",
        Differs,
        "bodies are streamed, never buffered to disk",
    ),
    e("configuration-snippet", Refused, SNIPPET),
    e("connection-proxy-header", Unsupported, NGINX_ONLY),
    e("cors-allow-credentials", Honoured, ""),
    e("cors-allow-headers", Honoured, ""),
    e("cors-allow-methods", Honoured, ""),
    e(
        "cors-allow-origin",
        Honoured,
        "*, or origins with *. for one label",
    ),
    e("cors-expose-headers", Honoured, ""),
    e("cors-max-age", Honoured, ""),
    e(
        "custom-headers",
        Differs,
        "NAME or NAMESPACE/NAME of a ConfigMap; its fields replace the pod's on every answer the route's pods or error pages give (sluice's own 401/403/redirects/503 do not carry them); only names in global-allowed-response-headers, never framing fields; a missing ConfigMap or a refused field closes the route (503), as ingress-nginx",
    ),
    e(
        "custom-http-errors",
        Differs,
        "served by the Ingress's default-backend annotation (sluice has no global default backend)",
    ),
    e(
        "default-backend",
        Honoured,
        "a Service of the Ingress's namespace, its first port: used when the route's pool has no endpoint",
    ),
    e("denylist-source-range", Honoured, RANGES),
    e(
        "enable-access-log",
        Unsupported,
        "the access log is global (--access-log)",
    ),
    e("enable-cors", Honoured, "preflights answered 204 by sluice"),
    e(
        "enable-global-auth",
        Honoured,
        "\"false\": the ConfigMap's global-auth-url does not apply to this Ingress",
    ),
    e(
        "enable-modsecurity",
        Unsupported,
        "no web application firewall",
    ),
    e("enable-opentelemetry", Unsupported, "no tracing export"),
    e(
        "enable-owasp-core-rules",
        Unsupported,
        "no web application firewall",
    ),
    e("enable-rewrite-log", Unsupported, NGINX_ONLY),
    e(
        "force-ssl-redirect",
        Honoured,
        "308, also for hosts without a TLS section",
    ),
    e(
        "from-to-www-redirect",
        Honoured,
        "308 to the Ingress's host, unless an Ingress defines the twin host",
    ),
    e(
        "http2-push-preload",
        Unsupported,
        "HTTP/2 push is obsolete (browsers removed it)",
    ),
    e("limit-allowlist", Honoured, ""),
    e("limit-burst-multiplier", Honoured, "default 5"),
    e(
        "limit-connections",
        Differs,
        "counts requests in flight per client address, not connections",
    ),
    e(
        "limit-rate",
        Honoured,
        "kilobytes a second per response, as nginx's limit_rate; bodies are paced while streaming (no proxy-buffering needed)",
    ),
    e(
        "limit-rate-after",
        Honoured,
        "kilobytes sent at full speed before limit-rate applies",
    ),
    e("limit-rpm", Honoured, LIMITS),
    e("limit-rps", Honoured, LIMITS),
    e("limit-whitelist", Honoured, ""),
    e(
        "load-balance",
        Differs,
        "round_robin and ewma as named; least_request (sluice's default) for least_conn",
    ),
    e("mirror-host", Unsupported, NOT_YET),
    e("mirror-request-body", Unsupported, NOT_YET),
    e("mirror-target", Unsupported, NOT_YET),
    e("modsecurity-snippet", Refused, SNIPPET),
    e(
        "modsecurity-transaction-id",
        Unsupported,
        "no web application firewall",
    ),
    e(
        "opentelemetry-trust-incoming-span",
        Unsupported,
        "no tracing export",
    ),
    e("permanent-redirect", Honoured, "an absolute http(s) URL"),
    e("permanent-redirect-code", Honoured, ""),
    e(
        "preserve-trailing-slash",
        Differs,
        "HTTPS redirects always keep the path as sent",
    ),
    e(
        "proxy-body-size",
        Honoured,
        "413 when the declared length is larger",
    ),
    e(
        "proxy-buffer-size",
        Differs,
        "response heads up to 64 KiB are read whatever the value",
    ),
    e(
        "proxy-buffering",
        Differs,
        "responses are always streamed: sluice's write deadlines bound a slow client instead of a buffer",
    ),
    e(
        "proxy-buffers-number",
        Differs,
        "responses are always streamed",
    ),
    e(
        "proxy-busy-buffers-size",
        Differs,
        "responses are always streamed",
    ),
    e(
        "proxy-connect-timeout",
        Differs,
        "checked, but the connect timeout is global (2 s): a pooled connection serves every route",
    ),
    e("proxy-cookie-domain", Unsupported, NOT_YET),
    e("proxy-cookie-path", Unsupported, NOT_YET),
    e(
        "proxy-http-version",
        Differs,
        "HTTP/1.1 to pods (or h2c by backend-protocol); 1.0 is not spoken",
    ),
    e(
        "proxy-max-temp-file-size",
        Differs,
        "responses are always streamed",
    ),
    e(
        "proxy-next-upstream",
        Differs,
        "error, non_idempotent and off act on requests a pod received; a connection that could not be opened is always tried on another pod within the tries (nothing was sent); timeout and http_* are accepted but an answered or timed-out attempt is final",
    ),
    e(
        "proxy-next-upstream-timeout",
        Unsupported,
        "the request deadline bounds every attempt",
    ),
    e("proxy-next-upstream-tries", Honoured, "at most 8"),
    e(
        "proxy-read-timeout",
        Differs,
        "bounds the wait for the response head (504); a streaming body is bounded by the idle deadline",
    ),
    e("proxy-redirect-from", Unsupported, NOT_YET),
    e("proxy-redirect-to", Unsupported, NOT_YET),
    e(
        "proxy-request-buffering",
        Differs,
        "request bodies are always streamed: the pod sees the body as it arrives",
    ),
    e(
        "proxy-send-timeout",
        Differs,
        "checked, but sluice bounds writes to pods with its own deadlines",
    ),
    e(
        "proxy-ssl-ciphers",
        Differs,
        "rustls's safe default suites are used to pods",
    ),
    e(
        "proxy-ssl-name",
        Honoured,
        "the name pods' certificates are verified for (and the SNI with proxy-ssl-server-name); without it, the pod's IP",
    ),
    e(
        "proxy-ssl-protocols",
        Differs,
        "TLS 1.2 and 1.3 to pods, whatever it says",
    ),
    e(
        "proxy-ssl-secret",
        Honoured,
        "ca.crt to verify pods against, tls.crt/tls.key as sluice's client certificate; the pool's own TLS, oldest Ingress wins; a missing or broken Secret answers 503",
    ),
    e("proxy-ssl-server-name", Honoured, "on: SNI is sent"),
    e(
        "proxy-ssl-verify",
        Honoured,
        "on: pods' certificates must chain to the Secret's ca.crt (on without one answers 503)",
    ),
    e(
        "proxy-ssl-verify-depth",
        Differs,
        "checked; webpki verifies the whole chain to a ca.crt root",
    ),
    e(
        "rewrite-target",
        Honoured,
        "captures $1..$9; the host's paths become regular expressions, as in ingress-nginx",
    ),
    e(
        "satisfy",
        Honoured,
        "any: a client the source ranges admit needs no authentication; all (default): both",
    ),
    e(
        "server-alias",
        Honoured,
        "the Ingress's rules also serve these hosts, unless an Ingress defines one; no certificate is added",
    ),
    e("server-snippet", Refused, SNIPPET),
    e(
        "service-upstream",
        Honoured,
        "the pool's one endpoint is the ClusterIP; sluice's retries then reach kube-proxy, not pods",
    ),
    e("session-cookie-change-on-failure", Unsupported, NOT_YET),
    e(
        "session-cookie-conditional-samesite-none",
        Unsupported,
        NOT_YET,
    ),
    e("session-cookie-domain", Honoured, ""),
    e("session-cookie-expires", Honoured, ""),
    e("session-cookie-max-age", Honoured, ""),
    e("session-cookie-name", Honoured, "default INGRESSCOOKIE"),
    e(
        "session-cookie-path",
        Honoured,
        "default: the route's path, / for regex paths",
    ),
    e("session-cookie-samesite", Honoured, ""),
    e("session-cookie-secure", Honoured, ""),
    e("ssl-ciphers", Unsupported, "TLS settings are per listener"),
    e(
        "ssl-passthrough",
        Honoured,
        "with --enable-ssl-passthrough: exact hosts, the backend of the / path",
    ),
    e(
        "ssl-prefer-server-ciphers",
        Unsupported,
        "TLS settings are per listener",
    ),
    e(
        "ssl-redirect",
        Honoured,
        "308, for hosts with a TLS section",
    ),
    e("stream-snippet", Refused, SNIPPET),
    e(
        "temporal-redirect",
        Honoured,
        "an absolute http(s) URL; wins over permanent-redirect",
    ),
    e("temporal-redirect-code", Honoured, ""),
    e(
        "upstream-hash-by",
        Differs,
        "one variable: $remote_addr, $binary_remote_addr, $request_uri, $http_NAME or $cookie_NAME; rendezvous hashing",
    ),
    e("upstream-hash-by-subset", Unsupported, NOT_YET),
    e("upstream-hash-by-subset-size", Unsupported, NOT_YET),
    e(
        "upstream-vhost",
        Honoured,
        "a host name (nginx variables are invalid)",
    ),
    e(
        "use-regex",
        Differs,
        "Rust regex syntax, case-insensitive, anchored at the start: no look-around or back-references (such a path is invalid)",
    ),
    e("whitelist-source-range", Honoured, RANGES),
    e("x-forwarded-prefix", Honoured, ""),
    Entry {
        name: "hsts",
        nginx: false,
        support: Honoured,
        note: "sluice.dev/ only: max-age=N[; includeSubDomains][; preload] or true",
    },
    Entry {
        name: "upstream-max-connections",
        nginx: false,
        support: Honoured,
        note: "sluice.dev/ only: requests in flight per endpoint (nginx's max_conns)",
    },
];

/// The ingress-nginx prefix.
pub const NGINX_PREFIX: &str = "nginx.ingress.kubernetes.io/";
/// sluice's prefix.
pub const SLUICE_PREFIX: &str = "sluice.dev/";

/// What an annotation key is to sluice: `None` when it is not under either prefix (another
/// tool's annotation, none of sluice's business).
pub fn lookup(key: &str) -> Option<Result<&'static Entry, &str>> {
    let (name, nginx) = if let Some(n) = key.strip_prefix(NGINX_PREFIX) {
        (n, true)
    } else if let Some(n) = key.strip_prefix(SLUICE_PREFIX) {
        (n, false)
    } else {
        return None;
    };
    Some(
        CATALOG
            .iter()
            .find(|e| e.name == name && (e.nginx || !nginx))
            .ok_or(name),
    )
}

/// Whether an annotation sluice does not know is, by its name, about who may reach a backend
/// (a future ingress-nginx `auth-*`, `limit-*` or `*-source-range`): such an annotation fails
/// closed rather than be ignored.
pub fn access_like(name: &str) -> bool {
    name.starts_with("auth-")
        || name.starts_with("limit-")
        || name.ends_with("-source-range")
        || name == "satisfy"
}

/// The migration table (`docs/migration.md`): every ingress-nginx annotation, what sluice does, and how.
pub fn markdown_table() -> String {
    let mut rows: Vec<&Entry> = CATALOG.iter().collect();
    rows.sort_by_key(|e| (!e.nginx, e.name));
    table("annotation", rows.into_iter(), |e| {
        let prefix = if e.nginx { "" } else { SLUICE_PREFIX };
        format!("`{prefix}{}`", e.name)
    })
}

/// A Markdown table of entries: the name as `name` renders it, the verdict, the note.
pub(crate) fn table<'a>(
    heading: &str,
    rows: impl Iterator<Item = &'a Entry>,
    name: impl Fn(&Entry) -> String,
) -> String {
    let mut out = format!("| {heading} | sluice | notes |\n|---|---|---|\n");
    for e in rows {
        let _ = writeln!(out, "| {} | {} | {} |", name(e), e.support.word(), e.note);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sorted_and_unique_and_lookup_finds_both_spellings() {
        let names: Vec<&str> = CATALOG.iter().filter(|e| e.nginx).map(|e| e.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
        for e in CATALOG {
            assert_eq!(lookup(&format!("sluice.dev/{}", e.name)), Some(Ok(e)));
            let key = format!("nginx.ingress.kubernetes.io/{}", e.name);
            let nginx = lookup(&key);
            if e.nginx {
                assert_eq!(nginx, Some(Ok(e)));
            } else {
                assert_eq!(nginx, Some(Err(e.name)));
            }
            assert!(
                e.support != Support::Differs || !e.note.is_empty(),
                "{} differs without saying how",
                e.name
            );
        }
        assert_eq!(lookup("example.com/rewrite-target"), None);
        assert_eq!(
            lookup("nginx.ingress.kubernetes.io/no-such-thing"),
            Some(Err("no-such-thing"))
        );
    }

    #[test]
    fn fail_closed_entries_are_exactly_what_translation_locks() {
        for e in CATALOG.iter().filter(|e| e.nginx) {
            let key = format!("nginx.ingress.kubernetes.io/{}", e.name);
            let a = std::collections::BTreeMap::from([(key, "x".to_string())]);
            let locked = !super::super::unenforced_access(&a).is_empty();
            assert_eq!(locked, e.support == Support::FailsClosed, "{}", e.name);
        }
    }
}
