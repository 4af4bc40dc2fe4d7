//! [`Fetcher`]: resolve a tag to a digest, pull the manifest (for an index,
//! the `linux/<arch>` one) and stream the layers through the extractor, under
//! the memory budget ([`Budget`]) as its [`PullMemory`] says. Coalescing reads
//! of one image is the caller's (the server's image store reads each image key
//! once at a time), so every pull here has one caller.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use oci_client::{
    Reference,
    manifest::{
        IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
        OCI_IMAGE_MEDIA_TYPE, OciImageManifest, OciManifest,
    },
};
use tokio::sync::mpsc;

use crate::{
    budget::{Budget, PullMemory, Reservation},
    client::{RegistryClient, ResponseLimits},
    config::{Access, FetchConfig, PullFor, registry_allowed},
    error::{FetchError, ManifestError},
    image::{Digest, ImageKey, ImageRef},
    layer::{self, Extractor, LayerError},
    limits::Limit,
    platform,
    stream::{self, ChunkReader},
};

/// The outcome of [`Fetcher::fetch`].
#[derive(Clone)]
pub enum Fetched {
    /// The image still has the digest the caller knows: nothing was pulled.
    Unchanged {
        /// The manifest (or index) digest the tag resolves to.
        digest: Digest,
    },
    /// The image was pulled.
    Pulled {
        /// The digest the reference resolved to (an index's digest for a
        /// multi-architecture image): pass it back as `known_digest`.
        digest: Digest,
        /// The files [`FetchConfig::keep`] names (paths relative to the
        /// image root, sorted), as the top layer that has them left them.
        files: Vec<(String, Vec<u8>)>,
        /// Compressed layer bytes downloaded.
        compressed_bytes: u64,
        /// Decompressed tar bytes read.
        uncompressed_bytes: u64,
        /// `os/arch[/variant]` chosen from an image index; `None` for a
        /// single-platform image.
        platform: Option<String>,
        /// The memory budget held for the files and their parse; `None`
        /// outside the budget (tests).
        memory: Option<Arc<PulledMemory>>,
    },
}

impl Fetched {
    /// The digest the reference resolved to.
    pub fn digest(&self) -> &Digest {
        match self {
            Self::Unchanged { digest } | Self::Pulled { digest, .. } => digest,
        }
    }

    /// The content of a kept file, by path (relative to the image root);
    /// `None` when it is absent or nothing was pulled.
    pub fn file(&self, path: &str) -> Option<&[u8]> {
        match self {
            Self::Unchanged { .. } => None,
            Self::Pulled { files, .. } => files
                .binary_search_by(|(name, _)| name.as_str().cmp(path))
                .ok()
                .map(|index| files[index].1.as_slice()),
        }
    }
}

impl fmt::Debug for Fetched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unchanged { digest } => {
                f.debug_struct("Unchanged").field("digest", digest).finish()
            }
            Self::Pulled {
                digest,
                files,
                compressed_bytes,
                uncompressed_bytes,
                platform,
                memory,
            } => {
                let files: Vec<(&str, usize)> = files
                    .iter()
                    .map(|(name, data)| (name.as_str(), data.len()))
                    .collect();
                f.debug_struct("Pulled")
                    .field("digest", digest)
                    .field("files", &files)
                    .field("compressed_bytes", compressed_bytes)
                    .field("uncompressed_bytes", uncompressed_bytes)
                    .field("platform", platform)
                    .field("memory", memory)
                    .finish()
            }
        }
    }
}

/// A pull's reservation once its working set is done with: resized to what parsing the
/// kept `files` takes ([`PullMemory::parse`]), grown (refused past the budget) or shrunk.
fn parse_reservation(
    mut memory: Reservation,
    files: &[(String, Vec<u8>)],
    pull_memory: PullMemory,
) -> Result<Arc<PulledMemory>, FetchError> {
    let kept: u64 = files.iter().map(|(_, data)| data.len() as u64).sum();
    let parse = pull_memory.parse(kept);
    if parse.total > memory.bytes() {
        memory
            .try_grow(parse.total - memory.bytes())
            .map_err(FetchError::Budget)?;
    } else {
        memory.shrink_to(parse.total);
    }
    Ok(Arc::new(PulledMemory {
        _reservation: memory,
        allowance: ParseAllowance {
            updateinfo_bytes: parse.updateinfo_bytes,
            parse_bytes: parse.parse_bytes,
        },
    }))
}

