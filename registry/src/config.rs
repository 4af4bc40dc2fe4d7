//! Registry settings: command line flags, credentials from a Docker config
//! JSON, an extra CA bundle, plain-HTTP registries, limits and timeouts.

use std::{collections::HashMap, fmt, path::PathBuf, sync::Arc, time::Duration};

use base64::Engine as _;
use rustls_pki_types::{CertificateDer, pem::PemObject as _};
use serde::Deserialize;

use crate::{
    budget::{BudgetError, PullMemory},
    limits::{FetchLimits, KeepFiles, MAX_INDEX_MANIFESTS, MAX_LAYERS},
};

/// Registry flags, to be flattened into the server's and `inspect`'s command
/// lines; [`RegistryArgs::to_config`] turns them into a [`FetchConfig`].
#[derive(Clone, Debug, clap::Args)]
pub struct RegistryArgs {
    /// Registry credentials: a Docker config JSON file, as the `.dockerconfigjson` key of a
    /// `kubernetes.io/dockerconfigjson` Secret (`{"auths":{"host[:port]":{"auth":"base64(user:password)"}}}`).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_REGISTRY_CONFIG")]
    pub registry_config: Option<PathBuf>,
    /// PEM bundle of CA certificates trusted for registries, besides the system roots.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_REGISTRY_CA_FILE")]
    pub registry_ca_file: Option<PathBuf>,
    /// Namespaces whose channels may use a credential of `--registry-config` that names none
    /// itself (its entry's `"namespaces"`); repeat or separate with commas; `*`: every
    /// namespace. A channel elsewhere pulls anonymously. Default: the watched namespaces
    /// (`--namespace`), or `fleet-default` when every namespace is watched.
    #[arg(
        long = "registry-credential-namespace",
        env = "ELEMENTAL_CHANGELOG_REGISTRY_CREDENTIAL_NAMESPACES",
        value_delimiter = ','
    )]
    pub registry_credential_namespaces: Vec<String>,
    /// Registries (`host[:port]`) channel images may name; repeat or separate with commas. An
    /// image elsewhere is refused before any connection. Empty: any registry.
    #[arg(
        long = "allowed-registry",
        env = "ELEMENTAL_CHANGELOG_ALLOWED_REGISTRIES",
        value_delimiter = ','
    )]
    pub allowed_registries: Vec<String>,
    /// Registry (`host[:port]`) reached over plain HTTP; repeat for several. All others use HTTPS.
    #[arg(
        long = "insecure-registry",
        env = "ELEMENTAL_CHANGELOG_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    pub insecure_registries: Vec<String>,
    /// Most compressed bytes pulled for one image (all layers), e.g. `256MiB`.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_MAX_IMAGE_SIZE", default_value = "256MiB", value_parser = parse_byte_size)]
    pub max_image_size: u64,
    /// Most decompressed bytes read from one image's layers, e.g. `512MiB`.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_MAX_UNCOMPRESSED_SIZE", default_value = "512MiB", value_parser = parse_byte_size)]
    pub max_uncompressed_size: u64,
    /// Most tar entries read from one image's layers.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_MAX_LAYER_ENTRIES",
        default_value_t = 100_000
    )]
    pub max_layer_entries: u64,
    /// Largest `channel.json` or `changelogs/*` file accepted, e.g. `32MiB`.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_MAX_FILE_SIZE", default_value = "24MiB", value_parser = parse_byte_size)]
    pub max_file_size: u64,
    /// Most bytes of channel data kept from one image (all kept files together), e.g. `24MiB`.
    /// The memory budget must hold 4 times this plus a quarter of itself.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_MAX_KEPT_SIZE", default_value = "24MiB", value_parser = parse_byte_size)]
    pub max_kept_size: u64,
    /// Memory that pulls and parses of channel images may hold in all (`160MiB`, `160Mi`): they
    /// wait while it is spent, and what could never fit is refused. Size it from the container's
    /// memory limit, leaving room for the process itself (see docs/operations.md).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_MEMORY_BUDGET", default_value = "160MiB", value_parser = parse_byte_size)]
    pub memory_budget: u64,
    /// Timeout for connecting to a registry.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_REGISTRY_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub registry_connect_timeout: Duration,
    /// Timeout for each read from a registry connection, and for the whole of a manifest, token or error answer.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_REGISTRY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub registry_read_timeout: Duration,
    /// Timeout for the digest check of one image, and separately for its pull for one
    /// architecture (the wait for the memory budget, manifests and layers).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_FETCH_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub fetch_timeout: Duration,
}

