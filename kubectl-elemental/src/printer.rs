//! Prints a `meta.k8s.io` `Table` the way `kubectl get` does (its table
//! printer and `text/tabwriter` settings), so `kubectl elemental versions`
//! and `kubectl get managedosversions.changelog.elemental.cattle.io` agree.

use elemental_changelog_apiservice::render;
use serde::Deserialize;
use serde_json::Value;

/// kubectl's tabwriter: minimum cell width 6, padding 3.
const MIN_WIDTH: usize = 6;
const PADDING: usize = 3;

/// The parts of a `Table` a printer reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    /// Column definitions.
    pub column_definitions: Vec<Column>,
    /// Rows.
    #[serde(default)]
    pub rows: Vec<Row>,
}

/// A column definition.
#[derive(Debug, Deserialize)]
pub struct Column {
    /// Title.
    pub name: String,
    /// 0: always shown; more: `-o wide` only.
    #[serde(default)]
    pub priority: i32,
}

/// A row.
#[derive(Debug, Deserialize)]
pub struct Row {
    /// One cell per column.
    pub cells: Vec<Value>,
    /// The row's object (a `PartialObjectMetadata` by default).
    #[serde(default)]
    pub object: Option<Value>,
}

/// How to print.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Also the columns of priority above 0 (`-o wide`).
    pub wide: bool,
    /// A first `NAMESPACE` column from each row's object (`-A`).
    pub with_namespace: bool,
}

/// kubectl's rendering of one cell: null is empty, a string is cut at its
/// first line break (with `...`), anything else is printed as JSON.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => {
            let line = match s.find(['\n', '\r', '\x0c']) {
                Some(i) => format!("{}...", &s[..i]),
                None => s.clone(),
            };
            // The server escapes what it sends; a cell from elsewhere is escaped here.
            render::terminal_safe(&line).into_owned()
        }
        other => other.to_string(),
    }
}

/// The table as `kubectl get` prints it; empty when it has no rows (kubectl
/// then prints "No resources found" on stderr instead).
pub fn render(table: &Table, options: Options) -> String {
    let shown: Vec<usize> = table
        .column_definitions
        .iter()
        .enumerate()
        .filter(|(_, c)| options.wide || c.priority == 0)
        .map(|(i, _)| i)
        .collect();
    let mut lines: Vec<Vec<String>> = Vec::with_capacity(table.rows.len() + 1);
    let mut header = Vec::new();
    if options.with_namespace {
        header.push("NAMESPACE".to_owned());
    }
    header.extend(
        shown
            .iter()
            .map(|&i| table.column_definitions[i].name.to_uppercase()),
    );
    lines.push(header);
    for row in &table.rows {
        let mut line = Vec::new();
        if options.with_namespace {
            let namespace = row
                .object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/namespace"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            line.push(namespace.to_owned());
        }
        line.extend(
            shown
                .iter()
                .map(|&i| row.cells.get(i).map(cell).unwrap_or_default()),
        );
        lines.push(line);
    }
    if table.rows.is_empty() {
        return String::new();
    }
    tabulate(&lines)
}

/// Go's `text/tabwriter` with kubectl's settings, on lines of equal length:
/// every cell but the last of a line padded to its column's width.
fn tabulate(lines: &[Vec<String>]) -> String {
    let columns = lines.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            lines
                .iter()
                .filter_map(|l| l.get(c))
                .map(|s| s.chars().count() + PADDING)
                .max()
                .unwrap_or(0)
                .max(MIN_WIDTH)
        })
        .collect();
    let mut out = String::new();
    for line in lines {
        for (c, text) in line.iter().enumerate() {
            out.push_str(text);
            if c + 1 < line.len() {
                let pad = widths[c].saturating_sub(text.chars().count());
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table() -> Table {
        serde_json::from_value(json!({
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": ""},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0},
                {"name": "Advisories", "type": "integer", "format": "", "description": "", "priority": 0},
                {"name": "From", "type": "string", "format": "", "description": "", "priority": 1},
                {"name": "Available", "type": "boolean", "format": "", "description": "", "priority": 1}
            ],
            "rows": [
                {"cells": ["sl-micro-6.1-base-v2.2.0-4.5", 12, "v2.1.0", true],
                 "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "a", "namespace": "fleet-default"}}},
                {"cells": ["v1", null, null, false],
                 "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "v1", "namespace": "edge"}}}
            ]
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn like_kubectl_get() {
        assert_eq!(
            render(&table(), Options::default()),
            "NAME                           ADVISORIES\n\
             sl-micro-6.1-base-v2.2.0-4.5   12\n\
             v1                             \n"
        );
    }

    #[test]
    fn wide_and_all_namespaces() {
        assert_eq!(
            render(
                &table(),
                Options {
                    wide: true,
                    with_namespace: true
                }
            ),
            "NAMESPACE       NAME                           ADVISORIES   FROM     AVAILABLE\n\
             fleet-default   sl-micro-6.1-base-v2.2.0-4.5   12           v2.1.0   true\n\
             edge            v1                                                   false\n"
        );
    }

    #[test]
    fn short_columns_take_the_minimum_width_and_line_breaks_are_cut() {
        let t: Table = serde_json::from_value(json!({
            "columnDefinitions": [{"name": "A"}, {"name": "B"}],
            "rows": [{"cells": ["x", "two\nlines"]}]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(render(&t, Options::default()), "A     B\nx     two...\n");
    }

    #[test]
    fn no_rows_prints_nothing() {
        let t: Table =
            serde_json::from_value(json!({"columnDefinitions": [{"name": "A"}], "rows": []}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(render(&t, Options::default()), "");
    }
}
