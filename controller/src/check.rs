//! `sluice check`: the migration report. Reads Ingresses from files or from a cluster and
//! prints, per Ingress and annotation, whether sluice honours it, honours it differently,
//! does not support it, refuses it, fails closed on it, or cannot read its value — the same
//! verdicts ([`sluice_config::annotations::review`]) the controller reports as Warning Events.
//! Exit 1 when any annotation in use is unsupported, refused, fails closed or is invalid, so a
//! CI job can gate a migration on it; exit 2 when the input cannot be read.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use k8s_openapi::api::networking::v1::Ingress;
use serde::Serialize;
use sluice_config::annotations::catalog;
use sluice_config::annotations::review::{Finding, Verdict, review};
use sluice_config::annotations::traffic;

use crate::serve::yaml;
use sluice_config::world::Object;

/// Output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum CheckFormat {
    /// A block per Ingress, a line per annotation.
    Text,
    /// One JSON document.
    Json,
}

/// `sluice check` flags.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Files or directories of Kubernetes YAML; Ingresses (also inside Lists) are read, other
    /// kinds skipped.
    pub paths: Vec<PathBuf>,
    /// Read the Ingresses of the cluster that KUBECONFIG (or the pod's service account) names.
    #[arg(long)]
    pub cluster: bool,
    /// Read the cluster of this kubeconfig file (implies --cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Only Ingresses of this namespace (cluster mode).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: CheckFormat,
    /// Print the tables of every ingress-nginx annotation and controller ConfigMap key and
    /// what sluice does with each (Markdown, as in docs/migration.md) and exit.
    #[arg(long)]
    pub annotations_table: bool,
    /// Print Gateway API manifests (Gateway, HTTPRoutes, ReferenceGrants) equivalent to the
    /// Ingresses on stdout, and on stderr what was approximated or has no equivalent. Exit 0
    /// when everything converted exactly, 1 otherwise, 2 when the input cannot be read.
    #[arg(long)]
    pub to_gateway: bool,
    /// --to-gateway: the Gateway's name.
    #[arg(long, default_value = "sluice", requires = "to_gateway")]
    pub gateway_name: String,
    /// --to-gateway: the Gateway's namespace.
    #[arg(long, default_value = "sluice-system", requires = "to_gateway")]
    pub gateway_namespace: String,
    /// --to-gateway: the Gateway's GatewayClass.
    #[arg(long, default_value = "sluice", requires = "to_gateway")]
    pub gateway_class: String,
    /// --to-gateway: the port of the Gateway's `http` listener.
    #[arg(long, default_value_t = 80, requires = "to_gateway")]
    pub http_port: u16,
    /// --to-gateway: the port of its HTTPS listeners.
    #[arg(long, default_value_t = 443, requires = "to_gateway")]
    pub https_port: u16,
    /// --to-gateway: the controller ConfigMap (NAMESPACE/NAME) whose `ssl-redirect` and
    /// `hsts*` keys the routes follow (read from the files, or from the cluster).
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "to_gateway")]
    pub configmap: Option<String>,
}

/// One Ingress's report.
#[derive(Debug, Serialize)]
pub struct IngressReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Where it was read (a file, or `cluster`).
    pub source: String,
    /// One verdict per annotation under `nginx.ingress.kubernetes.io/` or `sluice.dev/`.
    pub annotations: Vec<Finding>,
}

/// The review of an Ingress's annotations, plus what translation would find in its paths:
/// with `use-regex` or `rewrite-target`, a path the regex crate cannot run makes that
/// annotation invalid (look-around and back-references are PCRE-only).
fn findings(ing: &Ingress) -> Vec<Finding> {
    let Some(a) = ing.metadata.annotations.as_ref() else {
        return Vec::new();
    };
    let mut found = review(a);
    let regex = traffic::flag(
        a,
        &[
            "sluice.dev/use-regex",
            "nginx.ingress.kubernetes.io/use-regex",
        ],
    ) == Ok(Some(true))
        || matches!(traffic::rewrite_target(a), Ok(Some(_)));
    let bad_path = ing
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .filter_map(|r| r.http.as_ref())
        .flat_map(|h| &h.paths)
        .filter(|_| regex)
        .find_map(|p| traffic::path_regex(p.path.as_deref().unwrap_or("/")).err());
    if let Some(why) = bad_path {
        for f in &mut found {
            let name = f.annotation.rsplit('/').next().unwrap_or_default();
            if matches!(name, "use-regex" | "rewrite-target") && f.verdict == Verdict::Honoured
                || name == "use-regex" && matches!(f.verdict, Verdict::Differs(_))
            {
                f.verdict = Verdict::Invalid(why.clone());
            }
        }
    }
    found
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Per Ingress, in input order.
    pub ingresses: Vec<IngressReport>,
    /// How many annotations in use block a migration.
    pub blocking: usize,
}

