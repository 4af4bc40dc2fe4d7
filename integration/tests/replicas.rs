//! Replicas that agree and survive restarts, end to end: two (then three)
//! server processes behind one Service address (a round-robin TCP proxy
//! standing in for kube-proxy), the channel history in a ConfigMap of the
//! server's namespace, a real registry and control plane. Every answer
//! checked here went through the aggregator, and is compared byte for byte
//! across replicas.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_apiservice::types::ManagedOSVersionChangelog;
use elemental_changelog_integration::{
    fixtures::{self, OperatorChannel, cause, metric},
    generated::Listing,
    image::{self, Compression, Format},
    paths,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, SERVER_NAMESPACE, TestBed, TestBedOptions},
    wait::{POLL, SOON, poll},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::Value;

/// The history ConfigMap of the chart's release in the test bed.
const HISTORY: &str = "elemental-changelog-history";
const CHANNEL: &str = "stable";
/// Seeds of the channel's data, and of the data a ConfigMap writer forges for it.
const STABLE: u64 = 1;
const FORGED: u64 = 2;

fn list_path(query: &str) -> String {
    format!("{}{query}", paths::summaries_path(FLEET_NAMESPACE))
}

/// GET `url` (through the aggregator): status code and body (as [`get_via`] gives it).
async fn get(http: &reqwest::Client, url: &str) -> Result<(u16, Vec<u8>)> {
    let response = http.get(url).send().await?;
    Ok((
        response.status().as_u16(),
        without_resource_versions(response.bytes().await?.to_vec()),
    ))
}

/// Makes the proxy send new connections to replica `only` (or to every
/// running one again with `None`), and closes the connections made so far,
/// so that the aggregator's next request reaches that replica.
async fn route(bed: &TestBed, only: Option<usize>) -> Result<()> {
    let replicas = bed.replicas().context("no replicas")?;
    for index in 0..replicas.len() {
        let port = replicas
            .server(index)
            .filter(|_| only.is_none_or(|o| o == index))
            .map(|s| s.port());
        replicas.balancer().set_backend(index, port);
    }
    replicas.balancer().close_connections(None).await
}

/// GET through the aggregator, answered by replica `index`: the status and the body, its
/// `resourceVersion`s taken out (each replica numbers the summaries it keeps for lists and
/// watches itself, see api.md's Watch).
async fn get_via(bed: &TestBed, index: usize, path: &str) -> Result<(u16, Vec<u8>)> {
    route(bed, Some(index)).await?;
    let answer = bed.admin_get(path).await;
    route(bed, None).await?;
    answer.map(|(status, body)| {
        (
            status.as_u16(),
            without_resource_versions(body.into_bytes()),
        )
    })
}

/// Polls replica `index` (through the aggregator) until `path` answers 200;
/// meanwhile only `NotFetched` 503s are acceptable (never a 404). Returns
/// the body (as [`get_via`] gives it) and the time taken.
async fn wait_served(bed: &TestBed, index: usize, path: &str) -> Result<(Vec<u8>, Duration)> {
    poll(
        &format!("replica {index}: GET {path}"),
        SOON,
        POLL,
        async || {
            let (status, body) = get_via(bed, index, path).await?;
            match status {
                200 => Ok(Some(body)),
                503 if cause(&body).0 == "NotFetched" => Ok(None),
                _ => bail!(
                    "replica {index}: {path} answered {status} (only 200 or NotFetched allowed): {}",
                    String::from_utf8_lossy(&body)
                ),
            }
        },
    )
    .await
}

/// `body` without its `resourceVersion`s, when it is JSON.
fn without_resource_versions(body: Vec<u8>) -> Vec<u8> {
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(mut value) => {
            fixtures::without_resource_versions(&mut value);
            serde_json::to_vec(&value).unwrap_or(body)
        }
        Err(_) => body,
    }
}

/// Every running replica answers `path` with the same 200 body; returns it.
async fn agree(bed: &TestBed, path: &str) -> Result<Vec<u8>> {
    let replicas = bed.replicas().context("no replicas")?;
    let mut first: Option<(usize, Vec<u8>)> = None;
    for index in 0..replicas.len() {
        if replicas.server(index).is_none() {
            continue;
        }
        let (body, _) = wait_served(bed, index, path).await?;
        match &first {
            None => first = Some((index, body)),
            Some((other, expected)) => ensure!(
                body == *expected,
                "replicas {other} and {index} disagree on {path}:\n{}\n{}",
                String::from_utf8_lossy(expected),
                String::from_utf8_lossy(&body)
            ),
        }
    }
    first.map(|(_, body)| body).context("no replica running")
}

