#![allow(clippy::unwrap_used)]

use super::*;
use crate::packages::{PackageList, parse};
use proptest::prelude::*;

fn list(lines: &str) -> PackageList {
    parse(lines.as_bytes()).unwrap()
}

fn evrs(presence: Option<Presence<'_>>) -> Option<Vec<String>> {
    match presence? {
        Presence::Installed(p) => Some(p.iter().map(|p| format!("{}.{}", p.evr, p.arch)).collect()),
        Presence::Absent => Some(vec!["absent".into()]),
        Presence::NoPackageList => Some(vec!["none".into()]),
    }
}

#[test]
fn names_follow_the_rule() {
    for ok in [
        "xz",
        "libstdc++6",
        "perl-Net_SSLeay",
        "_x",
        "kernel-default",
        "a.b",
    ] {
        assert_eq!(parse_name(ok), Ok(ok), "{ok}");
    }
    let long = "a".repeat(MAX_NAME_CHARS + 1);
    for bad in [
        "",
        "-x",
        ".x",
        "x y",
        "x/y",
        "perl(Foo)",
        "xz|1",
        "é",
        long.as_str(),
    ] {
        assert_eq!(parse_name(bad), Err(Error::Name), "{bad}");
    }
    assert_eq!(parse_name(&long[1..]).unwrap().len(), MAX_NAME_CHARS);
    assert!(Error::Name.to_string().contains("1 to 128 characters"));
}

#[test]
fn evrs_follow_the_rule() {
    let evr = |t| parse_evr(t, Bound::Below);
    assert_eq!(evr("5.6.2").unwrap(), Evr::new(0, "5.6.2", ""));
    assert_eq!(
        evr("1:3.0.13-150600.1").unwrap(),
        Evr::new(1, "3.0.13", "150600.1")
    );
    assert_eq!(
        evr("0:1.0~rc1^git2-1_1+b").unwrap().to_string(),
        "1.0~rc1^git2-1_1+b"
    );
    let long = "1".repeat(MAX_EVR_CHARS + 1);
    for bad in [
        "",
        ":1",
        "a:1",
        "1:",
        "1-",
        "-1",
        "1-2-3",
        "1 2",
        "1/2",
        "1:2:3",
        "1,2",
        long.as_str(),
    ] {
        assert_eq!(
            evr(bad),
            Err(Error::Evr {
                bound: Bound::Below
            }),
            "{bad:?}"
        );
    }
    assert!(
        parse_evr("99999999999999999999999:1", Bound::AtLeast).is_err(),
        "epoch overflow"
    );
}

#[test]
fn an_empty_range_is_refused() {
    let q = |low, high| PackageQuery::new("xz", Some(low), Some(high));
    assert_eq!(q("5.6.2", "5.6.2").unwrap_err(), Error::EmptyRange);
    assert_eq!(q("5.6.2", "5.6.0").unwrap_err(), Error::EmptyRange);
    assert_eq!(q("5.6.0-2", "5.6.0").unwrap_err(), Error::EmptyRange);
    assert!(q("5.6.0", "5.6.0-2").is_ok());
    assert!(q("5.6.0", "1:0.1").is_ok());
    assert_eq!(
        PackageQuery::new("xz", Some("x y"), None).unwrap_err(),
        Error::Evr {
            bound: Bound::AtLeast
        }
    );
}

/// The xz backdoor (CVE-2024-3094): 5.6.0 and 5.6.1 are the versions to find.
#[test]
fn the_xz_example() {
    let versions = [
        Some(list(
            "xz|(none)|5.4.6|1.1|x86_64\nbash|(none)|5.2|1|x86_64\n",
        )),
        Some(list(
            "xz|(none)|5.6.0|1.1|x86_64\nbash|(none)|5.2|1|x86_64\n",
        )),
        Some(list(
            "xz|(none)|5.6.1|1.1|x86_64\nbash|(none)|5.2|1|x86_64\n",
        )),
        None,
        Some(list("bash|(none)|5.2|1|x86_64\n")),
        Some(list(
            "xz|(none)|5.6.2|1.1|x86_64\nbash|(none)|5.2|1|x86_64\n",
        )),
    ];
    let index = PackageIndex::new(versions.iter().map(Option::as_ref));
    let query = PackageQuery::new("xz", Some("5.6.0"), Some("5.6.2")).unwrap();
    let selected: Vec<usize> = (0..versions.len())
        .filter(|&p| query.selects(&index.presence("xz", p).unwrap()))
        .collect();
    assert_eq!(selected, [1, 2]);
    assert_eq!(index.presence("xz", 3), Some(Presence::NoPackageList));
    assert_eq!(index.presence("xz", 4), Some(Presence::Absent));
    assert_eq!(index.presence("xz", 6), None);
    assert_eq!(index.presence("nope", 0), Some(Presence::Absent));
    // Without bounds every version is selected, whatever it carries.
    let any = PackageQuery::new("xz", None, None).unwrap();
    assert!((0..6).all(|p| any.selects(&index.presence("xz", p).unwrap())));
    // bash is the same in every listed version but one gap: two runs.
    assert_eq!(index.names(), 2);
    assert_eq!(index.runs(), 2 + 4);
}

