//! `sluice controller`: Kubernetes mode. Reflectors feed one rebuild loop that drives the same
//! data plane as `serve`; the elected leader writes Ingress status and Events. All replicas serve.

pub mod events;
pub mod gateway_status;
pub mod gateway_watch;
pub mod leader;
pub mod rebuild;
pub mod status;
pub mod watch;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use kube::Client;
use tokio::sync::{mpsc, watch as wch};
use tokio::task::JoinHandle;

use crate::app::{Defaults, Running, translate_options};
use crate::cli::ControllerArgs;
use leader::{Elector, KubeLeases, Timing};
use rebuild::{Published, Rebuilder, problem_set};
use status::AddressSource;

/// Default addresses in a cluster.
pub const DEFAULTS: Defaults = Defaults {
    http: "0.0.0.0:80",
    https: "0.0.0.0:443",
};

/// A running controller.
#[derive(Debug)]
pub struct Controlling {
    /// Data plane and listeners.
    pub running: Running,
    /// Whether this instance leads.
    pub leader: wch::Receiver<bool>,
    /// What the rebuild loop last published.
    pub published: wch::Receiver<Published>,
    stop: wch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    elector: JoinHandle<()>,
    /// With `--handover`: what the predecessor handed over, until this instance is ready.
    taken: Option<crate::handover::Taken>,
    elect_now: std::sync::Arc<tokio::sync::Notify>,
}

/// This instance's identity for leader election.
pub fn identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("sluice-{}-{:08x}", std::process::id(), fastrand_u32()))
}

fn fastrand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) as u32
}

/// Starts the controller against `client`.
pub async fn start(
    args: &ControllerArgs,
    client: Client,
    identity: String,
    timing: Timing,
) -> anyhow::Result<Controlling> {
    let mut taken = crate::handover::take_from(args.common.handover.as_deref()).await;
    let handed = taken
        .as_mut()
        .map(|t| std::mem::take(&mut t.sockets))
        .unwrap_or_default();
    let running = Running::start_with(&args.common, DEFAULTS, None, handed).await?;
    let mut opts = translate_options(&args.common);
    opts.gateway = sluice_config::gateway::GatewayOptions {
        controller_name: args.gateway_controller_name.clone(),
        addresses: args.gateway_addresses.0.clone(),
        ingress_listeners: running.listen_addrs(),
        sticky: Default::default(),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let gateway_api = gateway_watch::served(&client).await;
    let grpc = gateway_api && gateway_watch::v1_served(&client, "grpcroutes").await;
    let tls = gateway_api && gateway_watch::v1_served(&client, "tlsroutes").await;
    if gateway_api {
        tracing::info!(
            grpc_routes = grpc,
            tls_routes = tls,
            "the API server serves the Gateway API: watching GatewayClasses, Gateways, HTTPRoutes, GRPCRoutes and TLSRoutes (when served) and ReferenceGrants"
        );
        gateway_watch::start(
            &client,
            args.common.watch_namespace.as_deref(),
            &tx,
            (grpc, tls),
        );
    } else {
        tracing::info!(
            "the API server does not serve the Gateway API (its CRDs are not installed): Ingresses only; restart sluice after installing them"
        );
    }
    let stores = watch::start(
        &client,
        args.common.watch_namespace.as_deref(),
        opts.configmap.as_ref(),
        tx,
    );
    let (published_tx, published) = wch::channel(Published::default());
    let (changed_tx, changed) = wch::channel(0u64);
    let rebuilder = Rebuilder::new(opts, running.dp.clone(), published_tx, changed_tx)
        .with_gateway_api(gateway_api)
        .with_route_kind(sluice_config::world::Kind::GrpcRoute, grpc)
        .with_route_kind(sluice_config::world::Kind::TlsRoute, tls);
    let mut tasks = vec![tokio::spawn(rebuild::run(rebuilder, rx))];

    let (leader_tx, leader) = wch::channel(false);
    let (stop, stop_rx) = wch::channel(false);
    let pod_ns = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty());
    let lease_ns = args
        .election_namespace
        .clone()
        .or_else(|| pod_ns.clone())
        .unwrap_or_else(|| "default".to_string());
    let elector = Elector::new(
        KubeLeases::new(client.clone(), &lease_ns, &args.election_id),
        &args.election_id,
        &identity,
        timing,
    );
    let elect_now = elector.nudge();
    let elector = tokio::spawn(elector.run(leader_tx, stop_rx));

    let src = if !args.publish_status_address.is_empty() {
        AddressSource::Fixed(args.publish_status_address.clone())
    } else if let (Some(namespace), Ok(pod)) = (pod_ns, std::env::var("POD_NAME")) {
        AddressSource::Nodes { namespace, pod }
    } else {
        AddressSource::None
    };
    tasks.push(tokio::spawn(status::run(
        client.clone(),
        stores.ingresses.clone(),
        published.clone(),
        src,
        leader.clone(),
        changed,
        Duration::from_secs(60),
    )));
    if gateway_api {
        tasks.push(tokio::spawn(gateway_status::run(
            client.clone(),
            published.clone(),
            leader.clone(),
        )));
    }
    tasks.push(tokio::spawn(report_problems(
        client,
        published.clone(),
        leader.clone(),
        identity,
    )));
    Ok(Controlling {
        running,
        leader,
        published,
        stop,
        tasks,
        elector,
        taken,
        elect_now,
    })
}

