//! The fleet under pressure, measured in the fleet phase of `make bench` (issue 35; issue 34's
//! package memory):
//! - the server's CPU per single-machine change, with a fifth of the fleet and with all of it;
//! - [`ZERO_WINDOW_WATCHES`] HTTP/2 watches of every machine from `resourceVersion=0` whose
//!   client never opens its flow-control window: the server's RSS while they are held, and how
//!   each ended (reset by the server at its `timeoutSeconds` plus the grace);
//! - a PATCH loop on one machine while other clients GET other machines: their latency next
//!   to the same GETs with no loop;
//! - the package lists of four channels of 500 versions × 800 packages, then the package index
//!   built over them by the first `?package=` list: the server's RSS at each step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use elemental_changelog_apiserver::deadline::GRACE;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::machines::{
    CHANGED, EVENT_DEADLINE, NAMESPACE, OS_IMAGE, Side, cpu_time, list_resource_version,
    machine_api, os_image, ticks_per_second, watcher,
};
use super::{Rss, Settings, rss, settled_rss};
use crate::generated::{Channel, Spec};
use crate::paths::GROUP_VERSION;
use crate::registry::Registry;
use crate::stalled::{Dialer, zero_window_watches};
use crate::testbed::TestBed;
use crate::wait::{POLL, poll};

/// The server's CPU over a number of single-machine changes, each awaited (its event through
/// the aggregator) before the next.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChangeCpu {
    /// Machines served when measured.
    pub machines: usize,
    /// Changes made.
    pub changes: usize,
    /// The server's CPU time (user and system) from the first PATCH to the last event.
    pub cpu: Duration,
    /// Wall time over the same.
    pub took: Duration,
}

impl ChangeCpu {
    /// CPU per change.
    pub fn per_change(&self) -> Duration {
        self.cpu / u32::try_from(self.changes.max(1)).unwrap_or(u32::MAX)
    }
}

/// `changes` changes of [`CHANGED`]'s OS annotation (between an older version and the newest,
/// so that its answer changes each time), each awaited at a watcher through the aggregator
/// (as `token`), the only watch open; the server's (`pid`) CPU over them.
pub async fn change_cpu(
    bed: &TestBed,
    token: &str,
    model: &Channel,
    machines: usize,
    changes: usize,
    pid: u32,
) -> Result<ChangeCpu> {
    let url = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories",
        bed.apiserver_url()
    );
    // The same work at both sizes: every change is sent to this one watch only, so the
    // watches of earlier steps (through the aggregator, whose proxy lets go of them a little
    // after their clients) must have ended first.
    poll(
        "no watch left open",
        Duration::from_secs(60),
        POLL,
        async || {
            let text = bed.server_metrics().await?;
            let open = crate::fixtures::metric(&text, "elemental_changelog_watches_open", &[]);
            Ok((open < 0.5).then_some(()))
        },
    )
    .await?;
    let version = list_resource_version(bed, token, &url).await?;
    let watch = format!("{url}?watch=true&resourceVersion={version}&timeoutSeconds=1800");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let client = bed.apiserver_streaming_http(None)?;
    let token_owned = token.to_owned();
    let task = tokio::spawn(async move {
        let ended = watcher(
            &client,
            &watch,
            Some(&token_owned),
            Side::Ours,
            &tx,
            &ready_tx,
        )
        .await;
        let _ = ready_tx.send(Err(anyhow::anyhow!("the watch ended before it was open")));
        let _ = tx.send((Side::Ours, Instant::now(), Err(format!("{ended:?}"))));
    });
    ready_rx.recv().await.context("no watcher")??;
    let api = machine_api(bed);
    let newest = model.versions.last().context("no version")?;
    let ticks = ticks_per_second()?;
    let cpu_began = cpu_time(pid, ticks)?;
    let began = Instant::now();
    for n in 0..changes {
        let version = if n % 2 == 0 {
            &model.versions[(n * 7 + 3) % (model.versions.len() - 1)]
        } else {
            newest
        };
        let patch = json!({"metadata": {"annotations": {
            OS_IMAGE: os_image(&model.name, &version.version)}}});
        api.patch(CHANGED, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        loop {
            let (_, _, mark) = tokio::time::timeout(EVENT_DEADLINE, rx.recv())
                .await
                .with_context(|| format!("change {n}: no event after {EVENT_DEADLINE:?}"))?
                .context("the watch ended")?;
            if mark.map_err(anyhow::Error::msg)? == version.name {
                break;
            }
        }
    }
    let measured = ChangeCpu {
        machines,
        changes,
        cpu: cpu_time(pid, ticks)?.saturating_sub(cpu_began),
        took: began.elapsed(),
    };
    task.abort();
    eprintln!(
        "bench: {changes} single-machine changes with {machines} machines: server CPU {:?} ({:?} per change) in {:?}",
        measured.cpu,
        measured.per_change(),
        measured.took
    );
    Ok(measured)
}

