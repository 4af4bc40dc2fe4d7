// The browser half of integration/tests/ui.rs: Debian's chromium, driven
// by playwright-core, against the harness and the API served by kubectl
// proxy under /k8s/clusters/local/. The Rust test starts everything and
// writes what to expect (from the server's answers and the generated
// channel's model) to the file named by UI_EXPECT. Screenshots go to
// UI_ARTIFACTS. Exits non-zero on the first failed check.
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';

const expect = JSON.parse(readFileSync(required('UI_EXPECT'), 'utf8'));
const artifacts = required('UI_ARTIFACTS');
const executablePath = process.env.UI_CHROMIUM || '/usr/bin/chromium';
/** Bound on any one thing appearing on the page. */
const TIMEOUT = 30_000;

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

function same(actual, expected, what) {
  check(
    JSON.stringify(actual) === JSON.stringify(expected),
    `${what}: got ${JSON.stringify(actual)}, want ${JSON.stringify(expected)}`,
  );
}

/**
 * Runs `command` (the test's kubectl annotate: a machine re-registered as the operator does), then
 * waits until `shown` holds on the page, which is not reloaded: the UI must follow the change
 * through its watch. Returns the milliseconds from the command's start to the page showing it.
 */
async function changeAndWait(page, command, shown, arg, what) {
  const started = Date.now();
  const [program, ...args] = command;
  await promisify(execFile)(program, args, { timeout: TIMEOUT });
  try {
    await page.waitForFunction(shown, arg, { timeout: TIMEOUT });
  } catch (error) {
    const live = await page.locator('[data-live]').first().getAttribute('data-live');
    const notice = await page.getByTestId('ecl-live').first().getAttribute('title').catch(() => null);
    throw new Error(
      `${what}: not shown without a reload (live state "${live}"${notice ? `: ${notice}` : ''}); the page says: ` +
        `${await page.locator('body').innerText()} (${error.message})`,
    );
  }
  return Date.now() - started;
}

async function advisoryIds(page) {
  return page.locator('[data-testid=ecl-advisory]').evaluateAll((nodes) => nodes.map((n) => n.dataset.id));
}

/** Waits until the advisories shown are exactly `ids` (in the server's order). */
async function waitForAdvisories(page, ids, what) {
  try {
    await page.waitForFunction(
      (want) =>
        JSON.stringify([...document.querySelectorAll('[data-testid=ecl-advisory]')].map((n) => n.dataset.id)) ===
        JSON.stringify(want),
      ids,
      { timeout: TIMEOUT },
    );
  } catch (error) {
    throw new Error(`${what}: the page shows ${JSON.stringify(await advisoryIds(page))}, want ${JSON.stringify(ids)} (${error.message})`);
  }
}

async function panel(browser) {
  const want = expect.panel;
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));
  await page.goto(want.url);
  await waitForAdvisories(page, want.advisories, 'the panel');
  same(await page.getByTestId('ecl-version').textContent(), want.version, 'the version shown');
  same(await page.getByTestId('ecl-from').textContent(), want.fromVersion, 'the default comparison');
  same(
    await page.getByTestId('ecl-count-advisories').getAttribute('data-value'),
    String(want.advisories.length),
    'the advisories badge',
  );
  const severities = await page.getByTestId('ecl-summary').getByTestId('ecl-severity').allTextContents();
  same(severities, [want.highestSeverity], 'the highest-severity badge');
  // Every link the panel renders is http(s).
  const hrefs = await page.locator('[data-testid=ecl-panel] a').evaluateAll((links) => links.map((a) => a.href));
  check(hrefs.length > 0, 'the panel renders no link');
  for (const href of hrefs) check(/^https?:\/\//.test(href), `a link that is not http(s): ${href}`);
  await page.screenshot({ path: join(artifacts, 'panel.png'), fullPage: true });
  // The choices come from the summaries of the version's channel only.
  check(
    requests.some((u) => u.includes('/managedosversions?labelSelector=elemental.cattle.io%2Fchannel%3D')),
    `no summaries request for the version's channel: ${requests.join(' ')}`,
  );

  // "Compare with" an older version asks the server with from= and shows its answer.
  await page.getByTestId('ecl-compare').selectOption(want.compareWith);
  await waitForAdvisories(page, want.compareAdvisories, `compared with ${want.compareWith}`);
  same(await page.getByTestId('ecl-from').textContent(), want.compareVersion, 'the chosen comparison');
  check(
    requests.some((u) => u.includes('/k8s/clusters/local/apis/changelog.elemental.cattle.io/v1beta1/') && u.includes(`from=${encodeURIComponent(want.compareWith)}`)),
    `no from=${want.compareWith} request under /k8s/clusters/local/: ${requests.join(' ')}`,
  );
  await page.getByTestId('ecl-packages').locator('summary').click();
  await page.screenshot({ path: join(artifacts, 'panel-compare.png'), fullPage: true });
  await page.close();
  return `panel: ${want.advisories.length} advisories, ${want.compareAdvisories.length} since ${want.compareVersion}`;
}

