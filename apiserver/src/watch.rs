//! Watch, as kube-apiserver serves it, on the resources whose answers are computed when their
//! inputs change (see [`crate::live`]): version summaries and machines.
//!
//! Each such resource has a [`Hub`]: the current answer of every object (kept as the JSON
//! bytes a list or a watch sends, made once), the recent changes as events, and the watchers
//! those events fan out to. Producers hand the hub the objects as they are now; the hub
//! compares each with what it holds, and only an object whose answer changed gets a new
//! `resourceVersion` and an event (ADDED, MODIFIED, DELETED): no event when nothing in the
//! answer changed, one event however many watch it.
//!
//! **Resource versions** ([`ResourceVersion`]) are numbers of this process: an epoch drawn at
//! start in the high bits, then a sequence shared by every hub. Replicas compute their answers
//! from the same inputs but not at the same instants (each reads channel images itself), so
//! they do not agree on a number; a watch resumed on another replica (or after a restart) from
//! a resourceVersion of another epoch is answered `410 Gone` (`Expired`, "too old resource
//! version"), as kube-apiserver answers a compacted one, and the client lists again: client-go
//! and Steve do. Within a replica, a watch from a list's resourceVersion misses nothing and
//! repeats nothing while the hub still holds the events after it ([`KEPT_EVENTS`]); older is
//! `410 Gone` too.
//!
//! A watcher that does not read is dropped, not buffered without limit: its queue holds at
//! most [`WATCHER_QUEUE`] messages, and an event that does not fit ends its watch (the client
//! resumes from its last resourceVersion, as after a kube-apiserver "slow watcher" close).

pub mod stream;

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use elemental_changelog_apiservice::types::ObjectMeta;
use serde::Serialize;
use tokio::sync::mpsc;

/// Events kept per hub for watches that resume from an older resourceVersion.
pub const KEPT_EVENTS: usize = 4096;
/// Messages a watcher's queue holds before the watcher is dropped for not reading.
pub const WATCHER_QUEUE: usize = 1024;

/// A served object: an API object with the common metadata.
pub trait Object: Clone + PartialEq + Serialize + Send + Sync + 'static {
    /// Its metadata.
    fn meta(&self) -> &ObjectMeta;
    /// Its metadata, to set the resourceVersion.
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

impl Object for elemental_changelog_apiservice::types::ManagedOSVersionChangelogSummary {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for elemental_changelog_apiservice::fleet::MachineInventoryChangelogSummary {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The resourceVersions of this process: `epoch << 40 | sequence`, written in decimal.
#[derive(Debug)]
pub struct Clock {
    epoch: u64,
    last: AtomicU64,
}

/// A resourceVersion of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceVersion(u64);

impl ResourceVersion {
    /// As clients see it.
    pub fn text(self) -> String {
        self.0.to_string()
    }
}

impl std::fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Bits of the sequence: about 10^12 changes per process life.
const SEQUENCE_BITS: u32 = 40;

impl Clock {
    /// A clock with a random epoch (23 bits, never 0), so that two processes almost never
    /// share one and a resourceVersion stays below 2^63 (a Go int64, for clients that parse it).
    pub fn new() -> Arc<Self> {
        let epoch = (u64::from(rand_epoch()) % ((1 << 23) - 1)) + 1;
        Arc::new(Self::with_epoch(epoch))
    }

    /// A clock with `epoch` (tests).
    pub fn with_epoch(epoch: u64) -> Self {
        Self {
            epoch,
            last: AtomicU64::new(epoch << SEQUENCE_BITS),
        }
    }

    fn next(&self) -> ResourceVersion {
        ResourceVersion(self.last.fetch_add(1, Ordering::SeqCst) + 1)
    }

    fn now(&self) -> ResourceVersion {
        ResourceVersion(self.last.load(Ordering::SeqCst))
    }

    /// `text` as a resourceVersion of this process, or why it cannot be served.
    pub fn parse(&self, text: &str) -> Result<ResourceVersion, Expired> {
        let value: u64 = text.parse().map_err(|_| Expired::Invalid)?;
        if value >> SEQUENCE_BITS != self.epoch {
            return Err(Expired::OtherProcess);
        }
        Ok(ResourceVersion(value))
    }
}

fn rand_epoch() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    // Truncation intended: any 32 bits of the hash.
    #[allow(clippy::cast_possible_truncation)]
    let bits = hasher.finish() as u32;
    bits
}

/// Why a watch cannot start from the resourceVersion asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Expired {
    /// Not a number.
    #[error("invalid resource version")]
    Invalid,
    /// A resourceVersion of another replica or of an earlier run of this one.
    #[error("too old resource version: it was given by another replica or before a restart")]
    OtherProcess,
    /// Older than the events this replica keeps.
    #[error("too old resource version: the events after it are no longer kept")]
    Compacted,
    /// Newer than anything this replica has given.
    #[error("too large resource version: this replica has not reached it")]
    TooLarge,
}

