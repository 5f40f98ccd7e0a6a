//! The certificate store, one of the three swap points: SNI → certificate (exact host, then
//! one-label wildcard, then the default), immutable and swapped as a whole when a snapshot is
//! applied. [`TlsState`] remembers the last good certificate per Secret and per host, so a
//! Secret that turns invalid keeps serving what it served before. The listeners' rustls config
//! that reads this store is in [`crate::server::tls`].

use std::collections::HashMap;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{CipherSuite, SignatureScheme};
use sluice_config::{CertificatePem, ObjectRef, Snapshot};

use crate::crypto::provider;

/// Why a certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// PEM decoding failed.
    #[error("{0}")]
    Pem(String),
    /// rustls rejected the key, or the key does not belong to the certificate.
    #[error("{0}")]
    Key(String),
}

/// A loaded certificate with the facts the metrics show.
#[derive(Debug, Clone)]
pub struct LoadedCert {
    /// What rustls serves.
    pub key: Arc<CertifiedKey>,
    /// Leaf serial number, hex.
    pub serial: String,
    /// Leaf `notAfter`, seconds since the Unix epoch.
    pub not_after: i64,
    /// Leaf DNS subject alternative names.
    pub sans: Vec<String>,
    /// The host's ECDSA certificate when it has one beside this (RSA) one: served to the
    /// clients that can verify it ([`LoadedCert::for_client`]).
    pub ecdsa: Option<Box<LoadedCert>>,
}

impl LoadedCert {
    /// Whether the key is ECDSA.
    pub fn is_ecdsa(&self) -> bool {
        self.key.key.algorithm() == rustls::SignatureAlgorithm::ECDSA
    }

    /// The certificate for a client that offers these signature schemes and cipher suites: the
    /// ECDSA one when the host has one and the client can use it (a scheme the key signs with,
    /// and a TLS 1.3 suite or a TLS 1.2 ECDHE-ECDSA suite), else this one. ECDSA handshakes cost
    /// the server a fraction of RSA's; clients that cannot verify ECDSA still connect.
    pub fn for_client(
        &self,
        schemes: &[SignatureScheme],
        suites: &[CipherSuite],
    ) -> &Arc<CertifiedKey> {
        match &self.ecdsa {
            Some(e)
                if e.key.key.choose_scheme(schemes).is_some()
                    && suites.iter().any(|s| ecdsa_suite(*s)) =>
            {
                &e.key
            }
            _ => &self.key,
        }
    }
}

/// A suite an ECDSA certificate can serve: any TLS 1.3 suite (the certificate's key type is
/// not part of them) or a TLS 1.2 ECDHE-ECDSA one.
fn ecdsa_suite(s: CipherSuite) -> bool {
    matches!(
        s,
        CipherSuite::TLS13_AES_128_GCM_SHA256
            | CipherSuite::TLS13_AES_256_GCM_SHA384
            | CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
    )
}

