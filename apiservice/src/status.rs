//! Kubernetes `Status` errors, shaped and worded as kube-apiserver writes them
//! (k8s.io/apimachinery `pkg/api/errors`, k8s.io/apiserver
//! `pkg/endpoints/handlers/responsewriters/errors.go`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{GROUP, RESOURCE, types::UnavailableReason};

/// `Status.reason`: why a request failed, machine readable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// 400: the request is invalid.
    BadRequest,
    /// 401: no valid credentials.
    Unauthorized,
    /// 403: the user may not do this.
    Forbidden,
    /// 404: no such object.
    NotFound,
    /// 405: the verb is not served on this resource.
    MethodNotAllowed,
    /// 406: no acceptable representation.
    NotAcceptable,
    /// 410: a watch's resourceVersion can no longer be served: list again.
    Expired,
    /// 415: the request body's media type is not supported.
    UnsupportedMediaType,
    /// 429: too many requests.
    TooManyRequests,
    /// 500: a bug or an unexpected failure.
    InternalError,
    /// 503: not ready to answer yet; retry later.
    ServiceUnavailable,
    /// 504: the request did not finish in time.
    Timeout,
}

impl Reason {
    /// The HTTP status code of a `Status` with this reason.
    pub fn code(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::NotAcceptable => 406,
            Self::Expired => 410,
            Self::UnsupportedMediaType => 415,
            Self::TooManyRequests => 429,
            Self::InternalError => 500,
            Self::ServiceUnavailable => 503,
            Self::Timeout => 504,
        }
    }

    /// The name written on the wire (`NotFound`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "BadRequest",
            Self::Unauthorized => "Unauthorized",
            Self::Forbidden => "Forbidden",
            Self::NotFound => "NotFound",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::NotAcceptable => "NotAcceptable",
            Self::Expired => "Expired",
            Self::UnsupportedMediaType => "UnsupportedMediaType",
            Self::TooManyRequests => "TooManyRequests",
            Self::InternalError => "InternalError",
            Self::ServiceUnavailable => "ServiceUnavailable",
            Self::Timeout => "Timeout",
        }
    }
}

/// `Status.details.causes[].reason`: why, machine readable (kube-apiserver's `CauseType`, and
/// this server's own reasons a changelog is not available).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CauseReason {
    /// No reason given (written as nothing).
    #[default]
    Unknown,
    /// `FieldValueInvalid`: a parameter's value is invalid (the cause's `field` names it).
    FieldValueInvalid,
    /// Why a version's changelog is not available (`NoChannel`, `NotFetched`, …).
    Unavailable(UnavailableReason),
    /// Another reason, as read from another server's `Status`.
    Other(String),
}

impl CauseReason {
    /// The reason as written (`""` when unknown).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Unknown => "",
            Self::FieldValueInvalid => "FieldValueInvalid",
            Self::Unavailable(reason) => reason.as_str(),
            Self::Other(other) => other,
        }
    }

    /// Whether no reason is given.
    pub fn is_unknown(&self) -> bool {
        matches!(self, Self::Unknown)
    }
}

impl From<&str> for CauseReason {
    fn from(raw: &str) -> Self {
        if raw.is_empty() {
            return Self::Unknown;
        }
        if raw == "FieldValueInvalid" {
            return Self::FieldValueInvalid;
        }
        UnavailableReason::ALL
            .into_iter()
            .find(|r| r.as_str() == raw)
            .map_or_else(|| Self::Other(raw.to_owned()), Self::Unavailable)
    }
}

impl fmt::Display for CauseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for CauseReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CauseReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok(Self::from(raw.as_str()))
    }
}

/// `Status.details.causes[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCause {
    /// Machine-readable cause; not written when unknown.
    #[serde(
        default,
        rename = "reason",
        skip_serializing_if = "CauseReason::is_unknown"
    )]
    pub reason: CauseReason,
    /// Human-readable description.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The field at fault, when there is one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

