//! The API objects built from channel data, one builder each, shared by the server's handlers
//! ([`crate::routes::resources`]) and the CLI ([`crate::cli`]), so both say the same thing.

use elemental_changelog::{
    compute::{IndexedChannel, QueryError},
    package_index::{PackageQuery, Presence},
};
use elemental_changelog_apiservice::{
    arch::Arch,
    types::{
        ChannelRef, InstalledPackage, ManagedOSVersionChangelog, ManagedOSVersionChangelogSummary,
        ObjectMeta, PackagePresence, PackageState, UnavailableReason,
    },
};
use elemental_changelog_registry::{Digest, ImageRef};

/// Longest warning text sent in a `Warning` header (k8s.io/apiserver truncates at 4 KiB).
const MAX_WARNING_BYTES: usize = 4096;

/// Keeps only `http` and `https` links in `references[].href` (UIs render them as links;
/// `javascript:` and the like must never reach one); says so in `warnings` when any went.
fn http_links_only(changelog: &mut ManagedOSVersionChangelog) {
    let mut dropped = 0;
    for advisory in &mut changelog.advisories {
        for reference in &mut advisory.references {
            let href = reference.href.trim().to_ascii_lowercase();
            if !(href.is_empty() || href.starts_with("http://") || href.starts_with("https://")) {
                reference.href.clear();
                dropped += 1;
            }
        }
    }
    if dropped > 0 {
        changelog.warnings.push(format!(
            "{dropped} reference link(s) that were not http(s) URLs were removed"
        ));
    }
}

/// A warning as the value of a `Warning` response header, in the Kubernetes format
/// (`299 - "<text>"`): quotes and backslashes escaped, control characters dropped, the
/// text cut at a character boundary past 4 KiB.
pub fn warning_header(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() + 10);
    for c in text.chars() {
        if escaped.len() >= MAX_WARNING_BYTES {
            break;
        }
        match c {
            '"' | '\\' => {
                escaped.push('\\');
                escaped.push(c);
            }
            c if c.is_control() => escaped.push(' '),
            // Header values are visible ASCII; a UI reads the JSON for anything else.
            c if !c.is_ascii() => escaped.push('?'),
            c => escaped.push(c),
        }
    }
    format!("299 - \"{escaped}\"")
}

/// Where a version's data was read: channel name, the image and digest of the snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// ManagedOSVersionChannel name (empty when there is none, as for `inspect`).
    pub channel: &'a str,
    /// Image reference the snapshot was read from (answered as written).
    pub image: &'a ImageRef,
    /// Manifest digest of that image.
    pub digest: &'a Digest,
}

/// The `channel` of an answer about version `name`: the digest is the one the version was
/// read from, which for a version retained from an earlier image is that image's (kept by
/// the channel data as the text of its [`Digest`], answered as it is).
pub fn channel_ref(source: Source<'_>, data: &IndexedChannel, name: &str) -> ChannelRef {
    let retained_from = data.version(name).and_then(|v| v.retained_from.clone());
    ChannelRef {
        name: source.channel.to_owned(),
        image: Some(source.image.as_str().to_owned()),
        retained: retained_from.is_some(),
        digest: Some(retained_from.unwrap_or_else(|| source.digest.to_string())),
    }
}

/// The summary of version `name` from the data that holds it. `spec_version` is the
/// ManagedOSVersion's `spec.version` (empty: the channel entry's version is used).
pub fn summary(
    source: Source<'_>,
    data: &IndexedChannel,
    name: &str,
    metadata: ObjectMeta,
    spec_version: &str,
) -> ManagedOSVersionChangelogSummary {
    let mut summary = ManagedOSVersionChangelogSummary::new();
    summary.metadata = metadata;
    summary.channel = channel_ref(source, data, name);
    summary.version = spec_version.to_owned();
    if let Some(v) = data.version(name) {
        summary.created = v.entry.created.map(|t| t.to_string());
        if summary.version.is_empty() {
            summary.version = v.entry.version.clone();
        }
    }
    match data.summary(name) {
        Ok((from, counts)) => {
            summary.available = true;
            summary.from = from;
            summary.summary = Some(counts);
        }
        Err(error) => {
            summary.reason = Some(UnavailableReason::NoChangelogData);
            summary.message = Some(no_data_message(source, name, &error));
        }
    }
    summary.with_status()
}

/// The changelog of version `name` compared with `from` (default: the previous version)
/// for `arch`, from the data that holds it: the whole object, its links http(s) only.
pub fn changelog(
    source: Source<'_>,
    data: &IndexedChannel,
    name: &str,
    from: Option<&str>,
    metadata: ObjectMeta,
    arch: &Arch,
) -> Result<ManagedOSVersionChangelog, QueryError> {
    let computed = data.changelog(name, from)?;
    let mut changelog = ManagedOSVersionChangelog::new();
    changelog.metadata = metadata;
    changelog.channel = channel_ref(source, data, name);
    changelog.arch = arch.to_string();
    changelog.version = computed.version;
    changelog.from = computed.from;
    changelog.source = computed.source;
    changelog.summary = computed.summary;
    changelog.advisories = computed.advisories;
    changelog.packages = computed.packages;
    changelog.warnings = computed.warnings;
    http_links_only(&mut changelog);
    Ok(changelog)
}

/// Why the data of `source` gives no changelog for `name`.
pub fn no_data_message(source: Source<'_>, name: &str, error: &QueryError) -> String {
    format!(
        "channel image {} ({}) has no changelog data for ManagedOSVersion {name}: {error}",
        source.image, source.digest
    )
}

