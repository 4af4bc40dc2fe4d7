//! The serving certificate: where it comes from, how it is validated, and how it is hot-reloaded.
//!
//! [`CertSource::prepare`] turns the configuration into a certificate/key file pair, generating a
//! self-signed one first when no files were given (like k8s.io/apiserver's
//! `MaybeDefaultWithSelfSignedCerts`). [`ReloadingResolver`] serves that pair to rustls and
//! replaces it when the files change: [`ReloadingResolver::watch`] watches the files'
//! *directories* (Kubernetes updates a mounted Secret by swapping a `..data` symlink, so watching
//! the files themselves misses updates) and also polls periodically, because file events can be
//! lost. A new pair is validated before it is published; a pair that fails to parse or whose key
//! does not belong to the certificate is refused and the current one kept.

mod self_signed;

use std::{
    error::Error as StdError,
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use arc_swap::ArcSwap;
use notify::{
    EventKind, RecommendedWatcher, RecursiveMode, Watcher,
    event::{AccessKind, AccessMode},
};
use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem, pem::PemObject};
use tokio::{
    sync::{Notify, watch},
    time::{Instant, MissedTickBehavior},
};
use tracing::{debug, info, warn};
use x509_parser::error::X509Error;

/// The certificate file name in the directory of [`CertSource::SelfSigned`].
pub const SELF_SIGNED_CERT_FILE: &str = "apiserver.crt";
/// The key file name in the directory of [`CertSource::SelfSigned`].
pub const SELF_SIGNED_KEY_FILE: &str = "apiserver.key";

/// How often [`ReloadingResolver::watch`] re-reads the files when no file event arrives
/// (k8s.io/apiserver's dynamic serving certificate controller also polls every minute).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(60);

/// Why serving certificate material could not be loaded or generated.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A certificate or key file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: io::Error,
    },
    /// A file is not valid PEM.
    #[error("invalid PEM in {}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with the PEM.
        #[source]
        source: pem::Error,
    },
    /// The certificate file holds no `CERTIFICATE` block.
    #[error("no certificate in {}", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no private key block (PKCS#8, PKCS#1 or SEC1).
    #[error("no private key in {}", path.display())]
    NoPrivateKey {
        /// The file.
        path: PathBuf,
    },
    /// The first (leaf) certificate of the certificate file cannot be parsed.
    #[error("invalid certificate in {}", path.display())]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What is wrong with the certificate.
        #[source]
        source: X509Error,
    },
    /// The private key is of a type the `ring` provider cannot sign with.
    #[error("unsupported private key in {}", path.display())]
    UnsupportedKey {
        /// The file.
        path: PathBuf,
        /// Why rustls refused the key.
        #[source]
        source: rustls::Error,
    },
    /// The private key does not belong to the leaf certificate.
    #[error("the private key in {} does not belong to the certificate in {}", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// How rustls compared them.
        #[source]
        source: rustls::Error,
    },
    /// A self-signed certificate could not be generated.
    #[error("cannot generate a self-signed serving certificate")]
    Generate {
        /// Why rcgen failed.
        #[source]
        source: rcgen::Error,
    },
    /// A generated file (or its directory) could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: io::Error,
    },
}

/// The result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the serving certificate comes from (`--tls-cert-file`/`--tls-private-key-file`, or
/// `--cert-dir` when those are not given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// A PEM certificate chain (leaf first) and its PEM private key.
    Files {
        /// The certificate chain file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
    },
    /// A self-signed pair kept in `dir` as [`SELF_SIGNED_CERT_FILE`] and [`SELF_SIGNED_KEY_FILE`].
    SelfSigned {
        /// The directory (`--cert-dir`); created when missing.
        dir: PathBuf,
        /// The names the certificate must be valid for: DNS names, or IP addresses in their
        /// textual form (for example `localhost`, `127.0.0.1`, `<service>.<namespace>.svc`).
        hosts: Vec<String>,
    },
}

