//! Channels and versions: the elemental-operator's objects kept in memory by
//! reflectors, and the refresh of each channel's image data.
//!
//! One worker task per channel fetches its image: when the channel is first
//! seen, when the operator changes or re-syncs it (see
//! [`crd::ManagedOSVersionChannel::sync_key`]), and every refresh interval
//! (a digest check that pulls nothing when the image is unchanged), with
//! backoff after failures. Results land in the [`Cache`].
//!
//! Versions a newer image dropped stay served while their ManagedOSVersion
//! exists ("retained"): each worker records the images it reads in the
//! [`history`] kept in the cluster, and serves every existing version the
//! history maps to an older image, pulling that image by digest when this
//! replica has not read it itself (after a restart, or as a new replica).
//! Workers are supervised: one that panics is restarted with backoff.
//!
//! Each worker runs a reconcile function (`reconcile`: one refresh of the
//! channel, then an `Action` decided by `error_policy`: requeue after the
//! interval or the backoff, and on kept-data changes when refused), as
//! kube-runtime's `Controller` would, but with its own small runtime
//! (`controller`, `supervise`, `worker`). kube-runtime's `Controller`
//! does not fit this server: it reconciles objects of one reflector store,
//! while a server watching several namespaces keeps one store per namespace
//! (one store fed by several watches is wiped by each watch's re-list); it
//! learns of deletions only through finalizers, which a read-only server must
//! not add, and a deleted channel's fetch must be stopped (aborted) so that
//! nothing resurrects its data; a panic in a reconcile would end its whole
//! stream, not one channel's worker; and readiness waits for the first fetch
//! of every channel present at start, which its scheduler does not report.

pub mod crd;
pub mod history;
mod images;
mod kept;
mod retained;

pub use self::images::{CHANNEL_FILES, parse_limits};

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use backon::{BackoffBuilder as _, ExponentialBuilder};
use elemental_changelog_apiservice::Arch;
use elemental_changelog_registry::{
    Access, Digest, FetchError, Fetched, ImageRef, InvalidImageRef, PullFor, ReloadingFetcher,
    Resolved,
};
use futures::{FutureExt as _, StreamExt, future::BoxFuture, stream::FuturesUnordered};
use jiff::Timestamp;
use kube::{Client, ResourceExt, runtime::watcher};
use tokio::sync::{mpsc, watch};
use tracing::{Instrument, debug, error, info, info_span, warn};

use self::{
    crd::{ManagedOSVersion, ManagedOSVersionChannel, SyncKey},
    history::{Change, ChannelHistory, ConfigMapHistory, History, HistoryStore},
    images::{ParsedImages, Read, ReadError},
    kept::{Claim, ImageId, Kept, Refusals},
};
use crate::{
    cache::{ArchState, Cache, ChannelKey, ChannelState, FetchFailure, RetainedStatuses, Snapshot},
    health::{Health, Heartbeat, ReadyFlag},
    metrics::{FetchResult, FileProblem, Metrics, WatchedResource},
    read_error::ReadErrorKind,
    reflect::{self, Kind, Stores},
    telemetry::error_chain,
};

/// Shortest wait before retrying a failed fetch; doubles per failure up to
/// the refresh interval.
const MIN_BACKOFF: Duration = Duration::from_secs(2);
/// Longest wait before restarting a worker that panicked (the wait doubles
/// from [`MIN_BACKOFF`] per panic in a row).
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(300);
/// Attempts to swap a worker's result into the cache while others (pruning)
/// change the channel's state meanwhile; the next refresh tries again.
const SWAP_ATTEMPTS: u32 = 4;

