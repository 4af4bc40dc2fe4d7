//! Which versions of a channel carry package P, and in which EVR: the package index of one
//! channel's data, and the query (`package`, `packageAtLeast`, `packageBelow`) it answers.
//!
//! The index is built once per channel data (from the package lists the data already holds,
//! see [`crate::packages`]) and answers "what does version V carry of package P" with a
//! binary search on the name and one on the version's position. Consecutive versions that
//! carry the same packages of a name share one run, so the index costs a few bytes per change
//! of a package across the channel, not per version and package: the package lists of a
//! channel change little from one version to the next. Machines refer to the version they
//! run; nothing here is per machine.
//!
//! Several packages of one name in one version (several architectures, as `glibc` for
//! `x86_64` and `i586`, or several installed versions, as multi-version kernels) are all
//! kept: [`PackageQuery::choose`] picks the one an answer shows (the highest EVR, within the
//! bounds when there are bounds; the first architecture by name among equal EVRs), and a
//! version is selected by bounds when any of them is within them.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::packages::{Package, PackageList};
use crate::rpmver::Evr;

/// The rule a package name follows, as a 400 answer states it.
pub const NAME_RULE: &str = "a package name is 1 to 128 characters: letters, digits and - . _ + (as rpm names are), starting with a letter, a digit or _";

/// The rule an EVR bound follows, as a 400 answer states it.
pub const EVR_RULE: &str = "an EVR is [EPOCH:]VERSION[-RELEASE] (5.6.0, 5.6.1-1.1, 1:3.0.13): EPOCH digits, VERSION and RELEASE letters, digits and . _ + ~ ^, at most 128 characters";

/// Longest package name accepted.
pub const MAX_NAME_CHARS: usize = 128;

/// Longest EVR bound accepted.
pub const MAX_EVR_CHARS: usize = 128;

/// Which bound of a [`PackageQuery`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// `packageAtLeast`: the lowest EVR selected.
    AtLeast,
    /// `packageBelow`: the lowest EVR no longer selected.
    Below,
}

/// Why a package query is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The name breaks [`NAME_RULE`].
    #[error("{NAME_RULE}")]
    Name,
    /// A bound breaks [`EVR_RULE`].
    #[error("{EVR_RULE}")]
    Evr {
        /// Which bound.
        bound: Bound,
    },
    /// `packageAtLeast` is not lower than `packageBelow`: nothing could be selected.
    #[error("packageAtLeast must be lower than packageBelow in RPM order")]
    EmptyRange,
}

/// A package name, checked against [`NAME_RULE`].
pub fn parse_name(name: &str) -> Result<&str, Error> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '+'));
    if first_ok && rest_ok && name.len() <= MAX_NAME_CHARS {
        Ok(name)
    } else {
        Err(Error::Name)
    }
}

/// An EVR bound, checked against [`EVR_RULE`].
pub fn parse_evr(text: &str, bound: Bound) -> Result<Evr, Error> {
    let refused = Error::Evr { bound };
    if text.is_empty() || text.len() > MAX_EVR_CHARS {
        return Err(refused);
    }
    let (epoch, rest) = match text.split_once(':') {
        Some((epoch, rest)) if !epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_digit()) => {
            (epoch.parse::<u64>().map_err(|_| refused.clone())?, rest)
        }
        Some(_) => return Err(refused),
        None => (0, text),
    };
    let (version, release) = match rest.split_once('-') {
        Some((version, release)) if !release.is_empty() => (version, release),
        Some(_) => return Err(refused),
        None => (rest, ""),
    };
    let part_ok = |part: &str| {
        part.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '~' | '^'))
    };
    if version.is_empty() || !part_ok(version) || !part_ok(release) {
        return Err(refused);
    }
    Ok(Evr::new(epoch, version, release))
}

/// What a version carries of one package name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Presence<'a> {
    /// These packages of the name, sorted by architecture, then EVR (several for several
    /// architectures or installed versions).
    Installed(&'a [Arc<Package>]),
    /// The version's package list does not hold the name.
    Absent,
    /// The image carries no package list for the version.
    NoPackageList,
}

