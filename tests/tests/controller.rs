//! `sluice controller` against two API servers with the real kube client: the in-repo fake
//! (`tests/src/fake_api/`), and a real kube-apiserver built from Go modules
//! (`tests/kube-apiserver/`), the controller running as the ServiceAccount and RBAC of
//! `manifests/base`. Each test body runs against both (`*_fake`, `*_real`); what only the fake can
//! do (outages, compaction) is fake-only. The real variants run in a network namespace of their
//! own (see `sluice_tests::real_api::in_private_network`) and are ignored, with the reason, where
//! the machine cannot make one or the server is not built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;
use sluice_tests::apis::{TestApi, assert_no_denials};
use sluice_tests::fake_api::FakeApi;
use sluice_tests::*;
use sluice_tests::{on_both, real_only};

/// Polls `/readyz` like a kubelet (up to `polls` times, 50 ms apart); once it is 200, `host`
/// must already be routed to `backend` (no 404 after ready). Returns whether it got ready.
async fn ready_with_routes(
    c: &sluice::kube::Controlling,
    host: &str,
    backend: &str,
    polls: usize,
) -> bool {
    let (admin, http) = (c.running.admin_addr, c.running.http_addr.unwrap());
    for _ in 0..polls {
        if get(&client(), admin, "x", "/readyz").await.unwrap().status == 200 {
            assert_eq!(
                backend_of(http, host).await.as_deref(),
                Some(backend),
                "no 404 once ready"
            );
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn base(api: &TestApi, svc: &str, addrs: &[std::net::SocketAddr]) {
    api.apply_yaml(&[ingress_class(), service(svc), endpoint_slices(svc, addrs)].join("---\n"))
        .await;
}

async fn ready(c: &sluice::kube::Controlling) -> bool {
    let admin = c.running.admin_addr;
    eventually(Duration::from_secs(10), || async move {
        get(&client(), admin, "x", "/readyz")
            .await
            .map(|r| r.status == 200)
            .unwrap_or(false)
    })
    .await
}

async fn backend_of(addr: std::net::SocketAddr, host: &str) -> Option<String> {
    get(&client(), addr, host, "/").await.ok().and_then(|r| {
        if r.status == 200 {
            r.backend().map(str::to_string)
        } else {
            Some(r.status.to_string())
        }
    })
}

async fn lb_ingress(api: &TestApi, name: &str) -> serde_json::Value {
    api.get("Ingress", "default", name)
        .await
        .map(|o| o["status"]["loadBalancer"]["ingress"].clone())
        .unwrap_or_default()
}

on_both!(follows_objects, follows_objects_fake, follows_objects_real);

/// Objects from before and after start, deletes, EndpointSlice moves, Secret rotation.
async fn follows_objects(api: &TestApi) {
    let a = backend_at("a", api.backend_addr()).await;
    let b = backend_at("b", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(&ingress("one", "one.test", &[("/", "Prefix", "web")]))
        .await;
    let c = api.controller("solo", &[]).await;
    assert!(ready(&c).await);
    let http = c.running.http_addr.unwrap();
    assert_eq!(
        backend_of(http, "one.test").await.as_deref(),
        Some("a"),
        "object created before start"
    );

    api.apply_yaml(&ingress("two", "two.test", &[("/", "Prefix", "web")]))
        .await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend_of(http, "two.test").await.as_deref() == Some("a")
        })
        .await,
        "object created after start"
    );

    api.delete("Ingress", "default", "one").await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend_of(http, "one.test").await.as_deref() == Some("404 Not Found")
        })
        .await,
        "deleted Ingress loses its routes"
    );

    let gen_before = c.running.dp.generation();
    api.apply_yaml(&endpoint_slices("web", &[b.addr])).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend_of(http, "two.test").await.as_deref() == Some("b")
        })
        .await,
        "EndpointSlice update moves traffic"
    );
    assert_eq!(
        c.running.dp.generation(),
        gen_before,
        "endpoint change took the fast path (no full rebuild)"
    );
    assert!(c.running.dp.metrics.propagation_delay.count() > 0);

    // A Secret update rotates the certificate.
    let (crt1, key1) = self_signed(&["tls.test"]);
    let (crt2, key2) = self_signed(&["tls.test"]);
    api.apply_yaml(
        &[
            tls_secret("cert", &crt1, &key1),
            tls_ingress("t", "tls.test", "cert", "web", &[]),
        ]
        .join("---\n"),
    )
    .await;
    let https = c.running.https_addr.unwrap();
    let serial_of = || async move { tls_serial(https, "tls.test").await.unwrap_or_default() };
    assert!(
        eventually(Duration::from_secs(5), || async {
            serial_of().await == pem_serial(&crt1)
        })
        .await
    );
    api.apply_yaml(&tls_secret("cert", &crt2, &key2)).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            serial_of().await == pem_serial(&crt2)
        })
        .await,
        "secret update rotates the certificate"
    );
    c.shutdown(Duration::from_secs(3)).await;
}

