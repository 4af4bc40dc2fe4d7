//! The registry's HTTP API, as much of it as pulling needs (OCI distribution
//! spec: manifests by tag or digest, blobs, and the token authentication of
//! Docker's registry), with every response read under a size and a time
//! limit.
//!
//! Manifests, indexes, token answers and error bodies are small by nature:
//! they are read whole, but never more than [`ResponseLimits`] allows nor for
//! longer than [`FetchConfig::read_timeout`] in all, so that a registry (or a
//! proxy in the way) that answers gigabytes, or trickles bytes forever, costs
//! a bounded amount of memory and time. Blobs are streamed by the caller
//! (see `stream`), which applies the image limits.
//!
//! Every redirect and token realm is checked before it is followed (see
//! [`crate::hop`]). Token realms on another host than the registry are
//! logged; credentials are sent to a realm only over HTTPS (or to a registry
//! configured as plain HTTP).

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use oci_client::Reference;
use reqwest::{Method, StatusCode, header};
use serde::Deserialize;
use tokio::time::Instant;

use crate::{
    config::{Access, Credential, FetchConfig, PullFor},
    digest::Hasher,
    hop::{Hop, HopRefused, Hops, host_port, refused_redirect, without_query},
};

/// Largest manifest or index read (the OCI distribution spec asks registries
/// to accept manifests of at least 4 MiB; containerd reads at most that).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Largest token answer read (real ones are a few KiB).
pub const MAX_TOKEN_BYTES: u64 = 256 << 10;
/// Largest error body read (the rest is not needed to classify the error).
pub const MAX_ERROR_BYTES: u64 = 64 << 10;
/// Characters of a registry's error message kept for the logs.
const MAX_MESSAGE_CHARS: usize = 200;
/// Token lifetime when the answer does not say (the distribution spec's default).
const DEFAULT_TOKEN_SECONDS: u64 = 60;
/// Tokens kept (one per registry and repository).
const MAX_TOKENS: usize = 1024;

/// Accepted manifest media types, in `Accept` order.
pub const MANIFEST_MEDIA_TYPES: [&str; 4] = [
    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
];

/// Size limits of the responses read whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseLimits {
    /// Largest manifest or index.
    pub manifest_bytes: u64,
    /// Largest token answer.
    pub token_bytes: u64,
}

impl Default for ResponseLimits {
    fn default() -> Self {
        Self {
            manifest_bytes: MAX_MANIFEST_BYTES,
            token_bytes: MAX_TOKEN_BYTES,
        }
    }
}

/// What a response was read for, in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// A manifest or an index.
    Manifest,
    /// A token answer.
    Token,
    /// A blob (its headers).
    Blob,
    /// An error answer.
    Error,
}

impl fmt::Display for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Manifest => "manifest",
            Self::Token => "token answer",
            Self::Blob => "blob",
            Self::Error => "error answer",
        })
    }
}

