//! Which versions and which machines run package P (issue 34), end to end through the real
//! aggregator: a channel image whose versions carry package lists (the xz 5.6.0/5.6.1
//! backdoor, openssl releases and an epoch, glibc on two architectures, a version without a
//! list, a version without xz), a second namespace, and machines on each version. Every
//! expectation comes from the lists this test writes into the image: the unbounded blocks from
//! a small model of them, the bounded selections as RPM order puts them (named in each check).
//!
//! Checks: `?package=` on version and machine lists (one namespace and all), bounds with
//! releases and epochs, several architectures, Table output's PACKAGE column, 400s stating the
//! rule, watches that select as the lists do (a machine moving into and out of a range), and
//! `kubectl elemental package`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::{
    events::{Events, kind_and_name},
    fixtures::{OperatorChannel, expect_status},
    image::{self, Compression},
    paths::GROUP_VERSION,
    plugin::kubectl_elemental,
    registry::Registry,
    testbed::{
        FLEET_NAMESPACE, TestBed, TestBedOptions,
        elemental::{VersionEntry, channel_json},
        workspace_root,
    },
    ui_fixtures,
    wait::{POLL, SERVED, poll},
};
use serde_json::Value;

const OS: &str = "registry.example.com/elemental/os";
const EDGE_OS: &str = "registry.example.com/elemental/edge";
const TEAM_B: &str = "team-b";
/// Longest wait for a watch event expected now.
const EVENT: Duration = Duration::from_secs(20);
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// One version of a test channel: its name, `spec.version` and package list (`None`: the
/// image carries none).
struct Version {
    name: &'static str,
    version: &'static str,
    packages: Option<&'static str>,
}

/// The channel `stable` of `fleet-default`.
const STABLE: [Version; 6] = [
    Version {
        name: "os-v1",
        version: "1.0.0",
        packages: Some(
            "xz|(none)|5.4.6|1.1|x86_64|obs://build/xz|0BSD\nopenssl|(none)|3.0.12|150600.3|x86_64\nglibc|(none)|2.38|1|i586\nglibc|(none)|2.40|1|x86_64\nbash|(none)|5.2.15|1.6|x86_64\n",
        ),
    },
    Version {
        name: "os-v2",
        version: "1.1.0",
        packages: Some(
            "xz|(none)|5.6.0|1.1|x86_64\nopenssl|(none)|3.0.13|150600.1|x86_64\nbash|(none)|5.2.15|1.6|x86_64\n",
        ),
    },
    Version {
        name: "os-v3",
        version: "1.2.0",
        packages: Some(
            "bash|(none)|5.2.15|1.6|x86_64\nopenssl|(none)|3.0.13|150600.2|x86_64\nxz|(none)|5.6.1|1.1|x86_64\n",
        ),
    },
    Version {
        name: "os-v4",
        version: "1.3.0",
        packages: None,
    },
    Version {
        name: "os-v5",
        version: "1.4.0",
        packages: Some("bash|(none)|5.2.15|1.6|x86_64\nopenssl|1|1.1.1|1|x86_64\n"),
    },
    Version {
        name: "os-v6",
        version: "1.5.0",
        packages: Some("xz|(none)|5.6.2|1.1|x86_64\nbash|(none)|5.2.15|1.6|x86_64\n"),
    },
];

/// The channel `edge` of `team-b`.
const EDGE: [Version; 2] = [
    Version {
        name: "edge-e1",
        version: "2.0.0",
        packages: Some("xz|(none)|5.6.1|2.1|x86_64\n"),
    },
    Version {
        name: "edge-e2",
        version: "2.1.0",
        packages: Some("xz|(none)|5.6.2|1.1|x86_64\n"),
    },
];

/// Machines: name, namespace, the image they report.
const MACHINES: [(&str, &str, &str); 9] = [
    ("m-1", FLEET_NAMESPACE, "os:1.0.0"),
    ("m-2", FLEET_NAMESPACE, "os:1.1.0"),
    ("m-3", FLEET_NAMESPACE, "os:1.2.0"),
    ("m-3b", FLEET_NAMESPACE, "os:1.2.0"),
    ("m-4", FLEET_NAMESPACE, "os:1.3.0"),
    ("m-5", FLEET_NAMESPACE, "os:1.4.0"),
    ("m-6", FLEET_NAMESPACE, "os:1.5.0"),
    ("m-u", FLEET_NAMESPACE, "os:9.9.9"),
    ("b-1", TEAM_B, "edge:2.0.0"),
];

