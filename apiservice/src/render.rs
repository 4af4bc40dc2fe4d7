//! Human-readable changelogs (`format=text` and `format=markdown`), for
//! people on a terminal. Output depends only on the changelog, so the same
//! changelog always renders the same.
//!
//! Channel data is outside data: an advisory title may carry terminal escape sequences
//! (`ESC [ 2 J`, OSC 8 links, a carriage return that rewrites the line) or bidirectional
//! overrides that make text read differently from what it is. Every text output goes through
//! [`terminal_safe`], which writes such characters as visible escapes (`\x1b`, `\u{202e}`).

use std::{borrow::Cow, fmt::Write as _};

use crate::types::{Advisory, AdvisoryPackage, ManagedOSVersionChangelog, PackageChange};

fn evr(p: &AdvisoryPackage) -> String {
    match p.epoch.as_deref().filter(|e| !e.is_empty() && *e != "0") {
        Some(e) => format!("{}-{e}:{}-{}.{}", p.name, p.version, p.release, p.arch),
        None => format!("{}-{}-{}.{}", p.name, p.version, p.release, p.arch),
    }
}

fn from_line(c: &ManagedOSVersionChangelog) -> String {
    match &c.from {
        Some(f) => format!("{} ({})", f.version, f.name),
        None => "(oldest version of the channel)".to_owned(),
    }
}

fn summary_line(c: &ManagedOSVersionChangelog) -> String {
    let s = &c.summary;
    let by_type = s
        .by_type
        .iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut line = format!("{} advisories", s.advisories);
    if !by_type.is_empty() {
        let _ = write!(line, " ({by_type})");
    }
    let _ = write!(
        line,
        ", {} CVEs, highest severity {}",
        s.cves,
        s.highest_severity.as_str()
    );
    if let Some(p) = &c.packages {
        let _ = write!(
            line,
            "; packages: {} upgraded, {} downgraded, {} added, {} removed",
            p.upgraded.len(),
            p.downgraded.len(),
            p.added.len(),
            p.removed.len()
        );
    }
    line
}

fn change_versions(p: &PackageChange) -> (&str, &str) {
    (
        p.from.as_deref().unwrap_or("-"),
        p.to.as_deref().unwrap_or("-"),
    )
}

/// The package change groups, in display order, skipping empty ones.
fn package_groups(c: &ManagedOSVersionChangelog) -> Vec<(&'static str, &[PackageChange])> {
    c.packages
        .as_ref()
        .map(|p| {
            [
                ("upgraded", p.upgraded.as_slice()),
                ("downgraded", p.downgraded.as_slice()),
                ("added", p.added.as_slice()),
                ("removed", p.removed.as_slice()),
            ]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect()
        })
        .unwrap_or_default()
}

/// Plain text for a terminal.
pub fn text(c: &ManagedOSVersionChangelog) -> String {
    terminal_safe_owned(text_unfiltered(c))
}

fn text_unfiltered(c: &ManagedOSVersionChangelog) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Changelog of {} ({}/{})",
        c.version, c.metadata.namespace, c.metadata.name
    );
    let _ = writeln!(out, "Channel:  {}", c.channel.name);
    if let Some(image) = &c.channel.image {
        let _ = writeln!(out, "Image:    {image}");
    }
    if let Some(digest) = &c.channel.digest {
        let _ = writeln!(out, "Digest:   {digest}");
    }
    if c.channel.retained {
        let _ = writeln!(
            out,
            "Note:     data kept from an earlier image of the channel"
        );
    }
    let _ = writeln!(out, "From:     {}", from_line(c));
    let _ = writeln!(out, "Arch:     {}", c.arch);
    let _ = writeln!(out, "Source:   {:?}", c.source);
    for w in &c.warnings {
        let _ = writeln!(out, "Warning:  {w}");
    }
    let _ = writeln!(out, "Summary:  {}", summary_line(c));

    let _ = writeln!(out, "\nAdvisories ({}):", c.advisories.len());
    if c.advisories.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for a in &c.advisories {
        text_advisory(&mut out, a);
    }

    let groups = package_groups(c);
    if !groups.is_empty() {
        let width = groups
            .iter()
            .flat_map(|(_, v)| v.iter().map(|p| p.name.len() + p.arch.len() + 1))
            .max()
            .unwrap_or(0);
        let _ = writeln!(out, "\nPackages:");
        for (label, changes) in groups {
            let _ = writeln!(out, "  {label} ({}):", changes.len());
            for p in changes {
                let (from, to) = change_versions(p);
                let name = format!("{}.{}", p.name, p.arch);
                let _ = writeln!(out, "    {name:<width$}  {from} -> {to}");
            }
        }
    }
    out
}

