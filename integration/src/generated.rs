//! Generated channel data for end-to-end tests: a channel of many versions,
//! each with a package list in upstream's `rpm -qa` format, an
//! `updateinfo.xml` whose advisories ship the packages the versions pick up
//! (with CVE ids), and upstream's precomputed `updates.log` files (the date
//! window, right or shifted by one version as upstream's generator writes
//! them), all from one seeded model.
//!
//! The model knows in which versions each advisory's packages first appear
//! ("lands"), so tests derive what the server should answer from the model
//! alone: every EVR is a step on a per-package ladder whose RPM order is the
//! order of its steps, and nothing here compares EVRs the way the server does.
//!
//! What a generated channel contains, besides plain upgrades: upgrades that
//! skip a release (with an advisory for the skipped one), advisories whose
//! packages land in two consecutive versions, packages added (some with
//! advisories) and removed, a downgrade, a multi-version kernel, `noarch`
//! packages, EVRs that need `rpmvercmp` (`1.9` < `1.10`, `~rc`, `^git`,
//! epochs), and advisories that no version picks up: already in the oldest
//! version, for a newer build than any version has, for another architecture,
//! or for a package no version installs.
//!
//! A [`Listing`] is some versions of one generated history as an image of
//! the channel lists them, each with its precomputed `updates.log` (the right
//! date window) and no raw data: the small channels end-to-end tests push,
//! re-sync, break and drop versions of, checked with [`Listing::check`].

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, ensure};
use elemental_changelog::updates;
use elemental_changelog_apiservice::types::{
    self, AdvisoryPackage, ManagedOSVersionChangelog, Reference, Severity, Source,
};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::image::{Compression, Format, Image};
use crate::testbed::elemental::VersionEntry;

/// Unix seconds of 2025-01-01T00:00:00Z, the default first `created`.
pub const FIRST_CREATED: i64 = 1_735_689_600;
const DAY: i64 = 86_400;
const WEEK: i64 = 7 * DAY;

/// Package stems; lists longer than this get `<stem>-module<n>` names.
const STEMS: [&str; 40] = [
    "NetworkManager",
    "NetworkManager-branding-SLE",
    "SL-Micro-release",
    "aaa_base",
    "bash",
    "btrfsprogs",
    "ca-certificates",
    "coreutils",
    "cri-tools",
    "cryptsetup",
    "curl",
    "dbus-1",
    "e2fsprogs",
    "elemental-register",
    "elemental-system-agent",
    "glibc",
    "grub2",
    "gzip",
    "iproute2",
    "kernel-default",
    "krb5",
    "libcurl4",
    "libgcrypt20",
    "libopenssl3",
    "libxml2-2",
    "libzstd1",
    "lvm2",
    "openssh",
    "podman",
    "procps",
    "rsync",
    "shadow",
    "sudo",
    "systemd",
    "tar",
    "timezone",
    "util-linux",
    "vim-small",
    "xz",
    "zypper",
];

/// Versions of the history of a [`Listing`] ([`Spec::history`]): listed versions
/// are numbered from 1 up to one less.
pub const HISTORY_VERSIONS: usize = 16;

/// Packages of the oldest version of a [`Listing`]'s history.
pub const HISTORY_PACKAGES: usize = 8;

/// The package every version installs in two builds (the running kernel and
/// the previous one), as multi-version kernels are.
pub const MULTI_VERSION_PACKAGE: &str = "kernel-default";

/// A package that no version installs; an advisory ships it.
pub const NOT_INSTALLED_PACKAGE: &str = "not-installed-tool";

/// How the versions of a channel are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// `<channel>-v2.2.0-4.<n>-os`, `spec.version` `v2.2.0-4.<n>`, from `n` = 1, as SL Micro
    /// builds are numbered.
    Build,
    /// `<channel>-v1-<n>`, `spec.version` `1.<n>.0`, from `n` = 0: version `n` of a
    /// [`Listing`] is the history's version at index `n`.
    Minor,
}

impl Naming {
    /// `metadata.name` and `spec.version` of the version at `index` of channel `channel`.
    fn name(self, channel: &str, index: usize) -> (String, String) {
        match self {
            Self::Build => (
                format!("{channel}-v2.2.0-4.{}-os", index + 1),
                format!("v2.2.0-4.{}", index + 1),
            ),
            Self::Minor => (format!("{channel}-v1-{index}"), format!("1.{index}.0")),
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Channel name; version names follow [`Spec::naming`].
    pub channel: String,
    /// Number of versions.
    pub versions: usize,
    /// Packages of the oldest version.
    pub packages: usize,
    /// Seed of the model (also part of advisory and CVE ids).
    pub seed: u64,
    /// `created` of the oldest version (unix seconds); the next ones follow weekly.
    pub first_created: i64,
    /// How versions are named.
    pub naming: Naming,
    /// Whether `optional` advisories carry no severity (`unspecified`: `""` in
    /// `updates.log`, as upstream writes an advisory without one), instead of `low`.
    pub unrated_optional: bool,
}

impl Spec {
    /// A channel named `channel` of `versions` versions and `packages` packages, from `seed`.
    pub fn new(channel: &str, versions: usize, packages: usize, seed: u64) -> Self {
        Self {
            channel: channel.to_owned(),
            versions,
            packages,
            seed,
            first_created: FIRST_CREATED,
            naming: Naming::Build,
            unrated_optional: false,
        }
    }

    /// The history a [`Listing`] lists versions of: [`HISTORY_VERSIONS`] versions of
    /// [`HISTORY_PACKAGES`] packages named `<channel>-v1-<n>` ([`Naming::Minor`]), with
    /// unrated `optional` advisories; always the same for the same `channel` and `seed`.
    pub fn history(channel: &str, seed: u64) -> Self {
        Self {
            naming: Naming::Minor,
            unrated_optional: true,
            ..Self::new(channel, HISTORY_VERSIONS, HISTORY_PACKAGES, seed)
        }
    }
}

/// How a package's EVRs go up, step after step. Every ladder's RPM order is
/// the order of its steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ladder {
    /// `1.<step>.0-150600.1.1` (`1.9.0` < `1.10.0`).
    Minor,
    /// `2.4-150600.<step>.1`.
    Release,
    /// `3.0~rc1`, `3.0~rc2`, `3.0`, then `3.0^git<step>`.
    Tilde,
    /// `9.9` without epoch, then `1:0.<step>`.
    Epoch,
}

/// An EVR as written in the files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evr {
    /// The epoch, `None` when unset (`(none)` in package lists).
    pub epoch: Option<u64>,
    /// Version.
    pub version: String,
    /// Release.
    pub release: String,
}

