//! Image layers through the registry's `layer::Extractor` keeping what the
//! server keeps (`channels::CHANNEL_FILES`), with small limits: raw
//! blobs (decompressor and tar reader robustness) and tar streams built from
//! structured entries (whiteouts, long names, PAX paths, links, `..`), gzip
//! or zstd compressed, possibly truncated. Never panics (overflow checks are
//! on), and whatever is kept is channel data within the limits.
#![no_main]

use std::io::{Cursor, Write};

use arbitrary::Arbitrary;
use elemental_changelog_apiserver::channels::CHANNEL_FILES;
use elemental_changelog_registry::{
    FetchLimits,
    layer::{Extractor, normalize_path},
};
use libfuzzer_sys::fuzz_target;

/// The channel file the server keeps.
const CHANNEL_FILE: &str = CHANNEL_FILES.files[0];
/// The folder of changelog data the server keeps.
const CHANGELOG_DIR: &str = CHANNEL_FILES.folders[0];

const LIMITS: FetchLimits = FetchLimits {
    max_compressed_bytes: 64 * 1024,
    max_uncompressed_bytes: 64 * 1024,
    max_entries: 48,
    max_file_bytes: 2048,
    max_kept_bytes: 4096,
    max_layers: 8,
    max_index_manifests: 8,
};

#[derive(Arbitrary, Debug, Clone, Copy)]
enum MediaType {
    Tar,
    Gzip,
    Zstd,
    DockerGzip,
    Unknown,
}

impl MediaType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Tar => "application/vnd.oci.image.layer.v1.tar",
            Self::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Self::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
            Self::DockerGzip => "application/vnd.docker.image.rootfs.diff.tar.gzip",
            Self::Unknown => "application/vnd.oci.image.config.v1+json",
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Compress {
    None,
    Gzip,
    Zstd,
}

#[derive(Arbitrary, Debug)]
enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
    Fifo,
}

#[derive(Arbitrary, Debug)]
enum Path {
    Channel,
    Changelogs,
    InChangelogs(String),
    Whiteout(Option<String>),
    Opaque(Option<String>),
    Other(String),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Prefix {
    None,
    Dot,
    Slash,
}

#[derive(Arbitrary, Debug)]
enum NameVia {
    Header,
    GnuLongName,
    Pax,
}

#[derive(Arbitrary, Debug)]
struct Entry {
    kind: Kind,
    prefix: Prefix,
    path: Path,
    via: NameVia,
    data: Vec<u8>,
    /// Header size different from the data actually written.
    size_delta: Option<i8>,
}

#[derive(Arbitrary, Debug)]
enum Layer {
    Raw {
        media: MediaType,
        blob: Vec<u8>,
    },
    Built {
        media: MediaType,
        compress: Compress,
        entries: Vec<Entry>,
        end_marker: bool,
        truncate: Option<u16>,
    },
}

impl Entry {
    fn path_bytes(&self) -> Vec<u8> {
        let path = match &self.path {
            Path::Channel => CHANNEL_FILE.as_bytes().to_vec(),
            Path::Changelogs => CHANGELOG_DIR.as_bytes().to_vec(),
            Path::InChangelogs(name) => format!("{CHANGELOG_DIR}/{name}").into_bytes(),
            Path::Whiteout(None) => format!(".wh.{CHANGELOG_DIR}").into_bytes(),
            Path::Whiteout(Some(name)) => format!("{CHANGELOG_DIR}/.wh.{name}").into_bytes(),
            Path::Opaque(None) => b".wh..wh..opq".to_vec(),
            Path::Opaque(Some(dir)) => format!("{dir}/.wh..wh..opq").into_bytes(),
            Path::Other(p) => p.clone().into_bytes(),
            Path::Raw(p) => p.clone(),
        };
        let prefix: &[u8] = match self.prefix {
            Prefix::None => b"",
            Prefix::Dot => b"./",
            Prefix::Slash => b"/",
        };
        [prefix, &path].concat()
    }

