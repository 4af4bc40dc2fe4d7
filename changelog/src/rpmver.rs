//! RPM version ordering: `rpmvercmp` and `[epoch:]version-release` values.
//!
//! [`rpmvercmp`] follows `lib/rpmvercmp.c` of rpm: strings are split into
//! runs of ASCII digits and runs of ASCII letters, everything else separates;
//! numeric runs compare as numbers (leading zeros ignored) and are newer than
//! alphabetic runs; `~` sorts before anything (even the end of the string),
//! `^` sorts after the end of the string but before any other addition.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Why a string is not an EVR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseEvrError {
    /// The string is empty.
    #[error("empty version")]
    Empty,
    /// The part before `:` is not a number.
    #[error("epoch {epoch:?} is not a non-negative integer")]
    Epoch {
        /// The epoch as written.
        epoch: String,
        /// Why it does not parse.
        #[source]
        source: std::num::ParseIntError,
    },
    /// Nothing between `:` and `-`.
    #[error("empty version part")]
    EmptyVersion,
}

/// Compares two version (or release) strings as rpm's `rpmvercmp` does.
pub fn rpmvercmp(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let one = a.as_bytes();
    let two = b.as_bytes();
    let (mut i, mut j) = (0usize, 0usize);
    let is_sep = |c: u8| !c.is_ascii_alphanumeric() && c != b'~' && c != b'^';

    while i < one.len() || j < two.len() {
        while i < one.len() && is_sep(one[i]) {
            i += 1;
        }
        while j < two.len() && is_sep(two[j]) {
            j += 1;
        }
        let c1 = one.get(i).copied();
        let c2 = two.get(j).copied();

        match marker(c1, c2) {
            Marker::Decides(order) => return order,
            Marker::Both => {
                i += 1;
                j += 1;
                continue;
            }
            Marker::Neither => {}
        }
        let (Some(first), Some(_)) = (c1, c2) else {
            break;
        };

        let numeric = first.is_ascii_digit();
        let end1 = run_end(one, i, numeric);
        let end2 = run_end(two, j, numeric);
        // Segments of different types: numeric is newer than alphabetic.
        if end2 == j {
            return if numeric {
                Ordering::Greater
            } else {
                Ordering::Less
            };
        }
        match segment_cmp(&one[i..end1], &two[j..end2], numeric) {
            Ordering::Equal => {}
            other => return other,
        }
        i = end1;
        j = end2;
    }
    match (i >= one.len(), j >= two.len()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        _ => Ordering::Greater,
    }
}

/// What a `~` or `^` at the current positions of [`rpmvercmp`] means.
enum Marker {
    /// The order of the strings.
    Decides(Ordering),
    /// Both have the same marker: skip it in both.
    Both,
    /// No marker at either position.
    Neither,
}

/// The [`Marker`] at characters `c1` and `c2` (`None`: the end of the string).
fn marker(c1: Option<u8>, c2: Option<u8>) -> Marker {
    // `~` sorts before everything else, the end of the string included.
    if c1 == Some(b'~') || c2 == Some(b'~') {
        if c1 != Some(b'~') {
            return Marker::Decides(Ordering::Greater);
        }
        if c2 != Some(b'~') {
            return Marker::Decides(Ordering::Less);
        }
        return Marker::Both;
    }
    // `^` sorts after the end of the string, before anything else.
    if c1 == Some(b'^') || c2 == Some(b'^') {
        if c1.is_none() {
            return Marker::Decides(Ordering::Less);
        }
        if c2.is_none() {
            return Marker::Decides(Ordering::Greater);
        }
        if c1 != Some(b'^') {
            return Marker::Decides(Ordering::Greater);
        }
        if c2 != Some(b'^') {
            return Marker::Decides(Ordering::Less);
        }
        return Marker::Both;
    }
    Marker::Neither
}

/// The end of the run of digits (`numeric`) or letters that starts at `start` of `s`.
fn run_end(s: &[u8], start: usize, numeric: bool) -> usize {
    let mut end = start;
    while end < s.len()
        && (if numeric {
            s[end].is_ascii_digit()
        } else {
            s[end].is_ascii_alphabetic()
        })
    {
        end += 1;
    }
    end
}

/// Compares two runs of the same type: numbers as numbers (leading zeros ignored), letters
/// byte by byte.
fn segment_cmp(mut seg1: &[u8], mut seg2: &[u8], numeric: bool) -> Ordering {
    if numeric {
        while let [b'0', rest @ ..] = seg1 {
            seg1 = rest;
        }
        while let [b'0', rest @ ..] = seg2 {
            seg2 = rest;
        }
        match seg1.len().cmp(&seg2.len()) {
            Ordering::Equal => {}
            longer => return longer,
        }
    }
    seg1.cmp(seg2)
}