/// Parses PEM into a certified key and checks that the key matches the leaf certificate.
pub fn load_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<LoadedCert, CertError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Pem(format!("tls.crt: {e}")))?;
    if chain.is_empty() {
        return Err(CertError::Pem("tls.crt: no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| CertError::Pem(format!("tls.key: {e}")))?;
    let ck = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            CertError::Key("tls.key does not match the certificate in tls.crt".into())
        }
        other => CertError::Key(format!("tls.key: {other}")),
    })?;
    let (serial, not_after, sans) = match x509_parser::parse_x509_certificate(&ck.cert[0]) {
        Ok((_, c)) => {
            let sans = c
                .subject_alternative_name()
                .ok()
                .flatten()
                .map(|ext| {
                    ext.value
                        .general_names
                        .iter()
                        .filter_map(|n| match n {
                            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                c.raw_serial_as_string().replace(':', ""),
                c.validity().not_after.timestamp(),
                sans,
            )
        }
        Err(e) => {
            return Err(CertError::Pem(format!(
                "tls.crt: not an X.509 certificate: {e}"
            )));
        }
    };
    Ok(LoadedCert {
        key: Arc::new(ck),
        serial,
        not_after,
        sans,
        ecdsa: None,
    })
}

/// Generates the self-signed fallback certificate used when no default is configured (like
/// other controllers' "fake" certificate).
pub fn self_signed_default() -> Result<LoadedCert, CertError> {
    let ck = rcgen::generate_simple_self_signed(vec!["sluice.invalid".to_string()])
        .map_err(|e| CertError::Key(e.to_string()))?;
    load_pem(
        ck.cert.pem().as_bytes(),
        ck.signing_key.serialize_pem().as_bytes(),
    )
}

/// A host's two certificates as one entry: the RSA one first, the ECDSA one beside it. Two of
/// the same key type cannot be told apart by what a client offers: the first is served and
/// the second reported.
fn pair(
    first: LoadedCert,
    second: LoadedCert,
    second_ref: &ObjectRef,
    problems: &mut Vec<TlsProblem>,
) -> LoadedCert {
    let (mut rsa, ecdsa) = match (first.is_ecdsa(), second.is_ecdsa()) {
        (false, true) => (first, second),
        (true, false) => (second, first),
        _ => {
            problems.push(TlsProblem {
                secret: second_ref.clone(),
                message: "has the same key type as the host's other certificate; only the first is served (a host may have one RSA and one ECDSA certificate)".into(),
            });
            return first;
        }
    };
    rsa.ecdsa = Some(Box::new(ecdsa));
    rsa
}

/// SNI → certificate, immutable; swapped as a whole.
#[derive(Debug, Clone)]
pub struct CertStore {
    exact: HashMap<String, LoadedCert>,
    wildcard: HashMap<String, LoadedCert>,
    default: LoadedCert,
}

impl CertStore {
    /// A store that serves only `default`.
    pub fn new(default: LoadedCert) -> Self {
        Self {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default,
        }
    }

    /// The certificate for an SNI name (normalized), or the default.
    pub fn lookup(&self, sni: Option<&str>) -> &LoadedCert {
        if let Some(name) = sni {
            if let Some(c) = self.exact.get(name) {
                return c;
            }
            if let Some(dot) = name.find('.')
                && dot > 0
                && let Some(c) = self.wildcard.get(&name[dot..])
            {
                return c;
            }
        }
        &self.default
    }

    /// The certificate served when no host's matches.
    pub fn default_cert(&self) -> &LoadedCert {
        &self.default
    }

    /// `(host, certificate)` pairs, for metrics and status; a host with an ECDSA certificate
    /// beside its RSA one appears twice.
    pub fn hosts(&self) -> impl Iterator<Item = (String, &LoadedCert)> {
        self.exact
            .iter()
            .map(|(h, c)| (h.clone(), c))
            .chain(self.wildcard.iter().map(|(s, c)| (format!("*{s}"), c)))
            .flat_map(|(h, c)| {
                std::iter::once((h.clone(), c)).chain(c.ecdsa.as_deref().map(|e| (h, e)))
            })
    }
}

/// Control-side TLS state: the last good certificate per Secret and per host.
#[derive(Debug)]
pub struct TlsState {
    fallback_default: LoadedCert,
    by_secret: HashMap<ObjectRef, (Arc<CertificatePem>, LoadedCert)>,
    last_good_by_host: HashMap<String, LoadedCert>,
}

/// A TLS problem found while applying (the snapshot's own problems are structural only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsProblem {
    /// The Secret.
    pub secret: ObjectRef,
    /// What is wrong.
    pub message: String,
}

impl TlsState {
    /// State with a fallback default certificate.
    pub fn new(fallback_default: LoadedCert) -> Self {
        Self {
            fallback_default,
            by_secret: HashMap::new(),
            last_good_by_host: HashMap::new(),
        }
    }

    fn load(
        &mut self,
        secret: &ObjectRef,
        pem: &Arc<CertificatePem>,
        problems: &mut Vec<TlsProblem>,
    ) -> Option<LoadedCert> {
        if let Some((old, loaded)) = self.by_secret.get(secret)
            && (Arc::ptr_eq(old, pem) || **old == **pem)
        {
            return Some(loaded.clone());
        }
        match load_pem(&pem.cert_pem, &pem.key_pem) {
            Ok(l) => {
                self.by_secret
                    .insert(secret.clone(), (Arc::clone(pem), l.clone()));
                Some(l)
            }
            Err(e) => {
                problems.push(TlsProblem {
                    secret: secret.clone(),
                    message: e.to_string(),
                });
                None
            }
        }
    }

    /// Builds the store for a snapshot. Hosts whose Secret is missing or invalid keep their last
    /// good certificate (or get the default when they never had one).
    pub fn build(
        &mut self,
        snapshot: &Snapshot,
        default_secret: Option<&ObjectRef>,
    ) -> (CertStore, Vec<TlsProblem>) {
        let mut problems = Vec::new();
        let default = default_secret
            .and_then(|s| snapshot.certificates().get(s).map(|p| (s, p)))
            .and_then(|(s, p)| self.load(s, p, &mut problems))
            .unwrap_or_else(|| self.fallback_default.clone());
        let mut store = CertStore::new(default);
        let mut good_hosts = HashMap::new();
        for b in snapshot.tls() {
            let loaded = match snapshot.certificates().get(&b.secret) {
                Some(pem) => self.load(&b.secret, pem, &mut problems),
                None => None,
            };
            let also = b.also.as_ref().and_then(|s| {
                let pem = snapshot.certificates().get(s)?;
                Some((s, self.load(s, pem, &mut problems)?))
            });
            let loaded = match (loaded, also) {
                (Some(first), Some((second_ref, second))) => {
                    Some(pair(first, second, second_ref, &mut problems))
                }
                // One of the two is broken: serve the other (its problem is reported).
                (one, other) => one.or(other.map(|(_, c)| c)),
            };
            let Some(cert) = loaded.or_else(|| self.last_good_by_host.get(&b.host).cloned()) else {
                continue;
            };
            good_hosts.insert(b.host.clone(), cert.clone());
            match b.host.strip_prefix('*') {
                Some(suffix) => store.wildcard.insert(suffix.to_string(), cert),
                None => store.exact.insert(b.host.clone(), cert),
            };
        }
        self.last_good_by_host = good_hosts;
        let used: std::collections::HashSet<&ObjectRef> = snapshot
            .tls()
            .iter()
            .flat_map(|b| std::iter::once(&b.secret).chain(&b.also))
            .chain(default_secret)
            .collect();
        self.by_secret.retain(|k, _| used.contains(k));
        (store, problems)
    }
}
