//! Child processes for peers: started pinned (taskset) in their own directory with output to a
//! log file, and stopped completely (the whole process tree: killing an nginx master alone
//! leaves its worker serving).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::sys;

/// A running peer process.
#[derive(Debug)]
pub struct Proc {
    child: tokio::process::Child,
    /// Process id of the peer's main (master) process.
    pub pid: u32,
    /// Where its stdout/stderr go.
    pub log: PathBuf,
}

/// Starting a process failed.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SpawnError {
    what: String,
    source: std::io::Error,
}

impl Proc {
    /// Starts `program args` in `dir`, pinned to `cpus` through taskset when given.
    pub fn spawn(
        program: &Path,
        args: &[String],
        dir: &Path,
        env: &[(&str, String)],
        cpus: Option<&str>,
    ) -> Result<Self, SpawnError> {
        let name = program
            .file_name()
            .map_or("peer".into(), |n| n.to_string_lossy().into_owned());
        let log = dir.join(format!("{name}.log"));
        let err = |what: &str, source| SpawnError {
            what: format!("{what} {}", program.display()),
            source,
        };
        let out = std::fs::File::create(&log).map_err(|e| err("log file for", e))?;
        let out2 = out.try_clone().map_err(|e| err("log file for", e))?;
        let mut cmd = match (cpus, sys::which("taskset")) {
            (Some(c), Some(taskset)) => {
                let mut cmd = tokio::process::Command::new(taskset);
                cmd.arg("-c").arg(c).arg(program);
                cmd
            }
            _ => tokio::process::Command::new(program),
        };
        cmd.args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(out2))
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| err("starting", e))?;
        let pid = child.id().unwrap_or(0);
        Ok(Self { child, pid, log })
    }

    /// The exit status if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines of the process's log (for error messages).
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Sends `sig`, waits up to `grace` for the main process to exit, then SIGKILLs whatever is
    /// left of the tree (workers included) and reaps the child.
    pub async fn stop(mut self, sig: Signal, grace: Duration) {
        let before = sys::tree(self.pid);
        sys::signal(self.pid, sig);
        let _ = tokio::time::timeout(grace, self.child.wait()).await;
        let mut left = before;
        left.extend(sys::tree(self.pid));
        for p in left {
            if sys::alive(p) {
                sys::signal(p, Signal::SIGKILL);
            }
        }
        let _ = self.child.kill().await;
    }
}

/// The last lines of a log file.
pub fn log_tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
