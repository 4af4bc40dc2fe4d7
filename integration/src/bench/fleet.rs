//! The fleet view under `make bench` (issues 19 and 25): 50,000 MachineInventories over four
//! channels of 500 versions, side by side with kube-apiserver listing and watching as many
//! objects, and with this server's own ManagedOSVersion list.
//!
//! Measured, every client with the same bearer token of a reader (token review and
//! authorization on), `Accept-Encoding: gzip` as kubectl sends it:
//! - lists of all machines, one request at a time, rounds interleaved so that both sides see
//!   the same machine load: (a) kube-apiserver's ConfigMap list of the same item count and
//!   mean item size (JSON, and as a Table), (b) the machine list through the aggregator (JSON,
//!   and as a Table), (d) the machine list from this server directly;
//! - with `wrk` (HTTP/1.1): (v) the ManagedOSVersion summary list of the four channels through
//!   the aggregator; (m) one machine through the aggregator;
//! - cached vs uncached: the same `?cve=` machine list twice, the first a render
//!   (resolution of every machine and its exposure), the second from the ready-bytes cache;
//! - the server's RSS (`VmRSS`, `VmHWM`) before and after the machines are created, and the
//!   bytes each machine adds;
//! - watch event latency: 100 watchers of the machines through the aggregator and 100 of
//!   the MachineInventory CRD on kube-apiserver, one machine's OS annotation changed: from
//!   just before the PATCH is sent to the event at each watcher;
//! - a Rancher-style poller (a LIST of all machines every 5 s for a minute): the server's CPU
//!   seconds per list;
//! - how long a machine's state takes to follow a change of its OS annotation;
//! - how long the setup (channels, machines, ConfigMaps) took.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::load::{self, Load, Measured, percentile};
use super::machines::{
    CHANGED, EVENT_DEADLINE, NAMESPACE, OS_IMAGE, Seen, Side, cpu_time, list_resource_version,
    machine_api, os_image, ticks_per_second, watcher,
};
use super::pressure;
use super::{Rss, Settings, settled_rss};
use crate::fixtures::OperatorChannel;
use crate::generated::{Channel, Spec};
use crate::image::{self, Compression};
use crate::paths::GROUP_VERSION;
use crate::registry::Registry;
use crate::testbed::TestBed;
use crate::wait::{POLL, poll};

/// Channels the machines run versions of.
const CHANNELS: usize = 4;
/// Packages of each version: the machine answers read summaries, not package lists.
const PACKAGES: usize = 20;
/// Objects created at once (kube-apiserver admits 200 mutating requests at once).
const CREATE_CONCURRENCY: usize = 64;
/// Connections of each `wrk` cell.
const CONNECTIONS: usize = 4;
/// Samples of cached vs uncached and of following a change.
const SAMPLES: usize = 5;
/// Watchers on each side of the watch latency (this server allows 100 watches per user).
pub const WATCHERS: usize = 100;
/// How often the Rancher-style poller lists all machines (Steve's SQL cache, Rancher 2.12).
pub const POLL_PERIOD: Duration = Duration::from_secs(5);
/// Bound on the machines being created, resolved or served.
const DEADLINE: Duration = Duration::from_secs(1800);
/// kubectl's Table `Accept`.
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
/// Changes after the timed ones, recorded with perf (not timed: perf slows the server).
pub const PROFILED_CHANGES: usize = 5;
/// Polls after the measured ones, recorded with perf.
pub const PROFILED_LISTS: usize = 3;

/// One measured cell.
#[derive(Clone, Debug)]
pub struct FleetCell {
    /// Letter and what was asked, for the report.
    pub label: String,
    /// What was measured.
    pub measured: Measured,
    /// How: `wrk` (a fixed time under load) or lists one at a time (how many).
    pub how: String,
}

/// Watch event latencies of one side, from just before the PATCH to the event at a watcher.
#[derive(Clone, Debug, Default)]
pub struct WatchLatency {
    /// What was watched.
    pub label: String,
    /// One latency per watcher and change.
    pub latencies: Vec<Duration>,
}

