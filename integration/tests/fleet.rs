//! The fleet view end to end, on the real control plane: the operator's MachineInventory and
//! ManagedOSImage CRDs (MachineInventorySelector's is not installed: the server treats it as
//! empty), channels published to a real registry, machines on several versions of two
//! channels, ManagedOSImages, and every state and reason through kube-apiserver; a machine
//! whose annotations change and one deleted, followed within seconds; `?cve=`; a viewer of
//! one namespace; the Table through `kubectl get`; the machines gauge.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_apiservice::GROUP;
use elemental_changelog_integration::markdown::{Document, code_spans};
use elemental_changelog_integration::{
    fixtures::{OperatorChannel, metric},
    generated::Listing,
    image::{self, Compression, Format},
    paths::GROUP_VERSION,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, elemental::VersionEntry, workspace_root},
    wait::{POLL, SOON as DEADLINE, poll},
};
use serde_json::Value;

const LOCAL: &str = "fleet-local";
const STABLE_OS: &str = "registry.example.com/elemental/os";
const EDGE_OS: &str = "registry.example.com/elemental/edge-os";
const BROKEN_OS: &str = "registry.example.com/elemental/broken-os";

fn api(path: &str) -> String {
    format!("{GROUP_VERSION}{path}")
}

async fn machine(bed: &TestBed, namespace: &str, name: &str, query: &str) -> Result<Value> {
    bed.admin_get_json(&api(&format!(
        "/namespaces/{namespace}/machineinventories/{name}{query}"
    )))
    .await
}

/// Polls until `check` accepts the machine; returns it and the time taken.
async fn wait_machine(
    bed: &TestBed,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<(Value, Duration)> {
    poll(
        &format!("{namespace}/{name}: {what}"),
        DEADLINE,
        POLL,
        async || {
            let m = machine(bed, namespace, name, "").await?;
            Ok(check(&m).then_some(m))
        },
    )
    .await
}

/// GETs `path` through the aggregator as admin: an `ETag`, `Cache-Control: no-cache, private`
/// and `Vary: Accept, Accept-Encoding`, and a 304 without a body to `If-None-Match` naming it.
async fn validated(bed: &TestBed, path: &str) -> Result<()> {
    let url = format!("{}{path}", bed.apiserver_url());
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let answer = http.get(&url).send().await?;
    ensure!(answer.status() == 200, "{path}: {}", answer.status());
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let etag = header("etag").with_context(|| format!("{path}: no ETag"))?;
    ensure!(
        header("cache-control").as_deref() == Some("no-cache, private"),
        "{path}: Cache-Control {:?}",
        header("cache-control")
    );
    ensure!(
        header("vary").as_deref() == Some("Accept, Accept-Encoding"),
        "{path}: Vary {:?}",
        header("vary")
    );
    let conditional = http.get(&url).header("if-none-match", &etag).send().await?;
    ensure!(
        conditional.status() == 304,
        "{path}: If-None-Match {etag}: {}",
        conditional.status()
    );
    ensure!(conditional.bytes().await?.is_empty());
    Ok(())
}

fn entries(data: &Listing, os: &str) -> Vec<VersionEntry> {
    data.entries()
        .into_iter()
        .map(|mut e| {
            e.upgrade_image = format!("{os}:{}", e.version);
            e
        })
        .collect()
}

async fn apply(bed: &TestBed, yaml: &str) -> Result<()> {
    bed.kubectl_stdin(&["apply", "-f", "-"], yaml).await?;
    Ok(())
}

/// A MachineInventory with these OS annotations and labels.
fn inventory(
    namespace: &str,
    name: &str,
    annotations: &[(&str, &str)],
    labels: &[(&str, &str)],
) -> String {
    let map = |pairs: &[(&str, &str)]| -> String {
        if pairs.is_empty() {
            return "{}".to_owned();
        }
        let items: Vec<String> = pairs
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}: {}",
                    serde_json::to_string(k).unwrap_or_default(),
                    serde_json::to_string(v).unwrap_or_default()
                )
            })
            .collect();
        format!("{{{}}}", items.join(", "))
    };
    format!(
        "apiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  annotations: {}\n  labels: {}\nspec: {{}}\n---\n",
        map(annotations),
        map(labels)
    )
}

/// Namespace, name, OS annotations, labels.
type Machine<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, String)>,
    Vec<(&'a str, &'a str)>,
);

fn image_of(os: &str, version: &str) -> String {
    format!("{os}:{version}")
}

