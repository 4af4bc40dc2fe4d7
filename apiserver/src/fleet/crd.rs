//! The elemental-operator's fleet objects, as far as this server reads them:
//! only the fields used are typed, everything else is ignored.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::{CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};

use super::{caps::Oversize, labels::Labels, os::Reported};

/// Label CAPI's Machine controller puts on a Machine's infrastructure object
/// (here the MachineInventorySelector): the name of its cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// The namespace whose ManagedOSImages target the Rancher cluster itself
/// (the operator's `fleetLocalNamespace`): their bundle targets `local`.
pub const FLEET_LOCAL_NAMESPACE: &str = "fleet-local";

/// `MachineInventory.spec`: nothing of it is read from the API. The fleet
/// reflector ([`trim_machine`](super::reflect::trim_machine)) fills it with
/// what the view reads of the machine's metadata, read once when the machine
/// is stored: its labels (moved out of `metadata.labels`, kept compactly),
/// the OS it reports (its `elemental.cattle.io/os.*` annotations) and the
/// MachineInventorySelector that adopted it (its controller owner reference);
/// the annotations and owner references themselves are not kept. Past a cap
/// it carries the [`Oversize`] marker instead of the labels and the report.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "elemental.cattle.io",
    version = "v1beta1",
    kind = "MachineInventory",
    namespaced,
    schema = "disabled"
)]
pub struct MachineInventorySpec {
    /// The machine's labels (what node selectors match and what an answer's
    /// `metadata.labels` shows); empty past a cap. `metadata.labels` of a
    /// stored machine is always empty. Never read from or written to the API.
    #[serde(skip)]
    pub labels: Labels,
    /// What the machine reports of its OS; empty past a cap. Never read from
    /// or written to the API.
    #[serde(skip)]
    pub reported: Reported,
    /// The name of the MachineInventorySelector that adopted the machine
    /// ([`controller_selector`] of its owner references). Never read from or
    /// written to the API.
    #[serde(skip)]
    pub selector: Option<Box<str>>,
    /// Set by the reflector when the machine's metadata passed a cap and was
    /// dropped; never read from or written to the API.
    #[serde(skip)]
    pub oversize: Option<Oversize>,
}

/// `MachineInventorySelector.spec`: nothing of it is read (the cluster label
/// is in `metadata`).
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "elemental.cattle.io",
    version = "v1beta1",
    kind = "MachineInventorySelector",
    namespaced,
    schema = "disabled"
)]
pub struct MachineInventorySelectorSpec {}

/// One entry of `ManagedOSImage.spec.clusterTargets` (a fleet `BundleTarget`;
/// the operator copies them into its Bundle's `targets`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTarget {
    /// Display name of the entry.
    #[serde(default)]
    pub name: Option<String>,
    /// A fleet Cluster by name.
    #[serde(default)]
    pub cluster_name: Option<String>,
    /// Fleet Clusters by label.
    #[serde(default)]
    pub cluster_selector: Option<LabelSelector>,
    /// A fleet ClusterGroup by name.
    #[serde(default)]
    pub cluster_group: Option<String>,
    /// Fleet ClusterGroups by label.
    #[serde(default)]
    pub cluster_group_selector: Option<LabelSelector>,
}

/// `ManagedOSImage.spec`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "elemental.cattle.io",
    version = "v1beta1",
    kind = "ManagedOSImage",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ManagedOSImageSpec {
    /// The image to install; wins over `managedOSVersionName` (the
    /// operator's `getImageVersion`).
    #[serde(default, rename = "osImage")]
    pub os_image: Option<String>,
    /// A ManagedOSVersion of the same namespace.
    #[serde(default, rename = "managedOSVersionName")]
    pub managed_os_version_name: Option<String>,
    /// The nodes of the selected clusters to upgrade (the upgrade Plan's
    /// `nodeSelector`); none: every node.
    #[serde(default)]
    pub node_selector: Option<LabelSelector>,
    /// The fleet clusters to upgrade.
    #[serde(default)]
    pub cluster_targets: Vec<ClusterTarget>,
    /// Set by the reflector when the object passed a cap (the fields above
    /// are then empty); never read from or written to the API.
    #[serde(skip)]
    pub oversize: Option<Oversize>,
}

impl MachineInventory {
    /// The MachineInventorySelector that adopted the machine, as the reflector
    /// kept it ([`MachineInventorySpec::selector`]).
    pub fn selector_name(&self) -> Option<&str> {
        self.spec.selector.as_deref()
    }
}

/// The MachineInventorySelector that adopted a machine, among its owner
/// references: the name of its controller reference of that kind.
pub fn controller_selector(owners: &[OwnerReference]) -> Option<&str> {
    owners
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == "MachineInventorySelector"
                && o.api_version.starts_with("elemental.cattle.io/")
        })
        .map(|o| o.name.as_str())
        .filter(|n| !n.is_empty())
}

impl MachineInventorySelector {
    /// The CAPI cluster the selector's Machine belongs to.
    pub fn cluster_name(&self) -> Option<&str> {
        self.labels()
            .get(CLUSTER_NAME_LABEL)
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }
}
