//! The data plane's state on its own: what `apply` creates, keeps and swaps, the endpoints-only
//! fast path, the route table a request holds across a change, and the certificate store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use sluice_config::snapshot::SnapshotParts;
use sluice_config::{
    BalancePolicy, CertificatePem, ClusterKey, ClusterSpec, EndpointSpec, EndpointState, HostMatch,
    ObjectRef, PathKind, PathMatch, Route, RouteAction, RouteOptions, Snapshot, TlsBinding,
    UpstreamProtocol, VirtualHost,
};

use crate::state::certs::{CertStore, TlsState, load_pem};
use crate::state::dataplane::{ApplyOutcome, DataPlane};
use crate::state::settings::ProxySettings;
use crate::upstream::cluster::Cluster;

fn key(service: &str) -> ClusterKey {
    ClusterKey {
        namespace: "ns".into(),
        service: service.into(),
        port: 80,
    }
}

fn ep(last: u8) -> EndpointSpec {
    EndpointSpec {
        addr: SocketAddr::from(([10, 0, 0, last], 8080)),
        state: EndpointState::Ready,
    }
}

fn cluster(service: &str, eps: &[u8], protocol: UpstreamProtocol) -> ClusterSpec {
    ClusterSpec {
        key: key(service),
        protocol,
        balance: BalancePolicy::default(),
        endpoints: eps.iter().map(|&i| ep(i)).collect(),
        max_in_flight: None,
        service_upstream: false,
        tls: None,
    }
}

fn route(kind: PathKind, path: &str, service: &str) -> Route {
    Route {
        path: PathMatch {
            kind,
            path: path.into(),
        },
        action: RouteAction::Cluster(key(service)),
        source: ObjectRef::new("Ingress", "ns", "ing"),
        options: RouteOptions::default(),
        canary: None,
        fallback: None,
    }
}

/// One host, `a.example`, with a `/api` prefix route per cluster in order (`/api`, `/api/x`…),
/// plus an exact `/` route to the first cluster.
fn snapshot(clusters: &[ClusterSpec]) -> Snapshot {
    let mut routes = vec![route(PathKind::Exact, "/", &clusters[0].key.service)];
    let mut path = String::from("/api");
    for c in clusters {
        routes.push(route(PathKind::Prefix, &path, &c.key.service));
        path.push_str("/x");
    }
    routes.sort_by(|a, b| a.path.cmp(&b.path));
    Snapshot::new(SnapshotParts {
        virtual_hosts: vec![VirtualHost {
            host: HostMatch::Exact("a.example".into()),
            routes,
        }],
        clusters: clusters
            .iter()
            .map(|c| (c.key.clone(), Arc::new(c.clone())))
            .collect(),
        ..SnapshotParts::default()
    })
}

fn plane() -> Arc<DataPlane> {
    DataPlane::new(ProxySettings::default(), None).unwrap()
}

fn by_key(dp: &DataPlane) -> BTreeMap<String, Arc<Cluster>> {
    dp.clusters()
        .into_iter()
        .map(|c| (c.key.service.clone(), c))
        .collect()
}

#[test]
fn apply_creates_keeps_swaps_and_removes_pools_by_key() {
    let dp = plane();
    let first = snapshot(&[
        cluster("a", &[1, 2], UpstreamProtocol::Http1),
        cluster("b", &[3], UpstreamProtocol::Http1),
    ]);
    assert_eq!(
        dp.apply(first.clone()),
        ApplyOutcome::Applied {
            generation: 1,
            clusters_created: 2,
            clusters_removed: 0,
            endpoint_swaps: 0
        }
    );
    assert_eq!(dp.apply(first), ApplyOutcome::Unchanged, "equal snapshot");
    let before = by_key(&dp);

    // `a` unchanged, `b` gets another endpoint, `c` is new.
    let second = snapshot(&[
        cluster("a", &[1, 2], UpstreamProtocol::Http1),
        cluster("b", &[3, 4], UpstreamProtocol::Http1),
        cluster("c", &[5], UpstreamProtocol::Http1),
    ]);
    assert_eq!(
        dp.apply(second),
        ApplyOutcome::Applied {
            generation: 2,
            clusters_created: 1,
            clusters_removed: 0,
            endpoint_swaps: 1
        }
    );
    let after = by_key(&dp);
    assert!(Arc::ptr_eq(&before["a"], &after["a"]), "a kept as it was");
    assert!(
        Arc::ptr_eq(&before["b"], &after["b"]),
        "b kept, its set swapped"
    );
    assert_eq!(after["b"].endpoints.load().members.len(), 2);

    // `a` changes protocol (a new pool), `b` goes.
    let third = snapshot(&[
        cluster("a", &[1, 2], UpstreamProtocol::H2c),
        cluster("c", &[5], UpstreamProtocol::Http1),
    ]);
    assert_eq!(
        dp.apply(third),
        ApplyOutcome::Applied {
            generation: 3,
            clusters_created: 1,
            clusters_removed: 1,
            endpoint_swaps: 0
        }
    );
    let last = by_key(&dp);
    assert!(!Arc::ptr_eq(&after["a"], &last["a"]), "a rebuilt for h2c");
    assert!(Arc::ptr_eq(&after["c"], &last["c"]));
    assert!(!last.contains_key("b"));
}

