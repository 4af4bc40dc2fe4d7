//! Reading files out of image layers: decompression (gzip, zstd or none),
//! tar parsing, whiteouts and limits.
//!
//! This is synchronous code (the fetcher runs it on a blocking thread, fed
//! with the blob as it streams in). Only the regular files the caller's
//! [`KeepFiles`] names are kept; everything else streams through without
//! being buffered. Every limit is checked *before* memory is committed: the
//! decompressed byte count through a counting reader, tar entries as they are
//! met, a file's size from its header before it is read.

use std::{
    collections::BTreeMap,
    io::{self, Cursor, Read},
    sync::Arc,
};

use flate2::read::MultiGzDecoder;
use tar::EntryType;

use crate::{
    budget::{BudgetError, MemoryPlan, Reservation},
    limits::{FetchLimits, KeepFiles, Limit},
};

/// Largest tar metadata entry (GNU long name, PAX header) read into memory.
pub const MAX_METADATA_BYTES: u64 = 64 * 1024;
/// Largest zstd window accepted (2^25 = 32 MiB): frames that ask for more are
/// refused instead of allocating it. Levels up to 19 use at most 2^23.
const ZSTD_WINDOW_LOG_MAX: u32 = 25;

const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";
const WHITEOUT_PREFIX: &str = ".wh.";

/// How a layer blob is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip (possibly several members).
    Gzip,
    /// zstd (possibly several frames).
    Zstd,
}

impl Compression {
    /// The compression a layer media type declares, or `None` (the Rust
    /// `Option`) when the media type is not a known image layer type.
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Some(Self::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Self::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Self::Zstd),
            _ => None,
        }
    }

    /// The compression the first bytes of a blob reveal (gzip and zstd have
    /// magic numbers; anything else is taken for a plain tar stream, which
    /// the tar reader then validates).
    pub fn from_magic(head: &[u8]) -> Self {
        match head {
            [0x1f, 0x8b, ..] => Self::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Self::Zstd,
            _ => Self::None,
        }
    }
}

/// Why a layer could not be read.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LayerError {
    /// The media type is not an image layer type this reader knows.
    #[error("unsupported layer media type {media_type:?}")]
    UnsupportedMediaType {
        /// The descriptor's media type.
        media_type: String,
    },
    /// A limit was exceeded while reading.
    #[error("limit on {0} exceeded")]
    LimitExceeded(Limit),
    /// The memory budget cannot hold the kept files.
    #[error("the memory budget cannot hold the kept files")]
    Budget(#[source] BudgetError),
    /// The blob is not a valid (compressed) tar stream, or the stream feeding
    /// it failed.
    #[error("invalid layer data")]
    Read {
        /// What the decompressor or the tar reader reported.
        #[source]
        source: Arc<io::Error>,
    },
}

impl From<io::Error> for LayerError {
    fn from(source: io::Error) -> Self {
        Self::Read {
            source: Arc::new(source),
        }
    }
}

/// The files kept from the layers applied so far, with the running counts
/// the limits apply to. Apply the layers of an image in manifest order with
/// [`Extractor::apply_layer`], then take the result with
/// [`Extractor::into_files`].
#[derive(Debug)]
pub struct Extractor {
    limits: FetchLimits,
    keep: KeepFiles,
    files: BTreeMap<String, Vec<u8>>,
    kept_bytes: u64,
    uncompressed_bytes: u64,
    entries: u64,
    /// Memory reserved for this pull, grown as files are kept, and what it
    /// held before the first file.
    memory: Option<(Reservation, u64)>,
}

impl Extractor {
    /// An empty file system, checked against `limits`, keeping the files
    /// `keep` names.
    pub fn new(limits: FetchLimits, keep: KeepFiles) -> Self {
        Self {
            limits,
            keep,
            files: BTreeMap::new(),
            kept_bytes: 0,
            uncompressed_bytes: 0,
            entries: 0,
            memory: None,
        }
    }

    /// [`Extractor::new`], keeping files only as far as `memory` can grow
    /// from the budget to hold them (besides what it holds already).
    pub fn with_memory(limits: FetchLimits, keep: KeepFiles, memory: Reservation) -> Self {
        let base = memory.bytes();
        Self {
            memory: Some((memory, base)),
            ..Self::new(limits, keep)
        }
    }

    /// The kept files and the reservation holding them (see
    /// [`Extractor::with_memory`]).
    pub fn into_parts(self) -> (Vec<(String, Vec<u8>)>, Option<Reservation>) {
        (
            self.files.into_iter().collect(),
            self.memory.map(|(memory, _)| memory),
        )
    }

    /// Decompressed bytes read so far, over all layers.
    pub fn uncompressed_bytes(&self) -> u64 {
        self.uncompressed_bytes
    }

    /// The kept files, sorted by path.
    pub fn into_files(self) -> Vec<(String, Vec<u8>)> {
        self.files.into_iter().collect()
    }

