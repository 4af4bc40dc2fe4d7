//! The fleet view on the wire: what each registered machine runs, what it
//! would be upgraded to and what is pending between them
//! ([`MachineInventoryChangelogSummary`]), and the upgrade plan of a
//! `ManagedOSImage` ([`ManagedOSImageChangelog`]). A machine's changelog
//! (`machineinventories/{name}/changelog`) is a
//! [`ManagedOSVersionChangelog`](crate::types::ManagedOSVersionChangelog).

pub mod table;

use serde::{Deserialize, Serialize};

use crate::types::{
    ChangelogSummary, Display, DisplayState, ListMeta, ObjectMeta, PackagePresence, SummaryStatus,
    VersionRef,
};
use crate::{API_VERSION, IMAGE_CHANGELOG_KIND, MACHINE_SUMMARY_KIND, MACHINE_SUMMARY_LIST_KIND};

/// A ManagedOSVersion and its channel.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelVersion {
    /// ManagedOSVersion name.
    pub name: String,
    /// `spec.version`.
    pub version: String,
    /// Name of its ManagedOSVersionChannel.
    pub channel: String,
}

/// Where a machine's target comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetSource {
    /// A ManagedOSImage of the machine's namespace selects its cluster (and
    /// node) and names the version.
    ManagedOSImage,
    /// No ManagedOSImage could be worked out: the newest version of the
    /// channel of the machine's current version.
    #[default]
    NewestInChannel,
}

/// Why no ManagedOSImage gave the target, when one could have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetReason {
    /// Whether a ManagedOSImage selects the machine cannot be decided from
    /// the objects this server reads (cluster unknown, a selector over fleet
    /// Clusters or ClusterGroups, an invalid selector).
    ClusterUnresolved,
    /// ManagedOSImages selecting the machine name different versions.
    ManagedOSImagesDisagree,
    /// The ManagedOSImage selecting the machine names no version that can be
    /// resolved (no such ManagedOSVersion, an image no version has).
    ManagedOSImageUnresolved,
}

/// The version a machine would be upgraded to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineTarget {
    /// ManagedOSVersion name.
    pub name: String,
    /// `spec.version`.
    pub version: String,
    /// Its channel.
    pub channel: String,
    /// Where the target comes from.
    pub source: TargetSource,
    /// The ManagedOSImage that assigns it, when `source` is `ManagedOSImage`.
    #[serde(
        default,
        rename = "managedOSImage",
        skip_serializing_if = "Option::is_none"
    )]
    pub managed_os_image: Option<String>,
    /// Why the target is not from a ManagedOSImage although one could apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TargetReason>,
    /// Human-readable detail for `reason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Whether a machine has updates pending.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum MachineState {
    /// The machine runs its target (or a newer version of the same channel).
    UpToDate,
    /// The target differs from what the machine runs.
    UpdatesAvailable,
    /// The current version or the target cannot be resolved; `reason` says why.
    #[default]
    Unknown,
}

/// Why a machine is in its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MachineReason {
    /// The MachineInventory carries neither `elemental.cattle.io/os.image`
    /// nor `elemental.cattle.io/os.version`.
    NoAnnotation,
    /// `elemental.cattle.io/os.unmanaged: "true"`: the OS is not managed by
    /// Elemental.
    Unmanaged,
    /// No ManagedOSVersion of the namespace has the machine's image or version.
    VersionInNoChannel,
    /// Several ManagedOSVersions match the machine's image or version.
    Ambiguous,
    /// The channel's data (its version order) is not fetched yet.
    ChannelNotFetched,
    /// The target is older than the current version (a ManagedOSImage pins
    /// an older version): nothing newer is pending.
    TargetOlder,
    /// The target is in another channel than the current version: no
    /// changelog between them.
    OtherChannel,
    /// The MachineInventory's labels or a read `elemental.cattle.io/os.*`
    /// annotation pass the server's caps (value length, label count or
    /// bytes): its labels and annotations are not kept, so nothing of it is
    /// resolved.
    MetadataTooLarge,
}

