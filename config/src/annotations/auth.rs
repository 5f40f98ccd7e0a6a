//! The authentication annotations: `auth-type: basic` with `auth-secret`, `auth-secret-type` and
//! `auth-realm`; `auth-url` with `auth-method`, `auth-signin`, `auth-signin-redirect-param`,
//! `auth-response-headers`, `auth-request-redirect`, `auth-always-set-cookie`; and `satisfy`.
//! These read the annotations only; translation finds the Secret and the Service they name
//! (`translate::auth`). Any value that cannot be read keeps the route closed.

use std::collections::BTreeMap;

pub use super::SecretName;
use super::{AnnotationError, err, first, secret_name};
use crate::route_policy::ExternalOptions;

/// Where `auth-url` points, and the path (with its query) the subrequest asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUrl {
    /// The URL as written.
    pub url: String,
    /// Who answers.
    pub target: AuthHost,
    /// Path and query of the subrequest.
    pub path: String,
    /// For a named host that is not a Service: the scheme, host and port the URL names, for
    /// a call outside the cluster when the operator allows that host (`--auth-url-allow`).
    pub origin: Option<crate::route_policy::Origin>,
}

/// Who answers an `auth-url` subrequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthHost {
    /// `http://SERVICE.NAMESPACE.svc[.cluster.local][:PORT]`: that Service's pool.
    Service {
        /// The Service.
        service: String,
        /// Its namespace.
        namespace: String,
        /// The port (80 when the URL gives none).
        port: u16,
    },
    /// Any other host, or `$host` (`None`): whatever sluice's own routes send that host and
    /// path to, as oauth2-proxy's `https://$host/oauth2/auth` does through ingress-nginx.
    Routed(Option<String>),
}

/// What the authentication annotations of one Ingress ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthSpec {
    /// `auth-type: basic` or `digest`.
    Basic {
        /// `digest` (else `basic`).
        digest: bool,
        /// `auth-secret`.
        secret: SecretName,
        /// `auth-secret-type: auth-map` (else `auth-file`).
        map: bool,
        /// `auth-realm`.
        realm: String,
    },
    /// `auth-url` and its companions.
    External {
        /// `auth-url`.
        url: AuthUrl,
        /// The companions.
        options: Box<ExternalOptions>,
    },
}

/// The realm sent when `auth-realm` is not set.
pub const DEFAULT_REALM: &str = "Authentication Required";

/// A value sluice puts into a header as it is: visible ASCII and spaces.
fn header_text(name: &'static str, v: &str) -> Result<String, AnnotationError> {
    if v.bytes().all(|b| (0x20..0x7f).contains(&b)) && !v.contains('"') {
        Ok(v.to_string())
    } else {
        Err(err(
            name,
            format!("{v:?} must be visible ASCII without quotes"),
        ))
    }
}

