//! `sluice serve`: the standalone provider. Objects come from manifest files, which are watched
//! (inotify via notify) and re-applied on every change without a restart.

mod kept;
pub mod yaml;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use notify::{RecursiveMode, Watcher};
use sluice_config::{Problem, TranslateOptions};
use sluice_proxy::{ApplyOutcome, DataPlane};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::app::{Defaults, Running, translate_options};
use crate::cli::ServeArgs;
use crate::serve::yaml::YamlSet;

/// Default addresses for standalone mode (unprivileged ports on loopback).
pub const DEFAULTS: Defaults = Defaults {
    http: "127.0.0.1:8080",
    https: "127.0.0.1:8443",
};

/// Quiet time that ends a burst of file events.
const QUIET: Duration = Duration::from_millis(15);
/// Longest a burst may delay an apply.
const MAX_DELAY: Duration = Duration::from_millis(150);

/// Loads, translates and applies; logs file errors and new problems.
#[derive(Debug)]
pub struct FileProvider {
    paths: Vec<PathBuf>,
    set: YamlSet,
    opts: TranslateOptions,
    dp: Arc<DataPlane>,
    reported: BTreeSet<Problem>,
    /// The pools of the snapshot last applied, for the endpoints fast path.
    pools: crate::endpoints::Pools,
    /// The Gateway API routes compiled by earlier reloads, reused while unchanged.
    memo: sluice_config::gateway::RouteMemo,
}

impl FileProvider {
    /// A provider for these paths.
    pub fn new(paths: Vec<PathBuf>, opts: TranslateOptions, dp: Arc<DataPlane>) -> Self {
        Self {
            paths,
            set: YamlSet::new(),
            opts,
            dp,
            reported: BTreeSet::new(),
            pools: crate::endpoints::Pools::default(),
            memo: sluice_config::gateway::RouteMemo::new(),
        }
    }

    /// Re-reads the files and applies the result. File errors keep the file's last good objects.
    /// A change of EndpointSlices alone swaps the endpoints of the pools of the Services it
    /// touched (no translation), as the controller's fast path does.
    pub fn reload(&mut self) -> anyhow::Result<ApplyOutcome> {
        let seen = Instant::now();
        let r = self
            .set
            .reload(&self.paths)
            .context("reading --manifests")?;
        for e in &r.errors {
            tracing::error!(file = %e.path, document = e.doc, field = %e.field, problem = %e.message, "manifest rejected; keeping its last good objects");
        }
        for w in &r.warnings {
            tracing::warn!(file = %w.path, document = w.doc, field = %w.field, "{}", w.message);
        }
        self.dp.set_source_problems(
            self.set
                .problems()
                .iter()
                .map(ToString::to_string)
                .collect(),
        );
        if r.slices_only
            && !r.touched_services.is_empty()
            && r.errors.is_empty()
            && self.dp.current().is_some()
            && self.pools.swap(
                &self.dp,
                &self.set.endpoints_world(&r.touched_services),
                &r.touched_services,
                seen,
            )
        {
            return Ok(ApplyOutcome::Unchanged);
        }
        let read = seen.elapsed();
        let world = self.set.world();
        let translation =
            sluice_config::translate::translate_all_with(world, &self.opts, Some(&mut self.memo));
        // The rest of the translation (the Gateway API status) is dropped after the swap.
        let snapshot = translation.snapshot;
        let translated = seen.elapsed();
        let now: BTreeSet<Problem> = snapshot.problems().iter().cloned().collect();
        for p in now.difference(&self.reported) {
            tracing::warn!(object = %p.object, field = %p.field, reason = p.reason, "{}", p.message);
        }
        self.reported = now;
        let before = self.dp.current();
        let outcome = self.dp.apply(snapshot);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (applied, total) = (seen.elapsed() - translated, seen.elapsed());
        // After the swap: traffic does not wait for the fast path's index.
        if let Some(current) = self.dp.current() {
            self.pools.update(before.as_deref(), &current);
        }
        if let ApplyOutcome::Applied {
            generation,
            clusters_created,
            clusters_removed,
            endpoint_swaps,
        } = &outcome
        {
            tracing::info!(
                generation,
                clusters_created,
                clusters_removed,
                endpoint_swaps,
                read_ms = ms(read),
                translate_ms = ms(translated - read),
                apply_ms = ms(applied),
                total_ms = ms(total),
                "configuration applied"
            );
        }
        Ok(outcome)
    }
}

fn relevant(event_path: &Path, roots: &[PathBuf]) -> bool {
    roots
        .iter()
        .any(|r| event_path == r || event_path.starts_with(r))
}

