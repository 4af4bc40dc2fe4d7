#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use elemental_changelog_apiservice::fleet::{
    ChannelVersion, CveState, MachineReason, MachineState, PlanTargetReason, SelectionReason,
    TargetReason, TargetSource,
};
use elemental_changelog_apiservice::types::{ChangelogSummary, ObjectMeta, Severity};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::crd::{MachineInventory, MachineInventorySelector, ManagedOSImage};
use super::os::{Reported, images_match, unescape_html, versions_match};
use super::*;
use crate::channels::crd::ManagedOSVersion;

const NS: &str = "fleet-default";
const IMG: &str = "registry.suse.com/suse/sl-micro/6.1/baremetal-os-container";

fn mov(
    ns: &str,
    name: &str,
    channel: &str,
    version: &str,
    image: Option<&str>,
) -> ManagedOSVersion {
    let mut metadata = json!({});
    if let Some(i) = image {
        metadata["upgradeImage"] = json!(i);
    }
    serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersion",
        "metadata": {"name": name, "namespace": ns,
            "ownerReferences": [{"apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSVersionChannel",
                "name": channel, "uid": "u", "controller": true}]},
        "spec": {"version": version, "type": "container", "metadata": metadata}
    }))
    .unwrap()
}

/// A channel of `n` versions `<channel>-v1.<i>` with images `IMG-<channel>:1.<i>`.
fn channel(ns: &str, channel: &str, n: usize) -> (Vec<ManagedOSVersion>, Vec<String>) {
    let versions: Vec<ManagedOSVersion> = (0..n)
        .map(|i| {
            mov(
                ns,
                &format!("{channel}-v1.{i}"),
                channel,
                &format!("v1.{i}"),
                Some(&format!("{IMG}-{channel}:1.{i}")),
            )
        })
        .collect();
    let order = (0..n).map(|i| format!("{channel}-v1.{i}")).collect();
    (versions, order)
}

fn image_of(channel: &str, i: usize) -> String {
    format!("{IMG}-{channel}:1.{i}")
}

/// A MachineInventory as the operator writes it, trimmed as the reflector stores it.
fn machine(
    name: &str,
    annotations: Value,
    labels: Value,
    selector: Option<&str>,
) -> MachineInventory {
    let mut m = json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "MachineInventory",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations, "labels": labels},
        "spec": {"tpmHash": "abc"},
        "status": {"plan": {"state": "Applied"}}
    });
    if let Some(s) = selector {
        m["metadata"]["ownerReferences"] = json!([{"apiVersion": "elemental.cattle.io/v1beta1",
            "kind": "MachineInventorySelector", "name": s, "uid": "u", "controller": true}]);
    }
    let mut m = serde_json::from_value(m).unwrap();
    reflect::trim_machine(&mut m);
    m
}

fn running(name: &str, image: &str) -> MachineInventory {
    machine(
        name,
        json!({"elemental.cattle.io/os.image": image}),
        json!({}),
        None,
    )
}

fn in_cluster(name: &str, image: &str, selector: &str, labels: Value) -> MachineInventory {
    machine(
        name,
        json!({"elemental.cattle.io/os.image": image}),
        labels,
        Some(selector),
    )
}

fn selector(name: &str, cluster: Option<&str>) -> MachineInventorySelector {
    let labels = cluster.map_or(json!({}), |c| json!({"cluster.x-k8s.io/cluster-name": c}));
    serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "MachineInventorySelector",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"selector": {"matchLabels": {"a": "b"}}}
    }))
    .unwrap()
}

fn moi(ns: &str, name: &str, spec: Value) -> ManagedOSImage {
    serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSImage",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec
    }))
    .unwrap()
}

struct World {
    versions: Vec<ManagedOSVersion>,
    images: Vec<ManagedOSImage>,
    selectors: Vec<MachineInventorySelector>,
    orders: BTreeMap<(String, String), Vec<String>>,
    clusters: Option<Vec<FleetCluster>>,
    groups: Option<Vec<FleetClusterGroup>>,
}

impl World {
    /// Channels `a` (5 versions) and `b` (3 versions) in fleet-default.
    fn new() -> Self {
        let (mut versions, order_a) = channel(NS, "a", 5);
        let (vb, order_b) = channel(NS, "b", 3);
        versions.extend(vb);
        let orders = [
            ((NS.to_owned(), "a".to_owned()), order_a),
            ((NS.to_owned(), "b".to_owned()), order_b),
        ]
        .into();
        Self {
            versions,
            images: Vec::new(),
            selectors: vec![selector("sel-1", Some("prod")), selector("sel-2", None)],
            orders,
            clusters: None,
            groups: None,
        }
    }

    /// Makes the ManagedOSImage `name` of fleet-default with `spec` the only one.
    fn only_image(&mut self, name: &str, spec: Value) {
        self.images = vec![moi(NS, name, spec)];
    }

    fn index(&self) -> FleetIndex<'_> {
        FleetIndex::new(
            &self.versions,
            &self.images,
            &self.selectors,
            Fleet {
                clusters: self.clusters.as_deref(),
                groups: self.groups.as_deref(),
            },
            &self.orders,
        )
    }
}

fn cv(name: &str, version: &str, channel: &str) -> ChannelVersion {
    ChannelVersion {
        name: name.into(),
        version: version.into(),
        channel: channel.into(),
    }
}

// ---- what the machine reports ----

