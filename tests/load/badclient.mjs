#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// Misbehaving clients for tests/load/faults.sh, on Node's built-in modules only. Each prints
// one JSON line with what the server did.
//
//   node badclient.mjs trickle --port P [--interval-ms 1000] [--cap-s 45]
//       a request header sent one byte at a time that never ends: how long until the server
//       answers (a 4xx) or closes the connection; {"closed": false} when it was still open at
//       the cap
//   node badclient.mjs slowloris --port P [--conns 1100] [--interval-ms 1000] [--cap-s 45]
//       --conns such trickled headers at once, and GET /health every 2 s meanwhile: the
//       statuses it got (0: no answer), and how many of the connections the server closed
//   node badclient.mjs noread --port P [--hold-s 20] [--max-tokens 500] [--logprobs 20]
//                     [--pipeline 4]
//       --pipeline streaming completions sent at once on one connection whose answers are never
//       read (the socket paused once the status line came; a 429 is tried again for up to
//       10 s): about 240 kB each at 500 tokens with 20 logprobs, more than loopback's socket
//       buffers hold, so the server's writes block; held open --hold-s seconds, then closed
//   node badclient.mjs bigbody --port P [--mb 10] [--chunked]
//       a body of --mb MiB (Content-Length, or chunked without a length): the status

import net from 'node:net';

function args(argv) {
    const o = { cmd: argv[0], port: 0, intervalMs: 1000, capS: 45, holdS: 20, maxTokens: 500, pipeline: 4,
        logprobs: 20, mb: 10, chunked: false, conns: 1100 };
    for (let i = 1; i < argv.length; i++) {
        const a = argv[i];
        const v = () => Number(argv[++i]);
        if (a === '--port') o.port = v();
        else if (a === '--interval-ms') o.intervalMs = v();
        else if (a === '--cap-s') o.capS = v();
        else if (a === '--hold-s') o.holdS = v();
        else if (a === '--max-tokens') o.maxTokens = v();
        else if (a === '--logprobs') o.logprobs = v();
        else if (a === '--mb') o.mb = v();
        else if (a === '--pipeline') o.pipeline = v();
        else if (a === '--chunked') o.chunked = true;
        else if (a === '--conns') o.conns = v();
        else { process.stderr.write(`badclient: unknown option '${a}'\n`); process.exit(2); }
    }
    if (!o.port) { process.stderr.write('badclient: --port is required\n'); process.exit(2); }
    return o;
}

const out = (j) => process.stdout.write(JSON.stringify(j) + '\n');
const statusOf = (s) => { const m = /^HTTP\/1\.[01] (\d{3})/.exec(s); return m ? Number(m[1]) : 0; };

function trickle(o) {
    const head = 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Slow: ';
    const t0 = Date.now();
    let sent = 0, got = '', ended = false;
    const sock = net.connect(o.port, '127.0.0.1');
    const end = (why) => {
        if (ended) return;
        ended = true;
        clearInterval(tick);
        clearTimeout(cap);
        out({ check: 'trickle', closed: why !== 'cap', why, after_s: (Date.now() - t0) / 1000,
            bytes_sent: sent, status: statusOf(got), answer: got.split('\r\n')[0] });
        sock.destroy();
    };
    const tick = setInterval(() => {
        const b = sent < head.length ? head[sent] : 'a'; // the header never ends
        sock.write(b, (e) => { if (e) end(`write failed: ${e.code || e.message}`); });
        sent++;
    }, o.intervalMs);
    const cap = setTimeout(() => end('cap'), o.capS * 1000);
    sock.on('data', (d) => { got += d.toString('latin1'); });
    sock.on('end', () => end('closed by the server'));
    sock.on('close', () => end('closed by the server'));
    sock.on('error', (e) => end(`error: ${e.code || e.message}`));
}