fn text_advisory(out: &mut String, a: &Advisory) {
    let _ = writeln!(out, "\n  {} [{}, {}]", a.id, a.type_, a.severity.as_str());
    let _ = writeln!(out, "    {}", a.title);
    if let Some(issued) = &a.issued {
        let _ = writeln!(out, "    Issued:   {issued}");
    }
    if !a.cves.is_empty() {
        let _ = writeln!(out, "    CVEs:     {}", a.cves.join(", "));
    }
    if !a.bugs.is_empty() {
        let _ = writeln!(out, "    Bugs:     {}", a.bugs.join(", "));
    }
    if !a.packages.is_empty() {
        let pkgs: Vec<String> = a.packages.iter().map(evr).collect();
        let _ = writeln!(out, "    Packages: {}", pkgs.join(", "));
    }
}

/// Whether `c` must not reach a terminal as is: C0 controls but line feed and tab, DEL, C1
/// controls (8-bit CSI and OSC among them), and the bidirectional embeddings, overrides and
/// isolates (`U+202A`..`U+202E`, `U+2066`..`U+2069`) of "Trojan Source".
pub fn is_unsafe_for_terminals(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// `s` with every character [`is_unsafe_for_terminals`] written as a visible escape: `\x1b`
/// for a byte-sized one, `\u{202e}` for others. Borrowed when there is none (the usual case).
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe_for_terminals) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !is_unsafe_for_terminals(c) {
            out.push(c);
        } else if u32::from(c) < 0x100 {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
        }
    }
    Cow::Owned(out)
}

fn terminal_safe_owned(s: String) -> String {
    match terminal_safe(&s) {
        Cow::Borrowed(_) => s,
        Cow::Owned(safe) => safe,
    }
}

