//! The fleet view under `make bench` (issue 19): thousands of MachineInventories over four
//! channels of many versions, side by side with kube-apiserver listing as many ConfigMaps
//! and with this server's own ManagedOSVersion list.
//!
//! Measured, every client with the same bearer token of a reader (token review and
//! authorization on), `Accept-Encoding: gzip` as kubectl sends it, HTTP/1.1 (`wrk`):
//! - (a) kube-apiserver: the ConfigMap list of the same item count (JSON, and as a Table);
//! - (b) the machine list through the aggregator (JSON, and as a Table);
//! - (d) the machine list from this server directly;
//! - (v) the ManagedOSVersion summary list of the four channels through the aggregator;
//! - one machine through the aggregator;
//! - cached vs uncached: the same `?cve=` machine list twice, the first a render
//!   (resolution of every machine and its exposure), the second from the ready-bytes cache;
//! - RSS before and after the machines are created;
//! - how long a machine's state takes to follow a change of its OS annotation.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::load::{self, Load, Measured};
use super::{Rss, Settings, settled_rss};
use crate::fixtures::OperatorChannel;
use crate::generated::{Channel, Spec};
use crate::image::{self, Compression};
use crate::paths::GROUP_VERSION;
use crate::registry::Registry;
use crate::testbed::TestBed;
use crate::wait::{POLL, poll};

/// The namespace of the fleet phase's channels, machines and ConfigMaps.
pub const NAMESPACE: &str = "bench-fleet";
/// Channels the machines run versions of.
const CHANNELS: usize = 4;
/// Packages of each version: the machine answers read summaries, not package lists.
const PACKAGES: usize = 20;
/// Objects created at once.
const CREATE_CONCURRENCY: usize = 16;
/// Connections of each load cell (lists are megabytes: with more, kube-apiserver's ConfigMap
/// list passes wrk's 2 s timeout).
const CONNECTIONS: usize = 4;
/// Samples of cached vs uncached and of following a change.
const SAMPLES: usize = 5;
/// Bound on the machines being created, resolved or served.
const DEADLINE: Duration = Duration::from_secs(900);
/// kubectl's Table `Accept`.
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// One measured cell.
#[derive(Clone, Debug)]
pub struct FleetCell {
    /// Letter and what was asked, for the report.
    pub label: String,
    /// What was measured.
    pub measured: Measured,
}

/// Everything the fleet phase measured.
#[derive(Clone, Debug, Default)]
pub struct FleetResults {
    /// Machines created.
    pub machines: usize,
    /// Channels and versions per channel.
    pub channels: usize,
    /// Versions of each channel.
    pub versions: usize,
    /// Bytes of the machine list (JSON, uncompressed) and of the ConfigMap list.
    pub list_bytes: (usize, usize),
    /// The load cells, baselines first.
    pub cells: Vec<FleetCell>,
    /// Uncached (render) and cached times of the same `?cve=` list, directly, milliseconds.
    pub uncached_ms: Vec<f64>,
    /// See `uncached_ms`.
    pub cached_ms: Vec<f64>,
    /// The server's RSS before and after the machines were created (and resolved once).
    pub rss: (Rss, Rss),
    /// From a machine's annotation changed to its answer showing the new version.
    pub follow: Vec<Duration>,
}

/// The image a machine of channel `c` on version `version` reports.
fn os_image(channel: &str, version: &str) -> String {
    format!("registry.example.com/{channel}/os:{version}")
}