/// The Rancher-style poller: a LIST of all machines every [`POLL_PERIOD`].
#[derive(Clone, Debug, Default)]
pub struct Poller {
    /// Lists sent.
    pub lists: usize,
    /// How long the poller ran.
    pub took: Duration,
    /// The server's CPU time (user and system) over the whole run.
    pub cpu_total: Duration,
    /// The server's CPU time from each list sent to its last byte received, summed.
    pub cpu_in_lists: Duration,
    /// Each list's time to its last byte, milliseconds.
    pub list_ms: Vec<f64>,
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
    /// Uncached and cached times of a `?package=` list of the same machines (a bounded one that
    /// keeps nearly all of them, as `?cve=` lists all), directly, milliseconds.
    pub package_uncached_ms: Vec<f64>,
    /// See `package_uncached_ms`.
    pub package_cached_ms: Vec<f64>,
    /// The server's RSS before and after the machines were created (and resolved once).
    pub rss: (Rss, Rss),
    /// The server's RSS at the end of the phase (lists, watches and the poller served).
    pub rss_end: Rss,
    /// Lists of all machines asked at once by clients that do not accept gzip.
    pub plain_lists: PlainLists,
    /// From a machine's annotation changed to its answer showing the new version.
    pub follow: Vec<Duration>,
    /// Watch event latency: this server through the aggregator, then kube-apiserver's CRD.
    pub watch: Vec<WatchLatency>,
    /// Changes whose events were timed (each reaches every watcher of both sides).
    pub watch_changes: usize,
    /// The Rancher-style poller.
    pub poller: Poller,
    /// How long each setup step took, in order.
    pub setup: Vec<(String, Duration)>,
    /// The server's CPU profile over [`PROFILED_CHANGES`] more changes after the timed ones
    /// (the top of `perf report`), when perf may record.
    pub watch_profile: Option<String>,
    /// The server's CPU profile over [`PROFILED_LISTS`] more polls after the measured ones.
    pub poller_profile: Option<String>,
    /// The server's CPU per single-machine change: with a fifth of the machines, then all.
    pub change_cpu: Vec<pressure::ChangeCpu>,
    /// Watches of every machine from `resourceVersion=0` whose client never reads: with a
    /// fifth of the machines (before any large list), then with all.
    pub zero_window: Vec<pressure::ZeroWindow>,
    /// GETs of other machines with and without a PATCH loop on one.
    pub patch_loop: Option<pressure::PatchLoop>,
    /// The server's memory with channels of 800 packages a version and their package index.
    pub package_memory: Option<pressure::PackageMemory>,
}

/// Clients that list all machines at once without accepting gzip (issue 35).
pub const PLAIN_CLIENTS: usize = 4;

