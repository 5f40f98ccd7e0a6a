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

    /// `(host, certificate)` pairs, for metrics and status.
    pub fn hosts(&self) -> impl Iterator<Item = (String, &LoadedCert)> {
        self.exact
            .iter()
            .map(|(h, c)| (h.clone(), c))
            .chain(self.wildcard.iter().map(|(s, c)| (format!("*{s}"), c)))
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
            .map(|b| &b.secret)
            .chain(default_secret)
            .collect();
        self.by_secret.retain(|k, _| used.contains(k));
        (store, problems)
    }
}