/// The read side shared with request handlers.
#[derive(Clone)]
pub struct Objects {
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

/// Everything a channel worker needs.
struct Context {
    fetcher: Arc<dyn ImageSource>,
    /// The images parsed by this process, shared by the channels that read them.
    images: ParsedImages,
    /// The bound on the parsed data kept for all channels.
    kept: Kept,
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    versions: Stores<ManagedOSVersion>,
    settings: RefreshSettings,
    attempted: mpsc::UnboundedSender<ChannelKey>,
    /// The channel history in the cluster; `None` when disabled (retained
    /// versions then live only in this replica's memory).
    history: Option<Arc<dyn HistoryStore>>,
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
/// error, and the caller treats its end as fatal.
pub fn start(
    client: Client,
    namespaces: &[String],
    fetcher: Arc<ReloadingFetcher>,
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    health: &Health,
    settings: RefreshSettings,
) -> (Objects, BoxFuture<'static, ()>) {
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let mut drivers: Vec<BoxFuture<'static, ()>> = Vec::new();

    let channels = reflect::watch(
        &client,
        namespaces,
        Kind::required(WatchedResource::Channels),
        &metrics,
        &mut drivers,
        {
            let tx = events_tx.clone();
            move |event| {
                if let Some(event) = channel_event(event) {
                    let _ = tx.send(event);
                }
            }
        },
    );
    let versions = reflect::watch(
        &client,
        namespaces,
        Kind::required(WatchedResource::Versions),
        &metrics,
        &mut drivers,
        {
            let tx = events_tx.clone();
            move |event| {
                if let Some(event) = version_event(event) {
                    let _ = tx.send(event);
                }
            }
        },
    );
    drop(events_tx);

    let objects = Objects {
        channels: channels.clone(),
        versions: versions.clone(),
    };
    let synced = health.ready_flag("informer-sync");
    let fetched = health.ready_flag("channels-first-fetch");
    let heartbeat = health.heartbeat("channel-controller");
    let (attempted_tx, attempted_rx) = mpsc::unbounded_channel();
    let history = settings.history.clone();
    if let Some(history) = &history {
        drivers.push(Box::pin(
            history
                .clone()
                .run(health.ready_flag("channel-history"))
                .instrument(info_span!("history")),
        ));
    }
    let ctx = Arc::new(Context {
        fetcher,
        images: ParsedImages::default(),
        kept: Kept::new(settings.max_kept_total),
        cache,
        metrics,
        versions: versions.clone(),
        settings,
        attempted: attempted_tx,
        history: history.map(|h| h as Arc<dyn HistoryStore>),
    });

    let controller = controller(
        objects.clone(),
        ctx,
        events_rx,
        attempted_rx,
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
    (objects, Box::pin(run))
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

/// Starts the watches of one kind (one per namespace, or one for all),
/// feeding stores, counting errors, and passing events to `on_event`.
struct Worker {
    trigger: watch::Sender<(Option<String>, SyncKey)>,
    task: tokio::task::JoinHandle<()>,
}

/// The channel controller: one worker per channel, started, triggered and
/// stopped by watch events, and readiness once every channel present at
/// start had its first fetch attempted.
async fn controller(
    objects: Objects,
    ctx: Arc<Context>,
    mut events: mpsc::UnboundedReceiver<ChannelEvent>,
    mut attempted: mpsc::UnboundedReceiver<ChannelKey>,
    synced: ReadyFlag,
    fetched: ReadyFlag,
    heartbeat: Heartbeat,
) {
    let mut stores_ready = std::pin::pin!({
        let channels = objects.channels.clone();
        let versions = objects.versions.clone();
        async move {
            channels.wait_until_ready().await;
            versions.wait_until_ready().await;
        }
    });
    ctx.metrics.kept_data_limit(ctx.settings.max_kept_total);
    let mut controller = Controller {
        objects,
        ctx,
        workers: HashMap::new(),
        pending_first: None,
        attempted_before_sync: HashSet::new(),
        fetched,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            () = &mut stores_ready, if !controller.synced() => {
                synced.set();
                controller.on_synced();
            }
            Some(key) = attempted.recv() => controller.on_attempted(&key),
            event = events.recv() => {
                let Some(event) = event else { return };
                controller.on_event(event);
            }
            _ = tick.tick() => {
                heartbeat.beat();
                controller.report_ages();
            }
        }
    }
}

/// The state of [`controller`].
struct Controller {
    objects: Objects,
    ctx: Arc<Context>,
    workers: HashMap<ChannelKey, Worker>,
    /// Channels present at start whose first fetch is still to be attempted;
    /// `None` until the reflectors have synced.
    pending_first: Option<HashSet<ChannelKey>>,
    /// Channels whose first fetch was attempted before the reflectors synced. A worker says
    /// so before it stores its data (it does not wait for retained versions), so the cache
    /// alone cannot tell at sync time.
    attempted_before_sync: HashSet<ChannelKey>,
    fetched: ReadyFlag,
}

impl Controller {
    /// Whether the reflectors have synced.
    fn synced(&self) -> bool {
        self.pending_first.is_some()
    }

    /// The reflectors synced: wait for the first fetch of every channel.
    fn on_synced(&mut self) {
        let pending: HashSet<ChannelKey> = self
            .objects
            .channels
            .list(None)
            .iter()
            .map(|c| ChannelKey::new(c.namespace().unwrap_or_default(), c.name_any()))
            .filter(|k| !self.ctx.cache.get(k).is_some_and(|s| s.attempted))
            .filter(|k| !self.attempted_before_sync.contains(k))
            .collect();
        self.attempted_before_sync.clear();
        info!(
            channels = pending.len(),
            "reflectors synced; waiting for first fetches"
        );
        if pending.is_empty() {
            self.fetched.set();
        }
        self.pending_first = Some(pending);
        prune_history(&self.objects, &self.ctx);
    }

    /// A channel's first fetch was attempted (or the channel is gone).
    fn on_attempted(&mut self, key: &ChannelKey) {
        let Some(pending) = &mut self.pending_first else {
            self.attempted_before_sync.insert(key.clone());
            return;
        };
        if pending.remove(key) && pending.is_empty() {
            info!("every channel had its first fetch attempted");
            self.fetched.set();
        }
    }

    fn on_event(&mut self, event: ChannelEvent) {
        match event {
            ChannelEvent::Applied(channel) => {
                self.apply(&channel);
                return;
            }
            ChannelEvent::Deleted(key) => self.drop_channel(&key),
            ChannelEvent::ChannelsListed => {
                let gone: Vec<ChannelKey> = self
                    .workers
                    .keys()
                    .filter(|k| self.objects.channels.get(&k.namespace, &k.name).is_none())
                    .cloned()
                    .collect();
                for key in gone {
                    self.drop_channel(&key);
                }
            }
            ChannelEvent::VersionDeleted(key) => prune_retained(&self.objects, &self.ctx, key),
            ChannelEvent::VersionApplied(key, name) => {
                // A version the last read did not know of (the operator's new
                // version seen after the channel's re-sync started that read):
                // read again, so that it does not wait for the next interval.
                if let Some(worker) = self.workers.get(&key)
                    && self
                        .ctx
                        .cache
                        .refreshed(&key)
                        .is_some_and(|r| !r.versions.contains(&name))
                {
                    worker.trigger.send_modify(|_| {});
                }
                return;
            }
            ChannelEvent::VersionsListed => {
                for (key, _) in self.ctx.cache.all() {
                    prune_retained(&self.objects, &self.ctx, key);
                }
            }
        }
        if self.synced() {
            prune_history(&self.objects, &self.ctx);
        }
    }

    /// Starts the worker of a new channel, or triggers the worker of a
    /// channel whose image or sync key changed.
    fn apply(&mut self, channel: &ManagedOSVersionChannel) {
        let key = ChannelKey::new(channel.namespace().unwrap_or_default(), channel.name_any());
        let want = (channel.image().map(str::to_owned), channel.sync_key());
        if let Some(worker) = self.workers.get(&key) {
            worker.trigger.send_if_modified(|current| {
                let changed = *current != want;
                if changed {
                    *current = want.clone();
                }
                changed
            });
            return;
        }
        let (trigger, rx) = watch::channel(want);
        let span = info_span!("refresh", namespace = %key.namespace, channel = %key.name);
        let task = tokio::spawn(supervise(key.clone(), rx, self.ctx.clone()).instrument(span));
        self.workers.insert(key, Worker { trigger, task });
    }

    /// Stops a deleted channel's worker and drops its data.
    fn drop_channel(&mut self, key: &ChannelKey) {
        // Stop the worker first (even mid-fetch), so nothing it does later can
        // resurrect the data of a deleted channel.
        if let Some(worker) = self.workers.remove(key) {
            worker.task.abort();
        }
        self.ctx.cache.remove(key);
        self.ctx.kept.forget(key);
        self.ctx.metrics.forget_channel(&key.namespace, &key.name);
        update_totals(&self.ctx);
        info!(channel = %key, "channel deleted; its data was dropped");
        if let Some(pending) = &mut self.pending_first
            && pending.remove(key)
            && pending.is_empty()
        {
            self.fetched.set();
        }
    }

    /// Sets each channel's data age metric.
    fn report_ages(&self) {
        for (key, state) in self.ctx.cache.all() {
            if let Some(confirmed) = state.archs.values().filter_map(|a| a.confirmed_at).max() {
                let age = Timestamp::now().duration_since(confirmed).as_secs_f64();
                self.ctx.metrics.channel_age(&key.namespace, &key.name, age);
            }
        }
    }
}

/// Drops a channel's retained versions whose ManagedOSVersion is gone, off
/// the controller's loop (see [`Cache::prune_retained`]).
fn prune_retained(objects: &Objects, ctx: &Arc<Context>, key: ChannelKey) {
    let versions = objects.versions.clone();
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let namespace = key.namespace.clone();
        let keep = Arc::new(move |name: &str| versions.get(&namespace, name).is_some());
        if ctx.cache.prune_retained(&key, keep).await {
            update_totals(&ctx);
        }
    });
}

/// Makes the channel history forget what no ManagedOSVersion needs any more
/// (see [`History::prune`]), for the namespaces this replica watches. Only
/// called once the reflectors have synced: an unsynced store would make
/// every channel look deleted.
fn prune_history(objects: &Objects, ctx: &Context) {
    let Some(history) = ctx.history.clone() else {
        return;
    };
    let objects = objects.clone();
    let change: Change = Box::new(move |h: &mut History| {
        h.prune(
            |key| {
                objects.channels.watches(&key.namespace) && objects.versions.watches(&key.namespace)
            },
            |key, version| match version {
                None => objects.channels.get(&key.namespace, &key.name).is_some(),
                Some(name) => objects
                    .versions
                    .get(&key.namespace, name)
                    .is_some_and(|v| v.channel_name() == Some(key.name.as_str())),
            },
        )
    });
    tokio::spawn(async move {
        if let Err(error) = history.update(change).await {
            warn!(error = %error_chain(&error), "pruning the channel history failed; trying again at the next change");
        }
    });
}

/// Runs a channel's worker, restarting it with backoff when it panics, until
/// the controller aborts it (channel deleted).
async fn supervise(
    key: ChannelKey,
    trigger: watch::Receiver<(Option<String>, SyncKey)>,
    ctx: Arc<Context>,
) {
    let mut panics: u32 = 0;
    loop {
        let started = tokio::time::Instant::now();
        let run = std::panic::AssertUnwindSafe(worker(key.clone(), trigger.clone(), ctx.clone()))
            .catch_unwind()
            .await;
        let Err(panic) = run else {
            return;
        };
        // A worker that ran well for long before panicking starts the backoff over.
        if started.elapsed() > MAX_RESTART_BACKOFF {
            panics = 0;
        }
        panics = panics.saturating_add(1);
        ctx.metrics.worker_panic();
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        let wait = next_wait(panics, MAX_RESTART_BACKOFF);
        error!(channel = %key, panic = %message, restart_in = ?wait, "channel worker panicked; restarting it");
        tokio::time::sleep(wait).await;
    }
}

/// What a channel's worker keeps from one reconcile to the next.
#[derive(Default)]
struct ChannelMemory {
    /// Older images pulled for retained versions that had no data for them.
    retained: retained::Memory,
    /// Images refused for the kept-data limit.
    refusals: Refusals,
    /// Failed reconciles in a row (the backoff's step).
    failures: u32,
}

/// When a channel is reconciled next, besides a change of the channel or of its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Action {
    /// At the latest after this long: the refresh interval, or the backoff after a failure.
    requeue_after: Duration,
    /// Also as soon as kept channel data is stored or dropped (the image was refused for the
    /// kept-data limit and may fit then).
    on_kept_data_change: bool,
}

