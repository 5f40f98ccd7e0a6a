//! The compiled route table: the snapshot's route index plus, for every route, what the proxy
//! needs at request time (the `Arc<Cluster>`, redirect/HSTS flags, metric handles). One
//! `ArcSwap<RouteTable>` holds it; a request loads it once.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;
use sluice_config::{ClusterKey, NextUpstream, Route, RouteAction, RouteRef, Snapshot};

use crate::state::edits::{CanaryRule, Edits};
use crate::telemetry::access::RouteSeen;
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
    /// Whether requests must take the general handler (edits or a canary: the direct path
    /// serves plain routes only).
    pub general_only: bool,
}

impl Action {
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
    /// Monotonic generation of the applied configuration.
    pub generation: u64,
}

fn compile_route(
    r: &Route,
    clusters: &HashMap<ClusterKey, Arc<Cluster>>,
    metrics: &Metrics,
) -> Action {
    let mut action = compile_action(r, &r.action, &r.source, clusters, metrics);
    // A canary takes the main route's options (ingress-nginx ignores a canary Ingress's other
    // annotations); only its backend and its names differ.
    action.canary = r.canary.as_ref().and_then(|c| {
        let rule = CanaryRule::compile(c)?;
        let mut side = compile_action(r, &c.action, &c.source, clusters, metrics);
        side.general_only = true;
        Some(Box::new((rule, side)))
    });
    action.general_only |= action.canary.is_some();
    action
}

fn compile_action(
    r: &Route,
    route_action: &RouteAction,
    source: &sluice_config::ObjectRef,
    clusters: &HashMap<ClusterKey, Arc<Cluster>>,
    metrics: &Metrics,
) -> Action {
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
        let v = if h.include_subdomains {
            format!("max-age={}; includeSubDomains", h.max_age)
        } else {
            format!("max-age={}", h.max_age)
        };
        HeaderValue::from_str(&v).ok()
    });
    let edits = Edits::compile(&r.options.edits, &r.path);
    Action {
        target,
        ssl_redirect: r.options.ssl_redirect || r.options.force_ssl_redirect,
        general_only: edits.is_some(),
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
            generation: 0,
        }
    }

    /// Compiles a snapshot against the current pools.
    pub fn compile(
        snapshot: Arc<Snapshot>,
        clusters: &HashMap<ClusterKey, Arc<Cluster>>,
        metrics: &Metrics,
        generation: u64,
    ) -> Self {
        let actions = snapshot
            .virtual_hosts()
            .iter()
            .map(|vh| {
                vh.routes
                    .iter()
                    .map(|r| compile_route(r, clusters, metrics))
                    .collect()
            })
            .collect();
        let default = snapshot
            .default_backend()
            .map(|r| compile_route(r, clusters, metrics));
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
        Self {
            snapshot,
            actions,
            default,
            passthrough,
            generation,
        }
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
