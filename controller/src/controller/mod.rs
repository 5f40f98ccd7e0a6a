//! `sluice controller`: Kubernetes mode.

use crate::cli::ControllerArgs;

/// Runs the controller until SIGTERM.
pub async fn run(_args: ControllerArgs) -> anyhow::Result<()> {
    anyhow::bail!("controller mode is under construction in this build; use `sluice serve`")
}
