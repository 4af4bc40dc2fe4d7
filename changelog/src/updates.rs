//! `/changelogs/<name>.updates.log`: the precomputed advisories of one
//! version, a JSON array as upstream's generator writes it:
//! `{type, id, title, severity, date (unix seconds as a string), references:[{href,id,title,type}],
//! description, packages:[{name, version, release, arch, epoch?}]}`.

use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Reference, Severity};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Why an `updates.log` does not parse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a JSON array of advisories.
    #[error("not a JSON array of advisories")]
    Json(#[source] serde_json::Error),
    /// An advisory does not have the expected shape.
    #[error("advisory {index} is invalid")]
    Advisory {
        /// Position in the array (from 0).
        index: usize,
        /// What is wrong.
        #[source]
        source: serde_json::Error,
    },
    /// An advisory has an empty `id`.
    #[error("advisory {index} has an empty id")]
    EmptyId {
        /// Position in the array (from 0).
        index: usize,
    },
    /// The advisories would take more memory than allowed ([`parse_within`]).
    #[error("advisory {index}: the advisories take more than {max_bytes} bytes of memory parsed")]
    TooLarge {
        /// Position in the array (from 0).
        index: usize,
        /// The allowance.
        max_bytes: u64,
    },
    /// `date` is neither unix seconds nor a timestamp.
    #[error("advisory {id} has an invalid date {value}")]
    Date {
        /// Advisory id.
        id: String,
        /// The value as written.
        value: String,
    },
}

#[derive(Deserialize, Serialize)]
struct RawAdvisory {
    #[serde(default, rename = "type")]
    type_: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    severity: String,
    #[serde(default)]
    date: serde_json::Value,
    #[serde(default, deserialize_with = "null_as_default")]
    references: Vec<RawReference>,
    #[serde(default)]
    description: String,
    #[serde(default, deserialize_with = "null_as_default")]
    packages: Vec<RawPackage>,
}

#[derive(Deserialize, Serialize)]
struct RawReference {
    #[serde(default)]
    href: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    title: String,
    #[serde(default, rename = "type")]
    type_: String,
}

#[derive(Deserialize, Serialize)]
struct RawPackage {
    name: String,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    epoch: serde_json::Value,
    version: String,
    #[serde(default)]
    release: String,
    #[serde(default)]
    arch: String,
}

fn null_as_default<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

/// Most digits of a CVE id's sequence number. The CVE program issues 4 or more; the
/// largest issued so far have 7. Ten leaves room for a thousand times more ids, and keeps an
/// id a client chooses (`?cve=`, a key of kept answers) short.
pub const MAX_CVE_SEQUENCE_DIGITS: usize = 10;

/// Whether `id` looks like a CVE id (`CVE-YYYY-NNNN...`, any case, at most
/// [`MAX_CVE_SEQUENCE_DIGITS`] digits after the year).
pub fn is_cve_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() >= 13
        && b.len() <= 9 + MAX_CVE_SEQUENCE_DIGITS
        && b[..4].eq_ignore_ascii_case(b"CVE-")
        && b[4..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'-'
        && b[9..].iter().all(u8::is_ascii_digit)
}

/// Splits an advisory's references into CVE ids (type `cve` or an id that
/// looks like one, upper-cased) and bug ids (the other references with an
/// id, except `self` links), each de-duplicated and sorted.
pub fn cves_and_bugs(references: &[Reference]) -> (Vec<String>, Vec<String>) {
    let mut cves = Vec::new();
    let mut bugs = Vec::new();
    for r in references {
        let id = r.id.trim();
        if id.is_empty() {
            continue;
        }
        if r.type_.eq_ignore_ascii_case("cve") || is_cve_id(id) {
            cves.push(id.to_ascii_uppercase());
        } else if !r.type_.eq_ignore_ascii_case("self") {
            bugs.push(id.to_owned());
        }
    }
    for v in [&mut cves, &mut bugs] {
        v.sort();
        v.dedup();
    }
    (cves, bugs)
}

