//! OpenAPI documents describing this API: v2 (`GET /openapi/v2`, Swagger 2.0)
//! and v3 (`GET /openapi/v3` and `GET /openapi/v3/apis/<group>/<version>`,
//! OpenAPI 3.0.0), shaped like kube-apiserver's so kube-aggregator can merge
//! them and `kubectl explain` can read them. Built once.

mod fleet;

use std::sync::LazyLock;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::discovery::{Document, hex_upper};
use crate::types::{Severity, Source, UnavailableReason};
use crate::{API_VERSION, CHANGELOG_KIND, GROUP, SUMMARY_KIND, SUMMARY_LIST_KIND, VERSION};

/// Path of the group-version document under `/openapi/v3/`, as it appears in
/// the v3 root document.
pub const V3_GROUP_VERSION_PATH: &str = "apis/changelog.elemental.cattle.io/v1beta1";

/// Prefix of the names of this API's schemas.
const PREFIX: &str = "io.cattle.elemental.changelog.v1beta1.";
/// Prefix of the apimachinery schemas referenced.
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";

/// Where schemas live in each OpenAPI version.
#[derive(Clone, Copy)]
enum Spec {
    V2,
    V3,
}

impl Spec {
    fn reference(self, name: &str) -> Value {
        let base = match self {
            Self::V2 => "#/definitions/",
            Self::V3 => "#/components/schemas/",
        };
        json!({ "$ref": format!("{base}{name}") })
    }
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn date_time(description: &str) -> Value {
    json!({"type": "string", "format": "date-time", "description": description})
}

fn integer(description: &str) -> Value {
    json!({"type": "integer", "format": "int64", "description": description})
}

fn strings(description: &str) -> Value {
    json!({"type": "array", "items": {"type": "string", "default": ""}, "description": description})
}

fn array_of(spec: Spec, name: &str, description: &str) -> Value {
    json!({"type": "array", "items": spec.reference(name), "description": description})
}

/// A reference with a description: v2 allows siblings of `$ref` to be
/// ignored, v3 (as kube-openapi writes it) wraps the reference in `allOf`.
fn described_ref(spec: Spec, name: &str, description: &str) -> Value {
    match spec {
        Spec::V2 => {
            let mut r = spec.reference(name);
            r["description"] = Value::from(description);
            r
        }
        Spec::V3 => json!({"allOf": [spec.reference(name)], "description": description}),
    }
}

/// The wire names of an enum's unit variants, read from its serializer so
/// the schema cannot drift from the type.
fn enum_values<T: Serialize>(variants: &[T]) -> Vec<Value> {
    variants
        .iter()
        .filter_map(|v| serde_json::to_value(v).ok())
        .collect()
}

fn enumeration(values: Vec<Value>, description: &str) -> Value {
    json!({"type": "string", "enum": values, "description": description})
}

fn object(description: &str, required: &[&str], properties: Value) -> Value {
    let mut o = json!({"type": "object", "description": description, "properties": properties});
    if !required.is_empty() {
        o["required"] = json!(required);
    }
    o
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!([{"group": group, "version": version, "kind": kind}])
}

fn kind_fields(kind: &str) -> (Value, Value) {
    (
        string(&format!(
            "APIVersion defines the versioned schema of this representation of an object. Always `{API_VERSION}`."
        )),
        string(&format!(
            "Kind is a string value representing the REST resource this object represents. Always `{kind}`."
        )),
    )
}

/// All schemas, keyed by name.
fn schemas(spec: Spec) -> Map<String, Value> {
    let p = |n: &str| format!("{PREFIX}{n}");
    let mut m = Map::new();
    changelog_schemas(spec, &mut m);

    let (api_version, kind) = kind_fields(SUMMARY_KIND);
    let mut summary = object(
        "A ManagedOSVersion, whether its changelog is available, and its counts.",
        &[
            "apiVersion",
            "kind",
            "metadata",
            "channel",
            "version",
            "available",
        ],
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": described_ref(spec, &format!("{META}ObjectMeta"), "Standard object metadata: that of the ManagedOSVersion summarized."),
            "channel": described_ref(spec, &p("ChannelRef"), "Its channel."),
            "version": string("spec.version."),
            "created": date_time("Channel entry creation time, when known."),
            "available": {"type": "boolean", "description": "Whether a changelog can be served."},
            "reason": enumeration(enum_values(&[
                UnavailableReason::NoChannel,
                UnavailableReason::ChannelHasNoImage,
                UnavailableReason::NotFetched,
                UnavailableReason::NoChangelogData,
                UnavailableReason::FetchFailed,
            ]), "Why no changelog is available, when not."),
            "message": string("Human-readable detail for reason."),
            "from": described_ref(spec, &p("VersionRef"), "The version compared against."),
            "summary": described_ref(spec, &p("ChangelogSummary"), "Counts, when available.")
        }),
    );
    summary["x-kubernetes-group-version-kind"] = gvk(GROUP, VERSION, SUMMARY_KIND);
    m.insert(p(SUMMARY_KIND), summary);

    let (api_version, kind) = kind_fields(SUMMARY_LIST_KIND);
    let mut list = object(
        "A list of ManagedOSVersionChangelogSummary.",
        &["apiVersion", "kind", "metadata", "items"],
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": described_ref(spec, &format!("{META}ListMeta"), "Standard list metadata."),
            "items": array_of(spec, &p(SUMMARY_KIND), "Items.")
        }),
    );
    list["x-kubernetes-group-version-kind"] = gvk(GROUP, VERSION, SUMMARY_LIST_KIND);
    m.insert(p(SUMMARY_LIST_KIND), list);

    fleet::schemas(spec, &mut m);
    meta_schemas(spec, &mut m);
    m
}

/// `ManagedOSVersionChangelog` and what it is made of: the references of its channel and
/// version, its advisories, its package changes and its counts (which a summary shows too).
fn changelog_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let p = |n: &str| format!("{PREFIX}{n}");
    reference_schemas(m);
    advisory_schemas(spec, m);
    package_change_schemas(spec, m);
    m.insert(
        p("ChangelogSummary"),
        object(
            "Counts that describe a changelog at a glance.",
            &["advisories", "cves", "highestSeverity"],
            json!({
                "advisories": integer("Number of advisories."),
                "byType": {"type": "object", "additionalProperties": {"type": "integer", "format": "int64", "default": 0},
                           "description": "Advisories by type."},
                "cves": integer("Distinct CVEs fixed."),
                "highestSeverity": severity(),
                "packagesUpgraded": integer("Packages upgraded, when package lists exist."),
                "packagesDowngraded": integer("Packages downgraded, when package lists exist."),
                "packagesAdded": integer("Packages added, when package lists exist."),
                "packagesRemoved": integer("Packages removed, when package lists exist.")
            }),
        ),
    );

    let (api_version, kind) = kind_fields(CHANGELOG_KIND);
    let mut changelog = object(
        "What changed in a ManagedOSVersion, compared with an older version of the same channel.",
        &[
            "apiVersion",
            "kind",
            "metadata",
            "channel",
            "version",
            "arch",
            "source",
            "summary",
            "advisories",
        ],
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": described_ref(spec, &format!("{META}ObjectMeta"), "Standard object metadata: that of the ManagedOSVersion this changelog is for."),
            "channel": described_ref(spec, &p("ChannelRef"), "Its channel and the image the data came from."),
            "version": string("spec.version of the ManagedOSVersion."),
            "from": described_ref(spec, &p("VersionRef"), "The older version compared against; absent for the oldest version."),
            "arch": string("Architecture the data describes."),
            "source": enumeration(enum_values(&[Source::Precomputed, Source::Computed]), "Where the advisories came from."),
            "summary": described_ref(spec, &p("ChangelogSummary"), "Counts."),
            "advisories": array_of(spec, &p("Advisory"), "Advisories, newest first."),
            "packages": described_ref(spec, &p("PackageChanges"), "Package differences, when package lists exist."),
            "warnings": strings("Remarks about the data for the reader.")
        }),
    );
    changelog["x-kubernetes-group-version-kind"] = gvk(GROUP, VERSION, CHANGELOG_KIND);
    m.insert(p(CHANGELOG_KIND), changelog);
}

