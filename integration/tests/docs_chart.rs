//! docs/install.md against the chart it documents, in both directions, each mismatch named
//! with the file and line to fix:
//!
//! - the values table: every value of `values.yaml` is covered by a row (a row names a
//!   value, or a map whose values it covers, or `x.*`), and every value a row names exists;
//! - the questions table: one row per question of `questions.yaml`, with its group, label
//!   and variable, and no row for a question the form does not ask;
//! - the `Chart.yaml` annotations table: each annotation named has the value written;
//! - "What gets installed": every kind of object the chart renders (every option on, on
//!   Rancher) is named there or in the RBAC table.
//!
//! Offline: reads files and runs the test bed's `helm template` (`make tools`).

use std::collections::BTreeSet;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::markdown::{Document, code_spans};
use elemental_changelog_integration::testbed::{tools_dir, workspace_root};
use serde::Deserialize as _;
use serde_yaml::Value;

const CHART: &str = "charts/elemental-changelog";

fn yaml(path: &str) -> Result<Value> {
    let full = workspace_root().join(path);
    let text = std::fs::read_to_string(&full).with_context(|| format!("{}", full.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("{}", full.display()))
}

/// The values of a values file, dotted: a scalar, a list or an empty map is one value;
/// a map with keys is its keys' values.
fn leaves(node: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match node {
        Value::Mapping(map) if !map.is_empty() => {
            for (key, value) in map {
                let key = key.as_str().unwrap_or_default();
                let path = if prefix.is_empty() {
                    key.to_owned()
                } else {
                    format!("{prefix}.{key}")
                };
                leaves(value, &path, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

/// Whether the dotted `path` exists in `values`.
fn exists(values: &Value, path: &str) -> bool {
    let mut node = values;
    for part in path.split('.') {
        match node.as_mapping().and_then(|m| m.get(part)) {
            Some(next) => node = next,
            None => return false,
        }
    }
    true
}

/// What a values-table name covers: itself and everything under it (`x.*` is `x`).
fn covers(name: &str, leaf: &str) -> bool {
    let name = name.trim_end_matches(".*");
    leaf == name || leaf.starts_with(&format!("{name}."))
}

/// The problems of install.md's values table against `values`.
fn values_problems(doc: &Document, values: &Value) -> Result<Vec<String>> {
    let tables = doc.tables_with_header(&["value", "default", "meaning"]);
    ensure!(
        tables.len() == 1,
        "{}: expected one table headed | value | default | meaning |, found {}",
        doc.path,
        tables.len()
    );
    let mut problems = Vec::new();
    let mut named = Vec::new();
    for row in &tables[0].rows {
        let first = row.cells.first().map(String::as_str).unwrap_or_default();
        let names = code_spans(first);
        if names.is_empty() {
            problems.push(format!("{}: a row that names no value", doc.at(row.line)));
        }
        for name in names {
            if !exists(values, name.trim_end_matches(".*")) {
                problems.push(format!(
                    "{}: `{name}` is not a value of {CHART}/values.yaml",
                    doc.at(row.line)
                ));
            }
            named.push(name.to_owned());
        }
    }
    let mut all = BTreeSet::new();
    leaves(values, "", &mut all);
    for leaf in all {
        if !named.iter().any(|name| covers(name, &leaf)) {
            problems.push(format!(
                "{}: the value `{leaf}` of {CHART}/values.yaml has no row in the values table (line {})",
                doc.path, tables[0].line
            ));
        }
    }
    Ok(problems)
}

#[test]
fn install_md_documents_every_value_and_only_values() -> Result<()> {
    let doc = Document::read("docs/install.md")?;
    let values = yaml(&format!("{CHART}/values.yaml"))?;
    let problems = values_problems(&doc, &values)?;
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // The comparison fails on a value added to values.yaml without a row, and on a row
    // naming a value that is gone.
    let mut more = values.clone();
    more["server"]["newSetting"] = Value::from(1);
    ensure!(
        values_problems(&doc, &more)?
            .iter()
            .any(|p| p.contains("`server.newSetting`")),
        "a new value went unnoticed"
    );
    let mut fewer = values.clone();
    fewer
        .as_mapping_mut()
        .context("values")?
        .remove("clusterDomain");
    ensure!(
        values_problems(&doc, &fewer)?
            .iter()
            .any(|p| p.contains("`clusterDomain` is not a value")),
        "a removed value went unnoticed"
    );
    Ok(())
}

/// One question of the form: group (a subquestion's is its parent's), label, variable.
fn questions() -> Result<Vec<(String, String, String)>> {
    let file = yaml(&format!("{CHART}/questions.yaml"))?;
    let mut out = Vec::new();
    let text = |v: &Value, what: &str| -> Result<String> {
        v.as_str()
            .map(str::to_owned)
            .with_context(|| format!("questions.yaml: no {what} in {v:?}"))
    };
    for q in file["questions"].as_sequence().context("no questions")? {
        let group = text(&q["group"], "group")?;
        out.push((
            group.clone(),
            text(&q["label"], "label")?,
            text(&q["variable"], "variable")?,
        ));
        for sub in q["subquestions"].as_sequence().into_iter().flatten() {
            out.push((
                group.clone(),
                text(&sub["label"], "label")?,
                text(&sub["variable"], "variable")?,
            ));
        }
    }
    Ok(out)
}

fn questions_problems(
    doc: &Document,
    questions: &[(String, String, String)],
) -> Result<Vec<String>> {
    let tables = doc.tables_with_header(&["group", "question", "value"]);
    ensure!(
        tables.len() == 1,
        "{}: expected one table headed | group | question | value |, found {}",
        doc.path,
        tables.len()
    );
    let table = &tables[0];
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for row in &table.rows {
        let [group, label, value, ..] = row.cells.as_slice() else {
            problems.push(format!("{}: expected three cells", doc.at(row.line)));
            continue;
        };
        let variable = code_spans(value).first().copied().unwrap_or_default();
        match questions.iter().find(|(_, _, v)| v == variable) {
            None => problems.push(format!(
                "{}: `{variable}` is no question of {CHART}/questions.yaml",
                doc.at(row.line)
            )),
            Some((g, l, _)) => {
                if g != group || l != label {
                    problems.push(format!(
                        "{}: `{variable}` is asked as \"{l}\" in group \"{g}\", the table says \"{label}\" in \"{group}\"",
                        doc.at(row.line)
                    ));
                }
                seen.insert(variable.to_owned());
            }
        }
    }
    for (group, label, variable) in questions {
        if !seen.contains(variable) {
            problems.push(format!(
                "{}: the question \"{label}\" (`{variable}`, group {group}) of {CHART}/questions.yaml has no row in the questions table (line {})",
                doc.path, table.line
            ));
        }
    }
    Ok(problems)
}

#[test]
fn install_md_lists_every_question_of_the_form() -> Result<()> {
    let doc = Document::read("docs/install.md")?;
    let questions = questions()?;
    let problems = questions_problems(&doc, &questions)?;
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // The comparison fails on a question without a row (the "Kept channel data" question
    // was missing), and on a row whose label drifted.
    let mut more = questions.clone();
    more.push(("Memory".into(), "New".into(), "server.newSetting".into()));
    ensure!(
        questions_problems(&doc, &more)?
            .iter()
            .any(|p| p.contains("`server.newSetting`")),
        "a new question went unnoticed"
    );
    let renamed: Vec<_> = questions
        .iter()
        .map(|(g, l, v)| {
            let l = if v == "server.maxKeptTotal" {
                "Other"
            } else {
                l
            };
            (g.clone(), l.to_owned(), v.clone())
        })
        .collect();
    ensure!(
        questions_problems(&doc, &renamed)?
            .iter()
            .any(|p| p.contains("\"Other\"")),
        "a relabelled question went unnoticed"
    );
    Ok(())
}

#[test]
fn install_md_quotes_the_chart_annotations() -> Result<()> {
    let doc = Document::read("docs/install.md")?;
    let chart = yaml(&format!("{CHART}/Chart.yaml"))?;
    let tables = doc.tables_with_header(&["annotation", "value", "effect"]);
    ensure!(
        tables.len() == 1,
        "{}: expected one table headed | annotation | value | effect |",
        doc.path
    );
    let mut problems = Vec::new();
    for row in &tables[0].rows {
        // `catalog.cattle.io/kube-version`, `rancher-version` | `>= 1.30.0-0`, `>= 2.10.0-0`:
        // keys after the first share its prefix; one value may serve every key.
        let keys = code_spans(&row.cells[0]);
        let values = code_spans(&row.cells[1]);
        let prefix = keys
            .first()
            .and_then(|k| k.rsplit_once('/'))
            .map(|(p, _)| p)
            .unwrap_or_default();
        for (index, key) in keys.iter().enumerate() {
            let key = if key.contains('/') {
                (*key).to_owned()
            } else {
                format!("{prefix}/{key}")
            };
            let written = if values.len() == 1 {
                values[0]
            } else {
                values.get(index).copied().unwrap_or_default()
            };
            let actual = chart["annotations"][key.as_str()].as_str();
            if actual != Some(written) {
                problems.push(format!(
                    "{}: {key} is {actual:?} in {CHART}/Chart.yaml, the table says `{written}`",
                    doc.at(row.line)
                ));
            }
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// The kinds of the objects `helm template` renders with `args`.
fn rendered_kinds(args: &[&str]) -> Result<BTreeSet<String>> {
    let home = tempfile::tempdir()?;
    let chart = workspace_root().join(CHART);
    let output = std::process::Command::new(tools_dir().join("helm"))
        .args(["template", "elemental-changelog"])
        .arg(&chart)
        .args(["--namespace", "cattle-elemental-system"])
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env("KUBECONFIG", home.path().join("none"))
        .output()
        .context("running the test bed's helm (make tools)")?;
    ensure!(
        output.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut kinds = BTreeSet::new();
    for document in serde_yaml::Deserializer::from_str(std::str::from_utf8(&output.stdout)?) {
        let value = Value::deserialize(document)?;
        if let Some(kind) = value["kind"].as_str() {
            kinds.insert(kind.to_owned());
        }
    }
    Ok(kinds)
}

#[test]
fn install_md_names_every_kind_the_chart_installs() -> Result<()> {
    let rancher = [
        "--api-versions",
        "catalog.cattle.io/v1/UIPlugin",
        "--api-versions",
        "management.cattle.io/v3/RoleTemplate",
        "--api-versions",
        "management.cattle.io/v3/GlobalRole",
        "--set",
        "serviceMonitor.enabled=true,networkPolicy.enabled=true",
    ];
    let mut kinds = rendered_kinds(&rancher)?;
    let mut cert_manager = rancher.to_vec();
    cert_manager.extend(["--set", "tls.certManager.enabled=true"]);
    kinds.extend(rendered_kinds(&cert_manager)?);
    let mut own = rancher.to_vec();
    own.extend(["--set", "tls.existingSecret=mine,tls.caBundle=x"]);
    kinds.extend(rendered_kinds(&own)?);
    ensure!(
        kinds.contains("UIPlugin") && kinds.contains("Issuer"),
        "{kinds:?}"
    );

    let doc = Document::read("docs/install.md")?;
    let mut named = String::new();
    for header in [["object", "purpose"], ["object", "grants"]] {
        for table in doc.tables_with_header(&header) {
            for row in table.rows {
                named.push_str(&row.cells[0]);
                named.push('\n');
            }
        }
    }
    let words: BTreeSet<&str> = named.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    let missing: Vec<&String> = kinds
        .iter()
        .filter(|k| !words.contains(k.as_str()) && !words.contains(format!("{k}s").as_str()))
        .collect();
    ensure!(
        missing.is_empty(),
        "{}: the chart installs {missing:?}, which neither \"What gets installed\" nor the RBAC table names",
        doc.path
    );
    Ok(())
}
