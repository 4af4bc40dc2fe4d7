//! Clients that stall: TLS connections straight to the server (or to kube-apiserver's
//! aggregator) with the ALPN a test chooses, and HTTP/2 watches whose client never opens its
//! flow-control window, each followed until the server ends it. Used by `tests/attacks` and
//! by the fleet phase of `make bench` (issue 35).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use bytes::Bytes;
use reqwest::StatusCode;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::testbed::{Ca, CertPair, TestBed};

/// A TLS connection to the server under test.
pub type Tls = TlsStream<TcpStream>;

/// TLS connections to the server, with ALPN `h2` and `http/1.1` as kube-apiserver's
/// proxy offers them.
#[derive(Clone)]
pub struct Dialer {
    connector: TlsConnector,
    port: u16,
}

impl Dialer {
    /// Connections without a client certificate, or with `identity`'s.
    pub fn new(bed: &TestBed, identity: Option<&CertPair>) -> Result<Self> {
        let port = bed.server().context("server")?.port();
        Self::to(&bed.pki().server_ca, port, identity, &[b"h2", b"http/1.1"])
    }

    /// Connections to kube-apiserver (its aggregator), with `identity`'s certificate.
    pub fn apiserver(bed: &TestBed, identity: &CertPair) -> Result<Self> {
        let port = bed.apiserver_addr().port();
        Self::to(&bed.pki().cluster_ca, port, Some(identity), &[b"h2"])
    }

    /// Connections to the server that offer HTTP/1.1 alone.
    pub fn http1(bed: &TestBed, identity: &CertPair) -> Result<Self> {
        let port = bed.server().context("server")?.port();
        Self::to(&bed.pki().server_ca, port, Some(identity), &[b"http/1.1"])
    }

    fn to(ca: &Ca, port: u16, identity: Option<&CertPair>, alpn: &[&[u8]]) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
            roots.add(cert?)?;
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(identity) => builder.with_client_auth_cert(
                CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()?,
                PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())?,
            )?,
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            port,
        })
    }

    /// A TLS connection; `receive_buffer` sets `SO_RCVBUF` before connecting, so that
    /// a client that does not read soon stops the server's writes.
    pub async fn connect(&self, receive_buffer: Option<u32>) -> Result<Tls> {
        let socket = TcpSocket::new_v4()?;
        if let Some(size) = receive_buffer {
            socket.set_recv_buffer_size(size)?;
        }
        let tcp = socket.connect(([127, 0, 0, 1], self.port).into()).await?;
        Ok(self
            .connector
            .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
            .await?)
    }
}

/// How one watch ended, as its client saw it, counted from its response's headers.
#[derive(Debug)]
pub enum End {
    /// `RST_STREAM`.
    Reset(Duration),
    /// `END_STREAM`: the server finished it.
    Finished(Duration),
    /// Data came, though the window was never opened.
    Data,
    /// Still open at the limit.
    Open,
}

/// Watches in flight, each read by a task until it ends or its limit.
pub struct Watches {
    ends: Vec<tokio::task::JoinHandle<End>>,
    /// The HTTP/2 connections' tasks, ended when `Watches` is dropped.
    conns: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for conn in &self.conns {
            conn.abort();
        }
    }
}

impl Watches {
    /// How each watch ended, once all have.
    pub async fn ends(mut self) -> Result<Ends> {
        let mut ends = Vec::new();
        for end in std::mem::take(&mut self.ends) {
            ends.push(end.await?);
        }
        Ok(Ends(ends))
    }
}

/// How each of [`Watches`] ended.
pub struct Ends(pub Vec<End>);

impl Ends {
    /// One line: how many reset and when, how many finished, sent data or stayed open.
    pub fn summary(&self) -> String {
        let resets: Vec<Duration> = self
            .0
            .iter()
            .filter_map(|e| match e {
                End::Reset(after) => Some(*after),
                _ => None,
            })
            .collect();
        let finished: Vec<Duration> = self
            .0
            .iter()
            .filter_map(|e| match e {
                End::Finished(after) => Some(*after),
                _ => None,
            })
            .collect();
        let count = |f: fn(&End) -> bool| self.0.iter().filter(|e| f(e)).count();
        format!(
            "{} reset ({:?} to {:?} after their headers), {} finished (the last {:?} after), {} sent data, {} still open",
            resets.len(),
            resets.iter().min().copied().unwrap_or_default(),
            resets.iter().max().copied().unwrap_or_default(),
            finished.len(),
            finished.iter().max().copied().unwrap_or_default(),
            count(|e| matches!(e, End::Data)),
            count(|e| matches!(e, End::Open)),
        )
    }

    /// Every watch reset, none before `from` nor after `to`.
    pub fn all_reset_between(&self, from: Duration, to: Duration) -> Result<()> {
        for end in &self.0 {
            match end {
                End::Reset(after) => ensure!(
                    *after >= from && *after <= to,
                    "a watch was reset {after:?} after its headers, not within {from:?}..{to:?}: {}",
                    self.summary()
                ),
                other => bail!("a watch ended {other:?}: {}", self.summary()),
            }
        }
        Ok(())
    }
}

/// `count` watches of `path` on `connections` HTTP/2 connections whose streams'
/// flow-control window is 0 and never opened; each must be answered 200. Each is then
/// read by a task until it ends, or until `limit` after its headers.
pub async fn zero_window_watches(
    dialer: &Dialer,
    path: &str,
    count: usize,
    connections: usize,
    limit: Duration,
) -> Result<Watches> {
    let mut watches = Watches {
        ends: Vec::new(),
        conns: Vec::new(),
    };
    let mut responses = Vec::new();
    for c in 0..connections {
        let tls = dialer.connect(None).await?;
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tls)
            .await?;
        watches.conns.push(tokio::spawn(async move {
            let _ = conn.await;
        }));
        // `count` spread over the connections, the first ones taking the remainder.
        for _ in 0..count / connections + usize::from(c < count % connections) {
            let mut send = send.clone().ready().await?;
            let request = http::Request::get(format!("https://localhost{path}")).body(())?;
            responses.push(send.send_request(request, true)?.0);
        }
    }
    for response in responses {
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .context("no answer's headers")??;
        ensure!(
            response.status() == StatusCode::OK.as_u16(),
            "watch answered {}",
            response.status()
        );
        let since = Instant::now();
        let mut body = response.into_body();
        watches.ends.push(tokio::spawn(async move {
            match tokio::time::timeout_at(since + limit, body.data()).await {
                Err(_) => End::Open,
                Ok(None) => End::Finished(since.elapsed()),
                Ok(Some(Err(error))) if error.is_reset() => End::Reset(since.elapsed()),
                Ok(Some(Err(_))) => End::Finished(since.elapsed()),
                Ok(Some(Ok(_))) => End::Data,
            }
        }));
    }
    Ok(watches)
}