impl Evr {
    /// As the server prints it: `[epoch:]version-release`, the epoch only when not 0.
    pub fn display(&self) -> String {
        match self.epoch {
            Some(epoch) if epoch != 0 => format!("{epoch}:{}-{}", self.version, self.release),
            _ => format!("{}-{}", self.version, self.release),
        }
    }
}

impl Ladder {
    /// The EVR at `step`.
    pub fn evr(self, step: u32) -> Evr {
        let plain = |version: String, release: &str| Evr {
            epoch: None,
            version,
            release: release.to_owned(),
        };
        match self {
            Self::Minor => plain(format!("1.{step}.0"), "150600.1.1"),
            Self::Release => Evr {
                epoch: None,
                version: "2.4".to_owned(),
                release: format!("150600.{step}.1"),
            },
            Self::Tilde => match step {
                0 | 1 => plain(format!("3.0~rc{}", step + 1), "1.1"),
                2 => plain("3.0".to_owned(), "1.1"),
                _ => plain(format!("3.0^git{step}"), "1.1"),
            },
            Self::Epoch => match step {
                0 => plain("9.9".to_owned(), "1.1"),
                _ => Evr {
                    epoch: Some(1),
                    version: format!("0.{step}"),
                    release: "1.1".to_owned(),
                },
            },
        }
    }
}

/// A package installed in a version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// Architecture.
    pub arch: String,
    /// Its ladder.
    pub ladder: Ladder,
    /// Its step on the ladder.
    pub step: u32,
}

impl Installed {
    /// Its EVR.
    pub fn evr(&self) -> Evr {
        self.ladder.evr(self.step)
    }
}

/// One version of the channel.
#[derive(Clone, Debug)]
pub struct Version {
    /// `metadata.name` (and ManagedOSVersion name).
    pub name: String,
    /// `spec.version`.
    pub version: String,
    /// `created`, unix seconds.
    pub created: i64,
    /// Installed packages by name (the highest build of each).
    pub installed: BTreeMap<String, Installed>,
}

/// A package an advisory ships.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shipped {
    /// Package name.
    pub name: String,
    /// Architecture.
    pub arch: String,
    /// The package's ladder.
    pub ladder: Ladder,
    /// The step shipped.
    pub step: u32,
}

/// One advisory of `updateinfo.xml`.
#[derive(Clone, Debug)]
pub struct Advisory {
    /// Advisory id.
    pub id: String,
    /// `security`, `recommended` or `optional`.
    pub kind: &'static str,
    /// Severity.
    pub severity: Severity,
    /// Title.
    pub title: String,
    /// Issued, unix seconds.
    pub issued: i64,
    /// CVE ids, sorted.
    pub cves: Vec<String>,
    /// Bugzilla ids.
    pub bugs: Vec<String>,
    /// Packages shipped.
    pub packages: Vec<Shipped>,
    /// Indexes of the versions in which one of its packages first appears
    /// (0 means already in the oldest version: never part of a changelog).
    pub lands: BTreeSet<usize>,
}

impl Advisory {
    /// The advisory as `updates.log` and the API carry it: bug references,
    /// then CVE references; the description is the title's, as in
    /// `updateinfo.xml`.
    pub fn published(&self) -> types::Advisory {
        let mut references: Vec<Reference> = self
            .bugs
            .iter()
            .map(|b| Reference {
                id: b.clone(),
                type_: "bugzilla".to_owned(),
                href: format!("https://bugzilla.suse.com/show_bug.cgi?id={b}"),
                title: format!("bug {b}"),
            })
            .collect();
        references.extend(self.cves.iter().map(|c| Reference {
            id: c.clone(),
            type_: "cve".to_owned(),
            href: format!("https://www.suse.com/security/cve/{c}/"),
            title: c.clone(),
        }));
        types::Advisory {
            id: self.id.clone(),
            type_: self.kind.to_owned(),
            severity: self.severity,
            title: self.title.clone(),
            issued: Timestamp::from_second(self.issued).ok(),
            cves: self.cves.clone(),
            bugs: self.bugs.clone(),
            references,
            description: format!("{} & more.", self.title),
            packages: self
                .packages
                .iter()
                .map(|p| {
                    let evr = p.ladder.evr(p.step);
                    AdvisoryPackage {
                        name: p.name.clone(),
                        epoch: evr.epoch.map(|e| e.to_string()),
                        version: evr.version,
                        release: evr.release,
                        arch: p.arch.clone(),
                    }
                })
                .collect(),
        }
    }

    /// The advisory as upstream's `updates.log` carries it, and the API serves
    /// it from there: [`Advisory::published`] with a `self` reference (its
    /// announcement, which is neither a bug nor a CVE) first.
    pub fn logged(&self) -> types::Advisory {
        let mut advisory = self.published();
        advisory.references.insert(
            0,
            Reference {
                id: self.id.clone(),
                type_: "self".to_owned(),
                href: format!(
                    "https://www.suse.com/support/update/announcement/{}",
                    self.id
                ),
                title: self.id.clone(),
            },
        );
        advisory
    }
}

/// The `updates.log` of `advisories` as upstream's generator writes it: each
/// as [`Advisory::logged`], every package with its epoch (`"0"` when it has
/// none), in the given order.
fn log_file<'a>(advisories: impl IntoIterator<Item = &'a Advisory>) -> Vec<u8> {
    let logged: Vec<types::Advisory> = advisories
        .into_iter()
        .map(|a| {
            let mut logged = a.logged();
            for p in &mut logged.packages {
                p.epoch.get_or_insert_with(|| "0".to_owned());
            }
            logged
        })
        .collect();
    updates_log(&logged)
}

