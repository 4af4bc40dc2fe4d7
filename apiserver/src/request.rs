//! The request model: every request is parsed once, here, from its method, raw path and
//! query, into a [`RequestInfo`]. Authentication, authorization, routing, handlers, metric
//! labels and logs all read that one value; nothing after [`RequestInfo::parse`] looks at
//! the raw path or query again, so what is authorized is exactly what is answered.
//!
//! It follows k8s.io/apiserver's `RequestInfoFactory` (see [`Attributes`]): the path is
//! percent-decoded once (as Go's `url.URL.Path`) and split on `/`; a repeated query
//! parameter counts with its **first** value (Go's `url.Values.Get`), as kube-apiserver reads
//! it before passing the request on.
//!
//! | path | [`Target`] |
//! |---|---|
//! | `/apis` | aggregated discovery v2, or `APIGroupList` |
//! | `/apis/changelog.elemental.cattle.io[/v1beta1]` | `APIGroup`, `APIResourceList` |
//! | `.../managedosversions`, `.../namespaces/{ns}/managedosversions[/{name}]` | summaries |
//! | `.../namespaces/{ns}/managedosversions/{name}/changelog` | a changelog |
//! | `/openapi/v2`, `/openapi/v3[/apis/<group>/<version>]` | schemas |
//! | `/livez`, `/readyz`, `/healthz` | health |
//! | `/metrics` | Prometheus |

mod attributes;
pub mod fleet;
pub mod package;
mod query;
pub mod selector;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use elemental_changelog::{package_index::PackageQuery, updates};
use elemental_changelog_apiservice::{
    Arch, GROUP, RESOURCE, SUBRESOURCE, VERSION,
    content::IncludeObject,
    status::{CauseReason, StatusCause, StatusDetails, StatusError},
};
use std::{net::SocketAddr, sync::Arc};

use http::{Method, Uri};
use rustls_pki_types::CertificateDer;

use self::fleet::FleetResource;
pub use self::query::QueryValues;
use self::selector::{FieldSelector, LabelSelector};
pub use elemental_changelog_auth::{Attributes, ResourceAttributes};

/// The longest query string accepted, in bytes (kube-apiserver takes what fits in its
/// header limit; ours are short by nature).
pub const MAX_QUERY_BYTES: usize = 8 * 1024;
/// The longest label or field selector accepted, in bytes.
pub const MAX_SELECTOR_BYTES: usize = 2 * 1024;

/// The client side of a connection, as seen after the TLS handshake.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    /// Remote address.
    pub addr: Option<SocketAddr>,
    /// Certificate chain the client presented (leaf first). Only its
    /// possession was proven by the handshake: the authenticator verifies the
    /// chain against the CAs that currently apply.
    pub chain: Option<Arc<[CertificateDer<'static>]>>,
    /// Admitted past the connection limit: health probes only.
    pub probe_only: bool,
}

/// One request, parsed.
#[derive(Clone, Debug)]
pub struct RequestInfo {
    method: Method,
    attributes: Attributes,
    target: Target,
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A discovery document.
    Discovery(Discovery),
    /// An OpenAPI document.
    OpenApi(OpenApi),
    /// `/livez`, `/healthz` or `/readyz` (any sub-path).
    Health {
        /// Which check.
        probe: Probe,
        /// `?verbose`: list every check.
        verbose: bool,
    },
    /// `/metrics`.
    Metrics,
    /// A resource of this API, with its parameters.
    Resource(Resource),
    /// A path of the fleet view ([`fleet`]).
    Fleet(FleetResource),
    /// A request for this API whose name or parameters are invalid: answered with a 400
    /// after authentication and authorization, as kube-apiserver validates after them.
    Invalid {
        /// What it was asking for.
        resource: RequestResource,
        /// The 400.
        error: StatusError,
    },
    /// Anything else: 404.
    NotFound,
}

/// What a request asks for, in a few words: the `resource` label of request metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestResource {
    /// `managedosversions` (summaries).
    Summaries,
    /// `managedosversions/changelog`.
    Changelog,
    /// `machineinventories` (the fleet view's machines).
    Machines,
    /// `machineinventories/changelog`.
    MachineChangelog,
    /// `managedosimages/changelog`.
    ImageChangelog,
    /// Discovery documents.
    Discovery,
    /// OpenAPI documents.
    OpenApi,
    /// `/livez`, `/readyz`, `/healthz`.
    Health,
    /// `/metrics`.
    Metrics,
    /// Anything else (answered 404).
    Other,
}

