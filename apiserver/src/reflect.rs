//! Reflectors: every watch of this server (channels and versions; the fleet view's machines,
//! selectors and images) runs through one driver, [`watch()`], into [`Stores`].
//!
//! A kind is watched with one watch for all namespaces, or one per watched namespace, each
//! feeding its own store (one store fed by several watches would be wiped by each watch's
//! re-list). Each watch is renewed every [`WATCH_TIMEOUT_SECONDS`], retried with kube-runtime's
//! default backoff, counted in the watch metrics, and its objects may be trimmed before they
//! are stored. A kind marked [`Kind::optional`] whose CRD is not installed (its list answers
//! 404) counts as empty and synced, and is listed again every [`CRD_RECHECK`], so its objects
//! appear once the CRD does; any other kind stays unsynced until its list succeeds.
//!
//! Readiness is published on a tokio `watch` channel that any number of tasks may wait on
//! ([`Stores::wait_until_ready`]). kube-runtime's own `Store::wait_until_ready` wakes only the
//! task that polled it last (its `DelayedInit` shares one oneshot receiver, which keeps one
//! waker), so a channel worker and the controller waiting at once left one of them asleep
//! forever and a restarted server never became ready; it is not used. Nor is its `Store`:
//! objects are kept in this module's own `store` (`reflect/store.rs`), by namespace and name
//! (see there why).

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt as _, future::BoxFuture};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use prometheus::{IntCounterVec, IntGaugeVec};
use tokio::sync::watch;
use tracing::{Instrument, debug, info_span, warn};

use crate::metrics::family;

mod store;

use store::{Store, Writer};

/// Seconds a watch lasts before it is renewed. kube-rs ends a watch whose connection
/// went silent only after its timeout (290 s by default) plus a margin; a shorter one
/// bounds how long a half-open connection (peer or NAT state lost, no reset) can hide
/// changes, at the cost of one watch request per minute per kind.
pub const WATCH_TIMEOUT_SECONDS: u32 = 60;

/// Pause before listing again an optional kind whose CRD is missing. The watcher's own
/// backoff restarts at each attempt (each emits `Init` before its list fails), which would
/// list every second.
pub const CRD_RECHECK: Duration = Duration::from_secs(30);

/// Objects per page of a list, unless a kind says otherwise (kube-runtime's default).
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// The watch settings of every watch of this server.
pub fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS)
}

/// Reflector stores for one kind: one store for all namespaces, or one per watched
/// namespace, and whether every one of them has listed.
#[derive(Clone)]
pub struct Stores<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    all: Option<Store<K>>,
    namespaced: BTreeMap<String, Store<K>>,
    /// True once every store has listed (or, for an optional kind, found its CRD missing).
    synced: watch::Receiver<bool>,
    /// Counts the changes of any store (objects applied or deleted, lists completed).
    changes: watch::Receiver<u64>,
    /// Which objects changed since [`Stores::take_touched`] was last called.
    sync: Arc<SyncCount>,
}

/// The objects of a kind that changed, by namespace and name, since they were last taken
/// ([`Stores::take_touched`]): each key once however often it changed (a burst of changes of
/// one object is one entry), so bounded by the number of objects.
#[derive(Debug, Default)]
pub struct Touched {
    /// Objects applied or deleted.
    pub keys: std::collections::BTreeSet<(String, String)>,
    /// A list replaced a store (first list or re-list): any object may have changed.
    pub relisted: bool,
}

