#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// Worker kills under load for tests/load/restarts.sh, on Node's built-in modules (and python3 for
// one client, see HOLD_PY): clients of
// `shardlm serve` and the kills, timed by what the clients see rather than by sleeps. Prints one
// JSON object with every client's ending.
//
//   node killclient.mjs restart --url URL --pid SERVER_PID [--clients 16] [--max-tokens 500]
//                       [--kill-after 50] [--delays-ms 0,5,30]
//       a reference round of --clients greedy streams (ignore_eos: each runs --max-tokens), then
//       the same streams again: once every stream has --kill-after tokens, the server's worker
//       is SIGKILLed, and then each replacement the server starts, as soon as it runs (it is
//       a child of the server exec'd as shardlm-worker), after the next of --delays-ms (one
//       kill per entry: with --restarts N, N - 1 entries leave the last restart standing).
//       Every stream must end with [DONE] and the reference's text.
//   node killclient.mjs lost --url URL --pid SERVER_PID [--clients 16] [--waiting 4]
//                       [--max-tokens 500] [--kill-after 50]
//       a server with --restarts 0: --clients running streams (one of them, logprobs 20, not
//       read, its answer past what its socket holds), --waiting requests queued behind them (half
//       streamed, half not); once every read stream has --kill-after tokens and the unread one's
//       socket is full, the worker is SIGKILLed. Then /health is polled until a request sent
//       after some client had its error answers 503 (or the server is gone), a new completion is
//       sent (expected 503), whether the server still runs is noted, and the unread stream is
//       read. Every client must end with an error: a 500, or an error event and then [DONE].

import http from 'node:http';
import fs from 'node:fs';
import { performance } from 'node:perf_hooks';
import { spawn } from 'node:child_process';
import readline from 'node:readline';

const PROMPTS = [
    'Once upon a time', 'One day, a little girl named Lily', 'Tom and his dog went to the park',
    'The sun was shining and the birds', 'There was a big red ball', 'Sam had a toy car. He',
    'In a small house lived an old cat', 'The little bird wanted to fly', 'Ben saw a big tree with',
    'Once there was a happy frog who', 'Anna liked to draw pictures of', 'A friendly dragon lived',
    'The princess looked at the', 'Every morning, the farmer', 'Tim wanted a cookie, but',
    'The kind old man gave the children',
];

function args(argv) {
    const o = { mode: argv[0], url: null, pid: 0, clients: 16, waiting: 4, maxTokens: 500,
        killAfter: 50, delays: [0, 5, 30], timeoutS: 120 };
    for (let i = 1; i < argv.length; i++) {
        const a = argv[i];
        const v = () => argv[++i];
        if (a === '--url') o.url = v();
        else if (a === '--pid') o.pid = Number(v());
        else if (a === '--clients') o.clients = Number(v());
        else if (a === '--waiting') o.waiting = Number(v());
        else if (a === '--max-tokens') o.maxTokens = Number(v());
        else if (a === '--kill-after') o.killAfter = Number(v());
        else if (a === '--delays-ms') o.delays = v().split(',').filter((x) => x !== '').map(Number);
        else if (a === '--timeout-s') o.timeoutS = Number(v());
        else die(`unknown option '${a}'`);
    }
    if (!['restart', 'lost'].includes(o.mode)) die('the first argument is restart or lost');
    if (!o.url || !o.pid) die('--url and --pid are required');
    return o;
}