on_both!(status_once, status_once_fake, status_once_real);

/// Status only for our Ingresses, written exactly once, and no rebuild loop from our own writes.
async fn status_once(api: &TestApi) {
    let a = backend_at("a", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: other\nspec:\n  controller: example.com/other\n",
    )
    .await;
    api.apply_yaml(&ingress("ours", "ours.test", &[("/", "Prefix", "web")]))
        .await;
    let foreign = ingress("foreign", "foreign.test", &[("/", "Prefix", "web")])
        .replace("ingressClassName: sluice", "ingressClassName: other");
    api.apply_yaml(&foreign).await;
    // Ours by class, but dropped whole by translation (its canary rules cannot be read): the
    // status writer reads translation's verdict, so it gets no address either.
    let dropped = |weight: &str| {
        annotated_ingress(
            "dropped",
            "ours.test",
            &[("/", "Prefix", "web")],
            &[
                ("nginx.ingress.kubernetes.io/canary", "true"),
                ("nginx.ingress.kubernetes.io/canary-weight", weight),
            ],
        )
    };
    api.apply_yaml(&dropped("ten")).await;
    let c = api.controller("solo", &[]).await;
    assert!(ready(&c).await);
    assert!(
        eventually(Duration::from_secs(5), || async {
            lb_ingress(api, "ours").await == json!([{"ip": "10.1.2.3"}])
        })
        .await
    );
    let generation = c.running.dp.generation();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let patches = |name: &str| {
        api.controller_requests()
            .iter()
            .filter(|r| {
                r.method == "PATCH" && r.path.ends_with(&format!("/ingresses/{name}/status"))
            })
            .count()
    };
    let reqs = api.controller_requests();
    println!(
        "{} controller requests; status writes: {:?}",
        reqs.len(),
        reqs.iter()
            .filter(|r| r.method == "PATCH")
            .map(|r| &r.path)
            .collect::<Vec<_>>()
    );
    assert_eq!(patches("ours"), 1, "exactly one status write");
    assert_eq!(patches("foreign"), 0);
    assert!(lb_ingress(api, "foreign").await.is_null());
    assert_eq!(patches("dropped"), 0, "translation dropped it: no status");
    assert!(lb_ingress(api, "dropped").await.is_null());
    assert_eq!(
        backend_of(c.running.http_addr.unwrap(), "foreign.test")
            .await
            .as_deref(),
        Some("404 Not Found"),
        "foreign Ingress not routed"
    );
    assert_eq!(
        c.running.dp.generation(),
        generation,
        "the status write did not trigger a rebuild"
    );

    // Once its canary rules read, translation admits it and it gets its address.
    api.apply_yaml(&dropped("10")).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            lb_ingress(api, "dropped").await == json!([{"ip": "10.1.2.3"}])
        })
        .await
    );

    // An Ingress that stops being ours gets its status cleared.
    api.apply_yaml(
        &ingress("ours", "ours.test", &[("/", "Prefix", "web")])
            .replace("ingressClassName: sluice", "ingressClassName: other"),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            lb_ingress(api, "ours").await.is_null()
        })
        .await
    );
    c.shutdown(Duration::from_secs(3)).await;
}