/// An `updates.log` holding `advisories` as upstream's generator writes it:
/// the product's own writer ([`updates::write`]: `date` a string of unix
/// seconds, `epoch` only when set), plus a field upstream writes and this
/// server does not read, on every advisory. The one writer of `updates.log`
/// files for every generated channel.
pub fn updates_log(advisories: &[types::Advisory]) -> Vec<u8> {
    let mut list: Vec<Value> =
        serde_json::from_slice(&updates::write(advisories)).unwrap_or_default();
    for advisory in &mut list {
        if let Some(map) = advisory.as_object_mut() {
            map.insert("upstreamOnlyField".to_owned(), Value::from("ignored"));
        }
    }
    serde_json::to_vec(&list).unwrap_or_default()
}

/// A package change between two versions: name, arch, old EVR, new EVR (as the server prints them).
pub type Change = (String, String, Option<String>, Option<String>);

/// Package changes between two versions, each list sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Upgraded.
    pub upgraded: Vec<Change>,
    /// Downgraded.
    pub downgraded: Vec<Change>,
    /// Added.
    pub added: Vec<Change>,
    /// Removed.
    pub removed: Vec<Change>,
}

/// Counts of a version's default changelog (against the previous version).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Advisories.
    pub advisories: usize,
    /// Security advisories.
    pub security: usize,
    /// Distinct CVEs.
    pub cves: usize,
    /// Highest severity.
    pub severity: Severity,
    /// Packages upgraded, added and removed, when the version has a previous one.
    pub packages: Option<(usize, usize, usize)>,
}

/// A generated channel.
#[derive(Clone, Debug)]
pub struct Channel {
    /// Channel name.
    pub name: String,
    /// Versions, oldest first.
    pub versions: Vec<Version>,
    /// Every advisory of `updateinfo.xml`.
    pub advisories: Vec<Advisory>,
    seed: u64,
}

/// splitmix64: small, deterministic, good enough for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        // n is small; the modulo bias is irrelevant here.
        (self.next() % n.max(1) as u64) as usize
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// A package while the model evolves.
struct Package {
    name: String,
    installed: Installed,
    /// Never shipped by an advisory: only these are removed or downgraded,
    /// so every advisory's packages only go up once they land.
    quiet: bool,
    removed: bool,
}

/// Advisories being built, with their numbering.
struct Builder {
    seed: u64,
    unrated_optional: bool,
    advisories: Vec<Advisory>,
    cves: usize,
    bugs: usize,
}

impl Builder {
    fn advisory(
        &mut self,
        rng: &mut Rng,
        kind: &'static str,
        issued: i64,
        packages: Vec<Shipped>,
    ) -> &mut Advisory {
        let seq = self.advisories.len() + 1;
        let severity = match kind {
            "security" => [
                Severity::Low,
                Severity::Moderate,
                Severity::Important,
                Severity::Critical,
            ][rng.below(4)],
            "recommended" => [Severity::Low, Severity::Moderate][rng.below(2)],
            _ if self.unrated_optional => Severity::Unspecified,
            _ => Severity::Low,
        };
        let mut cves = Vec::new();
        if kind == "security" {
            for _ in 0..=rng.below(2) {
                self.cves += 1;
                cves.push(format!("CVE-2025-{}{:04}", self.seed, self.cves));
            }
        }
        self.bugs += 1;
        let names: BTreeSet<&str> = packages.iter().map(|p| p.name.as_str()).collect();
        let title = format!(
            "{} update for {}",
            match kind {
                "security" => "Security",
                "recommended" => "Recommended",
                _ => "Optional",
            },
            names.into_iter().collect::<Vec<_>>().join(", ")
        );
        self.advisories.push(Advisory {
            id: format!("SUSE-GEN{}-2025-{seq}", self.seed),
            kind,
            severity,
            title,
            issued,
            cves,
            bugs: vec![format!("{}{:05}", 1_200_000 + self.seed, self.bugs)],
            packages,
            lands: BTreeSet::new(),
        });
        let last = self.advisories.len() - 1;
        &mut self.advisories[last]
    }
}

fn package_name(i: usize) -> String {
    let stem = STEMS[i % STEMS.len()];
    match i / STEMS.len() {
        0 => stem.to_owned(),
        n => format!("{stem}-module{n}"),
    }
}

/// The x86_64 package and its aarch64 build, as updateinfo lists both; a
/// `noarch` package once.
fn shipped(name: &str, installed: &Installed, step: u32) -> Vec<Shipped> {
    let one = |arch: &str| Shipped {
        name: name.to_owned(),
        arch: arch.to_owned(),
        ladder: installed.ladder,
        step,
    };
    if installed.arch == "noarch" {
        vec![one("noarch")]
    } else {
        vec![one(&installed.arch), one("aarch64")]
    }
}

fn arch_matches(shipped: &str, installed: &str) -> bool {
    shipped == installed || shipped == "noarch" || installed == "noarch"
}

