//! Streaming a layer blob from the registry to the blocking layer reader:
//! each chunk is counted (compressed limit, declared size), hashed and sent
//! over a small bounded channel to a blocking thread that decompresses and
//! reads the tar stream (`layer::Extractor`). Memory stays at a few
//! chunks whatever the blob size. The reader sees the data before the digest
//! is known to match (it is only known at the end); it is bounded by the same
//! limits, and the layer's result is discarded unless the digest matches.

use std::{io, sync::Arc};

use bytes::{Buf as _, Bytes};
use oci_client::{Reference, manifest::OciDescriptor};
use tokio::sync::mpsc;

use crate::{
    client::{RegistryClient, RegistryError},
    config::PullFor,
    digest::Hasher,
    error::{FetchError, ManifestError},
    limits::Limit,
};

/// Chunks buffered between the download and the blocking tar reader.
pub const CHUNKS_IN_FLIGHT: usize = 16;

/// The size a descriptor declares, refused when negative.
pub fn declared_size(descriptor: &OciDescriptor) -> Result<u64, FetchError> {
    u64::try_from(descriptor.size).map_err(|_| FetchError::Manifest {
        digest: descriptor.digest.clone(),
        source: ManifestError::NegativeSize(descriptor.digest.clone()),
    })
}

/// Downloads one blob into `tx`, counting it into `compressed` (refused past
/// `max_compressed`) and hashing it. Keeps hashing to the end even when the
/// reader stopped early, so that corrupted content is reported as such
/// rather than as an unreadable layer.
pub async fn stream_blob(
    client: &RegistryClient,
    reference: &Reference,
    pull_for: PullFor<'_>,
    layer: &OciDescriptor,
    tx: mpsc::Sender<Bytes>,
    compressed: &mut u64,
    max_compressed: u64,
) -> Result<(), FetchError> {
    let declared = declared_size(layer)?;
    let mut hasher = hasher_for(&layer.digest)?;
    let registry_error =
        |error| FetchError::from_registry(reference.resolve_registry(), &layer.digest, error);
    let mut response = client
        .blob(reference, &layer.digest, pull_for)
        .await
        .map_err(registry_error)?;
    if response.content_length().is_some_and(|len| len > declared) {
        return Err(FetchError::BlobSize {
            digest: layer.digest.clone(),
            declared,
            received: response.content_length().unwrap_or_default(),
        });
    }
    let mut tx = Some(tx);
    let mut received = 0u64;
    loop {
        let chunk = response.chunk().await.map_err(|source| {
            registry_error(RegistryError::Transport {
                url: layer.digest.clone(),
                source: Arc::new(source),
            })
        })?;
        let Some(chunk) = chunk else {
            break;
        };
        let len = chunk.len() as u64;
        received += len;
        *compressed += len;
        if *compressed > max_compressed {
            return Err(FetchError::LimitExceeded {
                which: Limit::CompressedBytes,
            });
        }
        if received > declared {
            return Err(FetchError::BlobSize {
                digest: layer.digest.clone(),
                declared,
                received,
            });
        }
        hasher.update(&chunk);
        if let Some(sender) = &tx
            && sender.send(chunk).await.is_err()
        {
            // The reader is done (end of archive, or an error it reports).
            tx = None;
        }
    }
    drop(tx);
    let actual = hasher.finish();
    if actual != layer.digest {
        return Err(FetchError::DigestMismatch {
            expected: layer.digest.clone(),
            actual,
        });
    }
    if received != declared {
        return Err(FetchError::BlobSize {
            digest: layer.digest.clone(),
            declared,
            received,
        });
    }
    Ok(())
}

/// The hasher for `digest`'s algorithm; other algorithms are refused as an
/// invalid manifest.
pub fn hasher_for(digest: &str) -> Result<Hasher, FetchError> {
    Hasher::for_digest(digest).ok_or_else(|| FetchError::Manifest {
        digest: digest.to_owned(),
        source: ManifestError::DigestAlgorithm(digest.to_owned()),
    })
}

/// A blocking [`io::Read`] over the chunks of a blob arriving on a channel.
/// The end of the channel is the end of the blob (the sender checks the
/// digest; a truncated stream's layer result is discarded).
pub struct ChunkReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl ChunkReader {
    /// A reader of what arrives on `rx`.
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
        }
    }
}

impl io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Read as _;

    use super::*;
    use crate::error::FetchErrorKind;

    #[test]
    fn other_digest_algorithms_are_invalid_manifests() {
        assert!(hasher_for("sha256:x").is_ok());
        assert!(hasher_for("sha512:x").is_ok());
        assert_eq!(
            hasher_for("md5:x").err().map(|e| e.kind()),
            Some(FetchErrorKind::Manifest)
        );
        assert_eq!(
            hasher_for("nodigest").err().map(|e| e.kind()),
            Some(FetchErrorKind::Manifest)
        );
    }

    #[test]
    fn chunk_reader_reassembles_the_stream() {
        let (tx, rx) = mpsc::channel(4);
        let writer = std::thread::spawn(move || {
            for chunk in [&b"hel"[..], b"", b"lo wor", b"ld"] {
                tx.blocking_send(Bytes::from_static(chunk)).unwrap();
            }
        });
        let mut out = String::new();
        ChunkReader::new(rx).read_to_string(&mut out).unwrap();
        writer.join().unwrap();
        assert_eq!(out, "hello world");
    }
}
