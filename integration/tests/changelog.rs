//! Changelogs from channel images, end to end: a real registry (Debian's
//! `docker-registry`, plain and with TLS plus basic auth), a real control
//! plane with the aggregation layer, channels and versions created the way
//! elemental-operator creates them, and channel images these tests build
//! with generated advisories. Requests go through kube-apiserver (kubectl
//! `get --raw` and HTTP) and, for metrics and health, straight to our server.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_apiserver::routes::ready::GZIP_MIN_BYTES;
use elemental_changelog_apiservice::types::ManagedOSVersionChangelog;
use elemental_changelog_integration::{
    fixtures::{OperatorChannel, log_lines, metric, retag},
    generated::Listing,
    image::{self, Compression, Format, Image, Layer},
    paths::changelog_path,
    registry::{Registry, RegistryOptions},
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, elemental::version_resource},
    timing::Phases,
    wait::{POLL, SOON, poll},
};
use kube::{
    Api,
    api::{DynamicObject, ListParams},
};
use serde_json::Value;

/// A second namespace with a channel of the same name and version names.
const TEAM_NAMESPACE: &str = "team-b";
/// Seeds of the generated channels: the `stable` channel of the fleet, the one of
/// `TEAM_NAMESPACE`, the x86_64 and aarch64 images of `multi`.
const STABLE: u64 = 1;
const TEAM_STABLE: u64 = 2;
const MULTI_X86_64: u64 = 3;
const MULTI_AARCH64: u64 = 4;
const FETCHES: &str = "elemental_changelog_channel_fetches_total";

/// GET straight to our server as admin.
async fn get_direct(bed: &TestBed, path: &str) -> Result<(u16, String)> {
    let server = bed.server().context("our server is not running")?;
    let response = bed
        .server_http(Some(&bed.pki().admin))?
        .get(format!("{}{path}", server.url()))
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// Sum of the failed fetches (every result but `pulled`, `unchanged` and `shared`).
fn failed_fetches(text: &str) -> f64 {
    ["pulled", "unchanged", "shared"]
        .iter()
        .fold(metric(text, FETCHES, &[]), |sum, ok| {
            sum - metric(text, FETCHES, &[("result", ok)])
        })
}

/// Waits until the changelog of `namespace/name` (with `query`) is served
/// and `accept` says it is the expected one; returns it and the time taken.
async fn wait_changelog(
    bed: &TestBed,
    namespace: &str,
    name: &str,
    query: &str,
    accept: impl Fn(&ManagedOSVersionChangelog) -> bool,
) -> Result<(ManagedOSVersionChangelog, Duration)> {
    let path = format!("{}{query}", changelog_path(namespace, name));
    poll(&format!("GET {path}"), SOON, POLL, async || {
        let changelog: ManagedOSVersionChangelog = bed.admin_get_json(&path).await?;
        Ok(accept(&changelog).then_some(changelog))
    })
    .await
}

/// The changelog as `kubectl get --raw` prints it.
async fn kubectl_changelog(
    bed: &TestBed,
    namespace: &str,
    name: &str,
    query: &str,
) -> Result<ManagedOSVersionChangelog> {
    let path = format!("{}{query}", changelog_path(namespace, name));
    let out = bed.kubectl_ok(&["get", "--raw", &path]).await?;
    serde_json::from_str(&out).with_context(|| format!("kubectl get --raw {path}: {out}"))
}

/// Waits until the changelog request answers `code` with `reason` as its
/// first cause; returns the `Status`.
async fn wait_status(
    bed: &TestBed,
    namespace: &str,
    name: &str,
    code: u16,
    reason: &str,
) -> Result<Value> {
    let path = changelog_path(namespace, name);
    let (status, _) = poll(
        &format!("GET {path} → {code} {reason}"),
        SOON,
        POLL,
        async || {
            let (status, body) = bed.admin_get_value(&path).await?;
            let matches =
                status == code && body["details"]["causes"][0]["reason"].as_str() == Some(reason);
            if matches {
                Ok(Some(body))
            } else {
                bail!("{status}: {body}")
            }
        },
    )
    .await?;
    ensure!(
        status["kind"] == "Status" && status["code"] == code,
        "{status}"
    );
    Ok(status)
}

/// Waits until `metric_name{labels}` in `/metrics` reaches `at_least`.
async fn wait_metric(
    bed: &TestBed,
    metric_name: &str,
    labels: &[(&str, &str)],
    at_least: f64,
) -> Result<f64> {
    let (value, _) = poll(
        &format!("{metric_name}{labels:?} ≥ {at_least}"),
        SOON,
        POLL,
        async || {
            let value = metric(&bed.server_metrics().await?, metric_name, labels);
            Ok((value >= at_least).then_some(value))
        },
    )
    .await?;
    Ok(value)
}

/// Waits until the server's log has a line with every one of `needles`.
async fn wait_log(bed: &TestBed, needles: &[&str]) -> Result<String> {
    let log = bed.server_log()?;
    let (line, _) = poll(
        &format!("a log line with {needles:?}"),
        SOON,
        POLL,
        async || Ok(log_lines(&log, needles)?.into_iter().next()),
    )
    .await?;
    Ok(line)
}

/// Everything but the registry outage, on one test bed and one server
/// (default refresh interval: every fetch here is due to an operator sync,
/// or to the backoff after a failure).
#[tokio::test]
async fn changelogs_from_channel_images() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let secure = Registry::start_tls_auth("elemental", "changelog-e2e-password").await?;
    // Issue 32: an allowed registry that redirects its blobs to a host that is not.
    let storage = std::net::TcpListener::bind("127.0.0.1:0")?;
    storage.set_nonblocking(true)?;
    let redirecting = Registry::start(RegistryOptions {
        blob_redirect: Some(format!("http://{}", storage.local_addr()?)),
        ..RegistryOptions::default()
    })
    .await?;
    let mut phases = Phases::start();
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), TEAM_NAMESPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    phases.done("test bed");
    let secure_flags = secure.server_flags()?;
    let mut extra: Vec<&str> = secure_flags.iter().map(String::as_str).collect();
    // Small enough that the bomb below is stopped quickly in a debug build.
    extra.extend(["--max-uncompressed-size", "64MiB"]);
    // Issues 26 and 32: the secure registry's credential names no namespace and no flag
    // grants it, so it serves fleet-default's channels only, the default (the server watches
    // every namespace); only the test's two registries may be read.
    let allowed = [
        registry.host().to_owned(),
        secure.host().to_owned(),
        redirecting.host().to_owned(),
    ];
    extra.extend(["--insecure-registry", redirecting.host()]);
    for host in &allowed {
        extra.extend(["--allowed-registry", host]);
    }
    let result = async {
        bed.start_server_reading(&registry, &extra).await?;
        phases.done("server registered and Available");
        let mut stable = precomputed_advisories(&bed, &registry).await?;
        phases.done("precomputed advisories");
        ready_bytes_through_the_aggregator(&bed).await?;
        phases.done("ready bytes");
        namespaces_never_mix(&bed, &registry).await?;
        phases.done("namespaces");
        multi_arch_index(&bed, &registry).await?;
        phases.done("multi-arch");
        json_channel_and_tls_registry(&bed, &secure).await?;
        phases.done("json channel and TLS registry");
        redirect_not_allowed(&bed, &redirecting, &storage).await?;
        phases.done("redirect to a host not allowed");
        resync_and_retained(&bed, &registry, &mut stable).await?;
        phases.done("re-sync and retained versions");
        broken_images(&bed, &registry).await?;
        phases.done("broken images");
        // The first channel was served throughout, and still is.
        let data = Listing::generate("stable", STABLE, 2..=5);
        let (served, _) =
            wait_changelog(&bed, FLEET_NAMESPACE, "stable-v1-5", "", |_| true).await?;
        data.check(&served, "stable-v1-5")?;
        bed.ensure_running()
    }
    .await;
    bed.finish(result)
}

