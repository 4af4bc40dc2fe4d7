//! The fetcher against a real registry (Debian's `docker-registry`), plain
//! and with TLS and basic auth, with images these tests build and push.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use elemental_changelog_apiserver::channels::CHANNEL_FILES;
use elemental_changelog_apiservice::Arch;
use elemental_changelog_integration::{
    hostile::{self, Answer, HostileRegistry},
    image::{self, Compression, Format, Image, Layer},
    registry::{Registry, RegistryOptions},
};
use elemental_changelog_registry::{
    Digest, FetchConfig, FetchError, FetchErrorKind, FetchLimits, Fetched, Fetcher, ImageRef,
    Limit, PullFor, RegistryArgs,
};

const CHANNEL: &[u8] =
    br#"[{"metadata":{"name":"v1"},"spec":{"version":"1.0","type":"container"}}]"#;
const CHANGELOG: &[u8] = br#"[{"id":"SUSE-2024-1","type":"security"}]"#;

/// An image reference the tests know to be valid.
fn img(image: &str) -> ImageRef {
    image.parse().expect("a valid image reference")
}

fn plain_fetcher(registry: &Registry) -> Result<Fetcher> {
    plain_fetcher_with(registry, FetchLimits::default())
}

fn plain_fetcher_with(registry: &Registry, limits: FetchLimits) -> Result<Fetcher> {
    Ok(Fetcher::new(FetchConfig {
        insecure_registries: vec![registry.host().to_owned()],
        keep: CHANNEL_FILES,
        limits,
        ..FetchConfig::default()
    })?)
}

/// Registry flags as the server's command line would give them.
fn args(config: Option<PathBuf>, ca: Option<PathBuf>) -> RegistryArgs {
    RegistryArgs {
        registry_config: config,
        registry_ca_file: ca,
        ..RegistryArgs::default()
    }
}

fn files(fetched: &Fetched) -> Vec<(&str, &[u8])> {
    match fetched {
        Fetched::Pulled { files, .. } => files
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect(),
        Fetched::Unchanged { .. } => panic!("expected a pull, got {fetched:?}"),
    }
}

fn channel_image(format: Format, compression: Compression) -> Image {
    Image::channel(
        format,
        compression,
        &[
            ("channel.json", CHANNEL),
            ("changelogs/v1.updates.log", CHANGELOG),
        ],
    )
}

fn expect_err(result: Result<Fetched, FetchError>, kind: FetchErrorKind) -> FetchError {
    match result {
        Ok(fetched) => panic!("expected {kind:?}, got {fetched:?}"),
        Err(error) => {
            assert_eq!(
                error.kind(),
                kind,
                "{error}: {:?}",
                anyhow::Error::from(error.clone())
            );
            error
        }
    }
}

#[tokio::test]
async fn anonymous_pull_of_every_manifest_and_layer_format() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let fetcher = plain_fetcher(&registry)?;
    for (tag, format, compression) in [
        ("oci-gzip", Format::Oci, Compression::Gzip),
        ("oci-zstd", Format::Oci, Compression::Zstd),
        ("oci-plain", Format::Oci, Compression::None),
        ("docker-gzip", Format::Docker, Compression::Gzip),
        ("docker-plain", Format::Docker, Compression::None),
    ] {
        let pushed = image::push(
            &registry,
            &format!("channel:{tag}"),
            &channel_image(format, compression),
        )
        .await?;
        let fetched = fetcher
            .fetch(
                &img(&registry.image(&format!("channel:{tag}"))),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await?;
        assert_eq!(fetched.digest().as_str(), pushed.digest, "{tag}");
        assert_eq!(
            files(&fetched),
            [
                ("changelogs/v1.updates.log", CHANGELOG),
                ("channel.json", CHANNEL)
            ],
            "{tag}"
        );
        let Fetched::Pulled {
            compressed_bytes,
            platform,
            ..
        } = &fetched
        else {
            unreachable!()
        };
        assert_eq!(*platform, None);
        let layer = channel_image(format, compression).layers[0].blob()?;
        assert_eq!(*compressed_bytes, layer.len() as u64, "{tag}");
    }
    // The same content by digest.
    let pushed = image::push(
        &registry,
        "channel:bydigest",
        &channel_image(Format::Oci, Compression::Gzip),
    )
    .await?;
    let by_digest = registry.image(&format!("channel@{}", pushed.digest));
    assert_eq!(
        fetcher
            .fetch(&img(&by_digest), "amd64", None, PullFor::Anyone)
            .await?
            .digest()
            .as_str(),
        pushed.digest
    );
    Ok(())
}

