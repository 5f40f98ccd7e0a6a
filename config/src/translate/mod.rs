//! Translation of Kubernetes objects into a [`Snapshot`].
//!
//! Semantics (Ingress v1 and KEP-1453):
//! - An Ingress is ours when `spec.ingressClassName` names an IngressClass whose
//!   `spec.controller` is our controller name; or, without that field, when the legacy
//!   `kubernetes.io/ingress.class` annotation equals our class name; or, with neither, when one of
//!   our IngressClasses is marked `ingressclass.kubernetes.io/is-default-class: "true"`.
//! - Rules for one host are merged across all our Ingresses. When two Ingresses define the same
//!   host + path + type, the oldest (`creationTimestamp`, then namespace/name) wins and the other
//!   gets a reported conflict. Objects without a timestamp (files) order after those with one.
//! - `ImplementationSpecific` behaves exactly as `Prefix`.
//! - When a more specific virtual host has no matching path, the request falls through to the
//!   wildcard host, then to host-less rules, then to the `defaultBackend`, then 404.
//! - A `tls` entry without `hosts` covers the hosts of its Ingress's rules.

mod auth;
mod backend;
mod builder;
mod canary;
pub mod headers;
mod ingress;

/// A host's routes while translating, by path. Boxed: a B-tree node holds room for eleven
/// entries, and most hosts have one route, so unboxed routes (about a kilobyte each) made the
/// map of 10,000 one-route hosts weigh over 100 MB during a translation.
type HostRoutes = BTreeMap<PathMatch, Box<Route>>;
mod options;
mod ownership;
mod passthrough;
mod reach;
mod tls;
mod upstream_tls;

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::annotations;
use crate::model::{ObjectRef, PathMatch, Problem, Route, Settings, Severity};
use crate::snapshot::Snapshot;
use crate::world::World;

pub use crate::resolve::{check_tls_secret, cluster_endpoints, resolve_endpoints};
pub use builder::Translation;
pub use ownership::{HostOwnership, Owners};

/// Default controller name (`spec.controller` of our IngressClass).
pub const DEFAULT_CONTROLLER_NAME: &str = "sluice.dev/ingress-controller";
/// Default class name for the legacy annotation.
pub const DEFAULT_INGRESS_CLASS: &str = "sluice";

/// Who we are and global settings.
#[derive(Debug, Clone)]
pub struct TranslateOptions {
    /// IngressClass `spec.controller` value we own.
    pub controller_name: String,
    /// Class name matched against the legacy `kubernetes.io/ingress.class` annotation.
    pub ingress_class: String,
    /// Only Ingresses in this namespace, when set.
    pub watch_namespace: Option<String>,
    /// Global settings copied into the snapshot.
    pub settings: Settings,
    /// Secret whose certificate is served for unknown or missing SNI (`--default-ssl-certificate`);
    /// its certificate is carried in the snapshot's certificates.
    pub default_certificate: Option<ObjectRef>,
    /// Whether a host's rules merge across namespaces (`--host-ownership`).
    pub host_ownership: HostOwnership,
    /// The controller ConfigMap (`--configmap`), read from the world.
    pub configmap: Option<ObjectRef>,
    /// Whether the `ssl-passthrough` annotation is acted on (`--enable-ssl-passthrough`).
    pub ssl_passthrough: bool,
    /// The Gateway API: our controller name and the Gateways' addresses.
    pub gateway: crate::gateway::GatewayOptions,
}

impl Default for TranslateOptions {
    fn default() -> Self {
        Self {
            controller_name: DEFAULT_CONTROLLER_NAME.to_string(),
            ingress_class: DEFAULT_INGRESS_CLASS.to_string(),
            watch_namespace: None,
            settings: Settings::default(),
            default_certificate: None,
            host_ownership: HostOwnership::Shared,
            configmap: None,
            ssl_passthrough: false,
            gateway: crate::gateway::GatewayOptions::default(),
        }
    }
}

/// Collects problems during one translation.
#[derive(Debug, Default)]
pub(crate) struct Problems(Vec<Problem>);

