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
mod canary;
pub mod headers;

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
use crate::host::parse_rule_host;
use crate::model::{
    HostMatch, ObjectRef, PathMatch, Problem, Route, RouteOptions, Settings, Severity, VirtualHost,
};
use crate::path::parse_path;
use crate::snapshot::{Snapshot, SnapshotParts};
use crate::world::World;

pub use crate::resolve::{check_tls_secret, cluster_endpoints, resolve_endpoints};
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
            message: message.into(),
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
    translate_all(world, opts).0
}

/// [`translate`], with the status the Gateway API objects are owed (computed from the same
/// reading of the world as the snapshot).
pub fn translate_all(
    world: &World,
    opts: &TranslateOptions,
) -> (Snapshot, crate::gateway::status::GatewayStatuses) {
    let mut problems = Problems::default();
    let settings = options::settings(world, opts, &mut problems);
    let mut ours: Vec<&Ingress> = world
        .ingresses
        .values()
        .map(|i| i.as_ref())
        .filter(|i| ingress_is_ours(world, i, opts))
        .collect();
    ours.sort_by_cached_key(|i| age_key(i));
    let owners = (opts.host_ownership == HostOwnership::Namespace).then(|| Owners::claim(&ours));
    let reach = reach::Reach::new(
        settings.allow_cross_namespace,
        opts.host_ownership == HostOwnership::Namespace,
    );

    let tls = tls::collect(world, &ours, owners.as_ref(), &mut problems);
    let mut backends =
        backend::Resolver::new(world, settings.balance.clone(), settings.max_in_flight);
    let mut hosts: BTreeMap<HostMatch, HostRoutes> = BTreeMap::new();
    // Client-certificate rules per host: the oldest Ingress's (ingress-nginx sets them on the
    // server, so they cover every path of the host).
    let mut host_certs: BTreeMap<HostMatch, (ObjectRef, crate::behaviour::ClientCertAuth)> =
        BTreeMap::new();
    // Hosts whose client-certificate rule (that of the oldest Ingress that sets one) cannot be
    // enforced: every route of such a host closes, whichever Ingress defines it.
    let mut host_cert_locks: BTreeMap<HostMatch, (ObjectRef, String)> = BTreeMap::new();
    let mut default_backend: Option<Route> = None;
    // Canary paths wait for every main route; regex hosts are rewritten once all is read.
    let mut canaries = Vec::new();
    let mut passthrough: BTreeMap<String, crate::model::Passthrough> = BTreeMap::new();
    let mut regex_hosts = std::collections::BTreeSet::new();
    let mut twins = Vec::new();
    let mut alias_of: Vec<(String, String)> = Vec::new();
    let mut written: BTreeMap<(HostMatch, PathMatch), (String, String)> = BTreeMap::new();

    for ing in &ours {
        let src = ingress_ref(ing);
        // The controller ConfigMap's global authentication, as this Ingress's annotations.
        let with_global = auth::with_global_auth(ing, &settings);
        let global_auth = with_global.is_some();
        let ing: &Ingress = with_global.as_ref().unwrap_or(ing);
        let Some(spec) = ing.spec.as_ref() else {
            continue;
        };
        options::review_problem(ing, &src, &mut problems);
        let canary_rules = match annotations::backends::canary(options::annotations_of(ing)) {
            Ok(c) => c,
            Err(e) => {
                // A canary whose rules cannot be read must not take the main route's traffic.
                problems.invalid_annotation(&src, &e);
                problems.report(
                    Severity::Error,
                    "InvalidCanary",
                    &src,
                    "metadata.annotations",
                    "canary rules unreadable; this Ingress is ignored",
                );
                continue;
            }
        };
        let mut options = options::route_options(ing, &src, &settings, &mut problems);
        let regex = options::wants_regex(ing);
        let www = options::www_redirect(ing, &src, &mut problems);
        let aliases = options::server_aliases(ing, &src, &mut problems);
        let mut pool = backend::PoolAnnotations::read(ing, &src, &mut problems);
        let mut locked = options::fail_closed(ing, &src, &mut problems);
        if locked.is_none() {
            // The controller ConfigMap's global auth service is the operator's, not the
            // Ingress's: it may be in any namespace.
            let auth_reach = reach::Reach {
                others: reach.others || global_auth,
                ..reach
            };
            let allow = &settings.auth_url_allow;
            let resolved = auth::resolve(
                ing,
                &src,
                world,
                (auth_reach, allow),
                &mut backends,
                &mut problems,
            )
            .and_then(|a| {
                options.edits.auth = a;
                auth::client_cert(ing, &src, world, reach, &mut problems)
            });
            let resolved = resolved
                .and_then(|c| {
                    options.edits.client_cert = c;
                    headers::resolve(ing, &src, world, &settings, reach, &mut problems)
                })
                .and_then(|h| {
                    options.edits.response_headers = h;
                    upstream_tls::resolve(ing, &src, world, &mut problems)
                });
            match resolved {
                Ok(t) => pool.tls = t,
                Err(why) => locked = Some(crate::model::RouteAction::Unavailable(why)),
            }
        }
        // `auth-tls-*` asked for but not enforced (a missing Secret, a `ca.crl`, an unreadable
        // value, or any other reason this Ingress is closed): a rule of the whole host.
        let cert_unenforced = match &locked {
            Some(crate::model::RouteAction::Unavailable(why))
                if auth::asks_client_cert(ing) && options.edits.client_cert.is_none() =>
            {
                Some(why.clone())
            }
            _ => None,
        };
        // A closed Ingress stays closed: its default backend must not serve in its place.
        let fallback = backend::fallback(&mut backends, ing, &src, &pool, &mut problems)
            .filter(|_| locked.is_none());
        let own_errors = annotations::traffic::custom_errors(options::annotations_of(ing))
            .is_ok_and(|c| !c.is_empty());
        if fallback.is_none() {
            // Error pages need the default backend; without one the list does nothing, and an
            // empty list keeps the route on the data plane's direct path.
            options.edits.custom_errors.clear();
        }
        if fallback.is_none() && own_errors {
            problems.report(
                Severity::Warning,
                "CustomErrorsWithoutBackend",
                &src,
                "metadata.annotations[nginx.ingress.kubernetes.io/custom-http-errors]",
                "ignored: sluice has no global default backend; set the default-backend annotation to the Service that serves the error pages",
            );
        }
        if locked.is_none() {
            passthrough::collect(
                ing,
                &src,
                opts,
                (&mut backends, &pool),
                &mut passthrough,
                &mut problems,
            );
        }
        if let Some(db) = spec
            .default_backend
            .as_ref()
            .filter(|_| canary_rules.is_none())
        {
            if let Some(existing) = &default_backend {
                problems.report(
                    Severity::Warning,
                    "Conflict",
                    &src,
                    "spec.defaultBackend",
                    format!(
                        "ignored: {} is older and also sets a defaultBackend",
                        existing.source
                    ),
                );
            } else {
                let action = locked.clone().unwrap_or_else(|| {
                    backends.resolve(&src, "spec.defaultBackend", db, &pool, &mut problems)
                });
                default_backend = Some(Route {
                    path: PathMatch {
                        kind: crate::model::PathKind::Prefix,
                        path: String::new(),
                    },
                    action,
                    source: src.clone(),
                    options: RouteOptions {
                        ssl_redirect: false,
                        force_ssl_redirect: false,
                        ..options.clone()
                    },
                    canary: None,
                    fallback: fallback.clone(),
                });
            }
        }
        for (ri, rule) in spec.rules.iter().flatten().enumerate() {
            let host = match parse_rule_host(rule.host.as_deref().unwrap_or_default()) {
                Ok(h) => h,
                Err(e) => {
                    problems.report(
                        Severity::Error,
                        "InvalidHost",
                        &src,
                        format!("spec.rules[{ri}].host"),
                        format!("{e}; rule ignored"),
                    );
                    continue;
                }
            };
            if let Some(owner) = owners
                .as_ref()
                .and_then(|o| o.other_owner(&host, &src.namespace))
            {
                problems.report(
                    Severity::Error,
                    "HostOwnedByAnotherNamespace",
                    &src,
                    format!("spec.rules[{ri}].host"),
                    format!(
                        "host {host} belongs to namespace {owner}, whose Ingress claimed it first (--host-ownership namespace); rule ignored"
                    ),
                );
                continue;
            }
            let Some(http) = &rule.http else { continue };
            for (pi, p) in http.paths.iter().enumerate() {
                let field = format!("spec.rules[{ri}].http.paths[{pi}]");
                let path_type = p.path_type.as_str();
                if path_type.is_empty() {
                    problems.report(
                        Severity::Warning,
                        "MissingPathType",
                        &src,
                        format!("{field}.pathType"),
                        "pathType is required; treated as ImplementationSpecific (= Prefix)",
                    );
                }
                let path = match parse_path(p.path.as_deref(), path_type) {
                    Ok(m) => m,
                    Err(e) => {
                        problems.report(
                            Severity::Error,
                            "InvalidPath",
                            &src,
                            format!("{field}.path"),
                            format!("{e}; path ignored"),
                        );
                        continue;
                    }
                };
                // The path's backend (resolved only for a path that is kept: a conflicting one
                // creates no pool).
                let resolve = |backends: &mut backend::Resolver<'_>, problems: &mut Problems| {
                    locked.clone().unwrap_or_else(|| {
                        backends.resolve(
                            &src,
                            &format!("{field}.backend"),
                            &p.backend,
                            &pool,
                            problems,
                        )
                    })
                };
                if let Some(rules) = &canary_rules {
                    let action = resolve(&mut backends, &mut problems);
                    canaries.push(canary::PendingCanary {
                        host: host.clone(),
                        path,
                        field,
                        action,
                        source: src.clone(),
                        rules: rules.clone(),
                    });
                    continue;
                }
                if regex {
                    regex_hosts.insert(host.clone());
                }
                if let HostMatch::Exact(h) = &host {
                    for a in &aliases {
                        alias_of.push((a.clone(), h.clone()));
                    }
                }
                if let (true, HostMatch::Exact(h)) = (www, &host) {
                    twins.push((canary::www_twin(h), h.clone(), src.clone(), options.clone()));
                }
                if let Some(c) = &options.edits.client_cert {
                    host_certs
                        .entry(host.clone())
                        .or_insert_with(|| (src.clone(), c.clone()));
                }
                if let Some(why) = &cert_unenforced
                    && !host_certs.contains_key(&host)
                {
                    host_cert_locks
                        .entry(host.clone())
                        .or_insert_with(|| (src.clone(), why.clone()));
                }
                let routes = hosts.entry(host.clone()).or_default();
                if let Some(existing) = routes.get(&path) {
                    problems.report(
                        Severity::Warning,
                        "Conflict",
                        &src,
                        field,
                        format!(
                            "host {host} path {:?} ({:?}) is already defined by the older {}; ignored here",
                            p.path.as_deref().unwrap_or("/"),
                            path.kind,
                            existing.source
                        ),
                    );
                    continue;
                }
                let action = resolve(&mut backends, &mut problems);
                let mut route_opts = options.clone();
                route_opts.ssl_redirect &= tls.covers(&host);
                if global_auth && auth::skips_global_auth(&path, &settings) {
                    route_opts.edits.auth = None;
                }
                written.insert(
                    (host.clone(), path.clone()),
                    (p.path.clone().unwrap_or_else(|| "/".to_string()), field),
                );
                routes.insert(
                    path.clone(),
                    Box::new(Route {
                        path,
                        action,
                        source: src.clone(),
                        options: route_opts,
                        canary: None,
                        fallback: fallback.clone(),
                    }),
                );
            }
        }
    }

    auth::client_cert_per_host(&mut hosts, &host_certs, &mut problems);
    canary::attach(&mut hosts, canaries, &mut problems);
    // After the canaries attach: a closed route takes no canary traffic either.
    auth::close_hosts_without_their_cert_rule(&mut hosts, &host_cert_locks, &mut problems);
    twins.dedup_by(|a, b| a.0 == b.0);
    canary::www_redirects(&mut hosts, twins);
    for host in &regex_hosts {
        if let Some(routes) = hosts.remove(host) {
            let routes = canary::regex_routes(host, routes, &written, &mut problems);
            hosts.insert(host.clone(), routes);
        }
    }
    // After the regex rewrite, so that an alias serves its host's routes as they match.
    canary::aliases(&mut hosts, alias_of);
    let virtual_hosts = hosts
        .into_iter()
        .filter(|(_, routes)| !routes.is_empty())
        .map(|(host, routes)| VirtualHost {
            host,
            routes: routes.into_values().map(|r| *r).collect(),
        })
        .collect();
    let (bindings, mut certificates) = tls.finish(world, &mut problems);
    if let Some(secret) = &opts.default_certificate
        && !certificates.contains_key(secret)
        && let Some(pem) = tls::load_secret(
            world,
            secret,
            secret,
            "--default-ssl-certificate",
            &mut problems,
        )
    {
        certificates.insert(secret.clone(), pem);
    }
    let gw = crate::gateway::translate(world, &opts.gateway, &settings);
    let mut clusters = backends.finish();
    for c in gw.clusters {
        clusters.entry(c.key.clone()).or_insert(c);
    }
    for (k, v) in gw.certificates {
        certificates.entry(k).or_insert(v);
    }
    let mut problems = problems.0;
    problems.extend(crate::gateway::unreadable_problems(world));
    problems.extend(crate::gateway::status_problems(&gw.status));
    problems.sort();
    problems.dedup();
    let snapshot = Snapshot::new(SnapshotParts {
        virtual_hosts,
        default_backend,
        clusters,
        tls: bindings,
        certificates,
        settings,
        passthrough: passthrough.into_values().collect(),
        problems,
        gateway_sockets: gw.sockets,
    });
    (snapshot, gw.status)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_headers;
#[cfg(test)]
mod tests_traffic;
