//! A watch being served: the initial objects from a snapshot, then the ring's events from the
//! watcher's own position. A watcher keeps no queue: what it has not read yet stays in the
//! ring (bounded in bytes for every watcher at once), or ends the watch when the ring has
//! dropped it.

use std::{
    ops::Bound,
    sync::{Arc, atomic::Ordering},
};

use tokio::sync::watch;

use crate::{Event, Expired, Inner, Item, Key, Object, Objects, Reader, ResourceVersion};

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// From now, with every object present sent first as ADDED.
    WithObjects,
    /// After this resourceVersion (one not reached yet: from when it is reached).
    After(ResourceVersion),
}

/// What a watcher reads next.
#[derive(Debug)]
pub enum Batch<T: Object> {
    /// Initial objects (sent as ADDED).
    Initial(Vec<Arc<Item<T>>>),
    /// Every initial object was read: they are the objects at this resourceVersion.
    InitialEnd(ResourceVersion),
    /// Events, in order.
    Events(Vec<Arc<Event<T>>>),
    /// The ring no longer holds the events after this watcher's position: it has missed
    /// some, and ends.
    Behind,
}

/// A watch of a hub's objects (of one namespace, or all).
pub struct Watcher<T: Object> {
    inner: Arc<Inner<T>>,
    namespace: Option<String>,
    initial: Option<Initial<T>>,
    /// Every event up to it was read (or is not this watcher's).
    position: ResourceVersion,
    wake: watch::Receiver<ResourceVersion>,
}

struct Initial<T: Object> {
    objects: Objects<T>,
    /// The last object read.
    after: Option<Key>,
}

impl<T: Object> Reader<T> {
    /// Starts a watch of `namespace` (`None`: all) from `start`.
    pub fn watch(&self, namespace: Option<&str>, start: Start) -> Result<Watcher<T>, Expired> {
        let state = self.inner.lock();
        let (initial, position) = match start {
            Start::WithObjects => (
                Some(Initial {
                    objects: state.objects.clone(),
                    after: None,
                }),
                state.latest,
            ),
            Start::After(from) if from < state.compacted => return Err(Expired::Compacted),
            Start::After(from) => (None, from),
        };
        drop(state);
        self.inner.watchers.fetch_add(1, Ordering::Relaxed);
        Ok(Watcher {
            inner: self.inner.clone(),
            namespace: namespace.map(str::to_owned),
            initial,
            position,
            wake: self.inner.wake.subscribe(),
        })
    }
}

impl<T: Object> Drop for Watcher<T> {
    fn drop(&mut self) {
        self.inner.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: Object> Watcher<T> {
    /// Every event up to this resourceVersion was read: a bookmark may carry it.
    pub fn position(&self) -> ResourceVersion {
        self.position
    }

    /// Whether the initial objects are still being read.
    pub fn in_initial(&self) -> bool {
        self.initial.is_some()
    }

    /// The next objects or events, about `max_bytes` of JSON (at least one), waiting for
    /// an event when there is none. Cancel-safe: nothing is lost when the future is dropped.
    pub async fn next(&mut self, max_bytes: usize) -> Batch<T> {
        if let Some(batch) = self.next_initial(max_bytes) {
            return batch;
        }
        loop {
            self.wake.borrow_and_update();
            if let Some(batch) = self.next_events(max_bytes) {
                return batch;
            }
            if self.wake.changed().await.is_err() {
                // The hub is gone (never while a reader holds it): nothing more comes.
                return std::future::pending().await;
            }
        }
    }

    pub(crate) fn next_initial(&mut self, max_bytes: usize) -> Option<Batch<T>> {
        let initial = self.initial.as_mut()?;
        let after = initial
            .after
            .as_ref()
            .map_or(Bound::Unbounded, Bound::Excluded);
        let mut bytes = 0;
        let items: Vec<Arc<Item<T>>> = initial
            .objects
            .iter_from(self.namespace.as_deref(), after)
            .take_while(|item| {
                let more = bytes < max_bytes;
                bytes += item.json_len();
                more
            })
            .cloned()
            .collect();
        match items.last() {
            Some(last) => {
                initial.after = Some((last.namespace().to_owned(), last.name().to_owned()));
                Some(Batch::Initial(items))
            }
            None => {
                self.initial = None;
                Some(Batch::InitialEnd(self.position))
            }
        }
    }

    pub(crate) fn next_events(&mut self, max_bytes: usize) -> Option<Batch<T>> {
        let state = self.inner.lock();
        if self.position < state.compacted {
            self.inner.behind.fetch_add(1, Ordering::Relaxed);
            return Some(Batch::Behind);
        }
        let from = state
            .ring
            .partition_point(|e| e.item.version <= self.position);
        let (mut events, mut bytes) = (Vec::new(), 0);
        for event in state.ring.range(from..) {
            if bytes >= max_bytes {
                break;
            }
            self.position = event.item.version;
            if self
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == event.item.namespace())
            {
                bytes += event.item.json_len();
                events.push(event.clone());
            }
        }
        if events.is_empty() {
            // Caught up: every event up to the latest was read (a position not reached yet
            // stays where it is).
            self.position = self.position.max(state.latest);
            return None;
        }
        Some(Batch::Events(events))
    }
}
