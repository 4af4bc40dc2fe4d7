//! [`Resources`] answering from reflector stores and a cache filled as the
//! channel workers fill it, with no network: the objects are what the
//! elemental-operator creates, the data is parsed from real channel files.

use std::collections::BTreeMap;

use elemental_changelog::{compute::IndexedChannel, data::ChannelData};
use elemental_changelog_apiservice::{Arch, content};
use futures::executor::block_on;
use http::{StatusCode, header};
use http_body_util::BodyExt;
use jiff::Timestamp;
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::*;
use crate::cache::{ChannelKey, ChannelState};
use crate::versions::{NO_MATCHING_PLATFORM, RETRY_AFTER_NOT_FETCHED};
use crate::{
    cache::{ArchState, FetchFailure},
    reflect::{Feeder, Stores},
};

const SL_MICRO_61: &[u8] =
    include_bytes!("../../../../changelog/tests/fixtures/channel-sl-micro-6.1-base.json");
const EXAMPLE_LOG: &[u8] =
    include_bytes!("../../../../changelog/tests/fixtures/example.updates.log.json");

const NS: &str = "fleet-default";
const OTHER_NS: &str = "other-tenant";
const IMAGE: &str = "registry.example.com/channels/sl-micro:6.1";
const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const OLD_DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
const NEWEST: &str = "base-v2.2.0-3.12-os";
const MIDDLE: &str = "base-v2.2.0-3.9-os";
const OLDEST: &str = "base-v2.2.0-3.8-os";
/// Listed by an earlier image of the channel only.
const RETAINED: &str = "base-v2.2.0-3.1-os";
const ARCHS: [&str; 2] = ["x86_64", "aarch64"];

fn file(path: &str, bytes: &[u8]) -> (String, Vec<u8>) {
    (path.to_owned(), bytes.to_vec())
}

/// An `updates.log` with one advisory.
fn log(id: &str, severity: &str, cve: Option<&str>) -> Vec<u8> {
    let mut references = vec![
        json!({"href": "https://bugzilla.suse.com/show_bug.cgi?id=42", "id": "42", "title": "bug", "type": "bugzilla"}),
    ];
    if let Some(cve) = cve {
        references.push(json!({"href": format!("https://cve.mitre.org/{cve}"), "id": cve, "title": cve, "type": "cve"}));
    }
    serde_json::to_vec(&json!([{"type": "security", "id": id, "title": format!("{id} title"), "severity": severity,
        "date": "1724000000", "references": references, "description": "d",
        "packages": [{"name": "kernel-default", "version": "6.4.0", "release": "1.1", "arch": "x86_64"}]}]))
    .unwrap_or_default()
}

fn channel_object(namespace: &str, name: &str, spec: Value) -> ManagedOSVersionChannel {
    serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"), "generation": 1},
        "spec": spec,
        "status": {"lastSyncedTime": "2026-01-01T00:00:00Z", "syncedGeneration": 1}
    }))
    .unwrap_or_else(|e| panic!("channel {name}: {e}"))
}

fn custom(namespace: &str, name: &str, image: &str) -> ManagedOSVersionChannel {
    channel_object(
        namespace,
        name,
        json!({"type": "custom", "options": {"image": image}, "syncInterval": "1h"}),
    )
}

/// A ManagedOSVersion as the operator creates it: channel label, controller
/// owner reference, sync annotation.
fn mov(namespace: &str, name: &str, channel: &str, version: &str) -> ManagedOSVersion {
    serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersion",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"),
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "labels": {"elemental.cattle.io/channel": channel},
            "annotations": {"elemental.cattle.io/channel-last-sync": "2026-01-01T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
                "name": channel, "uid": format!("uid-{namespace}-{channel}"), "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"version": version, "type": "container", "metadata": {"upgradeImage": format!("registry/os:{version}")}}
    }))
    .unwrap_or_else(|e| panic!("version {name}: {e}"))
}

fn snapshot(image: &str, digest: &str, data: ChannelData) -> Arc<Snapshot> {
    let parsed = Arc::new(data);
    let data = IndexedChannel::new(parsed.clone());
    data.precompute_summaries();
    Arc::new(
        Snapshot::read(
            image.parse().unwrap(),
            digest.parse().unwrap(),
            None,
            parsed,
            Timestamp::UNIX_EPOCH,
        )
        .with_data(data),
    )
}

/// The same data for every architecture, as for a single-platform image.
fn fetched(image: &str, snapshot: Option<Arc<Snapshot>>, error: Option<&str>) -> ChannelState {
    let failure = error.map(|message| FetchFailure {
        kind: crate::read_error::ReadErrorKind::Fetch(
            elemental_changelog_registry::FetchErrorKind::Registry,
        ),
        message: message.to_owned(),
        at: Timestamp::UNIX_EPOCH,
    });
    let arch = ArchState {
        confirmed_at: snapshot.as_ref().map(|_| Timestamp::UNIX_EPOCH),
        snapshot,
        last_error: failure,
        rejected: None,
    };
    ChannelState {
        image: Some(image.to_owned()),
        attempted: true,
        archs: ARCHS
            .iter()
            .map(|a| (a.parse().unwrap(), arch.clone()))
            .collect(),
    }
}

