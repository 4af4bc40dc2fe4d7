//! The version summaries' projector: every ManagedOSVersion's summary per served
//! architecture, kept in the version hubs. A ManagedOSVersion change recomputes that
//! version's summary only; a channel, its data or a re-list recomputes them all.

use std::collections::{BTreeMap, BTreeSet};

use elemental_changelog_apiservice::{Arch, types::ManagedOSVersionChangelogSummary};
use elemental_changelog_hub::Writer;
use tracing::debug;

use crate::versions::VersionData;

/// Version summaries, as the hub keeps them.
pub type Summary = ManagedOSVersionChangelogSummary;

/// The one writer of the version hubs.
pub struct VersionProjector {
    writers: BTreeMap<Arch, Writer<Summary>>,
    data: VersionData,
}

impl VersionProjector {
    /// The projector of `writers`, reading `data`.
    pub fn new(writers: BTreeMap<Arch, Writer<Summary>>, data: VersionData) -> Self {
        Self { writers, data }
    }

    /// Waits until the stores it reads have listed.
    pub async fn wait_until_ready(&self) {
        self.data.stores.channels.wait_until_ready().await;
        self.data.stores.versions.wait_until_ready().await;
    }

    /// Counters of the inputs every summary reads, then of the ManagedOSVersions (last).
    pub fn inputs(&self) -> Vec<tokio::sync::watch::Receiver<u64>> {
        vec![
            self.data.cache.changes(),
            self.data.stores.channels.changes(),
            self.data.stores.versions.changes(),
        ]
    }

    /// The ManagedOSVersions changed since the last call.
    pub fn touched(&self) -> crate::reflect::Touched {
        self.data.stores.versions.take_touched()
    }

    /// Every summary computed again; returns the number of events.
    pub fn all(&mut self) -> usize {
        let versions = self.data.stores.versions.list(None);
        let mut events = 0;
        for (arch, writer) in &mut self.writers {
            let summaries = versions.iter().map(|v| self.data.summary_of(v, arch));
            events += writer.replace(None, summaries);
        }
        debug!(
            events,
            versions = versions.len(),
            "every version summary computed"
        );
        events
    }

    /// The summaries of `keys` (namespace, name) computed again; returns the number of events.
    pub fn some(&mut self, keys: &BTreeSet<(String, String)>) -> usize {
        let mut events = 0;
        for (arch, writer) in &mut self.writers {
            for (namespace, name) in keys {
                let summary = self
                    .data
                    .stores
                    .versions
                    .get(namespace, name)
                    .map(|v| self.data.summary_of(&v, arch));
                events += usize::from(writer.set(namespace, name, summary));
            }
        }
        debug!(events, versions = keys.len(), "version summaries computed");
        events
    }
}