/// Runs the fleet phase on `bed`, whose server watches [`NAMESPACE`]; `token` is the
/// reader's.
pub async fn run(
    bed: &TestBed,
    registry: &Registry,
    settings: &Settings,
    token: &str,
) -> Result<FleetResults> {
    let (machines, versions) = if settings.quick {
        (1_000, 100)
    } else {
        (5_000, 500)
    };
    let mut results = FleetResults {
        machines,
        channels: CHANNELS,
        versions,
        ..FleetResults::default()
    };
    let models = publish_channels(bed, registry, versions).await?;
    results.rss.0 = settled_rss(bed).await?;
    create_machines(bed, &models, machines).await?;
    let server = bed.server().context("no server")?;
    let direct_list = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories",
        server.url()
    );
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let started = Instant::now();
    let said = std::cell::Cell::new(Instant::now());
    let body = poll("the machines resolved", DEADLINE, POLL, async || {
        let asked = Instant::now();
        let body = http.get(&direct_list).send().await?.bytes().await?;
        let list: Value = serde_json::from_slice(&body)?;
        let items = list["items"].as_array().map_or(0, Vec::len);
        let known = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["state"] != "Unknown")
            .count();
        if said.get().elapsed() > Duration::from_secs(10) {
            said.set(Instant::now());
            eprintln!(
                "bench: {items} machines listed, {known} resolved ({:?} for the list)",
                asked.elapsed()
            );
        }
        Ok((items == machines && known == machines).then_some(body))
    })
    .await?
    .0;
    eprintln!(
        "bench: {machines} machines resolved {:?} after the last was created, list {} bytes",
        started.elapsed(),
        body.len()
    );
    results.rss.1 = settled_rss(bed).await?;
    // ConfigMaps of the same count, each holding one machine's answer, as the baseline.
    let item: Value = serde_json::from_slice::<Value>(&body)?["items"][0].clone();
    create_configmaps(bed, machines, &serde_json::to_string(&item)?).await?;

    let api = |path: &str| format!("{}{path}", bed.apiserver_url());
    let configmaps = api(&format!("/api/v1/namespaces/{NAMESPACE}/configmaps"));
    let aggregated = api(&format!(
        "{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories"
    ));
    let versions_list = api(&format!(
        "{GROUP_VERSION}/namespaces/{NAMESPACE}/managedosversions"
    ));
    let one = format!("{aggregated}/m-00000");
    let cm_bytes = reqwest_len(bed, &configmaps, token).await?;
    results.list_bytes = (body.len(), cm_bytes);
    let cells: [(&str, &str, bool); 8] = [
        (
            "(a) ConfigMap list, JSON (kube-apiserver)",
            &configmaps,
            false,
        ),
        (
            "(a) ConfigMap list, Table (kube-apiserver)",
            &configmaps,
            true,
        ),
        ("(b) machine list, JSON (aggregated)", &aggregated, false),
        ("(b) machine list, Table (aggregated)", &aggregated, true),
        ("(d) machine list, JSON (direct)", &direct_list, false),
        (
            "(v) ManagedOSVersion list, JSON (aggregated)",
            &versions_list,
            false,
        ),
        (
            "(v) ManagedOSVersion list, Table (aggregated)",
            &versions_list,
            true,
        ),
        ("(m) one machine, JSON (aggregated)", &one, false),
    ];
    let warm = bed.apiserver_http(None)?;
    for (label, url, table) in cells {
        // One request first: each cell measures answers as they are served once asked for
        // (kept ready here, in kube-apiserver's watch cache there), not the first render.
        let first = if url.starts_with(&bed.apiserver_url()) {
            warm.get(url)
        } else {
            http.get(url)
        };
        let status = first
            .bearer_auth(token)
            .header("Accept", if table { TABLE } else { "application/json" })
            .send()
            .await?
            .status();
        ensure!(status == 200, "{label}: {status}");
        let headers = vec![
            format!("Authorization: Bearer {token}"),
            format!("Accept: {}", if table { TABLE } else { "application/json" }),
            "Accept-Encoding: gzip".to_owned(),
        ];
        let measured = load::wrk(&Load {
            url,
            headers: &headers,
            threads: settings.threads,
            connections: CONNECTIONS,
            duration: settings.cell,
        })?;
        eprintln!(
            "bench: fleet {label}: {:.0} req/s p50 {:.2} ms p99 {:.2} ms {:.0} B/resp errors {}",
            measured.requests_per_second,
            measured.p50_ms,
            measured.p99_ms,
            measured.bytes_per_response,
            measured.errors
        );
        results.cells.push(FleetCell {
            label: label.to_owned(),
            measured,
        });
    }
    (results.uncached_ms, results.cached_ms) = cached_vs_uncached(bed, &direct_list).await?;
    results.follow = follow(bed, &models).await?;
    Ok(results)
}

/// The length of the body `url` answers `token` (uncompressed).
async fn reqwest_len(bed: &TestBed, url: &str, token: &str) -> Result<usize> {
    let response = bed
        .apiserver_http(None)?
        .get(url)
        .bearer_auth(token)
        .send()
        .await?;
    ensure!(response.status() == 200, "{url}: {}", response.status());
    Ok(response.bytes().await?.len())
}

