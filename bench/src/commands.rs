//! The commands that are not scenarios: the load generator alone, demo backends, one attack,
//! and the floor peer's server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_bench::backend::{Backend, BackendConfig};
use sluice_bench::load::attack::Attack;
use sluice_bench::load::{self, Hooks, LoadReport, LoadSpec, Mode, TlsSpec, TlsVersion, Verify};
use sluice_bench::peers::Proto;
use sluice_bench::scenario;

use crate::cli::{AttackArgs, BackendsArgs, FloorArgs, LoadArgs, TlsArg};

pub(crate) async fn attack_cmd(a: AttackArgs) -> Result<()> {
    let attack =
        Attack::parse(&a.attack).with_context(|| format!("unknown attack {:?}", a.attack))?;
    let tls = a.tls.then(|| TlsSpec {
        version: TlsVersion::Any,
        verify: Verify::Insecure,
        resumption: false,
        server_name: a.host.clone(),
    });
    let connector = sluice_bench::load::attack::connector(attack, a.target, tls.as_ref())?;
    let now = tokio::time::Instant::now();
    let report = sluice_bench::load::attack::run(sluice_bench::load::attack::AttackSpec {
        attack,
        connections: a.connections,
        connector,
        host: a.host,
        tls: a.tls,
        start: now + Duration::from_secs_f64(a.after),
        end: now + Duration::from_secs_f64(a.until),
    })
    .await;
    let json = serde_json::to_string_pretty(&report)?;
    match a.json {
        Some(p) => std::fs::write(&p, json).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{json}"),
    }
    Ok(())
}

pub(crate) fn floor_cmd(a: FloorArgs) -> Result<()> {
    use sluice_bench::peers::floor;
    let tls = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => Some(floor::tls_config(c, k)?),
        _ => None,
    };
    let rt = if a.workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the tokio runtime")?
    } else {
        runtime(a.workers)?
    };
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("binding {}", a.listen))?;
        floor::serve(l, tls, a.body).await;
        Ok(())
    })
}

pub(crate) fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("building the tokio runtime")
}

pub(crate) fn parse_url(url: &str) -> Result<(Proto, String, u16, String)> {
    let (proto, rest) = if let Some(r) = url.strip_prefix("https://") {
        (Proto::Https, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (Proto::Http, r)
    } else {
        bail!("--url must start with http:// or https://");
    };
    let (authority, path) = rest
        .find('/')
        .map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
    let default_port = if proto == Proto::Https { 443 } else { 80 };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
            h.trim_matches(['[', ']']).to_string(),
            p.parse().context("bad port in --url")?,
        ),
        _ => (authority.to_string(), default_port),
    };
    if host.is_empty() {
        bail!("--url has no host");
    }
    Ok((proto, host, port, path.to_string()))
}