/// The `package` block of version `name` (`?package=`): what its data carries of the package
/// `query` names (`data`: its channel's data, `None` when not read), or `None` when `query`'s
/// bounds leave the version out. A version the data does not know has no package list.
pub fn package(
    data: Option<&IndexedChannel>,
    name: &str,
    query: &PackageQuery,
) -> Option<PackagePresence> {
    let presence = data
        .and_then(|d| d.presence(name, query.name()))
        .unwrap_or(Presence::NoPackageList);
    if !query.selects(&presence) {
        return None;
    }
    Some(match presence {
        Presence::Installed(installed) => {
            let shown = query.choose(installed);
            PackagePresence {
                name: query.name().to_owned(),
                evr: shown.map(|p| p.evr.to_string()),
                arch: shown.map(|p| p.arch.clone()),
                installed: if installed.len() > 1 {
                    installed
                        .iter()
                        .map(|p| InstalledPackage {
                            evr: p.evr.to_string(),
                            arch: p.arch.clone(),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                state: None,
                message: None,
            }
        }
        Presence::Absent => PackagePresence::without(query.name(), PackageState::Absent),
        Presence::NoPackageList => {
            PackagePresence::without(query.name(), PackageState::NoPackageList)
        }
    })
}

#[cfg(test)]
mod tests {
    use elemental_changelog_apiservice::types::{Advisory, Reference};

    use super::*;

    #[test]
    fn package_blocks_say_what_each_version_carries() {
        use elemental_changelog::data::ChannelData;
        let channel = br#"[
            {"metadata":{"name":"a"},"spec":{"version":"1","type":"container","metadata":{"upgradeImage":"os:1","created":1}}},
            {"metadata":{"name":"b"},"spec":{"version":"2","type":"container","metadata":{"upgradeImage":"os:2","created":2}}},
            {"metadata":{"name":"c"},"spec":{"version":"3","type":"container","metadata":{"upgradeImage":"os:3","created":3}}}
        ]"#;
        let files = vec![
            ("channel.json".to_owned(), channel.to_vec()),
            (
                "changelogs/a.packages".to_owned(),
                b"xz|(none)|5.6.0|1.1|x86_64\nxz|(none)|5.4.6|1|i586\n".to_vec(),
            ),
            (
                "changelogs/b.packages".to_owned(),
                b"bash|(none)|5|1|x86_64\n".to_vec(),
            ),
        ];
        let data = IndexedChannel::new(ChannelData::from_files(files).unwrap());
        let any = PackageQuery::new("xz", None, None).unwrap();
        let a = package(Some(&data), "a", &any).unwrap();
        assert_eq!(
            (a.evr.as_deref(), a.arch.as_deref()),
            (Some("5.6.0-1.1"), Some("x86_64"))
        );
        assert_eq!(a.installed.len(), 2);
        assert_eq!(a.state, None);
        let b = package(Some(&data), "b", &any).unwrap();
        assert_eq!((b.evr, b.state), (None, Some(PackageState::Absent)));
        let c = package(Some(&data), "c", &any).unwrap();
        assert_eq!(c.state, Some(PackageState::NoPackageList));
        // Not read yet, or not in the data: no list.
        assert_eq!(
            package(None, "a", &any).unwrap().state,
            Some(PackageState::NoPackageList)
        );
        assert_eq!(
            package(Some(&data), "z", &any).unwrap().state,
            Some(PackageState::NoPackageList)
        );
        // Bounds keep only the versions carrying it within them, and show the one within.
        let old = PackageQuery::new("xz", None, Some("5.6.0")).unwrap();
        let a = package(Some(&data), "a", &old).unwrap();
        assert_eq!(
            (a.evr.as_deref(), a.arch.as_deref()),
            (Some("5.4.6-1"), Some("i586"))
        );
        for name in ["b", "c"] {
            assert_eq!(package(Some(&data), name, &old), None, "{name}");
        }
        assert_eq!(package(None, "a", &old), None);
    }

    #[test]
    fn only_http_links_are_kept() {
        let reference = |href: &str| Reference {
            href: href.to_owned(),
            ..Reference::default()
        };
        let mut changelog = ManagedOSVersionChangelog::new();
        changelog.advisories.push(Advisory {
            references: vec![
                reference("https://www.suse.com/security/cve/CVE-2024-1/"),
                reference("HTTP://bugzilla.suse.com/1"),
                reference("javascript:alert(1)"),
                reference(" data:text/html,x"),
                reference(""),
            ],
            ..Advisory::default()
        });
        http_links_only(&mut changelog);
        let hrefs: Vec<&str> = changelog.advisories[0]
            .references
            .iter()
            .map(|r| r.href.as_str())
            .collect();
        assert_eq!(
            hrefs,
            [
                "https://www.suse.com/security/cve/CVE-2024-1/",
                "HTTP://bugzilla.suse.com/1",
                "",
                "",
                ""
            ]
        );
        assert_eq!(changelog.warnings.len(), 1, "{:?}", changelog.warnings);
    }

    #[test]
    fn warnings_are_valid_header_values() {
        assert_eq!(
            warning_header(r#"files look "shifted" \ by one"#),
            r#"299 - "files look \"shifted\" \\ by one""#
        );
        let odd = warning_header("a\nb\u{7f}c ü");
        assert!(http::HeaderValue::from_str(&odd).is_ok(), "{odd}");
        assert!(warning_header(&"x".repeat(10_000)).len() < 4200);
    }
}