/// [`PLAIN_CLIENTS`] lists of all machines at once, straight to the server, by clients that
/// do not accept gzip: the list is kept gzipped, and each such request was decompressed whole
/// into memory of its own (RSS 165 -> 332 MiB with 50,000 machines); now it is streamed.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainLists {
    /// Bytes each client read.
    pub bytes: usize,
    /// The server's `VmRSS` and `VmHWM` before the lists and after them.
    pub rss: (Rss, Rss),
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
        (2_000, 100)
    } else {
        (50_000, 500)
    };
    let machines = settings.machines.unwrap_or(machines);
    let mut results = FleetResults {
        machines,
        channels: CHANNELS,
        versions,
        ..FleetResults::default()
    };
    let step = Instant::now();
    let models = publish_channels(bed, registry, versions).await?;
    results.setup.push((
        format!("{CHANNELS} channels of {versions} versions published and served"),
        step.elapsed(),
    ));
    results.rss.0 = settled_rss(bed).await?;
    let server = bed.server().context("no server")?;
    let pid = server
        .process()
        .pid()
        .context("the server is not running")?;
    let direct_list = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories",
        server.url()
    );
    // A fifth of the fleet first: the CPU of a single-machine change there, next to the same
    // with the whole fleet (issue 35: within 1.5×).
    let cpu_changes = if settings.quick { 200 } else { 1000 };
    let fifth = (machines / 5).max(1);
    let step = Instant::now();
    create_machines(bed, &models, 0..fifth).await?;
    results.setup.push((
        format!("{fifth} MachineInventories created ({CREATE_CONCURRENCY} at once)"),
        step.elapsed(),
    ));
    resolved(bed, &direct_list, fifth).await?;
    results
        .change_cpu
        .push(pressure::change_cpu(bed, token, &models[0], fifth, cpu_changes, pid).await?);
    results
        .zero_window
        .push(pressure::zero_window(bed, fifth, pid).await?);
    let step = Instant::now();
    create_machines(bed, &models, fifth..machines).await?;
    results.setup.push((
        format!(
            "{} more MachineInventories created ({CREATE_CONCURRENCY} at once)",
            machines - fifth
        ),
        step.elapsed(),
    ));
    let started = Instant::now();
    let body = resolved(bed, &direct_list, machines).await?;
    eprintln!(
        "bench: {machines} machines resolved {:?} after the last was created, list {} bytes",
        started.elapsed(),
        body.len()
    );
    results.setup.push((
        "the machines listed, all resolved".to_owned(),
        started.elapsed(),
    ));
    results.rss.1 = settled_rss(bed).await?;
    eprintln!("bench: RSS {:?} → {:?}", results.rss.0, results.rss.1);
    results.plain_lists = plain_lists(bed, &direct_list, pid).await?;
    // ConfigMaps of the same count and mean size as the machines in their list, as the
    // baseline: a ConfigMap's own fields (metadata, managedFields) counted, the rest data.
    let mean_item = body.len() / machines;
    let data_bytes = mean_item.saturating_sub(configmap_overhead(bed).await?);
    let step = Instant::now();
    create_configmaps(bed, machines, &"x".repeat(data_bytes)).await?;
    results.setup.push((
        format!("{machines} ConfigMaps created ({CREATE_CONCURRENCY} at once)"),
        step.elapsed(),
    ));

    let api = |path: &str| format!("{}{path}", bed.apiserver_url());
    let configmaps = api(&format!("/api/v1/namespaces/{NAMESPACE}/configmaps"));
    let aggregated = api(&format!(
        "{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories"
    ));
    let versions_list = api(&format!(
        "{GROUP_VERSION}/namespaces/{NAMESPACE}/managedosversions"
    ));
    let one = format!("{aggregated}/{CHANGED}");
    let cm_bytes = reqwest_len(bed, &configmaps, token).await?;
    results.list_bytes = (body.len(), cm_bytes);
    drop(body);

    // Lists of all machines, one at a time, the rounds interleaved.
    let rounds = if settings.quick { 5 } else { 20 };
    let cve_list = format!("{aggregated}?cve=CVE-2099-00001");
    let package_list = format!("{aggregated}?package=bash");
    let lists: [(&str, &str, bool); 5] = [
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
    ];
    results
        .cells
        .extend(sampled_lists(bed, token, &lists, rounds).await?);
    // The `?cve=` and `?package=` lists once kept, each on its own: five lists of about 5 MB
    // (gzipped) taking turns are more than the default `--answer-cache-size` (32 MiB) keeps,
    // so in the rounds above they would be rendered again and again. Asked once more before
    // the unmeasured round: the answer cache admits an answer this large when it is asked for
    // again (see `cached_vs_uncached`).
    let warm = bed.apiserver_streaming_http(None)?;
    for (label, url) in [
        ("(c) machine list ?cve=, JSON (aggregated)", &cve_list),
        (
            "(p) machine list ?package=, JSON (aggregated)",
            &package_list,
        ),
    ] {
        let response = warm
            .get(url.as_str())
            .bearer_auth(token)
            .header("Accept-Encoding", "gzip")
            .send()
            .await?;
        ensure!(response.status() == 200, "{label}: {}", response.status());
        response.bytes().await?;
        let misses = answer_cache_misses(bed).await?;
        let mut cells = sampled_lists(bed, token, &[(label, url, false)], rounds).await?;
        let rendered = answer_cache_misses(bed).await? - misses;
        for cell in &mut cells {
            cell.how = format!("{}; answer-cache misses meanwhile: {rendered}", cell.how);
        }
        results.cells.extend(cells);
    }
    let cells: [(&str, &str, bool); 3] = [
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
        let status = warm
            .get(url)
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
        report_cell(label, &measured);
        results.cells.push(FleetCell {
            label: label.to_owned(),
            measured,
            how: format!(
                "wrk, {CONNECTIONS} connections, {} s",
                settings.cell.as_secs()
            ),
        });
    }
    // An uncached `?cve=` list of 50,000 machines takes seconds: 3 samples.
    let samples = if settings.quick { SAMPLES } else { 3 };
    (results.uncached_ms, results.cached_ms) =
        cached_vs_uncached(bed, &direct_list, samples, |n| {
            format!("cve=CVE-2099-{n:05}")
        })
        .await?;
    // `bash` climbs 1.0.0, 1.1.0, … in the generated channels: below 1.100 is every machine
    // on a resolved version, each sample a new bound (a new answer).
    (results.package_uncached_ms, results.package_cached_ms) =
        cached_vs_uncached(bed, &direct_list, samples, |n| {
            format!("package=bash&packageBelow=1.{}", 100 + n)
        })
        .await?;
    results.follow = follow(bed, &models).await?;
    let changes = if settings.quick { 5 } else { 20 };
    (results.watch, results.watch_profile) =
        watch_latency(bed, token, &models[0], changes, pid).await?;
    results.watch_changes = changes;
    results
        .change_cpu
        .push(pressure::change_cpu(bed, token, &models[0], machines, cpu_changes, pid).await?);
    results
        .zero_window
        .push(pressure::zero_window(bed, machines, pid).await?);
    let loop_for = if settings.quick {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(60)
    };
    results.patch_loop = Some(pressure::patch_loop(bed, token, &models[0], loop_for, pid).await?);
    // Lists at 0, 5, … s: 12 in the minute (3 in 15 s quick).
    let poll_for = if settings.quick {
        Duration::from_secs(15)
    } else {
        Duration::from_secs(60)
    };
    results.poller = poller(bed, token, pid, &aggregated, poll_for).await?;
    let recording = super::Recording::start(pid)?;
    poller(
        bed,
        token,
        pid,
        &aggregated,
        POLL_PERIOD * PROFILED_LISTS as u32,
    )
    .await?;
    results.poller_profile = recording
        .map(super::Recording::finish)
        .transpose()?
        .flatten();
    results.rss_end = super::rss(pid)?;
    // Last: it adds channels (and their memory) to the server.
    results.package_memory = Some(pressure::package_memory(bed, registry, settings).await?);
    Ok(results)
}

