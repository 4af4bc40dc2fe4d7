//! The request model end to end (issue 8), on the real control plane.
//!
//! 1. **kube-apiserver and this server agree on what a request is.** kube-apiserver runs with
//!    an audit log, whose events carry the `RequestInfo` it computed (verb, group, version,
//!    resource, subresource, namespace, name) for every request, under the `Audit-ID` the
//!    client sent. Hundreds of generated requests (repeated, empty and encoded parameters,
//!    encoded names, trailing slashes, special verbs, other groups) go through it, and each
//!    event is compared with what [`RequestInfo::parse`] makes of the same request.
//! 2. **No parameter widens what RBAC allows.** A user whose Role names one ManagedOSVersion
//!    (`resourceNames`) reads through the aggregator with repeated, empty and encoded
//!    selectors and names, and never receives another version.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiserver::request::RequestInfo;
use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Severity};
use elemental_changelog_integration::audit::AuditLog;
use elemental_changelog_integration::generated::updates_log;
use elemental_changelog_integration::paths::{
    GROUP_VERSION, all_summaries_path, changelog_path, summaries_path,
};
use elemental_changelog_integration::publish;
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::elemental::{self, VersionEntry};
use elemental_changelog_integration::testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions};
use elemental_changelog_integration::wait::soon;
use k8s_openapi::jiff::Timestamp;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use reqwest::{Method, StatusCode};
use serde_json::Value;

const CHANNEL: &str = "request-model";
const VERSIONS: [&str; 3] = ["rm-a", "rm-b", "rm-c"];
/// The only version alice may read.
const ALLOWED: &str = "rm-a";
/// Generated requests compared with kube-apiserver's audit events.
const GENERATED: usize = 300;

const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

#[tokio::test]
async fn request_model_agrees_with_kube_apiserver_and_rbac() -> Result<()> {
    let audit = AuditLog::new(AUDIT_POLICY)?;
    let log = audit.path().to_owned();
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        apiserver_args: audit.apiserver_args(),
        namespaces: vec![FLEET_NAMESPACE.to_owned()],
    })
    .await?;
    bed.start_server_reading(&registry, &[]).await?;
    let result = async {
        publish_channel(&bed, &registry).await?;
        attributes_agree_with_kube_apiserver(&bed, &log).await?;
        no_parameter_widens_a_resource_names_role(&bed).await
    }
    .await;
    bed.finish(result)
}

// ---------------------------------------------------------------------------
// kube-apiserver's RequestInfo, read from its audit log

/// One generated request: method and path-and-query as sent.
fn request_strategy() -> impl Strategy<Value = (Method, String)> {
    let method = proptest::sample::select(vec![
        Method::GET,
        Method::GET,
        Method::GET,
        Method::HEAD,
        Method::DELETE,
        Method::POST,
    ]);
    let prefix = proptest::sample::select(vec![
        GROUP_VERSION,
        GROUP_VERSION,
        GROUP_VERSION,
        "/apis/changelog.elemental.cattle.io/v1beta1/watch",
        "/apis/changelog.elemental.cattle.io/v1beta1/proxy",
        "/apis/elemental.cattle.io/v1beta1",
        "/api/v1",
        "/apis/changelog.elemental.cattle.io",
    ]);
    let segment = proptest::sample::select(vec![
        "namespaces",
        "namespaces",
        "fleet-default",
        "fleet-defaul%74",
        "managedosversions",
        "managedosversions",
        "rm-a",
        "rm-%62",
        "changelog",
        "status",
        "finalize",
        "a%2Fb",
        "",
    ]);
    let path = (
        prefix,
        proptest::collection::vec(segment, 0..5),
        proptest::bool::ANY,
    )
        .prop_map(|(prefix, segments, trailing)| {
            let mut path = prefix.to_owned();
            for segment in segments {
                path.push('/');
                path.push_str(segment);
            }
            if trailing {
                path.push('/');
            }
            path
        });
    let piece = proptest::sample::select(vec![
        "fieldSelector=metadata.name%3Drm-a",
        "fieldSelector=metadata.name%3D%3Drm-b",
        "fieldSelector=metadata.name!%3Drm-a",
        "fieldSelector=metadata.namespace%3Dfleet-default,metadata.name%3Drm-c",
        "fieldSelector=metadata.name%3Drm-b,metadata.name%3Drm-a",
        "fieldSelector=metadata.name%3Da%2Fb",
        "fieldSelector=metadata.name%3D..",
        "fieldSelector=",
        "fieldSelector=nonsense",
        "labelSelector=a%3Db",
        "labelSelector=a+in+b",
        "watch=true",
        "watch=0",
        "watch=F",
        "watch=FALSE",
        "watch=1",
        "watch=",
        "limit=5",
        "limit=x",
        "timeoutSeconds=3",
        "from=rm-a",
        "format=text",
        "a;b=1",
        "x=%zz",
    ]);
    let query = proptest::collection::vec(piece, 0..5);
    (method, path, query).prop_map(|(method, path, query)| {
        if query.is_empty() {
            (method, path)
        } else {
            (method, format!("{path}?{}", query.join("&")))
        }
    })
}

