//! The kept answers of the served resources, as kube-apiserver's watch cache keeps objects:
//! each object's answer as the JSON bytes a list or a watch sends (made once), its
//! `resourceVersion`, the recent changes as events in a ring bounded in bytes, and watchers
//! that read the ring from their own position.
//!
//! A hub has **one writer** ([`Writer`], not `Clone`: the projector that computes its
//! answers) and any number of **readers** ([`Reader`]: the routes). The writer hands the hub
//! objects as they are now; the hub compares each with what it holds, and only an object whose
//! answer changed gets a new `resourceVersion` and an event (ADDED, MODIFIED, DELETED).
//!
//! **Bounds.** The ring holds at most [`Bounds::ring_bytes`] of events (what they hold of
//! their own, [`Event::kept_bytes`]); a watcher holds no queue at all, only its position in
//! the ring (a `resourceVersion`) and, while it sends its initial objects, a snapshot of the
//! objects ([`Objects`]: one pointer per chunk of 256 objects, shared copy-on-write). A
//! watcher that falls behind the ring's oldest event has missed events: it ends
//! ([`Batch::Behind`]) and its client watches again from its last resourceVersion (a `410`
//! then, so it lists again), as after kube-apiserver closes a slow watcher.
//!
//! **resourceVersions** ([`ResourceVersion`], [`Clock`]) are numbers of this process below
//! 2^53: an epoch drawn at start in the high bits, then a sequence shared by every hub. A
//! watch from another epoch (another replica, an earlier run) or from before the ring's
//! oldest event is `410 Expired` ([`Expired`]); a watch from a number of this epoch not
//! reached yet waits for it, as kube-apiserver's watch cache does.

mod clock;
mod item;
mod object;
mod objects;
mod watcher;