/// An object's answer as served: the object (its resourceVersion set) and its JSON.
#[derive(Debug)]
pub struct Item<T> {
    /// The object, as served.
    pub object: T,
    /// Its JSON, as a list or a watch event sends it.
    pub json: Bytes,
    /// When its answer last changed.
    pub version: ResourceVersion,
}

impl<T: Object> Item<T> {
    fn new(mut object: T, version: ResourceVersion) -> Self {
        object.meta_mut().resource_version = Some(version.text());
        let json = serde_json::to_vec(&object).map_or_else(|_| Bytes::new(), Bytes::from);
        Self {
            object,
            json,
            version,
        }
    }

    /// Namespace and name.
    pub fn key(&self) -> (&str, &str) {
        let meta = self.object.meta();
        (&meta.namespace, &meta.name)
    }
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// It appeared.
    Added,
    /// Its answer changed.
    Modified,
    /// It is gone.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change of one object.
#[derive(Debug)]
pub struct Event<T> {
    /// What happened.
    pub kind: EventType,
    /// The object after it (for DELETED, the last answer with the deletion's resourceVersion).
    pub item: Arc<Item<T>>,
    /// The object before it (`None` for ADDED): selectors compare both.
    pub previous: Option<Arc<Item<T>>>,
}

/// What a watcher receives, in order.
#[derive(Debug)]
pub enum Message<T> {
    /// An event.
    Event(Arc<Event<T>>),
    /// Every event up to this resourceVersion was sent before (answers [`Watcher::progress`]).
    Progress(ResourceVersion),
}

/// A watch being served: what it missed or the initial objects, then its queue.
pub struct Watcher<T> {
    /// Sent first: the events after the resourceVersion asked (a resume), or the objects
    /// present at the start as ADDED events (a watch with initial events).
    pub backlog: Vec<Arc<Event<T>>>,
    /// The resourceVersion the backlog brings the watcher to.
    pub start: ResourceVersion,
    /// Later messages.
    pub queue: mpsc::Receiver<Message<T>>,
    id: u64,
    hub: Arc<Hub<T>>,
}

impl<T: Object> Watcher<T> {
    /// Asks for a [`Message::Progress`] after the messages queued so far (a bookmark's
    /// resourceVersion must not run ahead of the events sent). False when the watcher was
    /// dropped.
    pub fn progress(&self) -> bool {
        self.hub.progress(self.id)
    }
}

impl<T> Drop for Watcher<T> {
    fn drop(&mut self) {
        let mut state = self
            .hub
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.watchers.retain(|w| w.id != self.id);
    }
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// From now, with every object present sent first as ADDED.
    WithObjects,
    /// After this resourceVersion.
    After(ResourceVersion),
}

struct Subscriber<T> {
    id: u64,
    namespace: Option<String>,
    queue: mpsc::Sender<Message<T>>,
}

struct State<T> {
    objects: BTreeMap<(String, String), Arc<Item<T>>>,
    recent: VecDeque<Arc<Event<T>>>,
    /// The highest resourceVersion dropped from `recent` (watches from before it are 410).
    compacted: ResourceVersion,
    watchers: Vec<Subscriber<T>>,
    next_watcher: u64,
}

/// The objects of one resource, their recent events and their watchers.
pub struct Hub<T> {
    clock: Arc<Clock>,
    state: Mutex<State<T>>,
    kept_events: usize,
}

impl<T: Object> Hub<T> {
    /// An empty hub counting on `clock`.
    pub fn new(clock: Arc<Clock>) -> Arc<Self> {
        Self::with_kept_events(clock, KEPT_EVENTS)
    }

