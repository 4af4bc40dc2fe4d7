//! The channel controller and its workers, driven by watcher events and a
//! fake image source, on paused time.

use std::sync::Mutex;

use crate::reflect::Feeder;
use serde_json::json;
use tokio::time::{Instant, timeout, timeout_at};

use std::collections::BTreeSet;

use elemental_changelog::data::ChannelData;

use elemental_changelog_registry::{Access, FetchErrorKind, Repository};

use super::{
    controller::{Action, MIN_BACKOFF, controller, error_policy, grew, next_wait},
    history::{Change, History},
    reconcile::{Cause, ChannelMemory},
    *,
};
use crate::{
    cache::{
        ArchState, Change as CacheChange, ChannelState, Refreshed, RetainedStatus,
        RetainedStatuses, Snapshot, without_retained,
    },
    read_error::ReadErrorKind,
};
use elemental_changelog_registry::{Digest, ImageRef};
use futures::future::BoxFuture;
use jiff::Timestamp;
use std::{collections::BTreeMap, time::Duration};
use tokio::sync::{mpsc, watch};

const INTERVAL: Duration = Duration::from_secs(600);
/// Longer than anything the tests wait for; on paused time it costs nothing.
const NEVER: Duration = Duration::from_secs(100_000);
const NS: &str = "fleet-default";
/// When the operator first synced a channel.
const SYNCED: &str = "2026-01-01T00:00:00Z";
/// The image most tests' channel reads.
const IMAGE: &str = "registry/channel:6.1";

fn channel(name: &str, image: Option<&str>, synced: &str) -> ManagedOSVersionChannel {
    let spec = match image {
        Some(image) => json!({"type": "custom", "options": {"image": image}}),
        None => json!({"type": "json", "options": {"uri": "https://example.com/channel.json"}}),
    };
    serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
        "metadata": {"name": name, "namespace": NS, "generation": 1, "uid": format!("uid-{name}")},
        "spec": spec,
        "status": {"syncedGeneration": 1, "lastSyncedTime": synced}
    }))
    .unwrap_or_else(|e| panic!("channel: {e}"))
}

/// The channel `name` reading `image`, as the operator first synced it.
fn synced(name: &str, image: &str) -> ManagedOSVersionChannel {
    channel(name, Some(image), SYNCED)
}

/// The channel most tests use, `sl-micro`, reading `image`, as first synced.
fn sl_micro(image: &str) -> ManagedOSVersionChannel {
    synced("sl-micro", image)
}

/// ManagedOSVersions `names` of `sl-micro`.
fn versions(names: &[&str]) -> Vec<ManagedOSVersion> {
    names.iter().map(|name| version(name, "sl-micro")).collect()
}

/// A ManagedOSVersion as the operator creates it.
fn version(name: &str, channel: &str) -> ManagedOSVersion {
    serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersion",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "labels": {"elemental.cattle.io/channel": channel},
            "ownerReferences": [{"apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
                "name": channel, "uid": format!("uid-{channel}"), "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"version": name, "type": "container"}
    }))
    .unwrap_or_else(|e| panic!("version: {e}"))
}

/// Files of a channel image listing `names` (oldest first), each with an
/// `updates.log` of one advisory.
fn image_files(names: &[&str]) -> Vec<(String, Vec<u8>)> {
    let entries: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            json!({"metadata": {"name": name}, "spec": {"version": name, "type": "container",
                "metadata": {"upgradeImage": format!("registry/os:{name}"), "created": 1_700_000_000 + i as i64 * 86_400}}})
        })
        .collect();
    let mut files = vec![(
        "channel.json".to_owned(),
        serde_json::to_vec(&entries).unwrap_or_default(),
    )];
    for name in names {
        let log = json!([{"type": "security", "id": format!("SUSE-{name}"), "title": "fix", "severity": "important",
            "date": "1700000000", "references": [], "description": "", "packages": []}]);
        files.push((
            format!("changelogs/{name}.updates.log"),
            serde_json::to_vec(&log).unwrap_or_default(),
        ));
    }
    files
}

#[derive(Clone)]
struct Image {
    digest: String,
    /// Whether the image is an index (one platform per architecture).
    multi_arch: bool,
    files: Vec<(String, Vec<u8>)>,
}

/// A resolve of an image (a digest check; a pull, if any, follows it).
#[derive(Debug)]
struct Call {
    image: String,
    at: Instant,
}

/// A registry in memory that records every resolve and pull.
struct Fake {
    images: Mutex<BTreeMap<String, Image>>,
    failing: Mutex<bool>,
    /// When set, resolves (of the image named, or all) answer only once it is notified.
    gate: Mutex<Option<(Option<String>, Arc<tokio::sync::Notify>)>>,
    /// Resolves left that panic.
    panics: Mutex<u32>,
    calls: mpsc::UnboundedSender<Call>,
    /// (image, digest, arch) of every pull.
    pulls: Mutex<Vec<(String, String, String)>>,
}

/// A pull as [`Fake::pulls`] lists it.
fn pull(image: &str, arch: &str) -> (String, String) {
    (image.to_owned(), arch.to_owned())
}

/// `repository@digest` of a tagged reference, as the history names images.
fn by_digest(image: &str, digest: &str) -> String {
    let repository = image.rsplit_once(':').map_or(image, |(r, _)| r);
    format!("{repository}@{digest}")
}

impl Fake {
    /// Pushes an image under its tag and its digest.
    fn push(&self, image: &str, digest: &str, multi_arch: bool, names: &[&str]) {
        let image_data = Image {
            digest: digest.to_owned(),
            multi_arch,
            files: image_files(names),
        };
        let mut images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        images.insert(by_digest(image, digest), image_data.clone());
        images.insert(image.to_owned(), image_data);
    }

    fn push_files(&self, image: &str, digest: &str, files: Vec<(String, Vec<u8>)>) {
        let image_data = Image {
            digest: digest.to_owned(),
            multi_arch: false,
            files,
        };
        self.images
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(image.to_owned(), image_data);
    }

    /// Holds every later fetch until the returned gate is notified.
    fn hold(&self) -> Arc<tokio::sync::Notify> {
        let gate = Arc::new(tokio::sync::Notify::new());
        *self.gate.lock().unwrap_or_else(|e| e.into_inner()) = Some((None, gate.clone()));
        gate
    }

    /// Holds later fetches of `image` until the returned gate is notified.
    fn hold_image(&self, image: &str) -> Arc<tokio::sync::Notify> {
        let gate = Arc::new(tokio::sync::Notify::new());
        *self.gate.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Some(image.to_owned()), gate.clone()));
        gate
    }

    /// Makes the next `count` fetches panic.
    fn panic_next(&self, count: u32) {
        *self.panics.lock().unwrap_or_else(|e| e.into_inner()) = count;
    }

    fn fail(&self, failing: bool) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = failing;
    }
}

impl Fake {
    /// (image, arch) of every pull so far.
    fn pulls(&self) -> Vec<(String, String)> {
        self.pulls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(image, _, arch)| (image.clone(), arch.clone()))
            .collect()
    }
}

impl ImageSource for Fake {
    fn resolve<'a>(
        &'a self,
        image: &'a ImageRef,
        _namespace: &'a str,
    ) -> BoxFuture<'a, Result<Digest, FetchError>> {
        let call = Call {
            image: image.to_string(),
            at: Instant::now(),
        };
        let _ = self.calls.send(call);
        let panic = {
            let mut panics = self.panics.lock().unwrap_or_else(|e| e.into_inner());
            let panic = *panics > 0;
            *panics = panics.saturating_sub(1);
            panic
        };
        assert!(!panic, "injected panic");
        let failing = *self.failing.lock().unwrap_or_else(|e| e.into_inner());
        let found = self
            .images
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(image.as_str())
            .map(|i| i.digest.clone());
        let answer = match found {
            Some(digest) if !failing => Ok(digest.parse().expect("the fake's digests are digests")),
            _ => Err(FetchError::Timeout {
                after: Duration::from_secs(60),
            }),
        };
        let gate = self
            .gate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .filter(|(only, _)| only.as_deref().is_none_or(|o| o == image.as_str()))
            .map(|(_, gate)| gate);
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.notified().await;
            }
            answer
        })
    }

    fn pull<'a>(
        &'a self,
        image: &'a ImageRef,
        digest: &'a Digest,
        arch: &'a Arch,
        _namespace: &'a str,
    ) -> BoxFuture<'a, Result<Fetched, FetchError>> {
        self.pulls.lock().unwrap_or_else(|e| e.into_inner()).push((
            image.to_string(),
            digest.to_string(),
            arch.to_string(),
        ));
        let found = self
            .images
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .find(|i| *digest == i.digest)
            .cloned();
        let answer = match found {
            Some(found) => Ok(Fetched::Pulled {
                digest: found
                    .digest
                    .parse()
                    .expect("the fake's digests are digests"),
                files: found.files,
                compressed_bytes: 100,
                uncompressed_bytes: 1000,
                platform: found.multi_arch.then(|| format!("linux/{arch}")),
                memory: None,
            }),
            None => Err(FetchError::Timeout {
                after: Duration::from_secs(60),
            }),
        };
        Box::pin(std::future::ready(answer))
    }

    fn access(&self, _image: &ImageRef, _namespace: &str) -> Access {
        Access::Anonymous
    }
}

