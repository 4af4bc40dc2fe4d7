//! Channel images: resolve a tag to a digest, pull what is needed and read
//! `channel.json` and `changelogs/*` out of the layers.
//!
//! [`Fetcher::fetch`] first asks the registry for the manifest digest (a HEAD
//! request); when it equals the digest the caller already holds nothing else
//! is pulled. Otherwise the manifest (for an image index, the `linux/<arch>`
//! one) and the layers are pulled. Every manifest and blob is checked against
//! its digest here, independently of `oci-client`.
//!
//! Layers stream: each blob's chunks are counted (compressed limit), hashed
//! and sent over a small bounded channel to a blocking thread that
//! decompresses and reads the tar stream ([`layer::Extractor`]). Memory stays
//! at a few chunks plus the kept files whatever the blob size, which matters
//! because several channels may be pulled at once with limits in the hundreds
//! of MiB. The decompressor sees the data before the digest is known to match
//! (it is only known at the end); it is bounded by the same limits, and the
//! layer's result is discarded unless the digest matches.
//!
//! Concurrent pulls of the same image digest and architecture share one pull
//! (single flight): two channels with the same image cost one download.

pub mod config;
pub mod layer;
pub mod platform;
pub mod reload;

use std::{
    fmt, io,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::{Buf as _, Bytes};
use dashmap::{DashMap, mapref::entry::Entry};
use futures::{
    FutureExt as _, StreamExt as _,
    future::{BoxFuture, Shared},
};
use oci_client::{
    Client, Reference,
    client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol},
    errors::{DigestError, OciDistributionError, OciErrorCode},
    manifest::{
        IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
        OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest, OciManifest,
    },
    secrets::RegistryAuth,
};
use sha2::{Digest as _, Sha256, Sha512};
use tokio::sync::mpsc;

use self::layer::{Extractor, LayerError};
pub use self::{
    config::{FetchConfig, RegistryArgs},
    layer::{FetchLimits, Limit},
};

/// Chunks buffered between the download and the blocking tar reader.
const CHUNKS_IN_FLIGHT: usize = 16;
/// Manifest media types asked for (indexes and image manifests, OCI and Docker).
const MANIFEST_MEDIA_TYPES: [&str; 4] = [
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
];

/// The outcome of [`Fetcher::fetch`].
#[derive(Clone)]
pub enum Fetched {
    /// The image still has the digest the caller knows: nothing was pulled.
    Unchanged {
        /// The manifest (or index) digest the tag resolves to.
        digest: String,
    },
    /// The image was pulled.
    Pulled {
        /// The digest the reference resolved to (an index's digest for a
        /// multi-architecture image): pass it back as `known_digest`.
        digest: String,
        /// `channel.json` and `changelogs/...` files (paths relative to the
        /// image root, sorted), as the top layer that has them left them.
        files: Vec<(String, Vec<u8>)>,
        /// Compressed layer bytes downloaded.
        compressed_bytes: u64,
        /// Decompressed tar bytes read.
        uncompressed_bytes: u64,
        /// `os/arch[/variant]` chosen from an image index; `None` for a
        /// single-platform image.
        platform: Option<String>,
    },
}

impl Fetched {
    /// The digest the reference resolved to.
    pub fn digest(&self) -> &str {
        match self {
            Self::Unchanged { digest } | Self::Pulled { digest, .. } => digest,
        }
    }

    /// The content of a kept file, by path (`channel.json`, `changelogs/x`);
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
                    .finish()
            }
        }
    }
}

/// An image reference resolved to a manifest digest by [`Fetcher::resolve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    reference: Reference,
    digest: String,
}

impl Resolved {
    /// The manifest (or index) digest.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The image reference as given (normalised, e.g. `docker.io/library/x:tag`).
    pub fn reference(&self) -> String {
        self.reference.whole()
    }
}

