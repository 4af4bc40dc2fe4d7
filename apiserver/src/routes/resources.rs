//! Resource requests: a ManagedOSVersion's changelog, and changelog
//! summaries of versions. Everything is answered from memory: the reflector
//! stores and the [`Cache`]; nothing here waits for the network.

use std::sync::Arc;

use elemental_changelog::compute::QueryError;
use elemental_changelog_apiservice::{
    Arch, RESOURCE, content,
    content::{IncludeObject, Representation},
    render,
    status::{StatusCause, StatusDetails, StatusError},
    table,
    types::{
        ManagedOSVersionChangelogSummary, ManagedOSVersionChangelogSummaryList, ObjectMeta,
        UnavailableReason,
    },
};
use kube::ResourceExt;

use super::{HttpResponse, ok};
use crate::oci::FetchErrorKind;
use crate::{
    cache::{Cache, ChannelKey, ChannelState, RetainedStatus, Snapshot},
    channels::{
        Objects,
        crd::{ManagedOSVersion, ManagedOSVersionChannel},
    },
    objects::{self, Source},
    request::{ChangelogParams, Format, ListParams, Resource},
};

/// Seconds a client should wait before asking again for data being fetched
/// (client-go retries such a 503 up to ten times: about 20 s in all).
const RETRY_AFTER_NOT_FETCHED: u32 = 2;
/// The fetch error kind of an index without the requested platform.
const NO_MATCHING_PLATFORM: FetchErrorKind = FetchErrorKind::NoMatchingPlatform;

/// Answers resource requests.
pub struct Resources {
    objects: Objects,
    cache: Arc<Cache>,
    default_arch: Arch,
    architectures: Vec<Arch>,
}

/// Where a version's data stands: the snapshot holding it, or why none does.
enum Lookup {
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

impl Resources {
    /// Answers over the reflector stores and the cache; `architectures` are those the
    /// channel workers read (the cache is keyed by their RPM names).
    pub fn new(
        objects: Objects,
        cache: Arc<Cache>,
        default_arch: Arch,
        architectures: Vec<Arch>,
    ) -> Self {
        Self {
            objects,
            cache,
            default_arch,
            architectures,
        }
    }

    /// Answers a resource request.
    pub fn answer(
        &self,
        resource: &Resource,
        accept: Option<&str>,
    ) -> Result<HttpResponse, StatusError> {
        match resource {
            Resource::Changelog {
                namespace,
                name,
                params,
            } => self.changelog(namespace, name, params, accept),
            Resource::Get {
                namespace,
                name,
                params,
            } => {
                let representation = content::negotiate(accept, params.include_object)?;
                let arch = self.arch(params.arch.as_ref())?;
                let version = self.version(namespace, name)?;
                let summary = self.summary(&version, arch);
                respond_summaries(representation, vec![summary], false)
            }
            Resource::List { namespace, params } => {
                let representation = content::negotiate(accept, params.include_object)?;
                self.summaries(namespace.as_deref(), params, representation)
            }
        }
    }

    /// Summaries of the versions a list selects; with `cve`, only those fixing it.
    fn summaries(
        &self,
        namespace: Option<&str>,
        params: &ListParams,
        representation: Representation,
    ) -> Result<HttpResponse, StatusError> {
        params.fields.check_supported()?;
        let arch = self.arch(params.arch.as_ref())?;
        let mut versions: Vec<Arc<ManagedOSVersion>> = self
            .objects
            .versions
            .list(namespace)
            .into_iter()
            .filter(|v| params.labels.matches(v.labels()))
            .filter(|v| {
                params
                    .fields
                    .matches(&v.name_any(), v.namespace().as_deref().unwrap_or_default())
            })
            .collect();
        if let Some(cve) = &params.cve {
            versions = self.fixing(versions, cve, arch);
        }
        let items = versions.iter().map(|v| self.summary(v, arch)).collect();
        respond_summaries(representation, items, true)
    }

