// The Vue components of the Rancher extension (ui/rancher/pkg/elemental-changelog/), mounted the way
// Rancher mounts them: a `resource` prop and `this.$store`. Registration
// (index.ts, product.ts, routing.ts) needs Rancher's shell and is not tested here.
import { mount } from '@vue/test-utils';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import ChangelogMasthead from '../rancher/pkg/elemental-changelog/components/ChangelogMasthead.vue';
import MachineMasthead from '../rancher/pkg/elemental-changelog/components/MachineMasthead.vue';
import CveSearchPage from '../rancher/pkg/elemental-changelog/pages/CveSearchPage.vue';
import { changelog, cve, fixtureRoutes, machine, machineChangelog, settle } from './fixtures';
import { fakeWatches, watchQuery } from './streams';

const PREFIX = '/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1';

/** Rancher's management store answering with the fixtures (bodies carry `_status`). */
function rancherStore() {
  const dispatch = vi.fn(async (action: string, payload: { url: string }) => {
    expect(action).toBe('management/request');
    expect(payload.url.startsWith(PREFIX)).toBe(true);
    const url = new URL(payload.url.slice(PREFIX.length), 'http://x');
    const answer = fixtureRoutes(decodeURIComponent(url.pathname), url.searchParams);
    if (!answer) throw new Error(`unexpected ${payload.url}`);
    const body = structuredClone(answer.body) as object;
    Object.defineProperty(body, '_status', { value: answer.status });
    if (answer.status >= 400) throw body;
    return body;
  });
  return { dispatch };
}

/** The operator's ManagedOSVersion as Rancher's model has it. */
function managedOSVersion(type: string) {
  return {
    id: `${changelog.metadata.namespace}/${changelog.metadata.name}`,
    type: 'elemental.cattle.io.managedosversion',
    metadata: { name: changelog.metadata.name, namespace: changelog.metadata.namespace },
    spec: { type, version: changelog.version },
  };
}

describe('the Rancher extension components', () => {
  // Watches go through the page's `fetch` (Rancher's proxy, the session cookie), not the store.
  let watches: ReturnType<typeof fakeWatches>;
  beforeEach(() => {
    watches = fakeWatches();
    vi.stubGlobal('fetch', watches.fetch);
  });
  afterEach(() => {
    vi.unstubAllGlobals();
  });

  it('the masthead panel reads the changelog through the management store', async () => {
    const store = rancherStore();
    const wrapper = mount(ChangelogMasthead, {
      props: { resource: managedOSVersion('container') },
      global: { mocks: { $store: store } },
    });
    await settle();
    expect(wrapper.findAll('[data-testid=ecl-advisory]').map((a) => a.attributes('data-id'))).toEqual(
      changelog.advisories.map((a) => a.id),
    );
    expect(store.dispatch.mock.calls.map((c) => c[1].url)).toContain(
      `${PREFIX}/namespaces/${changelog.metadata.namespace}/managedosversions/${changelog.metadata.name}/changelog`,
    );
  });

  it('shows no panel on an ISO and asks nothing', async () => {
    const store = rancherStore();
    const wrapper = mount(ChangelogMasthead, {
      props: { resource: managedOSVersion('iso') },
      global: { mocks: { $store: store } },
    });
    await settle();
    expect(wrapper.find('[data-testid=ecl-panel]').exists()).toBe(false);
    expect(store.dispatch).not.toHaveBeenCalled();
  });

  it('the machine panel reads the machine and its pending changelog through the management store', async () => {
    const store = rancherStore();
    const wrapper = mount(MachineMasthead, {
      props: {
        resource: {
          id: `${machine.metadata.namespace}/${machine.metadata.name}`,
          type: 'elemental.cattle.io.machineinventory',
          metadata: { name: machine.metadata.name, namespace: machine.metadata.namespace },
        },
      },
      global: { mocks: { $store: store } },
    });
    await settle();
    expect(wrapper.get('[data-testid=ecl-machine-target]').attributes('data-name')).toBe(machine.target!.name);
    expect(wrapper.findAll('[data-testid=ecl-advisory]').map((a) => a.attributes('data-id'))).toEqual(
      machineChangelog.advisories.map((a) => a.id),
    );

    // Then it watches the machine through Rancher's proxy of the local cluster, as the session's user.
    const watch = await watches.next();
    expect(watch.url.startsWith(`${PREFIX}/namespaces/${machine.metadata.namespace}/machineinventories?`)).toBe(true);
    expect(watchQuery(watch.url)).toMatchObject({ watch: 'true', fieldSelector: `metadata.name=${machine.metadata.name}` });
    expect(watch.init.credentials).toBe('same-origin');
    watch.send('MODIFIED', { ...machine, state: 'UpToDate', current: machine.target, summary: undefined });
    await settle();
    expect(wrapper.get('[data-testid=ecl-machine-state]').attributes('data-state')).toBe('UpToDate');
    wrapper.unmount();
    expect(watch.aborted).toBe(true);
  });

  it('the CVE page searches through the management store', async () => {
    const store = rancherStore();
    const wrapper = mount(CveSearchPage, { global: { mocks: { $store: store } } });
    await wrapper.get('[data-testid=ecl-cve-input]').setValue('CVE-2024-59001');
    await wrapper.get('form').trigger('submit');
    await settle();
    expect(wrapper.findAll('[data-testid=ecl-cve-version]')).toHaveLength(cve.items.length);
    const watch = await watches.next();
    expect(watchQuery(watch.url)).toMatchObject({ watch: 'true', cve: 'CVE-2024-59001' });
    expect(watch.url.startsWith(`${PREFIX}/machineinventories?`)).toBe(true);
    wrapper.unmount();
    expect(watch.aborted).toBe(true);
  });

  it('fails clearly outside Rancher', () => {
    expect(() => mount(CveSearchPage, { global: { config: { warnHandler: () => undefined } } })).toThrow(
      'it runs inside Rancher',
    );
  });
});
