//! The hub: events only for changed answers, resumes, expiry, bounds in bytes, lazy initial
//! objects, one writer.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use elemental_changelog_apiservice::types::ManagedOSVersionChangelogSummary as Summary;

use super::*;

fn summary(namespace: &str, name: &str, label: &str) -> Summary {
    let mut s = Summary::new();
    s.metadata.namespace = namespace.to_owned();
    s.metadata.name = name.to_owned();
    s.metadata.labels = BTreeMap::from([("tier".to_owned(), label.to_owned())]);
    s
}

fn hub() -> (Writer<Summary>, Reader<Summary>) {
    new(Arc::new(Clock::with_epoch(7)), Bounds::default())
}

fn hub_with_ring(bytes: usize) -> (Writer<Summary>, Reader<Summary>) {
    new(Arc::new(Clock::with_epoch(7)), Bounds { ring_bytes: bytes })
}

/// What `watcher` reads now without waiting: (kind, name, resourceVersion); the initial
/// objects as ADDED; "BEHIND" when it fell behind.
fn drain(watcher: &mut Watcher<Summary>) -> Vec<(&'static str, String, String)> {
    let mut out = Vec::new();
    loop {
        let batch = watcher
            .next_initial(100)
            .or_else(|| watcher.next_events(100));
        match batch {
            None => return out,
            Some(Batch::Initial(items)) => out.extend(
                items
                    .iter()
                    .map(|i| ("ADDED", i.name().to_owned(), i.version.text())),
            ),
            Some(Batch::InitialEnd(_)) => {}
            Some(Batch::Events(events)) => out.extend(events.iter().map(|e| {
                (
                    e.kind.as_str(),
                    e.item.name().to_owned(),
                    e.item.version.text(),
                )
            })),
            Some(Batch::Behind) => {
                out.push(("BEHIND", String::new(), String::new()));
                return out;
            }
        }
    }
}

