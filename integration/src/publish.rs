//! A generated channel ([`crate::generated::Channel`]) published as the operator
//! would see it: its raw data (package lists and `updateinfo.xml.zst`) pushed
//! to a real registry as a channel image, the `ManagedOSVersionChannel` and its
//! `ManagedOSVersion`s created, and the server serving every version.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::Value;

use crate::fixtures::poll;
use crate::generated::Channel;
use crate::image::{self, Compression, Format, Image};
use crate::registry::Registry;
use crate::testbed::TestBed;
use crate::testbed::elemental::{self, CHANNEL_LABEL};

/// Bound on the server fetching and parsing a channel image.
const DATA_DEADLINE: Duration = Duration::from_secs(90);
const POLL_INTERVAL: Duration = Duration::from_millis(200);

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
    let files: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice()))
        .collect();
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
    let path = format!(
        "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{namespace}/managedosversions?labelSelector={CHANNEL_LABEL}%3D{}",
        channel.name
    );
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let url = format!("{}{path}", bed.apiserver_url());
    poll(
        &format!("{namespace}/{} served", channel.name),
        DATA_DEADLINE,
        POLL_INTERVAL,
        || async {
            let response = http.get(&url).send().await?;
            if !response.status().is_success() {
                return Ok(None);
            }
            let list: Value = response.json().await?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let ready = items.len() == channel.versions.len()
                && items.iter().all(|i| i["available"] == true);
            Ok(ready.then_some(()))
        },
    )
    .await?;
    ensure!(!pushed.digest.is_empty(), "pushed {tag} without a digest");
    Ok(pushed.digest)
}
