//! A machine's current version, target, state and CVE exposure, and a
//! ManagedOSImage's upgrade plan.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use elemental_changelog_apiservice::fleet::{
    ChannelVersion, CveState, MachineCve, MachineInventoryChangelogSummary, MachineReason,
    MachineState, MachineTarget, ManagedOSImageChangelog, PlanGroup, PlanMachine, PlanTargetReason,
    TargetReason, TargetSource, UnresolvedClusterTarget,
};
use elemental_changelog_apiservice::types::{ChangelogSummary, ObjectMeta, VersionRef};
use kube::ResourceExt;

use super::caps::Oversize;
use super::crd::{MachineInventory, MachineInventorySelector, ManagedOSImage};
use super::os::{
    Reported, host_suffixes, is_container, normalize_image, normalize_version, upgrade_image,
};
use super::select::{Fleet, Selection, image_selects, target_issue};
use crate::channels::crd::ManagedOSVersion;

/// Each channel's versions, oldest first (the snapshot's
/// `IndexedChannel::order`), by namespace and channel name. `Sync`: the machines' projector
/// keeps an index (which holds one) across its passes, on whichever thread runs them.
pub trait Orders: Sync {
    /// The order of `channel` in `namespace`; `None` when its data is not
    /// fetched.
    fn order(&self, namespace: &str, channel: &str) -> Option<&[String]>;
}

impl Orders for BTreeMap<(String, String), Vec<String>> {
    fn order(&self, namespace: &str, channel: &str) -> Option<&[String]> {
        self.get(&(namespace.to_owned(), channel.to_owned()))
            .map(Vec::as_slice)
    }
}

/// A container ManagedOSVersion with a channel, as the fleet view uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version<'a> {
    name: &'a str,
    version: &'a str,
    channel: &'a str,
    image: Option<&'a str>,
}

impl Version<'_> {
    fn wire(&self) -> ChannelVersion {
        ChannelVersion {
            name: self.name.to_owned(),
            version: self.version.to_owned(),
            channel: self.channel.to_owned(),
        }
    }
}

/// What a ManagedOSImage installs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanTarget {
    /// This version.
    Resolved(ChannelVersion),
    /// Not resolvable.
    Unresolved {
        /// Why.
        reason: PlanTargetReason,
        /// Detail.
        message: String,
    },
}

/// The changelog that is pending for a machine (or a plan group): from `from`
/// to `to` of `channel`, both ManagedOSVersion names, `from` older. The caller
/// computes its summary from the channel's snapshot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pending {
    /// Namespace.
    pub namespace: String,
    /// Channel.
    pub channel: String,
    /// The version the machine runs.
    pub from: String,
    /// Its target.
    pub to: String,
}

/// Everything resolved about one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineResolution {
    /// Namespace of the MachineInventory.
    pub namespace: String,
    /// Name of the MachineInventory.
    pub name: String,
    /// What it reported.
    pub reported: Reported,
    /// The version it runs.
    pub current: Option<ChannelVersion>,
    /// The version it would be upgraded to.
    pub target: Option<MachineTarget>,
    /// State.
    pub state: MachineState,
    /// Why, when the state needs explaining.
    pub reason: Option<MachineReason>,
    /// Detail for `reason`.
    pub message: Option<String>,
    /// The changelog to summarize, when updates are pending within a channel.
    pub pending: Option<Pending>,
}

impl MachineResolution {
    /// The wire object: `metadata` from the MachineInventory, `summary` the
    /// counts of [`pending`](Self::pending)'s changelog, `cve` from
    /// [`FleetIndex::cve`].
    pub fn to_object(
        &self,
        metadata: ObjectMeta,
        summary: Option<ChangelogSummary>,
        cve: Option<MachineCve>,
    ) -> MachineInventoryChangelogSummary {
        MachineInventoryChangelogSummary {
            metadata,
            os: self.reported.to_wire(),
            current: self.current.clone(),
            target: self.target.clone(),
            state: self.state,
            reason: self.reason,
            message: self.message.clone(),
            summary: self.pending.as_ref().and(summary),
            cve,
            ..MachineInventoryChangelogSummary::new()
        }
        .with_status()
    }
}

