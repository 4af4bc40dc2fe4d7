//! Schemas and paths of the fleet view: machines, their changelogs and the
//! upgrade plans of ManagedOSImages.

use serde_json::{Map, Value, json};

use super::{
    ALLOW_WATCH_BOOKMARKS, ARCH, CHANGELOG_TYPES, FORMAT, INCLUDE_OBJECT, JSON_TYPES, META,
    NAMESPACE, Operation, PREFIX, Param, RESOURCE_VERSION, RESOURCE_VERSION_MATCH,
    SEND_INITIAL_EVENTS, Scalar, Spec, TIMEOUT_SECONDS, WATCH, array_of, described_ref,
    enum_values, enumeration, gvk, integer, kind_fields, object, string,
};
use crate::fleet::{
    CveState, MachineReason, MachineState, PlanTargetReason, SelectionReason, TargetReason,
    TargetSource,
};
use crate::{
    API_VERSION, CHANGELOG_KIND, GROUP, IMAGE_CHANGELOG_KIND, MACHINE_SUMMARY_KIND,
    MACHINE_SUMMARY_LIST_KIND, VERSION,
};

fn machine_state() -> Value {
    enumeration(
        enum_values(&[
            MachineState::UpToDate,
            MachineState::UpdatesAvailable,
            MachineState::Unknown,
        ]),
        "UpToDate, UpdatesAvailable or Unknown.",
    )
}

fn machine_reason(description: &str) -> Value {
    enumeration(
        enum_values(&[
            MachineReason::NoAnnotation,
            MachineReason::Unmanaged,
            MachineReason::VersionInNoChannel,
            MachineReason::Ambiguous,
            MachineReason::ChannelNotFetched,
            MachineReason::TargetOlder,
            MachineReason::OtherChannel,
            MachineReason::MetadataTooLarge,
        ]),
        description,
    )
}

/// Adds the fleet view's schemas to `m`: the machine kinds, and the plan's
/// ([`plan_schemas`]).
pub(super) fn schemas(spec: Spec, m: &mut Map<String, Value>) {
    let p = |n: &str| format!("{PREFIX}{n}");
    machine_part_schemas(spec, m);

    let (api_version, kind) = kind_fields(MACHINE_SUMMARY_KIND);
    let mut machine = object(
        "A registered machine (MachineInventory): the version it runs, the version it would be upgraded to, and what is pending between them.",
        &["apiVersion", "kind", "metadata", "os", "state"],
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": described_ref(spec, &format!("{META}ObjectMeta"), "Standard object metadata: that of the MachineInventory."),
            "os": described_ref(spec, &p("ReportedOs"), "What the machine reported about its OS."),
            "current": described_ref(spec, &p("ChannelVersion"), "The ManagedOSVersion the machine runs, when resolved."),
            "target": described_ref(spec, &p("MachineTarget"), "The version the machine would be upgraded to, when resolved."),
            "state": machine_state(),
            "reason": machine_reason("Why the machine is in its state, when that needs explaining."),
            "message": string("Human-readable detail for reason."),
            "summary": described_ref(spec, &p("ChangelogSummary"), "Counts of the changelog from current to target, when there is one."),
            "cve": described_ref(spec, &p("MachineCve"), "Exposure to the CVE asked for with ?cve=.")
        }),
    );
    machine["x-kubernetes-group-version-kind"] = gvk(GROUP, VERSION, MACHINE_SUMMARY_KIND);
    m.insert(p(MACHINE_SUMMARY_KIND), machine);

    let (api_version, kind) = kind_fields(MACHINE_SUMMARY_LIST_KIND);
    let mut list = object(
        "A list of MachineInventoryChangelogSummary.",
        &["apiVersion", "kind", "metadata", "items"],
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": described_ref(spec, &format!("{META}ListMeta"), "Standard list metadata."),
            "items": array_of(spec, &p(MACHINE_SUMMARY_KIND), "Items, sorted by namespace then name.")
        }),
    );
    list["x-kubernetes-group-version-kind"] = gvk(GROUP, VERSION, MACHINE_SUMMARY_LIST_KIND);
    m.insert(p(MACHINE_SUMMARY_LIST_KIND), list);

    plan_schemas(spec, m);
}

