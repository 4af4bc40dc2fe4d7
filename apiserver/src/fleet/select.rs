//! Which machines a ManagedOSImage selects.
//!
//! The operator copies `spec.clusterTargets` into a fleet Bundle in the
//! ManagedOSImage's namespace (in `fleet-local`: the single target
//! `clusterName: local`), and the Bundle carries a system-upgrade-controller
//! Plan whose `nodeSelector` is `spec.nodeSelector`
//! (`controllers/managedosimage_controller.go`). Fleet evaluates the targets
//! against the fleet Clusters of that namespace: a cluster is selected when
//! any target matches it, and within a target the criteria that are set
//! (`clusterName`, `clusterSelector`, `clusterGroup`,
//! `clusterGroupSelector`) must all match; a null selector is no criterion,
//! `{}` matches everything.
//!
//! A MachineInventory is linked to its cluster through the
//! MachineInventorySelector that adopted it (its controller owner) and the
//! `cluster.x-k8s.io/cluster-name` label CAPI puts on that selector. The fleet
//! Cluster is taken to have that name (Rancher names a provisioned cluster's
//! fleet Cluster after it). Fleet Cluster labels and ClusterGroups are only
//! used when the caller has them ([`Fleet`]); otherwise a target that needs
//! them is undecided, never guessed.
//!
//! The node selector is evaluated against the MachineInventory's labels (as
//! the reflector keeps them, [`Labels`]): the
//! operator's bootstrap plan registers the node with every inventory label
//! (`node-label+`, `controllers/machineselector_controller.go`). Labels a node
//! gains otherwise are not seen.

use std::collections::BTreeMap;

use elemental_changelog_apiservice::fleet::SelectionReason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use super::crd::{ClusterTarget, FLEET_LOCAL_NAMESPACE, MachineInventory, ManagedOSImage};
use super::labels::Labels;

/// A fleet Cluster (`clusters.fleet.cattle.io`): name and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetCluster {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// A fleet ClusterGroup (`clustergroups.fleet.cattle.io`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetClusterGroup {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels (what `clusterGroupSelector` matches).
    pub labels: BTreeMap<String, String>,
    /// `spec.selector` over the labels of the Clusters of the namespace.
    pub selector: Option<LabelSelector>,
}

/// The fleet objects the caller knows. `None`: not watched, so targets that
/// need them are undecided.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fleet<'a> {
    /// Fleet Clusters.
    pub clusters: Option<&'a [FleetCluster]>,
    /// Fleet ClusterGroups.
    pub groups: Option<&'a [FleetClusterGroup]>,
}

/// Whether a ManagedOSImage (or one of its targets) selects a machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Selected.
    Selected,
    /// Not selected.
    NotSelected,
    /// Cannot be decided from what is known.
    Undecided {
        /// Why.
        reason: SelectionReason,
        /// Detail.
        message: String,
    },
}

fn undecided(reason: SelectionReason, message: impl Into<String>) -> Selection {
    Selection::Undecided {
        reason,
        message: message.into(),
    }
}

