//! The `changelog.elemental.cattle.io/v1beta1` API contract: the objects served
//! ([`types`]), and everything a client or kube-apiserver's aggregation layer
//! reads about them. No I/O happens here.

pub mod arch;
pub mod content;
pub mod discovery;
pub mod fleet;
pub mod identity;
pub mod openapi;
pub mod render;
pub mod status;
pub mod table;
pub mod types;

pub use arch::Arch;

/// API group served.
pub const GROUP: &str = "changelog.elemental.cattle.io";
/// API version served.
pub const VERSION: &str = "v1beta1";
/// `group/version`.
pub const API_VERSION: &str = "changelog.elemental.cattle.io/v1beta1";
/// The resource: ManagedOSVersion changelog summaries.
pub const RESOURCE: &str = "managedosversions";
/// The subresource: a ManagedOSVersion's changelog.
pub const SUBRESOURCE: &str = "changelog";
/// Kind of the subresource.
pub const CHANGELOG_KIND: &str = "ManagedOSVersionChangelog";
/// Kind of the resource.
pub const SUMMARY_KIND: &str = "ManagedOSVersionChangelogSummary";
/// Kind of a list of the resource.
pub const SUMMARY_LIST_KIND: &str = "ManagedOSVersionChangelogSummaryList";
/// The fleet resource: MachineInventory changelog summaries.
pub const MACHINE_RESOURCE: &str = "machineinventories";
/// Singular of [`MACHINE_RESOURCE`].
pub const MACHINE_SINGULAR: &str = "machineinventory";
/// Kind of a machine's summary.
pub const MACHINE_SUMMARY_KIND: &str = "MachineInventoryChangelogSummary";
/// Kind of a list of machine summaries.
pub const MACHINE_SUMMARY_LIST_KIND: &str = "MachineInventoryChangelogSummaryList";
/// The resource whose `changelog` subresource is an upgrade plan.
pub const IMAGE_RESOURCE: &str = "managedosimages";
/// Kind of a ManagedOSImage's upgrade plan.
pub const IMAGE_CHANGELOG_KIND: &str = "ManagedOSImageChangelog";