/// What a machine's answer is made of: its current version, its target, the OS it reported
/// and its exposure to a CVE.
fn machine_part_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let p = |n: &str| format!("{PREFIX}{n}");
    m.insert(
        p("ChannelVersion"),
        object(
            "A ManagedOSVersion and its channel.",
            &["name", "version", "channel"],
            json!({
                "name": string("ManagedOSVersion name."),
                "version": string("spec.version of the ManagedOSVersion."),
                "channel": string("Name of its ManagedOSVersionChannel.")
            }),
        ),
    );
    m.insert(
        p("MachineTarget"),
        object(
            "The version a machine would be upgraded to.",
            &["name", "version", "channel", "source"],
            json!({
                "name": string("ManagedOSVersion name."),
                "version": string("spec.version of the ManagedOSVersion."),
                "channel": string("Name of its ManagedOSVersionChannel."),
                "source": enumeration(enum_values(&[TargetSource::ManagedOSImage, TargetSource::NewestInChannel]),
                    "Where the target comes from: a ManagedOSImage selecting the machine, or the newest version of the channel of its current version."),
                "managedOSImage": string("The ManagedOSImage that assigns the target, when source is ManagedOSImage."),
                "reason": enumeration(enum_values(&[
                    TargetReason::ClusterUnresolved,
                    TargetReason::ManagedOSImagesDisagree,
                    TargetReason::ManagedOSImageUnresolved,
                ]), "Why the target is not from a ManagedOSImage although one could apply."),
                "message": string("Human-readable detail for reason.")
            }),
        ),
    );
    m.insert(
        p("ReportedOs"),
        object(
            "What the machine reported about its OS (the elemental.cattle.io/os.* annotations of its MachineInventory).",
            &[],
            json!({
                "image": string("elemental.cattle.io/os.image: IMAGE of /etc/os-release."),
                "version": string("elemental.cattle.io/os.version: VERSION of /etc/os-release."),
                "prettyName": string("elemental.cattle.io/os.pretty-name: PRETTY_NAME of /etc/os-release.")
            }),
        ),
    );
    m.insert(
        p("MachineCve"),
        object(
            "A machine's exposure to the CVE asked for with ?cve=.",
            &["id", "state"],
            json!({
                "id": string("The CVE asked for."),
                "state": enumeration(enum_values(&[CveState::Fixed, CveState::Exposed, CveState::NoFixInChannel, CveState::Unknown]),
                    "Fixed: the current version is, or comes after, a version whose advisories fix it. Exposed: a newer version of the channel fixes it. NoFixInChannel: no version of the channel fixes it. Unknown: the current version is not resolved."),
                "fixedIn": described_ref(spec, &p("VersionRef"), "The first version of the channel whose advisories fix the CVE.")
            }),
        ),
    );
}

