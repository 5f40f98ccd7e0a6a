//! The compiled route table: the snapshot's route index plus, for every route, what the proxy
//! needs at request time (the `Arc<Cluster>`, redirect/HSTS flags, metric handles). One
//! `ArcSwap<RouteTable>` holds it; a request loads it once.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;
use sluice_config::{ClusterKey, NextUpstream, Route, RouteAction, RouteRef, Snapshot};

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
}

/// The table requests look up.
#[derive(Debug)]
pub struct RouteTable {
    snapshot: Arc<Snapshot>,
    actions: Vec<Vec<Action>>,
    default: Option<Action>,
    /// Monotonic generation of the applied configuration.
    pub generation: u64,
}

fn compile_route(
    r: &Route,
    clusters: &HashMap<ClusterKey, Arc<Cluster>>,
    metrics: &Metrics,
) -> Action {
    let ingress = format!("{}/{}", r.source.namespace, r.source.name);
    let (target, service) = match &r.action {
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
    Action {
        target,
        ssl_redirect: r.options.ssl_redirect,
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
        Self {
            snapshot,
            actions,
            default,
            generation,
        }
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