impl Report {
    /// Builds the report from `(source, Ingress)` pairs.
    pub fn new(ingresses: Vec<(String, Ingress)>) -> Self {
        let ingresses: Vec<IngressReport> = ingresses
            .into_iter()
            .map(|(source, ing)| IngressReport {
                namespace: ing.metadata.namespace.clone().unwrap_or_default(),
                name: ing.metadata.name.clone().unwrap_or_default(),
                source,
                annotations: findings(&ing),
            })
            .collect();
        let blocking = ingresses
            .iter()
            .flat_map(|i| &i.annotations)
            .filter(|f| f.verdict.blocks_migration())
            .count();
        Self {
            ingresses,
            blocking,
        }
    }

    /// Writes the report as text.
    pub fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        for i in &self.ingresses {
            writeln!(out, "Ingress {}/{} ({})", i.namespace, i.name, i.source)?;
            if i.annotations.is_empty() {
                writeln!(out, "  no ingress-nginx or sluice annotations")?;
            }
            let width = i
                .annotations
                .iter()
                .map(|f| f.annotation.len())
                .max()
                .unwrap_or(0);
            for f in &i.annotations {
                *counts.entry(f.verdict.word()).or_default() += 1;
                let why = f.verdict.why();
                let sep = if why.is_empty() { "" } else { ": " };
                writeln!(
                    out,
                    "  {:width$}  {}{sep}{why}",
                    f.annotation,
                    f.verdict.word()
                )?;
            }
        }
        let summary: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
        writeln!(
            out,
            "\n{} Ingresses; annotations: {}; {} block a migration",
            self.ingresses.len(),
            if summary.is_empty() {
                "none".to_string()
            } else {
                summary.join(", ")
            },
            self.blocking
        )
    }
}

/// Ingresses from files and directories, with the file each came from. A file that cannot be
/// read or parsed is an error: a migration gate must not pass over it.
pub fn ingresses_from_files(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, Ingress)>> {
    let mut out = Vec::new();
    for path in yaml::discover(paths).context("listing the manifests")? {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let parsed = yaml::parse(&path, &text).map_err(|e| anyhow::anyhow!("{e}"))?;
        for o in parsed.objects {
            if let Object::Ingress(i) = o {
                out.push((path.display().to_string(), Arc::unwrap_or_clone(i)));
            }
        }
    }
    Ok(out)
}

/// Ingresses from a cluster, all namespaces or one.
pub async fn ingresses_from_cluster(
    client: kube::Client,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<(String, Ingress)>> {
    let api: kube::Api<Ingress> = match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    };
    let list = api
        .list(&kube::api::ListParams::default())
        .await
        .context("listing Ingresses")?;
    Ok(list
        .items
        .into_iter()
        .map(|i| ("cluster".to_string(), i))
        .collect())
}

/// A client for the cluster the flags name.
pub async fn client(args: &CheckArgs) -> anyhow::Result<kube::Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .context("using the kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("finding the Kubernetes API server (set KUBECONFIG or --kubeconfig)")?,
    };
    kube::Client::try_from(config).context("creating the Kubernetes client")
}

/// Runs `sluice check`, writing to `out`; returns the exit code (0 clean, 1 blocking
/// annotations in use, 2 input that cannot be read).
pub async fn run(args: &CheckArgs, out: &mut impl Write) -> u8 {
    if args.to_gateway {
        return crate::to_gateway::run(args, out, &mut std::io::stderr().lock()).await;
    }
    if args.annotations_table {
        let tables = format!(
            "{}\n{}",
            catalog::markdown_table(),
            sluice_config::configmap::markdown_table()
        );
        return match out.write_all(tables.as_bytes()) {
            Ok(()) => 0,
            Err(_) => 2,
        };
    }
    let cluster = args.cluster || args.kubeconfig.is_some();
    let ingresses = if cluster {
        match client(args).await {
            Ok(c) => ingresses_from_cluster(c, args.namespace.as_deref()).await,
            Err(e) => Err(e),
        }
    } else if args.paths.is_empty() {
        Err(anyhow::anyhow!(
            "give manifest files or directories, or --cluster / --kubeconfig FILE"
        ))
    } else {
        ingresses_from_files(&args.paths)
    };
    let ingresses = match ingresses {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sluice check: {e:#}");
            return 2;
        }
    };
    let report = Report::new(ingresses);
    let written = match args.format {
        CheckFormat::Text => report.write_text(out),
        CheckFormat::Json => serde_json::to_writer_pretty(&mut *out, &report)
            .map_err(std::io::Error::other)
            .and_then(|()| writeln!(out)),
    };
    match written {
        Err(_) => 2,
        Ok(()) if report.blocking > 0 => 1,
        Ok(()) => 0,
    }
}
