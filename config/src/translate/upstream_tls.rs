//! An Ingress's `proxy-ssl-*` resolved against its Secret: the CA bundle (`ca.crt`) and the
//! client certificate (`tls.crt`, `tls.key`) sluice presents to the pods. Whatever cannot be
//! honoured keeps the Ingress closed (503) with an Error: sluice never talks to a backend with
//! less checking than the Ingress asked for.

use k8s_openapi::api::networking::v1::Ingress;

use crate::annotations::upstream_tls::{ProxySsl, proxy_ssl};
use crate::model::{ObjectRef, Severity, UpstreamTlsSpec};
use crate::world::World;

use super::Problems;
use super::options::annotations_of;
use super::tls::secret_data;

const FIELD: &str = "metadata.annotations";

/// The Ingress's upstream TLS; `Ok(None)` without `proxy-ssl-*`, `Err` (reported) when the
/// Ingress must stay closed.
pub(super) fn resolve(
    ing: &Ingress,
    src: &ObjectRef,
    world: &World,
    p: &mut Problems,
) -> Result<Option<UpstreamTlsSpec>, String> {
    let mut fail = |why: String| {
        let msg = format!(
            "{why}; TLS to the backend cannot be what the Ingress asks, so its routes answer 503"
        );
        p.report(Severity::Error, "InvalidUpstreamTLS", src, FIELD, &msg);
        msg
    };
    let ProxySsl {
        secret,
        verify,
        name,
        sni,
    } = match proxy_ssl(annotations_of(ing)) {
        Ok(None) => return Ok(None),
        Ok(Some(s)) => s,
        Err(e) => return Err(fail(e.to_string())),
    };
    let mut spec = UpstreamTlsSpec {
        ca_pem: None,
        client: None,
        verify,
        name,
        sni,
        secret: None,
    };
    if let Some(secret) = secret {
        let ns = secret.namespace.unwrap_or_else(|| src.namespace.clone());
        let sref = ObjectRef::new("Secret", &ns, &secret.name);
        let Some(s) = world.secrets.get(&(ns, secret.name)) else {
            return Err(fail(format!("proxy-ssl-secret: {sref} not found")));
        };
        if let Some(ca) = secret_data(s, "ca.crt").filter(|c| !c.is_empty()) {
            if let Err(e) = crate::pem::check_certificates(ca) {
                return Err(fail(format!("proxy-ssl-secret: {sref} ca.crt: {e}")));
            }
            spec.ca_pem = Some(ca.to_vec());
        }
        let (crt, key) = (secret_data(s, "tls.crt"), secret_data(s, "tls.key"));
        if crt.is_some() || key.is_some() {
            match crate::pem::check_pem(crt, key) {
                Ok(pem) => spec.client = Some(pem),
                Err(e) => return Err(fail(format!("proxy-ssl-secret: {sref} {e}"))),
            }
        }
        if verify && spec.ca_pem.is_none() {
            return Err(fail(format!(
                "proxy-ssl-verify: on, but {sref} has no ca.crt to verify against"
            )));
        }
        spec.secret = Some(sref);
    }
    Ok(Some(spec))
}
