//! Choosing the manifest of an image index for `linux/<arch>`, `arch` by its
//! OCI (Go) name (`amd64`, `arm64`), as indexes spell it: callers translate
//! other spellings before they ask.

use oci_client::manifest::{ImageIndexEntry, OciImageIndex};

/// `os/arch[/variant]` of an index entry, or `unknown` when it has no platform.
pub fn describe(entry: &ImageIndexEntry) -> String {
    match &entry.platform {
        Some(platform) => match &platform.variant {
            Some(variant) => format!("{}/{}/{variant}", platform.os, platform.architecture),
            None => format!("{}/{}", platform.os, platform.architecture),
        },
        None => "unknown".to_owned(),
    }
}

/// The first `linux/<arch>` entry of an index (`arch` by its OCI name).
pub fn select<'a>(index: &'a OciImageIndex, arch: &str) -> Option<&'a ImageIndexEntry> {
    index.manifests.iter().find(|entry| {
        entry.platform.as_ref().is_some_and(|platform| {
            platform.os.to_string() == "linux" && platform.architecture.to_string() == arch
        })
    })
}

/// Every platform an index offers, for error messages.
pub fn available(index: &OciImageIndex) -> Vec<String> {
    index.manifests.iter().map(describe).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn index() -> OciImageIndex {
        serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:aa", "size": 1,
                 "platform": {"os": "unknown", "architecture": "unknown"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:bb", "size": 1,
                 "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:cc", "size": 1,
                 "platform": {"os": "linux", "architecture": "amd64"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:dd", "size": 1}
            ]
        }))
        .unwrap()
    }

    /// Other spellings (`x86_64`, `aarch64`) are the caller's to translate
    /// (`elemental_changelog_apiservice::Arch::oci`).
    #[test]
    fn matches_the_oci_name() {
        for (arch, digest) in [("amd64", "sha256:cc"), ("arm64", "sha256:bb")] {
            assert_eq!(
                select(&index(), arch).map(|e| e.digest.as_str()),
                Some(digest),
                "{arch}"
            );
        }
        assert!(select(&index(), "x86_64").is_none());
        assert!(select(&index(), "s390x").is_none());
        assert!(select(&index(), "unknown").is_none());
    }

    #[test]
    fn lists_available() {
        assert_eq!(
            available(&index()),
            [
                "unknown/unknown",
                "linux/arm64/v8",
                "linux/amd64",
                "unknown"
            ]
        );
    }
}
