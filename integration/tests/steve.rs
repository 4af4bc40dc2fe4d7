//! Native in Rancher (issue 31), proven by Rancher's own Steve (`github.com/rancher/steve`, the
//! release pinned in `integration/testbed/steve/go.mod`) in front of the test bed's
//! kube-apiserver, as Rancher's cluster explorer reaches a cluster:
//! - Steve's schemas of both types (their verbs and Table columns, `Age` typed `date`);
//! - lists by namespace with `metadata.fields`, the state badge Steve computes
//!   (`metadata.state`) and a uid of each object's own;
//! - `/v1/counts`;
//! - `/v1/subscribe` events for a MachineInventory's create, change and delete;
//! - a re-watch from a revision as the dashboard keeps it (a JavaScript Number) resumes without
//!   a loop;
//! - a user sees through Steve exactly what the API lets them read;
//! - after our server restarts, the dashboard's resync (the `too old` path) brings events back;
//! - `--sql-cache` (Rancher 2.12's default): list, sort by a column, and an `Age` that advances.
//!
//! Times are printed (`--nocapture`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiservice::{MACHINE_RESOURCE, RESOURCE, identity};
use elemental_changelog_integration::{
    fixtures::OperatorChannel,
    generated::Listing,
    paths::GROUP_VERSION,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, Steve, SteveCache, Subscription, TestBed, TestBedOptions},
    wait::{POLL, SERVED, SOON, poll},
};
use serde_json::{Value, json};

const OS: &str = "registry.example.com/elemental/os";
/// Steve's schema ids: `<group>.<kind>`, lower-cased.
const MACHINES: &str = "changelog.elemental.cattle.io.machineinventorychangelogsummary";
const VERSIONS: &str = "changelog.elemental.cattle.io.managedosversionchangelogsummary";
/// A second namespace, where alice may read.
const TEAM: &str = "team-b";
/// Longest wait for an event expected now.
const EVENT: Duration = Duration::from_secs(20);
/// How long a subscription must stay without a stop to show that it holds.
const QUIET: Duration = Duration::from_secs(3);
/// More re-watches and resyncs than this in one wait is a loop.
const LOOP: usize = 20;
/// The dashboard waits 5 s before a re-watch after a `resource.stop`; shorter here: what is
/// counted is how many re-watches it takes.
const REWATCH_DELAY: Duration = Duration::from_millis(500);

#[tokio::test]
async fn steve_end_to_end() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), TEAM.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let result = async {
        start_server(&mut bed, &registry).await?;
        let entries = fleet(&bed, &registry).await?;
        let steve = bed.start_steve(SteveCache::Memory).await?;
        let checked = async {
            schemas(&steve).await?;
            lists(&bed, &steve).await?;
            counts(&steve).await?;
            events(&bed, &steve, &entries).await?;
            javascript_revisions(&bed, &steve, &entries).await?;
            readers(&bed, &steve).await?;
            restart(&mut bed, &steve, &entries).await
        }
        .await;
        with_log(checked, &steve)?;
        let sql = bed.start_steve(SteveCache::Sql).await?;
        with_log(sql_cache(&sql).await, &sql)?;
        bed.ensure_running()
    }
    .await;
    bed.finish(result)
}

/// Starts our server as the chart runs it: two replicas (its default `replicaCount`) behind one
/// Service address, as the chart's ServiceAccount, reading `registry`.
async fn start_server(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    bed.start_replicas(2, &registry.server_flags()?).await
}

/// `result`, with the end of Steve's log when it is an error.
fn with_log<T>(result: Result<T>, steve: &Steve) -> Result<T> {
    result.with_context(|| format!("Steve's log ends:\n{}", steve.process().tail(4096)))
}

