// Calls of the changelog API and what their answers mean for a UI. No
// Rancher import: the caller passes the function that makes the request
// (Rancher's store `request` in the extension, `fetch` elsewhere).

import type {
  MachineInventoryChangelogSummary,
  MachineInventoryChangelogSummaryList,
  ManagedOSVersionChangelog,
  ManagedOSVersionChangelogSummary,
  ManagedOSVersionChangelogSummaryList,
  PackagePresence,
  Severity,
  Status,
} from './types';
import { SEVERITIES } from './types';
import type { Streamer } from './stream';

export const GROUP = 'changelog.elemental.cattle.io';
/** The label the operator puts on a ManagedOSVersion: the name of its channel. */
export const CHANNEL_LABEL = 'elemental.cattle.io/channel';
export const VERSION = 'v1beta1';

/** What a request answered: the HTTP status and the parsed body. */
export interface ApiResponse {
  status: number;
  body: unknown;
}

/** Makes a GET request of `url` (a path on the UI's origin) as the logged-in user. */
export type Requester = (url: string) => Promise<ApiResponse>;

/** How the UI shows a failed request or an unavailable summary. */
export type ProblemKind =
  | 'forbidden' // 403: RBAC denies it
  | 'unauthorized' // 401: the session is gone
  | 'notFound' // 404 without a cause: no such ManagedOSVersion
  | 'noData' // 404 NoChannel, ChannelHasNoImage, NoChangelogData: nothing to show, not an error
  | 'notFetched' // 503 NotFetched: try again shortly
  | 'fetchFailed' // 503 FetchFailed: the channel image cannot be read
  | 'badRequest' // 400, e.g. a `from` that is not older
  | 'unavailable' // 503 without a cause: the APIService is not Available
  | 'other'; // anything else, including a network failure or a body that is not ours

export interface Problem {
  kind: ProblemKind;
  /** HTTP status, 0 when no answer arrived. */
  code: number;
  /** `Status.reason` (e.g. `NotFound`), or the summary's `reason`. */
  reason: string;
  /** `details.causes[0].reason` (e.g. `NoChangelogData`, `FieldValueInvalid`). */
  cause?: string;
  /** The server's message, meant for people. */
  message: string;
  /** `details.retryAfterSeconds`, when the server asks to retry. */
  retryAfterSeconds?: number;
}

export type Result<T> = { ok: true; value: T } | { ok: false; problem: Problem };

const NO_DATA_CAUSES = new Set(['NoChannel', 'ChannelHasNoImage', 'NoChangelogData']);

/** The problem an error answer stands for, from its `Status` body. */
export function problemFromResponse(response: ApiResponse): Problem {
  const status = isStatus(response.body) ? response.body : undefined;
  const cause = status?.details?.causes?.[0]?.reason || undefined;
  const message =
    status?.message ||
    (typeof response.body === 'string' && response.body.trim()) ||
    `the server answered ${response.status}`;
  const problem: Problem = {
    kind: kindOf(response.status, cause),
    code: response.status,
    reason: status?.reason || '',
    message,
  };
  if (cause) problem.cause = cause;
  const retry = status?.details?.retryAfterSeconds;
  if (retry) problem.retryAfterSeconds = retry;
  return problem;
}

function kindOf(code: number, cause: string | undefined): ProblemKind {
  switch (code) {
    case 400:
      return 'badRequest';
    case 401:
      return 'unauthorized';
    case 403:
      return 'forbidden';
    case 404:
      return cause && NO_DATA_CAUSES.has(cause) ? 'noData' : 'notFound';
    case 503:
      if (cause === 'NotFetched') return 'notFetched';
      if (cause === 'FetchFailed') return 'fetchFailed';
      return 'unavailable';
    default:
      return 'other';
  }
}

/** The problem an unavailable summary stands for (`available: false`). */
export function problemFromSummary(item: ManagedOSVersionChangelogSummary): Problem | undefined {
  if (item.available) return undefined;
  const reason = item.reason ?? '';
  const kind: ProblemKind =
    reason === 'NotFetched' ? 'notFetched' : reason === 'FetchFailed' ? 'fetchFailed' : 'noData';
  return { kind, code: 0, reason, cause: reason, message: item.message ?? '' };
}

