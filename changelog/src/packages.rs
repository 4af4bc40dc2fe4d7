//! `/changelogs/<name>.packages`: the packages installed in one OS version,
//! one per line as `rpm -qa --qf '%{NAME}|%{EPOCH}|%{VERSION}|%{RELEASE}|%{ARCH}|%{DISTURL}|%{LICENSE}\n'`
//! prints them (`EPOCH` is `(none)` when unset). `DISTURL` and `LICENSE` may
//! be left out; blank lines are ignored.
//!
//! The lists of one channel share their packages: most packages of a
//! version are those of the version before, so [`parse_with`] keeps one
//! [`Package`] per distinct line across all the lists it reads through one
//! [`Interner`], and a list holds only pointers to them.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use crate::rpmver::{Evr, ParseEvrError};

/// Why a package list does not parse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A line is not UTF-8.
    #[error("line {line}: not UTF-8")]
    NotUtf8 {
        /// Line number (from 1).
        line: usize,
        /// Where the bad bytes are.
        #[source]
        source: std::str::Utf8Error,
    },
    /// A line has fewer than the five required fields.
    #[error(
        "line {line}: expected NAME|EPOCH|VERSION|RELEASE|ARCH[|DISTURL|LICENSE], found {fields} field(s)"
    )]
    Fields {
        /// Line number (from 1).
        line: usize,
        /// Fields found.
        fields: usize,
    },
    /// A required field is empty.
    #[error("line {line}: empty {field}")]
    EmptyField {
        /// Line number (from 1).
        line: usize,
        /// Which field (`NAME`, `VERSION`, `RELEASE`, `ARCH`).
        field: &'static str,
    },
    /// The lists' packages would take more memory than allowed (see
    /// [`Interner::with_max_bytes`]): many distinct short lines cost many times their size.
    #[error("line {line}: the package lists take more than {max_bytes} bytes of memory parsed")]
    TooLarge {
        /// Line number (from 1).
        line: usize,
        /// The allowance.
        max_bytes: u64,
    },
    /// The epoch is not `(none)` or a number.
    #[error("line {line}: invalid EPOCH")]
    Epoch {
        /// Line number (from 1).
        line: usize,
        /// Why.
        #[source]
        source: ParseEvrError,
    },
}

/// One installed package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    /// Name.
    pub name: String,
    /// Architecture (`x86_64`, `noarch`, ...).
    pub arch: String,
    /// Epoch, version and release.
    pub evr: Evr,
    /// `DISTURL`, empty when not given.
    pub disturl: String,
    /// `LICENSE`, empty when not given.
    pub license: String,
}

/// The packages of one OS version, sorted by name, then architecture, then
/// EVR. Packages are shared with the other lists parsed with the same
/// [`Interner`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackageList {
    packages: Vec<Arc<Package>>,
}

/// Parsed packages by the line they were parsed from, shared by the
/// package lists of one channel (see [`parse_with`]), with an estimate of the memory they
/// and the lists take, kept under a maximum.
#[derive(Debug)]
pub struct Interner {
    packages: HashMap<Box<str>, Arc<Package>>,
    bytes: u64,
    max_bytes: u64,
}

impl Default for Interner {
    /// No maximum.
    fn default() -> Self {
        Self::with_max_bytes(u64::MAX)
    }
}

/// What a distinct package costs besides the text of its line, twice (the map key and the
/// fields): the structure, its reference counts, the map slot and an allocation header for
/// each of its six allocations.
const PACKAGE_OVERHEAD: u64 = std::mem::size_of::<Package>() as u64 + 16 + 48 + 6 * 16;

impl Interner {
    /// An interner whose packages and lists may take at most `max_bytes` (estimated as
    /// they are parsed); past it, [`parse_with`] fails with [`Error::TooLarge`].
    pub fn with_max_bytes(max_bytes: u64) -> Self {
        Self {
            packages: HashMap::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Changes the maximum (for lists parsed from now on).
    pub fn set_max_bytes(&mut self, max_bytes: u64) {
        self.max_bytes = max_bytes;
    }

    /// Memory the packages and the lists take, as estimated.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn charge(&mut self, bytes: u64, line: usize) -> Result<(), Error> {
        let total = self.bytes.saturating_add(bytes);
        if total > self.max_bytes {
            return Err(Error::TooLarge {
                line,
                max_bytes: self.max_bytes,
            });
        }
        self.bytes = total;
        Ok(())
    }

    /// Distinct packages seen.
    pub fn len(&self) -> usize {
        self.packages.len()
    }

    /// Whether no package was seen.
    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }
}

impl PackageList {
    /// A list from packages in any order.
    pub fn new(packages: Vec<Package>) -> Self {
        Self::from_shared(packages.into_iter().map(Arc::new).collect())
    }

    fn from_shared(mut packages: Vec<Arc<Package>>) -> Self {
        packages.sort_by(|a, b| Self::key_cmp(a, b).then_with(|| a.evr.cmp(&b.evr)));
        Self { packages }
    }

    fn key_cmp(a: &Package, b: &Package) -> Ordering {
        a.name.cmp(&b.name).then_with(|| a.arch.cmp(&b.arch))
    }

