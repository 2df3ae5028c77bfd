#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// `shardlm serve` driven by a real client, the official `openai` npm package (pinned in
// package-lock.json; `npm ci --prefix tests/openai` installs it). Converts the bundled stories260K
// model to w4a8, starts the server on a free port with an API key and a chat template that renders
// the last message alone after BOS, and checks through the client: chat completions plain and
// streamed, completions plain and streamed, all equal to `shardlm generate`'s greedy text for the
// same prompt; usage; models.list(); a wrong key and a bad parameter as the client's
// AuthenticationError (401) and BadRequestError (400); an unknown model name answered by the
// loaded model; an abort mid-stream, after which the server keeps serving and counts the request
// as cancelled in /metrics; SIGTERM, after which the server exits 0 and its workers are gone.
//
//   node tests/openai/test.mjs SHARDLM_BINARY [MODEL.shlm]
//
// MODEL.shlm: stories260K converted to w4a8 already (ctest's serve_model fixture); without it the
// test converts models/stories260K itself. Each shardlm process runs with its own
// SHARDLM_RUNTIME_DIR (/dev/shm/sl-oai-test-*), removed at the end with the temporary files.
//
// One line per check (`ok - name` / `not ok - name: why`), then a summary. Exit status: 0 when
// every check passed, 1 otherwise (a missing node_modules included: it is a failure, not a skip),
// 2 on a usage error. SHARDLM_SRC names the source tree (default: two folders up from here).

import { spawn, execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, healthy, listeningPort, report, show, tally } from '../script_lib.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SRC = process.env.SHARDLM_SRC || path.resolve(HERE, '..', '..');
const PROMPT = 'Once upon a time';
const N = 40; /* tokens of the compared continuations */
const ABORT_PROMPT = 'Lily'; /* 2 tokens with BOS; greedy, no EOS within 490 */
const CONTEXT = 512; /* stories260K's */
const ABORT_MAX_TOKENS = 480; /* of the context */
const TEMPLATE = "{{ bos_token }}{{ messages[-1]['content'] }}";
const LAYOUT = ['--workers', '1', '--threads', '2']; /* the same for generate and serve */
const API_KEY = 'sk-shardlm-test-' + process.pid;
const DEADLINE_MS = 60_000; /* the whole run; it takes about 2 s */

if (process.argv.length < 3 || process.argv.length > 4) {
    console.error('usage: node tests/openai/test.mjs SHARDLM_BINARY [MODEL.shlm]');
    process.exit(2);
}
const BIN = path.resolve(process.argv[2]);

let finishing = false; /* interrupted or past the deadline: no more checks */
async function check(name, fn) {
    if (finishing)
        return;
    try {
        await fn();
        if (!finishing)
            report(name);
    } catch (e) {
        if (!finishing)
            report(name, e && e.message ? e.message : e);
    }
}

// the client, installed by `npm ci` at the version package-lock.json pins
async function loadClient() {
    const fix = 'run: npm ci --prefix tests/openai';
    let want;
    try {
        const lock = JSON.parse(fs.readFileSync(path.join(HERE, 'package-lock.json'), 'utf8'));
        want = lock.packages['node_modules/openai'].version;
    } catch (e) {
        throw new Error(`tests/openai/package-lock.json: no node_modules/openai version ` +
                        `(${e.message})`);
    }
    let have;
    try {
        const pkg = path.join(HERE, 'node_modules', 'openai', 'package.json');
        have = JSON.parse(fs.readFileSync(pkg, 'utf8')).version;
    } catch {
        throw new Error(`tests/openai/node_modules/openai is missing; ${fix}`);
    }
    if (have !== want)
        throw new Error(`tests/openai/node_modules has openai ${have}, package-lock.json ` +
                        `${want}; ${fix}`);
    return { OpenAI: (await import('openai')).default, version: have };
}