    /// Applies one layer on top of the previous ones: its whiteouts remove
    /// files of the layers below, its files replace theirs.
    ///
    /// The compression is detected from the blob's magic bytes; a media type
    /// that declares another compression is logged and the bytes win (some
    /// builders push plain or zstd tar streams under Docker's gzip type).
    ///
    /// Consumes the extractor: after an error its state is meaningless.
    pub fn apply_layer(
        mut self,
        media_type: &str,
        mut blob: impl Read,
    ) -> Result<Self, LayerError> {
        let declared = Compression::from_media_type(media_type).ok_or_else(|| {
            LayerError::UnsupportedMediaType {
                media_type: media_type.to_owned(),
            }
        })?;
        let mut head = [0u8; 4];
        let head_len = read_up_to(&mut blob, &mut head)?;
        let head = &head[..head_len];
        let detected = Compression::from_magic(head);
        if detected != declared {
            tracing::warn!(
                media_type,
                ?declared,
                ?detected,
                "layer compression differs from its media type"
            );
        }
        let source = Cursor::new(head.to_vec()).chain(blob);
        let decompressed: Box<dyn Read + '_> = match detected {
            Compression::None => Box::new(source),
            Compression::Gzip => Box::new(MultiGzDecoder::new(source)),
            Compression::Zstd => {
                let mut decoder = zstd::stream::read::Decoder::new(source)?;
                decoder.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
                Box::new(decoder)
            }
        };
        let budget = self
            .limits
            .max_uncompressed_bytes
            .saturating_sub(self.uncompressed_bytes);
        let mut archive = tar::Archive::new(Counting::new(decompressed, budget));
        let mut layer = BTreeMap::new();
        let result = self.read_entries(&mut archive, &mut layer);
        let counting = archive.into_inner();
        self.uncompressed_bytes = self.uncompressed_bytes.saturating_add(counting.read);
        if counting.exceeded {
            return Err(LayerError::LimitExceeded(Limit::UncompressedBytes));
        }
        result?;
        // Paths this layer wrote were already removed from the layers below.
        self.files.append(&mut layer);
        Ok(self)
    }

    /// Reads the entries of one layer: whiteouts remove files of the layers
    /// below, kept files go to `layer`.
    fn read_entries<R: Read>(
        &mut self,
        archive: &mut tar::Archive<R>,
        layer: &mut BTreeMap<String, Vec<u8>>,
    ) -> Result<(), LayerError> {
        let mut pending = PendingName::default();
        let mut unsafe_entries = UnsafeEntries::default();
        // Raw entries: GNU long names and PAX headers are handled here, with a
        // size limit, instead of being read whole by the tar crate.
        for entry in archive.entries()?.raw(true) {
            let mut entry = entry?;
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(LayerError::LimitExceeded(Limit::Entries));
            }
            let entry_type = entry.header().entry_type();
            if self.read_name_entry(&mut entry, entry_type, &mut pending)? {
                continue;
            }
            let raw_path = pending
                .take()
                .unwrap_or_else(|| entry.path_bytes().into_owned());
            let Some(path) = safe_path(&raw_path, &mut unsafe_entries) else {
                continue;
            };
            if self.apply_whiteout(&path) {
                continue;
            }
            let is_dir = entry_type == EntryType::Directory;
            self.hide(layer, &path, is_dir);
            let is_file = matches!(entry_type, EntryType::Regular | EntryType::Continuous);
            let kept = self.keep.keeps(&path);
            if !is_file || !kept {
                if !is_file && !is_dir && kept {
                    unsafe_entries.note(&format!("{path} ({entry_type:?})"));
                }
                continue;
            }
            self.keep_file(&mut entry, path, layer)?;
        }
        unsafe_entries.report();
        Ok(())
    }

    /// Reads a GNU long name or PAX header into `pending` (they name the next
    /// entry). True when `entry` was an entry of that kind, or another that
    /// only carries metadata.
    fn read_name_entry<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        entry_type: EntryType,
        pending: &mut PendingName,
    ) -> Result<bool, LayerError> {
        match entry_type {
            EntryType::GNULongName => {
                let size = entry.header().size()?;
                let mut name = self.read_metadata(entry, size)?;
                while name.last() == Some(&0) {
                    name.pop();
                }
                pending.long_name = Some(name);
            }
            EntryType::XHeader => {
                let size = entry.header().size()?;
                let data = self.read_metadata(entry, size)?;
                pending.pax_path = tar::PaxExtensions::new(&data)
                    .filter_map(Result::ok)
                    .filter(|ext| ext.key_bytes() == b"path")
                    .last()
                    .map(|ext| ext.value_bytes().to_vec());
            }
            // The link target is never needed: links are not followed.
            EntryType::GNULongLink | EntryType::XGlobalHeader => {}
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies `path` if it is a whiteout (opaque: the folder's content
    /// below goes; `.wh.<name>`: `<name>` below goes). True when it was one.
    fn apply_whiteout(&mut self, path: &str) -> bool {
        let (dir, name) = match path.rsplit_once('/') {
            Some((dir, name)) => (Some(dir), name),
            None => (None, path),
        };
        if name == OPAQUE_WHITEOUT {
            match dir {
                Some(dir) => self.remove_children_below(dir),
                None => self.remove_all_below(),
            }
            return true;
        }
        let Some(target) = name.strip_prefix(WHITEOUT_PREFIX) else {
            return false;
        };
        // `.wh..wh.*` other than the opaque marker is AUFS bookkeeping.
        if !target.is_empty() && !target.starts_with(WHITEOUT_PREFIX) {
            let target = match dir {
                Some(dir) => format!("{dir}/{target}"),
                None => target.to_owned(),
            };
            self.remove_below(&target);
            self.remove_children_below(&target);
        }
        true
    }

    /// Any entry hides what the layers below and the earlier entries of this
    /// layer had at its path; only a directory keeps their children
    /// (directories merge).
    fn hide(&mut self, layer: &mut BTreeMap<String, Vec<u8>>, path: &str, is_dir: bool) {
        self.remove_below(path);
        self.kept_bytes -= remove_file(layer, path);
        if !is_dir {
            self.remove_children_below(path);
            self.kept_bytes -= remove_children(layer, path);
        }
    }

    /// Reads a kept file into `layer`, within the size limits
    /// and the memory the pull may grow to.
    fn keep_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        path: String,
        layer: &mut BTreeMap<String, Vec<u8>>,
    ) -> Result<(), LayerError> {
        let size = entry.header().size()?;
        if size > self.limits.max_file_bytes {
            return Err(LayerError::LimitExceeded(Limit::FileBytes));
        }
        if self.kept_bytes.saturating_add(size) > self.limits.max_kept_bytes {
            return Err(LayerError::LimitExceeded(Limit::KeptBytes));
        }
        if let Some((memory, base)) = &mut self.memory {
            let needed = MemoryPlan::while_keeping(*base, self.kept_bytes + size);
            if needed > memory.bytes() {
                memory
                    .try_grow(needed - memory.bytes())
                    .map_err(LayerError::Budget)?;
            }
        }
        let data = read_exact_size(entry, size)?;
        self.kept_bytes += size;
        layer.insert(path, data);
        Ok(())
    }

    /// Reads a tar metadata entry (long name, PAX records) with a size limit.
    fn read_metadata(&self, entry: &mut impl Read, size: u64) -> Result<Vec<u8>, LayerError> {
        if size > MAX_METADATA_BYTES.min(self.limits.max_file_bytes) {
            return Err(LayerError::LimitExceeded(Limit::FileBytes));
        }
        Ok(read_exact_size(entry, size)?)
    }

    /// Removes, from the layers below, the file at `path`.
    fn remove_below(&mut self, path: &str) {
        self.kept_bytes -= remove_file(&mut self.files, path);
    }

    /// Removes, from the layers below, everything under the folder `path`.
    fn remove_children_below(&mut self, path: &str) {
        self.kept_bytes -= remove_children(&mut self.files, path);
    }

    /// An opaque whiteout at the root: nothing of the layers below stays.
    fn remove_all_below(&mut self) {
        for data in std::mem::take(&mut self.files).into_values() {
            self.kept_bytes -= data.len() as u64;
        }
    }
}

/// Removes the file at `path` from `files`; returns its size.
fn remove_file(files: &mut BTreeMap<String, Vec<u8>>, path: &str) -> u64 {
    files.remove(path).map_or(0, |old| old.len() as u64)
}

/// Removes everything under the folder `path` from `files`; returns their size.
fn remove_children(files: &mut BTreeMap<String, Vec<u8>>, path: &str) -> u64 {
    let prefix = format!("{path}/");
    let children: Vec<String> = files
        .range(prefix.clone()..)
        .take_while(|(key, _)| key.starts_with(&prefix))
        .map(|(key, _)| key.clone())
        .collect();
    children.iter().map(|child| remove_file(files, child)).sum()
}

/// A GNU long name or PAX path read from a metadata entry: the path of the
/// next entry.
#[derive(Default)]
struct PendingName {
    long_name: Option<Vec<u8>>,
    pax_path: Option<Vec<u8>>,
}

impl PendingName {
    /// The pending path (a PAX path wins over a long name); both are used up.
    fn take(&mut self) -> Option<Vec<u8>> {
        let pax_path = self.pax_path.take();
        let long_name = self.long_name.take();
        pax_path.or(long_name)
    }
}

/// Entries skipped as unsafe: counted, the first few paths kept, warned about
/// once per layer.
#[derive(Default)]
struct UnsafeEntries {
    count: u64,
    examples: Vec<String>,
}

impl UnsafeEntries {
    fn note(&mut self, path: &str) {
        const EXAMPLES: usize = 3;
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(path.to_owned());
        }
    }

    fn report(&self) {
        if self.count > 0 {
            tracing::warn!(
                count = self.count,
                examples = ?self.examples,
                "ignored layer entries: paths leaving the image root (`..`), not UTF-8 or with NUL, \
                 or links and special files where kept files are read"
            );
        }
    }
}