/// Backends `a` and `b`, the fake API server, and a ready controller routing `one.test` to `a`
/// (with its HTTP address), for the outage tests.
async fn one_route_on_the_fake() -> (
    sluice_bench::backend::Backend,
    sluice_bench::backend::Backend,
    FakeApi,
    sluice::kube::Controlling,
    std::net::SocketAddr,
) {
    let (a, b) = (backend("a").await, backend("b").await);
    let fake = FakeApi::start().await;
    base_fake(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        &ingress("one", "one.test", &[("/", "Prefix", "web")]),
    );
    let c = controller(&fake, "solo", &[]).await;
    assert!(ready(&c).await);
    let http = c.running.http_addr.unwrap();
    assert_eq!(backend_of(http, "one.test").await.as_deref(), Some("a"));
    (a, b, fake, c, http)
}

/// Fake only: the API server unreachable for 8 s (every request fails, every watch closed),
/// the last good snapshot serving meanwhile; once it answers again, a change reaches traffic
/// within 5 s (the watches' retry backoff is capped: with kube-runtime's default, 800 ms
/// doubling to 30 s, an 8 s outage left the next attempt up to 13 s away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_api_server_outage_a_change_reaches_traffic_within_5_s() {
    let (_a, b, fake, c, http) = one_route_on_the_fake().await;

    fake.fail_all(true);
    fake.close_watches();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            backend_of(http, "one.test").await.as_deref(),
            Some("a"),
            "the last good snapshot serves through the outage"
        );
    }
    fake.fail_all(false);
    let back = std::time::Instant::now();
    apply_all(&fake, &endpoint_slices("web", &[b.addr]));
    assert!(
        eventually(Duration::from_secs(15), || async {
            backend_of(http, "one.test").await.as_deref() == Some("b")
        })
        .await,
        "the change never reached traffic"
    );
    let took = back.elapsed();
    println!("after an 8 s outage, a change reached traffic in {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    c.shutdown(Duration::from_secs(3)).await;
}

/// Fake only: an outage with compaction needs the fake's fault hooks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_outage_relists_after_410_and_keeps_serving_meanwhile() {
    let (_a, b, fake, c, http) = one_route_on_the_fake().await;

    fake.fail_watches(true);
    fake.close_watches();
    apply_all(&fake, &endpoint_slices("web", &[b.addr]));
    apply_all(
        &fake,
        &ingress("two", "two.test", &[("/", "Prefix", "web")]),
    );
    fake.compact();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        backend_of(http, "one.test").await.as_deref(),
        Some("a"),
        "the old configuration keeps serving during the outage"
    );
    let lists_before = fake
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && !r.query.contains("watch=true"))
        .count();
    fake.fail_watches(false);
    assert!(
        eventually(Duration::from_secs(45), || async {
            backend_of(http, "two.test").await.as_deref() == Some("b")
        })
        .await,
        "routing converged after the re-list"
    );
    let reqs = fake.requests();
    assert!(
        reqs.iter()
            .filter(|r| r.method == "GET" && !r.query.contains("watch=true"))
            .count()
            > lists_before,
        "the watcher re-listed"
    );
    c.shutdown(Duration::from_secs(3)).await;
}

/// Fake only: it fails every request until the test lets it answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_the_first_snapshot_and_no_404_for_existing_routes() {
    let a = backend("a").await;
    let fake = FakeApi::start().await;
    base_fake(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        &ingress("one", "one.test", &[("/", "Prefix", "web")]),
    );
    fake.fail_all(true);
    let c = controller(&fake, "solo", &[]).await;
    let admin = c.running.admin_addr;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        get(&client(), admin, "x", "/readyz").await.unwrap().status,
        503,
        "API server unreachable: not ready"
    );
    fake.fail_all(false);
    assert!(ready_with_routes(&c, "one.test", "a", 300).await);
    c.shutdown(Duration::from_secs(3)).await;
}

