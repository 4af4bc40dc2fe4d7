//! Delegated authentication and authorization end to end (issue 4), on the real
//! control plane, through the aggregator and straight to our server.
//!
//! Our server runs as the chart's ServiceAccount, bound to nothing but the
//! chart's rendered RBAC (the test bed's default identity), so every check
//! below also proves that RBAC is enough: TokenReview and SubjectAccessReview
//! (`system:auth-delegator`), the authentication ConfigMap
//! (`extension-apiserver-authentication-reader`), the Elemental objects.
//!
//! One test bed for the whole file; the checks run in sequence, while a watch
//! records every state of the APIService to prove it stays Available.

use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiserver::access_log::limiter::{BURST, PER_SECOND};
use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Reference, Severity};
use elemental_changelog_integration::availability::AvailabilityWatch;
use elemental_changelog_integration::fixtures::expect_status;
use elemental_changelog_integration::generated::updates_log;
use elemental_changelog_integration::paths::{self, all_summaries_path, summaries_path};
use elemental_changelog_integration::publish;
use elemental_changelog_integration::rbac::start_clusterrole_aggregation;
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::elemental::{self, VersionEntry};
use elemental_changelog_integration::testbed::{
    APISERVICE_NAME, Ca, CertPair, FLEET_NAMESPACE, FRONT_PROXY_CN, Process, SERVER_NAMESPACE,
    SERVICE_NAME, TestBed, TestBedOptions,
};
use elemental_changelog_integration::timing::Phases;
use elemental_changelog_integration::wait::soon;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Api;
use kube::api::{Patch, PatchParams};
use reqwest::StatusCode;
use serde_json::{Value, json};

const GROUP: &str = "changelog.elemental.cattle.io";
/// A namespace where nobody but admin may read changelogs.
const OTHER_NAMESPACE: &str = "elsewhere";
const CHANNEL: &str = "auth";
const OLD_VERSION: &str = "auth-v1.0.0";
const NEW_VERSION: &str = "auth-v1.1.0";
/// The chart's viewer ClusterRole (`rbac.viewerRoleName`).
const VIEWER_ROLE: &str = "elemental-changelog-viewer";
/// The group the test bed's static-token user `carol` is in.
const CAROL_GROUP: &str = "elemental-viewers";
/// Group of the client-certificate user bound to the viewer role.
const CERT_VIEWERS: &str = "cert-viewers";
const AUTH_CONFIG_MAP: &str = "extension-apiserver-authentication";
const REQUESTHEADER_CA_KEY: &str = "requestheader-client-ca-file";

#[tokio::test]
async fn delegated_authentication_and_authorization() -> Result<()> {
    let phases = Phases::start();
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        // `-v=2`: kube-apiserver logs when it reloads the aggregator's proxy client
        // certificate, which is how the rotation check knows it has.
        apiserver_args: vec!["-v=2".to_owned()],
        namespaces: vec![FLEET_NAMESPACE.to_owned(), OTHER_NAMESPACE.to_owned()],
    })
    .await?;
    phases.mark("control plane ready");
    bed.start_server_reading(&registry, &[]).await?;
    phases.mark("server Available");
    let result = checks(&bed, &registry).await;
    phases.mark("auth checks done");
    bed.finish(result)
}