/// Parses an advisory issue time: unix seconds (string or number), RFC 3339,
/// or `YYYY-MM-DD[ HH:MM:SS]` (UTC). `Ok(None)` when absent or empty.
pub(crate) fn parse_issued(value: &serde_json::Value) -> Result<Option<Timestamp>, ()> {
    if let Ok(ts) = crate::channel::unix_seconds(value) {
        return Ok(ts);
    }
    let serde_json::Value::String(s) = value else {
        return Err(());
    };
    parse_issued_str(s)
}

/// [`parse_issued`] for a string.
pub(crate) fn parse_issued_str(s: &str) -> Result<Option<Timestamp>, ()> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let seconds = s.parse::<i64>().map_err(|_| ())?;
        return Timestamp::from_second(seconds).map(Some).map_err(|_| ());
    }
    if let Ok(ts) = s.parse::<Timestamp>() {
        return Ok(Some(ts));
    }
    if let Ok(dt) = s.parse::<jiff::civil::DateTime>() {
        return dt
            .to_zoned(jiff::tz::TimeZone::UTC)
            .map(|z| Some(z.timestamp()))
            .map_err(|_| ());
    }
    Err(())
}

/// Fills `cves` and `bugs` of an advisory from its references.
pub(crate) fn with_cves_and_bugs(mut advisory: Advisory) -> Advisory {
    (advisory.cves, advisory.bugs) = cves_and_bugs(&advisory.references);
    advisory
}

/// Normalizes an epoch: absent, empty and `0` are `None`.
pub(crate) fn normalize_epoch(epoch: &str) -> Option<String> {
    let epoch = epoch.trim();
    (!epoch.is_empty() && epoch != "0" && epoch != "(none)").then(|| epoch.to_owned())
}

/// Parses an `updates.log`.
pub fn parse(bytes: &[u8]) -> Result<Vec<Advisory>, Error> {
    parse_within(bytes, u64::MAX).map(|(advisories, _)| advisories)
}

/// Parses an `updates.log` into advisories taking at most `max_bytes` of memory (as
/// estimated while they are built: structures, lists and text), and says how much they take.
/// The array is split into the raw text of each advisory first (borrowed from `bytes`), and
/// each is read straight into its type: besides the file, the parse takes the advisories
/// built, not a `serde_json::Value` tree of the whole file (up to 16 bytes per byte of JSON).
/// Many tiny advisories cost many times their text: the estimate stops them.
pub fn parse_within(bytes: &[u8], max_bytes: u64) -> Result<(Vec<Advisory>, u64), Error> {
    let items: Vec<&serde_json::value::RawValue> =
        serde_json::from_slice(bytes).map_err(Error::Json)?;
    let mut used = (items.len() * std::mem::size_of::<Advisory>()) as u64;
    // Sized once: a vector grown by doubling would hold up to twice the advisories' room
    // while it grows.
    let mut advisories = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        let mut advisory = advisory(index, item)?;
        compact(&mut advisory);
        used = used.saturating_add(heap_bytes(&advisory));
        if used > max_bytes {
            return Err(Error::TooLarge { index, max_bytes });
        }
        advisories.push(advisory);
    }
    Ok((advisories, used))
}

/// Gives back the room an advisory's text and lists were grown with (a vector grown by
/// doubling holds up to twice its items), so that it holds what [`heap_bytes`] counts.
pub(crate) fn compact(a: &mut Advisory) {
    let text = |s: &mut String| s.shrink_to_fit();
    text(&mut a.id);
    text(&mut a.type_);
    text(&mut a.title);
    text(&mut a.description);
    for r in &mut a.references {
        text(&mut r.id);
        text(&mut r.type_);
        text(&mut r.href);
        text(&mut r.title);
    }
    a.references.shrink_to_fit();
    for p in &mut a.packages {
        text(&mut p.name);
        if let Some(epoch) = &mut p.epoch {
            text(epoch);
        }
        text(&mut p.version);
        text(&mut p.release);
        text(&mut p.arch);
    }
    a.packages.shrink_to_fit();
    a.cves.iter_mut().chain(&mut a.bugs).for_each(text);
    a.cves.shrink_to_fit();
    a.bugs.shrink_to_fit();
}

