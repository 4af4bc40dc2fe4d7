//! `make bench`: one run, on the real test bed, that puts the cost of an
//! answer of this server next to the cost of the same bytes from
//! kube-apiserver and from nginx, and measures memory, re-sync latency and
//! the compute code's criterion benchmarks. [`run`] measures, [`report`]
//! writes `docs/performance.md`.
//!
//! Side by side, for a small, a typical and a large changelog, over HTTP/1.1
//! (`wrk`) and HTTP/2 (`h2load`), with and without `Accept-Encoding: gzip`,
//! every client with the same bearer token of a user bound to a reader role:
//! - (a) kube-apiserver: GET of a ConfigMap whose data is the same JSON;
//! - (b) the same changelog through kube-apiserver's aggregator to our server;
//! - (d) our server directly (TLS, token review and authorization on, caches warm);
//! - (n) nginx serving the same bytes as a static file over TLS.
//!
//! The benchmark only talks to whatever server binary it is given
//! (`ELEMENTAL_CHANGELOG_BIN`) through its public API, so it measures any
//! version of the request path.

pub mod fleet;
pub mod load;
pub mod machines;
pub mod nginx;
pub mod pressure;
pub mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::Value;

use self::load::{Load, Measured, Protocol};
use self::nginx::Nginx;
use crate::fixtures::OperatorChannel;
use crate::generated::{Channel, Spec};
use crate::image::{self, Compression};
use crate::paths::{changelog_path, channel_summaries_path};
use crate::registry::Registry;
use crate::testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, workspace_root};
use crate::wait::{POLL, poll};

/// The API group-version's path.
/// The static-token user every load client is.
const USER: &str = "alice";
/// Namespace of the memory channels.
const MEMORY_NAMESPACE: &str = "bench-memory";
/// Versions and packages of the channel the answers come from.
const ANSWER_CHANNEL: (usize, usize) = (60, 800);
/// Bound on a channel image being fetched, parsed and served.
const SERVED_DEADLINE: Duration = Duration::from_secs(600);

/// What to run, from the environment.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `BENCH_QUICK=1`: short cells, few memory channels, criterion's quick mode.
    pub quick: bool,
    /// Length of one load cell (`BENCH_SECONDS`; 8 s, quick 2 s).
    pub cell: Duration,
    /// Load-generator threads (2, as the issue's measurements).
    pub threads: usize,
    /// Open connections (50).
    pub connections: usize,
    /// Channel counts at which memory is measured (`BENCH_MEMORY_CHANNELS`; 1,10,50, quick 1,2).
    pub memory_stages: Vec<usize>,
    /// Versions and packages of each memory channel (500 × 800).
    pub memory_shape: (usize, usize),
    /// Re-syncs timed (20, quick 5).
    pub resync_samples: usize,
    /// Where the report goes (`BENCH_OUTPUT`; `docs/performance.md`, quick `target/bench/performance.md`).
    pub output: PathBuf,
    /// What to run (`BENCH_PHASES`, comma-separated; all by default).
    pub phases: Vec<Phase>,
    /// Machines of the fleet phase (`BENCH_MACHINES`; 50,000, quick 2,000): a smaller fleet
    /// while working on it, the per-machine figures are comparable.
    pub machines: Option<usize>,
}

/// A part of the run, to run alone while working on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// `load`: the side-by-side table and the profile.
    Load,
    /// `resync`: re-sync → served latency.
    Resync,
    /// `memory`: RSS with many-version channels.
    Memory,
    /// `criterion`: the compute benchmarks.
    Criterion,
    /// `fleet`: thousands of machines (the fleet view) next to a ConfigMap list.
    Fleet,
}

impl Phase {
    /// Every phase, in the order they run.
    pub const ALL: [Phase; 5] = [
        Phase::Load,
        Phase::Resync,
        Phase::Memory,
        Phase::Fleet,
        Phase::Criterion,
    ];

    /// Its name in `BENCH_PHASES`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Resync => "resync",
            Phase::Memory => "memory",
            Phase::Criterion => "criterion",
            Phase::Fleet => "fleet",
        }
    }

    fn parse(name: &str) -> Result<Self> {
        Ok(match name.trim() {
            "load" => Phase::Load,
            "resync" => Phase::Resync,
            "memory" => Phase::Memory,
            "criterion" => Phase::Criterion,
            "fleet" => Phase::Fleet,
            other => {
                bail!(
                    "BENCH_PHASES: unknown phase {other:?} (load, resync, memory, fleet, criterion)"
                )
            }
        })
    }
}

