//! A route's ingress-nginx edits and its canary, compiled for request time: header values
//! checked once, regular expressions built once, so a request only matches and copies.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Uri};
use regex::Regex;
use sluice_config::path::{expand, path_regex};
use sluice_config::route_policy::{Canary, HeaderRule, RouteEdits, SameSite};
use sluice_config::{PathKind, PathMatch};

use crate::upstream::balance::cookie;

/// The compiled [`RouteEdits`] of a route.
#[derive(Debug)]
pub struct Edits {
    /// Answer with this redirect (status, `Location`).
    pub redirect: Option<(StatusCode, HeaderValue)>,
    /// `app-root`: where `/` is redirected (302).
    pub app_root: Option<String>,
    /// `rewrite-target`: the route's expression and the template.
    pub rewrite: Option<(Regex, String)>,
    /// `X-Forwarded-Prefix` to send.
    pub forwarded_prefix: Option<HeaderValue>,
    /// `Host` to send.
    pub upstream_vhost: Option<HeaderValue>,
    /// The session cookie of `affinity: cookie`.
    pub affinity: Option<SessionCookie>,
    /// `whitelist-source-range` / `denylist-source-range`.
    pub source_ranges: Option<sluice_config::route_policy::SourceRanges>,
    /// `enable-cors`.
    pub cors: Option<Cors>,
    /// `from-to-www-redirect`: the host this twin host redirects to.
    pub host_redirect: Option<String>,
    /// `custom-http-errors`: upstream statuses replaced by the default backend's answer.
    pub custom_errors: Vec<u16>,
    /// `satisfy: any`: a client the source ranges admit skips authentication.
    pub satisfy_any: bool,
    /// `limit-rate`, `limit-rate-after`.
    pub bandwidth: Option<sluice_config::route_policy::Bandwidth>,
    /// `custom-headers`: set on the route's answers, replacing the pod's fields of the name.
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
}

/// CORS, compiled: header values checked once.
#[derive(Debug)]
pub struct Cors {
    any_origin: bool,
    origins: Vec<String>,
    methods: HeaderValue,
    headers: HeaderValue,
    expose: Option<HeaderValue>,
    credentials: bool,
    max_age: HeaderValue,
}

impl Cors {
    fn compile(c: &sluice_config::route_policy::Cors) -> Option<Self> {
        Some(Self {
            any_origin: c.origins.iter().any(|o| o == "*"),
            origins: c.origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
            methods: HeaderValue::from_str(&c.methods).ok()?,
            headers: HeaderValue::from_str(&c.headers).ok()?,
            expose: (!c.expose.is_empty())
                .then(|| HeaderValue::from_str(&c.expose).ok())
                .flatten(),
            credentials: c.credentials,
            max_age: HeaderValue::from(c.max_age),
        })
    }

    /// The `Access-Control-Allow-Origin` for a request's `Origin`: `*` when any origin is
    /// allowed, the origin itself when it is listed (`https://*.b.test` takes one label), else
    /// `None` (the request gets no CORS fields, as in ingress-nginx).
    pub fn allow_origin(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.any_origin {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin?.to_str().ok()?.to_ascii_lowercase();
        let listed = self
            .origins
            .iter()
            .any(|want| match want.split_once("://*.") {
                Some((scheme, suffix)) => o
                    .strip_prefix(scheme)
                    .and_then(|r| r.strip_prefix("://"))
                    .and_then(|host| host.strip_suffix(suffix))
                    .and_then(|label| label.strip_suffix('.'))
                    .is_some_and(|label| !label.is_empty() && !label.contains('.')),
                None => *want == o,
            });
        listed.then(|| origin.cloned()).flatten()
    }

    /// Adds the CORS fields for an allowed origin; a preflight also gets the max age.
    pub fn apply(&self, h: &mut HeaderMap, allow_origin: HeaderValue, preflight: bool) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
        if self.credentials {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, self.headers.clone());
        if let Some(v) = &self.expose {
            h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
        }
        if preflight {
            h.insert(header::ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
        }
    }
}

/// The session cookie, compiled: its name and the attributes after the value.
#[derive(Debug)]
pub struct SessionCookie {
    name: String,
    /// `; Path=..; Max-Age=..; ...; HttpOnly...` without `Expires`, which depends on the time.
    attributes: String,
    expires: Option<std::time::Duration>,
}

impl SessionCookie {
    fn compile(c: &sluice_config::route_policy::SessionCookie, path: &PathMatch) -> Self {
        use std::fmt::Write as _;
        let route_path = match path.kind {
            PathKind::Regex => "/",
            _ if path.path.is_empty() => "/",
            _ => path.path.as_str(),
        };
        let mut attributes = format!("; Path={}", c.path.as_deref().unwrap_or(route_path));
        if let Some(d) = &c.domain {
            let _ = write!(attributes, "; Domain={d}");
        }
        if let Some(n) = c.max_age {
            let _ = write!(attributes, "; Max-Age={n}");
        }
        attributes.push_str("; HttpOnly");
        if c.secure {
            attributes.push_str("; Secure");
        }
        if let Some(s) = c.samesite {
            attributes.push_str(match s {
                SameSite::None => "; SameSite=None",
                SameSite::Lax => "; SameSite=Lax",
                SameSite::Strict => "; SameSite=Strict",
            });
        }
        Self {
            name: c.name.clone(),
            attributes,
            expires: c.expires.map(std::time::Duration::from_secs),
        }
    }