/// What a label selector is evaluated against: labels, read by key.
pub trait Labeled {
    /// The value of the label `key`.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labeled for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labeled for Labels {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

/// Evaluates a label selector; `Err` names an operator it does not know.
pub fn selector_matches(selector: &LabelSelector, labels: &impl Labeled) -> Result<bool, String> {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.label(k) == Some(v.as_str()));
    let mut ok = labels_ok;
    for e in selector.match_expressions.iter().flatten() {
        let value = labels.label(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        let listed = |v: &str| values.iter().any(|listed| listed == v);
        let m = match e.operator.as_str() {
            "In" => value.is_some_and(listed),
            "NotIn" => value.is_none_or(|v| !listed(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => return Err(format!("unknown selector operator {other:?}")),
        };
        ok &= m;
    }
    Ok(ok)
}

fn is_empty(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
}

fn set(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// Why a target cannot be evaluated whatever the machine, if it cannot:
/// it sets no criterion, or needs fleet objects the caller does not have, or
/// holds an invalid selector.
pub fn target_issue(target: &ClusterTarget, fleet: Fleet<'_>) -> Option<(SelectionReason, String)> {
    let group = set(&target.cluster_group).is_some() || target.cluster_group_selector.is_some();
    if set(&target.cluster_name).is_none() && target.cluster_selector.is_none() && !group {
        return Some((
            SelectionReason::EmptyTarget,
            "the target sets none of clusterName, clusterSelector, clusterGroup, clusterGroupSelector".to_owned(),
        ));
    }
    for s in [&target.cluster_selector, &target.cluster_group_selector]
        .into_iter()
        .flatten()
    {
        if let Err(e) = selector_matches(s, &Labels::default()) {
            return Some((SelectionReason::InvalidSelector, e));
        }
    }
    if group && fleet.groups.is_none() {
        return Some((
            SelectionReason::ClusterGroupUnknown,
            "the target selects fleet ClusterGroups, which this server does not read".to_owned(),
        ));
    }
    if (target.cluster_selector.is_some() || group) && fleet.clusters.is_none() {
        return Some((
            SelectionReason::ClusterLabelsUnknown,
            "the target selects fleet Clusters by label, which this server does not read"
                .to_owned(),
        ));
    }
    None
}

/// Whether one target selects `cluster` of `namespace`.
pub fn target_selects(
    target: &ClusterTarget,
    namespace: &str,
    cluster: Option<&str>,
    fleet: Fleet<'_>,
) -> Selection {
    // A criterion that decides "no" wins over one that cannot be decided.
    if let (Some(want), Some(have)) = (set(&target.cluster_name), cluster)
        && want != have
    {
        return Selection::NotSelected;
    }
    if let Some((reason, message)) = target_issue(target, fleet) {
        return undecided(reason, message);
    }
    let Some(cluster) = cluster else {
        return undecided(
            SelectionReason::ClusterUnknown,
            "the machine is not linked to a cluster (no MachineInventorySelector owner with a cluster.x-k8s.io/cluster-name label)",
        );
    };
    let group = set(&target.cluster_group).is_some() || target.cluster_group_selector.is_some();
    if target.cluster_selector.is_none() && !group {
        // clusterName only, and it matched.
        return Selection::Selected;
    }
    let Some(labels) = fleet
        .clusters
        .into_iter()
        .flatten()
        .find(|c| c.namespace == namespace && c.name == cluster)
        .map(|c| &c.labels)
    else {
        return undecided(
            SelectionReason::ClusterLabelsUnknown,
            format!("no fleet Cluster {namespace}/{cluster} is known"),
        );
    };
    let mut selected = true;
    if let Some(s) = &target.cluster_selector {
        match selector_matches(s, labels) {
            Ok(m) => selected &= m,
            Err(e) => return undecided(SelectionReason::InvalidSelector, e),
        }
    }
    if group {
        let mut member_of = Vec::new();
        for g in fleet.groups.into_iter().flatten() {
            if g.namespace != namespace {
                continue;
            }
            // A group without a selector holds no cluster.
            let Some(sel) = &g.selector else { continue };
            match selector_matches(sel, labels) {
                Ok(true) => member_of.push(g),
                Ok(false) => {}
                Err(e) => return undecided(SelectionReason::InvalidSelector, e),
            }
        }
        if let Some(name) = set(&target.cluster_group) {
            selected &= member_of.iter().any(|g| g.name == name);
        }
        if let Some(s) = &target.cluster_group_selector {
            let mut any = false;
            for g in &member_of {
                match selector_matches(s, &g.labels) {
                    Ok(m) => any |= m,
                    Err(e) => return undecided(SelectionReason::InvalidSelector, e),
                }
            }
            selected &= any;
        }
    }
    if selected {
        Selection::Selected
    } else {
        Selection::NotSelected
    }
}

/// Whether a ManagedOSImage selects a machine whose cluster is `cluster`.
pub fn image_selects(
    image: &ManagedOSImage,
    machine: &MachineInventory,
    cluster: Option<&str>,
    fleet: Fleet<'_>,
) -> Selection {
    let namespace = machine.namespace().unwrap_or_default();
    if image.namespace().unwrap_or_default() != namespace {
        return Selection::NotSelected;
    }
    if let Some(oversize) = &image.spec.oversize {
        return undecided(
            SelectionReason::ManagedOSImageTooLarge,
            format!("the ManagedOSImage is not kept: {oversize}"),
        );
    }
    let clusters = if namespace == FLEET_LOCAL_NAMESPACE {
        // The bundle targets `local`, the only cluster of fleet-local.
        Selection::Selected
    } else {
        let mut first_undecided = None;
        let mut any = false;
        for t in &image.spec.cluster_targets {
            match target_selects(t, &namespace, cluster, fleet) {
                Selection::Selected => {
                    any = true;
                    break;
                }
                Selection::NotSelected => {}
                u @ Selection::Undecided { .. } => {
                    first_undecided.get_or_insert(u);
                }
            }
        }
        if any {
            Selection::Selected
        } else {
            first_undecided.unwrap_or(Selection::NotSelected)
        }
    };
    if clusters != Selection::Selected {
        return clusters;
    }
    match &image.spec.node_selector {
        None => Selection::Selected,
        Some(s) if is_empty(s) => Selection::Selected,
        Some(s) => match selector_matches(s, &machine.spec.labels) {
            Ok(true) => Selection::Selected,
            Ok(false) => Selection::NotSelected,
            Err(e) => undecided(SelectionReason::InvalidSelector, e),
        },
    }
}
