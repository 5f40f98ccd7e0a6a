//! Authentication at the edge: ingress-nginx's `auth-type: basic` ([`basic`]) and `digest`
//! ([`digest`]), `auth-url`
//! ([`external`]) and client certificates ([`client_cert`]), compiled per route into a [`Gate`] the general handler (`handler::auth`)
//! asks before it forwards. A gate that cannot be compiled leaves its route answering 503,
//! never open.

pub mod basic;
pub mod cache;
pub mod client_cert;
pub mod digest;
pub mod external;
pub mod frontend;
mod password;

use std::collections::HashMap;
use std::sync::Arc;

use sluice_config::route_policy::{Auth, AuthTarget};
use sluice_config::{ClusterKey, RouteAction};

use crate::upstream::cluster::Cluster;

pub use external::Passed;

/// A route's authentication.
#[derive(Debug)]
pub enum Gate {
    /// `auth-type: basic`.
    Basic(basic::Basic),
    /// `auth-type: digest`.
    Digest(digest::Digest),
    /// `auth-url`.
    External(Box<external::External>),
}

impl Gate {
    /// Compiles the route's authentication; `Err` says why the route must stay closed.
    pub fn compile(
        auth: &Auth,
        clusters: &HashMap<ClusterKey, Arc<Cluster>>,
    ) -> Result<Self, String> {
        match auth {
            Auth::Basic(b) => basic::Basic::compile(b)
                .map(Gate::Basic)
                .ok_or_else(|| "auth-realm cannot be sent in a header".to_string()),
            Auth::Digest(d) => digest::Digest::compile(d)
                .map(Gate::Digest)
                .ok_or_else(|| "auth-realm cannot be sent in a header".to_string()),
            Auth::External(e) => {
                let pool = match &e.target {
                    AuthTarget::Pool(RouteAction::Cluster(k)) => {
                        Some(clusters.get(k).cloned().ok_or_else(|| {
                            format!("auth-url {}: no pool for the auth Service", e.url)
                        })?)
                    }
                    AuthTarget::Pool(RouteAction::Unavailable(why)) => {
                        return Err(format!("auth-url {}: {why}", e.url));
                    }
                    AuthTarget::Routed(_) => None,
                };
                external::External::compile(e, pool)
                    .map(|e| Gate::External(Box::new(e)))
                    .ok_or_else(|| format!("auth-url {}: settings cannot be sent", e.url))
            }
        }
    }
}
