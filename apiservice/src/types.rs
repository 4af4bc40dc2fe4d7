//! The objects this API serves, as they appear on the wire (camelCase JSON).

use serde::{Deserialize, Serialize};

use crate::{API_VERSION, CHANGELOG_KIND, SUMMARY_KIND, SUMMARY_LIST_KIND};

/// `metadata` of the objects served: the ManagedOSVersion they describe.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Name of the ManagedOSVersion.
    pub name: String,
    /// Namespace of the ManagedOSVersion.
    pub namespace: String,
    /// UID of the ManagedOSVersion: the same on every replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// resourceVersion of the ManagedOSVersion the answer was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Creation time of the ManagedOSVersion (RFC 3339), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    /// Labels mirrored from the ManagedOSVersion.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// The channel a version belongs to and the image its data came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelRef {
    /// Name of the ManagedOSVersionChannel.
    pub name: String,
    /// Image reference named by the channel (`spec.options.image`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Manifest digest of the image the data was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// True when this version's data was kept from an earlier image of the
    /// channel that listed it, because the current image no longer does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retained: bool,
}

/// A version of a channel: the ManagedOSVersion name and its `spec.version`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionRef {
    /// ManagedOSVersion name (`metadata.name` of the channel entry).
    pub name: String,
    /// OS version (`spec.version` of the channel entry).
    pub version: String,
}

/// Where a changelog's advisories came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Read from the `<name>.updates.log` files the channel image carries.
    #[default]
    Precomputed,
    /// Computed from per-version package lists and `updateinfo.xml`.
    Computed,
}

/// Advisory severity, ordered from lowest to highest.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Severity {
    /// No severity given, or one this server does not know.
    #[default]
    Unspecified,
    /// `low`.
    Low,
    /// `moderate`.
    Moderate,
    /// `important`.
    Important,
    /// `critical`.
    Critical,
}

impl Severity {
    /// Parses upstream's lower-case severity names; anything else is `Unspecified`.
    pub fn parse(s: &str) -> Self {
        match s.trim().to_ascii_lowercase().as_str() {
            "low" => Self::Low,
            "moderate" => Self::Moderate,
            "important" => Self::Important,
            "critical" => Self::Critical,
            _ => Self::Unspecified,
        }
    }

    /// The name as shown to people (`low`, `moderate`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Low => "low",
            Self::Moderate => "moderate",
            Self::Important => "important",
            Self::Critical => "critical",
        }
    }
}

/// A reference of an advisory (bugzilla, CVE, web page).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    /// Reference id (bug number, CVE id).
    #[serde(default)]
    pub id: String,
    /// Kind of reference (`bugzilla`, `cve`, ...).
    #[serde(default, rename = "type")]
    pub type_: String,
    /// Link.
    #[serde(default)]
    pub href: String,
    /// Title.
    #[serde(default)]
    pub title: String,
}

/// A package an advisory ships.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvisoryPackage {
    /// Package name.
    pub name: String,
    /// Epoch, when not 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// Version.
    pub version: String,
    /// Release.
    pub release: String,
    /// Architecture.
    pub arch: String,
}

/// One advisory (SUSE patch) in a changelog.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Advisory {
    /// Advisory id, e.g. `SUSE-SLE-Micro-6.1-2024-1234`.
    pub id: String,
    /// `security`, `recommended`, `feature`, `optional`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// Severity.
    pub severity: Severity,
    /// Title.
    pub title: String,
    /// Issue time, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued: Option<jiff::Timestamp>,
    /// CVE ids fixed, split out of the references.
    #[serde(default)]
    pub cves: Vec<String>,
    /// Bug ids fixed (bugzilla and similar), split out of the references.
    #[serde(default)]
    pub bugs: Vec<String>,
    /// All references as published.
    #[serde(default)]
    pub references: Vec<Reference>,
    /// Description.
    #[serde(default)]
    pub description: String,
    /// Packages shipped.
    #[serde(default)]
    pub packages: Vec<AdvisoryPackage>,
}

/// A package whose version changed between two OS versions.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageChange {
    /// Package name.
    pub name: String,
    /// Architecture.
    pub arch: String,
    /// EVR in the older version (`[epoch:]version-release`); absent when added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// EVR in the newer version; absent when removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// Package differences between two OS versions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageChanges {
    /// Packages at a higher EVR.
    #[serde(default)]
    pub upgraded: Vec<PackageChange>,
    /// Packages at a lower EVR.
    #[serde(default)]
    pub downgraded: Vec<PackageChange>,
    /// Packages only in the newer version.
    #[serde(default)]
    pub added: Vec<PackageChange>,
    /// Packages only in the older version.
    #[serde(default)]
    pub removed: Vec<PackageChange>,
}

