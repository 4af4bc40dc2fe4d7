//! One channel image used in two namespaces (issue 10, item 3), as Rancher
//! users do with `fleet-default` and another workspace: a generated channel
//! of 500 versions × 800 packages (raw package lists and `updateinfo.xml`)
//! is served in one namespace, then the same image by a channel in a second
//! namespace. The second channel must cost no pull and no parse (the server's
//! metrics: one `pulled`, one `shared` fetch, the image's bytes downloaded
//! once) and almost no memory (the server's RSS, settled, from `/proc`), and
//! serve the same changelogs. The figures are printed (`--nocapture`) and
//! recorded in docs/reliability.md. Last, two channels created at the same
//! moment on a new image cost one pull and one parse too.
#![cfg(target_os = "linux")]

use anyhow::{Context as _, Result, ensure};

use elemental_changelog_integration::{
    bench::{Rss, settled_rss},
    fixtures::{log_lines, metric},
    generated::{Channel, Spec},
    image::{self, Compression, Format, Image},
    paths::changelog_path,
    publish,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, elemental},
    wait::{POLL, SOON, poll},
};
use serde_json::Value;

const WORKSPACE: &str = "workspace-b";
const VERSIONS: usize = 500;
const PACKAGES: usize = 800;
const MIB: u64 = 1024;

#[tokio::test]
async fn one_image_in_two_namespaces_is_pulled_and_parsed_once() -> Result<()> {
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
                // Far more than real channel images keep (500 package lists
                // of 800 packages); the budget must hold 17 times it plus a
                // quarter of itself.
                "--max-kept-size",
                "128MiB",
                "--memory-budget",
                "3GiB",
                // One such channel keeps about 90 MiB of parsed data.
                "--max-kept-total",
                "1GiB",
                // No answers rendered ahead: each namespace's changelogs would fill the
                // answer cache (a bounded cost of its own, 9 MiB here) and hide the data's.
                "--answer-cache-size",
                "0",
            ],
        )
        .await?;
        two_namespaces(&bed, &registry).await
    }
    .await;
    bed.finish(result)
}

async fn two_namespaces(bed: &TestBed, registry: &Registry) -> Result<()> {
    let model = Channel::generate(&Spec::new("big", VERSIONS, PACKAGES, 10));
    let raw: usize = model
        .raw_files("updateinfo.xml")?
        .iter()
        .map(|(_, data)| data.len())
        .sum();
    eprintln!(
        "{} MiB of raw files, {} MiB kept in the image",
        raw >> 20,
        model
            .raw_files("updateinfo.xml.zst")?
            .iter()
            .map(|(_, data)| data.len())
            .sum::<usize>()
            >> 20
    );
    let idle = settled_rss(bed).await?;
    let digest = publish::generated_channel(bed, registry, FLEET_NAMESPACE, &model).await?;
    let one = settled_rss(bed).await?;
    let first_metrics = metrics(bed).await?;
    let pulled_bytes = first_metrics.bytes;
    // The same image (pushed again: the same digest) in another namespace.
    let again = publish::generated_channel(bed, registry, WORKSPACE, &model).await?;
    ensure!(again == digest, "the image changed: {digest} then {again}");
    let two = settled_rss(bed).await?;
    let after = metrics(bed).await?;

    let kib = |rss: &Rss| rss.rss_kib;
    let first = kib(&one).saturating_sub(kib(&idle));
    let second = kib(&two).saturating_sub(kib(&one));
    eprintln!(
        "{VERSIONS} versions × {PACKAGES} packages, {} MiB of raw files: RSS idle {} MiB, \
         one namespace {} MiB (+{} MiB), two namespaces {} MiB (+{} MiB); \
         fetches pulled {:.0}, shared {:.0}; {:.0} compressed bytes pulled",
        raw >> 20,
        kib(&idle) / MIB,
        kib(&one) / MIB,
        first / MIB,
        kib(&two) / MIB,
        second / MIB,
        // (`abs`: a sum of no sample is -0.)
        after.pulled.abs(),
        after.shared.abs(),
        after.bytes.abs(),
    );
    ensure!(
        (after.pulled, after.shared) == (1.0, 1.0),
        "one pull for both namespaces, the second one shared: {after:?}"
    );
    ensure!(
        after.bytes == pulled_bytes,
        "nothing downloaded for the second namespace: {pulled_bytes} then {}",
        after.bytes
    );
    let log = bed.server().context("no server")?.process().log();
    ensure!(
        log_lines(log, &["sharing its data", WORKSPACE])?.len() == 1,
        "the server logs the shared read"
    );
    ensure!(
        first_metrics.kept > 0.0 && after.kept == first_metrics.kept,
        "the parsed data is counted once: {} bytes kept for one namespace, {} for two",
        first_metrics.kept,
        after.kept
    );
    // Its own objects cost something (500 ManagedOSVersions in the reflector, their 500
    // summaries kept for lists and watches, the channel history, the allocator's slack
    // from their watch events: 5 to 7 MiB here); the data does not: a copy of it would
    // cost as much as the first namespace again.
    ensure!(
        second * 3 < first,
        "the second namespace costs {} KiB, the first {} KiB",
        second,
        first
    );
    same_answers(bed, &model).await?;
    together(bed, registry).await
}

