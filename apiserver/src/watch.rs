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
    collections::{BTreeMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use elemental_changelog_apiservice::types::ObjectMeta;
use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::mpsc;

/// Events kept per hub for watches that resume from an older resourceVersion.
pub const KEPT_EVENTS: usize = 4096;
/// Messages a watcher's queue holds before the watcher is dropped for not reading.
pub const WATCHER_QUEUE: usize = 1024;

/// A served object: an API object with the common metadata.
pub trait Object: Serialize + DeserializeOwned + Default + Send + Sync + 'static {
    /// What is read of a kept answer without parsing it back (the machines gauge).
    type Facts: Clone + std::fmt::Debug + Send + Sync + 'static;
    /// Its metadata.
    fn meta(&self) -> &ObjectMeta;
    /// Its metadata, to set the resourceVersion.
    fn meta_mut(&mut self) -> &mut ObjectMeta;
    /// See [`Object::Facts`].
    fn facts(&self) -> Self::Facts;
    /// Which bytes of `json` (its JSON) are its own; those before and after are what many
    /// objects share, kept once in the hub ([`Item`]). Default: all of them.
    fn own_range(&self, json: &[u8]) -> std::ops::Range<usize> {
        0..json.len()
    }
}

impl Object for elemental_changelog_apiservice::types::ManagedOSVersionChangelogSummary {
    type Facts = ();
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn facts(&self) {}
}

/// What the machines gauge reads of a kept machine answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MachineFacts {
    /// Its state.
    pub state: elemental_changelog_apiservice::fleet::MachineState,
    /// The highest severity pending (`None`: no pending changelog).
    pub severity: Option<elemental_changelog_apiservice::types::Severity>,
}

impl Object for elemental_changelog_apiservice::fleet::MachineInventoryChangelogSummary {
    type Facts = MachineFacts;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn facts(&self) -> MachineFacts {
        MachineFacts {
            state: self.state,
            severity: self.summary.as_ref().map(|s| s.highest_severity),
        }
    }

    /// Its identity and report (`metadata`, `os`): `apiVersion` and `kind` before them are
    /// the same for every machine, and what follows (the versions resolved, state, summary)
    /// for every machine on the same version with the same target. The boundaries are
    /// checked against `json` (the fields are written in their declared order); a mismatch
    /// keeps all of it as its own.
    fn own_range(&self, json: &[u8]) -> std::ops::Range<usize> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Own<'a> {
            api_version: &'a str,
            kind: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            metadata: Option<&'a ObjectMeta>,
            #[serde(skip_serializing_if = "Option::is_none")]
            os: Option<&'a elemental_changelog_apiservice::fleet::ReportedOs>,
        }
        // The end of `own`'s fields in `json` (before its closing brace), if `json` starts
        // with them and goes on with another field.
        let end = |own: Own<'_>| {
            let own = serde_json::to_vec(&own).ok()?;
            let end = own.len().checked_sub(1)?;
            (json.starts_with(&own[..end]) && json.get(end) == Some(&b',')).then_some(end)
        };
        let kind = Own {
            api_version: &self.api_version,
            kind: &self.kind,
            metadata: None,
            os: None,
        };
        let report = Own {
            metadata: Some(&self.metadata),
            os: Some(&self.os),
            ..kind
        };
        match (end(kind), end(report)) {
            // After the comma that follows `kind`, up to the comma that follows `os`.
            (Some(start), Some(end)) => start + 1..end,
            _ => 0..json.len(),
        }
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

/// Namespace and name of an object.
pub type Key = (String, String);

/// An object's answer as served: its JSON (the resourceVersion set), kept as bytes only (the
/// typed object is parsed back when a request needs more than the bytes: a Table, a label
/// selector, an exposure), with what is read of it often ([`Object::Facts`]).
#[derive(Debug)]
pub struct Item<T: Object> {
    key: Arc<Key>,
    /// Its JSON, as a list or a watch event sends it.
    json: Json,
    /// When its answer last changed.
    pub version: ResourceVersion,
    /// See [`Object::Facts`].
    pub facts: T::Facts,
    /// Which inputs it was computed from: the uid and resourceVersion of the object it
    /// answers for ([`source_of`]).
    pub source: u64,
}