/// Watches of [`zero_window`], and the HTTP/2 connections they share.
pub const ZERO_WINDOW_WATCHES: usize = 100;
const ZERO_WINDOW_CONNECTIONS: usize = 4;
/// `timeoutSeconds` of those watches.
pub const ZERO_WINDOW_TIMEOUT: Duration = Duration::from_secs(5);
/// How late after its deadline plus the server's grace a reset may come and still count.
const RESET_MARGIN: Duration = Duration::from_secs(2);

/// [`ZERO_WINDOW_WATCHES`] watches of every machine from `resourceVersion=0`, as admin,
/// straight to the server, whose client never opens its window.
#[derive(Clone, Debug, Default)]
pub struct ZeroWindow {
    /// Machines served.
    pub machines: usize,
    /// The server's memory before the watches.
    pub before: Rss,
    /// The highest `VmRSS` sampled (every 50 ms) while they were held.
    pub held_kib: u64,
    /// The server's memory once every watch ended.
    pub after: Rss,
    /// How they ended.
    pub summary: String,
    /// Whether every one was reset between its `timeoutSeconds` and that plus the server's
    /// grace and a margin ([`ZeroWindow::bound`]).
    pub ended_by_deadline: bool,
}

impl ZeroWindow {
    /// RSS growth while the watches were held, KiB.
    pub fn growth_kib(&self) -> u64 {
        self.held_kib.saturating_sub(self.before.rss_kib)
    }

    /// The latest a watch may end and count as ended by its deadline.
    pub fn bound() -> Duration {
        ZERO_WINDOW_TIMEOUT + GRACE + RESET_MARGIN
    }
}