/// `raw` normalised (see [`normalize_path`]); `None`, noted as unsafe unless
/// it names the root, when it cannot be used.
fn safe_path(raw: &[u8], unsafe_entries: &mut UnsafeEntries) -> Option<String> {
    let path = normalize_path(raw);
    if path.is_none() {
        let shown = String::from_utf8_lossy(raw);
        if raw
            .split(|b| *b == b'/')
            .all(|part| part.is_empty() || part == b".")
        {
            tracing::debug!(path = %shown, "ignoring the layer's root entry");
        } else {
            unsafe_entries.note(&shown);
        }
    }
    path
}

/// Normalises a tar entry path to `a/b/c`: leading `/` and `./` stripped,
/// `.` and empty components dropped. `None` for paths that are not UTF-8,
/// that contain a `..` component, or that name the root.
pub fn normalize_path(raw: &[u8]) -> Option<String> {
    let raw = std::str::from_utf8(raw).ok()?;
    let mut parts = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            part if part.contains('\0') => return None,
            part => parts.push(part),
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

/// Reads exactly `size` bytes (at most the limit checked by the caller).
fn read_exact_size(reader: &mut impl Read, size: u64) -> io::Result<Vec<u8>> {
    let capacity = usize::try_from(size).map_err(io::Error::other)?;
    let mut data = Vec::with_capacity(capacity);
    reader.take(size).read_to_end(&mut data)?;
    if data.len() != capacity {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(data)
}

/// Fills `buf` as far as the reader allows; returns how much was read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

/// Counts the bytes read through it and fails once more than `budget` bytes
/// would pass (remembering that it did, so the caller can tell a limit from a
/// broken stream).
struct Counting<R> {
    inner: R,
    budget: u64,
    read: u64,
    exceeded: bool,
}

impl<R> Counting<R> {
    fn new(inner: R, budget: u64) -> Self {
        Self {
            inner,
            budget,
            read: 0,
            exceeded: false,
        }
    }
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.exceeded {
            return Err(io::Error::other("decompressed size limit exceeded"));
        }
        // Ask for one byte more than allowed, to tell "exactly at the limit"
        // from "over it".
        let allowed = self.budget - self.read;
        let want = usize::try_from(allowed.saturating_add(1))
            .map_or(buf.len(), |allowed| allowed.min(buf.len()));
        let n = self.inner.read(&mut buf[..want])?;
        if n as u64 > allowed {
            self.exceeded = true;
            return Err(io::Error::other("decompressed size limit exceeded"));
        }
        self.read += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Write as _;

    use proptest::prelude::*;

    use super::*;

    const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    /// What a channel image's reader keeps: the tests' files are named like channel data.
    const KEEP: KeepFiles = KeepFiles {
        files: &["channel.json"],
        folders: &["changelogs"],
    };
    const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    const DOCKER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

    /// One tar entry, written with its name as raw bytes (so tests can use
    /// names the tar crate's builder refuses, such as `..` components).
    enum E<'a> {
        File(&'a str, &'a [u8]),
        Dir(&'a str),
        Symlink(&'a str, &'a str),
        HardLink(&'a str, &'a str),
        Fifo(&'a str),
        Char(&'a str),
        /// A file whose name comes from a GNU long-name entry.
        LongFile(&'a str, &'a [u8]),
        /// A file whose name comes from a PAX `path` record.
        PaxFile(&'a str, &'a [u8]),
    }

    fn raw(
        builder: &mut tar::Builder<Vec<u8>>,
        name: &[u8],
        kind: EntryType,
        data: &[u8],
        link: &[u8],
    ) {
        let mut header = tar::Header::new_gnu();
        let old = header.as_old_mut();
        old.name[..name.len()].copy_from_slice(name);
        old.linkname[..link.len()].copy_from_slice(link);
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }

    fn tar(entries: &[E<'_>]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for entry in entries {
            match entry {
                E::File(name, data) => {
                    raw(&mut builder, name.as_bytes(), EntryType::Regular, data, b"")
                }
                E::Dir(name) => raw(
                    &mut builder,
                    name.as_bytes(),
                    EntryType::Directory,
                    b"",
                    b"",
                ),
                E::Symlink(name, to) => raw(
                    &mut builder,
                    name.as_bytes(),
                    EntryType::Symlink,
                    b"",
                    to.as_bytes(),
                ),
                E::HardLink(name, to) => raw(
                    &mut builder,
                    name.as_bytes(),
                    EntryType::Link,
                    b"",
                    to.as_bytes(),
                ),
                E::Fifo(name) => raw(&mut builder, name.as_bytes(), EntryType::Fifo, b"", b""),
                E::Char(name) => raw(&mut builder, name.as_bytes(), EntryType::Char, b"", b""),
                E::LongFile(name, data) => {
                    let mut long = name.as_bytes().to_vec();
                    long.push(0);
                    raw(
                        &mut builder,
                        b"././@LongLink",
                        EntryType::GNULongName,
                        &long,
                        b"",
                    );
                    raw(
                        &mut builder,
                        &name.as_bytes()[..90],
                        EntryType::Regular,
                        data,
                        b"",
                    );
                }
                E::PaxFile(name, data) => {
                    let record = pax_record("path", name);
                    raw(
                        &mut builder,
                        b"PaxHeaders/x",
                        EntryType::XHeader,
                        record.as_bytes(),
                        b"",
                    );
                    raw(
                        &mut builder,
                        b"truncated-name",
                        EntryType::Regular,
                        data,
                        b"",
                    );
                }
            }
        }
        builder.into_inner().unwrap()
    }

    fn pax_record(key: &str, value: &str) -> String {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while len.to_string().len() + body.len() != len {
            len += 1;
        }
        format!("{len}{body}")
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::stream::encode_all(data, 3).unwrap()
    }

    fn extract(layers: &[(&str, Vec<u8>)]) -> Result<Vec<(String, Vec<u8>)>, LayerError> {
        extract_with(FetchLimits::default(), layers)
    }

    fn extract_with(
        limits: FetchLimits,
        layers: &[(&str, Vec<u8>)],
    ) -> Result<Vec<(String, Vec<u8>)>, LayerError> {
        let mut extractor = Extractor::new(limits, KEEP);
        for (media_type, blob) in layers {
            extractor = extractor.apply_layer(media_type, blob.as_slice())?;
        }
        Ok(extractor.into_files())
    }

    fn names(files: &[(String, Vec<u8>)]) -> Vec<&str> {
        files.iter().map(|(name, _)| name.as_str()).collect()
    }

    fn channel_layer() -> Vec<u8> {
        tar(&[
            E::Dir("bin/"),
            E::File("bin/busybox", &[0x7f; 4096]),
            E::File("channel.json", b"[]"),
            E::Dir("changelogs/"),
            E::File("changelogs/v1.updates.log", b"[1]"),
            E::File("changelogs/v2.updates.log", b"[2]"),
            E::File("etc/passwd", b"root:x:0:0"),
            E::File("changelogsx", b"not kept"),
        ])
    }

    #[test]
    fn keeps_channel_data_from_every_compression() {
        let plain = channel_layer();
        for (media_type, blob) in [
            (TAR, plain.clone()),
            (GZIP, gzip(&plain)),
            (ZSTD, zstd(&plain)),
            (DOCKER_GZIP, gzip(&plain)),
            // Bytes win over a media type that says otherwise.
            (DOCKER_GZIP, zstd(&plain)),
            (TAR, gzip(&plain)),
            (GZIP, plain.clone()),
        ] {
            let files = extract(&[(media_type, blob)]).unwrap();
            assert_eq!(
                names(&files),
                [
                    "changelogs/v1.updates.log",
                    "changelogs/v2.updates.log",
                    "channel.json"
                ],
                "{media_type}"
            );
            assert_eq!(files[2].1, b"[]");
        }
    }

    #[test]
    fn concatenated_gzip_members_and_zstd_frames() {
        let plain = tar(&[E::File("channel.json", b"[1,2,3]")]);
        let (first, second) = plain.split_at(700);
        let mut members = gzip(first);
        members.extend(gzip(second));
        let mut frames = zstd(first);
        frames.extend(zstd(second));
        for (media_type, blob) in [(GZIP, members), (ZSTD, frames)] {
            assert_eq!(
                extract(&[(media_type, blob)]).unwrap(),
                [("channel.json".to_owned(), b"[1,2,3]".to_vec())]
            );
        }
    }

    #[test]
    fn empty_blob_and_empty_tar() {
        assert!(extract(&[(TAR, Vec::new())]).unwrap().is_empty());
        assert!(extract(&[(GZIP, gzip(&tar(&[])))]).unwrap().is_empty());
    }

    #[test]
    fn rejects_unknown_media_types_and_garbage() {
        let blob = channel_layer();
        assert!(matches!(
            extract(&[("application/vnd.oci.image.config.v1+json", blob)]),
            Err(LayerError::UnsupportedMediaType { media_type }) if media_type == "application/vnd.oci.image.config.v1+json"
        ));
        let mut corrupt = gzip(&channel_layer());
        let middle = corrupt.len() / 2;
        corrupt[middle] ^= 0xff;
        corrupt.truncate(middle + 10);
        assert!(matches!(
            extract(&[(GZIP, corrupt)]),
            Err(LayerError::Read { .. })
        ));
        let mut bad_header = channel_layer();
        bad_header[148] ^= 0x55; // checksum field
        assert!(matches!(
            extract(&[(TAR, bad_header)]),
            Err(LayerError::Read { .. })
        ));
    }

    #[test]
    fn later_layers_win() {
        let files = extract(&[
            (
                GZIP,
                gzip(&tar(&[
                    E::File("channel.json", b"old"),
                    E::File("changelogs/a", b"a1"),
                ])),
            ),
            (ZSTD, zstd(&tar(&[E::File("./channel.json", b"new")]))),
            (TAR, tar(&[E::File("changelogs/b", b"b3")])),
        ])
        .unwrap();
        assert_eq!(
            files,
            [
                ("changelogs/a".to_owned(), b"a1".to_vec()),
                ("changelogs/b".to_owned(), b"b3".to_vec()),
                ("channel.json".to_owned(), b"new".to_vec()),
            ]
        );
    }

    #[test]
    fn same_path_twice_in_one_layer_keeps_the_last() {
        let files = extract(&[(
            TAR,
            tar(&[
                E::File("channel.json", b"first"),
                E::File("channel.json", b"second"),
            ]),
        )])
        .unwrap();
        assert_eq!(files, [("channel.json".to_owned(), b"second".to_vec())]);
    }

    #[test]
    fn whiteouts_delete_files_and_folders_below() {
        let base = tar(&[
            E::File("channel.json", b"[]"),
            E::File("changelogs/a", b"a"),
            E::File("changelogs/b", b"b"),
            E::File("changelogs/sub/c", b"c"),
        ]);
        let files = extract(&[
            (TAR, base.clone()),
            (TAR, tar(&[E::File("changelogs/.wh.a", b"")])),
        ])
        .unwrap();
        assert_eq!(
            names(&files),
            ["changelogs/b", "changelogs/sub/c", "channel.json"]
        );

        let files = extract(&[
            (TAR, base.clone()),
            (TAR, tar(&[E::File("changelogs/.wh.sub", b"")])),
        ])
        .unwrap();
        assert_eq!(
            names(&files),
            ["changelogs/a", "changelogs/b", "channel.json"]
        );

        let files = extract(&[
            (TAR, base.clone()),
            (TAR, tar(&[E::File(".wh.channel.json", b"")])),
        ])
        .unwrap();
        assert_eq!(
            names(&files),
            ["changelogs/a", "changelogs/b", "changelogs/sub/c"]
        );

        // The folder is whited out and recreated in the same layer.
        let files = extract(&[
            (TAR, base.clone()),
            (
                TAR,
                tar(&[
                    E::File(".wh.changelogs", b""),
                    E::File("changelogs/new", b"n"),
                ]),
            ),
        ])
        .unwrap();
        assert_eq!(names(&files), ["changelogs/new", "channel.json"]);

        // A whiteout only hides lower layers, never a file of its own layer.
        let files = extract(&[(
            TAR,
            tar(&[
                E::File("changelogs/a", b"a"),
                E::File("changelogs/.wh.a", b""),
            ]),
        )])
        .unwrap();
        assert_eq!(names(&files), ["changelogs/a"]);

        // AUFS bookkeeping entries are neither whiteouts nor kept.
        let files = extract(&[
            (TAR, base),
            (TAR, tar(&[E::File("changelogs/.wh..wh.plnk", b"")])),
        ])
        .unwrap();
        assert_eq!(names(&files).len(), 4);
    }

    #[test]
    fn opaque_folders_hide_everything_below_in_them() {
        let base = tar(&[
            E::File("channel.json", b"[]"),
            E::File("changelogs/a", b"a"),
            E::File("changelogs/b", b"b"),
        ]);
        for upper in [
            tar(&[
                E::File("changelogs/.wh..wh..opq", b""),
                E::File("changelogs/c", b"c"),
            ]),
            // The marker may come after the layer's own files of that folder.
            tar(&[
                E::File("changelogs/c", b"c"),
                E::File("changelogs/.wh..wh..opq", b""),
            ]),
        ] {
            let files = extract(&[(TAR, base.clone()), (TAR, upper)]).unwrap();
            assert_eq!(names(&files), ["changelogs/c", "channel.json"]);
        }
        let files = extract(&[(TAR, base), (TAR, tar(&[E::File(".wh..wh..opq", b"")]))]).unwrap();
        assert!(files.is_empty());
    }

    #[test]
    fn entries_replace_lower_ones_of_another_type() {
        let base = tar(&[
            E::File("channel.json", b"[]"),
            E::File("changelogs/a", b"a"),
        ]);
        // A symlink hides the file below; it is not followed.
        let files = extract(&[
            (TAR, base.clone()),
            (TAR, tar(&[E::Symlink("channel.json", "/etc/passwd")])),
        ])
        .unwrap();
        assert_eq!(names(&files), ["changelogs/a"]);
        // A file replacing a folder hides its children.
        let files = extract(&[
            (TAR, base.clone()),
            (TAR, tar(&[E::File("changelogs", b"flat")])),
        ])
        .unwrap();
        assert_eq!(names(&files), ["channel.json"]);
        // A folder entry merges with the folder below.
        let files = extract(&[(TAR, base), (TAR, tar(&[E::Dir("changelogs/")]))]).unwrap();
        assert_eq!(names(&files), ["changelogs/a", "channel.json"]);
    }

    #[test]
    fn ignores_traversal_links_and_devices() {
        let files = extract(&[(
            TAR,
            tar(&[
                E::File("changelogs/", b""),
                E::File("", b""),
                E::File("../channel.json", b"evil"),
                E::File("changelogs/../../etc/x", b"evil"),
                E::File("changelogs/a/../../../b", b"evil"),
                E::Symlink("changelogs/link", "/etc/shadow"),
                E::Symlink("changelogs/rel", "../channel.json"),
                E::HardLink("changelogs/hard", "etc/shadow"),
                E::Fifo("changelogs/fifo"),
                E::Char("changelogs/tty"),
                E::File("/changelogs/abs", b"abs"),
                E::File(".//./changelogs//dots", b"dots"),
            ]),
        )])
        .unwrap();
        assert_eq!(
            files,
            [
                ("changelogs/abs".to_owned(), b"abs".to_vec()),
                ("changelogs/dots".to_owned(), b"dots".to_vec()),
            ]
        );
    }

    #[test]
    fn long_names_from_gnu_and_pax_entries() {
        let long = format!("changelogs/{}.updates.log", "x".repeat(150));
        let files = extract(&[(
            GZIP,
            gzip(&tar(&[
                E::LongFile(&long, b"gnu"),
                E::PaxFile("changelogs/pax.updates.log", b"pax"),
                E::PaxFile("../escape", b"evil"),
            ])),
        )])
        .unwrap();
        assert_eq!(
            files,
            [
                ("changelogs/pax.updates.log".to_owned(), b"pax".to_vec()),
                (long.clone(), b"gnu".to_vec())
            ]
        );
    }

    #[test]
    fn huge_metadata_entries_are_refused_before_reading() {
        let mut builder = tar::Builder::new(Vec::new());
        raw(
            &mut builder,
            b"././@LongLink",
            EntryType::GNULongName,
            &vec![b'a'; 2 * MAX_METADATA_BYTES as usize],
            b"",
        );
        let blob = builder.into_inner().unwrap();
        assert!(matches!(
            extract(&[(TAR, blob)]),
            Err(LayerError::LimitExceeded(Limit::FileBytes))
        ));
    }

    #[test]
    fn file_size_limit() {
        let limits = FetchLimits {
            max_file_bytes: 10,
            ..FetchLimits::default()
        };
        let ok = tar(&[
            E::File("channel.json", &[b' '; 10]),
            E::File("bin/big", &[0; 4096]),
        ]);
        assert_eq!(extract_with(limits, &[(TAR, ok)]).unwrap().len(), 1);
        let over = tar(&[E::File("changelogs/a", &[b' '; 11])]);
        assert!(matches!(
            extract_with(limits, &[(TAR, over)]),
            Err(LayerError::LimitExceeded(Limit::FileBytes))
        ));
    }

    #[test]
    fn kept_bytes_limit_counts_what_stays() {
        let limits = FetchLimits {
            max_kept_bytes: 10,
            ..FetchLimits::default()
        };
        // Replacing a file frees what the old one took.
        let layers = [
            (TAR, tar(&[E::File("channel.json", &[b' '; 8])])),
            (TAR, tar(&[E::File("channel.json", &[b' '; 9])])),
            (
                TAR,
                tar(&[
                    E::File("changelogs/.wh.none", b""),
                    E::File("changelogs/a", b"a"),
                ]),
            ),
        ];
        assert_eq!(extract_with(limits, &layers).unwrap().len(), 2);
        let over = [(
            TAR,
            tar(&[
                E::File("channel.json", &[b' '; 6]),
                E::File("changelogs/a", &[b' '; 5]),
            ]),
        )];
        assert!(matches!(
            extract_with(limits, &over),
            Err(LayerError::LimitExceeded(Limit::KeptBytes))
        ));
    }

    #[test]
    fn entry_limit_spans_layers() {
        let limits = FetchLimits {
            max_entries: 5,
            ..FetchLimits::default()
        };
        let three = tar(&[E::Dir("a/"), E::Dir("b/"), E::Dir("c/")]);
        assert!(extract_with(limits, &[(TAR, three.clone())]).is_ok());
        assert!(matches!(
            extract_with(limits, &[(TAR, three.clone()), (TAR, three)]),
            Err(LayerError::LimitExceeded(Limit::Entries))
        ));
    }

    #[test]
    fn uncompressed_limit_is_exact() {
        let blob = tar(&[E::File("channel.json", b"[]")]);
        let exact = FetchLimits {
            max_uncompressed_bytes: blob.len() as u64 - 512,
            ..FetchLimits::default()
        };
        let extractor = Extractor::new(exact, KEEP)
            .apply_layer(TAR, blob.as_slice())
            .unwrap();
        // The tar reader stops at the first end-of-archive block.
        assert_eq!(extractor.uncompressed_bytes(), blob.len() as u64 - 512);
        let short = FetchLimits {
            max_uncompressed_bytes: blob.len() as u64 - 513,
            ..FetchLimits::default()
        };
        assert!(matches!(
            Extractor::new(short, KEEP).apply_layer(TAR, blob.as_slice()),
            Err(LayerError::LimitExceeded(Limit::UncompressedBytes))
        ));
    }

    /// Counts how many compressed bytes the extractor pulled.
    struct Tally<R> {
        inner: R,
        read: u64,
    }

    impl<R: Read> Read for Tally<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }

    /// A layer whose tar stream is one 1 GiB file of zeros, as concatenated
    /// members/frames of 1 MiB: about 1 MiB compressed.
    fn bomb(name: &str, compress: fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
        const MIB: usize = 1 << 20;
        let mut header = tar::Header::new_gnu();
        header.set_path(name).unwrap();
        header.set_size(1 << 30);
        header.set_mode(0o644);
        header.set_cksum();
        let mut first = header.as_bytes().to_vec();
        first.resize(512 + MIB, 0);
        let mut blob = compress(&first);
        let zeros = compress(&vec![0; MIB]);
        for _ in 1..1024 {
            blob.extend_from_slice(&zeros);
        }
        blob
    }

    #[test]
    fn decompression_bombs_stop_at_the_limit() {
        let limits = FetchLimits {
            max_uncompressed_bytes: 64 << 20,
            ..FetchLimits::default()
        };
        for (media_type, compress) in [(GZIP, gzip as fn(&[u8]) -> Vec<u8>), (ZSTD, zstd)] {
            let blob = bomb("bin/zeros", compress);
            assert!(blob.len() < 8 << 20, "{media_type}: {} bytes", blob.len());
            let mut tally = Tally {
                inner: blob.as_slice(),
                read: 0,
            };
            let result = Extractor::new(limits, KEEP).apply_layer(media_type, &mut tally);
            assert!(
                matches!(
                    result,
                    Err(LayerError::LimitExceeded(Limit::UncompressedBytes))
                ),
                "{media_type}: {result:?}"
            );
            // gzip stopped early (about 1/16 of the stream); zstd shrinks 1 GiB
            // of zeros to ~50 KiB, which its decoder reads in a few gulps.
            if media_type == GZIP {
                assert!(
                    tally.read < blob.len() as u64 / 4,
                    "read {} of {}",
                    tally.read,
                    blob.len()
                );
            }
        }
    }

    #[test]
    fn a_huge_kept_file_is_refused_from_its_header() {
        let blob = bomb("channel.json", gzip);
        let mut tally = Tally {
            inner: blob.as_slice(),
            read: 0,
        };
        let result = Extractor::new(FetchLimits::default(), KEEP).apply_layer(GZIP, &mut tally);
        assert!(
            matches!(result, Err(LayerError::LimitExceeded(Limit::FileBytes))),
            "{result:?}"
        );
        assert!(tally.read < 64 * 1024, "read {}", tally.read);
    }

    #[test]
    fn zstd_windows_over_the_maximum_are_refused() {
        let plain = tar(&[E::File("channel.json", b"[]")]);
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        encoder
            .set_parameter(zstd::zstd_safe::CParameter::WindowLog(27))
            .unwrap();
        encoder.set_pledged_src_size(None).unwrap();
        encoder.write_all(&plain).unwrap();
        let blob = encoder.finish().unwrap();
        // With an unknown content size the decoder must honour the window.
        assert!(matches!(
            extract(&[(ZSTD, blob)]),
            Err(LayerError::Read { .. })
        ));
    }

    #[test]
    fn path_normalisation() {
        assert_eq!(
            normalize_path(b"./channel.json").as_deref(),
            Some("channel.json")
        );
        assert_eq!(
            normalize_path(b"/changelogs//a/./b").as_deref(),
            Some("changelogs/a/b")
        );
        assert_eq!(
            normalize_path(b"changelogs/"),
            Some("changelogs".to_owned())
        );
        assert_eq!(normalize_path(b"a/../b"), None);
        assert_eq!(normalize_path(b".."), None);
        assert_eq!(normalize_path(b"./"), None);
        assert_eq!(normalize_path(b"/"), None);
        assert_eq!(normalize_path(b"\xff\xfe"), None);
        assert_eq!(normalize_path(b"..."), Some("...".to_owned()));
        assert!(KEEP.keeps("channel.json"));
        assert!(KEEP.keeps("changelogs/a.updates.log"));
        assert!(KEEP.keeps("changelogs/sub/updateinfo.xml.zst"));
        assert!(!KEEP.keeps("changelogs"));
        assert!(!KEEP.keeps("changelogsx/a"));
        assert!(!KEEP.keeps("etc/channel.json"));
    }

    proptest! {
        #[test]
        fn normalised_paths_are_clean(raw in proptest::collection::vec(
            prop::sample::select(vec!["", ".", "..", "/", "a", "changelogs", "channel.json", ".wh.x", "\u{e9}"]), 0..8)
        ) {
            let joined = raw.join("/");
            if let Some(path) = normalize_path(joined.as_bytes()) {
                prop_assert!(!path.starts_with('/'));
                prop_assert!(!path.ends_with('/'));
                prop_assert!(path.split('/').all(|part| !part.is_empty() && part != "." && part != ".."));
                prop_assert_eq!(normalize_path(path.as_bytes()), Some(path.clone()));
            }
        }

        /// Whatever bytes a layer holds, reading it ends without panicking,
        /// within the limits.
        #[test]
        fn arbitrary_layers_never_panic(blob in proptest::collection::vec(any::<u8>(), 0..4096), gz in any::<bool>()) {
            let limits = FetchLimits { max_uncompressed_bytes: 1 << 20, ..FetchLimits::default() };
            let blob = if gz { gzip(&blob) } else { blob };
            if let Ok(extractor) = Extractor::new(limits, KEEP).apply_layer(GZIP, blob.as_slice()) {
                prop_assert!(extractor.uncompressed_bytes() <= 1 << 20);
            }
        }

        /// Random tar streams of kept, ignored and whiteout entries: what is
        /// kept always matches a straightforward model of the overlay.
        #[test]
        fn overlay_matches_a_model(layers in proptest::collection::vec(
            proptest::collection::vec((0usize..6, 0usize..4, any::<u8>()), 0..6), 1..4)
        ) {
            const PATHS: [&str; 6] = ["channel.json", "changelogs/a", "changelogs/b", "changelogs/d/c", "etc/x", "changelogs/d"];
            fn hide(map: &mut BTreeMap<String, Vec<u8>>, path: &str) {
                map.retain(|key, _| key != path && !key.starts_with(&format!("{path}/")));
            }
            let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            let mut blobs = Vec::new();
            for layer in &layers {
                let mut current = BTreeMap::new();
                let mut builder = tar::Builder::new(Vec::new());
                for (path, action, byte) in layer {
                    let path = PATHS[*path];
                    match action {
                        0 | 1 => {
                            let data = vec![*byte; 3];
                            raw(&mut builder, path.as_bytes(), EntryType::Regular, &data, b"");
                            hide(&mut model, path);
                            hide(&mut current, path);
                            if KEEP.keeps(path) {
                                current.insert(path.to_owned(), data);
                            }
                        }
                        2 => {
                            let (dir, name) = path.rsplit_once('/').map_or(("", path), |(d, n)| (d, n));
                            let wh = if dir.is_empty() { format!(".wh.{name}") } else { format!("{dir}/.wh.{name}") };
                            raw(&mut builder, wh.as_bytes(), EntryType::Regular, b"", b"");
                            hide(&mut model, path);
                        }
                        _ => {
                            raw(&mut builder, path.as_bytes(), EntryType::Symlink, b"", b"/x");
                            hide(&mut model, path);
                            hide(&mut current, path);
                        }
                    }
                }
                blobs.push(builder.into_inner().unwrap());
                model.append(&mut current);
            }
            let layers: Vec<(&str, Vec<u8>)> = blobs.into_iter().map(|blob| (TAR, blob)).collect();
            let files = extract(&layers).unwrap();
            prop_assert_eq!(files, model.into_iter().collect::<Vec<_>>());
        }
    }
}
