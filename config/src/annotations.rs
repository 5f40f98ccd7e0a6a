//! Ingress annotations sluice understands. Each has a `sluice.dev/` name; the ingress-nginx
//! spelling is accepted too so that migrating Ingresses keep their behaviour. The `sluice.dev/`
//! one wins when both are present.

use std::collections::BTreeMap;

use crate::model::{Hsts, UpstreamProtocol};

/// The legacy class annotation.
pub const INGRESS_CLASS: &str = "kubernetes.io/ingress.class";
/// Marks an IngressClass as the cluster default.
pub const DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
/// `"true"`/`"false"`: redirect HTTP to HTTPS for hosts with TLS.
pub const SSL_REDIRECT: [&str; 2] = [
    "sluice.dev/ssl-redirect",
    "nginx.ingress.kubernetes.io/ssl-redirect",
];
/// `HTTP`, `HTTPS`, `H2C` (also `GRPC` = h2c, `GRPCS` unsupported).
pub const BACKEND_PROTOCOL: [&str; 2] = [
    "sluice.dev/backend-protocol",
    "nginx.ingress.kubernetes.io/backend-protocol",
];
/// `max-age=N[; includeSubDomains]`, or `"true"` for one year.
pub const HSTS: &str = "sluice.dev/hsts";

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
    match first(a, &SSL_REDIRECT) {
        None => Ok(None),
        Some((_, v)) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Some((_, v)) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
        Some((name, v)) => Err(AnnotationError {
            name,
            message: format!("{v:?} is not \"true\" or \"false\""),
        }),
    }
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
            _ => Err(AnnotationError {
                name,
                message: format!("{v:?} is not one of HTTP, HTTPS, H2C, GRPC"),
            }),
        },
    }
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
        }));
    }
    let mut out = Hsts {
        max_age: 0,
        include_subdomains: false,
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
            hsts(&ann(HSTS, "max-age=600; includeSubDomains")),
            Ok(Some(Hsts {
                max_age: 600,
                include_subdomains: true
            }))
        );
        assert!(hsts(&ann(HSTS, "includeSubDomains")).is_err());
        assert_eq!(hsts(&BTreeMap::new()), Ok(None));
    }
}