/// A plan group before its summary is computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanGroupDraft {
    /// The version the machines run.
    pub current: ChannelVersion,
    /// Their state relative to the plan's target.
    pub state: MachineState,
    /// Why, when needed.
    pub reason: Option<MachineReason>,
    /// Machine names, sorted.
    pub machines: Vec<String>,
    /// The changelog to summarize.
    pub pending: Option<Pending>,
}

/// A ManagedOSImage's upgrade plan before summaries are computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradePlan {
    /// What it installs.
    pub target: PlanTarget,
    /// Selected machines by current version: oldest first within a channel.
    pub groups: Vec<PlanGroupDraft>,
    /// Selected machines with an unknown current version, and undecided ones.
    pub unknown_machines: Vec<PlanMachine>,
    /// Targets that cannot be evaluated here.
    pub unresolved_targets: Vec<UnresolvedClusterTarget>,
}

impl UpgradePlan {
    /// The wire object; `summary` gives the counts of a pending changelog.
    pub fn to_object(
        self,
        metadata: ObjectMeta,
        mut summary: impl FnMut(&Pending) -> Option<ChangelogSummary>,
    ) -> ManagedOSImageChangelog {
        let (target, target_reason, target_message) = match self.target {
            PlanTarget::Resolved(v) => (Some(v), None, None),
            PlanTarget::Unresolved { reason, message } => (None, Some(reason), Some(message)),
        };
        ManagedOSImageChangelog {
            metadata,
            target,
            target_reason,
            target_message,
            groups: self
                .groups
                .into_iter()
                .map(|g| PlanGroup {
                    summary: g.pending.as_ref().and_then(&mut summary),
                    current: g.current,
                    state: g.state,
                    reason: g.reason,
                    machines: g.machines,
                })
                .collect(),
            unknown_machines: self.unknown_machines,
            unresolved_targets: self.unresolved_targets,
            ..ManagedOSImageChangelog::new()
        }
    }
}

/// The ManagedOSImages that select a machine.
struct Assigned<'i> {
    /// Each image's name and target.
    images: Vec<(&'i str, &'i PlanTarget)>,
    /// Why whether another image selects the machine cannot be decided (the first such).
    undecided: Option<String>,
}

/// The target the ManagedOSImages `assigned` give a machine, or why they give none (then
/// the newest version of its channel is the target).
fn image_target(
    assigned: &[(&str, &PlanTarget)],
    undecided: Option<String>,
) -> (Option<MachineTarget>, Option<(TargetReason, String)>) {
    if let Some((image, PlanTarget::Unresolved { message, .. })) = assigned
        .iter()
        .find(|(_, t)| matches!(t, PlanTarget::Unresolved { .. }))
    {
        return (
            None,
            Some((
                TargetReason::ManagedOSImageUnresolved,
                format!(
                    "ManagedOSImage {image} selects the machine but its target is not resolved: {message}"
                ),
            )),
        );
    }
    if assigned.is_empty() {
        return (
            None,
            undecided.map(|message| (TargetReason::ClusterUnresolved, message)),
        );
    }
    let targets: BTreeSet<&ChannelVersion> = assigned
        .iter()
        .filter_map(|(_, t)| match t {
            PlanTarget::Resolved(v) => Some(v),
            PlanTarget::Unresolved { .. } => None,
        })
        .collect();
    if let (1, Some(v)) = (targets.len(), targets.first()) {
        let target = MachineTarget {
            name: v.name.clone(),
            version: v.version.clone(),
            channel: v.channel.clone(),
            source: TargetSource::ManagedOSImage,
            managed_os_image: assigned.first().map(|(n, _)| (*n).to_owned()),
            reason: None,
            message: None,
        };
        return (Some(target), None);
    }
    let names: Vec<&str> = assigned.iter().map(|(n, _)| *n).collect();
    (
        None,
        Some((
            TargetReason::ManagedOSImagesDisagree,
            format!(
                "ManagedOSImages {} select the machine with different versions",
                names.join(", ")
            ),
        )),
    )
}