/// Why a fetch failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum FetchError {
    /// The image reference does not parse.
    #[error("invalid image reference {image:?}")]
    InvalidReference {
        /// The reference as given.
        image: String,
        /// The parse error.
        #[source]
        source: Arc<oci_client::ParseError>,
    },
    /// The HTTP client could not be built from the settings.
    #[error("cannot build the registry client")]
    Client {
        /// The error.
        #[source]
        source: Arc<OciDistributionError>,
    },
    /// The registry refused the credentials (or their absence).
    #[error("registry {registry} refused access")]
    Auth {
        /// `host[:port]`.
        registry: String,
        /// The registry's answer.
        #[source]
        source: Arc<OciDistributionError>,
    },
    /// The registry has no such repository, tag, manifest or blob.
    #[error("{reference} not found")]
    NotFound {
        /// The reference or blob digest asked for.
        reference: String,
        /// The registry's answer.
        #[source]
        source: Arc<OciDistributionError>,
    },
    /// Any other registry or transport failure.
    #[error("registry request for {reference} failed")]
    Registry {
        /// The reference or blob digest asked for.
        reference: String,
        /// The error.
        #[source]
        source: Arc<OciDistributionError>,
    },
    /// The fetch took longer than the configured timeout.
    #[error("fetch timed out after {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// The image index has no `linux/<arch>` manifest.
    #[error("no linux/{arch} image in the index; it has: {}", available.join(", "))]
    NoMatchingPlatform {
        /// The architecture asked for.
        arch: String,
        /// `os/arch[/variant]` of every index entry.
        available: Vec<String>,
    },
    /// A manifest does not parse or is not an image manifest or index.
    #[error("invalid manifest {digest}")]
    Manifest {
        /// The manifest's digest.
        digest: String,
        /// What is wrong with it.
        #[source]
        source: ManifestError,
    },
    /// Content does not match its digest.
    #[error("content of {expected} has digest {actual}")]
    DigestMismatch {
        /// The digest the manifest (or tag resolution) promised.
        expected: String,
        /// The digest of what was received.
        actual: String,
    },
    /// A blob's length differs from the size its descriptor declares.
    #[error("blob {digest} is {received} bytes, its descriptor says {declared}")]
    BlobSize {
        /// The blob digest.
        digest: String,
        /// The size in the manifest.
        declared: u64,
        /// The bytes received (so far).
        received: u64,
    },
    /// A size or count limit was exceeded.
    #[error("image exceeds the {which} limit")]
    LimitExceeded {
        /// Which limit.
        which: Limit,
    },
    /// A layer could not be read.
    #[error("cannot read layer {digest}")]
    Layer {
        /// The layer digest.
        digest: String,
        /// Why.
        #[source]
        source: LayerError,
    },
    /// The blocking layer reader panicked.
    #[error("layer reader task failed")]
    Task {
        /// The join error.
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
}

/// What is wrong with a manifest.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON of an image manifest or index.
    #[error("not an image manifest or index")]
    Json(#[source] Arc<serde_json::Error>),
    /// `schemaVersion` is not 2.
    #[error("unsupported schemaVersion {0}")]
    SchemaVersion(u8),
    /// A media type this fetcher does not read.
    #[error("unsupported media type {0:?}")]
    MediaType(String),
    /// An index whose chosen entry is itself an index.
    #[error("nested image index")]
    NestedIndex,
    /// A digest with an algorithm other than sha256 and sha512.
    #[error("unsupported digest {0:?}")]
    DigestAlgorithm(String),
    /// A descriptor with a negative size.
    #[error("negative size for {0}")]
    NegativeSize(String),
    /// A layer with download URLs outside the registry (a "foreign" layer):
    /// they are never fetched, so that an image cannot make the server
    /// request arbitrary addresses.
    #[error("layer {0} has external URLs")]
    ExternalUrls(String),
}

