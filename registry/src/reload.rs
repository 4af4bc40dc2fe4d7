//! Registry credentials and CA bundles that rotate without a restart: the
//! files behind `--registry-config` and `--registry-ca-file` (usually a
//! mounted Secret and ConfigMap) are re-read periodically; when their content
//! changed and still parses, a new [`Fetcher`] replaces the current one. A
//! broken update is reported to the caller (who logs it) and the current
//! settings are kept.

use std::{sync::Arc, time::Duration};

use arc_swap::ArcSwap;

use crate::{
    budget::Budget,
    config::{ConfigError, RegistryArgs},
    error::FetchError,
    fetcher::Fetcher,
    limits::KeepFiles,
};

/// How often the caller should re-read the files ([`ReloadingFetcher::reload`]).
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// Why registry settings could not be (re)loaded.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// A file is unreadable or does not parse.
    #[error("registry settings")]
    Config(#[source] ConfigError),
    /// The HTTP client could not be built.
    #[error("registry client")]
    Client(#[source] FetchError),
}

/// A [`Fetcher`] rebuilt whenever its credential or CA files change.
pub struct ReloadingFetcher {
    args: RegistryArgs,
    keep: KeepFiles,
    /// One budget for the process, kept by every rebuilt fetcher.
    budget: Budget,
    current: ArcSwap<Fetcher>,
    fingerprint: std::sync::Mutex<Vec<u8>>,
}

impl ReloadingFetcher {
    /// Loads the settings, for fetchers that keep the files `keep` names;
    /// fails when they are unusable at start.
    pub fn new(args: RegistryArgs, keep: KeepFiles) -> Result<Self, ReloadError> {
        let fingerprint = fingerprint(&args);
        let budget = Budget::new(args.memory_budget);
        let fetcher = build(&args, keep, &budget)?;
        Ok(Self {
            args,
            keep,
            budget,
            current: ArcSwap::from_pointee(fetcher),
            fingerprint: std::sync::Mutex::new(fingerprint),
        })
    }

    /// The fetcher to use now.
    pub fn current(&self) -> Arc<Fetcher> {
        self.current.load_full()
    }

    /// Re-reads the files; returns whether a new fetcher was installed.
    pub fn reload(&self) -> Result<bool, ReloadError> {
        let now = fingerprint(&self.args);
        let mut last = self
            .fingerprint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *last == now {
            return Ok(false);
        }
        let fetcher = build(&self.args, self.keep, &self.budget)?;
        self.current.store(Arc::new(fetcher));
        *last = now;
        Ok(true)
    }
}

fn build(args: &RegistryArgs, keep: KeepFiles, budget: &Budget) -> Result<Fetcher, ReloadError> {
    let config = args.to_config(keep).map_err(ReloadError::Config)?;
    Fetcher::with_budget(config, budget.clone()).map_err(ReloadError::Client)
}

/// The content of the watched files (missing files read as empty: a file
/// that disappears is a change, and `to_config` then reports it).
fn fingerprint(args: &RegistryArgs) -> Vec<u8> {
    let mut out = Vec::new();
    for path in [&args.registry_config, &args.registry_ca_file]
        .into_iter()
        .flatten()
    {
        out.extend_from_slice(&std::fs::read(path).unwrap_or_default());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        registry: RegistryArgs,
    }

    fn args(config: &std::path::Path) -> RegistryArgs {
        let path = config.display().to_string();
        Cli::parse_from(["test", "--registry-config", path.as_str()]).registry
    }

    #[test]
    fn rotated_credentials_replace_the_fetcher_and_broken_ones_do_not() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"auths":{"r.example:5000":{"auth":"dXNlcjpvbGQ="}}}"#,
        )
        .unwrap();
        let reloading = ReloadingFetcher::new(args(&file), KeepFiles::NOTHING).unwrap();
        let first = reloading.current();
        assert!(
            !reloading.reload().unwrap(),
            "unchanged files keep the fetcher"
        );
        assert!(Arc::ptr_eq(&first, &reloading.current()));

        std::fs::write(
            &file,
            r#"{"auths":{"r.example:5000":{"auth":"dXNlcjpuZXc="}}}"#,
        )
        .unwrap();
        assert!(reloading.reload().unwrap());
        let second = reloading.current();
        assert!(!Arc::ptr_eq(&first, &second));
        let credential = second.config().credentials.get("r.example:5000").unwrap();
        assert_eq!(credential.password, "new");

        std::fs::write(&file, "not json").unwrap();
        assert!(reloading.reload().is_err());
        assert!(
            Arc::ptr_eq(&second, &reloading.current()),
            "a broken update keeps the current settings"
        );
    }
}