/// The `package` block the lists of `version` give for `name`, unbounded (the model).
fn expected_block(version: &Version, name: &str) -> Value {
    let Some(list) = version.packages else {
        return serde_json::json!({"name": name, "state": "NoPackageList"});
    };
    let mut installed: Vec<(String, String)> = list
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('|').collect();
            (fields[0] == name).then(|| {
                let epoch = match fields[1] {
                    "(none)" | "0" => String::new(),
                    epoch => format!("{epoch}:"),
                };
                (
                    format!("{epoch}{}-{}", fields[2], fields[3]),
                    fields[4].to_owned(),
                )
            })
        })
        .collect();
    match installed.len() {
        0 => serde_json::json!({"name": name, "state": "Absent"}),
        1 => {
            let (evr, arch) = installed.remove(0);
            serde_json::json!({"name": name, "evr": evr, "arch": arch})
        }
        // Only glibc has several here: 2.40 (x86_64) is the highest.
        _ => {
            installed.sort_by(|a, b| a.1.cmp(&b.1));
            serde_json::json!({
                "name": name, "evr": "2.40-1", "arch": "x86_64",
                "installed": installed.iter().map(|(evr, arch)| serde_json::json!({"evr": evr, "arch": arch})).collect::<Vec<_>>(),
            })
        }
    }
}

fn entries(versions: &[Version], os: &str) -> Vec<VersionEntry> {
    versions
        .iter()
        .enumerate()
        .map(|(i, v)| VersionEntry {
            name: v.name.to_owned(),
            version: v.version.to_owned(),
            upgrade_image: format!("{os}:{}", v.version),
            created: Some(1_711_000_000 + i as i64 * 86_400),
        })
        .collect()
}

#[tokio::test]
async fn package_end_to_end() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), TEAM_B.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let result = async {
        bed.start_server_reading(&registry, &[]).await?;
        let digests = publish(&bed, &registry).await?;
        ui_fixtures_are_the_answers(&bed, &registry, &digests).await?;
        checks(&bed).await?;
        bed.ensure_running()
    }
    .await;
    bed.finish(result)
}

/// Pushes both channel images, syncs their versions as the operator does, registers the
/// machines, and waits until every machine is resolved. Returns the images' digests.
async fn publish(bed: &TestBed, registry: &Registry) -> Result<Vec<String>> {
    let mut digests = Vec::new();
    for (namespace, name, versions, os) in [
        (FLEET_NAMESPACE, "stable", &STABLE[..], OS),
        (TEAM_B, "edge", &EDGE[..], EDGE_OS),
    ] {
        let entries = entries(versions, os);
        let mut files = vec![("channel.json".to_owned(), channel_json(&entries))];
        for v in versions {
            if let Some(list) = v.packages {
                files.push((
                    format!("changelogs/{}.packages", v.name),
                    list.as_bytes().to_vec(),
                ));
            }
        }
        let tag = format!("elemental/{name}:1");
        digests.push(image::push_channel(registry, &tag, Compression::Gzip, &files).await?);
        let mut channel =
            OperatorChannel::custom(&bed.client(), namespace, name, &registry.image(&tag)).await?;
        channel.sync(&entries).await?;
    }
    for (name, namespace, image) in MACHINES {
        apply_machine(bed, name, namespace, image).await?;
    }
    poll("every machine resolved", SERVED, POLL, async || {
        let (status, body) = bed
            .admin_get_value(&format!("{GROUP_VERSION}/machineinventories"))
            .await?;
        let items = body["items"].as_array().cloned().unwrap_or_default();
        let resolved = items
            .iter()
            .filter(|m| m["current"].is_object() || m["metadata"]["name"] == "m-u")
            .count();
        Ok((status == 200 && resolved == MACHINES.len()).then_some(()))
    })
    .await?;
    Ok(digests)
}

async fn apply_machine(bed: &TestBed, name: &str, namespace: &str, image: &str) -> Result<()> {
    let yaml = format!(
        "apiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  annotations: {{elemental.cattle.io/os.image: \"registry.example.com/elemental/{image}\"}}\nspec: {{}}\n"
    );
    bed.kubectl_stdin(&["apply", "-f", "-"], &yaml).await?;
    Ok(())
}