/// [`FetchError`] reduced to a bounded set, for metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FetchErrorKind {
    /// [`FetchError::InvalidReference`].
    InvalidReference,
    /// [`FetchError::Auth`].
    Auth,
    /// [`FetchError::NotFound`].
    NotFound,
    /// [`FetchError::Registry`].
    Registry,
    /// [`FetchError::Timeout`].
    Timeout,
    /// [`FetchError::NoMatchingPlatform`].
    NoMatchingPlatform,
    /// [`FetchError::Manifest`].
    Manifest,
    /// [`FetchError::DigestMismatch`] and [`FetchError::BlobSize`].
    DigestMismatch,
    /// [`FetchError::LimitExceeded`].
    LimitExceeded,
    /// [`FetchError::Layer`].
    Layer,
    /// [`FetchError::Client`] and [`FetchError::Task`].
    Internal,
}

impl FetchErrorKind {
    /// A short stable name, usable as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidReference => "invalid_reference",
            Self::Auth => "auth",
            Self::NotFound => "not_found",
            Self::Registry => "registry",
            Self::Timeout => "timeout",
            Self::NoMatchingPlatform => "no_matching_platform",
            Self::Manifest => "manifest",
            Self::DigestMismatch => "digest_mismatch",
            Self::LimitExceeded => "limit_exceeded",
            Self::Layer => "layer",
            Self::Internal => "internal",
        }
    }
}

impl fmt::Display for FetchErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FetchError {
    /// The bounded kind of this error.
    pub fn kind(&self) -> FetchErrorKind {
        match self {
            Self::InvalidReference { .. } => FetchErrorKind::InvalidReference,
            Self::Client { .. } | Self::Task { .. } => FetchErrorKind::Internal,
            Self::Auth { .. } => FetchErrorKind::Auth,
            Self::NotFound { .. } => FetchErrorKind::NotFound,
            Self::Registry { .. } => FetchErrorKind::Registry,
            Self::Timeout { .. } => FetchErrorKind::Timeout,
            Self::NoMatchingPlatform { .. } => FetchErrorKind::NoMatchingPlatform,
            Self::Manifest { .. } => FetchErrorKind::Manifest,
            Self::DigestMismatch { .. } | Self::BlobSize { .. } => FetchErrorKind::DigestMismatch,
            Self::LimitExceeded { .. } => FetchErrorKind::LimitExceeded,
            Self::Layer { .. } => FetchErrorKind::Layer,
        }
    }

    /// Sorts an `oci-client` error into the variants above.
    fn from_registry(reference: &Reference, asked: &str, error: OciDistributionError) -> Self {
        enum Class {
            Auth,
            NotFound,
            Digest(String, String),
            Other,
        }
        let class =
            match &error {
                OciDistributionError::UnauthorizedError { .. }
                | OciDistributionError::AuthenticationFailure(_) => Class::Auth,
                OciDistributionError::RegistryError { envelope, .. } => {
                    if envelope.errors.iter().any(|e| {
                        matches!(e.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)
                    }) {
                        Class::Auth
                    } else if envelope.errors.iter().any(|e| {
                        matches!(
                            e.code,
                            OciErrorCode::ManifestUnknown
                                | OciErrorCode::BlobUnknown
                                | OciErrorCode::NameUnknown
                        )
                    }) {
                        Class::NotFound
                    } else {
                        Class::Other
                    }
                }
                OciDistributionError::ServerError {
                    code: 401 | 403, ..
                } => Class::Auth,
                OciDistributionError::ServerError { code: 404, .. } => Class::NotFound,
                OciDistributionError::DigestError(DigestError::VerificationError {
                    expected,
                    actual,
                }) => Class::Digest(expected.clone(), actual.clone()),
                _ => Class::Other,
            };
        match class {
            Class::Auth => Self::Auth {
                registry: reference.resolve_registry().to_owned(),
                source: Arc::new(error),
            },
            Class::NotFound => Self::NotFound {
                reference: asked.to_owned(),
                source: Arc::new(error),
            },
            Class::Digest(expected, actual) => Self::DigestMismatch { expected, actual },
            Class::Other => Self::Registry {
                reference: asked.to_owned(),
                source: Arc::new(error),
            },
        }
    }
}