#[tokio::test]
async fn fleet_view_end_to_end() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let started = Instant::now();
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), LOCAL.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    eprintln!("test bed started in {:?}", started.elapsed());
    let result = async {
        bed.start_server_reading(&registry, &[]).await?;
        checks(&bed, &registry).await?;
        bed.ensure_running()
    }
    .await;
    bed.finish(result)
}

async fn checks(bed: &TestBed, registry: &Registry) -> Result<()> {
    let stable = Listing::generate("stable", 1, 1..=4);
    let edge = Listing::generate("edge", 2, 1..=3);
    image::push(
        registry,
        "elemental/stable:1",
        &stable.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    image::push(
        registry,
        "elemental/edge:1",
        &edge.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let client = bed.client();
    for ns in [FLEET_NAMESPACE, LOCAL] {
        let mut c =
            OperatorChannel::custom(&client, ns, "stable", &registry.image("elemental/stable:1"))
                .await?;
        c.sync(&entries(&stable, STABLE_OS)).await?;
        let mut c =
            OperatorChannel::custom(&client, ns, "edge", &registry.image("elemental/edge:1"))
                .await?;
        c.sync(&entries(&edge, EDGE_OS)).await?;
    }
    // A channel whose image does not exist: its data is never fetched.
    let mut broken = OperatorChannel::custom(
        &client,
        FLEET_NAMESPACE,
        "broken",
        &registry.image("elemental/missing:1"),
    )
    .await?;
    broken
        .sync(&[VersionEntry {
            name: "broken-v7".to_owned(),
            version: "7.0.0".to_owned(),
            upgrade_image: image_of(BROKEN_OS, "7.0.0"),
            created: Some(1_700_000_000),
        }])
        .await?;

    let img = |os: &str, v: &str| image_of(os, v);
    let mut yaml = String::new();
    let machines: Vec<Machine<'_>> = vec![
        (
            FLEET_NAMESPACE,
            "m-old",
            vec![("elemental.cattle.io/os.image", img(STABLE_OS, "1.1.0"))],
            vec![("pool", "a")],
        ),
        (
            FLEET_NAMESPACE,
            "m-new",
            vec![("elemental.cattle.io/os.image", img(STABLE_OS, "1.4.0"))],
            vec![("pool", "a")],
        ),
        (
            FLEET_NAMESPACE,
            "m-edge",
            vec![("elemental.cattle.io/os.image", img(EDGE_OS, "1.2.0"))],
            vec![("pool", "b")],
        ),
        (
            FLEET_NAMESPACE,
            "m-mirror",
            vec![(
                "elemental.cattle.io/os.image",
                format!("mirror.example.org/{}", img(STABLE_OS, "1.2.0")),
            )],
            vec![],
        ),
        (FLEET_NAMESPACE, "m-none", vec![], vec![]),
        (
            FLEET_NAMESPACE,
            "m-unmanaged",
            vec![("elemental.cattle.io/os.unmanaged", "true".to_owned())],
            vec![],
        ),
        (
            FLEET_NAMESPACE,
            "m-lost",
            vec![
                (
                    "elemental.cattle.io/os.image",
                    "registry.example.com/other/os:9".to_owned(),
                ),
                ("elemental.cattle.io/os.version", "9.9".to_owned()),
            ],
            vec![],
        ),
        (
            FLEET_NAMESPACE,
            "m-ambiguous",
            vec![("elemental.cattle.io/os.version", "1.2.0".to_owned())],
            vec![],
        ),
        (
            FLEET_NAMESPACE,
            "m-waiting",
            vec![("elemental.cattle.io/os.image", img(BROKEN_OS, "7.0.0"))],
            vec![],
        ),
        (
            LOCAL,
            "l-pinned",
            vec![("elemental.cattle.io/os.image", img(STABLE_OS, "1.2.0"))],
            vec![("pool", "pinned")],
        ),
        (
            LOCAL,
            "l-ahead",
            vec![("elemental.cattle.io/os.image", img(STABLE_OS, "1.4.0"))],
            vec![("pool", "pinned")],
        ),
        (
            LOCAL,
            "l-switch",
            vec![("elemental.cattle.io/os.image", img(STABLE_OS, "1.1.0"))],
            vec![("pool", "edge")],
        ),
        (
            LOCAL,
            "l-free",
            vec![("elemental.cattle.io/os.image", img(STABLE_OS, "1.4.0"))],
            vec![],
        ),
    ];
    for (ns, name, annotations, labels) in &machines {
        let annotations: Vec<(&str, &str)> =
            annotations.iter().map(|(k, v)| (*k, v.as_str())).collect();
        yaml.push_str(&inventory(ns, name, &annotations, labels));
    }
    yaml.push_str(&format!(
        r#"apiVersion: elemental.cattle.io/v1beta1
kind: ManagedOSImage
metadata: {{name: canary, namespace: {FLEET_NAMESPACE}}}
spec:
  managedOSVersionName: stable-v1-3
  clusterTargets: [{{clusterName: edge-cluster}}]
---
apiVersion: elemental.cattle.io/v1beta1
kind: ManagedOSImage
metadata: {{name: pin, namespace: {LOCAL}}}
spec:
  managedOSVersionName: stable-v1-3
  nodeSelector: {{matchLabels: {{pool: pinned}}}}
---
apiVersion: elemental.cattle.io/v1beta1
kind: ManagedOSImage
metadata: {{name: to-edge, namespace: {LOCAL}}}
spec:
  osImage: {EDGE_OS}:1.3.0
  nodeSelector: {{matchLabels: {{pool: edge}}}}
"#
    ));
    apply(bed, &yaml).await?;

    // Every state and reason, once the channel data is read.
    let (m, took) = wait_machine(
        bed,
        FLEET_NAMESPACE,
        "m-old",
        "UpdatesAvailable with a summary",
        |m| {
            m["state"] == "UpdatesAvailable"
                && m["summary"]["advisories"].as_u64().is_some_and(|n| n > 0)
        },
    )
    .await?;
    eprintln!("m-old resolved after {took:?}");
    ensure!(
        m["current"]["name"] == "stable-v1-1" && m["current"]["channel"] == "stable",
        "{m}"
    );
    ensure!(
        m["target"]["name"] == "stable-v1-4" && m["target"]["source"] == "NewestInChannel",
        "{m}"
    );
    // canary targets a cluster the machine cannot be linked to (no MachineInventorySelector).
    ensure!(m["target"]["reason"] == "ClusterUnresolved", "{m}");
    let expected_advisories: usize = stable.versions[1..]
        .iter()
        .map(|v| stable.advisories(&v.name).len())
        .sum();
    ensure!(
        m["summary"]["advisories"] == expected_advisories,
        "{m}: expected {expected_advisories} advisories"
    );
    ensure!(m["os"]["image"] == img(STABLE_OS, "1.1.0"), "{m}");

    let expect = |ns: &'static str,
                  name: &'static str,
                  state: &'static str,
                  reason: Option<&'static str>| async move {
        let (m, _) = wait_machine(bed, ns, name, state, |m| m["state"] == state).await?;
        match reason {
            Some(r) => ensure!(m["reason"] == r, "{ns}/{name}: reason {r} expected: {m}"),
            None => ensure!(
                m.get("reason").is_none(),
                "{ns}/{name}: no reason expected: {m}"
            ),
        }
        Ok::<Value, anyhow::Error>(m)
    };
    let m = expect(FLEET_NAMESPACE, "m-new", "UpToDate", None).await?;
    ensure!(
        m["current"]["name"] == "stable-v1-4" && m.get("summary").is_none(),
        "{m}"
    );
    let m = expect(FLEET_NAMESPACE, "m-edge", "UpdatesAvailable", None).await?;
    ensure!(
        m["current"]["name"] == "edge-v1-2" && m["target"]["name"] == "edge-v1-3",
        "{m}"
    );
    let m = expect(FLEET_NAMESPACE, "m-mirror", "UpdatesAvailable", None).await?;
    ensure!(m["current"]["name"] == "stable-v1-2", "mirror prefix: {m}");
    expect(FLEET_NAMESPACE, "m-none", "Unknown", Some("NoAnnotation")).await?;
    expect(FLEET_NAMESPACE, "m-unmanaged", "Unknown", Some("Unmanaged")).await?;
    expect(
        FLEET_NAMESPACE,
        "m-lost",
        "Unknown",
        Some("VersionInNoChannel"),
    )
    .await?;
    let m = expect(FLEET_NAMESPACE, "m-ambiguous", "Unknown", Some("Ambiguous")).await?;
    ensure!(
        m["message"]
            .as_str()
            .is_some_and(|s| s.contains("stable-v1-2") && s.contains("edge-v1-2")),
        "{m}"
    );
    expect(
        FLEET_NAMESPACE,
        "m-waiting",
        "Unknown",
        Some("ChannelNotFetched"),
    )
    .await?;
    let m = expect(LOCAL, "l-pinned", "UpdatesAvailable", None).await?;
    ensure!(
        m["target"]["name"] == "stable-v1-3"
            && m["target"]["source"] == "ManagedOSImage"
            && m["target"]["managedOSImage"] == "pin"
            && m["summary"]["advisories"] == stable.advisories(&stable.versions[2].name).len(),
        "{m}"
    );
    let m = expect(LOCAL, "l-ahead", "UpToDate", Some("TargetOlder")).await?;
    ensure!(m["target"]["name"] == "stable-v1-3", "{m}");
    let m = expect(LOCAL, "l-switch", "UpdatesAvailable", Some("OtherChannel")).await?;
    ensure!(
        m["target"]["name"] == "edge-v1-3" && m.get("summary").is_none(),
        "{m}"
    );
    let m = expect(LOCAL, "l-free", "UpToDate", None).await?;
    ensure!(m["target"]["source"] == "NewestInChannel", "{m}");
    eprintln!("every state and reason: ok");

    // Lists: one namespace, all, selectors.
    let list = bed
        .admin_get_json::<Value>(&api(&format!(
            "/namespaces/{FLEET_NAMESPACE}/machineinventories"
        )))
        .await?;
    ensure!(
        list["kind"] == "MachineInventoryChangelogSummaryList",
        "{list}"
    );
    ensure!(list["items"].as_array().map(Vec::len) == Some(9), "{list}");
    let all = bed
        .admin_get_json::<Value>(&api("/machineinventories"))
        .await?;
    ensure!(all["items"].as_array().map(Vec::len) == Some(13), "{all}");
    let pool = bed
        .admin_get_json::<Value>(&api(&format!(
            "/namespaces/{FLEET_NAMESPACE}/machineinventories?labelSelector=pool%3Da"
        )))
        .await?;
    let names: Vec<&str> = pool["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    ensure!(names == ["m-new", "m-old"], "labelSelector: {names:?}");
    let one = bed
        .admin_get_json::<Value>(&api(
            "/machineinventories?fieldSelector=metadata.name%3Dl-free",
        ))
        .await?;
    ensure!(one["items"].as_array().map(Vec::len) == Some(1), "{one}");

    // ?cve=: the first stable version (after the first) whose advisories name a CVE none
    // before it does.
    let (cve, fixed_in) = stable
        .versions
        .iter()
        .enumerate()
        .skip(1)
        .find_map(|(i, v)| {
            stable
                .advisories(&v.name)
                .into_iter()
                .flat_map(|a| a.cves.iter())
                .find(|c| {
                    !stable.versions[..i].iter().any(|p| {
                        stable
                            .advisories(&p.name)
                            .iter()
                            .any(|a| a.cves.contains(c))
                    })
                })
                .map(|c| (c.clone(), i))
        })
        .context("the generated stable channel has no CVE after its first version")?;
    let fixed_name = &stable.versions[fixed_in].name;
    let list = bed
        .admin_get_json::<Value>(&api(&format!(
            "/namespaces/{FLEET_NAMESPACE}/machineinventories?cve={cve}"
        )))
        .await?;
    let cve_of = |name: &str| -> Value {
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i["metadata"]["name"] == name)
            .map(|i| i["cve"].clone())
            .unwrap_or(Value::Null)
    };
    let old = cve_of("m-old");
    ensure!(
        old["state"] == "Exposed" && old["fixedIn"]["name"] == fixed_name.as_str(),
        "m-old {cve}: {old}"
    );
    let new = cve_of("m-new");
    ensure!(
        new["state"] == "Fixed" && new["fixedIn"]["name"] == fixed_name.as_str(),
        "m-new {cve}: {new}"
    );
    ensure!(cve_of("m-none")["state"] == "Unknown", "{list}");
    let edge_cve = cve_of("m-edge");
    ensure!(
        edge_cve["state"] == "NoFixInChannel"
            || edge_cve["state"] == "Fixed"
            || edge_cve["state"] == "Exposed",
        "{edge_cve}"
    );
    let m = machine(bed, FLEET_NAMESPACE, "m-old", "?cve=CVE-1999-0001").await?;
    ensure!(
        m["cve"]["state"] == "NoFixInChannel" && m["cve"]["id"] == "CVE-1999-0001",
        "{m}"
    );
    // `kubectl elemental cve` lists the versions, then the machines still exposed.
    let out = kubectl_elemental(bed, &["cve", &cve, "-n", FLEET_NAMESPACE])?;
    let exposed: Vec<&str> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["cve"]["state"] == "Exposed")
        .filter_map(|m| m["metadata"]["name"].as_str())
        .collect();
    let (_, machines) = out
        .split_once("Machines still exposed to")
        .with_context(|| format!("kubectl elemental cve {cve}: no machines:\n{out}"))?;
    let listed: Vec<&str> = machines
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    ensure!(
        exposed.contains(&"m-old") && listed == exposed,
        "kubectl elemental cve {cve}: {listed:?}, exposed {exposed:?}:\n{out}"
    );
    eprintln!("?cve={cve} (fixed in {fixed_name}): ok");

    // A machine's changelog: that of a ManagedOSVersion from its current version.
    let changelog_path = |ns: &str, name: &str, query: &str| {
        api(&format!(
            "/namespaces/{ns}/machineinventories/{name}/changelog{query}"
        ))
    };
    let c = bed
        .admin_get_json::<Value>(&changelog_path(FLEET_NAMESPACE, "m-old", ""))
        .await?;
    ensure!(
        c["kind"] == "ManagedOSVersionChangelog"
            && c["metadata"]["name"] == "stable-v1-4"
            && c["from"]["name"] == "stable-v1-1",
        "{c}"
    );
    ensure!(c["summary"]["advisories"] == expected_advisories, "{c}");
    let c = bed
        .admin_get_json::<Value>(&changelog_path(FLEET_NAMESPACE, "m-old", "?to=stable-v1-2"))
        .await?;
    ensure!(
        c["metadata"]["name"] == "stable-v1-2" && c["from"]["name"] == "stable-v1-1",
        "{c}"
    );
    let (status, text) = bed
        .admin_get(&changelog_path(FLEET_NAMESPACE, "m-old", "?format=text"))
        .await?;
    ensure!(
        status == 200 && !text.trim_start().starts_with('{') && text.contains("stable-v1-4"),
        "{status}: {text}"
    );
    let (status, text) = bed
        .admin_get(&changelog_path(
            FLEET_NAMESPACE,
            "m-old",
            "?format=markdown",
        ))
        .await?;
    ensure!(status == 200 && text.contains('#'), "{status}: {text}");
    let errors = Document::read("docs/api.md")?;
    for (name, query, code) in [
        ("m-old", "?to=edge-v1-2", 400),
        ("m-old", "?to=Not_A_Name", 400),
        ("m-none", "", 404),
        ("m-missing", "", 404),
    ] {
        let (status, body) = bed
            .admin_get(&changelog_path(FLEET_NAMESPACE, name, query))
            .await?;
        ensure!(status == code, "{name}{query}: {status} {body}");
        if name != "m-missing" {
            documented_machine_error(&errors, status.as_u16(), &body)
                .with_context(|| format!("{name}{query}"))?;
        }
    }
    let (status, body) = bed
        .admin_get(&changelog_path(LOCAL, "l-switch", ""))
        .await?;
    ensure!(
        status == 404 && body.contains("OtherChannel"),
        "{status} {body}"
    );
    documented_machine_error(&errors, status.as_u16(), &body).context("l-switch")?;
    let c = bed
        .admin_get_json::<Value>(&changelog_path(LOCAL, "l-switch", "?to=stable-v1-4"))
        .await?;
    ensure!(
        c["metadata"]["name"] == "stable-v1-4" && c["from"]["name"] == "stable-v1-1",
        "{c}"
    );

    // A ManagedOSImage's plan.
    let plan = bed
        .admin_get_json::<Value>(&api(&format!(
            "/namespaces/{LOCAL}/managedosimages/pin/changelog"
        )))
        .await?;
    ensure!(
        plan["kind"] == "ManagedOSImageChangelog" && plan["target"]["name"] == "stable-v1-3",
        "{plan}"
    );
    let groups = plan["groups"].as_array().context("groups")?;
    ensure!(
        groups.iter().any(|g| g["current"]["name"] == "stable-v1-2"
            && g["state"] == "UpdatesAvailable"
            && g["machines"] == serde_json::json!(["l-pinned"])),
        "{plan}"
    );
    ensure!(
        groups.iter().any(|g| g["current"]["name"] == "stable-v1-4"
            && g["machines"] == serde_json::json!(["l-ahead"])),
        "{plan}"
    );
    let canary = bed
        .admin_get_json::<Value>(&api(&format!(
            "/namespaces/{FLEET_NAMESPACE}/managedosimages/canary/changelog"
        )))
        .await?;
    ensure!(canary["target"]["name"] == "stable-v1-3", "{canary}");
    ensure!(
        canary["unknownMachines"]
            .as_array()
            .is_some_and(|u| !u.is_empty()),
        "{canary}"
    );
    let (status, _) = bed
        .admin_get(&api(&format!(
            "/namespaces/{LOCAL}/managedosimages/nope/changelog"
        )))
        .await?;
    ensure!(status == 404, "missing ManagedOSImage: {status}");
    // Issue 32: one machine and a plan carry the validators api.md promises every answer.
    validated(
        bed,
        &api(&format!(
            "/namespaces/{LOCAL}/managedosimages/pin/changelog"
        )),
    )
    .await?;
    validated(
        bed,
        &api(&format!("/namespaces/{LOCAL}/machineinventories/l-pinned")),
    )
    .await?;
    eprintln!("machine changelogs and plans: ok");

    // Tables through kubectl.
    let table = bed
        .kubectl_ok(&[
            "get",
            "machineinventories.changelog.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
        ])
        .await?;
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "NAME",
        "CURRENT",
        "TARGET",
        "ADVISORIES",
        "SEVERITY",
        "STATE",
    ] {
        ensure!(header.contains(column), "{table}");
    }
    ensure!(!header.contains("CHANNEL"), "{table}");
    ensure!(
        table.lines().any(|l| l.starts_with("m-old")
            && l.contains("UpdatesAvailable")
            && l.contains("1.1.0")),
        "{table}"
    );
    ensure!(table.lines().count() == 10, "{table}");
    let wide = bed
        .kubectl_ok(&[
            "get",
            "machineinventories.changelog.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
            "-o",
            "wide",
        ])
        .await?;
    let header = wide.lines().next().unwrap_or_default();
    ensure!(
        header.contains("CHANNEL") && header.contains("REASON"),
        "{wide}"
    );
    ensure!(
        wide.lines()
            .any(|l| l.starts_with("m-ambiguous") && l.contains("Ambiguous")),
        "{wide}"
    );
    eprintln!("kubectl tables: ok\n{table}");

    rbac(bed).await?;
    plugin(bed).await?;

    // Annotations change: the state follows.
    let before = Instant::now();
    bed.kubectl_ok(&[
        "annotate",
        "--overwrite",
        "-n",
        FLEET_NAMESPACE,
        "machineinventories.elemental.cattle.io/m-new",
        &format!("elemental.cattle.io/os.image={}", img(STABLE_OS, "1.1.0")),
    ])
    .await?;
    let (m, took) = wait_machine(
        bed,
        FLEET_NAMESPACE,
        "m-new",
        "UpdatesAvailable after re-registration",
        |m| m["state"] == "UpdatesAvailable",
    )
    .await?;
    ensure!(m["current"]["name"] == "stable-v1-1", "{m}");
    ensure!(
        took < Duration::from_secs(10),
        "the state followed the annotations after {took:?}"
    );
    eprintln!(
        "annotation change followed after {took:?} ({:?} with kubectl)",
        before.elapsed()
    );

    // Deleted: gone.
    bed.kubectl_ok(&[
        "delete",
        "-n",
        FLEET_NAMESPACE,
        "machineinventories.elemental.cattle.io/m-lost",
    ])
    .await?;
    let path = api(&format!(
        "/namespaces/{FLEET_NAMESPACE}/machineinventories/m-lost"
    ));
    let (_, took) = poll("m-lost gone", DEADLINE, POLL, async || {
        let (status, _) = bed.admin_get(&path).await?;
        Ok((status == 404).then_some(()))
    })
    .await?;
    let list = bed
        .admin_get_json::<Value>(&api(&format!(
            "/namespaces/{FLEET_NAMESPACE}/machineinventories"
        )))
        .await?;
    ensure!(list["items"].as_array().map(Vec::len) == Some(8), "{list}");
    eprintln!("deleted machine gone after {took:?}");

    // The gauge: every machine of the namespace, by state and severity.
    let (_, took) = poll("machines gauge", DEADLINE, POLL, async || {
        let text = bed.server_metrics().await?;
        let total = metric(
            &text,
            "elemental_changelog_machines",
            &[("namespace", FLEET_NAMESPACE)],
        );
        let unknown = metric(
            &text,
            "elemental_changelog_machines",
            &[
                ("namespace", FLEET_NAMESPACE),
                ("state", "Unknown"),
                ("severity", "none"),
            ],
        );
        let local = metric(
            &text,
            "elemental_changelog_machines",
            &[("namespace", LOCAL)],
        );
        if total == 8.0 && unknown == 4.0 && local == 4.0 {
            Ok(Some(()))
        } else {
            bail!("total {total}, unknown {unknown}, local {local}")
        }
    })
    .await?;
    eprintln!("machines gauge current after {took:?}");
    Ok(())
}

