//! Channel images built in memory (tar layers, plain, gzip or zstd; a config
//! blob; an OCI or Docker schema 2 manifest; multi-architecture indexes) and
//! pushed to a test [`Registry`] with oci-client. Also deliberately broken
//! images: traversal entries, decompression bombs, missing or corrupted blobs
//! (see [`Registry::delete_blob`] and [`Registry::corrupt_blob`]).

use std::io::Write as _;

use anyhow::{Context as _, Result};
use oci_client::{Reference, RegistryOperation, client::Client};
use reqwest::header::HeaderValue;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::registry::Registry;

/// How a layer is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

/// The manifest flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OCI image manifest and index.
    Oci,
    /// Docker schema 2 manifest and manifest list.
    Docker,
}

/// One tar entry.
#[derive(Clone, Debug)]
pub enum Entry {
    /// A regular file.
    File {
        /// Its path (written as given, without any checks).
        path: String,
        /// Its content.
        data: Vec<u8>,
    },
    /// A folder.
    Dir {
        /// Its path.
        path: String,
    },
    /// A symbolic link.
    Symlink {
        /// Its path.
        path: String,
        /// Where it points.
        target: String,
    },
    /// A hard link.
    HardLink {
        /// Its path.
        path: String,
        /// The entry it links to.
        target: String,
    },
}

/// A layer: tar entries and a compression, or a prebuilt blob.
#[derive(Clone, Debug)]
pub struct Layer {
    compression: Compression,
    entries: Vec<Entry>,
    prebuilt: Option<Vec<u8>>,
}

impl Layer {
    /// An empty layer.
    pub fn new(compression: Compression) -> Self {
        Self {
            compression,
            entries: Vec::new(),
            prebuilt: None,
        }
    }

    /// A layer whose blob is given as is (it must match `compression`'s
    /// media type to be read, or deliberately not).
    pub fn prebuilt(compression: Compression, blob: Vec<u8>) -> Self {
        Self {
            compression,
            entries: Vec::new(),
            prebuilt: Some(blob),
        }
    }

    /// Adds a file. The path is written verbatim (`../x` and `/x` included,
    /// up to 100 bytes; longer paths get a GNU long-name entry).
    pub fn file(mut self, path: &str, data: impl Into<Vec<u8>>) -> Self {
        self.entries.push(Entry::File {
            path: path.to_owned(),
            data: data.into(),
        });
        self
    }

    /// Adds a folder.
    pub fn dir(mut self, path: &str) -> Self {
        self.entries.push(Entry::Dir {
            path: path.to_owned(),
        });
        self
    }

    /// Adds a symbolic link.
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        self.entries.push(Entry::Symlink {
            path: path.to_owned(),
            target: target.to_owned(),
        });
        self
    }

    /// Adds a hard link.
    pub fn hard_link(mut self, path: &str, target: &str) -> Self {
        self.entries.push(Entry::HardLink {
            path: path.to_owned(),
            target: target.to_owned(),
        });
        self
    }

    /// Adds a whiteout deleting `path` of the layers below.
    pub fn whiteout(self, path: &str) -> Self {
        let whiteout = match path.rsplit_once('/') {
            Some((dir, name)) => format!("{dir}/.wh.{name}"),
            None => format!(".wh.{path}"),
        };
        self.file(&whiteout, Vec::new())
    }

    /// Makes `dir` opaque: its content in the layers below is hidden.
    pub fn opaque(self, dir: &str) -> Self {
        self.file(&format!("{dir}/.wh..wh..opq"), Vec::new())
    }

    /// The uncompressed tar stream (the prebuilt blob for prebuilt layers).
    pub fn tar(&self) -> Result<Vec<u8>> {
        if let Some(blob) = &self.prebuilt {
            return Ok(blob.clone());
        }
        let mut builder = tar::Builder::new(Vec::new());
        for entry in &self.entries {
            match entry {
                Entry::File { path, data } => {
                    append(&mut builder, path, tar::EntryType::Regular, data, "")?
                }
                Entry::Dir { path } => {
                    append(&mut builder, path, tar::EntryType::Directory, b"", "")?
                }
                Entry::Symlink { path, target } => {
                    append(&mut builder, path, tar::EntryType::Symlink, b"", target)?
                }
                Entry::HardLink { path, target } => {
                    append(&mut builder, path, tar::EntryType::Link, b"", target)?
                }
            }
        }
        Ok(builder.into_inner()?)
    }

    /// The blob as pushed.
    pub fn blob(&self) -> Result<Vec<u8>> {
        if let Some(blob) = &self.prebuilt {
            return Ok(blob.clone());
        }
        compress(self.compression, &self.tar()?)
    }

    /// The layer media type in `format`. Docker has no zstd type; the OCI one
    /// is used there, as buildkit does.
    pub fn media_type(&self, format: Format) -> &'static str {
        match (format, self.compression) {
            (Format::Oci, Compression::None) => "application/vnd.oci.image.layer.v1.tar",
            (Format::Oci, Compression::Gzip) => "application/vnd.oci.image.layer.v1.tar+gzip",
            (_, Compression::Zstd) => "application/vnd.oci.image.layer.v1.tar+zstd",
            (Format::Docker, Compression::None) => "application/vnd.docker.image.rootfs.diff.tar",
            (Format::Docker, Compression::Gzip) => {
                "application/vnd.docker.image.rootfs.diff.tar.gzip"
            }
        }
    }
}

