//! One watch on the wire: newline-delimited `WatchEvent` JSON (`{"type":..,"object":..}`),
//! as kube-apiserver streams it, from a [`Watcher`]: the backlog, then the queue; selectors
//! applied with kube-apiserver's transitions (an object that starts to match is ADDED to this
//! watch, one that stops matching DELETED); BOOKMARKs when asked; the initial-events-end
//! bookmark of a `sendInitialEvents` watch; an end after `timeoutSeconds`.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::{StreamExt as _, stream::BoxStream};
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::{Event, EventType, Item, Message, Object, ResourceVersion, Watcher};

/// How often a watch that asked for bookmarks gets one (kube-apiserver: about every minute).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(30);
/// The deadline of a watch whose timeout the clock cannot hold (30 years, as tokio's own
/// far future).
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);
/// Chunks the stream holds before the watcher's own queue takes the wait.
const BODY_CHUNKS: usize = 16;

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
}

/// The body of a watch response: a stream that ends with the watch.
pub type WatchStream = BoxStream<'static, Result<Frame<Bytes>, Infallible>>;

/// Streams `watcher` with `options`; `keep` (e.g. a slot of the watch limit) lives as long
/// as the stream.
pub fn stream<T: Object, K: Send + 'static>(
    watcher: Watcher<T>,
    options: Options<T>,
    keep: K,
) -> WatchStream {
    let (tx, rx) = mpsc::channel::<Bytes>(BODY_CHUNKS);
    tokio::spawn(async move {
        let _keep = keep;
        run(watcher, options, tx).await;
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok(Frame::data(chunk)), rx))
    })
    .boxed()
}

async fn run<T: Object>(mut watcher: Watcher<T>, options: Options<T>, tx: mpsc::Sender<Bytes>) {
    // Over before it starts (a negative `timeoutSeconds`): no event, as kube-apiserver, whose
    // timer has fired already, sends none.
    if options.timeout.is_zero() {
        return;
    }
    // Checked: `Instant + Duration` panics past what the clock holds (the routes cap the
    // timeout; this holds whatever a caller passes).
    let now = tokio::time::Instant::now();
    let deadline = now
        .checked_add(options.timeout)
        .unwrap_or_else(|| now + FAR_FUTURE);
    let mut writer = Writer {
        options,
        tx,
        first: true,
    };
    for event in std::mem::take(&mut watcher.backlog) {
        if !writer.event(&event).await {
            return;
        }
    }
    if writer.options.initial_events_end && !writer.bookmark(watcher.start, true).await {
        return;
    }
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + BOOKMARK_INTERVAL,
        BOOKMARK_INTERVAL,
    );
    loop {
        tokio::select! {
            message = watcher.queue.recv() => {
                let sent = match message {
                    // Dropped by the hub: it did not read fast enough.
                    None => return,
                    Some(Message::Event(event)) => writer.event(&event).await,
                    Some(Message::Progress(version)) => writer.bookmark(version, false).await,
                };
                if !sent {
                    return;
                }
            }
            _ = tick.tick(), if writer.options.bookmarks => {
                if !watcher.progress() {
                    return;
                }
            }
            () = writer.tx.closed() => return,
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

struct Writer<T: Object> {
    options: Options<T>,
    tx: mpsc::Sender<Bytes>,
    first: bool,
}

impl<T: Object> Writer<T> {
    /// Sends `event` as this watch sees it; false when the client is gone.
    async fn event(&mut self, event: &Event<T>) -> bool {
        let Some((kind, item)) = seen(event, &*self.options.visible) else {
            return true;
        };
        let object = match &self.options.encoding {
            Encoding::Json => Bytes::from(item.json()),
            Encoding::Render(render) => Bytes::from(render(item, self.first)),
        };
        self.first = false;
        self.send(kind.as_str(), &object).await
    }

    /// Sends a BOOKMARK at `version` (with the initial-events-end annotation when `end`).
    async fn bookmark(&mut self, version: ResourceVersion, end: bool) -> bool {
        let mut metadata = serde_json::json!({"resourceVersion": version.text()});
        if end {
            metadata["annotations"] = serde_json::json!({"k8s.io/initial-events-end": "true"});
        }
        let object = serde_json::json!({
            "apiVersion": self.options.api_version,
            "kind": self.options.kind,
            "metadata": metadata,
        });
        self.send("BOOKMARK", object.to_string().as_bytes()).await
    }

    async fn send(&self, kind: &str, object: &[u8]) -> bool {
        let mut line = Vec::with_capacity(object.len() + 32);
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(kind.as_bytes());
        line.extend_from_slice(b"\",\"object\":");
        line.extend_from_slice(object);
        line.extend_from_slice(b"}\n");
        self.tx.send(Bytes::from(line)).await.is_ok()
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