fn changelog(body: &[u8]) -> Result<ManagedOSVersionChangelog> {
    serde_json::from_slice(body).context("a changelog")
}

/// The channel history of `stable`, as kubectl shows it.
async fn history(bed: &TestBed) -> Result<Value> {
    let cm: ConfigMap = Api::namespaced(bed.client(), SERVER_NAMESPACE)
        .get(HISTORY)
        .await
        .context("reading the channel history")?;
    let text = cm
        .data
        .unwrap_or_default()
        .remove(&format!("{FLEET_NAMESPACE}.{CHANNEL}"))
        .context("no history of the channel")?;
    Ok(serde_json::from_str(&text)?)
}

/// The digest the history maps `version` to (the newest image listing it).
fn origin(history: &Value, version: &str) -> Option<String> {
    history["images"]
        .as_array()?
        .iter()
        .rev()
        .find(|r| {
            r["versions"]
                .as_array()
                .is_some_and(|v| v.iter().any(|n| n == version))
        })
        .and_then(|r| r["digest"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn replicas_agree_and_survive_restarts() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    let result = scenarios(&mut bed, &registry).await;
    bed.finish(result)
}

async fn scenarios(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    let started = Instant::now();
    bed.start_replicas(2, &registry.server_flags()?).await?;
    eprintln!("two replicas registered in {:?}", started.elapsed());

    // Four images, three re-syncs: 1..=3, 1..=4, 2..=5 (drops 1), 3..=6 (drops 2).
    let mut channel: Option<OperatorChannel> = None;
    let mut digests = Vec::new();
    for numbers in [1..=3, 1..=4, 2..=5, 3..=6] {
        let newest = *numbers.end();
        let data = Listing::generate(CHANNEL, STABLE, numbers);
        let pushed = image::push(
            registry,
            "elemental/stable:latest",
            &data.image(Format::Oci, Compression::Gzip, "amd64"),
        )
        .await?;
        let channel = match &mut channel {
            Some(channel) => channel,
            None => channel.insert(
                OperatorChannel::custom(
                    &bed.client(),
                    FLEET_NAMESPACE,
                    CHANNEL,
                    &registry.image("elemental/stable:latest"),
                )
                .await?,
            ),
        };
        channel.sync(&data.entries()).await?;
        // Both replicas read it before the next one comes.
        let path = paths::changelog_path(FLEET_NAMESPACE, &format!("stable-v1-{newest}"));
        poll("both replicas on the new image", SOON, POLL, async || {
            let body = agree(bed, &path).await?;
            Ok(
                (changelog(&body)?.channel.digest.as_deref() == Some(pushed.digest.as_str()))
                    .then_some(()),
            )
        })
        .await?;
        digests.push(pushed.digest);
        if newest == 5 {
            restarts_keep_the_dropped_version(bed, &digests).await?;
        }
    }
    let channel = channel.context("no channel")?;
    let all = Listing::generate(CHANNEL, STABLE, 1..=6);
    let retained_1 = agree(bed, &paths::changelog_path(FLEET_NAMESPACE, "stable-v1-1")).await?;
    let retained_2 = agree(bed, &paths::changelog_path(FLEET_NAMESPACE, "stable-v1-2")).await?;
    all.check(&changelog(&retained_1)?, "stable-v1-1")?;
    all.check(&changelog(&retained_2)?, "stable-v1-2")?;
    let history = history(bed).await?;
    ensure!(
        origin(&history, "stable-v1-1").as_ref() == Some(&digests[1]),
        "{history}"
    );
    ensure!(
        origin(&history, "stable-v1-2").as_ref() == Some(&digests[2]),
        "{history}"
    );
    eprintln!("channel history: {history}");

    a_new_replica_serves_every_retained_version(bed, &[&retained_1, &retained_2]).await?;
    load_during_a_restart(bed, &retained_2).await?;
    an_old_image_gone_from_the_registry_is_retried(bed, registry, &digests[1], &retained_1).await?;
    a_forged_history_record_is_not_followed(bed, registry, &digests[2], &retained_2).await?;
    a_deleted_version_is_forgotten_everywhere(bed, &channel).await?;
    Ok(())
}

/// Scenario 1: the channel re-synced to an image that drops stable-v1-1;
/// one replica restarted, then the other: the dropped version answers 200
/// with identical bytes from both, before and after each restart.
async fn restarts_keep_the_dropped_version(bed: &mut TestBed, digests: &[String]) -> Result<()> {
    let path = paths::changelog_path(FLEET_NAMESPACE, "stable-v1-1");
    let before = agree(bed, &path).await?;
    let served = changelog(&before)?;
    ensure!(
        served.channel.retained && served.channel.digest.as_ref() == Some(&digests[1]),
        "{:?}",
        served.channel
    );
    let summaries = agree(bed, &list_path("")).await?;
    let summaries_text = String::from_utf8_lossy(&summaries);
    ensure!(summaries_text.contains("stable-v1-1"), "{summaries_text}");
    // A CVE the retained version fixes: the `cve=` list names it on every replica.
    let cve = served
        .advisories
        .iter()
        .flat_map(|a| a.cves.iter())
        .next()
        .cloned()
        .context("the generated stable-v1-1 fixes no CVE; pick a seed where it does")?;
    let cve_path = list_path(&format!("?cve={cve}"));
    let cve_list = agree(bed, &cve_path).await?;
    ensure!(
        String::from_utf8_lossy(&cve_list).contains("\"stable-v1-1\""),
        "the cve= list lacks the retained version: {}",
        String::from_utf8_lossy(&cve_list)
    );
    for index in [0, 1] {
        bed.stop_replica(index).await?;
        let started = Instant::now();
        let ready = bed.start_replica(index).await?;
        let (after, took) = wait_served(bed, index, &path).await?;
        eprintln!(
            "replica {index} restarted: ready in {ready:?}, the retained version served {:?} after start ({took:?} after ready)",
            started.elapsed()
        );
        ensure!(
            after == before,
            "replica {index} serves other bytes after its restart:\n{}\n{}",
            String::from_utf8_lossy(&before),
            String::from_utf8_lossy(&after)
        );
        ensure!(agree(bed, &path).await? == before);
        ensure!(
            agree(bed, &list_path("")).await? == summaries,
            "summaries differ"
        );
        ensure!(
            agree(bed, &cve_path).await? == cve_list,
            "cve= lists differ"
        );
    }
    Ok(())
}

/// Scenario 2: a third replica started from scratch after three re-syncs
/// serves every retained version, with the bytes the others serve.
async fn a_new_replica_serves_every_retained_version(
    bed: &mut TestBed,
    expected: &[&Vec<u8>],
) -> Result<()> {
    let started = Instant::now();
    let ready = bed.start_replica(2).await?;
    for (name, expected) in ["stable-v1-1", "stable-v1-2"].iter().zip(expected) {
        let (body, _) = wait_served(bed, 2, &paths::changelog_path(FLEET_NAMESPACE, name)).await?;
        ensure!(
            body == **expected,
            "the new replica serves other bytes for {name}"
        );
    }
    eprintln!(
        "a third replica: ready in {ready:?}, both retained versions served {:?} after start",
        started.elapsed()
    );
    agree(bed, &list_path("")).await?;
    bed.stop_replica(2).await
}

/// Scenario 4: 200 requests spread over both replicas (a new connection
/// each, as many clients make) while one restarts: every answer is the right
/// body or `NotFetched` while it rebuilds; never a 404, never other content.
async fn load_during_a_restart(bed: &mut TestBed, expected: &[u8]) -> Result<()> {
    let balancer = bed.replicas().context("no replicas")?.balancer().handle();
    let accepted_before = balancer.accepted();
    // Requests and endpoint changes take turns, as a graceful shutdown drains
    // requests in flight before the process goes.
    let turn = Arc::new(tokio::sync::Mutex::new(()));
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let (turn, sent, stop, balancer) =
            (turn.clone(), sent.clone(), stop.clone(), balancer.clone());
        let http = bed.apiserver_http(Some(&bed.pki().admin))?;
        let url = format!(
            "{}{}",
            bed.apiserver_url(),
            paths::changelog_path(FLEET_NAMESPACE, "stable-v1-2")
        );
        async move {
            let mut answers = Vec::new();
            while !stop.load(Ordering::SeqCst) || answers.len() < 200 {
                let _turn = turn.lock().await;
                answers.push(get(&http, &url).await?);
                sent.fetch_add(1, Ordering::SeqCst);
                balancer.close_connections(None).await?;
            }
            anyhow::Ok(answers)
        }
    });
    let count = async |at_least: usize| {
        poll("requests sent", SOON, POLL, async || {
            Ok((sent.load(Ordering::SeqCst) >= at_least).then_some(()))
        })
        .await
    };
    count(20).await?;
    {
        let _turn = turn.lock().await;
        bed.stop_replica(1).await?;
    }
    let restarted_at = sent.load(Ordering::SeqCst);
    bed.start_replica(1).await?;
    let accepted_at_restart = balancer.accepted();
    count(restarted_at.max(100) + 100).await?;
    stop.store(true, Ordering::SeqCst);
    let answers = load.await??;
    let (mut ok, mut not_fetched) = (0, 0);
    for (status, body) in &answers {
        match status {
            200 if body.as_slice() == expected => ok += 1,
            503 if cause(body).0 == "NotFetched" => not_fetched += 1,
            _ => bail!(
                "unexpected answer {status}: {}",
                String::from_utf8_lossy(body)
            ),
        }
    }
    let accepted = balancer.accepted();
    eprintln!(
        "{} requests during a restart: {ok} right bodies, {not_fetched} NotFetched; \
         connections per replica before {accepted_before:?}, at the restart {accepted_at_restart:?}, after {accepted:?}",
        answers.len()
    );
    ensure!(
        accepted[1] > accepted_at_restart[1] && accepted[0] > accepted_at_restart[0],
        "both replicas should have answered after the restart"
    );
    Ok(())
}

