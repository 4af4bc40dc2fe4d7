//! The in-process cache: per channel, per architecture, the last good data
//! read from the channel's image, as immutable snapshots swapped atomically.
//!
//! Readers clone an `Arc` and never wait for a fetch. A failed fetch records
//! its error next to the last good snapshot and never replaces it.

use std::{collections::BTreeMap, sync::Arc};

use dashmap::DashMap;
use elemental_changelog::data::ChannelData;
use jiff::Timestamp;

use crate::oci::FetchErrorKind;

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

/// Data read from one image for one architecture.
#[derive(Debug)]
pub struct Snapshot {
    /// Image reference it was read from.
    pub image: String,
    /// Manifest digest the reference resolved to.
    pub digest: String,
    /// Platform chosen from an image index; `None` for a single-platform
    /// image, whose data serves every architecture.
    pub platform: Option<String>,
    /// Parsed content.
    pub data: Arc<ChannelData>,
    /// When it was pulled.
    pub fetched_at: Timestamp,
}

/// Why the last fetch failed.
#[derive(Clone, Debug)]
pub struct FetchFailure {
    /// Error kind: the metric label and the message callers see
    /// ([`FetchErrorKind::public_message`]) come from it.
    pub kind: FetchErrorKind,
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
    pub rejected: Option<(String, String)>,
}

/// The state of one channel.
#[derive(Clone, Debug, Default)]
pub struct ChannelState {
    /// Image the channel names now (`None` for channels without an image).
    pub image: Option<String>,
    /// Whether a fetch has been attempted since the channel was seen.
    pub attempted: bool,
    /// Per architecture.
    pub archs: BTreeMap<String, ArchState>,
}

impl ChannelState {
    /// Versions, advisories and retained versions held, over all architectures.
    fn counts(&self) -> (usize, usize, usize) {
        let mut out = (0, 0, 0);
        for snapshot in self.archs.values().filter_map(|a| a.snapshot.as_ref()) {
            for version in snapshot.data.versions().values() {
                out.0 += 1;
                out.1 += version.advisories.as_ref().map_or(0, Vec::len);
                out.2 += usize::from(version.retained_from.is_some());
            }
        }
        out
    }
}

/// Every channel's state.
#[derive(Debug, Default)]
pub struct Cache {
    channels: DashMap<ChannelKey, Arc<ChannelState>>,
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

impl Cache {
    /// The state of a channel, if it is known.
    pub fn get(&self, key: &ChannelKey) -> Option<Arc<ChannelState>> {
        self.channels.get(key).map(|e| e.value().clone())
    }

    /// Replaces a channel's state with `f(old)`, atomically for that channel.
    pub fn update(&self, key: &ChannelKey, f: impl FnOnce(Option<&ChannelState>) -> ChannelState) {
        let mut entry = self.channels.entry(key.clone()).or_default();
        let new = f(Some(entry.value().as_ref()));
        *entry.value_mut() = Arc::new(new);
    }

    /// Forgets a deleted channel.
    pub fn remove(&self, key: &ChannelKey) {
        self.channels.remove(key);
    }

    /// Every channel with its state.
    pub fn all(&self) -> Vec<(ChannelKey, Arc<ChannelState>)> {
        self.channels
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect()
    }

    /// Drops retained versions of `key` for which `keep` says no (their
    /// ManagedOSVersion is gone), so retained data never outlives it.
    pub fn prune_retained(&self, key: &ChannelKey, keep: impl Fn(&str) -> bool) {
        let Some(mut entry) = self.channels.get_mut(key) else {
            return;
        };
        let mut state = entry.value().as_ref().clone();
        let mut changed = false;
        for arch in state.archs.values_mut() {
            let Some(snapshot) = &arch.snapshot else {
                continue;
            };
            let mut data = snapshot.data.as_ref().clone();
            if !data.drop_retained(&keep) {
                continue;
            }
            data.precompute_summaries();
            arch.snapshot = Some(Arc::new(Snapshot {
                image: snapshot.image.clone(),
                digest: snapshot.digest.clone(),
                platform: snapshot.platform.clone(),
                data: Arc::new(data),
                fetched_at: snapshot.fetched_at,
            }));
            changed = true;
        }
        if changed {
            *entry.value_mut() = Arc::new(state);
        }
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
