//! Answers: a parsed [`RequestInfo`] is authenticated, authorized, then answered by what it
//! targets ([`Target`]): discovery and OpenAPI documents (built once at start, they cannot
//! fail), health, metrics, or the resources of this API ([`resources`]).
//!
//! This API is read-only: any verb but GET (and HEAD) is a 405.

pub mod ready;
pub mod resources;

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use bytes::Bytes;
use dashmap::DashMap;
use elemental_changelog_apiservice::{
    discovery, openapi,
    status::{Denied, StatusError},
};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use self::ready::Ready;
use crate::{
    authn::{AUTHENTICATED_GROUP, Authenticator, UserInfo},
    authz::{Authorizer, Decision},
    health::{self, Health},
    metrics::{Metrics, RequestResource, ServingLimit},
    request::{Discovery, OpenApi, Peer, Probe, RequestInfo, Resource, Target},
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
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Liveness and readiness.
    pub health: Arc<Health>,
    /// Who is asking.
    pub authn: Arc<Authenticator>,
    /// May they.
    pub authz: Arc<Authorizer>,
    /// The resources.
    pub resources: Arc<resources::Resources>,
    /// Requests being answered (health probes excepted): `--max-requests-inflight`.
    pub inflight: Arc<Semaphore>,
    /// Computations running off the async threads: `--max-compute-concurrency`.
    pub compute: Arc<Semaphore>,
    /// Deadline of one request: `--request-timeout`.
    pub request_timeout: Duration,
}

/// The response type of every handler.
pub type HttpResponse = Response<Full<Bytes>>;

impl App {
    /// Answers one request. Never fails: every error is a `Status` response.
    pub async fn handle(&self, req: Request<Incoming>, peer: &Peer) -> HttpResponse {
        let (mut parts, _body) = req.into_parts();
        let started = std::time::Instant::now();
        let info = match RequestInfo::parse(&parts.method, &parts.uri) {
            Ok(info) => info,
            Err(error) => {
                debug!(method = %parts.method, code = 400, addr = ?peer.addr, %error, "request refused before parsing");
                self.metrics.request("", RequestResource::Other).finish(400);
                return status(&error);
            }
        };
        let timer = self.metrics.request(info.verb(), info.metric());
        let response = self.limited(&info, &mut parts.headers, peer).await;
        let code = response.status().as_u16();
        debug!(
            method = %info.method(),
            path = info.path(),
            verb = info.verb(),
            code,
            micros = started.elapsed().as_micros(),
            addr = ?peer.addr,
            "request"
        );
        timer.finish(code);
        response
    }

    /// Applies the serving limits: health probes always pass; a connection admitted
    /// past the connection limit gets nothing else; past `--max-requests-inflight`, 429;
    /// past `--request-timeout`, 504.
    async fn limited(
        &self,
        info: &RequestInfo,
        headers: &mut HeaderMap,
        peer: &Peer,
    ) -> HttpResponse {
        if info.is_health() {
            return self.respond(info, headers, peer).await;
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
        match tokio::time::timeout(self.request_timeout, self.respond(info, headers, peer)).await {
            Ok(response) => response,
            Err(_) => {
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
    ) -> HttpResponse {
        let user = match self
            .authn
            .authenticate(headers, peer.chain.as_deref())
            .await
        {
            Ok(user) => user,
            Err(error) => {
                warn!(%error, addr = ?peer.addr, "authentication failed");
                return status(&StatusError::unauthorized());
            }
        };
        match self.authz.authorize(&user, info.attributes()).await {
            Ok(Decision::Allow) => {}
            Ok(Decision::Deny { reason }) => return status(&forbidden(&user, info, &reason)),
            Err(error)
                if info.is_public_document()
                    && user.groups.iter().any(|g| g == AUTHENTICATED_GROUP) =>
            {
                // Discovery and OpenAPI must never answer 5xx (the aggregator
                // marks the group stale and retries with backoff). They hold
                // nothing secret and RBAC's default system:discovery role
                // grants them to every authenticated user, so an unavailable
                // SubjectAccessReview does not withhold them from one.
                warn!(%error, user = %user.name, "authorization unavailable; serving a discovery document");
            }
            Err(error) => {
                warn!(%error, user = %user.name, "authorization failed");
                return status(&StatusError::internal(&error));
            }
        }
        // Watches are not served: there is no stream of changes to offer.
        if !info.is_read() || info.verb() == "watch" {
            return status(&StatusError::method_not_allowed(info.verb()));
        }
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
                self.metrics.encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            ),
            Target::Resource(resource) => self
                .answer_resource(resource, headers)
                .await
                .unwrap_or_else(|error| status(&error)),
            Target::Invalid { error, .. } => status(error),
            Target::NotFound => status(&not_found_path(info.path())),
        }
    }
}

impl App {
    /// Answers a resource request: from ready bytes when they are kept (decided on the async
    /// threads: a lookup, no rendering), else rendered and kept. Rendering that grows with the
    /// data (a range of versions, a list of summaries, a CVE search) runs on the blocking
    /// pool, at most `--max-compute-concurrency` at once, so a flood of such requests leaves
    /// the async threads, health probes and ready answers alone.
    async fn answer_resource(
        &self,
        resource: &Resource,
        headers: &HeaderMap,
    ) -> Result<HttpResponse, StatusError> {
        let accept = header_str(headers, header::ACCEPT);
        if let Some(ready) = self.resources.kept(resource, accept)? {
            return Ok(ready.respond(headers));
        }
        let heavy = match resource {
            Resource::Changelog { params, .. } => params.from.is_some(),
            Resource::List { .. } => true,
            Resource::Get { .. } => false,
        };
        if !heavy {
            return Ok(self.resources.answer(resource, accept)?.respond(headers));
        }
        // Waiting for a slot counts against the request's deadline (`limited`).
        let Ok(permit) = self.compute.clone().acquire_owned().await else {
            self.metrics.request_refused(ServingLimit::ComputeQueue);
            return Err(StatusError::too_many_requests(RETRY_AFTER_TOO_MANY));
        };
        let resources = self.resources.clone();
        let resource = resource.clone();
        let accept = accept.map(str::to_owned);
        let answer = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            resources.answer(&resource, accept.as_deref())
        })
        .await
        .unwrap_or_else(|panicked| Err(StatusError::internal(&panicked)))?;
        Ok(answer.respond(headers))
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

/// A `Status` error response.
pub fn status(error: &StatusError) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(error.to_json())));
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
    let mut response = Response::new(Full::new(body.into()));
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

fn forbidden(user: &UserInfo, info: &RequestInfo, reason: &str) -> StatusError {
    let attributes = info.attributes();
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

#[cfg(test)]
mod response_tests;