/// The reconcile function of a channel: brings the cache's data of `key` to what the channel
/// wants now (`image`; `sync`, the operator's sync key the data is read for) with one
/// [`refresh`], records what the refresh was made for, and says when to reconcile again.
async fn reconcile(
    key: &ChannelKey,
    image: Option<&str>,
    sync: SyncKey,
    ctx: &Context,
    memory: &mut ChannelMemory,
) -> Action {
    debug!(image = image.unwrap_or(""), "refreshing");
    let versions = Arc::new(
        ctx.versions
            .list(Some(&key.namespace))
            .iter()
            .filter(|v| v.channel_name() == Some(key.name.as_str()))
            .map(|v| v.name_any())
            .collect(),
    );
    let ok = refresh(key, image, ctx, &mut memory.retained, &mut memory.refusals).await;
    // Versions the data lacks are "not read yet" until this point.
    ctx.cache
        .set_refreshed(key, crate::cache::Refreshed { sync, versions });
    error_policy(ok, ctx.cache.get(key).as_deref(), ctx, memory)
}

/// When to reconcile again after a refresh that succeeded (`ok`) or not, the channel's state
/// being `state` now: the refresh interval after a success, else the backoff
/// ([`next_wait`]); and, refused for the kept-data limit, as soon as kept data changes.
fn error_policy(
    ok: bool,
    state: Option<&ChannelState>,
    ctx: &Context,
    memory: &mut ChannelMemory,
) -> Action {
    memory.failures = if ok {
        0
    } else {
        memory.failures.saturating_add(1)
    };
    Action {
        requeue_after: next_wait(memory.failures, ctx.settings.interval),
        on_kept_data_change: state.is_some_and(kept::refused),
    }
}