/// A channel of three versions: every version's changelog is exactly what
/// was pushed, through kubectl and HTTP, as JSON and as text.
async fn precomputed_advisories(bed: &TestBed, registry: &Registry) -> Result<OperatorChannel> {
    let data = Listing::generate("stable", STABLE, 1..=3);
    let pushed = image::push(
        registry,
        "elemental/stable:latest",
        &data.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let image_ref = registry.image("elemental/stable:latest");
    let mut channel =
        OperatorChannel::custom(&bed.client(), FLEET_NAMESPACE, "stable", &image_ref).await?;
    channel.sync(&data.entries()).await?;

    let newest = data.newest()?.name.clone();
    let (_, took) = wait_changelog(bed, FLEET_NAMESPACE, &newest, "", |_| true).await?;
    eprintln!("first channel served {took:?} after its sync");
    for version in &data.versions {
        let served = kubectl_changelog(bed, FLEET_NAMESPACE, &version.name, "").await?;
        data.check(&served, &version.name)?;
        ensure!(served.channel.name == "stable", "{:?}", served.channel);
        ensure!(
            served.channel.image.as_deref() == Some(image_ref.as_str()),
            "{:?}",
            served.channel
        );
        ensure!(
            served.channel.digest.as_deref() == Some(pushed.digest.as_str()),
            "{:?}",
            served.channel
        );
        ensure!(!served.channel.retained, "{:?}", served.channel);
        ensure!(served.arch == "x86_64", "arch {}", served.arch);
        ensure!(
            served.metadata.namespace == FLEET_NAMESPACE,
            "{:?}",
            served.metadata
        );
    }

    // The text rendering names every advisory, CVE and bug of the version.
    let text = bed
        .kubectl_ok(&[
            "get",
            "--raw",
            &format!("{}?format=text", changelog_path(FLEET_NAMESPACE, &newest)),
        ])
        .await?;
    let version = data.newest()?;
    ensure!(text.contains(&version.version), "{text}");
    for advisory in data.advisories(&version.name) {
        ensure!(
            names(&text, &advisory.id),
            "{} missing from:\n{text}",
            advisory.id
        );
        for id in advisory.cves.iter().chain(&advisory.bugs) {
            ensure!(text.contains(id.as_str()), "{id} missing from:\n{text}");
        }
    }
    // No advisory of another version leaks into it.
    for other in data.versions.iter().filter(|v| v.name != newest) {
        for advisory in data.advisories(&other.name) {
            ensure!(
                !names(&text, &advisory.id),
                "{} leaked into:\n{text}",
                advisory.id
            );
        }
    }
    Ok(channel)
}

/// Whether `text` names advisory `id`: an occurrence not followed by a digit
/// (generated ids differ in their last number: `…-2025-1` is not `…-2025-12`).
fn names(text: &str, id: &str) -> bool {
    text.match_indices(id)
        .any(|(at, _)| !text[at + id.len()..].starts_with(|c: char| c.is_ascii_digit()))
}

/// Answers are kept ready: through kube-apiserver's aggregator, a changelog reaches the client
/// whole, with the `Content-Length` we sent (an answer under `GZIP_MIN_BYTES` is never
/// compressed, so kube-apiserver's proxy neither decompresses nor streams it), gzip accepted or
/// not; an `If-None-Match` naming the answer gets a 304, and the server counts the repeated
/// requests as hits of its answer cache.
async fn ready_bytes_through_the_aggregator(bed: &TestBed) -> Result<()> {
    let path = format!(
        "{}?from=stable-v1-1",
        changelog_path(FLEET_NAMESPACE, "stable-v1-3")
    );
    let url = format!("{}{path}", bed.apiserver_url());
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let plain = http.get(&url).send().await?;
    ensure!(plain.status() == 200, "{}", plain.status());
    let etag = plain
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .context("no ETag through the aggregator")?
        .to_owned();
    ensure!(plain.headers().get("content-encoding").is_none());
    let length = content_length(&plain);
    let json = plain.bytes().await?.to_vec();
    let _: ManagedOSVersionChangelog = serde_json::from_slice(&json)?;
    ensure!(
        json.len() > 512 && json.len() < GZIP_MIN_BYTES,
        "{} bytes: not a typical changelog",
        json.len()
    );
    ensure!(
        length == Some(json.len()),
        "content-length {length:?} for {} bytes: kube-apiserver streamed the answer",
        json.len()
    );

    let accepting = http
        .get(&url)
        .header("accept-encoding", "gzip")
        .send()
        .await?;
    ensure!(accepting.status() == 200, "{}", accepting.status());
    ensure!(accepting.headers().get("content-encoding").is_none());
    ensure!(content_length(&accepting) == Some(json.len()));
    ensure!(
        accepting.bytes().await?.to_vec() == json,
        "another answer with gzip accepted"
    );

    let conditional = http.get(&url).header("if-none-match", &etag).send().await?;
    ensure!(
        conditional.status() == 304,
        "If-None-Match {etag}: {}",
        conditional.status()
    );
    ensure!(conditional.bytes().await?.is_empty());

    let text = bed.server_metrics().await?;
    let hits = metric(
        &text,
        "elemental_changelog_answer_cache_requests_total",
        &[("result", "hit")],
    );
    ensure!(hits >= 2.0, "answer cache hits {hits}");
    Ok(())
}

/// The same channel and version names in another namespace, with other
/// data: each namespace is served its own.
async fn namespaces_never_mix(bed: &TestBed, registry: &Registry) -> Result<()> {
    let ours = Listing::generate("stable", STABLE, 1..=3);
    let theirs = Listing::generate("stable", TEAM_STABLE, 1..=3);
    let pushed = image::push(
        registry,
        "team/stable:latest",
        &theirs.image(Format::Docker, Compression::Zstd, "amd64"),
    )
    .await?;
    let mut channel = OperatorChannel::custom(
        &bed.client(),
        TEAM_NAMESPACE,
        "stable",
        &registry.image("team/stable:latest"),
    )
    .await?;
    channel.sync(&theirs.entries()).await?;
    wait_changelog(bed, TEAM_NAMESPACE, &theirs.newest()?.name, "", |_| true).await?;
    for version in &theirs.versions {
        let served = kubectl_changelog(bed, TEAM_NAMESPACE, &version.name, "").await?;
        theirs.check(&served, &version.name)?;
        ensure!(served.channel.digest.as_deref() == Some(pushed.digest.as_str()));
        ensure!(served.metadata.namespace == TEAM_NAMESPACE);
        let mine = kubectl_changelog(bed, FLEET_NAMESPACE, &version.name, "").await?;
        ours.check(&mine, &version.name)?;
        ensure!(mine.channel.digest != served.channel.digest);
    }
    Ok(())
}

/// An OCI index with x86_64 and aarch64 images carrying different
/// advisories: the default architecture and `?arch=` each get theirs.
async fn multi_arch_index(bed: &TestBed, registry: &Registry) -> Result<()> {
    let x86 = Listing::generate("multi", MULTI_X86_64, 1..=2);
    let arm = Listing::generate("multi", MULTI_AARCH64, 1..=2);
    let pushed = image::push_index(
        registry,
        "elemental/multi:latest",
        Format::Oci,
        &[
            x86.image(Format::Oci, Compression::Gzip, "amd64"),
            arm.image(Format::Oci, Compression::Zstd, "arm64"),
        ],
    )
    .await?;
    let mut channel = OperatorChannel::custom(
        &bed.client(),
        FLEET_NAMESPACE,
        "multi",
        &registry.image("elemental/multi:latest"),
    )
    .await?;
    channel.sync(&x86.entries()).await?;
    let newest = x86.newest()?.name.clone();
    wait_changelog(bed, FLEET_NAMESPACE, &newest, "", |_| true).await?;
    for version in &x86.versions {
        for (query, data, arch) in [
            ("", &x86, "x86_64"),
            ("?arch=x86_64", &x86, "x86_64"),
            ("?arch=aarch64", &arm, "aarch64"),
            ("?arch=arm64", &arm, "aarch64"),
        ] {
            let served = kubectl_changelog(bed, FLEET_NAMESPACE, &version.name, query).await?;
            data.check(&served, &version.name)
                .with_context(|| format!("{} {query}", version.name))?;
            ensure!(served.arch == arch, "{query}: arch {}", served.arch);
            ensure!(
                served.channel.digest.as_deref() == Some(pushed.digest.as_str()),
                "{query}: {:?}, index {}",
                served.channel,
                pushed.digest
            );
        }
    }
    // An architecture the server does not read is refused, not guessed.
    let (status, body) = bed
        .admin_get(&format!(
            "{}?arch=s390x",
            changelog_path(FLEET_NAMESPACE, &newest)
        ))
        .await?;
    ensure!(status == 400, "s390x: {status} {body}");
    Ok(())
}

/// A `json` channel has no image: 404 with cause ChannelHasNoImage. A
/// channel on a TLS registry with basic auth is served with
/// `--registry-ca-file` and `--registry-config`.
async fn json_channel_and_tls_registry(bed: &TestBed, secure: &Registry) -> Result<()> {
    let client = bed.client();
    let mut json = OperatorChannel::json(
        &client,
        FLEET_NAMESPACE,
        "json-channel",
        "https://example.com/channel.json",
    )
    .await?;
    let listed = Listing::generate("json", 5, [1]);
    json.sync(&listed.entries()).await?;
    let status = wait_status(bed, FLEET_NAMESPACE, "json-v1-1", 404, "ChannelHasNoImage").await?;
    ensure!(status["reason"] == "NotFound", "{status}");
    ensure!(status["details"]["name"] == "json-v1-1", "{status}");
    let out = bed
        .kubectl(&[
            "get",
            "--raw",
            &changelog_path(FLEET_NAMESPACE, "json-v1-1"),
        ])
        .await?;
    ensure!(
        !out.status.success(),
        "a json channel's version has a changelog"
    );
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let data = Listing::generate("secure", 6, 1..=2);
    let pushed = image::push(
        secure,
        "elemental/secure:v1",
        &data.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let mut channel = OperatorChannel::custom(
        &client,
        FLEET_NAMESPACE,
        "secure",
        &secure.image("elemental/secure:v1"),
    )
    .await?;
    channel.sync(&data.entries()).await?;
    for version in &data.versions {
        let (served, _) = wait_changelog(bed, FLEET_NAMESPACE, &version.name, "", |_| true).await?;
        data.check(&served, &version.name)?;
        ensure!(served.channel.digest.as_deref() == Some(pushed.digest.as_str()));
    }
    credentials_stay_in_their_namespace(bed, secure, &data).await
}

/// Issue 26: the same private image named by a channel of a namespace the credential is not
/// granted to is pulled anonymously, refused by the registry (503 `FetchFailed`, kind `auth`,
/// the log naming the namespace), and not served from fleet-default's read of it; an image on
/// a registry that is not allowed is refused without a connection.
async fn credentials_stay_in_their_namespace(
    bed: &TestBed,
    secure: &Registry,
    data: &Listing,
) -> Result<()> {
    let client = bed.client();
    let mut team = OperatorChannel::custom(
        &client,
        TEAM_NAMESPACE,
        "secure",
        &secure.image("elemental/secure:v1"),
    )
    .await?;
    team.sync(&data.entries()).await?;
    let newest = &data.newest()?.name;
    let status = wait_status(bed, TEAM_NAMESPACE, newest, 503, "FetchFailed").await?;
    ensure!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("the registry refused access")),
        "{status}"
    );
    wait_metric(bed, FETCHES, &[("result", "auth")], 1.0).await?;
    let line = wait_log(
        bed,
        &[
            "its credential is not granted to namespace team-b",
            secure.host(),
        ],
    )
    .await?;
    eprintln!("scoped credential: {line}");
    // The start said so (issue 32).
    let line = wait_log(
        bed,
        &[
            "registry credential granted to namespaces fleet-default",
            secure.host(),
        ],
    )
    .await?;
    eprintln!("granted at start: {line}");
    // fleet-default's channel, on the same image, is served throughout.
    let (served, _) = wait_changelog(bed, FLEET_NAMESPACE, newest, "", |_| true).await?;
    data.check(&served, newest)?;

    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0")?;
    elsewhere.set_nonblocking(true)?;
    let probe = Listing::generate("probe", 4, [1]);
    let mut probing = OperatorChannel::custom(
        &client,
        FLEET_NAMESPACE,
        "probe",
        &format!("{}/internal/service:v1", elsewhere.local_addr()?),
    )
    .await?;
    probing.sync(&probe.entries()).await?;
    let status = wait_status(
        bed,
        FLEET_NAMESPACE,
        &probe.newest()?.name,
        503,
        "FetchFailed",
    )
    .await?;
    ensure!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("not one the server may read from")),
        "{status}"
    );
    wait_metric(bed, FETCHES, &[("result", "registry_not_allowed")], 1.0).await?;
    ensure!(
        elsewhere.accept().map_err(|e| e.kind()).err() == Some(std::io::ErrorKind::WouldBlock),
        "the server connected to a registry that is not allowed"
    );
    Ok(())
}

