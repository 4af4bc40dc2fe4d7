//! A bounded soak of the real test bed (issue 9, "what to show"): mixed
//! requests through kube-apiserver's aggregator and straight to our server,
//! channel churn (the operator re-syncing a channel to a new image) and one
//! hostile channel (a decompression bomb under a new digest at every churn),
//! for `SOAK_SECONDS` (default 600).
//!
//! Every `SOAK_SAMPLE_SECONDS` (default 10) it samples the server's resident
//! memory and open file descriptors (from `/proc`) and the p50/p99 latency of
//! the requests since the previous sample, and prints a row. At the end comes
//! a verdict: no failed request, every churned image pulled, the bomb
//! refused, and no growth of memory, descriptors or p99 from the middle to
//! the last third of the run (the first third is warm-up). It exits non-zero
//! when the verdict fails.
//!
//! `make soak` runs it (`make soak SOAK_SECONDS=120` for a short one). It is
//! not part of CI.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_integration::fixtures::{OperatorChannel, metric};
use elemental_changelog_integration::generated::Listing;
use elemental_changelog_integration::image::{self, Compression, Format, Image, Layer};
use elemental_changelog_integration::paths::{GROUP_VERSION, summaries_path};
use elemental_changelog_integration::registry::{self, Registry};
use elemental_changelog_integration::testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions};
use elemental_changelog_integration::wait::{POLL, SERVED, poll};

/// Concurrent request loops.
const CLIENTS: usize = 4;
/// How often the churned and the hostile channel get a new image.
const CHURN_EVERY: Duration = Duration::from_secs(15);
/// Versions of the channel that stays put (`from=` requests range over it).
const STABLE_VERSIONS: u32 = 8;
/// Seeds of the first image of the churned and hostile channels; each round's
/// image is from the next seed (fewer than a million rounds: generated CVE ids
/// keep their 10 digits).
const CHURN: u64 = 10_000;
const HOSTILE: u64 = 500_000;
/// The server's periodic digest check.
const REFRESH: &str = "5s";
const FETCHES: &str = "elemental_changelog_channel_fetches_total";
/// `Accept` of a `kubectl get` (server-side Table).
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

fn env_seconds(name: &str, default: u64) -> Result<Duration> {
    let seconds = match std::env::var(name) {
        Ok(text) => text
            .parse()
            .with_context(|| format!("{name}={text}: not a number of seconds"))?,
        Err(_) => default,
    };
    ensure!(seconds > 0, "{name} must be positive");
    Ok(Duration::from_secs(seconds))
}

#[tokio::main]
async fn main() -> Result<()> {
    let duration = env_seconds("SOAK_SECONDS", 600)?;
    let every = env_seconds("SOAK_SAMPLE_SECONDS", 10)?;
    ensure!(
        duration >= every * 3,
        "SOAK_SECONDS must cover at least three samples"
    );
    registry::install_crypto_provider();
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    let result = async {
        bed.start_server_reading(&registry, &["--refresh-interval", REFRESH])
            .await?;
        soak(&bed, &registry, duration, every).await
    }
    .await;
    bed.finish(result)
}

/// Requests answered since the last sample.
#[derive(Default)]
struct Window {
    latencies: Vec<Duration>,
    errors: u64,
    first_errors: Vec<String>,
}

/// One sample row.
struct Sample {
    at: Duration,
    requests: usize,
    errors: u64,
    p50: Duration,
    p99: Duration,
    rss: u64,
    fds: usize,
    churns: u32,
}

/// One kind of request of the mix, answered 200 when all is well.
struct Request {
    url: String,
    direct: bool,
    table: bool,
}

