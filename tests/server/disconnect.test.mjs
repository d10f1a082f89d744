// Clients that go away: their requests are aborted within an engine step, so the engine has
// nothing running or waiting and the KV blocks are free again.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';

import { http, startServer, waitFor } from './harness.mjs';

let server, client;
before(async () => {
    server = await startServer();
    client = server.client();
});
after(async () => server && (await server.stop()));

const health = async () => (await http(`${server.url}/health`, { method: 'GET' })).json;
const idle = async () => {
    const h = await health();
    return h.running === 0 && h.waiting === 0 && h.kv_blocks_used === 0 && h.requests_in_flight === 0 ? h : null;
};

test('32 streaming requests cut mid-stream leave nothing running within one second', async (t) => {
    const long = { prompt: 'Once upon a time', max_tokens: 480, ignore_eos: true, temperature: 0.8, stream: true };
    const controllers = [];
    const started = await Promise.all(
        Array.from({ length: 32 }, async () => {
            const ac = new AbortController();
            controllers.push(ac);
            const stream = await client.completions.create(long, { signal: ac.signal });
            let n = 0;
            try {
                for await (const chunk of stream) {
                    if (chunk.choices[0]?.text) ++n;
                    if (n === 3) return n;  // leaving the loop closes the stream
                }
            } catch (e) {
                if (e.name !== 'APIUserAbortError' && e.name !== 'AbortError') throw e;
            }
            return n;
        }),
    );
    assert.ok(started.every((n) => n === 3));
    for (const ac of controllers) ac.abort();
    const during = await health();
    const t0 = Date.now();
    const h = await waitFor(idle, 1000);
    assert.ok(h, `still busy after 1 s: ${JSON.stringify(await health())} (just after the cut: ${JSON.stringify(during)})`);
    assert.ok(Date.now() - t0 <= 1000);
    t.diagnostic(`running just after the cut: ${during.running}; idle after ${Date.now() - t0} ms`);
    assert.ok(h.requests_aborted >= 32, JSON.stringify(h));
});

test('a client that closes its socket during a non-streaming request aborts it', async () => {
    const before = (await health()).requests_aborted;
    const port = Number(new URL(server.url).port);
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 480, ignore_eos: true });
    const sock = net.connect(port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    const running = await waitFor(async () => (await health()).running === 1, 2000, 2);
    sock.destroy();
    const h = await waitFor(idle, 1000);
    assert.ok(h, JSON.stringify(await health()));
    if (running) assert.equal(h.requests_aborted, before + 1);
});

test('the server still serves afterwards', async () => {
    const r = await client.completions.create({ prompt: 'Hi', max_tokens: 4 });
    assert.equal(r.choices.length, 1);
});
