//! Ready bytes: an answer rendered once, kept with its `ETag` and its gzip form, and sent as
//! is to every client that asks for it until the data it came from is replaced.
//!
//! [`Ready`] is one rendered answer; [`ReadyCache`] keeps them, bounded in bytes
//! (`--answer-cache-size`), with concurrent misses of one answer rendered once.

use std::{
    future::Future,
    hash::Hash,
    io::{Read as _, Write},
    mem::size_of,
    sync::Arc,
};

use bytes::{Buf as _, Bytes, buf::Reader};
use flate2::{Compression, bufread::GzDecoder, write::GzEncoder};
use futures::StreamExt as _;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full, StreamBody};
use hyper::body::Frame;
use prometheus::{IntCounter, IntCounterVec, IntGauge};
use quick_cache::{OptionsBuilder, Weighter, sync::Cache};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::warn;

use super::{HttpResponse, watch::stream::WatchStream};
use crate::metrics::{Family, Registry, family, gauge_value};

/// Bodies smaller than this are not compressed, as k8s.io/apiserver compresses none under
/// 128 KiB (`defaultGzipThresholdBytes` in `endpoints/handlers/responsewriters`).
///
/// Through the aggregator, a compressed answer is also one that is streamed: kube-apiserver's
/// proxy transport asks for gzip itself when the client did not, decompresses the answer and
/// drops its `Content-Length`, and `httputil.ReverseProxy` then flushes the head ahead of the
/// body and copies the rest as it comes. A client that stops reading after the head (a timeout,
/// a dropped response) makes that copy fail, and kube-apiserver aborts the handler
/// (`http.ErrAbortHandler`: "net/http: abort Handler", a `Panic` audit event) instead of
/// completing the request. Below this size our answers reach the aggregator whole, with their
/// `Content-Length`, and are proxied in one piece, as kube-apiserver's own are.
pub const GZIP_MIN_BYTES: usize = 128 * 1024;
/// What a kept answer costs besides its bytes (the entry, its key, header values).
const ENTRY_OVERHEAD: u64 = 512;
/// Most bytes of a body kept gzipped that one step of its decompression makes ([`Inflate`]).
pub const INFLATE_CHUNK: usize = 64 * 1024;
/// Smallest part of the cache's bytes one of its shards holds: quick_cache splits its capacity
/// among shards (4 per CPU by default) and never keeps an item larger than a shard, so with
/// the default 32 MiB on 2 CPUs no answer of 4 MiB or more (the list of 5,000 machines) was
/// ever kept. With 16 MiB shards, lists of 50,000 machines (about 5 MB gzipped each, one per
/// query) landing three in a shard pushed one another out: a `?package=` list asked 20 times
/// on its own was rendered 5 times (`make bench`). The default cache is one shard.
const SHARD_MIN_BYTES: u64 = 64 << 20;
/// `Cache-Control` of answers that depend on who asks (what kube-apiserver sends).
const PRIVATE: HeaderValue = HeaderValue::from_static("no-cache, private");

/// One answer, ready to send: the body, its gzip form when that is smaller, their `ETag`s,
/// and the headers that go with them.
#[derive(Debug)]
pub struct Ready {
    /// Empty when only the gzip form is kept ([`Ready::written`]).
    body: Bytes,
    gzip: Option<Bytes>,
    /// Only the gzip form is kept: a client that does not accept it gets it decompressed as
    /// it reads ([`Inflate`]).
    gzip_only: bool,
    /// The body's length (also when only its gzip form is kept).
    length: u64,
    etag: HeaderValue,
    gzip_etag: HeaderValue,
    content_type: HeaderValue,
    cache_control: HeaderValue,
    vary: HeaderValue,
    warnings: Box<[HeaderValue]>,
}

impl Ready {
    /// A private (per-user) answer: `Cache-Control: no-cache, private`, varying with the
    /// representation and the encoding asked for (`Vary: Accept, Accept-Encoding`).
    pub fn answer(body: Vec<u8>, content_type: &'static str) -> Self {
        Self::new(body, content_type, PRIVATE)
    }

