//! `kubectl elemental`: Elemental OS changelogs from the
//! `changelog.elemental.cattle.io/v1beta1` aggregated API, through
//! kube-apiserver with the user's kubeconfig, context and RBAC.
//!
//! kubectl runs any `kubectl-elemental` on `PATH` for `kubectl elemental`.
//! Changelogs are fetched as JSON and rendered here with the API crate's own
//! text and Markdown renderers, so they read exactly as `?format=text` does.

mod api;
mod cli;
mod printer;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use elemental_changelog_apiservice::render;
use elemental_changelog_apiservice::types::ManagedOSVersionChangelog;
use serde_json::Value;

use crate::api::{Api, Error, Scope, Warnings};
use crate::cli::{
    ChangelogArgs, ChangelogOutput, Cli, Command, CveArgs, MachinesArgs, PackageArgs, TableOutput,
    VersionsArgs,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // kube's rustls client needs a process-wide crypto provider (ring only).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", render::terminal_safe(&report(&e)));
            ExitCode::FAILURE
        }
    }
}

/// An error and its sources, as one line: `what: why: why`.
fn report(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    line
}

async fn run(cli: Cli) -> Result<(), Error> {
    let api = Api::connect(cli.connection.kubeconfig.as_deref(), cli.connection.context).await?;
    let namespace = cli
        .connection
        .namespace
        .unwrap_or_else(|| api.default_namespace().to_owned());
    let mut warnings = Warnings::default();
    let output = match cli.command {
        Command::Changelog(args) => changelog(&api, &namespace, &args, &mut warnings).await?,
        Command::Cve(args) => cve(&api, &namespace, &args, &mut warnings).await?,
        Command::Machines(args) => machines(&api, &namespace, &args, &mut warnings).await?,
        Command::Versions(args) => versions(&api, &namespace, &args, &mut warnings).await?,
        Command::Package(args) => package(&api, &namespace, &args, &mut warnings).await?,
    };
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`| head`) is not an error worth reporting.
    let _ = stdout
        .write_all(output.as_bytes())
        .and_then(|()| stdout.flush());
    Ok(())
}

async fn changelog(
    api: &Api,
    namespace: &str,
    args: &ChangelogArgs,
    warnings: &mut Warnings,
) -> Result<String, Error> {
    let answer = match (&args.machine, &args.version) {
        (Some(machine), _) => {
            api.machine_changelog(namespace, machine, args.to.as_deref(), args.arch.as_deref())
                .await?
        }
        // clap requires one of them.
        (None, version) => {
            api.changelog(
                namespace,
                version.as_deref().unwrap_or_default(),
                args.from.as_deref(),
                args.arch.as_deref(),
            )
            .await?
        }
    };
    warnings.print(&answer);
    Ok(match args.output {
        ChangelogOutput::Text => {
            render::text(&answer.json::<ManagedOSVersionChangelog>("ManagedOSVersionChangelog")?)
        }
        ChangelogOutput::Markdown => render::markdown(
            &answer.json::<ManagedOSVersionChangelog>("ManagedOSVersionChangelog")?,
        ),
        // The object as served, fields this plugin does not know included.
        ChangelogOutput::Json => json_4_spaces(&answer.json::<Value>("JSON object")?),
        ChangelogOutput::Yaml => {
            serde_yaml::to_string(&answer.json::<Value>("JSON object")?).map_err(Error::Yaml)?
        }
    })
}

/// JSON as kubectl prints it: indented by four spaces, with a final newline.
fn json_4_spaces(value: &Value) -> String {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    // Serializing a `Value` into memory cannot fail.
    let _ = serde::Serialize::serialize(value, &mut serializer);
    let mut text = String::from_utf8_lossy(&out).into_owned();
    text.push('\n');
    text
}

async fn cve(
    api: &Api,
    namespace: &str,
    args: &CveArgs,
    warnings: &mut Warnings,
) -> Result<String, Error> {
    let scope = scope(namespace, args.all_namespaces);
    let params = [
        ("cve", Some(args.cve.as_str())),
        ("arch", args.arch.as_deref()),
    ];
    let none = match &scope {
        Scope::Namespace(ns) => {
            format!("No ManagedOSVersion in namespace {ns} fixes {}.", args.cve)
        }
        Scope::All => format!("No ManagedOSVersion in any namespace fixes {}.", args.cve),
    };
    let mut out = summaries(api, &scope, &params, args.output, &none, warnings).await?;
    // The machines still exposed, with the version that fixes it for each (issue 19); nothing
    // when none is (the output is then the versions alone, as before). A user who may not list
    // machines (or a cluster without the fleet view) gets the versions and a note on stderr.
    match api.machines_table(&scope, &params).await {
        Ok(answer) => {
            warnings.print(&answer);
            let mut table = answer.json::<printer::Table>("Table")?;
            let exposed = exposed_rows(&mut table);
            if exposed > 0 {
                out.push_str(&format!(
                    "\nMachines still exposed to {} ({exposed}; FIXED IN is the version that fixes it for each):\n",
                    args.cve
                ));
                out.push_str(&printer::render(
                    &table,
                    printer::Options {
                        wide: args.output == TableOutput::Wide,
                        with_namespace: scope == Scope::All,
                    },
                ));
            }
        }
        Err(error) => eprintln!("Machines not listed: {error}"),
    }
    Ok(out)
}

