//! elemental-changelog-auth: delegated authentication and authorization, as k8s.io/apiserver
//! does them for extension API servers.
//!
//! It knows request headers, certificates, TokenReview and SubjectAccessReview, and nothing of
//! channels, routes or the server's metrics registry: what it counts goes through
//! [`AuthMetrics`].
//!
//! - [`authn`]: front-proxy request headers, client certificates, bearer tokens (TokenReview),
//!   configured from the watched `kube-system/extension-apiserver-authentication` ConfigMap;
//! - [`authz`]: SubjectAccessReview of [`Attributes`];
//! - [`review`]: how both call the kube API: one cache of answers with coalesced lookups and a
//!   bound on reviews in flight, retried with backoff under a timeout.

pub mod attributes;
pub mod authn;
pub mod authz;
pub mod review;
mod singleflight;

pub use self::attributes::{Attributes, ResourceAttributes};

/// How a request was authenticated, or that it was not: the `result` label of the
/// authentication metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Authentication {
    /// Front-proxy request headers, with a verified front-proxy certificate.
    RequestHeader,
    /// A client certificate.
    X509,
    /// A bearer token (TokenReview).
    Token,
    /// Nothing offered: the anonymous user.
    Anonymous,
    /// Refused (401), or the review failed.
    Failed,
}

impl Authentication {
    /// The label value (`requestheader`, `x509`, `token`, `anonymous`, `failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestHeader => "requestheader",
            Self::X509 => "x509",
            Self::Token => "token",
            Self::Anonymous => "anonymous",
            Self::Failed => "failed",
        }
    }
}

/// An authorization decision: the `decision` label of the authorization metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Authorization {
    /// Allowed.
    Allowed,
    /// Denied (403).
    Denied,
    /// The review failed.
    Error,
}

impl Authorization {
    /// The label value (`allowed`, `denied`, `error`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Error => "error",
        }
    }
}

/// What the authenticator and the authorizer count. The server's metrics implement it; tests
/// use [`NoMetrics`].
pub trait AuthMetrics: Send + Sync {
    /// A request was authenticated, or not.
    fn authentication(&self, result: Authentication);
    /// An authorization decision.
    fn authorization(&self, decision: Authorization);
    /// The authentication ConfigMap was listed (or found missing).
    fn config_watch_synced(&self);
    /// Watching the authentication ConfigMap failed (it is retried).
    fn config_watch_failed(&self);
}

/// Counts nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMetrics;

impl AuthMetrics for NoMetrics {
    fn authentication(&self, _: Authentication) {}
    fn authorization(&self, _: Authorization) {}
    fn config_watch_synced(&self) {}
    fn config_watch_failed(&self) {}
}

/// Seconds a watch lasts before it is renewed: kube-rs ends a watch whose connection went
/// silent only after its timeout plus a margin, so a short one bounds how long a half-open
/// connection can hide a change of the authentication ConfigMap.
pub const WATCH_TIMEOUT_SECONDS: u32 = 60;