    /// A discovery or OpenAPI document: public. Its `ETag` is the
    /// document's own (kube-openapi's hash for OpenAPI v3), so clients keep theirs.
    pub fn document(body: &[u8], content_type: &'static str, etag: &str) -> Self {
        let mut ready = Self::new(
            body.to_vec(),
            content_type,
            HeaderValue::from_static("public"),
        );
        if let Ok(value) = HeaderValue::from_str(etag) {
            ready.etag = value;
            ready.gzip_etag = gzip_etag(etag.trim_matches('"'));
        }
        ready
    }

    fn new(body: Vec<u8>, content_type: &'static str, cache_control: HeaderValue) -> Self {
        let hash = Sha256::digest(&body);
        let tag: String = hash[..12].iter().map(|b| format!("{b:02x}")).collect();
        let gzip = compress(&body);
        Self {
            length: body.len() as u64,
            body: Bytes::from(body),
            gzip,
            gzip_only: false,
            etag: HeaderValue::from_str(&format!("\"{tag}\"")).unwrap_or(PRIVATE),
            gzip_etag: gzip_etag(&tag),
            content_type: HeaderValue::from_static(content_type),
            cache_control,
            vary: HeaderValue::from_static("Accept, Accept-Encoding"),
            warnings: Box::default(),
        }
    }

