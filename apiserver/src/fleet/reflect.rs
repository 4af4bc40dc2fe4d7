//! What the fleet view watches: MachineInventories, MachineInventorySelectors and
//! ManagedOSImages of the watched namespaces, trimmed to what the resolution reads, through
//! the server's one watch driver ([`crate::reflect`]).
//!
//! The three kinds are optional: a kind whose CRD is not installed (no elemental-operator, or
//! one too old to have it) is treated as empty, logged once, counts as synced for readiness,
//! and is listed again every 30 s, so the objects appear once the CRD does. The
//! ManagedOSVersion kinds are different: without them the server has nothing to serve and
//! stays unready.
//!
//! Each object is trimmed to what the view reads before it is stored, and what is kept is
//! capped, so that memory per object is bounded whatever a registering machine sends (the
//! operator stores every annotation a machine sends, of any key and length, as
//! `elemental.cattle.io/<key>`, and renders the MachineRegistration's label templates from
//! the machine's hardware data, without an administrator): a machine keeps what the
//! resolution reads of the `os.*` annotations ([`READ_ANNOTATIONS`], each at most
//! [`MAX_OS_VALUE_BYTES`]) parsed into its spec, not the annotations, and at most
//! [`MAX_LABELS`](super::caps::MAX_LABELS) labels of at most
//! [`MAX_LABEL_BYTES`](super::caps::MAX_LABEL_BYTES) together. An object past a cap keeps
//! only its identity (name, namespace, uid, resourceVersion, creation; a machine also the
//! name of its MachineInventorySelector) and the [`Oversize`] marker: the view
//! answers `Unknown` (`MetadataTooLarge`) for it, never from a partial copy. Lists are read
//! in pages of [`LIST_PAGE_SIZE`] objects, so a list of padded objects is never held whole.

use std::{io, sync::Arc};

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Client, runtime::watcher};
use tracing::warn;

use super::caps::{MAX_IMAGE_SPEC_BYTES, MAX_OS_VALUE_BYTES, Oversize, labels_oversize};
use super::crd::{
    CLUSTER_NAME_LABEL, MachineInventory, MachineInventorySelector, ManagedOSImage,
    controller_selector,
};
use super::labels::Labels;
use super::os::{READ_ANNOTATIONS, Reported};
use crate::{
    health::Health,
    reflect::{self, Kind, Stores, WatchMetrics, WatchedResource},
};

/// Objects per page when a fleet kind is listed (at start and at every re-list). A page is
/// held whole while it is parsed, before its objects are trimmed, and the allocator keeps
/// much of what a large page took: with 500 MachineInventories of 192 KiB of metadata, a
/// server started with kube-runtime's default page (500) peaked at 381 MiB (past the chart's
/// 256 Mi limit at every start) and kept 172 MiB more than before them; with pages of 50, 52
/// MiB more; with pages of 10, 14–15 MiB (`integration/tests/padded.rs`). The cost: 50,000
/// ordinary machines list in 5,000 requests (5,000 took 2.0–2.5 s in pages of 10, 0.75–1.5 s
/// in pages of 500, on a loopback test bed).
pub const LIST_PAGE_SIZE: u32 = 10;

/// The read side of the fleet reflectors.
#[derive(Clone)]
pub struct FleetStores {
    /// MachineInventories: name, namespace, uid, resourceVersion, creation, and in the spec
    /// at most [`MAX_LABELS`](super::caps::MAX_LABELS) labels ([`Labels`]), the OS reported and the selector's name only
    /// (or, past a cap, the [`Oversize`] marker instead of labels and report).
    pub machines: Stores<MachineInventory>,
    /// MachineInventorySelectors: the cluster-name label only.
    pub selectors: Stores<MachineInventorySelector>,
    /// ManagedOSImages: spec fields read and labels, capped.
    pub images: Stores<ManagedOSImage>,
}

/// Drops what no fleet object is read for: managedFields, finalizers, annotations.
fn trim_common(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.annotations = None;
}

