#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// A bounded load generator for `shardlm serve`: N clients, each sending its next streaming
// /v1/completions request when the previous one ends, until --requests have been sent.
// Records per request the status, time to first token, inter-token gaps, tokens (from the usage
// chunk) and errors; samples the server's resident memory (itself and its worker children) and
// its open descriptors while it runs. Node's built-in modules only.
//
//   node tests/load/loadgen.mjs --url http://127.0.0.1:8080 --clients 64 --requests 2000 \
//        [--max-tokens 32] [--prompt-file F] [--pid SERVER_PID] [--json]
//
// Exit status: 0 when every request ended as expected (200 with [DONE] and usage, or 429),
// 1 on any other outcome, 2 on a usage error.

import http from 'node:http';
import fs from 'node:fs';
import { performance } from 'node:perf_hooks';

const USAGE = `usage: node loadgen.mjs --url URL [--clients 64] [--requests 2000] [--max-tokens 32]
                      [--temperature 0.8] [--prompt-file F] [--pid SERVER_PID] [--json]
                      [--timeout S] [--sample-ms 500] [--settle-ms 1000] [--api-key K]
                      [--duration S] [--drain-ok] [--no-keepalive] [--quiet]
  --url URL         the server (http://127.0.0.1:PORT)
  --clients N       concurrent clients, each one request at a time (default 64)
  --requests N      requests sent in all, 429s included (default 2000)
  --max-tokens N    max_tokens of each request (default 32; each request varies it by -25%..0)
  --prompt-file F   prompts, one a line (default: built-in ones)
  --pid PID         the server's pid: sample its RSS (with its children's) and open fds
  --duration S      send no new request after S seconds (default: none)
  --timeout S       a request not ended after S seconds is an error (default 120)
  --sample-ms MS    how often to sample the server (default 500)
  --settle-ms MS    wait after the last request before the end sample (default 1000)
  --drain-ok        the server is being stopped: a 503 or a refused/reset connection before a
                    response ends that client quietly (counted as drained, not an error)
  --no-keepalive    one connection per request
  --json            print one JSON object instead of the summary
  --quiet           no progress line on stderr`;

const BUILTIN_PROMPTS = [
    'Once upon a time',
    'One day, a little girl named Lily',
    'Tom and his dog went to the park',
    'The sun was shining and the birds',
    'There was a big red ball',
    'Sam had a toy car. He',
    'In a small house lived an old cat',
    'The little bird wanted to fly',
    'Mom said, "Let\'s go',
    'Ben saw a big tree with',
    'Once there was a happy frog who',
    'Anna liked to draw pictures of',
    'The boy found a shiny stone in the',
    'It was a cold day and the snow',
    'Lucy and Max played with their',
    'A friendly dragon lived',
    'The princess looked at the',
    'Every morning, the farmer',
    'Tim wanted a cookie, but',
    'The kind old man gave the children',
    'Once upon a time, there was a little boy named Tim. Tim liked to play with his ball. One day,',
    'Sara went to the beach with her mom and dad. They built a big sand castle and',
    'The cat and the dog were friends. They liked to run and jump together in the garden. But one day',
    'Jack had a red kite. He took it to the hill on a windy day and',
];

function parseArgs(argv) {
    const o = {
        url: null, clients: 64, requests: 2000, maxTokens: 32, temperature: 0.8, promptFile: null,
        pid: 0, json: false, timeout: 120, sampleMs: 500, settleMs: 1000, apiKey: null,
        drainOk: false, keepAlive: true, quiet: false, duration: 0,
    };
    const num = (i, name) => {
        const v = Number(argv[i]);
        if (argv[i] === undefined || !Number.isFinite(v) || v < 0)
            die(`${name}: expected a number, got '${argv[i] ?? ''}'`);
        return v;
    };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        switch (a) {
        case '--url': o.url = argv[++i]; break;
        case '--clients': o.clients = num(++i, a); break;
        case '--requests': o.requests = num(++i, a); break;
        case '--max-tokens': o.maxTokens = num(++i, a); break;
        case '--temperature': o.temperature = num(++i, a); break;
        case '--prompt-file': o.promptFile = argv[++i]; break;
        case '--pid': o.pid = num(++i, a); break;
        case '--timeout': o.timeout = num(++i, a); break;
        case '--duration': o.duration = num(++i, a); break;
        case '--sample-ms': o.sampleMs = num(++i, a); break;
        case '--settle-ms': o.settleMs = num(++i, a); break;
        case '--api-key': o.apiKey = argv[++i]; break;
        case '--drain-ok': o.drainOk = true; break;
        case '--no-keepalive': o.keepAlive = false; break;
        case '--json': o.json = true; break;
        case '--quiet': o.quiet = true; break;
        case '-h': case '--help': process.stdout.write(USAGE + '\n'); process.exit(0);
        default: die(`unknown option '${a}'`);
        }
    }
    if (!o.url) die('--url is required');
    if (o.clients < 1 || o.requests < 1 || o.maxTokens < 1) die('--clients, --requests and --max-tokens must be at least 1');
    return o;
}

