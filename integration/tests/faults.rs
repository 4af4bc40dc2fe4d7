//! Faults between our server and what it depends on (issue 9, item 7), end
//! to end: a real registry and a real kube-apiserver, each behind the
//! fault-injecting proxy of [`elemental_changelog_integration::faults`],
//! and kube-apiserver with etcd killed and restarted under a running server.
//!
//! Every fault ends the same way: the last good data is served throughout
//! (through kube-apiserver's aggregator), the error shows in `/metrics`, and
//! once the fault clears the server catches up by itself, without a restart.
//! The time each step took is printed (`--nocapture`); docs/reliability.md
//! records them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_apiservice::types::ManagedOSVersionChangelog;
use elemental_changelog_integration::{
    faults::{Fault, FaultProxy},
    fixtures::{OperatorChannel, cause, log_lines, metric},
    generated::Listing,
    image::{self, Compression, Format, Layer},
    paths::{changelog_path, summary_path},
    registry::Registry,
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, elemental::channel_resource},
    wait::{POLL, SERVED, poll},
};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject};
use sha2::{Digest as _, Sha256};

/// The server's periodic digest check in the registry test, in seconds;
/// also the cap of its retry backoff.
const REFRESH_SECONDS: u64 = 3;
const FETCHES: &str = "elemental_changelog_channel_fetches_total";
const CHANNELS: &str = "elemental_changelog_channels";
const WATCH_ERRORS: &str = "elemental_changelog_watch_errors_total";
const WATCH_SYNCED: &str = "elemental_changelog_watch_synced";
const DATA_AGE: &str = "elemental_changelog_channel_data_age_seconds";
/// Requests made while each fault lasts; every one must be answered.
const REQUESTS_DURING_FAULT: usize = 20;
/// Seeds of generated data: `faulty`'s first image (and one more for each
/// fault), its images with a new version (one for each round); `steady`, and
/// the first of the `doomed-<n>` and `born-<n>` channels.
const FAULTY: u64 = 100;
const FAULTY_NEW: u64 = 200;
const STEADY: u64 = 300;
const DOOMED: u64 = 310;
const BORN: u64 = 320;

/// Admin requests, through kube-apiserver's aggregator and straight to our server.
struct Requests {
    apiserver: String,
    server: String,
    aggregator: reqwest::Client,
    direct: reqwest::Client,
}

impl Requests {
    fn new(bed: &TestBed) -> Result<Self> {
        Ok(Self {
            apiserver: bed.apiserver_url(),
            server: bed.server_url()?,
            aggregator: bed.apiserver_http(Some(&bed.pki().admin))?,
            direct: bed.server_http(Some(&bed.pki().admin))?,
        })
    }

    async fn get(client: &reqwest::Client, url: String) -> Result<(u16, Vec<u8>)> {
        let response = client.get(&url).send().await?;
        let status = response.status().as_u16();
        Ok((status, response.bytes().await?.to_vec()))
    }

