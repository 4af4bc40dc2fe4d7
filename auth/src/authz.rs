//! Delegated authorization, as k8s.io/apiserver does it for extension API servers
//! (`pkg/server/options/authorization.go`, `authorizerfactory/delegating.go`,
//! `plugin/pkg/authorizer/webhook/webhook.go`): a union of
//!
//! 1. the privileged group `system:masters` (always allowed),
//! 2. `--authorization-always-allow-paths` for non-resource requests (`/healthz`, `/readyz`,
//!    `/livez` by default; a trailing `*` matches a prefix),
//! 3. a SubjectAccessReview (`authorization.k8s.io/v1`) asked of the kube API with the user and
//!    the request's [`Attributes`]; allowed and denied answers are cached (10 s each by
//!    default), concurrent identical reviews coalesced, transient failures retried with
//!    backoff (500 ms × 1.5, 5 attempts) within 10 s.
//!
//! A review that says neither allowed nor denied is a denial ("no opinion"). As
//! `filters/authorization.go` does, callers answer a [`Decision::Deny`] with 403 `Forbidden`
//! (the message is built from the attributes and the reason) and an [`AuthzError`] with 500
//! (kube-apiserver writes `Internal Server Error: "<request URI>": <error>`).

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::{fmt, str::FromStr, sync::Arc, time::Duration};

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes as SarResourceAttributes, SubjectAccessReview,
    SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::{Api, Client, api::PostParams};

use sha2::{Digest, Sha256};

use crate::{
    Attributes, AuthMetrics, Authorization,
    authn::UserInfo,
    review::{
        CACHE_CAPACITY, DEFAULT_BACKOFF, REVIEW_TIMEOUT, ReviewCache, ReviewError, with_backoff,
    },
};

/// The group whose members are allowed everything without a review.
pub const PRIVILEGED_GROUP: &str = "system:masters";

/// Requests whose attributes are longer than this (in all) are reviewed every time, as in
/// k8s.io/apiserver (`maxControlledAttrCacheSize`).
const MAX_CACHED_ATTRIBUTES_SIZE: usize = 10_000;

/// The outcome of authorization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The request may proceed.
    Allow,
    /// The request is forbidden (denied, or no authorizer had an opinion).
    Deny {
        /// The authorizer's reason (may be empty); kube-apiserver appends it to the 403
        /// message after `: `.
        reason: String,
    },
}

/// Why no decision could be made. Answer 500.
#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    /// The SubjectAccessReview could not be made.
    #[error("subject access review failed")]
    Review(#[source] Arc<ReviewError>),
    /// The SubjectAccessReview said both allowed and denied.
    #[error("webhook subject access review returned both allow and deny response")]
    AllowedAndDenied,
}

impl AuthzError {
    /// Whether the review was not made because too many reviews are in flight.
    pub fn is_saturated(&self) -> bool {
        matches!(self, Self::Review(e) if e.is_saturated())
    }
}

/// One `--authorization-always-allow-paths` entry (k8s.io/apiserver `pkg/authorization/path`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum PathRule {
    /// This path exactly (leading `/` ignored; the empty path is `/`).
    Exact(String),
    /// Every path starting with this (leading `/` ignored).
    Prefix(String),
}

/// Paths that non-resource requests may always reach, comma-separated; a `*` may only end an
/// entry, making it a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlwaysAllowPaths(Vec<PathRule>);

/// An `--authorization-always-allow-paths` entry with a `*` before its end.
#[derive(Debug, thiserror::Error)]
#[error("only a trailing * is allowed in {path:?}")]
pub struct AllowPathError {
    /// The entry.
    pub path: String,
}

impl FromStr for AlwaysAllowPaths {
    type Err = AllowPathError;

