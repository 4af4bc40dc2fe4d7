//! Calls to the kube API's review endpoints (TokenReview, SubjectAccessReview), made the way
//! k8s.io/apiserver's webhook clients make them (`pkg/util/webhook`,
//! `plugin/pkg/authenticator/token/webhook`, `plugin/pkg/authorizer/webhook`): retried with
//! exponential backoff on transient errors under an overall timeout, and answered from a cache
//! whose concurrent lookups for the same key share one review (a single flight, as Go's `singleflight.DoChan`).
//!
//! Shared by [`crate::authn`] (tokens) and [`crate::authz`] (access reviews).

use std::{
    collections::HashMap,
    future::Future,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use backon::{ExponentialBuilder, Retryable as _};
use tokio::time::Instant;

use crate::singleflight::SingleFlight;

/// Why a review could not be made. A review that was made and said "no" is not an error.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The kube API refused or could not be reached (after retries for transient errors).
    #[error("review request failed")]
    Request(#[source] kube::Error),
    /// No answer within the review timeout, retries included.
    #[error("no review answer within {0:?}")]
    TimedOut(Duration),
    /// The task making the review panicked or was cancelled at shutdown.
    #[error("review task failed")]
    Task(#[source] Arc<tokio::task::JoinError>),
    /// As many reviews as allowed are already in flight; nothing was sent.
    #[error("{0} reviews are already in flight")]
    Saturated(usize),
}

impl ReviewError {
    /// Whether the review was not made because too many are in flight (the request is
    /// answered 429, not 401 or 500: it may be tried again at once).
    pub fn is_saturated(&self) -> bool {
        matches!(self, Self::Saturated(_))
    }
}

/// k8s.io/apiserver's `DefaultAuthWebhookRetryBackoff()`: 500 ms, ×1.5, 5 attempts (4 retries).
/// Its 0.2 jitter is left out: a handful of replicas do not synchronise their retries in a
/// harmful way. The server's one backoff implementation is backon's (kube-runtime's watchers
/// back off with it too).
pub(crate) const DEFAULT_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(500))
    .with_factor(1.5)
    .without_max_delay()
    .with_max_times(4);

/// Overall time allowed for one review, retries included (k8s.io/apiserver: 10 s).
pub(crate) const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Most answers a review cache keeps; expired answers go first, then the oldest.
pub(crate) const CACHE_CAPACITY: usize = 8192;

/// Most distinct reviews of one kind in flight at once. A review outlives the request that
/// started it (others may wait for its answer), so without a bound a client sending requests
/// with ever new tokens, and going away at once, could keep any number running against the
/// kube API. Past it a request is answered 429 without a review.
pub(crate) const MAX_REVIEWS_IN_FLIGHT: usize = 64;

/// Whether `error` is transient, as `webhook.DefaultShouldRetry`: a broken connection, or an API
/// answer that says "internal error", "timeout", "too many requests" or asks to retry later.
pub(crate) fn should_retry(error: &kube::Error) -> bool {
    match error {
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        kube::Error::Api(status) => {
            matches!(
                status.reason.as_str(),
                "InternalError" | "Timeout" | "ServerTimeout" | "TooManyRequests"
            ) || matches!(status.code, 429 | 500 | 504)
                || status
                    .details
                    .as_ref()
                    .is_some_and(|details| details.retry_after_seconds > 0)
        }
        _ => false,
    }
}

/// Runs `call` until it succeeds, fails for good, or `backoff` runs out of retries, all within
/// `timeout`.
pub(crate) async fn with_backoff<T, F, Fut>(
    backoff: ExponentialBuilder,
    timeout: Duration,
    call: F,
) -> Result<T, ReviewError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let attempts = call
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(should_retry)
        .notify(|error, delay| {
            tracing::debug!(
                error = error as &dyn std::error::Error,
                ?delay,
                "review failed, retrying"
            );
        });
    match tokio::time::timeout(timeout, attempts).await {
        Ok(answer) => answer.map_err(ReviewError::Request),
        Err(_) => Err(ReviewError::TimedOut(timeout)),
    }
}