/// Runs the reconciles of one channel until the controller aborts it (channel deleted): at
/// start, when the channel changes or is re-synced by the operator, when the channel
/// history of this channel changes, and when its [`Action`] says.
async fn worker(
    key: ChannelKey,
    mut trigger: watch::Receiver<(Option<String>, SyncKey)>,
    ctx: Arc<Context>,
) {
    debug!("worker started");
    let mut history = ctx.history.as_ref().map(|h| h.subscribe());
    if let Some(history) = &mut history {
        // Read the history before the first refresh, so that a young replica
        // serves retained versions from the start.
        let _ = history.wait_for(|(_, loaded)| *loaded).await;
    }
    let mut memory = ChannelMemory::default();
    let mut kept_changes = ctx.kept.changes();
    loop {
        let (image, sync) = trigger.borrow_and_update().clone();
        let seen = history
            .as_mut()
            .and_then(|h| h.borrow_and_update().0.channel(&key).cloned());
        // The versions known now: the registry is read after they existed.
        ctx.versions.wait_until_ready().await;
        // Kept data stored or dropped from now on wakes a refused refresh.
        kept_changes.mark_unchanged();
        let action = reconcile(&key, image.as_deref(), sync, &ctx, &mut memory).await;
        tokio::select! {
            changed = trigger.changed() => {
                if changed.is_err() {
                    // The controller is gone; it cleans up.
                    return;
                }
                debug!("channel changed or re-synced by the operator");
            }
            () = history_changed(history.as_mut(), &key, seen) => {
                debug!("channel history changed");
            }
            Ok(()) = kept_changes.changed(), if action.on_kept_data_change => {
                debug!("kept channel data changed; trying the refused image again");
            }
            () = tokio::time::sleep(action.requeue_after) => {}
        }
    }
}