impl CertSource {
    /// Returns the files to serve from.
    ///
    /// For [`CertSource::SelfSigned`], an existing pair in the directory is reused when it loads,
    /// its key matches, it has not expired and it is valid for every host; otherwise a new CA and a
    /// serving certificate signed by it are generated (valid one year, ECDSA P-256) and written
    /// there: the certificate file holds the serving certificate followed by the CA certificate
    /// (the CA's key is discarded), the key file is created with mode `0600`.
    pub fn prepare(&self) -> Result<CertKeyFiles> {
        match self {
            Self::Files { cert, key } => Ok(CertKeyFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            Self::SelfSigned { dir, hosts } => self_signed::ensure(dir, hosts, SystemTime::now()),
        }
    }
}

/// A certificate chain file and its private key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKeyFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl CertKeyFiles {
    /// The directories holding the two files, without duplicates.
    fn directories(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::with_capacity(2);
        for file in [&self.cert, &self.key] {
            let dir = match file.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
                _ => PathBuf::from("."),
            };
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        dirs
    }
}

/// A validated pair, ready to serve.
struct Loaded {
    key: CertifiedKey,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Loaded {
    /// Logs a warning when the leaf is outside its validity period at `now`. Such a pair is still
    /// served, as kube-apiserver does: refusing it would not make clients accept it.
    fn warn_unless_valid_at(&self, files: &CertKeyFiles, now: SystemTime) {
        if now > self.not_after {
            warn!(cert = %files.cert.display(), not_after = ?self.not_after, "the serving certificate has expired");
        } else if now < self.not_before {
            warn!(cert = %files.cert.display(), not_before = ?self.not_before, "the serving certificate is not valid yet");
        }
    }
}

/// Reads and validates a pair: both files parse, and the key belongs to the leaf certificate.
fn load(files: &CertKeyFiles) -> Result<Loaded> {
    let cert_pem = read(&files.cert)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Pem {
            path: files.cert.clone(),
            source,
        })?;
    let leaf = chain.first().ok_or_else(|| Error::NoCertificate {
        path: files.cert.clone(),
    })?;
    let (not_before, not_after) = crate::parse_x509(leaf)
        .map(|cert| {
            let validity = cert.validity();
            (
                system_time(validity.not_before.timestamp()),
                system_time(validity.not_after.timestamp()),
            )
        })
        .map_err(|source| Error::Certificate {
            path: files.cert.clone(),
            source,
        })?;

    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| match source {
        pem::Error::NoItemsFound => Error::NoPrivateKey {
            path: files.key.clone(),
        },
        source => Error::Pem {
            path: files.key.clone(),
            source,
        },
    })?;
    let signing_key = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|source| {
        Error::UnsupportedKey {
            path: files.key.clone(),
            source,
        }
    })?;
    let key = CertifiedKey::new(chain, signing_key);
    key.keys_match().map_err(|source| Error::KeyMismatch {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    })?;
    Ok(Loaded {
        key,
        not_before,
        not_after,
    })
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

/// Converts seconds since the Unix epoch (negative before it) to a [`SystemTime`].
fn system_time(seconds: i64) -> SystemTime {
    let offset = Duration::from_secs(seconds.unsigned_abs());
    if seconds >= 0 {
        UNIX_EPOCH + offset
    } else {
        UNIX_EPOCH - offset
    }
}

/// Whether a file system event may mean that a file changed. Opening and reading (which this
/// module does itself on every reload) do not.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// What [`ReloadingResolver::reload`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// The files hold the certificate already served.
    Unchanged,
    /// A new pair was validated and is now served.
    Replaced,
}

/// Reload bookkeeping, for metrics and health reporting. Obtain it with
/// [`ReloadingResolver::status`].
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    /// How many times a new pair was published after the initial load.
    pub reloads: u64,
    /// How many reload attempts were refused (counted on every attempt, so a broken pair left in
    /// place counts once per poll).
    pub failures: u64,
    /// Why the latest reload attempt was refused; `None` once the files load again.
    pub last_error: Option<Arc<Error>>,
    /// When the served leaf certificate expires.
    pub not_after: Option<SystemTime>,
    /// Whether [`ReloadingResolver::watch`] currently has a directory watch; when `false` it
    /// relies on polling alone (and retries the watch at every poll).
    pub watching: bool,
}

