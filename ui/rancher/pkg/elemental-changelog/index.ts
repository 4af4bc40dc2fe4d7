// The Rancher extension: registers the changelog panel on the detail page of
// the operator's ManagedOSVersions, the pending-updates panel on that of its
// MachineInventories, and the CVE page inside the Elemental product. The components come from ../src (the `src` symlink), which has
// no Rancher import and is tested in CI; this file and the others here are
// only built and run inside Rancher (see docs/ui.md).
import { importTypes } from '@rancher/auto-import';
import { IPlugin, PanelLocation } from '@shell/core/types';
import { MACHINE_INVENTORY, MANAGED_OS_VERSION } from './product';
import routes from './routing';

export default function(plugin: IPlugin): void {
  importTypes(plugin);
  plugin.metadata = require('./package.json');
  plugin.addProduct(require('./product'));
  plugin.addRoutes(routes);
  // elemental-ui has no custom detail view for ManagedOSVersions: the
  // generic detail page shows masthead panels.
  plugin.addPanel(
    PanelLocation.DETAILS_MASTHEAD,
    { resource: [MANAGED_OS_VERSION], mode: ['detail'] },
    { component: () => import('./components/ChangelogMasthead.vue') },
  );
  // What upgrading a machine to its target changes, above its detail page.
  plugin.addPanel(
    PanelLocation.DETAILS_MASTHEAD,
    { resource: [MACHINE_INVENTORY], mode: ['detail'] },
    { component: () => import('./components/MachineMasthead.vue') },
  );
}