/// A channel of four versions, and machines: `m-a` with updates, `m-b` up to date, `m-u`
/// Unknown (no OS annotation); in `team-b`, `t-u` (Unknown). Returns the versions the
/// machines can report.
async fn fleet(bed: &TestBed, registry: &Registry) -> Result<Vec<String>> {
    let stable = Listing::generate("stable", 1, 1..=4);
    let (mut channel, entries) = OperatorChannel::of_listing(
        &bed.client(),
        registry,
        &stable,
        (FLEET_NAMESPACE, "stable", "elemental/stable:1"),
        OS,
    )
    .await?;
    channel.sync(&entries).await?;
    let versions: Vec<String> = entries.iter().map(|e| e.version.clone()).collect();
    let newest = versions.last().context("no version")?;
    apply(bed, &inventory(FLEET_NAMESPACE, "m-a", Some(&versions[0]))).await?;
    apply(bed, &inventory(FLEET_NAMESPACE, "m-b", Some(newest))).await?;
    apply(bed, &inventory(FLEET_NAMESPACE, "m-u", None)).await?;
    apply(bed, &inventory(TEAM, "t-u", None)).await?;
    for (name, state) in [
        ("m-a", "UpdatesAvailable"),
        ("m-b", "UpToDate"),
        ("m-u", "Unknown"),
    ] {
        wait_state(bed, name, state).await?;
    }
    Ok(versions)
}

fn inventory(namespace: &str, name: &str, version: Option<&str>) -> String {
    let annotations = version.map_or_else(
        || "{}".to_owned(),
        |v| format!("{{elemental.cattle.io/os.image: \"{OS}:{v}\"}}"),
    );
    format!(
        "apiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  annotations: {annotations}\nspec: {{}}\n"
    )
}

async fn apply(bed: &TestBed, yaml: &str) -> Result<()> {
    bed.kubectl_stdin(&["apply", "-f", "-"], yaml).await?;
    Ok(())
}

/// Waits until this API shows machine `name` of `fleet-default` in `state`.
async fn wait_state(bed: &TestBed, name: &str, state: &str) -> Result<()> {
    let path = format!("{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/{MACHINE_RESOURCE}/{name}");
    poll(&format!("{name} {state}"), SERVED, POLL, async || {
        let (status, body) = bed.admin_get_value(&path).await?;
        Ok((status == 200 && body["state"] == state).then_some(()))
    })
    .await?;
    Ok(())
}

/// Both types are Steve types (Steve keeps only types with `list` and `watch`), read-only, with
/// our Table's columns; `Age` typed `date` as CRDs type it.
async fn schemas(steve: &Steve) -> Result<()> {
    let started = Instant::now();
    for id in [MACHINES, VERSIONS] {
        let (schema, _) = poll(&format!("Steve's schema {id}"), SOON, POLL, async || {
            let (status, body) = steve.get(None, &format!("/v1/schemas/{id}")).await?;
            Ok((status == 200 && body["attributes"]["columns"].is_array()).then_some(body))
        })
        .await?;
        let attributes = &schema["attributes"];
        ensure!(
            attributes["group"] == "changelog.elemental.cattle.io",
            "{schema}"
        );
        ensure!(attributes["version"] == "v1beta1", "{schema}");
        ensure!(attributes["namespaced"] == true, "{schema}");
        let verbs: BTreeSet<&str> = strings(&attributes["verbs"]);
        ensure!(
            verbs == BTreeSet::from(["get", "list", "watch"]),
            "{schema}"
        );
        ensure!(
            strings(&schema["collectionMethods"]) == BTreeSet::from(["GET"]),
            "{schema}"
        );
        ensure!(
            strings(&schema["resourceMethods"]) == BTreeSet::from(["GET"]),
            "{schema}"
        );
        let columns = attributes["columns"].as_array().context("columns")?;
        let names: Vec<&str> = columns.iter().filter_map(|c| c["name"].as_str()).collect();
        ensure!(names.first() == Some(&"Name"), "{names:?}");
        let age = columns
            .iter()
            .find(|c| c["name"] == "Age")
            .with_context(|| format!("no Age column: {names:?}"))?;
        ensure!(age["type"] == "date", "{age}");
    }
    let machines = steve
        .get_ok(None, &format!("/v1/schemas/{MACHINES}"))
        .await?;
    ensure!(
        machines["attributes"]["resource"] == MACHINE_RESOURCE,
        "{machines}"
    );
    eprintln!("Steve's schemas of both types: {:?}", started.elapsed());
    Ok(())
}

