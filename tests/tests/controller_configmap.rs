//! The controller ConfigMap (`--configmap`) against both API servers: its values apply, a
//! change applies without a restart, and its deletion brings the flags back; the real server
//! checks that the shipped Role lets the controller watch it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_tests::apis::TestApi;
use sluice_tests::*;

sluice_tests::on_both!(configmap_applies, configmap_fake, configmap_real);

fn configmap(body_size: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sluice\n  namespace: sluice-system\ndata:\n  proxy-body-size: \"{body_size}\"\n  worker-processes: \"4\"\n"
    )
}

async fn configmap_applies(api: &TestApi) {
    let a = backend_at("a", api.backend_addr()).await;
    api.apply_yaml(
        &[
            ingress_class(),
            service("web"),
            endpoint_slices("web", &[a.addr]),
            ingress("web", "web.test", &[("/", "Prefix", "web")]),
            configmap("1k"),
        ]
        .join("---\n"),
    )
    .await;
    let c = api
        .controller("solo", &["--configmap", "sluice-system/sluice"])
        .await;
    let http = c.running.http_addr.unwrap();
    let post = format!(
        "POST / HTTP/1.1\r\nHost: web.test\r\nContent-Length: 2000\r\nConnection: close\r\n\r\n{}",
        "x".repeat(2000)
    );
    let status_is = |want: &'static str| {
        let post = post.clone();
        async move { raw_status(http, &post).await.contains(want) }
    };
    assert!(
        eventually(Duration::from_secs(10), || status_is(" 413 ")).await,
        "proxy-body-size 1k from the ConfigMap"
    );
    let status = get(
        &client(),
        c.running.admin_addr,
        "localhost",
        "/api/v1/status",
    )
    .await
    .unwrap()
    .text();
    assert!(
        status.contains("worker-processes: sluice does not know this key"),
        "{status}"
    );

    api.apply_yaml(&configmap("4k")).await;
    assert!(
        eventually(Duration::from_secs(10), || status_is(" 200 ")).await,
        "a ConfigMap change applies without a restart"
    );
    api.apply_yaml(&configmap("1k")).await;
    assert!(eventually(Duration::from_secs(10), || status_is(" 413 ")).await);
    assert!(api.delete("ConfigMap", "sluice-system", "sluice").await);
    assert!(
        eventually(Duration::from_secs(10), || status_is(" 200 ")).await,
        "without the ConfigMap the flag (64 MiB) applies"
    );
    c.shutdown(Duration::from_secs(3)).await;
}
