//! `sluice check --to-gateway`: Gateway API manifests equivalent to the Ingresses (stdout)
//! and the report of what has no equivalent (stderr). The conversion itself is
//! [`sluice_config::convert`]; this reads the input (files or a cluster) and prints.
//!
//! Exit codes: 0 when everything converted exactly, 1 when something was approximated or
//! left out (the report says what), 2 when the input cannot be read.

use std::io::Write;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::Ingress;
use sluice_config::convert::{Conversion, ConvertOptions, convert};
use sluice_config::world::{Object, World};

use crate::check::CheckArgs;
use crate::serve::yaml;

/// The options the flags give.
fn options(args: &CheckArgs) -> anyhow::Result<ConvertOptions> {
    let config_map = match &args.configmap {
        None => None,
        Some(s) => {
            let (ns, name) = s
                .split_once('/')
                .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
                .with_context(|| format!("--configmap {s:?} is not NAMESPACE/NAME"))?;
            Some((ns.to_string(), name.to_string()))
        }
    };
    Ok(ConvertOptions {
        gateway_name: args.gateway_name.clone(),
        gateway_namespace: args.gateway_namespace.clone(),
        gateway_class: args.gateway_class.clone(),
        http_port: args.http_port,
        https_port: args.https_port,
        config_map,
    })
}

/// Every object of the files (Ingresses, Services, ConfigMaps and Gateway API objects are
/// what the conversion reads). A file that cannot be read or parsed is an error.
pub fn world_from_files(paths: &[std::path::PathBuf]) -> anyhow::Result<World> {
    let mut world = World::new();
    for path in yaml::discover(paths).context("listing the manifests")? {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let parsed = yaml::parse(&path, &text).map_err(|e| anyhow::anyhow!("{e}"))?;
        for o in parsed.objects {
            if let Object::Unreadable(kind, (ns, name), why) = &o {
                anyhow::bail!(
                    "{}: {} {ns}/{name} cannot be read: {why}",
                    path.display(),
                    kind.name()
                );
            }
            world.put(o);
        }
    }
    Ok(world)
}

/// The cluster's Ingresses (one namespace or all), their namespaces' Services and the
/// ConfigMap named by `--configmap`.
async fn world_from_cluster(
    client: kube::Client,
    args: &CheckArgs,
    opts: &ConvertOptions,
) -> anyhow::Result<World> {
    let lp = kube::api::ListParams::default();
    let (ingresses, services): (kube::Api<Ingress>, kube::Api<Service>) =
        match args.namespace.as_deref() {
            Some(ns) => (
                kube::Api::namespaced(client.clone(), ns),
                kube::Api::namespaced(client.clone(), ns),
            ),
            None => (
                kube::Api::all(client.clone()),
                kube::Api::all(client.clone()),
            ),
        };
    let mut world = World::new();
    for i in ingresses
        .list(&lp)
        .await
        .context("listing Ingresses")?
        .items
    {
        world.put_ingress(i);
    }
    for s in services.list(&lp).await.context("listing Services")?.items {
        world.put_service(s);
    }
    if let Some((ns, name)) = &opts.config_map {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, ns);
        if let Some(cm) = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading ConfigMap {ns}/{name}"))?
        {
            world.put_config_map(cm);
        }
    }
    Ok(world)
}

/// The manifests, one YAML document per object.
pub fn manifests(c: &Conversion) -> anyhow::Result<String> {
    let mut out = String::new();
    for o in &c.objects {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&o.to_value()).context("writing YAML")?);
    }
    Ok(out)
}

/// The report, a block per object, a line per annotation, key or field.
pub fn report(c: &Conversion, out: &mut impl Write) -> std::io::Result<()> {
    let mut last = "";
    for n in &c.notes {
        if n.object != last {
            writeln!(out, "{}", n.object)?;
            last = &n.object;
        }
        writeln!(
            out,
            "  {}  {}: {}",
            n.item,
            n.outcome.word(),
            n.outcome.detail()
        )?;
    }
    let count = |w: &str| c.notes.iter().filter(|n| n.outcome.word() == w).count();
    writeln!(
        out,
        "\n{} objects printed; {} converted, {} approximated, {} with no equivalent",
        c.objects.len(),
        count("converted"),
        count("approximated"),
        count("no equivalent")
    )
}

/// Runs `sluice check --to-gateway`.
pub async fn run(args: &CheckArgs, out: &mut impl Write, err: &mut impl Write) -> u8 {
    let world = async {
        let opts = options(args)?;
        let world = if args.cluster || args.kubeconfig.is_some() {
            world_from_cluster(crate::check::client(args).await?, args, &opts).await?
        } else if args.paths.is_empty() {
            anyhow::bail!("give manifest files or directories, or --cluster / --kubeconfig FILE")
        } else {
            world_from_files(&args.paths)?
        };
        Ok::<_, anyhow::Error>((world, opts))
    }
    .await;
    let (world, opts) = match world {
        Ok(w) => w,
        Err(e) => {
            let _ = writeln!(err, "sluice check --to-gateway: {e:#}");
            return 2;
        }
    };
    let conversion = convert(&world, &opts);
    let text = match manifests(&conversion) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(err, "sluice check --to-gateway: {e:#}");
            return 2;
        }
    };
    if out.write_all(text.as_bytes()).is_err() || report(&conversion, err).is_err() {
        return 2;
    }
    u8::from(!conversion.lossless())
}
