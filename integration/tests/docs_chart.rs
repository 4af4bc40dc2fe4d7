//! docs/install.md against the chart it documents, in both directions, each mismatch named
//! with the file and line to fix:
//!
//! - the values table: every value of `values.yaml` is covered by a row (a row names a
//!   value, or a map whose values it covers, or `x.*`), and every value a row names exists;
//! - the questions table: one row per question of `questions.yaml`, with its group, label
//!   and variable, and no row for a question the form does not ask;
//! - the `Chart.yaml` annotations table: each annotation named has the value written;
//! - "What gets installed": every kind of object the chart renders (every option on, on
//!   Rancher) is named there or in the RBAC table;
//! - the RBAC tables (install.md's ClusterRole rows, api.md's `| to | rule |` tables and its
//!   ClusterRole example) grant exactly the verbs and resources of the chart's rendered
//!   ClusterRoles.
//!
//! Offline: reads files and runs the test bed's `helm template` (`make tools`).

use std::collections::{BTreeMap, BTreeSet};

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

/// The objects `helm template` renders with `args`.
fn rendered(args: &[&str]) -> Result<Vec<Value>> {
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
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(std::str::from_utf8(&output.stdout)?) {
        objects.push(Value::deserialize(document)?);
    }
    Ok(objects)
}

