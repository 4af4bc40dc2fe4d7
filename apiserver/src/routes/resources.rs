//! Resource requests: a ManagedOSVersion's changelog, and changelog
//! summaries of versions. Everything is answered from memory: the reflector
//! stores and the [`Cache`]; nothing here waits for the network.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use elemental_changelog::{compute::QueryError, package_index::PackageQuery};
use elemental_changelog_apiservice::{
    API_VERSION, Arch, RESOURCE, SUMMARY_LIST_KIND, content,
    content::{IncludeObject, Representation},
    render,
    status::{CauseReason, StatusCause, StatusDetails, StatusError},
    table,
    types::{
        ManagedOSVersionChangelogSummary, ManagedOSVersionChangelogSummaryList, ObjectMeta,
        PackagePresence, UnavailableReason,
    },
};
use elemental_changelog_hub::{Item, Object, Reader, ResourceVersion};
use kube::ResourceExt;

use super::{
    HttpResponse,
    ready::{AnswerKeyBytes, Ready, ReadyCache},
};
use crate::versions::{Lookup, VersionData, not_found_because, object_meta, source, summary};
use crate::{
    cache::{Cache, Generation, Snapshot},
    channels::{
        ChannelStores,
        crd::{ManagedOSVersion, ManagedOSVersionChannel},
    },
    objects::{self, Source},
    projectors::Projectors,
    request::{
        ChangelogParams, Format, ListParams, Resource,
        selector::{FieldSelector, LabelSelector},
    },
};

/// Answers resource requests.
pub struct Resources {
    stores: ChannelStores,
    cache: Arc<Cache>,
    /// Where each version's data stands.
    data: VersionData,
    default_arch: Arch,
    architectures: Vec<Arch>,
    ready: ReadyCache<AnswerKey>,
    /// The summaries computed when their inputs change: lists, gets and watches.
    projectors: Arc<Projectors>,
}

/// What a kept answer depends on: two requests with equal keys get the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AnswerKey {
    /// A changelog. The ManagedOSVersion is named by its uid and resourceVersion (its
    /// metadata is in the answer), the snapshot holding its data by generation (never reused,
    /// so an answer of replaced data is never found again).
    Changelog {
        /// The ManagedOSVersion.
        object: ObjectVersion,
        /// The [`Snapshot`]'s generation.
        snapshot: Generation,
        /// `from`.
        from: Option<String>,
        /// Architecture.
        arch: Arch,
        /// Output format.
        format: Format,
    },
    /// Summaries as JSON, one (`get`) or a list: a fingerprint of every version selected and
    /// where its data stands (object uid and resourceVersion, snapshot generation or why none).
    Summaries {
        /// A list (or one summary).
        list: bool,
        /// `cve`, as asked.
        cve: Option<String>,
        /// `package` and its bounds, as asked.
        package: Option<Box<PackageQuery>>,
        /// Architecture.
        arch: Arch,
        /// SHA-256 of the versions matched.
        fingerprint: [u8; 32],
    },
    /// A list of kept answers (see [`crate::projectors`]): the resource, what selects and shapes
    /// it, and the resourceVersion of its hub's last change (two lists with the same key hold
    /// the same bytes; the next change makes a new key, the old answer ages out).
    List {
        /// `managedosversions` or `machineinventories`.
        resource: &'static str,
        /// Architecture.
        arch: Arch,
        /// The namespace, or all.
        namespace: Option<String>,
        /// `labelSelector`.
        labels: LabelSelector,
        /// `fieldSelector`.
        fields: FieldSelector,
        /// `cve`.
        cve: Option<String>,
        /// `package` and its bounds.
        package: Option<Box<PackageQuery>>,
        /// JSON or a Table.
        representation: Representation,
        /// The hub's last change.
        version: ResourceVersion,
        /// Changes of the channel data so far: an exposure (`cve`) reads the channel data of
        /// the moment, which may change without any answer of the hub changing.
        data: u64,
    },
}