async fn checks(bed: &TestBed, registry: &Registry) -> Result<()> {
    let availability = AvailabilityWatch::start(bed);
    let mut aggregation = start_clusterrole_aggregation(bed)?;
    let mut phases = Phases::start();

    server_runs_as_the_chart_service_account(bed).await?;
    publish_channel(bed, registry).await?;
    bind_roles(bed).await?;
    phases.done("setup (identity, channel data, role bindings)");

    user_without_role_is_refused(bed).await?;
    phases.done("user without a role");
    viewer_reads_only_where_bound(bed).await?;
    phases.done("viewer role");
    view_aggregation_grants_reading(bed, &mut aggregation).await?;
    phases.done("view aggregation");
    remote_headers_without_front_proxy_certificate_are_ignored(bed).await?;
    front_proxy_certificates(bed).await?;
    client_certificates_authenticate_as_cn_and_o(bed).await?;
    invalid_credentials_are_refused(bed).await?;
    refusals_are_in_the_access_log(bed)?;
    an_anonymous_flood_leaves_the_log_bounded(bed).await?;
    service_account_tokens_are_reviewed(bed).await?;
    metrics_require_authorization(bed).await?;
    phases.done("direct authentication and /metrics");
    front_proxy_ca_rotation(bed).await?;
    phases.done("front-proxy CA rotation");
    // The rotated cluster still works end to end.
    admin_reads_changelog(bed).await?;
    availability.finish(bed).await?;
    aggregation.ensure_running()?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Setup

/// The server's kubeconfig authenticates as the chart's ServiceAccount, which
/// holds no right beyond the chart's RBAC.
async fn server_runs_as_the_chart_service_account(bed: &TestBed) -> Result<()> {
    let kubeconfig = bed.root().join("server/kubeconfig");
    let kubeconfig = kubeconfig.to_string_lossy();
    let whoami: Value = serde_json::from_str(
        &bed.kubectl_ok(&["--kubeconfig", &kubeconfig, "auth", "whoami", "-o", "json"])
            .await?,
    )?;
    let service_account = format!("system:serviceaccount:{SERVER_NAMESPACE}:{SERVICE_NAME}");
    ensure!(
        whoami["status"]["userInfo"]["username"] == service_account.as_str(),
        "the server does not run as {service_account}: {whoami}"
    );
    let can = async |args: &[&str]| -> Result<bool> {
        let mut argv = vec!["--kubeconfig", &*kubeconfig, "auth", "can-i"];
        argv.extend_from_slice(args);
        let out = bed.kubectl(&argv).await?;
        Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
    };
    for granted in [
        &["create", "tokenreviews.authentication.k8s.io"][..],
        &["create", "subjectaccessreviews.authorization.k8s.io"],
        &[
            "get",
            "configmaps/extension-apiserver-authentication",
            "-n",
            "kube-system",
        ],
        &["watch", "managedosversions.elemental.cattle.io", "-A"],
        &["list", "managedosversionchannels.elemental.cattle.io", "-A"],
    ] {
        ensure!(can(granted).await?, "the chart does not grant {granted:?}");
    }
    for refused in [
        &["list", "secrets", "-A"][..],
        &["get", "configmaps", "-n", FLEET_NAMESPACE],
        &["update", "managedosversions.elemental.cattle.io", "-A"],
        &["create", "rolebindings", "-n", FLEET_NAMESPACE],
    ] {
        ensure!(
            !can(refused).await?,
            "the server's identity may {refused:?}: more than the chart grants"
        );
    }
    Ok(())
}

/// A channel image in the registry, the channel and its versions as the
/// operator makes them, and the changelog served once the image is fetched.
async fn publish_channel(bed: &TestBed, registry: &Registry) -> Result<()> {
    let entry = |name: &str, version: &str, created: i64| VersionEntry {
        name: name.to_owned(),
        version: version.to_owned(),
        upgrade_image: format!("registry.example/os:{version}"),
        created: Some(created),
    };
    let entries = [
        entry(OLD_VERSION, "v1.0.0", 1_700_000_000),
        entry(NEW_VERSION, "v1.1.0", 1_710_000_000),
    ];
    let updates = updates_log(&[Advisory {
        type_: "security".to_owned(),
        id: "SUSE-SU-2024:0001-1".to_owned(),
        title: "Security update for openssl".to_owned(),
        severity: Severity::Important,
        issued: Timestamp::from_second(1_705_000_000).ok(),
        references: vec![Reference {
            href: "https://www.suse.com/security/cve/CVE-2024-0001/".to_owned(),
            id: "CVE-2024-0001".to_owned(),
            title: "CVE-2024-0001".to_owned(),
            type_: "cve".to_owned(),
        }],
        description: "This update for openssl fixes CVE-2024-0001.".to_owned(),
        packages: vec![AdvisoryPackage {
            name: "openssl".to_owned(),
            epoch: None,
            version: "3.1.4".to_owned(),
            release: "2.1".to_owned(),
            arch: "x86_64".to_owned(),
        }],
        ..Advisory::default()
    }]);
    let changelog_file = format!("changelogs/{NEW_VERSION}.updates.log");
    publish::channel(
        bed,
        registry,
        FLEET_NAMESPACE,
        CHANNEL,
        "auth-channel:v1",
        &[
            ("channel.json", elemental::channel_json(&entries)),
            (changelog_file.as_str(), updates),
        ],
        &entries,
    )
    .await?;
    admin_reads_changelog(bed).await
}

/// Admin reads the changelog through the aggregator, waiting for the first fetch.
async fn admin_reads_changelog(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE);
    let body = soon(
        "admin reads the changelog through the aggregator",
        async || {
            let (status, body) = bed.admin_get_value(&path).await?;
            Ok((status == StatusCode::OK).then_some(body))
        },
    )
    .await?;
    ensure!(body["kind"] == "ManagedOSVersionChangelog", "{body}");
    ensure!(body["metadata"]["name"] == NEW_VERSION, "{body}");
    Ok(())
}

