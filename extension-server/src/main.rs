//! `elemental-changelog-extension-server`: serves the built Rancher UI
//! extension over plain HTTP/1.1 inside the cluster, as the endpoint of the
//! chart's UIPlugin (Rancher's controller fetches it with a plain `http.Get`).
//! Read-only, every file held in memory from the start.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Parser;
use elemental_changelog_extension_server::{Files, Limits, respond};
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::{info, warn};

/// Serves a built Rancher UI extension (`dist-pkg/<name>-<version>`) at
/// `/plugin/<file>` with `/files.txt`, for a UIPlugin's `spec.plugin.endpoint`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The built extension: the folder the shell's `build-pkg` wrote (`package.json` and `<name>-<version>.umd.min.js` at its top).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_EXTENSION_DIR")]
    dir: PathBuf,
    /// HTTP port.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_EXTENSION_PORT",
        default_value_t = 8080
    )]
    port: u16,
    /// Listen address.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_EXTENSION_BIND_ADDRESS",
        default_value = "0.0.0.0"
    )]
    bind_address: IpAddr,
    /// Connections served at once; further ones wait in the kernel's backlog.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_EXTENSION_MAX_CONNECTIONS",
        default_value_t = 64
    )]
    max_connections: usize,
}

/// Time a client has to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection is served (a whole extension is sent well within it).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().json().init();
    let args = Args::parse();
    let files = Arc::new(
        Files::load(&args.dir, Limits::default())
            .with_context(|| format!("loading the extension from {}", args.dir.display()))?,
    );
    let addr = SocketAddr::new(args.bind_address, args.port);
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    info!(%addr, files = files.paths().count(), dir = %args.dir.display(), "serving the UI extension");
    let slots = Arc::new(Semaphore::new(args.max_connections.max(1)));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("handling SIGTERM")?;
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.context("connection slots closed")?,
            _ = terminate.recv() => return Ok(()),
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "accept failed");
                    continue;
                }
            },
            _ = terminate.recv() => return Ok(()),
        };
        let files = files.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let response = respond(&files, request.method(), request.uri().path());
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                Ok(Ok(())) | Err(_) => {}
                Ok(Err(error)) => tracing::debug!(%peer, %error, "connection ended with an error"),
            }
            drop(permit);
        });
    }
}