impl Default for RegistryArgs {
    /// The flags' defaults, as an empty command line gives them (the environment is not
    /// read): the one place they are written is the flags' attributes.
    fn default() -> Self {
        use clap::{Args as _, FromArgMatches as _};
        let command =
            Self::augment_args(clap::Command::new("defaults")).mut_args(|arg| arg.env(None));
        Self::from_arg_matches(&command.get_matches_from(["defaults"]))
            .expect("every registry flag has a default")
    }
}

impl RegistryArgs {
    /// The size and count limits the flags set.
    pub fn limits(&self) -> FetchLimits {
        FetchLimits {
            max_compressed_bytes: self.max_image_size,
            max_uncompressed_bytes: self.max_uncompressed_size,
            max_entries: self.max_layer_entries,
            max_file_bytes: self.max_file_size,
            max_kept_bytes: self.max_kept_size,
            max_layers: MAX_LAYERS,
            max_index_manifests: MAX_INDEX_MANIFESTS,
        }
    }

    /// Reads the files the flags name and builds the fetcher settings, for
    /// a fetcher that keeps the files `keep` names.
    pub fn to_config(&self, keep: KeepFiles) -> Result<FetchConfig, ConfigError> {
        let credentials = match &self.registry_config {
            Some(path) => {
                let data = std::fs::read(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                RegistryCredentials::from_docker_config(&data).map_err(|source| {
                    ConfigError::DockerConfig {
                        path: path.clone(),
                        source,
                    }
                })?
            }
            None => RegistryCredentials::default(),
        }
        .with_default_namespaces(&self.registry_credential_namespaces);
        let extra_roots = match &self.registry_ca_file {
            Some(path) => {
                let data = std::fs::read(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                parse_ca_bundle(&data).map_err(|source| ConfigError::CaBundle {
                    path: path.clone(),
                    source,
                })?
            }
            None => Vec::new(),
        };
        let config = FetchConfig {
            credentials,
            extra_roots,
            insecure_registries: self.insecure_registries.clone(),
            allowed_registries: self
                .allowed_registries
                .iter()
                .map(|r| registry_host(r))
                .collect(),
            keep,
            limits: self.limits(),
            memory_budget: self.memory_budget,
            connect_timeout: self.registry_connect_timeout,
            read_timeout: self.registry_read_timeout,
            fetch_timeout: self.fetch_timeout,
        };
        PullMemory::new(config.memory_budget)
            .largest_pull_fits(config.limits.max_kept_bytes)
            .map_err(ConfigError::Budget)?;
        Ok(config)
    }
}

/// Everything the fetcher needs to know, parsed and validated.
#[derive(Clone, Debug)]
pub struct FetchConfig {
    /// Credentials by registry; registries without an entry are pulled anonymously.
    pub credentials: RegistryCredentials,
    /// CA certificates trusted besides the system roots (DER).
    pub extra_roots: Vec<CertificateDer<'static>>,
    /// Registries (`host[:port]`, as in image references) reached over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Registries (`host[:port]`, lower-case, Docker Hub as `index.docker.io`) images may
    /// name; empty: any.
    pub allowed_registries: Vec<String>,
    /// The files kept from an image's layers.
    pub keep: KeepFiles,
    /// Size and count limits per image.
    pub limits: FetchLimits,
    /// Timeout for connecting to a registry.
    pub connect_timeout: Duration,
    /// Timeout for each read from a registry connection, and for the whole of a manifest, token or error answer.
    pub read_timeout: Duration,
    /// Timeout for a whole fetch of one image.
    pub fetch_timeout: Duration,
    /// Bytes of the memory budget of pulls and parses (see [`PullMemory`]).
    pub memory_budget: u64,
}

impl Default for FetchConfig {
    /// Anonymous HTTPS pulls, system roots, nothing kept, and the flags' defaults.
    fn default() -> Self {
        RegistryArgs::default()
            .to_config(KeepFiles::NOTHING)
            .expect("the flags' defaults read no file and fit the memory budget")
    }
}

impl Default for FetchLimits {
    /// The flags' defaults.
    fn default() -> Self {
        RegistryArgs::default().limits()
    }
}

/// Why the registry settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file named by a flag could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The `--registry-config` file is not a valid Docker config JSON.
    #[error("invalid registry credentials in {}", path.display())]
    DockerConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: CredentialsError,
    },
    /// The `--registry-ca-file` file holds no usable certificate.
    #[error("invalid CA bundle {}", path.display())]
    CaBundle {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: CaBundleError,
    },
    /// `--memory-budget` cannot hold the largest image the other limits allow.
    #[error("the memory budget is too small for the size limits")]
    Budget(#[source] BudgetError),
}

/// What is wrong with a Docker config JSON.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Not JSON of the expected shape.
    #[error("not a Docker config JSON object with \"auths\"")]
    Json(#[source] serde_json::Error),
    /// An `auth` value is not base64.
    #[error("the \"auth\" of {registry} is not base64")]
    Base64 {
        /// The registry key.
        registry: String,
        /// The decoding error.
        #[source]
        source: base64::DecodeError,
    },
    /// An `auth` value does not decode to UTF-8 `user:password`.
    #[error("the \"auth\" of {registry} is not \"user:password\"")]
    AuthFormat {
        /// The registry key.
        registry: String,
    },
    /// An entry has neither `auth` nor `username` and `password`.
    #[error("{registry} has neither \"auth\" nor \"username\" and \"password\"")]
    MissingCredentials {
        /// The registry key.
        registry: String,
    },
    /// An entry's `namespaces` is an empty list: no channel could use it.
    #[error(
        "the \"namespaces\" of {registry} is empty: leave it out to use the default namespaces"
    )]
    NoNamespaces {
        /// The registry key.
        registry: String,
    },
}