/// Pulls channel images. Cheap to clone; clones share the HTTP client, the
/// registry tokens and the single-flight table.
#[derive(Clone)]
pub struct Fetcher {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: FetchConfig,
    in_flight: DashMap<FlightKey, SharedPull>,
    pulls_started: AtomicU64,
}

type SharedPull = Shared<BoxFuture<'static, Result<Fetched, FetchError>>>;

/// What makes two pulls the same: repository, resolved digest, architecture.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FlightKey {
    repository: String,
    digest: String,
    arch: String,
}

impl fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetcher")
            .field("config", &self.inner.config)
            .field("in_flight", &self.inner.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// Builds the registry client. A rustls `CryptoProvider` must be
    /// installed as the process default first.
    pub fn new(config: FetchConfig) -> Result<Self, FetchError> {
        let client_config = ClientConfig {
            protocol: if config.insecure_registries.is_empty() {
                ClientProtocol::Https
            } else {
                ClientProtocol::HttpsExcept(config.insecure_registries.clone())
            },
            extra_root_certificates: config
                .extra_roots
                .iter()
                .map(|der| Certificate {
                    encoding: CertificateEncoding::Der,
                    data: der.to_vec(),
                })
                .collect(),
            // Indexes are resolved here, for the architecture asked for.
            platform_resolver: None,
            connect_timeout: Some(config.connect_timeout),
            read_timeout: Some(config.read_timeout),
            user_agent: concat!("elemental-changelog/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        let client = Client::try_from(client_config).map_err(|source| FetchError::Client {
            source: Arc::new(source),
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                config,
                in_flight: DashMap::new(),
                pulls_started: AtomicU64::new(0),
            }),
        })
    }

    /// The settings this fetcher was built with.
    pub fn config(&self) -> &FetchConfig {
        &self.inner.config
    }

    /// How many pulls (manifest and layers) were started; fetches answered
    /// [`Fetched::Unchanged`] or joined to a running pull do not count.
    pub fn pulls_started(&self) -> u64 {
        self.inner.pulls_started.load(Ordering::Relaxed)
    }

    /// Resolves `image`, and pulls it for `arch` unless it still has
    /// `known_digest`.
    #[tracing::instrument(skip_all, fields(%image, %arch))]
    pub async fn fetch(
        &self,
        image: &str,
        arch: &str,
        known_digest: Option<&str>,
    ) -> Result<Fetched, FetchError> {
        let resolved = self.resolve(image).await?;
        if known_digest == Some(resolved.digest.as_str()) {
            tracing::debug!(digest = resolved.digest, "image unchanged");
            return Ok(Fetched::Unchanged {
                digest: resolved.digest,
            });
        }
        self.pull(&resolved, arch).await
    }

    /// Asks the registry which manifest digest `image` points at (a HEAD
    /// request, falling back to GET when the registry sends no digest).
    pub async fn resolve(&self, image: &str) -> Result<Resolved, FetchError> {
        let reference: Reference =
            image
                .parse()
                .map_err(|source| FetchError::InvalidReference {
                    image: image.to_owned(),
                    source: Arc::new(source),
                })?;
        let auth = self.inner.auth_for(&reference);
        let timeout = self.inner.config.fetch_timeout;
        let digest = tokio::time::timeout(
            timeout,
            self.inner.client.fetch_manifest_digest(&reference, &auth),
        )
        .await
        .map_err(|_| FetchError::Timeout { after: timeout })?
        .map_err(|error| FetchError::from_registry(&reference, &reference.whole(), error))?;
        Ok(Resolved { reference, digest })
    }

    /// Pulls a resolved image for `arch` (the answer is always
    /// [`Fetched::Pulled`]). Concurrent calls for the same
    /// repository, digest and architecture share one pull; the pull runs in
    /// its own task, so it completes (and is bounded by the fetch timeout)
    /// even if every caller goes away.
    pub async fn pull(&self, resolved: &Resolved, arch: &str) -> Result<Fetched, FetchError> {
        let key = FlightKey {
            repository: format!(
                "{}/{}",
                resolved.reference.resolve_registry(),
                resolved.reference.repository()
            ),
            digest: resolved.digest.clone(),
            arch: platform::normalize_arch(arch),
        };
        let shared = match self.inner.in_flight.entry(key.clone()) {
            Entry::Occupied(entry) => {
                tracing::debug!(digest = resolved.digest, "joining a running pull");
                entry.get().clone()
            }
            Entry::Vacant(entry) => {
                let inner = Arc::clone(&self.inner);
                let resolved = resolved.clone();
                let arch = arch.to_owned();
                // Spawned on first poll, after the entry is in the table: the
                // task removes it when done.
                let pull = async move {
                    // Its own task, logging in the span of the fetch that started it
                    // (which names the image).
                    let span = tracing::Span::current();
                    let task = tokio::spawn(tracing::Instrument::instrument(
                        async move {
                            let _leave = LeaveOnDrop {
                                inner: Arc::clone(&inner),
                                key,
                            };
                            inner.pulls_started.fetch_add(1, Ordering::Relaxed);
                            let timeout = inner.config.fetch_timeout;
                            tokio::time::timeout(timeout, inner.pull_image(&resolved, &arch))
                                .await
                                .unwrap_or(Err(FetchError::Timeout { after: timeout }))
                        },
                        span,
                    ));
                    task.await.unwrap_or_else(|source| {
                        Err(FetchError::Task {
                            source: Arc::new(source),
                        })
                    })
                }
                .boxed()
                .shared();
                entry.insert(pull.clone());
                pull
            }
        };
        shared.await
    }
}

