//! The reflectors of the fleet view: MachineInventories, MachineInventorySelectors and
//! ManagedOSImages of the watched namespaces, trimmed to what the resolution reads.
//!
//! A kind whose CRD is not installed (no elemental-operator, or one too old to have it) is
//! treated as empty: its list answers 404, which is logged once, counts as synced for
//! readiness, and is retried every 30 s, so the objects appear once the CRD does. The
//! ManagedOSVersion kinds are different: without them the server has nothing to serve and
//! stays unready.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::sync::watch;
use tracing::{Instrument, debug, info_span, warn};

use super::crd::{MachineInventory, MachineInventorySelector, ManagedOSImage};
use crate::{
    channels::{Stores, watch_config},
    health::{Health, ReadyFlag},
    metrics::{Metrics, WatchedResource},
};

/// Pause before listing again a kind whose CRD is missing. The watcher's own backoff restarts
/// at each attempt (each emits `Init` before its list fails), which would list every second.
const CRD_RECHECK: Duration = Duration::from_secs(30);

/// Prefix of the annotations a machine's OS is reported in (see [`super::os`]).
const OS_ANNOTATION_PREFIX: &str = "elemental.cattle.io/os.";

/// The read side of the fleet reflectors.
#[derive(Clone)]
pub struct FleetStores {
    /// MachineInventories: metadata (name, namespace, uid, resourceVersion, creation, labels,
    /// `elemental.cattle.io/os.*` annotations, owner references) only.
    pub machines: Stores<MachineInventory>,
    /// MachineInventorySelectors: labels and owner references only.
    pub selectors: Stores<MachineInventorySelector>,
    /// ManagedOSImages: spec fields read, labels, owner references.
    pub images: Stores<ManagedOSImage>,
    changes: watch::Receiver<u64>,
}

impl FleetStores {
    /// A receiver told of every change of a fleet object.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }
}

/// What a MachineInventory keeps: no managedFields, no annotations but the OS ones, no spec
/// or status (the typed spec is empty; status is not deserialized).
fn trim_machine(m: &mut MachineInventory) {
    m.metadata.managed_fields = None;
    m.metadata.finalizers = None;
    if let Some(annotations) = &mut m.metadata.annotations {
        annotations.retain(|k, _| k.starts_with(OS_ANNOTATION_PREFIX));
    }
}

fn trim_selector(s: &mut MachineInventorySelector) {
    s.metadata.managed_fields = None;
    s.metadata.finalizers = None;
    s.metadata.annotations = None;
}

fn trim_image(i: &mut ManagedOSImage) {
    i.metadata.managed_fields = None;
    i.metadata.finalizers = None;
    i.metadata.annotations = None;
}

/// Counts the watches still to sync; sets the readiness flag when none is left.
struct Syncing {
    left: AtomicUsize,
    flag: ReadyFlag,
}

impl Syncing {
    fn one_done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.flag.set();
        }
    }
}

/// Starts the fleet reflectors (one watch per namespace and kind, or one per kind for all
/// namespaces) and registers the readiness check `fleet-informer-sync`. Returns the stores
/// and the future that runs the watches (it ends only if one stops, which is fatal).
pub fn start(
    client: &Client,
    namespaces: &[String],
    metrics: &Arc<Metrics>,
    health: &Health,
) -> (FleetStores, BoxFuture<'static, ()>) {
    let per_kind = namespaces.len().max(1);
    let syncing = Arc::new(Syncing {
        left: AtomicUsize::new(3 * per_kind),
        flag: health.ready_flag("fleet-informer-sync"),
    });
    let (tx, changes) = watch::channel(0u64);
    let tx = Arc::new(tx);
    let mut drivers: Vec<BoxFuture<'static, ()>> = Vec::new();
    let machines = watch_trimmed(
        client,
        namespaces,
        WatchedResource::MachineInventories,
        trim_machine,
        &Ctx::new(metrics, &syncing, &tx),
        &mut drivers,
    );
    let selectors = watch_trimmed(
        client,
        namespaces,
        WatchedResource::MachineInventorySelectors,
        trim_selector,
        &Ctx::new(metrics, &syncing, &tx),
        &mut drivers,
    );
    let images = watch_trimmed(
        client,
        namespaces,
        WatchedResource::ManagedOsImages,
        trim_image,
        &Ctx::new(metrics, &syncing, &tx),
        &mut drivers,
    );
    let run = async move {
        let mut all: futures::stream::FuturesUnordered<_> = drivers.into_iter().collect();
        if all.next().await.is_some() {
            warn!("a fleet watch stopped");
        }
    };
    (
        FleetStores {
            machines,
            selectors,
            images,
            changes,
        },
        Box::pin(run),
    )
}