async function cve(browser) {
  const want = expect.cve;
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  await page.goto(want.url);
  // A malformed id is refused on the page, without a request.
  await page.getByTestId('ecl-cve-input').fill('not-a-cve');
  await page.getByTestId('ecl-cve-submit').click();
  await page.getByTestId('ecl-cve-invalid').waitFor({ timeout: TIMEOUT });

  await page.getByTestId('ecl-cve-input').fill(want.id.toLowerCase());
  await page.getByTestId('ecl-cve-submit').click();
  const group = page.locator(`[data-testid=ecl-cve-group][data-namespace="${want.namespace}"][data-channel="${want.channel}"]`);
  await group.waitFor({ timeout: TIMEOUT });
  const names = await group.locator('[data-testid=ecl-cve-version]').evaluateAll((nodes) => nodes.map((n) => n.dataset.name));
  same(names, want.versions, `versions fixing ${want.id}`);
  const first = await group.locator('[data-testid=ecl-cve-version]').first().textContent();
  check(first.startsWith('First fixed in'), `the first version is not marked as the first fix: ${first}`);
  // The machines still exposed, under the version that fixes it for them, and nowhere else.
  const fix = group.locator(`[data-testid=ecl-cve-version][data-name="${want.fixedIn}"]`);
  await fix.getByTestId('ecl-cve-machine').first().waitFor({ timeout: TIMEOUT });
  const exposed = await fix.getByTestId('ecl-cve-machine').evaluateAll((nodes) => nodes.map((n) => n.dataset.name));
  same(exposed, want.exposed, `machines exposed to ${want.id} under ${want.fixedIn}`);
  same(await page.getByTestId('ecl-cve-machine').count(), want.exposed.length, 'exposed machines on the page');
  same(
    await page.getByTestId('ecl-cve-exposed').getAttribute('data-count'),
    String(want.exposed.length),
    'the count of exposed machines',
  );
  await page.screenshot({ path: join(artifacts, 'cve.png'), fullPage: true });

  // Live: the exposed machine re-registered on the fixing version leaves the list, no new search.
  const took = await changeAndWait(
    page,
    want.live.annotate,
    (name) =>
      document.querySelector('[data-testid=ecl-cve-exposed]')?.dataset.count === '0' &&
      ![...document.querySelectorAll('[data-testid=ecl-cve-machine]')].some((n) => n.dataset.name === name),
    want.live.machine,
    `${want.live.machine} upgraded to ${want.fixedIn}`,
  );
  same(await page.getByTestId('ecl-cve-search').getAttribute('data-live'), 'live', 'the CVE page\'s watch');
  await page.screenshot({ path: join(artifacts, 'cve-live.png'), fullPage: true });
  await page.close();
  return `cve: ${want.id} first fixed in ${want.versions[0]}; ${want.exposed.join(', ')} exposed until ${want.fixedIn}; ` +
    `upgraded, gone from the page after ${took} ms`;
}

/**
 * The package page (after the CVE page, whose live step moved the exposed machine onto the
 * fixing version): the versions carrying a package from an EVR on, the package of each, the
 * machines running it; one machine re-registered below the range leaves it without a reload.
 */
async function packages(browser) {
  const want = expect.package;
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  await page.goto(want.url);
  // A malformed bound is refused on the page, without a request.
  await page.getByTestId('ecl-package-name').fill(want.name);
  await page.getByTestId('ecl-package-at-least').fill('not a version');
  await page.getByTestId('ecl-package-submit').click();
  await page.getByTestId('ecl-package-invalid').waitFor({ timeout: TIMEOUT });

  await page.getByTestId('ecl-package-at-least').fill(want.atLeast);
  await page.getByTestId('ecl-package-namespace').fill(want.namespace);
  await page.getByTestId('ecl-package-submit').click();
  const group = page.locator(`[data-testid=ecl-package-group][data-namespace="${want.namespace}"][data-channel="${want.channel}"]`);
  await group.waitFor({ timeout: TIMEOUT });
  const versions = group.locator('[data-testid=ecl-package-version]');
  same(await versions.evaluateAll((nodes) => nodes.map((n) => n.dataset.name)), want.versions, `versions carrying ${want.name} from ${want.atLeast}`);
  same(await group.locator('[data-testid=ecl-package-text]').allTextContents(), want.texts, `the ${want.name} of each version`);
  const on = group.locator(`[data-testid=ecl-package-version][data-name="${want.machinesOn}"]`);
  await on.getByTestId('ecl-package-machine').nth(want.machines.length - 1).waitFor({ timeout: TIMEOUT });
  const running = await on.getByTestId('ecl-package-machine').evaluateAll((nodes) => nodes.map((n) => n.dataset.name).sort());
  same(running, want.machines, `machines on ${want.machinesOn}`);
  await page.screenshot({ path: join(artifacts, 'package.png'), fullPage: true });

  // Live: a machine re-registered on the version before (below the range) leaves the page.
  const took = await changeAndWait(
    page,
    want.live.annotate,
    (name) =>
      document.querySelectorAll('[data-testid=ecl-package-machine]').length > 0 &&
      ![...document.querySelectorAll('[data-testid=ecl-package-machine]')].some((n) => n.dataset.name === name),
    want.live.machine,
    `${want.live.machine} re-registered below ${want.name} ${want.atLeast}`,
  );
  same(await page.getByTestId('ecl-package-search').getAttribute('data-live'), 'live', 'the package page\'s watch');
  await page.screenshot({ path: join(artifacts, 'package-live.png'), fullPage: true });
  await page.close();
  return `package: ${want.name} from ${want.atLeast} in ${want.versions.length} versions; ${running.join(', ')} on ${want.machinesOn}; ` +
    `${want.live.machine} moved below, gone from the page after ${took} ms`;
}