    /// A new session value: 128 random bits in hex.
    pub fn new_value() -> String {
        format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
    }

    /// Whether the request already carries the cookie (in any `Cookie` field).
    pub fn present(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(header::COOKIE)
            .iter()
            .any(|v| cookie(v.as_bytes(), &self.name).is_some_and(|c| !c.is_empty()))
    }

    /// The `Set-Cookie` value for a new session.
    pub fn set_cookie(&self, value: &str, now: std::time::SystemTime) -> Option<HeaderValue> {
        let mut v = format!("{}={value}{}", self.name, self.attributes);
        if let Some(e) = self.expires {
            v.push_str("; Expires=");
            v.push_str(&httpdate::fmt_http_date(now + e));
        }
        HeaderValue::from_str(&v).ok()
    }
}

impl Edits {
    /// Compiles a route's edits; `None` when it has none (the common case keeps the direct
    /// path). Values were checked by translation; one that still cannot be a header value is
    /// dropped rather than sent.
    pub fn compile(e: &RouteEdits, path: &PathMatch) -> Option<Box<Self>> {
        if e.is_empty() {
            return None;
        }
        let value = |v: &Option<String>| v.as_deref().and_then(|v| HeaderValue::from_str(v).ok());
        let rewrite = match (&e.rewrite_target, path.kind) {
            // nginx runs `rewrite "(?i)path" target` on the URI: the route's own expression.
            (Some(t), PathKind::Regex) => path_regex(&path.path).ok().map(|re| (re, t.clone())),
            _ => None,
        };
        Some(Box::new(Self {
            redirect: e.redirect.as_ref().and_then(|r| {
                Some((
                    StatusCode::from_u16(r.code).ok()?,
                    HeaderValue::from_str(&r.location).ok()?,
                ))
            }),
            app_root: e.app_root.clone(),
            rewrite,
            forwarded_prefix: value(&e.forwarded_prefix),
            upstream_vhost: value(&e.upstream_vhost),
            affinity: e.affinity.as_ref().map(|c| SessionCookie::compile(c, path)),
            source_ranges: e.source_ranges.clone(),
            cors: e.cors.as_ref().and_then(Cors::compile),
            host_redirect: e.host_redirect.clone(),
            custom_errors: e.custom_errors.clone(),
            satisfy_any: e.satisfy_any,
            bandwidth: e.bandwidth,
            response_headers: e
                .response_headers
                .iter()
                .filter_map(|(n, v)| {
                    Some((
                        HeaderName::from_bytes(n.as_bytes()).ok()?,
                        HeaderValue::from_str(v).ok()?,
                    ))
                })
                .collect(),
        }))
    }

    /// Sets the `custom-headers` fields on an answer, replacing any of the same name (nginx's
    /// `more_set_headers`).
    pub fn set_response_headers(&self, headers: &mut http::HeaderMap) {
        for (n, v) in &self.response_headers {
            headers.insert(n.clone(), v.clone());
        }
    }

    /// Edits a request on its way upstream: the rewritten target, `Host` from
    /// `upstream-vhost`, `X-Forwarded-Prefix`.
    pub fn apply(&self, parts: &mut http::request::Parts) {
        if let Some(uri) = self.rewritten(&parts.uri) {
            parts.uri = uri;
        }
        if let Some(v) = &self.upstream_vhost {
            parts.headers.insert(header::HOST, v.clone());
        }
        if let Some(v) = &self.forwarded_prefix {
            parts
                .headers
                .insert(HeaderName::from_static("x-forwarded-prefix"), v.clone());
        }
    }

