//! Answers: a parsed [`RequestInfo`] is authenticated, authorized, then answered by what it
//! targets ([`Target`]): discovery and OpenAPI documents (built once at start, they cannot
//! fail), health, metrics, or the resources of this API ([`resources`]).
//!
//! This API is read-only: any verb but GET (and HEAD) is a 405.

pub mod deadline;
pub mod fleet;
pub mod list;
pub mod metrics;
pub mod ready;
pub mod resources;
pub mod watch;

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use bytes::Bytes;
use dashmap::DashMap;
use elemental_changelog::package_index::PackageQuery;
use elemental_changelog_apiservice::{
    Arch, discovery,
    fleet::MachineInventoryChangelogSummary,
    openapi,
    status::{Denied, StatusError},
    types::ManagedOSVersionChangelogSummary,
};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use elemental_changelog_auth::{
    authn::{AUTHENTICATED_GROUP, Authenticator, Tokens, UserInfo},
    authz::{Authorizer, Decision},
};

use self::{
    fleet::FleetView,
    metrics::{ServingLimit, ServingMetrics},
    ready::Ready,
    resources::{Answer, Answering, Cost, Job, Resources},
};
use crate::{
    access_log::{AccessLogger, Entry, Requester},
    health::{self, Health},
    metrics::Registry,
    projectors::Resource as Kept,
    request::{
        Attributes, Discovery, OpenApi, Peer, Probe, RequestInfo, RequestResource, Resource,
        Target, fleet::FleetResource,
    },
    telemetry::error_chain,
};

/// Seconds a client is told to wait after a 429 (kube-apiserver says 1).
const RETRY_AFTER_TOO_MANY: u32 = 1;
/// How often the default answers are checked for ManagedOSVersions created since the last
/// change of the channel data.
const DEFAULTS_RECHECK: Duration = Duration::from_secs(10);
/// Shortest time between two passes over the default answers.
const DEFAULTS_MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Everything a request may need.
pub struct App {
    /// What serving counts.
    pub metrics: Arc<ServingMetrics>,
    /// Every metric of the process, for `/metrics`.
    pub registry: Registry,
    /// Liveness and readiness.
    pub health: Arc<Health>,
    /// Who is asking.
    pub authn: Arc<Authenticator>,
    /// May they.
    pub authz: Arc<Authorizer>,
    /// The resources.
    pub resources: Arc<resources::Resources>,
    /// The fleet view.
    pub fleet: Arc<fleet::FleetView>,
    /// Requests being answered (health probes excepted): `--max-requests-inflight`.
    pub inflight: Arc<Semaphore>,
    /// Computations running off the async threads: `--max-compute-concurrency`.
    pub compute: Arc<Semaphore>,
    /// Watches open: `--max-watches`, `--max-watches-per-user`.
    pub watches: Arc<watch::WatchSlots>,
    /// Deadline of one request: `--request-timeout`.
    pub request_timeout: Duration,
    /// Which requests are logged (`--access-log`), refusals rate-limited per source.
    pub access_log: Arc<AccessLogger>,
}

/// The response type of every handler: a whole body, or a stream (a watch; a list kept
/// gzipped, decompressed as it is read).
pub type HttpResponse = Response<watch::Body>;