async fn soak(
    bed: &TestBed,
    registry: &Registry,
    duration: Duration,
    every: Duration,
) -> Result<()> {
    let server = bed.server().context("our server is not running")?;
    let pid = server.process().pid().context("our server has no pid")?;
    let client = bed.client();
    let stable = Listing::generate("stable", 1, 1..=STABLE_VERSIONS);
    let stable_digest = push(registry, "stable", &stable, None).await?;
    OperatorChannel::custom(
        &client,
        FLEET_NAMESPACE,
        "stable",
        &registry.image("elemental/stable:latest"),
    )
    .await?
    .sync(&stable.entries())
    .await?;
    let mut churn = OperatorChannel::custom(
        &client,
        FLEET_NAMESPACE,
        "churn",
        &registry.image("elemental/churn:latest"),
    )
    .await?;
    let mut hostile = OperatorChannel::custom(
        &client,
        FLEET_NAMESPACE,
        "hostile",
        &registry.image("elemental/hostile:latest"),
    )
    .await?;
    // 1 GiB of zeros in about 50 KiB: the server must refuse it every time.
    let bomb = image::zero_bomb(Compression::Zstd, "usr/share/zeros", 1 << 30)?;
    churn_once(registry, &mut churn, &mut hostile, &bomb, 0).await?;

    let requests = request_mix(bed)?;
    let aggregator = bed.apiserver_http(Some(&bed.pki().admin))?;
    let direct = bed.server_http(Some(&bed.pki().admin))?;
    let newest = &stable.newest()?.name;
    poll("the stable channel served", SERVED, POLL, async || {
        let url = &requests[0].url;
        let text = aggregator.get(url).send().await?.text().await?;
        Ok(text.contains(&stable_digest).then_some(()))
    })
    .await
    .with_context(|| format!("waiting for {newest}"))?;
    let churn_newest = "churn-v1-4";
    poll("the churned channel served", SERVED, POLL, async || {
        let url = format!("{}{}", server.url(), changelog_path(churn_newest, ""));
        Ok((direct.get(url).send().await?.status() == 200).then_some(()))
    })
    .await?;
    let pulled_at_start = metric(
        &bed.server_metrics().await?,
        FETCHES,
        &[("result", "pulled")],
    );
    let refused_at_start = metric(
        &bed.server_metrics().await?,
        FETCHES,
        &[("result", "limit_exceeded")],
    );

    println!(
        "soak: {duration:?}, a sample every {every:?}, {CLIENTS} request loops, new images every {CHURN_EVERY:?}; server pid {pid}"
    );
    println!(
        "{:>6} {:>9} {:>7} {:>9} {:>9} {:>9} {:>5} {:>7}",
        "t (s)", "requests", "errors", "p50 (ms)", "p99 (ms)", "RSS (MiB)", "fds", "churns"
    );
    let window = Arc::new(Mutex::new(Window::default()));
    let started = Instant::now();
    let deadline = started + duration;
    let requests = Arc::new(requests);
    let mut loops = tokio::task::JoinSet::new();
    for client_index in 0..CLIENTS {
        let (window, requests) = (Arc::clone(&window), Arc::clone(&requests));
        let (aggregator, direct) = (aggregator.clone(), direct.clone());
        loops.spawn(async move {
            let mut n = client_index;
            while Instant::now() < deadline {
                let request = &requests[n % requests.len()];
                n += 1;
                let client = if request.direct { &direct } else { &aggregator };
                let mut builder = client.get(&request.url);
                if request.table {
                    builder = builder.header(reqwest::header::ACCEPT, TABLE);
                }
                let sent = Instant::now();
                let outcome = match builder.send().await {
                    Ok(response) if response.status() == 200 => {
                        response.bytes().await.map(drop).map_err(|e| e.to_string())
                    }
                    Ok(response) => Err(format!(
                        "{}: {}",
                        response.status(),
                        response.text().await.unwrap_or_default()
                    )),
                    Err(error) => Err(error.to_string()),
                };
                let took = sent.elapsed();
                let mut window = window
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                window.latencies.push(took);
                if let Err(error) = outcome {
                    window.errors += 1;
                    if window.first_errors.len() < 5 {
                        window
                            .first_errors
                            .push(format!("GET {}: {error}", request.url));
                    }
                }
            }
        });
    }

    let mut samples = Vec::new();
    let mut churns = 0u32;
    let mut next_churn = started + CHURN_EVERY;
    let mut next_sample = started + every;
    let mut errors_seen = Vec::new();
    while next_sample <= deadline {
        let wake = next_churn.min(next_sample);
        tokio::time::sleep_until(wake.into()).await;
        // No churn in the last period: its image is pulled before the end.
        if Instant::now() >= next_churn && next_churn + CHURN_EVERY <= deadline {
            churns += 1;
            churn_once(registry, &mut churn, &mut hostile, &bomb, churns).await?;
        }
        if Instant::now() >= next_churn {
            next_churn += CHURN_EVERY;
        }
        if Instant::now() >= next_sample {
            let taken = std::mem::take(
                &mut *window
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            errors_seen.extend(taken.first_errors.iter().cloned());
            let sample = sample(pid, started.elapsed(), taken, churns)?;
            println!(
                "{:>6.0} {:>9} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>5} {:>7}",
                sample.at.as_secs_f64(),
                sample.requests,
                sample.errors,
                millis(sample.p50),
                millis(sample.p99),
                mib(sample.rss),
                sample.fds,
                sample.churns
            );
            samples.push(sample);
            next_sample += every;
        }
    }
    while loops.join_next().await.is_some() {}
    let text = bed.server_metrics().await?;
    let pulled = metric(&text, FETCHES, &[("result", "pulled")]) - pulled_at_start;
    let refused = metric(&text, FETCHES, &[("result", "limit_exceeded")]) - refused_at_start;
    let peak = proc_status(pid, "VmHWM:")?;
    verdict(&samples, churns, pulled, refused, peak, &errors_seen)
}

/// Pushes `data` as `elemental/<repository>:latest`, with `extra` as a
/// second layer; returns the manifest digest.
async fn push(
    registry: &Registry,
    repository: &str,
    data: &Listing,
    extra: Option<Layer>,
) -> Result<String> {
    let mut image: Image = data.image(Format::Oci, Compression::Gzip, "amd64");
    if let Some(layer) = extra {
        image = image.layer(layer);
    }
    Ok(
        image::push(registry, &format!("elemental/{repository}:latest"), &image)
            .await?
            .digest,
    )
}

/// The churned channel and the hostile one each get a new image (new
/// advisories under the same version names), and the operator re-syncs them.
async fn churn_once(
    registry: &Registry,
    churn: &mut OperatorChannel,
    hostile: &mut OperatorChannel,
    bomb: &[u8],
    round: u32,
) -> Result<()> {
    let data = Listing::generate("churn", CHURN + u64::from(round), 1..=4);
    push(registry, "churn", &data, None).await?;
    churn.sync(&data.entries()).await?;
    let data = Listing::generate("hostile", HOSTILE + u64::from(round), 1..=2);
    push(
        registry,
        "hostile",
        &data,
        Some(Layer::prebuilt(Compression::Zstd, bomb.to_vec())),
    )
    .await?;
    hostile.sync(&data.entries()).await?;
    Ok(())
}

/// The changelog of `name` in [`FLEET_NAMESPACE`], with `query`.
fn changelog_path(name: &str, query: &str) -> String {
    format!(
        "{}{query}",
        elemental_changelog_integration::paths::changelog_path(FLEET_NAMESPACE, name)
    )
}

/// The mix: changelogs (default `from`, `from=` the oldest, text), summaries
/// (JSON and Table) and discovery through the aggregator; changelogs and
/// `/readyz` straight to the server.
fn request_mix(bed: &TestBed) -> Result<Vec<Request>> {
    let apiserver = bed.apiserver_url();
    let server = bed.server_url()?;
    let via = |path: String, table: bool| Request {
        url: format!("{apiserver}{path}"),
        direct: false,
        table,
    };
    let direct = |path: String| Request {
        url: format!("{server}{path}"),
        direct: true,
        table: false,
    };
    let newest = format!("stable-v1-{STABLE_VERSIONS}");
    let mut mix = vec![
        via(changelog_path(&newest, ""), false),
        via(changelog_path(&newest, "?from=stable-v1-1"), false),
        via(changelog_path("stable-v1-4", "?format=text"), false),
        via(summaries_path(FLEET_NAMESPACE), false),
        via(summaries_path(FLEET_NAMESPACE), true),
        via(GROUP_VERSION.to_owned(), false),
        direct(changelog_path("churn-v1-3", "")),
        direct("/readyz".to_owned()),
    ];
    for n in 2..STABLE_VERSIONS {
        mix.push(via(changelog_path(&format!("stable-v1-{n}"), ""), false));
    }
    Ok(mix)
}

/// A value in kB of `/proc/<pid>/status`, in bytes.
fn proc_status(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("{field} without a value"))?
        .parse()?;
    Ok(kib * 1024)
}

