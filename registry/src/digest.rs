//! Content digests (`algorithm:hex`) computed as content arrives: SHA-256
//! and SHA-512, the algorithms the OCI image spec registers.

use sha2::{Digest as _, Sha256, Sha512};

/// SHA-256 or SHA-512, as the expected digest says.
pub enum Hasher {
    /// `sha256:`.
    Sha256(Sha256),
    /// `sha512:`.
    Sha512(Sha512),
}

impl Hasher {
    /// The hasher for `digest`'s algorithm; `None` for other algorithms.
    pub fn for_digest(digest: &str) -> Option<Self> {
        match digest.split_once(':') {
            Some(("sha256", _)) => Some(Self::Sha256(Sha256::new())),
            Some(("sha512", _)) => Some(Self::Sha512(Sha512::new())),
            _ => None,
        }
    }

    /// `sha256:<hex>` of `data`.
    pub fn sha256_of(data: &[u8]) -> String {
        let mut hasher = Self::Sha256(Sha256::new());
        hasher.update(data);
        hasher.finish()
    }

    /// Hashes more data.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Self::Sha256(hasher) => hasher.update(data),
            Self::Sha512(hasher) => hasher.update(data),
        }
    }

    /// `algorithm:<hex>`.
    pub fn finish(self) -> String {
        match self {
            Self::Sha256(hasher) => format!("sha256:{:x}", hasher.finalize()),
            Self::Sha512(hasher) => format!("sha512:{:x}", hasher.finalize()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hashers_follow_the_digest_algorithm() {
        let mut sha256 = Hasher::for_digest("sha256:x").unwrap();
        sha256.update(b"abc");
        assert_eq!(
            sha256.finish(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            Hasher::sha256_of(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut sha512 = Hasher::for_digest("sha512:x").unwrap();
        sha512.update(b"");
        assert!(sha512.finish().starts_with("sha512:cf83e1357eefb8bd"));
        assert!(Hasher::for_digest("md5:x").is_none());
        assert!(Hasher::for_digest("nodigest").is_none());
    }
}