on_both!(handover, handover_fake, handover_real);

/// `--handover` between two controller generations: the new one serves on the same socket,
/// the lease moves at once and never to two holders (the old one's status writers stop before
/// it releases), status writing moves with it, and requests through the socket never fail.
async fn handover(api: &TestApi) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let a = backend_at("a", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(&ingress("ours", "ours.test", &[("/", "Prefix", "web")]))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("handover.sock");
    let flags = ["--handover", path.to_str().unwrap()];
    let mut one = api.controller("one", &flags).await;
    assert!(ready(&one).await);
    let mut offer = one.settle_handover().await.expect("offers its sockets");
    assert!(
        eventually(Duration::from_secs(5), || async { *one.leader.borrow() }).await,
        "the only replica leads"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            lb_ingress(api, "ours").await == json!([{"ip": "10.1.2.3"}])
        })
        .await
    );
    let http = one.running.http_addr.unwrap();

    // Requests all through the handover.
    let (ok, failed, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let load = {
        let (ok, failed, stop) = (Arc::clone(&ok), Arc::clone(&failed), Arc::clone(&stop));
        tokio::spawn(async move {
            let c = client();
            while !stop.load(Ordering::Relaxed) {
                match get(&c, http, "ours.test", "/").await {
                    Ok(r) if r.backend() == Some("a") => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        eprintln!("{other:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    // When each one's leadership flips.
    let flipped = |mut rx: tokio::sync::watch::Receiver<bool>, to: bool| {
        tokio::spawn(async move {
            let _ = rx.wait_for(|l| *l == to).await;
            std::time::Instant::now()
        })
    };
    let one_stepped_down = flipped(one.leader.clone(), false);

    let mut two = api.controller("two", &flags).await;
    assert_eq!(
        two.running.http_addr,
        Some(http),
        "the same socket, handed over"
    );
    let two_leads = flipped(two.leader.clone(), true);
    let old = tokio::spawn(async move {
        let ack = offer.requested().await;
        one.running.hand_over(ack);
        one.shutdown(Duration::from_secs(3)).await
    });
    let _next_offer = two.settle_handover().await.expect("offers in turn");
    assert!(old.await.unwrap(), "the old generation drained in time");
    let (down, up) = (
        one_stepped_down.await.unwrap(),
        tokio::time::timeout(Duration::from_secs(5), two_leads)
            .await
            .expect("the new generation leads")
            .unwrap(),
    );
    assert!(down <= up, "never two leaders");
    let gap = up.duration_since(down);
    println!("leadership moved in {gap:?}");
    assert!(gap < Duration::from_secs(1), "no gap: {gap:?}");

    // Status writing moved too.
    api.apply_yaml(&ingress("late", "late.test", &[("/", "Prefix", "web")]))
        .await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            lb_ingress(api, "late").await == json!([{"ip": "10.1.2.3"}])
        })
        .await,
        "the new leader writes status"
    );
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("{ok} requests answered, {failed} failed through the handover");
    assert_eq!(failed, 0);
    assert!(ok > 20, "load ran: {ok}");
    two.shutdown(Duration::from_secs(3)).await;
}

on_both!(leader_election, leader_election_fake, leader_election_real);

/// One leader writes status; when it dies the other takes over within the lease.
async fn leader_election(api: &TestApi) {
    let a = backend_at("a", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(&ingress("ours", "ours.test", &[("/", "Prefix", "web")]))
        .await;
    let c1 = api.controller("one", &[]).await;
    let c2 = api.controller("two", &[]).await;
    assert!(ready(&c1).await && ready(&c2).await, "every replica serves");
    assert!(
        eventually(Duration::from_secs(5), || async {
            *c1.leader.borrow() ^ *c2.leader.borrow()
        })
        .await,
        "exactly one leader"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            lb_ingress(api, "ours").await == json!([{"ip": "10.1.2.3"}])
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!(*c1.leader.borrow() && *c2.leader.borrow()));
    let writes = api
        .controller_requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .count();
    assert_eq!(writes, 1, "only the leader wrote, once");
    let (leader, follower) = if *c1.leader.borrow() {
        (c1, c2)
    } else {
        (c2, c1)
    };
    leader.kill();
    let started = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(6), || async {
            *follower.leader.borrow()
        })
        .await,
        "the other instance takes over"
    );
    let led = started.elapsed();
    assert!(
        led < Duration::from_secs(4),
        "within the lease duration plus a retry: {led:?}"
    );
    // The new leader writes status (and it is the only replica left that can).
    api.apply_yaml(&ingress("later", "later.test", &[("/", "Prefix", "web")]))
        .await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            lb_ingress(api, "later").await == json!([{"ip": "10.1.2.3"}])
        })
        .await,
        "the new leader writes status"
    );
    println!(
        "leader killed: the other led {led:?} after, and wrote a new Ingress's status {:?} after",
        started.elapsed()
    );
    follower.shutdown(Duration::from_secs(3)).await;
}

