// Reliability, part 1: every case of the hostile corpora (tests/server/hostile/{rest,ws,grpc}.jsonl)
// against one server on REST, WebSocket and gRPC; then clients that go away on every transport; then
// the connection limits. After each batch nothing may be left running or holding a KV block, and
// nothing a client can fix may be answered 5xx.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import { startServer } from './harness.mjs';
import * as R from './reliability_lib.mjs';

const corpora = { rest: R.loadCorpus('rest'), ws: R.loadCorpus('ws'), grpc: R.loadCorpus('grpc') };
const MAX_CONNECTIONS = 64;
let server, port, grpcPort, client, missing;
const failed = { rest: [], ws: [], grpc: [] };

before(async () => {
    grpcPort = await R.freePort();
    const c = R.contractArgs(['--api-key', R.KEY, '--grpc-port', String(grpcPort), '--max-body-bytes', '65536',
        '--read-timeout', '2', '--keep-alive-timeout', '2', '--max-connections', String(MAX_CONNECTIONS)]);
    missing = c.missing;
    server = await startServer(c.args);
    port = Number(new URL(server.url).port);
    client = R.grpcClient(grpcPort);
});
after(async () => {
    client?.close();
    if (server) await server.stop();
});

const alive = () => assert.equal(server.proc.exitCode, null, `the server exited:\n${server.log().slice(-2000)}`);
async function assertIdle(what) {
    const { idle, h } = await R.waitIdle(server.url, 2000);
    assert.ok(idle, `${what}: not idle 2 s later: ${JSON.stringify(h)}`);
    return h;
}

test('the binary takes the contract\'s serve flags', () => {
    assert.deepEqual(missing, [], `serve lacks ${missing.join(' ')} (the server was started without them)`);
});

test('the corpora are big enough', () => {
    assert.ok(corpora.rest.length >= 150, `rest: ${corpora.rest.length}`);
    assert.ok(corpora.ws.length >= 34, `ws: ${corpora.ws.length}`);
    assert.ok(corpora.grpc.length >= 20, `grpc: ${corpora.grpc.length}`);
    for (const [name, cases] of Object.entries(corpora)) {
        const names = cases.map((c) => c.name);
        assert.equal(new Set(names).size, names.length, `${name}: duplicate case names`);
    }
});

// One subtest per case, a few at a time; the parent notes which failed.
function replay(kind, concurrency, run) {
    test(`${kind} corpus`, { concurrency }, async (t) => {
        await Promise.all(corpora[kind].map((c) => t.test(c.name, async () => {
            const problems = await run(c);
            if (problems.length) failed[kind].push(c.name);
            assert.ok(!problems.length, problems.join('; '));
        })));
        alive();
        t.diagnostic(`${kind}: ${failed[kind].length} of ${corpora[kind].length} cases failed`);
    });
}
replay('rest', 8, (c) => R.runRestCase(port, c));
replay('ws', 4, (c) => R.runWsCase(server.url, c));
replay('grpc', 4, (c) => R.runGrpcCase(grpcPort, c));

test('after the corpora: nothing running, no KV block held, and a normal completion works', async () => {
    alive();
    await assertIdle('after the corpora');
    const res = await R.httpRequest(port, {
        path: '/v1/completions',
        headers: { authorization: `Bearer ${R.KEY}`, 'content-type': 'application/json' },
        body: Buffer.from(JSON.stringify({ prompt: 'Once upon a time', max_tokens: 8, temperature: 0 })),
    });
    assert.equal(res.status, 200, res.body.toString());
    assert.equal(JSON.parse(res.body).usage.completion_tokens, 8);
});

