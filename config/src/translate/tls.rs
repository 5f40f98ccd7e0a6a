//! TLS sections: host → Secret bindings (the oldest Ingress wins a host) and the certificates of
//! the Secrets they name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use crate::host::{host_matches, parse_rule_host};
use crate::model::{Certificates, HostMatch, ObjectRef, Severity, TlsBinding};
use crate::pem::check_pem;
use crate::world::World;

use super::{Owners, Problems, ingress_ref};

pub use crate::resolve::{TLS_SECRET_TYPE, secret_data};

/// TLS hosts gathered from all our Ingresses.
pub(super) struct TlsHosts {
    /// Host (as written, lower-cased) → binding; `None` secret means "default certificate".
    hosts: BTreeMap<String, Option<TlsBinding>>,
    matches: Vec<HostMatch>,
}

pub(super) fn collect(
    world: &World,
    ours: &[&Ingress],
    owners: Option<&Owners>,
    p: &mut Problems,
) -> TlsHosts {
    let _ = world;
    let mut hosts: BTreeMap<String, Option<TlsBinding>> = BTreeMap::new();
    for ing in ours {
        let src = ingress_ref(ing);
        let Some(spec) = &ing.spec else { continue };
        for (ti, tls) in spec.tls.iter().flatten().enumerate() {
            let listed: Vec<String> = match tls.hosts.as_deref() {
                Some(h) if !h.is_empty() => h.to_vec(),
                _ => spec
                    .rules
                    .iter()
                    .flatten()
                    .filter_map(|r| r.host.clone())
                    .filter(|h| !h.is_empty())
                    .collect(),
            };
            for (hi, raw) in listed.iter().enumerate() {
                let host = match parse_rule_host(raw) {
                    Ok(HostMatch::Any) => continue,
                    Ok(h) => {
                        if let Some(owner) = owners.and_then(|o| o.other_owner(&h, &src.namespace))
                        {
                            p.report(
                                Severity::Error,
                                "HostOwnedByAnotherNamespace",
                                &src,
                                format!("spec.tls[{ti}].hosts[{hi}]"),
                                format!("host {h} belongs to namespace {owner} (--host-ownership namespace); its certificate is not used"),
                            );
                            continue;
                        }
                        h.to_string()
                    }
                    Err(e) => {
                        p.report(
                            Severity::Error,
                            "InvalidHost",
                            &src,
                            format!("spec.tls[{ti}].hosts[{hi}]"),
                            format!("{e}; ignored"),
                        );
                        continue;
                    }
                };
                let binding =
                    tls.secret_name
                        .as_ref()
                        .filter(|s| !s.is_empty())
                        .map(|s| TlsBinding {
                            host: host.clone(),
                            secret: ObjectRef::new("Secret", src.namespace.clone(), s.clone()),
                            source: src.clone(),
                            also: None,
                        });
                match hosts.get_mut(&host) {
                    None => {
                        hosts.insert(host, binding);
                    }
                    Some(existing) => {
                        let same = existing.as_ref().map(|b| &b.secret)
                            == binding.as_ref().map(|b| &b.secret)
                            || existing.as_ref().and_then(|b| b.also.as_ref())
                                == binding.as_ref().map(|b| &b.secret);
                        // The same Ingress naming a second Secret for the host: its
                        // certificate of the other key type (checked when loaded).
                        let second = match (existing.as_mut(), &binding) {
                            (Some(e), Some(b)) if !same && e.source == src && e.also.is_none() => {
                                e.also = Some(b.secret.clone());
                                true
                            }
                            _ => false,
                        };
                        if !same && !second {
                            let by = existing.as_ref().map_or_else(
                                || "an older Ingress".to_string(),
                                |b| b.source.to_string(),
                            );
                            p.report(
                                Severity::Warning,
                                "Conflict",
                                &src,
                                format!("spec.tls[{ti}]"),
                                format!("TLS for host {host} is already set by {by}; ignored here"),
                            );
                        }
                    }
                }
            }
        }
    }
    let matches = hosts
        .keys()
        .filter_map(|h| parse_rule_host(h).ok())
        .collect();
    TlsHosts { hosts, matches }
}

impl TlsHosts {
    /// Whether a virtual host has TLS configured (so ssl-redirect applies to it).
    pub(super) fn covers(&self, host: &HostMatch) -> bool {
        match host {
            HostMatch::Any => false,
            HostMatch::Wildcard(_) => self.hosts.contains_key(&host.to_string()),
            HostMatch::Exact(h) => self.matches.iter().any(|m| host_matches(m, h)),
        }
    }

    /// Checks the named Secrets and returns bindings plus valid certificates.
    pub(super) fn finish(self, world: &World, p: &mut Problems) -> (Vec<TlsBinding>, Certificates) {
        let bindings: Vec<TlsBinding> = self.hosts.into_values().flatten().collect();
        let secrets: BTreeSet<(&ObjectRef, &ObjectRef)> = bindings
            .iter()
            .flat_map(|b| {
                std::iter::once(&b.secret)
                    .chain(&b.also)
                    .map(|s| (s, &b.source))
            })
            .collect();
        let mut certs = Certificates::new();
        let mut seen = BTreeSet::new();
        for (secret, source) in secrets {
            if !seen.insert(secret) {
                continue;
            }
            let field = format!("spec.tls (secretName {})", secret.name);
            if let Some(pem) = load_secret(world, secret, source, &field, p) {
                certs.insert(secret.clone(), pem);
            }
        }
        (bindings, certs)
    }
}

/// Reads and checks one TLS Secret; a missing Secret is reported on `source`/`field`, an invalid
/// one on the Secret itself.
pub(super) fn load_secret(
    world: &World,
    secret: &ObjectRef,
    source: &ObjectRef,
    field: &str,
    p: &mut Problems,
) -> Option<Arc<crate::model::CertificatePem>> {
    const KEEP: &str = "its hosts use the last good or the default certificate";
    let Some(s) = world
        .secrets
        .get(&(secret.namespace.clone(), secret.name.clone()))
    else {
        p.report(
            Severity::Error,
            "SecretNotFound",
            source,
            field,
            format!("{secret} not found; {KEEP}"),
        );
        return None;
    };
    let ty = s.type_.as_deref().unwrap_or("Opaque");
    if ty != TLS_SECRET_TYPE {
        p.report(
            Severity::Error,
            "InvalidSecret",
            secret,
            "type",
            format!("type is {ty:?}, expected {TLS_SECRET_TYPE:?}; {KEEP}"),
        );
        return None;
    }
    match check_pem(secret_data(s, "tls.crt"), secret_data(s, "tls.key")) {
        Ok(pem) => Some(Arc::new(pem)),
        Err(e) => {
            p.report(
                Severity::Error,
                "InvalidSecret",
                secret,
                "data",
                format!("{e}; {KEEP}"),
            );
            None
        }
    }
}