    /// A private answer of `size` bytes that `write` writes: below [`GZIP_MIN_BYTES`] kept as
    /// is, else kept in its gzip form only, compressed as it is written (fast level), so that
    /// the uncompressed bytes of a large list (40 MB for 50,000 machines) are never held; a
    /// client that does not accept gzip (the aggregator always does) gets them decompressed
    /// as it reads them ([`Inflate`]), never whole.
    pub fn written(
        size: usize,
        content_type: &'static str,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> std::io::Result<Self> {
        if size < GZIP_MIN_BYTES {
            let mut body = Vec::with_capacity(size);
            write(&mut body)?;
            return Ok(Self::answer(body, content_type));
        }
        let mut counted = Counted {
            inner: GzEncoder::new(Vec::with_capacity(size / 8), Compression::fast()),
            written: 0,
        };
        write(&mut counted)?;
        let gzip = counted.inner.finish()?;
        let hash = Sha256::digest(&gzip);
        let tag: String = hash[..12].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self {
            body: Bytes::new(),
            gzip: Some(Bytes::from(gzip)),
            gzip_only: true,
            length: counted.written,
            etag: HeaderValue::from_str(&format!("\"{tag}\"")).unwrap_or(PRIVATE),
            gzip_etag: gzip_etag(&tag),
            content_type: HeaderValue::from_static(content_type),
            cache_control: PRIVATE,
            vary: HeaderValue::from_static("Accept, Accept-Encoding"),
            warnings: Box::default(),
        })
    }

    /// Adds `Warning` header values, sent with every response of this answer.
    #[must_use]
    pub fn with_warnings(mut self, warnings: Vec<HeaderValue>) -> Self {
        self.warnings = warnings.into_boxed_slice();
        self
    }

    /// Bytes kept for this answer.
    pub fn weight(&self) -> u64 {
        let gzip = self.gzip.as_ref().map_or(0, Bytes::len);
        (self.body.len() + gzip) as u64 + ENTRY_OVERHEAD
    }

    /// The response to a request with these headers: `304 Not Modified` when `If-None-Match`
    /// names this answer, the gzip form when `Accept-Encoding` allows it, else the body (a
    /// body kept gzipped only decompressed as it is read, each step on the blocking pool:
    /// see [`Ready::respond_inflating`]). Nothing is formatted or copied: the header values
    /// and bytes are shared.
    pub fn respond(&self, request: &HeaderMap) -> HttpResponse {
        self.respond_inflating(request, None)
    }

    /// As [`Ready::respond`], each step of a decompression holding one of `compute`'s
    /// permits when given (`--max-compute-concurrency`).
    pub fn respond_inflating(
        &self,
        request: &HeaderMap,
        compute: Option<Arc<Semaphore>>,
    ) -> HttpResponse {
        let gzip = self
            .gzip
            .as_ref()
            .filter(|_| accepts_gzip(request.get(header::ACCEPT_ENCODING)));
        let etag = if gzip.is_some() {
            &self.gzip_etag
        } else {
            &self.etag
        };
        let not_modified = request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .any(|v| self.matches(v));
        let mut response = if not_modified {
            let mut r = Response::new(Either::Left(Full::new(Bytes::new())));
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            r
        } else {
            Response::new(match (gzip, &self.gzip) {
                (Some(gzip), _) => Either::Left(Full::new(gzip.clone())),
                (None, Some(kept)) if self.gzip_only => {
                    let stream = Inflate::new(kept.clone()).stream(compute);
                    Either::Right(StreamBody::new(stream))
                }
                (None, _) => Either::Left(Full::new(self.body.clone())),
            })
        };
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, self.content_type.clone());
        headers.insert(header::ETAG, etag.clone());
        headers.insert(header::CACHE_CONTROL, self.cache_control.clone());
        headers.insert(header::VARY, self.vary.clone());
        if gzip.is_some() && !not_modified {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        if gzip.is_none() && !not_modified && self.gzip_only {
            // Streamed: its length said ahead, so that a client (and a HEAD) knows it, and a
            // body cut short is an error, not a shorter answer.
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(self.length));
        }
        for warning in &self.warnings {
            headers.append(header::WARNING, warning.clone());
        }
        response
    }

    /// Whether an `If-None-Match` value names this answer (weak comparison, either encoding).
    fn matches(&self, value: &HeaderValue) -> bool {
        let Ok(value) = value.to_str() else {
            return false;
        };
        value.split(',').map(str::trim).any(|candidate| {
            let candidate = candidate.strip_prefix("W/").unwrap_or(candidate).as_bytes();
            candidate == b"*"
                || candidate == self.etag.as_bytes()
                || candidate == self.gzip_etag.as_bytes()
        })
    }

    /// Whether answering a request with these headers decompresses the body (only its gzip
    /// form is kept and the client does not accept it): work done as the client reads.
    pub fn decompresses_for(&self, request: &HeaderMap) -> bool {
        self.gzip_only && !accepts_gzip(request.get(header::ACCEPT_ENCODING))
    }

    /// The body, decompressed whole when only its gzip form is kept (tests compare with it).
    #[cfg(test)]
    pub fn body(&self) -> Bytes {
        match &self.gzip {
            Some(gzip) if self.gzip_only => {
                let mut body = Vec::new();
                let _ = GzDecoder::new(gzip.as_ref()).read_to_end(&mut body);
                Bytes::from(body)
            }
            _ => self.body.clone(),
        }
    }
}

/// Counts the bytes written through it.
struct Counted<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A body kept gzipped, decompressed one step of at most [`INFLATE_CHUNK`] bytes at a time:
/// what a request holds is the decoder's state (its 32 KiB window and tables) and one step,
/// whatever the body's size, next to the kept bytes it shares. Before, each such request
/// decompressed the whole body (46 MB for 50,000 machines) into memory of its own.
pub struct Inflate {
    decoder: GzDecoder<Reader<Bytes>>,
}

impl Inflate {
    /// Decompresses `gzip` (bytes this server compressed).
    pub fn new(gzip: Bytes) -> Self {
        Self {
            decoder: GzDecoder::new(gzip.reader()),
        }
    }

    /// The next at most [`INFLATE_CHUNK`] bytes of the body; `None` at its end.
    pub fn step(&mut self) -> std::io::Result<Option<Bytes>> {
        let mut chunk = vec![0; INFLATE_CHUNK];
        let mut filled = 0;
        while filled < INFLATE_CHUNK {
            match self.decoder.read(&mut chunk[filled..])? {
                0 => break,
                n => filled += n,
            }
        }
        if filled == 0 {
            return Ok(None);
        }
        chunk.truncate(filled);
        Ok(Some(Bytes::from(chunk)))
    }