/// `package`, `packageAtLeast` and `packageBelow`: a package name and an optional range of
/// EVRs `[at_least, below)` in RPM order, compared as rpm compares a package with a
/// dependency range ([`Evr::cmp_bound`]: a bound without a release compares versions only).
///
/// Two queries are equal when they are written the same (names, and bounds as
/// [`Evr`] prints them): a key for answers kept.
#[derive(Clone, Debug)]
pub struct PackageQuery {
    name: String,
    at_least: Option<Evr>,
    below: Option<Evr>,
}

impl PackageQuery {
    /// A query, each part checked ([`NAME_RULE`], [`EVR_RULE`]) and the range not empty.
    pub fn new(name: &str, at_least: Option<&str>, below: Option<&str>) -> Result<Self, Error> {
        let name = parse_name(name)?.to_owned();
        let at_least = at_least.map(|t| parse_evr(t, Bound::AtLeast)).transpose()?;
        let below = below.map(|t| parse_evr(t, Bound::Below)).transpose()?;
        if let (Some(low), Some(high)) = (&at_least, &below)
            && low.cmp(high) != Ordering::Less
        {
            return Err(Error::EmptyRange);
        }
        Ok(Self {
            name,
            at_least,
            below,
        })
    }

    /// The package name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `packageAtLeast`.
    pub fn at_least(&self) -> Option<&Evr> {
        self.at_least.as_ref()
    }

    /// `packageBelow`.
    pub fn below(&self) -> Option<&Evr> {
        self.below.as_ref()
    }

    /// Whether a bound is given (only versions carrying the package within it are selected).
    pub fn is_bounded(&self) -> bool {
        self.at_least.is_some() || self.below.is_some()
    }

    /// Whether `evr` is within `[at_least, below)`.
    pub fn contains(&self, evr: &Evr) -> bool {
        self.at_least
            .as_ref()
            .is_none_or(|low| evr.cmp_bound(low) != Ordering::Less)
            && self
                .below
                .as_ref()
                .is_none_or(|high| evr.cmp_bound(high) == Ordering::Less)
    }

    /// The package an answer shows of `installed`: the highest EVR within the bounds (the
    /// first architecture by name among equal EVRs); `None` when none is within them.
    pub fn choose<'a>(&self, installed: &'a [Arc<Package>]) -> Option<&'a Package> {
        installed
            .iter()
            .map(Arc::as_ref)
            .filter(|p| self.contains(&p.evr))
            .max_by(|a, b| a.evr.cmp(&b.evr).then_with(|| b.arch.cmp(&a.arch)))
    }

    /// Whether an item whose version carries `presence` is selected: always without bounds;
    /// with bounds, when it carries the package within them.
    pub fn selects(&self, presence: &Presence<'_>) -> bool {
        match presence {
            Presence::Installed(installed) => {
                !self.is_bounded() || self.choose(installed).is_some()
            }
            Presence::Absent | Presence::NoPackageList => !self.is_bounded(),
        }
    }

    fn key(&self) -> (&str, Option<String>, Option<String>) {
        (
            &self.name,
            self.at_least.as_ref().map(Evr::to_string),
            self.below.as_ref().map(Evr::to_string),
        )
    }
}

