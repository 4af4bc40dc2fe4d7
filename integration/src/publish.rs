//! A generated channel ([`crate::generated::Channel`]) published as the operator
//! would see it: its raw data (package lists and `updateinfo.xml.zst`) pushed
//! to a real registry as a channel image, the `ManagedOSVersionChannel` and its
//! `ManagedOSVersion`s created, and the server serving every version.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::Value;

use crate::generated::Channel;
use crate::image::{self, Compression, Format, Image};
use crate::paths::channel_summaries_path;
use crate::registry::Registry;
use crate::testbed::TestBed;
use crate::testbed::elemental;
use crate::wait::{POLL, SERVED, poll};

/// Pushes `channel`'s raw data as `<channel name>/raw:1`, creates the channel
/// and its versions in `namespace`, and waits until kube-apiserver (as admin,
/// through the aggregator) lists every version as available. Returns the
/// image's digest.
pub async fn generated_channel(
    bed: &TestBed,
    registry: &Registry,
    namespace: &str,
    channel: &Channel,
) -> Result<String> {
    let files = channel.raw_files("updateinfo.xml.zst")?;
    let tag = format!("{}/raw:1", channel.name);
    let pushed = image::push(
        registry,
        &tag,
        &Image::channel(Format::Oci, Compression::Gzip, &files),
    )
    .await?;
    let object = elemental::apply_custom_channel(
        &bed.client(),
        namespace,
        &channel.name,
        &registry.image(&tag),
    )
    .await?;
    elemental::sync_channel(&bed.client(), &object, &channel.entries()).await?;
    wait_served(bed, namespace, channel).await?;
    ensure!(!pushed.digest.is_empty(), "pushed {tag} without a digest");
    Ok(pushed.digest)
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
