//! Every module's families registered together, as `main` registers them.

use std::collections::BTreeMap;

use elemental_changelog_auth::{AuthMetrics as _, Authentication, Authorization};

use super::*;
use crate::{
    channels::{
        history::{HistoryMetrics, HistoryWrite},
        metrics::{ChannelMetrics, FetchResult, FileProblem, RetainedPull},
    },
    fleet::metrics::FleetMetrics,
    read_error::ReadErrorKind,
    reflect::{WatchMetrics, WatchedResource},
    request::RequestResource,
    routes::{
        metrics::{AuthCounts, ServingLimit, ServingMetrics},
        ready::AnswerMetrics,
    },
    server::{CertMetrics, CertReload},
};

/// Registers every family in `registry` and counts something in each of its metrics, so
/// that every metric shows in the exposition (a labelled metric shows once it has a series).
fn count_everything(registry: &Registry) {
    count_serving(registry);
    count_channels(registry);
    count_watches_and_auth(registry);
    count_the_rest(registry);
}

/// Connections and requests, every limit and every resource.
fn count_serving(registry: &Registry) {
    let serving: Arc<ServingMetrics> = registry.register();
    serving.connection_refused();
    for limit in [
        ServingLimit::Inflight,
        ServingLimit::Timeout,
        ServingLimit::ComputeQueue,
        ServingLimit::Reviews,
    ] {
        serving.request_refused(limit);
    }
    drop(serving.connection_opened());
    serving
        .watch_opened()
        .ended(crate::routes::watch::stream::End::Behind);
    std::mem::forget(serving.connection_opened());
    for resource in [
        RequestResource::Summaries,
        RequestResource::Changelog,
        RequestResource::Machines,
        RequestResource::MachineChangelog,
        RequestResource::ImageChangelog,
        RequestResource::Discovery,
        RequestResource::OpenApi,
        RequestResource::Health,
        RequestResource::Metrics,
        RequestResource::Other,
    ] {
        serving.request("get", resource).finish(200);
    }
    serving.request("BREW", RequestResource::Other).finish(418);
}

/// The channel controller: fetches, file problems, the cache, kept data, retained pulls.
fn count_channels(registry: &Registry) {
    let channels: Arc<ChannelMetrics> = registry.register();
    channels.fetch(FetchResult::Pulled, 0.3, 1000);
    channels.fetch(FetchResult::Unchanged, 0.02, 0);
    channels.fetch(FetchResult::Shared, 0.02, 0);
    channels.fetch(FetchResult::Failed(ReadErrorKind::OverKeptTotal), 7.0, 0);
    channels.fetch(
        FetchResult::Failed(ReadErrorKind::NO_MATCHING_PLATFORM),
        70.0,
        0,
    );
    for file in [
        FileProblem::UpdatesLog,
        FileProblem::Packages,
        FileProblem::UpdateInfo,
        FileProblem::UnknownVersion,
        FileProblem::NotAContainer,
        FileProblem::DuplicateUpdateInfo,
    ] {
        channels.file_problem(file);
    }
    channels.cache_size(1, 2, 3, 4);
    channels.kept_data(5, 1);
    channels.kept_data_limit(100);
    channels.kept_data_refusal();
    channels.channel_age("ns", "ch", 3.0);
    channels.channel_age("ns", "gone", 3.0);
    channels.forget_channel("ns", "gone");
    for result in [
        RetainedPull::Pulled,
        RetainedPull::Shared,
        RetainedPull::Failed,
    ] {
        channels.retained_pull(result);
    }
    channels.worker_panic();
}

/// Every watch, and the auth crate's counts, which share the watch families.
fn count_watches_and_auth(registry: &Registry) {
    let watches: Arc<WatchMetrics> = registry.register();
    for resource in [
        WatchedResource::Channels,
        WatchedResource::Versions,
        WatchedResource::History,
        WatchedResource::MachineInventories,
        WatchedResource::MachineInventorySelectors,
        WatchedResource::ManagedOsImages,
    ] {
        watches.watch_error(resource);
        watches.watch_synced(resource, resource != WatchedResource::History);
    }

    let auth = AuthCounts::new(registry, watches);
    for result in [
        Authentication::RequestHeader,
        Authentication::X509,
        Authentication::Token,
        Authentication::Anonymous,
        Authentication::Failed,
    ] {
        auth.authentication(result);
    }
    for decision in [
        Authorization::Allowed,
        Authorization::Denied,
        Authorization::Error,
    ] {
        auth.authorization(decision);
    }
    auth.config_watch_failed();
    auth.config_watch_synced();
}

/// The fleet gauge, certificate reloads, the channel history and the answer cache.
fn count_the_rest(registry: &Registry) {
    let fleet: Arc<FleetMetrics> = registry.register();
    fleet.set_machines(&BTreeMap::from([
        (
            ("ns".to_owned(), "UpToDate".to_owned(), "none".to_owned()),
            3,
        ),
        (
            (
                "ns".to_owned(),
                "UpdatesAvailable".to_owned(),
                "critical".to_owned(),
            ),
            2,
        ),
    ]));

    let certs: Arc<CertMetrics> = registry.register();
    certs.cert_reload(CertReload::Loaded);
    certs.cert_reload(CertReload::Rejected);
    certs.cert_reload(CertReload::Loaded);

    let history: Arc<HistoryMetrics> = registry.register();
    for result in [
        HistoryWrite::Written,
        HistoryWrite::Conflict,
        HistoryWrite::Failed,
    ] {
        history.history_write(result);
    }
    history.history_records(7);
    history.history_enabled(true);

    let answers: Arc<AnswerMetrics> = registry.register();
    answers.answer_cache(true);
    answers.answer_cache(false);
    answers.answer_cache(false);
    answers.answer_cache_bytes(1234, 2);
}

/// The `# HELP` and `# TYPE` lines of every metric, sorted: names, help texts and types are
/// what dashboards and alerts read, and stay as they were before the families moved to the
/// modules that count (`headers.txt` is the exposition of the one `Metrics` struct they
/// replaced).
#[test]
fn every_family_registers_once_with_the_names_help_and_types_it_had() {
    let registry = Registry::default();
    count_everything(&registry);
    let text = String::from_utf8(registry.encode()).unwrap_or_default();
    let mut headers: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    headers.sort_unstable();
    let expected: Vec<&str> = include_str!("headers.txt").lines().collect();
    assert_eq!(headers, expected);
}

#[test]
fn a_single_series_declared_with_labels_is_refused() {
    let definition = Definition {
        name: "things",
        help: "Things.",
        labels: &["kind"],
        buckets: &[],
    };
    assert!(<IntGauge as Metric>::new(&definition).is_err());
    assert!(<IntGaugeVec as Metric>::new(&definition).is_ok());
}

#[test]
fn a_family_encodes_alone_as_the_registry_shows_it() {
    let registry = Registry::default();
    let channels: Arc<ChannelMetrics> = registry.register();
    channels.channel_age("fleet-default", "sl-micro", 3.0);
    channels.fetch(FetchResult::Pulled, 0.3, 1000);
    assert_eq!(channels.encode(), registry.encode());
    channels.forget_channel("fleet-default", "sl-micro");
    let text = String::from_utf8(registry.encode()).unwrap_or_default();
    assert!(!text.contains("sl-micro"), "{text}");
}