/// The part of the memory budget a pulled image holds until its files are
/// parsed (drop it then): the files, what parsing them takes, and the
/// `updateinfo.xml` allowance ([`PullMemory::parse`]).
#[derive(Debug)]
pub struct PulledMemory {
    _reservation: Reservation,
    allowance: ParseAllowance,
}

/// The memory caps of a parse, as held by a pulled image: what the caller's
/// parser may build from the kept files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseAllowance {
    /// The cap on one `updateinfo.xml` parse.
    pub updateinfo_bytes: u64,
    /// The cap on the parse of the other kept files together.
    pub parse_bytes: u64,
}

impl PulledMemory {
    /// The memory caps of the parse: the `updateinfo.xml` share, and the parse
    /// bytes reserved for the other kept files.
    pub fn allowance(&self) -> ParseAllowance {
        self.allowance
    }
}

/// An image reference resolved to a manifest digest by [`Fetcher::resolve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    image: ImageRef,
    digest: Digest,
}

impl Resolved {
    /// `image` at `digest`, resolved earlier (by [`Fetcher::resolve`], or
    /// recorded): what [`Fetcher::pull`] pulls.
    pub fn new(image: ImageRef, digest: Digest) -> Self {
        Self { image, digest }
    }

    /// The manifest (or index) digest.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The image reference as given.
    pub fn image(&self) -> &ImageRef {
        &self.image
    }

    /// What identifies its pull for `arch` (the OCI name).
    pub fn key(&self, arch: &str) -> ImageKey {
        ImageKey::new(&self.image, &self.digest, arch)
    }

    /// The reference by digest.
    fn by_digest(&self) -> ImageRef {
        self.image.at(&self.digest)
    }
}

/// Pulls channel images. Cheap to clone; clones share the HTTP client, the
/// registry tokens, the single-flight table and the memory budget.
#[derive(Clone)]
pub struct Fetcher {
    inner: Arc<Inner>,
}

struct Inner {
    client: RegistryClient,
    config: FetchConfig,
    budget: Budget,
    pulls_started: AtomicU64,
}