on_both!(problem_events, problem_events_fake, problem_events_real);
on_both!(event_flood, event_flood_fake, event_flood_real);
on_both!(host_ownership, host_ownership_fake, host_ownership_real);

/// `--host-ownership namespace`: a newer Ingress in another namespace cannot add a path to a
/// host, gets an Event saying whose host it is, and no status.
async fn host_ownership(api: &TestApi) {
    let (a, b) = (
        backend_at("a", api.backend_addr()).await,
        backend_at("b", api.backend_addr()).await,
    );
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-b\n")
        .await;
    base(api, "web", &[a.addr]).await;
    let other_ns = |yaml: String| yaml.replace("namespace: default", "namespace: team-b");
    api.apply_yaml(&other_ns(
        [service("web"), endpoint_slices("web", &[b.addr])].join("---\n"),
    ))
    .await;
    api.apply_yaml(&ingress("shop", "shop.test", &[("/", "Prefix", "web")]))
        .await;
    // Created after the first (the real server stamps creation times a second apart at best).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.apply_yaml(&other_ns(ingress(
        "grab",
        "shop.test",
        &[("/admin", "Prefix", "web")],
    )))
    .await;
    let c = api
        .controller("solo", &["--host-ownership", "namespace"])
        .await;
    assert!(ready(&c).await);
    let http = c.running.http_addr.unwrap();
    let admin_backend = || async {
        get(&client(), http, "shop.test", "/admin")
            .await
            .ok()
            .and_then(|r| r.backend().map(str::to_string))
    };
    assert_eq!(
        admin_backend().await.as_deref(),
        Some("a"),
        "still team default's /"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            api.list("Event").await.iter().any(|e| {
                e["reason"] == "HostOwnedByAnotherNamespace"
                    && e["involvedObject"]["name"] == "grab"
            })
        })
        .await
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            lb_ingress(api, "shop").await == json!([{"ip": "10.1.2.3"}])
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grab = api.get("Ingress", "team-b", "grab").await.unwrap();
    assert!(
        grab["status"]["loadBalancer"]["ingress"].is_null(),
        "no status for an Ingress that owns nothing: {grab}"
    );
    c.shutdown(Duration::from_secs(3)).await;
}

/// An Ingress with 40 broken paths gets a burst of Events and one summary, not 40 Events.
async fn event_flood(api: &TestApi) {
    let a = backend_at("a", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    let paths: Vec<(String, &str, String)> = (0..40)
        .map(|i| (format!("/p{i}"), "Prefix", format!("missing-{i}")))
        .collect();
    let paths: Vec<(&str, &str, &str)> = paths
        .iter()
        .map(|(p, t, s)| (p.as_str(), *t, s.as_str()))
        .collect();
    api.apply_yaml(&ingress("flood", "flood.test", &paths))
        .await;
    let c = api.controller("solo", &[]).await;
    assert!(ready(&c).await);
    let about_flood = || async {
        api.list("Event")
            .await
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == "flood")
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            about_flood()
                .await
                .iter()
                .any(|e| e["reason"] == "ProblemsNotReported")
        })
        .await,
        "a summary Event"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = about_flood().await;
    let not_found = events
        .iter()
        .filter(|e| e["reason"] == "ServiceNotFound")
        .count();
    assert_eq!(not_found, 10, "{events:#?}");
    let summary = events
        .iter()
        .find(|e| e["reason"] == "ProblemsNotReported")
        .unwrap();
    assert!(
        summary["message"].as_str().unwrap().starts_with("30 more"),
        "{summary}"
    );
    c.shutdown(Duration::from_secs(3)).await;
}