/// `kubectl-elemental` (`KUBECTL_ELEMENTAL_BIN`, else `target/debug/kubectl-elemental`) as
/// admin.
fn kubectl_elemental(bed: &TestBed, args: &[&str]) -> Result<String> {
    let binary = std::env::var_os("KUBECTL_ELEMENTAL_BIN").map_or_else(
        || workspace_root().join("target/debug/kubectl-elemental"),
        Into::into,
    );
    let out = std::process::Command::new(&binary)
        .arg("--kubeconfig")
        .arg(bed.kubeconfig())
        .args(args)
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    ensure!(
        out.status.success(),
        "kubectl elemental {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `kubectl elemental machines` and `changelog --machine`.
async fn plugin(bed: &TestBed) -> Result<()> {
    let table = kubectl_elemental(bed, &["machines", "-n", FLEET_NAMESPACE])?;
    let kubectl = bed
        .kubectl_ok(&[
            "get",
            "machineinventories.changelog.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
        ])
        .await?;
    ensure!(
        table == kubectl,
        "machines:\n{table}\nkubectl get:\n{kubectl}"
    );
    let all = kubectl_elemental(bed, &["machines", "-A", "-o", "wide"])?;
    ensure!(
        all.lines()
            .next()
            .is_some_and(|h| h.starts_with("NAMESPACE") && h.contains("CHANNEL"))
            && all.lines().any(|l| l.starts_with(LOCAL)
                && l.contains("l-switch")
                && l.contains("OtherChannel")),
        "{all}"
    );
    let text = kubectl_elemental(
        bed,
        &["changelog", "-n", FLEET_NAMESPACE, "--machine", "m-old"],
    )?;
    let (_, served) = bed
        .admin_get(&api(&format!(
            "/namespaces/{FLEET_NAMESPACE}/machineinventories/m-old/changelog?format=text"
        )))
        .await?;
    ensure!(
        text == served,
        "changelog --machine:\n{text}\n?format=text:\n{served}"
    );
    let json = kubectl_elemental(
        bed,
        &[
            "changelog",
            "-n",
            FLEET_NAMESPACE,
            "--machine",
            "m-old",
            "--to",
            "stable-v1-2",
            "-o",
            "json",
        ],
    )?;
    let c: Value = serde_json::from_str(&json)?;
    ensure!(
        c["metadata"]["name"] == "stable-v1-2" && c["from"]["name"] == "stable-v1-1",
        "{c}"
    );
    eprintln!("kubectl elemental machines, changelog --machine: ok");
    Ok(())
}

/// A viewer of one namespace sees only its machines.
async fn rbac(bed: &TestBed) -> Result<()> {
    apply(
        bed,
        &format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: fleet-reader, namespace: {FLEET_NAMESPACE}}}
rules:
  - apiGroups: ["{GROUP}"]
    resources: ["machineinventories"]
    verbs: ["get", "list"]
  - apiGroups: ["{GROUP}"]
    resources: ["machineinventories/changelog"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: fleet-reader, namespace: {FLEET_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: fleet-reader}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}]
"#
        ),
    )
    .await?;
    let mine = api(&format!("/namespaces/{FLEET_NAMESPACE}/machineinventories"));
    let (out, _) = poll("alice lists her namespace", DEADLINE, POLL, async || {
        let out = bed.kubectl_as("alice", &["get", "--raw", &mine]).await?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned()))
    })
    .await?;
    let list: Value = serde_json::from_str(&out)?;
    ensure!(
        list["items"].as_array().is_some_and(|i| i
            .iter()
            .all(|m| m["metadata"]["namespace"] == FLEET_NAMESPACE)
            && !i.is_empty()),
        "{list}"
    );
    let out = bed
        .kubectl_as(
            "alice",
            &["get", "--raw", &format!("{mine}/m-old/changelog")],
        )
        .await?;
    ensure!(
        out.status.success(),
        "alice's machine changelog: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    to_is_authorized(bed, &mine).await?;
    for path in [
        api(&format!("/namespaces/{LOCAL}/machineinventories")),
        api("/machineinventories"),
        api(&format!("/namespaces/{LOCAL}/machineinventories/l-free")),
        api(&format!(
            "/namespaces/{FLEET_NAMESPACE}/managedosimages/canary/changelog"
        )),
    ] {
        let out = bed.kubectl_as("alice", &["get", "--raw", &path]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains("forbidden"),
            "alice {path}: {stderr}"
        );
    }
    let table = bed
        .kubectl_as(
            "alice",
            &[
                "get",
                "machineinventories.changelog.elemental.cattle.io",
                "-n",
                FLEET_NAMESPACE,
            ],
        )
        .await?;
    ensure!(
        table.status.success() && String::from_utf8_lossy(&table.stdout).contains("m-old"),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    eprintln!("RBAC: ok");
    Ok(())
}

/// A machine changelog's `to=` reads another ManagedOSVersion's changelog: alice, who may read
/// machines but no version, is refused any `to=`; with a Role naming one version
/// (`resourceNames`) she reads that one, and the 403 for another names it.
async fn to_is_authorized(bed: &TestBed, machines: &str) -> Result<()> {
    let http = bed.apiserver_http(None)?;
    let token = bed.token("alice")?.to_owned();
    let get = async |query: &str| -> Result<(u16, Value)> {
        let response = http
            .get(format!(
                "{}{machines}/m-old/changelog{query}",
                bed.apiserver_url()
            ))
            .bearer_auth(&token)
            .send()
            .await?;
        Ok((response.status().as_u16(), response.json().await?))
    };
    let refused_naming = |query: &str, (code, body): (u16, Value), version: &str| {
        ensure!(
            code == 403 && body["reason"] == "Forbidden" && body["details"]["name"] == version,
            "{query}: alice read a version she may not read, or the 403 does not name it: {code} {body}"
        );
        Ok(())
    };
    for query in [
        "?to=stable-v1-2",
        "?to=stable-v1-2&to=stable-v1-4",
        "?to=stable-v1-%32",
    ] {
        refused_naming(query, get(query).await?, "stable-v1-2")?;
    }
    apply(
        bed,
        &format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: one-version, namespace: {FLEET_NAMESPACE}}}
rules:
  - apiGroups: ["{GROUP}"]
    resources: ["managedosversions/changelog"]
    resourceNames: ["stable-v1-2"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-one-version, namespace: {FLEET_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-version}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}]
