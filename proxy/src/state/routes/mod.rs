//! The compiled route table: the snapshot's route index plus, for every route, what the proxy
//! needs at request time (the `Arc<Cluster>`, redirect/HSTS flags, metric handles). One
//! `ArcSwap<RouteTable>` holds it; a request loads it once.

pub mod gateway;

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;
use sluice_config::route_policy::{ClientCertAuth, RateLimits};
use sluice_config::{
    ClusterKey, HostMatch, NextUpstream, ObjectRef, Route, RouteAction, RouteRef, Snapshot,
};

use crate::policy::auth::Gate;
use crate::policy::auth::client_cert::ClientAuth;
use crate::policy::edits::{CanaryRule, Edits};
use crate::policy::limits::{InFlight, Limiter, OverLimit};
use crate::telemetry::access_log::RouteSeen;
use crate::telemetry::metrics::{Metrics, RouteStats};
use crate::upstream::cluster::Cluster;

/// Where a matched request goes.
#[derive(Debug)]
pub enum Target {
    /// Forward to this pool.
    Cluster(Arc<Cluster>),
    /// Answer 503. The reason names internal objects, so it goes to the log, never to the
    /// client (who gets a generic body).
    Unavailable(Arc<str>),
}

/// A compiled route.
#[derive(Debug)]
pub struct Action {
    /// Where to send the request.
    pub target: Target,
    /// Redirect plain HTTP to HTTPS.
    pub ssl_redirect: bool,
    /// `Strict-Transport-Security` value for HTTPS responses.
    pub hsts: Option<HeaderValue>,
    /// Retry rules.
    pub next_upstream: NextUpstream,
    /// The Ingress and service, for the access log.
    pub names: RouteSeen,
    /// Metric handles.
    pub stats: RouteStats,
    /// The ingress-nginx edits of the route (redirects, rewrite, headers, limits).
    pub edits: Option<Box<Edits>>,
    /// A canary backend and the rules that send a request to it.
    pub canary: Option<Box<(CanaryRule, Action)>>,
    /// Largest request body (`proxy-body-size`), else `--max-body-size`.
    pub max_body_size: Option<u64>,
    /// Wait for the response head (`proxy-read-timeout`), else `--request-timeout`.
    pub request_timeout: Option<std::time::Duration>,
    /// `default-backend`: the pool used when the route's has no endpoint, and that serves
    /// `custom-http-errors`.
    pub fallback: Option<Arc<Cluster>>,
    /// `limit-rps`/`limit-rpm`/`limit-connections` of the route's Ingress. Both request
    /// paths apply it (the direct one for clients that are not trusted proxies, whose address
    /// needs no header).
    pub limiter: Option<Arc<Limiter>>,
    /// `auth-type: basic` or `auth-url`.
    pub auth: Option<Box<Gate>>,
    /// `auth-tls-*`: the client certificate the route requires.
    pub client_cert: Option<Arc<ClientAuth>>,
    /// Client fields with `_` go upstream (the ConfigMap's `enable-underscores-in-headers`).
    pub underscores_in_headers: bool,
    /// Whether requests must take the general handler (edits or a canary: the direct path
    /// serves plain routes only).
    pub general_only: bool,
    /// The virtual host the route belongs to (`None`: the default backend, which has none, so
    /// an `auth-url` naming `$host` on it finds no route and fails closed): where an `auth-url`
    /// naming `$host` looks its route up.
    pub vhost: Option<u32>,
}

impl Action {
    /// Admits a request from `ip` under the route's request limits: `Err` when it is over
    /// them; the guard holds its place under `limit-connections` until dropped.
    pub fn admit(&self, ip: std::net::IpAddr) -> Result<Option<InFlight<'_>>, OverLimit> {
        match &self.limiter {
            None => Ok(None),
            Some(l) => l
                .admit(ip, crate::clock::now_nanos())
                .map(Some)
                .ok_or(OverLimit),
        }
    }

    /// The action a request takes: the canary's when its rules select it, else this one.
    pub fn choose(&self, headers: &http::HeaderMap) -> &Action {
        match &self.canary {
            Some(c) if c.0.selects(headers, |total| fastrand::u32(1..=total)) => &c.1,
            _ => self,
        }
    }
}