#[test]
fn html_escapes_of_the_operator_are_undone() {
    assert_eq!(
        unescape_html("a &lt;b&gt; &amp;lt; &#39;x&#34;"),
        "a <b> &lt; 'x\""
    );
    assert_eq!(unescape_html("plain"), "plain");
    let r = Reported::from_annotations(&BTreeMap::from([
        (
            "elemental.cattle.io/os.image".to_owned(),
            " reg/os:1 ".to_owned(),
        ),
        (
            "elemental.cattle.io/os.version".to_owned(),
            "6.1".to_owned(),
        ),
        (
            "elemental.cattle.io/os.version-id".to_owned(),
            "".to_owned(),
        ),
        (
            "elemental.cattle.io/os.pretty-name".to_owned(),
            "SL Micro &#34;6.1&#34;".to_owned(),
        ),
        (
            "elemental.cattle.io/os.unmanaged".to_owned(),
            "True".to_owned(),
        ),
    ]));
    assert_eq!(r.image.as_deref(), Some("reg/os:1"));
    assert_eq!(r.version.as_deref(), Some("6.1"));
    assert_eq!(r.version_id, None);
    assert_eq!(r.pretty_name.as_deref(), Some("SL Micro \"6.1\""));
    assert!(r.unmanaged);
    assert_eq!(r.to_wire().pretty_name.as_deref(), Some("SL Micro \"6.1\""));
}

#[test]
fn image_and_version_comparison() {
    assert!(images_match(
        "registry.suse.com/x/os:1.0",
        "registry.suse.com/x/os:1.0"
    ));
    assert!(images_match(" docker.io/library/os:1 ", "os:1"));
    assert!(images_match("index.docker.io/me/os:1", "me/os:1"));
    // A mirror prefix on either side.
    assert!(images_match(
        "mirror.local:5000/registry.suse.com/x/os:1",
        "registry.suse.com/x/os:1"
    ));
    assert!(images_match(
        "registry.suse.com/x/os:1",
        "mirror.local/registry.suse.com/x/os:1"
    ));
    // Never from a bare repository, never a different tag or repository.
    assert!(!images_match("registry.example/team/os:1", "os:1"));
    assert!(!images_match("registry.example/team/os:1", "team/os:1"));
    assert!(!images_match(
        "registry.suse.com/x/os:1.0",
        "registry.suse.com/x/os:1.01"
    ));
    assert!(!images_match(
        "registry.suse.com/x/bos:1",
        "registry.suse.com/x/os:1"
    ));
    assert!(!images_match(
        "registry.suse.com/x/xregistry.suse.com/x/os:1",
        "registry.suse.com/x/os:1"
    ));
    assert!(!images_match("", ""));
    assert!(versions_match("v2.2.0-3.12", "2.2.0-3.12"));
    assert!(versions_match("2.2.0", "V2.2.0"));
    assert!(!versions_match("6.1", "v2.2.0-3.12"));
    assert!(!versions_match("", "v"));
}

proptest! {
    #[test]
    fn image_match_is_reflexive_and_symmetric(a in "[a-z.:/0-9-]{1,30}", b in "[a-z.:/0-9-]{1,30}") {
        if !a.trim().is_empty() && !a.starts_with("docker.io/") && !a.starts_with("index.docker.io/") && !a.starts_with("library/") {
            prop_assert!(images_match(&a, &a));
        }
        prop_assert_eq!(images_match(&a, &b), images_match(&b, &a));
    }
}

// ---- the current version ----

#[test]
fn current_by_image_first_then_by_version_in_one_channel() {
    let w = World::new();
    let index = w.index();
    let current = |m: &MachineInventory| index.current(m);
    assert_eq!(
        current(&running("m", &image_of("a", 2))),
        Ok(cv("a-v1.2", "v1.2", "a"))
    );
    // The image wins over a version that says otherwise.
    let m = machine(
        "m",
        json!({"elemental.cattle.io/os.image": image_of("b", 1), "elemental.cattle.io/os.version": "v1.0"}),
        json!({}),
        None,
    );
    assert_eq!(current(&m), Ok(cv("b-v1.1", "v1.1", "b")));
    // An image no version has: by version, which must match in one channel.
    let m = machine(
        "m",
        json!({"elemental.cattle.io/os.image": "elsewhere/os:9", "elemental.cattle.io/os.version": "1.4"}),
        json!({}),
        None,
    );
    assert_eq!(current(&m), Ok(cv("a-v1.4", "v1.4", "a")));
    let m = machine(
        "m",
        json!({"elemental.cattle.io/os.version-id": "v1.3"}),
        json!({}),
        None,
    );
    assert_eq!(current(&m), Ok(cv("a-v1.3", "v1.3", "a")));
    // v1.1 is in both channels.
    let m = machine(
        "m",
        json!({"elemental.cattle.io/os.version": "v1.1"}),
        json!({}),
        None,
    );
    let (reason, message) = current(&m).unwrap_err();
    assert_eq!(reason, MachineReason::Ambiguous);
    assert!(
        message.contains("a-v1.1 (channel a)") && message.contains("b-v1.1 (channel b)"),
        "{message}"
    );
    // Nothing reported.
    let m = machine(
        "m",
        json!({"elemental.cattle.io/os.name": "SL Micro"}),
        json!({}),
        None,
    );
    assert_eq!(current(&m).unwrap_err().0, MachineReason::NoAnnotation);
    // Reported, but no version has it.
    let m = machine(
        "m",
        json!({"elemental.cattle.io/os.image": "elsewhere/os:9", "elemental.cattle.io/os.version": "6.1"}),
        json!({}),
        None,
    );
    let (reason, message) = current(&m).unwrap_err();
    assert_eq!(reason, MachineReason::VersionInNoChannel);
    assert!(
        message.contains("elsewhere/os:9") && message.contains("6.1"),
        "{message}"
    );
    // Unmanaged wins.
    let m = machine(
        "m",
        json!({"elemental.cattle.io/os.image": image_of("a", 2), "elemental.cattle.io/os.unmanaged": "true"}),
        json!({}),
        None,
    );
    assert_eq!(current(&m).unwrap_err().0, MachineReason::Unmanaged);
}

