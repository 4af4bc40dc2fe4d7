//! Discovery documents: `APIResourceList` for `GET /apis/<group>/<version>`,
//! `APIGroupList` and `APIGroup` for `GET /apis` and `GET /apis/<group>`, and
//! aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`),
//! each serialized once since they never change.
//!
//! Shapes follow k8s.io/apimachinery `meta/v1` and k8s.io/api
//! `apidiscovery/v2` JSON tags; the ETag is kube-apiserver's: the quoted
//! upper-case hex SHA-512 of the body.

use std::sync::LazyLock;

use serde::Serialize;
use sha2::{Digest, Sha512};

use crate::content::parse_accept;
use crate::{
    API_VERSION, CHANGELOG_KIND, GROUP, IMAGE_CHANGELOG_KIND, IMAGE_RESOURCE, MACHINE_RESOURCE,
    MACHINE_SINGULAR, MACHINE_SUMMARY_KIND, RESOURCE, SUBRESOURCE, SUMMARY_KIND, VERSION,
};

/// `Content-Type` of the aggregated discovery document. kube-aggregator only
/// parses a body whose `Content-Type` carries these `g`, `v` and `as`.
pub const AGGREGATED_V2_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Singular name of [`RESOURCE`].
pub const SINGULAR: &str = "managedosversion";

/// A serialized discovery document and what to send with it.
#[derive(Debug)]
pub struct Document {
    /// Response body.
    pub body: Vec<u8>,
    /// `ETag` header value (quoted).
    pub etag: String,
    /// `Content-Type` header value.
    pub content_type: &'static str,
}

impl Document {
    pub(crate) fn new(value: &impl Serialize, content_type: &'static str) -> Self {
        // These documents are built from constants; serializing them into a
        // Vec cannot fail.
        let body = serde_json::to_vec(value).unwrap_or_default();
        let etag = etag_of(&body);
        Self {
            body,
            etag,
            content_type,
        }
    }
}

/// kube-apiserver's ETag of a body: `"` + upper-case hex SHA-512 + `"`.
pub fn etag_of(body: &[u8]) -> String {
    format!("\"{}\"", hex_upper(&Sha512::digest(body)))
}

/// Upper-case hex of `bytes` (Go's `%X`).
pub(crate) fn hex_upper(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02X}");
            s
        })
}

