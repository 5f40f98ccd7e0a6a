//! `custom-headers` end to end: the fields of the ConfigMap an Ingress names reach the client,
//! replace the pod's own, follow the ConfigMap's changes without a restart, and keep the
//! Ingress closed (503) whenever one cannot be set — through `sluice serve`, and through the
//! controller against both API servers (the real one checks that the shipped ClusterRole lets
//! the controller watch ConfigMaps in every namespace).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_tests::apis::TestApi;
use sluice_tests::*;

fn config_map(ns: &str, name: &str, data: &[(&str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n"
    );
    for (k, v) in data {
        s.push_str(&format!("  {k}: {}\n", serde_json::to_string(v).unwrap()));
    }
    s
}

/// The value of `name` on the answer for `host`, or the status when it is not 200.
async fn field(addr: std::net::SocketAddr, host: &str, name: &str) -> Result<String, u16> {
    let got = get(&client(), addr, host, "/").await.map_err(|_| 0u16)?;
    if got.status != 200 {
        return Err(got.status.as_u16());
    }
    Ok(got
        .headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap_or("?").to_string())
        .collect::<Vec<_>>()
        .join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sets_the_fields_and_follows_the_config_map() {
    let a = backend("pod-a").await;
    let m = Manifests::new();
    m.write(
        "base.yaml",
        &[
            ingress_class(),
            service("web"),
            endpoint_slices("web", &[a.addr]),
            nginx_ingress("web", "web", &[("custom-headers", "security")]),
            nginx_ingress("plain", "web", &[]),
            controller_configmap(
                "  global-allowed-response-headers: \"X-Frame-Options, X-Backend, X-Extra\"\n",
            ),
        ]
        .join("---\n"),
    );
    m.write(
        "headers.yaml",
        &config_map(
            "default",
            "security",
            &[("X-Frame-Options", "DENY"), ("X-Backend", "$hostname")],
        ),
    );
    let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
    let http = s.running.http_addr.unwrap();

    assert_eq!(
        field(http, "web.test", "x-frame-options").await,
        Ok("DENY".into())
    );
    // The pod's own X-Backend is replaced, not joined; the value is literal, as ingress-nginx's.
    assert_eq!(
        field(http, "web.test", "x-backend").await,
        Ok("$hostname".into())
    );
    // Another Ingress on the same pods keeps the pod's fields.
    assert_eq!(
        field(http, "plain.test", "x-backend").await,
        Ok("pod-a".into())
    );
    assert_eq!(
        field(http, "plain.test", "x-frame-options").await,
        Ok(String::new())
    );

    // A change to the ConfigMap applies without a restart.
    m.write(
        "headers.yaml",
        &config_map(
            "default",
            "security",
            &[("X-Frame-Options", "SAMEORIGIN"), ("X-Extra", "1")],
        ),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            field(http, "web.test", "x-frame-options").await == Ok("SAMEORIGIN".into())
        })
        .await
    );
    assert_eq!(
        field(http, "web.test", "x-backend").await,
        Ok("pod-a".into())
    );
    assert_eq!(field(http, "web.test", "x-extra").await, Ok("1".into()));

    // What an attacker with write access to the ConfigMap (but not the controller's) tries:
    // a field the operator did not allow, a framing field, a value that splits the response.
    for bad in [
        vec![("Set-Cookie", "session=stolen")],
        vec![("X-Frame-Options", "DENY"), ("Content-Length", "0")],
        vec![("X-Frame-Options", "DENY\r\nSet-Cookie: session=stolen")],
    ] {
        m.write("headers.yaml", &config_map("default", "security", &bad));
        assert!(
            eventually(Duration::from_secs(5), || async {
                field(http, "web.test", "x-frame-options").await == Err(503)
            })
            .await,
            "{bad:?} closes the Ingress"
        );
        // The other Ingress keeps serving.
        assert_eq!(
            field(http, "plain.test", "x-backend").await,
            Ok("pod-a".into())
        );
        m.write(
            "headers.yaml",
            &config_map("default", "security", &[("X-Frame-Options", "DENY")]),
        );
        assert!(
            eventually(Duration::from_secs(5), || async {
                field(http, "web.test", "x-frame-options").await == Ok("DENY".into())
            })
            .await
        );
    }

    // A ConfigMap that is gone closes the Ingress too (ingress-nginx answers 503 as well).
    m.write("headers.yaml", "");
    assert!(
        eventually(Duration::from_secs(5), || async {
            field(http, "web.test", "x-frame-options").await == Err(503)
        })
        .await
    );
    let status = status_text(&s).await;
    assert!(
        status.contains("ConfigMap default/security not found"),
        "{status}"
    );
}

sluice_tests::on_both!(
    controller_watches_config_maps,
    controller_fake,
    controller_real
);

async fn controller_watches_config_maps(api: &TestApi) {
    let a = backend_at("pod-a", api.backend_addr()).await;
    api.apply_yaml(
        &[
            ingress_class(),
            service("web"),
            endpoint_slices("web", &[a.addr]),
            annotated_ingress(
                "web",
                "web.test",
                &[("/", "Prefix", "web")],
                &[(
                    "nginx.ingress.kubernetes.io/custom-headers",
                    "shared/security",
                )],
            ),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shared\n".to_string(),
            config_map("shared", "security", &[("X-Frame-Options", "DENY")]),
            config_map(
                "sluice-system",
                "sluice",
                &[("global-allowed-response-headers", "X-Frame-Options")],
            ),
        ]
        .join("---\n"),
    )
    .await;
    let c = api
        .controller("solo", &["--configmap", "sluice-system/sluice"])
        .await;
    let http = c.running.http_addr.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            field(http, "web.test", "x-frame-options").await == Ok("DENY".into())
        })
        .await,
        "a ConfigMap of another namespace, watched"
    );

    api.apply_yaml(&config_map(
        "shared",
        "security",
        &[("X-Frame-Options", "SAMEORIGIN")],
    ))
    .await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            field(http, "web.test", "x-frame-options").await == Ok("SAMEORIGIN".into())
        })
        .await,
        "its change applies without a restart"
    );

    // A ConfigMap no Ingress names changes nothing: no new snapshot.
    let generation = c.running.dp.generation();
    api.apply_yaml(&config_map("default", "unrelated", &[("k", "v")]))
        .await;
    api.apply_yaml(&config_map("shared", "other", &[("X-Frame-Options", "x")]))
        .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        c.running.dp.generation(),
        generation,
        "unrelated ConfigMaps rebuild nothing"
    );

    api.delete("ConfigMap", "shared", "security").await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            field(http, "web.test", "x-frame-options").await == Err(503)
        })
        .await,
        "a deleted ConfigMap closes the Ingress"
    );
    c.shutdown(Duration::from_secs(3)).await;
}