    fn from_str(list: &str) -> Result<Self, Self::Err> {
        if list.is_empty() {
            return Ok(Self(Vec::new()));
        }
        list.split(',')
            .map(|entry| {
                let path = entry.strip_prefix('/').unwrap_or(entry);
                match path.strip_suffix('*') {
                    _ if path.is_empty() => Ok(PathRule::Exact(String::new())),
                    _ if path.bytes().rev().skip(1).any(|byte| byte == b'*') => {
                        Err(AllowPathError {
                            path: entry.to_owned(),
                        })
                    }
                    Some(prefix) => Ok(PathRule::Prefix(prefix.to_owned())),
                    None => Ok(PathRule::Exact(path.to_owned())),
                }
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

impl fmt::Display for AlwaysAllowPaths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.0.iter().enumerate() {
            let separator = if i == 0 { "" } else { "," };
            match rule {
                PathRule::Exact(path) => write!(f, "{separator}/{path}")?,
                PathRule::Prefix(prefix) => write!(f, "{separator}/{prefix}*")?,
            }
        }
        Ok(())
    }
}

impl AlwaysAllowPaths {
    /// Whether `path` (a request path) is always allowed.
    pub fn matches(&self, path: &str) -> bool {
        let path = path.strip_prefix('/').unwrap_or(path);
        self.0.iter().any(|rule| match rule {
            PathRule::Exact(exact) => exact == path,
            PathRule::Prefix(prefix) => path.starts_with(prefix.as_str()),
        })
    }
}

/// Authorization flags, named as k8s.io/apiserver's delegating authorization options.
#[derive(Clone, Debug, clap::Args)]
pub struct AuthzArgs {
    /// Paths that skip authorization (non-resource requests only), comma-separated; a trailing
    /// `*` matches a prefix. Empty to authorize every path.
    #[arg(
        long = "authorization-always-allow-paths",
        env = "ELEMENTAL_CHANGELOG_AUTHORIZATION_ALWAYS_ALLOW_PATHS",
        default_value = "/healthz,/readyz,/livez"
    )]
    pub always_allow_paths: AlwaysAllowPaths,
    /// How long an "allowed" SubjectAccessReview answer is cached.
    #[arg(
        long = "authorization-webhook-cache-authorized-ttl",
        env = "ELEMENTAL_CHANGELOG_AUTHORIZATION_WEBHOOK_CACHE_AUTHORIZED_TTL",
        default_value = "10s",
        value_parser = humantime::parse_duration,
    )]
    pub authorized_ttl: Duration,
    /// How long a "denied" SubjectAccessReview answer is cached.
    #[arg(
        long = "authorization-webhook-cache-unauthorized-ttl",
        env = "ELEMENTAL_CHANGELOG_AUTHORIZATION_WEBHOOK_CACHE_UNAUTHORIZED_TTL",
        default_value = "10s",
        value_parser = humantime::parse_duration,
    )]
    pub unauthorized_ttl: Duration,
}

/// Authorizes requests; see the [module documentation](self).
pub struct Authorizer {
    api: Api<SubjectAccessReview>,
    cache: ReviewCache<ReviewKey, SubjectAccessReviewStatus>,
    always_allow_paths: AlwaysAllowPaths,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    metrics: Arc<dyn AuthMetrics>,
}

impl fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorizer")
            .field("always_allow_paths", &self.always_allow_paths)
            .field("authorized_ttl", &self.authorized_ttl)
            .field("unauthorized_ttl", &self.unauthorized_ttl)
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    /// An authorizer that reviews through `client` and counts its decisions in `metrics`
    /// (`allowed`, `denied`, `error`).
    pub fn new(client: Client, args: &AuthzArgs, metrics: Arc<dyn AuthMetrics>) -> Self {
        Self {
            api: Api::all(client),
            cache: ReviewCache::new(CACHE_CAPACITY),
            always_allow_paths: args.always_allow_paths.clone(),
            authorized_ttl: args.authorized_ttl,
            unauthorized_ttl: args.unauthorized_ttl,
            metrics,
        }
    }

    /// Whether `user` may do what `attributes` describe.
    pub async fn authorize(
        &self,
        user: &UserInfo,
        attributes: &Attributes,
    ) -> Result<Decision, AuthzError> {
        let decision = self.decide(user, attributes).await;
        self.metrics.authorization(match &decision {
            Ok(Decision::Allow) => Authorization::Allowed,
            Ok(Decision::Deny { .. }) => Authorization::Denied,
            Err(_) => Authorization::Error,
        });
        decision
    }

    async fn decide(
        &self,
        user: &UserInfo,
        attributes: &Attributes,
    ) -> Result<Decision, AuthzError> {
        if user.groups.iter().any(|group| group == PRIVILEGED_GROUP) {
            return Ok(Decision::Allow);
        }
        if attributes.resource().is_none() && self.always_allow_paths.matches(attributes.path()) {
            return Ok(Decision::Allow);
        }
        let key = ReviewKey::of(user, attributes);
        let cacheable = attributes.size() < MAX_CACHED_ATTRIBUTES_SIZE;
        let (authorized_ttl, unauthorized_ttl) = (self.authorized_ttl, self.unauthorized_ttl);
        let status = self
            .cache
            .get_or_review(
                key,
                || review(self.api.clone(), review_spec(user, attributes)),
                move |status| {
                    cacheable.then_some(if status.allowed {
                        authorized_ttl
                    } else {
                        unauthorized_ttl
                    })
                },
            )
            .await
            .map_err(AuthzError::Review)?;
        match (status.allowed, status.denied.unwrap_or_default()) {
            (true, true) => Err(AuthzError::AllowedAndDenied),
            (true, false) => Ok(Decision::Allow),
            (false, _) => Ok(Decision::Deny {
                reason: status.reason.unwrap_or_default(),
            }),
        }
    }
}