/// Completes when the history of `key` maps a version to another image
/// than `seen` did: an image or a version recorded, or an image made the
/// newest again. What pruning forgets is dropped from the cache by the
/// controller, not by a refresh. Never completes without a history.
async fn history_changed(
    history: Option<&mut watch::Receiver<(Arc<History>, bool)>>,
    key: &ChannelKey,
    mut seen: Option<ChannelHistory>,
) {
    let Some(history) = history else {
        return std::future::pending().await;
    };
    loop {
        if history.changed().await.is_err() {
            return std::future::pending().await;
        }
        let now = history.borrow_and_update().0.channel(key).cloned();
        if grew(now.as_ref(), seen.as_ref()) {
            return;
        }
        seen = now;
    }
}

/// Whether `now` records more than `seen` minus what was pruned.
fn grew(now: Option<&ChannelHistory>, seen: Option<&ChannelHistory>) -> bool {
    let Some(now) = now else {
        return false;
    };
    let kept: Vec<&history::ImageRecord> = seen
        .map(|s| s.images.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|r| now.images.iter().any(|n| n.digest == r.digest))
        .collect();
    now.images.len() != kept.len()
        || now
            .images
            .iter()
            .zip(kept)
            .any(|(n, o)| n.digest != o.digest || !n.versions.is_subset(&o.versions))
}

