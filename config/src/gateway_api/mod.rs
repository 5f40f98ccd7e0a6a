//! The Gateway API objects sluice reads (`gateway.networking.k8s.io`, bundle v1.6.3,
//! experimental channel): GatewayClass, Gateway, HTTPRoute, GRPCRoute, TLSRoute and
//! ReferenceGrant.
//!
//! The spec and status types are generated from the pinned CRDs by kopium (`generate.sh` in
//! this folder says how; do not edit them by hand). The object types below are hand-written:
//! metadata + spec + status, and the `k8s_openapi` resource traits that let kube's `Api` and
//! reflectors use them, so neither kube-derive nor schemars is built. No release of the
//! `gateway-api` crate is built on kube 5 / k8s-openapi 0.29 yet (its 0.22 uses kube 4.2).
//!
//! The controller does not watch these types directly: it watches untyped objects and parses
//! each one here ([`parse`]), so that one object this version cannot read (a newer bundle's
//! enum value) becomes one reported problem instead of a watch that fails for every object.

pub mod gatewayclasses;
pub mod gateways;
pub mod grpcroutes;
pub mod httproutes;
pub mod referencegrants;
pub mod tlsroutes;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The bundle version the types and the shipped CRDs come from.
pub const BUNDLE_VERSION: &str = "v1.6.3";

macro_rules! object {
    ($(#[$doc:meta])* $name:ident, $spec:ty, $status:ty, $version:literal, $plural:literal) => {
        $(#[$doc])*
        #[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
        pub struct $name {
            /// Standard object metadata.
            #[serde(default)]
            pub metadata: ObjectMeta,
            /// The desired state.
            pub spec: $spec,
            /// The observed state (written by the controller).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub status: Option<$status>,
        }

        impl k8s_openapi::Resource for $name {
            const API_VERSION: &'static str = concat!("gateway.networking.k8s.io/", $version);
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = stringify!($name);
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = object!(@scope $name);
        }

        impl k8s_openapi::Metadata for $name {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
    (@scope GatewayClass) => { k8s_openapi::ClusterResourceScope };
    (@scope $other:ident) => { k8s_openapi::NamespaceResourceScope };
}

object!(
    /// A class of Gateways and the controller that runs them.
    GatewayClass,
    gatewayclasses::GatewayClassSpec,
    gatewayclasses::GatewayClassStatus,
    "v1",
    "gatewayclasses"
);
object!(
    /// A set of listeners (address, port, protocol, hostname, TLS) routes attach to.
    Gateway,
    gateways::GatewaySpec,
    gateways::GatewayStatus,
    "v1",
    "gateways"
);
object!(
    /// HTTP routing rules attached to Gateway listeners.
    HTTPRoute,
    httproutes::HttpRouteSpec,
    httproutes::HttpRouteStatus,
    "v1",
    "httproutes"
);
object!(
    /// gRPC routing rules (service, method and header matches) attached to Gateway
    /// listeners.
    GRPCRoute,
    grpcroutes::GrpcRouteSpec,
    grpcroutes::GrpcRouteStatus,
    "v1",
    "grpcroutes"
);

object!(
    /// TLS connections passed through by server name (SNI) to backends, attached to
    /// Gateway listeners of protocol TLS.
    TLSRoute,
    tlsroutes::TlsRouteSpec,
    tlsroutes::TlsRouteStatus,
    "v1",
    "tlsroutes"
);

/// Permission for objects of other namespaces to refer to objects of this one. It has no
/// status; `v1beta1` is the version every bundle since v0.6 serves.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ReferenceGrant {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Who may refer to what.
    pub spec: referencegrants::ReferenceGrantSpec,
}

impl k8s_openapi::Resource for ReferenceGrant {
    const API_VERSION: &'static str = "gateway.networking.k8s.io/v1beta1";
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = "ReferenceGrant";
    const VERSION: &'static str = "v1beta1";
    const URL_PATH_SEGMENT: &'static str = "referencegrants";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ReferenceGrant {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Reads one object of a Gateway API kind from its JSON; the error says which field is wrong.
pub fn parse<T: serde::de::DeserializeOwned>(json: serde_json::Value) -> Result<T, String> {
    serde_json::from_value(json).map_err(|e| e.to_string())
}
