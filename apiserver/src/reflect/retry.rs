//! How long a watch waits after an error before it goes on: kube-runtime's default backoff
//! (`watcher::DefaultBackoff`, client-go's: 0.8 s doubling to 30 s, with jitter) for
//! failures, except for two kinds of error that are not failures of this watch to back off
//! from:
//!
//! - **Expired** (`410`, "too old resource version"): the watcher has dropped its
//!   resourceVersion and lists again; waiting only delays that list. After kube-apiserver
//!   restarts, every resume is a 410 (its watch cache starts at the newest revision), and the
//!   default backoff, grown through the restart, made the stores stale for 24 s (measured).
//!   It lists at once; a second 410 within [`EXPIRED_AGAIN`] waits as a failure does, so a
//!   server that answers every watch with a 410 is not listed in a loop.
//! - **Unavailable** (no connection, the connection broken, 429, 5xx): kube-apiserver is
//!   restarting or overloaded; retried from [`UNAVAILABLE_FIRST`] doubling to
//!   [`UNAVAILABLE_MOST`], each wait plus up to as much again at random (backon's jitter), so
//!   a change made when it is back is seen within seconds instead of after the default
//!   backoff's up to 60 s. Each retry is one connection attempt or one request per watch (a
//!   handful per process).
//!
//! Any event resets both backoffs (as kube-runtime's `StreamBackoff` resets on any `Ok`).

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};
use kube::runtime::watcher::{self, DefaultBackoff};
use tokio::time::Instant;

/// A 410 this soon after the last one waits as a failure does.
pub const EXPIRED_AGAIN: Duration = Duration::from_secs(60);
/// First wait after kube-apiserver was unavailable.
pub const UNAVAILABLE_FIRST: Duration = Duration::from_millis(250);
/// Longest wait while kube-apiserver is unavailable, before jitter (which may double it).
pub const UNAVAILABLE_MOST: Duration = Duration::from_secs(1);

/// What a watch error says about the next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// `410`: list again.
    Expired,
    /// kube-apiserver is not there or not serving: try again soon.
    Unavailable,
    /// Anything else (403, 404, an object that does not decode): back off.
    Failed,
}

impl Cause {
    /// The cause of `error`.
    pub fn of(error: &watcher::Error) -> Self {
        match error {
            watcher::Error::WatchError(status) => Self::of_code(status.code),
            watcher::Error::InitialListFailed(error)
            | watcher::Error::WatchStartFailed(error)
            | watcher::Error::WatchFailed(error) => match error {
                kube::Error::Api(status) => Self::of_code(status.code),
                kube::Error::HyperError(_)
                | kube::Error::Service(_)
                | kube::Error::ReadEvents(_) => Self::Unavailable,
                _ => Self::Failed,
            },
            watcher::Error::NoResourceVersion => Self::Failed,
        }
    }

    fn of_code(code: u16) -> Self {
        match code {
            410 => Self::Expired,
            429 | 500..=599 => Self::Unavailable,
            _ => Self::Failed,
        }
    }
}

/// The waits of one watch.
pub struct Retry {
    failed: DefaultBackoff,
    unavailable: ExponentialBackoff,
    last_expired: Option<Instant>,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            failed: DefaultBackoff::default(),
            unavailable: unavailable(),
            last_expired: None,
        }
    }
}

fn unavailable() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(UNAVAILABLE_FIRST)
        .with_max_delay(UNAVAILABLE_MOST)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

impl Retry {
    /// The wait before the watch goes on after an error of `cause`.
    pub fn after(&mut self, cause: Cause) -> Duration {
        match cause {
            Cause::Expired => {
                let now = Instant::now();
                let again = self
                    .last_expired
                    .replace(now)
                    .is_some_and(|last| now.duration_since(last) < EXPIRED_AGAIN);
                if again {
                    self.failed.next().unwrap_or(UNAVAILABLE_MOST)
                } else {
                    Duration::ZERO
                }
            }
            Cause::Unavailable => self.unavailable.next().unwrap_or(UNAVAILABLE_MOST),
            Cause::Failed => self.failed.next().unwrap_or(UNAVAILABLE_MOST),
        }
    }

    /// An event came: the next error waits the shortest again.
    pub fn reset(&mut self) {
        kube::runtime::utils::Backoff::reset(&mut self.failed);
        self.unavailable = unavailable();
    }
}

#[cfg(test)]
mod tests;
