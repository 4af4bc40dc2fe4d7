//! The history model: what a version maps to, recording, pruning, bounds,
//! and the ConfigMap encoding.

use super::*;

fn key(name: &str) -> ChannelKey {
    ChannelKey::new("fleet-default", name)
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn record(h: &mut History, channel: &str, digest: &str, versions: &[&str]) -> bool {
    h.record(
        &key(channel),
        &REPOSITORY.parse().unwrap_or_else(|e| panic!("{e}")),
        &digest.parse().unwrap_or_else(|e| panic!("{e}")),
        &names(versions),
        jiff::Timestamp::UNIX_EPOCH,
    )
}

const REPOSITORY: &str = "registry.example.com/elemental/channel";

#[test]
fn a_version_maps_to_the_newest_image_that_listed_it() {
    let mut h = History::default();
    assert!(record(&mut h, "c", "sha256:1", &["v1", "v2", "v3"]));
    assert!(record(&mut h, "c", "sha256:2", &["v1", "v2", "v3", "v4"]));
    assert!(record(&mut h, "c", "sha256:3", &["v2", "v3", "v4", "v5"]));
    assert!(
        !record(&mut h, "c", "sha256:3", &["v2", "v5"]),
        "nothing new"
    );
    let origin = |v: &str| h.origin(&key("c"), v).map(|r| r.digest.as_str());
    assert_eq!(origin("v1"), Some("sha256:2"));
    assert_eq!(origin("v2"), Some("sha256:3"));
    assert_eq!(origin("v9"), None);
    assert_eq!(h.origin(&key("other"), "v1"), None);
    assert_eq!(
        h.origin(&key("c"), "v1")
            .map(|r| r.reference().to_string())
            .as_deref(),
        Some("registry.example.com/elemental/channel@sha256:2")
    );
    // Going back to an older image makes it the newest, merged.
    assert!(record(&mut h, "c", "sha256:1", &["v1", "v2", "v3"]));
    let digests: Vec<&str> = h.channel(&key("c")).map_or(Vec::new(), |c| {
        c.images.iter().map(|r| r.digest.as_str()).collect()
    });
    assert_eq!(digests, ["sha256:2", "sha256:3", "sha256:1"]);
    assert_eq!(origin_of(&h, "v1"), Some("sha256:1"));
}

fn origin_of<'a>(h: &'a History, v: &str) -> Option<&'a str> {
    h.origin(&key("c"), v).map(|r| r.digest.as_str())
}