/// The table requests look up.
#[derive(Debug)]
pub struct RouteTable {
    snapshot: Arc<Snapshot>,
    actions: Vec<Vec<Action>>,
    default: Option<Action>,
    /// SSL passthrough hosts and their pools.
    passthrough: HashMap<Box<str>, Arc<Cluster>>,
    /// Hosts (`*.suffix` for wildcards) whose TLS handshake asks for a client certificate.
    client_auth: HashMap<Box<str>, Arc<ClientAuth>>,
    /// Request limiters by Ingress and settings, handed to the next table so that a
    /// configuration change does not give every client a fresh allowance.
    limiters: Limiters,
    /// Monotonic generation of the applied configuration.
    pub generation: u64,
    /// The controller ConfigMap's `block-cidrs`: clients refused on every request.
    blocked: Vec<sluice_config::cidr::Cidr>,
    /// The Gateway API's sockets and rules.
    gateway: gateway::GatewayTable,
}

/// Limiters by Ingress and settings.
type Limiters = HashMap<(ObjectRef, RateLimits), Arc<Limiter>>;

/// What compiling a table reads besides the snapshot.
pub(super) struct Compiler<'a> {
    clusters: &'a HashMap<ClusterKey, Arc<Cluster>>,
    metrics: &'a Metrics,
    previous: &'a Limiters,
    limiters: Limiters,
    /// Client-certificate rules compiled once per distinct setting.
    client_auths: HashMap<ClientCertAuth, Arc<ClientAuth>>,
    /// The ConfigMap's `enable-underscores-in-headers`.
    underscores: bool,
}

impl Compiler<'_> {
    /// The action of a route, as an Ingress route's is compiled (the Gateway API's backends
    /// take the same one).
    pub(super) fn action(&mut self, r: &Route) -> Action {
        compile_action(r, &r.action, &r.source, self)
    }

    /// The compiled client-certificate rules for `c`, built once per distinct setting.
    fn client_auth(&mut self, c: &ClientCertAuth) -> Result<Arc<ClientAuth>, String> {
        if let Some(a) = self.client_auths.get(c) {
            return Ok(Arc::clone(a));
        }
        let a = Arc::new(ClientAuth::compile(c)?);
        self.client_auths.insert(c.clone(), Arc::clone(&a));
        Ok(a)
    }

    /// The limiter of an Ingress: the previous table's while its settings stay.
    fn limiter(&mut self, source: &ObjectRef, l: &RateLimits) -> Arc<Limiter> {
        let key = (source.clone(), l.clone());
        let found = self
            .previous
            .get(&key)
            .cloned()
            .unwrap_or_else(|| Arc::new(Limiter::new(l)));
        Arc::clone(self.limiters.entry(key).or_insert(found))
    }
}

/// Whether a route's requests need the general handler: every per-route feature but the pool,
/// its timeouts and limits, the HTTPS redirect and the header policy is applied there only.
/// `Action` is taken apart whole, so that a field added to it must be placed on one side or
/// the other here — a feature can never be skipped on the direct path by being forgotten.
fn needs_general(a: &Action) -> bool {
    let Action {
        // Applied on the direct path too (or checked by `RouteTable::direct`).
        target: _,
        ssl_redirect: _,
        hsts: _,
        next_upstream: _,
        names: _,
        stats: _,
        max_body_size: _,
        request_timeout: _,
        limiter: _,
        underscores_in_headers: _,
        vhost: _,
        general_only: _,
        // The general handler's alone.
        edits,
        canary,
        fallback,
        auth,
        client_cert,
    } = a;
    edits.is_some()
        || canary.is_some()
        || fallback.is_some()
        || auth.is_some()
        || client_cert.is_some()
}

