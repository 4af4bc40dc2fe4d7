//! Bearer tokens, authenticated by the kube API through TokenReview
//! (`authentication.k8s.io/v1`), as k8s.io/apiserver's `bearertoken` authenticator over the
//! cached webhook token authenticator (`token/cache`, `plugin/pkg/authenticator/token/webhook`).

use std::time::Duration;

use http::{HeaderMap, header::AUTHORIZATION};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::{Api, Client, api::PostParams};
use sha2::{Digest, Sha256};

use super::{AuthnError, UserInfo};
use crate::review::{
    CACHE_CAPACITY, DEFAULT_BACKOFF, REVIEW_TIMEOUT, ReviewCache, ReviewError, with_backoff,
};

/// The bearer token of the `Authorization` header, as Go's `bearertoken` reads it: the header
/// trimmed, split on the first spaces, scheme `Bearer` in any case, token non-empty.
pub(crate) fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?;
    let value = String::from_utf8_lossy(value.as_bytes());
    let mut parts = value.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// What the kube API said about a token.
#[derive(Clone, Debug)]
enum Answer {
    /// The token identifies this user.
    Authenticated(UserInfo),
    /// The token identifies no one; `error` is the API's explanation, when it gave one.
    Unauthenticated { error: Option<String> },
}

/// Reviews tokens through the kube API and remembers the answers for a while: an
/// authenticated user and a plain "not authenticated" alike for the cache TTL, an answer
/// carrying an error not at all (as k8s.io/apiserver's delegating authenticator). Concurrent
/// reviews of one token are coalesced. Tokens are kept by SHA-256 digest only.
pub(crate) struct TokenAuthenticator {
    api: Api<TokenReview>,
    cache: ReviewCache<[u8; 32], Answer>,
    ttl: Duration,
}

impl TokenAuthenticator {
    /// Reviews through `client`, caching answers for `ttl` (zero: no cache).
    pub(crate) fn new(client: Client, ttl: Duration) -> Self {
        Self {
            api: Api::all(client),
            cache: ReviewCache::new(CACHE_CAPACITY),
            ttl,
        }
    }

    /// The user `token` identifies.
    pub(crate) async fn authenticate(&self, token: &str) -> Result<UserInfo, AuthnError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let ttl = self.ttl;
        let review = || review(self.api.clone(), token.to_owned());
        let answer = self
            .cache
            .get_or_review(key, review, move |answer| match answer {
                Answer::Authenticated(_) | Answer::Unauthenticated { error: None } => Some(ttl),
                Answer::Unauthenticated { error: Some(_) } => None,
            })
            .await
            .map_err(AuthnError::TokenReview)?;
        match answer {
            Answer::Authenticated(user) => Ok(user),
            Answer::Unauthenticated {
                error: Some(message),
            } => Err(AuthnError::TokenRejected { message }),
            Answer::Unauthenticated { error: None } => Err(AuthnError::InvalidToken),
        }
    }
}

/// One TokenReview, without audiences (the API server's own audiences apply).
async fn review(api: Api<TokenReview>, token: String) -> Result<Answer, ReviewError> {
    let request = TokenReview {
        spec: TokenReviewSpec {
            token,
            audiences: None,
        },
        ..TokenReview::default()
    };
    let params = PostParams::default();
    let reviewed = with_backoff(DEFAULT_BACKOFF, REVIEW_TIMEOUT, || {
        api.create(&params, &request)
    })
    .await?;
    let status = reviewed.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Ok(Answer::Unauthenticated {
            error: status.error.filter(|error| !error.is_empty()),
        });
    }
    let user = status.user.unwrap_or_default();
    Ok(Answer::Authenticated(UserInfo {
        name: user.username.unwrap_or_default(),
        uid: user.uid.filter(|uid| !uid.is_empty()),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn bearer_tokens_are_read_as_go_reads_them() {
        let token = |value: &str| bearer_token(&with_authorization(value));
        assert_eq!(token("Bearer abc").as_deref(), Some("abc"));
        assert_eq!(token("bearer abc").as_deref(), Some("abc"));
        assert_eq!(token("  BEARER abc  ").as_deref(), Some("abc"));
        assert_eq!(token("Bearer abc def").as_deref(), Some("abc"));
        assert_eq!(
            token("Bearer  abc"),
            None,
            "a space before the token leaves it empty"
        );
        assert_eq!(token("Bearer"), None);
        assert_eq!(token("Basic abc"), None);
        assert_eq!(token(""), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }
}
