use super::*;
use crate::channel::EntryKind;
use elemental_changelog_apiservice::types::{AdvisoryPackage, Reference};

const SL_MICRO_61: &[u8] = include_bytes!("../../tests/fixtures/channel-sl-micro-6.1-base.json");

fn entry(name: &str, version: &str, created: Option<i64>) -> ChannelEntry {
    ChannelEntry {
        name: name.into(),
        version: version.into(),
        kind: EntryKind::Container,
        upgrade_image: None,
        uri: None,
        display_name: None,
        platforms: Vec::new(),
        created: created.map(|c| Timestamp::from_second(c).unwrap()),
    }
}

fn pkgs(lines: &str) -> PackageList {
    packages::parse(lines.as_bytes()).unwrap()
}

fn adv(
    id: &str,
    issued: i64,
    cve: Option<&str>,
    packages: &[(&str, &str, &str, &str)],
) -> Advisory {
    crate::updates::with_cves_and_bugs(Advisory {
        id: id.into(),
        type_: if cve.is_some() {
            "security"
        } else {
            "recommended"
        }
        .into(),
        severity: if cve.is_some() {
            Severity::Important
        } else {
            Severity::Low
        },
        title: format!("title {id}"),
        issued: Some(Timestamp::from_second(issued).unwrap()),
        references: cve
            .map(|c| Reference {
                id: c.into(),
                type_: "cve".into(),
                ..Reference::default()
            })
            .into_iter()
            .collect(),
        packages: packages
            .iter()
            .map(|&(name, version, release, arch)| AdvisoryPackage {
                name: name.into(),
                epoch: None,
                version: version.into(),
                release: release.into(),
                arch: arch.into(),
            })
            .collect(),
        ..Advisory::default()
    })
}

fn updateinfo() -> Vec<Advisory> {
    vec![
        adv(
            "A1",
            150,
            Some("CVE-2024-0001"),
            &[("foo", "1.1", "1", "x86_64"), ("foo", "1.1", "1", "src")],
        ),
        adv("A2", 250, None, &[("foo", "1.2", "1", "x86_64")]),
        adv("A3", 180, None, &[("new", "1", "1", "x86_64")]),
        adv("A4", 400, None, &[("foo", "1.3", "1", "x86_64")]),
        adv("A5", 160, None, &[("foo", "1.1", "1", "aarch64")]),
        adv("A6", 170, None, &[("bar", "2.0", "1", "noarch")]),
        adv("A7", 190, None, &[("arch", "5", "1", "noarch")]),
    ]
}

const PKG_A: &str = "foo|(none)|1.0|1|x86_64\nbar|(none)|2.0|1|noarch\nold|(none)|1|1|x86_64\narch|(none)|4|1|x86_64\n";
const PKG_B: &str = "foo|(none)|1.1|1|x86_64\nbar|(none)|2.0|1|noarch\nnew|(none)|1|1|x86_64\narch|(none)|5|1|x86_64\n";
const PKG_C: &str = "foo|(none)|1.2|1|x86_64\nbar|(none)|1.9|1|noarch\nnew|(none)|1|1|x86_64\narch|(none)|5|1|x86_64\n";

fn computed_channel() -> IndexedChannel {
    // Listed out of order on purpose.
    let entries = vec![
        entry("c", "v1.2", Some(300)),
        entry("a", "v1.0", Some(100)),
        entry("b", "v1.1", Some(200)),
    ];
    let packages = BTreeMap::from([
        ("a".into(), pkgs(PKG_A)),
        ("b".into(), pkgs(PKG_B)),
        ("c".into(), pkgs(PKG_C)),
    ]);
    indexed(entries, BTreeMap::new(), packages, Some(updateinfo()))
}

fn indexed(
    entries: Vec<ChannelEntry>,
    advisories: BTreeMap<String, Vec<Advisory>>,
    packages: BTreeMap<String, PackageList>,
    updateinfo: Option<Vec<Advisory>>,
) -> IndexedChannel {
    IndexedChannel::new(ChannelData::from_parts(
        entries, advisories, packages, updateinfo,
    ))
}

fn ids(c: &Changelog) -> Vec<&str> {
    c.advisories.iter().map(|a| a.id.as_str()).collect()
}

fn change(name: &str, arch: &str, from: Option<&str>, to: Option<&str>) -> PackageChange {
    PackageChange {
        name: name.into(),
        arch: arch.into(),
        from: from.map(Into::into),
        to: to.map(Into::into),
    }
}

