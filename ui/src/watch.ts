// Lists kept up to date with Kubernetes watch, as kube-apiserver serves it
// (and client-go's reflector follows it): list, then
// `?watch=true&resourceVersion=<the list's>&allowWatchBookmarks=true`, a
// stream of newline-delimited `{"type": ..., "object": ...}` events applied
// to what was listed. No Rancher or Vue import: the caller passes the
// function that opens the stream and gets the items through callbacks.
import type { ChangelogApi, MachineListOptions, Problem, Result } from './api';
import { problemFromResponse } from './api';
import type { Streamer } from './stream';
import type { MachineInventoryChangelogSummary, Status } from './types';

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

/** One line of a watch stream. */
export interface WatchEvent {
  type: WatchEventType;
  object: unknown;
}

/** The events of a watch stream: one JSON object a line; a line that is not an event is an error. */
export async function* watchEvents(chunks: AsyncIterable<string>): AsyncGenerator<WatchEvent> {
  let buffer = '';
  for await (const chunk of chunks) {
    buffer += chunk;
    let end: number;
    while ((end = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, end).trim();
      buffer = buffer.slice(end + 1);
      if (line) yield parseEvent(line);
    }
  }
  if (buffer.trim()) yield parseEvent(buffer.trim());
}

const EVENT_TYPES = new Set<string>(['ADDED', 'MODIFIED', 'DELETED', 'BOOKMARK', 'ERROR']);

function parseEvent(line: string): WatchEvent {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    throw new Error(`the watch stream sent a line that is not JSON: ${line.slice(0, 200)}`);
  }
  const event = value as Partial<WatchEvent> | null;
  if (!event || typeof event.type !== 'string' || !EVENT_TYPES.has(event.type) || typeof event.object !== 'object') {
    throw new Error(`the watch stream sent something that is not a watch event: ${line.slice(0, 200)}`);
  }
  return event as WatchEvent;
}

/** What a live list needs of a served object. */
export interface Listable {
  metadata: { name: string; namespace: string; resourceVersion?: string };
}

/** A list answer: its items and the `resourceVersion` to watch from. */
export interface ListAnswer<T> {
  metadata: { resourceVersion?: string };
  items: T[];
}

/** Where the state of a live list stands, for the page to show. */
export type LiveStatus =
  /** A watch stream is open: changes appear as they happen. */
  | { state: 'live' }
  /** The stream or a re-list failed; tried again after a backoff, the items shown are the last known. */
  | { state: 'retrying'; problem: Problem }
  /** The items are listed but cannot be watched (no stream function, no `resourceVersion`, a watch refused). */
  | { state: 'static'; problem?: Problem }
  /** The first list failed: nothing to show but the problem. */
  | { state: 'failed'; problem: Problem };

export interface LiveListOptions<T extends Listable> {
  /** Lists the items (also again after a `410 Gone`). */
  list(): Promise<Result<ListAnswer<T>>>;
  /** The URL of the watch from `resourceVersion`, ending by itself after `timeoutSeconds`. */
  watchUrl(resourceVersion: string, timeoutSeconds: number): string;
  /** Opens the watch; undefined: list once, never watch. */
  stream: Streamer | undefined;
  /** Every time what is listed changes: all items, in the list's order. */
  onItems(items: T[]): void;
  onStatus(status: LiveStatus): void;
  /** Waits `ms` unless `signal` aborts first; a timer by default (tests pass their own). */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  /** A number in [0, 1), for the jitter of backoffs and watch timeouts; `Math.random` by default. */
  random?: () => number;
}

/** The first wait after a failure; doubled per failure in a row, up to `MAX_BACKOFF_MS`. */
export const INITIAL_BACKOFF_MS = 1_000;
export const MAX_BACKOFF_MS = 30_000;
/** A watch that lasted this long made progress even without an event (its end is no failure). */
const HEALTHY_WATCH_MS = 10_000;
/** A watch asks the server to end it after 5 to 10 minutes, as client-go's reflector does. */
const MIN_WATCH_TIMEOUT_SECONDS = 300;

/** A running live list; `stop` ends it (the stream is aborted, no callback is made afterwards). */
export interface LiveList {
  stop(): void;
  /** Settles when the list stops: stopped, failed, or static. */
  readonly done: Promise<void>;
}

/**
 * Lists, then watches from the list's `resourceVersion` and applies each
 * event to the items:
 *
 * - `ADDED`/`MODIFIED` put the object in place (a new one where its
 *   `namespace/name` sorts, as lists are sorted), `DELETED` removes it,
 *   each moving the `resourceVersion` to the object's;
 * - `BOOKMARK` only moves the `resourceVersion`;
 * - a stream that ends (the server's `timeoutSeconds`, a proxy closing it)
 *   is resumed from the last `resourceVersion`, so nothing is missed or
 *   repeated;
 * - `410 Gone` (as the answer, or an `ERROR` event with code 410 or reason
 *   `Expired`/`Gone`: the server cannot resume from that `resourceVersion`,
 *   e.g. another replica) re-lists and watches again;
 * - a failure (network, 5xx, 429, a malformed line, a watch that ends at
 *   once) waits with exponential backoff and jitter before the next try, so
 *   a broken server never gets a tight loop; a watch that made progress
 *   resets the backoff;
 * - a refused watch (4xx other than 410 and 429: RBAC without `watch`, a
 *   server without watch) leaves the items as listed (`static`).
 */
