//! [`DataPlane`]: owns the three swap points (routes, per-pool endpoints, certificates) and
//! applies snapshots incrementally. Control-side bookkeeping sits behind a mutex that requests
//! never touch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use sluice_config::{ClusterKey, EndpointSpec, Snapshot};

use crate::state::certs::{CertError, CertStore, LoadedCert, TlsProblem, TlsState};
use crate::state::changes::{self, Change};
use crate::state::pools::{self, PoolChanges};
use crate::state::routes::RouteTable;
use crate::state::settings::ProxySettings;
use crate::telemetry::access_log::AccessLog;
use crate::telemetry::metrics::{
    CertInfoLabels, CertLabels, EndpointLabels, HandshakeStats, Metrics, ResultLabels,
};
use crate::upstream::cluster::Cluster;
use crate::upstream::pool::PoolRegistry;

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The snapshot equals the current one; nothing was touched.
    Unchanged,
    /// The snapshot was applied.
    Applied {
        /// New generation.
        generation: u64,
        /// Pools created.
        clusters_created: usize,
        /// Pools dropped.
        clusters_removed: usize,
        /// Pools kept whose endpoint set was swapped.
        endpoint_swaps: usize,
    },
}

#[derive(Debug)]
struct Control {
    clusters: HashMap<ClusterKey, Arc<Cluster>>,
    current: Option<Arc<Snapshot>>,
    tls: TlsState,
    tls_problems: Vec<TlsProblem>,
    /// Problems of the configuration source itself, which no snapshot can carry: manifest files
    /// that do not parse, unknown fields (standalone mode).
    source_problems: Vec<String>,
    /// An endpoints-only update changed a pool after `current` was applied, so an equal
    /// snapshot must not be skipped.
    diverged: bool,
}

/// The data plane shared by listeners, the admin API and the configuration providers.
#[derive(Debug)]
pub struct DataPlane {
    routes: ArcSwap<RouteTable>,
    certs: Arc<ArcSwap<CertStore>>,
    control: Mutex<Control>,
    pools: PoolRegistry,
    /// Metric families.
    pub metrics: Metrics,
    /// TLS handshake metric handles.
    pub handshakes: HandshakeStats,
    /// Settings.
    pub settings: ProxySettings,
    access: Option<AccessLog>,
    applied_once: AtomicBool,
    listening: AtomicBool,
    draining: AtomicBool,
    /// A successor took the listening sockets and is getting ready (`--handover`).
    yielding: AtomicBool,
    generation: AtomicU64,
    last_apply_unix_ms: AtomicU64,
    https_port: AtomicU16,
    /// The Gateway sockets the applied snapshot asks for (`server::gateway` opens and closes
    /// them).
    gateway_sockets: tokio::sync::watch::Sender<Vec<GatewayBind>>,
    /// The timeline of applied changes (the operator's page, `/api/v1/changes`).
    pub changes: crate::state::changes::Changes,
}