// ---- legacy discovery (meta/v1) ----

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiResourceList {
    kind: &'static str,
    api_version: &'static str,
    group_version: &'static str,
    resources: Vec<ApiResource>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiResource {
    name: &'static str,
    singular_name: &'static str,
    namespaced: bool,
    kind: &'static str,
    verbs: &'static [&'static str],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiGroupList {
    kind: &'static str,
    api_version: &'static str,
    groups: Vec<ApiGroup>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiGroup {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_version: Option<&'static str>,
    name: &'static str,
    versions: Vec<GroupVersionForDiscovery>,
    preferred_version: GroupVersionForDiscovery,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupVersionForDiscovery {
    group_version: &'static str,
    version: &'static str,
}

/// Verbs of the listed resources: their lists are watched (Rancher's Steve keeps a type only
/// with both `list` and `watch`).
const RESOURCE_VERBS: &[&str] = &["get", "list", "watch"];
const SUBRESOURCE_VERBS: &[&str] = &["get"];
const CHANGELOG_PATH: &str = "managedosversions/changelog";
const MACHINE_CHANGELOG_PATH: &str = "machineinventories/changelog";
const IMAGE_CHANGELOG_PATH: &str = "managedosimages/changelog";
/// Singular of [`IMAGE_RESOURCE`] (only its `changelog` subresource is served).
const IMAGE_SINGULAR: &str = "managedosimage";
/// Verbs of `managedosimages` itself: none, only its subresource is served.
const NO_VERBS: &[&str] = &[];

fn api_group(typed: bool) -> ApiGroup {
    let gv = || GroupVersionForDiscovery {
        group_version: API_VERSION,
        version: VERSION,
    };
    ApiGroup {
        kind: typed.then_some("APIGroup"),
        api_version: typed.then_some("v1"),
        name: GROUP,
        versions: vec![gv()],
        preferred_version: gv(),
    }
}

static API_RESOURCE_LIST: LazyLock<Document> = LazyLock::new(|| {
    Document::new(
        &ApiResourceList {
            kind: "APIResourceList",
            api_version: "v1",
            group_version: API_VERSION,
            resources: vec![
                ApiResource {
                    name: RESOURCE,
                    singular_name: SINGULAR,
                    namespaced: true,
                    kind: SUMMARY_KIND,
                    verbs: RESOURCE_VERBS,
                },
                ApiResource {
                    name: CHANGELOG_PATH,
                    // kube-apiserver leaves singularName empty on subresources.
                    singular_name: "",
                    namespaced: true,
                    kind: CHANGELOG_KIND,
                    verbs: SUBRESOURCE_VERBS,
                },
                ApiResource {
                    name: MACHINE_RESOURCE,
                    singular_name: MACHINE_SINGULAR,
                    namespaced: true,
                    kind: MACHINE_SUMMARY_KIND,
                    verbs: RESOURCE_VERBS,
                },
                ApiResource {
                    name: MACHINE_CHANGELOG_PATH,
                    singular_name: "",
                    namespaced: true,
                    kind: CHANGELOG_KIND,
                    verbs: SUBRESOURCE_VERBS,
                },
                ApiResource {
                    name: IMAGE_CHANGELOG_PATH,
                    singular_name: "",
                    namespaced: true,
                    kind: IMAGE_CHANGELOG_KIND,
                    verbs: SUBRESOURCE_VERBS,
                },
            ],
        },
        "application/json",
    )
});

static API_GROUP_LIST: LazyLock<Document> = LazyLock::new(|| {
    Document::new(
        &ApiGroupList {
            kind: "APIGroupList",
            api_version: "v1",
            groups: vec![api_group(false)],
        },
        "application/json",
    )
});

static API_GROUP: LazyLock<Document> =
    LazyLock::new(|| Document::new(&api_group(true), "application/json"));

// ---- aggregated discovery (apidiscovery.k8s.io/v2) ----

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupDiscoveryList {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    items: Vec<GroupDiscovery>,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Named {
    name: &'static str,
}

#[derive(Serialize)]
struct GroupDiscovery {
    metadata: Named,
    versions: Vec<VersionDiscovery>,
}

#[derive(Serialize)]
struct VersionDiscovery {
    version: &'static str,
    resources: Vec<ResourceDiscovery>,
    freshness: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceDiscovery {
    resource: &'static str,
    response_kind: Gvk,
    scope: &'static str,
    singular_resource: &'static str,
    verbs: &'static [&'static str],
    subresources: Vec<SubresourceDiscovery>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SubresourceDiscovery {
    subresource: &'static str,
    response_kind: Gvk,
    verbs: &'static [&'static str],
}

#[derive(Serialize)]
struct Gvk {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
}

/// A namespaced resource with a `changelog` subresource.
fn resource_discovery(
    resource: &'static str,
    singular: &'static str,
    kind: &'static str,
    verbs: &'static [&'static str],
    changelog_kind: &'static str,
) -> ResourceDiscovery {
    let gvk = |kind| Gvk {
        group: GROUP,
        version: VERSION,
        kind,
    };
    ResourceDiscovery {
        resource,
        response_kind: gvk(kind),
        scope: "Namespaced",
        singular_resource: singular,
        verbs,
        subresources: vec![SubresourceDiscovery {
            subresource: SUBRESOURCE,
            response_kind: gvk(changelog_kind),
            verbs: SUBRESOURCE_VERBS,
        }],
    }
}

static AGGREGATED_V2: LazyLock<Document> = LazyLock::new(|| {
    Document::new(
        &GroupDiscoveryList {
            kind: "APIGroupDiscoveryList",
            api_version: "apidiscovery.k8s.io/v2",
            metadata: Empty {},
            items: vec![GroupDiscovery {
                metadata: Named { name: GROUP },
                versions: vec![VersionDiscovery {
                    version: VERSION,
                    resources: vec![
                        resource_discovery(
                            RESOURCE,
                            SINGULAR,
                            SUMMARY_KIND,
                            RESOURCE_VERBS,
                            CHANGELOG_KIND,
                        ),
                        resource_discovery(
                            MACHINE_RESOURCE,
                            MACHINE_SINGULAR,
                            MACHINE_SUMMARY_KIND,
                            RESOURCE_VERBS,
                            CHANGELOG_KIND,
                        ),
                        // Only the subresource is served; the resource carries
                        // no verbs, and a responseKind because clients drop
                        // resources without one.
                        resource_discovery(
                            IMAGE_RESOURCE,
                            IMAGE_SINGULAR,
                            IMAGE_CHANGELOG_KIND,
                            NO_VERBS,
                            IMAGE_CHANGELOG_KIND,
                        ),
                    ],
                    freshness: "Current",
                }],
            }],
        },
        AGGREGATED_V2_CONTENT_TYPE,
    )
});

/// `APIResourceList` for `GET /apis/changelog.elemental.cattle.io/v1beta1`.
pub fn api_resource_list() -> &'static Document {
    &API_RESOURCE_LIST
}

/// `APIGroupList` for `GET /apis` when aggregated discovery is not asked for.
pub fn api_group_list() -> &'static Document {
    &API_GROUP_LIST
}

/// `APIGroup` for `GET /apis/changelog.elemental.cattle.io`.
pub fn api_group_document() -> &'static Document {
    &API_GROUP
}

