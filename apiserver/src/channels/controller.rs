//! The controller's runtime: one worker per channel, started, woken and stopped by watch
//! events; each worker runs [`reconcile`] when its channel wants a refresh, hands the
//! result to the [`Publisher`] (the only writer of the cache and the channel history),
//! and asks [`error_policy`] when to run again (the refresh interval, or backoff after a
//! failure, by cause). Workers are supervised: one that panics is restarted with backoff.
//! Readiness: once the reflectors synced and every channel present then had its first
//! read attempted.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use backon::{BackoffBuilder as _, ExponentialBuilder};
use futures::FutureExt as _;
use jiff::Timestamp;
use kube::ResourceExt;
use tokio::sync::{Notify, mpsc, watch};
use tracing::{Instrument, debug, error, info, info_span};

use super::{
    ChannelEvent, ChannelStores, Context,
    crd::ManagedOSVersionChannel,
    history::{self, ChannelHistory, History},
    progress::Progress,
    publish::{Lease, Publisher},
    reconcile::{Cause, ChannelMemory, Want, reconcile},
};
use crate::{
    cache::{ChannelKey, RetainedStatuses, without_retained},
    health::{Heartbeat, ReadyFlag},
};

/// Shortest wait before retrying a failed fetch; doubles per failure up to
/// the refresh interval.
pub(super) const MIN_BACKOFF: Duration = Duration::from_secs(2);
/// Longest wait before restarting a worker that panicked (the wait doubles
/// from [`MIN_BACKOFF`] per panic in a row).
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(300);

/// A running channel worker, as the controller holds it.
struct Worker {
    /// What the channel wants read; a change wakes the worker.
    trigger: watch::Sender<Want>,
    /// Told when a ManagedOSVersion of the channel is deleted: retained versions to drop.
    prune: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

/// What a worker runs with: its channel's lease on publishing, and what reconciles read.
struct Run {
    lease: Lease,
    ctx: Arc<Context>,
    publisher: Arc<Publisher>,
    attempted: mpsc::UnboundedSender<ChannelKey>,
    prune: Arc<Notify>,
}

/// A worker's [`Progress`]: published under its lease, the first read told to readiness.
struct WorkerProgress<'a> {
    lease: &'a Lease,
    publisher: &'a Publisher,
    attempted: &'a mpsc::UnboundedSender<ChannelKey>,
}

impl Progress for WorkerProgress<'_> {
    fn attempted(&self) {
        let _ = self.attempted.send(self.lease.key().clone());
    }

    fn rebuilding(&self, statuses: RetainedStatuses) {
        self.publisher.rebuilding(self.lease, statuses);
    }
}

