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
    /// `None` for a process this one did not start (nginx's new master after a binary
    /// upgrade is its old master's child).
    child: Option<tokio::process::Child>,
    /// Process id of the peer's main (master) process.
    pub pid: u32,
    /// Where its stdout/stderr go.
    pub log: PathBuf,
    /// How it was started, to start it again.
    how: Command,
}

/// A command line, as a peer was started with it.
#[derive(Debug, Clone)]
struct Command {
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    env: Vec<(String, String)>,
    cpus: Option<String>,
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
        let how = Command {
            program: program.to_path_buf(),
            args: args.to_vec(),
            dir: dir.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.clone()))
                .collect(),
            cpus: cpus.map(str::to_string),
        };
        how.spawn("")
    }

    /// Starts the same command again, its output in a log file of its own (`-<suffix>`).
    pub fn respawn(&self, suffix: &str) -> Result<Self, SpawnError> {
        self.how.spawn(&format!("-{suffix}"))
    }

    /// The process `pid`, started by this one (not our child), with the same command.
    pub fn adopt(&self, pid: u32) -> Self {
        Self {
            child: None,
            pid,
            log: self.log.clone(),
            how: self.how.clone(),
        }
    }

    /// The exit status if the process has ended (an adopted one that is gone reads as 0).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        match &mut self.child {
            Some(c) => c.try_wait().ok().flatten(),
            None => {
                (!sys::alive(self.pid)).then(|| std::os::unix::process::ExitStatusExt::from_raw(0))
            }
        }
    }

    /// Waits up to `within` for the main process to exit; whether it did.
    pub async fn wait_exit(&mut self, within: Duration) -> bool {
        let end = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < end {
            if self.exited().is_some() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
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
        match &mut self.child {
            Some(c) => {
                let _ = tokio::time::timeout(grace, c.wait()).await;
            }
            None => {
                self.wait_exit(grace).await;
            }
        }
        let mut left = before;
        left.extend(sys::tree(self.pid));
        for p in left {
            if sys::alive(p) {
                sys::signal(p, Signal::SIGKILL);
            }
        }
        if let Some(c) = &mut self.child {
            let _ = c.kill().await;
        }
    }
}

impl Command {
    fn spawn(&self, suffix: &str) -> Result<Proc, SpawnError> {
        let program = &self.program;
        let name = program
            .file_name()
            .map_or("peer".into(), |n| n.to_string_lossy().into_owned());
        let log = self.dir.join(format!("{name}{suffix}.log"));
        let err = |what: &str, source| SpawnError {
            what: format!("{what} {}", program.display()),
            source,
        };
        let out = std::fs::File::create(&log).map_err(|e| err("log file for", e))?;
        let out2 = out.try_clone().map_err(|e| err("log file for", e))?;
        let mut cmd = match (self.cpus.as_deref(), sys::which("taskset")) {
            (Some(c), Some(taskset)) => {
                let mut cmd = tokio::process::Command::new(taskset);
                cmd.arg("-c").arg(c).arg(program);
                cmd
            }
            _ => tokio::process::Command::new(program),
        };
        cmd.args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(out2))
            .kill_on_drop(true);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| err("starting", e))?;
        let pid = child.id().unwrap_or(0);
        Ok(Proc {
            child: Some(child),
            pid,
            log,
            how: self.clone(),
        })
    }
}

/// The last lines of a log file.
pub fn log_tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
