//! Gateways and their listeners: which Gateways are ours, the address each gets, and each
//! listener's conditions (protocol, route kinds, certificates, conflicts).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::GatewayOptions;
use super::refs::{From, granted};
use super::status::Cond;
use crate::gateway_api::gateways::{GatewayListeners, GatewayListenersTlsMode};
use crate::gateway_api::{GROUP, Gateway, GatewayClass};
use crate::gateway_model::hostname::Hostname;
use crate::model::ObjectRef;
use crate::world::{Key, World};

/// The route kinds an HTTP or HTTPS listener takes.
pub(super) const ROUTE_KINDS: [&str; 2] = ["HTTPRoute", "GRPCRoute"];
/// A listener's protocol, when sluice serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Proto {
    Http,
    Https,
    /// `TLS` with `tls.mode: Passthrough`: connections go to TLSRoute backends by server name,
    /// untouched.
    TlsPassthrough,
}

/// One listener as translation sees it.
#[derive(Debug)]
pub(super) struct ListenerPlan<'w> {
    pub spec: &'w GatewayListeners,
    pub hostname: Hostname,
    pub port: u16,
    /// `None`: a protocol sluice does not serve.
    pub proto: Option<Proto>,
    /// `(group, kind)` it takes.
    pub kinds: Vec<(String, String)>,
    pub accepted: Cond,
    pub conflicted: Option<Cond>,
    pub resolved: Cond,
    /// The valid certificate Secrets (HTTPS).
    pub certs: Vec<ObjectRef>,
    /// The client-certificate validation it serves with (HTTPS; see `frontend`).
    pub validation: Option<crate::gateway_model::ClientValidation>,
    /// `ResolvedRefs` is False only because some CA references cannot be used while others
    /// can: the listener serves with those.
    pub ca_partial: bool,
    /// Routes may attach (accepted, not conflicted).
    pub attachable: bool,
    /// Serves traffic (attachable, refs resolved, the Gateway has its address).
    pub programmed: bool,
    pub attached: i32,
}

/// One Gateway of ours.
#[derive(Debug)]
pub(super) struct GatewayPlan<'w> {
    pub key: Key,
    pub obj: &'w Gateway,
    pub gw_ref: ObjectRef,
    /// Its own address (`--gateway-addresses`), or `None` for the node's.
    pub addr: Option<IpAddr>,
    /// Why it has no address although it needs one: `(reason, message)`.
    pub address_problem: Option<(&'static str, String)>,
    pub listeners: Vec<ListenerPlan<'w>>,
}

/// The GatewayClasses naming our controller.
pub(super) fn our_classes<'w>(
    world: &'w World,
    opts: &GatewayOptions,
) -> BTreeMap<String, &'w GatewayClass> {
    world
        .gateway_classes
        .iter()
        .filter(|(_, c)| c.spec.controller_name == opts.controller_name)
        .map(|((_, name), c)| (name.clone(), c.as_ref()))
        .collect()
}

fn age(g: &Gateway) -> (Option<k8s_openapi::jiff::Timestamp>, Key) {
    (
        g.metadata.creation_timestamp.as_ref().map(|t| t.0),
        crate::world::key_of(&g.metadata),
    )
}

/// Plans every Gateway whose class is ours, oldest first.
pub(super) fn plan<'w>(
    world: &'w World,
    opts: &GatewayOptions,
    classes: &BTreeMap<String, &'w GatewayClass>,
) -> Vec<GatewayPlan<'w>> {
    let mut ours: Vec<&Gateway> = world
        .gateways
        .values()
        .map(|g| g.as_ref())
        .filter(|g| classes.contains_key(&g.spec.gateway_class_name))
        .collect();
    ours.sort_by_cached_key(|g| age(g));
    let addresses = assign_addresses(&ours, &opts.addresses, &opts.sticky);
    let mut plans: Vec<GatewayPlan<'w>> = ours
        .into_iter()
        .zip(addresses)
        .map(|(g, (addr, address_problem))| {
            let key = crate::world::key_of(&g.metadata);
            let gw_ref = ObjectRef::new("Gateway", key.0.clone(), key.1.clone());
            let mut listeners: Vec<ListenerPlan<'w>> = g
                .spec
                .listeners
                .iter()
                .map(|l| listener(world, &key.0, l))
                .collect();
            for l in &mut listeners {
                client_validation(world, g, l);
            }
            mark_conflicts(&mut listeners);
            taken_by_ingress(&mut listeners, addr, &opts.ingress_listeners);
            let has_address = address_problem.is_none();
            for l in &mut listeners {
                l.attachable = l.accepted.status && l.conflicted.is_none();
                l.programmed = l.attachable && (l.resolved.status || l.ca_partial) && has_address;
            }
            GatewayPlan {
                key,
                obj: g,
                gw_ref,
                addr,
                address_problem,
                listeners,
            }
        })
        .collect();
    mark_shared_socket_conflicts(&mut plans);
    plans
}

