//! What an authenticated client, or a viewer of one namespace, can make the server spend or
//! show (issue 17, "Keys an authorized viewer chooses" and "Data a user or a channel
//! chooses"), against the real binary behind a real kube-apiserver with an audit log:
//!
//! 1. **Terminal escapes**: an advisory title full of escape sequences reaches `format=text`
//!    and `format=markdown` (through the aggregator) and the Table only as visible escapes: no
//!    ESC byte, no bidirectional override.
//! 2. **`from=` is authorized**: a user whose Role names one ManagedOSVersion (`resourceNames`)
//!    reads its changelog, but not its diff against a version the Role does not name (403).
//! 3. **Health probes review no token**: 1,000 `/livez` and `/readyz` requests with distinct
//!    random bearer tokens are answered 200 and cause no TokenReview (counted in
//!    kube-apiserver's audit log).
//! 4. **Renders do not park the async threads**: while hundreds of identical requests wait for
//!    one slow render (5,000 advisories as text and Markdown, with its gzip form), `/livez` keeps answering
//!    before the render ends (p99 printed).
//! 5. **Keys count in the answer cache**: CVE ids of thousands of digits are refused (400), and
//!    a flood of distinct valid `cve=` lists from a viewer of one namespace leaves RSS within the
//!    answer cache size plus a constant.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Reference, Severity};
use elemental_changelog_integration::audit::AuditLog;
use elemental_changelog_integration::bench::rss;
use elemental_changelog_integration::fixtures::metric;
use elemental_changelog_integration::generated::updates_log;
use elemental_changelog_integration::paths::{self, GROUP_VERSION, summaries_path};
use elemental_changelog_integration::publish;
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::elemental::{self, VersionEntry};
use elemental_changelog_integration::testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions};
use elemental_changelog_integration::wait::{POLL, SOON, poll};
use k8s_openapi::jiff::Timestamp;
use reqwest::StatusCode;
use serde_json::Value;

const CHANNEL: &str = "viewers";
/// `big` carries [`BIG_ADVISORIES`] advisories; `evil` the hostile title; `small` little.
const VERSIONS: [&str; 3] = ["small", "evil", "big"];
const BIG_ADVISORIES: usize = 5_000;
/// An advisory title that would clear the screen, set the title, hide a link, rewrite the
/// line and reverse the text, were it printed as is.
const EVIL_TITLE: &str = "update\u{1b}[2J\u{1b}]0;pwned\u{7}\u{1b}]8;;http://evil.example\u{1b}\\link\u{1b}]8;;\u{1b}\\\r\u{9b}31m\u{202e}gpj.exe";
/// Identical requests waiting for each slow render.
const RENDER_WAITERS: usize = 100;
/// `/livez` answers each round of renders must see before its last render is answered. A
/// server whose async threads wait for the render answers none (every thread is parked
/// until the render ends); latency is printed, not asserted (this machine is noisy).
const MIN_PROBES_DURING_RENDERS: usize = 3;
/// `--answer-cache-size` of the server under test.
const ANSWER_CACHE: u64 = 8 << 20;
/// Distinct `cve=` lists in the key flood.
const CVE_FLOOD: usize = 20_000;
/// RSS growth allowed past the answer cache size (allocator slack, the review cache).
const RSS_SLACK_KIB: u64 = 24 << 10;

const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources:
  - group: authentication.k8s.io
    resources: [tokenreviews]
- level: None
";

#[tokio::test]
async fn viewers_and_clients_are_bounded() -> Result<()> {
    let audit = AuditLog::new(AUDIT_POLICY)?;
    let log = audit.path().to_owned();
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        apiserver_args: audit.apiserver_args(),
        namespaces: vec![FLEET_NAMESPACE.to_owned()],
    })
    .await?;
    bed.start_server_reading(&registry, &[&format!("--answer-cache-size={ANSWER_CACHE}")])
        .await?;
    let result = async {
        publish_channel(&bed, &registry).await?;
        bind_roles(&bed).await?;
        text_outputs_carry_no_terminal_escapes(&bed).await?;
        from_is_authorized(&bed).await?;
        health_probes_review_no_token(&bed, &log).await?;
        renders_leave_the_async_threads_free(&bed).await?;
        chosen_keys_are_bounded(&bed).await
    }
    .await;
    bed.finish(result)
}

