//! Test data for the changelog end-to-end tests: channels of several
//! versions whose advisories are generated from a seed (ids, CVEs and bug ids
//! derived from it, so two channels never share data by accident), written
//! in upstream's channel image layout, and the checks that a served
//! `ManagedOSVersionChangelog` carries exactly what was generated.
//!
//! Also small helpers to check a `Status`, read Prometheus text and find
//! lines in a log file; polling with a deadline is [`crate::wait`].

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiservice::types::{
    Advisory, AdvisoryPackage, ManagedOSVersionChangelog, Reference, Severity, Source,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::generated;
use crate::image::{Compression, Format, Image};
use crate::registry::Registry;
use crate::testbed::elemental::{self, VersionEntry};

/// `created` of version number 0; version `n` is `n` weeks later.
const EPOCH_CREATED: i64 = 1_735_689_600; // 2025-01-01T00:00:00Z
const WEEK: i64 = 7 * 24 * 3600;

/// Severities as upstream writes them, with what the API must report.
const SEVERITIES: [(&str, Severity); 5] = [
    ("low", Severity::Low),
    ("moderate", Severity::Moderate),
    ("important", Severity::Important),
    ("critical", Severity::Critical),
    ("", Severity::Unspecified),
];

/// One generated advisory, as upstream's `updates.log` carries it.
#[derive(Clone, Debug)]
pub struct GeneratedAdvisory {
    /// Advisory id, unique to the seed, version and position.
    pub id: String,
    /// `security` when it fixes CVEs, else `recommended`.
    pub type_: String,
    /// Severity as written in the file (may be empty).
    pub severity: &'static str,
    /// What the API must report for [`GeneratedAdvisory::severity`].
    pub expected_severity: Severity,
    /// Title.
    pub title: String,
    /// Issue time, unix seconds (written as a string, as upstream does).
    pub issued: i64,
    /// CVE ids (references of type `cve`).
    pub cves: Vec<String>,
    /// Bug ids (references of type `bugzilla`).
    pub bugs: Vec<String>,
    /// Description.
    pub description: String,
    /// Packages shipped: name, version, release, arch.
    pub packages: Vec<(String, String, String, String)>,
}

impl GeneratedAdvisory {
    /// The advisory as `updates.log` carries it: a `self` reference, then
    /// CVE and bug references; every package with epoch `0`.
    pub fn published(&self) -> Advisory {
        let reference = |id: &str, type_: &str, href: String, title: String| Reference {
            id: id.to_owned(),
            type_: type_.to_owned(),
            href,
            title,
        };
        let mut references = vec![reference(
            &self.id,
            "self",
            format!(
                "https://www.suse.com/support/update/announcement/{}",
                self.id
            ),
            self.id.clone(),
        )];
        references.extend(self.cves.iter().map(|cve| {
            reference(
                cve,
                "cve",
                format!("https://www.suse.com/security/cve/{cve}"),
                cve.clone(),
            )
        }));
        references.extend(self.bugs.iter().map(|bug| {
            reference(
                bug,
                "bugzilla",
                format!("https://bugzilla.suse.com/show_bug.cgi?id={bug}"),
                format!("bug {bug}"),
            )
        }));
        Advisory {
            id: self.id.clone(),
            type_: self.type_.clone(),
            severity: self.expected_severity,
            title: self.title.clone(),
            issued: Timestamp::from_second(self.issued).ok(),
            cves: self.cves.clone(),
            bugs: self.bugs.clone(),
            references,
            description: self.description.clone(),
            packages: self
                .packages
                .iter()
                .map(|(name, version, release, arch)| AdvisoryPackage {
                    name: name.clone(),
                    epoch: Some("0".to_owned()),
                    version: version.clone(),
                    release: release.clone(),
                    arch: arch.clone(),
                })
                .collect(),
        }
    }
}

/// One generated version of a channel.
#[derive(Clone, Debug)]
pub struct GeneratedVersion {
    /// ManagedOSVersion name (`<prefix>-v1-<n>`).
    pub name: String,
    /// `spec.version` (`1.<n>.0`).
    pub version: String,
    /// `created`, unix seconds.
    pub created: i64,
    /// Its advisories, issued in the week before `created`.
    pub advisories: Vec<GeneratedAdvisory>,
}

impl GeneratedVersion {
    /// Its `changelogs/<name>.updates.log`, by the one writer of generated
    /// channels ([`generated::updates_log`]).
    pub fn updates_log(&self) -> Vec<u8> {
        let advisories: Vec<Advisory> = self
            .advisories
            .iter()
            .map(GeneratedAdvisory::published)
            .collect();
        generated::updates_log(&advisories)
    }
}

/// A channel's versions with their generated advisories, oldest first.
#[derive(Clone, Debug)]
pub struct GeneratedChannel {
    /// What the data was derived from.
    pub seed: String,
    /// Versions, oldest first.
    pub versions: Vec<GeneratedVersion>,
}

/// Bytes derived from the seed and a few numbers.
fn derive(seed: &str, parts: &[u64]) -> [u8; 32] {
    let mut hasher = Sha256::new().chain_update(seed.as_bytes());
    for part in parts {
        hasher.update(part.to_be_bytes());
    }
    hasher.finalize().into()
}

fn number(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

impl GeneratedChannel {
    /// The versions numbered `numbers` (1-based, ascending), named
    /// `<prefix>-v1-<n>`, each with one to three advisories derived from
    /// `seed` (the same seed and number always give the same version).
    pub fn generate(prefix: &str, seed: &str, numbers: impl IntoIterator<Item = u32>) -> Self {
        let tag: String = seed
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect::<String>()
            .to_ascii_uppercase();
        let versions = numbers
            .into_iter()
            .map(|n| {
                let created = EPOCH_CREATED + i64::from(n) * WEEK;
                let count = 1 + derive(seed, &[u64::from(n)])[0] % 3;
                let advisories = (0..u64::from(count))
                    .map(|k| {
                        let bytes = derive(seed, &[u64::from(n), k]);
                        let cves: Vec<String> = (0..usize::from(bytes[0] % 3))
                            .map(|c| {
                                let value = number(&bytes, 8 + 8 * c);
                                format!("CVE-{}-{}", 2020 + value % 6, 10_000 + value % 90_000)
                            })
                            .collect::<BTreeSet<_>>()
                            .into_iter()
                            .collect();
                        let bugs: Vec<String> = (0..1 + usize::from(bytes[1] % 2))
                            .map(|b| (1_200_000 + number(&bytes, 16 + 8 * b) % 100_000).to_string())
                            .collect::<BTreeSet<_>>()
                            .into_iter()
                            .collect();
                        let (severity, expected_severity) =
                            SEVERITIES[usize::from(bytes[2]) % SEVERITIES.len()];
                        let package = format!("pkg-{}", number(&bytes, 24) % 1000);
                        GeneratedAdvisory {
                            id: format!("SUSE-{tag}-{n}-{k}"),
                            type_: if cves.is_empty() {
                                "recommended"
                            } else {
                                "security"
                            }
                            .to_owned(),
                            severity,
                            expected_severity,
                            title: format!("Update of {package} for {seed} {n}.{k}"),
                            // Within the week before `created`, distinct per advisory.
                            issued: created - 3600 * (1 + i64::try_from(k).unwrap_or(0)),
                            cves,
                            bugs,
                            description: format!("Generated advisory {k} of version {n} ({seed})."),
                            packages: vec![(
                                package,
                                format!("{n}.{k}"),
                                format!("150600.{}", bytes[3]),
                                "x86_64".to_owned(),
                            )],
                        }
                    })
                    .collect();
                GeneratedVersion {
                    name: format!("{prefix}-v1-{n}"),
                    version: format!("1.{n}.0"),
                    created,
                    advisories,
                }
            })
            .collect();
        Self {
            seed: seed.to_owned(),
            versions,
        }
    }

    /// A version by name.
    pub fn version(&self, name: &str) -> Result<&GeneratedVersion> {
        self.versions
            .iter()
            .find(|v| v.name == name)
            .with_context(|| format!("no generated version {name} for {}", self.seed))
    }

    /// The newest version.
    pub fn newest(&self) -> Result<&GeneratedVersion> {
        self.versions.last().context("a channel without versions")
    }

    /// The version just before `name`, if any.
    pub fn previous(&self, name: &str) -> Option<&GeneratedVersion> {
        let index = self.versions.iter().position(|v| v.name == name)?;
        index.checked_sub(1).map(|i| &self.versions[i])
    }

    /// `channel.json` as upstream writes it.
    pub fn channel_json(&self) -> Vec<u8> {
        let entries: Vec<Value> = self
            .versions
            .iter()
            .map(|v| {
                json!({
                    "metadata": { "name": v.name },
                    "spec": {
                        "version": v.version,
                        "type": "container",
                        "metadata": {
                            "upgradeImage": upgrade_image(&v.version),
                            "displayName": format!("OS {}", v.version),
                            "created": v.created.to_string(),
                        },
                    },
                })
            })
            .collect();
        Value::Array(entries).to_string().into_bytes()
    }

    /// The image's files: `channel.json` and `changelogs/<name>.updates.log`.
    pub fn files(&self) -> Vec<(String, Vec<u8>)> {
        let mut files = vec![("channel.json".to_owned(), self.channel_json())];
        for version in &self.versions {
            files.push((
                format!("changelogs/{}.updates.log", version.name),
                version.updates_log(),
            ));
        }
        files
    }

    /// A one-layer channel image for GOARCH `arch` holding [`GeneratedChannel::files`].
    pub fn image(&self, format: Format, compression: Compression, arch: &str) -> Image {
        let files = self.files();
        Image::channel(format, compression, &files).arch(arch)
    }

    /// The ManagedOSVersions the operator creates for these versions.
    pub fn entries(&self) -> Vec<VersionEntry> {
        self.versions
            .iter()
            .map(|v| VersionEntry {
                name: v.name.clone(),
                version: v.version.clone(),
                upgrade_image: upgrade_image(&v.version),
                created: Some(v.created),
            })
            .collect()
    }

    /// Checks that `served` is exactly version `name` of this channel, with
    /// the previous version as `from`, read from precomputed files.
    pub fn check(&self, served: &ManagedOSVersionChangelog, name: &str) -> Result<()> {
        let version = self.version(name)?;
        let context = || format!("changelog of {name} ({})", self.seed);
        ensure!(
            served.kind == "ManagedOSVersionChangelog",
            "{}: kind {}",
            context(),
            served.kind
        );
        ensure!(
            served.metadata.name == name,
            "{}: metadata.name {}",
            context(),
            served.metadata.name
        );
        ensure!(
            served.version == version.version,
            "{}: version {}",
            context(),
            served.version
        );
        ensure!(
            served.source == Source::Precomputed,
            "{}: source {:?}",
            context(),
            served.source
        );
        let from = served
            .from
            .as_ref()
            .map(|f| (f.name.as_str(), f.version.as_str()));
        let previous = self
            .previous(name)
            .map(|p| (p.name.as_str(), p.version.as_str()));
        ensure!(
            from == previous,
            "{}: from {from:?}, expected {previous:?}",
            context()
        );
        check_advisories(&served.advisories, &version.advisories).with_context(context)?;
        let cves: BTreeSet<&String> = version.advisories.iter().flat_map(|a| &a.cves).collect();
        ensure!(
            served.summary.advisories == version.advisories.len()
                && served.summary.cves == cves.len(),
            "{}: summary {:?}, expected {} advisories and {} CVEs",
            context(),
            served.summary,
            version.advisories.len(),
            cves.len()
        );
        Ok(())
    }
}

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

/// The upgrade image the operator would record for `version`.
fn upgrade_image(version: &str) -> String {
    format!("registry.example.com/elemental/os:{version}")
}

/// Checks that `served` holds exactly `expected`, newest first.
pub fn check_advisories(served: &[Advisory], expected: &[GeneratedAdvisory]) -> Result<()> {
    let served_ids: BTreeSet<&str> = served.iter().map(|a| a.id.as_str()).collect();
    let expected_ids: BTreeSet<&str> = expected.iter().map(|a| a.id.as_str()).collect();
    ensure!(
        served_ids == expected_ids && served.len() == expected.len(),
        "advisories {served_ids:?}, expected {expected_ids:?}"
    );
    let mut issued = Vec::new();
    for advisory in served {
        let want = expected
            .iter()
            .find(|a| a.id == advisory.id)
            .with_context(|| format!("unexpected advisory {}", advisory.id))?;
        // Deserializing the served JSON already required RFC 3339.
        let parsed: Timestamp = advisory
            .issued
            .with_context(|| format!("{}: no issued", advisory.id))?;
        let at = parsed;
        ensure!(
            parsed.as_second() == want.issued,
            "{}: issued {at}, expected unix {}",
            advisory.id,
            want.issued
        );
        issued.push(parsed);
        let packages: Vec<AdvisoryPackage> = want
            .packages
            .iter()
            .map(|(name, version, release, arch)| AdvisoryPackage {
                name: name.clone(),
                epoch: None,
                version: version.clone(),
                release: release.clone(),
                arch: arch.clone(),
            })
            .collect();
        ensure!(
            advisory.type_ == want.type_
                && advisory.severity == want.expected_severity
                && advisory.title == want.title
                && advisory.cves == want.cves
                && advisory.bugs == want.bugs
                && advisory.description == want.description
                && advisory.packages == packages,
            "advisory served as {advisory:?}, generated as {want:?}"
        );
        ensure!(
            advisory.references.len() == 1 + want.cves.len() + want.bugs.len(),
            "{}: references {:?}",
            advisory.id,
            advisory.references
        );
    }
    ensure!(
        issued.windows(2).all(|w| w[0] >= w[1]),
        "advisories not newest first: {issued:?}"
    );
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_seeded() {
        let a = GeneratedChannel::generate("c", "alpha", 1..=3);
        let again = GeneratedChannel::generate("c", "alpha", 1..=3);
        let b = GeneratedChannel::generate("c", "beta", 1..=3);
        assert_eq!(a.files(), again.files());
        assert_ne!(a.files(), b.files());
        assert_eq!(a.versions.len(), 3);
        for (older, newer) in a.versions.iter().zip(&a.versions[1..]) {
            assert!(older.created < newer.created);
            for advisory in &newer.advisories {
                assert!(advisory.issued > older.created && advisory.issued < newer.created);
            }
        }
        let ids: BTreeSet<&str> = a
            .versions
            .iter()
            .flat_map(|v| v.advisories.iter().map(|x| x.id.as_str()))
            .collect();
        assert_eq!(
            ids.len(),
            a.versions.iter().map(|v| v.advisories.len()).sum::<usize>()
        );
        assert_eq!(
            a.previous("c-v1-2").map(|v| v.name.as_str()),
            Some("c-v1-1")
        );
        assert!(a.previous("c-v1-1").is_none());
        // A version is the same whichever others are generated with it.
        let later = GeneratedChannel::generate("c", "alpha", 2..=4);
        assert_eq!(later.files()[1], a.files()[2]);
    }

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

    #[test]
    fn updates_log_is_upstream_shaped() -> Result<()> {
        let channel = GeneratedChannel::generate("c", "shape", [1]);
        let version = channel.newest()?;
        let log: Value = serde_json::from_slice(&version.updates_log())?;
        let first = &log[0];
        assert!(first["date"].is_string());
        assert_eq!(first["id"], version.advisories[0].id.as_str());
        assert_eq!(first["references"][0]["type"], "self");
        assert_eq!(first["severity"], version.advisories[0].severity);
        assert_eq!(first["packages"][0]["epoch"], "0");
        assert_eq!(first["upstreamOnlyField"], "ignored");
        Ok(())
    }
}
