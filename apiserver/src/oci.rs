//! Channel images: resolve a tag to a digest, pull what is needed and read
//! `channel.json` and `changelogs/*` out of the layers.
//!
//! [`Fetcher::fetch`] first asks the registry for the manifest digest (a HEAD
//! request); when it equals the digest the caller already holds nothing else
//! is pulled. Otherwise the manifest (for an image index, the `linux/<arch>`
//! one) and the layers are pulled. Every manifest and blob is checked against
//! its digest here.
//!
//! | module | concept |
//! |---|---|
//! | [`fetcher`] | [`Fetcher`]: resolve, pull (single flight per digest and architecture, under the memory budget), manifest checks |
//! | [`client`] | the registry's HTTP API and token authentication, every response read under a size and time limit |
//! | [`stream`] | a layer blob streamed, counted and hashed into the blocking layer reader |
//! | [`layer`] | the layer reader: decompression, tar, whiteouts, limits |
//! | [`platform`] | choosing the `linux/<arch>` entry of an index |
//! | [`error`] | [`FetchError`] and its bounded [`FetchErrorKind`] |
//! | [`config`], [`reload`] | registry flags and settings, reloaded without a restart |
//!
//! Several channels may be pulled at once with limits in the hundreds of
//! MiB, so memory is bounded twice: per image by [`FetchLimits`], and over
//! all pulls and parses by the process's [`crate::budget::Budget`].

pub mod client;
pub mod config;
pub mod error;
pub mod fetcher;
pub mod layer;
pub mod platform;
pub mod reload;
pub mod stream;

pub use self::{
    config::{FetchConfig, RegistryArgs},
    error::{FetchError, FetchErrorKind, ManifestError},
    fetcher::{Fetched, Fetcher, ParseTurn, PulledMemory, Resolved},
    layer::{FetchLimits, Limit},
};