/// A URL sluice sends as a `Location` (`auth-signin`, `auth-tls-error-page`): absolute
/// `http(s)://` or a path, visible ASCII.
pub(super) fn location(
    a: &BTreeMap<String, String>,
    names: &[&'static str],
) -> Result<Option<String>, AnnotationError> {
    let Some((n, v)) = first(a, names) else {
        return Ok(None);
    };
    let ok = (v.starts_with("http://") || v.starts_with("https://") || v.starts_with('/'))
        && v.bytes().all(|b| (0x21..0x7f).contains(&b));
    if !ok {
        return Err(err(n, format!("{v:?} is not a URL")));
    }
    Ok(Some(v.to_string()))
}

/// Reads `auth-url`: `http://SERVICE.NAMESPACE.svc[.cluster.local][:PORT][/path]` for a
/// Service, or `http(s)://HOST/path` (`$host`: the request's) for a host sluice routes.
fn auth_url(name: &'static str, v: &str) -> Result<AuthUrl, AnnotationError> {
    let (https, rest) = match (v.strip_prefix("http://"), v.strip_prefix("https://")) {
        (Some(r), _) => (false, r),
        (_, Some(r)) => (true, r),
        _ => {
            return Err(err(
                name,
                format!("{v:?} is not an http:// or https:// URL"),
            ));
        }
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path
    };
    if path
        .bytes()
        .any(|b| !(0x21..0x7f).contains(&b) || b == b'$')
    {
        return Err(err(
            name,
            format!("{v:?}: the path must be visible ASCII without variables"),
        ));
    }
    if authority.contains('@') {
        // The value is not repeated: it holds a password.
        return Err(err(
            name,
            "user information (user:password@) in the URL is not supported (nginx does not \
             send it either); pass credentials with auth-proxy-set-headers"
                .to_string(),
        ));
    }
    if matches!(authority, "$host" | "$http_host") {
        return Ok(AuthUrl {
            url: v.to_string(),
            target: AuthHost::Routed(None),
            path,
            origin: None,
        });
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| err(name, format!("{v:?}: {p:?} is not a port")))?,
        ),
        None => (authority, if https { 443 } else { 80 }),
    };
    let host = host.to_ascii_lowercase();
    let dns_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if !host.split('.').all(dns_label) {
        return Err(err(name, format!("{v:?}: {host:?} is not a host name")));
    }
    let service = host
        .strip_suffix(".svc.cluster.local")
        .or_else(|| host.strip_suffix(".svc"));
    let target = match service.map(|s| s.split('.').collect::<Vec<_>>()).as_deref() {
        Some([svc, ns]) if !https => AuthHost::Service {
            service: svc.to_string(),
            namespace: ns.to_string(),
            port,
        },
        Some(_) if https => {
            return Err(err(
                name,
                format!(
                    "{v:?}: https to a Service is not supported (its pool speaks HTTP); use http://"
                ),
            ));
        }
        Some(_) => {
            return Err(err(
                name,
                format!("{v:?}: a Service is named SERVICE.NAMESPACE.svc[.cluster.local]"),
            ));
        }
        None => AuthHost::Routed(Some(host.clone())),
    };
    let origin = matches!(target, AuthHost::Routed(_)).then(|| crate::route_policy::Origin {
        https,
        host,
        port,
    });
    Ok(AuthUrl {
        url: v.to_string(),
        target,
        path,
        origin,
    })
}

/// `satisfy`: `true` for `any` (source ranges or authentication), `false` for `all` (the
/// default).
pub fn satisfy_any(a: &BTreeMap<String, String>) -> Result<bool, AnnotationError> {
    match first(a, &both!("satisfy")) {
        None => Ok(false),
        Some((_, v)) if v.eq_ignore_ascii_case("all") => Ok(false),
        Some((_, v)) if v.eq_ignore_ascii_case("any") => Ok(true),
        Some((name, v)) => Err(err(name, format!("{v:?} is not \"all\" or \"any\""))),
    }
}

/// The authentication an Ingress asks for; `None` without `auth-type` and `auth-url`.
pub fn auth(a: &BTreeMap<String, String>) -> Result<Option<AuthSpec>, AnnotationError> {
    let kind = first(a, &both!("auth-type"));
    let url = first(a, &both!("auth-url"));
    match (kind, url) {
        (None, None) => {
            if let Some((name, _)) = first(a, &both!("auth-secret")) {
                return Err(err(
                    name,
                    "set without auth-type: basic, so it protects nothing; the route stays closed until one is set",
                ));
            }
            Ok(None)
        }
        (Some(_), Some((name, _))) => Err(err(
            name,
            "auth-url and auth-type are both set; sluice enforces one authentication per route",
        )),
        (Some((name, v)), None) => basic(a, name, v).map(Some),
        (None, Some((name, v))) => external(a, name, v).map(Some),
    }
}

fn basic(
    a: &BTreeMap<String, String>,
    name: &'static str,
    kind: &str,
) -> Result<AuthSpec, AnnotationError> {
    let digest = kind.eq_ignore_ascii_case("digest");
    if !digest && !kind.eq_ignore_ascii_case("basic") {
        return Err(err(
            name,
            format!("{kind:?} is not \"basic\" or \"digest\""),
        ));
    }
    let (sname, s) = first(a, &both!("auth-secret"))
        .ok_or_else(|| err(name, "basic needs auth-secret, the Secret with the users"))?;
    let secret = secret_name(sname, s)?;
    let map = match first(a, &both!("auth-secret-type")) {
        None => false,
        Some((_, "auth-file")) => false,
        Some((_, "auth-map")) => true,
        Some((n, v)) => {
            return Err(err(
                n,
                format!("{v:?} is not \"auth-file\" or \"auth-map\""),
            ));
        }
    };
    let realm = match first(a, &both!("auth-realm")) {
        Some((n, v)) => header_text(n, v)?,
        None => DEFAULT_REALM.to_string(),
    };
    if digest && map {
        return Err(err(
            name,
            "digest reads an htdigest file (auth-secret-type: auth-file), not an auth-map",
        ));
    }
    Ok(AuthSpec::Basic {
        digest,
        secret,
        map,
        realm,
    })
}

