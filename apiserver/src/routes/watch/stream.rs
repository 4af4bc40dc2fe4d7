//! One watch on the wire: newline-delimited `WatchEvent` JSON (`{"type":..,"object":..}`),
//! as kube-apiserver streams it, from a hub [`Watcher`]: the initial objects, then the events; selectors
//! applied with kube-apiserver's transitions (an object that starts to match is ADDED to this
//! watch, one that stops matching DELETED); BOOKMARKs when asked; the initial-events-end
//! bookmark of a `sendInitialEvents` watch; an end after `timeoutSeconds`.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use elemental_changelog_hub::{Batch, Event, EventType, Item, Object, ResourceVersion, Watcher};
use futures::{StreamExt as _, stream::BoxStream};
use hyper::body::Frame;
use tokio::{sync::mpsc, time::Instant};

/// How often a watch that asked for bookmarks gets one (kube-apiserver: about every minute).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(30);
/// Bytes of objects read from the hub at once, written as one chunk (at least one object).
/// A watch whose client does not read holds three of them: [`BODY_CHUNKS`] queued, one
/// waiting to be queued, and one in hyper's hands waiting for the client's window. 100 such
/// watches of 10,000 machines from `resourceVersion=0` held 14.6 MiB with two queued (issue
/// 35: at most 16 MiB, whatever the fleet's size; 64 KiB chunks whose buffers grew by doubling
/// held about 280 KiB a watch).
const CHUNK_BYTES: usize = 32 << 10;
/// Chunks queued between a watch's task and its connection: one, while the task writes the
/// next.
const BODY_CHUNKS: usize = 1;

/// Whether a watch sees an object (its selectors).
pub type Visible<T> = Box<dyn Fn(&Item<T>) -> bool + Send + Sync>;

/// Writes one object as this watch sends it (`true`: the first event of the watch).
pub type Render<T> = Box<dyn Fn(&Item<T>, bool) -> Vec<u8> + Send + Sync>;

/// How a watch's objects are written.
pub enum Encoding<T: Object> {
    /// The objects as JSON (their kept bytes, made once for every watch).
    Json,
    /// Each object written for this watch: a one-row `Table` (column definitions in the first
    /// event only, as kube-apiserver sends them), or an object with what the watch asked
    /// added (a machine's exposure to a CVE).
    Render(Render<T>),
}

/// What a watch sends.
pub struct Options<T: Object> {
    /// Which objects this watch sees (selectors); others are not sent.
    pub visible: Visible<T>,
    /// How objects are written.
    pub encoding: Encoding<T>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: the initial-events-end bookmark after the backlog.
    pub initial_events_end: bool,
    /// When the watch ends.
    pub timeout: Duration,
    /// `apiVersion` and `kind` of the bookmark objects.
    pub api_version: &'static str,
    /// See `api_version`.
    pub kind: &'static str,
    /// When the watch parses what it sends (a Table, an exposure, a label selector): the
    /// compute slots (`--max-compute-concurrency`) its batches are written under, on the
    /// blocking pool, as other heavy work. `None`: the kept bytes are copied on the async
    /// threads.
    pub compute: Option<Arc<tokio::sync::Semaphore>>,
}

/// The body of a watch response: a stream that ends with the watch.
pub type WatchStream = BoxStream<'static, Result<Frame<Bytes>, Infallible>>;

/// Streams `watcher` with `options`; `keep` (e.g. a slot of the watch limit) lives as long
/// as the stream: until the server lets go of the response, whose queued chunks it counts
/// for (a client that does not read holds them past the watch's end, up to its deadline:
/// `crate::deadline`); `ended` is told why the watch ended.
pub fn stream<T: Object, K: Send + 'static>(
    watcher: Watcher<T>,
    options: Options<T>,
    keep: K,
    ended: impl FnOnce(End) + Send + 'static,
) -> WatchStream {
    let (tx, rx) = mpsc::channel::<Bytes>(BODY_CHUNKS);
    tokio::spawn(async move { ended(run(watcher, options, tx).await) });
    futures::stream::unfold((rx, keep), |(mut rx, keep)| async move {
        let chunk = rx.recv().await?;
        Some((Ok(Frame::data(chunk)), (rx, keep)))
    })
    .boxed()
}