impl RequestResource {
    /// The `resource` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Summaries => "managedosversions",
            Self::Changelog => "managedosversions/changelog",
            Self::Machines => "machineinventories",
            Self::MachineChangelog => "machineinventories/changelog",
            Self::ImageChangelog => "managedosimages/changelog",
            Self::Discovery => "discovery",
            Self::OpenApi => "openapi",
            Self::Health => "health",
            Self::Metrics => "metrics",
            Self::Other => "other",
        }
    }
}

/// Discovery documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// `/apis`.
    Apis,
    /// `/apis/<group>`.
    Group,
    /// `/apis/<group>/<version>`.
    ResourceList,
}

/// OpenAPI documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenApi {
    /// `/openapi/v2`.
    V2,
    /// `/openapi/v3`.
    V3Root,
    /// `/openapi/v3/apis/<group>/<version>`.
    V3GroupVersion,
}

/// Health probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `/livez`, `/healthz`.
    Live,
    /// `/readyz`.
    Ready,
}

/// A resource request of this API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// Summaries, in a namespace or in all.
    List {
        /// Namespace, or all.
        namespace: Option<String>,
        /// Parameters.
        params: ListParams,
    },
    /// One summary.
    Get {
        /// Namespace.
        namespace: String,
        /// ManagedOSVersion name.
        name: String,
        /// Parameters.
        params: GetParams,
    },
    /// The changelog of a ManagedOSVersion.
    Changelog {
        /// Namespace.
        namespace: String,
        /// ManagedOSVersion name.
        name: String,
        /// Parameters.
        params: ChangelogParams,
    },
}

/// Parameters of a list of summaries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListParams {
    /// `arch`; the server's default when `None`.
    pub arch: Option<Arch>,
    /// `labelSelector`, on the ManagedOSVersion's labels.
    pub labels: LabelSelector,
    /// `fieldSelector` (`metadata.name`, `metadata.namespace`).
    pub fields: FieldSelector,
    /// `cve`: only versions whose changelog fixes it, the first fix first.
    pub cve: Option<String>,
    /// `package` (with `packageAtLeast`, `packageBelow`): each item with what its version
    /// carries of the package; with bounds, only the items carrying it within them.
    pub package: Option<Box<PackageQuery>>,
    /// `includeObject`, for Table answers.
    pub include_object: IncludeObject,
    /// The watch options, when this is a watch (`watch=true`).
    pub watch: Option<WatchParams>,
}

/// Options of a watch, checked as kube-apiserver checks them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchParams {
    /// `resourceVersion`: where to start (`None`, or `0`: with every object present as ADDED).
    pub resource_version: Option<String>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `timeoutSeconds`, any 64-bit integer as kube-apiserver reads it (`0`: the default
    /// length; negative: the watch ends at once; see `routes::watch::timeout`).
    pub timeout_seconds: Option<i64>,
    /// `sendInitialEvents=true` (with `resourceVersionMatch=NotOlderThan`): every object
    /// present as ADDED, then a bookmark annotated `k8s.io/initial-events-end`.
    pub send_initial_events: bool,
}

/// Parameters of one summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GetParams {
    /// `arch`; the server's default when `None`.
    pub arch: Option<Arch>,
    /// `includeObject`, for Table answers.
    pub include_object: IncludeObject,
}

/// Parameters of the changelog subresource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangelogParams {
    /// `from`: the ManagedOSVersion to compare with; the previous version when `None`.
    pub from: Option<String>,
    /// `arch`; the server's default when `None`.
    pub arch: Option<Arch>,
    /// `format`.
    pub format: Format,
}

/// Output formats of the changelog subresource (`?format=`; `kubectl get --raw` cannot set
/// `Accept`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Format {
    /// `json` (default): the object.
    #[default]
    Json,
    /// `text`: for people, in a terminal.
    Text,
    /// `markdown` (or `md`).
    Markdown,
}

impl Format {
    fn parse(value: &str) -> Result<Self, StatusError> {
        match value {
            "" | "json" => Ok(Self::Json),
            "text" => Ok(Self::Text),
            "markdown" | "md" => Ok(Self::Markdown),
            other => Err(invalid_value(
                "format",
                other,
                "supported values: \"json\", \"text\", \"markdown\"",
            )),
        }
    }
}