/// [`PlainLists`] of `url` (the machine list, kept gzipped once asked for).
async fn plain_lists(bed: &TestBed, url: &str, pid: u32) -> Result<PlainLists> {
    // reqwest is built without its gzip feature: it sends no `Accept-Encoding`.
    let http = bed.server_streaming_http(Some(&bed.pki().admin))?;
    let before = super::rss(pid)?;
    let read = futures::future::try_join_all((0..PLAIN_CLIENTS).map(|_| async {
        let mut response = http.get(url).send().await?;
        ensure!(
            response.status() == 200 && response.headers().get("content-encoding").is_none(),
            "a plain list: {} {:?}",
            response.status(),
            response.headers()
        );
        let mut bytes = 0;
        while let Some(chunk) = response.chunk().await? {
            bytes += chunk.len();
        }
        Ok(bytes)
    }))
    .await?;
    let after = super::rss(pid)?;
    let bytes = read.iter().copied().max().unwrap_or(0);
    ensure!(
        read.iter().all(|n| *n == bytes),
        "the plain lists differ in length: {read:?}"
    );
    eprintln!("bench: {PLAIN_CLIENTS} plain lists of {bytes} bytes: {before:?} → {after:?}");
    Ok(PlainLists {
        bytes,
        rss: (before, after),
    })
}

/// The list of all machines at `direct_list` (as admin) once it holds `count`, every one
/// resolved (not `Unknown`).
async fn resolved(bed: &TestBed, direct_list: &str, count: usize) -> Result<bytes::Bytes> {
    let http = bed.server_streaming_http(Some(&bed.pki().admin))?;
    let said = std::cell::Cell::new(Instant::now());
    Ok(poll("the machines resolved", DEADLINE, POLL, async || {
        let asked = Instant::now();
        let body = http.get(direct_list).send().await?.bytes().await?;
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
        Ok((items == count && known == count).then_some(body))
    })
    .await?
    .0)
}