/// Whether `registry` (as written in an image reference) is one of `allowed` (empty: any).
pub fn registry_allowed(allowed: &[String], registry: &str) -> bool {
    allowed.is_empty() || allowed.contains(&registry_host(registry))
}

/// What is wrong with a CA bundle.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    /// A PEM section could not be decoded.
    #[error("invalid PEM")]
    Pem(#[source] rustls_pki_types::pem::Error),
    /// The file holds no `CERTIFICATE` section.
    #[error("no certificate in the bundle")]
    Empty,
}

/// Parses a PEM bundle into DER certificates (other PEM sections are skipped).
pub fn parse_ca_bundle(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, CaBundleError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(CaBundleError::Pem)?;
    if certs.is_empty() {
        return Err(CaBundleError::Empty);
    }
    Ok(certs)
}

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The user name.
    pub username: String,
    /// The password (or token used as a password).
    pub password: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The namespaces whose pulls may send a credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Every namespace: `"*"`, an explicit choice.
    Any,
    /// These namespaces only (sorted, without duplicates); none: no namespace's pull, only
    /// [`PullFor::Anyone`].
    Namespaces(Vec<String>),
}

impl Default for Grant {
    /// No namespace.
    fn default() -> Self {
        Self::Namespaces(Vec::new())
    }
}

impl Grant {
    /// The grant a list of namespaces names: `*` among them is every namespace; blank
    /// entries are skipped.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Self {
        let mut namespaces: Vec<String> = names
            .iter()
            .map(|n| n.as_ref().trim())
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        if namespaces.iter().any(|n| n == "*") {
            return Self::Any;
        }
        namespaces.sort();
        namespaces.dedup();
        Self::Namespaces(namespaces)
    }

    /// Whether a pull for `pull_for` may send the credential.
    pub fn allows(&self, pull_for: PullFor<'_>) -> bool {
        match (self, pull_for) {
            (_, PullFor::Anyone) | (Self::Any, _) => true,
            (Self::Namespaces(names), PullFor::Namespace(namespace)) => {
                names.iter().any(|n| n == namespace)
            }
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("every namespace"),
            Self::Namespaces(names) if names.is_empty() => f.write_str("no namespace"),
            Self::Namespaces(names) => write!(f, "namespaces {}", names.join(", ")),
        }
    }
}

/// A credential and the namespaces whose pulls may send it.
#[derive(Clone, Debug)]
struct Scoped {
    credential: Arc<Credential>,
    /// The entry's own `"namespaces"`; `None`: the default grant.
    grant: Option<Grant>,
}

/// Credentials by registry host, from a Docker config JSON, each for the namespaces its entry
/// names (`"namespaces": [...]`, this server's addition to the format; `["*"]`: every
/// namespace) or, when it names none, the default ones
/// ([`RegistryCredentials::with_default_namespaces`]; none: no namespace).
#[derive(Clone, Debug, Default)]
pub struct RegistryCredentials {
    by_registry: HashMap<String, Scoped>,
    default_grant: Grant,
}

