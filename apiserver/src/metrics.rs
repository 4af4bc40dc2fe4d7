//! Prometheus metrics. [`Metrics`] owns the registry; every label value is a
//! bounded enum or a Kubernetes object key that leaves with its object, never
//! an error string.

use std::time::Instant;

use elemental_changelog_auth::{Authentication, Authorization};

use crate::read_error::ReadErrorKind;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The resource label of request metrics: what was asked for, in a few words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestResource {
    /// `managedosversions` (summaries).
    Summaries,
    /// `managedosversions/changelog`.
    Changelog,
    /// `machineinventories` (the fleet view's machines).
    Machines,
    /// `machineinventories/changelog`.
    MachineChangelog,
    /// `managedosimages/changelog`.
    ImageChangelog,
    /// Discovery documents.
    Discovery,
    /// OpenAPI documents.
    OpenApi,
    /// `/livez`, `/readyz`, `/healthz`.
    Health,
    /// `/metrics`.
    Metrics,
    /// Anything else (answered 404).
    Other,
}

impl RequestResource {
    fn as_str(self) -> &'static str {
        match self {
            Self::Summaries => "managedosversions",
            Self::Changelog => "managedosversions/changelog",
            Self::Machines => "machineinventories",
            Self::MachineChangelog => "machineinventories/changelog",
            Self::ImageChangelog => "managedosimages/changelog",
            Self::Discovery => "discovery",
            Self::OpenApi => "openapi",
            Self::Health => "health",
            Self::Metrics => "metrics",
            Self::Other => "other",
        }
    }
}

/// What a watch watches: the `resource` label of watch metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchedResource {
    /// The operator's `ManagedOSVersionChannel` objects.
    Channels,
    /// The operator's `ManagedOSVersion` objects.
    Versions,
    /// The ConfigMap of the channel history.
    History,
    /// `kube-system/extension-apiserver-authentication`.
    AuthConfig,
    /// The operator's `MachineInventory` objects (the fleet view).
    MachineInventories,
    /// The operator's `MachineInventorySelector` objects (the fleet view).
    MachineInventorySelectors,
    /// The operator's `ManagedOSImage` objects (the fleet view).
    ManagedOsImages,
}

impl WatchedResource {
    /// The `resource` label value: the plural of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MachineInventories => "machineinventories",
            Self::MachineInventorySelectors => "machineinventoryselectors",
            Self::ManagedOsImages => "managedosimages",
            Self::Channels => "managedosversionchannels",
            Self::Versions => "managedosversions",
            Self::History => "configmaps",
            Self::AuthConfig => "extension-apiserver-authentication",
        }
    }
}

/// How a reload of the serving certificate ended: the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertReload {
    /// The new pair was loaded and is served.
    Loaded,
    /// The new pair was refused; the old one is kept.
    Rejected,
}

impl CertReload {
    fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Rejected => "rejected",
        }
    }
}

/// Which file of a channel image was rejected, and why: the `file` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileProblem {
    /// An `updates.log` that does not parse.
    UpdatesLog,
    /// A package list that does not parse.
    Packages,
    /// An `updateinfo.xml` that does not parse or is past its limits.
    UpdateInfo,
    /// A file named after a version `channel.json` does not list.
    UnknownVersion,
    /// A file named after an entry that is not a container.
    NotAContainer,
    /// A second `updateinfo.xml`.
    DuplicateUpdateInfo,
}

impl FileProblem {
    fn as_str(self) -> &'static str {
        match self {
            Self::UpdatesLog => "updates_log",
            Self::Packages => "packages",
            Self::UpdateInfo => "updateinfo",
            Self::UnknownVersion => "unknown_version",
            Self::NotAContainer => "not_a_container",
            Self::DuplicateUpdateInfo => "duplicate_updateinfo",
        }
    }
}

impl From<&elemental_changelog::data::FileError> for FileProblem {
    fn from(error: &elemental_changelog::data::FileError) -> Self {
        use elemental_changelog::data::FileError;
        match error {
            FileError::Updates(_) => Self::UpdatesLog,
            FileError::Packages(_) => Self::Packages,
            FileError::UpdateInfo(_) => Self::UpdateInfo,
            FileError::UnknownVersion { .. } => Self::UnknownVersion,
            FileError::NotAContainer { .. } => Self::NotAContainer,
            FileError::DuplicateUpdateInfo { .. } => Self::DuplicateUpdateInfo,
        }
    }
}

