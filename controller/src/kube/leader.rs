//! Leader election on a `coordination.k8s.io/v1` Lease with client-go's semantics: a holder is
//! presumed alive until its record has not changed for `lease_duration` *as observed locally*
//! (so clock skew between nodes does not matter); the leader renews every `retry_period` and
//! steps down when it could not renew for `renew_deadline`; on shutdown it releases the lease.
//! The Lease API sits behind [`LeaseStore`] so tests can drive the elector against the fake API
//! server (through [`KubeLeases`]) or an in-memory store.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;

/// Why a Lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone else wrote first (409).
    #[error("conflict: the lease changed")]
    Conflict,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// The three Lease calls an elector needs.
pub trait LeaseStore: Send + Sync {
    /// Reads the lease (`None` when absent).
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, LeaseError>> + Send;
    /// Creates it (conflict when it exists).
    fn create(&self, l: &Lease) -> impl Future<Output = Result<Lease, LeaseError>> + Send;
    /// Replaces it (conflict when its resourceVersion is stale).
    fn replace(&self, l: &Lease) -> impl Future<Output = Result<Lease, LeaseError>> + Send;
}

/// [`LeaseStore`] over the Kubernetes API.
#[derive(Debug, Clone)]
pub struct KubeLeases {
    api: Api<Lease>,
    name: String,
}

impl KubeLeases {
    /// The lease `name` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }
}

fn map_err(e: kube::Error) -> LeaseError {
    match &e {
        kube::Error::Api(s) if s.code == 409 => LeaseError::Conflict,
        _ => LeaseError::Other(e.to_string()),
    }
}

impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        self.api.get_opt(&self.name).await.map_err(map_err)
    }
    async fn create(&self, l: &Lease) -> Result<Lease, LeaseError> {
        self.api
            .create(&PostParams::default(), l)
            .await
            .map_err(map_err)
    }
    async fn replace(&self, l: &Lease) -> Result<Lease, LeaseError> {
        self.api
            .replace(&self.name, &PostParams::default(), l)
            .await
            .map_err(map_err)
    }
}

/// Timing of the election (client-go's defaults).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a holder is presumed alive after its last observed renewal.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before stepping down.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// One candidate.
#[derive(Debug)]
pub struct Elector<S> {
    store: S,
    name: String,
    identity: String,
    timing: Timing,
    observed: Option<(String, Instant)>,
    last_renew: Option<Instant>,
    /// Wakes the loop for an attempt before the retry period is up.
    try_now: std::sync::Arc<tokio::sync::Notify>,
}

fn record_of(l: &Lease) -> String {
    let s = l.spec.as_ref();
    format!(
        "{}|{:?}|{}",
        s.and_then(|s| s.holder_identity.clone())
            .unwrap_or_default(),
        s.and_then(|s| s.renew_time.as_ref().map(|t| t.0)),
        l.metadata.resource_version.clone().unwrap_or_default()
    )
}

impl<S: LeaseStore> Elector<S> {
    /// A candidate called `identity` for the lease `name`.
    pub fn new(store: S, name: &str, identity: &str, timing: Timing) -> Self {
        Self {
            store,
            name: name.to_string(),
            identity: identity.to_string(),
            timing,
            observed: None,
            last_renew: None,
            try_now: std::sync::Arc::default(),
        }
    }

    /// A handle that makes the next attempt now (a predecessor that handed its sockets over
    /// has just released the lease: take it at once, not a retry period later).
    pub fn nudge(&self) -> std::sync::Arc<tokio::sync::Notify> {
        std::sync::Arc::clone(&self.try_now)
    }