impl<K> Stores<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Empty stores for `namespaces` (none: one store for all namespaces), with the feeder of
    /// each store.
    pub fn new(namespaces: &[String]) -> (Self, Vec<Feeder<K>>) {
        let wanted: Vec<Option<String>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().cloned().map(Some).collect()
        };
        let (tx, synced) = watch::channel(false);
        let (changed, changes) = watch::channel(0u64);
        let sync = Arc::new(SyncCount {
            left: AtomicUsize::new(wanted.len()),
            synced: tx,
            changed,
            touched: std::sync::Mutex::new(None),
        });
        let mut all = None;
        let mut namespaced = BTreeMap::new();
        let mut feeders = Vec::new();
        for namespace in wanted {
            let (store, writer) = Writer::new();
            match &namespace {
                Some(ns) => {
                    namespaced.insert(ns.clone(), store);
                }
                None => all = Some(store),
            }
            feeders.push(Feeder {
                namespace,
                writer,
                sync: sync.clone(),
                counted: false,
            });
        }
        let stores = Self {
            all,
            namespaced,
            synced,
            changes,
            sync,
        };
        (stores, feeders)
    }

    /// One empty store for all namespaces and its feeder (tests feed it by hand).
    pub fn single() -> (Self, Feeder<K>) {
        let (stores, mut feeders) = Self::new(&[]);
        let feeder = feeders
            .pop()
            .unwrap_or_else(|| unreachable!("Stores::new(&[]) makes one store"));
        (stores, feeder)
    }

    /// The object `namespace/name`, if watched and present.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let store = self
            .all
            .as_ref()
            .or_else(|| self.namespaced.get(namespace))?;
        store.get(namespace, name)
    }

    /// Every object, in `namespace` or in all watched namespaces, by namespace and name.
    pub fn list(&self, namespace: Option<&str>) -> Vec<Arc<K>> {
        let mut out = Vec::new();
        match (&self.all, namespace) {
            (Some(all), namespace) => all.list_into(namespace, &mut out),
            (None, Some(ns)) => {
                if let Some(store) = self.namespaced.get(ns) {
                    store.list_into(Some(ns), &mut out);
                }
            }
            // One store per namespace, walked in the order of their namespaces.
            (None, None) => {
                for store in self.namespaced.values() {
                    store.list_into(None, &mut out);
                }
            }
        }
        out
    }

    /// A receiver told of every change of any store of this kind.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The objects changed since the last call. The first call starts the tracking and says
    /// `relisted` (before it, nothing was tracked).
    pub fn take_touched(&self) -> Touched {
        let mut touched = self
            .sync
            .touched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match touched.replace(Touched::default()) {
            Some(taken) => taken,
            None => Touched {
                relisted: true,
                ..Touched::default()
            },
        }
    }

    /// Whether `namespace` is watched at all.
    pub fn watches(&self, namespace: &str) -> bool {
        self.all.is_some() || self.namespaced.contains_key(namespace)
    }

    /// Waits until every store has listed; any number of tasks may wait at once.
    pub async fn wait_until_ready(&self) {
        let mut synced = self.synced.clone();
        // The feeders' counter lives as long as the stores; an error means they are gone.
        let _ = synced.wait_for(|synced| *synced).await;
    }
}

/// How many stores of one kind have not listed yet.
struct SyncCount {
    left: AtomicUsize,
    synced: watch::Sender<bool>,
    /// Bumped at every change of a store.
    changed: watch::Sender<u64>,
    /// What changed, once someone takes it ([`Stores::take_touched`]).
    touched: std::sync::Mutex<Option<Touched>>,
}

/// The write side of one store: applies watch events, and counts the store synced at its
/// first completed list.
pub struct Feeder<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    /// The namespace of the store; `None`: all namespaces.
    namespace: Option<String>,
    writer: Writer<K>,
    sync: Arc<SyncCount>,
    /// Whether this store was counted synced already (re-lists are not counted again).
    counted: bool,
}

