//! The load generators and what they report: Debian's `wrk` (HTTP/1.1) and
//! `h2load` from `nghttp2-client` (HTTP/2), and the Debian packages the
//! benchmark needs, installed when missing.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};

/// Debian packages the benchmark runs, with the command each one provides.
pub const PACKAGES: [(&str, &str); 3] = [
    ("wrk", "wrk"),
    ("nghttp2-client", "h2load"),
    ("nginx-light", "nginx"),
];

/// Where Debian's nginx binary is (not on a non-root `PATH`).
pub const NGINX: &str = "/usr/sbin/nginx";

fn installed(command: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([Path::new("/usr/sbin").to_path_buf()])
        .any(|dir| dir.join(command).is_file())
}

/// Installs the [`PACKAGES`] that are missing with `apt-get` (as root, or
/// through `sudo`). Debian's `nginx-light` would start a system nginx on
/// port 80: a `policy-rc.d` that forbids service starts is in place during
/// the install, as `.ci/deps` does for the registry.
pub fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, command)| !installed(command))
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("bench: installing {}", missing.join(" "));
    let root = rustix::process::getuid().is_root();
    let run = |args: &[&str]| -> Result<()> {
        let mut command = if root {
            Command::new(args[0])
        } else {
            let mut sudo = Command::new("sudo");
            sudo.arg(args[0]);
            sudo
        };
        let status = command
            .args(&args[1..])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .with_context(|| format!("running {}", args.join(" ")))?;
        ensure!(status.success(), "{} failed ({status})", args.join(" "));
        Ok(())
    };
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let created_policy = !policy.exists();
    if created_policy {
        run(&[
            "sh",
            "-c",
            "printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d",
        ])?;
    }
    let mut install = vec!["apt-get", "install", "-y", "-qq", "--no-install-recommends"];
    install.extend(&missing);
    let result = run(&["apt-get", "update", "-qq"]).and_then(|()| run(&install));
    if created_policy {
        run(&["rm", "-f", "/usr/sbin/policy-rc.d"])?;
    }
    result
}

/// The protocol a load generator speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    /// HTTP/1.1 with keep-alive (`wrk`).
    Http1,
    /// HTTP/2 over TLS with ALPN (`h2load`).
    Http2,
}

impl Protocol {
    /// As the report writes it.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Http1 => "HTTP/1.1",
            Protocol::Http2 => "HTTP/2",
        }
    }
}

/// One load run's parameters.
#[derive(Clone, Debug)]
pub struct Load<'a> {
    /// The URL, `https://127.0.0.1:<port>/...`.
    pub url: &'a str,
    /// Extra request headers (`name: value`).
    pub headers: &'a [String],
    /// Client threads.
    pub threads: usize,
    /// Open connections.
    pub connections: usize,
    /// How long.
    pub duration: Duration,
}

/// What one load run measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    /// Completed requests per second.
    pub requests_per_second: f64,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// Bytes received per response (headers and body, as the tool counts them).
    pub bytes_per_response: f64,
    /// Requests that did not get a 2xx answer, or failed.
    pub errors: u64,
}