    /// The architecture asked for (the default when none), if this server reads it.
    fn arch(&self, asked: Option<&Arch>) -> Result<&Arch, StatusError> {
        let arch = asked.unwrap_or(&self.default_arch);
        self.architectures
            .iter()
            .find(|served| *served == arch)
            .ok_or_else(|| {
                StatusError::bad_request(format!(
                    "arch {:?} is not served; this server reads: {}",
                    arch.as_str(),
                    self.architectures
                        .iter()
                        .map(Arch::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    fn version(&self, namespace: &str, name: &str) -> Result<Arc<ManagedOSVersion>, StatusError> {
        self.objects
            .versions
            .get(namespace, name)
            .ok_or_else(|| StatusError::not_found(RESOURCE, name))
    }

    /// Finds the snapshot that holds `version`'s data for `arch`, or says why
    /// there is none.
    fn lookup(&self, version: &ManagedOSVersion, arch: &Arch) -> Lookup {
        let arch = arch.as_str();
        let name = version.name_any();
        let namespace = version.namespace().unwrap_or_default();
        let unavailable = |channel_name: Option<String>, image: Option<String>, reason, error| {
            Lookup::Unavailable {
                channel_name,
                image,
                reason,
                error,
            }
        };
        let Some(channel_name) = version.channel_name().map(str::to_owned) else {
            return unavailable(
                None,
                None,
                UnavailableReason::NoChannel,
                not_found_because(
                    &name,
                    "NoChannel",
                    format!(
                        "ManagedOSVersion {namespace}/{name} has no channel (no controller owner reference nor elemental.cattle.io/channel label)"
                    ),
                ),
            );
        };
        let Some(channel) = self.objects.channels.get(&namespace, &channel_name) else {
            return unavailable(
                Some(channel_name.clone()),
                None,
                UnavailableReason::NoChannel,
                not_found_because(
                    &name,
                    "NoChannel",
                    format!(
                        "ManagedOSVersionChannel {namespace}/{channel_name} of ManagedOSVersion {name} does not exist"
                    ),
                ),
            );
        };
        let image = channel.image().map(str::to_owned);
        let state = self.cache.get(&ChannelKey::new(&namespace, &channel_name));
        let snapshot = state
            .as_ref()
            .and_then(|s| s.archs.get(arch))
            .and_then(|a| a.snapshot.clone());
        if let Some(snapshot) = snapshot {
            if snapshot.data.version(&name).is_some() {
                return Lookup::Found { channel, snapshot };
            }
            // A version an older image listed (the channel history says which), while
            // that image is pulled again or after pulling it failed: never a 404.
            let key = ChannelKey::new(&namespace, &channel_name);
            match self.cache.retained_status(&key, arch, &name) {
                Some(RetainedStatus::Rebuilding { image: older }) => {
                    let mut error = StatusError::service_unavailable(
                        format!(
                            "the changelog data of ManagedOSVersion {namespace}/{name} is being read again from {older}, an earlier image of channel {channel_name}"
                        ),
                        Some(RETRY_AFTER_NOT_FETCHED),
                    );
                    add_cause(&mut error, &name, "NotFetched");
                    return unavailable(
                        Some(channel_name),
                        image,
                        UnavailableReason::NotFetched,
                        error,
                    );
                }
                Some(RetainedStatus::Failed {
                    image: older,
                    failure,
                }) => {
                    let mut error = StatusError::service_unavailable(
                        format!(
                            "ManagedOSVersion {namespace}/{name} is listed only by {older}, an earlier image of channel {channel_name}: {} ({}); the server keeps retrying",
                            failure.kind.public_message(),
                            failure.kind
                        ),
                        None,
                    );
                    add_cause(&mut error, &name, "FetchFailed");
                    return unavailable(
                        Some(channel_name),
                        image,
                        UnavailableReason::FetchFailed,
                        error,
                    );
                }
                None => {}
            }
            if !version.spec.type_.is_empty()
                && !version.spec.type_.eq_ignore_ascii_case("container")
            {
                return unavailable(
                    Some(channel_name),
                    image,
                    UnavailableReason::NoChangelogData,
                    not_found_because(
                        &name,
                        "NoChangelogData",
                        format!(
                            "ManagedOSVersion {name} is of type {:?}: changelogs exist for container (OS) versions only",
                            version.spec.type_
                        ),
                    ),
                );
            }
            return unavailable(
                Some(channel_name),
                image,
                UnavailableReason::NoChangelogData,
                not_found_because(
                    &name,
                    "NoChangelogData",
                    format!(
                        "channel image {} ({}) has no changelog data for ManagedOSVersion {name}",
                        snapshot.image, snapshot.digest
                    ),
                ),
            );
        }
        let Some(image) = image else {
            return unavailable(
                Some(channel_name.clone()),
                None,
                UnavailableReason::ChannelHasNoImage,
                not_found_because(
                    &name,
                    "ChannelHasNoImage",
                    format!(
                        "ManagedOSVersionChannel {namespace}/{channel_name} has no image (type {:?}), so it carries no changelog data",
                        channel.spec.type_
                    ),
                ),
            );
        };
        match state.as_deref() {
            Some(ChannelState {
                attempted: true,
                archs,
                ..
            }) => {
                let failure = archs.get(arch).and_then(|a| a.last_error.clone());
                if failure
                    .as_ref()
                    .is_some_and(|f| f.kind == NO_MATCHING_PLATFORM)
                {
                    // The image is fine; it just has nothing for this architecture.
                    return unavailable(
                        Some(channel_name),
                        Some(image.clone()),
                        UnavailableReason::NoChangelogData,
                        not_found_because(
                            &name,
                            "NoChangelogData",
                            format!("channel image {image} has no linux/{arch} image"),
                        ),
                    );
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
                let mut error = StatusError::service_unavailable(message, None);
                add_cause(&mut error, &name, "FetchFailed");
                unavailable(
                    Some(channel_name),
                    Some(image),
                    UnavailableReason::FetchFailed,
                    error,
                )
            }
            _ => {
                let mut error = StatusError::service_unavailable(
                    format!(
                        "the changelog data of channel {namespace}/{channel_name} (image {image}) is not fetched yet"
                    ),
                    Some(RETRY_AFTER_NOT_FETCHED),
                );
                add_cause(&mut error, &name, "NotFetched");
                unavailable(
                    Some(channel_name),
                    Some(image),
                    UnavailableReason::NotFetched,
                    error,
                )
            }
        }
    }

    fn changelog(
        &self,
        namespace: &str,
        name: &str,
        params: &ChangelogParams,
        accept: Option<&str>,
    ) -> Result<HttpResponse, StatusError> {
        if params.format == Format::Json {
            // A Table of a changelog is not offered; kubectl then prints the
            // object itself. Only types we cannot produce at all are refused.
            content::negotiate(accept, IncludeObject::default())?;
        }
        let arch = self.arch(params.arch.as_ref())?;
        let version = self.version(namespace, name)?;
        let (channel, snapshot) = match self.lookup(&version, arch) {
            Lookup::Found { channel, snapshot } => (channel, snapshot),
            Lookup::Unavailable { error, .. } => return Err(error),
        };
        let channel_name = channel.name_any();
        if let Some(from) = &params.from {
            self.check_from(&version, from, &channel_name)?;
        }
        let source = source(&channel_name, &snapshot);
        let changelog = objects::changelog(
            source,
            &snapshot.data,
            name,
            params.from.as_deref(),
            object_meta(&version),
            arch,
        )
        .map_err(|e| query_error(name, source, &e))?;
        let mut response = match params.format {
            Format::Json => ok(
                serde_json::to_vec(&changelog).unwrap_or_default(),
                content::JSON,
            ),
            Format::Text => ok(render::text(&changelog), "text/plain; charset=utf-8"),
            Format::Markdown => ok(render::markdown(&changelog), "text/markdown; charset=utf-8"),
        };
        // kubectl (and client-go) print these on stderr.
        for warning in &changelog.warnings {
            if let Ok(value) = http::HeaderValue::from_str(&objects::warning_header(warning)) {
                response.headers_mut().append(http::header::WARNING, value);
            }
        }
        Ok(response)
    }

    /// `from` must name a ManagedOSVersion of the same channel.
    fn check_from(
        &self,
        version: &ManagedOSVersion,
        from: &str,
        channel: &str,
    ) -> Result<(), StatusError> {
        let namespace = version.namespace().unwrap_or_default();
        let Some(other) = self.objects.versions.get(&namespace, from) else {
            return Err(StatusError::bad_request(format!(
                "from: ManagedOSVersion {namespace}/{from} does not exist"
            )));
        };
        match other.channel_name() {
            Some(c) if c == channel => Ok(()),
            Some(c) => Err(StatusError::bad_request(format!(
                "from: ManagedOSVersion {from} belongs to channel {c}, not to channel {channel} of {}",
                version.name_any()
            ))),
            None => Err(StatusError::bad_request(format!(
                "from: ManagedOSVersion {from} belongs to no channel"
            ))),
        }
    }

    fn summary(&self, version: &ManagedOSVersion, arch: &Arch) -> ManagedOSVersionChangelogSummary {
        let name = version.name_any();
        match self.lookup(version, arch) {
            Lookup::Found { channel, snapshot } => objects::summary(
                source(&channel.name_any(), &snapshot),
                &snapshot.data,
                &name,
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
                summary.channel.name = channel_name.unwrap_or_default();
                summary.channel.image = image;
                summary.reason = Some(reason);
                summary.message = Some(error.message);
                summary
            }
        }
    }

    /// The versions whose changelog fixes `cve`, oldest first (by channel
    /// order: `created`, then version), so the first is the first fix.
    fn fixing(
        &self,
        versions: Vec<Arc<ManagedOSVersion>>,
        cve: &str,
        arch: &Arch,
    ) -> Vec<Arc<ManagedOSVersion>> {
        // By namespace and channel, then the channel data's own order
        // (`created`, then version).
        let mut hits: Vec<(ChannelPosition, Arc<ManagedOSVersion>)> = Vec::new();
        for version in versions {
            let name = version.name_any();
            if let Lookup::Found { snapshot, .. } = self.lookup(&version, arch)
                && snapshot.data.fixes_cve(&name, cve)
            {
                let position = snapshot.data.order().iter().position(|n| *n == name);
                let key = (
                    version.namespace(),
                    version.channel_name().map(str::to_owned),
                    position.unwrap_or(usize::MAX),
                );
                hits.push((key, version));
            }
        }
        hits.sort_by(|a, b| a.0.cmp(&b.0));
        hits.into_iter().map(|(_, v)| v).collect()
    }
}

/// Where a version stands: namespace, channel, index in the channel's order.
type ChannelPosition = (Option<String>, Option<String>, usize);

fn respond_summaries(
    representation: Representation,
    items: Vec<ManagedOSVersionChangelogSummary>,
    list: bool,
) -> Result<HttpResponse, StatusError> {
    let content_type = representation.content_type();
    let body = match representation {
        Representation::Table {
            version,
            include_object,
        } => {
            let table = table::summaries_table_version(
                &items,
                true,
                version,
                include_object,
                jiff::Timestamp::now(),
            );
            serde_json::to_vec(&table)
        }
        Representation::Json if list => {
            serde_json::to_vec(&ManagedOSVersionChangelogSummaryList::new(items))
        }
        Representation::Json => match items.into_iter().next() {
            Some(item) => serde_json::to_vec(&item),
            None => serde_json::to_vec(&ManagedOSVersionChangelogSummaryList::new(Vec::new())),
        },
    };
    let body = body.map_err(|e| StatusError::internal(&e))?;
    Ok(ok(body, content_type))
}

fn object_meta(version: &ManagedOSVersion) -> ObjectMeta {
    ObjectMeta {
        name: version.name_any(),
        namespace: version.namespace().unwrap_or_default(),
        uid: version.uid(),
        resource_version: version.resource_version(),
        creation_timestamp: version.creation_timestamp().map(|t| t.0.to_string()),
        labels: version.labels().clone(),
    }
}

fn not_found_because(name: &str, reason: &str, message: String) -> StatusError {
    let mut error = StatusError::not_found(RESOURCE, name);
    error.message = message;
    add_cause(&mut error, name, reason);
    error
}

fn add_cause(error: &mut StatusError, name: &str, reason: &str) {
    let details = error.details.get_or_insert_with(Box::default);
    if details.name.is_empty() {
        details.name = name.to_owned();
        details.group = elemental_changelog_apiservice::GROUP.to_owned();
        details.kind = RESOURCE.to_owned();
    }
    details.causes.push(StatusCause {
        reason: reason.to_owned(),
        message: error.message.clone(),
        field: String::new(),
    });
}

/// Where `snapshot` was read, for the object builders.
fn source<'a>(channel: &'a str, snapshot: &'a Snapshot) -> Source<'a> {
    Source {
        channel,
        image: &snapshot.image,
        digest: &snapshot.digest,
    }
}

fn query_error(name: &str, source: Source<'_>, error: &QueryError) -> StatusError {
    match error {
        QueryError::UnknownVersion { .. } | QueryError::NoData { .. } => not_found_because(
            name,
            "NoChangelogData",
            objects::no_data_message(source, name, error),
        ),
        _ => {
            let mut e = StatusError::bad_request(error.to_string());
            e.details = Some(Box::new(StatusDetails {
                causes: vec![StatusCause {
                    reason: "FieldValueInvalid".into(),
                    message: error.to_string(),
                    field: "from".into(),
                }],
                ..StatusDetails::default()
            }));
            e
        }
    }
}

#[cfg(test)]
mod scenario_tests;