impl<K> Feeder<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// Applies `event` to the store; the end of its first list makes it synced.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        self.writer.apply(event);
        if matches!(event, watcher::Event::InitDone) {
            self.mark_synced();
        }
        self.touch(event);
        if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
            self.sync.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Records which object `event` changed, while someone takes them.
    fn touch(&self, event: &watcher::Event<K>) {
        let mut touched = self
            .sync
            .touched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(touched) = touched.as_mut() else {
            return;
        };
        match event {
            watcher::Event::Apply(object) | watcher::Event::Delete(object) => {
                let meta = object.meta();
                touched.keys.insert((
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                ));
            }
            watcher::Event::InitDone => touched.relisted = true,
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    /// Counts the store synced (once).
    fn mark_synced(&mut self) {
        if !std::mem::replace(&mut self.counted, true)
            && self.sync.left.fetch_sub(1, Ordering::AcqRel) == 1
        {
            self.sync.synced.send_replace(true);
        }
    }
}

family! {
    /// What the watches count (this module's, the channel history's and the authentication
    /// ConfigMap's).
    pub struct WatchMetrics {
        errors: IntCounterVec = metric(
            "watch_errors_total",
            "Errors of the watches on the Kubernetes API, by watched resource; each is retried with backoff.",
            &["resource"],
        ),
        synced: IntGaugeVec = metric(
            "watch_synced",
            "1 when the watch of a resource has completed its initial list.",
            &["resource"],
        ),
    }
}

impl WatchMetrics {
    /// Counts a watch error of `resource`.
    pub fn watch_error(&self, resource: WatchedResource) {
        self.errors.with_label_values(&[resource.as_str()]).inc();
    }

    /// Records whether the watch of `resource` has synced.
    pub fn watch_synced(&self, resource: WatchedResource, synced: bool) {
        self.synced
            .with_label_values(&[resource.as_str()])
            .set(i64::from(synced));
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

/// What is watched of one kind.
pub struct Kind<K> {
    /// The kind's label in the watch metrics and logs.
    pub resource: WatchedResource,
    /// Applied to every object before it is stored (drops what is never read).
    pub trim: fn(&mut K),
    /// Whether the kind's CRD may be missing (see the module documentation).
    pub optional: bool,
    /// Objects per page of a list ([`DEFAULT_PAGE_SIZE`] unless [`Kind::paged`]).
    pub page_size: u32,
}

impl<K> Kind<K> {
    /// A required kind, stored whole.
    pub fn required(resource: WatchedResource) -> Self {
        Self {
            resource,
            trim: |_| {},
            optional: false,
            page_size: DEFAULT_PAGE_SIZE,
        }
    }

    /// An optional kind, trimmed by `trim`.
    pub fn optional(resource: WatchedResource, trim: fn(&mut K)) -> Self {
        Self {
            resource,
            trim,
            optional: true,
            page_size: DEFAULT_PAGE_SIZE,
        }
    }

    /// Trims each object with `trim` before it is stored.
    pub fn trimmed(self, trim: fn(&mut K)) -> Self {
        Self { trim, ..self }
    }

    /// Lists the kind in pages of `page_size` objects.
    pub fn paged(self, page_size: u32) -> Self {
        Self { page_size, ..self }
    }
}

/// Starts watching `kind` in `namespaces` (none: all): pushes one driver per watch onto
/// `drivers` (each ends only if its watch stream does, which the caller treats as fatal) and
/// returns the stores they feed. `on_event` sees every event after it is stored.
pub fn watch<K>(
    client: &Client,
    namespaces: &[String],
    kind: Kind<K>,
    metrics: &Arc<WatchMetrics>,
    drivers: &mut Vec<BoxFuture<'static, ()>>,
    on_event: impl Fn(&watcher::Event<K>) + Clone + Send + Sync + 'static,
) -> Stores<K>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let Kind {
        resource,
        trim,
        optional,
        page_size,
    } = kind;
    let (stores, feeders) = Stores::new(namespaces);
    for feeder in feeders {
        let namespace = feeder.namespace.clone();
        let api: Api<K> = match &namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let metrics = metrics.clone();
        let on_event = on_event.clone();
        let span = info_span!(
            "watch",
            resource = resource.as_str(),
            namespace = namespace.as_deref().unwrap_or("*")
        );
        let stream = watcher(api, watch_config().page_size(page_size))
            .default_backoff()
            .map_ok(move |event| event.modify(trim));
        drivers.push(Box::pin(
            drive(stream, feeder, resource, optional, metrics, on_event).instrument(span),
        ));
    }
    stores
}

/// Feeds `feeder` from one watch `stream` of `resource`, counting in the watch metrics and
/// telling `on_event` of every event once it is stored, until the stream ends (it does not:
/// it retries with backoff). An `optional` kind whose CRD is missing is synced and empty.
async fn drive<K>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    mut feeder: Feeder<K>,
    resource: WatchedResource,
    optional: bool,
    metrics: Arc<WatchMetrics>,
    on_event: impl Fn(&watcher::Event<K>),
) where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    metrics.watch_synced(resource, false);
    let mut missing_logged = false;
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                feeder.apply_watcher_event(&event);
                if matches!(event, watcher::Event::InitDone) {
                    metrics.watch_synced(resource, true);
                    debug!("initial list done");
                    missing_logged = false;
                }
                on_event(&event);
            }
            Err(error) if optional && crd_missing(&error) => {
                // No CRD: nothing of this kind exists. Synced, and listed again
                // every 30 s so the objects appear once it is installed.
                if !missing_logged {
                    warn!(
                        resource = resource.as_str(),
                        "the CRD is not installed (the list answers 404); treated as empty and listed again every 30 s"
                    );
                    missing_logged = true;
                }
                feeder.mark_synced();
                tokio::time::sleep(CRD_RECHECK).await;
            }
            Err(error) => {
                metrics.watch_error(resource);
                warn!(%error, "watch failed; retrying with backoff");
            }
        }
    }
    warn!("watch stream ended");
}

