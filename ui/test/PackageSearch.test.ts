import { mount } from '@vue/test-utils';
import { describe, expect, it } from 'vitest';
import { EVR_PATTERN, PACKAGE_NAME_PATTERN, groupByChannel, machinesByVersion, packageText } from '../src/api';
import PackageSearch from '../src/components/PackageSearch.vue';
import type { Streamer } from '../src/stream';
import { fakeServer, fixtureRoutes, packageMachines, packageVersions, settle, statusAnswer, statuses } from './fixtures';
import { fakeWatches, watchQuery } from './streams';

const PREFIX = '/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1';

async function searchFor(
  form: { name: string; atLeast?: string; below?: string; namespace?: string },
  route = fixtureRoutes,
  stream?: Streamer,
) {
  const server = fakeServer(route, stream);
  const wrapper = mount(PackageSearch, { props: { api: server.api } });
  await wrapper.get('[data-testid=ecl-package-name]').setValue(form.name);
  await wrapper.get('[data-testid=ecl-package-at-least]').setValue(form.atLeast ?? '');
  await wrapper.get('[data-testid=ecl-package-below]').setValue(form.below ?? '');
  await wrapper.get('[data-testid=ecl-package-namespace]').setValue(form.namespace ?? '');
  await wrapper.get('form').trigger('submit');
  await settle();
  return { wrapper, ...server };
}

describe('package queries', () => {
  it('accepts what the server accepts', () => {
    for (const name of ['xz', 'libstdc++6', 'perl-Net_SSLeay', '_x']) expect(PACKAGE_NAME_PATTERN.test(name)).toBe(true);
    for (const name of ['', '-x', 'x y', 'perl(Foo)', 'a'.repeat(129)]) expect(PACKAGE_NAME_PATTERN.test(name)).toBe(false);
    for (const evr of ['5.6.0', '5.6.1-1.1', '1:3.0.13', '1.0~rc1^git2-1_1+b']) expect(EVR_PATTERN.test(evr)).toBe(true);
    for (const evr of ['', ':1', 'a:1', '1-', '1-2-3', '1 2']) expect(EVR_PATTERN.test(evr)).toBe(false);
  });

  it('writes a block as the Table does', () => {
    const texts = packageVersions.items.map((v) => packageText(v.package));
    expect(texts).toContain('xz-5.6.0-1.1.x86_64');
    expect(texts).toContain('xz (Absent)');
    expect(texts).toContain('xz (NoPackageList)');
    expect(packageText({ name: 'glibc', evr: '2.40-1', arch: 'x86_64', installed: [{ evr: '2.38-1', arch: 'i586' }, { evr: '2.40-1', arch: 'x86_64' }] }))
      .toBe('glibc-2.40-1.x86_64 (+1)');
  });
});

