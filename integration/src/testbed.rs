//! The real control plane on loopback: etcd and kube-apiserver with the
//! aggregation layer, the Elemental CRDs, and our server registered through an
//! `APIService`, all torn down when the [`TestBed`] is dropped.
//!
//! Layout of a run's directory (kept on failure with `TESTBED_KEEP=1`):
//! `pki/` (CAs, certificates, keys), `etcd/` (data), `logs/` (one file per
//! process), `kubeconfig` (admin, client certificate), `users/` (one kubeconfig
//! per static-token user), `tokens.csv`.
//!
//! Binaries come from `target/testbed/bin` (built by
//! `integration/testbed/build.sh`, or `TESTBED_BIN`; Rancher's Steve too, see [`steve`]) and our server from
//! `target/debug/elemental-changelog-apiserver` (or `ELEMENTAL_CHANGELOG_BIN`).

pub mod elemental;
pub mod kubeconfig;
pub mod lb;
pub mod pki;
pub mod process;
pub mod steve;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use elemental_changelog_apiservice::{GROUP, VERSION};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceSpec, ServiceReference,
};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tempfile::TempDir;
use tokio::io::AsyncWriteExt as _;

use crate::registry::Registry;
use crate::wait::POLL;

pub use kubeconfig::Credentials;
pub use pki::{Ca, CertPair};
pub use process::Process;
pub use steve::{Steve, SteveCache, Subscription};

/// Namespace of our server's Service (the chart's default release namespace).
pub const SERVER_NAMESPACE: &str = "cattle-elemental-system";
/// Name of our server's Service; also the chart release and ServiceAccount name
/// the test bed uses, so the chart's RBAC applies unchanged.
pub const SERVICE_NAME: &str = "elemental-changelog";
/// Name of our `APIService`.
pub const APISERVICE_NAME: &str = "v1beta1.changelog.elemental.cattle.io";
/// Namespace where the Elemental operator keeps channels and versions.
pub const FLEET_NAMESPACE: &str = "fleet-default";
/// The CN kube-apiserver's front-proxy client certificate carries, and the only allowed name.
pub const FRONT_PROXY_CN: &str = "front-proxy-client";

/// Users known to kube-apiserver through its static token file, with their groups.
/// None has any role; tests bind what they need.
pub const TOKEN_USERS: &[(&str, &[&str])] = &[
    ("alice", &[]),
    ("bob", &[]),
    ("carol", &["elemental-viewers"]),
];

/// Bound on waiting for one process or condition; generous for a loaded CI machine.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// `Accept` for kube-apiserver's aggregated discovery (`/apis`, v2).
pub const AGGREGATED_DISCOVERY: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The operator's CRDs this server reads. MachineInventorySelector is left out on purpose:
/// its absence is the missing-CRD case of the fleet view (treated as empty).
const CRDS: [&str; 4] = [
    include_str!("../crds/elemental.cattle.io_managedosversionchannels.yaml"),
    include_str!("../crds/elemental.cattle.io_managedosversions.yaml"),
    include_str!("../crds/elemental.cattle.io_machineinventories.yaml"),
    include_str!("../crds/elemental.cattle.io_managedosimages.yaml"),
];

/// What to start a [`TestBed`] with.
#[derive(Clone, Debug)]
pub struct TestBedOptions {
    /// Extra flags for kube-apiserver, after the test bed's own.
    pub apiserver_args: Vec<String>,
    /// Namespaces to create besides the built-in ones and [`SERVER_NAMESPACE`].
    pub namespaces: Vec<String>,
}

impl Default for TestBedOptions {
    fn default() -> Self {
        Self {
            apiserver_args: Vec::new(),
            namespaces: vec![FLEET_NAMESPACE.to_owned()],
        }
    }
}

/// The certificate authorities of one test bed and the certificates made from them.
#[derive(Debug)]
pub struct Pki {
    /// Signs kube-apiserver's serving certificate.
    pub cluster_ca: Ca,
    /// kube-apiserver's `--client-ca-file`: signs user client certificates.
    pub client_ca: Ca,
    /// kube-apiserver's `--requestheader-client-ca-file`: signs the front-proxy client certificate.
    pub front_proxy_ca: Ca,
    /// Signs our server's serving certificates; its certificate is the APIService `caBundle`.
    pub server_ca: Ca,
    /// The `admin` user in `system:masters`, signed by [`Pki::client_ca`].
    pub admin: CertPair,
    /// kube-apiserver's front-proxy client certificate (CN [`FRONT_PROXY_CN`]).
    pub front_proxy_client: CertPair,
}

/// Who our server is towards kube-apiserver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServerIdentity {
    /// The chart's ServiceAccount, bound to exactly the chart's RBAC: proves
    /// the chart grants what the server needs.
    #[default]
    ChartServiceAccount,
    /// `admin` in `system:masters`: every request allowed.
    Admin,
}

/// How [`TestBed::start_server_with`] starts our server.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerOptions<'a> {
    /// Flags after the test bed's own (`--secure-port`, `--bind-address`,
    /// `--tls-cert-file`, `--tls-private-key-file`, `--kubeconfig`, `--log-format`).
    pub args: &'a [&'a str],
    /// Its credentials for kube-apiserver.
    pub identity: ServerIdentity,
}

/// Our server as started by [`TestBed::start_server`].
#[derive(Debug)]
pub struct Server {
    process: Process,
    port: u16,
    serving: CertPair,
}

impl Server {
    /// The port it serves on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its base URL, `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Its serving certificate and key.
    pub fn serving(&self) -> &CertPair {
        &self.serving
    }

    /// Its process (log file, tail).
    pub fn process(&self) -> &Process {
        &self.process
    }
}

/// Several replicas of our server behind one Service address, as started by
/// [`TestBed::start_replicas`]: a [`lb::RoundRobin`] proxy stands in for
/// kube-proxy, every replica serves the same certificate and keeps the
/// channel history in [`SERVER_NAMESPACE`], as the chart configures it.
#[derive(Debug)]
pub struct Replicas {
    balancer: lb::RoundRobin,
    servers: Vec<Option<Server>>,
    ports: Vec<u16>,
    args: Vec<String>,
    kubeconfig: PathBuf,
    serving: CertPair,
    starts: usize,
}

impl Replicas {
    /// The proxy in front of them.
    pub fn balancer(&self) -> &lb::RoundRobin {
        &self.balancer
    }

    /// Replica `index`, while it runs.
    pub fn server(&self, index: usize) -> Option<&Server> {
        self.servers.get(index).and_then(Option::as_ref)
    }

