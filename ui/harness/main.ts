// The test harness: mounts the components the way the Rancher extension
// does, with `fetch` on the page's own origin (lists, and watches read as
// a body stream, as in Rancher). It is served under
// `<cluster base>/static/` next to the API (kubectl proxy in the end-to-end
// test, like Rancher's `/k8s/clusters/<cluster>/`):
//   index.html?namespace=NS&name=NAME   the panel of ManagedOSVersion NS/NAME
//   index.html?page=cve                 the CVE search
//   index.html?page=package             the package search
//   index.html?page=machine&namespace=NS&name=NAME   the panel of MachineInventory NS/NAME
import { createApp, h } from 'vue';
import { ChangelogApi, fetchRequester } from '../src/api';
import { fetchStreamer } from '../src/stream';
import ChangelogPanel from '../src/components/ChangelogPanel.vue';
import CveSearch from '../src/components/CveSearch.vue';
import PackageSearch from '../src/components/PackageSearch.vue';
import MachinePanel from '../src/components/MachinePanel.vue';
import ProblemNotice from '../src/components/ProblemNotice.vue';
import type { MachineInventoryRef, ManagedOSVersionRef } from '../src/types';

const clusterBase = window.location.pathname.replace(/\/static\/.*$/, '');
const request = fetchRequester();
const api = new ChangelogApi(request, clusterBase, fetchStreamer());
const params = new URLSearchParams(window.location.search);

async function main() {
  if (params.get('page') === 'cve') {
    createApp({ render: () => h(CveSearch, { api }) }).mount('#app');
    return;
  }
  if (params.get('page') === 'package') {
    createApp({ render: () => h(PackageSearch, { api }) }).mount('#app');
    return;
  }
  const namespace = params.get('namespace') ?? '';
  const name = params.get('name') ?? '';
  const machine = params.get('page') === 'machine';
  const [kind, plural] = machine ? ['MachineInventory', 'machineinventories'] : ['ManagedOSVersion', 'managedosversions'];
  // The operator's object, as Rancher's detail page has it.
  const url = `${clusterBase}/apis/elemental.cattle.io/v1beta1/namespaces/${encodeURIComponent(namespace)}/${plural}/${encodeURIComponent(name)}`;
  const response = await request(url);
  if (response.status !== 200) {
    const message = `cannot read ${kind} ${namespace}/${name}: ${response.status}`;
    createApp({
      render: () => h(ProblemNotice, { problem: { kind: 'other', code: response.status, reason: '', message } }),
    }).mount('#app');
    return;
  }
  if (machine) {
    const resource = response.body as MachineInventoryRef;
    createApp({
      render: () =>
        h('div', [h('p', { class: 'harness-resource' }, `MachineInventory ${namespace}/${name}`), h(MachinePanel, { resource, api })]),
    }).mount('#app');
    return;
  }
  const resource = response.body as ManagedOSVersionRef;
  createApp({
    render: () =>
      h('div', [
        h('p', { class: 'harness-resource' }, `ManagedOSVersion ${namespace}/${name} (spec.version ${resource.spec?.version ?? '?'})`),
        h(ChangelogPanel, { resource, api }),
      ]),
  }).mount('#app');
}

void main();