// ---------------------------------------------------------------------------
// 1. Terminal escapes

async fn text_outputs_carry_no_terminal_escapes(bed: &TestBed) -> Result<()> {
    for format in ["text", "markdown"] {
        let (status, text) = bed
            .admin_get(&format!(
                "{}?format={format}",
                paths::changelog_path(FLEET_NAMESPACE, "evil")
            ))
            .await?;
        ensure!(status == StatusCode::OK, "{format}: {status}");
        ensure!(
            !text.contains('\u{1b}') && !text.contains('\u{9b}') && !text.contains('\r'),
            "{format}: a terminal control character is served:\n{text:?}"
        );
        ensure!(
            !text.contains('\u{202e}') && !text.contains('\u{7}'),
            "{format}: a bidi override or BEL is served:\n{text:?}"
        );
        ensure!(
            text.contains("\\x1b") && text.contains("\\u{202e}"),
            "{format}: the escapes are not shown visibly:\n{text}"
        );
    }
    // The JSON keeps the data as it is (JSON escapes control characters itself).
    let (_, body) = bed
        .admin_get_value(&paths::changelog_path(FLEET_NAMESPACE, "evil"))
        .await?;
    ensure!(
        body["advisories"][0]["title"] == EVIL_TITLE,
        "the JSON changed the title: {}",
        body["advisories"][0]["title"]
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. `from=` authorization

async fn from_is_authorized(bed: &TestBed) -> Result<()> {
    let http = bed.apiserver_http(None)?;
    let token = bed.token("alice")?.to_owned();
    let get = async |path: &str| -> Result<(StatusCode, String)> {
        let response = http
            .get(format!("{}{path}", bed.apiserver_url()))
            .bearer_auth(&token)
            .send()
            .await?;
        Ok((response.status(), response.text().await?))
    };
    let evil = paths::changelog_path(FLEET_NAMESPACE, "evil");
    poll("alice's Role takes effect", SOON, POLL, async || {
        Ok((get(&evil).await?.0 == StatusCode::OK).then_some(()))
    })
    .await?;
    // Both named by her Role: allowed.
    let (status, body) = get(&format!("{evil}?from=small")).await?;
    ensure!(
        status == StatusCode::OK,
        "from a named version: {status} {body}"
    );
    // `big` is not hers: neither directly nor as `from`.
    let (status, body) = get(&paths::changelog_path(FLEET_NAMESPACE, "big")).await?;
    ensure!(status == StatusCode::FORBIDDEN, "big: {status} {body}");
    for query in ["from=big", "from=b%69g", "from=big&from=small"] {
        let (status, body) = get(&format!("{evil}?{query}")).await?;
        ensure!(
            status == StatusCode::FORBIDDEN,
            "{query}: alice read a diff against a version she may not read: {status} {body}"
        );
        let status: Value = serde_json::from_str(&body)?;
        ensure!(
            status["details"]["name"] == "big" && status["reason"] == "Forbidden",
            "{query}: the 403 does not name the refused version: {status}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. Health probes

async fn health_probes_review_no_token(bed: &TestBed, log: &Path) -> Result<()> {
    let http = bed.server_http(None)?;
    let url = server_url(bed)?;
    let before = token_reviews(log)?;
    let started = Instant::now();
    let mut probes = tokio::task::JoinSet::new();
    for n in 0..1000_u32 {
        let (http, url) = (http.clone(), url.clone());
        probes.spawn(async move {
            let path = if n % 2 == 0 { "/livez" } else { "/readyz" };
            let response = http
                .get(format!("{url}{path}"))
                .bearer_auth(format!(
                    "random-token-{n}-{}",
                    n.wrapping_mul(2_654_435_761)
                ))
                .send()
                .await?;
            Ok::<_, anyhow::Error>(response.status())
        });
        // At most 50 at once.
        if probes.len() >= 50 {
            let status = probes.join_next().await.context("a probe")???;
            ensure!(status == StatusCode::OK, "a probe with a token: {status}");
        }
    }
    while let Some(status) = probes.join_next().await {
        let status = status??;
        ensure!(status == StatusCode::OK, "a probe with a token: {status}");
    }
    // A request that is reviewed afterwards proves the audit log is written meanwhile.
    let (status, _) = {
        let response = http
            .get(format!("{url}{GROUP_VERSION}"))
            .bearer_auth("a-token-that-is-reviewed")
            .send()
            .await?;
        (response.status(), ())
    };
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "unknown token: {status}"
    );
    let (after, _) = poll(
        "the reviewed token in the audit log",
        SOON,
        POLL,
        async || {
            let now = token_reviews(log)?;
            Ok((now > before).then_some(now))
        },
    )
    .await?;
    println!(
        "health: 1000 probes with random tokens in {:?}; TokenReviews {before} -> {after}",
        started.elapsed()
    );
    ensure!(
        after == before + 1,
        "probes started {} TokenReviews",
        after - before - 1
    );
    Ok(())
}

/// TokenReviews created, by kube-apiserver's audit log.
fn token_reviews(log: &Path) -> Result<usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| {
            event["stage"] == "ResponseComplete"
                && event["verb"] == "create"
                && event["objectRef"]["resource"] == "tokenreviews"
        })
        .count())
}

// ---------------------------------------------------------------------------
// 4. Renders off the async threads

async fn renders_leave_the_async_threads_free(bed: &TestBed) -> Result<()> {
    let http = bed.server_http(Some(&bed.pki().front_proxy_client))?;
    let prober = bed.server_http(None)?;
    let url = server_url(bed)?;
    // Open the connections first (TLS handshakes are work for the async threads too, and not
    // what this measures): the rounds reuse them.
    let mut warm = tokio::task::JoinSet::new();
    for _ in 0..RENDER_WAITERS {
        let (http, url) = (http.clone(), url.clone());
        warm.spawn(async move {
            http.get(format!(
                "{url}{}",
                paths::changelog_path(FLEET_NAMESPACE, "small")
            ))
            .header("X-Remote-User", "admin")
            .header("X-Remote-Group", "system:masters")
            .send()
            .await?
            .bytes()
            .await?;
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(done) = warm.join_next().await {
        done??;
    }
    let mut latencies = Vec::new();
    let mut rounds = Vec::new();
    // Each round is a new answer (format, `from`), so every request of the round waits for one
    // render: checked with the server's render count (cache misses), since an arch alias or a
    // format already asked for would be answered from the cache and measure nothing.
    for query in [
        "format=text",
        "format=markdown",
        "format=text&from=small",
        "format=markdown&from=small",
        "format=json&from=evil",
    ] {
        let misses_before = answer_cache_misses(bed).await?;
        let path = format!("{}?{query}", paths::changelog_path(FLEET_NAMESPACE, "big"));
        let mut renders = tokio::task::JoinSet::new();
        for n in 0..RENDER_WAITERS {
            let (http, url, path) = (http.clone(), url.clone(), path.clone());
            // HEAD (answered like GET, without the body) for all but one, so that the round
            // measures waiting for the render, not sending its bytes.
            let method = if n == 0 {
                reqwest::Method::GET
            } else {
                reqwest::Method::HEAD
            };
            renders.spawn(async move {
                let started = Instant::now();
                let response = http
                    .request(method, format!("{url}{path}"))
                    .header("X-Remote-User", "admin")
                    .header("X-Remote-Group", "system:masters")
                    .header("Accept-Encoding", "gzip")
                    .send()
                    .await?;
                let status = response.status();
                let bytes = if n == 0 {
                    response.bytes().await?.len()
                } else {
                    0
                };
                Ok::<_, anyhow::Error>((status, n, bytes, started.elapsed()))
            });
        }
        // Probe while the renders pile up: the probes answered before the round's last
        // render is answered are the ones a parked server could not have answered.
        let rendered = std::sync::atomic::AtomicBool::new(false);
        let probe = async {
            let mut round = Vec::new();
            let mut before_rendered = 0_usize;
            while !rendered.load(std::sync::atomic::Ordering::SeqCst) {
                let started = Instant::now();
                let status = prober.get(format!("{url}/livez")).send().await?.status();
                ensure!(status == StatusCode::OK, "/livez: {status}");
                round.push(started.elapsed());
                if !rendered.load(std::sync::atomic::Ordering::SeqCst) {
                    before_rendered += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok::<_, anyhow::Error>((round, before_rendered))
        };
        let ((round, before_rendered), waited) = tokio::try_join!(probe, async {
            let mut waited = Duration::ZERO;
            while let Some(done) = renders.join_next().await {
                let (status, n, bytes, took) = done??;
                ensure!(status == StatusCode::OK, "{query}: {status}");
                ensure!(n != 0 || bytes > 1 << 10, "{query}: only {bytes} bytes");
                waited = waited.max(took);
            }
            rendered.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(waited)
        })?;
        let renders = answer_cache_misses(bed).await? - misses_before;
        ensure!(
            renders >= 1.0,
            "{query}: answered from the answer cache (no render), so the round measures nothing"
        );
        ensure!(
            before_rendered >= MIN_PROBES_DURING_RENDERS,
            "{query}: only {before_rendered} /livez answered during {waited:?} of renders"
        );
        latencies.extend(round);
        rounds.push((waited, renders, before_rendered));
    }
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    let max = latencies.last().copied().unwrap_or_default();
    println!(
        "renders: /livez during 5 rounds of {RENDER_WAITERS} identical uncached renders: p99 {p99:?}, max {max:?}; (round, renders, /livez answered during it): {rounds:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 5. Keys a viewer chooses

async fn chosen_keys_are_bounded(bed: &TestBed) -> Result<()> {
    let http = bed.server_http(Some(&bed.pki().front_proxy_client))?;
    let url = server_url(bed)?;
    let list = summaries_path(FLEET_NAMESPACE);
    let get = {
        let (http, url) = (http.clone(), url.clone());
        move |query: String| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let response = http
                    .get(format!("{url}{query}"))
                    .header("X-Remote-User", "viewer")
                    .send()
                    .await?;
                Ok::<_, anyhow::Error>(response.status())
            }
        }
    };
    // An id no CVE database has issued is refused.
    let long = format!("{list}?cve=CVE-2024-{}", "7".repeat(7000));
    ensure!(
        get(long).await? == StatusCode::BAD_REQUEST,
        "a 7,000-digit CVE id is accepted"
    );
    ensure!(get(format!("{list}?cve=CVE-2024-1234567890")).await? == StatusCode::OK);
    let pid = bed
        .server()
        .and_then(|s| s.process().pid())
        .context("server pid")?;
    let before = rss(pid)?;
    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(32));
    let mut flood = tokio::task::JoinSet::new();
    for n in 0..CVE_FLOOD {
        let permit = semaphore.clone().acquire_owned().await?;
        let get = get.clone();
        let query = format!("{list}?cve=CVE-2024-{:010}", 1_000_000_000 + n);
        flood.spawn(async move {
            let _permit = permit;
            get(query).await
        });
        while let Some(done) = flood.try_join_next() {
            ensure!(done?? == StatusCode::OK, "a cve= list");
        }
    }
    while let Some(done) = flood.join_next().await {
        ensure!(done?? == StatusCode::OK, "a cve= list");
    }
    let after = rss(pid)?;
    let metrics = bed.server_metrics().await?;
    let kept = metric(&metrics, "elemental_changelog_answer_cache_bytes", &[]);
    let growth = after.rss_kib.saturating_sub(before.rss_kib);
    println!(
        "keys: {CVE_FLOOD} distinct cve= lists in {:?}: RSS {} -> {} KiB (+{growth} KiB), answer cache {kept} bytes of {ANSWER_CACHE}",
        started.elapsed(),
        before.rss_kib,
        after.rss_kib
    );
    ensure!(
        kept <= ANSWER_CACHE as f64,
        "the answer cache counts {kept} bytes, over its {ANSWER_CACHE}"
    );
    ensure!(
        growth <= ANSWER_CACHE / 1024 + RSS_SLACK_KIB,
        "RSS grew by {growth} KiB after {CVE_FLOOD} distinct keys (cache {ANSWER_CACHE} bytes)"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Setup

/// Answers the server has rendered so far (answer cache misses).
async fn answer_cache_misses(bed: &TestBed) -> Result<f64> {
    let metrics = bed.server_metrics().await?;
    Ok(metric(
        &metrics,
        "elemental_changelog_answer_cache_requests_total",
        &[("result", "miss")],
    ))
}

fn server_url(bed: &TestBed) -> Result<String> {
    Ok(format!(
        "https://localhost:{}",
        bed.server().context("server")?.port()
    ))
}

fn advisory(id: usize, title: &str) -> Advisory {
    Advisory {
        type_: "security".to_owned(),
        id: format!("SUSE-SU-2024:{id:05}-1"),
        title: title.to_owned(),
        severity: Severity::Important,
        issued: Timestamp::from_second(1_705_000_000 + i64::try_from(id).unwrap_or_default()).ok(),
        references: vec![Reference {
            type_: "cve".to_owned(),
            id: format!("CVE-2024-{:05}", 10_000 + id),
            href: "https://www.suse.com/security/cve/".to_owned(),
            title: "CVE".to_owned(),
        }],
        description: "Fixes a flaw in a component that many systems use, and a few more words."
            .to_owned(),
        packages: vec![AdvisoryPackage {
            name: format!("package-{}", id % 500),
            epoch: None,
            version: "3.1.4".to_owned(),
            release: format!("{id}.1"),
            arch: "x86_64".to_owned(),
        }],
        ..Advisory::default()
    }
}

async fn publish_channel(bed: &TestBed, registry: &Registry) -> Result<()> {
    let entries: Vec<VersionEntry> = VERSIONS
        .iter()
        .enumerate()
        .map(|(i, name)| VersionEntry {
            name: (*name).to_owned(),
            version: format!("v1.{i}.0"),
            upgrade_image: format!("registry.example/os:v1.{i}.0"),
            created: Some(1_700_000_000 + i64::try_from(i).unwrap_or_default() * 1000),
        })
        .collect();
    let channel_json = elemental::channel_json(&entries);
    let small = updates_log(&[advisory(1, "Security update for openssl")]);
    let evil = updates_log(&[advisory(2, EVIL_TITLE)]);
    let big = updates_log(
        &(0..BIG_ADVISORIES)
            .map(|i| advisory(100 + i, &format!("Security update for package-{}", i % 500)))
            .collect::<Vec<_>>(),
    );
    let files: [(&str, &[u8]); 4] = [
        ("channel.json", &channel_json),
        ("changelogs/small.updates.log", &small),
        ("changelogs/evil.updates.log", &evil),
        ("changelogs/big.updates.log", &big),
    ];
    publish::channel(
        bed,
        registry,
        FLEET_NAMESPACE,
        CHANNEL,
        "viewers:v1",
        &files,
        &entries,
    )
    .await?;
    let path = paths::changelog_path(FLEET_NAMESPACE, "big");
    poll("the channel is served", SOON, POLL, async || {
        Ok((bed.admin_get(&path).await?.0 == StatusCode::OK).then_some(()))
    })
    .await?;
    Ok(())
}

/// alice may read `small` and `evil` only (a Role with `resourceNames`); viewer may list the
/// summaries of the namespace.
async fn bind_roles(bed: &TestBed) -> Result<()> {
    bed.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            r"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: two-versions, namespace: {FLEET_NAMESPACE}}}
rules:
- apiGroups: [changelog.elemental.cattle.io]
  resources: [managedosversions/changelog]
  resourceNames: [small, evil]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-two-versions, namespace: {FLEET_NAMESPACE}}}
subjects: [{{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}]
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: two-versions}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: list-summaries, namespace: {FLEET_NAMESPACE}}}
rules:
- apiGroups: [changelog.elemental.cattle.io]
  resources: [managedosversions]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: viewer-list-summaries, namespace: {FLEET_NAMESPACE}}}
subjects: [{{kind: User, name: viewer, apiGroup: rbac.authorization.k8s.io}}]
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: list-summaries}}
"
        ),
    )
    .await?;
    Ok(())
}
