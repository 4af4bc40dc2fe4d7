//! A real OCI registry for tests: Debian's `docker-registry` (CNCF
//! distribution 2.8) on 127.0.0.1 with storage in a temporary folder, either
//! plain HTTP or TLS (a per-run CA) with htpasswd basic auth.
//!
//! The process is killed when the [`Registry`] is dropped, also when a test
//! panics. `apt-get install docker-registry` provides the binary; set
//! `DOCKER_REGISTRY_BIN` to use another one.

use std::{
    fs,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use oci_client::{
    Client,
    client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol},
    secrets::RegistryAuth,
};

/// How long to wait for the registry to answer `/v2/` (in short polls).
const READY_POLLS: u32 = 400;
const READY_POLL_INTERVAL: Duration = Duration::from_millis(25);
/// Attempts with a fresh port if the registry exits at start (port race).
const START_ATTEMPTS: u32 = 3;

/// Installs ring as the process's rustls provider (oci-client and reqwest
/// are built without one). Idempotent.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// How to run the registry.
#[derive(Clone, Debug, Default)]
pub struct RegistryOptions {
    /// Serve HTTPS with a certificate from a per-run CA.
    pub tls: bool,
    /// Require basic auth with this user name and password (htpasswd, bcrypt).
    pub basic_auth: Option<(String, String)>,
    /// Answer blob requests with a redirect to this base URL (`http://host:port`) followed by
    /// the blob's storage path (`/docker/registry/v2/blobs/sha256/ab/ab…/data`): the
    /// registry's `redirect` storage middleware, as registries that serve blobs from object
    /// storage do.
    pub blob_redirect: Option<String>,
    /// Require Bearer tokens from this realm (the registry's `token` auth; it never issues a
    /// token itself, so without a token server at the realm no pull gets through).
    pub token_realm: Option<String>,
}

/// Material of a TLS registry.
#[derive(Debug)]
struct Tls {
    ca_pem: String,
    ca_file: PathBuf,
}

/// A running `docker-registry` process.
#[derive(Debug)]
pub struct Registry {
    child: Option<Child>,
    dir: tempfile::TempDir,
    host: String,
    tls: Option<Tls>,
    basic_auth: Option<(String, String)>,
}

impl Registry {
    /// An anonymous plain-HTTP registry.
    pub async fn start_plain() -> Result<Self> {
        Self::start(RegistryOptions::default()).await
    }

    /// A TLS registry that requires `user`/`password`.
    pub async fn start_tls_auth(user: &str, password: &str) -> Result<Self> {
        Self::start(RegistryOptions {
            tls: true,
            basic_auth: Some((user.to_owned(), password.to_owned())),
            ..RegistryOptions::default()
        })
        .await
    }