export function liveList<T extends Listable>(options: LiveListOptions<T>): LiveList {
  const controller = new AbortController();
  const signal = controller.signal;
  const sleep = options.sleep ?? abortableSleep;
  const random = options.random ?? Math.random;
  let items: T[] = [];
  let failures = 0;

  const report = (status: LiveStatus) => {
    if (!signal.aborted) options.onStatus(status);
  };
  const publish = () => {
    if (!signal.aborted) options.onItems([...items]);
  };
  const backoff = async (problem: Problem) => {
    failures += 1;
    report({ state: 'retrying', problem });
    const ceiling = Math.min(MAX_BACKOFF_MS, INITIAL_BACKOFF_MS * 2 ** (failures - 1));
    await sleep(ceiling / 2 + (ceiling / 2) * random(), signal);
  };

  /** Where the next watch starts: the list's, then each event's and bookmark's; undefined: list first. */
  let resourceVersion: string | undefined;
  /** Applies one event; returns what ends the watch, if it does. */
  const apply = (event: WatchEvent): WatchEnd | undefined => {
    if (event.type === 'ERROR') {
      const status = event.object as Status;
      if (status.code === 410 || status.reason === 'Expired' || status.reason === 'Gone') return { kind: 'expired' };
      return { kind: 'failed', problem: problemFromResponse({ status: status.code ?? 500, body: status }) };
    }
    const object = event.object as T;
    const rv = object.metadata?.resourceVersion;
    if (rv) resourceVersion = rv;
    if (event.type === 'BOOKMARK') return undefined;
    if (typeof object.metadata?.name !== 'string') return undefined;
    const key = keyOf(object);
    const at = items.findIndex((item) => keyOf(item) === key);
    if (event.type === 'DELETED') {
      if (at >= 0) items.splice(at, 1);
    } else if (at >= 0) {
      items[at] = object;
    } else {
      const before = items.findIndex((item) => keyOf(item) > key);
      items.splice(before < 0 ? items.length : before, 0, object);
    }
    publish();
    return undefined;
  };

  const watchOnce = async (stream: Streamer, from: string): Promise<WatchEnd> => {
    const timeout = Math.floor(MIN_WATCH_TIMEOUT_SECONDS * (1 + random()));
    const started = Date.now();
    let progressed = false;
    try {
      const response = await stream(options.watchUrl(from, timeout), signal);
      if (response.status === 410) return { kind: 'expired' };
      if (response.status < 200 || response.status >= 300) {
        const problem = problemFromResponse({ status: response.status, body: await bodyOf(response.chunks) });
        const retry = response.status === 429 || response.status >= 500;
        return retry ? { kind: 'failed', problem } : { kind: 'refused', problem };
      }
      report({ state: 'live' });
      for await (const event of watchEvents(response.chunks)) {
        if (signal.aborted) return { kind: 'stopped' };
        const end = apply(event);
        if (end) return end;
        progressed = true;
      }
    } catch (error) {
      if (signal.aborted) return { kind: 'stopped' };
      return { kind: 'failed', problem: failure(`the watch failed: ${describe(error)}`) };
    }
    if (signal.aborted) return { kind: 'stopped' };
    return { kind: 'ended', progressed: progressed || Date.now() - started >= HEALTHY_WATCH_MS };
  };

  const run = async () => {
    let listed = false;
    while (!signal.aborted) {
      if (resourceVersion === undefined) {
        const answer = await options.list();
        if (signal.aborted) return;
        if (!answer.ok) {
          if (!listed) return report({ state: 'failed', problem: answer.problem });
          await backoff(answer.problem);
          continue;
        }
        listed = true;
        items = [...answer.value.items];
        publish();
        resourceVersion = answer.value.metadata?.resourceVersion || undefined;
        if (!options.stream) return report({ state: 'static' });
        if (resourceVersion === undefined) {
          return report({ state: 'static', problem: failure('the list has no resourceVersion to watch from') });
        }
      }
      const end = await watchOnce(options.stream!, resourceVersion);
      switch (end.kind) {
        case 'stopped':
          return;
        case 'refused':
          return report({ state: 'static', problem: end.problem });
        case 'expired':
          // Re-list at once the first time; a server that keeps expiring gets the backoff.
          resourceVersion = undefined;
          if (failures > 0) await backoff(failure('the watch expired again (410 Gone)'));
          else failures = 1;
          break;
        case 'failed':
          await backoff(end.problem);
          break;
        case 'ended':
          if (end.progressed) failures = 0;
          else await backoff(failure('the watch ended without an event'));
          break;
      }
    }
  };

  const done = run().catch((error: unknown) => report({ state: 'failed', problem: failure(describe(error)) }));
  return { stop: () => controller.abort(), done };
}

type WatchEnd =
  | { kind: 'stopped' }
  | { kind: 'expired' }
  | { kind: 'refused'; problem: Problem }
  | { kind: 'failed'; problem: Problem }
  | { kind: 'ended'; progressed: boolean };

function keyOf(item: Listable): string {
  return `${item.metadata.namespace ?? ''}/${item.metadata.name}`;
}

function failure(message: string): Problem {
  return { kind: 'other', code: 0, reason: '', message };
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

async function bodyOf(chunks: AsyncIterable<string>): Promise<unknown> {
  let text = '';
  for await (const chunk of chunks) text += chunk;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done);
  });
}

/**
 * The machines of `namespace` (every namespace when undefined) with `options`, kept up to date
 * through `api.stream` (listed once without it).
 */
export function liveMachines(
  api: ChangelogApi,
  namespace: string | undefined,
  options: MachineListOptions,
  handlers: Pick<LiveListOptions<MachineInventoryChangelogSummary>, 'onItems' | 'onStatus' | 'sleep' | 'random'>,
): LiveList {
  return liveList({
    ...handlers,
    list: () => api.machines(namespace, options),
    watchUrl: (resourceVersion, timeoutSeconds) =>
      api.machinesWatchUrl(namespace, options, resourceVersion, timeoutSeconds),
    stream: api.stream,
  });
}