/// The model's own XML escaping of text and attribute values.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Channel {
    /// Generates the channel of `spec`.
    pub fn generate(spec: &Spec) -> Self {
        let mut rng = Rng(spec.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5eed);
        let ladders = [Ladder::Minor, Ladder::Release, Ladder::Tilde, Ladder::Epoch];
        let mut packages: Vec<Package> = (0..spec.packages)
            .map(|i| {
                let name = package_name(i);
                let kernel = name == MULTI_VERSION_PACKAGE;
                Package {
                    installed: Installed {
                        arch: if i % 5 == 3 && !kernel {
                            "noarch"
                        } else {
                            "x86_64"
                        }
                        .to_owned(),
                        ladder: if kernel {
                            Ladder::Release
                        } else {
                            ladders[i % ladders.len()]
                        },
                        step: rng.below(4) as u32,
                    },
                    name,
                    quiet: i % 5 == 1 && !kernel,
                    removed: false,
                }
            })
            .collect();
        let mut builder = Builder {
            seed: spec.seed,
            unrated_optional: spec.unrated_optional,
            advisories: Vec::new(),
            cves: 0,
            bugs: 0,
        };
        let snapshot = |packages: &[Package]| -> BTreeMap<String, Installed> {
            packages
                .iter()
                .filter(|p| !p.removed)
                .map(|p| (p.name.clone(), p.installed.clone()))
                .collect()
        };
        let (name, version) = spec.naming.name(&spec.channel, 0);
        let mut versions = vec![Version {
            name,
            version,
            created: spec.first_created,
            installed: snapshot(&packages),
        }];

        // Advisories the oldest version already carries.
        for p in packages.iter().filter(|p| !p.quiet).take(3) {
            let ships = shipped(&p.name, &p.installed, p.installed.step);
            let issued = spec.first_created - DAY - rng.below(30) as i64 * DAY;
            builder.advisory(&mut rng, "security", issued, ships);
        }

        let recurring = format!("CVE-2024-{}9001", spec.seed);
        let mut previous_movers: Vec<usize> = Vec::new();
        for i in 1..spec.versions {
            let after = versions[i - 1].created;
            let created = spec.first_created + i as i64 * WEEK + rng.below(DAY as usize) as i64;
            let issued_in_window =
                |rng: &mut Rng| after + 3600 + rng.below((WEEK - DAY) as usize) as i64;
            let live: Vec<usize> = (0..packages.len())
                .filter(|&k| !packages[k].removed)
                .collect();

            // Upgrades; one in six skips a build.
            let mut touched = BTreeSet::new();
            let wanted = 6 + rng.below(9);
            while touched.len() < wanted.min(live.len()) {
                touched.insert(live[rng.below(live.len())]);
            }
            let mut movers = Vec::new();
            let mut skipped = Vec::new();
            for &k in &touched {
                let jump = if rng.one_in(6) { 2 } else { 1 };
                packages[k].installed.step += jump;
                if !packages[k].quiet {
                    movers.push(k);
                    if jump == 2 {
                        skipped.push(k);
                    }
                }
            }
            // A downgrade, a removal, additions.
            let quiet_untouched: Vec<usize> = live
                .iter()
                .copied()
                .filter(|k| packages[*k].quiet && !touched.contains(k))
                .collect();
            if i == spec.versions / 2
                && let Some(&k) = quiet_untouched
                    .iter()
                    .find(|k| packages[**k].installed.step >= 1)
            {
                packages[k].installed.step -= 1;
            }
            if i % 4 == 2
                && let Some(&k) = quiet_untouched.last()
            {
                packages[k].removed = true;
            }
            if i % 3 == 0 {
                for n in 0..=rng.below(2) {
                    packages.push(Package {
                        name: format!("added{i}-tool{n}"),
                        installed: Installed {
                            arch: "x86_64".to_owned(),
                            ladder: Ladder::Minor,
                            step: 0,
                        },
                        quiet: false,
                        removed: false,
                    });
                    if n == 0 {
                        movers.push(packages.len() - 1);
                    }
                }
            }

            // Advisories of the movers, in chunks of one to three; one chunk in
            // six is a rebuild without advisory.
            let mut first = true;
            let mut rest = movers.as_slice();
            while !rest.is_empty() {
                let size = (1 + rng.below(3)).min(rest.len());
                let (chunk, tail) = rest.split_at(size);
                rest = tail;
                let forced = first && i % 7 == 4;
                if !forced && rng.one_in(6) {
                    continue;
                }
                let kind = if forced {
                    "security"
                } else {
                    [
                        "security",
                        "security",
                        "recommended",
                        "recommended",
                        "optional",
                    ][rng.below(5)]
                };
                let mut ships: Vec<Shipped> = chunk
                    .iter()
                    .flat_map(|&k| {
                        let p = &packages[k];
                        shipped(&p.name, &p.installed, p.installed.step)
                    })
                    .collect();
                // Re-released with a package the previous version already picked up.
                if rng.one_in(5)
                    && let Some(&k) = previous_movers.iter().find(|k| !touched.contains(k))
                {
                    let p = &packages[k];
                    ships.extend(shipped(&p.name, &p.installed, p.installed.step));
                }
                let issued = issued_in_window(&mut rng);
                let advisory = builder.advisory(&mut rng, kind, issued, ships);
                if forced {
                    advisory.cves.push(recurring.clone());
                    advisory.cves.sort();
                }
                first = false;
            }
            // The build a skipping upgrade skipped had its own advisory.
            for &k in &skipped {
                let p = &packages[k];
                let ships = shipped(&p.name, &p.installed, p.installed.step - 1);
                let issued = after + 60;
                builder.advisory(&mut rng, "recommended", issued, ships);
            }
            // An advisory for the aarch64 build only.
            if i % 5 == 0
                && let Some(&k) = movers
                    .iter()
                    .find(|k| packages[**k].installed.arch == "x86_64")
            {
                let p = &packages[k];
                let ships = vec![Shipped {
                    name: p.name.clone(),
                    arch: "aarch64".to_owned(),
                    ladder: p.installed.ladder,
                    step: p.installed.step,
                }];
                let issued = issued_in_window(&mut rng);
                builder.advisory(&mut rng, "security", issued, ships);
            }
            previous_movers = movers;
            let (name, version) = spec.naming.name(&spec.channel, i);
            versions.push(Version {
                name,
                version,
                created,
                installed: snapshot(&packages),
            });
        }

        // Advisories no version picks up: a build newer than any version has,
        // and a package no version installs.
        let last = versions.last().map_or(spec.first_created, |v| v.created);
        for p in packages.iter().filter(|p| !p.quiet && !p.removed).take(2) {
            let ships = shipped(&p.name, &p.installed, p.installed.step + 3);
            builder.advisory(&mut rng, "security", last + DAY, ships);
        }
        let ships = vec![Shipped {
            name: NOT_INSTALLED_PACKAGE.to_owned(),
            arch: "x86_64".to_owned(),
            ladder: Ladder::Minor,
            step: 1,
        }];
        builder.advisory(&mut rng, "security", spec.first_created + 3 * DAY, ships);

        let mut channel = Self {
            name: spec.channel.clone(),
            versions,
            advisories: builder.advisories,
            seed: spec.seed,
        };
        channel.compute_lands();
        channel
    }

    /// For each shipped package, the first version installing it at that
    /// step or higher on its ladder (same architecture, or `noarch`).
    fn compute_lands(&mut self) {
        for advisory in &mut self.advisories {
            advisory.lands = advisory
                .packages
                .iter()
                .filter_map(|s| {
                    self.versions.iter().position(|v| {
                        v.installed.get(&s.name).is_some_and(|p| {
                            arch_matches(&s.arch, &p.arch)
                                && p.ladder == s.ladder
                                && p.step >= s.step
                        })
                    })
                })
                .collect();
        }
    }

    /// The seed it was generated from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The CVE fixed again and again (every seventh version from the fifth).
    pub fn recurring_cve(&self) -> String {
        format!("CVE-2024-{}9001", self.seed)
    }

    /// The position of version `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.versions.iter().position(|v| v.name == name)
    }

    /// Ids of the advisories a changelog of version `to` against version
    /// `from` lists: those with a package landing after `from`, up to `to`.
    pub fn expected_advisories(&self, from: usize, to: usize) -> BTreeSet<String> {
        self.advisories
            .iter()
            .filter(|a| a.lands.iter().any(|&l| l > from && l <= to))
            .map(|a| a.id.clone())
            .collect()
    }

    /// The advisory with id `id`.
    pub fn advisory(&self, id: &str) -> Option<&Advisory> {
        self.advisories.iter().find(|a| a.id == id)
    }

    /// Package changes from version `from` to version `to`.
    pub fn expected_changes(&self, from: usize, to: usize) -> Changes {
        let (old, new) = (&self.versions[from].installed, &self.versions[to].installed);
        let mut changes = Changes::default();
        let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        for name in names {
            let (o, n) = (old.get(name), new.get(name));
            let arch = n.or(o).map(|p| p.arch.clone()).unwrap_or_default();
            let change = (
                name.clone(),
                arch,
                o.map(|p| p.evr().display()),
                n.map(|p| p.evr().display()),
            );
            match (o, n) {
                (Some(o), Some(n)) if n.step > o.step => changes.upgraded.push(change),
                (Some(o), Some(n)) if n.step < o.step => changes.downgraded.push(change),
                (None, Some(_)) => changes.added.push(change),
                (Some(_), None) => changes.removed.push(change),
                _ => {}
            }
        }
        changes
    }

    /// Counts of the default changelog of version `index`.
    pub fn counts(&self, index: usize) -> Counts {
        let ids = match index {
            0 => BTreeSet::new(),
            i => self.expected_advisories(i - 1, i),
        };
        let advisories: Vec<&Advisory> = ids.iter().filter_map(|id| self.advisory(id)).collect();
        let cves: BTreeSet<&String> = advisories.iter().flat_map(|a| &a.cves).collect();
        let packages = index.checked_sub(1).map(|p| {
            let c = self.expected_changes(p, index);
            (c.upgraded.len(), c.added.len(), c.removed.len())
        });
        Counts {
            advisories: advisories.len(),
            security: advisories.iter().filter(|a| a.kind == "security").count(),
            cves: cves.len(),
            severity: advisories
                .iter()
                .map(|a| a.severity)
                .max()
                .unwrap_or(Severity::Unspecified),
            packages,
        }
    }

    /// Indexes of the versions whose default changelog fixes `cve`, oldest first.
    pub fn fixing_versions(&self, cve: &str) -> Vec<usize> {
        let lands: BTreeSet<usize> = self
            .advisories
            .iter()
            .filter(|a| a.cves.iter().any(|c| c == cve))
            .flat_map(|a| a.lands.iter().copied())
            .filter(|&l| l > 0)
            .collect();
        lands.into_iter().collect()
    }

    /// `channel.json`.
    pub fn channel_json(&self) -> Vec<u8> {
        channel_json(&self.versions)
    }

    /// The ManagedOSVersions the operator makes of the versions.
    pub fn entries(&self) -> Vec<VersionEntry> {
        entries(&self.versions)
    }

    /// `<name>.packages` of version `index`, in `rpm -qa` order (unsorted,
    /// as rpm prints it): the multi-version kernel has its previous build too.
    pub fn packages_file(&self, index: usize) -> Vec<u8> {
        let mut out = String::new();
        let mut line = |name: &str, arch: &str, evr: &Evr| {
            let epoch = evr.epoch.map_or("(none)".to_owned(), |e| e.to_string());
            out.push_str(&format!(
                "{name}|{epoch}|{}|{}|{arch}|obs://build.suse.de/SUSE:SLFO:1.1:Build/standard/{:032x}-{name}|GPL-2.0-or-later\n",
                evr.version, evr.release, self.seed
            ));
        };
        // rpm prints in database order; reversed names stand in for that.
        for (name, p) in self.versions[index].installed.iter().rev() {
            line(name, &p.arch, &p.evr());
            if name == MULTI_VERSION_PACKAGE && p.step > 0 {
                line(name, &p.arch, &p.ladder.evr(p.step - 1));
            }
        }
        out.into_bytes()
    }

    /// The repository's `updateinfo.xml`.
    pub fn updateinfo_xml(&self) -> Vec<u8> {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<updates>\n");
        for a in &self.advisories {
            out.push_str(&format!(
                "  <update from=\"maint-coord@suse.de\" status=\"stable\" type=\"{}\" version=\"1\">\n    <id>{}</id>\n    <title>{}</title>\n    <severity>{}</severity>\n    <release>SUSE Linux Micro 6.1</release>\n    <issued date=\"{}\"/>\n    <references>\n",
                a.kind,
                escape(&a.id),
                escape(&a.title),
                a.severity.as_str(),
                a.issued
            ));
            for bug in &a.bugs {
                out.push_str(&format!(
                    "      <reference href=\"https://bugzilla.suse.com/show_bug.cgi?id={bug}\" id=\"{bug}\" title=\"bug {bug}\" type=\"bugzilla\"/>\n"
                ));
            }
            for cve in &a.cves {
                out.push_str(&format!(
                    "      <reference href=\"https://www.suse.com/security/cve/{cve}/\" id=\"{cve}\" title=\"{cve}\" type=\"cve\"/>\n"
                ));
            }
            out.push_str(&format!(
                "    </references>\n    <description>{} &amp; more.</description>\n    <pkglist>\n      <collection>\n",
                escape(&a.title)
            ));
            for p in &a.packages {
                let evr = p.ladder.evr(p.step);
                let file = format!("{}-{}-{}.{}.rpm", p.name, evr.version, evr.release, p.arch);
                out.push_str(&format!(
                    "        <package name=\"{}\" epoch=\"{}\" version=\"{}\" release=\"{}\" arch=\"{}\" src=\"{}/{}\">\n          <filename>{}</filename>\n        </package>\n",
                    escape(&p.name),
                    evr.epoch.unwrap_or(0),
                    escape(&evr.version),
                    escape(&evr.release),
                    p.arch,
                    p.arch,
                    escape(&file),
                    escape(&file)
                ));
            }
            out.push_str("      </collection>\n    </pkglist>\n  </update>\n");
        }
        out.push_str("</updates>\n");
        out.into_bytes()
    }

    /// Ids of the advisories issued after the previous version's `created`
    /// and not after version `index`'s: the date window (nothing for the
    /// oldest version).
    pub fn window_ids(&self, index: usize) -> BTreeSet<String> {
        let Some(previous) = index.checked_sub(1) else {
            return BTreeSet::new();
        };
        let (after, until) = (
            self.versions[previous].created,
            self.versions[index].created,
        );
        self.advisories
            .iter()
            .filter(|a| a.issued > after && a.issued <= until)
            .map(|a| a.id.clone())
            .collect()
    }

    /// Ids of the advisories in version `index`'s file as upstream's generator
    /// writes it: the date window of the previous version (issued after the
    /// `created` of the version two before, up to the previous version's), and
    /// nothing for the oldest version.
    pub fn shifted_ids(&self, index: usize) -> BTreeSet<String> {
        let Some(previous) = index.checked_sub(1) else {
            return BTreeSet::new();
        };
        let until = self.versions[previous].created;
        let after = previous
            .checked_sub(1)
            .map_or(i64::MIN, |p| self.versions[p].created);
        self.advisories
            .iter()
            .filter(|a| a.issued > after && a.issued <= until)
            .map(|a| a.id.clone())
            .collect()
    }

    /// The files of an image with raw data only: `channel.json`, a package
    /// list per version and `updateinfo` at `changelogs/<updateinfo_name>`
    /// (`updateinfo.xml`, `.gz` or `.zst`, compressed accordingly).
    pub fn raw_files(&self, updateinfo_name: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut files = vec![("channel.json".to_owned(), self.channel_json())];
        for (i, v) in self.versions.iter().enumerate() {
            files.push((
                format!("changelogs/{}.packages", v.name),
                self.packages_file(i),
            ));
        }
        let xml = self.updateinfo_xml();
        let compression = if updateinfo_name.ends_with(".gz") {
            crate::image::Compression::Gzip
        } else if updateinfo_name.ends_with(".zst") {
            crate::image::Compression::Zstd
        } else {
            crate::image::Compression::None
        };
        files.push((
            format!("changelogs/{updateinfo_name}"),
            crate::image::compress(compression, &xml)?,
        ));
        Ok(files)
    }

    /// The files of an image with upstream's shifted `updates.log` files only.
    pub fn shifted_files(&self) -> Vec<(String, Vec<u8>)> {
        let mut files = vec![("channel.json".to_owned(), self.channel_json())];
        for (i, v) in self.versions.iter().enumerate() {
            let ids = self.shifted_ids(i);
            files.push((
                format!("changelogs/{}.updates.log", v.name),
                log_file(self.advisories.iter().filter(|a| ids.contains(&a.id))),
            ));
        }
        files
    }
}

