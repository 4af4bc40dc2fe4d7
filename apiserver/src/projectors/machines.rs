//! The machines' projector: every MachineInventory's answer per served architecture (the
//! version it runs, its target, what is pending, its state), kept in the machine hubs.
//!
//! A MachineInventory change recomputes that machine only, with the inputs of its namespace;
//! a change of what every machine reads (versions, channels, channel data, selectors,
//! ManagedOSImages) or a re-list recomputes every machine, one at a time (a pass never holds
//! a second copy of the fleet's answers). The machines gauge is kept from the changes, not
//! counted again from every answer.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use elemental_changelog_apiservice::{
    Arch,
    fleet::MachineInventoryChangelogSummary,
    types::{ChangelogSummary, ObjectMeta},
};
use elemental_changelog_hub::{MachineFacts, Reader, Writer};
use tracing::debug;

use crate::{
    cache::Snapshot,
    channels::crd::ManagedOSVersion,
    fleet::{
        Fleet, FleetIndex, MachineResolution, Orders, Pending,
        crd::{MachineInventory, MachineInventorySelector, ManagedOSImage},
        metrics::FleetMetrics,
        reflect::FleetStores,
    },
    versions::VersionData,
};

/// Machine answers, as the hub keeps them.
pub type Machine = MachineInventoryChangelogSummary;

/// Pending changelog summaries by snapshot generation, `from` and `to`, kept across passes
/// and requests (the machines' projector and the upgrade plans share one).
pub type SummaryCache = quick_cache::sync::Cache<(u64, String, String), Option<ChangelogSummary>>;

/// The channel data a resolution reads: each channel's snapshot for one architecture.
pub(crate) struct Channels {
    pub(crate) snapshots: HashMap<(String, String), Arc<Snapshot>>,
}

impl Orders for Channels {
    fn order(&self, namespace: &str, channel: &str) -> Option<&[String]> {
        self.snapshots
            .get(&(namespace.to_owned(), channel.to_owned()))
            .map(|s| s.data.order())
    }
}

impl Channels {
    pub(crate) fn snapshot(&self, namespace: &str, channel: &str) -> Option<&Arc<Snapshot>> {
        self.snapshots
            .get(&(namespace.to_owned(), channel.to_owned()))
    }
}

/// Everything a resolution of the machines of one namespace (or all) reads, taken once.
pub(crate) struct Inputs {
    pub(crate) versions: Vec<Arc<ManagedOSVersion>>,
    pub(crate) images: Vec<Arc<ManagedOSImage>>,
    pub(crate) selectors: Vec<Arc<MachineInventorySelector>>,
    pub(crate) channels: Channels,
}

impl Inputs {
    pub(crate) fn index(&self) -> FleetIndex<'_> {
        FleetIndex::new(
            self.versions.iter().map(AsRef::as_ref),
            self.images.iter().map(AsRef::as_ref),
            self.selectors.iter().map(AsRef::as_ref),
            Fleet::default(),
            &self.channels,
        )
    }
}

/// Pending changelog summaries, each computed once per request, and kept across requests in
/// the view's [`SummaryCache`] (by snapshot generation).
pub(crate) struct Summaries<'a> {
    pub(crate) here: BTreeMap<Pending, Option<ChangelogSummary>>,
    pub(crate) kept: &'a SummaryCache,
}

impl Summaries<'_> {
    pub(crate) fn of(
        &mut self,
        channels: &Channels,
        pending: &Pending,
    ) -> Option<ChangelogSummary> {
        let kept = self.kept;
        self.here
            .entry(pending.clone())
            .or_insert_with(|| {
                let snapshot = channels.snapshot(&pending.namespace, &pending.channel)?;
                let key = (
                    snapshot.generation().get(),
                    pending.from.clone(),
                    pending.to.clone(),
                );
                kept.get_or_insert_with(&key, || {
                    Ok::<_, std::convert::Infallible>(
                        snapshot
                            .data
                            .changelog(&pending.to, Some(&pending.from))
                            .ok()
                            .map(|c| c.summary),
                    )
                })
                .unwrap_or_else(|never| match never {})
            })
            .clone()
    }
}

/// The summaries of `machines`, handed to `put` one at a time.
pub(crate) fn summarize(
    inputs: &Inputs,
    machines: &[Arc<MachineInventory>],
    kept: &SummaryCache,
    put: &mut dyn FnMut(MachineInventoryChangelogSummary),
) {
    summarize_with(&inputs.index(), inputs, machines, kept, put);
}

/// [`summarize`] with `index`, built from `inputs` already.
fn summarize_with(
    index: &FleetIndex<'_>,
    inputs: &Inputs,
    machines: &[Arc<MachineInventory>],
    kept: &SummaryCache,
    put: &mut dyn FnMut(MachineInventoryChangelogSummary),
) {
    let mut summaries = Summaries {
        here: BTreeMap::new(),
        kept,
    };
    for machine in machines {
        let resolution: MachineResolution = index.machine(machine);
        let summary = resolution
            .pending
            .as_ref()
            .and_then(|p| summaries.of(&inputs.channels, p));
        put(resolution.to_object(machine_meta(machine), summary, None));
    }
}