#[test]
fn computed_from_previous() {
    let data = computed_channel();
    assert_eq!(data.order(), ["a", "b", "c"]);
    let c = data.changelog("b", None).unwrap();
    assert_eq!(c.source, Source::Computed);
    assert_eq!(c.version, "v1.1");
    assert_eq!(
        c.from,
        Some(VersionRef {
            name: "a".into(),
            version: "v1.0".into()
        })
    );
    // Newest first; A5 is another arch, A6 did not move, A4 is not in yet.
    assert_eq!(ids(&c), ["A7", "A3", "A1"]);
    let p = c.packages.as_ref().unwrap();
    assert_eq!(
        p.upgraded,
        [
            change("arch", "x86_64", Some("4-1"), Some("5-1")),
            change("foo", "x86_64", Some("1.0-1"), Some("1.1-1"))
        ]
    );
    assert_eq!(p.added, [change("new", "x86_64", None, Some("1-1"))]);
    assert_eq!(p.removed, [change("old", "x86_64", Some("1-1"), None)]);
    assert!(p.downgraded.is_empty());
    assert_eq!(c.summary.advisories, 3);
    assert_eq!(c.summary.cves, 1);
    assert_eq!(c.summary.by_type["security"], 1);
    assert_eq!(c.summary.highest_severity, Severity::Important);
    assert_eq!(c.summary.packages_upgraded, Some(2));
    assert_eq!(c.summary.packages_removed, Some(1));
    assert!(c.warnings.is_empty());
}

#[test]
fn computed_from_any_older_version() {
    let data = computed_channel();
    let c = data.changelog("c", Some("a")).unwrap();
    assert_eq!(c.source, Source::Computed);
    assert_eq!(c.from.as_ref().unwrap().name, "a");
    assert_eq!(ids(&c), ["A2", "A7", "A3", "A1"]);
    let p = c.packages.unwrap();
    assert_eq!(
        p.downgraded,
        [change("bar", "noarch", Some("2.0-1"), Some("1.9-1"))]
    );
    assert_eq!(p.upgraded.len(), 2);
    let c = data.changelog("c", None).unwrap();
    assert_eq!(ids(&c), ["A2"]);
}

#[test]
fn bad_from_and_unknown_versions() {
    let data = computed_channel();
    assert_eq!(
        data.changelog("a", Some("b")).unwrap_err(),
        QueryError::FromNotOlder {
            from: "b".into(),
            name: "a".into()
        }
    );
    assert!(matches!(
        data.changelog("a", Some("a")),
        Err(QueryError::FromNotOlder { .. })
    ));
    assert_eq!(
        data.changelog("a", Some("zz")).unwrap_err(),
        QueryError::FromUnknown { from: "zz".into() }
    );
    assert_eq!(
        data.changelog("zz", None).unwrap_err(),
        QueryError::UnknownVersion { name: "zz".into() }
    );
    assert_eq!(
        data.summary("zz").unwrap_err(),
        QueryError::UnknownVersion { name: "zz".into() }
    );
}

#[test]
fn oldest_version_with_raw_data() {
    let data = computed_channel();
    let c = data.changelog("a", None).unwrap();
    assert_eq!(c.from, None);
    assert!(c.advisories.is_empty());
    assert_eq!(c.warnings.len(), 1);
    assert_eq!(data.previous("a").unwrap(), None);
    assert_eq!(data.previous("b").unwrap().unwrap().name, "a");
}

#[test]
fn summaries_and_cves() {
    let data = computed_channel();
    let (from, summary) = data.summary("b").unwrap();
    assert_eq!(from.unwrap().name, "a");
    assert_eq!(summary, data.changelog("b", None).unwrap().summary);
    assert!(data.fixes_cve("b", "cve-2024-0001"));
    assert!(!data.fixes_cve("c", "CVE-2024-0001"));
    assert!(!data.fixes_cve("zz", "CVE-2024-0001"));
    // Cached: the same answer again.
    assert_eq!(data.summary("b").unwrap().1, summary);
}

#[test]
fn package_lists_without_updateinfo() {
    let entries = vec![entry("a", "1", Some(1)), entry("b", "2", Some(2))];
    let packages = BTreeMap::from([("a".into(), pkgs(PKG_A)), ("b".into(), pkgs(PKG_B))]);
    let data = indexed(entries, BTreeMap::new(), packages, None);
    let c = data.changelog("b", None).unwrap();
    assert_eq!(c.source, Source::Computed);
    assert!(c.advisories.is_empty());
    assert_eq!(c.packages.unwrap().upgraded.len(), 2);
    assert_eq!(c.warnings.len(), 1);
}

