//! The access log of the server's own port: one structured line per request answered,
//! with who asked (user, number of groups, whether kube-apiserver's aggregator passed the
//! request on), what (verb, path) and the answer (code, bytes, latency).
//!
//! Requests proxied by kube-apiserver are in its audit log too; requests made to this
//! server's port directly (a Pod, a port-forward) are only here. So refusals (401, 403, 429)
//! are logged at `info` by default, and every request with `--access-log=all`.
//!
//! The log is bounded whatever a client sends: refusals are rate-limited per source address
//! ([`limiter`]: a burst, then one line a second), those left out are counted and told in a
//! summary line (`N more refusals from X`) every [`SUMMARY_PERIOD`]; every text field is
//! escaped and cut ([`escape`]), so a line is short and one line, in either log format.

pub mod escape;
pub mod limiter;

use std::{sync::Mutex, time::Duration};

use clap::ValueEnum;
use elemental_changelog_auth::{Authentication, authn::UserInfo};
use tracing::info;

use self::limiter::{Limiter, Source};

/// How often the refusals left out are told, per source.
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(10);
/// Longest path written, in bytes (longer ones are cut and marked with their length).
pub const MAX_PATH_BYTES: usize = 256;
/// Longest user name written, in bytes.
pub const MAX_USER_BYTES: usize = 256;

/// Which requests the access log records (`--access-log`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AccessLog {
    /// Refused requests only: 401, 403 and 429.
    #[default]
    Refusals,
    /// Every request, health probes included.
    All,
    /// None.
    Off,
}

/// Who made a request, as far as it got: nobody before authentication (or when it failed).
#[derive(Clone, Debug, Default)]
pub struct Requester {
    /// User name; empty before authentication or when it failed.
    pub user: String,
    /// How many groups the user is in.
    pub groups: usize,
    /// Whether the request came through kube-apiserver's aggregator (authenticated by its
    /// front-proxy certificate and request headers).
    pub proxied: bool,
}

impl Requester {
    /// The requester `user`, authenticated by `method`.
    pub fn new(user: &UserInfo, method: Authentication) -> Self {
        Self {
            user: user.name.clone(),
            groups: user.groups.len(),
            proxied: method == Authentication::RequestHeader,
        }
    }
}

/// One answered request.
#[derive(Debug)]
pub struct Entry<'a> {
    /// Who asked.
    pub requester: &'a Requester,
    /// Verb (`get`, `list`, `watch`, ...), empty for a request refused before parsing.
    pub verb: &'a str,
    /// Path, percent-decoded; empty for a request refused before parsing.
    pub path: &'a str,
    /// Status code.
    pub code: u16,
    /// Body bytes sent, when known before sending.
    pub bytes: Option<u64>,
    /// Time from the request head to the answer.
    pub latency: Duration,
    /// Client address.
    pub addr: Option<std::net::SocketAddr>,
}

/// Whether `code` is a refusal: unauthenticated, forbidden or throttled.
pub fn is_refusal(code: u16) -> bool {
    matches!(code, 401 | 403 | 429)
}

impl AccessLog {
    /// Whether a request answered with `code` is recorded.
    pub fn records(self, code: u16) -> bool {
        match self {
            Self::All => true,
            Self::Refusals => is_refusal(code),
            Self::Off => false,
        }
    }
}

/// The access log: which requests it records, and the refusals' rate limit.
#[derive(Debug)]
pub struct AccessLogger {
    mode: AccessLog,
    limiter: Mutex<Limiter>,
}

impl AccessLogger {
    /// A log recording what `mode` says.
    pub fn new(mode: AccessLog) -> Self {
        Self {
            mode,
            limiter: Mutex::new(Limiter::default()),
        }
    }

    /// Records `entry` when [`AccessLog::records`] its code and, for a refusal, its source is
    /// within its rate: one `info` line, target `elemental_changelog_apiserver::access_log`,
    /// message `access`. Returns whether it did.
    pub fn record(&self, entry: &Entry<'_>) -> bool {
        if !self.mode.records(entry.code) {
            return false;
        }
        if is_refusal(entry.code) && !self.admit(Source::of(entry.addr)) {
            return false;
        }
        // Escaped for either format; the verb and path as strings (quoted in text).
        let verb = escape::field(entry.verb, MAX_PATH_BYTES);
        let path = escape::field(entry.path, MAX_PATH_BYTES);
        info!(
            user = %escape::field(&entry.requester.user, MAX_USER_BYTES),
            groups = entry.requester.groups,
            proxied = entry.requester.proxied,
            verb = verb.as_ref(),
            path = path.as_ref(),
            code = entry.code,
            bytes = entry.bytes,
            micros = u64::try_from(entry.latency.as_micros()).unwrap_or(u64::MAX),
            addr = entry.addr.map(tracing::field::display),
            "access"
        );
        true
    }

    fn admit(&self, source: Source) -> bool {
        let mut limiter = self
            .limiter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        limiter.admit(source, tokio::time::Instant::now())
    }

    /// The refusals left out since the last call, by source (each source once), and forgets
    /// the sources that are quiet again.
    pub fn left_out(&self) -> Vec<(Source, u64)> {
        self.limiter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(tokio::time::Instant::now())
    }

    /// Every [`SUMMARY_PERIOD`], one line per source whose refusals were left out:
    /// `access: N more refusals from X`. Never completes.
    pub async fn summarize(&self) {
        let mut tick = tokio::time::interval(SUMMARY_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for (source, refusals) in self.left_out() {
                info!(
                    %source,
                    refusals,
                    "access: {refusals} more refusals from {source}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