/// An RPM `[epoch:]version-release`.
///
/// Ordered by epoch, then [`rpmvercmp`] of the version, then of the release.
/// Equality is that order's equality (`1.0` equals `1.00`), so two values
/// that print differently may be equal.
#[derive(Clone, Debug, Default)]
pub struct Evr {
    /// Epoch; 0 when absent.
    pub epoch: u64,
    /// Version.
    pub version: String,
    /// Release; may be empty.
    pub release: String,
}

impl Evr {
    /// An EVR from its parts.
    pub fn new(epoch: u64, version: impl Into<String>, release: impl Into<String>) -> Self {
        Self {
            epoch,
            version: version.into(),
            release: release.into(),
        }
    }

    /// Parses an epoch as rpm tools print it: empty, `(none)` or a number.
    pub fn parse_epoch(epoch: &str) -> Result<u64, ParseEvrError> {
        let epoch = epoch.trim();
        if epoch.is_empty() || epoch == "(none)" {
            return Ok(0);
        }
        epoch.parse().map_err(|source| ParseEvrError::Epoch {
            epoch: epoch.to_owned(),
            source,
        })
    }
}

impl Evr {
    /// Compares this installed EVR with `bound` as rpm compares a package with a dependency
    /// range (`rpmdsCompare`): epochs (0 when absent), then versions, then releases only when
    /// both have one, so a bound without a release (`5.6.2`) equals every release of that
    /// version (`5.6.2-1.1`, `5.6.2-2`).
    pub fn cmp_bound(&self, bound: &Evr) -> Ordering {
        let by_release = || {
            if self.release.is_empty() || bound.release.is_empty() {
                Ordering::Equal
            } else {
                rpmvercmp(&self.release, &bound.release)
            }
        };
        self.epoch
            .cmp(&bound.epoch)
            .then_with(|| rpmvercmp(&self.version, &bound.version))
            .then_with(by_release)
    }
}

impl Ord for Evr {
    fn cmp(&self, other: &Self) -> Ordering {
        self.epoch
            .cmp(&other.epoch)
            .then_with(|| rpmvercmp(&self.version, &other.version))
            .then_with(|| rpmvercmp(&self.release, &other.release))
    }
}

impl PartialOrd for Evr {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Evr {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Evr {}

impl fmt::Display for Evr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.epoch != 0 {
            write!(f, "{}:", self.epoch)?;
        }
        f.write_str(&self.version)?;
        if !self.release.is_empty() {
            write!(f, "-{}", self.release)?;
        }
        Ok(())
    }
}

impl FromStr for Evr {
    type Err = ParseEvrError;