impl Settings {
    /// Reads `BENCH_QUICK`, `BENCH_SECONDS`, `BENCH_MEMORY_CHANNELS`, `BENCH_MACHINES`,
    /// `BENCH_PHASES` and `BENCH_OUTPUT`.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let quick = var("BENCH_QUICK").is_some_and(|v| v != "0");
        let cell = match var("BENCH_SECONDS") {
            Some(v) => Duration::from_secs(v.trim().parse().context("BENCH_SECONDS")?),
            None => Duration::from_secs(if quick { 2 } else { 8 }),
        };
        let memory_stages = match var("BENCH_MEMORY_CHANNELS") {
            Some(v) => v
                .split(',')
                .map(|n| n.trim().parse().context("BENCH_MEMORY_CHANNELS"))
                .collect::<Result<Vec<usize>>>()?,
            None if quick => vec![1, 2],
            None => vec![1, 10, 50],
        };
        ensure!(
            memory_stages.windows(2).all(|w| w[0] < w[1]),
            "BENCH_MEMORY_CHANNELS must grow"
        );
        let output = match var("BENCH_OUTPUT") {
            Some(v) => PathBuf::from(v),
            None if quick => target_dir().join("bench/performance.md"),
            None => workspace_root().join("docs/performance.md"),
        };
        let phases = match var("BENCH_PHASES") {
            Some(v) => v.split(',').map(Phase::parse).collect::<Result<Vec<_>>>()?,
            None => Phase::ALL.to_vec(),
        };
        let machines = var("BENCH_MACHINES")
            .map(|v| v.trim().parse().context("BENCH_MACHINES"))
            .transpose()?;
        Ok(Self {
            phases,
            machines,
            quick,
            cell,
            threads: 2,
            connections: 50,
            memory_stages,
            memory_shape: (500, 800),
            resync_samples: if quick { 5 } else { 20 },
            output,
        })
    }
}

/// Cargo's target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The answer sizes compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Size {
    /// About 2 KB: one version's changelog.
    Small,
    /// About 20 KB.
    Typical,
    /// 200 KB or more: a long `?from=` range.
    Large,
}

impl Size {
    /// All, smallest first.
    pub const ALL: [Size; 3] = [Size::Small, Size::Typical, Size::Large];

    /// The size aimed at, in bytes.
    pub fn target(self) -> usize {
        match self {
            Size::Small => 2 * 1024,
            Size::Typical => 20 * 1024,
            Size::Large => 200 * 1024,
        }
    }

    /// As the report writes it.
    pub fn label(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Typical => "typical",
            Size::Large => "large",
        }
    }
}

/// Who answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// (a) kube-apiserver, a ConfigMap with the same JSON.
    ConfigMap,
    /// (b) through kube-apiserver's aggregator to our server.
    Aggregated,
    /// (d) our server directly.
    Direct,
    /// (n) nginx, static file.
    Nginx,
}

impl Target {
    /// All, in the report's column order.
    pub const ALL: [Target; 4] = [
        Target::ConfigMap,
        Target::Aggregated,
        Target::Direct,
        Target::Nginx,
    ];

    /// The letter of the issue.
    pub fn letter(self) -> char {
        match self {
            Target::ConfigMap => 'a',
            Target::Aggregated => 'b',
            Target::Direct => 'd',
            Target::Nginx => 'n',
        }
    }

    /// As the report writes it.
    pub fn label(self) -> &'static str {
        match self {
            Target::ConfigMap => "kube-apiserver ConfigMap",
            Target::Aggregated => "aggregator → our server",
            Target::Direct => "our server direct",
            Target::Nginx => "nginx static file",
        }
    }
}

/// The changelog chosen for a size.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Which size it stands for.
    pub size: Size,
    /// The version.
    pub name: String,
    /// `?from=`, when not the default.
    pub from: Option<String>,
    /// The JSON as our server sends it (uncompressed).
    pub body: Vec<u8>,
}

impl Answer {
    /// The path of the changelog.
    pub fn path(&self) -> String {
        let base = changelog_path(FLEET_NAMESPACE, &self.name);
        match &self.from {
            Some(from) => format!("{base}?from={from}"),
            None => base,
        }
    }
}

/// One measured cell of the table.
#[derive(Clone, Debug)]
pub struct Cell {
    /// Answer size.
    pub size: Size,
    /// Protocol.
    pub protocol: Protocol,
    /// Whether the client accepted gzip.
    pub gzip: bool,
    /// Who answered.
    pub target: Target,
    /// What was measured.
    pub measured: Measured,
}