/// The kinds of the objects `helm template` renders with `args`.
fn rendered_kinds(args: &[&str]) -> Result<BTreeSet<String>> {
    Ok(rendered(args)?
        .iter()
        .filter_map(|o| o["kind"].as_str().map(str::to_owned))
        .collect())
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
        "serviceMonitor.enabled=true,networkPolicy.enabled=true,networkPolicy.from[0].ipBlock.cidr=192.0.2.0/24",
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

/// What a role grants: (verb, resource or non-resource URL) pairs.
type Grants = BTreeSet<(String, String)>;

/// The grants of every rule of `rules` (a role's `rules`).
fn rule_grants(rules: &Value) -> Grants {
    let strings = |v: &Value| -> Vec<String> {
        v.as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    let mut grants = Grants::new();
    for rule in rules.as_sequence().into_iter().flatten() {
        let mut targets = strings(&rule["resources"]);
        targets.extend(strings(&rule["nonResourceURLs"]));
        for verb in strings(&rule["verbs"]) {
            for target in &targets {
                grants.insert((verb.clone(), target.clone()));
            }
        }
    }
    grants
}

/// The ClusterRoles the chart renders with its default values, by name.
fn rendered_cluster_roles() -> Result<BTreeMap<String, Grants>> {
    Ok(rendered(&[])?
        .iter()
        .filter(|o| o["kind"] == "ClusterRole")
        .filter_map(|o| {
            Some((
                o["metadata"]["name"].as_str()?.to_owned(),
                rule_grants(&o["rules"]),
            ))
        })
        .collect())
}

const VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// The grants a cell of prose states, up to its first sentence's end: code spans that are
/// verbs apply to the code spans after them that are resources (`get`, `list` on `a` and `b`;
/// `get` / `watch` on `c`), API groups (a span with a dot and no slash) left out.
fn prose_grants(cell: &str) -> Grants {
    let mut grants = Grants::new();
    let mut verbs: Vec<&str> = Vec::new();
    let mut after_resource = false;
    for (at, part) in cell.split('`').enumerate() {
        if at % 2 == 0 {
            if part.contains(". ") || part.trim_end().ends_with('.') {
                break;
            }
            continue;
        }
        if part.contains('.') && !part.contains('/') {
            continue;
        }
        if VERBS.contains(&part) {
            if after_resource {
                verbs.clear();
                after_resource = false;
            }
            verbs.push(part);
        } else if !verbs.is_empty() {
            after_resource = true;
            for verb in &verbs {
                grants.insert(((*verb).to_owned(), part.to_owned()));
            }
        }
    }
    grants
}

/// The release's full name for the docs' `<fullname>` (`helm template elemental-changelog`).
const FULLNAME: &str = "elemental-changelog";

/// install.md's RBAC rows for ClusterRoles, and api.md's RBAC tables and example, against
/// `roles`; the problems, with the lines to fix.
fn rbac_problems(
    install: &Document,
    api: &Document,
    roles: &BTreeMap<String, Grants>,
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let tables = install.tables_with_header(&["object", "grants"]);
    ensure!(
        tables.len() == 1,
        "{}: no | object | grants | table",
        install.path
    );
    let mut checked = 0;
    for row in &tables[0].rows {
        if !row.cells[0].contains("ClusterRole ") && !row.cells[0].starts_with("ClusterRole") {
            continue;
        }
        let name = code_spans(&row.cells[0])
            .into_iter()
            .map(|n| n.replace("<fullname>", FULLNAME))
            .find(|n| roles.contains_key(n));
        let Some(name) = name else {
            continue;
        };
        checked += 1;
        let documented = prose_grants(&row.cells[1]);
        if documented != roles[&name] {
            problems.push(format!(
                "{}: ClusterRole {name} grants {:?}, the row says {documented:?}",
                install.at(row.line),
                roles[&name]
            ));
        }
    }
    if checked < 4 {
        problems.push(format!(
            "{}: only {checked} ClusterRole rows matched a rendered ClusterRole",
            install.path
        ));
    }
    problems.extend(api_rbac_problems(api, roles)?);
    Ok(problems)
}

/// api.md's `| to | rule |` tables (the viewer's, then the fleet view's) and its ClusterRole
/// example against `roles`.
fn api_rbac_problems(api: &Document, roles: &BTreeMap<String, Grants>) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let expected = [
        (
            "elemental-changelog-viewer",
            roles
                .get("elemental-changelog-viewer")
                .cloned()
                .unwrap_or_default(),
        ),
        (
            "elemental-changelog-machine-reader + elemental-changelog-plan-reader",
            [
                "elemental-changelog-machine-reader",
                "elemental-changelog-plan-reader",
            ]
            .iter()
            .flat_map(|n| roles.get(*n).cloned().unwrap_or_default())
            .collect(),
        ),
    ];
    let tables = api.tables_with_header(&["to", "rule"]);
    ensure!(
        tables.len() == expected.len(),
        "{}: expected {} | to | rule | tables",
        api.path,
        expected.len()
    );
    for (table, (names, grants)) in tables.iter().zip(&expected) {
        let documented: Grants = table
            .rows
            .iter()
            .flat_map(|r| prose_grants(&r.cells[1]))
            .collect();
        if documented != *grants {
            problems.push(format!(
                "{}: the chart's {names} grant {grants:?}, the table says {documented:?}",
                api.at(table.line)
            ));
        }
    }
    let example = api
        .code_blocks("yaml")
        .into_iter()
        .find(|(_, lines)| lines.iter().any(|l| l.contains("kind: ClusterRole")))
        .with_context(|| format!("{}: no ClusterRole example", api.path))?;
    let role: Value = serde_yaml::from_str(&example.1.join("\n"))?;
    let name = role["metadata"]["name"].as_str().unwrap_or_default();
    match roles.get(name) {
        Some(grants) if *grants == rule_grants(&role["rules"]) => {}
        other => problems.push(format!(
            "{}: the example ClusterRole {name} grants {:?}, the chart's {other:?}",
            api.at(example.0),
            rule_grants(&role["rules"])
        )),
    }
    Ok(problems)
}

#[test]
fn the_rbac_tables_grant_what_the_chart_grants() -> Result<()> {
    assert_eq!(
        prose_grants("`get`, `list` on `a` and `b/c`, and `watch` on `d` in `x.io`. Labelled `e`"),
        Grants::from([
            ("get".into(), "a".into()),
            ("get".into(), "b/c".into()),
            ("list".into(), "a".into()),
            ("list".into(), "b/c".into()),
            ("watch".into(), "d".into()),
        ])
    );
    let install = Document::read("docs/install.md")?;
    let api = Document::read("docs/api.md")?;
    let roles = rendered_cluster_roles()?;
    ensure!(
        roles.contains_key("elemental-changelog-viewer"),
        "{roles:?}"
    );
    let problems = rbac_problems(&install, &api, &roles)?;
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // A verb the chart grants and the docs do not name is caught, in every table.
    let mut fewer = roles.clone();
    for grants in fewer.values_mut() {
        grants.retain(|(verb, _)| verb != "watch");
    }
    let caught = rbac_problems(&install, &api, &fewer)?;
    ensure!(
        caught
            .iter()
            .any(|p| p.contains("ClusterRole elemental-changelog-viewer grants"))
            && caught
                .iter()
                .any(|p| p.contains("ClusterRole elemental-changelog-machine-reader grants"))
            && caught.iter().filter(|p| p.contains("docs/api.md")).count() >= 3,
        "{caught:#?}"
    );
    Ok(())
}
