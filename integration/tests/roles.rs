//! Roles people already have read changelogs (issue 12), end to end on the
//! real control plane: the chart's viewer ClusterRole is aggregated into the
//! built-in `view`, `edit` and `admin` (by kube-controller-manager's
//! clusterrole-aggregation controller), so a user bound only to one of those
//! reads a changelog and the summaries through the aggregator, while a user
//! bound to none of them, or bound elsewhere, or no longer bound, gets 403.
//!
//! The fleet view's machine data is not theirs (issue 26): with the chart's
//! default values a `view` user of the namespace gets 403 on machines; once
//! the chart is rendered with `rbac.fleetView.aggregateTo={view}`, 200.
//!
//! Our server runs as the chart's ServiceAccount with the chart's RBAC (the
//! test bed's default), rendered with the chart's default values.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiservice::types::ManagedOSVersionChangelog;
use elemental_changelog_integration::generated::{Channel, Spec};
use elemental_changelog_integration::paths::{all_summaries_path, changelog_path};
use elemental_changelog_integration::publish;
use elemental_changelog_integration::rbac::start_clusterrole_aggregation;
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::{FLEET_NAMESPACE, Process, TestBed, TestBedOptions};
use elemental_changelog_integration::timing::Phases;
use elemental_changelog_integration::wait::{POLL, SOON, poll};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use reqwest::StatusCode;
use serde_json::Value;

const GROUP: &str = "changelog.elemental.cattle.io";
const RESOURCE: &str = "managedosversions.changelog.elemental.cattle.io";
/// A namespace where none of the users is bound.
const OTHER_NAMESPACE: &str = "elsewhere";

/// Who is bound to which built-in role in [`FLEET_NAMESPACE`], and how.
const BINDINGS: [(&str, &str, &str); 3] = [
    // (RoleBinding subject kind, subject name, ClusterRole)
    ("User", "alice", "view"),
    ("User", "bob", "edit"),
    // carol is in the group elemental-viewers.
    ("Group", "elemental-viewers", "admin"),
];

#[tokio::test]
async fn view_edit_and_admin_read_changelogs() -> Result<()> {
    let phases = Phases::start();
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), OTHER_NAMESPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    bed.start_server_reading(&registry, &["--architecture", "x86_64"])
        .await?;
    let result = checks(&bed, &registry).await;
    phases.mark("role checks done");
    bed.finish(result)
}

