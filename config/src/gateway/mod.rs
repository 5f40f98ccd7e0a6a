//! The Gateway API (`gateway.networking.k8s.io`): GatewayClass, Gateway, HTTPRoute, GRPCRoute
//! and ReferenceGrant, translated into the same [`crate::Snapshot`] as Ingresses (see
//! ARCHITECTURE.md §8). Translation is pure: the sockets and rules the data plane serves, the
//! pools they use, and the status every object is owed, from the world alone.

pub mod frontend;
mod grpc;
mod listeners;
mod memo;
mod refs;
mod routes;
pub mod status;
mod tls_route;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use crate::gateway_api::HTTPRoute;
use crate::gateway_model::{GatewayListener, GatewaySocket, HostRules, hostname};
use crate::model::{Certificates, ClusterKey, ClusterSpec, ObjectRef, Settings};
use crate::world::World;
use listeners::Proto;
pub use memo::{MemoStats, RouteMemo};
use status::{ClassState, Cond, GatewayState, GatewayStatuses, ListenerState};

/// The `spec.controllerName` of GatewayClasses sluice runs.
pub const DEFAULT_GATEWAY_CONTROLLER: &str = "sluice.dev/gateway-controller";

/// The features sluice claims in `GatewayClass.status.supportedFeatures` (names of the
/// conformance suite's `pkg/features`), sorted as the spec requires: only what translation
/// and the data plane do and the conformance run passes. `tests/gateway-api/features.txt`
/// hands the same list to the suite (`tests/tests/gateway.rs` keeps the two equal).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
    "TLSRoute",
];

/// What Gateway API translation needs beyond the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayOptions {
    /// GatewayClasses whose `spec.controllerName` is this are ours.
    pub controller_name: String,
    /// `--gateway-addresses`: one per Gateway; empty: Gateways use the node's addresses.
    pub addresses: Vec<IpAddr>,
    /// Where the Ingress listeners are bound: their sockets stay theirs, so a Gateway
    /// listener that would need one of their ports on an address they cover is refused
    /// (`PortUnavailable`), never served by the other side's rules.
    pub ingress_listeners: Vec<std::net::SocketAddr>,
    /// The addresses the last translation gave each Gateway: kept, like the one a Gateway's
    /// status shows, so that an address never moves while status writes lag behind a burst
    /// of Gateways coming and going.
    pub sticky: BTreeMap<crate::world::Key, IpAddr>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            controller_name: DEFAULT_GATEWAY_CONTROLLER.to_string(),
            addresses: Vec::new(),
            ingress_listeners: Vec::new(),
            sticky: BTreeMap::new(),
        }
    }
}

