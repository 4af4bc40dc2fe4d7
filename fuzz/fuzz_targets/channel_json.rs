//! `channel.json`: never panics; what parses has unique, non-blank names and
//! survives being written back as JSON and parsed again.
#![no_main]

use std::collections::HashSet;

use elemental_changelog::channel::{self, ChannelEntry};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn to_json(entries: &[ChannelEntry]) -> Vec<u8> {
    let items: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            json!({
                "metadata": {"name": e.name},
                "spec": {
                    "version": e.version,
                    "type": e.kind.as_str(),
                    "metadata": {
                        "upgradeImage": e.upgrade_image,
                        "uri": e.uri,
                        "displayName": e.display_name,
                        "platforms": e.platforms,
                        "created": e.created.map(|t| t.as_second()),
                    },
                },
            })
        })
        .collect();
    serde_json::to_vec(&items).expect("entries serialize")
}

fuzz_target!(|data: &[u8]| {
    let Ok(entries) = channel::parse(data) else {
        return;
    };
    let mut names = HashSet::new();
    for e in &entries {
        assert!(!e.name.trim().is_empty(), "blank name accepted");
        assert!(names.insert(e.name.as_str()), "duplicate name {:?}", e.name);
    }
    let again = channel::parse(&to_json(&entries)).expect("written channel.json parses");
    assert_eq!(again, entries);
});
