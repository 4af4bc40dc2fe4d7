import { describe, expect, it } from 'vitest';
import type { ApiResponse } from '../src/api';
import {
  ChangelogApi,
  fetchRequester,
  groupByChannel,
  olderVersions,
  problemFromResponse,
  problemFromSummary,
  safeHref,
  severityRank,
} from '../src/api';
import { CLUSTER_BASE, changelog, changelogFrom, cve, fakeServer, fixtureRoutes, statusAnswer, statuses, summaries } from './fixtures';

const never = async (): Promise<ApiResponse> => {
  throw new Error('no request expected');
};

describe('URLs', () => {
  const api = new ChangelogApi(never, `${CLUSTER_BASE}/`);
  const base = `${CLUSTER_BASE}/apis/changelog.elemental.cattle.io/v1beta1`;

  it('go through the cluster proxy and encode names', () => {
    expect(api.changelogUrl('fleet-default', 'a/b?c')).toBe(
      `${base}/namespaces/fleet-default/managedosversions/a%2Fb%3Fc/changelog`,
    );
    expect(api.changelogUrl('ns', 'v2', { from: 'v 1&x', arch: 'aarch64' })).toBe(
      `${base}/namespaces/ns/managedosversions/v2/changelog?from=v+1%26x&arch=aarch64`,
    );
  });

  it('list one namespace or all of them', () => {
    expect(api.summariesUrl('fleet-default')).toBe(`${base}/namespaces/fleet-default/managedosversions`);
    expect(api.summariesUrl(undefined, { cve: 'CVE-2024-1234' })).toBe(`${base}/managedosversions?cve=CVE-2024-1234`);
    expect(api.summariesUrl('ns', { labelSelector: 'elemental.cattle.io/channel=a b' })).toBe(
      `${base}/namespaces/ns/managedosversions?labelSelector=elemental.cattle.io%2Fchannel%3Da+b`,
    );
  });

  it('name machines, their changelogs and their exposure to a CVE', () => {
    expect(api.machineUrl('fleet-default', 'm/1')).toBe(`${base}/namespaces/fleet-default/machineinventories/m%2F1`);
    expect(api.machineChangelogUrl('ns', 'm', { to: 'v 2' })).toBe(
      `${base}/namespaces/ns/machineinventories/m/changelog?to=v+2`,
    );
    expect(api.machinesUrl(undefined, { cve: 'CVE-2024-1234' })).toBe(`${base}/machineinventories?cve=CVE-2024-1234`);
    expect(api.machinesUrl('ns')).toBe(`${base}/namespaces/ns/machineinventories`);
    expect(api.machinesUrl('ns', { name: 'm-1' })).toBe(
      `${base}/namespaces/ns/machineinventories?fieldSelector=metadata.name%3Dm-1`,
    );
  });

  it('watch machines from a resourceVersion, with bookmarks, as the list asks', () => {
    expect(api.machinesWatchUrl(undefined, { cve: 'CVE-2024-1234' }, '42', 300)).toBe(
      `${base}/machineinventories?watch=true&resourceVersion=42&allowWatchBookmarks=true&cve=CVE-2024-1234&timeoutSeconds=300`,
    );
    expect(api.machinesWatchUrl('ns', { name: 'm' }, '7', 450)).toBe(
      `${base}/namespaces/ns/machineinventories?watch=true&resourceVersion=7&allowWatchBookmarks=true&fieldSelector=metadata.name%3Dm&timeoutSeconds=450`,
    );
  });

  it('work against kube-apiserver directly with an empty base', () => {
    expect(new ChangelogApi(never, '').summariesUrl(undefined)).toBe(
      '/apis/changelog.elemental.cattle.io/v1beta1/managedosversions',
    );
  });
});