    /// Parses `[epoch:]version[-release]`; the release is what follows the
    /// last `-`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ParseEvrError::Empty);
        }
        let (epoch, rest) = match s.split_once(':') {
            Some((epoch, rest)) => (Self::parse_epoch(epoch)?, rest),
            None => (0, s),
        };
        let (version, release) = rest.rsplit_once('-').unwrap_or((rest, ""));
        if version.is_empty() {
            return Err(ParseEvrError::EmptyVersion);
        }
        Ok(Self::new(epoch, version, release))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The vectors of rpm's `tests/rpmvercmp.at` (the documented "oddities"
    /// left out, as rpm itself leaves them out).
    const RPM_VECTORS: &[(&str, &str, i8)] = &[
        ("1.0", "1.0", 0),
        ("1.0", "2.0", -1),
        ("2.0", "1.0", 1),
        ("2.0.1", "2.0.1", 0),
        ("2.0", "2.0.1", -1),
        ("2.0.1", "2.0", 1),
        ("2.0.1a", "2.0.1a", 0),
        ("2.0.1a", "2.0.1", 1),
        ("2.0.1", "2.0.1a", -1),
        ("5.5p1", "5.5p1", 0),
        ("5.5p1", "5.5p2", -1),
        ("5.5p2", "5.5p1", 1),
        ("5.5p10", "5.5p10", 0),
        ("5.5p1", "5.5p10", -1),
        ("5.5p10", "5.5p1", 1),
        ("10xyz", "10.1xyz", -1),
        ("10.1xyz", "10xyz", 1),
        ("xyz10", "xyz10", 0),
        ("xyz10", "xyz10.1", -1),
        ("xyz10.1", "xyz10", 1),
        ("xyz.4", "xyz.4", 0),
        ("xyz.4", "8", -1),
        ("8", "xyz.4", 1),
        ("xyz.4", "2", -1),
        ("2", "xyz.4", 1),
        ("5.5p2", "5.6p1", -1),
        ("5.6p1", "5.5p2", 1),
        ("5.6p1", "6.5p1", -1),
        ("6.5p1", "5.6p1", 1),
        ("6.0.rc1", "6.0", 1),
        ("6.0", "6.0.rc1", -1),
        ("10b2", "10a1", 1),
        ("10a2", "10b2", -1),
        ("1.0aa", "1.0aa", 0),
        ("1.0a", "1.0aa", -1),
        ("1.0aa", "1.0a", 1),
        ("10.0001", "10.0001", 0),
        ("10.0001", "10.1", 0),
        ("10.1", "10.0001", 0),
        ("10.0001", "10.0039", -1),
        ("10.0039", "10.0001", 1),
        ("4.999.9", "5.0", -1),
        ("5.0", "4.999.9", 1),
        ("20101121", "20101121", 0),
        ("20101121", "20101122", -1),
        ("20101122", "20101121", 1),
        ("2_0", "2_0", 0),
        ("2.0", "2_0", 0),
        ("2_0", "2.0", 0),
        ("a", "a", 0),
        ("a+", "a+", 0),
        ("a+", "a_", 0),
        ("a_", "a+", 0),
        ("+a", "+a", 0),
        ("+a", "_a", 0),
        ("_a", "+a", 0),
        ("+_", "+_", 0),
        ("_+", "+_", 0),
        ("_+", "_+", 0),
        ("+", "_", 0),
        ("_", "+", 0),
        ("1.0~rc1", "1.0~rc1", 0),
        ("1.0~rc1", "1.0", -1),
        ("1.0", "1.0~rc1", 1),
        ("1.0~rc1", "1.0~rc2", -1),
        ("1.0~rc2", "1.0~rc1", 1),
        ("1.0~rc1~git123", "1.0~rc1~git123", 0),
        ("1.0~rc1~git123", "1.0~rc1", -1),
        ("1.0~rc1", "1.0~rc1~git123", 1),
        ("1.0^", "1.0^", 0),
        ("1.0^", "1.0", 1),
        ("1.0", "1.0^", -1),
        ("1.0^git1", "1.0^git1", 0),
        ("1.0^git1", "1.0", 1),
        ("1.0", "1.0^git1", -1),
        ("1.0^git1", "1.0^git2", -1),
        ("1.0^git2", "1.0^git1", 1),
        ("1.0^git1", "1.01", -1),
        ("1.01", "1.0^git1", 1),
        ("1.0^20160101", "1.0^20160101", 0),
        ("1.0^20160101", "1.0.1", -1),
        ("1.0.1", "1.0^20160101", 1),
        ("1.0^20160101^git1", "1.0^20160101^git1", 0),
        ("1.0^20160102", "1.0^20160101^git1", 1),
        ("1.0^20160101^git1", "1.0^20160102", -1),
        ("1.0~rc1^git1", "1.0~rc1^git1", 0),
        ("1.0~rc1^git1", "1.0~rc1", 1),
        ("1.0~rc1", "1.0~rc1^git1", -1),
        ("1.0^git1~pre", "1.0^git1~pre", 0),
        ("1.0^git1", "1.0^git1~pre", 1),
        ("1.0^git1~pre", "1.0^git1", -1),
    ];

    #[test]
    fn rpm_test_suite_vectors() {
        for &(a, b, expected) in RPM_VECTORS {
            let expected = expected.cmp(&0);
            assert_eq!(rpmvercmp(a, b), expected, "rpmvercmp({a:?}, {b:?})");
        }
    }

    #[test]
    fn non_ascii_is_a_separator() {
        assert_eq!(rpmvercmp("1.1.α", "1.1.β"), Ordering::Equal);
    }

    #[test]
    fn evr_parse_display_and_order() {
        let a: Evr = "1:2.0-3.1".parse().unwrap();
        assert_eq!(a, Evr::new(1, "2.0", "3.1"));
        assert_eq!(a.to_string(), "1:2.0-3.1");
        let b: Evr = "9.9-9".parse().unwrap();
        assert_eq!(b.to_string(), "9.9-9");
        assert!(a > b, "epoch wins");
        let c: Evr = "0:1.2.3".parse().unwrap();
        assert_eq!(c.to_string(), "1.2.3");
        assert!("1.0-1".parse::<Evr>().unwrap() < "1.0-1.1".parse::<Evr>().unwrap());
        assert!("1.0-a-2".parse::<Evr>().unwrap().release == "2");
        assert!(matches!(
            "x:1".parse::<Evr>(),
            Err(ParseEvrError::Epoch { .. })
        ));
        assert_eq!("".parse::<Evr>().unwrap_err(), ParseEvrError::Empty);
        assert_eq!(
            "1:-2".parse::<Evr>().unwrap_err(),
            ParseEvrError::EmptyVersion
        );
        assert_eq!(Evr::parse_epoch("(none)").unwrap(), 0);
    }

    #[test]
    fn a_bound_without_release_compares_versions_only() {
        let evr = |s: &str| s.parse::<Evr>().unwrap();
        assert_eq!(evr("5.6.2-1.1").cmp_bound(&evr("5.6.2")), Ordering::Equal);
        assert_eq!(evr("5.6.1-3").cmp_bound(&evr("5.6.2")), Ordering::Less);
        assert_eq!(
            evr("5.6.2-1.1").cmp_bound(&evr("5.6.2-1.2")),
            Ordering::Less
        );
        assert_eq!(
            evr("5.6.2-10").cmp_bound(&evr("5.6.2-9")),
            Ordering::Greater
        );
        assert_eq!(
            evr("1:1.0-1").cmp_bound(&evr("5.6.2")),
            Ordering::Greater,
            "epoch first"
        );
        assert_eq!(
            evr("5.6.2-1").cmp_bound(&evr("1:5.6.2")),
            Ordering::Less,
            "no epoch is 0"
        );
        assert_eq!(
            evr("3.0.13~rc1-1").cmp_bound(&evr("3.0.13")),
            Ordering::Less
        );
    }

    fn version_string() -> impl Strategy<Value = String> {
        // Small alphabet so that equal segments and the special characters
        // meet often.
        proptest::string::string_regex("[0-3ab.~^_]{0,8}").unwrap()
    }

    proptest! {
        #[test]
        fn reflexive(a in version_string()) {
            prop_assert_eq!(rpmvercmp(&a, &a), Ordering::Equal);
        }

        #[test]
        fn antisymmetric(a in version_string(), b in version_string()) {
            prop_assert_eq!(rpmvercmp(&a, &b), rpmvercmp(&b, &a).reverse());
        }

        #[test]
        fn transitive(a in version_string(), b in version_string(), c in version_string()) {
            for [x, y, z] in [[&a, &b, &c], [&a, &c, &b], [&b, &a, &c], [&b, &c, &a], [&c, &a, &b], [&c, &b, &a]] {
                if rpmvercmp(x, y) != Ordering::Greater && rpmvercmp(y, z) != Ordering::Greater {
                    prop_assert_ne!(rpmvercmp(x, z), Ordering::Greater, "{:?} <= {:?} <= {:?}", x, y, z);
                }
            }
        }

        #[test]
        fn never_panics(a in any::<String>(), b in any::<String>()) {
            let _ = rpmvercmp(&a, &b);
            let _ = a.parse::<Evr>();
        }

        #[test]
        fn bound_agrees_with_the_order_when_both_have_releases(
            a in (0u64..2, version_string(), "[0-3ab.]{1,4}"),
            b in (0u64..2, version_string(), "[0-3ab.]{1,4}"),
        ) {
            let a = Evr::new(a.0, a.1, a.2);
            let b = Evr::new(b.0, b.1, b.2);
            prop_assert_eq!(a.cmp_bound(&b), a.cmp(&b));
            // Without the bound's release, the order of (epoch, version) decides.
            let bare = Evr::new(b.epoch, b.version.clone(), "");
            let expected = a.epoch.cmp(&b.epoch).then_with(|| rpmvercmp(&a.version, &b.version));
            prop_assert_eq!(a.cmp_bound(&bare), expected);
        }

        #[test]
        fn evr_round_trips(epoch in 0u64..5, v in "[0-9a-z.+~^_]{1,8}", r in "[0-9a-z.+~^_]{0,8}") {
            let evr = Evr::new(epoch, v, r);
            let back: Evr = evr.to_string().parse().unwrap();
            prop_assert_eq!(back.epoch, evr.epoch);
            prop_assert_eq!(&back.version, &evr.version);
            prop_assert_eq!(&back.release, &evr.release);
        }
    }
}
