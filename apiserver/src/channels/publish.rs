//! The publisher: the one place where the channel path's new state becomes visible.
//!
//! Workers compute (see [`reconcile`](super::reconcile)); the publisher stores. It is the
//! only caller of [`Cache::apply`], the only writer of the channel history, and it counts
//! the cache totals and the kept data after every change. Each channel's changes come from
//! its one worker, in order; the controller gives each worker a [`Lease`], and a change
//! published under a lease the controller took back (the channel was deleted while its
//! worker was finishing) is dropped, so nothing resurrects a deleted channel's data.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use elemental_changelog_registry::{Digest, ImageRef};
use jiff::Timestamp;
use tracing::{debug, warn};

use super::{
    Objects,
    history::{Change as HistoryChange, History, HistoryStore},
    kept,
    metrics::ChannelMetrics,
    reconcile::NextState,
};
use crate::{
    cache::{Cache, Change, ChannelKey, ChannelState, RetainedStatuses},
    telemetry::error_chain,
};

/// A worker's right to publish its channel's state, from its start until the controller
/// removes the channel.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    key: ChannelKey,
    id: u64,
}

impl Lease {
    /// The channel.
    pub(super) fn key(&self) -> &ChannelKey {
        &self.key
    }
}

/// Publishes the channel path's state: the cache, the channel history, the totals.
pub(super) struct Publisher {
    cache: Arc<Cache>,
    metrics: Arc<ChannelMetrics>,
    /// The channel history in the cluster; `None` when disabled.
    history: Option<Arc<dyn HistoryStore>>,
    /// The lease of each channel with a worker, and the next lease's id.
    leases: Mutex<(HashMap<ChannelKey, u64>, u64)>,
}

impl Publisher {
    /// A publisher into `cache` and `history`, counting in `metrics`.
    pub(super) fn new(
        cache: Arc<Cache>,
        metrics: Arc<ChannelMetrics>,
        history: Option<Arc<dyn HistoryStore>>,
    ) -> Self {
        Self {
            cache,
            metrics,
            history,
            leases: Mutex::default(),
        }
    }

    /// A new lease for the worker of `key` (any earlier one is void).
    pub(super) fn lease(&self, key: &ChannelKey) -> Lease {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let id = leases.1;
        leases.1 = leases.1.wrapping_add(1);
        leases.0.insert(key.clone(), id);
        Lease {
            key: key.clone(),
            id,
        }
    }

    /// Applies `change` under `lease`, if it still holds; true when applied.
    fn apply(&self, lease: &Lease, change: Change) -> bool {
        self.write(&lease.key, Some(lease.id), change)
    }

    /// Writes `change` of `key` into the cache: under the lease `id` if it still holds, or
    /// (`None`) as the removal that voids it. True when written.
    fn write(&self, key: &ChannelKey, lease: Option<u64>, change: Change) -> bool {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        match lease {
            Some(id) if leases.0.get(key) != Some(&id) => {
                debug!(channel = %key, "channel removed meanwhile; its state is not published");
                return false;
            }
            Some(_) => {}
            None => {
                leases.0.remove(key);
            }
        }
        // Under the lock, so that a removal cannot come between the check and the write.
        self.cache.apply(key, change);
        true
    }

    /// Publishes the result of a reconcile: the channel's state (its admitted images then
    /// count as kept, and their claims are released), the totals, and the image read in the
    /// channel history.
    pub(super) async fn publish(&self, lease: &Lease, next: NextState<'_>) {
        let NextState {
            state,
            retained,
            refreshed,
            image,
            claims,
        } = next;
        let read = image.map(|image| (read_from(&image, &state), image));
        let published = self.apply(
            lease,
            Change::Refreshed {
                state,
                retained,
                refreshed,
            },
        );
        // Stored: the cache counts the admitted images now.
        drop(claims);
        if !published {
            return;
        }
        self.totals();
        if let Some((by_digest, image)) = read {
            self.record(lease.key(), &image, by_digest).await;
        }
    }

    /// Publishes which retained versions are being rebuilt (see [`Change::Rebuilding`]).
    pub(super) fn rebuilding(&self, lease: &Lease, statuses: RetainedStatuses) {
        self.apply(lease, Change::Rebuilding(statuses));
    }

    /// Publishes a state without the retained versions whose ManagedOSVersion is gone.
    pub(super) fn pruned(&self, lease: &Lease, state: ChannelState) {
        if self.apply(lease, Change::Pruned(state)) {
            self.totals();
        }
    }

    /// Drops a deleted channel's state and voids its worker's lease.
    pub(super) fn remove(&self, key: &ChannelKey) {
        self.write(key, None, Change::Removed);
        self.metrics.forget_channel(&key.namespace, &key.name);
        self.totals();
    }

    /// Counts the cache's totals and the kept data.
    fn totals(&self) {
        let t = self.cache.totals();
        self.metrics
            .cache_size(t.channels, t.versions, t.advisories, t.retained);
        let refused = self
            .cache
            .all()
            .iter()
            .filter(|(_, state)| kept::refused(state))
            .count();
        self.metrics
            .kept_data(kept::kept_bytes(&self.cache), refused);
    }

    /// Records in the channel history the images read (by digest, with the versions each
    /// listed); nothing is written when the history has them already.
    async fn record(
        &self,
        key: &ChannelKey,
        image: &ImageRef,
        by_digest: BTreeMap<Digest, BTreeSet<String>>,
    ) {
        let Some(history) = &self.history else {
            return;
        };
        let repository = image.repository();
        let current = history.subscribe().borrow().0.clone();
        for (digest, versions) in by_digest {
            if current.is_recorded(key, &digest, &versions) {
                continue;
            }
            let (key, repository) = (key.clone(), repository.clone());
            let change: HistoryChange = Box::new(move |h: &mut History| {
                h.record(&key, &repository, &digest, &versions, Timestamp::now())
            });
            if let Err(error) = history.update(change).await {
                warn!(error = %error_chain(&error), "recording the image in the channel history failed; trying again at the next refresh");
            }
        }
    }

    /// Makes the channel history forget what no ManagedOSVersion needs any more
    /// (see [`History::prune`]), for the namespaces this replica watches. Only
    /// called once the reflectors have synced: an unsynced store would make
    /// every channel look deleted.
    pub(super) fn prune_history(&self, objects: &Objects) {
        let Some(history) = self.history.clone() else {
            return;
        };
        let objects = objects.clone();
        let change: HistoryChange = Box::new(move |h: &mut History| {
            h.prune(
                |key| {
                    objects.channels.watches(&key.namespace)
                        && objects.versions.watches(&key.namespace)
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
}

/// The versions each digest of `image` listed in `state`, as the history records them:
/// the image's own versions, not those retained from older images.
fn read_from(image: &ImageRef, state: &ChannelState) -> BTreeMap<Digest, BTreeSet<String>> {
    let mut by_digest: BTreeMap<Digest, BTreeSet<String>> = BTreeMap::new();
    for snapshot in state.archs.values().filter_map(|a| a.snapshot.as_ref()) {
        if snapshot.image != *image {
            continue;
        }
        by_digest
            .entry(snapshot.digest.clone())
            .or_default()
            .extend(
                snapshot
                    .data
                    .data()
                    .versions()
                    .iter()
                    .filter(|(_, v)| v.retained_from.is_none())
                    .map(|(n, _)| n.clone()),
            );
    }
    by_digest
}
