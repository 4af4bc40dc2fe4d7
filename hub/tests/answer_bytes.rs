//! What a hub keeps per machine answer (issue 25: 50,000 machines within the chart's
//! 256 Mi): 10,000 machine answers as the fleet view computes them (a resolved machine with a
//! target and a pending summary), put into a hub as the machines' projector does (its ring of
//! recent events included, at its default bound), and the heap the
//! hub then holds per machine, measured with a counting global allocator. The bound fails the
//! test when an answer keeps more than its own bytes (identity and report; what follows, the
//! same for every machine on the same version with the same target, is kept once) and a
//! little bookkeeping; a second pass with the same answers (a pass after an unrelated change)
//! must hold nothing more.
//!
//! The heap held is what the allocator was asked for and not given back (requested sizes).

use elemental_changelog_apiservice::fleet::MachineInventoryChangelogSummary;
use elemental_changelog_hub::{Bounds, Clock, Object as _};

// dhat's allocator counts the bytes currently allocated (this workspace forbids the `unsafe`
// a hand-written counting allocator needs).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Answers kept.
const MACHINES: usize = 10_000;

/// Most heap bytes the hub may hold per answer beyond the answer's own JSON: measured 230 (the
/// key, the item, the map's share) when the hub kept all of each answer's JSON, with a little
/// headroom. Before the hub kept answers as bytes only, it also held the typed answer (about
/// 1.5 KiB more) and the spare capacity of each JSON buffer.
const MAX_OVERHEAD_PER_MACHINE: u64 = 300;

/// Bytes currently allocated on the heap.
fn live() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

/// Machine `i`'s answer, as the fleet view computes it.
fn answer(i: usize) -> MachineInventoryChangelogSummary {
    let minor = i % 7;
    serde_json::from_value(serde_json::json!({
        "apiVersion": "changelog.elemental.cattle.io/v1beta1",
        "kind": "MachineInventoryChangelogSummary",
        "metadata": {
            "name": format!("m-{i:05}"),
            "namespace": "fleet-default",
            "uid": format!("6f1c0d2e-8a4b-4c1e-9f3a-{i:012x}"),
            "resourceVersion": format!("{}", 1_048_576 + i),
            "creationTimestamp": "2026-11-02T08:15:42Z",
            "labels": {
                "elemental.cattle.io/manufacturer": "Dell-Inc",
                "location": format!("rack-{:02}", i % 40),
            },
        },
        "os": {
            "image": format!("registry.example.com/channel-a/os:v1.2.{minor}"),
            "version": format!("v1.2.{minor}"),
            "prettyName": format!("SUSE Linux Micro 6.1 (\"v1.2.{minor}\")"),
        },
        "current": {"name": format!("v1-2-{minor}"), "version": format!("v1.2.{minor}"), "channel": "channel-a"},
        "target": {"name": "v1-2-9", "version": "v1.2.9", "channel": "channel-a", "source": "NewestInChannel"},
        "state": "UpdatesAvailable",
        "summary": {
            "advisories": 12 + minor,
            "byType": {"security": 7, "recommended": 5 + minor},
            "cves": 21,
            "highestSeverity": "Important",
            "packagesUpgraded": 40,
        },
    }))
    .unwrap_or_else(|e| panic!("answer {i}: {e}"))
}

#[test]
fn an_answer_keeps_its_bytes_and_little_more() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let answers: Vec<_> = (0..MACHINES).map(answer).collect();
    let json_bytes: u64 = answers
        .iter()
        .map(|a| serde_json::to_vec(a).map_or(0, |v| v.len() as u64))
        .sum();
    let own_bytes: u64 = answers
        .iter()
        .map(|a| serde_json::to_vec(a).map_or(0, |v| a.own_range(&v).len() as u64))
        .sum();
    let before = live();
    let (mut hub, reader) = elemental_changelog_hub::new::<MachineInventoryChangelogSummary>(
        std::sync::Arc::new(Clock::with_epoch(1)),
        Bounds::default(),
    );
    // As the projector hands them over: one at a time.
    let mut sweep = hub.sweep(None);
    for answer in answers.iter().cloned() {
        sweep.put(answer);
    }
    assert_eq!(sweep.finish(), MACHINES);
    let held = live() - before;
    let machines = MACHINES as u64;
    let per_machine = held / machines;
    let overhead = held.saturating_sub(own_bytes) / machines;
    println!(
        "{MACHINES} answers of {} bytes of JSON each held {held} heap bytes: {per_machine} per machine, of which {} of its own JSON and {overhead} of bookkeeping and shared parts",
        json_bytes / machines,
        own_bytes / machines,
    );
    assert!(
        own_bytes * 10 < json_bytes * 6,
        "an answer's own bytes are its identity and report: {own_bytes} of {json_bytes}"
    );
    assert_eq!(reader.list(None).iter().count(), MACHINES);
    assert!(
        overhead <= MAX_OVERHEAD_PER_MACHINE,
        "an answer keeps {overhead} heap bytes besides its own JSON, more than the {MAX_OVERHEAD_PER_MACHINE} allowed"
    );

    // The same answers again (a pass after a change no answer reads): no event, nothing more held.
    assert_eq!(hub.replace(None, answers.iter().cloned()), 0);
    let again = live() - before;
    // (1 % of slack: the allocator's bookkeeping of the test harness's own threads.)
    assert!(
        again <= held + held / 100,
        "a pass with the same answers left {again} heap bytes held, {held} before it"
    );
}