/// The RSS of a process, KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rss {
    /// Resident now (`VmRSS`).
    pub rss_kib: u64,
    /// Highest so far (`VmHWM`).
    pub peak_kib: u64,
}

/// RSS with a number of channels loaded.
#[derive(Clone, Debug)]
pub struct MemoryStage {
    /// Channels served.
    pub channels: usize,
    /// Raw bytes of their files (package lists, `updateinfo.xml`, `channel.json`).
    pub raw_bytes: u64,
    /// The server's RSS, settled.
    pub rss: Rss,
    /// Bytes of ready answers the server keeps (`elemental_changelog_answer_cache_bytes`),
    /// part of the RSS.
    pub answer_cache_bytes: u64,
    /// How long the last channel took from being created to being served.
    pub last_served_after: Duration,
}

/// Everything one run measured.
#[derive(Clone, Debug)]
pub struct Results {
    /// Settings used.
    pub settings: Settings,
    /// Machine and tool facts, in order.
    pub machine: Vec<(String, String)>,
    /// `/proc/loadavg` before and after.
    pub load_average: (String, String),
    /// The chosen answers.
    pub answers: Vec<Answer>,
    /// Throughput and latency.
    pub cells: Vec<Cell>,
    /// RSS with no channel, right after start (first server).
    pub idle: Rss,
    /// RSS serving the answer and re-sync channels with warm caches after the load.
    pub serving: Option<Rss>,
    /// RSS with no channel of the server the memory channels are added to.
    pub memory_idle: Option<Rss>,
    /// RSS per channel count.
    pub memory: Vec<MemoryStage>,
    /// Re-sync → served latencies.
    pub resync: Vec<Duration>,
    /// A CPU profile of our server under the small HTTP/1.1 load (per-request costs show most): `perf report` lines.
    pub profile: Option<String>,
    /// Criterion results: (benchmark, median ns, mean ns).
    pub criterion: Vec<(String, f64, f64)>,
    /// The fleet view with thousands of machines.
    pub fleet: Option<fleet::FleetResults>,
    /// How long the run took.
    pub took: Duration,
}

/// Runs everything and returns the results (see [`report::render`]).
pub async fn run(settings: Settings) -> Result<Results> {
    let started = Instant::now();
    load::ensure_packages()?;
    let load_before = load_average();
    let machine = machine_facts()?;

    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![
            FLEET_NAMESPACE.to_owned(),
            MEMORY_NAMESPACE.to_owned(),
            machines::NAMESPACE.to_owned(),
        ],
        ..TestBedOptions::default()
    })
    .await?;
    let result = on_bed(&mut bed, &registry, &settings).await;
    let mut results = bed.finish(result)?;
    if settings.phases.contains(&Phase::Criterion) {
        results.criterion = criterion(&settings)?;
    }
    results.machine = machine;
    results.load_average = (load_before, load_average());
    results.took = started.elapsed();
    Ok(results)
}

async fn on_bed(bed: &mut TestBed, registry: &Registry, settings: &Settings) -> Result<Results> {
    bind_reader(bed).await?;
    let mut flags = registry.server_flags()?;
    // The memory channels (500 versions × 800 packages, each version's package list
    // generated from its own seed) keep more than the default --max-kept-size (24MiB);
    // the budget holds four times the kept bytes. Up to 50 of them are kept at once
    // (about 90 MiB of parsed data each): far past the default --max-kept-total.
    flags.extend(
        [
            "--architecture",
            "x86_64",
            "--max-kept-size",
            "128MiB",
            "--memory-budget",
            "1GiB",
            "--max-kept-total",
            "16GiB",
        ]
        .map(str::to_owned),
    );
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    bed.start_server(&flags).await?;
    let mut results = Results {
        settings: settings.clone(),
        machine: Vec::new(),
        load_average: Default::default(),
        answers: Vec::new(),
        cells: Vec::new(),
        idle: settled_rss(bed).await?,
        serving: None,
        memory_idle: None,
        memory: Vec::new(),
        resync: Vec::new(),
        profile: None,
        criterion: Vec::new(),
        fleet: None,
        took: Duration::ZERO,
    };
    eprintln!("bench: idle RSS {} KiB", results.idle.rss_kib);
    if settings.phases.contains(&Phase::Load) {
        load_phase(bed, registry, settings, &mut results).await?;
    }
    if settings.phases.contains(&Phase::Resync) {
        results.resync = resync_latency(bed, registry, settings.resync_samples).await?;
    }
    if results.answers.is_empty() && results.resync.is_empty() {
        // Nothing was loaded: the first server is the memory server.
        results.memory_idle = Some(results.idle);
    } else {
        results.serving = Some(settled_rss(bed).await?);
    }
    if settings.phases.contains(&Phase::Memory) {
        if results.memory_idle.is_none() {
            // A fresh server with no channel.
            bed.stop_server().await?;
            for kind in [
                "managedosversions.elemental.cattle.io",
                "managedosversionchannels.elemental.cattle.io",
            ] {
                bed.kubectl_ok(&["delete", kind, "--all", "-n", FLEET_NAMESPACE])
                    .await?;
            }
            bed.start_server(&flags).await?;
            results.memory_idle = Some(settled_rss(bed).await?);
        }
        results.memory = memory_stages(bed, registry, settings).await?;
    }
    if settings.phases.contains(&Phase::Fleet) {
        let token = bed.token(USER)?.to_owned();
        results.fleet = Some(fleet::run(bed, registry, settings, &token).await?);
    }
    Ok(results)
}