#[test]
fn current_ignores_other_namespaces_iso_and_channelless_versions_and_sees_shared_images() {
    let mut w = World::new();
    let img = image_of("a", 0);
    // The same image in another namespace, as an ISO, and without a channel.
    w.versions.push(mov("other", "x", "a", "v1.0", Some(&img)));
    let mut iso = mov(NS, "iso", "a", "v1.0", Some(&img));
    iso.spec.type_ = "iso".into();
    w.versions.push(iso);
    let mut orphan = mov(NS, "orphan", "a", "v1.0", Some(&img));
    orphan.metadata.owner_references = None;
    w.versions.push(orphan);
    let index = w.index();
    let m = running("m", &img);
    assert_eq!(index.machine(&m).current, Some(cv("a-v1.0", "v1.0", "a")));
    // A second channel listing the same image: ambiguous.
    w.versions.push(mov(NS, "dup", "c", "v1.0", Some(&img)));
    let r = w.index().machine(&m);
    assert_eq!(r.state, MachineState::Unknown);
    assert_eq!(r.reason, Some(MachineReason::Ambiguous));
    assert_eq!(r.current, None);
}

// ---- target and state ----

#[test]
fn newest_in_channel_by_the_channel_order() {
    let mut w = World::new();
    // The order, not names or versions, says which is newest.
    w.orders.insert(
        (NS.into(), "a".into()),
        ["a-v1.0", "a-v1.1", "a-v1.3", "a-v1.4", "a-v1.2"]
            .map(String::from)
            .to_vec(),
    );
    let index = w.index();
    let r = index.machine(&running("m", &image_of("a", 1)));
    let t = r.target.clone().unwrap();
    assert_eq!(
        (t.name.as_str(), t.source, t.reason),
        ("a-v1.2", TargetSource::NewestInChannel, None)
    );
    assert_eq!(r.state, MachineState::UpdatesAvailable);
    assert_eq!(
        r.pending,
        Some(Pending {
            namespace: NS.into(),
            channel: "a".into(),
            from: "a-v1.1".into(),
            to: "a-v1.2".into()
        })
    );
    let r = index.machine(&running("m", &image_of("a", 2)));
    assert_eq!(
        (r.state, r.reason, r.pending),
        (MachineState::UpToDate, None, None)
    );
    // The newest listed version must exist as a ManagedOSVersion.
    w.orders
        .get_mut(&(NS.into(), "a".into()))
        .unwrap()
        .push("a-v9-deleted".into());
    let r = w.index().machine(&running("m", &image_of("a", 2)));
    assert_eq!(r.state, MachineState::UpToDate);
}

#[test]
fn unfetched_channel_is_unknown() {
    let mut w = World::new();
    w.orders.remove(&(NS.into(), "b".into()));
    let r = w.index().machine(&running("m", &image_of("b", 0)));
    assert_eq!(r.current, Some(cv("b-v1.0", "v1.0", "b")));
    assert_eq!(r.target, None);
    assert_eq!(r.state, MachineState::Unknown);
    assert_eq!(r.reason, Some(MachineReason::ChannelNotFetched));
}

#[test]
fn managed_os_image_by_cluster_name() {
    let mut w = World::new();
    w.images.push(moi(
        NS,
        "prod-upgrade",
        json!({
            "managedOSVersionName": "a-v1.3",
            "clusterTargets": [{"clusterName": "staging"}, {"clusterName": "prod"}],
            "drain": {}
        }),
    ));
    let index = w.index();
    let r = index.machine(&in_cluster("m", &image_of("a", 1), "sel-1", json!({})));
    let t = r.target.clone().unwrap();
    assert_eq!(t.name, "a-v1.3");
    assert_eq!(t.source, TargetSource::ManagedOSImage);
    assert_eq!(t.managed_os_image.as_deref(), Some("prod-upgrade"));
    assert_eq!(r.state, MachineState::UpdatesAvailable);
    assert_eq!(r.pending.unwrap().to, "a-v1.3");
    // Runs the target: up to date, although newer versions exist.
    let r = index.machine(&in_cluster("m", &image_of("a", 3), "sel-1", json!({})));
    assert_eq!(r.state, MachineState::UpToDate);
    // Newer than the target: the ManagedOSImage pins an older version.
    let r = index.machine(&in_cluster("m", &image_of("a", 4), "sel-1", json!({})));
    assert_eq!(
        (r.state, r.reason),
        (MachineState::UpToDate, Some(MachineReason::TargetOlder))
    );
    assert_eq!(r.pending, None);
    // Another cluster: not selected, no reason to report.
    w.selectors.push(selector("sel-3", Some("dev")));
    let r = w
        .index()
        .machine(&in_cluster("m", &image_of("a", 1), "sel-3", json!({})));
    let t = r.target.unwrap();
    assert_eq!(
        (t.name.as_str(), t.source, t.reason),
        ("a-v1.4", TargetSource::NewestInChannel, None)
    );
}

#[test]
fn unknown_cluster_falls_back_with_a_reason() {
    let mut w = World::new();
    w.images.push(moi(
        NS,
        "up",
        json!({"osImage": image_of("a", 3), "clusterTargets": [{"clusterName": "prod"}]}),
    ));
    let index = w.index();
    for m in [
        running("no-owner", &image_of("a", 1)),
        in_cluster("no-label", &image_of("a", 1), "sel-2", json!({})),
        in_cluster("no-selector", &image_of("a", 1), "missing", json!({})),
    ] {
        let r = index.machine(&m);
        let t = r.target.unwrap();
        assert_eq!(t.source, TargetSource::NewestInChannel, "{}", r.name);
        assert_eq!(
            t.reason,
            Some(TargetReason::ClusterUnresolved),
            "{}",
            r.name
        );
        assert!(t.message.unwrap().contains("ManagedOSImage up"));
        assert_eq!(r.state, MachineState::UpdatesAvailable);
    }
}

