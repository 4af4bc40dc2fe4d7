//! The uid of each object served: its own, not the uid of the object it describes.
//!
//! A summary is a different object from the operator's object it describes (another API group,
//! another kind), so it must not carry that object's uid: clients key objects by uid (the Rancher
//! dashboard's store does), and two objects of two groups with one uid are one object to them.
//! The uid is derived, never stored: every replica, and the same replica after a restart, gives an
//! object the same uid, and a recreated source object (a new uid) gives a new one.
//!
//! The derivation is RFC 9562's name-based UUID with SHA-256 (a version 8 UUID, its appendix
//! B.2): SHA-256 of this API's namespace UUID followed by the name `<resource>/<source uid>`,
//! the first 16 bytes with the version and variant bits set. The namespace UUID is the same
//! derivation of the API group's name in the DNS namespace of RFC 9562 (section 6.6).

use sha2::{Digest as _, Sha256};

/// RFC 9562's namespace ID for fully qualified domain names (`6ba7b810-9dad-11d1-80b4-00c04fd430c8`).
const NAMESPACE_DNS: [u8; 16] = [
    0x6b, 0xa7, 0xb8, 0x10, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8,
];

/// The uid of the object of `resource` (`managedosversions`, `machineinventories`,
/// `managedosimages`) that describes the operator's object whose uid is `source_uid`.
pub fn uid(resource: &str, source_uid: &str) -> String {
    let namespace = name_based(&NAMESPACE_DNS, crate::GROUP.as_bytes());
    let name = [resource.as_bytes(), b"/", source_uid.as_bytes()].concat();
    text(&name_based(&namespace, &name))
}

/// RFC 9562 appendix B.2: a version 8 UUID from SHA-256 of `namespace` then `name`.
fn name_based(namespace: &[u8; 16], name: &[u8]) -> [u8; 16] {
    let digest = Sha256::new()
        .chain_update(namespace)
        .chain_update(name)
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    bytes
}

/// The 8-4-4-4-12 hexadecimal text of a UUID.
fn text(bytes: &[u8; 16]) -> String {
    let mut out = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

#[cfg(test)]
mod tests;