use std::{
    collections::{HashSet, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

pub use clock::{Clock, Expired, MAX_SAFE_INTEGER, ResourceVersion};
pub use item::{Event, EventType, Item, Key, source_of};
pub use object::{MachineFacts, Object};
pub use objects::Objects;
pub use watcher::{Batch, Start, Watcher};

use item::{Interned, encode};

/// The bounds of a hub.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Bytes of events the ring keeps for watchers that read behind the writer or resume
    /// from an older resourceVersion ([`Event::kept_bytes`]); the newest event is always kept.
    pub ring_bytes: usize,
}

/// Bytes of events kept per hub by default: at about 1.5 KiB an event (a machine's own bytes,
/// before and after), some 20,000 events: a channel re-sync changing every machine of a large
/// fleet fits while watchers read it.
pub const DEFAULT_RING_BYTES: usize = 32 << 20;

impl Default for Bounds {
    fn default() -> Self {
        Self {
            ring_bytes: DEFAULT_RING_BYTES,
        }
    }
}

/// A new hub on `clock`: its one writer and a reader.
pub fn new<T: Object>(clock: Arc<Clock>, bounds: Bounds) -> (Writer<T>, Reader<T>) {
    let now = clock.now();
    let (wake, _) = tokio::sync::watch::channel(now);
    let inner = Arc::new(Inner {
        clock,
        bounds,
        state: Mutex::new(State {
            objects: Objects::default(),
            ring: VecDeque::new(),
            ring_bytes: 0,
            compacted: now,
            latest: now,
            interned: Interned::default(),
        }),
        wake,
        watchers: AtomicUsize::new(0),
        behind: AtomicU64::new(0),
    });
    (
        Writer {
            inner: inner.clone(),
        },
        Reader { inner },
    )
}

struct State<T: Object> {
    objects: Objects<T>,
    /// The recent events, oldest first.
    ring: VecDeque<Arc<Event<T>>>,
    /// [`Event::kept_bytes`] of the ring's events.
    ring_bytes: usize,
    /// The resourceVersion of the newest event dropped from the ring (a watch from before it
    /// has missed events).
    compacted: ResourceVersion,
    /// The resourceVersion of this hub's last change (lists carry it).
    latest: ResourceVersion,
    interned: Interned,
}

struct Inner<T: Object> {
    clock: Arc<Clock>,
    bounds: Bounds,
    state: Mutex<State<T>>,
    /// The resourceVersion of the last change, for watchers waiting for one.
    wake: tokio::sync::watch::Sender<ResourceVersion>,
    /// Watchers being served.
    watchers: AtomicUsize,
    /// Watchers ended because they fell behind the ring.
    behind: AtomicU64,
}

impl<T: Object> Inner<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The one writer of a hub. Not `Clone`: whoever holds it is the only producer of the hub's
/// answers.
pub struct Writer<T: Object> {
    inner: Arc<Inner<T>>,
}

/// A reader of a hub: lists, gets, watches. Any number may exist.
pub struct Reader<T: Object> {
    inner: Arc<Inner<T>>,
}

impl<T: Object> Clone for Reader<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T: Object> Writer<T> {
    /// A reader of this hub.
    pub fn reader(&self) -> Reader<T> {
        Reader {
            inner: self.inner.clone(),
        }
    }

    /// Makes the object `namespace/name` be `object` (`None`: gone). True when its answer
    /// changed. `object`'s metadata names the input it was computed from (its uid and
    /// resourceVersion, kept as [`Item::source`]); the served resourceVersion is the hub's.
    pub fn set(&mut self, namespace: &str, name: &str, object: Option<T>) -> bool {
        let mut state = self.inner.lock();
        self.set_locked(&mut state, (namespace, name), object)
    }

    /// Makes the objects of `namespace` (`None`: of every namespace) be `objects`, one at a
    /// time; returns the number of events. See [`Sweep`].
    pub fn replace(
        &mut self,
        namespace: Option<&str>,
        objects: impl IntoIterator<Item = T>,
    ) -> usize {
        let mut sweep = self.sweep(namespace);
        for object in objects {
            sweep.put(object);
        }
        sweep.finish()
    }

    /// Starts making the objects of `namespace` (`None`: of every namespace) be those
    /// [`Sweep::put`] then: one object at a time, so that a pass over many objects never
    /// holds them all at once, nor the hub's lock while it computes them.
    pub fn sweep(&mut self, namespace: Option<&str>) -> Sweep<'_, T> {
        Sweep {
            writer: self,
            namespace: namespace.map(str::to_owned),
            seen: HashSet::new(),
            events: 0,
        }
    }

    fn set_locked(&self, state: &mut State<T>, key: (&str, &str), object: Option<T>) -> bool {
        let previous = state.objects.get(key).cloned();
        let event = match (object, previous) {
            (None, None) => return false,
            (None, Some(previous)) => self.deleted(state, previous),
            (Some(object), previous) => match self.applied(state, key, object, previous) {
                Some(event) => event,
                None => return false,
            },
        };
        self.publish(state, event);
        true
    }

    fn deleted(&self, state: &mut State<T>, previous: Arc<Item<T>>) -> Event<T> {
        state.objects.remove(previous.key());
        let last = previous.object();
        let item = Item::new(
            previous.key_arc().clone(),
            last,
            self.inner.clock.next(),
            previous.source,
            &mut state.interned,
        );
        Event {
            kind: EventType::Deleted,
            item: Arc::new(item),
            previous: Some(previous),
        }
    }

    /// The event of `object` replacing `previous`, `None` when its answer is the same.
    fn applied(
        &self,
        state: &mut State<T>,
        key: (&str, &str),
        mut object: T,
        previous: Option<Arc<Item<T>>>,
    ) -> Option<Event<T>> {
        let meta = object.meta();
        let source = source_of(meta.uid.as_deref(), meta.resource_version.as_deref());
        if let Some(previous) = &previous
            && previous
                .json_parts()
                .is(&encode(&mut object, previous.version))
        {
            // The same answer: no event; it now comes from this input.
            if previous.source != source {
                state.objects.insert(Arc::new(previous.with_source(source)));
            }
            return None;
        }
        let key = previous.as_ref().map_or_else(
            || Arc::new((key.0.to_owned(), key.1.to_owned())),
            |p| p.key_arc().clone(),
        );
        let item = Arc::new(Item::new(
            key,
            object,
            self.inner.clock.next(),
            source,
            &mut state.interned,
        ));
        state.objects.insert(item.clone());
        Some(Event {
            kind: if previous.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            item,
            previous,
        })
    }

    /// Appends `event` to the ring (dropping the oldest past the bound) and wakes watchers.
    fn publish(&self, state: &mut State<T>, event: Event<T>) {
        let event = Arc::new(event);
        let version = event.item.version;
        state.latest = version;
        state.ring_bytes += event.kept_bytes();
        state.ring.push_back(event);
        while state.ring_bytes > self.inner.bounds.ring_bytes && state.ring.len() > 1 {
            if let Some(dropped) = state.ring.pop_front() {
                state.ring_bytes -= dropped.kept_bytes();
                state.compacted = dropped.item.version;
            }
        }
        self.inner.wake.send_replace(version);
    }
}

