//! The operator's documents against the code, so that neither drifts alone:
//!
//! - every flag of `elemental-changelog-apiserver --help` (clap, the source of truth) is a
//!   row of a flag table of `docs/operations.md` with the same environment variable and
//!   default, and every flag row there is a flag of the binary;
//! - every metric the server registers (read from the source that defines them, wherever
//!   the crate split puts it) is a row of the metrics table with the same labels, and every
//!   metric row there is registered;
//! - every `Status` reason and every cause reason the server sends is a row of the error
//!   table of `docs/api.md` with its HTTP code, and the fixed messages are quoted as sent;
//! - every machine reason of the fleet view is a row of its reason table with its state.
//!
//! Needs `target/debug/elemental-changelog-apiserver` (`make server`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_apiserver::{request, server};
use elemental_changelog_apiservice::status::{Reason, StatusError};
use elemental_changelog_apiservice::types::UnavailableReason;
use elemental_changelog_integration::testbed::{server_binary, workspace_root};

fn doc(name: &str) -> Result<String> {
    let path = workspace_root().join("docs").join(name);
    std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))
}

/// The cells of the Markdown table rows of `text` (lines starting with `|`), without the
/// header separators; `\|` inside a cell stays in the cell.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|line| line.starts_with('|') && !line.starts_with("|---"))
        .map(|line| {
            let mut cells = Vec::new();
            let mut cell = String::new();
            let mut chars = line.trim().trim_start_matches('|').chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '\\' if chars.peek() == Some(&'|') => {
                        cell.push('|');
                        chars.next();
                    }
                    '|' => cells.push(std::mem::take(&mut cell).trim().to_owned()),
                    _ => cell.push(c),
                }
            }
            cells
        })
        .collect()
}

/// The text of the first `code span` of a cell, if the cell starts with one.
fn leading_code(cell: &str) -> Option<&str> {
    cell.strip_prefix('`')?.split('`').next()
}

/// The code spans of a cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

// ---------------------------------------------------------------------------
// Flags

/// One flag as `--help` shows it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Flag {
    env: Option<String>,
    default: Option<String>,
}

/// The flags of `--help`, from clap's long help: a line `--name <VALUE>`, then
/// `[env: NAME=]` and `[default: VALUE]` lines.
fn help_flags(help: &str) -> Result<BTreeMap<String, Flag>> {
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim();
        let flag_line = trimmed
            .strip_prefix("-h, ")
            .or_else(|| trimmed.strip_prefix("-V, "))
            .unwrap_or(trimmed);
        if line.starts_with("      --") || line.starts_with("  -") {
            let name = flag_line
                .split_whitespace()
                .next()
                .context("empty flag line")?
                .to_owned();
            flags.insert(name.clone(), Flag::default());
            current = Some(name);
        } else if let Some(name) = &current {
            let flag = flags.get_mut(name).context("flag")?;
            if let Some(env) = trimmed.strip_prefix("[env: ") {
                flag.env = Some(env.split('=').next().unwrap_or_default().to_owned());
            } else if let Some(default) = trimmed.strip_prefix("[default: ") {
                flag.default = Some(default.trim_end_matches(']').to_owned());
            }
        }
    }
    flags.remove("--help");
    flags.remove("--version");
    ensure!(
        flags.len() > 20,
        "read only {} flags from --help",
        flags.len()
    );
    Ok(flags)
}

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
    let help = help_flags(&String::from_utf8(output.stdout)?)?;
    let documented = documented_flags(&doc("operations.md")?);

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

#[test]
fn the_flag_comparison_catches_a_wrong_default_or_variable() {
    let flag = Flag {
        env: Some("ELEMENTAL_CHANGELOG_MAX_FILE_SIZE".into()),
        default: Some("24MiB".into()),
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

/// Every `Status` reason, with whether this server sends it. The match has no wildcard:
/// a new reason does not compile until it is listed here (and so checked in api.md).
fn reasons() -> Vec<(Reason, bool)> {
    let all = [
        Reason::BadRequest,
        Reason::Unauthorized,
        Reason::Forbidden,
        Reason::NotFound,
        Reason::MethodNotAllowed,
        Reason::NotAcceptable,
        Reason::Expired,
        Reason::UnsupportedMediaType,
        Reason::TooManyRequests,
        Reason::InternalError,
        Reason::ServiceUnavailable,
        Reason::Timeout,
    ];
    all.into_iter()
        .map(|reason| {
            let sent = match reason {
                // A read-only API reads no request body.
                Reason::UnsupportedMediaType => false,
                Reason::BadRequest
                | Reason::Unauthorized
                | Reason::Forbidden
                | Reason::NotFound
                | Reason::MethodNotAllowed
                | Reason::NotAcceptable
                | Reason::Expired
                | Reason::TooManyRequests
                | Reason::InternalError
                | Reason::ServiceUnavailable
                | Reason::Timeout => true,
            };
            (reason, sent)
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

    let mut problems = Vec::new();
    for (reason, sent) in reasons() {
        let row = (reason.code(), reason.as_str().to_owned());
        if sent && !documented.contains(&row) {
            problems.push(format!(
                "{} {} is sent but not in the error table of docs/api.md",
                row.0, row.1
            ));
        }
        if !sent && documented.contains(&row) {
            problems.push(format!(
                "{} {} is in docs/api.md but never sent",
                row.0, row.1
            ));
        }
    }
    for (code, reason) in &documented {
        if !reasons()
            .iter()
            .any(|(r, _)| r.code() == *code && r.as_str() == reason)
        {
            problems.push(format!(
                "docs/api.md lists {code} {reason}, which is no Status reason of the server"
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
