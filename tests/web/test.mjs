#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// The chat page at GET / (coordinator/server/page/index.html) in headless Chromium (Debian's
// `chromium`, driven by playwright-core) against a real `shardlm serve`:
//
//   node tests/web/test.mjs build/shardlm      (npm ci --prefix tests/web first)
//
// Two servers on the test model ($SHARDLM_TEST_MODEL, else build/stories260K-w4a8.shlm):
//   A, without a chat template: the page falls back to /v1/completions and says so; a reply
//      streams (sampled twice while it grows), ends, shows tokens per second and the usage
//      chunk's count; Enter sends, Shift+Enter is a newline; Stop aborts a long reply and the
//      server goes on serving.
//   B, with --chat-template and --api-key-file: 401 shows in the error line until the key is
//      set (kept in localStorage); replies go through /v1/chat/completions with the whole
//      conversation; the streamed text equals the server's unstreamed reply at temperature 0;
//      once the server has exited, Send shows a network error in the page.
// The tiny model writes a reply in tens of milliseconds, so where the test watches a stream the
// page's link is slowed (Chromium's network emulation): the reply then arrives over seconds, in
// reads that split events anywhere.
// Throughout: no request leaves the server's origin, no dialog, no console error other than
// Chromium's "Failed to load resource" lines for the statuses the test provokes.
// Prints `ok - ...` / `not ok - ...`; exit 1 on any failure, or when node_modules, chromium or
// the model is missing (with the command that fixes it). Leaves no process: the servers get
// SIGTERM at the end (and through setpriv's parent-death signal if this process is killed), and
// the check at the end looks for anything under this process or naming its temporary folder.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../..');
const BIN = process.argv[2];
const MODEL = process.env.SHARDLM_TEST_MODEL || path.join(ROOT, 'build/stories260K-w4a8.shlm');
const CHROMIUMS = process.env.CHROMIUM ? [process.env.CHROMIUM]
    : ['/usr/lib/chromium/chromium', '/usr/bin/chromium']; // Debian's binary, then its wrapper
const DEADLINE_MS = 85000;
const PROMPT = 'Once upon a time';

let failures = 0;
function check(cond, name, detail) {
    console.log(`${cond ? 'ok' : 'not ok'} - ${name}${!cond && detail !== undefined ? ` (${detail})` : ''}`);
    if (!cond)
        failures++;
    return cond;
}
function fatal(msg) {
    console.log(`not ok - ${msg}`);
    process.exit(1);
}

if (!BIN)
    fatal('usage: node tests/web/test.mjs SHARDLM_BINARY');
if (!fs.existsSync(BIN))
    fatal(`${BIN} does not exist: build it (cmake --build build -j2)`);
if (!fs.existsSync(MODEL))
    fatal(`the test model ${MODEL} is missing: deploy/bootstrap.sh makes it (or set SHARDLM_TEST_MODEL)`);
if (Number(process.versions.node.split('.')[0]) < 20)
    fatal(`node ${process.versions.node} is older than playwright-core 1.65.1 needs: install Node.js 20 or later`);
const CHROMIUM = CHROMIUMS.find((p) => fs.existsSync(p));
if (!CHROMIUM)
    fatal(`no Chromium at ${CHROMIUMS.join(' or ')}: apt-get install -y chromium`);
let chromium;
try {
    ({ chromium } = await import(path.join(HERE, 'node_modules/playwright-core/index.mjs')));
} catch (e) {
    fatal(`playwright-core is not installed: npm ci --prefix ${HERE} (${e.code || e.message})`);
}

// ---- processes

/* The pids of @pid's descendants now, from /proc. */
function descendants(pid) {
    const kids = new Map();
    for (const d of fs.readdirSync('/proc')) {
        if (!/^\d+$/.test(d))
            continue;
        try {
            const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
            const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
            if (!kids.has(ppid))
                kids.set(ppid, []);
            kids.get(ppid).push(Number(d));
        } catch { /* gone meanwhile */ }
    }
    const out = [], todo = [pid];
    while (todo.length)
        for (const k of kids.get(todo.pop()) || [])
            out.push(k), todo.push(k);
    return out;
}
/* The pids of the processes whose command line names @dir. */
function naming(dir) {
    const out = [];
    for (const d of fs.readdirSync('/proc')) {
        try {
            if (/^\d+$/.test(d) && fs.readFileSync(`/proc/${d}/cmdline`, 'utf8').includes(dir))
                out.push(Number(d));
        } catch { /* gone meanwhile */ }
    }
    return out;
}
/* Whether @pid is a process that has not yet been reaped and is not a zombie. */
function running(pid) {
    try {
        const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
    } catch {
        return false;
    }
}