/// Versions of a generated channel as one image of it lists them, with
/// upstream's precomputed `updates.log` of each and no raw data, so that the
/// server serves these files (`source: Precomputed`).
///
/// Version `n` is version `n` of the channel's history ([`Spec::history`]),
/// whichever others are listed: images of one channel may list other
/// versions (add one, drop the oldest) of the same data. A version's file
/// holds its date window ([`Channel::window_ids`]: the advisories issued
/// after the history's previous version and up to it), written when the
/// version was built; it never changes with what else the image lists.
#[derive(Clone, Debug)]
pub struct Listing {
    /// The channel's whole history; its version 0 is never listed, so every
    /// listed version has a date window.
    pub history: Channel,
    /// The listed versions, oldest first.
    pub versions: Vec<Version>,
}

impl Listing {
    /// Versions `numbers` (ascending, from 1, below [`HISTORY_VERSIONS`]) of
    /// the history of `channel` from `seed`, named `<channel>-v1-<n>`.
    ///
    /// # Panics
    ///
    /// When a number is beyond the history.
    pub fn generate(channel: &str, seed: u64, numbers: impl IntoIterator<Item = u32>) -> Self {
        let history = Channel::generate(&Spec::history(channel, seed));
        let versions = numbers
            .into_iter()
            .map(|n| history.versions[n as usize].clone())
            .collect();
        Self { history, versions }
    }

