//! The access log of the server's own port: one structured line per request answered,
//! with who asked (user, number of groups, whether kube-apiserver's aggregator passed the
//! request on), what (verb, path) and the answer (code, bytes, latency).
//!
//! Requests proxied by kube-apiserver are in its audit log too; requests made to this
//! server's port directly (a Pod, a port-forward) are only here. So refusals (401, 403, 429)
//! are logged at `info` by default, and every request with `--access-log=all`.

use std::time::Duration;

use clap::ValueEnum;
use elemental_changelog_auth::{Authentication, authn::UserInfo};
use tracing::info;

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

    /// Records `entry` when [`Self::records`] its code: one `info` line, target
    /// `elemental_changelog_apiserver::access_log`, message `access`. Returns whether it did.
    pub fn record(self, entry: &Entry<'_>) -> bool {
        if !self.records(entry.code) {
            return false;
        }
        info!(
            user = %entry.requester.user,
            groups = entry.requester.groups,
            proxied = entry.requester.proxied,
            verb = entry.verb,
            path = entry.path,
            code = entry.code,
            bytes = entry.bytes,
            micros = u64::try_from(entry.latency.as_micros()).unwrap_or(u64::MAX),
            addr = entry.addr.map(tracing::field::display),
            "access"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_recorded_by_default_and_the_rest_with_all() {
        assert_eq!(AccessLog::default(), AccessLog::Refusals);
        for code in [401, 403, 429] {
            assert!(AccessLog::Refusals.records(code), "{code}");
            assert!(AccessLog::All.records(code), "{code}");
            assert!(!AccessLog::Off.records(code), "{code}");
        }
        for code in [200, 304, 400, 404, 405, 500, 503, 504] {
            assert!(!AccessLog::Refusals.records(code), "{code}");
            assert!(AccessLog::All.records(code), "{code}");
            assert!(!AccessLog::Off.records(code), "{code}");
        }
    }

    #[test]
    fn the_front_proxy_is_told_apart() {
        let user = UserInfo {
            name: "alice".to_owned(),
            groups: vec!["a".to_owned(), "system:authenticated".to_owned()],
            ..UserInfo::default()
        };
        let proxied = Requester::new(&user, Authentication::RequestHeader);
        assert!(proxied.proxied && proxied.groups == 2 && proxied.user == "alice");
        for direct in [Authentication::Token, Authentication::X509] {
            assert!(!Requester::new(&user, direct).proxied);
        }
    }
}
