//! Translation as a builder: [`Builder::new`] reads what every object needs first (settings,
//! which Ingresses are ours and in which order, who owns which host, the TLS sections), each
//! source is then collected into the same accumulators ([`Builder::ingress`] per Ingress,
//! [`Builder::gateway_api`] for the Gateway API's objects), and [`Builder::finish`] does the
//! whole-world steps (canaries, per-host client certificates, regex hosts, aliases) once and
//! builds the [`Snapshot`] and the status every object is owed.
//!
//! Why a builder: the steps that must see every Ingress (a canary attaches to a main route any
//! Ingress may define; the oldest Ingress's client-certificate rule covers the whole host) are
//! then written once, in `finish`, and a new source of routes feeds the same pools, certificates
//! and problems instead of growing one long function.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::networking::v1::Ingress;

use crate::gateway::GatewayOutput;
use crate::gateway::status::GatewayStatuses;
use crate::model::AnnotationNote;
use crate::model::{HostMatch, ObjectRef, PathMatch, Route, Settings, VirtualHost};
use crate::snapshot::{Snapshot, SnapshotParts};
use crate::world::{Key, World};

use super::{HostOwnership, HostRoutes, Owners, Problems, TranslateOptions};
use super::{age_key, backend, canary, ingress_is_ours, options, reach, tls};

/// What one translation produces: the snapshot and the status every object is owed, both from
/// the same reading of the world (so a status never claims what the snapshot does not serve).
#[derive(Debug)]
pub struct Translation {
    /// The routing snapshot.
    pub snapshot: Snapshot,
    /// The status the Gateway API objects are owed.
    pub gateway: GatewayStatuses,
    /// The Ingresses owed a status address: ours, not dropped whole (an unreadable canary), and
    /// not shut out by `--host-ownership namespace` (every host it names is another
    /// namespace's). Keyed `(namespace, name)`.
    pub ingresses: BTreeSet<Key>,
}

/// The accumulators of one translation (see the module docs).
pub(super) struct Builder<'w> {
    pub(super) world: &'w World,
    pub(super) opts: &'w TranslateOptions,
    pub(super) problems: Problems,
    pub(super) settings: Settings,
    pub(super) owners: Option<Owners>,
    pub(super) reach: reach::Reach,
    tls: Option<tls::TlsHosts>,
    pub(super) backends: backend::Resolver<'w>,
    pub(super) hosts: BTreeMap<HostMatch, HostRoutes>,
    /// Client-certificate rules per host: the oldest Ingress's (ingress-nginx sets them on the
    /// server, so they cover every path of the host).
    pub(super) host_certs: BTreeMap<HostMatch, (ObjectRef, crate::route_policy::ClientCertAuth)>,
    /// Hosts whose client-certificate rule (that of the oldest Ingress that sets one) cannot be
    /// enforced: every route of such a host closes, whichever Ingress defines it.
    pub(super) host_cert_locks: BTreeMap<HostMatch, (ObjectRef, String)>,
    pub(super) default_backend: Option<Route>,
    /// Canary paths wait for every main route.
    pub(super) canaries: Vec<canary::PendingCanary>,
    pub(super) passthrough: BTreeMap<String, crate::model::Passthrough>,
    /// Hosts whose routes are rewritten to regular expressions once all is read.
    pub(super) regex_hosts: BTreeSet<HostMatch>,
    /// `from-to-www-redirect` twins: (twin host, host, source, options).
    pub(super) twins: Vec<(String, String, ObjectRef, crate::model::RouteOptions)>,
    /// `server-alias` names: (alias, host).
    pub(super) alias_of: Vec<(String, String)>,
    /// The path as written and its field, per route, for the regex rewrite's messages.
    pub(super) written: BTreeMap<(HostMatch, PathMatch), (String, String)>,
    gateway: Option<GatewayOutput>,
    pub(super) admitted: BTreeSet<Key>,
    /// The annotations of each Ingress read, as the operator's page shows them.
    pub(super) annotations: BTreeMap<ObjectRef, Vec<AnnotationNote>>,
}

/// Our Ingresses, oldest first: the order every conflict is decided in.
pub(super) fn ours_by_age<'w>(world: &'w World, opts: &TranslateOptions) -> Vec<&'w Ingress> {
    let mut ours: Vec<&Ingress> = world
        .ingresses
        .values()
        .map(|i| i.as_ref())
        .filter(|i| ingress_is_ours(world, i, opts))
        .collect();
    ours.sort_by_cached_key(|i| age_key(i));
    ours
}