/// bob: the chart's viewer role in fleet-default; carol's group: `view` in
/// fleet-default; the cert-viewers group: the viewer role in fleet-default;
/// prometheus: `get` on `/metrics`. alice has nothing.
async fn bind_roles(bed: &TestBed) -> Result<()> {
    let manifests = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: bob-changelog-viewer, namespace: {FLEET_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {VIEWER_ROLE}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: viewers-view, namespace: {FLEET_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: {CAROL_GROUP}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: cert-viewers, namespace: {FLEET_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {VIEWER_ROLE}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: {CERT_VIEWERS}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: metrics-reader}}
rules: [{{nonResourceURLs: [/metrics], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: prometheus-metrics-reader}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-reader}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: prometheus}}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: reader, namespace: {FLEET_NAMESPACE}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: service-accounts-changelog-viewer, namespace: {FLEET_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {VIEWER_ROLE}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:serviceaccounts:{FLEET_NAMESPACE}"}}]
"#
    );
    bed.kubectl_stdin(&["apply", "-f", "-"], &manifests)
        .await
        .context("binding the test users")?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Authorization

/// alice has no role: kube-apiserver refuses her before proxying, and our
/// server refuses her bearer token with the same words.
async fn user_without_role_is_refused(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE);
    let out = bed.kubectl_as("alice", &["get", "--raw", &path]).await?;
    ensure!(!out.status.success(), "alice read {path}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("Forbidden"), "kubectl as alice: {stderr}");

    // kube-apiserver's own 403, for the wording.
    let theirs = bed
        .apiserver_http(None)?
        .get(format!("{}{path}", bed.apiserver_url()))
        .bearer_auth(bed.token("alice")?)
        .send()
        .await?;
    ensure!(
        theirs.status() == StatusCode::FORBIDDEN,
        "{}",
        theirs.status()
    );
    let theirs: Value = theirs.json().await?;

    let (status, ours) = direct(bed, None, &path, Some(bed.token("alice")?), &[]).await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "alice direct: {status} {ours}"
    );
    expect_status(&ours, 403, "Forbidden")?;
    let message = ours["message"].as_str().unwrap_or_default();
    let expected = format!(
        "User \"alice\" cannot get resource \"managedosversions/changelog\" in API group \
         \"{GROUP}\" in the namespace \"{FLEET_NAMESPACE}\""
    );
    ensure!(message.contains(&expected), "our message: {message}");
    ensure!(
        ours["message"] == theirs["message"],
        "our 403 message differs from kube-apiserver's:\n ours:   {}\n theirs: {}",
        ours["message"],
        theirs["message"]
    );
    ensure!(ours["details"] == theirs["details"], "{ours} vs {theirs}");

    // A collection GET is `list`.
    let list = summaries_path(FLEET_NAMESPACE);
    let (status, body) = direct(bed, None, &list, Some(bed.token("alice")?), &[]).await?;
    ensure!(status == StatusCode::FORBIDDEN, "{status} {body}");
    ensure!(
        message_of(&body).contains("User \"alice\" cannot list resource \"managedosversions\""),
        "{body}"
    );
    Ok(())
}

/// bob, bound to the chart's viewer role in fleet-default, reads changelogs and
/// summaries there with kubectl, and nowhere else.
async fn viewer_reads_only_where_bound(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE);
    let changelog = soon("bob reads the changelog", async || {
        let out = bed.kubectl_as("bob", &["get", "--raw", &path]).await?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned()))
    })
    .await?;
    let changelog: Value = serde_json::from_str(&changelog)?;
    ensure!(
        changelog["kind"] == "ManagedOSVersionChangelog",
        "{changelog}"
    );
    ensure!(
        changelog["advisories"][0]["id"] == "SUSE-SU-2024:0001-1",
        "{changelog}"
    );

    let summaries = kubectl_as_ok(
        bed,
        "bob",
        &[
            "get",
            "managedosversions.changelog.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
            "-o",
            "json",
        ],
    )
    .await?;
    let summaries: Value = serde_json::from_str(&summaries)?;
    let names: Vec<&str> = summaries["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["metadata"]["name"].as_str())
        .collect();
    ensure!(names == [OLD_VERSION, NEW_VERSION], "{summaries}");
    let table = kubectl_as_ok(
        bed,
        "bob",
        &[
            "get",
            "managedosversions.changelog.elemental.cattle.io",
            NEW_VERSION,
            "-n",
            FLEET_NAMESPACE,
        ],
    )
    .await?;
    ensure!(table.contains(NEW_VERSION), "{table}");

    // Elsewhere: kube-apiserver's 403 through the aggregator, ours directly.
    for args in [
        &["get", "--raw", &changelog_path(OTHER_NAMESPACE)][..],
        &[
            "get",
            "managedosversions.changelog.elemental.cattle.io",
            "-n",
            OTHER_NAMESPACE,
        ],
        &[
            "get",
            "managedosversions.changelog.elemental.cattle.io",
            "-A",
        ],
    ] {
        let out = bed.kubectl_as("bob", args).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains("Forbidden"),
            "bob: kubectl {args:?}: {stderr}"
        );
    }
    let token = bed.token("bob")?;
    let (status, body) = direct(
        bed,
        None,
        &changelog_path(OTHER_NAMESPACE),
        Some(token),
        &[],
    )
    .await?;
    ensure!(status == StatusCode::FORBIDDEN, "{status} {body}");
    ensure!(
        message_of(&body).contains(&format!(
            "User \"bob\" cannot get resource \"managedosversions/changelog\" in API group \
             \"{GROUP}\" in the namespace \"{OTHER_NAMESPACE}\""
        )),
        "{body}"
    );
    let (status, body) = direct(
        bed,
        None,
        &changelog_path(FLEET_NAMESPACE),
        Some(token),
        &[],
    )
    .await?;
    ensure!(status == StatusCode::OK, "bob direct: {status} {body}");
    // Cluster-wide list: only namespace-scoped rights, so refused.
    let (status, body) = direct(bed, None, &all_summaries_path(), Some(token), &[]).await?;
    ensure!(status == StatusCode::FORBIDDEN, "{status} {body}");
    ensure!(message_of(&body).contains("at the cluster scope"), "{body}");
    Ok(())
}

