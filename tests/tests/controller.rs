//! `sluice controller` against the in-repo fake API server, with the real kube client over HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;
use sluice_tests::fake_api::FakeApi;
use sluice_tests::*;

fn apply_all(fake: &FakeApi, yaml: &str) {
    for o in yaml_objects(yaml) {
        fake.apply(o);
    }
}

fn base(fake: &FakeApi, svc: &str, addrs: &[std::net::SocketAddr]) {
    apply_all(
        fake,
        &[ingress_class(), service(svc), endpoint_slices(svc, addrs)].join("---\n"),
    );
}

async fn ready(c: &sluice::cluster::Controlling) -> bool {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_objects_from_before_and_after_start_and_follows_changes() {
    let (a, b) = (backend("a").await, backend("b").await);
    let fake = FakeApi::start().await;
    base(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        &ingress("one", "one.test", &[("/", "Prefix", "web")]),
    );
    let c = controller(&fake, "solo", &[]).await;
    assert!(ready(&c).await);
    let http = c.running.http_addr.unwrap();
    assert_eq!(
        backend_of(http, "one.test").await.as_deref(),
        Some("a"),
        "object created before start"
    );

    apply_all(
        &fake,
        &ingress("two", "two.test", &[("/", "Prefix", "web")]),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend_of(http, "two.test").await.as_deref() == Some("a")
        })
        .await,
        "object created after start"
    );

    fake.delete("Ingress", "default", "one");
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend_of(http, "one.test").await.as_deref() == Some("404 Not Found")
        })
        .await,
        "deleted Ingress loses its routes"
    );

    let gen_before = c.running.dp.generation();
    apply_all(&fake, &endpoint_slices("web", &[b.addr]));
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
    apply_all(
        &fake,
        &[
            tls_secret("cert", &crt1, &key1),
            tls_ingress("t", "tls.test", "cert", "web", &[]),
        ]
        .join("---\n"),
    );
    let https = c.running.https_addr.unwrap();
    let serial_of = || async move { tls_serial(https, "tls.test").await.unwrap_or_default() };
    assert!(
        eventually(Duration::from_secs(5), || async {
            serial_of().await == pem_serial(&crt1)
        })
        .await
    );
    apply_all(&fake, &tls_secret("cert", &crt2, &key2));
    assert!(
        eventually(Duration::from_secs(5), || async {
            serial_of().await == pem_serial(&crt2)
        })
        .await,
        "secret update rotates the certificate"
    );
    c.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_only_for_ours_exactly_once_without_rebuild_loops() {
    let a = backend("a").await;
    let fake = FakeApi::start().await;
    base(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: other\nspec:\n  controller: example.com/other\n",
    );
    apply_all(
        &fake,
        &ingress("ours", "ours.test", &[("/", "Prefix", "web")]),
    );
    let foreign = ingress("foreign", "foreign.test", &[("/", "Prefix", "web")])
        .replace("ingressClassName: sluice", "ingressClassName: other");
    apply_all(&fake, &foreign);
    let c = controller(&fake, "solo", &[]).await;
    assert!(ready(&c).await);
    assert!(
        eventually(Duration::from_secs(5), || async {
            fake.get("Ingress", "default", "ours").unwrap()["status"]["loadBalancer"]["ingress"]
                == json!([{"ip": "10.1.2.3"}])
        })
        .await
    );
    let generation = c.running.dp.generation();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let patches = |name: &str| {
        fake.requests()
            .iter()
            .filter(|r| {
                r.method == "PATCH" && r.path.ends_with(&format!("/ingresses/{name}/status"))
            })
            .count()
    };
    assert_eq!(patches("ours"), 1, "exactly one status write");
    assert_eq!(patches("foreign"), 0);
    assert!(
        fake.get("Ingress", "default", "foreign").unwrap()["status"]["loadBalancer"]["ingress"]
            .is_null()
    );
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

    // An Ingress that stops being ours gets its status cleared.
    apply_all(
        &fake,
        &ingress("ours", "ours.test", &[("/", "Prefix", "web")])
            .replace("ingressClassName: sluice", "ingressClassName: other"),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            fake.get("Ingress", "default", "ours").unwrap()["status"]["loadBalancer"]["ingress"]
                .is_null()
        })
        .await
    );
    c.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_outage_relists_after_410_and_keeps_serving_meanwhile() {
    let (a, b) = (backend("a").await, backend("b").await);
    let fake = FakeApi::start().await;
    base(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        &ingress("one", "one.test", &[("/", "Prefix", "web")]),
    );
    let c = controller(&fake, "solo", &[]).await;
    assert!(ready(&c).await);
    let http = c.running.http_addr.unwrap();
    assert_eq!(backend_of(http, "one.test").await.as_deref(), Some("a"));

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_the_first_snapshot_and_no_404_for_existing_routes() {
    let a = backend("a").await;
    let fake = FakeApi::start().await;
    base(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        &ingress("one", "one.test", &[("/", "Prefix", "web")]),
    );
    fake.fail_all(true);
    let c = controller(&fake, "solo", &[]).await;
    let (admin, http) = (c.running.admin_addr, c.running.http_addr.unwrap());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        get(&client(), admin, "x", "/readyz").await.unwrap().status,
        503,
        "API server unreachable: not ready"
    );
    fake.fail_all(false);
    // Poll readiness like a kubelet; once ready, the route must be there.
    let mut ready_seen = false;
    for _ in 0..300 {
        if get(&client(), admin, "x", "/readyz").await.unwrap().status == 200 {
            ready_seen = true;
            assert_eq!(
                backend_of(http, "one.test").await.as_deref(),
                Some("a"),
                "no 404 once ready"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready_seen);
    c.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_writes_and_the_other_takes_over() {
    let a = backend("a").await;
    let fake = FakeApi::start().await;
    base(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        &ingress("ours", "ours.test", &[("/", "Prefix", "web")]),
    );
    let c1 = controller(&fake, "one", &[]).await;
    let c2 = controller(&fake, "two", &[]).await;
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
            fake.get("Ingress", "default", "ours").unwrap()["status"]["loadBalancer"]["ingress"]
                == json!([{"ip": "10.1.2.3"}])
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!(*c1.leader.borrow() && *c2.leader.borrow()));
    let writes = fake
        .requests()
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
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "within the lease duration plus a retry: {:?}",
        started.elapsed()
    );
    follower.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problems_become_events_naming_the_object() {
    let a = backend("a").await;
    let fake = FakeApi::start().await;
    base(&fake, "web", &[a.addr]);
    apply_all(
        &fake,
        &ingress("broken", "broken.test", &[("/", "Prefix", "missing-svc")]),
    );
    let c = controller(&fake, "solo", &[]).await;
    assert!(ready(&c).await);
    assert!(
        eventually(Duration::from_secs(5), || async {
            fake.list("Event").iter().any(|e| {
                e["reason"] == "ServiceNotFound"
                    && e["involvedObject"]["name"] == "broken"
                    && e["involvedObject"]["kind"] == "Ingress"
            })
        })
        .await,
        "events: {:?}",
        fake.list("Event")
    );
    assert_eq!(
        backend_of(c.running.http_addr.unwrap(), "broken.test")
            .await
            .as_deref(),
        Some("503 Service Unavailable")
    );
    c.shutdown(Duration::from_secs(3)).await;
}
