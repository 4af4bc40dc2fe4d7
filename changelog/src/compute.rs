//! The queries the server answers from a [`ChannelData`]: version order,
//! changelogs between two versions, summaries and "which versions fix this
//! CVE", and the generator of precomputed `updates.log` files.
//!
//! [`IndexedChannel`] puts the version order and the cached summaries on top
//! of the parsed data; [`crate::data`] knows nothing of them. The rules are
//! described in `docs/channel-image-format.md`.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use elemental_changelog_apiservice::types::{
    Advisory, ChangelogSummary, PackageChange, PackageChanges, Severity, Source, VersionRef,
};
use jiff::Timestamp;

use crate::channel::{self, ChannelEntry};
use crate::data::{ChannelData, VersionData};
use crate::package_index::{PackageIndex, Presence};
use crate::packages::{self, Package, PackageList};
use crate::rpmver::{Evr, rpmvercmp};
use crate::updates;

/// Why a changelog query cannot be answered. The server maps `FromUnknown`
/// and `FromNotOlder` to 400, the others to 404.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The version is not in this channel's data.
    #[error("version {name:?} is not in the channel data")]
    UnknownVersion {
        /// The version asked for.
        name: String,
    },
    /// `from` is not a version of this channel's data.
    #[error("from={from:?} is not a version of this channel")]
    FromUnknown {
        /// The `from` asked for.
        from: String,
    },
    /// `from` is the version itself or a newer one.
    #[error("from={from:?} is not older than {name:?}")]
    FromNotOlder {
        /// The `from` asked for.
        from: String,
        /// The version asked for.
        name: String,
    },
    /// The version is known but the image carries no changelog data for it.
    #[error("the channel image carries no changelog data for {name:?}")]
    NoData {
        /// The version asked for.
        name: String,
    },
}

/// Why [`generate_updates_logs`] failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// `channel.json` does not parse.
    #[error("invalid channel.json")]
    ChannelJson(#[source] channel::Error),
    /// A package list does not parse.
    #[error("invalid package list of {name:?}")]
    Packages {
        /// Version name.
        name: String,
        /// Why.
        #[source]
        source: packages::Error,
    },
    /// A package list for a name that is not a container entry.
    #[error("package list for {name:?}, which is not a container entry of channel.json")]
    UnknownVersion {
        /// Version name.
        name: String,
    },
}

const SHIFTED_WARNING: &str = "the precomputed changelog files of this channel look shifted by one version: \
each file holds only advisories issued before the previous version was built and the oldest file is empty \
(a known bug of upstream's generator), so these advisories probably belong to the previous upgrade";

/// A package of `updateinfo` and the advisory that ships it.
#[derive(Debug)]
struct Shipped {
    advisory: usize,
    arch: String,
    evr: Evr,
}

/// What is cached for one version.
#[derive(Clone, Debug)]
struct Cached {
    from: Option<VersionRef>,
    summary: ChangelogSummary,
    cves: BTreeSet<String>,
}

/// The changelog of one version compared with an older one: what the
/// channel data says. The server's API object adds the object metadata, the
/// channel and the architecture to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Changelog {
    /// The version's `version` in `channel.json`.
    pub version: String,
    /// The older version compared against; `None` for the oldest version.
    pub from: Option<VersionRef>,
    /// Where the advisories came from.
    pub source: Source,
    /// Counts.
    pub summary: ChangelogSummary,
    /// Advisories, newest first.
    pub advisories: Vec<Advisory>,
    /// Package differences, when both versions have package lists.
    pub packages: Option<PackageChanges>,
    /// Remarks about the data for the reader.
    pub warnings: Vec<String>,
}

/// The data of one channel image with its version order and cached
/// summaries, built on first use: the queries the server answers.
#[derive(Debug)]
pub struct IndexedChannel {
    data: Arc<ChannelData>,
    index: OnceLock<Index>,
}

