import { mount } from '@vue/test-utils';
import { describe, expect, it } from 'vitest';
import { groupByChannel } from '../src/api';
import CveSearch from '../src/components/CveSearch.vue';
import { cve, fakeServer, fixtureRoutes, settle, statusAnswer, statuses } from './fixtures';

async function searchFor(id: string, namespace = '', route = fixtureRoutes) {
  const server = fakeServer(route);
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