describe('errors by reason, on the server\'s Status answers', () => {
  it.each([
    ['forbidden', statuses.forbidden, 403, 'Forbidden', undefined],
    ['notFound', statuses.notFound, 404, 'NotFound', undefined],
    ['noData', statuses.noChangelogData, 404, 'NotFound', 'NoChangelogData'],
    ['fetchFailed', statuses.fetchFailed, 503, 'ServiceUnavailable', 'FetchFailed'],
    ['notFetched', statuses.notFetched, 503, 'ServiceUnavailable', 'NotFetched'],
    ['badRequest', statuses.fromNotOlder, 400, 'BadRequest', 'FieldValueInvalid'],
  ] as const)('%s', (kind, status, code, reason, cause) => {
    const problem = problemFromResponse(statusAnswer(status));
    expect(problem).toMatchObject({ kind, code, reason, message: status.message });
    expect(problem.cause).toBe(cause);
  });

  it('NotFetched asks to retry after the server\'s delay, FetchFailed does not', () => {
    expect(problemFromResponse(statusAnswer(statuses.notFetched)).retryAfterSeconds).toBe(
      statuses.notFetched.details?.retryAfterSeconds,
    );
    expect(statuses.notFetched.details?.retryAfterSeconds).toBeGreaterThan(0);
    expect(problemFromResponse(statusAnswer(statuses.fetchFailed)).retryAfterSeconds).toBeUndefined();
  });

  it('a 503 without a cause is the APIService being unavailable', () => {
    // kube-apiserver's own answer when the APIService is not Available.
    const body = { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'ServiceUnavailable', code: 503,
      message: 'the server is currently unable to handle the request' };
    expect(problemFromResponse({ status: 503, body }).kind).toBe('unavailable');
  });

  it('an answer that is not a Status keeps its text', () => {
    expect(problemFromResponse({ status: 502, body: 'Bad Gateway' })).toMatchObject({ kind: 'other', message: 'Bad Gateway' });
    expect(problemFromResponse({ status: 500, body: '' }).message).toBe('the server answered 500');
  });

  it('unavailable summaries map like the errors of the same cause', () => {
    const unavailable = summaries.items.filter((i) => !i.available);
    expect(unavailable.length).toBeGreaterThan(0);
    for (const item of unavailable) {
      const problem = problemFromSummary(item);
      expect(problem?.cause).toBe(item.reason);
      expect(problem?.message).toBe(item.message);
    }
    expect(problemFromSummary({ ...unavailable[0]!, reason: 'NotFetched' })?.kind).toBe('notFetched');
    expect(problemFromSummary({ ...unavailable[0]!, reason: 'FetchFailed' })?.kind).toBe('fetchFailed');
    expect(problemFromSummary({ ...unavailable[0]!, reason: 'ChannelHasNoImage' })?.kind).toBe('noData');
    expect(problemFromSummary(summaries.items.find((i) => i.available)!)).toBeUndefined();
  });
});

describe('ChangelogApi', () => {
  it('returns the server\'s objects', async () => {
    const { api, request } = fakeServer(fixtureRoutes);
    const ns = changelog.metadata.namespace;
    expect(await api.changelog(ns, changelog.metadata.name)).toEqual({ ok: true, value: changelog });
    expect(await api.changelog(ns, changelog.metadata.name, { from: changelogFrom.from!.name })).toEqual({
      ok: true,
      value: changelogFrom,
    });
    expect(await api.summaries(undefined, { cve: 'CVE-2024-59001' })).toEqual({ ok: true, value: cve });
    expect(request).toHaveBeenCalledTimes(3);
  });

  it('turns errors into problems', async () => {
    const { api } = fakeServer(() => statusAnswer(statuses.forbidden));
    const result = await api.changelog('fleet-default', 'x');
    expect(result.ok).toBe(false);
    expect(!result.ok && result.problem.kind).toBe('forbidden');
  });

  it('refuses a 200 that is not the kind asked for (a login page, another API)', async () => {
    const api = new ChangelogApi(async () => ({ status: 200, body: '<html>login</html>' }), CLUSTER_BASE);
    const result = await api.changelog('ns', 'x');
    expect(!result.ok && result.problem).toMatchObject({ kind: 'other', code: 200 });
    const list = await new ChangelogApi(async () => ({ status: 200, body: changelog }), CLUSTER_BASE).summaries('ns');
    expect(list.ok).toBe(false);
  });

  it('reports a request that fails without an answer', async () => {
    const api = new ChangelogApi(async () => {
      throw new TypeError('Failed to fetch');
    }, CLUSTER_BASE);
    const result = await api.summaries(undefined);
    expect(!result.ok && result.problem).toMatchObject({ kind: 'other', code: 0, message: 'the request failed: Failed to fetch' });
  });

  it('fetchRequester parses JSON and keeps other bodies as text', async () => {
    const seen: [string, RequestInit | undefined][] = [];
    const fake = (async (url: string, init?: RequestInit) => {
      seen.push([url, init]);
      return url.endsWith('json') ? new Response(JSON.stringify(changelog), { status: 200 }) : new Response('oops', { status: 502 });
    }) as typeof fetch;
    const request = fetchRequester(fake);
    expect(await request('/a.json')).toEqual({ status: 200, body: changelog });
    expect(await request('/b')).toEqual({ status: 502, body: 'oops' });
    expect(seen[0]?.[1]).toMatchObject({ headers: { Accept: 'application/json' }, credentials: 'same-origin' });
  });
});

