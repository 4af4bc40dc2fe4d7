//! The authentication configuration kube-apiserver publishes for extension servers in the
//! ConfigMap `kube-system/extension-apiserver-authentication`, as k8s.io/apiserver reads it
//! (`pkg/server/options/authentication.go`, `headerrequest/requestheader_controller.go`,
//! `dynamiccertificates/configmap_cafile_content.go`).
//!
//! A key whose content cannot be used disables the authenticator it configures (fail closed)
//! and is reported; the other authenticators keep working.

use std::collections::BTreeMap;

use elemental_changelog_certs::client::{self as certs, CaBundle};
use http::HeaderName;

use super::request_header::{HeaderNames, RequestHeaderAuthenticator};

/// Namespace of the authentication ConfigMap.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
/// Name of the authentication ConfigMap.
pub const CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";

/// PEM bundle of the CAs that sign user client certificates.
pub const CLIENT_CA_FILE: &str = "client-ca-file";
/// PEM bundle of the CAs that sign the front proxy's client certificate.
pub const REQUESTHEADER_CLIENT_CA_FILE: &str = "requestheader-client-ca-file";
/// JSON array of the common names the front proxy's certificate may carry (any when empty).
pub const REQUESTHEADER_ALLOWED_NAMES: &str = "requestheader-allowed-names";
/// JSON array of the headers holding the user name (the first non-empty one wins).
pub const REQUESTHEADER_USERNAME_HEADERS: &str = "requestheader-username-headers";
/// JSON array of the headers holding the user's uid (the first non-empty one wins).
pub const REQUESTHEADER_UID_HEADERS: &str = "requestheader-uid-headers";
/// JSON array of the headers holding the user's groups (every value of each).
pub const REQUESTHEADER_GROUP_HEADERS: &str = "requestheader-group-headers";
/// JSON array of the header prefixes whose headers hold the user's extra attributes.
pub const REQUESTHEADER_EXTRA_HEADERS_PREFIX: &str = "requestheader-extra-headers-prefix";

/// Why a key of the ConfigMap cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The key does not hold a JSON array of strings.
    #[error("{key}: not a JSON array of strings")]
    Json {
        /// The ConfigMap key.
        key: &'static str,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A header name of the key is empty (or only spaces).
    #[error("{key}: empty header name")]
    EmptyHeaderName {
        /// The ConfigMap key.
        key: &'static str,
    },
    /// A header name of the key is not a valid HTTP header name.
    #[error("{key}: invalid header name {name:?}")]
    HeaderName {
        /// The ConfigMap key.
        key: &'static str,
        /// The offending name.
        name: String,
        /// What the HTTP library said.
        #[source]
        source: http::header::InvalidHeaderName,
    },
    /// The key does not hold a usable PEM CA bundle.
    #[error("{key}: invalid CA bundle")]
    CaBundle {
        /// The ConfigMap key.
        key: &'static str,
        /// Why the bundle was refused.
        #[source]
        source: certs::Error,
    },
}

impl ConfigError {
    /// The ConfigMap key the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            Self::Json { key, .. }
            | Self::EmptyHeaderName { key }
            | Self::HeaderName { key, .. }
            | Self::CaBundle { key, .. } => key,
        }
    }
}

/// The authenticators the ConfigMap enables, ready to use.
///
/// The default value enables neither certificate authenticator: only bearer tokens
/// (TokenReview) and anonymous requests remain. Front-proxy headers are always stripped from
/// requests, the standard `X-Remote-*` ones included.
#[derive(Debug, Default)]
pub struct AuthConfig {
    /// Front-proxy authentication, when `requestheader-client-ca-file` is set and every
    /// `requestheader-*` key is valid.
    pub(super) request_header: Option<RequestHeaderAuthenticator>,
    /// Client certificate authentication, when `client-ca-file` is set and valid.
    pub(super) client_ca: Option<CaBundle>,
    /// Front-proxy headers to remove from every request: the configured ones (when they
    /// parse), whether or not the front-proxy authenticator is enabled.
    pub(super) strip: Option<HeaderNames>,
}

impl AuthConfig {
    /// Reads the ConfigMap's `data`. Every key that cannot be used is returned as an error and
    /// disables the authenticator it belongs to; missing keys simply leave it disabled.
    pub fn from_data(data: &BTreeMap<String, String>) -> (Self, Vec<ConfigError>) {
        let mut errors = Vec::new();

        let client_ca = ca_bundle(data, CLIENT_CA_FILE).unwrap_or_else(|error| {
            errors.push(error);
            None
        });

        let names = header_names(data);
        let allowed = strings(data, REQUESTHEADER_ALLOWED_NAMES);
        let ca = ca_bundle(data, REQUESTHEADER_CLIENT_CA_FILE);
        let strip = names.as_ref().ok().cloned();
        let request_header = match (ca, names, allowed) {
            (Ok(Some(ca)), Ok(names), Ok(allowed_names)) => Some(RequestHeaderAuthenticator {
                ca,
                allowed_names,
                names,
            }),
            (ca, names, allowed) => {
                errors.extend(ca.err());
                errors.extend(names.err());
                errors.extend(allowed.err());
                None
            }
        };

        (
            Self {
                request_header,
                client_ca,
                strip,
            },
            errors,
        )
    }