/// Logs every new problem on every replica; the leader also records it as an Event.
async fn report_problems(
    client: Client,
    mut published: wch::Receiver<Published>,
    leader: wch::Receiver<bool>,
    identity: String,
) {
    let mut seen = BTreeMap::new();
    let mut budget = events::EventBudget::default();
    while published.changed().await.is_ok() {
        let problems = published.borrow_and_update().problems.clone();
        let now = problem_set(&problems);
        let new: Vec<&sluice_config::Problem> = now
            .iter()
            .filter(|(k, _)| !seen.contains_key(*k))
            .map(|(_, p)| p)
            .collect();
        let at = tokio::time::Instant::now();
        budget.forget_idle(at);
        for p in events::to_send(&mut budget, &new, at) {
            tracing::warn!(object = %p.object, field = %p.field, reason = p.reason, "{}", p.message);
            if *leader.borrow() {
                status::emit_event(&client, &p, &identity).await;
            }
        }
        seen = now;
    }
}

impl Controlling {
    /// Releases leadership (first: a successor that took the sockets over takes the lease at
    /// once), stops the loops and drains the listeners.
    pub async fn shutdown(self, deadline: Duration) -> bool {
        // The status writers first: none of them may write once the lease is released (a
        // successor may hold it by then).
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.elector).await;
        self.running.shutdown(deadline).await
    }

    /// With `--handover`: once this instance is ready, tells the predecessor to stop (it
    /// releases the lease as it does) and makes an election attempt at once, so leadership
    /// and status writing move without waiting a retry period. Then offers this instance's
    /// sockets to its own successor. `None` without `--handover`.
    pub async fn settle_handover(&mut self) -> Option<crate::handover::Offer> {
        let had_predecessor = self
            .taken
            .as_ref()
            .is_some_and(crate::handover::Taken::from_predecessor);
        let offer = crate::handover::settle_when_ready(
            self.taken.take(),
            std::sync::Arc::clone(&self.running.dp),
            self.running.sockets(),
        )
        .await;
        if had_predecessor {
            self.elect_now.notify_one();
        }
        offer
    }

    /// Stops abruptly without releasing the lease (a crashed replica).
    pub fn kill(self) {
        self.elector.abort();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Connects to the API server (KUBECONFIG, or in-cluster) and runs until SIGTERM/SIGINT.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("finding the Kubernetes API server (set KUBECONFIG, or run in a pod)")?;
    tracing::info!(server = %config.cluster_url, "using the Kubernetes API server");
    let client = Client::try_from(config).context("creating the Kubernetes client")?;
    let mut c = start(&args, client, identity(), Timing::default()).await?;
    let terminated = crate::app::termination();
    tokio::pin!(terminated);
    // Ready (every kind listed, the first snapshot applied): the predecessor may stop.
    let mut offer = tokio::select! {
        () = &mut terminated => None,
        o = c.settle_handover() => o,
    };
    tokio::select! {
        () = &mut terminated => {
            tracing::info!("shutdown requested");
            // A successor that asks from now on hears at once that this process stops.
            drop(offer.take());
        }
        ack = crate::handover::requested(offer.as_mut()) => {
            tracing::info!("a successor serves on these sockets: releasing the lease and draining");
            c.running.hand_over(ack);
        }
    };
    c.shutdown(args.common.shutdown_deadline()).await;
    Ok(())
}
