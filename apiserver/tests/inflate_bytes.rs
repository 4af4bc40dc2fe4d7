//! What a request for a large list kept gzipped costs when its client does not accept gzip
//! (issue 35): the list is decompressed as the client reads it, so the heap the request
//! holds is the decoder's state and one step, whatever the list's size; before, the whole
//! body (46 MB for 50,000 machines) was decompressed into memory of its own per request.
//! A body of about 40 MB is kept as a list is kept (gzipped as it is written), then read
//! through the response a client gets, frame by frame, with the heap sampled after each;
//! the bytes read must be the bytes written.
//!
//! The heap held is what the allocator was asked for and not given back (requested sizes).

use elemental_changelog_apiserver::routes::ready::{INFLATE_CHUNK, Ready};
use http::HeaderMap;
use http_body_util::BodyExt as _;
use sha2::{Digest as _, Sha256};

// dhat's allocator counts the bytes currently allocated (this workspace forbids the `unsafe`
// a hand-written counting allocator needs).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Items of the list: about 40 MB of JSON.
const ITEMS: usize = 200_000;

/// Most heap a request may hold beyond the kept bytes: the decoder's state (a 32 KiB window
/// and its tables, about 45 KiB), one step of [`INFLATE_CHUNK`] and the response's head,
/// with room for what the runtime keeps per task.
const MAX_PER_REQUEST: u64 = 4 * INFLATE_CHUNK as u64;

/// Bytes currently allocated on the heap.
fn live() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

fn item(i: usize) -> String {
    format!(
        "{{\"metadata\":{{\"name\":\"m-{i:06}\",\"namespace\":\"fleet-default\",\"resourceVersion\":\"{}\"}},\"state\":\"UpdatesAvailable\",\"os\":{{\"version\":\"v1.2.{}\"}},\"summary\":{{\"advisories\":{},\"cves\":21}}}}",
        1_048_576 + i,
        i % 7,
        12 + i % 5
    )
}

#[test]
fn a_list_is_streamed_in_bounded_memory() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    // The list, written as a list is kept (never whole in memory), and its digest.
    let mut written = Sha256::new();
    let mut length = 0_usize;
    let ready = Ready::written(40 << 20, "application/json", |out| {
        let mut write = |bytes: &[u8]| -> std::io::Result<()> {
            written.update(bytes);
            length += bytes.len();
            out.write_all(bytes)
        };
        write(b"{\"items\":[")?;
        for i in 0..ITEMS {
            if i > 0 {
                write(b",")?;
            }
            write(item(i).as_bytes())?;
        }
        write(b"]}")
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(length > 30 << 20, "{length} bytes");
    let baseline = live();
    let (most, read, digest) = runtime.block_on(async {
        let response = ready.respond(&HeaderMap::new());
        assert_eq!(
            response.headers()[http::header::CONTENT_LENGTH],
            length.to_string().as_str()
        );
        let mut body = response.into_body();
        let mut most = 0;
        let mut read = 0;
        let mut digest = Sha256::new();
        while let Some(frame) = body.frame().await {
            let chunk = frame
                .unwrap_or_else(|e| panic!("{e}"))
                .into_data()
                .unwrap_or_else(|_| panic!("not data"));
            most = most.max(live().saturating_sub(baseline));
            read += chunk.len();
            digest.update(&chunk);
        }
        (most, read, digest)
    });
    assert_eq!(read, length);
    assert_eq!(
        digest.finalize(),
        written.finalize(),
        "the bytes read differ"
    );
    eprintln!(
        "a list of {length} bytes streamed to a client that does not accept gzip: at most {most} bytes of heap held by the request ({} bytes kept gzipped)",
        ready.weight()
    );
    assert!(
        most <= MAX_PER_REQUEST,
        "the request held {most} bytes, more than {MAX_PER_REQUEST}"
    );
}
