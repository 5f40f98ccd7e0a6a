//! One kube-runtime reflector (watcher + store) per kind. Each stream has managedFields stripped,
//! retries with backoff on errors (never ending on the first one), and forwards its events to the
//! rebuild loop stamped with the time they were seen.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::ExponentialBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use sluice_config::world::{Kind, Object};
use tokio::sync::mpsc;

/// The Secrets sluice reads: TLS certificates (`kubernetes.io/tls`) and the Opaque Secrets
/// basic authentication names (`auth-secret`, made by `kubectl create secret generic` as
/// ingress-nginx's documentation does). A field selector can only AND its terms, so this
/// excludes the bulky types that never matter (Helm releases, service-account tokens, registry
/// credentials) rather than list the two wanted; the watch then holds only TLS and Opaque ones
/// and whatever custom types a cluster has.
pub const SECRET_TYPES: &str = "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token,type!=kubernetes.io/dockerconfigjson,type!=kubernetes.io/dockercfg,type!=bootstrap.kubernetes.io/token";

/// The watches sluice runs: one per kind it reads, and two for ConfigMaps (the controller
/// ConfigMap by name, whole; every other one trimmed), so the initial-list bookkeeping and a
/// re-list's replacement are per watch, not per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KindId {
    /// The watch of a kind (for ConfigMaps: every ConfigMap of the watched namespaces, trimmed,
    /// since `custom-headers` may name any; Secrets: see [`SECRET_TYPES`]; Namespaces and the
    /// Gateway API's kinds only with the Gateway API).
    Of(Kind),
    /// The controller ConfigMap, by name and whole (only with `--configmap`).
    ControllerConfigMap,
}

/// The kinds always watched, for readiness bookkeeping (the ConfigMap is added with
/// `--configmap`: see [`kinds`]).
pub const ALL_KINDS: [KindId; 6] = [
    KindId::Of(Kind::Ingress),
    KindId::Of(Kind::IngressClass),
    KindId::Of(Kind::Service),
    KindId::Of(Kind::EndpointSlice),
    KindId::Of(Kind::Secret),
    KindId::Of(Kind::ConfigMap),
];

/// Most data a watched ConfigMap keeps: a set of response fields is a few KiB; a ConfigMap
/// beyond this (a dashboard, a CA bundle) is kept without its data, marked with the size it
/// had, so that a cluster's large ConfigMaps cost sluice almost nothing.
pub const MAX_CONFIG_MAP_DATA: usize = 64 * 1024;

/// What a ConfigMap watched for `custom-headers` keeps: no annotations (`kubectl apply`'s
/// last-applied copy doubles the size), no binary data, and data only up to
/// [`MAX_CONFIG_MAP_DATA`].
pub fn trim_config_map(o: &mut ConfigMap) {
    o.binary_data = None;
    o.metadata.annotations = None;
    o.metadata.labels = None;
    let bytes: usize = o
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if bytes > MAX_CONFIG_MAP_DATA {
        o.data = None;
        o.metadata.annotations = Some(std::collections::BTreeMap::from([(
            sluice_config::world::DROPPED_BYTES.to_string(),
            bytes.to_string(),
        )]));
    }
}

/// The kinds whose initial list the first snapshot waits for: the Gateway API's too when
/// the API server serves it.
pub fn kinds(configmap: bool, gateway_api: bool) -> Vec<KindId> {
    // `ALL_KINDS` includes `AnyConfigMap`: Ingresses may name a ConfigMap (`custom-headers`).
    let mut k = ALL_KINDS.to_vec();
    if configmap {
        k.push(KindId::ControllerConfigMap);
    }
    if gateway_api {
        k.extend(super::gateway_watch::GATEWAY_KINDS);
    }
    k
}

impl KindId {
    /// The kind of object the watch reads.
    pub fn kind(self) -> Kind {
        match self {
            KindId::Of(kind) => kind,
            KindId::ControllerConfigMap => Kind::ConfigMap,
        }
    }
}

/// Retry delays of a failing watch: 200 ms doubling to 1 s, plus a random jitter of up to the
/// delay again (so at most 2 s, and ten watches do not retry in step), back to 200 ms after a
/// minute without failures. kube-runtime's default doubles 800 ms up to 30 s,
/// so an API server back after an 8 s outage could wait up to 13 s more for the next attempt
/// (measured against a real kube-apiserver: an EndpointSlice change took 21.7 s to reach
/// traffic). Every watch retrying every 1–2 s is a light load for an API server coming back.
pub fn watch_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let delays = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(1))
        .with_factor(2.0)
        .without_max_times()
        .with_jitter();
    ResetTimerBackoff::new(ExponentialBackoff::from(delays), Duration::from_secs(60))
}