describe('PackageSearch', () => {
  it('refuses a name or a bound the server would refuse, without asking it', async () => {
    for (const form of [{ name: 'x y' }, { name: 'xz', below: '5.6.2-' }]) {
      const { wrapper, request } = await searchFor(form);
      expect(wrapper.find('[data-testid=ecl-package-invalid]').exists()).toBe(true);
      expect(request).not.toHaveBeenCalled();
    }
  });

  it('asks for the name and the bounds, on versions and machines', async () => {
    const { request } = await searchFor({ name: 'xz', atLeast: '5.6.0', below: '5.6.2', namespace: 'fleet-default' }, () => ({
      status: 200,
      body: { ...packageVersions, items: [] },
    }));
    const query = 'package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2';
    expect(request).toHaveBeenCalledWith(`${PREFIX}/namespaces/fleet-default/managedosversions?${query}`);
    expect(request).toHaveBeenCalledWith(`${PREFIX}/namespaces/fleet-default/machineinventories?${query}`);
  });

  it('lists each version with what it carries, and the machines that run it under it', async () => {
    const { wrapper } = await searchFor({ name: 'xz' });
    const groups = groupByChannel(packageVersions.items);
    expect(wrapper.findAll('[data-testid=ecl-package-group]')).toHaveLength(groups.length);
    const byVersion = machinesByVersion(packageMachines.items);
    for (const version of packageVersions.items) {
      const item = wrapper.get(
        `[data-testid=ecl-package-group][data-namespace="${version.metadata.namespace}"] [data-testid=ecl-package-version][data-name="${version.metadata.name}"]`,
      );
      expect(item.get('[data-testid=ecl-package-text]').text()).toBe(packageText(version.package));
      expect(item.attributes('data-state')).toBe(version.package?.state ?? 'Installed');
      const running = byVersion.get(`${version.metadata.namespace}/${version.metadata.name}`) ?? [];
      expect(item.findAll('[data-testid=ecl-package-machine]').map((m) => m.attributes('data-name'))).toEqual(
        running.map((m) => m.metadata.name),
      );
    }
    const unknown = packageMachines.items.filter((m) => !m.current);
    expect(unknown.length).toBeGreaterThan(0);
    expect(wrapper.get('[data-testid=ecl-package-unknown]').attributes('data-count')).toBe(String(unknown.length));
    const running = packageMachines.items.filter((m) => m.package?.evr).length;
    expect(wrapper.get('[data-testid=ecl-package-running]').attributes('data-count')).toBe(String(running));
  });

  it('still lists the versions when machines cannot be listed', async () => {
    const { wrapper } = await searchFor({ name: 'xz' }, (path, query) =>
      path.endsWith('/machineinventories') ? statusAnswer(statuses.forbidden) : fixtureRoutes(path, query),
    );
    expect(wrapper.findAll('[data-testid=ecl-package-version]')).toHaveLength(packageVersions.items.length);
    expect(wrapper.get('[data-testid=ecl-package-machines-unavailable]').text()).toContain('forbidden');
  });

  it('says when no version carries it', async () => {
    const { wrapper } = await searchFor({ name: 'xz', atLeast: '9' }, () => ({ status: 200, body: { ...packageVersions, items: [] } }));
    expect(wrapper.get('[data-testid=ecl-package-none]').text()).toContain('xz in [9, any)');
  });
});

describe('PackageSearch, live', () => {
  it('moves a machine to the version it is re-registered on, without a new search', async () => {
    const watches = fakeWatches();
    const { wrapper } = await searchFor({ name: 'xz' }, fixtureRoutes, watches.streamer);
    const watch = await watches.next();
    expect(watchQuery(watch.url)).toMatchObject({
      watch: 'true',
      resourceVersion: packageMachines.metadata.resourceVersion,
      package: 'xz',
    });
    const moving = packageMachines.items.find((m) => m.current && m.package?.evr)!;
    const other = packageVersions.items.find(
      (v) => v.metadata.namespace === moving.metadata.namespace && v.metadata.name !== moving.current!.name && v.package?.evr,
    )!;
    const under = (version: string) =>
      wrapper
        .findAll(`[data-testid=ecl-package-version][data-name="${version}"] [data-testid=ecl-package-machine]`)
        .map((m) => m.attributes('data-name'));
    expect(under(moving.current!.name)).toContain(moving.metadata.name);
    watch.send('MODIFIED', {
      ...moving,
      metadata: { ...moving.metadata, resourceVersion: '2' },
      current: { ...moving.current!, name: other.metadata.name, version: other.version },
      package: other.package,
    });
    await settle();
    expect(under(moving.current!.name)).not.toContain(moving.metadata.name);
    expect(under(other.metadata.name)).toContain(moving.metadata.name);
    // Leaving a bounded selection is a DELETED event: the machine goes.
    watch.send('DELETED', { ...moving, metadata: { ...moving.metadata, resourceVersion: '3' } });
    await settle();
    expect(wrapper.findAll(`[data-testid=ecl-package-machine][data-name="${moving.metadata.name}"]`)).toHaveLength(0);
    wrapper.unmount();
    expect(watch.aborted).toBe(true);
  });
});
