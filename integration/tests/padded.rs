//! The padded-registration attack on the fleet view (issue 25), on the real control plane:
//! the elemental-operator copies whatever os-release values a registering machine sends into
//! `elemental.cattle.io/os.*` annotations, and hardware data into labels, without an
//! administrator. 500 MachineInventories of about 200 KiB each (many `os.*` keys and long
//! values, many long labels) are created through kube-apiserver next to a few ordinary
//! machines:
//! - the server's RSS (settled, `/proc/<pid>/status`) grows by at most [`BOUND_MIB`];
//! - the padded machines past a cap are `Unknown` (`MetadataTooLarge`) and keep no labels;
//!   those padded only with `os.*` keys the view does not read resolve as any other;
//! - every ordinary machine's answer, a label-selected list and a ManagedOSImage's plan are
//!   byte for byte what they were before;
//! - a server started afterwards lists them all (in small pages) within [`STARTED_BOUND_MIB`].
//!
//! Run with `--nocapture` for the figures.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::{
    bench::{Rss, rss, settled_rss},
    fixtures::{OperatorChannel, without_resource_versions},
    generated::Listing,
    image::{self, Compression, Format},
    paths::GROUP_VERSION,
    registry::Registry,
    testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions, elemental::VersionEntry},
    wait::{POLL, SOON, poll},
};
use futures::{StreamExt as _, TryStreamExt as _};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};
use serde_json::{Map, Value, json};

/// Padded MachineInventories.
const PADDED: usize = 500;
/// RSS growth allowed for all of them, MiB.
const BOUND_MIB: u64 = 16;
/// RSS a server started with them may use more than one before them, MiB: it lists them,
/// in pages of `LIST_PAGE_SIZE` (10) objects of 192 KiB, and the allocator keeps part of
/// what the pages took (13.6–15.1 MiB measured; 52 MiB with pages of 50, 172 MiB, peak 381 MiB,
/// with kube-runtime's default of 500).
const STARTED_BOUND_MIB: u64 = 24;
/// Objects created at once.
const CREATE_CONCURRENCY: usize = 16;
/// Deadline for the padded machines to be created and seen.
const DEADLINE: Duration = Duration::from_secs(600);
const OS: &str = "registry.example.com/elemental/os";
/// The namespace of the ordinary machines, a channel and a ManagedOSImage.
const LOCAL: &str = "fleet-local";
const OS_IMAGE: &str = "elemental.cattle.io/os.image";

fn api(namespace: &str, path: &str) -> String {
    format!("{GROUP_VERSION}/namespaces/{namespace}{path}")
}

fn machine_api(bed: &TestBed, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("elemental.cattle.io", "v1beta1", "MachineInventory"),
        "machineinventories",
    );
    Api::namespaced_with(bed.client(), namespace, &resource)
}

fn inventory(name: &str, annotations: Map<String, Value>, labels: Map<String, Value>) -> Value {
    json!({
        "apiVersion": "elemental.cattle.io/v1beta1",
        "kind": "MachineInventory",
        "metadata": {"name": name, "annotations": annotations, "labels": labels},
        "spec": {},
    })
}

/// `count` labels of 63-byte values under 190-byte prefixed keys (about 320 bytes each).
fn long_labels(count: usize) -> Map<String, Value> {
    let part = "x".repeat(60);
    (0..count)
        .map(|i| {
            (
                format!("p{i:03}.{part}.{part}.example.io/{}", "n".repeat(63)),
                json!("v".repeat(63)),
            )
        })
        .collect()
}

/// `os.*` annotations of `bytes` in all, in keys of 8 KiB values.
fn os_padding(bytes: usize) -> Map<String, Value> {
    (0..bytes / 8192)
        .map(|i| {
            (
                format!("elemental.cattle.io/os.padding-{i:03}"),
                json!("p".repeat(8192)),
            )
        })
        .collect()
}

/// Padded machine `i`: even ones report a 120 KiB image and carry 240 long labels (past the
/// value and the label caps); odd ones report a real image, a small label, and 192 KiB of
/// `os.*` keys the view does not read.
fn padded(i: usize) -> Value {
    let name = format!("padded-{i:03}");
    if i.is_multiple_of(2) {
        let mut annotations = os_padding(8 * 1024);
        annotations.insert(
            OS_IMAGE.to_owned(),
            json!(format!("{OS}:{}", "1".repeat(120 * 1024))),
        );
        inventory(&name, annotations, long_labels(240))
    } else {
        let mut annotations = os_padding(192 * 1024);
        annotations.insert(OS_IMAGE.to_owned(), json!(format!("{OS}:1.1.0")));
        let labels = [("pool".to_owned(), json!("padded"))].into_iter().collect();
        inventory(&name, annotations, labels)
    }
}

