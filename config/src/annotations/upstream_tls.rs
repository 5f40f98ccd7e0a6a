//! The `proxy-ssl-*` annotations: how sluice speaks TLS to a backend (`backend-protocol: HTTPS`
//! or `GRPCS`). Translation reads the Secret (`translate::upstream_tls`); a setting that cannot
//! be honoured keeps the Ingress closed rather than talk to its pods with less checking than
//! it asked for.

use std::collections::BTreeMap;

use super::{AnnotationError, first};
use super::{SecretName, err, secret_name};

/// What the `proxy-ssl-*` annotations of one Ingress ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySsl {
    /// `proxy-ssl-secret`.
    pub secret: Option<SecretName>,
    /// `proxy-ssl-verify: on`.
    pub verify: bool,
    /// `proxy-ssl-name`.
    pub name: Option<String>,
    /// `proxy-ssl-server-name: on`.
    pub sni: bool,
}

fn on_off(a: &BTreeMap<String, String>, names: &[&'static str]) -> Result<bool, AnnotationError> {
    match first(a, names) {
        None => Ok(false),
        Some((_, v)) if v.eq_ignore_ascii_case("on") => Ok(true),
        Some((_, v)) if v.eq_ignore_ascii_case("off") => Ok(false),
        Some((n, v)) => Err(err(n, format!("{v:?} is not \"on\" or \"off\""))),
    }
}

/// The `proxy-ssl-*` settings; `None` when the Ingress sets none of them.
pub fn proxy_ssl(a: &BTreeMap<String, String>) -> Result<Option<ProxySsl>, AnnotationError> {
    let any = a.keys().any(|k| {
        k.strip_prefix("nginx.ingress.kubernetes.io/")
            .or_else(|| k.strip_prefix("sluice.dev/"))
            .is_some_and(|n| n.starts_with("proxy-ssl-"))
    });
    if !any {
        return Ok(None);
    }
    let secret = match first(a, &both!("proxy-ssl-secret")) {
        None => None,
        Some((n, v)) => Some(secret_name(n, v)?),
    };
    let verify = on_off(a, &both!("proxy-ssl-verify"))?;
    if verify && secret.is_none() {
        return Err(err(
            "nginx.ingress.kubernetes.io/proxy-ssl-verify",
            "on needs proxy-ssl-secret, whose ca.crt the pods' certificates are verified against",
        ));
    }
    let name = match first(a, &both!("proxy-ssl-name")) {
        None => None,
        Some((n, v)) => {
            let ok = !v.is_empty()
                && v.len() <= 253
                && v.split('.').all(|l| {
                    !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                return Err(err(n, format!("{v:?} is not a host name")));
            }
            Some(v.to_ascii_lowercase())
        }
    };
    if let Some((n, v)) = first(a, &both!("proxy-ssl-verify-depth"))
        && !matches!(v.parse::<u32>(), Ok(1..=10))
    {
        return Err(err(n, format!("{v:?} is not a depth from 1 to 10")));
    }
    Ok(Some(ProxySsl {
        secret,
        verify,
        name,
        sni: on_off(a, &both!("proxy-ssl-server-name"))?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::nginx_annotations as ann;

    #[test]
    fn settings_and_their_defaults() {
        assert_eq!(proxy_ssl(&ann(&[])), Ok(None));
        assert_eq!(
            proxy_ssl(&ann(&[
                ("proxy-ssl-secret", "default/backend-tls"),
                ("proxy-ssl-verify", "on"),
                ("proxy-ssl-name", "Backend.Internal"),
                ("proxy-ssl-server-name", "on"),
                ("proxy-ssl-verify-depth", "2"),
            ])),
            Ok(Some(ProxySsl {
                secret: Some(SecretName {
                    namespace: Some("default".into()),
                    name: "backend-tls".into()
                }),
                verify: true,
                name: Some("backend.internal".into()),
                sni: true,
            }))
        );
        assert_eq!(
            proxy_ssl(&ann(&[("proxy-ssl-server-name", "off")])),
            Ok(Some(ProxySsl {
                secret: None,
                verify: false,
                name: None,
                sni: false,
            }))
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_an_error() {
        for bad in [
            vec![("proxy-ssl-verify", "on")],
            vec![("proxy-ssl-verify", "yes")],
            vec![("proxy-ssl-server-name", "true")],
            vec![("proxy-ssl-name", "bad name")],
            vec![("proxy-ssl-secret", "a/b/c")],
            vec![("proxy-ssl-verify-depth", "0")],
        ] {
            assert!(proxy_ssl(&ann(&bad)).is_err(), "{bad:?}");
        }
    }
}
