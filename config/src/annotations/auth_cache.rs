//! `auth-cache-key` and `auth-cache-duration`: which `auth-url` answers are remembered, for
//! how long, and under what key. The key is an nginx-style template of request variables; only
//! the variables sluice can compute are accepted, so a key never silently reads as empty (which
//! would share one client's answer with every other).

use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::route_policy::{AuthCache, KeyPart};

use super::err;
use super::{AnnotationError, first};

/// Parses an nginx variable template: `$name` or `${name}`, everything else literal.
fn template(name: &'static str, v: &str) -> Result<Vec<KeyPart>, AnnotationError> {
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = v;
    while let Some(i) = rest.find('$') {
        literal.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        let (var, after) = if let Some(braced) = rest.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| err(name, format!("{v:?}: an unclosed ${{")))?;
            let var = &braced[..end];
            if !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(err(
                    name,
                    format!("{v:?}: ${{{var}}} is not a variable name"),
                ));
            }
            (var, &braced[end + 1..])
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        };
        rest = after;
        let part = match var {
            "remote_addr" => KeyPart::RemoteAddr,
            "remote_user" => KeyPart::RemoteUser,
            "host" | "http_host" => KeyPart::Host,
            "request_uri" => KeyPart::RequestUri,
            "uri" => KeyPart::Uri,
            "args" | "query_string" => KeyPart::Args,
            "request_method" => KeyPart::Method,
            v if v.starts_with("http_") && v.len() > 5 => {
                KeyPart::Header(v[5..].to_ascii_lowercase().replace('_', "-"))
            }
            v if v.starts_with("cookie_") && v.len() > 7 => KeyPart::Cookie(v[7..].to_string()),
            v if v.starts_with("arg_") && v.len() > 4 => KeyPart::Arg(v[4..].to_string()),
            other => {
                return Err(err(
                    name,
                    format!(
                        "{v:?}: ${other} is not a variable sluice computes ($remote_addr, $remote_user, $host, $request_uri, $uri, $args, $request_method, $http_*, $cookie_*, $arg_*)"
                    ),
                ));
            }
        };
        if !literal.is_empty() {
            parts.push(KeyPart::Literal(std::mem::take(&mut literal)));
        }
        parts.push(part);
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        parts.push(KeyPart::Literal(literal));
    }
    if !parts.iter().any(|p| !matches!(p, KeyPart::Literal(_))) {
        return Err(err(
            name,
            format!("{v:?} names no variable: every client would share one cached answer"),
        ));
    }
    Ok(parts)
}

/// The longest time an answer may be remembered: a year. Longer is refused, so that no
/// arithmetic on the value can overflow (an `Instant` plus `u64::MAX` seconds panics).
pub const LONGEST: Duration = Duration::from_secs(365 * 86_400);

/// An nginx time: a number with `s`, `m`, `h` or `d` (seconds without), at most [`LONGEST`].
fn time(name: &'static str, v: &str) -> Result<Duration, AnnotationError> {
    let (n, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, "s"),
    };
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(err(name, format!("{v:?} is not a time such as 30s or 5m"))),
    };
    n.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(secs))
        .map(Duration::from_secs)
        .ok_or_else(|| err(name, format!("{v:?} is not a time such as 30s or 5m")))
        .and_then(|d| {
            if d > LONGEST {
                Err(err(name, format!("{v:?} is longer than a year")))
            } else {
                Ok(d)
            }
        })
}

/// `auth-cache-duration`: comma-separated `[status ...] time` groups, as nginx's
/// `proxy_cache_valid` (`any`: every status, an empty list here; no status: 200, 301, 302).
fn durations(name: &'static str, v: &str) -> Result<Vec<(Vec<u16>, Duration)>, AnnotationError> {
    let groups: Vec<(Vec<u16>, Duration)> = v
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(|group| {
            let words: Vec<&str> = group.split_whitespace().collect();
            let (last, codes) = words
                .split_last()
                .ok_or_else(|| err(name, format!("{v:?}: an empty group")))?;
            let mut statuses = if codes.is_empty() {
                vec![200, 301, 302]
            } else {
                Vec::new()
            };
            for c in codes {
                if *c == "any" {
                    statuses.clear();
                    break;
                }
                match c.parse::<u16>() {
                    Ok(s) if (100..600).contains(&s) => statuses.push(s),
                    _ => return Err(err(name, format!("{v:?}: {c:?} is not a status"))),
                }
            }
            Ok((statuses, time(name, last)?))
        })
        .collect::<Result<_, _>>()?;
    if groups.is_empty() {
        return Err(err(name, "empty: write e.g. \"200 202 401 5m\""));
    }
    Ok(groups)
}

/// The cache an Ingress asks for; `None` without `auth-cache-key` (ingress-nginx caches
/// nothing without a key).
pub fn auth_cache(a: &BTreeMap<String, String>) -> Result<Option<AuthCache>, AnnotationError> {
    let Some((name, key)) = first(a, &both!("auth-cache-key")) else {
        return Ok(None);
    };
    let key = template(name, key)?;
    let valid = match first(a, &both!("auth-cache-duration")) {
        Some((n, v)) => durations(n, v)?,
        None => vec![(vec![200, 202, 401], Duration::from_secs(300))],
    };
    Ok(Some(AuthCache { key, valid }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::nginx_annotations as ann;

    #[test]
    fn keys_read_the_variables_sluice_computes() {
        let got = auth_cache(&ann(&[(
            "auth-cache-key",
            "$remote_user$http_authorization:${cookie_session}",
        )]));
        assert_eq!(
            got,
            Ok(Some(AuthCache {
                key: vec![
                    KeyPart::RemoteUser,
                    KeyPart::Header("authorization".into()),
                    KeyPart::Literal(":".into()),
                    KeyPart::Cookie("session".into()),
                ],
                valid: vec![(vec![200, 202, 401], Duration::from_secs(300))],
            }))
        );
        assert_eq!(auth_cache(&ann(&[])), Ok(None));
        for bad in ["static", "$server_name", "${http_x", "$", "${http_x y}"] {
            assert!(
                auth_cache(&ann(&[("auth-cache-key", bad)])).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn durations_are_status_groups_with_a_time() {
        let got = auth_cache(&ann(&[
            ("auth-cache-key", "$http_x_token"),
            ("auth-cache-duration", "200 202 10m, 401 30s, any 1h"),
        ]))
        .map(|c| c.map(|c| c.valid));
        assert_eq!(
            got,
            Ok(Some(vec![
                (vec![200, 202], Duration::from_secs(600)),
                (vec![401], Duration::from_secs(30)),
                (vec![], Duration::from_secs(3600)),
            ]))
        );
        for bad in [
            "200 5x",
            "999 5m",
            "200 0m",
            "5w",
            "",
            " , ",
            "200 18446744073709551615s",
            "366d",
        ] {
            let a = ann(&[
                ("auth-cache-key", "$http_x_token"),
                ("auth-cache-duration", bad),
            ]);
            assert!(auth_cache(&a).is_err(), "{bad:?}");
        }
        let lone = ann(&[
            ("auth-cache-key", "$http_x_token"),
            ("auth-cache-duration", "10m"),
        ]);
        assert_eq!(
            auth_cache(&lone).map(|c| c.map(|c| c.valid)),
            Ok(Some(vec![(vec![200, 301, 302], Duration::from_secs(600))]))
        );
    }
}
