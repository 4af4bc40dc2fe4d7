//! docs/api.md's list and watch examples against the server's real answers, end to end
//! through the aggregator on the real test bed: every `kubectl get --raw` of a list or a
//! watch that is followed by a JSON block is sent as written (the CVE id swapped for one the
//! test's channel fixes), and what the example shows is compared with what comes back:
//!
//! - a list: its kind, whether its `resourceVersion` is empty, and of its first item the kind,
//!   the metadata fields shown and whose `resourceVersion` it carries (kube-apiserver's, the
//!   ManagedOSVersion's or MachineInventory's own, shown in the example as a short number; or
//!   this server's, a long one);
//! - a watch: the sequence of event types (a run of the same type shown once), the objects'
//!   kinds and metadata fields, annotations as shown, and an `ERROR`'s `Status` as shown.
//!
//! The comparison is checked to fail on a changed example (a list's `resourceVersion` shown
//! empty, a watch's event missing). Needs `make server` and the test bed.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::{
    fixtures::OperatorChannel,
    generated::Listing,
    markdown::Document,
    paths::GROUP_VERSION,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions},
    wait::{POLL, poll},
};
use serde_json::Value;

const OS: &str = "registry.example.com/elemental/os";
/// Longest wait for an answer or an event expected now.
const WAIT: Duration = Duration::from_secs(20);
/// A `resourceVersion` shown with at most this many digits is kube-apiserver's (the object's
/// own); a longer one is this server's.
const SHORT_RESOURCE_VERSION: usize = 8;

/// One example: the `kubectl get --raw` path and the JSON values shown after it (one for a
/// list, one per line for a watch).
#[derive(Clone, Debug)]
struct Example {
    line: usize,
    path: String,
    shown: Vec<Value>,
}

impl Example {
    fn is_watch(&self) -> bool {
        self.path.contains("watch=true")
    }
}

/// The examples of `doc`: a `sh` block of one `kubectl get --raw` of a list (of
/// `managedosversions` or `machineinventories`), followed by a `json` block.
fn examples(doc: &Document) -> Result<Vec<Example>> {
    let lines: Vec<&str> = doc.text.lines().collect();
    let mut found = Vec::new();
    for (first, block) in doc.code_blocks("sh") {
        let [command] = block.as_slice() else {
            continue;
        };
        let Some(path) = command.strip_prefix("kubectl get --raw ") else {
            continue;
        };
        let path = path.trim().trim_matches('\'').trim_matches('"').to_owned();
        let resource = path.split('?').next().unwrap_or_default();
        if !(resource.ends_with("/managedosversions") || resource.ends_with("/machineinventories"))
        {
            continue;
        }
        // The next non-blank line after the block's closing fence opens a json block.
        let close = first + block.len(); // 1-based line of the closing fence
        let next = lines
            .iter()
            .enumerate()
            .skip(close)
            .find(|(_, l)| !l.trim().is_empty());
        let Some((at, "```json")) = next.map(|(at, l)| (at, l.trim_end())) else {
            continue;
        };
        let body: Vec<&str> = lines[at + 1..]
            .iter()
            .take_while(|l| l.trim_end() != "```")
            .copied()
            .collect();
        let shown = if path.contains("watch=true") {
            body.iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l))
                .collect::<Result<Vec<Value>, _>>()
        } else {
            serde_json::from_str(&body.join("\n")).map(|v| vec![v])
        }
        .with_context(|| format!("{}: the JSON after the command", doc.at(at + 1)))?;
        found.push(Example {
            line: first,
            path,
            shown,
        });
    }
    Ok(found)
}