    /// The changelog of version `name`: through the aggregator, or directly.
    async fn changelog(&self, name: &str, direct: bool) -> Result<ManagedOSVersionChangelog> {
        let (client, base) = if direct {
            (&self.direct, &self.server)
        } else {
            (&self.aggregator, &self.apiserver)
        };
        let path = changelog_path(FLEET_NAMESPACE, name);
        let (status, body) = Self::get(client, format!("{base}{path}")).await?;
        ensure!(
            status == 200,
            "GET {path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        serde_json::from_slice(&body).with_context(|| format!("GET {path}"))
    }

    /// The changelog of `name` through the aggregator as answered: status,
    /// `Retry-After` and body.
    async fn changelog_raw(&self, name: &str) -> Result<(u16, Option<String>, Vec<u8>)> {
        let url = format!(
            "{}{}",
            self.apiserver,
            changelog_path(FLEET_NAMESPACE, name)
        );
        let response = self.aggregator.get(&url).send().await?;
        let status = response.status().as_u16();
        let retry = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((status, retry, response.bytes().await?.to_vec()))
    }

    /// The summary of version `name` through the aggregator.
    async fn summary(&self, name: &str) -> Result<serde_json::Value> {
        let url = format!("{}{}", self.apiserver, summary_path(FLEET_NAMESPACE, name));
        let (status, body) = Self::get(&self.aggregator, url).await?;
        ensure!(status == 200, "summary of {name}: {status}");
        Ok(serde_json::from_slice(&body)?)
    }

    /// The status code of the changelog of `name` through the aggregator.
    async fn changelog_status(&self, name: &str) -> Result<u16> {
        let url = format!(
            "{}{}",
            self.apiserver,
            changelog_path(FLEET_NAMESPACE, name)
        );
        Ok(Self::get(&self.aggregator, url).await?.0)
    }

    async fn metrics(&self) -> Result<String> {
        let (status, body) = Self::get(&self.direct, format!("{}/metrics", self.server)).await?;
        ensure!(status == 200, "/metrics: {status}");
        Ok(String::from_utf8(body)?)
    }

    async fn readyz(&self) -> Result<u16> {
        Ok(Self::get(&self.direct, format!("{}/readyz", self.server))
            .await?
            .0)
    }

    /// Waits until `name` is served with image digest `digest` and is
    /// `data`'s version; returns the time taken.
    async fn wait_served(&self, data: &Listing, name: &str, digest: &str) -> Result<Duration> {
        let (_, took) = poll(
            &format!("{name} served from {digest}"),
            SERVED,
            POLL,
            async || {
                let served = self.changelog(name, false).await?;
                if served.channel.digest.as_deref() != Some(digest) {
                    return Ok(None);
                }
                data.check(&served, name)?;
                Ok(Some(()))
            },
        )
        .await?;
        Ok(took)
    }

    /// Makes [`REQUESTS_DURING_FAULT`] requests for every version of `data`,
    /// through the aggregator; each must serve `digest`.
    async fn still_served(&self, data: &Listing, digest: &str) -> Result<usize> {
        let mut answered = 0;
        for round in 0..REQUESTS_DURING_FAULT {
            let version = &data.versions[round % data.versions.len()];
            let served = self.changelog(&version.name, false).await?;
            data.check(&served, &version.name)?;
            ensure!(
                served.channel.digest.as_deref() == Some(digest),
                "{} served from {:?}, not the last good {digest}",
                version.name,
                served.channel.digest
            );
            answered += 1;
        }
        let ready = self.readyz().await?;
        ensure!(ready == 200, "/readyz during the fault: {ready}");
        Ok(answered)
    }
}

/// Failed fetches by error kind (every `result` but `pulled`, `unchanged` and `shared`).
fn failures(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&format!("{FETCHES}{{result=\"")) else {
            continue;
        };
        let Some((kind, value)) = rest.split_once("\"} ") else {
            continue;
        };
        if !["pulled", "unchanged", "shared"].contains(&kind) {
            out.insert(kind.to_owned(), value.parse().unwrap_or_default());
        }
    }
    out
}

/// The kinds whose count grew from `before` to `after`.
fn grown(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<String> {
    after
        .iter()
        .filter(|(kind, n)| **n > before.get(*kind).copied().unwrap_or_default())
        .map(|(kind, _)| kind.clone())
        .collect()
}

/// `size` bytes that do not compress, the same for the same seed.
fn incompressible(seed: u64, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 32);
    let mut block: [u8; 32] = Sha256::digest(seed.to_be_bytes()).into();
    while out.len() < size {
        out.extend_from_slice(&block);
        block = Sha256::digest(block).into();
    }
    out.truncate(size);
    out
}

/// Pushes `data` as `repository:latest` with a 256 KiB payload layer (read
/// and ignored by the server), so that faults in mid-body land in a blob
/// and slow transfers take long. Returns the manifest digest.
async fn push_with_payload(
    registry: &Registry,
    repository: &str,
    data: &Listing,
) -> Result<String> {
    let payload = Layer::new(Compression::None).file(
        "usr/share/payload",
        incompressible(data.history.seed(), 256 << 10),
    );
    let image = data
        .image(Format::Oci, Compression::Gzip, "amd64")
        .layer(payload);
    Ok(
        image::push(registry, &format!("{repository}:latest"), &image)
            .await?
            .digest,
    )
}

/// A fault of the registry connection and the error kinds it may be counted as.
struct RegistryFault {
    name: &'static str,
    fault: Fault,
    kinds: &'static [&'static str],
}

