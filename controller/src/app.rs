//! Wiring shared by `serve` and `controller`: settings from flags, the data plane, listeners,
//! the admin API, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use sluice_config::translate::HostOwnership;
use sluice_config::{BalancePolicy, ObjectRef, Settings, TranslateOptions};
use sluice_proxy::server::sockets::{ListenerSet, Role};
use sluice_proxy::server::tls::TlsOptions;
use sluice_proxy::state::certs::LoadedCert;
use sluice_proxy::upstream::pool::UpstreamSettings;
use sluice_proxy::upstream::tls::UpstreamTls;
use sluice_proxy::{DataPlane, ProxySettings, Server, ServerOptions};
use tokio::task::JoinHandle;

use crate::cli::{AdminExpose, Balance, CommonArgs, HostOwnershipArg, LogFormat, listen_addr};

/// Default listen addresses for a mode.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// Plain HTTP.
    pub http: &'static str,
    /// HTTPS.
    pub https: &'static str,
}

/// Parses `NAMESPACE/NAME`.
pub fn parse_object_ref(kind: &'static str, v: &str) -> anyhow::Result<ObjectRef> {
    match v.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ObjectRef::new(kind, ns, name))
        }
        _ => bail!("{v:?} is not NAMESPACE/NAME"),
    }
}

/// Translation options from flags.
pub fn translate_options(c: &CommonArgs) -> TranslateOptions {
    TranslateOptions {
        controller_name: c.controller_name.clone(),
        ingress_class: c.ingress_class.clone(),
        watch_namespace: c.watch_namespace.clone(),
        settings: Settings {
            balance: match (&c.upstream_hash_by, c.balance) {
                (Some(key), _) => BalancePolicy::Hash(key.clone()),
                (None, Balance::LeastRequest) => BalancePolicy::LeastRequest,
                (None, Balance::Ewma) => BalancePolicy::PeakEwma,
                (None, Balance::RoundRobin) => BalancePolicy::RoundRobin,
            },
            ssl_redirect: c.ssl_redirect,
            max_in_flight: (c.upstream_max_connections > 0).then_some(c.upstream_max_connections),
            auth_url_allow: c.auth_url_allow.clone(),
            ..Settings::default()
        },
        configmap: c
            .configmap
            .as_deref()
            .and_then(|v| parse_object_ref("ConfigMap", v).ok()),
        ssl_passthrough: c.enable_ssl_passthrough,
        default_certificate: c
            .default_ssl_certificate
            .as_deref()
            .and_then(|v| parse_object_ref("Secret", v).ok()),
        host_ownership: match c.host_ownership {
            HostOwnershipArg::Shared => HostOwnership::Shared,
            HostOwnershipArg::Namespace => HostOwnership::Namespace,
        },
        gateway: sluice_config::gateway::GatewayOptions::default(),
    }
}

/// A running data plane with its listeners.
#[derive(Debug)]
pub struct Running {
    /// The data plane.
    pub dp: Arc<DataPlane>,
    /// Bound plain-HTTP address.
    pub http_addr: Option<SocketAddr>,
    /// Bound HTTPS address.
    pub https_addr: Option<SocketAddr>,
    /// Bound admin address.
    pub admin_addr: SocketAddr,
    server: Server,
    admin: JoinHandle<()>,
    handed_over: Option<crate::handover::StoppedAccepting>,
}

impl Running {
    /// Starts the data plane and binds every listener. Fails clearly on bad flags or ports.
    pub async fn start(
        c: &CommonArgs,
        defaults: Defaults,
        default_cert: Option<LoadedCert>,
    ) -> anyhow::Result<Self> {
        Self::start_with(c, defaults, default_cert, Vec::new()).await
    }