impl AnswerKey {
    /// The key of a list of `resource` kept in a hub whose last change is `version`, with
    /// the channel data at its `data`-th change.
    pub fn list(
        resource: &'static str,
        arch: &Arch,
        namespace: Option<&str>,
        params: &ListParams,
        representation: Representation,
        (version, data): (ResourceVersion, u64),
    ) -> Self {
        Self::List {
            resource,
            arch: arch.clone(),
            namespace: namespace.map(str::to_owned),
            labels: params.labels.clone(),
            fields: params.fields.clone(),
            cve: params.cve.clone(),
            package: params.package.clone(),
            representation,
            version,
            data,
        }
    }
}

impl AnswerKeyBytes for AnswerKey {
    fn heap_bytes(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        match self {
            Self::Changelog { object, from, .. } => {
                object.namespace.len()
                    + object.name.len()
                    + text(&object.uid)
                    + text(&object.resource_version)
                    + text(from)
            }
            Self::Summaries { cve, package, .. } => text(cve) + package_bytes(package),
            Self::List {
                namespace,
                labels,
                fields,
                cve,
                package,
                ..
            } => {
                text(namespace)
                    + labels.heap_bytes()
                    + fields.heap_bytes()
                    + text(cve)
                    + package_bytes(package)
            }
        }
    }
}

/// What the fleet view reads of the version side, and no more: it owns its own answers
/// (`routes::fleet`), and asks this side only for versions, channel data and changelogs.
pub trait VersionSide: Send + Sync {
    /// The architecture asked for (the default when none), if this server reads it.
    fn served_arch(&self, asked: Option<&Arch>) -> Result<Arch, StatusError>;
    /// The ManagedOSVersions of `namespace` (or of all), by namespace and name.
    fn versions(&self, namespace: Option<&str>) -> Vec<Arc<ManagedOSVersion>>;
    /// Changes of the channel data so far (grows with each).
    fn data_changed(&self) -> u64;
    /// One ManagedOSVersion.
    fn version(&self, namespace: &str, name: &str) -> Option<Arc<ManagedOSVersion>>;
    /// The data of channel `namespace/channel` for `arch`, if fetched.
    fn snapshot(&self, namespace: &str, channel: &str, arch: &Arch) -> Option<Arc<Snapshot>>;
    /// Every fetched channel's data for `arch`, in `namespace` (or all), by namespace and
    /// channel name.
    fn snapshots(
        &self,
        namespace: Option<&str>,
        arch: &Arch,
    ) -> std::collections::HashMap<(String, String), Arc<Snapshot>>;
    /// The changelog of ManagedOSVersion `namespace/name` as `params` ask, rendered on this
    /// thread (callers are off the async threads already).
    fn changelog(
        &self,
        namespace: &str,
        name: &str,
        params: &ChangelogParams,
        accept: Option<&str>,
    ) -> Result<Answer, StatusError>;
}

impl VersionSide for Arc<Resources> {
    fn served_arch(&self, asked: Option<&Arch>) -> Result<Arch, StatusError> {
        self.arch(asked).cloned()
    }

    fn versions(&self, namespace: Option<&str>) -> Vec<Arc<ManagedOSVersion>> {
        self.stores.versions.list(namespace)
    }

    fn data_changed(&self) -> u64 {
        self.cache.changed()
    }

    fn version(&self, namespace: &str, name: &str) -> Option<Arc<ManagedOSVersion>> {
        self.stores.versions.get(namespace, name)
    }

    fn snapshot(&self, namespace: &str, channel: &str, arch: &Arch) -> Option<Arc<Snapshot>> {
        self.data.channel_snapshot(namespace, channel, arch)
    }

    fn snapshots(
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
                let snapshot = self.data.channel_snapshot(&namespace, &name, arch)?;
                Some(((namespace, name), snapshot))
            })
            .collect()
    }

    fn changelog(
        &self,
        namespace: &str,
        name: &str,
        params: &ChangelogParams,
        accept: Option<&str>,
    ) -> Result<Answer, StatusError> {
        let resource = Resource::Changelog {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            params: params.clone(),
        };
        self.answering(&resource, accept)?.run_here(self)
    }
}

/// A ManagedOSVersion as last seen: namespace, name, uid and resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectVersion {
    namespace: String,
    name: String,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl ObjectVersion {
    fn of(version: &ManagedOSVersion) -> Self {
        Self {
            namespace: version.namespace().unwrap_or_default(),
            name: version.name_any(),
            uid: version.uid(),
            resource_version: version.resource_version(),
        }
    }
}

