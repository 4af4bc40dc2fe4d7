//! The command line: `kubectl elemental <command>`, with kubectl's own
//! `--kubeconfig`, `--context` and `-n/--namespace`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Elemental OS changelogs from the cluster, through kube-apiserver with your
/// own kubeconfig, context and permissions.
#[derive(Debug, Parser)]
#[command(name = "kubectl elemental", version, about, long_about = None)]
pub struct Cli {
    /// Who to connect as, and where.
    #[command(flatten)]
    pub connection: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl's connection flags, accepted before or after the command.
#[derive(Debug, Args)]
pub struct Connection {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's namespace, else `default`).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print what changed in a ManagedOSVersion: its advisories and package changes,
    /// compared with the previous version of its channel or with --from; or, with
    /// --machine, what upgrading a machine to its target (or --to) would change.
    Changelog(ChangelogArgs),
    /// List the registered machines (MachineInventories): the version each runs, its
    /// target and what is pending.
    Machines(MachinesArgs),
    /// List the ManagedOSVersions whose changelog fixes a CVE, the first fix first, then the
    /// machines still exposed to it.
    Cve(CveArgs),
    /// List the ManagedOSVersions with their advisory counts (the summary table).
    Versions(VersionsArgs),
    /// List the ManagedOSVersions with what each carries of a package (with --at-least and
    /// --below, only those carrying it in that range of EVRs, in RPM order), then the
    /// machines running them, counted per version.
    Package(PackageArgs),
}

/// `package <name>`.
#[derive(Debug, Args)]
pub struct PackageArgs {
    /// The package name, such as xz.
    pub name: String,
    /// Only versions and machines with the package at this EVR (epoch:version-release, the
    /// epoch and the release optional)
    /// or a higher one.
    #[arg(long, value_name = "EVR")]
    pub at_least: Option<String>,
    /// Only versions and machines with the package at an EVR lower than this one.
    #[arg(long, value_name = "EVR")]
    pub below: Option<String>,
    /// Search every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Architecture of the OS images (default: the server's).
    #[arg(long)]
    pub arch: Option<String>,
    /// Output format: the table, or with more columns.
    #[arg(short, long, value_enum, default_value_t = TableOutput::Table)]
    pub output: TableOutput,
}

/// `changelog <version>`.
#[derive(Debug, Args)]
pub struct ChangelogArgs {
    /// Name of the ManagedOSVersion.
    #[arg(required_unless_present = "machine")]
    pub version: Option<String>,
    /// Compare with this older ManagedOSVersion of the same channel instead of the previous one.
    #[arg(long)]
    pub from: Option<String>,
    /// The changelog pending for this machine (MachineInventory): from the version it runs
    /// to its target.
    #[arg(long, conflicts_with_all = ["version", "from"])]
    pub machine: Option<String>,
    /// With --machine: a newer ManagedOSVersion of the machine's channel instead of its target.
    #[arg(long, requires = "machine", conflicts_with_all = ["version", "from"])]
    pub to: Option<String>,
    /// Architecture of the OS image (x86_64, aarch64; default: the server's).
    #[arg(long)]
    pub arch: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = ChangelogOutput::Text)]
    pub output: ChangelogOutput,
}

/// Output formats of `changelog`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ChangelogOutput {
    /// Plain text for a terminal.
    Text,
    /// Markdown.
    Markdown,
    /// The ManagedOSVersionChangelog object as JSON.
    Json,
    /// The ManagedOSVersionChangelog object as YAML.
    Yaml,
}

/// `cve <CVE-id>`.
#[derive(Debug, Args)]
pub struct CveArgs {
    /// The CVE id, such as CVE-2024-1234.
    pub cve: String,
    /// Search every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Architecture of the OS images (default: the server's).
    #[arg(long)]
    pub arch: Option<String>,
    /// Output format: the table, or with more columns.
    #[arg(short, long, value_enum, default_value_t = TableOutput::Table)]
    pub output: TableOutput,
}

/// `machines`.
#[derive(Debug, Args)]
pub struct MachinesArgs {
    /// List every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only machines whose MachineInventory labels match this selector.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Add each machine's exposure to this CVE (CVE and FIXED IN columns).
    #[arg(long)]
    pub cve: Option<String>,
    /// Architecture of the OS images (default: the server's).
    #[arg(long)]
    pub arch: Option<String>,
    /// Output format: the table, or with more columns.
    #[arg(short, long, value_enum, default_value_t = TableOutput::Table)]
    pub output: TableOutput,
}

