//! The controller ConfigMap (`--configmap NAMESPACE/NAME`), in ingress-nginx's keys: global
//! defaults that an Ingress's annotation overrides and that override sluice's flags. Like the
//! annotations, every key has one row in [`KEYS`] saying what sluice does with it; unknown
//! and unsupported keys are reported as one Warning on the ConfigMap, invalid values on their
//! key, and the rest applies.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::annotations::catalog::{self, Entry, Support, e as k};
use crate::annotations::headers::allowed_list;
use crate::annotations::traffic::nginx_size;
use crate::model::{Hsts, Settings};

use Support::{Differs, Honoured};

const GLOBAL: &str = "as its auth- annotation, for global authentication";

/// The `global-auth-*` keys and the annotations they stand for (after
/// `nginx.ingress.kubernetes.io/auth-`). Snippets and header ConfigMaps become the
/// annotations that fail closed, so that global authentication sluice cannot honour fully
/// closes what it would protect.
const GLOBAL_AUTH: &[(&str, &str)] = &[
    ("global-auth-always-set-cookie", "always-set-cookie"),
    ("global-auth-cache-duration", "cache-duration"),
    ("global-auth-cache-key", "cache-key"),
    ("global-auth-method", "method"),
    ("global-auth-proxy-set-headers", "proxy-set-headers"),
    ("global-auth-request-redirect", "request-redirect"),
    ("global-auth-response-headers", "response-headers"),
    ("global-auth-signin", "signin"),
    ("global-auth-signin-redirect-param", "signin-redirect-param"),
    ("global-auth-snippet", "snippet"),
    ("global-auth-url", "url"),
];

/// The keys users set most, sorted.
pub const KEYS: &[Entry] = &[
    k(
        "allow-cross-namespace-resources",
        Honoured,
        "lets auth-secret and auth-tls-secret name a Secret of another namespace (refused by default, and always under --host-ownership namespace)",
    ),
    k(
        "allow-snippet-annotations",
        Differs,
        "accepted; snippets are never executed whatever it says",
    ),
    k(
        "block-cidrs",
        Differs,
        "clients in these blocks are answered 403 on every request, whatever the route; an Ingress's own source ranges do not lift it (in nginx a location's allow list does)",
    ),
    k(
        "compute-full-forwarded-for",
        Differs,
        "always on for trusted proxies (--trusted-proxies)",
    ),
    k(
        "custom-http-errors",
        Differs,
        "for Ingresses with a default-backend annotation (sluice has no global default backend) and no custom-http-errors of their own",
    ),
    k(
        "denylist-source-range",
        Honoured,
        "the denylist of every Ingress that sets no denylist-source-range of its own; an invalid value refuses every client (403) until it is mended",
    ),
    k(
        "enable-underscores-in-headers",
        Honoured,
        "client fields with _ in their names go upstream (dropped by default, as nginx)",
    ),
    k(
        "global-allowed-response-headers",
        Honoured,
        "the fields custom-headers ConfigMaps may set; framing fields (Content-Length, Transfer-Encoding, Connection, ...) never",
    ),
    k("global-auth-always-set-cookie", Honoured, GLOBAL),
    k("global-auth-cache-duration", Honoured, GLOBAL),
    k("global-auth-cache-key", Honoured, GLOBAL),
    k("global-auth-method", Honoured, GLOBAL),
    k(
        "global-auth-proxy-set-headers",
        Differs,
        "not read: every Ingress that would get global authentication answers 503",
    ),
    k("global-auth-request-redirect", Honoured, GLOBAL),
    k("global-auth-response-headers", Honoured, GLOBAL),
    k("global-auth-signin", Honoured, GLOBAL),
    k("global-auth-signin-redirect-param", Honoured, GLOBAL),
    k(
        "global-auth-snippet",
        Differs,
        "never executed: every Ingress that would get global authentication answers 503",
    ),
    k(
        "global-auth-url",
        Honoured,
        "as the auth-url annotation, for every Ingress without its own auth or enable-global-auth: \"false\"; an invalid value closes those Ingresses (503)",
    ),
    k(
        "hsts",
        Honoured,
        "for routes whose Ingress sets no sluice.dev/hsts",
    ),
    k("hsts-include-subdomains", Honoured, ""),
    k("hsts-max-age", Honoured, ""),
    k("hsts-preload", Honoured, ""),
    k(
        "keep-alive",
        Honoured,
        "seconds an idle client connection waits for its next request (0: no keep-alive); new connections take a change",
    ),
    k(
        "keep-alive-requests",
        Differs,
        "requests per HTTP/1 client connection, the last answered with Connection: close; HTTP/2 connections are not capped",
    ),
    k(
        "no-auth-locations",
        Honoured,
        "path prefixes global authentication skips (default /.well-known/acme-challenge)",
    ),
    k("proxy-body-size", Honoured, ""),
    k(
        "proxy-connect-timeout",
        Differs,
        "checked; the connect timeout is --upstream-connect-timeout-ms",
    ),
    k(
        "proxy-read-timeout",
        Differs,
        "bounds the wait for the response head, as the annotation",
    ),
    k(
        "proxy-send-timeout",
        Differs,
        "checked; writes to pods have sluice's own deadlines",
    ),
    k(
        "ssl-ciphers",
        Differs,
        "TLS 1.2 suites by their OpenSSL names, applied without a restart; names rustls has no suite for (DHE, CBC, RSA key exchange) are skipped with a warning, unknown names make the value invalid; TLS 1.3 suites are all offered",
    ),
    k(
        "ssl-protocols",
        Differs,
        "TLSv1.2 and/or TLSv1.3, applied without a restart; TLSv1 and TLSv1.1 are never served",
    ),
    k("ssl-redirect", Honoured, ""),
    k(
        "upstream-keepalive-timeout",
        Honoured,
        "seconds an idle connection to a pod may be reused; overrides --upstream-idle-timeout, without a restart",
    ),
    k(
        "use-forwarded-headers",
        Differs,
        "trusted only from --trusted-proxies",
    ),
    k(
        "use-proxy-protocol",
        Honoured,
        "overrides --proxy-protocol; applies to the next connection accepted",
    ),
    k(
        "whitelist-source-range",
        Honoured,
        "the allowlist of every Ingress that sets no whitelist-source-range of its own; an invalid value refuses every client (403) until it is mended",
    ),
];