/// Takes a pull out of the single-flight table when its task ends (even by
/// panicking).
struct LeaveOnDrop {
    inner: Arc<Inner>,
    key: FlightKey,
}

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        self.inner.in_flight.remove(&self.key);
    }
}

impl Inner {
    fn auth_for(&self, reference: &Reference) -> RegistryAuth {
        match self.config.credentials.get(reference.resolve_registry()) {
            Some(credential) => {
                RegistryAuth::Basic(credential.username.clone(), credential.password.clone())
            }
            None => RegistryAuth::Anonymous,
        }
    }

    async fn pull_image(&self, resolved: &Resolved, arch: &str) -> Result<Fetched, FetchError> {
        let auth = self.auth_for(&resolved.reference);
        let by_digest = resolved
            .reference
            .clone_with_digest(resolved.digest.clone());
        let (manifest, platform) = match self.pull_manifest(&by_digest, &auth).await? {
            OciManifest::Image(manifest) => (manifest, None),
            OciManifest::ImageIndex(index) => {
                let entry = platform::select(&index, arch).ok_or_else(|| {
                    FetchError::NoMatchingPlatform {
                        arch: arch.to_owned(),
                        available: platform::available(&index),
                    }
                })?;
                let chosen = resolved.reference.clone_with_digest(entry.digest.clone());
                match self.pull_manifest(&chosen, &auth).await? {
                    OciManifest::Image(manifest) => (manifest, Some(platform::describe(entry))),
                    OciManifest::ImageIndex(_) => {
                        return Err(FetchError::Manifest {
                            digest: entry.digest.clone(),
                            source: ManifestError::NestedIndex,
                        });
                    }
                }
            }
        };
        tracing::debug!(
            digest = resolved.digest,
            ?platform,
            layers = manifest.layers.len(),
            "pulling layers"
        );
        let (extractor, compressed_bytes) = self.pull_layers(&by_digest, &manifest).await?;
        Ok(Fetched::Pulled {
            digest: resolved.digest.clone(),
            platform,
            uncompressed_bytes: extractor.uncompressed_bytes(),
            files: extractor.into_files(),
            compressed_bytes,
        })
    }