fn strings(value: &Value) -> BTreeSet<&str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// Steve's list of `schema` in `namespace` (`None`: every namespace it may read) as `user`.
async fn list(
    steve: &Steve,
    user: Option<&str>,
    schema: &str,
    namespace: Option<&str>,
) -> Result<Value> {
    let path = match namespace {
        Some(namespace) => format!("/v1/{schema}/{namespace}"),
        None => format!("/v1/{schema}"),
    };
    steve.get_ok(user, &path).await
}

/// The items of a Steve collection by id (`namespace/name`).
fn by_id(collection: &Value) -> Result<BTreeMap<String, Value>> {
    collection["data"]
        .as_array()
        .with_context(|| format!("not a collection: {collection}"))?
        .iter()
        .map(|item| {
            let id = item["id"]
                .as_str()
                .with_context(|| format!("no id: {item}"))?;
            Ok((id.to_owned(), item.clone()))
        })
        .collect()
}

/// The index of column `name` in `schema`'s columns (and so in `metadata.fields`).
async fn column(steve: &Steve, schema: &str, name: &str) -> Result<usize> {
    let schema = steve.get_ok(None, &format!("/v1/schemas/{schema}")).await?;
    schema["attributes"]["columns"]
        .as_array()
        .and_then(|columns| columns.iter().position(|c| c["name"] == name))
        .with_context(|| format!("no column {name}: {schema}"))
}