/// Order and caches of a [`ChannelData`].
#[derive(Debug)]
struct Index {
    /// Version names, oldest first.
    order: Vec<String>,
    position: HashMap<String, usize>,
    shifted: bool,
    /// `updateinfo` packages by name; built on first computed query.
    shipped: OnceLock<HashMap<String, Vec<Shipped>>>,
    summaries: Vec<OnceLock<Result<Cached, QueryError>>>,
    /// The packages of every version by name; built on first package query.
    packages: OnceLock<PackageIndex>,
}

fn strip_v(version: &str) -> &str {
    version
        .strip_prefix('v')
        .or_else(|| version.strip_prefix('V'))
        .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or(version)
}

/// Compares two versions of a channel: by `created`, then by RPM order of
/// `version` (a leading `v` stripped), then by name. When some version of
/// the channel lacks `created`, the version string decides first.
fn version_cmp(a: &ChannelEntry, b: &ChannelEntry, all_created: bool) -> Ordering {
    let by_version = || rpmvercmp(strip_v(&a.version), strip_v(&b.version));
    let first = if all_created {
        a.created.cmp(&b.created).then_with(by_version)
    } else {
        by_version().then_with(|| a.created.cmp(&b.created))
    };
    first.then_with(|| a.name.cmp(&b.name))
}

fn issued(a: &Advisory) -> Option<Timestamp> {
    a.issued
}

impl Index {
    fn new(versions: &BTreeMap<String, Arc<VersionData>>) -> Self {
        let all_created = versions.values().all(|v| v.entry.created.is_some());
        let mut order: Vec<&Arc<VersionData>> = versions.values().collect();
        order.sort_by(|a, b| version_cmp(&a.entry, &b.entry, all_created));
        let shifted = looks_shifted(&order);
        let order: Vec<String> = order.into_iter().map(|v| v.entry.name.clone()).collect();
        let position = order
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let summaries = order.iter().map(|_| OnceLock::new()).collect();
        Self {
            order,
            position,
            shifted,
            shipped: OnceLock::new(),
            summaries,
            packages: OnceLock::new(),
        }
    }
}

/// Upstream's generator bug: every advisory in a version's file predates the
/// previous version's `created`, and the oldest version's file is empty.
fn looks_shifted(order: &[&Arc<VersionData>]) -> bool {
    let Some(oldest) = order.first() else {
        return false;
    };
    if !oldest.advisories.as_ref().is_some_and(Vec::is_empty) {
        return false;
    }
    let mut checked = false;
    for pair in order.windows(2) {
        let [previous, version] = pair else { continue };
        let Some(advisories) = version.advisories.as_ref().filter(|a| !a.is_empty()) else {
            continue;
        };
        let Some(previous_created) = previous.entry.created else {
            return false;
        };
        for a in advisories {
            match issued(a) {
                Some(t) if t < previous_created => {}
                _ => return false,
            }
        }
        checked = true;
    }
    checked
}

/// The result of a query before it is shaped for the response.
struct Outcome<'a> {
    from: Option<usize>,
    source: Source,
    advisories: Vec<&'a Advisory>,
    packages: Option<PackageChanges>,
    warnings: Vec<String>,
}

/// Packages of two versions side by side: (old, new) for each name and
/// architecture (highest EVR of each).
fn pair_packages<'a>(
    old: &'a PackageList,
    new: &'a PackageList,
) -> Vec<(Option<&'a Package>, Option<&'a Package>)> {
    let mut out = Vec::new();
    let mut a = old.latest().peekable();
    let mut b = new.latest().peekable();
    loop {
        let ord = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(x), Some(y)) => x.name.cmp(&y.name).then_with(|| x.arch.cmp(&y.arch)),
        };
        match ord {
            Ordering::Less => out.push((a.next(), None)),
            Ordering::Greater => out.push((None, b.next())),
            Ordering::Equal => out.push((a.next(), b.next())),
        }
    }
    out
}