#[test]
fn an_endpoint_keeps_its_state_across_swaps() {
    let dp = plane();
    dp.apply(snapshot(&[cluster("a", &[1, 2], UpstreamProtocol::Http1)]));
    let a = &by_key(&dp)["a"];
    let old = Arc::clone(&a.endpoints.load().members[0].endpoint);
    old.fail_and_eject();
    let _busy = old.start();
    dp.apply(snapshot(&[cluster("a", &[1, 3], UpstreamProtocol::Http1)]));
    let set = a.endpoints.load();
    let kept = set
        .members
        .iter()
        .find(|m| m.endpoint.addr == old.addr)
        .unwrap();
    assert!(Arc::ptr_eq(&kept.endpoint, &old), "same endpoint object");
    assert_eq!(kept.endpoint.in_flight(), 1, "in-flight count survived");
    assert_eq!(kept.endpoint.failures(), 1, "failure history survived");
    assert!(set.members.iter().all(|m| m.endpoint.addr != ep(2).addr));
}

#[test]
fn the_endpoints_fast_path_swaps_one_pool_and_a_later_equal_snapshot_still_applies() {
    let dp = plane();
    let s = snapshot(&[cluster("a", &[1], UpstreamProtocol::Http1)]);
    dp.apply(s.clone());
    let routes_before = dp.routes();
    assert!(dp.update_endpoints(&key("a"), &[ep(1), ep(2)], None));
    assert!(
        !dp.update_endpoints(&key("nope"), &[ep(1)], None),
        "unknown pool"
    );
    assert!(
        Arc::ptr_eq(&routes_before, &dp.routes()),
        "routes untouched"
    );
    assert_eq!(by_key(&dp)["a"].endpoints.load().members.len(), 2);
    // The pool now differs from the applied snapshot: re-applying it must restore one endpoint.
    assert!(matches!(
        dp.apply(s),
        ApplyOutcome::Applied {
            endpoint_swaps: 1,
            ..
        }
    ));
    assert_eq!(by_key(&dp)["a"].endpoints.load().members.len(), 1);
}

#[test]
fn a_request_finishes_on_the_table_it_loaded() {
    let dp = plane();
    dp.apply(snapshot(&[cluster("a", &[1], UpstreamProtocol::Http1)]));
    let held = dp.routes();
    dp.apply(snapshot(&[cluster("b", &[2], UpstreamProtocol::Http1)]));
    let target = |t: &crate::state::routes::RouteTable, path: &str| match t
        .lookup(Some("a.example"), path)
        .map(|a| &a.target)
    {
        Some(crate::state::routes::Target::Cluster(c)) => c.key.service.clone(),
        other => format!("{other:?}"),
    };
    assert_eq!(
        target(&held, "/api/v1"),
        "a",
        "the old table still routes to a"
    );
    assert_eq!(target(&dp.routes(), "/api/v1"), "b");
    assert_eq!(held.generation + 1, dp.routes().generation);
}

