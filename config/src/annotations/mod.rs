//! Ingress annotations sluice understands. Each has a `sluice.dev/` name; the ingress-nginx
//! spelling is accepted too so that migrating Ingresses keep their behaviour. The `sluice.dev/`
//! one wins when both are present.

use std::collections::BTreeMap;

use crate::model::{BalancePolicy, HashKey, Hsts, NextUpstream, UpstreamProtocol};

/// Both spellings of an annotation, `sluice.dev/` first (it wins when both are present).
macro_rules! both {
    ($n:literal) => {
        [
            concat!("sluice.dev/", $n),
            concat!("nginx.ingress.kubernetes.io/", $n),
        ]
    };
}
pub(crate) use both;

pub mod access;
pub mod auth;
pub mod auth_cache;
pub mod backends;
pub mod catalog;
pub mod client_cert;
pub mod headers;
pub mod in_force;
pub mod review;
pub mod traffic;
pub mod upstream_tls;

/// The legacy class annotation.
pub const INGRESS_CLASS: &str = "kubernetes.io/ingress.class";
/// Marks an IngressClass as the cluster default.
pub const DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
/// `"true"`/`"false"`: redirect HTTP to HTTPS for hosts with TLS.
pub const SSL_REDIRECT: [&str; 2] = [
    "sluice.dev/ssl-redirect",
    "nginx.ingress.kubernetes.io/ssl-redirect",
];
/// `HTTP`, `HTTPS`, `H2C` (also `GRPC` = h2c), `GRPCS` (h2 over TLS).
pub const BACKEND_PROTOCOL: [&str; 2] = [
    "sluice.dev/backend-protocol",
    "nginx.ingress.kubernetes.io/backend-protocol",
];
/// `max-age=N[; includeSubDomains][; preload]`, or `"true"` for one year.
pub const HSTS: &str = "sluice.dev/hsts";
/// `least_request` (sluice's default), `round_robin` or `ewma`: the pool's balancing policy.
pub const LOAD_BALANCE: [&str; 2] = [
    "sluice.dev/load-balance",
    "nginx.ingress.kubernetes.io/load-balance",
];
/// Most requests in flight to one endpoint (nginx's `max_conns`; ingress-nginx has no such
/// annotation, so only sluice's spelling).
pub const UPSTREAM_MAX_CONNECTIONS: [&str; 1] = ["sluice.dev/upstream-max-connections"];
/// An nginx variable whose value is hashed to pick the endpoint (consistent hashing).
pub const UPSTREAM_HASH_BY: [&str; 2] = [
    "sluice.dev/upstream-hash-by",
    "nginx.ingress.kubernetes.io/upstream-hash-by",
];
/// When to try another endpoint: `error`, `timeout`, `non_idempotent`, `off` (space-separated).
pub const PROXY_NEXT_UPSTREAM: [&str; 2] = [
    "sluice.dev/proxy-next-upstream",
    "nginx.ingress.kubernetes.io/proxy-next-upstream",
];
/// How many endpoints a request may try (`0` = the global `--upstream-tries`).
pub const PROXY_NEXT_UPSTREAM_TRIES: [&str; 2] = [
    "sluice.dev/proxy-next-upstream-tries",
    "nginx.ingress.kubernetes.io/proxy-next-upstream-tries",
];

/// The access-control annotations (ingress-nginx's, under either prefix) sluice does not
/// enforce: the catalog's `fails closed` entries (`auth-snippet`, never executed;
/// `auth-proxy-set-headers`; the response bandwidth limits) and any annotation sluice does not
/// know whose name says it is about access ([`catalog::access_like`]). An Ingress carrying any
/// is served closed (503), never open. Returns the keys found.
pub fn unenforced_access(a: &BTreeMap<String, String>) -> Vec<&str> {
    a.keys()
        .map(String::as_str)
        .filter(|k| match catalog::lookup(k) {
            None => false,
            Some(Ok(e)) => e.support == catalog::Support::FailsClosed,
            Some(Err(name)) => catalog::access_like(name),
        })
        .collect()
}

/// Test input: these `(name, value)` pairs under the ingress-nginx prefix.
/// A Secret an annotation names: `name` (the Ingress's namespace) or `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretName {
    /// Namespace, when the annotation gives one.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// An [`AnnotationError`] for annotation `name`.
pub(super) fn err(name: &'static str, message: impl Into<String>) -> AnnotationError {
    AnnotationError {
        name,
        message: message.into(),
    }
}