    /// How many replicas were started (running or not).
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether none was started.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

/// A running etcd + kube-apiserver pair with the Elemental CRDs applied, and
/// optionally our server registered through the aggregation layer.
///
/// Dropping it kills every process it started and removes its directory; while
/// panicking, or after [`TestBed::finish`] with an error, it first prints the
/// end of every log to stderr and, with `TESTBED_KEEP=1`, keeps the directory.
pub struct TestBed {
    dir: Option<TempDir>,
    root: PathBuf,
    bin_dir: PathBuf,
    pki: Pki,
    apiserver_port: u16,
    kubeconfig: PathBuf,
    client: Client,
    tokens: BTreeMap<String, String>,
    etcd: Process,
    apiserver: Process,
    server: Option<Server>,
    replicas: Option<Replicas>,
    failed: bool,
    /// etcd's client and peer ports, kept for [`TestBed::start_control_plane`].
    etcd_ports: (u16, u16),
    /// [`TestBedOptions::apiserver_args`], kept for [`TestBed::start_control_plane`].
    apiserver_args: Vec<String>,
    /// See [`TestBed::set_server_apiserver_url`].
    server_apiserver_url: Option<String>,
}

impl std::fmt::Debug for TestBed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestBed")
            .field("root", &self.root)
            .field("apiserver_port", &self.apiserver_port)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl TestBed {
    /// Starts etcd and kube-apiserver on fresh loopback ports with fresh
    /// certificates, waits until kube-apiserver is ready, creates the
    /// namespaces and applies the Elemental CRDs, waiting until they are
    /// Established.
    pub async fn start(options: TestBedOptions) -> Result<Self> {
        // Every HTTP client of the process uses ring; a second install is refused, harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();

        let bin_dir = tools_dir();
        for tool in ["etcd", "kube-apiserver", "kubectl"] {
            ensure!(
                bin_dir.join(tool).is_file(),
                "{} is missing: run `make tools` (integration/testbed/build.sh)",
                bin_dir.join(tool).display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("elemental-changelog-testbed-")
            .tempdir()
            .context("creating the test bed directory")?;
        let root = dir.path().to_owned();
        for sub in ["pki", "etcd", "logs", "users", "server", "cache"] {
            std::fs::create_dir(root.join(sub))
                .with_context(|| format!("creating {}/{sub}", root.display()))?;
        }

        let pki = write_pki(&root)?;
        let tokens = write_token_file(&root)?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let mut etcd = start_etcd(&bin_dir, &root, etcd_port, etcd_peer_port)?;
        wait_etcd_healthy(&mut etcd, etcd_port).await?;

        let apiserver_port = free_port()?;
        let mut apiserver = start_apiserver(
            &bin_dir,
            &root,
            etcd_port,
            apiserver_port,
            &options.apiserver_args,
        )?;
        wait_apiserver_ready(&mut apiserver, &pki, apiserver_port).await?;

        let kubeconfig = root.join("kubeconfig");
        let apiserver_url = format!("https://127.0.0.1:{apiserver_port}");
        kubeconfig::write(
            &kubeconfig,
            &apiserver_url,
            &root.join("pki/cluster-ca.crt"),
            Credentials::ClientCertificate {
                cert: &root.join("pki/admin.crt"),
                key: &root.join("pki/admin.key"),
            },
        )?;
        for (user, token) in &tokens {
            kubeconfig::write(
                &root.join("users").join(user),
                &apiserver_url,
                &root.join("pki/cluster-ca.crt"),
                Credentials::Token(token),
            )?;
        }
        let client = client_for(&kubeconfig).await?;

        let bed = Self {
            dir: Some(dir),
            root,
            bin_dir,
            pki,
            apiserver_port,
            kubeconfig,
            client,
            tokens,
            etcd,
            apiserver,
            server: None,
            replicas: None,
            failed: false,
            etcd_ports: (etcd_port, etcd_peer_port),
            apiserver_args: options.apiserver_args.clone(),
            server_apiserver_url: None,
        };
        let namespaces = std::iter::once(SERVER_NAMESPACE.to_owned()).chain(options.namespaces);
        for namespace in namespaces {
            bed.create_namespace(&namespace).await?;
        }
        bed.apply_crds().await?;
        Ok(bed)
    }

    /// The run's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The certificate authorities and certificates of this run.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// A kube client authenticated as `admin` (`system:masters`).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubeconfig file of a static-token user of [`TOKEN_USERS`].
    pub fn user_kubeconfig(&self, user: &str) -> Result<PathBuf> {
        self.token(user)?;
        Ok(self.root.join("users").join(user))
    }

    /// The bearer token of a static-token user of [`TOKEN_USERS`].
    pub fn token(&self, user: &str) -> Result<&str> {
        self.tokens
            .get(user)
            .map(String::as_str)
            .ok_or_else(|| anyhow!("{user} is not a test bed token user"))
    }

    /// kube-apiserver's base URL, `https://127.0.0.1:<port>`.
    pub fn apiserver_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    /// kube-apiserver's address, `127.0.0.1:<port>`.
    pub fn apiserver_addr(&self) -> std::net::SocketAddr {
        (Ipv4Addr::LOCALHOST, self.apiserver_port).into()
    }

    /// Makes the servers started from now on reach kube-apiserver at `url`
    /// (a proxy in front of it, such as [`crate::faults::FaultProxy`])
    /// instead of its own address; `None` goes back to that. kube-apiserver's
    /// certificate is valid for `127.0.0.1` and `localhost`.
    pub fn set_server_apiserver_url(&mut self, url: Option<String>) {
        self.server_apiserver_url = url;
    }

    /// The kube-apiserver URL our server's kubeconfig names.
    fn server_apiserver_url(&self) -> String {
        self.server_apiserver_url
            .clone()
            .unwrap_or_else(|| self.apiserver_url())
    }

    /// The admin kubeconfig, with [`TestBed::set_server_apiserver_url`]'s URL.
    fn admin_kubeconfig_for_server(&self) -> Result<PathBuf> {
        let path = self.root.join("server/admin-kubeconfig");
        kubeconfig::write(
            &path,
            &self.server_apiserver_url(),
            &self.root.join("pki/cluster-ca.crt"),
            Credentials::ClientCertificate {
                cert: &self.root.join("pki/admin.crt"),
                key: &self.root.join("pki/admin.key"),
            },
        )?;
        Ok(path)
    }

    /// Kills kube-apiserver, then etcd (SIGKILL, as a crash or a node loss
    /// would), keeping etcd's data. Our server keeps running.
    /// [`TestBed::start_control_plane`] brings them back.
    pub fn stop_control_plane(&mut self) {
        self.apiserver.stop();
        self.etcd.stop();
    }

    /// Starts etcd and kube-apiserver again after
    /// [`TestBed::stop_control_plane`], on the same ports, with the same data
    /// and flags, and waits until kube-apiserver is ready.
    pub async fn start_control_plane(&mut self) -> Result<()> {
        let (etcd_port, etcd_peer_port) = self.etcd_ports;
        self.etcd = start_etcd(&self.bin_dir, &self.root, etcd_port, etcd_peer_port)?;
        wait_etcd_healthy(&mut self.etcd, etcd_port).await?;
        self.apiserver = start_apiserver(
            &self.bin_dir,
            &self.root,
            etcd_port,
            self.apiserver_port,
            &self.apiserver_args,
        )?;
        wait_apiserver_ready(&mut self.apiserver, &self.pki, self.apiserver_port).await
    }

    /// An HTTP client for kube-apiserver, trusting its CA, presenting `identity` if given.
    pub fn apiserver_http(&self, identity: Option<&CertPair>) -> Result<reqwest::Client> {
        https_client(&self.pki.cluster_ca, identity)
    }

    /// As [`TestBed::apiserver_http`], without the 10 s bound on a whole request: for watches
    /// and lists of tens of megabytes (connecting is still bounded).
    pub fn apiserver_streaming_http(&self, identity: Option<&CertPair>) -> Result<reqwest::Client> {
        streaming_https_client(&self.pki.cluster_ca, identity)
    }

    /// GET `path` (with its query) through kube-apiserver (the aggregator) as
    /// admin: the status and the body as text, whatever the status.
    pub async fn admin_get(&self, path: &str) -> Result<(reqwest::StatusCode, String)> {
        let response = self
            .apiserver_http(Some(&self.pki.admin))?
            .get(format!("{}{path}", self.apiserver_url()))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .with_context(|| format!("GET {path}: {status}, reading the body"))?;
        Ok((status, body))
    }

    /// [`TestBed::admin_get`] of a JSON answer: the status and the body parsed,
    /// whatever the status; an error naming both when the body is not JSON.
    pub async fn admin_get_value(&self, path: &str) -> Result<(reqwest::StatusCode, Value)> {
        let (status, body) = self.admin_get(path).await?;
        let value = serde_json::from_str(&body).with_context(|| {
            format!("GET {path}: {status} with a body that is not JSON: {body}")
        })?;
        Ok((status, value))
    }

    /// [`TestBed::admin_get`] that must answer 200 with a JSON `T`; an error
    /// naming the status and the body otherwise.
    pub async fn admin_get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let (status, body) = self.admin_get(path).await?;
        ensure!(
            status == reqwest::StatusCode::OK,
            "GET {path}: {status} {body}"
        );
        serde_json::from_str(&body)
            .with_context(|| format!("GET {path}: not the expected JSON: {body}"))
    }

    /// Our server, if [`TestBed::start_server`] started it.
    pub fn server(&self) -> Option<&Server> {
        self.server.as_ref()
    }

    /// Our server's base URL (`https://127.0.0.1:<port>`); an error when it is not running.
    pub fn server_url(&self) -> Result<String> {
        Ok(self.server().context("our server is not running")?.url())
    }

    /// Our server's log file; an error when it is not running.
    pub fn server_log(&self) -> Result<PathBuf> {
        Ok(self
            .server()
            .context("our server is not running")?
            .process()
            .log()
            .to_owned())
    }

    /// An HTTP client for our server directly, trusting its CA, presenting `identity` if given.
    pub fn server_http(&self, identity: Option<&CertPair>) -> Result<reqwest::Client> {
        https_client(&self.pki.server_ca, identity)
    }

    /// As [`TestBed::server_http`], without the 10 s bound on a whole request.
    pub fn server_streaming_http(&self, identity: Option<&CertPair>) -> Result<reqwest::Client> {
        streaming_https_client(&self.pki.server_ca, identity)
    }

    /// Our server's `/metrics` text, read directly as admin.
    pub async fn server_metrics(&self) -> Result<String> {
        let response = self
            .server_http(Some(&self.pki.admin))?
            .get(format!("{}/metrics", self.server_url()?))
            .send()
            .await?;
        anyhow::ensure!(response.status() == 200, "/metrics: {}", response.status());
        Ok(response.text().await?)
    }

    /// Runs kubectl as admin with `args`.
    pub async fn kubectl(&self, args: &[&str]) -> Result<Output> {
        self.run_kubectl(&self.kubeconfig, args, None).await
    }

    /// Runs kubectl as admin with `args` and `stdin`; fails unless it succeeds.
    pub async fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<String> {
        success(
            "kubectl",
            args,
            self.run_kubectl(&self.kubeconfig, args, Some(stdin))
                .await?,
        )
    }

    /// Runs kubectl as admin with `args`; fails unless it succeeds; returns its stdout.
    pub async fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        success("kubectl", args, self.kubectl(args).await?)
    }

    /// Runs kubectl as the static-token `user` with `args`.
    pub async fn kubectl_as(&self, user: &str, args: &[&str]) -> Result<Output> {
        self.run_kubectl(&self.user_kubeconfig(user)?, args, None)
            .await
    }

    /// Runs helm as admin with `args`.
    pub async fn helm(&self, args: &[&str]) -> Result<Output> {
        let cache = self.root.join("cache");
        tokio::process::Command::new(self.bin_dir.join("helm"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", cache.join("helm/cache"))
            .env("HELM_CONFIG_HOME", cache.join("helm/config"))
            .env("HELM_DATA_HOME", cache.join("helm/data"))
            .kill_on_drop(true)
            .output()
            .await
            .context("running helm")
    }

    async fn run_kubectl(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<Output> {
        let mut command = tokio::process::Command::new(self.bin_dir.join("kubectl"));
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env("KUBECACHEDIR", self.root.join("cache/kube"))
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("running kubectl")?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())
                .await
                .context("writing kubectl's stdin")?;
        }
        child.wait_with_output().await.context("running kubectl")
    }

    /// Starts our server with `args` after the test bed's own flags, as the
    /// chart's ServiceAccount with the chart's RBAC; see [`TestBed::start_server_with`].
    pub async fn start_server(&mut self, args: &[&str]) -> Result<&Server> {
        self.start_server_with(ServerOptions {
            args,
            identity: ServerIdentity::ChartServiceAccount,
        })
        .await
    }

    /// [`TestBed::start_server`] reading channel images from `registry`: its
    /// [`Registry::server_flags`], then `extra`.
    pub async fn start_server_reading(
        &mut self,
        registry: &Registry,
        extra: &[&str],
    ) -> Result<&Server> {
        let flags = registry.server_flags()?;
        let args: Vec<&str> = flags
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect();
        self.start_server(&args).await
    }

    /// Starts our server, waits for its `/readyz`, registers it (Service
    /// `ExternalName` → `localhost`, and [`APISERVICE_NAME`] with the serving CA
    /// as `caBundle`) and waits until kube-apiserver reports the APIService
    /// `Available` and lists the group in its aggregated discovery. A server
    /// already running is stopped first.
    pub async fn start_server_with(&mut self, options: ServerOptions<'_>) -> Result<&Server> {
        self.stop_server().await?;
        let kubeconfig = match options.identity {
            ServerIdentity::Admin if self.server_apiserver_url.is_some() => {
                self.admin_kubeconfig_for_server()?
            }
            ServerIdentity::Admin => self.kubeconfig.clone(),
            ServerIdentity::ChartServiceAccount => self.chart_service_account_kubeconfig().await?,
        };
        let port = free_port()?;
        let serving = self.write_serving_pair()?;
        let process = self
            .spawn_server(
                port,
                &kubeconfig,
                options.args.iter().copied(),
                "elemental-changelog-apiserver",
            )
            .await?;
        let mut server = Server {
            process,
            port,
            serving,
        };
        let registered = self.register(port, &mut server.process).await;
        self.server = Some(server);
        registered?;
        self.server
            .as_ref()
            .context("the server stopped while being registered")
    }

    /// Issues our server's serving pair (for the Service's DNS name,
    /// `localhost` and 127.0.0.1) and writes it under `server/`.
    fn write_serving_pair(&self) -> Result<CertPair> {
        let service_dns = format!("{SERVICE_NAME}.{SERVER_NAMESPACE}.svc");
        let serving = self
            .pki
            .server_ca
            .issue_server(SERVICE_NAME, &[&service_dns, "localhost", "127.0.0.1"])?;
        write_file(&self.root.join("server/tls.crt"), &serving.cert_pem)?;
        write_file(&self.root.join("server/tls.key"), &serving.key_pem)?;
        Ok(serving)
    }

    /// Starts our server on `port` with the serving pair of
    /// [`TestBed::write_serving_pair`], logging to `logs/<log_name>.log`,
    /// and waits for its `/readyz`.
    async fn spawn_server<'a>(
        &self,
        port: u16,
        kubeconfig: &Path,
        args: impl IntoIterator<Item = &'a str>,
        log_name: &str,
    ) -> Result<Process> {
        let binary = server_binary();
        ensure!(
            binary.is_file(),
            "{} is missing: run `cargo build -p elemental-changelog-apiserver` (make test does)",
            binary.display()
        );
        let mut argv: Vec<OsString> = vec![
            "--secure-port".into(),
            port.to_string().into(),
            "--bind-address".into(),
            "127.0.0.1".into(),
            "--tls-cert-file".into(),
            self.root.join("server/tls.crt").into(),
            "--tls-private-key-file".into(),
            self.root.join("server/tls.key").into(),
            "--kubeconfig".into(),
            kubeconfig.into(),
            "--log-format".into(),
            "text".into(),
        ];
        argv.extend(args.into_iter().map(OsString::from));
        let log_level = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
        let mut process = Process::spawn(
            log_name,
            &binary,
            argv,
            // Plain log files: no colour escapes. glibc's malloc set as the chart and the image
            // run the server.
            &[("RUST_LOG", log_level.as_str()), ("NO_COLOR", "1")]
                .into_iter()
                .chain(MALLOC)
                .collect::<Vec<_>>(),
            self.root.join(format!("logs/{log_name}.log")),
        )?;
        let https = self.server_http(Some(&self.pki.admin))?;
        let readyz = format!("https://127.0.0.1:{port}/readyz");
        wait_until(&mut process, &format!("{log_name} /readyz"), async || {
            Ok(https
                .get(&readyz)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success()))
        })
        .await?;
        Ok(process)
    }