/// The 6.1 fixture's container versions, oldest first.
const V38: &str = "base-v2.2.0-3.8-os";
const V39: &str = "base-v2.2.0-3.9-os";
const V312: &str = "base-v2.2.0-3.12-os";
const CREATED_38: i64 = 1_731_339_461;
const CREATED_39: i64 = 1_732_636_077;

fn precomputed(files: [(&str, Vec<Advisory>); 3]) -> IndexedChannel {
    let entries = channel::parse(SL_MICRO_61).unwrap();
    indexed(
        entries,
        files.into_iter().map(|(n, a)| (n.to_owned(), a)).collect(),
        BTreeMap::new(),
        None,
    )
}

#[test]
fn precomputed_own_file_and_union() {
    let data = precomputed([
        (V38, vec![adv("OLD", CREATED_38 - 10, None, &[])]),
        (
            V39,
            vec![
                adv("X", CREATED_38 + 10, None, &[]),
                adv("S", CREATED_38 + 20, Some("CVE-2024-1111"), &[]),
            ],
        ),
        (
            V312,
            vec![
                adv("Y", CREATED_39 + 10, None, &[]),
                adv("S", CREATED_38 + 20, Some("CVE-2024-1111"), &[]),
            ],
        ),
    ]);
    assert_eq!(data.order(), [V38, V39, V312]);
    assert!(!data.looks_shifted());
    let c = data.changelog(V312, None).unwrap();
    assert_eq!(c.source, Source::Precomputed);
    assert_eq!(c.from.as_ref().unwrap().name, V39);
    assert_eq!(ids(&c), ["Y", "S"]);
    assert!(c.packages.is_none());
    assert!(c.warnings.is_empty());
    let c = data.changelog(V312, Some(V38)).unwrap();
    assert_eq!(c.source, Source::Precomputed);
    assert_eq!(
        ids(&c),
        ["Y", "S", "X"],
        "union, de-duplicated by id, newest first"
    );
    assert_eq!(c.summary.cves, 1);
    let c = data.changelog(V38, None).unwrap();
    assert_eq!(c.from, None);
    assert_eq!(ids(&c), ["OLD"]);
    assert!(data.fixes_cve(V39, "CVE-2024-1111"));
}

#[test]
fn precomputed_gaps_and_no_data() {
    let entries = channel::parse(SL_MICRO_61).unwrap();
    let files = BTreeMap::from([(V312.to_owned(), vec![adv("Y", CREATED_39 + 10, None, &[])])]);
    let data = indexed(entries, files, BTreeMap::new(), None);
    assert_eq!(
        data.changelog(V39, None).unwrap_err(),
        QueryError::NoData { name: V39.into() }
    );
    assert!(data.summary(V39).is_err());
    let c = data.changelog(V312, Some(V38)).unwrap();
    assert_eq!(ids(&c), ["Y"]);
    assert_eq!(c.warnings.len(), 1);
    assert!(c.warnings[0].contains(V39), "{:?}", c.warnings);
}

#[test]
fn detects_upstream_shifted_files() {
    let shifted = precomputed([
        (V38, vec![]),
        (V39, vec![adv("X", CREATED_38 - 100, None, &[])]),
        (V312, vec![adv("Y", CREATED_39 - 100, None, &[])]),
    ]);
    assert!(shifted.looks_shifted());
    let c = shifted.changelog(V312, None).unwrap();
    assert_eq!(c.warnings, [SHIFTED_WARNING]);
    let c = shifted.changelog(V312, Some(V38)).unwrap();
    assert_eq!(c.warnings, [SHIFTED_WARNING]);

    // One advisory after the previous build: not the bug's signature.
    let fine = precomputed([
        (V38, vec![]),
        (V39, vec![adv("X", CREATED_38 - 100, None, &[])]),
        (V312, vec![adv("Y", CREATED_39 + 1, None, &[])]),
    ]);
    assert!(!fine.looks_shifted());
    // The oldest file is not empty: not the signature either.
    let fine = precomputed([
        (V38, vec![adv("O", 1, None, &[])]),
        (V39, vec![adv("X", CREATED_38 - 100, None, &[])]),
        (V312, vec![adv("Y", CREATED_39 - 100, None, &[])]),
    ]);
    assert!(!fine.looks_shifted());
}

