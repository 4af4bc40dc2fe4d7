//! Command line and environment: parsed once into typed settings.
//!
//! Flag names follow k8s.io/apiserver where they overlap (`--secure-port`,
//! `--tls-cert-file`, ...). Every flag has an environment variable
//! `ELEMENTAL_CHANGELOG_<FLAG>`.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};
use elemental_changelog_apiservice::Arch;

use crate::{access_log::AccessLog, telemetry::LogFormat};

/// Kubernetes aggregated API server serving Elemental OS changelogs as the
/// read-only `changelog` subresource of ManagedOSVersion.
#[derive(Debug, Parser)]
#[command(name = "elemental-changelog-apiserver", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Run a one-off command instead of the server.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Server settings (when no command is given).
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Commands besides serving.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pull a channel image and print what the server would serve for it,
    /// without any cluster: a debugging aid for channel builders.
    Inspect(Box<InspectArgs>),
    /// Write the precomputed `<name>.updates.log` files a channel image should
    /// carry, from its channel.json, package lists and updateinfo.xml.
    Compute(ComputeArgs),
}

/// `inspect` settings.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Image reference, e.g. `registry.example.com/elemental/channel:v1`.
    pub image: String,
    /// Architecture to read from a multi-architecture image.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_ARCH", default_value = "x86_64")]
    pub arch: Arch,
    /// ManagedOSVersion name to print the full changelog of (default: a summary of every version).
    #[arg(long)]
    pub version: Option<String>,
    /// Compare against this version instead of the previous one.
    #[arg(long, requires = "version")]
    pub from: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Log line format.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Registry access.
    #[command(flatten)]
    pub registry: elemental_changelog_registry::RegistryArgs,
}

/// `compute` settings.
#[derive(Debug, Args)]
pub struct ComputeArgs {
    /// The channel's `channel.json`.
    #[arg(long)]
    pub channel: PathBuf,
    /// Folder holding `<name>.packages` files (rpm -qa format) for the versions.
    #[arg(long)]
    pub packages: PathBuf,
    /// SUSE repodata `updateinfo.xml` (optionally `.gz` or `.zst`).
    #[arg(long)]
    pub updateinfo: PathBuf,
    /// Folder to write `<name>.updates.log` files into.
    #[arg(long)]
    pub output: PathBuf,
}

/// Output format of `inspect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// JSON, as the API serves it.
    Json,
    /// Plain text for people.
    Text,
}

/// Server settings.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Port to serve HTTPS on.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_SECURE_PORT", default_value_t = 8443)]
    pub secure_port: u16,
    /// Address to listen on.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_BIND_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub bind_address: IpAddr,
    /// Serving certificate (PEM, leaf first, then intermediates). Reloaded when it changes.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,
    /// Folder for a self-signed serving pair, generated when no certificate files are given.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_CERT_DIR",
        default_value = "apiserver.local.config/certificates"
    )]
    pub cert_dir: PathBuf,
    /// Host names and addresses the self-signed certificate is valid for.
    #[arg(
        long = "self-signed-host",
        env = "ELEMENTAL_CHANGELOG_SELF_SIGNED_HOSTS",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1"
    )]
    pub self_signed_hosts: Vec<String>,
    /// Kubeconfig to reach the Kubernetes API (default: $KUBECONFIG, else in-cluster).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace to watch channels and versions in; repeat for several (default: all).
    #[arg(
        long = "namespace",
        env = "ELEMENTAL_CHANGELOG_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,
    /// Namespace of the channel history ConfigMap: the server's own (the
    /// chart sets `POD_NAMESPACE` from the downward API). Default, in a pod
    /// without a kubeconfig: the service account's namespace. Otherwise the
    /// history is off and versions a newer image dropped are served only by the
    /// replica that read the older image, until it restarts.
    #[arg(long, env = "POD_NAMESPACE")]
    pub history_namespace: Option<String>,
    /// Name of the channel history ConfigMap (one per installation).
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_HISTORY_CONFIGMAP",
        default_value = "elemental-changelog-history"
    )]
    pub history_configmap: String,
    /// How often each channel image's digest is checked (nothing is pulled when unchanged).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_REFRESH_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub refresh_interval: Duration,
    /// Architectures whose data is read from multi-architecture channel images.
    #[arg(
        long = "architecture",
        env = "ELEMENTAL_CHANGELOG_ARCHITECTURES",
        value_delimiter = ',',
        default_value = "x86_64,aarch64"
    )]
    pub architectures: Vec<Arch>,
    /// Architecture served when a request names none.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_DEFAULT_ARCH",
        default_value = "x86_64"
    )]
    pub default_arch: Arch,
    /// Connections, requests, deadlines and shutdown.
    #[command(flatten)]
    pub serving: crate::server::ServingLimits,
    /// Log line format.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
    /// Which requests on this server's port are logged, one `access` line each (user, groups,
    /// verb, path, code, bytes, latency, whether through kube-apiserver): `refusals` (401,
    /// 403, 429), `all`, or `off`. Requests kube-apiserver passes on are in its audit log too.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_ACCESS_LOG", value_enum, default_value_t = AccessLog::Refusals)]
    pub access_log: AccessLog,
    /// Most bytes of parsed channel data kept in memory for all channels together (each image
    /// once, however many channels share it), e.g. `256MiB`. A channel whose new image would
    /// take the total past it keeps its last good data; a new one serves nothing. Size it from
    /// the container's memory limit, next to `--memory-budget` (see docs/operations.md).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_MAX_KEPT_TOTAL", default_value = "256MiB", value_parser = elemental_changelog_registry::config::parse_byte_size)]
    pub max_kept_total: u64,
    /// Registry access.
    #[command(flatten)]
    pub registry: elemental_changelog_registry::RegistryArgs,
    /// Authentication.
    #[command(flatten)]
    pub authn: elemental_changelog_auth::authn::AuthnArgs,
    /// Authorization.
    #[command(flatten)]
    pub authz: elemental_changelog_auth::authz::AuthzArgs,
}

/// Where the elemental-operator keeps its channels: the namespace registry credentials that
/// name none are granted to by default when every namespace is watched.
pub const OPERATOR_NAMESPACE: &str = "fleet-default";

impl ServeArgs {
    /// The registry flags, with the namespaces granted the credentials that name none
    /// resolved: `--registry-credential-namespace` when given, else the watched namespaces
    /// (`--namespace`), else [`OPERATOR_NAMESPACE`]. Never every namespace unless `*` says so.
    pub fn registry_args(&self) -> elemental_changelog_registry::RegistryArgs {
        let mut registry = self.registry.clone();
        let named = |names: &[String]| names.iter().any(|n| !n.trim().is_empty());
        if !named(&registry.registry_credential_namespaces) {
            registry.registry_credential_namespaces = if named(&self.namespaces) {
                self.namespaces.clone()
            } else {
                vec![OPERATOR_NAMESPACE.to_owned()]
            };
        }
        registry
    }
}

#[cfg(test)]
mod tests;