/// `APIGroupDiscoveryList` (`apidiscovery.k8s.io/v2`) for `GET /apis`.
pub fn aggregated_v2() -> &'static Document {
    &AGGREGATED_V2
}

/// What to answer `GET /apis` with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApisRepresentation {
    /// The aggregated discovery document ([`aggregated_v2`]).
    AggregatedV2,
    /// The legacy `APIGroupList` ([`api_group_list`]).
    GroupList,
}

impl ApisRepresentation {
    /// The document to send.
    pub fn document(self) -> &'static Document {
        match self {
            Self::AggregatedV2 => aggregated_v2(),
            Self::GroupList => api_group_list(),
        }
    }
}

/// Chooses the `/apis` answer from the `Accept` header, walking the client's
/// preferences in order: the first range asking for
/// `application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`
/// wins aggregated discovery; the first plain JSON range (`application/json`,
/// `application/*`, `*/*`) wins the `APIGroupList`. `v2beta1` (no longer
/// served by kube-apiserver 1.37, nor asked for by its aggregator), protobuf
/// and anything else are skipped. Discovery must never fail, so when nothing
/// matches the answer is the `APIGroupList`.
pub fn negotiate_apis(accept: Option<&str>) -> ApisRepresentation {
    let Some(header) = accept else {
        return ApisRepresentation::GroupList;
    };
    for range in parse_accept(header) {
        if !range.covers_json() {
            continue;
        }
        match (range.param("g"), range.param("v"), range.param("as")) {
            (Some("apidiscovery.k8s.io"), Some("v2"), Some("APIGroupDiscoveryList")) => {
                return ApisRepresentation::AggregatedV2;
            }
            (None, None, None) => return ApisRepresentation::GroupList,
            _ => {}
        }
    }
    ApisRepresentation::GroupList
}