/// What a review's answer depends on, hashed: the user (name, uid, groups, extra) and the
/// attributes, each field length-prefixed so that no two different reviews share a key.
/// SHA-256 keeps a collision (which would hand one user another's decision) out of reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ReviewKey([u8; 32]);

impl ReviewKey {
    fn of(user: &UserInfo, attributes: &Attributes) -> Self {
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        field(user.name.as_bytes());
        field(user.uid.as_deref().unwrap_or_default().as_bytes());
        field(&(user.groups.len() as u64).to_le_bytes());
        for group in &user.groups {
            field(group.as_bytes());
        }
        field(&(user.extra.len() as u64).to_le_bytes());
        for (key, values) in &user.extra {
            field(key.as_bytes());
            field(&(values.len() as u64).to_le_bytes());
            for value in values {
                field(value.as_bytes());
            }
        }
        field(attributes.verb().as_bytes());
        match attributes.resource() {
            None => {
                field(b"N");
                field(attributes.path().as_bytes());
            }
            Some(r) => {
                field(b"R");
                for part in [
                    Some(&r.group),
                    Some(&r.version),
                    Some(&r.resource),
                    r.subresource.as_ref(),
                    r.namespace.as_ref(),
                    r.name.as_ref(),
                ] {
                    match part {
                        Some(text) => field(text.as_bytes()),
                        None => field(b"\xff"),
                    }
                }
            }
        }
        Self(hash.finalize().into())
    }
}

/// `Some(text)` unless empty: Go omits empty strings from the review (`omitempty`).
fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// The review of `user` doing `attributes`, as webhook.go fills it.
fn review_spec(user: &UserInfo, attributes: &Attributes) -> SubjectAccessReviewSpec {
    let (resource_attributes, non_resource_attributes) = match attributes.resource() {
        Some(resource) => (
            Some(SarResourceAttributes {
                namespace: resource.namespace.clone(),
                verb: non_empty(attributes.verb()),
                group: non_empty(&resource.group),
                version: non_empty(&resource.version),
                resource: non_empty(&resource.resource),
                subresource: resource.subresource.clone(),
                name: resource.name.clone(),
                ..SarResourceAttributes::default()
            }),
            None,
        ),
        None => (
            None,
            Some(NonResourceAttributes {
                path: non_empty(attributes.path()),
                verb: non_empty(attributes.verb()),
            }),
        ),
    };
    SubjectAccessReviewSpec {
        user: non_empty(&user.name),
        uid: user.uid.clone(),
        groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        resource_attributes,
        non_resource_attributes,
    }
}

/// One SubjectAccessReview.
async fn review(
    api: Api<SubjectAccessReview>,
    spec: SubjectAccessReviewSpec,
) -> Result<SubjectAccessReviewStatus, ReviewError> {
    let request = SubjectAccessReview {
        spec,
        ..SubjectAccessReview::default()
    };
    let params = PostParams::default();
    let reviewed = with_backoff(DEFAULT_BACKOFF, REVIEW_TIMEOUT, || {
        api.create(&params, &request)
    })
    .await?;
    Ok(reviewed.status.unwrap_or_default())
}
