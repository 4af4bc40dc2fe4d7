//! The channel history: for each channel, the image digests the server has
//! read and the versions each listed, kept in one ConfigMap in the server's
//! own namespace so that every replica, however young, can rebuild the data
//! of versions a newer image dropped (see `docs/operations.md`).
//!
//! [`History`] is the pure model (what is recorded, what a version maps to,
//! pruning, size bounds); [`ConfigMapHistory`] keeps it in the cluster:
//! a watch feeds every replica, and writes compare and swap on the
//! ConfigMap's `resourceVersion`, so replicas writing at once lose nothing.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use elemental_changelog_registry::{Digest, ImageRef, Repository};
use futures::{StreamExt, future::BoxFuture};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use prometheus::{IntCounterVec, IntGauge};

use crate::{
    cache::ChannelKey,
    health::ReadyFlag,
    metrics::{family, gauge_value},
    reflect::{WatchMetrics, WatchedResource},
};

/// Most images recorded per channel; the oldest go first beyond it.
pub const MAX_IMAGES_PER_CHANNEL: usize = 16;
/// Most bytes of data (keys and values) in the ConfigMap, well under the
/// 1 MiB a Kubernetes object may hold.
pub const MAX_BYTES: usize = 512 * 1024;
/// Attempts of one compare-and-swap write before giving up until the next change.
const WRITE_ATTEMPTS: u32 = 8;

/// One image a channel resolved to, and the versions it listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    /// Registry and repository, without tag or digest (`registry/elemental/channel`).
    pub repository: Repository,
    /// Digest the channel's reference resolved to (an index digest for a
    /// multi-architecture image).
    pub digest: Digest,
    /// When a replica first recorded it (RFC 3339), for people reading the
    /// object: kept as written, never read by the server.
    pub recorded: String,
    /// Names of the versions (ManagedOSVersions) it listed.
    pub versions: BTreeSet<String>,
}

impl ImageRecord {
    /// The reference that pulls exactly this image: `repository@digest`.
    pub fn reference(&self) -> ImageRef {
        self.repository.at(&self.digest)
    }
}

/// An [`ImageRecord`] as the ConfigMap's JSON writes it.
#[derive(Serialize)]
struct RecordOut<'a> {
    repository: &'a str,
    digest: &'a str,
    recorded: &'a str,
    versions: &'a BTreeSet<String>,
}

impl Serialize for ImageRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RecordOut {
            repository: self.repository.as_str(),
            digest: self.digest.as_str(),
            recorded: &self.recorded,
            versions: &self.versions,
        }
        .serialize(serializer)
    }
}

/// An [`ImageRecord`] as read from the ConfigMap's JSON, not parsed yet.
#[derive(Deserialize)]
struct RecordIn {
    repository: String,
    digest: String,
    recorded: String,
    versions: BTreeSet<String>,
}

impl RecordIn {
    /// The record, or why its repository or digest is none.
    fn parse(self) -> Result<ImageRecord, String> {
        let repository = self.repository.parse().map_err(|e| format!("{e}"))?;
        let digest = self.digest.parse().map_err(|e| format!("{e}"))?;
        Ok(ImageRecord {
            repository,
            digest,
            recorded: self.recorded,
            versions: self.versions,
        })
    }
}

/// The records of one channel, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChannelHistory {
    /// Images, oldest first; the last one is the newest recorded.
    pub images: Vec<ImageRecord>,
}

/// A [`ChannelHistory`] as read from the ConfigMap's JSON.
#[derive(Deserialize)]
struct ChannelIn {
    images: Vec<RecordIn>,
}

/// What [`History::from_data`] could not read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// ConfigMap keys that name no channel, or whose value is not a channel's records.
    pub keys: Vec<String>,
    /// Records whose repository or digest does not parse: the key, the
    /// record's position (0: the oldest) and why.
    pub records: Vec<String>,
}