let OpenAI;
try {
    let version;
    ({ OpenAI, version } = await loadClient());
    report(`openai client ${version}`);
} catch (e) {
    report('openai client', e.message);
    console.log(`# passed ${tally.passed}, failed ${tally.failed}`);
    process.exit(1);
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlm-openai-'));
const rundir = fs.existsSync('/dev/shm') ? fs.mkdtempSync('/dev/shm/sl-oai-test-')
                                         : path.join(tmp, 'run');
const env = { ...process.env, SHARDLM_RUNTIME_DIR: rundir };
let server = null;      /* the `shardlm serve` child */
let serverLog = '';     /* its stdout and stderr */
let serverExit = null;  /* Promise of { code, sig } */
const children = new Set(); /* shardlm processes not yet exited */
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function track(child) {
    children.add(child);
    child.on('exit', () => children.delete(child));
    return child;
}

// pids of processes whose command line names the runtime directory: the workers of our shardlm
// processes (--endpoint ipc://RUNDIR/...)
function workersLeft() {
    const pids = [];
    for (const pid of fs.readdirSync('/proc')) {
        if (!/^\d+$/.test(pid) || Number(pid) === process.pid)
            continue;
        try {
            if (fs.readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes(rundir))
                pids.push(Number(pid));
        } catch {
            /* gone */
        }
    }
    return pids;
}

// stops what is still running (SIGTERM, a second one 200 ms later to stop at once, SIGKILL after
// 5 s), waits up to 5 s for the workers to go, and removes the temporary folders
async function cleanup() {
    const until = Date.now() + 5_000;
    for (let i = 0; children.size && Date.now() < until; i++) {
        if (i === 0 || i === 4)
            for (const c of children)
                c.kill('SIGTERM');
        await sleep(50);
    }
    for (const c of children)
        c.kill('SIGKILL');
    let left = workersLeft();
    while (left.length && Date.now() < until + 5_000) {
        await sleep(50);
        left = workersLeft();
    }
    if (left.length) {
        report('cleanup', `processes left on ${rundir}: ${left.join(' ')} (killed)`);
        for (const pid of left)
            try {
                process.kill(pid, 'SIGKILL');
            } catch {
                /* gone */
            }
    }
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.rmSync(rundir, { recursive: true, force: true });
}

async function finish() {
    if (finishing)
        return;
    finishing = true;
    await cleanup();
    if (tally.failed && serverLog)
        console.log(`# server output:\n${serverLog.trimEnd().replace(/^/gm, '#   ')}`);
    console.log(`# passed ${tally.passed}, failed ${tally.failed}`);
    process.exit(tally.failed ? 1 : 0);
}
const watchdog = setTimeout(() => {
    report('deadline', `the run took over ${DEADLINE_MS / 1000} s`);
    finish();
}, DEADLINE_MS);
for (const sig of ['SIGINT', 'SIGTERM'])
    process.on(sig, () => {
        report('interrupted', sig);
        finish();
    });

function run(args, timeoutMs) {
    return new Promise((resolve, reject) => {
        track(execFile(BIN, args, { env, timeout: timeoutMs, maxBuffer: 1 << 24 },
                       (err, stdout, stderr) => {
            if (err)
                reject(new Error(`shardlm ${args[0]}: ${err.message} ${stderr}`));
            else
                resolve(stdout);
        }));
    });
}

// starts the server; resolves to its port once it prints `shardlm: listening on http://...`
function startServer(model, keyFile, templateFile) {
    return new Promise((resolve, reject) => {
        server = track(spawn(BIN, ['serve', '-m', model, '--port', '0', '--api-key-file', keyFile,
                             '--chat-template', templateFile, ...LAYOUT],
                             { env, stdio: ['ignore', 'pipe', 'pipe'] }));
        serverExit = new Promise((res) => server.on('exit', (code, sig) => res({ code, sig })));
        listeningPort(server, (d) => (serverLog += d)).then(resolve, reject);
    });
}

async function waitHealthy(base) {
    await healthy(base, server, 30_000);
}

// shardlm_requests_total by finish reason, their sum (all) and shardlm_generation_tokens_total
// (tokens), from /metrics
async function finishCounts(base) {
    const text = await (await fetch(`${base}/metrics`)).text();
    const counts = { all: 0 };
    for (const m of text.matchAll(/^shardlm_requests_total\{finish="(\w+)"\} (\d+)$/gm)) {
        counts[m[1]] = Number(m[2]);
        counts.all += Number(m[2]);
    }
    expect('cancelled' in counts, 'no shardlm_requests_total{finish="cancelled"} in /metrics');
    const t = /^shardlm_generation_tokens_total (\d+)$/m.exec(text);
    expect(t, 'no shardlm_generation_tokens_total in /metrics');
    counts.tokens = Number(t[1]);
    return counts;
}

// the text and usage of a streamed chat completion, with the shape of its chunks checked
async function chatStream(client, params) {
    const stream = await client.chat.completions.create({ ...params, stream: true });
    let text = '';
    let tokenChunks = 0;
    let finishReason = null;
    let usage = null;
    let index = 0;
    for await (const chunk of stream) {
        expect(chunk.object === 'chat.completion.chunk',
               `chunk ${index}: object ${show(chunk.object)}`);
        expect(!usage, `chunk ${index} after the usage chunk: ${show(chunk)}`);
        if (chunk.usage) {
            expect(chunk.choices.length === 0, `usage chunk with choices: ${show(chunk)}`);
            usage = chunk.usage;
            index++;
            continue;
        }
        expect(chunk.choices.length === 1, `chunk ${index}: ${chunk.choices.length} choices`);
        const choice = chunk.choices[0];
        expect(finishReason === null, `chunk ${index} after the finish_reason: ${show(chunk)}`);
        if (index === 0)
            expect(choice.delta.role === 'assistant', `first chunk without role: ${show(chunk)}`);
        else
            expect(choice.delta.role === undefined,
                   `chunk ${index} repeats the role: ${show(chunk)}`);
        if (choice.delta.content) {
            text += choice.delta.content;
            tokenChunks++;
        }
        finishReason = choice.finish_reason ?? null;
        index++;
    }
    return { text, tokenChunks, finishReason, usage };
}

async function completionStream(client, params) {
    const stream = await client.completions.create({ ...params, stream: true });
    let text = '';
    let tokenChunks = 0;
    let finishReason = null;
    let usage = null;
    let index = 0;
    for await (const chunk of stream) {
        expect(chunk.object === 'text_completion', `chunk ${index}: object ${show(chunk.object)}`);
        expect(!usage, `chunk ${index} after the usage chunk: ${show(chunk)}`);
        if (chunk.usage) {
            expect(chunk.choices.length === 0, `usage chunk with choices: ${show(chunk)}`);
            usage = chunk.usage;
            index++;
            continue;
        }
        expect(chunk.choices.length === 1, `chunk ${index}: ${chunk.choices.length} choices`);
        expect(finishReason === null, `chunk ${index} after the finish_reason: ${show(chunk)}`);
        const choice = chunk.choices[0];
        if (choice.text) {
            text += choice.text;
            tokenChunks++;
        }
        finishReason = choice.finish_reason ?? null;
        index++;
    }
    return { text, tokenChunks, finishReason, usage };
}

// Streams a chat completion and aborts it after its first chunk; checks what the client does (the
// iteration ends, quietly in openai 7, with APIUserAbortError in earlier versions) and waits up to
// 10 s for the server to end the request. Returns { err } (the client misbehaved) or { delta }, the
// change of finishCounts(), and the tokens the aborted request generated.
async function abortOnce(client, base, params) {
    try {
        const before = await finishCounts(base);
        const ac = new AbortController();
        const stream = await client.chat.completions.create({ ...params, stream: true },
                                                            { signal: ac.signal });
        let chunks = 0;
        let finishReason = null;
        let err = null;
        try {
            for await (const chunk of stream) {
                chunks++;
                finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
                if (chunks === 1)
                    ac.abort();
            }
        } catch (e) {
            err = e;
        }
        expect(!err || err instanceof OpenAI.APIUserAbortError,
               `the iteration threw ${err?.constructor?.name}: ${err?.message}`);
        expect(chunks === 1, `${chunks} chunks after the abort`);
        expect(finishReason === null, `finish_reason ${show(finishReason)} after the abort`);
        expect(stream.controller.signal.aborted, 'the stream is not aborted');

        const until = Date.now() + 10_000;
        let now;
        for (;;) {
            now = await finishCounts(base);
            if (now.all > before.all || Date.now() > until)
                break;
            await sleep(20);
        }
        const delta = {};
        for (const k of Object.keys(now))
            if (k !== 'tokens')
                delta[k] = now[k] - before[k];
        return { delta, tokens: now.tokens - before.tokens };
    } catch (e) {
        return { err: e };
    }
}

function expectUsage(usage, want) {
    expect(usage, 'no usage');
    expect(usage.prompt_tokens === want.prompt_tokens &&
               usage.completion_tokens === want.completion_tokens &&
               usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
           `usage ${show(usage)}, want prompt ${want.prompt_tokens} + completion ` +
               `${want.completion_tokens}`);
}

async function main() {
    await check('binary', () => expect(fs.existsSync(BIN), `${BIN} does not exist`));
    if (tally.failed)
        return;

    let model = process.argv[3] && path.resolve(process.argv[3]);
    if (!model) {
        model = path.join(tmp, 'stories260K-w4a8.shlm');
        const ck = path.join(SRC, 'models', 'stories260K');
        await check('convert stories260K', () =>
            run(['convert', path.join(ck, 'stories260K.bin'), '--tokenizer',
                 path.join(ck, 'tok512.bin'), '--scheme', 'w4a8', '-q', '-o', model], 30_000));
        if (tally.failed)
            return;
    }
    const modelName = path.basename(model);

    // what the server's greedy text must equal: --json gives the continuation without the prompt
    let want;
    await check('shardlm generate', async () => {
        const out = await run(['generate', '-m', model, '-p', PROMPT, '-n', String(N),
                               '--temp', '0', '--json', ...LAYOUT], 30_000);
        want = JSON.parse(out.trim());
        expect(typeof want.text === 'string' && want.text.length > 0, `no text: ${out}`);
        expect(/^[\x20-\x7e\n]*$/.test(want.text), `not ASCII: ${show(want.text)}`);
        expect(want.completion_tokens === N,
               `completion_tokens ${want.completion_tokens}, want ${N}`);
    });
    if (tally.failed)
        return;

    const keyFile = path.join(tmp, 'key');
    fs.writeFileSync(keyFile, API_KEY + '\n');
    const templateFile = path.join(tmp, 'template.jinja');
    fs.writeFileSync(templateFile, TEMPLATE);

    let port;
    await check('serve listens on a free port', async () => {
        port = await startServer(model, keyFile, templateFile);
    });
    if (tally.failed)
        return;
    const base = `http://127.0.0.1:${port}`;
    await check('GET /health 200', () => waitHealthy(base));
    if (tally.failed)
        return;

    const opts = { baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 20_000 };
    const client = new OpenAI(opts);
    const messages = [{ role: 'user', content: PROMPT }];
    const greedy = { model: modelName, temperature: 0, max_tokens: N };

    await check('chat: greedy reply equals shardlm generate', async () => {
        const r = await client.chat.completions.create({ ...greedy, messages });
        expect(r.object === 'chat.completion', `object ${show(r.object)}`);
        expect(r.choices.length === 1, `${r.choices.length} choices`);
        const c = r.choices[0];
        expect(c.message.role === 'assistant', `role ${show(c.message.role)}`);
        expect(c.message.content === want.text,
               `got ${show(c.message.content)}, want ${show(want.text)}`);
        expect(c.finish_reason === want.finish_reason,
               `finish_reason ${show(c.finish_reason)}, want ${show(want.finish_reason)}`);
        expectUsage(r.usage, want);
    });

    await check('chat stream: deltas equal shardlm generate, role first, finish_reason, usage',
                async () => {
        const s = await chatStream(client, { ...greedy, messages,
                                             stream_options: { include_usage: true } });
        expect(s.text === want.text, `got ${show(s.text)}, want ${show(want.text)}`);
        expect(s.finishReason === want.finish_reason,
               `finish_reason ${show(s.finishReason)}, want ${show(want.finish_reason)}`);
        expectUsage(s.usage, want);
        expect(s.usage.completion_tokens === s.tokenChunks,
               `completion_tokens ${s.usage.completion_tokens}, ${s.tokenChunks} token chunks`);
    });

    await check('chat stream without include_usage: no usage chunk', async () => {
        const s = await chatStream(client, { ...greedy, messages, max_tokens: 4 });
        expect(!s.usage, `usage ${show(s.usage)}`);
        expect(s.tokenChunks === 4 && want.text.startsWith(s.text),
               `${s.tokenChunks} chunks ${show(s.text)}`);
        expect(s.finishReason === 'length', `finish_reason ${show(s.finishReason)}`);
    });

    await check('chat logprobs: a token per completion token, top_logprobs as asked', async () => {
        const r = await client.chat.completions.create({ ...greedy, messages, max_tokens: 8,
                                                         logprobs: true, top_logprobs: 3 });
        const lp = r.choices[0].logprobs?.content;
        expect(Array.isArray(lp) && lp.length === 8, `logprobs ${show(r.choices[0].logprobs)}`);
        expect(lp.map((t) => t.token).join('') === r.choices[0].message.content,
               `tokens ${show(lp.map((t) => t.token))} vs ${show(r.choices[0].message.content)}`);
        for (const t of lp) {
            expect(typeof t.logprob === 'number' && t.logprob <= 0, `logprob ${show(t)}`);
            expect(t.top_logprobs.length === 3, `top_logprobs ${show(t.top_logprobs)}`);
            /* greedy: the chosen token is the most likely one */
            expect(t.top_logprobs[0].logprob === t.logprob, `not the top token: ${show(t)}`);
        }
    });

    await check('completions: greedy text equals shardlm generate', async () => {
        const r = await client.completions.create({ ...greedy, prompt: PROMPT });
        expect(r.object === 'text_completion', `object ${show(r.object)}`);
        expect(r.choices.length === 1, `${r.choices.length} choices`);
        expect(r.choices[0].text === want.text,
               `got ${show(r.choices[0].text)}, want ${show(want.text)}`);
        expect(r.choices[0].finish_reason === want.finish_reason,
               `finish_reason ${show(r.choices[0].finish_reason)}`);
        expectUsage(r.usage, want);
    });

    await check('completions stream: text equals shardlm generate, usage', async () => {
        const s = await completionStream(client, { ...greedy, prompt: PROMPT,
                                                   stream_options: { include_usage: true } });
        expect(s.text === want.text, `got ${show(s.text)}, want ${show(want.text)}`);
        expect(s.finishReason === want.finish_reason, `finish_reason ${show(s.finishReason)}`);
        expectUsage(s.usage, want);
        expect(s.usage.completion_tokens === s.tokenChunks,
               `completion_tokens ${s.usage.completion_tokens}, ${s.tokenChunks} token chunks`);
    });

    // A client's defaults: no optional field at all (no max_tokens, temperature or
    // stream_options), as the official clients, LangChain and the AI SDK send unless told. A chat
    // runs to its end (EOS: stop) or to the context (length: prompt and reply fill it; the last
    // token is sampled, never fed, so they count CONTEXT + 1); a completion to OpenAI's legacy
    // default of 16 tokens.
    const bare = { model: modelName };
    const fillsContext = (u) => u.prompt_tokens + u.completion_tokens === CONTEXT + 1;
    await check('chat with no optional field: runs to its end or the context', async () => {
        const r = await client.chat.completions.create({ ...bare, messages });
        const c = r.choices[0];
        expect(c.message.role === 'assistant' && c.message.content.length > 0,
               `message ${show(c.message)}`);
        expect(c.finish_reason === 'stop' || (c.finish_reason === 'length' && fillsContext(r.usage)),
               `finish_reason ${show(c.finish_reason)}, usage ${show(r.usage)}`);
    });
    await check('chat stream with no optional field: runs to its end or the context', async () => {
        const s = await chatStream(client, { ...bare, messages });
        expect(s.text.length > 0 && !s.usage, `text ${show(s.text)}, usage ${show(s.usage)}`);
        expect(s.finishReason === 'stop' ||
                   (s.finishReason === 'length' && s.tokenChunks > 16),
               `finish_reason ${show(s.finishReason)} after ${s.tokenChunks} token chunks`);
    });
    await check('completions with no optional field: 16 tokens at most', async () => {
        const r = await client.completions.create({ ...bare, prompt: PROMPT });
        const c = r.choices[0];
        expect(r.usage.completion_tokens <= 16 && c.text.length > 0,
               `usage ${show(r.usage)}, text ${show(c.text)}`);
        expect(c.finish_reason === (r.usage.completion_tokens === 16 ? 'length' : 'stop'),
               `finish_reason ${show(c.finish_reason)}, usage ${show(r.usage)}`);
    });
    await check('completions stream with no optional field: 16 tokens at most', async () => {
        const s = await completionStream(client, { ...bare, prompt: PROMPT });
        expect(s.text.length > 0 && s.tokenChunks <= 16 && !s.usage,
               `${s.tokenChunks} token chunks, usage ${show(s.usage)}`);
        expect(s.finishReason === 'stop' || s.finishReason === 'length',
               `finish_reason ${show(s.finishReason)}`);
    });
    await check('max_tokens past the context: BadRequestError 400 saying how many fit', async () => {
        let err = null;
        try {
            await client.chat.completions.create({ ...bare, messages, max_tokens: CONTEXT + 8 });
        } catch (e) {
            err = e;
        }
        expect(err instanceof OpenAI.BadRequestError,
               `got ${err ? `${err.constructor.name}: ${err.message}` : 'a reply'}`);
        expect(/exceeds the context of 512; ask for \d+ or fewer/.test(err.message),
               `message ${show(err.message)}`);
    });

    await check('models.list() names the model file', async () => {
        const ids = [];
        for await (const m of client.models.list())
            ids.push(m.id);
        expect(ids.length === 1 && ids[0] === modelName,
               `ids ${show(ids)}, want [${show(modelName)}]`);
    });

    await check('an unknown model name is served by the loaded model', async () => {
        const r = await client.completions.create({ ...greedy, model: 'no-such-model',
                                                    prompt: PROMPT, max_tokens: 4 });
        expect(r.model === modelName, `model ${show(r.model)}, want ${show(modelName)}`);
        expect(want.text.startsWith(r.choices[0].text) && r.choices[0].text.length > 0,
               `text ${show(r.choices[0].text)}`);
    });

    await check('a wrong API key: AuthenticationError 401', async () => {
        const bad = new OpenAI({ ...opts, apiKey: 'sk-wrong' });
        let err = null;
        try {
            await bad.chat.completions.create({ ...greedy, messages });
        } catch (e) {
            err = e;
        }
        expect(err instanceof OpenAI.AuthenticationError,
               `got ${err ? `${err.constructor.name}: ${err.message}` : 'a reply'}`);
        expect(err.status === 401, `status ${err.status}`);
        expect(typeof err.error?.message === 'string' && err.error.message.length > 0,
               `error body ${show(err.error)}`);
    });

    await check('temperature 5: BadRequestError 400 naming the parameter', async () => {
        let err = null;
        try {
            await client.chat.completions.create({ ...greedy, messages, temperature: 5 });
        } catch (e) {
            err = e;
        }
        expect(err instanceof OpenAI.BadRequestError,
               `got ${err ? `${err.constructor.name}: ${err.message}` : 'a reply'}`);
        expect(err.status === 400, `status ${err.status}`);
        expect(/temperature/.test(err.message), `message ${show(err.message)}`);
    });

    await check('a bad parameter in a stream: BadRequestError 400 before the first chunk',
                async () => {
        let err = null;
        try {
            await client.completions.create({ ...greedy, prompt: PROMPT, stream: true, top_p: 2 });
        } catch (e) {
            err = e;
        }
        expect(err instanceof OpenAI.BadRequestError,
               `got ${err ? `${err.constructor.name}: ${err.message}` : 'a stream'}`);
        expect(err.status === 400, `status ${err.status}`);
    });

    // The abort: the client closes the connection after the first chunk of a long generation, and
    // the server is to end the request as cancelled. On this model a step takes about 0.1 ms: the
    // server had generated 3 to 46 tokens when it noticed (20 runs on 2 CPUs), but up to 362 when
    // four busy loops shared the CPUs (35 runs). So the abort asks for the most tokens the context
    // leaves, and a request that ran to its end before the server noticed is tried again, twice at
    // most; a server that never notices fails all three.
    let abortErr = null;
    const attempts = [];
    for (let i = 0; i < 3; i++) {
        const r = await abortOnce(client, base, {
            ...greedy, max_tokens: ABORT_MAX_TOKENS,
            messages: [{ role: 'user', content: ABORT_PROMPT }] });
        attempts.push(r);
        if (r.err) {
            abortErr = r.err;
            break;
        }
        if (r.delta.cancelled === 1 || r.delta.all !== 1 || r.delta.length !== 1)
            break; /* cancelled, or an outcome other than the race lost */
    }
    await check('abort mid-stream ends the iteration', () => {
        if (abortErr)
            throw abortErr;
    });

    await check('after the abort the server serves', async () => {
        const r = await client.completions.create({ ...greedy, prompt: PROMPT });
        expect(r.choices[0].text === want.text, `got ${show(r.choices[0].text)}`);
    });

    await check('/metrics counts the aborted request as cancelled', () => {
        expect(!abortErr, 'no abort');
        const said = attempts.map((r) => {
            const ended = Object.keys(r.delta).filter((k) => k !== 'all' && r.delta[k] > 0);
            return `${ended.join('+') || 'still running'} after ${r.tokens} tokens`;
        }).join(', then ');
        console.log(`# the aborted request: ${said}`);
        const last = attempts[attempts.length - 1].delta;
        expect(last.cancelled === 1 && last.all === 1,
               `shardlm_requests_total{finish=...} says ${said}; want cancelled`);
    });

    await check('SIGTERM: the server exits 0, its workers with it', async () => {
        server.kill('SIGTERM');
        const t = setTimeout(() => server.kill('SIGKILL'), 15_000);
        const { code, sig } = await serverExit;
        clearTimeout(t);
        expect(code === 0, `exit ${code ?? sig}`);
        const until = Date.now() + 2_000;
        let left = workersLeft();
        for (; left.length && Date.now() < until; left = workersLeft())
            await sleep(20);
        expect(left.length === 0, `processes left on ${rundir} 2 s after: ${left.join(' ')}`);
    });
}

try {
    await main();
} catch (e) {
    report('unexpected', e.stack || e);
}
clearTimeout(watchdog);
await finish();