/// The far future: a deadline past any watch's life.
fn deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// Why a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Its deadline (`timeoutSeconds`, or the server's own).
    Timeout,
    /// Its client went away.
    Client,
    /// It fell behind the hub's kept events (its client did not read).
    Behind,
}

impl End {
    /// The `reason` label of `watches_ended_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Client => "client",
            Self::Behind => "behind",
        }
    }
}

/// What a watch does next.
enum Step<T: Object> {
    Read(Batch<T>),
    Bookmark,
    End(End),
}

/// Sends what `watcher` reads until the deadline, the client leaves, or the watcher falls
/// behind; every wait, the initial objects' included, ends at the deadline.
async fn run<T: Object>(
    mut watcher: Watcher<T>,
    options: Options<T>,
    tx: mpsc::Sender<Bytes>,
) -> End {
    // Over before it starts (a negative `timeoutSeconds`): no event, as kube-apiserver, whose
    // timer has fired already, sends none.
    if options.timeout.is_zero() {
        return End::Timeout;
    }
    let deadline = deadline(options.timeout);
    let (bookmarks, initial_events_end) = (options.bookmarks, options.initial_events_end);
    let mut writer = Some(Writer {
        options,
        first: true,
    });
    let mut tick = tokio::time::interval_at(Instant::now() + BOOKMARK_INTERVAL, BOOKMARK_INTERVAL);
    loop {
        let step = tokio::select! {
            batch = watcher.next(CHUNK_BYTES) => Step::Read(batch),
            _ = tick.tick(), if bookmarks && !watcher.in_initial() => Step::Bookmark,
            () = tx.closed() => Step::End(End::Client),
            () = tokio::time::sleep_until(deadline) => Step::End(End::Timeout),
        };
        let work = match step {
            Step::Read(Batch::Initial(items)) => Work::Objects(items),
            Step::Read(Batch::InitialEnd(version)) if initial_events_end => {
                Work::Bookmark(version, true)
            }
            Step::Read(Batch::InitialEnd(_)) => continue,
            Step::Read(Batch::Events(events)) => Work::Events(events),
            Step::Bookmark => Work::Bookmark(watcher.position(), false),
            // Fell behind the hub's ring (it did not read): it ends, its client watches again.
            Step::Read(Batch::Behind) => return End::Behind,
            Step::End(end) => return end,
        };
        let chunk = tokio::select! {
            chunk = write(&mut writer, work) => chunk,
            () = tokio::time::sleep_until(deadline) => return End::Timeout,
        };
        let Some(chunk) = chunk else {
            // The writer was lost with a failed blocking task: nothing more can be written.
            return End::Client;
        };
        if chunk.is_empty() {
            continue;
        }
        // Held until the client reads it: no slack from the buffer's growth.
        let mut chunk = chunk;
        chunk.shrink_to_fit();
        tokio::select! {
            sent = tx.send(Bytes::from(chunk)) => if sent.is_err() { return End::Client },
            () = tokio::time::sleep_until(deadline) => return End::Timeout,
        }
    }
}

/// What a step writes.
enum Work<T: Object> {
    Objects(Vec<Arc<Item<T>>>),
    Events(Vec<Arc<Event<T>>>),
    Bookmark(ResourceVersion, bool),
}

/// Writes `work` with `writer`: on the blocking pool under a compute slot when the watch
/// parses what it sends (see [`Options::compute`]), else here. `None` when the writer is lost
/// (its blocking task failed).
async fn write<T: Object>(writer: &mut Option<Writer<T>>, work: Work<T>) -> Option<Vec<u8>> {
    let mut w = writer.take()?;
    let compute = match &work {
        Work::Bookmark(..) => None,
        Work::Objects(_) | Work::Events(_) => w.options.compute.clone(),
    };
    let (w, chunk) = match compute {
        None => {
            let chunk = w.write(&work);
            (w, chunk)
        }
        Some(compute) => {
            let permit = compute.acquire_owned().await.ok()?;
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let chunk = w.write(&work);
                (w, chunk)
            })
            .await
            .ok()?
        }
    };
    *writer = Some(w);
    Some(chunk)
}

struct Writer<T: Object> {
    options: Options<T>,
    first: bool,
}

impl<T: Object> Writer<T> {
    fn write(&mut self, work: &Work<T>) -> Vec<u8> {
        match work {
            Work::Objects(items) => self.objects(items),
            Work::Events(events) => self.events(events),
            Work::Bookmark(version, end) => self.bookmark(*version, *end),
        }
    }