/// carol's group is bound to the built-in `view`, which carries our rules only
/// through the chart viewer role's `aggregate-to-view` label and
/// kube-controller-manager's clusterrole-aggregation controller.
async fn view_aggregation_grants_reading(bed: &TestBed, aggregation: &mut Process) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(bed.client());
    soon("our rules aggregated into view", async || {
        aggregation.ensure_running()?;
        let view = roles.get("view").await?;
        Ok(view
            .rules
            .unwrap_or_default()
            .iter()
            .any(|rule| {
                rule.api_groups
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|g| g == GROUP)
                    && rule
                        .resources
                        .as_deref()
                        .unwrap_or_default()
                        .iter()
                        .any(|r| r == "managedosversions/changelog")
            })
            .then_some(()))
    })
    .await?;
    let path = changelog_path(FLEET_NAMESPACE);
    let changelog = soon("carol reads the changelog through view", async || {
        let out = bed.kubectl_as("carol", &["get", "--raw", &path]).await?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned()))
    })
    .await?;
    ensure!(
        changelog.contains("ManagedOSVersionChangelog"),
        "{changelog}"
    );
    let out = bed
        .kubectl_as("carol", &["get", "--raw", &changelog_path(OTHER_NAMESPACE)])
        .await?;
    ensure!(!out.status.success(), "carol read {OTHER_NAMESPACE}");
    Ok(())
}

// ---------------------------------------------------------------------------
// Authentication, straight to our server

/// `X-Remote-*` headers count only with a front-proxy certificate: without
/// one the request is anonymous (or whoever the other credentials name).
async fn remote_headers_without_front_proxy_certificate_are_ignored(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE);
    let impersonation = [
        ("X-Remote-User", "admin"),
        ("X-Remote-Group", "system:masters"),
    ];

    let (status, body) = direct(bed, None, &path, None, &impersonation).await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "no certificate: {status} {body}"
    );
    ensure!(
        message_of(&body).contains("User \"system:anonymous\""),
        "{body}"
    );

    let dave = bed.pki().client_ca.issue_client("dave", &[])?;
    let (status, body) = direct(bed, Some(&dave), &path, None, &impersonation).await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "client certificate: {status} {body}"
    );
    ensure!(message_of(&body).contains("User \"dave\""), "{body}");

    let alice = bed.token("alice")?;
    let (status, body) = direct(bed, None, &path, Some(alice), &impersonation).await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "bearer token: {status} {body}"
    );
    ensure!(message_of(&body).contains("User \"alice\""), "{body}");
    Ok(())
}

/// The front-proxy certificate makes the headers count; one whose CN is not
/// allowed, or from another CA, is a 401, never anonymous.
async fn front_proxy_certificates(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE);
    let front_proxy = &bed.pki().front_proxy_client;
    let (status, body) = direct(
        bed,
        Some(front_proxy),
        &path,
        None,
        &[("X-Remote-User", "alice")],
    )
    .await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "front proxy as alice: {status} {body}"
    );
    ensure!(message_of(&body).contains("User \"alice\""), "{body}");
    // Groups and extras (percent-encoded key) travel into the review.
    let as_bob = [
        ("X-Remote-User", "bob"),
        ("X-Remote-Group", "team-a"),
        ("X-Remote-Group", "team-b"),
        ("X-Remote-Extra-Acme.com%2fProject", "blue"),
    ];
    let (status, body) = direct(bed, Some(front_proxy), &path, None, &as_bob).await?;
    ensure!(
        status == StatusCode::OK,
        "front proxy as bob: {status} {body}"
    );

    let masters = [
        ("X-Remote-User", "admin"),
        ("X-Remote-Group", "system:masters"),
    ];
    let not_allowed = bed
        .pki()
        .front_proxy_ca
        .issue_client("not-the-front-proxy", &[])?;
    let (status, body) = direct(bed, Some(&not_allowed), &path, None, &masters).await?;
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "CN not allowed: {status} {body}"
    );
    expect_status(&body, 401, "Unauthorized")?;
    // Even without headers: the certificate is not trusted, so no anonymous fallback.
    let (status, body) = direct(bed, Some(&not_allowed), "/livez", None, &[]).await?;
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "CN not allowed, /livez: {status} {body}"
    );

    let rogue = Ca::new("rogue-front-proxy-ca")?.issue_client(FRONT_PROXY_CN, &[])?;
    let (status, body) = direct(bed, Some(&rogue), &path, None, &masters).await?;
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "rogue CA: {status} {body}"
    );
    Ok(())
}