/// Measures [`ZeroWindow`] on the server `pid`.
pub async fn zero_window(bed: &TestBed, machines: usize, pid: u32) -> Result<ZeroWindow> {
    let path = format!(
        "{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories?watch=true&resourceVersion=0&timeoutSeconds={}",
        ZERO_WINDOW_TIMEOUT.as_secs()
    );
    let before = settled_rss(bed).await?;
    let dialer = Dialer::new(bed, Some(&bed.pki().admin))?;
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let sampler = tokio::spawn(async move {
        let mut held = 0;
        loop {
            held = held.max(rss(pid).map(|r| r.rss_kib).unwrap_or(0));
            tokio::select! {
                _ = &mut stop_rx => return held,
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    let watches = zero_window_watches(
        &dialer,
        &path,
        ZERO_WINDOW_WATCHES,
        ZERO_WINDOW_CONNECTIONS,
        ZeroWindow::bound(),
    )
    .await?;
    let ends = watches.ends().await?;
    let _ = stop_tx.send(());
    let held_kib = sampler.await?;
    let measured = ZeroWindow {
        machines,
        before,
        held_kib,
        after: settled_rss(bed).await?,
        summary: ends.summary(),
        ended_by_deadline: ends
            .all_reset_between(ZERO_WINDOW_TIMEOUT, ZeroWindow::bound())
            .is_ok(),
    };
    eprintln!(
        "bench: {ZERO_WINDOW_WATCHES} zero-window watches of {machines} machines from resourceVersion=0: {}; RSS {} KiB before, {} KiB at most while held, {} KiB after",
        measured.summary, measured.before.rss_kib, measured.held_kib, measured.after.rss_kib
    );
    Ok(measured)
}

/// PATCHes a second of [`patch_loop`].
pub const PATCHES_PER_SECOND: u32 = 100;
/// GETs a second of each series of [`patch_loop`].
const GETS_PER_SECOND: u32 = 20;
/// Other machines the GETs take turns on.
const GET_MACHINES: usize = 100;

/// One series of GETs: their times, milliseconds, and failures.
#[derive(Clone, Debug, Default)]
pub struct Gets {
    /// Who asked and how.
    pub label: String,
    /// Each answered GET, from sending it to its last byte.
    pub ms: Vec<f64>,
    /// GETs not answered 200.
    pub errors: usize,
}

/// A PATCH loop on [`CHANGED`] at [`PATCHES_PER_SECOND`], with GETs of other machines by
/// other clients, next to the same GETs with no loop.
#[derive(Clone, Debug, Default)]
pub struct PatchLoop {
    /// How long each half ran.
    pub duration: Duration,
    /// PATCHes answered by kube-apiserver, and refused or failed.
    pub patches: (usize, usize),
    /// The GETs with no loop: straight to the server, through the aggregator, and of
    /// ConfigMaps from kube-apiserver.
    pub idle: Vec<Gets>,
    /// The same GETs during the loop.
    pub loaded: Vec<Gets>,
    /// The server's CPU over the idle half and over the loop.
    pub cpu: (Duration, Duration),
}

/// Measures [`PatchLoop`] for `duration` a half.
pub async fn patch_loop(
    bed: &TestBed,
    token: &str,
    model: &Channel,
    duration: Duration,
    pid: u32,
) -> Result<PatchLoop> {
    let ticks = ticks_per_second()?;
    let mut measured = PatchLoop {
        duration,
        ..PatchLoop::default()
    };
    let cpu = cpu_time(pid, ticks)?;
    measured.idle = gets(bed, token, duration).await?;
    measured.cpu.0 = cpu_time(pid, ticks)?.saturating_sub(cpu);
    let api = machine_api(bed);
    let newest = model.versions.last().context("no version")?;
    let images = [
        os_image(&model.name, &model.versions[1].version),
        os_image(&model.name, &newest.version),
    ];
    let cpu = cpu_time(pid, ticks)?;
    let patches = async {
        let in_flight = Arc::new(Semaphore::new(32));
        let mut tasks = JoinSet::new();
        let mut interval = tokio::time::interval(Duration::from_secs(1) / PATCHES_PER_SECOND);
        let began = tokio::time::Instant::now();
        let mut n = 0_usize;
        while began.elapsed() < duration {
            interval.tick().await;
            let permit = in_flight.clone().acquire_owned().await?;
            let patch = json!({"metadata": {"annotations": {OS_IMAGE: &images[n % 2]}}});
            let api = api.clone();
            tasks.spawn(async move {
                let done = api
                    .patch(CHANGED, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok();
                drop(permit);
                done
            });
            n += 1;
        }
        let mut counted = (0, 0);
        while let Some(done) = tasks.join_next().await {
            if done? {
                counted.0 += 1;
            } else {
                counted.1 += 1;
            }
        }
        Ok::<_, anyhow::Error>(counted)
    };
    let (loaded, patched) = tokio::join!(gets(bed, token, duration), patches);
    measured.loaded = loaded?;
    measured.patches = patched?;
    measured.cpu.1 = cpu_time(pid, ticks)?.saturating_sub(cpu);
    eprintln!(
        "bench: PATCH loop: {:?} patches (done, failed) in {duration:?}; server CPU {:?} idle, {:?} with the loop",
        measured.patches, measured.cpu.0, measured.cpu.1
    );
    for (idle, loaded) in measured.idle.iter().zip(&measured.loaded) {
        eprintln!(
            "bench: GETs {}: p99 {:.1} ms idle, {:.1} ms with the loop",
            idle.label,
            p99(&idle.ms),
            p99(&loaded.ms)
        );
    }
    Ok(measured)
}

/// The 99th percentile of `ms` (0 when empty).
pub fn p99(ms: &[f64]) -> f64 {
    let mut sorted = ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        0.0
    } else {
        super::load::percentile(&sorted, 0.99)
    }
}

/// GETs of machines `m-00001`… (not [`CHANGED`]) at [`GETS_PER_SECOND`] for `duration`, each
/// sent on its schedule whatever the answers before it take: as admin straight to the server,
/// and as the reader (`token`) through the aggregator; and of ConfigMaps `cm-00001`… from
/// kube-apiserver as the reader; all at once.
async fn gets(bed: &TestBed, token: &str, duration: Duration) -> Result<Vec<Gets>> {
    let path = format!("{GROUP_VERSION}/namespaces/{NAMESPACE}/machineinventories");
    let direct = (
        "one other machine, JSON, straight to the server (admin)",
        bed.server_http(Some(&bed.pki().admin))?,
        format!("{}{path}/m-", bed.server_url()?),
        None,
    );
    let aggregated = (
        "one other machine, JSON, through the aggregator (reader)",
        bed.apiserver_http(None)?,
        format!("{}{path}/m-", bed.apiserver_url()),
        Some(token.to_owned()),
    );
    // The baseline: kube-apiserver's own GETs, which share the machine (two cores) with the
    // loop's PATCHes as ours do.
    let kube = (
        "one ConfigMap, JSON, kube-apiserver (reader)",
        bed.apiserver_http(None)?,
        format!(
            "{}/api/v1/namespaces/{NAMESPACE}/configmaps/cm-",
            bed.apiserver_url()
        ),
        Some(token.to_owned()),
    );
    let series = [direct, aggregated, kube].map(|(label, client, base, token)| async move {
        let mut tasks = JoinSet::new();
        let mut interval = tokio::time::interval(Duration::from_secs(1) / GETS_PER_SECOND);
        let began = tokio::time::Instant::now();
        let mut n = 0;
        while began.elapsed() < duration {
            interval.tick().await;
            n += 1;
            let mut request = client
                .get(format!("{base}{:05}", 1 + n % GET_MACHINES))
                .header("Accept", "application/json");
            if let Some(token) = &token {
                request = request.bearer_auth(token);
            }
            tasks.spawn(async move {
                let started = Instant::now();
                match request.send().await {
                    Ok(r) if r.status() == 200 => r
                        .bytes()
                        .await
                        .ok()
                        .map(|_| started.elapsed().as_secs_f64() * 1000.0),
                    _ => None,
                }
            });
        }
        let mut measured = Gets {
            label: label.to_owned(),
            ..Gets::default()
        };
        while let Some(took) = tasks.join_next().await {
            match took? {
                Some(ms) => measured.ms.push(ms),
                None => measured.errors += 1,
            }
        }
        Ok::<_, anyhow::Error>(measured)
    });
    futures::future::try_join_all(series).await
}

/// Channels, versions and packages of [`package_memory`] (quick: 100 versions).
pub const PACKAGE_CHANNELS: usize = 4;
/// Packages of each version of [`package_memory`]'s channels.
pub const PACKAGE_PACKAGES: usize = 800;

/// The server's memory with [`PACKAGE_CHANNELS`] channels of [`PACKAGE_PACKAGES`] packages
/// a version more, then with their package index built.
#[derive(Clone, Debug, Default)]
pub struct PackageMemory {
    /// Versions of each channel.
    pub versions: usize,
    /// Raw bytes of the channels' files.
    pub raw_bytes: u64,
    /// Before the channels, once served, and once their index was built.
    pub rss: (Rss, Rss, Rss),
    /// The first `?package=` list of every version of the namespace (the index built), and
    /// the same list kept, milliseconds.
    pub first_ms: f64,
    /// See `first_ms`.
    pub kept_ms: Vec<f64>,
}

/// Publishes [`PACKAGE_CHANNELS`] channels of [`PACKAGE_PACKAGES`] packages a version in
/// [`NAMESPACE`], then lists every version there with `?package=bash` straight to the server.
pub async fn package_memory(
    bed: &TestBed,
    registry: &Registry,
    settings: &Settings,
) -> Result<PackageMemory> {
    let versions = if settings.quick { 100 } else { 500 };
    let mut measured = PackageMemory {
        versions,
        rss: (settled_rss(bed).await?, Rss::default(), Rss::default()),
        ..PackageMemory::default()
    };
    for c in 0..PACKAGE_CHANNELS {
        let model = Channel::generate(&Spec::new(
            &format!("packages{c}"),
            versions,
            PACKAGE_PACKAGES,
            200 + c as u64,
        ));
        let (raw, took) = super::publish(
            bed,
            registry,
            NAMESPACE,
            &model,
            &format!("bench/packages{c}:1"),
        )
        .await?;
        eprintln!("bench: package channel {c} ({raw} raw bytes) served after {took:?}");
        measured.raw_bytes += raw;
    }
    measured.rss.1 = settled_rss(bed).await?;
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let url = format!(
        "{}{GROUP_VERSION}/namespaces/{NAMESPACE}/managedosversions?package=bash",
        bed.server_url()?
    );
    for n in 0..=10 {
        let started = Instant::now();
        let response = http
            .get(&url)
            .header("Accept-Encoding", "gzip")
            .send()
            .await?;
        anyhow::ensure!(response.status() == 200, "{url}: {}", response.status());
        response.bytes().await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if n == 0 {
            measured.first_ms = ms;
        } else {
            measured.kept_ms.push(ms);
        }
    }
    measured.rss.2 = settled_rss(bed).await?;
    eprintln!(
        "bench: package lists of {PACKAGE_CHANNELS} × {versions} × {PACKAGE_PACKAGES}: RSS {:?} → {:?} served → {:?} indexed; first ?package= list {:.1} ms",
        measured.rss.0, measured.rss.1, measured.rss.2, measured.first_ms
    );
    Ok(measured)
}
