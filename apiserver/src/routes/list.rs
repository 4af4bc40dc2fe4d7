//! Lists of kept answers written as JSON, item by item, from a hub's snapshot.

use std::{io::Write, sync::Arc};

use elemental_changelog_hub::{Item, Object, ResourceVersion};

/// Writes one item of a list for this list alone.
pub type WriteItem<'a, T> = dyn Fn(&Item<T>) -> Vec<u8> + 'a;

/// Writes a list of kept answers as JSON: `apiVersion`, `kind`, `metadata.resourceVersion`,
/// then each item's bytes (`item`: written for this list instead, e.g. with an exposure).
pub fn write_list<T: Object>(
    out: &mut dyn Write,
    api_version: &str,
    kind: &str,
    version: ResourceVersion,
    items: &[&Arc<Item<T>>],
    item: Option<&WriteItem<'_, T>>,
) -> std::io::Result<()> {
    write!(
        out,
        "{{\"apiVersion\":\"{api_version}\",\"kind\":\"{kind}\",\"metadata\":{{\"resourceVersion\":\"{version}\"}},\"items\":["
    )?;
    for (i, kept) in items.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        match item {
            Some(item) => out.write_all(&item(kept))?,
            None => kept.write_json(out)?,
        }
    }
    out.write_all(b"]}")
}

/// Bytes of the kept answers `items` (what a list of them takes, about).
pub fn kept_bytes<T: Object>(items: &[&Arc<Item<T>>]) -> usize {
    items.iter().map(|i| i.json_len() + 1).sum::<usize>() + 160
}
