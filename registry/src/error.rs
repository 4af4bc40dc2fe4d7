//! Why a fetch failed: [`FetchError`] with its full chain for the logs, and
//! [`FetchErrorKind`], the bounded kind that names metric labels and gives
//! callers a short description free of anything the registry said.

use std::{fmt, sync::Arc, time::Duration};

use crate::{
    budget::BudgetError,
    client::RegistryError,
    image::{InvalidDigest, InvalidImageRef},
    layer::LayerError,
    limits::Limit,
};

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
        source: Arc<RegistryError>,
    },
    /// The registry refused the credentials (or their absence).
    #[error("registry {registry} refused access")]
    Auth {
        /// `host[:port]`.
        registry: String,
        /// The registry's answer.
        #[source]
        source: Arc<RegistryError>,
    },
    /// The registry refused an anonymous pull for a namespace its credential is not granted
    /// to (`"namespaces"` in the registry config, `--registry-credential-namespace`).
    #[error(
        "registry {registry} refused access: its credential is not granted to namespace {namespace}"
    )]
    CredentialNotGranted {
        /// `host[:port]`.
        registry: String,
        /// The namespace the pull was for.
        namespace: String,
        /// The registry's answer to the anonymous request.
        #[source]
        source: Arc<RegistryError>,
    },
    /// The image's registry is not one of `--allowed-registry`: nothing was sent to it.
    #[error("registry {registry} is not an allowed registry (--allowed-registry)")]
    RegistryNotAllowed {
        /// `host[:port]`.
        registry: String,
    },
    /// The registry sent the pull on (a redirect, a token realm) to a host outside
    /// `--allowed-registry`, or from HTTPS to plain HTTP on a host that is not an
    /// `--insecure-registry`: nothing was sent there.
    #[error("registry {registry} sent the pull to a host it may not reach")]
    HopNotAllowed {
        /// `host[:port]`.
        registry: String,
        /// The hop refused.
        #[source]
        source: Arc<RegistryError>,
    },
    /// The registry has no such repository, tag, manifest or blob.
    #[error("{reference} not found")]
    NotFound {
        /// The reference or blob digest asked for.
        reference: String,
        /// The registry's answer.
        #[source]
        source: Arc<RegistryError>,
    },
    /// Any other registry or transport failure.
    #[error("registry request for {reference} failed")]
    Registry {
        /// The reference or blob digest asked for.
        reference: String,
        /// The error.
        #[source]
        source: Arc<RegistryError>,
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
    /// The image needs more memory than the budget can ever give it.
    #[error("image exceeds the memory budget")]
    Budget(#[source] BudgetError),
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
    /// A digest that is not `algorithm:encoded`.
    #[error("invalid digest")]
    Digest(#[source] InvalidDigest),
    /// A descriptor with a negative size.
    #[error("negative size for {0}")]
    NegativeSize(String),
    /// A layer with download URLs outside the registry (a "foreign" layer):
    /// they are never fetched, so that an image cannot make the server
    /// request arbitrary addresses.
    #[error("layer {0} has external URLs")]
    ExternalUrls(String),
}

/// Why a fetch failed, reduced to a bounded set of registry, transport,
/// limit and platform kinds: a metric label ([`FetchErrorKind::as_str`]) and
/// a description callers may show ([`FetchErrorKind::describe`]) both come
/// from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FetchErrorKind {
    /// [`FetchError::InvalidReference`].
    InvalidReference,
    /// [`FetchError::Auth`] and [`FetchError::CredentialNotGranted`].
    Auth,
    /// [`FetchError::RegistryNotAllowed`] and [`FetchError::HopNotAllowed`].
    RegistryNotAllowed,
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
    /// [`FetchError::LimitExceeded`] and [`FetchError::Budget`], with the
    /// limit.
    LimitExceeded(Limit),
    /// [`FetchError::Layer`].
    Layer,
    /// [`FetchError::Client`] and [`FetchError::Task`].
    Internal,
}

impl FetchErrorKind {
    /// A short stable name, usable as a metric label (every limit shares
    /// `limit_exceeded`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidReference => "invalid_reference",
            Self::Auth => "auth",
            Self::RegistryNotAllowed => "registry_not_allowed",
            Self::NotFound => "not_found",
            Self::Registry => "registry",
            Self::Timeout => "timeout",
            Self::NoMatchingPlatform => "no_matching_platform",
            Self::Manifest => "manifest",
            Self::DigestMismatch => "digest_mismatch",
            Self::LimitExceeded(_) => "limit_exceeded",
            Self::Layer => "layer",
            Self::Internal => "internal",
        }
    }

    /// What callers may be told, e.g. `registry unreachable`. It says which
    /// kind of failure it was and nothing else: no registry answer, URL,
    /// token realm or digest, which stay in the logs (and the kind in the
    /// metric label).
    pub fn describe(self) -> String {
        let what = match self {
            Self::InvalidReference => "the image reference is invalid",
            Self::Auth => "the registry refused access",
            Self::RegistryNotAllowed => {
                "the image's registry, or a host it sends the server to, is not one the server \
                 may read from"
            }
            Self::NotFound => "image not found in the registry",
            Self::Registry => "registry unreachable",
            Self::Timeout => "timed out",
            Self::NoMatchingPlatform => "the image has no image for this architecture",
            Self::Manifest => "the image manifest is invalid",
            Self::DigestMismatch => "content does not match its digest",
            Self::LimitExceeded(limit) => {
                return format!(
                    "the image exceeds the server's limit on {}",
                    limit.public_name()
                );
            }
            Self::Layer => "an image layer is unreadable",
            Self::Internal => "internal error",
        };
        what.to_owned()
    }
}