/// The references to a channel and to a version that changelogs, summaries and the fleet
/// view's answers carry.
fn reference_schemas(m: &mut Map<String, Value>) {
    let p = |n: &str| format!("{PREFIX}{n}");
    m.insert(
        p("ChannelRef"),
        object(
            "The channel a version belongs to and the image its data came from.",
            &["name"],
            json!({
                "name": string("Name of the ManagedOSVersionChannel."),
                "image": string("Image reference named by the channel (spec.options.image)."),
                "digest": string("Manifest digest of the image the data was read from."),
                "retained": {"type": "boolean", "description": "True when the data was kept from an earlier image of the channel that listed this version."}
            }),
        ),
    );
    m.insert(
        p("VersionRef"),
        object(
            "A version of a channel.",
            &["name", "version"],
            json!({
                "name": string("ManagedOSVersion name."),
                "version": string("OS version (spec.version).")
            }),
        ),
    );
}

/// An advisory, its references and the packages it ships.
fn advisory_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let p = |n: &str| format!("{PREFIX}{n}");
    m.insert(
        p("Reference"),
        object(
            "A reference of an advisory.",
            &[],
            json!({
                "id": string("Reference id (bug number, CVE id)."),
                "type": string("Kind of reference (bugzilla, cve, ...)."),
                "href": string("Link."),
                "title": string("Title.")
            }),
        ),
    );
    m.insert(
        p("AdvisoryPackage"),
        object(
            "A package an advisory ships.",
            &["name", "version", "release", "arch"],
            json!({
                "name": string("Package name."),
                "epoch": string("Epoch, when not 0."),
                "version": string("Version."),
                "release": string("Release."),
                "arch": string("Architecture.")
            }),
        ),
    );
    m.insert(
        p("Advisory"),
        object(
            "One advisory (patch) in a changelog.",
            &["id", "type", "severity", "title"],
            json!({
                "id": string("Advisory id."),
                "type": string("security, recommended, feature, optional, ..."),
                "severity": severity(),
                "title": string("Title."),
                "issued": date_time("Issue time."),
                "cves": strings("CVE ids fixed."),
                "bugs": strings("Bug ids fixed."),
                "references": array_of(spec, &p("Reference"), "All references as published."),
                "description": string("Description."),
                "packages": array_of(spec, &p("AdvisoryPackage"), "Packages shipped.")
            }),
        ),
    );
}

/// The package differences between two OS versions.
fn package_change_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let p = |n: &str| format!("{PREFIX}{n}");
    m.insert(
        p("PackageChange"),
        object(
            "A package whose version changed.",
            &["name", "arch"],
            json!({
                "name": string("Package name."),
                "arch": string("Architecture."),
                "from": string("EVR in the older version; absent when added."),
                "to": string("EVR in the newer version; absent when removed.")
            }),
        ),
    );
    m.insert(
        p("PackageChanges"),
        object(
            "Package differences between two OS versions.",
            &[],
            json!({
                "upgraded": array_of(spec, &p("PackageChange"), "Packages at a higher EVR."),
                "downgraded": array_of(spec, &p("PackageChange"), "Packages at a lower EVR."),
                "added": array_of(spec, &p("PackageChange"), "Packages only in the newer version."),
                "removed": array_of(spec, &p("PackageChange"), "Packages only in the older version.")
            }),
        ),
    );
}

/// An advisory's severity, as the changelog and its counts name it.
fn severity() -> Value {
    enumeration(
        enum_values(&[
            Severity::Unspecified,
            Severity::Low,
            Severity::Moderate,
            Severity::Important,
            Severity::Critical,
        ]),
        "Severity, from lowest to highest.",
    )
}

/// The apimachinery schemas referenced, as k8s.io/apimachinery defines them.
fn meta_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let q = |n: &str| format!("{META}{n}");
    object_meta_schemas(spec, m);
    m.insert(
        q("ListMeta"),
        object(
            "ListMeta describes metadata that synthetic resources must have, including lists and various status objects.",
            &[],
            json!({
                "continue": string("continue may be set if the user set a limit on the number of items returned."),
                "remainingItemCount": integer("remainingItemCount is the number of subsequent items in the list which are not included in this list response."),
                "resourceVersion": string("String that identifies the server's internal version of this object."),
                "selfLink": string("Deprecated: selfLink is a legacy read-only field that is no longer populated by the system.")
            }),
        ),
    );
    status_schemas(spec, m);
    api_resource_schemas(spec, m);
}

/// `Status`, its details and causes, as k8s.io/apimachinery defines them.
fn status_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let q = |n: &str| format!("{META}{n}");
    m.insert(
        q("StatusCause"),
        object(
            "StatusCause provides more information about an api.Status failure, including cases when multiple errors are encountered.",
            &[],
            json!({
                "field": string("The field of the resource that has caused this error, as named by its JSON serialization."),
                "message": string("A human-readable description of the cause of the error."),
                "reason": string("A machine-readable description of the cause of the error.")
            }),
        ),
    );
    m.insert(
        q("StatusDetails"),
        object(
            "StatusDetails is a set of additional properties that MAY be set by the server to provide additional information about a response.",
            &[],
            json!({
                "causes": {"type": "array", "items": spec.reference(&q("StatusCause")), "x-kubernetes-list-type": "atomic",
                           "description": "The Causes array includes more details associated with the StatusReason failure."},
                "group": string("The group attribute of the resource associated with the status StatusReason."),
                "kind": string("The kind attribute of the resource associated with the status StatusReason."),
                "name": string("The name attribute of the resource associated with the status StatusReason."),
                "retryAfterSeconds": {"type": "integer", "format": "int32", "description": "If specified, the time in seconds before the operation should be retried."},
                "uid": string("UID of the resource.")
            }),
        ),
    );
    let mut status = object(
        "Status is a return value for calls that don't return other objects.",
        &[],
        json!({
            "apiVersion": string("APIVersion defines the versioned schema of this representation of an object."),
            "code": {"type": "integer", "format": "int32", "description": "Suggested HTTP return code for this status, 0 if not set."},
            "details": described_ref(spec, &q("StatusDetails"), "Extended data associated with the reason."),
            "kind": string("Kind is a string value representing the REST resource this object represents."),
            "message": string("A human-readable description of the status of this operation."),
            "metadata": described_ref(spec, &q("ListMeta"), "Standard list metadata."),
            "reason": string("A machine-readable description of why this operation is in the \"Failure\" status."),
            "status": string("Status of the operation. One of: \"Success\" or \"Failure\".")
        }),
    );
    status["x-kubernetes-group-version-kind"] = gvk("", "v1", "Status");
    m.insert(q("Status"), status);
}

