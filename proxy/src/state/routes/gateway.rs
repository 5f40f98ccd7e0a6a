//! The Gateway API's part of the route table: per socket the snapshot's listeners and rules
//! (`sluice_config::gateway_model`), with what serving them needs compiled beside them — an
//! [`Action`] per usable backend (the same actions Ingress routes get: retries, draining,
//! metrics, timeouts), the weights, and each listener's certificate.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use sluice_config::gateway_model::{
    BackendTarget, GatewayListener, GatewayRule, GatewaySocket, RequestFacts,
};
use sluice_config::{PathKind, PathMatch, Route, RouteAction, RouteOptions, Snapshot};

use super::{Action, Compiler};
use crate::policy::auth::frontend::FrontendAuth;
use crate::state::certs::LoadedCert;

/// A socket's key: the address it is bound to (`None`: every address) and its port.
pub type SocketKey = (Option<IpAddr>, u16);

/// One backend of a rule.
#[derive(Debug)]
pub enum Backend {
    /// Forward with this action.
    Serve(Box<Action>),
    /// The reference cannot be used: its share of requests gets 500.
    Invalid(Arc<str>),
}

/// A rule's backends and weights.
#[derive(Debug, Default)]
pub struct CompiledRule {
    /// Backends with a weight above zero: the backend, its weight, and its index in the
    /// rule's `backends` (where its own filters are).
    pub backends: Vec<(Backend, u32, usize)>,
    /// The sum of the weights.
    pub total: u32,
    /// `RequestMirror`: the pools copies go to, with the share mirrored (numerator,
    /// denominator).
    pub mirrors: Vec<(Arc<crate::upstream::cluster::Cluster>, u32, u32)>,
}

impl CompiledRule {
    /// Picks a backend by weight (`None`: the rule has none, or all weights are zero: 500).
    pub fn pick(&self) -> Option<(&Backend, usize)> {
        if self.total == 0 {
            return None;
        }
        let mut n = fastrand::u32(0..self.total);
        for (b, w, i) in &self.backends {
            if n < *w {
                return Some((b, *i));
            }
            n -= w;
        }
        None
    }
}

/// A listener's client-certificate validation, compiled: `Err` when it could not be (its
/// connections are closed; the reason was logged).
pub type Frontend = Result<Arc<FrontendAuth>, Arc<str>>;

/// One listener, compiled: per host bucket, per rule, its backends.
#[derive(Debug, Default)]
pub struct CompiledListener {
    /// The certificate served on an HTTPS listener (with its facts, for the admin API).
    pub cert: Option<Arc<LoadedCert>>,
    /// Its client-certificate validation (`spec.tls.frontend`).
    pub frontend: Option<Frontend>,
    /// `rules[host][rule]`, parallel to the snapshot listener's `hosts[host].rules[rule]`.
    /// Shared: the next table keeps a rule's compiled backends when its snapshot hands it the
    /// same rule over the same pools (see `Reuse`).
    pub rules: Vec<Vec<Arc<CompiledRule>>>,
}

/// The Gateway sockets of a table.
#[derive(Debug, Default)]
pub struct GatewayTable {
    /// Socket index in the snapshot by key.
    by_key: HashMap<SocketKey, usize>,
    /// Per socket, per listener.
    compiled: Vec<Vec<CompiledListener>>,
}

/// What a request on a Gateway socket found.
#[derive(Debug)]
pub enum Found<'a> {
    /// No listener or rule matches: 404.
    None,
    /// The host's listener validates client certificates and the connection's handshake did
    /// not check its CAs (it named another host, or was made for another host): 421.
    Misdirected,
    /// A rule: its data and its compiled backends.
    Rule(&'a GatewayRule, &'a CompiledRule),
}

impl GatewayTable {
    /// Compiles the snapshot's Gateway sockets, keeping the compiled rules of `previous` (the
    /// table being replaced, with its snapshot) that the new snapshot shares.
    pub(super) fn compile(
        snapshot: &Snapshot,
        cx: &mut Compiler<'_>,
        previous: (&Snapshot, &GatewayTable),
        replaced: &std::collections::HashSet<sluice_config::ClusterKey>,
    ) -> Self {
        let settings_same = cx.underscores == previous.0.settings().underscores_in_headers;
        let reuse = Reuse::of(previous, settings_same, replaced);
        let mut t = Self::default();
        for (si, s) in snapshot.gateway_sockets().iter().enumerate() {
            t.by_key.insert((s.addr, s.port), si);
            let listeners = s
                .listeners
                .iter()
                .enumerate()
                .map(|(li, l)| compile_listener(snapshot, (si, li, l), cx, &reuse))
                .collect();
            t.compiled.push(listeners);
        }
        t
    }