/// An answer: ready bytes kept (or just rendered to keep), or made for this request alone
/// (a `Table`, one machine, a plan). Either way it carries the headers every answer has
/// (`ETag`, `Cache-Control: no-cache, private`, `Vary`) and is 304 to its `If-None-Match`.
pub enum Answer {
    /// Rendered once, kept in the ready-bytes cache.
    Ready(Arc<Ready>),
    /// Made for this request, not kept.
    Fresh(Box<Ready>),
}

impl Answer {
    /// A private answer made for this request.
    pub fn fresh(body: Vec<u8>, content_type: &'static str) -> Self {
        Self::Fresh(Box::new(Ready::answer(body, content_type)))
    }

    /// The response to a request with these headers (`If-None-Match`, `Accept-Encoding`).
    pub fn respond(self, request: &HeaderMap) -> HttpResponse {
        match self {
            Self::Ready(ready) => ready.respond(request),
            Self::Fresh(ready) => ready.respond(request),
        }
    }
}

/// How a request is answered, decided once ([`Resources::answering`]): from kept bytes, or
/// by a render.
pub enum Answering {
    /// The answer is kept: send it.
    Ready(Arc<Ready>),
    /// It must be rendered.
    Render(Render),
}

/// An answer to render, and what rendering it costs.
pub struct Render {
    /// Whether it grows with the data (a range of versions, a list): such jobs run at most
    /// `--max-compute-concurrency` at once.
    pub cost: Cost,
    /// The work.
    pub job: Job,
}

/// What rendering grows with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// One version's answer.
    Light,
    /// A range of versions, or a list.
    Heavy,
}

/// A rendering job; each runs off the async threads.
pub enum Job {
    /// Renders the answer kept under `key`: concurrent requests for one key wait (without
    /// holding a thread) for one render.
    Keep {
        /// What the answer depends on.
        key: AnswerKey,
        /// Renders it.
        render: Box<dyn FnOnce() -> Result<Ready, StatusError> + Send>,
    },
    /// Makes an answer (a Table, for one request; a list, selecting as it goes).
    Run(Box<dyn FnOnce() -> Result<Answer, StatusError> + Send>),
}

impl Answering {
    /// Answers on this thread (tests, the ahead-of-time pass, and jobs that
    /// already run on the blocking pool).
    pub fn run_here(self, resources: &Resources) -> Result<Answer, StatusError> {
        match self {
            Self::Ready(ready) => Ok(Answer::Ready(ready)),
            Self::Render(Render {
                job: Job::Keep { key, render },
                ..
            }) => resources
                .ready
                .get_or_render(key, render)
                .map(Answer::Ready),
            Self::Render(Render {
                job: Job::Run(run), ..
            }) => run(),
        }
    }
}

/// A changelog request whose version, channel and snapshot are known.
struct ChangelogRequest {
    key: AnswerKey,
    version: Arc<ManagedOSVersion>,
    channel: Arc<ManagedOSVersionChannel>,
    snapshot: Arc<Snapshot>,
    params: ChangelogParams,
    arch: Arch,
}

/// The versions a summaries list matches (its label and field selectors), each with where its
/// data stands.
type Matched = Vec<(Arc<ManagedOSVersion>, Lookup)>;

impl Resources {
    /// Answers over the reflector stores and the cache; `architectures` are those the
    /// channel workers read (the cache is keyed by their RPM names). Rendered answers are
    /// kept in `ready`.
    pub fn new(
        stores: ChannelStores,
        cache: Arc<Cache>,
        default_arch: Arch,
        architectures: Vec<Arch>,
        ready: ReadyCache<AnswerKey>,
        projectors: Arc<Projectors>,
    ) -> Self {
        Self {
            data: VersionData {
                stores: stores.clone(),
                cache: cache.clone(),
            },
            stores,
            cache,
            default_arch,
            architectures,
            ready,
            projectors,
        }
    }

