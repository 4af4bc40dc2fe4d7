import { mount } from '@vue/test-utils';
import { describe, expect, it } from 'vitest';
import { exposedByFix, groupByChannel } from '../src/api';
import CveSearch from '../src/components/CveSearch.vue';
import type { Streamer } from '../src/stream';
import { cve, fakeServer, fixtureRoutes, machinesCve, settle, statusAnswer, statuses } from './fixtures';
import { fakeWatches, watchQuery } from './streams';

async function searchFor(id: string, namespace = '', route = fixtureRoutes, stream?: Streamer) {
  const server = fakeServer(route, stream);
  const wrapper = mount(CveSearch, { props: { api: server.api } });
  await wrapper.get('[data-testid=ecl-cve-input]').setValue(id);
  await wrapper.get('[data-testid=ecl-cve-namespace]').setValue(namespace);
  await wrapper.get('form').trigger('submit');
  await settle();
  return { wrapper, ...server };
}

describe('CveSearch', () => {
  it('refuses what is not a CVE id without asking the server', async () => {
    const { wrapper, request } = await searchFor('CVE-24-1');
    expect(wrapper.find('[data-testid=ecl-cve-invalid]').exists()).toBe(true);
    expect(request).not.toHaveBeenCalled();
  });

  it('lists the fixing versions per channel, the first fix first', async () => {
    const id = 'cve-2024-59001';
    const { wrapper, request } = await searchFor(id);
    expect(request).toHaveBeenCalledWith(
      `/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/managedosversions?cve=${id}`,
    );
    const groups = wrapper.findAll('[data-testid=ecl-cve-group]');
    const expected = groupByChannel(cve.items);
    expect(groups).toHaveLength(expected.length);
    for (const [i, group] of groups.entries()) {
      const want = expected[i]!;
      expect(group.attributes('data-channel')).toBe(want.channel);
      const versions = group.findAll('[data-testid=ecl-cve-version]');
      expect(versions.map((v) => v.attributes('data-name'))).toEqual(want.items.map((item) => item.metadata.name));
      expect(versions[0]!.text()).toContain(`First fixed in ${want.items[0]!.version}`);
      for (const later of versions.slice(1)) expect(later.text()).toMatch(/^Also in/);
    }
  });

  it('lists the machines still exposed under the version that fixes it for them', async () => {
    const id = machinesCve.items[0]!.cve!.id;
    const { wrapper, request } = await searchFor(id);
    expect(request).toHaveBeenCalledWith(
      `/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/machineinventories?cve=${id}`,
    );
    const exposed = exposedByFix(machinesCve.items);
    expect(exposed.size).toBeGreaterThan(0);
    for (const [key, machines] of exposed) {
      const [namespace, version] = key.split('/');
      const item = wrapper.get(
        `[data-testid=ecl-cve-group][data-namespace="${namespace}"] [data-testid=ecl-cve-version][data-name="${version}"]`,
      );
      expect(item.findAll('[data-testid=ecl-cve-machine]').map((m) => m.attributes('data-name'))).toEqual(
        machines.map((m) => m.metadata.name),
      );
    }
    // Machines that are fixed, or whose channel has no fix, are not listed.
    const listed = wrapper.findAll('[data-testid=ecl-cve-machine]').map((m) => m.attributes('data-name'));
    expect(listed).toEqual(machinesCve.items.filter((m) => m.cve?.state === 'Exposed').map((m) => m.metadata.name));
    expect(wrapper.get('[data-testid=ecl-cve-exposed]').attributes('data-count')).toBe(String(listed.length));
  });

  it('still lists the versions when machines cannot be listed', async () => {
    const { wrapper } = await searchFor('CVE-2024-59001', '', (path, query) =>
      path.endsWith('/machineinventories') ? statusAnswer(statuses.forbidden) : fixtureRoutes(path, query),
    );
    expect(wrapper.findAll('[data-testid=ecl-cve-group]').length).toBeGreaterThan(0);
    expect(wrapper.get('[data-testid=ecl-cve-machines-unavailable]').text()).toContain('forbidden');
    expect(wrapper.findAll('[data-testid=ecl-cve-machine]')).toHaveLength(0);
  });

  it('searches one namespace when one is given', async () => {
    const { request } = await searchFor('CVE-2024-59001', 'fleet-default');
    expect(request).toHaveBeenCalledWith(
      '/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/namespaces/fleet-default/managedosversions?cve=CVE-2024-59001',
    );
  });

  it('says when no version fixes it', async () => {
    const { wrapper } = await searchFor('CVE-2000-0001', '', () => ({ status: 200, body: { ...cve, items: [] } }));
    expect(wrapper.get('[data-testid=ecl-cve-none]').text()).toContain('CVE-2000-0001');
  });

  it('shows the forbidden state of a user who cannot list cluster-wide', async () => {
    const { wrapper } = await searchFor('CVE-2024-59001', '', () => statusAnswer(statuses.forbidden));
    expect(wrapper.get('[data-testid=ecl-problem]').attributes('data-kind')).toBe('forbidden');
    expect(wrapper.findAll('[data-testid=ecl-cve-group]')).toHaveLength(0);
  });
});

describe('CveSearch, live', () => {
  const id = machinesCve.items[0]!.cve!.id;
  const exposedNames = () => machinesCve.items.filter((m) => m.cve?.state === 'Exposed').map((m) => m.metadata.name);

  it('moves a machine out of the exposed list when it is upgraded, without a new search', async () => {
    const watches = fakeWatches();
    const { wrapper } = await searchFor(id, '', fixtureRoutes, watches.streamer);
    const watch = await watches.next();
    expect(watchQuery(watch.url)).toMatchObject({
      watch: 'true',
      resourceVersion: machinesCve.metadata.resourceVersion,
      allowWatchBookmarks: 'true',
      cve: id,
    });
    const listed = () => wrapper.findAll('[data-testid=ecl-cve-machine]').map((m) => m.attributes('data-name'));
    const exposed = machinesCve.items.find((m) => m.cve?.state === 'Exposed')!;
    expect(listed()).toEqual(exposedNames());

    watch.send('MODIFIED', { ...exposed, metadata: { ...exposed.metadata, resourceVersion: '2' }, cve: { id, state: 'Fixed' } });
    await settle();
    expect(listed()).toEqual(exposedNames().filter((n) => n !== exposed.metadata.name));
    expect(wrapper.get('[data-testid=ecl-cve-exposed]').attributes('data-count')).toBe(String(exposedNames().length - 1));

    // Registered again on the old version: exposed again.
    watch.send('MODIFIED', { ...exposed, metadata: { ...exposed.metadata, resourceVersion: '3' } });
    await settle();
    expect(listed()).toEqual(exposedNames());
    wrapper.unmount();
    expect(watch.aborted).toBe(true);
  });

  it('a new search stops the watch of the last one', async () => {
    const watches = fakeWatches();
    const { wrapper } = await searchFor(id, '', fixtureRoutes, watches.streamer);
    const first = await watches.next();
    await wrapper.get('[data-testid=ecl-cve-namespace]').setValue('fleet-default');
    await wrapper.get('form').trigger('submit');
    const second = await watches.next();
    expect(first.aborted).toBe(true);
    expect(second.url).toContain('/namespaces/fleet-default/machineinventories?');
    wrapper.unmount();
    expect(second.aborted).toBe(true);
  });
});
