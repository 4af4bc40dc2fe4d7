//! A decompression bomb must not make the layer reader allocate: with the
//! default limits, 1 GiB of zeros (about 1 MiB of gzip, 50 KiB of zstd) is
//! refused at the 512 MiB uncompressed limit while the process's peak
//! resident memory barely moves. Its own test binary, so that no other test
//! disturbs the measurement.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

use std::io::Write as _;

use elemental_changelog_registry::{
    FetchLimits, KeepFiles, Limit,
    layer::{Extractor, LayerError},
};

/// Keeps what a channel image reader keeps: the bomb is a kept file or not.
const KEEP: KeepFiles = KeepFiles {
    files: &["channel.json"],
    folders: &["changelogs"],
};

/// Peak resident set size of this process, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A tar stream of one `size`-byte file of zeros at `path`, compressed as
/// concatenated 1 MiB gzip members or zstd frames.
fn bomb(gzip: bool, path: &str, size: u64) -> Vec<u8> {
    let compress = |data: &[u8]| -> Vec<u8> {
        if gzip {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            encoder.write_all(data).unwrap();
            encoder.finish().unwrap()
        } else {
            zstd::stream::encode_all(data, 19).unwrap()
        }
    };
    let mut header = tar::Header::new_gnu();
    header.set_path(path).unwrap();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_cksum();
    let mut blob = compress(header.as_bytes());
    let zeros = compress(&vec![0; 1 << 20]);
    for _ in 0..size.div_ceil(1 << 20) {
        blob.extend_from_slice(&zeros);
    }
    blob
}

#[test]
fn bombs_are_refused_in_bounded_memory() {
    let limits = FetchLimits::default();
    for (gzip, media_type) in [
        (false, "application/vnd.oci.image.layer.v1.tar+zstd"),
        (true, "application/vnd.oci.image.layer.v1.tar+gzip"),
    ] {
        for path in ["bin/zeros", "changelogs/zeros.updates.log"] {
            let blob = bomb(gzip, path, 1 << 30);
            assert!(blob.len() < 2 << 20, "{media_type}: {} bytes", blob.len());
            let before = peak_rss();
            let result = Extractor::new(limits, KEEP).apply_layer(media_type, blob.as_slice());
            let grown = peak_rss().saturating_sub(before);
            let expected = if path.starts_with("changelogs/") {
                Limit::FileBytes
            } else {
                Limit::UncompressedBytes
            };
            assert!(
                matches!(result, Err(LayerError::LimitExceeded(which)) if which == expected),
                "{media_type} {path}: {result:?}"
            );
            assert!(
                grown < 32 << 20,
                "{media_type} {path}: peak memory grew by {grown} bytes"
            );
        }
    }
}
