//! The objects of a hub, by namespace and name, in chunks shared copy-on-write: taking a
//! [`Objects`] snapshot costs one pointer per chunk (a few hundred at 50,000 objects), not one
//! per object, so a list or a watch's initial objects are read lazily from a snapshot that
//! later changes do not touch (kube-apiserver's watch cache does the same with its B-tree's
//! lazy clone). A write copies the one chunk it changes, and only while a snapshot holds it.

use std::{ops::Bound, sync::Arc};

use crate::{Item, Key, Object};

/// Objects per chunk before it is split in two.
const CHUNK: usize = 256;

type Entry<T> = Arc<Item<T>>;

/// Objects by namespace and name.
pub struct Objects<T: Object> {
    chunks: Vec<Arc<Vec<Entry<T>>>>,
}

impl<T: Object> Clone for Objects<T> {
    fn clone(&self) -> Self {
        Self {
            chunks: self.chunks.clone(),
        }
    }
}

impl<T: Object> Default for Objects<T> {
    fn default() -> Self {
        Self { chunks: Vec::new() }
    }
}

fn key_of<T: Object>(item: &Item<T>) -> (&str, &str) {
    item.key()
}

impl<T: Object> Objects<T> {
    /// The chunk `key` belongs in: the first whose last key is not below it (or the last).
    fn chunk_of(&self, key: (&str, &str)) -> usize {
        let at = self
            .chunks
            .partition_point(|chunk| chunk.last().is_some_and(|last| key_of(last) < key));
        at.min(self.chunks.len().saturating_sub(1))
    }

    /// The object `key`.
    pub fn get(&self, key: (&str, &str)) -> Option<&Entry<T>> {
        let chunk = self.chunks.get(self.chunk_of(key))?;
        chunk
            .binary_search_by(|item| key_of(item).cmp(&key))
            .ok()
            .map(|at| &chunk[at])
    }

    /// Puts `item` under its key; returns the object it replaces.
    pub fn insert(&mut self, item: Entry<T>) -> Option<Entry<T>> {
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(vec![item]));
            return None;
        }
        let at = self.chunk_of(item.key());
        let chunk = Arc::make_mut(&mut self.chunks[at]);
        let replaced = match chunk.binary_search_by(|i| key_of(i).cmp(&item.key())) {
            Ok(i) => Some(std::mem::replace(&mut chunk[i], item)),
            Err(i) => {
                chunk.insert(i, item);
                None
            }
        };
        if chunk.len() > 2 * CHUNK {
            let tail = chunk.split_off(CHUNK);
            self.chunks.insert(at + 1, Arc::new(tail));
        }
        replaced
    }

    /// Removes the object `key`; returns it.
    pub fn remove(&mut self, key: (&str, &str)) -> Option<Entry<T>> {
        let at = self.chunk_of(key);
        let found = self
            .chunks
            .get(at)?
            .binary_search_by(|i| key_of(i).cmp(&key))
            .ok()?;
        let chunk = Arc::make_mut(&mut self.chunks[at]);
        let removed = chunk.remove(found);
        if chunk.is_empty() {
            self.chunks.remove(at);
        }
        Some(removed)
    }

    /// The objects of `namespace` (`None`: all), from the one after `after` (`None`: from
    /// the first), in order.
    pub fn iter_from<'a>(
        &'a self,
        namespace: Option<&'a str>,
        after: Bound<&'a Key>,
    ) -> impl Iterator<Item = &'a Entry<T>> + 'a {
        let start: Option<(&str, &str)> = match (after, namespace) {
            (Bound::Excluded(key) | Bound::Included(key), _) => Some((&key.0, &key.1)),
            (Bound::Unbounded, Some(ns)) => Some((ns, "")),
            (Bound::Unbounded, None) => None,
        };
        let first = start.map_or(0, |key| self.chunk_of(key));
        self.chunks
            .get(first..)
            .unwrap_or_default()
            .iter()
            .flat_map(|chunk| chunk.iter())
            .skip_while(move |item| match (start, after) {
                (None, _) => false,
                (Some(key), Bound::Excluded(_)) => key_of(item) <= key,
                (Some(key), _) => key_of(item) < key,
            })
            .take_while(move |item| namespace.is_none_or(|ns| item.namespace() == ns))
    }

    /// Every object, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry<T>> {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }

    /// Objects kept.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}
