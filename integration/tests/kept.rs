//! Kept channel data bounded in total (issue 17, item 8), end to end:
//! whoever may create ManagedOSVersionChannels points several at large
//! images. Under `--max-kept-total` the first channels are served; the ones
//! past the limit are refused (their versions answer 503 `FetchFailed`,
//! kind `limit_exceeded`, naming the flag, in changelogs and summaries), the
//! server's metrics say how much is kept and how many channels are refused,
//! the others keep answering, an image used by two channels counts once, and
//! when a channel goes, a refused one is served. The server's RSS is printed
//! (`--nocapture`); docs/reliability.md records the figures.
#![cfg(target_os = "linux")]

use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog::data::ChannelData;
use elemental_changelog_integration::{
    bench::{Rss, settled_rss},
    fixtures::metric,
    generated::{Channel, Spec},
    paths::{changelog_path, summary_path},
    publish,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, elemental::channel_resource},
    wait::{POLL, SERVED, poll},
};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject};
use serde_json::Value;

const WORKSPACE: &str = "workspace-b";
/// Channels of the attack, each its own large image.
const CHANNELS: usize = 6;
/// Of which fit under the limit.
const FIT: usize = 2;
const VERSIONS: usize = 60;
const PACKAGES: usize = 400;
const MIB: u64 = 1024;

fn model(index: usize) -> Channel {
    Channel::generate(&Spec::new(
        &format!("big-{index}"),
        VERSIONS,
        PACKAGES,
        100 + index as u64,
    ))
}

/// Bytes of parsed data the server counts for `model`'s image.
fn parsed_bytes(model: &Channel) -> Result<u64> {
    Ok(ChannelData::from_files(model.raw_files("updateinfo.xml.zst")?)?.parsed_bytes())
}

#[tokio::test]
async fn kept_data_is_bounded_in_total() -> Result<()> {
    let models: Vec<Channel> = (1..=CHANNELS).map(model).collect();
    let sizes: Vec<u64> = models.iter().map(parsed_bytes).collect::<Result<_>>()?;
    let largest = sizes.iter().copied().max().unwrap_or_default();
    // Room for FIT images and half of another.
    let limit = largest * FIT as u64 + largest / 2;
    eprintln!(
        "{CHANNELS} channels of {VERSIONS} versions × {PACKAGES} packages, {} to {} KiB of parsed \
         data each; --max-kept-total {} KiB",
        sizes.iter().min().copied().unwrap_or_default() / 1024,
        largest / 1024,
        limit / 1024
    );
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), WORKSPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let result = async {
        bed.start_server_reading(
            &registry,
            &[
                "--architecture",
                "x86_64",
                "--max-kept-total",
                &limit.to_string(),
                // No answers rendered ahead: the RSS figures are the data's.
                "--answer-cache-size",
                "0",
            ],
        )
        .await?;
        attack(&bed, &registry, &models, &sizes, limit).await
    }
    .await;
    bed.finish(result)
}

/// The newest version of `model`'s changelog through the aggregator: status and body.
async fn changelog(bed: &TestBed, namespace: &str, model: &Channel) -> Result<(u16, Value)> {
    let name = &model.versions.last().context("no versions")?.name;
    let (status, body) = bed.admin_get(&changelog_path(namespace, name)).await?;
    Ok((
        status.as_u16(),
        serde_json::from_str(&body).unwrap_or_default(),
    ))
}

/// The summary of the newest version of `model`.
async fn summary(bed: &TestBed, model: &Channel) -> Result<Value> {
    let name = &model.versions.last().context("no versions")?.name;
    Ok(bed
        .admin_get_value(&summary_path(FLEET_NAMESPACE, name))
        .await?
        .1)
}

/// Whether `model`'s newest version is served (200), refused for the limit
/// (`Some(false)`), or neither yet (`None`).
async fn state(bed: &TestBed, model: &Channel) -> Result<Option<bool>> {
    let (status, body) = changelog(bed, FLEET_NAMESPACE, model).await?;
    let message = body["message"].as_str().unwrap_or_default();
    Ok(match status {
        200 => Some(true),
        503 if body["details"]["causes"][0]["reason"] == "FetchFailed"
            && message.contains("--max-kept-total") =>
        {
            ensure!(
                message.contains("(limit_exceeded)"),
                "the kind is not named: {message}"
            );
            Some(false)
        }
        _ => None,
    })
}

async fn kept_metrics(bed: &TestBed) -> Result<(f64, f64, f64, f64)> {
    let text = bed.server_metrics().await?;
    let get = |name: &str| metric(&text, &format!("elemental_changelog_kept_data_{name}"), &[]);
    Ok((
        get("bytes"),
        get("limit_bytes"),
        get("refused_channels"),
        get("refusals_total"),
    ))
}