fn wire_name<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A machine past the reflector's caps: `MetadataTooLarge`.
fn too_large(oversize: &Oversize) -> (MachineReason, String) {
    (
        MachineReason::MetadataTooLarge,
        format!("the MachineInventory's labels and annotations are not kept: {oversize}"),
    )
}

fn list_names(versions: &[&Version<'_>]) -> String {
    let mut names: Vec<String> = versions
        .iter()
        .map(|v| format!("{} (channel {})", v.name, v.channel))
        .collect();
    names.sort();
    names.dedup();
    if names.len() > 5 {
        let more = names.len() - 5;
        names.truncate(5);
        names.push(format!("and {more} more"));
    }
    names.join(", ")
}

/// The container versions with a channel of one namespace, indexed.
#[derive(Default)]
struct Namespace<'a> {
    /// Sorted by name (names are unique in a namespace).
    versions: Vec<Version<'a>>,
    by_name: HashMap<&'a str, usize>,
    /// By normalized upgrade image.
    by_image: HashMap<&'a str, Vec<usize>>,
    /// By the host suffixes of the normalized upgrade image.
    by_image_suffix: HashMap<&'a str, Vec<usize>>,
    /// By normalized `spec.version`.
    by_version: HashMap<&'a str, Vec<usize>>,
}

impl<'a> Namespace<'a> {
    fn new(mut versions: Vec<Version<'a>>) -> Self {
        versions.sort_by(|a, b| a.name.cmp(b.name));
        versions.dedup_by(|a, b| a.name == b.name);
        let mut ns = Self::default();
        for (i, v) in versions.iter().enumerate() {
            ns.by_name.insert(v.name, i);
            if let Some(image) = v.image.map(normalize_image).filter(|s| !s.is_empty()) {
                ns.by_image.entry(image).or_default().push(i);
                for tail in host_suffixes(image) {
                    ns.by_image_suffix.entry(tail).or_default().push(i);
                }
            }
            let version = normalize_version(v.version);
            if !version.is_empty() {
                ns.by_version.entry(version).or_default().push(i);
            }
        }
        ns.versions = versions;
        ns
    }

    fn named(&self, name: &str) -> Option<&Version<'a>> {
        self.by_name.get(name).and_then(|&i| self.versions.get(i))
    }

    fn collect(&self, mut found: Vec<usize>) -> Vec<&Version<'a>> {
        found.sort_unstable();
        found.dedup();
        found.iter().filter_map(|&i| self.versions.get(i)).collect()
    }

    /// The versions whose upgrade image [`images_match`](super::os::images_match)
    /// `image`, sorted by name.
    fn with_image(&self, image: &str) -> Vec<&Version<'a>> {
        let image = normalize_image(image);
        if image.is_empty() {
            return Vec::new();
        }
        let mut found: Vec<usize> = Vec::new();
        // Equal, or `image` is a tail of theirs (they carry a mirror prefix).
        found.extend(self.by_image.get(image).into_iter().flatten());
        found.extend(self.by_image_suffix.get(image).into_iter().flatten());
        // Theirs is a tail of `image` (it carries a mirror prefix).
        for tail in host_suffixes(image) {
            found.extend(self.by_image.get(tail).into_iter().flatten());
        }
        self.collect(found)
    }

    /// The versions whose `spec.version` is one of `reported`, sorted by name.
    fn with_version(&self, reported: &[&str]) -> Vec<&Version<'a>> {
        let found = reported
            .iter()
            .map(|r| normalize_version(r))
            .filter(|r| !r.is_empty())
            .filter_map(|r| self.by_version.get(r))
            .flatten()
            .copied()
            .collect();
        self.collect(found)
    }
}

