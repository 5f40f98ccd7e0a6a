//! `sluice-bench seed NAME`: each published test the project reproduces as one named run —
//! its scenario(s) with the published settings (scaled to one core where the published load
//! does not fit, and saying so) — and its report beside a table of the published figures and
//! ours. Only ratios are compared (to the first row: the reload peer, or direct, or the HTTP
//! rate), never absolute numbers from a different machine.

use std::fmt::Write as _;
use std::time::Duration;

use super::{Common, Scenario, secs};
use crate::load::TlsVersion;
use crate::peers::{PeerKind, Proto};
use crate::report::{PeerResult, Report};

/// Which figure a comparison row reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Latency p99 (ms).
    P99,
    /// Latency p99.99 (ms).
    P9999,
    /// Achieved requests (or handshakes) per second.
    Rps,
}

impl Metric {
    fn of(self, p: &PeerResult) -> f64 {
        match self {
            Metric::P99 => p.latency_ms.p99,
            Metric::P9999 => p.latency_ms.p99_99,
            Metric::Rps => p.achieved_rps,
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Metric::P99 => "p99 ms",
            Metric::P9999 => "p99.99 ms",
            Metric::Rps => "req/s",
        }
    }
}

/// One published figure and the run of ours that stands in for it.
#[derive(Debug, Clone, Copy)]
pub struct Published {
    /// The published system.
    pub system: &'static str,
    /// The published result, as published.
    pub result: &'static str,
    /// The published value of the compared metric.
    pub value: f64,
    /// Our peer that stands in for it.
    pub peer: PeerKind,
    /// Our run (label) and variant it is read from.
    pub run: &'static str,
    /// The variant.
    pub variant: &'static str,
}

/// One run of a seed: a label (its directory), the scenario and the settings.
#[derive(Debug)]
pub struct Run {
    /// Directory and section name.
    pub label: &'static str,
    /// The scenario.
    pub scenario: Scenario,
    /// Its settings.
    pub common: Common,
}

/// A published test.
#[derive(Debug, Clone, Copy)]
pub struct Seed {
    /// `sluice-bench seed NAME`.
    pub name: &'static str,
    /// What was published, and where.
    pub title: &'static str,
    /// How ours differs from the published setup.
    pub scaled: &'static str,
    /// The metric compared.
    pub metric: Metric,
    /// The published figures (the first is the ratios' base).
    pub published: &'static [Published],
    /// The peers that run by default.
    pub peers: &'static [PeerKind],
}

use PeerKind as P;

