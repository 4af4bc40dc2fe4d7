//! Watch through the real aggregator (issue 25): `machineinventories` and `managedosversions`
//! of this API watched as kube-apiserver serves watch, next to kube-apiserver's own watch of
//! the operator's MachineInventory CRD doing the same steps: events only when an answer
//! changes, from a list's resourceVersion without a loss or a repeat, selectors' transitions,
//! bookmarks, `sendInitialEvents`, `timeoutSeconds` (any int64, none panicking), a resume this replica cannot serve
//! (410 `Expired`), `kubectl get -w`, and the per-user watch limit (429).

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_integration::{
    events::{Events, kind_and_name},
    fixtures::OperatorChannel,
    generated::Listing,
    paths::GROUP_VERSION,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, tools_dir},
    wait::{POLL, poll},
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};

const OS: &str = "registry.example.com/elemental/os";
/// Longest wait for an event expected now.
const EVENT: Duration = Duration::from_secs(20);
/// How long a watch must stay quiet to show that nothing was sent.
const QUIET: Duration = Duration::from_secs(3);
const MACHINES: &str = "machineinventories";

fn ours(path: &str) -> String {
    format!("{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/{path}")
}

fn crd(path: &str) -> String {
    format!("/apis/elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/{path}")
}

fn inventory(name: &str, version: &str, labels: &str) -> String {
    format!(
        "apiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: {name}\n  namespace: {FLEET_NAMESPACE}\n  annotations: {{elemental.cattle.io/os.image: \"{OS}:{version}\"}}\n  labels: {labels}\nspec: {{}}\n"
    )
}

#[tokio::test]
async fn watch_end_to_end() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let result = async {
        bed.start_server_reading(&registry, &["--max-watches-per-user=6"])
            .await?;
        checks(&bed, &registry).await?;
        bed.ensure_running()
    }
    .await;
    bed.finish(result)
}

