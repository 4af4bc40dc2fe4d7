//! kube-apiserver's audit log for a test bed: a policy written to a temporary directory, the
//! flags that turn it on (JSON, blocking, so an event is written before its answer), and the
//! log's path to read events from.

use std::path::{Path, PathBuf};

use anyhow::Result;
use tempfile::TempDir;

/// An audit policy and log in a directory that lives as long as this value.
#[derive(Debug)]
pub struct AuditLog {
    dir: TempDir,
    log: PathBuf,
}

impl AuditLog {
    /// Writes `policy` (an `audit.k8s.io/v1` Policy) to a new directory.
    pub fn new(policy: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("policy.yaml"), policy)?;
        let log = dir.path().join("audit.log");
        Ok(Self { dir, log })
    }

    /// kube-apiserver's flags for this policy and log (`TestBedOptions::apiserver_args`).
    pub fn apiserver_args(&self) -> Vec<String> {
        vec![
            format!(
                "--audit-policy-file={}",
                self.dir.path().join("policy.yaml").display()
            ),
            format!("--audit-log-path={}", self.log.display()),
            "--audit-log-format=json".to_owned(),
            "--audit-log-mode=blocking".to_owned(),
        ]
    }

    /// The log file (one JSON event a line).
    pub fn path(&self) -> &Path {
        &self.log
    }
}
