//! The reference: Debian's nginx serving the same bytes as static files over
//! TLS (HTTP/1.1 and HTTP/2), with precompressed `.gz` files for clients that
//! accept gzip (`gzip_static`), so neither side compresses per request.

use std::io::Write as _;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::load::NGINX;
use crate::testbed::{CertPair, Process};

/// A running nginx.
#[derive(Debug)]
pub struct Nginx {
    process: Process,
    port: u16,
}

impl Nginx {
    /// Writes `files` (name, bytes) and their gzip versions under `dir/www`,
    /// the configuration under `dir`, and starts nginx on a free loopback
    /// port with `cert` (as many workers as cores, keep-alive without a
    /// request limit, no access log).
    pub fn start(dir: &Path, cert: &CertPair, files: &[(String, Vec<u8>)]) -> Result<Self> {
        let www = dir.join("www");
        std::fs::create_dir_all(&www).with_context(|| format!("creating {}", www.display()))?;
        for (name, bytes) in files {
            std::fs::write(www.join(name), bytes)?;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(bytes)?;
            std::fs::write(www.join(format!("{name}.gz")), gz.finish()?)?;
        }
        let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&crt, &cert.cert_pem)?;
        std::fs::write(&key, &cert.key_pem)?;
        let port = free_port()?;
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(dir, &www, &crt, &key, port))?;
        let mut process = Process::spawn(
            "nginx",
            Path::new(NGINX),
            [
                "-p".as_ref(),
                dir.as_os_str(),
                "-c".as_ref(),
                conf.as_os_str(),
            ],
            &[],
            dir.join("nginx.log"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            process.ensure_running()?;
            if Instant::now() > deadline {
                bail!("nginx does not listen on {port}: {}", process.tail(4096));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { process, port })
    }

    /// The URL of a file.
    pub fn url(&self, name: &str) -> String {
        format!("https://127.0.0.1:{}/{name}", self.port)
    }

    /// Its master process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

fn config(dir: &Path, www: &Path, crt: &Path, key: &Path, port: u16) -> String {
    let temp: PathBuf = dir.join("temp");
    format!(
        r#"daemon off;
master_process on;
worker_processes auto;
user root;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {temp};
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 75s;
    keepalive_requests 100000000;
    types {{ application/json json; }}
    default_type application/json;
    gzip_static on;
    gzip_vary on;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {crt};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        root {www};
        location / {{ }}
    }}
}}
"#,
        dir = dir.display(),
        temp = temp.display(),
        crt = crt.display(),
        key = key.display(),
        www = www.display(),
    )
}

/// A port free on 127.0.0.1 right now.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}
