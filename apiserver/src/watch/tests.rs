//! The hub: events only for changed answers, resumes, expiry, slow watchers, selectors.

use std::collections::BTreeMap;

use elemental_changelog_apiservice::types::ManagedOSVersionChangelogSummary as Summary;

use super::{stream::seen, *};

fn summary(namespace: &str, name: &str, label: &str) -> Summary {
    let mut s = Summary::new();
    s.metadata.namespace = namespace.to_owned();
    s.metadata.name = name.to_owned();
    s.metadata.labels = BTreeMap::from([("tier".to_owned(), label.to_owned())]);
    s
}

fn hub() -> Arc<Hub<Summary>> {
    Hub::new(Arc::new(Clock::with_epoch(7)))
}

fn drain(watcher: &mut Watcher<Summary>) -> Vec<(EventType, String, String)> {
    let mut out: Vec<_> = std::mem::take(&mut watcher.backlog)
        .into_iter()
        .map(|e| {
            (
                e.kind,
                e.item.object().metadata.name.clone(),
                e.item.version.text(),
            )
        })
        .collect();
    while let Ok(message) = watcher.queue.try_recv() {
        if let Message::Event(e) = message {
            out.push((
                e.kind,
                e.item.object().metadata.name.clone(),
                e.item.version.text(),
            ));
        }
    }
    out
}

#[test]
fn only_changed_answers_get_a_new_resource_version_and_an_event() {
    let hub = hub();
    assert_eq!(
        hub.replace(None, vec![summary("a", "x", "1"), summary("a", "y", "1")]),
        2
    );
    let (list_rv, items) = hub.list(None);
    assert_eq!(items.len(), 2);
    let x_rv = hub.get("a", "x").map(|i| i.version);
    // The same answers again (a producer recomputed): no event, no new resourceVersion.
    assert_eq!(
        hub.replace(None, vec![summary("a", "x", "1"), summary("a", "y", "1")]),
        0
    );
    assert_eq!(hub.list(None).0, list_rv);
    // The served resourceVersion is ignored when comparing.
    let mut with_rv = summary("a", "x", "1");
    with_rv.metadata.resource_version = Some("123".to_owned());
    assert!(!hub.set("a", "x", Some(with_rv)));
    assert!(hub.set("a", "x", Some(summary("a", "x", "2"))));
    let x = hub.get("a", "x").unwrap_or_else(|| panic!("x"));
    assert!(Some(x.version) > x_rv);
    assert_eq!(
        x.object().metadata.resource_version.as_deref(),
        Some(x.version.text().as_str())
    );
    assert!(
        String::from_utf8_lossy(&x.json())
            .contains(&format!("\"resourceVersion\":\"{}\"", x.version)),
        "the kept JSON carries the resourceVersion"
    );
    // y is gone from namespace a; objects of other namespaces are not touched by a scoped replace.
    hub.set("b", "z", Some(summary("b", "z", "1")));
    assert_eq!(hub.replace(Some("a"), vec![summary("a", "x", "2")]), 1);
    assert!(hub.get("a", "y").is_none());
    assert!(hub.get("b", "z").is_some());
    assert_eq!(hub.list(Some("a")).1.len(), 1);
    assert_eq!(hub.list(Some("b")).1.len(), 1);
}

#[test]
fn a_watch_from_a_list_misses_nothing_and_repeats_nothing() {
    let hub = hub();
    hub.replace(None, vec![summary("a", "x", "1")]);
    let (rv, _) = hub.list(None);
    hub.set("a", "y", Some(summary("a", "y", "1")));
    hub.set("a", "x", Some(summary("a", "x", "2")));
    let mut watcher = hub
        .watch(None, Start::After(rv))
        .unwrap_or_else(|e| panic!("{e}"));
    hub.set("a", "x", None);
    let seen: Vec<_> = drain(&mut watcher)
        .into_iter()
        .map(|(k, n, _)| (k, n))
        .collect();
    assert_eq!(
        seen,
        vec![
            (EventType::Added, "y".to_owned()),
            (EventType::Modified, "x".to_owned()),
            (EventType::Deleted, "x".to_owned()),
        ]
    );
    let mut from_now = hub
        .watch(None, Start::After(hub.list(None).0))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(drain(&mut from_now).is_empty());
    let mut initial = hub
        .watch(Some("a"), Start::WithObjects)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        drain(&mut initial)
            .into_iter()
            .map(|(k, n, _)| (k, n))
            .collect::<Vec<_>>(),
        vec![(EventType::Added, "y".to_owned())]
    );
}

