//! The operator's documents against the code, so that neither drifts alone:
//!
//! - every flag of `elemental-changelog-apiserver --help` (clap, the source of truth) is a
//!   row of a flag table of `docs/operations.md` with the same environment variable and
//!   default, and every flag row there is a flag of the binary;
//! - every metric the server registers (read from the source that defines them, wherever
//!   the crate split puts it) is a row of the metrics table with the same labels, and every
//!   metric row there is registered;
//! - every `Status` reason and every cause reason the server sends is a row of the error
//!   table of `docs/api.md` with its HTTP code, and the fixed messages are quoted as sent:
//!   the reasons are those of the `StatusError` constructors the server's code calls, and the
//!   messages the literal text passed to them (and the 410 texts of `elemental_changelog_hub::Expired`);
//! - every figure section of `docs/` names the commit and the command that produced it;
//! - every machine reason of the fleet view is a row of its reason table with its state.
//! - the flags of `inspect` and of the extension's file server against their tables;
//! - `docs/kubectl-plugin.md`'s usage block and command table against the plugin's `--help`;
//! - `docs/api.md`'s discovery table against the `APIResourceList` the server sends, and
//!   its fleet error table's causes against `MachineReason` (`fleet.rs` checks that table
//!   against the server's answers);
//! - every number of `docs/operations.md`'s size limits table against the constant it
//!   names, and the budget's start-up formula against `PullMemory`;
//! - the README's first commands (what `.ci/run` runs), and what the docs say `make server`
//!   and the Dockerfile do.
//!
//! A mismatch names the file and line to fix. `docs_chart.rs` does the same for
//! `docs/install.md` and the chart. Needs `make server` (the three binaries).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog::updateinfo;
use elemental_changelog_apiserver::{request, server};
use elemental_changelog_apiservice::discovery;
use elemental_changelog_apiservice::status::{Denied, Reason, StatusError};
use elemental_changelog_apiservice::types::UnavailableReason;
use elemental_changelog_hub::Expired;
use elemental_changelog_integration::markdown::{
    Document, Flag, Row, code_spans, help_flags, leading_code,
};
use elemental_changelog_integration::testbed::{server_binary, workspace_root};
use elemental_changelog_registry::budget::PullMemory;
use elemental_changelog_registry::limits::FetchLimits;
use elemental_changelog_registry::{client, layer};

fn doc(name: &str) -> Result<String> {
    let path = workspace_root().join("docs").join(name);
    std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))
}

/// The cells of the Markdown table rows of `text`, header rows included.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    let document = Document {
        path: String::new(),
        text: text.to_owned(),
    };
    document
        .tables()
        .into_iter()
        .flat_map(|t| std::iter::once(t.header).chain(t.rows.into_iter().map(|r| r.cells)))
        .collect()
}

// ---------------------------------------------------------------------------
// Flags

/// The flag tables of operations.md: `| --flag | ENV | default | meaning |`.
fn documented_flags(text: &str) -> BTreeMap<String, (String, String)> {
    table_rows(text)
        .into_iter()
        .filter(|cells| cells.len() >= 4)
        .filter_map(|cells| {
            let flag = leading_code(&cells[0])?.to_owned();
            flag.starts_with("--")
                .then(|| (flag, (cells[1].clone(), cells[2].clone())))
        })
        .collect()
}

/// Compares a `--help` flag with its documented row; the problems found.
fn flag_problems(name: &str, flag: &Flag, env_cell: &str, default_cell: &str) -> Vec<String> {
    let mut problems = Vec::new();
    match &flag.env {
        Some(env) if leading_code(env_cell) != Some(env.as_str()) => problems.push(format!(
            "{name}: the environment variable is {env}, docs/operations.md says {env_cell}"
        )),
        None if leading_code(env_cell).is_some() => problems.push(format!(
            "{name}: has no environment variable, docs/operations.md says {env_cell}"
        )),
        _ => {}
    }
    match &flag.default {
        Some(default) => {
            // `a,b` and `a b` (clap's two ways of writing a list) are the same default.
            let normal = |s: &str| s.replace([',', ' '], " ");
            let documented = code_spans(default_cell);
            if !documented.iter().any(|d| normal(d) == normal(default)) {
                problems.push(format!(
                    "{name}: the default is `{default}`, docs/operations.md says {default_cell}"
                ));
            }
        }
        None => {
            if leading_code(default_cell).is_some() {
                problems.push(format!(
                    "{name}: has no default, docs/operations.md says {default_cell}"
                ));
            }
        }
    }
    problems
}