pub(super) fn secret_name(name: &'static str, s: &str) -> Result<SecretName, AnnotationError> {
    match s.split_once('/') {
        Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/') => Ok(SecretName {
            namespace: Some(ns.to_string()),
            name: n.to_string(),
        }),
        None if !s.is_empty() => Ok(SecretName {
            namespace: None,
            name: s.to_string(),
        }),
        _ => Err(err(name, format!("{s:?} is not NAME or NAMESPACE/NAME"))),
    }
}

#[cfg(test)]
pub(crate) fn nginx_annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
        .collect()
}

/// An annotation value that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {name}: {message}")]
pub struct AnnotationError {
    /// The annotation key.
    pub name: &'static str,
    /// What is wrong with its value.
    pub message: String,
}

fn first<'a>(
    annotations: &'a BTreeMap<String, String>,
    names: &[&'static str],
) -> Option<(&'static str, &'a str)> {
    names
        .iter()
        .find_map(|n| annotations.get(*n).map(|v| (*n, v.trim())))
}

/// Reads the ssl-redirect annotation; `None` when absent.
pub fn ssl_redirect(a: &BTreeMap<String, String>) -> Result<Option<bool>, AnnotationError> {
    traffic::flag(a, &SSL_REDIRECT)
}

/// Reads the backend-protocol annotation; `None` when absent.
pub fn backend_protocol(
    a: &BTreeMap<String, String>,
) -> Result<Option<UpstreamProtocol>, AnnotationError> {
    match first(a, &BACKEND_PROTOCOL) {
        None => Ok(None),
        Some((name, v)) => match v.to_ascii_uppercase().as_str() {
            "HTTP" => Ok(Some(UpstreamProtocol::Http1)),
            "HTTPS" => Ok(Some(UpstreamProtocol::Https)),
            "H2C" | "GRPC" => Ok(Some(UpstreamProtocol::H2c)),
            "GRPCS" => Ok(Some(UpstreamProtocol::H2Tls)),
            _ => Err(AnnotationError {
                name,
                message: format!("{v:?} is not one of HTTP, HTTPS, H2C, GRPC, GRPCS"),
            }),
        },
    }
}

/// `sluice.dev/upstream-max-connections`: most requests in flight to one endpoint of the pool
/// (nginx's `max_conns`); `0` means no limit.
pub fn max_in_flight(a: &BTreeMap<String, String>) -> Result<Option<u32>, AnnotationError> {
    match first(a, &UPSTREAM_MAX_CONNECTIONS) {
        None => Ok(None),
        Some((name, v)) => v.parse::<u32>().map(Some).map_err(|_| AnnotationError {
            name,
            message: format!("{v:?} is not a number of connections"),
        }),
    }
}

/// Reads the balancing annotations; `None` when neither is present. `upstream-hash-by` wins
/// over `load-balance`, as in ingress-nginx.
pub fn balance(a: &BTreeMap<String, String>) -> Result<Option<BalancePolicy>, AnnotationError> {
    if let Some((name, v)) = first(a, &UPSTREAM_HASH_BY) {
        return HashKey::parse(v)
            .map(|k| Some(BalancePolicy::Hash(k)))
            .map_err(|message| AnnotationError { name, message });
    }
    match first(a, &LOAD_BALANCE) {
        None => Ok(None),
        Some((name, v)) => BalancePolicy::from_name(v)
            .map(Some)
            .ok_or_else(|| AnnotationError {
                name,
                message: format!("{v:?} is not one of least_request, round_robin, ewma"),
            }),
    }
}

/// Reads the retry annotations. Unknown conditions are an error; conditions sluice cannot act
/// on are listed in the second value (the caller warns about them).
pub fn next_upstream(
    a: &BTreeMap<String, String>,
) -> Result<(NextUpstream, Vec<String>), AnnotationError> {
    let mut out = NextUpstream::default();
    let mut unsupported = Vec::new();
    if let Some((name, v)) = first(a, &PROXY_NEXT_UPSTREAM) {
        out.on_error = false;
        for token in v.split_whitespace() {
            match token {
                "error" => out.on_error = true,
                // A timed-out attempt is not retried (the request deadline covers every
                // attempt); accepted so that ingress-nginx's default parses.
                "timeout" => unsupported.push(token.to_string()),
                "non_idempotent" => out.non_idempotent = true,
                "off" => {}
                "invalid_header" | "http_500" | "http_502" | "http_503" | "http_504"
                | "http_403" | "http_404" | "http_429" => unsupported.push(token.to_string()),
                _ => {
                    return Err(AnnotationError {
                        name,
                        message: format!("unknown condition {token:?}"),
                    });
                }
            }
        }
        if v.split_whitespace().any(|t| t == "off") {
            out = NextUpstream {
                on_error: false,
                non_idempotent: false,
                tries: None,
            };
        }
    }
    if let Some((name, v)) = first(a, &PROXY_NEXT_UPSTREAM_TRIES) {
        let n: u32 = v.parse().map_err(|_| AnnotationError {
            name,
            message: format!("{v:?} is not a whole number"),
        })?;
        out.tries = (n > 0).then_some(n.min(8));
    }
    Ok((out, unsupported))
}