    /// Whether the changelog of ManagedOSVersion `namespace/name` (its data for `arch`) fixes
    /// `cve` (what `?cve=` selects).
    pub fn fixes(&self, namespace: &str, name: &str, cve: &str, arch: &Arch) -> bool {
        let Some(version) = self.stores.versions.get(namespace, name) else {
            return false;
        };
        match self.data.lookup(&version, arch) {
            Lookup::Found { snapshot, .. } => snapshot.data.fixes_cve(name, cve),
            Lookup::Unavailable { .. } => false,
        }
    }

    /// The `package` block of ManagedOSVersion `namespace/name` (its data for `arch`), or
    /// `None` when `query`'s bounds leave it out (what `?package=` selects).
    pub fn package(
        &self,
        namespace: &str,
        name: &str,
        query: &PackageQuery,
        arch: &Arch,
    ) -> Option<PackagePresence> {
        let version = self.stores.versions.get(namespace, name)?;
        package_of(name, &self.data.lookup(&version, arch), query)
    }

    /// The answers computed when their inputs change.
    pub fn projectors(&self) -> &Arc<Projectors> {
        &self.projectors
    }

    /// Decides how `resource` is answered, once: the ready bytes when they are kept (decided
    /// without rendering anything), else what renders them. Errors (404, 400, 503) are cheap
    /// and final. Only map lookups happen here; the versions a list matches are found by its job.
    pub fn answering(
        self: &Arc<Self>,
        resource: &Resource,
        accept: Option<&str>,
    ) -> Result<Answering, StatusError> {
        match resource {
            Resource::Changelog {
                namespace,
                name,
                params,
            } => self.changelog_answering(namespace, name, params, accept),
            Resource::Get {
                namespace,
                name,
                params,
            } => {
                let representation = content::negotiate(accept, params.include_object)?;
                let arch = self.arch(params.arch.as_ref())?.clone();
                let version = self.existing_version(namespace, name)?;
                if let Some(item) = self
                    .projectors
                    .versions(&arch)
                    .and_then(|hub| hub.get(namespace, name))
                {
                    return Ok(kept_summary(&item, representation));
                }
                // Not computed yet (created a moment ago): computed for this request.
                let lookup = self.data.lookup(&version, &arch);
                self.summaries_answering(
                    vec![(version, lookup)],
                    (None, None),
                    arch,
                    representation,
                    false,
                )
            }
            Resource::List { namespace, params } => {
                self.list_answering(namespace.as_deref(), params, accept)
            }
        }
    }

    /// How a changelog is answered: kept, or rendered (a range of versions is heavy).
    fn changelog_answering(
        &self,
        namespace: &str,
        name: &str,
        params: &ChangelogParams,
        accept: Option<&str>,
    ) -> Result<Answering, StatusError> {
        let request = self.changelog_request(namespace, name, params, accept)?;
        if let Some(ready) = self.ready.get(&request.key) {
            return Ok(Answering::Ready(ready));
        }
        let cost = if params.from.is_some() {
            Cost::Heavy
        } else {
            Cost::Light
        };
        let key = request.key.clone();
        Ok(Answering::Render(Render {
            cost,
            job: Job::Keep {
                key,
                render: Box::new(move || request.render()),
            },
        }))
    }

    /// How a list of summaries is answered: from the live hub's kept summaries, or (with
    /// `cve`, or before the hub exists) by matching the versions in the job.
    fn list_answering(
        self: &Arc<Self>,
        namespace: Option<&str>,
        params: &ListParams,
        accept: Option<&str>,
    ) -> Result<Answering, StatusError> {
        let representation = content::negotiate(accept, params.include_object)?;
        params.fields.check_supported()?;
        let arch = self.arch(params.arch.as_ref())?.clone();
        let namespace = namespace.map(str::to_owned);
        if let (None, None, Some(hub)) = (
            &params.cve,
            &params.package,
            self.projectors.versions(&arch),
        ) {
            let (hub, params) = (hub.clone(), params.clone());
            if let Representation::Table { .. } = representation {
                // Made for each request: its ages change with the clock.
                return Ok(Answering::Render(Render {
                    cost: Cost::Heavy,
                    job: Job::Run(Box::new(move || {
                        summaries_table(&hub, namespace.as_deref(), &params, representation)
                    })),
                }));
            }
            // Kept under the hub's last change: until the next one, every such list is these
            // bytes.
            let key = AnswerKey::list(
                RESOURCE,
                &arch,
                namespace.as_deref(),
                &params,
                representation,
                (hub.latest(), self.cache.changed()),
            );
            return Ok(Answering::Render(Render {
                cost: Cost::Heavy,
                job: Job::Keep {
                    key,
                    render: Box::new(move || kept_summaries(&hub, namespace.as_deref(), &params)),
                },
            }));
        }
        let (resources, params) = (self.clone(), params.clone());
        // Selecting grows with the number of versions: it is part of the job.
        Ok(Answering::Render(Render {
            cost: Cost::Heavy,
            job: Job::Run(Box::new(move || {
                let matched = resources.matching(namespace.as_deref(), &params, &arch);
                resources
                    .summaries_answering(
                        matched,
                        (params.cve.clone(), params.package.clone()),
                        arch,
                        representation,
                        true,
                    )?
                    .run_here(&resources)
            })),
        }))
    }

