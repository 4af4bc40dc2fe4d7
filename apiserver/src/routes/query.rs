//! Resource requests: a ManagedOSVersion's changelog, and changelog
//! summaries of versions. Everything is answered from memory: the reflector
//! stores and the [`Cache`]; nothing here waits for the network.

use std::sync::Arc;

use elemental_changelog::{compute::QueryError, updates};
use elemental_changelog_apiservice::{
    RESOURCE, content,
    content::Representation,
    render,
    status::{StatusCause, StatusDetails, StatusError},
    table,
    types::{
        ChannelRef, ManagedOSVersionChangelogSummary, ManagedOSVersionChangelogSummaryList,
        ObjectMeta, UnavailableReason,
    },
};
use kube::ResourceExt;

use crate::oci::{FetchErrorKind, platform::rpm_arch};

use super::{
    HttpResponse, Route, ok,
    selector::{FieldSelector, LabelSelector},
};
use crate::{
    cache::{Cache, ChannelKey, ChannelState, Snapshot},
    channels::{
        Objects,
        crd::{ManagedOSVersion, ManagedOSVersionChannel},
    },
};

/// Seconds a client should wait before asking again for data being fetched
/// (client-go retries such a 503 up to ten times: about 20 s in all).
const RETRY_AFTER_NOT_FETCHED: u32 = 2;
/// The fetch error kind of an index without the requested platform.
const NO_MATCHING_PLATFORM: FetchErrorKind = FetchErrorKind::NoMatchingPlatform;

/// Answers resource requests.
pub struct Query {
    objects: Objects,
    cache: Arc<Cache>,
    default_arch: String,
    architectures: Vec<String>,
}

/// Query parameters of resource requests.
#[derive(Debug, Default)]
struct Params {
    from: Option<String>,
    arch: Option<String>,
    format: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    cve: Option<String>,
    include_object: Option<String>,
}

impl Params {
    fn parse(query: &str) -> Self {
        let mut p = Self::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let v = Some(v.into_owned()).filter(|v| !v.is_empty());
            match k.as_ref() {
                "from" => p.from = v,
                "arch" => p.arch = v,
                "format" => p.format = v,
                "labelSelector" => p.label_selector = v,
                "fieldSelector" => p.field_selector = v,
                "cve" => p.cve = v,
                "includeObject" => p.include_object = v,
                // limit, continue, timeoutSeconds, resourceVersion...: lists
                // here are small and always complete.
                _ => {}
            }
        }
        p
    }
}

/// Output formats of the changelog subresource (`?format=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Text,
    Markdown,
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

impl Query {
    /// A query over the reflector stores and the cache.
    pub fn new(
        objects: Objects,
        cache: Arc<Cache>,
        default_arch: String,
        architectures: Vec<String>,
    ) -> Self {
        Self {
            objects,
            cache,
            default_arch,
            architectures,
        }
    }

    /// Answers a resource route.
    pub fn answer(
        &self,
        route: &Route,
        accept: Option<&str>,
        query: &str,
    ) -> Result<HttpResponse, StatusError> {
        let params = Params::parse(query);
        match route {
            Route::Changelog { namespace, name } => {
                self.changelog(namespace, name, &params, accept)
            }
            Route::Get { namespace, name } => {
                let representation = content::negotiate(accept, params.include_object.as_deref())?;
                let arch = self.arch(&params)?;
                let version = self.version(namespace, name)?;
                let summary = self.summary(&version, &arch);
                Ok(respond_summaries(representation, vec![summary], false)?)
            }
            Route::List { namespace } => {
                let representation = content::negotiate(accept, params.include_object.as_deref())?;
                let arch = self.arch(&params)?;
                let labels =
                    LabelSelector::parse(params.label_selector.as_deref().unwrap_or_default())?;
                let fields =
                    FieldSelector::parse(params.field_selector.as_deref().unwrap_or_default())?;
                let cve = params.cve.as_deref().map(normalize_cve).transpose()?;
                let mut versions: Vec<Arc<ManagedOSVersion>> = self
                    .objects
                    .versions
                    .list(namespace.as_deref())
                    .into_iter()
                    .filter(|v| labels.matches(v.labels()))
                    .filter(|v| {
                        fields.matches(&v.name_any(), v.namespace().as_deref().unwrap_or_default())
                    })
                    .collect();
                if let Some(cve) = &cve {
                    versions = self.fixing(versions, cve, &arch);
                }
                let items = versions.iter().map(|v| self.summary(v, &arch)).collect();
                respond_summaries(representation, items, true)
            }
            _ => Err(StatusError::bad_request("not a resource request")),
        }
    }