/// `APIResource` and `APIResourceList`, as k8s.io/apimachinery defines them.
fn api_resource_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let q = |n: &str| format!("{META}{n}");
    m.insert(
        q("APIResource"),
        object(
            "APIResource specifies the name of a resource and whether it is namespaced.",
            &["name", "singularName", "namespaced", "kind", "verbs"],
            json!({
                "categories": strings("categories is a list of the grouped resources this resource belongs to."),
                "group": string("group is the preferred group of the resource."),
                "kind": string("kind is the kind for the resource."),
                "name": string("name is the plural name of the resource."),
                "namespaced": {"type": "boolean", "default": false, "description": "namespaced indicates if a resource is namespaced or not."},
                "shortNames": strings("shortNames is a list of suggested short names of the resource."),
                "singularName": string("singularName is the singular name of the resource."),
                "storageVersionHash": string("The hash value of the storage version."),
                "verbs": strings("verbs is a list of supported kube verbs."),
                "version": string("version is the preferred version of the resource.")
            }),
        ),
    );
    let mut list = object(
        "APIResourceList is a list of APIResource, it is used to expose the name of the resources supported in a specific group and version, and if the resource is namespaced.",
        &["groupVersion", "resources"],
        json!({
            "apiVersion": string("APIVersion defines the versioned schema of this representation of an object."),
            "groupVersion": string("groupVersion is the group and version this APIResourceList is for."),
            "kind": string("Kind is a string value representing the REST resource this object represents."),
            "resources": {"type": "array", "items": spec.reference(&q("APIResource")), "x-kubernetes-list-type": "atomic",
                          "description": "resources contains the name of the resources and if they are namespaced."}
        }),
    );
    list["x-kubernetes-group-version-kind"] = gvk("", "v1", "APIResourceList");
    m.insert(q("APIResourceList"), list);
}

/// `ObjectMeta` and the schemas it references, complete as kube-apiserver
/// publishes them, so `kubectl explain` shows the standard metadata. This API
/// fills `name`, `namespace`, `uid`, `resourceVersion`, `creationTimestamp`
/// and `labels` from the ManagedOSVersion described.
fn object_meta_schemas(spec: Spec, m: &mut Map<String, Value>) {
    let q = |n: &str| format!("{META}{n}");
    let string_map = |description: &str| json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": description});
    m.insert(
        q("Time"),
        json!({"type": "string", "format": "date-time",
               "description": "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON. Wrappers are provided for many of the factory methods that the time package offers."}),
    );
    m.insert(
        q("FieldsV1"),
        json!({"type": "object",
               "description": "FieldsV1 stores a set of fields in a data structure like a Trie, in JSON format."}),
    );
    m.insert(
        q("ManagedFieldsEntry"),
        object(
            "ManagedFieldsEntry is a workflow-id, a FieldSet and the group version of the resource that the fieldset applies to.",
            &[],
            json!({
                "apiVersion": string("APIVersion defines the version of this resource that this field set applies to."),
                "fieldsType": string("FieldsType is the discriminator for the different fields format and version. There is currently only one possible value: \"FieldsV1\""),
                "fieldsV1": described_ref(spec, &q("FieldsV1"), "FieldsV1 holds the first JSON version format as described in the \"FieldsV1\" type."),
                "manager": string("Manager is an identifier of the workflow managing these fields."),
                "operation": string("Operation is the type of operation which lead to this ManagedFieldsEntry being created. The only valid values for this field are 'Apply' and 'Update'."),
                "subresource": string("Subresource is the name of the subresource used to update that object, or empty string if the object was updated through the main resource."),
                "time": described_ref(spec, &q("Time"), "Time is the timestamp of when the ManagedFields entry was added.")
            }),
        ),
    );
    let mut owner = object(
        "OwnerReference contains enough information to let you identify an owning object. An owning object must be in the same namespace as the dependent, or be cluster-scoped, so there is no namespace field.",
        &["apiVersion", "kind", "name", "uid"],
        json!({
            "apiVersion": string("API version of the referent."),
            "blockOwnerDeletion": {"type": "boolean", "description": "If true, AND if the owner has the \"foregroundDeletion\" finalizer, then the owner cannot be deleted from the key-value store until this reference is removed."},
            "controller": {"type": "boolean", "description": "If true, this reference points to the managing controller."},
            "kind": string("Kind of the referent."),
            "name": string("Name of the referent."),
            "uid": string("UID of the referent.")
        }),
    );
    owner["x-kubernetes-map-type"] = json!("atomic");
    m.insert(q("OwnerReference"), owner);
    m.insert(
        q("ObjectMeta"),
        object(
            "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
            &[],
            json!({
                "annotations": string_map("Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata."),
                "creationTimestamp": described_ref(spec, &q("Time"), "CreationTimestamp is a timestamp representing the server time when this object was created. Populated by the system. Read-only. Null for lists."),
                "deletionGracePeriodSeconds": integer("Number of seconds allowed for this object to gracefully terminate before it will be removed from the system. Only set when deletionTimestamp is also set. Read-only."),
                "deletionTimestamp": described_ref(spec, &q("Time"), "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted. Populated by the system when a graceful deletion is requested. Read-only."),
                "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge",
                               "description": "Must be empty before the object is deleted from the registry. Each entry is an identifier for the responsible component that will remove the entry from the list."},
                "generateName": string("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
                "generation": integer("A sequence number representing a specific generation of the desired state. Populated by the system. Read-only."),
                "labels": string_map("Map of string keys and values that can be used to organize and categorize (scope and select) objects."),
                "managedFields": {"type": "array", "items": spec.reference(&q("ManagedFieldsEntry")), "x-kubernetes-list-type": "atomic",
                                  "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow."},
                "name": string("Name must be unique within a namespace. Cannot be updated."),
                "namespace": string("Namespace defines the space within which each name must be unique. Must be a DNS_LABEL. Cannot be updated."),
                "ownerReferences": {"type": "array", "items": spec.reference(&q("OwnerReference")),
                                    "x-kubernetes-list-map-keys": ["uid"], "x-kubernetes-list-type": "map",
                                    "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge",
                                    "description": "List of objects depended by this object. If ALL objects in the list have been deleted, this object will be garbage collected."},
                "resourceVersion": string("An opaque value that represents the internal version of this object that can be used by clients to determine when objects have changed. Populated by the system. Read-only."),
                "selfLink": string("Deprecated: selfLink is a legacy read-only field that is no longer populated by the system."),
                "uid": string("UID is the unique in time and space value for this object. Populated by the system. Read-only.")
            }),
        ),
    );
}