function die(msg) {
    process.stderr.write(`loadgen: ${msg}\n${USAGE}\n`);
    process.exit(2);
}

// ---- the server's resident memory and descriptors, from /proc ----

function readRssKb(pid) {
    try {
        const m = /VmRSS:\s+(\d+)\s+kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
        return m ? Number(m[1]) : 0;
    } catch { return 0; }
}

function children(pid) {
    const out = [];
    let tasks = [];
    try { tasks = fs.readdirSync(`/proc/${pid}/task`); } catch { return out; }
    for (const t of tasks) {
        try {
            for (const c of fs.readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').split(/\s+/))
                if (c) out.push(Number(c));
        } catch { /* the thread ended */ }
    }
    return out;
}

function countFds(pid) {
    try { return fs.readdirSync(`/proc/${pid}/fd`).length; } catch { return -1; }
}

// One sample: RSS of the server and all its descendants (kB), the server's fds, the fds of its
// descendants, and how many processes there were.
function sample(pid, t0) {
    let rss = 0, childFds = 0, procs = 0;
    const todo = [pid];
    while (todo.length) {
        const p = todo.pop();
        rss += readRssKb(p);
        procs++;
        if (p !== pid) childFds += Math.max(0, countFds(p));
        todo.push(...children(p));
    }
    return { t: (performance.now() - t0) / 1000, rssKb: rss, fds: countFds(pid), childFds, procs };
}

// ---- statistics ----

function percentile(sorted, q) {
    if (!sorted.length) return null;
    const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
    return sorted[i];
}

// ---- one streaming request ----

// Sends one request and resolves with its record; never rejects.
function oneRequest(o, agent, body, reqTimeoutMs) {
    return new Promise((resolve) => {
        const rec = {
            status: 0, ttftMs: null, gapsMs: [], tokens: 0, promptTokens: 0, chunks: 0,
            finish: null, done: false, error: null, drained: false, ms: 0,
        };
        const t0 = performance.now();
        let lastTok = 0, settled = false, buf = '', errBody = '';
        const finish = (err) => {
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            rec.ms = performance.now() - t0;
            rec.endMs = performance.now() - o.t0;
            if (err && !rec.error) rec.error = err;
            resolve(rec);
        };
        const url = new URL('/v1/completions', o.url);
        const headers = { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) };
        if (o.apiKey) headers.Authorization = `Bearer ${o.apiKey}`;
        const req = http.request(url, { method: 'POST', agent, headers }, (res) => {
            rec.status = res.statusCode;
            res.setEncoding('utf8');
            if (res.statusCode !== 200) {
                res.on('data', (d) => { if (errBody.length < 300) errBody += d; });
                res.on('end', () => {
                    if (res.statusCode === 503 && o.drainOk) rec.drained = true;
                    else if (res.statusCode !== 429)
                        rec.error = `status ${res.statusCode}: ${errBody.trim().slice(0, 200)}`;
                    finish();
                });
                res.on('error', (e) => finish(`status ${res.statusCode}, then ${e.code || e.message}`));
                return;
            }
            // server-sent events: events end at a blank line; a read can hold part of one
            const onEvent = (ev, now) => {
                const data = ev.split(/\r?\n/).filter((l) => l.startsWith('data:'))
                    .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
                if (!data) return;
                if (rec.done) { rec.error = rec.error || 'data after [DONE]'; return; }
                if (data === '[DONE]') { rec.done = true; return; }
                let j;
                try { j = JSON.parse(data); } catch { rec.error = rec.error || `bad event JSON: ${data.slice(0, 100)}`; return; }
                if (j.error) { rec.error = rec.error || `error event: ${JSON.stringify(j.error).slice(0, 200)}`; return; }
                if (j.usage) { rec.tokens = j.usage.completion_tokens; rec.promptTokens = j.usage.prompt_tokens; }
                const c = j.choices && j.choices[0];
                if (!c) return;
                if (c.finish_reason) rec.finish = c.finish_reason;
                if (c.text === '' && c.finish_reason) return; // the closing chunk carries no token
                rec.chunks++;
                if (rec.ttftMs === null) rec.ttftMs = now - t0;
                else rec.gapsMs.push(now - lastTok);
                lastTok = now;
            };
            res.on('data', (d) => {
                const now = performance.now();
                buf += d;
                let k;
                while ((k = buf.search(/\r?\n\r?\n/)) >= 0) {
                    const ev = buf.slice(0, k);
                    buf = buf.slice(k).replace(/^\r?\n\r?\n/, '');
                    onEvent(ev, now);
                }
            });
            res.on('end', () => {
                if (buf.trim()) rec.error = rec.error || `stream ended inside an event: ${buf.slice(0, 80)}`;
                if (!rec.done) rec.error = rec.error || 'stream ended without data: [DONE]';
                else if (!rec.finish) rec.error = rec.error || 'no finish_reason';
                else if (rec.finish === 'cancelled') rec.error = rec.error || 'finish_reason cancelled';
                else if (!rec.tokens) rec.error = rec.error || 'no usage chunk';
                finish();
            });
            res.on('error', (e) => finish(`stream broken: ${e.code || e.message}`));
            res.on('aborted', () => finish('stream aborted by the server'));
        });
        const timer = setTimeout(() => {
            finish(`no end after ${reqTimeoutMs / 1000} s`);
            req.destroy();
        }, reqTimeoutMs);
        req.on('error', (e) => {
            const code = e.code || e.message;
            if (o.drainOk && !rec.status && ['ECONNREFUSED', 'ECONNRESET', 'EPIPE'].includes(code)) {
                rec.drained = true;
                finish();
            } else if (!rec.status && req.reusedSocket && ['ECONNRESET', 'EPIPE'].includes(code)) {
                // a kept-alive socket the server closed as the request went out (e.g. at its idle
                // deadline): HTTP's own race, which Node's docs say to retry; the caller sends it
                // again once, on a new socket if need be, and counts it
                rec.staleSocket = true;
                finish(`request failed: ${code} on a reused socket`);
            } else {
                finish(rec.status ? `stream broken: ${code}` : `request failed: ${code}`);
            }
        });
        req.end(body);
    });
}

