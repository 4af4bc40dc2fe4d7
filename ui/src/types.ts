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