/// Why a registry request failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RegistryError {
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Build(#[source] Arc<reqwest::Error>),
    /// Connecting, sending or receiving failed.
    #[error("request to {url} failed")]
    Transport {
        /// The URL asked for (without query).
        url: String,
        /// The transport error.
        #[source]
        source: Arc<reqwest::Error>,
    },
    /// The registry answered with an error status.
    #[error("{url} answered {status}{}", codes_and_message(codes, message))]
    Status {
        /// The URL asked for (without query).
        url: String,
        /// The HTTP status.
        status: u16,
        /// The error codes of an OCI error envelope (`MANIFEST_UNKNOWN`, ...).
        codes: Vec<String>,
        /// The first error message, shortened.
        message: Option<String>,
    },
    /// A response was larger than its limit.
    #[error("{body} from {url} is larger than {limit} bytes")]
    TooLarge {
        /// What was read.
        body: Body,
        /// The URL.
        url: String,
        /// The limit.
        limit: u64,
    },
    /// A response did not arrive whole in time.
    #[error("{body} from {url} did not arrive within {after:?}")]
    Timeout {
        /// What was read.
        body: Body,
        /// The URL.
        url: String,
        /// The time limit.
        after: Duration,
    },
    /// A 401 whose challenge this client cannot answer.
    #[error("{url} asks for authentication this client cannot give ({challenge})")]
    Challenge {
        /// The URL.
        url: String,
        /// The challenge's scheme, or why it does not parse.
        challenge: String,
    },
    /// A token answer without a token.
    #[error("the token answer from {realm} has no token")]
    Token {
        /// The realm (without query).
        realm: String,
        /// Why it does not parse.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A realm that is not an HTTP(S) URL.
    #[error("invalid token realm {realm:?}")]
    Realm {
        /// The realm as given.
        realm: String,
    },
    /// A redirect or token realm to a host the pull may not reach: nothing was sent there.
    #[error(transparent)]
    Hop(HopRefused),
    /// A 200 to a digest query without a usable `Docker-Content-Digest`.
    #[error("{url} sent no content digest")]
    NoDigest {
        /// The URL.
        url: String,
    },
}

fn codes_and_message(codes: &[String], message: &Option<String>) -> String {
    let mut out = String::new();
    if !codes.is_empty() {
        out.push_str(&format!(" {}", codes.join(",")));
    }
    if let Some(message) = message {
        out.push_str(&format!(": {message}"));
    }
    out
}

impl RegistryError {
    /// Whether the registry refused the credentials (or their absence).
    pub fn is_auth(&self) -> bool {
        match self {
            Self::Status { status, codes, .. } => {
                matches!(*status, 401 | 403)
                    || codes.iter().any(|c| c == "UNAUTHORIZED" || c == "DENIED")
            }
            Self::Challenge { .. } => true,
            _ => false,
        }
    }

    /// Whether the registry has no such repository, manifest or blob.
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::Status { status, codes, .. } => {
                *status == 404
                    || codes.iter().any(|c| {
                        matches!(
                            c.as_str(),
                            "MANIFEST_UNKNOWN" | "BLOB_UNKNOWN" | "NAME_UNKNOWN"
                        )
                    })
            }
            _ => false,
        }
    }
}

/// An OCI error envelope: `{"errors":[{"code":...,"message":...}]}`.
#[derive(Deserialize)]
struct Envelope {
    errors: Vec<EnvelopeError>,
}

#[derive(Deserialize)]
struct EnvelopeError {
    code: String,
    #[serde(default)]
    message: String,
}

/// A token answer (`token`, or OAuth2's `access_token`).
#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// What to send for a registry.
#[derive(Clone)]
enum Authorization {
    Bearer(String),
    Basic(Credential),
}

struct Token {
    value: String,
    expires: Instant,
}

/// Registry, repository, and the credential a token was asked for with.
type TokenKey = (String, String, Access);

/// A registry client: one HTTP connection pool, tokens by registry and
/// repository. Cheap to share behind an `Arc`.
pub struct RegistryClient {
    http: reqwest::Client,
    config: FetchConfig,
    hops: Hops,
    limits: ResponseLimits,
    /// By registry, repository and the credential the token was asked for with: a token
    /// got with a credential is never used by a pull that may not send it.
    tokens: Mutex<HashMap<TokenKey, Token>>,
}

impl fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryClient")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A manifest as received.
#[derive(Debug)]
pub struct ManifestBody {
    /// The bytes.
    pub bytes: Bytes,
    /// `Docker-Content-Digest`, when sent.
    pub digest: Option<String>,
}

