// The live list (ui/src/watch.ts) on fake watch streams: the protocol as
// kube-apiserver serves it, with objects from the server's answers.
import { describe, expect, it, vi } from 'vitest';
import type { ApiResponse } from '../src/api';
import type { MachineInventoryChangelogSummary, MachineInventoryChangelogSummaryList } from '../src/types';
import type { LiveStatus } from '../src/watch';
import { liveMachines, MAX_BACKOFF_MS, watchEvents } from '../src/watch';
import { CLUSTER_BASE, fakeServer, machinesCve, settle, statusAnswer, statuses } from './fixtures';
import { fakeWatches, watchQuery } from './streams';

const PREFIX = `${CLUSTER_BASE}/apis/changelog.elemental.cattle.io/v1beta1`;
const CVE = machinesCve.items[0]!.cve!.id;

function list(resourceVersion: string, items = machinesCve.items): MachineInventoryChangelogSummaryList {
  return { ...machinesCve, metadata: { resourceVersion }, items };
}

function at(item: MachineInventoryChangelogSummary, resourceVersion: string, changed: object = {}) {
  return { ...item, ...changed, metadata: { ...item.metadata, resourceVersion } };
}

function names(items: MachineInventoryChangelogSummary[]): string[] {
  return items.map((m) => m.metadata.name);
}

/** A server whose machine list answers `lists` in turn (the last one again), and a live list on it. */
function start(lists: (MachineInventoryChangelogSummaryList | ApiResponse)[], options: { stream?: boolean } = {}) {
  const watches = fakeWatches();
  let listed = 0;
  const server = fakeServer((path) => {
    if (path !== '/machineinventories') return undefined;
    const answer = lists[Math.min(listed++, lists.length - 1)]!;
    return 'kind' in answer ? { status: 200, body: answer } : answer;
  }, options.stream === false ? undefined : watches.streamer);
  const shown: string[][] = [];
  const statuses: LiveStatus[] = [];
  const sleeps: number[] = [];
  let latest: MachineInventoryChangelogSummary[] = [];
  const live = liveMachines(server.api, undefined, { cve: CVE }, {
    onItems: (items) => {
      latest = items;
      shown.push(names(items));
    },
    onStatus: (status) => statuses.push(status),
    sleep: async (ms) => {
      sleeps.push(ms);
    },
    random: () => 0.5,
  });
  return {
    live,
    watches,
    request: server.request,
    shown,
    statuses,
    sleeps,
    latest: () => latest,
    lists: () => server.request.mock.calls.filter(([url]) => !url.includes('watch=')).length,
  };
}

describe('watchEvents', () => {
  it('splits lines across chunks and refuses a line that is no event', async () => {
    async function* chunks() {
      yield '{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n{"type":"BOOK';
      yield 'MARK","object":{"metadata":{"resourceVersion":"9"}}}\n\n';
      yield '{"type":"GONE","object":{}}\n';
    }
    const seen: string[] = [];
    await expect(async () => {
      for await (const event of watchEvents(chunks())) seen.push(event.type);
    }).rejects.toThrow('not a watch event');
    expect(seen).toEqual(['ADDED', 'BOOKMARK']);
  });
});