/// The objects of the cluster the fleet view is resolved from, indexed once.
pub struct FleetIndex<'a> {
    /// Container versions with a channel, by namespace.
    versions: BTreeMap<&'a str, Namespace<'a>>,
    /// ManagedOSImages by namespace, sorted by name, with their targets.
    images: BTreeMap<&'a str, Vec<(&'a ManagedOSImage, PlanTarget)>>,
    /// Cluster of each MachineInventorySelector, by namespace and name.
    selector_clusters: HashMap<&'a str, HashMap<&'a str, Option<&'a str>>>,
    fleet: Fleet<'a>,
    orders: &'a dyn Orders,
}

impl<'a> FleetIndex<'a> {
    /// Indexes the objects: ManagedOSVersions, ManagedOSImages and
    /// MachineInventorySelectors of the watched namespaces, the fleet objects
    /// known, and each channel's version order.
    pub fn new(
        versions: impl IntoIterator<Item = &'a ManagedOSVersion>,
        images: impl IntoIterator<Item = &'a ManagedOSImage>,
        selectors: impl IntoIterator<Item = &'a MachineInventorySelector>,
        fleet: Fleet<'a>,
        orders: &'a dyn Orders,
    ) -> Self {
        let mut by_ns: BTreeMap<&'a str, Vec<Version<'a>>> = BTreeMap::new();
        for v in versions {
            let (Some(ns), Some(channel), Some(name)) = (
                v.metadata.namespace.as_deref(),
                v.channel_name(),
                v.metadata.name.as_deref(),
            ) else {
                continue;
            };
            if !is_container(v) {
                continue;
            }
            by_ns.entry(ns).or_default().push(Version {
                name,
                version: v.spec.version.as_str(),
                channel,
                image: upgrade_image(v),
            });
        }
        let mut index = Self {
            versions: by_ns
                .into_iter()
                .map(|(ns, list)| (ns, Namespace::new(list)))
                .collect(),
            images: BTreeMap::new(),
            selector_clusters: HashMap::new(),
            fleet,
            orders,
        };
        let mut images_by_ns: BTreeMap<&'a str, Vec<(&'a ManagedOSImage, PlanTarget)>> =
            BTreeMap::new();
        for i in images {
            let Some(ns) = i.metadata.namespace.as_deref() else {
                continue;
            };
            let target = index.image_target(i);
            images_by_ns.entry(ns).or_default().push((i, target));
        }
        for list in images_by_ns.values_mut() {
            list.sort_by(|a, b| a.0.metadata.name.cmp(&b.0.metadata.name));
        }
        index.images = images_by_ns;
        for s in selectors {
            if let (Some(ns), Some(name)) =
                (s.metadata.namespace.as_deref(), s.metadata.name.as_deref())
            {
                index
                    .selector_clusters
                    .entry(ns)
                    .or_default()
                    .insert(name, s.cluster_name());
            }
        }
        index
    }

    fn with_image(&self, namespace: &str, image: &str) -> Vec<&Version<'a>> {
        self.versions
            .get(namespace)
            .map_or_else(Vec::new, |ns| ns.with_image(image))
    }

    fn version_named(&self, namespace: &str, name: &str) -> Option<&Version<'a>> {
        self.versions.get(namespace)?.named(name)
    }

    /// Names of the versions whose upgrade image matches `image`, and of
    /// those whose `spec.version` matches `version`, as the index finds them.
    #[cfg(test)]
    pub(super) fn lookup(
        &self,
        namespace: &str,
        image: &str,
        version: &str,
    ) -> (Vec<String>, Vec<String>) {
        let names = |v: Vec<&Version<'_>>| v.iter().map(|v| v.name.to_owned()).collect();
        let by_version = self
            .versions
            .get(namespace)
            .map_or_else(Vec::new, |ns| ns.with_version(&[version]));
        (names(self.with_image(namespace, image)), names(by_version))
    }

    /// What a ManagedOSImage installs: `spec.osImage` against the versions'
    /// upgrade images when set (it wins in the operator), else
    /// `spec.managedOSVersionName`.
    pub fn image_target(&self, image: &ManagedOSImage) -> PlanTarget {
        let ns = image.metadata.namespace.as_deref().unwrap_or_default();
        let unresolved = |reason, message: String| PlanTarget::Unresolved { reason, message };
        if let Some(oversize) = &image.spec.oversize {
            return unresolved(
                PlanTargetReason::ManagedOSImageTooLarge,
                format!("the ManagedOSImage is not kept: {oversize}"),
            );
        }
        let os_image = image
            .spec
            .os_image
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty());
        if let Some(os_image) = os_image {
            let found = self.with_image(ns, os_image);
            return match found.as_slice() {
                [one] => PlanTarget::Resolved(one.wire()),
                [] => unresolved(
                    PlanTargetReason::ImageInNoChannel,
                    format!(
                        "spec.osImage {os_image:?} is the upgrade image of no ManagedOSVersion of namespace {ns}"
                    ),
                ),
                many => unresolved(
                    PlanTargetReason::Ambiguous,
                    format!(
                        "spec.osImage {os_image:?} is the upgrade image of several ManagedOSVersions: {}",
                        list_names(many)
                    ),
                ),
            };
        }
        let name = image
            .spec
            .managed_os_version_name
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty());
        match name {
            Some(name) => match self.version_named(ns, name) {
                Some(v) => PlanTarget::Resolved(v.wire()),
                None => unresolved(
                    PlanTargetReason::VersionNotFound,
                    format!(
                        "spec.managedOSVersionName {name:?} is no container ManagedOSVersion of a channel in namespace {ns}"
                    ),
                ),
            },
            None => unresolved(
                PlanTargetReason::NoTarget,
                "neither spec.osImage nor spec.managedOSVersionName is set".to_owned(),
            ),
        }
    }

    /// The cluster a machine belongs to, through its MachineInventorySelector.
    pub fn cluster_of(&self, machine: &MachineInventory) -> Option<&'a str> {
        let ns = machine.metadata.namespace.as_deref()?;
        let selector = machine.selector_name()?;
        *self.selector_clusters.get(ns)?.get(selector)?
    }

    /// The version a machine runs: its `os.image` against the versions'
    /// upgrade images first; when no version has that image (or none is
    /// reported), its `os.version` / `os.version-id` against `spec.version`,
    /// which must then match in one channel only.
    pub fn current(
        &self,
        machine: &MachineInventory,
    ) -> Result<ChannelVersion, (MachineReason, String)> {
        if let Some(oversize) = &machine.spec.oversize {
            return Err(too_large(oversize));
        }
        let reported = &machine.spec.reported;
        if reported.unmanaged {
            return Err((
                MachineReason::Unmanaged,
                "the machine registered without the Elemental toolkit (elemental.cattle.io/os.unmanaged)".to_owned(),
            ));
        }
        let ns = machine.metadata.namespace.as_deref().unwrap_or_default();
        let versions = self.versions.get(ns);
        if let Some(image) = &reported.image {
            let found = self.with_image(ns, image);
            match found.as_slice() {
                [one] => return Ok(one.wire()),
                [] => {}
                many => {
                    return Err((
                        MachineReason::Ambiguous,
                        format!(
                            "image {image:?} is the upgrade image of several ManagedOSVersions: {}",
                            list_names(many)
                        ),
                    ));
                }
            }
        }
        let reported_versions: Vec<&str> = [&reported.version, &reported.version_id]
            .into_iter()
            .flatten()
            .map(AsRef::as_ref)
            .collect();
        if !reported_versions.is_empty() {
            let found = versions.map_or_else(Vec::new, |v| v.with_version(&reported_versions));
            match found.as_slice() {
                [one] => return Ok(one.wire()),
                [] => {}
                many => {
                    return Err((
                        MachineReason::Ambiguous,
                        format!(
                            "version {} matches several ManagedOSVersions: {}",
                            reported_versions.join(" / "),
                            list_names(many)
                        ),
                    ));
                }
            }
        }
        if reported.image.is_none() && reported_versions.is_empty() {
            return Err((
                MachineReason::NoAnnotation,
                "the MachineInventory has neither elemental.cattle.io/os.image nor elemental.cattle.io/os.version".to_owned(),
            ));
        }
        let mut what = Vec::new();
        if let Some(i) = &reported.image {
            what.push(format!("image {i:?}"));
        }
        if !reported_versions.is_empty() {
            what.push(format!("version {:?}", reported_versions.join(" / ")));
        }
        Err((
            MachineReason::VersionInNoChannel,
            format!(
                "no container ManagedOSVersion of namespace {ns} has the machine's {}",
                what.join(" or ")
            ),
        ))
    }

    /// The newest version of `channel`: the last of its order that is a
    /// ManagedOSVersion of the namespace.
    fn newest(&self, namespace: &str, channel: &str) -> Option<ChannelVersion> {
        let order = self.orders.order(namespace, channel)?;
        order.iter().rev().find_map(|name| {
            self.version_named(namespace, name)
                .filter(|v| v.channel == channel)
                .map(Version::wire)
        })
    }

    /// State of `current` against `target`, and the pending changelog.
    fn compare(
        &self,
        namespace: &str,
        current: &ChannelVersion,
        target: &ChannelVersion,
    ) -> (
        MachineState,
        Option<MachineReason>,
        Option<String>,
        Option<Pending>,
    ) {
        if current.name == target.name && current.channel == target.channel {
            return (MachineState::UpToDate, None, None, None);
        }
        if current.channel != target.channel {
            return (
                MachineState::UpdatesAvailable,
                Some(MachineReason::OtherChannel),
                Some(format!(
                    "the target {} is in channel {}, the current version in channel {}: there is no changelog between them",
                    target.name, target.channel, current.channel
                )),
                None,
            );
        }
        let order = self.orders.order(namespace, &current.channel);
        let position = |name: &str| order.and_then(|o| o.iter().position(|n| n == name));
        match (position(&current.name), position(&target.name)) {
            (Some(c), Some(t)) if t > c => (
                MachineState::UpdatesAvailable,
                None,
                None,
                Some(Pending {
                    namespace: namespace.to_owned(),
                    channel: current.channel.clone(),
                    from: current.name.clone(),
                    to: target.name.clone(),
                }),
            ),
            (Some(_), Some(_)) => (
                MachineState::UpToDate,
                Some(MachineReason::TargetOlder),
                Some(format!(
                    "the target {} is older than the current version {}",
                    target.name, current.name
                )),
                None,
            ),
            _ => (
                MachineState::Unknown,
                Some(MachineReason::ChannelNotFetched),
                Some(format!(
                    "the order of channel {namespace}/{} is not known (its data is not fetched, or it does not list {} or {})",
                    current.channel, current.name, target.name
                )),
                None,
            ),
        }
    }

    /// The ManagedOSImages of `namespace` that select `machine`.
    fn assigned(&self, namespace: &str, machine: &MachineInventory) -> Assigned<'_> {
        let cluster = self.cluster_of(machine);
        let mut assigned = Assigned {
            images: Vec::new(),
            undecided: None,
        };
        for (image, target) in self.images.get(namespace).into_iter().flatten() {
            match image_selects(image, machine, cluster, self.fleet) {
                Selection::Selected => {
                    let name = image.metadata.name.as_deref().unwrap_or_default();
                    assigned.images.push((name, target));
                }
                Selection::NotSelected => {}
                Selection::Undecided { message, .. } => {
                    assigned.undecided.get_or_insert_with(|| {
                        format!(
                            "whether ManagedOSImage {} selects the machine cannot be decided: {message}",
                            image.metadata.name.as_deref().unwrap_or_default()
                        )
                    });
                }
            }
        }
        assigned
    }

    /// Resolves one machine.
    pub fn machine(&self, machine: &MachineInventory) -> MachineResolution {
        let namespace = machine.metadata.namespace.clone().unwrap_or_default();
        let name = machine.name_any();
        if let Some(oversize) = &machine.spec.oversize {
            // Its labels and annotations are not kept: nothing is resolved from what is left.
            let (reason, message) = too_large(oversize);
            return MachineResolution {
                namespace,
                name,
                reported: Reported::default(),
                current: None,
                target: None,
                state: MachineState::Unknown,
                reason: Some(reason),
                message: Some(message),
                pending: None,
            };
        }
        let current = self.current(machine);
        let Assigned { images, undecided } = self.assigned(&namespace, machine);
        let (from_image, fallback_reason) = image_target(&images, undecided);

        let target = from_image.or_else(|| {
            let current = current.as_ref().ok()?;
            let newest = self.newest(&namespace, &current.channel)?;
            let (reason, message) = fallback_reason.clone().unzip();
            Some(MachineTarget {
                name: newest.name,
                version: newest.version,
                channel: newest.channel,
                source: TargetSource::NewestInChannel,
                managed_os_image: None,
                reason,
                message,
            })
        });

        let (state, reason, message, pending) = match (&current, &target) {
            (Err((reason, message)), _) => (
                MachineState::Unknown,
                Some(*reason),
                Some(message.clone()),
                None,
            ),
            (Ok(current), None) => (
                MachineState::Unknown,
                Some(MachineReason::ChannelNotFetched),
                Some(format!(
                    "the data of channel {namespace}/{} is not fetched: its newest version is not known",
                    current.channel
                )),
                None,
            ),
            (Ok(current), Some(t)) => {
                let target = ChannelVersion {
                    name: t.name.clone(),
                    version: t.version.clone(),
                    channel: t.channel.clone(),
                };
                self.compare(&namespace, current, &target)
            }
        };
        MachineResolution {
            namespace,
            name,
            reported: machine.spec.reported.clone(),
            current: current.ok(),
            target,
            state,
            reason,
            message,
            pending,
        }
    }

    /// A machine's exposure to a CVE. `fixes(namespace, channel, version)`
    /// tells whether that version's changelog (against the previous version,
    /// as `?cve=` on versions) has an advisory naming the CVE.
    pub fn cve(
        &self,
        machine: &MachineResolution,
        id: &str,
        mut fixes: impl FnMut(&str, &str, &str) -> bool,
    ) -> MachineCve {
        let unknown = MachineCve {
            id: id.to_owned(),
            state: CveState::Unknown,
            fixed_in: None,
        };
        let Some(current) = &machine.current else {
            return unknown;
        };
        let ns = machine.namespace.as_str();
        let Some(order) = self.orders.order(ns, &current.channel) else {
            return unknown;
        };
        let Some(position) = order.iter().position(|n| *n == current.name) else {
            return unknown;
        };
        let Some(first) = order
            .iter()
            .position(|name| fixes(ns, &current.channel, name))
        else {
            return MachineCve {
                id: id.to_owned(),
                state: CveState::NoFixInChannel,
                fixed_in: None,
            };
        };
        let name = order[first].clone();
        let version = self
            .version_named(ns, &name)
            .map_or_else(|| name.clone(), |v| v.version.to_owned());
        MachineCve {
            id: id.to_owned(),
            state: if first <= position {
                CveState::Fixed
            } else {
                CveState::Exposed
            },
            fixed_in: Some(VersionRef { name, version }),
        }
    }

    /// The upgrade plan of a ManagedOSImage over `machines` (those of other
    /// namespaces are ignored).
    pub fn plan<'m>(
        &self,
        image: &ManagedOSImage,
        machines: impl IntoIterator<Item = &'m MachineInventory>,
    ) -> UpgradePlan {
        let ns = image.metadata.namespace.as_deref().unwrap_or_default();
        let target = self.image_target(image);
        let unresolved_targets = self.unresolved_targets(image, ns);
        let mut groups: BTreeMap<ChannelVersion, Vec<String>> = BTreeMap::new();
        let mut unknown_machines = Vec::new();
        for m in machines {
            if m.metadata.namespace.as_deref() != Some(ns) {
                continue;
            }
            let name = m.name_any();
            if let Some(oversize) = &m.spec.oversize {
                // Its labels are not kept: whether the plan selects it is not known.
                let (reason, message) = too_large(oversize);
                unknown_machines.push(PlanMachine {
                    name,
                    reason: wire_name(reason),
                    message,
                });
                continue;
            }
            match image_selects(image, m, self.cluster_of(m), self.fleet) {
                Selection::NotSelected => {}
                Selection::Undecided { reason, message } => unknown_machines.push(PlanMachine {
                    name,
                    reason: wire_name(reason),
                    message,
                }),
                Selection::Selected => match self.current(m) {
                    Ok(current) => groups.entry(current).or_default().push(name),
                    Err((reason, message)) => unknown_machines.push(PlanMachine {
                        name,
                        reason: wire_name(reason),
                        message,
                    }),
                },
            }
        }
        unknown_machines.sort_by(|a, b| a.name.cmp(&b.name));
        let drafts = self.plan_groups(ns, &target, groups);
        UpgradePlan {
            target,
            groups: drafts,
            unknown_machines,
            unresolved_targets,
        }
    }

    /// The cluster targets of `image` (in namespace `ns`) that cannot be evaluated here.
    fn unresolved_targets(&self, image: &ManagedOSImage, ns: &str) -> Vec<UnresolvedClusterTarget> {
        if ns == super::crd::FLEET_LOCAL_NAMESPACE {
            Vec::new()
        } else {
            image
                .spec
                .cluster_targets
                .iter()
                .enumerate()
                .filter_map(|(index, t)| {
                    let (reason, message) = target_issue(t, self.fleet)?;
                    Some(UnresolvedClusterTarget {
                        index,
                        name: t.name.clone().filter(|n| !n.is_empty()),
                        reason,
                        message,
                    })
                })
                .collect()
        }
    }

    /// The machines of each current version (in namespace `ns`) as plan groups towards
    /// `target`: oldest first within a channel.
    fn plan_groups(
        &self,
        ns: &str,
        target: &PlanTarget,
        groups: BTreeMap<ChannelVersion, Vec<String>>,
    ) -> Vec<PlanGroupDraft> {
        let mut drafts: Vec<PlanGroupDraft> = groups
            .into_iter()
            .map(|(current, mut machines)| {
                machines.sort();
                let (state, reason, pending) = match target {
                    PlanTarget::Resolved(t) => {
                        let (state, reason, _, pending) = self.compare(ns, &current, t);
                        (state, reason, pending)
                    }
                    PlanTarget::Unresolved { .. } => (MachineState::Unknown, None, None),
                };
                PlanGroupDraft {
                    current,
                    state,
                    reason,
                    machines,
                    pending,
                }
            })
            .collect();
        // Oldest first within a channel (channels by name); versions a
        // channel's order does not list come after it, by name.
        let key = |g: &PlanGroupDraft| {
            let position = self
                .orders
                .order(ns, &g.current.channel)
                .and_then(|o| o.iter().position(|n| *n == g.current.name));
            (
                g.current.channel.clone(),
                position.is_none(),
                position,
                g.current.name.clone(),
            )
        };
        drafts.sort_by_key(key);
        drafts
    }
}
