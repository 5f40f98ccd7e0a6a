//! The annotations that choose a request's backend beyond its route: canaries (`canary*`) and
//! session affinity (`affinity`, `session-cookie-*`).

use std::collections::BTreeMap;

use super::traffic::flag;
use super::{AnnotationError, first};
use crate::route_policy::{HeaderRule, SameSite, SessionCookie};

/// `affinity: cookie` and its `session-cookie-*` annotations; `None` without affinity.
/// `affinity-mode` is read (`balanced` or `persistent`) but both behave as balanced.
pub fn affinity(a: &BTreeMap<String, String>) -> Result<Option<SessionCookie>, AnnotationError> {
    match first(a, &both!("affinity")) {
        None => return Ok(None),
        Some((_, "cookie")) => {}
        Some((name, v)) => {
            return Err(AnnotationError {
                name,
                message: format!("{v:?} is not \"cookie\" (the only affinity ingress-nginx has)"),
            });
        }
    }
    if let Some((name, v)) = first(a, &both!("affinity-mode"))
        && v != "balanced"
        && v != "persistent"
    {
        return Err(AnnotationError {
            name,
            message: format!("{v:?} is not \"balanced\" or \"persistent\""),
        });
    }
    let token = |names: &[&'static str]| -> Result<Option<String>, AnnotationError> {
        match first(a, names) {
            None => Ok(None),
            Some((name, v)) => {
                let ok = !v.is_empty()
                    && v.bytes()
                        .all(|b| b.is_ascii_graphic() && !b";,\"\\=".contains(&b));
                if ok {
                    Ok(Some(v.to_string()))
                } else {
                    Err(AnnotationError {
                        name,
                        message: format!("{v:?} cannot be part of a cookie"),
                    })
                }
            }
        }
    };
    let number = |names: &[&'static str]| match first(a, names) {
        None => Ok(None),
        Some((name, v)) => v.parse::<u64>().map(Some).map_err(|_| AnnotationError {
            name,
            message: format!("{v:?} is not a whole number of seconds"),
        }),
    };
    let samesite = match first(a, &both!("session-cookie-samesite")) {
        None => None,
        Some((_, v)) if v.eq_ignore_ascii_case("none") => Some(SameSite::None),
        Some((_, v)) if v.eq_ignore_ascii_case("lax") => Some(SameSite::Lax),
        Some((_, v)) if v.eq_ignore_ascii_case("strict") => Some(SameSite::Strict),
        Some((name, v)) => {
            return Err(AnnotationError {
                name,
                message: format!("{v:?} is not None, Lax or Strict"),
            });
        }
    };
    Ok(Some(SessionCookie {
        name: token(&both!("session-cookie-name"))?.unwrap_or_else(|| "INGRESSCOOKIE".into()),
        path: token(&both!("session-cookie-path"))?,
        domain: token(&both!("session-cookie-domain"))?,
        max_age: number(&both!("session-cookie-max-age"))?,
        expires: number(&both!("session-cookie-expires"))?,
        samesite,
        secure: flag(a, &both!("session-cookie-secure"))?.unwrap_or(false),
    }))
}

/// The canary annotations of one Ingress, before its backend is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanaryRules {
    /// Header name (lower case) and how its value selects.
    pub header: Option<(String, HeaderRule)>,
    /// Cookie name.
    pub cookie: Option<String>,
    /// Weight out of `weight_total`.
    pub weight: u32,
    /// Total weight (at least 100, as ingress-nginx).
    pub weight_total: u32,
}