/// The side-by-side table: answers chosen, ConfigMaps and nginx set up,
/// every cell measured, and a profile of the small answer.
async fn load_phase(
    bed: &TestBed,
    registry: &Registry,
    settings: &Settings,
    results: &mut Results,
) -> Result<()> {
    let model = Channel::generate(&Spec::new("bench", ANSWER_CHANNEL.0, ANSWER_CHANNEL.1, 7));
    publish(bed, registry, FLEET_NAMESPACE, &model, "bench/answers:1").await?;
    let answers = choose_answers(bed, &model).await?;
    for a in &answers {
        eprintln!(
            "bench: {} answer: {} from {:?}, {} bytes",
            a.size.label(),
            a.name,
            a.from,
            a.body.len()
        );
    }
    let configmaps = store_configmaps(bed, &answers).await?;
    let nginx_dir = tempfile::tempdir()?;
    let nginx_cert = bed
        .pki()
        .server_ca
        .issue_server("nginx", &["localhost", "127.0.0.1"])?;
    let files: Vec<(String, Vec<u8>)> = answers
        .iter()
        .map(|a| (format!("{}.json", a.size.label()), a.body.clone()))
        .collect();
    let nginx = Nginx::start(nginx_dir.path(), &nginx_cert, &files)?;

    let token = bed.token(USER)?.to_owned();
    let server = bed.server().context("no server")?;
    let server_pid = server
        .process()
        .pid()
        .context("the server is not running")?;
    let urls = |a: &Answer| -> BTreeMap<Target, String> {
        BTreeMap::from([
            (
                Target::ConfigMap,
                format!(
                    "{}/api/v1/namespaces/{FLEET_NAMESPACE}/configmaps/{}",
                    bed.apiserver_url(),
                    configmaps[&a.size]
                ),
            ),
            (
                Target::Aggregated,
                format!("{}{}", bed.apiserver_url(), a.path()),
            ),
            (Target::Direct, format!("{}{}", server.url(), a.path())),
            (
                Target::Nginx,
                nginx.url(&format!("{}.json", a.size.label())),
            ),
        ])
    };
    for a in &answers {
        for (target, url) in urls(a) {
            check_url(&url, &token, target, a).await?;
        }
    }

    let log = tempfile::NamedTempFile::new()?;
    for a in &answers {
        let urls = urls(a);
        for protocol in [Protocol::Http1, Protocol::Http2] {
            for gzip in [false, true] {
                let mut headers = vec![
                    format!("Authorization: Bearer {token}"),
                    "Accept: application/json".to_owned(),
                ];
                if gzip {
                    headers.push("Accept-Encoding: gzip".to_owned());
                }
                for target in Target::ALL {
                    let load = Load {
                        url: &urls[&target],
                        headers: &headers,
                        threads: settings.threads,
                        connections: settings.connections,
                        duration: settings.cell,
                    };
                    let measured = match protocol {
                        Protocol::Http1 => load::wrk(&load)?,
                        Protocol::Http2 => load::h2load(&load, log.path())?,
                    };
                    eprintln!(
                        "bench: {} {} gzip={gzip} ({}) {:.0} req/s p50 {:.2} ms p99 {:.2} ms {:.0} B/resp errors {}",
                        a.size.label(),
                        protocol.label(),
                        target.letter(),
                        measured.requests_per_second,
                        measured.p50_ms,
                        measured.p99_ms,
                        measured.bytes_per_response,
                        measured.errors
                    );
                    results.cells.push(Cell {
                        size: a.size,
                        protocol,
                        gzip,
                        target,
                        measured,
                    });
                }
            }
        }
        if a.size == Size::Small {
            let headers = [
                format!("Authorization: Bearer {token}"),
                "Accept: application/json".to_owned(),
            ];
            let load = Load {
                url: &urls[&Target::Direct],
                headers: &headers,
                threads: settings.threads,
                connections: settings.connections,
                duration: settings.cell,
            };
            results.profile = perf_profile(server_pid, &load)?;
        }
    }
    results.answers = answers;
    Ok(())
}

