//! The demo's sample channel: the real `sl-micro-61-base` channel.json, package
//! lists and an updateinfo.xml (under `integration/sample/`), plus the
//! precomputed `<name>.updates.log` files written by the same code as the
//! `compute` command, all in one channel image.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use elemental_changelog::{
    channel::{self, EntryKind},
    compute::generate_updates_logs,
    updateinfo,
};

use crate::{
    image::{Compression, Format, Image},
    testbed::elemental::VersionEntry,
};

const CHANNEL_JSON: &[u8] = include_bytes!("../sample/channel.json");
const UPDATEINFO: &[u8] = include_bytes!("../sample/updateinfo.xml");
const PACKAGES: [(&str, &[u8]); 3] = [
    (
        "base-v2.2.0-3.8-os",
        include_bytes!("../sample/base-v2.2.0-3.8-os.packages"),
    ),
    (
        "base-v2.2.0-3.9-os",
        include_bytes!("../sample/base-v2.2.0-3.9-os.packages"),
    ),
    (
        "base-v2.2.0-3.12-os",
        include_bytes!("../sample/base-v2.2.0-3.12-os.packages"),
    ),
];

/// The sample channel's files, as paths in the image and contents.
pub fn files() -> Result<Vec<(String, Vec<u8>)>> {
    let advisories = updateinfo::parse(UPDATEINFO, updateinfo::Limits::default())
        .context("sample updateinfo.xml")?;
    let packages: BTreeMap<String, Vec<u8>> = PACKAGES
        .iter()
        .map(|(name, data)| ((*name).to_owned(), data.to_vec()))
        .collect();
    let logs = generate_updates_logs(CHANNEL_JSON, &packages, &advisories)
        .context("computing the sample updates.log files")?;
    let mut files = vec![
        ("channel.json".to_owned(), CHANNEL_JSON.to_vec()),
        ("changelogs/updateinfo.xml".to_owned(), UPDATEINFO.to_vec()),
    ];
    for (name, data) in PACKAGES {
        files.push((format!("changelogs/{name}.packages"), data.to_vec()));
    }
    for (name, data) in logs {
        files.push((format!("changelogs/{name}"), data));
    }
    Ok(files)
}

/// The sample channel image (gzip layer, OCI manifest).
pub fn image() -> Result<Image> {
    let files = files()?;
    Ok(Image::channel(Format::Oci, Compression::Gzip, &files))
}

/// The channel's entries the operator turns into ManagedOSVersions (all of
/// them, ISOs included), oldest first.
pub fn entries() -> Result<Vec<VersionEntry>> {
    let mut entries = channel::parse(CHANNEL_JSON).context("sample channel.json")?;
    entries.sort_by_key(|e| e.created);
    Ok(entries
        .into_iter()
        .map(|e| VersionEntry {
            upgrade_image: match e.kind {
                EntryKind::Container => e.upgrade_image.clone().unwrap_or_default(),
                _ => e.uri.clone().unwrap_or_default(),
            },
            name: e.name,
            version: e.version,
            created: e.created.map(|t| t.as_second()),
        })
        .collect())
}

/// Names of the OS (container) versions, oldest first.
pub fn os_versions() -> Result<Vec<String>> {
    let mut entries = channel::parse(CHANNEL_JSON).context("sample channel.json")?;
    entries.retain(|e| e.kind == EntryKind::Container);
    entries.sort_by_key(|e| e.created);
    Ok(entries.into_iter().map(|e| e.name).collect())
}

#[cfg(test)]
mod tests {
    use elemental_changelog::{compute::IndexedChannel, data::ChannelData};

    use super::*;

    #[test]
    fn sample_serves_computed_and_precomputed_changelogs() {
        let data = ChannelData::from_files(files().unwrap()).unwrap();
        assert!(data.problems().is_empty(), "{:?}", data.problems());
        let data = IndexedChannel::new(data);
        let versions = os_versions().unwrap();
        assert_eq!(versions.len(), 3);
        let newest = data.changelog(&versions[2], None).unwrap();
        let ids: Vec<&str> = newest.advisories.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids.len(), 2, "{ids:?}");
        assert!(ids.contains(&"SUSE-SLE-Micro-6.1-2024-4201"));
        let all = data.changelog(&versions[2], Some(&versions[0])).unwrap();
        assert_eq!(all.advisories.len(), 4);
        assert!(all.summary.cves >= 3);
        assert_eq!(entries().unwrap().len(), 6);
    }
}