    /// [`start`](Self::start), listening on the sockets a predecessor handed over where their
    /// role and address are the ones asked for (`--handover`); the rest are bound.
    pub async fn start_with(
        c: &CommonArgs,
        defaults: Defaults,
        default_cert: Option<LoadedCert>,
        handed_over: Vec<(Role, std::net::TcpListener)>,
    ) -> anyhow::Result<Self> {
        sluice_proxy::crypto::install_default_provider();
        let http = listen_addr(c.http_listen.as_deref(), defaults.http)
            .map_err(anyhow::Error::msg)
            .context("--http-listen")?;
        let https = listen_addr(c.https_listen.as_deref(), defaults.https)
            .map_err(anyhow::Error::msg)
            .context("--https-listen")?;
        let default_certificate = c
            .default_ssl_certificate
            .as_deref()
            .map(|v| parse_object_ref("Secret", v))
            .transpose()
            .context("--default-ssl-certificate")?;
        if let Some(v) = c.configmap.as_deref() {
            parse_object_ref("ConfigMap", v).context("--configmap")?;
        }
        let tls_client = match &c.upstream_ca_file {
            None => UpstreamTls::default(),
            Some(p) => {
                let pem = std::fs::read(p)
                    .with_context(|| format!("--upstream-ca-file {}", p.display()))?;
                UpstreamTls::with_ca(&pem)
                    .with_context(|| format!("--upstream-ca-file {}", p.display()))?
            }
        };
        let settings = ProxySettings {
            request_timeout: Duration::from_secs(c.request_timeout.max(1)),
            max_body_size: c.max_body_size,
            upstream_tries: c.upstream_tries.max(1),
            https_port: https.map_or(443, |a| a.port()),
            upstream: UpstreamSettings {
                connect_timeout: Duration::from_millis(c.upstream_connect_timeout_ms.max(1)),
                idle_timeout: Duration::from_secs(c.upstream_idle_timeout),
                read_timeout: Duration::from_secs(c.upstream_read_timeout.max(1)),
                tls: tls_client,
                ..UpstreamSettings::default()
            },
            default_certificate,
            trusted_proxies: c.trusted_proxies.0.clone(),
            tunnel_idle_timeout: Duration::from_secs(c.tunnel_idle_timeout.max(1)),
            allowed_upgrades: c
                .allowed_upgrades
                .iter()
                .map(|u| u.trim().to_ascii_lowercase())
                .filter(|u| !u.is_empty())
                .collect(),
            limit_status: c.limit_req_status_code,
            access_log: c.access_log.then_some(match c.log_format {
                LogFormat::Text => sluice_proxy::telemetry::access_log::Format::Text,
                LogFormat::Json => sluice_proxy::telemetry::access_log::Format::Json,
            }),
        };
        let dp =
            DataPlane::new(settings, default_cert).context("creating the default certificate")?;
        let opts = ServerOptions {
            http2: c.http2,
            header_read_timeout: Duration::from_secs(c.header_read_timeout.max(1)),
            max_header_size: c.max_header_size,
            max_connections: c.max_connections.max(1),
            client_idle_timeout: Duration::from_secs(c.client_idle_timeout.max(1)),
            client_send_timeout: Duration::from_secs(c.client_send_timeout.max(1)),
            proxy_protocol: c.proxy_protocol,
            ssl_passthrough: c.enable_ssl_passthrough,
            fast_path: c.fast_path,
            // A handed-over socket's queue is the predecessor's to serve until this process
            // has its routes.
            accept_after_first_snapshot: c.handover.is_some(),
            ..ServerOptions::default()
        };
        let mut server = Server::new(Arc::clone(&dp), opts);
        let sockets = Arc::clone(server.sockets());
        for (role, l) in handed_over {
            sockets
                .inherit(role, l)
                .context("a socket handed over by the predecessor")?;
        }
        let bind = sluice_proxy::server::listener::bind;
        let admin_listener = sockets
            .listen(Role::Admin, c.admin_listen, bind)
            .with_context(|| format!("binding --admin-listen {}", c.admin_listen))?;
        let admin_addr = admin_listener.local_addr()?;
        let admin_opts = sluice_proxy::admin::AdminOptions {
            expose_metrics: c.admin_expose.contains(&AdminExpose::Metrics),
            expose_api: c.admin_expose.contains(&AdminExpose::Api),
            ..Default::default()
        };
        let admin = tokio::spawn(sluice_proxy::admin::serve(
            admin_listener,
            Arc::clone(&dp),
            admin_opts,
        ));
        let mut http_addr = None;
        if let Some(a) = http {
            let l = sockets.listen(Role::Http, a, bind).with_context(|| {
                format!(
                    "binding --http-listen {a} (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
                )
            })?;
            http_addr = Some(l.local_addr()?);
            server.serve(l, None);
        }
        let mut https_addr = None;
        if let Some(a) = https {
            let l = sockets.listen(Role::Https, a, bind).with_context(|| format!("binding --https-listen {a} (ports below 1024 need root or CAP_NET_BIND_SERVICE)"))?;
            let bound = l.local_addr()?;
            dp.set_https_port(bound.port());
            https_addr = Some(bound);
            let cfg = sluice_proxy::server::tls::server_config(
                dp.cert_store(),
                &TlsOptions {
                    http2: c.http2,
                    session_resumption: c.tls_session_resumption,
                },
            )
            .context("TLS configuration")?;
            server.serve(l, Some(tokio_rustls::TlsAcceptor::from(cfg)));
        }
        if http_addr.is_none() && https_addr.is_none() {
            bail!("both --http-listen and --https-listen are off: nothing to serve");
        }
        // The Gateway API's sockets, opened and closed as snapshots ask.
        tokio::spawn(sluice_proxy::server::gateway::run(
            server.gateway_handle(),
            TlsOptions {
                http2: c.http2,
                session_resumption: c.tls_session_resumption,
            },
        ));
        // A handed-over Ingress or admin socket this configuration does not use closes now.
        sockets.drop_unclaimed(|r| !matches!(r, Role::Gateway { .. }));
        let shown = |a: Option<SocketAddr>| a.map_or_else(|| "off".to_string(), |a| a.to_string());
        tracing::info!(http = %shown(http_addr), https = %shown(https_addr), admin = %admin_addr, "listening");
        Ok(Self {
            dp,
            http_addr,
            https_addr,
            admin_addr,
            server,
            admin,
            handed_over: None,
        })
    }