    /// Whether any Gateway socket exists.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn index(&self, local: SocketAddr) -> Option<usize> {
        self.by_key
            .get(&(Some(local.ip()), local.port()))
            .or_else(|| self.by_key.get(&(None, local.port())))
            .copied()
    }

    /// The socket a connection arrived on, by its local address.
    pub fn socket<'a>(
        &self,
        snapshot: &'a Snapshot,
        local: SocketAddr,
    ) -> Option<(usize, &'a GatewaySocket)> {
        let i = self.index(local)?;
        Some((i, snapshot.gateway_sockets().get(i)?))
    }

    /// Finds the rule for a request on the socket at `local`, on a connection whose handshake
    /// passed `passed`.
    pub fn find<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        (local, passed): (SocketAddr, Option<&FrontendAuth>),
        host: Option<&str>,
        req: &RequestFacts<'_>,
    ) -> Found<'a> {
        let Some((si, socket)) = self.socket(snapshot, local) else {
            return Found::None;
        };
        let Some(li) = socket.listeners.iter().position(|l| match host {
            Some(h) => l.hostname.matches(h),
            None => l.hostname == sluice_config::gateway_model::hostname::Hostname::Any,
        }) else {
            return Found::None;
        };
        let listener = &socket.listeners[li];
        let compiled_listener = self.compiled.get(si).and_then(|l| l.get(li));
        match compiled_listener.and_then(|l| l.frontend.as_ref()) {
            Some(Ok(f)) if !f.admits(passed) => return Found::Misdirected,
            Some(Err(_)) => return Found::Misdirected,
            _ => {}
        }
        let Some((hi, ri)) = listener.find_index(host, req) else {
            return Found::None;
        };
        let compiled = compiled_listener
            .and_then(|l| l.rules.get(hi))
            .and_then(|r| r.get(ri));
        match (
            listener.hosts.get(hi).and_then(|h| h.rules.get(ri)),
            compiled,
        ) {
            (Some(rule), Some(c)) => Found::Rule(rule, c),
            _ => Found::None,
        }
    }

    /// The pool a TLS passthrough connection with server name `sni` goes to: a backend, by
    /// weight, of the TLSRoute rule the name selects on the socket at `local` (`None`: no
    /// route, or the pick is a backend that cannot be used).
    pub fn passthrough(
        &self,
        snapshot: &Snapshot,
        local: SocketAddr,
        sni: &str,
    ) -> Option<Arc<crate::upstream::cluster::Cluster>> {
        let no_header = |_: &str| None;
        let facts = RequestFacts {
            path: "/",
            method: "GET",
            query: None,
            header: &no_header,
        };
        let Found::Rule(_, compiled) = self.find(snapshot, (local, None), Some(sni), &facts) else {
            return None;
        };
        match compiled.pick()? {
            (Backend::Serve(action), _) => match &action.target {
                super::Target::Cluster(c) => Some(Arc::clone(c)),
                super::Target::Unavailable(_) => None,
            },
            (Backend::Invalid(_), _) => None,
        }
    }

    /// The listener that answers a TLS handshake on the socket at `local`: the most specific
    /// whose hostname covers the server name (without one, the listener without a hostname,
    /// else the first), with the socket's compiled listeners.
    fn handshake_listener(
        &self,
        snapshot: &Snapshot,
        local: SocketAddr,
        sni: Option<&str>,
    ) -> Option<(usize, &[CompiledListener])> {
        let (si, socket) = self.socket(snapshot, local)?;
        let compiled = self.compiled.get(si)?;
        let li = match sni {
            Some(name) => socket
                .listeners
                .iter()
                .position(|l| l.hostname.matches(name)),
            None => None,
        }
        .or_else(|| {
            socket
                .listeners
                .iter()
                .position(|l| l.hostname == sluice_config::gateway_model::hostname::Hostname::Any)
        })
        .unwrap_or(0);
        Some((li, compiled))
    }

    /// The certificate for a TLS handshake on the socket at `local`: its handshake listener's
    /// (the most specific whose hostname covers the server name), else any listener's of the socket.
    pub fn certificate(
        &self,
        snapshot: &Snapshot,
        local: SocketAddr,
        sni: Option<&str>,
    ) -> Option<Arc<CertifiedKey>> {
        let (li, compiled) = self.handshake_listener(snapshot, local, sni)?;
        compiled
            .get(li)?
            .cert
            .as_ref()
            .or_else(|| compiled.iter().find_map(|l| l.cert.as_ref()))
            .map(|c| Arc::clone(&c.key))
    }

    /// Every served listener certificate: the listener (its Gateway, name and hostname), the
    /// Secret, and the certificate.
    pub fn listener_certificates<'a>(
        &'a self,
        snapshot: &'a Snapshot,
    ) -> impl Iterator<Item = (&'a GatewayListener, &'a LoadedCert)> + 'a {
        snapshot
            .gateway_sockets()
            .iter()
            .zip(&self.compiled)
            .flat_map(|(s, ls)| s.listeners.iter().zip(ls))
            .filter_map(|(l, c)| Some((l, c.cert.as_deref()?)))
    }

    /// Whether some listener of the socket at `local` validates client certificates (its
    /// handshakes then read the ClientHello first, to pick the listener's validation).
    pub fn validates_clients(&self, snapshot: &Snapshot, local: SocketAddr) -> bool {
        self.socket(snapshot, local)
            .and_then(|(si, _)| self.compiled.get(si))
            .is_some_and(|ls| ls.iter().any(|l| l.frontend.is_some()))
    }

    /// The client-certificate validation of a handshake with server name `sni` on the socket
    /// at `local` (its handshake listener's); `None`: the listener asks for none.
    pub fn frontend(
        &self,
        snapshot: &Snapshot,
        local: SocketAddr,
        sni: Option<&str>,
    ) -> Option<Frontend> {
        let (li, compiled) = self.handshake_listener(snapshot, local, sni)?;
        compiled.get(li)?.frontend.clone()
    }

    /// Whether the table still holds this validation (its cached acceptor may stay).
    pub fn holds_frontend(&self, f: &Arc<FrontendAuth>) -> bool {
        self.compiled.iter().flatten().any(|l| match &l.frontend {
            Some(Ok(g)) => Arc::ptr_eq(f, g),
            _ => false,
        })
    }
}