    /// Pulls the manifest `reference` names by digest and checks it.
    async fn pull_manifest(
        &self,
        reference: &Reference,
        auth: &RegistryAuth,
    ) -> Result<OciManifest, FetchError> {
        let expected = reference.digest().unwrap_or_default().to_owned();
        let (body, _) = self
            .client
            .pull_manifest_raw(reference, auth, &MANIFEST_MEDIA_TYPES)
            .await
            .map_err(|error| FetchError::from_registry(reference, &reference.whole(), error))?;
        let mut hasher = Hasher::for_digest(&expected)?;
        hasher.update(&body);
        let actual = hasher.finish();
        if actual != expected {
            return Err(FetchError::DigestMismatch { expected, actual });
        }
        let invalid = |source| FetchError::Manifest {
            digest: expected.clone(),
            source,
        };
        let manifest: OciManifest = serde_json::from_slice(&body)
            .map_err(|error| invalid(ManifestError::Json(Arc::new(error))))?;
        let (schema_version, media_type, allowed): (u8, _, &[&str]) = match &manifest {
            OciManifest::Image(image) => (
                image.schema_version,
                image.media_type.as_deref(),
                &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE],
            ),
            OciManifest::ImageIndex(index) => (
                index.schema_version,
                index.media_type.as_deref(),
                &[OCI_IMAGE_INDEX_MEDIA_TYPE, IMAGE_MANIFEST_LIST_MEDIA_TYPE],
            ),
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

    /// Pulls the layers in order through the extractor.
    async fn pull_layers(
        &self,
        reference: &Reference,
        manifest: &OciImageManifest,
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
            declared_total = declared_total.saturating_add(declared_size(layer)?);
        }
        if declared_total > limits.max_compressed_bytes {
            return Err(FetchError::LimitExceeded {
                which: Limit::CompressedBytes,
            });
        }
        let mut extractor = Extractor::new(limits);
        let mut compressed = 0u64;
        for layer in &manifest.layers {
            let (tx, rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
            let media_type = layer.media_type.clone();
            let span = tracing::Span::current();
            let reader = tokio::task::spawn_blocking(move || {
                span.in_scope(|| extractor.apply_layer(&media_type, ChunkReader::new(rx)))
            });
            self.stream_blob(reference, layer, tx, &mut compressed)
                .await?;
            extractor = reader
                .await
                .map_err(|source| FetchError::Task {
                    source: Arc::new(source),
                })?
                .map_err(|error| match error {
                    LayerError::LimitExceeded(which) => FetchError::LimitExceeded { which },
                    source => FetchError::Layer {
                        digest: layer.digest.clone(),
                        source,
                    },
                })?;
        }
        Ok((extractor, compressed))
    }

    /// Downloads one blob into `tx`, counting and hashing it. Keeps hashing to
    /// the end even when the reader stopped early, so that corrupted content
    /// is reported as such rather than as an unreadable layer.
    async fn stream_blob(
        &self,
        reference: &Reference,
        layer: &OciDescriptor,
        tx: mpsc::Sender<Bytes>,
        compressed: &mut u64,
    ) -> Result<(), FetchError> {
        let declared = declared_size(layer)?;
        let mut hasher = Hasher::for_digest(&layer.digest)?;
        let mut stream = self
            .client
            .pull_blob_stream(reference, layer)
            .await
            .map_err(|error| FetchError::from_registry(reference, &layer.digest, error))?;
        let mut tx = Some(tx);
        let mut received = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // oci-client's own check at the end of the stream: ours below
                // says the same with the digest we computed.
                Err(error)
                    if error
                        .get_ref()
                        .is_some_and(|inner| inner.is::<DigestError>()) =>
                {
                    break;
                }
                Err(error) => {
                    return Err(FetchError::Registry {
                        reference: layer.digest.clone(),
                        source: Arc::new(OciDistributionError::IoError(error)),
                    });
                }
            };
            let len = chunk.len() as u64;
            received += len;
            *compressed += len;
            if *compressed > self.config.limits.max_compressed_bytes {
                return Err(FetchError::LimitExceeded {
                    which: Limit::CompressedBytes,
                });
            }
            if received > declared {
                return Err(FetchError::BlobSize {
                    digest: layer.digest.clone(),
                    declared,
                    received,
                });
            }
            hasher.update(&chunk);
            if let Some(sender) = &tx
                && sender.send(chunk).await.is_err()
            {
                // The reader is done (end of archive, or an error it reports).
                tx = None;
            }
        }
        drop(tx);
        let actual = hasher.finish();
        if actual != layer.digest {
            return Err(FetchError::DigestMismatch {
                expected: layer.digest.clone(),
                actual,
            });
        }
        if received != declared {
            return Err(FetchError::BlobSize {
                digest: layer.digest.clone(),
                declared,
                received,
            });
        }
        Ok(())
    }
}