impl App {
    /// Answers one request. Never fails: every error is a `Status` response. `keep` (the
    /// connection's count of requests in flight) is dropped with the answer, or when a
    /// watch's stream ends.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        peer: &Peer,
        keep: Box<dyn Send>,
    ) -> HttpResponse {
        let (mut parts, _body) = req.into_parts();
        let started = std::time::Instant::now();
        let info = match RequestInfo::parse(&parts.method, &parts.uri) {
            Ok(info) => info,
            Err(error) => {
                debug!(method = %parts.method, code = 400, addr = ?peer.addr, %error, "request refused before parsing");
                self.metrics.request("", RequestResource::Other).finish(400);
                let response = status(&error);
                self.access_log.record(&Entry {
                    requester: &Requester::default(),
                    verb: "",
                    path: "",
                    code: 400,
                    bytes: body_size(&response),
                    latency: started.elapsed(),
                    addr: peer.addr,
                });
                return response;
            }
        };
        let timer = self.metrics.request(info.verb(), info.metric());
        let mut requester = Requester::default();
        if info.verb() == "watch" && info.is_read() && !info.is_health() {
            // A watch is long-running: not a request in flight, nor under the request
            // deadline, but under the watch limits. Logged when answered (its stream's bytes
            // are not known then).
            let response = self
                .watch(&info, &mut parts.headers, peer, keep, &mut requester)
                .await;
            let code = response.status().as_u16();
            self.access_log.record(&Entry {
                requester: &requester,
                verb: info.verb(),
                path: info.path(),
                code,
                bytes: None,
                latency: started.elapsed(),
                addr: peer.addr,
            });
            timer.finish(code);
            return response;
        }
        let response = self
            .limited(&info, &mut parts.headers, peer, &mut requester)
            .await;
        let code = response.status().as_u16();
        let logged = self.access_log.record(&Entry {
            requester: &requester,
            verb: info.verb(),
            path: info.path(),
            code,
            bytes: body_size(&response),
            latency: started.elapsed(),
            addr: peer.addr,
        });
        if !logged {
            debug!(
                method = %info.method(),
                path = info.path(),
                verb = info.verb(),
                code,
                micros = started.elapsed().as_micros(),
                addr = ?peer.addr,
                "request"
            );
        }
        timer.finish(code);
        if *info.method() == http::Method::HEAD {
            return without_body(response);
        }
        response
    }

    /// Authenticates and authorizes a watch as its list would be, then serves it.
    async fn watch(
        &self,
        info: &RequestInfo,
        headers: &mut HeaderMap,
        peer: &Peer,
        keep: Box<dyn Send>,
        requester: &mut Requester,
    ) -> HttpResponse {
        // A connection admitted past the connection limit is for health probes only: a watch
        // there gets the 429 every other request gets (`limited`), before authentication.
        if peer.probe_only {
            self.metrics.request_refused(ServingLimit::Inflight);
            return status(&StatusError::too_many_requests(RETRY_AFTER_TOO_MANY));
        }
        let user = match self.admit(info, headers, peer, requester).await {
            Ok(user) => user,
            Err(refused) => return refused,
        };
        let accept = header_str(headers, header::ACCEPT);
        let slot = || {
            self.watches.take(&user.name, keep).map_err(|limit| {
                self.metrics.request_refused(match limit {
                    watch::WatchLimit::Total => ServingLimit::Watches,
                    watch::WatchLimit::PerUser => ServingLimit::WatchesPerUser,
                });
                StatusError::too_many_requests(RETRY_AFTER_TOO_MANY)
            })
        };
        let kept = self.resources.projectors();
        let served = match info.target() {
            Target::Resource(Resource::List { namespace, params }) => self
                .resources
                .served_arch(params.arch.as_ref())
                .and_then(|arch| {
                    let hub = kept
                        .versions(&arch)
                        .ok_or_else(|| StatusError::method_not_allowed("watch"))?;
                    // With `?cve=`, only the versions whose changelog fixes it, as the list.
                    let fixing = params.cve.clone().map(|cve| {
                        let resources = self.resources.clone();
                        let arch = arch.clone();
                        watch::CveWatch::Fixing(Box::new(
                            move |item: &elemental_changelog_hub::Item<elemental_changelog_apiservice::types::ManagedOSVersionChangelogSummary>| {
                                resources.fixes(item.namespace(), item.name(), &cve, &arch)
                            },
                        ))
                    });
                    let fixing = match &params.package {
                        Some(query) => Some(versions_carrying(
                            self.resources.clone(),
                            (**query).clone(),
                            arch.clone(),
                            fixing,
                        )),
                        None => fixing,
                    };
                    watch::watch(
                        hub,
                        &watch::SUMMARIES,
                        namespace.as_deref(),
                        params,
                        accept,
                        fixing,
                        watch::Held {
                            slot: slot()?,
                            open: self.metrics.watch_opened(),
                            compute: self.compute.clone(),
                        },
                    )
                }),
            Target::Fleet(FleetResource::Machines { namespace, params }) => self
                .resources
                .served_arch(params.arch.as_ref())
                .and_then(|arch| {
                    let hub = kept
                        .machines(&arch)
                        .ok_or_else(|| StatusError::method_not_allowed("watch"))?;
                    // With `?cve=`, each event's machine carries its exposure, computed from
                    // the channel data of the moment (each channel's first fix found once).
                    let exposure = params.cve.clone().map(|cve| {
                        let fleet = self.fleet.clone();
                        let arch = arch.clone();
                        Box::new(move |mut m: MachineInventoryChangelogSummary| {
                            m.cve = Some(fleet.exposure(&m, &cve, &arch));
                            m
                        }) as watch::Transform<MachineInventoryChangelogSummary>
                    });
                    let exposure = match &params.package {
                        Some(query) => Some(machines_carrying(
                            self.fleet.clone(),
                            (**query).clone(),
                            arch,
                            exposure,
                        )),
                        None => exposure.map(watch::CveWatch::Exposure),
                    };
                    watch::watch(
                        hub,
                        &watch::MACHINES,
                        namespace.as_deref(),
                        params,
                        accept,
                        exposure,
                        watch::Held {
                            slot: slot()?,
                            open: self.metrics.watch_opened(),
                            compute: self.compute.clone(),
                        },
                    )
                }),
            Target::Invalid { error, .. } => Err(error.clone()),
            _ => Err(StatusError::method_not_allowed(info.verb())),
        };
        served.unwrap_or_else(|error| status(&error))
    }

    /// Applies the serving limits: health probes always pass; a connection admitted
    /// past the connection limit gets nothing else; past `--max-requests-inflight`, 429;
    /// past `--request-timeout`, 504.
    async fn limited(
        &self,
        info: &RequestInfo,
        headers: &mut HeaderMap,
        peer: &Peer,
        requester: &mut Requester,
    ) -> HttpResponse {
        if info.is_health() {
            return self.respond(info, headers, peer, requester).await;
        }
        let permit = if peer.probe_only {
            None
        } else {
            self.inflight.try_acquire().ok()
        };
        let Some(_permit) = permit else {
            self.metrics.request_refused(ServingLimit::Inflight);
            return status(&StatusError::too_many_requests(RETRY_AFTER_TOO_MANY));
        };
        match deadline::within(
            self.request_timeout,
            self.respond(info, headers, peer, requester),
        )
        .await
        {
            Some(response) => response,
            None => {
                self.metrics.request_refused(ServingLimit::Timeout);
                status(&StatusError::timeout(
                    "request did not complete within the allotted timeout",
                    None,
                ))
            }
        }
    }

    async fn respond(
        &self,
        info: &RequestInfo,
        headers: &mut HeaderMap,
        peer: &Peer,
        requester: &mut Requester,
    ) -> HttpResponse {
        if let Err(refused) = self.admit(info, headers, peer, requester).await {
            return refused;
        }
        // Watches are served by `watch`; a watch of anything else is not served.
        if !info.is_read() || info.verb() == "watch" {
            return status(&StatusError::method_not_allowed(info.verb()));
        }
        self.route(info, headers).await
    }

    /// Authenticates the request and authorizes what it asks (and the second version a
    /// changelog's `from=` or a machine changelog's `to=` reads): the user, or the refusal to
    /// send. `requester` is who asked, as far as authentication got (for the access log).
    async fn admit(
        &self,
        info: &RequestInfo,
        headers: &mut HeaderMap,
        peer: &Peer,
        requester: &mut Requester,
    ) -> Result<UserInfo, HttpResponse> {
        // Health answers are the same for everyone: a token on a probe is never reviewed.
        let tokens = if info.is_health() {
            Tokens::Ignore
        } else {
            Tokens::Review
        };
        let authenticated = self
            .authn
            .authenticate_request(headers, peer.chain.as_deref(), tokens)
            .await;
        let user = match authenticated {
            Ok((user, method)) => {
                *requester = Requester::new(&user, method);
                user
            }
            Err(error) if error.is_saturated() => {
                self.metrics.request_refused(ServingLimit::Reviews);
                return Err(status(&StatusError::too_many_requests(
                    RETRY_AFTER_TOO_MANY,
                )));
            }
            Err(error) => {
                warn!(error = %error_chain(&error), addr = ?peer.addr, "authentication failed");
                return Err(status(&StatusError::unauthorized()));
            }
        };
        self.authorize(&user, info.attributes(), info.is_public_document())
            .await?;
        // `from=` and a machine changelog's `to=` read a second ManagedOSVersion: the user
        // must be allowed its changelog too (a Role's resourceNames may name only some).
        if let Some(other) = info.also_reads() {
            self.authorize(&user, &other, false).await?;
        }
        Ok(user)
    }

    /// Answers an admitted request by what it targets.
    async fn route(&self, info: &RequestInfo, headers: &mut HeaderMap) -> HttpResponse {
        let accept = header_str(headers, header::ACCEPT);
        match info.target() {
            Target::Discovery(which) => {
                let document = match which {
                    Discovery::Apis => discovery::negotiate_apis(accept).document(),
                    Discovery::Group => discovery::api_group_document(),
                    Discovery::ResourceList => discovery::api_resource_list(),
                };
                document_response(headers, document)
            }
            Target::OpenApi(which) => document_response(
                headers,
                match which {
                    OpenApi::V2 => openapi::v2(),
                    OpenApi::V3Root => openapi::v3_root(),
                    OpenApi::V3GroupVersion => openapi::v3_group_version(),
                },
            ),
            Target::Health { probe, verbose } => match probe {
                Probe::Live => health_response(&self.health.live(), "livez", *verbose),
                Probe::Ready => health_response(&self.health.ready(), "readyz", *verbose),
            },
            Target::Metrics => ok(
                self.registry.encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            ),
            Target::Resource(resource) => {
                if matches!(resource, Resource::List { .. } | Resource::Get { .. }) {
                    self.resources.projectors().fresh(Kept::Versions).await;
                }
                self.answer_resource(resource, headers)
                    .await
                    .unwrap_or_else(|error| status(&error))
            }
            Target::Fleet(resource) => {
                if matches!(
                    resource,
                    FleetResource::Machines { .. } | FleetResource::Machine { .. }
                ) {
                    self.resources.projectors().fresh(Kept::Machines).await;
                }
                let answering = self.fleet.answering(resource, accept);
                match answering {
                    Ok(answering) => self.answer(answering, headers).await,
                    Err(error) => Err(error),
                }
                .unwrap_or_else(|error| status(&error))
            }
            Target::Invalid { error, .. } => status(error),
            Target::NotFound => status(&not_found_path(info.path())),
        }
    }
}

