//! Request handling: authentication, authorization, then the answer.
//!
//! | path | answer |
//! |---|---|
//! | `/apis` | aggregated discovery v2, or `APIGroupList` |
//! | `/apis/changelog.elemental.cattle.io` | `APIGroup` |
//! | `/apis/changelog.elemental.cattle.io/v1beta1` | `APIResourceList` |
//! | `.../managedosversions`, `.../namespaces/{ns}/managedosversions[/{name}]` | summaries ([`query`]) |
//! | `.../namespaces/{ns}/managedosversions/{name}/changelog` | a changelog ([`query`]) |
//! | `/openapi/v2`, `/openapi/v3[/apis/<group>/<version>]` | schemas |
//! | `/livez`, `/readyz`, `/healthz` | health |
//! | `/metrics` | Prometheus |
//!
//! This API is read-only: any verb but GET (and HEAD) is a 405. Discovery and
//! OpenAPI are built once at start and cannot fail.

pub mod query;
pub mod selector;

use std::sync::Arc;

use bytes::Bytes;
use elemental_changelog_apiservice::{
    GROUP, RESOURCE, SUBRESOURCE, VERSION, discovery, openapi,
    status::{Denied, StatusError},
};
use http::{HeaderValue, Method, Request, Response, StatusCode, header, request::Parts};
use http_body_util::Full;
use hyper::body::Incoming;
use tracing::{debug, warn};

use crate::{
    authn::{AUTHENTICATED_GROUP, Authenticator, UserInfo},
    authz::{Attributes, Authorizer, Decision},
    health::{self, Health},
    metrics::{Metrics, RequestResource},
    server::Peer,
};

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
    /// The data.
    pub query: query::Query,
}

/// The response type of every handler.
pub type HttpResponse = Response<Full<Bytes>>;

/// What a path asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/apis`.
    Apis,
    /// `/apis/<group>`.
    Group,
    /// `/apis/<group>/<version>`.
    ResourceList,
    /// Summaries, in a namespace or all.
    List {
        /// Namespace, or all.
        namespace: Option<String>,
    },
    /// One summary.
    Get {
        /// Namespace.
        namespace: String,
        /// ManagedOSVersion name.
        name: String,
    },
    /// A changelog.
    Changelog {
        /// Namespace.
        namespace: String,
        /// ManagedOSVersion name.
        name: String,
    },
    /// `/openapi/v2`.
    OpenApiV2,
    /// `/openapi/v3`.
    OpenApiV3Root,
    /// `/openapi/v3/apis/<group>/<version>`.
    OpenApiV3Group,
    /// `/livez[/...]`, `/healthz[/...]`.
    Livez,
    /// `/readyz[/...]`.
    Readyz,
    /// `/metrics`.
    Metrics,
    /// Anything else.
    NotFound,
}

impl Route {
    /// Parses a request path.
    pub fn parse(path: &str) -> Self {
        let trimmed = path.trim_end_matches('/');
        let segments: Vec<&str> = trimmed.split('/').skip(1).collect();
        match segments.as_slice() {
            ["apis"] => Self::Apis,
            ["apis", g] if *g == GROUP => Self::Group,
            ["apis", g, v, rest @ ..] if *g == GROUP && *v == VERSION => Self::resource(rest),
            ["openapi", "v2"] => Self::OpenApiV2,
            ["openapi", "v3"] => Self::OpenApiV3Root,
            ["openapi", "v3", "apis", g, v] if *g == GROUP && *v == VERSION => Self::OpenApiV3Group,
            ["livez", ..] | ["healthz", ..] => Self::Livez,
            ["readyz", ..] => Self::Readyz,
            ["metrics"] => Self::Metrics,
            _ => Self::NotFound,
        }
    }