/// How long a worker waits before its next fetch after `failures`
/// consecutive failed ones (0: the last succeeded): the refresh interval, or
/// a backoff doubling from [`MIN_BACKOFF`] and capped by the interval. Also the
/// wait before restarting a worker after `failures` panics in a row (capped by
/// [`MAX_RESTART_BACKOFF`]). The delays are backon's exponential backoff, the
/// server's one backoff implementation (auth reviews and kube-runtime's watchers
/// use it too).
fn next_wait(failures: u32, cap: Duration) -> Duration {
    if failures == 0 {
        return cap;
    }
    // 2 s doubled 16 times (36 h) is past any cap worth having: no more steps than that.
    let steps = failures.min(17) as usize;
    ExponentialBuilder::new()
        .with_min_delay(MIN_BACKOFF)
        .with_factor(2.0)
        .with_max_delay(cap)
        .without_max_times()
        .build()
        .take(steps)
        .last()
        .unwrap_or(cap)
        // backon's first delay is the minimum even past the cap.
        .min(cap)
}

/// Fetches every architecture of a channel's image once, then serves the
/// retained versions the channel history maps to older images, and records
/// what was read in the history; true when all succeeded (or there is
/// nothing to fetch).
async fn refresh(
    key: &ChannelKey,
    image: Option<&str>,
    ctx: &Context,
    memory: &mut retained::Memory,
    refusals: &mut Refusals,
) -> bool {
    let Some(text) = image else {
        ctx.cache.update(key, |_| ChannelState {
            image: None,
            attempted: true,
            archs: BTreeMap::new(),
        });
        ctx.cache
            .set_retained_statuses(key, RetainedStatuses::new());
        let _ = ctx.attempted.send(key.clone());
        return true;
    };
    // A reference that does not parse fails every architecture, as its resolve would.
    let image = text.parse::<ImageRef>();
    let previous = ctx.cache.get(key);
    let mut all_ok = true;
    let mut archs = BTreeMap::new();
    // The images admitted under the kept-data limit, counted until stored.
    let mut claims: Vec<Claim<'_>> = Vec::new();
    // A single-platform image serves every architecture: fetched once.
    let mut single_platform: Option<ArchState> = None;
    for arch in &ctx.settings.architectures {
        if let Some(state) = &single_platform {
            archs.insert(arch.clone(), state.clone());
            continue;
        }
        let old = previous
            .as_ref()
            .and_then(|p| p.archs.get(arch))
            .cloned()
            .unwrap_or_default();
        let (state, claim) = match &image {
            Ok(image) => refresh_arch(key, image, arch, old, ctx, refusals).await,
            Err(invalid) => (unparsable(invalid, arch, old, ctx), None),
        };
        claims.extend(claim);
        // An index without this architecture is not a failure to retry soon.
        all_ok &= state
            .last_error
            .as_ref()
            .is_none_or(|e| e.kind == ReadErrorKind::NO_MATCHING_PLATFORM);
        if state.last_error.is_none()
            && state.snapshot.as_ref().is_some_and(|s| {
                image.as_ref().is_ok_and(|i| s.image == *i) && s.platform.is_none()
            })
        {
            single_platform = Some(state.clone());
        }
        archs.insert(arch.clone(), state);
    }
    // The first fetch was attempted: readiness does not wait for the
    // rebuild of retained versions, which answer "not fetched yet" meanwhile.
    let _ = ctx.attempted.send(key.clone());
    ctx.versions.wait_until_ready().await;
    let repository = image.as_ref().ok().map(ImageRef::repository);
    all_ok &= retained::retain_and_store(
        key,
        text,
        repository.as_ref(),
        previous,
        &archs,
        ctx,
        memory,
    )
    .await;
    // Stored: the cache counts them now.
    drop(claims);
    if let Ok(image) = &image {
        retained::record_history(key, image, &archs, ctx).await;
    }
    update_totals(ctx);
    all_ok
}

