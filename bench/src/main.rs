//! `sluice-bench`: reproduces the published ingress benchmarks on one machine over loopback
//! (scenarios), plus the load generator on its own (`load`, used by the in-cluster harness) and
//! demo backends (`backends`).
#![forbid(unsafe_code)]

mod cli;
mod commands;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_bench::load::attack::Attack;
use sluice_bench::peers::{PeerEnv, PeerKind, Proto, sluice_api};
use sluice_bench::pods::Removal;
use sluice_bench::scenario::seed;
use sluice_bench::scenario::{self, Common, Scenario};
use sluice_bench::{certs, report, sys};

use cli::{Cli, Cmd, GeneratorArg, Job, ProtoArg, ScenarioArgs, Source};
use commands::{attack_cmd, backends_cmd, floor_cmd, load_cmd, runtime};

fn main() -> Result<()> {
    let cli = Cli::parse();
    let nofile = sys::raise_nofile();
    match cli.cmd {
        Cmd::Load(a) => runtime(a.threads.unwrap_or_else(sys::cpu_count))?.block_on(load_cmd(a)),
        Cmd::Backends(a) => runtime(1)?.block_on(backends_cmd(a)),
        Cmd::Attack(a) => runtime(1)?.block_on(attack_cmd(a)),
        Cmd::FloorServe(a) => floor_cmd(a),
        Cmd::Churn(a) => scenario_main(Job::Scenario(Scenario::Churn), a, nofile),
        Cmd::Static(a) => scenario_main(Job::Scenario(Scenario::Static), a, nofile),
        Cmd::Rps(a) => scenario_main(Job::Scenario(Scenario::Rps), a, nofile),
        Cmd::Tps(a) => scenario_main(Job::Scenario(Scenario::Tps), a, nofile),
        Cmd::Throughput(a) => scenario_main(Job::Scenario(Scenario::Throughput), a, nofile),
        Cmd::Scale(a) => scenario_main(Job::Scenario(Scenario::Scale), a, nofile),
        Cmd::Validate(a) => scenario_main(Job::Scenario(Scenario::Validate), a, nofile),
        Cmd::Abuse(a) => scenario_main(Job::Scenario(Scenario::Abuse), a, nofile),
        Cmd::Idle(a) => scenario_main(Job::Scenario(Scenario::Idle), a, nofile),
        Cmd::Soak(a) => scenario_main(Job::Scenario(Scenario::Soak), a, nofile),
        Cmd::Upgrade(a) => scenario_main(Job::Scenario(Scenario::Upgrade), a, nofile),
        Cmd::Seed(s) => match s.name.as_deref().filter(|_| !s.list) {
            None => {
                print!("{}", seed::list());
                Ok(())
            }
            Some(name) => {
                let found = seed::find(name)
                    .with_context(|| format!("unknown seed {name:?}; sluice-bench seed --list"))?;
                scenario_main(Job::Seed(found), s.run, nofile)
            }
        },
    }
}