    fn type_byte(&self) -> u8 {
        match self.kind {
            Kind::File => b'0',
            Kind::HardLink => b'1',
            Kind::Symlink => b'2',
            Kind::Dir => b'5',
            Kind::Fifo => b'6',
        }
    }
}

/// Appends one 512-byte header block, `name` cut to 100 bytes.
fn header(out: &mut Vec<u8>, name: &[u8], type_byte: u8, size: u64) {
    let mut h = tar::Header::new_gnu();
    {
        let old = h.as_old_mut();
        let n = name.len().min(old.name.len());
        old.name[..n].copy_from_slice(&name[..n]);
        old.linkname[..6].copy_from_slice(b"target");
    }
    h.set_mode(0o644);
    h.set_size(size);
    h.set_entry_type(tar::EntryType::new(type_byte));
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
}

fn data_blocks(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    // "<len> <key>=<value>\n" where <len> counts itself.
    let rest = key.len() + value.len() + 3;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    [format!("{len} {key}=").as_bytes(), value, b"\n"].concat()
}

fn build_tar(entries: &[Entry], end_marker: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let path = e.path_bytes();
        let name: &[u8] = match e.via {
            NameVia::Header => &path,
            NameVia::GnuLongName => {
                let mut long = path.clone();
                long.push(0);
                header(&mut out, b"././@LongLink", b'L', long.len() as u64);
                data_blocks(&mut out, &long);
                b"placeholder"
            }
            NameVia::Pax => {
                let record = pax_record("path", &path);
                header(&mut out, b"PaxHeaders/x", b'x', record.len() as u64);
                data_blocks(&mut out, &record);
                b"placeholder"
            }
        };
        let size = match e.size_delta {
            Some(d) => (e.data.len() as u64).saturating_add_signed(i64::from(d)),
            None => e.data.len() as u64,
        };
        header(&mut out, name, e.type_byte(), size);
        data_blocks(&mut out, &e.data);
    }
    if end_marker {
        out.extend_from_slice(&[0; 1024]);
    }
    out
}

fn compress(tar: Vec<u8>, how: Compress) -> Vec<u8> {
    match how {
        Compress::None => tar,
        Compress::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&tar).expect("gzip to memory");
            gz.finish().expect("gzip to memory")
        }
        Compress::Zstd => zstd::encode_all(&tar[..], 1).expect("zstd to memory"),
    }
}

fn check(extractor: Extractor) {
    assert!(extractor.uncompressed_bytes() <= LIMITS.max_uncompressed_bytes);
    let files = extractor.into_files();
    let mut kept = 0u64;
    for (path, data) in &files {
        assert!(
            path == CHANNEL_FILE
                || path
                    .strip_prefix(CHANGELOG_DIR)
                    .and_then(|r| r.strip_prefix('/'))
                    .is_some_and(|r| !r.is_empty()),
            "kept a file that is not channel data: {path:?}"
        );
        assert_eq!(
            normalize_path(path.as_bytes()).as_deref(),
            Some(path.as_str())
        );
        assert!(
            data.len() as u64 <= LIMITS.max_file_bytes,
            "{path}: over the file limit"
        );
        kept += data.len() as u64;
    }
    assert!(kept <= LIMITS.max_kept_bytes, "kept {kept} bytes");
}

fuzz_target!(|layers: Vec<Layer>| {
    let mut extractor = Extractor::new(LIMITS, CHANNEL_FILES);
    for layer in layers.iter().take(4) {
        let (media, blob) = match layer {
            Layer::Raw { media, blob } => (*media, blob.clone()),
            Layer::Built {
                media,
                compress: how,
                entries,
                end_marker,
                truncate,
            } => {
                let mut blob = compress(build_tar(entries, *end_marker), *how);
                if let Some(t) = truncate {
                    blob.truncate(usize::from(*t));
                }
                (*media, blob)
            }
        };
        extractor = match extractor.apply_layer(media.as_str(), Cursor::new(blob)) {
            Ok(next) => next,
            Err(_) => return,
        };
    }
    check(extractor);
});