/// Lists by namespace: `metadata.fields` are our Table's cells (`Age` the creation timestamp),
/// `metadata.state` the state badge, each object with a uid of its own.
async fn lists(bed: &TestBed, steve: &Steve) -> Result<()> {
    let listed = list(steve, None, MACHINES, Some(FLEET_NAMESPACE)).await?;
    let items = by_id(&listed)?;
    let ids: Vec<&str> = items.keys().map(String::as_str).collect();
    ensure!(
        ids == [
            "fleet-default/m-a",
            "fleet-default/m-b",
            "fleet-default/m-u"
        ],
        "{ids:?}"
    );
    let age = column(steve, MACHINES, "Age").await?;
    let state = column(steve, MACHINES, "State").await?;
    let operator: Value = bed
        .admin_get_json(&format!(
            "/apis/elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/machineinventories"
        ))
        .await?;
    for (id, item) in &items {
        let fields = item["metadata"]["fields"]
            .as_array()
            .with_context(|| format!("no fields: {item}"))?;
        ensure!(fields[0] == item["metadata"]["name"], "{item}");
        ensure!(fields[state] == item["state"], "{item}");
        ensure!(
            fields[age] == item["metadata"]["creationTimestamp"],
            "Age of {id}: {item}"
        );
        let source = operator["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["metadata"]["name"] == item["metadata"]["name"])
            .with_context(|| format!("no MachineInventory {id}"))?;
        let source_uid = source["metadata"]["uid"].as_str().context("uid")?;
        ensure!(
            item["metadata"]["uid"] == identity::uid(MACHINE_RESOURCE, source_uid).as_str()
                && item["metadata"]["uid"] != source_uid,
            "{id}: a uid of its own, not the MachineInventory's {source_uid}: {item}"
        );
    }
    let badge = |id: &str| items[id]["metadata"]["state"].clone();
    ensure!(
        badge("fleet-default/m-a")["name"] == "updates-available",
        "{}",
        badge("fleet-default/m-a")
    );
    ensure!(
        badge("fleet-default/m-b")["name"] == "up-to-date",
        "{}",
        badge("fleet-default/m-b")
    );
    let unknown = badge("fleet-default/m-u");
    ensure!(
        unknown["name"] == "unknown"
            && unknown["error"] == true
            && unknown["message"].as_str().is_some_and(|m| !m.is_empty()),
        "an Unknown machine is an error with its reason: {unknown}"
    );

    let versions = by_id(&list(steve, None, VERSIONS, Some(FLEET_NAMESPACE)).await?)?;
    ensure!(versions.len() == 4, "{:?}", versions.keys());
    let operator: Value = bed
        .admin_get_json(&format!(
            "/apis/elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/managedosversions"
        ))
        .await?;
    for (id, item) in &versions {
        ensure!(
            item["metadata"]["state"]["name"] == "available",
            "{id}: {item}"
        );
        let fields = item["metadata"]["fields"]
            .as_array()
            .with_context(|| format!("no fields: {item}"))?;
        ensure!(fields[0] == item["metadata"]["name"], "{item}");
        let source = operator["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["metadata"]["name"] == item["metadata"]["name"])
            .with_context(|| format!("no ManagedOSVersion {id}"))?;
        let source_uid = source["metadata"]["uid"].as_str().context("uid")?;
        ensure!(
            item["metadata"]["uid"] == identity::uid(RESOURCE, source_uid).as_str(),
            "{id}: a uid of its own, not the ManagedOSVersion's {source_uid}: {item}"
        );
    }
    Ok(())
}

/// `/v1/counts`: both types, per namespace.
async fn counts(steve: &Steve) -> Result<()> {
    let counts = steve.get_ok(None, "/v1/counts").await?;
    let count = counts["data"]
        .as_array()
        .and_then(|d| d.first())
        .with_context(|| format!("no count: {counts}"))?;
    let machines = &count["counts"][MACHINES];
    ensure!(machines["summary"]["count"] == 4, "{machines}");
    ensure!(
        machines["namespaces"][FLEET_NAMESPACE]["count"] == 3,
        "{machines}"
    );
    ensure!(machines["namespaces"][TEAM]["count"] == 1, "{machines}");
    let versions = &count["counts"][VERSIONS];
    ensure!(versions["summary"]["count"] == 4, "{versions}");
    Ok(())
}

/// A subscription as the dashboard holds one: the revision it would resume from (a JavaScript
/// Number), the re-watches and resyncs it made.
struct Dashboard {
    socket: Subscription,
    schema: &'static str,
    namespace: &'static str,
    /// The list's revision and the objects' resourceVersions, as `parseInt` reads them.
    list_revision: f64,
    objects: BTreeMap<String, f64>,
    rewatches: usize,
    resyncs: usize,
    /// Steve said "failed to find schema": its discovery of our group went stale (our server
    /// restarting). The dashboard marks the type in error and re-watches once it is back.
    schema_missing: bool,
}

/// `parseInt(revision, 10)`: a JavaScript Number, exact only below 2^53.
fn js_number(revision: &str) -> f64 {
    revision.parse().unwrap_or(0.0)
}

/// `${revision}`: how the dashboard sends a Number back (the shortest digits that read back as
/// the same Number, then zeros: `String(4916360690484117504)` is `"4916360690484118000"`).
fn js_text(revision: f64) -> String {
    format!("{revision}")
}

impl Dashboard {
    /// Lists `schema` in `namespace` as the dashboard does (`findAll`), then watches from the
    /// revision it keeps.
    async fn open(steve: &Steve, schema: &'static str, namespace: &'static str) -> Result<Self> {
        let mut dashboard = Self {
            socket: steve.subscribe(None).await?,
            schema,
            namespace,
            list_revision: 0.0,
            objects: BTreeMap::new(),
            rewatches: 0,
            resyncs: 0,
            schema_missing: false,
        };
        dashboard.resync(steve).await?;
        Ok(dashboard)
    }

    /// `nextResourceVersion`: the largest of the list's revision and the objects'.
    fn revision(&self) -> f64 {
        self.objects
            .values()
            .copied()
            .fold(self.list_revision, f64::max)
    }

    /// `resyncWatch`: lists again, then watches from the new revision.
    async fn resync(&mut self, steve: &Steve) -> Result<()> {
        let listed = list(steve, None, self.schema, Some(self.namespace)).await?;
        self.list_revision = js_number(listed["revision"].as_str().unwrap_or_default());
        self.objects = by_id(&listed)?
            .into_iter()
            .map(|(id, item)| {
                (
                    id,
                    js_number(
                        item["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or_default(),
                    ),
                )
            })
            .collect();
        self.watch().await
    }

    async fn watch(&mut self) -> Result<()> {
        let mut message = json!({"resourceType": self.schema, "namespace": self.namespace});
        let revision = self.revision();
        if revision > 0.0 {
            message["resourceVersion"] = json!(js_text(revision));
        }
        self.socket.send(&message).await
    }

    /// Follows the subscription as the dashboard does (a `resource.stop` is a re-watch from the
    /// kept revision, a `resource.error` saying "too old" a resync) until an object event for
    /// which `wanted` holds, for at most `within`. Returns that event.
    async fn until(
        &mut self,
        steve: &Steve,
        within: Duration,
        wanted: impl FnMut(&Value) -> bool,
    ) -> Result<Value> {
        self.within(steve, within, wanted).await?.with_context(|| {
            format!(
                "no wanted event within {within:?} ({} re-watches, {} resyncs)",
                self.rewatches, self.resyncs
            )
        })
    }

    /// [`Dashboard::until`], `None` when `within` passes first.
    async fn within(
        &mut self,
        steve: &Steve,
        within: Duration,
        mut wanted: impl FnMut(&Value) -> bool,
    ) -> Result<Option<Value>> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = match self.socket.next(left).await? {
                Some(_) if left.is_zero() => None,
                event => event,
            };
            let Some(event) = event else {
                return Ok(None);
            };
            ensure!(
                self.rewatches + self.resyncs <= LOOP,
                "the dashboard loops: {} re-watches and {} resyncs, the last from revision {}",
                self.rewatches,
                self.resyncs,
                js_text(self.revision())
            );
            if event["resourceType"] != self.schema {
                continue;
            }
            if self.follow(steve, &event).await? && wanted(&event) {
                return Ok(Some(event));
            }
        }
    }

    /// Applies one event as the dashboard does; true for an object event.
    async fn follow(&mut self, steve: &Steve, event: &Value) -> Result<bool> {
        match event["name"].as_str().unwrap_or_default() {
            "resource.create" | "resource.change" => {
                let data = &event["data"];
                let id = data["id"].as_str().unwrap_or_default().to_owned();
                let revision = js_number(
                    data["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default(),
                );
                self.objects.insert(id, revision);
                Ok(true)
            }
            "resource.remove" => {
                self.objects
                    .remove(event["data"]["id"].as_str().unwrap_or_default());
                Ok(true)
            }
            "resource.error" => {
                let error = event["data"]["error"]
                    .as_str()
                    .unwrap_or_default()
                    .to_lowercase();
                eprintln!("dashboard: resource.error {error}");
                if error.contains("too old") {
                    self.resyncs += 1;
                    self.resync(steve).await?;
                }
                self.schema_missing |= error.contains("failed to find schema");
                Ok(false)
            }
            "resource.stop" => {
                self.rewatches += 1;
                tokio::time::sleep(REWATCH_DELAY).await;
                if self.schema_missing {
                    let path = format!("/v1/schemas/{}", self.schema);
                    poll("the type back in Steve", SOON, POLL, async || {
                        Ok((steve.get(None, &path).await?.0 == 200).then_some(()))
                    })
                    .await?;
                    self.schema_missing = false;
                }
                self.watch().await?;
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    /// Fails when the subscription stops or errs during [`QUIET`].
    async fn holds(&mut self, steve: &Steve) -> Result<()> {
        let until = Instant::now() + QUIET;
        while let Some(event) = self
            .socket
            .next(until.saturating_duration_since(Instant::now()))
            .await?
        {
            let name = event["name"].as_str().unwrap_or_default().to_owned();
            self.follow(steve, &event).await?;
            ensure!(
                name != "resource.stop" && name != "resource.error",
                "{event}"
            );
        }
        Ok(())
    }
}

fn named(event: &Value, name: &str, id: &str) -> bool {
    event["name"] == name && event["data"]["id"] == id
}

/// `/v1/subscribe`: a MachineInventory created, changed and deleted reaches the subscriber
/// within [`EVENT`] (the times are printed).
async fn events(bed: &TestBed, steve: &Steve, versions: &[String]) -> Result<()> {
    let mut dashboard = Dashboard::open(steve, MACHINES, FLEET_NAMESPACE).await?;
    let start = dashboard
        .socket
        .next(EVENT)
        .await?
        .context("no resource.start")?;
    ensure!(start["name"] == "resource.start", "{start}");
    let id = "fleet-default/m-c";

    let started = Instant::now();
    apply(bed, &inventory(FLEET_NAMESPACE, "m-c", Some(&versions[1]))).await?;
    let created = dashboard
        .until(steve, EVENT, |e| {
            named(e, "resource.create", id) || named(e, "resource.change", id)
        })
        .await?;
    let create = started.elapsed();
    let started = Instant::now();
    apply(
        bed,
        &inventory(FLEET_NAMESPACE, "m-c", versions.last().map(String::as_str)),
    )
    .await?;
    let changed = dashboard
        .until(steve, EVENT, |e| {
            named(e, "resource.change", id)
                && e["data"]["metadata"]["state"]["name"] == "up-to-date"
        })
        .await?;
    let change = started.elapsed();
    let started = Instant::now();
    bed.kubectl_ok(&[
        "delete",
        "machineinventories.elemental.cattle.io",
        "-n",
        FLEET_NAMESPACE,
        "m-c",
    ])
    .await?;
    dashboard
        .until(steve, EVENT, |e| named(e, "resource.remove", id))
        .await?;
    let remove = started.elapsed();
    ensure!(
        created["data"]["metadata"]["state"]["name"] == "updates-available",
        "{created}"
    );
    ensure!(changed["data"]["state"] == "UpToDate", "{changed}");
    eprintln!(
        "Steve /v1/subscribe, kubectl done to event: create {create:?}, change {change:?}, delete {remove:?} \
         ({} re-watches)",
        dashboard.rewatches
    );
    Ok(())
}

/// The dashboard keeps revisions as JavaScript Numbers and re-watches from them: the watch must
/// resume from such a revision, at most two re-watches, and then hold.
async fn javascript_revisions(bed: &TestBed, steve: &Steve, versions: &[String]) -> Result<()> {
    let listed = list(steve, None, MACHINES, Some(FLEET_NAMESPACE)).await?;
    let revision = listed["revision"]
        .as_str()
        .context("no revision")?
        .to_owned();
    let exact = revision.parse::<u64>().is_ok_and(|r| r < (1 << 53));
    ensure!(
        exact && js_text(js_number(&revision)) == revision,
        "revision {revision} does not survive a JavaScript Number: {}",
        js_text(js_number(&revision))
    );
    let mut dashboard = Dashboard::open(steve, MACHINES, FLEET_NAMESPACE).await?;
    apply(bed, &inventory(FLEET_NAMESPACE, "m-a", Some(&versions[1]))).await?;
    dashboard
        .until(steve, EVENT, |e| {
            named(e, "resource.change", "fleet-default/m-a")
        })
        .await?;
    dashboard.holds(steve).await?;
    ensure!(
        dashboard.rewatches <= 2,
        "{} re-watches from revision {}",
        dashboard.rewatches,
        js_text(dashboard.revision())
    );
    eprintln!(
        "re-watches from a JavaScript revision: {} (resyncs {})",
        dashboard.rewatches, dashboard.resyncs
    );
    Ok(())
}

/// A user sees through Steve exactly what the API lets them read: alice may read machines in
/// `team-b` only; bob nothing.
async fn readers(bed: &TestBed, steve: &Steve) -> Result<()> {
    let role = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: fleet-reader, namespace: {TEAM}}}\n\
         rules:\n- apiGroups: [changelog.elemental.cattle.io]\n  resources: [machineinventories]\n  verbs: [get, list, watch]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: alice-fleet-reader, namespace: {TEAM}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: fleet-reader}}\n\
         subjects:\n- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}\n"
    );
    apply(bed, &role).await?;
    let api = bed
        .kubectl_as(
            "alice",
            &[
                "get",
                "machineinventories.changelog.elemental.cattle.io",
                "-A",
                "-o",
                "name",
            ],
        )
        .await?;
    let forbidden = !api.status.success();
    let api = bed
        .kubectl_as(
            "alice",
            &[
                "get",
                "machineinventories.changelog.elemental.cattle.io",
                "-n",
                TEAM,
                "-o",
                "name",
            ],
        )
        .await?;
    ensure!(
        api.status.success() && forbidden,
        "alice through the API: {api:?}"
    );
    let expected: BTreeSet<String> = String::from_utf8_lossy(&api.stdout)
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .map(|name| format!("{TEAM}/{name}"))
        .collect();
    ensure!(
        expected == BTreeSet::from([format!("{TEAM}/t-u")]),
        "{expected:?}"
    );
    let (seen, took) = poll("alice's machines through Steve", SOON, POLL, async || {
        let (status, body) = steve.get(Some("alice"), &format!("/v1/{MACHINES}")).await?;
        if status != 200 {
            return Ok(None);
        }
        let seen: BTreeSet<String> = by_id(&body)?.into_keys().collect();
        Ok((!seen.is_empty()).then_some(seen))
    })
    .await?;
    ensure!(
        seen == expected,
        "alice through Steve {seen:?}, through the API {expected:?}"
    );
    let (status, body) = steve
        .get(Some("alice"), &format!("/v1/{MACHINES}/{FLEET_NAMESPACE}"))
        .await?;
    ensure!(
        status == 403 || status == 404 || (status == 200 && by_id(&body)?.is_empty()),
        "alice in {FLEET_NAMESPACE} through Steve: {status} {body}"
    );
    let (status, body) = steve
        .get(Some("bob"), &format!("/v1/schemas/{MACHINES}"))
        .await?;
    ensure!(
        status == 404 || status == 403,
        "bob's schema: {status} {body}"
    );
    eprintln!("alice's view through Steve after her binding: {took:?}");
    Ok(())
}

