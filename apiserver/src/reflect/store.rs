//! The store of one watch: its objects by namespace and name, in that order.
//!
//! It replaces kube-runtime's reflector `Store`, which keys every object by an `ObjectRef`
//! (copies of its name, namespace, resourceVersion and uid: four allocations and a 96-byte key
//! per object, in a hash map at most seven eighths full) and returns its objects unordered, so
//! each list sorted them. Here an object's key is its name (one copy) under its namespace
//! (one per namespace), and a list walks the map in order. A list's objects are applied to a
//! new map and replace the old ones only when the list ends, as kube-runtime's `Writer` does:
//! until `InitDone` the objects of the previous list stay visible; then those not listed
//! again are gone.

use std::{
    collections::BTreeMap,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use kube::{Resource, runtime::watcher};

/// Objects by namespace, then name.
type Objects<K> = BTreeMap<String, BTreeMap<Box<str>, Arc<K>>>;

/// The read side of one store.
pub struct Store<K> {
    objects: Arc<RwLock<Objects<K>>>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
        }
    }
}

/// The namespace and name of `object` (empty when missing).
fn key<K: Resource>(object: &K) -> (&str, &str) {
    let meta = object.meta();
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Stores `object`, replacing the object of its namespace and name.
fn insert<K: Resource>(objects: &mut Objects<K>, object: Arc<K>) {
    let (namespace, name) = key(&*object);
    let names = match objects.get_mut(namespace) {
        Some(names) => names,
        None => objects.entry(namespace.to_owned()).or_default(),
    };
    match names.get_mut(name) {
        Some(kept) => *kept = object,
        None => {
            let name = name.into();
            names.insert(name, object);
        }
    }
}

impl<K> Store<K> {
    /// A read lock on the objects. A writer that panicked left them whole (each change is one
    /// map operation), so a poisoned lock is read as it is.
    fn read(&self) -> RwLockReadGuard<'_, Objects<K>> {
        self.objects.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Objects<K>> {
        self.objects.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The object `namespace/name`, if present.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.read().get(namespace)?.get(name).cloned()
    }

    /// Appends the objects of `namespace` (none: of every namespace) to `out`, by namespace
    /// and name.
    pub fn list_into(&self, namespace: Option<&str>, out: &mut Vec<Arc<K>>) {
        let objects = self.read();
        match namespace {
            Some(namespace) => {
                if let Some(names) = objects.get(namespace) {
                    out.extend(names.values().cloned());
                }
            }
            None => {
                out.reserve(objects.values().map(BTreeMap::len).sum());
                out.extend(objects.values().flat_map(BTreeMap::values).cloned());
            }
        }
    }
}

/// The write side of one store: applies the events of its watch.
pub struct Writer<K> {
    store: Store<K>,
    /// The objects of the list in progress, since its `Init`.
    relist: Objects<K>,
}

impl<K: Resource + Clone> Writer<K> {
    /// An empty store and its writer.
    pub fn new() -> (Store<K>, Self) {
        let store = Store {
            objects: Arc::default(),
        };
        let writer = Self {
            store: store.clone(),
            relist: Objects::new(),
        };
        (store, writer)
    }

    /// Applies one event of the watch: an object applied or deleted, or a list (`Init`, its
    /// objects, `InitDone`, which replaces every object with the listed ones).
    pub fn apply(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => {
                let object = Arc::new(object.clone());
                insert(&mut self.store.write(), object);
            }
            watcher::Event::Delete(object) => {
                let (namespace, name) = key(object);
                let mut objects = self.store.write();
                if let Some(names) = objects.get_mut(namespace) {
                    names.remove(name);
                    if names.is_empty() {
                        objects.remove(namespace);
                    }
                }
            }
            watcher::Event::Init => self.relist = Objects::new(),
            watcher::Event::InitApply(object) => {
                insert(&mut self.relist, Arc::new(object.clone()));
            }
            watcher::Event::InitDone => {
                let listed = std::mem::take(&mut self.relist);
                // The old objects are dropped after the lock is released.
                let _old = std::mem::replace(&mut *self.store.write(), listed);
            }
        }
    }
}