/// What a list or an object shows of its metadata: the field names.
fn metadata_fields(object: &Value) -> Vec<String> {
    object["metadata"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn resource_version(object: &Value) -> &str {
    object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
}

/// Whose `resourceVersion` an item carries, as an example shows it.
fn shown_owner(rv: &str) -> &'static str {
    if rv.is_empty() {
        "none"
    } else if rv.len() <= SHORT_RESOURCE_VERSION {
        "kube-apiserver's"
    } else {
        "this server's"
    }
}

/// What the server sent for `example` against what the example shows; `objects` holds
/// kube-apiserver's `resourceVersion` of each ManagedOSVersion and MachineInventory by name.
fn problems(
    doc: &Document,
    example: &Example,
    sent: &[Value],
    objects: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let at = doc.at(example.line);
    let mut differences = Vec::new();
    if example.is_watch() {
        watch_differences(&example.shown, sent, &mut differences);
    } else {
        list_differences(&example.shown, sent, objects, &mut differences);
    }
    differences
        .into_iter()
        .map(|d| format!("{at}: {}: {d}", example.path))
        .collect()
}

/// Notes `what` when the example shows `shown` and the server sends `real`.
fn differ(
    out: &mut Vec<String>,
    what: &str,
    shown: &dyn std::fmt::Debug,
    real: &dyn std::fmt::Debug,
) {
    let (shown, real) = (format!("{shown:?}"), format!("{real:?}"));
    if shown != real {
        out.push(format!(
            "{what}: the example shows {shown}, the server sends {real}"
        ));
    }
}

/// The metadata fields `shown` has and `real` lacks.
fn missing_fields(shown: &Value, real: &Value) -> Vec<String> {
    metadata_fields(shown)
        .into_iter()
        .filter(|f| real["metadata"].get(f).is_none())
        .collect()
}

fn watch_differences(shown: &[Value], sent: &[Value], out: &mut Vec<String>) {
    let shown = collapse(shown);
    let real = collapse(sent);
    differ(
        out,
        "event types",
        &shown.iter().map(|e| &e["type"]).collect::<Vec<_>>(),
        &real.iter().map(|e| &e["type"]).collect::<Vec<_>>(),
    );
    for (shown, real) in shown.iter().zip(&real) {
        let (shown, real) = (&shown["object"], &real["object"]);
        differ(out, "an event object's kind", &shown["kind"], &real["kind"]);
        if shown["kind"] == "Status" {
            for field in ["message", "reason", "code"] {
                differ(out, field, &shown[field], &real[field]);
            }
            continue;
        }
        differ(
            out,
            "metadata fields shown but not sent",
            &missing_fields(shown, real),
            &Vec::<String>::new(),
        );
        differ(
            out,
            "annotations",
            &shown["metadata"]["annotations"],
            &real["metadata"]["annotations"],
        );
        differ(
            out,
            "an empty resourceVersion",
            &resource_version(shown).is_empty(),
            &resource_version(real).is_empty(),
        );
    }
}

fn list_differences(
    shown: &[Value],
    sent: &[Value],
    objects: &std::collections::BTreeMap<String, String>,
    out: &mut Vec<String>,
) {
    let (Some(shown), Some(real)) = (shown.first(), sent.first()) else {
        out.push("nothing to compare".to_owned());
        return;
    };
    differ(out, "kind", &shown["kind"], &real["kind"]);
    differ(
        out,
        "an empty list resourceVersion",
        &resource_version(shown).is_empty(),
        &resource_version(real).is_empty(),
    );
    let (Some(shown_item), Some(real_item)) = (shown["items"].get(0), real["items"].get(0)) else {
        out.push("no item to compare".to_owned());
        return;
    };
    differ(
        out,
        "an item's kind",
        &shown_item["kind"],
        &real_item["kind"],
    );
    differ(
        out,
        "item metadata fields shown but not sent",
        &missing_fields(shown_item, real_item),
        &Vec::<String>::new(),
    );
    let real_rv = resource_version(real_item);
    let name = real_item["metadata"]["name"].as_str().unwrap_or_default();
    let real_owner = if real_rv.is_empty() {
        "none"
    } else if objects.get(name).map(String::as_str) == Some(real_rv) {
        "kube-apiserver's"
    } else {
        "this server's"
    };
    differ(
        out,
        "whose resourceVersion an item carries",
        &shown_owner(resource_version(shown_item)),
        &real_owner,
    );
}

/// Events with a run of the same type kept once (its first).
fn collapse(events: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for event in events {
        if out.last().is_none_or(|last| last["type"] != event["type"]) {
            out.push(event.clone());
        }
    }
    out
}

/// The first events of the watch `path` until as many runs of one type as `runs` have
/// started (or the stream ends, or [`WAIT`] passes).
async fn watch_events(bed: &TestBed, path: &str, runs: usize) -> Result<Vec<Value>> {
    let mut response = bed
        .apiserver_http(Some(&bed.pki().admin))?
        .get(format!("{}{path}", bed.apiserver_url()))
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    ensure!(
        response.status() == 200,
        "GET {path}: {}",
        response.status()
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    loop {
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            events.push(serde_json::from_slice::<Value>(&line)?);
            if collapse(&events).len() == runs {
                return Ok(events);
            }
        }
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) | Ok(Ok(None)) => return Ok(events),
            Ok(Ok(Some(chunk))) => buffer.extend_from_slice(&chunk),
            Ok(Err(error)) => return Err(error.into()),
        }
    }
}

/// `path` with its `cve=` value replaced by `cve`.
fn with_cve(path: &str, cve: &str) -> String {
    let Some(start) = path.find("cve=") else {
        return path.to_owned();
    };
    let value = start + "cve=".len();
    let end = path[value..].find('&').map_or(path.len(), |e| value + e);
    format!("{}{cve}{}", &path[..value], &path[end..])
}

