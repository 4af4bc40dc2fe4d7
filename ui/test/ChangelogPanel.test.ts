import { mount } from '@vue/test-utils';
import { describe, expect, it } from 'vitest';
import type { ApiResponse } from '../src/api';
import ChangelogPanel from '../src/components/ChangelogPanel.vue';
import type { ManagedOSVersionChangelog } from '../src/types';
import {
  changelog,
  changelogFrom,
  changelogOldest,
  fakeServer,
  fixtureRoutes,
  resourceOf,
  settle,
  statusAnswer,
  statuses,
  summaries,
} from './fixtures';

async function mountPanel(
  route: (path: string, query: URLSearchParams) => ApiResponse | undefined,
  of: ManagedOSVersionChangelog = changelog,
) {
  const server = fakeServer(route);
  const wrapper = mount(ChangelogPanel, { props: { resource: resourceOf(of), api: server.api } });
  await settle();
  return { wrapper, ...server };
}

const ids = (wrapper: ReturnType<typeof mount>) =>
  wrapper.findAll('[data-testid=ecl-advisory]').map((a) => a.attributes('data-id'));

describe('ChangelogPanel on the server\'s answers', () => {
  it('shows the advisories, counts and highest severity of the changelog', async () => {
    const { wrapper } = await mountPanel(fixtureRoutes);
    expect(ids(wrapper)).toEqual(changelog.advisories.map((a) => a.id));
    expect(wrapper.get('[data-testid=ecl-version]').text()).toBe(changelog.version);
    expect(wrapper.get('[data-testid=ecl-from]').text()).toBe(changelog.from!.version);
    const count = (key: string) => wrapper.get(`[data-testid=ecl-count-${key}]`).attributes('data-value');
    expect(count('advisories')).toBe(String(changelog.summary.advisories));
    expect(count('cves')).toBe(String(changelog.summary.cves));
    expect(count('security')).toBe(String(changelog.summary.byType.security ?? 0));
    expect(count('upgraded')).toBe(String(changelog.summary.packagesUpgraded));
    expect(wrapper.get('[data-testid=ecl-summary] [data-testid=ecl-severity]').text()).toBe(
      changelog.summary.highestSeverity,
    );
    for (const [i, advisory] of changelog.advisories.entries()) {
      const item = wrapper.findAll('[data-testid=ecl-advisory]')[i]!;
      expect(item.get('[data-testid=ecl-severity]').text()).toBe(advisory.severity);
      expect(item.text()).toContain(advisory.title);
      expect(item.findAll('[data-testid=ecl-cve]').map((c) => c.text())).toEqual(advisory.cves);
    }
  });

  it('links CVEs and bugs to their http(s) references', async () => {
    const { wrapper } = await mountPanel(fixtureRoutes);
    const links = wrapper.findAll('a');
    const expected = changelog.advisories.flatMap((a) =>
      [...a.cves, ...a.bugs].flatMap((id) => a.references.filter((r) => r.id === id).map((r) => r.href)),
    );
    expect(expected.length).toBeGreaterThan(0);
    expect(links.map((l) => l.attributes('href'))).toEqual(expected);
    for (const link of links) expect(link.attributes('rel')).toContain('noopener');
  });

  it('renders a reference that is not http(s) as text', async () => {
    const advisory = changelog.advisories.find((a) => a.cves.length > 0)!;
    const hostile: ManagedOSVersionChangelog = {
      ...changelog,
      advisories: [
        {
          ...advisory,
          references: advisory.references.map((r) => ({ ...r, href: 'javascript:alert(document.cookie)' })),
        },
      ],
    };
    const { wrapper } = await mountPanel((path, query) =>
      path.endsWith('/changelog') ? { status: 200, body: hostile } : fixtureRoutes(path, query),
    );
    expect(wrapper.findAll('a')).toHaveLength(0);
    expect(wrapper.findAll('[data-testid=ecl-cve]').map((c) => c.text())).toEqual(advisory.cves);
  });

  it('offers the older versions of the channel and asks with from= when one is chosen', async () => {
    const { wrapper, request } = await mountPanel(fixtureRoutes);
    const options = wrapper.findAll('[data-testid=ecl-compare] option').map((o) => o.attributes('value'));
    expect(options[0]).toBe('');
    expect(options).toContain(changelog.from!.name);
    expect(options.at(-1)).toBe(changelogFrom.from!.name);
    expect(options).not.toContain(changelog.metadata.name);

    await wrapper.get('[data-testid=ecl-compare]').setValue(changelogFrom.from!.name);
    await settle();
    expect(request.mock.calls.at(-1)?.[0]).toContain(`?from=${encodeURIComponent(changelogFrom.from!.name)}`);
    expect(ids(wrapper)).toEqual(changelogFrom.advisories.map((a) => a.id));
    expect(wrapper.get('[data-testid=ecl-from]').text()).toBe(changelogFrom.from!.version);

    await wrapper.get('[data-testid=ecl-compare]').setValue('');
    await settle();
    expect(ids(wrapper)).toEqual(changelog.advisories.map((a) => a.id));
  });

  it('lists only the version\'s channel when the operator\'s label names it', async () => {
    const channel = changelog.channel.name;
    const server = fakeServer(fixtureRoutes);
    const resource = resourceOf(changelog);
    resource.metadata.labels = { 'elemental.cattle.io/channel': channel };
    mount(ChangelogPanel, { props: { resource, api: server.api } });
    await settle();
    expect(server.request.mock.calls.map((c) => c[0])).toContain(
      `/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/namespaces/${changelog.metadata.namespace}/managedosversions?labelSelector=${encodeURIComponent(`elemental.cattle.io/channel=${channel}`)}`,
    );
  });

  it('keeps only the latest answer when the choice changes quickly', async () => {
    let release: (() => void) | undefined;
    const server = fakeServer(fixtureRoutes);
    const slow = async (url: string) => {
      if (url.includes('from=')) await new Promise<void>((resolve) => (release = resolve));
      return server.request(url);
    };
    const { ChangelogApi } = await import('../src/api');
    const api = new ChangelogApi(slow, '/k8s/clusters/local');
    const wrapper = mount(ChangelogPanel, { props: { resource: resourceOf(changelog), api } });
    await settle();
    await wrapper.get('[data-testid=ecl-compare]').setValue(changelogFrom.from!.name);
    await settle();
    await wrapper.get('[data-testid=ecl-compare]').setValue('');
    await settle();
    release?.();
    await settle();
    expect(ids(wrapper)).toEqual(changelog.advisories.map((a) => a.id));
  });

  it('shows the package diff', async () => {
    const { wrapper } = await mountPanel(fixtureRoutes);
    const packages = changelog.packages!;
    for (const key of ['upgraded', 'downgraded', 'added', 'removed'] as const) {
      const section = wrapper.find(`[data-testid=ecl-packages-${key}]`);
      expect(section.exists()).toBe(packages[key].length > 0);
      if (packages[key].length > 0) expect(section.findAll('tr')).toHaveLength(packages[key].length);
    }
    const first = packages.upgraded[0]!;
    expect(wrapper.get('[data-testid=ecl-packages-upgraded]').text()).toContain(`${first.from} → ${first.to}`);
  });

  it('says so when there is nothing to compare with', async () => {
    const { wrapper } = await mountPanel(fixtureRoutes, changelogOldest);
    expect(changelogOldest.advisories).toHaveLength(0);
    expect(changelogOldest.from).toBeUndefined();
    expect(wrapper.get('[data-testid=ecl-empty]').text()).toContain('oldest version');
    expect(wrapper.findAll('[data-testid=ecl-warning]').map((w) => w.text())).toEqual(changelogOldest.warnings ?? []);
    expect(wrapper.find('[data-testid=ecl-compare]').exists()).toBe(false);
  });

  it.each([
    ['forbidden', statuses.forbidden, false],
    ['notFound', statuses.notFound, false],
    ['noData', statuses.noChangelogData, false],
    ['fetchFailed', statuses.fetchFailed, false],
    ['notFetched', statuses.notFetched, true],
    ['badRequest', statuses.fromNotOlder, false],
  ] as const)('shows the %s state with the server\'s message', async (kind, status, retry) => {
    const { wrapper } = await mountPanel((path, query) =>
      path.endsWith('/changelog') ? statusAnswer(status) : fixtureRoutes(path, query),
    );
    const notice = wrapper.get('[data-testid=ecl-problem]');
    expect(notice.attributes('data-kind')).toBe(kind);
    expect(notice.get('[data-testid=ecl-problem-message]').text()).toBe(status.message);
    expect(notice.find('[data-testid=ecl-retry]').exists()).toBe(retry);
    expect(wrapper.findAll('[data-testid=ecl-advisory]')).toHaveLength(0);
  });

  it('retries a changelog that is not fetched yet', async () => {
    let fetched = false;
    const { wrapper } = await mountPanel((path, query) =>
      path.endsWith('/changelog') && !fetched ? statusAnswer(statuses.notFetched) : fixtureRoutes(path, query),
    );
    expect(wrapper.get('[data-testid=ecl-retry]').text()).toContain(`${statuses.notFetched.details!.retryAfterSeconds} s`);
    fetched = true;
    await wrapper.get('[data-testid=ecl-retry]').trigger('click');
    await settle();
    expect(wrapper.find('[data-testid=ecl-problem]').exists()).toBe(false);
    expect(ids(wrapper)).toEqual(changelog.advisories.map((a) => a.id));
  });

  it('still shows the changelog when the versions cannot be listed', async () => {
    const { wrapper } = await mountPanel((path, query) =>
      path.endsWith('/managedosversions') ? statusAnswer(statuses.forbidden) : fixtureRoutes(path, query),
    );
    expect(ids(wrapper)).toEqual(changelog.advisories.map((a) => a.id));
    expect(wrapper.find('[data-testid=ecl-compare]').exists()).toBe(false);
    expect(wrapper.get('[data-testid=ecl-compare-unavailable]').text()).toContain(statuses.forbidden.message);
  });

  it('reloads for another ManagedOSVersion', async () => {
    const { wrapper } = await mountPanel(fixtureRoutes);
    await wrapper.setProps({ resource: resourceOf(changelogOldest) });
    await settle();
    expect(wrapper.get('[data-testid=ecl-version]').text()).toBe(changelogOldest.version);
    expect(summaries.items.some((i) => i.metadata.name === changelogOldest.metadata.name)).toBe(true);
  });
});
