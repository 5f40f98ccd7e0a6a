//! The access annotations sluice enforces: source ranges (`whitelist-source-range` /
//! `allowlist-source-range`, `denylist-source-range`), CORS (`enable-cors`, `cors-*`), request
//! limits (`limit-rps` and company) and response bandwidth (`limit-rate`, `limit-rate-after`). An
//! access annotation whose value cannot be read does not open the route: translation makes it
//! answer 503 (see `translate::options::fail_closed`).

use std::collections::BTreeMap;

use super::{AnnotationError, first};
use crate::cidr::Cidr;
use crate::route_policy::{Bandwidth, Cors, RateLimits, SourceRanges};

fn cidrs(
    a: &BTreeMap<String, String>,
    names: &[&'static str],
) -> Result<Option<Vec<Cidr>>, AnnotationError> {
    let Some((name, v)) = first(a, names) else {
        return Ok(None);
    };
    let list = Cidr::parse_list(v).map_err(|e| AnnotationError {
        name,
        message: e.to_string(),
    })?;
    if list.is_empty() {
        return Err(AnnotationError {
            name,
            message: "an empty list would allow or deny nobody; write the blocks".into(),
        });
    }
    Ok(Some(list))
}

/// The source ranges; `None` when the Ingress sets neither list.
pub fn source_ranges(
    a: &BTreeMap<String, String>,
) -> Result<Option<SourceRanges>, AnnotationError> {
    let allow = cidrs(
        a,
        &[
            "sluice.dev/allowlist-source-range",
            "sluice.dev/whitelist-source-range",
            "nginx.ingress.kubernetes.io/allowlist-source-range",
            "nginx.ingress.kubernetes.io/whitelist-source-range",
        ],
    )?;
    let deny = cidrs(a, &both!("denylist-source-range"))?;
    if allow.is_none() && deny.is_none() {
        return Ok(None);
    }
    Ok(Some(SourceRanges {
        allow: allow.unwrap_or_default(),
        deny: deny.unwrap_or_default(),
    }))
}

/// `limit-rps`, `limit-rpm`, `limit-connections` with `limit-burst-multiplier` and
/// `limit-whitelist`; `None` when no limit is set.
pub fn rate_limits(a: &BTreeMap<String, String>) -> Result<Option<RateLimits>, AnnotationError> {
    let positive = |names: &[&'static str]| match first(a, names) {
        None => Ok(None),
        Some((name, v)) => match v.parse::<u32>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(AnnotationError {
                name,
                message: format!("{v:?} is not a whole number above 0"),
            }),
        },
    };
    let rps = positive(&both!("limit-rps"))?;
    let rpm = positive(&both!("limit-rpm"))?;
    let connections = positive(&both!("limit-connections"))?;
    if rps.is_none() && rpm.is_none() && connections.is_none() {
        return Ok(None);
    }
    let exempt = cidrs(
        a,
        &[
            "sluice.dev/limit-allowlist",
            "sluice.dev/limit-whitelist",
            "nginx.ingress.kubernetes.io/limit-allowlist",
            "nginx.ingress.kubernetes.io/limit-whitelist",
        ],
    )?
    .unwrap_or_default();
    Ok(Some(RateLimits {
        rps,
        rpm,
        burst_multiplier: positive(&both!("limit-burst-multiplier"))?.unwrap_or(5),
        connections,
        exempt,
    }))
}

/// `limit-rate` and `limit-rate-after`, in kilobytes (1,024 bytes) as ingress-nginx writes
/// them (`limit_rate {N}k`); `None` without `limit-rate` or with `0` (off).
pub fn bandwidth(a: &BTreeMap<String, String>) -> Result<Option<Bandwidth>, AnnotationError> {
    let kilobytes = |names: &[&'static str]| match first(a, names) {
        None => Ok(None),
        Some((name, v)) => v
            .parse::<u64>()
            .ok()
            .and_then(|k| k.checked_mul(1024))
            .map(Some)
            .ok_or_else(|| AnnotationError {
                name,
                message: format!("{v:?} is not a whole number of kilobytes"),
            }),
    };
    let after = kilobytes(&both!("limit-rate-after"))?.unwrap_or(0);
    Ok(match kilobytes(&both!("limit-rate"))? {
        None | Some(0) => None,
        Some(rate) => Some(Bandwidth { rate, after }),
    })
}

/// ingress-nginx's defaults for `cors-allow-methods` and `cors-allow-headers`.
const METHODS: &str = "GET, PUT, POST, DELETE, PATCH, OPTIONS";
const HEADERS: &str = "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization";