/// Our server restarts as a rolling update restarts it, one replica after the other (the
/// APIService stays available, so Steve keeps the type): the watch ends, the dashboard
/// re-watches from its revision, which no running process can serve (410 "too old resource
/// version"), resyncs, and events flow again: m-b is re-annotated (back and forth, until an
/// event shows it) and the time from the first restart to its first event is printed.
async fn restart(bed: &mut TestBed, steve: &Steve, versions: &[String]) -> Result<()> {
    let mut dashboard = Dashboard::open(steve, MACHINES, FLEET_NAMESPACE).await?;
    let start = dashboard
        .socket
        .next(EVENT)
        .await?
        .context("no resource.start")?;
    ensure!(start["name"] == "resource.start", "{start}");
    let started = Instant::now();
    for replica in 0..2 {
        bed.stop_replica(replica).await?;
        bed.start_replica(replica).await?;
    }
    let newest = versions.last().context("no version")?;
    let mut round = 0;
    let event = loop {
        let (version, state) = match round % 2 {
            0 => (&versions[0], "updates-available"),
            _ => (newest, "up-to-date"),
        };
        apply(bed, &inventory(FLEET_NAMESPACE, "m-b", Some(version))).await?;
        let event = dashboard
            .within(steve, QUIET, |e| {
                named(e, "resource.change", "fleet-default/m-b")
                    && e["data"]["metadata"]["state"]["name"] == state
            })
            .await?;
        if let Some(event) = event {
            break event;
        }
        round += 1;
        ensure!(
            started.elapsed() < SOON,
            "no event after a restart within {SOON:?} ({} re-watches, {} resyncs)",
            dashboard.rewatches,
            dashboard.resyncs
        );
    };
    ensure!(
        dashboard.resyncs >= 1,
        "the restarted server served the old revision instead of 410: {event}"
    );
    eprintln!(
        "after a restart of our server, events again after {:?} ({} re-watches, {} resyncs)",
        started.elapsed(),
        dashboard.rewatches,
        dashboard.resyncs
    );
    Ok(())
}