/// Runs a load generator with the load's headers and URL; its stdout.
fn run(mut command: Command, load: &Load<'_>) -> Result<String> {
    for header in load.headers {
        command.arg("-H").arg(header);
    }
    let name = command.get_program().to_string_lossy().into_owned();
    let output = command
        .arg(load.url)
        .output()
        .with_context(|| format!("running {name}"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "{name} failed ({}): {text}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(text)
}

/// Runs `wrk` (HTTP/1.1, TLS without verification) and parses its report.
pub fn wrk(load: &Load<'_>) -> Result<Measured> {
    let mut command = Command::new("wrk");
    command
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{}s", load.duration.as_secs().max(1)))
        .arg("--latency");
    let text = run(command, load)?;
    parse_wrk(&text).with_context(|| format!("reading wrk's report:\n{text}"))
}

/// Parses `wrk --latency`'s report.
pub fn parse_wrk(text: &str) -> Result<Measured> {
    let mut measured = Measured::default();
    let mut requests = None;
    let mut read = None;
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", value] => measured.p50_ms = duration_ms(value)?,
            ["99%", value] => measured.p99_ms = duration_ms(value)?,
            ["Requests/sec:", value] => measured.requests_per_second = value.parse()?,
            [count, "requests", "in", _, bytes, "read"] => {
                requests = Some(count.parse::<f64>()?);
                read = Some(size_bytes(bytes)?);
            }
            ["Non-2xx", "or", "3xx", "responses:", count] => {
                measured.errors += count.parse::<u64>()?
            }
            ["Socket", "errors:", rest @ ..] => {
                for value in rest.iter().skip(1).step_by(2) {
                    measured.errors += value.trim_end_matches(',').parse::<u64>()?;
                }
            }
            _ => {}
        }
    }
    let (Some(requests), Some(read)) = (requests, read) else {
        bail!("no \"N requests in T, B read\" line");
    };
    // A cell where nothing completed is a result too (zero throughput).
    if requests > 0.0 {
        measured.bytes_per_response = read / requests;
    }
    Ok(measured)
}

/// `1.23ms`, `850.00us`, `1.01s` in milliseconds.
fn duration_ms(value: &str) -> Result<f64> {
    for (unit, factor) in [("us", 0.001), ("ms", 1.0), ("m", 60_000.0), ("s", 1000.0)] {
        if let Some(number) = value.strip_suffix(unit) {
            return Ok(number.parse::<f64>()? * factor);
        }
    }
    bail!("{value:?} is not a duration")
}

/// `500.00MB`, `12.3KB`, `100B` in bytes.
fn size_bytes(value: &str) -> Result<f64> {
    for (unit, factor) in [
        ("KB", 1024.0),
        ("MB", 1024.0 * 1024.0),
        ("GB", 1024.0 * 1024.0 * 1024.0),
        ("B", 1.0),
    ] {
        if let Some(number) = value.strip_suffix(unit) {
            return Ok(number.parse::<f64>()? * factor);
        }
    }
    bail!("{value:?} is not a size")
}

/// Runs `h2load` (HTTP/2 over TLS, one stream per connection at a time, as
/// `wrk` has one request per connection) and computes the latency
/// percentiles from its per-request log.
pub fn h2load(load: &Load<'_>, log: &Path) -> Result<Measured> {
    let mut command = Command::new("h2load");
    command
        .arg(format!("--threads={}", load.threads))
        .arg(format!("--clients={}", load.connections))
        .arg("--max-concurrent-streams=1")
        .arg(format!("--duration={}", load.duration.as_secs().max(1)))
        .arg("--warm-up-time=1")
        .arg(format!("--log-file={}", log.display()));
    let text = run(command, load)?;
    let log_text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let _ = std::fs::remove_file(log);
    parse_h2load(&text, &log_text).with_context(|| format!("reading h2load's report:\n{text}"))
}