/// A query or path parameter.
struct Param {
    name: &'static str,
    location: &'static str,
    description: &'static str,
    /// The values allowed, when only some are.
    values: &'static [&'static str],
    /// Its type.
    ty: Scalar,
}

/// The type of a parameter's value.
#[derive(Clone, Copy)]
enum Scalar {
    String,
    Boolean,
    Integer,
}

impl Scalar {
    fn schema(self) -> Value {
        match self {
            Self::String => json!({"type": "string"}),
            Self::Boolean => json!({"type": "boolean"}),
            Self::Integer => json!({"type": "integer"}),
        }
    }
}

const NAMESPACE: Param = Param {
    name: "namespace",
    location: "path",
    description: "object name and auth scope, such as for teams and projects",
    values: &[],
    ty: Scalar::String,
};
const NAME: Param = Param {
    name: "name",
    location: "path",
    description: "name of the ManagedOSVersion",
    values: &[],
    ty: Scalar::String,
};
const LABEL_SELECTOR: Param = Param {
    name: "labelSelector",
    location: "query",
    description: "A selector to restrict the list of returned objects by the labels of their ManagedOSVersion. Defaults to everything.",
    values: &[],
    ty: Scalar::String,
};
const FIELD_SELECTOR: Param = Param {
    name: "fieldSelector",
    location: "query",
    description: "A selector to restrict the list of returned objects by their fields: metadata.name and metadata.namespace (=, ==, !=). Defaults to everything.",
    values: &[],
    ty: Scalar::String,
};
const INCLUDE_OBJECT: Param = Param {
    name: "includeObject",
    location: "query",
    description: "With a Table (Accept: application/json;as=Table;v=v1;g=meta.k8s.io), what each row carries: None, Metadata (a PartialObjectMetadata, the default) or Object.",
    values: &["None", "Metadata", "Object"],
    ty: Scalar::String,
};
const CVE: Param = Param {
    name: "cve",
    location: "query",
    description: "Only versions whose changelog fixes this CVE (e.g. CVE-2024-1234).",
    values: &[],
    ty: Scalar::String,
};
const FROM: Param = Param {
    name: "from",
    location: "query",
    description: "Name of another ManagedOSVersion of the same channel to compare against. Defaults to the previous version of the channel.",
    values: &[],
    ty: Scalar::String,
};
const ARCH: Param = Param {
    name: "arch",
    location: "query",
    description: "Architecture of the OS image (x86_64, aarch64). Defaults to the server's default architecture.",
    values: &[],
    ty: Scalar::String,
};
const FORMAT: Param = Param {
    name: "format",
    location: "query",
    description: "Representation of the changelog: json (default), text or markdown (also md).",
    values: &["json", "text", "markdown", "md"],
    ty: Scalar::String,
};

// The watch options of a list (`?watch=true`), worded as kube-apiserver's OpenAPI words them,
// with what this server does with each.
const WATCH: Param = Param {
    name: "watch",
    location: "query",
    description: "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications (one JSON WatchEvent per line). Specify resourceVersion to start from a list's resourceVersion.",
    values: &[],
    ty: Scalar::Boolean,
};
const RESOURCE_VERSION: Param = Param {
    name: "resourceVersion",
    location: "query",
    description: "With watch: where the watch starts. Unset or \"0\": every object first (ADDED), then the changes; a list's resourceVersion: the changes after that list. A resourceVersion this replica cannot serve (another replica's, from before a restart, older than the events it keeps) ends the watch with one ERROR event, 410 Expired: list again. Ignored without watch (lists are always complete and current).",
    values: &[],
    ty: Scalar::String,
};
const RESOURCE_VERSION_MATCH: Param = Param {
    name: "resourceVersionMatch",
    location: "query",
    description: "With watch, only with sendInitialEvents, and then only NotOlderThan (400 otherwise, as kube-apiserver).",
    values: &["NotOlderThan"],
    ty: Scalar::String,
};
const SEND_INITIAL_EVENTS: Param = Param {
    name: "sendInitialEvents",
    location: "query",
    description: "With watch, resourceVersionMatch=NotOlderThan and allowWatchBookmarks=true: every object first (ADDED), then a BOOKMARK annotated k8s.io/initial-events-end: \"true\", then the changes.",
    values: &[],
    ty: Scalar::Boolean,
};
const ALLOW_WATCH_BOOKMARKS: Param = Param {
    name: "allowWatchBookmarks",
    location: "query",
    description: "With watch: BOOKMARK events (about every 30 s) carrying the latest resourceVersion sent, so a client resumes from there.",
    values: &[],
    ty: Scalar::Boolean,
};
const TIMEOUT_SECONDS: Param = Param {
    name: "timeoutSeconds",
    location: "query",
    description: "With watch: the watch ends after this many seconds (a non-negative integer); unset, between 30 and 60 minutes. Without watch: must be an integer, otherwise ignored.",
    values: &[],
    ty: Scalar::Integer,
};

fn parameter(spec: Spec, p: &Param) -> Value {
    let required = p.location == "path";
    let mut v = json!({"name": p.name, "in": p.location, "description": p.description, "uniqueItems": true});
    if required {
        v["required"] = Value::Bool(true);
    }
    let mut schema = p.ty.schema();
    if !p.values.is_empty() {
        schema["enum"] = json!(p.values);
    }
    match spec {
        Spec::V2 => {
            if let (Some(o), Some(s)) = (v.as_object_mut(), schema.as_object()) {
                o.extend(s.clone());
            }
        }
        Spec::V3 => v["schema"] = schema,
    }
    v
}

/// What an operation answers.
struct Operation {
    id: &'static str,
    description: &'static str,
    action: &'static str,
    kind: &'static str,
    response: &'static str,
    /// Media types the 200 answer may come in.
    produces: &'static [&'static str],
    path_params: &'static [Param],
    query_params: &'static [Param],
}

const JSON_TYPES: &[&str] = &[
    "application/json",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
];
const CHANGELOG_TYPES: &[&str] = &["application/json", "text/plain", "text/markdown"];

/// What a list honours (`limit` and `continue` are ignored: lists are small and always
/// complete), the watch options included.
const LIST_PARAMS: &[Param] = &[
    LABEL_SELECTOR,
    FIELD_SELECTOR,
    CVE,
    ARCH,
    INCLUDE_OBJECT,
    WATCH,
    RESOURCE_VERSION,
    RESOURCE_VERSION_MATCH,
    SEND_INITIAL_EVENTS,
    ALLOW_WATCH_BOOKMARKS,
    TIMEOUT_SECONDS,
];