"#
        ),
    )
    .await?;
    // Denials are cached for 10 s (k8s.io/apiserver's default): poll until the Role counts.
    let (c, _) = poll(
        "alice's one-version Role takes effect",
        Duration::from_secs(30),
        POLL,
        async || {
            let (code, body) = get("?to=stable-v1-2").await?;
            Ok((code == 200).then_some(body))
        },
    )
    .await?;
    ensure!(c["metadata"]["name"] == "stable-v1-2", "{c}");
    refused_naming(
        "?to=stable-v1-3",
        get("?to=stable-v1-3").await?,
        "stable-v1-3",
    )?;
    eprintln!("a machine changelog's to= authorized: ok");
    Ok(())
}

/// A machine changelog's error answer is a row of api.md's fleet error table
/// (`| code | details.causes[].reason | when |`): its code with its cause reason, or with
/// `none` when it has no cause.
fn documented_machine_error(doc: &Document, status: u16, body: &str) -> Result<()> {
    let answer: Value =
        serde_json::from_str(body).with_context(|| format!("not a Status: {body}"))?;
    let causes: Vec<&str> = answer["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["reason"].as_str())
        .collect();
    let tables = doc.tables_with_header(&["code", "`details.causes[].reason`", "when"]);
    let table = tables
        .first()
        .context("docs/api.md has no fleet error table")?;
    let documented = table.rows.iter().any(|row| {
        row.cells[0] == status.to_string()
            && if causes.is_empty() {
                row.cells[1] == "none"
            } else {
                causes.iter().all(|c| code_spans(&row.cells[1]).contains(c))
            }
    });
    ensure!(
        documented,
        "{status} with causes {causes:?} is not in the fleet error table of {} (line {}): {body}",
        doc.path,
        table.line
    );
    Ok(())
}