impl RequestInfo {
    /// Parses a request. `Err` is a 400 for a path that cannot be decoded (a bad `%` escape,
    /// or not UTF-8) or an oversized query: Go's HTTP server refuses such requests before any
    /// handler, so they are answered before authentication.
    pub fn parse(method: &Method, uri: &Uri) -> Result<Self, StatusError> {
        let raw_query = uri.query().unwrap_or_default();
        if raw_query.len() > MAX_QUERY_BYTES {
            return Err(StatusError::bad_request(format!(
                "the query string is longer than {MAX_QUERY_BYTES} bytes"
            )));
        }
        let path = decode_path(uri.path())?;
        let query = QueryValues::parse(raw_query);
        let attributes = attributes::of(method, path, &query);
        let mut target = Target::of(&attributes, &query);
        if attributes.verb() == "watch" {
            target.watched(&query);
        }
        Ok(Self {
            method: method.clone(),
            attributes,
            target,
        })
    }

    /// The HTTP method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The percent-decoded path.
    pub fn path(&self) -> &str {
        self.attributes.path()
    }

    /// The verb, as authorization sees it (`get`, `list`, `watch`, ...).
    pub fn verb(&self) -> &str {
        self.attributes.verb()
    }

    /// What authorization reviews.
    pub fn attributes(&self) -> &Attributes {
        &self.attributes
    }

    /// What is asked for.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Whether this request only reads (`GET`, `HEAD`); this API serves nothing else.
    pub fn is_read(&self) -> bool {
        self.method == Method::GET || self.method == Method::HEAD
    }

    /// The resource label of request metrics.
    pub fn metric(&self) -> RequestResource {
        match &self.target {
            Target::Discovery(_) => RequestResource::Discovery,
            Target::OpenApi(_) => RequestResource::OpenApi,
            Target::Health { .. } => RequestResource::Health,
            Target::Metrics => RequestResource::Metrics,
            Target::Resource(Resource::Changelog { .. }) => RequestResource::Changelog,
            Target::Resource(_) => RequestResource::Summaries,
            Target::Fleet(FleetResource::Machines { .. } | FleetResource::Machine { .. }) => {
                RequestResource::Machines
            }
            Target::Fleet(FleetResource::MachineChangelog { .. }) => {
                RequestResource::MachineChangelog
            }
            Target::Fleet(FleetResource::ImageChangelog { .. }) => RequestResource::ImageChangelog,
            Target::Invalid { resource, .. } => *resource,
            Target::NotFound => RequestResource::Other,
        }
    }

    /// The second object this request reads, which the user must be allowed to read too
    /// (a Role's `resourceNames` may name only some versions): a changelog's `from=` is
    /// `get` on that ManagedOSVersion's changelog, and so is a machine changelog's `to=`.
    /// `None` when the request reads one object only.
    pub fn also_reads(&self) -> Option<Attributes> {
        match &self.target {
            Target::Resource(Resource::Changelog { params, .. }) => {
                self.attributes.with_name(params.from.as_deref()?)
            }
            Target::Fleet(FleetResource::MachineChangelog { params, .. }) => self
                .attributes
                .with_object(RESOURCE, Some(SUBRESOURCE), params.to.as_deref()?),
            _ => None,
        }
    }

    /// Health probes: never refused by a serving limit.
    pub fn is_health(&self) -> bool {
        matches!(self.target, Target::Health { .. })
    }

    /// Discovery and OpenAPI documents: the same for everyone, never secret.
    pub fn is_public_document(&self) -> bool {
        matches!(self.target, Target::Discovery(_) | Target::OpenApi(_))
    }
}

impl Target {
    /// The target of a request whose path segments and verb `attributes` hold.
    fn of(attributes: &Attributes, query: &QueryValues) -> Self {
        let segments = attributes::segments(attributes.path());
        match segments.as_slice() {
            ["apis"] => Self::Discovery(Discovery::Apis),
            ["apis", g] if *g == GROUP => Self::Discovery(Discovery::Group),
            ["apis", g, v] if *g == GROUP && *v == VERSION => {
                Self::Discovery(Discovery::ResourceList)
            }
            ["apis", g, v, rest @ ..] if *g == GROUP && *v == VERSION => {
                Self::resource(rest, query)
                    .unwrap_or_else(|(resource, error)| Self::Invalid { resource, error })
            }
            ["openapi", "v2"] => Self::OpenApi(OpenApi::V2),
            ["openapi", "v3"] => Self::OpenApi(OpenApi::V3Root),
            ["openapi", "v3", "apis", g, v] if *g == GROUP && *v == VERSION => {
                Self::OpenApi(OpenApi::V3GroupVersion)
            }
            ["livez" | "healthz", ..] => Self::health(Probe::Live, query),
            ["readyz", ..] => Self::health(Probe::Ready, query),
            ["metrics"] => Self::Metrics,
            _ => Self::NotFound,
        }
    }

    fn health(probe: Probe, query: &QueryValues) -> Self {
        Self::Health {
            probe,
            verbose: query.has("verbose"),
        }
    }

