// SPDX-License-Identifier: MIT
// tests/script_lib.mjs: what the node script tests (tests/openai, tests/tokenizers) share: one
// line per check, `ok - NAME` or `not ok - NAME: WHY` (WHY on one line), counted; the port of a
// `shardlm serve --port 0` they started; their scratch folders; stopping what they started.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const tally = { passed: 0, failed: 0 };

// reports check @name: passed when @why is undefined, else failed for @why
export function report(name, why) {
    if (why === undefined) {
        tally.passed++;
        console.log(`ok - ${name}`);
    } else {
        tally.failed++;
        console.log(`not ok - ${name}: ${String(why).replace(/\s+/g, ' ')}`);
    }
}

// throws @why unless @cond
export function expect(cond, why) {
    if (!cond)
        throw new Error(why);
}

export const show = (v) => JSON.stringify(v);

// Resolves to the port once the `shardlm serve` child @child prints `shardlm: listening on
// http://127.0.0.1:PORT`; rejects if it exits first. @log gets everything it prints.
/* Resolves once GET @base/health answers 200 (the server listens before its model is loaded,
 * answering 503 meanwhile); rejects when @child exits or @ms pass first. */
export async function healthy(base, child, ms = 60_000) {
    const until = Date.now() + ms;
    for (;;) {
        let status = 0;
        try {
            status = (await fetch(`${base}/health`)).status;
        } catch {
            /* not accepting yet */
        }
        if (status === 200)
            return;
        if (child.exitCode !== null)
            throw new Error(`the server exited (${child.exitCode}) before its model was loaded`);
        if (Date.now() > until)
            throw new Error(`GET /health still ${status} after ${ms / 1000} s`);
        await new Promise((r) => setTimeout(r, 50));
    }
}

export function listeningPort(child, log) {
    return new Promise((resolve, reject) => {
        let err = '';
        child.stdout.on('data', (d) => log(String(d)));
        child.stderr.on('data', (d) => {
            log(String(d));
            err += d;
            const m = /shardlm: listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
            if (m)
                resolve(Number(m[1]));
        });
        child.on('error', reject);
        child.on('exit', (code, sig) =>
            reject(new Error(`the server exited (${code ?? sig}) before listening`)));
    });
}

// A scratch folder and a private runtime directory (in /dev/shm where there is one) for a test's
// shardlm processes, named for @name: { tmp, rundir, env } (env: SHARDLM_RUNTIME_DIR set).
export function scratch(name) {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `sl-${name}-`));
    const rundir = fs.existsSync('/dev/shm') ? fs.mkdtempSync(`/dev/shm/sl-${name}-test-`)
                                             : path.join(tmp, 'run');
    return { tmp, rundir, env: { ...process.env, SHARDLM_RUNTIME_DIR: rundir } };
}

// Stops @child, if it still runs: SIGTERM, SIGKILL after @graceMs; resolves once it exited.
export async function stopChild(child, graceMs = 5_000) {
    if (!child || child.exitCode !== null || child.signalCode !== null)
        return;
    const exited = new Promise((r) => child.on('exit', r));
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(t);
}

// The end of a run: @dirs (scratch()'s) removed, @log (a server's output) shown when a check
// failed, the summary line, and the exit status: 0 when every check passed, else 1.
export function endRun(dirs, log) {
    fs.rmSync(dirs.tmp, { recursive: true, force: true });
    fs.rmSync(dirs.rundir, { recursive: true, force: true });
    if (tally.failed && log)
        console.log(`# server output:\n${log.trimEnd().replace(/^/gm, '#   ')}`);
    console.log(`# passed ${tally.passed}, failed ${tally.failed}`);
    process.exit(tally.failed ? 1 : 0);
}

// A run past @ms fails (a check named deadline) and ends through @finish.
export function deadline(ms, finish) {
    setTimeout(() => {
        report('deadline', `the run took over ${ms / 1000} s`);
        finish();
    }, ms).unref();
}
