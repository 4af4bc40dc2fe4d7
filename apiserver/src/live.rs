//! Answers computed when their inputs change: the summary of every ManagedOSVersion and of
//! every machine (MachineInventory), per served architecture, kept in a [`Hub`] each, from
//! which lists, gets and watches are served.
//!
//! One task per resource recomputes the answers when an input changes (a version or channel
//! applied or deleted, channel data published by the channel controller, a fleet object
//! changed), at most every [`MIN_INTERVAL`] so that a burst of changes is one pass, on a
//! blocking thread; the hub turns what changed into events. Requests never resolve a machine
//! or look a version up for a list: they copy the kept bytes. The machines gauge is counted
//! from the kept answers after each pass.
//!
//! Reads are as fresh as the inputs this replica has seen ([`Live::fresh`]): a request waits
//! (without the burst delay) for the pass that includes every input change seen before it, as
//! kube-apiserver's consistent reads from its watch cache wait for the cache, so a read right
//! after a change of a ManagedOSImage or a MachineInventory sees it.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use elemental_changelog_apiservice::{
    Arch, fleet::MachineInventoryChangelogSummary, types::ManagedOSVersionChangelogSummary,
};
use tokio::sync::watch;
use tracing::debug;

use crate::{
    fleet::metrics::FleetMetrics,
    health::ReadyFlag,
    routes::{
        fleet::{FleetView, wire},
        resources::Resources,
    },
    watch::{Clock, Hub, Item, Object, ResourceVersion},
};

/// Shortest time between two passes over a resource's answers: the changes of a burst
/// (an operator re-sync creating hundreds of versions) are one pass.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Longest wait of a read for the pass that includes the inputs it saw; past it, the kept
/// answers are served as they are.
pub const FRESH_WAIT: Duration = Duration::from_secs(5);

/// The kept answers of the resources that are listed and watched.
pub struct Live {
    versions: BTreeMap<Arch, Arc<Hub<ManagedOSVersionChangelogSummary>>>,
    machines: BTreeMap<Arch, Arc<Hub<MachineInventoryChangelogSummary>>>,
    /// How fresh the version summaries are.
    versions_pass: Pass,
    /// How fresh the machine summaries are.
    machines_pass: Pass,
}

/// Which resource's answers a read wants fresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answers {
    /// Version summaries.
    Versions,
    /// Machines.
    Machines,
}

/// The inputs of one resource's passes, and what the last completed pass had seen of them.
#[derive(Default)]
struct Pass {
    inputs: std::sync::OnceLock<Vec<watch::Receiver<u64>>>,
    done: watch::Sender<Option<Vec<u64>>>,
    hurry: tokio::sync::Notify,
}

impl Pass {
    fn start(&self, inputs: &[watch::Receiver<u64>]) {
        let _ = self.inputs.set(inputs.to_vec());
    }

    /// Marks every input seen and returns the counts seen.
    fn seen(inputs: &mut [watch::Receiver<u64>]) -> Vec<u64> {
        inputs.iter_mut().map(|i| *i.borrow_and_update()).collect()
    }

    fn done(&self, seen: Vec<u64>) {
        self.done.send_replace(Some(seen));
    }

    /// Waits (at most [`FRESH_WAIT`]) for a pass that saw every input change seen now.
    async fn fresh(&self) {
        let Some(inputs) = self.inputs.get() else {
            // Not started: the server is not ready yet; nothing to wait for.
            return;
        };
        let want: Vec<u64> = inputs.iter().map(|i| *i.borrow()).collect();
        let covers = |done: &Option<Vec<u64>>| done.as_ref().is_some_and(|d| *d == want);
        if covers(&self.done.borrow()) {
            return;
        }
        self.hurry.notify_one();
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(
            FRESH_WAIT,
            done.wait_for(|d| {
                // Counts only grow: a pass past `want` covers it too.
                d.as_ref().is_some_and(|d| {
                    d.iter()
                        .zip(&want)
                        .all(|(d, w)| d.wrapping_sub(*w) < u64::MAX / 2)
                })
            }),
        )
        .await;
    }
}

impl Live {
    /// Empty hubs for `architectures`, on one clock.
    pub fn new(architectures: &[Arch]) -> Arc<Self> {
        let clock = Clock::new();
        Arc::new(Self {
            versions: architectures
                .iter()
                .map(|a| (a.clone(), Hub::new(clock.clone())))
                .collect(),
            machines: architectures
                .iter()
                .map(|a| (a.clone(), Hub::new(clock.clone())))
                .collect(),
            versions_pass: Pass::default(),
            machines_pass: Pass::default(),
        })
    }