    /// Starts a registry and waits until `/v2/` answers.
    pub async fn start(options: RegistryOptions) -> Result<Self> {
        install_crypto_provider();
        let dir = tempfile::Builder::new().prefix("registry-").tempdir()?;
        let tls = if options.tls {
            Some(write_tls(dir.path())?)
        } else {
            None
        };
        if let Some((user, password)) = &options.basic_auth {
            // Cost 4 (the minimum): the registry checks it on every request.
            let hash = bcrypt::hash(password, 4)?;
            fs::write(dir.path().join("htpasswd"), format!("{user}:{hash}\n"))?;
        }
        let mut registry = Self {
            child: None,
            dir,
            host: String::new(),
            tls,
            basic_auth: options.basic_auth.clone(),
        };
        for attempt in 1..=START_ATTEMPTS {
            registry.host = format!("127.0.0.1:{}", free_port()?);
            registry.spawn(&options)?;
            match registry.wait_ready().await {
                Ok(()) => return Ok(registry),
                // Exited at once: most likely the port was taken between
                // probing and binding. Try another one.
                Err(_) if attempt < START_ATTEMPTS && registry.exited() => registry.kill(),
                Err(error) => return Err(error),
            }
        }
        bail!("docker-registry did not start: {}", registry.log())
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|child| child.try_wait().ok().flatten().is_some())
    }

    fn spawn(&mut self, options: &RegistryOptions) -> Result<()> {
        let root = self.dir.path();
        let mut config = format!(
            "version: 0.1\n\
             log:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n  \
             maintenance:\n    uploadpurging:\n      enabled: false\n\
             http:\n  addr: {host}\n  secret: test-secret-not-for-production\n",
            data = root.join("data").display(),
            host = self.host,
        );
        if self.tls.is_some() {
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                root.join("server.pem").display(),
                root.join("server-key.pem").display()
            ));
        }
        if options.basic_auth.is_some() {
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: test-registry\n    path: {}\n",
                root.join("htpasswd").display()
            ));
        } else if let Some(realm) = &options.token_realm {
            let key = rcgen::KeyPair::generate()?;
            let signer = rcgen::CertificateParams::new(vec!["token-signer".to_owned()])?
                .self_signed(&key)?;
            fs::write(root.join("token-signer.pem"), signer.pem())?;
            config.push_str(&format!(
                "auth:\n  token:\n    realm: {realm}\n    service: test-registry\n    \
                 issuer: test-issuer\n    rootcertbundle: {}\n",
                root.join("token-signer.pem").display()
            ));
        }
        if let Some(base) = &options.blob_redirect {
            config.push_str(&format!(
                "middleware:\n  storage:\n    - name: redirect\n      options:\n        \
                 baseurl: {base}\n"
            ));
        }
        let config_path = root.join("config.yml");
        fs::write(&config_path, config)?;
        let log = fs::File::create(root.join("registry.log"))?;
        let binary = std::env::var_os("DOCKER_REGISTRY_BIN")
            .unwrap_or_else(|| "/usr/bin/docker-registry".into());
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!(
                    "cannot run {} (apt-get install docker-registry)",
                    Path::new(&binary).display()
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.http_client()?;
        let url = format!("{}/v2/", self.base_url());
        for _ in 0..READY_POLLS {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("docker-registry exited with {status}: {}", self.log());
            }
            if let Ok(response) = client.get(&url).send().await {
                let status = response.status().as_u16();
                if status == 200 || status == 401 {
                    return Ok(());
                }
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
        bail!("docker-registry did not answer {url}: {}", self.log())
    }

    /// `127.0.0.1:<port>`, as written in image references.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `<host>/<repository_and_tag>`, e.g. `image("elemental/channel:v1")`.
    pub fn image(&self, repository_and_tag: &str) -> String {
        format!("{}/{repository_and_tag}", self.host)
    }

    /// `http(s)://<host>`.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.host)
    }

    /// Whether it serves HTTPS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The CA certificate (PEM) of a TLS registry.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|tls| tls.ca_pem.as_str())
    }

    /// A file holding [`Registry::ca_pem`].
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|tls| tls.ca_file.as_path())
    }

    /// The user name and password it requires.
    pub fn basic_auth(&self) -> Option<(&str, &str)> {
        self.basic_auth
            .as_ref()
            .map(|(user, password)| (user.as_str(), password.as_str()))
    }

    /// Credentials for oci-client (anonymous when none are required).
    pub fn auth(&self) -> RegistryAuth {
        match &self.basic_auth {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// A Docker config JSON (`.dockerconfigjson`) for this registry with the
    /// given credentials.
    pub fn docker_config_json(&self, user: &str, password: &str) -> String {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        serde_json::json!({ "auths": { self.host.clone(): { "auth": auth } } }).to_string()
    }

    /// Writes [`Registry::docker_config_json`] into the registry's folder and
    /// returns its path.
    pub fn write_docker_config(&self, user: &str, password: &str) -> Result<PathBuf> {
        let path = self.dir.path().join(format!("dockerconfig-{user}.json"));
        fs::write(&path, self.docker_config_json(user, password))?;
        Ok(path)
    }

    /// The command-line flags our server needs for this registry:
    /// `--insecure-registry` for plain HTTP, `--registry-ca-file` and
    /// `--registry-config` (with the right credentials) for TLS and auth.
    pub fn server_flags(&self) -> Result<Vec<String>> {
        let mut flags = Vec::new();
        match &self.tls {
            Some(tls) => flags.extend([
                "--registry-ca-file".to_owned(),
                tls.ca_file.display().to_string(),
            ]),
            None => flags.extend(["--insecure-registry".to_owned(), self.host.clone()]),
        }
        if let Some((user, password)) = &self.basic_auth {
            let path = self.write_docker_config(user, password)?;
            flags.extend(["--registry-config".to_owned(), path.display().to_string()]);
        }
        Ok(flags)
    }

    /// An oci-client that trusts this registry (for pushing test images).
    pub fn oci_client(&self) -> Result<Client> {
        install_crypto_provider();
        let config = ClientConfig {
            protocol: match &self.tls {
                Some(_) => ClientProtocol::Https,
                None => ClientProtocol::HttpsExcept(vec![self.host.clone()]),
            },
            extra_root_certificates: self
                .tls
                .iter()
                .map(|tls| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: tls.ca_pem.clone().into_bytes(),
                })
                .collect(),
            ..ClientConfig::default()
        };
        Ok(Client::try_from(config)?)
    }

    /// A reqwest client that trusts this registry (for raw API calls).
    pub fn http_client(&self) -> Result<reqwest::Client> {
        install_crypto_provider();
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(30));
        if let Some(tls) = &self.tls {
            builder =
                builder.tls_certs_only([reqwest::Certificate::from_pem(tls.ca_pem.as_bytes())?]);
        }
        Ok(builder.build()?)
    }

    /// A request to `<base_url><path>` with the registry's credentials.
    pub fn request(&self, method: reqwest::Method, path: &str) -> Result<reqwest::RequestBuilder> {
        let request = self
            .http_client()?
            .request(method, format!("{}{path}", self.base_url()));
        Ok(match &self.basic_auth {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        })
    }

    /// Deletes a blob from a repository through the API: manifests that name
    /// it stay, pulling the blob then answers 404 `BLOB_UNKNOWN`.
    pub async fn delete_blob(&self, repository: &str, digest: &str) -> Result<()> {
        let response = self
            .request(
                reqwest::Method::DELETE,
                &format!("/v2/{repository}/blobs/{digest}"),
            )?
            .send()
            .await?;
        ensure!(
            response.status() == reqwest::StatusCode::ACCEPTED,
            "deleting {digest} from {repository}: {}",
            response.status()
        );
        Ok(())
    }

    /// The path of a blob in the registry's storage, as its `redirect` middleware appends it
    /// to [`RegistryOptions::blob_redirect`].
    pub fn blob_storage_path(digest: &str) -> Result<String> {
        let (algorithm, hex) = digest.split_once(':').context("digest without algorithm")?;
        ensure!(hex.len() > 2, "short digest {digest}");
        Ok(format!(
            "/docker/registry/v2/blobs/{algorithm}/{}/{hex}/data",
            &hex[..2]
        ))
    }

    /// Where the registry stores a blob's bytes.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        let (algorithm, hex) = digest.split_once(':').context("digest without algorithm")?;
        ensure!(hex.len() > 2, "short digest {digest}");
        Ok(self
            .dir
            .path()
            .join("data/docker/registry/v2/blobs")
            .join(algorithm)
            .join(&hex[..2])
            .join(hex)
            .join("data"))
    }

    /// Flips one byte in the middle of a stored blob: the registry keeps
    /// serving it under its digest (same length), so clients must notice.
    pub fn corrupt_blob(&self, digest: &str) -> Result<()> {
        let path = self.blob_path(digest)?;
        let mut data = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        ensure!(!data.is_empty(), "empty blob {digest}");
        let middle = data.len() / 2;
        data[middle] ^= 0x01;
        fs::write(&path, data)?;
        Ok(())
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Stops the process (the storage stays until the value is dropped).
    pub fn stop(&mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port that was free a moment ago.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A CA and a server certificate for 127.0.0.1 and localhost, written as
/// `ca.pem`, `server.pem` and `server-key.pem`.
fn write_tls(dir: &Path) -> Result<Tls> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "elemental-changelog test registry CA",
    );
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate()?)?;

    let mut server_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    server_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "127.0.0.1");
    server_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = rcgen::KeyPair::generate()?;
    let server = server_params.signed_by(&server_key, &ca)?;

    let ca_pem = ca.pem();
    let ca_file = dir.join("ca.pem");
    fs::write(&ca_file, &ca_pem)?;
    fs::write(dir.join("server.pem"), server.pem())?;
    fs::write(dir.join("server-key.pem"), server_key.serialize_pem())?;
    Ok(Tls { ca_pem, ca_file })
}