/// The metadata of the object of `resource` that describes `object`: its name, namespace,
/// resourceVersion, creation time and labels, and a uid of its own
/// ([`identity::uid`](elemental_changelog_apiservice::identity::uid)).
pub(crate) fn meta_of<K: kube::Resource>(resource: &str, object: &K) -> ObjectMeta {
    let meta = object.meta();
    ObjectMeta {
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta
            .uid
            .as_deref()
            .map(|uid| elemental_changelog_apiservice::identity::uid(resource, uid)),
        resource_version: meta.resource_version.clone(),
        creation_timestamp: meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
        labels: meta.labels.clone().unwrap_or_default(),
    }
}

/// A machine's labels are kept in its spec ([`Labels`](crate::fleet::labels::Labels)), not in
/// `metadata.labels`.
pub(crate) fn machine_meta(machine: &MachineInventory) -> ObjectMeta {
    ObjectMeta {
        labels: machine.spec.labels.to_map(),
        ..meta_of(elemental_changelog_apiservice::MACHINE_RESOURCE, machine)
    }
}

pub(crate) fn image_meta(image: &ManagedOSImage) -> ObjectMeta {
    meta_of(elemental_changelog_apiservice::IMAGE_RESOURCE, image)
}

/// Everything a resolution of the machines of `namespace` (or all) for `arch` reads, taken
/// once.
pub(crate) fn inputs(
    data: &VersionData,
    fleet: &FleetStores,
    namespace: Option<&str>,
    arch: &Arch,
) -> Inputs {
    Inputs {
        versions: data.stores.versions.list(namespace),
        images: fleet.images.list(namespace),
        selectors: fleet.selectors.list(namespace),
        channels: Channels {
            snapshots: data.snapshots(namespace, arch),
        },
    }
}

/// Machines by namespace and what the gauge reads of each.
type Counts = BTreeMap<(String, MachineFacts), i64>;

self_cell::self_cell!(
    /// One namespace's inputs for one architecture with their index: what a single machine's
    /// change reads. Building it walks every version of the namespace (2,000 in `make bench`'s
    /// fleet: most of a change's CPU before it was kept), so it is kept while the inputs every
    /// machine reads are unchanged ([`Generation`]).
    struct KeptIndex {
        owner: Inputs,
        #[covariant]
        dependent: FleetIndex,
    }
);

/// The change counters of the inputs every machine reads (channel data, ManagedOSVersions,
/// channels, selectors, ManagedOSImages), read before the inputs are: a store counts a change
/// after applying it, so an index built after reading a generation holds at least what it
/// counted, and a later change makes another generation.
type Generation = [u64; 5];

/// The one writer of the machine hubs.
pub struct MachineProjector {
    writers: BTreeMap<Arch, Writer<Machine>>,
    data: VersionData,
    fleet: FleetStores,
    summaries: Arc<SummaryCache>,
    metrics: Arc<FleetMetrics>,
    /// The architecture the gauge counts, with its reader.
    gauge_arch: Option<(Arch, Reader<Machine>)>,
    counts: Counts,
    /// The kept index of each namespace and architecture single-machine changes read.
    kept: HashMap<(String, Arch), (Generation, KeptIndex)>,
}

impl MachineProjector {
    /// The projector of `writers`, counting the machines of `gauge_arch` in `metrics`.
    pub fn new(
        writers: BTreeMap<Arch, Writer<Machine>>,
        data: VersionData,
        fleet: FleetStores,
        summaries: Arc<SummaryCache>,
        metrics: Arc<FleetMetrics>,
        gauge_arch: Option<Arch>,
    ) -> Self {
        let gauge_arch =
            gauge_arch.and_then(|arch| writers.get(&arch).map(|w| (arch.clone(), w.reader())));
        Self {
            writers,
            data,
            fleet,
            summaries,
            metrics,
            gauge_arch,
            counts: Counts::new(),
            kept: HashMap::new(),
        }
    }

    /// The current [`Generation`] of the shared inputs.
    fn generation(&self) -> Generation {
        [
            self.data.cache.changed(),
            *self.data.stores.versions.changes().borrow(),
            *self.data.stores.channels.changes().borrow(),
            *self.fleet.selectors.changes().borrow(),
            *self.fleet.images.changes().borrow(),
        ]
    }

    /// Waits until the stores it reads have listed.
    pub async fn wait_until_ready(&self) {
        self.data.stores.channels.wait_until_ready().await;
        self.data.stores.versions.wait_until_ready().await;
        self.fleet.machines.wait_until_ready().await;
        self.fleet.selectors.wait_until_ready().await;
        self.fleet.images.wait_until_ready().await;
    }

