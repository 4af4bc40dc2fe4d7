//! A whole channel image's files through `data::ChannelData::from_files`,
//! then every query the server makes on a `compute::IndexedChannel` (order, previous, changelog with and
//! without `from` for every pair, summary, fixes_cve), retaining versions
//! from an older image, and `compute::generate_updates_logs`. Never panics,
//! and the answers agree with each other.
//!
//! The input is structured with `arbitrary`: `channel.json` is a fixture,
//! generated entries or raw bytes; each changelog file is a fixture,
//! generated content (package lists, `updates.log` written by
//! `updates::write`, `updateinfo.xml`, gzip or zstd) or raw bytes.
#![no_main]

use std::collections::BTreeMap;
use std::io::Write;

use arbitrary::Arbitrary;
use elemental_changelog::compute::{IndexedChannel, QueryError, generate_updates_logs};
use elemental_changelog::data::ChannelData;
use elemental_changelog::{updateinfo, updates};
use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Reference, Severity};
use libfuzzer_sys::fuzz_target;

const CHANNELS: [&[u8]; 4] = [
    include_bytes!("../../changelog/tests/fixtures/channel-sl-micro-6.1-base.json"),
    include_bytes!("../../changelog/tests/fixtures/channel-sl-micro-6.2-base.json"),
    include_bytes!("../../changelog/tests/fixtures/channel-unstable.json"),
    include_bytes!("../../integration/sample/channel.json"),
];
const FILES: [&[u8]; 6] = [
    include_bytes!("../../changelog/tests/fixtures/base-v2.2.0-4.57-os.packages.head40"),
    include_bytes!("../../integration/sample/base-v2.2.0-3.8-os.packages"),
    include_bytes!("../../integration/sample/base-v2.2.0-3.12-os.packages"),
    include_bytes!("../../changelog/tests/fixtures/example.updates.log.json"),
    include_bytes!("../../changelog/tests/fixtures/updateinfo-sample.xml"),
    include_bytes!("../../integration/sample/updateinfo.xml"),
];
/// Names of the fixture channels, so generated files can target them.
const FIXTURE_NAMES: [&str; 4] = [
    "base-v2.2.0-3.8-os",
    "base-v2.2.0-3.9-os",
    "base-v2.2.0-3.12-os",
    "base-v2.2.0-4.57-os",
];
const PACKAGE_NAMES: [&str; 6] = ["bash", "kernel-default", "elemental", "glibc", "zlib", "a"];
const ARCHES: [&str; 3] = ["x86_64", "noarch", "aarch64"];
const LIMITS: updateinfo::Limits = updateinfo::Limits {
    max_advisories: 32,
    max_bytes: 256 * 1024,
    max_element_bytes: 16 * 1024,
    max_packages_per_advisory: 64,
    max_packages: 512,
    max_memory: 1024 * 1024,
    max_duration: std::time::Duration::from_secs(60),
};

/// A short version-like string over an alphabet that exercises rpmvercmp.
#[derive(Debug)]
struct Ver(String);

impl<'a> Arbitrary<'a> for Ver {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        const ALPHABET: &[u8] = b"0123456789.abz~^_+-v";
        let len = u.int_in_range(1..=8)?;
        let mut s = String::with_capacity(len);
        for _ in 0..len {
            s.push(char::from(*u.choose(ALPHABET)?));
        }
        Ok(Self(s))
    }
}

#[derive(Arbitrary, Debug)]
enum Kind {
    Container,
    Iso,
    Other,
}

#[derive(Arbitrary, Debug)]
struct GenEntry {
    name: u8,
    version: Ver,
    kind: Kind,
    created: Option<u16>,
}

#[derive(Arbitrary, Debug)]
enum ChannelSource {
    Fixture(u8),
    Generated(Vec<GenEntry>),
    Raw(Vec<u8>),
}

fn entry_name(n: u8) -> String {
    match FIXTURE_NAMES.get(usize::from(n)) {
        Some(name) => (*name).to_owned(),
        None => format!("v{}", n % 16),
    }
}