fn change(old: Option<&Package>, new: Option<&Package>) -> Option<PackageChange> {
    let p = new.or(old)?;
    Some(PackageChange {
        name: p.name.clone(),
        arch: p.arch.clone(),
        from: old.map(|o| o.evr.to_string()),
        to: new.map(|n| n.evr.to_string()),
    })
}

fn evr_unchanged(a: &Evr, b: &Evr) -> bool {
    (a.epoch == b.epoch && a.version == b.version && a.release == b.release) || a == b
}

fn package_changes(pairs: &[(Option<&Package>, Option<&Package>)]) -> PackageChanges {
    let mut changes = PackageChanges::default();
    for &(old, new) in pairs {
        let list = match (old, new) {
            (Some(o), Some(n)) if evr_unchanged(&o.evr, &n.evr) => continue,
            (Some(o), Some(n)) if n.evr > o.evr => &mut changes.upgraded,
            (Some(_), Some(_)) => &mut changes.downgraded,
            (None, Some(_)) => &mut changes.added,
            (Some(_), None) => &mut changes.removed,
            (None, None) => continue,
        };
        list.extend(change(old, new));
    }
    changes
}

fn arch_matches(shipped: &str, installed: &str) -> bool {
    shipped == installed || shipped == "noarch" || installed == "noarch"
}

fn sort_newest_first(advisories: &mut [&Advisory]) {
    advisories.sort_by(|a, b| b.issued.cmp(&a.issued).then_with(|| a.id.cmp(&b.id)));
}

fn summarize(
    advisories: &[&Advisory],
    packages: Option<&PackageChanges>,
) -> (ChangelogSummary, BTreeSet<String>) {
    let mut by_type = BTreeMap::new();
    let mut cves = BTreeSet::new();
    let mut highest = Severity::Unspecified;
    for a in advisories {
        *by_type.entry(a.type_.clone()).or_insert(0) += 1;
        cves.extend(a.cves.iter().cloned());
        highest = highest.max(a.severity);
    }
    let summary = ChangelogSummary {
        advisories: advisories.len(),
        by_type,
        cves: cves.len(),
        highest_severity: highest,
        packages_upgraded: packages.map(|p| p.upgraded.len()),
        packages_downgraded: packages.map(|p| p.downgraded.len()),
        packages_added: packages.map(|p| p.added.len()),
        packages_removed: packages.map(|p| p.removed.len()),
    };
    (summary, cves)
}

impl IndexedChannel {
    /// Indexes `data` (the order and summaries are computed on first use).
    pub fn new(data: impl Into<Arc<ChannelData>>) -> Self {
        Self {
            data: data.into(),
            index: OnceLock::new(),
        }
    }

    /// The parsed data.
    pub fn data(&self) -> &Arc<ChannelData> {
        &self.data
    }

    /// One version by name.
    pub fn version(&self, name: &str) -> Option<&Arc<VersionData>> {
        self.data.version(name)
    }

    fn index(&self) -> &Index {
        self.index.get_or_init(|| Index::new(self.data.versions()))
    }

    /// Version names, oldest first: by `created`, then RPM order of
    /// `version` (a leading `v` stripped), then name. When some version
    /// lacks `created`, the version string decides first.
    pub fn order(&self) -> &[String] {
        &self.index().order
    }

    /// The version just before `name` in [`IndexedChannel::order`].
    pub fn previous(&self, name: &str) -> Result<Option<VersionRef>, QueryError> {
        let pos = self.position(name)?;
        Ok(pos.checked_sub(1).map(|p| self.version_ref(p)))
    }

    /// Whether the precomputed files carry the signature of upstream's
    /// generator bug (see `docs/channel-image-format.md`).
    pub fn looks_shifted(&self) -> bool {
        self.index().shifted
    }

    fn position(&self, name: &str) -> Result<usize, QueryError> {
        self.index()
            .position
            .get(name)
            .copied()
            .ok_or_else(|| QueryError::UnknownVersion {
                name: name.to_owned(),
            })
    }

    fn at(&self, pos: usize) -> &VersionData {
        let name = &self.index().order[pos];
        // Every name of the order is a key of `versions`.
        &self.data.versions()[name]
    }

