// The JSON the server answers (changelog.elemental.cattle.io/v1beta1), as
// docs/api.md and apiservice/src/types.rs define it. Optional fields are
// omitted by the server when empty, so every consumer must treat them as
// possibly missing.

/** Severity of an advisory, lowest first. */
export const SEVERITIES = ['Unspecified', 'Low', 'Moderate', 'Important', 'Critical'] as const;
export type Severity = (typeof SEVERITIES)[number];

/** `metadata` of the served objects: the ManagedOSVersion they describe. */
export interface ObjectMeta {
  name: string;
  namespace: string;
  /** Moves on with every change of the object; a watch resumes from the last one seen. */
  resourceVersion?: string;
  creationTimestamp?: string;
  labels?: Record<string, string>;
}

export interface ChannelRef {
  name: string;
  image?: string;
  digest?: string;
  retained?: boolean;
}

export interface VersionRef {
  name: string;
  version: string;
}

export interface Reference {
  id: string;
  type: string;
  href: string;
  title: string;
}

export interface AdvisoryPackage {
  name: string;
  epoch?: string;
  version: string;
  release: string;
  arch: string;
}

export interface Advisory {
  id: string;
  type: string;
  severity: Severity;
  title: string;
  issued?: string;
  cves: string[];
  bugs: string[];
  references: Reference[];
  description: string;
  packages: AdvisoryPackage[];
}

export interface PackageChange {
  name: string;
  arch: string;
  from?: string;
  to?: string;
}

export interface PackageChanges {
  upgraded: PackageChange[];
  downgraded: PackageChange[];
  added: PackageChange[];
  removed: PackageChange[];
}

export interface ChangelogSummary {
  advisories: number;
  byType: Record<string, number>;
  cves: number;
  highestSeverity: Severity;
  packagesUpgraded?: number;
  packagesDowngraded?: number;
  packagesAdded?: number;
  packagesRemoved?: number;
}

export interface ManagedOSVersionChangelog {
  apiVersion: string;
  kind: 'ManagedOSVersionChangelog';
  metadata: ObjectMeta;
  channel: ChannelRef;
  version: string;
  from?: VersionRef;
  arch: string;
  source: 'Computed' | 'Precomputed';
  summary: ChangelogSummary;
  advisories: Advisory[];
  packages?: PackageChanges;
  warnings?: string[];
}

/** Why a summary is not available; the same names as `details.causes[0].reason` of errors. */
export type UnavailableReason =
  | 'NoChannel'
  | 'ChannelHasNoImage'
  | 'NotFetched'
  | 'NoChangelogData'
  | 'FetchFailed';

export interface ManagedOSVersionChangelogSummary {
  apiVersion: string;
  kind: 'ManagedOSVersionChangelogSummary';
  metadata: ObjectMeta;
  channel: ChannelRef;
  version: string;
  created?: string;
  available: boolean;
  reason?: UnavailableReason;
  message?: string;
  from?: VersionRef;
  summary?: ChangelogSummary;
  /** The state as Rancher's state badge shows it (read by Steve; the panels use `available` and `reason`). */
  status?: SummaryStatus;
  /** With `?package=`: what the version carries of the package. */
  package?: PackagePresence;
}

/** `status` of a summary: what Rancher's summarizer (Steve) reads for the state badge. */
export interface SummaryStatus {
  display: {
    /** Lower-case and hyphenated as Rancher spells states: `available`, `not-fetched`, `up-to-date`, `unknown`, ... */
    state: string;
    error: boolean;
    transitioning: boolean;
    message?: string;
  };
}

/** One package of the name asked for that a version carries. */
export interface InstalledPackage {
  evr: string;
  arch: string;
}

/** Why a `package` block has no EVR. */
export type PackageState = 'Absent' | 'NoPackageList' | 'Unknown';

/** The `package` block of a `?package=` list: the package installed, or why there is none. */
export interface PackagePresence {
  name: string;
  /** `[epoch:]version-release`: the highest installed, within the bounds asked for. */
  evr?: string;
  arch?: string;
  /** Every package of the name installed, when there are several (architectures, kernels). */
  installed?: InstalledPackage[];
  state?: PackageState;
  /** Why `Unknown`: the machine's reason. */
  message?: string;
}

export interface ManagedOSVersionChangelogSummaryList {
  apiVersion: string;
  kind: 'ManagedOSVersionChangelogSummaryList';
  metadata: { resourceVersion?: string };
  items: ManagedOSVersionChangelogSummary[];
}

/** A Kubernetes `Status` (errors). */
export interface Status {
  kind: 'Status';
  apiVersion: string;
  status: 'Failure';
  message?: string;
  reason?: string;
  code?: number;
  details?: {
    name?: string;
    group?: string;
    kind?: string;
    causes?: { reason?: string; message?: string; field?: string }[];
    retryAfterSeconds?: number;
  };
}

/**
 * The part of the operator's ManagedOSVersion (elemental.cattle.io/v1beta1)
 * the panel reads: Rancher passes its model of that object to the panel.
 */
export interface ManagedOSVersionRef {
  metadata: { name: string; namespace: string; labels?: Record<string, string> };
  spec?: { version?: string; type?: string };
}

// The fleet view: machines (the operator's MachineInventories) and what is pending for each.

/** A ManagedOSVersion of a channel: what a machine runs. */
export interface ChannelVersion {
  name: string;
  version: string;
  channel: string;
}

/** The version a machine would be upgraded to, and where that comes from. */
export interface MachineTarget extends ChannelVersion {
  /** `ManagedOSImage` (a ManagedOSImage assigns it) or `NewestInChannel`. */
  source: 'ManagedOSImage' | 'NewestInChannel';
  managedOSImage?: string;
  reason?: string;
  message?: string;
}

export type MachineState = 'UpToDate' | 'UpdatesAvailable' | 'Unknown';

/** Exposure of a machine to the CVE of a `?cve=` list. */
export interface MachineCve {
  id: string;
  state: 'Fixed' | 'Exposed' | 'NoFixInChannel' | 'Unknown';
  /** The first version of its channel that fixes it (`Exposed`). */
  fixedIn?: VersionRef;
}

export interface MachineInventoryChangelogSummary {
  apiVersion: string;
  kind: 'MachineInventoryChangelogSummary';
  metadata: ObjectMeta;
  /** What the machine reports (its OS annotations). */
  os: { image?: string; version?: string; prettyName?: string };
  current?: ChannelVersion;
  target?: MachineTarget;
  state: MachineState;
  /** Why the state is `Unknown` (or why the target is what it is). */
  reason?: string;
  message?: string;
  /** The changelog from `current` to `target`, summarized. */
  summary?: ChangelogSummary;
  cve?: MachineCve;
  /** The state as Rancher's state badge shows it (read by Steve; the panels use `state`). */
  status?: SummaryStatus;
  /** With `?package=`: what the version the machine runs carries of the package. */
  package?: PackagePresence;
}

export interface MachineInventoryChangelogSummaryList {
  apiVersion: string;
  kind: 'MachineInventoryChangelogSummaryList';
  metadata: { resourceVersion?: string };
  items: MachineInventoryChangelogSummary[];
}

/** The part of the operator's MachineInventory the machine panel reads. */
export interface MachineInventoryRef {
  metadata: { name: string; namespace: string };
}
