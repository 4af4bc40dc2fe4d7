//! The image store: channel images read once per process. It is the one place that
//! coalesces reads (one read per [`ImageKey`] at a time; the registry's fetcher pulls once per
//! call), shares parsed images between channels, and parses each pull in the memory the pull
//! reserved.
//!
//! A channel whose image resolves to a
//! digest that another channel already pulled and parsed (the same image
//! used in two namespaces, or an older image a retained version comes from)
//! serves that parse, shared through an [`Arc`]: no pull, no parse, no
//! memory budget taken, and one copy of the data in memory. A channel that
//! starts reading an image while another channel reads it waits for that
//! read and shares its parse (or, if it failed, reads the image itself).
//!
//! Parsed files that are byte-identical across images are kept once: channels of one OS
//! release built from the same repositories carry the same `updateinfo.xml`, whose advisories
//! are most of an image's parsed data. A new parse whose `updateinfo.xml` has the SHA-256 of
//! one a held image was parsed from serves that image's advisories and drops its own copy.
//! (The kept-data total, `kept.rs`, still counts each image's
//! [`parsed_bytes`](ChannelData::parsed_bytes) whole: it may count shared advisories more
//! than once, never less.)
//!
//! A read is shared under a [`ReadKey`]: the image key and the registry credential the read
//! sends ([`Access`]). A channel in a namespace a credential is not granted to reads anonymously,
//! under another key, and never receives what was pulled with the credential.
//!
//! [`ParsedImages`] holds [`Weak`] references only: it never keeps data alive
//! by itself. An entry lives as long as a snapshot built from it (see
//! [`Snapshot::parsed`](crate::cache::Snapshot::parsed)); dead entries are
//! pruned at every insert, so it never holds more than the images channels
//! hold plus one. Only good data is offered: an image whose `channel.json` is
//! missing or invalid is never recorded.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, Weak},
};

use elemental_changelog::{
    data::{self, ChannelData, DataError},
    updateinfo,
};
use elemental_changelog_apiservice::{Arch, types::Advisory};
use elemental_changelog_registry::{
    Access, Digest, FetchError, Fetched, ImageKey, ImageRef, KeepFiles, ParseAllowance,
};
use sha2::{Digest as _, Sha256};

use super::{Context, kept::Refused};
use crate::read_error::ReadErrorKind;

/// What the registry keeps from a channel image's layers: `/channel.json` and
/// the files under `/changelogs/`.
pub const CHANNEL_FILES: KeepFiles = KeepFiles {
    files: &["channel.json"],
    folders: &["changelogs"],
};

/// The parse limits whose memory caps are the allowance a pulled image holds:
/// the `updateinfo.xml` share, and the parse bytes reserved for the other kept
/// files (package lists and `updates.log`).
pub fn parse_limits(allowance: ParseAllowance) -> data::Limits {
    data::Limits {
        updateinfo: updateinfo::Limits {
            max_memory: allowance.updateinfo_bytes,
            ..updateinfo::Limits::default()
        },
        parse_bytes: allowance.parse_bytes,
    }
}

/// The key of `image` at `digest` for `arch`.
fn image_key(image: &ImageRef, digest: &Digest, arch: &Arch) -> ImageKey {
    ImageKey::new(image, digest, arch.oci())
}

/// What one read of an image is shared under: the image, and the credential the read sends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ReadKey {
    image: ImageKey,
    access: Access,
}

/// An image's parsed data and the platform it was read for.
#[derive(Clone, Debug)]
pub(super) struct Parsed {
    /// The data, as parsed from the image alone.
    pub(super) data: Arc<ChannelData>,
    /// `os/arch[/variant]` chosen from an index; `None` for a single-platform image.
    pub(super) platform: Option<String>,
}

struct Entry {
    data: Weak<ChannelData>,
    platform: Option<String>,
}

/// The SHA-256 of a file's bytes, as read from an image.
type FileDigest = [u8; 32];

/// The SHA-256 of each `updateinfo.xml` file among an image's `files`, by path.
fn updateinfo_digests(files: &[(String, Vec<u8>)]) -> HashMap<String, FileDigest> {
    files
        .iter()
        .filter(|(path, _)| data::is_updateinfo(path))
        .map(|(path, bytes)| (path.clone(), Sha256::digest(bytes).into()))
        .collect()
}