/// A registry that garbage-collected the older image a restarted replica
/// needs: the pull fails, is counted and retried with backoff, the replica
/// that holds the data keeps serving it, and once the image is back the
/// restarted replica serves the same bytes.
async fn an_old_image_gone_from_the_registry_is_retried(
    bed: &mut TestBed,
    registry: &Registry,
    digest: &str,
    expected: &[u8],
) -> Result<()> {
    let manifest = registry.blob_path(digest)?;
    let aside = manifest.with_extension("gone");
    std::fs::rename(&manifest, &aside).context("removing the old manifest")?;
    bed.stop_replica(1).await?;
    bed.start_replica(1).await?;
    let http = bed.server_http(Some(&bed.pki().admin))?;
    let url = format!(
        "{}/metrics",
        bed.replicas()
            .and_then(|r| r.server(1))
            .context("replica 1 is not running")?
            .url()
    );
    let failed = async || -> Result<f64> {
        let text = http.get(&url).send().await?.text().await?;
        Ok(metric(
            &text,
            "elemental_changelog_retained_pulls_total",
            &[("result", "failed")],
        ))
    };
    let (_, took) = poll("the pull failed twice (retried)", SOON, POLL, async || {
        Ok((failed().await? >= 2.0).then_some(()))
    })
    .await?;
    eprintln!("the missing old image failed twice on the restarted replica within {took:?}");
    let (status, body) = get_via(
        bed,
        0,
        &paths::changelog_path(FLEET_NAMESPACE, "stable-v1-1"),
    )
    .await?;
    ensure!(
        status == 200 && body == expected,
        "the replica holding the data stopped serving it: {status}"
    );
    std::fs::rename(&aside, &manifest).context("restoring the old manifest")?;
    let path = paths::changelog_path(FLEET_NAMESPACE, "stable-v1-1");
    let (body, took) = poll("the restarted replica catches up", SOON, POLL, async || {
        let (status, body) = get_via(bed, 1, &path).await?;
        Ok((status == 200).then_some(body))
    })
    .await?;
    ensure!(body == expected, "other bytes after the image came back");
    eprintln!("served {took:?} after the old image came back");
    Ok(())
}