    /// A listed version by name.
    pub fn version(&self, name: &str) -> anyhow::Result<&Version> {
        self.versions
            .iter()
            .find(|v| v.name == name)
            .with_context(|| format!("{name} is not listed in {}", self.history.name))
    }

    /// The newest listed version.
    pub fn newest(&self) -> anyhow::Result<&Version> {
        self.versions.last().context("a listing without versions")
    }

    /// The listed version just before `name`, if any.
    pub fn previous(&self, name: &str) -> Option<&Version> {
        let index = self.versions.iter().position(|v| v.name == name)?;
        index.checked_sub(1).map(|i| &self.versions[i])
    }

    /// The advisories of version `name`'s `updates.log`, in the file's order
    /// (none for a version not in the history).
    pub fn advisories(&self, name: &str) -> Vec<&Advisory> {
        let ids = self
            .history
            .position(name)
            .map(|i| self.history.window_ids(i))
            .unwrap_or_default();
        self.history
            .advisories
            .iter()
            .filter(|a| ids.contains(&a.id))
            .collect()
    }

    /// `channel.json` of the listed versions.
    pub fn channel_json(&self) -> Vec<u8> {
        channel_json(&self.versions)
    }

    /// The image's files: `channel.json` and `changelogs/<name>.updates.log`
    /// of each listed version.
    pub fn files(&self) -> Vec<(String, Vec<u8>)> {
        let mut files = vec![("channel.json".to_owned(), self.channel_json())];
        for v in &self.versions {
            files.push((
                format!("changelogs/{}.updates.log", v.name),
                log_file(self.advisories(&v.name)),
            ));
        }
        files
    }

