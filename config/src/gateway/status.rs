//! The status sluice owes every Gateway API object it controls, computed by a pure function
//! of the world (translation computes it beside the snapshot), written by the leader only.
//! Conditions carry the spec's types and reasons; the writer adds `lastTransitionTime`,
//! keeping the old one while a condition's status is unchanged.

use std::collections::BTreeMap;

use crate::world::Key;

/// One condition as the spec names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cond {
    /// `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`.
    pub kind: &'static str,
    /// True or False.
    pub status: bool,
    /// The spec's reason.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl Cond {
    /// A condition.
    pub fn new(
        kind: &'static str,
        status: bool,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            status,
            reason,
            message: message.into(),
        }
    }

    /// A true condition whose reason is its type (`Accepted`/`Accepted`).
    pub fn ok(kind: &'static str) -> Self {
        Self::new(kind, true, kind, "")
    }
}

/// A GatewayClass's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassState {
    /// `metadata.generation` the conditions are for.
    pub generation: i64,
    /// Accepted (and SupportedVersion).
    pub conditions: Vec<Cond>,
    /// `status.supportedFeatures`, sorted.
    pub features: Vec<&'static str>,
}

/// One listener's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerState {
    /// `spec.listeners[].name`.
    pub name: String,
    /// `(group, kind)` of the route kinds it takes.
    pub supported_kinds: Vec<(String, String)>,
    /// Routes attached to it.
    pub attached_routes: i32,
    /// Accepted, Conflicted, ResolvedRefs, Programmed.
    pub conditions: Vec<Cond>,
}

/// A Gateway's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayState {
    /// `metadata.generation` the conditions are for.
    pub generation: i64,
    /// `status.addresses` (type IPAddress).
    pub addresses: Vec<String>,
    /// Accepted, Programmed.
    pub conditions: Vec<Cond>,
    /// Per listener, in spec order.
    pub listeners: Vec<ListenerState>,
}

/// A route's `parentRef` as status repeats it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParentKey {
    /// `group` as written (`None`: unset, the default).
    pub group: Option<String>,
    /// `kind` as written.
    pub kind: Option<String>,
    /// `namespace` as written.
    pub namespace: Option<String>,
    /// `name`.
    pub name: String,
    /// `sectionName` as written.
    pub section_name: Option<String>,
    /// `port` as written.
    pub port: Option<i32>,
}

/// A route's status for one of its parents that sluice controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentState {
    /// The parentRef.
    pub parent: ParentKey,
    /// Accepted, ResolvedRefs.
    pub conditions: Vec<Cond>,
}

/// A route's status (the parents sluice controls; others' entries are kept by the writer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteState {
    /// `metadata.generation` the conditions are for.
    pub generation: i64,
    /// One per parentRef naming a Gateway of ours.
    pub parents: Vec<ParentState>,
}

/// Everything the leader writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayStatuses {
    /// GatewayClasses of our controller, by name.
    pub classes: BTreeMap<String, ClassState>,
    /// Gateways of our classes.
    pub gateways: BTreeMap<Key, GatewayState>,
    /// HTTPRoutes with at least one parent of ours.
    pub routes: BTreeMap<Key, std::sync::Arc<RouteState>>,
    /// GRPCRoutes with at least one parent of ours.
    pub grpc_routes: BTreeMap<Key, std::sync::Arc<RouteState>>,
    /// TLSRoutes with at least one parent of ours.
    pub tls_routes: BTreeMap<Key, std::sync::Arc<RouteState>>,
}
