//! What serving counts: requests by verb, resource and code, their duration, open
//! connections, what the serving limits refused; and, for the auth crate (through its
//! [`AuthMetrics`] trait), authentication results and authorization decisions.

use std::{sync::Arc, time::Instant};

use elemental_changelog_auth::{AuthMetrics, Authentication, Authorization};
use prometheus::{HistogramVec, IntCounterVec, IntGauge};

use crate::{
    metrics::{Family, Registry, family},
    reflect::{WatchMetrics, WatchedResource},
    request::RequestResource,
};

family! {
    /// The metrics of serving: connections and requests.
    pub struct ServingMetrics {
        requests: IntCounterVec = metric(
            "http_requests_total",
            "HTTP requests answered, by verb, resource and status code.",
            &["verb", "resource", "code"],
        ),
        request_duration: HistogramVec = metric(
            "http_request_duration_seconds",
            "Time to answer an HTTP request, authentication and authorization included.",
            &["verb", "resource"],
        ).buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]),
        open_connections: IntGauge = metric(
            "open_connections",
            "Client connections open (TLS handshake included).",
        ),
        watches_open: IntGauge = metric(
            "watches_open",
            "Watches being served.",
        ),
        watches_ended: IntCounterVec = metric(
            "watches_ended_total",
            "Watches ended, by reason: timeout (timeoutSeconds, or the server's own between 30 and 60 minutes), client (the client went away), behind (the client did not read while the kept events moved past it; it watches again, gets 410 Expired and lists).",
            &["reason"],
        ),
        refused: IntCounterVec = metric(
            "refused_total",
            "Connections and requests refused by a serving limit, by limit (max_connections, max_requests_inflight, request_timeout, compute_queue, reviews_in_flight).",
            &["limit"],
        ),
    }
}

impl ServingMetrics {
    /// Counts a connection closed at once because the connection limits were reached.
    pub fn connection_refused(&self) {
        self.refused(ServingLimit::Connections);
    }

    /// Counts a request refused or ended by a serving limit.
    pub fn request_refused(&self, limit: ServingLimit) {
        self.refused(limit);
    }

    fn refused(&self, limit: ServingLimit) {
        self.refused.with_label_values(&[limit.as_str()]).inc();
    }

    /// Counts a watch open until it ends: `ended` with why.
    pub fn watch_opened(self: &Arc<Self>) -> OpenWatch {
        self.watches_open.inc();
        OpenWatch(self.clone())
    }

    /// Counts an open connection until the guard is dropped.
    pub fn connection_opened(&self) -> OpenConnection<'_> {
        self.open_connections.inc();
        OpenConnection(&self.open_connections)
    }

    /// Starts timing a request; the returned guard records when it is
    /// finished with a status code (or as 500 when dropped unfinished).
    pub fn request(&self, verb: &str, resource: RequestResource) -> RequestTimer<'_> {
        RequestTimer {
            metrics: self,
            verb: bounded_verb(verb),
            resource,
            start: Instant::now(),
            code: None,
        }
    }
}

/// The serving limit that refused a connection or a request: the `limit` label of
/// `refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServingLimit {
    /// `--max-connections` (and the connections admitted past it for health probes).
    Connections,
    /// `--max-requests-inflight`.
    Inflight,
    /// `--request-timeout`.
    Timeout,
    /// Waiting for a compute slot outlasted the request's deadline.
    ComputeQueue,
    /// As many TokenReviews or SubjectAccessReviews as allowed were in flight.
    Reviews,
    /// `--max-watches`.
    Watches,
    /// `--max-watches-per-user`.
    WatchesPerUser,
}

impl ServingLimit {
    /// The `limit` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connections => "max_connections",
            Self::Inflight => "max_requests_inflight",
            Self::Timeout => "request_timeout",
            Self::ComputeQueue => "compute_queue",
            Self::Reviews => "reviews_in_flight",
            Self::Watches => "max_watches",
            Self::WatchesPerUser => "max_watches_per_user",
        }
    }
}

/// An open connection; see [`ServingMetrics::connection_opened`].
pub struct OpenConnection<'a>(&'a IntGauge);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Times one request; see [`ServingMetrics::request`].
pub struct RequestTimer<'a> {
    metrics: &'a ServingMetrics,
    verb: &'static str,
    resource: RequestResource,
    start: Instant,
    code: Option<u16>,
}