fn operations() -> Vec<(String, Operation)> {
    let base = format!("/apis/{API_VERSION}");
    vec![
        (
            format!("{base}/managedosversions"),
            Operation {
                id: "listChangelogElementalCattleIoV1beta1ManagedOSVersionForAllNamespaces",
                description: "list changelog summaries of ManagedOSVersions in all namespaces (lists are complete: limit and continue are ignored; watch=true streams the changes)",
                action: "list",
                kind: SUMMARY_KIND,
                response: SUMMARY_LIST_KIND,
                produces: JSON_TYPES,
                path_params: &[],
                query_params: LIST_PARAMS,
            },
        ),
        (
            format!("{base}/namespaces/{{namespace}}/managedosversions"),
            Operation {
                id: "listChangelogElementalCattleIoV1beta1NamespacedManagedOSVersion",
                description: "list changelog summaries of the ManagedOSVersions of a namespace (lists are complete: limit and continue are ignored; watch=true streams the changes)",
                action: "list",
                kind: SUMMARY_KIND,
                response: SUMMARY_LIST_KIND,
                produces: JSON_TYPES,
                path_params: &[NAMESPACE],
                query_params: LIST_PARAMS,
            },
        ),
        (
            format!("{base}/namespaces/{{namespace}}/managedosversions/{{name}}"),
            Operation {
                id: "readChangelogElementalCattleIoV1beta1NamespacedManagedOSVersion",
                description: "read the changelog summary of a ManagedOSVersion",
                action: "get",
                kind: SUMMARY_KIND,
                response: SUMMARY_KIND,
                produces: JSON_TYPES,
                path_params: &[NAME, NAMESPACE],
                query_params: &[ARCH, INCLUDE_OBJECT],
            },
        ),
        (
            format!("{base}/namespaces/{{namespace}}/managedosversions/{{name}}/changelog"),
            Operation {
                id: "readChangelogElementalCattleIoV1beta1NamespacedManagedOSVersionChangelog",
                description: "read the changelog of a ManagedOSVersion",
                action: "get",
                kind: CHANGELOG_KIND,
                response: CHANGELOG_KIND,
                produces: CHANGELOG_TYPES,
                path_params: &[NAME, NAMESPACE],
                query_params: &[FROM, ARCH, FORMAT],
            },
        ),
    ]
    .into_iter()
    .chain(fleet::operations())
    .collect()
}

const TAG: &str = "changelogElementalCattleIo_v1beta1";

fn error_responses(spec: Spec) -> Vec<(&'static str, Value)> {
    let status = format!("{META}Status");
    let body = |description: &str| match spec {
        Spec::V2 => json!({"description": description, "schema": spec.reference(&status)}),
        Spec::V3 => json!({"description": description,
            "content": {"application/json": {"schema": spec.reference(&status)}}}),
    };
    vec![
        ("401", json!({"description": "Unauthorized"})),
        ("403", body("Forbidden")),
        ("404", body("Not Found")),
    ]
}

fn operation_object(spec: Spec, op: &Operation) -> Value {
    let schema = spec.reference(&format!("{PREFIX}{}", op.response));
    let ok = match spec {
        Spec::V2 => json!({"description": "OK", "schema": schema}),
        Spec::V3 => {
            let content: Map<String, Value> = op
                .produces
                .iter()
                .map(|t| {
                    let s = if t.starts_with("application/json") && !t.contains("as=Table") {
                        json!({"schema": schema.clone()})
                    } else {
                        json!({"schema": {"type": "string"}})
                    };
                    ((*t).to_owned(), s)
                })
                .collect();
            json!({"description": "OK", "content": content})
        }
    };
    let mut responses = Map::new();
    responses.insert("200".to_owned(), ok);
    responses.extend(
        error_responses(spec)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v)),
    );
    let mut o = json!({
        "tags": [TAG],
        "description": op.description,
        "operationId": op.id,
        "responses": responses,
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": {"group": GROUP, "version": VERSION, "kind": op.kind},
    });
    let params: Vec<Value> = op.query_params.iter().map(|p| parameter(spec, p)).collect();
    if !params.is_empty() {
        o["parameters"] = Value::Array(params);
    }
    if let Spec::V2 = spec {
        o["consumes"] = json!(["*/*"]);
        o["produces"] = json!(op.produces);
        o["schemes"] = json!(["https"]);
    }
    o
}

fn paths(spec: Spec) -> Map<String, Value> {
    let mut paths = Map::new();
    let resources = spec.reference(&format!("{META}APIResourceList"));
    let ok = match spec {
        Spec::V2 => json!({"description": "OK", "schema": resources}),
        Spec::V3 => {
            json!({"description": "OK", "content": {"application/json": {"schema": resources}}})
        }
    };
    let mut discovery = json!({
        "tags": [TAG],
        "description": "get available resources",
        "operationId": "getChangelogElementalCattleIoV1beta1APIResources",
        "responses": {"200": ok, "401": {"description": "Unauthorized"}}
    });
    if let Spec::V2 = spec {
        discovery["consumes"] = json!(["application/json"]);
        discovery["produces"] = json!(["application/json"]);
        discovery["schemes"] = json!(["https"]);
    }
    paths.insert(format!("/apis/{API_VERSION}/"), json!({"get": discovery}));
    for (path, op) in operations() {
        let mut item = json!({"get": operation_object(spec, &op)});
        let params: Vec<Value> = op.path_params.iter().map(|p| parameter(spec, p)).collect();
        if !params.is_empty() {
            item["parameters"] = Value::Array(params);
        }
        paths.insert(path, item);
    }
    paths
}

fn info() -> Value {
    json!({"title": "elemental-changelog", "version": API_VERSION})
}

fn v2_value() -> Value {
    json!({
        "swagger": "2.0",
        "info": info(),
        "paths": paths(Spec::V2),
        "definitions": schemas(Spec::V2),
        "securityDefinitions": {
            "BearerToken": {"type": "apiKey", "name": "authorization", "in": "header",
                            "description": "Bearer Token authentication"}
        },
        "security": [{"BearerToken": []}]
    })
}

fn v3_value() -> Value {
    json!({
        "openapi": "3.0.0",
        "info": info(),
        "paths": paths(Spec::V3),
        "components": {
            "schemas": schemas(Spec::V3),
            "securitySchemes": {
                "BearerToken": {"type": "apiKey", "name": "authorization", "in": "header",
                                "description": "Bearer Token authentication"}
            }
        },
        "security": [{"BearerToken": []}]
    })
}

static V2: LazyLock<Document> = LazyLock::new(|| Document::new(&v2_value(), "application/json"));

static V3_GROUP_VERSION: LazyLock<Document> =
    LazyLock::new(|| Document::new(&v3_value(), "application/json"));

/// kube-openapi's hash of a group-version document: upper-case hex SHA-512.
static V3_HASH: LazyLock<String> = LazyLock::new(|| {
    use sha2::{Digest, Sha512};
    hex_upper(&Sha512::digest(&V3_GROUP_VERSION.body))
});

static V3_ROOT: LazyLock<Document> = LazyLock::new(|| {
    Document::new(
        &json!({
            "paths": {
                V3_GROUP_VERSION_PATH: {
                    "serverRelativeURL": format!("/openapi/v3/{V3_GROUP_VERSION_PATH}?hash={}", *V3_HASH)
                }
            }
        }),
        "application/json",
    )
});

/// The Swagger 2.0 document for `GET /openapi/v2`.
pub fn v2() -> &'static Document {
    &V2
}

/// The v3 root (discovery) document for `GET /openapi/v3`.
pub fn v3_root() -> &'static Document {
    &V3_ROOT
}

/// The OpenAPI 3.0 document for `GET /openapi/v3/apis/changelog.elemental.cattle.io/v1beta1`.
/// Its `ETag` is the quoted [`v3_hash`].
pub fn v3_group_version() -> &'static Document {
    &V3_GROUP_VERSION
}

