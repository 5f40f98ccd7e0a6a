//! [`RouteMemo`]: a route's compiled rules kept from one translation to the next.
//!
//! Why: every change but an endpoint-only one translates the whole world again, and at 10,000
//! HTTPRoutes compiling every route's rules (matches, filters, each backendRef resolved to a
//! Service port's pool and its endpoints) was most of the time a one-route change took to reach
//! traffic. A route's compiled rules depend on the route itself, the Services its backendRefs
//! (and mirrors) name with their EndpointSlices, the ReferenceGrants, and the pool settings:
//! nothing else. So an entry is reused while its route is the very same object (`Arc`
//! identity: the controller's stores and `sluice serve`'s files hand an unchanged object over
//! as the same `Arc`) and none of the Services it named changed; a change of the
//! ReferenceGrants or the pool settings forgets every entry.
//!
//! The memo holds the objects it compared (not their addresses), so an address it remembers
//! can never be taken by another object, and it reads the world as it is (it does not rely on
//! being told what changed): a translation with a memo gives the snapshot one without gives.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::listeners::GatewayPlan;
use super::routes::{Compiled, RouteOutcome};
use crate::gateway_api::gateways::GatewayListeners;
use crate::gateway_api::{GRPCRoute, HTTPRoute, ReferenceGrant, TLSRoute};
use crate::merge::Merged;
use crate::model::BalancePolicy;
use crate::world::{Key, World, key_of};
use k8s_openapi::api::core::v1::Namespace;

/// The object a route was read from (GRPCRoutes and TLSRoutes are compiled as the HTTPRoutes
/// they amount to, so the memo compares the object itself).
#[derive(Debug, Clone)]
pub(super) enum Origin {
    /// An HTTPRoute.
    Http(Arc<HTTPRoute>),
    /// A GRPCRoute.
    Grpc(Arc<GRPCRoute>),
    /// A TLSRoute.
    Tls(Arc<TLSRoute>),
}

impl Origin {
    /// The object's address: the memo's key (an entry holds its object, so no other object
    /// can take the address while the entry lives).
    fn address(&self) -> usize {
        match self {
            Origin::Http(a) => Arc::as_ptr(a).cast::<()>() as usize,
            Origin::Grpc(a) => Arc::as_ptr(a).cast::<()>() as usize,
            Origin::Tls(a) => Arc::as_ptr(a).cast::<()>() as usize,
        }
    }
}

/// What the memo read of the world at the last translation.
#[derive(Debug)]
struct Seen {
    /// Services in key order.
    services: Vec<Arc<Service>>,
    /// EndpointSlices in key order.
    slices: Vec<Arc<EndpointSlice>>,
    grants: Vec<Arc<ReferenceGrant>>,
    pool: (BalancePolicy, Option<u32>),
}

#[derive(Debug)]
struct Entry {
    /// Held so that its address stays its own.
    _origin: Origin,
    compiled: Arc<Compiled>,
    /// What attaching it gave (`Some(None)`: it names no Gateway of ours), valid while the
    /// [`AttachContext`] stays.
    attached: Option<Option<Arc<RouteOutcome>>>,
    /// The translation that last used it (entries of routes gone are dropped).
    used: u64,
}

/// Compiled routes kept across translations (see the module docs). One per translating loop
/// (`sluice serve`'s file provider, the controller's rebuild loop).
#[derive(Debug, Default)]
pub struct RouteMemo {
    seen: Option<Seen>,
    /// By the address of the route object (a changed route is another object, so a lookup
    /// needs no key built and no string compared).
    entries: HashMap<usize, Entry>,
    /// Services whose object or endpoints changed since the last translation.
    changed: BTreeSet<Key>,
    round: u64,
    /// What attachment read of the Gateways at the last translation, and whether this one
    /// reads the same (then each route attaches as it did).
    attach: Option<AttachContext>,
    attach_same: bool,
    /// Routes compiled and reused over the memo's life, for tests and logs.
    stats: MemoStats,
}

/// What attaching a route reads besides the route: each Gateway's listeners as routes see
/// them (spec, whether routes may attach, the kinds they take) and the Namespaces' labels.
#[derive(Debug)]
pub(super) struct AttachContext {
    gateways: Vec<(Key, Vec<ListenerSeen>)>,
    namespaces: Vec<Arc<Namespace>>,
}

/// A listener as routes see it: its spec, whether routes may attach, the kinds it takes.
type ListenerSeen = (GatewayListeners, bool, Vec<(String, String)>);