/// Issue 32: a channel on an allowed registry that redirects its blobs to a host that is not
/// allowed: 503 `FetchFailed` naming the kind `registry_not_allowed`, counted, logged with the
/// redirect's target; the target saw no connection.
async fn redirect_not_allowed(
    bed: &TestBed,
    redirecting: &Registry,
    storage: &std::net::TcpListener,
) -> Result<()> {
    let data = Listing::generate("redirected", 7, [1]);
    image::push(
        redirecting,
        "elemental/redirected:v1",
        &data.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let mut channel = OperatorChannel::custom(
        &bed.client(),
        FLEET_NAMESPACE,
        "redirected",
        &redirecting.image("elemental/redirected:v1"),
    )
    .await?;
    channel.sync(&data.entries()).await?;
    let status = wait_status(
        bed,
        FLEET_NAMESPACE,
        &data.newest()?.name,
        503,
        "FetchFailed",
    )
    .await?;
    ensure!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("(registry_not_allowed)")),
        "{status}"
    );
    wait_metric(bed, FETCHES, &[("result", "registry_not_allowed")], 2.0).await?;
    let storage_host = storage.local_addr()?.to_string();
    let line = wait_log(bed, &["redirect to http://", &storage_host, "refused"]).await?;
    eprintln!("redirect refused: {line}");
    ensure!(
        storage.accept().map_err(|e| e.kind()).err() == Some(std::io::ErrorKind::WouldBlock),
        "the server followed a redirect to a host that is not allowed"
    );
    Ok(())
}