    /// All packages, sorted.
    pub fn packages(&self) -> &[Arc<Package>] {
        &self.packages
    }

    /// Number of packages.
    pub fn len(&self) -> usize {
        self.packages.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }

    /// One package per name and architecture: the highest EVR when a
    /// package is installed in several versions (multi-version kernels).
    pub fn latest(&self) -> impl Iterator<Item = &Package> {
        let p = &self.packages;
        p.iter()
            .enumerate()
            .filter(move |(i, a)| {
                p.get(i + 1)
                    .is_none_or(|b| Self::key_cmp(a, b) != Ordering::Equal)
            })
            .map(|(_, a)| a.as_ref())
    }

    /// The highest EVR installed of `name` on `arch`.
    pub fn get(&self, name: &str, arch: &str) -> Option<&Package> {
        let end = self
            .packages
            .partition_point(|p| (p.name.as_str(), p.arch.as_str()) <= (name, arch));
        self.packages[..end]
            .last()
            .map(Arc::as_ref)
            .filter(|p| p.name == name && p.arch == arch)
    }

    /// Every architecture of `name` installed (highest EVR of each).
    pub fn by_name<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Package> + 'a {
        let start = self.packages.partition_point(|p| p.name.as_str() < name);
        let end = start + self.packages[start..].partition_point(|p| p.name == name);
        let slice = &self.packages[start..end];
        slice
            .iter()
            .enumerate()
            .filter(move |(i, a)| slice.get(i + 1).is_none_or(|b| b.arch != a.arch))
            .map(|(_, a)| a.as_ref())
    }

    /// Writes the list in the `rpm -qa` format [`parse`] reads.
    pub fn write(&self) -> Vec<u8> {
        let mut out = String::new();
        for p in &self.packages {
            let epoch = if p.evr.epoch == 0 {
                "(none)".to_owned()
            } else {
                p.evr.epoch.to_string()
            };
            out.push_str(&format!(
                "{}|{}|{}|{}|{}|{}|{}\n",
                p.name, epoch, p.evr.version, p.evr.release, p.arch, p.disturl, p.license
            ));
        }
        out.into_bytes()
    }
}

/// Parses a package list.
pub fn parse(bytes: &[u8]) -> Result<PackageList, Error> {
    parse_with(bytes, &mut Interner::default())
}