/// A fingerprint of an input object's uid and resourceVersion: an answer whose
/// [`Item::source`] equals its input's was computed from that very object.
pub fn source_of(uid: Option<&str>, resource_version: Option<&str>) -> u64 {
    use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one((uid, resource_version))
}

/// An answer's JSON: bytes it shares with other answers of the hub, its own, and shared
/// bytes again (see [`Object::own_range`]; one copy of each shared part in [`Shared`]).
#[derive(Clone, Debug)]
struct Json {
    before: Arc<[u8]>,
    own: Box<[u8]>,
    after: Arc<[u8]>,
}

impl Json {
    fn new(json: &[u8], own: std::ops::Range<usize>, shared: &mut Shared) -> Self {
        Self {
            before: shared.intern(&json[..own.start]),
            own: json[own.clone()].into(),
            after: shared.intern(&json[own.end..]),
        }
    }

    fn parts(&self) -> [&[u8]; 3] {
        [&self.before, &self.own, &self.after]
    }

    fn len(&self) -> usize {
        self.parts().iter().map(|p| p.len()).sum()
    }

    /// Whether these are the bytes `json`.
    fn is(&self, mut json: &[u8]) -> bool {
        json.len() == self.len()
            && self.parts().iter().all(|part| {
                let (head, rest) = json.split_at(part.len());
                json = rest;
                head == *part
            })
    }
}

/// One copy of each shared part of a hub's answers. Parts no answer holds any more are
/// dropped when the table has grown past twice what was kept after the last pruning.
#[derive(Default)]
struct Shared {
    parts: HashSet<Arc<[u8]>>,
    after_pruning: usize,
}

impl Shared {
    fn intern(&mut self, bytes: &[u8]) -> Arc<[u8]> {
        if let Some(part) = self.parts.get(bytes) {
            return part.clone();
        }
        if self.parts.len() >= 2 * self.after_pruning + 64 {
            self.parts.retain(|p| Arc::strong_count(p) > 1);
            self.after_pruning = self.parts.len();
        }
        let part: Arc<[u8]> = Arc::from(bytes);
        self.parts.insert(part.clone());
        part
    }
}

impl<T: Object> Item<T> {
    /// `object` as served at `version`.
    fn new(
        key: Arc<Key>,
        mut object: T,
        version: ResourceVersion,
        source: u64,
        shared: &mut Shared,
    ) -> Self {
        let json = encode(&mut object, version);
        let json = Json::new(&json, object.own_range(&json), shared);
        Self {
            key,
            json,
            version,
            facts: object.facts(),
            source,
        }
    }

    /// Namespace and name.
    pub fn key(&self) -> (&str, &str) {
        (&self.key.0, &self.key.1)
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.key.0
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.key.1
    }

    /// Its JSON, as a list or a watch event sends it.
    pub fn json(&self) -> Vec<u8> {
        self.json.parts().concat()
    }

    /// Writes its JSON to `out`.
    pub fn write_json(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        self.json
            .parts()
            .iter()
            .try_for_each(|part| out.write_all(part))
    }

    /// Bytes of its JSON.
    pub fn json_len(&self) -> usize {
        self.json.len()
    }

    /// The object, parsed back from its bytes (the server wrote them; a failure would be a
    /// bug, answered as an empty object rather than a panic).
    pub fn object(&self) -> T {
        serde_json::from_slice(&self.json()).unwrap_or_default()
    }

    /// Its labels, parsed from its bytes (nothing else is).
    pub fn labels(&self) -> BTreeMap<String, String> {
        #[derive(serde::Deserialize)]
        struct Labels {
            #[serde(default)]
            labels: BTreeMap<String, String>,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            metadata: Labels,
        }
        serde_json::from_slice::<Meta>(&self.json())
            .map(|m| m.metadata.labels)
            .unwrap_or_default()
    }
}