test('gRPC requests count in /health requests_served and /metrics request_success_total', async () => {
    const metrics = async () => {
        const res = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${R.KEY}` } });
        const text = await res.text();
        return [...text.matchAll(/^peregrine:request_success_total\{[^}]*\} (\S+)$/gm)].reduce((a, m) => a + Number(m[1]), 0);
    };
    const [h0, m0] = [await R.health(server.url), await metrics()];
    for (let i = 0; i < 3; ++i) assert.equal((await R.grpcGenerate(client, { prompt: 'Once upon a time', max_tokens: 4 })).code, 'OK');
    const [h1, m1] = [await R.health(server.url), await metrics()];
    assert.equal(h1.requests_served - h0.requests_served, 3, `requests_served ${h0.requests_served} -> ${h1.requests_served}`);
    assert.equal(m1 - m0, 3, `request_success_total ${m0} -> ${m1}`);
});

describe('clients that go away, on every transport', () => {
    const long = { prompt: 'Once upon a time', max_tokens: 480, ignore_eos: true, temperature: 0.8 };
    const body = (extra = {}) => Buffer.from(JSON.stringify({ ...long, ...extra }));
    const headers = { authorization: `Bearer ${R.KEY}`, 'content-type': 'application/json' };
    let abortedBefore;
    const batch = async (what, count, fn) => {
        abortedBefore = (await R.health(server.url)).requests_aborted;
        const cutWhileRunning = await fn();
        const h = await assertIdle(what);
        if (cutWhileRunning)
            assert.ok(h.requests_aborted >= abortedBefore + count, `${what}: requests_aborted ${abortedBefore} -> ${h.requests_aborted}, expected +${count}`);
        alive();
    };

    test('REST streaming: 8 streams cut after their first chunks', () => batch('REST streaming', 8, async () => {
        const cuts = Array.from({ length: 8 }, () => new Promise((resolve, reject) => {
            const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', headers, agent: false }, (res) => {
                let events = 0;
                res.on('data', (d) => {
                    events += (d.toString().match(/^data: /gm) ?? []).length;
                    if (events >= 3) {
                        req.destroy();
                        resolve(!d.toString().includes('[DONE]'));
                    }
                });
                res.on('end', () => resolve(false));
            });
            req.on('error', () => {});
            req.setTimeout(10000, () => (req.destroy(), reject(new Error('no chunks in 10 s'))));
            req.end(body({ stream: true }));
        }));
        return (await Promise.all(cuts)).every(Boolean);
    }));

    test('REST non-streaming: 4 connections closed while their requests run', () => batch('REST non-streaming', 4, async () => {
        const socks = [];
        for (let i = 0; i < 4; ++i) {
            const s = net.connect(port, '127.0.0.1');
            s.on('error', () => {});
            const b = body();
            s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${R.KEY}\r\nContent-Length: ${b.length}\r\n\r\n${b}`);
            socks.push(s);
        }
        const h = await R.waitFor(async () => (await R.health(server.url)).running >= 4, 3000);
        let answered = false;
        for (const s of socks) {
            answered ||= s.bytesRead > 0;
            s.destroy();
        }
        return h && !answered;
    }));

    for (const [how, cut] of [['terminated (no close frame)', (c) => c.ws.terminate()], ['closed with a close frame', (c) => c.ws.close(1000)]]) {
        test(`WebSocket ${how} with 4 requests running`, () => batch(`WebSocket ${how}`, 4, async () => {
            const c = await R.wsConnect(server.url);
            for (let i = 0; i < 4; ++i) c.send({ id: `d${i}`, type: 'completion', request: long });
            const chunks = (id) => c.s.msgs.filter((m) => m.id === id && m.type === 'chunk').length;
            const ok = await c.until(() => [0, 1, 2, 3].every((i) => chunks(`d${i}`) >= 2), 5000);
            const running = [0, 1, 2, 3].every((i) => !c.terminal(`d${i}`).length);
            cut(c);
            return ok && running;
        }));
    }

    test('gRPC: 4 streams cancelled after their first message', () => batch('gRPC cancel', 4, async () => {
        const calls = Array.from({ length: 4 }, () => R.grpcGenerate(client, long, { onData: (_m, call) => call.cancel() }));
        const results = await Promise.all(calls);
        for (const r of results) assert.equal(r.code, 'CANCELLED');
        return results.every((r) => !r.messages.some((m) => m.finish_reason));
    }));

    test('gRPC: 4 streams past their deadline', () => batch('gRPC deadline', 4, async () => {
        const results = await Promise.all(Array.from({ length: 4 }, () => R.grpcGenerate(client, { ...long, max_tokens: 500 }, { deadlineMs: 150 })));
        return results.every((r) => r.code === 'DEADLINE_EXCEEDED');
    }));
});

describe('connection limits', () => {
    test(`--max-connections ${MAX_CONNECTIONS}: the ones beyond get 503 too_many_connections and are closed`, async () => {
        const total = MAX_CONNECTIONS + 16;
        const results = await Promise.all(Array.from({ length: total }, () =>
            R.rawExchange(port, Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\n\r\n'), { waitClose: true, waitMs: 2000 }).then((r) => r)));
        const statuses = results.map((r) => r.responses[0]?.status ?? 'none');
        const refused = results.filter((r) => r.responses[0]?.status === 503);
        assert.ok(refused.length >= total - MAX_CONNECTIONS, `statuses: ${JSON.stringify(statuses)}`);
        assert.ok(statuses.every((s) => s === 200 || s === 503), `statuses: ${JSON.stringify(statuses)}`);
        for (const r of refused) {
            const j = JSON.parse(r.responses[0].body.toString());
            assert.deepEqual(R.errorProblems(j.error, 503, { code: 'too_many_connections' }), []);
            assert.ok(r.closed, 'a refused connection stays open');
        }
        // rawExchange closed every socket: the server takes new ones again.
        const ok = await R.waitFor(async () => (await R.health(server.url)).status === 200, 2000);
        assert.ok(ok);
    });

    test('--keep-alive-timeout 2: an idle keep-alive connection is closed', async () => {
        const s = net.connect(port, '127.0.0.1');
        s.on('error', () => {});
        let data = '', closedAt = 0;
        s.on('data', (d) => (data += d));
        s.on('end', () => (closedAt ||= Date.now()));
        s.on('close', () => (closedAt ||= Date.now()));
        s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
        await R.waitFor(() => data.includes('"status"'), 2000);
        const t0 = Date.now();
        await R.waitFor(() => closedAt, 5000);
        s.destroy();
        assert.match(data, /^HTTP\/1\.1 200/);
        assert.ok(closedAt, 'still open 5 s later');
        assert.ok(closedAt - t0 < 3500, `closed after ${closedAt - t0} ms`);
    });
});