/** The machine panel: what upgrading a machine to its target changes. */
async function machine(browser) {
  const want = expect.machine;
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  await page.goto(want.url);
  await waitForAdvisories(page, want.advisories, 'the machine panel');
  same(await page.getByTestId('ecl-machine-state').getAttribute('data-state'), 'UpdatesAvailable', 'the machine state');
  same(await page.getByTestId('ecl-machine-current').getAttribute('data-name'), want.current, 'the version it runs');
  same(await page.getByTestId('ecl-machine-target').getAttribute('data-name'), want.target, 'its target');
  same(
    await page.getByTestId('ecl-count-advisories').getAttribute('data-value'),
    String(want.advisories.length),
    'the pending advisories badge',
  );
  const severities = await page.getByTestId('ecl-summary').getByTestId('ecl-severity').allTextContents();
  same(severities, [want.highestSeverity], 'the highest pending severity');
  await page.screenshot({ path: join(artifacts, 'machine.png'), fullPage: true });

  // Live: re-registered on its target, the machine is up to date, with nothing pending, no reload.
  const took = await changeAndWait(
    page,
    want.live.annotate,
    (live) =>
      document.querySelector('[data-testid=ecl-machine-state]')?.dataset.state === live.state &&
      document.querySelector('[data-testid=ecl-machine-current]')?.dataset.name === live.current &&
      document.querySelectorAll('[data-testid=ecl-advisory]').length === 0,
    want.live,
    `the machine re-registered on ${want.live.current}`,
  );
  same(await page.getByTestId('ecl-machine').getAttribute('data-live'), 'live', 'the machine panel\'s watch');
  await page.screenshot({ path: join(artifacts, 'machine-live.png'), fullPage: true });
  await page.close();
  return `machine: ${want.advisories.length} advisories pending from ${want.current} to ${want.target}; ` +
    `re-registered on ${want.live.current}, shown ${want.live.state} after ${took} ms`;
}

async function forbidden(browser) {
  const page = await browser.newPage({ viewport: { width: 1100, height: 500 } });
  await page.goto(expect.forbidden.url);
  const notice = page.locator('[data-testid=ecl-problem][data-kind=forbidden]');
  try {
    await notice.waitFor({ timeout: TIMEOUT });
  } catch (error) {
    throw new Error(`no forbidden state; the page says: ${await page.locator('body').innerText()} (${error.message})`);
  }
  const message = await notice.getByTestId('ecl-problem-message').textContent();
  check(message.includes('forbidden'), `the forbidden state does not show the server's message: ${message}`);
  same(await page.locator('[data-testid=ecl-advisory]').count(), 0, 'advisories shown to a user without rights');
  await page.screenshot({ path: join(artifacts, 'forbidden.png'), fullPage: true });
  await page.close();
  return 'forbidden: shown';
}

/** The error states the server's answers lead to, each with the server's message. */
async function states(browser) {
  const page = await browser.newPage({ viewport: { width: 1100, height: 400 } });
  for (const state of expect.states) {
    await page.goto(state.url);
    const notice = page.locator(`[data-testid=ecl-problem][data-kind=${state.kind}]`);
    try {
      await notice.waitFor({ timeout: TIMEOUT });
    } catch (error) {
      throw new Error(`no ${state.kind} state; the page says: ${await page.locator('body').innerText()} (${error.message})`);
    }
    const message = await notice.getByTestId('ecl-problem-message').textContent();
    check(message.length > 0, `the ${state.kind} state has no message`);
    await page.screenshot({ path: join(artifacts, `state-${state.kind}.png`), fullPage: true });
    const retry = notice.getByTestId('ecl-retry');
    same(await retry.count(), state.retry ? 1 : 0, `retry buttons in the ${state.kind} state`);
    if (state.retry) {
      // Retry asks the server again, which still answers the same.
      const asked = page.waitForResponse((r) => r.url().includes('/changelog'), { timeout: TIMEOUT });
      await retry.click();
      same((await asked).status(), 503, `the answer after retrying the ${state.kind} state`);
      await notice.waitFor({ timeout: TIMEOUT });
    }
  }
  await page.close();
  return `states: ${expect.states.map((s) => s.kind).join(', ')}`;
}

const browser = await chromium.launch({
  executablePath,
  // Root in CI: chromium's sandbox needs user namespaces it may not have.
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});
try {
  for (const run of [panel, cve, packages, machine, forbidden, states]) {
    const started = Date.now();
    console.log(`${await run(browser)} (${Date.now() - started} ms)`);
  }
} finally {
  await browser.close();
}