/// The images parsed by this process that some channel still holds, by
/// [`ImageKey`], and the images being read.
#[derive(Default)]
pub(super) struct ParsedImages {
    entries: Mutex<HashMap<ReadKey, Entry>>,
    /// One read per image at a time: a channel that starts reading an image
    /// another channel is reading waits, then shares its parse.
    reading: Mutex<HashMap<ReadKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Parsed `updateinfo.xml` advisories that some held image serves, by the SHA-256 of the
    /// file they were parsed from.
    updateinfo: Mutex<HashMap<FileDigest, Weak<Vec<Advisory>>>>,
}

/// The right to read an image, held while reading it (see [`ParsedImages::turn`]).
struct ReadTurn<'a> {
    images: &'a ParsedImages,
    key: ReadKey,
    guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for ReadTurn<'_> {
    fn drop(&mut self) {
        let mut reading = self
            .images
            .reading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Held by the table and this turn only: nobody waits; forget the key.
        // (Waiters take their clone under the same lock.)
        if Arc::strong_count(tokio::sync::OwnedMutexGuard::mutex(&self.guard)) <= 2 {
            reading.remove(&self.key);
        }
    }
}

impl ParsedImages {
    /// The parse of `key`, if a channel still holds it.
    pub(super) fn get(&self, key: &ReadKey) -> Option<Parsed> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = entries.get(key)?;
        Some(Parsed {
            data: entry.data.upgrade()?,
            platform: entry.platform.clone(),
        })
    }

    /// Offers `parsed` to the next readers of `key`, and forgets the images
    /// no channel holds any more.
    pub(super) fn insert(&self, key: ReadKey, parsed: &Parsed) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|_, e| e.data.strong_count() > 0);
        entries.insert(
            key,
            Entry {
                data: Arc::downgrade(&parsed.data),
                platform: parsed.platform.clone(),
            },
        );
    }

    /// Makes `data` serve the `updateinfo.xml` advisories a held image parsed from the same
    /// bytes (`digests`: the SHA-256 of each `updateinfo.xml` file of `data`'s image, by path),
    /// or offers its own to the next parses; forgets advisories no image holds any more.
    fn share_files(&self, data: &mut ChannelData, digests: &HashMap<String, FileDigest>) {
        let Some(digest) = data.updateinfo_path().and_then(|path| digests.get(path)) else {
            return;
        };
        let mut shared = self
            .updateinfo
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shared.retain(|_, advisories| advisories.strong_count() > 0);
        data.share_updateinfo(|own| match shared.get(digest).and_then(Weak::upgrade) {
            Some(held) => held,
            None => {
                shared.insert(*digest, Arc::downgrade(own));
                Arc::clone(own)
            }
        });
    }

    /// Waits until no other channel reads `key`, then holds the turn to
    /// read it until dropped.
    async fn turn(&self, key: &ReadKey) -> ReadTurn<'_> {
        let lock = {
            let mut reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
            // Keys nobody holds or waits for (a waiter cancelled last) go.
            reading.retain(|_, lock| Arc::strong_count(lock) > 1);
            reading.entry(key.clone()).or_default().clone()
        };
        ReadTurn {
            images: self,
            key: key.clone(),
            guard: lock.lock_owned().await,
        }
    }

    /// Entries held, dead ones included (they go at the next insert), and
    /// images being read.
    #[cfg(test)]
    fn lens(&self) -> (usize, usize) {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        (entries.len(), reading.len())
    }
}

/// How a channel got an image's data.
#[derive(Debug)]
pub(super) enum Read {
    /// Another channel's parse of the same image: nothing pulled or parsed.
    Shared(Parsed),
    /// Pulled and parsed for this read (and offered to the next readers).
    Pulled {
        /// The data.
        parsed: Parsed,
        /// Compressed bytes downloaded.
        compressed_bytes: u64,
    },
}

impl Read {
    /// The data read.
    pub(super) fn parsed(&self) -> &Parsed {
        match self {
            Self::Shared(parsed) | Self::Pulled { parsed, .. } => parsed,
        }
    }

