//! `Accept` negotiation for resources and `/apis`: never panics, media ranges
//! come out ordered, and the answers agree with the parsed ranges. Input:
//! the `Accept` header, then optionally a line with `includeObject`.
#![no_main]

use elemental_changelog_apiservice::content::{self, IncludeObject, Representation};
use elemental_changelog_apiservice::discovery::{self, ApisRepresentation};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (accept, include_object) = match text.split_once('\n') {
        Some((accept, rest)) => (accept, Some(rest)),
        None => (text, None),
    };

    let ranges = content::parse_accept(accept);
    for r in &ranges {
        assert!(r.q > 0.0 && r.q <= 1.0, "q out of range: {r:?}");
        assert_eq!(r.type_, r.type_.to_ascii_lowercase());
        assert_eq!(r.subtype, r.subtype.to_ascii_lowercase());
        assert!(
            r.params
                .iter()
                .all(|(k, _)| *k == k.to_ascii_lowercase() && k != "q")
        );
    }
    assert!(
        ranges.windows(2).all(|w| w[0].q >= w[1].q),
        "ranges not sorted by q"
    );

    // A bad includeObject is a 400 of its own parser; the default is used then.
    let include_object = match include_object.map(IncludeObject::parse).transpose() {
        Ok(parsed) => parsed.unwrap_or_default(),
        Err(status) => {
            assert_eq!(status.code(), 400, "{status:?}");
            IncludeObject::default()
        }
    };
    match content::negotiate(Some(accept), include_object) {
        Ok(representation) => {
            // Only a range covering JSON can have chosen it (or no header).
            assert!(accept.trim().is_empty() || ranges.iter().any(|r| r.covers_json()));
            if let Representation::Table { .. } = representation {
                assert!(representation.content_type().contains("as=Table"));
            }
        }
        Err(status) => assert_eq!(status.code(), 406, "{status:?}"),
    }
    // No header at all: JSON.
    assert_eq!(
        content::negotiate(None, include_object),
        Ok(Representation::Json)
    );

    let apis = discovery::negotiate_apis(Some(accept));
    if apis == ApisRepresentation::AggregatedV2 {
        assert!(
            ranges
                .iter()
                .any(|r| r.covers_json() && r.param("g") == Some("apidiscovery.k8s.io"))
        );
    }
    assert_eq!(
        discovery::negotiate_apis(None),
        ApisRepresentation::GroupList
    );
});