impl RegistryClient {
    /// A client with the fetcher's TLS settings and timeouts. A rustls
    /// `CryptoProvider` must be installed as the process default first.
    pub fn new(config: FetchConfig, limits: ResponseLimits) -> Result<Self, RegistryError> {
        let hops = Hops::new(&config);
        let mut builder = reqwest::Client::builder()
            .redirect(hops.clone().redirect_policy())
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .user_agent(concat!("elemental-changelog/", env!("CARGO_PKG_VERSION")));
        let mut roots = Vec::new();
        for der in &config.extra_roots {
            roots.push(
                reqwest::Certificate::from_der(der)
                    .map_err(|source| RegistryError::Build(Arc::new(source)))?,
            );
        }
        builder = builder.tls_certs_merge(roots);
        let http = builder
            .build()
            .map_err(|source| RegistryError::Build(Arc::new(source)))?;
        Ok(Self {
            http,
            config,
            hops,
            limits,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    fn scheme(&self, registry: &str) -> &'static str {
        if self
            .config
            .insecure_registries
            .iter()
            .any(|r| r == registry)
        {
            "http"
        } else {
            "https"
        }
    }

    fn url(&self, reference: &Reference, kind: &str, name: &str) -> String {
        let registry = reference.resolve_registry();
        let ns = reference
            .namespace()
            .map(|ns| format!("?ns={ns}"))
            .unwrap_or_default();
        format!(
            "{}://{registry}/v2/{}/{kind}/{name}{ns}",
            self.scheme(registry),
            reference.repository()
        )
    }

    fn manifest_url(reference: &Reference) -> &str {
        reference
            .digest()
            .unwrap_or_else(|| reference.tag().unwrap_or("latest"))
    }

    /// The digest the reference points at: `Docker-Content-Digest` of a
    /// HEAD request, or the SHA-256 of the manifest when the registry does
    /// not send it.
    pub async fn manifest_digest(
        &self,
        reference: &Reference,
        pull_for: PullFor<'_>,
    ) -> Result<String, RegistryError> {
        let url = self.url(reference, "manifests", Self::manifest_url(reference));
        let response = self
            .send(reference, pull_for, Method::HEAD, &url, true)
            .await?;
        if let Some(digest) = content_digest(&response) {
            return Ok(digest);
        }
        let body = self.manifest(reference, pull_for).await?;
        match body.digest {
            Some(digest) => Ok(digest),
            None => Ok(Hasher::sha256_of(&body.bytes)),
        }
    }

    /// The manifest (or index) the reference names, read whole under
    /// [`ResponseLimits::manifest_bytes`].
    pub async fn manifest(
        &self,
        reference: &Reference,
        pull_for: PullFor<'_>,
    ) -> Result<ManifestBody, RegistryError> {
        let url = self.url(reference, "manifests", Self::manifest_url(reference));
        let deadline = Instant::now() + self.config.read_timeout;
        let response = self
            .send(reference, pull_for, Method::GET, &url, true)
            .await?;
        let digest = content_digest(&response);
        let bytes = self
            .read(
                response,
                Body::Manifest,
                self.limits.manifest_bytes,
                deadline,
            )
            .await?;
        Ok(ManifestBody { bytes, digest })
    }

    /// A blob's response, to be streamed by the caller.
    pub async fn blob(
        &self,
        reference: &Reference,
        digest: &str,
        pull_for: PullFor<'_>,
    ) -> Result<reqwest::Response, RegistryError> {
        let url = self.url(reference, "blobs", digest);
        self.send(reference, pull_for, Method::GET, &url, false)
            .await
    }

    /// Sends a request with the registry's authorization, answering one
    /// authentication challenge; error statuses become [`RegistryError::Status`].
    async fn send(
        &self,
        reference: &Reference,
        pull_for: PullFor<'_>,
        method: Method,
        url: &str,
        manifest: bool,
    ) -> Result<reqwest::Response, RegistryError> {
        let registry = reference.resolve_registry();
        let key = (
            registry.to_owned(),
            reference.repository().to_owned(),
            self.config.credentials.access(registry, pull_for),
        );
        let mut authorization = self.cached_token(&key).map(Authorization::Bearer);
        let mut challenged = false;
        loop {
            let mut request = self.http.request(method.clone(), url);
            if manifest {
                request = request.header(header::ACCEPT, MANIFEST_MEDIA_TYPES.join(", "));
            }
            request = match &authorization {
                Some(Authorization::Bearer(token)) => request.bearer_auth(token),
                Some(Authorization::Basic(credential)) => {
                    request.basic_auth(&credential.username, Some(&credential.password))
                }
                None => request,
            };
            let deadline = Instant::now() + self.config.read_timeout;
            let response = tokio::time::timeout_at(deadline, request.send())
                .await
                .map_err(|_| RegistryError::Timeout {
                    body: if manifest { Body::Manifest } else { Body::Blob },
                    url: url.to_owned(),
                    after: self.config.read_timeout,
                })?
                .map_err(|source| transport(url, source))?;
            if response.status() == StatusCode::UNAUTHORIZED && !challenged {
                challenged = true;
                let challenge = response
                    .headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|value| value.to_str().ok())
                    .map(Challenge::parse);
                authorization = Some(match challenge {
                    Some(Some(Challenge::Bearer { realm, service })) => {
                        let token = self
                            .token(reference, pull_for, &realm, service.as_deref(), url)
                            .await?;
                        self.store_token(key.clone(), &token);
                        Authorization::Bearer(token.value)
                    }
                    Some(Some(Challenge::Basic)) => match self.credential(registry, pull_for) {
                        Some(credential) => Authorization::Basic(credential),
                        None => return Err(self.status_error(response, url).await),
                    },
                    Some(None) | None => {
                        return Err(RegistryError::Challenge {
                            url: url.to_owned(),
                            challenge: "unknown scheme".to_owned(),
                        });
                    }
                });
                continue;
            }
            if !response.status().is_success() {
                return Err(self.status_error(response, url).await);
            }
            return Ok(response);
        }
    }

    fn credential(&self, registry: &str, pull_for: PullFor<'_>) -> Option<Credential> {
        self.config
            .credentials
            .for_pull(registry, pull_for)
            .cloned()
    }

    /// Asks `realm` for a pull token for the reference's repository.
    async fn token(
        &self,
        reference: &Reference,
        pull_for: PullFor<'_>,
        realm: &str,
        service: Option<&str>,
        url: &str,
    ) -> Result<Token, RegistryError> {
        let registry = reference.resolve_registry();
        let parsed = reqwest::Url::parse(realm)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| RegistryError::Realm {
                realm: shorten(realm),
            })?;
        self.hops
            .check(Hop::TokenRealm, self.scheme(registry), &parsed)
            .map_err(RegistryError::Hop)?;
        let realm_host = host_port(&parsed);
        let registry_host = registry.to_ascii_lowercase();
        if realm_host != registry_host {
            tracing::warn!(
                registry,
                realm = %without_query(&parsed),
                "the registry sends clients to a token server on another host"
            );
        }
        let mut request = self.http.get(parsed.clone()).query(&[(
            "scope",
            format!("repository:{}:pull", reference.repository()),
        )]);
        if let Some(service) = service {
            request = request.query(&[("service", service)]);
        }
        // Credentials go only where they cannot be read on the way.
        let plain_ok = parsed.scheme() == "https"
            || (realm_host == registry_host && self.scheme(registry) == "http");
        if let Some(credential) = self.credential(registry, pull_for) {
            if plain_ok {
                request = request.basic_auth(&credential.username, Some(&credential.password));
            } else {
                tracing::warn!(registry, realm = %without_query(&parsed), "not sending credentials to a plain-HTTP token realm");
            }
        }
        let realm_url = without_query(&parsed);
        let deadline = Instant::now() + self.config.read_timeout;
        let response = tokio::time::timeout_at(deadline, request.send())
            .await
            .map_err(|_| RegistryError::Timeout {
                body: Body::Token,
                url: realm_url.clone(),
                after: self.config.read_timeout,
            })?
            .map_err(|source| transport(&realm_url, source))?;
        if !response.status().is_success() {
            return Err(self.status_error(response, &realm_url).await);
        }
        let body = self
            .read(response, Body::Token, self.limits.token_bytes, deadline)
            .await?;
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|source| RegistryError::Token {
                realm: realm_url.clone(),
                source: Arc::new(source),
            })?;
        let value = answer.token.or(answer.access_token).unwrap_or_default();
        if value.is_empty() {
            return Err(RegistryError::Token {
                realm: realm_url,
                source: Arc::new(serde::de::Error::missing_field("token")),
            });
        }
        tracing::debug!(url, "got a registry token");
        let seconds = answer.expires_in.unwrap_or(DEFAULT_TOKEN_SECONDS).max(1);
        Ok(Token {
            value,
            // Renewed a little early, so a token does not expire in flight.
            expires: Instant::now() + Duration::from_secs(seconds).mul_f64(0.9),
        })
    }

    fn cached_token(&self, key: &TokenKey) -> Option<String> {
        let tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens
            .get(key)
            .filter(|t| t.expires > Instant::now())
            .map(|t| t.value.clone())
    }

    fn store_token(&self, key: TokenKey, token: &Token) {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        if tokens.len() >= MAX_TOKENS {
            let now = Instant::now();
            tokens.retain(|_, t| t.expires > now);
            if tokens.len() >= MAX_TOKENS {
                tokens.clear();
            }
        }
        tokens.insert(
            key,
            Token {
                value: token.value.clone(),
                expires: token.expires,
            },
        );
    }

    /// [`RegistryError::Status`] from an error answer, its body read under
    /// [`MAX_ERROR_BYTES`] and the read timeout.
    async fn status_error(&self, response: reqwest::Response, url: &str) -> RegistryError {
        let status = response.status().as_u16();
        let deadline = Instant::now() + self.config.read_timeout;
        let body = self
            .read(response, Body::Error, MAX_ERROR_BYTES, deadline)
            .await
            .unwrap_or_default();
        let (codes, message) = match serde_json::from_slice::<Envelope>(&body) {
            Ok(envelope) => (
                envelope
                    .errors
                    .iter()
                    .take(8)
                    .map(|e| shorten(&e.code))
                    .collect(),
                envelope.errors.first().map(|e| shorten(&e.message)),
            ),
            Err(_) => (
                Vec::new(),
                Some(shorten(&String::from_utf8_lossy(&body))).filter(|m| !m.is_empty()),
            ),
        };
        RegistryError::Status {
            url: url.to_owned(),
            status,
            codes,
            message,
        }
    }

    /// Reads a whole body, refusing more than `limit` bytes (announced or
    /// received) and stopping at `deadline`.
    async fn read(
        &self,
        mut response: reqwest::Response,
        body: Body,
        limit: u64,
        deadline: Instant,
    ) -> Result<Bytes, RegistryError> {
        let url = without_query(response.url());
        let too_large = || RegistryError::TooLarge {
            body,
            url: url.clone(),
            limit,
        };
        if response.content_length().is_some_and(|len| len > limit) {
            return Err(too_large());
        }
        let mut out = BytesMut::new();
        loop {
            let chunk = tokio::time::timeout_at(deadline, response.chunk())
                .await
                .map_err(|_| RegistryError::Timeout {
                    body,
                    url: url.clone(),
                    after: self.config.read_timeout,
                })?
                .map_err(|source| RegistryError::Transport {
                    url: url.clone(),
                    source: Arc::new(source),
                })?;
            let Some(chunk) = chunk else {
                return Ok(out.freeze());
            };
            if (out.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            out.extend_from_slice(&chunk);
        }
    }
}