#[test]
fn raw_data_wins_over_shifted_files() {
    let entries = vec![
        entry("a", "v1.0", Some(100)),
        entry("b", "v1.1", Some(200)),
        entry("c", "v1.2", Some(300)),
    ];
    let files = BTreeMap::from([
        ("a".to_owned(), vec![]),
        ("b".to_owned(), vec![adv("Z", 50, None, &[])]),
        ("c".to_owned(), vec![adv("Z2", 150, None, &[])]),
    ]);
    let packages = BTreeMap::from([
        ("a".into(), pkgs(PKG_A)),
        ("b".into(), pkgs(PKG_B)),
        ("c".into(), pkgs(PKG_C)),
    ]);
    let data = indexed(entries, files, packages, Some(updateinfo()));
    assert!(data.looks_shifted());
    let c = data.changelog("b", None).unwrap();
    assert_eq!(c.source, Source::Computed);
    assert_eq!(ids(&c), ["A7", "A3", "A1"]);
    assert!(c.warnings.is_empty());
    // The oldest version too: not its empty shifted file with the warning.
    let c = data.changelog("a", None).unwrap();
    assert_eq!(c.source, Source::Computed);
    assert!(
        c.warnings.iter().all(|w| !w.contains("shifted")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn order_without_created_uses_versions() {
    let entries = vec![
        entry("x12", "v2.2.0-3.12", None),
        entry("x9", "v2.2.0-3.9", Some(5)),
        entry("x10", "2.2.0-3.10", Some(1)),
        entry("rc", "v2.2.0-3.9~rc1", None),
    ];
    let data = indexed(entries, BTreeMap::new(), BTreeMap::new(), None);
    assert_eq!(data.order(), ["rc", "x9", "x10", "x12"]);
    let entries = vec![
        entry("x12", "v2.2.0-3.12", Some(1)),
        entry("x9", "v2.2.0-3.9", Some(5)),
        entry("same", "v2.2.0-3.10", Some(5)),
    ];
    let data = indexed(entries, BTreeMap::new(), BTreeMap::new(), None);
    assert_eq!(
        data.order(),
        ["x12", "x9", "same"],
        "created first, then version"
    );
}

#[test]
fn retained_versions_join_the_order() {
    let old = computed_channel();
    let entries = vec![entry("b", "v1.1", Some(200)), entry("c", "v1.2", Some(300))];
    let packages = BTreeMap::from([("b".into(), pkgs(PKG_B)), ("c".into(), pkgs(PKG_C))]);
    let mut new = ChannelData::from_parts(entries, BTreeMap::new(), packages, Some(updateinfo()));
    assert_eq!(IndexedChannel::new(new.clone()).order(), ["b", "c"]);
    new.retain_from(old.data(), "sha256:1", |_| true);
    let new = IndexedChannel::new(new);
    assert_eq!(new.order(), ["a", "b", "c"]);
    assert_eq!(ids(&new.changelog("b", None).unwrap()), ["A7", "A3", "A1"]);
}

#[test]
fn generates_updates_logs() {
    let json = br#"[
      {"metadata":{"name":"a"},"spec":{"version":"v1.0","type":"container","metadata":{"created":100}}},
      {"metadata":{"name":"b"},"spec":{"version":"v1.1","type":"container","metadata":{"created":"200"}}},
      {"metadata":{"name":"c"},"spec":{"version":"v1.2","type":"container","metadata":{"created":300}}},
      {"metadata":{"name":"d"},"spec":{"version":"v1.3","type":"container","metadata":{"created":420}}},
      {"metadata":{"name":"e"},"spec":{"version":"v1.4","type":"container"}},
      {"metadata":{"name":"i"},"spec":{"version":"v1.3","type":"iso","metadata":{"created":420}}}
    ]"#;
    let packages = BTreeMap::from([
        ("a".to_owned(), PKG_A.as_bytes().to_vec()),
        ("b.packages".to_owned(), PKG_B.as_bytes().to_vec()),
        ("c".to_owned(), PKG_C.as_bytes().to_vec()),
    ]);
    let files = generate_updates_logs(json, &packages, &updateinfo()).unwrap();
    let names: Vec<&String> = files.keys().collect();
    // `e` has neither a package list nor `created`: no file.
    assert_eq!(
        names,
        [
            "a.updates.log",
            "b.updates.log",
            "c.updates.log",
            "d.updates.log"
        ]
    );
    let read = |n: &str| -> Vec<String> {
        crate::updates::parse(&files[n])
            .unwrap()
            .into_iter()
            .map(|a| a.id)
            .collect()
    };
    assert!(read("a.updates.log").is_empty());
    assert_eq!(read("b.updates.log"), ["A7", "A3", "A1"]);
    assert_eq!(read("c.updates.log"), ["A2"]);
    // No package list for d: the date window (300, 420].
    assert_eq!(read("d.updates.log"), ["A4"]);

    // What the server serves from those files equals the computed answer.
    let mut image: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(n, b)| (format!("changelogs/{n}"), b.clone()))
        .collect();
    image.push(("channel.json".into(), json.to_vec()));
    let served = IndexedChannel::new(ChannelData::from_files(image).unwrap());
    assert!(!served.looks_shifted());
    assert_eq!(
        ids(&served.changelog("b", None).unwrap()),
        ["A7", "A3", "A1"]
    );

    assert!(matches!(
        generate_updates_logs(json, &BTreeMap::from([("i".to_owned(), Vec::new())]), &[]),
        Err(GenerateError::UnknownVersion { .. })
    ));
    assert!(matches!(
        generate_updates_logs(
            json,
            &BTreeMap::from([("a".to_owned(), b"bad".to_vec())]),
            &[]
        ),
        Err(GenerateError::Packages { .. })
    ));
    assert!(matches!(
        generate_updates_logs(b"{}", &BTreeMap::new(), &[]),
        Err(GenerateError::ChannelJson(_))
    ));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// With packages that only move up, the changelog from the oldest
        /// version is the union of the changelogs between neighbours, and
        /// the package changes add up.
        #[test]
        fn from_oldest_is_the_union_of_steps(bumps in proptest::collection::vec(proptest::collection::vec(0usize..6, 0..4), 2..8)) {
            let names: Vec<String> = (0..bumps.len()).map(|i| format!("v{i}")).collect();
            let mut releases = [1u32; 6];
            let mut updateinfo = Vec::new();
            let mut lists = BTreeMap::new();
            let mut entries = Vec::new();
            for (v, step) in bumps.iter().enumerate() {
                if v > 0 {
                    for &p in step {
                        releases[p] += 1;
                        let id = format!("A{}", updateinfo.len());
                        updateinfo.push(adv(&id, v as i64 * 10, None, &[(&format!("p{p}"), "1", &releases[p].to_string(), "x86_64")]));
                    }
                }
                let text: String = releases.iter().enumerate().map(|(p, r)| format!("p{p}|(none)|1|{r}|x86_64\n")).collect();
                lists.insert(names[v].clone(), pkgs(&text));
                entries.push(entry(&names[v], &format!("1.{v}"), Some(v as i64 * 100)));
            }
            let data = indexed(entries, BTreeMap::new(), lists, Some(updateinfo.clone()));
            let newest = names.last().unwrap();
            let all = data.changelog(newest, Some(&names[0])).unwrap();
            let mut union = BTreeSet::new();
            for n in &names[1..] {
                let c = data.changelog(n, None).unwrap();
                prop_assert_eq!(c.source, Source::Computed);
                union.extend(c.advisories.into_iter().map(|a| a.id));
            }
            let from_oldest: BTreeSet<String> = all.advisories.iter().map(|a| a.id.clone()).collect();
            prop_assert_eq!(&from_oldest, &union);
            prop_assert_eq!(from_oldest.len(), updateinfo.len());
            let bumped: BTreeSet<usize> = bumps[1..].iter().flatten().copied().collect();
            prop_assert_eq!(all.packages.unwrap().upgraded.len(), bumped.len());
            data.precompute_summaries();
            for n in &names {
                prop_assert!(data.summary(n).is_ok());
            }
        }

        #[test]
        fn queries_never_panic(
            versions in proptest::collection::vec(("[a-c]{1,2}", "v?[0-9.~^a-z-]{0,6}", proptest::option::of(0i64..5), any::<bool>(), any::<bool>()), 0..6),
            from in proptest::option::of("[a-c]{1,2}"),
        ) {
            let mut entries = Vec::new();
            let mut files = BTreeMap::new();
            let mut lists = BTreeMap::new();
            for (name, version, created, file, list) in &versions {
                if entries.iter().any(|e: &ChannelEntry| &e.name == name) { continue; }
                entries.push(entry(name, version, *created));
                if *file { files.insert(name.clone(), vec![adv("X", created.unwrap_or(0), None, &[])]); }
                if *list { lists.insert(name.clone(), pkgs(PKG_A)); }
            }
            let data = indexed(entries, files, lists, Some(updateinfo()));
            for name in data.order().to_vec() {
                let _ = data.changelog(&name, from.as_deref());
                let _ = data.summary(&name);
            }
        }
    }
}
