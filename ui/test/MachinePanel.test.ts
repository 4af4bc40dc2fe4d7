import { mount } from '@vue/test-utils';
import { describe, expect, it } from 'vitest';
import type { ApiResponse } from '../src/api';
import MachinePanel from '../src/components/MachinePanel.vue';
import type { MachineInventoryChangelogSummary } from '../src/types';
import { fakeServer, fixtureRoutes, machine, machineChangelog, settle, statusAnswer, statuses } from './fixtures';

const resource = { metadata: { name: machine.metadata.name, namespace: machine.metadata.namespace } };

async function mountPanel(route: (path: string, query: URLSearchParams) => ApiResponse | undefined) {
  const server = fakeServer(route);
  const wrapper = mount(MachinePanel, { props: { resource, api: server.api } });
  await settle();
  return { wrapper, ...server };
}

/** The fixture machine in another state, the rest of the server as the fixtures. */
function withMachine(changed: Partial<MachineInventoryChangelogSummary>) {
  return (path: string, query: URLSearchParams) =>
    path.endsWith(`/machineinventories/${machine.metadata.name}`)
      ? { status: 200, body: { ...machine, ...changed } }
      : fixtureRoutes(path, query);
}

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

  it('shows the forbidden state of a user who may not read machines', async () => {
    const { wrapper } = await mountPanel(() => statusAnswer(statuses.forbidden));
    expect(wrapper.get('[data-testid=ecl-problem]').attributes('data-kind')).toBe('forbidden');
    expect(wrapper.find('[data-testid=ecl-machine-state]').exists()).toBe(false);
  });
});