const REGISTRY_FAULTS: [RegistryFault; 7] = [
    RegistryFault {
        name: "connection refused",
        fault: Fault::Refuse,
        kinds: &["registry"],
    },
    RegistryFault {
        name: "reset mid-body",
        fault: Fault::ResetAfter(64 << 10),
        kinds: &["registry"],
    },
    RegistryFault {
        name: "truncated body",
        fault: Fault::TruncateAfter(64 << 10),
        // A body cut short is an HTTP error; were it read to its end
        // regardless, the digest check would refuse it.
        kinds: &["registry", "digest_mismatch"],
    },
    RegistryFault {
        name: "stall",
        fault: Fault::Stall,
        // --registry-read-timeout (2 s) ends each attempt; the client's retries
        // add up to about --fetch-timeout (6 s), so on a loaded machine the
        // whole-fetch deadline may be what ends it: both name a stall.
        kinds: &["registry", "timeout"],
    },
    RegistryFault {
        name: "slow body",
        fault: Fault::Slow {
            bytes: 1024,
            every: Duration::from_millis(100),
        },
        kinds: &["timeout"],
    },
    RegistryFault {
        name: "HTTP 503",
        fault: Fault::HttpStatus(503),
        kinds: &["registry"],
    },
    RegistryFault {
        name: "HTTP 500",
        fault: Fault::HttpStatus(500),
        kinds: &["registry"],
    },
];

/// The registry behind the proxy; the channel's image names the proxy.
/// For each fault: a new image is pushed (directly) while the proxy
/// injects the fault; the periodic digest check fails, counted with its
/// kind; the last good image stays served; once the proxy passes again the
/// new image is served without any other action.
#[tokio::test]
async fn registry_faults() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let proxy = FaultProxy::start(registry.host().parse::<SocketAddr>()?).await?;
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    let result = async {
        let args = [
            "--insecure-registry",
            &proxy.host(),
            "--refresh-interval",
            &format!("{REFRESH_SECONDS}s"),
            "--registry-connect-timeout",
            "2s",
            "--registry-read-timeout",
            "2s",
            "--fetch-timeout",
            "6s",
        ];
        bed.start_server(&args).await?;
        registry_rounds(&bed, &registry, &proxy).await
    }
    .await;
    bed.finish(result)
}

async fn registry_rounds(bed: &TestBed, registry: &Registry, proxy: &FaultProxy) -> Result<()> {
    let requests = Requests::new(bed)?;
    let repository = "elemental/faulty";
    let mut data = Listing::generate("faulty", FAULTY, 1..=2);
    let mut digest = push_with_payload(registry, repository, &data).await?;
    let mut channel = OperatorChannel::custom(
        &bed.client(),
        FLEET_NAMESPACE,
        "faulty",
        &format!("{}/{repository}:latest", proxy.host()),
    )
    .await?;
    channel.sync(&data.entries()).await?;
    let newest = data.newest()?.name.clone();
    requests.wait_served(&data, &newest, &digest).await?;

    for (round, fault) in REGISTRY_FAULTS.iter().enumerate() {
        let before = failures(&requests.metrics().await?);
        proxy.set(fault.fault);
        let next = Listing::generate("faulty", FAULTY + 1 + round as u64, 1..=2);
        let next_digest = push_with_payload(registry, repository, &next).await?;
        let (kinds, detected) = poll(
            &format!("{}: a failed fetch counted", fault.name),
            SERVED,
            POLL,
            async || {
                let kinds = grown(&before, &failures(&requests.metrics().await?));
                Ok((!kinds.is_empty()).then_some(kinds))
            },
        )
        .await?;
        ensure!(
            kinds.iter().all(|k| fault.kinds.contains(&k.as_str())),
            "{}: counted as {kinds:?}, expected one of {:?}",
            fault.name,
            fault.kinds
        );
        let answered = requests.still_served(&data, &digest).await?;
        if round == 0 {
            channel_age_shows(&requests, true).await?;
        }
        let held = proxy.stalled();
        proxy.set(Fault::Pass);
        let recovered = requests.wait_served(&next, &newest, &next_digest).await?;
        if round == 0 {
            channel_age_shows(&requests, false).await?;
        }
        eprintln!(
            "registry fault {:>18}: counted as {kinds:?} after {detected:.1?}; {answered} requests \
             answered from the last good image meanwhile, 0 failed; {held} transfers held; \
             new image served {recovered:.1?} after the fault cleared",
            fault.name
        );
        data = next;
        digest = next_digest;
    }
    new_version_rounds(
        &requests,
        registry,
        proxy,
        &mut channel,
        (&mut data, &mut digest),
    )
    .await?;
    let log = bed.server_log()?;
    ensure!(
        !log_lines(
            &log,
            &["fetching the channel image failed", "channel=faulty"]
        )?
        .is_empty(),
        "the failures are not in the log"
    );
    ensure!(
        log_lines(&log, &["panicked"])?.is_empty(),
        "the server panicked"
    );
    Ok(())
}