    /// Compressed bytes downloaded for this read.
    pub(super) fn compressed_bytes(&self) -> u64 {
        match self {
            Self::Shared(_) => 0,
            Self::Pulled {
                compressed_bytes, ..
            } => *compressed_bytes,
        }
    }
}

/// Why an image could not be read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// Read, but its data does not fit next to what the other channels keep
    /// (`--max-kept-total`, see [`super::kept`]).
    OverKeptTotal {
        /// Why.
        refused: Refused,
        /// Compressed bytes downloaded.
        compressed_bytes: u64,
    },
    /// The pull failed.
    Fetch(FetchError),
    /// No or an invalid `channel.json`: the same bytes fail the same way.
    Unusable {
        /// Why.
        error: DataError,
        /// Compressed bytes downloaded.
        compressed_bytes: u64,
    },
    /// A bug: the parse panicked, or the pull answered with nothing.
    Internal {
        /// What happened.
        message: String,
        /// Compressed bytes downloaded.
        compressed_bytes: u64,
    },
}

impl ReadError {
    /// The error kind (metric label, public message).
    pub(super) fn kind(&self) -> ReadErrorKind {
        match self {
            Self::Fetch(error) => ReadErrorKind::Fetch(error.kind()),
            Self::Unusable {
                error: DataError::MissingChannelJson,
                ..
            } => ReadErrorKind::MissingChannelJson,
            Self::Unusable {
                error: DataError::ChannelJson(_),
                ..
            } => ReadErrorKind::InvalidChannelJson,
            Self::Internal { .. } => ReadErrorKind::Internal,
            Self::OverKeptTotal { .. } => ReadErrorKind::OverKeptTotal,
        }
    }

    /// The whole error chain, for logs.
    pub(super) fn message(&self) -> String {
        match self {
            Self::Fetch(error) => crate::telemetry::error_chain(error),
            Self::Unusable { error, .. } => crate::telemetry::error_chain(error),
            Self::Internal { message, .. } => message.clone(),
            Self::OverKeptTotal { refused, .. } => refused.to_string(),
        }
    }

    /// Compressed bytes downloaded before it failed.
    pub(super) fn compressed_bytes(&self) -> u64 {
        match self {
            Self::Fetch(_) => 0,
            Self::Unusable {
                compressed_bytes, ..
            }
            | Self::Internal {
                compressed_bytes, ..
            }
            | Self::OverKeptTotal {
                compressed_bytes, ..
            } => *compressed_bytes,
        }
    }
}