/// Parses a package list, sharing packages with the lists parsed before
/// through `interner` (a line seen before is not parsed again).
pub fn parse_with(bytes: &[u8], interner: &mut Interner) -> Result<PackageList, Error> {
    let mut packages = Vec::new();
    for (index, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        let text = std::str::from_utf8(raw).map_err(|source| Error::NotUtf8 { line, source })?;
        let text = text.trim_end_matches('\r');
        if text.trim().is_empty() {
            continue;
        }
        // A list holds one pointer per line.
        interner.charge(std::mem::size_of::<Arc<Package>>() as u64, line)?;
        if let Some(known) = interner.packages.get(text) {
            packages.push(Arc::clone(known));
            continue;
        }
        interner.charge(2 * text.len() as u64 + PACKAGE_OVERHEAD, line)?;
        let fields: Vec<&str> = text.splitn(7, '|').collect();
        let [name, epoch, version, release, arch, rest @ ..] = fields.as_slice() else {
            return Err(Error::Fields {
                line,
                fields: fields.len(),
            });
        };
        for (value, field) in [
            (name, "NAME"),
            (version, "VERSION"),
            (release, "RELEASE"),
            (arch, "ARCH"),
        ] {
            if value.trim().is_empty() {
                return Err(Error::EmptyField { line, field });
            }
        }
        let epoch = Evr::parse_epoch(epoch).map_err(|source| Error::Epoch { line, source })?;
        let package = Arc::new(Package {
            name: name.trim().to_owned(),
            arch: arch.trim().to_owned(),
            evr: Evr::new(epoch, version.trim(), release.trim()),
            disturl: rest.first().map_or("", |s| s.trim()).to_owned(),
            license: rest.get(1).map_or("", |s| s.trim()).to_owned(),
        });
        interner.packages.insert(text.into(), Arc::clone(&package));
        packages.push(package);
    }
    Ok(PackageList::from_shared(packages))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn many_distinct_short_lines_stop_at_the_memory_allowance() {
        let lines: String = (0..10_000).map(|i| format!("p{i}|0|1|1|x\n")).collect();
        let mut interner = Interner::with_max_bytes(1 << 20);
        let error = parse_with(lines.as_bytes(), &mut interner).unwrap_err();
        assert!(matches!(error, Error::TooLarge { max_bytes, .. } if max_bytes == 1 << 20));
        assert!(interner.bytes() <= 1 << 20);
        // Well under the allowance: the same lines parse, each package costing far more
        // than its line (which is why they are counted).
        let mut roomy = Interner::with_max_bytes(64 << 20);
        let list = parse_with(lines.as_bytes(), &mut roomy).unwrap();
        assert_eq!(list.len(), 10_000);
        assert!(roomy.bytes() > 10 * lines.len() as u64, "{}", roomy.bytes());
        // Lines seen before cost a pointer each.
        let before = roomy.bytes();
        parse_with(lines.as_bytes(), &mut roomy).unwrap();
        assert_eq!(roomy.bytes() - before, 10_000 * 8);
    }

    const HEAD40: &[u8] = include_bytes!("../tests/fixtures/base-v2.2.0-4.57-os.packages.head40");

    #[test]
    fn parses_the_upstream_list() {
        let list = parse(HEAD40).unwrap();
        assert_eq!(list.len(), 40);
        let bash = list.get("bash", "x86_64").unwrap();
        assert_eq!(bash.evr, Evr::new(0, "5.2.15", "slfo.1.1_1.6"));
        assert_eq!(bash.evr.to_string(), "5.2.15-slfo.1.1_1.6");
        assert_eq!(bash.license, "GPL-3.0-or-later");
        assert!(bash.disturl.starts_with("obs://build.suse.de/"));
        assert!(list.get("bash", "noarch").is_none());
        assert_eq!(list.get("bash-sh", "noarch").unwrap().arch, "noarch");
        let dbus = list.get("dbus-1-common", "noarch").unwrap();
        assert_eq!(dbus.license, "AFL-2.1 OR GPL-2.0-or-later");
        assert_eq!(list.by_name("elemental").count(), 1);
        assert_eq!(list.by_name("nope").count(), 0);
    }

    #[test]
    fn blank_lines_epochs_and_multiversion() {
        let text = b"\nkernel|(none)|6.4|1|x86_64\r\n\nkernel||6.4|2|x86_64||\nfoo|2|1.0|1|noarch|u|MIT|extra\n  \n";
        let list = parse(text).unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list.latest().count(), 2);
        assert_eq!(list.get("kernel", "x86_64").unwrap().evr.release, "2");
        let foo = list.get("foo", "noarch").unwrap();
        assert_eq!(foo.evr.epoch, 2);
        assert_eq!(foo.license, "MIT|extra");
        assert_eq!(parse(&list.write()).unwrap(), list);
    }

    #[test]
    fn rejects_malformed_lines_with_their_number() {
        let err = parse(b"a|(none)|1|1|x86_64\nbroken line\n").unwrap_err();
        assert!(matches!(err, Error::Fields { line: 2, fields: 1 }));
        assert!(err.to_string().starts_with("line 2: "));
        assert!(matches!(
            parse(b"a|(none)|1||x86_64").unwrap_err(),
            Error::EmptyField {
                line: 1,
                field: "RELEASE"
            }
        ));
        assert!(matches!(
            parse(b"a|x|1|1|x86_64").unwrap_err(),
            Error::Epoch { line: 1, .. }
        ));
        assert!(matches!(
            parse(b"\n\xff|1").unwrap_err(),
            Error::NotUtf8 { line: 2, .. }
        ));
    }

    #[test]
    fn lists_share_the_packages_of_equal_lines() {
        let mut interner = Interner::default();
        let a = parse_with(
            b"bash|(none)|5.2|1|x86_64\nvim|(none)|9|1|x86_64\n",
            &mut interner,
        )
        .unwrap();
        let b = parse_with(
            b"vim|(none)|9|2|x86_64\nbash|(none)|5.2|1|x86_64\n",
            &mut interner,
        )
        .unwrap();
        assert_eq!(interner.len(), 3);
        assert!(Arc::ptr_eq(&a.packages()[0], &b.packages()[0]));
        assert!(!Arc::ptr_eq(&a.packages()[1], &b.packages()[1]));
        assert_eq!(b.get("vim", "x86_64").unwrap().evr.release, "2");
        // The same lines without an interner give the same lists.
        assert_eq!(
            parse(b"vim|(none)|9|2|x86_64\nbash|(none)|5.2|1|x86_64\n").unwrap(),
            b
        );
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn never_panics_on_pipes(s in "[a-z0-9|()\n .]{0,200}") {
            let _ = parse(s.as_bytes());
        }

        #[test]
        fn round_trips(pkgs in proptest::collection::vec(("[a-zA-Z0-9_+-]{1,10}", 0u64..3, "[0-9a-z.+~^_]{1,8}", "[0-9a-z.+_]{1,8}", "(x86_64|noarch|aarch64)", "[a-z:/.]{0,10}", "[A-Za-z0-9. -]{0,10}"), 0..20)) {
            let list = PackageList::new(pkgs.into_iter().map(|(name, epoch, v, r, arch, disturl, license)| Package {
                name, arch, evr: Evr::new(epoch, v, r), disturl, license: license.trim().to_owned(),
            }).collect());
            let back = parse(&list.write()).unwrap();
            prop_assert_eq!(back.len(), list.len());
            for (a, b) in back.packages().iter().zip(list.packages()) {
                prop_assert_eq!(&a.name, &b.name);
                prop_assert_eq!(&a.arch, &b.arch);
                prop_assert_eq!(&a.evr.version, &b.evr.version);
                prop_assert_eq!(&a.evr.release, &b.evr.release);
                prop_assert_eq!(a.evr.epoch, b.evr.epoch);
                prop_assert_eq!(&a.license, &b.license);
            }
        }
    }
}