impl App {
    /// Authorizes `attributes` for `user`; the refusal to send otherwise (403, 429, 500).
    /// A public document (discovery, OpenAPI) is served to an authenticated user when the
    /// review cannot be made.
    async fn authorize(
        &self,
        user: &UserInfo,
        attributes: &Attributes,
        public_document: bool,
    ) -> Result<(), HttpResponse> {
        match self.authz.authorize(user, attributes).await {
            Ok(Decision::Allow) => Ok(()),
            Ok(Decision::Deny { reason }) => Err(status(&forbidden(user, attributes, &reason))),
            Err(error)
                if public_document && user.groups.iter().any(|g| g == AUTHENTICATED_GROUP) =>
            {
                // Discovery and OpenAPI must never answer 5xx (the aggregator
                // marks the group stale and retries with backoff). They hold
                // nothing secret and RBAC's default system:discovery role
                // grants them to every authenticated user, so an unavailable
                // SubjectAccessReview does not withhold them from one.
                warn!(error = %error_chain(&error), user = %user.name, "authorization unavailable; serving a discovery document");
                Ok(())
            }
            Err(error) if error.is_saturated() => {
                self.metrics.request_refused(ServingLimit::Reviews);
                Err(status(&StatusError::too_many_requests(
                    RETRY_AFTER_TOO_MANY,
                )))
            }
            Err(error) => {
                warn!(error = %error_chain(&error), user = %user.name, "authorization failed");
                Err(status(&StatusError::internal(&error)))
            }
        }
    }