/// Lets [`USER`] read changelogs and ConfigMaps in [`FLEET_NAMESPACE`],
/// [`MEMORY_NAMESPACE`] and the fleet phase's namespace, and list and watch machines there
/// (ours and the MachineInventory CRD).
async fn bind_reader(bed: &TestBed) -> Result<()> {
    let mut yaml = String::from(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bench-reader}
rules:
- apiGroups: [changelog.elemental.cattle.io]
  resources: [managedosversions, managedosversions/changelog]
  verbs: [get, list]
- apiGroups: [changelog.elemental.cattle.io, elemental.cattle.io]
  resources: [machineinventories]
  verbs: [get, list, watch]
- apiGroups: [\"\"]
  resources: [configmaps]
  verbs: [get, list]
",
    );
    for namespace in [FLEET_NAMESPACE, MEMORY_NAMESPACE, machines::NAMESPACE] {
        yaml.push_str(&format!(
            "---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: bench-reader, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bench-reader}}
subjects:
- {{kind: User, name: {USER}, apiGroup: rbac.authorization.k8s.io}}
"
        ));
    }
    bed.kubectl_stdin(&["apply", "-f", "-"], &yaml).await?;
    Ok(())
}

/// Pushes `model`'s raw files as `tag`, creates its channel and versions in
/// `namespace` as the operator does, and waits until every version is
/// served. Returns the raw bytes and how long serving took.
async fn publish(
    bed: &TestBed,
    registry: &Registry,
    namespace: &str,
    model: &Channel,
    tag: &str,
) -> Result<(u64, Duration)> {
    let files = model.raw_files("updateinfo.xml.zst")?;
    let raw: u64 = files.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
        - files.last().map_or(0, |(_, d)| d.len() as u64)
        + model.updateinfo_xml().len() as u64;
    image::push_channel(registry, tag, Compression::Zstd, &files).await?;
    drop(files);
    let began = Instant::now();
    let mut channel =
        OperatorChannel::custom(&bed.client(), namespace, &model.name, &registry.image(tag))
            .await?;
    channel.sync(&model.entries()).await?;
    wait_served(bed, namespace, &model.name, model.versions.len()).await?;
    Ok((raw, began.elapsed()))
}

/// Waits until our server lists `versions` versions of `channel` in
/// `namespace`, all available.
async fn wait_served(bed: &TestBed, namespace: &str, channel: &str, versions: usize) -> Result<()> {
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let url = format!(
        "{}{}",
        bed.server_url()?,
        channel_summaries_path(namespace, channel)
    );
    poll(
        &format!("{namespace}/{channel} served"),
        SERVED_DEADLINE,
        POLL,
        async || {
            let response = http.get(&url).send().await?;
            if !response.status().is_success() {
                return Ok(None);
            }
            let body: Value = response.json().await?;
            let items = body["items"].as_array().cloned().unwrap_or_default();
            Ok(
                (items.len() == versions && items.iter().all(|i| i["available"] == true))
                    .then_some(()),
            )
        },
    )
    .await?;
    Ok(())
}

