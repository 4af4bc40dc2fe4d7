//! `updateinfo.xml` (plain, `.gz`, `.zst`): never panics, limits hold
//! (advisories, packages per advisory and in all), and what parses is a
//! valid set of advisories, merged ids without duplicate packages. The same bytes are fed as a
//! plain file and through both decompressors.
#![no_main]

use std::collections::HashSet;
use std::io::{BufReader, Read};

use elemental_changelog::updateinfo::{self, Error, Limits};
use elemental_changelog::updates;
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_advisories: 8,
    max_bytes: 64 * 1024,
    max_element_bytes: 4096,
    max_packages_per_advisory: 16,
    max_packages: 48,
    max_memory: 64 * 1024,
    // Far above what these inputs take: the outcome must not depend on the clock.
    max_duration: std::time::Duration::from_secs(60),
};

fn check(name: &str, data: &[u8]) {
    let result = updateinfo::decoder_for(name, data).and_then(|r| updateinfo::parse(r, LIMITS));
    let advisories = match result {
        Ok(advisories) => advisories,
        Err(Error::TooLarge { limit }) => {
            assert_eq!(limit, LIMITS.max_bytes);
            // Only a stream longer than the limit may be refused as too large.
            let mut reader =
                updateinfo::decoder_for(name, data).expect("decoder built a second time");
            let mut sink = Vec::new();
            let read = reader
                .by_ref()
                .take(LIMITS.max_bytes + 1)
                .read_to_end(&mut sink);
            if read.is_ok() {
                assert!(
                    sink.len() as u64 > LIMITS.max_bytes,
                    "{name}: TooLarge below the limit"
                );
            }
            return;
        }
        Err(_) => return,
    };
    assert!(
        advisories.len() <= LIMITS.max_advisories,
        "{name}: too many advisories"
    );
    let packages: usize = advisories.iter().map(|a| a.packages.len()).sum();
    assert!(packages <= LIMITS.max_packages, "{name}: too many packages");
    let mut ids = HashSet::new();
    for a in &advisories {
        assert!(
            a.packages.len() <= LIMITS.max_packages_per_advisory,
            "{name}: too many packages in {}",
            a.id
        );
        let distinct: std::collections::BTreeSet<_> = a.packages.iter().collect();
        assert_eq!(distinct.len(), a.packages.len(), "{name}: duplicate package in {}", a.id);
        assert!(
            !a.id.is_empty() && a.id.trim() == a.id,
            "{name}: bad id {:?}",
            a.id
        );
        assert!(
            ids.insert(a.id.as_str()),
            "{name}: id {:?} not merged",
            a.id
        );
        let (cves, bugs) = updates::cves_and_bugs(&a.references);
        assert_eq!((&cves, &bugs), (&a.cves, &a.bugs));
    }
}

fuzz_target!(|data: &[u8]| {
    check("changelogs/updateinfo.xml", data);
    check("changelogs/updateinfo.xml.gz", data);
    check("changelogs/updateinfo.xml.zst", data);
    // A reader that hands out one byte at a time must give the same answer.
    let whole = updateinfo::parse(data, LIMITS).map_err(|e| e.to_string());
    let trickle =
        updateinfo::parse(BufReader::with_capacity(1, data), LIMITS).map_err(|e| e.to_string());
    match (&whole, &trickle) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        _ => panic!("buffer size changed the outcome: {whole:?} vs {trickle:?}"),
    }
});
