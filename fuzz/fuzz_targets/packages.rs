//! `<name>.packages`: never panics; a parsed list is sorted, its lookups
//! agree, and `write` gives a file that parses to the same packages.
#![no_main]

use elemental_changelog::packages::{self, Package, PackageList};
use libfuzzer_sys::fuzz_target;

/// Field-by-field (`Evr`'s `==` is RPM order, which calls `1.0` and `1.00` equal).
fn same(a: &Package, b: &Package) -> bool {
    a.name == b.name
        && a.arch == b.arch
        && a.evr.epoch == b.evr.epoch
        && a.evr.version == b.evr.version
        && a.evr.release == b.evr.release
        && a.disturl == b.disturl
        && a.license == b.license
}

fn check_lookups(list: &PackageList) {
    let all = list.packages();
    assert!(
        all.windows(2)
            .all(|w| (&w[0].name, &w[0].arch, &w[0].evr) <= (&w[1].name, &w[1].arch, &w[1].evr)),
        "list not sorted"
    );
    for p in list.latest() {
        let got = list
            .get(&p.name, &p.arch)
            .expect("get finds a listed package");
        assert!(std::ptr::eq(got, p), "get and latest disagree");
        assert!(list.by_name(&p.name).any(|q| std::ptr::eq(q, p)));
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(list) = packages::parse(data) else {
        return;
    };
    check_lookups(&list);
    let written = list.write();
    let again = packages::parse(&written).expect("written package list parses");
    assert_eq!(again.len(), list.len());
    for (a, b) in again.packages().iter().zip(list.packages()) {
        assert!(same(a, b), "round trip changed {b:?} into {a:?}");
    }
    assert_eq!(again.write(), written, "write is not stable");
});