/// What an audit event says kube-apiserver made of a request.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    verb: String,
    /// group, version, resource, subresource, namespace, name (empty when absent).
    object: Option<[String; 6]>,
}

fn seen_in_audit(event: &Value) -> Seen {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let object = event.get("objectRef").map(|o| {
        [
            text(&o["apiGroup"]),
            text(&o["apiVersion"]),
            text(&o["resource"]),
            text(&o["subresource"]),
            text(&o["namespace"]),
            text(&o["name"]),
        ]
    });
    Seen {
        verb: text(&event["verb"]),
        object,
    }
}

fn seen_by_us(method: &Method, uri: &str) -> Result<Seen> {
    let method = http::Method::from_bytes(method.as_str().as_bytes())?;
    let info = RequestInfo::parse(&method, &uri.parse()?)
        .map_err(|e| anyhow::anyhow!("{uri}: refused by the request model: {e}"))?;
    let attributes = info.attributes();
    let or_empty = |s: &Option<String>| s.clone().unwrap_or_default();
    Ok(Seen {
        verb: attributes.verb().to_owned(),
        object: attributes.resource().map(|r| {
            [
                r.group.clone(),
                r.version.clone(),
                r.resource.clone(),
                or_empty(&r.subresource),
                or_empty(&r.namespace),
                or_empty(&r.name),
            ]
        }),
    })
}

async fn attributes_agree_with_kube_apiserver(bed: &TestBed, log: &Path) -> Result<()> {
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let mut runner = TestRunner::deterministic();
    let strategy = request_strategy();
    let mut sent = BTreeMap::new();
    let mut refused = 0;
    for i in 0..GENERATED {
        let (method, uri) = strategy
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .current();
        let id = format!("request-model-{i:04}");
        let mut request = http
            .request(method.clone(), format!("{}{uri}", bed.apiserver_url()))
            .header("Audit-ID", &id);
        if method == Method::POST {
            request = request
                .header("Content-Type", "application/json")
                .body("{}");
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {uri}"))?;
        // Whatever the answer (200, 400, 404, 405...), the audit event records what
        // kube-apiserver understood; a 500 means it could not build a RequestInfo at all
        // (`/apis/<g>/<v>/watch` alone), and no event is written.
        if response.status() == StatusCode::INTERNAL_SERVER_ERROR {
            refused += 1;
            continue;
        }
        sent.insert(id, (method, uri));
    }
    let events = audit_events(log, sent.len()).await?;
    let mut disagreements = Vec::new();
    for (id, (method, uri)) in &sent {
        let event = events
            .get(id)
            .with_context(|| format!("no audit event for {method} {uri}"))?;
        // The URI as kube-apiserver received it (reqwest may have re-encoded characters).
        let received = event["requestURI"].as_str().unwrap_or(uri.as_str());
        let theirs = seen_in_audit(event);
        let ours = seen_by_us(method, received)?;
        if theirs != ours {
            disagreements.push(format!(
                "{method} {received}\n  kube-apiserver: {theirs:?}\n  ours:           {ours:?}"
            ));
        }
    }
    ensure!(
        disagreements.is_empty(),
        "{} of {} requests understood differently:\n{}",
        disagreements.len(),
        sent.len(),
        disagreements.join("\n")
    );
    eprintln!(
        "{} generated requests: kube-apiserver's RequestInfo and ours agree ({refused} more it could not parse)",
        sent.len()
    );
    ensure!(sent.len() > GENERATED / 2, "too few requests compared");
    Ok(())
}

/// The `ResponseComplete` audit events by id, once `count` of ours are written.
async fn audit_events(log: &Path, count: usize) -> Result<BTreeMap<String, Value>> {
    soon("audit events of every generated request", async || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let events: BTreeMap<String, Value> = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["stage"] == "ResponseComplete")
            .filter_map(|event| {
                let id = event["auditID"].as_str()?.to_owned();
                id.starts_with("request-model-").then_some((id, event))
            })
            .collect();
        Ok((events.len() >= count).then_some(events))
    })
    .await
}

// ---------------------------------------------------------------------------
// resourceNames

async fn no_parameter_widens_a_resource_names_role(bed: &TestBed) -> Result<()> {
    bed.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            r"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: one-version, namespace: {FLEET_NAMESPACE}}}
rules:
- apiGroups: [changelog.elemental.cattle.io]
  resources: [managedosversions, managedosversions/changelog]
  resourceNames: [{ALLOWED}]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-one-version, namespace: {FLEET_NAMESPACE}}}
