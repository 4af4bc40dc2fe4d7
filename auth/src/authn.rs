//! Delegated authentication, as k8s.io/apiserver does it for extension API servers
//! (`authenticatorfactory/delegating.go`): every request is tried against, in order,
//!
//! 1. **front-proxy request headers** (`X-Remote-User`, ...), trusted only when the client
//!    certificate verifies against the requestheader CA with the clientAuth usage and, when
//!    allowed names are configured, carries one of them as common name;
//! 2. **client certificates** signed by `client-ca-file` (user = CN, groups = O);
//! 3. **bearer tokens**, reviewed by the kube API through TokenReview (cached, coalesced).
//!
//! The first authenticator that recognises the request wins. One that finds credentials it
//! cannot accept records an error and the next is tried; a request no authenticator accepted
//! is refused with the first error when there was any (HTTP 401), and is anonymous
//! (`system:anonymous` in `system:unauthenticated`) only when it carried no credentials at all.
//! Every authenticated user also gets `system:authenticated`.
//!
//! Both CAs and the header names come from the ConfigMap
//! `kube-system/extension-apiserver-authentication`, kept current by [`watch_config`].
//! Front-proxy headers are removed from every request, trusted or not, so no handler ever sees
//! them; the `Authorization` header is removed once the request is authenticated.

mod config;
mod request_header;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
mod token;
mod watch;

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, LazyLock},
    time::Duration,
};

use arc_swap::ArcSwap;
use http::{HeaderMap, header::AUTHORIZATION};
use kube::Client;
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio::sync::watch as signal;

use elemental_changelog_certs::client::VerifyError;

pub use self::{
    config::{
        AuthConfig, CLIENT_CA_FILE, CONFIG_MAP_NAME, CONFIG_MAP_NAMESPACE, ConfigError,
        REQUESTHEADER_ALLOWED_NAMES, REQUESTHEADER_CLIENT_CA_FILE,
        REQUESTHEADER_EXTRA_HEADERS_PREFIX, REQUESTHEADER_GROUP_HEADERS, REQUESTHEADER_UID_HEADERS,
        REQUESTHEADER_USERNAME_HEADERS,
    },
    watch::{WatchError, watch_config},
};
use self::{request_header::HeaderNames, token::TokenAuthenticator};
pub use crate::review::ReviewError;
use crate::{AuthMetrics, Authentication};

/// The user of requests that carry no credentials.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The group of every authenticated user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The group of [`ANONYMOUS_USER`].
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";

/// Who made a request, as k8s.io/apiserver's `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// User name.
    pub name: String,
    /// Unique id of the user, when the authenticator knows one (never `Some("")`).
    pub uid: Option<String>,
    /// Groups, in the order the authenticator gave them.
    pub groups: Vec<String>,
    /// Extra attributes (scopes, credential ids, ...), keys lower-case.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..Self::default()
        }
    }

    /// Adds `system:authenticated`, as k8s.io/apiserver's `AuthenticatedGroupAdder`: not to
    /// `system:anonymous`, nor to a user already in `system:authenticated` or
    /// `system:unauthenticated`.
    fn authenticated(mut self) -> Self {
        let marked = self
            .groups
            .iter()
            .any(|group| group == AUTHENTICATED_GROUP || group == UNAUTHENTICATED_GROUP);
        if self.name != ANONYMOUS_USER && !marked {
            self.groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        self
    }
}