/// What translation of the Gateway API objects gives.
#[derive(Debug, Default)]
pub struct GatewayOutput {
    /// The sockets to listen on, with their rules, sorted by address and port.
    pub sockets: Vec<GatewaySocket>,
    /// Pools the rules use (merged into the snapshot's; an Ingress's pool for the same Service
    /// port is the same pool). Shared with the memo's compiled routes.
    pub clusters: Vec<Arc<ClusterSpec>>,
    /// Certificates the HTTPS listeners use.
    pub certificates: Certificates,
    /// Status of every object of ours.
    pub status: GatewayStatuses,
    /// GRPCRoutes and TLSRoutes that could not be read as the HTTPRoutes they amount to
    /// (kind, key, why).
    pub unreadable_routes: Vec<(&'static str, crate::world::Key, String)>,
}

/// Translates the Gateway API objects of the world.
pub fn translate(world: &World, opts: &GatewayOptions, settings: &Settings) -> GatewayOutput {
    translate_with(world, opts, settings, None)
}

/// [`translate`], reusing the routes `memo` compiled in earlier translations where neither
/// they nor what they read changed (the output is the same as without it).
pub fn translate_with(
    world: &World,
    opts: &GatewayOptions,
    settings: &Settings,
    mut memo: Option<&mut RouteMemo>,
) -> GatewayOutput {
    let pool = (&settings.balance, settings.max_in_flight);
    if let Some(m) = memo.as_deref_mut() {
        m.begin(world, pool);
    }
    let classes = listeners::our_classes(world, opts);
    let mut plans = listeners::plan(world, opts, &classes);
    let mut out = GatewayOutput::default();
    // Routes, oldest first (their order does not change the rules' precedence, which carries
    // the age, but it keeps the output stable); GRPCRoutes as the HTTPRoutes they amount to.
    let mut routes: Vec<(&'static str, std::borrow::Cow<'_, HTTPRoute>, memo::Origin)> = world
        .http_routes
        .values()
        .map(|r| {
            let origin = memo::Origin::Http(Arc::clone(r));
            ("HTTPRoute", std::borrow::Cow::Borrowed(&**r), origin)
        })
        .collect();
    for g in world.grpc_routes.values() {
        match grpc::as_http(g) {
            Ok(h) => routes.push((
                "GRPCRoute",
                std::borrow::Cow::Owned(h),
                memo::Origin::Grpc(Arc::clone(g)),
            )),
            Err(why) => {
                let key = crate::world::key_of(&g.metadata);
                out.unreadable_routes.push(("GRPCRoute", key, why));
            }
        }
    }
    for t in world.tls_routes.values() {
        match tls_route::as_http(t) {
            Ok(h) => routes.push((
                "TLSRoute",
                std::borrow::Cow::Owned(h),
                memo::Origin::Tls(Arc::clone(t)),
            )),
            Err(why) => {
                let key = crate::world::key_of(&t.metadata);
                out.unreadable_routes.push(("TLSRoute", key, why));
            }
        }
    }
    routes.sort_by(|a, b| route_order(a.0, &a.1).cmp(&route_order(b.0, &b.1)));
    let mut placed = Placed::new();
    // Every attached route's compiled rules, which `placed` points into.
    let mut attached: Vec<Arc<routes::Compiled>> = Vec::new();
    if let Some(m) = memo.as_deref_mut() {
        m.attach_context(memo::AttachContext::of(&plans, world));
    }
    // Statuses by kind, in route order, made maps at the end in one pass each.
    let mut statuses: [Vec<(crate::world::Key, Arc<status::RouteState>)>; 3] = Default::default();
    for (kind, r, origin) in routes {
        let compile = || routes::compile(world, &r, pool, kind);
        let mut attach = |c| routes::route(world, &mut plans, &r, c, kind);
        let (o, replay) = match memo.as_deref_mut() {
            Some(m) => m.route(origin, compile, attach),
            None => (attach(Arc::new(compile())).map(Arc::new), false),
        };
        let Some(o) = o else {
            continue;
        };
        if replay {
            for &(gi, li) in &o.counted {
                if let Some(l) = plans.get_mut(gi).and_then(|g| g.listeners.get_mut(li)) {
                    l.attached += 1;
                }
            }
        }
        let by_kind = match kind {
            "GRPCRoute" => 1,
            "TLSRoute" => 2,
            _ => 0,
        };
        statuses[by_kind].push((crate::world::key_of(&r.metadata), Arc::clone(&o.status)));
        out.clusters.extend(o.compiled.clusters.iter().cloned());
        let ci = attached.len();
        for (gi, li, host) in &o.placements {
            let bucket = placed
                .entry((*gi, *li))
                .or_default()
                .entry(host.clone())
                .or_default();
            bucket.extend((0..o.compiled.rules.len()).map(|ri| (ci, ri)));
        }
        attached.push(Arc::clone(&o.compiled));
    }
    let [http, grpc, tls] = statuses.map(|mut v| {
        // Stable: of two routes with one key, the later wins, as an insert would have it.
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().collect::<BTreeMap<_, _>>()
    });
    (
        out.status.routes,
        out.status.grpc_routes,
        out.status.tls_routes,
    ) = (http, grpc, tls);
    if let Some(m) = memo {
        m.finish();
    }
    out.sockets = sockets(world, &plans, (placed, &attached), &mut out.certificates);
    for (name, c) in &classes {
        out.status.classes.insert(
            name.clone(),
            ClassState {
                generation: c.metadata.generation.unwrap_or_default(),
                conditions: vec![Cond::ok("Accepted")],
                features: SUPPORTED_FEATURES.to_vec(),
            },
        );
    }
    for g in &plans {
        out.status.gateways.insert(g.key.clone(), gateway_state(g));
    }
    out
}

/// The order routes are read in: oldest first, then by namespace and name (keys borrowed, not
/// built: this runs on every change).
fn route_order<'a>(
    kind: &'static str,
    r: &'a HTTPRoute,
) -> (
    Option<k8s_openapi::jiff::Timestamp>,
    &'a str,
    &'a str,
    &'static str,
) {
    (
        r.metadata.creation_timestamp.as_ref().map(|t| t.0),
        r.metadata.namespace.as_deref().unwrap_or_default(),
        r.metadata.name.as_deref().unwrap_or_default(),
        kind,
    )
}