function die(msg) {
    process.stderr.write(`killclient: ${msg}\n`);
    process.exit(2);
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

// The server's worker children (pid -> command name); [] once the server is gone.
function workers(pid) {
    const out = new Map();
    let tasks = [];
    try { tasks = fs.readdirSync(`/proc/${pid}/task`); } catch { return out; }
    for (const t of tasks) {
        let kids = '';
        try { kids = fs.readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8'); } catch { continue; }
        for (const c of kids.split(/\s+/).filter(Boolean)) {
            try { out.set(Number(c), fs.readFileSync(`/proc/${c}/comm`, 'utf8').trim()); } catch { /* gone */ }
        }
    }
    return out;
}

// Whether @pid runs (a zombie does not).
function alive(pid) {
    try { return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8')); } catch { return false; }
}

function killPid(pid) {
    try { process.kill(pid, 'SIGKILL'); return true; } catch { return false; }
}

// What feeds the text of a response to @rec (a request's record): a stream's events (rec.tokens
// counts text chunks), else its body; feed.rest() is what is left of an unfinished event.
function feeder(rec, stream) {
    let buf = '';
    const feed = (d) => {
        rec.bytes += d.length;
        if (!stream || rec.status !== 200) { rec.body += d; return; }
        buf += d;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
            const ev = buf.slice(0, k);
            buf = buf.slice(k + 2);
            const line = ev.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
            if (!line) continue;
            if (rec.done) { rec.afterDone = true; continue; }
            if (line === '[DONE]') { rec.done = true; continue; }
            let j;
            try { j = JSON.parse(line); } catch { rec.fault = rec.fault || `bad event ${line.slice(0, 80)}`; continue; }
            if (j.error) {
                rec.errorEvent = j.error.message || JSON.stringify(j.error);
                rec.errorAt = rec.errorAt || performance.now();
                continue;
            }
            if (j.usage) rec.usage = j.usage;
            const c = j.choices && j.choices[0];
            if (!c) continue;
            if (c.finish_reason) rec.finish = c.finish_reason;
            if (c.text) { rec.text += c.text; rec.tokens++; }
        }
    };
    feed.rest = () => buf.trim();
    return feed;
}

const record = () => ({ status: 0, done: false, errorEvent: null, finish: null, text: '', tokens: 0,
    usage: null, body: '', fault: null, afterDone: false, ended: false, bytes: 0 });

// One request; resolves with its record, never rejects. A stream's record fills as events come.
function request(o, body) {
    const rec = record();
    rec.headers = new Promise((resH) => {
        rec.promise = new Promise((resolve) => {
            const end = (fault) => {
                if (rec.ended) return;
                rec.ended = true;
                if (fault && !rec.fault) rec.fault = fault;
                clearTimeout(timer);
                resH();
                resolve(rec);
            };
            const data = JSON.stringify(body);
            const req = http.request(new URL('/v1/completions', o.url), {
                method: 'POST', agent: false,
                headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) },
            }, (res) => {
                rec.status = res.statusCode;
                if (res.statusCode >= 500) rec.errorAt = performance.now();
                resH();
                res.setEncoding('utf8');
                const feed = feeder(rec, body.stream);
                res.on('data', feed);
                res.on('end', () => end(feed.rest() ? 'stream ended inside an event' : null));
                res.on('error', (e) => end(`response: ${e.code || e.message}`));
                res.on('aborted', () => end('aborted'));
            });
            const timer = setTimeout(() => { end(`no end after ${o.timeoutS} s`); req.destroy(); },
                o.timeoutS * 1000);
            req.on('error', (e) => end(`request: ${e.code || e.message}`));
            req.end(data);
        });
    });
    return rec;
}

// The client of the unread stream, in python3: Node cannot shrink a socket's buffers. A 1 KiB
// receive buffer, and 536-byte segments that keep the server's send buffer for it small (Linux
// sizes it by the segment): the server cannot hand it more than some 30 KB, well under what 50
// tokens with 20 alternatives each make. Says {port}, then {status}; reads the body once a line
// comes on stdin, then says {body, fault}.
const HOLD_PY = `
import http.client, json, socket, sys
host, port, body, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
def say(**k):
    print(json.dumps(k), flush=True)
try:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    s.settimeout(timeout)
    s.connect((host, port))
    say(port=s.getsockname()[1])
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.sock = s
    c.request('POST', '/v1/completions', body, {'Content-Type': 'application/json'})
    r = c.getresponse()
    say(status=r.status)
    sys.stdin.readline()
    fault = None
    try:
        b = r.read()
    except http.client.IncompleteRead as e:
        b, fault = e.partial, 'response: incomplete'
    say(body=b.decode('utf-8', 'replace'), fault=fault)
except Exception as e:
    say(fault=f'{type(e).__name__}: {e}')
`;