#[derive(Deserialize)]
struct DockerConfig {
    auths: HashMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    namespaces: Option<Vec<String>>,
}

/// Whose pull this is: the namespace of the channel an image is read for. A credential is sent
/// only for the namespaces it is granted to; [`PullFor::Anyone`] (a command run by the
/// operator, such as `inspect`) may use every credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PullFor<'a> {
    /// A channel in this namespace.
    Namespace(&'a str),
    /// Not on behalf of a namespace.
    Anyone,
}

/// Which credential a pull sends, if any: part of the key under which what it read may be
/// shared, so that data pulled with a credential never reaches a namespace not granted it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    /// No credential.
    Anonymous,
    /// The credential of this registry (`host[:port]`).
    Credential(String),
}

impl RegistryCredentials {
    /// Parses a Docker config JSON (`{"auths":{"host":{"auth":"..."}}}`; an
    /// entry may give `username` and `password` instead of `auth`). Keys may
    /// be `host[:port]` or URLs such as `https://index.docker.io/v1/`.
    pub fn from_docker_config(json: &[u8]) -> Result<Self, CredentialsError> {
        let config: DockerConfig = serde_json::from_slice(json).map_err(CredentialsError::Json)?;
        let mut by_registry = HashMap::new();
        for (key, auth) in config.auths {
            let credential = match (
                auth.auth.filter(|auth| !auth.is_empty()),
                auth.username,
                auth.password,
            ) {
                (Some(encoded), _, _) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(encoded.trim())
                        .map_err(|source| CredentialsError::Base64 {
                            registry: key.clone(),
                            source,
                        })?;
                    let decoded =
                        String::from_utf8(decoded).map_err(|_| CredentialsError::AuthFormat {
                            registry: key.clone(),
                        })?;
                    let (username, password) =
                        decoded
                            .split_once(':')
                            .ok_or_else(|| CredentialsError::AuthFormat {
                                registry: key.clone(),
                            })?;
                    Credential {
                        username: username.to_owned(),
                        password: password.to_owned(),
                    }
                }
                (None, Some(username), Some(password)) => Credential { username, password },
                _ => return Err(CredentialsError::MissingCredentials { registry: key }),
            };
            if auth.namespaces.as_ref().is_some_and(Vec::is_empty) {
                return Err(CredentialsError::NoNamespaces { registry: key });
            }
            by_registry.insert(
                registry_host(&key),
                Scoped {
                    credential: Arc::new(credential),
                    grant: auth.namespaces.as_deref().map(Grant::from_names),
                },
            );
        }
        Ok(Self {
            by_registry,
            default_grant: Grant::default(),
        })
    }

    /// These credentials, those that name no namespaces granted to `namespaces` (`*`: every
    /// namespace; none: no namespace).
    pub fn with_default_namespaces(mut self, namespaces: &[String]) -> Self {
        self.default_grant = Grant::from_names(namespaces);
        self
    }

    /// Each registry that has a credential (`host[:port]`, sorted) and the namespaces whose
    /// pulls may send it.
    pub fn grants(&self) -> Vec<(&str, &Grant)> {
        let mut grants: Vec<(&str, &Grant)> = self
            .by_registry
            .iter()
            .map(|(registry, scoped)| (registry.as_str(), self.grant_of(scoped)))
            .collect();
        grants.sort_by_key(|(registry, _)| *registry);
        grants
    }

    fn grant_of<'a>(&'a self, scoped: &'a Scoped) -> &'a Grant {
        scoped.grant.as_ref().unwrap_or(&self.default_grant)
    }

    /// Adds (or replaces) the credential of one registry (`host[:port]`), for the default
    /// namespaces.
    pub fn insert(&mut self, registry: &str, credential: Credential) {
        self.by_registry.insert(
            registry_host(registry),
            Scoped {
                credential: Arc::new(credential),
                grant: None,
            },
        );
    }

    /// The credential for a registry as written in an image reference (`host[:port]`;
    /// Docker Hub under any of its names), whoever pulls.
    pub fn get(&self, registry: &str) -> Option<&Credential> {
        self.by_registry
            .get(&registry_host(registry))
            .map(|scoped| scoped.credential.as_ref())
    }

    /// The credential a pull for `pull_for` may send to `registry`: none when the registry has
    /// none, or when it is not granted to that namespace.
    pub fn for_pull(&self, registry: &str, pull_for: PullFor<'_>) -> Option<&Credential> {
        let scoped = self.by_registry.get(&registry_host(registry))?;
        self.grant_of(scoped)
            .allows(pull_for)
            .then_some(scoped.credential.as_ref())
    }

    /// Whether `registry` has a credential that `pull_for` may not send.
    pub fn withheld(&self, registry: &str, pull_for: PullFor<'_>) -> bool {
        self.get(registry).is_some() && self.for_pull(registry, pull_for).is_none()
    }

    /// Which credential a pull for `pull_for` from `registry` sends.
    pub fn access(&self, registry: &str, pull_for: PullFor<'_>) -> Access {
        match self.for_pull(registry, pull_for) {
            Some(_) => Access::Credential(registry_host(registry)),
            None => Access::Anonymous,
        }
    }

    /// Whether no registry has credentials.
    pub fn is_empty(&self) -> bool {
        self.by_registry.is_empty()
    }
}