/// Keeps the rows of a machines Table whose CVE state is `Exposed`; how many are left.
fn exposed_rows(table: &mut printer::Table) -> usize {
    let column = table
        .column_definitions
        .iter()
        .position(|c| c.name == "CVE");
    table.rows.retain(|row| {
        column
            .and_then(|i| row.cells.get(i))
            .is_some_and(|cell| cell == "Exposed")
    });
    table.rows.len()
}

async fn versions(
    api: &Api,
    namespace: &str,
    args: &VersionsArgs,
    warnings: &mut Warnings,
) -> Result<String, Error> {
    let scope = scope(namespace, args.all_namespaces);
    let params = [
        ("labelSelector", args.selector.as_deref()),
        ("arch", args.arch.as_deref()),
    ];
    // kubectl's wording.
    let none = match &scope {
        Scope::Namespace(ns) => format!("No resources found in {ns} namespace."),
        Scope::All => "No resources found".to_owned(),
    };
    summaries(api, &scope, &params, args.output, &none, warnings).await
}

async fn machines(
    api: &Api,
    namespace: &str,
    args: &MachinesArgs,
    warnings: &mut Warnings,
) -> Result<String, Error> {
    let scope = scope(namespace, args.all_namespaces);
    let params = [
        ("labelSelector", args.selector.as_deref()),
        ("cve", args.cve.as_deref()),
        ("arch", args.arch.as_deref()),
    ];
    let none = match &scope {
        Scope::Namespace(ns) => format!("No resources found in {ns} namespace."),
        Scope::All => "No resources found".to_owned(),
    };
    let answer = api.machines_table(&scope, &params).await?;
    print_table(answer, &scope, args.output, &none, warnings)
}

async fn package(
    api: &Api,
    namespace: &str,
    args: &PackageArgs,
    warnings: &mut Warnings,
) -> Result<String, Error> {
    let scope = scope(namespace, args.all_namespaces);
    let params = [
        ("package", Some(args.name.as_str())),
        ("packageAtLeast", args.at_least.as_deref()),
        ("packageBelow", args.below.as_deref()),
        ("arch", args.arch.as_deref()),
    ];
    let what = match (&args.at_least, &args.below) {
        (None, None) => args.name.clone(),
        (low, high) => format!(
            "{} in [{}, {})",
            args.name,
            low.as_deref().unwrap_or("any"),
            high.as_deref().unwrap_or("any")
        ),
    };
    let none = match &scope {
        Scope::Namespace(ns) => format!("No ManagedOSVersion in namespace {ns} carries {what}."),
        Scope::All => format!("No ManagedOSVersion in any namespace carries {what}."),
    };
    let mut out = summaries(api, &scope, &params, args.output, &none, warnings).await?;
    // The machines, counted per version, then one by one. A user who may not list machines
    // (or a cluster without the fleet view) gets the versions and a note on stderr.
    match api.machines_table(&scope, &params).await {
        Ok(answer) => {
            warnings.print(&answer);
            let table = answer.json::<printer::Table>("Table")?;
            let options = printer::Options {
                wide: args.output == TableOutput::Wide,
                with_namespace: scope == Scope::All,
            };
            if table.rows.is_empty() {
                out.push_str(&format!("\nNo machine runs {what}.\n"));
            } else {
                out.push_str(&format!(
                    "\nMachines running {what} ({}), per version:\n",
                    table.rows.len()
                ));
                out.push_str(&printer::render(&per_version(&table), options));
                out.push('\n');
                out.push_str(&printer::render(&table, options));
            }
        }
        Err(error) => eprintln!("Machines not listed: {error}"),
    }
    Ok(out)
}