/// Heap memory of an advisory besides its structure: its text and lists, and an allocation
/// header for each.
pub(crate) fn heap_bytes(a: &Advisory) -> u64 {
    const ALLOCATION: usize = 16;
    let text = |s: &str| {
        if s.is_empty() {
            0
        } else {
            s.len() + ALLOCATION
        }
    };
    let list = |n: usize, each: usize| if n == 0 { 0 } else { n * each + ALLOCATION };
    let references: usize = a
        .references
        .iter()
        .map(|r| text(&r.id) + text(&r.type_) + text(&r.href) + text(&r.title))
        .sum();
    let packages: usize = a
        .packages
        .iter()
        .map(|p| {
            text(&p.name)
                + p.epoch.as_deref().map_or(0, text)
                + text(&p.version)
                + text(&p.release)
                + text(&p.arch)
        })
        .sum();
    let ids: usize = a.cves.iter().chain(&a.bugs).map(|s| text(s)).sum();
    (text(&a.id)
        + text(&a.type_)
        + text(&a.title)
        + text(&a.description)
        + list(a.references.len(), std::mem::size_of::<Reference>())
        + references
        + list(a.packages.len(), std::mem::size_of::<AdvisoryPackage>())
        + packages
        + list(a.cves.len() + a.bugs.len(), std::mem::size_of::<String>())
        + ids) as u64
}

/// The advisory at `index` of an `updates.log`, from its raw text.
fn advisory(index: usize, item: &serde_json::value::RawValue) -> Result<Advisory, Error> {
    let raw: RawAdvisory =
        serde_json::from_str(item.get()).map_err(|source| Error::Advisory { index, source })?;
    if raw.id.trim().is_empty() {
        return Err(Error::EmptyId { index });
    }
    let issued = parse_issued(&raw.date).map_err(|()| Error::Date {
        id: raw.id.clone(),
        value: raw.date.to_string(),
    })?;
    let references = raw
        .references
        .into_iter()
        .map(|r| Reference {
            id: r.id,
            type_: r.type_,
            href: r.href,
            title: r.title,
        })
        .collect();
    let packages = raw
        .packages
        .into_iter()
        .map(|p| AdvisoryPackage {
            name: p.name,
            epoch: match &p.epoch {
                serde_json::Value::String(s) => normalize_epoch(s),
                serde_json::Value::Number(n) => normalize_epoch(&n.to_string()),
                _ => None,
            },
            version: p.version,
            release: p.release,
            arch: p.arch,
        })
        .collect();
    let mut advisory = with_cves_and_bugs(Advisory {
        id: raw.id,
        type_: raw.type_,
        severity: Severity::parse(&raw.severity),
        title: raw.title,
        issued,
        cves: Vec::new(),
        bugs: Vec::new(),
        references,
        description: raw.description,
        packages,
    });
    // Lists read from text grow by doubling (and `collect` reuses their buffers):
    // kept for the life of the data, they are trimmed to what they hold.
    advisory.references.shrink_to_fit();
    advisory.packages.shrink_to_fit();
    advisory.cves.shrink_to_fit();
    advisory.bugs.shrink_to_fit();
    Ok(advisory)
}