#[derive(Clone)]
struct Ctx {
    metrics: Arc<Metrics>,
    syncing: Arc<Syncing>,
    changes: Arc<watch::Sender<u64>>,
}

impl Ctx {
    fn new(
        metrics: &Arc<Metrics>,
        syncing: &Arc<Syncing>,
        changes: &Arc<watch::Sender<u64>>,
    ) -> Self {
        Self {
            metrics: metrics.clone(),
            syncing: syncing.clone(),
            changes: changes.clone(),
        }
    }
}

fn watch_trimmed<K>(
    client: &Client,
    namespaces: &[String],
    label: WatchedResource,
    trim: fn(&mut K),
    ctx: &Ctx,
    drivers: &mut Vec<BoxFuture<'static, ()>>,
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
    let apis: Vec<(Option<String>, Api<K>)> = if namespaces.is_empty() {
        vec![(None, Api::all(client.clone()))]
    } else {
        namespaces
            .iter()
            .map(|ns| (Some(ns.clone()), Api::namespaced(client.clone(), ns)))
            .collect()
    };
    let mut all = None;
    let mut namespaced = BTreeMap::new();
    for (namespace, api) in apis {
        let (store, writer) = reflector::store();
        match &namespace {
            Some(ns) => {
                namespaced.insert(ns.clone(), store);
            }
            None => all = Some(store),
        }
        let ctx = ctx.clone();
        let span = info_span!(
            "watch",
            resource = label.as_str(),
            namespace = namespace.as_deref().unwrap_or("*")
        );
        let stream = reflector::reflector(
            writer,
            watcher(api, watch_config()).default_backoff().modify(trim),
        );
        drivers.push(Box::pin(
            async move {
                ctx.metrics.watch_synced(label, false);
                let synced = AtomicBool::new(false);
                let mark_synced = || {
                    if !synced.swap(true, Ordering::AcqRel) {
                        ctx.syncing.one_done();
                    }
                };
                let mut missing_logged = false;
                let mut stream = std::pin::pin!(stream);
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(event) => {
                            if matches!(event, watcher::Event::InitDone) {
                                ctx.metrics.watch_synced(label, true);
                                debug!("initial list done");
                                mark_synced();
                                missing_logged = false;
                            }
                            if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                                ctx.changes.send_modify(|n| *n = n.wrapping_add(1));
                            }
                        }
                        Err(error) if crd_missing(&error) => {
                            // No CRD: nothing of this kind exists. Ready, and retried every
                            // 30 s so the objects appear once it is installed.
                            if !missing_logged {
                                warn!(resource = label.as_str(), "the CRD is not installed (the list answers 404); the fleet view treats it as empty and lists it again every 30 s");
                                missing_logged = true;
                            }
                            mark_synced();
                            tokio::time::sleep(CRD_RECHECK).await;
                        }
                        Err(error) => {
                            ctx.metrics.watch_error(label);
                            warn!(%error, "watch failed; retrying with backoff");
                        }
                    }
                }
                warn!("watch stream ended");
            }
            .instrument(span),
        ));
    }
    Stores::from_stores(all, namespaced)
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
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::core::Status;

    use super::*;

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

    #[test]
    fn machines_keep_only_what_is_read() {
        let mut m = MachineInventory::new("m", Default::default());
        m.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        m.metadata.annotations = Some(BTreeMap::from([
            ("elemental.cattle.io/os.image".to_owned(), "x:1".to_owned()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                "{}".to_owned(),
            ),
        ]));
        m.metadata.labels = Some(BTreeMap::from([("pool".to_owned(), "a".to_owned())]));
        trim_machine(&mut m);
        assert_eq!(m.metadata.managed_fields, None);
        assert_eq!(
            m.metadata
                .annotations
                .unwrap()
                .into_keys()
                .collect::<Vec<_>>(),
            ["elemental.cattle.io/os.image"]
        );
        assert_eq!(m.metadata.labels.unwrap().len(), 1);
    }
}