/// `canary: "true"` and its rules; `None` when the Ingress is not a canary.
pub fn canary(a: &BTreeMap<String, String>) -> Result<Option<CanaryRules>, AnnotationError> {
    if flag(a, &both!("canary"))? != Some(true) {
        return Ok(None);
    }
    let header = match first(a, &both!("canary-by-header")) {
        None => None,
        Some((name, h)) => {
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(AnnotationError {
                    name,
                    message: format!("{h:?} is not a header name"),
                });
            }
            let rule = if let Some((_, v)) = first(a, &both!("canary-by-header-value")) {
                HeaderRule::Value(v.to_string())
            } else if let Some((name, p)) = first(a, &both!("canary-by-header-pattern")) {
                regex::Regex::new(p).map_err(|e| AnnotationError {
                    name,
                    message: format!("{p:?} is not a regular expression sluice can run: {e}"),
                })?;
                HeaderRule::Pattern(p.to_string())
            } else {
                HeaderRule::AlwaysNever
            };
            Some((h.to_ascii_lowercase().replace('_', "-"), rule))
        }
    };
    let cookie = first(a, &both!("canary-by-cookie")).map(|(_, c)| c.to_string());
    let number = |names: &[&'static str], default: u32| match first(a, names) {
        None => Ok(default),
        Some((name, v)) => v.parse::<u32>().map_err(|_| AnnotationError {
            name,
            message: format!("{v:?} is not a whole number"),
        }),
    };
    let weight_total = number(&both!("canary-weight-total"), 100)?.max(100);
    let weight = number(&both!("canary-weight"), 0)?;
    if weight > weight_total {
        return Err(AnnotationError {
            name: "nginx.ingress.kubernetes.io/canary-weight",
            message: format!("{weight} is more than the total weight {weight_total}"),
        });
    }
    Ok(Some(CanaryRules {
        header,
        cookie,
        weight,
        weight_total,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::nginx_annotations as ann;

    #[test]
    fn session_cookies() {
        assert_eq!(
            affinity(&ann(&[("session-cookie-name", "x")])).unwrap(),
            None
        );
        let c = affinity(&ann(&[("affinity", "cookie")])).unwrap().unwrap();
        assert_eq!(
            (c.name.as_str(), c.path, c.secure),
            ("INGRESSCOOKIE", None, false)
        );
        let c = affinity(&ann(&[
            ("affinity", "cookie"),
            ("affinity-mode", "persistent"),
            ("session-cookie-name", "route"),
            ("session-cookie-path", "/app"),
            ("session-cookie-max-age", "172800"),
            ("session-cookie-expires", "3600"),
            ("session-cookie-samesite", "lax"),
            ("session-cookie-secure", "true"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.name, "route");
        assert_eq!(c.path.as_deref(), Some("/app"));
        assert_eq!((c.max_age, c.expires), (Some(172_800), Some(3600)));
        assert_eq!((c.samesite, c.secure), (Some(SameSite::Lax), true));
        for bad in [
            &[("affinity", "ip")][..],
            &[("affinity", "cookie"), ("affinity-mode", "sticky")],
            &[("affinity", "cookie"), ("session-cookie-name", "a;b")],
            &[("affinity", "cookie"), ("session-cookie-path", "/a b")],
            &[("affinity", "cookie"), ("session-cookie-max-age", "-1")],
            &[
                ("affinity", "cookie"),
                ("session-cookie-samesite", "sometimes"),
            ],
        ] {
            assert!(affinity(&ann(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn canary_rules() {
        assert_eq!(canary(&ann(&[("canary-weight", "10")])).unwrap(), None);
        let c = canary(&ann(&[("canary", "true"), ("canary-weight", "10")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.weight, c.weight_total, c.header, c.cookie),
            (10, 100, None, None)
        );
        let c = canary(&ann(&[
            ("canary", "true"),
            ("canary-by-header", "X_Canary"),
            ("canary-by-header-value", "yes"),
            ("canary-by-header-pattern", "ignored"),
            ("canary-by-cookie", "c"),
            ("canary-weight", "5"),
            ("canary-weight-total", "1000"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            c.header,
            Some(("x-canary".to_string(), HeaderRule::Value("yes".into())))
        );
        assert_eq!(
            (c.cookie.as_deref(), c.weight, c.weight_total),
            (Some("c"), 5, 1000)
        );
        let c = canary(&ann(&[
            ("canary", "true"),
            ("canary-by-header", "h"),
            ("canary-by-header-pattern", "^a.*"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            c.header,
            Some(("h".to_string(), HeaderRule::Pattern("^a.*".into())))
        );
        // A total under 100 is raised to 100, as ingress-nginx does.
        let c = canary(&ann(&[("canary", "true"), ("canary-weight-total", "10")]))
            .unwrap()
            .unwrap();
        assert_eq!(c.weight_total, 100);
        for bad in [
            &[("canary", "true"), ("canary-weight", "101")][..],
            &[("canary", "true"), ("canary-weight", "ten")],
            &[("canary", "true"), ("canary-by-header", "a b")],
            &[
                ("canary", "true"),
                ("canary-by-header", "h"),
                ("canary-by-header-pattern", "(?=x)"),
            ],
            &[("canary", "yes")],
        ] {
            assert!(canary(&ann(bad)).is_err(), "{bad:?}");
        }
    }
}