async fn checks(bed: &TestBed, registry: &Registry) -> Result<()> {
    let stable = Listing::generate("stable", 1, 1..=4);
    let (mut channel, entries) = OperatorChannel::of_listing(
        &bed.client(),
        registry,
        &stable,
        (FLEET_NAMESPACE, "stable", "elemental/stable:1"),
        OS,
    )
    .await?;
    // Three versions first: the fourth comes later, and version summaries are watched for it.
    channel.sync(&entries[..3]).await?;
    apply(bed, &inventory("m-a", "1.1.0", "{pool: a}")).await?;
    apply(bed, &inventory("m-b", "1.2.0", "{pool: a}")).await?;
    wait_state(bed, "m-a", "UpdatesAvailable").await?;
    wait_state(bed, "m-b", "UpdatesAvailable").await?;

    // A list's resourceVersion, then a watch from it, next to kube-apiserver's own watch of
    // the MachineInventory CRD from its list.
    let list: Value = bed.admin_get_json(&ours(MACHINES)).await?;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .context("no list resourceVersion")?
        .to_owned();
    ensure!(!rv.is_empty(), "{list}");
    let items = list["items"].as_array().context("items")?;
    for item in items {
        ensure!(
            item["metadata"]["resourceVersion"]
                .as_str()
                .is_some_and(|v| !v.is_empty()),
            "an item without resourceVersion: {item}"
        );
    }
    let crd_list: Value = bed.admin_get_json(&crd(MACHINES)).await?;
    let crd_rv = crd_list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut watch = Events::open(
        bed,
        &ours(&format!(
            "{MACHINES}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"
        )),
    )
    .await?;
    let mut reference = Events::open(
        bed,
        &crd(&format!("{MACHINES}?watch=true&resourceVersion={crd_rv}")),
    )
    .await?;
    let mut selected = Events::open(
        bed,
        &ours(&format!(
            "{MACHINES}?watch=true&resourceVersion={rv}&labelSelector=pool%3Da"
        )),
    )
    .await?;

    let started = Instant::now();
    apply(bed, &inventory("m-a", "1.3.0", "{pool: a}")).await?;
    let event = watch.next(EVENT, "m-a upgraded").await?;
    ensure!(
        kind_and_name(&event) == ("MODIFIED".to_owned(), "m-a".to_owned()),
        "{event}"
    );
    ensure!(event["object"]["state"] == "UpToDate", "{event}");
    let latency = started.elapsed();
    let event = reference.next(EVENT, "m-a upgraded (CRD)").await?;
    ensure!(kind_and_name(&event).0 == "MODIFIED", "{event}");
    eprintln!("annotation change to event: {latency:?}");

    // An annotation the view does not read: kube-apiserver sends MODIFIED, this API nothing.
    bed.kubectl_ok(&[
        "annotate",
        "machineinventories.elemental.cattle.io",
        "-n",
        FLEET_NAMESPACE,
        "m-b",
        "example.com/note=unrelated",
    ])
    .await?;
    let event = reference.next(EVENT, "m-b annotated (CRD)").await?;
    ensure!(
        kind_and_name(&event) == ("MODIFIED".to_owned(), "m-b".to_owned()),
        "{event}"
    );
    watch.quiet(QUIET, "an annotation no answer reads").await?;

    // A label change that takes m-b out of `pool=a`: DELETED for the selecting watch,
    // MODIFIED for the other (labels are in the answer).
    let _ = selected.next(EVENT, "m-a upgraded (selected)").await?;
    apply(bed, &inventory("m-b", "1.2.0", "{pool: b}")).await?;
    let event = selected.next(EVENT, "m-b leaves pool a").await?;
    ensure!(
        kind_and_name(&event) == ("DELETED".to_owned(), "m-b".to_owned()),
        "{event}"
    );
    let event = watch.next(EVENT, "m-b relabelled").await?;
    ensure!(
        kind_and_name(&event) == ("MODIFIED".to_owned(), "m-b".to_owned()),
        "{event}"
    );
    let _ = reference.next(EVENT, "m-b relabelled (CRD)").await?;

    // Created, then deleted: the same sequence as kube-apiserver's, step by step.
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    apply(bed, &inventory("m-c", "1.3.0", "{pool: a}")).await?;
    mine.push(kind_and_name(&watch.next(EVENT, "m-c added").await?));
    theirs.push(kind_and_name(
        &reference.next(EVENT, "m-c added (CRD)").await?,
    ));
    bed.kubectl_ok(&[
        "delete",
        "machineinventories.elemental.cattle.io",
        "-n",
        FLEET_NAMESPACE,
        "m-a",
    ])
    .await?;
    mine.push(kind_and_name(&watch.next(EVENT, "m-a deleted").await?));
    theirs.push(kind_and_name(
        &reference.next(EVENT, "m-a deleted (CRD)").await?,
    ));
    ensure!(
        mine == theirs,
        "this API {mine:?}, kube-apiserver {theirs:?}"
    );
    ensure!(
        mine == [
            ("ADDED".to_owned(), "m-c".to_owned()),
            ("DELETED".to_owned(), "m-a".to_owned())
        ],
        "{mine:?}"
    );

    // A resume from the list's resourceVersion replays exactly what happened since.
    let mut resumed = Events::open(
        bed,
        &ours(&format!("{MACHINES}?watch=true&resourceVersion={rv}")),
    )
    .await?;
    let mut replay = Vec::new();
    for _ in 0..4 {
        replay.push(kind_and_name(&resumed.next(EVENT, "replay").await?));
    }
    ensure!(
        replay
            == [
                ("MODIFIED".to_owned(), "m-a".to_owned()),
                ("MODIFIED".to_owned(), "m-b".to_owned()),
                ("ADDED".to_owned(), "m-c".to_owned()),
                ("DELETED".to_owned(), "m-a".to_owned()),
            ],
        "{replay:?}"
    );
    resumed.quiet(QUIET, "nothing repeated").await?;
    drop(resumed);

    // A resourceVersion of another replica or of an earlier run: 410 Expired, as
    // kube-apiserver's watch cache ends a watch from a compacted one.
    let mut expired = Events::open(
        bed,
        &ours(&format!("{MACHINES}?watch=true&resourceVersion=12345")),
    )
    .await?;
    let event = expired.next(EVENT, "expired").await?;
    ensure!(event["type"] == "ERROR", "{event}");
    ensure!(
        event["object"]["code"] == 410 && event["object"]["reason"] == "Expired",
        "{event}"
    );

    // sendInitialEvents: every machine ADDED, then the bookmark that ends them.
    let mut initial = Events::open(
        bed,
        &ours(&format!(
            "{MACHINES}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        )),
    )
    .await?;
    let names = initial.initial_names(EVENT, "initial events").await?;
    ensure!(names == ["m-b", "m-c"], "{names:?}");
    drop(initial);
    let (status, body) = bed
        .admin_get(&ours(&format!(
            "{MACHINES}?watch=true&sendInitialEvents=true"
        )))
        .await?;
    ensure!(
        status == 400,
        "sendInitialEvents without NotOlderThan: {status} {body}"
    );

    // timeoutSeconds ends the watch.
    let mut short = Events::open(
        bed,
        &ours(&format!("{MACHINES}?watch=true&timeoutSeconds=1")),
    )
    .await?;
    let started = Instant::now();
    while short.next_within(EVENT).await?.is_some() {}
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "timeoutSeconds=1 ended after {:?}",
        started.elapsed()
    );

    // timeoutSeconds as kube-apiserver reads it, no value panicking the watch: the longest
    // serves the watch (it was an empty 200 and a panic in the log), a negative one ends it
    // at once without an event (an empty 200, as kube-apiserver), one past int64 is a 400.
    let mut longest = Events::open(
        bed,
        &ours(&format!(
            "{MACHINES}?watch=true&timeoutSeconds={}",
            i64::MAX
        )),
    )
    .await?;
    let event = longest.next(EVENT, "timeoutSeconds=i64::MAX").await?;
    ensure!(event["type"] == "ADDED", "{event}");
    drop(longest);
    let mut negative = Events::open(
        bed,
        &ours(&format!("{MACHINES}?watch=true&timeoutSeconds=-1")),
    )
    .await?;
    let started = Instant::now();
    let none = negative.next_within(EVENT).await?;
    ensure!(
        none.is_none() && started.elapsed() < Duration::from_secs(10),
        "timeoutSeconds=-1: {none:?} after {:?} (kube-apiserver ends it at once, no event)",
        started.elapsed()
    );
    // kube-apiserver's own watch of the CRD with the same values, for the record
    // (docs/api.md): a request that has not ended after the client's 10 s is "not ended".
    for value in ["-1", "9223372036854775807"] {
        let started = Instant::now();
        let outcome = match bed
            .admin_get(&crd(&format!(
                "{MACHINES}?watch=true&timeoutSeconds={value}"
            )))
            .await
        {
            Ok((status, body)) => format!("{status}, {} bytes: {body:.300}", body.len()),
            Err(error) => format!("not ended ({error:#})"),
        };
        eprintln!(
            "kube-apiserver's CRD watch with timeoutSeconds={value}: {outcome} after {:?}",
            started.elapsed()
        );
    }
    let (status, body) = bed
        .admin_get(&ours(&format!(
            "{MACHINES}?watch=true&timeoutSeconds=9223372036854775808"
        )))
        .await?;
    ensure!(status == 400, "timeoutSeconds past int64: {status} {body}");
    let log = std::fs::read_to_string(bed.server_log()?)?;
    ensure!(!log.contains("panicked"), "the server panicked");

    // Version summaries: a new version of the channel is ADDED when its data arrives.
    let summaries: Value = bed.admin_get_json(&ours("managedosversions")).await?;
    let rv = summaries["metadata"]["resourceVersion"]
        .as_str()
        .context("no summaries resourceVersion")?
        .to_owned();
    let mut versions = Events::open(
        bed,
        &ours(&format!(
            "managedosversions?watch=true&resourceVersion={rv}"
        )),
    )
    .await?;
    channel.sync(&entries).await?;
    let newest = entries.last().context("entries")?.name.clone();
    let event = loop {
        let event = versions.next(EVENT, "the fourth version").await?;
        if event["object"]["metadata"]["name"] == newest.as_str()
            && event["object"]["summary"].is_object()
        {
            break event;
        }
    };
    ensure!(
        matches!(event["type"].as_str(), Some("ADDED" | "MODIFIED")),
        "{event}"
    );

    // ?cve=: the list has a resourceVersion, and a watch from it carries each machine's
    // exposure (the first CVE the model's versions fix, after the first version).
    let cve = stable
        .versions
        .iter()
        .skip(1)
        .flat_map(|v| stable.advisories(&v.name))
        .flat_map(|a| a.cves.clone())
        .next()
        .context("the generated channel names no CVE")?;
    // On managedosversions, ?cve= selects as the list does: the versions fixing it.
    let fixing: Value = bed
        .admin_get_json(&ours(&format!("managedosversions?cve={cve}")))
        .await?;
    let mut fixing: Vec<String> = fixing["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let all: Value = bed.admin_get_json(&ours("managedosversions")).await?;
    let all = all["items"].as_array().map_or(0, Vec::len);
    ensure!(
        !fixing.is_empty() && fixing.len() < all,
        "the versions fixing {cve}: {fixing:?} of {all}"
    );
    let mut fixing_watch = Events::open(
        bed,
        &ours(&format!(
            "managedosversions?watch=true&cve={cve}&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        )),
    )
    .await?;
    let mut seen = fixing_watch
        .initial_names(EVENT, "versions fixing the CVE")
        .await?;
    fixing.sort();
    seen.sort();
    ensure!(
        seen == fixing,
        "a ?cve= watch of managedosversions sent {seen:?}, the list holds {fixing:?}"
    );
    drop(fixing_watch);
    let cve_list: Value = bed
        .admin_get_json(&ours(&format!("{MACHINES}?cve={cve}")))
        .await?;
    let cve_rv = cve_list["metadata"]["resourceVersion"]
        .as_str()
        .context("no resourceVersion on a ?cve= list")?
        .to_owned();
    let mut exposure = Events::open(
        bed,
        &ours(&format!(
            "{MACHINES}?watch=true&cve={cve}&resourceVersion={cve_rv}"
        )),
    )
    .await?;

    // kubectl get -w, as a user runs it.
    let mut kubectl = tokio::process::Command::new(tools_dir().join("kubectl"))
        .args([
            "--kubeconfig",
            &bed.kubeconfig().display().to_string(),
            "get",
            "machineinventories.changelog.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
            "-w",
            "--output-watch-events",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("kubectl get -w")?;
    let mut lines = BufReader::new(kubectl.stdout.take().context("stdout")?).lines();
    let mut seen = Vec::new();
    let first = tokio::time::timeout(EVENT, async {
        while let Some(line) = lines.next_line().await? {
            seen.push(line.clone());
            if line.contains("m-c") {
                return Ok::<_, anyhow::Error>(());
            }
        }
        bail!("kubectl get -w ended: {seen:?}")
    })
    .await;
    ensure!(first.is_ok(), "kubectl listed nothing: {seen:?}");
    apply(bed, &inventory("m-c", "1.4.0", "{pool: a}")).await?;
    let modified = tokio::time::timeout(EVENT, async {
        while let Some(line) = lines.next_line().await? {
            seen.push(line.clone());
            if line.starts_with("MODIFIED") && line.contains("m-c") && line.contains("UpToDate") {
                return Ok::<_, anyhow::Error>(());
            }
        }
        bail!("kubectl get -w ended")
    })
    .await;
    ensure!(
        matches!(modified, Ok(Ok(()))),
        "kubectl get -w never showed m-c UpToDate: {seen:?}"
    );
    drop(kubectl);
    let event = exposure.next(EVENT, "m-c upgraded (?cve=)").await?;
    ensure!(
        kind_and_name(&event) == ("MODIFIED".to_owned(), "m-c".to_owned())
            && event["object"]["cve"]["id"] == cve.as_str()
            && event["object"]["cve"]["state"] == "Fixed",
        "{event}"
    );
    drop(exposure);

    // A Role limited by resourceNames: its name's watch (fieldSelector, as `kubectl get NAME
    // -w` sends it) streams that machine only; a watch of every machine is refused.
    apply(
        bed,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: one-machine, namespace: {FLEET_NAMESPACE}}}\nrules:\n- apiGroups: [changelog.elemental.cattle.io]\n  resources: [machineinventories]\n  resourceNames: [m-b]\n  verbs: [get, list, watch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: alice-one-machine, namespace: {FLEET_NAMESPACE}}}\nsubjects: [{{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}]\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-machine}}\n"
        ),
    )
    .await?;
    let alice = bed.apiserver_http(None)?;
    let token = bed.token("alice")?.to_owned();
    let as_alice = async |query: &str| -> Result<reqwest::Response> {
        Ok(alice
            .get(format!(
                "{}{}",
                bed.apiserver_url(),
                ours(&format!("{MACHINES}?{query}"))
            ))
            .bearer_auth(&token)
            .send()
            .await?)
    };
    let (mut one, _) = poll("alice's Role takes effect", EVENT, POLL, async || {
        let response = as_alice("watch=true&fieldSelector=metadata.name%3Dm-b").await?;
        Ok((response.status() == 200).then_some(response))
    })
    .await?;
    let mut buffer = Vec::new();
    while !buffer.contains(&b'\n') {
        let chunk = tokio::time::timeout(EVENT, one.chunk())
            .await
            .context("alice's watch: no event")??
            .context("alice's watch ended")?;
        buffer.extend_from_slice(&chunk);
    }
    let event: Value =
        serde_json::from_slice(&buffer[..=buffer.iter().position(|b| *b == b'\n').unwrap_or(0)])?;
    ensure!(
        event["type"] == "ADDED" && event["object"]["metadata"]["name"] == "m-b",
        "alice's watch: {event}"
    );
    drop(one);
    let every = as_alice("watch=true").await?;
    ensure!(
        every.status() == 403,
        "alice watched every machine: {}",
        every.status()
    );

    // The per-user limit (6 here): with six watches of admin open, the next is a 429
    // (kubectl's watch, just closed, may hold its place for a moment: tried again then).
    let mut open = vec![watch, selected, versions];
    for _ in 0..3 {
        open.push(Events::open(bed, &ours(&format!("{MACHINES}?watch=true"))).await?);
    }
    drop(reference);
    poll(
        "a watch past --max-watches-per-user",
        EVENT,
        POLL,
        async || {
            let (status, body) = bed
                .admin_get(&ours(&format!("{MACHINES}?watch=true&timeoutSeconds=1")))
                .await?;
            ensure!(
                status == 429 || status == 200,
                "a watch past --max-watches-per-user: {status} {body}"
            );
            Ok((status == 429).then_some(()))
        },
    )
    .await?;
    drop(open);
    Ok(())
}

async fn apply(bed: &TestBed, yaml: &str) -> Result<()> {
    bed.kubectl_stdin(&["apply", "-f", "-"], yaml).await?;
    Ok(())
}

/// Waits until the list (what a watch follows) shows machine `name` in `state`.
async fn wait_state(bed: &TestBed, name: &str, state: &str) -> Result<()> {
    poll(&format!("{name} {state}"), EVENT, POLL, async || {
        let (status, body) = bed.admin_get_value(&ours(MACHINES)).await?;
        let listed = body["items"].as_array().is_some_and(|items| {
            items
                .iter()
                .any(|m| m["metadata"]["name"] == name && m["state"] == state)
        });
        Ok((status == 200 && listed).then_some(()))
    })
    .await?;
    Ok(())
}