#[test]
fn releases_and_epochs_in_rpm_order() {
    let versions = [
        Some(list("openssl|(none)|3.0.12|150600.3|x86_64\n")),
        Some(list("openssl|(none)|3.0.13|150600.1|x86_64\n")),
        Some(list("openssl|(none)|3.0.13|150600.2|x86_64\n")),
        Some(list("openssl|1|1.1.1|1|x86_64\n")),
    ];
    let index = PackageIndex::new(versions.iter().map(Option::as_ref));
    let selected = |low: Option<&str>, high: Option<&str>| -> Vec<usize> {
        let query = PackageQuery::new("openssl", low, high).unwrap();
        (0..4)
            .filter(|&p| query.selects(&index.presence("openssl", p).unwrap()))
            .collect()
    };
    // Below a version without release: every release of it is out.
    assert_eq!(selected(None, Some("3.0.13")), [0]);
    assert_eq!(selected(None, Some("3.0.13-150600.2")), [0, 1]);
    assert_eq!(selected(Some("3.0.13-150600.2"), None), [2, 3]);
    // The epoch wins over the version.
    assert_eq!(selected(Some("3.1"), None), [3]);
    assert_eq!(selected(Some("1:1.0"), Some("1:1.2")), [3]);
}

#[test]
fn several_architectures_and_installed_versions() {
    let versions = [Some(list(
        "glibc|(none)|2.38|1|i586\nglibc|(none)|2.40|1|x86_64\nkernel-default|(none)|6.4|1|x86_64\nkernel-default|(none)|6.5|1|x86_64\nzlib|(none)|1.3|1|aarch64\nzlib|(none)|1.3|1|x86_64\n",
    ))];
    let index = PackageIndex::new(versions.iter().map(Option::as_ref));
    assert_eq!(
        evrs(index.presence("glibc", 0)).unwrap(),
        ["2.38-1.i586", "2.40-1.x86_64"]
    );
    let Some(Presence::Installed(glibc)) = index.presence("glibc", 0) else {
        panic!("glibc installed")
    };
    let highest = PackageQuery::new("glibc", None, None).unwrap();
    assert_eq!(highest.choose(glibc).unwrap().arch, "x86_64");
    // Within the bounds, the highest in them; selected when any is.
    let old = PackageQuery::new("glibc", None, Some("2.39")).unwrap();
    assert_eq!(old.choose(glibc).unwrap().arch, "i586");
    assert!(old.selects(&Presence::Installed(glibc)));
    let none = PackageQuery::new("glibc", Some("2.41"), None).unwrap();
    assert!(none.choose(glibc).is_none());
    assert!(!none.selects(&Presence::Installed(glibc)));
    // Multi-version kernels: both kept.
    let Some(Presence::Installed(kernels)) = index.presence("kernel-default", 0) else {
        panic!("kernel installed")
    };
    assert_eq!(kernels.len(), 2);
    let six_four = PackageQuery::new("kernel-default", Some("6.4"), Some("6.5")).unwrap();
    assert_eq!(six_four.choose(kernels).unwrap().evr.version, "6.4");
    // Equal EVRs: the first architecture by name.
    let Some(Presence::Installed(zlib)) = index.presence("zlib", 0) else {
        panic!("zlib installed")
    };
    let any = PackageQuery::new("zlib", None, None).unwrap();
    assert_eq!(any.choose(zlib).unwrap().arch, "aarch64");
}