/* every process seen under this one (chromium's, the servers' and their workers') */
const seen = new Set();
const snap = () => descendants(process.pid).concat(naming(TMP)).forEach((p) => seen.add(p));

/* the servers started, for the cleanup on an early exit; a private folder for the test's files
 * and Chromium's config and cache (its crash handlers, which detach, name it: so they are found) */
const servers = new Set();
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlm-web-'));
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));
const opts = (rt) => ({ env: { ...process.env, SHARDLM_RUNTIME_DIR: rt }, stdio: ['ignore', 'ignore', 'pipe'] });
function cleanup() {
    for (const srv of servers) {
        if (!srv.exited)
            try { srv.proc.kill('SIGKILL'); } catch { /* gone */ }
        fs.rmSync(srv.rt, { recursive: true, force: true });
    }
    fs.rmSync(TMP, { recursive: true, force: true });
}
process.on('exit', cleanup);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'])
    process.on(sig, () => { console.log(`not ok - stopped by ${sig}`); process.exit(1); });
process.stdout.on('error', () => {}); /* a closed pipe (| head) is no reason to leave processes */

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* Starts `shardlm serve` on a free port in a private runtime directory; resolves once /health
 * answers 200. */
async function startServer(name, extra) {
    const rt = fs.mkdtempSync('/dev/shm/shardlm-web-');
    const args = [BIN, 'serve', '-m', MODEL, '--port', '0', ...extra];
    // setpriv (util-linux) execs the server with a SIGTERM for when this process dies
    const proc = SETPRIV ? spawn(SETPRIV, ['--pdeathsig', 'TERM', '--', ...args], opts(rt))
                         : spawn(args[0], args.slice(1), opts(rt));
    const srv = { name, proc, rt, log: '', exited: null, origin: null };
    servers.add(srv);
    srv.exit = new Promise((r) => proc.on('exit', (code, sig) => r((srv.exited = { code, sig }))));
    proc.stderr.setEncoding('utf8');
    srv.origin = await new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`server ${name}: no listening line in 20 s`)), 20000);
        proc.stderr.on('data', (s) => {
            srv.log += s;
            const m = /shardlm: listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(srv.log);
            if (m) {
                clearTimeout(t);
                resolve(m[1]);
            }
        });
        proc.on('exit', () => reject(new Error(`server ${name} exited: ${srv.log.trim()}`)));
    });
    for (let i = 0;; i++) {
        const st = await fetch(srv.origin + '/health').then((r) => r.status, () => 0);
        if (st === 200)
            break;
        if (i > 300 || srv.exited)
            throw new Error(`server ${name}: /health answered ${st}: ${srv.log.trim()}`);
        await sleep(100);
    }
    return srv;
}

/* SIGTERM, then the exit status; the runtime directory goes in any case. */
async function stopServer(srv) {
    if (!srv.exited)
        srv.proc.kill('SIGTERM');
    const r = await Promise.race([srv.exit, sleep(15000).then(() => null)]);
    if (!r)
        srv.proc.kill('SIGKILL');
    fs.rmSync(srv.rt, { recursive: true, force: true });
    return r;
}

// ---- the page

/* A page on @srv that records what it requests, its console errors and dialogs. */
async function openPage(browser, srv) {
    const context = await browser.newContext();
    const page = await context.newPage();
    const rec = { foreign: [], requests: [], console: [], dialogs: [] };
    page.on('request', (r) => {
        const u = r.url();
        if (!u.startsWith(srv.origin + '/') && !u.startsWith('data:'))
            rec.foreign.push(u);
        rec.requests.push(r);
    });
    page.on('console', (m) => m.type() === 'error' && rec.console.push(m.text()));
    page.on('pageerror', (e) => rec.console.push('uncaught: ' + e.message));
    page.on('dialog', (d) => { rec.dialogs.push(d.message()); d.dismiss().catch(() => {}); });
    return { context, page, rec };
}

