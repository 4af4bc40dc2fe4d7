//! The elemental-operator's objects, as far as this server reads them.
//!
//! Only the fields used here are typed; everything else is ignored, so newer
//! operator releases that add fields keep working.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, Resource, ResourceExt};
use serde::{Deserialize, Serialize};

/// Label the operator puts on every ManagedOSVersion: the name of its channel.
pub const CHANNEL_LABEL: &str = "elemental.cattle.io/channel";

/// Drops what is never read of a channel or version before it is stored: managedFields (the
/// largest part of an operator-written object: a few KiB of each of thousands of
/// ManagedOSVersions), annotations and finalizers.
pub fn trim_meta<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.finalizers = None;
}

/// `ManagedOSVersionChannel.spec`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "elemental.cattle.io",
    version = "v1beta1",
    kind = "ManagedOSVersionChannel",
    namespaced,
    status = "ChannelStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ChannelSpec {
    /// `custom` (an image in `options.image`) or `json` (a URI, no image).
    #[serde(default, rename = "type")]
    pub type_: String,
    /// Type-specific options.
    #[serde(default)]
    pub options: Option<serde_json::Value>,
    /// Registry prepended by the operator to the images of the entries.
    #[serde(default)]
    pub registry: Option<String>,
    /// How often the operator re-syncs the channel.
    #[serde(default)]
    pub sync_interval: Option<String>,
}

/// `ManagedOSVersionChannel.status`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChannelStatus {
    /// When the operator last synced the channel.
    #[serde(default)]
    pub last_synced_time: Option<Time>,
    /// The generation the operator last synced.
    #[serde(default)]
    pub synced_generation: Option<i64>,
}

/// `ManagedOSVersion.spec`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "elemental.cattle.io",
    version = "v1beta1",
    kind = "ManagedOSVersion",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct VersionSpec {
    /// OS version.
    #[serde(default)]
    pub version: String,
    /// `container` or `iso`.
    #[serde(default, rename = "type")]
    pub type_: String,
    /// Free-form metadata copied from the channel entry.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, serde_json::Value>>,
}

impl ManagedOSVersionChannel {
    /// The image named by a `custom` channel, if any.
    pub fn image(&self) -> Option<&str> {
        if !self.spec.type_.eq_ignore_ascii_case("custom") {
            return None;
        }
        self.spec
            .options
            .as_ref()?
            .get("image")?
            .as_str()
            .map(str::trim)
            .filter(|image| !image.is_empty())
    }

    /// What makes a fresh fetch due: the operator changed or re-synced the
    /// channel. Equal keys mean nothing happened since the last fetch.
    pub fn sync_key(&self) -> SyncKey {
        SyncKey {
            image: self.image().map(str::to_owned),
            generation: self.metadata.generation,
            synced_generation: self.status.as_ref().and_then(|s| s.synced_generation),
            last_synced_time: self
                .status
                .as_ref()
                .and_then(|s| s.last_synced_time.as_ref())
                .map(|t| t.0.to_string()),
        }
    }
}

/// See [`ManagedOSVersionChannel::sync_key`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncKey {
    /// Image named by the channel.
    pub image: Option<String>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.syncedGeneration`.
    pub synced_generation: Option<i64>,
    /// `status.lastSyncedTime`.
    pub last_synced_time: Option<String>,
}

impl ManagedOSVersion {
    /// The name of the channel this version belongs to: its controller owner
    /// reference when that is a channel, else the channel label.
    pub fn channel_name(&self) -> Option<&str> {
        let owner = self.owner_references().iter().find(|o| {
            o.controller == Some(true)
                && o.kind == ManagedOSVersionChannel::kind(&())
                && o.api_version.starts_with("elemental.cattle.io/")
        });
        owner
            .map(|o| o.name.as_str())
            .or_else(|| self.labels().get(CHANNEL_LABEL).map(String::as_str))
            .filter(|name| !name.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel(json: serde_json::Value) -> ManagedOSVersionChannel {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("bad test channel: {e}"))
    }

    #[test]
    fn image_only_for_custom_channels() {
        let custom = channel(serde_json::json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
            "metadata": {"name": "c", "namespace": "fleet-default", "generation": 2},
            "spec": {"type": "custom", "options": {"image": " registry/channel:v1 "}},
            "status": {"syncedGeneration": 2, "lastSyncedTime": "2026-01-01T00:00:00Z"}
        }));
        assert_eq!(custom.image(), Some("registry/channel:v1"));
        let key = custom.sync_key();
        assert_eq!(key.generation, Some(2));
        assert_eq!(key.synced_generation, Some(2));
        assert!(key.last_synced_time.is_some());

        let json = channel(serde_json::json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
            "metadata": {"name": "j", "namespace": "fleet-default"},
            "spec": {"type": "json", "options": {"URI": "https://example.com/channel.json"}}
        }));
        assert_eq!(json.image(), None);
    }

    #[test]
    fn channel_from_owner_then_label() {
        let v: ManagedOSVersion = serde_json::from_value(serde_json::json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersion",
            "metadata": {"name": "v1", "namespace": "ns",
                "labels": {"elemental.cattle.io/channel": "from-label"},
                "ownerReferences": [{"apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
                    "name": "from-owner", "uid": "u", "controller": true}]},
            "spec": {"version": "v1.0", "type": "container"}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.channel_name(), Some("from-owner"));
        let v: ManagedOSVersion = serde_json::from_value(serde_json::json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersion",
            "metadata": {"name": "v1", "namespace": "ns", "labels": {"elemental.cattle.io/channel": "from-label"}},
            "spec": {"version": "v1.0"}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.channel_name(), Some("from-label"));
    }

    #[test]
    fn trimmed_versions_keep_what_is_read() {
        let mut v: ManagedOSVersion = serde_json::from_value(serde_json::json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersion",
            "metadata": {"name": "v1", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"team": "os"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "finalizers": ["f"],
                "managedFields": [{"manager": "elemental-operator", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
                "ownerReferences": [{"apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
                    "name": "c", "uid": "u", "controller": true}]},
            "spec": {"version": "v1.0", "type": "container"}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let before = v.clone();
        trim_meta(&mut v);
        assert_eq!(v.metadata.managed_fields, None);
        assert_eq!(v.metadata.annotations, None);
        assert_eq!(v.metadata.finalizers, None);
        assert_eq!(v.channel_name(), Some("c"));
        assert_eq!(v.labels(), before.labels());
        assert_eq!(v.spec, before.spec);
        assert_eq!(
            (v.uid(), v.resource_version()),
            (before.uid(), before.resource_version())
        );
    }
}