/// `(gateway, listener)` → effective hostname → the rules placed there, each as `(route,
/// rule)` indices into the attached routes' compiled rules (an index, not a copy of the rule's
/// precedence key, which holds the route's name).
type Placed = BTreeMap<(usize, usize), BTreeMap<hostname::Hostname, Vec<(usize, usize)>>>;

fn sockets(
    world: &World,
    plans: &[listeners::GatewayPlan<'_>],
    (mut placed, attached): (Placed, &[Arc<routes::Compiled>]),
    certs: &mut Certificates,
) -> Vec<GatewaySocket> {
    let ranked = |&(ci, ri): &(usize, usize)| attached.get(ci).and_then(|c| c.rules.get(ri));
    let mut by_key: BTreeMap<(Option<IpAddr>, u16), GatewaySocket> = BTreeMap::new();
    for (gi, g) in plans.iter().enumerate() {
        for (li, l) in g.listeners.iter().enumerate() {
            if !l.programmed {
                continue;
            }
            let mut hosts: Vec<HostRules> = placed
                .remove(&(gi, li))
                .unwrap_or_default()
                .into_iter()
                .map(|(host, mut rules)| {
                    rules.sort_by(|a, b| {
                        let rank = |x| ranked(x).map(|r| &r.rank);
                        rank(a).cmp(&rank(b))
                    });
                    HostRules {
                        host,
                        rules: rules
                            .iter()
                            .filter_map(|x| Some(Arc::clone(&ranked(x)?.rule)))
                            .collect(),
                    }
                })
                .collect();
            hosts.sort_by_key(|h| h.host.specificity());
            for c in &l.certs {
                if let Some(s) = world.secrets.get(&(c.namespace.clone(), c.name.clone()))
                    && let Ok(pem) = crate::resolve::check_tls_secret(s)
                {
                    certs.insert(c.clone(), Arc::new(pem));
                }
            }
            let socket = by_key
                .entry((g.addr, l.port))
                .or_insert_with(|| GatewaySocket {
                    addr: g.addr,
                    port: l.port,
                    tls: matches!(l.proto, Some(Proto::Https | Proto::TlsPassthrough)),
                    passthrough: l.proto == Some(Proto::TlsPassthrough),
                    listeners: Vec::new(),
                });
            socket.listeners.push(GatewayListener {
                gateway: g.gw_ref.clone(),
                name: l.spec.name.clone(),
                hostname: l.hostname.clone(),
                certificates: l.certs.clone(),
                client_validation: l.validation.clone(),
                hosts,
            });
        }
    }
    let mut out: Vec<GatewaySocket> = by_key.into_values().collect();
    for s in &mut out {
        s.listeners.sort_by_key(|l| l.hostname.specificity());
    }
    out
}

fn gateway_state(g: &listeners::GatewayPlan<'_>) -> GatewayState {
    let valid = g.listeners.iter().filter(|l| l.attachable).count();
    let all_valid = g
        .listeners
        .iter()
        .all(|l| l.attachable && l.resolved.status);
    let unsupported_address = g
        .address_problem
        .as_ref()
        .filter(|(reason, _)| *reason == "UnsupportedAddress");
    let accepted = match (valid, all_valid) {
        _ if unsupported_address.is_some() => Cond::new(
            "Accepted",
            false,
            "UnsupportedAddress",
            unsupported_address
                .map(|(_, m)| m.clone())
                .unwrap_or_default(),
        ),
        (_, true) => Cond::ok("Accepted"),
        (0, false) => Cond::new(
            "Accepted",
            false,
            "ListenersNotValid",
            "no listener is valid",
        ),
        (_, false) => Cond::new(
            "Accepted",
            true,
            "ListenersNotValid",
            "some listeners are not valid; the others serve",
        ),
    };
    let programmed = if !accepted.status {
        Cond::new(
            "Programmed",
            false,
            "Invalid",
            "the Gateway is not accepted",
        )
    } else if let Some((reason, msg)) = &g.address_problem {
        Cond::new("Programmed", false, reason, msg.clone())
    } else {
        Cond::ok("Programmed")
    };
    let listeners = g
        .listeners
        .iter()
        .map(|l| {
            let mut conditions = vec![l.accepted.clone()];
            conditions.push(
                l.conflicted
                    .clone()
                    .unwrap_or_else(|| Cond::new("Conflicted", false, "NoConflicts", "")),
            );
            conditions.push(l.resolved.clone());
            conditions.push(if l.programmed {
                Cond::ok("Programmed")
            } else {
                Cond::new("Programmed", false, "Invalid", "the listener is not served")
            });
            ListenerState {
                name: l.spec.name.clone(),
                supported_kinds: if l.proto.is_some() {
                    l.kinds.clone()
                } else {
                    Vec::new()
                },
                attached_routes: l.attached,
                conditions,
            }
        })
        .collect();
    let mut conditions = vec![accepted, programmed];
    if frontend::insecure(g.obj) {
        conditions.push(Cond::new(
            "InsecureFrontendValidationMode",
            true,
            "ConfigurationChanged",
            "frontend validation mode AllowInsecureFallback: connections without a valid client certificate are served",
        ));
    }
    GatewayState {
        generation: g.obj.metadata.generation.unwrap_or_default(),
        addresses: g.addr.map(|a| a.to_string()).into_iter().collect(),
        conditions,
        listeners,
    }
}

/// The pools of a translation, keyed (the first of several equal keys wins).
pub fn cluster_map(clusters: Vec<ClusterSpec>) -> BTreeMap<ClusterKey, ClusterSpec> {
    let mut m = BTreeMap::new();
    for c in clusters {
        m.entry(c.key.clone()).or_insert(c);
    }
    m
}

/// The problems a Gateway API status reports (each becomes a Warning Event and a log line):
/// every condition that is not as it should be — a listener or route that is not accepted,
/// refs that do not resolve, a conflict, a Gateway without its address.
pub fn status_problems(st: &GatewayStatuses) -> Vec<crate::model::Problem> {
    use crate::model::{Problem, Severity};
    let bad = |c: &Cond| match c.kind {
        "Conflicted" => c.status,
        _ => !c.status,
    };
    let mut out = Vec::new();
    let mut push = |object: ObjectRef, field: String, c: &Cond| {
        out.push(Problem {
            object,
            field,
            message: format!("{} {}: {}", c.kind, c.reason, c.message),
            severity: Severity::Error,
            reason: c.reason,
        });
    };
    for ((ns, name), g) in &st.gateways {
        let o = ObjectRef::new("Gateway", ns.clone(), name.clone());
        for c in g
            .conditions
            .iter()
            .filter(|c| bad(c) && c.reason != "ListenersNotValid")
        {
            push(o.clone(), "status.conditions".into(), c);
        }
        for l in &g.listeners {
            // Programmed follows from the others; one event per cause.
            for c in l
                .conditions
                .iter()
                .filter(|c| bad(c) && c.kind != "Programmed")
            {
                push(o.clone(), format!("spec.listeners[{}]", l.name), c);
            }
        }
    }
    let routes = st
        .routes
        .iter()
        .map(|r| ("HTTPRoute", r))
        .chain(st.grpc_routes.iter().map(|r| ("GRPCRoute", r)))
        .chain(st.tls_routes.iter().map(|r| ("TLSRoute", r)));
    for (kind, ((ns, name), r)) in routes {
        let o = ObjectRef::new(kind, ns.clone(), name.clone());
        for p in &r.parents {
            for c in p.conditions.iter().filter(|c| bad(c)) {
                push(o.clone(), format!("spec.parentRefs[{}]", p.parent.name), c);
            }
        }
    }
    out
}

/// Reports Gateway API objects the watch could not read.
pub fn unreadable_problems(world: &World) -> Vec<crate::model::Problem> {
    world
        .unreadable
        .iter()
        .map(|(o, why): (&ObjectRef, &String)| crate::model::Problem {
            object: o.clone(),
            field: String::new(),
            message: format!("cannot be read by this version of sluice ({why}); it is ignored"),
            severity: crate::model::Severity::Error,
            reason: "Unreadable",
        })
        .collect()
}

#[cfg(test)]
mod frontend_tests;
#[cfg(test)]
mod memo_tests;
#[cfg(test)]
mod socket_tests;
#[cfg(test)]
mod tests;