const REPLY = '#messages .msg.assistant:last-child .text';
const replyLen = (page) => page.$eval(REPLY, (e) => e.textContent.length).catch(() => -1);
const idle = (page, timeout = 60000) =>
    page.waitForFunction(() => !document.getElementById('send').disabled &&
        document.getElementById('stop').disabled, null, { timeout });

async function setSettings(page, maxTokens) {
    if (!await page.$eval('#settings', (d) => d.open))
        await page.click('#settings summary');
    await page.fill('#max-tokens', String(maxTokens));
}

/* Emulates a slow link (bytes per second; 0: none), so a reply of the tiny model, which the
 * server writes in a fraction of a second, reaches the page over seconds. */
const cdps = new WeakMap(); /* a page's CDP session: detaching it would end the emulation */
async function throttle(page, bps) {
    if (!cdps.has(page)) {
        cdps.set(page, await page.context().newCDPSession(page));
        await cdps.get(page).send('Network.enable');
    }
    await cdps.get(page).send('Network.emulateNetworkConditions', {
        offline: false, latency: 0,
        downloadThroughput: bps || -1, uploadThroughput: -1,
    });
}

function statsOk(name, text) {
    const m = /([\d.]+) tok\/s/.exec(text);
    check(m && Number(m[1]) > 0 && /first token \d+ ms/.test(text), `${name}: #stats shows tokens per second and time to first token`, JSON.stringify(text));
}

/* The console errors not explained by @allowed (Chromium's lines for provoked statuses). */
function stray(rec, allowed) {
    return rec.console.filter((t) => !allowed.some((re) => re.test(t)));
}

// ---- A: no chat template

