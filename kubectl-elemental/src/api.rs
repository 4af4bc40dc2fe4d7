//! Requests to `changelog.elemental.cattle.io/v1beta1` through kube-apiserver,
//! as the user of the kubeconfig: kube-apiserver authenticates the user and
//! checks their RBAC before it proxies to the aggregated server. Answers come
//! back with the `Warning` headers to show, and failures as kubectl words them.

use std::collections::BTreeSet;
use std::path::Path;

use elemental_changelog_apiservice::{
    API_VERSION, MACHINE_RESOURCE, RESOURCE, SUBRESOURCE, content, render,
};
use http::{HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Limited};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::core::Status;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

/// Bound on a response body read into memory (a changelog of thousands of
/// advisories is a few MiB).
const MAX_BODY: usize = 64 << 20;

/// What kubectl sends to get a `Table` (v1, then v1beta1, then the object).
const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// Characters escaped in a path segment: everything but unreserved and sub-delims.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// Why a command failed. `Display` is what kubectl would print (without the
/// source chain, which `main` appends).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or has no usable context.
    #[error("error: loading the kubeconfig")]
    Kubeconfig(#[source] KubeconfigError),
    /// The client could not be built from the kubeconfig.
    #[error("error: creating the client")]
    Client(#[source] kube::Error),
    /// The request could not be built (a name that makes no URL).
    #[error("error: building the request")]
    Request(#[source] http::Error),
    /// kube-apiserver could not be reached.
    #[error("Unable to connect to the server")]
    Connect(#[source] kube::Error),
    /// The response body could not be read (or exceeded [`MAX_BODY`]).
    #[error("Unable to read the server's response")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The server answered with an error.
    #[error("{}", kubectl_message(.0))]
    Server(Box<Status>),
    /// The object could not be written as YAML.
    #[error("error: writing YAML")]
    Yaml(#[source] serde_yaml::Error),
    /// The server answered 200 with something that is not what was asked for.
    #[error("error: the server's answer is not a {what}")]
    Decode {
        /// What was expected.
        what: &'static str,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
}

/// kubectl's `StandardErrorMessage` for an API `Status`.
fn kubectl_message(status: &Status) -> String {
    match status.reason.as_str() {
        "Unauthorized" => format!(
            "error: You must be logged in to the server ({})",
            status.message
        ),
        "" => format!("Error from server: {}", status.message),
        reason => format!("Error from server ({reason}): {}", status.message),
    }
}

/// client-go's `NewGenericServerResponse`: the `Status` of an error answer
/// whose body is not one.
fn generic_status(code: StatusCode, body: &[u8]) -> Status {
    let server_message = String::from_utf8_lossy(body).trim().to_owned();
    let (reason, message) = match code {
        StatusCode::NOT_FOUND => (
            "NotFound",
            "the server could not find the requested resource".to_owned(),
        ),
        StatusCode::BAD_REQUEST => (
            "BadRequest",
            "the server rejected our request for an unknown reason".to_owned(),
        ),
        StatusCode::UNAUTHORIZED => (
            "Unauthorized",
            "the server has asked for the client to provide credentials".to_owned(),
        ),
        StatusCode::FORBIDDEN => ("Forbidden", server_message),
        StatusCode::NOT_ACCEPTABLE => (
            "NotAcceptable",
            "the server was unable to respond with a content type that the client supports"
                .to_owned(),
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".to_owned(),
        ),
        StatusCode::SERVICE_UNAVAILABLE => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request".to_owned(),
        ),
        StatusCode::GATEWAY_TIMEOUT => (
            "Timeout",
            "the server was unable to return a response in the time allotted, but may still be processing the request".to_owned(),
        ),
        StatusCode::TOO_MANY_REQUESTS => (
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later"
                .to_owned(),
        ),
        c if c.is_server_error() => (
            "InternalError",
            format!("an error on the server ({server_message:?}) has prevented the request from succeeding"),
        ),
        c => (
            "",
            format!(
                "the server responded with the status code {} but did not return more information",
                c.as_u16()
            ),
        ),
    };
    Status::failure(&message, reason).with_code(code.as_u16())
}

/// A successful answer.
#[derive(Debug)]
pub struct Answer {
    /// The body.
    pub body: Vec<u8>,
    /// The texts of its `Warning: 299` headers, in order.
    pub warnings: Vec<String>,
}

impl Answer {
    /// The body as JSON of type `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self, what: &'static str) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|source| Error::Decode { what, source })
    }
}

/// Which namespaces a list covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace (`-A`).
    All,
}

/// A client of the API, as the kubeconfig's user.
pub struct Api {
    client: kube::Client,
    namespace: String,
}

impl Api {
    /// Connects with the kubeconfig (`path`, else `$KUBECONFIG`, else
    /// `~/.kube/config`) and `context` (else its current context).
    pub async fn connect(path: Option<&Path>, context: Option<String>) -> Result<Self, Error> {
        let options = KubeConfigOptions {
            context,
            ..KubeConfigOptions::default()
        };
        let config = match path {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
            }
            None => kube::Config::from_kubeconfig(&options).await,
        }
        .map_err(Error::Kubeconfig)?;
        let namespace = config.default_namespace.clone();
        let client = kube::Client::try_from(config).map_err(Error::Client)?;
        Ok(Self { client, namespace })
    }

    /// The context's namespace (`default` when it names none).
    pub fn default_namespace(&self) -> &str {
        &self.namespace
    }

    /// `GET .../namespaces/{namespace}/managedosversions/{name}/changelog` as JSON.
    pub async fn changelog(
        &self,
        namespace: &str,
        name: &str,
        from: Option<&str>,
        arch: Option<&str>,
    ) -> Result<Answer, Error> {
        let path = format!(
            "/apis/{API_VERSION}/namespaces/{}/{RESOURCE}/{}/{SUBRESOURCE}",
            segment(namespace),
            segment(name)
        );
        let query = query(&[("from", from), ("arch", arch)]);
        self.get(&path, &query, content::JSON).await
    }

    /// `GET .../namespaces/{namespace}/machineinventories/{name}/changelog` as JSON: the
    /// changelog from the machine's current version to `to` (default: its target).
    pub async fn machine_changelog(
        &self,
        namespace: &str,
        machine: &str,
        to: Option<&str>,
        arch: Option<&str>,
    ) -> Result<Answer, Error> {
        let path = format!(
            "/apis/{API_VERSION}/namespaces/{}/{MACHINE_RESOURCE}/{}/{SUBRESOURCE}",
            segment(namespace),
            segment(machine)
        );
        let query = query(&[("to", to), ("arch", arch)]);
        self.get(&path, &query, content::JSON).await
    }

    /// The `Table` of the changelog summaries in `scope` with the query
    /// parameters `params` (`cve`, `labelSelector`, `arch`).
    pub async fn summaries_table(
        &self,
        scope: &Scope,
        params: &[(&str, Option<&str>)],
    ) -> Result<Answer, Error> {
        self.table(RESOURCE, scope, params).await
    }

    /// The `Table` of the machines (the fleet view) in `scope` with `params`.
    pub async fn machines_table(
        &self,
        scope: &Scope,
        params: &[(&str, Option<&str>)],
    ) -> Result<Answer, Error> {
        self.table(MACHINE_RESOURCE, scope, params).await
    }

    async fn table(
        &self,
        resource: &str,
        scope: &Scope,
        params: &[(&str, Option<&str>)],
    ) -> Result<Answer, Error> {
        let path = match scope {
            Scope::Namespace(namespace) => format!(
                "/apis/{API_VERSION}/namespaces/{}/{resource}",
                segment(namespace)
            ),
            Scope::All => format!("/apis/{API_VERSION}/{resource}"),
        };
        self.get(&path, &query(params), TABLE_ACCEPT).await
    }

    async fn get(&self, path: &str, query: &str, accept: &'static str) -> Result<Answer, Error> {
        let uri = if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{query}")
        };
        let request = Request::get(uri)
            .header(header::ACCEPT, HeaderValue::from_static(accept))
            .body(kube::client::Body::empty())
            .map_err(Error::Request)?;
        let response = self.client.send(request).await.map_err(Error::Connect)?;
        let status = response.status();
        let warnings: Vec<String> = response
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(parse_warnings)
            .collect();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(Error::Read)?
            .to_bytes()
            .to_vec();
        if status.is_success() {
            return Ok(Answer { body, warnings });
        }
        let status = match serde_json::from_slice::<Status>(&body) {
            Ok(s) if !s.message.is_empty() || !s.reason.is_empty() => s,
            _ => generic_status(status, &body),
        };
        Err(Error::Server(Box::new(status)))
    }
}

fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

fn query(params: &[(&str, Option<&str>)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (key, value) in params {
        if let Some(value) = value {
            query.append_pair(key, value);
        }
    }
    query.finish()
}

/// The texts of the `299` warnings in one `Warning` header value
/// (`299 - "text"`, several separated by commas), as client-go keeps them:
/// other codes and malformed entries are skipped.
pub fn parse_warnings(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = value.trim_start();
    while !rest.is_empty() {
        let Some((entry, after)) = warning_entry(rest) else {
            break;
        };
        if let Some((299, text)) = entry
            && !text.is_empty()
        {
            out.push(text);
        }
        rest = after.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// A warning's code and text; `None` when malformed.
type Warning = Option<(u16, String)>;

/// One warning: `code SP agent SP quoted-text [SP quoted-date]`, and what
/// follows it.
fn warning_entry(s: &str) -> Option<(Warning, &str)> {
    let (code, rest) = s.split_once(' ')?;
    let (_agent, rest) = rest.trim_start().split_once(' ')?;
    let rest = rest.trim_start();
    let Some(quoted) = rest.strip_prefix('"') else {
        // Not a quoted text: skip to the next comma.
        let next = rest.find(',').map_or("", |i| &rest[i..]);
        return Some((None, next));
    };
    let mut text = String::new();
    let mut chars = quoted.char_indices();
    let mut end = None;
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => text.extend(chars.next().map(|(_, c)| c)),
            '"' => {
                end = Some(i + 1);
                break;
            }
            c => text.push(c),
        }
    }
    let mut rest = &quoted[end?..];
    // An optional warn-date.
    if let Some(date) = rest.trim_start().strip_prefix('"') {
        rest = date.split_once('"').map_or("", |(_, after)| after);
    }
    let code = code.parse::<u16>().ok().filter(|c| (100..1000).contains(c));
    Some((code.map(|c| (c, text)), rest))
}

/// Prints each warning once, as kubectl does (`Warning: <text>` on stderr).
#[derive(Debug, Default)]
pub struct Warnings {
    seen: BTreeSet<String>,
}

impl Warnings {
    /// Prints the warnings of `answer` not printed before.
    pub fn print(&mut self, answer: &Answer) {
        for text in &answer.warnings {
            if self.seen.insert(text.clone()) {
                eprintln!("Warning: {}", render::terminal_safe(text));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_as_kube_apiserver_writes_them() {
        assert_eq!(parse_warnings(r#"299 - "plain text""#), ["plain text"]);
        assert_eq!(
            parse_warnings(r#"299 - "with \"quotes\" and \\ backslash""#),
            [r#"with "quotes" and \ backslash"#]
        );
        assert_eq!(
            parse_warnings(r#"299 - "one, with a comma", 299 elemental "two""#),
            ["one, with a comma", "two"]
        );
        assert_eq!(
            parse_warnings(r#"299 - "dated" "Wed, 21 Oct 2015 07:28:00 GMT", 299 - "next""#),
            ["dated", "next"]
        );
        // Other codes, empty texts and garbage are skipped; the rest is kept.
        assert_eq!(
            parse_warnings(r#"199 - "misc", 299 - "", 299 - unquoted, 299 - "kept""#),
            ["kept"]
        );
        assert!(parse_warnings("").is_empty());
        assert!(parse_warnings("299").is_empty());
        assert!(parse_warnings(r#"299 - "unterminated"#).is_empty());
    }

    #[test]
    fn server_errors_read_as_kubectl_prints_them() {
        let status: Status = serde_json::from_str(
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound",
               "message":"managedosversions.changelog.elemental.cattle.io \"v9\" not found"}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Error::Server(Box::new(status)).to_string(),
            r#"Error from server (NotFound): managedosversions.changelog.elemental.cattle.io "v9" not found"#
        );
        let unauthorized = Status::failure("Unauthorized", "Unauthorized").with_code(401);
        assert_eq!(
            Error::Server(Box::new(unauthorized)).to_string(),
            "error: You must be logged in to the server (Unauthorized)"
        );
        let no_reason = Status::failure("something", "").with_code(418);
        assert_eq!(
            Error::Server(Box::new(no_reason)).to_string(),
            "Error from server: something"
        );
    }

    #[test]
    fn error_bodies_that_are_not_a_status() {
        let message = |code: u16, body: &str| {
            let code = StatusCode::from_u16(code).unwrap_or_else(|e| panic!("{e}"));
            kubectl_message(&generic_status(code, body.as_bytes()))
        };
        assert_eq!(
            message(503, "service unavailable\n"),
            "Error from server (ServiceUnavailable): the server is currently unable to handle the request"
        );
        assert_eq!(
            message(404, "404 page not found"),
            "Error from server (NotFound): the server could not find the requested resource"
        );
        assert_eq!(
            message(500, "boom"),
            r#"Error from server (InternalError): an error on the server ("boom") has prevented the request from succeeding"#
        );
        assert_eq!(
            message(418, ""),
            "Error from server: the server responded with the status code 418 but did not return more information"
        );
    }

    #[test]
    fn paths_and_queries_are_escaped() {
        assert_eq!(segment("v1.0"), "v1.0");
        assert_eq!(segment("a/b?c"), "a%2Fb%3Fc");
        assert_eq!(
            query(&[
                ("cve", Some("CVE-2024-1")),
                ("arch", None),
                ("labelSelector", Some("a=b,c!=d"))
            ]),
            "cve=CVE-2024-1&labelSelector=a%3Db%2Cc%21%3Dd"
        );
    }
}
