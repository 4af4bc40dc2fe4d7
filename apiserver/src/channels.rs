//! Channels and versions: the elemental-operator's objects kept in memory by
//! reflectors, and the channel controller that keeps each channel's image data current.
//!
//! The path from a ManagedOSVersionChannel change to the bytes of an answer, in order:
//!
//! 1. **watch**: [`start`] watches channels and versions through the server's one watch
//!    driver ([`reflect::watch`]) into stores; `channel_event`/`version_event` turn watch
//!    events into a `ChannelEvent`.
//! 2. **runtime** (`channels/controller.rs`): one worker per channel, started, woken (a new image or
//!    sync key, a new version the last read did not know) and stopped (deleted) by those
//!    events; supervised (a panic is counted, the worker restarted with backoff).
//! 3. **reconcile** (`channels/reconcile.rs`): the worker's one function of channel logic: resolve the
//!    image per architecture (no pull when the digest is unchanged), read what changed
//!    through the image store (`images`: one read per image key at a time, parses shared
//!    between channels), admit it under `--max-kept-total` (`kept`), and serve the versions
//!    an older image listed (`retained`, from the [`history`]). It writes nothing shared:
//!    it returns the channel's `NextState`, or a `RefreshError` with its cause and the state
//!    to publish all the same (the failure recorded next to the last good data).
//! 4. **publish** (`channels/publish.rs`): the one place where new state becomes visible: the cache
//!    (`Cache::apply`), the images read in the channel history, the totals. Each channel's
//!    changes come from its one worker, in order, under a lease the controller voids when
//!    the channel is deleted.
//! 5. **error policy** (`controller::error_policy`): from the typed cause, when to reconcile
//!    again: the refresh interval after a success, else backoff (and, refused for the
//!    kept-data limit, as soon as kept data changes).
//! 6. **answer**: requests read the published snapshots (`routes::resources`); answer keys
//!    name a snapshot by its generation, so a new snapshot is a new answer.
//!
//! Why not kube-runtime's `Controller`: it reconciles objects of one reflector store,
//! while a server watching several namespaces keeps one store per namespace (one store fed
//! by several watches is wiped by each watch's re-list); it learns of deletions only
//! through finalizers, which a read-only server must not add, and a deleted channel's fetch
//! must be stopped (aborted) so that nothing resurrects its data; a panic in a reconcile
//! would end its whole stream, not one channel's worker; and readiness waits for the first
//! fetch of every channel present at start, which its scheduler does not report. The
//! runtime here keeps its shape: reconcile returns, the runtime alone acts.

mod controller;
pub mod crd;
pub mod history;
mod images;
mod kept;
pub mod metrics;
mod progress;
mod publish;
mod reconcile;
mod retained;

pub use self::images::{CHANNEL_FILES, parse_limits};

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use elemental_changelog_apiservice::Arch;
use elemental_changelog_registry::{
    Access, Digest, FetchError, Fetched, ImageRef, PullFor, ReloadingFetcher, Resolved,
};
use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use kube::{Client, ResourceExt, runtime::watcher};
use tokio::sync::mpsc;
use tracing::{Instrument, info_span, warn};

use self::{
    crd::{ManagedOSVersion, ManagedOSVersionChannel},
    history::{ConfigMapHistory, HistoryStore},
    images::ParsedImages,
    kept::Kept,
    metrics::ChannelMetrics,
    publish::Publisher,
};
use crate::{
    cache::{Cache, ChannelKey},
    health::Health,
    reflect::{self, Kind, Stores, WatchMetrics, WatchedResource},
};

/// The reflector stores of channels and versions: the read side shared with request handlers.
#[derive(Clone)]
pub struct ChannelStores {
    /// ManagedOSVersionChannels.
    pub channels: Stores<ManagedOSVersionChannel>,
    /// ManagedOSVersions.
    pub versions: Stores<ManagedOSVersion>,
}

/// Settings of the refresh loop.
#[derive(Clone, Debug)]
pub struct RefreshSettings {
    /// Periodic digest check interval.
    pub interval: Duration,
    /// Architectures whose data is read.
    pub architectures: Vec<Arch>,
    /// The channel history in the cluster; `None`: off (retained versions
    /// then live only in this replica's memory).
    pub history: Option<Arc<ConfigMapHistory>>,
    /// Most bytes of parsed channel data kept for all channels together
    /// (`--max-kept-total`; see the `kept` module).
    pub max_kept_total: u64,
}