    /// Waits until the answers of `which` include every input change this replica has seen
    /// (at most [`FRESH_WAIT`]).
    pub async fn fresh(&self, which: Answers) {
        match which {
            Answers::Versions => self.versions_pass.fresh().await,
            Answers::Machines => self.machines_pass.fresh().await,
        }
    }

    /// The architectures served.
    pub fn architectures(&self) -> Vec<Arch> {
        self.versions.keys().cloned().collect()
    }

    /// The version summaries for `arch`.
    pub fn versions(&self, arch: &Arch) -> Option<&Arc<Hub<ManagedOSVersionChangelogSummary>>> {
        self.versions.get(arch)
    }

    /// The machine summaries for `arch`.
    pub fn machines(&self, arch: &Arch) -> Option<&Arc<Hub<MachineInventoryChangelogSummary>>> {
        self.machines.get(arch)
    }

    /// Keeps the version summaries current. Sets `ready` after the first pass. Never ends.
    pub async fn keep_versions(self: Arc<Self>, resources: Arc<Resources>, ready: ReadyFlag) {
        let stores = resources.channel_stores().clone();
        stores.channels.wait_until_ready().await;
        stores.versions.wait_until_ready().await;
        let mut inputs = [
            resources.changes(),
            stores.versions.changes(),
            stores.channels.changes(),
        ];
        self.versions_pass.start(&inputs);
        loop {
            let seen = Pass::seen(&mut inputs);
            let (this, resources) = (self.clone(), resources.clone());
            let _ = tokio::task::spawn_blocking(move || {
                for (arch, hub) in &this.versions {
                    let events = hub.replace(None, resources.summaries(arch));
                    debug!(%arch, events, "version summaries recomputed");
                }
            })
            .await;
            self.versions_pass.done(seen);
            ready.set();
            if !next(&mut inputs, &self.versions_pass.hurry).await {
                return std::future::pending().await;
            }
        }
    }

    /// Keeps the machine summaries current, and the machines gauge (default architecture).
    /// Sets `ready` after the first pass. Never ends.
    pub async fn keep_machines(
        self: Arc<Self>,
        resources: Arc<Resources>,
        fleet: Arc<FleetView>,
        metrics: Arc<FleetMetrics>,
        ready: ReadyFlag,
    ) {
        let stores = resources.channel_stores().clone();
        stores.channels.wait_until_ready().await;
        stores.versions.wait_until_ready().await;
        fleet.wait_until_ready().await;
        let default_arch = resources.served_arch(None).ok();
        let (machines, others) = fleet.changes();
        let [selectors, images] = others;
        // The machines' own changes last: alone, they need only the changed machines computed.
        let mut inputs = [
            resources.changes(),
            stores.versions.changes(),
            stores.channels.changes(),
            selectors,
            images,
            machines,
        ];
        self.machines_pass.start(&inputs);
        let mut last: Option<Vec<u64>> = None;
        let mut known = Known::default();
        loop {
            let seen = Pass::seen(&mut inputs);
            // Only MachineInventories changed since the last pass: only they are computed again.
            let only_machines = last.as_ref().is_some_and(|last| {
                let n = last.len() - 1;
                last[..n] == seen[..n]
            });
            let (this, fleet, metrics) = (self.clone(), fleet.clone(), metrics.clone());
            let default_arch = default_arch.clone();
            known = tokio::task::spawn_blocking(move || {
                this.machines_pass_over(
                    &fleet,
                    &metrics,
                    default_arch.as_ref(),
                    known,
                    only_machines,
                )
            })
            .await
            .unwrap_or_default();
            last = Some(seen.clone());
            self.machines_pass.done(seen);
            ready.set();
            if !next(&mut inputs, &self.machines_pass.hurry).await {
                return std::future::pending().await;
            }
        }
    }

