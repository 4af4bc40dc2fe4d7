import { describe, expect, it, vi } from 'vitest';
import { ChangelogApi } from '../src/api';
import { LOCAL_CLUSTER_BASE, storeRequester } from '../src/store';
import { changelog, statuses } from './fixtures';

/** What Rancher's store `request` action does with an answer: the body, with a non-enumerable `_status`. */
function asRancherResponse<T extends object>(body: T, status: number): T {
  const copy = structuredClone(body);
  Object.defineProperty(copy, '_status', { value: status });
  return copy;
}

describe('storeRequester (Rancher store request action)', () => {
  it('passes the URL to management/request and returns the body', async () => {
    const dispatch = vi.fn(async () => asRancherResponse(changelog, 200));
    const api = new ChangelogApi(storeRequester({ dispatch }), LOCAL_CLUSTER_BASE);
    const result = await api.changelog('fleet-default', changelog.metadata.name);
    expect(result).toEqual({ ok: true, value: changelog });
    expect(dispatch).toHaveBeenCalledWith('management/request', {
      url: `/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/namespaces/fleet-default/managedosversions/${changelog.metadata.name}/changelog`,
      method: 'GET',
      headers: { accept: 'application/json' },
    });
  });

  it('turns a rejected answer into the Status problem', async () => {
    const dispatch = vi.fn(async (_action: string, _payload?: unknown) => {
      throw asRancherResponse(statuses.forbidden, 403);
    });
    const result = await new ChangelogApi(storeRequester({ dispatch }, 'cluster'), LOCAL_CLUSTER_BASE).summaries(undefined);
    expect(!result.ok && result.problem).toMatchObject({ kind: 'forbidden', code: 403, message: statuses.forbidden.message });
    expect(dispatch.mock.calls[0]?.[0]).toBe('cluster/request');
  });

  it('reports a failure without an answer', async () => {
    const dispatch = vi.fn(async () => {
      throw new Error('Network Error');
    });
    const result = await new ChangelogApi(storeRequester({ dispatch }), LOCAL_CLUSTER_BASE).summaries(undefined);
    expect(!result.ok && result.problem).toMatchObject({ kind: 'other', code: 0, message: 'the request failed: Network Error' });
  });
});
