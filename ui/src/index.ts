// The package's entry point: components and the API module, without Rancher.
export { default as AdvisoryList } from './components/AdvisoryList.vue';
export { default as ChangelogPanel } from './components/ChangelogPanel.vue';
export { default as CveSearch } from './components/CveSearch.vue';
export { default as LiveNotice } from './components/LiveNotice.vue';
export { default as MachinePanel } from './components/MachinePanel.vue';
export { default as PackageSearch } from './components/PackageSearch.vue';
export { default as ProblemNotice } from './components/ProblemNotice.vue';
export { default as SeverityBadge } from './components/SeverityBadge.vue';
export * from './api';
export type * from './types';
export * from './store';
export * from './stream';
export * from './watch';