/// How a fetch of a channel image ended; the `result` label of fetch metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchResult {
    /// Pulled and parsed.
    Pulled,
    /// The digest was unchanged: nothing pulled.
    Unchanged,
    /// Another channel had read the same image: its data is shared, nothing
    /// pulled or parsed.
    Shared,
    /// Failed; the label is the error kind.
    Failed(ReadErrorKind),
}

/// How a write of the channel history ended; the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryWrite {
    /// Written.
    Written,
    /// Another replica wrote first; retried from the new content.
    Conflict,
    /// Failed (API error, contention, size); retried at the next change.
    Failed,
}

/// How the rebuild of retained versions from an older image ended; the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetainedPull {
    /// The older image was pulled and its versions are served.
    Pulled,
    /// Another channel had read the older image: its data is shared, nothing pulled.
    Shared,
    /// It could not be pulled; retried with backoff.
    Failed,
}

/// All metrics of the process.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    fetches: IntCounterVec,
    fetch_duration: HistogramVec,
    fetch_bytes: IntCounter,
    file_problems: IntCounterVec,
    channels: IntGauge,
    versions: IntGauge,
    advisories: IntGauge,
    retained_versions: IntGauge,
    data_age: GaugeVec,
    watch_errors: IntCounterVec,
    watch_ready: IntGaugeVec,
    machines: IntGaugeVec,
    authentications: IntCounterVec,
    authorizations: IntCounterVec,
    cert_reloads: IntCounterVec,
    open_connections: IntGauge,
    refused: IntCounterVec,
    history_writes: IntCounterVec,
    history_records: IntGauge,
    history_enabled: IntGauge,
    retained_pulls: IntCounterVec,
    worker_panics: IntCounter,
    answer_hits: IntCounter,
    answer_misses: IntCounter,
    answer_bytes: IntGauge,
    answers: IntGauge,
    kept_bytes: IntGauge,
    kept_limit: IntGauge,
    kept_refused: IntGauge,
    kept_refusals: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `metric` (built from static definitions, so it cannot fail) and returns it.
fn register<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &str,
    metric: prometheus::Result<M>,
) -> M {
    let metric = metric.unwrap_or_else(|e| unreachable!("static metric definition {name}: {e}"));
    registry
        .register(Box::new(metric.clone()))
        .unwrap_or_else(|e| unreachable!("metric {name} registered twice: {e}"));
    metric
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace("elemental_changelog")
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(registry, name, IntCounterVec::new(opts(name, help), labels))
}