impl<'w> Builder<'w> {
    /// Reads the settings, host ownership and TLS sections of `ours` (oldest first).
    pub(super) fn new(world: &'w World, opts: &'w TranslateOptions, ours: &[&Ingress]) -> Self {
        let mut problems = Problems::default();
        let settings = options::settings(world, opts, &mut problems);
        let owners = (opts.host_ownership == HostOwnership::Namespace).then(|| Owners::claim(ours));
        let reach = reach::Reach::new(
            settings.allow_cross_namespace,
            opts.host_ownership == HostOwnership::Namespace,
        );
        let tls = tls::collect(world, ours, owners.as_ref(), &mut problems);
        let backends =
            backend::Resolver::new(world, settings.balance.clone(), settings.max_in_flight);
        Self {
            world,
            opts,
            problems,
            settings,
            owners,
            reach,
            tls: Some(tls),
            backends,
            hosts: BTreeMap::new(),
            host_certs: BTreeMap::new(),
            host_cert_locks: BTreeMap::new(),
            default_backend: None,
            canaries: Vec::new(),
            passthrough: BTreeMap::new(),
            regex_hosts: BTreeSet::new(),
            twins: Vec::new(),
            alias_of: Vec::new(),
            written: BTreeMap::new(),
            gateway: None,
            admitted: BTreeSet::new(),
            annotations: BTreeMap::new(),
        }
    }

    /// Whether a TLS section covers `host` (an HTTP request to it is redirected to HTTPS).
    pub(super) fn tls_covers(&self, host: &HostMatch) -> bool {
        self.tls.as_ref().is_some_and(|t| t.covers(host))
    }

    /// Collects the Gateway API's objects: their pools and certificates join the Ingresses'
    /// (an HTTPRoute's pool for a Service port an Ingress also uses is the same pool); their
    /// rules serve on the Gateways' own sockets.
    pub(super) fn gateway_api(&mut self, memo: Option<&mut crate::gateway::RouteMemo>) {
        self.gateway = Some(crate::gateway::translate_with(
            self.world,
            &self.opts.gateway,
            &self.settings,
            memo,
        ));
    }

    /// The whole-world steps, then the snapshot and the status owed.
    pub(super) fn finish(mut self) -> Translation {
        let mut hosts = std::mem::take(&mut self.hosts);
        let problems = &mut self.problems;
        super::auth::client_cert_per_host(&mut hosts, &self.host_certs, problems);
        canary::attach(&mut hosts, std::mem::take(&mut self.canaries), problems);
        // After the canaries attach: a closed route takes no canary traffic either.
        super::auth::close_hosts_without_their_cert_rule(
            &mut hosts,
            &self.host_cert_locks,
            problems,
        );
        self.twins.dedup_by(|a, b| a.0 == b.0);
        canary::www_redirects(&mut hosts, std::mem::take(&mut self.twins));
        for host in &self.regex_hosts {
            if let Some(routes) = hosts.remove(host) {
                let routes = canary::regex_routes(host, routes, &self.written, problems);
                hosts.insert(host.clone(), routes);
            }
        }
        // After the regex rewrite, so that an alias serves its host's routes as they match.
        canary::aliases(&mut hosts, std::mem::take(&mut self.alias_of));
        let virtual_hosts = hosts
            .into_iter()
            .filter(|(_, routes)| !routes.is_empty())
            .map(|(host, routes)| VirtualHost {
                host,
                routes: routes.into_values().map(|r| *r).collect(),
            })
            .collect();
        let (bindings, mut certificates) = match self.tls.take() {
            Some(t) => t.finish(self.world, problems),
            None => Default::default(),
        };
        if let Some(secret) = &self.opts.default_certificate
            && !certificates.contains_key(secret)
            && let Some(pem) = tls::load_secret(
                self.world,
                secret,
                secret,
                "--default-ssl-certificate",
                problems,
            )
        {
            certificates.insert(secret.clone(), pem);
        }
        let gw = self.gateway.take().unwrap_or_default();
        // The Ingresses' pools first, then the Gateway API's (an equal key keeps the first):
        // sorted once and built in one pass rather than inserted one by one.
        let mut all: Vec<(
            crate::model::ClusterKey,
            std::sync::Arc<crate::model::ClusterSpec>,
        )> = self
            .backends
            .finish()
            .into_iter()
            .map(|(k, c)| (k, std::sync::Arc::new(c)))
            .collect();
        all.extend(gw.clusters.into_iter().map(|c| (c.key.clone(), c)));
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.dedup_by(|later, first| later.0 == first.0);
        let clusters: BTreeMap<_, _> = all.into_iter().collect();
        for (k, v) in gw.certificates {
            certificates.entry(k).or_insert(v);
        }
        let mut problems = self.problems.0;
        problems.extend(crate::gateway::unreadable_problems(self.world));
        problems.extend(crate::gateway::status_problems(&gw.status));
        for (kind, (ns, name), why) in &gw.unreadable_routes {
            problems.push(crate::model::Problem {
                object: crate::model::ObjectRef::new(kind, ns.clone(), name.clone()),
                field: "spec".into(),
                message: format!("cannot be served: {why}; it is ignored"),
                severity: crate::model::Severity::Error,
                reason: "Unreadable",
            });
        }
        problems.sort();
        problems.dedup();
        let snapshot = Snapshot::new(SnapshotParts {
            virtual_hosts,
            default_backend: self.default_backend,
            clusters,
            tls: bindings,
            certificates,
            settings: self.settings,
            passthrough: self.passthrough.into_values().collect(),
            problems,
            gateway_sockets: gw.sockets,
            annotations: self.annotations,
        });
        Translation {
            snapshot,
            gateway: gw.status,
            ingresses: self.admitted,
        }
    }
}