    /// The segments after `/apis/<group>/<version>/`.
    fn resource(
        rest: &[&str],
        query: &QueryValues,
    ) -> Result<Self, (RequestResource, StatusError)> {
        let summaries = |e| (RequestResource::Summaries, e);
        let changelog = |e| (RequestResource::Changelog, e);
        Ok(Self::Resource(match rest {
            [r] if *r == RESOURCE => Resource::List {
                namespace: None,
                params: ListParams::parse(query).map_err(summaries)?,
            },
            ["namespaces", ns, r] if *r == RESOURCE && !ns.is_empty() => Resource::List {
                namespace: Some(namespace(ns).map_err(summaries)?),
                params: ListParams::parse(query).map_err(summaries)?,
            },
            ["namespaces", ns, r, name] if *r == RESOURCE && !ns.is_empty() && !name.is_empty() => {
                Resource::Get {
                    namespace: namespace(ns).map_err(summaries)?,
                    name: object_name("name", name).map_err(summaries)?,
                    params: GetParams::parse(query).map_err(summaries)?,
                }
            }
            ["namespaces", ns, r, name, s]
                if *r == RESOURCE && *s == SUBRESOURCE && !ns.is_empty() && !name.is_empty() =>
            {
                Resource::Changelog {
                    namespace: namespace(ns).map_err(changelog)?,
                    name: object_name("name", name).map_err(changelog)?,
                    params: ChangelogParams::parse(query).map_err(changelog)?,
                }
            }
            _ => return fleet::target(rest, query),
        }))
    }
}

impl Target {
    /// Adds the watch options to a list's parameters (an invalid one makes the target a 400).
    fn watched(&mut self, query: &QueryValues) {
        let (params, resource) = match self {
            Self::Resource(Resource::List { params, .. }) => (params, RequestResource::Summaries),
            Self::Fleet(FleetResource::Machines { params, .. }) => {
                (params, RequestResource::Machines)
            }
            _ => return,
        };
        match WatchParams::parse(query) {
            Ok(watch) => params.watch = Some(watch),
            Err(error) => *self = Self::Invalid { resource, error },
        }
    }
}

/// Go's `strconv.ParseBool`, as kube-apiserver reads boolean options.
fn go_bool(key: &str, value: &str) -> Result<bool, StatusError> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(invalid_value(key, value, "must be a boolean")),
    }
}