/// A client certificate of `client-ca-file` is user CN in groups O.
async fn client_certificates_authenticate_as_cn_and_o(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE);
    let erin = bed.pki().client_ca.issue_client("erin", &[CERT_VIEWERS])?;
    let (status, body) = direct(bed, Some(&erin), &path, None, &[]).await?;
    ensure!(
        status == StatusCode::OK,
        "erin in {CERT_VIEWERS}: {status} {body}"
    );
    ensure!(body["kind"] == "ManagedOSVersionChangelog", "{body}");
    let (status, body) = direct(
        bed,
        Some(&erin),
        &changelog_path(OTHER_NAMESPACE),
        None,
        &[],
    )
    .await?;
    ensure!(status == StatusCode::FORBIDDEN, "{status} {body}");
    ensure!(message_of(&body).contains("User \"erin\""), "{body}");

    let frank = bed
        .pki()
        .client_ca
        .issue_client("frank", &["other-group"])?;
    let (status, body) = direct(bed, Some(&frank), &path, None, &[]).await?;
    ensure!(status == StatusCode::FORBIDDEN, "frank: {status} {body}");
    ensure!(message_of(&body).contains("User \"frank\""), "{body}");

    // The test bed's admin is in system:masters: no review at all.
    let (status, body) = direct(bed, Some(&bed.pki().admin), &path, None, &[]).await?;
    ensure!(status == StatusCode::OK, "admin: {status} {body}");
    Ok(())
}

/// A ServiceAccount token (TokenReview) is the ServiceAccount in its groups,
/// with its extras passed on to the review; `?watch` asks for `watch`.
async fn service_account_tokens_are_reviewed(bed: &TestBed) -> Result<()> {
    let token = bed
        .kubectl_ok(&["create", "token", "reader", "-n", FLEET_NAMESPACE])
        .await?;
    let token = token.trim();
    let (status, body) = direct(
        bed,
        None,
        &changelog_path(FLEET_NAMESPACE),
        Some(token),
        &[],
    )
    .await?;
    ensure!(status == StatusCode::OK, "reader: {status} {body}");
    let (status, body) = direct(
        bed,
        None,
        &changelog_path(OTHER_NAMESPACE),
        Some(token),
        &[],
    )
    .await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "reader elsewhere: {status} {body}"
    );
    ensure!(
        message_of(&body).contains(&format!(
            "User \"system:serviceaccount:{FLEET_NAMESPACE}:reader\" cannot get resource"
        )),
        "{body}"
    );
    // `?watch` asks for `watch`: the viewer role grants it here (the stream ends after its
    // timeoutSeconds), and nothing elsewhere, where the refusal names the verb.
    let watch = format!(
        "{}?watch=true&timeoutSeconds=1",
        summaries_path(FLEET_NAMESPACE)
    );
    let (status, body) = direct(bed, None, &watch, Some(token), &[]).await?;
    ensure!(status == StatusCode::OK, "reader watch: {status} {body}");
    let watch = format!("{}?watch=true", summaries_path(OTHER_NAMESPACE));
    let (status, body) = direct(bed, None, &watch, Some(token), &[]).await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "reader watch elsewhere: {status} {body}"
    );
    ensure!(
        message_of(&body).contains("cannot watch resource \"managedosversions\""),
        "{body}"
    );
    Ok(())
}

/// Credentials that fail are a 401, never anonymous.
async fn invalid_credentials_are_refused(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE);
    let (status, body) = direct(bed, None, &path, Some("not-a-token"), &[]).await?;
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "bad token: {status} {body}"
    );
    expect_status(&body, 401, "Unauthorized")?;
    let rogue = Ca::new("rogue-client-ca")?.issue_client("admin", &["system:masters"])?;
    let (status, body) = direct(bed, Some(&rogue), &path, None, &[]).await?;
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "rogue client CA: {status} {body}"
    );
    Ok(())
}