/// The outcome of a review as its waiters see it.
pub(crate) type Outcome<V> = Result<V, Arc<ReviewError>>;

/// Answers of reviews, kept for a time that depends on the answer, with concurrent lookups of
/// one key coalesced into one review ([`SingleFlight`]). The review runs in its own task, so a
/// caller that goes away does not cancel it for the others (as Go's `singleflight.DoChan` with a
/// detached context in k8s.io/apiserver's token cache). Errors are never cached.
pub(crate) struct ReviewCache<K, V> {
    answers: Arc<Mutex<Answers<K, V>>>,
    in_flight: SingleFlight<K, Outcome<V>>,
    capacity: usize,
}

struct Answers<K, V> {
    by_key: HashMap<K, Answer<V>>,
}

struct Answer<V> {
    value: V,
    expires: Instant,
}

fn lock<K, V>(answers: &Mutex<Answers<K, V>>) -> MutexGuard<'_, Answers<K, V>> {
    // The critical sections only move map entries around; a panic cannot leave them half done.
    answers.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K, V> Answers<K, V>
where
    K: Eq + Hash + Clone,
{
    fn insert(&mut self, key: K, value: V, expires: Instant, capacity: usize) {
        if self.by_key.len() >= capacity && !self.by_key.contains_key(&key) {
            let now = Instant::now();
            self.by_key.retain(|_, answer| answer.expires > now);
            if self.by_key.len() >= capacity {
                let oldest = self
                    .by_key
                    .iter()
                    .min_by_key(|(_, answer)| answer.expires)
                    .map(|(key, _)| key.clone());
                if let Some(oldest) = oldest {
                    self.by_key.remove(&oldest);
                }
            }
        }
        self.by_key.insert(key, Answer { value, expires });
    }
}

impl<K, V> ReviewCache<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// An empty cache holding at most `capacity` answers.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            answers: Arc::new(Mutex::new(Answers {
                by_key: HashMap::new(),
            })),
            in_flight: SingleFlight::new(),
            capacity,
        }
    }

    /// The unexpired answer for `key`; else the answer of the review in flight for `key`; else
    /// the answer of `review()`, started now in its own task and kept for `ttl(&answer)` when
    /// that is `Some` non-zero duration. `review` is called only when a review is started, so
    /// an answer found costs no request to build.
    pub(crate) async fn get_or_review<F, R, T>(&self, key: K, review: F, ttl: T) -> Outcome<V>
    where
        F: FnOnce() -> R,
        R: Future<Output = Result<V, ReviewError>> + Send + 'static,
        T: FnOnce(&V) -> Option<Duration> + Send + 'static,
    {
        {
            let mut answers = lock(&self.answers);
            match answers.by_key.get(&key) {
                Some(answer) if answer.expires > Instant::now() => return Ok(answer.value.clone()),
                Some(_) => {
                    answers.by_key.remove(&key);
                }
                None => {}
            }
        }
        if !self.in_flight.in_flight(&key) && self.in_flight.len() >= MAX_REVIEWS_IN_FLIGHT {
            return Err(Arc::new(ReviewError::Saturated(MAX_REVIEWS_IN_FLIGHT)));
        }
        let answers = Arc::clone(&self.answers);
        let capacity = self.capacity;
        let stored_key = key.clone();
        // The answer is stored before the review leaves the flight table, so a lookup always
        // finds one or the other.
        let review = review();
        let work = async move {
            let outcome = review.await.map_err(Arc::new);
            if let Ok(value) = &outcome
                && let Some(ttl) = ttl(value).filter(|ttl| !ttl.is_zero())
            {
                let expires = Instant::now() + ttl;
                lock(&answers).insert(stored_key, value.clone(), expires, capacity);
            }
            outcome
        };
        self.in_flight
            .run(key, work)
            .await
            .unwrap_or_else(|error| Err(Arc::new(ReviewError::Task(error))))
    }

    /// How many answers are kept (expired ones included until they are looked up or evicted).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.answers).by_key.len()
    }
}