/// Reads the HSTS annotation; `None` when absent or `"false"`.
pub fn hsts(a: &BTreeMap<String, String>) -> Result<Option<Hsts>, AnnotationError> {
    let Some(v) = a.get(HSTS).map(|v| v.trim()) else {
        return Ok(None);
    };
    if v.eq_ignore_ascii_case("false") {
        return Ok(None);
    }
    if v.eq_ignore_ascii_case("true") {
        return Ok(Some(Hsts {
            max_age: 31_536_000,
            include_subdomains: false,
            preload: false,
        }));
    }
    let mut out = Hsts {
        max_age: 0,
        include_subdomains: false,
        preload: false,
    };
    let mut saw_max_age = false;
    for part in v.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some(n) = part.strip_prefix("max-age=") {
            out.max_age = n.trim().parse().map_err(|_| AnnotationError {
                name: HSTS,
                message: format!("max-age {n:?} is not a whole number of seconds"),
            })?;
            saw_max_age = true;
        } else if part.eq_ignore_ascii_case("includeSubDomains") {
            out.include_subdomains = true;
        } else if part.eq_ignore_ascii_case("preload") {
            out.preload = true;
        } else {
            return Err(AnnotationError {
                name: HSTS,
                message: format!("unknown directive {part:?}"),
            });
        }
    }
    if !saw_max_age {
        return Err(AnnotationError {
            name: HSTS,
            message: "max-age=N is required".to_string(),
        });
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(k: &str, v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(k.to_string(), v.to_string())])
    }

    #[test]
    fn parses_values() {
        assert_eq!(
            ssl_redirect(&ann("sluice.dev/ssl-redirect", "false")),
            Ok(Some(false))
        );
        assert_eq!(
            ssl_redirect(&ann("nginx.ingress.kubernetes.io/ssl-redirect", "TRUE")),
            Ok(Some(true))
        );
        assert!(ssl_redirect(&ann("sluice.dev/ssl-redirect", "maybe")).is_err());
        assert_eq!(
            backend_protocol(&ann(
                "nginx.ingress.kubernetes.io/backend-protocol",
                "https"
            )),
            Ok(Some(UpstreamProtocol::Https))
        );
        assert_eq!(
            backend_protocol(&ann(
                "nginx.ingress.kubernetes.io/backend-protocol",
                "GRPCS"
            )),
            Ok(Some(UpstreamProtocol::H2Tls))
        );
        assert!(
            backend_protocol(&ann("nginx.ingress.kubernetes.io/backend-protocol", "FCGI")).is_err()
        );
        assert_eq!(
            hsts(&ann(HSTS, "max-age=600; includeSubDomains")),
            Ok(Some(Hsts {
                max_age: 600,
                include_subdomains: true,
                preload: false
            }))
        );
        assert!(hsts(&ann(HSTS, "includeSubDomains")).is_err());
        assert_eq!(
            hsts(&ann(HSTS, "max-age=60; preload")).map(|h| h.map(|h| h.preload)),
            Ok(Some(true))
        );
        assert_eq!(hsts(&BTreeMap::new()), Ok(None));
    }

    #[test]
    fn upstream_max_connections() {
        let name = "sluice.dev/upstream-max-connections";
        assert_eq!(max_in_flight(&ann(name, " 20 ")).unwrap(), Some(20));
        assert_eq!(max_in_flight(&ann(name, "0")).unwrap(), Some(0));
        assert_eq!(max_in_flight(&BTreeMap::new()).unwrap(), None);
        assert!(max_in_flight(&ann(name, "-1")).is_err());
        assert!(max_in_flight(&ann(name, "lots")).is_err());
    }

    #[test]
    fn balance_and_hash_keys() {
        let lb = "nginx.ingress.kubernetes.io/load-balance";
        assert_eq!(
            balance(&ann(lb, "round_robin")),
            Ok(Some(BalancePolicy::RoundRobin))
        );
        assert_eq!(balance(&ann(lb, "ewma")), Ok(Some(BalancePolicy::PeakEwma)));
        assert_eq!(
            balance(&ann("sluice.dev/load-balance", "least-request")),
            Ok(Some(BalancePolicy::LeastRequest))
        );
        assert!(balance(&ann(lb, "random")).is_err());
        let hb = "nginx.ingress.kubernetes.io/upstream-hash-by";
        for (v, want) in [
            ("$binary_remote_addr", HashKey::ClientIp),
            ("$remote_addr", HashKey::ClientIp),
            ("$request_uri", HashKey::RequestUri),
            ("$http_x_user_id", HashKey::Header("x-user-id".into())),
            ("$cookie_session", HashKey::Cookie("session".into())),
        ] {
            assert_eq!(
                balance(&ann(hb, v)),
                Ok(Some(BalancePolicy::Hash(want))),
                "{v}"
            );
        }
        for bad in ["$host$request_uri", "user", "$http_", "$arg_x"] {
            assert!(balance(&ann(hb, bad)).is_err(), "{bad}");
        }
        // Hash-by wins over load-balance, as in ingress-nginx.
        let both = BTreeMap::from([
            (hb.to_string(), "$request_uri".to_string()),
            (lb.to_string(), "round_robin".to_string()),
        ]);
        assert_eq!(
            balance(&both),
            Ok(Some(BalancePolicy::Hash(HashKey::RequestUri)))
        );
    }

    #[test]
    fn access_control_that_is_not_enforced_is_found_under_either_prefix() {
        let a = BTreeMap::from([
            (
                "nginx.ingress.kubernetes.io/whitelist-source-range".to_string(),
                "10.0.0.0/8".to_string(),
            ),
            ("sluice.dev/auth-url".to_string(), "http://auth".to_string()),
            (
                "sluice.dev/auth-tls-secret".to_string(),
                "ns/ca".to_string(),
            ),
            (
                "nginx.ingress.kubernetes.io/limit-rate".to_string(),
                "5".to_string(),
            ),
            (
                "nginx.ingress.kubernetes.io/ssl-redirect".to_string(),
                "true".to_string(),
            ),
            ("example.com/auth-url".to_string(), "x".to_string()),
            (
                "nginx.ingress.kubernetes.io/auth-tomorrow".to_string(),
                "x".to_string(),
            ),
        ]);
        let mut found = unenforced_access(&a);
        found.sort_unstable();
        assert_eq!(
            found,
            ["nginx.ingress.kubernetes.io/auth-tomorrow"],
            "source ranges, auth-url, auth-tls and limit-rate are enforced, so not listed; an unknown auth- one is"
        );
        assert!(
            unenforced_access(&ann("nginx.ingress.kubernetes.io/rewrite-target", "/")).is_empty()
        );
    }

    #[test]
    fn retry_conditions() {
        let nu = "nginx.ingress.kubernetes.io/proxy-next-upstream";
        let (d, _) = next_upstream(&BTreeMap::new()).unwrap();
        assert_eq!(d, NextUpstream::default());
        let (v, unsupported) = next_upstream(&ann(nu, "error timeout")).unwrap();
        assert!(v.on_error && !v.non_idempotent);
        assert_eq!(unsupported, ["timeout"]);
        let (v, _) = next_upstream(&ann(nu, "error non_idempotent")).unwrap();
        assert!(v.on_error && v.non_idempotent);
        let (v, _) = next_upstream(&ann(nu, "off")).unwrap();
        assert!(!v.on_error && !v.non_idempotent);
        let (v, unsupported) = next_upstream(&ann(nu, "http_502")).unwrap();
        assert!(!v.on_error);
        assert_eq!(unsupported, ["http_502"]);
        assert!(next_upstream(&ann(nu, "error sometimes")).is_err());
        let tries = "sluice.dev/proxy-next-upstream-tries";
        assert_eq!(next_upstream(&ann(tries, "2")).unwrap().0.tries, Some(2));
        assert_eq!(next_upstream(&ann(tries, "0")).unwrap().0.tries, None);
        assert!(next_upstream(&ann(tries, "-1")).is_err());
    }
}