fn external(
    a: &BTreeMap<String, String>,
    name: &'static str,
    v: &str,
) -> Result<AuthSpec, AnnotationError> {
    let url = auth_url(name, v)?;
    let method = match first(a, &both!("auth-method")) {
        None => None,
        Some((n, m)) => {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(err(n, format!("{m:?} is not a method such as GET")));
            }
            Some(m.to_string())
        }
    };
    let signin = location(a, &both!("auth-signin"))?;
    let signin_redirect_param = match first(a, &both!("auth-signin-redirect-param")) {
        None => "rd".to_string(),
        Some((n, p)) => {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(err(n, format!("{p:?} is not a query parameter name")));
            }
            p.to_string()
        }
    };
    let response_headers = match first(a, &both!("auth-response-headers")) {
        None => Vec::new(),
        Some((n, list)) => list
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| {
                let lower = h.to_ascii_lowercase();
                if !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    Err(err(n, format!("{h:?} is not a header name")))
                } else if super::headers::FRAMING.contains(&lower.as_str()) {
                    // Copied onto the request after its hop-by-hop fields are gone: an auth
                    // service must not frame or re-address what the pod receives.
                    Err(err(
                        n,
                        format!("{h} frames or addresses the request and is never copied from the auth service"),
                    ))
                } else {
                    Ok(lower)
                }
            })
            .collect::<Result<_, _>>()?,
    };
    let request_redirect = match first(a, &both!("auth-request-redirect")) {
        None => None,
        Some((n, r)) => Some(header_text(n, r)?),
    };
    let options = ExternalOptions {
        method,
        signin,
        signin_redirect_param,
        response_headers,
        request_redirect,
        always_set_cookie: super::traffic::flag(a, &both!("auth-always-set-cookie"))?
            .unwrap_or(false),
        cache: super::auth_cache::auth_cache(a)?,
    };
    Ok(AuthSpec::External {
        url,
        options: Box::new(options),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::nginx_annotations as ann;

    #[test]
    fn basic_reads_secret_type_and_realm() {
        let got = auth(&ann(&[
            ("auth-type", "basic"),
            ("auth-secret", "basic-auth"),
            ("auth-realm", "Authentication Required - foo"),
        ]));
        assert_eq!(
            got,
            Ok(Some(AuthSpec::Basic {
                digest: false,
                secret: SecretName {
                    namespace: None,
                    name: "basic-auth".into()
                },
                map: false,
                realm: "Authentication Required - foo".into(),
            }))
        );
        let got = auth(&ann(&[
            ("auth-type", "basic"),
            ("auth-secret", "other/users"),
            ("auth-secret-type", "auth-map"),
        ]));
        assert!(matches!(
            got,
            Ok(Some(AuthSpec::Basic { secret: SecretName { namespace: Some(ns), .. }, map: true, realm, digest: false }))
                if ns == "other" && realm == DEFAULT_REALM
        ));
    }

    #[test]
    fn unreadable_basic_settings_are_errors() {
        for bad in [
            vec![("auth-type", "basic")],
            vec![
                ("auth-type", "digest"),
                ("auth-secret", "s"),
                ("auth-secret-type", "auth-map"),
            ],
            vec![("auth-type", "kerberos"), ("auth-secret", "s")],
            vec![("auth-type", "basic"), ("auth-secret", "a/b/c")],
            vec![("auth-type", "basic"), ("auth-secret", "/b")],
            vec![
                ("auth-type", "basic"),
                ("auth-secret", "s"),
                ("auth-secret-type", "ldap"),
            ],
            vec![
                ("auth-type", "basic"),
                ("auth-secret", "s"),
                ("auth-realm", "a\"b"),
            ],
            vec![("auth-secret", "s")],
            vec![
                ("auth-type", "basic"),
                ("auth-secret", "s"),
                ("auth-url", "http://a.b.svc/"),
            ],
        ] {
            assert!(auth(&ann(&bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn auth_url_names_a_service() {
        let got = auth(&ann(&[
            (
                "auth-url",
                "http://oauth2-proxy.auth.svc.cluster.local:4180/oauth2/auth?x=1",
            ),
            ("auth-signin", "https://auth.example.com/oauth2/start"),
            (
                "auth-response-headers",
                "X-Auth-Request-User, X-Auth-Request-Email",
            ),
            ("auth-method", "POST"),
        ]));
        let Ok(Some(AuthSpec::External { url, options })) = got else {
            panic!("{got:?}");
        };
        let ExternalOptions {
            method,
            signin,
            signin_redirect_param,
            response_headers,
            always_set_cookie,
            ..
        } = *options;
        assert_eq!(
            url.target,
            AuthHost::Service {
                service: "oauth2-proxy".into(),
                namespace: "auth".into(),
                port: 4180
            }
        );
        assert_eq!(url.path, "/oauth2/auth?x=1");
        assert_eq!(method.as_deref(), Some("POST"));
        assert_eq!(
            signin.as_deref(),
            Some("https://auth.example.com/oauth2/start")
        );
        assert_eq!(signin_redirect_param, "rd");
        assert_eq!(
            response_headers,
            ["x-auth-request-user", "x-auth-request-email"]
        );
        assert!(!always_set_cookie);
        for (url, target, path) in [
            (
                "http://a.b.svc",
                AuthHost::Service {
                    service: "a".into(),
                    namespace: "b".into(),
                    port: 80,
                },
                "/",
            ),
            (
                "http://A.B.svc:81?q",
                AuthHost::Service {
                    service: "a".into(),
                    namespace: "b".into(),
                    port: 81,
                },
                "/?q",
            ),
            (
                "https://$host/oauth2/auth",
                AuthHost::Routed(None),
                "/oauth2/auth",
            ),
            (
                "https://auth.example.com/check",
                AuthHost::Routed(Some("auth.example.com".into())),
                "/check",
            ),
        ] {
            let got = auth_url("n", url);
            assert_eq!(
                got.as_ref().map(|u| (&u.target, u.path.as_str())),
                Ok((&target, path)),
                "{url}"
            );
        }
    }

    #[test]
    fn auth_url_outside_the_cluster_or_malformed_is_an_error() {
        for bad in [
            "https://a.b.svc/",
            "http://a.b.c.svc/",
            "http://a.b.svc:0/",
            "https://$host/$request_uri",
            "http://a.b.svc:x/",
            "http://a_b.c/",
            "ftp://a.b/",
            "http://a.b/pa th",
        ] {
            assert!(auth(&ann(&[("auth-url", bad)])).is_err(), "{bad}");
        }
        for (k, v) in [
            ("auth-method", "get"),
            ("auth-signin", "javascript:alert(1)"),
            ("auth-signin-redirect-param", "r&d"),
            ("auth-response-headers", "X-Ok, Bad Header"),
            ("auth-response-headers", "X-Ok, Transfer-Encoding"),
            ("auth-response-headers", "connection"),
            ("auth-response-headers", "X-User, Host"),
            ("auth-response-headers", "Content-Length"),
            ("auth-always-set-cookie", "yes"),
        ] {
            let a = ann(&[("auth-url", "http://a.b.svc/"), (k, v)]);
            assert!(auth(&a).is_err(), "{k}: {v}");
        }
    }

    #[test]
    fn a_password_in_the_auth_url_is_refused_without_repeating_it() {
        for v in [
            "http://admin:hunter2@auth.default.svc/check",
            "https://admin:hunter2@auth.example/check",
        ] {
            let e = auth(&ann(&[("auth-url", v)])).unwrap_err();
            assert!(!e.message.contains("hunter2"), "{}", e.message);
            assert!(e.message.contains("user information"), "{}", e.message);
        }
    }

    #[test]
    fn satisfy_is_all_or_any() {
        assert_eq!(satisfy_any(&ann(&[])), Ok(false));
        assert_eq!(satisfy_any(&ann(&[("satisfy", "any")])), Ok(true));
        assert_eq!(satisfy_any(&ann(&[("satisfy", "all")])), Ok(false));
        assert!(satisfy_any(&ann(&[("satisfy", "some")])).is_err());
    }
}
