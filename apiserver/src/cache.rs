//! The in-process cache: per channel, per architecture, the last good data
//! read from the channel's image, as immutable snapshots swapped atomically.
//!
//! Readers clone an `Arc` and never wait for a fetch. A failed fetch records
//! its error next to the last good snapshot and never replaces it. The cache is
//! written in one place, [`Cache::apply`], called only by the channel controller's
//! publisher: every change of a channel is computed by that channel's one worker, in
//! order, so no write has to compare and swap.
//!
//! Next to the snapshots, the cache says which retained versions are being
//! rebuilt from an older image, or could not be ([`Cache::retained_status`]),
//! and which sync of each channel its last refresh answered, and which
//! versions existed when it started ([`Cache::refreshed`]): a version the
//! snapshot lacks is "not read yet" until a refresh of the channel's latest
//! sync, started once the version existed, is done.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use dashmap::DashMap;
use elemental_changelog::{compute::IndexedChannel, data::ChannelData};
use elemental_changelog_apiservice::Arch;
use elemental_changelog_registry::{Digest, ImageRef};
use jiff::Timestamp;

use crate::{channels::crd::SyncKey, read_error::ReadErrorKind};

/// A channel: namespace and name of a ManagedOSVersionChannel.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ChannelKey {
    /// A key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ChannelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A snapshot's number, unique in the process and never reused: what kept answers and list
/// fingerprints name a snapshot by (see [`Snapshot::generation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(u64);

impl Generation {
    fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Data read from one image for one architecture. Built only by [`Snapshot::read`] and
/// [`Snapshot::with_data`], each giving it a new [`Generation`]: two snapshots are the same
/// data exactly when their generations are equal.
#[derive(Debug)]
pub struct Snapshot {
    generation: Generation,
    /// Image reference it was read from (as the channel writes it).
    pub image: ImageRef,
    /// Manifest digest the reference resolved to.
    pub digest: Digest,
    /// Platform chosen from an image index; `None` for a single-platform
    /// image, whose data serves every architecture.
    pub platform: Option<String>,
    /// What is served, indexed for the queries: [`Snapshot::parsed`] plus the channel's
    /// retained versions, if any (else the same data).
    pub data: Arc<IndexedChannel>,
    /// The image's own data as parsed, without retained versions. Other
    /// channels that read the same image share it; holding it here keeps it
    /// shareable while this snapshot lives.
    pub parsed: Arc<ChannelData>,
    /// When it was pulled.
    pub fetched_at: Timestamp,
}

impl Snapshot {
    /// The data `parsed` from `image` at `digest` (for `platform` of an index), read at
    /// `fetched_at`, served as it is.
    pub fn read(
        image: ImageRef,
        digest: Digest,
        platform: Option<String>,
        parsed: Arc<ChannelData>,
        fetched_at: Timestamp,
    ) -> Self {
        Self {
            generation: Generation::next(),
            image,
            digest,
            platform,
            data: Arc::new(IndexedChannel::new(parsed.clone())),
            parsed,
            fetched_at,
        }
    }

    /// The same image's data serving `data` instead (retained versions added or dropped).
    #[must_use]
    pub fn with_data(&self, data: IndexedChannel) -> Self {
        Self {
            generation: Generation::next(),
            image: self.image.clone(),
            digest: self.digest.clone(),
            platform: self.platform.clone(),
            data: Arc::new(data),
            parsed: self.parsed.clone(),
            fetched_at: self.fetched_at,
        }
    }

