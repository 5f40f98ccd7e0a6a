//! Route changes are translated incrementally (unchanged routes keep their compiled rules and
//! attachments, the data plane keeps their compiled backends), and nothing stale survives it:
//! on `sluice serve` with real pods, a route whose Service's endpoints moved by the endpoints
//! fast path still goes to the new pod after another route's change rebuilds the snapshot; a
//! Gateway change re-attaches every route; a route moved from one file to another keeps
//! serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::echo::{self, Echo, field, get};
use sluice_tests::*;

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: sluice\nspec:\n  controllerName: sluice.dev/gateway-controller\n";

fn gateway(port: u16, extra: Option<u16>) -> String {
    let extra = extra.map_or(String::new(), |p| {
        format!("  - name: extra\n    port: {p}\n    protocol: HTTP\n    hostname: extra.test\n")
    });
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n  namespace: default\nspec:\n  gatewayClassName: sluice\n  listeners:\n  - name: http\n    port: {port}\n    protocol: HTTP\n{extra}"
    )
}

fn route(name: &str, host: &str, path: &str, service: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [\"{host}\"]\n  rules:\n  - matches: [{{path: {{type: PathPrefix, value: {path}}}}}]\n    backendRefs: [{{name: {service}, port: 80}}]\n"
    )
}

async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Whether `host` + `path` is answered 200 by the pod `want`.
async fn served_by(gw: SocketAddr, host: &str, path: &str, want: &str) -> bool {
    let (code, body) = get(gw, host, path, "").await;
    code == 200 && field(&body, "name") == Some(want)
}

#[tokio::test]
async fn an_incremental_rebuild_keeps_nothing_stale() {
    let (a, b, c): (Echo, Echo, Echo) = (
        echo::start("a", 200).await,
        echo::start("b", 200).await,
        echo::start("c", 200).await,
    );
    let m = Manifests::new();
    m.write(
        "svc.yaml",
        &format!("{}---\n{}", service("one"), service("two")),
    );
    m.write("slice-one.yaml", &endpoint_slices("one", &[a.addr]));
    m.write("slice-two.yaml", &endpoint_slices("two", &[b.addr]));
    let port = free_port().await;
    let gw: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    m.write("gw.yaml", &format!("{CLASS}---\n{}", gateway(port, None)));
    m.write("r1.yaml", &route("r1", "one.test", "/", "one"));
    m.write("r2.yaml", &route("r2", "two.test", "/", "two"));
    let _s = serve(m.dir.path(), &[]).await;
    let within = Duration::from_secs(10);
    let opens = || async { tokio::net::TcpStream::connect(gw).await.is_ok() };
    assert!(
        eventually(within, opens).await,
        "the Gateway's socket opens"
    );
    assert!(eventually(within, || served_by(gw, "one.test", "/", "a")).await);
    assert!(eventually(within, || served_by(gw, "two.test", "/", "b")).await);

    // Service two's endpoints move to pod c: the endpoints fast path, no translation.
    m.write("slice-two.yaml", &endpoint_slices("two", &[c.addr]));
    assert!(eventually(within, || served_by(gw, "two.test", "/", "c")).await);

    // Another route changes: a whole new snapshot, in which route r2 (unchanged) must be
    // compiled again with the endpoints it has now, not those it was compiled with.
    m.write("r1.yaml", &route("r1", "one.test", "/v2", "one"));
    let gone = |host: &'static str| async move { get(gw, host, "/", "").await.0 == 404 };
    assert!(
        eventually(within, || gone("one.test")).await,
        "r1's old path"
    );
    assert!(served_by(gw, "one.test", "/v2", "a").await);
    for _ in 0..10 {
        assert!(
            served_by(gw, "two.test", "/", "c").await,
            "r2 follows the moved endpoints"
        );
    }

    // The Gateway changes: every route attaches again and still serves.
    let extra = free_port().await;
    m.write(
        "gw.yaml",
        &format!("{CLASS}---\n{}", gateway(port, Some(extra))),
    );
    let extra_opens = || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", extra))
            .await
            .is_ok()
    };
    assert!(
        eventually(within, extra_opens).await,
        "the new listener opens"
    );
    assert!(served_by(gw, "one.test", "/v2", "a").await);
    assert!(served_by(gw, "two.test", "/", "c").await);

    // Route r2 moves to another file in one step (one file loses it, another gains it).
    m.write("r2.yaml", &route("r1", "one.test", "/v2", "one"));
    m.write("r1.yaml", &route("r2", "two.test", "/v3", "two"));
    assert!(
        eventually(within, || gone("two.test")).await,
        "r2's old path"
    );
    assert!(served_by(gw, "two.test", "/v3", "c").await);
    assert!(served_by(gw, "one.test", "/v2", "a").await);
}
