//! [`Snapshot`]: the immutable, comparable result of translation, with its route index.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::host::{HostBuf, normalize_request_host};
use crate::matcher::{RouteIndex, RouteRef};
use crate::model::{
    Certificates, ClusterKey, ClusterSpec, Passthrough, Problem, Route, Settings, TlsBinding,
    VirtualHost,
};

/// The parts a snapshot is built from (all already sorted and de-duplicated by translation).
#[derive(Debug, Default, Clone)]
pub struct SnapshotParts {
    /// Virtual hosts sorted by host.
    pub virtual_hosts: Vec<VirtualHost>,
    /// The `defaultBackend` that won, as a route on path `/`.
    pub default_backend: Option<Route>,
    /// Upstream pools by key.
    pub clusters: BTreeMap<ClusterKey, std::sync::Arc<ClusterSpec>>,
    /// TLS hosts, sorted by host.
    pub tls: Vec<TlsBinding>,
    /// Certificates of the Secrets the bindings name (only valid ones).
    pub certificates: Certificates,
    /// Global settings.
    pub settings: Settings,
    /// SSL passthrough hosts, sorted by host.
    pub passthrough: Vec<Passthrough>,
    /// Everything reported during translation.
    pub problems: Vec<Problem>,
    /// The sockets Gateways listen on, with their rules (Gateway API).
    pub gateway_sockets: Vec<crate::gateway_model::GatewaySocket>,
    /// Each admitted Ingress's annotations as the operator's page shows them (redacted values
    /// and verdicts), by Ingress.
    pub annotations: BTreeMap<crate::refs::ObjectRef, Vec<crate::model::AnnotationNote>>,
}

/// An immutable routing configuration. Two snapshots built from equal inputs are equal and have
/// equal [`Snapshot::hash`]es; the data plane skips applying a snapshot equal to the current one.
#[derive(Debug, Clone)]
pub struct Snapshot {
    parts: SnapshotParts,
    /// Computed when first asked for (the admin API shows it): hashing every route and pool
    /// took several milliseconds of every change at 10,000 routes, on the way to traffic.
    hash: std::sync::OnceLock<u64>,
    index: RouteIndex,
}

impl PartialEq for Snapshot {
    /// Field by field: the first difference ends it, and shared (`Arc`) Gateway rules compare
    /// by address first.
    fn eq(&self, other: &Self) -> bool {
        self.parts.virtual_hosts == other.parts.virtual_hosts
            && self.parts.default_backend == other.parts.default_backend
            && self.parts.clusters == other.parts.clusters
            && self.parts.tls == other.parts.tls
            && self.parts.certificates == other.parts.certificates
            && self.parts.settings == other.parts.settings
            && self.parts.passthrough == other.parts.passthrough
            && self.parts.problems == other.parts.problems
            && self.parts.gateway_sockets == other.parts.gateway_sockets
            && self.parts.annotations == other.parts.annotations
    }
}

impl Eq for Snapshot {}

impl Default for Snapshot {
    fn default() -> Self {
        Self::new(SnapshotParts::default())
    }
}

impl Snapshot {
    /// Builds a snapshot and its route index.
    pub fn new(parts: SnapshotParts) -> Self {
        let index = RouteIndex::build(&parts.virtual_hosts, parts.default_backend.is_some());
        Self {
            hash: std::sync::OnceLock::new(),
            index,
            parts,
        }
    }

    /// The content hash (equal snapshots have equal hashes), computed on first use.
    pub fn hash(&self) -> u64 {
        *self.hash.get_or_init(|| {
            // `DefaultHasher::new()` uses fixed keys: equal content gives an equal hash in a
            // process (and across processes built by the same compiler).
            let parts = &self.parts;
            let mut h = DefaultHasher::new();
            parts.virtual_hosts.hash(&mut h);
            parts.default_backend.hash(&mut h);
            parts.clusters.hash(&mut h);
            parts.tls.hash(&mut h);
            parts.certificates.hash(&mut h);
            parts.settings.hash(&mut h);
            parts.passthrough.hash(&mut h);
            parts.problems.hash(&mut h);
            parts.gateway_sockets.hash(&mut h);
            parts.annotations.hash(&mut h);
            h.finish()
        })
    }

    /// Virtual hosts, sorted by host.
    pub fn virtual_hosts(&self) -> &[VirtualHost] {
        &self.parts.virtual_hosts
    }

    /// The winning `defaultBackend`, if any.
    pub fn default_backend(&self) -> Option<&Route> {
        self.parts.default_backend.as_ref()
    }

    /// Upstream pools.
    pub fn clusters(&self) -> &BTreeMap<ClusterKey, std::sync::Arc<ClusterSpec>> {
        &self.parts.clusters
    }

    /// TLS host bindings.
    pub fn tls(&self) -> &[TlsBinding] {
        &self.parts.tls
    }

    /// Valid certificates by Secret.
    pub fn certificates(&self) -> &Certificates {
        &self.parts.certificates
    }

    /// Global settings.
    pub fn settings(&self) -> &Settings {
        &self.parts.settings
    }

    /// SSL passthrough hosts.
    pub fn passthrough(&self) -> &[Passthrough] {
        &self.parts.passthrough
    }

    /// The Gateway API's sockets and their rules.
    pub fn gateway_sockets(&self) -> &[crate::gateway_model::GatewaySocket] {
        &self.parts.gateway_sockets
    }

    /// Problems found while translating.
    pub fn problems(&self) -> &[Problem] {
        &self.parts.problems
    }

    /// Each admitted Ingress's annotations with their verdicts (for the operator's page).
    pub fn annotations(
        &self,
    ) -> &BTreeMap<crate::refs::ObjectRef, Vec<crate::model::AnnotationNote>> {
        &self.parts.annotations
    }

    /// The parts, for building a modified copy.
    pub fn parts(&self) -> &SnapshotParts {
        &self.parts
    }

    /// Looks a request up by normalized host (`None` for no usable host) and path (no query).
    pub fn route_ref(&self, host: Option<&str>, path: &str) -> Option<RouteRef> {
        self.index.lookup(host, path)
    }

    /// Looks a path up within one virtual host (see [`crate::matcher::RouteIndex::lookup_in`]).
    pub fn route_ref_in(&self, vhost: u32, path: &str) -> Option<RouteRef> {
        self.index.lookup_in(vhost, path)
    }

    /// Looks a path up on a named host's own rules (see
    /// [`crate::matcher::RouteIndex::lookup_named`]).
    pub fn route_ref_named(&self, host: &str, path: &str) -> Option<RouteRef> {
        self.index.lookup_named(host, path)
    }

    /// Resolves a [`RouteRef`] to its route.
    pub fn resolve(&self, r: RouteRef) -> Option<&Route> {
        match r {
            RouteRef::Default => self.parts.default_backend.as_ref(),
            RouteRef::Rule { vhost, route } => self
                .parts
                .virtual_hosts
                .get(vhost as usize)?
                .routes
                .get(route as usize),
        }
    }

    /// Which route serves a request with this raw `Host` header (port and case allowed) and
    /// request target (a query string is ignored). `None` means 404.
    pub fn route(&self, raw_host: &str, target: &str) -> Option<&Route> {
        let path = target.split_once('?').map_or(target, |(p, _)| p);
        let mut buf = HostBuf::default();
        let host = normalize_request_host(raw_host, &mut buf);
        self.route_ref(host, path).and_then(|r| self.resolve(r))
    }
}