    /// A one-layer channel image for GOARCH `arch` holding [`Listing::files`].
    pub fn image(&self, format: Format, compression: Compression, arch: &str) -> Image {
        Image::channel(format, compression, &self.files()).arch(arch)
    }

    /// The ManagedOSVersions the operator makes of the listed versions.
    pub fn entries(&self) -> Vec<VersionEntry> {
        entries(&self.versions)
    }

    /// Checks that `served` is exactly listed version `name`: read from its
    /// `updates.log`, `from` the previous listed version, every advisory of
    /// the file as [`Advisory::logged`] (an epoch `"0"` served as none),
    /// newest first, and the summary's counts.
    pub fn check(&self, served: &ManagedOSVersionChangelog, name: &str) -> anyhow::Result<()> {
        let version = self.version(name)?;
        let context = || format!("changelog of {name} (seed {})", self.history.seed);
        ensure!(
            served.kind == "ManagedOSVersionChangelog",
            "{}: kind {}",
            context(),
            served.kind
        );
        ensure!(
            served.metadata.name == name,
            "{}: metadata.name {}",
            context(),
            served.metadata.name
        );
        ensure!(
            served.version == version.version,
            "{}: version {}",
            context(),
            served.version
        );
        ensure!(
            served.source == Source::Precomputed,
            "{}: source {:?}",
            context(),
            served.source
        );
        let from = served
            .from
            .as_ref()
            .map(|f| (f.name.as_str(), f.version.as_str()));
        let previous = self
            .previous(name)
            .map(|p| (p.name.as_str(), p.version.as_str()));
        ensure!(
            from == previous,
            "{}: from {from:?}, expected {previous:?}",
            context()
        );
        let expected = self.advisories(name);
        check_logged(&served.advisories, &expected).with_context(context)?;
        let cves: BTreeSet<&String> = expected.iter().flat_map(|a| &a.cves).collect();
        ensure!(
            served.summary.advisories == expected.len() && served.summary.cves == cves.len(),
            "{}: summary {:?}, expected {} advisories and {} CVEs",
            context(),
            served.summary,
            expected.len(),
            cves.len()
        );
        Ok(())
    }
}

/// Checks that `served` holds exactly `expected` as read from an
/// `updates.log`, newest first.
fn check_logged(served: &[types::Advisory], expected: &[&Advisory]) -> anyhow::Result<()> {
    let served_ids: BTreeSet<&str> = served.iter().map(|a| a.id.as_str()).collect();
    let expected_ids: BTreeSet<&str> = expected.iter().map(|a| a.id.as_str()).collect();
    ensure!(
        served_ids == expected_ids && served.len() == expected.len(),
        "advisories {served_ids:?}, expected {expected_ids:?}"
    );
    for advisory in served {
        let model = expected
            .iter()
            .find(|a| a.id == advisory.id)
            .with_context(|| format!("unexpected advisory {}", advisory.id))?;
        let want = model.logged();
        ensure!(
            *advisory == want,
            "advisory served as {advisory:?}, logged as {want:?}"
        );
    }
    let issued: Vec<Option<Timestamp>> = served.iter().map(|a| a.issued).collect();
    ensure!(
        issued.iter().all(Option::is_some) && issued.windows(2).all(|w| w[0] >= w[1]),
        "advisories not newest first: {issued:?}"
    );
    Ok(())
}

/// `channel.json` listing `versions`.
fn channel_json(versions: &[Version]) -> Vec<u8> {
    let entries: Vec<Value> = versions
        .iter()
        .map(|v| {
            json!({
                "metadata": { "name": v.name },
                "spec": {
                    "version": v.version,
                    "type": "container",
                    "metadata": {
                        "upgradeImage": upgrade_image(v),
                        "displayName": format!("Generated OS {}", v.version),
                        "created": v.created.to_string(),
                    },
                },
            })
        })
        .collect();
    serde_json::to_vec_pretty(&entries).unwrap_or_default()
}

/// The ManagedOSVersions the operator makes of `versions`.
fn entries(versions: &[Version]) -> Vec<VersionEntry> {
    versions
        .iter()
        .map(|v| VersionEntry {
            name: v.name.clone(),
            version: v.version.clone(),
            upgrade_image: upgrade_image(v),
            created: Some(v.created),
        })
        .collect()
}