/// Translation problems become Warning Events naming the Ingress.
async fn problem_events(api: &TestApi) {
    let a = backend_at("a", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(&ingress(
        "broken",
        "broken.test",
        &[("/", "Prefix", "missing-svc")],
    ))
    .await;
    let c = api.controller("solo", &[]).await;
    assert!(ready(&c).await);
    assert!(
        eventually(Duration::from_secs(5), || async {
            api.list("Event").await.iter().any(|e| {
                e["reason"] == "ServiceNotFound"
                    && e["involvedObject"]["name"] == "broken"
                    && e["involvedObject"]["kind"] == "Ingress"
            })
        })
        .await,
        "events: {:?}",
        api.list("Event").await
    );
    assert_eq!(
        backend_of(c.running.http_addr.unwrap(), "broken.test")
            .await
            .as_deref(),
        Some("503 Service Unavailable")
    );
    c.shutdown(Duration::from_secs(3)).await;
}

fn base_fake(fake: &sluice_tests::fake_api::FakeApi, svc: &str, addrs: &[std::net::SocketAddr]) {
    apply_all(
        fake,
        &[ingress_class(), service(svc), endpoint_slices(svc, addrs)].join("---\n"),
    );
}

fn apply_all(fake: &sluice_tests::fake_api::FakeApi, yaml: &str) {
    for o in yaml_objects(yaml) {
        fake.apply(o);
    }
}

/// Real only: the shipped ClusterRole minus EndpointSlices. The controller must say what it was
/// refused, stay not ready (it cannot know the backends), and serve nothing wrong meanwhile.
async fn missing_permission(api: &TestApi) {
    let real = api.real_only().unwrap();
    let rbac = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/base/rbac.yaml"
    ))
    .unwrap();
    let mut role = yaml_objects(&rbac)
        .into_iter()
        .find(|o| o["kind"] == "ClusterRole")
        .unwrap();
    let rules = role["rules"].as_array_mut().unwrap();
    rules.retain(|r| !r["resources"].to_string().contains("endpointslices"));
    // Server-side apply would keep the rule another manager owns: replace the role.
    real.delete("ClusterRole", "", "sluice").await;
    real.apply(role).await;
    let a = backend_at("a", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(&ingress("one", "one.test", &[("/", "Prefix", "web")]))
        .await;
    let c = api.controller("solo", &[]).await;
    let admin = c.running.admin_addr;
    assert!(
        eventually(Duration::from_secs(10), || async {
            real.requests().iter().any(|r| {
                r.user == sluice_tests::apis::controller_user()
                    && r.code == 403
                    && r.request.path.contains("endpointslices")
            })
        })
        .await,
        "the controller asked for EndpointSlices and was refused"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        get(&client(), admin, "x", "/readyz").await.unwrap().status,
        503,
        "not ready without EndpointSlices"
    );
    c.shutdown(Duration::from_secs(3)).await;
}

real_only!(
    missing_permission,
    a_missing_permission_keeps_readiness_false_real
);