impl fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetcher")
            .field("config", &self.inner.config)
            .field("budget", &self.inner.budget)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// Builds the registry client, with a memory budget of its own of
    /// [`FetchConfig::memory_budget`]. A rustls `CryptoProvider` must be
    /// installed as the process default first.
    pub fn new(config: FetchConfig) -> Result<Self, FetchError> {
        let budget = Budget::new(config.memory_budget);
        Self::with_budget(config, budget)
    }

    /// [`Fetcher::new`] sharing `budget` (which a rebuilt fetcher keeps).
    pub fn with_budget(config: FetchConfig, budget: Budget) -> Result<Self, FetchError> {
        let client =
            RegistryClient::new(config.clone(), ResponseLimits::default()).map_err(|source| {
                FetchError::Client {
                    source: Arc::new(source),
                }
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                config,
                budget,
                pulls_started: AtomicU64::new(0),
            }),
        })
    }

    /// The settings this fetcher was built with.
    pub fn config(&self) -> &FetchConfig {
        &self.inner.config
    }

    /// The memory budget pulls take from.
    pub fn budget(&self) -> &Budget {
        &self.inner.budget
    }

    /// How many pulls (manifest and layers) were started; fetches answered
    /// [`Fetched::Unchanged`] or joined to a running pull do not count.
    pub fn pulls_started(&self) -> u64 {
        self.inner.pulls_started.load(Ordering::Relaxed)
    }

    /// Resolves `image`, and pulls it for `arch` (its OCI name: `amd64`)
    /// unless it still has `known_digest`.
    #[tracing::instrument(skip_all, fields(image = %image.whole(), %arch))]
    pub async fn fetch(
        &self,
        image: &ImageRef,
        arch: &str,
        known_digest: Option<&Digest>,
        pull_for: PullFor<'_>,
    ) -> Result<Fetched, FetchError> {
        let resolved = self.resolve(image, pull_for).await?;
        if known_digest == Some(&resolved.digest) {
            tracing::debug!(digest = %resolved.digest, "image unchanged");
            return Ok(Fetched::Unchanged {
                digest: resolved.digest,
            });
        }
        self.pull(&resolved, arch, pull_for).await
    }

    /// Which credential a read of `image` for `pull_for` sends: what its data may be shared
    /// under (see [`Access`]).
    pub fn access(&self, image: &ImageRef, pull_for: PullFor<'_>) -> Access {
        self.inner
            .config
            .credentials
            .access(image.registry(), pull_for)
    }

    /// Asks the registry which manifest digest `image` points at (a HEAD
    /// request, falling back to GET when the registry sends no digest), with the credential
    /// `pull_for` may send.
    pub async fn resolve(
        &self,
        image: &ImageRef,
        pull_for: PullFor<'_>,
    ) -> Result<Resolved, FetchError> {
        self.inner.admit(image)?;
        let reference = image.reference();
        let timeout = self.inner.config.fetch_timeout;
        let digest = tokio::time::timeout(
            timeout,
            self.inner.client.manifest_digest(reference, pull_for),
        )
        .await
        .map_err(|_| FetchError::Timeout { after: timeout })?
        .map_err(|error| {
            FetchError::from_registry(reference.resolve_registry(), &reference.whole(), error)
        })
        .map_err(|error| self.inner.scoped(error, pull_for))?;
        Ok(Resolved {
            image: image.clone(),
            digest: digest.parse()?,
        })
    }

    /// Pulls a resolved image for `arch` (its OCI name: `amd64`; the answer
    /// is always [`Fetched::Pulled`]), within the fetch timeout. Each call is
    /// one pull: callers that want one read per image coalesce them (the
    /// server's image store does, by [`ImageKey`]); a caller that goes away
    /// ends its pull.
    pub async fn pull(
        &self,
        resolved: &Resolved,
        arch: &str,
        pull_for: PullFor<'_>,
    ) -> Result<Fetched, FetchError> {
        self.inner.admit(&resolved.image)?;
        self.inner.pulls_started.fetch_add(1, Ordering::Relaxed);
        let timeout = self.inner.config.fetch_timeout;
        tokio::time::timeout(timeout, self.inner.pull_image(resolved, arch, pull_for))
            .await
            .unwrap_or(Err(FetchError::Timeout { after: timeout }))
            .map_err(|error| self.inner.scoped(error, pull_for))
    }
}

impl Inner {
    /// Refuses an image whose registry is not allowed (`--allowed-registry`), before any
    /// connection.
    fn admit(&self, image: &ImageRef) -> Result<(), FetchError> {
        if registry_allowed(&self.config.allowed_registries, image.registry()) {
            Ok(())
        } else {
            Err(FetchError::RegistryNotAllowed {
                registry: image.registry().to_owned(),
            })
        }
    }

    /// An access refusal for a pull that could not send the registry's credential, told
    /// apart: the credential is not granted to its namespace.
    fn scoped(&self, error: FetchError, pull_for: PullFor<'_>) -> FetchError {
        match (error, pull_for) {
            (FetchError::Auth { registry, source }, PullFor::Namespace(namespace))
                if self.config.credentials.withheld(&registry, pull_for) =>
            {
                FetchError::CredentialNotGranted {
                    registry,
                    namespace: namespace.to_owned(),
                    source,
                }
            }
            (error, _) => error,
        }
    }