#[tokio::test]
async fn layers_stack_with_whiteouts() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let image = Image::new(Format::Oci)
        .layer(
            Layer::new(Compression::None)
                .file("channel.json", "old")
                .file("changelogs/a", "a")
                .file("changelogs/b", "b")
                .file("changelogs/old/x", "x"),
        )
        .layer(
            Layer::new(Compression::Zstd)
                .file("./channel.json", "new")
                .whiteout("changelogs/a")
                .opaque("changelogs/old"),
        )
        .layer(Layer::new(Compression::Gzip).file("/changelogs/c", "c"));
    image::push(&registry, "stack:1", &image).await?;
    let fetched = plain_fetcher(&registry)?
        .fetch(
            &img(&registry.image("stack:1")),
            "amd64",
            None,
            PullFor::Anyone,
        )
        .await?;
    assert_eq!(
        files(&fetched),
        [
            ("changelogs/b", b"b".as_slice()),
            ("changelogs/c", b"c"),
            ("channel.json", b"new"),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn unchanged_digest_pulls_no_blob() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let fetcher = plain_fetcher(&registry)?;
    let image = registry.image("channel:v1");
    let pushed = image::push(
        &registry,
        "channel:v1",
        &channel_image(Format::Oci, Compression::Gzip),
    )
    .await?;
    let first = fetcher
        .fetch(&img(&image), "amd64", None, PullFor::Anyone)
        .await?;
    assert_eq!(fetcher.pulls_started(), 1);
    // Without the layer, only a fetch that pulls nothing can succeed.
    registry
        .delete_blob("channel", &pushed.layer_digests[0])
        .await?;
    let again = fetcher
        .fetch(&img(&image), "amd64", Some(first.digest()), PullFor::Anyone)
        .await?;
    assert!(
        matches!(&again, Fetched::Unchanged { digest } if *digest == pushed.digest),
        "{again:?}"
    );
    assert_eq!(fetcher.pulls_started(), 1);
    expect_err(
        fetcher
            .fetch(
                &img(&image),
                "amd64",
                Some(&"sha256:0000".parse::<Digest>()?),
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::NotFound,
    );
    assert_eq!(fetcher.pulls_started(), 2);
    Ok(())
}

#[tokio::test]
async fn index_resolves_the_architecture() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let fetcher = plain_fetcher(&registry)?;
    for format in [Format::Oci, Format::Docker] {
        let tag = format!("multi:{format:?}").to_lowercase();
        let amd =
            Image::channel(format, Compression::Gzip, &[("channel.json", b"amd")]).arch("amd64");
        let arm =
            Image::channel(format, Compression::Zstd, &[("channel.json", b"arm")]).arch("arm64");
        let pushed = image::push_index(&registry, &tag, format, &[amd, arm]).await?;
        let reference = registry.image(&tag);
        for (arch, want, platform) in [
            ("x86_64", b"amd", "linux/amd64"),
            ("amd64", b"amd", "linux/amd64"),
            ("aarch64", b"arm", "linux/arm64"),
            ("arm64", b"arm", "linux/arm64"),
        ] {
            // Any spelling reaches the registry by its OCI name, as the server sends it.
            let fetched = fetcher
                .fetch(
                    &img(&reference),
                    arch.parse::<Arch>()?.oci(),
                    None,
                    PullFor::Anyone,
                )
                .await?;
            // The index digest is what tells a changed image.
            assert_eq!(fetched.digest().as_str(), pushed.digest);
            assert_eq!(
                fetched.file("channel.json"),
                Some(want.as_slice()),
                "{tag} {arch}"
            );
            assert!(
                matches!(&fetched, Fetched::Pulled { platform: Some(p), .. } if p == platform),
                "{fetched:?}"
            );
        }
        let error = expect_err(
            fetcher
                .fetch(&img(&reference), "s390x", None, PullFor::Anyone)
                .await,
            FetchErrorKind::NoMatchingPlatform,
        );
        let message = error.to_string();
        assert!(
            message.contains("linux/amd64") && message.contains("linux/arm64"),
            "{message}"
        );
    }
    Ok(())
}

/// Each call is one pull: coalescing reads of one image is the caller's (the server's image
/// store, `apiserver/src/channels/images.rs`, reads each image key once at a time; its unit
/// tests and `shared_images.rs` prove one pull for channels that start together).
#[tokio::test(flavor = "current_thread")]
async fn each_pull_is_one_download() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let fetcher = plain_fetcher(&registry)?;
    image::push(
        &registry,
        "shared:v1",
        &channel_image(Format::Oci, Compression::Gzip),
    )
    .await?;
    let resolved = fetcher
        .resolve(&img(&registry.image("shared:v1")), PullFor::Anyone)
        .await?;
    // Two channels, same image and architecture (under either name).
    let (x86_64, amd64) = (Arch::x86_64(), "amd64".parse::<Arch>()?);
    let (a, b) = tokio::join!(
        fetcher.pull(&resolved, x86_64.oci(), PullFor::Anyone),
        fetcher.pull(&resolved, amd64.oci(), PullFor::Anyone)
    );
    assert_eq!(files(&a?), files(&b?));
    assert_eq!(fetcher.pulls_started(), 2);
    // Another architecture, or a later call, is another pull.
    let (c, d) = tokio::join!(
        fetcher.pull(&resolved, "arm64", PullFor::Anyone),
        fetcher.pull(&resolved, "amd64", PullFor::Anyone)
    );
    c?;
    d?;
    assert_eq!(fetcher.pulls_started(), 4);
    Ok(())
}