/// A scripted kube API for unit tests: every request is checked, then answered.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod mock {
    use std::task::Poll;

    use http::{Method, Request, Response, StatusCode};
    use kube::{Client, client::Body};
    use serde_json::Value;

    /// The test's end of the mock API.
    pub(crate) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// A kube client talking to the mock API, and the handle that answers for it.
    pub(crate) fn client() -> (Client, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (Client::new(service, "default"), handle)
    }

    /// Receives the next request, checks that it POSTs `body` (as JSON) to `path`, and answers
    /// `answer` with `status`.
    pub(crate) async fn expect_post(
        handle: &mut Handle,
        path: &str,
        body: Value,
        status: StatusCode,
        answer: Value,
    ) {
        let (request, respond) = handle.next_request().await.expect("a request");
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri().path(), path);
        let sent: Value =
            serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(sent, body);
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
            .unwrap();
        respond.send_response(response);
    }

    /// Receives the next request and fails it as a broken connection would.
    pub(crate) async fn fail_next(handle: &mut Handle) {
        let (_, respond) = handle.next_request().await.expect("a request");
        respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    }

    /// Whether no request is waiting.
    pub(crate) fn idle(handle: &mut Handle) -> bool {
        matches!(handle.poll_request(), Poll::Pending)
    }

    /// A kube `Status` error body.
    pub(crate) fn status(code: u16, reason: &str) -> Value {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "test", "reason": reason, "code": code,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code,
                reason: reason.to_owned(),
                ..kube::core::Status::failure("boom", reason)
            }
            .boxed(),
        )
    }

    #[test]
    fn transient_errors_are_retried() {
        assert!(should_retry(&api_error(500, "InternalError")));
        assert!(should_retry(&api_error(429, "TooManyRequests")));
        assert!(should_retry(&api_error(504, "Timeout")));
        assert!(!should_retry(&api_error(403, "Forbidden")));
        assert!(!should_retry(&api_error(400, "BadRequest")));
        assert!(!should_retry(&api_error(503, "ServiceUnavailable")));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_retries_five_times_with_growing_delays() {
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let result: Result<(), _> = with_backoff(DEFAULT_BACKOFF, REVIEW_TIMEOUT, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(api_error(500, "InternalError")) }
        })
        .await;
        assert!(matches!(result, Err(ReviewError::Request(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // 500 + 750 + 1125 + 1687.5 ms between the five attempts (timers round up to ms).
        let waited = start.elapsed();
        assert!(
            (Duration::from_micros(4_062_500)..Duration::from_millis(4_070)).contains(&waited),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_backoff(DEFAULT_BACKOFF, REVIEW_TIMEOUT, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(api_error(403, "Forbidden")) }
        })
        .await;
        assert!(matches!(result, Err(ReviewError::Request(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_review_times_out() {
        let result: Result<(), _> = with_backoff(DEFAULT_BACKOFF, REVIEW_TIMEOUT, || {
            futures::future::pending::<Result<(), kube::Error>>()
        })
        .await;
        assert!(matches!(result, Err(ReviewError::TimedOut(t)) if t == REVIEW_TIMEOUT));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_expire_after_their_ttl() {
        let cache = ReviewCache::<&str, u32>::new(10);
        let reviews = Arc::new(AtomicU32::new(0));
        let review = |reviews: &Arc<AtomicU32>| {
            let reviews = Arc::clone(reviews);
            async move { Ok(reviews.fetch_add(1, Ordering::SeqCst)) }
        };
        let ttl = |_: &u32| Some(Duration::from_secs(10));
        assert_eq!(
            cache
                .get_or_review("k", || review(&reviews), ttl)
                .await
                .ok(),
            Some(0)
        );
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(
            cache
                .get_or_review("k", || review(&reviews), ttl)
                .await
                .ok(),
            Some(0)
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            cache
                .get_or_review("k", || review(&reviews), ttl)
                .await
                .ok(),
            Some(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reviews_in_flight_are_bounded() {
        let cache = Arc::new(ReviewCache::<u32, u32>::new(10_000));
        let (release, released) = tokio::sync::watch::channel(false);
        let mut pending = Vec::new();
        for key in 0..u32::try_from(MAX_REVIEWS_IN_FLIGHT).unwrap() {
            let (cache, mut released) = (Arc::clone(&cache), released.clone());
            pending.push(tokio::spawn(async move {
                cache
                    .get_or_review(
                        key,
                        || async move {
                            released.wait_for(|r| *r).await.ok();
                            Ok(key)
                        },
                        |_: &u32| None,
                    )
                    .await
            }));
        }
        for _ in 0..1000 {
            if cache.in_flight.len() == MAX_REVIEWS_IN_FLIGHT {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(cache.in_flight.len(), MAX_REVIEWS_IN_FLIGHT);
        // One more distinct review is refused without being started...
        let started = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&started);
        let refused = cache
            .get_or_review(
                u32::MAX,
                || async move { Ok(counted.fetch_add(1, Ordering::SeqCst)) },
                |_: &u32| None,
            )
            .await;
        assert!(matches!(refused, Err(e) if e.is_saturated()));
        assert_eq!(started.load(Ordering::SeqCst), 0);
        // ...but a lookup of a key in flight joins its review.
        let (joined, ()) = tokio::join!(
            cache.get_or_review(0, || async { Ok(999) }, |_: &u32| None),
            async {
                release.send_replace(true);
            }
        );
        assert_eq!(joined.ok(), Some(0));
        for review in pending {
            assert!(review.await.unwrap().is_ok());
        }
        // Once they are done, reviews start again.
        let again = cache
            .get_or_review(u32::MAX, || async { Ok(5) }, |_: &u32| None)
            .await;
        assert_eq!(again.ok(), Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn errors_and_zero_ttls_are_not_cached() {
        let cache = ReviewCache::<&str, u32>::new(10);
        let failed = cache
            .get_or_review(
                "k",
                || async { Err(ReviewError::TimedOut(Duration::ZERO)) },
                |_: &u32| Some(Duration::from_secs(10)),
            )
            .await;
        assert!(failed.is_err());
        let zero = cache
            .get_or_review("k", || async { Ok(1) }, |_: &u32| Some(Duration::ZERO))
            .await;
        assert_eq!(zero.ok(), Some(1));
        assert_eq!(cache.len(), 0);
        let second = cache
            .get_or_review("k", || async { Ok(2) }, |_: &u32| None)
            .await;
        assert_eq!(second.ok(), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_lookups_share_one_review() {
        let cache = ReviewCache::<&str, u32>::new(10);
        let reviews = Arc::new(AtomicU32::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let counted = Arc::clone(&reviews);
        let first = cache.get_or_review(
            "k",
            || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                released.await.ok();
                Ok(7)
            },
            |_: &u32| None,
        );
        let counted = Arc::clone(&reviews);
        let second = cache.get_or_review(
            "k",
            || async move { Ok(counted.fetch_add(1, Ordering::SeqCst) + 100) },
            |_: &u32| None,
        );
        let (first, second, ()) = tokio::join!(first, second, async {
            tokio::task::yield_now().await;
            release.send(()).ok();
        });
        assert_eq!((first.ok(), second.ok()), (Some(7), Some(7)));
        assert_eq!(reviews.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_evicts_the_oldest_answer() {
        let cache = ReviewCache::<u32, u32>::new(2);
        for (key, ttl) in [(1, 30), (2, 20), (3, 40)] {
            cache
                .get_or_review(
                    key,
                    || async move { Ok(key) },
                    move |_: &u32| Some(Duration::from_secs(ttl)),
                )
                .await
                .ok();
        }
        assert_eq!(cache.len(), 2);
        // Key 2 (expiring first) was evicted: asking again reviews again.
        let again = cache
            .get_or_review(2, || async { Ok(200) }, |_: &u32| None)
            .await;
        assert_eq!(again.ok(), Some(200));
        let kept = cache
            .get_or_review(1, || async { Ok(100) }, |_: &u32| None)
            .await;
        assert_eq!(kept.ok(), Some(1));
    }
}
