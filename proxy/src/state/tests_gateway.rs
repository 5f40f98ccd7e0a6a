//! The Gateway part of the route table across applies: a rule the next snapshot hands over
//! as the same object keeps its compiled backends while its pools stay, and is compiled again
//! when a pool it names is replaced.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_config::gateway_model::hostname::Hostname;
use sluice_config::gateway_model::{
    BackendTarget, Filters, GatewayListener, GatewayRule, GatewaySocket, HostRules, PathRule,
    RequestFacts, WeightedBackend,
};
use sluice_config::snapshot::SnapshotParts;
use sluice_config::{
    BalancePolicy, ClusterKey, ClusterSpec, EndpointSpec, EndpointState, ObjectRef, Snapshot,
    UpstreamProtocol,
};

use crate::state::dataplane::DataPlane;
use crate::state::routes::Target;
use crate::state::routes::gateway::{Backend, CompiledRule, Found};
use crate::state::settings::ProxySettings;

const PORT: u16 = 18_000;

fn key(service: &str) -> ClusterKey {
    ClusterKey {
        namespace: "ns".into(),
        service: service.into(),
        port: 80,
    }
}

fn cluster(service: &str, protocol: UpstreamProtocol) -> ClusterSpec {
    ClusterSpec {
        key: key(service),
        protocol,
        balance: BalancePolicy::default(),
        endpoints: vec![EndpointSpec {
            addr: SocketAddr::from(([10, 0, 0, 1], 8080)),
            state: EndpointState::Ready,
        }],
        max_in_flight: None,
        service_upstream: false,
        tls: None,
    }
}

fn rule(service: &str) -> Arc<GatewayRule> {
    Arc::new(GatewayRule {
        source: ObjectRef::new("HTTPRoute", "ns", "r"),
        rule: 0,
        path: PathRule::Prefix(String::new()),
        method: None,
        headers: Vec::new(),
        query: Vec::new(),
        filters: Filters::default(),
        backends: vec![WeightedBackend {
            target: BackendTarget::Cluster(key(service)),
            weight: 1,
            filters: Filters::default(),
        }],
        timeout: None,
    })
}

fn snapshot(rules: &[Arc<GatewayRule>], clusters: &[ClusterSpec]) -> Snapshot {
    Snapshot::new(SnapshotParts {
        clusters: clusters
            .iter()
            .map(|c| (c.key.clone(), Arc::new(c.clone())))
            .collect(),
        gateway_sockets: vec![GatewaySocket {
            addr: None,
            port: PORT,
            tls: false,
            passthrough: false,
            listeners: vec![GatewayListener {
                gateway: ObjectRef::new("Gateway", "ns", "gw"),
                name: "http".into(),
                hostname: Hostname::Any,
                certificates: Vec::new(),
                client_validation: None,
                hosts: vec![HostRules {
                    host: Hostname::Exact("a.test".into()),
                    rules: rules.to_vec(),
                }],
            }],
        }],
        ..SnapshotParts::default()
    })
}

/// What `f` makes of the compiled rule a request for `/` on `a.test` finds.
fn with_rule<T>(dp: &DataPlane, f: impl FnOnce(&CompiledRule) -> T) -> T {
    let table = dp.routes();
    let no_header = |_: &str| None;
    let facts = RequestFacts {
        path: "/",
        method: "GET",
        query: None,
        header: &no_header,
    };
    let local = SocketAddr::from(([127, 0, 0, 1], PORT));
    let Found::Rule(_, c) =
        table
            .gateway()
            .find(table.snapshot(), (local, None), Some("a.test"), &facts)
    else {
        panic!("no rule for a.test");
    };
    f(c)
}

/// The compiled rule a request to `a.test` finds, and the pool it goes to.
fn found(dp: &DataPlane) -> (*const CompiledRule, Arc<crate::upstream::cluster::Cluster>) {
    with_rule(dp, |c| {
        let Some((Backend::Serve(action), _)) = c.pick() else {
            panic!("no backend");
        };
        let Target::Cluster(pool) = &action.target else {
            panic!("no pool");
        };
        (std::ptr::from_ref(c), Arc::clone(pool))
    })
}

#[test]
fn a_rule_handed_over_again_keeps_its_compiled_backends_until_its_pool_is_replaced() {
    let dp = DataPlane::new(ProxySettings::default(), None).unwrap();
    let r = rule("a");
    dp.apply(snapshot(
        &[Arc::clone(&r)],
        &[cluster("a", UpstreamProtocol::Http1)],
    ));
    let (first, pool) = found(&dp);

    // Another pool comes: the same rule object keeps its compiled form.
    dp.apply(snapshot(
        &[Arc::clone(&r)],
        &[
            cluster("a", UpstreamProtocol::Http1),
            cluster("b", UpstreamProtocol::Http1),
        ],
    ));
    let (again, pool_again) = found(&dp);
    assert!(std::ptr::eq(first, again));
    assert!(Arc::ptr_eq(&pool, &pool_again));

    // A rule placed before it moves it to another index: still found, still kept.
    let mut other = (*rule("b")).clone();
    other.path = PathRule::Exact("/other".into());
    dp.apply(snapshot(
        &[Arc::new(other), Arc::clone(&r)],
        &[
            cluster("a", UpstreamProtocol::Http1),
            cluster("b", UpstreamProtocol::Http1),
        ],
    ));
    let (moved, _) = found(&dp);
    assert!(std::ptr::eq(first, moved));

    // Its pool is replaced (another protocol is another pool): compiled again, on the new one.
    dp.apply(snapshot(
        &[Arc::clone(&r)],
        &[cluster("a", UpstreamProtocol::H2c)],
    ));
    let (third, pool_third) = found(&dp);
    assert!(!std::ptr::eq(again, third));
    assert!(!Arc::ptr_eq(&pool, &pool_third));
    assert_eq!(pool_third.protocol, UpstreamProtocol::H2c);

    // An equal rule that is another object: compiled again (the data plane trusts identity
    // only), on the same pool.
    let r2 = rule("a");
    dp.apply(snapshot(
        &[Arc::clone(&r2)],
        &[
            cluster("a", UpstreamProtocol::H2c),
            cluster("c", UpstreamProtocol::Http1),
        ],
    ));
    let (fourth, pool_fourth) = found(&dp);
    assert!(!std::ptr::eq(third, fourth));
    assert!(Arc::ptr_eq(&pool_third, &pool_fourth));

    // The pool goes away: the rule (same object) is compiled again and answers 503.
    dp.apply(snapshot(&[r2], &[cluster("c", UpstreamProtocol::Http1)]));
    let closed = with_rule(
        &dp,
        |c| matches!(c.pick(), Some((Backend::Serve(a), _)) if matches!(a.target, Target::Unavailable(_))),
    );
    assert!(closed);
}
