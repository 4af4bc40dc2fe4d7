//! elemental-changelog-apiserver: a Kubernetes aggregated API server that serves
//! Elemental OS changelogs as a read-only subresource of ManagedOSVersion.
//!
//! A request flows through [`server`] (TLS, HTTP/1.1 and HTTP/2) → [`request`] (the request
//! model) → authentication and authorization ([`elemental_changelog_auth`]: front-proxy
//! headers, client certificates, TokenReview, SubjectAccessReview) → [`routes`] which answer from the [`cache`] filled by
//! [`channels`] (the channel controller: reflectors, one reconcile per channel, one publisher)
//! through [`elemental_changelog_registry`] (image pulls). Summaries and machines are computed
//! when their inputs change ([`live`]) and kept in [`watch`] hubs, from which lists and
//! watches are served; the fleet view's resolution is in [`fleet`].

pub mod cache;
pub mod channels;
pub mod cli;
pub mod config;
pub mod fleet;
pub mod health;
pub mod live;
pub mod metrics;
pub mod objects;
pub mod read_error;
pub mod reflect;
pub mod request;
pub mod routes;
pub mod server;
pub mod telemetry;
pub mod watch;
