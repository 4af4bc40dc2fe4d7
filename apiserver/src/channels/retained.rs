//! Retained versions: for every ManagedOSVersion of a channel that the
//! channel's current image no longer lists, where its data comes from (the
//! older image the [channel history](super::history) maps it to, held here
//! already or pulled again by digest), and the composition of the snapshot
//! that serves them. Nothing here writes shared state: the composed states go back to
//! the reconcile, and the controller publishes them.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::Arc,
};

use elemental_changelog::{
    compute::IndexedChannel,
    data::{ChannelData, VersionData},
};
use elemental_changelog_apiservice::Arch;
use elemental_changelog_registry::{Digest, ImageRef, Repository};
use jiff::Timestamp;
use tracing::{info, warn};

use super::{
    Context,
    history::History,
    images::{self, Read},
    metrics::RetainedPull,
    progress::Progress,
};
use crate::{
    cache::{
        ArchState, ChannelKey, ChannelState, FetchFailure, RetainedStatus, RetainedStatuses,
        Snapshot,
    },
    read_error::ReadErrorKind,
    telemetry::error_chain,
};

/// What a worker remembers between refreshes: (digest, arch, version) of
/// older images pulled for a retained version that turned out to have no
/// changelog data for it, so they are not pulled again.
#[derive(Default)]
pub(super) struct Memory {
    no_data: HashSet<(Digest, Arch, String)>,
}

/// Where the data of a retained version comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    /// The snapshot being composed, or this replica's previous snapshot:
    /// the version with its data as held there (`digest`: the image it came from).
    Held { previous: bool, digest: Digest },
    /// An older image, pulled by digest (`reference` is `repository@digest`).
    Pulled { reference: ImageRef, digest: Digest },
}

/// Older images pulled during one refresh, by (digest, architecture).
type Pulled = BTreeMap<(Digest, Arch), Result<Arc<ChannelData>, FetchFailure>>;

/// A snapshot to serve retained versions with (shared by the architectures a
/// single-platform image serves), the architecture its sources were found for, and
/// where each retained version's data comes from.
type Group = (Arc<Snapshot>, Arch, BTreeMap<String, Source>);

/// The digest of the older image a retained version's data was kept from
/// (`None`: not retained). The changelog crate, which knows nothing of
/// registries, keeps it as the text [`compose_one`] gave it, a [`Digest`]'s,
/// so it parses.
fn retained_from(version: &VersionData) -> Option<Digest> {
    version.retained_from.as_deref()?.parse().ok()
}

/// The image a version's held data came from.
fn held_origin(snapshot: &Snapshot, name: &str) -> Option<Digest> {
    let version = snapshot.data.version(name)?;
    match version.retained_from {
        None => Some(snapshot.digest.clone()),
        Some(_) => retained_from(version),
    }
}

/// For every ManagedOSVersion of the channel (`live`) that `snapshot`'s image
/// does not list, where its data comes from: the image the history maps it
/// to (held here already, or to pull), else (no history, not recorded, or
/// recorded in another repository than `repository`, the channel image's
/// `registry/repository` (`None`: the channel names no valid reference): the
/// history never sends this server to another host, nor to another
/// repository of the same host, whose content whoever can write the history
/// may control) whatever this replica held.
#[allow(clippy::too_many_arguments)] // every input of the decision, none derivable from another
fn sources(
    key: &ChannelKey,
    arch: &Arch,
    repository: Option<&Repository>,
    snapshot: &Snapshot,
    previous: Option<&Snapshot>,
    live: &BTreeSet<String>,
    history: Option<&History>,
    memory: &Memory,
) -> BTreeMap<String, Source> {
    let mut out = BTreeMap::new();
    for name in live {
        if snapshot
            .data
            .version(name)
            .is_some_and(|v| v.retained_from.is_none())
        {
            continue;
        }
        let held = |want: Option<&Digest>| {
            [(false, Some(snapshot)), (true, previous)]
                .into_iter()
                .find_map(|(is_previous, s)| {
                    let digest = held_origin(s?, name)?;
                    want.is_none_or(|w| *w == digest).then_some(Source::Held {
                        previous: is_previous,
                        digest,
                    })
                })
        };
        let origin = history
            .zip(repository)
            .and_then(|(h, repository)| h.origin_in(key, name, repository));
        let source = match origin {
            Some(record) => held(Some(&record.digest)).or_else(|| {
                let known_empty =
                    memory
                        .no_data
                        .contains(&(record.digest.clone(), arch.clone(), name.clone()));
                (!known_empty).then(|| Source::Pulled {
                    reference: record.reference(),
                    digest: record.digest.clone(),
                })
            }),
            None => held(None),
        };
        if let Some(source) = source {
            out.insert(name.clone(), source);
        }
    }
    out
}

/// What [`retain`] made of a refresh's architectures.
pub(super) struct Retained {
    /// Each architecture's state, its snapshot serving the retained versions too.
    pub(super) archs: BTreeMap<Arch, ArchState>,
    /// Retained versions whose older image could not be pulled (empty: none).
    pub(super) statuses: RetainedStatuses,
    /// The first older image that could not be pulled, and why.
    pub(super) failed: Option<(ImageRef, ReadErrorKind)>,
}

