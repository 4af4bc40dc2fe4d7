//! Where each ManagedOSVersion's data stands, read from the channel and version stores and
//! the cache of channel data: the snapshot that holds it, or why none does (the reason and the
//! `Status` a request gets). Read by the routes (a changelog, a summary) and by the projectors
//! that keep the summaries (`crate::projectors`); below both, it knows nothing of HTTP.

use std::sync::Arc;

use elemental_changelog_apiservice::{
    Arch, RESOURCE,
    status::{CauseReason, StatusCause, StatusError},
    types::{ManagedOSVersionChangelogSummary, ObjectMeta, UnavailableReason},
};
use kube::ResourceExt;

use crate::{
    cache::{Cache, ChannelKey, ChannelState, RetainedStatus, Snapshot},
    channels::{
        ChannelStores,
        crd::{ManagedOSVersion, ManagedOSVersionChannel},
    },
    objects::{self, Source},
    read_error::ReadErrorKind,
};

/// Seconds a client should wait before asking again for data being fetched
/// (client-go retries such a 503 up to ten times: about 20 s in all).
pub(crate) const RETRY_AFTER_NOT_FETCHED: u32 = 2;
/// The fetch error kind of an index without the requested platform.
pub(crate) const NO_MATCHING_PLATFORM: ReadErrorKind = ReadErrorKind::NO_MATCHING_PLATFORM;

/// The channel and version stores and the channel data, read together.
#[derive(Clone)]
pub struct VersionData {
    /// The channels and versions.
    pub stores: ChannelStores,
    /// The channel data.
    pub cache: Arc<Cache>,
}

/// Where a version's data stands: the snapshot holding it, or why none does.
pub(crate) enum Lookup {
    Found {
        channel: Arc<ManagedOSVersionChannel>,
        snapshot: Arc<Snapshot>,
    },
    Unavailable {
        channel_name: Option<String>,
        image: Option<String>,
        reason: UnavailableReason,
        error: StatusError,
    },
}

impl VersionData {
    /// The snapshot holding the data of channel `namespace/channel` for `arch`, if fetched.
    pub(crate) fn channel_snapshot(
        &self,
        namespace: &str,
        channel: &str,
        arch: &Arch,
    ) -> Option<Arc<Snapshot>> {
        self.cache
            .get(&ChannelKey::new(namespace, channel))?
            .archs
            .get(arch.as_str())?
            .snapshot
            .clone()
    }

    /// Finds the snapshot that holds `version`'s data for `arch`, or says why
    /// there is none.
    pub(crate) fn lookup(&self, version: &ManagedOSVersion, arch: &Arch) -> Lookup {
        let name = version.name_any();
        let namespace = version.namespace().unwrap_or_default();
        let Some(channel_name) = version.channel_name().map(str::to_owned) else {
            return Lookup::no_channel(
                None,
                &name,
                format!(
                    "ManagedOSVersion {namespace}/{name} has no channel (no controller owner reference nor elemental.cattle.io/channel label)"
                ),
            );
        };
        let Some(channel) = self.stores.channels.get(&namespace, &channel_name) else {
            let message = format!(
                "ManagedOSVersionChannel {namespace}/{channel_name} of ManagedOSVersion {name} does not exist"
            );
            return Lookup::no_channel(Some(channel_name), &name, message);
        };
        let key = ChannelKey::new(&namespace, &channel_name);
        let state = self.cache.get(&key);
        let snapshot = state
            .as_ref()
            .and_then(|s| s.archs.get(arch.as_str()))
            .and_then(|a| a.snapshot.clone());
        match snapshot {
            Some(snapshot) if snapshot.data.version(&name).is_some() => {
                Lookup::Found { channel, snapshot }
            }
            Some(snapshot) => self.not_in_snapshot(version, &key, &channel, &snapshot, arch),
            None => not_fetched(version, &key, &channel, state.as_deref(), arch),
        }
    }

    /// Why a version that the channel's snapshot does not hold has no data: an older image
    /// of the channel lists it (being read again, or failing), or it has none.
    pub(crate) fn not_in_snapshot(
        &self,
        version: &ManagedOSVersion,
        key: &ChannelKey,
        channel: &ManagedOSVersionChannel,
        snapshot: &Snapshot,
        arch: &Arch,
    ) -> Lookup {
        let name = version.name_any();
        let (namespace, channel_name) = (&key.namespace, &key.name);
        let image = channel.image().map(str::to_owned);
        // A version an older image listed (the channel history says which), while
        // that image is pulled again or after pulling it failed: never a 404.
        let (message, reason, retry) = match self.cache.retained_status(key, arch.as_str(), &name) {
            Some(RetainedStatus::Rebuilding { image: older }) => (
                format!(
                    "the changelog data of ManagedOSVersion {namespace}/{name} is being read again from {older}, an earlier image of channel {channel_name}"
                ),
                UnavailableReason::NotFetched,
                Some(RETRY_AFTER_NOT_FETCHED),
            ),
            Some(RetainedStatus::Failed {
                image: older,
                failure,
            }) => (
                format!(
                    "ManagedOSVersion {namespace}/{name} is listed only by {older}, an earlier image of channel {channel_name}: {} ({}); the server keeps retrying",
                    failure.kind.public_message(),
                    failure.kind
                ),
                UnavailableReason::FetchFailed,
                None,
            ),
            None if !version.spec.type_.is_empty()
                && !version.spec.type_.eq_ignore_ascii_case("container") =>
            {
                let message = format!(
                    "ManagedOSVersion {name} is of type {:?}: changelogs exist for container (OS) versions only",
                    version.spec.type_
                );
                return Lookup::no_data(channel_name, image, &name, message);
            }
            // Not in the image served, while a newer one is not read (yet): never a 404.
            None => match self.unread(key, channel, version, snapshot, arch) {
                Some(unread) => unread,
                None => {
                    let message = format!(
                        "channel image {} ({}) has no changelog data for ManagedOSVersion {name}",
                        snapshot.image, snapshot.digest
                    );
                    return Lookup::no_data(channel_name, image, &name, message);
                }
            },
        };
        Lookup::unavailable(channel_name, image, &name, reason, message, retry)
    }

