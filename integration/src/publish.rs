//! A channel published as the operator would see it: a channel image pushed to
//! a real registry, the `ManagedOSVersionChannel` naming it and its
//! `ManagedOSVersion`s created ([`channel`]); for a generated channel
//! ([`crate::generated::Channel`]), its raw data (package lists and
//! `updateinfo.xml.zst`) and, with [`generated_channel`], the server serving
//! every version.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::Value;

use crate::generated::Channel;
use crate::image::{self, Compression};
use crate::paths::channel_summaries_path;
use crate::registry::Registry;
use crate::testbed::TestBed;
use crate::testbed::elemental::{self, VersionEntry};
use crate::wait::{POLL, SERVED, poll};

/// Pushes `files` as the one-layer channel image `tag` (gzip), applies the
/// `custom` channel `name` naming it in `namespace` and syncs `entries` as the
/// operator does; returns the image's digest. Nothing waits for the server.
pub async fn channel<P: AsRef<str>, D: AsRef<[u8]>>(
    bed: &TestBed,
    registry: &Registry,
    namespace: &str,
    name: &str,
    tag: &str,
    files: &[(P, D)],
    entries: &[VersionEntry],
) -> Result<String> {
    let digest = image::push_channel(registry, tag, Compression::Gzip, files).await?;
    ensure!(!digest.is_empty(), "pushed {tag} without a digest");
    let object =
        elemental::apply_custom_channel(&bed.client(), namespace, name, &registry.image(tag))
            .await?;
    elemental::sync_channel(&bed.client(), &object, entries).await?;
    Ok(digest)
}

/// [`channel`] of `channel`'s raw data, as `<channel name>/raw:1`, in
/// `namespace`, without waiting for the server; returns the image's digest.
pub async fn create_generated_channel(
    bed: &TestBed,
    registry: &Registry,
    namespace: &str,
    channel: &Channel,
) -> Result<String> {
    let files = channel.raw_files("updateinfo.xml.zst")?;
    let tag = format!("{}/raw:1", channel.name);
    self::channel(
        bed,
        registry,
        namespace,
        &channel.name,
        &tag,
        &files,
        &channel.entries(),
    )
    .await
}

/// [`create_generated_channel`], then waits until kube-apiserver (as admin,
/// through the aggregator) lists every version as available. Returns the
/// image's digest.
pub async fn generated_channel(
    bed: &TestBed,
    registry: &Registry,
    namespace: &str,
    channel: &Channel,
) -> Result<String> {
    let digest = create_generated_channel(bed, registry, namespace, channel).await?;
    wait_served(bed, namespace, channel).await?;
    Ok(digest)
}

/// Waits until kube-apiserver (as admin, through the aggregator) lists every
/// version of `channel` in `namespace` as available, for at most
/// [`SERVED`]; returns the time it took.
pub async fn wait_served(bed: &TestBed, namespace: &str, channel: &Channel) -> Result<Duration> {
    let path = channel_summaries_path(namespace, &channel.name);
    let (_, took) = poll(
        &format!("{namespace}/{} served", channel.name),
        SERVED,
        POLL,
        || async {
            let (status, body) = bed.admin_get(&path).await?;
            if !status.is_success() {
                return Ok(None);
            }
            let list: Value = serde_json::from_str(&body)?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let ready = items.len() == channel.versions.len()
                && items.iter().all(|i| i["available"] == true);
            Ok(ready.then_some(()))
        },
    )
    .await?;
    Ok(took)
}