/// `object`'s JSON with its resourceVersion set to `version`.
fn encode<T: Object>(object: &mut T, version: ResourceVersion) -> Vec<u8> {
    object.meta_mut().resource_version = Some(version.text());
    serde_json::to_vec(object).unwrap_or_default()
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
pub struct Event<T: Object> {
    /// What happened.
    pub kind: EventType,
    /// The object after it (for DELETED, the last answer with the deletion's resourceVersion).
    pub item: Arc<Item<T>>,
    /// The object before it (`None` for ADDED): selectors compare both.
    pub previous: Option<Arc<Item<T>>>,
}

/// What a watcher receives, in order.
#[derive(Debug)]
pub enum Message<T: Object> {
    /// An event.
    Event(Arc<Event<T>>),
    /// Every event up to this resourceVersion was sent before (answers [`Watcher::progress`]).
    Progress(ResourceVersion),
}

/// A watch being served: what it missed or the initial objects, then its queue.
pub struct Watcher<T: Object> {
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

impl<T: Object> Drop for Watcher<T> {
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

struct Subscriber<T: Object> {
    id: u64,
    namespace: Option<String>,
    queue: mpsc::Sender<Message<T>>,
}

struct State<T: Object> {
    objects: BTreeMap<Arc<Key>, Arc<Item<T>>>,
    recent: VecDeque<Arc<Event<T>>>,
    /// The highest resourceVersion dropped from `recent` (watches from before it are 410).
    compacted: ResourceVersion,
    /// The resourceVersion of the last change (of this hub: lists carry it).
    latest: ResourceVersion,
    watchers: Vec<Subscriber<T>>,
    next_watcher: u64,
    shared: Shared,
}

/// The objects of one resource, their recent events and their watchers.
pub struct Hub<T: Object> {
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
                latest: compacted,
                watchers: Vec::new(),
                next_watcher: 0,
                shared: Shared::default(),
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

    /// Makes the objects of `namespace` (`None`: of every namespace) be `objects`: objects
    /// whose answer changed get a new resourceVersion and an event, those no longer there a
    /// DELETED event. Returns the number of events. See [`Sweep`].
    pub fn replace(&self, namespace: Option<&str>, objects: impl IntoIterator<Item = T>) -> usize {
        let mut sweep = self.sweep(namespace);
        for object in objects {
            sweep.put(object);
        }
        sweep.finish()
    }

    /// Starts making the objects of `namespace` (`None`: of every namespace) be those
    /// [`Sweep::put`] then: one object at a time, so that a pass over many objects never
    /// holds them all at once, nor the hub's lock while it computes them.
    pub fn sweep(&self, namespace: Option<&str>) -> Sweep<'_, T> {
        Sweep {
            hub: self,
            namespace: namespace.map(str::to_owned),
            seen: HashSet::new(),
            events: 0,
        }
    }

    /// Makes the object `namespace/name` be `object` (`None`: gone). True when its answer
    /// changed. `object`'s metadata names the input it was computed from (its uid and
    /// resourceVersion, kept as [`Item::source`]); the served resourceVersion is the hub's.
    pub fn set(&self, namespace: &str, name: &str, object: Option<T>) -> bool {
        let mut state = self.lock();
        self.set_locked(&mut state, (namespace.to_owned(), name.to_owned()), object)
    }

    fn set_locked(&self, state: &mut State<T>, key: Key, object: Option<T>) -> bool {
        let found = state
            .objects
            .get_key_value(&key)
            .map(|(k, item)| (k.clone(), item.clone()));
        let event = match (object, found) {
            (None, None) => return false,
            (None, Some((key, previous))) => {
                state.objects.remove(&*key);
                let version = self.clock.next();
                let last = previous.object();
                Event {
                    kind: EventType::Deleted,
                    item: Arc::new(Item::new(
                        key,
                        last,
                        version,
                        previous.source,
                        &mut state.shared,
                    )),
                    previous: Some(previous),
                }
            }
            (Some(mut object), found) => {
                let source = source_of(
                    object.meta().uid.as_deref(),
                    object.meta().resource_version.as_deref(),
                );
                let (key, previous) = match found {
                    Some((key, previous)) => (key, Some(previous)),
                    None => (Arc::new(key), None),
                };
                if let Some(previous) = &previous
                    && previous.json.is(&encode(&mut object, previous.version))
                {
                    // The same answer: no event; it now comes from this input.
                    if previous.source != source {
                        let same = Item {
                            key: key.clone(),
                            json: previous.json.clone(),
                            version: previous.version,
                            facts: previous.facts.clone(),
                            source,
                        };
                        state.objects.insert(key, Arc::new(same));
                    }
                    return false;
                }
                let item = Arc::new(Item::new(
                    key.clone(),
                    object,
                    self.clock.next(),
                    source,
                    &mut state.shared,
                ));
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
        state.latest = event.item.version;
        state.recent.push_back(event.clone());
        while state.recent.len() > self.kept_events {
            if let Some(dropped) = state.recent.pop_front() {
                state.compacted = dropped.item.version;
            }
        }
        let namespace = event.item.namespace();
        // A watcher whose queue is full (it does not read) or closed is dropped.
        state.watchers.retain(|w| {
            if w.namespace.as_ref().is_some_and(|n| n != namespace) {
                return true;
            }
            w.queue.try_send(Message::Event(event.clone())).is_ok()
        });
        true
    }

    /// The resourceVersion of this hub's last change: a list taken now carries it, and two
    /// lists with the same one hold the same answers.
    pub fn latest(&self) -> ResourceVersion {
        self.lock().latest
    }

    /// The objects of `namespace` (`None`: all), by namespace and name, with the
    /// resourceVersion of the hub's last change when they were taken (a watch from it
    /// misses nothing).
    pub fn list(&self, namespace: Option<&str>) -> (ResourceVersion, Vec<Arc<Item<T>>>) {
        let state = self.lock();
        let items = match namespace {
            None => state.objects.values().cloned().collect(),
            Some(ns) => state
                .objects
                .range::<Key, _>((ns.to_owned(), String::new())..)
                .take_while(|(key, _)| key.0 == ns)
                .map(|(_, item)| item.clone())
                .collect(),
        };
        (state.latest, items)
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
        let in_scope = |item: &Item<T>| namespace.is_none_or(|n| n == item.namespace());
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

/// Objects being put into a hub by [`Hub::sweep`]; [`Sweep::finish`] deletes those of its
/// namespace that were not put.
pub struct Sweep<'h, T: Object> {
    hub: &'h Hub<T>,
    namespace: Option<String>,
    seen: HashSet<Arc<Key>>,
    events: usize,
}

impl<T: Object> Sweep<'_, T> {
    /// Makes one object be `object` (see [`Hub::set`]).
    pub fn put(&mut self, object: T) {
        let key = (object.meta().namespace.clone(), object.meta().name.clone());
        let mut state = self.hub.lock();
        self.events += usize::from(self.hub.set_locked(&mut state, key.clone(), Some(object)));
        if let Some((key, _)) = state.objects.get_key_value(&key) {
            self.seen.insert(key.clone());
        }
    }

    /// Deletes the objects of the sweep's namespace not put; returns the number of events.
    pub fn finish(mut self) -> usize {
        let mut state = self.hub.lock();
        let gone: Vec<Key> = state
            .objects
            .keys()
            .filter(|key| self.namespace.as_ref().is_none_or(|n| *n == key.0))
            .filter(|key| !self.seen.contains(*key))
            .map(|key| (**key).clone())
            .collect();
        for key in gone {
            self.events += usize::from(self.hub.set_locked(&mut state, key, None));
        }
        self.events
    }
}

#[cfg(test)]
mod tests;