/// The channel controller: one worker per channel, started, triggered and
/// stopped by watch events, and readiness once every channel present at
/// start had its first fetch attempted.
pub(super) async fn controller(
    stores: ChannelStores,
    ctx: Arc<Context>,
    publisher: Arc<Publisher>,
    mut events: mpsc::UnboundedReceiver<ChannelEvent>,
    synced: ReadyFlag,
    fetched: ReadyFlag,
    heartbeat: Heartbeat,
) {
    let mut stores_ready = std::pin::pin!({
        let channels = stores.channels.clone();
        let versions = stores.versions.clone();
        async move {
            channels.wait_until_ready().await;
            versions.wait_until_ready().await;
        }
    });
    ctx.metrics.kept_data_limit(ctx.settings.max_kept_total);
    let (attempted_tx, mut attempted) = mpsc::unbounded_channel();
    let mut controller = Controller {
        stores,
        ctx,
        publisher,
        attempted: attempted_tx,
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
    stores: ChannelStores,
    ctx: Arc<Context>,
    publisher: Arc<Publisher>,
    /// Given to workers: they say when a channel's first read was attempted.
    attempted: mpsc::UnboundedSender<ChannelKey>,
    workers: HashMap<ChannelKey, Worker>,
    /// Channels present at start whose first fetch is still to be attempted;
    /// `None` until the reflectors have synced.
    pending_first: Option<HashSet<ChannelKey>>,
    /// Channels whose first fetch was attempted before the reflectors synced. A worker says
    /// so before it publishes its data (it does not wait for retained versions), so the cache
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
            .stores
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
        self.publisher.prune_history(&self.stores);
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
                    .filter(|k| self.stores.channels.get(&k.namespace, &k.name).is_none())
                    .cloned()
                    .collect();
                for key in gone {
                    self.drop_channel(&key);
                }
            }
            ChannelEvent::VersionDeleted(key) => {
                if let Some(worker) = self.workers.get(&key) {
                    worker.prune.notify_one();
                }
            }
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
                for worker in self.workers.values() {
                    worker.prune.notify_one();
                }
            }
        }
        if self.synced() {
            self.publisher.prune_history(&self.stores);
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
        let prune = Arc::new(Notify::new());
        let run = Run {
            lease: self.publisher.lease(&key),
            ctx: self.ctx.clone(),
            publisher: self.publisher.clone(),
            attempted: self.attempted.clone(),
            prune: prune.clone(),
        };
        let span = info_span!("refresh", namespace = %key.namespace, channel = %key.name);
        let task = tokio::spawn(supervise(run, rx).instrument(span));
        self.workers.insert(
            key,
            Worker {
                trigger,
                prune,
                task,
            },
        );
    }

    /// Stops a deleted channel's worker and drops its data.
    fn drop_channel(&mut self, key: &ChannelKey) {
        // Stop the worker first (even mid-fetch), so nothing it does later can
        // resurrect the data of a deleted channel.
        if let Some(worker) = self.workers.remove(key) {
            worker.task.abort();
        }
        self.publisher.remove(key);
        self.ctx.kept.forget(key);
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

/// Runs a channel's worker, restarting it with backoff when it panics, until
/// the controller aborts it (channel deleted).
async fn supervise(run: Run, trigger: watch::Receiver<Want>) {
    let key = run.lease.key().clone();
    let mut panics: u32 = 0;
    loop {
        let started = tokio::time::Instant::now();
        let ran = std::panic::AssertUnwindSafe(worker(&run, trigger.clone()))
            .catch_unwind()
            .await;
        let Err(panic) = ran else {
            return;
        };
        // A worker that ran well for long before panicking starts the backoff over.
        if started.elapsed() > MAX_RESTART_BACKOFF {
            panics = 0;
        }
        panics = panics.saturating_add(1);
        run.ctx.metrics.worker_panic();
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

/// When a channel is reconciled next, besides a change of the channel or of its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Action {
    /// At the latest after this long: the refresh interval, or the backoff after a failure.
    pub(super) requeue_after: Duration,
    /// Also as soon as kept channel data is stored or dropped (the image was refused for the
    /// kept-data limit and may fit then).
    pub(super) on_kept_data_change: bool,
}

/// When to reconcile again after a refresh that succeeded (`None`) or failed (its cause):
/// the refresh interval after a success, else the backoff ([`next_wait`]) up to the
/// interval; and, refused for the kept-data limit, as soon as kept data changes.
pub(super) fn error_policy(
    cause: Option<&Cause>,
    memory: &mut ChannelMemory,
    interval: Duration,
) -> Action {
    memory.failures = match cause {
        None => 0,
        Some(_) => memory.failures.saturating_add(1),
    };
    Action {
        requeue_after: next_wait(memory.failures, interval),
        on_kept_data_change: matches!(cause, Some(Cause::OverKeptTotal)),
    }
}

/// Runs the reconciles of one channel until the controller aborts it (channel deleted): at
/// start, when the channel changes or is re-synced by the operator, when the channel
/// history of this channel changes, and when its [`Action`] says; between them, drops the
/// retained versions whose ManagedOSVersion is gone when told to.
async fn worker(run: &Run, mut trigger: watch::Receiver<Want>) {
    let (ctx, key) = (&run.ctx, run.lease.key());
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
        let want = trigger.borrow_and_update().clone();
        let seen = history
            .as_mut()
            .and_then(|h| h.borrow_and_update().0.channel(key).cloned());
        // The versions known now: the registry is read after they existed.
        ctx.versions.wait_until_ready().await;
        // Kept data stored or dropped from now on wakes a refused refresh.
        kept_changes.mark_unchanged();
        let progress = WorkerProgress {
            lease: &run.lease,
            publisher: &run.publisher,
            attempted: &run.attempted,
        };
        let (next, cause) = match reconcile(key, &want, ctx, &mut memory, &progress).await {
            Ok(next) => (next, None),
            Err(failed) => (failed.next, Some(failed.cause)),
        };
        run.publisher.publish(&run.lease, next).await;
        if let Some(cause) = &cause {
            debug!(%cause, "refresh failed");
        }
        let action = error_policy(cause.as_ref(), &mut memory, ctx.settings.interval);
        let deadline = tokio::time::Instant::now() + action.requeue_after;
        loop {
            tokio::select! {
                changed = trigger.changed() => {
                    if changed.is_err() {
                        // The controller is gone; it cleans up.
                        return;
                    }
                    debug!("channel changed or re-synced by the operator");
                    break;
                }
                () = history_changed(history.as_mut(), key, seen.clone()) => {
                    debug!("channel history changed");
                    break;
                }
                Ok(()) = kept_changes.changed(), if action.on_kept_data_change => {
                    debug!("kept channel data changed; trying the refused image again");
                    break;
                }
                () = tokio::time::sleep_until(deadline) => break,
                () = run.prune.notified() => prune(run).await,
            }
        }
    }
}

/// Drops the channel's retained versions whose ManagedOSVersion is gone (built on a
/// blocking thread, see [`without_retained`]) and publishes the result, if any.
async fn prune(run: &Run) {
    let key = run.lease.key();
    let Some(current) = run.ctx.cache.get(key) else {
        return;
    };
    let versions = run.ctx.versions.clone();
    let namespace = key.namespace.clone();
    let pruned = tokio::task::spawn_blocking(move || {
        without_retained(&current, &|name: &str| {
            versions.get(&namespace, name).is_some()
        })
    })
    .await;
    if let Ok(Some(state)) = pruned {
        run.publisher.pruned(&run.lease, state);
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
pub(super) fn grew(now: Option<&ChannelHistory>, seen: Option<&ChannelHistory>) -> bool {
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
pub(super) fn next_wait(failures: u32, cap: Duration) -> Duration {
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