    fn resource(rest: &[&str]) -> Self {
        let valid = |s: &str| !s.is_empty();
        match rest {
            [] => Self::ResourceList,
            [r] if *r == RESOURCE => Self::List { namespace: None },
            ["namespaces", ns, r] if *r == RESOURCE && valid(ns) => Self::List {
                namespace: Some((*ns).to_owned()),
            },
            ["namespaces", ns, r, name] if *r == RESOURCE && valid(ns) && valid(name) => {
                Self::Get {
                    namespace: (*ns).to_owned(),
                    name: (*name).to_owned(),
                }
            }
            ["namespaces", ns, r, name, s]
                if *r == RESOURCE && *s == SUBRESOURCE && valid(ns) && valid(name) =>
            {
                Self::Changelog {
                    namespace: (*ns).to_owned(),
                    name: (*name).to_owned(),
                }
            }
            _ => Self::NotFound,
        }
    }

    fn metric(&self) -> RequestResource {
        match self {
            Self::Apis | Self::Group | Self::ResourceList => RequestResource::Discovery,
            Self::List { .. } | Self::Get { .. } => RequestResource::Summaries,
            Self::Changelog { .. } => RequestResource::Changelog,
            Self::OpenApiV2 | Self::OpenApiV3Root | Self::OpenApiV3Group => {
                RequestResource::OpenApi
            }
            Self::Livez | Self::Readyz => RequestResource::Health,
            Self::Metrics => RequestResource::Metrics,
            Self::NotFound => RequestResource::Other,
        }
    }

    /// Discovery and OpenAPI documents: the same for everyone, never secret.
    fn is_public_document(&self) -> bool {
        matches!(
            self,
            Self::Apis
                | Self::Group
                | Self::ResourceList
                | Self::OpenApiV2
                | Self::OpenApiV3Root
                | Self::OpenApiV3Group
        )
    }

    fn is_resource(&self) -> bool {
        matches!(
            self,
            Self::List { .. } | Self::Get { .. } | Self::Changelog { .. }
        )
    }
}

impl App {
    /// Answers one request. Never fails: every error is a `Status` response.
    pub async fn handle(&self, req: Request<Incoming>, peer: &Peer) -> HttpResponse {
        let (mut parts, _body) = req.into_parts();
        let route = Route::parse(parts.uri.path());
        let attributes =
            crate::authz::attributes(&parts.method, parts.uri.path(), parts.uri.query());
        let mut timer = self.metrics.request(attributes.verb(), route.metric());
        let started = std::time::Instant::now();
        let response = self.respond(&mut parts, peer, &route, &attributes).await;
        let code = response.status().as_u16();
        debug!(
            method = %parts.method,
            uri = %parts.uri,
            code,
            micros = started.elapsed().as_micros(),
            addr = ?peer.addr,
            "request"
        );
        timer.verb(attributes.verb());
        timer.finish(code);
        response
    }