/// Serves the current certificate to rustls and replaces it when its files change.
///
/// Lookups ([`ResolvesServerCert::resolve`]) are lock-free ([`ArcSwap`]); every handshake gets
/// the same certificate whatever the SNI.
#[derive(Debug)]
pub struct ReloadingResolver {
    files: CertKeyFiles,
    current: ArcSwap<CertifiedKey>,
    status: watch::Sender<ReloadStatus>,
}

impl ReloadingResolver {
    /// Loads and validates the pair. Fails when it cannot be used: a server should not start
    /// without a certificate. An expired (or not yet valid) certificate is logged and served.
    pub fn new(files: CertKeyFiles) -> Result<Self> {
        let loaded = load(&files)?;
        loaded.warn_unless_valid_at(&files, SystemTime::now());
        let status = ReloadStatus {
            not_after: Some(loaded.not_after),
            ..ReloadStatus::default()
        };
        Ok(Self {
            files,
            current: ArcSwap::from_pointee(loaded.key),
            status: watch::Sender::new(status),
        })
    }

    /// The files served from.
    pub fn files(&self) -> &CertKeyFiles {
        &self.files
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// Subscribes to the reload bookkeeping; read it with `borrow()`, or await changes.
    pub fn status(&self) -> watch::Receiver<ReloadStatus> {
        self.status.subscribe()
    }

    /// Re-reads the files now. A pair that loads and validates replaces the served one when its
    /// certificate chain differs; otherwise the served pair is kept and the error returned (and
    /// recorded in [`ReloadStatus`]). Does not log; [`ReloadingResolver::watch`] does.
    pub fn reload(&self) -> Result<Reloaded, Arc<Error>> {
        let loaded = match load(&self.files) {
            Ok(loaded) => loaded,
            Err(err) => {
                let err = Arc::new(err);
                self.status.send_modify(|status| {
                    status.failures += 1;
                    status.last_error = Some(Arc::clone(&err));
                });
                return Err(err);
            }
        };
        if self.current.load().cert == loaded.key.cert {
            self.status
                .send_if_modified(|status| status.last_error.take().is_some());
            return Ok(Reloaded::Unchanged);
        }
        loaded.warn_unless_valid_at(&self.files, SystemTime::now());
        let not_after = loaded.not_after;
        self.current.store(Arc::new(loaded.key));
        self.status.send_modify(|status| {
            status.reloads += 1;
            status.last_error = None;
            status.not_after = Some(not_after);
        });
        Ok(Reloaded::Replaced)
    }

    /// Keeps the served pair up to date until the returned future is dropped.
    ///
    /// Reloads when a file system event arrives for the files' directories, and every
    /// `poll_interval` ([`DEFAULT_POLL_INTERVAL`] is a good value) in case events are lost or the
    /// watch could not be set up (the watch is then retried at every poll). Replacements are
    /// logged at `info`, refusals at `warn` with the reason; a refused pair leaves the served one
    /// in place. Spawn it: `tokio::spawn(Arc::clone(&resolver).watch(DEFAULT_POLL_INTERVAL))`.
    pub async fn watch(self: Arc<Self>, poll_interval: Duration) {
        let changed = Arc::new(Notify::new());
        let directories = self.files.directories();
        let _stopped = NotWatchingOnDrop(&self.status);
        let mut watcher = self.start_watcher(&directories, &changed);
        let mut poll = tokio::time::interval_at(Instant::now() + poll_interval, poll_interval);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = changed.notified() => debug!("serving certificate directory changed"),
                _ = poll.tick() => {
                    if watcher.is_none() {
                        watcher = self.start_watcher(&directories, &changed);
                    }
                }
            }
            match self.reload() {
                Ok(Reloaded::Unchanged) => {}
                Ok(Reloaded::Replaced) => {
                    info!(cert = %self.files.cert.display(), "serving certificate reloaded");
                }
                Err(err) => warn!(
                    error = &*err as &dyn StdError,
                    "refused the new serving certificate; keeping the current one"
                ),
            }
        }
    }

    /// Watches `directories`, notifying `changed` on every event that may be a change (and on
    /// watch errors, to be safe). Returns `None`, logged, when the watch cannot be set up.
    fn start_watcher(
        &self,
        directories: &[PathBuf],
        changed: &Arc<Notify>,
    ) -> Option<RecommendedWatcher> {
        let notify = Arc::clone(changed);
        let handler = move |event: notify::Result<notify::Event>| match event {
            Ok(event) if is_change(&event.kind) => notify.notify_one(),
            Ok(_) => {}
            Err(err) => {
                warn!(
                    error = &err as &dyn StdError,
                    "serving certificate directory watch error"
                );
                notify.notify_one();
            }
        };
        let started =
            RecommendedWatcher::new(handler, notify::Config::default()).and_then(|mut watcher| {
                for directory in directories {
                    watcher.watch(directory, RecursiveMode::NonRecursive)?;
                }
                Ok(watcher)
            });
        let watching = started.is_ok();
        self.status.send_if_modified(|status| {
            std::mem::replace(&mut status.watching, watching) != watching
        });
        match started {
            Ok(watcher) => Some(watcher),
            Err(err) => {
                warn!(
                    error = &err as &dyn StdError,
                    "cannot watch the serving certificate directory; polling only"
                );
                None
            }
        }
    }
}