    /// The body as a stream: each step made when the client has read the last one (hyper
    /// polls a body only when it can send), on the blocking pool, holding one of `compute`'s
    /// permits when given. A step that fails (the server compressed these bytes itself: a
    /// bug) ends the stream short of its `Content-Length`, which the client sees as an error.
    pub fn stream(self, compute: Option<Arc<Semaphore>>) -> WatchStream {
        futures::stream::unfold(self, move |mut inflate| {
            let compute = compute.clone();
            async move {
                let permit = match compute {
                    Some(compute) => Some(compute.acquire_owned().await.ok()?),
                    None => None,
                };
                let (inflate, step) = tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    let step = inflate.step();
                    (inflate, step)
                })
                .await
                .ok()?;
                match step {
                    Ok(Some(chunk)) => Some((Ok(Frame::data(chunk)), inflate)),
                    Ok(None) => None,
                    Err(error) => {
                        warn!(%error, "a kept answer did not decompress");
                        None
                    }
                }
            }
        })
        .boxed()
    }
}

fn gzip_etag(tag: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{tag}-gzip\"")).unwrap_or(PRIVATE)
}

/// The gzip form of `body`, when it is worth sending.
fn compress(body: &[u8]) -> Option<Bytes> {
    if body.len() < GZIP_MIN_BYTES {
        return None;
    }
    let mut encoder = GzEncoder::new(Vec::with_capacity(body.len() / 4), Compression::default());
    encoder.write_all(body).ok()?;
    let gzip = encoder.finish().ok()?;
    (gzip.len() < body.len()).then(|| Bytes::from(gzip))
}

/// Whether an `Accept-Encoding` value allows gzip (`gzip` or `*`, with a non-zero `q`).
pub fn accepts_gzip(value: Option<&HeaderValue>) -> bool {
    let Some(value) = value.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    value.split(',').any(|coding| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let zero = parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        (name.eq_ignore_ascii_case("gzip") || name == "*") && !zero
    })
}

/// A key of kept answers: what it holds besides its own size counts in the cache's weight, so
/// that keys a client chooses (a `from`, a `cve`) cannot make the cache hold more than it says.
pub trait AnswerKeyBytes {
    /// Bytes the key holds on the heap.
    fn heap_bytes(&self) -> usize;
}

impl AnswerKeyBytes for u32 {
    fn heap_bytes(&self) -> usize {
        0
    }
}

#[derive(Clone)]
struct ByBytes;

impl<K: AnswerKeyBytes> Weighter<K, Arc<Ready>> for ByBytes {
    fn weight(&self, key: &K, ready: &Arc<Ready>) -> u64 {
        ready.weight() + (size_of::<K>() + key.heap_bytes()) as u64
    }
}

/// Rendered answers by what they depend on, at most `capacity` bytes in all (bodies, gzip
/// forms and a fixed overhead per answer). An answer whose snapshot was replaced is never
/// found again (the key names the snapshot by generation) and ages out.
pub struct ReadyCache<K> {
    answers: Option<Cache<K, Arc<Ready>, ByBytes>>,
    metrics: Arc<AnswerMetrics>,
}

impl<K: Eq + Hash + Clone + AnswerKeyBytes> ReadyCache<K> {
    /// A cache of at most `capacity` bytes; 0 keeps nothing (every answer is rendered).
    pub fn new(capacity: u64, metrics: Arc<AnswerMetrics>) -> Self {
        // Answers are typically a few KiB; the estimate only sizes the tables.
        let estimated = usize::try_from(capacity / 8192)
            .unwrap_or(usize::MAX)
            .max(16);
        let shards = usize::try_from(capacity / SHARD_MIN_BYTES)
            .unwrap_or(usize::MAX)
            .clamp(1, 64);
        let answers = (capacity > 0).then(|| {
            OptionsBuilder::new()
                .estimated_items_capacity(estimated)
                .weight_capacity(capacity)
                .shards(shards)
                .build()
                .map(|options| {
                    Cache::with_options(options, ByBytes, Default::default(), Default::default())
                })
                .unwrap_or_else(|_| Cache::with_weighter(estimated, capacity, ByBytes))
        });
        Self { answers, metrics }
    }