/// Every seed.
pub const SEEDS: [Seed; 4] = [
    Seed {
        name: "nginx-dynamic",
        title: "NGINX \"dynamic Kubernetes cloud\" test: wrk2 -t2 -c1000 -d180s -R30000, HTTPS (RSA-2048, ECDHE), ~1 KB; backends 5→7→5 in a loop (12 s, 10 s)",
        scaled: "10,000 req/s over 1,000 HTTPS connections instead of 30,000 (beyond one core here); 180 s; quick: 3,000 req/s over 200 connections for 7 s",
        metric: Metric::P99,
        published: &[
            Published {
                system: "nginx, reload (NGINX OSS Ingress)",
                result: "33,365 connect errors, 309 timeouts, 4,650 read errors, p99 ≈ 32 s",
                value: 32_000.0,
                peer: P::NginxReload,
                run: "churn",
                variant: "https",
            },
            Published {
                system: "ingress-nginx (Lua balancer)",
                result: "8,809 timeouts, p99 ≈ 5 s",
                value: 5_000.0,
                peer: P::NginxLua,
                run: "churn",
                variant: "https",
            },
            Published {
                system: "NGINX Plus (API, no reload)",
                result: "0 errors, p99.9999 = 254 ms (its p99 is at most that)",
                value: 254.0,
                peer: P::HaproxyRuntime,
                run: "churn",
                variant: "https",
            },
        ],
        peers: &[
            P::NginxReload,
            P::NginxLua,
            P::HaproxyRuntime,
            P::Traefik,
            P::Sluice,
        ],
    },
    Seed {
        name: "openshift-router",
        title: "NGINX vs OpenShift (HAProxy) router: wrk2 -t2 -c50 -d60s -R1000, TLS 1.3; 4↔2 replicas every 10 s",
        scaled: "as published (50 connections, 1,000 req/s, TLS 1.3 only, 2↔4 replicas every 10 s, 60 s); quick: 20 s with changes every 3 s",
        metric: Metric::P9999,
        published: &[
            Published {
                system: "OpenShift router (HAProxy, reload)",
                result: "260 timeouts, 85 read errors, p99.99 ≈ 25 s",
                value: 25_000.0,
                peer: P::HaproxyReload,
                run: "churn",
                variant: "https",
            },
            Published {
                system: "NGINX Plus (API, no reload)",
                result: "0 errors, p99.999 < 700 ms (its p99.99 is at most that)",
                value: 700.0,
                peer: P::HaproxyRuntime,
                run: "churn",
                variant: "https",
            },
        ],
        peers: &[
            P::HaproxyReload,
            P::HaproxyRuntime,
            P::NginxReload,
            P::Traefik,
            P::Sluice,
        ],
    },
    Seed {
        name: "sizing",
        title: "NGINX Ingress sizing guide (bare metal, 1 CPU): wrk, 1 KB, keep-alive, 180 s: RPS HTTP and HTTPS; TLS handshakes/s (RSA-2048, new connection per request, 0 KB)",
        scaled: "one proxy core, load and backends on the other; 30 s per peer and variant (quick 5 s); 1 MB throughput runs too but has no published figure to compare",
        metric: Metric::Rps,
        published: &[
            Published {
                system: "NGINX Ingress, 1 CPU, HTTP 1 KB",
                result: "36.6k req/s",
                value: 36_600.0,
                peer: P::NginxReload,
                run: "rps",
                variant: "http",
            },
            Published {
                system: "NGINX Ingress, 1 CPU, HTTPS 1 KB",
                result: "28.6k req/s",
                value: 28_600.0,
                peer: P::NginxReload,
                run: "rps",
                variant: "https",
            },
            Published {
                system: "NGINX Ingress, 1 CPU, TLS handshakes (RSA-2048)",
                result: "4.4k handshakes/s",
                value: 4_400.0,
                peer: P::NginxReload,
                run: "tps",
                variant: "tls1.2",
            },
        ],
        peers: &[P::NginxReload, P::HaproxyReload, P::Traefik, P::Sluice],
    },
    Seed {
        name: "community",
        title: "Community comparison: wrk -t8 -c200 -d30s, 1 KB, plain HTTP: direct to the backend vs ingress-nginx vs NGINX Inc vs Traefik",
        scaled: "wrk with one thread per load core (here 1) instead of 8, 200 connections, 30 s (quick 5 s); the proxy on one core",
        metric: Metric::Rps,
        published: &[
            Published {
                system: "direct to the backend",
                result: "212k req/s",
                value: 212_000.0,
                peer: P::Direct,
                run: "rps",
                variant: "http",
            },
            Published {
                system: "ingress-nginx",
                result: "50k req/s",
                value: 50_000.0,
                peer: P::NginxLua,
                run: "rps",
                variant: "http",
            },
            Published {
                system: "NGINX Inc Ingress",
                result: "37k req/s",
                value: 37_000.0,
                peer: P::NginxReload,
                run: "rps",
                variant: "http",
            },
            Published {
                system: "Traefik",
                result: "53k req/s",
                value: 53_000.0,
                peer: P::Traefik,
                run: "rps",
                variant: "http",
            },
        ],
        peers: &[
            P::Direct,
            P::NginxLua,
            P::NginxReload,
            P::Traefik,
            P::HaproxyReload,
            P::Sluice,
        ],
    },
];

/// The seed called `name`.
pub fn find(name: &str) -> Option<&'static Seed> {
    SEEDS.iter().find(|s| s.name == name)
}

/// What `seed --list` prints.
pub fn list() -> String {
    let mut s = String::new();
    for seed in &SEEDS {
        let _ = writeln!(
            s,
            "{:<18} {}\n{:<18} ours: {}\n",
            seed.name, seed.title, "", seed.scaled
        );
    }
    s
}

