//! What a hub keeps: served API objects, and how each is split into its own bytes and
//! those it shares with other objects of its hub.

use elemental_changelog_apiservice::types::ObjectMeta;
use serde::{Serialize, de::DeserializeOwned};

/// A served object: an API object with the common metadata.
pub trait Object: Serialize + DeserializeOwned + Default + Send + Sync + 'static {
    /// What is read of a kept answer without parsing it back (the machines gauge).
    type Facts: Clone + std::fmt::Debug + Send + Sync + 'static;
    /// Its metadata.
    fn meta(&self) -> &ObjectMeta;
    /// Its metadata, to set the resourceVersion.
    fn meta_mut(&mut self) -> &mut ObjectMeta;
    /// See [`Object::Facts`].
    fn facts(&self) -> Self::Facts;
    /// Which bytes of `json` (its JSON) are its own; those before and after are what many
    /// objects share, kept once in the hub ([`Item`]). Default: all of them.
    fn own_range(&self, json: &[u8]) -> std::ops::Range<usize> {
        0..json.len()
    }
}

impl Object for elemental_changelog_apiservice::types::ManagedOSVersionChangelogSummary {
    type Facts = ();
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn facts(&self) {}
}

/// What the machines gauge reads of a kept machine answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MachineFacts {
    /// Its state.
    pub state: elemental_changelog_apiservice::fleet::MachineState,
    /// The highest severity pending (`None`: no pending changelog).
    pub severity: Option<elemental_changelog_apiservice::types::Severity>,
}

impl Object for elemental_changelog_apiservice::fleet::MachineInventoryChangelogSummary {
    type Facts = MachineFacts;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn facts(&self) -> MachineFacts {
        MachineFacts {
            state: self.state,
            severity: self.summary.as_ref().map(|s| s.highest_severity),
        }
    }

    /// Its identity and report (`metadata`, `os`): `apiVersion` and `kind` before them are
    /// the same for every machine, and what follows (the versions resolved, state, summary)
    /// for every machine on the same version with the same target. The boundaries are
    /// checked against `json` (the fields are written in their declared order); a mismatch
    /// keeps all of it as its own.
    fn own_range(&self, json: &[u8]) -> std::ops::Range<usize> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Own<'a> {
            api_version: &'a str,
            kind: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            metadata: Option<&'a ObjectMeta>,
            #[serde(skip_serializing_if = "Option::is_none")]
            os: Option<&'a elemental_changelog_apiservice::fleet::ReportedOs>,
        }
        // The end of `own`'s fields in `json` (before its closing brace), if `json` starts
        // with them and goes on with another field.
        let end = |own: Own<'_>| {
            let own = serde_json::to_vec(&own).ok()?;
            let end = own.len().checked_sub(1)?;
            (json.starts_with(&own[..end]) && json.get(end) == Some(&b',')).then_some(end)
        };
        let kind = Own {
            api_version: &self.api_version,
            kind: &self.kind,
            metadata: None,
            os: None,
        };
        let report = Own {
            metadata: Some(&self.metadata),
            os: Some(&self.os),
            ..kind
        };
        match (end(kind), end(report)) {
            // After the comma that follows `kind`, up to the comma that follows `os`.
            (Some(start), Some(end)) => start + 1..end,
            _ => 0..json.len(),
        }
    }
}
