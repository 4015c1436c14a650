// Screenshot of a gostw timeline (trace-event JSON) in Chromium's own trace
// viewer, the DevTools Performance panel, served by a headless Chromium's
// remote-debugging server on loopback.
//
//   node devtools-trace.mjs FRONTEND_URL TIMELINE.json OUT.png
//
// The timeline is cut to the pause with the most fault time (and 1.5 ms
// either side) so that one GC fills the view; then the process's tracks are
// expanded, the stopping thread's and the pause track opened, and the pause
// selected so its args show in the Summary pane. Clicks are at the panel's
// layout for a 1600x900 window.
import {mkdtempSync, readFileSync, writeFileSync} from 'node:fs';
import {join} from 'node:path';

import puppeteer from 'puppeteer-core';

const [frontend, timeline, out] = process.argv.slice(2);
const trace = JSON.parse(readFileSync(timeline, 'utf8'));
const events = trace.traceEvents;
const pause = events
  .filter(e => e.cat === 'pause')
  .reduce((a, b) => ((b.args?.fault_ns ?? 0) > (a.args?.fault_ns ?? 0) ? b : a));
const lo = pause.ts - 1500;
const hi = pause.ts + pause.dur + 1500;
const kept = events.filter(e => e.ph !== 'M' && e.ts + (e.dur ?? 0) >= lo && e.ts <= hi);
const tids = new Set(kept.map(e => e.tid));
const meta = events.filter(e => e.ph === 'M' && (e.name === 'process_name' || tids.has(e.tid)));
const dir = mkdtempSync('/tmp/gostw-shot-');
const cut = join(dir, 'one-pause.json');
writeFileSync(cut, JSON.stringify({...trace, traceEvents: [...meta, ...kept]}));
const threads = tids.size - 1; // the pause track is one of them
console.log(`pause ${pause.name} at ${pause.ts} us, ${pause.dur} us; ${threads} threads with faults`);

const browser = await puppeteer.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  userDataDir: join(dir, 'profile'),
  args: ['--no-sandbox', '--disable-gpu', '--window-size=1600,900'],
});
const page = await browser.newPage();
await page.setViewport({width: 1600, height: 900});
const sleep = ms => new Promise(r => setTimeout(r, ms));
const button = label => page.$(`pierce/button[aria-label="${label}"]`);
await page.goto(`${frontend}?panel=timeline`, {waitUntil: 'load', timeout: 30000});
await sleep(4000);
const [chooser] = await Promise.all([
  page.waitForFileChooser({timeout: 10000}),
  (async () => {
    await page.keyboard.down('Control');
    await page.keyboard.press('o');
    await page.keyboard.up('Control');
  })(),
]);
await chooser.accept([cut]);
await sleep(12000);
// A fresh profile opens with a shortcuts dialog and the sidebar.
await page.mouse.click(1571, 77);
await sleep(1000);
const show = await button('Show sidebar');
if (show) {
  await show.click();
  await sleep(1500);
}
await page.mouse.click(249, 129); // the process group's header: expand
await sleep(1500);
const hide = await button('Hide sidebar');
if (hide) {
  await hide.click();
  await sleep(1500);
}
// Rows of 21 px under the header: the fault threads, then the pause track.
const row = 20.9;
await page.mouse.click(19, 145 + row * threads); // open the pause track
await sleep(1500);
await page.mouse.click(19, 145); // open the first thread (the stopper)
await sleep(1500);
// Select the pause: a click on its bar (the window is the pause and 1.5 ms
// either side, across the whole width), then the mouse out of the way.
const centre = 1600 * (1500 + pause.dur / 2) / (pause.dur + 3000);
await page.mouse.click(Math.round(centre), Math.round(145 + row * threads + 34));
await sleep(1500);
await page.mouse.move(800, 600);
await sleep(1500);
await page.screenshot({path: out});
await browser.close();