    /// An empty hub keeping `kept_events` events (tests).
    pub fn with_kept_events(clock: Arc<Clock>, kept_events: usize) -> Arc<Self> {
        let compacted = clock.now();
        Arc::new(Self {
            clock,
            state: Mutex::new(State {
                objects: BTreeMap::new(),
                recent: VecDeque::new(),
                compacted,
                watchers: Vec::new(),
                next_watcher: 0,
            }),
            kept_events: kept_events.max(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The clock of this hub's resourceVersions.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Makes the objects of `namespace` (`None`: of every namespace) be `objects`, each
    /// without a resourceVersion: objects whose answer changed get a new resourceVersion and
    /// an event, those no longer there a DELETED event. Returns the number of events.
    pub fn replace(&self, namespace: Option<&str>, objects: Vec<T>) -> usize {
        let mut wanted: BTreeMap<(String, String), T> = objects
            .into_iter()
            .map(|o| ((o.meta().namespace.clone(), o.meta().name.clone()), o))
            .collect();
        let mut state = self.lock();
        let gone: Vec<(String, String)> = state
            .objects
            .keys()
            .filter(|(ns, _)| namespace.is_none_or(|n| n == ns))
            .filter(|key| !wanted.contains_key(*key))
            .cloned()
            .collect();
        let mut events = 0;
        for key in gone {
            events += usize::from(self.set_locked(&mut state, key, None));
        }
        for (key, object) in std::mem::take(&mut wanted) {
            events += usize::from(self.set_locked(&mut state, key, Some(object)));
        }
        events
    }

    /// Makes the object `namespace/name` be `object` (`None`: gone). True when it changed.
    pub fn set(&self, namespace: &str, name: &str, object: Option<T>) -> bool {
        let mut state = self.lock();
        self.set_locked(&mut state, (namespace.to_owned(), name.to_owned()), object)
    }

    fn set_locked(&self, state: &mut State<T>, key: (String, String), object: Option<T>) -> bool {
        let previous = state.objects.get(&key).cloned();
        let event = match (object, previous) {
            (None, None) => return false,
            (None, Some(previous)) => {
                state.objects.remove(&key);
                let version = self.clock.next();
                let mut last = previous.object.clone();
                last.meta_mut().resource_version = None;
                Event {
                    kind: EventType::Deleted,
                    item: Arc::new(Item::new(last, version)),
                    previous: Some(previous),
                }
            }
            (Some(object), previous) => {
                if let Some(previous) = &previous
                    && same_answer(&previous.object, &object)
                {
                    return false;
                }
                let item = Arc::new(Item::new(object, self.clock.next()));
                state.objects.insert(key, item.clone());
                Event {
                    kind: if previous.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    item,
                    previous,
                }
            }
        };
        let event = Arc::new(event);
        state.recent.push_back(event.clone());
        while state.recent.len() > self.kept_events {
            if let Some(dropped) = state.recent.pop_front() {
                state.compacted = dropped.item.version;
            }
        }
        let namespace = event.item.object.meta().namespace.clone();
        // A watcher whose queue is full (it does not read) or closed is dropped.
        state.watchers.retain(|w| {
            if w.namespace.as_ref().is_some_and(|n| *n != namespace) {
                return true;
            }
            w.queue.try_send(Message::Event(event.clone())).is_ok()
        });
        true
    }

    /// The objects of `namespace` (`None`: all), by namespace and name, with the
    /// resourceVersion of the hub when they were taken.
    pub fn list(&self, namespace: Option<&str>) -> (ResourceVersion, Vec<Arc<Item<T>>>) {
        let state = self.lock();
        let items = match namespace {
            None => state.objects.values().cloned().collect(),
            Some(ns) => state
                .objects
                .range((ns.to_owned(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, item)| item.clone())
                .collect(),
        };
        (self.clock.now(), items)
    }

    /// The object `namespace/name`, if present.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Item<T>>> {
        self.lock()
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Starts a watch of `namespace` (`None`: all) from `start`.
    pub fn watch(
        self: &Arc<Self>,
        namespace: Option<&str>,
        start: Start,
    ) -> Result<Watcher<T>, Expired> {
        let mut state = self.lock();
        let now = self.clock.now();
        let in_scope = |item: &Item<T>| namespace.is_none_or(|n| n == item.object.meta().namespace);
        let backlog: Vec<Arc<Event<T>>> = match start {
            Start::WithObjects => state
                .objects
                .values()
                .filter(|item| in_scope(item))
                .map(|item| {
                    Arc::new(Event {
                        kind: EventType::Added,
                        item: item.clone(),
                        previous: None,
                    })
                })
                .collect(),
            Start::After(from) => {
                if from > now {
                    return Err(Expired::TooLarge);
                }
                if from < state.compacted {
                    return Err(Expired::Compacted);
                }
                state
                    .recent
                    .iter()
                    .filter(|e| e.item.version > from && in_scope(&e.item))
                    .cloned()
                    .collect()
            }
        };
        let (tx, queue) = mpsc::channel(WATCHER_QUEUE);
        let id = state.next_watcher;
        state.next_watcher += 1;
        state.watchers.push(Subscriber {
            id,
            namespace: namespace.map(str::to_owned),
            queue: tx,
        });
        Ok(Watcher {
            backlog,
            start: now,
            queue,
            id,
            hub: self.clone(),
        })
    }

    fn progress(&self, id: u64) -> bool {
        let mut state = self.lock();
        let now = self.clock.now();
        let mut alive = true;
        state.watchers.retain(|w| {
            if w.id != id {
                return true;
            }
            alive = w.queue.try_send(Message::Progress(now)).is_ok();
            alive
        });
        alive
    }

    /// Watches being served.
    pub fn watchers(&self) -> usize {
        self.lock().watchers.len()
    }
}

/// Whether two answers say the same (the resourceVersion aside).
fn same_answer<T: Object>(served: &T, new: &T) -> bool {
    let mut served = served.clone();
    served.meta_mut().resource_version = new.meta().resource_version.clone();
    served == *new
}

#[cfg(test)]
mod tests;
