//! Replacing a peer's process under load, the way its users replace it (the `upgrade`
//! scenario): sluice by `--handover` (a new process takes the listening sockets over, the old
//! one drains; then the SIGTERM a kubelet sends the old pod), nginx by its binary upgrade
//! (USR2, WINCH, QUIT), HAProxy by its seamless reload (USR2 to the master-worker; the
//! listeners pass to the new worker through `expose-fd listeners`), Caddy and Traefik by a
//! restart (stop, start: what a `maxSurge: 0` rollout does to a hostNetwork pod).

use std::time::Duration;

use nix::sys::signal::Signal;

use super::{Peer, PeerError, PeerKind};

/// How long an old process may take to drain and exit after a handover or an upgrade.
const OLD_EXITS_WITHIN: Duration = Duration::from_secs(30);

impl Peer {
    /// Replaces the peer's process; returns how (for the report). The `n`th replacement's
    /// output goes to a log file of its own.
    pub async fn replace(&mut self, n: usize) -> Result<String, PeerError> {
        let Some(mut old) = self.proc.take() else {
            return Ok("nothing to replace".into());
        };
        let how = match self.kind {
            PeerKind::Sluice => {
                let new = match old.respawn(&n.to_string()) {
                    Ok(p) => p,
                    Err(e) => {
                        self.proc = Some(old);
                        return Err(e.into());
                    }
                };
                // The old one stops accepting once the new one serves, drains, and exits.
                let drained = old.wait_exit(OLD_EXITS_WITHIN).await;
                old.stop(Signal::SIGTERM, Duration::from_secs(3)).await;
                self.proc = Some(new);
                if !drained {
                    return Err(PeerError::Change(
                        "the old sluice did not hand over and exit within 30 s".into(),
                    ));
                }
                "handover (--handover): new process started, took the sockets, old one drained and exited; then SIGTERM to the old one"
            }
            PeerKind::NginxReload | PeerKind::NginxLua => {
                let pid_file = self.dir.path().join("nginx.pid");
                crate::sys::signal(old.pid, Signal::SIGUSR2);
                let new_pid = wait_new_pid(&pid_file, old.pid).await;
                let Some(new_pid) = new_pid else {
                    self.proc = Some(old);
                    return Err(PeerError::Change(
                        "nginx: no new master after USR2 within 10 s".into(),
                    ));
                };
                // The new master's workers serve beside the old ones; then the old ones stop.
                tokio::time::sleep(Duration::from_millis(500)).await;
                crate::sys::signal(old.pid, Signal::SIGWINCH);
                tokio::time::sleep(Duration::from_millis(500)).await;
                crate::sys::signal(old.pid, Signal::SIGQUIT);
                let exited = old.wait_exit(OLD_EXITS_WITHIN).await;
                self.proc = Some(old.adopt(new_pid));
                if !exited {
                    return Err(PeerError::Change(
                        "nginx: the old master did not exit within 30 s of QUIT".into(),
                    ));
                }
                "binary upgrade: USR2 (new master), WINCH (old workers stop), QUIT (old master)"
            }
            PeerKind::HaproxyReload | PeerKind::HaproxyRuntime => {
                crate::sys::signal(old.pid, Signal::SIGUSR2);
                self.proc = Some(old);
                if self
                    .settings
                    .get("upgrade")
                    .is_some_and(|v| v.contains("without"))
                {
                    "reload: USR2 to the master (master-worker; no expose-fd listeners: the new worker binds its own sockets)"
                } else {
                    "seamless reload: USR2 to the master (master-worker; listeners passed with expose-fd listeners)"
                }
            }
            PeerKind::Caddy | PeerKind::Traefik | PeerKind::Floor => {
                let again = old.respawn(&n.to_string());
                old.stop(Signal::SIGTERM, Duration::from_secs(5)).await;
                self.proc = Some(again?);
                self.wait_ready(Duration::from_secs(20)).await?;
                "restart: SIGTERM, wait for exit, start again"
            }
            PeerKind::Direct | PeerKind::SluiceApi | PeerKind::TraefikApi => {
                self.proc = Some(old);
                return Err(PeerError::Change(format!(
                    "{}: not replaced in this scenario",
                    self.kind.name()
                )));
            }
        };
        Ok(how.into())
    }
}

/// The pid nginx's new master writes to `pid_file` (the old one's becomes `.oldbin`).
async fn wait_new_pid(pid_file: &std::path::Path, old: u32) -> Option<u32> {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < end {
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|p| *p != old)
        {
            return Some(pid);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