/// Reduces a Docker config key or a reference's registry to `host[:port]`,
/// lower-cased, with Docker Hub's names folded into `index.docker.io`.
pub(crate) fn registry_host(key: &str) -> String {
    let key = key.trim();
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "index.docker.io".to_owned()
        }
        _ => host,
    }
}

/// Parses a byte size: a whole number of bytes, optionally followed by a unit
/// (`B`, `KiB`, `MiB`, `GiB`, `TiB`, or decimal `kB`, `KB`, `MB`, `GB`, `TB`).
pub fn parse_byte_size(text: &str) -> Result<u64, ByteSizeError> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: u64 = number.parse().map_err(|_| ByteSizeError::Number)?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        // Kubernetes quantities (`256Mi`) too, as in a container's limits.
        "KiB" | "Ki" => 1 << 10,
        "MiB" | "Mi" => 1 << 20,
        "GiB" | "Gi" => 1 << 30,
        "TiB" | "Ti" => 1 << 40,
        "kB" | "KB" | "k" => 1_000,
        "MB" | "M" => 1_000_000,
        "GB" | "G" => 1_000_000_000,
        "TB" | "T" => 1_000_000_000_000,
        _ => return Err(ByteSizeError::Unit),
    };
    number
        .checked_mul(multiplier)
        .ok_or(ByteSizeError::Overflow)
}