    /// Starts `count` replicas of our server as the chart's ServiceAccount,
    /// with `args` after the test bed's own flags and the channel history in
    /// [`SERVER_NAMESPACE`], behind a round-robin proxy registered as the
    /// Service of the APIService (which keeps its `caBundle`: every replica
    /// serves the same certificate). A server already running is stopped first.
    pub async fn start_replicas(&mut self, count: usize, args: &[impl AsRef<str>]) -> Result<()> {
        self.stop_server().await?;
        let kubeconfig = self.chart_service_account_kubeconfig().await?;
        let serving = self.write_serving_pair()?;
        let balancer = lb::RoundRobin::start(&[]).await?;
        let port = balancer.port();
        self.replicas = Some(Replicas {
            balancer,
            servers: Vec::new(),
            ports: Vec::new(),
            args: args.iter().map(|a| a.as_ref().to_owned()).collect(),
            kubeconfig,
            serving,
            starts: 0,
        });
        for index in 0..count {
            self.start_replica(index).await?;
        }
        let replicas = self.replicas.as_mut().context("no replicas")?;
        let mut first = replicas
            .servers
            .first_mut()
            .and_then(Option::take)
            .context("no replica to register")?;
        let registered = self.register(port, &mut first.process).await;
        if let Some(replicas) = self.replicas.as_mut() {
            replicas.servers[0] = Some(first);
        }
        registered
    }