/// A re-sync to a new digest with a new version is served (timed); then an
/// image that drops the oldest version: it stays served, marked retained,
/// while its ManagedOSVersion exists, and goes with it.
async fn resync_and_retained(
    bed: &TestBed,
    registry: &Registry,
    channel: &mut OperatorChannel,
) -> Result<()> {
    let four = Listing::generate("stable", STABLE, 1..=4);
    let second = image::push(
        registry,
        "elemental/stable:latest",
        &four.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let synced = Instant::now();
    channel.sync(&four.entries()).await?;
    let (served, took) = wait_changelog(bed, FLEET_NAMESPACE, "stable-v1-4", "", |c| {
        c.channel.digest.as_deref() == Some(second.digest.as_str())
    })
    .await?;
    eprintln!(
        "re-sync to a new digest served in {took:?} ({:?} after the sync started)",
        synced.elapsed()
    );
    four.check(&served, "stable-v1-4")?;
    // The versions already there now come from the new image too.
    let older = kubectl_changelog(bed, FLEET_NAMESPACE, "stable-v1-2", "").await?;
    four.check(&older, "stable-v1-2")?;
    ensure!(older.channel.digest.as_deref() == Some(second.digest.as_str()));

    // The next image lists 2..=5 only; stable-v1-1's ManagedOSVersion stays.
    let all = Listing::generate("stable", STABLE, 1..=5);
    let current = Listing::generate("stable", STABLE, 2..=5);
    let third = image::push(
        registry,
        "elemental/stable:latest",
        &current.image(Format::Oci, Compression::Zstd, "amd64"),
    )
    .await?;
    channel.sync(&current.entries()).await?;
    let (served, _) = wait_changelog(bed, FLEET_NAMESPACE, "stable-v1-5", "", |c| {
        c.channel.digest.as_deref() == Some(third.digest.as_str())
    })
    .await?;
    all.check(&served, "stable-v1-5")?;
    let retained = kubectl_changelog(bed, FLEET_NAMESPACE, "stable-v1-1", "").await?;
    all.check(&retained, "stable-v1-1")?;
    ensure!(
        retained.channel.retained,
        "not retained: {:?}",
        retained.channel
    );
    ensure!(
        retained.channel.digest.as_deref() == Some(second.digest.as_str()),
        "retained data should name the image it came from: {:?}",
        retained.channel
    );
    // It keeps its place in the order: the next version still follows it.
    let next = kubectl_changelog(bed, FLEET_NAMESPACE, "stable-v1-2", "").await?;
    all.check(&next, "stable-v1-2")?;
    ensure!(
        !next.channel.retained && next.channel.digest.as_deref() == Some(third.digest.as_str())
    );
    wait_metric(bed, "elemental_changelog_retained_versions", &[], 1.0).await?;

    // Deleting the ManagedOSVersion drops the retained data...
    channel.delete_version("stable-v1-1").await?;
    let path = changelog_path(FLEET_NAMESPACE, "stable-v1-1");
    poll(
        "the deleted version's changelog is gone",
        SOON,
        POLL,
        async || {
            let (status, body) = bed.admin_get_value(&path).await?;
            Ok((status == 404 && body["reason"] == "NotFound").then_some(()))
        },
    )
    .await?;
    poll("retained versions back to 0", SOON, POLL, async || {
        let value = metric(
            &bed.server_metrics().await?,
            "elemental_changelog_retained_versions",
            &[],
        );
        Ok((value == 0.0).then_some(()))
    })
    .await?;
    let (_, took) = wait_changelog(bed, FLEET_NAMESPACE, "stable-v1-2", "", |c| {
        c.from.is_none()
    })
    .await?;
    eprintln!("retained data dropped {took:?} after its ManagedOSVersion");
    current.check(
        &kubectl_changelog(bed, FLEET_NAMESPACE, "stable-v1-2", "").await?,
        "stable-v1-2",
    )?;
    // ...for good: the same ManagedOSVersion created again has no data.
    let mut entries = all.entries();
    entries.truncate(1);
    channel.sync(&entries).await?;
    let status = wait_status(bed, FLEET_NAMESPACE, "stable-v1-1", 404, "NoChangelogData").await?;
    ensure!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains(&third.digest)),
        "{status}"
    );
    Ok(())
}

