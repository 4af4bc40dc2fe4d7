//! Choosing the manifest of an image index for `linux/<arch>`.

use oci_client::manifest::{ImageIndexEntry, OciImageIndex};

/// The Go (OCI) name of an architecture, accepting the kernel's names as
/// aliases: `x86_64` is `amd64`, `aarch64` is `arm64`.
pub fn normalize_arch(arch: &str) -> String {
    let arch = arch.trim().to_ascii_lowercase();
    match arch.as_str() {
        "x86_64" | "x86-64" => "amd64".to_owned(),
        "aarch64" => "arm64".to_owned(),
        "i386" | "i686" => "386".to_owned(),
        "armv7l" | "armhf" => "arm".to_owned(),
        _ => arch,
    }
}

/// The RPM name of an architecture (`x86_64`, `aarch64`), as channel data
/// and users name it, for its OCI name (`amd64`, `arm64`) or itself.
pub fn rpm_arch(arch: &str) -> &str {
    match arch {
        "amd64" => "x86_64",
        "arm64" => "aarch64",
        other => other,
    }
}

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

/// The first `linux/<arch>` entry of an index (`arch` in either naming).
pub fn select<'a>(index: &'a OciImageIndex, arch: &str) -> Option<&'a ImageIndexEntry> {
    let wanted = normalize_arch(arch);
    index.manifests.iter().find(|entry| {
        entry.platform.as_ref().is_some_and(|platform| {
            platform.os.to_string() == "linux"
                && normalize_arch(&platform.architecture.to_string()) == wanted
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

    #[test]
    fn aliases() {
        for (arch, digest) in [
            ("x86_64", "sha256:cc"),
            ("amd64", "sha256:cc"),
            ("AMD64", "sha256:cc"),
            ("aarch64", "sha256:bb"),
            ("arm64", "sha256:bb"),
        ] {
            assert_eq!(
                select(&index(), arch).map(|e| e.digest.as_str()),
                Some(digest),
                "{arch}"
            );
        }
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