fn sample(pid: u32, at: Duration, mut window: Window, churns: u32) -> Result<Sample> {
    window.latencies.sort_unstable();
    let quantile = |q: f64| {
        let n = window.latencies.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let index = ((n as f64 * q).ceil() as usize).clamp(1, n) - 1;
        window.latencies[index]
    };
    Ok(Sample {
        at,
        requests: window.latencies.len(),
        errors: window.errors,
        p50: quantile(0.50),
        p99: quantile(0.99),
        rss: proc_status(pid, "VmRSS:")?,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count(),
        churns,
    })
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// Prints the summary and the verdict; an error when it fails.
fn verdict(
    samples: &[Sample],
    churns: u32,
    pulled: f64,
    refused: f64,
    peak: u64,
    errors: &[String],
) -> Result<()> {
    let third = samples.len() / 3;
    let (middle, last) = (&samples[third..2 * third], &samples[2 * third..]);
    let of = |part: &[Sample], f: fn(&Sample) -> f64| median(part.iter().map(f).collect());
    let rss = (of(middle, |s| mib(s.rss)), of(last, |s| mib(s.rss)));
    let fds = (
        middle.iter().map(|s| s.fds).max().unwrap_or_default(),
        last.iter().map(|s| s.fds).max().unwrap_or_default(),
    );
    let p99 = (of(middle, |s| millis(s.p99)), of(last, |s| millis(s.p99)));
    let requests: usize = samples.iter().map(|s| s.requests).sum();
    let failed: u64 = samples.iter().map(|s| s.errors).sum();
    let all_p99 = samples.iter().map(|s| millis(s.p99)).fold(0.0, f64::max);
    println!(
        "\n{requests} requests, {failed} failed; worst p99 of a sample {all_p99:.1} ms; {churns} churns: \
         {pulled} images pulled, {refused} bombs refused; peak RSS {:.1} MiB",
        mib(peak)
    );
    let checks = [
        ("no failed request", failed == 0, format!("{failed} failed")),
        (
            "every churned image pulled",
            pulled >= f64::from(churns),
            format!("{pulled} pulled for {churns} churns"),
        ),
        (
            "every bomb refused",
            refused >= f64::from(churns),
            format!("{refused} refused for {churns} churns"),
        ),
        (
            "RSS does not grow (median, last third <= middle third + 10% + 8 MiB)",
            rss.1 <= rss.0 * 1.10 + 8.0,
            format!("{:.1} -> {:.1} MiB", rss.0, rss.1),
        ),
        (
            "open descriptors do not grow (max, last third <= middle third + 8)",
            fds.1 <= fds.0 + 8,
            format!("{} -> {}", fds.0, fds.1),
        ),
        (
            "p99 does not grow (median, last third <= 2 x middle third + 20 ms)",
            p99.1 <= p99.0 * 2.0 + 20.0,
            format!("{:.1} -> {:.1} ms", p99.0, p99.1),
        ),
    ];
    let mut passed = true;
    for (what, ok, figures) in &checks {
        println!("{} {what}: {figures}", if *ok { "PASS" } else { "FAIL" });
        passed &= ok;
    }
    for error in errors {
        println!("  {error}");
    }
    if !passed {
        bail!("the soak failed");
    }
    println!("verdict: PASS");
    Ok(())
}