/// Whether a watch error says the kind does not exist (its CRD is not installed).
fn crd_missing(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => {
            // An unknown resource answers a bare `404 page not found`, without a Status.
            status.code == 404
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::Status;
    use tokio::time::timeout;

    use super::*;

    fn object(name: &str) -> ConfigMap {
        in_namespace("ns", name, "1")
    }

    fn in_namespace(namespace: &str, name: &str, resource_version: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(name.to_owned());
        object.metadata.namespace = Some(namespace.to_owned());
        object.metadata.resource_version = Some(resource_version.to_owned());
        object
    }

    /// `namespace/name@resourceVersion` of each object of `list`.
    fn keys(list: &[Arc<ConfigMap>]) -> Vec<String> {
        list.iter()
            .map(|o| {
                format!(
                    "{}/{}@{}",
                    o.metadata.namespace.as_deref().unwrap_or_default(),
                    o.metadata.name.as_deref().unwrap_or_default(),
                    o.metadata.resource_version.as_deref().unwrap_or_default()
                )
            })
            .collect()
    }

    fn list(feeder: &mut Feeder<ConfigMap>, objects: &[ConfigMap]) {
        feeder.apply_watcher_event(&watcher::Event::Init);
        for object in objects {
            feeder.apply_watcher_event(&watcher::Event::InitApply(object.clone()));
        }
        feeder.apply_watcher_event(&watcher::Event::InitDone);
    }

    /// Objects are listed by namespace and name, whatever order they came in; an applied
    /// object replaces the one of its namespace and name; a deleted one is gone.
    #[test]
    fn objects_by_namespace_and_name() {
        let (stores, mut feeder) = Stores::<ConfigMap>::single();
        list(
            &mut feeder,
            &[
                in_namespace("b", "x", "1"),
                in_namespace("a", "y", "2"),
                in_namespace("a", "x", "3"),
                in_namespace("b", "a", "4"),
            ],
        );
        assert_eq!(
            keys(&stores.list(None)),
            ["a/x@3", "a/y@2", "b/a@4", "b/x@1"]
        );
        assert_eq!(keys(&stores.list(Some("b"))), ["b/a@4", "b/x@1"]);
        assert!(stores.list(Some("c")).is_empty());

        let mut changes = stores.changes();
        feeder.apply_watcher_event(&watcher::Event::Apply(in_namespace("a", "y", "5")));
        feeder.apply_watcher_event(&watcher::Event::Apply(in_namespace("c", "n", "6")));
        feeder.apply_watcher_event(&watcher::Event::Delete(in_namespace("b", "a", "4")));
        feeder.apply_watcher_event(&watcher::Event::Delete(in_namespace("b", "x", "1")));
        // Deleting what is not there changes nothing in the store.
        feeder.apply_watcher_event(&watcher::Event::Delete(in_namespace("d", "z", "7")));
        assert!(changes.has_changed().unwrap(), "every event is counted");
        changes.mark_unchanged();
        assert_eq!(keys(&stores.list(None)), ["a/x@3", "a/y@5", "c/n@6"]);
        assert!(stores.list(Some("b")).is_empty());
        assert_eq!(
            stores
                .get("a", "y")
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("5")
        );
        assert!(stores.get("b", "a").is_none());
        assert!(stores.get("a", "n").is_none(), "names are per namespace");
    }

    /// A re-list replaces the objects only when it ends: until `InitDone` the old objects are
    /// seen (not the listed ones); then the listed ones, and those not listed again are gone.
    #[test]
    fn a_relist_replaces_the_objects_when_it_ends() {
        let (stores, mut feeder) = Stores::<ConfigMap>::single();
        list(&mut feeder, &[object("kept"), object("gone")]);
        let mut changes = stores.changes();
        changes.mark_unchanged();
        feeder.apply_watcher_event(&watcher::Event::Init);
        feeder.apply_watcher_event(&watcher::Event::InitApply(in_namespace("ns", "kept", "2")));
        feeder.apply_watcher_event(&watcher::Event::InitApply(object("new")));
        assert_eq!(keys(&stores.list(None)), ["ns/gone@1", "ns/kept@1"]);
        assert!(stores.get("ns", "new").is_none());
        assert!(!changes.has_changed().unwrap(), "the list has not ended");
        feeder.apply_watcher_event(&watcher::Event::InitDone);
        assert!(changes.has_changed().unwrap());
        assert_eq!(keys(&stores.list(None)), ["ns/kept@2", "ns/new@1"]);
        assert!(stores.get("ns", "gone").is_none());
        // An empty re-list empties the store.
        list(&mut feeder, &[]);
        assert!(stores.list(None).is_empty());
    }

    /// Stores of several namespaces list each namespace's objects from its own store, and all
    /// of them by namespace and name.
    #[test]
    fn stores_per_namespace_list_in_order() {
        let (stores, mut feeders) = Stores::<ConfigMap>::new(&["b".to_owned(), "a".to_owned()]);
        for feeder in &mut feeders {
            let namespace = feeder.namespace.clone().unwrap();
            list(
                feeder,
                &[
                    in_namespace(&namespace, "y", "1"),
                    in_namespace(&namespace, "x", "1"),
                ],
            );
        }
        assert_eq!(
            keys(&stores.list(None)),
            ["a/x@1", "a/y@1", "b/x@1", "b/y@1"]
        );
        assert_eq!(keys(&stores.list(Some("b"))), ["b/x@1", "b/y@1"]);
        assert!(stores.list(Some("c")).is_empty());
        assert!(stores.get("a", "x").is_some() && stores.get("c", "x").is_none());
    }

    /// Every task waiting for the stores to sync wakes when they do: a channel worker and the
    /// controller wait at once at start (kube-runtime's own `Store::wait_until_ready` woke only
    /// the last of them, and a restarted server never became ready).
    #[tokio::test(start_paused = true)]
    async fn every_waiter_wakes_when_the_stores_sync() {
        let (stores, mut feeder) = Stores::<ConfigMap>::single();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let stores = stores.clone();
                tokio::spawn(async move { stores.wait_until_ready().await })
            })
            .collect();
        // Every waiter is parked before the list ends.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "nothing listed yet"
        );
        feeder.apply_watcher_event(&watcher::Event::Init);
        feeder.apply_watcher_event(&watcher::Event::InitApply(object("a")));
        feeder.apply_watcher_event(&watcher::Event::InitDone);
        for (index, waiter) in waiters.into_iter().enumerate() {
            timeout(Duration::from_secs(3600), waiter)
                .await
                .unwrap_or_else(|_| panic!("waiter {index} never woke"))
                .unwrap_or_else(|e| panic!("waiter {index}: {e}"));
        }
        assert!(stores.get("ns", "a").is_some());
    }

    /// Stores of several namespaces are synced when every one has listed, once each: a
    /// re-list of one does not count for another.
    #[tokio::test(start_paused = true)]
    async fn synced_when_every_namespace_listed() {
        let (stores, mut feeders) = Stores::<ConfigMap>::new(&["a".to_owned(), "b".to_owned()]);
        assert_eq!(feeders[1].namespace.as_deref(), Some("b"));
        for _ in 0..2 {
            feeders[0].apply_watcher_event(&watcher::Event::Init);
            feeders[0].apply_watcher_event(&watcher::Event::InitDone);
        }
        assert!(!*stores.synced.borrow(), "b has not listed");
        feeders[1].apply_watcher_event(&watcher::Event::Init);
        feeders[1].apply_watcher_event(&watcher::Event::InitDone);
        assert!(*stores.synced.borrow());
        assert!(stores.watches("a") && stores.watches("b") && !stores.watches("c"));
    }

    #[test]
    fn a_missing_crd_is_a_bare_404_on_list_or_watch() {
        let api = |code: u16, reason: &str| {
            kube::Error::Api(Box::new(
                Status::failure("404 page not found", reason).with_code(code),
            ))
        };
        assert!(crd_missing(&watcher::Error::InitialListFailed(api(
            404, ""
        ))));
        assert!(crd_missing(&watcher::Error::WatchStartFailed(api(
            404, "NotFound"
        ))));
        assert!(!crd_missing(&watcher::Error::InitialListFailed(api(
            403,
            "Forbidden"
        ))));
        assert!(!crd_missing(&watcher::Error::WatchFailed(api(404, ""))));
    }
}