/// What a broken image does to a fresh channel (503 FetchFailed naming the
/// kind, a log line, a metric) and to a channel with good data (keeps it).
struct Breakage {
    /// Short name (also the channel and repository name suffix).
    name: &'static str,
    /// The fetch result label it counts under.
    kind: &'static str,
    /// Words of the log line it writes (besides the channel name).
    log: &'static str,
}

const UNUSABLE: &str = "channel image is unusable; keeping the last good data";
const FETCH_FAILED: &str = "fetching the channel image failed; keeping the last good data";

const BREAKAGES: [Breakage; 5] = [
    Breakage {
        name: "invalid-json",
        kind: "invalid_channel_json",
        log: UNUSABLE,
    },
    Breakage {
        name: "traversal",
        kind: "missing_channel_json",
        log: UNUSABLE,
    },
    Breakage {
        name: "bomb",
        kind: "limit_exceeded",
        log: FETCH_FAILED,
    },
    Breakage {
        name: "digest-mismatch",
        kind: "digest_mismatch",
        log: FETCH_FAILED,
    },
    Breakage {
        name: "missing-blob",
        kind: "not_found",
        log: FETCH_FAILED,
    },
];

/// Pushes a broken image of kind `breakage` as `<repository>:<tag>`, built
/// around `data` (whose own files are fine).
async fn push_broken(
    registry: &Registry,
    repository: &str,
    tag: &str,
    breakage: &Breakage,
    data: &Listing,
) -> Result<String> {
    let reference = format!("{repository}:{tag}");
    let good = || data.image(Format::Oci, Compression::Gzip, "amd64");
    let pushed = match breakage.name {
        "invalid-json" => {
            let mut files = data.files();
            files[0].1 = br#"[{"metadata":{"name":"broken"},"spec":{"version":"#.to_vec();
            image::push(
                registry,
                &reference,
                &Image::channel(Format::Oci, Compression::Gzip, &files),
            )
            .await?
        }
        "traversal" => {
            // channel.json only where it escapes the root, or as a link out of it.
            let channel_json = data.channel_json();
            let layer = Layer::new(Compression::Gzip)
                .file("../channel.json", channel_json.clone())
                .file("changelogs/../../channel.json", channel_json.clone())
                .file("/../../etc/elemental/channel.json", channel_json)
                .file(
                    "changelogs/../../../etc/cron.d/evil.updates.log",
                    "* * * * * root true",
                )
                .symlink("channel.json", "../../../../etc/passwd")
                .hard_link("changelogs/x.updates.log", "/etc/shadow");
            image::push(registry, &reference, &Image::new(Format::Oci).layer(layer)).await?
        }
        "bomb" => {
            // 1 GiB of zeros in about 50 KiB of zstd, over good data.
            let bomb = image::zero_bomb(Compression::Zstd, "bin/zeros", 1 << 30)?;
            image::push(
                registry,
                &reference,
                &good().layer(Layer::prebuilt(Compression::Zstd, bomb)),
            )
            .await?
        }
        "digest-mismatch" => {
            let pushed = image::push(registry, &reference, &good()).await?;
            registry.corrupt_blob(&pushed.layer_digests[0])?;
            pushed
        }
        "missing-blob" => {
            let pushed = image::push(registry, &reference, &good()).await?;
            registry
                .delete_blob(repository, &pushed.layer_digests[0])
                .await?;
            pushed
        }
        other => bail!("unknown breakage {other}"),
    };
    Ok(pushed.digest)
}