/// The answers that must not change: each ordinary machine, a label-selected list, a
/// ManagedOSImage's plan.
async fn answers(bed: &TestBed) -> Result<Vec<(String, String)>> {
    let mut paths: Vec<String> = ["m-old", "m-new", "m-pool", "m-none"]
        .iter()
        .map(|n| api(LOCAL, &format!("/machineinventories/{n}")))
        .collect();
    paths.push(api(LOCAL, "/machineinventories?labelSelector=pool%3Da"));
    paths.push(api(LOCAL, "/machineinventories/m-old?cve=CVE-2024-0001"));
    paths.push(api(LOCAL, "/managedosimages/pin/changelog"));
    let mut out = Vec::new();
    for path in paths {
        let (status, body) = bed.admin_get(&path).await?;
        ensure!(status.is_success(), "{path}: {status} {body}");
        // The answers, not their resourceVersions: a list's moves with every change of the
        // fleet, and a restarted server counts its own (see api.md, Watch).
        let mut value: Value = serde_json::from_str(&body)?;
        without_resource_versions(&mut value);
        out.push((path, value.to_string()));
    }
    Ok(out)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::test]
async fn padded_registrations_stay_within_their_bound() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), LOCAL.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let result = async {
        bed.start_server_reading(&registry, &[]).await?;
        attack(&mut bed, &registry).await?;
        bed.ensure_running()
    }
    .await;
    bed.finish(result)
}