/// The `hash` query value naming the current [`v3_group_version`] document;
/// kube-openapi redirects (301) a request with another hash to this one.
pub fn v3_hash() -> &'static str {
    &V3_HASH
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::*;

    fn parse(doc: &Document) -> Value {
        serde_json::from_slice(&doc.body).unwrap()
    }

    /// Every `$ref` in `v`, recursively.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    out.push(r.clone());
                }
                o.values().for_each(|c| refs(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| refs(c, out)),
            _ => {}
        }
    }

    fn resolve<'a>(doc: &'a Value, r: &str) -> &'a Value {
        let pointer = r.strip_prefix('#').unwrap();
        // Schema names contain dots, not slashes, so a plain pointer works.
        doc.pointer(pointer)
            .unwrap_or_else(|| panic!("unresolved {r}"))
    }

    /// Checks `instance` against `schema` (types, properties, required,
    /// enums), following `$ref`/`allOf` inside `doc`.
    fn validate(doc: &Value, schema: &Value, instance: &Value, at: &str) {
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            return validate(doc, resolve(doc, r), instance, at);
        }
        if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
            for s in all {
                validate(doc, s, instance, at);
            }
            return;
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            assert!(
                values.contains(instance),
                "{at}: {instance} not in {values:?}"
            );
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("object") => {
                let o = instance
                    .as_object()
                    .unwrap_or_else(|| panic!("{at}: not an object"));
                for req in schema
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    assert!(
                        o.contains_key(req.as_str().unwrap()),
                        "{at}: missing required {req}"
                    );
                }
                for (k, v) in o {
                    let sub = format!("{at}.{k}");
                    if let Some(p) = schema.get("properties").and_then(|p| p.get(k)) {
                        validate(doc, p, v, &sub);
                    } else if let Some(ap) = schema.get("additionalProperties") {
                        validate(doc, ap, v, &sub);
                    } else {
                        panic!("{sub}: not described by the schema");
                    }
                }
            }
            Some("array") => {
                for (i, item) in instance.as_array().unwrap().iter().enumerate() {
                    validate(doc, &schema["items"], item, &format!("{at}[{i}]"));
                }
            }
            Some("string") => assert!(instance.is_string(), "{at}: not a string"),
            Some("integer") => assert!(
                instance.is_u64() || instance.is_i64(),
                "{at}: not an integer"
            ),
            Some("boolean") => assert!(instance.is_boolean(), "{at}: not a boolean"),
            other => panic!("{at}: schema without a type: {other:?}"),
        }
    }

    fn full_changelog() -> ManagedOSVersionChangelog {
        let change = |from: Option<&str>, to: Option<&str>| PackageChange {
            name: "kernel-default".into(),
            arch: "x86_64".into(),
            from: from.map(Into::into),
            to: to.map(Into::into),
        };
        ManagedOSVersionChangelog {
            metadata: ObjectMeta {
                name: "v2".into(),
                namespace: "fleet-default".into(),
                uid: Some("7b6f0c2e-0000-4000-8000-000000000001".into()),
                resource_version: Some("42".into()),
                creation_timestamp: Some("2024-01-01T00:00:00Z".into()),
                labels: [("a".to_owned(), "b".to_owned())].into(),
            },
            channel: ChannelRef {
                name: "ch".into(),
                image: Some("registry/ch:latest".into()),
                digest: Some("sha256:00".into()),
                retained: true,
            },
            version: "v2".into(),
            from: Some(VersionRef {
                name: "v1".into(),
                version: "v1".into(),
            }),
            arch: "x86_64".into(),
            source: Source::Computed,
            summary: ChangelogSummary {
                advisories: 1,
                by_type: [("security".to_owned(), 1)].into(),
                cves: 1,
                highest_severity: Severity::Important,
                packages_upgraded: Some(1),
                packages_downgraded: Some(1),
                packages_added: Some(1),
                packages_removed: Some(1),
            },
            advisories: vec![Advisory {
                id: "SUSE-1".into(),
                type_: "security".into(),
                severity: Severity::Important,
                title: "t".into(),
                issued: "2024-01-01T00:00:00Z".parse().ok(),
                cves: vec!["CVE-2024-1".into()],
                bugs: vec!["123".into()],
                references: vec![Reference {
                    id: "1".into(),
                    type_: "cve".into(),
                    href: "h".into(),
                    title: "t".into(),
                }],
                description: "d".into(),
                packages: vec![AdvisoryPackage {
                    name: "p".into(),
                    epoch: Some("1".into()),
                    version: "1".into(),
                    release: "1".into(),
                    arch: "x86_64".into(),
                }],
            }],
            packages: Some(PackageChanges {
                upgraded: vec![change(Some("1-1"), Some("2-1"))],
                downgraded: vec![change(Some("2-1"), Some("1-1"))],
                added: vec![change(None, Some("1-1"))],
                removed: vec![change(Some("1-1"), None)],
            }),
            warnings: vec!["w".into()],
            ..ManagedOSVersionChangelog::new()
        }
    }

    fn full_summary() -> ManagedOSVersionChangelogSummary {
        let c = full_changelog();
        ManagedOSVersionChangelogSummary {
            metadata: c.metadata,
            channel: c.channel,
            version: c.version,
            created: Some("2024-01-01T00:00:00Z".into()),
            available: false,
            reason: Some(UnavailableReason::NotFetched),
            message: Some("m".into()),
            from: c.from,
            summary: Some(c.summary),
            ..ManagedOSVersionChangelogSummary::new()
        }
    }

    /// A machine list and a plan with every field set.
    fn full_fleet() -> (
        crate::fleet::MachineInventoryChangelogSummaryList,
        crate::fleet::ManagedOSImageChangelog,
    ) {
        use crate::fleet::*;
        let version = ChannelVersion {
            name: "v1-os".into(),
            version: "v1".into(),
            channel: "c".into(),
        };
        let summary = full_summary().summary;
        let mut m = MachineInventoryChangelogSummary::new();
        m.metadata = full_summary().metadata;
        m.os = ReportedOs {
            image: Some("registry/os:v1".into()),
            version: Some("6.1".into()),
            pretty_name: Some("SL Micro 6.1".into()),
        };
        m.current = Some(version.clone());
        m.target = Some(MachineTarget {
            name: "v2-os".into(),
            version: "v2".into(),
            channel: "c".into(),
            source: TargetSource::ManagedOSImage,
            managed_os_image: Some("upgrade".into()),
            reason: Some(TargetReason::ManagedOSImagesDisagree),
            message: Some("m".into()),
        });
        m.state = MachineState::UpdatesAvailable;
        m.reason = Some(MachineReason::OtherChannel);
        m.message = Some("m".into());
        m.summary = summary.clone();
        m.cve = Some(MachineCve {
            id: "CVE-2024-1".into(),
            state: CveState::Exposed,
            fixed_in: Some(crate::types::VersionRef {
                name: "v2-os".into(),
                version: "v2".into(),
            }),
        });
        let machines = MachineInventoryChangelogSummaryList::new(vec![
            m,
            MachineInventoryChangelogSummary::new(),
        ]);
        let mut plan = ManagedOSImageChangelog::new();
        plan.metadata = full_summary().metadata;
        plan.target = Some(version.clone());
        plan.target_reason = Some(PlanTargetReason::Ambiguous);
        plan.target_message = Some("m".into());
        plan.groups.push(PlanGroup {
            current: version,
            state: MachineState::UpdatesAvailable,
            reason: Some(MachineReason::TargetOlder),
            machines: vec!["m-1".into()],
            summary,
        });
        plan.unknown_machines.push(PlanMachine {
            name: "m-2".into(),
            reason: "NoAnnotation".into(),
            message: "m".into(),
        });
        plan.unresolved_targets.push(UnresolvedClusterTarget {
            index: 1,
            name: Some("prod".into()),
            reason: SelectionReason::ClusterGroupUnknown,
            message: "m".into(),
        });
        (machines, plan)
    }

    fn check_instances(doc: &Value, schemas_at: &str) {
        let schema = |k: &str| json!({"$ref": format!("{schemas_at}{PREFIX}{k}")});
        validate(
            doc,
            &schema(CHANGELOG_KIND),
            &serde_json::to_value(full_changelog()).unwrap(),
            "changelog",
        );
        let list = ManagedOSVersionChangelogSummaryList::new(vec![
            full_summary(),
            ManagedOSVersionChangelogSummary::new(),
        ]);
        validate(
            doc,
            &schema(SUMMARY_LIST_KIND),
            &serde_json::to_value(list).unwrap(),
            "list",
        );
        let (machines, plan) = full_fleet();
        validate(
            doc,
            &schema(crate::MACHINE_SUMMARY_LIST_KIND),
            &serde_json::to_value(machines).unwrap(),
            "machines",
        );
        validate(
            doc,
            &schema(crate::IMAGE_CHANGELOG_KIND),
            &serde_json::to_value(plan).unwrap(),
            "plan",
        );
        let status: Value = serde_json::from_slice(
            &crate::status::StatusError::internal(&std::io::Error::other("x")).to_json(),
        )
        .unwrap();
        validate(
            doc,
            &json!({"$ref": format!("{schemas_at}{META}Status")}),
            &status,
            "status",
        );
        let resources: Value =
            serde_json::from_slice(&crate::discovery::api_resource_list().body).unwrap();
        validate(
            doc,
            &json!({"$ref": format!("{schemas_at}{META}APIResourceList")}),
            &resources,
            "resources",
        );
    }

    #[test]
    fn v2_refs_resolve_and_describe_every_field() {
        let doc = parse(v2());
        assert_eq!(doc["swagger"], "2.0");
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in &all {
            assert!(r.starts_with("#/definitions/"), "{r}");
            resolve(&doc, r);
        }
        check_instances(&doc, "#/definitions/");
    }

    #[test]
    fn v3_refs_resolve_and_describe_every_field() {
        let doc = parse(v3_group_version());
        assert_eq!(doc["openapi"], "3.0.0");
        let mut all = Vec::new();
        refs(&doc, &mut all);
        for r in &all {
            assert!(r.starts_with("#/components/schemas/"), "{r}");
            resolve(&doc, r);
        }
        check_instances(&doc, "#/components/schemas/");
    }

    #[test]
    #[should_panic(expected = "not described by the schema")]
    fn validator_rejects_unknown_fields() {
        let doc = parse(v2());
        let schema = json!({"$ref": format!("#/definitions/{META}ObjectMeta")});
        validate(
            &doc,
            &schema,
            &json!({"name": "a", "namespace": "b", "bogus": 1}),
            "meta",
        );
    }

    /// `metadata` is the standard `ObjectMeta`, complete: every field of
    /// k8s-openapi's `ObjectMeta` (kube-apiserver's), all set, is described.
    #[test]
    fn object_meta_is_the_standard_one() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
        let time = meta::Time("2024-01-01T00:00:00Z".parse().unwrap());
        let full = meta::ObjectMeta {
            annotations: Some([("a".to_owned(), "b".to_owned())].into()),
            creation_timestamp: Some(time.clone()),
            deletion_grace_period_seconds: Some(30),
            deletion_timestamp: Some(time.clone()),
            finalizers: Some(vec!["f".to_owned()]),
            generate_name: Some("g-".to_owned()),
            generation: Some(1),
            labels: Some([("l".to_owned(), "v".to_owned())].into()),
            managed_fields: Some(vec![meta::ManagedFieldsEntry {
                api_version: Some("v1".to_owned()),
                fields_type: Some("FieldsV1".to_owned()),
                fields_v1: Some(meta::FieldsV1(json!({}))),
                manager: Some("m".to_owned()),
                operation: Some("Apply".to_owned()),
                subresource: Some("status".to_owned()),
                time: Some(time),
            }]),
            name: Some("n".to_owned()),
            namespace: Some("ns".to_owned()),
            owner_references: Some(vec![meta::OwnerReference {
                api_version: "elemental.cattle.io/v1beta1".to_owned(),
                block_owner_deletion: Some(true),
                controller: Some(true),
                kind: "ManagedOSVersionChannel".to_owned(),
                name: "c".to_owned(),
                uid: "u".to_owned(),
            }]),
            resource_version: Some("1".to_owned()),
            self_link: Some("/x".to_owned()),
            uid: Some("u".to_owned()),
        };
        let instance = serde_json::to_value(&full).unwrap();
        for (doc, at) in [
            (parse(v2()), "#/definitions/"),
            (parse(v3_group_version()), "#/components/schemas/"),
        ] {
            let object_meta = format!("{at}{META}ObjectMeta");
            validate(&doc, &json!({"$ref": object_meta}), &instance, "metadata");
            // Both kinds point at it.
            for kind in [CHANGELOG_KIND, SUMMARY_KIND] {
                let mut found = Vec::new();
                refs(
                    &resolve(&doc, &format!("{at}{PREFIX}{kind}"))["properties"]["metadata"],
                    &mut found,
                );
                assert_eq!(found, std::slice::from_ref(&object_meta), "{kind}");
            }
            // Every property is described, as kubectl explain prints it.
            let properties = resolve(&doc, &object_meta)["properties"]
                .as_object()
                .unwrap();
            let described: std::collections::BTreeSet<&String> = properties.keys().collect();
            let fields: std::collections::BTreeSet<&String> =
                instance.as_object().unwrap().keys().collect();
            assert_eq!(described, fields);
            for (name, p) in properties {
                let description = p["description"].as_str().unwrap_or_default();
                assert!(!description.is_empty(), "{name} has no description");
            }
        }
    }

    #[test]
    fn kinds_carry_group_version_kind() {
        let doc = parse(v3_group_version());
        for kind in [
            CHANGELOG_KIND,
            SUMMARY_KIND,
            SUMMARY_LIST_KIND,
            crate::MACHINE_SUMMARY_KIND,
            crate::MACHINE_SUMMARY_LIST_KIND,
            crate::IMAGE_CHANGELOG_KIND,
        ] {
            let s = &doc["components"]["schemas"][format!("{PREFIX}{kind}")];
            assert_eq!(
                s["x-kubernetes-group-version-kind"],
                json!([{"group": GROUP, "version": VERSION, "kind": kind}])
            );
        }
        let d = parse(v2());
        assert_eq!(
            d["definitions"]["io.cattle.elemental.changelog.v1beta1.ManagedOSVersionChangelog"]["x-kubernetes-group-version-kind"]
                [0]["kind"],
            "ManagedOSVersionChangelog"
        );
    }

    /// The names of the parameters `v` lists.
    fn names(v: &Value) -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn paths_and_parameters() {
        for (doc, schema_key) in [
            (parse(v2()), None),
            (parse(v3_group_version()), Some("schema")),
        ] {
            let paths = doc["paths"].as_object().unwrap();
            version_paths(paths, schema_key);
            fleet_paths(paths);
            // Operation ids are unique.
            let mut ids: Vec<&str> = paths
                .values()
                .filter_map(|p| p["get"]["operationId"].as_str())
                .collect();
            let n = ids.len();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), n);
        }
    }

    /// Of [`paths_and_parameters`]: a list's watch options have kube-apiserver's types.
    fn watch_types(parameters: &Value, schema_key: Option<&str>) {
        let ty = |name: &str| {
            let p = parameters
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap();
            let schema = match schema_key {
                Some(k) => &p[k],
                None => p,
            };
            (schema["type"].clone(), schema.get("enum").cloned())
        };
        for (name, expected) in [
            ("watch", "boolean"),
            ("resourceVersion", "string"),
            ("sendInitialEvents", "boolean"),
            ("allowWatchBookmarks", "boolean"),
            ("timeoutSeconds", "integer"),
        ] {
            assert_eq!(ty(name), (json!(expected), None), "{name}");
        }
        assert_eq!(
            ty("resourceVersionMatch"),
            (json!("string"), Some(json!(["NotOlderThan"])))
        );
    }

    /// Of [`paths_and_parameters`]: the paths of versions and their changelogs; a
    /// parameter's type is under `schema_key` (v3) or in the parameter itself (v2).
    fn version_paths(paths: &serde_json::Map<String, Value>, schema_key: Option<&str>) {
        let changelog = &paths["/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{namespace}/managedosversions/{name}/changelog"];
        assert_eq!(
            names(&changelog["get"]["parameters"]),
            ["from", "arch", "format"]
        );
        assert_eq!(names(&changelog["parameters"]), ["name", "namespace"]);
        assert_eq!(changelog["get"]["x-kubernetes-action"], "get");
        let format = &changelog["get"]["parameters"][2];
        let ty = match schema_key {
            Some(k) => &format[k],
            None => format,
        };
        assert_eq!(ty["enum"], json!(["json", "text", "markdown", "md"]));
        // What the server's `ListParams` and `WatchParams` read for a list.
        for p in [
            "/apis/changelog.elemental.cattle.io/v1beta1/managedosversions",
            "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{namespace}/managedosversions",
        ] {
            let parameters = &paths[p]["get"]["parameters"];
            assert_eq!(
                names(parameters),
                [
                    "labelSelector",
                    "fieldSelector",
                    "cve",
                    "arch",
                    "includeObject",
                    "watch",
                    "resourceVersion",
                    "resourceVersionMatch",
                    "sendInitialEvents",
                    "allowWatchBookmarks",
                    "timeoutSeconds"
                ]
            );
            watch_types(parameters, schema_key);
            assert_eq!(paths[p]["get"]["x-kubernetes-action"], "list");
            assert!(
                !paths[p]["get"]["description"]
                    .as_str()
                    .unwrap()
                    .contains("not served")
            );
        }
        let get = &paths["/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{namespace}/managedosversions/{name}"];
        assert_eq!(names(&get["get"]["parameters"]), ["arch", "includeObject"]);
        let include_object = &get["get"]["parameters"][1];
        let ty = match schema_key {
            Some(k) => &include_object[k],
            None => include_object,
        };
        assert_eq!(ty["enum"], json!(["None", "Metadata", "Object"]));
        assert!(paths.contains_key("/apis/changelog.elemental.cattle.io/v1beta1/"));
    }

    /// Of [`paths_and_parameters`]: the fleet view's paths.
    fn fleet_paths(paths: &serde_json::Map<String, Value>) {
        // The fleet view.
        let base = "/apis/changelog.elemental.cattle.io/v1beta1";
        for p in [
            format!("{base}/machineinventories"),
            format!("{base}/namespaces/{{namespace}}/machineinventories"),
        ] {
            assert_eq!(
                names(&paths[&p]["get"]["parameters"]),
                [
                    "labelSelector",
                    "fieldSelector",
                    "cve",
                    "arch",
                    "includeObject",
                    "watch",
                    "resourceVersion",
                    "resourceVersionMatch",
                    "sendInitialEvents",
                    "allowWatchBookmarks",
                    "timeoutSeconds"
                ]
            );
            assert_eq!(paths[&p]["get"]["x-kubernetes-action"], "list");
            assert_eq!(
                paths[&p]["get"]["x-kubernetes-group-version-kind"]["kind"],
                "MachineInventoryChangelogSummary"
            );
        }
        let machine =
            &paths[&format!("{base}/namespaces/{{namespace}}/machineinventories/{{name}}")];
        assert_eq!(
            names(&machine["get"]["parameters"]),
            ["cve", "arch", "includeObject"]
        );
        assert_eq!(names(&machine["parameters"]), ["name", "namespace"]);
        let machine_changelog = &paths
            [&format!("{base}/namespaces/{{namespace}}/machineinventories/{{name}}/changelog")];
        assert_eq!(
            names(&machine_changelog["get"]["parameters"]),
            ["to", "arch", "format"]
        );
        assert_eq!(
            machine_changelog["get"]["x-kubernetes-group-version-kind"]["kind"],
            "ManagedOSVersionChangelog"
        );
        let plan =
            &paths[&format!("{base}/namespaces/{{namespace}}/managedosimages/{{name}}/changelog")];
        assert_eq!(names(&plan["get"]["parameters"]), ["arch"]);
        assert_eq!(names(&plan["parameters"]), ["name", "namespace"]);
        assert_eq!(
            plan["get"]["x-kubernetes-group-version-kind"]["kind"],
            "ManagedOSImageChangelog"
        );
    }

    #[test]
    fn v3_root_names_the_group_version_by_hash() {
        let root = parse(v3_root());
        let url = root["paths"][V3_GROUP_VERSION_PATH]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert_eq!(
            url,
            format!(
                "/openapi/v3/apis/changelog.elemental.cattle.io/v1beta1?hash={}",
                v3_hash()
            )
        );
        assert_eq!(root.as_object().unwrap().len(), 1);
        assert_eq!(v3_hash().len(), 128);
        assert!(
            v3_hash()
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
        );
        assert_eq!(v3_group_version().etag, format!("\"{}\"", v3_hash()));
        // Stable: rebuilding gives the same bytes.
        assert_eq!(
            serde_json::to_vec(&v3_value()).unwrap(),
            v3_group_version().body
        );
        assert_eq!(serde_json::to_vec(&v2_value()).unwrap(), v2().body);
    }
}
