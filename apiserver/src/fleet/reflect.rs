//! What the fleet view watches: MachineInventories, MachineInventorySelectors and
//! ManagedOSImages of the watched namespaces, trimmed to what the resolution reads, through
//! the server's one watch driver ([`crate::reflect`]).
//!
//! The three kinds are optional: a kind whose CRD is not installed (no elemental-operator, or
//! one too old to have it) is treated as empty, logged once, counts as synced for readiness,
//! and is listed again every 30 s, so the objects appear once the CRD does. The
//! ManagedOSVersion kinds are different: without them the server has nothing to serve and
//! stays unready.

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::{Client, runtime::watcher};
use tokio::sync::watch;
use tracing::warn;

use super::crd::{MachineInventory, MachineInventorySelector, ManagedOSImage};
use crate::{
    health::Health,
    reflect::{self, Kind, Stores, WatchMetrics, WatchedResource},
};

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

/// Starts the fleet reflectors (one watch per namespace and kind, or one per kind for all
/// namespaces) and registers the readiness check `fleet-informer-sync`. Returns the stores
/// and the future that runs the watches (it ends only if one stops, which is fatal).
pub fn start(
    client: &Client,
    namespaces: &[String],
    metrics: &Arc<WatchMetrics>,
    health: &Health,
) -> (FleetStores, BoxFuture<'static, ()>) {
    let (tx, changes) = watch::channel(0u64);
    let tx = Arc::new(tx);
    let mut drivers: Vec<BoxFuture<'static, ()>> = Vec::new();
    let machines = reflect::watch(
        client,
        namespaces,
        Kind::optional(WatchedResource::MachineInventories, trim_machine),
        metrics,
        &mut drivers,
        count_changes(&tx),
    );
    let selectors = reflect::watch(
        client,
        namespaces,
        Kind::optional(WatchedResource::MachineInventorySelectors, trim_selector),
        metrics,
        &mut drivers,
        count_changes(&tx),
    );
    let images = reflect::watch(
        client,
        namespaces,
        Kind::optional(WatchedResource::ManagedOsImages, trim_image),
        metrics,
        &mut drivers,
        count_changes(&tx),
    );
    let synced = health.ready_flag("fleet-informer-sync");
    let stores = FleetStores {
        machines,
        selectors,
        images,
        changes,
    };
    drivers.push(Box::pin({
        let stores = stores.clone();
        async move {
            stores.machines.wait_until_ready().await;
            stores.selectors.wait_until_ready().await;
            stores.images.wait_until_ready().await;
            synced.set();
            // Ends only with the process, as every driver does.
            std::future::pending::<()>().await;
        }
    }));
    let run = async move {
        let mut all: futures::stream::FuturesUnordered<_> = drivers.into_iter().collect();
        if futures::StreamExt::next(&mut all).await.is_some() {
            warn!("a fleet watch stopped");
        }
    };
    (stores, Box::pin(run))
}

/// Tells `changes` of every change of an object (not of the objects of a list, which end
/// with `InitDone`).
fn count_changes<K>(
    changes: &Arc<watch::Sender<u64>>,
) -> impl Fn(&watcher::Event<K>) + Clone + Send + Sync + 'static {
    let changes = changes.clone();
    move |event| {
        if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
            changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

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
