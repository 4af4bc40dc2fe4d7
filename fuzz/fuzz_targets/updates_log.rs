//! `<name>.updates.log`: never panics; what parses is written back by
//! `updates::write` into a file that parses to the same advisories.
#![no_main]

use elemental_changelog::updates;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(advisories) = updates::parse(data) else {
        return;
    };
    for a in &advisories {
        assert!(!a.id.trim().is_empty(), "empty id accepted");
        assert!(a.cves.iter().all(|c| *c == c.to_ascii_uppercase()));
        assert!(a.cves.is_sorted() && a.bugs.is_sorted());
    }
    let written = updates::write(&advisories);
    let again = updates::parse(&written).expect("written updates.log parses");
    assert_eq!(again, advisories);
    assert_eq!(updates::write(&again), written, "write is not stable");
});
