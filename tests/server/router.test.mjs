// `peregrine router` in front of real `peregrine serve` replicas (CPU, the embedded model):
// streams and answers come through intact, the policies route as specified, and a replica
// killed under load is ejected and readmitted without a hung request.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, describe, test } from 'node:test';

import nodeHttp from 'node:http';
import { createRequire } from 'node:module';
import path from 'node:path';

import { OpenAI, http, waitFor } from './harness.mjs';

const WebSocket = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'))('ws');

// One completion over /v1/ws: its text, from the chunks up to 'done'.
function wsCompletion(url, request) {
    return new Promise((resolve, reject) => {
        const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/ws`);
        let text = '';
        const timer = setTimeout(() => reject(new Error('no answer over WebSocket in 10 s')), 10000);
        ws.on('open', () => ws.send(JSON.stringify({ id: 'w', type: 'completion', request })));
        ws.on('message', (raw) => {
            const m = JSON.parse(raw.toString());
            if (m.type === 'chunk') text += m.data.choices[0].text ?? '';
            if (m.type === 'error') reject(new Error(JSON.stringify(m.error)));
            if (m.type === 'done') {
                clearTimeout(timer);
                ws.close();
                resolve(text);
            }
        });
        ws.on('error', reject);
    });
}

const binary = process.env.PG_BINARY;
const procs = [];
after(() => procs.forEach((p) => p.exitCode === null && p.kill('SIGKILL')));

// Starts `peregrine <args>`; resolves {proc, url, log} once `ready` matches its stderr.
function start(args, ready) {
    const proc = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    procs.push(proc);
    let log = '';
    return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`not ready in 30 s: ${args.join(' ')}\n${log}`)), 30000);
        proc.stderr.on('data', (d) => {
            log += d;
            const m = log.match(ready);
            if (m) {
                clearTimeout(timer);
                resolve({ proc, url: m[1], log: () => log });
            }
        });
        proc.on('exit', (code) => reject(new Error(`exited ${code}: ${args.join(' ')}\n${log}`)));
    });
}

const replica = (port = 0) =>
    start(['serve', '--port', String(port), '--device', 'cpu', '--threads', '1'],
          /ready: serving '[^']*' at (http:\/\/[^\s]+)\/v1/);
const router = (backends, policy, extra = []) =>
    start(['router', '--port', '0', '--policy', policy, '--health-interval', '0.2',
           ...backends.flatMap((b) => ['--backend', b.url]), ...extra], /ready: routing at (http:\/\/[^\s]+)\/v1/);

const client = (url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });

async function perBackend(routerUrl) {
    const text = (await http(`${routerUrl}/metrics`, { method: 'GET' })).text;
    const counts = {};
    for (const m of text.matchAll(/peregrine_router:requests_total\{backend="([^"]+)"\} (\d+)/g)) counts[m[1]] = +m[2];
    return counts;
}

async function streamText(c, body) {
    const stream = await c.completions.create({ ...body, stream: true });
    let text = '';
    let chunks = 0;
    for await (const ch of stream) {
        text += ch.choices[0]?.text ?? '';
        chunks++;
    }
    return { text, chunks };
}

// The reads a client makes of one streamed completion: a stream passed on as it arrives comes in
// many reads, one held back until a buffer fills comes in one or two.
function streamReads(url, body) {
    return new Promise((resolve, reject) => {
        const req = nodeHttp.request(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } },
            (res) => {
                let reads = 0;
                let text = '';
                res.on('data', (d) => { reads++; text += d; });
                res.on('end', () => resolve({ reads, events: (text.match(/^data: /gm) || []).length }));
            });
        req.on('error', reject);
        req.end(JSON.stringify({ ...body, stream: true }));
    });
}

describe('router', async () => {
    const [a, b] = await Promise.all([replica(), replica()]);

    test('streams and answers as a replica does', async () => {
        const r = await router([a, b], 'round-robin');
        const body = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 30, temperature: 0 };
        const direct = await client(a.url).completions.create(body);
        for (let i = 0; i < 2; i++) {  // both replicas, in turn
            const viaRouter = await client(r.url).completions.create(body);
            assert.equal(viaRouter.choices[0].text, direct.choices[0].text);
            const s = await streamText(client(r.url), body);
            assert.equal(s.text, direct.choices[0].text);
            assert.ok(s.chunks >= 20, `streamed chunk by chunk (${s.chunks} chunks)`);
        }
        // Passed on as the replica sends it, not when a buffer fills: 30 tokens (~6 KB of events)
        // arrive in many reads (the router once read 16 KB upstream before passing anything on).
        const r30 = await streamReads(r.url, body);
        assert.ok(r30.events >= 30 && r30.reads >= 6, `events arrive as they are made: ${JSON.stringify(r30)}`);
        assert.equal(await wsCompletion(r.url, body), direct.choices[0].text, 'WebSocket through the router');
        const chat = await client(r.url).chat.completions.create({
            model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5, temperature: 0 });
        assert.equal(chat.object, 'chat.completion');
        const models = await client(r.url).models.list();
        assert.equal(models.data[0].id, 'stories260K');
        const bad = await http(`${r.url}/v1/completions`, { body: { model: 'stories260K', prompt: 'x', max_tokens: -1 } });
        assert.equal(bad.status, 400);  // the replica's own error, passed on
        // round-robin over 9 requests (5 completions, a WebSocket, a chat, the model list, the bad
        // request): both replicas take a share (the exact turns are the unit tests')
        const split = Object.values(await perBackend(r.url));
        assert.equal(split.reduce((x, y) => x + y, 0), 9);
        assert.ok(split.length === 2 && Math.min(...split) >= 3, `split ${split}`);
        r.proc.kill('SIGTERM');
    });

    test('cache-aware keeps a shared prefix on one replica; sessions stick', async () => {
        const r = await router([a, b], 'cache-aware');
        const system = 'You are a storyteller. '.repeat(12);  // ~280 characters: 4 index chunks
        const before = await perBackend(r.url);
        for (let i = 0; i < 6; i++)
            await client(r.url).completions.create({ model: 'stories260K', prompt: `${system} Tell story ${i}`,
                                                     max_tokens: 4, temperature: 0 });
        const after1 = await perBackend(r.url);
        const moved = Object.keys(after1).map((k) => after1[k] - (before[k] ?? 0));
        assert.deepEqual(moved.sort(), [0, 6], `one replica took the shared prefix: ${moved}`);
        const metrics = (await http(`${r.url}/metrics`, { method: 'GET' })).text;
        assert.match(metrics, /routing_decisions_total\{reason="prefix"\} 5/);
        // Every answer came back: no prefill is left queued at any replica.
        assert.equal([...metrics.matchAll(/^peregrine_router:prefilling\{[^}]*\} 0$/gm)].length, 2, metrics);
        assert.equal([...metrics.matchAll(/^peregrine_router:queued_prefill_chars\{[^}]*\} 0$/gm)].length, 2);
        for (let i = 0; i < 4; i++)
            await client(r.url).completions.create({ model: 'stories260K', prompt: `short ${i}`, max_tokens: 2,
                                                     prompt_cache_key: 'conv-1' });
        assert.match((await http(`${r.url}/metrics`, { method: 'GET' })).text,
                     /routing_decisions_total\{reason="session"\} 4/);
        // The X-Session-ID header (vLLM's router and llm-d) names a session too, and goes on to the
        // replica, which keeps the request's blocks as a conversation's.
        const conversations = async () => {
            let n = 0;
            for (const u of [a.url, b.url]) {
                const m = (await http(`${u}/metrics`, { method: 'GET' })).text;
                n += Number((m.match(/^peregrine:conversation_requests_total\{[^}]*\} (\S+)$/m) ?? [])[1]);
            }
            return n;
        };
        const keyedBefore = await conversations();
        for (let i = 0; i < 3; i++) {
            const x = await http(`${r.url}/v1/completions`, { body: { model: 'stories260K', prompt: `other ${i}`,
                                                                       max_tokens: 2 },
                                                               headers: { 'X-Session-ID': 'conv-2' } });
            assert.equal(x.status, 200, x.text);
        }
        assert.match((await http(`${r.url}/metrics`, { method: 'GET' })).text,
                     /routing_decisions_total\{reason="session"\} 7/);
        assert.equal(await conversations(), keyedBefore + 3);
        r.proc.kill('SIGTERM');
    });

    test('a replica killed under load: ejected, nothing hangs, readmitted after a restart', async () => {
        const c = await replica();
        const port = new URL(c.url).port;
        const r = await router([b, c], 'least-load');
        const body = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 400, temperature: 1,
                       ignore_eos: true };
        const results = Array.from({ length: 8 }, () =>
            streamText(client(r.url), body).then((s) => ({ ok: true, ...s }), (e) => ({ ok: false, error: String(e) })));
        await new Promise((res) => setTimeout(res, 30));
        c.proc.kill('SIGKILL');
        const t0 = Date.now();
        const ejected = await waitFor(async () => {
            const h = (await http(`${r.url}/health`, { method: 'GET' })).json;
            return h.healthy_replicas === 1;
        }, 2000, 20);
        assert.ok(ejected, 'ejected within 2 s');
        console.log(`ejected ${Date.now() - t0} ms after the kill`);
        const settled = await Promise.race([Promise.all(results), new Promise((res) => setTimeout(() => res(null), 20000))]);
        assert.ok(settled, 'every request ended (none hangs)');
        const failed = settled.filter((s) => !s.ok).length;
        console.log(`${settled.length - failed} streams completed, ${failed} ended with an error`);
        for (const s of settled.filter((x) => !x.ok))  // an error event from the router, not a dropped connection
            assert.match(s.error, /failed during the response/, s.error);
        // New requests all go to the live replica.
        for (let i = 0; i < 4; i++) {
            const x = await client(r.url).completions.create({ model: 'stories260K', prompt: 'Hello', max_tokens: 4 });
            assert.equal(x.choices[0].finish_reason, 'length');
        }
        await replica(port);
        const back = await waitFor(async () => (await http(`${r.url}/health`, { method: 'GET' })).json.healthy_replicas === 2,
                                   5000, 50);
        assert.ok(back, 'readmitted after the restart');
        r.proc.kill('SIGTERM');
    });
});

describe('serve --data-parallel-size', () => {
    test('two replicas behind the router; a killed replica is started again', async () => {
        const s = await start(['serve', '--port', '0', '--data-parallel-size', '2', '--device', 'cpu'],
                              /ready: serving '[^']*' at (http:\/\/[^\s]+)\/v1 \(data parallel 2\)/);
        const health = async () => (await http(`${s.url}/health`, { method: 'GET' })).json;
        assert.equal((await health()).healthy_replicas, 2);
        const body = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 };
        const first = await client(s.url).completions.create(body);
        const pids = (await import('node:fs')).readFileSync(`/proc/${s.proc.pid}/task/${s.proc.pid}/children`, 'utf8')
            .trim().split(/\s+/).map(Number);
        assert.equal(pids.length, 2);
        process.kill(pids[0], 'SIGKILL');
        // The replica comes back within a fraction of a second (the embedded model loads fast), so
        // the router may never see it down between two health checks: what must hold is that
        // answers do not change meanwhile, and that it is back under a new pid.
        for (let i = 0; i < 4; i++)
            assert.equal((await client(s.url).completions.create(body)).choices[0].text, first.choices[0].text);
        assert.ok(await waitFor(async () => /replica 0 \(pid \d+\) killed by signal 9; starting it again/.test(s.log()),
                                5000, 20), 'restart logged');
        assert.ok(await waitFor(async () => (await health()).healthy_replicas === 2, 10000, 50), 'restarted');
        // Children of every thread (the restart came from the supervisor thread).
        const fs = await import('node:fs');
        const now = fs.readdirSync(`/proc/${s.proc.pid}/task`)
            .flatMap((t) => fs.readFileSync(`/proc/${s.proc.pid}/task/${t}/children`, 'utf8').trim().split(/\s+/))
            .filter(Boolean).map(Number);
        assert.equal(now.length, 2);
        assert.ok(!now.includes(pids[0]), 'a new process');
        s.proc.kill('SIGTERM');
        const code = await new Promise((res) => s.proc.on('exit', (c) => res(c)));
        assert.equal(code, 0);
    });

    test('two replicas of a tensor-parallel group each give one rank\'s greedy text', async () => {
        const prompts = ['Once upon a time', 'The cat sat on', 'Lily and Ben went', 'One day a big'];
        const body = (prompt) => ({ model: 'stories260K', prompt, max_tokens: 16, temperature: 0 });
        const one = await start(['serve', '--port', '0', '--device', 'cpu', '--threads', '1'],
                                /ready: serving '[^']*' at (http:\/\/[^\s]+)\/v1/);
        const want = [];
        for (const p of prompts) want.push((await client(one.url).completions.create(body(p))).choices[0].text);
        one.proc.kill('SIGTERM');
        await new Promise((res) => one.proc.on('exit', res));

        const s = await start(['serve', '--port', '0', '--data-parallel-size', '2', '--tensor-parallel-size', '2',
                               '--device', 'cpu', '--threads', '1'],
                              /ready: serving '[^']*' at (http:\/\/[^\s]+)\/v1 \(data parallel 2\)/);
        try {
            assert.match(s.log(), /data parallel: 2 replicas of 2 ranks \(CPU, 1 threads a rank\)/);
            assert.equal((await http(`${s.url}/health`, { method: 'GET' })).json.healthy_replicas, 2);
            // Four prompts at once (no shared prefix: the router spreads them by load and footprint).
            const got = await Promise.all(prompts.map((p) => client(s.url).completions.create(body(p))));
            assert.deepEqual(got.map((r) => r.choices[0].text), want);
            const m = (await http(`${s.url}/metrics`, { method: 'GET' })).text;
            const served = [...m.matchAll(/^peregrine_router:requests_total\{[^}]*\} (\S+)$/gm)].map((x) => Number(x[1]));
            assert.equal(served.length, 2, m);
            assert.ok(served.every((n) => n > 0), `both replicas served: ${served}`);
            const groups = s.log().match(/tensor parallel 2 x pipeline parallel 1: 2 ranks/g) ?? [];
            assert.equal(groups.length, 2, s.log());
        } finally {
            s.proc.kill('SIGTERM');
            assert.equal(await new Promise((res) => s.proc.on('exit', (c) => res(c))), 0);
        }
    });
});