/// Escapes characters that would break a Markdown table cell or add markup.
fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' | '*' | '_' | '`' | '[' | ']' | '<' | '>' | '\\' | '#' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Markdown, for issue trackers and rendered views.
pub fn markdown(c: &ManagedOSVersionChangelog) -> String {
    terminal_safe_owned(markdown_unfiltered(c))
}

fn markdown_unfiltered(c: &ManagedOSVersionChangelog) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Changelog of {}\n", md(&c.version));
    let _ = writeln!(
        out,
        "- **ManagedOSVersion:** {}/{}",
        md(&c.metadata.namespace),
        md(&c.metadata.name)
    );
    let _ = writeln!(out, "- **Channel:** {}", md(&c.channel.name));
    if let Some(image) = &c.channel.image {
        let _ = writeln!(out, "- **Image:** `{image}`");
    }
    if let Some(digest) = &c.channel.digest {
        let _ = writeln!(out, "- **Digest:** `{digest}`");
    }
    let _ = writeln!(out, "- **From:** {}", md(&from_line(c)));
    let _ = writeln!(out, "- **Arch:** {}", md(&c.arch));
    let _ = writeln!(out, "- **Source:** {:?}", c.source);
    if c.channel.retained {
        let _ = writeln!(
            out,
            "\n> Note: data kept from an earlier image of the channel."
        );
    }
    for w in &c.warnings {
        let _ = writeln!(out, "\n> **Warning:** {}", md(w));
    }
    let _ = writeln!(out, "\n## Summary\n\n{}", md(&summary_line(c)));

    let _ = writeln!(out, "\n## Advisories ({})\n", c.advisories.len());
    if c.advisories.is_empty() {
        let _ = writeln!(out, "None.");
    } else {
        let _ = writeln!(
            out,
            "| ID | Type | Severity | Issued | Title | CVEs | Bugs |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for a in &c.advisories {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                md(&a.id),
                md(&a.type_),
                a.severity.as_str(),
                md(&a.issued.map(|t| t.to_string()).unwrap_or_default()),
                md(&a.title),
                md(&a.cves.join(", ")),
                md(&a.bugs.join(", ")),
            );
        }
        for a in c.advisories.iter().filter(|a| !a.packages.is_empty()) {
            let pkgs: Vec<String> = a.packages.iter().map(|p| format!("`{}`", evr(p))).collect();
            let _ = writeln!(out, "\n**{}** packages: {}", md(&a.id), pkgs.join(", "));
        }
    }

    let groups = package_groups(c);
    if !groups.is_empty() {
        let _ = writeln!(out, "\n## Packages\n");
        let _ = writeln!(out, "| Change | Package | Arch | From | To |");
        let _ = writeln!(out, "|---|---|---|---|---|");
        for (label, changes) in groups {
            for p in changes {
                let (from, to) = change_versions(p);
                let _ = writeln!(
                    out,
                    "| {label} | {} | {} | {} | {} |",
                    md(&p.name),
                    md(&p.arch),
                    md(from),
                    md(to)
                );
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::*;

    fn changelog() -> ManagedOSVersionChangelog {
        let mut c = ManagedOSVersionChangelog::new();
        c.metadata.name = "v2-0-1".into();
        c.metadata.namespace = "fleet-default".into();
        c.channel = ChannelRef {
            name: "sl-micro".into(),
            image: Some("registry.example/channel:6.1".into()),
            digest: Some("sha256:abc123".into()),
            retained: true,
        };
        c.version = "v2.0.1".into();
        c.from = Some(VersionRef {
            name: "v2-0-0".into(),
            version: "v2.0.0".into(),
        });
        c.arch = "x86_64".into();
        c.summary = ChangelogSummary {
            advisories: 1,
            by_type: [("security".to_owned(), 1)].into(),
            cves: 2,
            highest_severity: Severity::Critical,
            ..ChangelogSummary::default()
        };
        c.advisories = vec![Advisory {
            id: "SUSE-SLE-Micro-6.1-2024-1234".into(),
            type_: "security".into(),
            severity: Severity::Critical,
            title: "Security update for openssl | urgent".into(),
            issued: "2024-05-01T00:00:00Z".parse().ok(),
            cves: vec!["CVE-2024-0001".into(), "CVE-2024-0002".into()],
            bugs: vec!["1220001".into()],
            packages: vec![AdvisoryPackage {
                name: "openssl-3".into(),
                epoch: None,
                version: "3.1.4".into(),
                release: "150600.5.1".into(),
                arch: "x86_64".into(),
            }],
            ..Advisory::default()
        }];
        c.packages = Some(PackageChanges {
            upgraded: vec![PackageChange {
                name: "openssl-3".into(),
                arch: "x86_64".into(),
                from: Some("3.1.4-150600.4.1".into()),
                to: Some("3.1.4-150600.5.1".into()),
            }],
            added: vec![PackageChange {
                name: "jq".into(),
                arch: "x86_64".into(),
                from: None,
                to: Some("1.7-1".into()),
            }],
            ..PackageChanges::default()
        });
        c.warnings = vec!["precomputed files look shifted by one version".into()];
        c
    }

    #[test]
    fn text_contains_the_data() {
        let t = text(&changelog());
        for needle in [
            "Changelog of v2.0.1 (fleet-default/v2-0-1)",
            "Channel:  sl-micro",
            "Image:    registry.example/channel:6.1",
            "Digest:   sha256:abc123",
            "Note:     data kept from an earlier image",
            "From:     v2.0.0 (v2-0-0)",
            "Warning:  precomputed files look shifted",
            "1 advisories (1 security), 2 CVEs, highest severity critical",
            "1 upgraded, 0 downgraded, 1 added, 0 removed",
            "SUSE-SLE-Micro-6.1-2024-1234 [security, critical]",
            "Issued:   2024-05-01T00:00:00Z",
            "CVEs:     CVE-2024-0001, CVE-2024-0002",
            "Bugs:     1220001",
            "Packages: openssl-3-3.1.4-150600.5.1.x86_64",
            "openssl-3.x86_64  3.1.4-150600.4.1 -> 3.1.4-150600.5.1",
            "jq.x86_64         - -> 1.7-1",
        ] {
            assert!(t.contains(needle), "missing {needle:?} in\n{t}");
        }
        assert_eq!(t, text(&changelog()));
    }

    #[test]
    fn markdown_contains_the_data_and_escapes_cells() {
        let m = markdown(&changelog());
        for needle in [
            "# Changelog of v2.0.1",
            "- **Channel:** sl-micro",
            "- **Digest:** `sha256:abc123`",
            "| SUSE-SLE-Micro-6.1-2024-1234 | security | critical | 2024-05-01T00:00:00Z | Security update for openssl \\| urgent | CVE-2024-0001, CVE-2024-0002 | 1220001 |",
            "**SUSE-SLE-Micro-6.1-2024-1234** packages: `openssl-3-3.1.4-150600.5.1.x86_64`",
            "| upgraded | openssl-3 | x86\\_64 | 3.1.4-150600.4.1 | 3.1.4-150600.5.1 |",
            "| added | jq | x86\\_64 | - | 1.7-1 |",
            "> **Warning:** precomputed files look shifted by one version",
        ] {
            assert!(m.contains(needle), "missing {needle:?} in\n{m}");
        }
        assert_eq!(m, markdown(&changelog()));
    }

    #[test]
    fn empty_changelog_renders() {
        let c = ManagedOSVersionChangelog::new();
        let t = text(&c);
        assert!(t.contains("Advisories (0):\n  none"));
        assert!(t.contains("(oldest version of the channel)"));
        assert!(!t.contains("Packages:"));
        assert!(markdown(&c).contains("None."));
    }

    #[test]
    fn epoch_is_shown_when_not_zero() {
        let p = |e: Option<&str>| AdvisoryPackage {
            name: "a".into(),
            epoch: e.map(Into::into),
            version: "1".into(),
            release: "2".into(),
            arch: "noarch".into(),
        };
        assert_eq!(evr(&p(Some("3"))), "a-3:1-2.noarch");
        assert_eq!(evr(&p(Some("0"))), "a-1-2.noarch");
    }

    #[test]
    fn terminal_escapes_in_channel_data_are_made_visible() {
        let mut c = changelog();
        c.advisories[0].title =
            "fix\u{1b}[2J\u{1b}]8;;http://evil\u{7}link\r\u{9b}31m\u{202e}txt.exe".into();
        c.channel.name = "chan\u{1b}[31m".into();
        for out in [text(&c), markdown(&c)] {
            assert!(
                !out.chars().any(is_unsafe_for_terminals),
                "unsafe characters left in\n{out}"
            );
            assert!(out.contains("\\x1b"), "{out}");
            assert!(out.contains("\\u{202e}"), "{out}");
        }
        assert!(text(&c).contains("fix\\x1b[2J\\x1b]8;;http://evil\\x07link\\x0d\\x9b31m"));
        assert!(matches!(terminal_safe("plain\ttext\n"), Cow::Borrowed(_)));
    }
}