/// The controller running on fake watches and a fake registry.
struct Harness {
    channels: Feeder<ManagedOSVersionChannel>,
    versions: Feeder<ManagedOSVersion>,
    events: mpsc::UnboundedSender<ChannelEvent>,
    calls: mpsc::UnboundedReceiver<Call>,
    fake: Arc<Fake>,
    cache: Arc<Cache>,
    metrics: Arc<ChannelMetrics>,
    health: Arc<Health>,
    started: Instant,
}

/// The channel history in memory, as every replica would read it.
struct MemHistory {
    state: watch::Sender<(Arc<History>, bool)>,
    writes: Mutex<u32>,
}

impl MemHistory {
    fn new(history: History) -> Arc<Self> {
        Arc::new(Self {
            state: watch::Sender::new((Arc::new(history), true)),
            writes: Mutex::default(),
        })
    }

    fn current(&self) -> Arc<History> {
        self.state.borrow().0.clone()
    }

    fn writes(&self) -> u32 {
        *self.writes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl HistoryStore for MemHistory {
    fn subscribe(&self) -> watch::Receiver<(Arc<History>, bool)> {
        self.state.subscribe()
    }

    fn update(&self, change: Change) -> BoxFuture<'_, Result<(), history::HistoryError>> {
        let mut history = History::clone(&self.current());
        if change(&mut history) {
            *self.writes.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            self.state.send_replace((Arc::new(history), true));
        }
        Box::pin(async { Ok(()) })
    }
}

fn context(
    archs: &[&str],
    history: Option<Arc<MemHistory>>,
    kept_limit: u64,
) -> (
    Arc<Fake>,
    mpsc::UnboundedReceiver<Call>,
    ChannelStores,
    Writers,
    Arc<Context>,
) {
    let (calls_tx, calls) = mpsc::unbounded_channel();
    let fake = Arc::new(Fake {
        images: Mutex::default(),
        failing: Mutex::default(),
        gate: Mutex::default(),
        panics: Mutex::default(),
        calls: calls_tx,
        pulls: Mutex::default(),
    });
    let (channel_stores, channels) = Stores::single();
    let (version_stores, versions) = Stores::single();
    let stores = ChannelStores {
        channels: channel_stores,
        versions: version_stores,
    };
    let ctx = Arc::new(Context {
        fetcher: fake.clone(),
        images: ParsedImages::default(),
        kept: Kept::new(kept_limit),
        cache: Arc::new(Cache::default()),
        metrics: crate::metrics::Registry::default().register(),
        versions: stores.versions.clone(),
        settings: RefreshSettings {
            interval: INTERVAL,
            architectures: archs.iter().map(|a| a.parse().unwrap()).collect(),
            history: None,
            max_kept_total: kept_limit,
        },
        history: history.map(|h| h as Arc<dyn HistoryStore>),
    });
    (fake, calls, stores, Writers { channels, versions }, ctx)
}

struct Writers {
    channels: Feeder<ManagedOSVersionChannel>,
    versions: Feeder<ManagedOSVersion>,
}

impl Harness {
    /// Starts the controller; the watches have not listed yet.
    fn start(archs: &[&str]) -> Self {
        Self::start_with(archs, None)
    }

    /// Starts the controller with a channel history.
    fn start_with(archs: &[&str], history: Option<Arc<MemHistory>>) -> Self {
        Self::start_full(archs, history, u64::MAX)
    }

    /// Starts the controller with a limit on the data kept for all channels.
    fn start_full(archs: &[&str], history: Option<Arc<MemHistory>>, kept_limit: u64) -> Self {
        let (fake, calls, stores, writers, ctx) = context(archs, history, kept_limit);
        let health = Arc::new(Health::default());
        let (events, events_rx) = mpsc::unbounded_channel();
        let cache = ctx.cache.clone();
        let metrics = ctx.metrics.clone();
        let publisher = Arc::new(Publisher::new(
            cache.clone(),
            metrics.clone(),
            ctx.history.clone(),
        ));
        tokio::spawn(controller(
            stores,
            ctx,
            publisher,
            events_rx,
            health.ready_flag("informer-sync"),
            health.ready_flag("channels-first-fetch"),
            health.heartbeat("channel-controller"),
        ));
        Self {
            channels: writers.channels,
            versions: writers.versions,
            events,
            calls,
            fake,
            cache,
            metrics,
            health,
            started: Instant::now(),
        }
    }

    /// Starts the controller on `archs` with one channel, `sl-micro`, reading [`IMAGE`]
    /// (digest `sha256:one`, listing `names`), and the ManagedOSVersions `listed` of it;
    /// returns once its first digest check came.
    async fn one_channel(archs: &[&str], names: &[&str], listed: &[&str]) -> Self {
        let mut h = Self::start(archs);
        h.fake.push(IMAGE, "sha256:one", false, names);
        h.list(&[sl_micro(IMAGE)], &versions(listed));
        h.call().await;
        h
    }

    /// The initial list of both watches.
    fn list(&mut self, channels: &[ManagedOSVersionChannel], versions: &[ManagedOSVersion]) {
        self.channel(watcher::Event::Init);
        for c in channels {
            self.channel(watcher::Event::InitApply(c.clone()));
        }
        self.channel(watcher::Event::InitDone);
        self.version(watcher::Event::Init);
        for v in versions {
            self.version(watcher::Event::InitApply(v.clone()));
        }
        self.version(watcher::Event::InitDone);
    }

    /// A channel watch event, as the reflector applies and forwards it.
    fn channel(&mut self, event: watcher::Event<ManagedOSVersionChannel>) {
        self.channels.apply_watcher_event(&event);
        if let Some(event) = channel_event(&event) {
            let _ = self.events.send(event);
        }
    }

    fn version(&mut self, event: watcher::Event<ManagedOSVersion>) {
        self.versions.apply_watcher_event(&event);
        if let Some(event) = version_event(&event) {
            let _ = self.events.send(event);
        }
    }