/// A socket a Gateway listens on: where, and whether TLS is terminated on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GatewayBind {
    /// Address (`None`: every address) and port.
    pub key: crate::state::routes::gateway::SocketKey,
    /// HTTPS (or TLS passthrough).
    pub tls: bool,
    /// TLS passthrough: connections are tunnelled by server name, never terminated.
    pub passthrough: bool,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl DataPlane {
    /// A data plane with no configuration yet (every request is 404, `/readyz` is 503).
    /// `default_cert` is the fallback default certificate (generated when `None`).
    pub fn new(
        settings: ProxySettings,
        default_cert: Option<LoadedCert>,
    ) -> Result<Arc<Self>, CertError> {
        let default_cert = match default_cert {
            Some(c) => c,
            None => crate::state::certs::self_signed_default()?,
        };
        let settings_https_port = settings.https_port;
        let metrics = Metrics::new();
        let handshakes = metrics.handshake_stats();
        let access = settings.access_log.and_then(|f| {
            AccessLog::stdout(f, metrics.access_log_dropped.clone())
                .map_err(|e| tracing::error!(error = %e, "access log not started"))
                .ok()
        });
        Ok(Arc::new(Self {
            routes: ArcSwap::from_pointee(RouteTable::empty()),
            certs: Arc::new(ArcSwap::from_pointee(CertStore::new(default_cert.clone()))),
            control: Mutex::new(Control {
                clusters: HashMap::new(),
                current: None,
                tls: TlsState::new(default_cert),
                tls_problems: Vec::new(),
                source_problems: Vec::new(),
                diverged: false,
            }),
            pools: PoolRegistry::new(settings.upstream.clone()),
            metrics,
            handshakes,
            access,
            settings,
            applied_once: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            yielding: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            last_apply_unix_ms: AtomicU64::new(0),
            https_port: AtomicU16::new(settings_https_port),
            gateway_sockets: tokio::sync::watch::channel(Vec::new()).0,
            changes: crate::state::changes::Changes::default(),
        }))
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes idle upstream connections that expired or that their upstream closed; returns
    /// how many (see [`crate::upstream::pool::HostPool::sweep_idle`]).
    pub fn sweep_idle_connections(&self) -> usize {
        self.pools.sweep_idle()
    }

    /// The access log, when it is on.
    pub fn access_log(&self) -> Option<&AccessLog> {
        self.access.as_ref()
    }

    /// The route table (requests call this once each).
    pub fn routes(&self) -> Arc<RouteTable> {
        self.routes.load_full()
    }

    /// The certificate store handle the TLS resolver reads.
    pub fn cert_store(&self) -> Arc<ArcSwap<CertStore>> {
        Arc::clone(&self.certs)
    }

    /// Applies a snapshot: skips an equal one; keeps existing pools by key and swaps only the
    /// endpoint sets that changed; swaps certificates and then the route table.
    pub fn apply(&self, snapshot: Snapshot) -> ApplyOutcome {
        let started = Instant::now();
        let mut control = self.control();
        if !control.diverged && control.current.as_deref() == Some(&snapshot) {
            self.metrics
                .config_applies
                .get_or_create(&ResultLabels { result: "skipped" })
                .inc();
            return ApplyOutcome::Unchanged;
        }
        let snapshot = Arc::new(snapshot);
        // The ConfigMap's upstream-keepalive-timeout, read by every pool on its next checkout.
        let keepalive = snapshot
            .settings()
            .upstream_keepalive_timeout
            .map_or(0, |d| {
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
            });
        self.pools
            .settings()
            .idle_timeout_override
            .store(keepalive, std::sync::atomic::Ordering::Relaxed);
        let mut next = std::mem::take(&mut control.clusters);
        let trusted = control.current.clone().filter(|_| !control.diverged);
        let PoolChanges {
            created,
            removed,
            swaps,
            replaced,
        } = pools::reconcile(
            &mut next,
            trusted.as_deref(),
            &snapshot,
            (&self.pools, &self.metrics),
        );
        let (store, tls_problems) = control
            .tls
            .build(&snapshot, self.settings.default_certificate.as_ref());
        for p in &tls_problems {
            tracing::warn!(secret = %p.secret, problem = %p.message, "certificate not loaded; keeping the last good one");
        }
        self.publish_cert_metrics(&store);
        self.certs.store(Arc::new(store));
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let previous = self.routes.load_full();
        let table = RouteTable::compile(
            Arc::clone(&snapshot),
            (&next, &replaced),
            &self.metrics,
            generation,
            &previous,
        );
        self.routes.store(Arc::new(table));
        let binds: Vec<GatewayBind> = snapshot
            .gateway_sockets()
            .iter()
            .map(|s| GatewayBind {
                key: (s.addr, s.port),
                tls: s.tls,
                passthrough: s.passthrough,
            })
            .collect();
        self.gateway_sockets.send_if_modified(|b| {
            let changed = *b != binds;
            if changed {
                *b = binds;
            }
            changed
        });
        control.clusters = next;
        let before = control.current.replace(Arc::clone(&snapshot));
        control.tls_problems = tls_problems;
        self.count_problems(&control);
        control.diverged = false;
        drop(control);
        self.applied_once.store(true, Ordering::Release);
        self.last_apply_unix_ms.store(unix_ms(), Ordering::Relaxed);
        self.metrics
            .config_applies
            .get_or_create(&ResultLabels { result: "applied" })
            .inc();
        let took = started.elapsed();
        self.metrics.config_apply_duration.observe(took);
        self.changes.push(Change {
            at_unix_ms: unix_ms(),
            generation,
            kind: "snapshot",
            what: changes::describe(before.as_deref(), &snapshot, swaps),
            apply_ms: took.as_secs_f64() * 1000.0,
            reached_traffic_ms: None,
        });
        ApplyOutcome::Applied {
            generation,
            clusters_created: created,
            clusters_removed: removed,
            endpoint_swaps: swaps,
        }
    }

    /// The Gateway sockets the current snapshot asks for, as they change.
    pub fn gateway_sockets(&self) -> tokio::sync::watch::Receiver<Vec<GatewayBind>> {
        self.gateway_sockets.subscribe()
    }

    /// The endpoints-only fast path: swaps one pool's endpoint set without touching routes.
    /// `seen_at` is when the change was first observed (for the propagation-delay histogram).
    /// Returns `false` when the pool does not exist (a full apply is needed).
    pub fn update_endpoints(
        &self,
        key: &ClusterKey,
        endpoints: &[EndpointSpec],
        seen_at: Option<Instant>,
    ) -> bool {
        let mut control = self.control();
        let Some(cluster) = control.clusters.get(key).cloned() else {
            return false;
        };
        let started = Instant::now();
        let before = cluster.endpoints.load_full();
        let changed = cluster.set_endpoints(endpoints, &self.pools);
        if changed {
            control.diverged = true;
        }
        drop(control);
        let took = started.elapsed();
        let reached = seen_at.map(|t| t.elapsed());
        if let Some(d) = reached {
            self.metrics.propagation_delay.observe(d);
        }
        if changed {
            let before: Vec<_> = before
                .members
                .iter()
                .map(|m| (m.endpoint.addr, m.state))
                .collect();
            self.changes.push(Change {
                at_unix_ms: unix_ms(),
                generation: self.generation(),
                kind: "endpoints",
                what: changes::describe_endpoints(&cluster.name, &before, endpoints),
                apply_ms: took.as_secs_f64() * 1000.0,
                reached_traffic_ms: reached.map(|d| d.as_secs_f64() * 1000.0),
            });
        }
        self.metrics
            .config_applies
            .get_or_create(&ResultLabels {
                result: "endpoints",
            })
            .inc();
        true
    }

    /// Records the delay of a change that went through a full apply.
    pub fn record_propagation(&self, seen_at: Instant) {
        let d = seen_at.elapsed();
        self.metrics.propagation_delay.observe(d);
        self.changes
            .reached_traffic(self.generation(), d.as_secs_f64() * 1000.0);
    }

    fn publish_cert_metrics(&self, store: &CertStore) {
        self.metrics.cert_expiry.clear();
        self.metrics.cert_info.clear();
        for (host, cert) in store.hosts() {
            // A host with two certificates (RSA and ECDSA) shows the one that expires first.
            let expiry = self
                .metrics
                .cert_expiry
                .get_or_create(&CertLabels { host: host.clone() });
            let shown = expiry.get();
            if shown == 0 || cert.not_after < shown {
                expiry.set(cert.not_after);
            }
            drop(expiry);
            self.metrics
                .cert_info
                .get_or_create(&CertInfoLabels {
                    host,
                    serial: cert.serial.clone(),
                })
                .set(1);
        }
    }

    /// Refreshes the endpoints-by-state gauges (called on scrape).
    pub fn refresh_endpoint_gauges(&self) {
        let clusters: Vec<Arc<Cluster>> = self.control().clusters.values().cloned().collect();
        let now = crate::clock::now_nanos();
        self.metrics.endpoints.clear();
        for c in clusters {
            let set = c.endpoints.load();
            let (mut up, mut draining, mut ejected) = (0, 0, 0);
            for m in &set.members {
                if m.endpoint.is_ejected(now) {
                    ejected += 1;
                } else if m.state == sluice_config::EndpointState::Draining {
                    draining += 1;
                } else {
                    up += 1;
                }
            }
            for (state, n) in [("up", up), ("draining", draining), ("ejected", ejected)] {
                self.metrics
                    .endpoints
                    .get_or_create(&EndpointLabels {
                        service: c.name.clone(),
                        state,
                    })
                    .set(n);
            }
        }
    }

    /// All pools, for the admin API.
    pub fn clusters(&self) -> Vec<Arc<Cluster>> {
        let mut v: Vec<_> = self.control().clusters.values().cloned().collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    /// The last applied snapshot.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.control().current.clone()
    }

    /// Replaces the configuration source's own problems (see [`DataPlane::source_problems`]).
    pub fn set_source_problems(&self, problems: Vec<String>) {
        let mut control = self.control();
        control.source_problems = problems;
        self.count_problems(&control);
    }

    /// Problems of the configuration source (files that do not parse, unknown fields), as last
    /// set by the provider; listed in `/api/v1/status` and counted in `sluice_config_problems`.
    pub fn source_problems(&self) -> Vec<String> {
        self.control().source_problems.clone()
    }

    fn count_problems(&self, control: &Control) {
        let snapshot = control.current.as_ref().map_or(0, |s| s.problems().len());
        let total = snapshot + control.tls_problems.len() + control.source_problems.len();
        self.metrics
            .config_problems
            .set(i64::try_from(total).unwrap_or(i64::MAX));
    }

    /// Problems from loading certificates in the last apply.
    pub fn tls_problems(&self) -> Vec<TlsProblem> {
        self.control().tls_problems.clone()
    }

    /// The port HTTP → HTTPS redirects point at (the bound HTTPS port).
    pub fn https_port(&self) -> u16 {
        self.https_port.load(Ordering::Relaxed)
    }

    /// Records the bound HTTPS port (known only after binding port 0 or a configured port).
    pub fn set_https_port(&self, port: u16) {
        self.https_port.store(port, Ordering::Relaxed);
    }

    /// Marks listeners bound (part of readiness).
    pub fn set_listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    /// Starts draining: readiness turns false.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// A successor holds this process's sockets and is getting ready (`--handover`):
    /// `/readyz` says 503 meanwhile, so that a probe of the new pod answered by this process
    /// (they share the admin socket) does not mark the new pod ready before it is. Serving
    /// goes on. `false` again when the successor went away.
    pub fn set_yielding(&self, on: bool) {
        self.yielding.store(on, Ordering::Release);
    }

    /// See [`set_yielding`](Self::set_yielding).
    pub fn is_yielding(&self) -> bool {
        self.yielding.load(Ordering::Acquire)
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Ready = a snapshot was applied, listeners are bound, and not draining.
    pub fn is_ready(&self) -> bool {
        self.applied_once.load(Ordering::Acquire)
            && self.listening.load(Ordering::Acquire)
            && !self.is_draining()
    }

    /// Generation of the applied configuration.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Unix time (ms) of the last apply, 0 before the first.
    pub fn last_apply_unix_ms(&self) -> u64 {
        self.last_apply_unix_ms.load(Ordering::Relaxed)
    }
}