/// Why a request carrying credentials is not authenticated. The server answers 401
/// `Unauthorized` (kube-apiserver's message is just "Unauthorized"; the detail is for logs).
#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    /// The client certificate does not verify against the requestheader CA.
    #[error("not a front-proxy client certificate")]
    FrontProxyCertificate(#[source] VerifyError),
    /// The front-proxy certificate's common name is not one of the allowed names.
    #[error("front-proxy client certificate with CN {common_name:?} is not in the allowed names")]
    FrontProxyNotAllowed {
        /// The certificate's common name.
        common_name: String,
    },
    /// The client certificate does not verify against `client-ca-file`.
    #[error("client certificate not trusted")]
    ClientCertificate(#[source] VerifyError),
    /// TokenReview says the bearer token identifies no one.
    #[error("invalid bearer token")]
    InvalidToken,
    /// TokenReview says the bearer token identifies no one, and why.
    #[error("bearer token rejected: {message}")]
    TokenRejected {
        /// The review's `status.error`.
        message: String,
    },
    /// The token could not be reviewed.
    #[error("token review failed")]
    TokenReview(#[source] Arc<ReviewError>),
}

impl AuthnError {
    /// Whether the token was not reviewed because too many reviews are in flight.
    pub fn is_saturated(&self) -> bool {
        matches!(self, Self::TokenReview(e) if e.is_saturated())
    }
}

/// Authentication flags, named as k8s.io/apiserver's delegating authentication options.
#[derive(Clone, Debug, clap::Args)]
pub struct AuthnArgs {
    /// How long TokenReview answers (authenticated or not) are cached; 0 disables the cache.
    #[arg(
        long = "authentication-token-webhook-cache-ttl",
        env = "ELEMENTAL_CHANGELOG_AUTHENTICATION_TOKEN_WEBHOOK_CACHE_TTL",
        default_value = "10s",
        value_parser = humantime::parse_duration,
    )]
    pub token_cache_ttl: Duration,
}

/// Whether bearer tokens are reviewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// A bearer token is reviewed (TokenReview).
    Review,
    /// A bearer token is ignored, as if absent.
    Ignore,
}

/// k8s.io/apiserver's standard front-proxy headers, stripped whatever the configuration says.
static STANDARD_HEADERS: LazyLock<HeaderNames> = LazyLock::new(HeaderNames::standard);

/// Authenticates requests; see the [module documentation](self). Cheap to share behind an
/// [`Arc`]; the configuration is swapped atomically by [`watch_config`].
pub struct Authenticator {
    config: ArcSwap<AuthConfig>,
    client: Client,
    tokens: TokenAuthenticator,
    ready: signal::Sender<bool>,
    metrics: Arc<dyn AuthMetrics>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("config", &self.config.load())
            .field("ready", &*self.ready.borrow())
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// An authenticator that reviews tokens (and watches its configuration, see [`Self::run`])
    /// through `client`, counting results in `metrics`. Its configuration is empty (tokens and
    /// anonymous only) until one is loaded, and it is not ready until then.
    pub fn new(client: Client, args: &AuthnArgs, metrics: Arc<dyn AuthMetrics>) -> Self {
        Self {
            config: ArcSwap::from_pointee(AuthConfig::default()),
            tokens: TokenAuthenticator::new(client.clone(), args.token_cache_ttl),
            client,
            ready: signal::Sender::new(false),
            metrics,
        }
    }