/// The history of every channel, as read from the ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    channels: BTreeMap<ChannelKey, ChannelHistory>,
}

/// The ConfigMap data key of a channel: `<namespace>.<name>` (a namespace
/// holds no dot, so the first dot separates them).
fn data_key(key: &ChannelKey) -> String {
    format!("{}.{}", key.namespace, key.name)
}

fn parse_key(text: &str) -> Option<ChannelKey> {
    let (namespace, name) = text.split_once('.')?;
    (!namespace.is_empty() && !name.is_empty()).then(|| ChannelKey::new(namespace, name))
}

impl History {
    /// Reads ConfigMap data; keys or values that cannot be read, and records
    /// whose repository or digest does not parse, are skipped (and named in
    /// what is returned), the rest is used.
    pub fn from_data(data: &BTreeMap<String, String>) -> (Self, Skipped) {
        let mut history = Self::default();
        let mut skipped = Skipped::default();
        for (text, value) in data {
            let (Some(key), Ok(channel)) =
                (parse_key(text), serde_json::from_str::<ChannelIn>(value))
            else {
                skipped.keys.push(text.clone());
                continue;
            };
            let mut images = Vec::with_capacity(channel.images.len());
            for (index, record) in channel.images.into_iter().enumerate() {
                match record.parse() {
                    Ok(record) => images.push(record),
                    Err(why) => skipped.records.push(format!("{text}[{index}]: {why}")),
                }
            }
            history.channels.insert(key, ChannelHistory { images });
        }
        (history, skipped)
    }

