//! The names of things: a Kubernetes object ([`ObjectRef`]), an upstream pool ([`ClusterKey`]),
//! and where a matched request goes ([`RouteAction`]). The bottom of the model: the route edits
//! (`route_policy`) and the model itself name objects and pools with these.

use std::fmt;

/// Identifies a Kubernetes object for problem reports and for back references (which Ingress a
/// route came from, which Secret a certificate came from).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// Kubernetes kind, e.g. `Ingress`.
    pub kind: &'static str,
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Object name.
    pub name: String,
}

impl ObjectRef {
    /// Builds a reference from its parts.
    pub fn new(kind: &'static str, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// An upstream pool's identity: one Service port. Backends naming the port by number or by name
/// resolve to the same key, so they share one pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterKey {
    /// Service namespace.
    pub namespace: String,
    /// Service name.
    pub service: String,
    /// The Service's `port` (not the target port).
    pub port: u16,
}

impl fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.service, self.port)
    }
}

/// Where a matched request goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RouteAction {
    /// Forward to the pool with this key.
    Cluster(ClusterKey),
    /// The backend cannot be resolved (missing Service or port): answer 503 with this reason.
    Unavailable(String),
}