/// Real only: the API server hangs (SIGSTOP) from before the controller starts. The controller
/// is not ready while it cannot list, and once ready it routes what exists (no 404).
async fn hang_before_start(api: &TestApi) {
    let real = api.real_only().unwrap();
    let a = backend_at("a", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(&ingress("one", "one.test", &[("/", "Prefix", "web")]))
        .await;
    // The token comes from the server, so before it hangs.
    let kube = api.controller_client().await;
    real.pause();
    let c = api.start_controller(kube, "solo", &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        get(&client(), c.running.admin_addr, "x", "/readyz")
            .await
            .unwrap()
            .status,
        503,
        "API server hanging: not ready"
    );
    real.resume();
    assert!(ready_with_routes(&c, "one.test", "a", 400).await);
    c.shutdown(Duration::from_secs(3)).await;
    assert_no_denials(api);
}

real_only!(
    hang_before_start,
    not_ready_while_the_api_server_hangs_and_no_404_once_ready_real
);

/// Backends `a` and `b` and a ready controller routing `one.test` to `a` (with its HTTP
/// address), for the fault tests.
async fn one_route(
    api: &TestApi,
) -> (
    sluice_bench::backend::Backend,
    sluice_bench::backend::Backend,
    sluice::kube::Controlling,
    std::net::SocketAddr,
) {
    let a = backend_at("a", api.backend_addr()).await;
    let b = backend_at("b", api.backend_addr()).await;
    base(api, "web", &[a.addr]).await;
    api.apply_yaml(&ingress("one", "one.test", &[("/", "Prefix", "web")]))
        .await;
    let c = api.controller("solo", &[]).await;
    assert!(ready(&c).await);
    let http = c.running.http_addr.unwrap();
    assert_eq!(backend_of(http, "one.test").await.as_deref(), Some("a"));
    (a, b, c, http)
}

/// Real only: the API server hangs for a while under a running controller. The data plane keeps
/// serving what it has; when the server answers again, the controller follows new changes.
async fn hang_while_running(api: &TestApi) {
    let real = api.real_only().unwrap();
    let (_a, b, c, http) = one_route(api).await;
    real.pause();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..20 {
        assert_eq!(
            backend_of(http, "one.test").await.as_deref(),
            Some("a"),
            "serving from what it has while the API server hangs"
        );
    }
    real.resume();
    api.apply_yaml(&endpoint_slices("web", &[b.addr])).await;
    api.apply_yaml(&ingress("two", "two.test", &[("/", "Prefix", "web")]))
        .await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            backend_of(http, "two.test").await.as_deref() == Some("b")
        })
        .await,
        "follows changes once the API server answers again"
    );
    c.shutdown(Duration::from_secs(3)).await;
    assert_no_denials(api);
}

real_only!(
    hang_while_running,
    serves_through_an_api_server_hang_and_follows_changes_after_real
);

real_only!(
    api_server_restart,
    a_killed_api_server_comes_back_and_a_change_reaches_traffic_within_5_s_real
);

/// Requests to one host every 20 ms until stopped, counted: answered by backend `a` or `b`, or
/// not (any other status, an error).
struct Traffic {
    ok: std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(http: std::net::SocketAddr, host: &'static str) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let (ok, failed, stop) = (
            std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)),
            std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)),
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        );
        let (o, f, s) = (ok.clone(), failed.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(Relaxed) {
                match backend_of(http, host).await.as_deref() {
                    Some("a" | "b") => o.fetch_add(1, Relaxed),
                    _ => f.fetch_add(1, Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Self {
            ok,
            failed,
            stop,
            task,
        }
    }

    /// Stops; `(ok, failed)`.
    async fn stop(self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.stop.store(true, Relaxed);
        self.task.await.unwrap();
        (self.ok.load(Relaxed), self.failed.load(Relaxed))
    }
}

/// `sluice_config_applies_total{result}` from the admin listener.
async fn applies(admin: std::net::SocketAddr, result: &str) -> u64 {
    let text = get(&client(), admin, "localhost", "/metrics")
        .await
        .unwrap()
        .text();
    let key = format!("sluice_config_applies_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Real only: the API server killed (SIGKILL, watches cut mid-stream) and started again on the
/// same etcd after 8 s. Requests never fail (the last good snapshot serves), the watches
/// resume, a change made after the restart reaches traffic within 5 s, and the re-lists of
/// unchanged objects apply no new snapshot (no rebuild storm).
async fn api_server_restart(api: &TestApi) {
    let real = api.real_only().unwrap();
    let (_a, b, c, http) = one_route(api).await;
    let admin = c.running.admin_addr;

    let traffic = Traffic::start(http, "one.test");
    let applied_before = applies(admin, "applied").await;
    let killed = std::time::Instant::now();
    real.restart(Duration::from_secs(8)).await;
    let down = killed.elapsed();
    let back = std::time::Instant::now();
    api.apply_yaml(&endpoint_slices("web", &[b.addr])).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            backend_of(http, "one.test").await.as_deref() == Some("b")
        })
        .await,
        "the change never reached traffic"
    );
    let took = back.elapsed();
    // Let every watch resume and re-list.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (applied, skipped) = (
        applies(admin, "applied").await - applied_before,
        applies(admin, "skipped").await,
    );
    let (ok, failed) = traffic.stop().await;
    println!(
        "API server down {down:?} (killed, restarted on the same etcd); a change reached traffic \
         {took:?} after it was back; snapshots applied since the kill: {applied} (skipped in all: \
         {skipped}); requests ok {ok}, failed {failed}"
    );
    assert_eq!(failed, 0, "no request failed");
    assert!(ok > 100, "traffic ran throughout: {ok}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        applied <= 1,
        "re-lists of unchanged objects applied {applied} snapshots"
    );
    c.shutdown(Duration::from_secs(3)).await;
}