#[test]
fn cluster_selectors_and_groups_need_fleet_objects() {
    let mut w = World::new();
    w.images.push(moi(
        NS,
        "by-label",
        json!({
            "managedOSVersionName": "a-v1.2",
            "clusterTargets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}]
        }),
    ));
    let m = in_cluster("m", &image_of("a", 0), "sel-1", json!({}));
    let r = w.index().machine(&m);
    assert_eq!(
        r.target.as_ref().unwrap().reason,
        Some(TargetReason::ClusterUnresolved)
    );
    w.clusters = Some(vec![FleetCluster {
        namespace: NS.into(),
        name: "prod".into(),
        labels: [("env".to_owned(), "prod".to_owned())].into(),
    }]);
    let r = w.index().machine(&m);
    assert_eq!(
        r.target.as_ref().unwrap().source,
        TargetSource::ManagedOSImage
    );
    assert_eq!(r.target.unwrap().name, "a-v1.2");

    // By group: needs groups.
    w.only_image(
        "by-group",
        json!({
            "managedOSVersionName": "a-v1.1",
            "clusterTargets": [{"clusterGroup": "edge"}]
        }),
    );
    assert_eq!(
        w.index().machine(&m).target.unwrap().reason,
        Some(TargetReason::ClusterUnresolved)
    );
    w.groups = Some(vec![FleetClusterGroup {
        namespace: NS.into(),
        name: "edge".into(),
        labels: [("tier".to_owned(), "edge".to_owned())].into(),
        selector: Some(serde_json::from_value(json!({"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "qa"]}]})).unwrap()),
    }]);
    let r = w.index().machine(&m);
    assert_eq!(r.target.unwrap().name, "a-v1.1");
    w.only_image(
        "by-group-label",
        json!({
            "managedOSVersionName": "a-v1.1",
            "clusterTargets": [{"clusterGroupSelector": {"matchLabels": {"tier": "core"}}}]
        }),
    );
    let r = w.index().machine(&m);
    assert_eq!(
        (r.target.as_ref().unwrap().source, r.target.unwrap().reason),
        (TargetSource::NewestInChannel, None)
    );
    // A target with no criterion cannot be decided.
    w.only_image(
        "empty",
        json!({"managedOSVersionName": "a-v1.1", "clusterTargets": [{"name": "x"}]}),
    );
    assert_eq!(
        w.index().machine(&m).target.unwrap().reason,
        Some(TargetReason::ClusterUnresolved)
    );
    // An unknown operator cannot be decided either.
    w.only_image("bad", json!({"managedOSVersionName": "a-v1.1",
        "clusterTargets": [{"clusterSelector": {"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}}]}));
    assert_eq!(
        w.index().machine(&m).target.unwrap().reason,
        Some(TargetReason::ClusterUnresolved)
    );
}

#[test]
fn node_selector_against_inventory_labels() {
    let mut w = World::new();
    w.images.push(moi(
        NS,
        "workers",
        json!({
            "managedOSVersionName": "a-v1.2",
            "nodeSelector": {"matchLabels": {"role": "worker"}},
            "clusterTargets": [{"clusterName": "prod"}]
        }),
    ));
    let index = w.index();
    let worker = in_cluster("w", &image_of("a", 0), "sel-1", json!({"role": "worker"}));
    let server = in_cluster("s", &image_of("a", 0), "sel-1", json!({"role": "server"}));
    assert_eq!(index.machine(&worker).target.unwrap().name, "a-v1.2");
    let t = index.machine(&server).target.unwrap();
    assert_eq!(
        (t.name.as_str(), t.source),
        ("a-v1.4", TargetSource::NewestInChannel)
    );
}

#[test]
fn images_that_disagree_or_do_not_resolve() {
    let mut w = World::new();
    let targets = json!([{"clusterName": "prod"}]);
    w.images.push(moi(
        NS,
        "one",
        json!({"managedOSVersionName": "a-v1.2", "clusterTargets": targets}),
    ));
    w.images.push(moi(
        NS,
        "two",
        json!({"osImage": image_of("a", 2), "clusterTargets": targets}),
    ));
    let m = in_cluster("m", &image_of("a", 0), "sel-1", json!({}));
    // Same version twice: agreed, the first by name is named.
    let t = w.index().machine(&m).target.unwrap();
    assert_eq!(
        (t.source, t.managed_os_image.as_deref()),
        (TargetSource::ManagedOSImage, Some("one"))
    );
    w.images.push(moi(
        NS,
        "three",
        json!({"managedOSVersionName": "a-v1.3", "clusterTargets": targets}),
    ));
    let t = w.index().machine(&m).target.unwrap();
    assert_eq!(
        (t.source, t.reason),
        (
            TargetSource::NewestInChannel,
            Some(TargetReason::ManagedOSImagesDisagree)
        )
    );
    assert!(t.message.unwrap().contains("one, three, two"));
    w.only_image(
        "gone",
        json!({"managedOSVersionName": "a-v7", "clusterTargets": targets}),
    );
    let t = w.index().machine(&m).target.unwrap();
    assert_eq!(t.reason, Some(TargetReason::ManagedOSImageUnresolved));
    assert!(t.message.unwrap().contains("a-v7"));
}

#[test]
fn target_in_another_channel() {
    let mut w = World::new();
    w.images.push(moi(
        NS,
        "switch",
        json!({"managedOSVersionName": "b-v1.2", "clusterTargets": [{"clusterName": "prod"}]}),
    ));
    let r = w
        .index()
        .machine(&in_cluster("m", &image_of("a", 0), "sel-1", json!({})));
    assert_eq!(r.target.as_ref().unwrap().channel, "b");
    assert_eq!(
        (r.state, r.reason, r.pending),
        (
            MachineState::UpdatesAvailable,
            Some(MachineReason::OtherChannel),
            None
        )
    );
}

#[test]
fn fleet_local_images_select_every_machine_of_fleet_local() {
    let mut w = World::new();
    let (v, order) = channel("fleet-local", "l", 3);
    w.versions.extend(v);
    w.orders.insert(("fleet-local".into(), "l".into()), order);
    w.images.push(moi(
        "fleet-local",
        "local",
        json!({"managedOSVersionName": "l-v1.1"}),
    ));
    // And one in fleet-default that does not reach fleet-local.
    w.images.push(moi(
        NS,
        "default",
        json!({"managedOSVersionName": "a-v1.1", "clusterTargets": [{"clusterName": "local"}]}),
    ));
    let mut m = running("m", &image_of("l", 0));
    m.metadata.namespace = Some("fleet-local".into());
    let r = w.index().machine(&m);
    let t = r.target.unwrap();
    assert_eq!(
        (t.name.as_str(), t.source),
        ("l-v1.1", TargetSource::ManagedOSImage)
    );
}

#[test]
fn image_targets() {
    let mut w = World::new();
    w.versions
        .push(mov(NS, "dup", "c", "v1.0", Some(&image_of("a", 0))));
    let index = w.index();
    let target = |spec| index.image_target(&moi(NS, "i", spec));
    assert_eq!(
        target(json!({"managedOSVersionName": "b-v1.2"})),
        PlanTarget::Resolved(cv("b-v1.2", "v1.2", "b"))
    );
    // osImage wins over managedOSVersionName, as in the operator.
    assert_eq!(
        target(json!({"managedOSVersionName": "b-v1.2", "osImage": image_of("a", 3)})),
        PlanTarget::Resolved(cv("a-v1.3", "v1.3", "a"))
    );
    let reason = |t: PlanTarget| match t {
        PlanTarget::Unresolved { reason, .. } => Some(reason),
        PlanTarget::Resolved(_) => None,
    };
    assert_eq!(reason(target(json!({}))), Some(PlanTargetReason::NoTarget));
    assert_eq!(
        reason(target(json!({"osImage": " ", "managedOSVersionName": ""}))),
        Some(PlanTargetReason::NoTarget)
    );
    assert_eq!(
        reason(target(json!({"managedOSVersionName": "nope"}))),
        Some(PlanTargetReason::VersionNotFound)
    );
    assert_eq!(
        reason(target(json!({"osImage": "x/y:1"}))),
        Some(PlanTargetReason::ImageInNoChannel)
    );
    assert_eq!(
        reason(target(json!({"osImage": image_of("a", 0)}))),
        Some(PlanTargetReason::Ambiguous)
    );
}

// ---- CVE exposure ----

#[test]
fn cve_states() {
    let w = World::new();
    let index = w.index();
    // v1.2 of channel a fixes it; nothing in b does.
    let fixes = |_: &str, channel: &str, name: &str| {
        channel == "a" && (name == "a-v1.2" || name == "a-v1.4")
    };
    let state = |image: &str| {
        let r = index.machine(&running("m", image));
        index.cve(&r, "CVE-2024-1", fixes)
    };
    let c = state(&image_of("a", 1));
    assert_eq!(
        (c.state, c.fixed_in.as_ref().unwrap().name.as_str()),
        (CveState::Exposed, "a-v1.2")
    );
    assert_eq!(c.fixed_in.unwrap().version, "v1.2");
    assert_eq!(state(&image_of("a", 2)).state, CveState::Fixed);
    let c = state(&image_of("a", 3));
    assert_eq!(
        (c.state, c.fixed_in.unwrap().name.as_str()),
        (CveState::Fixed, "a-v1.2")
    );
    let c = state(&image_of("b", 2));
    assert_eq!((c.state, c.fixed_in), (CveState::NoFixInChannel, None));
    let c = state("unknown/os:1");
    assert_eq!((c.state, c.id.as_str()), (CveState::Unknown, "CVE-2024-1"));
}

// ---- plans ----

#[test]
fn plan_groups_machines_by_current_version() {
    let mut w = World::new();
    w.selectors.push(selector("sel-3", Some("dev")));
    let image = moi(
        NS,
        "prod",
        json!({
            "managedOSVersionName": "a-v1.3",
            "clusterTargets": [{"clusterName": "prod"}, {"name": "groups", "clusterGroup": "edge"}]
        }),
    );
    w.images.push(image.clone());
    let machines = vec![
        in_cluster("m3", &image_of("a", 1), "sel-1", json!({})),
        in_cluster("m1", &image_of("a", 1), "sel-1", json!({})),
        in_cluster("m2", &image_of("a", 0), "sel-1", json!({})),
        in_cluster("m4", &image_of("a", 3), "sel-1", json!({})),
        in_cluster("m5", &image_of("a", 4), "sel-1", json!({})),
        in_cluster("m6", &image_of("b", 0), "sel-1", json!({})),
        in_cluster("unknown", "x/y:1", "sel-1", json!({})),
        // Another cluster: matches no clusterName, and groups are unknown.
        in_cluster("dev", &image_of("a", 0), "sel-3", json!({})),
        // No cluster.
        running("lost", &image_of("a", 0)),
    ];
    let mut other_ns = in_cluster("elsewhere", &image_of("a", 0), "sel-1", json!({}));
    other_ns.metadata.namespace = Some("other".into());
    let index = w.index();
    let plan = index.plan(&image, machines.iter().chain([&other_ns]));
    assert_eq!(plan.target, PlanTarget::Resolved(cv("a-v1.3", "v1.3", "a")));
    let groups = group_rows(&plan);
    assert_eq!(
        groups,
        [
            ("a-v1.0", MachineState::UpdatesAvailable, None, vec!["m2"]),
            (
                "a-v1.1",
                MachineState::UpdatesAvailable,
                None,
                vec!["m1", "m3"]
            ),
            ("a-v1.3", MachineState::UpToDate, None, vec!["m4"]),
            (
                "a-v1.4",
                MachineState::UpToDate,
                Some(MachineReason::TargetOlder),
                vec!["m5"]
            ),
            (
                "b-v1.0",
                MachineState::UpdatesAvailable,
                Some(MachineReason::OtherChannel),
                vec!["m6"]
            ),
        ]
    );
    let unknown: Vec<(&str, &str)> = plan
        .unknown_machines
        .iter()
        .map(|m| (m.name.as_str(), m.reason.as_str()))
        .collect();
    assert_eq!(
        unknown,
        [
            ("dev", "ClusterGroupUnknown"),
            ("lost", "ClusterUnknown"),
            ("unknown", "VersionInNoChannel")
        ]
    );
    assert_eq!(plan.unresolved_targets.len(), 1);
    assert_eq!(plan.unresolved_targets[0].index, 1);
    assert_eq!(plan.unresolved_targets[0].name.as_deref(), Some("groups"));
    assert_eq!(
        plan.unresolved_targets[0].reason,
        SelectionReason::ClusterGroupUnknown
    );

    check_plan_object(plan);
}

/// A plan's groups: current version, state, reason and machines.
fn group_rows(plan: &UpgradePlan) -> Vec<(&str, MachineState, Option<MachineReason>, Vec<&str>)> {
    plan.groups
        .iter()
        .map(|g| {
            (
                g.current.name.as_str(),
                g.state,
                g.reason,
                g.machines.iter().map(String::as_str).collect(),
            )
        })
        .collect()
}

/// The wire object of [`plan_groups_machines_by_current_version`]'s plan, summaries asked
/// for the groups with a pending changelog only.
fn check_plan_object(plan: UpgradePlan) {
    let summary = ChangelogSummary {
        advisories: 2,
        highest_severity: Severity::Critical,
        ..ChangelogSummary::default()
    };
    let mut asked = Vec::new();
    let object = plan.to_object(
        ObjectMeta {
            name: "prod".into(),
            namespace: NS.into(),
            ..ObjectMeta::default()
        },
        |p| {
            asked.push((p.from.clone(), p.to.clone()));
            Some(summary.clone())
        },
    );
    assert_eq!(
        asked,
        [
            ("a-v1.0".to_owned(), "a-v1.3".to_owned()),
            ("a-v1.1".to_owned(), "a-v1.3".to_owned())
        ]
    );
    let v = serde_json::to_value(&object).unwrap();
    assert_eq!(v["kind"], "ManagedOSImageChangelog");
    assert_eq!(
        v["target"],
        json!({"name": "a-v1.3", "version": "v1.3", "channel": "a"})
    );
    assert_eq!(v["groups"][0]["summary"]["highestSeverity"], "Critical");
    assert!(v["groups"][2].get("summary").is_none());
    assert_eq!(v["unknownMachines"][0]["name"], "dev");
}

#[test]
fn plan_with_an_unresolved_target() {
    let mut w = World::new();
    let image = moi(
        NS,
        "p",
        json!({"managedOSVersionName": "nope", "clusterTargets": [{"clusterName": "prod"}, {}]}),
    );
    w.images.push(image.clone());
    let m = in_cluster("m", &image_of("a", 0), "sel-1", json!({}));
    let plan = w.index().plan(&image, [&m]);
    assert!(matches!(
        plan.target,
        PlanTarget::Unresolved {
            reason: PlanTargetReason::VersionNotFound,
            ..
        }
    ));
    assert_eq!(plan.groups.len(), 1);
    assert_eq!(plan.groups[0].state, MachineState::Unknown);
    assert_eq!(plan.groups[0].pending, None);
    assert_eq!(
        plan.unresolved_targets[0].reason,
        SelectionReason::EmptyTarget
    );
    let v = serde_json::to_value(plan.to_object(ObjectMeta::default(), |_| None)).unwrap();
    assert_eq!(v["targetReason"], "VersionNotFound");
    assert!(v.get("target").is_none());
}

// ---- wire objects ----

#[test]
fn machine_object() {
    let w = World::new();
    let index = w.index();
    let m = running("m", &image_of("a", 0));
    let r = index.machine(&m);
    let cve = index.cve(&r, "CVE-1", |_, _, n| n == "a-v1.4");
    let summary = ChangelogSummary {
        advisories: 3,
        ..ChangelogSummary::default()
    };
    let o = r.to_object(
        ObjectMeta {
            name: "m".into(),
            namespace: NS.into(),
            ..ObjectMeta::default()
        },
        Some(summary),
        Some(cve),
    );
    let v = serde_json::to_value(&o).unwrap();
    assert_eq!(v["kind"], "MachineInventoryChangelogSummary");
    assert_eq!(v["os"], json!({"image": image_of("a", 0)}));
    assert_eq!(
        v["current"],
        json!({"name": "a-v1.0", "version": "v1.0", "channel": "a"})
    );
    assert_eq!(
        v["target"],
        json!({"name": "a-v1.4", "version": "v1.4", "channel": "a", "source": "NewestInChannel"})
    );
    assert_eq!(v["state"], "UpdatesAvailable");
    assert_eq!(v["summary"]["advisories"], 3);
    assert_eq!(
        v["cve"],
        json!({"id": "CVE-1", "state": "Exposed", "fixedIn": {"name": "a-v1.4", "version": "v1.4"}})
    );
    // A summary is only shown when something is pending.
    let up = index.machine(&running("u", &image_of("a", 4)));
    let o = up.to_object(
        ObjectMeta::default(),
        Some(ChangelogSummary::default()),
        None,
    );
    assert_eq!(o.summary, None);
    let unknown = index.machine(&running("x", "x/y:1"));
    let v = serde_json::to_value(unknown.to_object(ObjectMeta::default(), None, None)).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("Unknown"), Some("VersionInNoChannel"))
    );
    assert!(v.get("current").is_none() && v.get("target").is_none());
}

#[test]
fn operator_objects_deserialize() {
    // As the operator writes them (docs examples), extra fields ignored; the
    // machine as the reflector stores it.
    let mut m: MachineInventory = serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "MachineInventory",
        "metadata": {"name": "m-479ab68e", "namespace": NS,
            "annotations": {"elemental.cattle.io/auth": "tpm", "elemental.cattle.io/os.image": "reg/os:1",
                "elemental.cattle.io/registration-ip": "192.168.122.152"},
            "labels": {"machineUUID": "f266c64b"},
            "ownerReferences": [{"apiVersion": "elemental.cattle.io/v1beta1", "controller": true,
                "kind": "MachineInventorySelector", "name": "fire-machine-selector-qcn7d", "uid": "0a1f"}]},
        "spec": {"tpmHash": "x", "network": {"config": {}}, "ipAddressClaims": {}},
        "status": {"conditions": [], "plan": {"checksum": "c", "state": "Applied"}}
    }))
    .unwrap();
    reflect::trim_machine(&mut m);
    assert_eq!(m.selector_name(), Some("fire-machine-selector-qcn7d"));
    assert_eq!(m.spec.reported.image.as_deref(), Some("reg/os:1"));
    let i: ManagedOSImage = serde_json::from_value(json!({
        "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSImage",
        "metadata": {"name": "my-upgrade", "namespace": NS},
        "spec": {"managedOSVersionName": "v1", "osImage": "", "cloudConfig": {"a": 1},
            "drain": {"force": true}, "concurrency": 2, "cordon": true,
            "nodeSelector": {"matchLabels": {"a": "b"}},
            "clusterRolloutStrategy": {"maxUnavailable": 1},
            "clusterTargets": [{"clusterName": "c", "clusterSelector": {}, "helm": {"values": {}}}],
            "upgradeContainer": {"image": "x"}}
    }))
    .unwrap();
    assert_eq!(i.spec.managed_os_version_name.as_deref(), Some("v1"));
    assert_eq!(i.spec.cluster_targets[0].cluster_name.as_deref(), Some("c"));
    assert!(i.spec.cluster_targets[0].cluster_selector.is_some());
    let s = selector("s", Some("prod"));
    assert_eq!(s.cluster_name(), Some("prod"));
}

#[test]
fn label_selectors() {
    use super::{labels::Labels, select::selector_matches};
    let labels: BTreeMap<String, String> = [
        ("env".to_owned(), "prod".to_owned()),
        ("tier".to_owned(), "web".to_owned()),
    ]
    .into();
    let sel = |v: Value| serde_json::from_value(v).unwrap();
    assert_eq!(selector_matches(&sel(json!({})), &labels), Ok(true));
    assert_eq!(
        selector_matches(&sel(json!({"matchLabels": {"env": "prod"}})), &labels),
        Ok(true)
    );
    assert_eq!(
        selector_matches(&sel(json!({"matchLabels": {"env": "dev"}})), &labels),
        Ok(false)
    );
    let expr = |op: &str, values: Value| {
        sel(json!({"matchExpressions": [{"key": "env", "operator": op, "values": values}]}))
    };
    assert_eq!(
        selector_matches(&expr("In", json!(["dev", "prod"])), &labels),
        Ok(true)
    );
    assert_eq!(
        selector_matches(&expr("NotIn", json!(["prod"])), &labels),
        Ok(false)
    );
    assert_eq!(
        selector_matches(&expr("Exists", json!([])), &labels),
        Ok(true)
    );
    assert_eq!(
        selector_matches(&expr("DoesNotExist", json!([])), &labels),
        Ok(false)
    );
    assert!(selector_matches(&expr("Gt", json!(["1"])), &labels).is_err());
    let missing =
        sel(json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}));
    assert_eq!(selector_matches(&missing, &labels), Ok(true));

    // The labels a machine keeps match as the map they were made from.
    let kept = Labels::capped(&labels).unwrap();
    for s in [
        sel(json!({})),
        sel(json!({"matchLabels": {"env": "prod"}})),
        sel(json!({"matchLabels": {"env": "prod", "tier": "db"}})),
        sel(json!({"matchLabels": {"zone": ""}})),
        expr("In", json!(["dev", "prod"])),
        expr("In", json!([])),
        expr("NotIn", json!(["prod"])),
        expr("NotIn", json!(["dev"])),
        expr("Exists", json!([])),
        expr("DoesNotExist", json!([])),
        expr("Gt", json!(["1"])),
        missing,
    ] {
        assert_eq!(
            selector_matches(&s, &kept),
            selector_matches(&s, &labels),
            "{s:?}"
        );
    }
}

// ---- properties ----

proptest! {
    /// Over random channel orders: the target is the last version of the
    /// order, the state follows the positions, the pending changelog goes
    /// from current to target, and a CVE is Fixed exactly when its first fix
    /// comes at or before the current version.
    #[test]
    fn state_and_cve_follow_the_channel_order(
        n in 1usize..12,
        perm_seed in any::<u64>(),
        current in 0usize..12,
        fix in proptest::option::of(0usize..12),
    ) {
        let current = current % n;
        let (versions, mut order) = channel(NS, "a", n);
        // A deterministic shuffle of the order.
        let mut seed = perm_seed;
        for i in (1..order.len()).rev() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let j = usize::try_from(seed >> 33).unwrap() % (i + 1);
            order.swap(i, j);
        }
        let orders: BTreeMap<(String, String), Vec<String>> = [((NS.to_owned(), "a".to_owned()), order.clone())].into();
        let index = FleetIndex::new(&versions, &[], &[], Fleet::default(), &orders);
        let r = index.machine(&running("m", &image_of("a", current)));
        let current_name = format!("a-v1.{current}");
        prop_assert_eq!(r.current.as_ref().map(|c| c.name.clone()), Some(current_name.clone()));
        let newest = order.last().unwrap().clone();
        prop_assert_eq!(r.target.as_ref().map(|t| t.name.clone()), Some(newest.clone()));
        let position = order.iter().position(|x| *x == current_name).unwrap();
        if position + 1 == order.len() {
            prop_assert_eq!(r.state, MachineState::UpToDate);
            prop_assert!(r.pending.is_none());
        } else {
            prop_assert_eq!(r.state, MachineState::UpdatesAvailable);
            let p = r.pending.clone().unwrap();
            prop_assert_eq!((p.from, p.to), (current_name.clone(), newest));
        }
        let fix_name = fix.map(|f| format!("a-v1.{}", f % n));
        let c = index.cve(&r, "CVE-X", |_, _, name| Some(name) == fix_name.as_deref());
        match &fix_name {
            None => prop_assert_eq!(c.state, CveState::NoFixInChannel),
            Some(f) => {
                let fp = order.iter().position(|x| x == f).unwrap();
                let want = if fp <= position { CveState::Fixed } else { CveState::Exposed };
                prop_assert_eq!(c.state, want);
                prop_assert_eq!(c.fixed_in.map(|v| v.name), Some(f.clone()));
            }
        }
    }
}

fn reference() -> impl Strategy<Value = String> {
    let component = prop::sample::select(vec![
        "reg.io",
        "mirror:5000",
        "localhost",
        "a",
        "b",
        "docker.io",
        "library",
    ]);
    (
        prop::collection::vec(component, 1..5),
        prop::sample::select(vec![":1", ":2", ""]),
    )
        .prop_map(|(parts, tag)| format!("{}{tag}", parts.join("/")))
}

proptest! {
    /// The index finds exactly the versions a scan with `images_match` and
    /// `versions_match` finds.
    #[test]
    fn index_lookups_equal_a_scan(
        images in prop::collection::vec(proptest::option::of(reference()), 0..12),
        versions in prop::collection::vec(prop::sample::select(vec!["v1", "1", "V1", "v2", "", "2.0"]), 12),
        asked in reference(),
        asked_version in prop::sample::select(vec!["v1", "1", "2", "", "2.0"]),
    ) {
        let all: Vec<ManagedOSVersion> = images
            .iter()
            .enumerate()
            .map(|(i, image)| mov(NS, &format!("v{i:02}"), "a", versions[i], image.as_deref()))
            .collect();
        let orders = BTreeMap::new();
        let index = FleetIndex::new(&all, &[], &[], Fleet::default(), &orders);
        let (by_image, by_version) = index.lookup(NS, &asked, asked_version);
        let scan_image: Vec<String> = all
            .iter()
            .filter(|v| super::os::upgrade_image(v).is_some_and(|i| images_match(&asked, i)))
            .map(|v| v.metadata.name.clone().unwrap())
            .collect();
        let scan_version: Vec<String> = all
            .iter()
            .filter(|v| versions_match(asked_version, &v.spec.version))
            .map(|v| v.metadata.name.clone().unwrap())
            .collect();
        prop_assert_eq!(by_image, scan_image);
        prop_assert_eq!(by_version, scan_version);
    }
}

// ---- objects past the reflector's caps ----

#[test]
fn a_machine_past_a_cap_is_unknown_and_never_resolved_from_what_is_left() {
    let mut w = World::new();
    w.images.push(moi(
        NS,
        "everything",
        json!({"managedOSVersionName": "a-v1.2", "clusterTargets": [{"clusterName": "prod"}]}),
    ));
    let index = w.index();
    let padded = machine(
        "padded",
        json!({
            "elemental.cattle.io/os.image": image_of("a", 0),
            "elemental.cattle.io/os.version": "v".repeat(caps::MAX_OS_VALUE_BYTES + 1),
        }),
        json!({}),
        Some("sel-1"),
    );
    let r = index.machine(&padded);
    assert_eq!(r.state, MachineState::Unknown);
    assert_eq!(r.reason, Some(MachineReason::MetadataTooLarge));
    assert!(
        r.message.as_deref().unwrap().contains(&format!(
            "elemental.cattle.io/os.version is {} bytes long",
            caps::MAX_OS_VALUE_BYTES + 1
        )),
        "{r:?}"
    );
    assert_eq!((r.current, r.target, r.pending), (None, None, None));
    assert_eq!(r.reported, Reported::default());
    let cve = index.cve(&index.machine(&padded), "CVE-1", |_, _, _| true);
    assert_eq!(cve.state, CveState::Unknown);

    // A plan lists it among the unknown machines, whatever it would select.
    let ordinary = in_cluster("ordinary", &image_of("a", 0), "sel-1", json!({}));
    let plan = index.plan(&w.images[0], [&padded, &ordinary]);
    assert_eq!(plan.groups.len(), 1);
    assert_eq!(plan.groups[0].machines, ["ordinary"]);
    assert_eq!(plan.unknown_machines.len(), 1);
    assert_eq!(plan.unknown_machines[0].name, "padded");
    assert_eq!(plan.unknown_machines[0].reason, "MetadataTooLarge");

    // Within the caps, the same machine resolves as any other.
    let fine = machine(
        "fine",
        json!({"elemental.cattle.io/os.image": image_of("a", 0), "elemental.cattle.io/os.padding": "p".repeat(100_000)}),
        json!({}),
        Some("sel-1"),
    );
    let r = index.machine(&fine);
    assert_eq!(r.current.unwrap().name, "a-v1.0");
    assert_eq!(r.target.unwrap().name, "a-v1.2");
}

#[test]
fn a_managed_os_image_past_a_cap_is_unresolved_and_selects_undecidably() {
    let mut w = World::new();
    let targets: Vec<Value> = (0..2000)
        .map(|i| json!({"clusterName": format!("cluster-{i:040}")}))
        .collect();
    let mut image = moi(
        NS,
        "huge",
        json!({"managedOSVersionName": "a-v1.2", "clusterTargets": targets}),
    );
    reflect::trim_image(&mut image);
    w.images.push(image.clone());
    let index = w.index();
    let m = in_cluster("m", &image_of("a", 0), "sel-1", json!({}));
    let r = index.machine(&m);
    let target = r.target.unwrap();
    assert_eq!(
        (target.name.as_str(), target.source, target.reason),
        (
            "a-v1.4",
            TargetSource::NewestInChannel,
            Some(TargetReason::ClusterUnresolved)
        )
    );
    assert!(
        target.message.unwrap().contains("ManagedOSImage huge"),
        "the message names the image"
    );
    let plan = index.plan(&image, [&m]);
    assert!(matches!(
        plan.target,
        PlanTarget::Unresolved {
            reason: PlanTargetReason::ManagedOSImageTooLarge,
            ..
        }
    ));
    assert_eq!(plan.unknown_machines[0].reason, "ManagedOSImageTooLarge");
}