// The unread stream's request (HOLD_PY): a record as request()'s, with rec.port (the client's
// port) and rec.resume(), which lets it read its response.
function heldRequest(o, body) {
    const rec = record();
    const u = new URL(o.url);
    const child = spawn('python3', ['-c', HOLD_PY, u.hostname, u.port, JSON.stringify(body),
        String(o.timeoutS)], { stdio: ['pipe', 'pipe', 'inherit'] });
    child.stdin.on('error', () => {}); // a client that is gone says so on stdout
    rec.resume = () => child.stdin.end('\n');
    rec.headers = new Promise((resH) => {
        rec.promise = new Promise((resolve) => {
            const end = (fault) => {
                if (rec.ended) return;
                rec.ended = true;
                if (fault && !rec.fault) rec.fault = fault;
                resH();
                resolve(rec);
            };
            const feed = feeder(rec, true);
            readline.createInterface({ input: child.stdout }).on('line', (l) => {
                let m;
                try { m = JSON.parse(l); } catch { end(`unread client: ${l.slice(0, 80)}`); return; }
                if (m.port) rec.port = m.port;
                if (m.status) {
                    rec.status = m.status;
                    if (m.status >= 500) rec.errorAt = performance.now();
                    resH();
                }
                if ('body' in m) {
                    feed(m.body);
                    end(m.fault || (feed.rest() ? 'stream ended inside an event' : null));
                }
                else if (m.fault) end(`unread client: ${m.fault}`);
            });
            child.on('close', (code) => end(`unread client: exit ${code} before its body`));
            child.on('error', (e) => end(`unread client: ${e.message}`));
        });
    });
    return rec;
}

// What the server's socket to client port @port holds unsent or unacknowledged (tx_queue of
// /proc/net/tcp); -1 while there is no such socket.
function txQueue(o, port) {
    const sp = Number(new URL(o.url).port);
    for (const l of fs.readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
        const f = l.trim().split(/\s+/);
        if (f.length > 4 && parseInt(f[1].split(':')[1], 16) === sp &&
            parseInt(f[2].split(':')[1], 16) === port)
            return parseInt(f[4].split(':')[0], 16);
    }
    return -1;
}

function streamBody(o, i, extra = {}) {
    return { prompt: PROMPTS[i % PROMPTS.length], max_tokens: o.maxTokens, temperature: 0,
        ignore_eos: true, stream: true, stream_options: { include_usage: true }, ...extra };
}

async function waitFor(what, cond, ms) {
    const end = Date.now() + ms;
    while (!cond()) {
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
        await sleep(1);
    }
}

// GET @path: {status, body}; status 0 when nothing answered.
function get(o, path, agent = false) {
    return new Promise((resolve) => {
        const req = http.get(new URL(path, o.url), { agent }, (res) => {
            let b = '';
            res.setEncoding('utf8');
            res.on('data', (d) => { b += d; });
            res.on('end', () => resolve({ status: res.statusCode, body: b.trim() }));
            res.on('error', () => resolve({ status: res.statusCode, body: b.trim() }));
        });
        req.setTimeout(5000, () => req.destroy());
        req.on('error', (e) => resolve({ status: 0, body: e.code || e.message }));
    });
}

function metric(text, name) {
    const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
    return m ? Number(m[1]) : NaN;
}

const summary = (r) => ({ status: r.status, done: r.done, error_event: r.errorEvent, finish: r.finish,
    tokens: r.usage ? r.usage.completion_tokens : r.tokens, bytes: r.bytes, fault: r.fault, after_done: r.afterDone,
    body: r.body.slice(0, 200) });

// Kills the worker, then each replacement after the next delay; resolves with the kills.
async function killChain(o, delays, recs) {
    const kills = [];
    const running = [...workers(o.pid).entries()].filter(([, c]) => c === 'shardlm-worker');
    const seen = new Set(running.map(([p]) => p)); // a replacement is a worker not among these
    const open = () => recs.filter((r) => !r.ended).length;
    const first = running[0];
    if (!first) throw new Error('no shardlm-worker child of the server');
    killPid(first[0]);
    kills.push({ pid: first[0], what: 'worker', open_streams: open() });
    for (const d of delays) {
        let pid = 0;
        await waitFor('a replacement worker', () => {
            if (!alive(o.pid)) throw new Error(`the server exited after ${kills.length} kill(s)`);
            for (const [p, c] of workers(o.pid))
                if (!seen.has(p) && c === 'shardlm-worker') { pid = p; return true; }
            return false;
        }, 30000);
        seen.add(pid);
        if (d) await sleep(d);
        const hit = killPid(pid);
        kills.push({ pid, what: `replacement after ${d} ms`, killed: hit, open_streams: open() });
    }
    return kills;
}