/// What a MachineInventory keeps: its identity, and in its spec what the view reads of its
/// labels, annotations and owner references, read once here: its labels, compactly
/// ([`Labels`], moved out of `metadata.labels`), the OS it reports ([`Reported`], from the read
/// `os.*` annotations) and the MachineInventorySelector that adopted it
/// ([`controller_selector`]). Its annotations and owner references are dropped. Past a cap,
/// it keeps its identity, the selector and the marker only (no labels, nothing reported).
/// Applied once to each machine as read from the API (its spec is never deserialized, so it
/// starts empty).
pub fn trim_machine(m: &mut MachineInventory) {
    let meta = &mut m.metadata;
    let annotations = meta.annotations.take().unwrap_or_default();
    let owners = meta.owner_references.take().unwrap_or_default();
    let labels = meta.labels.take().unwrap_or_default();
    trim_common(meta);
    m.spec.selector = controller_selector(&owners).map(Box::from);
    let kept = READ_ANNOTATIONS
        .iter()
        .find_map(|key| {
            let bytes = annotations.get(*key)?.len();
            (bytes > MAX_OS_VALUE_BYTES).then_some(Oversize::OsValue { key, bytes })
        })
        .map_or_else(|| Labels::capped(&labels), Err);
    match kept {
        Ok(labels) => {
            m.spec.labels = labels;
            m.spec.reported = Reported::from_annotations(&annotations);
            m.spec.oversize = None;
        }
        Err(oversize) => {
            m.spec.labels = Labels::default();
            m.spec.reported = Reported::default();
            m.spec.oversize = Some(oversize);
        }
    }
}

/// What a MachineInventorySelector keeps: its cluster-name label (a label value is at most
/// 63 bytes) and its identity.
pub(super) fn trim_selector(s: &mut MachineInventorySelector) {
    trim_common(&mut s.metadata);
    s.metadata.owner_references = None;
    if let Some(labels) = &mut s.metadata.labels {
        labels.retain(|k, _| k == CLUSTER_NAME_LABEL);
    }
}

/// Counts the bytes written to it.
#[derive(Default)]
struct Count(usize);

