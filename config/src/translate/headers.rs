//! `custom-headers`, resolved against the world: the ConfigMap it names, each field checked
//! against the controller ConfigMap's `global-allowed-response-headers`. As in ingress-nginx,
//! whatever cannot be set (a missing ConfigMap, one refused field) closes the Ingress's routes
//! (503) rather than serving them without the fields the owner asked for (a missing
//! `Content-Security-Policy` is a hole, not a detail).

use k8s_openapi::api::networking::v1::Ingress;

use crate::annotations::headers::{self, refusal};
use crate::model::{ObjectRef, Settings, Severity};
use crate::world::{DROPPED_BYTES, World};

use super::Problems;
use super::options::annotations_of;

const FIELD: &str = "metadata.annotations[nginx.ingress.kubernetes.io/custom-headers]";

/// The ConfigMap key `custom-headers` of this Ingress names, if it names one that reads.
pub fn reference(ing: &Ingress) -> Option<(String, String)> {
    let r = headers::custom_headers(annotations_of(ing)).ok()??;
    let ns = r
        .namespace
        .or_else(|| ing.metadata.namespace.clone())
        .unwrap_or_default();
    Some((ns, r.name))
}

/// The fields `custom-headers` sets, sorted by name; empty without the annotation. `Err`: the
/// routes must stay closed (the reason is reported already, as an Error).
pub(super) fn resolve(
    ing: &Ingress,
    src: &ObjectRef,
    world: &World,
    settings: &Settings,
    reach: super::reach::Reach,
    p: &mut Problems,
) -> Result<Vec<(String, String)>, String> {
    let spec = match headers::custom_headers(annotations_of(ing)) {
        Ok(None) => return Ok(Vec::new()),
        Ok(Some(s)) => s,
        Err(e) => {
            let msg = format!("{e}; the routes answer 503");
            p.report(Severity::Error, "InvalidCustomHeaders", src, FIELD, &msg);
            return Err(msg);
        }
    };
    let ns = spec.namespace.unwrap_or_else(|| src.namespace.clone());
    reach.check(src, ("ConfigMap", &ns, &spec.name), FIELD, p)?;
    let cref = ObjectRef::new("ConfigMap", &ns, &spec.name);
    let Some(cm) = world.config_maps.get(&(ns, spec.name)) else {
        let msg = format!("custom-headers: {cref} not found; the routes answer 503");
        p.report(Severity::Error, "CustomHeadersNotFound", src, FIELD, &msg);
        return Err(msg);
    };
    let dropped = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DROPPED_BYTES));
    if let Some(bytes) = dropped {
        let msg = format!(
            "custom-headers: {cref} holds {bytes} bytes of data, more than a set of response fields can be; the routes answer 503"
        );
        p.report(Severity::Error, "InvalidCustomHeaders", src, FIELD, &msg);
        return Err(msg);
    }
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for (name, value) in cm.data.iter().flatten() {
        match refusal(name, value, &settings.allowed_response_headers) {
            None => out.push((name.clone(), value.clone())),
            Some(why) => refused.push(why),
        }
    }
    if !refused.is_empty() {
        let msg = format!(
            "custom-headers: {cref}: {}; the routes answer 503",
            refused.join("; ")
        );
        p.report(Severity::Error, "InvalidCustomHeaders", src, FIELD, &msg);
        return Err(msg);
    }
    Ok(out)
}
