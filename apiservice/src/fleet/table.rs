//! `meta.k8s.io` `Table` of machines, for
//! `kubectl get machineinventories.changelog.elemental.cattle.io`.
//!
//! Always: name, current version, target version, advisories, security, CVEs,
//! highest severity, state, and last the age (the MachineInventory's creation timestamp,
//! typed `date`: see [`crate::table`]). `-o wide` (`priority: 1`): channel, target source,
//! reason. With `?cve=`: the CVE state and the first fixing version, before the age.

use serde_json::{Value, json};

use super::MachineInventoryChangelogSummary;
use crate::content::{IncludeObject, TableVersion};
use crate::table::{AGE, ColumnDefinition, Row, Table, TableMeta, age, column, row_object};

const COLUMNS: [ColumnDefinition; 8] = [
    column("Name", "string", "name", "Name of the MachineInventory.", 0),
    column(
        "Current",
        "string",
        "",
        "OS version the machine runs (spec.version of its ManagedOSVersion).",
        0,
    ),
    column(
        "Target",
        "string",
        "",
        "OS version the machine would be upgraded to.",
        0,
    ),
    column(
        "Advisories",
        "integer",
        "",
        "Number of advisories between the current and the target version.",
        0,
    ),
    column(
        "Security",
        "integer",
        "",
        "Number of security advisories pending.",
        0,
    ),
    column(
        "CVEs",
        "integer",
        "",
        "Distinct CVEs fixed by the upgrade.",
        0,
    ),
    column(
        "Severity",
        "string",
        "",
        "Highest severity of the pending advisories.",
        0,
    ),
    column(
        "State",
        "string",
        "",
        "UpToDate, UpdatesAvailable or Unknown.",
        0,
    ),
];

const CVE_COLUMNS: [ColumnDefinition; 2] = [
    column(
        "CVE",
        "string",
        "",
        "Fixed, Exposed, NoFixInChannel or Unknown for the CVE asked for.",
        0,
    ),
    column(
        "Fixed In",
        "string",
        "",
        "First version of the machine's channel that fixes the CVE.",
        0,
    ),
];

const WIDE_COLUMNS: [ColumnDefinition; 3] = [
    column(
        "Channel",
        "string",
        "",
        "ManagedOSVersionChannel of the current version.",
        1,
    ),
    column(
        "Source",
        "string",
        "",
        "Where the target comes from: ManagedOSImage or NewestInChannel.",
        1,
    ),
    column(
        "Reason",
        "string",
        "",
        "Why the state is what it is, when that needs explaining.",
        1,
    ),
];

fn wire<T: serde::Serialize>(v: Option<T>) -> Value {
    v.and_then(|v| serde_json::to_value(v).ok())
        .unwrap_or(Value::Null)
}

/// One machine's row (the rows of [`machines_table`], one at a time: a server writes a large
/// Table row by row).
pub fn row(
    item: &MachineInventoryChangelogSummary,
    wide: bool,
    cve: bool,
    version: TableVersion,
    include_object: IncludeObject,
) -> Row {
    let summary = item.summary.as_ref();
    let count = |f: fn(&crate::types::ChangelogSummary) -> usize| {
        summary.map_or(Value::Null, |s| json!(f(s)))
    };
    let text = |s: &str| json!(crate::render::terminal_safe(s));
    let mut cells = vec![
        text(&item.metadata.name),
        item.current
            .as_ref()
            .map_or(Value::Null, |c| text(&c.version)),
        item.target
            .as_ref()
            .map_or(Value::Null, |t| text(&t.version)),
        count(|s| s.advisories),
        count(|s| s.by_type.get("security").copied().unwrap_or_default()),
        count(|s| s.cves),
        summary.map_or(Value::Null, |s| json!(s.highest_severity.as_str())),
        wire(Some(item.state)),
    ];
    if cve {
        let block = item.cve.as_ref();
        cells.push(wire(block.map(|c| c.state)));
        cells.push(
            block
                .and_then(|c| c.fixed_in.as_ref())
                .map_or(Value::Null, |f| text(&f.version)),
        );
    }
    cells.push(age(item.metadata.creation_timestamp.as_deref()));
    if wide {
        cells.extend([
            item.current
                .as_ref()
                .map_or(Value::Null, |c| text(&c.channel)),
            wire(item.target.as_ref().map(|t| t.source)),
            wire(item.reason),
        ]);
    }
    let object = row_object(include_object, version, &item.metadata, item);
    Row { cells, object }
}

