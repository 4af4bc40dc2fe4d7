//! What the channel controller counts: fetches of channel images and their rejected files,
//! the cache's size, each channel's data age, the kept data and its refusals, pulls for
//! retained versions and workers that panicked.

use elemental_changelog::data::FileError;
use prometheus::{GaugeVec, HistogramVec, IntCounter, IntCounterVec, IntGauge};

use crate::{
    metrics::{family, gauge_value},
    read_error::ReadErrorKind,
};

family! {
    /// The channel controller's metrics.
    pub struct ChannelMetrics {
        fetches: IntCounterVec = metric(
            "channel_fetches_total",
            "Channel image fetches, by result (pulled, unchanged, shared: read for another channel already, or the error kind).",
            &["result"],
        ),
        fetch_duration: HistogramVec = metric(
            "channel_fetch_duration_seconds",
            "Time to check and, when the digest changed, pull and parse a channel image.",
            &["result"],
        ).buckets(&[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]),
        fetch_bytes: IntCounter = metric(
            "channel_fetch_bytes_total",
            "Compressed bytes pulled from registries.",
        ),
        file_problems: IntCounterVec = metric(
            "channel_file_problems_total",
            "Files of channel images that were rejected (did not parse), by file kind.",
            &["file"],
        ),
        channels: IntGauge = metric("channels", "Channels with data in the cache."),
        versions: IntGauge = metric(
            "versions",
            "Versions with data in the cache, over all channels and architectures.",
        ),
        advisories: IntGauge = metric(
            "advisories",
            "Precomputed advisories in the cache, over all channels.",
        ),
        retained_versions: IntGauge = metric(
            "retained_versions",
            "Versions served from an earlier image of their channel because the current one no longer lists them.",
        ),
        data_age: GaugeVec = metric(
            "channel_data_age_seconds",
            "Seconds since each channel's data was last confirmed current (pulled, or digest unchanged).",
            &["namespace", "channel"],
        ),
        retained_pulls: IntCounterVec = metric(
            "retained_pulls_total",
            "Pulls by digest of older images to rebuild retained versions the channel history maps to them, by result (pulled, shared: read for another channel already, failed).",
            &["result"],
        ),
        worker_panics: IntCounter = metric(
            "channel_worker_panics_total",
            "Channel workers that panicked; each is restarted with backoff.",
        ),
        kept_bytes: IntGauge = metric(
            "kept_data_bytes",
            "Bytes of parsed channel data kept in memory (as estimated when parsed), each image once however many channels share it; at most --max-kept-total.",
        ),
        kept_limit: IntGauge = metric(
            "kept_data_limit_bytes",
            "The limit on parsed channel data kept for all channels together (--max-kept-total).",
        ),
        kept_refused: IntGauge = metric(
            "kept_data_refused_channels",
            "Channels whose latest image is refused because its data would take the kept data past --max-kept-total (they keep their last good data, if any).",
        ),
        kept_refusals: IntCounter = metric(
            "kept_data_refusals_total",
            "Channel images refused because their data would take the kept data past --max-kept-total.",
        ),
    }
}

impl ChannelMetrics {
    /// Records a finished fetch.
    pub fn fetch(&self, result: FetchResult, seconds: f64, bytes: u64) {
        let label = result.as_str();
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
        self.kept_bytes.set(gauge_value(bytes));
        self.kept_refused.set(gauge_value(refused_channels));
    }

    /// Sets the kept-data limit gauge (`--max-kept-total`).
    pub fn kept_data_limit(&self, bytes: u64) {
        self.kept_limit.set(gauge_value(bytes));
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

    /// Counts a pull by digest for retained versions.
    pub fn retained_pull(&self, result: RetainedPull) {
        self.retained_pulls
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// Counts a channel worker that panicked.
    pub fn worker_panic(&self) {
        self.worker_panics.inc();
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

impl FetchResult {
    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pulled => "pulled",
            Self::Unchanged => "unchanged",
            Self::Shared => "shared",
            Self::Failed(kind) => kind.as_str(),
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
    /// The `file` label value.
    pub fn as_str(self) -> &'static str {
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

impl From<&FileError> for FileProblem {
    fn from(error: &FileError) -> Self {
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

impl RetainedPull {
    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pulled => "pulled",
            Self::Shared => "shared",
            Self::Failed => "failed",
        }
    }
}
