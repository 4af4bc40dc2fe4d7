// Adds the CVE page and the package page to the side menu of the Elemental product (registered
// by rancher/elemental-ui under the name `elemental`).
import { IPlugin } from '@shell/core/types';

/** elemental-ui's product name. */
export const ELEMENTAL_PRODUCT = 'elemental';
/** Rancher's type id of the operator's ManagedOSVersion. */
export const MANAGED_OS_VERSION = 'elemental.cattle.io.managedosversion';
/** Rancher's type id of the operator's MachineInventory. */
export const MACHINE_INVENTORY = 'elemental.cattle.io.machineinventory';
/** Name of the CVE page's menu entry and the last part of its route name. */
export const CVE_PAGE = 'elemental-changelog-cve';
/** Route name of the CVE page, in elemental-ui's `<product>-c-cluster-<page>` scheme. */
export const CVE_ROUTE = `${ELEMENTAL_PRODUCT}-c-cluster-${CVE_PAGE}`;
/** Name of the package page's menu entry and the last part of its route name. */
export const PACKAGE_PAGE = 'elemental-changelog-package';
/** Route name of the package page. */
export const PACKAGE_ROUTE = `${ELEMENTAL_PRODUCT}-c-cluster-${PACKAGE_PAGE}`;

export function init($plugin: IPlugin, store: any): void {
  const { virtualType, basicType, weightType } = $plugin.DSL(store, ELEMENTAL_PRODUCT);

  virtualType({
    label: 'CVE fixes',
    name: CVE_PAGE,
    namespaced: false,
    route: { name: CVE_ROUTE, params: { cluster: '_' } },
  });
  virtualType({
    label: 'Package search',
    name: PACKAGE_PAGE,
    namespaced: false,
    route: { name: PACKAGE_ROUTE, params: { cluster: '_' } },
  });
  basicType([CVE_PAGE, PACKAGE_PAGE]);
  weightType(CVE_PAGE, 5, true);
  weightType(PACKAGE_PAGE, 4, true);
}