fn declared_size(descriptor: &OciDescriptor) -> Result<u64, FetchError> {
    u64::try_from(descriptor.size).map_err(|_| FetchError::Manifest {
        digest: descriptor.digest.clone(),
        source: ManifestError::NegativeSize(descriptor.digest.clone()),
    })
}

/// SHA-256 or SHA-512, as the expected digest says.
enum Hasher {
    Sha256(Sha256),
    Sha512(Sha512),
}

impl Hasher {
    fn for_digest(digest: &str) -> Result<Self, FetchError> {
        match digest.split_once(':') {
            Some(("sha256", _)) => Ok(Self::Sha256(Sha256::new())),
            Some(("sha512", _)) => Ok(Self::Sha512(Sha512::new())),
            _ => Err(FetchError::Manifest {
                digest: digest.to_owned(),
                source: ManifestError::DigestAlgorithm(digest.to_owned()),
            }),
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            Self::Sha256(hasher) => hasher.update(data),
            Self::Sha512(hasher) => hasher.update(data),
        }
    }

    fn finish(self) -> String {
        match self {
            Self::Sha256(hasher) => format!("sha256:{:x}", hasher.finalize()),
            Self::Sha512(hasher) => format!("sha512:{:x}", hasher.finalize()),
        }
    }
}

/// A blocking [`io::Read`] over the chunks of a blob arriving on a channel.
/// The end of the channel is the end of the blob (the sender checks the
/// digest; a truncated stream's layer result is discarded).
struct ChunkReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl ChunkReader {
    fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
        }
    }
}