impl Seed {
    /// The runs, from the command line's settings (`c`, whose peers are the seed's unless
    /// `--peers` said otherwise).
    pub fn runs(&self, c: &Common) -> Vec<Run> {
        let q = c.quick;
        let with = |f: &dyn Fn(&mut Common)| {
            let mut c = c.clone();
            f(&mut c);
            c
        };
        match self.name {
            "nginx-dynamic" => vec![Run {
                label: "churn",
                scenario: Scenario::Churn,
                common: with(&|c| {
                    c.proto = Some(Proto::Https);
                    c.rate = c.rate.or(Some(if q { 3000.0 } else { 10_000.0 }));
                    c.connections = c.connections.or(Some(if q { 200 } else { 1000 }));
                }),
            }],
            "openshift-router" => vec![Run {
                label: "churn",
                scenario: Scenario::Churn,
                common: with(&|c| {
                    c.proto = Some(Proto::Https);
                    c.tls_version = Some(TlsVersion::V13);
                    c.rate = c.rate.or(Some(1000.0));
                    c.connections = c.connections.or(Some(50));
                    c.duration = c.duration.or(Some(secs(if q { 20.0 } else { 60.0 })));
                    c.interval = c.interval.or(Some(secs(if q { 3.0 } else { 10.0 })));
                    c.replicas = Some((2, 4));
                }),
            }],
            "sizing" => {
                let d = c.duration.or(Some(secs(if q { 5.0 } else { 30.0 })));
                vec![
                    Run {
                        label: "rps",
                        scenario: Scenario::Rps,
                        common: with(&|c| {
                            c.duration = d;
                            c.proto = None;
                        }),
                    },
                    Run {
                        label: "tps",
                        scenario: Scenario::Tps,
                        common: with(&|c| c.duration = d),
                    },
                    Run {
                        label: "throughput",
                        scenario: Scenario::Throughput,
                        common: with(&|c| {
                            c.duration = d;
                            c.proto = Some(Proto::Http);
                        }),
                    },
                ]
            }
            _ => vec![Run {
                label: "rps",
                scenario: Scenario::Rps,
                common: with(&|c| {
                    c.proto = Some(Proto::Http);
                    c.connections = c.connections.or(Some(200));
                    c.duration = c.duration.or(Some(secs(if q { 5.0 } else { 30.0 })));
                    if c.wrk_threads.is_none() && crate::sys::which("wrk").is_some() {
                        c.wrk_threads = Some(c.load_threads);
                    }
                }),
            }],
        }
    }

    /// The published-vs-ours table (markdown), from the runs' reports.
    pub fn compare(&self, reports: &[(String, Report)]) -> String {
        let find = |run: &str, peer: &str, variant: &str| {
            reports
                .iter()
                .filter(|(label, _)| label.trim_end_matches('/') == run)
                .flat_map(|(_, r)| r.peers.iter())
                .find(|p| p.name == peer && p.variant == variant && p.skipped.is_none())
                .map(|p| (self.metric.of(p), p.requests_failed))
        };
        let base_pub = self.published.first().map_or(1.0, |p| p.value);
        let base_ours = self
            .published
            .first()
            .and_then(|p| find(p.run, p.peer.name(), p.variant))
            .map(|(v, _)| v);
        let unit = self.metric.unit();
        let mut s = format!(
            "# seed {}\n\n{}\n\nOurs: {}.\n\nCompared: {unit}, as a ratio to the first row's (published to published, ours to ours); absolute figures from another machine are not comparable.\n\n| published system | published result | published ratio | our stand-in | ours ({unit}) | failed | our ratio |\n|---|---|---|---|---|---|---|\n",
            self.name, self.title, self.scaled
        );
        let ratio = |v: Option<f64>, base: Option<f64>| match (v, base) {
            (Some(v), Some(b)) if b > 0.0 => format!("{:.3}", v / b),
            _ => "-".into(),
        };
        let mut shown = Vec::new();
        for p in self.published {
            let ours = find(p.run, p.peer.name(), p.variant);
            shown.push((p.run, p.peer.name(), p.variant));
            let _ = writeln!(
                s,
                "| {} | {} | {:.3} | {} {} {} | {} | {} | {} |",
                p.system,
                p.result,
                p.value / base_pub,
                p.peer.name(),
                p.run,
                p.variant,
                ours.map_or("not run".into(), |(v, _)| format!("{v:.1}")),
                ours.map_or("-".into(), |(_, f)| f.to_string()),
                ratio(ours.map(|(v, _)| v), base_ours)
            );
        }
        for p in self.published {
            for (_, r) in reports
                .iter()
                .filter(|(l, _)| l.trim_end_matches('/') == p.run)
            {
                for peer in r.peers.iter().filter(|x| x.variant == p.variant) {
                    let key = (p.run, peer.name.as_str(), p.variant);
                    if shown.contains(&key) {
                        continue;
                    }
                    shown.push(key);
                    let ours = find(p.run, &peer.name, p.variant);
                    let _ = writeln!(
                        s,
                        "| (not published) | | | {} {} {} | {} | {} | {} |",
                        peer.name,
                        p.run,
                        p.variant,
                        ours.map_or_else(
                            || peer.skipped.clone().unwrap_or_default(),
                            |(v, _)| format!("{v:.1}")
                        ),
                        ours.map_or("-".into(), |(_, f)| f.to_string()),
                        ratio(ours.map(|(v, _)| v), base_ours)
                    );
                }
            }
        }
        s
    }
}