impl ChannelSource {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Self::Fixture(i) => CHANNELS[usize::from(*i) % CHANNELS.len()].to_vec(),
            Self::Raw(bytes) => bytes.clone(),
            Self::Generated(entries) => {
                let items: Vec<serde_json::Value> = entries
                    .iter()
                    .map(|e| {
                        let kind = match e.kind {
                            Kind::Container => "container",
                            Kind::Iso => "iso",
                            Kind::Other => "",
                        };
                        serde_json::json!({
                            "metadata": {"name": entry_name(e.name)},
                            "spec": {
                                "version": e.version.0,
                                "type": kind,
                                "metadata": {
                                    "created": e.created.map(|c| 1_700_000_000 + i64::from(c) * 1000),
                                },
                            },
                        })
                    })
                    .collect();
                serde_json::to_vec(&items).expect("JSON values serialize")
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct GenPackage {
    name: u8,
    arch: u8,
    epoch: u8,
    version: Ver,
    release: Ver,
}

impl GenPackage {
    fn name(&self) -> &'static str {
        PACKAGE_NAMES[usize::from(self.name) % PACKAGE_NAMES.len()]
    }
    fn arch(&self) -> &'static str {
        ARCHES[usize::from(self.arch) % ARCHES.len()]
    }
    fn epoch(&self) -> u8 {
        self.epoch % 3
    }
}

#[derive(Arbitrary, Debug)]
struct GenAdvisory {
    id: u8,
    security: bool,
    severity: u8,
    issued: Option<u16>,
    cves: Vec<u16>,
    packages: Vec<GenPackage>,
}

impl GenAdvisory {
    fn id(&self) -> String {
        format!("SUSE-{}", self.id % 24)
    }
    fn type_(&self) -> &'static str {
        if self.security {
            "security"
        } else {
            "recommended"
        }
    }
    fn severity(&self) -> Severity {
        match self.severity % 5 {
            0 => Severity::Unspecified,
            1 => Severity::Low,
            2 => Severity::Moderate,
            3 => Severity::Important,
            _ => Severity::Critical,
        }
    }
    fn issued(&self) -> Option<i64> {
        self.issued.map(|i| 1_700_000_000 + i64::from(i) * 700)
    }
    fn cve(c: u16) -> String {
        format!("CVE-2024-{:05}", c % 64)
    }

    fn advisory(&self) -> Advisory {
        let references: Vec<Reference> = self
            .cves
            .iter()
            .map(|&c| Reference {
                href: String::new(),
                id: Self::cve(c),
                title: String::new(),
                type_: "cve".to_owned(),
            })
            .collect();
        let (cves, bugs) = updates::cves_and_bugs(&references);
        Advisory {
            id: self.id(),
            type_: self.type_().to_owned(),
            severity: self.severity(),
            title: "t".to_owned(),
            issued: self
                .issued()
                .map(|s| jiff::Timestamp::from_second(s).expect("in range")),
            cves,
            bugs,
            references,
            description: String::new(),
            packages: self
                .packages
                .iter()
                .map(|p| AdvisoryPackage {
                    name: p.name().to_owned(),
                    epoch: (p.epoch() != 0).then(|| p.epoch().to_string()),
                    version: p.version.0.clone(),
                    release: p.release.0.clone(),
                    arch: p.arch().to_owned(),
                })
                .collect(),
        }
    }

    fn xml(&self, out: &mut String) {
        out.push_str(&format!(
            "<update type=\"{}\"><id>{}</id><title>t</title><severity>{}</severity>",
            self.type_(),
            self.id(),
            self.severity().as_str()
        ));
        if let Some(issued) = self.issued() {
            out.push_str(&format!("<issued date=\"{issued}\"/>"));
        }
        out.push_str("<references>");
        for &c in &self.cves {
            let id = Self::cve(c);
            out.push_str(&format!("<reference id=\"{id}\" type=\"cve\" href=\"h\"/>"));
        }
        out.push_str("</references><pkglist><collection>");
        for p in &self.packages {
            out.push_str(&format!(
                "<package name=\"{}\" epoch=\"{}\" version=\"{}\" release=\"{}\" arch=\"{}\"/>",
                p.name(),
                p.epoch(),
                p.version.0,
                p.release.0,
                p.arch()
            ));
        }
        out.push_str("</collection></pkglist></update>");
    }
}