/// `Status.details`: which object the error is about. kube-apiserver puts the
/// *resource* (plural) in `kind` for NotFound, Forbidden and MethodNotAllowed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    /// Object name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// API group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Kind or resource.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Causes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    /// Seconds the client should wait before retrying; 0 when not set.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_after_seconds: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A failed request, as a Kubernetes `Status` object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusError {
    /// Machine-readable reason; the HTTP status code follows from it ([`StatusError::code`]).
    pub reason: Reason,
    /// Human-readable message.
    pub message: String,
    /// What the error is about (boxed to keep `Result<_, StatusError>` small).
    pub details: Option<Box<StatusDetails>>,
    /// Value for the `Retry-After` response header, in seconds.
    pub retry_after: Option<u32>,
}

/// The attributes of a denied request, as k8s.io/apiserver's authorizer sees
/// them; they decide the wording of a 403.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied<'a> {
    /// A request for an API resource.
    Resource {
        /// `get`, `list`, ...
        verb: &'a str,
        /// API group (empty for the core group).
        group: &'a str,
        /// Resource (plural).
        resource: &'a str,
        /// Subresource, when the request names one.
        subresource: Option<&'a str>,
        /// Namespace, for a namespaced request.
        namespace: Option<&'a str>,
        /// Object name, for a request on one object.
        name: Option<&'a str>,
    },
    /// A request for a path that is not an API resource (`/metrics`, ...).
    NonResource {
        /// Lower-case HTTP verb (`get`, `post`, ...).
        verb: &'a str,
        /// Request path.
        path: &'a str,
    },
}

/// The body of a `Status` on the wire, fields in kube-apiserver's order.
#[derive(Serialize)]
struct Wire<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: Empty,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<&'a StatusDetails>,
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

