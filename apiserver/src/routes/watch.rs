//! Watch requests (`?watch=true` on `managedosversions` and `machineinventories`, in a
//! namespace or all): authorized as the list is (verb `watch`), bounded in number
//! (`--max-watches`, `--max-watches-per-user`: 429 past them; a watch is not a request in
//! flight), then streamed from the resource's hub (see [`elemental_changelog_hub`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use elemental_changelog_apiservice::{
    API_VERSION, MACHINE_SUMMARY_KIND, SUMMARY_KIND,
    content::{self, Representation},
    fleet::{MachineInventoryChangelogSummary, table::machines_table},
    status::StatusError,
    table::{add_package_column, summaries_table_version},
    types::ManagedOSVersionChangelogSummary,
};
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::StreamBody;

pub mod stream;

use elemental_changelog_hub::{Expired, Item, Object, Reader, Start};

use super::{metrics::OpenWatch, resources::selects_item};
use crate::request::{ListParams, WatchParams};
use stream::{Encoding, Options, Visible, WatchStream};

/// Shortest life of a watch without `timeoutSeconds` (kube-apiserver's
/// `--min-request-timeout`); each gets between this and twice this, so that watches
/// opened together do not all end together.
pub const MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Watches a user may hold and still take a reserved slot ([`WatchSlots`]): enough for a
/// dashboard (machines and versions, in two tabs) or a few `kubectl get -w`.
pub const RESERVED_PER_USER: usize = 4;

/// Watches open, in all and by user, under `--max-watches` and `--max-watches-per-user`,
/// with a reserve so that no small set of users can take every slot: the last tenth of
/// `--max-watches` (rounded down) is kept for users who hold fewer than
/// [`RESERVED_PER_USER`] watches. Ten users with 100 watches each reach the reserve after
/// nine of them; what is left serves others, each up to [`RESERVED_PER_USER`], so at least
/// a tenth of `--max-watches` divided by four more users (25 of the default 1,000) watch
/// whatever the first hold.
///
/// Why a reserve: a per-user share that shrinks as more users hold watches cannot take back
/// what the first users already hold (a watch lasts 30 to 60 minutes), so they could still
/// fill every slot before anyone else came; kube's priority-and-fairness seats bound
/// requests in flight, and a watch holds one only while its initial events are sent, so
/// they do not bound how many watches one identity holds; ending another user's watch to
/// make room would turn one user's excess into everyone's re-lists.
pub struct WatchSlots {
    max: usize,
    max_per_user: usize,
    /// Slots of `max` only users below [`RESERVED_PER_USER`] take.
    reserve: usize,
    open: Mutex<Open>,
}

/// The watches open.
#[derive(Default)]
struct Open {
    total: usize,
    by_user: HashMap<String, usize>,
}

/// Which limit refused a watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchLimit {
    /// `--max-watches` (or its reserve, for a user holding [`RESERVED_PER_USER`] or more).
    Total,
    /// `--max-watches-per-user`.
    PerUser,
}

/// A watch's place under the limits, given back when the watch ends (with what else the
/// watch keeps until then).
pub struct WatchSlot {
    slots: Arc<WatchSlots>,
    user: String,
    _keep: Box<dyn Send>,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.slots.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_user.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_user.remove(&self.user);
            }
        }
    }
}