async function restart(o) {
    const out = { mode: 'restart' };
    const ref = [];
    for (let i = 0; i < o.clients; i++) ref.push(request(o, streamBody(o, i)));
    await Promise.all(ref.map((r) => r.promise));
    out.reference = ref.map(summary);
    const recs = [];
    for (let i = 0; i < o.clients; i++) recs.push(request(o, streamBody(o, i)));
    await waitFor(`${o.killAfter} tokens in every stream`,
        () => recs.every((r) => r.tokens >= o.killAfter || r.ended), 60000);
    out.tokens_at_kill = recs.map((r) => r.tokens);
    out.kills = await killChain(o, o.delays, recs);
    await Promise.all(recs.map((r) => r.promise));
    out.clients = recs.map((r, i) => ({ ...summary(r), same_text: r.text === ref[i].text,
        text_len: r.text.length, ref_len: ref[i].text.length }));
    out.workers_after = [...workers(o.pid).entries()].map(([p, c]) => `${p} ${c}`);
    out.health_after = await get(o, '/health');
    return out;
}

async function lost(o) {
    const out = { mode: 'lost' };
    // the unread stream first, so that it runs: its 20 alternatives a token fill its socket
    const slow = heldRequest(o, streamBody(o, 0, { logprobs: 20 }));
    await slow.headers;
    if (slow.status !== 200) throw new Error(`the unread stream: ${slow.status} ${slow.fault || slow.body}`);
    const recs = [];
    for (let i = 1; i < o.clients; i++) recs.push(request(o, streamBody(o, i)));
    await Promise.all(recs.map((r) => r.headers));
    const queued = [];
    for (let i = 0; i < o.waiting; i++)
        queued.push(request(o, i % 2 ? { ...streamBody(o, i), stream: false } : streamBody(o, i)));
    let m = ''; // the queue as /metrics has it after the next step
    for (let t = 0; t < 3000; t++) {
        m = (await get(o, '/metrics')).body;
        if (metric(m, 'shardlm_requests_running') === o.clients &&
            metric(m, 'shardlm_requests_waiting') === o.waiting) break;
        await sleep(5);
    }
    out.running = metric(m, 'shardlm_requests_running');
    out.waiting = metric(m, 'shardlm_requests_waiting');
    await waitFor(`${o.killAfter} tokens in every read stream`,
        () => recs.every((r) => r.tokens >= o.killAfter || r.ended), 60000);
    // After the loss the server lives on only while some answer is not all written (up to 5 s):
    // the unread stream's must not fit in its socket, or the server could be gone before /health
    // and a new request see the loss. It does not fit once what the server's socket holds for it
    // stays the same while the read streams get 10 more tokens (each step adds to it while it
    // can take more).
    let held = -1, from = 0;
    await waitFor('the unread stream to fill its socket', () => {
        const now = txQueue(o, slow.port), least = Math.min(...recs.map((r) => r.tokens));
        if (now <= 0 || now !== held) {
            held = now;
            from = least;
            return false;
        }
        return least >= from + 10;
    }, 60000);
    out.unread_held_bytes = held;
    const all = [slow, ...recs, ...queued];
    out.kills = await killChain(o, [], all);
    // /health, as often as one connection allows, until a request sent after some client had
    // its error answers 503 (or anything else than 200 or 503 comes: the server is gone); a 200
    // to such a request would be a lie
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    let h = { status: 200 };
    out.health_200_after_error = 0;
    out.health_503_after_error = false;
    const t0 = Date.now();
    while ([200, 503].includes(h.status) && Date.now() - t0 < 30000) {
        const sent = performance.now();
        h = await get(o, '/health', agent);
        const after = sent > Math.min(...all.map((r) => r.errorAt || Infinity));
        if (h.status === 200 && after) out.health_200_after_error++;
        if (h.status === 503 && after) {
            out.health_503_after_error = true;
            break;
        }
        if (h.status === 503) await sleep(1); // no client has its error yet
    }
    agent.destroy();
    out.health = h;
    out.new_request = await new Promise((resolve) => {
        const r = request(o, { prompt: 'Once', max_tokens: 4 });
        r.promise.then(() => resolve({ status: r.status, body: r.body.slice(0, 200), fault: r.fault }));
    });
    // the server waits for the unread stream: it still answers until that is read
    out.health_before_unread = await get(o, '/health');
    slow.resume();
    await Promise.all(all.map((r) => r.promise));
    out.unread = summary(slow);
    out.clients = recs.map(summary);
    out.queued = queued.map(summary);
    return out;
}

const o = args(process.argv.slice(2));
try {
    const out = await (o.mode === 'restart' ? restart(o) : lost(o));
    process.stdout.write(JSON.stringify(out) + '\n');
} catch (e) {
    process.stdout.write(JSON.stringify({ mode: o.mode, failed: e.message }) + '\n');
    process.exit(1);
}