/// The sl-micro 6.1 image: three OS versions, the two newest with an
/// `updates.log` fixing CVE-2024-00002 (3.9 first), plus a version only an
/// earlier image listed.
fn sl_micro_data() -> ChannelData {
    let old_json = br#"[{"metadata":{"name":"base-v2.2.0-3.1-os"},"spec":{"version":"v2.2.0-3.1","type":"container","metadata":{"created":1700000000}}}]"#;
    let old = ChannelData::from_files([
        file("channel.json", old_json),
        file(
            "changelogs/base-v2.2.0-3.1-os.updates.log",
            &log("SUSE-OLD-1", "low", None),
        ),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let mut data = ChannelData::from_files([
        file("channel.json", SL_MICRO_61),
        file(&format!("changelogs/{NEWEST}.updates.log"), EXAMPLE_LOG),
        file(
            &format!("changelogs/{MIDDLE}.updates.log"),
            &log("SUSE-2024-0009", "critical", Some("CVE-2024-00002")),
        ),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(data.problems().is_empty(), "{:?}", data.problems());
    data.retain_from(&old, OLD_DIGEST, |_| true);
    data
}

struct World {
    channels: Feeder<ManagedOSVersionChannel>,
    versions: Feeder<ManagedOSVersion>,
    cache: Arc<Cache>,
    resources: Arc<Resources>,
    /// The version summaries' projector (the live task's, run by hand).
    projector: std::sync::Mutex<crate::projectors::VersionProjector>,
}

const BASE: &str = "/apis/changelog.elemental.cattle.io/v1beta1";

impl World {
    fn empty(default_arch: &str, archs: &[&str]) -> Self {
        let (channel_stores, channels) = Stores::single();
        let (version_stores, versions) = Stores::single();
        let stores = ChannelStores {
            channels: channel_stores,
            versions: version_stores,
        };
        let cache = Arc::new(Cache::default());
        let arch = |a: &str| a.parse::<Arch>().unwrap_or_else(|e| panic!("{e}"));
        let (projectors, writers) = crate::projectors::Projectors::new(
            &archs.iter().map(|a| arch(a)).collect::<Vec<_>>(),
            elemental_changelog_hub::Bounds::default(),
        );
        let projector = crate::projectors::VersionProjector::new(
            writers.versions,
            crate::versions::VersionData {
                stores: stores.clone(),
                cache: cache.clone(),
            },
        );
        let resources = Arc::new(Resources::new(
            stores,
            cache.clone(),
            arch(default_arch),
            archs.iter().map(|a| arch(a)).collect(),
            ReadyCache::new(4 << 20, crate::metrics::Registry::default().register()),
            projectors,
        ));
        Self {
            channels,
            versions,
            cache,
            resources,
            projector: std::sync::Mutex::new(projector),
        }
    }

    /// Two tenants, each with an `sl-micro` channel whose versions have the
    /// same names, and channels in every state a channel can be in.
    fn new() -> Self {
        let mut w = Self::empty("x86_64", &ARCHS);
        w.channel(custom(NS, "sl-micro", IMAGE));
        for (name, version) in [
            (NEWEST, "v2.2.0-3.12"),
            (MIDDLE, "v2.2.0-3.9"),
            (OLDEST, "v2.2.0-3.8"),
            (RETAINED, "v2.2.0-3.1"),
            ("base-v2.2.0-3.13-os", "v2.2.0-3.13"),
        ] {
            w.version(mov(NS, name, "sl-micro", version));
        }
        w.cache.update(&ChannelKey::new(NS, "sl-micro"), |_| {
            fetched(IMAGE, Some(snapshot(IMAGE, DIGEST, sl_micro_data())), None)
        });

        w.add_another_tenant();
        w.add_channels_in_every_state();
        w
    }

    /// Another tenant: the same channel and version names, other data.
    fn add_another_tenant(&mut self) {
        let other_image = "registry.example.com/other/sl-micro:6.1";
        self.channel(custom(OTHER_NS, "sl-micro", other_image));
        self.version(mov(OTHER_NS, NEWEST, "sl-micro", "v2.2.0-3.12"));
        self.version(mov(OTHER_NS, MIDDLE, "sl-micro", "v2.2.0-3.9"));
        let other = ChannelData::from_files([
            file("channel.json", SL_MICRO_61),
            file(
                &format!("changelogs/{NEWEST}.updates.log"),
                &log("OTHER-1", "low", Some("CVE-2025-9999")),
            ),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        self.cache
            .update(&ChannelKey::new(OTHER_NS, "sl-micro"), |_| {
                fetched(
                    other_image,
                    Some(snapshot(other_image, "sha256:other", other)),
                    None,
                )
            });
    }

    /// Channels in every other state: no image, not fetched, failed, failing with data;
    /// and versions without a channel.
    fn add_channels_in_every_state(&mut self) {
        // A json channel: no image, so no data.
        self.channel(channel_object(
            NS,
            "json-channel",
            json!({"type": "json", "options": {"uri": "https://example.com/channel.json"}}),
        ));
        self.version(mov(NS, "json-v1", "json-channel", "v1"));
        // Not fetched yet.
        self.channel(custom(NS, "pending", "registry.example.com/pending:1"));
        self.version(mov(NS, "pending-v1", "pending", "v1"));
        // Fetched and failed, no data ever.
        self.channel(custom(NS, "broken", "registry.example.com/broken:1"));
        self.version(mov(NS, "broken-v1", "broken", "v1"));
        self.cache.update(&ChannelKey::new(NS, "broken"), |_| {
            fetched(
                "registry.example.com/broken:1",
                None,
                Some("manifest unknown"),
            )
        });
        // Failing now, with data from an earlier success.
        let flaky_image = "registry.example.com/flaky:1";
        self.channel(custom(NS, "flaky", flaky_image));
        self.version(mov(NS, NEWEST, "sl-micro", "v2.2.0-3.12"));
        self.version(mov(NS, "flaky-os", "flaky", "v1"));
        let flaky = ChannelData::from_files([
            file(
                "channel.json",
                br#"[{"metadata":{"name":"flaky-os"},"spec":{"version":"v1","type":"container"}}]"#,
            ),
            file(
                "changelogs/flaky-os.updates.log",
                &log("FLAKY-1", "moderate", None),
            ),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        self.cache.update(&ChannelKey::new(NS, "flaky"), |_| {
            fetched(
                flaky_image,
                Some(snapshot(flaky_image, "sha256:flaky", flaky)),
                Some("connection refused"),
            )
        });
        // Versions without a channel.
        let mut orphan = mov(NS, "orphan", "x", "v1");
        orphan.metadata.labels = None;
        orphan.metadata.owner_references = None;
        self.version(orphan);
        self.version(mov(NS, "lost", "deleted-channel", "v1"));
    }

    fn channel(&mut self, c: ManagedOSVersionChannel) {
        self.channels.apply_watcher_event(&watcher::Event::Apply(c));
    }

    fn version(&mut self, v: ManagedOSVersion) {
        self.versions.apply_watcher_event(&watcher::Event::Apply(v));
    }

    /// Answers a GET of `path?query` as the server does: parsed by the request model,
    /// then answered (a parameter the model refuses is its 400).
    fn request(
        &self,
        path: &str,
        query: &str,
        accept: Option<&str>,
    ) -> Result<HttpResponse, StatusError> {
        self.request_with(path, query, accept, &HeaderMap::new())
    }

    /// [`World::request`] with request headers, answered as the routes do: kept bytes when
    /// there are, else rendered.
    fn request_with(
        &self,
        path: &str,
        query: &str,
        accept: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<HttpResponse, StatusError> {
        let uri = format!("{path}?{query}");
        let info = crate::request::RequestInfo::parse(
            &http::Method::GET,
            &uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}")),
        )?;
        // What the projector does when an input changes, done now.
        self.projector
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .all();
        match info.target() {
            crate::request::Target::Resource(resource) => {
                let answering = self.resources.answering(resource, accept)?;
                Ok(answering.run_here(&self.resources)?.respond(headers))
            }
            crate::request::Target::Invalid { error, .. } => Err(error.clone()),
            other => panic!("{uri} is not a resource request: {other:?}"),
        }
    }

    fn changelog(
        &self,
        namespace: &str,
        name: &str,
        query: &str,
    ) -> Result<HttpResponse, StatusError> {
        self.changelog_as(namespace, name, query, None)
    }

    fn changelog_as(
        &self,
        namespace: &str,
        name: &str,
        query: &str,
        accept: Option<&str>,
    ) -> Result<HttpResponse, StatusError> {
        self.request(&changelog_path(namespace, name), query, accept)
    }

    /// A changelog as JSON; panics on an error.
    fn changelog_json(&self, namespace: &str, name: &str, query: &str) -> Value {
        let response = self
            .changelog(namespace, name, query)
            .unwrap_or_else(|e| panic!("{name}?{query}: {e:?}"));
        assert_eq!(content_type(&response), content::JSON);
        json_body(response)
    }

    fn list(
        &self,
        namespace: Option<&str>,
        accept: Option<&str>,
        query: &str,
    ) -> Result<HttpResponse, StatusError> {
        let path = match namespace {
            Some(ns) => format!("{BASE}/namespaces/{ns}/managedosversions"),
            None => format!("{BASE}/managedosversions"),
        };
        self.request(&path, query, accept)
    }

    fn list_names(&self, namespace: Option<&str>, query: &str) -> Vec<String> {
        let body = json_body(
            self.list(namespace, None, query)
                .unwrap_or_else(|e| panic!("{query}: {e:?}")),
        );
        assert_eq!(body["kind"], "ManagedOSVersionChangelogSummaryList");
        items(&body)
            .iter()
            .map(|i| {
                format!(
                    "{}/{}",
                    i["metadata"]["namespace"].as_str().unwrap_or_default(),
                    i["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect()
    }

    fn get_as(
        &self,
        namespace: &str,
        name: &str,
        query: &str,
        accept: Option<&str>,
    ) -> Result<HttpResponse, StatusError> {
        self.request(
            &format!("{BASE}/namespaces/{namespace}/managedosversions/{name}"),
            query,
            accept,
        )
    }

    fn get(&self, namespace: &str, name: &str, query: &str) -> Value {
        json_body(
            self.get_as(namespace, name, query, None)
                .unwrap_or_else(|e| panic!("{name}: {e:?}")),
        )
    }
}

fn items(body: &Value) -> &[Value] {
    body["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn body(response: HttpResponse) -> Vec<u8> {
    block_on(response.into_body().collect())
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_default()
}

fn json_body(response: HttpResponse) -> Value {
    let bytes = body(response);
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)))
}

fn content_type(response: &HttpResponse) -> &str {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

fn error(result: Result<HttpResponse, StatusError>) -> StatusError {
    match result {
        Ok(response) => panic!(
            "expected an error, got {}: {}",
            response.status(),
            String::from_utf8_lossy(&body(response))
        ),
        Err(e) => e,
    }
}

fn cause(e: &StatusError) -> &str {
    e.details
        .as_ref()
        .and_then(|d| d.causes.first())
        .map_or("", |c| c.reason.as_str())
}

#[test]
fn a_changelog_has_every_field() {
    let w = World::new();
    let c = w.changelog_json(NS, NEWEST, "");
    assert_eq!(c["apiVersion"], "changelog.elemental.cattle.io/v1beta1");
    assert_eq!(c["kind"], "ManagedOSVersionChangelog");
    assert_eq!(c["metadata"]["name"], NEWEST);
    assert_eq!(c["metadata"]["namespace"], NS);
    assert_eq!(c["metadata"]["creationTimestamp"], "2026-01-02T03:04:05Z");
    assert_eq!(
        c["metadata"]["labels"]["elemental.cattle.io/channel"],
        "sl-micro"
    );
    assert_eq!(
        c["channel"],
        json!({"name": "sl-micro", "image": IMAGE, "digest": DIGEST})
    );
    assert_eq!(c["version"], "v2.2.0-3.12");
    assert_eq!(c["from"], json!({"name": MIDDLE, "version": "v2.2.0-3.9"}));
    assert_eq!(c["arch"], "x86_64");
    assert_eq!(c["source"], "Precomputed");
    assert_eq!(c["summary"]["advisories"], 2);
    assert_eq!(c["summary"]["cves"], 1);
    assert_eq!(c["summary"]["highestSeverity"], "Important");
    let advisories = c["advisories"]
        .as_array()
        .unwrap_or_else(|| panic!("no advisories: {c}"));
    assert_eq!(advisories.len(), 2);
    let security = advisories
        .iter()
        .find(|a| a["id"] == "Security-Update-ID")
        .unwrap_or_else(|| panic!("{c}"));
    assert_eq!(security["cves"], json!(["CVE-2024-00002"]));
    assert_eq!(security["bugs"], json!(["0000002"]));
    assert_eq!(security["issued"], "2024-08-20T11:47:06Z");
    assert_eq!(security["type"], "security");
    assert_eq!(security["packages"][0]["name"], "elemental-register");
    // Newest first.
    assert_eq!(advisories[0]["id"], "Security-Update-ID");
}

#[test]
fn text_and_markdown_formats() {
    let w = World::new();
    let text = w
        .changelog(NS, NEWEST, "format=text")
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(text.status(), StatusCode::OK);
    assert_eq!(content_type(&text), "text/plain; charset=utf-8");
    let text = String::from_utf8(body(text)).unwrap_or_default();
    assert!(
        text.contains("v2.2.0-3.12")
            && text.contains("Security-Update-ID")
            && text.contains("CVE-2024-00002"),
        "{text}"
    );
    let md = w
        .changelog(NS, NEWEST, "format=markdown")
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(content_type(&md), "text/markdown; charset=utf-8");
    assert!(
        String::from_utf8(body(md))
            .unwrap_or_default()
            .starts_with("# Changelog of v2.2.0-3.12")
    );
    assert!(w.changelog(NS, NEWEST, "format=md").is_ok());
    assert!(w.changelog(NS, NEWEST, "format=json").is_ok());
    assert_eq!(error(w.changelog(NS, NEWEST, "format=yaml")).code(), 400);
    // Text needs no JSON Accept (kubectl get --raw sends none anyway).
    assert!(
        w.changelog_as(
            NS,
            NEWEST,
            "format=text",
            Some("application/vnd.kubernetes.protobuf")
        )
        .is_ok()
    );
}

#[test]
fn missing_versions_and_channels_are_404_with_a_cause() {
    let w = World::new();
    let e = error(w.changelog(NS, "nope", ""));
    assert_eq!(
        (e.code(), e.details.as_ref().map(|d| d.name.as_str())),
        (404, Some("nope"))
    );
    assert_eq!(
        error(w.changelog(OTHER_NS, OLDEST, "")).code(),
        404,
        "a version of another namespace is not found"
    );
    assert_eq!(error(w.changelog("kube-system", NEWEST, "")).code(), 404);

    for (name, reason) in [
        ("orphan", "NoChannel"),
        ("lost", "NoChannel"),
        ("json-v1", "ChannelHasNoImage"),
        // Listed by the image, without an updates.log.
        (OLDEST, "NoChangelogData"),
        // Not listed by the image at all.
        ("base-v2.2.0-3.13-os", "NoChangelogData"),
    ] {
        let e = error(w.changelog(NS, name, ""));
        assert_eq!((e.code(), cause(&e)), (404, reason), "{name}: {e:?}");
        assert_eq!(e.details.as_ref().map(|d| d.name.as_str()), Some(name));
        assert!(e.retry_after.is_none());
        let status: Value = serde_json::from_slice(&e.to_json()).unwrap_or_default();
        assert_eq!(
            (status["kind"].as_str(), status["reason"].as_str()),
            (Some("Status"), Some("NotFound"))
        );
    }
    assert!(
        error(w.changelog(NS, "lost", ""))
            .message
            .contains("deleted-channel")
    );
}

#[test]
fn data_not_there_yet_is_503_with_retry_after() {
    let w = World::new();
    let e = error(w.changelog(NS, "pending-v1", ""));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (503, "NotFetched", Some(RETRY_AFTER_NOT_FETCHED))
    );
    assert_eq!(
        e.details.as_ref().map(|d| d.retry_after_seconds),
        Some(RETRY_AFTER_NOT_FETCHED)
    );
    let e = error(w.changelog(NS, "broken-v1", ""));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (503, "FetchFailed", None),
        "a failing registry needs an operator: no Retry-After for clients to spin on"
    );
    // The kind, never the registry's own words (issue 9: they may carry URLs and realms).
    assert!(e.message.contains("registry unreachable"), "{}", e.message);
    assert!(!e.message.contains("manifest unknown"), "{}", e.message);

    // The summaries say the same, without failing the list.
    let s = w.get(NS, "pending-v1", "");
    assert_eq!(
        (s["available"].as_bool(), s["reason"].as_str()),
        (Some(false), Some("NotFetched"))
    );
    assert_eq!(
        s["channel"],
        json!({"name": "pending", "image": "registry.example.com/pending:1"})
    );
    assert_eq!(w.get(NS, "broken-v1", "")["reason"], "FetchFailed");
    assert_eq!(w.get(NS, "json-v1", "")["reason"], "ChannelHasNoImage");
    assert_eq!(w.get(NS, "orphan", "")["reason"], "NoChannel");
    assert_eq!(w.get(NS, OLDEST, "")["reason"], "NoChangelogData");
}

#[test]
fn last_good_data_is_served_while_fetches_fail() {
    let w = World::new();
    let c = w.changelog_json(NS, "flaky-os", "");
    assert_eq!(c["channel"]["digest"], "sha256:flaky");
    assert_eq!(c["advisories"][0]["id"], "FLAKY-1");
    assert_eq!(w.get(NS, "flaky-os", "")["available"], true);
}

#[test]
fn from_must_be_an_older_version_of_the_same_channel() {
    let w = World::new();
    let c = w.changelog_json(NS, NEWEST, &format!("from={RETAINED}"));
    assert_eq!(
        c["from"],
        json!({"name": RETAINED, "version": "v2.2.0-3.1"})
    );
    let ids: Vec<&str> = c["advisories"]
        .as_array()
        .map(|a| a.iter().filter_map(|a| a["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        ids.len(),
        3,
        "3.9 and 3.12's advisories (3.8 has none): {ids:?}"
    );
    assert!(
        c["warnings"].as_array().is_some_and(|w| w
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains(OLDEST)))),
        "{c}"
    );

    for (from, why) in [
        ("nope", "does not exist"),
        ("json-v1", "belongs to channel json-channel"),
        ("orphan", "belongs to no channel"),
        (NEWEST, "not older"),
        ("base-v2.2.0-3.13-os", "not a version of this channel"),
    ] {
        let e = error(w.changelog(NS, MIDDLE, &format!("from={from}")));
        assert_eq!(e.code(), 400, "{from}: {e:?}");
        assert!(e.message.contains(why), "{from}: {}", e.message);
    }
    let e = error(w.changelog(NS, OLDEST, &format!("from={MIDDLE}")));
    assert_eq!(
        e.details
            .as_ref()
            .and_then(|d| d.causes.first())
            .map(|c| c.field.as_str()),
        Some("from")
    );
    // A version of the same name in another namespace is not "the same channel".
    assert_eq!(
        error(w.changelog(OTHER_NS, NEWEST, &format!("from={OLDEST}"))).code(),
        400
    );
}

#[test]
fn architectures_are_normalized_and_checked() {
    let w = World::new();
    assert_eq!(w.changelog_json(NS, NEWEST, "arch=amd64")["arch"], "x86_64");
    assert_eq!(
        w.changelog_json(NS, NEWEST, "arch=arm64")["arch"],
        "aarch64"
    );
    assert_eq!(
        w.changelog_json(NS, NEWEST, "arch=aarch64")["arch"],
        "aarch64"
    );
    let e = error(w.changelog(NS, NEWEST, "arch=s390x"));
    assert_eq!(e.code(), 400);
    assert!(e.message.contains("x86_64, aarch64"), "{}", e.message);
    assert_eq!(error(w.list(Some(NS), None, "arch=riscv64")).code(), 400);
}

#[test]
fn architectures_configured_with_oci_names_still_find_their_data() {
    // `--architecture amd64,arm64`: parsed once into `Arch`, so the workers
    // key the cache by the RPM names whatever the spelling configured.
    let mut w = World::empty("amd64", &["amd64", "arm64"]);
    w.channel(custom(NS, "sl-micro", IMAGE));
    w.version(mov(NS, NEWEST, "sl-micro", "v2.2.0-3.12"));
    let snap = snapshot(IMAGE, DIGEST, sl_micro_data());
    let arch = ArchState {
        snapshot: Some(snap),
        confirmed_at: None,
        last_error: None,
        rejected: None,
    };
    w.cache
        .update(&ChannelKey::new(NS, "sl-micro"), |_| ChannelState {
            image: Some(IMAGE.to_owned()),
            attempted: true,
            archs: BTreeMap::from([(Arch::x86_64(), arch.clone()), (Arch::aarch64(), arch)]),
        });
    assert_eq!(w.changelog_json(NS, NEWEST, "")["arch"], "x86_64");
    assert_eq!(
        w.changelog_json(NS, NEWEST, "arch=x86_64")["arch"],
        "x86_64"
    );
    assert_eq!(
        w.changelog_json(NS, NEWEST, "arch=arm64")["arch"],
        "aarch64"
    );
    assert_eq!(w.get(NS, NEWEST, "arch=aarch64")["available"], true);
}

#[test]
fn retained_versions_name_the_image_they_came_from() {
    let w = World::new();
    let c = w.changelog_json(NS, RETAINED, "");
    assert_eq!(
        c["channel"],
        json!({"name": "sl-micro", "image": IMAGE, "digest": OLD_DIGEST, "retained": true})
    );
    assert_eq!(c["advisories"][0]["id"], "SUSE-OLD-1");
    let s = w.get(NS, RETAINED, "");
    assert_eq!(s["channel"]["retained"], true);
    assert_eq!(s["channel"]["digest"], OLD_DIGEST);
    // Others are not retained.
    assert!(
        w.changelog_json(NS, NEWEST, "")["channel"]
            .get("retained")
            .is_none()
    );
}

#[test]
fn summaries_and_selectors() {
    let w = World::new();
    let s = w.get(NS, NEWEST, "");
    assert_eq!(s["kind"], "ManagedOSVersionChangelogSummary");
    assert_eq!(s["available"], true);
    assert_eq!(s["version"], "v2.2.0-3.12");
    assert_eq!(s["from"]["name"], MIDDLE);
    assert_eq!(s["summary"]["advisories"], 2);
    assert_eq!(s["created"], "2024-11-27T16:07:32Z");
    assert_eq!(error(w.get_as(NS, "nope", "", None)).code(), 404);

    let sl_micro = w.list_names(
        Some(NS),
        "labelSelector=elemental.cattle.io%2Fchannel%3Dsl-micro",
    );
    assert_eq!(sl_micro.len(), 5, "{sl_micro:?}");
    assert!(
        sl_micro
            .iter()
            .all(|n| n.starts_with("fleet-default/base-"))
    );
    assert_eq!(
        w.list_names(
            Some(NS),
            "labelSelector=elemental.cattle.io%2Fchannel+in+(pending,broken)"
        ),
        ["fleet-default/broken-v1", "fleet-default/pending-v1"]
    );
    assert_eq!(
        w.list_names(Some(NS), "labelSelector=!elemental.cattle.io%2Fchannel"),
        ["fleet-default/orphan"]
    );
    assert_eq!(
        w.list_names(None, &format!("fieldSelector=metadata.name%3D{NEWEST}")),
        [format!("{NS}/{NEWEST}"), format!("{OTHER_NS}/{NEWEST}")]
    );
    assert_eq!(
        w.list_names(
            None,
            &format!("fieldSelector=metadata.name%3D{NEWEST},metadata.namespace%3D{OTHER_NS}")
        ),
        [format!("{OTHER_NS}/{NEWEST}")]
    );
    assert_eq!(
        w.list_names(Some("empty-namespace"), ""),
        Vec::<String>::new()
    );
    assert_eq!(
        error(w.list(None, None, "labelSelector=a+in+b")).code(),
        400
    );
    assert_eq!(
        error(w.list(None, None, "fieldSelector=spec.version%3D1")).code(),
        400
    );
}

#[test]
fn cve_search_lists_the_fixing_versions_oldest_first() {
    let w = World::new();
    assert_eq!(
        w.list_names(Some(NS), "cve=cve-2024-00002"),
        [format!("{NS}/{MIDDLE}"), format!("{NS}/{NEWEST}")]
    );
    assert_eq!(
        w.list_names(None, "cve=CVE-2025-9999"),
        [format!("{OTHER_NS}/{NEWEST}")]
    );
    assert_eq!(
        w.list_names(None, "cve=CVE-2000-0001"),
        Vec::<String>::new()
    );
    assert_eq!(error(w.list(None, None, "cve=GHSA-1234")).code(), 400);
}

#[test]
fn package_lists_carry_a_block_and_bounds_keep_only_carriers() {
    let w = World::new();
    // No image of this world carries package lists: every version says so, whether its data
    // was read or not.
    let all = w.list_names(None, "");
    let body = json_body(
        w.list(None, None, "package=xz")
            .unwrap_or_else(|e| panic!("{e:?}")),
    );
    assert_eq!(items(&body).len(), all.len());
    for item in items(&body) {
        assert_eq!(
            item["package"],
            serde_json::json!({"name": "xz", "state": "NoPackageList"}),
            "{item}"
        );
    }
    // Without ?package=, no block.
    let plain = json_body(w.list(None, None, "").unwrap_or_else(|e| panic!("{e:?}")));
    assert!(items(&plain).iter().all(|i| i.get("package").is_none()));
    // Bounds keep only the versions carrying the package within them: none here.
    assert_eq!(
        w.list_names(None, "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2"),
        Vec::<String>::new()
    );
    // The Table has its Package column, also when empty.
    for query in ["package=xz", "package=xz&packageBelow=5.6.2"] {
        let table = json_body(
            w.list(Some(NS), Some(content::TABLE_V1), query)
                .unwrap_or_else(|e| panic!("{e:?}")),
        );
        let columns = table["columnDefinitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            columns.last().map(|c| c["name"].clone()),
            Some("Package".into())
        );
        for row in table["rows"].as_array().cloned().unwrap_or_default() {
            assert_eq!(row["cells"][columns.len() - 1], "xz (NoPackageList)");
        }
    }
    // Refusals name the parameter.
    for query in [
        "package=x%20y",
        "packageBelow=1",
        "package=xz&packageAtLeast=2&packageBelow=1",
    ] {
        assert_eq!(error(w.list(None, None, query)).code(), 400, "{query}");
    }
}

#[test]
fn tenants_with_the_same_names_never_mix() {
    let w = World::new();
    let ours = w.changelog_json(NS, NEWEST, "");
    let theirs = w.changelog_json(OTHER_NS, NEWEST, "");
    assert_eq!(theirs["channel"]["digest"], "sha256:other");
    assert_eq!(theirs["metadata"]["namespace"], OTHER_NS);
    assert_eq!(theirs["advisories"].as_array().map(Vec::len), Some(1));
    assert_eq!(theirs["advisories"][0]["id"], "OTHER-1");
    assert_ne!(ours["advisories"], theirs["advisories"]);
    let all = json_body(w.list(None, None, "").unwrap_or_else(|e| panic!("{e:?}")));
    for item in items(&all) {
        if item["metadata"]["name"] == NEWEST {
            let expected = if item["metadata"]["namespace"] == NS {
                DIGEST
            } else {
                "sha256:other"
            };
            assert_eq!(item["channel"]["digest"], expected, "{item}");
        }
    }
    assert_eq!(
        w.list_names(Some(OTHER_NS), ""),
        [
            format!("{OTHER_NS}/{NEWEST}"),
            format!("{OTHER_NS}/{MIDDLE}")
        ]
    );
}

#[test]
fn tables_for_kubectl_and_406_for_what_we_cannot_produce() {
    let w = World::new();
    let response = w
        .list(Some(NS), Some(content::TABLE_V1), "")
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(content_type(&response), content::TABLE_V1);
    let table = json_body(response);
    assert_eq!(
        (table["kind"].as_str(), table["apiVersion"].as_str()),
        (Some("Table"), Some("meta.k8s.io/v1"))
    );
    let names = w.list_names(Some(NS), "");
    assert_eq!(table["rows"].as_array().map(Vec::len), Some(names.len()));
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let none = json_body(
        w.list(Some(NS), Some(content::TABLE_V1), "includeObject=None")
            .unwrap_or_else(|e| panic!("{e:?}")),
    );
    assert!(none["rows"][0]["object"].is_null(), "{}", none["rows"][0]);
    let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let one = w
        .get_as(NS, NEWEST, "", Some(kubectl))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(content_type(&one), content::TABLE_V1);
    assert_eq!(json_body(one)["rows"].as_array().map(Vec::len), Some(1));

    let protobuf = "application/vnd.kubernetes.protobuf";
    assert_eq!(error(w.list(Some(NS), Some(protobuf), "")).code(), 406);
    assert_eq!(error(w.get_as(NS, NEWEST, "", Some(protobuf))).code(), 406);
    assert_eq!(
        error(w.changelog_as(NS, NEWEST, "", Some(protobuf))).code(),
        406
    );
    // A changelog asked as a Table is served as the object itself.
    let c = w
        .changelog_as(NS, NEWEST, "", Some(kubectl))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(content_type(&c), content::JSON);
    assert_eq!(
        error(w.list(
            Some(NS),
            Some(content::TABLE_V1),
            "includeObject=Everything"
        ))
        .code(),
        400
    );
}

#[test]
fn an_image_without_the_architecture_is_404_not_503() {
    let mut w = World::new();
    let image = "registry.example.com/x86-only:1";
    w.channel(custom(NS, "x86-only", image));
    w.version(mov(NS, "x86-v1", "x86-only", "v1"));
    let data = ChannelData::from_files([
        file(
            "channel.json",
            br#"[{"metadata":{"name":"x86-v1"},"spec":{"version":"v1","type":"container"}}]"#,
        ),
        file("changelogs/x86-v1.updates.log", &log("X86-1", "low", None)),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let x86 = ArchState {
        snapshot: Some(snapshot(image, "sha256:index", data)),
        confirmed_at: None,
        last_error: None,
        rejected: None,
    };
    let failure = FetchFailure {
        kind: NO_MATCHING_PLATFORM,
        message: "no linux/arm64 image in the index; it has: linux/amd64".to_owned(),
        at: Timestamp::UNIX_EPOCH,
    };
    let arm = ArchState {
        snapshot: None,
        confirmed_at: None,
        last_error: Some(failure),
        rejected: None,
    };
    w.cache
        .update(&ChannelKey::new(NS, "x86-only"), |_| ChannelState {
            image: Some(image.to_owned()),
            attempted: true,
            archs: BTreeMap::from([(Arch::x86_64(), x86), (Arch::aarch64(), arm)]),
        });
    assert_eq!(
        w.changelog_json(NS, "x86-v1", "")["advisories"][0]["id"],
        "X86-1"
    );
    let e = error(w.changelog(NS, "x86-v1", "arch=arm64"));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (404, "NoChangelogData", None),
        "{e:?}"
    );
    assert_eq!(
        w.get(NS, "x86-v1", "arch=aarch64")["reason"],
        "NoChangelogData"
    );
}

#[test]
fn retained_versions_being_rebuilt_are_not_fetched_yet_never_not_found() {
    let mut w = World::new();
    let rebuilt = "base-v2.2.0-2.9-os";
    w.version(mov(NS, rebuilt, "sl-micro", "v2.2.0-2.9"));
    let key = ChannelKey::new(NS, "sl-micro");
    let older: elemental_changelog_registry::ImageRef =
        format!("registry.example.com/channels/sl-micro@{OLD_DIGEST}")
            .parse()
            .unwrap();
    let statuses = |status: crate::cache::RetainedStatus| {
        BTreeMap::from([(
            Arch::x86_64(),
            BTreeMap::from([(rebuilt.to_owned(), status)]),
        )])
    };
    w.cache.set_retained_statuses(
        &key,
        statuses(crate::cache::RetainedStatus::Rebuilding {
            image: older.clone(),
        }),
    );
    let e = error(w.changelog(NS, rebuilt, ""));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (503, "NotFetched", Some(RETRY_AFTER_NOT_FETCHED)),
        "{e:?}"
    );
    let summary = w.get(NS, rebuilt, "");
    assert_eq!(summary["reason"], "NotFetched", "{summary}");

    let secret = "token realm https://auth.internal/token said: denied";
    w.cache.set_retained_statuses(
        &key,
        statuses(crate::cache::RetainedStatus::Failed {
            image: older,
            failure: FetchFailure {
                kind: crate::read_error::ReadErrorKind::Fetch(
                    elemental_changelog_registry::FetchErrorKind::NotFound,
                ),
                message: secret.to_owned(),
                at: Timestamp::now(),
            },
        }),
    );
    let e = error(w.changelog(NS, rebuilt, ""));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (503, "FetchFailed", None)
    );
    assert!(e.message.contains("image not found"), "{}", e.message);
    assert!(!e.message.contains("auth.internal"), "{}", e.message);

    w.cache.set_retained_statuses(&key, BTreeMap::new());
    assert_eq!(error(w.changelog(NS, rebuilt, "")).code(), 404);
}

fn header_of(response: &HttpResponse, name: header::HeaderName) -> &str {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The resource a GET of `uri` asks for.
fn resource_of(uri: &str) -> Resource {
    let info = crate::request::RequestInfo::parse(
        &http::Method::GET,
        &uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}")),
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    match info.target() {
        crate::request::Target::Resource(resource) => resource.clone(),
        other => panic!("{uri} is not a resource request: {other:?}"),
    }
}

impl Resources {
    /// The answer to `resource` when it is kept ready.
    fn kept(self: &Arc<Self>, resource: &Resource) -> Result<Option<Arc<Ready>>, StatusError> {
        Ok(match self.answering(resource, None)? {
            Answering::Ready(ready) => Some(ready),
            Answering::Render(_) => None,
        })
    }
}

fn changelog_path(namespace: &str, name: &str) -> String {
    format!("{BASE}/namespaces/{namespace}/managedosversions/{name}/changelog")
}

#[test]
fn answers_are_rendered_once_and_sent_as_kept() {
    let w = World::new();
    let path = changelog_path(NS, NEWEST);
    let resource = resource_of(&format!("{path}?from={OLDEST}"));
    assert!(
        w.resources
            .kept(&resource)
            .unwrap_or_else(|e| panic!("{e:?}"))
            .is_none()
    );
    let first = w
        .request(&path, &format!("from={OLDEST}"), None)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let kept = w
        .resources
        .kept(&resource)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let kept = kept.unwrap_or_else(|| panic!("the answer is kept after the first request"));
    let etag = header_of(&first, header::ETAG).to_owned();
    assert!(etag.starts_with('"'), "{etag}");
    assert_eq!(
        header_of(&first, header::CACHE_CONTROL),
        "no-cache, private"
    );
    assert_eq!(body(first), kept.body().to_vec());
    // A conditional request for the same answer is a 304 without a body.
    let mut conditional = HeaderMap::new();
    conditional.insert(
        header::IF_NONE_MATCH,
        etag.parse().unwrap_or_else(|e| panic!("{e}")),
    );
    let again = w
        .request_with(&path, &format!("from={OLDEST}"), None, &conditional)
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert!(body(again).is_empty());
    // A changelog under `ready::GZIP_MIN_BYTES` is sent as is, gzip accepted or not (so that
    // kube-apiserver's proxy gets it whole; the gzip form is tested in `ready`).
    assert!(kept.body().len() < super::super::ready::GZIP_MIN_BYTES);
    let mut gzip = HeaderMap::new();
    gzip.insert(
        header::ACCEPT_ENCODING,
        "gzip".parse().unwrap_or_else(|e| panic!("{e}")),
    );
    let plain = w
        .request_with(&path, &format!("from={OLDEST}"), None, &gzip)
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
    assert_eq!(body(plain), kept.body().to_vec());
}

#[test]
fn a_new_snapshot_or_object_is_never_answered_from_old_bytes() {
    let mut w = World::new();
    let before = w.changelog_json(NS, NEWEST, "");
    assert_eq!(before["channel"]["digest"], DIGEST);
    // The channel's image moves on: the next answer comes from the new snapshot.
    let newer = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    w.cache.update(&ChannelKey::new(NS, "sl-micro"), |_| {
        fetched(IMAGE, Some(snapshot(IMAGE, newer, sl_micro_data())), None)
    });
    let after = w.changelog_json(NS, NEWEST, "");
    assert_eq!(after["channel"]["digest"], newer);
    // The ManagedOSVersion changes (labels, resourceVersion): so does the answer's metadata.
    let mut changed = mov(NS, NEWEST, "sl-micro", "v2.2.0-3.12");
    changed.metadata.resource_version = Some("42".into());
    changed
        .metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "a".into());
    w.version(changed);
    let relabelled = w.changelog_json(NS, NEWEST, "");
    assert_eq!(relabelled["metadata"]["labels"]["team"], "a");
    assert_eq!(relabelled["metadata"]["resourceVersion"], "42");
}

#[test]
fn lists_follow_new_versions_and_new_data() {
    let mut w = World::new();
    let first = w.list_names(
        Some(NS),
        "labelSelector=elemental.cattle.io/channel%3Dsl-micro",
    );
    assert_eq!(first.len(), 5, "{first:?}");
    w.version(mov(NS, "base-v2.2.0-3.14-os", "sl-micro", "v2.2.0-3.14"));
    let second = w.list_names(
        Some(NS),
        "labelSelector=elemental.cattle.io/channel%3Dsl-micro",
    );
    assert!(
        second.contains(&format!("{NS}/base-v2.2.0-3.14-os")),
        "{second:?}"
    );
    // The pending channel's data arrives: its summary says so at once.
    let pending = |w: &World| w.get(NS, "pending-v1", "")["reason"].clone();
    assert_eq!(pending(&w), "NotFetched");
    w.cache.update(&ChannelKey::new(NS, "pending"), |_| {
        fetched(
            "registry.example.com/pending:1",
            None,
            Some("manifest unknown"),
        )
    });
    assert_eq!(pending(&w), "FetchFailed");
}

#[test]
fn default_answers_are_ready_before_the_first_request() {
    let w = World::new();
    let rendered = w.resources.prepare_defaults(u64::MAX);
    // Every version of a channel with data for it: sl-micro (3 in NS, 2 in OTHER_NS, one
    // retained) and flaky.
    assert!(rendered >= 5, "{rendered}");
    for (namespace, name) in [
        (NS, NEWEST),
        (NS, MIDDLE),
        (OTHER_NS, NEWEST),
        (NS, "flaky-os"),
    ] {
        let resource = resource_of(&changelog_path(namespace, name));
        assert!(
            w.resources
                .kept(&resource)
                .unwrap_or_else(|e| panic!("{e:?}"))
                .is_some(),
            "{namespace}/{name}"
        );
    }
    // A second pass finds them all kept.
    assert_eq!(w.resources.prepare_defaults(u64::MAX), 0);
    // Within a bound, it stops.
    let small = World::new();
    assert_eq!(small.resources.prepare_defaults(1), 1);
}

/// A refresh made for `sync`, knowing `versions` when it started.
fn refreshed(sync: &crate::channels::crd::SyncKey, versions: &[&str]) -> crate::cache::Refreshed {
    crate::cache::Refreshed {
        sync: sync.clone(),
        versions: Arc::new(versions.iter().map(|v| (*v).to_owned()).collect()),
    }
}

/// Of [`a_version_of_an_image_not_read_yet_is_503_never_404`]: the refresh for the latest
/// sync (`synced`) fails; returns the snapshot still served.
fn a_failed_read_is_fetch_failed(
    w: &World,
    key: &ChannelKey,
    new: &str,
    synced: &crate::channels::crd::SyncKey,
) -> Option<Arc<crate::cache::Snapshot>> {
    let served = |w: &World| w.cache.get(key).unwrap_or_else(|| panic!("state"));
    // The refresh for the latest sync ended with a failure: the last good data stays, the
    // new version is FetchFailed with the kind only, and a Retry-After.
    w.cache
        .set_refreshed(key, refreshed(synced, &[NEWEST, new]));
    let snapshot = served(w).archs["x86_64"].snapshot.clone();
    let secret = "503 Service Unavailable from https://registry.internal/v2/: busy";
    w.cache
        .update(key, |_| fetched(IMAGE, snapshot.clone(), Some(secret)));
    let e = error(w.changelog(NS, new, ""));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (503, "FetchFailed", Some(RETRY_AFTER_NOT_FETCHED)),
        "{e:?}"
    );
    assert!(
        e.message.contains("registry unreachable (registry)"),
        "{}",
        e.message
    );
    assert!(!e.message.contains("registry.internal"), "{}", e.message);
    let summary = w.get(NS, new, "");
    assert_eq!(
        (summary["available"].as_bool(), summary["reason"].as_str()),
        (Some(false), Some("FetchFailed")),
        "{summary}"
    );
    let list = json_body(
        w.list(Some(NS), None, "")
            .unwrap_or_else(|e| panic!("{e:?}")),
    );
    let item = items(&list)
        .iter()
        .find(|i| i["metadata"]["name"] == new)
        .cloned()
        .unwrap_or_default();
    assert_eq!(item["reason"], "FetchFailed", "{item}");
    assert_eq!(
        w.changelog_json(NS, NEWEST, "")["channel"]["digest"],
        DIGEST
    );
    snapshot
}

/// Issue 17, item 12: a version the served image lacks while the channel's newer image is
/// not read, or could not be, is "not yet" (503 with Retry-After), never "no data" (404).
#[test]
fn a_version_of_an_image_not_read_yet_is_503_never_404() {
    let mut w = World::new();
    let key = ChannelKey::new(NS, "sl-micro");
    let new = "base-v2.2.0-4.1-os";
    w.version(mov(NS, new, "sl-micro", "v2.2.0-4.1"));
    let channel = w
        .resources
        .stores
        .channels
        .get(NS, "sl-micro")
        .unwrap_or_else(|| panic!("channel"));
    let synced = channel.sync_key();

    // The operator re-synced the channel; the refresh for that sync is still running.
    let mut before = synced.clone();
    before.last_synced_time = Some("1999-01-01T00:00:00Z".to_owned());
    assert_ne!(before, synced);
    w.cache
        .set_refreshed(&key, refreshed(&before, &[NEWEST, new]));
    let e = error(w.changelog(NS, new, ""));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (503, "NotFetched", Some(RETRY_AFTER_NOT_FETCHED)),
        "{e:?}"
    );
    assert!(e.message.contains("not read yet"), "{}", e.message);
    assert_eq!(w.get(NS, new, "")["reason"], "NotFetched");
    // What the served image lists is served meanwhile.
    assert_eq!(
        w.changelog_json(NS, NEWEST, "")["channel"]["digest"],
        DIGEST
    );

    let snapshot = a_failed_read_is_fetch_failed(&w, &key, new, &synced);

    // The latest image was read and really lacks it: 404.
    w.cache
        .update(&key, |_| fetched(IMAGE, snapshot.clone(), None));
    let e = error(w.changelog(NS, new, ""));
    assert_eq!((e.code(), cause(&e)), (404, "NoChangelogData"), "{e:?}");
    assert_eq!(w.get(NS, new, "")["reason"], "NoChangelogData");

    // The operator creates a version, then marks the channel synced; this server may see
    // the version after the read for the sync started: not read yet.
    w.cache.set_refreshed(&key, refreshed(&synced, &[NEWEST]));
    let e = error(w.changelog(NS, new, ""));
    assert_eq!(
        (e.code(), cause(&e), e.retry_after),
        (503, "NotFetched", Some(RETRY_AFTER_NOT_FETCHED)),
        "{e:?}"
    );
    w.cache
        .set_refreshed(&key, refreshed(&synced, &[NEWEST, new]));
    assert_eq!(
        error(w.changelog(NS, new, "")).code(),
        404,
        "read once it existed"
    );
}