impl io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What a ManagedOSImage keeps: the spec fields read (typed; others are never
/// deserialized), its labels and its identity; past a cap, its identity and the marker only.
pub(super) fn trim_image(i: &mut ManagedOSImage) {
    trim_common(&mut i.metadata);
    i.metadata.owner_references = None;
    let mut spec_bytes = Count::default();
    // Serializing these typed fields cannot fail; a failure counts as too large.
    let spec_bytes =
        serde_json::to_writer(&mut spec_bytes, &i.spec).map_or(usize::MAX, |()| spec_bytes.0);
    let oversize = (spec_bytes > MAX_IMAGE_SPEC_BYTES)
        .then_some(Oversize::SpecBytes { bytes: spec_bytes })
        .or_else(|| i.metadata.labels.as_ref().and_then(labels_oversize));
    if let Some(oversize) = oversize {
        i.metadata.labels = None;
        i.spec = Default::default();
        i.spec.oversize = Some(oversize);
    }
}

/// Starts the fleet reflectors (one watch per namespace and kind, or one per kind for all
/// namespaces) and registers the readiness check `fleet-informer-sync`. Returns the stores
/// and the future that runs the watches (it ends only if one stops, which is fatal).
pub fn start(
    client: &Client,
    namespaces: &[String],
    metrics: &Arc<WatchMetrics>,
    health: &Health,
) -> (FleetStores, BoxFuture<'static, ()>) {
    let mut drivers: Vec<BoxFuture<'static, ()>> = Vec::new();
    let machines = reflect::watch(
        client,
        namespaces,
        Kind::optional(WatchedResource::MachineInventories, trim_machine).paged(LIST_PAGE_SIZE),
        metrics,
        &mut drivers,
        |_: &watcher::Event<_>| {},
    );
    let selectors = reflect::watch(
        client,
        namespaces,
        Kind::optional(WatchedResource::MachineInventorySelectors, trim_selector)
            .paged(LIST_PAGE_SIZE),
        metrics,
        &mut drivers,
        |_: &watcher::Event<_>| {},
    );
    let images = reflect::watch(
        client,
        namespaces,
        Kind::optional(WatchedResource::ManagedOsImages, trim_image).paged(LIST_PAGE_SIZE),
        metrics,
        &mut drivers,
        |_: &watcher::Event<_>| {},
    );
    let synced = health.ready_flag("fleet-informer-sync");
    let stores = FleetStores {
        machines,
        selectors,
        images,
    };
    drivers.push(Box::pin({
        let stores = stores.clone();
        async move {
            stores.machines.wait_until_ready().await;
            stores.selectors.wait_until_ready().await;
            stores.images.wait_until_ready().await;
            synced.set();
            // Ends only with the process, as every driver does.
            std::future::pending::<()>().await;
        }
    }));
    let run = async move {
        let mut all: futures::stream::FuturesUnordered<_> = drivers.into_iter().collect();
        if futures::StreamExt::next(&mut all).await.is_some() {
            warn!("a fleet watch stopped");
        }
    };
    (stores, Box::pin(run))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
    use serde_json::json;

    use super::*;
    use crate::fleet::caps::{MAX_LABEL_BYTES, MAX_LABELS};
    use crate::fleet::os::{
        OS_CPE_NAME, OS_IMAGE, OS_NAME, OS_PRETTY_NAME, OS_VERSION, OS_VERSION_ID,
    };

    fn machine(annotations: &[(&str, String)], labels: &[(String, String)]) -> MachineInventory {
        let mut m = MachineInventory::new("m", Default::default());
        m.metadata.namespace = Some("ns".to_owned());
        m.metadata.uid = Some("uid-m".to_owned());
        m.metadata.resource_version = Some("7".to_owned());
        m.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        m.metadata.finalizers = Some(vec!["x".to_owned()]);
        m.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        );
        m.metadata.labels = Some(labels.iter().cloned().collect());
        let owner = |kind: &str, controller| OwnerReference {
            api_version: "elemental.cattle.io/v1beta1".to_owned(),
            kind: kind.to_owned(),
            name: "sel".to_owned(),
            uid: "u".to_owned(),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        m.metadata.owner_references = Some(vec![
            owner("MachineInventorySelector", true),
            owner("Other", false),
        ]);
        m
    }

    fn labels(count: usize, value_len: usize) -> Vec<(String, String)> {
        (0..count)
            .map(|i| (format!("l{i:03}"), "v".repeat(value_len)))
            .collect()
    }

    /// The identity every trimmed machine keeps, past a cap or not, and what it never keeps.
    fn assert_identity(m: &MachineInventory) {
        assert_eq!(m.metadata.name.as_deref(), Some("m"));
        assert_eq!(m.metadata.uid.as_deref(), Some("uid-m"));
        assert_eq!(m.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(m.selector_name(), Some("sel"));
        assert_eq!(m.metadata.owner_references, None);
        assert_eq!(m.metadata.annotations, None);
        assert_eq!(m.metadata.managed_fields, None);
        assert_eq!(m.metadata.finalizers, None);
        assert_eq!(m.metadata.labels, None, "moved into the spec");
    }

    #[test]
    fn machines_keep_what_is_read_of_their_annotations() {
        let mut m = machine(
            &[
                (OS_IMAGE, " x:1 ".to_owned()),
                (OS_VERSION, "1".to_owned()),
                (OS_VERSION_ID, String::new()),
                (OS_PRETTY_NAME, "SL Micro &#34;6.1&#34;".to_owned()),
                (OS_NAME, "SL Micro".to_owned()),
                (OS_CPE_NAME, "cpe:/o:suse".to_owned()),
                // Not read: dropped whatever their size, the machine is still resolved.
                ("elemental.cattle.io/os.padding", "p".repeat(200 * 1024)),
                (
                    "kubectl.kubernetes.io/last-applied-configuration",
                    "{}".to_owned(),
                ),
            ],
            &labels(3, 10),
        );
        trim_machine(&mut m);
        assert_identity(&m);
        assert_eq!(m.spec.oversize, None);
        // Trimmed, unescaped, empty values absent: what `Reported::from_annotations` reads.
        assert_eq!(
            m.spec.reported,
            Reported {
                image: Some("x:1".into()),
                version: Some("1".into()),
                version_id: None,
                pretty_name: Some("SL Micro \"6.1\"".into()),
                unmanaged: false,
            }
        );
        assert_eq!(
            m.spec.labels.to_map(),
            labels(3, 10).into_iter().collect::<BTreeMap<_, _>>()
        );
    }

    #[test]
    fn only_a_controller_selector_of_elemental_is_the_selector() {
        let owner = |api_version: &str, kind: &str, name: &str, controller| OwnerReference {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            uid: "u".to_owned(),
            controller,
            ..OwnerReference::default()
        };
        let selector = |owners: Vec<OwnerReference>| {
            let mut m = machine(&[], &[]);
            m.metadata.owner_references = Some(owners);
            trim_machine(&mut m);
            m.spec.selector
        };
        let api = "elemental.cattle.io/v1beta1";
        let kind = "MachineInventorySelector";
        assert_eq!(
            selector(vec![owner(api, kind, "s", Some(true))]).as_deref(),
            Some("s")
        );
        assert_eq!(selector(vec![owner(api, kind, "s", Some(false))]), None);
        assert_eq!(selector(vec![owner(api, kind, "s", None)]), None);
        assert_eq!(selector(vec![owner(api, "Other", "s", Some(true))]), None);
        assert_eq!(
            selector(vec![owner("other.io/v1", kind, "s", Some(true))]),
            None
        );
        assert_eq!(selector(vec![owner(api, kind, "", Some(true))]), None);
        assert_eq!(
            selector(vec![
                owner(api, kind, "not", Some(false)),
                owner(api, kind, "yes", Some(true))
            ])
            .as_deref(),
            Some("yes")
        );
        assert_eq!(selector(Vec::new()), None);
    }

    #[test]
    fn a_value_at_the_cap_is_kept_one_past_it_drops_the_metadata() {
        let mut at = machine(
            &[(OS_PRETTY_NAME, "n".repeat(MAX_OS_VALUE_BYTES))],
            &labels(1, 1),
        );
        trim_machine(&mut at);
        assert_eq!(at.spec.oversize, None);
        assert_eq!(
            at.spec.reported.pretty_name.as_deref(),
            Some("n".repeat(MAX_OS_VALUE_BYTES).as_str())
        );

        let mut past = machine(
            &[
                (OS_IMAGE, "x:1".to_owned()),
                (OS_PRETTY_NAME, "n".repeat(MAX_OS_VALUE_BYTES + 1)),
            ],
            &labels(1, 1),
        );
        trim_machine(&mut past);
        assert_identity(&past);
        assert_eq!(
            past.spec.oversize,
            Some(Oversize::OsValue {
                key: OS_PRETTY_NAME,
                bytes: MAX_OS_VALUE_BYTES + 1
            })
        );
        assert_eq!(
            past.spec.reported,
            Reported::default(),
            "never kept in part"
        );
        assert!(past.spec.labels.is_empty());
    }

    #[test]
    fn labels_past_the_count_or_the_bytes_drop_the_metadata() {
        let image = || vec![(OS_IMAGE, "x:1".to_owned())];
        let mut at = machine(&image(), &labels(MAX_LABELS, 1));
        trim_machine(&mut at);
        assert_eq!(at.spec.oversize, None);
        assert_eq!(at.spec.labels.len(), MAX_LABELS);

        let mut many = machine(&image(), &labels(MAX_LABELS + 1, 1));
        trim_machine(&mut many);
        assert_eq!(
            many.spec.oversize,
            Some(Oversize::LabelCount {
                count: MAX_LABELS + 1
            })
        );
        assert_eq!(
            (many.spec.labels, many.spec.reported),
            (Labels::default(), Reported::default())
        );

        // 32 labels of 4 + 252 bytes: 8192, the cap; one more byte passes it.
        let exactly = labels(32, MAX_LABEL_BYTES / 32 - 4);
        let mut at = machine(&image(), &exactly);
        trim_machine(&mut at);
        assert_eq!(at.spec.oversize, None);
        assert_eq!(at.spec.labels.len(), 32);
        let mut over = exactly.clone();
        over[0].1.push('v');
        let mut past = machine(&image(), &over);
        trim_machine(&mut past);
        assert_identity(&past);
        assert_eq!(
            past.spec.oversize,
            Some(Oversize::LabelBytes {
                bytes: MAX_LABEL_BYTES + 1
            })
        );
        assert!(past.spec.labels.is_empty());
    }

    #[test]
    fn the_reason_names_the_cap() {
        let message = Oversize::OsValue {
            key: OS_IMAGE,
            bytes: 5000,
        }
        .to_string();
        assert_eq!(
            message,
            "the annotation elemental.cattle.io/os.image is 5000 bytes long, more than the 1024 this server keeps"
        );
    }

    #[test]
    fn selectors_keep_only_the_cluster_label() {
        let mut s: MachineInventorySelector = serde_json::from_value(json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "MachineInventorySelector",
            "metadata": {"name": "s", "namespace": "ns",
                "labels": {CLUSTER_NAME_LABEL: "prod", "other": "x".repeat(60)},
                "annotations": {"a": "b"}},
            "spec": {}
        }))
        .unwrap();
        trim_selector(&mut s);
        assert_eq!(s.cluster_name(), Some("prod"));
        assert_eq!(s.metadata.labels.unwrap().len(), 1);
        assert_eq!(s.metadata.annotations, None);
    }

    fn image(spec: serde_json::Value, labels: serde_json::Value) -> ManagedOSImage {
        serde_json::from_value(json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "ManagedOSImage",
            "metadata": {"name": "i", "namespace": "ns", "labels": labels},
            "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn images_past_the_spec_or_label_caps_keep_only_the_marker() {
        let mut small = image(
            json!({"managedOSVersionName": "v1", "upgradeContainer": {"image": "x".repeat(100_000)}}),
            json!({"a": "b"}),
        );
        trim_image(&mut small);
        assert_eq!(small.spec.oversize, None, "unread fields are not kept");
        assert_eq!(small.spec.managed_os_version_name.as_deref(), Some("v1"));
        assert_eq!(small.metadata.labels.unwrap().len(), 1);

        let targets: Vec<_> = (0..2000)
            .map(|i| json!({"clusterName": format!("cluster-{i:040}")}))
            .collect();
        let mut big = image(
            json!({"managedOSVersionName": "v1", "clusterTargets": targets}),
            json!({"a": "b"}),
        );
        trim_image(&mut big);
        assert!(matches!(
            big.spec.oversize,
            Some(Oversize::SpecBytes { bytes }) if bytes > MAX_IMAGE_SPEC_BYTES
        ));
        assert!(big.spec.cluster_targets.is_empty());
        assert_eq!(big.spec.managed_os_version_name, None);
        assert_eq!(big.metadata.labels, None);

        let many: serde_json::Map<_, _> = (0..=MAX_LABELS)
            .map(|i| (format!("l{i}"), json!("v")))
            .collect();
        let mut labelled = image(json!({"managedOSVersionName": "v1"}), many.into());
        trim_image(&mut labelled);
        assert_eq!(
            labelled.spec.oversize,
            Some(Oversize::LabelCount {
                count: MAX_LABELS + 1
            })
        );
        assert_eq!(labelled.spec.managed_os_version_name, None);
    }
}
