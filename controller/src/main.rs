//! `sluice`: see `sluice --help`.
#![forbid(unsafe_code)]

use clap::Parser;
use sluice::cli::{Cli, Command};

/// jemalloc rather than glibc's malloc: an HTTP/2 request allocates several times (hyper and `h2`
/// box each stream, its frames and its task), and with jemalloc sluice served 7–10% more HTTP/2
/// requests per second on the same core, measured side by side (bench/README.md). Its peak RSS
/// at 10,000 Ingresses stayed level with glibc's; mimalloc, tried too, was as fast but 12% larger.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let common = match &cli.command {
        Command::Serve(a) => a.common.clone(),
        Command::Controller(a) => a.common.clone(),
        Command::Check(a) => return check(a),
        Command::PrepareHandover(a) => {
            return match sluice::handover::prepare_dir(&a.dir, &a.owner) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sluice: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
    };
    if let Err(e) = sluice::logging::init(common.log_format, &common.log_level) {
        eprintln!("sluice: {e:#}");
        return std::process::ExitCode::from(2);
    }
    let workers = common.workers.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |n| n.max(1),
    );
    // One worker: a current-thread runtime runs the same tasks without the work-stealing
    // scheduler's cross-thread bookkeeping (fewer instructions per request, measured).
    let mut rt = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    rt.enable_all().thread_name("sluice-worker");
    let rt = match rt.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Serve(a) => sluice::serve::run(a).await,
            Command::Controller(a) => sluice::kube::run(a).await,
            Command::Check(_) | Command::PrepareHandover(_) => Ok(()),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("sluice: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `sluice check`: a one-shot report on stdout, no logging set up, its own exit codes.
fn check(args: &sluice::check::CheckArgs) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout().lock();
    std::process::ExitCode::from(rt.block_on(sluice::check::run(args, &mut out)))
}
