//! The total of parsed channel data kept in memory, bounded (`--max-kept-total`).
//!
//! The memory budget bounds pulls and parses while they run; what a parse
//! leaves behind is kept for as long as a channel serves it. Without a bound
//! on that, whoever can create ManagedOSVersionChannels could point many at
//! large images and exhaust the server's memory. The kept data is the parsed
//! data of the images channels serve, each image counted once however many
//! channels (or architectures of a single-platform image) share its parse,
//! by [`ChannelData::parsed_bytes`](elemental_changelog::data::ChannelData::parsed_bytes).
//!
//! A channel's new image is admitted when the data kept by the other
//! channels, the images other refreshes have admitted and not stored yet,
//! and the new image fit under the limit; the channel's own current data does
//! not count, as the new image replaces it (nor does the data of channels
//! refused for the same image: they move with it, sharing its parse, so
//! channels that share an image can move to its successor together). An image
//! past the limit is refused ([`Refused`]): a new channel serves nothing (its
//! versions answer `FetchFailed`, kind `limit_exceeded`, naming
//! `--max-kept-total`), a served one keeps its last good data, and the others
//! are untouched. A refused channel tries again when kept data is stored or
//! dropped ([`Kept::changes`]) and with its backoff, without pulling the image
//! again while it would still not fit; refused channels try one at a time
//! ([`Kept::retry_turn`]), so that data freed for one image is not pulled by
//! every refused channel at once.
//!
//! The bound holds between refreshes; while a channel replaces its data, its
//! old and new data are both in memory until the new one is stored.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Mutex, PoisonError},
};

use elemental_changelog_apiservice::Arch;
use elemental_changelog_registry::{Digest, ImageRef, Repository};
use tokio::sync::watch;

use crate::{
    cache::{Cache, ChannelKey, ChannelState, Snapshot},
    read_error::ReadErrorKind,
};

/// Which parsed data: an image's repository, manifest digest, and the
/// platform chosen from an index (`None`: a single-platform image, whose one
/// parse serves every architecture). The platform is the index entry's
/// description (`os/arch[/variant]`), not an [`Arch`]: a variant is part of it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ImageId {
    repository: Repository,
    digest: Digest,
    platform: Option<String>,
}

impl ImageId {
    /// The id of the parse of `image` at `digest` for `platform`.
    pub(super) fn new(image: &ImageRef, digest: &Digest, platform: Option<&str>) -> Self {
        Self {
            repository: image.repository(),
            digest: digest.clone(),
            platform: platform.map(str::to_owned),
        }
    }

    fn of(snapshot: &Snapshot) -> Self {
        Self::new(
            &snapshot.image,
            &snapshot.digest,
            snapshot.platform.as_deref(),
        )
    }
}

/// Why an image's data was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the image's parsed data ({needed} bytes) would take the data kept for all channels to {total} bytes, past --max-kept-total ({limit} bytes)"
)]
pub(super) struct Refused {
    /// Bytes of the image's parsed data.
    pub(super) needed: u64,
    /// What would be kept with it.
    pub(super) total: u64,
    /// `--max-kept-total`.
    pub(super) limit: u64,
}

/// What a worker remembers of the images refused for their size, so that
/// it does not pull them again while they still would not fit: by
/// architecture (`None`: a single-platform image, for every architecture)
/// of the channel's current image and digest.
#[derive(Default)]
pub(super) struct Refusals {
    images: HashMap<Option<Arch>, (ImageRef, Digest, ImageId, u64)>,
}

impl Refusals {
    /// The refused parse of `image` at `digest` for `arch`, and its bytes.
    pub(super) fn get(
        &self,
        image: &ImageRef,
        digest: &Digest,
        arch: &Arch,
    ) -> Option<(&ImageId, u64)> {
        [Some(arch.clone()), None]
            .iter()
            .filter_map(|a| self.images.get(a))
            .find(|(i, d, _, _)| i == image && d == digest)
            .map(|(_, _, id, bytes)| (id, *bytes))
    }

    /// Remembers a refusal (forgetting those of other images or digests).
    pub(super) fn insert(
        &mut self,
        image: &ImageRef,
        digest: &Digest,
        arch: &Arch,
        id: ImageId,
        bytes: u64,
    ) {
        self.images
            .retain(|_, (i, d, _, _)| i == image && d == digest);
        let arch = id.platform.is_some().then(|| arch.clone());
        self.images
            .insert(arch, (image.clone(), digest.clone(), id, bytes));
    }

    /// Forgets the refusals of `arch` (and of a single-platform image): admitted.
    pub(super) fn forget(&mut self, arch: &Arch) {
        self.images.remove(&Some(arch.clone()));
        self.images.remove(&None);
    }
}