    /// Answers a resource request as [`resources::Resources::answering`] decides: the ready bytes
    /// when they are kept (a lookup on the async threads, nothing rendered), else rendered on
    /// the blocking pool. Requests for an answer being rendered wait for it without holding a
    /// thread. Rendering that grows with the data (a range of versions, a list of summaries, a
    /// CVE search) runs at most `--max-compute-concurrency` at once, so a flood of such
    /// requests leaves the async threads, health probes and ready answers alone.
    async fn answer_resource(
        &self,
        resource: &Resource,
        headers: &HeaderMap,
    ) -> Result<HttpResponse, StatusError> {
        let accept = header_str(headers, header::ACCEPT);
        let answering = self.resources.answering(resource, accept)?;
        self.answer(answering, headers).await
    }

    /// Answers as decided: the ready bytes, or the job run off the async threads.
    async fn answer(
        &self,
        answering: Answering,
        headers: &HeaderMap,
    ) -> Result<HttpResponse, StatusError> {
        let render = match answering {
            Answering::Ready(ready) => return self.send(ready, headers).await,
            Answering::Render(render) => render,
        };
        match render.job {
            Job::Keep { key, render: job } => {
                let ready = self
                    .resources
                    .ready()
                    .get_or_render_async(key, self.off_the_reactor(render.cost, job))
                    .await?;
                self.send(ready, headers).await
            }
            Job::Run(job) => match self.off_the_reactor(render.cost, job).await? {
                Answer::Ready(ready) => self.send(ready, headers).await,
                Answer::Fresh(ready) => Ok(ready.respond(headers)),
            },
        }
    }