/// The compiled rules of the table being replaced, by the address of their snapshot rule.
///
/// Why: a route change at 10,000 HTTPRoutes compiled every rule again (an action, metric
/// handles and names per backend), a third of the time the change took to reach traffic. The
/// configuration side hands unchanged rules over as the same `Arc`, so a rule at an address the
/// previous snapshot holds is that very rule (the previous snapshot is alive while this table
/// is built, so no new rule can sit at its address); its compiled form stays valid while no
/// pool it names was made or dropped by this apply (a kept pool is the same `Arc<Cluster>`)
/// and the settings it reads are unchanged.
///
/// A rule is looked for first where it was (same socket, listener, host and rule index: a
/// change moves few rules), then by address in an index built only if some rule moved.
pub(super) struct Reuse<'p> {
    /// The previous snapshot and table; `None` when nothing can be kept.
    previous: Option<(&'p Snapshot, &'p GatewayTable)>,
    by_rule: std::cell::OnceCell<HashMap<usize, &'p Arc<CompiledRule>>>,
    /// Pools made or dropped by this apply.
    replaced: &'p std::collections::HashSet<sluice_config::ClusterKey>,
}

/// Where a rule sits in a table: socket, listener, host and rule index.
type RulePlace = (usize, usize, usize, usize);

impl<'p> Reuse<'p> {
    /// The previous table's rules; none when `settings_same` is false (an action reads the
    /// ConfigMap's `enable-underscores-in-headers`).
    fn of(
        previous: (&'p Snapshot, &'p GatewayTable),
        settings_same: bool,
        replaced: &'p std::collections::HashSet<sluice_config::ClusterKey>,
    ) -> Self {
        Self {
            previous: settings_same.then_some(previous),
            by_rule: std::cell::OnceCell::new(),
            replaced,
        }
    }

    /// The previous table's compiled rule at `place`, with its snapshot rule.
    fn at(
        &self,
        (si, li, hi, ri): RulePlace,
    ) -> Option<(&'p Arc<GatewayRule>, &'p Arc<CompiledRule>)> {
        let (snapshot, table) = self.previous?;
        let rule = snapshot
            .gateway_sockets()
            .get(si)?
            .listeners
            .get(li)?
            .hosts
            .get(hi)?
            .rules
            .get(ri)?;
        let compiled = table.compiled.get(si)?.get(li)?.rules.get(hi)?.get(ri)?;
        Some((rule, compiled))
    }