#[tokio::test]
async fn broken_images_fail_with_their_reason() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let fetcher = plain_fetcher(&registry)?;

    // Unknown repository and unknown tag.
    expect_err(
        fetcher
            .fetch(
                &img(&registry.image("nothing:here")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::NotFound,
    );
    image::push(
        &registry,
        "broken:ok",
        &channel_image(Format::Oci, Compression::Gzip),
    )
    .await?;
    expect_err(
        fetcher
            .fetch(
                &img(&registry.image("broken:nope")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::NotFound,
    );
    // A reference that does not parse never reaches the registry.
    let invalid = "Not A Reference"
        .parse::<ImageRef>()
        .expect_err("not a reference");
    expect_err(Err(invalid.into()), FetchErrorKind::InvalidReference);

    // A manifest naming a blob the registry no longer has.
    let pushed = image::push(
        &registry,
        "missing:v1",
        &channel_image(Format::Oci, Compression::Zstd),
    )
    .await?;
    registry
        .delete_blob("missing", &pushed.layer_digests[0])
        .await?;
    expect_err(
        fetcher
            .fetch(
                &img(&registry.image("missing:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::NotFound,
    );

    // A blob whose bytes do not match its digest.
    let pushed = image::push(
        &registry,
        "corrupt:v1",
        &channel_image(Format::Oci, Compression::None),
    )
    .await?;
    registry.corrupt_blob(&pushed.layer_digests[0])?;
    let error = expect_err(
        fetcher
            .fetch(
                &img(&registry.image("corrupt:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::DigestMismatch,
    );
    assert!(
        matches!(&error, FetchError::DigestMismatch { expected, .. } if *expected == pushed.layer_digests[0]),
        "{error:?}"
    );

    // A manifest whose bytes do not match its digest (still valid JSON).
    let image = Image::channel(Format::Oci, Compression::Gzip, &[("channel.json", CHANNEL)]);
    let pushed = image::push(&registry, "badmanifest:v1", &image).await?;
    let path = registry.blob_path(&pushed.digest)?;
    let manifest = std::fs::read_to_string(&path)?;
    let config = pushed.config_digest.clone().unwrap_or_default();
    let flipped = if config.ends_with('0') {
        format!("{}1", &config[..config.len() - 1])
    } else {
        format!("{}0", &config[..config.len() - 1])
    };
    std::fs::write(&path, manifest.replace(&config, &flipped))?;
    let error = expect_err(
        fetcher
            .fetch(
                &img(&registry.image("badmanifest:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::DigestMismatch,
    );
    assert!(
        matches!(&error, FetchError::DigestMismatch { expected, .. } if *expected == pushed.digest),
        "{error:?}"
    );

    // A layer that is not a tar stream.
    let garbage = Image::new(Format::Oci).layer(Layer::prebuilt(
        Compression::Gzip,
        b"\x1f\x8bnot gzip at all".to_vec(),
    ));
    image::push(&registry, "garbage:v1", &garbage).await?;
    expect_err(
        fetcher
            .fetch(
                &img(&registry.image("garbage:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::Layer,
    );
    Ok(())
}

#[tokio::test]
async fn traversal_links_and_devices_are_ignored() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let image = Image::new(Format::Oci).layer(
        Layer::new(Compression::Gzip)
            .file("../channel.json", "evil")
            .file("changelogs/../../../etc/cron.d/x", "evil")
            .file("channel.json", CHANNEL)
            .symlink("changelogs/passwd", "/etc/passwd")
            .hard_link("changelogs/shadow", "etc/shadow")
            .symlink("changelogs/up", "../../..")
            .file(
                &format!("changelogs/{}.updates.log", "long".repeat(40)),
                "long name",
            ),
    );
    image::push(&registry, "traversal:v1", &image).await?;
    let fetched = plain_fetcher(&registry)?
        .fetch(
            &img(&registry.image("traversal:v1")),
            "amd64",
            None,
            PullFor::Anyone,
        )
        .await?;
    let long = format!("changelogs/{}.updates.log", "long".repeat(40));
    assert_eq!(
        files(&fetched),
        [
            (long.as_str(), b"long name".as_slice()),
            ("channel.json", CHANNEL)
        ]
    );
    Ok(())
}

#[tokio::test]
async fn decompression_bombs_and_oversized_images_are_refused() -> Result<()> {
    let registry = Registry::start_plain().await?;
    // 1 GiB of zeros as ~1 MiB of gzip, and as ~50 KiB of zstd.
    for (tag, compression) in [("gzip", Compression::Gzip), ("zstd", Compression::Zstd)] {
        let bomb = image::zero_bomb(compression, "bin/zeros", 1 << 30)?;
        assert!(bomb.len() < 2 << 20, "{}", bomb.len());
        let image =
            channel_image(Format::Oci, Compression::Gzip).layer(Layer::prebuilt(compression, bomb));
        image::push(&registry, &format!("bomb:{tag}"), &image).await?;
    }
    let small = FetchLimits {
        max_uncompressed_bytes: 64 << 20,
        ..FetchLimits::default()
    };
    let fetcher = plain_fetcher_with(&registry, small)?;
    for tag in ["gzip", "zstd"] {
        let error = expect_err(
            fetcher
                .fetch(
                    &img(&registry.image(&format!("bomb:{tag}"))),
                    "amd64",
                    None,
                    PullFor::Anyone,
                )
                .await,
            FetchErrorKind::LimitExceeded(Limit::UncompressedBytes),
        );
        assert!(
            matches!(
                error,
                FetchError::LimitExceeded {
                    which: Limit::UncompressedBytes
                }
            ),
            "{error:?}"
        );
    }

    // A kept file announcing 1 GiB is refused from its header, whatever the limits on the stream.
    let huge = image::zero_bomb(Compression::Gzip, "changelogs/huge.updates.log", 1 << 30)?;
    image::push(
        &registry,
        "huge:v1",
        &Image::new(Format::Oci).layer(Layer::prebuilt(Compression::Gzip, huge)),
    )
    .await?;
    let error = expect_err(
        plain_fetcher(&registry)?
            .fetch(
                &img(&registry.image("huge:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::FileBytes),
    );
    assert!(
        matches!(
            error,
            FetchError::LimitExceeded {
                which: Limit::FileBytes
            }
        ),
        "{error:?}"
    );

    // More compressed bytes than allowed: refused from the manifest, before any download.
    let tiny = FetchLimits {
        max_compressed_bytes: 1024,
        ..FetchLimits::default()
    };
    let error = expect_err(
        plain_fetcher_with(&registry, tiny)?
            .fetch(
                &img(&registry.image("bomb:gzip")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::CompressedBytes),
    );
    assert!(
        matches!(
            error,
            FetchError::LimitExceeded {
                which: Limit::CompressedBytes
            }
        ),
        "{error:?}"
    );
    Ok(())
}

#[tokio::test]
async fn tls_and_basic_auth_from_registry_flags() -> Result<()> {
    let registry = Registry::start_tls_auth("puller", "s3cret:with:colons").await?;
    image::push(
        &registry,
        "private/channel:v1",
        &channel_image(Format::Docker, Compression::Gzip),
    )
    .await?;
    let image = registry.image("private/channel:v1");
    let ca = registry.ca_file().map(PathBuf::from);

    let good = registry.write_docker_config("puller", "s3cret:with:colons")?;
    let fetcher = Fetcher::new(args(Some(good), ca.clone()).to_config(CHANNEL_FILES)?)?;
    let fetched = fetcher
        .fetch(&img(&image), "amd64", None, PullFor::Anyone)
        .await?;
    assert_eq!(fetched.file("channel.json"), Some(CHANNEL));

    let wrong = registry.write_docker_config("puller", "wrong")?;
    let fetcher = Fetcher::new(args(Some(wrong), ca.clone()).to_config(CHANNEL_FILES)?)?;
    let error = expect_err(
        fetcher
            .fetch(&img(&image), "amd64", None, PullFor::Anyone)
            .await,
        FetchErrorKind::Auth,
    );
    assert!(error.to_string().contains(registry.host()), "{error}");

    let anonymous = Fetcher::new(args(None, ca).to_config(CHANNEL_FILES)?)?;
    expect_err(
        anonymous
            .fetch(&img(&image), "amd64", None, PullFor::Anyone)
            .await,
        FetchErrorKind::Auth,
    );

    // Without the CA the registry's certificate is not trusted.
    let good = registry.write_docker_config("puller", "s3cret:with:colons")?;
    let untrusting = Fetcher::new(args(Some(good), None).to_config(CHANNEL_FILES)?)?;
    expect_err(
        untrusting
            .fetch(&img(&image), "amd64", None, PullFor::Anyone)
            .await,
        FetchErrorKind::Registry,
    );

    // And plain HTTP is never tried for a registry not listed as insecure.
    let plain = Registry::start_plain().await?;
    image::push(
        &plain,
        "channel:v1",
        &channel_image(Format::Oci, Compression::Gzip),
    )
    .await?;
    let https_only = Fetcher::new(FetchConfig::default())?;
    expect_err(
        https_only
            .fetch(
                &img(&plain.image("channel:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::Registry,
    );
    Ok(())
}

/// A fetcher for the hostile registry: plain HTTP, a short read timeout.
fn hostile_fetcher(hostile: &HostileRegistry, read_timeout: Duration) -> Result<Fetcher> {
    elemental_changelog_integration::registry::install_crypto_provider();
    Ok(Fetcher::new(FetchConfig {
        insecure_registries: vec![hostile.host()],
        keep: CHANNEL_FILES,
        read_timeout,
        fetch_timeout: Duration::from_secs(60),
        ..FetchConfig::default()
    })?)
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// An image manifest with `layers` made-up gzip layers.
fn manifest_with_layers(layers: usize) -> Vec<u8> {
    let layers: Vec<_> = (0..layers)
        .map(|i| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": format!("sha256:{i:064x}"),
                "size": 1,
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{:064x}", 0), "size": 2},
        "layers": layers,
    }))
    .unwrap_or_default()
}

/// Serves `answer` for `repository:v1` and for its digest, as a registry
/// that resolves the tag (HEAD) and then serves the manifest by digest.
fn route_manifest(hostile: &HostileRegistry, repository: &str, digest: &str, answer: Answer) {
    hostile.route(&format!("/v2/{repository}/manifests/v1"), answer.clone());
    hostile.route(&format!("/v2/{repository}/manifests/{digest}"), answer);
}

/// Manifests and token answers that never end, that announce gigabytes or
/// that trickle forever cost a bounded amount of memory and time, and are
/// refused with their kind; a well-behaved token flow works.
#[tokio::test]
async fn hostile_registry_answers_are_read_with_limits() -> Result<()> {
    let hostile = HostileRegistry::start().await?;
    let read_timeout = Duration::from_secs(2);
    let fetcher = hostile_fetcher(&hostile, read_timeout)?;
    let digest = format!("sha256:{:064x}", 1);
    let limit = elemental_changelog_registry::client::MAX_MANIFEST_BYTES;

    // A manifest that never ends: refused at the manifest size limit.
    route_manifest(
        &hostile,
        "endless",
        &digest,
        Answer::Endless {
            digest: digest.clone(),
        },
    );
    let started = Instant::now();
    let error = expect_err(
        fetcher
            .fetch(
                &img(&hostile.image("endless:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::ResponseBytes),
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(
        hostile.bytes_sent() < limit + (32 << 20),
        "{} bytes sent before the refusal",
        hostile.bytes_sent()
    );
    assert!(error.to_string().contains("response_bytes"), "{error}");

    // One that announces 10 GiB: refused from its header.
    let sent = hostile.bytes_sent();
    route_manifest(
        &hostile,
        "announced",
        &digest,
        Answer::Announced { length: 10 << 30 },
    );
    expect_err(
        fetcher
            .fetch(
                &img(&hostile.image("announced:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::ResponseBytes),
    );
    assert!(
        hostile.bytes_sent() - sent < 64 << 20,
        "{}",
        hostile.bytes_sent() - sent
    );

    // One that trickles a byte every 100 ms: given up after the read timeout in all.
    route_manifest(
        &hostile,
        "trickle",
        &digest,
        Answer::Trickle {
            digest: digest.clone(),
            every: Duration::from_millis(100),
        },
    );
    let started = Instant::now();
    expect_err(
        fetcher
            .fetch(
                &img(&hostile.image("trickle:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::Timeout,
    );
    let took = started.elapsed();
    eprintln!("trickling manifest: given up after {took:?}");
    assert!(took >= read_timeout && took < read_timeout * 4, "{took:?}");

    // A token realm (on another host name than the registry's: logged) that answers without end.
    let realm = format!(
        "http://localhost:{}/token",
        hostile.host().rsplit(':').next().unwrap_or_default()
    );
    let manifest = manifest_with_layers(0);
    let manifest_digest = image::sha256(&manifest);
    let behind_token = |token: &str| Answer::Bearer {
        realm: realm.clone(),
        token: token.to_owned(),
        then: Box::new(hostile::manifest(OCI_MANIFEST, manifest.clone())),
    };
    route_manifest(&hostile, "tokened", &manifest_digest, behind_token("good"));
    hostile.route(
        "/token",
        Answer::Endless {
            digest: digest.clone(),
        },
    );
    expect_err(
        fetcher
            .fetch(
                &img(&hostile.image("tokened:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::ResponseBytes),
    );
    hostile.route(
        "/token",
        Answer::Trickle {
            digest: digest.clone(),
            every: Duration::from_millis(100),
        },
    );
    expect_err(
        fetcher
            .fetch(
                &img(&hostile.image("tokened:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::Timeout,
    );
    // A well-behaved token server: the manifest (no layers) is pulled with the token.
    hostile.route(
        "/token",
        hostile::manifest(
            "application/json",
            br#"{"token":"good","expires_in":300}"#.to_vec(),
        ),
    );
    let fetched = fetcher
        .fetch(
            &img(&hostile.image("tokened:v1")),
            "amd64",
            None,
            PullFor::Anyone,
        )
        .await?;
    assert_eq!(fetched.digest().as_str(), manifest_digest);
    assert!(files(&fetched).is_empty());
    // A token the registry does not accept is an authentication error.
    route_manifest(&hostile, "refused", &manifest_digest, behind_token("other"));
    expect_err(
        fetcher
            .fetch(
                &img(&hostile.image("refused:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::Auth,
    );

    // Too many layers, and an index with too many entries: refused before any blob.
    let many = manifest_with_layers(FetchLimits::default().max_layers + 1);
    route_manifest(
        &hostile,
        "layers",
        &image::sha256(&many),
        hostile::manifest(OCI_MANIFEST, many),
    );
    expect_err(
        fetcher
            .fetch(
                &img(&hostile.image("layers:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::Layers),
    );
    Ok(())
}

/// The same limits against the real registry: an image with more layers
/// than allowed, and an index listing more manifests than allowed.
#[tokio::test]
async fn layer_and_index_counts_are_limited() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut image = channel_image(Format::Oci, Compression::Gzip);
    for i in 0..8 {
        image = image.layer(Layer::new(Compression::Gzip).file(&format!("changelogs/l{i}"), "x"));
    }
    image::push(&registry, "layers:v1", &image).await?;
    let few = FetchLimits {
        max_layers: 8,
        ..FetchLimits::default()
    };
    expect_err(
        plain_fetcher_with(&registry, few)?
            .fetch(
                &img(&registry.image("layers:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::Layers),
    );
    let enough = FetchLimits {
        max_layers: 9,
        ..FetchLimits::default()
    };
    let fetched = plain_fetcher_with(&registry, enough)?
        .fetch(
            &img(&registry.image("layers:v1")),
            "amd64",
            None,
            PullFor::Anyone,
        )
        .await?;
    assert_eq!(fetched.file("changelogs/l7"), Some(&b"x"[..]));

    let entries = FetchLimits::default().max_index_manifests;
    image::push_wide_index(
        &registry,
        "wide:v1",
        &channel_image(Format::Oci, Compression::Gzip),
        entries + 1,
    )
    .await?;
    expect_err(
        plain_fetcher(&registry)?
            .fetch(
                &img(&registry.image("wide:v1")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::LimitExceeded(Limit::IndexManifests),
    );
    image::push_wide_index(
        &registry,
        "wide:v2",
        &channel_image(Format::Oci, Compression::Gzip),
        entries,
    )
    .await?;
    // Within the limit, an index of made-up architectures has none for x86_64.
    expect_err(
        plain_fetcher(&registry)?
            .fetch(
                &img(&registry.image("wide:v2")),
                "amd64",
                None,
                PullFor::Anyone,
            )
            .await,
        FetchErrorKind::NoMatchingPlatform,
    );
    Ok(())
}

/// A copy of the Docker config file `path` whose every entry names `namespaces`.
fn scoped_config(path: &std::path::Path, namespaces: &[&str]) -> Result<PathBuf> {
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
    for entry in config["auths"]
        .as_object_mut()
        .context("auths")?
        .values_mut()
    {
        entry["namespaces"] = serde_json::json!(namespaces);
    }
    let scoped = path.with_extension("scoped.json");
    std::fs::write(&scoped, serde_json::to_vec(&config)?)?;
    Ok(scoped)
}

/// Issues 26 and 32: a credential is sent only for the namespaces it is granted to (its entry's
/// `"namespaces"`, else `--registry-credential-namespace`, else none); a pull for another namespace goes
/// anonymously, and the TLS + htpasswd registry refuses it with an `auth` error that names the
/// namespace and the registry, nothing else. `--allowed-registry` refuses other registries
/// before connecting to them.
#[tokio::test]
async fn credentials_are_scoped_by_namespace_and_registries_allowed() -> Result<()> {
    let registry = Registry::start_tls_auth("puller", "s3cret").await?;
    image::push(
        &registry,
        "private/channel:v1",
        &channel_image(Format::Docker, Compression::Gzip),
    )
    .await?;
    let image = img(&registry.image("private/channel:v1"));
    let ca = registry.ca_file().map(PathBuf::from);
    let config = registry.write_docker_config("puller", "s3cret")?;

    let granted = PullFor::Namespace("fleet-default");
    let other = PullFor::Namespace("intruder");
    let host = registry.host().to_owned();
    let refused_for_other = |fetcher: &Fetcher| {
        let fetcher = fetcher.clone();
        let image = image.clone();
        let host = host.clone();
        async move {
            let error = expect_err(
                fetcher.fetch(&image, "amd64", None, other).await,
                FetchErrorKind::Auth,
            );
            assert!(
                matches!(&error, FetchError::CredentialNotGranted { namespace, .. } if namespace == "intruder"),
                "{error:?}"
            );
            let message = error.to_string();
            assert!(
                message.contains(&host) && message.contains("intruder"),
                "{message}"
            );
            assert!(!message.contains("private/channel"), "{message}");
        }
    };

    // Named by the entry.
    let scoped = scoped_config(&config, &["fleet-default", "fleet-local"])?;
    let fetcher = Fetcher::new(args(Some(scoped), ca.clone()).to_config(CHANNEL_FILES)?)?;
    let fetched = fetcher.fetch(&image, "amd64", None, granted).await?;
    assert_eq!(fetched.file("channel.json"), Some(CHANNEL));
    // After a pull with the credential, nothing of it (a token, a connection) serves another
    // namespace.
    refused_for_other(&fetcher).await;
    assert!(
        fetcher
            .fetch(&image, "amd64", None, PullFor::Anyone)
            .await
            .is_ok()
    );
    assert_ne!(
        fetcher.access(&image, granted),
        fetcher.access(&image, other),
        "the image store would share a credentialed read with an anonymous one"
    );

    // Named by the flag, for entries that name none.
    let mut flagged = args(Some(config.clone()), ca.clone());
    flagged.registry_credential_namespaces = vec!["fleet-default".to_owned()];
    let fetcher = Fetcher::new(flagged.to_config(CHANNEL_FILES)?)?;
    refused_for_other(&fetcher).await;
    assert!(fetcher.fetch(&image, "amd64", None, granted).await.is_ok());

    // Neither (issue 32): no namespace. The operator's own commands (`PullFor::Anyone`) may
    // still use it.
    let fetcher = Fetcher::new(args(Some(config.clone()), ca.clone()).to_config(CHANNEL_FILES)?)?;
    refused_for_other(&fetcher).await;
    expect_err(
        fetcher.fetch(&image, "amd64", None, granted).await,
        FetchErrorKind::Auth,
    );
    assert!(
        fetcher
            .fetch(&image, "amd64", None, PullFor::Anyone)
            .await
            .is_ok()
    );
    // A wider grant is explicit: `*`, in the entry or in the flag.
    let wide = scoped_config(&config, &["*"])?;
    let fetcher = Fetcher::new(args(Some(wide), ca.clone()).to_config(CHANNEL_FILES)?)?;
    assert!(fetcher.fetch(&image, "amd64", None, other).await.is_ok());
    let mut every = args(Some(config.clone()), ca.clone());
    every.registry_credential_namespaces = vec!["*".to_owned()];
    let fetcher = Fetcher::new(every.to_config(CHANNEL_FILES)?)?;
    assert!(fetcher.fetch(&image, "amd64", None, other).await.is_ok());

    // An empty list is a mistake, said at load.
    let empty = scoped_config(&config, &[])?;
    let error = args(Some(empty), ca.clone())
        .to_config(CHANNEL_FILES)
        .expect_err("an empty namespaces list loads");
    assert!(
        elemental_changelog_apiserver::telemetry::error_chain(&error).contains("\"namespaces\""),
        "{error}"
    );

    // Allowed registries: the registry itself may be read; another is never connected to.
    let mut allowed = args(Some(config), ca);
    allowed.registry_credential_namespaces = vec!["fleet-default".to_owned()];
    allowed.allowed_registries = vec![registry.host().to_owned()];
    let fetcher = Fetcher::new(allowed.to_config(CHANNEL_FILES)?)?;
    assert!(fetcher.fetch(&image, "amd64", None, granted).await.is_ok());
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0")?;
    elsewhere.set_nonblocking(true)?;
    let target = img(&format!("{}/internal/service:v1", elsewhere.local_addr()?));
    let error = expect_err(
        fetcher.fetch(&target, "amd64", None, granted).await,
        FetchErrorKind::RegistryNotAllowed,
    );
    assert!(error.to_string().contains("--allowed-registry"), "{error}");
    assert_eq!(
        elsewhere.accept().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::WouldBlock),
        "the server connected to a registry that is not allowed"
    );
    Ok(())
}

/// A listener that must see no connection: nothing accepts, so a connection waits in its
/// backlog, where [`Silent::reached`] finds it.
struct Silent(std::net::TcpListener);

impl Silent {
    fn bind() -> Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        Ok(Self(listener))
    }

    fn host(&self) -> Result<String> {
        Ok(self.0.local_addr()?.to_string())
    }

    /// Whether anything connected since the last call.
    fn reached(&self) -> bool {
        self.0.accept().is_ok()
    }
}

/// Settings for `registry` (plain or TLS with its credentials) with `allowed` registries and a
/// short read timeout, so that a hop that is taken fails soon.
fn hop_config(registry: &Registry, allowed: &[&str]) -> Result<FetchConfig> {
    let mut args = RegistryArgs {
        registry_config: match registry.basic_auth() {
            Some((user, password)) => Some(registry.write_docker_config(user, password)?),
            None => None,
        },
        registry_ca_file: registry.ca_file().map(PathBuf::from),
        allowed_registries: allowed.iter().map(|host| (*host).to_owned()).collect(),
        registry_read_timeout: Duration::from_secs(2),
        ..RegistryArgs::default()
    };
    if !registry.is_tls() {
        args.insecure_registries = vec![registry.host().to_owned()];
    }
    Ok(args.to_config(CHANNEL_FILES)?)
}

/// A hop refused: kind `registry_not_allowed`, the chain naming the hop, its target and why.
async fn refused_hop(fetcher: &Fetcher, image: &str, hop: &str, why: &str) -> Result<()> {
    let error = expect_err(
        fetcher
            .fetch(&img(image), "amd64", None, PullFor::Anyone)
            .await,
        FetchErrorKind::RegistryNotAllowed,
    );
    assert!(
        matches!(error, FetchError::HopNotAllowed { .. }),
        "{error:?}"
    );
    let chain = elemental_changelog_apiserver::telemetry::error_chain(&error);
    assert!(chain.contains(hop) && chain.contains(why), "{chain}");
    Ok(())
}

/// Issue 32: a registry that redirects blobs (the real registry's `redirect` storage
/// middleware) is followed only to a host on `--allowed-registry`, and never from HTTPS to
/// plain HTTP; a registry whose token realm points elsewhere has its realm refused. Each
/// refused target is a listener that must see no connection, and does see one without the
/// allow-list, so the test fails when the check is removed.
#[tokio::test]
async fn redirects_and_token_realms_reach_only_allowed_hosts() -> Result<()> {
    let image = channel_image(Format::Oci, Compression::Gzip);
    // Blobs redirected to a host outside the allow-list.
    let storage = Silent::bind()?;
    let redirecting = Registry::start(RegistryOptions {
        blob_redirect: Some(format!("http://{}", storage.host()?)),
        ..RegistryOptions::default()
    })
    .await?;
    let pushed = image::push(&redirecting, "channel:v1", &image).await?;
    let reference = redirecting.image("channel:v1");
    let fetcher = Fetcher::new(hop_config(&redirecting, &[redirecting.host()])?)?;
    refused_hop(
        &fetcher,
        &reference,
        "redirect to http://",
        "not an allowed registry",
    )
    .await?;
    assert!(!storage.reached(), "a redirect reached a host not allowed");
    let open = Fetcher::new(hop_config(&redirecting, &[])?)?;
    assert!(
        open.fetch(&img(&reference), "amd64", None, PullFor::Anyone)
            .await
            .is_err()
    );
    assert!(
        storage.reached(),
        "the registry did not redirect: the test proves nothing"
    );

    // The same redirect to an allowed host that serves the blobs: followed.
    let serving = HostileRegistry::start().await?;
    for digest in &pushed.layer_digests {
        serving.route(
            &Registry::blob_storage_path(digest)?,
            Answer::Ok {
                content_type: "application/octet-stream".to_owned(),
                body: std::fs::read(redirecting.blob_path(digest)?)?,
            },
        );
    }
    let to_serving = Registry::start(RegistryOptions {
        blob_redirect: Some(format!("http://{}", serving.host())),
        ..RegistryOptions::default()
    })
    .await?;
    image::push(&to_serving, "channel:v1", &image).await?;
    let serving_host = serving.host();
    let both = [to_serving.host(), serving_host.as_str()];
    let fetched = Fetcher::new(hop_config(&to_serving, &both)?)?
        .fetch(
            &img(&to_serving.image("channel:v1")),
            "amd64",
            None,
            PullFor::Anyone,
        )
        .await?;
    assert_eq!(fetched.file("channel.json"), Some(CHANNEL));
    assert!(
        serving.bytes_sent() > 0,
        "the blobs did not come from the redirect"
    );

    // From the TLS + htpasswd registry to plain HTTP on an allowed host that is not an
    // --insecure-registry: refused.
    let plain_storage = Silent::bind()?;
    let secure = Registry::start(RegistryOptions {
        tls: true,
        basic_auth: Some(("puller".to_owned(), "s3cret".to_owned())),
        blob_redirect: Some(format!("http://{}", plain_storage.host()?)),
        ..RegistryOptions::default()
    })
    .await?;
    image::push(&secure, "private/channel:v1", &image).await?;
    let storage_host = plain_storage.host()?;
    let fetcher = Fetcher::new(hop_config(&secure, &[secure.host(), &storage_host])?)?;
    let reference = secure.image("private/channel:v1");
    refused_hop(
        &fetcher,
        &reference,
        "redirect to http://",
        "--insecure-registry",
    )
    .await?;
    assert!(!plain_storage.reached(), "HTTPS was left for plain HTTP");

    // A token realm outside the allow-list: never asked.
    let token_server = Silent::bind()?;
    let tokened = Registry::start(RegistryOptions {
        token_realm: Some(format!("http://{}/token", token_server.host()?)),
        ..RegistryOptions::default()
    })
    .await?;
    let reference = tokened.image("channel:v1");
    let fetcher = Fetcher::new(hop_config(&tokened, &[tokened.host()])?)?;
    refused_hop(
        &fetcher,
        &reference,
        "token realm to http://",
        "not an allowed registry",
    )
    .await?;
    assert!(
        !token_server.reached(),
        "a token realm not allowed was asked"
    );
    let open = Fetcher::new(hop_config(&tokened, &[])?)?;
    assert!(
        open.fetch(&img(&reference), "amd64", None, PullFor::Anyone)
            .await
            .is_err()
    );
    assert!(
        token_server.reached(),
        "the registry named no realm: the test proves nothing"
    );
    Ok(())
}