    async fn respond(
        &self,
        parts: &mut Parts,
        peer: &Peer,
        route: &Route,
        attributes: &Attributes,
    ) -> HttpResponse {
        let user = match self
            .authn
            .authenticate(&mut parts.headers, peer.chain.as_deref())
            .await
        {
            Ok(user) => user,
            Err(error) => {
                warn!(%error, addr = ?peer.addr, "authentication failed");
                return status(&StatusError::unauthorized());
            }
        };
        match self.authz.authorize(&user, attributes).await {
            Ok(Decision::Allow) => {}
            Ok(Decision::Deny { reason }) => return status(&forbidden(&user, attributes, &reason)),
            Err(error)
                if route.is_public_document()
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
        if parts.method != Method::GET && parts.method != Method::HEAD
            || attributes.verb() == "watch"
        {
            return status(&StatusError::method_not_allowed(attributes.verb()));
        }
        let query = parts.uri.query().unwrap_or_default();
        match route {
            Route::Apis => {
                let accept = header_str(parts, header::ACCEPT);
                let document = discovery::negotiate_apis(accept).document();
                document_response(parts, document)
            }
            Route::Group => document_response(parts, discovery::api_group_document()),
            Route::ResourceList => document_response(parts, discovery::api_resource_list()),
            Route::OpenApiV2 => document_response(parts, openapi::v2()),
            Route::OpenApiV3Root => document_response(parts, openapi::v3_root()),
            Route::OpenApiV3Group => document_response(parts, openapi::v3_group_version()),
            Route::Livez => health_response(&self.health.live(), "livez", query),
            Route::Readyz => health_response(&self.health.ready(), "readyz", query),
            Route::Metrics => {
                let mut response = Response::new(Full::new(Bytes::from(self.metrics.encode())));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                response
            }
            Route::NotFound => status(&not_found_path(parts.uri.path())),
            r if r.is_resource() => {
                let accept = header_str(parts, header::ACCEPT);
                match self.query.answer(route, accept, query) {
                    Ok(answer) => answer,
                    Err(error) => status(&error),
                }
            }
            _ => status(&not_found_path(parts.uri.path())),
        }
    }
}

fn header_str(parts: &Parts, name: header::HeaderName) -> Option<&str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

/// A `Status` error response.
pub fn status(error: &StatusError) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(error.to_json())));
    *response.status_mut() =
        StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
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

fn document_response(parts: &Parts, document: &'static discovery::Document) -> HttpResponse {
    let matches =
        discovery::if_none_match_matches(header_str(parts, header::IF_NONE_MATCH), &document.etag);
    let mut response = if matches {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        ok(
            Bytes::from_static(document.body.as_slice()),
            document.content_type,
        )
    };
    let headers = response.headers_mut();
    if let Ok(etag) = HeaderValue::from_str(&document.etag) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    if matches {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(document.content_type),
        );
    }
    response
}

fn health_response(checks: &[health::Check], kind: &str, query: &str) -> HttpResponse {
    let verbose = query
        .split('&')
        .any(|kv| kv == "verbose" || kv.starts_with("verbose="));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let base = "/apis/changelog.elemental.cattle.io/v1beta1";
        assert_eq!(Route::parse("/apis"), Route::Apis);
        assert_eq!(
            Route::parse("/apis/changelog.elemental.cattle.io"),
            Route::Group
        );
        assert_eq!(Route::parse(base), Route::ResourceList);
        assert_eq!(Route::parse(&format!("{base}/")), Route::ResourceList);
        assert_eq!(
            Route::parse(&format!("{base}/managedosversions")),
            Route::List { namespace: None }
        );
        assert_eq!(
            Route::parse(&format!(
                "{base}/namespaces/fleet-default/managedosversions"
            )),
            Route::List {
                namespace: Some("fleet-default".into())
            }
        );
        assert_eq!(
            Route::parse(&format!(
                "{base}/namespaces/fleet-default/managedosversions/v1"
            )),
            Route::Get {
                namespace: "fleet-default".into(),
                name: "v1".into()
            }
        );
        assert_eq!(
            Route::parse(&format!(
                "{base}/namespaces/fleet-default/managedosversions/v1/changelog"
            )),
            Route::Changelog {
                namespace: "fleet-default".into(),
                name: "v1".into()
            }
        );
        assert_eq!(
            Route::parse(&format!(
                "{base}/namespaces/fleet-default/managedosversions/v1/status"
            )),
            Route::NotFound
        );
        assert_eq!(
            Route::parse(&format!("{base}/namespaces//managedosversions")),
            Route::NotFound
        );
        assert_eq!(
            Route::parse("/apis/elemental.cattle.io/v1beta1"),
            Route::NotFound
        );
        assert_eq!(
            Route::parse("/openapi/v3/apis/changelog.elemental.cattle.io/v1beta1"),
            Route::OpenApiV3Group
        );
        assert_eq!(Route::parse("/livez/ping"), Route::Livez);
        assert_eq!(Route::parse("/"), Route::NotFound);
    }
}

#[cfg(test)]
mod response_tests;