fn content_digest(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 200 && v.contains(':'))
        .map(str::to_owned)
}

/// A failed request as [`RegistryError::Transport`], or [`RegistryError::Hop`] when a
/// redirect was refused.
fn transport(url: &str, source: reqwest::Error) -> RegistryError {
    match refused_redirect(&source) {
        Some(refused) => RegistryError::Hop(refused),
        None => RegistryError::Transport {
            url: url.to_owned(),
            source: Arc::new(source),
        },
    }
}

/// At most [`MAX_MESSAGE_CHARS`] characters, control characters replaced.
fn shorten(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(MAX_MESSAGE_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(MAX_MESSAGE_CHARS).is_some() {
        out.push('…');
    }
    out.trim().to_owned()
}

/// A `WWW-Authenticate` challenge this client can answer.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
    },
    Basic,
}

impl Challenge {
    /// Parses `Bearer realm="…",service="…"` or `Basic realm="…"`; `None`
    /// for any other scheme or a Bearer challenge without a realm.
    fn parse(header: &str) -> Option<Self> {
        let header = header.trim();
        let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Self::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = parse_params(params);
        let realm = params.get("realm")?.clone();
        Some(Self::Bearer {
            realm,
            service: params.get("service").cloned(),
        })
    }
}

/// `key="quoted \" value", key=token` pairs (keys lower-cased).
fn parse_params(input: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut chars = input.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars
            .by_ref()
            .take_while(|c| *c != '=')
            .collect::<String>()
            .trim()
            .to_ascii_lowercase();
        if key.is_empty() {
            return out;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
            value = value.trim().to_owned();
        }
        out.insert(key, value);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"bearer realm="http://x/t\"q", service=svc"#),
            Some(Challenge::Bearer {
                realm: "http://x/t\"q".into(),
                service: Some("svc".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(Challenge::parse(r#"Bearer service="x""#), None);
        assert_eq!(Challenge::parse("Negotiate abc"), None);
        assert_eq!(Challenge::parse(""), None);
    }

    #[test]
    fn errors_are_sorted_and_shortened() {
        let status = |status, codes: &[&str]| RegistryError::Status {
            url: "u".into(),
            status,
            codes: codes.iter().map(|c| (*c).to_owned()).collect(),
            message: None,
        };
        assert!(status(401, &[]).is_auth());
        assert!(status(403, &[]).is_auth());
        assert!(status(400, &["DENIED"]).is_auth());
        assert!(status(404, &[]).is_not_found());
        assert!(status(400, &["MANIFEST_UNKNOWN"]).is_not_found());
        assert!(!status(502, &["TOOMANYREQUESTS"]).is_auth());
        assert!(!status(502, &[]).is_not_found());
        let long = "x\n".repeat(500);
        let short = shorten(&long);
        assert!(short.chars().count() <= MAX_MESSAGE_CHARS + 1, "{short}");
        assert!(!short.contains('\n'));
        let url = reqwest::Url::parse("https://u:p@realm.example:8443/token?scope=x#f").unwrap();
        assert_eq!(without_query(&url), "https://realm.example:8443/token");
        assert_eq!(host_port(&url), "realm.example:8443");
    }
}
