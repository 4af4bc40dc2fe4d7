//! What names an image: a parsed reference ([`ImageRef`]), its
//! [`Repository`], a content [`Digest`], and [`ImageKey`], the repository,
//! manifest digest and architecture that make two pulls (and their parses)
//! the same.

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
/// short names expanded (`x` is `docker.io/library/x:latest`). It keeps the
/// text it was parsed from: it is shown as written ([`ImageRef::as_str`],
/// `Display`), and two references are equal when they are written the same.
/// (Two spellings of one image are one [`ImageKey`].)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    reference: Reference,
    text: String,
}

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
    /// The reference as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The whole reference, normalised (`docker.io/library/x:tag`).
    pub fn whole(&self) -> String {
        self.reference.whole()
    }

    /// Its repository, `registry/path` (`docker.io/library/x`).
    pub fn repository(&self) -> Repository {
        Repository(format!(
            "{}/{}",
            self.reference.registry(),
            self.reference.repository()
        ))
    }

    /// The registry (`host[:port]`) as it is reached (`index.docker.io` for
    /// Docker Hub's names).
    pub fn registry(&self) -> &str {
        self.reference.resolve_registry()
    }

    /// The same repository at `digest`, written `registry/path@digest`.
    pub fn at(&self, digest: &Digest) -> Self {
        Self::from_reference(self.reference.clone_with_digest(digest.as_str().to_owned()))
    }

    /// The parsed reference, for the registry client.
    pub(crate) fn reference(&self) -> &Reference {
        &self.reference
    }

    /// `reference`, written normalised.
    fn from_reference(reference: Reference) -> Self {
        Self {
            text: reference.whole(),
            reference,
        }
    }
}

impl FromStr for ImageRef {
    type Err = InvalidImageRef;

    fn from_str(image: &str) -> Result<Self, Self::Err> {
        match image.parse() {
            Ok(reference) => Ok(Self {
                reference,
                text: image.to_owned(),
            }),
            Err(source) => Err(InvalidImageRef {
                image: image.to_owned(),
                source: Arc::new(source),
            }),
        }
    }
}

impl fmt::Display for ImageRef {
    /// The reference as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A repository, `registry/path`, written as image references name it once
/// normalised: the registry as named (`docker.io` for Docker Hub, whose short
/// names are expanded: `x` is in `docker.io/library/x`), without tag or digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Repository(String);

/// A string that is not a repository written as [`Repository`] writes it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a repository (registry/path, without tag or digest)")]
pub struct InvalidRepository(pub String);

impl Repository {
    /// `registry/path`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The image of this repository at `digest`: `registry/path@digest`.
    pub fn at(&self, digest: &Digest) -> ImageRef {
        // Always "registry/path": a registry holds no slash.
        let (registry, path) = self.0.split_once('/').unwrap_or_default();
        ImageRef::from_reference(Reference::with_digest(
            registry.to_owned(),
            path.to_owned(),
            digest.as_str().to_owned(),
        ))
    }
}

impl FromStr for Repository {
    type Err = InvalidRepository;

    /// Only `registry/path` as [`ImageRef::repository`] writes it: no tag, no
    /// digest, no short name (`x` or `library/x` is not `docker.io/library/x`).
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidRepository(raw.to_owned());
        let image: ImageRef = raw.parse().map_err(|_| invalid())?;
        let repository = image.repository();
        if repository.0 == raw {
            Ok(repository)
        } else {
            Err(invalid())
        }
    }
}

impl fmt::Display for Repository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Repository {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Repository {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// What determines an image's pull and the files it keeps: its repository
/// (so that a registry answering for another repository never supplies this
/// one's files), the manifest digest the reference resolved to, and the
/// architecture (its OCI name: the platform chosen from an index).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageKey {
    repository: Repository,
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
    pub fn repository(&self) -> &Repository {
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
    fn keys_name_the_repository_however_the_reference_spells_it() {
        let a = key("docker.io/library/x:1", "sha256:aa", "amd64");
        assert_eq!(a, key("index.docker.io/library/x:2", "sha256:aa", "amd64"));
        assert_eq!(a, key("x:3", "sha256:aa", "amd64"));
        assert_eq!(*a.repository(), "docker.io/library/x");
        assert_ne!(a, key("docker.io/library/x:1", "sha256:aa", "arm64"));
        assert_ne!(a, key("docker.io/library/x:1", "sha256:bb", "amd64"));
        assert_ne!(
            a,
            key("registry.example.com/library/x:1", "sha256:aa", "amd64")
        );
        assert_eq!(a.to_string(), "docker.io/library/x@sha256:aa (amd64)");
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
    fn references_are_shown_and_compared_as_written() {
        let short: ImageRef = "x".parse().unwrap();
        let long: ImageRef = "docker.io/library/x:latest".parse().unwrap();
        assert_eq!((short.as_str(), short.to_string()), ("x", "x".to_owned()));
        assert_eq!(short.whole(), "docker.io/library/x:latest");
        assert_eq!(short.registry(), "index.docker.io");
        assert_ne!(short, long, "written differently");
        assert_eq!(short.repository(), long.repository());
        assert_eq!(short, "x".parse().unwrap());
        let digest = "sha256:aa".parse().unwrap();
        assert_eq!(short.at(&digest), long.at(&digest));
        assert_eq!(short.at(&digest).as_str(), "docker.io/library/x@sha256:aa");
    }

    #[test]
    fn repositories_are_written_one_way() {
        for (image, repository) in [
            ("x:1", "docker.io/library/x"),
            ("index.docker.io/team/x", "docker.io/team/x"),
            (
                "registry.example.com:5000/os/channel:v1@sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b",
                "registry.example.com:5000/os/channel",
            ),
            ("localhost/channel", "localhost/channel"),
        ] {
            let image: ImageRef = image.parse().unwrap();
            assert_eq!(image.repository(), repository);
            let parsed: Repository = repository.parse().unwrap();
            assert_eq!(parsed, image.repository());
            assert_eq!(parsed.to_string(), repository);
        }
        let repository: Repository = "registry.example.com/os/channel".parse().unwrap();
        let digest = "sha256:aa".parse().unwrap();
        assert_eq!(
            repository.at(&digest).as_str(),
            "registry.example.com/os/channel@sha256:aa"
        );
        assert_eq!(repository.at(&digest).repository(), repository);
        for bad in [
            "",
            "x",
            "library/x",
            "index.docker.io/library/x",
            "registry.example.com/os/channel:v1",
            "registry.example.com/os/channel:latest",
            "registry.example.com/os/channel@sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b",
            "Registry.example.com/OS/channel",
            "registry.example.com/os/channel ",
        ] {
            assert_eq!(
                bad.parse::<Repository>(),
                Err(InvalidRepository(bad.to_owned())),
                "{bad:?}"
            );
        }
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
