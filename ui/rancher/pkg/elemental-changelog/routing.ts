import CveSearchPage from './pages/CveSearchPage.vue';
import PackageSearchPage from './pages/PackageSearchPage.vue';
import { CVE_PAGE, CVE_ROUTE, ELEMENTAL_PRODUCT, PACKAGE_PAGE, PACKAGE_ROUTE } from './product';

// A static last segment, so it ranks above elemental-ui's
// `/:product/c/:cluster/:resource`.
export default [
  {
    name: CVE_ROUTE,
    path: `/${ELEMENTAL_PRODUCT}/c/:cluster/${CVE_PAGE}`,
    component: CveSearchPage,
    meta: { product: ELEMENTAL_PRODUCT, cluster: '_' },
  },
  {
    name: PACKAGE_ROUTE,
    path: `/${ELEMENTAL_PRODUCT}/c/:cluster/${PACKAGE_PAGE}`,
    component: PackageSearchPage,
    meta: { product: ELEMENTAL_PRODUCT, cluster: '_' },
  },
];