impl Problems {
    pub(crate) fn report(
        &mut self,
        severity: Severity,
        reason: &'static str,
        object: &ObjectRef,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.0.push(Problem {
            object: object.clone(),
            field: field.into(),
            message: crate::annotations::in_force::redact_urls(&message.into()),
            severity,
            reason,
        });
    }

    /// An annotation whose value cannot be used: a warning on its key; the caller falls back.
    pub(crate) fn invalid_annotation(
        &mut self,
        object: &ObjectRef,
        e: &annotations::AnnotationError,
    ) {
        self.report(
            Severity::Warning,
            "InvalidAnnotation",
            object,
            format!("metadata.annotations[{}]", e.name),
            e.to_string(),
        );
    }
}

/// Whether this IngressClass belongs to us.
pub fn class_is_ours(class: &IngressClass, opts: &TranslateOptions) -> bool {
    class
        .spec
        .as_ref()
        .and_then(|s| s.controller.as_deref())
        .is_some_and(|c| c == opts.controller_name)
}

/// Whether this Ingress belongs to us (see the module docs for the rules).
pub fn ingress_is_ours(world: &World, ing: &Ingress, opts: &TranslateOptions) -> bool {
    if let Some(ns) = &opts.watch_namespace
        && ing.metadata.namespace.as_deref().unwrap_or_default() != ns
    {
        return false;
    }
    if let Some(class) = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
    {
        return world
            .ingress_classes
            .get(&(String::new(), class.to_string()))
            .is_some_and(|c| class_is_ours(c, opts));
    }
    if let Some(a) = ing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::INGRESS_CLASS))
    {
        return a == &opts.ingress_class;
    }
    world.ingress_classes.values().any(|c| {
        class_is_ours(c, opts)
            && c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(annotations::DEFAULT_CLASS))
                .is_some_and(|v| v == "true")
    })
}

/// With `--host-ownership namespace`, who owns which host among `ingresses` (the status writer
/// leaves Ingresses that own nothing without status); `None` when hosts are shared.
pub fn host_owners<'a>(
    world: &World,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    opts: &TranslateOptions,
) -> Option<Owners> {
    if opts.host_ownership != HostOwnership::Namespace {
        return None;
    }
    let mut ours: Vec<&Ingress> = ingresses
        .into_iter()
        .filter(|i| ingress_is_ours(world, i, opts))
        .collect();
    ours.sort_by_cached_key(|i| age_key(i));
    Some(Owners::claim(&ours))
}

/// Reference to an Ingress for reports.
pub fn ingress_ref(ing: &Ingress) -> ObjectRef {
    ObjectRef::new(
        "Ingress",
        ing.metadata.namespace.clone().unwrap_or_default(),
        ing.metadata.name.clone().unwrap_or_default(),
    )
}

/// Conflict order: oldest first, objects without a timestamp after those with one, then by
/// namespace/name.
fn age_key(ing: &Ingress) -> (bool, Option<Time>, ObjectRef) {
    let ts = ing.metadata.creation_timestamp.clone();
    (ts.is_none(), ts, ingress_ref(ing))
}

/// Translates the world into a snapshot. Never panics; every problem is reported in
/// [`Snapshot::problems`] and only the bad piece is dropped (or answers 503).
pub fn translate(world: &World, opts: &TranslateOptions) -> Snapshot {
    translate_all(world, opts).snapshot
}

/// [`translate`], with the status every object is owed (computed from the same reading of the
/// world as the snapshot): each source collected into one builder (`translate/builder.rs`),
/// then one finish.
pub fn translate_all(world: &World, opts: &TranslateOptions) -> Translation {
    translate_all_with(world, opts, None)
}

/// [`translate_all`] for a loop that translates again on every change: `memo` keeps what the
/// next translation can reuse (the Gateway API routes' compiled rules), and the result is the
/// same as without it.
pub fn translate_all_with(
    world: &World,
    opts: &TranslateOptions,
    memo: Option<&mut crate::gateway::RouteMemo>,
) -> Translation {
    let ours = builder::ours_by_age(world, opts);
    let mut b = builder::Builder::new(world, opts, &ours);
    for ing in &ours {
        b.ingress(ing);
    }
    b.gateway_api(memo);
    b.finish()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_headers;
#[cfg(test)]
mod tests_traffic;