async fn attack(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    let stable = Listing::generate("stable", 1, 1..=4);
    image::push(
        registry,
        "elemental/stable:1",
        &stable.image(Format::Oci, Compression::Gzip, "amd64"),
    )
    .await?;
    let entries: Vec<VersionEntry> = stable
        .entries()
        .into_iter()
        .map(|mut e| {
            e.upgrade_image = format!("{OS}:{}", e.version);
            e
        })
        .collect();
    for namespace in [LOCAL, FLEET_NAMESPACE] {
        let mut channel = OperatorChannel::custom(
            &bed.client(),
            namespace,
            "stable",
            &registry.image("elemental/stable:1"),
        )
        .await?;
        channel.sync(&entries).await?;
    }

    // Ordinary machines and a ManagedOSImage pinning the `pool: a` ones, in fleet-local; the
    // padded ones register in fleet-default.
    let local_machines = machine_api(bed, LOCAL);
    let api_machines = machine_api(bed, FLEET_NAMESPACE);
    let ordinary = [
        ("m-old", Some("1.1.0"), Some("a")),
        ("m-new", Some("1.4.0"), None),
        ("m-pool", Some("1.2.0"), Some("a")),
        ("m-none", None, None),
    ];
    for (name, version, pool) in ordinary {
        let annotations = version
            .map(|v| (OS_IMAGE.to_owned(), json!(format!("{OS}:{v}"))))
            .into_iter()
            .collect();
        let labels = pool
            .map(|p| ("pool".to_owned(), json!(p)))
            .into_iter()
            .collect();
        local_machines
            .create(
                &PostParams::default(),
                &serde_json::from_value(inventory(name, annotations, labels))?,
            )
            .await?;
    }
    bed.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: elemental.cattle.io/v1beta1\nkind: ManagedOSImage\nmetadata: {{name: pin, namespace: {LOCAL}}}\nspec:\n  managedOSVersionName: stable-v1-3\n  nodeSelector: {{matchLabels: {{pool: a}}}}\n"
        ),
    )
    .await?;
    let (m, _) = resolved(bed, "m-old").await?;
    ensure!(
        m["target"]["name"] == "stable-v1-3" && m["target"]["managedOSImage"] == "pin",
        "{m}"
    );
    resolved(bed, "m-new").await?;
    let before = answers(bed).await?;
    let pid = bed
        .server()
        .and_then(|s| s.process().pid())
        .context("no server")?;
    let idle = settled_rss(bed).await?;
    eprintln!(
        "padded: before the attack RSS {:.1} MiB (peak {:.1} MiB)",
        mib(idle.rss_kib),
        mib(idle.peak_kib)
    );

    // The attack.
    let started = Instant::now();
    let mut bytes = 0usize;
    let objects: Vec<DynamicObject> = (0..PADDED)
        .map(|i| {
            let object = padded(i);
            bytes += serde_json::to_vec(&object["metadata"]).map_or(0, |v| v.len());
            serde_json::from_value(object)
        })
        .collect::<Result<_, _>>()?;
    futures::stream::iter(objects)
        .map(|object| {
            let api = api_machines.clone();
            async move {
                api.create(&PostParams::default(), &object)
                    .await
                    .with_context(|| format!("creating {:?}", object.metadata.name))?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    eprintln!(
        "padded: {PADDED} MachineInventories of {} KiB of metadata each on average ({:.1} MiB) created in {:?}",
        bytes / PADDED / 1024,
        bytes as f64 / 1048576.0,
        started.elapsed()
    );
    // A last ordinary machine: once it is seen, so is every padded one (one watch, in order).
    api_machines
        .create(
            &PostParams::default(),
            &serde_json::from_value(inventory(
                "m-last",
                [(OS_IMAGE.to_owned(), json!(format!("{OS}:1.4.0")))]
                    .into_iter()
                    .collect(),
                Map::new(),
            ))?,
        )
        .await?;
    poll("m-last seen", DEADLINE, POLL, async || {
        let (status, _) = bed
            .admin_get(&api(FLEET_NAMESPACE, "/machineinventories/m-last"))
            .await?;
        Ok(status.is_success().then_some(()))
    })
    .await?;
    let attacked = settled_rss(bed).await?;
    let growth = attacked.rss_kib.saturating_sub(idle.rss_kib);
    eprintln!(
        "padded: after the attack RSS {:.1} MiB (+{:.1} MiB, bound {BOUND_MIB} MiB), peak {:.1} MiB, {:?} after the first create",
        mib(attacked.rss_kib),
        mib(growth),
        mib(attacked.peak_kib),
        started.elapsed()
    );
    check_padded(bed).await?;
    // Its changelog names the reason, as for any machine whose version is not known.
    let (status, body) = bed
        .admin_get(&api(
            FLEET_NAMESPACE,
            "/machineinventories/padded-000/changelog",
        ))
        .await?;
    let status_body: Value = serde_json::from_str(&body)?;
    ensure!(
        status.as_u16() == 404
            && status_body["details"]["causes"][0]["reason"] == "MetadataTooLarge",
        "{status} {body}"
    );
    ensure!(
        answers(bed).await? == before,
        "the ordinary machines' answers changed"
    );
    ensure!(
        growth <= BOUND_MIB << 10,
        "RSS grew by {:.1} MiB for {PADDED} padded machines (bound {BOUND_MIB} MiB)",
        mib(growth)
    );
    ensure!(rss(pid)?.rss_kib > 0, "the server is alive");

    // A server started now lists every padded machine at once (in pages).
    let started = Instant::now();
    bed.start_server_reading(registry, &[]).await?;
    let ready = started.elapsed();
    resolved(bed, "m-old").await?;
    let after = answers(bed).await?;
    check_padded(bed).await?;
    let restarted: Rss = settled_rss(bed).await?;
    let growth = restarted.rss_kib.saturating_sub(idle.rss_kib);
    eprintln!(
        "padded: a server started with them: ready in {ready:?}, RSS {:.1} MiB (+{:.1} MiB against the first before the attack, bound {STARTED_BOUND_MIB} MiB), peak {:.1} MiB",
        mib(restarted.rss_kib),
        mib(growth),
        mib(restarted.peak_kib)
    );
    // The restarted server's answers are the same (their resourceVersions aside).
    ensure!(after == before, "a restarted server answers otherwise");
    ensure!(
        growth <= STARTED_BOUND_MIB << 10,
        "a server started with {PADDED} padded machines uses {:.1} MiB more (bound {STARTED_BOUND_MIB} MiB)",
        mib(growth)
    );
    Ok(())
}

/// Polls until the ordinary machine `name` is resolved (its channel read).
async fn resolved(bed: &TestBed, name: &str) -> Result<(Value, Duration)> {
    let path = api(LOCAL, &format!("/machineinventories/{name}"));
    poll(&format!("{name} resolved"), SOON, POLL, async || {
        let m: Value = bed.admin_get_json(&path).await?;
        Ok(
            (m["summary"]["advisories"].as_u64().is_some() || m["state"] == "UpToDate")
                .then_some(m),
        )
    })
    .await
}

/// The padded machines past a cap are `MetadataTooLarge`, without labels or OS; the others
/// resolve.
async fn check_padded(bed: &TestBed) -> Result<()> {
    let list: Value = bed
        .admin_get_json(&api(FLEET_NAMESPACE, "/machineinventories"))
        .await?;
    let items = list["items"].as_array().context("items")?;
    ensure!(items.len() == PADDED + 1, "{} machines listed", items.len());
    let padded: Vec<&Value> = items
        .iter()
        .filter(|m| {
            m["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("padded-"))
        })
        .collect();
    let (mut too_large, mut resolved) = (0, 0);
    for m in padded {
        // The answer without its message, which may quote a padded value.
        let short = json!({"metadata": m["metadata"]["name"], "state": m["state"],
            "reason": m["reason"], "current": m["current"]});
        if m["reason"] == "MetadataTooLarge" {
            ensure!(
                m["state"] == "Unknown"
                    && m["metadata"].get("labels").is_none_or(|l| l == &json!({}))
                    && m["os"] == json!({})
                    && m["message"]
                        .as_str()
                        .is_some_and(|s| s.contains("elemental.cattle.io/os.image is")),
                "{short}"
            );
            too_large += 1;
        } else {
            ensure!(
                m["current"]["name"] == "stable-v1-1"
                    && m["metadata"]["labels"]["pool"] == "padded",
                "{m}"
            );
            resolved += 1;
        }
    }
    ensure!(
        (too_large, resolved) == (PADDED / 2, PADDED / 2),
        "{too_large} MetadataTooLarge, {resolved} resolved"
    );
    Ok(())
}