/// What the machine reported about its OS (the operator's `os.*` annotations).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportedOs {
    /// `elemental.cattle.io/os.image` (`IMAGE` of `/etc/os-release`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `elemental.cattle.io/os.version` (`VERSION`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `elemental.cattle.io/os.pretty-name` (`PRETTY_NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretty_name: Option<String>,
}

/// A machine's exposure to one CVE (`?cve=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CveState {
    /// The current version is, or comes after, a version whose advisories fix it.
    Fixed,
    /// A newer version of the machine's channel fixes it (`fixedIn`: the first).
    Exposed,
    /// No version of the machine's channel fixes it.
    NoFixInChannel,
    /// The machine's current version (or its channel's order) is unknown.
    Unknown,
}

/// The `cve` block of a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineCve {
    /// The CVE asked for, as given.
    pub id: String,
    /// Exposure.
    pub state: CveState,
    /// The first version of the channel whose advisories fix it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_in: Option<VersionRef>,
}

/// `MachineInventoryChangelogSummary`: one registered machine, the version it
/// runs, its target and what is pending between them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineInventoryChangelogSummary {
    /// Always `changelog.elemental.cattle.io/v1beta1`.
    pub api_version: String,
    /// Always `MachineInventoryChangelogSummary`.
    pub kind: String,
    /// The MachineInventory described.
    pub metadata: ObjectMeta,
    /// What the machine reported.
    #[serde(default)]
    pub os: ReportedOs,
    /// The ManagedOSVersion the machine runs, when resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<ChannelVersion>,
    /// The version it would be upgraded to, when resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<MachineTarget>,
    /// Whether updates are pending.
    pub state: MachineState,
    /// Why, when the state needs explaining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<MachineReason>,
    /// Human-readable detail for `reason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Counts of the changelog from `current` to `target`, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ChangelogSummary>,
    /// Exposure to the CVE asked for with `?cve=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cve: Option<MachineCve>,
    /// `state`, `reason` and `message` as Rancher's state badge shows them
    /// ([`MachineInventoryChangelogSummary::with_status`] sets it).
    #[serde(default)]
    pub status: SummaryStatus,
    /// What the version the machine runs carries of the package asked for with `?package=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<PackagePresence>,
}

impl MachineInventoryChangelogSummary {
    /// An empty summary with `apiVersion` and `kind` set.
    pub fn new() -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: MACHINE_SUMMARY_KIND.to_owned(),
            ..Self::default()
        }
    }

    /// Sets `status` from `state`, `reason` and `message`, once they are final.
    pub fn with_status(mut self) -> Self {
        self.status = SummaryStatus::of_machine(self.state, self.reason, self.message.as_deref());
        self
    }
}

impl SummaryStatus {
    /// The status of a machine: its state; an `Unknown` one is an error with its reason,
    /// unless only its channel's data is missing yet (then it is on its way).
    pub fn of_machine(
        state: MachineState,
        reason: Option<MachineReason>,
        message: Option<&str>,
    ) -> Self {
        let unknown = state == MachineState::Unknown;
        let fetching = reason == Some(MachineReason::ChannelNotFetched);
        let message = message.map(str::to_owned).or_else(|| {
            reason.and_then(|r| serde_json::to_value(r).ok()?.as_str().map(str::to_owned))
        });
        Self {
            display: Display {
                state: match state {
                    MachineState::UpToDate => DisplayState::UpToDate,
                    MachineState::UpdatesAvailable => DisplayState::UpdatesAvailable,
                    MachineState::Unknown => DisplayState::Unknown,
                },
                error: unknown && !fetching,
                transitioning: unknown && fetching,
                message,
            },
        }
    }
}

/// `MachineInventoryChangelogSummaryList`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineInventoryChangelogSummaryList {
    /// Always `changelog.elemental.cattle.io/v1beta1`.
    pub api_version: String,
    /// Always `MachineInventoryChangelogSummaryList`.
    pub kind: String,
    /// List metadata.
    pub metadata: ListMeta,
    /// Items, sorted by namespace then name.
    pub items: Vec<MachineInventoryChangelogSummary>,
}