fn report_cell(label: &str, measured: &Measured) {
    eprintln!(
        "bench: fleet {label}: {:.1} req/s p50 {:.2} ms p99 {:.2} ms {:.0} B/resp errors {}",
        measured.requests_per_second,
        measured.p50_ms,
        measured.p99_ms,
        measured.bytes_per_response,
        measured.errors
    );
}

/// Each of `lists` (label, URL, as a Table) asked `rounds` times, one request at a time, the
/// lists taking turns in each round; a request's time is from sending it to its last byte.
async fn sampled_lists(
    bed: &TestBed,
    token: &str,
    lists: &[(&str, &str, bool)],
    rounds: usize,
) -> Result<Vec<FleetCell>> {
    let apiserver = bed.apiserver_streaming_http(None)?;
    let direct = bed.server_streaming_http(None)?;
    let mut samples: Vec<(Vec<f64>, f64, u64)> = vec![(Vec::new(), 0.0, 0); lists.len()];
    // A first round unmeasured: answers as they are served once asked for.
    for round in 0..=rounds {
        for ((_, url, table), sample) in lists.iter().zip(samples.iter_mut()) {
            let client = if url.starts_with(&bed.apiserver_url()) {
                &apiserver
            } else {
                &direct
            };
            let started = Instant::now();
            let response = client
                .get(*url)
                .bearer_auth(token)
                .header("Accept", if *table { TABLE } else { "application/json" })
                .header("Accept-Encoding", "gzip")
                .send()
                .await;
            let body = match response {
                Ok(r) if r.status() == 200 => r.bytes().await.ok(),
                _ => None,
            };
            let took = started.elapsed().as_secs_f64() * 1000.0;
            if round == 0 {
                continue;
            }
            match body {
                Some(body) => {
                    sample.0.push(took);
                    sample.1 += body.len() as f64;
                }
                None => sample.2 += 1,
            }
        }
    }
    let mut cells = Vec::new();
    for ((label, _, _), (mut times, bytes, errors)) in lists.iter().zip(samples) {
        times.sort_by(f64::total_cmp);
        ensure!(!times.is_empty(), "{label}: every request failed");
        let total: f64 = times.iter().sum();
        let measured = Measured {
            requests_per_second: times.len() as f64 * 1000.0 / total,
            p50_ms: percentile(&times, 0.50),
            p99_ms: percentile(&times, 0.99),
            bytes_per_response: bytes / times.len() as f64,
            errors,
        };
        report_cell(label, &measured);
        cells.push(FleetCell {
            label: (*label).to_owned(),
            measured,
            how: format!("{rounds} lists, one at a time"),
        });
    }
    Ok(cells)
}