async fn attack(
    bed: &TestBed,
    registry: &Registry,
    models: &[Channel],
    sizes: &[u64],
    limit: u64,
) -> Result<()> {
    let idle = settled_rss(bed).await?;
    for model in &models[..FIT] {
        publish::generated_channel(bed, registry, FLEET_NAMESPACE, model).await?;
    }
    let served = settled_rss(bed).await?;
    let (bytes, limit_metric, refused, _) = kept_metrics(bed).await?;
    let fit: u64 = sizes[..FIT].iter().sum();
    ensure!(
        bytes == fit as f64 && limit_metric == limit as f64 && refused == 0.0,
        "kept {bytes} (expected {fit}), limit {limit_metric}, refused {refused}"
    );

    // The rest, all at once.
    let started = Instant::now();
    for model in &models[FIT..] {
        publish::create_generated_channel(bed, registry, FLEET_NAMESPACE, model).await?;
    }
    for model in &models[FIT..] {
        poll(
            &format!("{} refused", model.name),
            SERVED,
            POLL,
            async || Ok((state(bed, model).await? == Some(false)).then_some(())),
        )
        .await?;
        let summary = summary(bed, model).await?;
        ensure!(
            summary["reason"] == "FetchFailed" && summary["available"] == false,
            "summary of a refused channel: {summary}"
        );
    }
    let refused_after = started.elapsed();
    for model in &models[..FIT] {
        ensure!(
            state(bed, model).await? == Some(true),
            "{} stopped answering",
            model.name
        );
    }
    let (bytes, _, refused, refusals) = kept_metrics(bed).await?;
    ensure!(
        bytes == fit as f64 && refused == (CHANNELS - FIT) as f64 && refusals >= refused,
        "kept {bytes}, refused channels {refused}, refusals {refusals}"
    );
    let attacked = settled_rss(bed).await?;

    // The first image again, in another namespace: shared, counted once.
    publish::generated_channel(bed, registry, WORKSPACE, &models[0]).await?;
    let (bytes, _, refused, _) = kept_metrics(bed).await?;
    ensure!(
        bytes == fit as f64 && refused == (CHANNELS - FIT) as f64,
        "a shared image counted again: kept {bytes}, refused {refused}"
    );

    // A served channel goes: one refused channel is served in its place.
    let gone = Instant::now();
    let api: Api<DynamicObject> =
        Api::namespaced_with(bed.client(), FLEET_NAMESPACE, &channel_resource());
    api.delete(&models[1].name, &DeleteParams::default())
        .await?;
    let (_, took) = poll(
        "a refused channel served once another went",
        SERVED,
        POLL,
        async || {
            let mut now_served = 0;
            for model in &models[FIT..] {
                if state(bed, model).await? == Some(true) {
                    now_served += 1;
                }
            }
            let (_, _, refused, _) = kept_metrics(bed).await?;
            Ok((now_served == 1 && refused == (CHANNELS - FIT - 1) as f64).then_some(()))
        },
    )
    .await?;
    let (bytes, _, _, _) = kept_metrics(bed).await?;
    ensure!(bytes <= limit as f64, "after the deletion: kept {bytes}");
    for model in &models[FIT..] {
        ensure!(
            state(bed, model).await?.is_some(),
            "{}: neither served nor refused",
            model.name
        );
    }
    let kib = |rss: &Rss| rss.rss_kib;
    eprintln!(
        "RSS idle {} MiB; {FIT} channels served {} MiB (+{} MiB, {} KiB of parsed data counted); \
         {} more refused within {refused_after:.1?}: {} MiB (+{} MiB; peak {} MiB); a refused \
         channel served {took:.1?} after a served one was deleted ({:.1?} in all)",
        kib(&idle) / MIB,
        kib(&served) / MIB,
        kib(&served).saturating_sub(kib(&idle)) / MIB,
        fit / 1024,
        CHANNELS - FIT,
        kib(&attacked) / MIB,
        kib(&attacked).saturating_sub(kib(&served)) / MIB,
        attacked.peak_kib / MIB,
        gone.elapsed(),
    );
    // Refused channels keep nothing: they cost less than the channels served
    // (kept, they would cost twice as much).
    ensure!(
        kib(&attacked).saturating_sub(kib(&served)) < kib(&served).saturating_sub(kib(&idle)),
        "the refused channels grew RSS from {} to {} KiB",
        kib(&served),
        kib(&attacked)
    );
    Ok(())
}
