import CveSearchPage from './pages/CveSearchPage.vue';
import { CVE_PAGE, CVE_ROUTE, ELEMENTAL_PRODUCT } from './product';

// A static last segment, so it ranks above elemental-ui's
// `/:product/c/:cluster/:resource`.
export default [
  {
    name: CVE_ROUTE,
    path: `/${ELEMENTAL_PRODUCT}/c/:cluster/${CVE_PAGE}`,
    component: CveSearchPage,
    meta: { product: ELEMENTAL_PRODUCT, cluster: '_' },
  },
];