pub(crate) async fn load_cmd(a: LoadArgs) -> Result<()> {
    let (proto, host, port, path) = parse_url(&a.url)?;
    let addrs: Vec<SocketAddr> = match a.connect_to {
        Some(x) => vec![x],
        None => tokio::net::lookup_host((host.as_str(), port))
            .await
            .with_context(|| format!("resolving {host}"))?
            .collect(),
    };
    let tls = (proto == Proto::Https).then(|| -> Result<TlsSpec> {
        let verify = if a.insecure {
            Verify::Insecure
        } else if let Some(f) = &a.ca_file {
            let pem = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let certs = rustls_pki_types::pem::PemObject::pem_slice_iter(&pem)
                .collect::<Result<Vec<rustls_pki_types::CertificateDer<'static>>, _>>()
                .map_err(|e| anyhow::anyhow!("{}: {e:?}", f.display()))?;
            Verify::Roots(certs)
        } else {
            Verify::System
        };
        Ok(TlsSpec {
            version: match a.tls {
                TlsArg::Any => TlsVersion::Any,
                TlsArg::V12 => TlsVersion::V12,
                TlsArg::V13 => TlsVersion::V13,
            },
            verify,
            resumption: !a.no_resumption,
            server_name: host.clone(),
        })
    });
    let host_header = if port == if proto == Proto::Https { 443 } else { 80 } {
        host.clone()
    } else {
        format!("{host}:{port}")
    };
    let spec = LoadSpec {
        addrs,
        host: host_header,
        path,
        tls: tls.transpose()?,
        mode: a.rate.map_or(Mode::Closed, |rate| Mode::Open { rate }),
        connections: a.connections,
        duration: Duration::from_secs_f64(a.duration),
        timeout: Duration::from_secs_f64(a.timeout),
        keep_alive: !a.connection_close,
    };
    let live = Arc::new(load::Live::default());
    let (pb, task) = scenario::progress("load", a.duration as u64, Arc::clone(&live));
    let r = load::run(
        &spec,
        Hooks {
            started: None,
            live,
            bucket: None,
        },
    )
    .await?;
    task.abort();
    pb.finish_and_clear();
    print!("{}", load_summary(&a.url, &r));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

pub(crate) fn load_summary(url: &str, r: &LoadReport) -> String {
    let l = &r.latency_ms;
    let e = &r.errors;
    let c = r.truth.causes();
    format!(
        "{url}: {} over {} connections for {:.0}s\n  requests {}  achieved {:.0} req/s{}\n  latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}  p99.999 {:.3}  max {:.3}\n  wrk classes: connect {}  read {}  write {}  timeout {}  non-2xx {}\n  requests failed {} (refused {}, connect timeout {}, handshake {}, failed after send {} of which retryable {}, response timeout {}, 5xx {}, other {})\n  idle connections closed by the server (not failures): {}\n{}",
        r.mode,
        r.connections,
        r.duration_s,
        r.requests,
        r.achieved_rps,
        r.requested_rps
            .map_or(String::new(), |q| format!(" of {q:.0} requested")),
        l.p50,
        l.p90,
        l.p99,
        l.p99_9,
        l.p99_99,
        l.p99_999,
        l.max,
        e.connect,
        e.read,
        e.write,
        e.timeout,
        e.status_non2xx,
        r.requests_failed,
        c.refused,
        c.connect_timeout,
        c.handshake,
        c.failed_after_send,
        c.retryable,
        c.response_timeout,
        c.status_5xx,
        c.other_non2xx,
        r.idle_closed_by_server,
        r.rate_note
            .as_ref()
            .map_or(String::new(), |n| format!("  FLAGGED: {n}\n"))
    )
}

pub(crate) async fn backends_cmd(a: BackendsArgs) -> Result<()> {
    let mut running = Vec::new();
    for i in 0..a.count {
        let port = a.base_port.checked_add(i).context("port out of range")?;
        let name = format!("pod-{}", i + 1);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let b = Backend::start(
            addr,
            BackendConfig {
                name: name.clone(),
                body_size: a.body_size,
                http2: true,
                delay: std::time::Duration::ZERO,
            },
        )
        .await
        .with_context(|| format!("binding {addr}"))?;
        println!(
            "{name} listening on http://{addr}/ ({} B responses; ?size=N ?delay_ms=N ?status=N)",
            a.body_size
        );
        running.push(b);
    }
    println!("Ctrl-C to stop");
    tokio::signal::ctrl_c().await?;
    for b in running {
        b.stop_graceful().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls() {
        let (p, h, port, path) = super::parse_url("https://bench.local/x?y=1").unwrap();
        assert_eq!(
            (p, h.as_str(), port, path.as_str()),
            (
                sluice_bench::peers::Proto::Https,
                "bench.local",
                443,
                "/x?y=1"
            )
        );
        let (_, h, port, path) = super::parse_url("http://127.0.0.1:8080").unwrap();
        assert_eq!((h.as_str(), port, path.as_str()), ("127.0.0.1", 8080, "/"));
        assert!(super::parse_url("ftp://x").is_err());
    }
}