/// Parses `h2load`'s report and its `--log-file` (start µs, status, µs to
/// the end of the response; tab-separated).
pub fn parse_h2load(text: &str, log: &str) -> Result<Measured> {
    let mut measured = Measured::default();
    let mut done = None;
    let mut received = None;
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["finished", "in", _, rate, "req/s,", ..] => {
                measured.requests_per_second = rate.parse()?;
            }
            [
                "requests:",
                _,
                "total,",
                _,
                "started,",
                count,
                "done,",
                _,
                "succeeded,",
                failed,
                "failed,",
                errored,
                "errored,",
                timeout,
                "timeout",
            ] => {
                done = Some(count.parse::<f64>()?);
                measured.errors +=
                    failed.parse::<u64>()? + errored.parse::<u64>()? + timeout.parse::<u64>()?;
            }
            [
                "status",
                "codes:",
                _,
                "2xx,",
                x3,
                "3xx,",
                x4,
                "4xx,",
                x5,
                "5xx",
            ] => {
                measured.errors += x3.parse::<u64>()? + x4.parse::<u64>()? + x5.parse::<u64>()?;
            }
            ["traffic:", _, total, "total,", ..] => {
                received = Some(total.trim_matches(['(', ')']).parse::<f64>()?);
            }
            _ => {}
        }
    }
    let (Some(done), Some(received)) = (done, received) else {
        bail!("no requests: or traffic: line");
    };
    let mut latencies: Vec<u64> = log
        .lines()
        .filter_map(|line| line.split('\t').nth(2)?.trim().parse().ok())
        .collect();
    if done == 0.0 || latencies.is_empty() {
        // Nothing completed: zero throughput.
        return Ok(measured);
    }
    measured.bytes_per_response = received / done;
    latencies.sort_unstable();
    measured.p50_ms = percentile(&latencies, 0.50) as f64 / 1000.0;
    measured.p99_ms = percentile(&latencies, 0.99) as f64 / 1000.0;
    Ok(measured)
}

/// The `q` quantile of sorted values (nearest rank).
pub fn percentile<T: Copy>(sorted: &[T], q: f64) -> T {
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_wrk() {
        let text = "Running 10s test @ https://127.0.0.1:1/x
  2 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.01ms    1.02ms  20.00ms   80.00%
    Req/Sec    12.50k     1.00k   14.00k    70.00%
  Latency Distribution
     50%  850.00us
     75%    2.40ms
     90%    3.00ms
     99%    1.05s
  250000 requests in 10.00s, 500.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  25000.00
Transfer/sec:     50.00MB
";
        let m = parse_wrk(text).unwrap();
        assert_eq!(m.requests_per_second, 25000.0);
        assert!((m.p50_ms - 0.85).abs() < 1e-9);
        assert!((m.p99_ms - 1050.0).abs() < 1e-9);
        assert_eq!(m.errors, 8);
        assert!((m.bytes_per_response - 500.0 * 1024.0 * 1024.0 / 250_000.0).abs() < 1e-6);
        assert!(parse_wrk("Requests/sec: 1\n").is_err());
        let none = parse_wrk("  0 requests in 1.07s, 0.00B read\nRequests/sec: 0.00\n").unwrap();
        assert_eq!(none.requests_per_second, 0.0);
    }

    #[test]
    fn reads_h2load() {
        let text = "finished in 10.00s, 20000.50 req/s, 40.00MB/s
requests: 200 total, 200 started, 200 done, 198 succeeded, 2 failed, 0 errored, 0 timeout
status codes: 198 2xx, 0 3xx, 2 4xx, 0 5xx
traffic: 400.00KB (409600) total, 1.00KB (1024) headers (space savings 95.00%), 390.00KB (399360) data
";
        let log: String = (1..=200)
            .map(|i| format!("1700000000000000\t200\t{}\n", i * 10))
            .collect();
        let m = parse_h2load(text, &log).unwrap();
        assert_eq!(m.requests_per_second, 20000.5);
        assert_eq!(m.errors, 4);
        assert_eq!(m.bytes_per_response, 2048.0);
        assert_eq!(m.p50_ms, 1.0);
        assert_eq!(m.p99_ms, 1.98);
        assert_eq!(parse_h2load(text, "").unwrap().requests_per_second, 20000.5);
        assert!(parse_h2load("finished in 1s, 1 req/s, 1B/s\n", "").is_err());
    }

    #[test]
    fn nearest_rank() {
        let v: Vec<u32> = (1..=20).collect();
        assert_eq!(percentile(&v, 0.5), 10);
        assert_eq!(percentile(&v, 0.99), 20);
        assert_eq!(percentile(&[7], 0.99), 7);
    }
}