    /// The answer kept for `key`, if any.
    pub fn get(&self, key: &K) -> Option<Arc<Ready>> {
        let found = self.answers.as_ref().and_then(|a| a.get(key));
        if found.is_some() {
            self.metrics.answer_cache(true);
        }
        found
    }

    /// The answer kept for `key`, or the one `render` makes (kept). Concurrent callers with
    /// one key wait for one render; errors are not kept.
    pub fn get_or_render<E>(
        &self,
        key: K,
        render: impl FnOnce() -> Result<Ready, E>,
    ) -> Result<Arc<Ready>, E> {
        let Some(answers) = &self.answers else {
            self.metrics.answer_cache(false);
            return render().map(Arc::new);
        };
        let mut rendered = false;
        let answer = answers.get_or_insert_with(&key, || {
            rendered = true;
            render().map(Arc::new)
        })?;
        self.metrics.answer_cache(!rendered);
        self.metrics
            .answer_cache_bytes(answers.weight(), answers.len());
        Ok(answer)
    }

    /// The answer kept for `key`, or the one `render` makes (kept), waiting without holding
    /// a thread: concurrent callers with one key wait for one render (the first caller's;
    /// should it fail or go away, the next one renders). Errors are not kept.
    pub async fn get_or_render_async<E>(
        &self,
        key: K,
        render: impl Future<Output = Result<Ready, E>>,
    ) -> Result<Arc<Ready>, E> {
        let Some(answers) = &self.answers else {
            self.metrics.answer_cache(false);
            return render.await.map(Arc::new);
        };
        let guard = match answers.get_value_or_guard_async(&key).await {
            Ok(found) => {
                self.metrics.answer_cache(true);
                return Ok(found);
            }
            Err(guard) => guard,
        };
        let answer = Arc::new(render.await?);
        // Refused only when the placeholder was replaced meanwhile; the answer is still right.
        let _ = guard.insert(answer.clone());
        self.metrics.answer_cache(false);
        self.metrics
            .answer_cache_bytes(answers.weight(), answers.len());
        Ok(answer)
    }

    /// Whether an answer is kept for `key` (no metric counted).
    pub fn contains(&self, key: &K) -> bool {
        self.answers.as_ref().is_some_and(|a| a.peek(key).is_some())
    }

    /// Bytes kept.
    pub fn weight(&self) -> u64 {
        self.answers.as_ref().map_or(0, Cache::weight)
    }

    /// Most bytes kept.
    pub fn capacity(&self) -> u64 {
        self.answers.as_ref().map_or(0, Cache::capacity)
    }
}

family! {
    /// The ready-bytes cache's metrics.
    struct AnswerFamilies {
        lookups: IntCounterVec = metric(
            "answer_cache_requests_total",
            "Answers looked up in the ready-bytes cache, by result (hit: sent as kept; miss: rendered).",
            &["result"],
        ),
        bytes: IntGauge = metric(
            "answer_cache_bytes",
            "Bytes of rendered answers kept (bodies, gzip forms, per-answer overhead); at most --answer-cache-size.",
        ),
        answers: IntGauge = metric("answer_cache_answers", "Rendered answers kept."),
    }
}

/// What the ready-bytes cache counts: lookups (both results shown from the start) and its size.
pub struct AnswerMetrics {
    hits: IntCounter,
    misses: IntCounter,
    bytes: IntGauge,
    answers: IntGauge,
}

impl Family for AnswerMetrics {
    fn register(registry: &Registry) -> Self {
        let family = AnswerFamilies::register(registry);
        Self {
            hits: family.lookups.with_label_values(&["hit"]),
            misses: family.lookups.with_label_values(&["miss"]),
            bytes: family.bytes,
            answers: family.answers,
        }
    }
}

impl AnswerMetrics {
    /// Counts a lookup in the ready-bytes cache.
    pub fn answer_cache(&self, hit: bool) {
        if hit {
            self.hits.inc();
        } else {
            self.misses.inc();
        }
    }

