//! The one-off commands: `inspect` (what the server would serve for an image)
//! and `compute` (the precomputed files a channel image should carry). They
//! use the same fetch, parse and compute code as the server.

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use elemental_changelog::{
    compute::{GenerateError, IndexedChannel, QueryError, generate_updates_logs},
    data::{ChannelData, DataError, FileProblem},
    updateinfo,
};
use elemental_changelog_apiservice::{
    render,
    types::{ManagedOSVersionChangelogSummary, ObjectMeta},
};

use crate::{
    channels::{CHANNEL_FILES, parse_limits},
    config::{ComputeArgs, InspectArgs, OutputFormat},
    objects::{self, Source},
    telemetry,
};
use elemental_changelog_registry::{
    Digest, FetchError, Fetched, Fetcher, ImageRef, PullFor, config::ConfigError,
};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Registry flags are wrong.
    #[error("registry settings")]
    Registry(#[source] ConfigError),
    /// The image could not be fetched.
    #[error("fetching {image}")]
    Fetch {
        /// The image.
        image: String,
        /// Why.
        #[source]
        source: FetchError,
    },
    /// The image's data is unusable.
    #[error("reading {image}")]
    Data {
        /// The image.
        image: String,
        /// Why.
        #[source]
        source: DataError,
    },
    /// The version or `--from` is not in the image.
    #[error("changelog of {name}")]
    Query {
        /// The version.
        name: String,
        /// Why.
        #[source]
        source: QueryError,
    },
    /// A file could not be read or written.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `updateinfo.xml` does not parse.
    #[error("{}", path.display())]
    UpdateInfo {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: updateinfo::Error,
    },
    /// The files could not be generated.
    #[error("computing changelogs")]
    Generate(#[source] GenerateError),
    /// Output could not be encoded.
    #[error("encoding output")]
    Json(#[source] serde_json::Error),
}

/// `inspect`: pulls the image and prints what the server would serve.
pub async fn inspect(args: InspectArgs) -> Result<(), CliError> {
    telemetry::init(args.log_format);
    let Some(image) = pull(&args).await? else {
        // Without a known digest the fetcher always pulls.
        return Ok(());
    };
    let source = Source {
        channel: "",
        image: &image.image,
        digest: &image.digest,
    };
    match &args.version {
        Some(name) => print_changelog(&args, source, &image.data, name),
        None => print_summaries(&args, source, &image),
    }
}

/// An image `inspect` pulled and parsed.
struct Inspected {
    image: ImageRef,
    digest: Digest,
    platform: Option<String>,
    compressed_bytes: u64,
    data: IndexedChannel,
}

/// Pulls and parses the image as the server does; `None` when nothing was pulled.
async fn pull(args: &InspectArgs) -> Result<Option<Inspected>, CliError> {
    let fetch_error = |source| CliError::Fetch {
        image: args.image.clone(),
        source,
    };
    let config = args
        .registry
        .to_config(CHANNEL_FILES)
        .map_err(CliError::Registry)?;
    let fetcher = Fetcher::new(config).map_err(fetch_error)?;
    let image: ImageRef = args
        .image
        .parse()
        .map_err(|error| fetch_error(FetchError::from(error)))?;
    let fetched = fetcher
        .fetch(&image, args.arch.oci(), None, PullFor::Anyone)
        .await
        .map_err(fetch_error)?;
    let Fetched::Pulled {
        digest,
        files,
        compressed_bytes,
        platform,
        memory,
        ..
    } = fetched
    else {
        return Ok(None);
    };
    // Parsed in the memory the pull reserved for it, as the server does.
    let limits = memory
        .as_ref()
        .map_or_else(Default::default, |memory| parse_limits(memory.allowance()));
    let data =
        ChannelData::from_files_with_limits(files, limits).map_err(|source| CliError::Data {
            image: args.image.clone(),
            source,
        })?;
    Ok(Some(Inspected {
        image,
        digest,
        platform,
        compressed_bytes,
        data: IndexedChannel::new(data),
    }))
}

/// `inspect --version`: one changelog, as the server answers it.
fn print_changelog(
    args: &InspectArgs,
    source: Source<'_>,
    data: &IndexedChannel,
    name: &str,
) -> Result<(), CliError> {
    let metadata = ObjectMeta {
        name: name.to_owned(),
        ..ObjectMeta::default()
    };
    let changelog = objects::changelog(
        source,
        data,
        name,
        args.from.as_deref(),
        metadata,
        &args.arch,
    )
    .map_err(|source| CliError::Query {
        name: name.to_owned(),
        source,
    })?;
    match args.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&changelog).map_err(CliError::Json)?
        ),
        OutputFormat::Text => print!("{}", render::text(&changelog)),
    }
    Ok(())
}