    /// Counters of the inputs every machine reads, then of the MachineInventories (last).
    pub fn inputs(&self) -> Vec<tokio::sync::watch::Receiver<u64>> {
        vec![
            self.data.cache.changes(),
            self.data.stores.versions.changes(),
            self.data.stores.channels.changes(),
            self.fleet.selectors.changes(),
            self.fleet.images.changes(),
            self.fleet.machines.changes(),
        ]
    }

    /// The MachineInventories changed since the last call.
    pub fn touched(&self) -> crate::reflect::Touched {
        self.fleet.machines.take_touched()
    }

    /// Every machine computed again; returns the number of events.
    pub fn all(&mut self) -> usize {
        // A pass follows a change of the shared inputs: the kept indexes are built again when
        // a machine next changes.
        self.kept.clear();
        let machines = self.fleet.machines.list(None);
        let mut events = 0;
        for (arch, writer) in &mut self.writers {
            let inputs = inputs(&self.data, &self.fleet, None, arch);
            let mut sweep = writer.sweep(None);
            summarize(&inputs, &machines, &self.summaries, &mut |m| sweep.put(m));
            events += sweep.finish();
        }
        self.recount();
        debug!(events, machines = machines.len(), "every machine computed");
        events
    }

    /// The machines `keys` (namespace, name) computed again, with the inputs of their
    /// namespace only; returns the number of events.
    pub fn some(&mut self, keys: &BTreeSet<(String, String)>) -> usize {
        let mut by_namespace: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (namespace, name) in keys {
            by_namespace.entry(namespace).or_default().push(name);
        }
        let mut events = 0;
        let generation = self.generation();
        for (namespace, names) in by_namespace {
            let before = self.facts(namespace, &names);
            let (present, gone): (Vec<_>, Vec<_>) = names
                .iter()
                .map(|name| (*name, self.fleet.machines.get(namespace, name)))
                .partition(|(_, m)| m.is_some());
            let present: Vec<Arc<MachineInventory>> =
                present.into_iter().filter_map(|(_, m)| m).collect();
            for (arch, writer) in &mut self.writers {
                let key = (namespace.to_owned(), arch.clone());
                let stale = self.kept.get(&key).is_none_or(|(g, _)| *g != generation);
                if stale {
                    let inputs = inputs(&self.data, &self.fleet, Some(namespace), arch);
                    let index = KeptIndex::new(inputs, Inputs::index);
                    self.kept.insert(key.clone(), (generation, index));
                }
                let Some((_, index)) = self.kept.get(&key) else {
                    continue;
                };
                summarize_with(
                    index.borrow_dependent(),
                    index.borrow_owner(),
                    &present,
                    &self.summaries,
                    &mut |m| {
                        let meta = &m.metadata;
                        let (ns, name) = (meta.namespace.clone(), meta.name.clone());
                        events += usize::from(writer.set(&ns, &name, Some(m)));
                    },
                );
                for (name, _) in &gone {
                    events += usize::from(writer.set(namespace, name, None));
                }
            }
            let after = self.facts(namespace, &names);
            self.count(namespace, &before, -1);
            self.count(namespace, &after, 1);
        }
        self.publish_counts();
        debug!(events, machines = keys.len(), "machines computed");
        events
    }

    /// What the gauge reads of the kept answers of `names` in `namespace`.
    fn facts(&self, namespace: &str, names: &[&str]) -> Vec<MachineFacts> {
        let Some((_, reader)) = &self.gauge_arch else {
            return Vec::new();
        };
        names
            .iter()
            .filter_map(|name| reader.get(namespace, name).map(|i| i.facts))
            .collect()
    }

    fn count(&mut self, namespace: &str, facts: &[MachineFacts], by: i64) {
        for f in facts {
            let n = self.counts.entry((namespace.to_owned(), *f)).or_default();
            *n += by;
            if *n == 0 {
                self.counts.remove(&(namespace.to_owned(), *f));
            }
        }
    }

    /// Counts every kept answer again (after a pass over all).
    fn recount(&mut self) {
        self.counts.clear();
        if let Some((_, reader)) = &self.gauge_arch {
            for item in reader.list(None).iter() {
                *self
                    .counts
                    .entry((item.namespace().to_owned(), item.facts))
                    .or_default() += 1;
            }
        }
        self.publish_counts();
    }

    fn publish_counts(&self) {
        let gauge = self
            .counts
            .iter()
            .map(|((namespace, facts), n)| {
                let severity = facts
                    .severity
                    .map_or_else(|| "none".to_owned(), |s| crate::fleet::wire(&s));
                (
                    (
                        namespace.clone(),
                        crate::fleet::wire(&facts.state),
                        severity,
                    ),
                    *n,
                )
            })
            .collect();
        self.metrics.set_machines(&gauge);
    }
}
