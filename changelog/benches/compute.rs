//! The computed changelog path across a generated channel of 500 versions,
//! 800 packages each and 3000 advisories: `changelog(newest, from=oldest)`,
//! `changelog(newest)` (from the previous version), the summaries of all
//! 500 versions from a cold cache, and parsing the 500 package lists.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use elemental_changelog::channel::{ChannelEntry, EntryKind};
use elemental_changelog::compute::IndexedChannel;
use elemental_changelog::data::ChannelData;
use elemental_changelog::packages::{self, Package, PackageList};
use elemental_changelog::rpmver::Evr;
use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Reference, Severity};

const VERSIONS: usize = 500;
const PACKAGES: usize = 800;
const ADVISORIES: usize = 3000;

/// The architecture of package `p`.
fn arch(p: usize) -> &'static str {
    if p.is_multiple_of(5) {
        "noarch"
    } else {
        "x86_64"
    }
}

/// Advisory `a`, updating package `p` to release `release`.
fn advisory(a: usize, p: usize, release: u32) -> Advisory {
    let cve = format!("CVE-2024-{:05}", a);
    Advisory {
        id: format!("SUSE-SLE-Micro-6.1-2024-{a}"),
        type_: if a.is_multiple_of(3) {
            "security"
        } else {
            "recommended"
        }
        .into(),
        severity: if a.is_multiple_of(3) {
            Severity::Important
        } else {
            Severity::Moderate
        },
        title: format!("Update for pkg-{p:04}"),
        issued: Some(
            jiff::Timestamp::from_second(1_700_000_000 + (a as i64) * 600).unwrap_or_default(),
        ),
        cves: vec![cve.clone()],
        bugs: vec![format!("{}", 1_000_000 + a)],
        references: vec![Reference {
            id: cve,
            type_: "cve".into(),
            href: "https://www.suse.com/security/cve/".into(),
            title: String::new(),
        }],
        description: "This update fixes the following issues: ...".repeat(4),
        packages: vec![AdvisoryPackage {
            name: format!("pkg-{p:04}"),
            epoch: None,
            version: "1.0".into(),
            release: format!("{}.1", release),
            arch: arch(p).into(),
        }],
    }
}

fn generate() -> IndexedChannel {
    let per_version = ADVISORIES / VERSIONS;
    let mut releases = vec![1u32; PACKAGES];
    let mut entries = Vec::new();
    let mut lists = BTreeMap::new();
    let mut updateinfo = Vec::new();
    for v in 0..VERSIONS {
        for k in 0..per_version {
            let a = v * per_version + k;
            let p = (a * 37) % PACKAGES;
            releases[p] += 1;
            updateinfo.push(advisory(a, p, releases[p]));
        }
        let name = format!("base-v2.2.0-{v}.1-os");
        let packages = (0..PACKAGES)
            .map(|p| Package {
                name: format!("pkg-{p:04}"),
                arch: arch(p).into(),
                evr: Evr::new(0, "1.0", format!("{}.1", releases[p])),
                disturl: String::new(),
                license: "MIT".into(),
            })
            .collect();
        lists.insert(name.clone(), PackageList::new(packages));
        entries.push(ChannelEntry {
            name,
            version: format!("v2.2.0-{v}.1"),
            kind: EntryKind::Container,
            upgrade_image: None,
            uri: None,
            display_name: None,
            platforms: Vec::new(),
            created: jiff::Timestamp::from_second(1_700_000_000 + (v as i64) * 3600).ok(),
        });
    }
    IndexedChannel::new(ChannelData::from_parts(
        entries,
        BTreeMap::new(),
        lists,
        Some(updateinfo),
    ))
}

fn bench(c: &mut Criterion) {
    let data = generate();
    let order = data.order().to_vec();
    let (oldest, newest) = (&order[0], &order[order.len() - 1]);
    // Warm the caches built on first use, as a long-lived snapshot has them.
    let full = data
        .changelog(newest, Some(oldest))
        .map(|c| c.advisories.len());
    println!("changelog(newest, from=oldest): {full:?} advisories");

    c.bench_function("changelog newest from oldest", |b| {
        b.iter(|| data.changelog(black_box(newest), Some(black_box(oldest))))
    });
    c.bench_function("changelog newest from previous", |b| {
        b.iter(|| data.changelog(black_box(newest), None))
    });
    c.bench_function("summaries of 500 versions (cold)", |b| {
        b.iter_batched(
            || IndexedChannel::new(data.data().clone()),
            |fresh| {
                for name in fresh.order().to_vec() {
                    black_box(fresh.summary(&name).ok());
                }
                fresh
            },
            BatchSize::SmallInput,
        )
    });
    // The package lists of every version as an image carries them, parsed
    // as one channel's data is (packages shared across the lists).
    let lists: Vec<Vec<u8>> = order
        .iter()
        .filter_map(|n| data.version(n)?.packages.as_ref().map(PackageList::write))
        .collect();
    c.bench_function("parse 500 package lists of 800 packages", |b| {
        b.iter(|| {
            let mut interner = packages::Interner::default();
            for list in &lists {
                black_box(packages::parse_with(black_box(list), &mut interner).ok());
            }
        })
    });
    c.bench_function("summaries of 500 versions (cached)", |b| {
        b.iter(|| {
            for name in &order {
                black_box(data.summary(name).ok());
            }
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