/// Picks, for each [`Size`], the changelog closest to its target size (for
/// [`Size::Large`], the smallest at least that large) among every version's
/// default changelog and the newest version's from every older one.
async fn choose_answers(bed: &TestBed, model: &Channel) -> Result<Vec<Answer>> {
    let server = bed.server().context("no server")?;
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let newest = &model.versions.last().context("an empty channel")?.name;
    let mut candidates: Vec<(String, Option<String>)> = model
        .versions
        .iter()
        .skip(1)
        .map(|v| (v.name.clone(), None))
        .collect();
    candidates.extend(
        model.versions[..model.versions.len() - 1]
            .iter()
            .map(|v| (newest.clone(), Some(v.name.clone()))),
    );
    let mut sized = Vec::new();
    for (name, from) in candidates {
        let mut answer = Answer {
            size: Size::Small,
            name,
            from,
            body: Vec::new(),
        };
        let response = http
            .get(format!("{}{}", server.url(), answer.path()))
            .send()
            .await?;
        ensure!(
            response.status().is_success(),
            "GET {}: {}",
            answer.path(),
            response.status()
        );
        answer.body = response.bytes().await?.to_vec();
        sized.push(answer);
    }
    let mut answers = Vec::new();
    for size in Size::ALL {
        let target = size.target() as f64;
        let pick = if size == Size::Large {
            sized
                .iter()
                .filter(|a| a.body.len() >= size.target())
                .min_by_key(|a| a.body.len())
                .or_else(|| sized.iter().max_by_key(|a| a.body.len()))
        } else {
            sized.iter().min_by(|x, y| {
                let distance = |a: &Answer| (a.body.len() as f64 / target).ln().abs();
                distance(x).total_cmp(&distance(y))
            })
        };
        let mut answer = pick.context("no changelog")?.clone();
        answer.size = size;
        answers.push(answer);
    }
    Ok(answers)
}

/// A ConfigMap per answer holding its JSON; returns their names.
async fn store_configmaps(bed: &TestBed, answers: &[Answer]) -> Result<BTreeMap<Size, String>> {
    let api: Api<ConfigMap> = Api::namespaced(bed.client(), FLEET_NAMESPACE);
    let mut names = BTreeMap::new();
    for a in answers {
        let name = format!("bench-{}", a.size.label());
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(FLEET_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                "changelog.json".to_owned(),
                String::from_utf8(a.body.clone()).context("a changelog that is not UTF-8")?,
            )])),
            ..ConfigMap::default()
        };
        api.patch(
            &name,
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&map),
        )
        .await
        .with_context(|| format!("applying ConfigMap {name}"))?;
        names.insert(a.size, name);
    }
    Ok(names)
}

/// One GET as the load clients do it: 200, and the changelog's bytes.
async fn check_url(url: &str, token: &str, target: Target, answer: &Answer) -> Result<()> {
    let http = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()?;
    let response = http.get(url).bearer_auth(token).send().await?;
    let status = response.status();
    let body = response.bytes().await?;
    ensure!(
        status.is_success(),
        "({}) GET {url}: {status} {}",
        target.letter(),
        String::from_utf8_lossy(&body)
    );
    match target {
        Target::ConfigMap => {
            let map: ConfigMap = serde_json::from_slice(&body)?;
            let data = map.data.unwrap_or_default();
            ensure!(
                data.get("changelog.json").map(String::as_bytes) == Some(answer.body.as_slice()),
                "ConfigMap does not hold the changelog"
            );
        }
        _ => {
            let served: Value = serde_json::from_slice(&body)?;
            let expected: Value = serde_json::from_slice(&answer.body)?;
            ensure!(
                served == expected,
                "({}) {url} answers other JSON",
                target.letter()
            );
        }
    }
    Ok(())
}

/// `VmRSS` and `VmHWM` of a process.
pub fn rss(pid: u32) -> Result<Rss> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok(Rss {
        rss_kib: field("VmRSS:")?,
        peak_kib: field("VmHWM:")?,
    })
}