#[test]
fn pruning_forgets_what_no_version_needs_and_keeps_the_newest_image() {
    let mut h = History::default();
    record(&mut h, "c", "sha256:1", &["v1", "v2"]);
    record(&mut h, "c", "sha256:2", &["v1", "v2", "v3"]);
    record(&mut h, "c", "sha256:3", &["v3", "v4"]);
    record(&mut h, "gone", "sha256:9", &["x"]);
    record(&mut h, "elsewhere", "sha256:8", &["y"]);
    let live = names(&["v1", "v3"]);
    let scope = |k: &ChannelKey| k.name != "elsewhere";
    let exists = |k: &ChannelKey, v: Option<&str>| match v {
        None => k.name != "gone",
        Some(v) => k.name == "c" && live.contains(v),
    };
    assert!(h.prune(scope, exists));
    // sha256:1 only had versions a newer image lists (or that are gone).
    let c = h.channel(&key("c")).cloned().unwrap_or_default();
    let got: Vec<(&str, Vec<&str>)> = c
        .images
        .iter()
        .map(|r| {
            (
                r.digest.as_str(),
                r.versions.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [("sha256:2", vec!["v1"]), ("sha256:3", vec!["v3", "v4"])],
        "the newest image keeps every version it listed"
    );
    assert!(h.channel(&key("gone")).is_none());
    assert!(h.channel(&key("elsewhere")).is_some(), "out of scope");
    assert!(!h.prune(scope, exists), "nothing more to forget");
    // v1 deleted too: sha256:2 goes.
    assert!(h.prune(scope, |k, v| k.name != "gone" && v != Some("v1")));
    assert_eq!(h.channel(&key("c")).map(|c| c.images.len()), Some(1));
}

#[test]
fn bounds_drop_the_oldest_images_first() {
    let mut h = History::default();
    for i in 0..MAX_IMAGES_PER_CHANNEL + 3 {
        record(&mut h, "c", &format!("sha256:{i}"), &[&format!("v{i}")]);
    }
    assert_eq!(h.bound(), Some(3));
    let c = h.channel(&key("c")).cloned().unwrap_or_default();
    assert_eq!(c.images.len(), MAX_IMAGES_PER_CHANNEL);
    assert_eq!(c.images[0].digest, "sha256:3");

    // Too many bytes: the longest channel gives up its oldest images.
    let mut h = History::default();
    let many: Vec<String> = (0..6000)
        .map(|i| format!("a-rather-long-version-name-{i:05}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for i in 0..12 {
        record(
            &mut h,
            "big",
            &format!("sha256:{i}"),
            &many[i * 300..i * 300 + 1500],
        );
    }
    record(&mut h, "small", "sha256:s", &["v1"]);
    assert!(h.size() > MAX_BYTES);
    let dropped = h.bound().unwrap_or_default();
    assert!(dropped > 0);
    assert!(h.size() <= MAX_BYTES, "{}", h.size());
    assert!(h.channel(&key("small")).is_some());
    assert_eq!(
        h.channel(&key("big"))
            .and_then(|c| c.images.last())
            .map(|r| r.digest.as_str()),
        Some("sha256:11")
    );

    // The newest images alone do not fit: refused.
    let mut h = History::default();
    let huge: Vec<String> = (0..20_000)
        .map(|i| format!("a-rather-long-version-name-{i:05}"))
        .collect();
    let huge: Vec<&str> = huge.iter().map(String::as_str).collect();
    record(&mut h, "huge", "sha256:h", &huge);
    assert_eq!(h.bound(), None);
}

#[test]
fn configmap_data_round_trips_and_unreadable_keys_are_skipped() {
    let mut h = History::default();
    record(&mut h, "c", "sha256:1", &["v1"]);
    record(&mut h, "with.dots", "sha256:2", &["v2"]);
    let mut data = h.to_data();
    assert!(data.contains_key("fleet-default.c"), "{data:?}");
    assert!(data.contains_key("fleet-default.with.dots"), "{data:?}");
    data.insert("fleet-default.broken".to_owned(), "{not json".to_owned());
    data.insert("nodot".to_owned(), "{}".to_owned());
    let (read, skipped) = History::from_data(&data);
    assert_eq!(read, h);
    assert_eq!(skipped.keys, ["fleet-default.broken", "nodot"]);
    assert!(skipped.records.is_empty(), "{skipped:?}");
}

#[test]
fn the_configmap_json_is_read_and_written_as_it_was() {
    // As replicas have written it: compact, fields in this order.
    let written = r#"{"images":[{"repository":"registry.example.com/elemental/channel","digest":"sha256:1","recorded":"2026-01-01T00:00:00Z","versions":["v1","v2"]},{"repository":"docker.io/library/channel","digest":"sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b","recorded":"1970-01-01T00:00:00Z","versions":["v3"]}]}"#;
    let data = BTreeMap::from([("fleet-default.c".to_owned(), written.to_owned())]);
    let (read, skipped) = History::from_data(&data);
    assert_eq!(skipped, Skipped::default());
    assert_eq!(read.to_data(), data);
    let records = &read
        .channel(&key("c"))
        .unwrap_or_else(|| panic!("no channel"))
        .images;
    assert_eq!(
        records[1].reference().to_string(),
        "docker.io/library/channel@sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b"
    );
    // A record the server writes now reads the same.
    let mut h = History::default();
    h.record(
        &key("c"),
        &"channel:v1"
            .parse::<elemental_changelog_registry::ImageRef>()
            .unwrap_or_else(|e| panic!("{e}"))
            .repository(),
        &"sha256:3".parse().unwrap_or_else(|e| panic!("{e}")),
        &names(&["v4"]),
        jiff::Timestamp::UNIX_EPOCH,
    );
    assert_eq!(
        h.to_data()["fleet-default.c"],
        r#"{"images":[{"repository":"docker.io/library/channel","digest":"sha256:3","recorded":"1970-01-01T00:00:00Z","versions":["v4"]}]}"#
    );
}

#[test]
fn records_whose_repository_or_digest_does_not_parse_are_skipped() {
    let record = |repository: &str, digest: &str, version: &str| {
        format!(
            r#"{{"repository":"{repository}","digest":"{digest}","recorded":"","versions":["{version}"]}}"#
        )
    };
    let value = format!(
        r#"{{"images":[{},{},{},{}]}}"#,
        record(REPOSITORY, "sha256:1", "v1"),
        record(REPOSITORY, "not a digest", "v2"),
        record(
            "registry.example.com/elemental/channel:v3",
            "sha256:3",
            "v3"
        ),
        record(REPOSITORY, "sha256:4", "v4"),
    );
    let data = BTreeMap::from([("fleet-default.c".to_owned(), value)]);
    let (read, skipped) = History::from_data(&data);
    assert!(skipped.keys.is_empty(), "{skipped:?}");
    assert_eq!(skipped.records.len(), 2, "{skipped:?}");
    assert!(
        skipped.records[0].starts_with("fleet-default.c[1]: "),
        "{skipped:?}"
    );
    assert!(skipped.records[0].contains("not a digest"), "{skipped:?}");
    assert!(
        skipped.records[1].starts_with("fleet-default.c[2]: "),
        "{skipped:?}"
    );
    // The rest is read, in order.
    assert_eq!(origin_of(&read, "v1"), Some("sha256:1"));
    assert_eq!(origin_of(&read, "v2"), None);
    assert_eq!(origin_of(&read, "v3"), None);
    assert_eq!(origin_of(&read, "v4"), Some("sha256:4"));
    assert_eq!(read.records(), 2);
    // The next write drops them.
    let mut expected = History::default();
    record_at(&mut expected, "sha256:1", "v1");
    record_at(&mut expected, "sha256:4", "v4");
    assert_eq!(read, expected);
}

/// Records `digest` listing `version` for channel `c`, recorded "" (as the test's JSON).
fn record_at(h: &mut History, digest: &str, version: &str) {
    record(h, "c", digest, &[version]);
    if let Some(channel) = h.channels.get_mut(&key("c"))
        && let Some(last) = channel.images.last_mut()
    {
        last.recorded = String::new();
    }
}