/// Peak resident memory of a process, in bytes.
fn peak_rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("VmHWM without a value")?
        .parse()?;
    Ok(kib * 1024)
}

/// Broken images leave the server up, log the reason, count in metrics,
/// and neither disturb other channels nor replace a channel's good data.
async fn broken_images(bed: &TestBed, registry: &Registry) -> Result<()> {
    let client = bed.client();
    let log = bed.server_log()?;

    // Fresh channels whose only image is broken.
    for (index, breakage) in BREAKAGES.iter().enumerate() {
        let before = metric(
            &bed.server_metrics().await?,
            FETCHES,
            &[("result", breakage.kind)],
        );
        let name = format!("broken-{}", breakage.name);
        let data = Listing::generate(&name, 10 + index as u64, [1]);
        let repository = format!("broken/{}", breakage.name);
        let digest = push_broken(registry, &repository, "v1", breakage, &data).await?;
        let mut channel = OperatorChannel::custom(
            &client,
            FLEET_NAMESPACE,
            &name,
            &registry.image(&format!("{repository}:v1")),
        )
        .await?;
        channel.sync(&data.entries()).await?;
        let version = &data.newest()?.name;
        let status = wait_status(bed, FLEET_NAMESPACE, version, 503, "FetchFailed").await?;
        ensure!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains(breakage.kind)),
            "{}: {status}",
            breakage.name
        );
        wait_metric(bed, FETCHES, &[("result", breakage.kind)], before + 1.0).await?;
        let line = wait_log(bed, &[&name, breakage.log, breakage.kind]).await?;
        eprintln!("{}: {line}", breakage.name);
        if breakage.name == "traversal" {
            // The entries themselves are reported: 4 paths that leave the
            // root, a symbolic and a hard link where channel data is read.
            let line = wait_log(
                bed,
                &[
                    "ignored layer entries",
                    "count=6",
                    "../channel.json",
                    "broken/traversal:v1",
                ],
            )
            .await?;
            eprintln!("{}: {line}", breakage.name);
        }
        if breakage.log == UNUSABLE {
            ensure!(
                line.contains(&digest),
                "the log line does not name the digest: {line}"
            );
        }
        ensure!(
            line.contains(&format!("{repository}:v1")),
            "the log line does not name the image: {line}"
        );
        bed.server()
            .context("our server is not running")?
            .process()
            .pid()
            .context("our server has no pid")?;
    }
    let pid = bed
        .server()
        .and_then(|s| s.process().pid())
        .context("our server has no pid")?;
    let peak = peak_rss(pid)?;
    eprintln!("server peak RSS after the bomb: {} MiB", peak >> 20);
    ensure!(
        peak < 256 << 20,
        "the bomb filled memory: peak RSS {peak} bytes"
    );
    ensure!(
        log_lines(&log, &["panicked"])?.is_empty(),
        "the server panicked: {:?}",
        log_lines(&log, &["panicked"])?
    );

    // A channel with good data, then each kind of broken image in turn: the
    // good data stays, with its digest.
    let good = Listing::generate("degrading", 20, 1..=2);
    let repository = "elemental/degrading";
    let pushed = image::push(
        registry,
        &format!("{repository}:latest"),
        &good.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let mut channel = OperatorChannel::custom(
        &client,
        FLEET_NAMESPACE,
        "degrading",
        &registry.image(&format!("{repository}:latest")),
    )
    .await?;
    channel.sync(&good.entries()).await?;
    let newest = good.newest()?.name.clone();
    wait_changelog(bed, FLEET_NAMESPACE, &newest, "", |_| true).await?;
    let good_image = registry.image(&format!("{repository}:latest"));
    for (round, breakage) in BREAKAGES.iter().enumerate() {
        let before = metric(
            &bed.server_metrics().await?,
            FETCHES,
            &[("result", breakage.kind)],
        );
        // Each round's broken image is prepared under a tag nobody reads (so
        // that no fetch sees it half-broken), with new content (a new digest).
        let staging = format!("round-{round}");
        let data = Listing::generate("degrading", 21 + round as u64, 1..=3);
        push_broken(registry, repository, &staging, breakage, &data).await?;
        if breakage.name == "missing-blob" {
            // The registry refuses a manifest whose blob is gone under a new
            // tag: the channel is pointed at the broken image instead.
            channel
                .set_image(&registry.image(&format!("{repository}:{staging}")))
                .await?;
        } else {
            retag(registry, repository, &staging, "latest").await?;
        }
        channel.sync(&good.entries()).await?;
        wait_metric(bed, FETCHES, &[("result", breakage.kind)], before + 1.0)
            .await
            .with_context(|| format!("degrading channel, {}", breakage.name))?;
        for version in &good.versions {
            let served = kubectl_changelog(bed, FLEET_NAMESPACE, &version.name, "").await?;
            good.check(&served, &version.name)
                .with_context(|| format!("after {}", breakage.name))?;
            ensure!(
                served.channel.digest.as_deref() == Some(pushed.digest.as_str())
                    && served.channel.image.as_deref() == Some(good_image.as_str()),
                "after {}: {:?}",
                breakage.name,
                served.channel
            );
        }
    }

    // Other channels were not disturbed, and the server still answers.
    let multi = Listing::generate("multi", MULTI_AARCH64, 1..=2);
    multi.check(
        &kubectl_changelog(bed, FLEET_NAMESPACE, "multi-v1-2", "?arch=aarch64").await?,
        "multi-v1-2",
    )?;
    let (status, _) = get_direct(bed, "/readyz").await?;
    ensure!(status == 200, "/readyz: {status}");
    Ok(())
}

