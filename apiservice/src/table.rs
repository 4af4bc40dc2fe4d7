//! `meta.k8s.io` `Table` of changelog summaries, for `kubectl get`.
//!
//! Column names are written as kube-apiserver writes them (`Name`, `Age`);
//! kubectl prints them upper-cased. Columns with `priority: 1` are shown by
//! `kubectl get -o wide` only.
//!
//! `Age` is typed `date`, as CRDs type it, and its cell is the creation timestamp itself, not
//! a duration since: a Table is cached by clients (Steve's SQL cache keeps the cells of every
//! row it lists), and a duration computed when the Table was made stays what it was, while a
//! timestamp stays true. kubectl prints the cell as it is.

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

/// The `Age` column: typed `date` as CRDs type it; its cell is the creation timestamp ([`age`]).
pub(crate) const AGE: ColumnDefinition = column(
    "Age",
    "date",
    "",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
    0,
);

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
    AGE,
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

/// The `Age` cell: the creation timestamp (RFC 3339), `null` when unknown.
pub(crate) fn age(creation_timestamp: Option<&str>) -> Value {
    creation_timestamp.map_or(Value::Null, |t| json!(t))
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
        age(item.metadata.creation_timestamp.as_deref()),
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
) -> Table {
    summaries_table_version(items, wide, TableVersion::V1, include_object)
}

/// [`summaries_table`] in a chosen `meta.k8s.io` version.
pub fn summaries_table_version(
    items: &[ManagedOSVersionChangelogSummary],
    wide: bool,
    version: TableVersion,
    include_object: IncludeObject,
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
            .map(|i| row(i, wide, version, include_object))
            .collect(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::{ChangelogSummary, Severity, UnavailableReason, VersionRef};

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
    fn age_is_the_creation_timestamp_typed_date() {
        assert_eq!(
            age(Some("2024-06-05T12:00:00Z")),
            json!("2024-06-05T12:00:00Z")
        );
        assert_eq!(age(None), Value::Null);
        let column = COLUMNS.iter().find(|c| c.name == "Age").unwrap();
        assert_eq!((column.type_, column.format), ("date", ""));
    }

    #[test]
    fn narrow_table_v1() {
        let t = summaries_table(&[item()], false, IncludeObject::Metadata);
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
            json!([
                "v2-0-1",
                "sl-micro",
                "v2.0.1",
                7,
                3,
                11,
                "important",
                "2024-06-05T12:00:00Z"
            ])
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
        let t = summaries_table(&[item(), missing], true, IncludeObject::None);
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
                "2024-06-05T12:00:00Z",
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
                null,
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
        );
        assert_eq!(
            t.rows[0].object.as_ref().unwrap()["apiVersion"],
            "meta.k8s.io/v1beta1"
        );
    }

    #[test]
    fn empty_list_has_empty_rows_not_null() {
        let v = serde_json::to_value(summaries_table(&[], false, IncludeObject::Metadata)).unwrap();
        assert_eq!(v["rows"], json!([]));
    }

    #[test]
    fn short_digests() {
        assert_eq!(short_digest("sha256:abc"), "sha256:abc");
        assert_eq!(short_digest("abcdef0123456789"), "abcdef012345");
    }
}