#[test]
fn the_route_table_matches_exact_prefix_and_nothing_else() {
    let dp = plane();
    dp.apply(snapshot(&[
        cluster("a", &[1], UpstreamProtocol::Http1),
        cluster("b", &[2], UpstreamProtocol::Http1),
    ]));
    let t = dp.routes();
    let service = |host: Option<&str>, path: &str| {
        t.lookup(host, path).map(|a| match &a.target {
            crate::state::routes::Target::Cluster(c) => c.key.service.clone(),
            other => format!("{other:?}"),
        })
    };
    assert_eq!(service(Some("a.example"), "/").as_deref(), Some("a"));
    assert_eq!(service(Some("a.example"), "/api").as_deref(), Some("a"));
    assert_eq!(
        service(Some("a.example"), "/api/x/y").as_deref(),
        Some("b"),
        "longest prefix"
    );
    assert_eq!(
        service(Some("a.example"), "/apix"),
        None,
        "element-wise prefix"
    );
    assert_eq!(service(Some("b.example"), "/api"), None, "other host");
    assert_eq!(service(None, "/api"), None, "no host");
    // Every action holds the data plane's own pool.
    let pools = by_key(&dp);
    match &t.lookup(Some("a.example"), "/api").unwrap().target {
        crate::state::routes::Target::Cluster(c) => assert!(Arc::ptr_eq(c, &pools["a"])),
        other => panic!("{other:?}"),
    }
}

fn pem_for(host: &str) -> Arc<CertificatePem> {
    let ck = rcgen::generate_simple_self_signed(vec![host.to_string()]).unwrap();
    Arc::new(CertificatePem {
        cert_pem: ck.cert.pem().into_bytes(),
        key_pem: ck.signing_key.serialize_pem().into_bytes(),
    })
}

fn tls_snapshot(bindings: &[(&str, &str)], certs: &[(&str, Arc<CertificatePem>)]) -> Snapshot {
    Snapshot::new(SnapshotParts {
        tls: bindings
            .iter()
            .map(|(host, secret)| TlsBinding {
                host: (*host).into(),
                secret: ObjectRef::new("Secret", "ns", *secret),
                source: ObjectRef::new("Ingress", "ns", "ing"),
                also: None,
            })
            .collect(),
        certificates: certs
            .iter()
            .map(|(s, p)| (ObjectRef::new("Secret", "ns", *s), Arc::clone(p)))
            .collect(),
        ..SnapshotParts::default()
    })
}

fn serial(store: &CertStore, sni: Option<&str>) -> String {
    store.lookup(sni).serial.clone()
}

#[test]
fn the_certificate_store_picks_exact_then_wildcard_then_default() {
    let fallback = load_pem(&pem_for("x").cert_pem, &pem_for("x").key_pem);
    assert!(
        fallback.is_err(),
        "a key from another certificate is refused"
    );
    let d = pem_for("default.invalid");
    let default = load_pem(&d.cert_pem, &d.key_pem).unwrap();
    let mut tls = TlsState::new(default.clone());
    let (a, w) = (pem_for("a.example"), pem_for("*.example"));
    let (store, problems) = tls.build(
        &tls_snapshot(
            &[("a.example", "a"), ("*.example", "w")],
            &[("a", Arc::clone(&a)), ("w", Arc::clone(&w))],
        ),
        None,
    );
    assert!(problems.is_empty());
    let a_serial = serial(&store, Some("a.example"));
    let w_serial = serial(&store, Some("b.example"));
    assert_ne!(a_serial, w_serial);
    assert_eq!(
        serial(&store, Some("x.b.example")),
        default.serial,
        "one label only"
    );
    assert_eq!(serial(&store, Some("other.test")), default.serial);
    assert_eq!(serial(&store, None), default.serial, "no SNI");
}

#[test]
fn a_secret_that_turns_invalid_keeps_the_last_good_certificate() {
    let d = pem_for("default.invalid");
    let default = load_pem(&d.cert_pem, &d.key_pem).unwrap();
    let mut tls = TlsState::new(default.clone());
    let good = pem_for("a.example");
    let (store, _) = tls.build(&tls_snapshot(&[("a.example", "a")], &[("a", good)]), None);
    let good_serial = serial(&store, Some("a.example"));

    // The Secret now holds a key that does not match its certificate.
    let other = pem_for("a.example");
    let broken = Arc::new(CertificatePem {
        cert_pem: other.cert_pem.clone(),
        key_pem: pem_for("z").key_pem.clone(),
    });
    let (store, problems) = tls.build(&tls_snapshot(&[("a.example", "a")], &[("a", broken)]), None);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].secret, ObjectRef::new("Secret", "ns", "a"));
    assert_eq!(
        serial(&store, Some("a.example")),
        good_serial,
        "last good kept"
    );

    // The Secret disappears: still the last good one; the host goes when its binding goes.
    let (store, _) = tls.build(&tls_snapshot(&[("a.example", "a")], &[]), None);
    assert_eq!(serial(&store, Some("a.example")), good_serial);
    let (store, _) = tls.build(&tls_snapshot(&[], &[]), None);
    assert_eq!(serial(&store, Some("a.example")), default.serial);
}

