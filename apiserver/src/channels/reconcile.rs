//! The reconcile function of a channel: one refresh of its image data, computed and
//! returned, never stored. It reads (the channel's image per architecture, through the
//! image store), admits (under the kept-data limit: the claims travel with the result
//! until it is published) and retains (versions an older image listed), and returns the
//! channel's [`NextState`]; the controller publishes it and asks the error policy what to
//! do next.

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use elemental_changelog_apiservice::Arch;
use elemental_changelog_registry::{Digest, ImageRef, InvalidImageRef};
use jiff::Timestamp;
use tracing::{debug, info, warn};

use super::{
    Context,
    crd::SyncKey,
    images::{self, Read, ReadError},
    kept::{Claim, ImageId, Refusals},
    metrics::{FetchResult, FileProblem},
    progress::Progress,
    retained::{self, Retained},
};
use crate::{
    cache::{
        ArchState, ChannelKey, ChannelState, FetchFailure, Refreshed, RetainedStatuses, Snapshot,
    },
    read_error::ReadErrorKind,
};

/// What a channel wants to be read: the image its spec names (as written; `None`: a
/// channel without one) and the operator's sync key the data is read for.
pub(super) type Want = (Option<String>, SyncKey);

/// What a channel's worker keeps from one reconcile to the next.
#[derive(Default)]
pub(super) struct ChannelMemory {
    /// Older images pulled for retained versions that had no data for them.
    pub(super) retained: retained::Memory,
    /// Images refused for the kept-data limit.
    pub(super) refusals: Refusals,
    /// Failed reconciles in a row (the backoff's step, counted by the error policy).
    pub(super) failures: u32,
}

/// A channel's state after one reconcile, to publish: the new state (failures recorded
/// next to the last good data), where retained versions stand, what the refresh was made
/// for, and the kept-data claims of the images it admitted (counted until published).
pub(super) struct NextState<'a> {
    /// The channel's new state.
    pub(super) state: ChannelState,
    /// Retained versions whose older image could not be pulled.
    pub(super) retained: RetainedStatuses,
    /// What the refresh was made for.
    pub(super) refreshed: Refreshed,
    /// The image the state was read from, to record in the channel history (`None`: the
    /// channel names no valid reference).
    pub(super) image: Option<ImageRef>,
    /// Images admitted under the kept-data limit; dropped once published.
    pub(super) claims: Vec<Claim<'a>>,
}

/// Why a refresh failed: what the error policy decides on. A failed refresh still has a
/// [`NextState`] (the failure recorded, the last good data kept), carried by [`RefreshError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Cause {
    /// The image's data would take the kept data past `--max-kept-total`: try again when
    /// kept data changes.
    #[error("the channel image was refused: its data does not fit under --max-kept-total")]
    OverKeptTotal,
    /// Reading the channel image failed for an architecture.
    #[error("reading the channel image for {arch} failed ({kind})")]
    Read {
        /// The first architecture that failed.
        arch: Arch,
        /// Why.
        kind: ReadErrorKind,
    },
    /// An older image a retained version comes from could not be pulled.
    #[error("pulling {image}, an older image of retained versions, failed ({kind})")]
    Retained {
        /// `repository@digest`.
        image: ImageRef,
        /// Why.
        kind: ReadErrorKind,
    },
}

/// A refresh that failed in part: its cause, and the state to publish all the same.
pub(super) struct RefreshError<'a> {
    /// Why.
    pub(super) cause: Cause,
    /// The state to publish.
    pub(super) next: NextState<'a>,
}