    /// Why a version the served snapshot lacks may still come (message, reason, retry):
    /// the channel's latest sync is not read yet, or the last read started before this
    /// server knew of the version (the operator creates versions, then marks the channel
    /// synced; the watches may show either first) (`NotFetched`); or reading the channel's image failed (`FetchFailed`, the
    /// sanitized kind), so the image that lists the version may be one the server could
    /// not read. `None` when an image read once the version existed lacks it: it really
    /// has no data.
    pub(crate) fn unread(
        &self,
        key: &ChannelKey,
        channel: &ManagedOSVersionChannel,
        version: &ManagedOSVersion,
        snapshot: &Snapshot,
        arch: &Arch,
    ) -> Option<(String, UnavailableReason, Option<u32>)> {
        let name = version.name_any();
        let (namespace, channel_name) = (&key.namespace, &key.name);
        let image = channel.image().unwrap_or(snapshot.image.as_str());
        let served = format!(
            "ManagedOSVersion {namespace}/{name} is not in channel image {} ({}), the last one read",
            snapshot.image, snapshot.digest
        );
        if self
            .cache
            .refreshed(key)
            .is_some_and(|r| r.sync != channel.sync_key() || !r.versions.contains(&name))
        {
            let message = format!(
                "{served}; image {image} of channel {channel_name} is not read yet since the channel was re-synced or the version created"
            );
            return Some((
                message,
                UnavailableReason::NotFetched,
                Some(RETRY_AFTER_NOT_FETCHED),
            ));
        }
        let state = self.cache.get(key)?;
        let failure = state.archs.get(arch.as_str())?.last_error.clone()?;
        if failure.kind == NO_MATCHING_PLATFORM {
            return None;
        }
        let message = format!(
            "{served}; reading channel image {image} for {}: {} ({}); the server keeps retrying",
            arch.as_str(),
            failure.kind.public_message(),
            failure.kind
        );
        Some((
            message,
            UnavailableReason::FetchFailed,
            Some(RETRY_AFTER_NOT_FETCHED),
        ))
    }

    /// Every fetched channel's data for `arch`, in `namespace` (or all), by namespace and
    /// channel name.
    pub fn snapshots(
        &self,
        namespace: Option<&str>,
        arch: &Arch,
    ) -> std::collections::HashMap<(String, String), Arc<Snapshot>> {
        self.stores
            .channels
            .list(namespace)
            .iter()
            .filter_map(|channel| {
                let (namespace, name) = (channel.namespace()?, channel.name_any());
                let snapshot = self.channel_snapshot(&namespace, &name, arch)?;
                Some(((namespace, name), snapshot))
            })
            .collect()
    }

    /// The summary of `version` for `arch`, from where its data stands.
    pub fn summary_of(
        &self,
        version: &ManagedOSVersion,
        arch: &Arch,
    ) -> ManagedOSVersionChangelogSummary {
        summary(version, &self.lookup(version, arch))
    }
}