impl AttachContext {
    /// What the planned Gateways and the world's Namespaces give routes to attach to.
    pub(super) fn of(plans: &[GatewayPlan<'_>], world: &World) -> Self {
        Self {
            gateways: plans
                .iter()
                .map(|g| {
                    let listeners = g
                        .listeners
                        .iter()
                        .map(|l| (l.spec.clone(), l.attachable, l.kinds.clone()))
                        .collect();
                    (g.key.clone(), listeners)
                })
                .collect(),
            namespaces: world.namespaces.values().cloned().collect(),
        }
    }

    fn same(&self, other: &Self) -> bool {
        self.gateways == other.gateways
            && self.namespaces.len() == other.namespaces.len()
            && self
                .namespaces
                .iter()
                .zip(&other.namespaces)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

/// How often the memo was of use.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemoStats {
    /// Routes compiled.
    pub compiled: u64,
    /// Routes whose compiled rules were reused.
    pub reused: u64,
    /// Routes whose attachment (status, placements) was reused too.
    pub attached: u64,
}

impl RouteMemo {
    /// An empty memo.
    pub fn new() -> Self {
        Self::default()
    }

    /// How often the memo was of use so far.
    pub fn stats(&self) -> MemoStats {
        self.stats
    }

    /// Starts a translation: notes what changed in the world since the last one, forgetting
    /// every entry when the ReferenceGrants or the pool settings changed.
    pub(super) fn begin(&mut self, world: &World, pool: (&BalancePolicy, Option<u32>)) {
        self.round += 1;
        self.changed.clear();
        let now = Seen {
            services: world.services.values().cloned().collect(),
            slices: world.endpoint_slices().cloned().collect(),
            grants: world.reference_grants.values().cloned().collect(),
            pool: (pool.0.clone(), pool.1),
        };
        match self.seen.take() {
            Some(was)
                if was.pool == now.pool
                    && was.grants.len() == now.grants.len()
                    && was
                        .grants
                        .iter()
                        .zip(&now.grants)
                        .all(|(a, b)| Arc::ptr_eq(a, b)) =>
            {
                let changed = &mut self.changed;
                diff(&was.services, &now.services, |s| {
                    changed.insert(key_of(&s.metadata));
                });
                diff(&was.slices, &now.slices, |s| {
                    if let Some(svc) = crate::world::service_of(s) {
                        changed.insert(svc);
                    }
                });
            }
            _ => self.entries.clear(),
        }
        self.seen = Some(now);
    }

    /// Notes what routes attach to in this translation: when it is what the last one had,
    /// a route whose compiled rules are reused attaches as it did then.
    pub(super) fn attach_context(&mut self, now: AttachContext) {
        self.attach_same = self.attach.as_ref().is_some_and(|was| was.same(&now));
        self.attach = Some(now);
    }

    /// A route compiled and attached: the memo's while the route, the Services it named and
    /// (for the attachment) the [`AttachContext`] are unchanged, else `compile`'s and
    /// `attach`'s (kept for next time). The flag is true when the attachment is the memo's:
    /// the caller then counts its attachments on the Gateways (`attach` counts its own).
    pub(super) fn route(
        &mut self,
        origin: Origin,
        compile: impl FnOnce() -> Compiled,
        attach: impl FnOnce(Arc<Compiled>) -> Option<RouteOutcome>,
    ) -> (Option<Arc<RouteOutcome>>, bool) {
        let round = self.round;
        let changed = &self.changed;
        let slot = origin.address();
        if let Some(e) = self.entries.get_mut(&slot)
            && (changed.is_empty() || !e.compiled.deps.iter().any(|d| changed.contains(d)))
        {
            e.used = round;
            self.stats.reused += 1;
            if self.attach_same
                && let Some(a) = &e.attached
            {
                self.stats.attached += 1;
                return (a.clone(), true);
            }
            let a = attach(Arc::clone(&e.compiled)).map(Arc::new);
            e.attached = Some(a.clone());
            return (a, false);
        }
        let compiled = Arc::new(compile());
        self.stats.compiled += 1;
        let a = attach(Arc::clone(&compiled)).map(Arc::new);
        self.entries.insert(
            slot,
            Entry {
                _origin: origin,
                compiled,
                attached: Some(a.clone()),
                used: round,
            },
        );
        (a, false)
    }

    /// Ends a translation: entries of routes it did not see are dropped.
    pub(super) fn finish(&mut self) {
        let round = self.round;
        self.entries.retain(|_, e| e.used == round);
    }
}

/// Calls `changed` with every object that is in one list and not the other, or replaced:
/// both lists are in key order, so one walk that compares keys only where the objects differ
/// finds them.
fn diff<T>(was: &[Arc<T>], now: &[Arc<T>], mut changed: impl FnMut(&T))
where
    T: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
{
    let order = |a: &&Arc<T>, b: &&Arc<T>| {
        if Arc::ptr_eq(a, b) {
            std::cmp::Ordering::Equal
        } else {
            key_of(a.metadata()).cmp(&key_of(b.metadata()))
        }
    };
    for step in crate::merge::merge(was, now, order) {
        match step {
            Merged::Both(a, b) if Arc::ptr_eq(a, b) => {}
            Merged::Both(a, b) => {
                changed(a);
                changed(b);
            }
            Merged::Left(o) | Merged::Right(o) => changed(o),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, port: i32) -> Arc<Service> {
        let mut s = Service::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("ns".into());
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                port,
                ..Default::default()
            }]),
            ..Default::default()
        });
        Arc::new(s)
    }

    fn changed(was: &[Arc<Service>], now: &[Arc<Service>]) -> Vec<String> {
        let mut out = Vec::new();
        diff(was, now, |s| {
            out.push(s.metadata.name.clone().unwrap_or_default())
        });
        out
    }

    #[test]
    fn the_diff_finds_objects_added_removed_and_replaced_anywhere() {
        let (a, b, c, d) = (svc("a", 1), svc("b", 1), svc("c", 1), svc("d", 1));
        let all = [a.clone(), b.clone(), c.clone(), d.clone()];
        assert!(changed(&all, &all).is_empty());
        assert_eq!(changed(&all, &[a.clone(), c.clone(), d.clone()]), ["b"]);
        assert_eq!(changed(&[a.clone(), c.clone()], &all), ["b", "d"]);
        let b2 = svc("b", 2);
        assert_eq!(
            changed(&all, &[a.clone(), b2, c.clone(), d.clone()]),
            ["b", "b"]
        );
        assert_eq!(changed(&[], std::slice::from_ref(&a)), ["a"]);
        assert_eq!(changed(std::slice::from_ref(&d), &[]), ["d"]);
        // An equal object that is another `Arc` counts as replaced (the memo compares
        // identity; a replaced object may have changed).
        assert_eq!(changed(&[svc("a", 1)], &[a]), ["a", "a"]);
    }
}