impl WatchSlots {
    /// At most `max` watches, `max_per_user` of one user, the last tenth of `max` for users
    /// holding fewer than [`RESERVED_PER_USER`].
    pub fn new(max: usize, max_per_user: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            max_per_user,
            reserve: max / 10,
            open: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for one more watch of `user`, or the limit that refuses it.
    pub fn take(
        self: &Arc<Self>,
        user: &str,
        keep: Box<dyn Send>,
    ) -> Result<WatchSlot, WatchLimit> {
        let mut open = self.lock();
        let mine = open.by_user.get(user).copied().unwrap_or(0);
        if open.total >= self.max {
            return Err(WatchLimit::Total);
        }
        if mine >= self.max_per_user {
            return Err(WatchLimit::PerUser);
        }
        let reserved = open.total >= self.max - self.reserve;
        if reserved && mine >= RESERVED_PER_USER {
            return Err(WatchLimit::Total);
        }
        open.total += 1;
        open.by_user.insert(user.to_owned(), mine + 1);
        Ok(WatchSlot {
            slots: self.clone(),
            user: user.to_owned(),
            _keep: keep,
        })
    }

    /// Watches open.
    pub fn open(&self) -> usize {
        self.lock().total
    }
}

/// The body of every response: whole bytes, or a watch's stream.
pub type Body = http_body_util::Either<http_body_util::Full<bytes::Bytes>, StreamBody<WatchStream>>;

/// What one kind of watched object needs on the wire.
pub struct Kind<T> {
    /// `kind` of one object (bookmarks carry it).
    pub kind: &'static str,
    /// One object as a one-row Table (`first`: with column definitions; `cve`: with the CVE
    /// columns).
    pub table: fn(&T, Representation, bool, bool) -> Vec<u8>,
}

/// What a watch adds to each object: a machine's exposure to the CVE asked (`?cve=`).
pub type Transform<T> = Box<dyn Fn(T) -> T + Send + Sync>;

/// What `?cve=` (or `?package=`) does to a watch.
pub enum CveWatch<T: Object> {
    /// Each machine carries its exposure to the CVE.
    Exposure(Transform<T>),
    /// Only the versions whose changelog fixes the CVE are seen (with the selectors'
    /// transitions: a version whose data comes to fix it is ADDED).
    Fixing(Visible<T>),
    /// `?package=`: only the objects `visible` keeps are seen (with the selectors'
    /// transitions: an object whose version comes into the bounds is ADDED, one that leaves
    /// them DELETED), each as `transform` makes it (with its `package` block).
    Package {
        /// Which objects are seen.
        visible: Visible<T>,
        /// What each carries.
        transform: Transform<T>,
    },
}

/// Version summaries.
pub const SUMMARIES: Kind<ManagedOSVersionChangelogSummary> = Kind {
    kind: SUMMARY_KIND,
    table: summary_row,
};

/// Machines.
pub const MACHINES: Kind<MachineInventoryChangelogSummary> = Kind {
    kind: MACHINE_SUMMARY_KIND,
    table: machine_row,
};

fn summary_row(
    item: &ManagedOSVersionChangelogSummary,
    r: Representation,
    first: bool,
    _cve: bool,
) -> Vec<u8> {
    let Representation::Table {
        version,
        include_object,
    } = r
    else {
        return Vec::new();
    };
    let mut table =
        summaries_table_version(std::slice::from_ref(item), true, version, include_object);
    if item.package.is_some() {
        add_package_column(&mut table, [item.package.as_ref()]);
    }
    one_row(&mut table.column_definitions, first);
    table.metadata.resource_version = item.metadata.resource_version.clone().unwrap_or_default();
    serde_json::to_vec(&table).unwrap_or_default()
}

fn machine_row(
    item: &MachineInventoryChangelogSummary,
    r: Representation,
    first: bool,
    cve: bool,
) -> Vec<u8> {
    let Representation::Table {
        version,
        include_object,
    } = r
    else {
        return Vec::new();
    };
    let mut table = machines_table(
        std::slice::from_ref(item),
        true,
        cve,
        version,
        include_object,
    );
    if item.package.is_some() {
        add_package_column(&mut table, [item.package.as_ref()]);
    }
    one_row(&mut table.column_definitions, first);
    table.metadata.resource_version = item.metadata.resource_version.clone().unwrap_or_default();
    serde_json::to_vec(&table).unwrap_or_default()
}

/// Column definitions go with the first event of a watch only, as kube-apiserver sends them.
fn one_row<C>(columns: &mut Vec<C>, first: bool) {
    if !first {
        columns.clear();
    }
}

/// What a watch holds while it lasts: its place under the limits, its count in the metrics,
/// and the compute slots (`--max-compute-concurrency`) its heavy batches are written under.
pub struct Held {
    /// Its place under `--max-watches` and `--max-watches-per-user`.
    pub slot: WatchSlot,
    /// Counted in `watches_open` until it ends, then in `watches_ended_total`.
    pub open: OpenWatch,
    /// The compute slots.
    pub compute: Arc<tokio::sync::Semaphore>,
}

/// Starts the watch `params` ask of `hub`, for the objects of `namespace` (or all), in the
/// representation `accept` asks, with what `?cve=` asks when given; `slot` is held until it
/// ends (see [`Held`]).
pub fn watch<T: Object>(
    hub: &Reader<T>,
    kind: &Kind<T>,
    namespace: Option<&str>,
    params: &ListParams,
    accept: Option<&str>,
    cve: Option<CveWatch<T>>,
    held: Held,
) -> Result<Response<Body>, StatusError> {
    let Held {
        slot,
        open,
        compute,
    } = held;
    let (transform, fixing) = match cve {
        None => (None, None),
        Some(CveWatch::Exposure(transform)) => (Some(transform), None),
        Some(CveWatch::Fixing(fixing)) => (None, Some(fixing)),
        Some(CveWatch::Package { visible, transform }) => (Some(transform), Some(visible)),
    };
    let representation = content::negotiate(accept, params.include_object)?;
    params.fields.check_supported()?;
    let options = params.watch.clone().unwrap_or_default();
    let start = match start(hub, &options) {
        Ok(start) => start,
        // As kube-apiserver's watch cache: the watch starts, and its one event says why it
        // ends (client-go and Steve list again on a 410 `Expired`).
        Err(expired) => return Ok(expired_stream(&expired, representation)),
    };
    let watcher = hub
        .watch(namespace, start)
        .map_err(|e| StatusError::expired(e.to_string()));
    let watcher = match watcher {
        Ok(watcher) => watcher,
        Err(error) => return Ok(error_stream(&error, representation)),
    };
    // What makes the watch parse each object it sends: its batches are then written off the
    // async threads, under the compute bound.
    let parses = transform.is_some()
        || fixing.is_some()
        || !params.labels.is_empty()
        || matches!(representation, Representation::Table { .. });
    let selection = params.clone();
    let table = kind.table;
    let cve = params.cve.is_some();
    let encoding = match (representation, transform) {
        (Representation::Json, None) => Encoding::Json,
        (Representation::Json, Some(transform)) => {
            Encoding::Render(Box::new(move |item: &Item<T>, _| {
                serde_json::to_vec(&transform(item.object())).unwrap_or_default()
            }))
        }
        (Representation::Table { .. }, None) => {
            Encoding::Render(Box::new(move |item: &Item<T>, first| {
                table(&item.object(), representation, first, false)
            }))
        }
        (Representation::Table { .. }, Some(transform)) => {
            Encoding::Render(Box::new(move |item: &Item<T>, first| {
                table(&transform(item.object()), representation, first, cve)
            }))
        }
    };
    let timeout = timeout(&options);
    let body = stream::stream(
        watcher,
        Options {
            visible: Box::new(move |item: &Item<T>| {
                selects_item(&selection, item) && fixing.as_ref().is_none_or(|f| f(item))
            }),
            encoding,
            bookmarks: options.bookmarks,
            initial_events_end: options.send_initial_events,
            timeout,
            api_version: API_VERSION,
            kind: kind.kind,
            compute: parses.then_some(compute),
        },
        slot,
        move |end| open.ended(end),
    );
    // Ended at its timeout (plus a grace) even when its client stops reading.
    let body: WatchStream = Box::pin(crate::deadline::bound(body, timeout));
    Ok(streaming(body, representation))
}

/// Where a watch with `options` starts.
fn start<T: Object>(hub: &Reader<T>, options: &WatchParams) -> Result<Start, Expired> {
    if options.send_initial_events {
        return Ok(Start::WithObjects);
    }
    match options.resource_version.as_deref() {
        None | Some("0") => Ok(Start::WithObjects),
        Some(text) => hub.clock().parse(text).map(Start::After),
    }
}

/// The longest watch: kube-apiserver's longest `timeoutSeconds`, as many seconds as Go's
/// `time.Duration` (int64 nanoseconds) holds, about 292 years. Past it kube-apiserver's
/// `time.Duration(timeoutSeconds) * time.Second` wraps around (`9223372036854775807` becomes
/// -1 s there, and the watch ends at once); here it is this.
pub const MAX_WATCH_TIMEOUT: Duration =
    Duration::from_secs(i64::MAX.unsigned_abs() / 1_000_000_000);

/// How long a watch lasts, as kube-apiserver reads `timeoutSeconds` (`handlers/get.go`): none
/// or `0`, between [`MIN_WATCH_TIMEOUT`] and twice it; negative, not at all (its timer has
/// fired already: the watch ends at once, with no events); else that many seconds, at most
/// [`MAX_WATCH_TIMEOUT`]. No value panics: the deadline is `now` plus at most that.
fn timeout(options: &WatchParams) -> Duration {
    match options.timeout_seconds {
        Some(seconds) if seconds < 0 => Duration::ZERO,
        Some(seconds) if seconds > 0 => {
            Duration::from_secs(seconds.unsigned_abs()).min(MAX_WATCH_TIMEOUT)
        }
        _ => {
            let spread = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            MIN_WATCH_TIMEOUT + MIN_WATCH_TIMEOUT.mul_f64(f64::from(spread) / 1e9)
        }
    }
}

fn expired_stream(expired: &Expired, representation: Representation) -> Response<Body> {
    error_stream(&StatusError::expired(expired.to_string()), representation)
}

/// A watch whose only event is an ERROR carrying `error`.
fn error_stream(error: &StatusError, representation: Representation) -> Response<Body> {
    let mut line = b"{\"type\":\"ERROR\",\"object\":".to_vec();
    line.extend_from_slice(&error.to_json());
    line.extend_from_slice(b"}\n");
    let chunk: WatchStream = Box::pin(futures::stream::once(async move {
        Ok(hyper::body::Frame::data(bytes::Bytes::from(line)))
    }));
    streaming(chunk, representation)
}

fn streaming(body: WatchStream, representation: Representation) -> Response<Body> {
    let mut response = Response::new(http_body_util::Either::Right(StreamBody::new(body)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(representation.content_type()),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    response
}

#[cfg(test)]
mod tests;