/// `versions`.
#[derive(Debug, Args)]
pub struct VersionsArgs {
    /// List every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only versions whose ManagedOSVersion labels match this selector, such as
    /// `elemental.cattle.io/channel=sl-micro`.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Architecture of the OS images (default: the server's).
    #[arg(long)]
    pub arch: Option<String>,
    /// Output format: the table, or with more columns.
    #[arg(short, long, value_enum, default_value_t = TableOutput::Table)]
    pub output: TableOutput,
}

/// Output formats of the table commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TableOutput {
    /// The columns `kubectl get` shows.
    #[value(name = "table", hide = true)]
    Table,
    /// Also the columns `kubectl get -o wide` shows.
    Wide,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        let mut argv = vec!["kubectl-elemental"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn changelog_flags_before_and_after_the_command() {
        let cli = parse(&[
            "-n",
            "fleet-default",
            "changelog",
            "v2",
            "--from",
            "v1",
            "--arch",
            "aarch64",
            "-o",
            "markdown",
            "--context",
            "ctx",
        ]);
        assert_eq!(cli.connection.namespace.as_deref(), Some("fleet-default"));
        assert_eq!(cli.connection.context.as_deref(), Some("ctx"));
        let Command::Changelog(args) = cli.command else {
            panic!("not changelog")
        };
        assert_eq!(args.version.as_deref(), Some("v2"));
        assert_eq!(args.from.as_deref(), Some("v1"));
        assert_eq!(args.arch.as_deref(), Some("aarch64"));
        assert_eq!(args.output, ChangelogOutput::Markdown);
    }

    #[test]
    fn defaults() {
        let Command::Changelog(args) = parse(&["changelog", "v2"]).command else {
            panic!("not changelog")
        };
        assert_eq!(args.output, ChangelogOutput::Text);
        let Command::Versions(args) = parse(&["versions"]).command else {
            panic!("not versions")
        };
        assert!(!args.all_namespaces);
        assert_eq!(args.output, TableOutput::Table);
        let Command::Cve(args) = parse(&["cve", "CVE-2024-1", "-A", "-o", "wide"]).command else {
            panic!("not cve")
        };
        assert!(args.all_namespaces);
        assert_eq!(args.output, TableOutput::Wide);
    }

    #[test]
    fn machines_and_machine_changelogs() {
        let Command::Changelog(args) =
            parse(&["changelog", "--machine", "m-1", "--to", "v3"]).command
        else {
            panic!("not changelog")
        };
        assert_eq!(args.version, None);
        assert_eq!(args.machine.as_deref(), Some("m-1"));
        assert_eq!(args.to.as_deref(), Some("v3"));
        let Command::Machines(args) =
            parse(&["machines", "-A", "--cve", "CVE-2024-1234", "-o", "wide"]).command
        else {
            panic!("not machines")
        };
        assert!(args.all_namespaces);
        assert_eq!(args.cve.as_deref(), Some("CVE-2024-1234"));
        assert_eq!(args.output, TableOutput::Wide);
    }

    #[test]
    fn package_and_its_bounds() {
        let Command::Package(args) = parse(&[
            "package",
            "xz",
            "--at-least",
            "5.6.0",
            "--below",
            "5.6.2",
            "-A",
        ])
        .command
        else {
            panic!("not package")
        };
        assert_eq!(args.name, "xz");
        assert_eq!(args.at_least.as_deref(), Some("5.6.0"));
        assert_eq!(args.below.as_deref(), Some("5.6.2"));
        assert!(args.all_namespaces);
        assert_eq!(args.output, TableOutput::Table);
    }

    #[test]
    fn bad_input_is_refused() {
        for args in [
            &["changelog"][..],
            &["changelog", "v2", "--machine", "m"],
            &["changelog", "--machine", "m", "--from", "v1"],
            &["changelog", "v2", "--to", "v3"],
            &["changelog", "--to", "v3"],
            &["changelog", "v2", "-o", "html"],
            &["versions", "-o", "json"],
            &["package"],
            &["package", "xz", "--at-least"],
            &["frobnicate"],
        ] {
            let mut argv = vec!["kubectl-elemental"];
            argv.extend_from_slice(args);
            assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
        }
    }
}