    /// Sends ready bytes. A large answer kept gzipped only, to a client that does not accept
    /// gzip (the aggregator always does), is decompressed as the client reads it, a step of
    /// [`ready::INFLATE_CHUNK`] bytes at a time off the async threads, each holding a compute
    /// slot (`--max-compute-concurrency`): the memory of such a request is one step and the
    /// decoder's state, not the body (it was the whole body, 46 MB for 50,000 machines).
    async fn send(
        &self,
        ready: Arc<Ready>,
        headers: &HeaderMap,
    ) -> Result<HttpResponse, StatusError> {
        let compute = ready
            .decompresses_for(headers)
            .then(|| self.compute.clone());
        Ok(ready.respond_inflating(headers, compute))
    }

    /// Runs `job` on the blocking pool, holding a compute slot when it is heavy. Waiting for
    /// a slot counts against the request's deadline (`limited`).
    async fn off_the_reactor<T: Send + 'static>(
        &self,
        cost: Cost,
        job: Box<dyn FnOnce() -> Result<T, StatusError> + Send>,
    ) -> Result<T, StatusError> {
        let permit = match cost {
            Cost::Light => None,
            Cost::Heavy => Some(deadline::request_slot(self.compute.clone(), &self.metrics).await?),
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job()
        })
        .await
        .unwrap_or_else(|panicked| Err(StatusError::internal(&panicked)))
    }

    /// Keeps the default answer of every version ready (see
    /// [`resources::Resources::prepare_defaults`]) while the answer cache is less than half full: after
    /// each change of the channel data, and every 10 s for ManagedOSVersions
    /// created since. Runs until the process ends.
    pub async fn keep_defaults_ready(self: Arc<Self>) {
        let mut changes = self.resources.changes();
        loop {
            let (_, capacity) = self.resources.kept_bytes();
            if capacity > 0
                && let Ok(permit) = self.compute.clone().acquire_owned().await
            {
                let resources = self.resources.clone();
                let started = std::time::Instant::now();
                let rendered = tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    resources.prepare_defaults(capacity / 2)
                })
                .await
                .unwrap_or_default();
                if rendered > 0 {
                    debug!(
                        rendered,
                        millis = started.elapsed().as_millis(),
                        "default answers rendered ahead of requests"
                    );
                }
            }
            // At most one pass a second however fast channels change; then the next
            // change, or the recheck interval, whichever comes first.
            tokio::time::sleep(DEFAULTS_MIN_INTERVAL).await;
            if let Ok(Err(_)) = tokio::time::timeout(DEFAULTS_RECHECK, changes.changed()).await {
                // The cache is gone (the process is ending): recheck on the interval only.
                tokio::time::sleep(DEFAULTS_RECHECK).await;
            }
        }
    }
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The size of a response's body, when known before it is sent (a streamed body's from its
/// `Content-Length`).
fn body_size(response: &HttpResponse) -> Option<u64> {
    hyper::body::Body::size_hint(response.body())
        .exact()
        .or_else(|| {
            response
                .headers()
                .get(header::CONTENT_LENGTH)?
                .to_str()
                .ok()?
                .parse()
                .ok()
        })
}