    /// Pulls the image `resolved` names for `arch`: its manifest, then its layers within
    /// the memory budget, keeping the part of the budget its files' parse will take.
    async fn pull_image(
        &self,
        resolved: &Resolved,
        arch: &str,
        pull_for: PullFor<'_>,
    ) -> Result<Fetched, FetchError> {
        // The working set and the updateinfo allowance, waited for while
        // other pulls hold the budget; the files grow it as they are kept.
        let pull_memory = PullMemory::new(self.budget.bytes());
        let memory = self
            .budget
            .reserve("a pull", pull_memory.pull())
            .await
            .map_err(FetchError::Budget)?;
        let by_digest = resolved.by_digest();
        let by_digest = by_digest.reference();
        let (manifest, platform) = self
            .image_manifest(resolved, by_digest, arch, pull_for)
            .await?;
        tracing::debug!(
            digest = %resolved.digest,
            ?platform,
            layers = manifest.layers.len(),
            "pulling layers"
        );
        let (extractor, compressed_bytes) = self
            .pull_layers(by_digest, pull_for, &manifest, memory)
            .await?;
        let uncompressed_bytes = extractor.uncompressed_bytes();
        let (files, memory) = extractor.into_parts();
        let memory = memory
            .map(|memory| parse_reservation(memory, &files, pull_memory))
            .transpose()?;
        Ok(Fetched::Pulled {
            digest: resolved.digest.clone(),
            platform,
            uncompressed_bytes,
            files,
            compressed_bytes,
            memory,
        })
    }

    /// The image manifest for `arch`: the one `by_digest` names, or, when that is an index,
    /// the manifest of the entry that matches the architecture (described for the log and
    /// the result). An index inside an index is refused.
    async fn image_manifest(
        &self,
        resolved: &Resolved,
        by_digest: &Reference,
        arch: &str,
        pull_for: PullFor<'_>,
    ) -> Result<(OciImageManifest, Option<String>), FetchError> {
        let index = match self.pull_manifest(by_digest, pull_for).await? {
            OciManifest::Image(manifest) => return Ok((manifest, None)),
            OciManifest::ImageIndex(index) => index,
        };
        let entry =
            platform::select(&index, arch).ok_or_else(|| FetchError::NoMatchingPlatform {
                arch: arch.to_owned(),
                available: platform::available(&index),
            })?;
        let chosen = resolved
            .image
            .reference()
            .clone_with_digest(entry.digest.clone());
        match self.pull_manifest(&chosen, pull_for).await? {
            OciManifest::Image(manifest) => Ok((manifest, Some(platform::describe(entry)))),
            OciManifest::ImageIndex(_) => Err(FetchError::Manifest {
                digest: entry.digest.clone(),
                source: ManifestError::NestedIndex,
            }),
        }
    }