describe('links', () => {
  it('only http(s) URLs become links', () => {
    expect(safeHref('https://bugzilla.suse.com/show_bug.cgi?id=1')).toBe('https://bugzilla.suse.com/show_bug.cgi?id=1');
    expect(safeHref('http://cve.mitre.org/x')).toBe('http://cve.mitre.org/x');
    for (const bad of ['javascript:alert(1)', 'JAVASCRIPT:alert(1)', 'data:text/html,x', '//evil.example/x', '/relative', 'ftp://x/y', 'not a url', '', undefined]) {
      expect(safeHref(bad), String(bad)).toBeUndefined();
    }
  });

  it('every reference the server sends is http(s)', () => {
    const references = [changelog, changelogFrom].flatMap((c) => c.advisories.flatMap((a) => a.references));
    expect(references.length).toBeGreaterThan(0);
    for (const r of references) expect(safeHref(r.href), r.href).toBeDefined();
  });
});

describe('joining summaries', () => {
  it('the older versions of a channel follow the server\'s previous-version chain', () => {
    const { name, namespace } = changelog.metadata;
    const older = olderVersions(summaries.items, namespace, name);
    // The first choice is the default comparison, the last the oldest the changelog-from fixture used.
    expect(older[0]).toEqual(changelog.from);
    expect(older.at(-1)).toEqual(changelogFrom.from);
    const channel = summaries.items.find((i) => i.metadata.name === name)!.channel.name;
    for (const o of older) {
      const item = summaries.items.find((i) => i.metadata.name === o.name)!;
      expect(item.channel.name).toBe(channel);
      expect(item.version).toBe(o.version);
    }
  });

  it('the oldest version has nothing to compare with, nor has an unknown one', () => {
    const oldest = changelogFrom.from!.name;
    expect(olderVersions(summaries.items, changelog.metadata.namespace, oldest)).toEqual([]);
    expect(olderVersions(summaries.items, changelog.metadata.namespace, 'no-such-version')).toEqual([]);
    expect(olderVersions(summaries.items, 'other-namespace', changelog.metadata.name)).toEqual([]);
  });

  it('a loop in from links ends', () => {
    const a = { ...summaries.items[0]!, metadata: { name: 'a', namespace: 'n' }, from: { name: 'b', version: '1' } };
    const b = { ...a, metadata: { name: 'b', namespace: 'n' }, from: { name: 'a', version: '2' } };
    expect(olderVersions([a, b], 'n', 'a').map((o) => o.name)).toEqual(['b']);
  });

  it('groups a cve= answer per namespace and channel, keeping the first fix first', () => {
    const groups = groupByChannel(cve.items);
    expect(groups.length).toBeGreaterThan(0);
    expect(groups.flatMap((g) => g.items)).toHaveLength(cve.items.length);
    for (const g of groups) {
      const served = cve.items.filter((i) => i.metadata.namespace === g.namespace && i.channel.name === g.channel);
      expect(g.items).toEqual(served);
    }
  });

  it('severities are ordered', () => {
    expect(severityRank('Critical')).toBeGreaterThan(severityRank('Important'));
    expect(severityRank('Low')).toBeGreaterThan(severityRank('Unspecified'));
    expect(severityRank('bogus')).toBe(-1);
  });
});