/// What the direct path's rule reads of the client connection.
#[derive(Debug, Clone, Copy)]
pub struct DirectClient {
    /// The peer is a trusted proxy (`--trusted-proxies`): its client's address is in a header
    /// the direct path does not read.
    pub trusted: bool,
    /// The connection is TLS.
    pub tls: bool,
    /// The peer's address.
    pub addr: std::net::IpAddr,
}

fn compile_route(r: &Route, vhost: Option<u32>, cx: &mut Compiler<'_>) -> Action {
    let mut action = compile_action(r, &r.action, &r.source, cx);
    action.vhost = vhost;
    // A canary takes the main route's options (ingress-nginx ignores a canary Ingress's other
    // annotations); only its backend and its names differ.
    action.canary = r.canary.as_ref().and_then(|c| {
        let rule = CanaryRule::compile(c)?;
        let mut side = compile_action(r, &c.action, &c.source, cx);
        // Chosen by the general handler only.
        side.general_only = true;
        side.vhost = vhost;
        Some(Box::new((rule, side)))
    });
    action.general_only = needs_general(&action);
    action
}

fn compile_action(
    r: &Route,
    route_action: &RouteAction,
    source: &ObjectRef,
    cx: &mut Compiler<'_>,
) -> Action {
    let clusters = cx.clusters;
    let metrics = cx.metrics;
    let ingress = format!("{}/{}", source.namespace, source.name);
    let (target, service) = match route_action {
        RouteAction::Cluster(k) => match clusters.get(k) {
            Some(c) => (Target::Cluster(Arc::clone(c)), c.name.clone()),
            None => (
                Target::Unavailable(Arc::from(format!("Ingress {ingress}: no pool for {k}"))),
                k.to_string(),
            ),
        },
        RouteAction::Unavailable(m) => (
            Target::Unavailable(Arc::from(format!("Ingress {ingress}: {m}"))),
            String::new(),
        ),
    };
    let hsts = r.options.hsts.and_then(|h| {
        let mut v = format!("max-age={}", h.max_age);
        if h.include_subdomains {
            v.push_str("; includeSubDomains");
        }
        if h.preload {
            v.push_str("; preload");
        }
        HeaderValue::from_str(&v).ok()
    });
    // Rules that cannot be built keep the route closed, and its default backend unused.
    let mut closed = None;
    let auth = match r
        .options
        .edits
        .auth
        .as_ref()
        .map(|a| Gate::compile(a, clusters))
    {
        None => None,
        Some(Ok(g)) => Some(Box::new(g)),
        Some(Err(why)) => {
            closed = Some(why);
            None
        }
    };
    let client_cert = match &r.options.edits.client_cert {
        None => None,
        Some(c) => match cx.client_auth(c) {
            Ok(a) => Some(a),
            Err(why) => {
                closed = Some(why);
                None
            }
        },
    };
    let target = match &closed {
        Some(why) => Target::Unavailable(Arc::from(format!("Ingress {ingress}: {why}"))),
        None => target,
    };
    let edits = Edits::compile(&r.options.edits, &r.path);
    // Limits count per Ingress: every route of one Ingress shares its limiter.
    let limiter = r
        .options
        .edits
        .limits
        .as_ref()
        .map(|l| cx.limiter(&r.source, l));
    Action {
        target,
        ssl_redirect: r.options.ssl_redirect || r.options.force_ssl_redirect,
        // Set by `compile_route` from the whole action.
        general_only: true,
        fallback: match &r.fallback {
            Some(RouteAction::Cluster(k)) if closed.is_none() => clusters.get(k).cloned(),
            _ => None,
        },
        limiter,
        auth,
        client_cert,
        underscores_in_headers: cx.underscores,
        vhost: None,
        max_body_size: r.options.limits.max_body_size,
        request_timeout: r.options.limits.read_timeout,
        edits,
        canary: None,
        hsts,
        next_upstream: r.options.next_upstream,
        stats: RouteStats::new(metrics, &ingress, &service),
        names: RouteSeen {
            ingress: Arc::from(ingress.as_str()),
            service: Arc::from(service.as_str()),
        },
    }
}