/// True when an `If-None-Match` header names `etag` (a quoted ETag as built
/// by [`etag_of`]): an exact match, one of a comma-separated list, a weak
/// `W/` form, or `*`.
pub fn if_none_match_matches(header: Option<&str>, etag: &str) -> bool {
    let Some(header) = header else {
        return false;
    };
    header.split(',').map(str::trim).any(|candidate| {
        candidate == "*" || candidate.strip_prefix("W/").unwrap_or(candidate) == etag
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn parse(doc: &Document) -> Value {
        serde_json::from_slice(&doc.body).unwrap()
    }

    const AGGREGATOR_ACCEPT: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const CLIENT_GO_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

    #[test]
    fn api_resource_list_shape() {
        let v = parse(api_resource_list());
        assert_eq!(
            v,
            json!({
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "changelog.elemental.cattle.io/v1beta1",
                "resources": [
                    {"name": "managedosversions", "singularName": "managedosversion", "namespaced": true,
                     "kind": "ManagedOSVersionChangelogSummary", "verbs": ["get", "list", "watch"]},
                    {"name": "managedosversions/changelog", "singularName": "", "namespaced": true,
                     "kind": "ManagedOSVersionChangelog", "verbs": ["get"]},
                    {"name": "machineinventories", "singularName": "machineinventory", "namespaced": true,
                     "kind": "MachineInventoryChangelogSummary", "verbs": ["get", "list", "watch"]},
                    {"name": "machineinventories/changelog", "singularName": "", "namespaced": true,
                     "kind": "ManagedOSVersionChangelog", "verbs": ["get"]},
                    {"name": "managedosimages/changelog", "singularName": "", "namespaced": true,
                     "kind": "ManagedOSImageChangelog", "verbs": ["get"]}
                ]
            })
        );
        assert_eq!(api_resource_list().content_type, "application/json");
        // k8s-openapi (what kube-rs clients use) parses it.
        let parsed: k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList =
            serde_json::from_slice(&api_resource_list().body).unwrap();
        assert_eq!(parsed.resources.len(), 5);
    }

    #[test]
    fn api_group_and_list_shape() {
        let gv =
            json!({"groupVersion": "changelog.elemental.cattle.io/v1beta1", "version": "v1beta1"});
        assert_eq!(
            parse(api_group_document()),
            json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv], "preferredVersion": gv})
        );
        assert_eq!(
            parse(api_group_list()),
            json!({"kind": "APIGroupList", "apiVersion": "v1",
                   "groups": [{"name": GROUP, "versions": [gv], "preferredVersion": gv}]})
        );
        let _: k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroupList =
            serde_json::from_slice(&api_group_list().body).unwrap();
        let _: k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup =
            serde_json::from_slice(&api_group_document().body).unwrap();
    }

    #[test]
    fn aggregated_v2_shape() {
        let doc = aggregated_v2();
        assert_eq!(
            doc.content_type,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        );
        let v = parse(doc);
        let gvk = |kind: &str| json!({"group": GROUP, "version": "v1beta1", "kind": kind});
        assert_eq!(
            v,
            json!({
                "kind": "APIGroupDiscoveryList",
                "apiVersion": "apidiscovery.k8s.io/v2",
                "metadata": {},
                "items": [{
                    "metadata": {"name": "changelog.elemental.cattle.io"},
                    "versions": [{
                        "version": "v1beta1",
                        "resources": [{
                            "resource": "managedosversions",
                            "responseKind": gvk("ManagedOSVersionChangelogSummary"),
                            "scope": "Namespaced",
                            "singularResource": "managedosversion",
                            "verbs": ["get", "list", "watch"],
                            "subresources": [{
                                "subresource": "changelog",
                                "responseKind": gvk("ManagedOSVersionChangelog"),
                                "verbs": ["get"]
                            }]
                        }, {
                            "resource": "machineinventories",
                            "responseKind": gvk("MachineInventoryChangelogSummary"),
                            "scope": "Namespaced",
                            "singularResource": "machineinventory",
                            "verbs": ["get", "list", "watch"],
                            "subresources": [{
                                "subresource": "changelog",
                                "responseKind": gvk("ManagedOSVersionChangelog"),
                                "verbs": ["get"]
                            }]
                        }, {
                            "resource": "managedosimages",
                            "responseKind": gvk("ManagedOSImageChangelog"),
                            "scope": "Namespaced",
                            "singularResource": "managedosimage",
                            "verbs": [],
                            "subresources": [{
                                "subresource": "changelog",
                                "responseKind": gvk("ManagedOSImageChangelog"),
                                "verbs": ["get"]
                            }]
                        }],
                        "freshness": "Current"
                    }]
                }]
            })
        );
        // kube-core's mirror of the Go types reads it.
        let parsed: kube_core::discovery::v2::APIGroupDiscoveryList =
            serde_json::from_slice(&doc.body).unwrap();
        let res = &parsed.items[0].versions[0].resources[0];
        assert_eq!(res.resource.as_deref(), Some(RESOURCE));
        assert!(res.short_names.is_empty() && res.categories.is_empty());
        assert!(res.subresources[0].response_kind.is_some());
        let all = &parsed.items[0].versions[0].resources;
        assert_eq!(all.len(), 3);
        assert!(all.iter().all(|r| r.response_kind.is_some()
            && r.subresources.iter().all(|s| s.response_kind.is_some())));
    }

    #[test]
    fn etag_is_quoted_upper_hex_sha512_and_stable() {
        let doc = aggregated_v2();
        assert_eq!(doc.etag, etag_of(&doc.body));
        assert_eq!(doc.etag.len(), 128 + 2);
        assert!(doc.etag.starts_with('"') && doc.etag.ends_with('"'));
        assert!(
            doc.etag[1..129]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
        );
        // Same input, same tag; known vector for the empty body.
        assert_eq!(etag_of(b""), etag_of(b""));
        assert!(etag_of(b"").starts_with("\"CF83E1357EEFB8BD"));
        assert_ne!(aggregated_v2().etag, api_group_list().etag);
    }

    #[test]
    fn negotiate_apis_cases() {
        use ApisRepresentation::*;
        assert_eq!(negotiate_apis(Some(AGGREGATOR_ACCEPT)), AggregatedV2);
        assert_eq!(negotiate_apis(Some(CLIENT_GO_ACCEPT)), AggregatedV2);
        assert_eq!(negotiate_apis(None), GroupList);
        assert_eq!(negotiate_apis(Some("application/json")), GroupList);
        assert_eq!(negotiate_apis(Some("*/*")), GroupList);
        // v2beta1 only: not served, fall back to the legacy document.
        assert_eq!(
            negotiate_apis(Some(
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            )),
            GroupList
        );
        // Client order wins: plain JSON first.
        assert_eq!(
            negotiate_apis(Some(&format!("application/json,{AGGREGATOR_ACCEPT}"))),
            GroupList
        );
        // Parameter order does not matter; protobuf is skipped.
        assert_eq!(
            negotiate_apis(Some(
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io"
            )),
            AggregatedV2
        );
        // q-values.
        assert_eq!(
            negotiate_apis(Some(&format!("application/json;q=0.9,{AGGREGATOR_ACCEPT}"))),
            AggregatedV2
        );
        assert_eq!(negotiate_apis(Some("text/html")), GroupList);
        assert_eq!(
            AggregatedV2.document().content_type,
            AGGREGATED_V2_CONTENT_TYPE
        );
    }

    #[test]
    fn if_none_match() {
        let etag = &aggregated_v2().etag;
        assert!(if_none_match_matches(Some(etag), etag));
        assert!(if_none_match_matches(
            Some(&format!("\"x\", W/{etag}")),
            etag
        ));
        assert!(if_none_match_matches(Some("*"), etag));
        assert!(!if_none_match_matches(Some("\"x\""), etag));
        assert!(!if_none_match_matches(Some(etag.trim_matches('"')), etag));
        assert!(!if_none_match_matches(None, etag));
        assert!(!if_none_match_matches(Some(""), etag));
    }
}
