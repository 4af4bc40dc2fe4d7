//! What names an image: [`ImageKey`], the repository, manifest digest and
//! architecture that make two pulls (and their parses) the same.

use std::fmt;

use oci_client::Reference;

/// What determines an image's pull and the files it keeps: its repository
/// (so that a registry answering for another repository never supplies this
/// one's files), the manifest digest the reference resolved to, and the
/// architecture (its OCI name: the platform chosen from an index).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageKey {
    /// `registry/path`, the registry as it is reached (`index.docker.io` for
    /// Docker Hub's names).
    repository: String,
    digest: String,
    arch: String,
}

impl ImageKey {
    /// The key of `image` at `digest` for `arch` (its OCI name); `None` when
    /// `image` is not a valid reference (its pull fails anyway).
    pub fn new(image: &str, digest: &str, arch: &str) -> Option<Self> {
        let reference: Reference = image.parse().ok()?;
        Some(Self::of(&reference, digest, arch))
    }

    pub(crate) fn of(reference: &Reference, digest: &str, arch: &str) -> Self {
        Self {
            repository: format!(
                "{}/{}",
                reference.resolve_registry(),
                reference.repository()
            ),
            digest: digest.to_owned(),
            arch: arch.to_owned(),
        }
    }

    /// `registry/path`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The manifest (or index) digest.
    pub fn digest(&self) -> &str {
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

    #[test]
    fn keys_name_the_repository_as_reached() {
        let a = ImageKey::new("docker.io/library/x:1", "sha256:aa", "amd64").unwrap();
        let b = ImageKey::new("index.docker.io/library/x:2", "sha256:aa", "amd64").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.repository(), "index.docker.io/library/x");
        assert_ne!(
            a,
            ImageKey::new("docker.io/library/x:1", "sha256:aa", "arm64").unwrap()
        );
        assert_ne!(
            a,
            ImageKey::new("registry.example.com/library/x:1", "sha256:aa", "amd64").unwrap()
        );
        assert!(ImageKey::new("Not A Reference", "sha256:aa", "amd64").is_none());
    }
}