    /// The next fetch, however far in the (paused) future.
    async fn call(&mut self) -> Call {
        timeout(NEVER, self.calls.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no fetch came"))
    }

    /// Asserts that no fetch happens before `self.started + at`.
    async fn no_call_before(&mut self, at: Duration) {
        if let Ok(call) = timeout_at(self.started + at, self.calls.recv()).await {
            panic!(
                "unexpected fetch at {:?}: {call:?}",
                self.since(call.as_ref().map_or(self.started, |c| c.at))
            );
        }
    }

    fn since(&self, at: Instant) -> Duration {
        at - self.started
    }

    fn ready(&self, name: &str) -> bool {
        self.health.ready().iter().any(|c| c.name == name && c.ok)
    }

    fn state(&self, name: &str) -> Option<Arc<ChannelState>> {
        self.cache.get(&ChannelKey::new(NS, name))
    }

    /// The state of channel `name`, which must have one.
    fn state_of(&self, name: &str) -> Arc<ChannelState> {
        self.state(name)
            .unwrap_or_else(|| panic!("no state of {name}"))
    }

    /// The channel metrics as `/metrics` encodes them.
    fn metrics_text(&self) -> String {
        String::from_utf8_lossy(&self.metrics.encode()).into_owned()
    }

    /// Lets the controller and workers run until `done` holds. Work on the blocking
    /// pool (parses, pruning) runs in real time whatever the paused clock says, so the
    /// bound is real time, long enough for a loaded machine.
    async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut turns = 0_u32;
        while std::time::Instant::now() < deadline {
            if done(self) {
                return;
            }
            tokio::task::yield_now().await;
            turns += 1;
            if turns.is_multiple_of(256) {
                // Let blocking-pool threads run on a busy machine.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        panic!("never happened: {what}");
    }
}

fn digest_of(state: &ChannelState, arch: &str) -> Option<String> {
    state
        .archs
        .get(arch)?
        .snapshot
        .as_ref()
        .map(|s| s.digest.to_string())
}

/// A repository as written (`registry/path`).
fn repository(text: &str) -> Repository {
    text.parse()
        .unwrap_or_else(|e| panic!("repository {text:?}: {e}"))
}

/// A digest as written.
fn digest(text: &str) -> Digest {
    text.parse()
        .unwrap_or_else(|e| panic!("digest {text:?}: {e}"))
}

#[test]
fn backoff_doubles_from_the_minimum_up_to_the_interval() {
    let hour = Duration::from_secs(3600);
    assert_eq!(next_wait(0, hour), hour);
    assert_eq!(next_wait(1, hour), Duration::from_secs(2));
    assert_eq!(next_wait(2, hour), Duration::from_secs(4));
    assert_eq!(next_wait(5, hour), Duration::from_secs(32));
    assert_eq!(next_wait(11, hour), Duration::from_secs(2048));
    assert_eq!(next_wait(12, hour), hour, "capped by the interval");
    assert_eq!(next_wait(u32::MAX, hour), hour, "no overflow");
    assert_eq!(next_wait(3, Duration::from_secs(5)), Duration::from_secs(5));
}

#[tokio::test]
async fn the_error_policy_backs_off_and_waits_for_kept_data_only_when_refused() {
    let mut memory = ChannelMemory::default();
    let timeout = Cause::Read {
        arch: Arch::x86_64(),
        kind: ReadErrorKind::Fetch(FetchErrorKind::Timeout),
    };
    let refused = Cause::OverKeptTotal;
    let retained = Cause::Retained {
        image: "registry/channel:5.5"
            .parse()
            .unwrap_or_else(|e| panic!("{e}")),
        kind: ReadErrorKind::Fetch(FetchErrorKind::Timeout),
    };
    let action =
        |cause: Option<&Cause>, memory: &mut ChannelMemory| error_policy(cause, memory, INTERVAL);
    let backoff = |requeue_after, on_kept_data_change| Action {
        requeue_after,
        on_kept_data_change,
    };
    assert_eq!(
        action(Some(&timeout), &mut memory),
        backoff(MIN_BACKOFF, false)
    );
    assert_eq!(
        action(Some(&refused), &mut memory),
        backoff(MIN_BACKOFF * 2, true),
        "refused for the kept-data limit: also woken when data goes"
    );
    assert_eq!(
        action(None, &mut memory),
        backoff(INTERVAL, false),
        "a success starts the backoff over"
    );
    assert_eq!(memory.failures, 0);
    assert_eq!(
        action(Some(&retained), &mut memory),
        backoff(MIN_BACKOFF, false)
    );
}

#[test]
fn watch_events_the_controller_hears() {
    let c = sl_micro("registry/channel:6.1");
    assert!(
        matches!(channel_event(&watcher::Event::Apply(c.clone())), Some(ChannelEvent::Applied(a)) if a.name_any() == "sl-micro")
    );
    assert!(matches!(
        channel_event(&watcher::Event::InitApply(c.clone())),
        Some(ChannelEvent::Applied(_))
    ));
    assert!(
        matches!(channel_event(&watcher::Event::Delete(c)), Some(ChannelEvent::Deleted(k)) if k == ChannelKey::new(NS, "sl-micro"))
    );
    assert!(channel_event(&watcher::Event::Init).is_none());
    assert!(matches!(
        channel_event(&watcher::Event::InitDone),
        Some(ChannelEvent::ChannelsListed)
    ));
    assert!(matches!(
        version_event(&watcher::Event::InitDone),
        Some(ChannelEvent::VersionsListed)
    ));

    let v = version("v1", "sl-micro");
    assert!(
        matches!(version_event(&watcher::Event::Delete(v.clone())), Some(ChannelEvent::VersionDeleted(k)) if k == ChannelKey::new(NS, "sl-micro"))
    );
    assert!(
        matches!(version_event(&watcher::Event::Apply(v)), Some(ChannelEvent::VersionApplied(k, n)) if k == ChannelKey::new(NS, "sl-micro") && n == "v1")
    );
    let orphan: ManagedOSVersion = serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersion",
        "metadata": {"name": "lonely", "namespace": NS}, "spec": {"version": "1"}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        version_event(&watcher::Event::Delete(orphan)).is_none(),
        "a version of no channel retains nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn single_platform_image_is_fetched_once_for_every_arch_then_checked_periodically() {
    let mut h = Harness::start(&["x86_64", "aarch64"]);
    h.fake
        .push("registry/channel:6.1", "sha256:one", false, &["v1", "v2"]);
    assert!(!h.ready("informer-sync"));
    h.list(
        &[sl_micro("registry/channel:6.1")],
        &versions(&["v1", "v2"]),
    );

    let first = h.call().await;
    assert_eq!(first.image, "registry/channel:6.1");
    assert_eq!(h.since(first.at), Duration::ZERO);
    h.until("first fetch stored", |h| {
        h.state("sl-micro").is_some_and(|s| s.attempted)
    })
    .await;
    assert_eq!(h.fake.pulls(), [pull("registry/channel:6.1", "x86_64")]);
    let state = h.state_of("sl-micro");
    let (Some(x86), Some(arm)) = (
        &state.archs["x86_64"].snapshot,
        &state.archs["aarch64"].snapshot,
    ) else {
        panic!("both architectures must have data: {state:?}");
    };
    assert_eq!(
        x86.generation(),
        arm.generation(),
        "one pull serves both architectures"
    );
    assert_eq!(x86.digest, "sha256:one");
    assert_eq!(x86.platform, None);
    assert_eq!(x86.data.data().versions().len(), 2);
    h.until("ready", |h| {
        h.ready("informer-sync") && h.ready("channels-first-fetch")
    })
    .await;

    // The next fetch is the periodic digest check, one for all architectures.
    let check = h.call().await;
    assert_eq!(h.since(check.at), INTERVAL);
    let next = h.call().await;
    assert_eq!(
        h.since(next.at),
        INTERVAL * 2,
        "no fetch for aarch64 in between"
    );
    assert_eq!(h.fake.pulls().len(), 1, "digest checks pull nothing");
    let state = h.state_of("sl-micro");
    let kept = state.archs["aarch64"]
        .snapshot
        .as_ref()
        .unwrap_or_else(|| panic!("data lost"));
    assert!(
        Arc::ptr_eq(kept, x86),
        "an unchanged digest keeps the same snapshot"
    );
    assert!(state.archs["aarch64"].confirmed_at.is_some());
    assert_eq!(
        h.cache.totals(),
        crate::cache::Totals {
            channels: 1,
            versions: 4,
            advisories: 4,
            retained: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn multi_platform_image_is_fetched_per_arch() {
    let mut h = Harness::start(&["x86_64", "aarch64"]);
    h.fake
        .push("registry/channel:6.1", "sha256:index", true, &["v1"]);
    h.list(&[sl_micro("registry/channel:6.1")], &[]);
    h.call().await;
    h.call().await;
    h.until("stored", |h| {
        h.state("sl-micro").is_some_and(|s| s.attempted)
    })
    .await;
    let image = "registry/channel:6.1";
    assert_eq!(
        h.fake.pulls(),
        [pull(image, "x86_64"), pull(image, "aarch64")]
    );
    let state = h.state_of("sl-micro");
    let platform = |arch: &str| {
        state.archs[arch]
            .snapshot
            .as_ref()
            .and_then(|s| s.platform.clone())
    };
    assert_eq!(platform("x86_64").as_deref(), Some("linux/x86_64"));
    assert_eq!(platform("aarch64").as_deref(), Some("linux/aarch64"));
    let c = h.call().await;
    assert_eq!((h.since(c.at), c.image.as_str()), (INTERVAL, image));
    h.call().await;
    assert_eq!(h.fake.pulls().len(), 2, "an unchanged index is not pulled");
}

#[tokio::test(start_paused = true)]
async fn a_new_sync_key_refetches_at_once_and_other_updates_do_not() {
    let mut h = Harness::one_channel(&["x86_64"], &["v1"], &[]).await;
    let c = sl_micro(IMAGE);

    // A label change: same sync key, nothing to do.
    let mut relabelled = c.clone();
    relabelled.metadata.labels = Some(BTreeMap::from([("team".to_owned(), "os".to_owned())]));
    relabelled.metadata.resource_version = Some("2".to_owned());
    h.channel(watcher::Event::Apply(relabelled));
    h.no_call_before(Duration::from_secs(60)).await;

    // The operator re-synced the channel: a digest check right away.
    let resynced = channel(
        "sl-micro",
        Some("registry/channel:6.1"),
        "2026-01-01T01:00:00Z",
    );
    h.channel(watcher::Event::Apply(resynced));
    let call = h.call().await;
    assert_eq!(h.since(call.at), Duration::from_secs(60));
    // The interval restarts from that fetch.
    let periodic = h.call().await;
    assert_eq!(h.since(periodic.at), Duration::from_secs(60) + INTERVAL);
    assert_eq!(h.fake.pulls().len(), 1, "the digest was unchanged");
}

#[tokio::test(start_paused = true)]
async fn a_new_image_is_pulled_and_versions_it_dropped_are_retained_while_they_exist() {
    let mut h = Harness::start(&["x86_64"]);
    h.fake.push(
        "registry/channel:v1",
        "sha256:old",
        false,
        &["v1", "v2", "v3"],
    );
    h.fake
        .push("registry/channel:v2", "sha256:new", false, &["v3", "v4"]);
    h.list(
        &[sl_micro("registry/channel:v1")],
        // v1 is gone from the cluster too; v2 still exists.
        &versions(&["v2", "v3", "v4"]),
    );
    h.call().await;
    h.until("stored", |h| {
        h.state("sl-micro").is_some_and(|s| s.attempted)
    })
    .await;

    h.channel(watcher::Event::Apply(sl_micro("registry/channel:v2")));
    let call = h.call().await;
    assert_eq!(call.image, "registry/channel:v2");
    h.until("new image stored", |h| {
        h.state("sl-micro")
            .and_then(|s| digest_of(&s, "x86_64"))
            .as_deref()
            == Some("sha256:new")
    })
    .await;
    assert_eq!(
        h.fake.pulls().last(),
        Some(&pull("registry/channel:v2", "x86_64"))
    );
    let state = h.state_of("sl-micro");
    assert_eq!(state.image.as_deref(), Some("registry/channel:v2"));
    let data = &state.archs["x86_64"]
        .snapshot
        .as_ref()
        .unwrap_or_else(|| panic!("no data"))
        .data;
    let names: Vec<&str> = data.data().versions().keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["v2", "v3", "v4"],
        "v1 has no ManagedOSVersion left, so it is not retained"
    );
    assert_eq!(
        data.version("v2").and_then(|v| v.retained_from.as_deref()),
        Some("sha256:old")
    );
    assert_eq!(
        data.version("v3").and_then(|v| v.retained_from.as_deref()),
        None
    );
    assert_eq!(h.cache.totals().retained, 1);

    // The operator deletes v2: its retained data goes with it.
    h.version(watcher::Event::Delete(version("v2", "sl-micro")));
    h.until("v2 pruned", |h| h.cache.totals().retained == 0)
        .await;
    let state = h.state_of("sl-micro");
    let data = &state.archs["x86_64"]
        .snapshot
        .as_ref()
        .unwrap_or_else(|| panic!("no data"))
        .data;
    assert!(data.version("v2").is_none());
    assert!(
        data.summary("v3").is_ok(),
        "summaries still answer after pruning"
    );
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_and_keep_the_last_good_data() {
    let mut h = Harness::one_channel(&["x86_64"], &["v1"], &[]).await;
    h.fake.fail(true);
    let mut at = Vec::new();
    for _ in 0..5 {
        let call = h.call().await;
        at.push(h.since(call.at).as_secs());
    }
    // First failure at the interval, then 2, 4, 8, 16 seconds apart.
    assert_eq!(at, [600, 602, 606, 614, 630]);
    let state = h.state_of("sl-micro");
    let arch = &state.archs["x86_64"];
    assert_eq!(
        arch.last_error.as_ref().map(|e| e.kind),
        Some(ReadErrorKind::Fetch(FetchErrorKind::Timeout))
    );
    assert_eq!(
        arch.snapshot.as_ref().map(|s| s.digest.as_str()),
        Some("sha256:one"),
        "last good data kept"
    );

    h.fake.fail(false);
    let ok = h.call().await;
    assert_eq!(h.since(ok.at).as_secs(), 662);
    let back = h.call().await;
    assert_eq!(
        h.since(back.at).as_secs(),
        662 + INTERVAL.as_secs(),
        "a success resets the backoff"
    );
    let state = h.state_of("sl-micro");
    assert!(
        state.archs["x86_64"].last_error.is_none(),
        "a success clears the error"
    );
}

#[tokio::test(start_paused = true)]
async fn readiness_needs_synced_watches_and_a_first_attempt_per_channel() {
    let mut h = Harness::start(&["x86_64"]);
    // The registry is down from the start: readiness still comes, the data is
    // simply not there yet (requests get 503s).
    h.fake.fail(true);
    h.list(
        &[
            synced("a", "registry/a:1"),
            synced("b", "registry/b:1"),
            channel("json", None, SYNCED),
        ],
        &[],
    );
    h.until("informer-sync", |h| h.ready("informer-sync")).await;
    h.call().await;
    h.call().await;
    h.until("first fetch attempted", |h| h.ready("channels-first-fetch"))
        .await;
    // Stored right after (readiness does not wait for retained versions).
    h.until("stored", |h| {
        ["a", "b", "json"]
            .iter()
            .all(|name| h.state(name).is_some_and(|s| s.attempted))
    })
    .await;
    let json = h.state_of("json");
    assert_eq!(json.image, None);
    assert!(json.archs.is_empty());
}

#[tokio::test(start_paused = true)]
async fn no_channels_is_ready_once_synced() {
    let mut h = Harness::start(&["x86_64"]);
    assert!(!h.ready("informer-sync"));
    h.list(&[], &[]);
    h.until("ready", |h| {
        h.ready("informer-sync") && h.ready("channels-first-fetch")
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_channel_stops_its_worker_and_drops_its_data() {
    let mut h = Harness::one_channel(&["x86_64"], &["v1"], &[]).await;
    let c = sl_micro(IMAGE);
    h.until("stored", |h| h.state("sl-micro").is_some()).await;
    h.channel(watcher::Event::Delete(c));
    h.until("data dropped", |h| h.state("sl-micro").is_none())
        .await;
    h.no_call_before(INTERVAL * 3).await;
    assert_eq!(h.cache.totals(), crate::cache::Totals::default());
}

#[tokio::test(start_paused = true)]
async fn a_relist_forgets_channels_deleted_while_the_watch_was_down() {
    let mut h = Harness::start(&["x86_64"]);
    h.fake.push("registry/a:1", "sha256:a", false, &["v1"]);
    h.fake.push("registry/b:1", "sha256:b", false, &["v1"]);
    let a = synced("a", "registry/a:1");
    let b = synced("b", "registry/b:1");
    h.list(&[a.clone(), b], &[]);
    h.call().await;
    h.call().await;
    h.until("stored", |h| {
        h.state("a").is_some() && h.state("b").is_some()
    })
    .await;

    // The watch restarts; `b` was deleted meanwhile: the re-list has no
    // Delete event for it, only its absence.
    h.channel(watcher::Event::Init);
    h.channel(watcher::Event::InitApply(a));
    h.channel(watcher::Event::InitDone);
    h.until("b dropped", |h| h.state("b").is_none()).await;
    let next = h.call().await;
    assert_eq!(
        (next.image.as_str(), h.since(next.at)),
        ("registry/a:1", INTERVAL),
        "only a is still refreshed"
    );
    h.no_call_before(INTERVAL * 2 - Duration::from_secs(1))
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_relist_prunes_retained_versions_deleted_while_the_watch_was_down() {
    let mut h = Harness::start(&["x86_64"]);
    h.fake
        .push("registry/channel:v1", "sha256:old", false, &["v1", "v2"]);
    h.fake
        .push("registry/channel:v2", "sha256:new", false, &["v2"]);
    h.list(&[sl_micro("registry/channel:v1")], &versions(&["v1", "v2"]));
    h.call().await;
    h.channel(watcher::Event::Apply(sl_micro("registry/channel:v2")));
    h.call().await;
    h.until("v1 retained", |h| h.cache.totals().retained == 1)
        .await;

    h.version(watcher::Event::Init);
    h.version(watcher::Event::InitApply(version("v2", "sl-micro")));
    h.version(watcher::Event::InitDone);
    h.until("v1 pruned", |h| h.cache.totals().retained == 0)
        .await;
}

#[tokio::test(start_paused = true)]
async fn an_unusable_image_keeps_the_last_good_data() {
    let mut h = Harness::one_channel(&["x86_64"], &["v1"], &[]).await;
    h.fake.push_files(
        "registry/channel:6.1",
        "sha256:broken",
        vec![("channel.json".to_owned(), b"{}".to_vec())],
    );
    let call = h.call().await;
    assert_eq!(h.since(call.at), INTERVAL);
    h.until("error recorded", |h| {
        h.state("sl-micro")
            .is_some_and(|s| s.archs["x86_64"].last_error.is_some())
    })
    .await;
    let state = h.state_of("sl-micro");
    let arch = &state.archs["x86_64"];
    assert_eq!(
        arch.last_error.as_ref().map(|e| e.kind),
        Some(ReadErrorKind::InvalidChannelJson)
    );
    assert!(
        arch.last_error
            .as_ref()
            .is_some_and(|e| e.message.contains("array")),
        "{:?}",
        arch.last_error
    );
    assert_eq!(
        arch.snapshot.as_ref().map(|s| s.digest.as_str()),
        Some("sha256:one")
    );
    // Retried with backoff, not at the interval, and the unusable digest is
    // not pulled again: the check names it as known, and the error stays.
    let retry = h.call().await;
    assert_eq!(h.since(retry.at), INTERVAL + MIN_BACKOFF);
    let again = h.call().await;
    assert_eq!(
        h.since(again.at),
        INTERVAL + MIN_BACKOFF * 3,
        "still backing off"
    );
    assert_eq!(
        h.fake.pulls().len(),
        2,
        "the unusable digest was pulled once"
    );
    let state = h.state_of("sl-micro");
    assert_eq!(
        state.archs["x86_64"].last_error.as_ref().map(|e| e.kind),
        Some(ReadErrorKind::InvalidChannelJson)
    );
    assert_eq!(
        state.archs["x86_64"]
            .snapshot
            .as_ref()
            .map(|s| s.digest.as_str()),
        Some("sha256:one")
    );

    h.fake.push_files(
        "registry/channel:6.1",
        "sha256:bare",
        vec![("README".to_owned(), b"x".to_vec())],
    );
    h.call().await;
    h.until("missing channel.json", |h| {
        h.state("sl-micro").is_some_and(|s| {
            s.archs["x86_64"]
                .last_error
                .as_ref()
                .is_some_and(|e| e.kind == ReadErrorKind::MissingChannelJson)
        })
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_image_that_is_no_reference_fails_as_its_resolve_would_and_keeps_the_last_good_data() {
    let mut h = Harness::one_channel(&["x86_64", "aarch64"], &["v1"], &["v1"]).await;
    h.until("stored", |h| {
        h.state("sl-micro")
            .and_then(|s| digest_of(&s, "aarch64"))
            .is_some()
    })
    .await;
    let invalid = ReadErrorKind::Fetch(FetchErrorKind::InvalidReference);
    h.channel(watcher::Event::Apply(channel(
        "sl-micro",
        Some("Not A Reference"),
        "2026-01-02T00:00:00Z",
    )));
    h.until("failed", |h| {
        h.state("sl-micro").is_some_and(|s| {
            s.image.as_deref() == Some("Not A Reference")
                && s.archs
                    .values()
                    .all(|a| a.last_error.as_ref().is_some_and(|e| e.kind == invalid))
        })
    })
    .await;
    let state = h.state_of("sl-micro");
    for arch in ["x86_64", "aarch64"] {
        assert_eq!(
            digest_of(&state, arch).as_deref(),
            Some("sha256:one"),
            "{arch}: the last good data is kept"
        );
        assert!(
            state.archs[arch]
                .last_error
                .as_ref()
                .is_some_and(|e| e.message.contains("Not A Reference")),
            "{arch}: {:?}",
            state.archs[arch].last_error
        );
    }
    let text = h.metrics_text();
    assert!(
        text.contains("elemental_changelog_channel_fetches_total{result=\"invalid_reference\"} 2"),
        "one failed fetch per architecture: {text}"
    );
    // Retried with backoff, never asking the registry: the first image's resolve stays the
    // only call.
    h.no_call_before(INTERVAL - Duration::from_secs(1)).await;
    assert_eq!(h.fake.pulls().len(), 1);
}

/// The data of `registry/channel:v2` (`sha256:new`, listing v2 and v3) with v1 retained
/// from `sha256:old`, as one architecture serves it.
fn retaining_arch_state() -> ArchState {
    let old = ChannelData::from_files(image_files(&["v1", "v2"])).unwrap_or_else(|e| panic!("{e}"));
    let parsed = Arc::new(
        ChannelData::from_files(image_files(&["v2", "v3"])).unwrap_or_else(|e| panic!("{e}")),
    );
    let mut data = ChannelData::clone(&parsed);
    data.retain_from(&old, "sha256:old", |_| true);
    let data = elemental_changelog::compute::IndexedChannel::new(data);
    data.precompute_summaries();
    let snapshot = Arc::new(
        Snapshot::read(
            "registry/channel:v2"
                .parse()
                .unwrap_or_else(|e| panic!("{e}")),
            digest("sha256:new"),
            None,
            parsed,
            Timestamp::UNIX_EPOCH,
        )
        .with_data(data),
    );
    ArchState {
        snapshot: Some(snapshot),
        confirmed_at: None,
        last_error: None,
        rejected: None,
    }
}

#[test]
fn cache_totals_and_pruning() {
    let cache = Cache::default();
    assert_eq!(cache.totals(), crate::cache::Totals::default());
    let arch = retaining_arch_state();
    let key = ChannelKey::new(NS, "sl-micro");
    let refreshed = || Refreshed {
        sync: sl_micro("registry/channel:v2").sync_key(),
        versions: Arc::default(),
    };
    let refreshed = |state| CacheChange::Refreshed {
        state,
        retained: RetainedStatuses::new(),
        refreshed: refreshed(),
    };
    cache.apply(
        &key,
        refreshed(ChannelState {
            image: Some("registry/channel:v2".to_owned()),
            attempted: true,
            archs: BTreeMap::from([(Arch::x86_64(), arch.clone()), (Arch::aarch64(), arch)]),
        }),
    );
    // A channel that was attempted but has no data does not count as one.
    cache.apply(
        &ChannelKey::new(NS, "empty"),
        refreshed(ChannelState {
            image: Some("registry/x".to_owned()),
            attempted: true,
            ..ChannelState::default()
        }),
    );
    assert_eq!(
        cache.totals(),
        crate::cache::Totals {
            channels: 1,
            versions: 6,
            advisories: 6,
            retained: 2
        }
    );

    let before = cache.get(&key).unwrap_or_else(|| panic!("no state"));
    assert!(
        without_retained(&before, &|_: &str| true).is_none(),
        "nothing to prune: no new state"
    );
    assert!(
        without_retained(&before, &|name: &str| name == "v1").is_none(),
        "only retained versions are pruned, and only when gone"
    );
    assert_eq!(cache.totals().retained, 2);
    let current = cache.get(&key).unwrap_or_else(|| panic!("no state"));
    let pruned =
        without_retained(&current, &|_: &str| false).unwrap_or_else(|| panic!("v1 is gone"));
    cache.apply(&key, CacheChange::Pruned(pruned));
    assert_eq!(
        cache.totals(),
        crate::cache::Totals {
            channels: 1,
            versions: 4,
            advisories: 4,
            retained: 0
        }
    );
    let after = cache.get(&key).unwrap_or_else(|| panic!("no state"));
    let snapshot = after.archs["x86_64"]
        .snapshot
        .as_ref()
        .unwrap_or_else(|| panic!("no data"));
    assert_eq!(
        (snapshot.digest.as_str(), snapshot.image.as_str()),
        ("sha256:new", "registry/channel:v2")
    );
    assert!(snapshot.data.summary("v3").is_ok());
    cache.apply(&key, CacheChange::Removed);
    assert_eq!(cache.totals().versions, 0);
}

#[tokio::test(start_paused = true)]
async fn a_fetch_in_flight_when_the_channel_is_deleted_does_not_resurrect_its_data() {
    let mut h = Harness::one_channel(&["x86_64"], &["v1"], &[]).await;
    let c = sl_micro(IMAGE);
    h.until("stored", |h| h.state("sl-micro").is_some()).await;
    let gate = h.fake.hold();
    h.fake
        .push("registry/channel:6.1", "sha256:two", false, &["v1", "v2"]);
    let held = h.call().await;
    assert_eq!(h.since(held.at), INTERVAL);
    h.channel(watcher::Event::Delete(c));
    h.until("data dropped", |h| h.state("sl-micro").is_none())
        .await;
    gate.notify_waiters();
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    assert!(
        h.state("sl-micro").is_none(),
        "the late answer must not bring the channel back"
    );
    h.no_call_before(INTERVAL * 4).await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_panics_is_restarted_with_backoff_and_counted() {
    let mut h = Harness::start(&["x86_64"]);
    h.fake
        .push("registry/channel:6.1", "sha256:one", false, &["v1"]);
    h.fake.panic_next(2);
    h.list(&[sl_micro("registry/channel:6.1")], &versions(&["v1"]));
    let first = h.call().await;
    let second = h.call().await;
    let third = h.call().await;
    assert_eq!(
        (h.since(first.at), h.since(second.at), h.since(third.at)),
        (Duration::ZERO, MIN_BACKOFF, MIN_BACKOFF * 3),
        "restarted after 2 s, then after 4 s more"
    );
    h.until("stored after the restarts", |h| {
        h.state("sl-micro")
            .and_then(|s| digest_of(&s, "x86_64"))
            .is_some()
    })
    .await;
    let text = h.metrics_text();
    assert!(
        text.contains("elemental_changelog_channel_worker_panics_total 2"),
        "{text}"
    );
    // The restarted worker goes on as usual: the next check after the interval.
    let next = h.call().await;
    assert_eq!(h.since(next.at), MIN_BACKOFF * 3 + INTERVAL);
}

const REPO: &str = "registry.example.com/channel";

/// A history where `sha256:old` listed v1..v3 and `sha256:new` lists v3, v4.
fn old_and_new_history() -> History {
    let mut history = History::default();
    let key = ChannelKey::new(NS, "sl-micro");
    record(&mut history, &key, REPO, "sha256:old", &["v1", "v2", "v3"]);
    record(&mut history, &key, REPO, "sha256:new", &["v3", "v4"]);
    history
}

/// Records in `history` that the image `repository@digest` of channel `key` listed `names`.
fn record(history: &mut History, key: &ChannelKey, repository: &str, digest: &str, names: &[&str]) {
    let names = names
        .iter()
        .map(|s| (*s).to_owned())
        .collect::<BTreeSet<_>>();
    history.record(
        key,
        &self::repository(repository),
        &self::digest(digest),
        &names,
        Timestamp::UNIX_EPOCH,
    );
}

fn retained_from(h: &Harness, name: &str) -> Option<Option<String>> {
    let state = h.state("sl-micro")?;
    let snapshot = state.archs.get("x86_64")?.snapshot.clone()?;
    snapshot.data.version(name).map(|v| v.retained_from.clone())
}

#[tokio::test(start_paused = true)]
async fn a_young_replica_rebuilds_retained_versions_from_the_history() {
    let history = MemHistory::new(old_and_new_history());
    let mut h = Harness::start_with(&["x86_64", "aarch64"], Some(history.clone()));
    let image = format!("{REPO}:v2");
    h.fake.push(
        &format!("{REPO}:v1"),
        "sha256:old",
        false,
        &["v1", "v2", "v3"],
    );
    h.fake.push(&image, "sha256:new", false, &["v3", "v4"]);
    let old = by_digest(&image, "sha256:old");
    let gate = h.fake.hold_image(&old);
    // v1's ManagedOSVersion is gone; v2's stays.
    h.list(&[sl_micro(&image)], &versions(&["v2", "v3", "v4"]));
    let current = h.call().await;
    assert_eq!(current.image, image);
    let rebuild = h.call().await;
    assert_eq!(rebuild.image, old, "the older image is read by digest");
    // While it is pulled: ready, nothing published (not fetched yet), and
    // the version says it is being rebuilt, for every architecture.
    h.until("ready", |h| h.ready("channels-first-fetch")).await;
    assert!(h.state("sl-micro").is_none());
    let key = ChannelKey::new(NS, "sl-micro");
    for arch in ["x86_64", "aarch64"] {
        assert!(
            matches!(
                h.cache.retained_status(&key, arch, "v2"),
                Some(RetainedStatus::Rebuilding { image }) if image.as_str() == old
            ),
            "{arch}"
        );
    }
    gate.notify_waiters();
    h.until("published", |h| h.state("sl-micro").is_some())
        .await;
    assert_eq!(
        h.fake.pulls()[1..],
        [pull(&old, "aarch64")],
        "once, for the architectures the single-platform image serves"
    );
    assert_eq!(retained_from(&h, "v2"), Some(Some("sha256:old".to_owned())));
    assert_eq!(retained_from(&h, "v3"), Some(None));
    assert_eq!(
        retained_from(&h, "v1"),
        None,
        "no ManagedOSVersion, not served"
    );
    assert!(h.cache.retained_status(&key, "x86_64", "v2").is_none());
    assert_eq!(h.cache.totals().retained, 2, "one per architecture");
    // The history had the images; only v1, whose ManagedOSVersion is gone, was pruned.
    assert_eq!(history.writes(), 1);
    let recorded = history.current();
    let images = recorded
        .channel(&key)
        .map(|c| c.images.clone())
        .unwrap_or_default();
    assert_eq!(images.len(), 2);
    assert!(!images[0].versions.contains("v1") && images[0].versions.contains("v2"));
    // Nothing is pulled again at the next check.
    let next = h.call().await;
    assert_eq!(
        (next.image.as_str(), h.since(next.at)),
        (image.as_str(), INTERVAL)
    );
    h.no_call_before(INTERVAL * 2 - Duration::from_secs(1))
        .await;
}

#[tokio::test(start_paused = true)]
async fn an_older_image_the_registry_lost_fails_clearly_and_is_retried_with_backoff() {
    let history = MemHistory::new(old_and_new_history());
    let mut h = Harness::start_with(&["x86_64"], Some(history));
    let image = format!("{REPO}:v2");
    h.fake.push(&image, "sha256:new", false, &["v3", "v4"]);
    h.list(&[sl_micro(&image)], &versions(&["v2", "v3"]));
    let old = by_digest(&image, "sha256:old");
    assert_eq!(h.call().await.image, image);
    assert_eq!(h.call().await.image, old);
    h.until("published", |h| h.state("sl-micro").is_some())
        .await;
    let key = ChannelKey::new(NS, "sl-micro");
    assert!(matches!(
        h.cache.retained_status(&key, "x86_64", "v2"),
        Some(RetainedStatus::Failed { image, failure }) if image.as_str() == old && failure.kind == ReadErrorKind::Fetch(FetchErrorKind::Timeout)
    ));
    assert_eq!(retained_from(&h, "v2"), None);
    assert_eq!(retained_from(&h, "v3"), Some(None), "the rest is served");
    // Retried with backoff: the tag is checked (unchanged), the old image pulled again.
    let check = h.call().await;
    let retry = h.call().await;
    assert_eq!(
        (
            check.image.as_str(),
            retry.image.as_str(),
            h.since(retry.at)
        ),
        (image.as_str(), old.as_str(), MIN_BACKOFF)
    );
    h.fake.push(
        &format!("{REPO}:v1"),
        "sha256:old",
        false,
        &["v1", "v2", "v3"],
    );
    h.call().await;
    let retry = h.call().await;
    assert_eq!(
        (retry.image.as_str(), h.since(retry.at)),
        (old.as_str(), MIN_BACKOFF * 3)
    );
    h.until("rebuilt", |h| retained_from(h, "v2").is_some())
        .await;
    assert_eq!(retained_from(&h, "v2"), Some(Some("sha256:old".to_owned())));
    assert!(h.cache.retained_status(&key, "x86_64", "v2").is_none());
    let text = h.metrics_text();
    assert!(
        text.contains("elemental_changelog_retained_pulls_total{result=\"failed\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("elemental_changelog_retained_pulls_total{result=\"pulled\"} 1"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn images_read_are_recorded_and_the_history_is_pruned_with_the_versions() {
    let history = MemHistory::new(History::default());
    let mut h = Harness::start_with(&["x86_64"], Some(history.clone()));
    h.fake.push(
        &format!("{REPO}:v1"),
        "sha256:old",
        false,
        &["v1", "v2", "v3"],
    );
    h.fake
        .push(&format!("{REPO}:v2"), "sha256:new", false, &["v3", "v4"]);
    let versions = ["v1", "v2", "v3", "v4"].map(|v| version(v, "sl-micro"));
    h.list(&[sl_micro(&format!("{REPO}:v1"))], &versions);
    h.call().await;
    h.until("recorded", |_| history.writes() == 1).await;
    h.channel(watcher::Event::Apply(channel(
        "sl-micro",
        Some(&format!("{REPO}:v2")),
        "2026-01-02T00:00:00Z",
    )));
    h.call().await;
    h.until("recorded again", |_| history.writes() == 2).await;
    // Dropped from the image, kept in memory: nothing pulled by digest.
    assert_eq!(retained_from(&h, "v1"), Some(Some("sha256:old".to_owned())));
    let key = ChannelKey::new(NS, "sl-micro");
    let origin = |v: &str| {
        history
            .current()
            .origin(&key, v)
            .map(|r| r.digest.to_string())
    };
    assert_eq!(origin("v1").as_deref(), Some("sha256:old"));
    assert_eq!(origin("v4").as_deref(), Some("sha256:new"));

    h.version(watcher::Event::Delete(version("v1", "sl-micro")));
    h.until("pruned from the history", |_| origin("v1").is_none())
        .await;
    h.until("pruned from the cache", |h| {
        retained_from(h, "v1").is_none()
    })
    .await;
    assert_eq!(origin("v2").as_deref(), Some("sha256:old"));
    h.version(watcher::Event::Delete(version("v2", "sl-micro")));
    h.until("the old image forgotten", |_| {
        history.current().channel(&key).map(|c| c.images.len()) == Some(1)
    })
    .await;
    // The channel deleted: its history goes.
    h.channel(watcher::Event::Delete(channel(
        "sl-micro",
        None,
        "2026-01-02T00:00:00Z",
    )));
    h.until("channel forgotten", |_| {
        history.current().channel(&key).is_none()
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_history_naming_another_registry_or_repository_is_not_followed() {
    let mut history = History::default();
    let key = ChannelKey::new(NS, "sl-micro");
    record(
        &mut history,
        &key,
        "elsewhere.example.com/channel",
        "sha256:elsewhere",
        &["v2"],
    );
    // Whoever can write the history's ConfigMap names a repository of the
    // channel's own registry host that they control, newer than the real
    // record of v1.
    record(&mut history, &key, REPO, "sha256:old", &["v1"]);
    let forged = "registry.example.com/attacker/channel";
    record(&mut history, &key, forged, "sha256:forged", &["v1"]);
    record(&mut history, &key, REPO, "sha256:new", &["v3"]);
    let history = MemHistory::new(history);
    let mut h = Harness::start_with(&["x86_64"], Some(history.clone()));
    let image = format!("{REPO}:v2");
    let old = by_digest(&format!("{REPO}:v1"), "sha256:old");
    h.fake.push(&image, "sha256:new", false, &["v3"]);
    h.fake
        .push(&format!("{forged}:v1"), "sha256:forged", false, &["v1"]);
    h.fake
        .push(&format!("{REPO}:v1"), "sha256:old", false, &["v1"]);
    h.list(&[sl_micro(&image)], &versions(&["v1", "v2", "v3"]));
    assert_eq!(h.call().await.image, image);
    assert_eq!(h.call().await.image, old, "the channel's own older image");
    h.until("v1 retained", |h| retained_from(h, "v1").is_some())
        .await;
    assert_eq!(
        retained_from(&h, "v1"),
        Some(Some("sha256:old".to_owned())),
        "from the channel's own repository, never from the forged record"
    );
    // Nor does the forged record make the history forget the real one.
    let recorded = history.current();
    let records = &recorded.channel(&key).unwrap().images;
    assert!(
        records
            .iter()
            .any(|r| r.repository == REPO && r.digest == "sha256:old" && r.versions.contains("v1")),
        "{records:?}"
    );
    assert_eq!(retained_from(&h, "v2"), None, "another registry");
    assert!(h.cache.retained_status(&key, "x86_64", "v2").is_none());
    assert_eq!(
        h.fake.pulls(),
        [pull(&image, "x86_64"), pull(&old, "x86_64")],
        "nothing else pulled"
    );
    h.no_call_before(INTERVAL - Duration::from_secs(1)).await;
}

#[test]
fn only_a_history_that_maps_versions_anew_wakes_a_worker() {
    let key = ChannelKey::new(NS, "c");
    let mut h = History::default();
    record(&mut h, &key, REPO, "sha256:1", &["v1", "v2"]);
    record(&mut h, &key, REPO, "sha256:2", &["v2", "v3"]);
    let seen = h.channel(&key).cloned();
    assert!(!grew(seen.as_ref(), seen.as_ref()));
    assert!(grew(seen.as_ref(), None), "a first history");
    assert!(
        !grew(None, seen.as_ref()),
        "forgotten: the controller prunes"
    );
    let mut pruned = h.clone();
    pruned.prune(|_| true, |_, v| v != Some("v1"));
    assert!(!grew(pruned.channel(&key), seen.as_ref()), "pruning only");
    let mut added = h.clone();
    record(&mut added, &key, REPO, "sha256:3", &["v4"]);
    assert!(
        grew(added.channel(&key), seen.as_ref()),
        "an image recorded"
    );
    let mut back = h.clone();
    record(&mut back, &key, REPO, "sha256:1", &["v1"]);
    assert!(
        grew(back.channel(&key), seen.as_ref()),
        "an older image made the newest again"
    );
}

/// The same channel in another namespace.
fn channel_in(namespace: &str, name: &str, image: &str) -> ManagedOSVersionChannel {
    let mut c = synced(name, image);
    c.metadata.namespace = Some(namespace.to_owned());
    c.metadata.uid = Some(format!("uid-{namespace}-{name}"));
    c
}

/// The data served for `namespace/name` on x86_64.
fn served(h: &Harness, namespace: &str, name: &str) -> Option<Arc<Snapshot>> {
    h.cache
        .get(&ChannelKey::new(namespace, name))?
        .archs
        .get("x86_64")?
        .snapshot
        .clone()
}

fn fetches(h: &Harness, result: &str) -> u64 {
    let text = h.metrics_text();
    let line = format!("elemental_changelog_channel_fetches_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn channels_reading_one_image_share_one_parse_while_any_holds_it() {
    let mut h = Harness::start(&["x86_64", "aarch64"]);
    let image = "registry/channel:6.1";
    h.fake.push(image, "sha256:one", false, &["v1", "v2"]);
    h.list(&[channel_in("fleet-default", "os", image)], &[]);
    h.call().await;
    h.until("first channel served", |h| {
        served(h, "fleet-default", "os").is_some()
    })
    .await;

    // The same image in another workspace: resolved, not pulled, not parsed.
    h.channel(watcher::Event::Apply(channel_in("team-a", "os", image)));
    assert_eq!(h.call().await.image, image);
    h.until("second channel served", |h| {
        served(h, "team-a", "os").is_some()
    })
    .await;
    assert_eq!(h.fake.pulls(), [pull(image, "x86_64")], "one pull");
    let first = served(&h, "fleet-default", "os").unwrap_or_else(|| panic!("no data"));
    let second = served(&h, "team-a", "os").unwrap_or_else(|| panic!("no data"));
    assert!(Arc::ptr_eq(&first.parsed, &second.parsed), "one parse");
    assert_eq!(second.digest, "sha256:one");
    assert_eq!((fetches(&h, "pulled"), fetches(&h, "shared")), (1, 1));

    // The first channel deleted: the second is still served, and still
    // shares its parse with a channel created later.
    h.channel(watcher::Event::Delete(channel_in(
        "fleet-default",
        "os",
        image,
    )));
    h.until("first dropped", |h| {
        served(h, "fleet-default", "os").is_none()
    })
    .await;
    assert!(served(&h, "team-a", "os").is_some_and(|s| Arc::ptr_eq(&s.parsed, &first.parsed)));
    drop(first);
    h.channel(watcher::Event::Apply(channel_in("team-b", "os", image)));
    h.call().await;
    h.until("third channel served", |h| {
        served(h, "team-b", "os").is_some()
    })
    .await;
    let third = served(&h, "team-b", "os").unwrap_or_else(|| panic!("no data"));
    assert!(Arc::ptr_eq(&third.parsed, &second.parsed));
    assert_eq!(h.fake.pulls().len(), 1);
    drop((second, third));

    // Once no channel holds it, nothing does: the next channel pulls again.
    for ns in ["team-a", "team-b"] {
        h.channel(watcher::Event::Delete(channel_in(ns, "os", image)));
    }
    h.until("all dropped", |h| h.cache.all().is_empty()).await;
    h.channel(watcher::Event::Apply(channel_in("team-c", "os", image)));
    h.call().await;
    h.until("pulled again", |h| served(h, "team-c", "os").is_some())
        .await;
    assert_eq!(h.fake.pulls().len(), 2);
    assert_eq!(fetches(&h, "pulled"), 2);
}

#[tokio::test(start_paused = true)]
async fn channels_starting_together_share_and_another_digest_or_repository_is_not_shared() {
    let mut h = Harness::start(&["x86_64"]);
    let image = "registry/channel:6.1";
    h.fake.push(image, "sha256:one", false, &["v1"]);
    // The same digest in another repository: pulled on its own.
    h.fake
        .push("registry/copy:6.1", "sha256:one", false, &["v1"]);
    // a and b start at the same moment: b waits for a's read.
    h.list(
        &[
            channel_in(NS, "a", image),
            channel_in(NS, "b", image),
            channel_in(NS, "copy", "registry/copy:6.1"),
        ],
        &[],
    );
    for _ in 0..3 {
        h.call().await;
    }
    h.until("all served", |h| {
        ["a", "b", "copy"]
            .iter()
            .all(|n| served(h, NS, n).is_some())
    })
    .await;
    let data = |h: &Harness, name: &str| {
        served(h, NS, name)
            .unwrap_or_else(|| panic!("{name}: no data"))
            .parsed
            .clone()
    };
    assert!(Arc::ptr_eq(&data(&h, "a"), &data(&h, "b")));
    assert!(!Arc::ptr_eq(&data(&h, "a"), &data(&h, "copy")));
    assert_eq!(h.fake.pulls().len(), 2);
    assert_eq!((fetches(&h, "pulled"), fetches(&h, "shared")), (2, 1));

    // A new digest: the first channel to see it pulls it, and serves it
    // alone until the other one checks its tag and shares it.
    h.fake.push(image, "sha256:two", false, &["v1", "v2"]);
    let mut a = channel_in(NS, "a", image);
    a.status = channel("a", Some(image), "2026-01-02T00:00:00Z").status;
    h.channel(watcher::Event::Apply(a));
    h.call().await;
    h.until("a on the new digest", |h| {
        served(h, NS, "a").is_some_and(|s| s.digest == "sha256:two")
    })
    .await;
    let b = served(&h, NS, "b").unwrap_or_else(|| panic!("no data"));
    assert_eq!(b.digest, "sha256:one");
    assert!(
        !Arc::ptr_eq(&data(&h, "a"), &b.parsed),
        "not the old digest's data"
    );
    assert_eq!(h.fake.pulls().len(), 3);
    let check = h.call().await;
    assert_eq!(h.since(check.at), INTERVAL, "b's periodic check");
    h.until("b on the new digest", |h| {
        served(h, NS, "b").is_some_and(|s| s.digest == "sha256:two")
    })
    .await;
    assert!(Arc::ptr_eq(&data(&h, "a"), &data(&h, "b")));
    assert_eq!(h.fake.pulls().len(), 3, "read once");
}

#[tokio::test(start_paused = true)]
async fn an_unusable_image_is_not_shared() {
    let mut h = Harness::start(&["x86_64"]);
    let image = "registry/channel:6.1";
    h.fake.push_files(
        image,
        "sha256:broken",
        vec![("channel.json".to_owned(), b"{}".to_vec())],
    );
    h.list(&[channel_in(NS, "a", image)], &[]);
    h.call().await;
    h.until("a failed", |h| {
        h.state("a")
            .is_some_and(|s| s.archs["x86_64"].last_error.is_some())
    })
    .await;
    h.channel(watcher::Event::Apply(channel_in(NS, "b", image)));
    h.call().await;
    h.until("b failed", |h| {
        h.state("b").is_some_and(|s| {
            s.archs["x86_64"]
                .last_error
                .as_ref()
                .is_some_and(|e| e.kind == ReadErrorKind::InvalidChannelJson)
        })
    })
    .await;
    assert!(
        h.state("b")
            .is_some_and(|s| s.archs["x86_64"].snapshot.is_none())
    );
    assert_eq!(h.fake.pulls().len(), 2, "each channel read it itself");
    assert_eq!(fetches(&h, "shared"), 0);
}

/// Bytes of parsed data of an image of [`image_files`] listing `names`.
fn parsed_bytes(names: &[&str]) -> u64 {
    ChannelData::from_files(image_files(names))
        .unwrap()
        .parsed_bytes()
}

/// Waits until the metric `name` is `value` (metrics follow the cache).
async fn metric_is(h: &Harness, name: &str, value: f64) {
    h.until(&format!("{name} {value}"), |h| metric(h, name) == value)
        .await;
}

fn metric(h: &Harness, name: &str) -> f64 {
    let text = h.metrics_text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

fn kept_refused(state: &ChannelState) -> bool {
    state.archs["x86_64"]
        .last_error
        .as_ref()
        .is_some_and(|e| e.kind == ReadErrorKind::OverKeptTotal)
}

/// Of [`kept_data_is_bounded_in_total_and_shared_images_count_once`], once `a` and `b`
/// (each `each` bytes) are served: a third image does not fit.
async fn refuse_a_channel_past_the_bound(h: &mut Harness, each: u64) {
    // A third image does not fit: refused, the others untouched.
    let pulls = h.fake.pulls().len();
    h.channel(watcher::Event::Apply(synced("c", "registry/c:1")));
    h.until("c refused", |h| {
        h.state("c").is_some_and(|s| kept_refused(&s))
    })
    .await;
    let c = h.state("c").unwrap();
    assert!(
        c.archs.values().all(|a| a.snapshot.is_none()),
        "nothing served"
    );
    let message = &c.archs["x86_64"].last_error.as_ref().unwrap().message;
    assert!(message.contains("--max-kept-total"), "{message}");
    assert_eq!(
        ReadErrorKind::OverKeptTotal.public_message(),
        "the channel image's data would take the server past its limit on the data kept for all channels together (--max-kept-total)"
    );
    assert_eq!(
        h.fake.pulls().len(),
        pulls + 1,
        "one pull: a single-platform image"
    );
    metric_is(h, "elemental_changelog_kept_data_refused_channels", 1.0).await;
    assert_eq!(
        metric(h, "elemental_changelog_kept_data_refusals_total"),
        1.0
    );
    metric_is(h, "elemental_changelog_kept_data_bytes", (2 * each) as f64).await;
    // Retried with backoff, without pulling it again while it would not fit.
    while h.calls.try_recv().is_ok() {}
    for _ in 0..3 {
        assert_eq!(h.call().await.image, "registry/c:1");
    }
    assert_eq!(h.fake.pulls().len(), pulls + 1);
}

/// Of [`kept_data_is_bounded_in_total_and_shared_images_count_once`], once `c` is refused:
/// `b`'s new image does not fit either.
async fn refuse_a_served_channels_new_image(h: &mut Harness) {
    // A served channel whose new image would not fit keeps its last good data.
    h.fake.push(
        "registry/b:2",
        "sha256:b2",
        false,
        &["b1", "b2", "b3", "b4"],
    );
    h.channel(watcher::Event::Apply(channel(
        "b",
        Some("registry/b:2"),
        "2026-01-02T00:00:00Z",
    )));
    h.until("b's new image refused", |h| {
        h.state("b")
            .is_some_and(|s| kept_refused(&s) && s.image.as_deref() == Some("registry/b:2"))
    })
    .await;
    let b = h.state("b").unwrap();
    assert_eq!(digest_of(&b, "x86_64").as_deref(), Some("sha256:b"));
    assert_eq!(digest_of(&b, "aarch64").as_deref(), Some("sha256:b"));
    metric_is(h, "elemental_changelog_kept_data_refused_channels", 2.0).await;
}

/// Issue 17, item 8: the parsed data kept for all channels is bounded; a channel past the
/// bound is refused (a new one serves nothing, a served one keeps its data), the others
/// are served, an image shared by channels counts once, and a refused image is not pulled
/// again until it fits.
#[tokio::test(start_paused = true)]
async fn kept_data_is_bounded_in_total_and_shared_images_count_once() {
    let each = parsed_bytes(&["a1", "a2"]);
    assert_eq!(parsed_bytes(&["b1", "b2"]), each);
    let limit = 2 * each + each / 2;
    let mut h = Harness::start_full(&["x86_64", "aarch64"], None, limit);
    h.fake
        .push("registry/a:1", "sha256:a", false, &["a1", "a2"]);
    h.fake
        .push("registry/b:1", "sha256:b", false, &["b1", "b2"]);
    h.fake
        .push("registry/c:1", "sha256:c", false, &["c1", "c2"]);
    h.list(
        &[
            synced("a", "registry/a:1"),
            synced("a-again", "registry/a:1"),
            synced("b", "registry/b:1"),
        ],
        &[],
    );
    h.until("a and b served", |h| {
        ["a", "a-again", "b"].iter().all(|c| {
            h.state(c)
                .is_some_and(|s| digest_of(&s, "aarch64").is_some())
        })
    })
    .await;
    metric_is(&h, "elemental_changelog_kept_data_bytes", (2 * each) as f64).await;
    assert_eq!(
        metric(&h, "elemental_changelog_kept_data_limit_bytes"),
        limit as f64
    );

    refuse_a_channel_past_the_bound(&mut h, each).await;
    refuse_a_served_channels_new_image(&mut h).await;

    // b goes: c fits now and is served at its next retry; a channel's own
    // data never counts against its new image.
    h.channel(watcher::Event::Delete(channel(
        "b",
        Some("registry/b:2"),
        "2026-01-02T00:00:00Z",
    )));
    h.until("c served", |h| {
        h.state("c")
            .is_some_and(|s| digest_of(&s, "x86_64").as_deref() == Some("sha256:c"))
    })
    .await;
    metric_is(&h, "elemental_changelog_kept_data_refused_channels", 0.0).await;
    metric_is(&h, "elemental_changelog_kept_data_bytes", (2 * each) as f64).await;
    h.fake
        .push("registry/a:2", "sha256:a2", false, &["a3", "a4"]);
    for name in ["a", "a-again"] {
        h.channel(watcher::Event::Apply(channel(
            name,
            Some("registry/a:2"),
            "2026-01-03T00:00:00Z",
        )));
    }
    h.until("a moved", |h| {
        ["a", "a-again"].iter().all(|c| {
            h.state(c)
                .is_some_and(|s| digest_of(&s, "x86_64").as_deref() == Some("sha256:a2"))
        })
    })
    .await;
    metric_is(&h, "elemental_changelog_kept_data_bytes", (2 * each) as f64).await;
}

/// Issue 17, item 12: a ManagedOSVersion the last read did not know of (the
/// operator's new version, seen after the read for its re-sync started) is
/// read for at once, not at the next interval; a known one changing wakes
/// nothing.
#[tokio::test(start_paused = true)]
async fn a_version_the_last_read_did_not_know_is_read_for_at_once() {
    let mut h = Harness::one_channel(&["x86_64"], &["v1"], &["v1"]).await;
    let key = ChannelKey::new(NS, "sl-micro");
    let knows = |h: &Harness, name: &str| {
        h.cache
            .refreshed(&key)
            .is_some_and(|r| r.versions.contains(name))
    };
    h.until("v1 known", |h| knows(h, "v1")).await;
    h.version(watcher::Event::Apply(version("v2", "sl-micro")));
    let call = h.call().await;
    assert_eq!(h.since(call.at), Duration::ZERO, "read again at once");
    h.until("v2 known", |h| knows(h, "v2")).await;
    h.version(watcher::Event::Apply(version("v1", "sl-micro")));
    h.no_call_before(INTERVAL - Duration::from_secs(1)).await;
}
