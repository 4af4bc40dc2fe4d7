//! A hostile registry: a tiny HTTP/1.1 server on loopback that answers the
//! registry API with what a broken or malicious registry (or a proxy in the
//! way) might send: endless or huge manifests and token answers, bodies that
//! trickle forever, token realms elsewhere. Requests for paths it was not
//! told about are forwarded to nothing: they get a 404 with an OCI error.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Result;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// How the server answers one path.
#[derive(Clone, Debug)]
pub enum Answer {
    /// `200` with `body`, its `Content-Type` and, for manifests, a
    /// `Docker-Content-Digest` of the body.
    Ok {
        /// `Content-Type`.
        content_type: String,
        /// The body.
        body: Vec<u8>,
    },
    /// `200` with a chunked body of 1 MiB chunks that never ends, and a
    /// digest header (HEAD requests get the headers only).
    Endless {
        /// The digest announced.
        digest: String,
    },
    /// `200` announcing `Content-Length: length` and sending zeros until
    /// the client goes away.
    Announced {
        /// The length announced.
        length: u64,
    },
    /// `200` with headers (and a digest header), then one byte every
    /// `every`, forever.
    Trickle {
        /// The digest announced.
        digest: String,
        /// Pause between bytes.
        every: Duration,
    },
    /// `401` with a Bearer challenge naming `realm`, unless the request
    /// carries `Authorization: Bearer <token>`; then `then`.
    Bearer {
        /// The realm URL.
        realm: String,
        /// The token that is accepted.
        token: String,
        /// The answer once authorized.
        then: Box<Answer>,
    },
}

/// The running server; stops when dropped.
pub struct HostileRegistry {
    addr: SocketAddr,
    routes: Arc<Mutex<HashMap<String, Answer>>>,
    bytes_sent: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostileRegistry {
    /// Listens on a free 127.0.0.1 port.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let routes: Arc<Mutex<HashMap<String, Answer>>> = Arc::default();
        let bytes_sent = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let routes = Arc::clone(&routes);
            let bytes_sent = Arc::clone(&bytes_sent);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let routes = Arc::clone(&routes);
                    let bytes_sent = Arc::clone(&bytes_sent);
                    tokio::spawn(async move {
                        let _ = serve(stream, routes, bytes_sent).await;
                    });
                }
            }
        });
        Ok(Self {
            addr,
            routes,
            bytes_sent,
            task,
        })
    }

    /// `127.0.0.1:<port>`, as in image references (list it as insecure).
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `<host>/<repository_and_tag>`.
    pub fn image(&self, repository_and_tag: &str) -> String {
        format!("{}/{repository_and_tag}", self.host())
    }

    /// Answers `path` (without query) with `answer` from now on.
    pub fn route(&self, path: &str, answer: Answer) {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(path.to_owned(), answer);
    }

    /// Body bytes sent so far, over all requests.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.load(Ordering::Relaxed)
    }
}

/// A manifest answer whose digest header matches its body.
pub fn manifest(media_type: &str, body: Vec<u8>) -> Answer {
    Answer::Ok {
        content_type: media_type.to_owned(),
        body,
    }
}

async fn serve(
    mut stream: TcpStream,
    routes: Arc<Mutex<HashMap<String, Answer>>>,
    bytes_sent: Arc<AtomicU64>,
) -> Result<()> {
    loop {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await? == 0 || head.len() > 64 << 10 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let mut lines = head.lines();
        let mut request_line = lines.next().unwrap_or_default().split(' ');
        let method = request_line.next().unwrap_or_default().to_owned();
        let target = request_line.next().unwrap_or_default();
        let path = target.split('?').next().unwrap_or_default().to_owned();
        let authorization = lines
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("authorization"))
            .map(|(_, value)| value.trim().to_owned());
        let answer = routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&path)
            .cloned();
        let head_only = method == "HEAD";
        let keep_going = answer_with(
            &mut stream,
            answer,
            authorization.as_deref(),
            head_only,
            &bytes_sent,
        )
        .await?;
        if !keep_going {
            return Ok(());
        }
    }
}

/// Writes one answer; false when the connection cannot be reused.
async fn answer_with(
    stream: &mut TcpStream,
    answer: Option<Answer>,
    authorization: Option<&str>,
    head_only: bool,
    bytes_sent: &AtomicU64,
) -> Result<bool> {
    let mut answer = answer;
    if let Some(Answer::Bearer { realm, token, then }) = &answer {
        if authorization != Some(format!("Bearer {token}").as_str()) {
            let body =
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"{realm}\",service=\"hostile\"\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            if !head_only {
                stream.write_all(body).await?;
            }
            return Ok(true);
        }
        answer = Some((**then).clone());
    }
    match answer {
        None => {
            let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#;
            let head = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            if !head_only {
                stream.write_all(body).await?;
            }
            Ok(true)
        }
        Some(Answer::Ok { content_type, body }) => {
            let digest = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(&body));
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nDocker-Content-Digest: {digest}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            if !head_only {
                stream.write_all(&body).await?;
                bytes_sent.fetch_add(body.len() as u64, Ordering::Relaxed);
            }
            Ok(true)
        }
        Some(Answer::Endless { digest }) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nDocker-Content-Digest: {digest}\r\nTransfer-Encoding: chunked\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await?;
            if head_only {
                return Ok(true);
            }
            let chunk = vec![b' '; 1 << 20];
            loop {
                stream
                    .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                stream.write_all(&chunk).await?;
                stream.write_all(b"\r\n").await?;
                bytes_sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        }
        Some(Answer::Announced { length }) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await?;
            if head_only {
                return Ok(true);
            }
            let chunk = vec![0u8; 1 << 20];
            let mut sent = 0u64;
            while sent < length {
                let n = chunk
                    .len()
                    .min(usize::try_from(length - sent).unwrap_or(usize::MAX));
                stream.write_all(&chunk[..n]).await?;
                sent += n as u64;
                bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
            }
            Ok(true)
        }
        Some(Answer::Trickle { digest, every }) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDocker-Content-Digest: {digest}\r\nTransfer-Encoding: chunked\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await?;
            if head_only {
                return Ok(true);
            }
            loop {
                tokio::time::sleep(every).await;
                stream.write_all(b"1\r\n \r\n").await?;
                bytes_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(Answer::Bearer { .. }) => {
            anyhow::bail!("a Bearer answer cannot wrap another Bearer answer")
        }
    }
}