/// Writes one entry with its name as raw bytes (no path checks), using a
/// GNU long-name entry when it does not fit the header.
fn append(
    builder: &mut tar::Builder<Vec<u8>>,
    path: &str,
    kind: tar::EntryType,
    data: &[u8],
    link: &str,
) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    let mut name = path.as_bytes();
    if name.len() > 100 {
        let mut long = name.to_vec();
        long.push(0);
        let mut long_header = tar::Header::new_gnu();
        long_header.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        long_header.set_entry_type(tar::EntryType::GNULongName);
        long_header.set_size(long.len() as u64);
        long_header.set_mode(0o644);
        long_header.set_cksum();
        builder.append(&long_header, long.as_slice())?;
        name = &name[..100];
    }
    let link = link.as_bytes();
    anyhow::ensure!(link.len() <= 100, "link target too long: {path}");
    let old = header.as_old_mut();
    old.name[..name.len()].copy_from_slice(name);
    old.linkname[..link.len()].copy_from_slice(link);
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_mode(if kind == tar::EntryType::Directory {
        0o755
    } else {
        0o644
    });
    header.set_mtime(1_700_000_000);
    header.set_cksum();
    builder.append(&header, data)?;
    Ok(())
}

/// Compresses a tar stream.
pub fn compress(compression: Compression, data: &[u8]) -> Result<Vec<u8>> {
    Ok(match compression {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(data)?;
            encoder.finish()?
        }
        Compression::Zstd => zstd::stream::encode_all(data, 3)?,
    })
}

/// A layer blob whose tar stream holds one file of `size` zero bytes at
/// `path`, as concatenated gzip members or zstd frames of 1 MiB each: 1 GiB
/// compresses to about 1 MiB (gzip) or 50 KiB (zstd).
pub fn zero_bomb(compression: Compression, path: &str, size: u64) -> Result<Vec<u8>> {
    const CHUNK: usize = 1 << 20;
    let mut header = tar::Header::new_gnu();
    header.set_path(path)?;
    header.set_size(size);
    header.set_mode(0o644);
    header.set_cksum();
    let mut blob = compress(compression, header.as_bytes())?;
    let zeros = vec![0; CHUNK];
    let chunk = match compression {
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            encoder.write_all(&zeros)?;
            encoder.finish()?
        }
        Compression::Zstd => zstd::stream::encode_all(zeros.as_slice(), 19)?,
        Compression::None => zeros,
    };
    let chunks = size.div_ceil(CHUNK as u64);
    for _ in 0..chunks {
        blob.extend_from_slice(&chunk);
    }
    Ok(blob)
}

/// An `updateinfo.xml.gz` bomb: one advisory whose `<package/>` elements
/// (100 different ones, repeated) inflate to about `inflated` bytes: 400 MiB
/// compress to about 1.5 MB.
pub fn updateinfo_bomb(inflated: u64) -> Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(
        b"<?xml version=\"1.0\"?><updates><update type=\"security\"><id>SUSE-BOMB</id><pkglist><collection>",
    )?;
    let mut chunk = Vec::new();
    for i in 0..100 {
        chunk.extend_from_slice(
            format!("<package name=\"kernel-default-{i}\" epoch=\"0\" version=\"6.4.0\" release=\"150600.23.1\" arch=\"x86_64\"/>").as_bytes(),
        );
    }
    let chunk = chunk.repeat(100);
    let mut written = 0u64;
    while written < inflated {
        encoder.write_all(&chunk)?;
        written += chunk.len() as u64;
    }
    encoder.write_all(b"</collection></pkglist></update></updates>")?;
    Ok(encoder.finish()?)
}