/// The machines of a `?package=` machines Table counted per namespace, current version and
/// package: a Table of CURRENT, PACKAGE and MACHINES, in the order each first appears.
fn per_version(machines: &printer::Table) -> printer::Table {
    let at = |name: &str| {
        machines
            .column_definitions
            .iter()
            .position(|c| c.name == name)
    };
    let (current, package) = (at("Current"), at("Package"));
    let mut counts: Vec<((String, Value, Value), usize)> = Vec::new();
    for row in &machines.rows {
        let namespace = row
            .object
            .as_ref()
            .and_then(|o| o.pointer("/metadata/namespace"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let cell = |i: Option<usize>| {
            i.and_then(|i| row.cells.get(i))
                .cloned()
                .unwrap_or(Value::Null)
        };
        let key = (namespace, cell(current), cell(package));
        match counts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => counts.push((key, 1)),
        }
    }
    let column = |name: &str| printer::Column {
        name: name.to_owned(),
        priority: 0,
    };
    printer::Table {
        column_definitions: vec![column("Current"), column("Package"), column("Machines")],
        rows: counts
            .into_iter()
            .map(|((namespace, current, package), n)| printer::Row {
                cells: vec![
                    if current.is_null() {
                        Value::from("<unknown>")
                    } else {
                        current
                    },
                    package,
                    Value::from(n),
                ],
                object: Some(serde_json::json!({"metadata": {"namespace": namespace}})),
            })
            .collect(),
    }
}

/// The summaries Table of `scope` with `params`, printed as kubectl prints
/// it; `none` goes to stderr when it has no rows.
async fn summaries(
    api: &Api,
    scope: &Scope,
    params: &[(&str, Option<&str>)],
    output: TableOutput,
    none: &str,
    warnings: &mut Warnings,
) -> Result<String, Error> {
    let answer = api.summaries_table(scope, params).await?;
    print_table(answer, scope, output, none, warnings)
}

/// A Table answer printed as kubectl prints it; `none` goes to stderr when it has no rows.
fn print_table(
    answer: api::Answer,
    scope: &Scope,
    output: TableOutput,
    none: &str,
    warnings: &mut Warnings,
) -> Result<String, Error> {
    warnings.print(&answer);
    let table = answer.json::<printer::Table>("Table")?;
    if table.rows.is_empty() {
        eprintln!("{none}");
    }
    Ok(printer::render(
        &table,
        printer::Options {
            wide: output == TableOutput::Wide,
            with_namespace: *scope == Scope::All,
        },
    ))
}

fn scope(namespace: &str, all: bool) -> Scope {
    if all {
        Scope::All
    } else {
        Scope::Namespace(namespace.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exposed_machines_are_kept() {
        let mut table: printer::Table = serde_json::from_value(serde_json::json!({
            "kind": "Table",
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0},
                {"name": "CVE", "type": "string", "format": "", "description": "", "priority": 0},
                {"name": "Fixed In", "type": "string", "format": "", "description": "", "priority": 0}
            ],
            "rows": [
                {"cells": ["m-1", "Exposed", "v2"]},
                {"cells": ["m-2", "Fixed", "v2"]},
                {"cells": ["m-3", "NoFixInChannel", "<none>"]},
                {"cells": ["m-4", "Exposed", "v3"]}
            ]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exposed_rows(&mut table), 2);
        let names: Vec<_> = table.rows.iter().map(|r| r.cells[0].clone()).collect();
        assert_eq!(names, ["m-1", "m-4"]);
    }

    #[test]
    fn machines_are_counted_per_version() {
        let table: printer::Table = serde_json::from_value(serde_json::json!({
            "kind": "Table",
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0},
                {"name": "Current", "type": "string", "format": "", "description": "", "priority": 0},
                {"name": "Package", "type": "string", "format": "", "description": "", "priority": 0}
            ],
            "rows": [
                {"cells": ["m-1", "1.1.0", "xz-5.6.0-1.1.x86_64"], "object": {"metadata": {"namespace": "a"}}},
                {"cells": ["m-2", "1.2.0", "xz-5.6.1-1.1.x86_64"], "object": {"metadata": {"namespace": "a"}}},
                {"cells": ["m-3", "1.1.0", "xz-5.6.0-1.1.x86_64"], "object": {"metadata": {"namespace": "a"}}},
                {"cells": ["m-4", "1.1.0", "xz-5.6.0-1.1.x86_64"], "object": {"metadata": {"namespace": "b"}}},
                {"cells": ["m-5", null, "xz (Unknown)"], "object": {"metadata": {"namespace": "b"}}}
            ]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let counts = per_version(&table);
        let printed = printer::render(
            &counts,
            printer::Options {
                wide: false,
                with_namespace: true,
            },
        );
        assert_eq!(
            printed,
            "NAMESPACE   CURRENT     PACKAGE               MACHINES\n\
             a           1.1.0       xz-5.6.0-1.1.x86_64   2\n\
             a           1.2.0       xz-5.6.1-1.1.x86_64   1\n\
             b           1.1.0       xz-5.6.0-1.1.x86_64   1\n\
             b           <unknown>   xz (Unknown)          1\n"
        );
    }

    #[test]
    fn json_is_indented_like_kubectl() {
        let value = serde_json::json!({"a": [1, {"b": null}]});
        assert_eq!(
            json_4_spaces(&value),
            "{\n    \"a\": [\n        1,\n        {\n            \"b\": null\n        }\n    ]\n}\n"
        );
    }

    #[test]
    fn report_joins_the_sources() {
        let error = Error::Read(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(
            report(&error),
            "Unable to read the server's response: connection reset"
        );
    }
}
