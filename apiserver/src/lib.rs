//! elemental-changelog-apiserver: a Kubernetes aggregated API server that serves
//! Elemental OS changelogs as a read-only subresource of ManagedOSVersion.
//!
//! A request flows through [`server`] (TLS, HTTP/1.1 and HTTP/2) → [`request`] (the request
//! model) → authentication and authorization ([`elemental_changelog_auth`]: front-proxy
//! headers, client certificates, TokenReview, SubjectAccessReview) → [`routes`], which
//! answers from the [reflector stores](reflect) and the [`cache`] (where each version's data
//! stands: [`versions`]), building API objects with [`objects`] and the fleet view with
//! [`fleet`]. Summaries and machines are kept by the [`projectors`], below the routes, in
//! hubs ([`elemental_changelog_hub`]) from which lists, gets and watches are served.
//!
//! The [`cache`] is written by [`channels`] alone: its controller runs one worker per
//! channel, each worker a reconcile function that reads the channel's image through
//! [`elemental_changelog_registry`] (image pulls), admits it under the kept-data bound and
//! adds the versions older images listed; the controller's publisher is the one writer of
//! the cache and the channel history (see `docs/development.md`, "A channel change").
//!
//! The [`fleet`] view is pure functions over the fleet kinds' stores (`fleet::reflect`)
//! and the channels' version orders: a machine's current version, target, state and CVE
//! exposure, and a ManagedOSImage's upgrade plan.

pub mod access_log;
pub mod cache;
pub mod channels;
pub mod cli;
pub mod config;
pub mod fleet;
pub mod health;
pub mod metrics;
pub mod objects;
pub mod projectors;
pub mod read_error;
pub mod reflect;
pub mod request;
pub mod routes;
pub mod server;
pub mod telemetry;
pub mod versions;
