import { mount } from '@vue/test-utils';
import { describe, expect, it } from 'vitest';
import type { ApiResponse } from '../src/api';
import MachinePanel from '../src/components/MachinePanel.vue';
import type { MachineInventoryChangelogSummary } from '../src/types';
import type { Streamer } from '../src/stream';
import {
  fakeServer,
  fixtureRoutes,
  machine,
  machineByName,
  machineChangelog,
  settle,
  statusAnswer,
  statuses,
} from './fixtures';
import { fakeWatches, watchQuery } from './streams';

const resource = { metadata: { name: machine.metadata.name, namespace: machine.metadata.namespace } };

async function mountPanel(route: (path: string, query: URLSearchParams) => ApiResponse | undefined, stream?: Streamer) {
  const server = fakeServer(route, stream);
  const wrapper = mount(MachinePanel, { props: { resource, api: server.api } });
  await settle();
  return { wrapper, ...server };
}

/** The fixture machine in another state, the rest of the server as the fixtures. */
function changedMachine(changed: Partial<MachineInventoryChangelogSummary>, resourceVersion = '1') {
  return { ...machine, ...changed, metadata: { ...machine.metadata, resourceVersion } };
}

function withMachine(changed: Partial<MachineInventoryChangelogSummary>) {
  return (path: string, query: URLSearchParams) =>
    query.get('fieldSelector') === `metadata.name=${machine.metadata.name}`
      ? { status: 200, body: { ...machineByName, items: [changedMachine(changed)] } }
      : fixtureRoutes(path, query);
}

const upToDate = { state: 'UpToDate' as const, current: machine.target, summary: undefined };

describe('MachinePanel on the server\'s answers', () => {
  it('shows what the machine runs, its target and the changelog between them', async () => {
    const { wrapper, request } = await mountPanel(fixtureRoutes);
    expect(wrapper.get('[data-testid=ecl-machine-state]').attributes('data-state')).toBe('UpdatesAvailable');
    expect(wrapper.get('[data-testid=ecl-machine-current]').attributes('data-name')).toBe(machine.current!.name);
    const target = wrapper.get('[data-testid=ecl-machine-target]');
    expect(target.attributes('data-name')).toBe(machine.target!.name);
    expect(target.text()).toContain(`the newest version of channel ${machine.target!.channel}`);
    expect(wrapper.get('[data-testid=ecl-count-advisories]').attributes('data-value')).toBe(
      String(machine.summary!.advisories),
    );
    expect(wrapper.findAll('[data-testid=ecl-advisory]').map((a) => a.attributes('data-id'))).toEqual(
      machineChangelog.advisories.map((a) => a.id),
    );
    expect(request).toHaveBeenCalledWith(
      `/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/namespaces/${machine.metadata.namespace}/machineinventories/${machine.metadata.name}/changelog`,
    );
  });

  it('asks for no changelog when the machine is up to date', async () => {
    const { wrapper, request } = await mountPanel(withMachine({ state: 'UpToDate', summary: undefined }));
    expect(wrapper.find('[data-testid=ecl-machine-up-to-date]').exists()).toBe(true);
    expect(wrapper.findAll('[data-testid=ecl-advisory]')).toHaveLength(0);
    expect(request.mock.calls.map((c) => c[0]).some((u) => u.endsWith('/changelog'))).toBe(false);
  });

  it('says why the version of an unresolved machine is unknown, never guessing one', async () => {
    const { wrapper } = await mountPanel(
      withMachine({
        state: 'Unknown',
        current: undefined,
        target: undefined,
        summary: undefined,
        reason: 'VersionInNoChannel',
        message: 'no ManagedOSVersion has this image',
      }),
    );
    expect(wrapper.get('[data-testid=ecl-machine-current]').attributes('data-name')).toBe('');
    const reason = wrapper.get('[data-testid=ecl-machine-reason]');
    expect(reason.attributes('data-reason')).toBe('VersionInNoChannel');
    expect(reason.text()).toContain('no ManagedOSVersion has this image');
    expect(wrapper.find('[data-testid=ecl-machine-target]').exists()).toBe(false);
  });

  it('lists the machine by name', async () => {
    const { request } = await mountPanel(fixtureRoutes);
    expect(request.mock.calls[0]?.[0]).toBe(
      `/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/namespaces/${machine.metadata.namespace}/machineinventories?fieldSelector=metadata.name%3D${machine.metadata.name}`,
    );
  });

  it('shows that a machine does not exist (an empty list)', async () => {
    const { wrapper } = await mountPanel((path, query) =>
      query.get('fieldSelector') ? { status: 200, body: { ...machineByName, items: [] } } : fixtureRoutes(path, query),
    );
    const notice = wrapper.get('[data-testid=ecl-problem]');
    expect(notice.attributes('data-kind')).toBe('notFound');
    expect(notice.text()).toContain(`"${machine.metadata.name}" not found`);
  });

  it('shows the forbidden state of a user who may not read machines', async () => {
    const { wrapper } = await mountPanel(() => statusAnswer(statuses.forbidden));
    expect(wrapper.get('[data-testid=ecl-problem]').attributes('data-kind')).toBe('forbidden');
    expect(wrapper.find('[data-testid=ecl-machine-state]').exists()).toBe(false);
  });
});