/// Reads the channel's image for one architecture: the new data of the
/// image alone (the caller adds retained versions), or `old` kept; with the
/// claim that counts new data under the kept-data limit until it is stored.
async fn refresh_arch<'a>(
    key: &ChannelKey,
    image: &ImageRef,
    arch: &Arch,
    old: ArchState,
    ctx: &'a Context,
    refusals: &mut Refusals,
) -> (ArchState, Option<Claim<'a>>) {
    let attempt = Attempt {
        image,
        arch,
        started: Instant::now(),
        ctx,
    };
    debug!(image = image.as_str(), %arch, "resolving");
    let digest = match ctx.fetcher.resolve(image, &key.namespace).await {
        Ok(digest) => digest,
        Err(error) => return (attempt.failed(None, &ReadError::Fetch(error), old), None),
    };
    if let Some(state) = attempt.unchanged(&digest, &old) {
        return (state, None);
    }
    // Refused for its size before: pulled again only once it would fit, by one
    // refused channel at a time.
    let mut turn = None;
    if let Some((id, bytes)) = refusals
        .get(image, &digest, arch)
        .map(|(i, b)| (i.clone(), b))
    {
        turn = Some(ctx.kept.retry_turn().await);
        if let Some(refused) = ctx.kept.refuses(&ctx.cache, key, &id, bytes) {
            let error = ReadError::OverKeptTotal {
                refused,
                compressed_bytes: 0,
            };
            return (attempt.failed(Some(digest), &error, old), None);
        }
    }
    debug!(image = image.as_str(), %arch, %digest, "reading");
    let read = match images::read(image, &digest, arch, &key.namespace, ctx).await {
        Ok(read) => read,
        Err(error) => return (attempt.failed(Some(digest), &error, old), None),
    };
    let parsed = read.parsed();
    let id = ImageId::new(image, &digest, parsed.platform.as_deref());
    let bytes = parsed.data.parsed_bytes();
    match ctx.kept.admit(&ctx.cache, key, id.clone(), bytes, turn) {
        Ok(claim) => {
            refusals.forget(arch);
            (attempt.read(digest, read), Some(claim))
        }
        Err(refused) => {
            ctx.metrics.kept_data_refusal();
            refusals.insert(image, &digest, arch, id, bytes);
            let error = ReadError::OverKeptTotal {
                refused,
                compressed_bytes: read.compressed_bytes(),
            };
            (attempt.failed(Some(digest), &error, old), None)
        }
    }
}

/// The state of an architecture when the channel's image is no valid
/// reference: a failed fetch, counted and logged as the registry's resolve of
/// it would fail; the last good data kept.
fn unparsable(invalid: &InvalidImageRef, arch: &Arch, old: ArchState, ctx: &Context) -> ArchState {
    let started = Instant::now();
    let error = ReadError::Fetch(invalid.clone().into());
    let (image, kind, message) = (&invalid.image, error.kind(), error.message());
    ctx.metrics.fetch(
        FetchResult::Failed(kind),
        started.elapsed().as_secs_f64(),
        0,
    );
    warn!(%image, %arch, error = %message, %kind, "fetching the channel image failed; keeping the last good data");
    ArchState {
        last_error: Some(FetchFailure {
            kind,
            message,
            at: Timestamp::now(),
        }),
        ..old
    }
}

/// One architecture's fetch of a channel image, whose outcome becomes the
/// architecture's next state, counted and logged.
struct Attempt<'a> {
    image: &'a ImageRef,
    arch: &'a Arch,
    started: Instant,
    ctx: &'a Context,
}