/// `inspect` without `--version`: the summary of every version, oldest first.
fn print_summaries(
    args: &InspectArgs,
    source: Source<'_>,
    image: &Inspected,
) -> Result<(), CliError> {
    let summaries: Vec<ManagedOSVersionChangelogSummary> = image
        .data
        .order()
        .iter()
        .map(|name| {
            let metadata = ObjectMeta {
                name: name.clone(),
                ..ObjectMeta::default()
            };
            objects::summary(source, &image.data, name, metadata, "")
        })
        .collect();
    let problems = image.data.data().problems();
    match args.output {
        OutputFormat::Json => {
            let out = serde_json::json!({
                "image": args.image,
                "digest": image.digest.as_str(),
                "platform": image.platform,
                "compressedBytes": image.compressed_bytes,
                "problems": problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "versions": summaries,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&out).map_err(CliError::Json)?
            );
        }
        OutputFormat::Text => print!(
            "{}",
            inspect_text(
                &args.image,
                image.digest.as_str(),
                image.platform.as_deref(),
                problems,
                &summaries
            )
        ),
    }
    Ok(())
}

fn inspect_text(
    image: &str,
    digest: &str,
    platform: Option<&str>,
    problems: &[FileProblem],
    summaries: &[ManagedOSVersionChangelogSummary],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "image:    {image}");
    let _ = writeln!(out, "digest:   {digest}");
    let _ = writeln!(
        out,
        "platform: {}",
        platform.unwrap_or("single-platform image")
    );
    let _ = writeln!(out, "versions: {} (oldest first)", summaries.len());
    for problem in problems {
        let _ = writeln!(out, "rejected: {problem}");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<32} {:<16} {:<20} {:>10} {:>8} {:>5} {:<11} {:>9}",
        "NAME", "VERSION", "CREATED", "ADVISORIES", "SECURITY", "CVES", "SEVERITY", "PACKAGES"
    );
    for s in summaries {
        let created = s.created.as_deref().unwrap_or("-");
        match &s.summary {
            Some(sum) => {
                let security = sum.by_type.get("security").copied().unwrap_or_default();
                let packages = match (
                    sum.packages_upgraded,
                    sum.packages_added,
                    sum.packages_removed,
                ) {
                    (None, None, None) => "-".to_owned(),
                    (u, a, r) => {
                        format!("{}/{}/{}", u.unwrap_or(0), a.unwrap_or(0), r.unwrap_or(0))
                    }
                };
                let _ = writeln!(
                    out,
                    "{:<32} {:<16} {:<20} {:>10} {:>8} {:>5} {:<11} {:>9}",
                    s.metadata.name,
                    s.version,
                    created,
                    sum.advisories,
                    security,
                    sum.cves,
                    sum.highest_severity.as_str(),
                    packages
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "{:<32} {:<16} {:<20} {}",
                    s.metadata.name,
                    s.version,
                    created,
                    s.message.as_deref().unwrap_or("no changelog data")
                );
            }
        }
    }
    out
}

/// `compute`: writes `<name>.updates.log` files from raw data.
pub fn compute(args: &ComputeArgs) -> Result<(), CliError> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|source| CliError::Io {
            path: path.clone(),
            source,
        })
    };
    let channel_json = read(&args.channel)?;
    let mut packages = BTreeMap::new();
    let dir = std::fs::read_dir(&args.packages).map_err(|source| CliError::Io {
        path: args.packages.clone(),
        source,
    })?;
    for entry in dir {
        let entry = entry.map_err(|source| CliError::Io {
            path: args.packages.clone(),
            source,
        })?;
        let path = entry.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".packages"))
        else {
            continue;
        };
        packages.insert(name.to_owned(), read(&path)?);
    }
    let file = std::fs::File::open(&args.updateinfo).map_err(|source| CliError::Io {
        path: args.updateinfo.clone(),
        source,
    })?;
    let name = args.updateinfo.to_string_lossy();
    let reader = updateinfo::decoder_for(&name, file).map_err(|source| CliError::UpdateInfo {
        path: args.updateinfo.clone(),
        source,
    })?;
    let advisories =
        updateinfo::parse(reader, updateinfo::Limits::default()).map_err(|source| {
            CliError::UpdateInfo {
                path: args.updateinfo.clone(),
                source,
            }
        })?;
    let files =
        generate_updates_logs(&channel_json, &packages, &advisories).map_err(CliError::Generate)?;
    std::fs::create_dir_all(&args.output).map_err(|source| CliError::Io {
        path: args.output.clone(),
        source,
    })?;
    for (name, content) in &files {
        let path = args.output.join(name);
        std::fs::write(&path, content).map_err(|source| CliError::Io { path, source })?;
    }
    println!("wrote {} files to {}", files.len(), args.output.display());
    Ok(())
}