    /// Sets the size of the ready-bytes cache.
    pub fn answer_cache_bytes(&self, bytes: u64, answers: usize) {
        self.bytes.set(gauge_value(bytes));
        self.answers.set(gauge_value(answers));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn request(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    fn json(bytes: usize) -> Vec<u8> {
        let mut body = b"{\"items\":[".to_vec();
        while body.len() < bytes {
            body.extend_from_slice(b"{\"name\":\"kernel-default\",\"version\":\"6.4.0\"},");
        }
        body.extend_from_slice(b"{}]}");
        body
    }

    #[test]
    fn gzip_only_when_accepted_and_smaller() {
        let ready = Ready::answer(json(GZIP_MIN_BYTES), "application/json");
        let plain = ready.respond(&request(&[]));
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        let gzip = ready.respond(&request(&[("accept-encoding", "br, gzip;q=0.8")]));
        assert_eq!(gzip.headers()[header::CONTENT_ENCODING], "gzip");
        assert_ne!(gzip.headers()[header::ETAG], plain.headers()[header::ETAG]);
        let refused = ready.respond(&request(&[("accept-encoding", "gzip;q=0, identity")]));
        assert!(refused.headers().get(header::CONTENT_ENCODING).is_none());
        // Under the threshold (a discovery document, a typical changelog), never compressed.
        for small in [b"{}".to_vec(), json(GZIP_MIN_BYTES - 100)] {
            let small = Ready::answer(small, "application/json");
            let answer = small.respond(&request(&[("accept-encoding", "gzip")]));
            assert!(answer.headers().get(header::CONTENT_ENCODING).is_none());
        }
    }

    #[test]
    fn a_large_written_answer_is_kept_compressed_only_and_served_either_way() {
        use std::io::Read;
        let body = json(GZIP_MIN_BYTES + 50_000);
        let ready = Ready::written(body.len(), "application/json", |out| {
            out.write_all(&body[..10])?;
            out.write_all(&body[10..])
        })
        .unwrap();
        assert!(
            ready.gzip_only && ready.body.is_empty(),
            "no uncompressed copy kept"
        );
        assert!(ready.weight() < (body.len() / 4) as u64);
        let gzip = ready.respond(&request(&[("accept-encoding", "gzip")]));
        assert_eq!(gzip.headers()[header::CONTENT_ENCODING], "gzip");
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(&ready.gzip.as_ref().unwrap()[..])
            .read_to_end(&mut decoded)
            .unwrap();
        assert_eq!(decoded, body);
        // A client that does not accept gzip gets the bytes decompressed (work the caller does
        // off the async threads), with the other ETag.
        assert!(ready.decompresses_for(&request(&[])));
        assert!(!ready.decompresses_for(&request(&[("accept-encoding", "gzip")])));
        let plain = ready.respond(&request(&[]));
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        assert_ne!(plain.headers()[header::ETAG], gzip.headers()[header::ETAG]);
        assert_eq!(ready.body().as_ref(), body.as_slice());
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, plain.headers()[header::ETAG].clone());
        assert_eq!(ready.respond(&headers).status(), StatusCode::NOT_MODIFIED);
        // A small one is kept as it is.
        let small = Ready::written(2, "application/json", |out| out.write_all(b"{}")).unwrap();
        assert!(!small.gzip_only && small.gzip.is_none());
        assert!(!small.decompresses_for(&request(&[])));
        assert_eq!(small.body().as_ref(), b"{}");
    }

    /// A client that does not accept gzip gets a body kept gzipped decompressed as it reads:
    /// the same bytes, with their length said ahead, in steps of at most [`INFLATE_CHUNK`]
    /// (the memory of such a request: `apiserver/tests/inflate_bytes.rs`), each holding a
    /// compute permit when given.
    #[tokio::test]
    async fn a_body_kept_gzipped_is_streamed_decompressed() {
        use http_body_util::BodyExt as _;
        let body = json(20 * INFLATE_CHUNK + 123);
        let ready =
            Ready::written(body.len(), "application/json", |out| out.write_all(&body)).unwrap();
        assert!(ready.gzip_only);
        let compute = Arc::new(Semaphore::new(1));
        let response = ready.respond_inflating(&request(&[]), Some(compute.clone()));
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(
            response.headers()[header::CONTENT_LENGTH],
            body.len().to_string().as_str()
        );
        let mut streamed = Vec::new();
        let mut steps = 0;
        let mut frames = response.into_body();
        // Each step waits for a compute permit.
        let held = compute.clone().acquire_owned().await.unwrap();
        let blocked =
            tokio::time::timeout(std::time::Duration::from_millis(50), frames.frame()).await;
        assert!(blocked.is_err(), "a step ran without a compute permit");
        drop(held);
        while let Some(frame) = frames.frame().await {
            let chunk = frame.unwrap().into_data().unwrap();
            assert!(chunk.len() <= INFLATE_CHUNK, "{}", chunk.len());
            streamed.extend_from_slice(&chunk);
            steps += 1;
        }
        assert_eq!(streamed, body);
        assert!(steps >= 20, "{steps} steps");
        // Accepted gzip, or a 304: nothing to decompress, no length said for it.
        let gzip = ready.respond_inflating(&request(&[("accept-encoding", "gzip")]), None);
        assert_eq!(gzip.headers()[header::CONTENT_ENCODING], "gzip");
        let etag = ready.etag.clone();
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, etag);
        let not_modified = ready.respond(&headers);
        assert_eq!(not_modified.status(), StatusCode::NOT_MODIFIED);
        assert!(not_modified.headers().get(header::CONTENT_LENGTH).is_none());
    }