/// Serves the retained versions of every architecture next to what
/// [`refresh_arch`](super::reconcile) read, pulling older images by digest where needed,
/// composed on the channel's `previous` state (the one published). `repository` is the
/// channel image's (`None`: the image is no valid reference). Writes nothing: which
/// versions are being rebuilt meanwhile is told to `progress`.
pub(super) async fn retain(
    key: &ChannelKey,
    repository: Option<&Repository>,
    previous: Option<&ChannelState>,
    mut archs: BTreeMap<Arch, ArchState>,
    ctx: &Context,
    memory: &mut Memory,
    progress: &dyn Progress,
) -> Retained {
    let history = ctx
        .history
        .as_ref()
        .map(|h| h.subscribe().borrow().0.clone());
    let live = ctx.version_names(key);
    memory.no_data.retain(|(_, _, name)| live.contains(name));
    // One set of sources per distinct snapshot: a single-platform image serves
    // every architecture with one.
    let mut groups: Vec<Group> = Vec::new();
    for (arch, state) in &archs {
        let Some(snapshot) = &state.snapshot else {
            continue;
        };
        if groups
            .iter()
            .any(|(s, _, _)| s.generation() == snapshot.generation())
        {
            continue;
        }
        let previous = previous
            .and_then(|p| p.archs.get(arch))
            .and_then(|a| a.snapshot.as_deref());
        let sources = sources(
            key,
            arch,
            repository,
            snapshot,
            previous,
            &live,
            history.as_deref(),
            memory,
        );
        groups.push((snapshot.clone(), arch.clone(), sources));
    }
    let mut pulled: Pulled = BTreeMap::new();
    let failed = pull_retained(key, &groups, &archs, ctx, memory, &mut pulled, progress).await;
    let statuses = retained_statuses(&groups, &archs, &pulled);
    let composed = compose(groups, previous, &pulled).await;
    for arch in archs.values_mut() {
        if let Some(snapshot) = &arch.snapshot
            && let Some((_, new)) = composed
                .iter()
                .find(|(old, _)| old.generation() == snapshot.generation())
        {
            arch.snapshot = Some(new.clone());
        }
    }
    Retained {
        archs,
        statuses,
        failed,
    }
}

/// Pulls the older images `groups` need, telling `progress` which retained versions are
/// being rebuilt first. Returns the first image that could not be pulled, and why.
async fn pull_retained(
    key: &ChannelKey,
    groups: &[Group],
    archs: &BTreeMap<Arch, ArchState>,
    ctx: &Context,
    memory: &mut Memory,
    pulled: &mut Pulled,
    progress: &dyn Progress,
) -> Option<(ImageRef, ReadErrorKind)> {
    let rebuilding = retained_statuses(groups, archs, pulled);
    if !rebuilding.values().all(BTreeMap::is_empty) {
        progress.rebuilding(rebuilding);
    }
    let mut failed = None;
    for (_, arch, sources) in groups {
        // One reference per digest: every record followed is of the channel's repository.
        let wanted: BTreeMap<&Digest, &ImageRef> = sources
            .values()
            .filter_map(|s| match s {
                Source::Pulled { reference, digest } => Some((digest, reference)),
                Source::Held { .. } => None,
            })
            .collect();
        for (digest, reference) in wanted {
            let slot = (digest.clone(), arch.clone());
            if pulled.contains_key(&slot) {
                continue;
            }
            let result = read_by_digest(reference, arch, &key.namespace, ctx)
                .await
                .map(|read| {
                    let (parsed, how) = match read {
                        Read::Shared(parsed) => (parsed, RetainedPull::Shared),
                        Read::Pulled { parsed, .. } => (parsed, RetainedPull::Pulled),
                    };
                    ctx.metrics.retained_pull(how);
                    parsed.data
                });
            match &result {
                Ok(data) => {
                    for (name, _) in sources.iter().filter(
                        |(_, s)| matches!(s, Source::Pulled { digest: d, .. } if d == digest),
                    ) {
                        if !data.version(name).is_some_and(|v| v.has_changelog_data()) {
                            memory
                                .no_data
                                .insert((digest.clone(), arch.clone(), name.clone()));
                        }
                    }
                    info!(image = %reference, %arch, "older image read for retained versions");
                }
                Err(failure) => {
                    failed.get_or_insert_with(|| (reference.clone(), failure.kind));
                    ctx.metrics.retained_pull(RetainedPull::Failed);
                    warn!(image = %reference, %arch, kind = %failure.kind, error = %failure.message, "pulling an older image for retained versions failed; retrying with backoff");
                }
            }
            pulled.insert(slot, result);
        }
    }
    failed
}