/// The ConfigMap's `upstream-keepalive-timeout` reaches every pool with the snapshot, and the
/// flag's value comes back when it goes.
#[test]
fn the_upstream_keepalive_timeout_follows_the_snapshot() {
    let dp = plane();
    let flag = ProxySettings::default().upstream.idle_timeout;
    let with = |t: Option<std::time::Duration>| {
        Snapshot::new(SnapshotParts {
            settings: sluice_config::Settings {
                upstream_keepalive_timeout: t,
                ..sluice_config::Settings::default()
            },
            ..SnapshotParts::default()
        })
    };
    dp.apply(with(Some(std::time::Duration::from_secs(5))));
    assert_eq!(
        dp.settings.upstream.idle_timeout(),
        std::time::Duration::from_secs(5)
    );
    dp.apply(with(None));
    assert_eq!(dp.settings.upstream.idle_timeout(), flag);
}

fn rsa_pem_for(host: &str) -> Arc<CertificatePem> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec![host.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    Arc::new(CertificatePem {
        cert_pem: cert.pem().into_bytes(),
        key_pem: key.serialize_pem().into_bytes(),
    })
}

#[test]
fn a_host_with_rsa_and_ecdsa_serves_ecdsa_to_clients_that_can_verify_it() {
    use rustls::{CipherSuite as C, SignatureScheme as S};
    let d = pem_for("default.invalid");
    let mut tls = TlsState::new(load_pem(&d.cert_pem, &d.key_pem).unwrap());
    let (rsa, ecdsa, ecdsa2) = (
        rsa_pem_for("a.example"),
        pem_for("a.example"),
        pem_for("b.example"),
    );
    let binding = |host: &str, secret: &str, also: &str| TlsBinding {
        host: host.into(),
        secret: ObjectRef::new("Secret", "ns", secret),
        source: ObjectRef::new("Ingress", "ns", "ing"),
        also: Some(ObjectRef::new("Secret", "ns", also)),
    };
    // The ECDSA Secret named first (a.example), or two ECDSA ones (b.example).
    let snap = Snapshot::new(SnapshotParts {
        tls: vec![
            binding("a.example", "ecdsa", "rsa"),
            binding("b.example", "ecdsa2", "ecdsa-too"),
        ],
        certificates: [
            ("rsa", Arc::clone(&rsa)),
            ("ecdsa", Arc::clone(&ecdsa)),
            ("ecdsa2", Arc::clone(&ecdsa2)),
            ("ecdsa-too", pem_for("b.example")),
        ]
        .into_iter()
        .map(|(s, p)| (ObjectRef::new("Secret", "ns", s), p))
        .collect(),
        ..SnapshotParts::default()
    });
    let (store, problems) = tls.build(&snap, None);
    // Two ECDSA certificates for b.example: the first serves, the second is reported.
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].secret.name, "ecdsa-too");
    assert!(store.lookup(Some("b.example")).ecdsa.is_none());

    let a = store.lookup(Some("a.example"));
    assert!(!a.is_ecdsa(), "the entry is the RSA certificate");
    let tls13 = [
        C::TLS13_AES_128_GCM_SHA256,
        C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ];
    let ecdsa_key = &a.ecdsa.as_ref().unwrap().key;
    // A browser: ECDSA and RSA schemes.
    let both = [
        S::ECDSA_NISTP256_SHA256,
        S::RSA_PSS_SHA256,
        S::RSA_PKCS1_SHA256,
    ];
    assert!(Arc::ptr_eq(a.for_client(&both, &tls13), ecdsa_key));
    // A client that verifies RSA only.
    let rsa_only = [S::RSA_PSS_SHA256, S::RSA_PKCS1_SHA256];
    assert!(Arc::ptr_eq(a.for_client(&rsa_only, &tls13), &a.key));
    // ECDSA schemes, but TLS 1.2 with RSA suites only: RSA.
    let rsa_suites = [C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256];
    assert!(Arc::ptr_eq(a.for_client(&both, &rsa_suites), &a.key));
    // An ECDSA scheme of another curve than the key's: RSA.
    assert!(Arc::ptr_eq(
        a.for_client(&[S::ECDSA_NISTP384_SHA384, S::RSA_PSS_SHA256], &tls13),
        &a.key
    ));
    // Both show in the metrics' host list.
    assert_eq!(store.hosts().filter(|(h, _)| h == "a.example").count(), 2);
}