impl PartialEq for PackageQuery {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for PackageQuery {}

impl Hash for PackageQuery {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

/// Versions `from..to` (positions in the channel's order) carry `packages[first..first + count]`.
#[derive(Clone, Copy, Debug)]
struct Run {
    from: u32,
    to: u32,
    first: u32,
    count: u32,
}

/// What the version at a position carries of one name.
type Carried<'a> = (u32, &'a [Arc<Package>]);

/// The packages of every version of one channel by name (see the module's documentation).
#[derive(Debug, Default)]
pub struct PackageIndex {
    /// The packages of each run, one run after the other.
    packages: Vec<Arc<Package>>,
    /// The runs of each name, names sorted, each name's runs by position.
    runs: Vec<Run>,
    /// For each name, sorted, the end of its runs in `runs` (the start is the previous end).
    names: Vec<u32>,
    /// For each version (by position), whether it has a package list.
    listed: Vec<bool>,
}

impl PackageIndex {
    /// The index of `lists`, the package list (if any) of each version in the channel's
    /// order.
    pub fn new<'a>(lists: impl IntoIterator<Item = Option<&'a PackageList>>) -> Self {
        let mut listed = Vec::new();
        // Name -> (position, that version's packages of the name), positions ascending.
        let mut by_name: HashMap<&'a str, Vec<Carried<'a>>> = HashMap::new();
        for (position, list) in lists.into_iter().enumerate() {
            listed.push(list.is_some());
            let Some(list) = list else { continue };
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            for group in list.packages().chunk_by(|a, b| a.name == b.name) {
                by_name
                    .entry(group[0].name.as_str())
                    .or_default()
                    .push((position, group));
            }
        }
        let mut names: Vec<_> = by_name.into_iter().collect();
        names.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut index = Self {
            listed,
            ..Self::default()
        };
        for (_, carried) in names {
            index.push_name(&carried);
        }
        index.packages.shrink_to_fit();
        index.runs.shrink_to_fit();
        index.names.shrink_to_fit();
        index
    }

    /// Adds one name's runs from what each version carries of it (positions ascending).
    fn push_name(&mut self, carried: &[Carried<'_>]) {
        let mut last: Option<Carried<'_>> = None;
        for &(position, packages) in carried {
            let extends = last.is_some_and(|(p, previous)| {
                p + 1 == position && same_packages(previous, packages)
            });
            if extends && let Some(run) = self.runs.last_mut() {
                run.to = position + 1;
            } else {
                self.runs.push(Run {
                    from: position,
                    to: position + 1,
                    first: u32::try_from(self.packages.len()).unwrap_or(u32::MAX),
                    count: u32::try_from(packages.len()).unwrap_or(u32::MAX),
                });
                self.packages.extend(packages.iter().cloned());
            }
            last = Some((position, packages));
        }
        self.names
            .push(u32::try_from(self.runs.len()).unwrap_or(u32::MAX));
    }

    /// Versions indexed.
    pub fn versions(&self) -> usize {
        self.listed.len()
    }

    /// Distinct package names.
    pub fn names(&self) -> usize {
        self.names.len()
    }

    /// Runs of versions that carry the same packages of a name, over all names.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// What the version at `position` of the channel's order carries of `name`; `None` when
    /// there is no such position.
    pub fn presence(&self, name: &str, position: usize) -> Option<Presence<'_>> {
        if !*self.listed.get(position)? {
            return Some(Presence::NoPackageList);
        }
        let Some(runs) = self.runs_of(name) else {
            return Some(Presence::Absent);
        };
        let position = u32::try_from(position).ok()?;
        let after = runs.partition_point(|r| r.to <= position);
        Some(match runs.get(after) {
            Some(run) if run.from <= position => {
                let first = run.first as usize;
                Presence::Installed(&self.packages[first..first + run.count as usize])
            }
            _ => Presence::Absent,
        })
    }

    /// The runs of `name`, if any version carries it.
    fn runs_of(&self, name: &str) -> Option<&[Run]> {
        let start_of = |i: usize| i.checked_sub(1).map_or(0, |p| self.names[p] as usize);
        let name_of = |i: usize| {
            let run = &self.runs[start_of(i)];
            self.packages[run.first as usize].name.as_str()
        };
        let (mut low, mut high) = (0, self.names.len());
        while low < high {
            let mid = low + (high - low) / 2;
            match name_of(mid).cmp(name) {
                Ordering::Less => low = mid + 1,
                Ordering::Greater => high = mid,
                Ordering::Equal => {
                    return Some(&self.runs[start_of(mid)..self.names[mid] as usize]);
                }
            }
        }
        None
    }
}

/// Whether two versions carry the same packages of a name (compared by value).
fn same_packages(a: &[Arc<Package>], b: &[Arc<Package>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            // Exactly as written: `1.0` and `1.00` are equal in RPM order but shown apart.
            x.arch == y.arch
                && x.evr.epoch == y.evr.epoch
                && x.evr.version == y.evr.version
                && x.evr.release == y.evr.release
        })
}

#[cfg(test)]
mod tests;