    /// ConfigMap data: one key per channel, its records as compact JSON.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        self.channels
            .iter()
            .map(|(key, channel)| {
                (
                    data_key(key),
                    serde_json::to_string(channel).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Bytes of data the ConfigMap would hold.
    pub fn size(&self) -> usize {
        self.to_data().iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// The records of a channel.
    pub fn channel(&self, key: &ChannelKey) -> Option<&ChannelHistory> {
        self.channels.get(key)
    }

    /// The image a version's data comes from: the newest record listing it.
    pub fn origin(&self, key: &ChannelKey, version: &str) -> Option<&ImageRecord> {
        self.channels
            .get(key)?
            .images
            .iter()
            .rev()
            .find(|r| r.versions.contains(version))
    }

    /// The image a version's data comes from when only images of `repository`
    /// (`registry/repository`, the channel's own) are trusted: the newest
    /// record of that repository listing it. Records naming another
    /// repository (an edit by whoever can write the ConfigMap) are skipped,
    /// never followed.
    pub fn origin_in(
        &self,
        key: &ChannelKey,
        version: &str,
        repository: &Repository,
    ) -> Option<&ImageRecord> {
        self.channels
            .get(key)?
            .images
            .iter()
            .rev()
            .find(|r| r.repository == *repository && r.versions.contains(version))
    }

    /// Whether recording `digest` with `versions` would change anything: it is
    /// the newest record already and lists them all.
    pub fn is_recorded(
        &self,
        key: &ChannelKey,
        digest: &Digest,
        versions: &BTreeSet<String>,
    ) -> bool {
        self.channels
            .get(key)
            .and_then(|c| c.images.last())
            .is_some_and(|r| r.digest == *digest && versions.is_subset(&r.versions))
    }

    /// Records that `key` resolved to `digest` in `repository`, listing
    /// `versions`: it becomes the newest record (merged with an earlier
    /// record of the same digest, as when a channel goes back to an older
    /// image). Returns whether anything changed.
    pub fn record(
        &mut self,
        key: &ChannelKey,
        repository: &Repository,
        digest: &Digest,
        versions: &BTreeSet<String>,
        now: jiff::Timestamp,
    ) -> bool {
        if self.is_recorded(key, digest, versions) {
            return false;
        }
        let channel = self.channels.entry(key.clone()).or_default();
        let mut record = match channel.images.iter().position(|r| r.digest == *digest) {
            Some(index) => channel.images.remove(index),
            None => ImageRecord {
                repository: repository.clone(),
                digest: digest.clone(),
                recorded: now.to_string(),
                versions: BTreeSet::new(),
            },
        };
        record.repository = repository.clone();
        record.versions.extend(versions.iter().cloned());
        channel.images.push(record);
        true
    }

    /// Forgets what no ManagedOSVersion needs any more, for the channels
    /// `in_scope` says this replica watches: channels `exists` says are gone,
    /// and in every record but the newest, versions that a newer record of
    /// the same repository lists (a record naming another repository is never
    /// followed, so it shadows nothing) or whose ManagedOSVersion `exists`
    /// says is gone; records left with no version go too. Returns whether
    /// anything changed.
    pub fn prune(
        &mut self,
        in_scope: impl Fn(&ChannelKey) -> bool,
        exists: impl Fn(&ChannelKey, Option<&str>) -> bool,
    ) -> bool {
        let before = self.channels.clone();
        self.channels
            .retain(|key, _| !in_scope(key) || exists(key, None));
        for (key, channel) in &mut self.channels {
            if !in_scope(key) {
                continue;
            }
            let mut newer: BTreeMap<Repository, BTreeSet<String>> = BTreeMap::new();
            let count = channel.images.len();
            for (index, record) in channel.images.iter_mut().enumerate().rev() {
                let newer = newer.entry(record.repository.clone()).or_default();
                if index + 1 < count {
                    record
                        .versions
                        .retain(|v| !newer.contains(v) && exists(key, Some(v)));
                }
                newer.extend(record.versions.iter().cloned());
            }
            let newest = count.saturating_sub(1);
            let mut index = 0;
            channel.images.retain(|r| {
                let keep = index == newest || !r.versions.is_empty();
                index += 1;
                keep
            });
        }
        self.channels.retain(|_, c| !c.images.is_empty());
        before != self.channels
    }

    /// Applies the size bounds: at most [`MAX_IMAGES_PER_CHANNEL`] records
    /// per channel and [`MAX_BYTES`] in all, dropping the oldest records
    /// (never a channel's newest). Returns how many records were dropped;
    /// `None` when even the newest records alone do not fit.
    pub fn bound(&mut self) -> Option<usize> {
        let mut dropped = 0;
        for channel in self.channels.values_mut() {
            let excess = channel.images.len().saturating_sub(MAX_IMAGES_PER_CHANNEL);
            channel.images.drain(..excess);
            dropped += excess;
        }
        while self.size() > MAX_BYTES {
            // The channel with the most records gives up its oldest.
            let longest = self
                .channels
                .values_mut()
                .filter(|c| c.images.len() > 1)
                .max_by_key(|c| c.images.len())?;
            longest.images.remove(0);
            dropped += 1;
        }
        Some(dropped)
    }

    /// Number of records, over every channel.
    pub fn records(&self) -> usize {
        self.channels.values().map(|c| c.images.len()).sum()
    }
}

/// Why the history could not be written.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The Kubernetes API refused or failed the request.
    #[error("ConfigMap {namespace}/{name}")]
    Api {
        /// Namespace of the ConfigMap.
        namespace: String,
        /// Its name.
        name: String,
        /// What the API said.
        #[source]
        source: kube::Error,
    },
    /// Other replicas kept writing in between every attempt.
    #[error("ConfigMap {namespace}/{name} kept changing during {WRITE_ATTEMPTS} attempts")]
    Contended {
        /// Namespace of the ConfigMap.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The history would not fit even with only the newest record of each channel.
    #[error("the channel history would exceed {MAX_BYTES} bytes even with one image per channel")]
    TooLarge,
}

/// A change to apply to the history; returns whether it changed anything.
pub type Change = Box<dyn Fn(&mut History) -> bool + Send + Sync>;

/// Where the history lives: read by watching, written by compare and swap.
pub trait HistoryStore: Send + Sync {
    /// The history as last read, and `true` once it has been read (or the
    /// first read failed, so that workers go on without it).
    fn subscribe(&self) -> watch::Receiver<(Arc<History>, bool)>;

    /// Applies `change` to the current history and writes the result, retried
    /// on conflicts; a change that changes nothing writes nothing.
    fn update(&self, change: Change) -> BoxFuture<'_, Result<(), HistoryError>>;
}

/// The history kept in a ConfigMap.
pub struct ConfigMapHistory {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    metrics: Arc<HistoryMetrics>,
    watches: Arc<WatchMetrics>,
    state: watch::Sender<(Arc<History>, bool)>,
}

impl std::fmt::Debug for ConfigMapHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigMapHistory")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ConfigMapHistory {
    /// The history in ConfigMap `namespace/name`; read once [`ConfigMapHistory::run`] runs.
    /// Its watch is counted in `watches`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        metrics: Arc<HistoryMetrics>,
        watches: Arc<WatchMetrics>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            metrics,
            watches,
            state: watch::Sender::new((Arc::new(History::default()), false)),
        }
    }

    fn api_error(&self, source: kube::Error) -> HistoryError {
        HistoryError::Api {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    fn read(&self, config_map: Option<&ConfigMap>) -> History {
        let data = config_map.and_then(|c| c.data.clone()).unwrap_or_default();
        let (history, skipped) = History::from_data(&data);
        if !skipped.keys.is_empty() {
            warn!(keys = ?skipped.keys, configmap = %self.name, "ignoring unreadable keys of the channel history; the next write drops them");
        }
        if !skipped.records.is_empty() {
            warn!(records = ?skipped.records, configmap = %self.name, "ignoring records of the channel history whose repository or digest does not parse; the next write drops them");
        }
        history
    }

    /// Watches the ConfigMap forever, publishing each version of the history;
    /// sets `ready` once it has been read.
    pub async fn run(self: Arc<Self>, ready: ReadyFlag) {
        let config = crate::reflect::watch_config().fields(&format!("metadata.name={}", self.name));
        let stream = watcher(self.api.clone(), config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut seen: Option<ConfigMap> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => seen = None,
                Ok(watcher::Event::InitApply(cm)) => seen = Some(cm),
                Ok(watcher::Event::InitDone) => {
                    let history = self.read(seen.as_ref());
                    info!(records = history.records(), "channel history read");
                    self.publish(history);
                    ready.set();
                }
                Ok(watcher::Event::Apply(cm)) => {
                    let history = self.read(Some(&cm));
                    debug!(records = history.records(), "channel history changed");
                    self.publish(history);
                }
                Ok(watcher::Event::Delete(_)) => {
                    warn!(configmap = %self.name, "the channel history was deleted; replicas record again what they read next");
                    self.publish(History::default());
                }
                Err(error) => {
                    self.watches.watch_error(WatchedResource::History);
                    if matches!(&error, watcher::Error::InitialListFailed(kube::Error::Api(status)) | watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 403)
                    {
                        // Not readable by this ServiceAccount: serving without the history beats
                        // never becoming ready (which takes the APIService, and discovery of
                        // the whole cluster, away). Retained versions then live in this
                        // replica's memory only, until a retry succeeds.
                        error!(error = %crate::telemetry::error_chain(&error), namespace = %self.namespace, configmap = %self.name, "cannot read the channel history: grant the server's ServiceAccount get, list, watch, create and update on this ConfigMap (the chart's Role does); serving without it meanwhile");
                        ready.set();
                    } else {
                        warn!(error = %crate::telemetry::error_chain(&error), "watching the channel history failed; retrying with backoff");
                    }
                    // Workers must not wait forever for a history they cannot read.
                    self.state
                        .send_if_modified(|(_, loaded)| !std::mem::replace(loaded, true));
                }
            }
        }
    }

    fn publish(&self, history: History) {
        self.metrics.history_records(history.records());
        self.state.send_if_modified(|(current, loaded)| {
            let changed = !*loaded || **current != history;
            if changed {
                *current = Arc::new(history);
                *loaded = true;
            }
            changed
        });
    }

    /// One compare-and-swap write; true when something was written.
    async fn try_update(&self, change: &Change) -> Result<bool, HistoryError> {
        for attempt in 0..WRITE_ATTEMPTS {
            let current = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|e| self.api_error(e))?;
            let mut history = self.read(current.as_ref());
            if !change(&mut history) {
                return Ok(false);
            }
            match history.bound() {
                None => return Err(HistoryError::TooLarge),
                Some(0) => {}
                Some(dropped) => {
                    warn!(
                        dropped,
                        "the channel history reached its bounds; its oldest images were forgotten"
                    );
                }
            }
            let data = Some(history.to_data());
            let result = match current {
                Some(mut config_map) => {
                    // resourceVersion stays as read: the API refuses the write
                    // if anyone wrote in between.
                    config_map.data = data;
                    self.api
                        .replace(&self.name, &PostParams::default(), &config_map)
                        .await
                }
                None => {
                    let config_map = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(self.namespace.clone()),
                            labels: Some(BTreeMap::from([(
                                "app.kubernetes.io/name".to_owned(),
                                "elemental-changelog".to_owned(),
                            )])),
                            ..ObjectMeta::default()
                        },
                        data,
                        ..ConfigMap::default()
                    };
                    self.api.create(&PostParams::default(), &config_map).await
                }
            };
            match result {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    self.metrics.history_write(HistoryWrite::Conflict);
                    debug!(attempt, "channel history changed meanwhile; trying again");
                    // Spread replicas that collide apart a little.
                    let pause = 20 * u64::from(attempt + 1)
                        + u64::from(jiff::Timestamp::now().subsec_nanosecond().unsigned_abs() % 20);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Err(error) => return Err(self.api_error(error)),
            }
        }
        Err(HistoryError::Contended {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        })
    }
}