fn kinds(seen: Vec<(&'static str, String, String)>) -> Vec<(&'static str, String)> {
    seen.into_iter().map(|(k, n, _)| (k, n)).collect()
}

#[test]
fn only_changed_answers_get_a_new_resource_version_and_an_event() {
    let (mut hub, reader) = hub();
    assert_eq!(
        hub.replace(None, vec![summary("a", "x", "1"), summary("a", "y", "1")]),
        2
    );
    let list = reader.list(None);
    assert_eq!(list.iter().count(), 2);
    let x_rv = reader.get("a", "x").map(|i| i.version);
    // The same answers again (a producer recomputed): no event, no new resourceVersion.
    assert_eq!(
        hub.replace(None, vec![summary("a", "x", "1"), summary("a", "y", "1")]),
        0
    );
    assert_eq!(reader.list(None).version, list.version);
    // The served resourceVersion is ignored when comparing.
    let mut with_rv = summary("a", "x", "1");
    with_rv.metadata.resource_version = Some("123".to_owned());
    assert!(!hub.set("a", "x", Some(with_rv)));
    assert!(hub.set("a", "x", Some(summary("a", "x", "2"))));
    let x = reader.get("a", "x").unwrap();
    assert!(Some(x.version) > x_rv);
    assert_eq!(
        x.object().metadata.resource_version.as_deref(),
        Some(x.version.text().as_str())
    );
    // A list taken before keeps what it was (a snapshot).
    assert_eq!(
        list.iter()
            .find(|i| i.name() == "x")
            .map(|i| i.labels()["tier"].clone()),
        Some("1".to_owned())
    );
    // y is gone from namespace a; objects of other namespaces are not touched by a scoped replace.
    hub.set("b", "z", Some(summary("b", "z", "1")));
    assert_eq!(hub.replace(Some("a"), vec![summary("a", "x", "2")]), 1);
    assert!(reader.get("a", "y").is_none());
    assert!(reader.get("b", "z").is_some());
    assert_eq!(reader.list(Some("a")).iter().count(), 1);
    assert_eq!(reader.list(Some("b")).iter().count(), 1);
}

#[test]
fn a_watch_from_a_list_misses_nothing_and_repeats_nothing() {
    let (mut hub, reader) = hub();
    hub.replace(None, vec![summary("a", "x", "1")]);
    let rv = reader.list(None).version;
    hub.set("a", "y", Some(summary("a", "y", "1")));
    hub.set("a", "x", Some(summary("a", "x", "2")));
    let mut watcher = reader.watch(None, Start::After(rv)).unwrap();
    hub.set("a", "x", None);
    assert_eq!(
        kinds(drain(&mut watcher)),
        vec![
            ("ADDED", "y".to_owned()),
            ("MODIFIED", "x".to_owned()),
            ("DELETED", "x".to_owned()),
        ]
    );
    let mut from_now = reader
        .watch(None, Start::After(reader.list(None).version))
        .unwrap();
    assert!(drain(&mut from_now).is_empty());
    let mut initial = reader.watch(Some("a"), Start::WithObjects).unwrap();
    assert_eq!(kinds(drain(&mut initial)), vec![("ADDED", "y".to_owned())]);
}

#[test]
fn initial_objects_are_those_of_the_start_then_the_events_after_it() {
    let (mut hub, reader) = hub();
    for i in 0..1000 {
        hub.set(
            "a",
            &format!("m{i:04}"),
            Some(summary("a", &format!("m{i:04}"), "1")),
        );
    }
    let mut watcher = reader.watch(None, Start::WithObjects).unwrap();
    // Changes while the initial objects are being read: not in them, sent after them.
    hub.set("a", "m0500", Some(summary("a", "m0500", "2")));
    hub.set("a", "m0001", None);
    hub.set("a", "n", Some(summary("a", "n", "1")));
    let seen = kinds(drain(&mut watcher));
    assert_eq!(seen.len(), 1003);
    assert!(seen[..1000].iter().all(|(k, _)| *k == "ADDED"));
    assert_eq!(seen[1].1, "m0001", "the snapshot still holds it");
    assert_eq!(
        seen[1000..],
        [
            ("MODIFIED", "m0500".to_owned()),
            ("DELETED", "m0001".to_owned()),
            ("ADDED", "n".to_owned())
        ]
    );
}

#[test]
fn resumes_it_cannot_serve_are_expired_and_future_ones_wait() {
    let (mut hub, reader) = hub_with_ring(1);
    let start = reader.list(None).version;
    for label in ["1", "2", "3"] {
        hub.set("a", "x", Some(summary("a", "x", label)));
    }
    assert_eq!(
        reader.watch(None, Start::After(start)).err(),
        Some(Expired::Compacted)
    );
    let other = Clock::with_epoch(8);
    assert_eq!(
        other.parse(&reader.list(None).version.text()).err(),
        Some(Expired::OtherProcess)
    );
    // A resourceVersion not reached yet: the watch starts, and hears only what comes after it.
    let now = reader.latest();
    let ahead = reader
        .clock()
        .parse(&(now.text().parse::<u64>().unwrap() + 2).to_string())
        .unwrap();
    let mut waiting = reader.watch(None, Start::After(ahead)).unwrap();
    hub.set("a", "x", Some(summary("a", "x", "4")));
    hub.set("a", "x", Some(summary("a", "x", "5")));
    assert!(
        drain(&mut waiting).is_empty(),
        "up to the one asked: not sent"
    );
    hub.set("a", "x", Some(summary("a", "x", "6")));
    assert_eq!(
        kinds(drain(&mut waiting)),
        vec![("MODIFIED", "x".to_owned())]
    );
}

#[test]
fn a_watcher_that_falls_behind_the_ring_ends_and_holds_nothing() {
    // About 10 events of a few hundred bytes each.
    let (mut hub, reader) = hub_with_ring(4000);
    let mut slow = reader.watch(None, Start::After(reader.latest())).unwrap();
    let mut reading = reader.watch(None, Start::After(reader.latest())).unwrap();
    for i in 0..5 {
        hub.set("a", "x", Some(summary("a", "x", &i.to_string())));
    }
    assert_eq!(drain(&mut reading).len(), 5);
    for i in 5..100 {
        hub.set("a", "x", Some(summary("a", "x", &i.to_string())));
        assert_eq!(
            drain(&mut reading).len(),
            1,
            "a watcher that reads keeps up"
        );
    }
    let state = reader.inner.lock();
    assert!(state.ring_bytes <= 4000, "{}", state.ring_bytes);
    assert!(state.ring.len() < 20, "{}", state.ring.len());
    drop(state);
    assert_eq!(
        drain(&mut slow),
        vec![("BEHIND", String::new(), String::new())]
    );
    assert_eq!(reader.behind(), 1);
    assert_eq!(reader.watchers(), 2);
    drop(slow);
    assert_eq!(reader.watchers(), 1, "a watch that ends leaves the hub");
}

#[test]
fn the_position_never_runs_ahead_of_the_events_read() {
    let (mut hub, reader) = hub();
    let mut watcher = reader.watch(None, Start::After(reader.latest())).unwrap();
    hub.set("a", "x", Some(summary("a", "x", "1")));
    let x = reader.get("a", "x").unwrap().version;
    assert!(watcher.position() < x);
    assert_eq!(drain(&mut watcher).len(), 1);
    assert_eq!(watcher.position(), x);
    hub.set("a", "y", Some(summary("a", "y", "1")));
    assert_eq!(watcher.position(), x, "not read yet");
    drain(&mut watcher);
    assert_eq!(watcher.position(), reader.latest());
}

#[test]
fn namespaced_watches_hear_only_their_namespace() {
    let (mut hub, reader) = hub();
    let mut watcher = reader.watch(Some("a"), Start::WithObjects).unwrap();
    hub.set("b", "x", Some(summary("b", "x", "1")));
    hub.set("a", "x", Some(summary("a", "x", "1")));
    let names: Vec<_> = drain(&mut watcher).into_iter().map(|(_, n, _)| n).collect();
    assert_eq!(names, vec!["x"]);
    assert_eq!(watcher.position(), reader.latest());
}

#[tokio::test(start_paused = true)]
async fn a_waiting_watcher_wakes_for_the_next_event() {
    let (mut hub, reader) = hub();
    let mut watcher = reader.watch(None, Start::WithObjects).unwrap();
    assert!(matches!(watcher.next(1000).await, Batch::InitialEnd(_)));
    let next = tokio::spawn(async move {
        match watcher.next(1000).await {
            Batch::Events(events) => events[0].item.name().to_owned(),
            other => panic!("{other:?}"),
        }
    });
    tokio::task::yield_now().await;
    hub.set("a", "x", Some(summary("a", "x", "1")));
    assert_eq!(next.await.unwrap(), "x");
}

#[test]
fn an_answer_from_a_new_input_without_a_change_is_no_event_but_is_remembered() {
    let (mut hub, reader) = hub();
    let from = |rv: &str, label: &str| {
        let mut s = summary("a", "x", label);
        s.metadata.uid = Some("uid-x".to_owned());
        s.metadata.resource_version = Some(rv.to_owned());
        s
    };
    assert!(hub.set("a", "x", Some(from("10", "1"))));
    let first = reader.get("a", "x").unwrap();
    assert_eq!(first.source, source_of(Some("uid-x"), Some("10")));
    // The input changed (an annotation no answer reads), the answer did not.
    assert!(!hub.set("a", "x", Some(from("11", "1"))));
    let now = reader.get("a", "x").unwrap();
    assert_eq!(now.version, first.version, "no new resourceVersion");
    assert_eq!(now.json(), first.json());
    assert_eq!(now.source, source_of(Some("uid-x"), Some("11")));
    assert_eq!(reader.latest(), first.version);
    assert!(hub.set("a", "x", Some(from("12", "2"))));
    let changed = reader.get("a", "x").unwrap();
    assert!(changed.version > first.version);
}

#[test]
fn a_list_carries_its_own_hubs_last_change() {
    let clock = Arc::new(Clock::with_epoch(7));
    let (mut one, one_reader) = new::<Summary>(clock.clone(), Bounds::default());
    let (mut other, _) = new::<Summary>(clock, Bounds::default());
    one.set("a", "x", Some(summary("a", "x", "1")));
    let rv = one_reader.list(None).version;
    assert_eq!(rv, one_reader.latest());
    // Another hub on the same clock changes: this hub's lists keep their resourceVersion.
    other.set("a", "y", Some(summary("a", "y", "1")));
    assert_eq!(one_reader.list(None).version, rv);
    let mut watcher = one_reader.watch(None, Start::After(rv)).unwrap();
    one.set("a", "x", Some(summary("a", "x", "2")));
    assert_eq!(drain(&mut watcher).len(), 1);
}

#[test]
fn a_sweep_puts_one_object_at_a_time_and_deletes_what_it_did_not_put() {
    let (mut hub, reader) = hub();
    hub.replace(None, vec![summary("a", "x", "1"), summary("a", "y", "1")]);
    let mut sweep = hub.sweep(None);
    sweep.put(summary("a", "x", "2"));
    // Visible before the sweep ends.
    assert_eq!(
        reader.get("a", "x").map(|i| i.labels()["tier"].clone()),
        Some("2".to_owned())
    );
    assert!(reader.get("a", "y").is_some());
    assert_eq!(sweep.finish(), 2);
    assert!(reader.get("a", "y").is_none());
}

#[test]
fn many_objects_stay_in_order_across_chunks() {
    let (mut hub, reader) = hub();
    // Inserted out of order, in several namespaces, then some removed.
    for i in (0..2000).rev() {
        let ns = format!("ns{}", i % 3);
        hub.set(
            &ns,
            &format!("m{i:05}"),
            Some(summary(&ns, &format!("m{i:05}"), "1")),
        );
    }
    for i in (0..2000).step_by(7) {
        hub.set(&format!("ns{}", i % 3), &format!("m{i:05}"), None);
    }
    let all: Vec<(String, String)> = reader
        .list(None)
        .iter()
        .map(|i| (i.namespace().to_owned(), i.name().to_owned()))
        .collect();
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted);
    assert_eq!(all.len(), 2000 - 2000_usize.div_ceil(7));
    let ns1 = reader.list(Some("ns1")).iter().count();
    assert_eq!(ns1, all.iter().filter(|(ns, _)| ns == "ns1").count());
    assert!(reader.get("ns1", "m00001").is_some());
    assert!(reader.get("ns0", "m00000").is_none());
}

