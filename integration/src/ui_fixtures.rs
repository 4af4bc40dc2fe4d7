//! The server's answers kept as the UI's test fixtures (`ui/fixtures/`): written by the
//! end-to-end tests that fetch them, with run-specific values replaced, and compared with the
//! committed files, so a change of the JSON contract reaches the UI's unit tests.
//! `UPDATE_UI_FIXTURES=1` rewrites them.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde_json::Value;

/// Set to `1` to rewrite the fixtures.
pub const UPDATE_ENV: &str = "UPDATE_UI_FIXTURES";
/// The fixed values run-specific ones are replaced with.
pub const FIXED_TIME: &str = "2026-01-01T00:00:00Z";
/// See [`FIXED_TIME`].
pub const FIXED_UID: &str = "00000000-0000-4000-8000-000000000000";
/// See [`FIXED_TIME`].
pub const FIXED_RESOURCE_VERSION: &str = "1";

/// Whether `UPDATE_UI_FIXTURES=1`.
pub fn updating() -> bool {
    std::env::var_os(UPDATE_ENV).is_some_and(|v| v == "1")
}

/// Replaces run-specific values: registry addresses (longest first, so one
/// address that is a prefix of another cannot leave a tail) and creation
/// times.
pub fn normalize(value: &mut Value, replacements: &[(&str, &str)]) {
    match value {
        Value::String(text) => {
            for (from, to) in replacements {
                if text.contains(from) {
                    *text = text.replace(from, to);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalize(v, replacements)),
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if key == "creationTimestamp" && v.is_string() {
                    *v = Value::String(FIXED_TIME.to_owned());
                } else if key == "uid" && v.is_string() {
                    *v = Value::String(FIXED_UID.to_owned());
                } else if key == "resourceVersion" && v.is_string() {
                    *v = Value::String(FIXED_RESOURCE_VERSION.to_owned());
                } else {
                    normalize(v, replacements);
                }
            }
        }
        _ => {}
    }
}

/// Compares the normalized answers with `dir/<name>.json`; rewrites the
/// files (and removes the others) when updating. Returns the names of the
/// files that differ or are no longer written (none when updating).
pub fn check(
    dir: &Path,
    answers: &BTreeMap<String, Value>,
    replacements: &[(&str, &str)],
) -> Result<Vec<String>> {
    let mut replacements = replacements.to_vec();
    replacements.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let mut stale = Vec::new();
    for (name, answer) in answers {
        let mut answer = answer.clone();
        normalize(&mut answer, &replacements);
        let text = format!("{}\n", serde_json::to_string_pretty(&answer)?);
        let file = dir.join(format!("{name}.json"));
        let committed = std::fs::read_to_string(&file).unwrap_or_default();
        if committed == text {
            continue;
        }
        if updating() {
            std::fs::create_dir_all(dir)?;
            std::fs::write(&file, &text)?;
            eprintln!("{UPDATE_ENV}=1: wrote {}", file.display());
        } else {
            stale.push(format!("{name}.json"));
        }
    }
    // A fixture the test no longer writes would test the UI on an answer
    // nobody checks any more.
    for entry in std::fs::read_dir(dir)? {
        let file = entry?.path();
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        if file.extension().is_some_and(|e| e == "json") && !answers.contains_key(name) {
            if updating() {
                std::fs::remove_file(&file)?;
                eprintln!("{UPDATE_ENV}=1: removed {}", file.display());
            } else {
                stale.push(format!("{name}.json (no longer written)"));
            }
        }
    }
    Ok(stale)
}