    /// The request target after `rewrite-target`: the path replaced by the template (its
    /// captures expanded), the client's query kept after any query the template adds, as
    /// nginx's `rewrite` does. `None` when the route does not rewrite or its expression does
    /// not match (the request then goes as it came), or the result is not a valid target.
    pub fn rewritten(&self, uri: &Uri) -> Option<Uri> {
        let (re, template) = self.rewrite.as_ref()?;
        // On the route view, as the route itself was matched (`/app%2Fx` is `/app/x` to both),
        // so a route that matched is always rewritten.
        let view = sluice_config::request_path::route_view(uri.path());
        let caps = re.captures(&view)?;
        let mut out = String::with_capacity(template.len() + uri.path().len());
        expand(template, &caps, &mut out);
        if let Some(q) = uri.query() {
            out.push(if out.contains('?') { '&' } else { '?' });
            out.push_str(q);
        }
        out.parse().ok()
    }
}

/// How a request's header selects the canary.
#[derive(Debug)]
enum HeaderMatch {
    AlwaysNever,
    Value(Vec<u8>),
    Pattern(Regex),
}

/// The compiled selection rules of a canary (ingress-nginx's order: header, cookie, weight).
#[derive(Debug)]
pub struct CanaryRule {
    header: Option<(HeaderName, HeaderMatch)>,
    cookie: Option<String>,
    weight: u32,
    total: u32,
}

impl CanaryRule {
    /// Compiles the rules; `None` when a header name or pattern cannot be used (translation
    /// checked both, so this is defence only: the canary then takes no traffic).
    pub fn compile(c: &Canary) -> Option<Self> {
        let header = match &c.header {
            None => None,
            Some((name, rule)) => Some((
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                match rule {
                    HeaderRule::AlwaysNever => HeaderMatch::AlwaysNever,
                    HeaderRule::Value(v) => HeaderMatch::Value(v.as_bytes().to_vec()),
                    HeaderRule::Pattern(p) => HeaderMatch::Pattern(Regex::new(p).ok()?),
                },
            )),
        };
        Some(Self {
            header,
            cookie: c.cookie.clone(),
            weight: c.weight,
            total: c.weight_total.max(1),
        })
    }

