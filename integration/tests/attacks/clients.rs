//! Clients that open connections and never make proper use of them, straight to the
//! server's port: silent after the handshake, HTTP/2 idle after one answer (pings and
//! settings answered), HTTP/1 and HTTP/2 answers never read, request heads never finished.

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_integration::stalled::Tls;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// The HTTP/2 connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const HEADERS: u8 = 0x1;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// `SETTINGS_INITIAL_WINDOW_SIZE`.
const INITIAL_WINDOW_SIZE: u16 = 0x4;

/// How a connection the client kept open ended.
#[derive(Debug)]
pub struct Closed {
    /// When the server closed it (EOF or reset), as the client saw it.
    pub at: Instant,
    /// Whether an HTTP/2 `GOAWAY` came first.
    pub goaway: bool,
}

/// Reads `stream` until the server closes it, or `deadline`; answers HTTP/2 pings and
/// settings when `h2`. What the server sends is otherwise ignored.
pub async fn until_closed(stream: &mut Tls, h2: bool, deadline: Instant) -> Result<Closed> {
    let mut goaway = false;
    let mut pending = Vec::new();
    let mut buf = [0_u8; 16 * 1024];
    loop {
        let read = match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => bail!("still open"),
            Ok(Ok(0) | Err(_)) => {
                return Ok(Closed {
                    at: Instant::now(),
                    goaway,
                });
            }
            Ok(Ok(read)) => read,
        };
        if !h2 {
            continue;
        }
        pending.extend_from_slice(&buf[..read]);
        while let Some((kind, flags, payload)) = frame(&mut pending) {
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    // Failing writes mean the server closed: the next read says so.
                    let _ = stream.write_all(&header(0, SETTINGS, ACK, 0)).await;
                }
                PING if flags & ACK == 0 => {
                    let mut ack = header(8, PING, ACK, 0).to_vec();
                    ack.extend_from_slice(&payload);
                    let _ = stream.write_all(&ack).await;
                }
                GOAWAY => goaway = true,
                _ => {}
            }
        }
    }
}

/// Takes one whole frame off the front of `pending`: (type, flags, payload).
fn frame(pending: &mut Vec<u8>) -> Option<(u8, u8, Vec<u8>)> {
    if pending.len() < 9 {
        return None;
    }
    let length =
        usize::from(pending[0]) << 16 | usize::from(pending[1]) << 8 | usize::from(pending[2]);
    if pending.len() < 9 + length {
        return None;
    }
    let frame: Vec<u8> = pending.drain(..9 + length).collect();
    Some((frame[3], frame[4], frame[9..].to_vec()))
}

fn header(length: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let length = u32::try_from(length).unwrap_or(u32::MAX).to_be_bytes();
    let stream = stream.to_be_bytes();
    [
        length[1], length[2], length[3], kind, flags, stream[0], stream[1], stream[2], stream[3],
    ]
}

/// The preface and a SETTINGS frame, with `SETTINGS_INITIAL_WINDOW_SIZE` when given.
pub fn h2_preface(initial_window: Option<u32>) -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    let mut settings = Vec::new();
    if let Some(window) = initial_window {
        settings.extend_from_slice(&INITIAL_WINDOW_SIZE.to_be_bytes());
        settings.extend_from_slice(&window.to_be_bytes());
    }
    bytes.extend_from_slice(&header(settings.len(), SETTINGS, 0, 0));
    bytes.extend_from_slice(&settings);
    bytes
}

/// A HEADERS frame for `GET path` on stream `stream`, HPACK without Huffman or the
/// dynamic table.
pub fn h2_get(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x87]; // :method GET, :scheme https
    for (index, value) in [(4_u8, path), (1, "localhost")] {
        // Literal without indexing, indexed name (:path, :authority).
        block.push(index);
        block.push(u8::try_from(value.len()).unwrap_or(u8::MAX));
        block.extend_from_slice(value.as_bytes());
    }
    let mut bytes = header(block.len(), HEADERS, END_STREAM | END_HEADERS, stream).to_vec();
    bytes.extend_from_slice(&block);
    bytes
}

/// Reads HTTP/2 frames (answering settings) until a frame of `kind` on `stream`
/// arrives, with `within` to wait.
pub async fn h2_until(stream: &mut Tls, kind: u8, on: u32, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut pending = Vec::new();
    let mut buf = [0_u8; 16 * 1024];
    loop {
        let read = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .context("no answer")??;
        ensure!(read > 0, "closed before the answer");
        pending.extend_from_slice(&buf[..read]);
        while let Some((got, flags, _)) = frame_on(&mut pending, on) {
            if got == SETTINGS && flags & ACK == 0 {
                stream.write_all(&header(0, SETTINGS, ACK, 0)).await?;
            }
            if got == kind {
                return Ok(());
            }
        }
    }
}

/// [`frame`], with frames on other streams than `on` (and 0) reported as type 0xff.
fn frame_on(pending: &mut Vec<u8>, on: u32) -> Option<(u8, u8, Vec<u8>)> {
    if pending.len() < 9 {
        return None;
    }
    let stream = u32::from_be_bytes([pending[5], pending[6], pending[7], pending[8]]) & 0x7fff_ffff;
    let (kind, flags, payload) = frame(pending)?;
    if stream == on || stream == 0 {
        Some((kind, flags, payload))
    } else {
        Some((0xff, flags, payload))
    }
}

/// The HEADERS frame type, for [`h2_until`].
pub const H2_HEADERS: u8 = HEADERS;