    /// Starts replica `index` (again, after [`TestBed::stop_replica`], on the
    /// same port; or one more, at the next index), waits for its `/readyz`
    /// and only then adds it to the proxy's endpoints, as kube-proxy does.
    /// Returns how long it took to become ready.
    pub async fn start_replica(&mut self, index: usize) -> Result<Duration> {
        let replicas = self.replicas.as_ref().context("no replicas started")?;
        ensure!(
            index <= replicas.servers.len(),
            "replica {index} would leave a gap"
        );
        ensure!(
            replicas.server(index).is_none(),
            "replica {index} is running"
        );
        let port = match replicas.ports.get(index) {
            Some(port) => *port,
            None => free_port()?,
        };
        let log_name = format!("elemental-changelog-apiserver-{index}-{}", replicas.starts);
        let mut args: Vec<&str> = vec!["--history-namespace", SERVER_NAMESPACE];
        args.extend(replicas.args.iter().map(String::as_str));
        let started = Instant::now();
        let process = self
            .spawn_server(port, &replicas.kubeconfig, args, &log_name)
            .await?;
        let took = started.elapsed();
        let replicas = self.replicas.as_mut().context("no replicas started")?;
        let server = Server {
            process,
            port,
            serving: replicas.serving.clone(),
        };
        if index == replicas.servers.len() {
            replicas.servers.push(Some(server));
            replicas.ports.push(port);
        } else {
            replicas.servers[index] = Some(server);
        }
        replicas.starts += 1;
        replicas.balancer.set_backend(index, Some(port));
        Ok(took)
    }