#[tokio::test]
async fn api_md_list_and_watch_examples_are_what_the_server_sends() -> Result<()> {
    let doc = Document::read("docs/api.md")?;
    let examples = examples(&doc)?;
    let lists = examples.iter().filter(|e| !e.is_watch()).count();
    ensure!(
        lists >= 2 && examples.len() - lists >= 2,
        "{}: found {lists} list and {} watch examples",
        doc.path,
        examples.len() - lists
    );
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let result = async {
        bed.start_server_reading(&registry, &[]).await?;
        checks(&bed, &registry, &doc, &examples).await?;
        bed.ensure_running()
    }
    .await;
    bed.finish(result)
}

/// A channel of three versions fixing a CVE, and a machine on the oldest; the CVE, and
/// kube-apiserver's `resourceVersion` of each ManagedOSVersion and MachineInventory by name.
async fn set_up(
    bed: &TestBed,
    registry: &Registry,
) -> Result<(String, std::collections::BTreeMap<String, String>)> {
    let stable = Listing::generate("stable", 1, 1..=3);
    let (mut channel, entries) = OperatorChannel::of_listing(
        &bed.client(),
        registry,
        &stable,
        (FLEET_NAMESPACE, "stable", "elemental/stable:1"),
        OS,
    )
    .await?;
    channel.sync(&entries).await?;
    // A CVE the newest version's changelog (against the one before it) fixes.
    let cve = stable
        .versions
        .iter()
        .rev()
        .take(1)
        .flat_map(|v| stable.advisories(&v.name))
        .flat_map(|a| a.cves.clone())
        .next()
        .context("the generated channel fixes no CVE")?;
    let machine = format!(
        "apiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: m-a\n  namespace: {FLEET_NAMESPACE}\n  annotations: {{elemental.cattle.io/os.image: \"{OS}:{}\"}}\nspec: {{}}\n",
        entries[0].version
    );
    bed.kubectl_stdin(&["apply", "-f", "-"], &machine).await?;
    // Every version available and the machine resolved, as the examples assume.
    let versions = format!("{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/managedosversions");
    let machines = format!("{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/machineinventories");
    poll(
        "the versions available and the machine resolved",
        WAIT,
        POLL,
        async || {
            let (_, listed) = bed.admin_get_value(&versions).await?;
            let (_, fleet) = bed.admin_get_value(&machines).await?;
            let available = listed["items"].as_array().is_some_and(|i| {
                i.len() == entries.len() && i.iter().all(|v| v["available"] == true)
            });
            let resolved = fleet["items"]
                .as_array()
                .is_some_and(|i| i.iter().any(|m| m["state"] == "UpdatesAvailable"));
            Ok((available && resolved).then_some(()))
        },
    )
    .await?;
    Ok((cve, kube_resource_versions(bed).await?))
}

/// kube-apiserver's `resourceVersion` of each ManagedOSVersion and MachineInventory, by name.
async fn kube_resource_versions(
    bed: &TestBed,
) -> Result<std::collections::BTreeMap<String, String>> {
    let mut objects = std::collections::BTreeMap::new();
    for kind in ["managedosversions", "machineinventories"] {
        let (_, list) = bed
            .admin_get_value(&format!(
                "/apis/elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/{kind}"
            ))
            .await?;
        for item in list["items"].as_array().into_iter().flatten() {
            objects.insert(
                item["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                resource_version(item).to_owned(),
            );
        }
    }

    Ok(objects)
}

async fn checks(
    bed: &TestBed,
    registry: &Registry,
    doc: &Document,
    examples: &[Example],
) -> Result<()> {
    let (cve, objects) = set_up(bed, registry).await?;
    let mut all = Vec::new();
    let mut sent = Vec::new();
    for example in examples {
        let path = with_cve(&example.path, &cve);
        let answer = if example.is_watch() {
            watch_events(bed, &path, collapse(&example.shown).len()).await?
        } else {
            let (status, body) = bed.admin_get_value(&path).await?;
            ensure!(status == 200, "{path}: {status} {body}");
            vec![body]
        };
        eprintln!("{path}:\n  {answer:?}");
        all.extend(problems(doc, example, &answer, &objects));
        sent.push(answer);
    }
    ensure!(all.is_empty(), "{}", all.join("\n"));

    // A changed example is caught: a list's resourceVersion shown empty, a `?cve=` list's
    // shown set, a watch's last event left out.
    let mut caught = Vec::new();
    for (example, answer) in examples.iter().zip(&sent) {
        let mut changed = example.clone();
        if changed.is_watch() {
            changed.shown.pop();
            if changed.shown.is_empty() {
                continue;
            }
        } else {
            let rv = resource_version(&changed.shown[0]).is_empty();
            changed.shown[0]["metadata"]["resourceVersion"] =
                Value::from(if rv { "4841062832750621" } else { "" });
        }
        caught.push(!problems(doc, &changed, answer, &objects).is_empty());
    }
    ensure!(
        caught.iter().all(|c| *c) && caught.len() >= 3,
        "a changed example went unnoticed: {caught:?}"
    );
    Ok(())
}