/// Gateways without addresses of their own share the node's socket per port: one socket
/// speaks one protocol, so the oldest Gateway's listener decides it, and another Gateway's
/// listener there with another protocol (HTTP beside HTTPS, or TLS passthrough beside HTTPS)
/// is Conflicted (`ProtocolConflict`) and not served — never served in the wrong protocol.
fn mark_shared_socket_conflicts(plans: &mut [GatewayPlan<'_>]) {
    let mut taken: BTreeMap<(Option<IpAddr>, u16), (Proto, String)> = BTreeMap::new();
    for g in plans.iter_mut() {
        for l in g.listeners.iter_mut().filter(|l| l.attachable) {
            let Some(proto) = l.proto else { continue };
            let key = (g.addr, l.port);
            match taken.get(&key) {
                None => {
                    taken.insert(key, (proto, g.gw_ref.to_string()));
                }
                Some((first, _)) if *first == proto => {}
                Some((_, owner)) => {
                    l.conflicted = Some(Cond::new(
                        "Conflicted",
                        true,
                        "ProtocolConflict",
                        format!(
                            "port {} is already served with another protocol by {owner} (Gateways without addresses of their own share the node's socket; give them addresses with --gateway-addresses)",
                            l.port
                        ),
                    ));
                    l.attachable = false;
                    l.programmed = false;
                }
            }
        }
    }
}

/// A Gateway's address, or why it has none: `(reason, message)`.
type Assigned = (Option<IpAddr>, Option<(&'static str, String)>);

/// What a Gateway's `spec.addresses` asks for.
enum Request {
    /// Nothing, or only entries without a value (`GatewayAddressEmpty`): any address.
    Any,
    /// An address type sluice does not give (anything but `IPAddress`).
    Unsupported(String),
    /// These values.
    Values(Vec<String>),
}

fn request(g: &Gateway) -> Request {
    let list = g.spec.addresses.as_deref().unwrap_or_default();
    if let Some(t) = list
        .iter()
        .filter_map(|a| a.r#type.as_deref())
        .find(|t| *t != "IPAddress")
    {
        return Request::Unsupported(t.to_string());
    }
    let values: Vec<String> = list
        .iter()
        .filter_map(|a| a.value.clone())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        Request::Any
    } else {
        Request::Values(values)
    }
}

/// Gives each Gateway (oldest first) an address of the pool: the one its `spec.addresses`
/// asks for, else the one its status already shows (so an address never moves while its
/// Gateway lives), else the first free one. Without a pool every Gateway uses the node's.
/// An address type other than `IPAddress` is `UnsupportedAddress` (the Gateway is not
/// accepted); a requested address that is not a free one of the pool, or more than one, is
/// `AddressNotUsable`.
fn assign_addresses(
    gws: &[&Gateway],
    pool: &[IpAddr],
    sticky: &BTreeMap<Key, IpAddr>,
) -> Vec<Assigned> {
    let requests: Vec<Request> = gws.iter().map(|g| request(g)).collect();
    let mut taken: BTreeSet<IpAddr> = BTreeSet::new();
    let mut out: Vec<Assigned> = vec![(None, None); gws.len()];
    let not_usable = |msg: String| (None, Some(("AddressNotUsable", msg)));
    // Requested addresses first, then kept ones, then new ones.
    for (i, r) in requests.iter().enumerate() {
        out[i] = match r {
            Request::Any => continue,
            Request::Unsupported(t) => (
                None,
                Some((
                    "UnsupportedAddress",
                    format!("address type {t:?} is not supported (IPAddress is)"),
                )),
            ),
            Request::Values(v) if v.len() > 1 => not_usable(format!(
                "spec.addresses asks for {} addresses; a Gateway gets one",
                v.len()
            )),
            Request::Values(v) => match v[0].parse::<IpAddr>() {
                Ok(ip) if pool.contains(&ip) && taken.insert(ip) => (Some(ip), None),
                _ => not_usable(format!(
                    "spec.addresses {:?} is not a free address of --gateway-addresses",
                    v[0]
                )),
            },
        };
    }
    if pool.is_empty() {
        return out;
    }
    let wants_any = |i: usize| matches!(requests[i], Request::Any);
    for (i, g) in gws.iter().enumerate().filter(|(i, _)| wants_any(*i)) {
        let kept = g
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .and_then(|a| a.first())
            .and_then(|a| a.value.parse::<IpAddr>().ok())
            .or_else(|| sticky.get(&crate::world::key_of(&g.metadata)).copied())
            .filter(|ip| pool.contains(ip) && !taken.contains(ip));
        if let Some(ip) = kept {
            taken.insert(ip);
            out[i] = (Some(ip), None);
        }
    }
    for i in (0..gws.len()).filter(|i| wants_any(*i)) {
        if out[i].0.is_some() {
            continue;
        }
        out[i] = match pool.iter().find(|ip| !taken.contains(ip)) {
            Some(&ip) => {
                taken.insert(ip);
                (Some(ip), None)
            }
            None => (
                None,
                Some((
                    "AddressNotAssigned",
                    "every address of --gateway-addresses is in use".to_string(),
                )),
            ),
        };
    }
    out
}

fn listener<'w>(world: &World, ns: &str, l: &'w GatewayListeners) -> ListenerPlan<'w> {
    let hostname = Hostname::parse(l.hostname.as_deref());
    let port = u16::try_from(l.port).unwrap_or(0);
    let passthrough = l
        .tls
        .as_ref()
        .and_then(|t| t.mode.as_ref())
        .is_some_and(|m| *m == GatewayListenersTlsMode::Passthrough);
    let proto = match l.protocol.as_str() {
        "HTTP" => Some(Proto::Http),
        "HTTPS" => Some(Proto::Https),
        "TLS" if passthrough => Some(Proto::TlsPassthrough),
        _ => None,
    };
    let mut plan = ListenerPlan {
        spec: l,
        hostname,
        port,
        proto,
        kinds: Vec::new(),
        accepted: Cond::ok("Accepted"),
        conflicted: None,
        resolved: Cond::ok("ResolvedRefs"),
        certs: Vec::new(),
        validation: None,
        ca_partial: false,
        attachable: false,
        programmed: false,
        attached: 0,
    };
    if proto.is_none() {
        // TLS is a protocol sluice serves, in one mode: Terminate is an unsupported value.
        plan.accepted = if l.protocol == "TLS" {
            Cond::new(
                "Accepted",
                false,
                "UnsupportedValue",
                "tls.mode Terminate is not supported on a TLS listener (Passthrough is; HTTPS terminates TLS)",
            )
        } else {
            Cond::new(
                "Accepted",
                false,
                "UnsupportedProtocol",
                format!(
                    "protocol {:?} is not supported (HTTP, HTTPS and TLS with mode Passthrough are)",
                    l.protocol
                ),
            )
        };
        return plan;
    }
    if port == 0 {
        plan.accepted = Cond::new(
            "Accepted",
            false,
            "UnsupportedValue",
            format!("port {} is out of range", l.port),
        );
        return plan;
    }
    // Route kinds: HTTPRoute and GRPCRoute (both served by the HTTP(S) listener's rules);
    // TLSRoute on a TLS passthrough listener.
    let route_kinds: &[&str] = if proto == Some(Proto::TlsPassthrough) {
        &["TLSRoute"]
    } else {
        &ROUTE_KINDS
    };
    match l.allowed_routes.as_ref().and_then(|a| a.kinds.as_deref()) {
        None | Some([]) => {
            for kind in route_kinds {
                plan.kinds.push((GROUP.to_string(), kind.to_string()));
            }
        }
        Some(kinds) => {
            let mut bad = Vec::new();
            for k in kinds {
                let group = k.group.as_deref().unwrap_or(GROUP);
                if group == GROUP && route_kinds.contains(&k.kind.as_str()) {
                    let entry = (GROUP.to_string(), k.kind.clone());
                    if !plan.kinds.contains(&entry) {
                        plan.kinds.push(entry);
                    }
                } else {
                    bad.push(format!("{group}/{}", k.kind));
                }
            }
            if !bad.is_empty() {
                plan.resolved = Cond::new(
                    "ResolvedRefs",
                    false,
                    "InvalidRouteKinds",
                    format!(
                        "route kinds {} are not supported here ({} are)",
                        bad.join(", "),
                        route_kinds.join(" and ")
                    ),
                );
            }
        }
    }
    if proto == Some(Proto::Https) {
        certificates(world, ns, l, &mut plan);
    }
    plan
}

/// Resolves an HTTPS listener's certificates (Terminate mode only).
fn certificates(world: &World, ns: &str, l: &GatewayListeners, plan: &mut ListenerPlan<'_>) {
    let tls = l.tls.as_ref();
    if tls.and_then(|t| t.mode.as_ref()) == Some(&GatewayListenersTlsMode::Passthrough) {
        plan.accepted = Cond::new(
            "Accepted",
            false,
            "UnsupportedValue",
            "tls.mode Passthrough is not supported on an HTTPS listener",
        );
        return;
    }
    let refs = tls
        .and_then(|t| t.certificate_refs.as_deref())
        .unwrap_or_default();
    if refs.is_empty() {
        plan.resolved = Cond::new(
            "ResolvedRefs",
            false,
            "InvalidCertificateRef",
            "an HTTPS listener needs tls.certificateRefs",
        );
        return;
    }
    for r in refs {
        let group = r.group.as_deref().unwrap_or_default();
        let kind = r.kind.as_deref().unwrap_or("Secret");
        let target_ns = r.namespace.as_deref().unwrap_or(ns);
        let fail =
            |reason: &'static str, msg: String| Cond::new("ResolvedRefs", false, reason, msg);
        if !group.is_empty() || kind != "Secret" {
            plan.resolved = fail(
                "InvalidCertificateRef",
                format!(
                    "certificateRef {} is a {kind} of group {group:?}; only core Secrets are supported",
                    r.name
                ),
            );
            return;
        }
        let from = From {
            group: GROUP,
            kind: "Gateway",
            namespace: ns,
        };
        if !granted(world, from, "", "Secret", target_ns, &r.name) {
            plan.resolved = fail(
                "RefNotPermitted",
                format!(
                    "no ReferenceGrant in namespace {target_ns} lets Gateways of {ns} use Secret {}",
                    r.name
                ),
            );
            return;
        }
        let Some(secret) = world.secrets.get(&(target_ns.to_string(), r.name.clone())) else {
            plan.resolved = fail(
                "InvalidCertificateRef",
                format!("Secret {target_ns}/{} not found", r.name),
            );
            return;
        };
        if let Err(e) = crate::resolve::check_tls_secret(secret) {
            plan.resolved = fail(
                "InvalidCertificateRef",
                format!("Secret {target_ns}/{}: {e}", r.name),
            );
            return;
        }
        plan.certs
            .push(ObjectRef::new("Secret", target_ns, r.name.clone()));
    }
}

/// Sets an HTTPS listener's client-certificate validation (`super::frontend`), and its
/// conditions when CA references cannot be used: `ResolvedRefs` False for any, `Accepted` False
/// when none can (the listener is then not served). With some usable, it serves with those.
fn client_validation(world: &World, g: &Gateway, l: &mut ListenerPlan<'_>) {
    if l.proto != Some(Proto::Https) || !l.accepted.status {
        return;
    }
    let Some(o) = super::frontend::for_port(world, g, l.port) else {
        return;
    };
    if let Some(refused) = o.refused
        && l.resolved.status
    {
        l.resolved = refused;
        l.ca_partial = o.validation.is_some();
    }
    if let Some(unusable) = o.unusable {
        l.accepted = unusable;
    }
    l.validation = o.validation;
}

/// An Ingress listener keeps its socket: a Gateway listener on its port, on an address it
/// covers (its wildcard, or the Gateway's own address), cannot be bound and says so.
fn taken_by_ingress(
    ls: &mut [ListenerPlan<'_>],
    addr: Option<IpAddr>,
    ingress: &[std::net::SocketAddr],
) {
    for l in ls.iter_mut().filter(|l| l.accepted.status) {
        let taken = ingress.iter().find(|s| {
            s.port() == l.port
                && (s.ip().is_unspecified() || addr.is_none() || addr == Some(s.ip()))
        });
        if let Some(s) = taken {
            l.accepted = Cond::new(
                "Accepted",
                false,
                "PortUnavailable",
                format!(
                    "port {} is the Ingress listener's ({s}); give Gateways their own addresses with --gateway-addresses and bind the Ingress listeners to the node's",
                    l.port
                ),
            );
        }
    }
}

/// Listeners of one Gateway on one port must agree on the protocol, and may not repeat a
/// hostname; those that do are Conflicted (and take no routes).
fn mark_conflicts(ls: &mut [ListenerPlan<'_>]) {
    let n = ls.len();
    for i in 0..n {
        if ls[i].proto.is_none() || ls[i].port == 0 {
            continue;
        }
        for j in 0..n {
            if i == j || ls[j].proto.is_none() || ls[j].port != ls[i].port {
                continue;
            }
            if ls[j].proto != ls[i].proto {
                ls[i].conflicted = Some(Cond::new(
                    "Conflicted",
                    true,
                    "ProtocolConflict",
                    format!("port {} is also used with another protocol", ls[i].port),
                ));
                break;
            }
            if ls[j].hostname == ls[i].hostname {
                ls[i].conflicted = Some(Cond::new(
                    "Conflicted",
                    true,
                    "HostnameConflict",
                    format!(
                        "another listener on port {} has the same hostname",
                        ls[i].port
                    ),
                ));
                break;
            }
        }
    }
}
