//! elemental-changelog-apiserver: a Kubernetes aggregated API server that serves
//! Elemental OS changelogs as a read-only subresource of ManagedOSVersion.
//!
//! A request flows through [`server`] (TLS, HTTP/1.1 and HTTP/2) → [`request`] (the request
//! model) → authentication and authorization ([`elemental_changelog_auth`]: front-proxy
//! headers, client certificates, TokenReview, SubjectAccessReview) → [`routes`] which answer from the [`cache`] filled by
//! [`channels`] (reflectors and refresh triggers) through [`elemental_changelog_registry`]
//! (image pulls).

pub mod access_log;
pub mod cache;
pub mod channels;
pub mod cli;
pub mod config;
pub mod fleet;
pub mod health;
pub mod metrics;
pub mod objects;
pub mod read_error;
pub mod reflect;
pub mod request;
pub mod routes;
pub mod server;
pub mod telemetry;