/// Issue 17, item 12: the operator re-syncs the channel to an image with one
/// more version while the registry fails. What the last good image lists
/// stays served; the new version is "not yet", never "no data": its changelog
/// answers 503 (`NotFetched` while the fetch runs, then `FetchFailed` naming
/// only the error kind) with `Retry-After`, never 404 `NoChangelogData`, and
/// its summary says the same; once the registry serves again, it is served.
async fn new_version_rounds(
    requests: &Requests,
    registry: &Registry,
    proxy: &FaultProxy,
    channel: &mut OperatorChannel,
    (data, digest): (&mut Listing, &mut String),
) -> Result<()> {
    let repository = "elemental/faulty";
    for (round, name) in ["HTTP 503", "truncated body", "stall"].iter().enumerate() {
        let fault = REGISTRY_FAULTS
            .iter()
            .find(|f| f.name == *name)
            .context("no such fault")?;
        proxy.set(fault.fault);
        let count = u32::try_from(data.versions.len())? + 1;
        let next = Listing::generate("faulty", FAULTY_NEW + round as u64, 1..=count);
        let next_digest = push_with_payload(registry, repository, &next).await?;
        channel.sync(&next.entries()).await?;
        let new = next.newest()?.name.clone();
        let causes = std::cell::RefCell::new(Vec::new());
        // A wrong answer ends the poll at once (an error would only be retried).
        let (outcome, detected) = poll(
            &format!("{name}: the new version {new} answers FetchFailed"),
            SERVED,
            POLL,
            async || {
                let (status, retry, body) = requests.changelog_raw(&new).await?;
                let (reason, message) = cause(&body);
                Ok(match (status, reason.as_str()) {
                    // Not seen by our server's watch yet: no such ManagedOSVersion.
                    (404, "") => None,
                    (503, "NotFetched" | "FetchFailed") if retry.is_none() => Some(Err(format!(
                        "{name}: 503 {reason} without Retry-After: {message}"
                    ))),
                    (503, "NotFetched" | "FetchFailed") => {
                        let mut causes = causes.borrow_mut();
                        if causes.last() != Some(&reason) {
                            causes.push(reason.clone());
                        }
                        (reason == "FetchFailed").then_some(Ok((message, retry)))
                    }
                    _ => Some(Err(format!(
                        "{name}: {new} answered {status} {reason} during the fault (only 503 NotFetched or FetchFailed allowed): {message}"
                    ))),
                })
            },
        )
        .await?;
        let (message, retry) = outcome.map_err(anyhow::Error::msg)?;
        ensure!(
            fault
                .kinds
                .iter()
                .any(|k| message.contains(&format!("({k})"))),
            "{name}: the message names none of the kinds {:?}: {message}",
            fault.kinds
        );
        ensure!(
            !message.contains("fault proxy") && !message.contains(&next_digest),
            "{name}: the registry's words or the unread digest leaked: {message}"
        );
        // The operator creates the version, then marks the channel synced: a read of the image
        // that failed between the two is FetchFailed until the server sees the mark, then
        // NotFetched again until the next read fails too. So the summary may still be
        // NotFetched once; it must come to FetchFailed, and never say anything else.
        let (summary, _) = poll(
            &format!("{name}: the summary of {new} says FetchFailed"),
            SERVED,
            POLL,
            async || {
                let summary = requests.summary(&new).await?;
                Ok(match summary["reason"].as_str() {
                    Some("NotFetched") if summary["available"] == false => None,
                    Some("FetchFailed") if summary["available"] == false => Some(Ok(())),
                    _ => Some(Err(format!("{name}: summary of {new}: {summary}"))),
                })
            },
        )
        .await?;
        summary.map_err(anyhow::Error::msg)?;
        let answered = requests.still_served(data, digest).await?;
        proxy.set(Fault::Pass);
        let recovered = requests.wait_served(&next, &new, &next_digest).await?;
        eprintln!(
            "new version during {name:>14}: 503 FetchFailed with Retry-After {} {detected:.1?} after \
             the re-sync (answers seen: {causes:?}), summary FetchFailed, never 404; {answered} \
             requests for the other versions answered meanwhile; served {recovered:.1?} after the \
             fault cleared",
            retry.unwrap_or_default(),
            causes = causes.borrow()
        );
        *data = next;
        *digest = next_digest;
    }
    Ok(())
}