/// The refusals above on this server's own port, which kube-apiserver's audit log never sees,
/// are each one `access` line of the server's log (`--access-log`, default `refusals`): who,
/// what, the code, not through the front proxy. Answers that are not refusals are not logged
/// by default.
fn refusals_are_in_the_access_log(bed: &TestBed) -> Result<()> {
    let log = std::fs::read_to_string(bed.server_log()?)?;
    let access: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("access_log: access "))
        .collect();
    let path = changelog_path(FLEET_NAMESPACE);
    let logged = |fields: &[&str]| {
        access
            .iter()
            .any(|line| fields.iter().all(|f| line.contains(f)))
    };
    let forbidden = [
        "user=alice",
        "verb=\"get\"",
        &format!("path=\"{path}\""),
        "code=403",
        "proxied=false",
        "groups=",
        "bytes=",
        "micros=",
    ];
    ensure!(
        logged(&forbidden),
        "alice's direct 403 is not in the access log ({forbidden:?}):\n{}",
        access.join("\n")
    );
    ensure!(
        !access
            .iter()
            .any(|line| line.contains("user=alice groups=0 ")),
        "an authenticated user is in no group:\n{}",
        access.join("\n")
    );
    let unauthorized = ["user= ", &format!("path=\"{path}\""), "code=401"];
    ensure!(
        logged(&unauthorized),
        "the bad token's 401 is not in the access log:\n{}",
        access.join("\n")
    );
    ensure!(
        access
            .iter()
            .all(|line| ["code=401", "code=403", "code=429"]
                .iter()
                .any(|code| line.contains(code))),
        "only refusals are logged by default:\n{}",
        access.join("\n")
    );
    Ok(())
}

/// How long the anonymous flood lasts.
const FLOOD: std::time::Duration = std::time::Duration::from_secs(5);
/// Clients of the flood, each sending one request after the other.
const FLOODERS: usize = 16;
/// The flood's path: longer than the access log writes.
const FLOOD_PATH_BYTES: usize = 8_000;

/// Issue 32: anonymous requests on the server's own port as fast as 16 clients can send
/// them for 5 s, each a 403 after a SubjectAccessReview with an 8,000-byte path: the access
/// log writes what is left of that source's burst, then one line a second, each path cut to 256
/// bytes; the rest is told in a summary line. The log's growth per second is printed (the
/// figure in docs/reliability.md) and bounded: without the rate limit it is megabytes.
async fn an_anonymous_flood_leaves_the_log_bounded(bed: &TestBed) -> Result<()> {
    let log_path = bed.server_log()?;
    let before = std::fs::metadata(&log_path)?.len();
    let path = format!("/apis/{}", "a".repeat(FLOOD_PATH_BYTES - 6));
    let url = format!("{}{path}", bed.server_url()?);
    let http = bed.server_http(None)?;
    let started = std::time::Instant::now();
    let flooders = (0..FLOODERS).map(|_| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let mut sent = 0u64;
            while started.elapsed() < FLOOD {
                let response = http.get(&url).send().await?;
                ensure!(response.status() == 403, "anonymous: {}", response.status());
                sent += 1;
            }
            anyhow::Ok(sent)
        })
    });
    let mut sent = 0;
    for flooder in futures::future::join_all(flooders).await {
        sent += flooder??;
    }
    let took = started.elapsed();
    let grown = std::fs::metadata(&log_path)?.len() - before;
    let log = std::fs::read_to_string(&log_path)?;
    let cut_mark = format!("…({FLOOD_PATH_BYTES} bytes)");
    let lines = log.lines().filter(|l| l.contains(&cut_mark)).count();
    let seconds = took.as_secs_f64();
    eprintln!(
        "anonymous flood: {sent} requests in {seconds:.1} s ({:.0}/s), {lines} access lines, \
         log grew {grown} bytes ({:.0} bytes/s)",
        sent as f64 / seconds,
        grown as f64 / seconds
    );
    // The limiter's burst and its lines a second, rounded up.
    let allowed = (BURST + PER_SECOND * (took.as_secs() as u32 + 1)) as usize;
    ensure!(
        lines <= allowed && lines > 0,
        "{lines} access lines for {sent} refusals in {took:?} (at most {allowed})"
    );
    ensure!(
        grown < 64 << 10,
        "the log grew {grown} bytes in {took:?} for {sent} refusals"
    );
    ensure!(
        log.lines()
            .filter(|l| l.contains(&cut_mark))
            .all(|l| l.len() < 1024 && l.contains(&format!("path=\"/apis/{}", "a".repeat(250)))),
        "an access line was not cut"
    );
    let summary = soon("the summary of the refusals left out", async || {
        let log = std::fs::read_to_string(&log_path)?;
        Ok(log
            .lines()
            .find(|l| l.contains("more refusals from 127.0.0.1"))
            .map(str::to_owned))
    })
    .await?;
    eprintln!("summary: {summary}");
    Ok(())
}