#[test]
fn resumes_it_cannot_serve_are_expired() {
    let hub = Hub::with_kept_events(Arc::new(Clock::with_epoch(7)), 2);
    let (start, _) = hub.list(None);
    for label in ["1", "2", "3"] {
        hub.set("a", "x", Some(summary("a", "x", label)));
    }
    assert_eq!(
        hub.watch(None, Start::After(start)).err(),
        Some(Expired::Compacted)
    );
    let other = Clock::with_epoch(8);
    assert_eq!(
        other.parse(&hub.list(None).0.text()).err(),
        Some(Expired::OtherProcess)
    );
    assert_eq!(hub.clock().parse("abc").err(), Some(Expired::Invalid));
    let ahead = ResourceVersion(hub.list(None).0.0 + 5);
    assert_eq!(
        hub.watch(None, Start::After(ahead)).err(),
        Some(Expired::TooLarge)
    );
    let recent = hub.clock().parse(&hub.list(None).0.text());
    assert!(recent.is_ok_and(|rv| hub.watch(None, Start::After(rv)).is_ok()));
}

#[test]
fn a_watcher_that_does_not_read_is_dropped() {
    let hub = hub();
    let mut watcher = hub
        .watch(None, Start::WithObjects)
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..=WATCHER_QUEUE {
        hub.set("a", "x", Some(summary("a", "x", &i.to_string())));
    }
    assert_eq!(hub.watchers(), 0, "dropped once its queue was full");
    let mut received = 0;
    while let Ok(Message::Event(_)) = watcher.queue.try_recv() {
        received += 1;
    }
    assert_eq!(received, WATCHER_QUEUE);
    assert!(
        watcher.queue.try_recv().is_err(),
        "its queue ends: the stream closes"
    );
    let reader = hub
        .watch(None, Start::WithObjects)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(hub.watchers(), 1);
    drop(reader);
    assert_eq!(hub.watchers(), 0, "a watch that ends leaves the hub");
}

#[test]
fn bookmarks_never_run_ahead_of_the_events_queued() {
    let hub = hub();
    let mut watcher = hub
        .watch(None, Start::WithObjects)
        .unwrap_or_else(|e| panic!("{e}"));
    hub.set("a", "x", Some(summary("a", "x", "1")));
    assert!(watcher.progress());
    hub.set("a", "y", Some(summary("a", "y", "1")));
    let mut order = Vec::new();
    while let Ok(message) = watcher.queue.try_recv() {
        order.push(match message {
            Message::Event(e) => format!("event {}", e.item.version),
            Message::Progress(rv) => format!("progress {rv}"),
        });
    }
    let x = hub
        .get("a", "x")
        .map(|i| i.version.text())
        .unwrap_or_default();
    let y = hub
        .get("a", "y")
        .map(|i| i.version.text())
        .unwrap_or_default();
    assert_eq!(
        order,
        vec![
            format!("event {x}"),
            format!("progress {x}"),
            format!("event {y}")
        ]
    );
}

#[test]
fn namespaced_watches_hear_only_their_namespace() {
    let hub = hub();
    let mut watcher = hub
        .watch(Some("a"), Start::WithObjects)
        .unwrap_or_else(|e| panic!("{e}"));
    hub.set("b", "x", Some(summary("b", "x", "1")));
    hub.set("a", "x", Some(summary("a", "x", "1")));
    let names: Vec<_> = drain(&mut watcher).into_iter().map(|(_, n, _)| n).collect();
    assert_eq!(names, vec!["x"]);
}

#[test]
fn selectors_turn_changes_into_kube_apiserver_transitions() {
    let hub = hub();
    let mut watcher = hub
        .watch(None, Start::WithObjects)
        .unwrap_or_else(|e| panic!("{e}"));
    hub.set("a", "x", Some(summary("a", "x", "gold")));
    hub.set("a", "x", Some(summary("a", "x", "lead")));
    hub.set("a", "x", Some(summary("a", "x", "gold")));
    hub.set("a", "x", Some(summary("a", "x", "gold2")));
    hub.set("a", "x", None);
    let gold = |s: &Item<Summary>| s.labels().get("tier").is_some_and(|t| t == "gold");
    let mut out = Vec::new();
    while let Ok(Message::Event(event)) = watcher.queue.try_recv() {
        out.push(seen(&event, &gold).map(|(kind, _)| kind));
    }
    assert_eq!(
        out,
        vec![
            Some(EventType::Added),
            Some(EventType::Deleted),
            Some(EventType::Added),
            Some(EventType::Deleted),
            None,
        ]
    );
}