impl RequestTimer<'_> {
    /// Records the status code answered.
    pub fn finish(mut self, code: u16) {
        self.code = Some(code);
    }
}

impl Drop for RequestTimer<'_> {
    fn drop(&mut self) {
        let code = self.code.unwrap_or(500);
        let resource = self.resource.as_str();
        self.metrics
            .requests
            .with_label_values(&[self.verb, resource, status_label(code)])
            .inc();
        self.metrics
            .request_duration
            .with_label_values(&[self.verb, resource])
            .observe(self.start.elapsed().as_secs_f64());
    }
}

/// Keeps the verb label bounded: the Kubernetes verbs this server can see.
fn bounded_verb(verb: &str) -> &'static str {
    match verb {
        "get" => "get",
        "list" => "list",
        "watch" => "watch",
        "create" => "create",
        "update" => "update",
        "patch" => "patch",
        "delete" => "delete",
        "deletecollection" => "deletecollection",
        "head" => "head",
        "options" => "options",
        "post" => "post",
        "put" => "put",
        _ => "other",
    }
}

fn status_label(code: u16) -> &'static str {
    match code {
        200 => "200",
        304 => "304",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        406 => "406",
        500 => "500",
        503 => "503",
        c if c < 300 => "2xx",
        c if c < 400 => "3xx",
        c if c < 500 => "4xx",
        _ => "5xx",
    }
}

family! {
    /// What the authenticator and the authorizer decide.
    struct AuthDecisions {
        authentications: IntCounterVec = metric(
            "authentications_total",
            "Authentication results, by method (requestheader, x509, token, anonymous) or failure.",
            &["result"],
        ),
        authorizations: IntCounterVec = metric(
            "authorizations_total",
            "Authorization decisions (allowed, denied, error).",
            &["decision"],
        ),
    }
}

/// The auth crate's counts ([`AuthMetrics`]) as metrics: its results and decisions, and its
/// watch of the authentication ConfigMap with the other watches.
pub struct AuthCounts {
    decisions: AuthDecisions,
    watches: Arc<WatchMetrics>,
}

impl AuthCounts {
    /// Registers the authentication and authorization counters; the ConfigMap's watch is
    /// counted in `watches`.
    pub fn new(registry: &Registry, watches: Arc<WatchMetrics>) -> Self {
        Self {
            decisions: AuthDecisions::register(registry),
            watches,
        }
    }
}

impl AuthMetrics for AuthCounts {
    fn authentication(&self, result: Authentication) {
        self.decisions
            .authentications
            .with_label_values(&[result.as_str()])
            .inc();
    }

    fn authorization(&self, decision: Authorization) {
        self.decisions
            .authorizations
            .with_label_values(&[decision.as_str()])
            .inc();
    }

    fn config_watch_synced(&self) {
        self.watches.watch_synced(WatchedResource::AuthConfig, true);
    }

    fn config_watch_failed(&self) {
        self.watches.watch_error(WatchedResource::AuthConfig);
    }
}

/// A watch counted open; [`OpenWatch::ended`] counts why it ended.
pub struct OpenWatch(Arc<ServingMetrics>);

impl OpenWatch {
    /// The watch ended, because of `reason`.
    pub fn ended(self, reason: crate::routes::watch::stream::End) {
        self.0
            .watches_ended
            .with_label_values(&[reason.as_str()])
            .inc();
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.watches_open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timer_records_code_and_duration() {
        let registry = Registry::default();
        let m = registry.register::<ServingMetrics>();
        m.request("get", RequestResource::Changelog).finish(404);
        {
            let _unfinished = m.request("list", RequestResource::Summaries);
        }
        let text = String::from_utf8(registry.encode()).unwrap_or_default();
        assert!(text.contains(
            r#"elemental_changelog_http_requests_total{code="404",resource="managedosversions/changelog",verb="get"} 1"#
        ));
        assert!(text.contains(r#"elemental_changelog_http_requests_total{code="500",resource="managedosversions",verb="list"} 1"#));
        assert!(text.contains("elemental_changelog_http_request_duration_seconds_bucket"));
    }

    #[test]
    fn labels_stay_bounded() {
        let registry = Registry::default();
        let m = registry.register::<ServingMetrics>();
        m.request("BREW", RequestResource::Other).finish(418);
        let text = String::from_utf8(registry.encode()).unwrap_or_default();
        assert!(text.contains(r#"code="4xx",resource="other",verb="other""#));
    }
}