impl fmt::Display for FetchErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<InvalidImageRef> for FetchError {
    fn from(InvalidImageRef { image, source }: InvalidImageRef) -> Self {
        Self::InvalidReference { image, source }
    }
}

impl From<InvalidDigest> for FetchError {
    /// A digest recorded or sent by a registry that is not one: an invalid
    /// manifest reference.
    fn from(error: InvalidDigest) -> Self {
        Self::Manifest {
            digest: error.0.clone(),
            source: ManifestError::Digest(error),
        }
    }
}

impl FetchError {
    /// The bounded kind of this error.
    pub fn kind(&self) -> FetchErrorKind {
        match self {
            Self::InvalidReference { .. } => FetchErrorKind::InvalidReference,
            Self::Client { .. } | Self::Task { .. } => FetchErrorKind::Internal,
            Self::Auth { .. } | Self::CredentialNotGranted { .. } => FetchErrorKind::Auth,
            Self::RegistryNotAllowed { .. } | Self::HopNotAllowed { .. } => {
                FetchErrorKind::RegistryNotAllowed
            }
            Self::NotFound { .. } => FetchErrorKind::NotFound,
            Self::Registry { .. } => FetchErrorKind::Registry,
            Self::Timeout { .. } => FetchErrorKind::Timeout,
            Self::NoMatchingPlatform { .. } => FetchErrorKind::NoMatchingPlatform,
            Self::Manifest { .. } => FetchErrorKind::Manifest,
            Self::DigestMismatch { .. } | Self::BlobSize { .. } => FetchErrorKind::DigestMismatch,
            Self::LimitExceeded { which } => FetchErrorKind::LimitExceeded(*which),
            Self::Budget(_) => FetchErrorKind::LimitExceeded(Limit::MemoryBudget),
            Self::Layer { .. } => FetchErrorKind::Layer,
        }
    }