    #[test]
    fn the_gzip_form_decompresses_to_the_body() {
        use std::io::Read;
        let ready = Ready::answer(json(GZIP_MIN_BYTES + 10_000), "application/json");
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(&ready.gzip.as_ref().unwrap()[..])
            .read_to_end(&mut decoded)
            .unwrap();
        assert_eq!(decoded, ready.body().as_ref());
    }

    #[test]
    fn if_none_match_answers_304_for_either_etag() {
        let ready = Ready::answer(json(GZIP_MIN_BYTES), "application/json");
        let etag = ready.etag.to_str().unwrap().to_owned();
        let gzip_etag = ready.gzip_etag.to_str().unwrap().to_owned();
        for value in [
            etag.clone(),
            format!("W/{gzip_etag}"),
            format!("\"x\", {etag}"),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::IF_NONE_MATCH, value.parse().unwrap());
            let response = ready.respond(&headers);
            assert_eq!(response.status(), StatusCode::NOT_MODIFIED, "{value}");
            assert_eq!(response.headers()[header::ETAG], etag.as_str());
        }
        let other = ready.respond(&request(&[("if-none-match", "\"other\"")]));
        assert_eq!(other.status(), StatusCode::OK);
    }

    #[test]
    fn different_bodies_have_different_etags() {
        let a = Ready::answer(b"{\"a\":1}".to_vec(), "application/json");
        let b = Ready::answer(b"{\"a\":2}".to_vec(), "application/json");
        assert_ne!(a.etag, b.etag);
        assert_eq!(
            a.etag,
            Ready::answer(b"{\"a\":1}".to_vec(), "application/json").etag
        );
    }

    #[test]
    fn warnings_go_with_every_response() {
        let ready = Ready::answer(b"{}".to_vec(), "application/json")
            .with_warnings(vec![HeaderValue::from_static("299 - \"a\"")]);
        for _ in 0..2 {
            let response = ready.respond(&request(&[]));
            assert_eq!(response.headers()[header::WARNING], "299 - \"a\"");
        }
    }

    #[test]
    fn the_cache_is_bounded_in_bytes_and_renders_once() {
        let metrics = Registry::default().register();
        let cache = ReadyCache::new(64 * 1024, metrics);
        let mut renders = 0;
        for _ in 0..3 {
            cache
                .get_or_render::<()>(1u32, || {
                    renders += 1;
                    Ok(Ready::answer(json(2048), "application/json"))
                })
                .unwrap();
        }
        assert_eq!(renders, 1);
        for key in 2..200u32 {
            cache
                .get_or_render::<()>(key, || Ok(Ready::answer(json(2048), "application/json")))
                .unwrap();
        }
        assert!(cache.weight() <= 64 * 1024, "{}", cache.weight());
        let failed = cache.get_or_render(500u32, || Err("no"));
        assert_eq!(failed.unwrap_err(), "no");
        assert!(!cache.contains(&500));
    }

    #[derive(Clone, PartialEq, Eq, Hash)]
    struct Long(String);

    impl AnswerKeyBytes for Long {
        fn heap_bytes(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn keys_count_in_the_weight() {
        let metrics = Registry::default().register();
        let cache = ReadyCache::new(1 << 20, metrics);
        // Small answers under 7,000-byte keys: without the keys, 1 MiB would hold ~1,700 of
        // them and ~12 MiB of keys.
        for n in 0..2000 {
            let key = Long(format!("{n:07000}"));
            cache
                .get_or_render::<()>(key, || {
                    Ok(Ready::answer(b"{}".to_vec(), "application/json"))
                })
                .unwrap();
        }
        let kept = cache.answers.as_ref().unwrap().len();
        assert!(
            kept * 7000 <= 1 << 20,
            "{kept} answers with 7,000-byte keys kept"
        );
        assert!(cache.weight() <= 1 << 20);
    }

    #[tokio::test]
    async fn concurrent_async_renders_of_one_key_render_once() {
        let metrics = Registry::default().register();
        let cache = Arc::new(ReadyCache::new(1 << 20, metrics));
        let renders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let mut waiters = Vec::new();
        for _ in 0..20 {
            let (cache, renders, mut released) = (cache.clone(), renders.clone(), released.clone());
            waiters.push(tokio::spawn(async move {
                cache
                    .get_or_render_async::<()>(7u32, async move {
                        renders.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        released.wait_for(|r| *r).await.unwrap();
                        Ok(Ready::answer(b"{}".to_vec(), "application/json"))
                    })
                    .await
                    .unwrap()
            }));
        }
        tokio::task::yield_now().await;
        release.send_replace(true);
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap().body().as_ref(), b"{}");
        }
        assert_eq!(renders.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// Answers as large as the list of 5,000 machines (4 MiB) and twice that are kept by the
    /// default cache (32 MiB); with quick_cache's default shards (4 per CPU) nothing of 4 MiB
    /// or more was.
    #[test]
    fn large_answers_are_kept() {
        let cache = ReadyCache::new(32 << 20, Registry::default().register());
        for (key, mib) in [(1u32, 1usize), (4, 4), (8, 8)] {
            let body = vec![b'x'; mib << 20];
            cache
                .get_or_render::<()>(key, || Ok(Ready::answer(body, "application/json")))
                .unwrap();
            assert!(cache.contains(&key), "{mib} MiB not kept");
        }
        assert!(cache.weight() <= 32 << 20);
    }

    /// Five answers of 5 MiB (lists of 50,000 machines, one per query) asked in turn fit the
    /// default cache: once each was asked twice (the cache keeps a large answer on its second
    /// request), none is rendered again. With 16 MiB shards, three landing in one shard pushed
    /// one another out.
    #[test]
    fn large_answers_asked_in_turn_stay_kept() {
        let cache = ReadyCache::new(32 << 20, Registry::default().register());
        let renders = std::sync::atomic::AtomicUsize::new(0);
        let ask = |key: u32| {
            cache
                .get_or_render::<()>(key, || {
                    renders.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(Ready::answer(vec![b'x'; 5 << 20], "application/json"))
                })
                .unwrap();
        };
        for _ in 0..2 {
            for key in 0..5 {
                ask(key);
            }
        }
        let warm = renders.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..4 {
            for key in 0..5 {
                ask(key);
            }
        }
        let again = renders.load(std::sync::atomic::Ordering::SeqCst) - warm;
        assert_eq!(again, 0, "{again} of 20 requests rendered again");
    }
}