    /// Keeps the configuration current ([`watch_config`] with the authenticator's client) and
    /// sets `ready` once it is first loaded. Runs until the watch ends, which is logged as an
    /// error: the caller should stop the process.
    pub async fn run(self: Arc<Self>, on_ready: impl FnOnce() + Send) {
        let client = self.client.clone();
        let watch = watch_config(client, Arc::clone(&self));
        let flag = async {
            self.wait_until_ready().await;
            on_ready();
            std::future::pending::<()>().await;
        };
        tokio::select! {
            result = watch => {
                let Err(error) = result;
                tracing::error!(error = &error as &dyn std::error::Error, "authentication configuration watch stopped");
            }
            () = flag => {}
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> Arc<AuthConfig> {
        self.config.load_full()
    }

    /// Replaces the configuration; requests that start afterwards use the new one.
    pub fn set_config(&self, config: AuthConfig) {
        self.config.store(Arc::new(config));
    }

    /// Parses the authentication ConfigMap's `data` and uses it; unusable keys are logged and
    /// disable their authenticator.
    pub fn load_config_map(&self, data: &BTreeMap<String, String>) {
        let (config, errors) = AuthConfig::from_data(data);
        for error in &errors {
            tracing::error!(
                error = error as &dyn std::error::Error,
                key = error.key(),
                "unusable key in {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}, its authenticator is disabled"
            );
        }
        tracing::info!(
            front_proxy = config.request_header_enabled(),
            client_certificates = config.client_ca_enabled(),
            "loaded authentication configuration from {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}"
        );
        self.set_config(config);
    }

    /// Whether the configuration was loaded once (or found missing) by [`watch_config`].
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until [`Self::is_ready`].
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        ready.wait_for(|ready| *ready).await.ok();
    }

    fn mark_ready(&self) {
        self.ready.send_replace(true);
        self.metrics.config_watch_synced();
    }

    /// Counts a failure of the configuration watch.
    fn watch_failed(&self) {
        self.metrics.config_watch_failed();
    }

    /// Authenticates a request from its headers and the client certificate chain of its
    /// connection (leaf first). Front-proxy headers (the configured ones and the standard
    /// `X-Remote-*`) are removed from `headers` whatever the outcome, and `Authorization`
    /// too when the request is authenticated (anonymous included).
    pub async fn authenticate(
        &self,
        headers: &mut HeaderMap,
        peer_chain: Option<&[CertificateDer<'static>]>,
    ) -> Result<UserInfo, AuthnError> {
        self.authenticate_request(headers, peer_chain, Tokens::Review)
            .await
            .map(|(user, _)| user)
    }

    /// [`Self::authenticate`] without reviewing bearer tokens (a token is ignored, as if
    /// absent): for health paths, whose answer is the same for everyone, so that probes
    /// carrying any token cost no TokenReview. Certificates are still checked (locally).
    pub async fn authenticate_without_review(
        &self,
        headers: &mut HeaderMap,
        peer_chain: Option<&[CertificateDer<'static>]>,
    ) -> Result<UserInfo, AuthnError> {
        self.authenticate_request(headers, peer_chain, Tokens::Ignore)
            .await
            .map(|(user, _)| user)
    }

    /// [`Self::authenticate`], or [`Self::authenticate_without_review`] with
    /// [`Tokens::Ignore`], telling how the user was authenticated too (for an access log:
    /// [`Authentication::RequestHeader`] is a request kube-apiserver's aggregator passed on).
    pub async fn authenticate_request(
        &self,
        headers: &mut HeaderMap,
        peer_chain: Option<&[CertificateDer<'static>]>,
        tokens: Tokens,
    ) -> Result<(UserInfo, Authentication), AuthnError> {
        let config = self.config.load_full();
        let chain = peer_chain.filter(|chain| !chain.is_empty());
        let result = self
            .authenticate_with(&config, headers, chain, tokens)
            .await;
        self.metrics.authentication(match &result {
            Ok((_, method)) => *method,
            Err(_) => Authentication::Failed,
        });
        STANDARD_HEADERS.strip(headers);
        if let Some(names) = &config.strip {
            names.strip(headers);
        }
        if result.is_ok() {
            headers.remove(AUTHORIZATION);
        }
        result
    }

    async fn authenticate_with(
        &self,
        config: &AuthConfig,
        headers: &HeaderMap,
        chain: Option<&[CertificateDer<'static>]>,
        tokens: Tokens,
    ) -> Result<(UserInfo, Authentication), AuthnError> {
        let now = UnixTime::now();
        let mut errors = Vec::new();
        if let (Some(front_proxy), Some(chain)) = (&config.request_header, chain) {
            match front_proxy.authenticate(headers, chain, now) {
                Ok(Some(user)) => return Ok((user.authenticated(), Authentication::RequestHeader)),
                Ok(None) => {}
                Err(error) => errors.push(error),
            }
        }
        if let (Some(ca), Some(chain)) = (&config.client_ca, chain) {
            match ca.verify_client_chain(chain, now) {
                // A certificate without CN identifies no one (x509.CommonNameUserConversion).
                Ok(client) if client.common_name.is_empty() => {}
                Ok(client) => {
                    let user = UserInfo {
                        name: client.common_name,
                        uid: None,
                        groups: client.organizations,
                        extra: BTreeMap::new(),
                    };
                    return Ok((user.authenticated(), Authentication::X509));
                }
                Err(error) => errors.push(AuthnError::ClientCertificate(error)),
            }
        }
        if let (Tokens::Review, Some(token)) = (tokens, token::bearer_token(headers)) {
            match self.tokens.authenticate(&token).await {
                Ok(user) => return Ok((user.authenticated(), Authentication::Token)),
                Err(error) => errors.push(error),
            }
        }
        let mut errors = errors.into_iter();
        match errors.next() {
            None => Ok((UserInfo::anonymous(), Authentication::Anonymous)),
            Some(first) => {
                for other in errors {
                    tracing::debug!(
                        error = &other as &dyn std::error::Error,
                        "another authenticator failed too"
                    );
                }
                Err(first)
            }
        }
    }
}