/// The answers the UI's package page is tested on (`ui/fixtures/package/`): every version and
/// every machine with their xz block, as the server sends them.
async fn ui_fixtures_are_the_answers(
    bed: &TestBed,
    registry: &Registry,
    digests: &[String],
) -> Result<()> {
    let mut answers = BTreeMap::new();
    answers.insert(
        "versions".to_owned(),
        bed.admin_get_json::<Value>(&versions_path(None, "package=xz"))
            .await?,
    );
    answers.insert(
        "machines".to_owned(),
        bed.admin_get_json::<Value>(&machines_path(None, "package=xz"))
            .await?,
    );
    let host = registry.image("");
    let host = host.trim_end_matches('/');
    let fixed: Vec<String> = (0..digests.len())
        .map(|i| format!("sha256:{i:064}"))
        .collect();
    let mut replacements = vec![(host, "registry.example.com")];
    replacements.extend(
        digests
            .iter()
            .map(String::as_str)
            .zip(fixed.iter().map(String::as_str)),
    );
    let dir = workspace_root().join("ui/fixtures/package");
    let stale = ui_fixtures::check(&dir, &answers, &replacements)?;
    ensure!(
        stale.is_empty(),
        "ui/fixtures/package/ is out of date with the server's answers: {}. Run `{}=1 cargo test -p \
         elemental-changelog-integration --test package` and commit the result",
        stale.join(", "),
        ui_fixtures::UPDATE_ENV
    );
    Ok(())
}

async fn checks(bed: &TestBed) -> Result<()> {
    versions_carry_what_their_lists_say(bed).await?;
    bounds_select_in_rpm_order(bed).await?;
    machines_carry_their_version_s_package(bed).await?;
    tables_have_a_package_column(bed).await?;
    invalid_queries_state_the_rule(bed).await?;
    plugin_counts_machines_per_version(bed).await?;
    watches_select_as_the_lists_do(bed).await?;
    Ok(())
}

fn versions_path(namespace: Option<&str>, query: &str) -> String {
    match namespace {
        Some(ns) => format!("{GROUP_VERSION}/namespaces/{ns}/managedosversions?{query}"),
        None => format!("{GROUP_VERSION}/managedosversions?{query}"),
    }
}

fn machines_path(namespace: Option<&str>, query: &str) -> String {
    match namespace {
        Some(ns) => format!("{GROUP_VERSION}/namespaces/{ns}/machineinventories?{query}"),
        None => format!("{GROUP_VERSION}/machineinventories?{query}"),
    }
}