    /// Stops replica `index` as a pod is deleted: out of the proxy's
    /// endpoints first, its connections closed (clients reconnect to the
    /// others), then the process killed.
    pub async fn stop_replica(&mut self, index: usize) -> Result<()> {
        let replicas = self.replicas.as_mut().context("no replicas started")?;
        replicas.balancer.set_backend(index, None);
        replicas.balancer.close_connections(Some(index)).await?;
        let mut server = replicas
            .servers
            .get_mut(index)
            .and_then(Option::take)
            .with_context(|| format!("replica {index} is not running"))?;
        server.process.stop();
        Ok(())
    }

    /// Stops replica `index` as a rolling update does: SIGTERM to the process; once its
    /// `/readyz` fails, out of the proxy's endpoints for new connections (the endpoints
    /// controller's part), its open connections left to the server's own drain; then
    /// waits, up to `deadline`, for it to exit. Returns its exit status, when readiness
    /// failed and when it exited, both from the SIGTERM.
    pub async fn terminate_replica(
        &mut self,
        index: usize,
        deadline: Duration,
    ) -> Result<(std::process::ExitStatus, Duration, Duration)> {
        let http = self.server_http(None)?;
        let replicas = self.replicas.as_mut().context("no replicas started")?;
        let port = *replicas.ports.get(index).context("no such replica")?;
        let server = replicas
            .servers
            .get_mut(index)
            .and_then(Option::as_mut)
            .with_context(|| format!("replica {index} is not running"))?;
        let sent = std::time::Instant::now();
        server.process.terminate()?;
        let readyz = format!("https://127.0.0.1:{port}/readyz");
        let mut not_ready = None;
        loop {
            if let Some(status) = server.process.try_exit()? {
                replicas.balancer.set_backend(index, None);
                replicas.servers[index] = None;
                let not_ready =
                    not_ready.context("the replica exited before its readiness failed")?;
                return Ok((status, not_ready, sent.elapsed()));
            }
            if not_ready.is_none() {
                let ready = http
                    .get(&readyz)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if !ready {
                    not_ready = Some(sent.elapsed());
                    replicas.balancer.set_backend(index, None);
                }
            }
            ensure!(
                sent.elapsed() < deadline,
                "replica {index} still running {deadline:?} after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The replicas of [`TestBed::start_replicas`].
    pub fn replicas(&self) -> Option<&Replicas> {
        self.replicas.as_ref()
    }

    /// Applies the chart's ServiceAccount and RBAC, rendered by `helm template` for release
    /// [`SERVICE_NAME`] in [`SERVER_NAMESPACE`] with the chart's default values and
    /// `values` (`key=value`, as `helm --set` takes them).
    pub async fn apply_chart_rbac(&self, values: &[&str]) -> Result<()> {
        let chart = workspace_root().join("charts/elemental-changelog");
        let chart = chart.to_string_lossy();
        let mut args = vec![
            "template",
            SERVICE_NAME,
            &chart,
            "--namespace",
            SERVER_NAMESPACE,
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ];
        for value in values {
            args.extend(["--set", value]);
        }
        let rendered = self.helm(&args).await?;
        let rendered = success("helm", &["template"], rendered)?;
        self.kubectl_stdin(&["apply", "-f", "-"], &rendered)
            .await
            .context("applying the chart's ServiceAccount and RBAC")?;
        Ok(())
    }

    /// Applies the chart's ServiceAccount and RBAC ([`TestBed::apply_chart_rbac`], default
    /// values) and writes a kubeconfig with a token of that ServiceAccount (TokenRequest).
    async fn chart_service_account_kubeconfig(&self) -> Result<PathBuf> {
        self.apply_chart_rbac(&[]).await?;
        let token = self
            .kubectl_ok(&[
                "create",
                "token",
                SERVICE_NAME,
                "--namespace",
                SERVER_NAMESPACE,
                "--duration=24h",
            ])
            .await?;
        let path = self.root.join("server/kubeconfig");
        kubeconfig::write(
            &path,
            &self.server_apiserver_url(),
            &self.root.join("pki/cluster-ca.crt"),
            Credentials::Token(token.trim()),
        )?;
        Ok(path)
    }

    /// Stops our server, if running, and removes its APIService and Service.
    pub async fn stop_server(&mut self) -> Result<()> {
        let replicas = self.replicas.take();
        let server = self.server.take();
        if server.is_none() && replicas.is_none() {
            return Ok(());
        }
        let apiservices: Api<APIService> = Api::all(self.client());
        let services: Api<Service> = Api::namespaced(self.client(), SERVER_NAMESPACE);
        ignore_not_found(
            apiservices
                .delete(APISERVICE_NAME, &DeleteParams::default())
                .await,
        )?;
        ignore_not_found(
            services
                .delete(SERVICE_NAME, &DeleteParams::default())
                .await,
        )?;
        // Dropping them stops every process.
        drop((server, replicas));
        Ok(())
    }

    /// Registers our server at `port` (Service and APIService) and waits until
    /// the aggregator serves it; fails early when `process` exits.
    async fn register(&self, port: u16, process: &mut Process) -> Result<()> {
        let apply = PatchParams::apply("testbed").force();
        let service = Service {
            metadata: ObjectMeta {
                name: Some(SERVICE_NAME.to_owned()),
                namespace: Some(SERVER_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("ExternalName".to_owned()),
                external_name: Some("localhost".to_owned()),
                ports: Some(vec![ServicePort {
                    name: Some("https".to_owned()),
                    port: i32::from(port),
                    protocol: Some("TCP".to_owned()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        };
        Api::<Service>::namespaced(self.client(), SERVER_NAMESPACE)
            .patch(SERVICE_NAME, &apply, &Patch::Apply(&service))
            .await
            .context("applying our Service")?;
        let apiservice = APIService {
            metadata: ObjectMeta {
                name: Some(APISERVICE_NAME.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(APIServiceSpec {
                group: Some(GROUP.to_owned()),
                version: Some(VERSION.to_owned()),
                group_priority_minimum: 100,
                version_priority: 100,
                service: Some(ServiceReference {
                    namespace: Some(SERVER_NAMESPACE.to_owned()),
                    name: Some(SERVICE_NAME.to_owned()),
                    port: Some(i32::from(port)),
                }),
                ca_bundle: Some(ByteString(self.pki.server_ca.cert_pem().into_bytes())),
                insecure_skip_tls_verify: None,
            }),
            status: None,
        };
        let apiservices: Api<APIService> = Api::all(self.client());
        apiservices
            .patch(APISERVICE_NAME, &apply, &Patch::Apply(&apiservice))
            .await
            .context("applying our APIService")?;
        let available = await_condition(
            apiservices.clone(),
            APISERVICE_NAME,
            |obj: Option<&APIService>| {
                apiservice_condition(obj, "Available")
                    .is_some_and(|(status, _, _)| status == "True")
            },
        );
        match tokio::time::timeout(READY_TIMEOUT, available).await {
            Ok(result) => result.map(drop).context("watching our APIService")?,
            Err(_) => {
                let current = apiservices.get_opt(APISERVICE_NAME).await.ok().flatten();
                let why = apiservice_condition(current.as_ref(), "Available")
                    .map(|(status, reason, message)| {
                        format!("Available={status} {reason}: {message}")
                    })
                    .unwrap_or_else(|| "no Available condition".to_owned());
                let tail = process.tail(process::TAIL_BYTES);
                bail!(
                    "APIService {APISERVICE_NAME} not Available after {READY_TIMEOUT:?} ({why}); \
                     our server's log ends:\n{tail}"
                )
            }
        }
        // Available is set before kube-apiserver's aggregated discovery (what
        // kubectl reads) has synced the group; wait for that too.
        let http = self.apiserver_http(Some(&self.pki.admin))?;
        let url = format!("{}/apis", self.apiserver_url());
        wait_until(
            process,
            "our group in kube-apiserver's aggregated discovery",
            async || {
                let response = http
                    .get(&url)
                    .header(reqwest::header::ACCEPT, AGGREGATED_DISCOVERY)
                    .send()
                    .await?;
                if !response.status().is_success() {
                    return Ok(false);
                }
                let body: serde_json::Value = response.json().await?;
                Ok(discovery_lists(&body, GROUP, VERSION))
            },
        )
        .await
    }

    async fn create_namespace(&self, name: &str) -> Result<()> {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client())
            .patch(
                name,
                &PatchParams::apply("testbed"),
                &Patch::Apply(&namespace),
            )
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(())
    }

    async fn apply_crds(&self) -> Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client());
        let mut names = Vec::new();
        for text in CRDS {
            let crd: CustomResourceDefinition =
                serde_yaml::from_str(text).context("parsing an Elemental CRD")?;
            let name = crd.metadata.name.clone().context("a CRD without a name")?;
            crds.patch(
                &name,
                &PatchParams::apply("testbed").force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("applying CRD {name}"))?;
            names.push(name);
        }
        for name in names {
            let established =
                await_condition(crds.clone(), &name, conditions::is_crd_established());
            tokio::time::timeout(READY_TIMEOUT, established)
                .await
                .with_context(|| format!("CRD {name} not Established after {READY_TIMEOUT:?}"))?
                .with_context(|| format!("watching CRD {name}"))?;
        }
        Ok(())
    }

    /// Checks that every process is still running; fails with the end of the log of one that is not.
    pub fn ensure_running(&mut self) -> Result<()> {
        self.etcd.ensure_running()?;
        self.apiserver.ensure_running()?;
        if let Some(server) = self.server.as_mut() {
            server.process.ensure_running()?;
        }
        if let Some(replicas) = self.replicas.as_mut() {
            for server in replicas.servers.iter_mut().flatten() {
                server.process.ensure_running()?;
            }
        }
        Ok(())
    }

    /// The end of every process's log, for diagnosing a failure.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        let processes = [
            Some(&self.etcd),
            Some(&self.apiserver),
            self.server.as_ref().map(|s| &s.process),
        ];
        let replicas = self
            .replicas
            .iter()
            .flat_map(|r| r.servers.iter().flatten().map(|s| &s.process));
        for process in processes.into_iter().flatten().chain(replicas) {
            out.push_str(&format!(
                "===== {} ({}) =====\n{}\n",
                process.name(),
                process.log().display(),
                process.tail(process::TAIL_BYTES)
            ));
        }
        out
    }

    /// Ends a test: passes `result` through, and when it is an error marks the
    /// bed failed so that dropping it prints the logs (and keeps the directory
    /// with `TESTBED_KEEP=1`).
    pub fn finish<T>(mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.failed = true;
        }
        result
    }
}

impl Drop for TestBed {
    fn drop(&mut self) {
        let failed = self.failed || std::thread::panicking();
        if failed {
            eprintln!(
                "test bed failed; logs of {}:\n{}",
                self.root.display(),
                self.log_tails()
            );
        }
        if let Some(server) = self.server.as_mut() {
            server.process.stop();
        }
        self.replicas = None;
        self.apiserver.stop();
        self.etcd.stop();
        if failed
            && std::env::var_os("TESTBED_KEEP").is_some_and(|v| v == "1")
            && let Some(dir) = self.dir.take()
        {
            eprintln!("TESTBED_KEEP=1: kept {}", dir.keep().display());
        }
    }
}

/// Waits until etcd on `port` answers `/health`.
async fn wait_etcd_healthy(etcd: &mut Process, port: u16) -> Result<()> {
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .context("building an HTTP client")?;
    let health = format!("http://127.0.0.1:{port}/health");
    wait_until(etcd, "etcd /health", async || {
        Ok(plain
            .get(&health)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success()))
    })
    .await
}

/// Waits until kube-apiserver on `port` answers `/readyz` (as admin).
async fn wait_apiserver_ready(apiserver: &mut Process, pki: &Pki, port: u16) -> Result<()> {
    let https = https_client(&pki.cluster_ca, Some(&pki.admin))?;
    let readyz = format!("https://127.0.0.1:{port}/readyz");
    wait_until(apiserver, "kube-apiserver /readyz", async || {
        Ok(https
            .get(&readyz)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success()))
    })
    .await
}

/// Polls `probe` every [`POLL`] until it answers true, failing when
/// `process` exits or after [`READY_TIMEOUT`].
async fn wait_until(
    process: &mut Process,
    what: &str,
    mut probe: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        process.ensure_running()?;
        if probe().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{what} not ready after {READY_TIMEOUT:?}; {}'s log ends:\n{}",
                process.name(),
                process.tail(process::TAIL_BYTES)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

fn start_etcd(bin_dir: &Path, root: &Path, port: u16, peer_port: u16) -> Result<Process> {
    let client_url = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let data_dir = root.join("etcd");
    let args: Vec<OsString> = vec![
        "--name=testbed".into(),
        flag("--data-dir", &data_dir),
        format!("--listen-client-urls={client_url}").into(),
        format!("--advertise-client-urls={client_url}").into(),
        format!("--listen-peer-urls={peer_url}").into(),
        format!("--initial-advertise-peer-urls={peer_url}").into(),
        format!("--initial-cluster=testbed={peer_url}").into(),
        "--unsafe-no-fsync".into(),
        "--log-level=warn".into(),
    ];
    Process::spawn(
        "etcd",
        &bin_dir.join("etcd"),
        args,
        &[],
        root.join("logs/etcd.log"),
    )
}

fn start_apiserver(
    bin_dir: &Path,
    root: &Path,
    etcd_port: u16,
    port: u16,
    extra: &[String],
) -> Result<Process> {
    let pki = root.join("pki");
    let mut args: Vec<OsString> = vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}").into(),
        format!("--secure-port={port}").into(),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        flag("--cert-dir", &pki),
        flag("--tls-cert-file", &pki.join("apiserver.crt")),
        flag("--tls-private-key-file", &pki.join("apiserver.key")),
        flag("--client-ca-file", &pki.join("client-ca.crt")),
        flag("--token-auth-file", &root.join("tokens.csv")),
        flag(
            "--requestheader-client-ca-file",
            &pki.join("front-proxy-ca.crt"),
        ),
        format!("--requestheader-allowed-names={FRONT_PROXY_CN}").into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        flag(
            "--proxy-client-cert-file",
            &pki.join("front-proxy-client.crt"),
        ),
        flag(
            "--proxy-client-key-file",
            &pki.join("front-proxy-client.key"),
        ),
        // The aggregator dials the Service (ExternalName → localhost), not endpoints,
        // which may not hold loopback addresses.
        "--enable-aggregator-routing=false".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        flag("--service-account-key-file", &pki.join("sa.pub")),
        flag("--service-account-signing-key-file", &pki.join("sa.key")),
        "--authorization-mode=Node,RBAC".into(),
        "--service-cluster-ip-range=10.96.0.0/12".into(),
        // No Endpoints for the `kubernetes` Service: 127.0.0.1 is not a valid endpoint.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
    ];
    // The ServiceAccount admission plugin stays on: it only acts on pods, and
    // the test bed runs no pods (there is no controller-manager or kubelet).
    args.extend(extra.iter().map(OsString::from));
    Process::spawn(
        "kube-apiserver",
        &bin_dir.join("kube-apiserver"),
        args,
        &[],
        root.join("logs/kube-apiserver.log"),
    )
}

fn write_pki(root: &Path) -> Result<Pki> {
    let pki = root.join("pki");
    let cluster_ca = Ca::new("testbed-cluster-ca")?;
    let client_ca = Ca::new("testbed-client-ca")?;
    let front_proxy_ca = Ca::new("testbed-front-proxy-ca")?;
    let server_ca = Ca::new("testbed-elemental-changelog-ca")?;
    let apiserver = cluster_ca.issue_server(
        "kube-apiserver",
        &[
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1",
        ],
    )?;
    let admin = client_ca.issue_client("admin", &["system:masters"])?;
    let front_proxy_client = front_proxy_ca.issue_client(FRONT_PROXY_CN, &[])?;
    let signing = pki::SigningKey::generate()?;

    write_file(&pki.join("cluster-ca.crt"), &cluster_ca.cert_pem())?;
    write_file(&pki.join("client-ca.crt"), &client_ca.cert_pem())?;
    write_file(&pki.join("front-proxy-ca.crt"), &front_proxy_ca.cert_pem())?;
    write_file(&pki.join("server-ca.crt"), &server_ca.cert_pem())?;
    write_pair(&pki, "apiserver", &apiserver)?;
    write_pair(&pki, "admin", &admin)?;
    write_pair(&pki, "front-proxy-client", &front_proxy_client)?;
    write_file(&pki.join("sa.key"), &signing.private_pem)?;
    write_file(&pki.join("sa.pub"), &signing.public_pem)?;
    Ok(Pki {
        cluster_ca,
        client_ca,
        front_proxy_ca,
        server_ca,
        admin,
        front_proxy_client,
    })
}

/// Writes kube-apiserver's static token file; tokens are unique to the run.
fn write_token_file(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut tokens = BTreeMap::new();
    let mut csv = String::new();
    for (uid, (user, groups)) in TOKEN_USERS.iter().enumerate() {
        let digest = Sha256::new()
            .chain_update(root.as_os_str().as_encoded_bytes())
            .chain_update(user.as_bytes())
            .finalize();
        let token: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        csv.push_str(&format!(
            "{token},{user},uid-{uid},\"{}\"\n",
            groups.join(",")
        ));
        tokens.insert((*user).to_owned(), token);
    }
    write_file(&root.join("tokens.csv"), &csv)?;
    Ok(tokens)
}

fn write_pair(dir: &Path, name: &str, pair: &CertPair) -> Result<()> {
    write_file(&dir.join(format!("{name}.crt")), &pair.cert_pem)?;
    write_file(&dir.join(format!("{name}.key")), &pair.key_pem)
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

fn flag(name: &str, path: &Path) -> OsString {
    let mut flag = OsString::from(name);
    flag.push("=");
    flag.push(path);
    flag
}

/// A port free on 127.0.0.1 right now (the kernel's pick for port 0).
fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a free loopback port")?;
    Ok(listener
        .local_addr()
        .context("reading a bound port")?
        .port())
}

fn https_client(ca: &Ca, identity: Option<&CertPair>) -> Result<reqwest::Client> {
    https_client_builder(
        ca,
        identity,
        reqwest::Client::builder().timeout(Duration::from_secs(10)),
    )
}

/// An HTTPS client whose requests may last (a watch, a list of tens of megabytes); connecting
/// is bounded.
fn streaming_https_client(ca: &Ca, identity: Option<&CertPair>) -> Result<reqwest::Client> {
    https_client_builder(
        ca,
        identity,
        reqwest::Client::builder().connect_timeout(Duration::from_secs(10)),
    )
}

fn https_client_builder(
    ca: &Ca,
    identity: Option<&CertPair>,
    builder: reqwest::ClientBuilder,
) -> Result<reqwest::Client> {
    let mut builder = builder
        .tls_certs_only([reqwest::Certificate::from_pem(ca.cert_pem().as_bytes())
            .context("reading a CA certificate")?]);
    if let Some(identity) = identity {
        builder = builder.identity(
            reqwest::Identity::from_pem(identity.identity_pem().as_bytes())
                .context("reading a client identity")?,
        );
    }
    builder.build().context("building an HTTPS client")
}

async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await
            .context("loading the admin kubeconfig")?;
    Client::try_from(config).context("building a kube client")
}

fn apiservice_condition(
    apiservice: Option<&APIService>,
    type_: &str,
) -> Option<(String, String, String)> {
    let condition = apiservice?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((
        condition.status.clone(),
        condition.reason.clone().unwrap_or_default(),
        condition.message.clone().unwrap_or_default(),
    ))
}

/// Whether an aggregated discovery document (`APIGroupDiscoveryList`) lists
/// `group`/`version` with at least one resource and not stale.
fn discovery_lists(document: &serde_json::Value, group: &str, version: &str) -> bool {
    let groups = document["items"].as_array().into_iter().flatten();
    groups
        .filter(|g| g["metadata"]["name"] == group)
        .flat_map(|g| g["versions"].as_array().into_iter().flatten())
        .any(|v| {
            v["version"] == version
                && v["freshness"] != "Stale"
                && v["resources"].as_array().is_some_and(|r| !r.is_empty())
        })
}

fn ignore_not_found<T>(result: kube::Result<T>) -> Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

fn success(program: &str, args: &[&str], output: Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "{program} {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr),
        stdout
    );
    Ok(stdout)
}