/// Counts that describe a changelog at a glance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangelogSummary {
    /// Number of advisories.
    pub advisories: usize,
    /// Advisories by type (`security`, `recommended`, ...).
    #[serde(default)]
    pub by_type: std::collections::BTreeMap<String, usize>,
    /// Distinct CVEs fixed.
    pub cves: usize,
    /// Highest advisory severity.
    pub highest_severity: Severity,
    /// Packages upgraded (when package lists exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_upgraded: Option<usize>,
    /// Packages downgraded (when package lists exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_downgraded: Option<usize>,
    /// Packages added (when package lists exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_added: Option<usize>,
    /// Packages removed (when package lists exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_removed: Option<usize>,
}

/// `ManagedOSVersionChangelog`: what changed in a version, compared with an
/// older version of the same channel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedOSVersionChangelog {
    /// Always `changelog.elemental.cattle.io/v1beta1`.
    pub api_version: String,
    /// Always `ManagedOSVersionChangelog`.
    pub kind: String,
    /// The ManagedOSVersion this changelog is for.
    pub metadata: ObjectMeta,
    /// Its channel and the image the data came from.
    pub channel: ChannelRef,
    /// `spec.version` of the ManagedOSVersion.
    pub version: String,
    /// The older version compared against; absent for the oldest version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<VersionRef>,
    /// Architecture the data describes.
    pub arch: String,
    /// Where the advisories came from.
    pub source: Source,
    /// Counts.
    pub summary: ChangelogSummary,
    /// Advisories, newest first.
    pub advisories: Vec<Advisory>,
    /// Package differences, when package lists exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<PackageChanges>,
    /// Remarks about the data for the reader (for example precomputed files
    /// that look shifted by one version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl ManagedOSVersionChangelog {
    /// An empty changelog with `apiVersion` and `kind` set.
    pub fn new() -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: CHANGELOG_KIND.to_owned(),
            ..Self::default()
        }
    }
}

/// Why a version has no changelog data, in a summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnavailableReason {
    /// The ManagedOSVersion has no channel label or owner.
    NoChannel,
    /// The channel has no image (type `json`).
    ChannelHasNoImage,
    /// The image has not been fetched yet.
    NotFetched,
    /// The image was fetched but has no data for this version.
    NoChangelogData,
    /// The last fetch of the image failed and there is no earlier data.
    FetchFailed,
}

impl UnavailableReason {
    /// Every reason.
    pub const ALL: [Self; 5] = [
        Self::NoChannel,
        Self::ChannelHasNoImage,
        Self::NotFetched,
        Self::NoChangelogData,
        Self::FetchFailed,
    ];

    /// The name, as serialized (`NoChannel`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoChannel => "NoChannel",
            Self::ChannelHasNoImage => "ChannelHasNoImage",
            Self::NotFetched => "NotFetched",
            Self::NoChangelogData => "NoChangelogData",
            Self::FetchFailed => "FetchFailed",
        }
    }
}

/// The state Rancher's state badge shows for an object, in Rancher's lower-case, hyphenated
/// spelling (Rancher lower-cases every state; the dashboard capitalizes each hyphenated word).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DisplayState {
    /// A version whose changelog can be served.
    Available,
    /// See [`UnavailableReason::NoChannel`].
    NoChannel,
    /// See [`UnavailableReason::ChannelHasNoImage`].
    ChannelHasNoImage,
    /// See [`UnavailableReason::NotFetched`].
    NotFetched,
    /// See [`UnavailableReason::NoChangelogData`].
    NoChangelogData,
    /// See [`UnavailableReason::FetchFailed`].
    FetchFailed,
    /// A machine that runs its target.
    UpToDate,
    /// A machine with updates pending.
    UpdatesAvailable,
    /// A machine whose version or target cannot be resolved.
    #[default]
    Unknown,
}

/// `status.display`: the state, and whether it is an error or on its way to another state, as
/// Rancher's summarizer (wrangler's `summary` package, used by Steve) reads it before anything
/// else (Fleet's GitRepos and Bundles carry the same block). Conditions or a `phase` cannot say
/// this: the summarizer names a state `error` as soon as a condition marks an error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Display {
    /// The state.
    pub state: DisplayState,
    /// Whether the state is an error (Rancher shows it in red, with the message).
    #[serde(default)]
    pub error: bool,
    /// Whether the state will change by itself (data not fetched yet).
    #[serde(default)]
    pub transitioning: bool,
    /// Why, when the state needs explaining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `status` of a summary: what Rancher's state badge shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SummaryStatus {
    /// The state as Rancher shows it.
    pub display: Display,
}

impl SummaryStatus {
    /// The status of a version summary: available, or why not (a fetch not done yet is on its
    /// way, a failed one an error).
    pub fn of_version(reason: Option<UnavailableReason>, message: Option<&str>) -> Self {
        let state = match reason {
            None => DisplayState::Available,
            Some(UnavailableReason::NoChannel) => DisplayState::NoChannel,
            Some(UnavailableReason::ChannelHasNoImage) => DisplayState::ChannelHasNoImage,
            Some(UnavailableReason::NotFetched) => DisplayState::NotFetched,
            Some(UnavailableReason::NoChangelogData) => DisplayState::NoChangelogData,
            Some(UnavailableReason::FetchFailed) => DisplayState::FetchFailed,
        };
        Self {
            display: Display {
                state,
                error: reason == Some(UnavailableReason::FetchFailed),
                transitioning: reason == Some(UnavailableReason::NotFetched),
                message: reason.and(message).map(str::to_owned),
            },
        }
    }
}