/// `ManagedOSImageChangelog`, a ManagedOSImage's upgrade plan, and what it is made of: the
/// groups of machines by the version they run, the machines left out, the cluster targets
/// that cannot be evaluated.
fn plan_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let p = |n: &str| format!("{PREFIX}{n}");
    m.insert(
        p("PlanGroup"),
        object(
            "Machines of an upgrade plan that run the same version.",
            &["current", "state", "machines"],
            json!({
                "current": described_ref(spec, &p("ChannelVersion"), "The version these machines run."),
                "state": machine_state(),
                "reason": machine_reason("Why the group is in its state, when that needs explaining."),
                "machines": {"type": "array", "items": {"type": "string", "default": ""}, "description": "MachineInventory names, sorted."},
                "summary": described_ref(spec, &p("ChangelogSummary"), "Counts of the changelog from current to the plan's target.")
            }),
        ),
    );
    m.insert(
        p("PlanMachine"),
        object(
            "A machine of an upgrade plan left out of the groups.",
            &["name", "reason", "message"],
            json!({
                "name": string("MachineInventory name."),
                "reason": string("Why its current version is unknown (a machine reason), or why it cannot be decided whether the plan selects it (a selection reason)."),
                "message": string("Human-readable detail.")
            }),
        ),
    );
    let selection_reasons = enum_values(&[
        SelectionReason::ClusterUnknown,
        SelectionReason::ClusterLabelsUnknown,
        SelectionReason::ClusterGroupUnknown,
        SelectionReason::InvalidSelector,
        SelectionReason::EmptyTarget,
        SelectionReason::ManagedOSImageTooLarge,
    ]);
    m.insert(
        p("UnresolvedClusterTarget"),
        object(
            "A clusterTargets entry of the ManagedOSImage that cannot be evaluated here.",
            &["index", "reason", "message"],
            json!({
                "index": integer("Position in spec.clusterTargets."),
                "name": string("name of the entry, if any."),
                "reason": enumeration(selection_reasons, "Why it cannot be evaluated."),
                "message": string("Human-readable detail.")
            }),
        ),
    );
    let (api_version, kind) = kind_fields(IMAGE_CHANGELOG_KIND);
    let mut plan = object(
        "The upgrade plan of a ManagedOSImage before it runs: its target version and the machines it selects, grouped by the version they run.",
        &["apiVersion", "kind", "metadata", "groups"],
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": described_ref(spec, &format!("{META}ObjectMeta"), "Standard object metadata: that of the ManagedOSImage."),
            "target": described_ref(spec, &p("ChannelVersion"), "The version the ManagedOSImage installs, when resolved."),
            "targetReason": enumeration(enum_values(&[
                PlanTargetReason::NoTarget,
                PlanTargetReason::VersionNotFound,
                PlanTargetReason::ImageInNoChannel,
                PlanTargetReason::Ambiguous,
                PlanTargetReason::ManagedOSImageTooLarge,
            ]), "Why the target is not resolved, when not."),
            "targetMessage": string("Human-readable detail for targetReason."),
            "groups": array_of(spec, &p("PlanGroup"), "Selected machines grouped by the version they run."),
            "unknownMachines": array_of(spec, &p("PlanMachine"), "Selected machines whose current version is unknown, and machines of which it cannot be decided whether the plan selects them."),
            "unresolvedTargets": array_of(spec, &p("UnresolvedClusterTarget"), "clusterTargets entries that cannot be evaluated here.")
        }),
    );
    plan["x-kubernetes-group-version-kind"] = gvk(GROUP, VERSION, IMAGE_CHANGELOG_KIND);
    m.insert(p(IMAGE_CHANGELOG_KIND), plan);
}

const MACHINE_NAME: Param = Param {
    name: "name",
    location: "path",
    description: "name of the MachineInventory",
    values: &[],
    ty: Scalar::String,
};
const IMAGE_NAME: Param = Param {
    name: "name",
    location: "path",
    description: "name of the ManagedOSImage",
    values: &[],
    ty: Scalar::String,
};
const MACHINE_LABEL_SELECTOR: Param = Param {
    name: "labelSelector",
    location: "query",
    description: "A selector to restrict the list of returned objects by the labels of their MachineInventory. Defaults to everything.",
    values: &[],
    ty: Scalar::String,
};
const MACHINE_FIELD_SELECTOR: Param = Param {
    name: "fieldSelector",
    location: "query",
    description: "A selector to restrict the list of returned objects by their fields: metadata.name and metadata.namespace (=, ==, !=). Defaults to everything.",
    values: &[],
    ty: Scalar::String,
};
const MACHINE_CVE: Param = Param {
    name: "cve",
    location: "query",
    description: "Add to each machine its exposure to this CVE (e.g. CVE-2024-1234): Fixed, Exposed, NoFixInChannel or Unknown.",
    values: &[],
    ty: Scalar::String,
};
const TO: Param = Param {
    name: "to",
    location: "query",
    description: "Name of a newer ManagedOSVersion of the channel of the machine's current version to compare with. Defaults to the machine's target.",
    values: &[],
    ty: Scalar::String,
};

