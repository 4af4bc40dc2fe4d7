//! RBAC on the test bed: kube-controller-manager's ClusterRole aggregation
//! controller, which the test bed does not run by default, so that `view`,
//! `edit` and `admin` aggregate the ClusterRoles labelled for them.

use anyhow::{Result, ensure};

use crate::testbed::{Process, TestBed, tools_dir};

/// Starts the clusterrole-aggregation controller alone
/// (`integration/testbed/k8s/cmd/clusterrole-aggregation`), as admin, logging
/// to `logs/clusterrole-aggregation.log`. It stops when the [`Process`] drops.
pub fn start_clusterrole_aggregation(bed: &TestBed) -> Result<Process> {
    let binary = tools_dir().join("clusterrole-aggregation");
    ensure!(
        binary.is_file(),
        "{} is missing: run integration/testbed/build.sh",
        binary.display()
    );
    Process::spawn(
        "clusterrole-aggregation",
        &binary,
        [
            std::ffi::OsStr::new("--kubeconfig"),
            bed.kubeconfig().as_os_str(),
        ],
        &[],
        bed.root().join("logs/clusterrole-aggregation.log"),
    )
}