#[test]
fn every_flag_is_documented_with_its_variable_and_default() -> Result<()> {
    let binary = server_binary();
    ensure!(
        binary.exists(),
        "{} is missing: run `make server`",
        binary.display()
    );
    // No inherited variable may show up as a value in the help.
    let output = std::process::Command::new(&binary)
        .arg("--help")
        .env_clear()
        .output()
        .with_context(|| format!("running {} --help", binary.display()))?;
    ensure!(output.status.success(), "--help failed");
    let help = help_flags(&String::from_utf8(output.stdout)?);
    ensure!(
        help.len() > 20,
        "read only {} flags from --help",
        help.len()
    );
    let documented = documented_flags(&server_flag_text()?);

    let mut problems = Vec::new();
    for (name, flag) in &help {
        match documented.get(name) {
            Some((env, default)) => problems.extend(flag_problems(name, flag, env, default)),
            None => problems.push(format!("{name} is not in docs/operations.md")),
        }
    }
    for name in documented.keys() {
        if !help.contains_key(name) {
            problems.push(format!(
                "docs/operations.md documents {name}, which the server does not have"
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// Headings of operations.md whose flag tables are not the server's.
const INSPECT_HEADING: &str = "#### `inspect`";
const EXTENSION_HEADING: &str = "### The UI extension's file server";

/// operations.md without the sections of the other programs' flags.
fn server_flag_text() -> Result<String> {
    let doc = Document::read("docs/operations.md")?;
    let mut skipped = Vec::new();
    for heading in [INSPECT_HEADING, EXTENSION_HEADING] {
        skipped.push(doc.section(heading)?);
    }
    Ok(doc
        .text
        .lines()
        .enumerate()
        .filter(|(at, _)| !skipped.iter().any(|r| r.contains(&(at + 1))))
        .map(|(_, line)| format!("{line}\n"))
        .collect())
}

/// The flag rows (`| --flag | ENV | default | meaning |`) of the sections `headings` of `doc`.
fn flag_rows(doc: &Document, headings: &[&str]) -> Result<BTreeMap<String, Row>> {
    let mut rows = BTreeMap::new();
    for heading in headings {
        for table in doc.tables_in(doc.section(heading)?) {
            for row in table.rows {
                if row.cells.len() >= 4
                    && let Some(flag) = leading_code(&row.cells[0]).filter(|f| f.starts_with("--"))
                {
                    rows.insert(flag.to_owned(), row);
                }
            }
        }
    }
    Ok(rows)
}

/// A program's `--help` flags against its documented rows, both ways, with the lines to fix.
fn compare_flags(
    program: &str,
    help: &BTreeMap<String, Flag>,
    doc: &Document,
    rows: &BTreeMap<String, Row>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, flag) in help {
        match rows.get(name) {
            Some(row) => problems.extend(
                flag_problems(name, flag, &row.cells[1], &row.cells[2])
                    .into_iter()
                    .map(|p| format!("{}: {program} {p}", doc.at(row.line))),
            ),
            None => problems.push(format!("{program} {name} is not in {}", doc.path)),
        }
    }
    for (name, row) in rows {
        if !help.contains_key(name) {
            problems.push(format!(
                "{}: documents {name}, which {program} does not have",
                doc.at(row.line)
            ));
        }
    }
    problems
}

/// `--help` of `binary` with `args`, with no inherited variable.
fn help_of(binary: &Path, args: &[&str]) -> Result<BTreeMap<String, Flag>> {
    ensure!(
        binary.exists(),
        "{} is missing: run `make server`",
        binary.display()
    );
    let output = std::process::Command::new(binary)
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .with_context(|| format!("running {} --help", binary.display()))?;
    ensure!(
        output.status.success(),
        "{} --help failed",
        binary.display()
    );
    Ok(help_flags(&String::from_utf8(output.stdout)?))
}

#[test]
fn inspect_and_the_extension_server_flags_are_documented() -> Result<()> {
    let doc = Document::read("docs/operations.md")?;
    let mut problems = Vec::new();
    let inspect = help_of(&server_binary(), &["inspect"])?;
    ensure!(
        inspect.contains_key("--arch"),
        "no --arch in inspect --help: {inspect:?}"
    );
    problems.extend(compare_flags(
        "inspect",
        &inspect,
        &doc,
        &flag_rows(&doc, &[INSPECT_HEADING, "### Registries"])?,
    ));
    let extension = workspace_root().join("target/debug/elemental-changelog-extension-server");
    let extension_help = help_of(&extension, &[])?;
    ensure!(extension_help.contains_key("--dir"), "{extension_help:?}");
    problems.extend(compare_flags(
        "elemental-changelog-extension-server",
        &extension_help,
        &doc,
        &flag_rows(&doc, &[EXTENSION_HEADING])?,
    ));
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // inspect's --log-format defaults to text, the server's to json: a row copied from the
    // server's table fails.
    let mut rows = flag_rows(&doc, &[INSPECT_HEADING, "### Registries"])?;
    rows.get_mut("--log-format")
        .context("--log-format row")?
        .cells[2] = "`json`".into();
    ensure!(
        compare_flags("inspect", &inspect, &doc, &rows)
            .iter()
            .any(|p| p.contains("--log-format: the default is `text`")),
        "a wrong default went unnoticed"
    );
    Ok(())
}

#[test]
fn the_flag_comparison_catches_a_wrong_default_or_variable() {
    let flag = Flag {
        env: Some("ELEMENTAL_CHANGELOG_MAX_FILE_SIZE".into()),
        default: Some("24MiB".into()),
        ..Flag::default()
    };
    let env = "`ELEMENTAL_CHANGELOG_MAX_FILE_SIZE`";
    assert!(flag_problems("--max-file-size", &flag, env, "`24MiB`").is_empty());
    assert_eq!(
        flag_problems("--max-file-size", &flag, env, "`32MiB`").len(),
        1
    );
    assert_eq!(
        flag_problems("--max-file-size", &flag, "`OTHER`", "`24MiB`").len(),
        1
    );
    let list = Flag {
        env: None,
        default: Some("x86_64,aarch64".into()),
        ..Flag::default()
    };
    assert!(flag_problems("--architecture", &list, "none", "`x86_64 aarch64`").is_empty());
    let none = Flag::default();
    assert!(flag_problems("--kubeconfig", &none, "none", "none (in-cluster)").is_empty());
    assert_eq!(flag_problems("--kubeconfig", &none, "none", "`x`").len(), 1);
}

// ---------------------------------------------------------------------------
// Metrics

/// `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The arguments of a call whose `(` was just passed: `(raw, masked)`, up to the matching
/// `)`, where `masked` is `raw` with the contents of string literals blanked (so that
/// parentheses, brackets or commas inside a help text do not count).
fn call_arguments(source: &str) -> Option<(&str, String)> {
    let mut depth = 1usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut masked = String::new();
    for (at, c) in source.char_indices() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                masked.push('"');
                continue;
            }
            // As many bytes as the character: offsets in `masked` are offsets in `raw`.
            masked.extend(std::iter::repeat_n(' ', c.len_utf8()));
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&source[..at], masked));
                }
            }
            _ => {}
        }
        masked.push(c);
    }
    None
}

/// The metrics the server defines, with their labels: read from the `family!` declarations
/// of the server crates, one field per metric,
/// `name: Kind = metric("name", "help", &["label", …])` (no labels for a single series): the
/// first string is the name, the `&[…]` the labels.
fn defined_metrics(source: &str) -> BTreeMap<String, Vec<String>> {
    const FIELD: &str = "= metric(";
    let mut metrics = BTreeMap::new();
    if !source.contains("family! {") {
        return metrics;
    }
    let mut rest = source;
    while let Some(at) = rest.find(FIELD) {
        rest = &rest[at + FIELD.len()..];
        let Some((raw, masked)) = call_arguments(rest) else {
            continue;
        };
        if !masked.trim_start().starts_with('"') {
            continue;
        }
        let quotes: Vec<usize> = masked
            .char_indices()
            .filter(|(_, c)| *c == '"')
            .map(|(i, _)| i)
            .collect();
        let (Some(&open), Some(&close)) = (quotes.first(), quotes.get(1)) else {
            continue;
        };
        let name = raw.get(open + 1..close).unwrap_or_default();
        let labels = masked
            .rfind("&[")
            .and_then(|start| {
                let end = start + masked[start..].find(']')?;
                Some(
                    raw.get(start..end)
                        .unwrap_or_default()
                        .split('"')
                        .skip(1)
                        .step_by(2)
                        .map(str::to_owned)
                        .collect::<Vec<_>>(),
                )
            })
            .unwrap_or_default();
        metrics.insert(format!("elemental_changelog_{name}"), labels);
    }
    metrics
}

/// The metrics table of operations.md: name → labels.
fn documented_metrics(text: &str) -> BTreeMap<String, Vec<String>> {
    table_rows(text)
        .into_iter()
        .filter(|cells| cells.len() >= 4)
        .filter_map(|cells| {
            let name = leading_code(&cells[0])?;
            name.starts_with("elemental_changelog_").then(|| {
                let labels = code_spans(&cells[2])
                    .into_iter()
                    .map(str::to_owned)
                    .collect();
                (name.to_owned(), labels)
            })
        })
        .collect()
}

