// Requests whose answer is read as it arrives (a watch stream), and the one way
// of opening them on top of `fetch`. Below both the API module (`api.ts`, whose
// `ChangelogApi` carries the `Streamer` it is given) and the live lists
// (`watch.ts`, which read what it opens). No Rancher or Vue import.

/** An answer read as it arrives (a watch's): its HTTP status and its body as text, chunk by chunk. */
export interface StreamResponse {
  status: number;
  chunks: AsyncIterable<string>;
}

/**
 * Opens `url` (a path on the UI's origin) as the logged-in user and streams
 * its body; `signal` aborts the request and ends the stream.
 */
export type Streamer = (url: string, signal: AbortSignal) => Promise<StreamResponse>;

/**
 * A `Streamer` on top of `fetch` and the body's `ReadableStream`, for pages
 * served on the API's origin: the test harness behind `kubectl proxy`, and
 * Rancher, whose `/k8s/clusters/<id>/` proxy authenticates the session
 * cookie `fetch` sends (`credentials: 'same-origin'`).
 */
export function fetchStreamer(fetchImpl: typeof fetch = fetch): Streamer {
  return async (url, signal) => {
    const response = await fetchImpl(url, {
      headers: { Accept: 'application/json' },
      credentials: 'same-origin',
      cache: 'no-store',
      signal,
    });
    return { status: response.status, chunks: textChunks(response.body) };
  };
}

async function* textChunks(body: ReadableStream<Uint8Array> | null): AsyncGenerator<string> {
  if (!body) return;
  const reader = body.getReader();
  const decoder = new TextDecoder();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      yield decoder.decode(value, { stream: true });
    }
    const tail = decoder.decode();
    if (tail) yield tail;
  } finally {
    // Returning early (an ERROR event, a stop) closes the connection.
    reader.cancel().catch(() => undefined);
  }
}
