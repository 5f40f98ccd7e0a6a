//! The ingress-nginx traffic annotations: redirects, rewrites, request edits, per-route limits
//! and canaries. Each reader returns `Ok(None)` when its annotation is absent and an
//! [`AnnotationError`] naming the key when the value cannot be used; values are checked as
//! ingress-nginx checks them (its `internal/ingress/annotations/*` parsers), and where sluice is
//! stricter (a header value that could split a response) it says so in the error.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{AnnotationError, first};
use crate::route_policy::Redirect;

/// Reads a boolean annotation spelled `"true"`/`"false"` (any case).
pub fn flag(
    a: &BTreeMap<String, String>,
    names: &[&'static str],
) -> Result<Option<bool>, AnnotationError> {
    match first(a, names) {
        None => Ok(None),
        Some((_, v)) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Some((_, v)) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
        Some((name, v)) => Err(AnnotationError {
            name,
            message: format!("{v:?} is not \"true\" or \"false\""),
        }),
    }
}

/// A value that goes into a response or request header as it is: visible ASCII and spaces
/// only, so that no value can add a field or split a message.
fn header_safe(name: &'static str, v: &str) -> Result<(), AnnotationError> {
    if v.is_empty() || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(AnnotationError {
            name,
            message: format!("{v:?} must be non-empty visible ASCII"),
        });
    }
    Ok(())
}

/// An absolute `http`/`https` URL, as the redirect annotations need.
fn absolute_url(name: &'static str, v: &str) -> Result<(), AnnotationError> {
    header_safe(name, v)?;
    let rest = v
        .strip_prefix("https://")
        .or_else(|| v.strip_prefix("http://"))
        .filter(|r| !r.is_empty() && !r.starts_with('/') && !v.contains(' '));
    if rest.is_none() {
        return Err(AnnotationError {
            name,
            message: format!("{v:?} is not an absolute http:// or https:// URL"),
        });
    }
    Ok(())
}

fn redirect_code(
    a: &BTreeMap<String, String>,
    names: &[&'static str],
    default: u16,
) -> Result<u16, AnnotationError> {
    match first(a, names) {
        None => Ok(default),
        Some((name, v)) => match v.parse::<u16>() {
            Ok(c) if (300..=308).contains(&c) => Ok(c),
            _ => Err(AnnotationError {
                name,
                message: format!("{v:?} is not a redirect status (300-308)"),
            }),
        },
    }
}

/// `permanent-redirect` (+ `-code`, default 301) and `temporal-redirect` (+ `-code`, default
/// 302). As in ingress-nginx, a temporal redirect wins when both are set.
pub fn redirect(a: &BTreeMap<String, String>) -> Result<Option<Redirect>, AnnotationError> {
    if let Some((name, v)) = first(a, &both!("temporal-redirect")) {
        absolute_url(name, v)?;
        return Ok(Some(Redirect {
            code: redirect_code(a, &both!("temporal-redirect-code"), 302)?,
            location: v.to_string(),
        }));
    }
    if let Some((name, v)) = first(a, &both!("permanent-redirect")) {
        absolute_url(name, v)?;
        return Ok(Some(Redirect {
            code: redirect_code(a, &both!("permanent-redirect-code"), 301)?,
            location: v.to_string(),
        }));
    }
    Ok(None)
}

/// `app-root`: a path starting with `/` that a request for `/` is redirected to.
pub fn app_root(a: &BTreeMap<String, String>) -> Result<Option<String>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("app-root")) else {
        return Ok(None);
    };
    header_safe(name, v)?;
    if !v.starts_with('/') || v.contains(' ') {
        return Err(AnnotationError {
            name,
            message: format!("{v:?} is not a path starting with '/'"),
        });
    }
    Ok(Some(v.to_string()))
}