describe('MachinePanel, live', () => {
  it('watches the machine from the list\'s resourceVersion', async () => {
    const watches = fakeWatches();
    const { wrapper } = await mountPanel(fixtureRoutes, watches.streamer);
    const watch = await watches.next();
    expect(watchQuery(watch.url)).toMatchObject({
      watch: 'true',
      resourceVersion: machineByName.metadata.resourceVersion,
      allowWatchBookmarks: 'true',
      fieldSelector: `metadata.name=${machine.metadata.name}`,
    });
    await settle();
    expect(wrapper.get('[data-testid=ecl-machine]').attributes('data-live')).toBe('live');
    expect(wrapper.get('[data-testid=ecl-live]').text()).toBe('live');
    wrapper.unmount();
  });

  it('shows a change of state without a reload, and asks for the new changelog only when it changed', async () => {
    const watches = fakeWatches();
    const { wrapper, request } = await mountPanel(fixtureRoutes, watches.streamer);
    const watch = await watches.next();
    const changelogs = () => request.mock.calls.filter(([url]) => url.endsWith('/changelog')).length;
    expect(changelogs()).toBe(1);

    // Re-registered on its target: up to date, the pending changelog goes away.
    watch.send('MODIFIED', changedMachine(upToDate, '2'));
    await settle();
    expect(wrapper.get('[data-testid=ecl-machine-state]').attributes('data-state')).toBe('UpToDate');
    expect(wrapper.get('[data-testid=ecl-machine-current]').attributes('data-name')).toBe(machine.target!.name);
    expect(wrapper.findAll('[data-testid=ecl-advisory]')).toHaveLength(0);
    expect(wrapper.find('[data-testid=ecl-machine-up-to-date]').exists()).toBe(true);

    // Back on the old version: the changelog is asked again and shown.
    watch.send('MODIFIED', changedMachine({}, '3'));
    await settle();
    expect(changelogs()).toBe(2);
    expect(wrapper.findAll('[data-testid=ecl-advisory]').map((a) => a.attributes('data-id'))).toEqual(
      machineChangelog.advisories.map((a) => a.id),
    );
    // A change of something else (its labels) asks nothing.
    watch.send('MODIFIED', { ...changedMachine({}, '4'), metadata: { ...machine.metadata, labels: { a: 'b' } } });
    await settle();
    expect(changelogs()).toBe(2);
    wrapper.unmount();
  });

  it('shows that the machine was deleted', async () => {
    const watches = fakeWatches();
    const { wrapper } = await mountPanel(fixtureRoutes, watches.streamer);
    const watch = await watches.next();
    watch.send('DELETED', changedMachine({}, '5'));
    await settle();
    expect(wrapper.get('[data-testid=ecl-problem]').attributes('data-kind')).toBe('notFound');
    expect(wrapper.find('[data-testid=ecl-machine-state]').exists()).toBe(false);
    wrapper.unmount();
  });

  it('stops watching when it unmounts', async () => {
    const watches = fakeWatches();
    const { wrapper, request } = await mountPanel(fixtureRoutes, watches.streamer);
    const watch = await watches.next();
    const asked = request.mock.calls.length;
    wrapper.unmount();
    await settle();
    expect(watch.aborted).toBe(true);
    expect(watches.fetch).toHaveBeenCalledTimes(1);
    expect(request.mock.calls).toHaveLength(asked);
  });

  it('watches the other machine when the resource changes, and stops the first watch', async () => {
    const watches = fakeWatches();
    const { wrapper } = await mountPanel(
      (path, query) =>
        query.get('fieldSelector') === 'metadata.name=other'
          ? { status: 200, body: { ...machineByName, items: [{ ...machine, metadata: { ...machine.metadata, name: 'other' } }] } }
          : fixtureRoutes(path, query),
      watches.streamer,
    );
    const first = await watches.next();
    await wrapper.setProps({ resource: { metadata: { name: 'other', namespace: machine.metadata.namespace } } });
    const second = await watches.next();
    expect(first.aborted).toBe(true);
    expect(watchQuery(second.url).fieldSelector).toBe('metadata.name=other');
    wrapper.unmount();
  });
});