    /// Pulls the manifest `reference` names by digest and checks it.
    async fn pull_manifest(
        &self,
        reference: &Reference,
        pull_for: PullFor<'_>,
    ) -> Result<OciManifest, FetchError> {
        let expected = reference.digest().unwrap_or_default().to_owned();
        let body = self
            .client
            .manifest(reference, pull_for)
            .await
            .map_err(|error| {
                FetchError::from_registry(reference.resolve_registry(), &reference.whole(), error)
            })?;
        let mut hasher = stream::hasher_for(&expected)?;
        hasher.update(&body.bytes);
        let actual = hasher.finish();
        if actual != expected {
            return Err(FetchError::DigestMismatch { expected, actual });
        }
        let invalid = |source| FetchError::Manifest {
            digest: expected.clone(),
            source,
        };
        let manifest: OciManifest = serde_json::from_slice(&body.bytes)
            .map_err(|error| invalid(ManifestError::Json(Arc::new(error))))?;
        let limits = self.config.limits;
        let (schema_version, media_type, allowed): (u8, _, &[&str]) = match &manifest {
            OciManifest::Image(image) => {
                if image.layers.len() > limits.max_layers {
                    return Err(FetchError::LimitExceeded {
                        which: Limit::Layers,
                    });
                }
                (
                    image.schema_version,
                    image.media_type.as_deref(),
                    &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE],
                )
            }
            OciManifest::ImageIndex(index) => {
                if index.manifests.len() > limits.max_index_manifests {
                    return Err(FetchError::LimitExceeded {
                        which: Limit::IndexManifests,
                    });
                }
                (
                    index.schema_version,
                    index.media_type.as_deref(),
                    &[OCI_IMAGE_INDEX_MEDIA_TYPE, IMAGE_MANIFEST_LIST_MEDIA_TYPE],
                )
            }
        };
        if schema_version != 2 {
            return Err(invalid(ManifestError::SchemaVersion(schema_version)));
        }
        if let Some(media_type) = media_type
            && !allowed.contains(&media_type)
        {
            return Err(invalid(ManifestError::MediaType(media_type.to_owned())));
        }
        Ok(manifest)
    }

    /// Pulls the layers in order through the extractor, which keeps the
    /// files as far as `memory` can grow.
    async fn pull_layers(
        &self,
        reference: &Reference,
        pull_for: PullFor<'_>,
        manifest: &OciImageManifest,
        memory: Reservation,
    ) -> Result<(Extractor, u64), FetchError> {
        let limits = self.config.limits;
        // Refuse early what the manifest itself says is too big or unreadable.
        let mut declared_total = 0u64;
        for layer in &manifest.layers {
            if layer.urls.as_ref().is_some_and(|urls| !urls.is_empty()) {
                return Err(FetchError::Manifest {
                    digest: layer.digest.clone(),
                    source: ManifestError::ExternalUrls(layer.digest.clone()),
                });
            }
            if layer::Compression::from_media_type(&layer.media_type).is_none() {
                return Err(FetchError::Layer {
                    digest: layer.digest.clone(),
                    source: LayerError::UnsupportedMediaType {
                        media_type: layer.media_type.clone(),
                    },
                });
            }
            declared_total = declared_total.saturating_add(stream::declared_size(layer)?);
        }
        if declared_total > limits.max_compressed_bytes {
            return Err(FetchError::LimitExceeded {
                which: Limit::CompressedBytes,
            });
        }
        let mut extractor = Extractor::with_memory(limits, self.config.keep, memory);
        let mut compressed = 0u64;
        for layer in &manifest.layers {
            let (tx, rx) = mpsc::channel(stream::CHUNKS_IN_FLIGHT);
            let media_type = layer.media_type.clone();
            let span = tracing::Span::current();
            let reader = tokio::task::spawn_blocking(move || {
                span.in_scope(|| extractor.apply_layer(&media_type, ChunkReader::new(rx)))
            });
            stream::stream_blob(
                &self.client,
                reference,
                pull_for,
                layer,
                tx,
                &mut compressed,
                limits.max_compressed_bytes,
            )
            .await?;
            extractor = reader
                .await
                .map_err(|source| FetchError::Task {
                    source: Arc::new(source),
                })?
                .map_err(|error| match error {
                    LayerError::LimitExceeded(which) => FetchError::LimitExceeded { which },
                    LayerError::Budget(error) => FetchError::Budget(error),
                    source => FetchError::Layer {
                        digest: layer.digest.clone(),
                        source,
                    },
                })?;
        }
        Ok((extractor, compressed))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fetched_accessors() {
        let fetched = Fetched::Pulled {
            digest: "sha256:d".parse().unwrap(),
            files: vec![
                ("changelogs/a".into(), b"a".to_vec()),
                ("channel.json".into(), b"[]".to_vec()),
            ],
            compressed_bytes: 1,
            uncompressed_bytes: 2,
            platform: None,
            memory: None,
        };
        assert_eq!(fetched.digest(), "sha256:d");
        assert_eq!(fetched.file("channel.json"), Some(&b"[]"[..]));
        assert_eq!(fetched.file("changelogs/b"), None);
        let debug = format!("{fetched:?}");
        assert!(debug.contains("(\"channel.json\", 2)"), "{debug}");
        let unchanged = Fetched::Unchanged {
            digest: "sha256:d".parse().unwrap(),
        };
        assert_eq!(unchanged.digest(), "sha256:d");
        assert_eq!(unchanged.file("channel.json"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn pulled_memory_is_held_until_dropped() {
        let budget = Budget::new(8 << 20);
        let memory = PulledMemory {
            _reservation: budget.reserve("a pull", 4 << 20).await.unwrap(),
            allowance: ParseAllowance {
                updateinfo_bytes: 1 << 20,
                parse_bytes: 2 << 20,
            },
        };
        assert_eq!(memory.allowance().updateinfo_bytes, 1 << 20);
        assert_eq!(memory.allowance().parse_bytes, 2 << 20);
        assert_eq!(budget.available(), 4 << 20);
        drop(memory);
        assert_eq!(budget.available(), 8 << 20);
    }
}
