//! RPM version order: `rpmvercmp` and `Evr` must be total orders (sorting
//! with an inconsistent order panics since Rust 1.81): reflexive,
//! antisymmetric, transitive, equality substitutable. Input: up to three
//! strings, one per line.
#![no_main]

use std::cmp::Ordering;

use elemental_changelog::rpmver::{Evr, rpmvercmp};
use libfuzzer_sys::fuzz_target;

fn check_order<T: ?Sized>(items: &[&T], cmp: impl Fn(&T, &T) -> Ordering) {
    for &a in items {
        assert_eq!(cmp(a, a), Ordering::Equal, "not reflexive");
        for &b in items {
            let ab = cmp(a, b);
            assert_eq!(ab, cmp(b, a).reverse(), "not antisymmetric");
            for &c in items {
                let bc = cmp(b, c);
                let ac = cmp(a, c);
                if ab != Ordering::Greater && bc != Ordering::Greater {
                    assert_ne!(ac, Ordering::Greater, "not transitive (<=)");
                }
                if ab == Ordering::Less && bc != Ordering::Greater {
                    assert_eq!(ac, Ordering::Less, "not transitive (<)");
                }
                if ab == Ordering::Equal {
                    assert_eq!(ac, bc, "equal values compare differently");
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let strings: Vec<&str> = text.splitn(3, '\n').collect();
    check_order(&strings, rpmvercmp);
    let evrs: Vec<Evr> = strings.iter().filter_map(|s| s.parse().ok()).collect();
    let refs: Vec<&Evr> = evrs.iter().collect();
    check_order(&refs, Ord::cmp);
});