impl Attempt<'_> {
    fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The state when the image still has `digest`, the digest of the data
    /// served (confirmed) or of the unusable image (still failing, not
    /// pulled again: the same bytes would fail the same way); `None` when
    /// it is another digest.
    fn unchanged(&self, digest: &Digest, old: &ArchState) -> Option<ArchState> {
        let (image, arch, metrics) = (self.image, self.arch, &self.ctx.metrics);
        if old
            .rejected
            .as_ref()
            .is_some_and(|(i, d)| i == image && digest == d)
        {
            let kind = old
                .last_error
                .as_ref()
                .map_or(ReadErrorKind::InvalidChannelJson, |e| e.kind);
            metrics.fetch(FetchResult::Failed(kind), self.seconds(), 0);
            debug!(%image, %arch, %digest, %kind, "image still the unusable one; not pulled again");
            return Some(old.clone());
        }
        let served = old.snapshot.as_ref()?;
        if served.image != *image || *digest != served.digest {
            return None;
        }
        metrics.fetch(FetchResult::Unchanged, self.seconds(), 0);
        debug!(%image, %arch, %digest, "image unchanged");
        Some(ArchState {
            snapshot: old.snapshot.clone(),
            confirmed_at: Some(Timestamp::now()),
            last_error: None,
            rejected: None,
        })
    }

    /// The state once the image at `digest` was read.
    fn read(&self, digest: Digest, read: Read) -> ArchState {
        let (image, arch, metrics) = (self.image, self.arch, &self.ctx.metrics);
        let parsed = match read {
            Read::Shared(parsed) => {
                metrics.fetch(FetchResult::Shared, self.seconds(), 0);
                info!(%image, %arch, %digest, versions = parsed.data.versions().len(), "channel image already read for another channel; sharing its data");
                parsed
            }
            Read::Pulled {
                parsed,
                compressed_bytes,
            } => {
                for problem in parsed.data.problems() {
                    metrics.file_problem(FileProblem::from(&problem.error));
                    warn!(%image, %arch, %digest, file = %problem.path, error = %problem, "rejected a file of the channel image");
                }
                let seconds = self.seconds();
                metrics.fetch(FetchResult::Pulled, seconds, compressed_bytes);
                info!(%image, %arch, %digest, versions = parsed.data.versions().len(), bytes = compressed_bytes, seconds, "channel image pulled");
                parsed
            }
        };
        let now = Timestamp::now();
        let snapshot = Snapshot::read(image.clone(), digest, parsed.platform, parsed.data, now);
        ArchState {
            snapshot: Some(Arc::new(snapshot)),
            confirmed_at: Some(now),
            last_error: None,
            rejected: None,
        }
    }

    /// The state after a failure: the last good data kept, the error
    /// recorded, and an unusable image (at `digest`) remembered as such.
    fn failed(&self, digest: Option<Digest>, error: &ReadError, old: ArchState) -> ArchState {
        let (image, arch) = (self.image, self.arch);
        let (kind, message) = (error.kind(), error.message());
        self.ctx.metrics.fetch(
            FetchResult::Failed(kind),
            self.seconds(),
            error.compressed_bytes(),
        );
        let rejected = match error {
            ReadError::Fetch(_) => {
                warn!(%image, %arch, error = %message, %kind, "fetching the channel image failed; keeping the last good data");
                old.rejected
            }
            ReadError::Unusable { .. } => {
                warn!(%image, %arch, digest = digest.as_ref().map(Digest::as_str), error = %message, %kind, "channel image is unusable; keeping the last good data");
                digest.map(|d| (image.clone(), d))
            }
            ReadError::Internal { .. } => {
                warn!(%image, %arch, digest = digest.as_ref().map(Digest::as_str), error = %message, %kind, "reading the channel image failed; keeping the last good data");
                old.rejected
            }
            ReadError::OverKeptTotal { .. } => {
                warn!(%image, %arch, digest = digest.as_ref().map(Digest::as_str), error = %message, %kind, "channel image refused: its data does not fit under --max-kept-total; keeping the last good data");
                old.rejected
            }
        };
        ArchState {
            last_error: Some(FetchFailure {
                kind,
                message,
                at: Timestamp::now(),
            }),
            rejected,
            ..old
        }
    }
}

fn update_totals(ctx: &Context) {
    let t = ctx.cache.totals();
    ctx.metrics
        .cache_size(t.channels, t.versions, t.advisories, t.retained);
    let refused = ctx
        .cache
        .all()
        .iter()
        .filter(|(_, state)| kept::refused(state))
        .count();
    ctx.metrics.kept_data(kept::kept_bytes(&ctx.cache), refused);
}

#[cfg(test)]
mod tests;
