//! The projectors: the layer below the routes that keeps the answers of the listed and
//! watched resources (version summaries, machines), as kube-apiserver's cacher keeps objects
//! for its watch cache.
//!
//! Each served resource has one projector, the only holder of its hubs' writers
//! ([`elemental_changelog_hub::Writer`]); the routes hold readers ([`Projectors`]). A projector
//! is fed by the reflectors: which objects of its own kind changed (by key, each once however
//! often: [`crate::reflect::Touched`]), and counters of the inputs every answer reads. An
//! object's change recomputes that object's answer only, at once; a change of a shared input
//! (channel data, channels, versions, selectors, images) or a re-list recomputes every answer,
//! after [`SHARED_INPUT_DELAY`] so that a burst (an operator re-sync creating hundreds of
//! versions) is one pass. The work runs on a blocking thread; the hub turns what changed into
//! events.
//!
//! Reads are as fresh as the inputs this replica has seen ([`Projectors::fresh`]): a request
//! waits (without the burst delay) for the pass that includes every input change seen before
//! it, as kube-apiserver's consistent reads from its watch cache wait for the cache.

pub mod machines;
pub mod versions;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use elemental_changelog_apiservice::Arch;
use elemental_changelog_hub::{Bounds, Clock, Reader, Writer};
use tokio::sync::watch;
use tracing::error;

use crate::health::ReadyFlag;

pub use machines::{Machine, MachineProjector, SummaryCache};
pub use versions::{Summary, VersionProjector};

/// Wait after a change of an input every answer reads, for the rest of its burst.
pub const SHARED_INPUT_DELAY: Duration = Duration::from_millis(100);

/// Longest wait of a read for the pass that includes the inputs it saw; past it, the kept
/// answers are served as they are.
pub const FRESH_WAIT: Duration = Duration::from_secs(5);

/// Which resource's answers a read wants fresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// Version summaries.
    Versions,
    /// Machines.
    Machines,
}

/// The readers of the kept answers, for the routes.
pub struct Projectors {
    versions: BTreeMap<Arch, Reader<Summary>>,
    machines: BTreeMap<Arch, Reader<Machine>>,
    versions_pass: Pass,
    machines_pass: Pass,
    summaries: Arc<SummaryCache>,
}

/// The writers of the hubs, each handed to its projector.
pub struct Writers {
    /// Version summaries by architecture.
    pub versions: BTreeMap<Arch, Writer<Summary>>,
    /// Machines by architecture.
    pub machines: BTreeMap<Arch, Writer<Machine>>,
}

/// Pending summaries kept (each a few hundred bytes): more than the distinct (current,
/// target) pairs of the largest fleet measured (`make bench`: 2,000).
const SUMMARIES_KEPT: usize = 20_000;

impl Projectors {
    /// Empty hubs for `architectures`, on one clock, bounded by `bounds`.
    pub fn new(architectures: &[Arch], bounds: Bounds) -> (Arc<Self>, Writers) {
        let clock = Clock::new();
        let mut writers = Writers {
            versions: BTreeMap::new(),
            machines: BTreeMap::new(),
        };
        let (mut versions, mut machines) = (BTreeMap::new(), BTreeMap::new());
        for arch in architectures {
            let (writer, reader) = elemental_changelog_hub::new(clock.clone(), bounds);
            writers.versions.insert(arch.clone(), writer);
            versions.insert(arch.clone(), reader);
            let (writer, reader) = elemental_changelog_hub::new(clock.clone(), bounds);
            writers.machines.insert(arch.clone(), writer);
            machines.insert(arch.clone(), reader);
        }
        let this = Arc::new(Self {
            versions,
            machines,
            versions_pass: Pass::default(),
            machines_pass: Pass::default(),
            summaries: Arc::new(SummaryCache::new(SUMMARIES_KEPT)),
        });
        (this, writers)
    }

    /// Waits until the answers of `which` include every input change this replica has seen
    /// (at most [`FRESH_WAIT`]).
    pub async fn fresh(&self, which: Resource) {
        match which {
            Resource::Versions => self.versions_pass.fresh().await,
            Resource::Machines => self.machines_pass.fresh().await,
        }
    }