function isStatus(body: unknown): body is Status {
  return typeof body === 'object' && body !== null && (body as { kind?: unknown }).kind === 'Status';
}

function isKind(body: unknown, kind: string): boolean {
  return typeof body === 'object' && body !== null && (body as { kind?: unknown }).kind === kind;
}

/** Options of a changelog request. */
export interface ChangelogOptions {
  /** Name of an older ManagedOSVersion of the same channel to compare with. */
  from?: string;
  /** Architecture (`x86_64`, `aarch64`, ...); the server's default when absent. */
  arch?: string;
}

/**
 * `package`, `packageAtLeast`, `packageBelow`: a package name and a range of EVRs
 * `[atLeast, below)` in RPM order (a bound without a release compares versions only).
 */
export interface PackageQuery {
  name: string;
  atLeast?: string;
  below?: string;
}

/** Options of a summary list. */
export interface SummaryOptions {
  cve?: string;
  /** With each version's `package` block; with bounds, only the versions carrying it within them. */
  package?: PackageQuery;
  labelSelector?: string;
  arch?: string;
}

/** Options of a machine list (and of its watch). */
export interface MachineListOptions {
  /** With each machine's exposure to this CVE (`cve`). */
  cve?: string;
  /** With each machine's `package` block; with bounds, only the machines running it within them. */
  package?: PackageQuery;
  /** Only the machine of this name (`fieldSelector=metadata.name=`), as `kubectl get NAME -w` watches one. */
  name?: string;
}

function packageQuery(query: PackageQuery | undefined): Record<string, string | undefined> {
  return { package: query?.name, packageAtLeast: query?.atLeast, packageBelow: query?.below };
}

function machineQuery(options: MachineListOptions): Record<string, string | undefined> {
  return {
    fieldSelector: options.name ? `metadata.name=${options.name}` : undefined,
    cve: options.cve,
    ...packageQuery(options.package),
  };
}

/** A package name as the server accepts it (as rpm names are; at most 128 characters). */
export const PACKAGE_NAME_PATTERN = /^[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}$/;

/** An EVR bound as the server accepts it: `[EPOCH:]VERSION[-RELEASE]`. */
export const EVR_PATTERN = /^(\d+:)?[A-Za-z0-9._+~^]+(-[A-Za-z0-9._+~^]+)?$/;

/** A `package` block as the Table's PACKAGE column shows it: `name-evr.arch`, or `name (State)`. */
export function packageText(block: PackagePresence | undefined): string {
  if (!block) return '';
  if (block.evr) {
    const more = (block.installed?.length ?? 0) > 1 ? ` (+${block.installed!.length - 1})` : '';
    return `${block.name}-${block.evr}${block.arch ? `.${block.arch}` : ''}${more}`;
  }
  return `${block.name} (${block.state ?? 'Unknown'})`;
}

/** Machines of a `?package=` list grouped by the version they run (`namespace/name`; `''`: unknown). */
export function machinesByVersion(
  machines: MachineInventoryChangelogSummary[],
): Map<string, MachineInventoryChangelogSummary[]> {
  const groups = new Map<string, MachineInventoryChangelogSummary[]>();
  for (const machine of machines) {
    const key = machine.current ? `${machine.metadata.namespace}/${machine.current.name}` : '';
    const list = groups.get(key) ?? [];
    list.push(machine);
    groups.set(key, list);
  }
  return groups;
}

/** A CVE id as the server accepts it (any case). */
export const CVE_PATTERN = /^CVE-\d{4}-\d{4,}$/i;

/**
 * The changelog API of one cluster, as seen through Rancher's proxy:
 * `clusterBase` is `/k8s/clusters/<cluster>` (or `''` when talking to
 * kube-apiserver directly).
 */
export class ChangelogApi {
  constructor(
    private readonly request: Requester,
    private readonly clusterBase: string,
    /** Opens watch streams; without it lists are shown as listed (no live updates). */
    readonly stream?: Streamer,
  ) {}

