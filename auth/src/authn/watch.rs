//! Keeps the [`Authenticator`]'s configuration in step with the ConfigMap
//! `kube-system/extension-apiserver-authentication`, so that a rotated CA takes effect (and the
//! old one stops being accepted) without a restart.

use std::{collections::BTreeMap, convert::Infallible, pin::pin, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};

use super::{
    Authenticator,
    config::{AuthConfig, CONFIG_MAP_NAME, CONFIG_MAP_NAMESPACE},
};

/// Why the configuration watch stopped.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The watch stream ended, which a retrying watcher never does on its own.
    #[error("the watch of {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} ended")]
    Ended,
}

/// Watches the authentication ConfigMap (a `metadata.name` field selector in `kube-system`)
/// and loads every version of it into `authenticator`; a deleted ConfigMap disables both
/// certificate authenticators. The authenticator becomes ready once the first list completed,
/// whether or not the ConfigMap exists. Watch errors are logged, counted in the
/// metrics and retried with backoff, forever: this only returns if the
/// stream ends, which is an error for the supervisor to act on.
pub async fn watch_config(
    client: Client,
    authenticator: Arc<Authenticator>,
) -> Result<Infallible, WatchError> {
    let api: Api<ConfigMap> = Api::namespaced(client, CONFIG_MAP_NAMESPACE);
    let selector = format!("metadata.name={CONFIG_MAP_NAME}");
    let mut events = pin!(
        watcher(
            api,
            watcher::Config::default()
                .timeout(crate::WATCH_TIMEOUT_SECONDS)
                .fields(&selector)
        )
        .default_backoff()
    );
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::InitApply(config_map) | watcher::Event::Apply(config_map)) => {
                listed = true;
                authenticator.load_config_map(config_map.data.as_ref().unwrap_or(&BTreeMap::new()));
            }
            Ok(watcher::Event::InitDone) => {
                if !listed {
                    missing(&authenticator);
                }
                authenticator.mark_ready();
            }
            Ok(watcher::Event::Delete(_)) => missing(&authenticator),
            Err(error) => {
                if matches!(&error, watcher::Error::InitialListFailed(kube::Error::Api(status)) | watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 403)
                {
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        "cannot read {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: bind the server's ServiceAccount to \
                         the Role extension-apiserver-authentication-reader in {CONFIG_MAP_NAMESPACE}"
                    );
                } else {
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        "watching {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} failed, retrying"
                    );
                }
                authenticator.watch_failed();
            }
        }
    }
    Err(WatchError::Ended)
}

/// The ConfigMap is gone: only bearer tokens and anonymous requests remain.
fn missing(authenticator: &Authenticator) {
    tracing::warn!(
        "{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} does not exist: client certificates and front-proxy \
         requests are not authenticated until it does"
    );
    authenticator.set_config(AuthConfig::default());
}