#[test]
fn queries_are_keys_by_their_text() {
    let a = PackageQuery::new("xz", Some("0:5.6.0"), None).unwrap();
    let b = PackageQuery::new("xz", Some("5.6.0"), None).unwrap();
    let c = PackageQuery::new("xz", Some("5.6.00"), None).unwrap();
    assert_eq!(a, b);
    assert_ne!(b, c);
    use std::hash::BuildHasher;
    let state = std::hash::RandomState::new();
    assert_eq!(state.hash_one(&a), state.hash_one(&b));
}

/// A channel's versions: each a package list (or none) drawn from a small set of names,
/// EVRs and architectures, so that names, runs and gaps meet often.
fn channel() -> impl Strategy<Value = Vec<Option<PackageList>>> {
    let package = (
        "(xz|bash|glibc|zlib)",
        0u64..2,
        "[1-3]\\.[0-2]",
        "[1-2]",
        "(x86_64|noarch)",
    );
    let version = proptest::option::weighted(
        0.85,
        proptest::collection::vec(package, 0..6).prop_map(|packages| {
            let text: String = packages
                .into_iter()
                .map(|(n, e, v, r, a)| format!("{n}|{e}|{v}|{r}|{a}\n"))
                .collect();
            list(&text)
        }),
    );
    proptest::collection::vec(version, 0..12)
}

proptest! {
    /// The index answers what each version's own package list says.
    #[test]
    fn presence_is_what_each_list_says(versions in channel(), name in "(xz|bash|glibc|zlib|curl)") {
        let index = PackageIndex::new(versions.iter().map(Option::as_ref));
        prop_assert_eq!(index.versions(), versions.len());
        for (position, version) in versions.iter().enumerate() {
            let expected = match version {
                None => Presence::NoPackageList,
                Some(list) => {
                    let start = list.packages().partition_point(|p| p.name.as_str() < name.as_str());
                    let end = start + list.packages()[start..].partition_point(|p| p.name == name);
                    if start == end { Presence::Absent } else { Presence::Installed(&list.packages()[start..end]) }
                }
            };
            let found = index.presence(&name, position).unwrap();
            prop_assert_eq!(evrs(Some(found)), evrs(Some(expected)), "position {}", position);
        }
        prop_assert_eq!(index.presence(&name, versions.len()), None);
    }

    /// A range selects exactly the versions with an installed EVR `e` such that
    /// `low <= e < high` compared as rpm compares a package with a bound.
    #[test]
    fn bounds_select_in_rpm_order(
        versions in channel(),
        low in proptest::option::of("[0-1]:[1-3]\\.[0-2](-[1-2])?"),
        high in proptest::option::of("[0-1]:[1-3]\\.[0-2](-[1-2])?"),
    ) {
        let Ok(query) = PackageQuery::new("xz", low.as_deref(), high.as_deref()) else {
            return Ok(());
        };
        let index = PackageIndex::new(versions.iter().map(Option::as_ref));
        for (position, version) in versions.iter().enumerate() {
            let presence = index.presence("xz", position).unwrap();
            let in_range = |e: &Evr| {
                low.as_deref().is_none_or(|l| e.cmp_bound(&l.parse().unwrap()) != Ordering::Less)
                    && high.as_deref().is_none_or(|h| e.cmp_bound(&h.parse().unwrap()) == Ordering::Less)
            };
            let expected = if query.is_bounded() {
                version.as_ref().is_some_and(|l| l.by_name("xz").count() > 0
                    && l.packages().iter().any(|p| p.name == "xz" && in_range(&p.evr)))
            } else {
                true
            };
            prop_assert_eq!(query.selects(&presence), expected);
        }
    }

    #[test]
    fn parsers_never_panic(text in any::<String>()) {
        let _ = parse_name(&text);
        let _ = parse_evr(&text, Bound::AtLeast);
    }

    /// What `parse_evr` accepts parses to the same EVR through `Evr`'s own parser.
    #[test]
    fn accepted_evrs_agree_with_evr(text in "([0-9]{1,3}:)?[0-9a-z._+~^]{1,8}(-[0-9a-z._+~^]{1,8})?") {
        if let Ok(evr) = parse_evr(&text, Bound::AtLeast) {
            let other: Evr = text.parse().unwrap();
            prop_assert_eq!((evr.epoch, &evr.version, &evr.release), (other.epoch, &other.version, &other.release));
        }
    }
}