/// What a Namespace keeps: its name and labels.
fn trim_namespace(n: &mut Namespace) {
    n.spec = None;
    n.status = None;
    n.metadata.annotations = None;
}

/// Watches Namespaces (for `allowedRoutes` selectors).
pub fn spawn_namespaces(client: &Client, tx: mpsc::UnboundedSender<Seen>) {
    spawn_kind::<Namespace>(
        Api::all(client.clone()),
        watcher::Config::default(),
        KindId::Of(Kind::Namespace),
        (Object::Namespace, trim_namespace),
        tx,
    );
}

/// What a watcher reported.
#[derive(Debug, Clone)]
pub enum Change {
    /// Added or modified.
    Apply(KindId, Object),
    /// Deleted.
    Delete(KindId, Object),
    /// A (re-)list starts for this watch.
    Init(KindId),
    /// An object of the (re-)list.
    InitApply(KindId, Object),
    /// The (re-)list is complete: replace this kind's objects.
    InitDone(KindId),
    /// The watch fails (and retries with backoff): why, as the API server said it. Sent for the
    /// first error of a run and whenever the reason changes.
    Failing(KindId, String),
    /// The watch delivers again after failing.
    Recovered(KindId),
}

/// After a watch failed, this long without another error means it works again: a watch that
/// resumes from its last resource version delivers nothing until something changes, and the
/// retries of a failing one come at most ~3 s apart ([`watch_backoff`]).
const QUIET_AFTER_FAILURE: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends a watch stream's events to `tx` as changes (made by `to_change`), with its health
/// ([`Health`]) between them, until the stream or the receiver ends.
pub(super) async fn pump<K, S>(
    stream: S,
    kind: KindId,
    tx: mpsc::UnboundedSender<Seen>,
    mut to_change: impl FnMut(watcher::Event<K>) -> Change,
) where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    futures::pin_mut!(stream);
    let mut health = Health::new(kind);
    loop {
        let item = if health.failing.is_some() {
            match tokio::time::timeout(QUIET_AFTER_FAILURE, stream.next()).await {
                Ok(item) => item,
                Err(_) => {
                    if let Some(n) = health.delivered()
                        && tx.send((n, Instant::now())).is_err()
                    {
                        return;
                    }
                    continue;
                }
            }
        } else {
            stream.next().await
        };
        let Some(item) = item else { return };
        let now = Instant::now();
        let news = match &item {
            Err(e) => health.failed(e),
            Ok(_) => health.delivered(),
        };
        if let Some(n) = news
            && tx.send((n, now)).is_err()
        {
            return;
        }
        if let Ok(ev) = item
            && tx.send((to_change(ev), now)).is_err()
        {
            return;
        }
    }
}

/// One watch's health, turned into [`Change::Failing`] and [`Change::Recovered`] so that the
/// rebuild loop can show a failing watch (a revoked permission, an API server that is down) in
/// `/api/v1/status` while the last good configuration serves.
#[derive(Debug)]
pub(super) struct Health {
    kind: KindId,
    failing: Option<String>,
}

impl Health {
    pub(super) fn new(kind: KindId) -> Self {
        Self {
            kind,
            failing: None,
        }
    }

    /// An error from the watch: the change to send, when it is news (logged then).
    pub(super) fn failed(&mut self, e: &kube::runtime::watcher::Error) -> Option<Change> {
        let why = e.to_string();
        if self.failing.as_deref() == Some(why.as_str()) {
            return None;
        }
        tracing::warn!(kind = ?self.kind, error = %why, "watch failed; retrying with backoff and serving the last good configuration");
        self.failing = Some(why.clone());
        Some(Change::Failing(self.kind, why))
    }

    /// An event from the watch (or [`QUIET_AFTER_FAILURE`] without an error):
    /// [`Change::Recovered`] when it was failing.
    pub(super) fn delivered(&mut self) -> Option<Change> {
        self.failing.take()?;
        tracing::info!(kind = ?self.kind, "watch recovered");
        Some(Change::Recovered(self.kind))
    }
}

/// A change with the instant it was seen (for the propagation-delay histogram).
pub type Seen = (Change, Instant);

/// The reflector stores, readable by the status writer.
#[derive(Debug, Clone)]
pub struct Stores {
    /// Ingresses.
    pub ingresses: Store<Ingress>,
    /// IngressClasses.
    pub classes: Store<IngressClass>,
}

fn no_trim<K>(_: &mut K) {}

/// How a kind's objects become [`Object`]s, and what is trimmed from each first.
type Shape<K> = (fn(Arc<K>) -> Object, fn(&mut K));