impl MachineInventoryChangelogSummaryList {
    /// A list of `items` with `apiVersion` and `kind` set.
    pub fn new(items: Vec<MachineInventoryChangelogSummary>) -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: MACHINE_SUMMARY_LIST_KIND.to_owned(),
            metadata: ListMeta::default(),
            items,
        }
    }
}

/// Why a ManagedOSImage's target version cannot be resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanTargetReason {
    /// Neither `spec.osImage` nor `spec.managedOSVersionName` is set.
    NoTarget,
    /// `spec.managedOSVersionName` names no ManagedOSVersion of the namespace.
    VersionNotFound,
    /// `spec.osImage` is the upgrade image of no ManagedOSVersion.
    ImageInNoChannel,
    /// `spec.osImage` is the upgrade image of several ManagedOSVersions.
    Ambiguous,
    /// The ManagedOSImage's spec or labels pass the server's caps: they are
    /// not kept.
    ManagedOSImageTooLarge,
}

/// Why a `clusterTargets` entry, or a machine, cannot be evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SelectionReason {
    /// The machine is not linked to a cluster this server can see
    /// (no MachineInventorySelector owner, or it carries no cluster label).
    ClusterUnknown,
    /// The entry selects fleet Clusters by label (`clusterSelector`): their
    /// labels are not known here.
    ClusterLabelsUnknown,
    /// The entry names a fleet ClusterGroup (`clusterGroup`,
    /// `clusterGroupSelector`): group membership is not known here.
    ClusterGroupUnknown,
    /// A label selector that cannot be evaluated (unknown operator).
    InvalidSelector,
    /// The entry sets no criterion.
    EmptyTarget,
    /// The ManagedOSImage's spec or labels pass the server's caps: they are
    /// not kept, so which machines it selects is not known.
    ManagedOSImageTooLarge,
}

/// A `clusterTargets` entry that cannot be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnresolvedClusterTarget {
    /// Position in `spec.clusterTargets`.
    pub index: usize,
    /// `name` of the entry, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Why.
    pub reason: SelectionReason,
    /// Human-readable detail.
    pub message: String,
}

/// Machines of a plan that run the same version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanGroup {
    /// The version these machines run.
    pub current: ChannelVersion,
    /// State of each machine of the group.
    pub state: MachineState,
    /// Why, when the state needs explaining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<MachineReason>,
    /// MachineInventory names, sorted.
    pub machines: Vec<String>,
    /// Counts of the changelog from `current` to the plan's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ChangelogSummary>,
}

/// A machine left out of the groups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanMachine {
    /// MachineInventory name.
    pub name: String,
    /// Why its current version is unknown ([`MachineReason`] names) or
    /// whether the plan selects it cannot be decided ([`SelectionReason`] names).
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
}

/// `ManagedOSImageChangelog`: what a ManagedOSImage would change, before it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedOSImageChangelog {
    /// Always `changelog.elemental.cattle.io/v1beta1`.
    pub api_version: String,
    /// Always `ManagedOSImageChangelog`.
    pub kind: String,
    /// The ManagedOSImage described.
    pub metadata: ObjectMeta,
    /// The version it installs, when resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ChannelVersion>,
    /// Why the target is not resolved, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_reason: Option<PlanTargetReason>,
    /// Human-readable detail for `targetReason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_message: Option<String>,
    /// Selected machines grouped by the version they run, oldest first.
    pub groups: Vec<PlanGroup>,
    /// Selected machines whose current version is unknown, and machines of
    /// which it cannot be decided whether the plan selects them.
    #[serde(default)]
    pub unknown_machines: Vec<PlanMachine>,
    /// `clusterTargets` entries that cannot be evaluated here.
    #[serde(default)]
    pub unresolved_targets: Vec<UnresolvedClusterTarget>,
}