/// Two channels created at the same moment on a new image: it is pulled and
/// parsed once (the second read waits for the first, or finds it done).
async fn together(bed: &TestBed, registry: &Registry) -> Result<()> {
    let model = Channel::generate(&Spec::new("small", 24, 50, 11));
    let files = model.raw_files("updateinfo.xml.zst")?;
    let tag = "small/raw:1";
    image::push(
        registry,
        tag,
        &Image::channel(Format::Oci, Compression::Gzip, &files),
    )
    .await?;
    let before = metrics(bed).await?;
    let mut channels = Vec::new();
    for namespace in [FLEET_NAMESPACE, WORKSPACE] {
        channels.push(
            elemental::apply_custom_channel(
                &bed.client(),
                namespace,
                &model.name,
                &registry.image(tag),
            )
            .await?,
        );
    }
    for channel in &channels {
        elemental::sync_channel(&bed.client(), channel, &model.entries()).await?;
    }
    let newest = &model.versions.last().context("no versions")?.name;
    for namespace in [FLEET_NAMESPACE, WORKSPACE] {
        let path = changelog_path(namespace, newest);
        poll(
            &format!("{namespace}/{newest} served"),
            SOON,
            POLL,
            || async { Ok(bed.admin_get(&path).await?.0.is_success().then_some(())) },
        )
        .await?;
    }
    let after = metrics(bed).await?;
    ensure!(
        (after.pulled - before.pulled, after.shared - before.shared) == (1.0, 1.0),
        "one pull and one shared read for two channels created together: {before:?} then {after:?}"
    );
    Ok(())
}

/// What `/metrics` says about fetches.
#[derive(Debug)]
struct Fetches {
    pulled: f64,
    shared: f64,
    bytes: f64,
    /// `elemental_changelog_kept_data_bytes`: parsed data kept, each image once.
    kept: f64,
}

async fn metrics(bed: &TestBed) -> Result<Fetches> {
    let text = bed.server_metrics().await?;
    let fetches = |result: &str| {
        metric(
            &text,
            "elemental_changelog_channel_fetches_total",
            &[("result", result)],
        )
    };
    Ok(Fetches {
        pulled: fetches("pulled"),
        shared: fetches("shared"),
        bytes: metric(&text, "elemental_changelog_channel_fetch_bytes_total", &[]),
        kept: metric(&text, "elemental_changelog_kept_data_bytes", &[]),
    })
}

/// The newest version's changelog from the oldest, through the aggregator,
/// has the same data in both namespaces.
async fn same_answers(bed: &TestBed, model: &Channel) -> Result<()> {
    let (oldest, newest) = (
        &model.versions.first().context("no versions")?.name,
        &model.versions.last().context("no versions")?.name,
    );
    let mut answers = Vec::new();
    for namespace in [FLEET_NAMESPACE, WORKSPACE] {
        let mut body: Value = bed
            .admin_get_json(&format!(
                "{}?from={oldest}",
                changelog_path(namespace, newest)
            ))
            .await?;
        ensure!(
            body["advisories"].as_array().is_some_and(|a| !a.is_empty()),
            "{namespace}: no advisories"
        );
        let mut data: Vec<Value> = ["version", "from", "summary", "advisories", "packages"]
            .iter()
            .map(|field| body[field].take())
            .collect();
        data.push(body["channel"]["digest"].take());
        answers.push(data);
    }
    ensure!(
        answers[0] == answers[1],
        "the namespaces answer differently"
    );
    Ok(())
}