/// Clears [`ReloadStatus::watching`] when [`ReloadingResolver::watch`] stops (its future is
/// dropped, which also drops the directory watch).
struct NotWatchingOnDrop<'a>(&'a watch::Sender<ReloadStatus>);

impl Drop for NotWatchingOnDrop<'_> {
    fn drop(&mut self) {
        self.0
            .send_if_modified(|status| std::mem::replace(&mut status.watching, false));
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use tokio::time::timeout;

    use super::*;
    use crate::test_pki::{self, Authority, Issued};

    /// How long a test waits for the watcher to react before failing.
    const PATIENCE: Duration = Duration::from_secs(20);

    fn issue(ca: &Authority) -> anyhow::Result<Issued> {
        ca.issue(&test_pki::server(&["localhost", "127.0.0.1"])?)
    }

    /// Writes `cert`'s certificate and `key`'s key to `dir/tls.crt` and `dir/tls.key`, each
    /// atomically.
    fn write(dir: &Path, cert: &Issued, key: &Issued) -> anyhow::Result<CertKeyFiles> {
        let files = CertKeyFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        replace(&files.cert, &cert.cert_pem())?;
        replace(&files.key, &key.key_pem())?;
        Ok(files)
    }

    fn replace(path: &Path, contents: &str) -> anyhow::Result<()> {
        let temporary = path.with_extension("new");
        fs::write(&temporary, contents)?;
        fs::rename(&temporary, path)?;
        Ok(())
    }

    fn served(resolver: &ReloadingResolver) -> CertificateDer<'static> {
        resolver.current().cert[0].clone()
    }

    #[test]
    fn missing_files_are_named() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ca = Authority::root("ca")?;
        let pair = issue(&ca)?;
        let files = write(dir.path(), &pair, &pair)?;
        let missing = CertKeyFiles {
            cert: dir.path().join("missing.crt"),
            key: files.key.clone(),
        };
        let err = ReloadingResolver::new(missing).err();
        let Some(Error::Read { path, source }) = &err else {
            anyhow::bail!("expected a read error, got {err:?}");
        };
        assert_eq!(path, &dir.path().join("missing.crt"));
        assert_eq!(source.kind(), io::ErrorKind::NotFound);
        assert!(err.is_some_and(|err| err.to_string().contains("missing.crt")));

        let missing_key = CertKeyFiles {
            cert: files.cert,
            key: dir.path().join("missing.key"),
        };
        let err = ReloadingResolver::new(missing_key).err();
        assert!(
            matches!(&err, Some(Error::Read { path, .. }) if path.ends_with("missing.key")),
            "{err:?}"
        );
        Ok(())
    }

    #[test]
    fn invalid_files_are_refused_with_a_reason() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ca = Authority::root("ca")?;
        let pair = issue(&ca)?;
        let files = write(dir.path(), &pair, &pair)?;
        let resolver = ReloadingResolver::new(files.clone())?;
        let original = served(&resolver);

        replace(&files.cert, "not a certificate")?;
        let err = resolver.reload().err();
        assert!(
            matches!(err.as_deref(), Some(Error::NoCertificate { .. })),
            "{err:?}"
        );

        replace(
            &files.cert,
            "-----BEGIN CERTIFICATE-----\nMAMBAf8=\n-----END CERTIFICATE-----\n",
        )?;
        let err = resolver.reload().err();
        assert!(
            matches!(err.as_deref(), Some(Error::Certificate { .. })),
            "{err:?}"
        );

        replace(
            &files.cert,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )?;
        let err = resolver.reload().err();
        assert!(matches!(err.as_deref(), Some(Error::Pem { .. })), "{err:?}");

        replace(&files.cert, &pair.cert_pem())?;
        replace(&files.key, &pair.cert_pem())?;
        let err = resolver.reload().err();
        assert!(
            matches!(err.as_deref(), Some(Error::NoPrivateKey { .. })),
            "{err:?}"
        );

        assert_eq!(served(&resolver), original);
        let status = resolver.status().borrow().clone();
        assert_eq!((status.reloads, status.failures), (0, 4));
        assert!(status.last_error.is_some());

        replace(&files.key, &pair.key_pem())?;
        assert_eq!(resolver.reload()?, Reloaded::Unchanged);
        assert!(resolver.status().borrow().last_error.is_none());
        Ok(())
    }

    #[test]
    fn a_mismatched_pair_is_refused_and_the_current_one_kept() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ca = Authority::root("ca")?;
        let (first, second) = (issue(&ca)?, issue(&ca)?);
        let files = write(dir.path(), &first, &first)?;
        let resolver = ReloadingResolver::new(files.clone())?;
        assert_eq!(served(&resolver), first.der());
        assert_eq!(resolver.files(), &files);

        write(dir.path(), &second, &first)?;
        let err = resolver.reload().err();
        assert!(
            matches!(err.as_deref(), Some(Error::KeyMismatch { .. })),
            "{err:?}"
        );
        assert_eq!(served(&resolver), first.der());
        assert!(matches!(
            ReloadingResolver::new(files.clone()),
            Err(Error::KeyMismatch { .. })
        ));

        write(dir.path(), &second, &second)?;
        assert_eq!(resolver.reload()?, Reloaded::Replaced);
        assert_eq!(served(&resolver), second.der());
        let status = resolver.status().borrow().clone();
        assert_eq!((status.reloads, status.failures), (1, 1));
        assert!(status.last_error.is_none());
        assert!(status.not_after.is_some());
        Ok(())
    }

    #[test]
    fn an_expired_pair_is_served() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ca = Authority::root("ca")?;
        let mut params = test_pki::server(&["localhost"])?;
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let expired = ca.issue(&params)?;
        let resolver = ReloadingResolver::new(write(dir.path(), &expired, &expired)?)?;
        assert_eq!(served(&resolver), expired.der());
        assert_eq!(
            resolver.status().borrow().not_after,
            Some(UNIX_EPOCH + Duration::from_secs(978_307_200))
        );
        Ok(())
    }

    #[tokio::test]
    async fn watch_reloads_replaced_files_and_refuses_a_mismatch() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ca = Authority::root("ca")?;
        let (first, second) = (issue(&ca)?, issue(&ca)?);
        let resolver = Arc::new(ReloadingResolver::new(write(dir.path(), &first, &first)?)?);
        let mut status = resolver.status();
        let watching = tokio::spawn(Arc::clone(&resolver).watch(Duration::from_secs(3600)));
        timeout(PATIENCE, status.wait_for(|status| status.watching)).await??;

        replace(&dir.path().join("tls.crt"), &second.cert_pem())?;
        timeout(PATIENCE, status.wait_for(|status| status.failures >= 1)).await??;
        assert_eq!(served(&resolver), first.der());

        replace(&dir.path().join("tls.key"), &second.key_pem())?;
        timeout(PATIENCE, status.wait_for(|status| status.reloads == 1)).await??;
        assert_eq!(served(&resolver), second.der());
        assert!(status.borrow().last_error.is_none());
        watching.abort();
        timeout(PATIENCE, status.wait_for(|status| !status.watching)).await??;
        Ok(())
    }

    #[tokio::test]
    async fn watch_follows_a_kubernetes_secret_update() -> anyhow::Result<()> {
        // The layout kubelet's AtomicWriter maintains for a mounted Secret.
        let dir = tempfile::tempdir()?;
        let ca = Authority::root("ca")?;
        let (first, second) = (issue(&ca)?, issue(&ca)?);
        let version = |name: &str, pair: &Issued| -> anyhow::Result<()> {
            fs::create_dir(dir.path().join(name))?;
            write(&dir.path().join(name), pair, pair)?;
            Ok(())
        };
        version("..2025_01_01_00_00_00.1", &first)?;
        symlink("..2025_01_01_00_00_00.1", dir.path().join("..data"))?;
        symlink("..data/tls.crt", dir.path().join("tls.crt"))?;
        symlink("..data/tls.key", dir.path().join("tls.key"))?;
        let files = CertKeyFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let resolver = Arc::new(ReloadingResolver::new(files)?);
        assert_eq!(served(&resolver), first.der());
        let mut status = resolver.status();
        let watching = tokio::spawn(Arc::clone(&resolver).watch(Duration::from_secs(3600)));
        timeout(PATIENCE, status.wait_for(|status| status.watching)).await??;

        version("..2025_01_02_00_00_00.2", &second)?;
        symlink("..2025_01_02_00_00_00.2", dir.path().join("..data_tmp"))?;
        fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data"))?;
        fs::remove_dir_all(dir.path().join("..2025_01_01_00_00_00.1"))?;

        timeout(PATIENCE, status.wait_for(|status| status.reloads == 1)).await??;
        assert_eq!(served(&resolver), second.der());
        watching.abort();
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn watch_polls_for_changes_it_was_not_told_about() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ca = Authority::root("ca")?;
        let (first, second) = (issue(&ca)?, issue(&ca)?);
        let resolver = Arc::new(ReloadingResolver::new(write(dir.path(), &first, &first)?)?);
        // Changed before the watch starts: no event will ever report it.
        write(dir.path(), &second, &second)?;

        let started = Instant::now();
        let mut status = resolver.status();
        let watching = tokio::spawn(Arc::clone(&resolver).watch(DEFAULT_POLL_INTERVAL));
        timeout(
            DEFAULT_POLL_INTERVAL * 2,
            status.wait_for(|status| status.reloads == 1),
        )
        .await??;
        assert!(started.elapsed() >= DEFAULT_POLL_INTERVAL);
        assert_eq!(served(&resolver), second.der());
        watching.abort();
        Ok(())
    }

    #[test]
    fn watched_directories() {
        let files = CertKeyFiles {
            cert: PathBuf::from("/a/tls.crt"),
            key: PathBuf::from("/a/tls.key"),
        };
        assert_eq!(files.directories(), [PathBuf::from("/a")]);
        let files = CertKeyFiles {
            cert: PathBuf::from("tls.crt"),
            key: PathBuf::from("/b/tls.key"),
        };
        assert_eq!(
            files.directories(),
            [PathBuf::from("."), PathBuf::from("/b")]
        );
    }

    #[test]
    fn own_reads_are_not_changes() {
        use notify::event::{CreateKind, ModifyKind, RenameMode};
        assert!(!is_change(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(!is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(is_change(&EventKind::Create(CreateKind::Any)));
        assert!(is_change(&EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        ))));
    }
}