/// Images admitted by refreshes still running, counted until they are stored
/// in the cache (and dropped with the [`Claim`]).
#[derive(Default)]
struct Admissions {
    next: u64,
    claims: HashMap<u64, (ImageId, u64)>,
    /// Channels refused for an image (of one digest per channel).
    waiting: HashSet<(ChannelKey, ImageId)>,
}

/// The kept-data limit and the admissions in flight.
pub(super) struct Kept {
    limit: u64,
    admissions: Mutex<Admissions>,
    /// Bumped when admitted data is stored or a channel's data dropped.
    changes: watch::Sender<u64>,
    /// Held by a refused channel from its new try until its data is stored.
    retrying: tokio::sync::Mutex<()>,
}

/// An admitted image, counted as kept until dropped (the refresh that read it
/// has stored its result in the cache by then).
pub(super) struct Claim<'a> {
    kept: &'a Kept,
    id: u64,
    /// The retry turn, when the image was refused before.
    turn: Option<tokio::sync::MutexGuard<'a, ()>>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.kept.lock().claims.remove(&self.id);
        // Stored: the next refused channel may try.
        drop(self.turn.take());
        self.kept.changed();
    }
}

impl Kept {
    /// At most `limit` bytes of parsed data kept (`u64::MAX`: no limit).
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            admissions: Mutex::default(),
            changes: watch::Sender::new(0),
            retrying: tokio::sync::Mutex::new(()),
        }
    }

    /// Waits for the turn of a refused image to be tried again (see
    /// [`Kept::admit`]).
    pub(super) async fn retry_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.retrying.lock().await
    }

    /// Told when kept data may have changed: admitted data stored, a channel
    /// dropped. Refused channels try again then.
    pub(super) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Forgets a deleted channel (its data is dropped from the cache).
    pub(super) fn forget(&self, channel: &ChannelKey) {
        self.lock().waiting.retain(|(c, _)| c != channel);
        self.changed();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Admissions> {
        self.admissions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What would be kept if `channel`'s data were replaced by `image`
    /// (`bytes` of parsed data): every other channel's data, the admissions in
    /// flight, and `image`, each image once.
    fn total_with(
        &self,
        admissions: &Admissions,
        cache: &Cache,
        channel: &ChannelKey,
        image: &ImageId,
        bytes: u64,
    ) -> u64 {
        // Channels refused for this image move with it.
        let mut moving: HashSet<&ChannelKey> = admissions
            .waiting
            .iter()
            .filter(|(_, id)| id == image)
            .map(|(c, _)| c)
            .collect();
        moving.insert(channel);
        let mut images = kept_images(cache, &moving);
        for (id, bytes) in admissions.claims.values() {
            images.insert(id.clone(), *bytes);
        }
        images.entry(image.clone()).or_insert(bytes);
        images.values().sum()
    }

    /// Admits `image` (`bytes` of parsed data) as `channel`'s new data, or
    /// refuses it past the limit. The claim counts it until dropped, and
    /// holds `turn` (see [`Kept::retry_turn`]) as long.
    pub(super) fn admit<'a>(
        &'a self,
        cache: &Cache,
        channel: &ChannelKey,
        image: ImageId,
        bytes: u64,
        turn: Option<tokio::sync::MutexGuard<'a, ()>>,
    ) -> Result<Claim<'a>, Refused> {
        let mut admissions = self.lock();
        let total = self.total_with(&admissions, cache, channel, &image, bytes);
        if total > self.limit {
            admissions
                .waiting
                .retain(|(c, id)| c != channel || id.digest == image.digest);
            admissions.waiting.insert((channel.clone(), image));
            return Err(Refused {
                needed: bytes,
                total,
                limit: self.limit,
            });
        }
        admissions
            .waiting
            .retain(|(c, id)| c != channel || (id.digest == image.digest && *id != image));
        let id = admissions.next;
        admissions.next = admissions.next.wrapping_add(1);
        admissions.claims.insert(id, (image, bytes));
        Ok(Claim {
            kept: self,
            id,
            turn,
        })
    }

    /// Whether [`Kept::admit`] would refuse `image` now (nothing is admitted).
    pub(super) fn refuses(
        &self,
        cache: &Cache,
        channel: &ChannelKey,
        image: &ImageId,
        bytes: u64,
    ) -> Option<Refused> {
        let admissions = self.lock();
        let total = self.total_with(&admissions, cache, channel, image, bytes);
        (total > self.limit).then_some(Refused {
            needed: bytes,
            total,
            limit: self.limit,
        })
    }
}

