//! `elemental-changelog-apiserver inspect`: the server's fetch and parse code
//! run offline against a real registry (Debian's `docker-registry`), on the
//! demo's sample channel image.

use std::process::Output;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog::{compute::IndexedChannel, data::ChannelData};
use elemental_changelog_apiserver::objects::{self, Source};
use elemental_changelog_apiservice::{Arch, types::ObjectMeta};
use elemental_changelog_integration::{image, registry, registry::Registry, sample, testbed};
use elemental_changelog_registry::{Digest, ImageRef};
use serde_json::Value;

async fn inspect(registry: &Registry, image: &str, extra: &[&str]) -> Result<Output> {
    let mut command = tokio::process::Command::new(testbed::server_binary());
    command
        .arg("inspect")
        .arg(image)
        .args(["--insecure-registry", registry.host()])
        .args(extra)
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    Ok(command.output().await?)
}

#[tokio::test]
async fn inspect_prints_what_the_server_would_serve() -> Result<()> {
    registry::install_crypto_provider();
    let registry = Registry::start_plain().await?;
    let pushed = image::push(&registry, "elemental/sample:v1", &sample::image()?).await?;
    let reference = registry.image("elemental/sample:v1");
    // The expectation comes from the sample files themselves.
    let data = IndexedChannel::new(ChannelData::from_files(sample::files()?)?);
    let versions = sample::os_versions()?;
    let newest = versions.last().context("sample has versions")?;
    let oldest = versions.first().context("sample has versions")?;

    // Summary of every version, as text.
    let out = inspect(&registry, &reference, &[]).await?;
    ensure!(
        out.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    ensure!(text.contains(&pushed.digest), "digest missing:\n{text}");
    for name in &versions {
        let (_, summary) = data.summary(name)?;
        let row = text
            .lines()
            .find(|l| l.starts_with(name.as_str()))
            .with_context(|| format!("no row for {name}:\n{text}"))?;
        let cells: Vec<&str> = row.split_whitespace().collect();
        ensure!(
            cells.get(3) == Some(&summary.advisories.to_string().as_str()),
            "advisories of {name}: {row}"
        );
    }

    // One changelog, as JSON, across versions.
    let out = inspect(
        &registry,
        &reference,
        &["--version", newest, "--from", oldest, "--output", "json"],
    )
    .await?;
    ensure!(
        out.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served: Value = serde_json::from_slice(&out.stdout)?;
    let image: ImageRef = reference.parse()?;
    let digest: Digest = pushed.digest.parse()?;
    let source = Source {
        channel: "",
        image: &image,
        digest: &digest,
    };
    let metadata = ObjectMeta {
        name: newest.clone(),
        ..ObjectMeta::default()
    };
    let expected = objects::changelog(
        source,
        &data,
        newest,
        Some(oldest),
        metadata,
        &Arch::x86_64(),
    )?;
    ensure!(
        served == serde_json::to_value(&expected)?,
        "served {served}\nwant {}",
        serde_json::to_value(&expected)?
    );
    let ids = |v: &Value| -> Vec<String> {
        v["advisories"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let want: Vec<String> = expected.advisories.iter().map(|a| a.id.clone()).collect();
    ensure!(
        ids(&served) == want,
        "advisories {:?}, want {want:?}",
        ids(&served)
    );
    ensure!(
        served["channel"]["digest"] == pushed.digest.as_str(),
        "{served}"
    );
    ensure!(served["source"] == "Computed", "{served}");

    // A version the image does not have: a clear error and a failure exit.
    let out = inspect(&registry, &reference, &["--version", "nope"]).await?;
    ensure!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("nope"), "{stderr}");

    // An image that does not exist: a failure naming it.
    let missing = registry.image("elemental/missing:v1");
    let out = inspect(&registry, &missing, &[]).await?;
    ensure!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("elemental/missing:v1"), "{stderr}");
    Ok(())
}