impl io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn classify(error: OciDistributionError) -> FetchErrorKind {
        let reference: Reference = "registry.example.com:5000/channel:v1".parse().unwrap();
        FetchError::from_registry(&reference, "channel:v1", error).kind()
    }

    fn envelope(code: &str) -> OciDistributionError {
        OciDistributionError::RegistryError {
            envelope: serde_json::from_value(
                serde_json::json!({"errors": [{"code": code, "message": "m"}]}),
            )
            .unwrap(),
            url: "u".into(),
        }
    }

    #[test]
    fn registry_errors_are_sorted() {
        use FetchErrorKind::*;
        assert_eq!(
            classify(OciDistributionError::UnauthorizedError { url: "u".into() }),
            Auth
        );
        assert_eq!(
            classify(OciDistributionError::AuthenticationFailure("no".into())),
            Auth
        );
        assert_eq!(classify(envelope("DENIED")), Auth);
        assert_eq!(classify(envelope("UNAUTHORIZED")), Auth);
        assert_eq!(classify(envelope("MANIFEST_UNKNOWN")), NotFound);
        assert_eq!(classify(envelope("BLOB_UNKNOWN")), NotFound);
        assert_eq!(classify(envelope("NAME_UNKNOWN")), NotFound);
        assert_eq!(classify(envelope("TOOMANYREQUESTS")), Registry);
        let server = |code| OciDistributionError::ServerError {
            code,
            url: "u".into(),
            message: String::new(),
        };
        assert_eq!(classify(server(403)), Auth);
        assert_eq!(classify(server(404)), NotFound);
        assert_eq!(classify(server(502)), Registry);
        let digest = DigestError::VerificationError {
            expected: "sha256:a".into(),
            actual: "sha256:b".into(),
        };
        assert_eq!(classify(digest.into()), DigestMismatch);
        assert_eq!(
            classify(OciDistributionError::RegistryNoDigestError),
            Registry
        );
    }

    #[test]
    fn kinds_have_distinct_labels() {
        use FetchErrorKind::*;
        let all = [
            InvalidReference,
            Auth,
            NotFound,
            Registry,
            Timeout,
            NoMatchingPlatform,
            Manifest,
            DigestMismatch,
            LimitExceeded,
            Layer,
            Internal,
        ];
        let labels: std::collections::BTreeSet<&str> =
            all.iter().map(|kind| kind.as_str()).collect();
        assert_eq!(labels.len(), all.len());
        let limit = FetchError::LimitExceeded {
            which: Limit::UncompressedBytes,
        };
        assert_eq!(limit.kind(), LimitExceeded);
        assert_eq!(
            limit.to_string(),
            "image exceeds the uncompressed_bytes limit"
        );
    }

    #[test]
    fn hashers_follow_the_digest_algorithm() {
        let mut sha256 = Hasher::for_digest("sha256:x").unwrap();
        sha256.update(b"abc");
        assert_eq!(
            sha256.finish(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut sha512 = Hasher::for_digest("sha512:x").unwrap();
        sha512.update(b"");
        assert!(sha512.finish().starts_with("sha512:cf83e1357eefb8bd"));
        assert_eq!(
            Hasher::for_digest("md5:x").err().map(|e| e.kind()),
            Some(FetchErrorKind::Manifest)
        );
        assert_eq!(
            Hasher::for_digest("nodigest").err().map(|e| e.kind()),
            Some(FetchErrorKind::Manifest)
        );
    }

    #[test]
    fn chunk_reader_reassembles_the_stream() {
        let (tx, rx) = mpsc::channel(4);
        let writer = std::thread::spawn(move || {
            for chunk in [&b"hel"[..], b"", b"lo wor", b"ld"] {
                tx.blocking_send(Bytes::from_static(chunk)).unwrap();
            }
        });
        let mut out = String::new();
        ChunkReader::new(rx).read_to_string(&mut out).unwrap();
        writer.join().unwrap();
        assert_eq!(out, "hello world");
    }

    #[test]
    fn fetched_accessors() {
        let fetched = Fetched::Pulled {
            digest: "sha256:d".into(),
            files: vec![
                ("changelogs/a".into(), b"a".to_vec()),
                ("channel.json".into(), b"[]".to_vec()),
            ],
            compressed_bytes: 1,
            uncompressed_bytes: 2,
            platform: None,
        };
        assert_eq!(fetched.digest(), "sha256:d");
        assert_eq!(fetched.file("channel.json"), Some(&b"[]"[..]));
        assert_eq!(fetched.file("changelogs/b"), None);
        let debug = format!("{fetched:?}");
        assert!(debug.contains("(\"channel.json\", 2)"), "{debug}");
        let unchanged = Fetched::Unchanged {
            digest: "sha256:d".into(),
        };
        assert_eq!(unchanged.digest(), "sha256:d");
        assert_eq!(unchanged.file("channel.json"), None);
    }
}