fn plain_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, name, IntCounter::with_opts(opts(name, help)))
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help)
        .namespace("elemental_changelog")
        .buckets(buckets);
    register(registry, name, HistogramVec::new(opts, labels))
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, name, IntGauge::with_opts(opts(name, help)))
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(registry, name, IntGaugeVec::new(opts(name, help), labels))
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let r = Registry::new();
        let answer_lookups = counter(
            &r,
            "answer_cache_requests_total",
            "Answers looked up in the ready-bytes cache, by result (hit: sent as kept; miss: rendered).",
            &["result"],
        );
        Self {
            requests: counter(
                &r,
                "http_requests_total",
                "HTTP requests answered, by verb, resource and status code.",
                &["verb", "resource", "code"],
            ),
            request_duration: histogram(
                &r,
                "http_request_duration_seconds",
                "Time to answer an HTTP request, authentication and authorization included.",
                &["verb", "resource"],
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ],
            ),
            fetches: counter(
                &r,
                "channel_fetches_total",
                "Channel image fetches, by result (pulled, unchanged, shared: read for another channel already, or the error kind).",
                &["result"],
            ),
            fetch_duration: histogram(
                &r,
                "channel_fetch_duration_seconds",
                "Time to check and, when the digest changed, pull and parse a channel image.",
                &["result"],
                vec![
                    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                ],
            ),
            fetch_bytes: plain_counter(
                &r,
                "channel_fetch_bytes_total",
                "Compressed bytes pulled from registries.",
            ),
            file_problems: counter(
                &r,
                "channel_file_problems_total",
                "Files of channel images that were rejected (did not parse), by file kind.",
                &["file"],
            ),
            channels: gauge(&r, "channels", "Channels with data in the cache."),
            versions: gauge(
                &r,
                "versions",
                "Versions with data in the cache, over all channels and architectures.",
            ),
            advisories: gauge(
                &r,
                "advisories",
                "Precomputed advisories in the cache, over all channels.",
            ),
            retained_versions: gauge(
                &r,
                "retained_versions",
                "Versions served from an earlier image of their channel because the current one no longer lists them.",
            ),
            data_age: register(
                &r,
                "channel_data_age_seconds",
                GaugeVec::new(
                    opts(
                        "channel_data_age_seconds",
                        "Seconds since each channel's data was last confirmed current (pulled, or digest unchanged).",
                    ),
                    &["namespace", "channel"],
                ),
            ),
            watch_errors: counter(
                &r,
                "watch_errors_total",
                "Errors of the watches on the Kubernetes API, by watched resource; each is retried with backoff.",
                &["resource"],
            ),
            machines: gauge_vec(
                &r,
                "machines",
                "MachineInventories of the fleet view, by namespace, state (UpToDate, UpdatesAvailable, Unknown) and highest severity of the pending changelog (none without one).",
                &["namespace", "state", "severity"],
            ),
            watch_ready: gauge_vec(
                &r,
                "watch_synced",
                "1 when the watch of a resource has completed its initial list.",
                &["resource"],
            ),
            authentications: counter(
                &r,
                "authentications_total",
                "Authentication results, by method (requestheader, x509, token, anonymous) or failure.",
                &["result"],
            ),
            authorizations: counter(
                &r,
                "authorizations_total",
                "Authorization decisions (allowed, denied, error).",
                &["decision"],
            ),
            cert_reloads: counter(
                &r,
                "serving_cert_reloads_total",
                "Serving certificate reloads, by result (loaded, rejected).",
                &["result"],
            ),
            open_connections: gauge(
                &r,
                "open_connections",
                "Client connections open (TLS handshake included).",
            ),
            refused: counter(
                &r,
                "refused_total",
                "Connections and requests refused by a serving limit, by limit (max_connections, max_requests_inflight, request_timeout, compute_queue, reviews_in_flight).",
                &["limit"],
            ),
            history_writes: counter(
                &r,
                "channel_history_writes_total",
                "Writes of the channel history ConfigMap, by result (written, conflict, failed).",
                &["result"],
            ),
            history_records: gauge(
                &r,
                "channel_history_images",
                "Images recorded in the channel history, over all channels.",
            ),
            history_enabled: gauge(
                &r,
                "channel_history_enabled",
                "1 when the channel history ConfigMap is kept (--history-namespace, or the service account's namespace in a pod), 0 when it is off.",
            ),
            retained_pulls: counter(
                &r,
                "retained_pulls_total",
                "Pulls by digest of older images to rebuild retained versions the channel history maps to them, by result (pulled, shared: read for another channel already, failed).",
                &["result"],
            ),
            worker_panics: plain_counter(
                &r,
                "channel_worker_panics_total",
                "Channel workers that panicked; each is restarted with backoff.",
            ),
            answer_hits: answer_lookups.with_label_values(&["hit"]),
            answer_misses: answer_lookups.with_label_values(&["miss"]),
            answer_bytes: gauge(
                &r,
                "answer_cache_bytes",
                "Bytes of rendered answers kept (bodies, gzip forms, per-answer overhead); at most --answer-cache-size.",
            ),
            answers: gauge(&r, "answer_cache_answers", "Rendered answers kept."),
            kept_bytes: gauge(
                &r,
                "kept_data_bytes",
                "Bytes of parsed channel data kept in memory (as estimated when parsed), each image once however many channels share it; at most --max-kept-total.",
            ),
            kept_limit: gauge(
                &r,
                "kept_data_limit_bytes",
                "The limit on parsed channel data kept for all channels together (--max-kept-total).",
            ),
            kept_refused: gauge(
                &r,
                "kept_data_refused_channels",
                "Channels whose latest image is refused because its data would take the kept data past --max-kept-total (they keep their last good data, if any).",
            ),
            kept_refusals: plain_counter(
                &r,
                "kept_data_refusals_total",
                "Channel images refused because their data would take the kept data past --max-kept-total.",
            ),
            registry: r,
        }
    }

    /// Counts a connection closed at once because the connection limits were reached.
    pub fn connection_refused(&self) {
        self.refused.with_label_values(&["max_connections"]).inc();
    }

    /// Counts a request refused or ended by a serving limit.
    pub fn request_refused(&self, limit: ServingLimit) {
        self.refused.with_label_values(&[limit.as_str()]).inc();
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

    /// Records a finished fetch.
    pub fn fetch(&self, result: FetchResult, seconds: f64, bytes: u64) {
        let label = match result {
            FetchResult::Pulled => "pulled",
            FetchResult::Unchanged => "unchanged",
            FetchResult::Shared => "shared",
            FetchResult::Failed(kind) => kind.as_str(),
        };
        self.fetches.with_label_values(&[label]).inc();
        self.fetch_duration
            .with_label_values(&[label])
            .observe(seconds);
        self.fetch_bytes.inc_by(bytes);
    }

    /// Counts a rejected file of a channel image (`file` is its kind).
    pub fn file_problem(&self, file: FileProblem) {
        self.file_problems.with_label_values(&[file.as_str()]).inc();
    }

    /// Sets the cache size gauges.
    pub fn cache_size(&self, channels: usize, versions: usize, advisories: usize, retained: usize) {
        self.channels.set(gauge_value(channels));
        self.versions.set(gauge_value(versions));
        self.advisories.set(gauge_value(advisories));
        self.retained_versions.set(gauge_value(retained));
    }

    /// Sets the kept-data gauges: bytes of parsed data kept (each image once) and the
    /// channels whose latest image is refused for the `--max-kept-total` limit.
    pub fn kept_data(&self, bytes: u64, refused_channels: usize) {
        self.kept_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.kept_refused.set(gauge_value(refused_channels));
    }

    /// Sets the kept-data limit gauge (`--max-kept-total`).
    pub fn kept_data_limit(&self, bytes: u64) {
        self.kept_limit
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts a channel image refused for the `--max-kept-total` limit.
    pub fn kept_data_refusal(&self) {
        self.kept_refusals.inc();
    }

    /// Sets the age of a channel's data.
    pub fn channel_age(&self, namespace: &str, channel: &str, seconds: f64) {
        self.data_age
            .with_label_values(&[namespace, channel])
            .set(seconds);
    }

    /// Forgets a deleted channel's series.
    pub fn forget_channel(&self, namespace: &str, channel: &str) {
        // An absent series is fine: nothing to forget.
        let _ = self.data_age.remove_label_values(&[namespace, channel]);
    }

    /// Counts a watch error of `resource`.
    pub fn watch_error(&self, resource: WatchedResource) {
        self.watch_errors
            .with_label_values(&[resource.as_str()])
            .inc();
    }

    /// Sets the machines gauge to `counts` (by namespace, state and severity); series not in
    /// `counts` are dropped.
    pub fn set_machines(&self, counts: &std::collections::BTreeMap<(String, String, String), i64>) {
        self.machines.reset();
        for ((namespace, state, severity), n) in counts {
            self.machines
                .with_label_values(&[namespace.as_str(), state.as_str(), severity.as_str()])
                .set(*n);
        }
    }

    /// Records whether the watch of `resource` has synced.
    pub fn watch_synced(&self, resource: WatchedResource, synced: bool) {
        self.watch_ready
            .with_label_values(&[resource.as_str()])
            .set(i64::from(synced));
    }

    /// Counts an authentication result.
    pub fn authentication(&self, result: Authentication) {
        self.authentications
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// Counts an authorization decision.
    pub fn authorization(&self, decision: Authorization) {
        self.authorizations
            .with_label_values(&[decision.as_str()])
            .inc();
    }

    /// Counts a serving certificate reload.
    pub fn cert_reload(&self, result: CertReload) {
        self.cert_reloads
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// Counts a write of the channel history.
    pub fn history_write(&self, result: HistoryWrite) {
        let label = match result {
            HistoryWrite::Written => "written",
            HistoryWrite::Conflict => "conflict",
            HistoryWrite::Failed => "failed",
        };
        self.history_writes.with_label_values(&[label]).inc();
    }

    /// Sets the number of images recorded in the channel history.
    pub fn history_records(&self, records: usize) {
        self.history_records.set(gauge_value(records));
    }

    /// Records whether the channel history is kept in the cluster.
    pub fn history_enabled(&self, enabled: bool) {
        self.history_enabled.set(i64::from(enabled));
    }

    /// Counts a pull by digest for retained versions.
    pub fn retained_pull(&self, result: RetainedPull) {
        let label = match result {
            RetainedPull::Pulled => "pulled",
            RetainedPull::Shared => "shared",
            RetainedPull::Failed => "failed",
        };
        self.retained_pulls.with_label_values(&[label]).inc();
    }

    /// Counts a channel worker that panicked.
    pub fn worker_panic(&self) {
        self.worker_panics.inc();
    }

    /// Counts a lookup in the ready-bytes cache.
    pub fn answer_cache(&self, hit: bool) {
        if hit {
            self.answer_hits.inc();
        } else {
            self.answer_misses.inc();
        }
    }

    /// Sets the size of the ready-bytes cache.
    pub fn answer_cache_bytes(&self, bytes: u64, answers: usize) {
        self.answer_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.answers.set(gauge_value(answers));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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

impl elemental_changelog_auth::AuthMetrics for Metrics {
    fn authentication(&self, result: Authentication) {
        Metrics::authentication(self, result);
    }

    fn authorization(&self, decision: Authorization) {
        Metrics::authorization(self, decision);
    }

    fn config_watch_synced(&self) {
        self.watch_synced(WatchedResource::AuthConfig, true);
    }

    fn config_watch_failed(&self) {
        self.watch_error(WatchedResource::AuthConfig);
    }
}

/// The serving limit that refused a request: the `limit` label of `refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServingLimit {
    /// `--max-requests-inflight`.
    Inflight,
    /// `--request-timeout`.
    Timeout,
    /// Waiting for a compute slot outlasted the request's deadline.
    ComputeQueue,
    /// As many TokenReviews or SubjectAccessReviews as allowed were in flight.
    Reviews,
}

impl ServingLimit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Inflight => "max_requests_inflight",
            Self::Timeout => "request_timeout",
            Self::ComputeQueue => "compute_queue",
            Self::Reviews => "reviews_in_flight",
        }
    }
}

/// An open connection; see [`Metrics::connection_opened`].
pub struct OpenConnection<'a>(&'a IntGauge);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Times one request; see [`Metrics::request`].
pub struct RequestTimer<'a> {
    metrics: &'a Metrics,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timer_records_code_and_duration() {
        let m = Metrics::new();
        m.request("get", RequestResource::Changelog).finish(404);
        {
            let _unfinished = m.request("list", RequestResource::Summaries);
        }
        let text = String::from_utf8(m.encode()).unwrap_or_default();
        assert!(text.contains(
            r#"elemental_changelog_http_requests_total{code="404",resource="managedosversions/changelog",verb="get"} 1"#
        ));
        assert!(text.contains(r#"elemental_changelog_http_requests_total{code="500",resource="managedosversions",verb="list"} 1"#));
        assert!(text.contains("elemental_changelog_http_request_duration_seconds_bucket"));
    }

    #[test]
    fn labels_stay_bounded() {
        let m = Metrics::new();
        m.request("BREW", RequestResource::Other).finish(418);
        let text = String::from_utf8(m.encode()).unwrap_or_default();
        assert!(text.contains(r#"code="4xx",resource="other",verb="other""#));
    }

    #[test]
    fn forgotten_channel_leaves_no_series() {
        let m = Metrics::new();
        m.channel_age("fleet-default", "sl-micro", 3.0);
        assert!(
            String::from_utf8(m.encode())
                .unwrap_or_default()
                .contains("sl-micro")
        );
        m.forget_channel("fleet-default", "sl-micro");
        assert!(
            !String::from_utf8(m.encode())
                .unwrap_or_default()
                .contains("sl-micro")
        );
    }
}