// --conns connections each trickling a header that never ends, a byte per --interval-ms, for
// --cap-s seconds; meanwhile GET /health every 2 s: does the server still answer others?
function slowloris(o) {
    const socks = [];
    let opened = 0, closed = 0;
    const health = [];
    for (let i = 0; i < o.conns; i++) {
        const s = net.connect(o.port, '127.0.0.1');
        s.on('connect', () => { opened++; s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: '); });
        s.on('close', () => { if (!stopping) closed++; });
        s.on('error', () => {});
        socks.push(s);
    }
    let stopping = false;
    const tick = setInterval(() => { for (const s of socks) if (!s.destroyed) s.write('a'); }, o.intervalMs);
    const probe = setInterval(() => {
        const s = net.connect(o.port, '127.0.0.1');
        let got = '';
        const t = setTimeout(() => s.destroy(), 1500);
        s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'));
        s.on('data', (d) => { got += d.toString('latin1'); });
        s.on('close', () => { clearTimeout(t); health.push(statusOf(got)); });
        s.on('error', () => {});
    }, 2000);
    setTimeout(() => {
        stopping = true;
        clearInterval(tick);
        clearInterval(probe);
        out({ check: 'slowloris', conns: o.conns, opened, closed_by_server: closed, cap_s: o.capS,
            health_statuses: health });
        for (const s of socks) s.destroy();
    }, o.capS * 1000);
}

function noread(o) {
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: o.maxTokens,
        logprobs: o.logprobs, stream: true, temperature: 1.0, ignore_eos: true });
    const one = `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    const req = one.repeat(Math.max(1, o.pipeline));
    const t0 = Date.now();
    let tries = 0, heldAt = null, closedEarly = null, sock = null;
    // Reads the status line only: a 429 (a full queue) is tried again on a new connection; on a
    // 200 the socket is paused and nothing more is read
    const attempt = () => {
        tries++;
        let got = '';
        sock = net.connect(o.port, '127.0.0.1');
        sock.on('connect', () => sock.write(req));
        sock.on('data', (d) => {
            if (heldAt !== null) return;
            got += d.toString('latin1');
            if (!got.includes('\r\n')) return;
            if (statusOf(got) === 200) {
                sock.pause();
                heldAt = (Date.now() - t0) / 1000;
                process.stdout.write(`held after ${tries} tries\n`);
                setTimeout(() => {
                    out({ check: 'noread', status: 200, tries, held_s: o.holdS,
                        closed_by_server_after_s: closedEarly });
                    sock.destroy();
                }, o.holdS * 1000);
            } else {
                sock.destroy();
                if (Date.now() - t0 > 10000)
                    out({ check: 'noread', status: statusOf(got), tries, held_s: 0 });
                else
                    setTimeout(attempt, 100);
            }
        });
        sock.on('close', () => {
            if (heldAt !== null && closedEarly === null) closedEarly = (Date.now() - t0) / 1000;
        });
        sock.on('error', () => {});
    };
    attempt();
}

function bigbody(o) {
    const n = o.mb * 1024 * 1024;
    const t0 = Date.now();
    const sock = net.connect(o.port, '127.0.0.1');
    let got = '', done = false, sent = 0;
    const finish = (why) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        out({ check: 'bigbody', chunked: o.chunked, status: statusOf(got), why,
            after_s: (Date.now() - t0) / 1000, bytes_sent: sent, answer: got.split('\r\n')[0] });
        sock.destroy();
    };
    sock.on('connect', () => {
        sock.write('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n' +
            (o.chunked ? 'Transfer-Encoding: chunked\r\n\r\n' : `Content-Length: ${n}\r\n\r\n`));
        const piece = Buffer.alloc(64 * 1024, 'a');
        piece.write('{"prompt": "');
        const pump = () => {
            while (sent < n && !done) {
                const len = Math.min(piece.length, n - sent);
                const p = o.chunked ? Buffer.concat([Buffer.from(len.toString(16) + '\r\n'),
                    piece.subarray(0, len), Buffer.from('\r\n')]) : piece.subarray(0, len);
                sent += len;
                if (!sock.write(p)) { sock.once('drain', pump); return; }
            }
            if (o.chunked && !done) sock.write('0\r\n\r\n');
        };
        pump();
    });
    sock.on('data', (d) => {
        got += d.toString('latin1');
        if (got.includes('\r\n\r\n')) finish('answered');
    });
    sock.on('close', () => finish('closed'));
    sock.on('error', (e) => finish(`error: ${e.code || e.message}`));
    const timer = setTimeout(() => finish('no answer in 30 s'), 30000);
}

const o = args(process.argv.slice(2));
if (o.cmd === 'trickle') trickle(o);
else if (o.cmd === 'noread') noread(o);
else if (o.cmd === 'bigbody') bigbody(o);
else if (o.cmd === 'slowloris') slowloris(o);
else { process.stderr.write('usage: badclient.mjs trickle|slowloris|noread|bigbody --port P [options]\n'); process.exit(2); }