    fn version_ref(&self, pos: usize) -> VersionRef {
        let v = self.at(pos);
        VersionRef {
            name: v.entry.name.clone(),
            version: v.entry.version.clone(),
        }
    }

    fn shipped(&self) -> Option<&HashMap<String, Vec<Shipped>>> {
        let updateinfo = self.data.updateinfo()?;
        Some(self.index().shipped.get_or_init(|| {
            let mut map: HashMap<String, Vec<Shipped>> = HashMap::new();
            for (i, a) in updateinfo.iter().enumerate() {
                for p in &a.packages {
                    let Ok(epoch) = Evr::parse_epoch(p.epoch.as_deref().unwrap_or("")) else {
                        continue;
                    };
                    map.entry(p.name.clone()).or_default().push(Shipped {
                        advisory: i,
                        arch: p.arch.clone(),
                        evr: Evr::new(epoch, p.version.clone(), p.release.clone()),
                    });
                }
            }
            map
        }))
    }

    /// Advisories of `updateinfo` whose package moved into the new version's
    /// range: EVR ≤ the new one and > the old one (or absent in the old).
    fn computed_advisories(
        &self,
        pairs: &[(Option<&Package>, Option<&Package>)],
    ) -> Vec<&Advisory> {
        let (Some(shipped), Some(updateinfo)) = (self.shipped(), self.data.updateinfo()) else {
            return Vec::new();
        };
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for &(old, new) in pairs {
            let Some(new) = new else { continue };
            if old.is_some_and(|o| new.evr <= o.evr) {
                continue;
            }
            let Some(candidates) = shipped.get(&new.name) else {
                continue;
            };
            for s in candidates {
                if !arch_matches(&s.arch, &new.arch) || s.evr > new.evr {
                    continue;
                }
                if old.is_some_and(|o| s.evr <= o.evr) {
                    continue;
                }
                if seen.insert(s.advisory) {
                    out.push(&updateinfo[s.advisory]);
                }
            }
        }
        out
    }