/// Four channels of `versions` versions each, their upgrade images named after the
/// channel (no image in two channels), served.
async fn publish_channels(
    bed: &TestBed,
    registry: &Registry,
    versions: usize,
) -> Result<Vec<Channel>> {
    let mut models = Vec::new();
    for c in 0..CHANNELS {
        let model = Channel::generate(&Spec::new(
            &format!("fleet{c}"),
            versions,
            PACKAGES,
            100 + c as u64,
        ));
        let tag = format!("bench/fleet{c}:1");
        let files = model.raw_files("updateinfo.xml.zst")?;
        image::push_channel(registry, &tag, Compression::Zstd, &files).await?;
        let entries: Vec<_> = model
            .entries()
            .into_iter()
            .map(|mut e| {
                e.upgrade_image = os_image(&model.name, &e.version);
                e
            })
            .collect();
        let mut channel =
            OperatorChannel::custom(&bed.client(), NAMESPACE, &model.name, &registry.image(&tag))
                .await?;
        channel.sync(&entries).await?;
        models.push(model);
    }
    for model in &models {
        super::wait_served(bed, NAMESPACE, &model.name, model.versions.len()).await?;
    }
    Ok(models)
}

/// The MachineInventory API of [`NAMESPACE`].
fn machine_api(bed: &TestBed) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("elemental.cattle.io", "v1beta1", "MachineInventory"),
        "machineinventories",
    );
    Api::namespaced_with(bed.client(), NAMESPACE, &resource)
}

/// `count` machines `m-NNNNN`, machine `i` on version `i / CHANNELS` (cycling) of channel
/// `i % CHANNELS`, as the operator registers them.
async fn create_machines(bed: &TestBed, models: &[Channel], count: usize) -> Result<()> {
    let api = machine_api(bed);
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let model = &models[i % models.len()];
            let version = &model.versions[(i / models.len()) % model.versions.len()].version;
            let object = serde_json::from_value::<DynamicObject>(json!({
                "apiVersion": "elemental.cattle.io/v1beta1",
                "kind": "MachineInventory",
                "metadata": {
                    "name": format!("m-{i:05}"),
                    "namespace": NAMESPACE,
                    "labels": {"pool": format!("pool-{}", i % 10)},
                    "annotations": {"elemental.cattle.io/os.image": os_image(&model.name, version)},
                },
                "spec": {"tpmHash": format!("{i:064x}")},
            }));
            async move {
                api.create(&PostParams::default(), &object?).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    eprintln!(
        "bench: {count} MachineInventories created in {:?}",
        started.elapsed()
    );
    Ok(())
}

/// `count` ConfigMaps holding `data` each.
async fn create_configmaps(bed: &TestBed, count: usize, data: &str) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(bed.client(), NAMESPACE);
    futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("cm-{i:05}")),
                    ..ObjectMeta::default()
                },
                data: Some([("machine.json".to_owned(), data.to_owned())].into()),
                ..ConfigMap::default()
            };
            async move {
                api.create(&PostParams::default(), &map).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// The same `?cve=` list three times, directly as admin: the first renders it (every machine
/// resolved, its exposure computed); the cache's admission (quick_cache keeps a new entry in a
/// small "cold" part, and a full cache may drop it at once; asked again, it is kept) may make
/// the second render again; the third is the kept answer. Milliseconds: first, and third.
async fn cached_vs_uncached(bed: &TestBed, list: &str) -> Result<(Vec<f64>, Vec<f64>)> {
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let (mut uncached, mut cached) = (Vec::new(), Vec::new());
    for n in 0..SAMPLES {
        let url = format!("{list}?cve=CVE-2099-{n:05}");
        let mut times = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            let response = http
                .get(&url)
                .header("Accept-Encoding", "gzip")
                .send()
                .await?;
            ensure!(response.status() == 200, "{url}: {}", response.status());
            response.bytes().await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        eprintln!("bench: ?cve= list: {times:.1?} ms");
        uncached.push(times[0]);
        cached.push(times[2]);
    }
    Ok((uncached, cached))
}

/// Re-registers machine `m-00000` on another version `SAMPLES` times; each time, how long
/// until its answer (directly) shows the new version.
async fn follow(bed: &TestBed, models: &[Channel]) -> Result<Vec<Duration>> {
    let api = machine_api(bed);
    let server = bed.server().context("no server")?;
    let url = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories/m-00000",
        server.url()
    );
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let model = &models[0];
    let mut took = Vec::new();
    for n in 1..=SAMPLES {
        let version = &model.versions[n * 7 % model.versions.len()];
        let patch = json!({"metadata": {"annotations": {
            "elemental.cattle.io/os.image": os_image(&model.name, &version.version)}}});
        let started = Instant::now();
        api.patch("m-00000", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        poll(
            "the machine follows",
            Duration::from_secs(30),
            Duration::from_millis(10),
            async || {
                let answer: Value = http.get(&url).send().await?.json().await?;
                Ok((answer["current"]["name"] == version.name.as_str()).then_some(()))
            },
        )
        .await?;
        took.push(started.elapsed());
    }
    Ok(took)
}