/// `/metrics` is a non-resource path reviewed like any other; health is not.
async fn metrics_require_authorization(bed: &TestBed) -> Result<()> {
    let (status, body) = direct(bed, None, "/metrics", Some(bed.token("alice")?), &[]).await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "alice /metrics: {status} {body}"
    );
    ensure!(
        message_of(&body) == "forbidden: User \"alice\" cannot get path \"/metrics\"",
        "{body}"
    );
    let (status, body) = direct(bed, None, "/metrics", None, &[]).await?;
    ensure!(
        status == StatusCode::FORBIDDEN,
        "anonymous /metrics: {status} {body}"
    );

    let prometheus = bed.pki().client_ca.issue_client("prometheus", &[])?;
    let response = bed
        .server_http(Some(&prometheus))?
        .get(format!("{}/metrics", bed.server_url()?))
        .send()
        .await?;
    ensure!(
        response.status() == StatusCode::OK,
        "prometheus /metrics: {}",
        response.status()
    );
    let text = response.text().await?;
    ensure!(text.contains("# TYPE"), "not Prometheus text: {text}");

    for path in ["/livez", "/readyz", "/healthz"] {
        let (status, body) = direct(bed, None, path, None, &[]).await?;
        ensure!(
            status == StatusCode::OK,
            "anonymous {path}: {status} {body}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// CA rotation

/// Rotates the front-proxy CA the way a cluster does, without restarting our
/// server, while the aggregator keeps proxying:
///
/// 1. the ConfigMap trusts the old and the new CA: a certificate of the new CA
///    is accepted;
/// 2. kube-apiserver switches its proxy client certificate and its own
///    requestheader CA to the new ones (files it reloads);
/// 3. the ConfigMap trusts only the new CA: the old front-proxy certificate
///    gets 401, the new one works, and so does the aggregator.
///
/// kube-apiserver merges its own CA back into the ConfigMap every minute, so
/// it must have switched its file before the old CA can leave the ConfigMap.
async fn front_proxy_ca_rotation(bed: &TestBed) -> Result<()> {
    let new_ca = Ca::new("testbed-front-proxy-ca-2")?;
    let new_proxy = new_ca.issue_client(FRONT_PROXY_CN, &[])?;
    let old_proxy = bed.pki().front_proxy_client.clone();
    let old_ca = bed.pki().front_proxy_ca.cert_pem();
    let masters = [
        ("X-Remote-User", "rotation"),
        ("X-Remote-Group", "system:masters"),
    ];
    let path = summaries_path(FLEET_NAMESPACE);

    let (status, body) = direct(bed, Some(&new_proxy), &path, None, &masters).await?;
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "new CA before rotation: {status} {body}"
    );
    let server_pid = bed.server().and_then(|s| s.process().pid());

    // 1. Both CAs.
    set_requestheader_ca(bed, &format!("{old_ca}{}", new_ca.cert_pem())).await?;
    soon("a certificate of the new CA accepted", async || {
        let (status, _) = direct(bed, Some(&new_proxy), &path, None, &masters).await?;
        Ok((status == StatusCode::OK).then_some(()))
    })
    .await?;
    let (status, body) = direct(bed, Some(&old_proxy), &path, None, &masters).await?;
    ensure!(
        status == StatusCode::OK,
        "old CA during rotation: {status} {body}"
    );

    // 2. kube-apiserver's side.
    let pki = bed.root().join("pki");
    let reloads = || {
        count_in_log(
            bed,
            "Loaded a new cert/key pair",
            "name=\"aggregator-proxy-cert::",
        )
    };
    let before = reloads()?;
    replace_file(&pki.join("front-proxy-client.key"), &new_proxy.key_pem)?;
    replace_file(&pki.join("front-proxy-client.crt"), &new_proxy.cert_pem)?;
    replace_file(&pki.join("front-proxy-ca.crt"), &new_ca.cert_pem())?;
    soon(
        "kube-apiserver reloads its proxy client certificate",
        async || Ok((reloads()? > before).then_some(())),
    )
    .await?;
    let whoami = format!(
        "{}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        bed.apiserver_url()
    );
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let old_at_apiserver = bed.apiserver_http(Some(&old_proxy))?;
    soon(
        "kube-apiserver stops trusting the old front-proxy CA",
        async || {
            let response = old_at_apiserver
                .post(&whoami)
                .header("X-Remote-User", "rotation")
                .json(&review)
                .send()
                .await?;
            Ok((response.status() == StatusCode::UNAUTHORIZED).then_some(()))
        },
    )
    .await?;

    // 3. Only the new CA.
    set_requestheader_ca(bed, &new_ca.cert_pem()).await?;
    soon("the old front-proxy certificate refused", async || {
        let (status, _) = direct(bed, Some(&old_proxy), &path, None, &masters).await?;
        Ok((status == StatusCode::UNAUTHORIZED).then_some(()))
    })
    .await?;
    let (status, body) = direct(bed, Some(&new_proxy), &path, None, &masters).await?;
    ensure!(
        status == StatusCode::OK,
        "new CA after rotation: {status} {body}"
    );
    let (status, body) = direct(bed, Some(&old_proxy), "/livez", None, &[]).await?;
    ensure!(
        status == StatusCode::UNAUTHORIZED,
        "old CA, /livez: {status} {body}"
    );

    // The aggregator now proxies with the new certificate: for bob, and for its
    // own availability check, which a change of the APIService triggers.
    let out = kubectl_as_ok(
        bed,
        "bob",
        &["get", "--raw", &changelog_path(FLEET_NAMESPACE)],
    )
    .await?;
    ensure!(out.contains("ManagedOSVersionChangelog"), "{out}");
    let (checks_before, refused_before) = discovery_answers(bed).await?;
    let touch = json!({"metadata": {"annotations": {"testbed/rotated": "true"}}});
    Api::<APIService>::all(bed.client())
        .patch(
            APISERVICE_NAME,
            &PatchParams::default(),
            &Patch::Merge(&touch),
        )
        .await?;
    soon("the aggregator's availability check answered", async || {
        let (checks, _) = discovery_answers(bed).await?;
        Ok((checks > checks_before).then_some(()))
    })
    .await?;
    let (_, refused) = discovery_answers(bed).await?;
    ensure!(
        refused == refused_before,
        "discovery requests refused during the rotation"
    );
    ensure!(
        bed.server().and_then(|s| s.process().pid()) == server_pid,
        "our server was restarted"
    );
    let server_log = bed
        .server()
        .context("our server stopped")?
        .process()
        .tail(64 * 1024);
    ensure!(
        !server_log.contains("panicked"),
        "our server panicked:\n{server_log}"
    );
    // kube-apiserver's once-a-minute merge must not bring the old CA back.
    let data = auth_config_map(bed).await?.data.unwrap_or_default();
    ensure!(
        data.get(REQUESTHEADER_CA_KEY) == Some(&new_ca.cert_pem()),
        "the ConfigMap's requestheader CA changed behind the test"
    );
    Ok(())
}

/// Our server's count of discovery requests answered 200, and refused (401, 403).
async fn discovery_answers(bed: &TestBed) -> Result<(u64, u64)> {
    let (status, body) = direct(bed, Some(&bed.pki().admin), "/metrics", None, &[]).await?;
    ensure!(status == StatusCode::OK, "admin /metrics: {status}");
    let text = body.as_str().context("/metrics is not text")?;
    let (mut ok, mut refused) = (0, 0);
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("elemental_changelog_http_requests_total{") else {
            continue;
        };
        if !labels.contains("resource=\"discovery\"") {
            continue;
        }
        let count: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("a metric line without a count: {line}"))?;
        if labels.contains("code=\"200\"") {
            ok += count;
        } else if labels.contains("code=\"401\"") || labels.contains("code=\"403\"") {
            refused += count;
        }
    }
    Ok((ok, refused))
}

