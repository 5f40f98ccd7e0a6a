//! The client-certificate annotations (`auth-tls-secret`, `auth-tls-verify-client`,
//! `auth-tls-verify-depth`, `auth-tls-error-page`, `auth-tls-pass-certificate-to-upstream`,
//! `auth-tls-match-cn`). Translation finds the CA Secret (`translate::auth`); the data plane
//! asks for and judges the certificates.

use std::collections::BTreeMap;

use super::auth::location;
use super::{AnnotationError, first};
use super::{SecretName, err, secret_name};

/// What the `auth-tls-*` annotations of one Ingress ask for (`auth-tls-verify-client: off`
/// asks for nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertSpec {
    /// `auth-tls-secret` (`NAMESPACE/NAME`, or a name in the Ingress's namespace).
    pub secret: SecretName,
    /// `auth-tls-verify-client`.
    pub verify: crate::route_policy::VerifyClient,
    /// `auth-tls-verify-depth`.
    pub depth: u32,
    /// `auth-tls-error-page`.
    pub error_page: Option<String>,
    /// `auth-tls-pass-certificate-to-upstream`.
    pub pass_certificate: bool,
    /// `auth-tls-match-cn`.
    pub match_cn: Option<String>,
}

/// The `auth-tls-*` annotations; `None` without `auth-tls-secret` or with
/// `auth-tls-verify-client: off`. A companion without the Secret is an error (it would protect
/// nothing).
pub fn client_cert(
    a: &BTreeMap<String, String>,
) -> Result<Option<ClientCertSpec>, AnnotationError> {
    use crate::route_policy::VerifyClient;
    let Some((name, s)) = first(a, &both!("auth-tls-secret")) else {
        for companion in [
            both!("auth-tls-verify-client"),
            both!("auth-tls-verify-depth"),
            both!("auth-tls-error-page"),
            both!("auth-tls-pass-certificate-to-upstream"),
            both!("auth-tls-match-cn"),
        ] {
            if let Some((n, _)) = first(a, &companion) {
                return Err(err(
                    n,
                    "set without auth-tls-secret, so it protects nothing; the route stays closed until one is set",
                ));
            }
        }
        return Ok(None);
    };
    let secret = secret_name(name, s)?;
    let verify = match first(a, &both!("auth-tls-verify-client")) {
        None => VerifyClient::On,
        Some((n, v)) => match v {
            "on" => VerifyClient::On,
            "optional" => VerifyClient::Optional,
            "optional_no_ca" => VerifyClient::OptionalNoCa,
            "off" => return Ok(None),
            _ => {
                return Err(err(
                    n,
                    format!("{v:?} is not on, off, optional or optional_no_ca"),
                ));
            }
        },
    };
    let depth = match first(a, &both!("auth-tls-verify-depth")) {
        None => 1,
        Some((n, v)) => match v.parse::<u32>() {
            Ok(d) if (1..=10).contains(&d) => d,
            _ => return Err(err(n, format!("{v:?} is not a depth from 1 to 10"))),
        },
    };
    let error_page = location(a, &both!("auth-tls-error-page"))?;
    let match_cn = match first(a, &both!("auth-tls-match-cn")) {
        None => None,
        Some((n, v)) => {
            regex::Regex::new(v).map_err(|e| {
                err(
                    n,
                    format!("{v:?} is not a regular expression sluice can run: {e}"),
                )
            })?;
            Some(v.to_string())
        }
    };
    Ok(Some(ClientCertSpec {
        secret,
        verify,
        depth,
        error_page,
        pass_certificate: super::traffic::flag(a, &both!("auth-tls-pass-certificate-to-upstream"))?
            .unwrap_or(false),
        match_cn,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::nginx_annotations as ann;

    #[test]
    fn client_certificates_read_their_defaults_and_values() {
        use crate::route_policy::VerifyClient;
        assert_eq!(client_cert(&ann(&[])), Ok(None));
        let got = client_cert(&ann(&[("auth-tls-secret", "default/ca")]));
        assert_eq!(
            got,
            Ok(Some(ClientCertSpec {
                secret: SecretName {
                    namespace: Some("default".into()),
                    name: "ca".into()
                },
                verify: VerifyClient::On,
                depth: 1,
                error_page: None,
                pass_certificate: false,
                match_cn: None,
            }))
        );
        let got = client_cert(&ann(&[
            ("auth-tls-secret", "ca"),
            ("auth-tls-verify-client", "optional_no_ca"),
            ("auth-tls-verify-depth", "3"),
            ("auth-tls-error-page", "https://e.test/x"),
            ("auth-tls-pass-certificate-to-upstream", "true"),
            ("auth-tls-match-cn", "CN=(a|b)"),
        ]));
        let Ok(Some(c)) = got else {
            panic!("{got:?}");
        };
        assert_eq!(
            (c.verify, c.depth, c.pass_certificate),
            (VerifyClient::OptionalNoCa, 3, true)
        );
        assert_eq!(c.match_cn.as_deref(), Some("CN=(a|b)"));
        let off = ann(&[("auth-tls-secret", "ca"), ("auth-tls-verify-client", "off")]);
        assert_eq!(client_cert(&off), Ok(None));
    }

    #[test]
    fn unreadable_client_certificate_settings_are_errors() {
        for bad in [
            vec![("auth-tls-verify-client", "on")],
            vec![("auth-tls-secret", "a/b/c")],
            vec![
                ("auth-tls-secret", "ca"),
                ("auth-tls-verify-client", "maybe"),
            ],
            vec![("auth-tls-secret", "ca"), ("auth-tls-verify-depth", "0")],
            vec![("auth-tls-secret", "ca"), ("auth-tls-verify-depth", "x")],
            vec![("auth-tls-secret", "ca"), ("auth-tls-error-page", "nope")],
            vec![("auth-tls-secret", "ca"), ("auth-tls-match-cn", "CN=(?=a)")],
            vec![
                ("auth-tls-secret", "ca"),
                ("auth-tls-pass-certificate-to-upstream", "yes"),
            ],
        ] {
            assert!(client_cert(&ann(&bad)).is_err(), "{bad:?}");
        }
    }
}
