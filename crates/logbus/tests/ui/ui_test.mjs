// Drives the live view of a running `logbus run --api` in real headless
// Chromium: the page loads, the graph shows every stage, counters advance,
// and the tap panel shows events leaving a stage.
// With ACK_STAGE, that source's acknowledgements show on its graph node;
// with ROUTE (`stage.route`), that route's edge is labelled with a count
// that advances. Every graph must fit its pane's width (long pipelines
// wrap into bands).
// Usage: node ui_test.mjs URL STAGE[,STAGE...] SCREENSHOT.png [ACK_STAGE] [ROUTE]
import { chromium } from "playwright-core";

const [url, stageList, screenshot, ackStage, route] = process.argv.slice(2);
const stages = stageList.split(",");
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let passed = 0, failed = 0;
const check = async (name, fn) => {
  try { await fn(); passed++; console.log(`ok   ${name}`); }
  catch (e) { failed++; console.log(`FAIL ${name}: ${e.message}`); }
};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 800 } });
  const errors = [];
  page.on("pageerror", e => errors.push(String(e)));
  await page.goto(url);
  await check("the graph shows every stage", async () => {
    for (const id of stages) await page.waitForSelector(`[data-stage="${id}"]`, { timeout: 15000 });
    const edges = await page.locator("[data-edge]").count();
    if (edges < stages.length - 1) throw new Error(`only ${edges} edges`);
  });
  await check("counters advance", async () => {
    const committed = async () => Number(await page.getAttribute("#committed", "data-value") ?? 0);
    await page.waitForFunction(() => Number(document.querySelector("#committed").dataset.value || 0) > 0, null, { timeout: 15000 });
    const first = await committed();
    await page.waitForFunction(v => Number(document.querySelector("#committed").dataset.value) > v, first, { timeout: 15000 });
    const rate = await page.textContent(`[data-rate="${stages[1]}"]`);
    if (!/ev\/s/.test(rate)) throw new Error(`no rate shown: ${rate}`);
  });
  await check("the tap shows events leaving a stage", async () => {
    await page.selectOption("#tap-stage", stages[1]);
    await page.click("#tap-go");
    await page.waitForFunction(() => document.querySelector("#tap-out").textContent.includes('"seq"'), null, { timeout: 15000 });
  });
  if (ackStage) await check("a source's acknowledgements are shown", async () => {
    await page.waitForFunction(id => {
      const m = /acknowledged ([0-9.]+k?) delivered/.exec(document.querySelector(`[data-series="${id}"]`)?.textContent || "");
      return m && m[1] !== "0";
    }, ackStage, { timeout: 15000 });
  });
  if (route) await check("a route's edge is labelled with what it took", async () => {
    const count = async () => {
      const text = await page.textContent(`[data-edge-label="${route}"]`);
      const m = /^\S+ ([0-9.]+)(k|M)?$/.exec(text || "");
      if (!m) throw new Error(`label reads ${JSON.stringify(text)}`);
      return Number(m[1]) * (m[2] === "k" ? 1e3 : m[2] === "M" ? 1e6 : 1);
    };
    await page.waitForFunction(r => /\d/.test(document.querySelector(`[data-edge-label="${r}"]`)?.textContent || ""), route, { timeout: 15000 });
    const first = await count();
    await page.waitForFunction(([r, v]) => {
      const m = /^\S+ ([0-9.]+)(k|M)?$/.exec(document.querySelector(`[data-edge-label="${r}"]`)?.textContent || "");
      return m && Number(m[1]) * (m[2] === "k" ? 1e3 : m[2] === "M" ? 1e6 : 1) > v;
    }, [route, first], { timeout: 15000 });
  });
  await check("the graph fits its pane's width", async () => {
    const { scroll, client } = await page.evaluate(() => {
      const g = document.querySelector("#graph");
      return { scroll: g.scrollWidth, client: g.clientWidth };
    });
    if (scroll > client) throw new Error(`the graph is ${scroll} px wide in a ${client} px pane`);
  });
  await check("no script errors", async () => {
    if (errors.length) throw new Error(errors.join("; "));
  });
  if (screenshot) await page.screenshot({ path: screenshot });
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