/// Answers the server rendered because none was kept (`answer_cache_requests_total{result="miss"}`).
async fn answer_cache_misses(bed: &TestBed) -> Result<u64> {
    let text = bed.server_metrics().await?;
    let misses = crate::fixtures::metric(
        &text,
        "elemental_changelog_answer_cache_requests_total",
        &[("result", "miss")],
    );
    Ok(misses as u64)
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

/// Machines `m-NNNNN` of `range`, machine `i` on version `i / CHANNELS` (cycling) of channel
/// `i % CHANNELS`, as the operator registers them.
async fn create_machines(
    bed: &TestBed,
    models: &[Channel],
    range: std::ops::Range<usize>,
) -> Result<()> {
    let api = machine_api(bed);
    let started = Instant::now();
    let count = range.len();
    futures::stream::iter(range)
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
                    "annotations": {OS_IMAGE: os_image(&model.name, version)},
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

/// Bytes of a ConfigMap's JSON (as kube-apiserver lists it) besides its data value.
async fn configmap_overhead(bed: &TestBed) -> Result<usize> {
    let api: Api<ConfigMap> = Api::namespaced(bed.client(), NAMESPACE);
    let probe = ConfigMap {
        metadata: ObjectMeta {
            name: Some("cm-99999".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("machine.json".to_owned(), String::new())].into()),
        ..ConfigMap::default()
    };
    let created = api.create(&PostParams::default(), &probe).await?;
    api.delete("cm-99999", &kube::api::DeleteParams::default())
        .await?;
    Ok(serde_json::to_vec(&created)?.len())
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

/// The same list (`?cve=`, or `?package=`: `query(n)` for sample `n`) three times, directly as
/// admin: the first renders it (every machine's exposure or package computed); the cache's
/// admission (quick_cache keeps a new entry in a small "cold" part, and a full cache may drop
/// it at once; asked again, it is kept) may make the second render again; the third is the
/// kept answer. Milliseconds: first, and third.
async fn cached_vs_uncached(
    bed: &TestBed,
    list: &str,
    samples: usize,
    query: impl Fn(usize) -> String,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let http = bed.server_streaming_http(Some(&bed.pki().admin))?;
    let (mut uncached, mut cached) = (Vec::new(), Vec::new());
    for n in 0..samples {
        let url = format!("{list}?{}", query(n));
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
        eprintln!("bench: ?{} list: {times:.1?} ms", query(n));
        uncached.push(times[0]);
        cached.push(times[2]);
    }
    Ok((uncached, cached))
}

/// Re-registers machine [`CHANGED`] on another version `SAMPLES` times; each time, how long
/// until its answer (directly) shows the new version.
async fn follow(bed: &TestBed, models: &[Channel]) -> Result<Vec<Duration>> {
    let api = machine_api(bed);
    let server = bed.server().context("no server")?;
    let url = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories/{CHANGED}",
        server.url()
    );
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let model = &models[0];
    let mut took = Vec::new();
    for n in 1..=SAMPLES {
        let version = &model.versions[n * 7 % model.versions.len()];
        let patch = json!({"metadata": {"annotations": {
            OS_IMAGE: os_image(&model.name, &version.version)}}});
        let started = Instant::now();
        api.patch(CHANGED, &PatchParams::default(), &Patch::Merge(&patch))
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

/// [`WATCHERS`] watchers on each side (and as many straight to the server, as admin) from a
/// list's resourceVersion, then `changes` changes of
/// [`CHANGED`]'s OS annotation, alternating between an older version and the newest, so that
/// its state changes each time; each change timed from just before its PATCH is sent to its
/// event at every watcher. The first change is not counted (connections and paths warm up);
/// [`PROFILED_CHANGES`] more after the timed ones are recorded with perf (server `pid`).
async fn watch_latency(
    bed: &TestBed,
    token: &str,
    model: &Channel,
    changes: usize,
    pid: u32,
) -> Result<(Vec<WatchLatency>, Option<String>)> {
    let ours = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories",
        bed.apiserver_url()
    );
    let kube = format!(
        "{}/apis/elemental.cattle.io/v1beta1/namespaces/{NAMESPACE}/machineinventories",
        bed.apiserver_url()
    );
    let direct = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories",
        bed.server_url()?
    );
    let (tx, mut rx) = mpsc::unbounded_channel::<Seen>();
    let mut tasks = Vec::new();
    let mut ours_version = String::new();
    for (side, url) in [
        (Side::Ours, &ours),
        (Side::Kube, &kube),
        (Side::Direct, &direct),
    ] {
        // The direct watchers resume from the aggregated list's resourceVersion: the same
        // server's.
        let version = match side {
            Side::Direct => ours_version.clone(),
            _ => list_resource_version(bed, token, url).await?,
        };
        if side == Side::Ours {
            ours_version.clone_from(&version);
        }
        eprintln!("bench: {WATCHERS} watchers of {url} from resourceVersion {version}");
        let watch = format!("{url}?watch=true&resourceVersion={version}&timeoutSeconds=1800");
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<Result<()>>();
        for _ in 0..WATCHERS {
            let (client, token) = match side {
                Side::Direct => (bed.server_streaming_http(Some(&bed.pki().admin))?, None),
                _ => (bed.apiserver_streaming_http(None)?, Some(token.to_owned())),
            };
            let (watch, tx, ready) = (watch.clone(), tx.clone(), ready_tx.clone());
            tasks.push(tokio::spawn(async move {
                let ended = watcher(&client, &watch, token.as_deref(), side, &tx, &ready).await;
                let _ = ready.send(Err(anyhow::anyhow!("watch ended before it was open")));
                let _ = tx.send((
                    side,
                    Instant::now(),
                    Err(format!("{side:?} watch ended: {ended:?}")),
                ));
            }));
        }
        for _ in 0..WATCHERS {
            ready_rx.recv().await.context("no watcher")??;
        }
    }
    let api = machine_api(bed);
    let newest = model.versions.last().context("no version")?;
    let (mut ours_latency, mut kube_latency, mut direct_latency) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut recording = None;
    for n in 0..=changes + PROFILED_CHANGES {
        if n == changes + 1 {
            recording = super::Recording::start(pid)?;
        }
        let version = if n % 2 == 0 {
            &model.versions[(n * 7 + 3) % (model.versions.len() - 1)]
        } else {
            newest
        };
        let image = os_image(&model.name, &version.version);
        let patch = json!({"metadata": {"annotations": {OS_IMAGE: &image}}});
        let started = Instant::now();
        api.patch(CHANGED, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let (mut ours_seen, mut kube_seen, mut direct_seen) = (Vec::new(), Vec::new(), Vec::new());
        while ours_seen.len() < WATCHERS
            || kube_seen.len() < WATCHERS
            || direct_seen.len() < WATCHERS
        {
            let (side, at, what) = tokio::time::timeout(EVENT_DEADLINE, rx.recv())
                .await
                .with_context(|| {
                    format!(
                        "change {n}: after {EVENT_DEADLINE:?}, {} of our watchers, {} of \
                         kube-apiserver's and {} direct ones saw it",
                        ours_seen.len(),
                        kube_seen.len(),
                        direct_seen.len()
                    )
                })?
                .context("every watcher ended")?;
            let mark = what.map_err(anyhow::Error::msg)?;
            match side {
                Side::Ours if mark == version.name => ours_seen.push(at - started),
                Side::Kube if mark == image => kube_seen.push(at - started),
                Side::Direct if mark == version.name => direct_seen.push(at - started),
                _ => {}
            }
        }
        if (1..=changes).contains(&n) {
            ours_latency.extend(ours_seen);
            kube_latency.extend(kube_seen);
            direct_latency.extend(direct_seen);
        }
    }
    let profile = recording
        .map(super::Recording::finish)
        .transpose()?
        .flatten();
    for task in tasks {
        task.abort();
    }
    let latencies = vec![
        WatchLatency {
            label: "(b) machineinventories.changelog.elemental.cattle.io through the aggregator"
                .to_owned(),
            latencies: ours_latency,
        },
        WatchLatency {
            label: "(a) machineinventories.elemental.cattle.io (the CRD, kube-apiserver)"
                .to_owned(),
            latencies: kube_latency,
        },
        WatchLatency {
            label: "(d) machineinventories.changelog.elemental.cattle.io straight to the server \
                    (what the aggregator's proxy adds is (b) − (d))"
                .to_owned(),
            latencies: direct_latency,
        },
    ];
    Ok((latencies, profile))
}

/// A Rancher-style poller for `duration`: a LIST of all machines at `url` (JSON, gzip) every
/// [`POLL_PERIOD`] (at 0, 5, … s, before `duration`), as the reader; the server's CPU time
/// over the run and during the lists.
async fn poller(
    bed: &TestBed,
    token: &str,
    pid: u32,
    url: &str,
    duration: Duration,
) -> Result<Poller> {
    let ticks = ticks_per_second()?;
    let client = bed.apiserver_streaming_http(None)?;
    let mut result = Poller::default();
    let mut interval = tokio::time::interval(POLL_PERIOD);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let began = Instant::now();
    let cpu_began = cpu_time(pid, ticks)?;
    loop {
        interval.tick().await;
        if began.elapsed() >= duration {
            break;
        }
        let cpu = cpu_time(pid, ticks)?;
        let started = Instant::now();
        let response = client
            .get(url)
            .bearer_auth(token)
            .header("Accept-Encoding", "gzip")
            .send()
            .await?;
        ensure!(response.status() == 200, "{url}: {}", response.status());
        response.bytes().await?;
        result
            .list_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        result.cpu_in_lists += cpu_time(pid, ticks)?.saturating_sub(cpu);
        result.lists += 1;
    }
    result.took = began.elapsed();
    result.cpu_total = cpu_time(pid, ticks)?.saturating_sub(cpu_began);
    eprintln!(
        "bench: poller: {} lists in {:?}, server CPU {:?} ({:?} during the lists)",
        result.lists, result.took, result.cpu_total, result.cpu_in_lists
    );
    Ok(result)
}