/// A running standalone instance.
#[derive(Debug)]
pub struct Serving {
    /// Data plane and listeners.
    pub running: Running,
    watch_task: JoinHandle<()>,
    _watcher: notify::RecommendedWatcher,
    /// With `--handover`: where a successor asks this process to stop accepting.
    offer: Option<crate::handover::Offer>,
}

/// Starts `serve`: binds listeners, applies the files, and watches them.
pub async fn start(args: &ServeArgs) -> anyhow::Result<Serving> {
    let default_cert = match (&args.default_cert_file, &args.default_key_file) {
        (Some(c), Some(k)) => {
            let cert =
                std::fs::read(c).with_context(|| format!("--default-cert-file {}", c.display()))?;
            let key =
                std::fs::read(k).with_context(|| format!("--default-key-file {}", k.display()))?;
            Some(
                sluice_proxy::state::certs::load_pem(&cert, &key)
                    .context("--default-cert-file/--default-key-file")?,
            )
        }
        _ => None,
    };
    let mut taken = crate::handover::take_from(args.common.handover.as_deref()).await;
    let handed = taken
        .as_mut()
        .map(|t| std::mem::take(&mut t.sockets))
        .unwrap_or_default();
    let running = Running::start_with(&args.common, DEFAULTS, default_cert, handed).await?;
    let roots: Vec<PathBuf> = args
        .manifests
        .iter()
        .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        .collect();
    let mut opts = translate_options(&args.common);
    opts.gateway.ingress_listeners = running.listen_addrs();
    let mut provider = FileProvider::new(roots.clone(), opts, Arc::clone(&running.dp));
    provider.reload()?;

    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let filter_roots = roots.clone();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && !ev.kind.is_access()
            && ev.paths.iter().any(|p| relevant(p, &filter_roots))
        {
            let _ = tx.send(());
        }
    })
    .context("starting the file watcher")?;
    for r in &roots {
        // Watch a file's directory too, so editors that replace the file are seen.
        let (target, mode) = if r.is_dir() {
            (r.as_path(), RecursiveMode::Recursive)
        } else {
            (r.parent().unwrap_or(r), RecursiveMode::NonRecursive)
        };
        watcher
            .watch(target, mode)
            .with_context(|| format!("watching {}", target.display()))?;
    }
    let watch_task = tokio::spawn(async move {
        while rx.recv().await.is_some() {
            let seen = Instant::now();
            let deadline = seen + MAX_DELAY;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(QUIET.min(left), rx.recv()).await {
                    Ok(Some(())) if !left.is_zero() => continue,
                    Ok(None) => return,
                    _ => break,
                }
            }
            // On a blocking thread: a reload at 10,000 objects takes milliseconds of CPU, and
            // the worker this task runs on keeps serving its connections meanwhile (with one
            // worker, traffic would otherwise wait for the whole reload, not just the swap).
            let (back, outcome) = match tokio::task::spawn_blocking(move || {
                let outcome = provider.reload();
                (provider, outcome)
            })
            .await
            {
                Ok(done) => done,
                Err(e) => {
                    tracing::error!(error = %e, "the reload task failed; files are no longer watched");
                    return;
                }
            };
            provider = back;
            match outcome {
                Ok(ApplyOutcome::Applied { .. }) => provider.dp.record_propagation(seen),
                Ok(ApplyOutcome::Unchanged) => {}
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "reload failed; keeping the current configuration")
                }
            }
        }
    });
    // The first snapshot is applied: a predecessor may stop accepting now.
    let offer =
        crate::handover::settle_when_ready(taken, Arc::clone(&running.dp), running.sockets()).await;
    Ok(Serving {
        running,
        watch_task,
        _watcher: watcher,
        offer,
    })
}

impl Serving {
    /// Stops watching and drains.
    pub async fn shutdown(self, deadline: Duration) -> bool {
        self.watch_task.abort();
        self.running.shutdown(deadline).await
    }

    /// Resolves when a successor (`--handover`) asks this process to stop accepting.
    pub async fn handover_requested(&mut self) -> crate::handover::StoppedAccepting {
        crate::handover::requested(self.offer.as_mut()).await
    }
}

/// Runs `serve` until SIGTERM/SIGINT, or until a successor took the sockets over.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut serving = start(&args).await?;
    tokio::select! {
        () = crate::app::termination() => {
            tracing::info!("shutdown requested");
            // A successor that asks from now on hears at once that this process stops.
            serving.offer = None;
        }
        ack = serving.handover_requested() => {
            tracing::info!("a successor serves on these sockets: draining");
            serving.running.hand_over(ack);
        }
    };
    // A SIGTERM from here on changes nothing: the drain below is already the shutdown.
    serving.shutdown(args.common.shutdown_deadline()).await;
    Ok(())
}