    /// Whether front-proxy (request header) authentication is enabled.
    pub fn request_header_enabled(&self) -> bool {
        self.request_header.is_some()
    }

    /// Whether client certificate authentication is enabled.
    pub fn client_ca_enabled(&self) -> bool {
        self.client_ca.is_some()
    }
}

/// The CA bundle at `key`: `None` when the key is missing or empty.
fn ca_bundle(
    data: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<CaBundle>, ConfigError> {
    match data.get(key).filter(|pem| !pem.trim().is_empty()) {
        None => Ok(None),
        Some(pem) => CaBundle::from_pem(pem.as_bytes())
            .map(Some)
            .map_err(|source| ConfigError::CaBundle { key, source }),
    }
}

/// The JSON array of strings at `key`, empty when the key is missing or empty (as Go's
/// `deserializeStrings`).
fn strings(data: &BTreeMap<String, String>, key: &'static str) -> Result<Vec<String>, ConfigError> {
    match data.get(key).filter(|json| !json.is_empty()) {
        None => Ok(Vec::new()),
        Some(json) => {
            serde_json::from_str(json).map_err(|source| ConfigError::Json { key, source })
        }
    }
}

/// Header names at `key`, trimmed (as Go's `trimHeaders`); an empty name is an error.
fn trimmed(data: &BTreeMap<String, String>, key: &'static str) -> Result<Vec<String>, ConfigError> {
    strings(data, key)?
        .into_iter()
        .map(|name| {
            let name = name.trim();
            if name.is_empty() {
                Err(ConfigError::EmptyHeaderName { key })
            } else {
                Ok(name.to_owned())
            }
        })
        .collect()
}

fn header_list(
    data: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Vec<HeaderName>, ConfigError> {
    trimmed(data, key)?
        .into_iter()
        .map(|name| {
            HeaderName::from_bytes(name.as_bytes()).map_err(|source| ConfigError::HeaderName {
                key,
                name,
                source,
            })
        })
        .collect()
}

fn header_names(data: &BTreeMap<String, String>) -> Result<HeaderNames, ConfigError> {
    Ok(HeaderNames {
        username: header_list(data, REQUESTHEADER_USERNAME_HEADERS)?,
        uid: header_list(data, REQUESTHEADER_UID_HEADERS)?,
        group: header_list(data, REQUESTHEADER_GROUP_HEADERS)?,
        extra_prefixes: trimmed(data, REQUESTHEADER_EXTRA_HEADERS_PREFIX)?
            .into_iter()
            .map(|prefix| prefix.to_ascii_lowercase())
            .collect(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const KEYS: [&str; 7] = [
        CLIENT_CA_FILE,
        REQUESTHEADER_CLIENT_CA_FILE,
        REQUESTHEADER_ALLOWED_NAMES,
        REQUESTHEADER_USERNAME_HEADERS,
        REQUESTHEADER_UID_HEADERS,
        REQUESTHEADER_GROUP_HEADERS,
        REQUESTHEADER_EXTRA_HEADERS_PREFIX,
    ];

    proptest! {
        #[test]
        fn any_content_is_accepted_or_reported(values in proptest::collection::vec(".{0,40}", KEYS.len())) {
            let data: BTreeMap<String, String> =
                KEYS.iter().zip(values).map(|(key, value)| ((*key).to_owned(), value)).collect();
            let (config, errors) = AuthConfig::from_data(&data);
            for error in &errors {
                prop_assert!(KEYS.contains(&error.key()));
            }
            // Without a parseable CA bundle, neither certificate authenticator is on.
            prop_assert!(!config.client_ca_enabled() && !config.request_header_enabled());
        }

        #[test]
        fn header_names_are_trimmed_and_lower_cased(names in proptest::collection::vec("[A-Za-z][A-Za-z0-9-]{0,20}", 1..4)) {
            let padded: Vec<String> = names.iter().map(|name| format!(" {name} ")).collect();
            let data = BTreeMap::from([
                (REQUESTHEADER_USERNAME_HEADERS.to_owned(), serde_json::to_string(&padded).unwrap()),
                (REQUESTHEADER_EXTRA_HEADERS_PREFIX.to_owned(), serde_json::to_string(&names).unwrap()),
            ]);
            let parsed = header_names(&data).unwrap();
            let lower: Vec<String> = names.iter().map(|name| name.to_ascii_lowercase()).collect();
            prop_assert_eq!(parsed.username.iter().map(HeaderName::as_str).collect::<Vec<_>>(), lower.clone());
            prop_assert_eq!(parsed.extra_prefixes, lower);
            prop_assert!(parsed.uid.is_empty() && parsed.group.is_empty());
        }
    }
}