/// The parsed data channels serve, by image (each once), but `except`'s.
fn kept_images(cache: &Cache, except: &HashSet<&ChannelKey>) -> BTreeMap<ImageId, u64> {
    let mut images = BTreeMap::new();
    for (key, state) in cache.all() {
        if except.contains(&key) {
            continue;
        }
        for snapshot in state.archs.values().filter_map(|a| a.snapshot.as_ref()) {
            images
                .entry(ImageId::of(snapshot))
                .or_insert_with(|| snapshot.parsed.parsed_bytes());
        }
    }
    images
}

/// Whether the latest image of a channel was refused for the limit (for an
/// architecture at least).
pub(super) fn refused(state: &ChannelState) -> bool {
    state.archs.values().any(|a| {
        a.last_error
            .as_ref()
            .is_some_and(|e| e.kind == ReadErrorKind::OverKeptTotal)
    })
}

/// Bytes of parsed data the channels serve, each image once.
pub(super) fn kept_bytes(cache: &Cache) -> u64 {
    kept_images(cache, &HashSet::new()).values().sum()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use elemental_changelog::data::ChannelData;
    use jiff::Timestamp;

    use super::*;
    use crate::cache::ArchState;

    /// [`ImageId::new`] of a reference and a digest as written.
    fn id(image: &str, digest: &str, platform: Option<&str>) -> ImageId {
        ImageId::new(&image.parse().unwrap(), &digest.parse().unwrap(), platform)
    }

    fn snapshot(image: &str, digest: &str, platform: Option<&str>) -> Arc<Snapshot> {
        let parsed = Arc::new(
            ChannelData::from_files([(
                "channel.json".to_owned(),
                br#"[{"metadata":{"name":"v1"},"spec":{"version":"v1","type":"container"}}]"#
                    .to_vec(),
            )])
            .unwrap(),
        );
        Arc::new(Snapshot::read(
            image.parse().unwrap(),
            digest.parse().unwrap(),
            platform.map(str::to_owned),
            parsed,
            Timestamp::UNIX_EPOCH,
        ))
    }

    fn serve(cache: &Cache, channel: &str, snapshots: &[(&str, Arc<Snapshot>)]) {
        cache.update(&ChannelKey::new("ns", channel), |_| ChannelState {
            image: Some(snapshots[0].1.image.to_string()),
            attempted: true,
            archs: snapshots
                .iter()
                .map(|(arch, s)| {
                    (
                        arch.parse().unwrap(),
                        ArchState {
                            snapshot: Some(s.clone()),
                            ..ArchState::default()
                        },
                    )
                })
                .collect(),
        });
    }

    #[test]
    fn images_count_once_and_a_channel_s_own_data_is_replaced() {
        let cache = Cache::default();
        let a = snapshot("registry.example.com/a:1", "sha256:a", None);
        let each = a.parsed.parsed_bytes();
        assert!(each > 0);
        // One single-platform image serving two architectures of two channels.
        serve(
            &cache,
            "one",
            &[("x86_64", a.clone()), ("aarch64", a.clone())],
        );
        let same_by_another_tag = snapshot("registry.example.com/a:latest", "sha256:a", None);
        serve(&cache, "two", &[("x86_64", same_by_another_tag)]);
        assert_eq!(kept_bytes(&cache), each);

        let kept = Kept::new(2 * each);
        let three = ChannelKey::new("ns", "three");
        let b = id("registry.example.com/b:1", "sha256:b", None);
        let claim = kept.admit(&cache, &three, b.clone(), each, None).unwrap();
        // Another new image does not fit next to the admitted one...
        let c = id("registry.example.com/c:1", "sha256:c", None);
        let four = ChannelKey::new("ns", "four");
        let refused = kept
            .admit(&cache, &four, c.clone(), each, None)
            .err()
            .unwrap();
        assert_eq!(
            refused,
            Refused {
                needed: each,
                total: 3 * each,
                limit: 2 * each
            }
        );
        assert!(refused.to_string().contains("--max-kept-total"));
        // ...but the admitted image, shared, costs nothing more.
        assert!(kept.admit(&cache, &four, b, each, None).is_ok());
        drop(claim);
        assert!(kept.refuses(&cache, &four, &c, each).is_none());
        // A channel's new image replaces its own data: "four" may move from
        // d to c (a and c kept), while "one" may not (a stays with "two": a, d and c).
        serve(
            &cache,
            "four",
            &[(
                "x86_64",
                snapshot("registry.example.com/d:1", "sha256:d", None),
            )],
        );
        assert!(kept.refuses(&cache, &four, &c, each).is_none());
        let one = ChannelKey::new("ns", "one");
        assert!(kept.refuses(&cache, &one, &c, each).is_some());
        // Platforms of an index are distinct parses.
        assert_ne!(
            id("registry.example.com/e:1", "sha256:e", Some("linux/amd64")),
            id("registry.example.com/e:1", "sha256:e", Some("linux/arm64")),
        );
    }
}