impl HistoryStore for ConfigMapHistory {
    fn subscribe(&self) -> watch::Receiver<(Arc<History>, bool)> {
        self.state.subscribe()
    }

    fn update(&self, change: Change) -> BoxFuture<'_, Result<(), HistoryError>> {
        Box::pin(async move {
            let result = self.try_update(&change).await;
            match &result {
                Ok(true) => self.metrics.history_write(HistoryWrite::Written),
                Ok(false) => {}
                Err(_) => self.metrics.history_write(HistoryWrite::Failed),
            }
            result.map(drop)
        })
    }
}

family! {
    /// What the channel history counts.
    pub struct HistoryMetrics {
        writes: IntCounterVec = metric(
            "channel_history_writes_total",
            "Writes of the channel history ConfigMap, by result (written, conflict, failed).",
            &["result"],
        ),
        records: IntGauge = metric(
            "channel_history_images",
            "Images recorded in the channel history, over all channels.",
        ),
        enabled: IntGauge = metric(
            "channel_history_enabled",
            "1 when the channel history ConfigMap is kept (--history-namespace, or the service account's namespace in a pod), 0 when it is off.",
        ),
    }
}

impl HistoryMetrics {
    /// Counts a write of the channel history.
    pub fn history_write(&self, result: HistoryWrite) {
        self.writes.with_label_values(&[result.as_str()]).inc();
    }

    /// Sets the number of images recorded in the channel history.
    pub fn history_records(&self, records: usize) {
        self.records.set(gauge_value(records));
    }

    /// Records whether the channel history is kept in the cluster.
    pub fn history_enabled(&self, enabled: bool) {
        self.enabled.set(i64::from(enabled));
    }
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

impl HistoryWrite {
    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Conflict => "conflict",
            Self::Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests;