#[test]
fn every_metric_is_documented_with_its_labels() -> Result<()> {
    let root = workspace_root();
    let mut files = Vec::new();
    for member in std::fs::read_dir(&root)? {
        let src = member?.path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files)?;
        }
    }
    let mut defined = BTreeMap::new();
    for file in &files {
        defined.extend(defined_metrics(&std::fs::read_to_string(file)?));
    }
    ensure!(
        defined.len() > 20,
        "found only {} metric definitions ({defined:?}): did the way metrics are defined change? Update defined_metrics",
        defined.len()
    );
    let documented = documented_metrics(&doc("operations.md")?);
    let mut problems = Vec::new();
    for (name, labels) in &defined {
        match documented.get(name) {
            None => problems.push(format!(
                "{name} (labels {labels:?}) is not in the metrics table of docs/operations.md"
            )),
            Some(doc_labels) if doc_labels != labels => problems.push(format!(
                "{name}: labels {labels:?}, docs/operations.md says {doc_labels:?}"
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !defined.contains_key(name) {
            problems.push(format!(
                "docs/operations.md documents {name}, which the server does not define"
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn metric_definitions_are_read_with_their_labels() {
    let source = r#"
macro_rules! family { ($kind:ty = metric($name:literal, $help:literal)) => {} }
family! {
    pub struct Counted {
        a: IntCounterVec = metric(
            "requests_total",
            "Requests, by \"verb\".",
            &["verb", "code"],
        ),
        b: IntCounter = metric("panics_total", "Panics."),
        c: IntGauge = metric("channels", "Channels (all)."),
        d: HistogramVec = metric("duration_seconds", "Time (when \"done\"), by result.", &["result"])
            .buckets(&[0.1]),
        e: GaugeVec = metric(
            "age_seconds",
            "Age (s), by channel.",
            &["namespace", "channel"],
        ),
        f: IntCounterVec = metric("files_total", "Files (did not parse), by kind.", &["file"]),
    }
}
    "#;
    let metrics = defined_metrics(source);
    assert_eq!(
        metrics,
        BTreeMap::from([
            (
                "elemental_changelog_age_seconds".to_owned(),
                vec!["namespace".to_owned(), "channel".to_owned()]
            ),
            ("elemental_changelog_channels".to_owned(), vec![]),
            (
                "elemental_changelog_files_total".to_owned(),
                vec!["file".to_owned()]
            ),
            (
                "elemental_changelog_duration_seconds".to_owned(),
                vec!["result".to_owned()]
            ),
            ("elemental_changelog_panics_total".to_owned(), vec![]),
            (
                "elemental_changelog_requests_total".to_owned(),
                vec!["verb".to_owned(), "code".to_owned()]
            ),
        ])
    );
}

// ---------------------------------------------------------------------------
// Status reasons

/// The `Reason` each `StatusError` constructor makes, by its name; `None` for a name that is
/// no constructor (a new one fails the test until it is listed here).
fn constructor_reason(name: &str) -> Option<Reason> {
    let denied = Denied::NonResource {
        verb: "get",
        path: "/",
    };
    let error = match name {
        "not_found" => StatusError::not_found("r", "n"),
        "not_found_in" => StatusError::not_found_in("g", "r", "n"),
        "method_not_allowed" => StatusError::method_not_allowed("create"),
        "bad_request" => StatusError::bad_request("x"),
        "expired" => StatusError::expired("x"),
        "unauthorized" => StatusError::unauthorized(),
        "forbidden" => StatusError::forbidden("u", &denied, ""),
        "service_unavailable" => StatusError::service_unavailable("x", None),
        "too_many_requests" => StatusError::too_many_requests(1),
        "not_acceptable" => StatusError::not_acceptable(&[]),
        "internal" => StatusError::internal(&std::io::Error::other("x")),
        "timeout" => StatusError::timeout("x", None),
        _ => return None,
    };
    Some(error.reason)
}

/// The server's source files outside tests (`tests.rs`, `*_tests.rs`, and what follows a
/// `#[cfg(test)]`), with their paths.
fn server_sources() -> Result<Vec<(PathBuf, String)>> {
    let root = workspace_root();
    let mut files = Vec::new();
    for member in [
        "apiserver",
        "apiservice",
        "auth",
        "certs",
        "registry",
        "changelog",
    ] {
        rust_files(&root.join(member).join("src"), &mut files)?;
    }
    let mut sources = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file)?;
        sources.push((file, without_test_module(&text)));
    }
    Ok(sources)
}

/// `text` up to its inline test module (`#[cfg(test)]`, other attributes, `mod tests {`); a
/// `#[cfg(test)] mod tests;` of a sibling file is no cut.
fn without_test_module(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    for (at, line) in lines.iter().enumerate() {
        if line.trim() != "#[cfg(test)]" {
            continue;
        }
        let item = lines[at + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.starts_with("#["))
            .unwrap_or_default();
        if item.contains("mod ") && item.ends_with('{') {
            return lines[..at].join("\n");
        }
    }
    text.to_owned()
}

/// The string literals of `raw` (a call's arguments), unescaped enough to compare with text.
fn string_literals(raw: &str) -> Vec<String> {
    let mut literals = Vec::new();
    let mut current: Option<String> = None;
    let mut escaped = false;
    for c in raw.chars() {
        match &mut current {
            None if c == '"' => current = Some(String::new()),
            None => {}
            Some(text) if escaped => {
                escaped = false;
                text.push(c);
            }
            Some(_) if c == '\\' => escaped = true,
            Some(_) if c == '"' => literals.extend(current.take()),
            Some(text) => text.push(c),
        }
    }
    literals
}

/// The longest piece of `literal` between `format!` placeholders (`{…}`).
fn longest_fixed_part(literal: &str) -> String {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut depth = 0usize;
    for c in literal.chars() {
        match c {
            '{' => {
                depth += 1;
                parts.push(std::mem::take(&mut part));
            }
            '}' if depth > 0 => depth -= 1,
            _ if depth == 0 => part.push(c),
            _ => {}
        }
    }
    parts.push(part);
    parts
        .into_iter()
        .max_by_key(String::len)
        .unwrap_or_default()
}

/// What the server's code makes: the reason of every `StatusError::<constructor>(` call, and
/// the fixed text of every message passed to a constructor that takes one (or to
/// `invalid_value`, whose last argument says why), each with where it is.
struct Made {
    reasons: BTreeMap<(u16, &'static str), String>,
    messages: Vec<(String, String)>,
    unknown: Vec<String>,
}

/// Pieces of fixed text shorter than this say too little to look for.
const MIN_FIXED_TEXT: usize = 12;

fn made_by_the_code(sources: &[(PathBuf, String)]) -> Made {
    const PREFIX: &str = "StatusError::";
    let mut made = Made {
        reasons: BTreeMap::new(),
        messages: Vec::new(),
        unknown: Vec::new(),
    };
    for (path, code) in sources {
        let short = path
            .strip_prefix(workspace_root())
            .unwrap_or(path)
            .display()
            .to_string();
        let mut rest = code.as_str();
        while let Some(at) = rest.find(PREFIX) {
            rest = &rest[at + PREFIX.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !rest[name.len()..].starts_with('(') {
                continue;
            }
            match constructor_reason(&name) {
                Some(reason) => {
                    made.reasons
                        .entry((reason.code(), reason.as_str()))
                        .or_insert_with(|| format!("{short}: StatusError::{name}"));
                }
                None => made.unknown.push(format!("{short}: StatusError::{name}")),
            }
            let takes_message = matches!(
                name.as_str(),
                "bad_request" | "expired" | "service_unavailable" | "timeout"
            );
            if let (true, Some((raw, _))) = (takes_message, call_arguments(&rest[name.len() + 1..]))
                && let Some(first) = string_literals(raw).first()
            {
                made.messages.push((
                    longest_fixed_part(first),
                    format!("{short}: StatusError::{name}"),
                ));
            }
        }
        // `invalid_value(field, value, why)`: a 400 worded as kube-apiserver's field errors.
        let mut rest = code.as_str();
        while let Some(at) = rest.find("invalid_value(") {
            rest = &rest[at + "invalid_value(".len()..];
            if let Some((raw, _)) = call_arguments(rest)
                && let Some(why) = string_literals(raw).last()
            {
                made.messages
                    .push((longest_fixed_part(why), format!("{short}: invalid_value")));
            }
        }
    }
    made.messages
        .retain(|(text, _)| text.trim().len() >= MIN_FIXED_TEXT);
    made
}

/// Every reason a watch cannot start from its resourceVersion, as the 410 says it (no
/// wildcard: a new one does not compile until it is listed here, and so checked in api.md).
fn expired_texts() -> Vec<String> {
    let all = [Expired::Invalid, Expired::OtherProcess, Expired::Compacted];
    all.into_iter()
        .map(|expired| match expired {
            Expired::Invalid | Expired::OtherProcess | Expired::Compacted => expired.to_string(),
        })
        .collect()
}

/// Every cause reason of an unavailable changelog, with its HTTP code (no wildcard, as above).
fn causes() -> Vec<(&'static str, u16)> {
    let all = [
        UnavailableReason::NoChannel,
        UnavailableReason::ChannelHasNoImage,
        UnavailableReason::NotFetched,
        UnavailableReason::NoChangelogData,
        UnavailableReason::FetchFailed,
    ];
    all.into_iter()
        .map(|cause| match cause {
            UnavailableReason::NoChannel => ("NoChannel", 404),
            UnavailableReason::ChannelHasNoImage => ("ChannelHasNoImage", 404),
            UnavailableReason::NoChangelogData => ("NoChangelogData", 404),
            UnavailableReason::NotFetched => ("NotFetched", 503),
            UnavailableReason::FetchFailed => ("FetchFailed", 503),
        })
        .collect()
}

/// The error table (its `(code, reason)` rows, `documented`) and the rest of api.md (`api`)
/// against what the code makes; the problems, each naming where the code makes it.
fn error_table_problems(
    api: &str,
    documented: &BTreeSet<(u16, String)>,
    made: &Made,
) -> Vec<String> {
    let mut problems: Vec<String> = made
        .unknown
        .iter()
        .map(|call| {
            format!("{call} is no constructor constructor_reason() in integration/tests/docs.rs knows: add it")
        })
        .collect();
    for ((code, reason), at) in &made.reasons {
        if !documented.contains(&(*code, (*reason).to_owned())) {
            problems.push(format!(
                "{code} {reason} is sent ({at}) but not in the error table of docs/api.md"
            ));
        }
    }
    for (code, reason) in documented {
        if !made.reasons.contains_key(&(*code, reason.as_str())) {
            problems.push(format!(
                "docs/api.md lists {code} {reason}, which the server's code never makes"
            ));
        }
    }
    for (text, at) in &made.messages {
        if !api.contains(text.as_str()) {
            problems.push(format!(
                "docs/api.md does not say {text:?}, the fixed text of a message sent by {at}"
            ));
        }
    }
    problems
}

#[test]
fn every_status_reason_and_cause_is_in_the_error_table() -> Result<()> {
    let api = doc("api.md")?;
    // The error table: `| code | reason | cause | when | what to do |`.
    let rows: Vec<Vec<String>> = table_rows(&api)
        .into_iter()
        .filter(|cells| cells.len() == 5 && cells[0].parse::<u16>().is_ok())
        .collect();
    ensure!(!rows.is_empty(), "no error table in docs/api.md");
    let documented: BTreeSet<(u16, String)> = rows
        .iter()
        .filter_map(|cells| Some((cells[0].parse().ok()?, leading_code(&cells[1])?.to_owned())))
        .collect();

    let made = made_by_the_code(&server_sources()?);
    ensure!(
        made.reasons.len() >= 10 && made.messages.len() >= 20,
        "found only {} reasons and {} messages in the server's code: did the constructors move? Update made_by_the_code",
        made.reasons.len(),
        made.messages.len()
    );
    let mut problems = error_table_problems(&api, &documented, &made);
    for text in expired_texts() {
        if !api.contains(&format!("`{text}`")) {
            problems.push(format!(
                "docs/api.md does not quote the 410 message `{text}` (elemental_changelog_hub::Expired)"
            ));
        }
    }
    for (cause, code) in causes() {
        if !rows
            .iter()
            .any(|cells| cells[0] == code.to_string() && code_spans(&cells[2]).contains(&cause))
        {
            problems.push(format!(
                "cause {cause} ({code}) is not in the error table of docs/api.md"
            ));
        }
    }
    // Messages with fixed wording are quoted as sent.
    for fixed in [
        StatusError::too_many_requests(1).message,
        StatusError::timeout("request did not complete within the allotted timeout", None).message,
        StatusError::unauthorized().message,
    ] {
        if !api.contains(&format!("`{fixed}`")) {
            problems.push(format!("docs/api.md does not quote the message `{fixed}`"));
        }
    }
    // The size limits the 400s and the 431 name.
    let limits = [
        format!(
            "the query string is longer than {} bytes",
            request::MAX_QUERY_BYTES
        ),
        format!("longer than {} bytes", request::MAX_SELECTOR_BYTES),
        format!("larger than {} KiB", server::MAX_HEADER_BYTES / 1024),
    ];
    for limit in limits {
        if !api.contains(&limit) {
            problems.push(format!("docs/api.md does not say `{limit}`"));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    // A reason the code comes to make, a reason no longer made and a new message are caught.
    let mut changed = Made {
        reasons: made.reasons.clone(),
        messages: vec![("a message nobody documented".to_owned(), "x.rs".to_owned())],
        unknown: Vec::new(),
    };
    changed
        .reasons
        .insert((415, "UnsupportedMediaType"), "x.rs".to_owned());
    changed.reasons.remove(&(410, "Expired"));
    let caught = error_table_problems(&api, &documented, &changed);
    for expected in [
        "415 UnsupportedMediaType is sent",
        "lists 410 Expired, which the server's code never makes",
        "\"a message nobody documented\"",
    ] {
        ensure!(
            caught.iter().any(|p| p.contains(expected)),
            "a mismatch went unnoticed ({expected}): {caught:?}"
        );
    }
    Ok(())
}

/// Every machine reason of the fleet view, with the state it comes with (no wildcard: a new
/// reason does not compile until it is listed here, and so checked in api.md).
fn machine_reasons() -> Vec<(&'static str, &'static str)> {
    use elemental_changelog_apiservice::fleet::MachineReason;
    let all = [
        MachineReason::NoAnnotation,
        MachineReason::Unmanaged,
        MachineReason::VersionInNoChannel,
        MachineReason::Ambiguous,
        MachineReason::ChannelNotFetched,
        MachineReason::TargetOlder,
        MachineReason::OtherChannel,
        MachineReason::MetadataTooLarge,
    ];
    all.into_iter()
        .map(|reason| match reason {
            MachineReason::NoAnnotation => ("NoAnnotation", "Unknown"),
            MachineReason::Unmanaged => ("Unmanaged", "Unknown"),
            MachineReason::VersionInNoChannel => ("VersionInNoChannel", "Unknown"),
            MachineReason::Ambiguous => ("Ambiguous", "Unknown"),
            MachineReason::ChannelNotFetched => ("ChannelNotFetched", "Unknown"),
            MachineReason::TargetOlder => ("TargetOlder", "UpToDate"),
            MachineReason::OtherChannel => ("OtherChannel", "UpdatesAvailable"),
            MachineReason::MetadataTooLarge => ("MetadataTooLarge", "Unknown"),
        })
        .collect()
}

#[test]
fn every_machine_reason_is_in_the_fleet_reason_table() -> Result<()> {
    let api = doc("api.md")?;
    // The reason table of the fleet view: `| reason | state | meaning |`.
    let documented: BTreeSet<(String, String)> = table_rows(&api)
        .into_iter()
        .filter(|cells| {
            cells.len() == 3
                && ["Unknown", "UpToDate", "UpdatesAvailable"]
                    .iter()
                    .any(|s| leading_code(&cells[1]) == Some(s))
        })
        .filter_map(|cells| {
            Some((
                leading_code(&cells[0])?.to_owned(),
                leading_code(&cells[1])?.to_owned(),
            ))
        })
        .collect();
    let code: BTreeSet<(String, String)> = machine_reasons()
        .into_iter()
        .map(|(r, s)| (r.to_owned(), s.to_owned()))
        .collect();
    ensure!(
        documented == code,
        "docs/api.md's fleet reason table {documented:?} differs from the machine reasons {code:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// docs/kubectl-plugin.md

/// The subcommands `kubectl-elemental --help` lists (`help` left out).
fn plugin_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// One line of the usage block: the command, its flags and the `-o` values it shows.
struct UsageLine {
    line: usize,
    command: String,
    flags: Vec<String>,
    outputs: Vec<String>,
}

fn usage_lines(doc: &Document) -> Result<Vec<UsageLine>> {
    let usage = doc.section("## Usage")?;
    let (first, lines) = doc
        .code_blocks("sh")
        .into_iter()
        .find(|(line, _)| usage.contains(line))
        .with_context(|| format!("{}: no sh block under ## Usage", doc.path))?;
    let mut out = Vec::new();
    for (offset, text) in lines.iter().enumerate() {
        let words: Vec<&str> = text
            .split_whitespace()
            .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
            .collect();
        let Some(["kubectl", "elemental", command]) = words.get(..3).map(|w| [w[0], w[1], w[2]])
        else {
            continue;
        };
        let mut flags = Vec::new();
        let mut outputs = Vec::new();
        for (at, word) in words.iter().enumerate().skip(3) {
            if word.starts_with('-') {
                flags.push((*word).to_owned());
                if *word == "-o" {
                    outputs.extend(
                        words
                            .get(at + 1)
                            .into_iter()
                            .flat_map(|v| v.split('|'))
                            .map(str::to_owned),
                    );
                }
            }
        }
        out.push(UsageLine {
            line: first + offset,
            command: command.to_owned(),
            flags,
            outputs,
        });
    }
    Ok(out)
}

/// kubectl-plugin.md against the plugin's `--help`; the problems, with the lines to fix.
fn plugin_problems(
    doc: &Document,
    commands: &[String],
    helps: &BTreeMap<String, BTreeMap<String, Flag>>,
) -> Result<Vec<String>> {
    let usage = usage_lines(doc)?;
    let mut problems = Vec::new();
    for line in &usage {
        let Some(help) = helps.get(&line.command) else {
            problems.push(format!(
                "{}: kubectl elemental has no command {}",
                doc.at(line.line),
                line.command
            ));
            continue;
        };
        for flag in &line.flags {
            if !help
                .iter()
                .any(|(long, f)| long == flag || f.short.as_deref() == Some(flag.as_str()))
            {
                problems.push(format!(
                    "{}: kubectl elemental {} has no flag {flag}",
                    doc.at(line.line),
                    line.command
                ));
            }
        }
    }
    for command in commands {
        let lines: Vec<&UsageLine> = usage.iter().filter(|l| &l.command == command).collect();
        if lines.is_empty() {
            problems.push(format!(
                "{}: the command {command} is not in the usage block",
                doc.path
            ));
            continue;
        }
        let help = &helps[command];
        for (long, flag) in help {
            // Global flags are described once, in the text below the table.
            if long == "--kubeconfig" || long == "--context" {
                continue;
            }
            let shown = lines.iter().any(|l| {
                l.flags
                    .iter()
                    .any(|f| f == long || flag.short.as_deref() == Some(f.as_str()))
            });
            if !shown {
                problems.push(format!(
                    "{}: kubectl elemental {command} {long} is in no usage line of {command}",
                    doc.at(lines[0].line)
                ));
            }
        }
        if let Some(output) = help.get("--output") {
            let documented: BTreeSet<&str> = lines
                .iter()
                .flat_map(|l| l.outputs.iter().map(String::as_str))
                .collect();
            let actual: BTreeSet<&str> = output.values.iter().map(String::as_str).collect();
            if documented != actual {
                problems.push(format!(
                    "{}: kubectl elemental {command} -o takes {actual:?}, the usage shows {documented:?}",
                    doc.at(lines[0].line)
                ));
            }
        }
    }
    // The command table: a row per command, and no other.
    let tables = doc.tables_with_header(&["command", "prints"]);
    ensure!(
        tables.len() == 1,
        "{}: no | command | prints | table",
        doc.path
    );
    let mut rows = BTreeSet::new();
    for row in &tables[0].rows {
        let command = leading_code(&row.cells[0])
            .and_then(|c| c.split_whitespace().next())
            .unwrap_or_default();
        if !commands.iter().any(|c| c == command) {
            problems.push(format!(
                "{}: kubectl elemental has no command {command:?}",
                doc.at(row.line)
            ));
        }
        rows.insert(command.to_owned());
    }
    for command in commands {
        if !rows.contains(command) {
            problems.push(format!(
                "{}: the command {command} has no row in the table (line {})",
                doc.path, tables[0].line
            ));
        }
    }
    for global in ["--kubeconfig", "--context", "--namespace"] {
        if !doc.text.contains(global) {
            problems.push(format!("{} does not mention {global}", doc.path));
        }
    }
    Ok(problems)
}

#[test]
fn kubectl_plugin_md_matches_the_plugins_help() -> Result<()> {
    let binary = workspace_root().join("target/debug/kubectl-elemental");
    ensure!(
        binary.exists(),
        "{} is missing: run `make server`",
        binary.display()
    );
    let output = std::process::Command::new(&binary)
        .arg("--help")
        .env_clear()
        .output()?;
    ensure!(output.status.success(), "kubectl-elemental --help failed");
    let commands = plugin_commands(&String::from_utf8(output.stdout)?);
    ensure!(commands.len() >= 4, "commands {commands:?}");
    let mut helps = BTreeMap::new();
    for command in &commands {
        helps.insert(command.clone(), help_of(&binary, &[command])?);
    }
    let doc = Document::read("docs/kubectl-plugin.md")?;
    let problems = plugin_problems(&doc, &commands, &helps)?;
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // A flag the plugin gains without a usage line, and a command it loses, are caught.
    let mut more = helps.clone();
    more.get_mut("versions")
        .context("versions")?
        .insert("--sort".into(), Flag::default());
    ensure!(
        plugin_problems(&doc, &commands, &more)?
            .iter()
            .any(|p| p.contains("versions --sort is in no usage line")),
        "a new flag went unnoticed"
    );
    let fewer: Vec<String> = commands.iter().filter(|c| *c != "cve").cloned().collect();
    let mut fewer_helps = helps.clone();
    fewer_helps.remove("cve");
    ensure!(
        plugin_problems(&doc, &fewer, &fewer_helps)?
            .iter()
            .any(|p| p.contains("has no command cve")),
        "a removed command went unnoticed"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// docs/api.md: discovery and the fleet view's reasons

/// api.md's discovery table against the `APIResourceList` the server sends.
fn discovery_problems(doc: &Document, document: &serde_json::Value) -> Result<Vec<String>> {
    let tables = doc.tables_with_header(&["discovered resource", "kind", "verbs"]);
    ensure!(
        tables.len() == 1,
        "{}: no | discovered resource | kind | verbs | table",
        doc.path
    );
    let served: BTreeMap<String, (String, Vec<String>)> = document["resources"]
        .as_array()
        .context("resources")?
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_owned(),
                (
                    r["kind"].as_str().unwrap_or_default().to_owned(),
                    r["verbs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect(),
                ),
            )
        })
        .collect();
    let mut problems = Vec::new();
    let mut documented = BTreeSet::new();
    for row in &tables[0].rows {
        let name = leading_code(&row.cells[0]).unwrap_or_default();
        let kind = leading_code(&row.cells[1]).unwrap_or_default();
        let verbs: Vec<String> = code_spans(&row.cells[2])
            .into_iter()
            .map(str::to_owned)
            .collect();
        documented.insert(name.to_owned());
        match served.get(name) {
            None => problems.push(format!(
                "{}: discovery lists no resource {name}",
                doc.at(row.line)
            )),
            Some((k, v)) if k != kind || *v != verbs => problems.push(format!(
                "{}: discovery lists {name} with kind {k} and verbs {v:?}",
                doc.at(row.line)
            )),
            Some(_) => {}
        }
    }
    for name in served.keys() {
        if !documented.contains(name) {
            problems.push(format!(
                "{}: discovery lists {name}, which the table (line {}) does not",
                doc.path, tables[0].line
            ));
        }
    }
    Ok(problems)
}

#[test]
fn api_md_lists_what_discovery_lists() -> Result<()> {
    let doc = Document::read("docs/api.md")?;
    let served: serde_json::Value = serde_json::from_slice(&discovery::api_resource_list().body)?;
    let problems = discovery_problems(&doc, &served)?;
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    // A resource discovery gains is caught.
    let mut more = served.clone();
    more["resources"]
        .as_array_mut()
        .context("resources")?
        .push(serde_json::json!({"name": "managedosimages", "kind": "X", "verbs": ["get"]}));
    ensure!(
        discovery_problems(&doc, &more)?
            .iter()
            .any(|p| p.contains("discovery lists managedosimages")),
        "a new resource went unnoticed"
    );
    Ok(())
}

#[test]
fn the_fleet_error_table_names_only_machine_reasons() -> Result<()> {
    // A machine changelog's errors: | code | `details.causes[].reason` | when |: every cause
    // named is a machine reason, or a cause of the main error table (`FieldValueInvalid`);
    // integration/tests/fleet.rs checks the server's answers against this table.
    let doc = Document::read("docs/api.md")?;
    let reasons: BTreeSet<&str> = machine_reasons().into_iter().map(|(r, _)| r).collect();
    let main_table = doc.tables_with_header(&["code", "`reason`", "`details.causes[].reason`"]);
    let general: BTreeSet<&str> = main_table
        .iter()
        .flat_map(|t| t.rows.iter())
        .flat_map(|r| code_spans(r.cells.get(2).map(String::as_str).unwrap_or_default()))
        .collect();
    let errors = doc.tables_with_header(&["code", "`details.causes[].reason`", "when"]);
    ensure!(errors.len() == 1, "{}: no fleet error table", doc.path);
    let mut problems = Vec::new();
    for row in &errors[0].rows {
        for cause in code_spans(&row.cells[1]) {
            if cause.starts_with("field") {
                continue;
            }
            if !reasons.contains(cause) && !general.contains(cause) {
                problems.push(format!(
                    "{}: {cause} is no reason of a machine",
                    doc.at(row.line)
                ));
            }
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------------------
// docs/operations.md: the size limits table

/// The value of each constant the limits table may name. A name missing here fails the
/// test: add it, with the value read from the code.
fn limit_constant(name: &str) -> Option<u64> {
    let fetch = FetchLimits::default();
    let updateinfo = updateinfo::Limits::default();
    Some(match name {
        "layer::MAX_METADATA_BYTES" => layer::MAX_METADATA_BYTES,
        "FetchLimits::max_layers" => fetch.max_layers as u64,
        "FetchLimits::max_index_manifests" => fetch.max_index_manifests as u64,
        "client::MAX_MANIFEST_BYTES" => client::MAX_MANIFEST_BYTES,
        "client::MAX_TOKEN_BYTES" => client::MAX_TOKEN_BYTES,
        "PullMemory::PARSE_BYTES_PER_KEPT_BYTE" => PullMemory::PARSE_BYTES_PER_KEPT_BYTE,
        "PullMemory::UPDATEINFO_BUDGET_SHARE" => PullMemory::UPDATEINFO_BUDGET_SHARE,
        "updateinfo::Limits::max_advisories" => updateinfo.max_advisories as u64,
        "updateinfo::Limits::max_bytes" => updateinfo.max_bytes,
        "updateinfo::Limits::max_element_bytes" => updateinfo.max_element_bytes,
        "updateinfo::Limits::max_packages_per_advisory" => {
            updateinfo.max_packages_per_advisory as u64
        }
        "updateinfo::Limits::max_packages" => updateinfo.max_packages as u64,
        "updateinfo::Limits::max_duration" => updateinfo.max_duration.as_secs(),
        "updateinfo::ZSTD_WINDOW_LOG_MAX" => 1 << updateinfo::ZSTD_WINDOW_LOG_MAX,
        _ => return None,
    })
}

/// The numbers of a cell's prose (code spans left out), in order: `100 000`, `4 MiB`,
/// `256 KiB`, `30 s`, with their units applied.
fn prose_numbers(cell: &str) -> Vec<u64> {
    let prose: String = cell.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let words: Vec<&str> = prose
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | ':' | '(' | ')'))
        .filter(|w| !w.is_empty())
        .collect();
    let digits = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit());
    let mut numbers = Vec::new();
    let mut at = 0;
    while at < words.len() {
        if !digits(words[at]) {
            at += 1;
            continue;
        }
        let mut text = words[at].to_owned();
        at += 1;
        while at < words.len() && words[at].len() == 3 && digits(words[at]) {
            text.push_str(words[at]);
            at += 1;
        }
        let mut number: u64 = text.parse().unwrap_or_default();
        if let Some(unit) = words.get(at) {
            let factor = match *unit {
                "KiB" => Some(1 << 10),
                "MiB" => Some(1 << 20),
                "GiB" => Some(1 << 30),
                "s" => Some(1),
                _ => None,
            };
            if let Some(factor) = factor {
                number *= factor;
                at += 1;
            }
        }
        numbers.push(number);
    }
    numbers
}

/// The limits table's problems: the numbers of each row against the constants it names.
fn limits_problems(doc: &Document, constant: impl Fn(&str) -> Option<u64>) -> Result<Vec<String>> {
    let tables = doc.tables_with_header(&["limit", "flag, or constant"]);
    ensure!(
        tables.len() == 1,
        "{}: no | limit | flag, or constant | table",
        doc.path
    );
    let mut problems = Vec::new();
    for row in &tables[0].rows {
        let names: Vec<&str> = code_spans(&row.cells[1])
            .into_iter()
            .filter(|n| !n.starts_with("--"))
            .collect();
        let numbers = prose_numbers(&row.cells[0]);
        if names.len() != numbers.len() {
            problems.push(format!(
                "{}: {} numbers ({numbers:?}) for {} constants ({names:?}): name the constant of each number",
                doc.at(row.line),
                numbers.len(),
                names.len()
            ));
            continue;
        }
        for (name, number) in names.iter().zip(&numbers) {
            match constant(name) {
                None => problems.push(format!(
                    "{}: {name} is no constant limit_constant() in integration/tests/docs.rs knows",
                    doc.at(row.line)
                )),
                Some(value) if value != *number => problems.push(format!(
                    "{}: {name} is {value}, the table says {number}",
                    doc.at(row.line)
                )),
                Some(_) => {}
            }
        }
    }
    Ok(problems)
}

#[test]
fn every_number_of_the_limits_table_is_its_constant() -> Result<()> {
    assert_eq!(
        prose_numbers("a: 100 000 x, 4 MiB (256 KiB), `--x 9` and 1 000 000 in 30 s"),
        vec![100_000, 4 << 20, 256 << 10, 1_000_000, 30]
    );
    let doc = Document::read("docs/operations.md")?;
    let problems = limits_problems(&doc, limit_constant)?;
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    // The start-up check of the budget, as PullMemory::largest_pull_fits computes it.
    let formula = format!(
        "max({} MiB, {} × `--max-kept-size`) + budget / {}",
        PullMemory::PULL_WORKING_SET >> 20,
        1 + PullMemory::PARSE_BYTES_PER_KEPT_BYTE,
        PullMemory::UPDATEINFO_BUDGET_SHARE
    );
    ensure!(
        doc.text.contains(&formula),
        "{} does not state the budget's start-up check as `{formula}`",
        doc.path
    );
    // A constant that changes without the table is caught.
    let changed = |name: &str| {
        if name == "FetchLimits::max_layers" {
            Some(64)
        } else {
            limit_constant(name)
        }
    };
    ensure!(
        limits_problems(&doc, changed)?
            .iter()
            .any(|p| p.contains("FetchLimits::max_layers is 64, the table says 128")),
        "a changed constant went unnoticed"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// README.md: the first command

#[test]
fn the_readme_starts_with_its_setup_and_names_make_test() -> Result<()> {
    // What .ci/run runs: the lines of the first sh block before its first `make`, then
    // `make test`.
    let readme = Document::read("README.md")?;
    let (line, block) = readme
        .code_blocks("sh")
        .into_iter()
        .next()
        .context("README.md has no sh block")?;
    let setup: Vec<&String> = block
        .iter()
        .take_while(|l| !l.starts_with("make "))
        .collect();
    ensure!(
        setup.iter().any(|l| l.starts_with(".ci/deps")),
        "{}: the first sh block must start with the set-up (.ci/deps) that installs make: {setup:?}",
        readme.at(line)
    );
    ensure!(
        block
            .iter()
            .any(|l| l.split('#').next().map(str::trim) == Some("make test")),
        "{}: the first sh block does not name `make test`",
        readme.at(line)
    );
    let run = std::fs::read_to_string(workspace_root().join(".ci/run"))?;
    ensure!(
        run.contains("README.md") && run.contains("make test"),
        ".ci/run no longer runs the README's set-up and make test"
    );
    for registry in ["Debian", "npm registry", "crates.io", "Go module proxy"] {
        ensure!(
            readme.text.contains(registry),
            "README.md does not say that set-up reaches the {registry}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// What the build files do, as the docs say it

#[test]
fn the_docs_say_what_make_server_and_the_dockerfile_do() -> Result<()> {
    let root = workspace_root();
    // `make server` builds as many binaries as development.md says.
    let makefile = std::fs::read_to_string(root.join("Makefile"))?;
    let recipe = makefile
        .split("\nserver:\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .context("Makefile has no server target")?;
    let packages = recipe.matches(" -p ").count();
    let words = ["zero", "one", "two", "three", "four", "five", "six"];
    let said = format!(
        "`make server` builds the {} binaries",
        words.get(packages).context("too many packages")?
    );
    let development = Document::read("docs/development.md")?;
    ensure!(
        development.text.contains(&said),
        "{}: the Makefile's server target builds {packages} binaries; say `{said}`",
        development.path
    );
    // ui.md names the Node image the Dockerfile builds the extension on.
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile"))?;
    let node = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM docker.io/library/"))
        .find(|image| image.starts_with("node:"))
        .and_then(|image| image.split_whitespace().next())
        .context("the Dockerfile builds on no node image")?;
    let ui = Document::read("docs/ui.md")?;
    ensure!(
        ui.text.contains(&format!("`{node}`")),
        "{}: the Dockerfile builds the extension on {node}; say so where ui.md describes the build",
        ui.path
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Figures: the commit and the command that produced each

/// One section of a document: its heading (level, text, line) and its own lines (up to the
/// next heading of any level), code blocks included.
struct Section {
    level: usize,
    heading: String,
    line: usize,
    body: Vec<String>,
}

fn sections(text: &str) -> Vec<Section> {
    let mut sections = vec![Section {
        level: 0,
        heading: String::new(),
        line: 1,
        body: Vec::new(),
    }];
    let mut in_code = false;
    for (index, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !in_code && hashes > 0 && line[hashes..].starts_with(' ') {
            sections.push(Section {
                level: hashes,
                heading: line.to_owned(),
                line: index + 1,
                body: Vec::new(),
            });
        } else if let Some(last) = sections.last_mut() {
            last.body.push(line.to_owned());
        }
    }
    sections
}

/// Table header cells that name a measured quantity.
const MEASURED_COLUMNS: [&str; 9] = [
    "p50",
    "p99",
    "rss",
    "req/s",
    "figures",
    "median",
    "took",
    "heap bytes",
    "peak",
];

/// Whether a section reports a measurement: it says "measured" (not "not measured"), or one
/// of its tables has a column of measured figures (named in its header).
fn reports_figures(section: &Section) -> bool {
    let text = section.body.join("\n").to_lowercase();
    let said = text.matches("measured").count();
    let denied = text.matches("not measured").count();
    let columns = section
        .body
        .windows(2)
        .filter(|pair| pair[0].starts_with('|') && pair[1].starts_with("|---"))
        .any(|pair| {
            MEASURED_COLUMNS
                .iter()
                .any(|c| pair[0].to_lowercase().contains(c))
        });
    said > denied || columns
}

/// The words of a text that may be commits: 7 to 40 hexadecimal digits with a letter and a
/// digit (`git describe --dirty` suffixes and code spans allowed around them). Other projects'
/// hashes (rustc's, in a `--version`) are such words too: [`is_a_commit`] tells them apart.
fn commits(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            (7..=40).contains(&w.len())
                && w.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
                && w.chars().any(|c| c.is_ascii_digit())
                && w.chars().any(|c| c.is_ascii_lowercase())
        })
        .collect()
}

/// Whether a code span is a command that reproduces something: `make …`, `cargo …`, a test
/// binary, or one of those after environment variables (`BENCH_PHASES=fleet make bench`).
fn is_command(span: &str) -> bool {
    let mut words = span.split_whitespace().peekable();
    while words.peek().is_some_and(|w| {
        w.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
    }) {
        words.next();
    }
    let Some(first) = words.next() else {
        return false;
    };
    [
        "make",
        "cargo",
        "helm",
        "kubectl",
        "perf",
        "heaptrack",
        "go",
        "npm",
    ]
    .contains(&first)
        || first.starts_with("target/")
        || first.starts_with("./target/")
        || first.starts_with(".ci/")
}

/// Whether `commit` is one of this repository's commits (`true` when git cannot tell, as in
/// a source tarball: the form is checked then).
fn is_a_commit(commit: &str) -> bool {
    let root = workspace_root();
    let known = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .output()
        .map(|o| o.status);
    let in_repository = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["rev-parse", "--git-dir"])
        .output()
        .is_ok_and(|o| o.status.success());
    !in_repository || known.is_ok_and(|s| s.success())
}

/// The figure sections of `doc` that do not name, in their own heading and text or in those
/// of a section they are part of (before its first subsection), a commit of this repository
/// (`known`) and a command.
fn provenance_problems(doc: &Document, known: &dyn Fn(&str) -> bool) -> Vec<String> {
    let all = sections(&doc.text);
    let mut problems = Vec::new();
    for (at, section) in all.iter().enumerate() {
        if !reports_figures(section) {
            continue;
        }
        // The section itself and the sections it is part of.
        let mut chain = vec![section];
        let mut level = section.level;
        for outer in all[..at].iter().rev() {
            if outer.level < level {
                chain.push(outer);
                level = outer.level;
            }
        }
        let text: String = chain
            .iter()
            .map(|s| format!("{}\n{}\n", s.heading, s.body.join("\n")))
            .collect();
        let named: Vec<&str> = commits(&text).into_iter().filter(|c| known(c)).collect();
        let command = code_spans(&text).into_iter().any(is_command);
        if named.is_empty() || !command {
            problems.push(format!(
                "{}: the figures under {:?} name no {}: add a line (or a table column) with the commit of this repository they were measured at and the command that measures them",
                doc.at(section.line),
                section.heading,
                match (named.is_empty(), command) {
                    (true, false) => "commit and no command",
                    (true, true) => "commit",
                    _ => "command",
                }
            ));
        }
    }
    problems
}

#[test]
fn every_figure_names_its_commit_and_command() -> Result<()> {
    let mut problems = Vec::new();
    let mut figures = 0;
    for entry in std::fs::read_dir(workspace_root().join("docs"))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let name = format!(
            "docs/{}",
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
        );
        let doc = Document::read(&name)?;
        figures += sections(&doc.text)
            .iter()
            .filter(|s| reports_figures(s))
            .count();
        problems.extend(provenance_problems(&doc, &is_a_commit));
    }
    ensure!(
        figures >= 20,
        "found only {figures} figure sections in docs/"
    );
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // A figure section without its commit, or without its command, or with a made-up commit,
    // is caught; a subsection takes them from its section.
    let text = "# T\n\n## Memory\n\nmeasured: 12 MiB (`make bench`).\n\n## Speed\n\n| step | took |\n|---|---|\n| a | 3 s |\n\nAt 5bcf81c.\n\n## Made up\n\nmeasured at 0123abc: `make bench`.\n\n## Other\n\nmeasured at 5bcf81c with `make bench`.\n\n### Part\n\n| p99 |\n|---|\n| 3 ms |\n";
    let doc = Document {
        path: "docs/x.md".to_owned(),
        text: text.to_owned(),
    };
    let caught = provenance_problems(&doc, &|c| c == "5bcf81c");
    ensure!(
        caught.len() == 3
            && caught
                .iter()
                .any(|p| p.contains("\"## Memory\" name no commit"))
            && caught
                .iter()
                .any(|p| p.contains("\"## Speed\" name no command"))
            && caught
                .iter()
                .any(|p| p.contains("\"## Made up\" name no commit")),
        "{caught:?}"
    );
    Ok(())
}
