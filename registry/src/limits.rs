//! What an image may make the fetcher read and keep: the size and count
//! limits ([`FetchLimits`]), the [`Limit`] an image exceeded, and the paths
//! the caller wants kept from its layers ([`KeepFiles`]).

use std::fmt;

/// The files a caller wants kept from an image's layers: exact paths and
/// the regular files anywhere below some folders (paths relative to the
/// image root, normalised: `a/b`, no leading `/`). Everything else streams
/// through the layer reader without being buffered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepFiles {
    /// Files kept by exact path.
    pub files: &'static [&'static str],
    /// Folders whose files (at any depth) are kept.
    pub folders: &'static [&'static str],
}

impl KeepFiles {
    /// Keeps nothing.
    pub const NOTHING: Self = Self {
        files: &[],
        folders: &[],
    };

    /// Whether the normalised `path` is kept.
    pub fn keeps(&self, path: &str) -> bool {
        self.files.contains(&path)
            || self.folders.iter().any(|folder| {
                path.strip_prefix(folder)
                    .and_then(|rest| rest.strip_prefix('/'))
                    .is_some_and(|rest| !rest.is_empty())
            })
    }
}

/// Hard limits on what an image may make the fetcher read or keep. The default is what
/// the flags give by default ([`RegistryArgs::limits`](crate::config::RegistryArgs::limits)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchLimits {
    /// Compressed bytes of all layers of one image, as downloaded.
    pub max_compressed_bytes: u64,
    /// Decompressed (tar stream) bytes of all layers of one image.
    pub max_uncompressed_bytes: u64,
    /// Tar entries of all layers of one image.
    pub max_entries: u64,
    /// Size of one kept file (and of one tar metadata entry).
    pub max_file_bytes: u64,
    /// Total size of the kept files.
    pub max_kept_bytes: u64,
    /// Layers of one image manifest.
    pub max_layers: usize,
    /// Entries of one image index.
    pub max_index_manifests: usize,
}

/// Layers of one image manifest ([`FetchLimits::max_layers`]; no flag sets it).
pub const MAX_LAYERS: usize = 128;
/// Entries of one image index ([`FetchLimits::max_index_manifests`]; no flag sets it).
pub const MAX_INDEX_MANIFESTS: usize = 256;

/// Which of the [`FetchLimits`] an image exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// [`FetchLimits::max_compressed_bytes`].
    CompressedBytes,
    /// [`FetchLimits::max_uncompressed_bytes`].
    UncompressedBytes,
    /// [`FetchLimits::max_entries`].
    Entries,
    /// [`FetchLimits::max_file_bytes`].
    FileBytes,
    /// [`FetchLimits::max_kept_bytes`].
    KeptBytes,
    /// [`FetchLimits::max_layers`].
    Layers,
    /// [`FetchLimits::max_index_manifests`].
    IndexManifests,
    /// A manifest, index or token answer larger than its limit
    /// (`client::ResponseLimits`).
    ResponseBytes,
    /// The memory budget (`--memory-budget`).
    MemoryBudget,
}

impl Limit {
    /// A short stable name, usable as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CompressedBytes => "compressed_bytes",
            Self::UncompressedBytes => "uncompressed_bytes",
            Self::Entries => "entries",
            Self::FileBytes => "file_bytes",
            Self::KeptBytes => "kept_bytes",
            Self::Layers => "layers",
            Self::IndexManifests => "index_manifests",
            Self::ResponseBytes => "response_bytes",
            Self::MemoryBudget => "memory_budget",
        }
    }

    /// The limit's name as the flag that sets it, for messages.
    pub fn public_name(self) -> &'static str {
        match self {
            Self::CompressedBytes => "image size (--max-image-size)",
            Self::UncompressedBytes => "uncompressed size (--max-uncompressed-size)",
            Self::Entries => "layer entries (--max-layer-entries)",
            Self::FileBytes => "file size (--max-file-size)",
            Self::KeptBytes => "kept data (--max-kept-size)",
            Self::Layers => "layer count",
            Self::IndexManifests => "index size",
            Self::ResponseBytes => "registry response size",
            Self::MemoryBudget => "memory budget (--memory-budget)",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
