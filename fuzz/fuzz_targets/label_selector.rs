//! Label and field selectors: never panic, and a selector made of two
//! parseable halves (without parentheses) matches exactly when both do.
//! Input lines: selector A, selector B, then labels as `key=value`.
#![no_main]

use std::collections::BTreeMap;

use elemental_changelog_apiserver::request::selector::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let a = lines.next().unwrap_or_default();
    let b = lines.next().unwrap_or_default();
    let labels: BTreeMap<String, String> = lines
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (l.to_owned(), String::new()),
        })
        .collect();

    let parsed_a = LabelSelector::parse(a);
    let parsed_b = LabelSelector::parse(b);
    if let Err(status) = &parsed_a {
        assert_eq!(status.code(), 400);
    }
    if let Ok(sel) = &parsed_a {
        let matched = sel.matches(&labels);
        let _ = sel.matches(&BTreeMap::new());
        if let Ok(sel_b) = &parsed_b
            && ![a, b].iter().any(|s| s.contains(['(', ')']))
        {
            let both = LabelSelector::parse(&format!("{a},{b}"))
                .expect("two parseable selectors joined by a comma parse");
            assert_eq!(both.matches(&labels), matched && sel_b.matches(&labels));
        }
    }
    if LabelSelector::parse("").is_ok_and(|s| !s.matches(&labels)) {
        panic!("the empty selector must match everything");
    }

    if let Ok(fields) = FieldSelector::parse(a) {
        let name = labels.keys().next().map_or("", String::as_str);
        let _ = fields.matches(name, b);
    }
});