/// Where channel images are read from: the registry through a
/// [`ReloadingFetcher`]
/// (a fake in tests, so the worker's decisions are tested without one).
/// Resolving and pulling are two steps, so that a digest this process holds
/// already (unchanged, or parsed for another channel) is not pulled.
///
/// Every read is for the channels of one namespace: the registry sends a credential only
/// where it is granted to that namespace.
trait ImageSource: Send + Sync {
    /// The manifest digest `image` points at now (see [`Fetcher::resolve`](elemental_changelog_registry::Fetcher::resolve)).
    fn resolve<'a>(
        &'a self,
        image: &'a ImageRef,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Digest, FetchError>>;

    /// Pulls `image` at `digest` for `arch` (see [`Fetcher::pull`](elemental_changelog_registry::Fetcher::pull)).
    fn pull<'a>(
        &'a self,
        image: &'a ImageRef,
        digest: &'a Digest,
        arch: &'a Arch,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Fetched, FetchError>>;

    /// Which credential a read of `image` for `namespace` sends (see [`Fetcher::access`](elemental_changelog_registry::Fetcher::access)).
    fn access(&self, image: &ImageRef, namespace: &str) -> Access;
}

impl ImageSource for ReloadingFetcher {
    fn resolve<'a>(
        &'a self,
        image: &'a ImageRef,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Digest, FetchError>> {
        let fetcher = self.current();
        Box::pin(async move {
            Ok(fetcher
                .resolve(image, PullFor::Namespace(namespace))
                .await?
                .digest()
                .clone())
        })
    }

    fn pull<'a>(
        &'a self,
        image: &'a ImageRef,
        digest: &'a Digest,
        arch: &'a Arch,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Fetched, FetchError>> {
        let fetcher = self.current();
        let span = info_span!("fetch", %image, %arch);
        Box::pin(
            async move {
                let resolved = Resolved::new(image.clone(), digest.clone());
                fetcher
                    .pull(&resolved, arch.oci(), PullFor::Namespace(namespace))
                    .await
            }
            .instrument(span),
        )
    }

    fn access(&self, image: &ImageRef, namespace: &str) -> Access {
        self.current().access(image, PullFor::Namespace(namespace))
    }
}

/// What a reconcile reads: the registry, the image store, the kept-data bound, the
/// published state, the versions and the channel history. Writing is the
/// [`Publisher`]'s.
struct Context {
    fetcher: Arc<dyn ImageSource>,
    /// The images parsed by this process, shared by the channels that read them.
    images: ParsedImages,
    /// The bound on the parsed data kept for all channels.
    kept: Kept,
    cache: Arc<Cache>,
    metrics: Arc<ChannelMetrics>,
    versions: Stores<ManagedOSVersion>,
    settings: RefreshSettings,
    /// The channel history in the cluster; `None` when disabled (retained
    /// versions then live only in this replica's memory).
    history: Option<Arc<dyn HistoryStore>>,
}

impl Context {
    /// The names of `key`'s ManagedOSVersions in the store now.
    fn version_names(&self, key: &ChannelKey) -> BTreeSet<String> {
        self.versions
            .list(Some(&key.namespace))
            .iter()
            .filter(|v| v.channel_name() == Some(key.name.as_str()))
            .map(|v| v.name_any())
            .collect()
    }
}

enum ChannelEvent {
    Applied(Arc<ManagedOSVersionChannel>),
    Deleted(ChannelKey),
    /// A (re-)list of channels completed. A re-list reports no deletions:
    /// channels deleted while the watch was down are found missing from the store.
    ChannelsListed,
    VersionDeleted(ChannelKey),
    /// A ManagedOSVersion of the channel was created or changed (its name).
    VersionApplied(ChannelKey, String),
    /// A (re-)list of versions completed (see `ChannelsListed`).
    VersionsListed,
}