/// Objects being put into a hub by [`Writer::sweep`]; [`Sweep::finish`] deletes those of its
/// namespace that were not put.
pub struct Sweep<'w, T: Object> {
    writer: &'w mut Writer<T>,
    namespace: Option<String>,
    seen: HashSet<Key>,
    events: usize,
}

impl<T: Object> Sweep<'_, T> {
    /// Makes one object be `object` (see [`Writer::set`]).
    pub fn put(&mut self, object: T) {
        let key = (object.meta().namespace.clone(), object.meta().name.clone());
        let mut state = self.writer.inner.lock();
        self.events += usize::from(self.writer.set_locked(
            &mut state,
            (&key.0, &key.1),
            Some(object),
        ));
        self.seen.insert(key);
    }

    /// Deletes the objects of the sweep's namespace not put; returns the number of events.
    pub fn finish(self) -> usize {
        let mut state = self.writer.inner.lock();
        let gone: Vec<Key> = state
            .objects
            .iter_from(self.namespace.as_deref(), std::ops::Bound::Unbounded)
            .filter(|item| {
                !self
                    .seen
                    .contains(&(item.namespace().to_owned(), item.name().to_owned()))
            })
            .map(|item| (item.namespace().to_owned(), item.name().to_owned()))
            .collect();
        let mut events = self.events;
        for key in gone {
            events += usize::from(self.writer.set_locked(&mut state, (&key.0, &key.1), None));
        }
        events
    }
}

/// A list taken from a hub: the objects of one namespace (or all) as they were at one
/// resourceVersion, read lazily from a snapshot.
pub struct List<T: Object> {
    /// The resourceVersion of the hub's last change when it was taken (a watch from it
    /// misses nothing).
    pub version: ResourceVersion,
    objects: Objects<T>,
    namespace: Option<String>,
}

impl<T: Object> List<T> {
    /// Its objects, in namespace and name order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Item<T>>> {
        self.objects
            .iter_from(self.namespace.as_deref(), std::ops::Bound::Unbounded)
    }
}

impl<T: Object> Reader<T> {
    /// The clock of this hub's resourceVersions.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The resourceVersion of this hub's last change: a list taken now carries it, and two
    /// lists with the same one hold the same answers.
    pub fn latest(&self) -> ResourceVersion {
        self.inner.lock().latest
    }

    /// The objects of `namespace` (`None`: all) now.
    pub fn list(&self, namespace: Option<&str>) -> List<T> {
        let state = self.inner.lock();
        List {
            version: state.latest,
            objects: state.objects.clone(),
            namespace: namespace.map(str::to_owned),
        }
    }

    /// The object `namespace/name`, if present.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Item<T>>> {
        self.inner.lock().objects.get((namespace, name)).cloned()
    }

    /// Watches being served.
    pub fn watchers(&self) -> usize {
        self.inner.watchers.load(Ordering::Relaxed)
    }

    /// Watchers ended since start because they fell behind the ring (they did not read).
    pub fn behind(&self) -> u64 {
        self.inner.behind.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
