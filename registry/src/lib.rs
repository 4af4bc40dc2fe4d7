//! elemental-changelog-registry: reading images from OCI registries. Resolve a
//! tag to a digest, pull what is needed and keep the files a caller asks for
//! out of the layers, within limits and one process-wide memory budget.
//!
//! It knows nothing of what the files mean (channel data, `channel.json`) nor
//! of Kubernetes: the caller says which paths to keep ([`KeepFiles`]) and
//! which architecture to pull (its OCI name).
//!
//! [`Fetcher::fetch`] first asks the registry for the manifest digest (a HEAD
//! request); when it equals the digest the caller already holds nothing else
//! is pulled. Otherwise the manifest (for an image index, the `linux/<arch>`
//! one) and the layers are pulled. Every manifest and blob is checked against
//! its digest here.
//!
//! | module | concept | uses |
//! |---|---|---|
//! | [`budget`] | the process's memory [`Budget`] and its [`PullMemory`], all the memory arithmetic of a pull and its parse | |
//! | [`limits`] | [`FetchLimits`], the [`Limit`] an image exceeded, and [`KeepFiles`] | |
//! | [`image`] | [`ImageRef`], [`Repository`], [`Digest`], and [`ImageKey`]: what makes two pulls the same | |
//! | [`platform`] | choosing the `linux/<arch>` entry of an index | |
//! | [`digest`] | content digests computed as content arrives | |
//! | [`config`] | registry flags and settings | `budget`, `limits` |
//! | [`hop`] | every redirect and token realm checked against the allowed registries and plain-HTTP ones | `config` |
//! | [`client`] | the registry's HTTP API and token authentication, every response read under a size and time limit | `config`, `digest`, `hop` |
//! | [`layer`] | the layer reader: decompression, tar, whiteouts, limits | `budget`, `limits` |
//! | [`error`] | [`FetchError`] and its bounded [`FetchErrorKind`] | `budget`, `client`, `hop`, `image`, `layer`, `limits` |
//! | [`stream`] | a layer blob streamed, counted and hashed into the blocking layer reader | `client`, `digest`, `error`, `limits` |
//! | [`fetcher`] | [`Fetcher`]: resolve, pull (under the memory budget; one pull per call: coalescing is the caller's), manifest checks | all the above |
//! | [`reload`] | settings reloaded without a restart | `budget`, `config`, `error`, `fetcher` |
//!
//! Several images may be pulled at once with limits in the hundreds of
//! MiB, so memory is bounded twice: per image by [`FetchLimits`], and over
//! all pulls and parses by the process's [`Budget`].

pub mod budget;
pub mod client;
pub mod config;
pub mod digest;
pub mod error;
pub mod fetcher;
pub mod hop;
pub mod image;
pub mod layer;
pub mod limits;
pub mod platform;
pub mod reload;
pub mod stream;

pub use self::{
    budget::{Budget, BudgetError, PullMemory, Reservation},
    config::{Access, FetchConfig, Grant, PullFor, RegistryArgs},
    error::{FetchError, FetchErrorKind, ManifestError},
    fetcher::{Fetched, Fetcher, ParseAllowance, PulledMemory, Resolved},
    image::{
        Digest, ImageKey, ImageRef, InvalidDigest, InvalidImageRef, InvalidRepository, Repository,
    },
    limits::{FetchLimits, KeepFiles, Limit},
    reload::ReloadingFetcher,
};