/// A `Status` error response.
pub fn status(error: &StatusError) -> HttpResponse {
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(error.to_json()))));
    *response.status_mut() =
        StatusCode::from_u16(error.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = error.retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// A 200 with a body and content type.
pub fn ok(body: impl Into<Bytes>, content_type: &'static str) -> HttpResponse {
    let mut response = Response::new(Either::Left(Full::new(body.into())));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn not_found_path(path: &str) -> StatusError {
    let mut error = StatusError::not_found("", "");
    error.message = format!("the server could not find the requested resource ({path})");
    error.details = None;
    error
}

/// A discovery or OpenAPI document: built once with its gzip form, answered 304 to a
/// matching `If-None-Match`.
fn document_response(headers: &HeaderMap, document: &'static discovery::Document) -> HttpResponse {
    static READY: LazyLock<DashMap<usize, Arc<Ready>>> = LazyLock::new(DashMap::new);
    // A handful of static documents, each made ready once.
    let address = std::ptr::from_ref(document) as usize;
    let ready = READY
        .entry(address)
        .or_insert_with(|| {
            Arc::new(Ready::document(
                &document.body,
                document.content_type,
                &document.etag,
            ))
        })
        .clone();
    ready.respond(headers)
}

fn health_response(checks: &[health::Check], kind: &str, verbose: bool) -> HttpResponse {
    let (healthy, text) = health::render(kind, checks, verbose);
    let mut response = ok(text, "text/plain; charset=utf-8");
    response.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    if !healthy {
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    }
    response
}

fn forbidden(user: &UserInfo, attributes: &Attributes, reason: &str) -> StatusError {
    let denied = match attributes.resource() {
        Some(r) => Denied::Resource {
            verb: attributes.verb(),
            group: &r.group,
            resource: &r.resource,
            subresource: r.subresource.as_deref(),
            namespace: r.namespace.as_deref(),
            name: r.name.as_deref(),
        },
        None => Denied::NonResource {
            verb: attributes.verb(),
            path: attributes.path(),
        },
    };
    StatusError::forbidden(&user.name, &denied, reason)
}

/// The answer to a HEAD request: the GET answer's head (its `Content-Length` included), no
/// body. hyper leaves out the body of a HEAD answer over HTTP/1.1 but sends it over HTTP/2,
/// where DATA frames on a HEAD stream are a protocol error: Go's HTTP/2 client (kube-apiserver's
/// proxy) resets the stream with `PROTOCOL_ERROR` and logs "received DATA on a HEAD request".
fn without_body(response: HttpResponse) -> HttpResponse {
    let (mut parts, body) = response.into_parts();
    if let Some(length) = hyper::body::Body::size_hint(&body).exact() {
        parts
            .headers
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(length));
    }
    Response::from_parts(parts, Either::Left(Full::new(Bytes::new())))
}

/// A version watch with `?package=`: only the versions `query` selects (and `fixing`, with
/// `?cve=`), each with its `package` block.
fn versions_carrying(
    resources: Arc<Resources>,
    query: PackageQuery,
    arch: Arch,
    fixing: Option<watch::CveWatch<ManagedOSVersionChangelogSummary>>,
) -> watch::CveWatch<ManagedOSVersionChangelogSummary> {
    let fixes = match fixing {
        Some(watch::CveWatch::Fixing(fixes)) => Some(fixes),
        _ => None,
    };
    let (seen, shown) = (resources.clone(), (query.clone(), arch.clone()));
    watch::CveWatch::Package {
        visible: Box::new(move |item| {
            fixes.as_ref().is_none_or(|f| f(item))
                && seen
                    .package(item.namespace(), item.name(), &query, &arch)
                    .is_some()
        }),
        transform: Box::new(move |mut summary: ManagedOSVersionChangelogSummary| {
            let (query, arch) = &shown;
            let (namespace, name) = (&summary.metadata.namespace, &summary.metadata.name);
            summary.package = resources.package(namespace, name, query, arch);
            summary
        }),
    }
}

/// A machine watch with `?package=`: only the machines `query` selects, each with its
/// `package` block (and its exposure, with `?cve=`).
fn machines_carrying(
    fleet: Arc<FleetView>,
    query: PackageQuery,
    arch: Arch,
    exposure: Option<watch::Transform<MachineInventoryChangelogSummary>>,
) -> watch::CveWatch<MachineInventoryChangelogSummary> {
    let (seen, shown) = (fleet.clone(), (query.clone(), arch.clone()));
    watch::CveWatch::Package {
        visible: Box::new(move |item| seen.package(item, &query, &arch).is_some()),
        transform: Box::new(move |machine: MachineInventoryChangelogSummary| {
            let (query, arch) = &shown;
            let mut machine = match &exposure {
                Some(exposure) => exposure(machine),
                None => machine,
            };
            machine.package = fleet.machine_package(&machine, query, arch);
            machine
        }),
    }
}

#[cfg(test)]
mod response_tests;