#[derive(Arbitrary, Debug)]
enum Compress {
    Plain,
    Gzip,
    Zstd,
}

#[derive(Arbitrary, Debug)]
enum FileName {
    Updates(u8),
    Packages(u8),
    UpdateInfo(Compress),
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Content {
    Fixture(u8),
    Packages(Vec<GenPackage>),
    Updates(Vec<GenAdvisory>),
    UpdateInfo(Vec<GenAdvisory>),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct File {
    name: FileName,
    content: Content,
}

impl File {
    fn path(&self) -> String {
        match &self.name {
            FileName::Updates(n) => format!("changelogs/{}.updates.log", entry_name(*n)),
            FileName::Packages(n) => format!("./changelogs/{}.packages", entry_name(*n)),
            FileName::UpdateInfo(Compress::Plain) => "/changelogs/updateinfo.xml".to_owned(),
            FileName::UpdateInfo(Compress::Gzip) => "changelogs/updateinfo.xml.gz".to_owned(),
            FileName::UpdateInfo(Compress::Zstd) => "changelogs/updateinfo.xml.zst".to_owned(),
            FileName::Other(p) => p.clone(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let plain = match &self.content {
            Content::Fixture(i) => FILES[usize::from(*i) % FILES.len()].to_vec(),
            Content::Raw(bytes) => return bytes.clone(),
            Content::Packages(packages) => packages
                .iter()
                .map(|p| {
                    format!(
                        "{}|{}|{}|{}|{}|obs://x|MIT\n",
                        p.name(),
                        p.epoch(),
                        p.version.0,
                        p.release.0,
                        p.arch()
                    )
                })
                .collect::<String>()
                .into_bytes(),
            Content::Updates(advisories) => {
                let list: Vec<Advisory> = advisories.iter().map(GenAdvisory::advisory).collect();
                updates::write(&list)
            }
            Content::UpdateInfo(advisories) => {
                let mut xml = String::from("<?xml version=\"1.0\"?><updates>");
                advisories.iter().for_each(|a| a.xml(&mut xml));
                xml.push_str("</updates>");
                xml.into_bytes()
            }
        };
        match &self.name {
            FileName::UpdateInfo(Compress::Gzip) => {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(&plain).expect("gzip to memory");
                gz.finish().expect("gzip to memory")
            }
            FileName::UpdateInfo(Compress::Zstd) => {
                zstd::encode_all(&plain[..], 1).expect("zstd to memory")
            }
            _ => plain,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    channel: ChannelSource,
    files: Vec<File>,
    /// An older image of the same channel whose versions are retained.
    older: Option<ChannelSource>,
    keep_mask: u16,
    cve: u16,
}

fn query_everything(data: &ChannelData, extra_cve: &str) {
    let data = IndexedChannel::new(data.clone());
    let order = data.order();
    assert_eq!(order.len(), data.data().versions().len());
    let mut sorted: Vec<&String> = order.iter().collect();
    sorted.sort();
    assert!(
        sorted.iter().copied().eq(data.data().versions().keys()),
        "order is not a permutation"
    );
    let _ = data.looks_shifted();

    for (pos, name) in order.iter().enumerate() {
        let previous = data.previous(name).expect("a listed version is known");
        assert_eq!(
            previous.map(|p| p.name),
            pos.checked_sub(1).map(|p| order[p].clone())
        );

        let changelog = data.changelog(name, None);
        let summary = data.summary(name);
        match (&changelog, &summary) {
            (Ok(c), Ok((from, s))) => {
                assert_eq!(&c.summary, s);
                assert_eq!(&c.from, from);
                assert_eq!(c.summary.advisories, c.advisories.len());
                assert!(
                    c.advisories.windows(2).all(|w| w[0].issued >= w[1].issued),
                    "advisories not newest first"
                );
                for a in &c.advisories {
                    for cve in &a.cves {
                        assert!(data.fixes_cve(name, cve), "{name} should fix {cve}");
                        assert!(data.fixes_cve(name, &cve.to_ascii_lowercase()));
                    }
                }
            }
            (Err(a), Err(b)) => {
                assert_eq!(a, b);
                assert!(matches!(a, QueryError::NoData { .. }), "{a:?}");
                assert!(!data.fixes_cve(name, extra_cve));
            }
            _ => panic!("changelog and summary disagree: {changelog:?} vs {summary:?}"),
        }
        let _ = data.fixes_cve(name, extra_cve);

        for (from_pos, from) in order.iter().enumerate() {
            match data.changelog(name, Some(from)) {
                Err(QueryError::FromNotOlder { .. }) => assert!(from_pos >= pos),
                Err(QueryError::NoData { .. }) => assert!(from_pos < pos),
                Err(other) => panic!("unexpected {other:?}"),
                Ok(c) => {
                    assert!(from_pos < pos);
                    assert_eq!(c.from.map(|f| f.name).as_deref(), Some(from.as_str()));
                }
            }
        }
    }
    assert!(matches!(
        data.changelog("no-such-version-", None),
        Err(QueryError::UnknownVersion { .. })
    ));
    if let Some(name) = order.first() {
        assert!(matches!(
            data.changelog(name, Some("no-such-version-")),
            Err(QueryError::FromUnknown { .. })
        ));
    }
    // Cached answers stay the same.
    let before: Vec<_> = order.iter().map(|n| data.summary(n)).collect();
    data.precompute_summaries();
    let after: Vec<_> = order.iter().map(|n| data.summary(n)).collect();
    assert_eq!(before, after);
}

fuzz_target!(|input: Input| {
    if input.files.len() > 12 {
        return;
    }
    let channel_json = input.channel.bytes();
    let mut files: Vec<(String, Vec<u8>)> =
        input.files.iter().map(|f| (f.path(), f.bytes())).collect();
    files.push(("channel.json".to_owned(), channel_json.clone()));
    let extra_cve = GenAdvisory::cve(input.cve);

    let Ok(mut data) = ChannelData::from_files_with_limits(files.clone(), LIMITS) else {
        return;
    };
    if data.versions().len() > 16 {
        return;
    }
    query_everything(&data, &extra_cve);

    if let Some(older) = &input.older {
        let mut old_files = files.clone();
        old_files.retain(|(p, _)| p != "channel.json");
        old_files.push(("channel.json".to_owned(), older.bytes()));
        if let Ok(old) = ChannelData::from_files_with_limits(old_files, LIMITS) {
            let keep = |name: &str| name.len() % 2 == usize::from(input.keep_mask % 2);
            data.retain_from(&old, "sha256:older", keep);
            if data.versions().len() <= 24 {
                query_everything(&data, &extra_cve);
            }
            data.drop_retained(|name| name.len() % 3 != 0);
            if data.versions().len() <= 24 {
                query_everything(&data, &extra_cve);
            }
        }
    }

    // The generator of precomputed files, from the same inputs.
    let packages: BTreeMap<String, Vec<u8>> = files
        .iter()
        .filter_map(|(p, b)| {
            let name = p.trim_start_matches("./").strip_prefix("changelogs/")?;
            name.ends_with(".packages")
                .then(|| (name.to_owned(), b.clone()))
        })
        .collect();
    let updateinfo = data.updateinfo().map(|a| a.to_vec()).unwrap_or_default();
    if let Ok(logs) = generate_updates_logs(&channel_json, &packages, &updateinfo) {
        for (name, log) in logs {
            updates::parse(&log).unwrap_or_else(|e| panic!("generated {name} does not parse: {e}"));
        }
    }
});
