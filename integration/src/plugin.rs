//! `kubectl elemental` run as a user runs it, with the test bed's admin kubeconfig.

use anyhow::{Context as _, Result, ensure};

use crate::testbed::{TestBed, workspace_root};

/// The plugin's stdout for `args`; fails unless it succeeds. The binary is
/// `KUBECTL_ELEMENTAL_BIN`, else `target/debug/kubectl-elemental`.
pub fn kubectl_elemental(bed: &TestBed, args: &[&str]) -> Result<String> {
    let binary = std::env::var_os("KUBECTL_ELEMENTAL_BIN").map_or_else(
        || workspace_root().join("target/debug/kubectl-elemental"),
        Into::into,
    );
    let out = std::process::Command::new(&binary)
        .arg("--kubeconfig")
        .arg(bed.kubeconfig())
        .args(args)
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    ensure!(
        out.status.success(),
        "kubectl elemental {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