fn scenario_main(job: Job, a: ScenarioArgs, nofile: u64) -> Result<()> {
    if a.source == Source::Api && !sluice_api::in_private_network() {
        let status = sluice_api::enter_private_network().map_err(anyhow::Error::msg)?;
        if !status.success() {
            bail!("the run in its network namespace failed ({status})");
        }
        return Ok(());
    }
    let ncpu = sys::cpu_count();
    let pin = !a.no_pin && ncpu >= 2 && sys::which("taskset").is_some();
    let cores = a.cores.max(1);
    let all: Vec<usize> = (0..ncpu).collect();
    let proxy_cpus = a
        .proxy_cpus
        .clone()
        .unwrap_or_else(|| list(&all[..cores.min(ncpu)]));
    let load_cpus = match &a.load_cpus {
        Some(l) => sys::parse_cpus(l).context("bad --load-cpus")?,
        None if cores < ncpu => all[cores..].to_vec(),
        None => all.clone(),
    };
    let mut machine = std::collections::BTreeMap::new();
    machine.insert("cpus".into(), ncpu.to_string());
    machine.insert(
        "kernel".into(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
    );
    machine.insert("open files limit".into(), nofile.to_string());
    if pin {
        sys::pin_self(&load_cpus).map_err(|e| anyhow::anyhow!("pinning to {load_cpus:?}: {e}"))?;
        machine.insert(
            "pinning".into(),
            format!(
                "proxy on CPU {proxy_cpus} (taskset), load generator + backends on CPU {}",
                list(&load_cpus)
            ),
        );
        if cores >= ncpu {
            machine.insert(
                "pinning note".into(),
                "the proxy was given every core: the load generator shares them".into(),
            );
        }
    } else {
        machine.insert(
            "pinning".into(),
            "none (--no-pin, one CPU, or no taskset): proxy and load share the cores".into(),
        );
    }
    let threads = a
        .threads
        .unwrap_or(if pin { load_cpus.len() } else { ncpu });
    machine.insert("load generator threads".into(), threads.to_string());
    machine.insert("peer versions".into(), peer_versions());
    runtime(threads)?.block_on(run_scenario(
        job,
        a,
        machine,
        pin.then_some(proxy_cpus),
        (cores, threads),
    ))
}

fn list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn peer_versions() -> String {
    let v = |bin: &str, args: &[&str]| -> Option<String> {
        let out = std::process::Command::new(sys::which(bin)?)
            .args(args)
            .output()
            .ok()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(text.lines().next()?.trim().to_string())
    };
    [
        ("nginx", &["-v"][..]),
        ("haproxy", &["-v"][..]),
        ("caddy", &["version"][..]),
    ]
    .iter()
    .filter_map(|(b, a)| {
        let line = v(b, a)?;
        Some(if line.to_lowercase().contains(b) {
            line
        } else {
            format!("{b} {line}")
        })
    })
    .collect::<Vec<_>>()
    .join("; ")
}

async fn run_scenario(
    job: Job,
    a: ScenarioArgs,
    machine: std::collections::BTreeMap<String, String>,
    cpus: Option<String>,
    (cores, load_threads): (usize, usize),
) -> Result<()> {
    let peers: Vec<PeerKind> = if a.peers.is_empty() {
        job.default_peers()
    } else {
        a.peers
            .iter()
            .map(|p| PeerKind::parse(p.trim()).with_context(|| format!("unknown peer {p:?}")))
            .collect::<Result<_>>()?
    };
    let peers: Vec<PeerKind> = match a.source {
        Source::Files => peers,
        Source::Api => peers
            .into_iter()
            .map(|p| match p {
                PeerKind::Sluice => PeerKind::SluiceApi,
                PeerKind::Traefik => PeerKind::TraefikApi,
                other => other,
            })
            .collect(),
    };
    let sluice_bin = match &a.sluice_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("sluice"))
            .unwrap_or_default(),
    };
    let kube_apiserver = a
        .kube_apiserver
        .clone()
        .unwrap_or_else(|| sluice_api::default_apiserver(&sluice_bin));
    let cert = certs::generate(
        a.key,
        &["bench.local", "*.bench.local", "localhost", "127.0.0.1"],
    )?;
    let (started, stamp) = scenario::utc_now();
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-out/{}-{stamp}", job.name())));
    let common = Common {
        key: a.key,
        quick: a.quick,
        peers,
        proto: a.proto.map(ProtoArg::peer),
        h2: a.proto == Some(ProtoArg::H2),
        rate: a.rate,
        connections: a.connections,
        duration: a.duration.map(Duration::from_secs_f64),
        interval: a.interval.map(Duration::from_secs_f64),
        timeout: Duration::from_secs_f64(a.timeout),
        env: PeerEnv {
            proto: Proto::Https,
            cert: Arc::new(cert),
            cpus,
            workers: a.workers.unwrap_or(cores),
            sluice_bin,
            sluice_log_level: a.sluice_log_level.clone(),
            log_dir: Some(out.join("logs")),
            kube_apiserver,
            api_ingresses: a.ingresses.first().copied().unwrap_or(1),
            http2: matches!(job, Job::Scenario(Scenario::Abuse | Scenario::Upgrade)),
            body_size: 0,
            client_cert_host: false,
            handover: matches!(job, Job::Scenario(Scenario::Upgrade)),
            haproxy_expose_fd: true,
            max_connections: None,
            sluice_extra_args: Vec::new(),
        },
        removal: if a.stop_delay.is_some() {
            Removal::Before
        } else {
            a.removal
        },
        gap: a.stop_delay.or(a.gap).map(Duration::from_secs_f64),
        stop: a.stop,
        proxy_cores: cores,
        ingresses: (!a.ingresses.is_empty()).then(|| a.ingresses.clone()),
        objects: a.objects.clone(),
        rounds: a.rounds as usize,
        wrk_threads: (a.generator == GeneratorArg::Wrk).then_some(load_threads),
        attacks: if a.attacks.is_empty() {
            None
        } else {
            Some(
                a.attacks
                    .iter()
                    .map(|s| {
                        Attack::parse(s.trim()).with_context(|| format!("unknown attack {s:?}"))
                    })
                    .collect::<Result<_>>()?,
            )
        },
        attack_connections: a.attack_connections,
        load_threads,
        replicas: None,
        tls_version: None,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine,
    };
    eprintln!(
        "sluice-bench {}{}: results in {}",
        job.name(),
        if a.quick { " --quick" } else { "" },
        out.display()
    );
    let scenario = match job {
        Job::Scenario(s) => s,
        Job::Seed(s) => {
            let run = seed::run_and_write(s, &common, &out, &started);
            let text = tokio::select! {
                r = run => r.with_context(|| format!("writing {}", out.display()))?,
                _ = tokio::signal::ctrl_c() => bail!("interrupted"),
            };
            print!("\n{text}");
            println!(
                "report: {}/index.html  (seed.md: published vs ours; summary.md; one directory per run)",
                out.display()
            );
            return Ok(());
        }
    };
    let run = scenario.run(&common);
    let mut rep = tokio::select! {
        r = run => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted"),
    };
    rep.started_utc = started;
    report::write_all(&out, &rep).with_context(|| format!("writing {}", out.display()))?;
    println!("\n{}\n", rep.what_it_shows);
    print!("{}", report::terminal_table(&rep, a.wide));
    print!("{}", report::rounds::text(&rep.rounds));
    for p in rep.peers.iter().filter(|p| p.rate_note.is_some()) {
        println!(
            "! {} {}: {}",
            p.name,
            p.variant,
            p.rate_note.as_deref().unwrap_or_default()
        );
    }
    let footer = report::terminal_footer(&rep, a.wide);
    if !footer.is_empty() {
        print!("\n{footer}");
    }
    if let Some(soak) = &rep.soak {
        println!(
            "soak: {}",
            if soak.held {
                "held".to_string()
            } else {
                format!("did not hold: {}", soak.why_not.join("; "))
            }
        );
        println!(
            "report: {}/report.md  (json: report.json, plots: soak.svg, latency.svg)",
            out.display()
        );
        if !soak.held {
            bail!("the soak did not hold");
        }
        return Ok(());
    }
    println!(
        "report: {}/report.md  (json: report.json, plots: latency.svg, timeline.svg)",
        out.display()
    );
    Ok(())
}