  private get prefix(): string {
    return `${this.clusterBase.replace(/\/+$/, '')}/apis/${GROUP}/${VERSION}`;
  }

  /** URL of the changelog of `namespace/name`. */
  changelogUrl(namespace: string, name: string, options: ChangelogOptions = {}): string {
    const path = `${this.prefix}/namespaces/${seg(namespace)}/managedosversions/${seg(name)}/changelog`;
    return path + query({ from: options.from, arch: options.arch });
  }

  /** URL of the summaries of `namespace`, or of every namespace when it is undefined. */
  summariesUrl(namespace: string | undefined, options: SummaryOptions = {}): string {
    const scope = namespace ? `/namespaces/${seg(namespace)}` : '';
    return (
      `${this.prefix}${scope}/managedosversions` +
      query({
        cve: options.cve,
        ...packageQuery(options.package),
        labelSelector: options.labelSelector,
        arch: options.arch,
      })
    );
  }

  /** URL of machine `namespace/name` (a MachineInventory) and what is pending for it; the panel lists it by name instead, to watch it. */
  machineUrl(namespace: string, name: string): string {
    return `${this.prefix}/namespaces/${seg(namespace)}/machineinventories/${seg(name)}`;
  }

  /** URL of the machines of `namespace`, or of every namespace when it is undefined. */
  machinesUrl(namespace: string | undefined, options: MachineListOptions = {}): string {
    const scope = namespace ? `/namespaces/${seg(namespace)}` : '';
    return `${this.prefix}${scope}/machineinventories` + query(machineQuery(options));
  }

  /**
   * URL of the watch of the machines `machinesUrl` lists, from `resourceVersion` (the list's, or
   * the last event's or bookmark's), with bookmarks, ended by the server after `timeoutSeconds`.
   */
  machinesWatchUrl(
    namespace: string | undefined,
    options: MachineListOptions,
    resourceVersion: string,
    timeoutSeconds: number,
  ): string {
    const scope = namespace ? `/namespaces/${seg(namespace)}` : '';
    return (
      `${this.prefix}${scope}/machineinventories` +
      query({
        watch: 'true',
        resourceVersion,
        allowWatchBookmarks: 'true',
        ...machineQuery(options),
        timeoutSeconds: String(timeoutSeconds),
      })
    );
  }

  /** URL of the changelog from the version machine `namespace/name` runs to its target (or `to`). */
  machineChangelogUrl(namespace: string, name: string, options: { to?: string } = {}): string {
    return `${this.machineUrl(namespace, name)}/changelog` + query({ to: options.to });
  }

  /** The machines of `namespace` (every namespace when undefined), with `cve` their exposure to it, or only `name`. */
  machines(
    namespace: string | undefined,
    options: MachineListOptions = {},
  ): Promise<Result<MachineInventoryChangelogSummaryList>> {
    return this.get(this.machinesUrl(namespace, options), 'MachineInventoryChangelogSummaryList');
  }

  /** The changelog of what upgrading machine `namespace/name` to its target (or `to`) changes. */
  machineChangelog(
    namespace: string,
    name: string,
    options: { to?: string } = {},
  ): Promise<Result<ManagedOSVersionChangelog>> {
    return this.get(this.machineChangelogUrl(namespace, name, options), 'ManagedOSVersionChangelog');
  }

  /** The changelog of `namespace/name`. */
  changelog(
    namespace: string,
    name: string,
    options: ChangelogOptions = {},
  ): Promise<Result<ManagedOSVersionChangelog>> {
    return this.get(this.changelogUrl(namespace, name, options), 'ManagedOSVersionChangelog');
  }

  /** The summaries of `namespace` (every namespace when undefined). */
  summaries(
    namespace: string | undefined,
    options: SummaryOptions = {},
  ): Promise<Result<ManagedOSVersionChangelogSummaryList>> {
    return this.get(this.summariesUrl(namespace, options), 'ManagedOSVersionChangelogSummaryList');
  }