    /// Renders, ahead of any request, the default answer (JSON, the default architecture,
    /// compared with the previous version) of every version with data that has none kept,
    /// while the cache holds less than `bytes`. Returns how many were rendered now.
    pub fn prepare_defaults(&self, bytes: u64) -> usize {
        let mut rendered = 0;
        let params = ChangelogParams::default();
        for version in self.stores.versions.list(None) {
            if self.ready.weight() >= bytes {
                break;
            }
            let (Some(namespace), name) = (version.namespace(), version.name_any()) else {
                continue;
            };
            let Ok(request) = self.changelog_request(&namespace, &name, &params, None) else {
                continue;
            };
            if !self.ready.contains(&request.key)
                && self
                    .ready
                    .get_or_render(request.key.clone(), || request.render())
                    .is_ok()
            {
                rendered += 1;
            }
        }
        rendered
    }

    /// The reflector stores of channels and versions (the fleet view reads them).
    pub fn channel_stores(&self) -> &ChannelStores {
        &self.stores
    }

    /// The architecture asked for (the default when none), if this server reads it.
    pub fn served_arch(&self, asked: Option<&Arch>) -> Result<Arch, StatusError> {
        self.arch(asked).cloned()
    }
    /// A receiver told of every change of the channel data.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.cache.changes()
    }

    /// Bytes of answers kept, and the most that may be.
    pub fn kept_bytes(&self) -> (u64, u64) {
        (self.ready.weight(), self.ready.capacity())
    }

    /// Finds what a changelog request needs: the version, its channel and snapshot; `from`
    /// checked. Cheap: nothing is computed or rendered.
    fn changelog_request(
        &self,
        namespace: &str,
        name: &str,
        params: &ChangelogParams,
        accept: Option<&str>,
    ) -> Result<ChangelogRequest, StatusError> {
        if params.format == Format::Json {
            // A Table of a changelog is not offered; kubectl then prints the
            // object itself. Only types we cannot produce at all are refused.
            content::negotiate(accept, IncludeObject::default())?;
        }
        let arch = self.arch(params.arch.as_ref())?;
        let version = self.existing_version(namespace, name)?;
        let (channel, snapshot) = match self.data.lookup(&version, arch) {
            Lookup::Found { channel, snapshot } => (channel, snapshot),
            Lookup::Unavailable { error, .. } => return Err(error),
        };
        if let Some(from) = &params.from {
            self.check_from(&version, from, &channel.name_any())?;
        }
        let key = AnswerKey::Changelog {
            object: ObjectVersion::of(&version),
            snapshot: snapshot.generation(),
            from: params.from.clone(),
            arch: arch.clone(),
            format: params.format,
        };
        Ok(ChangelogRequest {
            key,
            version,
            channel,
            snapshot,
            params: params.clone(),
            arch: arch.clone(),
        })
    }

    /// The versions a list selects (namespace, label and field selectors), each with where
    /// its data stands.
    fn matching(&self, namespace: Option<&str>, params: &ListParams, arch: &Arch) -> Matched {
        self.stores
            .versions
            .list(namespace)
            .into_iter()
            .filter(|v| params.labels.matches(v.labels()))
            .filter(|v| {
                params
                    .fields
                    .matches(&v.name_any(), v.namespace().as_deref().unwrap_or_default())
            })
            .map(|v| {
                let lookup = self.data.lookup(&v, arch);
                (v, lookup)
            })
            .collect()
    }

    /// How the summaries of `matched` are answered (with `cve`, only the versions fixing it,
    /// first fix first; with `package`, each with what it carries of it). JSON is kept ready;
    /// a Table is made for each request.
    fn summaries_answering(
        &self,
        matched: Matched,
        (cve, package): (Option<String>, Option<Box<PackageQuery>>),
        arch: Arch,
        representation: Representation,
        list: bool,
    ) -> Result<Answering, StatusError> {
        let cost = if list { Cost::Heavy } else { Cost::Light };
        if !matches!(representation, Representation::Json) {
            return Ok(Answering::Render(Render {
                cost,
                job: Job::Run(Box::new(move || {
                    let (body, content_type) = render_summaries(
                        matched,
                        (cve.as_deref(), package.as_deref()),
                        representation,
                        list,
                    )?;
                    Ok(Answer::fresh(body, content_type))
                })),
            }));
        }
        let key = AnswerKey::Summaries {
            list,
            cve: cve.clone(),
            package: package.clone(),
            arch,
            fingerprint: fingerprint(&matched),
        };
        if let Some(ready) = self.ready.get(&key) {
            return Ok(Answering::Ready(ready));
        }
        Ok(Answering::Render(Render {
            cost,
            job: Job::Keep {
                key,
                render: Box::new(move || {
                    let (body, content_type) = render_summaries(
                        matched,
                        (cve.as_deref(), package.as_deref()),
                        representation,
                        list,
                    )?;
                    Ok(Ready::answer(body, content_type))
                }),
            },
        }))
    }

    /// The kept answers.
    pub fn ready(&self) -> &ReadyCache<AnswerKey> {
        &self.ready
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

    fn existing_version(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<ManagedOSVersion>, StatusError> {
        self.stores
            .versions
            .get(namespace, name)
            .ok_or_else(|| StatusError::not_found(RESOURCE, name))
    }

    /// `from` must name a ManagedOSVersion of the same channel.
    fn check_from(
        &self,
        version: &ManagedOSVersion,
        from: &str,
        channel: &str,
    ) -> Result<(), StatusError> {
        let namespace = version.namespace().unwrap_or_default();
        let Some(other) = self.stores.versions.get(&namespace, from) else {
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
}

impl ChangelogRequest {
    /// Renders the changelog (the `from` range computed here, so on the blocking pool when it
    /// is a range).
    fn render(self) -> Result<Ready, StatusError> {
        let Self {
            version,
            channel,
            snapshot,
            params,
            arch,
            ..
        } = self;
        let name = version.name_any();
        let channel_name = channel.name_any();
        let source = source(&channel_name, &snapshot);
        let changelog = objects::changelog(
            source,
            &snapshot.data,
            &name,
            params.from.as_deref(),
            object_meta(&version),
            &arch,
        )
        .map_err(|e| query_error(&name, source, &e))?;
        let (body, content_type) = match params.format {
            Format::Json => (
                serde_json::to_vec(&changelog).map_err(|e| StatusError::internal(&e))?,
                content::JSON,
            ),
            Format::Text => (
                render::text(&changelog).into_bytes(),
                "text/plain; charset=utf-8",
            ),
            Format::Markdown => (
                render::markdown(&changelog).into_bytes(),
                "text/markdown; charset=utf-8",
            ),
        };
        // kubectl (and client-go) print these on stderr.
        let warnings = changelog
            .warnings
            .iter()
            .filter_map(|w| HeaderValue::from_str(&objects::warning_header(w)).ok())
            .collect();
        Ok(Ready::answer(body, content_type).with_warnings(warnings))
    }
}

/// The versions of `matched` whose changelog fixes `cve`, oldest first ([`oldest_first`]), so
/// the first of each channel is its first fix.
fn fixing(matched: Matched, cve: &str) -> Matched {
    oldest_first(
        matched
            .into_iter()
            .filter(|(version, lookup)| {
                matches!(lookup, Lookup::Found { snapshot, .. }
                    if snapshot.data.fixes_cve(&version.name_any(), cve))
            })
            .collect(),
    )
}

/// `matched` by namespace and channel, then oldest first in the channel data's own order
/// (`created`, then version); a version without data (or not in it) last in its channel, by
/// name.
fn oldest_first(matched: Matched) -> Matched {
    let mut keyed: Vec<(ChannelPosition, (Arc<ManagedOSVersion>, Lookup))> = matched
        .into_iter()
        .map(|(version, lookup)| {
            let position = match &lookup {
                Lookup::Found { snapshot, .. } => snapshot.data.position_of(&version.name_any()),
                Lookup::Unavailable { .. } => None,
            };
            let key = (
                version.namespace(),
                version.channel_name().map(str::to_owned),
                position.unwrap_or(usize::MAX),
            );
            (key, (version, lookup))
        })
        .collect();
    // Stable: versions of equal keys keep the list's order (by name).
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    keyed.into_iter().map(|(_, hit)| hit).collect()
}

/// What the summaries of `matched` depend on, hashed: each version's identity and
/// resourceVersion, and the snapshot holding its data or why there is none.
fn fingerprint(matched: &Matched) -> [u8; 32] {
    let mut hash = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    for (version, lookup) in matched {
        field(version.namespace().unwrap_or_default().as_bytes());
        field(version.name_any().as_bytes());
        field(version.uid().unwrap_or_default().as_bytes());
        field(version.resource_version().unwrap_or_default().as_bytes());
        match lookup {
            Lookup::Found { channel, snapshot } => {
                field(b"found");
                field(channel.name_any().as_bytes());
                field(&snapshot.generation().get().to_le_bytes());
            }
            Lookup::Unavailable { error, .. } => {
                field(b"unavailable");
                field(&error.to_json());
            }
        }
    }
    hash.finalize().into()
}

/// Where a version stands: namespace, channel, index in the channel's order.
type ChannelPosition = (Option<String>, Option<String>, usize);

/// The summaries of `matched` (with `cve`, only the versions fixing it; with `package`, each
/// with what it carries of it, only those its bounds keep) in `representation`.
fn render_summaries(
    matched: Matched,
    (cve, package): (Option<&str>, Option<&PackageQuery>),
    representation: Representation,
    list: bool,
) -> Result<(Vec<u8>, &'static str), StatusError> {
    let matched = match cve {
        Some(cve) => fixing(matched, cve),
        None => matched,
    };
    let items = match package {
        // Oldest first, as with `cve`: which versions carry the package, in the order they came.
        Some(query) => carrying(&oldest_first(matched), query),
        None => matched.iter().map(|(v, l)| summary(v, l)).collect(),
    };
    respond_summaries(representation, items, list, None, package.is_some())
}

/// The summaries of `matched` with their `package` block, those `query`'s bounds keep.
fn carrying(matched: &Matched, query: &PackageQuery) -> Vec<ManagedOSVersionChangelogSummary> {
    matched
        .iter()
        .filter_map(|(version, lookup)| {
            let package = package_of(&version.name_any(), lookup, query)?;
            let mut item = summary(version, lookup);
            item.package = Some(package);
            Some(item)
        })
        .collect()
}

/// The `package` block of version `name` where its data stands (no data read: no list).
fn package_of(name: &str, lookup: &Lookup, query: &PackageQuery) -> Option<PackagePresence> {
    let data = match lookup {
        Lookup::Found { snapshot, .. } => Some(snapshot.data.as_ref()),
        Lookup::Unavailable { .. } => None,
    };
    objects::package(data, name, query)
}

/// Heap bytes of a kept answer's package query.
fn package_bytes(package: &Option<Box<PackageQuery>>) -> usize {
    package.as_ref().map_or(0, |q| {
        q.name().len() + 2 * elemental_changelog::package_index::MAX_EVR_CHARS
    })
}

/// One kept summary, as JSON or a Table.
fn kept_summary(
    item: &Arc<Item<ManagedOSVersionChangelogSummary>>,
    representation: Representation,
) -> Answering {
    match representation {
        Representation::Json => {
            Answering::Ready(Arc::new(Ready::answer(item.json(), content::JSON)))
        }
        Representation::Table { .. } => {
            let object = item.object();
            Answering::Render(Render {
                cost: Cost::Light,
                job: Job::Run(Box::new(move || {
                    let (body, content_type) =
                        respond_summaries(representation, vec![object], false, None, false)?;
                    Ok(Answer::fresh(body, content_type))
                })),
            })
        }
    }
}

/// The kept summaries of `namespace` (or all) that `params` select, as a JSON list with the
/// resourceVersion a watch may start from, ready to keep.
fn kept_summaries(
    hub: &Reader<ManagedOSVersionChangelogSummary>,
    namespace: Option<&str>,
    params: &ListParams,
) -> Result<Ready, StatusError> {
    let list = hub.list(namespace);
    let version = list.version;
    let selected: Vec<_> = list.iter().filter(|i| selects_item(params, i)).collect();
    Ready::written(super::list::kept_bytes(&selected), content::JSON, |out| {
        super::list::write_list(
            out,
            API_VERSION,
            SUMMARY_LIST_KIND,
            version,
            &selected,
            None,
        )
    })
    .map_err(|e| StatusError::internal(&e))
}

/// The kept summaries of `namespace` (or all) that `params` select, as a Table made now.
fn summaries_table(
    hub: &Reader<ManagedOSVersionChangelogSummary>,
    namespace: Option<&str>,
    params: &ListParams,
    representation: Representation,
) -> Result<Answer, StatusError> {
    let list = hub.list(namespace);
    let version = list.version;
    let objects = list
        .iter()
        .filter(|i| selects_item(params, i))
        .map(|i| i.object())
        .collect();
    let (body, content_type) =
        respond_summaries(representation, objects, true, Some(version), false)?;
    Ok(Answer::fresh(body, content_type))
}

/// Whether `params`' label and field selectors select an object with `meta`.
pub fn selects(params: &ListParams, meta: &ObjectMeta) -> bool {
    params.labels.matches(&meta.labels) && params.fields.matches(&meta.name, &meta.namespace)
}

/// Whether `params`' label and field selectors select a kept answer (its labels are read
/// from its bytes only when a label selector asks).
pub fn selects_item<T: Object>(params: &ListParams, item: &Item<T>) -> bool {
    params.fields.matches(item.name(), item.namespace())
        && (params.labels.is_empty() || params.labels.matches(&item.labels()))
}

/// The body and content type of summaries in `representation` (`package_column`: a
/// `?package=` list, whose Table has a PACKAGE column).
fn respond_summaries(
    representation: Representation,
    items: Vec<ManagedOSVersionChangelogSummary>,
    list: bool,
    resource_version: Option<ResourceVersion>,
    package_column: bool,
) -> Result<(Vec<u8>, &'static str), StatusError> {
    let content_type = representation.content_type();
    let body = match representation {
        Representation::Table {
            version,
            include_object,
        } => {
            let mut table = table::summaries_table_version(&items, true, version, include_object);
            if package_column {
                table::add_package_column(&mut table, items.iter().map(|i| i.package.as_ref()));
            }
            if let Some(rv) = resource_version {
                table.metadata.resource_version = rv.text();
            }
            serde_json::to_vec(&table)
        }
        Representation::Json if list => {
            let mut list = ManagedOSVersionChangelogSummaryList::new(items);
            if let Some(rv) = resource_version {
                list.metadata.resource_version = rv.text();
            }
            serde_json::to_vec(&list)
        }
        Representation::Json => match items.into_iter().next() {
            Some(item) => serde_json::to_vec(&item),
            None => serde_json::to_vec(&ManagedOSVersionChangelogSummaryList::new(Vec::new())),
        },
    };
    let body = body.map_err(|e| StatusError::internal(&e))?;
    Ok((body, content_type))
}

fn query_error(name: &str, source: Source<'_>, error: &QueryError) -> StatusError {
    match error {
        QueryError::UnknownVersion { .. } | QueryError::NoData { .. } => not_found_because(
            name,
            UnavailableReason::NoChangelogData,
            objects::no_data_message(source, name, error),
        ),
        _ => {
            let mut e = StatusError::bad_request(error.to_string());
            e.details = Some(Box::new(StatusDetails {
                causes: vec![StatusCause {
                    reason: CauseReason::FieldValueInvalid,
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
