//! The parsed content of one channel image for one architecture.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use elemental_changelog_apiservice::types::Advisory;

use crate::channel::{self, ChannelEntry, EntryKind};
use crate::packages::{self, PackageList};
use crate::{updateinfo, updates};

/// Why a channel image is unusable as a whole.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// There is no `/channel.json`.
    #[error("the image has no /channel.json")]
    MissingChannelJson,
    /// `/channel.json` does not parse.
    #[error("invalid /channel.json")]
    ChannelJson(#[source] channel::Error),
}

/// Why one file of an image was not used (the rest still is).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// An `updates.log` that does not parse.
    #[error("invalid updates.log")]
    Updates(#[source] updates::Error),
    /// A package list that does not parse.
    #[error("invalid package list")]
    Packages(#[source] packages::Error),
    /// An `updateinfo.xml` that does not parse.
    #[error("invalid updateinfo")]
    UpdateInfo(#[source] updateinfo::Error),
    /// A file for a name `channel.json` does not list.
    #[error("channel.json has no entry named {name:?}")]
    UnknownVersion {
        /// The name in the file name.
        name: String,
    },
    /// A file for an entry that is not a `container` (only those have
    /// changelogs).
    #[error("channel.json entry {name:?} is of type {kind:?}, not container")]
    NotAContainer {
        /// The entry.
        name: String,
        /// Its type.
        kind: String,
    },
    /// A second `updateinfo.xml[.gz|.zst]`.
    #[error("ignored: {used} is used")]
    DuplicateUpdateInfo {
        /// The file used instead.
        used: String,
    },
}

/// A file of an image that was not used, and why.
#[derive(Debug)]
pub struct FileProblem {
    /// Path in the image, as given to [`ChannelData::from_files`].
    pub path: String,
    /// Why.
    pub error: FileError,
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.error)?;
        let mut source = std::error::Error::source(&self.error);
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// The data of one version (a `container` entry of `channel.json`).
#[derive(Clone, Debug, PartialEq)]
pub struct VersionData {
    /// Its `channel.json` entry.
    pub entry: ChannelEntry,
    /// Advisories of its precomputed `<name>.updates.log`, when the image has one.
    pub advisories: Option<Vec<Advisory>>,
    /// Its `<name>.packages`, when the image has one.
    pub packages: Option<PackageList>,
    /// Digest of the older image this data was kept from, when the current
    /// image no longer lists the version.
    pub retained_from: Option<String>,
}

impl VersionData {
    /// A version without changelog data.
    pub fn new(entry: ChannelEntry) -> Self {
        Self {
            entry,
            advisories: None,
            packages: None,
            retained_from: None,
        }
    }

    /// Whether the image carries a precomputed file or a package list for it.
    pub fn has_changelog_data(&self) -> bool {
        self.advisories.is_some() || self.packages.is_some()
    }
}

/// The parsed content of one channel image for one architecture: versions,
/// `updateinfo` and the files that were not used. Nothing more: the version
/// order and the queries are [`crate::compute::IndexedChannel`]'s.
#[derive(Debug, Default)]
pub struct ChannelData {
    versions: BTreeMap<String, Arc<VersionData>>,
    updateinfo: Option<Arc<Vec<Advisory>>>,
    /// The path of the `updateinfo.xml` file [`ChannelData::updateinfo`] was parsed from.
    updateinfo_path: Option<String>,
    problems: Vec<FileProblem>,
    /// See [`ChannelData::parsed_bytes`].
    parsed_bytes: u64,
}

impl Clone for ChannelData {
    /// Shares the version data (and, since [`FileProblem`] is not `Clone`,
    /// has no problems recorded).
    fn clone(&self) -> Self {
        Self {
            versions: self.versions.clone(),
            updateinfo: self.updateinfo.clone(),
            updateinfo_path: self.updateinfo_path.clone(),
            problems: Vec::new(),
            parsed_bytes: self.parsed_bytes,
        }
    }
}

/// Where a file of `/changelogs/` goes.
enum ChangelogFile<'a> {
    Updates(&'a str),
    Packages(&'a str),
    UpdateInfo,
}

fn classify(path: &str) -> Option<ChangelogFile<'_>> {
    let rest = path.strip_prefix("changelogs/")?;
    if rest.contains('/') {
        return None;
    }
    if updateinfo::FILE_NAMES.contains(&rest) {
        return Some(ChangelogFile::UpdateInfo);
    }
    if let Some(name) = rest.strip_suffix(".updates.log") {
        return Some(ChangelogFile::Updates(name));
    }
    rest.strip_suffix(".packages").map(ChangelogFile::Packages)
}

/// Whether `path` (as given to [`ChannelData::from_files`]) is an `updateinfo.xml` file that
/// [`ChannelData::from_files`] would parse.
pub fn is_updateinfo(path: &str) -> bool {
    matches!(classify(clean_path(path)), Some(ChangelogFile::UpdateInfo))
}

/// A path in an image without a leading `/` or `./`.
fn clean_path(path: &str) -> &str {
    path.trim_start_matches("./").trim_start_matches('/')
}

/// Whether `channel.json` has a `container` entry `name` (only those have
/// changelogs).
fn container_entry(entries: &[ChannelEntry], name: &str) -> Result<(), FileError> {
    match entries.iter().find(|e| e.name == name).map(|e| &e.kind) {
        None => Err(FileError::UnknownVersion {
            name: name.to_owned(),
        }),
        Some(EntryKind::Container) => Ok(()),
        Some(kind) => Err(FileError::NotAContainer {
            name: name.to_owned(),
            kind: kind.as_str().to_owned(),
        }),
    }
}

/// Limits of parsing an image's files, in memory they may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Limits of `updateinfo.xml`.
    pub updateinfo: updateinfo::Limits,
    /// Most memory the parsed package lists and `updates.log` advisories may take together,
    /// as estimated while they are built; a file past it is rejected.
    pub parse_bytes: u64,
}

impl Default for Limits {
    /// `updateinfo.xml`'s defaults; 256 MiB of parsed package lists and advisories.
    fn default() -> Self {
        updateinfo::Limits::default().into()
    }
}

impl From<updateinfo::Limits> for Limits {
    /// These `updateinfo.xml` limits, 256 MiB of parsed package lists and advisories.
    fn from(updateinfo: updateinfo::Limits) -> Self {
        Self {
            updateinfo,
            parse_bytes: 256 << 20,
        }
    }
}

/// The files of `changelogs/` parsed so far.
#[derive(Default)]
struct ChangelogFiles {
    advisories: BTreeMap<String, Vec<Advisory>>,
    packages: BTreeMap<String, PackageList>,
    /// The path of the `updateinfo.xml` used, and its advisories.
    updateinfo: Option<(String, Vec<Advisory>)>,
    problems: Vec<FileProblem>,
    /// One package per distinct line across all the lists.
    interner: packages::Interner,
    /// Memory the `updates.log` advisories take, as estimated.
    advisory_bytes: u64,
    /// [`Limits::parse_bytes`].
    parse_bytes: u64,
}

impl ChangelogFiles {
    /// Memory the parsed package lists and advisories take, as estimated.
    fn parsed_bytes(&self) -> u64 {
        self.interner.bytes() + self.advisory_bytes
    }

    /// Parses one file of `changelogs/` into its place, or records why it
    /// is not used. Files of other names are ignored.
    fn add(
        &mut self,
        entries: &[ChannelEntry],
        path: String,
        bytes: &[u8],
        limits: updateinfo::Limits,
    ) {
        let clean = clean_path(&path);
        let result = match classify(clean) {
            None => Ok(()),
            Some(ChangelogFile::Updates(name)) => container_entry(entries, name).and_then(|()| {
                let left = self.parse_bytes.saturating_sub(self.parsed_bytes());
                let (advisories, used) =
                    updates::parse_within(bytes, left).map_err(FileError::Updates)?;
                self.advisory_bytes += used;
                self.advisories.insert(name.to_owned(), advisories);
                Ok(())
            }),
            Some(ChangelogFile::Packages(name)) => container_entry(entries, name).and_then(|()| {
                let max = self.parse_bytes.saturating_sub(self.advisory_bytes);
                self.interner.set_max_bytes(max);
                let list =
                    packages::parse_with(bytes, &mut self.interner).map_err(FileError::Packages)?;
                self.packages.insert(name.to_owned(), list);
                Ok(())
            }),
            Some(ChangelogFile::UpdateInfo) => match &self.updateinfo {
                Some((used, _)) => Err(FileError::DuplicateUpdateInfo { used: used.clone() }),
                None => updateinfo::decoder_for(clean, bytes)
                    .and_then(|r| updateinfo::parse(r, limits))
                    .map(|a| self.updateinfo = Some((path.clone(), a)))
                    .map_err(FileError::UpdateInfo),
            },
        };
        if let Err(error) = result {
            self.problems.push(FileProblem { path, error });
        }
    }
}

impl ChannelData {
    /// Builds the data of an image from its files: `channel.json` and
    /// `changelogs/*` (a leading `/` or `./` is ignored; other files are
    /// ignored). `channel.json` missing or invalid is an error; any other
    /// file that cannot be used is recorded in [`ChannelData::problems`] and
    /// the rest is served.
    pub fn from_files(
        files: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<ChannelData, DataError> {
        Self::from_files_with_limits(files, updateinfo::Limits::default())
    }

    /// [`ChannelData::from_files`] with limits for `updateinfo.xml` and the package lists.
    pub fn from_files_with_limits(
        files: impl IntoIterator<Item = (String, Vec<u8>)>,
        limits: impl Into<Limits>,
    ) -> Result<ChannelData, DataError> {
        let limits = limits.into();
        let mut channel_json = None;
        let mut changelogs = Vec::new();
        for (path, bytes) in files {
            let clean = clean_path(&path);
            if clean == "channel.json" {
                channel_json = Some(bytes);
            } else if clean.starts_with("changelogs/") {
                changelogs.push((path, bytes));
            }
        }
        let channel_json = channel_json.ok_or(DataError::MissingChannelJson)?;
        let entries = channel::parse(&channel_json).map_err(DataError::ChannelJson)?;
        let mut parsed = ChangelogFiles {
            parse_bytes: limits.parse_bytes,
            ..ChangelogFiles::default()
        };
        for (path, bytes) in changelogs {
            parsed.add(&entries, path, &bytes, limits.updateinfo);
        }
        // The entries: their text, as read, and their structures.
        let entry_bytes = (channel_json.len()
            + entries.len()
                * (std::mem::size_of::<ChannelEntry>() + std::mem::size_of::<VersionData>()))
            as u64;
        let updateinfo_bytes = parsed.updateinfo.as_ref().map_or(0, |(_, advisories)| {
            advisories
                .iter()
                .map(|a| std::mem::size_of::<Advisory>() as u64 + updates::heap_bytes(a))
                .sum()
        });
        let parsed_bytes = entry_bytes
            .saturating_add(parsed.parsed_bytes())
            .saturating_add(updateinfo_bytes);
        let (updateinfo_path, updateinfo) = parsed.updateinfo.unzip();
        let mut data = Self::from_parts(entries, parsed.advisories, parsed.packages, updateinfo);
        data.updateinfo_path = updateinfo_path;
        data.problems = parsed.problems;
        data.parsed_bytes = parsed_bytes;
        Ok(data)
    }

    /// Builds the data from parsed parts: the `channel.json` entries (only
    /// `container` entries become versions), precomputed advisories and
    /// package lists by version name (names that are not container entries
    /// are ignored), and the `updateinfo` advisories.
    pub fn from_parts(
        entries: Vec<ChannelEntry>,
        mut advisories: BTreeMap<String, Vec<Advisory>>,
        mut packages: BTreeMap<String, PackageList>,
        updateinfo: Option<Vec<Advisory>>,
    ) -> ChannelData {
        let versions = entries
            .into_iter()
            .filter(|e| e.kind == EntryKind::Container)
            .map(|entry| {
                let name = entry.name.clone();
                let data = VersionData {
                    advisories: advisories.remove(&name),
                    packages: packages.remove(&name),
                    entry,
                    retained_from: None,
                };
                (name, Arc::new(data))
            })
            .collect();
        Self {
            versions,
            updateinfo: updateinfo.map(Arc::new),
            updateinfo_path: None,
            problems: Vec::new(),
            parsed_bytes: 0,
        }
    }

    /// Memory the parsed data of the image takes, as estimated while it was parsed by
    /// [`ChannelData::from_files`]: the `channel.json` entries, package lists, `updates.log`
    /// advisories (as metered against [`Limits::parse_bytes`]) and `updateinfo.xml`
    /// advisories. 0 for data built [`from_parts`](ChannelData::from_parts); a clone (which
    /// shares the parsed versions) says the same as the original.
    pub fn parsed_bytes(&self) -> u64 {
        self.parsed_bytes
    }

    /// The versions (container entries, and retained ones) by name.
    pub fn versions(&self) -> &BTreeMap<String, Arc<VersionData>> {
        &self.versions
    }

    /// One version by name.
    pub fn version(&self, name: &str) -> Option<&Arc<VersionData>> {
        self.versions.get(name)
    }

    /// The advisories of the image's `updateinfo.xml`, when it has one.
    pub fn updateinfo(&self) -> Option<&Arc<Vec<Advisory>>> {
        self.updateinfo.as_ref()
    }

    /// The path of the `updateinfo.xml` file (as given to [`ChannelData::from_files`]) whose
    /// advisories [`ChannelData::updateinfo`] holds; `None` for data built
    /// [`from_parts`](ChannelData::from_parts).
    pub fn updateinfo_path(&self) -> Option<&str> {
        self.updateinfo_path.as_deref()
    }

    /// Lets `share` replace the `updateinfo.xml` advisories with an equal copy held elsewhere
    /// (the parse of a byte-identical file of another image), so that they are kept once. Does
    /// nothing without an `updateinfo.xml`.
    ///
    /// # Panics
    ///
    /// In debug builds, when `share` returns advisories that are not equal to these.
    pub fn share_updateinfo(
        &mut self,
        share: impl FnOnce(&Arc<Vec<Advisory>>) -> Arc<Vec<Advisory>>,
    ) {
        if let Some(own) = &mut self.updateinfo {
            let shared = share(own);
            debug_assert!(
                Arc::ptr_eq(&shared, own) || shared == *own,
                "shared updateinfo advisories differ from the parsed ones"
            );
            *own = shared;
        }
    }

    /// Files that were not used, and why.
    pub fn problems(&self) -> &[FileProblem] {
        &self.problems
    }

    /// Carries over versions of `previous` (the data of an older image of the
    /// same channel) that this data lacks, when they had changelog data and
    /// `keep(name)` says so (their ManagedOSVersion still exists). They are
    /// marked as retained from `previous_digest`, unless they already were
    /// retained from an even older image.
    pub fn retain_from(
        &mut self,
        previous: &ChannelData,
        previous_digest: &str,
        keep: impl Fn(&str) -> bool,
    ) {
        for (name, old) in &previous.versions {
            if self.versions.contains_key(name) || !old.has_changelog_data() || !keep(name) {
                continue;
            }
            let data = if old.retained_from.is_some() {
                Arc::clone(old)
            } else {
                let mut data = VersionData::clone(old);
                data.retained_from = Some(previous_digest.to_owned());
                Arc::new(data)
            };
            self.versions.insert(name.clone(), data);
        }
    }

    /// Drops retained versions for which `keep(name)` says no (their
    /// ManagedOSVersion is gone). Returns whether anything was dropped.
    pub fn drop_retained(&mut self, keep: impl Fn(&str) -> bool) -> bool {
        let before = self.versions.len();
        self.versions
            .retain(|name, v| v.retained_from.is_none() || keep(name));
        self.versions.len() != before
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SL_MICRO_61: &[u8] = include_bytes!("../tests/fixtures/channel-sl-micro-6.1-base.json");
    const EXAMPLE_LOG: &[u8] = include_bytes!("../tests/fixtures/example.updates.log.json");
    const SAMPLE_XML: &[u8] = include_bytes!("../tests/fixtures/updateinfo-sample.xml");
    const HEAD40: &[u8] = include_bytes!("../tests/fixtures/base-v2.2.0-4.57-os.packages.head40");

    fn file(path: &str, bytes: &[u8]) -> (String, Vec<u8>) {
        (path.to_owned(), bytes.to_vec())
    }

    #[test]
    fn channel_json_is_required_and_must_parse() {
        let err = ChannelData::from_files([file("changelogs/x.updates.log", b"[]")]).unwrap_err();
        assert!(matches!(err, DataError::MissingChannelJson));
        let err = ChannelData::from_files([file("channel.json", b"{}")]).unwrap_err();
        assert!(matches!(
            err,
            DataError::ChannelJson(channel::Error::NotArray { .. })
        ));
    }

    #[test]
    fn only_containers_are_versions_and_bad_files_are_problems() {
        let data = ChannelData::from_files([
            file("/channel.json", SL_MICRO_61),
            file("changelogs/base-v2.2.0-3.12-os.updates.log", EXAMPLE_LOG),
            file("./changelogs/base-v2.2.0-3.9-os.updates.log", b"{not json"),
            file("changelogs/base-v2.2.0-3.8-os.packages", HEAD40),
            file("changelogs/base-v2.2.0-3.7-iso.updates.log", b"[]"),
            file("changelogs/nobody.packages", HEAD40),
            file("changelogs/updateinfo.xml", SAMPLE_XML),
            file("changelogs/updateinfo.xml.gz", b"junk"),
            file("changelogs/README.md", b"hello"),
            file("etc/os-release", b"x"),
        ])
        .unwrap();
        assert_eq!(data.versions().len(), 3);
        let v = data.version("base-v2.2.0-3.12-os").unwrap();
        assert_eq!(v.advisories.as_ref().unwrap().len(), 2);
        assert!(v.packages.is_none());
        assert!(
            data.version("base-v2.2.0-3.9-os")
                .unwrap()
                .advisories
                .is_none()
        );
        assert_eq!(
            data.version("base-v2.2.0-3.8-os")
                .unwrap()
                .packages
                .as_ref()
                .unwrap()
                .len(),
            40
        );
        assert_eq!(data.updateinfo().unwrap().len(), 2);
        let problems: Vec<String> = data.problems().iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].starts_with(
            "./changelogs/base-v2.2.0-3.9-os.updates.log: invalid updates.log: not a JSON array"
        ));
        assert_eq!(
            problems[1],
            r#"changelogs/base-v2.2.0-3.7-iso.updates.log: channel.json entry "base-v2.2.0-3.7-iso" is of type "iso", not container"#
        );
        assert_eq!(
            problems[2],
            r#"changelogs/nobody.packages: channel.json has no entry named "nobody""#
        );
        assert_eq!(
            problems[3],
            "changelogs/updateinfo.xml.gz: ignored: changelogs/updateinfo.xml is used"
        );
    }

    #[test]
    fn parsed_bytes_count_every_kind_of_parsed_file() {
        let only = ChannelData::from_files([file("channel.json", SL_MICRO_61)]).unwrap();
        assert!(only.parsed_bytes() >= SL_MICRO_61.len() as u64);
        let mut previous = only.parsed_bytes();
        for extra in [
            file("changelogs/base-v2.2.0-3.12-os.updates.log", EXAMPLE_LOG),
            file("changelogs/base-v2.2.0-3.8-os.packages", HEAD40),
            file("changelogs/updateinfo.xml", SAMPLE_XML),
        ] {
            let name = extra.0.clone();
            let mut files = vec![file("channel.json", SL_MICRO_61)];
            files.push(extra);
            let data = ChannelData::from_files(files).unwrap();
            assert!(data.parsed_bytes() > previous, "{name}");
            assert_eq!(data.clone().parsed_bytes(), data.parsed_bytes());
        }
        previous = ChannelData::from_files([
            file("channel.json", SL_MICRO_61),
            file("changelogs/base-v2.2.0-3.12-os.updates.log", EXAMPLE_LOG),
            file("changelogs/base-v2.2.0-3.8-os.packages", HEAD40),
        ])
        .unwrap()
        .parsed_bytes();
        let all = ChannelData::from_files([
            file("channel.json", SL_MICRO_61),
            file("changelogs/base-v2.2.0-3.12-os.updates.log", EXAMPLE_LOG),
            file("changelogs/base-v2.2.0-3.8-os.packages", HEAD40),
            file("changelogs/updateinfo.xml", SAMPLE_XML),
        ])
        .unwrap();
        assert!(all.parsed_bytes() > previous);
        assert_eq!(
            ChannelData::from_parts(Vec::new(), BTreeMap::new(), BTreeMap::new(), None)
                .parsed_bytes(),
            0
        );
    }

    #[test]
    fn retains_dropped_versions_that_still_exist() {
        let old = ChannelData::from_files([
            file("channel.json", SL_MICRO_61),
            file("changelogs/base-v2.2.0-3.8-os.updates.log", EXAMPLE_LOG),
            file("changelogs/base-v2.2.0-3.9-os.updates.log", EXAMPLE_LOG),
        ])
        .unwrap();
        let newer_json = br#"[{"metadata":{"name":"base-v2.2.0-3.12-os"},"spec":{"version":"v2.2.0-3.12","type":"container"}}]"#;
        let mut new = ChannelData::from_files([file("channel.json", newer_json)]).unwrap();
        new.retain_from(&old, "sha256:old", |name| name != "base-v2.2.0-3.9-os");
        let names: Vec<&String> = new.versions().keys().collect();
        assert_eq!(names, ["base-v2.2.0-3.12-os", "base-v2.2.0-3.8-os"]);
        let kept = new.version("base-v2.2.0-3.8-os").unwrap();
        assert_eq!(kept.retained_from.as_deref(), Some("sha256:old"));
        assert!(
            new.version("base-v2.2.0-3.12-os")
                .unwrap()
                .retained_from
                .is_none()
        );

        // Retained again from a newer image: the original digest stays.
        let mut newest = ChannelData::from_files([file("channel.json", newer_json)]).unwrap();
        newest.retain_from(&new, "sha256:new", |_| true);
        assert_eq!(
            newest
                .version("base-v2.2.0-3.8-os")
                .unwrap()
                .retained_from
                .as_deref(),
            Some("sha256:old")
        );
    }
}