/// Why a byte size does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    /// It does not start with a whole number.
    #[error("expected a whole number of bytes, optionally with a unit such as MiB")]
    Number,
    /// The unit is unknown.
    #[error("unknown unit (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)")]
    Unit,
    /// The size does not fit 64 bits.
    #[error("size too large")]
    Overflow,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("0"), Ok(0));
        assert_eq!(parse_byte_size("1234"), Ok(1234));
        assert_eq!(parse_byte_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_byte_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_byte_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_byte_size("12B"), Ok(12));
        assert_eq!(parse_byte_size("MiB"), Err(ByteSizeError::Number));
        assert_eq!(parse_byte_size("-1"), Err(ByteSizeError::Number));
        assert_eq!(parse_byte_size("1.5GiB"), Err(ByteSizeError::Unit));
        assert_eq!(parse_byte_size("3mb"), Err(ByteSizeError::Unit));
        assert_eq!(
            parse_byte_size("99999999999TiB"),
            Err(ByteSizeError::Overflow)
        );
    }

    proptest! {
        #[test]
        fn byte_size_round_trips(n in 0u64..(1 << 40), unit in prop::sample::select(vec![("", 1u64), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GB", 1_000_000_000)])) {
            let text = format!("{n}{}", unit.0);
            prop_assert_eq!(parse_byte_size(&text), n.checked_mul(unit.1).ok_or(ByteSizeError::Overflow));
        }

        #[test]
        fn byte_size_never_panics(text in ".{0,40}") {
            let _ = parse_byte_size(&text);
        }
    }

    #[test]
    fn docker_config_auth_and_username_password() {
        let json = br#"{"auths":{
            "registry.example.com:5000":{"auth":"dXNlcjpwYTpzcw=="},
            "https://index.docker.io/v1/":{"username":"hub","password":"secret"},
            "other.example.com":{"auth":"","username":"u","password":"p","email":"x@example.com"}
        }}"#;
        let creds = RegistryCredentials::from_docker_config(json).unwrap();
        let cred = creds.get("registry.example.com:5000").unwrap();
        assert_eq!(
            (cred.username.as_str(), cred.password.as_str()),
            ("user", "pa:ss")
        );
        assert_eq!(creds.get("docker.io").unwrap().username, "hub");
        assert_eq!(creds.get("index.docker.io").unwrap().password, "secret");
        assert_eq!(creds.get("OTHER.example.com").unwrap().username, "u");
        assert!(creds.get("registry.example.com").is_none());
        assert!(!format!("{cred:?}").contains("pa:ss"));
    }

    #[test]
    fn docker_config_errors() {
        assert!(matches!(
            RegistryCredentials::from_docker_config(b"{}"),
            Err(CredentialsError::Json(_))
        ));
        assert!(matches!(
            RegistryCredentials::from_docker_config(br#"{"auths":{"r":{"auth":"%%%"}}}"#),
            Err(CredentialsError::Base64 { .. })
        ));
        assert!(matches!(
            RegistryCredentials::from_docker_config(br#"{"auths":{"r":{"auth":"bm9jb2xvbg=="}}}"#),
            Err(CredentialsError::AuthFormat { .. })
        ));
        assert!(matches!(
            RegistryCredentials::from_docker_config(br#"{"auths":{"r":{"username":"u"}}}"#),
            Err(CredentialsError::MissingCredentials { .. })
        ));
    }

    /// An entry without `"namespaces"` gets the default grant, which is no namespace until
    /// one is named; `*` is every namespace; `PullFor::Anyone` may use every credential.
    #[test]
    fn credentials_are_narrow_by_default() {
        let json = br#"{"auths":{
            "plain.example":{"auth":"dTpw"},
            "wide.example":{"auth":"dTpw","namespaces":["*"]},
            "team.example":{"auth":"dTpw","namespaces":["team-b"," team-a","team-b"]}
        }}"#;
        let team = PullFor::Namespace("team-a");
        let fleet = PullFor::Namespace("fleet-default");
        let creds = RegistryCredentials::from_docker_config(json).unwrap();
        assert!(creds.for_pull("plain.example", fleet).is_none());
        assert!(creds.for_pull("plain.example", PullFor::Anyone).is_some());
        assert!(creds.for_pull("wide.example", fleet).is_some());
        assert!(creds.for_pull("team.example", team).is_some());
        assert!(creds.for_pull("team.example", fleet).is_none());
        assert_eq!(
            creds
                .grants()
                .iter()
                .map(|(registry, grant)| format!("{registry}: {grant}"))
                .collect::<Vec<_>>(),
            [
                "plain.example: no namespace",
                "team.example: namespaces team-a, team-b",
                "wide.example: every namespace",
            ]
        );
        let creds = creds.with_default_namespaces(&["fleet-default".to_owned()]);
        assert!(creds.for_pull("plain.example", fleet).is_some());
        assert!(creds.for_pull("plain.example", team).is_none());
        assert!(creds.for_pull("team.example", fleet).is_none());
        let creds = creds.with_default_namespaces(&["*".to_owned(), "x".to_owned()]);
        assert!(creds.for_pull("plain.example", team).is_some());
        assert_eq!(creds.grants()[0].1, &Grant::Any);
    }

    #[test]
    fn ca_bundle() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["ca.example".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let bundle = format!("{}\n{}", cert.pem(), cert.pem());
        assert_eq!(parse_ca_bundle(bundle.as_bytes()).unwrap().len(), 2);
        assert!(matches!(
            parse_ca_bundle(b"nothing here"),
            Err(CaBundleError::Empty)
        ));
    }

    #[test]
    fn args_defaults_load() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            registry: RegistryArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--insecure-registry",
            "127.0.0.1:5000",
            "--max-file-size",
            "1MiB",
        ])
        .unwrap();
        let config = cli.registry.to_config(KeepFiles::NOTHING).unwrap();
        assert_eq!(
            config.insecure_registries,
            vec!["127.0.0.1:5000".to_owned()]
        );
        assert_eq!(config.limits.max_file_bytes, 1 << 20);
        assert_eq!(
            config.limits.max_compressed_bytes,
            FetchLimits::default().max_compressed_bytes
        );
        assert_eq!(config.fetch_timeout, FetchConfig::default().fetch_timeout);
    }
}