    /// The initial objects as ADDED events, as this watch sees them.
    fn objects(&mut self, items: &[Arc<Item<T>>]) -> Vec<u8> {
        let mut out = Vec::new();
        for item in items {
            if (self.options.visible)(item) {
                self.line(&mut out, EventType::Added, item);
            }
        }
        out
    }

    /// `events` as this watch sees them.
    fn events(&mut self, events: &[Arc<Event<T>>]) -> Vec<u8> {
        let mut out = Vec::new();
        for event in events {
            if let Some((kind, item)) = seen(event, &*self.options.visible) {
                self.line(&mut out, kind, item);
            }
        }
        out
    }

    fn line(&mut self, out: &mut Vec<u8>, kind: EventType, item: &Item<T>) {
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(kind.as_str().as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        match &self.options.encoding {
            Encoding::Json => {
                let _ = item.write_json(out);
            }
            Encoding::Render(render) => out.extend_from_slice(&render(item, self.first)),
        }
        out.extend_from_slice(b"}\n");
        self.first = false;
    }

    /// A BOOKMARK at `version` (with the initial-events-end annotation when `end`).
    fn bookmark(&self, version: ResourceVersion, end: bool) -> Vec<u8> {
        let mut metadata = serde_json::json!({"resourceVersion": version.text()});
        if end {
            metadata["annotations"] = serde_json::json!({"k8s.io/initial-events-end": "true"});
        }
        let object = serde_json::json!({
            "apiVersion": self.options.api_version,
            "kind": self.options.kind,
            "metadata": metadata,
        });
        let mut out = b"{\"type\":\"BOOKMARK\",\"object\":".to_vec();
        out.extend_from_slice(object.to_string().as_bytes());
        out.extend_from_slice(b"}\n");
        out
    }
}

/// What a watch whose selectors are `visible` sees of `event`: kube-apiserver's transitions
/// (an object that starts to match is ADDED, one that stops matching DELETED); `None`: nothing.
pub fn seen<'e, T: Object>(
    event: &'e Event<T>,
    visible: &dyn Fn(&Item<T>) -> bool,
) -> Option<(EventType, &'e Arc<Item<T>>)> {
    let now = visible(&event.item);
    let before = event.previous.as_ref().is_some_and(|p| visible(p));
    match (event.kind, before, now) {
        (EventType::Added, _, true) => Some((EventType::Added, &event.item)),
        (EventType::Modified, true, true) => Some((EventType::Modified, &event.item)),
        (EventType::Modified, false, true) => Some((EventType::Added, &event.item)),
        (EventType::Modified, true, false) => Some((EventType::Deleted, &event.item)),
        (EventType::Deleted, true, _) => Some((EventType::Deleted, &event.item)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use elemental_changelog_apiservice::types::ManagedOSVersionChangelogSummary as Summary;
    use elemental_changelog_hub::{Batch, Bounds, Clock, EventType, Item, Start};

    use super::seen;

    fn summary(label: &str) -> Summary {
        let mut s = Summary::new();
        s.metadata.namespace = "a".to_owned();
        s.metadata.name = "x".to_owned();
        s.metadata.labels = BTreeMap::from([("tier".to_owned(), label.to_owned())]);
        s
    }

    #[tokio::test]
    async fn selectors_turn_changes_into_kube_apiserver_transitions() {
        let (mut hub, reader) =
            elemental_changelog_hub::new(Arc::new(Clock::with_epoch(7)), Bounds::default());
        let mut watcher = reader
            .watch(None, Start::After(reader.latest()))
            .unwrap_or_else(|e| panic!("{e}"));
        for label in ["gold", "lead", "gold", "gold2"] {
            hub.set("a", "x", Some(summary(label)));
        }
        hub.set("a", "x", None);
        let Batch::Events(events) = watcher.next(1 << 20).await else {
            panic!("events");
        };
        let gold = |s: &Item<Summary>| s.labels().get("tier").is_some_and(|t| t == "gold");
        let out: Vec<_> = events
            .iter()
            .map(|e| seen(e, &gold).map(|(kind, _)| kind))
            .collect();
        assert_eq!(
            out,
            vec![
                Some(EventType::Added),
                Some(EventType::Deleted),
                Some(EventType::Added),
                Some(EventType::Deleted),
                None,
            ]
        );
    }
}