/// A machine answer on `current`, with a label keyed like the shared fields.
fn machine(
    name: &str,
    current: &str,
) -> elemental_changelog_apiservice::fleet::MachineInventoryChangelogSummary {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "changelog.elemental.cattle.io/v1beta1",
        "kind": "MachineInventoryChangelogSummary",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "labels": {"current": "x", "state": "\"y\",\"current\":"}},
        "os": {"image": format!("registry/os:{current}")},
        "current": {"name": current, "version": current, "channel": "c"},
        "target": {"name": "v9", "version": "v9", "channel": "c", "source": "NewestInChannel"},
        "state": "UpdatesAvailable",
        "summary": {"advisories": 3, "byType": {"security": 3}, "cves": 2, "highestSeverity": "Important"},
    }))
    .unwrap()
}

#[test]
fn machines_keep_their_identity_and_share_the_rest() {
    // A one-event ring: kept events hold the answers they carry.
    let (mut hub, reader) = new(Arc::new(Clock::with_epoch(7)), Bounds { ring_bytes: 1 });
    hub.replace(
        None,
        vec![machine("a", "v1"), machine("b", "v1"), machine("c", "v2")],
    );
    let item = |name: &str| reader.get("ns", name).unwrap();
    let (a, b, c) = (item("a"), item("b"), item("c"));
    for (it, name, current) in [(&a, "a", "v1"), (&b, "b", "v1"), (&c, "c", "v2")] {
        let mut expected = machine(name, current);
        expected.metadata.resource_version = Some(it.version.text());
        assert_eq!(it.json(), serde_json::to_vec(&expected).unwrap());
        assert_eq!(it.object(), expected);
        let own = String::from_utf8_lossy(it.json_parts().own()).into_owned();
        assert!(own.starts_with("\"metadata\":{"), "{own}");
        assert!(
            own.ends_with(&format!("\"os\":{{\"image\":\"registry/os:{current}\"}}")),
            "{own}"
        );
    }
    // Kept once: the kind for all, what follows the report for machines on the same version.
    assert!(a.json_parts().shares_before(c.json_parts()));
    assert!(a.json_parts().shares_after(b.json_parts()));
    assert!(!a.json_parts().shares_after(c.json_parts()));
    assert_eq!(
        hub.replace(
            None,
            vec![machine("a", "v1"), machine("b", "v1"), machine("c", "v2")]
        ),
        0
    );
    // A shared part no answer (nor kept event) holds is dropped once the table has grown.
    for i in 0..200 {
        hub.set("ns", "a", Some(machine("a", &format!("w{i}"))));
    }
    let parts = reader.inner.lock().interned.len();
    assert!(parts < 140, "{parts}");
}
