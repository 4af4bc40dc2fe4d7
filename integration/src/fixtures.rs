//! What end-to-end tests do around generated channels ([`crate::generated`]):
//! a channel kept the way elemental-operator keeps it ([`OperatorChannel`]),
//! an image re-tagged in the registry ([`retag`]); and small helpers to check
//! a `Status`, read Prometheus text and find lines in a log file. Polling
//! with a deadline is [`crate::wait`].

use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};

use crate::generated::Listing;
use crate::image::{Compression, Format};
use crate::registry::Registry;
use crate::testbed::elemental::{self, VersionEntry};

/// A channel kept the way elemental-operator keeps it: applied, then synced
/// (its ManagedOSVersions written and its status patched) as often as needed.
#[derive(Clone)]
pub struct OperatorChannel {
    client: Client,
    object: DynamicObject,
    last_sync: Option<Timestamp>,
}

impl std::fmt::Debug for OperatorChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorChannel")
            .field("namespace", &self.object.metadata.namespace)
            .field("name", &self.object.metadata.name)
            .field("last_sync", &self.last_sync)
            .finish_non_exhaustive()
    }
}

impl OperatorChannel {
    /// `listing` pushed to `registry` as `tag` (one OCI layer, gzip, amd64) and applied as the
    /// `custom` channel `namespace/name`, not synced yet; with the ManagedOSVersions the operator
    /// makes of it, each upgrade image `{os}:{version}`.
    pub async fn of_listing(
        client: &Client,
        registry: &Registry,
        listing: &Listing,
        (namespace, name, tag): (&str, &str, &str),
        os: &str,
    ) -> Result<(Self, Vec<VersionEntry>)> {
        crate::image::push(
            registry,
            tag,
            &listing.image(Format::Oci, Compression::Gzip, "amd64"),
        )
        .await?;
        let channel = Self::custom(client, namespace, name, &registry.image(tag)).await?;
        let entries = listing
            .entries()
            .into_iter()
            .map(|mut e| {
                e.upgrade_image = format!("{os}:{}", e.version);
                e
            })
            .collect();
        Ok((channel, entries))
    }

    /// Applies a `custom` channel naming `image`.
    pub async fn custom(client: &Client, namespace: &str, name: &str, image: &str) -> Result<Self> {
        let object = elemental::apply_custom_channel(client, namespace, name, image).await?;
        Ok(Self {
            client: client.clone(),
            object,
            last_sync: None,
        })
    }

    /// Applies a `json` channel (a URI, no image).
    pub async fn json(client: &Client, namespace: &str, name: &str, uri: &str) -> Result<Self> {
        let resource = elemental::channel_resource();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let channel = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "type": "json", "enabled": true, "syncInterval": "1h", "options": { "URI": uri } },
        });
        let object = api
            .patch(
                name,
                &PatchParams::apply("elemental-operator").force(),
                &Patch::Apply(&channel),
            )
            .await
            .with_context(|| format!("applying json channel {namespace}/{name}"))?;
        Ok(Self {
            client: client.clone(),
            object,
            last_sync: None,
        })
    }

    /// Its namespace.
    pub fn namespace(&self) -> String {
        self.object.namespace().unwrap_or_default()
    }

    /// Its name.
    pub fn name(&self) -> String {
        self.object.name_any()
    }

    /// Syncs `entries` as the operator does; the recorded sync time is
    /// always later than the previous one (the status keeps whole seconds),
    /// so every call is a re-sync the server can see.
    pub async fn sync(&mut self, entries: &[VersionEntry]) -> Result<()> {
        let now = Timestamp::from_second(Timestamp::now().as_second())?;
        let at = match self.last_sync {
            Some(last) if now <= last => last.checked_add(SignedDuration::from_secs(1))?,
            _ => now,
        };
        elemental::sync_channel_at(&self.client, &self.object, entries, at).await?;
        self.last_sync = Some(at);
        Ok(())
    }

    /// Creates or updates ManagedOSVersions of `entries` under the channel as
    /// the operator does, without recording a sync (no last-sync annotation,
    /// no status patch): the server sees new versions and no sync.
    pub async fn create_versions(&self, entries: &[VersionEntry]) -> Result<()> {
        elemental::apply_versions(&self.client, &self.object, entries, None).await?;
        Ok(())
    }

    /// Points the channel at another image (a spec change: its generation grows).
    pub async fn set_image(&mut self, image: &str) -> Result<()> {
        self.object =
            elemental::apply_custom_channel(&self.client, &self.namespace(), &self.name(), image)
                .await?;
        Ok(())
    }

    /// Deletes one of its ManagedOSVersions.
    pub async fn delete_version(&self, name: &str) -> Result<()> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace(),
            &elemental::version_resource(),
        );
        api.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting ManagedOSVersion {}/{name}", self.namespace()))?;
        Ok(())
    }
}

