//! What names an image: a parsed reference ([`ImageRef`]), a content
//! [`Digest`], and [`ImageKey`], the repository, manifest digest and
//! architecture that make two pulls (and their parses) the same.

use std::{fmt, str::FromStr, sync::Arc};

use oci_client::Reference;

/// A content digest, `algorithm:encoded` as the OCI image spec's grammar
/// allows it (`sha256:…`). Whether the encoded part has the length its
/// algorithm gives is checked where content is hashed against it: content
/// never matches a digest of the wrong length.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

/// A string that is not a digest.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a digest (algorithm:encoded)")]
pub struct InvalidDigest(pub String);

impl Digest {
    /// The digest as written, `algorithm:encoded`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The algorithm (`sha256`).
    pub fn algorithm(&self) -> &str {
        self.0
            .split_once(':')
            .map_or("", |(algorithm, _)| algorithm)
    }
}

impl FromStr for Digest {
    type Err = InvalidDigest;

    /// `algorithm ":" encoded`, where algorithm is `[a-z0-9]+([+._-][a-z0-9]+)*`
    /// and encoded `[a-zA-Z0-9=_-]+` (the OCI image spec's grammar).
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidDigest(raw.to_owned());
        let (algorithm, encoded) = raw.split_once(':').ok_or_else(invalid)?;
        let algorithm_ok = algorithm.split(['+', '.', '_', '-']).all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        });
        let encoded_ok = !encoded.is_empty()
            && encoded
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b'_' | b'-'));
        if algorithm_ok && encoded_ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(invalid())
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Digest {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Digest {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Digest {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// An image reference, parsed: `registry/path[:tag][@digest]`, Docker Hub's
/// short names expanded (`x` is `docker.io/library/x:latest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef(Reference);

/// A string that is not an image reference.
#[derive(Clone, Debug, thiserror::Error)]
#[error("invalid image reference {image:?}")]
pub struct InvalidImageRef {
    /// The reference as given.
    pub image: String,
    /// The parse error.
    #[source]
    pub source: Arc<oci_client::ParseError>,
}

impl ImageRef {
    /// `registry/path`, the registry as it is reached (`index.docker.io` for
    /// Docker Hub's names).
    pub fn repository(&self) -> String {
        format!("{}/{}", self.0.resolve_registry(), self.0.repository())
    }

    /// The registry (`host[:port]`) as it is reached.
    pub fn registry(&self) -> &str {
        self.0.resolve_registry()
    }

    /// The same repository at `digest`.
    pub fn at(&self, digest: &Digest) -> Self {
        Self(self.0.clone_with_digest(digest.as_str().to_owned()))
    }

    /// The parsed reference, for the registry client.
    pub(crate) fn reference(&self) -> &Reference {
        &self.0
    }
}

impl FromStr for ImageRef {
    type Err = InvalidImageRef;

    fn from_str(image: &str) -> Result<Self, Self::Err> {
        image.parse().map(Self).map_err(|source| InvalidImageRef {
            image: image.to_owned(),
            source: Arc::new(source),
        })
    }
}

impl fmt::Display for ImageRef {
    /// The whole reference, normalised (`docker.io/library/x:tag`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.whole())
    }
}

/// What determines an image's pull and the files it keeps: its repository
/// (so that a registry answering for another repository never supplies this
/// one's files), the manifest digest the reference resolved to, and the
/// architecture (its OCI name: the platform chosen from an index).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageKey {
    repository: String,
    digest: Digest,
    arch: String,
}

impl ImageKey {
    /// The key of `image` at `digest` for `arch` (its OCI name).
    pub fn new(image: &ImageRef, digest: &Digest, arch: &str) -> Self {
        Self {
            repository: image.repository(),
            digest: digest.clone(),
            arch: arch.to_owned(),
        }
    }

    /// `registry/path`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The manifest (or index) digest.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The architecture's OCI name.
    pub fn arch(&self) -> &str {
        &self.arch
    }
}

impl fmt::Display for ImageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{} ({})", self.repository, self.digest, self.arch)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(image: &str, digest: &str, arch: &str) -> ImageKey {
        ImageKey::new(&image.parse().unwrap(), &digest.parse().unwrap(), arch)
    }

    #[test]
    fn keys_name_the_repository_as_reached() {
        let a = key("docker.io/library/x:1", "sha256:aa", "amd64");
        assert_eq!(a, key("index.docker.io/library/x:2", "sha256:aa", "amd64"));
        assert_eq!(a, key("x:3", "sha256:aa", "amd64"));
        assert_eq!(a.repository(), "index.docker.io/library/x");
        assert_ne!(a, key("docker.io/library/x:1", "sha256:aa", "arm64"));
        assert_ne!(a, key("docker.io/library/x:1", "sha256:bb", "amd64"));
        assert_ne!(
            a,
            key("registry.example.com/library/x:1", "sha256:aa", "amd64")
        );
        assert_eq!(a.to_string(), "index.docker.io/library/x@sha256:aa (amd64)");
    }

    #[test]
    fn references() {
        let image: ImageRef = "registry.example.com:5000/os/channel:v1".parse().unwrap();
        assert_eq!(image.registry(), "registry.example.com:5000");
        assert_eq!(image.repository(), "registry.example.com:5000/os/channel");
        assert_eq!(
            image.at(&"sha256:aa".parse().unwrap()).to_string(),
            "registry.example.com:5000/os/channel@sha256:aa"
        );
        let error = "Not A Reference".parse::<ImageRef>().unwrap_err();
        assert_eq!(error.image, "Not A Reference");
    }

    #[test]
    fn digests_follow_the_oci_grammar() {
        for good in [
            "sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b",
            "sha512:ab",
            "multihash+base58:QmRZxt2b1FVZPNqd8hsiykDL3TdBDeTSPX9Kv46HmX4Gx8",
            "sha256+b64u:LCa0a2j_xo_5m0U8HTBBNBNCLXBkg7-g-YpeiGJm564",
            "sha256:old",
        ] {
            let digest: Digest = good.parse().unwrap();
            assert_eq!(digest.as_str(), good);
            assert_eq!(digest, good);
        }
        assert_eq!("sha256:ab".parse::<Digest>().unwrap().algorithm(), "sha256");
        for bad in [
            "",
            "sha256",
            "sha256:",
            ":ab",
            "SHA256:ab",
            "sha256:a/b",
            "sha256:a b",
            "sha256:ab\n",
            "sha--256:ab",
        ] {
            assert_eq!(bad.parse::<Digest>(), Err(InvalidDigest(bad.to_owned())));
        }
    }
}
