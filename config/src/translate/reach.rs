//! Which namespaces an Ingress's annotations may name objects in. An Ingress reads the Secrets,
//! Services and ConfigMaps of its own namespace; another namespace's only where the operator
//! says so:
//!
//! - a Secret (`auth-secret`, `auth-tls-secret`) of another namespace only with the controller
//!   ConfigMap's `allow-cross-namespace-resources: "true"`, as ingress-nginx refuses it ("cross
//!   namespace usage of secrets is not allowed") unless that key is set;
//! - under `--host-ownership namespace` (namespaces are tenants) nothing of another namespace
//!   at all — no Secret, no `auth-url` Service, no `custom-headers` ConfigMap — whatever the
//!   ConfigMap says: a tenant must neither read another's objects nor learn from a Warning
//!   whether they exist, so the refusal is decided before any lookup and names only what the
//!   Ingress itself wrote.

use crate::model::{ObjectRef, Severity};

use super::Problems;

/// What one Ingress may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reach {
    /// Secrets of other namespaces.
    pub secrets: bool,
    /// Services and ConfigMaps of other namespaces.
    pub others: bool,
}

impl Reach {
    /// The reach of the Ingresses of one translation: `allow` is the ConfigMap's
    /// `allow-cross-namespace-resources`, `tenants` whether namespaces own their hosts.
    pub(super) fn new(allow: bool, tenants: bool) -> Self {
        Self {
            secrets: allow && !tenants,
            others: !tenants,
        }
    }

    /// `Err` (reported as an Error on the Ingress: its routes answer 503) when `src` names
    /// `kind` `namespace/name` in a namespace it may not reach.
    pub(super) fn check(
        self,
        src: &ObjectRef,
        (kind, namespace, name): (&str, &str, &str),
        field: &str,
        p: &mut Problems,
    ) -> Result<(), String> {
        let allowed = if kind == "Secret" {
            self.secrets
        } else {
            self.others
        };
        if allowed || namespace == src.namespace {
            return Ok(());
        }
        let why = if self.others {
            "set allow-cross-namespace-resources: \"true\" in the controller ConfigMap to allow it"
        } else {
            "namespaces own their hosts (--host-ownership namespace)"
        };
        let msg = format!(
            "{kind} {namespace}/{name} is in another namespace than the Ingress, and cross-namespace references are refused ({why}); the routes answer 503"
        );
        p.report(Severity::Error, "CrossNamespaceReference", src, field, &msg);
        Err(msg)
    }
}