/// The data of `image` at `digest` (resolved by the caller) for `arch`:
/// another channel's parse when one holds it (or is reading it: this waits
/// for it), else pulled and parsed, off the async threads and in the memory
/// the pull reserved for it.
pub(super) async fn read(
    image: &ImageRef,
    digest: &Digest,
    arch: &Arch,
    namespace: &str,
    ctx: &Context,
) -> Result<Read, ReadError> {
    let key = ReadKey {
        image: image_key(image, digest, arch),
        access: ctx.fetcher.access(image, namespace),
    };
    let _turn = ctx.images.turn(&key).await;
    if let Some(parsed) = ctx.images.get(&key) {
        return Ok(Read::Shared(parsed));
    }
    tracing::debug!(image = image.as_str(), %arch, "pulling");
    let fetched = ctx
        .fetcher
        .pull(image, digest, arch, namespace)
        .await
        .map_err(ReadError::Fetch)?;
    let Fetched::Pulled {
        files,
        compressed_bytes,
        platform,
        memory,
        ..
    } = fetched
    else {
        return Err(ReadError::Internal {
            message: "the pull answered with nothing pulled".to_owned(),
            compressed_bytes: 0,
        });
    };
    // Parsed in the memory the pull reserved for it (held until the parse is done; this read
    // is the pull's only reader: the image store reads each key once at a time).
    tracing::debug!(image = image.as_str(), %arch, "parsing");
    // A bug that panics in the parse costs this read, not the process.
    let built = tokio::task::spawn_blocking(move || {
        let limits = memory
            .as_ref()
            .map_or_else(Default::default, |memory| parse_limits(memory.allowance()));
        let digests = updateinfo_digests(&files);
        let data = ChannelData::from_files_with_limits(files, limits);
        drop(memory);
        data.map(|data| (data, digests))
    })
    .await;
    match built {
        Ok(Ok((mut data, digests))) => {
            ctx.images.share_files(&mut data, &digests);
            let parsed = Parsed {
                data: Arc::new(data),
                platform,
            };
            ctx.images.insert(key, &parsed);
            Ok(Read::Pulled {
                parsed,
                compressed_bytes,
            })
        }
        Ok(Err(error)) => Err(ReadError::Unusable {
            error,
            compressed_bytes,
        }),
        Err(panicked) => Err(ReadError::Internal {
            message: panicked.to_string(),
            compressed_bytes,
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The anonymous [`ReadKey`] of a reference, a digest and an architecture as written.
    fn key(image: &str, digest: &str, arch: &str) -> ReadKey {
        ReadKey {
            image: image_key(
                &image.parse().unwrap(),
                &digest.parse().unwrap(),
                &arch.parse().unwrap(),
            ),
            access: Access::Anonymous,
        }
    }

    #[test]
    fn a_read_with_a_credential_is_not_an_anonymous_one() {
        let anonymous = key("registry.example.com/os/channel:v1", "sha256:a", "x86_64");
        let credentialed = ReadKey {
            access: Access::Credential("registry.example.com".to_owned()),
            ..anonymous.clone()
        };
        assert_ne!(anonymous, credentialed);
        let images = ParsedImages::default();
        let held = parsed(&["v1"]);
        images.insert(credentialed.clone(), &held);
        assert!(images.get(&credentialed).is_some());
        assert!(
            images.get(&anonymous).is_none(),
            "data pulled with a credential is shared with a read that may not send it"
        );
    }

    fn parsed(names: &[&str]) -> Parsed {
        let entries: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({"metadata": {"name": n}, "spec": {"version": n, "type": "container"}}))
            .collect();
        let files = vec![(
            "channel.json".to_owned(),
            serde_json::to_vec(&entries).unwrap(),
        )];
        Parsed {
            data: Arc::new(ChannelData::from_files(files).unwrap()),
            platform: None,
        }
    }

    #[test]
    fn the_key_is_the_repository_digest_and_normalised_architecture() {
        assert_eq!(
            key("registry.example.com/os/channel:v1", "sha256:a", "x86_64"),
            key("registry.example.com/os/channel:v2", "sha256:a", "amd64"),
            "tags of one digest are one image; amd64 is x86_64"
        );
        assert_ne!(
            key("registry.example.com/os/channel:v1", "sha256:a", "x86_64"),
            key("other.example.com/os/channel:v1", "sha256:a", "x86_64"),
            "another registry"
        );
        assert_ne!(
            key("registry.example.com/os/channel:v1", "sha256:a", "x86_64"),
            key("registry.example.com/os/channel:v1", "sha256:b", "x86_64"),
        );
        assert_ne!(
            key("registry.example.com/os/channel:v1", "sha256:a", "x86_64"),
            key("registry.example.com/os/channel:v1", "sha256:a", "aarch64"),
        );
    }

    #[test]
    fn entries_never_keep_data_alive_and_dead_ones_are_pruned() {
        let images = ParsedImages::default();
        let a = key("registry.example.com/a:1", "sha256:a", "x86_64");
        let b = key("registry.example.com/b:1", "sha256:b", "x86_64");
        let held = parsed(&["v1"]);
        images.insert(a.clone(), &held);
        let got = images.get(&a).unwrap();
        assert!(Arc::ptr_eq(&got.data, &held.data));
        drop(got);

        drop(held);
        assert!(images.get(&a).is_none(), "no channel holds it: gone");
        assert_eq!(
            images.lens().0,
            1,
            "the dead entry waits for the next insert"
        );
        let other = parsed(&["v2"]);
        images.insert(b.clone(), &other);
        assert_eq!(images.lens().0, 1, "pruned");
        assert!(images.get(&b).is_some());
    }

    const UPDATEINFO: &[u8] =
        include_bytes!("../../../changelog/tests/fixtures/updateinfo-sample.xml");

    /// The files of an image listing `names`, with `updateinfo` at `path`.
    fn image_files(names: &[&str], path: &str, updateinfo: &[u8]) -> Vec<(String, Vec<u8>)> {
        let entries: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({"metadata": {"name": n}, "spec": {"version": n, "type": "container"}}))
            .collect();
        vec![
            (
                "channel.json".to_owned(),
                serde_json::to_vec(&entries).unwrap(),
            ),
            (path.to_owned(), updateinfo.to_vec()),
        ]
    }

    /// Parses `files` as [`read`] does, sharing files through `images`.
    fn parse(images: &ParsedImages, files: Vec<(String, Vec<u8>)>) -> ChannelData {
        let digests = updateinfo_digests(&files);
        let mut data = ChannelData::from_files(files).unwrap();
        images.share_files(&mut data, &digests);
        data
    }

    #[test]
    fn byte_identical_updateinfo_is_kept_once_across_images() {
        let images = ParsedImages::default();
        let path = "changelogs/updateinfo.xml";
        let a = parse(&images, image_files(&["v1"], path, UPDATEINFO));
        // Another image (other versions, the file at another accepted path): same bytes.
        let b = parse(
            &images,
            image_files(&["v1", "v2"], "/changelogs/updateinfo.xml", UPDATEINFO),
        );
        let (a_info, b_info) = (a.updateinfo().unwrap(), b.updateinfo().unwrap());
        assert!(!a_info.is_empty());
        assert!(Arc::ptr_eq(a_info, b_info), "one copy of the advisories");

        // Other bytes (even if they parse the same) are their own parse.
        let mut other = UPDATEINFO.to_vec();
        other.extend_from_slice(b"\n");
        let c = parse(&images, image_files(&["v1"], path, &other));
        assert_eq!(c.updateinfo().unwrap(), a_info);
        assert!(!Arc::ptr_eq(c.updateinfo().unwrap(), a_info));

        // The table never keeps advisories alive: once no image holds them, a parse of the
        // same bytes is new, and dead entries go.
        drop((a, b));
        let d = parse(&images, image_files(&["v3"], path, UPDATEINFO));
        assert_eq!(Arc::strong_count(d.updateinfo().unwrap()), 1);
        drop(c);
        let held = images.updateinfo.lock().unwrap().len();
        assert_eq!(held, 2, "c's entry is dead but waits for the next share");
        let e = parse(&images, image_files(&["v4"], path, UPDATEINFO));
        assert!(Arc::ptr_eq(
            e.updateinfo().unwrap(),
            d.updateinfo().unwrap()
        ));
        assert_eq!(images.updateinfo.lock().unwrap().len(), 1, "pruned");

        // An image without updateinfo.xml shares nothing and records nothing.
        let files = image_files(&["v5"], "changelogs/v5.packages", b"");
        let f = parse(&images, files);
        assert!(f.updateinfo().is_none());
        assert_eq!(images.updateinfo.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn one_read_of_an_image_at_a_time_and_nothing_left_behind() {
        let images = ParsedImages::default();
        let a = key("registry.example.com/a:1", "sha256:a", "x86_64");
        let b = key("registry.example.com/b:1", "sha256:b", "x86_64");
        let first = images.turn(&a).await;
        let other = images.turn(&b).await;
        let second = images.turn(&a);
        tokio::pin!(second);
        let waited = tokio::time::timeout(std::time::Duration::from_secs(60), &mut second).await;
        assert!(waited.is_err(), "the second read of a waits");
        drop((first, other));
        assert_eq!(images.lens().1, 1, "a: the second read goes on");
        drop(second.await);
        assert_eq!(images.lens(), (0, 0));

        // A waiter cancelled after the holder went leaves a key nobody
        // holds: the next turn forgets it.
        let first = images.turn(&a).await;
        let mut waiter = Box::pin(images.turn(&a));
        let waited = tokio::time::timeout(std::time::Duration::from_secs(60), &mut waiter).await;
        assert!(waited.is_err());
        drop(first);
        drop(waiter);
        assert_eq!(images.lens().1, 1);
        drop(images.turn(&b).await);
        assert_eq!(images.lens(), (0, 0));
    }
}