/// `resource.group` (or `resource` for the core group), as Go's
/// `schema.GroupResource.String()`.
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// Go's `%q` for the strings that appear in messages: quoted, with `"` and `\`
/// escaped and control characters written as escapes.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl StatusError {
    /// The HTTP status code, which follows from the reason.
    pub fn code(&self) -> u16 {
        self.reason.code()
    }

    fn new(reason: Reason, message: String, details: Option<StatusDetails>) -> Self {
        Self {
            reason,
            message,
            details: details.map(Box::new),
            retry_after: None,
        }
    }

    /// 404 for an object of `resource` (plural) in our group, worded like
    /// `managedosversions.changelog.elemental.cattle.io "v1.2" not found`.
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::not_found_in(GROUP, resource, name)
    }

    /// 404 for an object of `resource` in `group` (for example the
    /// ManagedOSVersion in `elemental.cattle.io` a changelog is asked for).
    pub fn not_found_in(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            Reason::NotFound,
            format!("{} {} not found", qualified(group, resource), quote(name)),
            Some(StatusDetails {
                name: name.to_owned(),
                group: group.to_owned(),
                kind: resource.to_owned(),
                ..StatusDetails::default()
            }),
        )
    }

    /// 405 for a verb this read-only API does not serve, worded like
    /// `create is not supported on resources of kind "managedosversions.changelog.elemental.cattle.io"`.
    pub fn method_not_allowed(verb: &str) -> Self {
        Self::new(
            Reason::MethodNotAllowed,
            format!(
                "{verb} is not supported on resources of kind {}",
                quote(&qualified(GROUP, RESOURCE))
            ),
            Some(StatusDetails {
                group: GROUP.to_owned(),
                kind: RESOURCE.to_owned(),
                ..StatusDetails::default()
            }),
        )
    }

    /// 400 with `message`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, message.into(), None)
    }

    /// 410 `Expired`, as kube-apiserver ends a watch whose resourceVersion is too old: the
    /// client lists again.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(Reason::Expired, message.into(), None)
    }

    /// 401, as kube-apiserver answers a request it could not authenticate.
    pub fn unauthorized() -> Self {
        Self::new(Reason::Unauthorized, "Unauthorized".to_owned(), None)
    }

    /// 403 for `user`, worded exactly like kube-apiserver's authorization
    /// filter; `reason` (the authorizer's reason, may be empty) is appended
    /// after `: ` when present.
    pub fn forbidden(user: &str, denied: &Denied<'_>, reason: &str) -> Self {
        let user = quote(user);
        let (what, group, resource, name) = match *denied {
            Denied::NonResource { verb, path } => (
                format!("User {user} cannot {verb} path {}", quote(path)),
                "",
                "",
                "",
            ),
            Denied::Resource {
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
            } => {
                let full = match subresource.filter(|s| !s.is_empty()) {
                    Some(sub) => format!("{resource}/{sub}"),
                    None => resource.to_owned(),
                };
                let scope = match namespace.filter(|ns| !ns.is_empty()) {
                    Some(ns) => format!("in the namespace {}", quote(ns)),
                    None => "at the cluster scope".to_owned(),
                };
                (
                    format!(
                        "User {user} cannot {verb} resource {} in API group {} {scope}",
                        quote(&full),
                        quote(group)
                    ),
                    group,
                    resource,
                    name.unwrap_or_default(),
                )
            }
        };
        // responsewriters.ForbiddenStatusError escapes HTML metacharacters.
        let what = what
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        let err = if reason.is_empty() {
            what
        } else {
            format!("{what}: {reason}")
        };
        let message = if group.is_empty() && resource.is_empty() {
            format!("forbidden: {err}")
        } else if name.is_empty() {
            format!("{} is forbidden: {err}", qualified(group, resource))
        } else {
            format!(
                "{} {} is forbidden: {err}",
                qualified(group, resource),
                quote(name)
            )
        };
        Self::new(
            Reason::Forbidden,
            message,
            Some(StatusDetails {
                name: name.to_owned(),
                group: group.to_owned(),
                kind: resource.to_owned(),
                ..StatusDetails::default()
            }),
        )
    }

    /// 503 with `message`; `retry_after` seconds go to `details` and the
    /// `Retry-After` header.
    pub fn service_unavailable(message: impl Into<String>, retry_after: Option<u32>) -> Self {
        let details = retry_after.map(|seconds| StatusDetails {
            retry_after_seconds: seconds,
            ..StatusDetails::default()
        });
        Self {
            retry_after,
            ..Self::new(Reason::ServiceUnavailable, message.into(), details)
        }
    }

    /// 429 as kube-apiserver's max-in-flight filter answers it, with `Retry-After`.
    pub fn too_many_requests(retry_after: u32) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(
                Reason::TooManyRequests,
                "Too many requests, please try again later.".to_owned(),
                Some(StatusDetails {
                    retry_after_seconds: retry_after,
                    ..StatusDetails::default()
                }),
            )
        }
    }

    /// 406 listing the media types that can be served.
    pub fn not_acceptable(accepted: &[&str]) -> Self {
        Self::new(
            Reason::NotAcceptable,
            format!(
                "only the following media types are accepted: {}",
                accepted.join(", ")
            ),
            None,
        )
    }

    /// 500 for an unexpected failure, described by `error`.
    pub fn internal(error: &dyn std::error::Error) -> Self {
        let cause = error.to_string();
        Self::new(
            Reason::InternalError,
            format!("Internal error occurred: {cause}"),
            Some(StatusDetails {
                causes: vec![StatusCause {
                    message: cause,
                    ..StatusCause::default()
                }],
                ..StatusDetails::default()
            }),
        )
    }

    /// 504 for a request that did not finish in time.
    pub fn timeout(message: &str, retry_after: Option<u32>) -> Self {
        Self {
            retry_after,
            ..Self::new(
                Reason::Timeout,
                format!("Timeout: {message}"),
                Some(StatusDetails {
                    retry_after_seconds: retry_after.unwrap_or_default(),
                    ..StatusDetails::default()
                }),
            )
        }
    }

    /// The `Status` object as JSON, as kube-apiserver writes it.
    pub fn to_json(&self) -> Vec<u8> {
        let wire = Wire {
            kind: "Status",
            api_version: "v1",
            metadata: Empty {},
            status: "Failure",
            message: &self.message,
            reason: self.reason.as_str(),
            details: self.details.as_deref(),
            code: self.code(),
        };
        // Serializing plain strings and integers into a Vec cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }
}