/// `ManagedOSVersionChangelogSummary`: a version, whether its changelog is
/// available, and its counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedOSVersionChangelogSummary {
    /// Always `changelog.elemental.cattle.io/v1beta1`.
    pub api_version: String,
    /// Always `ManagedOSVersionChangelogSummary`.
    pub kind: String,
    /// The ManagedOSVersion summarized.
    pub metadata: ObjectMeta,
    /// Its channel.
    pub channel: ChannelRef,
    /// `spec.version`.
    pub version: String,
    /// Channel entry `created` (RFC 3339), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// Whether a changelog can be served.
    pub available: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UnavailableReason>,
    /// Human-readable detail for `reason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The version compared against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<VersionRef>,
    /// Counts, when available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ChangelogSummary>,
    /// `available`, `reason` and `message` as Rancher's state badge shows them
    /// ([`ManagedOSVersionChangelogSummary::with_status`] sets it).
    #[serde(default)]
    pub status: SummaryStatus,
    /// What the version carries of the package asked for with `?package=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<PackagePresence>,
}

/// Why a [`PackagePresence`] has no EVR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PackageState {
    /// The version's package list does not hold the package.
    Absent,
    /// The channel image carries no package list for the version, or it is not read yet.
    NoPackageList,
    /// The version a machine runs is unknown (the machine's `reason` says why).
    Unknown,
}

/// One package of a name a version carries (several: several architectures, or several
/// installed versions such as multi-version kernels).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstalledPackage {
    /// `[epoch:]version-release`.
    pub evr: String,
    /// Architecture.
    pub arch: String,
}

/// The `package` block of a version or a machine (`?package=NAME`): the package installed
/// (`evr`, `arch`), or why there is none (`state`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackagePresence {
    /// The package name asked for.
    pub name: String,
    /// `[epoch:]version-release` installed: the highest, within the bounds asked for when
    /// there are bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evr: Option<String>,
    /// Its architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// Every package of the name installed, when there are several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub installed: Vec<InstalledPackage>,
    /// Why there is no `evr`, when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PackageState>,
    /// Human-readable detail for `state` `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl PackagePresence {
    /// `name` in `state`.
    pub fn without(name: &str, state: PackageState) -> Self {
        Self {
            name: name.to_owned(),
            state: Some(state),
            ..Self::default()
        }
    }

    /// The cell of a Table's PACKAGE column: `name-evr.arch` (`+N` when more are
    /// installed), or `name (state)`.
    pub fn cell(&self) -> String {
        match (&self.evr, &self.arch, self.state) {
            (Some(evr), arch, _) => {
                let arch = arch.as_deref().map(|a| format!(".{a}")).unwrap_or_default();
                let more = match self.installed.len() {
                    0 | 1 => String::new(),
                    n => format!(" (+{})", n - 1),
                };
                format!("{}-{evr}{arch}{more}", self.name)
            }
            (None, _, Some(state)) => format!("{} ({})", self.name, state.as_str()),
            (None, _, None) => self.name.clone(),
        }
    }
}

impl PackageState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Absent => "Absent",
            Self::NoPackageList => "NoPackageList",
            Self::Unknown => "Unknown",
        }
    }
}

impl ManagedOSVersionChangelogSummary {
    /// An empty summary with `apiVersion` and `kind` set.
    pub fn new() -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: SUMMARY_KIND.to_owned(),
            ..Self::default()
        }
    }

    /// Sets `status` from `reason` and `message`, once they are final.
    pub fn with_status(mut self) -> Self {
        self.status = SummaryStatus::of_version(self.reason, self.message.as_deref());
        self
    }
}

/// List metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// Resource version of the list (empty: this API keeps none).
    #[serde(default)]
    pub resource_version: String,
}

/// `ManagedOSVersionChangelogSummaryList`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedOSVersionChangelogSummaryList {
    /// Always `changelog.elemental.cattle.io/v1beta1`.
    pub api_version: String,
    /// Always `ManagedOSVersionChangelogSummaryList`.
    pub kind: String,
    /// List metadata.
    pub metadata: ListMeta,
    /// Items.
    pub items: Vec<ManagedOSVersionChangelogSummary>,
}

impl ManagedOSVersionChangelogSummaryList {
    /// A list of `items` with `apiVersion` and `kind` set.
    pub fn new(items: Vec<ManagedOSVersionChangelogSummary>) -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: SUMMARY_LIST_KIND.to_owned(),
            metadata: ListMeta::default(),
            items,
        }
    }
}