/// Builds the reflectors and returns the read side, plus the future that runs
/// everything (watches, channel workers); the future returns only on a fatal
/// error, and the caller treats its end as fatal. The watches are counted in `watches`.
#[allow(clippy::too_many_arguments)] // main's parts, none derivable from another
pub fn start(
    client: Client,
    namespaces: &[String],
    fetcher: Arc<ReloadingFetcher>,
    cache: Arc<Cache>,
    metrics: Arc<ChannelMetrics>,
    watches: &Arc<WatchMetrics>,
    health: &Health,
    settings: RefreshSettings,
) -> (ChannelStores, BoxFuture<'static, ()>) {
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let mut drivers: Vec<BoxFuture<'static, ()>> = Vec::new();
    let stores = watch_stores(&client, namespaces, watches, &mut drivers, events_tx);
    let synced = health.ready_flag("informer-sync");
    let fetched = health.ready_flag("channels-first-fetch");
    let heartbeat = health.heartbeat("channel-controller");
    let history = settings.history.clone();
    if let Some(history) = &history {
        drivers.push(Box::pin(
            history
                .clone()
                .run(health.ready_flag("channel-history"))
                .instrument(info_span!("history")),
        ));
    }
    let history = history.map(|h| h as Arc<dyn HistoryStore>);
    let publisher = Arc::new(Publisher::new(
        cache.clone(),
        metrics.clone(),
        history.clone(),
    ));
    let ctx = Arc::new(Context {
        fetcher,
        images: ParsedImages::default(),
        kept: Kept::new(settings.max_kept_total),
        cache,
        metrics,
        versions: stores.versions.clone(),
        settings,
        history,
    });

    let controller = controller::controller(
        stores.clone(),
        ctx,
        publisher,
        events_rx,
        synced,
        fetched,
        heartbeat,
    );
    drivers.push(Box::pin(controller));
    let run = async move {
        let mut all: FuturesUnordered<_> = drivers.into_iter().collect();
        // Every driver loops forever; the first one to end is a bug or a
        // shutdown, and either way the process must not go on half-blind.
        if all.next().await.is_some() {
            warn!("a watch or the channel controller stopped");
        }
    };
    (stores, Box::pin(run))
}

/// Watches channels and versions in `namespaces` into stores, pushing the watches'
/// drivers onto `drivers` and sending what the controller hears of each event to `events`.
fn watch_stores(
    client: &Client,
    namespaces: &[String],
    watches: &Arc<WatchMetrics>,
    drivers: &mut Vec<BoxFuture<'static, ()>>,
    events: mpsc::UnboundedSender<ChannelEvent>,
) -> ChannelStores {
    let channels = reflect::watch(
        client,
        namespaces,
        Kind::required(WatchedResource::Channels).trimmed(crd::trim_meta),
        watches,
        drivers,
        hear(events.clone(), channel_event),
    );
    let versions = reflect::watch(
        client,
        namespaces,
        Kind::required(WatchedResource::Versions).trimmed(crd::trim_meta),
        watches,
        drivers,
        hear(events, version_event),
    );
    ChannelStores { channels, versions }
}

/// A watch's `on_event` that sends the controller what `heard` makes of each event.
fn hear<K: 'static>(
    events: mpsc::UnboundedSender<ChannelEvent>,
    heard: fn(&watcher::Event<K>) -> Option<ChannelEvent>,
) -> impl Fn(&watcher::Event<K>) + Clone + Send + Sync + 'static {
    move |event| {
        if let Some(event) = heard(event) {
            let _ = events.send(event);
        }
    }
}

/// What the controller hears of a channel watch event.
fn channel_event(event: &watcher::Event<ManagedOSVersionChannel>) -> Option<ChannelEvent> {
    match event {
        watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
            Some(ChannelEvent::Applied(Arc::new(c.clone())))
        }
        watcher::Event::Delete(c) => Some(ChannelEvent::Deleted(ChannelKey::new(
            c.namespace().unwrap_or_default(),
            c.name_any(),
        ))),
        watcher::Event::InitDone => Some(ChannelEvent::ChannelsListed),
        watcher::Event::Init => None,
    }
}

/// What the controller hears of a version watch event.
fn version_event(event: &watcher::Event<ManagedOSVersion>) -> Option<ChannelEvent> {
    match event {
        watcher::Event::Delete(v) => v.channel_name().map(|channel| {
            ChannelEvent::VersionDeleted(ChannelKey::new(
                v.namespace().unwrap_or_default(),
                channel,
            ))
        }),
        watcher::Event::InitDone => Some(ChannelEvent::VersionsListed),
        watcher::Event::Apply(v) | watcher::Event::InitApply(v) => {
            v.channel_name().map(|channel| {
                ChannelEvent::VersionApplied(
                    ChannelKey::new(v.namespace().unwrap_or_default(), channel),
                    v.name_any(),
                )
            })
        }
        watcher::Event::Init => None,
    }
}

#[cfg(test)]
mod tests;
