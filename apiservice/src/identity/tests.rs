use super::*;
use crate::{IMAGE_RESOURCE, MACHINE_RESOURCE, RESOURCE};

const SOURCE: &str = "7b6f0c2e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";

#[test]
fn rfc_9562_appendix_b2_example() {
    // RFC 9562 appendix B.2: SHA-256 of the DNS namespace and "www.example.com".
    let bytes = name_based(&NAMESPACE_DNS, b"www.example.com");
    assert_eq!(text(&bytes), "5c146b14-3c52-8afd-938a-375d0df1fbf6");
}

#[test]
fn a_uid_of_its_own_stable_and_per_resource() {
    let version = uid(RESOURCE, SOURCE);
    assert_ne!(version, SOURCE, "not the source object's uid");
    assert_eq!(version, uid(RESOURCE, SOURCE), "the same on every call");
    let others = [uid(MACHINE_RESOURCE, SOURCE), uid(IMAGE_RESOURCE, SOURCE)];
    assert!(others.iter().all(|other| *other != version));
    assert_ne!(others[0], others[1]);
    assert_ne!(uid(RESOURCE, "another"), version);
}

#[test]
fn the_text_is_a_version_8_rfc_9562_uuid() {
    let uid = uid(MACHINE_RESOURCE, SOURCE);
    let groups: Vec<usize> = uid.split('-').map(str::len).collect();
    assert_eq!(groups, [8, 4, 4, 4, 12], "{uid}");
    assert!(
        uid.chars()
            .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_eq!(&uid[14..15], "8", "version 8: {uid}");
    assert!(
        matches!(&uid[19..20], "8" | "9" | "a" | "b"),
        "variant 10: {uid}"
    );
}
