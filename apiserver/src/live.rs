//! Answers computed when their inputs change: the summary of every ManagedOSVersion and of
//! every machine (MachineInventory), per served architecture, kept in a [`Hub`] each, from
//! which lists, gets and watches are served.
//!
//! One task per resource recomputes the answers when an input changes (a version or channel
//! applied or deleted, channel data published by the channel controller, a fleet object
//! changed), at most every [`MIN_INTERVAL`] so that a burst of changes is one pass (a change
//! of MachineInventories alone: [`MIN_INTERVAL_LAST`], and only they are computed), on a
//! blocking thread; the hub turns what changed into events. Requests never resolve a machine
//! or look a version up for a list: they copy the kept bytes. The machines gauge is counted
//! from the kept answers after each pass.
//!
//! Reads are as fresh as the inputs this replica has seen ([`Live::fresh`]): a request waits
//! (without the burst delay) for the pass that includes every input change seen before it, as
//! kube-apiserver's consistent reads from its watch cache wait for the cache, so a read right
//! after a change of a ManagedOSImage or a MachineInventory sees it.

use std::{collections::BTreeMap, io::Write, sync::Arc, time::Duration};

use elemental_changelog_apiservice::{
    Arch, MACHINE_RESOURCE, fleet::MachineInventoryChangelogSummary, identity,
    types::ManagedOSVersionChangelogSummary,
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
    watch::{Clock, Hub, Item, MachineFacts, Object, ResourceVersion, source_of},
};

/// Shortest time between two passes over a resource's answers: the changes of a burst
/// (an operator re-sync creating hundreds of versions) are one pass.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The same after a change of the last input only (the MachineInventories): such a pass
/// computes only the machines that changed, so it waits less for the rest of a burst.
pub const MIN_INTERVAL_LAST: Duration = Duration::from_millis(20);

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
        loop {
            let seen = Pass::seen(&mut inputs);
            // Only MachineInventories changed since the last pass: only they are computed again.
            let only_machines = last.as_ref().is_some_and(|last| {
                let n = last.len() - 1;
                last[..n] == seen[..n]
            });
            let (this, fleet, metrics) = (self.clone(), fleet.clone(), metrics.clone());
            let default_arch = default_arch.clone();
            let _ = tokio::task::spawn_blocking(move || {
                this.machines_pass_over(&fleet, &metrics, default_arch.as_ref(), only_machines);
            })
            .await;
            last = Some(seen.clone());
            self.machines_pass.done(seen);
            ready.set();
            if !next(&mut inputs, &self.machines_pass.hurry).await {
                return std::future::pending().await;
            }
        }
    }

    /// One pass over the machines: every one (`only_machines` false), or only those whose
    /// MachineInventory is not the one their kept answer was computed from
    /// ([`Item::source`]), and those gone. Answers are computed and handed to the hub one
    /// at a time: a pass never holds a second copy of the fleet's answers.
    fn machines_pass_over(
        &self,
        fleet: &FleetView,
        metrics: &FleetMetrics,
        default_arch: Option<&Arch>,
        only_machines: bool,
    ) {
        let machines = fleet.machine_list();
        for (arch, hub) in &self.machines {
            let events = if only_machines {
                let (_, kept) = hub.list(None);
                let (changed, gone) = changed_and_gone(&machines, &kept);
                let mut events = 0;
                fleet.each_summary(&changed, arch, &mut |summary| {
                    let meta = &summary.metadata;
                    let (namespace, name) = (meta.namespace.clone(), meta.name.clone());
                    events += usize::from(hub.set(&namespace, &name, Some(summary)));
                });
                for (namespace, name) in gone {
                    events += usize::from(hub.set(&namespace, &name, None));
                }
                events
            } else {
                let mut sweep = hub.sweep(None);
                fleet.each_summary(&machines, arch, &mut |summary| sweep.put(summary));
                sweep.finish()
            };
            debug!(%arch, events, only_machines, "machine summaries recomputed");
            if Some(arch) == default_arch {
                metrics.set_machines(&gauge(&hub.list(None).1));
            }
        }
    }
}

/// The machines whose MachineInventory is not the one their kept answer was computed from
/// ([`Item::source`]; new ones too), and the kept answers whose MachineInventory is gone (by
/// namespace and name). Both lists are in namespace and name order (the reflector's store
/// and the hub keep them so): one walk over both, no lookup, nothing copied but what changed.
fn changed_and_gone(
    machines: &[Arc<crate::fleet::crd::MachineInventory>],
    kept: &[Arc<Item<MachineInventoryChangelogSummary>>],
) -> (
    Vec<Arc<crate::fleet::crd::MachineInventory>>,
    Vec<(String, String)>,
) {
    let (mut changed, mut gone) = (Vec::new(), Vec::new());
    let mut kept = kept.iter().peekable();
    for machine in machines {
        let meta = &machine.metadata;
        let key = (
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        while let Some(item) = kept.next_if(|item| item.key() < key) {
            gone.push((item.namespace().to_owned(), item.name().to_owned()));
        }
        // The answer's metadata carries a uid of its own, derived from the machine's.
        let uid = meta
            .uid
            .as_deref()
            .map(|uid| identity::uid(MACHINE_RESOURCE, uid));
        let source = source_of(uid.as_deref(), meta.resource_version.as_deref());
        match kept.next_if(|item| item.key() == key) {
            Some(item) if item.source == source => {}
            _ => changed.push(machine.clone()),
        }
    }
    gone.extend(kept.map(|item| (item.namespace().to_owned(), item.name().to_owned())));
    (changed, gone)
}

/// Waits for the next change of any input, then [`MIN_INTERVAL`] ([`MIN_INTERVAL_LAST`]
/// when it is the last input's) for the rest of its burst (unless a read is waiting:
/// `hurry`). False when every input is gone.
async fn next(inputs: &mut [watch::Receiver<u64>], hurry: &tokio::sync::Notify) -> bool {
    let last = inputs.len().saturating_sub(1);
    let changed = futures::future::select_all(inputs.iter_mut().map(|i| Box::pin(i.changed())));
    let (result, index, _) = changed.await;
    if result.is_err() {
        return false;
    }
    let wait = if index == last {
        MIN_INTERVAL_LAST
    } else {
        MIN_INTERVAL
    };
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        () = hurry.notified() => {}
    }
    true
}