/// A list of tokens (methods, header names) as a header value: visible ASCII, commas, spaces.
fn token_list(
    a: &BTreeMap<String, String>,
    names: &[&'static str],
    default: &str,
) -> Result<String, AnnotationError> {
    let Some((name, v)) = first(a, names) else {
        return Ok(default.to_string());
    };
    if v.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_, *".contains(&b))
    {
        Ok(v.to_string())
    } else {
        Err(AnnotationError {
            name,
            message: format!("{v:?} is not a comma-separated list of names"),
        })
    }
}

/// `enable-cors` and the `cors-*` annotations; `None` unless CORS is enabled.
pub fn cors(a: &BTreeMap<String, String>) -> Result<Option<Cors>, AnnotationError> {
    if super::traffic::flag(a, &both!("enable-cors"))? != Some(true) {
        return Ok(None);
    }
    let origins = match first(a, &both!("cors-allow-origin")) {
        None => vec!["*".to_string()],
        Some((name, v)) => {
            let list: Vec<String> = v
                .split([',', ' '])
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let ok = |o: &str| {
                o == "*"
                    || (o.starts_with("http://") || o.starts_with("https://"))
                        && o.bytes().all(|b| b.is_ascii_graphic())
            };
            if list.is_empty() || !list.iter().all(|o| ok(o)) {
                return Err(AnnotationError {
                    name,
                    message: format!("{v:?} is not * or a list of http(s) origins"),
                });
            }
            list
        }
    };
    let max_age = match first(a, &both!("cors-max-age")) {
        None => 1_728_000,
        Some((name, v)) => v.parse().map_err(|_| AnnotationError {
            name,
            message: format!("{v:?} is not a whole number of seconds"),
        })?,
    };
    Ok(Some(Cors {
        origins,
        methods: token_list(a, &both!("cors-allow-methods"), METHODS)?,
        headers: token_list(a, &both!("cors-allow-headers"), HEADERS)?,
        expose: token_list(a, &both!("cors-expose-headers"), "")?,
        credentials: super::traffic::flag(a, &both!("cors-allow-credentials"))?.unwrap_or(true),
        max_age,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::nginx_annotations as ann;

    #[test]
    fn source_ranges_under_every_spelling() {
        assert_eq!(source_ranges(&ann(&[])).unwrap(), None);
        let r = source_ranges(&ann(&[(
            "whitelist-source-range",
            "10.0.0.0/8, 192.168.1.1",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(r.allow.len(), 2);
        assert!(r.deny.is_empty());
        let r = source_ranges(&ann(&[
            ("allowlist-source-range", "2001:db8::/32"),
            ("denylist-source-range", "10.1.0.0/16"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((r.allow.len(), r.deny.len()), (1, 1));
        for bad in ["", "10.0.0.0/33", "everyone", "10.0.0.0/8,,nope"] {
            assert!(
                source_ranges(&ann(&[("whitelist-source-range", bad)])).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bandwidth_is_in_kilobytes_and_zero_is_off() {
        assert_eq!(bandwidth(&ann(&[])), Ok(None));
        assert_eq!(bandwidth(&ann(&[("limit-rate", "0")])), Ok(None));
        assert_eq!(
            bandwidth(&ann(&[("limit-rate", "100")])),
            Ok(Some(Bandwidth {
                rate: 102_400,
                after: 0
            }))
        );
        assert_eq!(
            bandwidth(&ann(&[("limit-rate", "1"), ("limit-rate-after", "50")])),
            Ok(Some(Bandwidth {
                rate: 1024,
                after: 51_200
            }))
        );
        assert_eq!(bandwidth(&ann(&[("limit-rate-after", "50")])), Ok(None));
        for bad in ["-1", "1.5", "fast", "99999999999999999999"] {
            assert!(bandwidth(&ann(&[("limit-rate", bad)])).is_err(), "{bad}");
            let after = ann(&[("limit-rate", "1"), ("limit-rate-after", bad)]);
            assert!(bandwidth(&after).is_err(), "{bad}");
        }
    }

    #[test]
    fn rate_limits_and_their_defaults() {
        assert_eq!(
            rate_limits(&ann(&[("limit-burst-multiplier", "2")])).unwrap(),
            None
        );
        let r = rate_limits(&ann(&[("limit-rps", "10")])).unwrap().unwrap();
        assert_eq!(
            (r.rps, r.rpm, r.burst_multiplier, r.connections),
            (Some(10), None, 5, None)
        );
        let r = rate_limits(&ann(&[
            ("limit-rpm", "600"),
            ("limit-connections", "3"),
            ("limit-burst-multiplier", "1"),
            ("limit-whitelist", "10.0.0.0/8"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.rpm, r.connections, r.burst_multiplier, r.exempt.len()),
            (Some(600), Some(3), 1, 1)
        );
        for bad in [
            &[("limit-rps", "0")][..],
            &[("limit-rps", "ten")],
            &[("limit-rps", "5"), ("limit-whitelist", "10.0.0.0/99")],
            &[("limit-rps", "5"), ("limit-burst-multiplier", "0")],
        ] {
            assert!(rate_limits(&ann(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cors_defaults_and_lists() {
        assert_eq!(cors(&ann(&[("cors-allow-origin", "*")])).unwrap(), None);
        let c = cors(&ann(&[("enable-cors", "true")])).unwrap().unwrap();
        assert_eq!(c.origins, ["*"]);
        assert_eq!(
            (c.methods.as_str(), c.credentials, c.max_age),
            (METHODS, true, 1_728_000)
        );
        let c = cors(&ann(&[
            ("enable-cors", "true"),
            ("cors-allow-origin", "https://a.test, https://*.b.test"),
            ("cors-allow-methods", "GET, POST"),
            ("cors-allow-credentials", "false"),
            ("cors-max-age", "600"),
            ("cors-expose-headers", "X-Total"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.origins, ["https://a.test", "https://*.b.test"]);
        assert_eq!(
            (c.methods.as_str(), c.expose.as_str()),
            ("GET, POST", "X-Total")
        );
        assert_eq!((c.credentials, c.max_age), (false, 600));
        for bad in [
            &[("enable-cors", "true"), ("cors-allow-origin", "a.test")][..],
            &[
                ("enable-cors", "true"),
                ("cors-allow-methods", "GET\r\nX: y"),
            ],
            &[("enable-cors", "true"), ("cors-max-age", "soon")],
        ] {
            assert!(cors(&ann(bad)).is_err(), "{bad:?}");
        }
    }
}