/// A Table of machines in a chosen `meta.k8s.io` version. `wide` adds the
/// `priority: 1` columns; `cve` (a `?cve=` request) adds the CVE state and
/// its first fixing version.
pub fn machines_table(
    items: &[MachineInventoryChangelogSummary],
    wide: bool,
    cve: bool,
    version: TableVersion,
    include_object: IncludeObject,
) -> Table {
    let cve_columns: &[ColumnDefinition] = if cve { &CVE_COLUMNS } else { &[] };
    let wide_columns: &[ColumnDefinition] = if wide { &WIDE_COLUMNS } else { &[] };
    Table {
        kind: "Table",
        api_version: version.api_version(),
        metadata: TableMeta::default(),
        column_definitions: COLUMNS
            .iter()
            .chain(cve_columns)
            .chain([&AGE])
            .chain(wide_columns)
            .cloned()
            .collect(),
        rows: items
            .iter()
            .map(|i| row(i, wide, cve, version, include_object))
            .collect(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fleet::{
        ChannelVersion, CveState, MachineCve, MachineReason, MachineState, MachineTarget,
        TargetSource,
    };
    use crate::types::{ChangelogSummary, Severity, VersionRef};

    fn pending() -> MachineInventoryChangelogSummary {
        let mut m = MachineInventoryChangelogSummary::new();
        m.metadata.name = "m-1".into();
        m.metadata.namespace = "fleet-default".into();
        m.metadata.creation_timestamp = Some("2024-06-05T12:00:00Z".into());
        m.current = Some(ChannelVersion {
            name: "v2-0".into(),
            version: "v2.0".into(),
            channel: "sl-micro".into(),
        });
        m.target = Some(MachineTarget {
            name: "v2-1".into(),
            version: "v2.1".into(),
            channel: "sl-micro".into(),
            source: TargetSource::ManagedOSImage,
            managed_os_image: Some("upgrade".into()),
            ..MachineTarget::default()
        });
        m.state = MachineState::UpdatesAvailable;
        m.summary = Some(ChangelogSummary {
            advisories: 4,
            by_type: [("security".to_owned(), 3)].into(),
            cves: 5,
            highest_severity: Severity::Critical,
            ..ChangelogSummary::default()
        });
        m.cve = Some(MachineCve {
            id: "CVE-2024-1".into(),
            state: CveState::Exposed,
            fixed_in: Some(VersionRef {
                name: "v2-1".into(),
                version: "v2.1".into(),
            }),
        });
        m
    }

    fn unknown() -> MachineInventoryChangelogSummary {
        let mut m = MachineInventoryChangelogSummary::new();
        m.metadata.name = "m-2\x1b".into();
        m.reason = Some(MachineReason::NoAnnotation);
        m.cve = Some(MachineCve {
            id: "CVE-2024-1".into(),
            state: CveState::Unknown,
            fixed_in: None,
        });
        m
    }

    fn names(t: &Table) -> Vec<&str> {
        t.column_definitions.iter().map(|c| c.name).collect()
    }

    #[test]
    fn narrow() {
        let t = machines_table(
            &[pending(), unknown()],
            false,
            false,
            TableVersion::V1,
            IncludeObject::Metadata,
        );
        assert_eq!(
            names(&t),
            [
                "Name",
                "Current",
                "Target",
                "Advisories",
                "Security",
                "CVEs",
                "Severity",
                "State",
                "Age"
            ]
        );
        assert!(t.column_definitions.iter().all(|c| c.priority == 0));
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(
            v["rows"][0]["cells"],
            json!([
                "m-1",
                "v2.0",
                "v2.1",
                4,
                3,
                5,
                "critical",
                "UpdatesAvailable",
                "2024-06-05T12:00:00Z"
            ])
        );
        // Unknown machines print <none> where nothing is known; control
        // characters in names are escaped.
        assert_eq!(
            v["rows"][1]["cells"],
            json!([
                "m-2\\x1b", null, null, null, null, null, null, "Unknown", null
            ])
        );
        assert_eq!(
            v["rows"][0]["object"]["kind"],
            json!("PartialObjectMetadata")
        );
    }

    #[test]
    fn wide_with_cve_and_object() {
        let t = machines_table(
            &[pending(), unknown()],
            true,
            true,
            TableVersion::V1Beta1,
            IncludeObject::Object,
        );
        assert_eq!(
            names(&t),
            [
                "Name",
                "Current",
                "Target",
                "Advisories",
                "Security",
                "CVEs",
                "Severity",
                "State",
                "CVE",
                "Fixed In",
                "Age",
                "Channel",
                "Source",
                "Reason"
            ]
        );
        let priorities: Vec<i32> = t.column_definitions.iter().map(|c| c.priority).collect();
        assert_eq!(priorities, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]);
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1beta1");
        let row0 = v["rows"][0]["cells"].as_array().unwrap();
        assert_eq!(
            row0[8..],
            [
                json!("Exposed"),
                json!("v2.1"),
                json!("2024-06-05T12:00:00Z"),
                json!("sl-micro"),
                json!("ManagedOSImage"),
                Value::Null
            ]
        );
        let row1 = v["rows"][1]["cells"].as_array().unwrap();
        assert_eq!(
            row1[8..],
            [
                json!("Unknown"),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                json!("NoAnnotation")
            ]
        );
        assert_eq!(
            v["rows"][0]["object"]["kind"],
            "MachineInventoryChangelogSummary"
        );
        for row in v["rows"].as_array().unwrap() {
            assert_eq!(row["cells"].as_array().unwrap().len(), 14);
        }
    }

    #[test]
    fn no_object() {
        let t = machines_table(
            &[pending()],
            false,
            false,
            TableVersion::V1,
            IncludeObject::None,
        );
        assert!(t.rows[0].object.is_none());
        assert_eq!(t.rows[0].cells.len(), t.column_definitions.len());
    }
}