    fn index(&self) -> HashMap<usize, &'p Arc<CompiledRule>> {
        let mut by_rule = HashMap::new();
        if let Some((snapshot, table)) = self.previous {
            let listeners = snapshot
                .gateway_sockets()
                .iter()
                .zip(&table.compiled)
                .flat_map(|(s, c)| s.listeners.iter().zip(c));
            for (l, c) in listeners {
                for (h, ch) in l.hosts.iter().zip(&c.rules) {
                    for (r, cr) in h.rules.iter().zip(ch) {
                        by_rule.insert(Arc::as_ptr(r) as usize, cr);
                    }
                }
            }
        }
        by_rule
    }

    /// The previous compiled form of `r` (now at `place`), if it is the same rule over the
    /// same pools.
    fn get(&self, place: RulePlace, r: &Arc<GatewayRule>) -> Option<Arc<CompiledRule>> {
        self.previous?;
        let c = match self.at(place) {
            Some((was, c)) if Arc::ptr_eq(was, r) => c,
            _ => self
                .by_rule
                .get_or_init(|| self.index())
                .get(&(Arc::as_ptr(r) as usize))?,
        };
        // The rule is the same object, so it names the same pools as when it was compiled.
        let named = r
            .backends
            .iter()
            .filter_map(|b| match &b.target {
                BackendTarget::Cluster(k) => Some(k),
                BackendTarget::Invalid(_) => None,
            })
            .chain(r.filters.mirrors.iter().map(|m| &m.target));
        let kept =
            self.replaced.is_empty() || named.into_iter().all(|k| !self.replaced.contains(k));
        kept.then(|| Arc::clone(c))
    }
}

fn compile_listener(
    snapshot: &Snapshot,
    (si, li, l): (usize, usize, &GatewayListener),
    cx: &mut Compiler<'_>,
    reuse: &Reuse<'_>,
) -> CompiledListener {
    let cert = l.certificates.first().and_then(|secret| {
        let pem = snapshot.certificates().get(secret)?;
        match crate::state::certs::load_pem(&pem.cert_pem, &pem.key_pem) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                tracing::warn!(%secret, error = %e, "Gateway listener certificate unusable");
                None
            }
        }
    });
    let frontend = l.client_validation.as_ref().map(|v| {
        FrontendAuth::compile(v).map(Arc::new).map_err(|e| {
            tracing::warn!(gateway = %l.gateway, listener = %l.name, error = %e,
                "Gateway listener's client-certificate validation unusable; its connections are closed");
            Arc::from(e)
        })
    });
    let rules = l
        .hosts
        .iter()
        .enumerate()
        .map(|(hi, h)| {
            h.rules
                .iter()
                .enumerate()
                .map(|(ri, r)| {
                    reuse
                        .get((si, li, hi, ri), r)
                        .unwrap_or_else(|| Arc::new(compile_rule(r, cx)))
                })
                .collect()
        })
        .collect();
    CompiledListener {
        cert,
        frontend,
        rules,
    }
}

fn compile_rule(r: &GatewayRule, cx: &mut Compiler<'_>) -> CompiledRule {
    let mut out = CompiledRule {
        mirrors: r
            .filters
            .mirrors
            .iter()
            .filter_map(|m| {
                Some((
                    Arc::clone(cx.clusters.get(&m.target)?),
                    m.numerator,
                    m.denominator,
                ))
            })
            .collect(),
        ..CompiledRule::default()
    };
    // `0s`: no limit (the deadline is then far beyond any client's patience).
    let timeout = r.timeout.map(|t| {
        if t.is_zero() {
            std::time::Duration::from_secs(365 * 24 * 3600)
        } else {
            t
        }
    });
    for (index, b) in r.backends.iter().enumerate().filter(|(_, b)| b.weight > 0) {
        let backend = match &b.target {
            BackendTarget::Cluster(k) => {
                let route = Route {
                    path: PathMatch {
                        path: "/".to_string(),
                        kind: PathKind::Prefix,
                    },
                    action: RouteAction::Cluster(k.clone()),
                    source: r.source.clone(),
                    options: RouteOptions {
                        limits: sluice_config::route_policy::RouteLimits {
                            read_timeout: timeout,
                            ..Default::default()
                        },
                        ..RouteOptions::default()
                    },
                    canary: None,
                    fallback: None,
                };
                let mut action = cx.action(&route);
                action.general_only = true;
                Backend::Serve(Box::new(action))
            }
            BackendTarget::Invalid(why) => Backend::Invalid(Arc::from(why.as_str())),
        };
        out.total = out.total.saturating_add(b.weight);
        out.backends.push((backend, b.weight, index));
    }
    out
}