    fn spec(&self, prev: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let ours = prev.and_then(|p| p.holder_identity.as_deref()) == Some(self.identity.as_str());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(15),
            ),
            acquire_time: if ours {
                prev.and_then(|p| p.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(
                prev.and_then(|p| p.lease_transitions).unwrap_or(0)
                    + i32::from(!ours && prev.is_some()),
            ),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to acquire or renew; returns whether we hold the lease now.
    pub async fn try_acquire_or_renew(&mut self) -> bool {
        let current = match self.store.get().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "reading the leader lease failed");
                return false;
            }
        };
        let Some(current) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None)),
            };
            return match self.store.create(&lease).await {
                Ok(l) => {
                    self.observed = Some((record_of(&l), Instant::now()));
                    true
                }
                Err(_) => false,
            };
        };
        let rec = record_of(&current);
        if self.observed.as_ref().is_none_or(|(r, _)| *r != rec) {
            self.observed = Some((rec, Instant::now()));
        }
        let spec = current.spec.as_ref();
        let holder = spec
            .and_then(|s| s.holder_identity.as_deref())
            .unwrap_or("");
        let observed_at = self
            .observed
            .as_ref()
            .map_or_else(Instant::now, |(_, t)| *t);
        let held_by_other = !holder.is_empty() && holder != self.identity;
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .map_or(self.timing.lease_duration, |d| {
                Duration::from_secs(u64::try_from(d).unwrap_or(15))
            });
        if held_by_other && observed_at + duration > Instant::now() {
            return false;
        }
        let mut next = current.clone();
        next.spec = Some(self.spec(spec));
        match self.store.replace(&next).await {
            Ok(l) => {
                if held_by_other {
                    tracing::info!(previous = holder, identity = %self.identity, "took over the leader lease");
                }
                self.observed = Some((record_of(&l), Instant::now()));
                true
            }
            Err(_) => false,
        }
    }

    /// Gives the lease up (an empty holder lets others take over at once).
    pub async fn release(&mut self) {
        if let Ok(Some(mut l)) = self.store.get().await
            && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                == Some(self.identity.as_str())
        {
            if let Some(s) = l.spec.as_mut() {
                s.holder_identity = None;
                s.lease_duration_seconds = Some(1);
            }
            let _ = self.store.replace(&l).await;
        }
    }

    /// Campaigns until `stop` turns true, publishing leadership on `leader`; releases on stop.
    pub async fn run(mut self, leader: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
        loop {
            let ok = self.try_acquire_or_renew().await;
            let now = Instant::now();
            if ok {
                self.last_renew = Some(now);
            }
            let is_leader = match (ok, self.last_renew) {
                (true, _) => true,
                (false, Some(t))
                    if *leader.borrow() && now.duration_since(t) < self.timing.renew_deadline =>
                {
                    true
                }
                _ => false,
            };
            leader.send_if_modified(|l| {
                if *l != is_leader {
                    tracing::info!(identity = %self.identity, leader = is_leader, "leadership changed");
                    *l = is_leader;
                    true
                } else {
                    false
                }
            });
            tokio::select! {
                _ = tokio::time::sleep(self.timing.retry_period) => {}
                _ = self.try_now.notified() => {}
                _ = stop.changed() => {
                    if *leader.borrow() {
                        self.release().await;
                        leader.send_replace(false);
                    }
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// An in-memory Lease API with resourceVersion conflicts.
    #[derive(Debug, Clone, Default)]
    struct Mem(Arc<Mutex<Option<Lease>>>, Arc<Mutex<u64>>);

    impl LeaseStore for Mem {
        async fn get(&self) -> Result<Option<Lease>, LeaseError> {
            Ok(self.0.lock().unwrap().clone())
        }
        async fn create(&self, l: &Lease) -> Result<Lease, LeaseError> {
            let mut cur = self.0.lock().unwrap();
            if cur.is_some() {
                return Err(LeaseError::Conflict);
            }
            let mut l = l.clone();
            let mut rv = self.1.lock().unwrap();
            *rv += 1;
            l.metadata.resource_version = Some(rv.to_string());
            *cur = Some(l.clone());
            Ok(l)
        }
        async fn replace(&self, l: &Lease) -> Result<Lease, LeaseError> {
            let mut cur = self.0.lock().unwrap();
            if cur.as_ref().map(|c| &c.metadata.resource_version)
                != Some(&l.metadata.resource_version)
            {
                return Err(LeaseError::Conflict);
            }
            let mut l = l.clone();
            let mut rv = self.1.lock().unwrap();
            *rv += 1;
            l.metadata.resource_version = Some(rv.to_string());
            *cur = Some(l.clone());
            Ok(l)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_leader_and_takeover_after_the_lease_duration() {
        let store = Mem::default();
        let timing = Timing::default();
        let mut a = Elector::new(store.clone(), "l", "a", timing);
        let mut b = Elector::new(store.clone(), "l", "b", timing);
        assert!(a.try_acquire_or_renew().await);
        assert!(
            !b.try_acquire_or_renew().await,
            "b must not take a live lease"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(a.try_acquire_or_renew().await, "a renews");
        assert!(!b.try_acquire_or_renew().await);
        // a stops renewing: b takes over only once a's record has been unchanged for 15 s.
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(!b.try_acquire_or_renew().await);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(b.try_acquire_or_renew().await);
        assert!(!a.try_acquire_or_renew().await, "a sees b's fresh record");
        let spec = store.0.lock().unwrap().clone().unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        b.release().await;
        assert!(
            a.try_acquire_or_renew().await,
            "a released lease is taken at once"
        );
    }
}