    /// The default changelog of `pos` (compared with the previous version),
    /// or, when `explicit`, the one compared with `from`. Raw data (package
    /// lists and `updateinfo`) wins over precomputed files.
    fn outcome(
        &self,
        pos: usize,
        from: Option<usize>,
        explicit: bool,
    ) -> Result<Outcome<'_>, QueryError> {
        let version = self.at(pos);
        let from = if explicit { from } else { pos.checked_sub(1) };
        let pairs = from.and_then(|f| {
            let old = self.at(f).packages.as_ref()?;
            let new = version.packages.as_ref()?;
            Some(pair_packages(old, new))
        });
        let packages = pairs.as_deref().map(package_changes);
        let no_updateinfo = "the channel image has no updateinfo: only package changes are listed";
        let oldest =
            "this is the oldest version of the channel: there is nothing to compare it with";
        let (source, advisories, warnings) = if let Some(pairs) = &pairs
            && self.data.updateinfo().is_some()
        {
            let mut advisories = self.computed_advisories(pairs);
            sort_newest_first(&mut advisories);
            (Source::Computed, advisories, Vec::new())
        } else if let Some((advisories, warnings)) = self.precomputed(pos, from, explicit) {
            (Source::Precomputed, advisories, warnings)
        } else if packages.is_some() {
            (Source::Computed, Vec::new(), vec![no_updateinfo.to_owned()])
        } else if from.is_none() && version.packages.is_some() {
            (Source::Computed, Vec::new(), vec![oldest.to_owned()])
        } else {
            return Err(QueryError::NoData {
                name: version.entry.name.clone(),
            });
        };
        Ok(Outcome {
            from,
            source,
            advisories,
            packages,
            warnings,
        })
    }

    /// The advisories of the precomputed files from `from` (exclusive, when
    /// `explicit`) to `pos`, newest first, and the warnings about them;
    /// `None` when no file in that range exists or raw data should answer.
    fn precomputed(
        &self,
        pos: usize,
        from: Option<usize>,
        explicit: bool,
    ) -> Option<(Vec<&Advisory>, Vec<String>)> {
        // The oldest version's shifted file is empty only because of
        // upstream's bug: with raw data, it is not served either.
        let raw_oldest = from.is_none()
            && self.at(pos).packages.is_some()
            && self.data.updateinfo().is_some()
            && self.looks_shifted();
        if raw_oldest {
            return None;
        }
        let range = match from {
            Some(f) if explicit => f + 1..pos + 1,
            _ => pos..pos + 1,
        };
        let count = range.len();
        let mut missing = Vec::new();
        let mut seen = HashSet::new();
        let mut advisories = Vec::new();
        for p in range {
            let v = self.at(p);
            match &v.advisories {
                Some(list) => advisories.extend(list.iter().filter(|a| seen.insert(a.id.as_str()))),
                None => missing.push(v.entry.name.as_str()),
            }
        }
        if missing.len() == count {
            return None;
        }
        let mut warnings = Vec::new();
        if !missing.is_empty() {
            warnings.push(format!(
                "the channel image has no changelog data for {}; their advisories are missing",
                missing.join(", ")
            ));
        }
        if self.looks_shifted() {
            warnings.push(SHIFTED_WARNING.to_owned());
        }
        sort_newest_first(&mut advisories);
        Some((advisories, warnings))
    }

    fn resolve(
        &self,
        name: &str,
        from: Option<&str>,
    ) -> Result<(usize, Option<usize>), QueryError> {
        let pos = self.position(name)?;
        let Some(from) = from else {
            return Ok((pos, None));
        };
        let f =
            self.index()
                .position
                .get(from)
                .copied()
                .ok_or_else(|| QueryError::FromUnknown {
                    from: from.to_owned(),
                })?;
        if f >= pos {
            return Err(QueryError::FromNotOlder {
                from: from.to_owned(),
                name: name.to_owned(),
            });
        }
        Ok((pos, Some(f)))
    }

    /// The changelog of version `name` compared with `from` (default: the
    /// previous version of the channel).
    pub fn changelog(&self, name: &str, from: Option<&str>) -> Result<Changelog, QueryError> {
        let (pos, f) = self.resolve(name, from)?;
        let outcome = self.outcome(pos, f, from.is_some())?;
        let (summary, _) = summarize(&outcome.advisories, outcome.packages.as_ref());
        Ok(Changelog {
            version: self.at(pos).entry.version.clone(),
            from: outcome.from.map(|p| self.version_ref(p)),
            source: outcome.source,
            summary,
            advisories: outcome.advisories.into_iter().cloned().collect(),
            packages: outcome.packages,
            warnings: outcome.warnings,
        })
    }

    fn cached(&self, name: &str) -> Result<&Cached, QueryError> {
        let pos = self.position(name)?;
        self.index().summaries[pos]
            .get_or_init(|| {
                let outcome = self.outcome(pos, None, false)?;
                let (summary, cves) = summarize(&outcome.advisories, outcome.packages.as_ref());
                Ok(Cached {
                    from: outcome.from.map(|p| self.version_ref(p)),
                    summary,
                    cves,
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The summary of the default changelog of `name` (compared with the
    /// previous version) and that previous version. Cached: cheap to call
    /// for every version of a list.
    pub fn summary(
        &self,
        name: &str,
    ) -> Result<(Option<VersionRef>, ChangelogSummary), QueryError> {
        self.cached(name)
            .map(|c| (c.from.clone(), c.summary.clone()))
    }

    /// Computes and caches the summary of every version, so that later
    /// [`IndexedChannel::summary`] and [`IndexedChannel::fixes_cve`] calls are
    /// lookups. Worth calling once off the request path after building the
    /// data (tens of milliseconds for 500 versions of 800 packages).
    pub fn precompute_summaries(&self) {
        for name in self.order() {
            // Errors (no data) are cached too.
            let _ = self.cached(name);
        }
    }

    /// The packages of every version by name, in [`IndexedChannel::order`]: built once, on
    /// first use.
    pub fn package_index(&self) -> &PackageIndex {
        self.index().packages.get_or_init(|| {
            PackageIndex::new((0..self.order().len()).map(|pos| self.at(pos).packages.as_ref()))
        })
    }

    /// Where version `name` stands in [`IndexedChannel::order`]; `None` when it is not in the
    /// data.
    pub fn position_of(&self, name: &str) -> Option<usize> {
        self.position(name).ok()
    }

    /// What version `name` carries of package `package`; `None` for a version not in the data.
    pub fn presence(&self, name: &str, package: &str) -> Option<Presence<'_>> {
        let pos = self.position(name).ok()?;
        self.package_index().presence(package, pos)
    }

    /// Whether the default changelog of `name` lists an advisory fixing
    /// `cve` (case-insensitive). False when there is no data.
    pub fn fixes_cve(&self, name: &str, cve: &str) -> bool {
        self.cached(name)
            .is_ok_and(|c| c.cves.contains(&cve.trim().to_ascii_uppercase()))
    }
}

/// Writes the precomputed `<name>.updates.log` files a channel image should
/// carry, from its `channel.json`, the package list of each version (keyed
/// by version name; a `.packages` suffix is ignored) and the repository's
/// `updateinfo` advisories.
///
/// For each container version, oldest first: the advisories whose packages
/// moved between the previous version's package list and its own (see
/// [`IndexedChannel::changelog`]); when either list is missing but both
/// versions have `created`, the advisories issued after the previous
/// version's `created` and not after its own (upstream's date window, with
/// the bounds the right way round). The oldest version gets an empty file;
/// a version with neither gets none. Returns file name → content.
pub fn generate_updates_logs(
    channel_json: &[u8],
    packages: &BTreeMap<String, Vec<u8>>,
    updateinfo: &[Advisory],
) -> Result<BTreeMap<String, Vec<u8>>, GenerateError> {
    let entries = channel::parse(channel_json).map_err(GenerateError::ChannelJson)?;
    let mut lists = BTreeMap::new();
    let mut interner = packages::Interner::default();
    for (key, bytes) in packages {
        let name = key.strip_suffix(".packages").unwrap_or(key);
        if !entries
            .iter()
            .any(|e| e.name == name && e.kind == channel::EntryKind::Container)
        {
            return Err(GenerateError::UnknownVersion {
                name: name.to_owned(),
            });
        }
        let list = packages::parse_with(bytes, &mut interner).map_err(|source| {
            GenerateError::Packages {
                name: name.to_owned(),
                source,
            }
        })?;
        lists.insert(name.to_owned(), list);
    }
    let data = IndexedChannel::new(ChannelData::from_parts(
        entries,
        BTreeMap::new(),
        lists,
        Some(updateinfo.to_vec()),
    ));
    let mut files = BTreeMap::new();
    for (pos, name) in data.order().iter().enumerate() {
        let advisories: Vec<&Advisory> = match pos.checked_sub(1) {
            None => Vec::new(),
            Some(prev) => {
                let (old, new) = (data.at(prev), data.at(pos));
                if let (Some(o), Some(n)) = (&old.packages, &new.packages) {
                    let pairs = pair_packages(o, n);
                    let mut a = data.computed_advisories(&pairs);
                    sort_newest_first(&mut a);
                    a
                } else if let (Some(after), Some(until)) = (old.entry.created, new.entry.created) {
                    let mut a: Vec<&Advisory> = updateinfo
                        .iter()
                        .filter(|a| issued(a).is_some_and(|t| t > after && t <= until))
                        .collect();
                    sort_newest_first(&mut a);
                    a
                } else {
                    continue;
                }
            }
        };
        let owned: Vec<Advisory> = advisories.into_iter().cloned().collect();
        files.insert(format!("{name}.updates.log"), updates::write(&owned));
    }
    Ok(files)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