#[test]
fn an_answer_from_a_new_input_without_a_change_is_no_event_but_is_remembered() {
    let hub = hub();
    let from = |rv: &str, label: &str| {
        let mut s = summary("a", "x", label);
        s.metadata.uid = Some("uid-x".to_owned());
        s.metadata.resource_version = Some(rv.to_owned());
        s
    };
    assert!(hub.set("a", "x", Some(from("10", "1"))));
    let first = hub.get("a", "x").unwrap_or_else(|| panic!("x"));
    assert_eq!(first.source, source_of(Some("uid-x"), Some("10")));
    // The input changed (an annotation no answer reads), the answer did not.
    assert!(!hub.set("a", "x", Some(from("11", "1"))));
    let now = hub.get("a", "x").unwrap_or_else(|| panic!("x"));
    assert_eq!(now.version, first.version, "no new resourceVersion");
    assert_eq!(now.json(), first.json());
    assert_eq!(now.source, source_of(Some("uid-x"), Some("11")));
    assert_eq!(hub.latest(), first.version);
    // A changed answer from the next input is an event, served at the hub's resourceVersion.
    assert!(hub.set("a", "x", Some(from("12", "2"))));
    let changed = hub.get("a", "x").unwrap_or_else(|| panic!("x"));
    assert!(changed.version > first.version);
    assert_eq!(
        changed.object().metadata.resource_version,
        Some(changed.version.text())
    );
}

#[test]
fn a_list_carries_its_own_hubs_last_change() {
    let clock = Arc::new(Clock::with_epoch(7));
    let (one, other) = (Hub::new(clock.clone()), Hub::new(clock));
    one.set("a", "x", Some(summary("a", "x", "1")));
    let (rv, _) = one.list(None);
    assert_eq!(rv, one.latest());
    // Another hub on the same clock changes: this hub's lists keep their resourceVersion
    // (two lists with one resourceVersion hold the same answers).
    other.set("a", "y", Some(summary("a", "y", "1")));
    assert_eq!(one.list(None).0, rv);
    // A watch from it misses nothing and repeats nothing.
    let mut watcher = one
        .watch(None, Start::After(rv))
        .unwrap_or_else(|e| panic!("{e}"));
    one.set("a", "x", Some(summary("a", "x", "2")));
    assert_eq!(drain(&mut watcher).len(), 1);
}

#[test]
fn a_sweep_puts_one_object_at_a_time_and_deletes_what_it_did_not_put() {
    let hub = hub();
    hub.replace(None, vec![summary("a", "x", "1"), summary("a", "y", "1")]);
    let mut sweep = hub.sweep(None);
    sweep.put(summary("a", "x", "2"));
    // Visible before the sweep ends.
    assert_eq!(
        hub.get("a", "x").map(|i| i.labels()["tier"].clone()),
        Some("2".to_owned())
    );
    assert!(hub.get("a", "y").is_some());
    assert_eq!(sweep.finish(), 2);
    assert!(hub.get("a", "y").is_none());
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
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn machines_keep_their_identity_and_share_the_rest() {
    // (One kept event: kept events hold the answers they carry.)
    let hub = Hub::with_kept_events(Arc::new(Clock::with_epoch(7)), 1);
    hub.replace(
        None,
        vec![machine("a", "v1"), machine("b", "v1"), machine("c", "v2")],
    );
    let item = |name: &str| hub.get("ns", name).unwrap_or_else(|| panic!("{name}"));
    let (a, b, c) = (item("a"), item("b"), item("c"));
    for (it, name, current) in [(&a, "a", "v1"), (&b, "b", "v1"), (&c, "c", "v2")] {
        // The parts put together are the answer as serde writes it.
        let mut expected = machine(name, current);
        expected.metadata.resource_version = Some(it.version.text());
        assert_eq!(it.json(), serde_json::to_vec(&expected).unwrap_or_default());
        assert_eq!(it.object(), expected);
        let own = String::from_utf8_lossy(&it.json.own).into_owned();
        assert!(own.starts_with("\"metadata\":{"), "{own}");
        assert!(
            own.ends_with(&format!("\"os\":{{\"image\":\"registry/os:{current}\"}}")),
            "{own}"
        );
        assert!(it.json.after.starts_with(b",\"current\":"));
    }
    // Kept once: the kind for all, what follows the report for machines on the same version.
    assert!(Arc::ptr_eq(&a.json.before, &c.json.before));
    assert!(Arc::ptr_eq(&a.json.after, &b.json.after));
    assert!(!Arc::ptr_eq(&a.json.after, &c.json.after));
    // Still the same answer: no event.
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
    assert!(
        hub.lock().shared.parts.len() < 140,
        "{}",
        hub.lock().shared.parts.len()
    );
}