/// Brings `key`'s data to what the channel wants now (`want`): resolves the image per
/// architecture (no pull when the digest is unchanged), reads what changed through the
/// image store, admits it under the kept-data limit, then serves the versions older
/// images listed. Starts from the state the controller published last (`previous`); writes
/// nothing shared: what it found is returned, and only the first read attempted and the
/// retained versions being rebuilt are told to `progress` on the way.
pub(super) async fn reconcile<'a>(
    key: &ChannelKey,
    want: &Want,
    ctx: &'a Context,
    memory: &mut ChannelMemory,
    progress: &dyn Progress,
) -> Result<NextState<'a>, RefreshError<'a>> {
    let (image, sync) = want;
    debug!(image = image.as_deref().unwrap_or(""), "refreshing");
    let refreshed = Refreshed {
        sync: sync.clone(),
        // The versions known now: the registry is read after they existed.
        versions: Arc::new(ctx.version_names(key)),
    };
    let Some(text) = image else {
        progress.attempted();
        return Ok(NextState {
            state: ChannelState {
                image: None,
                attempted: true,
                archs: BTreeMap::new(),
            },
            retained: RetainedStatuses::new(),
            refreshed,
            image: None,
            claims: Vec::new(),
        });
    };
    // A reference that does not parse fails every architecture, as its resolve would.
    let image = text.parse::<ImageRef>();
    let previous = ctx.cache.get(key);
    let ReadArchs {
        archs,
        claims,
        mut cause,
    } = read_archs(key, &image, previous.as_deref(), ctx, memory).await;
    // The first fetch was attempted: readiness does not wait for the
    // rebuild of retained versions, which answer "not fetched yet" meanwhile.
    progress.attempted();
    ctx.versions.wait_until_ready().await;
    let repository = image.as_ref().ok().map(ImageRef::repository);
    let Retained {
        archs,
        statuses,
        failed,
    } = retained::retain(
        key,
        repository.as_ref(),
        previous.as_deref(),
        archs,
        ctx,
        &mut memory.retained,
        progress,
    )
    .await;
    if cause.is_none()
        && let Some((image, kind)) = failed
    {
        cause = Some(Cause::Retained { image, kind });
    }
    let next = NextState {
        state: ChannelState {
            image: Some(text.clone()),
            attempted: true,
            archs,
        },
        retained: statuses,
        refreshed,
        image: image.ok(),
        claims,
    };
    match cause {
        None => Ok(next),
        Some(cause) => Err(RefreshError { cause, next }),
    }
}

/// The channel's image read for every architecture, before retained versions are added.
struct ReadArchs<'a> {
    /// Each architecture's new state.
    archs: BTreeMap<Arch, ArchState>,
    /// The images admitted under the kept-data limit, counted until published.
    claims: Vec<Claim<'a>>,
    /// Why the read failed, if it did.
    cause: Option<Cause>,
}

/// Reads `image` for every architecture, starting from the `previous` state of each; a
/// single-platform image serves every architecture, so it is fetched once.
async fn read_archs<'a>(
    key: &ChannelKey,
    image: &Result<ImageRef, InvalidImageRef>,
    previous: Option<&ChannelState>,
    ctx: &'a Context,
    memory: &mut ChannelMemory,
) -> ReadArchs<'a> {
    let mut read = ReadArchs {
        archs: BTreeMap::new(),
        claims: Vec::new(),
        cause: None,
    };
    let mut single_platform: Option<ArchState> = None;
    for arch in &ctx.settings.architectures {
        if let Some(state) = &single_platform {
            read.archs.insert(arch.clone(), state.clone());
            continue;
        }
        let old = previous
            .and_then(|p| p.archs.get(arch))
            .cloned()
            .unwrap_or_default();
        let (state, claim) = match image {
            Ok(image) => refresh_arch(key, image, arch, old, ctx, &mut memory.refusals).await,
            Err(invalid) => (unparsable(invalid, arch, old, ctx), None),
        };
        read.claims.extend(claim);
        if let Some(this) = failure(arch, &state) {
            // Refused for the kept-data limit wins: the policy then also waits for kept data.
            if read.cause.is_none() || this == Cause::OverKeptTotal {
                read.cause = Some(this);
            }
        }
        if state.last_error.is_none()
            && state.snapshot.as_ref().is_some_and(|s| {
                image.as_ref().is_ok_and(|i| s.image == *i) && s.platform.is_none()
            })
        {
            single_platform = Some(state.clone());
        }
        read.archs.insert(arch.clone(), state);
    }
    read
}