    /// Whether this request goes to the canary. `roll` gives a number in `1..=total` (random
    /// in service; fixed in tests).
    pub fn selects(&self, headers: &HeaderMap, roll: impl FnOnce(u32) -> u32) -> bool {
        if let Some((name, rule)) = &self.header
            && let Some(v) = headers.get(name)
        {
            let v = v.as_bytes();
            match rule {
                HeaderMatch::Value(want) if v == want.as_slice() => return true,
                HeaderMatch::Pattern(re)
                    if std::str::from_utf8(v).is_ok_and(|s| re.is_match(s)) =>
                {
                    return true;
                }
                HeaderMatch::AlwaysNever if v == b"always" => return true,
                HeaderMatch::AlwaysNever if v == b"never" => return false,
                _ => {}
            }
        }
        if let Some(name) = &self.cookie {
            for h in headers.get_all(header::COOKIE) {
                match cookie(h.as_bytes(), name) {
                    Some(b"always") => return true,
                    Some(b"never") => return false,
                    _ => {}
                }
            }
        }
        self.weight > 0 && roll(self.total) <= self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::route_policy::Redirect;
    use sluice_config::{ObjectRef, RouteAction};

    fn canary(header: Option<(&str, HeaderRule)>, cookie: Option<&str>, weight: u32) -> CanaryRule {
        CanaryRule::compile(&Canary {
            action: RouteAction::Unavailable(String::new()),
            source: ObjectRef::new("Ingress", "default", "c"),
            header: header.map(|(n, r)| (n.to_string(), r)),
            cookie: cookie.map(str::to_string),
            weight,
            weight_total: 100,
        })
        .unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// The order and the fall-throughs of ingress-nginx's `route_to_alternative_balancer`.
    #[test]
    fn header_then_cookie_then_weight() {
        let never_roll = |_| 101;
        let always_roll = |_| 1;
        let plain = canary(Some(("x-canary", HeaderRule::AlwaysNever)), Some("c"), 0);
        assert!(plain.selects(&headers(&[("x-canary", "always")]), never_roll));
        assert!(!plain.selects(
            &headers(&[("x-canary", "never"), ("cookie", "c=always")]),
            always_roll
        ));
        // Another value falls through to the cookie.
        assert!(plain.selects(
            &headers(&[("x-canary", "maybe"), ("cookie", "a=1; c=always")]),
            never_roll
        ));
        assert!(!plain.selects(&headers(&[("cookie", "c=never")]), always_roll));
        // Weight 0 never selects, whatever the roll.
        assert!(!plain.selects(&headers(&[]), always_roll));

        let by_value = canary(Some(("x-canary", HeaderRule::Value("v2".into()))), None, 10);
        assert!(by_value.selects(&headers(&[("x-canary", "v2")]), never_roll));
        // With a value rule, `always` is just another value: on to the weight.
        assert!(!by_value.selects(&headers(&[("x-canary", "always")]), never_roll));
        assert!(by_value.selects(&headers(&[("x-canary", "never")]), always_roll));
        assert!(by_value.selects(&headers(&[]), |_| 10));
        assert!(!by_value.selects(&headers(&[]), |_| 11));

        let by_pattern = canary(
            Some(("x-user", HeaderRule::Pattern("^beta-".into()))),
            None,
            0,
        );
        assert!(by_pattern.selects(&headers(&[("x-user", "beta-7")]), never_roll));
        assert!(!by_pattern.selects(&headers(&[("x-user", "gamma")]), always_roll));
        // HTTP/2 clients may split cookies over several fields.
        let by_cookie = canary(None, Some("c"), 0);
        assert!(by_cookie.selects(
            &headers(&[("cookie", "a=1"), ("cookie", "c=always")]),
            never_roll
        ));
    }

    #[test]
    fn cors_origins() {
        let c = |origins: &[&str]| {
            Cors::compile(&sluice_config::route_policy::Cors {
                origins: origins.iter().map(|s| s.to_string()).collect(),
                methods: "GET".into(),
                headers: "X".into(),
                expose: String::new(),
                credentials: true,
                max_age: 5,
            })
            .unwrap()
        };
        let o = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(c(&["*"]).allow_origin(None), Some(o("*")));
        let list = c(&["https://a.test", "https://*.b.test"]);
        for (origin, ok) in [
            ("https://a.test", true),
            ("https://A.TEST", true),
            ("http://a.test", false),
            ("https://x.b.test", true),
            ("https://x.y.b.test", false),
            ("https://b.test", false),
            ("https://evilb.test", false),
            ("https://a.test.evil", false),
        ] {
            assert_eq!(
                list.allow_origin(Some(&o(origin))).is_some(),
                ok,
                "{origin}"
            );
        }
        assert_eq!(list.allow_origin(None), None);
    }

    #[test]
    fn session_cookie_attributes() {
        let c = sluice_config::route_policy::SessionCookie {
            name: "route".into(),
            path: None,
            domain: Some("example.test".into()),
            max_age: Some(60),
            expires: Some(3600),
            samesite: Some(SameSite::Strict),
            secure: true,
        };
        let path = PathMatch {
            kind: PathKind::Prefix,
            path: "/app".into(),
        };
        let s = SessionCookie::compile(&c, &path);
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(
            s.set_cookie("abc", at).unwrap(),
            "route=abc; Path=/app; Domain=example.test; Max-Age=60; HttpOnly; Secure; SameSite=Strict; Expires=Tue, 14 Nov 2023 23:13:20 GMT"
        );
        assert!(s.present(&headers(&[("cookie", "a=1"), ("cookie", "route=x")])));
        assert!(!s.present(&headers(&[("cookie", "route=")])));
        assert_eq!(SessionCookie::new_value().len(), 32);
        assert_ne!(SessionCookie::new_value(), SessionCookie::new_value());
    }

    #[test]
    fn rewrites_keep_the_query_after_the_template() {
        let path = PathMatch {
            kind: PathKind::Regex,
            path: "/something(/|$)(.*)".into(),
        };
        let e = Edits::compile(
            &RouteEdits {
                rewrite_target: Some("/$2".into()),
                ..RouteEdits::default()
            },
            &path,
        )
        .unwrap();
        let r = |u: &str| e.rewritten(&u.parse().unwrap()).map(|u| u.to_string());
        assert_eq!(r("/something/a/b?x=1").as_deref(), Some("/a/b?x=1"));
        assert_eq!(r("/something").as_deref(), Some("/"));
        assert_eq!(r("/other"), None);
        let e = Edits::compile(
            &RouteEdits {
                rewrite_target: Some("/v2/$2?from=edge".into()),
                redirect: Some(Redirect {
                    code: 308,
                    location: "https://x.test/".into(),
                }),
                ..RouteEdits::default()
            },
            &path,
        )
        .unwrap();
        assert_eq!(
            e.rewritten(&"/something/a?x=1".parse().unwrap())
                .map(|u| u.to_string())
                .as_deref(),
            Some("/v2/a?from=edge&x=1")
        );
        assert_eq!(e.redirect.as_ref().map(|r| r.0.as_u16()), Some(308));
        assert!(Edits::compile(&RouteEdits::default(), &path).is_none());
    }
}