impl WatchParams {
    fn parse(query: &QueryValues) -> Result<Self, StatusError> {
        let flag = |key: &str| -> Result<Option<bool>, StatusError> {
            non_empty(query, key).map(|v| go_bool(key, v)).transpose()
        };
        let send_initial_events = flag("sendInitialEvents")?;
        let bookmarks = flag("allowWatchBookmarks")?.unwrap_or(false);
        let matching = non_empty(query, "resourceVersionMatch");
        match (send_initial_events, matching) {
            (Some(_), Some("NotOlderThan")) | (None, None) => {}
            (Some(_), other) => {
                return Err(invalid_value(
                    "resourceVersionMatch",
                    other.unwrap_or_default(),
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            (None, Some(other)) => {
                return Err(invalid_value(
                    "resourceVersionMatch",
                    other,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
        }
        if send_initial_events == Some(true) && !bookmarks {
            return Err(invalid_value(
                "allowWatchBookmarks",
                "false",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        // Any 64-bit integer, as kube-apiserver decodes it (`strconv.ParseInt`); what does not
        // decode is refused by `ListParams::parse` already, with the same message.
        let timeout_seconds = non_empty(query, "timeoutSeconds")
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| invalid_value("timeoutSeconds", v, "must be an integer"))
            })
            .transpose()?;
        Ok(Self {
            resource_version: non_empty(query, "resourceVersion").map(str::to_owned),
            bookmarks,
            timeout_seconds,
            send_initial_events: send_initial_events == Some(true),
        })
    }
}

impl ListParams {
    fn parse(query: &QueryValues) -> Result<Self, StatusError> {
        // List options this API does not use must still be well formed, as kube-apiserver
        // checks them (`limit=abc` is a 400 there too).
        for key in ["limit", "timeoutSeconds"] {
            if let Some(value) = query.first(key).filter(|v| !v.is_empty())
                && value.parse::<i64>().is_err()
            {
                return Err(invalid_value(key, value, "must be an integer"));
            }
        }
        Ok(Self {
            arch: arch(query)?,
            labels: LabelSelector::parse(selector(query, "labelSelector")?)?,
            fields: FieldSelector::parse(selector(query, "fieldSelector")?)?,
            cve: non_empty(query, "cve").map(cve_id).transpose()?,
            package: package::parse(query)?,
            include_object: include_object(query)?,
            watch: None,
        })
    }
}

impl GetParams {
    fn parse(query: &QueryValues) -> Result<Self, StatusError> {
        Ok(Self {
            arch: arch(query)?,
            include_object: include_object(query)?,
        })
    }
}

impl ChangelogParams {
    fn parse(query: &QueryValues) -> Result<Self, StatusError> {
        Ok(Self {
            from: non_empty(query, "from")
                .map(|from| object_name("from", from))
                .transpose()?,
            arch: arch(query)?,
            format: Format::parse(query.first("format").unwrap_or_default())?,
        })
    }
}

/// The first value of `key`, unless empty (an empty value means "not set").
fn non_empty<'q>(query: &'q QueryValues, key: &str) -> Option<&'q str> {
    query.first(key).filter(|v| !v.is_empty())
}

fn arch(query: &QueryValues) -> Result<Option<Arch>, StatusError> {
    non_empty(query, "arch")
        .map(|raw| {
            raw.parse::<Arch>()
                .map_err(|_| invalid_value("arch", raw, "not an architecture name"))
        })
        .transpose()
}

fn include_object(query: &QueryValues) -> Result<IncludeObject, StatusError> {
    IncludeObject::parse(query.first("includeObject").unwrap_or_default())
}

fn selector<'q>(query: &'q QueryValues, key: &str) -> Result<&'q str, StatusError> {
    let value = query.first(key).unwrap_or_default();
    if value.len() > MAX_SELECTOR_BYTES {
        return Err(invalid_value(
            key,
            &value.chars().take(64).collect::<String>(),
            &format!("longer than {MAX_SELECTOR_BYTES} bytes"),
        ));
    }
    Ok(value)
}

/// Accepts `CVE-2024-1234` in any case; refuses what cannot be a CVE id.
fn cve_id(cve: &str) -> Result<String, StatusError> {
    let trimmed = cve.trim();
    if updates::is_cve_id(trimmed) {
        Ok(trimmed.to_ascii_uppercase())
    } else {
        Err(invalid_value(
            "cve",
            cve,
            &format!(
                "not a CVE id (CVE-YYYY-NNNN, at most {} digits after the year)",
                updates::MAX_CVE_SEQUENCE_DIGITS
            ),
        ))
    }
}

/// A namespace: a DNS-1123 label.
fn namespace(ns: &str) -> Result<String, StatusError> {
    if is_dns1123_label(ns) {
        Ok(ns.to_owned())
    } else {
        Err(invalid_value(
            "namespace",
            ns,
            "a namespace is a DNS-1123 label: lower-case alphanumerics and '-', at most 63",
        ))
    }
}

/// A ManagedOSVersion name: a DNS-1123 subdomain, as for every custom resource.
fn object_name(field: &str, name: &str) -> Result<String, StatusError> {
    if is_dns1123_subdomain(name) {
        Ok(name.to_owned())
    } else {
        Err(invalid_value(
            field,
            name,
            "a ManagedOSVersion name is a DNS-1123 subdomain: lower-case alphanumerics, '-' and '.', at most 253",
        ))
    }
}

/// k8s.io/apimachinery `validation.IsDNS1123Label`.
pub fn is_dns1123_label(s: &str) -> bool {
    let alnum = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    s.len() <= 63
        && alnum(s.as_bytes().first())
        && alnum(s.as_bytes().last())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// k8s.io/apimachinery `validation.IsDNS1123Subdomain`.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A 400 naming the parameter, worded as kube-apiserver's field errors
/// (`<field>: Invalid value: "<value>": <why>`).
fn invalid_value(field: &str, value: &str, why: &str) -> StatusError {
    let message = format!(
        "{field}: Invalid value: \"{}\": {why}",
        value.escape_default()
    );
    let mut error = StatusError::bad_request(message.clone());
    error.details = Some(Box::new(StatusDetails {
        causes: vec![StatusCause {
            reason: CauseReason::FieldValueInvalid,
            message,
            field: field.to_owned(),
        }],
        ..StatusDetails::default()
    }));
    error
}

/// Go's `url.URL.Path` from the raw path: `%XX` escapes decoded once. A malformed escape or
/// a result that is not UTF-8 is a 400 (Go's server refuses the former; no name of this API
/// can hold the latter).
fn decode_path(raw: &str) -> Result<String, StatusError> {
    let bytes = query::unescape(raw, false)
        .ok_or_else(|| StatusError::bad_request("the request path has a malformed % escape"))?;
    String::from_utf8(bytes)
        .map_err(|_| StatusError::bad_request("the request path is not UTF-8 once decoded"))
}