/// The workspace root (the parent of this package).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_owned()
}

/// Where etcd, kube-apiserver, kubectl and helm are: `TESTBED_BIN`, else `target/testbed/bin`.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("TESTBED_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/testbed/bin"))
}

/// glibc malloc's settings for the server, as the chart and the image (`Dockerfile`) set them.
pub const MALLOC: [(&str, &str); 3] = [
    ("MALLOC_ARENA_MAX", "2"),
    ("MALLOC_MMAP_THRESHOLD_", "131072"),
    ("MALLOC_TRIM_THRESHOLD_", "131072"),
];

/// Our server's binary: `ELEMENTAL_CHANGELOG_BIN`, else `target/debug/elemental-changelog-apiserver`.
pub fn server_binary() -> PathBuf {
    std::env::var_os("ELEMENTAL_CHANGELOG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/elemental-changelog-apiserver"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn discovery_lists_only_fresh_versions_with_resources() {
        let document = |freshness: &str, resources: serde_json::Value| {
            serde_json::json!({"items": [
                {"metadata": {"name": "other.example.com"}, "versions": [{"version": "v1beta1", "resources": [{}]}]},
                {"metadata": {"name": GROUP}, "versions": [
                    {"version": VERSION, "freshness": freshness, "resources": resources},
                ]},
            ]})
        };
        assert!(discovery_lists(
            &document("Current", serde_json::json!([{}])),
            GROUP,
            VERSION
        ));
        assert!(!discovery_lists(
            &document("Stale", serde_json::json!([{}])),
            GROUP,
            VERSION
        ));
        assert!(!discovery_lists(
            &document("Current", serde_json::json!([])),
            GROUP,
            VERSION
        ));
        assert!(!discovery_lists(
            &document("Current", serde_json::json!([{}])),
            GROUP,
            "v1"
        ));
        assert!(!discovery_lists(
            &serde_json::json!({"kind": "APIGroupList"}),
            GROUP,
            VERSION
        ));
    }

    #[test]
    fn token_file_quotes_groups_and_tokens_are_unique() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let tokens = write_token_file(dir.path())?;
        let csv = std::fs::read_to_string(dir.path().join("tokens.csv"))?;
        assert_eq!(csv.lines().count(), TOKEN_USERS.len());
        let carol = tokens.get("carol").context("carol")?;
        assert!(
            csv.contains(&format!("{carol},carol,uid-2,\"elemental-viewers\"")),
            "{csv}"
        );
        let distinct: std::collections::BTreeSet<&String> = tokens.values().collect();
        assert_eq!(distinct.len(), TOKEN_USERS.len());
        Ok(())
    }

    /// The control plane alone: ready, CRDs served, users authenticated, and
    /// nothing left running afterwards.
    #[tokio::test]
    async fn control_plane_starts_serves_and_stops() -> Result<()> {
        let started = Instant::now();
        let bed = TestBed::start(TestBedOptions::default()).await?;
        eprintln!("test bed started in {:?}", started.elapsed());
        let result = control_plane_checks(&bed).await;
        let pids = [bed.etcd.pid(), bed.apiserver.pid()];
        let root = bed.root().to_owned();
        let result = bed.finish(result);
        for pid in pids.into_iter().flatten() {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "process {pid} outlived the test bed"
            );
        }
        assert!(!root.exists(), "{} outlived the test bed", root.display());
        result
    }

    async fn control_plane_checks(bed: &TestBed) -> Result<()> {
        let resources = bed
            .kubectl_ok(&[
                "api-resources",
                "--api-group=elemental.cattle.io",
                "-o",
                "name",
            ])
            .await?;
        assert!(
            resources.contains("managedosversions.elemental.cattle.io"),
            "{resources}"
        );
        assert!(
            resources.contains("managedosversionchannels.elemental.cattle.io"),
            "{resources}"
        );

        let namespaces = bed.kubectl_ok(&["get", "namespaces", "-o", "name"]).await?;
        for ns in [FLEET_NAMESPACE, SERVER_NAMESPACE, "kube-system", "default"] {
            assert!(
                namespaces.contains(&format!("namespace/{ns}")),
                "{namespaces}"
            );
        }

        // The authentication ConfigMap that extension servers read carries the front-proxy settings.
        let cm: ConfigMap = Api::namespaced(bed.client(), "kube-system")
            .get("extension-apiserver-authentication")
            .await?;
        let data = cm.data.unwrap_or_default();
        assert_eq!(
            data.get("requestheader-allowed-names").map(String::as_str),
            Some("[\"front-proxy-client\"]")
        );
        assert!(data.contains_key("client-ca-file"));

        // Static-token users are authenticated and have no rights.
        let whoami = bed
            .kubectl_as("carol", &["auth", "whoami", "-o", "json"])
            .await?;
        let whoami = String::from_utf8_lossy(&whoami.stdout);
        assert!(
            whoami.contains("\"carol\"") && whoami.contains("elemental-viewers"),
            "{whoami}"
        );
        let denied = bed
            .kubectl_as(
                "alice",
                &["get", "managedosversions", "-n", FLEET_NAMESPACE],
            )
            .await?;
        assert!(!denied.status.success());
        assert!(String::from_utf8_lossy(&denied.stderr).contains("Forbidden"));
        Ok(())
    }
}
