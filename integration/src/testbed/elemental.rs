//! Elemental objects made the way elemental-operator makes them: a
//! `ManagedOSVersionChannel`, then one `ManagedOSVersion` per channel entry
//! (channel label, last-sync annotation, controller owner reference), and the
//! channel's status patched through the status subresource.

use anyhow::{Context as _, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};

/// API group of the Elemental operator's resources.
pub const ELEMENTAL_GROUP: &str = "elemental.cattle.io";
/// Their version.
pub const ELEMENTAL_VERSION: &str = "v1beta1";
/// Label on a ManagedOSVersion naming its channel.
pub const CHANNEL_LABEL: &str = "elemental.cattle.io/channel";
/// Annotation on a ManagedOSVersion with the time of the sync that wrote it.
pub const LAST_SYNC_ANNOTATION: &str = "elemental.cattle.io/channel-last-sync";

const FIELD_MANAGER: &str = "elemental-operator";

/// The `ManagedOSVersionChannel` resource.
pub fn channel_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        ELEMENTAL_GROUP,
        ELEMENTAL_VERSION,
        "ManagedOSVersionChannel",
    ))
}

/// The `ManagedOSVersion` resource.
pub fn version_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        ELEMENTAL_GROUP,
        ELEMENTAL_VERSION,
        "ManagedOSVersion",
    ))
}

/// One OS version of a channel, as a `channel.json` entry lists it.
#[derive(Clone, Debug)]
pub struct VersionEntry {
    /// `metadata.name`, also the ManagedOSVersion's name.
    pub name: String,
    /// `spec.version`.
    pub version: String,
    /// `spec.metadata.upgradeImage`.
    pub upgrade_image: String,
    /// `spec.metadata.created`, unix seconds, when the entry has one.
    pub created: Option<i64>,
}

/// Creates or updates a channel of type `custom` whose `spec.options.image` is `image`.
pub async fn apply_custom_channel(
    client: &Client,
    namespace: &str,
    name: &str,
    image: &str,
) -> Result<DynamicObject> {
    let resource = channel_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let channel = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "type": "custom",
            "enabled": true,
            "syncInterval": "1h",
            "options": { "image": image },
        },
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&channel),
    )
    .await
    .with_context(|| format!("applying ManagedOSVersionChannel {namespace}/{name}"))
}

/// Creates or updates the ManagedOSVersions of `entries` under `channel`, then
/// records the sync in the channel's status, as the operator does after a sync.
pub async fn sync_channel(
    client: &Client,
    channel: &DynamicObject,
    entries: &[VersionEntry],
) -> Result<Vec<DynamicObject>> {
    sync_channel_at(client, channel, entries, Timestamp::now()).await
}

/// [`sync_channel`] recording the sync as done at `synced_at` (the status
/// keeps whole seconds, so two syncs within one second look alike unless the
/// caller spaces their times).
pub async fn sync_channel_at(
    client: &Client,
    channel: &DynamicObject,
    entries: &[VersionEntry],
    synced_at: Timestamp,
) -> Result<Vec<DynamicObject>> {
    let applied = apply_versions(client, channel, entries, Some(synced_at)).await?;
    let namespace = channel
        .namespace()
        .context("a ManagedOSVersionChannel without a namespace")?;
    let channel_name = channel.name_any();
    let synced_at = serde_json::to_value(Time(synced_at)).context("formatting a time")?;
    let channels: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &channel_resource());
    let status = json!({
        "status": {
            "lastSyncedTime": synced_at,
            "syncedGeneration": channel.metadata.generation,
            "failedSynchronizationAttempts": 0,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "Synchronized",
                "message": "",
                "lastTransitionTime": synced_at,
            }],
        },
    });
    channels
        .patch_status(
            &channel_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .with_context(|| format!("patching the status of channel {namespace}/{channel_name}"))?;
    Ok(applied)
}

/// Creates or updates the ManagedOSVersions of `entries` under `channel` as
/// the operator does in a sync, each with the sync's time (the last-sync
/// annotation) when `synced_at` is given; the channel's status is left alone
/// ([`sync_channel`] records the sync there).
pub async fn apply_versions(
    client: &Client,
    channel: &DynamicObject,
    entries: &[VersionEntry],
    synced_at: Option<Timestamp>,
) -> Result<Vec<DynamicObject>> {
    let namespace = channel
        .namespace()
        .context("a ManagedOSVersionChannel without a namespace")?;
    let channel_name = channel.name_any();
    let uid = channel
        .uid()
        .context("a ManagedOSVersionChannel without a uid")?;
    let annotations = match synced_at {
        Some(at) => {
            let at = serde_json::to_value(Time(at)).context("formatting a time")?;
            json!({ LAST_SYNC_ANNOTATION: at })
        }
        None => json!({}),
    };
    let resource = version_resource();
    let versions: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let mut applied = Vec::with_capacity(entries.len());
    for entry in entries {
        let mut metadata = json!({
            "upgradeImage": entry.upgrade_image,
            "displayName": format!("OS {}", entry.version),
        });
        if let (Some(created), Some(map)) = (entry.created, metadata.as_object_mut()) {
            map.insert("created".to_owned(), Value::from(created));
        }
        let version = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {
                "name": entry.name,
                "namespace": namespace,
                "labels": { CHANNEL_LABEL: channel_name },
                "annotations": annotations,
                "ownerReferences": [{
                    "apiVersion": channel_resource().api_version,
                    "kind": "ManagedOSVersionChannel",
                    "name": channel_name,
                    "uid": uid,
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "version": entry.version,
                "type": "container",
                "metadata": metadata,
            },
        });
        let object = versions
            .patch(
                &entry.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&version),
            )
            .await
            .with_context(|| format!("applying ManagedOSVersion {namespace}/{}", entry.name))?;
        applied.push(object);
    }
    Ok(applied)
}

/// `channel.json` listing `entries` as an image carries it: each entry's
/// name, version, `container` type, upgrade image and `created` (a number).
pub fn channel_json(entries: &[VersionEntry]) -> Vec<u8> {
    let entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "metadata": {"name": e.name},
                "spec": {"version": e.version, "type": "container", "metadata": {
                    "upgradeImage": e.upgrade_image, "created": e.created,
                }},
            })
        })
        .collect();
    // A list of JSON values always serializes.
    serde_json::to_vec(&entries).unwrap_or_default()
}