impl fmt::Display for StatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StatusError {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn body(e: &StatusError) -> Value {
        serde_json::from_slice(&e.to_json()).unwrap()
    }

    #[test]
    fn cause_reasons_are_written_and_read_as_kube_apiserver_writes_them() {
        for (reason, raw) in [
            (CauseReason::FieldValueInvalid, "FieldValueInvalid"),
            (
                CauseReason::Unavailable(UnavailableReason::NotFetched),
                "NotFetched",
            ),
            (
                CauseReason::Other("FieldValueRequired".into()),
                "FieldValueRequired",
            ),
        ] {
            let cause = StatusCause {
                reason: reason.clone(),
                ..StatusCause::default()
            };
            let json = serde_json::to_value(&cause).unwrap();
            assert_eq!(json, serde_json::json!({ "reason": raw }));
            assert_eq!(serde_json::from_value::<StatusCause>(json).unwrap(), cause);
        }
        for reason in UnavailableReason::ALL {
            let json = serde_json::to_value(reason).unwrap();
            assert_eq!(
                json,
                reason.as_str(),
                "the summary's reason and the cause agree"
            );
            assert_eq!(
                CauseReason::from(reason.as_str()),
                CauseReason::Unavailable(reason)
            );
        }
        let unknown = serde_json::to_value(StatusCause::default()).unwrap();
        assert_eq!(unknown, serde_json::json!({}), "no reason, nothing written");
        let read: StatusCause = serde_json::from_str(r#"{"message":"m"}"#).unwrap();
        assert!(read.reason.is_unknown());
    }

    #[test]
    fn not_found_matches_kube() {
        let e = StatusError::not_found("managedosversions", "v1.2.3");
        assert_eq!(
            body(&e),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "managedosversions.changelog.elemental.cattle.io \"v1.2.3\" not found",
                "reason": "NotFound",
                "details": {"name": "v1.2.3", "group": "changelog.elemental.cattle.io", "kind": "managedosversions"},
                "code": 404
            })
        );
        assert_eq!(e.to_string(), e.message);
        assert_eq!(e.retry_after, None);
    }

    #[test]
    fn field_order_is_kubes() {
        let s = String::from_utf8(StatusError::bad_request("bad from").to_json()).unwrap();
        assert_eq!(
            s,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"bad from","reason":"BadRequest","code":400}"#
        );
    }

    #[test]
    fn forbidden_namespaced_subresource() {
        let e = StatusError::forbidden(
            "bob",
            &Denied::Resource {
                verb: "get",
                group: GROUP,
                resource: "managedosversions",
                subresource: Some("changelog"),
                namespace: Some("fleet-default"),
                name: Some("v1"),
            },
            "",
        );
        assert_eq!(e.code(), 403);
        assert_eq!(
            e.message,
            "managedosversions.changelog.elemental.cattle.io \"v1\" is forbidden: User \"bob\" cannot get resource \"managedosversions/changelog\" in API group \"changelog.elemental.cattle.io\" in the namespace \"fleet-default\""
        );
        let b = body(&e);
        assert_eq!(b["reason"], "Forbidden");
        assert_eq!(
            b["details"],
            json!({"name": "v1", "group": GROUP, "kind": "managedosversions"})
        );
    }

    #[test]
    fn forbidden_cluster_scope_list_with_reason() {
        let e = StatusError::forbidden(
            "system:serviceaccount:a:b",
            &Denied::Resource {
                verb: "list",
                group: GROUP,
                resource: "managedosversions",
                subresource: None,
                namespace: None,
                name: None,
            },
            "no RBAC policy matched",
        );
        assert_eq!(
            e.message,
            "managedosversions.changelog.elemental.cattle.io is forbidden: User \"system:serviceaccount:a:b\" cannot list resource \"managedosversions\" in API group \"changelog.elemental.cattle.io\" at the cluster scope: no RBAC policy matched"
        );
        assert_eq!(
            body(&e)["details"],
            json!({"group": GROUP, "kind": "managedosversions"})
        );
    }

    #[test]
    fn forbidden_non_resource_has_empty_details() {
        let e = StatusError::forbidden(
            "system:anonymous",
            &Denied::NonResource {
                verb: "get",
                path: "/metrics",
            },
            "",
        );
        assert_eq!(
            e.message,
            "forbidden: User \"system:anonymous\" cannot get path \"/metrics\""
        );
        assert_eq!(body(&e)["details"], json!({}));
    }

    #[test]
    fn forbidden_escapes_html_and_quotes() {
        let e = StatusError::forbidden(
            "a\"<b>",
            &Denied::NonResource {
                verb: "get",
                path: "/x&y",
            },
            "",
        );
        assert_eq!(
            e.message,
            "forbidden: User \"a\\\"&lt;b&gt;\" cannot get path \"/x&amp;y\""
        );
    }

    #[test]
    fn method_not_allowed_matches_kube() {
        let e = StatusError::method_not_allowed("create");
        let b = body(&e);
        assert_eq!(b["code"], 405);
        assert_eq!(b["reason"], "MethodNotAllowed");
        assert_eq!(
            b["message"],
            "create is not supported on resources of kind \"managedosversions.changelog.elemental.cattle.io\""
        );
        assert_eq!(
            b["details"],
            json!({"group": GROUP, "kind": "managedosversions"})
        );
    }

    #[test]
    fn unauthorized_matches_kube() {
        let b = body(&StatusError::unauthorized());
        assert_eq!(b["message"], "Unauthorized");
        assert_eq!(b["reason"], "Unauthorized");
        assert_eq!(b["code"], 401);
        assert!(b.get("details").is_none());
    }

    #[test]
    fn service_unavailable_carries_retry_after() {
        let e = StatusError::service_unavailable("changelog data not fetched yet", Some(10));
        assert_eq!(e.retry_after, Some(10));
        let b = body(&e);
        assert_eq!(b["code"], 503);
        assert_eq!(b["reason"], "ServiceUnavailable");
        assert_eq!(b["details"], json!({"retryAfterSeconds": 10}));
        let plain = body(&StatusError::service_unavailable("x", None));
        assert!(plain.get("details").is_none());
    }

    #[test]
    fn not_acceptable_and_internal_and_timeout() {
        let b = body(&StatusError::not_acceptable(&["application/json"]));
        assert_eq!(b["code"], 406);
        assert_eq!(b["reason"], "NotAcceptable");
        assert_eq!(
            b["message"],
            "only the following media types are accepted: application/json"
        );

        let io = std::io::Error::other("boom");
        let b = body(&StatusError::internal(&io));
        assert_eq!(b["code"], 500);
        assert_eq!(b["message"], "Internal error occurred: boom");
        assert_eq!(b["details"], json!({"causes": [{"message": "boom"}]}));

        let e = StatusError::timeout("fetching image", Some(5));
        assert_eq!(e.code(), 504);
        assert_eq!(body(&e)["details"]["retryAfterSeconds"], 5);
        assert_eq!(e.message, "Timeout: fetching image");
    }

    #[test]
    fn status_round_trips_through_k8s_openapi() {
        let e = StatusError::not_found_in("elemental.cattle.io", "managedosversions", "x");
        let s: k8s_openapi::apimachinery::pkg::apis::meta::v1::Status =
            serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(s.code, Some(404));
        assert_eq!(s.reason.as_deref(), Some("NotFound"));
        assert_eq!(
            s.details.and_then(|d| d.group).as_deref(),
            Some("elemental.cattle.io")
        );
    }
}
