//! Every host a pull reaches besides the image's registry is checked before it is reached:
//! a redirect (a registry sending blobs to a storage host) and a token realm (the token
//! server a `WWW-Authenticate` challenge names) go only to hosts on the allow-list
//! (`--allowed-registry`; empty: any host), and never from HTTPS to plain HTTP unless the
//! target is an `--insecure-registry`. So an allowed registry, or whoever sits on the path
//! to a plain-HTTP one, cannot make the server send requests to hosts and ports inside the
//! cluster.

use std::fmt;

use reqwest::Url;

use crate::config::{FetchConfig, registry_allowed, registry_host};

/// Most redirects followed for one request (reqwest's and browsers' default).
pub const MAX_REDIRECTS: usize = 10;

/// What sent the pull on to another URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// An HTTP redirect.
    Redirect,
    /// The token realm of a Bearer challenge.
    TokenRealm,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Redirect => "redirect",
            Self::TokenRealm => "token realm",
        })
    }
}

/// Why a hop was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The target host is not on the allow-list.
    NotAllowed,
    /// From HTTPS to plain HTTP on a host that is not an `--insecure-registry`.
    Downgrade,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotAllowed => "its host is not an allowed registry (--allowed-registry)",
            Self::Downgrade => {
                "it leaves HTTPS for plain HTTP on a host that is not an --insecure-registry"
            }
        })
    }
}

/// A hop refused before any connection to its target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{hop} to {target} refused: {refusal}")]
pub struct HopRefused {
    /// What sent the pull there.
    pub hop: Hop,
    /// The target, without query, fragment or user information.
    pub target: String,
    /// Why.
    pub refusal: Refusal,
}

/// The hosts a pull may be sent on to, from the settings.
#[derive(Clone, Debug, Default)]
pub struct Hops {
    /// `--allowed-registry`, as [`FetchConfig::allowed_registries`] (empty: any).
    allowed: Vec<String>,
    /// `--insecure-registry`, lower-cased.
    insecure: Vec<String>,
}

impl Hops {
    /// The hops the settings allow.
    pub fn new(config: &FetchConfig) -> Self {
        Self {
            allowed: config
                .allowed_registries
                .iter()
                .map(|r| registry_host(r))
                .collect(),
            insecure: config
                .insecure_registries
                .iter()
                .map(|r| r.trim().to_ascii_lowercase())
                .collect(),
        }
    }

    /// Whether a `hop` from a URL of scheme `from` to `to` may be taken.
    pub fn check(&self, hop: Hop, from: &str, to: &Url) -> Result<(), HopRefused> {
        let host = host_port(to);
        let refusal = if !registry_allowed(&self.allowed, &host) {
            Some(Refusal::NotAllowed)
        } else if from == "https" && to.scheme() != "https" && !self.insecure.contains(&host) {
            Some(Refusal::Downgrade)
        } else {
            None
        };
        match refusal {
            None => Ok(()),
            Some(refusal) => Err(HopRefused {
                hop,
                target: without_query(to),
                refusal,
            }),
        }
    }

    /// The redirect policy of the registry client: at most [`MAX_REDIRECTS`], each checked.
    pub fn redirect_policy(self) -> reqwest::redirect::Policy {
        reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            let from = attempt
                .previous()
                .last()
                .map(Url::scheme)
                .unwrap_or("https")
                .to_owned();
            match self.check(Hop::Redirect, &from, attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refused) => attempt.error(refused),
            }
        })
    }
}

/// The [`HopRefused`] behind a request error, if a redirect was refused.
pub fn refused_redirect(error: &reqwest::Error) -> Option<HopRefused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<HopRefused>() {
            return Some(refused.clone());
        }
        source = error.source();
    }
    None
}

/// `host[:port]` of a URL, lower-cased (no port when it is the scheme's default).
pub fn host_port(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

/// A URL without query, fragment or user information: what logs and errors may show.
pub fn without_query(url: &Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    let _ = url.set_password(None);
    let _ = url.set_username("");
    url.to_string()
}

#[cfg(test)]
mod tests;