async fn auth_config_map(bed: &TestBed) -> Result<ConfigMap> {
    Ok(Api::<ConfigMap>::namespaced(bed.client(), "kube-system")
        .get(AUTH_CONFIG_MAP)
        .await?)
}

async fn set_requestheader_ca(bed: &TestBed, pem: &str) -> Result<()> {
    let patch = json!({"data": {REQUESTHEADER_CA_KEY: pem}});
    Api::<ConfigMap>::namespaced(bed.client(), "kube-system")
        .patch(
            AUTH_CONFIG_MAP,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .context("patching the authentication ConfigMap")?;
    Ok(())
}

/// Replaces `path` atomically (write aside, rename), as a certificate manager does.
fn replace_file(path: &Path, contents: &str) -> Result<()> {
    let aside = path.with_extension("new");
    std::fs::write(&aside, contents).with_context(|| format!("writing {}", aside.display()))?;
    std::fs::rename(&aside, path).with_context(|| format!("replacing {}", path.display()))
}

/// Lines of kube-apiserver's log holding both `message` and `detail`.
fn count_in_log(bed: &TestBed, message: &str, detail: &str) -> Result<usize> {
    let log = bed.root().join("logs/kube-apiserver.log");
    let text =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    Ok(text
        .lines()
        .filter(|line| line.contains(message) && line.contains(detail))
        .count())
}

// ---------------------------------------------------------------------------
// Availability and the aggregation controller

// ---------------------------------------------------------------------------
// Helpers

/// The changelog of [`NEW_VERSION`] in `namespace`.
fn changelog_path(namespace: &str) -> String {
    paths::changelog_path(namespace, NEW_VERSION)
}

/// GET `path` straight from our server, presenting `identity` and `token` if
/// given, with extra `headers`; the status and the body (JSON, or a string).
async fn direct(
    bed: &TestBed,
    identity: Option<&CertPair>,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, Value)> {
    let mut request = bed
        .server_http(identity)?
        .get(format!("{}{path}", bed.server_url()?));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = response.status();
    let text = response.text().await?;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, body))
}

fn message_of(status: &Value) -> &str {
    status["message"].as_str().unwrap_or_default()
}

async fn kubectl_as_ok(bed: &TestBed, user: &str, args: &[&str]) -> Result<String> {
    let out = bed.kubectl_as(user, args).await?;
    ensure!(
        out.status.success(),
        "kubectl as {user} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