fn spawn_kind<K>(
    api: Api<K>,
    cfg: watcher::Config,
    kind: KindId,
    (wrap, trim): Shape<K>,
    tx: mpsc::UnboundedSender<Seen>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        let stream = watcher(api, cfg)
            .backoff(watch_backoff())
            .modify(move |o: &mut K| {
                o.managed_fields_mut().clear();
                trim(o);
            })
            .reflect(writer);
        pump(stream, kind, tx, |ev| match ev {
            watcher::Event::Apply(o) => Change::Apply(kind, wrap(Arc::new(o))),
            watcher::Event::Delete(o) => Change::Delete(kind, wrap(Arc::new(o))),
            watcher::Event::Init => Change::Init(kind),
            watcher::Event::InitApply(o) => Change::InitApply(kind, wrap(Arc::new(o))),
            watcher::Event::InitDone => Change::InitDone(kind),
        })
        .await;
    });
    reader
}

/// Starts the six reflectors (the sixth for every ConfigMap), and a seventh for the one
/// controller ConfigMap when there is one; events go to `tx`.
pub fn start(
    client: &Client,
    namespace: Option<&str>,
    configmap: Option<&sluice_config::ObjectRef>,
    tx: mpsc::UnboundedSender<Seen>,
) -> Stores {
    fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let cfg = watcher::Config::default();
    let ingresses = spawn_kind::<Ingress>(
        api(client, namespace),
        cfg.clone(),
        KindId::Of(Kind::Ingress),
        (Object::Ingress, no_trim),
        tx.clone(),
    );
    let classes = spawn_kind::<IngressClass>(
        Api::all(client.clone()),
        cfg.clone(),
        KindId::Of(Kind::IngressClass),
        (Object::IngressClass, no_trim),
        tx.clone(),
    );
    spawn_kind::<Service>(
        api(client, namespace),
        cfg.clone(),
        KindId::Of(Kind::Service),
        (Object::Service, no_trim),
        tx.clone(),
    );
    spawn_kind::<EndpointSlice>(
        api(client, namespace),
        cfg.clone(),
        KindId::Of(Kind::EndpointSlice),
        (Object::EndpointSlice, no_trim),
        tx.clone(),
    );
    if let Some(cm) = configmap {
        // One object by name: `get`/`list`/`watch` on ConfigMaps of one namespace only.
        spawn_kind::<ConfigMap>(
            Api::namespaced(client.clone(), &cm.namespace),
            cfg.clone().fields(&format!("metadata.name={}", cm.name)),
            KindId::ControllerConfigMap,
            (Object::ConfigMap, no_trim),
            tx.clone(),
        );
    }
    spawn_kind::<ConfigMap>(
        api(client, namespace),
        cfg.clone(),
        KindId::Of(Kind::ConfigMap),
        (Object::ConfigMap, trim_config_map),
        tx.clone(),
    );
    spawn_kind::<Secret>(
        api(client, namespace),
        cfg.fields(SECRET_TYPES),
        KindId::Of(Kind::Secret),
        (Object::Secret, no_trim),
        tx,
    );
    Stores { ingresses, classes }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_watch_retries_at_least_every_few_seconds() {
        let mut b = watch_backoff();
        let delays: Vec<Duration> = (0..30).filter_map(|_| b.next()).collect();
        assert_eq!(delays.len(), 30, "it never gives up");
        let longest = delays.iter().max().copied().unwrap_or_default();
        assert!(longest <= Duration::from_secs(2), "{delays:?}");
        assert!(delays[0] < Duration::from_millis(500), "{delays:?}");
    }

    /// A failing watch is reported once per reason, and recovered either by an event or by
    /// [`QUIET_AFTER_FAILURE`] without another error (a resumed watch delivers nothing).
    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_is_reported_once_and_recovers_when_quiet() {
        use futures::StreamExt;
        let errors = futures::stream::iter(vec![
            Err::<watcher::Event<()>, _>(watcher::Error::NoResourceVersion),
            Err(watcher::Error::NoResourceVersion),
        ])
        .chain(futures::stream::pending());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let kind = KindId::Of(Kind::Ingress);
        let task = tokio::spawn(pump(errors, kind, tx, move |_| Change::Init(kind)));
        let first = rx.recv().await.map(|(c, _)| c);
        assert!(
            matches!(first, Some(Change::Failing(k, _)) if k == kind),
            "{first:?}"
        );
        let started = Instant::now();
        let next = rx.recv().await.map(|(c, _)| c);
        assert!(
            matches!(next, Some(Change::Recovered(k)) if k == kind),
            "{next:?}"
        );
        assert_eq!(
            started.elapsed(),
            QUIET_AFTER_FAILURE,
            "the repeat was not news"
        );
        task.abort();
    }
}