/// Why reading `arch` failed, as the error policy sees it; an index without this
/// architecture is not a failure to retry soon.
fn failure(arch: &Arch, state: &ArchState) -> Option<Cause> {
    let error = state.last_error.as_ref()?;
    if error.kind == ReadErrorKind::NO_MATCHING_PLATFORM {
        None
    } else if error.kind == ReadErrorKind::OverKeptTotal {
        Some(Cause::OverKeptTotal)
    } else {
        Some(Cause::Read {
            arch: arch.clone(),
            kind: error.kind,
        })
    }
}

/// Reads the channel's image for one architecture: the new data of the
/// image alone (the caller adds retained versions), or `old` kept; with the
/// claim that counts new data under the kept-data limit until it is published.
async fn refresh_arch<'a>(
    key: &ChannelKey,
    image: &ImageRef,
    arch: &Arch,
    old: ArchState,
    ctx: &'a Context,
    refusals: &mut Refusals,
) -> (ArchState, Option<Claim<'a>>) {
    let attempt = Attempt {
        image,
        arch,
        started: Instant::now(),
        ctx,
    };
    debug!(image = image.as_str(), %arch, "resolving");
    let digest = match ctx.fetcher.resolve(image, &key.namespace).await {
        Ok(digest) => digest,
        Err(error) => return (attempt.failed(None, &ReadError::Fetch(error), old), None),
    };
    if let Some(state) = attempt.unchanged(&digest, &old) {
        return (state, None);
    }
    // Refused for its size before: pulled again only once it would fit, by one
    // refused channel at a time.
    let mut turn = None;
    if let Some((id, bytes)) = refusals
        .get(image, &digest, arch)
        .map(|(i, b)| (i.clone(), b))
    {
        turn = Some(ctx.kept.retry_turn().await);
        if let Some(refused) = ctx.kept.refuses(&ctx.cache, key, &id, bytes) {
            let error = ReadError::OverKeptTotal {
                refused,
                compressed_bytes: 0,
            };
            return (attempt.failed(Some(digest), &error, old), None);
        }
    }
    debug!(image = image.as_str(), %arch, %digest, "reading");
    let read = match images::read(image, &digest, arch, &key.namespace, ctx).await {
        Ok(read) => read,
        Err(error) => return (attempt.failed(Some(digest), &error, old), None),
    };
    let parsed = read.parsed();
    let id = ImageId::new(image, &digest, parsed.platform.as_deref());
    let bytes = parsed.data.parsed_bytes();
    match ctx.kept.admit(&ctx.cache, key, id.clone(), bytes, turn) {
        Ok(claim) => {
            refusals.forget(arch);
            (attempt.read(digest, read), Some(claim))
        }
        Err(refused) => {
            ctx.metrics.kept_data_refusal();
            refusals.insert(image, &digest, arch, id, bytes);
            let error = ReadError::OverKeptTotal {
                refused,
                compressed_bytes: read.compressed_bytes(),
            };
            (attempt.failed(Some(digest), &error, old), None)
        }
    }
}

/// The state of an architecture when the channel's image is no valid
/// reference: a failed fetch, counted and logged as the registry's resolve of
/// it would fail; the last good data kept.
fn unparsable(invalid: &InvalidImageRef, arch: &Arch, old: ArchState, ctx: &Context) -> ArchState {
    let started = Instant::now();
    let error = ReadError::Fetch(invalid.clone().into());
    let (image, kind, message) = (&invalid.image, error.kind(), error.message());
    ctx.metrics.fetch(
        FetchResult::Failed(kind),
        started.elapsed().as_secs_f64(),
        0,
    );
    warn!(%image, %arch, error = %message, %kind, "fetching the channel image failed; keeping the last good data");
    ArchState {
        last_error: Some(FetchFailure {
            kind,
            message,
            at: Timestamp::now(),
        }),
        ..old
    }
}

/// One architecture's fetch of a channel image, whose outcome becomes the
/// architecture's next state, counted and logged.
struct Attempt<'a> {
    image: &'a ImageRef,
    arch: &'a Arch,
    started: Instant,
    ctx: &'a Context,
}