/// Items of a list by name, with their `package` block.
async fn listed(bed: &TestBed, path: &str) -> Result<BTreeMap<String, Value>> {
    let list: Value = bed.admin_get_json(path).await?;
    let items = list["items"]
        .as_array()
        .with_context(|| format!("{path}: {list}"))?;
    Ok(items
        .iter()
        .map(|i| {
            (
                i["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                i["package"].clone(),
            )
        })
        .collect())
}

fn names(listed: &BTreeMap<String, Value>) -> BTreeSet<&str> {
    listed.keys().map(String::as_str).collect()
}

async fn versions_carry_what_their_lists_say(bed: &TestBed) -> Result<()> {
    for name in ["xz", "openssl", "glibc", "nope"] {
        let all = listed(bed, &versions_path(None, &format!("package={name}"))).await?;
        ensure!(all.len() == STABLE.len() + EDGE.len(), "{name}: {all:?}");
        for version in STABLE.iter().chain(&EDGE) {
            let block = &all[version.name];
            let expected = expected_block(version, name);
            ensure!(
                *block == expected,
                "{name} in {}: served {block}, the list says {expected}",
                version.name
            );
        }
        // One namespace: its versions only, the same blocks.
        let one = listed(
            bed,
            &versions_path(Some(TEAM_B), &format!("package={name}")),
        )
        .await?;
        ensure!(
            names(&one) == BTreeSet::from(["edge-e1", "edge-e2"]),
            "{one:?}"
        );
        ensure!(one.iter().all(|(n, b)| all[n] == *b), "{one:?}");
    }
    // Without ?package= the items carry no block.
    let plain = listed(bed, &versions_path(None, "")).await?;
    ensure!(plain.values().all(Value::is_null), "{plain:?}");
    Ok(())
}

async fn bounds_select_in_rpm_order(bed: &TestBed) -> Result<()> {
    let cases: [(Option<&str>, &str, &[&str]); 8] = [
        // The backdoored releases: 5.6.0 and 5.6.1, every release of them.
        (
            None,
            "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2",
            &["os-v2", "os-v3", "edge-e1"],
        ),
        (
            Some(FLEET_NAMESPACE),
            "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2",
            &["os-v2", "os-v3"],
        ),
        (
            None,
            "package=xz&packageAtLeast=5.6.1-2",
            &["edge-e1", "edge-e2", "os-v6"],
        ),
        // A bound without a release compares versions only: every 3.0.13-N is not below 3.0.13.
        (None, "package=openssl&packageBelow=3.0.13", &["os-v1"]),
        (
            None,
            "package=openssl&packageBelow=3.0.13-150600.2",
            &["os-v1", "os-v2"],
        ),
        // The epoch wins over the version: 1:1.1.1 is above every 3.x.
        (
            None,
            "package=openssl&packageAtLeast=3.0.13-150600.2",
            &["os-v3", "os-v5"],
        ),
        (None, "package=openssl&packageAtLeast=1:0", &["os-v5"]),
        // Several architectures: selected when one is in the bounds, and that one is shown.
        (None, "package=glibc&packageBelow=2.39", &["os-v1"]),
    ];
    for (namespace, query, expected) in cases {
        let got = listed(bed, &versions_path(namespace, query)).await?;
        ensure!(
            names(&got) == expected.iter().copied().collect(),
            "{query}: {:?}, expected {expected:?}",
            names(&got)
        );
        ensure!(
            got.values().all(|b| b["evr"].is_string()),
            "{query}: {got:?}"
        );
    }
    let glibc = listed(bed, &versions_path(None, "package=glibc&packageBelow=2.39")).await?;
    ensure!(
        glibc["os-v1"]["evr"] == "2.38-1" && glibc["os-v1"]["arch"] == "i586",
        "{glibc:?}"
    );
    let xz = listed(
        bed,
        &versions_path(None, "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2"),
    )
    .await?;
    ensure!(
        xz["os-v2"]["evr"] == "5.6.0-1.1" && xz["edge-e1"]["evr"] == "5.6.1-2.1",
        "{xz:?}"
    );
    Ok(())
}

/// The block the version a machine reports gives (the model); `None` for a version in no
/// channel.
fn expected_machine_block(image: &str, name: &str) -> Option<Value> {
    let version = image.split_once(':').map(|(_, v)| v)?;
    STABLE
        .iter()
        .chain(&EDGE)
        .find(|v| v.version == version)
        .map(|v| expected_block(v, name))
}

async fn machines_carry_their_version_s_package(bed: &TestBed) -> Result<()> {
    let all = listed(bed, &machines_path(None, "package=xz")).await?;
    ensure!(all.len() == MACHINES.len(), "{all:?}");
    for (machine, _, image) in MACHINES {
        let block = &all[machine];
        match expected_machine_block(image, "xz") {
            Some(expected) => ensure!(
                *block == expected,
                "{machine}: {block}, expected {expected}"
            ),
            None => ensure!(
                block["state"] == "Unknown"
                    && block["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("VersionInNoChannel")),
                "{machine}: {block}"
            ),
        }
    }
    let exposed = listed(
        bed,
        &machines_path(None, "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2"),
    )
    .await?;
    ensure!(
        names(&exposed) == BTreeSet::from(["b-1", "m-2", "m-3", "m-3b"]),
        "{exposed:?}"
    );
    let here = listed(
        bed,
        &machines_path(
            Some(FLEET_NAMESPACE),
            "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2",
        ),
    )
    .await?;
    ensure!(
        names(&here) == BTreeSet::from(["m-2", "m-3", "m-3b"]),
        "{here:?}"
    );
    ensure!(here["m-3"]["evr"] == "5.6.1-1.1", "{here:?}");
    // With ?cve= too, both blocks.
    let both: Value = bed
        .admin_get_json(&machines_path(
            Some(FLEET_NAMESPACE),
            "package=xz&packageBelow=5.6.0&cve=CVE-2024-3094",
        ))
        .await?;
    let items = both["items"].as_array().context("items")?;
    ensure!(
        items.len() == 1 && items[0]["metadata"]["name"] == "m-1",
        "{both}"
    );
    ensure!(
        items[0]["cve"]["id"] == "CVE-2024-3094" && items[0]["package"]["evr"] == "5.4.6-1.1",
        "{both}"
    );
    Ok(())
}

/// A Table through the aggregator.
async fn table(bed: &TestBed, path: &str) -> Result<Value> {
    let response = bed
        .apiserver_http(Some(&bed.pki().admin))?
        .get(format!("{}{path}", bed.apiserver_url()))
        .header("Accept", TABLE)
        .send()
        .await?;
    ensure!(response.status() == 200, "{path}: {}", response.status());
    Ok(response.json().await?)
}

async fn tables_have_a_package_column(bed: &TestBed) -> Result<()> {
    for (path, name_cell) in [
        (versions_path(Some(FLEET_NAMESPACE), "package=xz"), "os-v2"),
        (machines_path(Some(FLEET_NAMESPACE), "package=xz"), "m-2"),
    ] {
        let table = table(bed, &path).await?;
        let columns = table["columnDefinitions"].as_array().context("columns")?;
        let at = columns
            .iter()
            .position(|c| c["name"] == "Package")
            .with_context(|| format!("{path}: no Package column: {table}"))?;
        let rows = table["rows"].as_array().context("rows")?;
        let row = rows
            .iter()
            .find(|r| r["cells"][0] == name_cell)
            .with_context(|| format!("{path}: no row {name_cell}"))?;
        ensure!(row["cells"][at] == "xz-5.6.0-1.1.x86_64", "{path}: {row}");
        let absent = rows
            .iter()
            .find(|r| r["cells"][0] == "os-v5" || r["cells"][0] == "m-5");
        ensure!(
            absent.is_some_and(|r| r["cells"][at] == "xz (Absent)"),
            "{path}: {absent:?}"
        );
    }
    // An empty bounded selection still has the column.
    let empty = table(bed, &versions_path(None, "package=xz&packageAtLeast=9")).await?;
    ensure!(
        empty["rows"].as_array().is_some_and(Vec::is_empty)
            && empty["columnDefinitions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["name"] == "Package")),
        "{empty}"
    );
    // kubectl prints it.
    let printed = bed
        .kubectl_ok(&[
            "get",
            "--raw",
            &versions_path(
                Some(FLEET_NAMESPACE),
                "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2",
            ),
        ])
        .await?;
    ensure!(printed.contains("\"5.6.1-1.1\""), "{printed}");
    Ok(())
}

async fn invalid_queries_state_the_rule(bed: &TestBed) -> Result<()> {
    for (query, field, rule) in [
        (
            "package=x%20y",
            "package",
            "a package name is 1 to 128 characters",
        ),
        ("package=perl(Foo)", "package", "a package name is"),
        (
            "package=xz&packageAtLeast=5.6.0-",
            "packageAtLeast",
            "an EVR is [EPOCH:]VERSION[-RELEASE]",
        ),
        ("package=xz&packageBelow=a:1", "packageBelow", "an EVR is"),
        ("packageBelow=5.6.2", "packageBelow", "needs package"),
        (
            "package=xz&packageAtLeast=5.6.2&packageBelow=5.6.0",
            "packageAtLeast",
            "must be lower than packageBelow",
        ),
    ] {
        for path in [
            versions_path(None, query),
            machines_path(Some(FLEET_NAMESPACE), query),
        ] {
            let (status, body) = bed.admin_get_value(&path).await?;
            ensure!(status == 400, "{path}: {status} {body}");
            expect_status(&body, 400, "BadRequest")?;
            let message = body["message"].as_str().unwrap_or_default();
            ensure!(
                message.starts_with(&format!("{field}: Invalid value: ")) && message.contains(rule),
                "{path}: {message}"
            );
            ensure!(
                body["details"]["causes"][0]["field"] == field,
                "{path}: {body}"
            );
        }
    }
    Ok(())
}

async fn watches_select_as_the_lists_do(bed: &TestBed) -> Result<()> {
    let range = "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2";
    let initial = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let mut versions =
        Events::open(bed, &versions_path(None, &format!("{initial}&{range}"))).await?;
    let seen: BTreeSet<String> = versions
        .initial(EVENT, "versions in the range")
        .await?
        .iter()
        .map(|o| {
            ensure!(o["package"]["evr"].is_string(), "{o}");
            Ok(o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned())
        })
        .collect::<Result<_>>()?;
    ensure!(
        seen == BTreeSet::from(["os-v2".to_owned(), "os-v3".to_owned(), "edge-e1".to_owned()]),
        "{seen:?}"
    );

    let mut machines = Events::open(
        bed,
        &machines_path(Some(FLEET_NAMESPACE), &format!("{initial}&{range}")),
    )
    .await?;
    let mut watched = Events::open(
        bed,
        &machines_path(Some(FLEET_NAMESPACE), &format!("{initial}&package=xz")),
    )
    .await?;
    let first: BTreeSet<String> = machines
        .initial(EVENT, "machines in the range")
        .await?
        .iter()
        .map(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    ensure!(
        first == BTreeSet::from(["m-2".to_owned(), "m-3".to_owned(), "m-3b".to_owned()]),
        "{first:?}"
    );
    let every = watched.initial(EVENT, "every machine with xz").await?;
    ensure!(every.len() == 8, "{every:?}");

    // m-1 upgrades into the range (5.4.6 -> 5.6.1): ADDED, with its new package.
    apply_machine(bed, "m-1", FLEET_NAMESPACE, "os:1.2.0").await?;
    let event = machines.next(EVENT, "m-1 enters the range").await?;
    ensure!(
        kind_and_name(&event) == ("ADDED".to_owned(), "m-1".to_owned()),
        "{event}"
    );
    ensure!(event["object"]["package"]["evr"] == "5.6.1-1.1", "{event}");
    let event = watched.next(EVENT, "m-1 moves").await?;
    ensure!(
        kind_and_name(&event) == ("MODIFIED".to_owned(), "m-1".to_owned()),
        "{event}"
    );
    ensure!(event["object"]["package"]["evr"] == "5.6.1-1.1", "{event}");

    // m-2 upgrades out of it (5.6.0 -> 5.6.2): DELETED.
    apply_machine(bed, "m-2", FLEET_NAMESPACE, "os:1.5.0").await?;
    let event = machines.next(EVENT, "m-2 leaves the range").await?;
    ensure!(
        kind_and_name(&event) == ("DELETED".to_owned(), "m-2".to_owned()),
        "{event}"
    );
    let event = watched.next(EVENT, "m-2 moves").await?;
    ensure!(
        kind_and_name(&event) == ("MODIFIED".to_owned(), "m-2".to_owned())
            && event["object"]["package"]["evr"] == "5.6.2-1.1",
        "{event}"
    );
    // The list agrees.
    let now = listed(bed, &machines_path(Some(FLEET_NAMESPACE), range)).await?;
    ensure!(
        names(&now) == BTreeSet::from(["m-1", "m-3", "m-3b"]),
        "{now:?}"
    );
    Ok(())
}

/// `kubectl elemental package`: the versions (the server's Table), then the machines counted
/// per version, then the machines; the counts are those of the machine list.
async fn plugin_counts_machines_per_version(bed: &TestBed) -> Result<()> {
    let range = "package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2";
    let out = kubectl_elemental(
        bed,
        &[
            "package",
            "xz",
            "--at-least",
            "5.6.0",
            "--below",
            "5.6.2",
            "-A",
        ],
    )?;
    let (versions, rest) = out
        .split_once("\nMachines running xz in [5.6.0, 5.6.2) (4), per version:\n")
        .with_context(|| format!("no machine counts:\n{out}"))?;
    let header = versions.lines().next().unwrap_or_default();
    ensure!(
        header.starts_with("NAMESPACE") && header.trim_end().ends_with("PACKAGE"),
        "{out}"
    );
    let listed: BTreeSet<&str> = versions
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    ensure!(
        listed == BTreeSet::from(["edge-e1", "os-v2", "os-v3"]),
        "{out}"
    );
    let (counts, machines) = rest.split_once("\n\n").with_context(|| out.clone())?;
    let printed: BTreeMap<(String, String, String), usize> = counts
        .lines()
        .skip(1)
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            ensure!(cells.len() == 4, "{line}");
            Ok((
                (
                    cells[0].to_owned(),
                    cells[1].to_owned(),
                    cells[2].to_owned(),
                ),
                cells[3].parse()?,
            ))
        })
        .collect::<Result<_>>()?;
    let list: Value = bed.admin_get_json(&machines_path(None, range)).await?;
    let mut expected: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for m in list["items"].as_array().context("items")? {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let package = format!(
            "xz-{}.{}",
            text(&m["package"]["evr"]),
            text(&m["package"]["arch"])
        );
        *expected
            .entry((
                text(&m["metadata"]["namespace"]),
                text(&m["current"]["version"]),
                package,
            ))
            .or_default() += 1;
    }
    ensure!(
        printed == expected,
        "printed {printed:?}, listed {expected:?}\n{out}"
    );
    ensure!(machines.lines().count() == 1 + 4, "{out}");
    Ok(())
}
