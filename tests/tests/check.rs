//! `sluice check`: the migration report from files and from a cluster (the fake API server
//! through a kubeconfig), its exit codes, and the migration page's annotation table kept equal to the
//! catalog the code uses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use serde_json::{Value, json};
use sluice::check;
use sluice_tests::fake_api::FakeApi;
use sluice_tests::*;

fn args(argv: &[&str]) -> check::CheckArgs {
    let mut full = vec!["sluice", "check"];
    full.extend_from_slice(argv);
    match sluice::cli::Cli::try_parse_from(full).unwrap().command {
        sluice::cli::Command::Check(a) => a,
        other => panic!("not check: {other:?}"),
    }
}

async fn run(argv: &[&str]) -> (u8, String) {
    let mut out = Vec::new();
    let code = check::run(&args(argv), &mut out).await;
    (code, String::from_utf8(out).unwrap())
}

const MIGRATING: &str = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /$2
    nginx.ingress.kubernetes.io/proxy-buffering: "off"
    nginx.ingress.kubernetes.io/mirror-target: https://mirror.test$request_uri
    nginx.ingress.kubernetes.io/proxy-body-size: lots
    nginx.ingress.kubernetes.io/server-snippet: "return 200;"
    nginx.ingress.kubernetes.io/auth-proxy-set-headers: "default/auth-headers"
    cert-manager.io/cluster-issuer: letsencrypt
spec:
  ingressClassName: nginx
  rules:
  - host: shop.test
    http:
      paths:
      - path: /api(/|$)(.*)
        pathType: ImplementationSpecific
        backend: {service: {name: api, port: {number: 80}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: not-read}
"#;

const CLEAN: &str = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: blog
  annotations:
    nginx.ingress.kubernetes.io/ssl-redirect: "false"
    nginx.ingress.kubernetes.io/proxy-buffering: "off"
spec:
  rules:
  - host: blog.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: blog, port: {number: 80}}}}
"#;

fn verdicts(json: &Value) -> Vec<(String, String)> {
    json["ingresses"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["annotations"].as_array().unwrap().clone())
        .map(|f| {
            (
                f["annotation"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string(),
                f["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn files_get_a_verdict_per_annotation_and_gate_on_exit_code() {
    let m = Manifests::new();
    m.write("clean.yaml", CLEAN);
    let dir = m.dir.path().to_str().unwrap();
    let (code, text) = run(&[dir]).await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("Ingress default/blog"), "{text}");
    assert!(text.contains("proxy-buffering  differs: "), "{text}");

    m.write("migrating.yaml", MIGRATING);
    let (code, out) = run(&[dir, "--format", "json"]).await;
    assert_eq!(code, 1, "{out}");
    let json: Value = serde_json::from_str(&out).unwrap();
    let mut got = verdicts(&json);
    got.sort();
    let want: Vec<(String, String)> = [
        ("auth-proxy-set-headers", "fails-closed"),
        ("mirror-target", "unsupported"),
        ("proxy-body-size", "invalid"),
        ("proxy-buffering", "differs"),
        ("proxy-buffering", "differs"),
        ("rewrite-target", "honoured"),
        ("server-snippet", "refused"),
        ("ssl-redirect", "honoured"),
    ]
    .iter()
    .map(|(a, v)| (a.to_string(), v.to_string()))
    .collect();
    assert_eq!(got, want);
    assert_eq!(json["blocking"], 4);

    // A path the regex crate cannot run makes rewrite-target invalid, not silently different.
    m.write(
        "migrating.yaml",
        &MIGRATING.replace("/api(/|$)(.*)", "/api(?!/internal)(.*)"),
    );
    let (code, out) = run(&[dir, "--format", "json"]).await;
    assert_eq!(code, 1);
    let json: Value = serde_json::from_str(&out).unwrap();
    assert!(verdicts(&json).contains(&("rewrite-target".into(), "invalid".into())));
    assert!(out.contains("look-around"), "{out}");

    // Input that cannot be read is exit 2, never a pass.
    m.write(
        "broken.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: [\n",
    );
    assert_eq!(run(&[dir]).await.0, 2);
    assert_eq!(run(&[]).await.0, 2);
}

#[tokio::test]
async fn a_cluster_is_read_through_a_kubeconfig() {
    let fake = FakeApi::start().await;
    for o in yaml_objects(MIGRATING)
        .into_iter()
        .chain(yaml_objects(CLEAN))
    {
        if o["kind"] == "Ingress" {
            let mut o = o;
            if o["metadata"]["namespace"].is_null() {
                o["metadata"]["namespace"] = json!("default");
            }
            fake.apply(o);
        }
    }
    let m = Manifests::new();
    m.write(
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context: {{cluster: fake, user: u}}\ncurrent-context: c\n",
            fake.url()
        ),
    );
    let kubeconfig = m.path("kubeconfig");
    let kc = kubeconfig.to_str().unwrap();
    let (code, text) = run(&["--kubeconfig", kc]).await;
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("Ingress web/shop (cluster)"), "{text}");
    assert!(text.contains("Ingress default/blog (cluster)"), "{text}");
    let (code, text) = run(&["--kubeconfig", kc, "-n", "default"]).await;
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("web/shop"), "{text}");
    // An unreachable cluster is exit 2.
    drop(fake);
    m.write(
        "kubeconfig",
        "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster: {server: \"http://127.0.0.1:9\"}\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: c\n  context: {cluster: x, user: u}\ncurrent-context: c\n",
    );
    assert_eq!(run(&["--kubeconfig", kc]).await.0, 2);
}

/// The migration page's table (`docs/migration.md`) is the catalog's, byte for byte:
/// regenerate it with
/// `sluice check --annotations-table`.
#[tokio::test]
async fn the_readme_table_is_the_catalog() {
    let (code, table) = run(&["--annotations-table"]).await;
    assert_eq!(code, 0);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/migration.md"))
            .unwrap();
    let start = "<!-- annotations-table: generated by `sluice check --annotations-table` -->\n";
    let end = "<!-- annotations-table end -->";
    let from = readme
        .find(start)
        .expect("docs/migration.md has the table's start marker")
        + start.len();
    let to = readme[from..]
        .find(end)
        .expect("docs/migration.md has the table's end marker")
        + from;
    assert_eq!(
        &readme[from..to],
        table,
        "docs/migration.md's annotation table is stale: run `sluice check --annotations-table` and paste it between the markers"
    );
}