/// How long to wait between a seed's runs (lets sockets in TIME_WAIT and peers' children
/// go).
pub const BETWEEN_RUNS: Duration = Duration::from_secs(1);

/// Runs every run of `seed` and writes, into `out`: one directory per run (its usual report
/// files), `seed.md` (published vs ours), `summary.md` (one row per peer per run) and
/// `index.html` (all of it on one page). Returns the published-vs-ours table for the terminal.
pub async fn run_and_write(
    seed: &Seed,
    c: &Common,
    out: &std::path::Path,
    started: &str,
) -> std::io::Result<String> {
    let mut reports: Vec<(String, Report)> = Vec::new();
    for run in seed.runs(c) {
        if !reports.is_empty() {
            tokio::time::sleep(BETWEEN_RUNS).await;
        }
        let mut r = run.scenario.run(&run.common).await;
        r.started_utc = started.to_string();
        r.command = format!("{} (seed {}, run {})", c.command, seed.name, run.label);
        crate::report::write_all(&out.join(run.label), &r)?;
        print!("\n{}", crate::report::terminal_table(&r, false));
        reports.push((format!("{}/", run.label), r));
    }
    let compared = seed.compare(&reports);
    std::fs::write(out.join("seed.md"), &compared)?;
    let refs: Vec<(String, &Report)> = reports.iter().map(|(l, r)| (l.clone(), r)).collect();
    std::fs::write(out.join("summary.md"), crate::report::html::summary(&refs))?;
    std::fs::write(
        out.join("index.html"),
        crate::report::html::index(
            &format!("sluice-bench seed {}", seed.name),
            &crate::report::html::markdown_tables(&compared),
            &refs,
        ),
    )?;
    Ok(compared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, variant: &str, rps: f64) -> PeerResult {
        PeerResult {
            name: name.into(),
            variant: variant.into(),
            achieved_rps: rps,
            ..PeerResult::default()
        }
    }

    #[test]
    fn ratios_are_to_the_first_row_on_each_side_and_unpublished_peers_are_listed() {
        let seed = find("community").copied();
        let Some(seed) = seed else {
            panic!("community seed")
        };
        let r = Report {
            scenario: "rps".into(),
            peers: vec![
                peer("direct", "http", 200_000.0),
                peer("nginx-reload", "http", 50_000.0),
                peer("sluice", "http", 100_000.0),
                PeerResult::skipped("traefik", "http", "traefik not built".into()),
            ],
            ..Report::default()
        };
        let table = seed.compare(&[("rps/".into(), r)]);
        let row = |start: &str| {
            table
                .lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_default()
                .to_string()
        };
        assert!(row("| direct to the backend").ends_with("| 200000.0 | 0 | 1.000 |"));
        // NGINX Inc: 37k / 212k published; 50k / 200k ours.
        let nginx = row("| NGINX Inc");
        assert!(
            nginx.contains("| 0.175 |") && nginx.ends_with("| 0.250 |"),
            "{nginx}"
        );
        assert!(row("| Traefik").contains("| not run |"));
        assert!(row("| ingress-nginx").contains("| not run |"));
        let ours = table
            .lines()
            .find(|l| l.contains("| sluice rps http |"))
            .unwrap_or_default();
        assert!(ours.ends_with("| 0.500 |"), "{table}");
        assert_eq!(table.matches("sluice rps http").count(), 1, "listed once");
    }

    #[test]
    fn every_seed_is_listed_and_found() {
        let list = list();
        for s in &SEEDS {
            assert!(list.contains(s.name));
            assert!(find(s.name).is_some());
        }
        assert!(find("nope").is_none());
    }
}