/// Waits until the `faulty` channel's data age (updated every 10 s) is
/// above (`stale`) or below twice the refresh interval.
async fn channel_age_shows(requests: &Requests, stale: bool) -> Result<()> {
    let labels = [("namespace", FLEET_NAMESPACE), ("channel", "faulty")];
    let bound = 2.0 * REFRESH_SECONDS as f64;
    let (age, _) = poll(
        &format!("{DATA_AGE} {} {bound}", if stale { ">" } else { "<" }),
        Duration::from_secs(30),
        POLL,
        async || {
            let age = metric(&requests.metrics().await?, DATA_AGE, &labels);
            Ok(((age > bound) == stale).then_some(age))
        },
    )
    .await?;
    eprintln!("channel data age: {age:.1} s");
    Ok(())
}

/// A channel of the kube-apiserver test: pushed, applied and synced the
/// operator's way.
struct Channel {
    operator: OperatorChannel,
    data: Listing,
    digest: String,
}

/// Pushes `elemental/<name>:latest` with versions `1..=count` of channel
/// `name`, the data derived from `seed` (each push with another count is a
/// new image); returns the data and the manifest digest.
async fn publish(
    registry: &Registry,
    name: &str,
    seed: u64,
    count: u32,
) -> Result<(Listing, String)> {
    let data = Listing::generate(name, seed, 1..=count);
    let pushed = image::push(
        registry,
        &format!("elemental/{name}:latest"),
        &data.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    Ok((data, pushed.digest))
}

impl Channel {
    async fn create(
        bed: &TestBed,
        registry: &Registry,
        name: &str,
        seed: u64,
        count: u32,
    ) -> Result<Self> {
        let (data, digest) = publish(registry, name, seed, count).await?;
        let mut operator = OperatorChannel::custom(
            &bed.client(),
            FLEET_NAMESPACE,
            name,
            &registry.image(&format!("elemental/{name}:latest")),
        )
        .await?;
        operator.sync(&data.entries()).await?;
        Ok(Self {
            operator,
            data,
            digest,
        })
    }

    /// A new image with one more version, synced by the operator.
    async fn grow(&mut self, registry: &Registry) -> Result<()> {
        let count = u32::try_from(self.data.versions.len())? + 1;
        let seed = self.data.history.seed();
        let (data, digest) = publish(registry, &self.operator.name(), seed, count).await?;
        self.operator.sync(&data.entries()).await?;
        self.data = data;
        self.digest = digest;
        Ok(())
    }

    fn newest(&self) -> Result<String> {
        Ok(self.data.newest()?.name.clone())
    }

    async fn wait_served(&self, requests: &Requests) -> Result<Duration> {
        requests
            .wait_served(&self.data, &self.newest()?, &self.digest)
            .await
    }

    async fn delete(&self, bed: &TestBed) -> Result<()> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(bed.client(), FLEET_NAMESPACE, &channel_resource());
        api.delete(&self.operator.name(), &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// Waits until its data is no longer served (its versions stay: the
    /// test bed runs no garbage collector).
    async fn wait_dropped(&self, requests: &Requests) -> Result<Duration> {
        let name = self.newest()?;
        let (_, took) = poll(
            &format!("{name} no longer served"),
            SERVED,
            POLL,
            async || Ok((requests.changelog_status(&name).await? != 200).then_some(())),
        )
        .await?;
        Ok(took)
    }
}

/// How our server's connection to kube-apiserver is broken.
#[derive(Clone, Copy, Debug)]
enum KubeFault {
    /// kube-apiserver unreachable: open connections reset, new ones refused.
    Refuse,
    /// Nothing moves either way; everything held resumes afterwards.
    Stall,
    /// Every connection (the watches cut first) reset after 4 KiB.
    ResetMidStream,
}

/// Our server reaches kube-apiserver through the proxy. Its watches are
/// broken while the operator creates a channel, deletes one and re-syncs
/// another; the last good data stays served; afterwards the reflectors
/// catch up. Then kube-apiserver and etcd are killed and restarted. The
/// server fetches each new image exactly once: no duplicate worker, no
/// re-pull of unchanged channels after a re-list.
#[tokio::test]
async fn kube_apiserver_faults_and_restart() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    let proxy = FaultProxy::start(bed.apiserver_addr()).await?;
    bed.set_server_apiserver_url(Some(format!("https://{}", proxy.host())));
    let result = async {
        bed.start_server(&["--insecure-registry", registry.host()])
            .await?;
        kube_rounds(&mut bed, &registry, &proxy).await
    }
    .await;
    bed.finish(result)
}

async fn kube_rounds(bed: &mut TestBed, registry: &Registry, proxy: &FaultProxy) -> Result<()> {
    let faults = [
        KubeFault::Refuse,
        KubeFault::Stall,
        KubeFault::ResetMidStream,
    ];
    let requests = Requests::new(bed)?;
    let mut steady = Channel::create(bed, registry, "steady", STEADY, 2).await?;
    let mut doomed = Vec::new();
    for round in 0..=faults.len() {
        doomed.push(
            Channel::create(
                bed,
                registry,
                &format!("doomed-{round}"),
                DOOMED + round as u64,
                1,
            )
            .await?,
        );
    }
    steady.wait_served(&requests).await?;
    for channel in &doomed {
        channel.wait_served(&requests).await?;
    }
    let pulled = [("result", "pulled")];
    let pulls_at_start = metric(&requests.metrics().await?, FETCHES, &pulled);
    // Each round pulls two new images: the new channel's and steady's.
    let mut expected_pulls = pulls_at_start;

    for (round, fault) in faults.into_iter().enumerate() {
        let errors = watch_errors(&requests).await?;
        let faulted = Instant::now();
        match fault {
            KubeFault::Refuse => proxy.set(Fault::Refuse),
            KubeFault::Stall => proxy.set(Fault::Stall),
            KubeFault::ResetMidStream => {
                proxy.set(Fault::ResetAfter(4 << 10));
                proxy.cut();
            }
        }
        let last_good = (steady.data.clone(), steady.digest.clone());
        let born = operator_changes(bed, registry, round, &mut steady, &doomed[round]).await?;
        match fault {
            KubeFault::Stall => {
                poll("a watch event held", SERVED, POLL, async || {
                    Ok((proxy.stalled() > 0).then_some(()))
                })
                .await?;
            }
            KubeFault::Refuse => {
                // Several failed attempts of each watch: their backoff has grown.
                poll("four errors of each watch", SERVED, POLL, async || {
                    let now = watch_errors(&requests).await?;
                    Ok(now
                        .iter()
                        .zip(&errors)
                        .all(|(n, e)| *n >= e + 4.0)
                        .then_some(()))
                })
                .await?;
            }
            KubeFault::ResetMidStream => {
                // Each watch was cut; those with more than 4 KiB to read are
                // reset again and again (a quiet one may get through).
                poll(
                    "each watch cut, four errors in all",
                    SERVED,
                    POLL,
                    async || {
                        let now = watch_errors(&requests).await?;
                        let each = now.iter().zip(&errors).all(|(n, e)| n > e);
                        let all = now.iter().sum::<f64>() >= errors.iter().sum::<f64>() + 4.0;
                        Ok((each && all).then_some(()))
                    },
                )
                .await?;
            }
        }
        let felt = faulted.elapsed();
        let answered = requests.still_served(&last_good.0, &last_good.1).await?;
        if matches!(fault, KubeFault::Refuse) {
            let status = requests.changelog_status(&born.newest()?).await?;
            ensure!(
                status != 200,
                "a channel created during the fault is served: {status}"
            );
        }
        let held = proxy.stalled();
        proxy.set(Fault::Pass);
        let cleared = Instant::now();
        caught_up(&requests, &born, &steady, &doomed[round]).await?;
        let recovered = cleared.elapsed();
        expected_pulls += 2.0;
        watches_synced(&requests).await?;
        eprintln!(
            "kube-apiserver fault {fault:?}: held until {felt:.1?} after it began (its condition \
             above); {answered} requests answered from the last good data \
             meanwhile, 0 failed; {held} transfers held; new channel, re-sync and deletion all \
             seen {recovered:.1?} after the fault cleared"
        );
    }

    // kube-apiserver and etcd killed: our server keeps answering directly.
    let errors = watch_errors(&requests).await?;
    let stopped = Instant::now();
    bed.stop_control_plane();
    let newest = steady.newest()?;
    let served = requests.changelog(&newest, true).await?;
    steady.data.check(&served, &newest)?;
    ensure!(served.channel.digest.as_deref() == Some(steady.digest.as_str()));
    let ready = requests.readyz().await?;
    ensure!(ready == 200, "/readyz with kube-apiserver down: {ready}");
    poll("an error of each watch", SERVED, POLL, async || {
        let now = watch_errors(&requests).await?;
        Ok(now.iter().zip(&errors).all(|(n, e)| n > e).then_some(()))
    })
    .await?;
    bed.start_control_plane().await?;
    let down = stopped.elapsed();
    let restarted = Instant::now();
    let round = faults.len();
    let born_total = round + 1;
    let born = operator_changes(bed, registry, round, &mut steady, &doomed[round]).await?;
    caught_up(&requests, &born, &steady, &doomed[round]).await?;
    let recovered = restarted.elapsed();
    expected_pulls += 2.0;
    watches_synced(&requests).await?;
    eprintln!(
        "kube-apiserver and etcd restarted: down {down:.1?}; new channel, re-sync and deletion \
         all seen {recovered:.1?} after kube-apiserver was ready again"
    );

    // Exactly one pull per new image: no duplicate worker, nothing pulled
    // again after a re-list; and no data of a deleted channel kept.
    let text = requests.metrics().await?;
    let pulls = metric(&text, FETCHES, &pulled);
    ensure!(
        pulls == expected_pulls,
        "{pulls} pulls, expected {expected_pulls} ({pulls_at_start} before the faults)"
    );
    let channels = metric(&text, CHANNELS, &[]);
    ensure!(
        channels == 1.0 + born_total as f64,
        "{channels} channels in the cache, expected steady and {born_total} new ones"
    );
    let log = bed.server_log()?;
    let born_names = (0..born_total).map(|round| format!("born-{round}"));
    for channel in std::iter::once("steady".to_owned()).chain(born_names) {
        let pulls = log_lines(
            &log,
            &["channel image pulled", &format!("channel={channel}}}")],
        )?;
        let expected = if channel == "steady" {
            1 + born_total
        } else {
            1
        };
        ensure!(
            pulls.len() == expected,
            "{channel} pulled {} times, expected {expected}: {pulls:#?}",
            pulls.len()
        );
    }
    ensure!(
        log_lines(&log, &["panicked"])?.is_empty(),
        "the server panicked"
    );
    Ok(())
}

/// What the operator does in round `round`: creates channel `born-<round>`,
/// deletes `doomed` and re-syncs `steady` to a new image with one more version.
async fn operator_changes(
    bed: &TestBed,
    registry: &Registry,
    round: usize,
    steady: &mut Channel,
    doomed: &Channel,
) -> Result<Channel> {
    let born = Channel::create(
        bed,
        registry,
        &format!("born-{round}"),
        BORN + round as u64,
        2,
    )
    .await?;
    doomed.delete(bed).await?;
    steady.grow(registry).await?;
    Ok(born)
}

/// Waits until [`operator_changes`] are all served.
async fn caught_up(
    requests: &Requests,
    born: &Channel,
    steady: &Channel,
    doomed: &Channel,
) -> Result<()> {
    born.wait_served(requests).await?;
    steady.wait_served(requests).await?;
    doomed.wait_dropped(requests).await?;
    Ok(())
}

/// The resources our server watches (the `resource` label of its watch metrics).
const WATCHED: [&str; 2] = ["managedosversionchannels", "managedosversions"];

/// The error count of each watch of [`WATCHED`].
async fn watch_errors(requests: &Requests) -> Result<Vec<f64>> {
    let text = requests.metrics().await?;
    Ok(WATCHED
        .iter()
        .map(|r| metric(&text, WATCH_ERRORS, &[("resource", r)]))
        .collect())
}

/// Waits until both watches report synced.
async fn watches_synced(requests: &Requests) -> Result<()> {
    poll("both watches synced", SERVED, POLL, async || {
        let text = requests.metrics().await?;
        let synced = WATCHED
            .iter()
            .all(|r| metric(&text, WATCH_SYNCED, &[("resource", r)]) == 1.0);
        Ok(synced.then_some(()))
    })
    .await?;
    Ok(())
}

#[test]
fn failures_by_kind_ignore_successes() -> Result<()> {
    let text = format!(
        "{FETCHES}{{result=\"pulled\"}} 3\n{FETCHES}{{result=\"registry\"}} 2\n\
         {FETCHES}{{result=\"timeout\"}} 1\nother{{result=\"registry\"}} 9\n"
    );
    let before = failures(&text);
    ensure!(before.len() == 2 && before["registry"] == 2.0, "{before:?}");
    let after = failures(&text.replace("timeout\"} 1", "timeout\"} 4"));
    ensure!(grown(&before, &after) == ["timeout"], "{after:?}");
    if !grown(&after, &after).is_empty() {
        bail!("nothing grew");
    }
    Ok(())
}

/// Longest wait, once kube-apiserver is back from a restart, for a MachineInventory created
/// then to be served (issue 35: it was 24.2 s; the goal is 5 s). A poll deadline with room
/// for a loaded machine, well under what the old backoff took.
const RELISTED: Duration = Duration::from_secs(10);
/// How long kube-apiserver and etcd stay down once our watch has failed: long enough for
/// kube-runtime's default backoff to grow past [`RELISTED`] (0.8 s doubling: 12.8 s after
/// 12 s of errors), as in an outage of a real control plane.
const OUTAGE: Duration = Duration::from_secs(15);

/// kube-apiserver and etcd killed for [`OUTAGE`] and started again (issue 35): our
/// reflectors retry within about a second while kube-apiserver is unavailable, resume with a
/// resourceVersion its new watch cache no longer serves (a 410), list again at once, and a
/// MachineInventory created as soon as kube-apiserver is ready is served, by our server and
/// through the aggregator, within [`RELISTED`]; the times are printed.
#[tokio::test]
async fn after_a_restart_the_reflectors_list_again_at_once() -> Result<()> {
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let result = async {
        bed.start_server(&[]).await?;
        restart_rounds(&mut bed).await
    }
    .await;
    bed.finish(result)
}

async fn restart_rounds(bed: &mut TestBed) -> Result<()> {
    let requests = Requests::new(bed)?;
    bed.kubectl_stdin(&["apply", "-f", "-"], &machine("m-before"))
        .await?;
    machine_served(&requests, "m-before", false, SERVED).await?;
    let errors = machine_watch_errors(&requests).await?;
    let stopped = Instant::now();
    bed.stop_control_plane();
    poll("the machine watch failed", SERVED, POLL, async || {
        Ok((machine_watch_errors(&requests).await? > errors).then_some(()))
    })
    .await?;
    // The fault's length, not a wait for an event.
    tokio::time::sleep(OUTAGE).await;
    bed.start_control_plane().await?;
    let down = stopped.elapsed();
    let ready = Instant::now();
    bed.kubectl_stdin(&["apply", "-f", "-"], &machine("m-after"))
        .await?;
    machine_served(&requests, "m-after", true, RELISTED).await?;
    let direct = ready.elapsed();
    machine_served(&requests, "m-after", false, RELISTED).await?;
    let aggregated = ready.elapsed();
    eprintln!(
        "kube-apiserver and etcd restarted (down {down:.1?}): a MachineInventory created once \
         it was ready is served {direct:.1?} after by our server, {aggregated:.1?} after \
         through the aggregator"
    );
    let log = bed.server_log()?;
    ensure!(
        log_lines(&log, &["panicked"])?.is_empty(),
        "the server panicked"
    );
    Ok(())
}

fn machine(name: &str) -> String {
    format!(
        "apiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: {name}\n  namespace: {FLEET_NAMESPACE}\nspec: {{}}\n"
    )
}

/// Waits at most `within` until our list of machines (straight from our server when
/// `direct`, else through the aggregator) names `name`.
async fn machine_served(
    requests: &Requests,
    name: &str,
    direct: bool,
    within: Duration,
) -> Result<()> {
    let (client, base) = if direct {
        (&requests.direct, &requests.server)
    } else {
        (&requests.aggregator, &requests.apiserver)
    };
    let url = format!(
        "{base}/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/machineinventories"
    );
    poll(&format!("{name} served"), within, POLL, async || {
        let (status, body) = Requests::get(client, url.clone()).await?;
        let list: serde_json::Value = if status == 200 {
            serde_json::from_slice(&body)?
        } else {
            serde_json::Value::Null
        };
        let named = list["items"]
            .as_array()
            .is_some_and(|items| items.iter().any(|m| m["metadata"]["name"] == name));
        Ok(named.then_some(()))
    })
    .await?;
    Ok(())
}

/// The error count of our MachineInventory watch.
async fn machine_watch_errors(requests: &Requests) -> Result<f64> {
    let text = requests.metrics().await?;
    Ok(metric(
        &text,
        WATCH_ERRORS,
        &[("resource", "machineinventories")],
    ))
}