    /// Where the Ingress listeners are bound (a Gateway listener may not take their ports).
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        self.http_addr.into_iter().chain(self.https_addr).collect()
    }

    /// The listening sockets (for `--handover`).
    pub fn sockets(&self) -> Arc<ListenerSet> {
        Arc::clone(self.server.sockets())
    }

    /// A successor took the sockets over (`--handover`): the next [`shutdown`](Self::shutdown)
    /// stops the admin listener at once with the others (the successor answers the probes
    /// now) and tells the successor when nothing here accepts any more.
    pub fn hand_over(&mut self, ack: crate::handover::StoppedAccepting) {
        self.handed_over = Some(ack);
    }

    /// Drains and stops: readiness false, listeners closed, connections finish within `deadline`.
    pub async fn shutdown(self, deadline: Duration) -> bool {
        let handed_over = self.handed_over;
        let admin = self.admin;
        let done = self
            .server
            .shutdown_then(deadline, || {
                if let Some(ack) = handed_over {
                    admin.abort();
                    ack.done();
                }
            })
            .await;
        admin.abort();
        if self.dp.access_log().is_some() {
            let dp = Arc::clone(&self.dp);
            let _ = tokio::task::spawn_blocking(move || {
                if let Some(log) = dp.access_log() {
                    log.flush(Duration::from_secs(1));
                }
            })
            .await;
        }
        if done {
            tracing::info!("all connections finished");
        } else {
            tracing::warn!(
                ?deadline,
                "shutdown deadline passed with connections still open"
            );
        }
        done
    }
}

/// Resolves when SIGTERM or SIGINT arrives. SIGTERM's handler is installed when this is
/// called, not when first polled, and stays for the process's life: a SIGTERM that arrives
/// once a drain has begun for another reason (a successor took the sockets over) is ignored
/// instead of killing the process mid-drain.
pub fn termination() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
