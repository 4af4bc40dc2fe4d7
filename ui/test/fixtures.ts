// The server's answers integration/tests/ui.rs writes into ui/fixtures/
// (see docs/ui.md), and a request function that serves them like the API.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { vi } from 'vitest';
import type { ApiResponse, Requester } from '../src/api';
import { ChangelogApi } from '../src/api';
import type {
  MachineInventoryChangelogSummary,
  MachineInventoryChangelogSummaryList,
  ManagedOSVersionChangelog,
  ManagedOSVersionChangelogSummaryList,
  ManagedOSVersionRef,
  Status,
} from '../src/types';
import type { Streamer } from '../src/stream';

// vitest runs in ui/ (see vite.config.ts).
function load<T>(name: string): T {
  return JSON.parse(readFileSync(join(process.cwd(), 'fixtures', `${name}.json`), 'utf8')) as T;
}

export const changelog = load<ManagedOSVersionChangelog>('changelog');
export const changelogFrom = load<ManagedOSVersionChangelog>('changelog-from');
export const changelogOldest = load<ManagedOSVersionChangelog>('changelog-oldest');
export const summaries = load<ManagedOSVersionChangelogSummaryList>('summaries');
export const cve = load<ManagedOSVersionChangelogSummaryList>('cve');
/**
 * The list of one machine (`fieldSelector=metadata.name=`, what the panel lists and watches): a
 * machine on the sample channel's oldest version (updates pending); and its changelog to its target.
 */
export const machineByName = load<MachineInventoryChangelogSummaryList>('machine-by-name');
export const machine: MachineInventoryChangelogSummary = machineByName.items[0]!;
export const machineChangelog = load<ManagedOSVersionChangelog>('machine-changelog');
/** Every machine with its exposure to the `cve` fixture's CVE. */
export const machinesCve = load<MachineInventoryChangelogSummaryList>('machines-cve');
/**
 * `?package=xz` on every version and every machine (integration/tests/package.rs writes them):
 * versions carrying xz at several EVRs, one without it, one without a package list; machines on
 * each, and one whose version is unknown.
 */
export const packageVersions = load<ManagedOSVersionChangelogSummaryList>('package/versions');
export const packageMachines = load<MachineInventoryChangelogSummaryList>('package/machines');

/** Error answers by fixture name, with the HTTP status the server sent. */
export const statuses = {
  forbidden: load<Status>('status-forbidden'),
  notFound: load<Status>('status-not-found'),
  noChangelogData: load<Status>('status-no-changelog-data'),
  fetchFailed: load<Status>('status-fetch-failed'),
  notFetched: load<Status>('status-not-fetched'),
  fromNotOlder: load<Status>('status-from-not-older'),
};

export function statusAnswer(status: Status): ApiResponse {
  return { status: status.code ?? 0, body: status };
}

export const CLUSTER_BASE = '/k8s/clusters/local';

/** The ManagedOSVersion a changelog describes, as Rancher's model has it. */
export function resourceOf(c: ManagedOSVersionChangelog): ManagedOSVersionRef {
  return { metadata: { name: c.metadata.name, namespace: c.metadata.namespace }, spec: { version: c.version } };
}

/**
 * A request function answering `route(url)` (a path and query under the
 * changelog API, or undefined for 404), recording every URL asked; with
 * `stream` (see `streams.ts`) watches are answered too.
 */
export function fakeServer(
  route: (path: string, query: URLSearchParams) => ApiResponse | undefined,
  stream?: Streamer,
) {
  const prefix = `${CLUSTER_BASE}/apis/changelog.elemental.cattle.io/v1beta1`;
  const request = vi.fn<Requester>(async (url: string) => {
    if (!url.startsWith(prefix)) throw new Error(`a request outside the API: ${url}`);
    const parsed = new URL(url.slice(prefix.length), 'http://x');
    return route(decodeURIComponent(parsed.pathname), parsed.searchParams) ?? statusAnswer(statuses.notFound);
  });
  return { request, api: new ChangelogApi(request, CLUSTER_BASE, stream) };
}

/** Routes of a server that has the fixtures' data. */
export function fixtureRoutes(path: string, query: URLSearchParams): ApiResponse | undefined {
  const ok = (body: unknown): ApiResponse => ({ status: 200, body });
  const ns = changelog.metadata.namespace;
  if (path === `/namespaces/${ns}/managedosversions/${changelog.metadata.name}/changelog`) {
    const from = query.get('from');
    if (!from) return ok(changelog);
    if (from === changelogFrom.from?.name) return ok(changelogFrom);
    return statusAnswer(statuses.fromNotOlder);
  }
  if (path === `/namespaces/${ns}/managedosversions/${changelogOldest.metadata.name}/changelog`) {
    return ok(changelogOldest);
  }
  if (path === `/namespaces/${ns}/managedosversions`) return ok(summaries);
  if (path === '/managedosversions' && query.get('cve')) return ok(cve);
  const machines = `/namespaces/${machine.metadata.namespace}/machineinventories`;
  if (path === machines && query.get('fieldSelector') === `metadata.name=${machine.metadata.name}`) {
    return ok(machineByName);
  }
  if (path === `${machines}/${machine.metadata.name}/changelog` && !query.get('to')) return ok(machineChangelog);
  if ((path === '/machineinventories' || path === machines) && query.get('cve')) return ok(machinesCve);
  if (path === '/managedosversions' && query.get('package') === 'xz') return ok(packageVersions);
  if (path === '/machineinventories' && query.get('package') === 'xz') return ok(packageMachines);
  return undefined;
}

/** Lets pending promises and Vue's updates settle. */
export async function settle() {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setTimeout(resolve, 0));
}
