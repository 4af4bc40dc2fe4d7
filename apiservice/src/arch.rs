//! CPU architectures, named once: the RPM name (`x86_64`, `aarch64`) that channel data and
//! users use, with the OCI/Go names (`amd64`, `arm64`) and the kernel's accepted as aliases.
//! Flags, requests, the OCI platform choice and the CLI all parse through [`Arch`].

use std::{borrow::Borrow, fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An architecture, held by its RPM name. Two spellings of one architecture compare equal
/// once parsed: `"amd64".parse::<Arch>() == "x86_64".parse::<Arch>()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch(String);

/// (RPM name, OCI name, other accepted aliases).
const KNOWN: [(&str, &str, &[&str]); 7] = [
    ("x86_64", "amd64", &["x86-64", "x64"]),
    ("aarch64", "arm64", &["arm64v8"]),
    ("i686", "386", &["i386", "i586", "x86"]),
    ("armv7hl", "arm", &["armv7l", "armhf", "armv7"]),
    ("ppc64le", "ppc64le", &[]),
    ("s390x", "s390x", &[]),
    ("riscv64", "riscv64", &[]),
];

/// The longest architecture name accepted.
const MAX_LEN: usize = 32;

/// A string that is not an architecture name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an architecture name (such as x86_64 or aarch64)")]
pub struct InvalidArch(pub String);

impl Arch {
    /// `x86_64`.
    pub fn x86_64() -> Self {
        Self("x86_64".to_owned())
    }

    /// `aarch64`.
    pub fn aarch64() -> Self {
        Self("aarch64".to_owned())
    }

    /// The RPM name (`x86_64`), as channel data and API objects spell it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The OCI (Go) name (`amd64`), as image indexes spell it.
    pub fn oci(&self) -> &str {
        KNOWN
            .iter()
            .find(|(rpm, ..)| *rpm == self.0)
            .map_or(self.0.as_str(), |(_, oci, _)| oci)
    }
}

impl FromStr for Arch {
    type Err = InvalidArch;

    /// Any spelling, in any case, surrounding spaces ignored. Unknown names made of
    /// `[a-z0-9_]` (up to 32 characters) are accepted as they are, so a new architecture
    /// needs no code change.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let name = raw.trim().to_ascii_lowercase();
        if let Some((rpm, ..)) = KNOWN
            .iter()
            .find(|(rpm, oci, aliases)| *rpm == name || *oci == name || aliases.contains(&&*name))
        {
            return Ok(Self((*rpm).to_owned()));
        }
        let valid = !name.is_empty()
            && name.len() <= MAX_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if valid {
            Ok(Self(name))
        } else {
            Err(InvalidArch(raw.to_owned()))
        }
    }
}

/// Maps keyed by [`Arch`] are looked up by RPM name (`map.get("x86_64")`): an `Arch` orders,
/// compares and hashes as its RPM name does.
impl Borrow<str> for Arch {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Arch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Arch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn every_spelling_is_one_architecture() {
        for (spelling, rpm, oci) in [
            ("x86_64", "x86_64", "amd64"),
            ("amd64", "x86_64", "amd64"),
            (" AMD64 ", "x86_64", "amd64"),
            ("x86-64", "x86_64", "amd64"),
            ("aarch64", "aarch64", "arm64"),
            ("arm64", "aarch64", "arm64"),
            ("i386", "i686", "386"),
            ("armhf", "armv7hl", "arm"),
            ("s390x", "s390x", "s390x"),
            ("loongarch64", "loongarch64", "loongarch64"),
        ] {
            let arch: Arch = spelling.parse().unwrap();
            assert_eq!((arch.as_str(), arch.oci()), (rpm, oci), "{spelling}");
            assert_eq!(arch.to_string(), rpm);
        }
    }

    #[test]
    fn nonsense_is_refused() {
        for bad in ["", " ", "x86/64", "amd64;rm", &"a".repeat(33), "ü"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn serde_uses_the_rpm_name() {
        let arch: Arch = serde_json::from_str("\"arm64\"").unwrap();
        assert_eq!(serde_json::to_string(&arch).unwrap(), "\"aarch64\"");
    }

    proptest! {
        #[test]
        fn parsing_is_idempotent(raw in "\\PC{0,40}") {
            if let Ok(arch) = raw.parse::<Arch>() {
                prop_assert_eq!(arch.as_str().parse::<Arch>().unwrap(), arch.clone());
                prop_assert_eq!(arch.oci().parse::<Arch>().unwrap(), arch);
            }
        }
    }
}