    /// One pass over the machines: every one (`only_machines` false), or only those whose
    /// MachineInventory changed since `known` (and those gone). Returns what is known now.
    fn machines_pass_over(
        &self,
        fleet: &FleetView,
        metrics: &FleetMetrics,
        default_arch: Option<&Arch>,
        known: Known,
        only_machines: bool,
    ) -> Known {
        let machines = fleet.machine_list();
        let now = Known::of(&machines);
        for (arch, hub) in &self.machines {
            let events = if only_machines {
                let changed: Vec<_> = machines.iter().filter(|m| !known.has(m)).cloned().collect();
                let mut events = 0;
                for summary in fleet.summaries_of(&changed, arch) {
                    let meta = summary.metadata.clone();
                    events += usize::from(hub.set(&meta.namespace, &meta.name, Some(summary)));
                }
                for (namespace, name) in known.gone(&now) {
                    events += usize::from(hub.set(&namespace, &name, None));
                }
                events
            } else {
                hub.replace(None, fleet.summaries_of(&machines, arch))
            };
            debug!(%arch, events, only_machines, "machine summaries recomputed");
            if Some(arch) == default_arch {
                metrics.set_machines(&gauge(&hub.list(None).1));
            }
        }
        now
    }
}

/// The MachineInventories a pass computed answers from: by namespace and name, their
/// resourceVersion (hashed: a few bytes per machine).
#[derive(Default)]
struct Known {
    machines: std::collections::HashMap<(String, String), u64>,
}

impl Known {
    fn of(machines: &[Arc<crate::fleet::crd::MachineInventory>]) -> Self {
        Self {
            machines: machines.iter().map(|m| (key(m), version_hash(m))).collect(),
        }
    }

    /// Whether `machine`'s answer was computed from this very object.
    fn has(&self, machine: &crate::fleet::crd::MachineInventory) -> bool {
        self.machines.get(&key(machine)) == Some(&version_hash(machine))
    }

    /// Machines known here and gone from `now`.
    fn gone(&self, now: &Self) -> Vec<(String, String)> {
        self.machines
            .keys()
            .filter(|k| !now.machines.contains_key(*k))
            .cloned()
            .collect()
    }
}

fn key(machine: &crate::fleet::crd::MachineInventory) -> (String, String) {
    (
        machine.metadata.namespace.clone().unwrap_or_default(),
        machine.metadata.name.clone().unwrap_or_default(),
    )
}

fn version_hash(machine: &crate::fleet::crd::MachineInventory) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    machine.metadata.resource_version.hash(&mut hasher);
    machine.metadata.uid.hash(&mut hasher);
    hasher.finish()
}

/// Waits for the next change of any input, then [`MIN_INTERVAL`] for the rest of its burst
/// (unless a read is waiting: `hurry`). False when every input is gone.
async fn next(inputs: &mut [watch::Receiver<u64>], hurry: &tokio::sync::Notify) -> bool {
    let changed = futures::future::select_all(inputs.iter_mut().map(|i| Box::pin(i.changed())));
    let (result, _, _) = changed.await;
    if result.is_err() {
        return false;
    }
    tokio::select! {
        () = tokio::time::sleep(MIN_INTERVAL) => {}
        () = hurry.notified() => {}
    }
    true
}

/// Machines by namespace, state and highest pending severity (`none` without a pending
/// changelog), counted from the kept answers.
fn gauge(
    items: &[Arc<Item<MachineInventoryChangelogSummary>>],
) -> BTreeMap<(String, String, String), i64> {
    let mut counts = BTreeMap::new();
    for item in items {
        let machine = &item.object;
        let severity = machine
            .summary
            .as_ref()
            .map_or_else(|| "none".to_owned(), |s| wire(&s.highest_severity));
        *counts
            .entry((
                machine.metadata.namespace.clone(),
                wire(&machine.state),
                severity,
            ))
            .or_default() += 1;
    }
    counts
}

/// A list of kept answers as JSON: `apiVersion`, `kind`, `metadata.resourceVersion` and the
/// items' kept bytes, copied.
pub fn list_json<T: Object>(
    api_version: &str,
    kind: &str,
    version: ResourceVersion,
    items: &[&Arc<Item<T>>],
) -> Vec<u8> {
    let size: usize = items.iter().map(|i| i.json.len() + 1).sum();
    let mut out = Vec::with_capacity(size + 160);
    out.extend_from_slice(b"{\"apiVersion\":\"");
    out.extend_from_slice(api_version.as_bytes());
    out.extend_from_slice(b"\",\"kind\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"metadata\":{\"resourceVersion\":\"");
    out.extend_from_slice(version.text().as_bytes());
    out.extend_from_slice(b"\"},\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&item.json);
    }
    out.extend_from_slice(b"]}");
    out
}