/// `rewrite-target`: a path template with `$1`..`$9` captures. An absolute URL (which nginx
/// would turn into a redirect) is refused: use `permanent-redirect` for that.
pub fn rewrite_target(a: &BTreeMap<String, String>) -> Result<Option<String>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("rewrite-target")) else {
        return Ok(None);
    };
    header_safe(name, v)?;
    if !v.starts_with('/') || v.contains(' ') {
        return Err(AnnotationError {
            name,
            message: format!(
                "{v:?} is not a path starting with '/' (a redirect to a URL is permanent-redirect)"
            ),
        });
    }
    Ok(Some(v.to_string()))
}

/// `x-forwarded-prefix`: the value of the `X-Forwarded-Prefix` header sent upstream.
pub fn forwarded_prefix(a: &BTreeMap<String, String>) -> Result<Option<String>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("x-forwarded-prefix")) else {
        return Ok(None);
    };
    header_safe(name, v)?;
    Ok(Some(v.to_string()))
}

/// `upstream-vhost`: a host name, optionally with a port, sent upstream as `Host`.
pub fn upstream_vhost(a: &BTreeMap<String, String>) -> Result<Option<String>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("upstream-vhost")) else {
        return Ok(None);
    };
    let ok = !v.is_empty()
        && v.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'_' | b'[' | b']')
        });
    if !ok {
        return Err(AnnotationError {
            name,
            message: format!("{v:?} is not a host name (optionally with :port)"),
        });
    }
    Ok(Some(v.to_ascii_lowercase()))
}

/// `custom-http-errors`: a comma-separated list of statuses from 400 to 599.
pub fn custom_errors(a: &BTreeMap<String, String>) -> Result<Vec<u16>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("custom-http-errors")) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for code in v.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        match code.parse::<u16>() {
            Ok(c) if (400..=599).contains(&c) => out.push(c),
            _ => {
                return Err(AnnotationError {
                    name,
                    message: format!("{code:?} is not a status from 400 to 599"),
                });
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// `default-backend`: the name of a Service in the Ingress's namespace.
pub fn default_backend(a: &BTreeMap<String, String>) -> Result<Option<String>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("default-backend")) else {
        return Ok(None);
    };
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        return Err(AnnotationError {
            name,
            message: format!("{v:?} is not a Service name"),
        });
    }
    Ok(Some(v.to_string()))
}

/// `server-alias`: comma-separated host names that serve the same rules.
pub fn server_aliases(a: &BTreeMap<String, String>) -> Result<Vec<String>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("server-alias")) else {
        return Ok(Vec::new());
    };
    v.split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| match crate::host::parse_rule_host(h) {
            Ok(crate::model::HostMatch::Exact(h)) => Ok(h),
            _ => Err(AnnotationError {
                name,
                message: format!("{h:?} is not a host name (wildcards are not aliases)"),
            }),
        })
        .collect()
}

/// An nginx size: a number with an optional `k`, `m` or `g` suffix (any case). `0` means no
/// limit, returned as `u64::MAX`.
pub fn nginx_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (digits, unit) = match v.as_bytes().last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&v[..v.len() - 1], 1 << 20),
        b'g' | b'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    if n == 0 {
        return Some(u64::MAX);
    }
    n.checked_mul(unit)
}

/// `proxy-body-size`: the largest request body (`0`: no limit).
pub fn body_size(a: &BTreeMap<String, String>) -> Result<Option<u64>, AnnotationError> {
    let Some((name, v)) = first(a, &both!("proxy-body-size")) else {
        return Ok(None);
    };
    nginx_size(v).map(Some).ok_or_else(|| AnnotationError {
        name,
        message: format!("{v:?} is not a size (a number with an optional k, m or g)"),
    })
}