    /// This snapshot's generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }
}

/// Why the last fetch failed.
#[derive(Clone, Debug)]
pub struct FetchFailure {
    /// Error kind: the metric label and the message callers see
    /// ([`ReadErrorKind::public_message`]) come from it.
    pub kind: ReadErrorKind,
    /// Full error chain, for logs only: it may carry what the registry said.
    pub message: String,
    /// When it happened.
    pub at: Timestamp,
}

/// The state of one architecture of a channel.
#[derive(Clone, Debug, Default)]
pub struct ArchState {
    /// Last good data, kept across failed fetches.
    pub snapshot: Option<Arc<Snapshot>>,
    /// When the data was last confirmed current (pulled or digest unchanged).
    pub confirmed_at: Option<Timestamp>,
    /// The last attempt's failure, cleared by a success.
    pub last_error: Option<FetchFailure>,
    /// Image reference and digest whose content was unusable (no or an
    /// invalid `channel.json`): not pulled again while the reference still
    /// resolves to that digest, since the same bytes would fail the same way.
    pub rejected: Option<(ImageRef, Digest)>,
}

/// The state of one channel.
#[derive(Clone, Debug, Default)]
pub struct ChannelState {
    /// Image the channel names now, as its spec writes it (`None` for channels
    /// without an image). Text, not an [`ImageRef`]: it may be no valid
    /// reference (every architecture's last error then says so).
    pub image: Option<String>,
    /// Whether a fetch has been attempted since the channel was seen.
    pub attempted: bool,
    /// Per architecture.
    pub archs: BTreeMap<Arch, ArchState>,
}

impl ChannelState {
    /// Versions, advisories and retained versions held, over all architectures.
    fn counts(&self) -> (usize, usize, usize) {
        let mut out = (0, 0, 0);
        for snapshot in self.archs.values().filter_map(|a| a.snapshot.as_ref()) {
            for version in snapshot.data.data().versions().values() {
                out.0 += 1;
                out.1 += version.advisories.as_ref().map_or(0, Vec::len);
                out.2 += usize::from(version.retained_from.is_some());
            }
        }
        out
    }
}

/// Where a retained version's data stands while a replica rebuilds it from
/// the older image the channel history maps it to.
#[derive(Clone, Debug)]
pub enum RetainedStatus {
    /// The image is being pulled: answer as not fetched yet (503 with `Retry-After`).
    Rebuilding {
        /// `repository@digest` being pulled.
        image: ImageRef,
    },
    /// Pulling it failed (a registry that garbage-collected the digest
    /// answers not found); retried with backoff.
    Failed {
        /// `repository@digest` that could not be pulled.
        image: ImageRef,
        /// Why.
        failure: FetchFailure,
    },
}

/// Retained versions in rebuild, by architecture, then version name.
pub type RetainedStatuses = BTreeMap<Arch, BTreeMap<String, RetainedStatus>>;

/// A completed refresh of a channel: what it was made for, and the versions
/// it was made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refreshed {
    /// The channel sync (image, generation, operator sync) it was made for.
    pub sync: SyncKey,
    /// The channel's ManagedOSVersions (names) this process knew when it
    /// started: the registry was read after they existed.
    pub versions: Arc<BTreeSet<String>>,
}

/// Every channel's state.
#[derive(Debug, Default)]
pub struct Cache {
    channels: DashMap<ChannelKey, Arc<ChannelState>>,
    retained: DashMap<ChannelKey, Arc<RetainedStatuses>>,
    /// The last completed refresh of each channel.
    refreshed: DashMap<ChannelKey, Refreshed>,
    /// Counts changes, for those who render from the cache ahead of requests.
    changes: tokio::sync::watch::Sender<u64>,
}

/// Cache totals, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Channels with data.
    pub channels: usize,
    /// Versions held.
    pub versions: usize,
    /// Precomputed advisories held.
    pub advisories: usize,
    /// Retained versions held.
    pub retained: usize,
}

/// A change of one channel's entry (see [`Cache::apply`]).
#[derive(Debug)]
pub enum Change {
    /// A refresh ended: the channel's new state (the failures recorded next to the last good
    /// data), where its retained versions stand, and what the refresh was made for.
    Refreshed {
        /// The new state.
        state: ChannelState,
        /// Retained versions being rebuilt or failed (empty: none).
        retained: RetainedStatuses,
        /// The completed refresh.
        refreshed: Refreshed,
    },
    /// A refresh is pulling older images for retained versions: which are being rebuilt.
    Rebuilding(RetainedStatuses),
    /// Retained versions whose ManagedOSVersion is gone were dropped (see [`without_retained`]).
    Pruned(ChannelState),
    /// The channel was deleted.
    Removed,
}

/// `state` without the retained versions `keep` refuses, summaries
/// precomputed; `None` when there are none to drop. Pure and slow (it re-indexes the
/// data): run it on a blocking thread.
pub fn without_retained(state: &ChannelState, keep: &dyn Fn(&str) -> bool) -> Option<ChannelState> {
    let mut state = state.clone();
    let mut changed = false;
    // Architectures served by one single-platform image share a snapshot: pruned once.
    let mut done: Vec<(Arc<Snapshot>, Arc<Snapshot>)> = Vec::new();
    for arch in state.archs.values_mut() {
        let Some(snapshot) = arch.snapshot.clone() else {
            continue;
        };
        if let Some((_, pruned)) = done
            .iter()
            .find(|(old, _)| old.generation() == snapshot.generation())
        {
            arch.snapshot = Some(pruned.clone());
            continue;
        }
        let mut data = snapshot.data.data().as_ref().clone();
        if !data.drop_retained(keep) {
            continue;
        }
        let data = IndexedChannel::new(data);
        data.precompute_summaries();
        let pruned = Arc::new(snapshot.with_data(data));
        arch.snapshot = Some(pruned.clone());
        done.push((snapshot, pruned));
        changed = true;
    }
    changed.then_some(state)
}