/// Issue 17, item 9: whoever can write ConfigMaps in the server's namespace
/// adds a history record mapping the retained stable-v1-2 to an image of
/// another repository on the channel's own registry host, holding forged
/// data for it. A replica restarted afterwards rebuilds stable-v1-2 from the
/// channel's own repository, serving the bytes the other replica serves;
/// the forged image is never used, and the real record is kept.
async fn a_forged_history_record_is_not_followed(
    bed: &mut TestBed,
    registry: &Registry,
    digest: &str,
    expected: &[u8],
) -> Result<()> {
    let forged = Listing::generate(CHANNEL, FORGED, 1..=6);
    let pushed = image::push(
        registry,
        "elemental/forged:latest",
        &forged.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let api: Api<ConfigMap> = Api::namespaced(bed.client(), SERVER_NAMESPACE);
    let key = format!("{FLEET_NAMESPACE}.{CHANNEL}");
    let mut written = None;
    for _ in 0..10 {
        let mut cm = api.get(HISTORY).await?;
        let data = cm.data.get_or_insert_with(Default::default);
        let mut channel: Value = serde_json::from_str(data.get(&key).context("no history")?)?;
        let images = channel["images"].as_array_mut().context("no images")?;
        let real = images
            .iter()
            .find(|r| r["digest"] == digest)
            .context("no record of the older image")?
            .clone();
        let repository = real["repository"].as_str().context("no repository")?;
        let (host, _) = repository.split_once('/').context("a repository")?;
        let record = serde_json::json!({
            "repository": format!("{host}/elemental/forged"),
            "digest": pushed.digest,
            "recorded": "2026-01-01T00:00:00Z",
            "versions": ["stable-v1-2"],
        });
        // Newer than every record but the channel's current image.
        let at = images.len().saturating_sub(1);
        images.insert(at, record.clone());
        data.insert(key.clone(), serde_json::to_string(&channel)?);
        match api.replace(HISTORY, &Default::default(), &cm).await {
            Ok(_) => {
                written = Some(record);
                break;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let record = written.context("the history kept changing")?;
    eprintln!("forged history record: {record}");
    let path = paths::changelog_path(FLEET_NAMESPACE, "stable-v1-2");
    bed.stop_replica(1).await?;
    let started = Instant::now();
    bed.start_replica(1).await?;
    let (body, _) = wait_served(bed, 1, &path).await?;
    ensure!(
        body == expected,
        "the restarted replica serves other bytes for stable-v1-2 (forged record followed?):\n{}",
        String::from_utf8_lossy(&body)
    );
    ensure!(
        !String::from_utf8_lossy(&body).contains(&pushed.digest),
        "the forged image was served"
    );
    ensure!(agree(bed, &path).await? == expected, "replicas disagree");
    let history = history(bed).await?;
    let kept = history["images"].as_array().is_some_and(|images| {
        images.iter().any(|r| {
            r["digest"] == digest
                && r["versions"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|n| n == "stable-v1-2"))
        })
    });
    ensure!(
        kept,
        "the real record of stable-v1-2 was forgotten: {history}"
    );
    eprintln!(
        "a forged record naming {host_repo} not followed: the restarted replica served the real \
         stable-v1-2 {:?} after start",
        started.elapsed(),
        host_repo = record["repository"]
    );
    Ok(())
}

/// Scenario 3: the ManagedOSVersion of a retained version deleted: every
/// replica answers 404 within seconds, and the history forgets it.
async fn a_deleted_version_is_forgotten_everywhere(
    bed: &TestBed,
    channel: &OperatorChannel,
) -> Result<()> {
    channel.delete_version("stable-v1-1").await?;
    let path = paths::changelog_path(FLEET_NAMESPACE, "stable-v1-1");
    let started = Instant::now();
    for index in [0, 1] {
        poll(&format!("replica {index}: 404"), SOON, POLL, async || {
            let (status, _) = get_via(bed, index, &path).await?;
            Ok((status == 404).then_some(()))
        })
        .await?;
    }
    eprintln!(
        "deleted version 404 on both replicas {:?} after the deletion",
        started.elapsed()
    );
    let (_, took) = poll("the history forgets it", SOON, POLL, async || {
        let history = history(bed).await?;
        Ok(origin(&history, "stable-v1-1").is_none().then_some(history))
    })
    .await?;
    eprintln!("history forgot it {took:?} after");
    Ok(())
}