describe('liveMachines on a watch stream', () => {
  it('watches from the list\'s resourceVersion and applies ADDED, MODIFIED and DELETED', async () => {
    const [first, second, third] = machinesCve.items as [
      MachineInventoryChangelogSummary,
      MachineInventoryChangelogSummary,
      MachineInventoryChangelogSummary,
    ];
    const t = start([list('10', [first, third])]);
    const watch = await t.watches.next();
    expect(watch.url.startsWith(`${PREFIX}/machineinventories?`)).toBe(true);
    expect(watchQuery(watch.url)).toEqual({
      watch: 'true',
      resourceVersion: '10',
      allowWatchBookmarks: 'true',
      cve: CVE,
      timeoutSeconds: '450',
    });
    expect(watch.init.credentials).toBe('same-origin');
    await settle();
    expect(t.statuses.at(-1)).toEqual({ state: 'live' });
    expect(t.shown).toEqual([names([first, third])]);

    // A new machine goes where it sorts, as in a list; a change replaces in place; a deletion removes.
    watch.send('ADDED', at(second, '11'));
    watch.send('MODIFIED', at(first, '12', { cve: { id: CVE, state: 'Fixed' } }));
    watch.send('DELETED', at(third, '13'));
    await settle();
    expect(t.shown.slice(1)).toEqual([
      names([first, second, third]),
      names([first, second, third]),
      names([first, second]),
    ]);
    expect(t.latest()[0]!.cve!.state).toBe('Fixed');
    expect(t.latest()[1]!.metadata.resourceVersion).toBe('11');
    t.live.stop();
  });

  it('follows bookmarks: a stream that ends is resumed from the last resourceVersion, not re-listed', async () => {
    const t = start([list('10')]);
    const first = await t.watches.next();
    first.send('MODIFIED', at(machinesCve.items[0]!, '11'));
    first.send('BOOKMARK', { kind: 'MachineInventoryChangelogSummary', metadata: { resourceVersion: '25' } });
    await settle();
    const shownBefore = t.shown.length;
    first.end();
    const second = await t.watches.next();
    expect(watchQuery(second.url).resourceVersion).toBe('25');
    // The bookmark changed nothing shown, and the end of a healthy stream is no failure.
    expect(t.shown).toHaveLength(shownBefore);
    expect(t.sleeps).toEqual([]);
    expect(t.lists()).toBe(1);
    t.live.stop();
  });

  it('re-lists on 410 Gone and on an ERROR event Expired, and watches from the new list', async () => {
    const t = start([list('10'), list('40'), list('50', machinesCve.items.slice(1))]);
    const first = await t.watches.next();
    first.send('ERROR', {
      kind: 'Status',
      apiVersion: 'v1',
      status: 'Failure',
      message: 'too old resource version: 10 (35)',
      reason: 'Expired',
      code: 410,
    });
    const second = await t.watches.next();
    expect(first.cancelled).toBe(true);
    expect(t.lists()).toBe(2);
    expect(watchQuery(second.url).resourceVersion).toBe('40');
    expect(t.sleeps).toEqual([]); // the first expiry re-lists at once

    // A resume the server cannot serve, answered with 410 itself (e.g. by another replica).
    second.end();
    t.watches.answers.push({ status: 410, body: { kind: 'Status', code: 410, reason: 'Gone', message: 'gone' } });
    const third = await t.watches.next();
    expect(watchQuery(third.url).resourceVersion).toBe('50');
    expect(t.lists()).toBe(3);
    expect(t.shown.at(-1)).toEqual(names(machinesCve.items.slice(1)));
    t.live.stop();
  });

  it('backs off exponentially on failures, up to a bound, and resets after progress', async () => {
    const t = start([list('10')]);
    await t.watches.next();
    t.watches.opened[0]!.sendRaw('<html>a proxy error page</html>\n');
    for (let i = 0; i < 8; i++) {
      t.watches.answers.push({ status: 503, body: { kind: 'Status', code: 503, message: 'unavailable' } });
    }
    const recovered = await t.watches.next();
    // 1 s, 2 s, 4 s ... doubled per failure, capped; the jitter (random 0.5) takes 3/4 of each.
    expect(t.sleeps).toEqual([1, 2, 4, 8, 16, 30, 30, 30, 30].map((s) => (Math.min(s * 1000, MAX_BACKOFF_MS) * 3) / 4));
    expect(t.statuses.filter((s) => s.state === 'retrying')).toHaveLength(9);
    expect(t.lists()).toBe(1);
    // Every try resumes from the last resourceVersion.
    expect(watchQuery(recovered.url).resourceVersion).toBe('10');

    recovered.send('BOOKMARK', { metadata: { resourceVersion: '11' } });
    await settle();
    recovered.end();
    await t.watches.next();
    t.watches.answers.push({ status: 500, body: 'boom' });
    t.watches.opened.at(-1)!.end();
    await t.watches.next();
    // After the bookmark the count starts again; a stream that ends at once with nothing is a failure.
    expect(t.sleeps.slice(9)).toEqual([750, 1500]);
    t.live.stop();
  });

  it('keeps what is shown while a re-list fails, and says it is retrying', async () => {
    const t = start([list('10'), statusAnswer(statuses.forbidden), list('60')]);
    const first = await t.watches.next();
    first.send('BOOKMARK', { metadata: { resourceVersion: '20' } });
    await settle();
    t.watches.answers.push({ status: 410, body: {} });
    first.end();
    const next = await t.watches.next();
    expect(watchQuery(next.url).resourceVersion).toBe('60');
    await settle();
    expect(t.statuses.map((s) => s.state)).toEqual(['live', 'retrying', 'live']);
    expect(t.shown).toEqual([names(machinesCve.items), names(machinesCve.items)]);
    t.live.stop();
  });

  it('leaves the list as listed when the watch is refused (no watch right, no watch on the server)', async () => {
    const t = start([list('10')]);
    t.watches.answers.push(statusAnswer(statuses.forbidden));
    await t.live.done;
    expect(t.statuses).toEqual([{ state: 'static', problem: expect.objectContaining({ kind: 'forbidden' }) }]);
    expect(t.shown).toEqual([names(machinesCve.items)]);
    expect(t.watches.fetch).toHaveBeenCalledTimes(1);
  });

  it('lists once without a stream function, and reports a first list that fails', async () => {
    const once = start([list('10')], { stream: false });
    await once.live.done;
    expect(once.statuses).toEqual([{ state: 'static' }]);
    expect(once.request).toHaveBeenCalledTimes(1);

    const failed = start([statusAnswer(statuses.forbidden)]);
    await failed.live.done;
    expect(failed.statuses).toEqual([{ state: 'failed', problem: expect.objectContaining({ kind: 'forbidden' }) }]);
    expect(failed.watches.fetch).not.toHaveBeenCalled();
  });

  it('stop aborts the stream: no callback, no request afterwards', async () => {
    const t = start([list('10')]);
    const watch = await t.watches.next();
    await settle();
    const calls = { shown: t.shown.length, statuses: t.statuses.length, requests: t.request.mock.calls.length };
    t.live.stop();
    await t.live.done;
    expect(watch.aborted).toBe(true);
    await settle();
    expect(t.shown).toHaveLength(calls.shown);
    expect(t.statuses).toHaveLength(calls.statuses);
    expect(t.request.mock.calls).toHaveLength(calls.requests);
    expect(t.watches.fetch).toHaveBeenCalledTimes(1);
  });

  it('waits with a real timer between tries, so a failing server gets no tight loop', async () => {
    vi.useFakeTimers();
    try {
      const watches = fakeWatches();
      const server = fakeServer(() => ({ status: 200, body: list('10') }), watches.streamer);
      for (let i = 0; i < 5; i++) watches.answers.push({ status: 500, body: {} });
      const live = liveMachines(server.api, undefined, {}, { onItems: () => undefined, onStatus: () => undefined });
      await vi.advanceTimersByTimeAsync(0);
      expect(watches.fetch).toHaveBeenCalledTimes(1);
      await vi.advanceTimersByTimeAsync(400); // under the shortest first backoff (1 s with jitter down to 1/2)
      expect(watches.fetch).toHaveBeenCalledTimes(1);
      await vi.advanceTimersByTimeAsync(600 + 2_000 + 4_000);
      expect(watches.fetch.mock.calls.length).toBeGreaterThanOrEqual(2);
      expect(watches.fetch.mock.calls.length).toBeLessThanOrEqual(4);
      live.stop();
      await live.done;
    } finally {
      vi.useRealTimers();
    }
  });
});