/// The migration page's table of ConfigMap keys (`docs/migration.md`), from [`KEYS`].
pub fn markdown_table() -> String {
    catalog::table("ConfigMap key", KEYS.iter(), |k| format!("`{}`", k.name))
}

/// What the ConfigMap changed, and what it reported.
#[derive(Debug, Default)]
pub struct Applied {
    /// `(key, message)` for values that cannot be used (the default stays).
    pub invalid: Vec<(String, String)>,
    /// `key: note` for keys sluice does not honour as ingress-nginx does.
    pub not_honoured: Vec<String>,
}

fn bool_value(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

fn seconds(v: &str) -> Option<Duration> {
    let n: u64 = v
        .trim()
        .strip_suffix('s')
        .unwrap_or(v.trim())
        .parse()
        .ok()?;
    (1..=86_400).contains(&n).then(|| Duration::from_secs(n))
}

/// Applies a ConfigMap's data to `settings` (which hold the flags' values).
pub fn apply(data: &BTreeMap<String, String>, settings: &mut Settings) -> Applied {
    let mut out = Applied::default();
    let mut bad = |key: &str, why: &str| out.invalid.push((key.to_string(), why.to_string()));
    for (key, v) in data {
        match key.as_str() {
            "ssl-redirect" => match bool_value(v) {
                Some(b) => settings.ssl_redirect = b,
                None => bad(key, "is not \"true\" or \"false\""),
            },
            "keep-alive" => match v
                .trim()
                .strip_suffix('s')
                .unwrap_or(v.trim())
                .parse::<u64>()
            {
                // nginx's `keepalive_timeout 0` turns keep-alive off: one request each.
                Ok(0) => settings.keep_alive_requests = Some(1),
                Ok(n) if n <= 86_400 => settings.keep_alive = Some(Duration::from_secs(n)),
                _ => bad(key, "is not a number of seconds between 0 and 86400"),
            },
            "keep-alive-requests" => match v.trim().parse::<u32>() {
                Ok(n) if n > 0 => {
                    settings.keep_alive_requests =
                        Some(settings.keep_alive_requests.map_or(n, |m| m.min(n)));
                }
                _ => bad(key, "is not a whole number above 0"),
            },
            "upstream-keepalive-timeout" => match seconds(v) {
                Some(d) => settings.upstream_keepalive_timeout = Some(d),
                None => bad(key, "is not a number of seconds between 1 and 86400"),
            },
            "use-proxy-protocol" => match bool_value(v) {
                Some(b) => settings.proxy_protocol = Some(b),
                None => bad(key, "is not \"true\" or \"false\""),
            },
            "allow-cross-namespace-resources" => match bool_value(v) {
                Some(b) => settings.allow_cross_namespace = b,
                None => bad(key, "is not \"true\" or \"false\""),
            },
            "enable-underscores-in-headers" => match bool_value(v) {
                Some(b) => settings.underscores_in_headers = b,
                None => bad(key, "is not \"true\" or \"false\""),
            },
            "global-allowed-response-headers" => match allowed_list(v) {
                Ok(list) => settings.allowed_response_headers = list,
                Err(why) => bad(key, &why),
            },
            "proxy-body-size" => match nginx_size(v) {
                Some(n) => settings.limits.max_body_size = Some(n),
                None => bad(key, "is not a size (a number with an optional k, m or g)"),
            },
            "proxy-read-timeout" => match seconds(v) {
                Some(d) => settings.limits.read_timeout = Some(d),
                None => bad(key, "is not a number of seconds between 1 and 86400"),
            },
            "proxy-connect-timeout" | "proxy-send-timeout" if seconds(v).is_none() => {
                bad(key, "is not a number of seconds between 1 and 86400");
            }
            "hsts"
            | "hsts-include-subdomains"
            | "hsts-preload"
            | "allow-snippet-annotations"
            | "use-forwarded-headers"
            | "compute-full-forwarded-for"
                if bool_value(v).is_none() =>
            {
                bad(key, "is not \"true\" or \"false\"");
            }
            "hsts-max-age" if v.trim().parse::<u64>().is_err() => {
                bad(key, "is not a whole number of seconds");
            }
            _ => {}
        }
    }
    if let Some(v) = data.get("custom-http-errors") {
        let as_annotation = BTreeMap::from([(
            "nginx.ingress.kubernetes.io/custom-http-errors".to_string(),
            v.clone(),
        )]);
        match crate::annotations::traffic::custom_errors(&as_annotation) {
            Ok(codes) => settings.custom_errors = codes,
            Err(e) => out
                .invalid
                .push(("custom-http-errors".into(), e.message.clone())),
        }
    }
    global_auth(data, settings, &mut out);
    server_tls(data, settings, &mut out);
    source_ranges(data, settings, &mut out);
    // ingress-nginx's HSTS: on when `hsts` is true, one year, subdomains included unless said.
    if data.get("hsts").and_then(|v| bool_value(v)) == Some(true) {
        settings.hsts = Some(Hsts {
            max_age: data
                .get("hsts-max-age")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(31_536_000),
            include_subdomains: data
                .get("hsts-include-subdomains")
                .and_then(|v| bool_value(v))
                .unwrap_or(true),
            preload: data.get("hsts-preload").and_then(|v| bool_value(v)) == Some(true),
        });
    }
    for key in data.keys() {
        match KEYS.iter().find(|k| k.name == key) {
            None => out
                .not_honoured
                .push(format!("{key}: sluice does not know this key")),
            Some(k) if k.support != Support::Honoured => {
                out.not_honoured
                    .push(format!("{key} {}: {}", k.support.word(), k.note))
            }
            Some(_) => {}
        }
    }
    out
}

/// OpenSSL's names of the TLS 1.2 suites rustls has, with their IANA names.
const SUITES: &[(&str, &str)] = &[
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// OpenSSL cipher names rustls deliberately lacks (no forward secrecy, CBC, DHE): skipped
/// with a warning, so ingress-nginx's default list still reads.
fn known_unsupported(name: &str) -> bool {
    name.starts_with("DHE-")
        || name.starts_with("AES")
        || name.ends_with("-SHA")
        || name.ends_with("-SHA256") && name.contains("-CBC")
        || name.contains("-AES128-SHA")
        || name.contains("-AES256-SHA")
}

/// `ssl-protocols` and `ssl-ciphers`.
fn server_tls(data: &BTreeMap<String, String>, settings: &mut Settings, out: &mut Applied) {
    if let Some(v) = data.get("ssl-protocols") {
        let words: Vec<&str> = v.split_whitespace().collect();
        let unknown: Vec<&&str> = words
            .iter()
            .filter(|w| !matches!(**w, "TLSv1" | "TLSv1.1" | "TLSv1.2" | "TLSv1.3" | "SSLv3"))
            .collect();
        let (t12, t13) = (words.contains(&"TLSv1.2"), words.contains(&"TLSv1.3"));
        if !unknown.is_empty() {
            out.invalid.push((
                "ssl-protocols".into(),
                format!("{unknown:?} are not protocols (TLSv1.2, TLSv1.3)"),
            ));
        } else if !t12 && !t13 {
            out.invalid.push((
                "ssl-protocols".into(),
                "names neither TLSv1.2 nor TLSv1.3, the versions sluice serves".into(),
            ));
        } else {
            settings.server_tls.tls12 = Some(t12);
            settings.server_tls.tls13 = Some(t13);
        }
    }
    if let Some(v) = data.get("ssl-ciphers") {
        let mut suites = Vec::new();
        let mut skipped = Vec::new();
        let mut unknown = Vec::new();
        for name in v.split(':').map(str::trim).filter(|n| !n.is_empty()) {
            match SUITES.iter().find(|(o, _)| *o == name) {
                Some((_, iana)) => suites.push((*iana).to_string()),
                None if known_unsupported(name) => skipped.push(name),
                None => unknown.push(name),
            }
        }
        if !unknown.is_empty() {
            out.invalid.push((
                "ssl-ciphers".into(),
                format!(
                    "{unknown:?} are not cipher names sluice knows (it offers {})",
                    SUITES.iter().map(|(o, _)| *o).collect::<Vec<_>>().join(":")
                ),
            ));
        } else if suites.is_empty() {
            out.invalid.push((
                "ssl-ciphers".into(),
                "names no suite rustls has; the defaults stay".into(),
            ));
        } else {
            if !skipped.is_empty() {
                out.not_honoured.push(format!(
                    "ssl-ciphers: {} skipped (rustls has no such suite)",
                    skipped.join(":")
                ));
            }
            settings.server_tls.tls12_suites = Some(suites);
        }
    }
}

/// Every client: what an unreadable list of blocks stands for, so that every route answers 403
/// rather than serve the clients the list was written to keep out.
const EVERYONE: &str = "0.0.0.0/0,::/0";

/// `whitelist-source-range`, `denylist-source-range` and `block-cidrs`. An empty value is no
/// list (as in ingress-nginx); a list that cannot be read is reported, and every client is
/// refused until it is mended: a ConfigMap written to keep clients out never lets them in by a
/// typo.
fn source_ranges(data: &BTreeMap<String, String>, settings: &mut Settings, out: &mut Applied) {
    let everyone = || crate::cidr::Cidr::parse_list(EVERYONE).unwrap_or_default();
    let mut read = |key: &str| -> Option<Vec<crate::cidr::Cidr>> {
        let v = data.get(key)?;
        let why = match crate::cidr::Cidr::parse_list(v) {
            Ok(list) => return Some(list),
            Err(e) => e.to_string(),
        };
        out.invalid.push((
            key.to_string(),
            format!("{why}; every client is refused (403) until it is mended"),
        ));
        None
    };
    let mut unreadable = false;
    let mut list = |key: &str| {
        let l = read(key);
        unreadable |= l.is_none() && data.contains_key(key);
        l.unwrap_or_default()
    };
    let allow = list("whitelist-source-range");
    let deny = list("denylist-source-range");
    let block = list("block-cidrs");
    settings.source_ranges = crate::route_policy::SourceRanges { allow, deny };
    settings.block_cidrs = if unreadable { everyone() } else { block };
}

/// The `global-auth-*` keys as annotations, checked by the annotation readers; and
/// `no-auth-locations`.
fn global_auth(data: &BTreeMap<String, String>, settings: &mut Settings, out: &mut Applied) {
    if let Some(v) = data.get("no-auth-locations") {
        settings.no_auth_locations = v
            .split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
    }
    let map: BTreeMap<String, String> = GLOBAL_AUTH
        .iter()
        .filter_map(|(key, name)| {
            let v = data.get(*key)?;
            Some((
                format!("nginx.ingress.kubernetes.io/auth-{name}"),
                v.clone(),
            ))
        })
        .collect();
    if map.is_empty() {
        return;
    }
    if !map.contains_key("nginx.ingress.kubernetes.io/auth-url") {
        out.invalid.push((
            "global-auth-url".into(),
            "the other global-auth keys need it; they are ignored".into(),
        ));
        return;
    }
    if let Err(e) = crate::annotations::auth::auth(&map) {
        // Kept: the Ingresses it would protect answer 503 rather than serve open.
        out.invalid.push((
            e.name
                .replace("nginx.ingress.kubernetes.io/auth-", "global-auth-"),
            format!("{}; the Ingresses it would protect answer 503", e.message),
        ));
    }
    settings.global_auth = map;
}

#[cfg(test)]
mod tests_keep_alive {
    use super::*;

    #[test]
    fn keep_alive_zero_means_one_request_per_connection() {
        let mut s = Settings::default();
        let a = apply(
            &BTreeMap::from([
                ("keep-alive".to_string(), "0".to_string()),
                ("keep-alive-requests".to_string(), "100".to_string()),
            ]),
            &mut s,
        );
        assert!(a.invalid.is_empty(), "{:?}", a.invalid);
        assert_eq!((s.keep_alive, s.keep_alive_requests), (None, Some(1)));
        let mut s = Settings::default();
        let a = apply(
            &BTreeMap::from([("keep-alive-requests".to_string(), "0".to_string())]),
            &mut s,
        );
        assert_eq!(a.invalid.len(), 1);
        assert_eq!(s.keep_alive_requests, None);
    }
}

#[cfg(test)]
mod tests_tls {
    use super::*;

    fn apply_one(key: &str, v: &str) -> (Settings, Applied) {
        let mut s = Settings::default();
        let a = apply(&BTreeMap::from([(key.to_string(), v.to_string())]), &mut s);
        (s, a)
    }

    #[test]
    fn protocols_and_ciphers_read_as_nginx_writes_them() {
        let (s, a) = apply_one("ssl-protocols", "TLSv1.2 TLSv1.3");
        assert!(a.invalid.is_empty());
        assert_eq!(
            (s.server_tls.tls12, s.server_tls.tls13),
            (Some(true), Some(true))
        );
        let (s, _) = apply_one("ssl-protocols", "TLSv1.3");
        assert_eq!(
            (s.server_tls.tls12, s.server_tls.tls13),
            (Some(false), Some(true))
        );
        let (s, a) = apply_one("ssl-protocols", "TLSv1 TLSv1.1");
        assert_eq!(a.invalid.len(), 1);
        assert_eq!(s.server_tls, crate::model::ServerTls::default());
        let (_, a) = apply_one("ssl-protocols", "TLSv1.3 QUIC");
        assert_eq!(a.invalid.len(), 1);
        // ingress-nginx's default list: its DHE suites are skipped, the rest kept in order.
        let (s, a) = apply_one(
            "ssl-ciphers",
            "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384",
        );
        assert!(a.invalid.is_empty(), "{:?}", a.invalid);
        assert_eq!(s.server_tls.tls12_suites.as_ref().map(Vec::len), Some(6));
        assert!(
            a.not_honoured
                .iter()
                .any(|n| n.contains("DHE-RSA-AES128-GCM-SHA256"))
        );
        let (s, a) = apply_one("ssl-ciphers", "HIGH:!aNULL");
        assert_eq!(a.invalid.len(), 1);
        assert_eq!(s.server_tls.tls12_suites, None);
        let (_, a) = apply_one("ssl-ciphers", "DHE-RSA-AES128-GCM-SHA256");
        assert_eq!(a.invalid.len(), 1, "nothing left to offer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keys_are_sorted_and_unique() {
        let names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn values_override_the_flags_and_bad_ones_do_not() {
        let mut s = Settings::default();
        let a = apply(
            &data(&[
                ("ssl-redirect", "false"),
                ("proxy-body-size", "8m"),
                ("proxy-read-timeout", "30"),
                ("hsts", "true"),
                ("hsts-max-age", "600"),
                ("keep-alive", "75"),
                ("made-up", "1"),
            ]),
            &mut s,
        );
        assert!(!s.ssl_redirect);
        assert_eq!(s.limits.max_body_size, Some(8 << 20));
        assert_eq!(s.limits.read_timeout, Some(Duration::from_secs(30)));
        assert_eq!(
            s.hsts,
            Some(Hsts {
                max_age: 600,
                include_subdomains: true,
                preload: false
            })
        );
        assert!(a.invalid.is_empty(), "{:?}", a.invalid);
        assert_eq!(s.keep_alive, Some(Duration::from_secs(75)));
        assert_eq!(a.not_honoured.len(), 2, "{:?}", a.not_honoured);

        let mut s = Settings::default();
        let a = apply(
            &data(&[
                ("ssl-redirect", "maybe"),
                ("proxy-body-size", "huge"),
                ("proxy-send-timeout", "0"),
                ("hsts", "false"),
            ]),
            &mut s,
        );
        assert_eq!(s, Settings::default());
        let keys: Vec<&str> = a.invalid.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["proxy-body-size", "proxy-send-timeout", "ssl-redirect"]
        );
    }
}