subjects: [{{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}]
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-version}}
"
        ),
    )
    .await?;
    let http = bed.apiserver_http(None)?;
    let token = bed.token("alice")?.to_owned();
    let get = async |uri: &str| -> Result<(StatusCode, Value)> {
        let response = http
            .get(format!("{}{uri}", bed.apiserver_url()))
            .bearer_auth(&token)
            .send()
            .await?;
        let status = response.status();
        let text = response.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    };
    let list = summaries_path(FLEET_NAMESPACE);
    let one = format!("{list}?fieldSelector=metadata.name%3D{ALLOWED}");
    soon("alice's Role takes effect", async || {
        Ok((get(&one).await?.0 == StatusCode::OK).then_some(()))
    })
    .await?;

    // Lists: whatever follows, only the allowed version (or nothing) comes back.
    for query in [
        format!("fieldSelector=metadata.name%3D{ALLOWED}&fieldSelector="),
        format!("fieldSelector=metadata.name%3D{ALLOWED}&fieldSelector=metadata.name%3Drm-b"),
        format!("fieldSelector=metadata.name%3D%3D{ALLOWED}"),
        format!("fieldSelector=metadata.name%3D{ALLOWED}&fieldSelector=metadata.name!%3D{ALLOWED}"),
        format!("fieldSelector=metadata.name%3D{ALLOWED}%2Cmetadata.namespace%3D{FLEET_NAMESPACE}"),
        format!("fieldSelector=metadata.name%3D{ALLOWED}%2Cmetadata.name%3Drm-b"),
        format!("fieldSelector=metadata.name%3D{ALLOWED}&labelSelector=&labelSelector=x"),
    ] {
        let (status, body) = get(&format!("{list}?{query}")).await?;
        ensure!(status == StatusCode::OK, "{query}: {status} {body}");
        let names: Vec<&str> = body["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i["metadata"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        ensure!(
            names.iter().all(|n| *n == ALLOWED),
            "{query}: alice received {names:?}"
        );
    }
    let (status, body) = get(&one).await?;
    ensure!(
        status == StatusCode::OK && body["items"][0]["metadata"]["name"] == ALLOWED,
        "{body}"
    );

    // Requests for anything else are refused by kube-apiserver or answer nothing else.
    for uri in [
        list.clone(),
        format!("{list}?fieldSelector=metadata.name%3Drm-b"),
        format!("{list}?fieldSelector=&fieldSelector=metadata.name%3D{ALLOWED}"),
        format!("{list}/rm-b"),
        format!("{list}/rm-%62/changelog"),
        format!("{list}/rm-b/changelog?fieldSelector=metadata.name%3D{ALLOWED}"),
        format!(
            "{}?fieldSelector=metadata.name%3D{ALLOWED}",
            all_summaries_path()
        ),
    ] {
        let (status, body) = get(&uri).await?;
        ensure!(status == StatusCode::FORBIDDEN, "{uri}: {status} {body}");
    }

    // An encoded name is the same object for authorization and answer.
    let (status, body) = get(&format!("{list}/rm-%61/changelog")).await?;
    ensure!(status == StatusCode::OK, "{status} {body}");
    ensure!(body["metadata"]["name"] == ALLOWED, "{body}");
    let (status, body) = get(&format!("{list}/rm-%61")).await?;
    ensure!(
        status == StatusCode::OK && body["metadata"]["name"] == ALLOWED,
        "{status} {body}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Setup

async fn publish_channel(bed: &TestBed, registry: &Registry) -> Result<()> {
    let entries: Vec<VersionEntry> = VERSIONS
        .iter()
        .enumerate()
        .map(|(i, name)| VersionEntry {
            name: (*name).to_owned(),
            version: format!("v1.{i}.0"),
            upgrade_image: format!("registry.example/os:v1.{i}.0"),
            created: Some(1_700_000_000 + i64::try_from(i).unwrap_or_default() * 1000),
        })
        .collect();
    let updates = updates_log(&[Advisory {
        type_: "security".to_owned(),
        id: "SUSE-SU-2024:0001-1".to_owned(),
        title: "Security update for openssl".to_owned(),
        severity: Severity::Important,
        issued: Timestamp::from_second(1_705_000_000).ok(),
        description: "fixes things".to_owned(),
        packages: vec![AdvisoryPackage {
            name: "openssl".to_owned(),
            epoch: None,
            version: "3.1.4".to_owned(),
            release: "2.1".to_owned(),
            arch: "x86_64".to_owned(),
        }],
        ..Advisory::default()
    }]);
    let files: Vec<(String, Vec<u8>)> = VERSIONS
        .iter()
        .map(|name| (format!("changelogs/{name}.updates.log"), updates.clone()))
        .chain([("channel.json".to_owned(), elemental::channel_json(&entries))])
        .collect();
    publish::channel(
        bed,
        registry,
        FLEET_NAMESPACE,
        CHANNEL,
        "request-model:v1",
        &files,
        &entries,
    )
    .await?;
    let path = changelog_path(FLEET_NAMESPACE, ALLOWED);
    soon("the channel is served", async || {
        Ok((bed.admin_get(&path).await?.0 == StatusCode::OK).then_some(()))
    })
    .await
}