/// Which retained versions of `groups` are being rebuilt (their older image
/// not pulled yet) and which could not be, per architecture.
fn retained_statuses(
    groups: &[Group],
    archs: &BTreeMap<Arch, ArchState>,
    pulled: &Pulled,
) -> RetainedStatuses {
    let mut out = RetainedStatuses::new();
    for (arch, state) in archs {
        // Every architecture served by a group's snapshot shares its statuses.
        let Some((_, group_arch, sources)) = state.snapshot.as_ref().and_then(|s| {
            groups
                .iter()
                .find(|(g, _, _)| g.generation() == s.generation())
        }) else {
            continue;
        };
        for (name, source) in sources {
            let Source::Pulled { reference, digest } = source else {
                continue;
            };
            let status = match pulled.get(&(digest.clone(), group_arch.clone())) {
                None => RetainedStatus::Rebuilding {
                    image: reference.clone(),
                },
                Some(Err(failure)) => RetainedStatus::Failed {
                    image: reference.clone(),
                    failure: failure.clone(),
                },
                Some(Ok(_)) => continue,
            };
            out.entry(arch.clone())
                .or_default()
                .insert(name.clone(), status);
        }
    }
    out
}

/// Reads `reference` (`repository@digest`) for `arch`: another channel's
/// parse of it, or pulled and parsed.
async fn read_by_digest(
    reference: &ImageRef,
    arch: &Arch,
    namespace: &str,
    ctx: &Context,
) -> Result<Read, FetchFailure> {
    let failure = |kind: ReadErrorKind, message: String| FetchFailure {
        kind,
        message,
        at: Timestamp::now(),
    };
    // The registry still has it (a garbage-collected digest fails here).
    let digest = ctx
        .fetcher
        .resolve(reference, namespace)
        .await
        .map_err(|error| failure(error.kind().into(), error_chain(&error)))?;
    images::read(reference, &digest, arch, namespace, ctx)
        .await
        .map_err(|error| failure(error.kind(), error.message()))
}

/// Builds, on a blocking thread, each group's snapshot with the retained
/// versions of its sources (and summaries precomputed). A snapshot that already
/// holds exactly those is kept as it is. Returns (old, new) pairs.
async fn compose(
    groups: Vec<Group>,
    previous: Option<&ChannelState>,
    pulled: &Pulled,
) -> Vec<(Arc<Snapshot>, Arc<Snapshot>)> {
    // What each group can use: held data, and the older images pulled for it.
    let inputs: Vec<_> = groups
        .into_iter()
        .map(|(snapshot, arch, sources)| {
            let previous = previous
                .and_then(|p| p.archs.get(&arch))
                .and_then(|a| a.snapshot.clone());
            let images: BTreeMap<Digest, Arc<ChannelData>> = sources
                .values()
                .filter_map(|s| match s {
                    Source::Pulled { digest, .. } => {
                        match pulled.get(&(digest.clone(), arch.clone())) {
                            Some(Ok(data)) => Some((digest.clone(), data.clone())),
                            _ => None,
                        }
                    }
                    Source::Held { .. } => None,
                })
                .collect();
            (snapshot, previous, sources, images)
        })
        .collect();
    let built = tokio::task::spawn_blocking(move || {
        inputs
            .into_iter()
            .map(|(snapshot, previous, sources, images)| {
                let new = compose_one(&snapshot, previous.as_deref(), &sources, &images);
                (snapshot, new)
            })
            .collect::<Vec<_>>()
    })
    .await;
    // A panic while composing leaves the snapshots as read.
    built.unwrap_or_default()
}

fn compose_one(
    snapshot: &Arc<Snapshot>,
    previous: Option<&Snapshot>,
    sources: &BTreeMap<String, Source>,
    images: &BTreeMap<Digest, Arc<ChannelData>>,
) -> Arc<Snapshot> {
    let now: BTreeMap<String, Digest> = snapshot
        .data
        .data()
        .versions()
        .iter()
        .filter_map(|(n, v)| Some((n.clone(), retained_from(v)?)))
        .collect();
    let wanted: BTreeMap<String, Digest> = sources
        .iter()
        .filter(|(name, source)| match source {
            Source::Held { .. } => true,
            Source::Pulled { digest, .. } => images
                .get(digest)
                .and_then(|d| d.version(name))
                .is_some_and(|v| v.has_changelog_data()),
        })
        .map(|(name, source)| {
            let digest = match source {
                Source::Held { digest, .. } | Source::Pulled { digest, .. } => digest.clone(),
            };
            (name.clone(), digest)
        })
        .collect();
    if now == wanted {
        snapshot.data.precompute_summaries();
        return snapshot.clone();
    }
    let mut data = snapshot.parsed.as_ref().clone();
    let keep = |from_previous: bool| {
        move |name: &str| {
            sources.get(name).is_some_and(
                |s| matches!(s, Source::Held { previous, .. } if *previous == from_previous),
            )
        }
    };
    // Held data: each version keeps the image it came from.
    data.retain_from(snapshot.data.data(), snapshot.digest.as_str(), keep(false));
    if let Some(previous) = previous {
        data.retain_from(previous.data.data(), previous.digest.as_str(), keep(true));
    }
    for (digest, image) in images {
        data.retain_from(image, digest.as_str(), |name| {
            matches!(sources.get(name), Some(Source::Pulled { digest: d, .. }) if d == digest)
        });
    }
    let data = IndexedChannel::new(data);
    data.precompute_summaries();
    Arc::new(snapshot.with_data(data))
}
