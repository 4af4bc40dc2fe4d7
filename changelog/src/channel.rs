//! `/channel.json` of a channel image, as rancher/elemental-channels writes it:
//! a JSON array of `{metadata:{name}, spec:{version, type, metadata:{upgradeImage|uri,
//! displayName, platforms, created}}}`. Unknown fields are ignored.

use jiff::Timestamp;
use serde::Deserialize;

/// Why a `channel.json` is unusable.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not JSON at all.
    #[error("channel.json is not valid JSON")]
    Json(#[source] serde_json::Error),
    /// JSON, but not an array.
    #[error("channel.json must be a JSON array of entries, found {found}")]
    NotArray {
        /// The JSON type found instead (`object`, `string`, ...).
        found: &'static str,
    },
    /// An entry does not have the expected shape.
    #[error("channel.json entry {index} is invalid")]
    Entry {
        /// Position of the entry in the array (from 0).
        index: usize,
        /// What is wrong with it.
        #[source]
        source: serde_json::Error,
    },
    /// An entry has an empty `metadata.name`.
    #[error("channel.json entry {index} has an empty metadata.name")]
    EmptyName {
        /// Position of the entry in the array (from 0).
        index: usize,
    },
    /// Two entries share a name.
    #[error("channel.json lists {name:?} more than once (entries {first} and {second})")]
    DuplicateName {
        /// The repeated name.
        name: String,
        /// Position of the first entry with that name.
        first: usize,
        /// Position of the second.
        second: usize,
    },
    /// `created` is present but is not unix seconds.
    #[error("channel.json entry {index} ({name}) has an invalid created value {value}")]
    Created {
        /// Position of the entry.
        index: usize,
        /// Its name.
        name: String,
        /// The value as written.
        value: String,
    },
}

/// What a channel entry describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// `container`: an OS image to upgrade to; these are the versions that
    /// have changelogs.
    Container,
    /// `iso`: an installation medium.
    Iso,
    /// Any other `type`, as written.
    Other(String),
}

impl EntryKind {
    fn from_type(t: &str) -> Self {
        match t {
            "container" => Self::Container,
            "iso" => Self::Iso,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The `type` as written in `channel.json`.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Container => "container",
            Self::Iso => "iso",
            Self::Other(s) => s,
        }
    }
}

/// One entry of `channel.json`: what becomes a ManagedOSVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelEntry {
    /// `metadata.name`: the ManagedOSVersion name.
    pub name: String,
    /// `spec.version`.
    pub version: String,
    /// `spec.type`.
    pub kind: EntryKind,
    /// `spec.metadata.upgradeImage` (container entries).
    pub upgrade_image: Option<String>,
    /// `spec.metadata.uri` (iso entries).
    pub uri: Option<String>,
    /// `spec.metadata.displayName`.
    pub display_name: Option<String>,
    /// `spec.metadata.platforms` (`linux/x86_64`, ...).
    pub platforms: Vec<String>,
    /// `spec.metadata.created` (unix seconds), when given.
    pub created: Option<Timestamp>,
}

#[derive(Deserialize)]
struct RawEntry {
    metadata: RawMeta,
    spec: RawSpec,
}

#[derive(Deserialize)]
struct RawMeta {
    name: String,
}

#[derive(Deserialize)]
struct RawSpec {
    version: String,
    #[serde(default, rename = "type")]
    type_: String,
    #[serde(default)]
    metadata: RawSpecMeta,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpecMeta {
    #[serde(default)]
    upgrade_image: Option<String>,
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    platforms: Vec<String>,
    #[serde(default)]
    created: serde_json::Value,
}

/// Parses unix seconds given as a JSON number or a string of digits; `null`
/// and `""` mean absent. `Err(())` for anything else.
pub(crate) fn unix_seconds(value: &serde_json::Value) -> Result<Option<Timestamp>, ()> {
    let seconds = match value {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i,
            // Whole seconds written as a float (`1732723652.0`).
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e15 => f as i64,
            _ => return Err(()),
        },
        serde_json::Value::String(s) if s.trim().is_empty() => return Ok(None),
        serde_json::Value::String(s) => s.trim().parse::<i64>().map_err(|_| ())?,
        _ => return Err(()),
    };
    Timestamp::from_second(seconds).map(Some).map_err(|_| ())
}

fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Parses `channel.json`. Every entry is returned, in file order, whatever
/// its kind.
pub fn parse(bytes: &[u8]) -> Result<Vec<ChannelEntry>, Error> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(Error::Json)?;
    let serde_json::Value::Array(items) = value else {
        return Err(Error::NotArray {
            found: json_type(&value),
        });
    };
    let mut seen = std::collections::HashMap::with_capacity(items.len());
    let mut entries = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        let raw: RawEntry =
            serde_json::from_value(item).map_err(|source| Error::Entry { index, source })?;
        let name = raw.metadata.name;
        if name.trim().is_empty() {
            return Err(Error::EmptyName { index });
        }
        if let Some(first) = seen.insert(name.clone(), index) {
            return Err(Error::DuplicateName {
                name,
                first,
                second: index,
            });
        }
        let meta = raw.spec.metadata;
        let created = unix_seconds(&meta.created).map_err(|()| Error::Created {
            index,
            name: name.clone(),
            value: meta.created.to_string(),
        })?;
        entries.push(ChannelEntry {
            name,
            version: raw.spec.version,
            kind: EntryKind::from_type(&raw.spec.type_),
            upgrade_image: meta.upgrade_image,
            uri: meta.uri,
            display_name: meta.display_name,
            platforms: meta.platforms,
            created,
        });
    }
    Ok(entries)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SL_MICRO_61: &[u8] = include_bytes!("../tests/fixtures/channel-sl-micro-6.1-base.json");
    const SL_MICRO_62: &[u8] = include_bytes!("../tests/fixtures/channel-sl-micro-6.2-base.json");
    const UNSTABLE: &[u8] = include_bytes!("../tests/fixtures/channel-unstable.json");

    #[test]
    fn parses_sl_micro_61() {
        let entries = parse(SL_MICRO_61).unwrap();
        assert_eq!(entries.len(), 6);
        let first = &entries[0];
        assert_eq!(first.name, "base-v2.2.0-3.12-os");
        assert_eq!(first.version, "v2.2.0-3.12");
        assert_eq!(first.kind, EntryKind::Container);
        assert_eq!(
            first.upgrade_image.as_deref(),
            Some("registry.suse.com/suse/sl-micro/6.1/base-os-container:2.2.0-3.12")
        );
        assert_eq!(first.display_name.as_deref(), Some("SL Micro Base 6.1 OS"));
        assert_eq!(first.platforms, ["linux/x86_64", "linux/aarch64"]);
        assert_eq!(first.created.unwrap().as_second(), 1_732_723_652);
        let iso = &entries[3];
        assert_eq!(iso.kind, EntryKind::Iso);
        assert!(iso.uri.is_some() && iso.upgrade_image.is_none());
        let containers = entries.iter().filter(|e| e.kind == EntryKind::Container);
        assert_eq!(containers.count(), 3);
    }

    #[test]
    fn parses_sl_micro_62_and_unstable() {
        let entries = parse(SL_MICRO_62).unwrap();
        assert!(entries.iter().any(|e| e.kind == EntryKind::Container));
        let unstable = parse(UNSTABLE).unwrap();
        assert_eq!(unstable.len(), 2);
        assert!(unstable.iter().all(|e| e.created.is_none()));
        assert_eq!(unstable[0].version, "unstable");
    }

    #[test]
    fn created_as_string_number_or_absent() {
        let json = br#"[
          {"metadata":{"name":"a"},"spec":{"version":"1","type":"container","metadata":{"created":"1700000000"}}},
          {"metadata":{"name":"b","extra":1},"spec":{"version":"2","type":"container","metadata":{"created":1700000001}},"unknown":true},
          {"metadata":{"name":"c"},"spec":{"version":"3","type":"weird"}}
        ]"#;
        let entries = parse(json).unwrap();
        assert_eq!(entries[0].created.unwrap().as_second(), 1_700_000_000);
        assert_eq!(entries[1].created.unwrap().as_second(), 1_700_000_001);
        assert_eq!(entries[2].created, None);
        assert_eq!(entries[2].kind, EntryKind::Other("weird".into()));
        assert_eq!(entries[2].kind.as_str(), "weird");
    }

    #[test]
    fn rejects_what_is_not_a_channel() {
        let err = parse(br#"{"metadata":{}}"#).unwrap_err();
        assert!(
            matches!(err, Error::NotArray { found: "an object" }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "channel.json must be a JSON array of entries, found an object"
        );
        assert!(matches!(parse(b"[").unwrap_err(), Error::Json(_)));
        assert!(matches!(
            parse(br#"[{"metadata":{"name":"a"}}]"#).unwrap_err(),
            Error::Entry { index: 0, .. }
        ));
        assert!(matches!(
            parse(br#"[{"metadata":{"name":" "},"spec":{"version":"1"}}]"#).unwrap_err(),
            Error::EmptyName { index: 0 }
        ));
        let dup = br#"[{"metadata":{"name":"a"},"spec":{"version":"1"}},{"metadata":{"name":"a"},"spec":{"version":"2"}}]"#;
        assert!(matches!(
            parse(dup).unwrap_err(),
            Error::DuplicateName {
                first: 0,
                second: 1,
                ..
            }
        ));
        let bad_created =
            br#"[{"metadata":{"name":"a"},"spec":{"version":"1","metadata":{"created":"yesterday"}}}]"#;
        assert!(matches!(
            parse(bad_created).unwrap_err(),
            Error::Created { .. }
        ));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn parses_generated_entries(
            entries in proptest::collection::btree_map("[a-z0-9.-]{1,12}", ("[a-z0-9.~^-]{0,10}", proptest::option::of(0i64..4_000_000_000), any::<bool>()), 0..8)
        ) {
            let json: Vec<serde_json::Value> = entries.iter().map(|(name, (version, created, as_string))| {
                let created = match (created, as_string) {
                    (Some(c), true) => serde_json::Value::String(c.to_string()),
                    (Some(c), false) => serde_json::Value::from(*c),
                    (None, _) => serde_json::Value::Null,
                };
                serde_json::json!({"metadata": {"name": name}, "spec": {"version": version, "type": "container", "metadata": {"created": created}}})
            }).collect();
            let parsed = parse(&serde_json::to_vec(&json).unwrap()).unwrap();
            prop_assert_eq!(parsed.len(), entries.len());
            for (entry, (name, (version, created, _))) in parsed.iter().zip(&entries) {
                prop_assert_eq!(&entry.name, name);
                prop_assert_eq!(&entry.version, version);
                prop_assert_eq!(entry.created.map(|c| c.as_second()), *created);
            }
        }
    }
}
