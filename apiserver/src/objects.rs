//! The API objects built from channel data, one builder each, shared by the server's handlers
//! ([`crate::routes::resources`]) and the CLI ([`crate::cli`]), so both say the same thing.

use elemental_changelog::{compute::QueryError, data::ChannelData};
use elemental_changelog_apiservice::types::{
    ChannelRef, ManagedOSVersionChangelogSummary, ObjectMeta, UnavailableReason,
};

/// Where a version's data was read: channel name, the image and digest of the snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// ManagedOSVersionChannel name (empty when there is none, as for `inspect`).
    pub channel: &'a str,
    /// Image reference the snapshot was read from.
    pub image: &'a str,
    /// Manifest digest of that image.
    pub digest: &'a str,
}

/// The `channel` of an answer about version `name`: the digest is the one the version was
/// read from, which for a version retained from an earlier image is that image's.
pub fn channel_ref(source: Source<'_>, data: &ChannelData, name: &str) -> ChannelRef {
    let retained_from = data.version(name).and_then(|v| v.retained_from.clone());
    ChannelRef {
        name: source.channel.to_owned(),
        image: Some(source.image.to_owned()),
        retained: retained_from.is_some(),
        digest: Some(retained_from.unwrap_or_else(|| source.digest.to_owned())),
    }
}

/// The summary of version `name` from the data that holds it. `spec_version` is the
/// ManagedOSVersion's `spec.version` (empty: the channel entry's version is used).
pub fn summary(
    source: Source<'_>,
    data: &ChannelData,
    name: &str,
    metadata: ObjectMeta,
    spec_version: &str,
) -> ManagedOSVersionChangelogSummary {
    let mut summary = ManagedOSVersionChangelogSummary::new();
    summary.metadata = metadata;
    summary.channel = channel_ref(source, data, name);
    summary.version = spec_version.to_owned();
    if let Some(v) = data.version(name) {
        summary.created = v.entry.created.map(|t| t.to_string());
        if summary.version.is_empty() {
            summary.version = v.entry.version.clone();
        }
    }
    match data.summary(name) {
        Ok((from, counts)) => {
            summary.available = true;
            summary.from = from;
            summary.summary = Some(counts);
        }
        Err(error) => {
            summary.reason = Some(UnavailableReason::NoChangelogData);
            summary.message = Some(no_data_message(source, name, &error));
        }
    }
    summary
}

/// Why the data of `source` gives no changelog for `name`.
pub fn no_data_message(source: Source<'_>, name: &str, error: &QueryError) -> String {
    format!(
        "channel image {} ({}) has no changelog data for ManagedOSVersion {name}: {error}",
        source.image, source.digest
    )
}