/// Writes advisories in upstream's `updates.log` shape (`date` as a string
/// of unix seconds, or RFC 3339 when it has a fraction of a second, so that
/// [`parse`] gives it back; `epoch` only when not 0), pretty-printed.
pub fn write(advisories: &[Advisory]) -> Vec<u8> {
    let raw: Vec<RawAdvisory> = advisories
        .iter()
        .map(|a| RawAdvisory {
            type_: a.type_.clone(),
            id: a.id.clone(),
            title: a.title.clone(),
            severity: match a.severity {
                Severity::Unspecified => String::new(),
                s => s.as_str().to_owned(),
            },
            date: a
                .issued
                .map_or(serde_json::Value::String(String::new()), |t| {
                    serde_json::Value::String(if t.subsec_nanosecond() == 0 {
                        t.as_second().to_string()
                    } else {
                        t.to_string()
                    })
                }),
            references: a
                .references
                .iter()
                .map(|r| RawReference {
                    href: r.href.clone(),
                    id: r.id.clone(),
                    title: r.title.clone(),
                    type_: r.type_.clone(),
                })
                .collect(),
            description: a.description.clone(),
            packages: a
                .packages
                .iter()
                .map(|p| RawPackage {
                    name: p.name.clone(),
                    epoch: p
                        .epoch
                        .clone()
                        .map_or(serde_json::Value::Null, serde_json::Value::String),
                    version: p.version.clone(),
                    release: p.release.clone(),
                    arch: p.arch.clone(),
                })
                .collect(),
        })
        .collect();
    // Serializing plain structs of strings and JSON values cannot fail.
    serde_json::to_vec_pretty(&raw).unwrap_or_else(|_| b"[]".to_vec())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &[u8] = include_bytes!("../tests/fixtures/example.updates.log.json");

    #[test]
    fn parses_the_upstream_example() {
        let advisories = parse(EXAMPLE).unwrap();
        assert_eq!(advisories.len(), 2);
        let rec = &advisories[0];
        assert_eq!(rec.id, "Update-ID");
        assert_eq!(rec.type_, "recommended");
        assert_eq!(rec.severity, Severity::Moderate);
        assert_eq!(
            rec.issued.map(|t| t.to_string()).as_deref(),
            Some("2024-08-15T14:40:38Z")
        );
        assert!(rec.cves.is_empty());
        assert_eq!(rec.bugs, ["0000001"]);
        assert_eq!(rec.packages[0].name, "elemental");
        assert_eq!(rec.packages[0].epoch, None);
        let sec = &advisories[1];
        assert_eq!(sec.severity, Severity::Important);
        assert_eq!(sec.cves, ["CVE-2024-00002"]);
        assert_eq!(sec.bugs, ["0000002"]);
        assert_eq!(sec.references.len(), 2);
        assert_eq!(sec.references[1].type_, "cve");
        assert_eq!(
            sec.issued.map(|t| t.to_string()).as_deref(),
            Some("2024-08-20T11:47:06Z")
        );
    }

    #[test]
    fn tolerates_numbers_nulls_and_unknown_fields() {
        let json = br#"[{"id":"A","type":"security","date":1724154426,"severity":"CRITICAL",
            "references":null,"packages":[{"name":"p","version":"1","release":"2","arch":"noarch","epoch":"3"}],
            "extra":{"x":1}},
            {"id":"B","date":"","references":[{"id":"cve-2024-1234","type":"bugzilla"},{"id":"CVE-2024-1234","type":"cve"},{"id":"x","type":"self"}]}]"#;
        let advisories = parse(json).unwrap();
        assert_eq!(
            advisories[0].issued.map(|t| t.to_string()).as_deref(),
            Some("2024-08-20T11:47:06Z")
        );
        assert_eq!(advisories[0].severity, Severity::Critical);
        assert_eq!(advisories[0].packages[0].epoch.as_deref(), Some("3"));
        assert_eq!(advisories[1].issued, None);
        assert_eq!(advisories[1].cves, ["CVE-2024-1234"]);
        assert!(advisories[1].bugs.is_empty());
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(parse(b"{}").unwrap_err(), Error::Json(_)));
        // Tiny advisories cost many times their text: the estimate stops them.
        let tiny = format!("[{}]", vec![r#"{"id":"a"}"#; 10_000].join(","));
        assert!(matches!(
            parse_within(tiny.as_bytes(), 1 << 20).unwrap_err(),
            Error::TooLarge { max_bytes, .. } if max_bytes == 1 << 20
        ));
        let (all, used) = parse_within(tiny.as_bytes(), 64 << 20).unwrap();
        assert_eq!(all.len(), 10_000);
        assert!(used > 20 * tiny.len() as u64, "{used}");
        assert!(matches!(
            parse(b"[1]").unwrap_err(),
            Error::Advisory { index: 0, .. }
        ));
        assert!(matches!(
            parse(br#"[{"id":""}]"#).unwrap_err(),
            Error::EmptyId { index: 0 }
        ));
        let err = parse(br#"[{"id":"X","date":"soon"}]"#).unwrap_err();
        assert_eq!(err.to_string(), r#"advisory X has an invalid date "soon""#);
    }

    /// Found by `fuzz/` (`updates_log`): `write` dropped the fraction of an
    /// RFC 3339 `date`, so the advisory did not read back the same.
    #[test]
    fn round_trips_sub_second_dates() {
        let advisories = parse(br#"[{"id":"A","date":"2024-08-20T11:47:06.5Z"}]"#).unwrap();
        assert_eq!(
            advisories[0].issued.map(|t| t.to_string()).as_deref(),
            Some("2024-08-20T11:47:06.5Z")
        );
        assert_eq!(parse(&write(&advisories)).unwrap(), advisories);
        let whole = parse(br#"[{"id":"B","date":"2024-08-20T11:47:06Z"}]"#).unwrap();
        let written = String::from_utf8(write(&whole)).unwrap();
        assert!(written.contains(r#""date": "1724154426""#), "{written}");
    }

    #[test]
    fn cve_ids() {
        assert!(is_cve_id("CVE-2024-0001"));
        assert!(is_cve_id("cve-2024-123456"));
        assert!(!is_cve_id("CVE-2024-001"));
        assert!(!is_cve_id("CVE-24-00001"));
        assert!(!is_cve_id("CVE-2024-0001a"));
        assert!(is_cve_id("CVE-2024-1234567890"));
        assert!(!is_cve_id("CVE-2024-12345678901"));
        assert!(!is_cve_id(&format!("CVE-2024-{}", "1".repeat(7000))));
    }

    #[test]
    fn issued_formats() {
        let s = |v: &str| parse_issued_str(v).unwrap().unwrap().to_string();
        assert_eq!(s("1723732838"), "2024-08-15T14:40:38Z");
        assert_eq!(s("2024-08-15T14:40:38Z"), "2024-08-15T14:40:38Z");
        assert_eq!(s("2024-08-15 14:40:38"), "2024-08-15T14:40:38Z");
        assert_eq!(s("2024-08-15"), "2024-08-15T00:00:00Z");
        assert!(parse_issued_str("99999999999999999999").is_err());
    }

    fn arb_advisory() -> impl Strategy<Value = Advisory> {
        (
            "[A-Za-z0-9-]{1,12}",
            "(security|recommended|feature)",
            prop_oneof![
                Just(Severity::Low),
                Just(Severity::Important),
                Just(Severity::Unspecified)
            ],
            ".{0,20}",
            proptest::option::of(0i64..4_000_000_000),
            proptest::collection::vec(
                (
                    "(CVE-20[0-9]{2}-[0-9]{4,6}|[0-9]{1,7})",
                    "(cve|bugzilla|jira)",
                ),
                0..4,
            ),
            proptest::collection::vec(
                (
                    "[a-z0-9-]{1,8}",
                    proptest::option::of("[1-9]"),
                    "[0-9.]{1,5}",
                    "[0-9.]{1,5}",
                    "(x86_64|noarch)",
                ),
                0..3,
            ),
        )
            .prop_map(|(id, type_, severity, title, issued, refs, pkgs)| {
                let references: Vec<Reference> = refs
                    .into_iter()
                    .map(|(id, type_)| Reference {
                        href: format!("https://x/{id}"),
                        title: String::new(),
                        id,
                        type_,
                    })
                    .collect();
                let packages = pkgs
                    .into_iter()
                    .map(|(name, epoch, version, release, arch)| AdvisoryPackage {
                        name,
                        epoch,
                        version,
                        release,
                        arch,
                    })
                    .collect();
                let issued = issued.map(|s| Timestamp::from_second(s).unwrap());
                with_cves_and_bugs(Advisory {
                    id,
                    type_,
                    severity,
                    title,
                    issued,
                    cves: Vec::new(),
                    bugs: Vec::new(),
                    references,
                    description: "d".into(),
                    packages,
                })
            })
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn never_panics_on_json_shaped_input(s in r#"\[\{"id":"[a-z]{0,3}","date":("[0-9a-z: -]{0,12}"|-?[0-9]{0,20}),"packages":\[\{"name":"a","version":"1","epoch":[0-9]{0,3}\}\]\}\]"#) {
            let _ = parse(s.as_bytes());
        }

        #[test]
        fn round_trips(advisories in proptest::collection::vec(arb_advisory(), 0..5)) {
            let parsed = parse(&write(&advisories)).unwrap();
            prop_assert_eq!(parsed, advisories);
        }
    }
}