impl Cache {
    /// The state of a channel, if it is known.
    pub fn get(&self, key: &ChannelKey) -> Option<Arc<ChannelState>> {
        self.channels.get(key).map(|e| e.value().clone())
    }

    /// A receiver told of every change of a channel's state.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Changes of channel states so far (grows with each).
    pub fn changed(&self) -> u64 {
        *self.changes.borrow()
    }

    /// Applies `change` to the entry of `key`: the only write of the cache. Its one caller
    /// is the channel controller's publisher (`channels::publish`), which orders the changes
    /// of each channel, so nothing here compares or retries.
    pub fn apply(&self, key: &ChannelKey, change: Change) {
        match change {
            Change::Refreshed {
                state,
                retained,
                refreshed,
            } => {
                self.channels.insert(key.clone(), Arc::new(state));
                self.set_retained(key, retained);
                self.refreshed.insert(key.clone(), refreshed);
            }
            Change::Rebuilding(retained) => self.set_retained(key, retained),
            Change::Pruned(state) => {
                self.channels.insert(key.clone(), Arc::new(state));
            }
            Change::Removed => {
                self.channels.remove(key);
                self.retained.remove(key);
                self.refreshed.remove(key);
            }
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn set_retained(&self, key: &ChannelKey, statuses: RetainedStatuses) {
        if statuses.values().all(BTreeMap::is_empty) {
            self.retained.remove(key);
        } else {
            self.retained.insert(key.clone(), Arc::new(statuses));
        }
    }

    /// Whether the retained version `name` of `key` is being rebuilt for
    /// `arch`, or failed to be: a version that is not (yet) in the channel's
    /// snapshot but will be once an older image is pulled again. Answer
    /// [`RetainedStatus::Rebuilding`] as not fetched yet, never as not found.
    pub fn retained_status(
        &self,
        key: &ChannelKey,
        arch: &str,
        name: &str,
    ) -> Option<RetainedStatus> {
        self.retained.get(key)?.get(arch)?.get(name).cloned()
    }

    /// The last completed refresh of `key` (`None`: none yet, or not told).
    /// When the channel's
    /// [`sync_key`](crate::channels::crd::ManagedOSVersionChannel::sync_key)
    /// differs, or a version was not known when it started, the image that
    /// lists the version may not be read yet.
    pub fn refreshed(&self, key: &ChannelKey) -> Option<Refreshed> {
        self.refreshed.get(key).map(|e| e.value().clone())
    }

    /// Every channel with its state.
    pub fn all(&self) -> Vec<(ChannelKey, Arc<ChannelState>)> {
        self.channels
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect()
    }

    /// Test fixture: replaces a channel's state with `f(old)` (production code publishes
    /// through [`Cache::apply`] only).
    #[cfg(test)]
    pub fn update(&self, key: &ChannelKey, f: impl FnOnce(Option<&ChannelState>) -> ChannelState) {
        let new = f(self.get(key).as_deref());
        self.channels.insert(key.clone(), Arc::new(new));
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Test fixture: replaces the rebuild statuses of `key`.
    #[cfg(test)]
    pub fn set_retained_statuses(&self, key: &ChannelKey, statuses: RetainedStatuses) {
        self.set_retained(key, statuses);
    }

    /// Test fixture: records a completed refresh of `key`.
    #[cfg(test)]
    pub fn set_refreshed(&self, key: &ChannelKey, refreshed: Refreshed) {
        self.refreshed.insert(key.clone(), refreshed);
    }

    /// Totals over every channel.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for entry in &self.channels {
            let (versions, advisories, retained) = entry.value().counts();
            t.channels += usize::from(entry.value().archs.values().any(|a| a.snapshot.is_some()));
            t.versions += versions;
            t.advisories += advisories;
            t.retained += retained;
        }
        t
    }
}
