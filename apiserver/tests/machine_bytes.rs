//! What the fleet view keeps per MachineInventory: realistic machines, as the operator writes
//! them, read from JSON, trimmed by the fleet reflector's trim and listed into the reflector
//! stores (`Stores`/`Feeder`, the path every watched object takes), and the heap the stores
//! then hold, per machine, measured with a counting global allocator. The bound fails the test
//! when what a machine keeps grows (issue 25: 50,000 machines within the chart's 256 Mi), or
//! when a re-list leaves the machines it replaced behind.
//!
//! The heap held is what the allocator was asked for and not given back (requested sizes); a
//! process pays more per allocation (glibc's malloc: a 16-byte header and rounding to 16), so
//! the allocations per machine are printed too.

use std::sync::Arc;

use elemental_changelog_apiserver::{
    fleet::{crd::MachineInventory, reflect::trim_machine},
    reflect::{Feeder, Stores},
};
use kube::runtime::watcher::Event;

// dhat's allocator counts the bytes currently allocated (this workspace forbids the `unsafe`
// a hand-written counting allocator needs).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Machines listed.
const MACHINES: usize = 10_000;

/// Most heap bytes the stores may hold per machine: 965 measured (in 13.2 allocations), with a
/// little headroom (1,457 in 22.2 allocations while the labels were kept in `metadata.labels`, a
/// `BTreeMap`; 1,636 in kube-runtime's reflector store; 2,416 before that while the read
/// annotations and the owner reference were kept as such).
const MAX_BYTES_PER_MACHINE: u64 = 1_050;

/// Bytes and blocks currently allocated on the heap.
fn live() -> (u64, u64) {
    let stats = dhat::HeapStats::get();
    (stats.curr_bytes as u64, stats.curr_blocks as u64)
}

/// Machine `i` as the API serves it: the operator's annotations (the `os.*` ones
/// `elemental-register` sends, HTML-escaped, and others the view never reads), the labels a
/// MachineRegistration renders from the hardware, the controller reference to the
/// MachineInventorySelector that adopted it, a finalizer, managedFields, spec and status.
fn machine_json(i: usize) -> String {
    let uid = format!("6f1c0d2e-8a4b-4c1e-9f3a-{i:012x}");
    let selector_uid = format!("0a1f3c5e-7b9d-4e2f-8a6c-{i:012x}");
    let minor = i % 7;
    serde_json::json!({
        "apiVersion": "elemental.cattle.io/v1beta1",
        "kind": "MachineInventory",
        "metadata": {
            "name": format!("m-{i:05}"),
            "namespace": "fleet-default",
            "uid": uid,
            "resourceVersion": format!("{}", 1_048_576 + i),
            "generation": 1,
            "creationTimestamp": "2026-11-02T08:15:42Z",
            "labels": {
                "machineUUID": uid,
                "elemental.cattle.io/manufacturer": "Dell-Inc",
                "elemental.cattle.io/productName": "PowerEdge-R650",
                "elemental.cattle.io/serialNumber": format!("SN{i:08}"),
                "location": format!("rack-{:02}", i % 40),
            },
            "annotations": {
                "elemental.cattle.io/auth": "tpm",
                "elemental.cattle.io/registration-ip": format!("10.{}.{}.{}", i / 65_536 % 256, i / 256 % 256, i % 256),
                "elemental.cattle.io/os.image": format!("registry.example.com/channel-a/os:v1.2.{minor}"),
                "elemental.cattle.io/os.version": format!("v1.2.{minor}"),
                "elemental.cattle.io/os.version-id": format!("1.2.{minor}"),
                "elemental.cattle.io/os.pretty-name": format!("SUSE Linux Micro 6.1 (&#34;v1.2.{minor}&#34;)"),
                "elemental.cattle.io/os.name": "SUSE Linux Micro",
                "elemental.cattle.io/os.id": "sl-micro",
                "elemental.cattle.io/os.cpe-name": "cpe:/o:suse:sl-micro:6.1",
                "kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"elemental.cattle.io/v1beta1\",\"kind\":\"MachineInventory\"}",
            },
            "ownerReferences": [{
                "apiVersion": "elemental.cattle.io/v1beta1",
                "kind": "MachineInventorySelector",
                "name": format!("fire-machine-selector-{i:05}"),
                "uid": selector_uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
            "finalizers": ["machineinventory.elemental.cattle.io"],
            "managedFields": [{
                "manager": "elemental-operator",
                "operation": "Update",
                "apiVersion": "elemental.cattle.io/v1beta1",
                "time": "2026-11-02T08:15:42Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:elemental.cattle.io/auth": {}}, "f:labels": {".": {}}}},
            }],
        },
        "spec": {"tpmHash": format!("{i:064x}"), "machineHash": "", "ipAddressClaims": {}},
        "status": {"plan": {"checksum": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "state": "Applied"}},
    })
    .to_string()
}

/// Lists `MACHINES` machines into the store of `feeder`, as the fleet reflector does (each
/// object trimmed, then applied).
fn list(feeder: &mut Feeder<MachineInventory>) {
    feeder.apply_watcher_event(&Event::Init);
    for i in 0..MACHINES {
        let json = machine_json(i);
        let event = Event::InitApply(serde_json::from_str(&json).unwrap_or_else(|e| {
            panic!("machine {i} does not parse: {e}");
        }))
        .modify(trim_machine);
        feeder.apply_watcher_event(&event);
    }
    feeder.apply_watcher_event(&Event::InitDone);
}

#[test]
fn a_machine_keeps_little() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let (before_bytes, before_blocks) = live();
    let (stores, mut feeder) = Stores::<MachineInventory>::single();
    list(&mut feeder);
    let (after_bytes, after_blocks) = live();
    let (bytes, blocks) = (after_bytes - before_bytes, after_blocks - before_blocks);
    let machines = MACHINES as u64;
    let per_machine = bytes / machines;
    println!(
        "{MACHINES} machines held {bytes} heap bytes in {blocks} allocations: {per_machine} bytes and {:.1} allocations per machine",
        blocks as f64 / machines as f64
    );
    // What was measured is what is served.
    let all = stores.list(None);
    assert_eq!(all.len(), MACHINES);
    let first: &Arc<MachineInventory> = &all[0];
    assert_eq!(first.metadata.name.as_deref(), Some("m-00000"));
    assert_eq!(first.selector_name(), Some("fire-machine-selector-00000"));
    assert_eq!(
        first.spec.reported.pretty_name.as_deref(),
        Some("SUSE Linux Micro 6.1 (\"v1.2.0\")")
    );
    assert_eq!(first.spec.labels.len(), 5);
    assert_eq!(first.spec.labels.get("location"), Some("rack-00"));
    assert!(stores.get("fleet-default", "m-09999").is_some());
    drop(all);
    assert!(
        per_machine <= MAX_BYTES_PER_MACHINE,
        "a machine keeps {per_machine} heap bytes, more than the {MAX_BYTES_PER_MACHINE} allowed"
    );

    // A re-list (each watch's, when its resourceVersion expired) replaces the machines: the
    // old ones are freed, nothing is held twice.
    list(&mut feeder);
    let relisted = live().0 - before_bytes;
    println!("after a re-list: {relisted} heap bytes");
    assert!(
        relisted <= bytes + bytes / 100,
        "a re-list left {relisted} heap bytes held, {bytes} before it"
    );
}