impl Attempt<'_> {
    fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The state when the image still has `digest`, the digest of the data
    /// served (confirmed) or of the unusable image (still failing, not
    /// pulled again: the same bytes would fail the same way); `None` when
    /// it is another digest.
    fn unchanged(&self, digest: &Digest, old: &ArchState) -> Option<ArchState> {
        let (image, arch, metrics) = (self.image, self.arch, &self.ctx.metrics);
        if old
            .rejected
            .as_ref()
            .is_some_and(|(i, d)| i == image && digest == d)
        {
            let kind = old
                .last_error
                .as_ref()
                .map_or(ReadErrorKind::InvalidChannelJson, |e| e.kind);
            metrics.fetch(FetchResult::Failed(kind), self.seconds(), 0);
            debug!(%image, %arch, %digest, %kind, "image still the unusable one; not pulled again");
            return Some(old.clone());
        }
        let served = old.snapshot.as_ref()?;
        if served.image != *image || *digest != served.digest {
            return None;
        }
        metrics.fetch(FetchResult::Unchanged, self.seconds(), 0);
        debug!(%image, %arch, %digest, "image unchanged");
        Some(ArchState {
            snapshot: old.snapshot.clone(),
            confirmed_at: Some(Timestamp::now()),
            last_error: None,
            rejected: None,
        })
    }

    /// The state once the image at `digest` was read.
    fn read(&self, digest: Digest, read: Read) -> ArchState {
        let (image, arch, metrics) = (self.image, self.arch, &self.ctx.metrics);
        let parsed = match read {
            Read::Shared(parsed) => {
                metrics.fetch(FetchResult::Shared, self.seconds(), 0);
                info!(%image, %arch, %digest, versions = parsed.data.versions().len(), "channel image already read for another channel; sharing its data");
                parsed
            }
            Read::Pulled {
                parsed,
                compressed_bytes,
            } => {
                for problem in parsed.data.problems() {
                    metrics.file_problem(FileProblem::from(&problem.error));
                    warn!(%image, %arch, %digest, file = %problem.path, error = %problem, "rejected a file of the channel image");
                }
                let seconds = self.seconds();
                metrics.fetch(FetchResult::Pulled, seconds, compressed_bytes);
                info!(%image, %arch, %digest, versions = parsed.data.versions().len(), bytes = compressed_bytes, seconds, "channel image pulled");
                parsed
            }
        };
        let now = Timestamp::now();
        let snapshot = Snapshot::read(image.clone(), digest, parsed.platform, parsed.data, now);
        ArchState {
            snapshot: Some(Arc::new(snapshot)),
            confirmed_at: Some(now),
            last_error: None,
            rejected: None,
        }
    }

    /// The state after a failure: the last good data kept, the error
    /// recorded, and an unusable image (at `digest`) remembered as such.
    fn failed(&self, digest: Option<Digest>, error: &ReadError, old: ArchState) -> ArchState {
        let (image, arch) = (self.image, self.arch);
        let (kind, message) = (error.kind(), error.message());
        self.ctx.metrics.fetch(
            FetchResult::Failed(kind),
            self.seconds(),
            error.compressed_bytes(),
        );
        let rejected = match error {
            ReadError::Fetch(_) => {
                warn!(%image, %arch, error = %message, %kind, "fetching the channel image failed; keeping the last good data");
                old.rejected
            }
            ReadError::Unusable { .. } => {
                warn!(%image, %arch, digest = digest.as_ref().map(Digest::as_str), error = %message, %kind, "channel image is unusable; keeping the last good data");
                digest.map(|d| (image.clone(), d))
            }
            ReadError::Internal { .. } => {
                warn!(%image, %arch, digest = digest.as_ref().map(Digest::as_str), error = %message, %kind, "reading the channel image failed; keeping the last good data");
                old.rejected
            }
            ReadError::OverKeptTotal { .. } => {
                warn!(%image, %arch, digest = digest.as_ref().map(Digest::as_str), error = %message, %kind, "channel image refused: its data does not fit under --max-kept-total; keeping the last good data");
                old.rejected
            }
        };
        ArchState {
            last_error: Some(FetchFailure {
                kind,
                message,
                at: Timestamp::now(),
            }),
            rejected,
            ..old
        }
    }
}