/// Steve's SQL cache: list, sort by a column, and an `Age` that advances between two reads.
async fn sql_cache(steve: &Steve) -> Result<()> {
    schemas(steve).await?;
    let state = column(steve, MACHINES, "State").await?;
    let age = column(steve, MACHINES, "Age").await?;
    let (listed, took) = poll("machines in Steve's SQL cache", SOON, POLL, async || {
        let listed = list(steve, None, MACHINES, Some(FLEET_NAMESPACE)).await?;
        Ok((by_id(&listed)?.len() == 3).then_some(listed))
    })
    .await?;
    eprintln!("Steve's SQL cache filled in {took:?}");
    let sorted = steve
        .get_ok(
            None,
            &format!(
                "/v1/{MACHINES}/{FLEET_NAMESPACE}?sort=-metadata.fields[{state}],metadata.name"
            ),
        )
        .await?;
    let order: Vec<(String, String)> = sorted["data"]
        .as_array()
        .context("data")?
        .iter()
        .map(|i| {
            (
                text(&i["metadata"]["fields"][state]),
                text(&i["metadata"]["name"]),
            )
        })
        .collect();
    let mut expected: Vec<(String, String)> = by_id(&listed)?
        .values()
        .map(|i| {
            (
                text(&i["metadata"]["fields"][state]),
                text(&i["metadata"]["name"]),
            )
        })
        .collect();
    // Steve's SQL cache compares text without case (SQLite's NOCASE).
    expected.sort_by(|a, b| (b.0.to_lowercase().cmp(&a.0.to_lowercase())).then(a.1.cmp(&b.1)));
    ensure!(
        order == expected,
        "sorted by State descending: {order:?}, expected {expected:?}"
    );

    let first = age_of(steve, age).await?;
    let (second, _) = poll("two seconds later", SOON, POLL, async || {
        let now = age_of(steve, age).await?;
        Ok((now.1 >= first.1 + Duration::from_secs(2)).then_some(now))
    })
    .await?;
    ensure!(
        second.0 > first.0,
        "Age does not advance in Steve's SQL cache: {:?} then {:?} ({:?} apart)",
        first.2,
        second.2,
        second.1 - first.1
    );
    Ok(())
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

/// m-b's age in seconds as Steve's SQL cache shows its `Age` field (a timestamp, or a duration
/// such as `5m4s`), when it was read, and the field.
async fn age_of(steve: &Steve, column: usize) -> Result<(i64, Instant, Value)> {
    let item = steve
        .get_ok(None, &format!("/v1/{MACHINES}/{FLEET_NAMESPACE}/m-b"))
        .await?;
    let read = Instant::now();
    let field = item["metadata"]["fields"][column].clone();
    let text = field
        .as_str()
        .with_context(|| format!("Age of m-b: {item}"))?;
    let seconds = match text.parse::<k8s_openapi::jiff::Timestamp>() {
        Ok(at) => k8s_openapi::jiff::Timestamp::now().as_second() - at.as_second(),
        Err(_) => duration_seconds(text).with_context(|| format!("Age {text}"))?,
    };
    Ok((seconds, read, field))
}

/// apimachinery's `HumanDuration` read back: `2d3h`, `5m4s`, `42s`.
fn duration_seconds(text: &str) -> Option<i64> {
    let mut total = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'y' => 365 * 86_400,
            _ => return None,
        };
        total += number.parse::<i64>().ok()? * unit;
        number.clear();
    }
    number.is_empty().then_some(total)
}