  private async get<T>(url: string, kind: string): Promise<Result<T>> {
    let response: ApiResponse;
    try {
      response = await this.request(url);
    } catch (error) {
      return {
        ok: false,
        problem: { kind: 'other', code: 0, reason: '', message: `the request failed: ${describe(error)}` },
      };
    }
    if (response.status >= 200 && response.status < 300) {
      if (isKind(response.body, kind)) return { ok: true, value: response.body as T };
      return {
        ok: false,
        problem: {
          kind: 'other',
          code: response.status,
          reason: '',
          message: `expected a ${kind}, the server answered something else`,
        },
      };
    }
    return { ok: false, problem: problemFromResponse(response) };
  }
}

function seg(value: string): string {
  return encodeURIComponent(value);
}

function query(params: Record<string, string | undefined>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value) search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** A `Requester` on top of `fetch`, for pages served on the API's origin. */
export function fetchRequester(fetchImpl: typeof fetch = fetch): Requester {
  return async (url) => {
    const response = await fetchImpl(url, {
      headers: { Accept: 'application/json' },
      credentials: 'same-origin',
    });
    const text = await response.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      // Not JSON (a proxy's error page): keep the text for the message.
    }
    return { status: response.status, body };
  };
}

/** `href` when it is an absolute http(s) URL, else undefined: only those become links. */
export function safeHref(href: string | undefined): string | undefined {
  if (!href) return undefined;
  try {
    const url = new URL(href);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : undefined;
  } catch {
    return undefined;
  }
}

/** Position of `severity` in the order Unspecified < Low < Moderate < Important < Critical. */
export function severityRank(severity: string): number {
  return SEVERITIES.indexOf(severity as Severity);
}

/**
 * The versions a changelog of `name` can be compared with: the older
 * versions of its channel, newest first, in the server's own order. It
 * follows the `from` (previous version) of each summary, so it needs no
 * ordering of its own. `items` are summaries of the version's namespace.
 */
export function olderVersions(
  items: ManagedOSVersionChangelogSummary[],
  namespace: string,
  name: string,
): { name: string; version: string }[] {
  const byName = new Map<string, ManagedOSVersionChangelogSummary>();
  for (const item of items) {
    if (item.metadata.namespace === namespace) byName.set(item.metadata.name, item);
  }
  const channel = byName.get(name)?.channel.name;
  const older: { name: string; version: string }[] = [];
  const seen = new Set([name]);
  let previous = byName.get(name)?.from;
  while (previous && !seen.has(previous.name)) {
    seen.add(previous.name);
    const item = byName.get(previous.name);
    if (!item || item.channel.name !== channel) break;
    older.push({ name: previous.name, version: previous.version });
    previous = item.from;
  }
  return older;
}

/** Summaries grouped per namespace and channel, keeping the server's order within each group. */
export function groupByChannel(
  items: ManagedOSVersionChangelogSummary[],
): { namespace: string; channel: string; items: ManagedOSVersionChangelogSummary[] }[] {
  const groups = new Map<string, { namespace: string; channel: string; items: ManagedOSVersionChangelogSummary[] }>();
  for (const item of items) {
    const key = `${item.metadata.namespace}/${item.channel.name}`;
    let group = groups.get(key);
    if (!group) {
      group = { namespace: item.metadata.namespace, channel: item.channel.name, items: [] };
      groups.set(key, group);
    }
    group.items.push(item);
  }
  return [...groups.values()];
}

/**
 * The machines exposed to a CVE (`cve.state` `Exposed`), by `namespace/name` of the version
 * that fixes it for them (`cve.fixedIn`, the first fixing version of their channel), in the
 * server's order.
 */
export function exposedByFix(
  machines: MachineInventoryChangelogSummary[],
): Map<string, MachineInventoryChangelogSummary[]> {
  const byFix = new Map<string, MachineInventoryChangelogSummary[]>();
  for (const machine of machines) {
    const fixedIn = machine.cve?.state === 'Exposed' ? machine.cve.fixedIn : undefined;
    if (!fixedIn) continue;
    const key = `${machine.metadata.namespace}/${fixedIn.name}`;
    const list = byFix.get(key) ?? [];
    list.push(machine);
    byFix.set(key, list);
  }
  return byFix;
}
