// Rancher's way of making requests, without importing Rancher: its stores'
// `request` action resolves to the parsed body with a non-enumerable
// `_status`, and rejects with the same kind of object for an error answer
// (or with the underlying error when no answer came).
import type { Requester } from './api';

/** Rancher's proxy path of the cluster Rancher itself runs in, where Elemental lives. */
export const LOCAL_CLUSTER_BASE = '/k8s/clusters/local';

/** The part of a Vuex store the requester uses. */
export interface DispatchingStore {
  dispatch(action: string, payload?: unknown): Promise<unknown>;
}

/**
 * A `Requester` that goes through the `request` action of Rancher's store
 * `storeName` (`management` for the local cluster), so calls carry the
 * logged-in user's session and Rancher impersonates them.
 */
export function storeRequester(store: DispatchingStore, storeName = 'management'): Requester {
  return async (url) => {
    try {
      const body = await store.dispatch(`${storeName}/request`, {
        url,
        method: 'GET',
        headers: { accept: 'application/json' },
      });
      return { status: statusOf(body) ?? 200, body };
    } catch (error) {
      const status = statusOf(error);
      if (status === undefined) throw error;
      return { status, body: error };
    }
  };
}

function statusOf(value: unknown): number | undefined {
  const status = (value as { _status?: unknown } | null | undefined)?._status;
  return typeof status === 'number' ? status : undefined;
}

/** The Vuex store Rancher installs on every component (`this.$store`). */
export function storeOf(component: unknown): DispatchingStore {
  const store = (component as { $store?: DispatchingStore } | null)?.$store;
  if (!store) throw new Error('no Vuex store on this component: it runs inside Rancher');
  return store;
}