async fn checks(bed: &TestBed, registry: &Registry) -> Result<()> {
    let mut aggregation = start_clusterrole_aggregation(bed)?;
    let channel = Channel::generate(&Spec::new("roles", 4, 60, 12));
    publish::generated_channel(bed, registry, FLEET_NAMESPACE, &channel).await?;
    let newest = channel.versions.len() - 1;
    let name = &channel.versions[newest].name;
    let path = changelog_path(FLEET_NAMESPACE, name);
    let expected = channel.expected_advisories(newest - 1, newest);

    // Nobody is bound yet: refused by kube-apiserver before our server.
    for user in ["alice", "bob", "carol"] {
        refused(bed, user, &path, "get", "managedosversions/changelog").await?;
    }

    let took = aggregated(bed, &mut aggregation).await?;
    eprintln!("our rules aggregated into view, edit and admin after {took:?}");
    bind(bed).await?;
    for (user, role) in [("alice", "view"), ("bob", "edit"), ("carol", "admin")] {
        let (served, took) = poll(
            &format!("{user} ({role}) reads {path}"),
            SOON,
            POLL,
            || async {
                let out = bed.kubectl_as(user, &["get", "--raw", &path]).await?;
                Ok(out.status.success().then_some(out.stdout))
            },
        )
        .await?;
        let served: ManagedOSVersionChangelog =
            serde_json::from_slice(&served).context("not a changelog")?;
        let got = served
            .advisories
            .iter()
            .map(|a| a.id.clone())
            .collect::<std::collections::BTreeSet<_>>();
        ensure!(
            got == expected,
            "{user}: advisories {got:?}, want {expected:?}"
        );
        ensure!(served.metadata.name == *name);
        // The summaries too, as kubectl lists them.
        let out = bed
            .kubectl_as(
                user,
                &["get", RESOURCE, "-n", FLEET_NAMESPACE, "-o", "json"],
            )
            .await?;
        ensure!(
            out.status.success(),
            "{user} cannot list summaries: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout)?;
        let names: Vec<&str> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect();
        ensure!(
            names.len() == channel.versions.len()
                && channel
                    .versions
                    .iter()
                    .all(|v| names.contains(&v.name.as_str())),
            "{user} ({role}) lists {names:?}"
        );
        eprintln!("  {user} ({role}) reads after {took:?}");

        // Bound in one namespace only: refused elsewhere.
        let elsewhere = changelog_path(OTHER_NAMESPACE, name);
        refused(bed, user, &elsewhere, "get", "managedosversions/changelog").await?;
        let cluster_wide = all_summaries_path();
        refused(bed, user, &cluster_wide, "list", "managedosversions").await?;
    }

    fleet_view_only_with_the_opt_in(bed, &mut aggregation).await?;

    // A user with no role at all (a client certificate of a new name).
    let dave = bed.pki().client_ca.issue_client("dave", &["dave-team"])?;
    let http = bed.apiserver_http(Some(&dave))?;
    let response = http
        .get(format!("{}{path}", bed.apiserver_url()))
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await?;
    ensure!(
        status == StatusCode::FORBIDDEN && body["reason"] == "Forbidden",
        "dave: {status} {body}"
    );
    ensure!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains(r#"User "dave""#)),
        "{body}"
    );

    // Unbound again: refused again.
    bed.kubectl_ok(&[
        "delete",
        "rolebinding",
        "changelog-readers-view",
        "-n",
        FLEET_NAMESPACE,
    ])
    .await?;
    poll("alice refused once unbound", SOON, POLL, || async {
        let out = bed.kubectl_as("alice", &["get", "--raw", &path]).await?;
        Ok(
            (!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("(Forbidden)"))
                .then_some(()),
        )
    })
    .await?;
    aggregation.ensure_running()
}

/// Waits until `view`, `edit` and `admin` each carry our rules; returns how long it took.
async fn aggregated(bed: &TestBed, aggregation: &mut Process) -> Result<Duration> {
    let roles: Api<ClusterRole> = Api::all(bed.client());
    let result = poll(
        "our rules aggregated into view, edit and admin",
        SOON,
        POLL,
        || async {
            for role in ["view", "edit", "admin"] {
                let rules = roles.get(role).await?.rules.unwrap_or_default();
                let has = |resource: &str, verb: &str| {
                    rules.iter().any(|r| {
                        r.api_groups.iter().flatten().any(|g| g == GROUP)
                            && r.resources.iter().flatten().any(|x| x == resource)
                            && r.verbs.iter().any(|v| v == verb)
                    })
                };
                if !(has("managedosversions/changelog", "get")
                    && has("managedosversions", "get")
                    && has("managedosversions", "list"))
                {
                    return Ok(None);
                }
                for (resource, verb) in FLEET_VIEW {
                    ensure!(
                        !has(resource, verb),
                        "{role} grants {verb} on {resource} with the chart's default values"
                    );
                }
            }
            Ok(Some(()))
        },
    )
    .await;
    // A dead controller explains a timeout best.
    aggregation.ensure_running()?;
    Ok(result?.1)
}

/// What the fleet view's ClusterRoles grant in our group.
const FLEET_VIEW: [(&str, &str); 4] = [
    ("machineinventories", "get"),
    ("machineinventories", "list"),
    ("machineinventories/changelog", "get"),
    ("managedosimages/changelog", "get"),
];

/// alice holds `view` in [`FLEET_NAMESPACE`]: with the chart's default values kube-apiserver
/// refuses her the machines; with the chart's RBAC rendered with
/// `rbac.fleetView.aggregateTo={view}` she lists them; back to the defaults, refused again.
async fn fleet_view_only_with_the_opt_in(bed: &TestBed, aggregation: &mut Process) -> Result<()> {
    let machines = format!("/apis/{GROUP}/v1beta1/namespaces/{FLEET_NAMESPACE}/machineinventories");
    refused(bed, "alice", &machines, "list", "machineinventories").await?;
    refused(
        bed,
        "alice",
        &format!("{machines}/m1/changelog"),
        "get",
        "machineinventories/changelog",
    )
    .await?;

    bed.apply_chart_rbac(&["rbac.fleetView.aggregateTo={view}"])
        .await?;
    let listed = poll(
        "alice (view) lists machines after the opt-in",
        SOON,
        POLL,
        || async {
            let out = bed
                .kubectl_as("alice", &["get", "--raw", &machines])
                .await?;
            Ok(out.status.success().then_some(out.stdout))
        },
    )
    .await;
    // A dead controller explains a timeout best.
    aggregation.ensure_running()?;
    let (list, took) = listed?;
    let list: Value = serde_json::from_slice(&list)?;
    ensure!(
        list["kind"] == elemental_changelog_apiservice::MACHINE_SUMMARY_LIST_KIND,
        "alice's machines: {list}"
    );
    eprintln!("  alice (view) lists machines {took:?} after rbac.fleetView.aggregateTo={{view}}");

    bed.apply_chart_rbac(&[]).await?;
    poll(
        "alice refused machines with the defaults again",
        SOON,
        POLL,
        || async {
            let out = bed
                .kubectl_as("alice", &["get", "--raw", &machines])
                .await?;
            Ok((!out.status.success()).then_some(()))
        },
    )
    .await?;
    refused(bed, "alice", &machines, "list", "machineinventories").await
}

/// Binds each subject of [`BINDINGS`] to its built-in ClusterRole in
/// [`FLEET_NAMESPACE`] only, with RoleBindings `changelog-readers-<role>`.
async fn bind(bed: &TestBed) -> Result<()> {
    let mut manifests = String::new();
    for (kind, name, role) in BINDINGS {
        manifests.push_str(&format!(
            r#"---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: changelog-readers-{role}
  namespace: {FLEET_NAMESPACE}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {role}
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: {kind}
    name: {name}
"#
        ));
    }
    bed.kubectl_stdin(&["apply", "-f", "-"], &manifests).await?;
    Ok(())
}

/// `user` gets kube-apiserver's 403 for `path`, printed by kubectl as
/// `Error from server (Forbidden)` naming the user, verb and resource.
async fn refused(bed: &TestBed, user: &str, path: &str, verb: &str, resource: &str) -> Result<()> {
    let out = bed.kubectl_as(user, &["get", "--raw", path]).await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && stderr.contains("Error from server (Forbidden)")
            && stderr.contains(&format!(
                r#"User "{user}" cannot {verb} resource "{resource}" in API group "{GROUP}""#
            )),
        "{user} {path}: {} {stderr}",
        out.status
    );
    Ok(())
}
