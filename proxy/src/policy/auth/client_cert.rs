//! Client certificates (`auth-tls-*`), compiled: the CA bundle as a rustls verifier, and what a
//! route asks of the certificate a connection presented. The TLS listener asks for a
//! certificate on the hosts of these routes (`server::tls`); a route then checks what its
//! connection presented, so a client that named another host in its ClientHello gains nothing.

use std::sync::Arc;

use http::HeaderValue;
use regex::Regex;
use rustls::RootCertStore;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sluice_config::route_policy::{ClientCertAuth, VerifyClient};

use crate::crypto::provider;

/// A route's compiled client-certificate rules.
#[derive(Debug)]
pub struct ClientAuth {
    /// `auth-tls-verify-client`.
    pub verify: VerifyClient,
    /// The CA bundle's verifier (certificates optional: whether one is required is the route's
    /// decision, so that a missing one gets nginx's 400, not a handshake alert).
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// `auth-tls-verify-depth`: certificates the client may send above its own.
    pub depth: u32,
    /// `auth-tls-error-page`.
    pub error_page: Option<HeaderValue>,
    /// `auth-tls-pass-certificate-to-upstream`.
    pub pass_certificate: bool,
    match_cn: Option<Regex>,
}

/// What a connection presented, read once after its handshake.
#[derive(Debug)]
pub struct ClientCert {
    /// The chain, the client's own certificate first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The rules that verified it during the handshake (`None`: presented unverified, under
    /// `optional_no_ca`).
    pub verified_by: Option<Arc<ClientAuth>>,
    /// Subject DN, RFC 2253 (nginx's `$ssl_client_s_dn`).
    pub subject: String,
    /// Issuer DN, RFC 2253.
    pub issuer: String,
    /// The PEM, URL-encoded (nginx's `$ssl_client_escaped_cert`).
    pub escaped_pem: Option<HeaderValue>,
}

/// What a route decides about a connection's certificate.
#[derive(Debug, PartialEq, Eq)]
pub enum Judged {
    /// Go on; `ssl-client-verify` says this.
    Pass(&'static str),
    /// No certificate and one is required (nginx's 496, answered 400).
    Missing,
    /// A certificate that does not verify (nginx's 495, answered 400).
    Invalid,
    /// `auth-tls-match-cn` does not match (403).
    NameRefused,
}

impl ClientAuth {
    /// Compiles the rules; `Err` says why the route must stay closed.
    pub fn compile(c: &ClientCertAuth) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&c.ca_pem) {
            let cert = cert.map_err(|e| format!("{}: ca.crt: {e}", c.ca_source))?;
            roots
                .add(cert)
                .map_err(|e| format!("{}: ca.crt: {e}", c.ca_source))?;
        }
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::new(provider()))
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("{}: ca.crt: {e}", c.ca_source))?;
        Ok(Self {
            verify: c.verify,
            verifier,
            depth: c.depth,
            error_page: match &c.error_page {
                Some(p) => Some(HeaderValue::from_str(p).map_err(|e| e.to_string())?),
                None => None,
            },
            pass_certificate: c.pass_certificate,
            match_cn: match &c.match_cn {
                Some(m) => Some(Regex::new(m).map_err(|e| e.to_string())?),
                None => None,
            },
        })
    }

    /// Whether `chain` verifies against the CA bundle within the depth.
    pub fn verifies(&self, chain: &[CertificateDer<'static>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        self.within_depth(intermediates.len())
            && self
                .verifier
                .verify_client_cert(leaf, intermediates, UnixTime::now())
                .is_ok()
    }

    /// Whether `intermediates` certificates above the client's own are allowed.
    pub fn within_depth(&self, intermediates: usize) -> bool {
        intermediates < self.depth as usize
    }

    /// The route's decision about what the connection presented.
    pub fn judge(self: &Arc<Self>, presented: Option<&ClientCert>) -> Judged {
        let verified = presented.map(|c| match &c.verified_by {
            Some(by) if Arc::ptr_eq(by, self) => true,
            // Verified by another host's rules (or not at all): check against this route's.
            _ => self.verifies(&c.chain),
        });
        let status = match (verified, self.verify) {
            (None, VerifyClient::On) => return Judged::Missing,
            (None, _) => "NONE",
            (Some(true), _) => "SUCCESS",
            (Some(false), VerifyClient::OptionalNoCa) => "FAILED:certificate not verified",
            (Some(false), _) => return Judged::Invalid,
        };
        if let Some(re) = &self.match_cn
            && !re.is_match(presented.map_or("", |c| c.subject.as_str()))
        {
            return Judged::NameRefused;
        }
        Judged::Pass(status)
    }
}