/// An image for one platform.
#[derive(Clone, Debug)]
pub struct Image {
    /// Manifest flavour.
    pub format: Format,
    /// GOARCH of the config (and of the index entry).
    pub arch: String,
    /// Layers, bottom first.
    pub layers: Vec<Layer>,
}

impl Image {
    /// An image without layers.
    pub fn new(format: Format) -> Self {
        Self {
            format,
            arch: "amd64".to_owned(),
            layers: Vec::new(),
        }
    }

    /// A one-layer channel image holding `files` (path and content, e.g.
    /// `channel.json`, `changelogs/<name>.updates.log`; borrowed or owned)
    /// beside a stand-in busybox.
    pub fn channel<P: AsRef<str>, D: AsRef<[u8]>>(
        format: Format,
        compression: Compression,
        files: &[(P, D)],
    ) -> Self {
        let mut layer = Layer::new(compression)
            .dir("bin/")
            .file("bin/busybox", vec![0x7f; 2048]);
        for (path, data) in files {
            layer = layer.file(path.as_ref(), data.as_ref().to_vec());
        }
        Self::new(format).layer(layer)
    }

    /// Adds a layer on top.
    pub fn layer(mut self, layer: Layer) -> Self {
        self.layers.push(layer);
        self
    }

    /// Sets the architecture.
    pub fn arch(mut self, arch: &str) -> Self {
        self.arch = arch.to_owned();
        self
    }
}

/// What [`push`] uploaded.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// The manifest (or index) digest.
    pub digest: String,
    /// Its media type.
    pub media_type: &'static str,
    /// Its size in bytes.
    pub size: usize,
    /// The config blob digest (images only).
    pub config_digest: Option<String>,
    /// Layer blob digests, bottom first (images only).
    pub layer_digests: Vec<String>,
    /// What an index lists (indexes only).
    pub children: Vec<Pushed>,
}

/// `sha256:<hex>` of `data`.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

async fn client_for(registry: &Registry, reference: &Reference) -> Result<Client> {
    let client = registry.oci_client()?;
    client
        .auth(reference, &registry.auth(), RegistryOperation::Push)
        .await
        .context("registry auth")?;
    Ok(client)
}

/// Pushes a one-layer OCI channel image holding `files` ([`Image::channel`])
/// as `<registry>/<repository_and_tag>`; returns its digest.
pub async fn push_channel<P: AsRef<str>, D: AsRef<[u8]>>(
    registry: &Registry,
    repository_and_tag: &str,
    compression: Compression,
    files: &[(P, D)],
) -> Result<String> {
    let image = Image::channel(Format::Oci, compression, files);
    Ok(push(registry, repository_and_tag, &image).await?.digest)
}

/// Pushes `image` as `<registry>/<repository_and_tag>`; `repository_and_tag`
/// may also be `repo@sha256:...` (then the manifest must have that digest).
pub async fn push(registry: &Registry, repository_and_tag: &str, image: &Image) -> Result<Pushed> {
    let reference: Reference = registry.image(repository_and_tag).parse()?;
    let client = client_for(registry, &reference).await?;
    push_with(&client, &reference, image).await
}

