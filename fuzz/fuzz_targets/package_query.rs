//! `?package=`, `packageAtLeast`, `packageBelow` (issue 34): any input is refused with an
//! error or accepted, never a panic; an accepted query prints its bounds so that they parse
//! back to the same query (its key for answers kept), and selects an EVR exactly when the EVR
//! is within `[at_least, below)` by `Evr::cmp_bound`. Input: name, at-least, below and an EVR,
//! one per line (an empty bound line: no bound).
#![no_main]

use std::cmp::Ordering;

use elemental_changelog::package_index::PackageQuery;
use elemental_changelog::rpmver::Evr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(4, '\n');
    let name = lines.next().unwrap_or_default();
    let bound = |line: Option<&str>| line.filter(|l| !l.is_empty()).map(str::to_owned);
    let (at_least, below) = (bound(lines.next()), bound(lines.next()));
    let evr = lines.next().and_then(|l| l.parse::<Evr>().ok());
    let Ok(query) = PackageQuery::new(name, at_least.as_deref(), below.as_deref()) else {
        return;
    };
    if let (Some(low), Some(high)) = (query.at_least(), query.below()) {
        assert_eq!(low.cmp(high), Ordering::Less, "an empty range was accepted");
    }
    let again = PackageQuery::new(
        query.name(),
        query.at_least().map(ToString::to_string).as_deref(),
        query.below().map(ToString::to_string).as_deref(),
    )
    .unwrap_or_else(|e| panic!("{query:?} printed does not parse back: {e}"));
    assert_eq!(
        (again.at_least(), again.below()),
        (query.at_least(), query.below()),
        "printed bounds parse to other bounds"
    );
    if let Some(evr) = evr {
        let within = query
            .at_least()
            .is_none_or(|low| evr.cmp_bound(low) != Ordering::Less)
            && query
                .below()
                .is_none_or(|high| evr.cmp_bound(high) == Ordering::Less);
        assert_eq!(query.contains(&evr), within);
    }
});