// ---- the run ----

async function main() {
    const o = parseArgs(process.argv.slice(2));
    let prompts = BUILTIN_PROMPTS;
    if (o.promptFile) {
        prompts = fs.readFileSync(o.promptFile, 'utf8').split('\n').filter((l) => l.trim());
        if (!prompts.length) die(`${o.promptFile}: no prompts (expected one a line)`);
    }
    const agent = new http.Agent({ keepAlive: o.keepAlive, maxSockets: o.clients });
    const t0 = performance.now();
    const samples = [];
    if (o.pid) samples.push(sample(o.pid, t0));
    const sampler = o.pid ? setInterval(() => samples.push(sample(o.pid, t0)), o.sampleMs) : null;

    const recs = [];
    let next = 0, ok = 0, n429 = 0, errors = 0, drained = 0, genTokens = 0, staleRetries = 0;
    const errorList = [];
    const progress = (!o.quiet && !o.json && process.stderr.isTTY) ? setInterval(() => {
        process.stderr.write(`\rloadgen: ${recs.length}/${o.requests} ok ${ok} 429 ${n429} errors ${errors}   `);
    }, 1000) : null;

    async function client(id) {
        while (!o.duration || performance.now() - tStart < o.duration * 1000) {
            const i = next++;
            if (i >= o.requests) return;
            const maxTokens = Math.max(1, Math.round(o.maxTokens * (1 - 0.25 * ((i * 7919) % 100) / 100)));
            const body = JSON.stringify({
                prompt: prompts[(i * 31 + id) % prompts.length], max_tokens: maxTokens,
                temperature: o.temperature, seed: i, stream: true,
                stream_options: { include_usage: true },
            });
            let r = await oneRequest(o, agent, body, o.timeout * 1000);
            if (r.staleSocket) {
                staleRetries++;
                r = await oneRequest(o, agent, body, o.timeout * 1000);
            }
            r.index = i;
            recs.push(r);
            if (r.error) {
                errors++;
                if (errorList.length < 20) errorList.push(`request ${i} (client ${id}): ${r.error}`);
            } else if (r.drained) {
                drained++;
                return; // the server stops: this client is done
            } else if (r.status === 429) {
                n429++;
                await new Promise((res) => setTimeout(res, 50 + (i % 50))); // back off a little
            } else {
                ok++;
                genTokens += r.tokens;
            }
        }
    }
    const tStart = performance.now();
    o.t0 = tStart;
    await Promise.all(Array.from({ length: o.clients }, (_, id) => client(id)));
    const wall = (performance.now() - tStart) / 1000;
    if (progress) { clearInterval(progress); process.stderr.write('\n'); }
    agent.destroy(); // our keep-alive connections close before the end sample
    if (sampler) clearInterval(sampler);
    if (o.pid) {
        await new Promise((res) => setTimeout(res, o.settleMs));
        samples.push(sample(o.pid, t0));
    }

    const okRecs = recs.filter((r) => r.status === 200 && !r.error && !r.drained);
    // the longest time without a request ending well, from the start to the last one
    const ends = okRecs.map((r) => r.endMs).sort((a, b) => a - b);
    let maxStall = ends.length ? ends[0] : null;
    for (let k = 1; k < ends.length; k++) maxStall = Math.max(maxStall, ends[k] - ends[k - 1]);
    const ttft = okRecs.map((r) => r.ttftMs).filter((v) => v !== null).sort((a, b) => a - b);
    const itl = okRecs.flatMap((r) => r.gapsMs).sort((a, b) => a - b);
    const mem = o.pid && samples.length ? {
        rss_kb_start: samples[0].rssKb,
        // after the first tenth of the run: threads, arenas and the KV cache have grown to size
        rss_kb_warm: (samples.find((s) => s.t >= wall / 10) || samples[samples.length - 1]).rssKb,
        rss_kb_end: samples[samples.length - 1].rssKb,
        rss_kb_max: Math.max(...samples.map((s) => s.rssKb)),
        fds_start: samples[0].fds,
        fds_end: samples[samples.length - 1].fds,
        fds_max: Math.max(...samples.map((s) => s.fds)),
        child_fds_start: samples[0].childFds,
        child_fds_end: samples[samples.length - 1].childFds,
        procs_start: samples[0].procs,
        procs_end: samples[samples.length - 1].procs,
        samples: samples.map((s) => [Number(s.t.toFixed(2)), s.rssKb, s.fds]),
    } : null;
    const r3 = (v) => (v === null ? null : Number(v.toFixed(3)));
    const out = {
        requests: recs.length, ok, status_429: n429, errors, drained,
        wall_s: r3(wall), generated_tokens: genTokens, tokens_per_s: r3(genTokens / wall),
        requests_per_s: r3(recs.length / wall),
        ttft_ms_p50: r3(percentile(ttft, 0.5)), ttft_ms_p99: r3(percentile(ttft, 0.99)),
        ttft_ms_max: r3(ttft.length ? ttft[ttft.length - 1] : null),
        itl_ms_p50: r3(percentile(itl, 0.5)), itl_ms_p99: r3(percentile(itl, 0.99)),
        itl_ms_max: r3(itl.length ? itl[itl.length - 1] : null),
        max_stall_s: r3(maxStall === null ? null : maxStall / 1000), mem, error_list: errorList,
        stale_socket_retries: staleRetries,
    };
    if (o.json) {
        process.stdout.write(JSON.stringify(out) + '\n');
    } else {
        const f = (v, u = ' ms') => (v === null ? '-' : v.toFixed(1) + u);
        const lines = [
            `requests ${out.requests}: ok ${ok}, 429 ${n429}, errors ${errors}` + (o.drainOk ? `, drained ${drained}` : '') + ` in ${wall.toFixed(1)} s (${out.requests_per_s} req/s)`,
            `generated ${genTokens} tokens: ${out.tokens_per_s.toFixed(1)} tokens/s`,
            `time to first token: p50 ${f(out.ttft_ms_p50)}, p99 ${f(out.ttft_ms_p99)}, max ${f(out.ttft_ms_max)}`,
            `inter-token latency: p50 ${f(out.itl_ms_p50)}, p99 ${f(out.itl_ms_p99)}, max ${f(out.itl_ms_max)}`,
            `longest time without a request ending well: ${f(out.max_stall_s, ' s')}`,
        ];
        if (mem) {
            const mb = (kb) => (kb / 1024).toFixed(1) + ' MiB';
            lines.push(`RSS (server + ${mem.procs_end - 1} worker(s)): start ${mb(mem.rss_kb_start)}, warm ${mb(mem.rss_kb_warm)}, end ${mb(mem.rss_kb_end)}, max ${mb(mem.rss_kb_max)}`);
            lines.push(`server fds: start ${mem.fds_start}, end ${mem.fds_end}, max ${mem.fds_max}; workers' fds: start ${mem.child_fds_start}, end ${mem.child_fds_end}`);
        }
        for (const e of errorList) lines.push(`error: ${e}`);
        process.stdout.write(lines.join('\n') + '\n');
    }
    process.exitCode = errors ? 1 : 0;
}

main().catch((e) => { process.stderr.write(`loadgen: ${e.stack || e}\n`); process.exit(1); });
