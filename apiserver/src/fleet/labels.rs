//! The labels a MachineInventory keeps, compactly: all keys and values in one buffer, in key
//! order, and where each ends in a second one. Two allocations per machine whatever its number
//! of labels, where `ObjectMeta.labels` (a `BTreeMap<String, String>`) takes a ~540-byte node
//! and two `String`s per label; with 50,000 machines of a few labels each (issue 25) that was
//! about a third of what a machine kept.

use std::{cmp::Ordering, collections::BTreeMap, fmt};

use super::caps::{MAX_LABEL_BYTES, Oversize, labels_oversize};

// A kept machine's labels are at most MAX_LABEL_BYTES long: every end fits in a u16.
const _: () = assert!(MAX_LABEL_BYTES <= u16::MAX as usize);

/// A machine's labels as the fleet reflector keeps them, sorted by key, each key once.
/// What the view reads of them: [`Labels::get`] (node selectors) and [`Labels::to_map`] (an
/// answer's `metadata.labels`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// Every key followed by its value, in key order.
    text: Box<str>,
    /// For each label, where its key ends and where its value ends in `text`.
    ends: Box<[(u16, u16)]>,
}

impl Labels {
    /// The labels of `map`, unless they pass a cap
    /// ([`MAX_LABELS`](super::caps::MAX_LABELS), [`MAX_LABEL_BYTES`]): then the cap passed.
    pub fn capped(map: &BTreeMap<String, String>) -> Result<Self, Oversize> {
        if let Some(oversize) = labels_oversize(map) {
            return Err(oversize);
        }
        let bytes = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        let mut text = String::with_capacity(bytes);
        let mut ends = Vec::with_capacity(map.len());
        // Within MAX_LABEL_BYTES, so within u16 (asserted above).
        let end =
            |text: &String| u16::try_from(text.len()).map_err(|_| Oversize::LabelBytes { bytes });
        for (key, value) in map {
            text.push_str(key);
            let key_end = end(&text)?;
            text.push_str(value);
            ends.push((key_end, end(&text)?));
        }
        Ok(Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        })
    }

    /// How many labels.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The labels in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        (0..self.len()).filter_map(|i| self.entry(i))
    }

    /// The value of the label `key` (a binary search).
    pub fn get(&self, key: &str) -> Option<&str> {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let middle = low + (high - low) / 2;
            let (k, v) = self.entry(middle)?;
            match k.cmp(key) {
                Ordering::Less => low = middle + 1,
                Ordering::Greater => high = middle,
                Ordering::Equal => return Some(v),
            }
        }
        None
    }

    /// Label `i` in key order.
    fn entry(&self, i: usize) -> Option<(&str, &str)> {
        let start = match i.checked_sub(1) {
            Some(before) => self.ends.get(before)?.1,
            None => 0,
        };
        let (key_end, value_end) = *self.ends.get(i)?;
        let [start, key_end, value_end] = [start, key_end, value_end].map(usize::from);
        Some((
            self.text.get(start..key_end)?,
            self.text.get(key_end..value_end)?,
        ))
    }

    /// The labels as `ObjectMeta.labels` holds them.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fleet::caps::MAX_LABELS;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn keeps_every_label_in_key_order() {
        let m = map(&[
            ("machineUUID", "6f1c"),
            ("elemental.cattle.io/manufacturer", "Dell-Inc"),
            ("empty", ""),
            ("a", "1"),
            ("location", "rack-01"),
        ]);
        let labels = Labels::capped(&m).unwrap();
        assert_eq!(labels.len(), 5);
        assert_eq!(labels.to_map(), m);
        assert!(labels.iter().map(|(k, _)| k).is_sorted());
        for (k, v) in &m {
            assert_eq!(labels.get(k), Some(v.as_str()), "{k}");
        }
        for absent in ["", "0", "b", "elemental", "machineUUIDs", "z"] {
            assert_eq!(labels.get(absent), None, "{absent}");
        }
        assert_eq!(format!("{labels:?}"), format!("{m:?}"));
    }

    #[test]
    fn none_kept_is_empty() {
        let labels = Labels::capped(&BTreeMap::new()).unwrap();
        assert!(labels.is_empty());
        assert_eq!(labels, Labels::default());
        assert_eq!(labels.get(""), None);
        assert_eq!(labels.iter().count(), 0);
    }

    #[test]
    fn past_a_cap_none_are_kept() {
        let many: BTreeMap<_, _> = (0..=MAX_LABELS)
            .map(|i| (format!("l{i:03}"), String::new()))
            .collect();
        assert_eq!(
            Labels::capped(&many),
            Err(Oversize::LabelCount {
                count: MAX_LABELS + 1
            })
        );
        let long = map(&[("k", &"v".repeat(MAX_LABEL_BYTES))]);
        assert_eq!(
            Labels::capped(&long),
            Err(Oversize::LabelBytes {
                bytes: MAX_LABEL_BYTES + 1
            })
        );
        let exactly = map(&[("k", &"v".repeat(MAX_LABEL_BYTES - 1))]);
        let kept = Labels::capped(&exactly).unwrap();
        assert_eq!(kept.get("k").map(str::len), Some(MAX_LABEL_BYTES - 1));
    }
}