impl RouteTable {
    /// An empty table (everything is 404) before the first snapshot.
    pub fn empty() -> Self {
        Self {
            snapshot: Arc::new(Snapshot::default()),
            actions: Vec::new(),
            default: None,
            passthrough: HashMap::new(),
            client_auth: HashMap::new(),
            limiters: Limiters::new(),
            generation: 0,
            blocked: Vec::new(),
            gateway: gateway::GatewayTable::default(),
        }
    }

    /// Compiles a snapshot against the current pools, keeping the `previous` table's
    /// limiters where their Ingress and settings stay.
    pub fn compile(
        snapshot: Arc<Snapshot>,
        (clusters, replaced): (
            &HashMap<ClusterKey, Arc<Cluster>>,
            &std::collections::HashSet<ClusterKey>,
        ),
        metrics: &Metrics,
        generation: u64,
        previous: &RouteTable,
    ) -> Self {
        let mut cx = Compiler {
            clusters,
            metrics,
            previous: &previous.limiters,
            limiters: HashMap::new(),
            client_auths: HashMap::new(),
            underscores: snapshot.settings().underscores_in_headers,
        };
        let actions: Vec<Vec<Action>> = snapshot
            .virtual_hosts()
            .iter()
            .enumerate()
            .map(|(vi, vh)| {
                let vi = u32::try_from(vi).ok();
                vh.routes
                    .iter()
                    .map(|r| compile_route(r, vi, &mut cx))
                    .collect()
            })
            .collect();
        let default = snapshot
            .default_backend()
            .map(|r| compile_route(r, None, &mut cx));
        let passthrough = snapshot
            .passthrough()
            .iter()
            .filter_map(|p| match &p.action {
                RouteAction::Cluster(k) => Some((
                    p.host.clone().into_boxed_str(),
                    Arc::clone(clusters.get(k)?),
                )),
                RouteAction::Unavailable(_) => None,
            })
            .collect();
        // The hosts whose handshake asks for a client certificate: the first route of a host
        // with rules decides which CAs are hinted (every route still checks its own).
        let mut client_auth = HashMap::new();
        for (vh, acts) in snapshot.virtual_hosts().iter().zip(&actions) {
            let key = match &vh.host {
                HostMatch::Exact(h) => h.clone(),
                HostMatch::Wildcard(suffix) => format!("*{suffix}"),
                HostMatch::Any => continue,
            };
            if let Some(c) = acts.iter().find_map(|a| a.client_cert.as_ref()) {
                client_auth
                    .entry(key.into_boxed_str())
                    .or_insert_with(|| Arc::clone(c));
            }
        }
        let blocked = snapshot.settings().block_cidrs.clone();
        let gateway = gateway::GatewayTable::compile(
            &snapshot,
            &mut cx,
            (&previous.snapshot, &previous.gateway),
            replaced,
        );
        Self {
            snapshot,
            actions,
            default,
            passthrough,
            client_auth,
            limiters: cx.limiters,
            generation,
            blocked,
            gateway,
        }
    }

    /// The Gateway API's sockets and rules.
    pub fn gateway(&self) -> &gateway::GatewayTable {
        &self.gateway
    }