/// A timeout in whole seconds, as ingress-nginx's proxy timeout annotations take it (an `s`
/// suffix is accepted too).
fn seconds(
    a: &BTreeMap<String, String>,
    names: &[&'static str],
) -> Result<Option<Duration>, AnnotationError> {
    let Some((name, v)) = first(a, names) else {
        return Ok(None);
    };
    match v.strip_suffix('s').unwrap_or(v).parse::<u64>() {
        Ok(n) if n > 0 && n <= 86_400 => Ok(Some(Duration::from_secs(n))),
        _ => Err(AnnotationError {
            name,
            message: format!("{v:?} is not a number of seconds between 1 and 86400"),
        }),
    }
}

/// `proxy-read-timeout`: how long sluice waits for the upstream's response head.
pub fn read_timeout(a: &BTreeMap<String, String>) -> Result<Option<Duration>, AnnotationError> {
    seconds(a, &both!("proxy-read-timeout"))
}

/// `proxy-connect-timeout` and `proxy-send-timeout`: checked (an invalid value is reported),
/// not applied per route; see the catalog for why.
pub fn other_timeouts(a: &BTreeMap<String, String>) -> Result<(), AnnotationError> {
    seconds(a, &both!("proxy-connect-timeout"))?;
    seconds(a, &both!("proxy-send-timeout"))?;
    Ok(())
}

pub use crate::path::{expand, path_regex};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::nginx_annotations as ann;

    #[test]
    fn redirects_as_ingress_nginx_reads_them() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Result<Option<(u16, &'a str)>, ()>);
        let cases: &[Case] = &[
            (&[], Ok(None)),
            (
                &[("permanent-redirect", "https://x.test/a")],
                Ok(Some((301, "https://x.test/a"))),
            ),
            (
                &[
                    ("permanent-redirect", "https://x.test"),
                    ("permanent-redirect-code", "308"),
                ],
                Ok(Some((308, "https://x.test"))),
            ),
            (
                &[("temporal-redirect", "http://y.test/")],
                Ok(Some((302, "http://y.test/"))),
            ),
            (
                &[
                    ("temporal-redirect", "http://y.test/"),
                    ("permanent-redirect", "https://x.test"),
                ],
                Ok(Some((302, "http://y.test/"))),
            ),
            (
                &[
                    ("temporal-redirect", "http://y.test/"),
                    ("temporal-redirect-code", "307"),
                ],
                Ok(Some((307, "http://y.test/"))),
            ),
            (&[("permanent-redirect", "/relative")], Err(())),
            (
                &[("permanent-redirect", "https://x.test\r\nSet-Cookie: a=b")],
                Err(()),
            ),
            (
                &[
                    ("permanent-redirect", "https://x.test"),
                    ("permanent-redirect-code", "200"),
                ],
                Err(()),
            ),
            (
                &[
                    ("permanent-redirect", "https://x.test"),
                    ("permanent-redirect-code", "3o1"),
                ],
                Err(()),
            ),
        ];
        for (pairs, want) in cases {
            let got = redirect(&ann(pairs));
            match want {
                Ok(w) => assert_eq!(
                    got.unwrap().map(|r| (r.code, r.location)),
                    w.map(|(c, l)| (c, l.to_string())),
                    "{pairs:?}"
                ),
                Err(()) => assert!(got.is_err(), "{pairs:?}"),
            }
        }
    }

    #[test]
    fn paths_and_hosts() {
        assert_eq!(
            app_root(&ann(&[("app-root", "/app1")])).unwrap().as_deref(),
            Some("/app1")
        );
        assert!(app_root(&ann(&[("app-root", "app1")])).is_err());
        assert_eq!(
            rewrite_target(&ann(&[("rewrite-target", "/$2")]))
                .unwrap()
                .as_deref(),
            Some("/$2")
        );
        assert!(rewrite_target(&ann(&[("rewrite-target", "https://x.test/$1")])).is_err());
        assert_eq!(
            upstream_vhost(&ann(&[("upstream-vhost", "Internal.Svc:8080")]))
                .unwrap()
                .as_deref(),
            Some("internal.svc:8080")
        );
        assert!(upstream_vhost(&ann(&[("upstream-vhost", "a b")])).is_err());
        assert!(upstream_vhost(&ann(&[("upstream-vhost", "$host")])).is_err());
        assert_eq!(
            forwarded_prefix(&ann(&[("x-forwarded-prefix", "/api")]))
                .unwrap()
                .as_deref(),
            Some("/api")
        );
        assert!(forwarded_prefix(&ann(&[("x-forwarded-prefix", "a\nb")])).is_err());
    }

    #[test]
    fn error_pages_and_default_backends() {
        assert_eq!(custom_errors(&ann(&[])).unwrap(), Vec::<u16>::new());
        assert_eq!(
            custom_errors(&ann(&[("custom-http-errors", "503, 404,404")])).unwrap(),
            [404, 503]
        );
        assert!(custom_errors(&ann(&[("custom-http-errors", "200")])).is_err());
        assert!(custom_errors(&ann(&[("custom-http-errors", "5xx")])).is_err());
        assert_eq!(
            default_backend(&ann(&[("default-backend", "errors")]))
                .unwrap()
                .as_deref(),
            Some("errors")
        );
        assert!(default_backend(&ann(&[("default-backend", "other/errors")])).is_err());
    }

    #[test]
    fn server_aliases_are_exact_hosts() {
        assert_eq!(
            server_aliases(&ann(&[("server-alias", "A.test, b.test")])).unwrap(),
            ["a.test", "b.test"]
        );
        assert!(server_aliases(&ann(&[("server-alias", "*.a.test")])).is_err());
        assert!(server_aliases(&ann(&[("server-alias", "a b")])).is_err());
    }

    #[test]
    fn sizes_and_timeouts() {
        for (v, want) in [
            ("1m", Some(1 << 20)),
            ("8K", Some(8 << 10)),
            ("2g", Some(2u64 << 30)),
            ("1000", Some(1000)),
            ("0", Some(u64::MAX)),
            ("0m", Some(u64::MAX)),
            ("", None),
            ("m", None),
            ("1.5m", None),
            ("-1", None),
            ("1t", None),
            ("99999999999999999999g", None),
        ] {
            assert_eq!(nginx_size(v), want, "{v:?}");
        }
        assert_eq!(
            body_size(&ann(&[("proxy-body-size", "10m")])).unwrap(),
            Some(10 << 20)
        );
        assert!(body_size(&ann(&[("proxy-body-size", "big")])).is_err());
        assert_eq!(
            read_timeout(&ann(&[("proxy-read-timeout", "5")])).unwrap(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            read_timeout(&ann(&[("proxy-read-timeout", "7s")])).unwrap(),
            Some(Duration::from_secs(7))
        );
        assert!(read_timeout(&ann(&[("proxy-read-timeout", "0")])).is_err());
        assert!(other_timeouts(&ann(&[("proxy-send-timeout", "soon")])).is_err());
        assert!(other_timeouts(&ann(&[("proxy-connect-timeout", "5")])).is_ok());
    }

    #[test]
    fn regex_paths_and_rewrites() {
        let re = path_regex("/something(/|$)(.*)").unwrap();
        let caps = re.captures("/SOMETHING/new").unwrap();
        let mut out = String::new();
        expand("/$2", &caps, &mut out);
        assert_eq!(out, "/new");
        let caps = re.captures("/something").unwrap();
        out.clear();
        expand("/x/$2$9$", &caps, &mut out);
        assert_eq!(out, "/x/$");
        assert!(
            re.captures("/other/something").is_none(),
            "anchored at the start"
        );
        let e = path_regex("/(?!admin).*").unwrap_err();
        assert!(e.contains("look-around"), "{e}");
        let e = path_regex("/(a)\\1").unwrap_err();
        assert!(e.contains("back-references"), "{e}");
        assert!(path_regex("/[").is_err());
    }
}