/// Why a version whose channel has no snapshot for `arch` has no data: the channel has no
/// image, the image has nothing for `arch`, fetching failed, or it is not fetched yet.
pub(crate) fn not_fetched(
    version: &ManagedOSVersion,
    key: &ChannelKey,
    channel: &ManagedOSVersionChannel,
    state: Option<&ChannelState>,
    arch: &Arch,
) -> Lookup {
    let name = version.name_any();
    let (namespace, channel_name) = (&key.namespace, &key.name);
    let Some(image) = channel.image().map(str::to_owned) else {
        let message = format!(
            "ManagedOSVersionChannel {namespace}/{channel_name} has no image (type {:?}), so it carries no changelog data",
            channel.spec.type_
        );
        return Lookup::unavailable_404(
            Some(channel_name.clone()),
            None,
            &name,
            UnavailableReason::ChannelHasNoImage,
            message,
        );
    };
    let Some(ChannelState {
        attempted: true,
        archs,
        ..
    }) = state
    else {
        let message = format!(
            "the changelog data of channel {namespace}/{channel_name} (image {image}) is not fetched yet"
        );
        return Lookup::unavailable(
            channel_name,
            Some(image),
            &name,
            UnavailableReason::NotFetched,
            message,
            Some(RETRY_AFTER_NOT_FETCHED),
        );
    };
    let arch = arch.as_str();
    let failure = archs.get(arch).and_then(|a| a.last_error.clone());
    if failure
        .as_ref()
        .is_some_and(|f| f.kind == NO_MATCHING_PLATFORM)
    {
        // The image is fine; it just has nothing for this architecture.
        let message = format!("channel image {image} has no linux/{arch} image");
        return Lookup::no_data(channel_name, Some(image), &name, message);
    }
    let message = match failure {
        // The registry's own words (bodies, token realms) stay in the
        // logs and the metric label; callers get the kind.
        Some(f) => format!(
            "channel image {image} for {arch}: {} ({}); the server keeps retrying",
            f.kind.public_message(),
            f.kind
        ),
        None => format!("channel image {image} has no data for {arch} yet"),
    };
    // No Retry-After: clients such as kubectl would silently retry
    // for minutes what needs an operator's attention.
    Lookup::unavailable(
        channel_name,
        Some(image),
        &name,
        UnavailableReason::FetchFailed,
        message,
        None,
    )
}

impl Lookup {
    /// A 404: the version has no channel (`NoChannel`).
    pub(crate) fn no_channel(channel_name: Option<String>, name: &str, message: String) -> Self {
        Self::unavailable_404(
            channel_name,
            None,
            name,
            UnavailableReason::NoChannel,
            message,
        )
    }

    /// A 404: the data has nothing for the version (`NoChangelogData`).
    pub(crate) fn no_data(
        channel_name: &str,
        image: Option<String>,
        name: &str,
        message: String,
    ) -> Self {
        Self::unavailable_404(
            Some(channel_name.to_owned()),
            image,
            name,
            UnavailableReason::NoChangelogData,
            message,
        )
    }

    pub(crate) fn unavailable_404(
        channel_name: Option<String>,
        image: Option<String>,
        name: &str,
        reason: UnavailableReason,
        message: String,
    ) -> Self {
        let error = not_found_because(name, reason, message);
        Self::Unavailable {
            channel_name,
            image,
            reason,
            error,
        }
    }

    /// A 503: the data is not there yet, or fetching it failed.
    pub(crate) fn unavailable(
        channel_name: &str,
        image: Option<String>,
        name: &str,
        reason: UnavailableReason,
        message: String,
        retry_after: Option<u32>,
    ) -> Self {
        let mut error = StatusError::service_unavailable(message, retry_after);
        add_cause(&mut error, name, reason);
        Self::Unavailable {
            channel_name: Some(channel_name.to_owned()),
            image,
            reason,
            error,
        }
    }
}

/// The `reason` of a `Status` cause for an unavailable version.
/// The summary of a version, from where its data stands.
pub(crate) fn summary(
    version: &ManagedOSVersion,
    lookup: &Lookup,
) -> ManagedOSVersionChangelogSummary {
    match lookup {
        Lookup::Found { channel, snapshot } => objects::summary(
            source(&channel.name_any(), snapshot),
            &snapshot.data,
            &version.name_any(),
            object_meta(version),
            &version.spec.version,
        ),
        Lookup::Unavailable {
            channel_name,
            image,
            reason,
            error,
        } => {
            let mut summary = ManagedOSVersionChangelogSummary::new();
            summary.metadata = object_meta(version);
            summary.version = version.spec.version.clone();
            summary.channel.name = channel_name.clone().unwrap_or_default();
            summary.channel.image = image.clone();
            summary.reason = Some(*reason);
            summary.message = Some(error.message.clone());
            summary
        }
    }
}

pub(crate) fn object_meta(version: &ManagedOSVersion) -> ObjectMeta {
    ObjectMeta {
        name: version.name_any(),
        namespace: version.namespace().unwrap_or_default(),
        uid: version.uid(),
        resource_version: version.resource_version(),
        creation_timestamp: version.creation_timestamp().map(|t| t.0.to_string()),
        labels: version.labels().clone(),
    }
}

pub(crate) fn not_found_because(
    name: &str,
    reason: UnavailableReason,
    message: String,
) -> StatusError {
    let mut error = StatusError::not_found(RESOURCE, name);
    error.message = message;
    add_cause(&mut error, name, reason);
    error
}

pub(crate) fn add_cause(error: &mut StatusError, name: &str, reason: UnavailableReason) {
    let details = error.details.get_or_insert_with(Box::default);
    if details.name.is_empty() {
        details.name = name.to_owned();
        details.group = elemental_changelog_apiservice::GROUP.to_owned();
        details.kind = RESOURCE.to_owned();
    }
    details.causes.push(StatusCause {
        reason: CauseReason::Unavailable(reason),
        message: error.message.clone(),
        field: String::new(),
    });
}

/// Where `snapshot` was read, for the object builders.
pub(crate) fn source<'a>(channel: &'a str, snapshot: &'a Snapshot) -> Source<'a> {
    Source {
        channel,
        image: &snapshot.image,
        digest: &snapshot.digest,
    }
}