/// Machines by namespace, state and highest pending severity (`none` without a pending
/// changelog), counted from the kept answers' facts.
fn gauge(
    items: &[Arc<Item<MachineInventoryChangelogSummary>>],
) -> BTreeMap<(String, String, String), i64> {
    let mut counts: BTreeMap<(&str, MachineFacts), i64> = BTreeMap::new();
    for item in items {
        *counts.entry((item.namespace(), item.facts)).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((namespace, facts), n)| {
            let severity = facts
                .severity
                .map_or_else(|| "none".to_owned(), |s| wire(&s));
            ((namespace.to_owned(), wire(&facts.state), severity), n)
        })
        .collect()
}

/// Writes one item of a list for this list alone.
pub type WriteItem<'a, T> = dyn Fn(&Item<T>) -> Vec<u8> + 'a;

/// Writes a list of kept answers as JSON: `apiVersion`, `kind`, `metadata.resourceVersion`,
/// then each item's bytes (`item`: written for this list instead, e.g. with an exposure).
pub fn write_list<T: Object>(
    out: &mut dyn Write,
    api_version: &str,
    kind: &str,
    version: ResourceVersion,
    items: &[&Arc<Item<T>>],
    item: Option<&WriteItem<'_, T>>,
) -> std::io::Result<()> {
    write!(
        out,
        "{{\"apiVersion\":\"{api_version}\",\"kind\":\"{kind}\",\"metadata\":{{\"resourceVersion\":\"{version}\"}},\"items\":["
    )?;
    for (i, kept) in items.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        match item {
            Some(item) => out.write_all(&item(kept))?,
            None => kept.write_json(out)?,
        }
    }
    out.write_all(b"]}")
}

/// Bytes of the kept answers `items` (what a list of them takes, about).
pub fn kept_bytes<T: Object>(items: &[&Arc<Item<T>>]) -> usize {
    items.iter().map(|i| i.json_len() + 1).sum::<usize>() + 160
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::crd::MachineInventory;
    use crate::watch::Clock;

    fn machine(namespace: &str, name: &str, rv: &str) -> Arc<MachineInventory> {
        let mut m = MachineInventory::new(name, Default::default());
        m.metadata.namespace = Some(namespace.to_owned());
        m.metadata.uid = Some(format!("uid-{namespace}-{name}"));
        m.metadata.resource_version = Some(rv.to_owned());
        Arc::new(m)
    }

    fn answer(m: &MachineInventory) -> MachineInventoryChangelogSummary {
        let mut a = MachineInventoryChangelogSummary::new();
        a.metadata.namespace = m.metadata.namespace.clone().unwrap_or_default();
        a.metadata.name = m.metadata.name.clone().unwrap_or_default();
        a.metadata.uid = m
            .metadata
            .uid
            .as_deref()
            .map(|uid| identity::uid(MACHINE_RESOURCE, uid));
        a.metadata.resource_version = m.metadata.resource_version.clone();
        a
    }

    #[test]
    fn one_walk_finds_changed_new_and_gone_machines() {
        let hub = Hub::new(Arc::new(Clock::with_epoch(3)));
        let before = [
            machine("a", "m1", "1"),
            machine("a", "m2", "1"),
            machine("a", "m4", "1"),
            machine("b", "m1", "1"),
            machine("c", "m9", "1"),
        ];
        for m in &before {
            let a = answer(m);
            hub.set(
                &a.metadata.namespace.clone(),
                &a.metadata.name.clone(),
                Some(a),
            );
        }
        let (_, kept) = hub.list(None);
        // m2 changed, m3 new, m4 and c/m9 gone, b/m1 and a/m1 unchanged, d/m1 new.
        let now = [
            machine("a", "m1", "1"),
            machine("a", "m2", "2"),
            machine("a", "m3", "1"),
            machine("b", "m1", "1"),
            machine("d", "m1", "1"),
        ];
        let (changed, gone) = changed_and_gone(&now, &kept);
        let names: Vec<_> = changed
            .iter()
            .map(|m| {
                format!(
                    "{}/{}",
                    m.metadata.namespace.as_deref().unwrap_or_default(),
                    m.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(names, ["a/m2", "a/m3", "d/m1"]);
        assert_eq!(
            gone,
            [
                ("a".to_owned(), "m4".to_owned()),
                ("c".to_owned(), "m9".to_owned())
            ]
        );
        // Nothing kept: every machine is new.
        assert_eq!(changed_and_gone(&now, &[]).0.len(), now.len());
        // No machine: every kept answer is gone.
        assert_eq!(changed_and_gone(&[], &kept).1.len(), kept.len());
    }
}
