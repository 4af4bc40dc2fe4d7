//! `meta.k8s.io` `Table` of changelog summaries, for `kubectl get`.
//!
//! Column names are written as kube-apiserver writes them (`Name`, `Age`);
//! kubectl prints them upper-cased. Columns with `priority: 1` are shown by
//! `kubectl get -o wide` only.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};

use crate::content::{IncludeObject, TableVersion};
use crate::types::{ManagedOSVersionChangelogSummary, ObjectMeta, PackagePresence};

/// `meta.k8s.io` `Table`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    /// Always `Table`.
    pub kind: &'static str,
    /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`.
    pub api_version: &'static str,
    /// List metadata (this API keeps no resource versions).
    pub metadata: TableMeta,
    /// Columns.
    pub column_definitions: Vec<ColumnDefinition>,
    /// Rows, one per item.
    pub rows: Vec<Row>,
}

/// `Table.metadata`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TableMeta {
    /// Empty: this API keeps no resource versions.
    pub resource_version: String,
}

/// `TableColumnDefinition`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ColumnDefinition {
    /// Column title.
    pub name: &'static str,
    /// OpenAPI type: `string`, `integer`, `boolean`, ...
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// OpenAPI format (`name` for the object name column), may be empty.
    pub format: &'static str,
    /// What the column shows.
    pub description: &'static str,
    /// 0: always shown; 1: `-o wide` only.
    pub priority: i32,
}

/// `TableRow`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// One cell per column; `null` prints as `<none>`.
    pub cells: Vec<Value>,
    /// What `includeObject` asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
}

pub(crate) const fn column(
    name: &'static str,
    type_: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
) -> ColumnDefinition {
    ColumnDefinition {
        name,
        type_,
        format,
        description,
        priority,
    }
}

const COLUMNS: [ColumnDefinition; 13] = [
    column("Name", "string", "name", "Name of the ManagedOSVersion.", 0),
    column(
        "Channel",
        "string",
        "",
        "ManagedOSVersionChannel the version belongs to.",
        0,
    ),
    column("Version", "string", "", "OS version (spec.version).", 0),
    column(
        "Advisories",
        "integer",
        "",
        "Number of advisories since the previous version.",
        0,
    ),
    column(
        "Security",
        "integer",
        "",
        "Number of security advisories.",
        0,
    ),
    column("CVEs", "integer", "", "Distinct CVEs fixed.", 0),
    column("Severity", "string", "", "Highest advisory severity.", 0),
    column(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    ),
    column("From", "string", "", "The version compared against.", 1),
    column(
        "Packages",
        "string",
        "",
        "Packages upgraded/added/removed.",
        1,
    ),
    column(
        "Available",
        "boolean",
        "",
        "Whether a changelog can be served.",
        1,
    ),
    column("Reason", "string", "", "Why no changelog is available.", 1),
    column(
        "Digest",
        "string",
        "",
        "Digest of the channel image the data came from (short).",
        1,
    ),
];

/// kubectl's `translateTimestampSince`: `<unknown>` without a time, else
/// apimachinery's `duration.HumanDuration` of the time since.
pub fn age(creation_timestamp: Option<&str>, now: Timestamp) -> String {
    match creation_timestamp.and_then(|t| t.parse::<Timestamp>().ok()) {
        Some(t) => human_duration(now.as_second() - t.as_second()),
        None => "<unknown>".to_owned(),
    }
}

/// apimachinery `duration.HumanDuration`, on whole seconds.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// `sha256:0123456789abcdef...` → `sha256:0123456789ab`.
fn short_digest(digest: &str) -> String {
    match digest.split_once(':') {
        Some((algo, hex)) => format!("{algo}:{}", hex.get(..12).unwrap_or(hex)),
        None => digest.get(..12).unwrap_or(digest).to_owned(),
    }
}

pub(crate) fn partial_object_metadata(version: TableVersion, meta: &ObjectMeta) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": version.api_version(),
        "metadata": meta,
    })
}

fn row(
    item: &ManagedOSVersionChangelogSummary,
    wide: bool,
    version: TableVersion,
    include_object: IncludeObject,
    now: Timestamp,
) -> Row {
    let summary = item.summary.as_ref();
    let count = |f: fn(&crate::types::ChangelogSummary) -> usize| {
        summary.map_or(Value::Null, |s| json!(f(s)))
    };
    // Cells are printed on terminals as they are (kubectl cuts them at a line break only).
    let text = |s: &str| json!(crate::render::terminal_safe(s));
    let mut cells = vec![
        text(&item.metadata.name),
        text(&item.channel.name),
        text(&item.version),
        count(|s| s.advisories),
        count(|s| s.by_type.get("security").copied().unwrap_or_default()),
        count(|s| s.cves),
        summary.map_or(Value::Null, |s| json!(s.highest_severity.as_str())),
        json!(age(item.metadata.creation_timestamp.as_deref(), now)),
    ];
    if wide {
        let packages = summary.and_then(|s| {
            Some(format!(
                "{}/{}/{}",
                s.packages_upgraded?, s.packages_added?, s.packages_removed?
            ))
        });
        let reason = item
            .reason
            .and_then(|r| serde_json::to_value(r).ok())
            .unwrap_or(Value::Null);
        cells.extend([
            item.from.as_ref().map_or(Value::Null, |f| text(&f.name)),
            packages.map_or(Value::Null, Value::from),
            json!(item.available),
            reason,
            item.channel
                .digest
                .as_deref()
                .map_or(Value::Null, |d| json!(short_digest(d))),
        ]);
    }
    let object = row_object(include_object, version, &item.metadata, item);
    Row { cells, object }
}

/// The `object` of a Table row, as `includeObject` asks: none, its metadata as a
/// `PartialObjectMetadata`, or the whole `item`.
pub(crate) fn row_object(
    include_object: IncludeObject,
    version: TableVersion,
    metadata: &ObjectMeta,
    item: &impl serde::Serialize,
) -> Option<Value> {
    match include_object {
        IncludeObject::None => None,
        IncludeObject::Metadata => Some(partial_object_metadata(version, metadata)),
        IncludeObject::Object => serde_json::to_value(item).ok(),
    }
}

/// The PACKAGE column of a `?package=` list (versions and machines), last.
pub const PACKAGE_COLUMN: ColumnDefinition = column(
    "Package",
    "string",
    "",
    "The package asked for with ?package=: name-evr.arch (+N when more are installed), or name (Absent, NoPackageList, Unknown).",
    0,
);

/// The PACKAGE cell of an item with `package` (null when the item has no block).
pub fn package_cell(package: Option<&PackagePresence>) -> Value {
    package.map_or(Value::Null, |p| {
        json!(crate::render::terminal_safe(&p.cell()))
    })
}

/// Adds the PACKAGE column to `table`, whose rows are `items`' in order.
pub fn add_package_column<'a>(
    table: &mut Table,
    items: impl IntoIterator<Item = Option<&'a PackagePresence>>,
) {
    table.column_definitions.push(PACKAGE_COLUMN);
    for (row, package) in table.rows.iter_mut().zip(items) {
        row.cells.push(package_cell(package));
    }
}

/// A `meta.k8s.io/v1` Table of `items` for `kubectl get`; `wide` adds the
/// `priority: 1` columns (kubectl shows them with `-o wide`).
pub fn summaries_table(
    items: &[ManagedOSVersionChangelogSummary],
    wide: bool,
    include_object: IncludeObject,
    now: Timestamp,
) -> Table {
    summaries_table_version(items, wide, TableVersion::V1, include_object, now)
}

/// [`summaries_table`] in a chosen `meta.k8s.io` version.
pub fn summaries_table_version(
    items: &[ManagedOSVersionChangelogSummary],
    wide: bool,
    version: TableVersion,
    include_object: IncludeObject,
    now: Timestamp,
) -> Table {
    Table {
        kind: "Table",
        api_version: version.api_version(),
        metadata: TableMeta::default(),
        column_definitions: COLUMNS
            .iter()
            .filter(|c| wide || c.priority == 0)
            .cloned()
            .collect(),
        rows: items
            .iter()
            .map(|i| row(i, wide, version, include_object, now))
            .collect(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::{ChangelogSummary, Severity, UnavailableReason, VersionRef};

    fn now() -> Timestamp {
        "2024-06-10T12:00:00Z".parse().unwrap()
    }

    fn item() -> ManagedOSVersionChangelogSummary {
        let mut s = ManagedOSVersionChangelogSummary::new();
        s.metadata.name = "v2-0-1".into();
        s.metadata.namespace = "fleet-default".into();
        s.metadata.creation_timestamp = Some("2024-06-05T12:00:00Z".into());
        s.channel.name = "sl-micro".into();
        s.channel.digest = Some("sha256:0123456789abcdef0123".into());
        s.version = "v2.0.1".into();
        s.available = true;
        s.from = Some(VersionRef {
            name: "v2-0-0".into(),
            version: "v2.0.0".into(),
        });
        s.summary = Some(ChangelogSummary {
            advisories: 7,
            by_type: [("security".to_owned(), 3), ("recommended".to_owned(), 4)].into(),
            cves: 11,
            highest_severity: Severity::Important,
            packages_upgraded: Some(20),
            packages_downgraded: Some(0),
            packages_added: Some(2),
            packages_removed: Some(1),
        });
        s
    }

    #[test]
    fn the_package_column_names_the_package_or_why_not() {
        use crate::types::{InstalledPackage, PackagePresence, PackageState};
        let installed = PackagePresence {
            name: "xz".into(),
            evr: Some("5.6.1-1.1".into()),
            arch: Some("x86_64".into()),
            ..PackagePresence::default()
        };
        let several = PackagePresence {
            installed: vec![
                InstalledPackage {
                    evr: "5.6.1-1.1".into(),
                    arch: "x86_64".into(),
                },
                InstalledPackage {
                    evr: "5.6.0-1.1".into(),
                    arch: "i586".into(),
                },
            ],
            ..installed.clone()
        };
        let absent = PackagePresence::without("xz", PackageState::Absent);
        let mut table = summaries_table(
            &[item(), item(), item(), item()],
            false,
            IncludeObject::None,
            now(),
        );
        let columns = table.column_definitions.len();
        add_package_column(
            &mut table,
            [Some(&installed), Some(&several), Some(&absent), None],
        );
        assert_eq!(table.column_definitions.len(), columns + 1);
        assert_eq!(table.column_definitions[columns].name, "Package");
        let cells: Vec<_> = table
            .rows
            .iter()
            .map(|r| r.cells[columns].clone())
            .collect();
        assert_eq!(
            cells,
            [
                json!("xz-5.6.1-1.1.x86_64"),
                json!("xz-5.6.1-1.1.x86_64 (+1)"),
                json!("xz (Absent)"),
                Value::Null
            ]
        );
    }

    #[test]
    fn human_duration_matches_apimachinery() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 4 * 60, "3h4m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (5 * 86400, "5d"),
            (5 * 86400 + 3600, "5d1h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (731 * 86400, "2y1d"),
            (8 * 365 * 86400, "8y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn age_from_creation_timestamp() {
        assert_eq!(age(Some("2024-06-05T12:00:00Z"), now()), "5d");
        assert_eq!(age(Some("2024-06-10T08:56:00Z"), now()), "3h4m");
        assert_eq!(age(None, now()), "<unknown>");
        assert_eq!(age(Some("yesterday"), now()), "<unknown>");
    }

    #[test]
    fn narrow_table_v1() {
        let t = summaries_table(&[item()], false, IncludeObject::Metadata, now());
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["kind"], "Table");
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(v["metadata"], json!({"resourceVersion": ""}));
        let names: Vec<&str> = t.column_definitions.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "Name",
                "Channel",
                "Version",
                "Advisories",
                "Security",
                "CVEs",
                "Severity",
                "Age"
            ]
        );
        assert_eq!(
            v["columnDefinitions"][0],
            json!({"name": "Name", "type": "string", "format": "name", "description": "Name of the ManagedOSVersion.", "priority": 0})
        );
        assert_eq!(
            v["rows"][0]["cells"],
            json!(["v2-0-1", "sl-micro", "v2.0.1", 7, 3, 11, "important", "5d"])
        );
        assert_eq!(
            v["rows"][0]["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"name": "v2-0-1", "namespace": "fleet-default", "creationTimestamp": "2024-06-05T12:00:00Z"}})
        );
    }

    #[test]
    fn wide_table_and_unavailable_rows() {
        let mut missing = ManagedOSVersionChangelogSummary::new();
        missing.metadata.name = "v3".into();
        missing.reason = Some(UnavailableReason::NotFetched);
        let t = summaries_table(&[item(), missing], true, IncludeObject::None, now());
        assert_eq!(t.column_definitions.len(), 13);
        assert!(t.column_definitions[8..].iter().all(|c| c.priority == 1));
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(
            v["rows"][0]["cells"],
            json!([
                "v2-0-1",
                "sl-micro",
                "v2.0.1",
                7,
                3,
                11,
                "important",
                "5d",
                "v2-0-0",
                "20/2/1",
                true,
                null,
                "sha256:0123456789ab"
            ])
        );
        assert_eq!(
            v["rows"][1]["cells"],
            json!([
                "v3",
                "",
                "",
                null,
                null,
                null,
                null,
                "<unknown>",
                null,
                null,
                false,
                "NotFetched",
                null
            ])
        );
        assert!(v["rows"][0].get("object").is_none());
        for row in &t.rows {
            assert_eq!(row.cells.len(), t.column_definitions.len());
        }
    }

    #[test]
    fn include_full_object_and_v1beta1() {
        let t = summaries_table_version(
            &[item()],
            false,
            TableVersion::V1Beta1,
            IncludeObject::Object,
            now(),
        );
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1beta1");
        assert_eq!(
            v["rows"][0]["object"],
            serde_json::to_value(item()).unwrap()
        );
        let t = summaries_table_version(
            &[item()],
            false,
            TableVersion::V1Beta1,
            IncludeObject::Metadata,
            now(),
        );
        assert_eq!(
            t.rows[0].object.as_ref().unwrap()["apiVersion"],
            "meta.k8s.io/v1beta1"
        );
    }

    #[test]
    fn empty_list_has_empty_rows_not_null() {
        let v = serde_json::to_value(summaries_table(&[], false, IncludeObject::Metadata, now()))
            .unwrap();
        assert_eq!(v["rows"], json!([]));
    }

    #[test]
    fn short_digests() {
        assert_eq!(short_digest("sha256:abc"), "sha256:abc");
        assert_eq!(short_digest("abcdef0123456789"), "abcdef012345");
    }
}