async fn push_with(client: &Client, reference: &Reference, image: &Image) -> Result<Pushed> {
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for layer in &image.layers {
        let blob = layer.blob()?;
        let digest = sha256(&blob);
        diff_ids.push(sha256(&decompressed(layer)?));
        client
            .push_blob(reference, blob.clone(), &digest)
            .await
            .with_context(|| format!("pushing layer {digest}"))?;
        layers.push(json!({
            "mediaType": layer.media_type(image.format),
            "digest": digest,
            "size": blob.len(),
        }));
    }
    let (config_type, manifest_type) = match image.format {
        Format::Oci => (
            "application/vnd.oci.image.config.v1+json",
            "application/vnd.oci.image.manifest.v1+json",
        ),
        Format::Docker => (
            "application/vnd.docker.container.image.v1+json",
            "application/vnd.docker.distribution.manifest.v2+json",
        ),
    };
    let config = serde_json::to_vec(&json!({
        "architecture": image.arch,
        "os": "linux",
        "config": {},
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))?;
    let config_digest = sha256(&config);
    client
        .push_blob(reference, config.clone(), &config_digest)
        .await
        .context("pushing the config")?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": manifest_type,
        "config": { "mediaType": config_type, "digest": config_digest, "size": config.len() },
        "layers": layers,
    }))?;
    let digest = sha256(&manifest);
    client
        .push_manifest_raw(
            reference,
            manifest.clone(),
            HeaderValue::from_static(manifest_type),
        )
        .await
        .context("pushing the manifest")?;
    Ok(Pushed {
        digest,
        media_type: manifest_type,
        size: manifest.len(),
        config_digest: Some(config_digest),
        layer_digests: layers
            .iter()
            .filter_map(|layer| layer["digest"].as_str().map(str::to_owned))
            .collect(),
        children: Vec::new(),
    })
}

/// The tar stream of a layer, for its diff ID (prebuilt blobs are hashed
/// as they are: they are meant to be broken anyway).
fn decompressed(layer: &Layer) -> Result<Vec<u8>> {
    if layer.prebuilt.is_some() {
        return layer.blob();
    }
    layer.tar()
}

/// Pushes `image`, then an OCI index that lists it `count` times (for
/// `count` made-up architectures) as `<registry>/<repository_and_tag>`.
pub async fn push_wide_index(
    registry: &Registry,
    repository_and_tag: &str,
    image: &Image,
    count: usize,
) -> Result<Pushed> {
    let reference: Reference = registry.image(repository_and_tag).parse()?;
    let client = client_for(registry, &reference).await?;
    let child = push_with(&client, &reference, image).await?;
    let manifests: Vec<_> = (0..count)
        .map(|i| {
            json!({
                "mediaType": child.media_type,
                "digest": child.digest,
                "size": child.size,
                "platform": { "architecture": format!("arch{i}"), "os": "linux" },
            })
        })
        .collect();
    let index_type = "application/vnd.oci.image.index.v1+json";
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": index_type,
        "manifests": manifests,
    }))?;
    let digest = sha256(&index);
    client
        .push_manifest_raw(
            &reference,
            index.clone(),
            HeaderValue::from_static(index_type),
        )
        .await
        .context("pushing the index")?;
    Ok(Pushed {
        digest,
        media_type: index_type,
        size: index.len(),
        config_digest: None,
        layer_digests: Vec::new(),
        children: vec![child],
    })
}

/// Pushes each image by digest, then an index (OCI) or manifest list
/// (Docker) of them as `<registry>/<repository_and_tag>`.
pub async fn push_index(
    registry: &Registry,
    repository_and_tag: &str,
    format: Format,
    images: &[Image],
) -> Result<Pushed> {
    let reference: Reference = registry.image(repository_and_tag).parse()?;
    let client = client_for(registry, &reference).await?;
    let mut children = Vec::new();
    for image in images {
        // Each child goes under the tag for a moment; the index replaces it.
        let pushed = push_with(&client, &reference, image).await?;
        children.push(pushed);
    }
    let index_type = match format {
        Format::Oci => "application/vnd.oci.image.index.v1+json",
        Format::Docker => "application/vnd.docker.distribution.manifest.list.v2+json",
    };
    let manifests: Vec<_> = images
        .iter()
        .zip(&children)
        .map(|(image, child)| {
            json!({
                "mediaType": child.media_type,
                "digest": child.digest,
                "size": child.size,
                "platform": { "architecture": image.arch, "os": "linux" },
            })
        })
        .collect();
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": index_type,
        "manifests": manifests,
    }))?;
    let digest = sha256(&index);
    client
        .push_manifest_raw(
            &reference,
            index.clone(),
            HeaderValue::from_static(index_type),
        )
        .await
        .context("pushing the index")?;
    Ok(Pushed {
        digest,
        media_type: index_type,
        size: index.len(),
        config_digest: None,
        layer_digests: Vec::new(),
        children,
    })
}