    /// The one rule for the direct path: the pool a body-less HTTP/1.1 request routed to
    /// `action` may be forwarded to from its raw head, or `None` when the general handler
    /// must take it — a route with anything only the general handler applies
    /// (see `needs_general`), request limits or `block-cidrs` for a client whose address is in
    /// a header (a trusted proxy's), a `block-cidrs` client, no pool, an h2c or HTTPS-over-h2
    /// pool, a pool that hashes a header or cookie (the direct path indexes no fields), or an
    /// HTTPS redirect on plain HTTP.
    pub fn direct<'a>(&self, action: &'a Action, client: DirectClient) -> Option<&'a Arc<Cluster>> {
        use sluice_config::{BalancePolicy, HashKey};
        if action.general_only
            || (action.limiter.is_some() && client.trusted)
            || (self.blocks_any() && (client.trusted || self.blocks(client.addr)))
            || (action.ssl_redirect && !client.tls)
        {
            return None;
        }
        let Target::Cluster(cluster) = &action.target else {
            return None;
        };
        let hashes_fields = matches!(
            cluster.balance,
            BalancePolicy::Hash(HashKey::Header(_) | HashKey::Cookie(_))
        );
        (!cluster.protocol.is_h2() && !hashes_fields).then_some(cluster)
    }

    /// Whether the controller ConfigMap blocks any client (`block-cidrs`).
    pub fn blocks_any(&self) -> bool {
        !self.blocked.is_empty()
    }

    /// Whether a client at `ip` is refused on every request (`block-cidrs`).
    pub fn blocks(&self, ip: std::net::IpAddr) -> bool {
        self.blocked.iter().any(|c| c.contains(ip))
    }

    /// Whether any host asks for client certificates (only then is a ClientHello read first).
    pub fn has_client_auth(&self) -> bool {
        !self.client_auth.is_empty()
    }

    /// Whether `rules` are some host's in this table (older ones may be forgotten).
    pub fn has_client_auth_rules(&self, rules: &Arc<ClientAuth>) -> bool {
        self.client_auth.values().any(|r| Arc::ptr_eq(r, rules))
    }

    /// The client-certificate rules of a server name: its exact host, else its one-label
    /// wildcard.
    pub fn client_auth(&self, host: &str) -> Option<&Arc<ClientAuth>> {
        self.client_auth.get(host).or_else(|| {
            let dot = host.find('.')?;
            self.client_auth.get(format!("*{}", &host[dot..]).as_str())
        })
    }

    /// Whether any host is an SSL passthrough host (only then is a ClientHello read first).
    pub fn has_passthrough(&self) -> bool {
        !self.passthrough.is_empty()
    }

    /// The pool an SSL passthrough host's connections go to.
    pub fn passthrough(&self, host: &str) -> Option<Arc<Cluster>> {
        self.passthrough.get(host).cloned()
    }

    /// The snapshot this table was compiled from.
    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// Finds the action for a path within one virtual host, with no fall-through (see
    /// [`sluice_config::matcher::RouteIndex::lookup_in`]); `None` for the default backend's
    /// route, which belongs to no virtual host.
    pub fn lookup_in(&self, vhost: Option<u32>, path: &str) -> Option<&Action> {
        self.rule(self.snapshot.route_ref_in(vhost?, path)?)
    }

    /// Finds the action for a path on a named host's own rules, exact then wildcard (see
    /// [`sluice_config::matcher::RouteIndex::lookup_named`]).
    pub fn lookup_named(&self, host: &str, path: &str) -> Option<&Action> {
        self.rule(self.snapshot.route_ref_named(host, path)?)
    }

    fn rule(&self, r: RouteRef) -> Option<&Action> {
        match r {
            RouteRef::Default => None,
            RouteRef::Rule { vhost, route } => {
                self.actions.get(vhost as usize)?.get(route as usize)
            }
        }
    }

    /// Finds the action for a normalized host and a path (no query). Allocation-free.
    pub fn lookup(&self, host: Option<&str>, path: &str) -> Option<&Action> {
        match self.snapshot.route_ref(host, path)? {
            RouteRef::Default => self.default.as_ref(),
            RouteRef::Rule { vhost, route } => {
                self.actions.get(vhost as usize)?.get(route as usize)
            }
        }
    }
}