    /// The architectures served.
    pub fn architectures(&self) -> Vec<Arch> {
        self.versions.keys().cloned().collect()
    }

    /// The version summaries for `arch`.
    pub fn versions(&self, arch: &Arch) -> Option<&Reader<Summary>> {
        self.versions.get(arch)
    }

    /// The machine summaries for `arch`.
    pub fn machines(&self, arch: &Arch) -> Option<&Reader<Machine>> {
        self.machines.get(arch)
    }

    /// Pending changelog summaries by snapshot generation, `from` and `to`, shared by the
    /// machines' projector and the upgrade plans.
    pub fn summaries(&self) -> &Arc<SummaryCache> {
        &self.summaries
    }

    /// Keeps the version summaries current; sets `ready` after the first pass. Never ends
    /// unless a pass panics.
    pub async fn keep_versions(self: Arc<Self>, projector: VersionProjector, ready: ReadyFlag) {
        projector.wait_until_ready().await;
        let inputs = projector.inputs();
        run(
            projector,
            inputs,
            &self.versions_pass,
            ready,
            |p, work| match work {
                Work::All => p.all(),
                Work::Some(keys) => p.some(&keys),
            },
            |p| p.touched(),
        )
        .await;
    }

    /// Keeps the machines current, and the machines gauge; sets `ready` after the first
    /// pass. Never ends unless a pass panics.
    pub async fn keep_machines(self: Arc<Self>, projector: MachineProjector, ready: ReadyFlag) {
        projector.wait_until_ready().await;
        let inputs = projector.inputs();
        run(
            projector,
            inputs,
            &self.machines_pass,
            ready,
            |p, work| match work {
                Work::All => p.all(),
                Work::Some(keys) => p.some(&keys),
            },
            |p| p.touched(),
        )
        .await;
    }
}

/// What a pass computes.
enum Work {
    /// Every answer.
    All,
    /// The answers of these objects (namespace, name) of the projector's own kind.
    Some(std::collections::BTreeSet<(String, String)>),
}

/// The pass loop of one projector `p`: `inputs` are counters of its inputs, its own kind's
/// last; `touched` takes the objects of its own kind that changed; `work` runs a pass on a
/// blocking thread.
async fn run<P: Send + 'static>(
    mut p: P,
    mut inputs: Vec<watch::Receiver<u64>>,
    pass: &Pass,
    ready: ReadyFlag,
    work: fn(&mut P, Work) -> usize,
    touched: fn(&P) -> crate::reflect::Touched,
) {
    pass.start(&inputs);
    let mut last: Option<Vec<u64>> = None;
    loop {
        let seen = Pass::seen(&mut inputs);
        let changed = touched(&p);
        let own = seen.len().saturating_sub(1);
        let shared_unchanged = last.as_ref().is_some_and(|l| l[..own] == seen[..own]);
        let todo = if shared_unchanged && !changed.relisted {
            Work::Some(changed.keys)
        } else {
            Work::All
        };
        let joined = tokio::task::spawn_blocking(move || {
            work(&mut p, todo);
            p
        })
        .await;
        p = match joined {
            Ok(p) => p,
            Err(e) => {
                error!(error = %e, "a projector's pass failed; its answers are no longer kept current");
                return;
            }
        };
        last = Some(seen.clone());
        pass.done(seen);
        ready.set();
        if !next(&mut inputs, &pass.hurry).await {
            return std::future::pending().await;
        }
    }
}

/// Waits for the next change of any input; after a change of a shared input (not the last),
/// [`SHARED_INPUT_DELAY`] more for the rest of its burst, unless a read is waiting (`hurry`).
/// False when every input is gone.
async fn next(inputs: &mut [watch::Receiver<u64>], hurry: &tokio::sync::Notify) -> bool {
    let own = inputs.len().saturating_sub(1);
    let changed = futures::future::select_all(inputs.iter_mut().map(|i| Box::pin(i.changed())));
    let (result, index, _) = changed.await;
    if result.is_err() {
        return false;
    }
    if index != own {
        tokio::select! {
            () = tokio::time::sleep(SHARED_INPUT_DELAY) => {}
            () = hurry.notified() => {}
        }
    }
    true
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
