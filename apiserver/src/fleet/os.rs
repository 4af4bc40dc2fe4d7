//! What a machine reports about its OS, and how it is compared with
//! ManagedOSVersions.
//!
//! `elemental-register` reads `NAME`, `VERSION`, `VERSION_ID`, `ID`,
//! `PRETTY_NAME`, `IMAGE` and `CPE_NAME` from `/etc/os-release` and sends
//! them as `os.name`, `os.version`, `os.version-id`, `os.id`,
//! `os.pretty-name`, `os.image` and `os.cpe-name` (plus `os.unmanaged:
//! "true"` without the toolkit); the operator stores each as the annotation
//! `elemental.cattle.io/<key>` after removing CR/LF and HTML-escaping the
//! value (Go's `html.EscapeString`), at every registration and its daily
//! update (rancher/elemental-operator `pkg/register/register.go`,
//! `pkg/server/api_registration.go`, `pkg/server/server.go`).

use std::collections::BTreeMap;

use elemental_changelog_apiservice::fleet::ReportedOs;

use crate::channels::crd::ManagedOSVersion;

/// `IMAGE` of `/etc/os-release`: the OS container image, `repo:tag`.
pub const OS_IMAGE: &str = "elemental.cattle.io/os.image";
/// `VERSION`.
pub const OS_VERSION: &str = "elemental.cattle.io/os.version";
/// `VERSION_ID`.
pub const OS_VERSION_ID: &str = "elemental.cattle.io/os.version-id";
/// `NAME`.
pub const OS_NAME: &str = "elemental.cattle.io/os.name";
/// `PRETTY_NAME`.
pub const OS_PRETTY_NAME: &str = "elemental.cattle.io/os.pretty-name";
/// `ID`.
pub const OS_ID: &str = "elemental.cattle.io/os.id";
/// `CPE_NAME`.
pub const OS_CPE_NAME: &str = "elemental.cattle.io/os.cpe-name";
/// `"true"` when the machine registered without the Elemental toolkit.
pub const OS_UNMANAGED: &str = "elemental.cattle.io/os.unmanaged";

/// The annotations the fleet view reads; the reflector keeps no other
/// (`os.name`, `os.id`, `os.cpe-name` and any other `os.*` key a machine
/// sends are dropped).
pub const READ_ANNOTATIONS: [&str; 5] = [
    OS_IMAGE,
    OS_VERSION,
    OS_VERSION_ID,
    OS_PRETTY_NAME,
    OS_UNMANAGED,
];

/// Reverses Go's `html.EscapeString` (`<`, `>`, `&`, `'`, `"`), which the
/// operator applies to every annotation value.
pub fn unescape_html(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&#34;", "\"")
        .replace("&amp;", "&")
}

fn annotation(annotations: &BTreeMap<String, String>, key: &str) -> Option<Box<str>> {
    annotations
        .get(key)
        .map(|v| unescape_html(v.trim()))
        .filter(|v| !v.is_empty())
        .map(String::into_boxed_str)
}

/// What the machine reported, read from its annotations once, when the
/// reflector stores the machine ([`trim_machine`](super::reflect::trim_machine)):
/// values trimmed and unescaped, empty ones absent. Each value is held in an
/// allocation of its exact length, as a machine keeps it for as long as it
/// exists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    /// `os.image`.
    pub image: Option<Box<str>>,
    /// `os.version`.
    pub version: Option<Box<str>>,
    /// `os.version-id`.
    pub version_id: Option<Box<str>>,
    /// `os.pretty-name`.
    pub pretty_name: Option<Box<str>>,
    /// `os.unmanaged` is `true`.
    pub unmanaged: bool,
}

impl Reported {
    /// Reads a MachineInventory's annotations (those of [`READ_ANNOTATIONS`]).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        Self {
            image: annotation(annotations, OS_IMAGE),
            version: annotation(annotations, OS_VERSION),
            version_id: annotation(annotations, OS_VERSION_ID),
            pretty_name: annotation(annotations, OS_PRETTY_NAME),
            unmanaged: annotation(annotations, OS_UNMANAGED)
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        }
    }

    /// The wire form.
    pub fn to_wire(&self) -> ReportedOs {
        ReportedOs {
            image: self.image.as_deref().map(str::to_owned),
            version: self.version.as_deref().map(str::to_owned),
            pretty_name: self.pretty_name.as_deref().map(str::to_owned),
        }
    }
}

/// The upgrade image of a ManagedOSVersion (`spec.metadata.upgradeImage`,
/// what the operator's `ContainerImage()` reads).
pub fn upgrade_image(version: &ManagedOSVersion) -> Option<&str> {
    version
        .spec
        .metadata
        .as_ref()?
        .get("upgradeImage")?
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Whether a ManagedOSVersion is an OS (container) version: the operator
/// defaults an empty type to `container`.
pub fn is_container(version: &ManagedOSVersion) -> bool {
    let t = version.spec.type_.trim();
    t.is_empty() || t.eq_ignore_ascii_case("container")
}

/// An image reference as compared: trimmed, without Docker Hub's implicit
/// `docker.io/` (`index.docker.io/`) and `library/`.
pub fn normalize_image(s: &str) -> &str {
    let s = s.trim();
    let s = s
        .strip_prefix("docker.io/")
        .or_else(|| s.strip_prefix("index.docker.io/"))
        .unwrap_or(s);
    s.strip_prefix("library/").unwrap_or(s)
}

/// Whether the first path component of a reference names a registry host
/// (has a `.` or a `:`, or is `localhost`), as Docker reads references.
fn has_registry_host(reference: &str) -> bool {
    reference.split_once('/').is_some_and(|(first, _)| {
        first.contains('.') || first.contains(':') || first == "localhost"
    })
}

/// Whether the image a machine reports is the upgrade image of a version:
/// equal references, or equal but for a registry mirror prefix on one side
/// (`mirror.example/registry.suse.com/x:1` and `registry.suse.com/x:1`; the
/// remainder must itself name a registry host, so a prefix is never guessed
/// from a bare repository name).
pub fn images_match(reported: &str, upgrade_image: &str) -> bool {
    let a = normalize_image(reported);
    let b = normalize_image(upgrade_image);
    if a.is_empty() || b.is_empty() {
        return false;
    }
    if a == b {
        return true;
    }
    let prefixed = |long: &str, short: &str| {
        has_registry_host(short)
            && long.len() > short.len()
            && long.ends_with(short)
            && long.as_bytes()[long.len() - short.len() - 1] == b'/'
    };
    prefixed(a, b) || prefixed(b, a)
}

/// The tails of a normalized reference that follow a `/` and name a
/// registry host themselves: what a mirror prefix may have been put before.
/// `images_match(a, b)` holds exactly when `a == b`, or one is among the
/// other's host suffixes (indexes use this).
pub fn host_suffixes(normalized: &str) -> impl Iterator<Item = &str> {
    normalized
        .match_indices('/')
        .map(move |(i, _)| &normalized[i + 1..])
        .filter(|tail| has_registry_host(tail))
}

/// A version string as compared: trimmed, without a leading `v`.
pub fn normalize_version(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix(['v', 'V']).unwrap_or(s)
}

/// Whether a reported version (`VERSION` or `VERSION_ID`) is a
/// ManagedOSVersion's `spec.version` (a leading `v` is ignored on both).
pub fn versions_match(reported: &str, spec_version: &str) -> bool {
    let a = normalize_version(reported);
    !a.is_empty() && a == normalize_version(spec_version)
}