    /// Sorts a registry error into the variants above. `asked` is the
    /// reference or blob digest the request was for.
    pub(crate) fn from_registry(registry: &str, asked: &str, error: RegistryError) -> Self {
        match error {
            RegistryError::TooLarge { .. } => Self::LimitExceeded {
                which: Limit::ResponseBytes,
            },
            RegistryError::Timeout { after, .. } => Self::Timeout { after },
            error @ RegistryError::Hop(_) => Self::HopNotAllowed {
                registry: registry.to_owned(),
                source: Arc::new(error),
            },
            error if error.is_auth() => Self::Auth {
                registry: registry.to_owned(),
                source: Arc::new(error),
            },
            error if error.is_not_found() => Self::NotFound {
                reference: asked.to_owned(),
                source: Arc::new(error),
            },
            error => Self::Registry {
                reference: asked.to_owned(),
                source: Arc::new(error),
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn classify(error: RegistryError) -> FetchErrorKind {
        FetchError::from_registry("registry.example.com:5000", "channel:v1", error).kind()
    }

    fn status(status: u16, codes: &[&str]) -> RegistryError {
        RegistryError::Status {
            url: "https://registry.example.com:5000/v2/channel/manifests/v1".into(),
            status,
            codes: codes.iter().map(|c| (*c).to_owned()).collect(),
            message: Some("secret detail from the registry".into()),
        }
    }

    const ALL: [FetchErrorKind; 11] = [
        FetchErrorKind::InvalidReference,
        FetchErrorKind::Auth,
        FetchErrorKind::NotFound,
        FetchErrorKind::Registry,
        FetchErrorKind::Timeout,
        FetchErrorKind::NoMatchingPlatform,
        FetchErrorKind::Manifest,
        FetchErrorKind::DigestMismatch,
        FetchErrorKind::LimitExceeded(Limit::KeptBytes),
        FetchErrorKind::Layer,
        FetchErrorKind::Internal,
    ];

    #[test]
    fn registry_errors_are_sorted() {
        use FetchErrorKind::*;
        assert_eq!(classify(status(401, &[])), Auth);
        assert_eq!(classify(status(400, &["DENIED"])), Auth);
        assert_eq!(classify(status(400, &["UNAUTHORIZED"])), Auth);
        assert_eq!(classify(status(404, &["MANIFEST_UNKNOWN"])), NotFound);
        assert_eq!(classify(status(400, &["BLOB_UNKNOWN"])), NotFound);
        assert_eq!(classify(status(400, &["NAME_UNKNOWN"])), NotFound);
        assert_eq!(classify(status(429, &["TOOMANYREQUESTS"])), Registry);
        assert_eq!(classify(status(502, &[])), Registry);
        assert_eq!(
            classify(RegistryError::TooLarge {
                body: crate::client::Body::Manifest,
                url: "u".into(),
                limit: 1,
            }),
            LimitExceeded(Limit::ResponseBytes)
        );
        assert_eq!(
            classify(RegistryError::Timeout {
                body: crate::client::Body::Token,
                url: "u".into(),
                after: Duration::from_secs(1),
            }),
            Timeout
        );
    }

    #[test]
    fn kinds_have_distinct_labels_and_messages() {
        let labels: std::collections::BTreeSet<&str> =
            ALL.iter().map(|kind| kind.as_str()).collect();
        assert_eq!(labels.len(), ALL.len());
        let messages: std::collections::BTreeSet<String> =
            ALL.iter().map(|kind| kind.describe()).collect();
        assert_eq!(messages.len(), ALL.len());
        let limit = FetchError::LimitExceeded {
            which: Limit::UncompressedBytes,
        };
        assert_eq!(
            limit.kind(),
            FetchErrorKind::LimitExceeded(Limit::UncompressedBytes)
        );
        assert_eq!(limit.kind().as_str(), "limit_exceeded");
        assert_eq!(
            limit.to_string(),
            "image exceeds the uncompressed_bytes limit"
        );
    }

    /// What callers see names the kind of failure and nothing the registry
    /// sent: no URL, host, status body or realm.
    #[test]
    fn descriptions_carry_nothing_from_the_registry() {
        let error = FetchError::from_registry(
            "registry.example.com:5000",
            "registry.example.com:5000/channel:v1",
            status(502, &[]),
        );
        assert_eq!(error.kind().describe(), "registry unreachable");
        assert_eq!(
            FetchErrorKind::LimitExceeded(Limit::MemoryBudget).describe(),
            "the image exceeds the server's limit on memory budget (--memory-budget)"
        );
        for kind in ALL {
            let message = kind.describe();
            for leak in ["registry.example.com", "secret", "http", "sha256", "5000"] {
                assert!(!message.contains(leak), "{message}");
            }
            assert!(message.len() < 120, "{message}");
        }
    }
}