real_only!(
    rbac_revoked,
    revoked_permissions_are_shown_serving_goes_on_and_it_recovers_when_restored_real
);

/// Real only: the controller's ClusterRoleBinding deleted mid-run (and the API server restarted,
/// so that the open watches end and must list again, which is refused). The failing watches are
/// named in `/api/v1/status` with the API server's reason, requests keep being served from the
/// last good configuration, and once the binding is back a change reaches traffic again and the
/// problem goes away.
async fn rbac_revoked(api: &TestApi) {
    let real = api.real_only().unwrap();
    let (_a, b, c, http) = one_route(api).await;
    let admin = c.running.admin_addr;
    let traffic = Traffic::start(http, "one.test");
    let problems = || async move {
        let r = get(&client(), admin, "localhost", "/api/v1/status")
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        v["problems"].to_string()
    };

    let binding = real.get("ClusterRoleBinding", "", "sluice").await.unwrap();
    assert!(real.delete("ClusterRoleBinding", "", "sluice").await);
    real.restart(Duration::from_secs(1)).await;
    let revoked = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(15), || async {
            let p = problems().await;
            p.contains("failing") && p.contains("forbidden")
        })
        .await,
        "the refused watches are named: {}",
        problems().await
    );
    let shown_after = revoked.elapsed();
    println!("while revoked, /api/v1/status said: {}", problems().await);
    assert_eq!(backend_of(http, "one.test").await.as_deref(), Some("a"));

    real.apply(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "sluice", "labels": binding["metadata"]["labels"]},
        "roleRef": binding["roleRef"],
        "subjects": binding["subjects"],
    }))
    .await;
    let restored = std::time::Instant::now();
    api.apply_yaml(&endpoint_slices("web", &[b.addr])).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            backend_of(http, "one.test").await.as_deref() == Some("b")
        })
        .await,
        "a change after the binding came back never reached traffic"
    );
    let took = restored.elapsed();
    let cleared = std::time::Instant::now();
    // A resumed watch delivers nothing until something changes: it counts as recovered after
    // 5 s without an error.
    assert!(
        eventually(Duration::from_secs(12), || async {
            !problems().await.contains("failing")
        })
        .await,
        "the problem goes away once the watches deliver: {}",
        problems().await
    );
    let cleared = took + cleared.elapsed();
    let (ok, failed) = traffic.stop().await;
    println!(
        "RBAC revoked: named in /api/v1/status {shown_after:?} after the API server was back; once \
         restored, a change reached traffic in {took:?} and the problem cleared in {cleared:?}; \
         requests ok {ok}, failed {failed}"
    );
    assert_eq!(failed, 0, "serving went on");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    c.shutdown(Duration::from_secs(3)).await;
}