impl ClientCert {
    /// Reads a presented chain: its names, and its PEM escaped for a header.
    pub fn read(chain: Vec<CertificateDer<'static>>, verified_by: Option<Arc<ClientAuth>>) -> Self {
        let (subject, issuer) = chain
            .first()
            .and_then(|leaf| x509_parser::parse_x509_certificate(leaf).ok())
            .map(|(_, c)| (rfc2253(c.subject()), rfc2253(c.issuer())))
            .unwrap_or_default();
        let escaped_pem = chain.first().and_then(|leaf| {
            let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
            let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, leaf);
            for line in b64.as_bytes().chunks(64) {
                pem.push_str(std::str::from_utf8(line).ok()?);
                pem.push('\n');
            }
            pem.push_str("-----END CERTIFICATE-----\n");
            HeaderValue::from_str(&url_encode(&pem)).ok()
        });
        Self {
            chain,
            verified_by,
            subject,
            issuer,
            escaped_pem,
        }
    }
}

/// A distinguished name as RFC 2253 writes it (and nginx's `$ssl_client_s_dn`): the last RDN
/// first, `,` between them, `+` inside a multi-valued one, special characters escaped.
fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let rdns: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|a| {
                    let key = x509_parser::objects::oid2abbrev(a.attr_type(), registry)
                        .map(str::to_string)
                        .unwrap_or_else(|_| a.attr_type().to_id_string());
                    let value = a.as_str().unwrap_or("");
                    let mut escaped = String::with_capacity(key.len() + 1 + value.len());
                    escaped.push_str(&key);
                    escaped.push('=');
                    // One pass, no per-character count: this runs on every presented
                    // certificate, before it is verified, so an attacker's 64 KB name must
                    // cost linear time.
                    let last = value.len().saturating_sub(1);
                    for (i, ch) in value.char_indices() {
                        if ",+\"\\<>;".contains(ch)
                            || (i == 0 && (ch == '#' || ch == ' '))
                            || (i == last && ch == ' ')
                        {
                            escaped.push('\\');
                        }
                        escaped.push(ch);
                    }
                    escaped
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// Percent-encodes all but RFC 3986's unreserved characters (no allocation per byte: a
/// client's certificate may be large).
fn url_encode(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

/// A client-certificate verifier that asks for a certificate (hinting `inner`'s CAs) without
/// requiring one, and checks only that the client holds the key of what it presents. For an
/// Ingress host, whether the chain verifies is the route's decision after the handshake
/// ([`ClientAuth::judge`]), as nginx decides it per request: a missing or unverified
/// certificate then gets its 400 (or `auth-tls-error-page`), not a bare handshake alert. For a
/// Gateway listener in `AllowInsecureFallback` mode nobody judges it: the backend decides.
#[derive(Debug)]
pub struct AskingVerifier {
    /// The CA bundle's verifier (its hints and signature checks).
    pub inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for AskingVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Rules that ask for client certificates: the verifier their handshakes use.
pub trait AsksForCertificates {
    /// The verifier of a handshake under these rules.
    fn handshake_verifier(&self) -> Arc<dyn ClientCertVerifier>;
}

impl AsksForCertificates for ClientAuth {
    fn handshake_verifier(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::new(AskingVerifier {
            inner: Arc::clone(&self.verifier),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::ObjectRef;

    struct Pki {
        ca_pem: String,
        good: Vec<CertificateDer<'static>>,
        stranger: Vec<CertificateDer<'static>>,
    }

    fn pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Test CA");
        let ca = params
            .self_signed(&ca_key)
            .unwrap_or_else(|e| panic!("{e}"));
        let issuer = rcgen::Issuer::new(params, ca_key);
        let leaf = |cn: &str, issuer: Option<&rcgen::Issuer<'_, rcgen::KeyPair>>| {
            let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new())
                .unwrap_or_else(|e| panic!("{e}"));
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, "Acme, Inc");
            p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            let cert = match issuer {
                Some(i) => p.signed_by(&key, i),
                None => p.self_signed(&key),
            };
            vec![cert.unwrap_or_else(|e| panic!("{e}")).der().clone()]
        };
        Pki {
            ca_pem: ca.pem(),
            good: leaf("client-1", Some(&issuer)),
            stranger: leaf("client-1", None),
        }
    }

    fn rules(pki: &Pki, verify: VerifyClient, match_cn: Option<&str>) -> Arc<ClientAuth> {
        let c = ClientCertAuth {
            ca_pem: pki.ca_pem.as_bytes().to_vec(),
            ca_source: ObjectRef::new("Secret", "default", "ca"),
            verify,
            depth: 1,
            error_page: None,
            pass_certificate: true,
            match_cn: match_cn.map(str::to_string),
        };
        Arc::new(ClientAuth::compile(&c).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn each_mode_judges_missing_good_and_strange_certificates() {
        let pki = pki();
        let good = ClientCert::read(pki.good.clone(), None);
        let strange = ClientCert::read(pki.stranger.clone(), None);
        let cases = [
            (
                VerifyClient::On,
                Judged::Missing,
                Judged::Pass("SUCCESS"),
                Judged::Invalid,
            ),
            (
                VerifyClient::Optional,
                Judged::Pass("NONE"),
                Judged::Pass("SUCCESS"),
                Judged::Invalid,
            ),
            (
                VerifyClient::OptionalNoCa,
                Judged::Pass("NONE"),
                Judged::Pass("SUCCESS"),
                Judged::Pass("FAILED:certificate not verified"),
            ),
        ];
        for (mode, none, ok, bad) in cases {
            let r = rules(&pki, mode, None);
            assert_eq!(r.judge(None), none, "{mode:?}");
            assert_eq!(r.judge(Some(&good)), ok, "{mode:?}");
            assert_eq!(r.judge(Some(&strange)), bad, "{mode:?}");
        }
    }

    #[test]
    fn names_are_rfc2253_and_match_cn_reads_them() {
        let pki = pki();
        let good = ClientCert::read(pki.good.clone(), None);
        assert_eq!(good.subject, "O=Acme\\, Inc,CN=client-1");
        assert_eq!(good.issuer, "CN=Test CA");
        let pem = good
            .escaped_pem
            .as_ref()
            .map(|v| v.to_str().unwrap_or_default().to_string());
        assert!(
            pem.as_deref()
                .is_some_and(|p| p.starts_with("-----BEGIN%20CERTIFICATE-----%0A")),
            "{pem:?}"
        );
        let named = rules(&pki, VerifyClient::On, Some("CN=client-(1|2)$"));
        assert_eq!(named.judge(Some(&good)), Judged::Pass("SUCCESS"));
        let other = rules(&pki, VerifyClient::Optional, Some("CN=admin"));
        assert_eq!(other.judge(Some(&good)), Judged::NameRefused);
        assert_eq!(
            other.judge(None),
            Judged::NameRefused,
            "nginx matches an empty DN"
        );
    }

    #[test]
    fn a_bundle_without_certificates_is_refused() {
        let c = ClientCertAuth {
            ca_pem: b"not pem".to_vec(),
            ca_source: ObjectRef::new("Secret", "default", "ca"),
            verify: VerifyClient::On,
            depth: 1,
            error_page: None,
            pass_certificate: false,
            match_cn: None,
        };
        assert!(ClientAuth::compile(&c).is_err());
    }
}