/// The OS image of version `v`.
fn upgrade_image(v: &Version) -> String {
    format!("registry.example.com/gen/os:{}", v.version)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn channel() -> Channel {
        Channel::generate(&Spec::new("gen", 24, 300, 1))
    }

    #[test]
    fn deterministic() {
        let (a, b) = (channel(), channel());
        assert_eq!(a.updateinfo_xml(), b.updateinfo_xml());
        assert_eq!(a.packages_file(7), b.packages_file(7));
        let other = Channel::generate(&Spec::new("gen", 24, 300, 2));
        assert_ne!(a.updateinfo_xml(), other.updateinfo_xml());
    }

    /// Once a shipped package lands it stays: the landing rule and the
    /// server's range rule then agree for every pair of versions.
    #[test]
    fn landed_packages_stay() {
        let c = channel();
        for a in &c.advisories {
            for s in &a.packages {
                let held: Vec<bool> = c
                    .versions
                    .iter()
                    .map(|v| {
                        v.installed
                            .get(&s.name)
                            .is_some_and(|p| arch_matches(&s.arch, &p.arch) && p.step >= s.step)
                    })
                    .collect();
                if let Some(first) = held.iter().position(|h| *h) {
                    assert!(held[first..].iter().all(|h| *h), "{} {}", a.id, s.name);
                }
            }
        }
    }

    #[test]
    fn has_every_kind_of_case() {
        let c = channel();
        assert_eq!(c.versions.len(), 24);
        assert!(c.versions.windows(2).all(|w| w[0].created < w[1].created));
        assert!(c.versions[0].installed.len() >= 300);
        let never: Vec<&Advisory> = c.advisories.iter().filter(|a| a.lands.is_empty()).collect();
        assert!(never.len() >= 4, "{}", never.len());
        assert!(c.advisories.iter().any(|a| a.lands == BTreeSet::from([0])));
        assert!(c.advisories.iter().any(|a| a.lands.len() == 2));
        assert!(c.fixing_versions(&c.recurring_cve()).len() >= 3);
        let all = c.expected_changes(0, 23);
        assert!(!all.added.is_empty() && !all.removed.is_empty());
        // Upgrades across `~`, `^` and a first epoch, which need rpmvercmp.
        let crosses = |from: &str, to: &str| {
            all.upgraded.iter().any(|(_, _, f, t)| {
                f.as_deref().is_some_and(|f| f.contains(from))
                    && t.as_deref().is_some_and(|t| t.contains(to))
            })
        };
        assert!(crosses("~rc", "^git"));
        assert!(crosses("9.9-", "1:0."));
        assert!(
            (1..24).any(|i| !c.expected_changes(i - 1, i).downgraded.is_empty()),
            "no downgrade"
        );
        let middle = c.expected_advisories(2, 14);
        assert!(middle.len() > 40, "{}", middle.len());
        // Not everything in the window: some advisories land outside.
        assert!(middle.len() < c.advisories.len() / 2 + 20);
        // A plain version-string sort would misorder 4.10 and 4.9.
        assert!(c.versions[9].name.ends_with("4.10-os"));
    }

    #[test]
    fn ladders_are_written_as_rpm_writes_them() {
        assert_eq!(Ladder::Minor.evr(10).display(), "1.10.0-150600.1.1");
        assert_eq!(Ladder::Tilde.evr(0).display(), "3.0~rc1-1.1");
        assert_eq!(Ladder::Tilde.evr(4).display(), "3.0^git4-1.1");
        assert_eq!(Ladder::Epoch.evr(0).display(), "9.9-1.1");
        assert_eq!(Ladder::Epoch.evr(2).display(), "1:0.2-1.1");
        let c = channel();
        let text = String::from_utf8(c.packages_file(3)).unwrap();
        let kernels = text
            .lines()
            .filter(|l| l.starts_with("kernel-default|"))
            .count();
        assert_eq!(kernels, 2);
        assert!(text.lines().all(|l| l.split('|').count() == 7));
    }

    /// Every version of a listing is the history's, whichever others are
    /// listed; its file holds its date window; two seeds share no advisory.
    #[test]
    fn listings_are_versions_of_one_history() {
        let a = Listing::generate("c", 1, 1..=3);
        let again = Listing::generate("c", 1, 1..=3);
        let b = Listing::generate("c", 2, 1..=3);
        assert_eq!(a.files(), again.files());
        assert_ne!(a.files(), b.files());
        let names: Vec<&str> = a.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["c-v1-1", "c-v1-2", "c-v1-3"]);
        assert_eq!(a.versions[1].version, "1.2.0");
        // Files of versions 2 and 3, and not of version 1, in another image.
        let later = Listing::generate("c", 1, 2..=4);
        assert_eq!(later.files()[1..3], a.files()[2..4]);
        assert_eq!(later.channel_json(), channel_json(&later.versions));
        assert_eq!(
            a.previous("c-v1-2").map(|v| v.name.as_str()),
            Some("c-v1-1")
        );
        assert!(a.previous("c-v1-1").is_none() && later.previous("c-v1-2").is_none());
        let mut seen = BTreeSet::new();
        for (i, v) in a.history.versions.iter().enumerate().skip(1) {
            let advisories = a.advisories(&v.name);
            assert!(!advisories.is_empty(), "{}", v.name);
            let after = a.history.versions[i - 1].created;
            for advisory in advisories {
                assert!(advisory.issued > after && advisory.issued <= v.created);
                assert!(seen.insert(advisory.id.clone()), "{} twice", advisory.id);
            }
        }
        let other: BTreeSet<&String> = b.history.advisories.iter().map(|a| &a.id).collect();
        assert!(seen.iter().all(|id| !other.contains(id)));
        // The first listed version fixes a CVE (the replicas test needs one).
        assert!(a.advisories("c-v1-1").iter().any(|a| !a.cves.is_empty()));
    }

    /// A generated `updates.log` has what upstream's has: dates as strings, a
    /// `self` reference first, every epoch (`"0"` for none), a field the
    /// server does not read, and an empty severity for an unrated advisory.
    #[test]
    fn logs_are_upstream_shaped() {
        let listing = Listing::generate("c", 3, 1..=HISTORY_VERSIONS as u32 - 1);
        let mut unrated = 0;
        for (name, file) in listing.files().iter().skip(1) {
            let log: Vec<Value> = serde_json::from_slice(file).unwrap();
            let version = name
                .trim_start_matches("changelogs/")
                .trim_end_matches(".updates.log");
            assert_eq!(log.len(), listing.advisories(version).len(), "{name}");
            for entry in &log {
                assert!(entry["date"].is_string());
                assert_eq!(entry["references"][0]["type"], "self");
                assert_eq!(entry["references"][0]["id"], entry["id"]);
                assert_eq!(entry["upstreamOnlyField"], "ignored");
                for p in entry["packages"].as_array().unwrap() {
                    assert!(p["epoch"].is_string(), "{p}");
                }
                unrated += usize::from(entry["severity"] == "");
            }
        }
        assert!(unrated > 0, "no unrated advisory");
        let zero = listing.files().iter().skip(1).any(|(_, file)| {
            let log: Value = serde_json::from_slice(file).unwrap();
            log.as_array().unwrap().iter().any(|e| {
                e["packages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["epoch"] == "0")
            })
        });
        assert!(zero, "no package without an epoch");
    }

    #[test]
    fn shifted_files_have_upstreams_signature() {
        let c = Channel::generate(&Spec::new("shifted", 8, 80, 2));
        assert!(c.shifted_ids(0).is_empty());
        let mut non_empty = 0;
        for i in 1..8 {
            let ids = c.shifted_ids(i);
            non_empty += usize::from(!ids.is_empty());
            for id in ids {
                assert!(c.advisory(&id).unwrap().issued < c.versions[i - 1].created);
            }
        }
        assert!(non_empty >= 5);
    }
}