async function testFallback(browser) {
    const srv = await startServer('A', []);
    const { context, page, rec } = await openPage(browser, srv);
    try {
        const res = await page.goto(srv.origin + '/');
        check(res.status() === 200 && /default-src 'none'/.test(res.headers()['content-security-policy'] || ''),
            'A: GET / is the page, with its Content-Security-Policy');
        const file = path.join(ROOT, 'coordinator/server/page/index.html');
        check(await res.text() === fs.readFileSync(file, 'utf8'), `A: GET / is ${path.relative(ROOT, file)} (the binary is built from it)`);
        const model = path.basename(MODEL);
        await page.waitForFunction((m) => document.getElementById('model').textContent === m, model, { timeout: 10000 })
            .catch(() => {});
        check(await page.textContent('#model') === model, 'A: the header names the model from /v1/models', await page.textContent('#model'));

        // a reply that streams: sampled twice while it grows (the link slowed to ~16 KB/s); at
        // temperature 0 the tiny model writes 241 tokens before its EOS, so 200 run to the end
        await setSettings(page, 200);
        await page.fill('#temperature', '0');
        await throttle(page, 16384);
        await page.fill('#prompt', PROMPT);
        await page.click('#send');
        await page.waitForFunction((sel) => (document.querySelector(sel)?.textContent.length || 0) > 0,
            REPLY, { timeout: 20000, polling: 10 });
        const s1 = await replyLen(page);
        const busy1 = await page.$eval('#stop', (b) => !b.disabled);
        await page.waitForFunction(([sel, n]) => document.querySelector(sel).textContent.length > n,
            [REPLY, s1], { timeout: 20000, polling: 10 });
        const s2 = await replyLen(page);
        const busy2 = await page.$eval('#stop', (b) => !b.disabled);
        check(s1 > 0 && s2 > s1 && busy1 && busy2, 'A: the reply grows while it streams', `${s1} then ${s2} chars, streaming ${busy1} ${busy2}`);
        await idle(page);
        snap();
        const s3 = await replyLen(page);
        check(s3 >= s2, 'A: the reply ends', `${s3} chars`);
        const st = await page.textContent('#stats');
        statsOk('A', st);
        check(/^200 tokens .*finished: length$/.test(st), 'A: the token count is the usage chunk\'s', JSON.stringify(st));
        const notice = await page.$eval('#notice', (e) => (e.hidden ? '' : e.textContent));
        check(/no chat template/i.test(notice), 'A: the page says it falls back to /v1/completions', notice);
        const posts = rec.requests.filter((r) => r.method() === 'POST');
        const paths = posts.map((r) => new URL(r.url()).pathname);
        check(paths.join(' ') === '/v1/chat/completions /v1/completions', 'A: chat first, then completions', paths.join(' '));
        const body = posts.length === 2 ? posts[1].postDataJSON() : {};
        check(body.prompt === PROMPT && body.stream === true && body.max_tokens === 200 &&
            body.stream_options?.include_usage === true, 'A: the completions request streams the last message with max_tokens and usage', JSON.stringify(body));
        check(await page.$eval(REPLY, (e) => e.children.length === 0), 'A: the reply is text, no elements');

        // Shift+Enter is a newline, Enter sends (now straight to completions)
        await page.fill('#prompt', 'The dog');
        await page.press('#prompt', 'Shift+Enter');
        await page.type('#prompt', 'ran');
        check(await page.inputValue('#prompt') === 'The dog\nran', 'A: Shift+Enter adds a newline', JSON.stringify(await page.inputValue('#prompt')));
        await throttle(page, 0);
        await page.press('#prompt', 'Enter');
        await page.waitForFunction(() => document.getElementById('prompt').value === '', null, { timeout: 5000 }).catch(() => {});
        await idle(page);
        const posts2 = rec.requests.filter((r) => r.method() === 'POST').slice(2);
        check(posts2.length === 1 && new URL(posts2[0].url()).pathname === '/v1/completions' &&
            posts2[0].postDataJSON().prompt === 'The dog\nran', 'A: Enter sends, to completions once it has fallen back',
            posts2.map((r) => r.url()).join(' '));
        check(rec.requests.filter((r) => r.url().endsWith('/chat/completions')).length === 1,
            'A: the fallback is found once, and kept');

        // Stop aborts a long reply (at ~4 KB/s: 500 tokens would take half a minute)
        await setSettings(page, 500);
        await throttle(page, 4096);
        await page.fill('#prompt', PROMPT);
        const t0 = Date.now();
        await page.click('#send');
        await page.waitForFunction((sel) => (document.querySelector(sel)?.textContent.length || 0) > 0,
            REPLY, { timeout: 20000, polling: 10 });
        await page.click('#stop');
        await idle(page, 5000).catch(() => {});
        const stopped = Date.now() - t0;
        const l1 = await replyLen(page);
        await sleep(500);
        const l2 = await replyLen(page);
        const meta = await page.textContent('#stats');
        check(l1 > 0 && l1 === l2 && /stopped/.test(meta) && stopped < 10000 &&
            await page.$eval('#send', (b) => !b.disabled), 'A: Stop aborts a long reply',
            `${l1} then ${l2} chars, ${stopped} ms, stats ${JSON.stringify(meta)}`);
        check(await page.$eval('#error', (e) => e.hidden), 'A: a stop is no error');

        // the server goes on serving
        await throttle(page, 0);
        await setSettings(page, 32);
        await page.fill('#prompt', 'The cat');
        await page.click('#send');
        await idle(page);
        const after = await page.textContent('#stats');
        check(/finished/.test(after) && await replyLen(page) > 0, 'A: a prompt after Stop is answered', JSON.stringify(after));

        check(rec.foreign.length === 0, 'A: no request to another origin', rec.foreign.join(' '));
        const bad = stray(rec, [/status of 400/]);
        check(bad.length === 0 && rec.dialogs.length === 0, 'A: no console errors or dialogs (but the 400 that finds no template)',
            bad.concat(rec.dialogs).join(' | '));
    } finally {
        await context.close();
        const r = await stopServer(srv);
        check(r && r.code === 0, 'A: the server exits 0 on SIGTERM', JSON.stringify(r));
    }
}

// ---- B: a chat template and an API key