/// The periodic digest check picks up a new image without any operator
/// sync; with the registry gone, the last good data stays served, `/readyz`
/// stays 200 and the failures are counted.
#[tokio::test]
async fn periodic_refresh_and_registry_outage() -> Result<()> {
    let mut registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    let result = async {
        bed.start_server_reading(&registry, &["--refresh-interval", "2s"])
            .await?;
        outage(&bed, &mut registry).await
    }
    .await;
    bed.finish(result)
}

async fn outage(bed: &TestBed, registry: &mut Registry) -> Result<()> {
    let first = Listing::generate("periodic", 30, 1..=2);
    image::push(
        registry,
        "elemental/periodic:latest",
        &first.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let mut channel = OperatorChannel::custom(
        &bed.client(),
        FLEET_NAMESPACE,
        "periodic",
        &registry.image("elemental/periodic:latest"),
    )
    .await?;
    channel.sync(&first.entries()).await?;
    wait_changelog(bed, FLEET_NAMESPACE, "periodic-v1-2", "", |_| true).await?;
    // Digest checks that pull nothing.
    wait_metric(bed, FETCHES, &[("result", "unchanged")], 1.0).await?;

    // A new image under the same tag, and the operator's version for it,
    // without touching the channel: the periodic check finds it.
    let second = Listing::generate("periodic", 30, 1..=3);
    let pushed = image::push(
        registry,
        "elemental/periodic:latest",
        &second.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let versions: Api<DynamicObject> =
        Api::namespaced_with(bed.client(), FLEET_NAMESPACE, &version_resource());
    let before = versions.list(&ListParams::default()).await?.items.len();
    let mut entries = second.entries();
    entries.drain(..2);
    // Only the version objects: a sync would also patch the status and trigger a fetch.
    channel.create_versions(&entries).await?;
    ensure!(versions.list(&ListParams::default()).await?.items.len() == before + 1);
    let (served, took) = wait_changelog(bed, FLEET_NAMESPACE, "periodic-v1-3", "", |c| {
        c.channel.digest.as_deref() == Some(pushed.digest.as_str())
    })
    .await?;
    eprintln!("new digest found by the periodic check in {took:?}");
    second.check(&served, "periodic-v1-3")?;

    // The registry goes away.
    let text = bed.server_metrics().await?;
    let failed_before = failed_fetches(&text);
    registry.stop();
    let (_, took) = poll("a failed fetch counted", SOON, POLL, async || {
        Ok((failed_fetches(&bed.server_metrics().await?) > failed_before).then_some(()))
    })
    .await?;
    eprintln!("registry outage counted {took:?} after it began");
    let line = wait_log(bed, &["=periodic", FETCH_FAILED]).await?;
    eprintln!("outage: {line}");
    // A few more failed checks (with backoff), and still everything is served.
    let failed_now = failed_fetches(&bed.server_metrics().await?);
    poll("a second failed fetch", SOON, POLL, async || {
        Ok((failed_fetches(&bed.server_metrics().await?) > failed_now).then_some(()))
    })
    .await?;
    for version in &second.versions {
        let served = kubectl_changelog(bed, FLEET_NAMESPACE, &version.name, "").await?;
        second.check(&served, &version.name)?;
        ensure!(served.channel.digest.as_deref() == Some(pushed.digest.as_str()));
    }
    let (status, body) = get_direct(bed, "/readyz?verbose").await?;
    ensure!(status == 200, "/readyz during the outage: {status}\n{body}");
    let ready = bed.kubectl_ok(&["get", "--raw", "/readyz"]).await?;
    ensure!(ready.trim() == "ok", "kube-apiserver /readyz: {ready}");
    Ok(())
}

/// The `Content-Length` of a response, when it has one.
fn content_length(response: &reqwest::Response) -> Option<usize> {
    response
        .headers()
        .get("content-length")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}
