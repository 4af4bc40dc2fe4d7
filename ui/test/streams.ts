// A fake `fetch` that answers watch requests with streams the test writes
// to, as kube-apiserver (and this server) stream watch events: one JSON
// event a line in a body that stays open. The stream function under test is
// the real `fetchStreamer` reading the `Response` body's `ReadableStream`.
import { vi } from 'vitest';
import { fetchStreamer } from '../src/stream';

/** One watch request the fake answered with an open stream. */
export interface OpenWatch {
  url: string;
  /** `credentials` and headers the request was made with. */
  init: RequestInit;
  /** Sends one event (`{type, object}`) as a line. */
  send(type: string, object: unknown): void;
  /** Sends raw text (a partial line, a line that is no event). */
  sendRaw(text: string): void;
  /** Ends the stream as the server does at `timeoutSeconds`. */
  end(): void;
  /** Whether the client aborted the request (unmount, stop). */
  readonly aborted: boolean;
  /** Whether the client closed the body before its end (after an ERROR event). */
  readonly cancelled: boolean;
}

export function fakeWatches() {
  const opened: OpenWatch[] = [];
  const waiters: (() => void)[] = [];
  /** Answers for the next requests instead of a stream (e.g. a 410 `Status`), in order. */
  const answers: { status: number; body: unknown }[] = [];
  const encoder = new TextEncoder();

  const fetchImpl = vi.fn(async (input: RequestInfo | URL, init: RequestInit = {}) => {
    const url = String(input);
    const answer = answers.shift();
    if (answer) return new Response(JSON.stringify(answer.body), { status: answer.status });
    let controller!: ReadableStreamDefaultController<Uint8Array>;
    let aborted = false;
    let cancelled = false;
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        controller = c;
      },
      cancel() {
        cancelled = true;
      },
    });
    init.signal?.addEventListener('abort', () => {
      aborted = true;
      try {
        controller.error(new DOMException('The operation was aborted.', 'AbortError'));
      } catch {
        // Already closed.
      }
    });
    const watch: OpenWatch = {
      url,
      init,
      send: (type, object) => controller.enqueue(encoder.encode(`${JSON.stringify({ type, object })}\n`)),
      sendRaw: (text) => controller.enqueue(encoder.encode(text)),
      end: () => controller.close(),
      get aborted() {
        return aborted;
      },
      get cancelled() {
        return cancelled;
      },
    };
    opened.push(watch);
    waiters.splice(0).forEach((wake) => wake());
    return new Response(body, { status: 200, headers: { 'Content-Type': 'application/json' } });
  });

  let cursor = 0;
  /** The next watch opened (waits for it). */
  async function next(): Promise<OpenWatch> {
    while (opened.length <= cursor) await new Promise<void>((resolve) => waiters.push(resolve));
    return opened[cursor++]!;
  }

  return { fetch: fetchImpl, streamer: fetchStreamer(fetchImpl as typeof fetch), opened, answers, next };
}

/** The query of a watch URL, for asserting on. */
export function watchQuery(url: string): Record<string, string> {
  return Object.fromEntries(new URL(url, 'http://x').searchParams);
}