async function testChat(browser) {
    const key = 'k-' + Math.random().toString(36).slice(2);
    fs.writeFileSync(path.join(TMP, 'tmpl.jinja'), "{{ bos_token }}{{ messages[-1]['content'] }}");
    fs.writeFileSync(path.join(TMP, 'key'), key + '\n');
    const srv = await startServer('B', ['--chat-template', path.join(TMP, 'tmpl.jinja'),
                                        '--api-key-file', path.join(TMP, 'key')]);
    const { context, page, rec } = await openPage(browser, srv);
    let exited = null;
    try {
        await page.goto(srv.origin + '/');
        await page.waitForFunction(() => !document.getElementById('error').hidden, null, { timeout: 10000 }).catch(() => {});
        const err = await page.$eval('#error', (e) => (e.hidden ? '' : e.textContent));
        check(/^401/.test(err) && await page.$eval('#settings', (d) => d.open), 'B: without the key, 401 in the error line and the settings open', err);
        await page.fill('#key', key);
        await page.press('#key', 'Tab');
        const model = path.basename(MODEL);
        await page.waitForFunction((m) => document.getElementById('model').textContent === m, model, { timeout: 10000 }).catch(() => {});
        check(await page.textContent('#model') === model && await page.$eval('#error', (e) => e.hidden),
            'B: with the key, the model name and no error', await page.textContent('#model'));
        await page.reload();
        await page.waitForFunction((m) => document.getElementById('model').textContent === m, model, { timeout: 10000 }).catch(() => {});
        check(await page.inputValue('#key') === key && await page.textContent('#model') === model,
            'B: the key is kept across a reload (localStorage)');

        // a chat reply, at temperature 0, every change of its text recorded in the page; the
        // link slowed to ~8 KB/s so that it arrives in pieces, events split anywhere
        await setSettings(page, 200);
        await page.fill('#temperature', '0');
        await throttle(page, 8192);
        await page.evaluate(() => {
            window.__lens = [];
            new MutationObserver(() => {
                const e = document.querySelector('#messages .msg.assistant:last-child .text');
                if (e && document.getElementById('send').disabled)
                    window.__lens.push(e.textContent.length);
            }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
        });
        await page.fill('#prompt', PROMPT);
        await page.press('#prompt', 'Enter');
        snap();
        await idle(page);
        const lens = [...new Set(await page.evaluate(() => window.__lens))].filter((n) => n > 0);
        check(lens.length >= 2 && lens.every((n, i) => !i || n > lens[i - 1]), 'B: the chat reply streams in pieces',
            `${lens.length} lengths: ${lens.slice(0, 8).join(' ')}`);
        await throttle(page, 0);
        const whole = await fetch(srv.origin + '/v1/chat/completions', {
            method: 'POST', headers: { Authorization: 'Bearer ' + key },
            body: JSON.stringify({ messages: [{ role: 'user', content: PROMPT }], max_tokens: 200, temperature: 0 }),
        }).then((r) => r.json()).then((j) => j.choices[0].message.content, (e) => e.message);
        const shown = await page.textContent(REPLY);
        check(shown === whole, 'B: the streamed text is the reply the server gives unstreamed',
            `${JSON.stringify(shown.slice(0, 60))} vs ${JSON.stringify(String(whole).slice(0, 60))}`);
        statsOk('B', await page.textContent('#stats'));
        check(/finished/.test(await page.textContent('#stats')), 'B: the reply ends', await page.textContent('#stats'));
        const chats = rec.requests.filter((r) => r.method() === 'POST');
        const c0 = chats[0];
        const b0 = c0 ? c0.postDataJSON() : {};
        const resp = c0 ? await c0.response() : null;
        check(chats.length === 1 && new URL(c0.url()).pathname === '/v1/chat/completions' && resp?.status() === 200 &&
            c0.headers().authorization === 'Bearer ' + key && b0.stream === true && b0.max_tokens === 200 &&
            b0.stream_options?.include_usage === true && JSON.stringify(b0.messages) === JSON.stringify([{ role: 'user', content: PROMPT }]),
            'B: POST /v1/chat/completions with the key, stream, usage and the message', JSON.stringify(b0));
        check(await page.$eval('#notice', (e) => e.hidden), 'B: no fallback notice');

        // the second turn carries the conversation
        await setSettings(page, 16);
        await page.fill('#prompt', 'The end');
        await page.click('#send');
        await idle(page);
        const c1 = rec.requests.filter((r) => r.method() === 'POST')[1];
        const m1 = c1 ? c1.postDataJSON().messages : [];
        check(m1.length === 3 && m1[1].role === 'assistant' && m1[1].content.length > 0 && m1[2].content === 'The end',
            'B: the second request sends the conversation so far', JSON.stringify(m1.map((m) => m.role)));

        check(await page.$$eval('#messages .msg', (e) => e.length) === 4, 'B: four messages in the list');

        // the Max tokens box cleared: the request has no max_tokens, and the chat runs to its end
        // or the context (it was a 400, "plus 512 new tokens exceeds the context")
        await setSettings(page, '');
        await page.fill('#prompt', 'Once more');
        await page.click('#send');
        await idle(page);
        const c2 = rec.requests.filter((r) => r.method() === 'POST')[2];
        const r2 = c2 ? await c2.response() : null;
        const st2 = await page.textContent('#stats');
        check(c2 && !('max_tokens' in c2.postDataJSON()) && r2?.status() === 200 &&
            /finished: (stop|length)/.test(st2) && await page.$eval('#error', (e) => e.hidden),
            'B: with Max tokens cleared, no max_tokens is sent and the reply ends',
            `${JSON.stringify(c2?.postDataJSON())} ${r2?.status()} ${JSON.stringify(st2)}`);
        check(await page.$$eval('#messages .msg', (e) => e.length) === 6, 'B: six messages in the list');
        exited = await stopServer(srv);
        check(exited && exited.code === 0, 'B: the server exits 0 on SIGTERM', JSON.stringify(exited));

        // the server is gone: a visible network error, the message back in the box
        await page.fill('#prompt', 'Hello?');
        await page.click('#send');
        await page.waitForFunction(() => !document.getElementById('error').hidden, null, { timeout: 10000 }).catch(() => {});
        const nerr = await page.$eval('#error', (e) => (e.hidden ? '' : e.textContent));
        check(/network error/i.test(nerr) && await page.inputValue('#prompt') === 'Hello?' &&
            await page.$$eval('#messages .msg', (e) => e.length) === 6, 'B: a network error shows in the error line', nerr);

        check(rec.foreign.length === 0, 'B: no request to another origin', rec.foreign.join(' '));
        const bad = stray(rec, [/status of 401/, /ERR_CONNECTION_REFUSED/]);
        check(bad.length === 0 && rec.dialogs.length === 0, 'B: no console errors or dialogs (but the provoked 401 and refused connection)',
            bad.concat(rec.dialogs).join(' | '));
    } finally {
        await context.close();
        if (!exited)
            await stopServer(srv);
    }
}

// ---- main

const timer = setTimeout(() => {
    console.log(`not ok - the test ran past ${DEADLINE_MS / 1000} s`);
    for (const pid of descendants(process.pid))
        try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
    process.exit(1);
}, DEADLINE_MS);

const t0 = Date.now();
let browser;
try {
    browser = await chromium.launch({
        executablePath: CHROMIUM, args: ['--no-sandbox'], headless: true,
        env: { ...process.env, XDG_CONFIG_HOME: TMP, XDG_CACHE_HOME: TMP },
    });
    check(true, `chromium ${browser.version()} (${CHROMIUM})`);
    snap();
    await testFallback(browser);
    await testChat(browser);
} catch (e) {
    check(false, 'the test ran to its end', e.stack || e.message);
} finally {
    snap();
    if (browser)
        await browser.close().catch(() => {});
}
// every process the browser and the servers started has gone (waited for a little)
for (let i = 0; i < 50 && [...seen].some(running); i++)
    await sleep(100);
snap(); /* what has appeared since, under this process or naming its folder */
const left = [...seen].filter((p) => p !== process.pid && running(p));
check(left.length === 0, 'no process is left (chromium, shardlm, workers)', left.join(' '));
clearTimeout(timer);
console.log(`# ${((Date.now() - t0) / 1000).toFixed(1)} s`);
process.exit(failures ? 1 : 0);