const MACHINE_LIST_PARAMS: &[Param] = &[
    MACHINE_LABEL_SELECTOR,
    MACHINE_FIELD_SELECTOR,
    MACHINE_CVE,
    ARCH,
    INCLUDE_OBJECT,
    WATCH,
    RESOURCE_VERSION,
    RESOURCE_VERSION_MATCH,
    SEND_INITIAL_EVENTS,
    ALLOW_WATCH_BOOKMARKS,
    TIMEOUT_SECONDS,
];

/// The fleet view's operations.
pub(super) fn operations() -> Vec<(String, Operation)> {
    let base = format!("/apis/{API_VERSION}");
    vec![
        (
            format!("{base}/machineinventories"),
            Operation {
                id: "listChangelogElementalCattleIoV1beta1MachineInventoryForAllNamespaces",
                description: "list the machines (MachineInventories) of all namespaces with their current and target versions (lists are complete: limit and continue are ignored; watch=true streams the changes)",
                action: "list",
                kind: MACHINE_SUMMARY_KIND,
                response: MACHINE_SUMMARY_LIST_KIND,
                produces: JSON_TYPES,
                path_params: &[],
                query_params: MACHINE_LIST_PARAMS,
            },
        ),
        (
            format!("{base}/namespaces/{{namespace}}/machineinventories"),
            Operation {
                id: "listChangelogElementalCattleIoV1beta1NamespacedMachineInventory",
                description: "list the machines (MachineInventories) of a namespace with their current and target versions (lists are complete: limit and continue are ignored; watch=true streams the changes)",
                action: "list",
                kind: MACHINE_SUMMARY_KIND,
                response: MACHINE_SUMMARY_LIST_KIND,
                produces: JSON_TYPES,
                path_params: &[NAMESPACE],
                query_params: MACHINE_LIST_PARAMS,
            },
        ),
        (
            format!("{base}/namespaces/{{namespace}}/machineinventories/{{name}}"),
            Operation {
                id: "readChangelogElementalCattleIoV1beta1NamespacedMachineInventory",
                description: "read a machine's current and target versions and what is pending between them",
                action: "get",
                kind: MACHINE_SUMMARY_KIND,
                response: MACHINE_SUMMARY_KIND,
                produces: JSON_TYPES,
                path_params: &[MACHINE_NAME, NAMESPACE],
                query_params: &[MACHINE_CVE, ARCH, INCLUDE_OBJECT],
            },
        ),
        (
            format!("{base}/namespaces/{{namespace}}/machineinventories/{{name}}/changelog"),
            Operation {
                id: "readChangelogElementalCattleIoV1beta1NamespacedMachineInventoryChangelog",
                description: "read the changelog from the version a machine runs to its target (or to)",
                action: "get",
                kind: CHANGELOG_KIND,
                response: CHANGELOG_KIND,
                produces: CHANGELOG_TYPES,
                path_params: &[MACHINE_NAME, NAMESPACE],
                query_params: &[TO, ARCH, FORMAT],
            },
        ),
        (
            format!("{base}/namespaces/{{namespace}}/managedosimages/{{name}}/changelog"),
            Operation {
                id: "readChangelogElementalCattleIoV1beta1NamespacedManagedOSImageChangelog",
                description: "read the upgrade plan of a ManagedOSImage: its target and the machines it selects, grouped by the version they run",
                action: "get",
                kind: IMAGE_CHANGELOG_KIND,
                response: IMAGE_CHANGELOG_KIND,
                produces: &["application/json"],
                path_params: &[IMAGE_NAME, NAMESPACE],
                query_params: &[ARCH],
            },
        ),
    ]
}