/// The server's RSS once it no longer changes by more than 1 % over two
/// seconds (at most 30 s).
pub async fn settled_rss(bed: &TestBed) -> Result<Rss> {
    let pid = bed
        .server()
        .and_then(|s| s.process().pid())
        .context("the server is not running")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut samples: Vec<u64> = Vec::new();
    loop {
        let now = rss(pid)?;
        samples.push(now.rss_kib);
        let recent = &samples[samples.len().saturating_sub(5)..];
        let (min, max) = (
            recent.iter().min().copied().unwrap_or(0),
            recent.iter().max().copied().unwrap_or(0),
        );
        if (recent.len() == 5 && max - min <= max / 100) || Instant::now() > deadline {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The server's `elemental_changelog_answer_cache_bytes`.
async fn answer_cache_bytes(bed: &TestBed) -> Result<u64> {
    let text = bed.server_metrics().await?;
    let bytes = crate::fixtures::metric(&text, "elemental_changelog_answer_cache_bytes", &[]);
    Ok(bytes as u64)
}

/// Times `samples` re-syncs: each points the channel at a new image with one
/// more version and records the sync as the operator does; done when our
/// server serves the new version's changelog.
async fn resync_latency(
    bed: &TestBed,
    registry: &Registry,
    samples: usize,
) -> Result<Vec<Duration>> {
    let base = 40;
    let model = Channel::generate(&Spec::new("resync", base + samples, 800, 11));
    let upto = |n: usize| {
        let mut c = model.clone();
        c.versions.truncate(n);
        c
    };
    let first = upto(base);
    let tag = |n: usize| format!("bench/resync:{n}");
    image::push_channel(
        registry,
        &tag(base),
        Compression::Zstd,
        &first.raw_files("updateinfo.xml.zst")?,
    )
    .await?;
    let mut channel = OperatorChannel::custom(
        &bed.client(),
        FLEET_NAMESPACE,
        &model.name,
        &registry.image(&tag(base)),
    )
    .await?;
    channel.sync(&first.entries()).await?;
    wait_served(bed, FLEET_NAMESPACE, &model.name, base).await?;
    let server = bed.server().context("no server")?;
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let mut latencies = Vec::new();
    for n in base + 1..=base + samples {
        let next = upto(n);
        image::push_channel(
            registry,
            &tag(n),
            Compression::Zstd,
            &next.raw_files("updateinfo.xml.zst")?,
        )
        .await?;
        let newest = next.entries().pop().context("no version")?;
        let url = format!(
            "{}{}",
            server.url(),
            changelog_path(FLEET_NAMESPACE, &newest.name)
        );
        let began = Instant::now();
        channel.set_image(&registry.image(&tag(n))).await?;
        channel.sync(std::slice::from_ref(&newest)).await?;
        loop {
            if http.get(&url).send().await?.status().is_success() {
                break;
            }
            if began.elapsed() > SERVED_DEADLINE {
                bail!("re-sync to {} not served", tag(n));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.push(began.elapsed());
        eprintln!("bench: re-sync {n} served after {:?}", began.elapsed());
    }
    Ok(latencies)
}

/// Adds channels of `settings.memory_shape` in [`MEMORY_NAMESPACE`] up to
/// each stage's count and records the settled RSS.
async fn memory_stages(
    bed: &TestBed,
    registry: &Registry,
    settings: &Settings,
) -> Result<Vec<MemoryStage>> {
    let (versions, packages) = settings.memory_shape;
    let mut stages = Vec::new();
    let mut raw_bytes = 0;
    let mut count = 0;
    for &stage in &settings.memory_stages {
        let mut last = Duration::ZERO;
        while count < stage {
            let model = Channel::generate(&Spec::new(
                &format!("mem{count}"),
                versions,
                packages,
                100 + count as u64,
            ));
            let (raw, took) = publish(
                bed,
                registry,
                MEMORY_NAMESPACE,
                &model,
                &format!("bench/mem{count}:1"),
            )
            .await?;
            raw_bytes += raw;
            last = took;
            count += 1;
            eprintln!("bench: memory channel {count} ({raw} raw bytes) served after {took:?}");
        }
        let rss = settled_rss(bed).await?;
        let answers = answer_cache_bytes(bed).await?;
        eprintln!(
            "bench: {count} channels: RSS {} KiB, answer cache {answers} bytes",
            rss.rss_kib
        );
        stages.push(MemoryStage {
            channels: count,
            raw_bytes,
            rss,
            answer_cache_bytes: answers,
            last_served_after: last,
        });
    }
    Ok(stages)
}

/// `perf record` of the server while `wrk` loads it; the top of `perf
/// report`, or `None` when perf is not there or not allowed.
fn perf_profile(pid: u32, load: &Load<'_>) -> Result<Option<String>> {
    let data = tempfile::NamedTempFile::new()?;
    let seconds = load.duration.as_secs().max(2) - 1;
    let Ok(mut perf) = std::process::Command::new("perf")
        .args(["record", "-F", "999", "-p", &pid.to_string(), "-o"])
        .arg(data.path())
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    else {
        return Ok(None);
    };
    let measured = load::wrk(load);
    let recorded = perf.wait()?;
    measured?;
    if !recorded.success() {
        return Ok(None);
    }
    perf_top(data.path())
}

/// A `perf record` of a process, running until [`Recording::finish`].
pub struct Recording {
    perf: std::process::Child,
    data: tempfile::NamedTempFile,
}

impl Recording {
    /// Starts recording `pid`; `None` when perf is not there.
    pub fn start(pid: u32) -> Result<Option<Self>> {
        let data = tempfile::NamedTempFile::new()?;
        let Ok(perf) = std::process::Command::new("perf")
            .args(["record", "-F", "999", "-g", "-p", &pid.to_string(), "-o"])
            .arg(data.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        else {
            return Ok(None);
        };
        Ok(Some(Self { perf, data }))
    }

    /// Stops the recording (SIGINT, as Ctrl-C) and returns the top of its report, or `None`
    /// when perf was not allowed to record.
    pub fn finish(mut self) -> Result<Option<String>> {
        let stopped = std::process::Command::new("kill")
            .args(["-INT", &self.perf.id().to_string()])
            .status()?;
        ensure!(stopped.success(), "could not stop perf");
        // perf record ends with 130 on SIGINT, having written its data.
        let status = self.perf.wait()?;
        if !status.success() && status.code() != Some(130) {
            return Ok(None);
        }
        perf_top(self.data.path())
    }
}

/// The top of `perf report` of the recording in `data` (symbols taking 1 % or more, self
/// time), or `None` when it is empty.
fn perf_top(data: &std::path::Path) -> Result<Option<String>> {
    let report = std::process::Command::new("perf")
        .args(["report", "--stdio", "--no-children", "--sort", "dso,symbol"])
        .args(["--percent-limit", "1", "-g", "none", "-i"])
        .arg(data)
        .output()?;
    let text = String::from_utf8_lossy(&report.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.trim_end_matches([' ', '-']))
        .take(30)
        .collect();
    Ok((report.status.success() && !lines.is_empty()).then(|| lines.join("\n")))
}

/// Runs `cargo bench -p elemental-changelog --bench compute` and reads
/// criterion's estimates of this run: (title, median ns, mean ns).
fn criterion(settings: &Settings) -> Result<Vec<(String, f64, f64)>> {
    let began = SystemTime::now();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command.current_dir(workspace_root()).args([
        "bench",
        "--locked",
        "-p",
        "elemental-changelog",
        "--bench",
        "compute",
    ]);
    if settings.quick {
        command.args(["--", "--warm-up-time", "1", "--measurement-time", "2"]);
    }
    let status = command.status().context("running cargo bench")?;
    ensure!(status.success(), "cargo bench failed ({status})");
    let mut out = Vec::new();
    let root = target_dir().join("criterion");
    for entry in std::fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))? {
        let new = entry?.path().join("new");
        let (Ok(benchmark), Ok(estimates)) = (
            std::fs::read(new.join("benchmark.json")),
            std::fs::read(new.join("estimates.json")),
        ) else {
            continue;
        };
        let fresh = std::fs::metadata(new.join("estimates.json"))?.modified()? >= began;
        if !fresh {
            continue;
        }
        let benchmark: Value = serde_json::from_slice(&benchmark)?;
        let estimates: Value = serde_json::from_slice(&estimates)?;
        let title = benchmark["title"].as_str().unwrap_or_default().to_owned();
        let point = |k: &str| estimates[k]["point_estimate"].as_f64().unwrap_or(f64::NAN);
        out.push((title, point("median"), point("mean")));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn read_trimmed(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The 1, 5 and 15 minute load averages.
fn load_average() -> String {
    read_trimmed("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .unwrap_or_else(|e| format!("unavailable ({e})"))
}

/// CPU, cores, memory, kernel, OS, and the versions of every program measured.
fn machine_facts() -> Result<Vec<(String, String)>> {
    let cpuinfo = read_trimmed("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    let memory = read_trimmed("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or_else(String::new, |kib| {
            format!("{:.1} GiB", kib as f64 / 1048576.0)
        });
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let server = crate::testbed::server_binary();
    let tools = crate::testbed::tools_dir();
    let root = workspace_root();
    let root = root.to_string_lossy();
    Ok(vec![
        ("CPU".to_owned(), format!("{cpu} ({cores} cores available)")),
        ("memory".to_owned(), memory),
        (
            "kernel".to_owned(),
            read_trimmed("/proc/sys/kernel/osrelease"),
        ),
        ("Debian".to_owned(), read_trimmed("/etc/debian_version")),
        (
            "commit".to_owned(),
            command_line("git", &["-C", &root, "describe", "--always", "--dirty"]),
        ),
        ("server binary".to_owned(), server.display().to_string()),
        ("rustc".to_owned(), command_line("rustc", &["--version"])),
        (
            "kube-apiserver".to_owned(),
            command_line(
                &tools.join("kube-apiserver").to_string_lossy(),
                &["--version"],
            ),
        ),
        ("nginx".to_owned(), command_line(load::NGINX, &["-v"])),
        ("wrk".to_owned(), command_line("wrk", &["-v"])),
        ("h2load".to_owned(), command_line("h2load", &["--version"])),
    ])
}