impl ManagedOSImageChangelog {
    /// An empty plan with `apiVersion` and `kind` set.
    pub fn new() -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: IMAGE_CHANGELOG_KIND.to_owned(),
            ..Self::default()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::Severity;

    #[test]
    fn machine_summary_wire_shape() {
        let mut m = MachineInventoryChangelogSummary::new();
        m.metadata.name = "m-1".into();
        m.metadata.namespace = "fleet-default".into();
        m.os.image = Some("registry.example/os:2.0".into());
        m.current = Some(ChannelVersion {
            name: "v2-0".into(),
            version: "v2.0".into(),
            channel: "c".into(),
        });
        m.target = Some(MachineTarget {
            name: "v2-1".into(),
            version: "v2.1".into(),
            channel: "c".into(),
            source: TargetSource::NewestInChannel,
            ..MachineTarget::default()
        });
        m.state = MachineState::UpdatesAvailable;
        m.summary = Some(ChangelogSummary {
            advisories: 1,
            cves: 2,
            highest_severity: Severity::Critical,
            ..ChangelogSummary::default()
        });
        m.cve = Some(MachineCve {
            id: "CVE-2024-1".into(),
            state: CveState::Exposed,
            fixed_in: Some(VersionRef {
                name: "v2-1".into(),
                version: "v2.1".into(),
            }),
        });
        let m = m.with_status();
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "changelog.elemental.cattle.io/v1beta1",
                "kind": "MachineInventoryChangelogSummary",
                "metadata": {"name": "m-1", "namespace": "fleet-default"},
                "os": {"image": "registry.example/os:2.0"},
                "current": {"name": "v2-0", "version": "v2.0", "channel": "c"},
                "target": {"name": "v2-1", "version": "v2.1", "channel": "c", "source": "NewestInChannel"},
                "state": "UpdatesAvailable",
                "summary": {"advisories": 1, "byType": {}, "cves": 2, "highestSeverity": "Critical"},
                "cve": {"id": "CVE-2024-1", "state": "Exposed", "fixedIn": {"name": "v2-1", "version": "v2.1"}},
                "status": {"display": {"state": "updates-available", "error": false, "transitioning": false}}
            })
        );
        let back: MachineInventoryChangelogSummary = serde_json::from_value(v).unwrap();
        assert_eq!(back, m);
    }

    /// What Rancher's summarizer reads: an Unknown machine is an error with its reason, unless
    /// only its channel's data is missing yet.
    #[test]
    fn machine_status_as_rancher_shows_it() {
        let display = |state, reason, message: Option<&str>| {
            serde_json::to_value(SummaryStatus::of_machine(state, reason, message).display).unwrap()
        };
        assert_eq!(
            display(MachineState::UpToDate, None, None),
            json!({"state": "up-to-date", "error": false, "transitioning": false})
        );
        assert_eq!(
            display(MachineState::UpdatesAvailable, None, None),
            json!({"state": "updates-available", "error": false, "transitioning": false})
        );
        assert_eq!(
            display(
                MachineState::Unknown,
                Some(MachineReason::NoAnnotation),
                Some("no os.* annotation")
            ),
            json!({"state": "unknown", "error": true, "transitioning": false, "message": "no os.* annotation"})
        );
        assert_eq!(
            display(MachineState::Unknown, Some(MachineReason::Ambiguous), None),
            json!({"state": "unknown", "error": true, "transitioning": false, "message": "Ambiguous"})
        );
        assert_eq!(
            display(
                MachineState::Unknown,
                Some(MachineReason::ChannelNotFetched),
                Some("not fetched")
            ),
            json!({"state": "unknown", "error": false, "transitioning": true, "message": "not fetched"})
        );
    }

    #[test]
    fn version_status_as_rancher_shows_it() {
        use crate::types::UnavailableReason;
        let display = |reason, message: Option<&str>| {
            serde_json::to_value(SummaryStatus::of_version(reason, message).display).unwrap()
        };
        assert_eq!(
            display(None, Some("ignored")),
            json!({"state": "available", "error": false, "transitioning": false})
        );
        assert_eq!(
            display(Some(UnavailableReason::NotFetched), Some("m")),
            json!({"state": "not-fetched", "error": false, "transitioning": true, "message": "m"})
        );
        assert_eq!(
            display(Some(UnavailableReason::FetchFailed), Some("m")),
            json!({"state": "fetch-failed", "error": true, "transitioning": false, "message": "m"})
        );
        for (reason, state) in [
            (UnavailableReason::NoChannel, "no-channel"),
            (UnavailableReason::ChannelHasNoImage, "channel-has-no-image"),
            (UnavailableReason::NoChangelogData, "no-changelog-data"),
        ] {
            assert_eq!(
                display(Some(reason), None),
                json!({"state": state, "error": false, "transitioning": false})
            );
        }
    }

    /// The server adds `package` to a kept answer's JSON without parsing it: as its last
    /// field, which is where serializing the machine with it writes it.
    #[test]
    fn the_package_block_is_written_last() {
        let mut m = MachineInventoryChangelogSummary::new();
        m.metadata.name = "m-1".into();
        m.state = MachineState::UpToDate;
        let without = serde_json::to_vec(&m).unwrap();
        m.package = Some(PackagePresence {
            name: "xz".into(),
            evr: Some("5.6.1-1.1".into()),
            arch: Some("x86_64".into()),
            ..PackagePresence::default()
        });
        let with = serde_json::to_vec(&m).unwrap();
        let block = serde_json::to_vec(&m.package).unwrap();
        let mut spliced = without[..without.len() - 1].to_vec();
        spliced.extend_from_slice(b",\"package\":");
        spliced.extend_from_slice(&block);
        spliced.push(b'}');
        assert_eq!(
            String::from_utf8(spliced).unwrap(),
            String::from_utf8(with).unwrap()
        );
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(
            v["package"],
            json!({"name": "xz", "evr": "5.6.1-1.1", "arch": "x86_64"})
        );
        let absent = PackagePresence::without("xz", crate::types::PackageState::Absent);
        assert_eq!(
            serde_json::to_value(&absent).unwrap(),
            json!({"name": "xz", "state": "Absent"})
        );
    }

    #[test]
    fn unknown_machine_and_list() {
        let mut m = MachineInventoryChangelogSummary::new();
        m.metadata.name = "m-2".into();
        m.reason = Some(MachineReason::NoAnnotation);
        m.message = Some("no os annotation".into());
        let list = MachineInventoryChangelogSummaryList::new(vec![m]);
        let v = serde_json::to_value(&list).unwrap();
        assert_eq!(v["kind"], "MachineInventoryChangelogSummaryList");
        assert_eq!(v["metadata"], json!({"resourceVersion": ""}));
        assert_eq!(v["items"][0]["state"], "Unknown");
        assert_eq!(v["items"][0]["reason"], "NoAnnotation");
        assert_eq!(v["items"][0]["os"], json!({}));
        assert!(v["items"][0].get("current").is_none());
    }

    #[test]
    fn plan_wire_shape() {
        let mut p = ManagedOSImageChangelog::new();
        p.metadata.name = "upgrade".into();
        p.target_reason = Some(PlanTargetReason::VersionNotFound);
        p.unknown_machines.push(PlanMachine {
            name: "m".into(),
            reason: "ClusterUnknown".into(),
            message: "x".into(),
        });
        p.unresolved_targets.push(UnresolvedClusterTarget {
            index: 0,
            name: None,
            reason: SelectionReason::ClusterGroupUnknown,
            message: "y".into(),
        });
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["kind"], "ManagedOSImageChangelog");
        assert_eq!(v["targetReason"], "VersionNotFound");
        assert_eq!(v["groups"], json!([]));
        assert_eq!(
            v["unresolvedTargets"][0],
            json!({"index": 0, "reason": "ClusterGroupUnknown", "message": "y"})
        );
        let back: ManagedOSImageChangelog = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }
}