    /// The architecture asked for, spelled as configured: the workers key the
    /// cache by the configured names (`amd64` and `x86_64` are the same).
    fn arch(&self, params: &Params) -> Result<String, StatusError> {
        let arch = params
            .arch
            .clone()
            .unwrap_or_else(|| self.default_arch.clone());
        let arch = rpm_arch(&arch).to_owned();
        if let Some(configured) = self.architectures.iter().find(|a| rpm_arch(a) == arch) {
            Ok(configured.clone())
        } else {
            Err(StatusError::bad_request(format!(
                "arch {arch:?} is not served; this server reads: {}",
                self.architectures.join(", ")
            )))
        }
    }

    fn version(&self, namespace: &str, name: &str) -> Result<Arc<ManagedOSVersion>, StatusError> {
        self.objects
            .versions
            .get(namespace, name)
            .ok_or_else(|| StatusError::not_found(RESOURCE, name))
    }

    /// Finds the snapshot that holds `version`'s data for `arch`, or says why
    /// there is none.
    fn lookup(&self, version: &ManagedOSVersion, arch: &str) -> Lookup {
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
                if let Some(f) = failure.as_ref().filter(|f| f.kind == NO_MATCHING_PLATFORM) {
                    // The image is fine; it just has nothing for this architecture.
                    return unavailable(
                        Some(channel_name),
                        Some(image.clone()),
                        UnavailableReason::NoChangelogData,
                        not_found_because(
                            &name,
                            "NoChangelogData",
                            format!(
                                "channel image {image} has no linux/{arch} image: {}",
                                f.message
                            ),
                        ),
                    );
                }
                let message = match failure {
                    Some(f) => format!(
                        "fetching channel image {image} for {arch} failed ({}): {}; the server keeps retrying",
                        f.kind, f.message
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
        params: &Params,
        accept: Option<&str>,
    ) -> Result<HttpResponse, StatusError> {
        let format = match params.format.as_deref() {
            None | Some("json") => Format::Json,
            Some("text") => Format::Text,
            Some("markdown" | "md") => Format::Markdown,
            Some(other) => {
                return Err(StatusError::bad_request(format!(
                    "format {other:?} is not supported: use json, text or markdown"
                )));
            }
        };
        if format == Format::Json {
            // A Table of a changelog is not offered; kubectl then prints the
            // object itself. Only types we cannot produce at all are refused.
            content::negotiate(accept, None)?;
        }
        let arch = self.arch(params)?;
        let version = self.version(namespace, name)?;
        let (channel, snapshot) = match self.lookup(&version, &arch) {
            Lookup::Found { channel, snapshot } => (channel, snapshot),
            Lookup::Unavailable { error, .. } => return Err(error),
        };
        if let Some(from) = &params.from {
            self.check_from(&version, from, &channel.name_any())?;
        }
        let mut changelog = snapshot
            .data
            .changelog(name, params.from.as_deref())
            .map_err(|e| query_error(name, &snapshot, &e))?;
        let data = snapshot.data.version(name);
        let retained_from = data.and_then(|v| v.retained_from.clone());
        changelog.metadata = object_meta(&version);
        changelog.channel = ChannelRef {
            name: channel.name_any(),
            image: Some(snapshot.image.clone()),
            digest: Some(
                retained_from
                    .clone()
                    .unwrap_or_else(|| snapshot.digest.clone()),
            ),
            retained: retained_from.is_some(),
        };
        changelog.arch = rpm_arch(&arch).to_owned();
        Ok(match format {
            Format::Json => ok(
                serde_json::to_vec(&changelog).unwrap_or_default(),
                content::JSON,
            ),
            Format::Text => ok(render::text(&changelog), "text/plain; charset=utf-8"),
            Format::Markdown => ok(render::markdown(&changelog), "text/markdown; charset=utf-8"),
        })
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

    fn summary(&self, version: &ManagedOSVersion, arch: &str) -> ManagedOSVersionChangelogSummary {
        let name = version.name_any();
        let mut summary = ManagedOSVersionChangelogSummary::new();
        summary.metadata = object_meta(version);
        summary.version = version.spec.version.clone();
        match self.lookup(version, arch) {
            Lookup::Found { channel, snapshot } => {
                let retained_from = snapshot
                    .data
                    .version(&name)
                    .and_then(|v| v.retained_from.clone());
                summary.channel = ChannelRef {
                    name: channel.name_any(),
                    image: Some(snapshot.image.clone()),
                    digest: Some(
                        retained_from
                            .clone()
                            .unwrap_or_else(|| snapshot.digest.clone()),
                    ),
                    retained: retained_from.is_some(),
                };
                if let Some(v) = snapshot.data.version(&name) {
                    summary.created = v.entry.created.map(|t| t.to_string());
                    if summary.version.is_empty() {
                        summary.version = v.entry.version.clone();
                    }
                }
                match snapshot.data.summary(&name) {
                    Ok((from, counts)) => {
                        summary.available = true;
                        summary.from = from;
                        summary.summary = Some(counts);
                    }
                    Err(e) => {
                        let error = query_error(&name, &snapshot, &e);
                        summary.reason = Some(UnavailableReason::NoChangelogData);
                        summary.message = Some(error.message);
                    }
                }
            }
            Lookup::Unavailable {
                channel_name,
                image,
                reason,
                error,
            } => {
                summary.channel = ChannelRef {
                    name: channel_name.unwrap_or_default(),
                    image,
                    ..ChannelRef::default()
                };
                summary.reason = Some(reason);
                summary.message = Some(error.message);
            }
        }
        summary
    }

    /// The versions whose changelog fixes `cve`, oldest first (by channel
    /// order: `created`, then version), so the first is the first fix.
    fn fixing(
        &self,
        versions: Vec<Arc<ManagedOSVersion>>,
        cve: &str,
        arch: &str,
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

fn query_error(name: &str, snapshot: &Snapshot, error: &QueryError) -> StatusError {
    match error {
        QueryError::UnknownVersion { .. } | QueryError::NoData { .. } => not_found_because(
            name,
            "NoChangelogData",
            format!(
                "channel image {} ({}) has no changelog data for ManagedOSVersion {name}: {error}",
                snapshot.image, snapshot.digest
            ),
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

/// Accepts `CVE-2024-1234` in any case; refuses what cannot be a CVE id.
fn normalize_cve(cve: &str) -> Result<String, StatusError> {
    let cve = cve.trim();
    if updates::is_cve_id(cve) {
        Ok(cve.to_ascii_uppercase())
    } else {
        Err(StatusError::bad_request(format!(
            "cve: {cve:?} is not a CVE id (CVE-YYYY-NNNN)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_and_normalization() {
        let p = Params::parse(
            "from=v1&arch=arm64&format=text&labelSelector=a%3Db&cve=cve-2024-0001&limit=500",
        );
        assert_eq!(p.from.as_deref(), Some("v1"));
        assert_eq!(p.label_selector.as_deref(), Some("a=b"));
        assert_eq!(rpm_arch(p.arch.as_deref().unwrap_or_default()), "aarch64");
        assert_eq!(
            normalize_cve("cve-2024-0001").ok().as_deref(),
            Some("CVE-2024-0001")
        );
        assert!(normalize_cve("CVE-24-1").is_err());
        assert!(normalize_cve("GHSA-xxxx").is_err());
    }
}

#[cfg(test)]
mod scenario_tests;