/// Tags `repository:to` with the manifest `repository:from` names, byte for
/// byte (as `crane tag` does), without pushing any blob; returns its digest.
/// A broken image can so be prepared under a tag nobody reads and then
/// appear under a watched tag at once.
pub async fn retag(registry: &Registry, repository: &str, from: &str, to: &str) -> Result<String> {
    const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
        application/vnd.oci.image.index.v1+json, \
        application/vnd.docker.distribution.manifest.v2+json, \
        application/vnd.docker.distribution.manifest.list.v2+json";
    let response = registry
        .request(
            reqwest::Method::GET,
            &format!("/v2/{repository}/manifests/{from}"),
        )?
        .header(reqwest::header::ACCEPT, ACCEPT)
        .send()
        .await?;
    ensure!(
        response.status().is_success(),
        "GET manifest {repository}:{from}: {}",
        response.status()
    );
    let media_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .context("a manifest without Content-Type")?
        .clone();
    let manifest = response.bytes().await?;
    let response = registry
        .request(
            reqwest::Method::PUT,
            &format!("/v2/{repository}/manifests/{to}"),
        )?
        .header(reqwest::header::CONTENT_TYPE, media_type)
        .body(manifest.clone())
        .send()
        .await?;
    ensure!(
        response.status().is_success(),
        "PUT manifest {repository}:{to}: {}",
        response.status()
    );
    Ok(crate::image::sha256(&manifest))
}

/// Checks that `status` is a failure `Status` with `code` and `reason`.
pub fn expect_status(status: &Value, code: u16, reason: &str) -> Result<()> {
    ensure!(status["kind"] == "Status", "not a Status: {status}");
    ensure!(status["apiVersion"] == "v1", "{status}");
    ensure!(status["status"] == "Failure", "{status}");
    ensure!(status["code"] == code, "{status}");
    ensure!(status["reason"] == reason, "{status}");
    Ok(())
}

/// The `reason` of the first cause of the `Status` in `body`, and its
/// message; empty strings where there are none.
pub fn cause(body: &[u8]) -> (String, String) {
    let status: Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    (
        text(&status["details"]["causes"][0]["reason"]),
        text(&status["message"]),
    )
}

/// The sum of the samples of `name` in Prometheus text whose labels include
/// every pair of `labels`; 0 when there is none.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let matches = labels.iter().all(|(key, val)| {
                rest.split(',')
                    .any(|pair| pair == format!("{key}=\"{val}\""))
            });
            matches.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// The lines of the log file `path` that contain every one of `needles`.
pub fn log_lines(path: &Path, needles: &[&str]) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|line| needles.iter().all(|n| line.contains(n)))
        .map(str::to_owned)
        .collect())
}

/// `value` without its `resourceVersion`s: what two answers say, apart from how the replica
/// that gave them numbers its kept answers (each replica numbers its own, see api.md's Watch).
pub fn without_resource_versions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("resourceVersion");
            map.values_mut().for_each(without_resource_versions);
        }
        Value::Array(items) => items.iter_mut().for_each(without_resource_versions),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_matching_samples() {
        let text = "# HELP x y\n\
                    elemental_changelog_channel_fetches_total{result=\"pulled\"} 3\n\
                    elemental_changelog_channel_fetches_total{result=\"layer\"} 2\n\
                    elemental_changelog_channels 4\n";
        let fetches = "elemental_changelog_channel_fetches_total";
        assert_eq!(metric(text, fetches, &[("result", "pulled")]), 3.0);
        assert_eq!(metric(text, fetches, &[]), 5.0);
        assert_eq!(metric(text, fetches, &[("result", "auth")]), 0.0);
        assert_eq!(metric(text, "elemental_changelog_channels", &[]), 4.0);
    }
}
