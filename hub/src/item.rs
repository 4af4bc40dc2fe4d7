//! One object's kept answer ([`Item`]) and one change of it ([`Event`]).

use std::{collections::BTreeMap, collections::HashSet, sync::Arc};

use crate::{Object, ResourceVersion};

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
    /// Which input it was computed from: the uid and resourceVersion of the object it
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
/// bytes again (see [`Object::own_range`]; one copy of each shared part in [`Interned`]).
#[derive(Clone, Debug)]
pub(crate) struct Json {
    before: Arc<[u8]>,
    own: Box<[u8]>,
    after: Arc<[u8]>,
}

impl Json {
    fn new(json: &[u8], own: std::ops::Range<usize>, interned: &mut Interned) -> Self {
        Self {
            before: interned.intern(&json[..own.start]),
            own: json[own.clone()].into(),
            after: interned.intern(&json[own.end..]),
        }
    }

    fn parts(&self) -> [&[u8]; 3] {
        [&self.before, &self.own, &self.after]
    }

    fn len(&self) -> usize {
        self.parts().iter().map(|p| p.len()).sum()
    }

    /// Whether these are the bytes `json`.
    pub(crate) fn is(&self, mut json: &[u8]) -> bool {
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
pub(crate) struct Interned {
    parts: HashSet<Arc<[u8]>>,
    after_pruning: usize,
}

impl Interned {
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
    pub(crate) fn new(
        key: Arc<Key>,
        mut object: T,
        version: ResourceVersion,
        source: u64,
        interned: &mut Interned,
    ) -> Self {
        let json = encode(&mut object, version);
        let json = Json::new(&json, object.own_range(&json), interned);
        Self {
            key,
            json,
            version,
            facts: object.facts(),
            source,
        }
    }

    /// The same answer, now computed from the input `source`.
    pub(crate) fn with_source(&self, source: u64) -> Self {
        Self {
            key: self.key.clone(),
            json: self.json.clone(),
            version: self.version,
            facts: self.facts.clone(),
            source,
        }
    }

    pub(crate) fn key_arc(&self) -> &Arc<Key> {
        &self.key
    }

    pub(crate) fn json_parts(&self) -> &Json {
        &self.json
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

    /// Bytes it holds of its own (its JSON's own part and its bookkeeping): what keeping it
    /// costs beyond the parts it shares.
    pub fn kept_bytes(&self) -> usize {
        self.json.own.len() + std::mem::size_of::<Self>()
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
pub(crate) fn encode<T: Object>(object: &mut T, version: ResourceVersion) -> Vec<u8> {
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

impl<T: Object> Event<T> {
    /// What keeping this event can hold of its own: both items (an upper bound; the item
    /// after it is usually the one the hub keeps anyway).
    pub fn kept_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.item.kept_bytes()
            + self.previous.as_ref().map_or(0, |p| p.kept_bytes())
    }
}

#[cfg(test)]
impl Json {
    pub(crate) fn own(&self) -> &[u8] {
        &self.own
    }
    pub(crate) fn shares_before(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.before, &other.before)
    }
    pub(crate) fn shares_after(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.after, &other.after)
    }
}

#[cfg(test)]
impl Interned {
    pub(crate) fn len(&self) -> usize {
        self.parts.len()
    }
}
