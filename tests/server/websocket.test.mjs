// The WebSocket endpoint /v1/ws: requests multiplexed on one connection, answered with the same
// chunks as the SSE stream, cancel, errors that leave the connection usable, and auth.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { http, startServer, waitFor } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const WebSocket = require('ws');

// A connection that collects every message by request id; done(id) resolves on done or error.
async function connect(url, headers = {}) {
    const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/ws`, { headers });
    const byId = new Map();
    const waiters = new Map();
    ws.on('message', (data) => {
        const m = JSON.parse(data.toString());
        if (!byId.has(m.id)) byId.set(m.id, []);
        byId.get(m.id).push(m);
        if ((m.type === 'done' || m.type === 'error') && waiters.has(m.id)) waiters.get(m.id)(byId.get(m.id));
    });
    await new Promise((resolve, reject) => {
        ws.once('open', resolve);
        ws.once('error', reject);
    });
    return {
        ws,
        send: (obj) => ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj)),
        messages: (id) => byId.get(id) ?? [],
        done: (id) =>
            new Promise((resolve) => {
                const got = byId.get(id);
                if (got && got.some((m) => m.type === 'done' || m.type === 'error')) return resolve(got);
                waiters.set(id, resolve);
            }),
    };
}

const textOf = (msgs) =>
    msgs
        .filter((m) => m.type === 'chunk')
        .map((m) => m.data.choices[0]?.text ?? m.data.choices[0]?.delta?.content ?? '')
        .join('');

describe('without keys', () => {
    let server;
    before(async () => {
        server = await startServer();
    });
    after(async () => server && (await server.stop()));
    const health = async () => (await http(`${server.url}/health`, { method: 'GET' })).json;

    test('two multiplexed requests give the same text as over HTTP', async () => {
        const completion = { prompt: 'Once upon a time', max_tokens: 24, temperature: 0 };
        const chat = { messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 24, temperature: 0 };
        const c = await connect(server.url);
        c.send({ id: 'a', type: 'completion', request: completion });
        c.send({ id: 'b', type: 'chat', request: chat });
        const [a, b] = await Promise.all([c.done('a'), c.done('b')]);
        c.ws.close();
        assert.equal(a.at(-1).type, 'done');
        assert.equal(b.at(-1).type, 'done');
        assert.ok(a.filter((m) => m.type === 'chunk').every((m) => m.data.object === 'text_completion'));
        assert.ok(b.filter((m) => m.type === 'chunk').every((m) => m.data.object === 'chat.completion.chunk'));
        assert.equal(b[0].data.choices[0].delta.role, 'assistant');
        const ha = await http(`${server.url}/v1/completions`, { body: completion });
        const hb = await http(`${server.url}/v1/chat/completions`, { body: chat });
        assert.equal(ha.status, 200);
        assert.equal(hb.status, 200);
        assert.equal(textOf(a), ha.json.choices[0].text);
        assert.equal(textOf(b), hb.json.choices[0].message.content);
        assert.ok(textOf(a).length > 0);
    });

    test('structured output over the socket: the same fields as HTTP', async () => {
        const c = await connect(server.url);
        const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 99 } },
            required: ['n'], additionalProperties: false };
        c.send({ id: 's', type: 'chat', request: { messages: [{ role: 'user', content: 'Hi' }], temperature: 1, seed: 2,
            response_format: { type: 'json_schema', json_schema: { name: 'n', schema } } } });
        c.send({ id: 'g', type: 'completion', request: { prompt: 'Once', temperature: 1, seed: 2, max_tokens: 20,
            guided_choice: ['up', 'down'] } });
        c.send({ id: 'bad', type: 'completion', request: { prompt: 'Once', guided_json: { type: 'object', not: {} } } });
        const [s, g, bad] = await Promise.all([c.done('s'), c.done('g'), c.done('bad')]);
        c.ws.close();
        const v = JSON.parse(textOf(s));
        assert.ok(Number.isInteger(v.n) && v.n >= 1 && v.n <= 99, textOf(s));
        assert.ok(['up', 'down'].includes(textOf(g)), textOf(g));
        assert.equal(bad.at(-1).type, 'error');
        assert.equal(bad.at(-1).error.param, 'guided_json');
    });

    test('a cancel ends a long request with finish_reason abort; nothing runs within one second', async () => {
        const c = await connect(server.url);
        c.send({
            id: 'long',
            type: 'completion',
            request: { prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true, temperature: 0.8 },
        });
        await waitFor(() => c.messages('long').filter((m) => m.type === 'chunk').length >= 3, 5000, 2);
        c.send({ type: 'cancel', id: 'long' });
        const t0 = Date.now();
        const msgs = await c.done('long');
        assert.equal(msgs.at(-1).type, 'done');
        const last = msgs.filter((m) => m.type === 'chunk').at(-1);
        assert.equal(last.data.choices[0].finish_reason, 'abort');
        assert.ok(textOf(msgs).length > 0);
        const h = await waitFor(async () => {
            const j = await health();
            return j.running === 0 && j.waiting === 0 ? j : null;
        }, 1000);
        assert.ok(h && Date.now() - t0 <= 1000, JSON.stringify(await health()));
        c.ws.close();
    });

    test('a bad request gets an error with status 400 and the connection stays usable', async () => {
        const c = await connect(server.url);
        c.send({ id: 'bad', type: 'completion', request: { prompt: 'Hi', max_tokens: -1 } });
        const bad = await c.done('bad');
        assert.equal(bad.length, 1);
        assert.equal(bad[0].type, 'error');
        assert.equal(bad[0].status, 400);
        assert.equal(typeof bad[0].error.message, 'string');
        c.send('not json');
        await waitFor(() => c.messages(null).length === 1, 2000);
        assert.equal(c.messages(null)[0].status, 400);
        c.send({ id: 'good', type: 'completion', request: { prompt: 'Hi', max_tokens: 4, temperature: 0 } });
        const good = await c.done('good');
        assert.equal(good.at(-1).type, 'done');
        c.ws.close();
    });

    test('closing the socket aborts its requests', async () => {
        const c = await connect(server.url);
        for (const id of ['x', 'y'])
            c.send({ id, type: 'completion', request: { prompt: 'Once', max_tokens: 400, ignore_eos: true } });
        await waitFor(() => c.messages('x').length >= 2 && c.messages('y').length >= 2, 5000, 2);
        c.ws.terminate();
        const h = await waitFor(async () => {
            const j = await health();
            return j.running === 0 && j.waiting === 0 && j.requests_in_flight === 0 ? j : null;
        }, 1000);
        assert.ok(h, JSON.stringify(await health()));
    });

    test('a plain GET on /v1/ws gets 426', async () => {
        const r = await http(`${server.url}/v1/ws`, { method: 'GET' });
        assert.equal(r.status, 426);
    });
});

describe('with keys', () => {
    let server;
    before(async () => {
        server = await startServer(['--api-key', 'ws-key']);
    });
    after(async () => server && (await server.stop()));

    test('an unauthenticated upgrade is refused with 401', async () => {
        const status = await new Promise((resolve) => {
            const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}/v1/ws`);
            ws.on('unexpected-response', (_req, res) => resolve(res.statusCode));
            ws.on('open', () => resolve('open'));
            ws.on('error', () => {});
        });
        assert.equal(status, 401);
    });

    test('the key opens the socket', async () => {
        const c = await connect(server.url, { Authorization: 'Bearer ws-key' });
        c.send({ id: '1', type: 'completion', request: { prompt: 'Hi', max_tokens: 3 } });
        assert.equal((await c.done('1')).at(-1).type, 'done');
        c.ws.close();
    });

    // Browsers cannot set headers on a WebSocket: the key as a subprotocol (OpenAI Realtime's
    // `openai-insecure-api-key.KEY`, the server answering with another offered protocol) or as
    // the query `api_key`; a wrong one is still a 401.
    const opened = (target, protocols) => new Promise((resolve) => {
        const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}${target}`, protocols);
        ws.on('unexpected-response', (_req, res) => resolve({ status: res.statusCode }));
        ws.on('open', () => resolve({ ws, protocol: ws.protocol }));
        ws.on('error', () => {});
    });
    test('the key as a subprotocol or an api_key query parameter', async () => {
        const a = await opened('/v1/ws', ['peregrine', 'openai-insecure-api-key.ws-key']);
        assert.equal(a.protocol, 'peregrine');
        const done = new Promise((resolve) => a.ws.on('message', (d) => {
            const m = JSON.parse(d.toString());
            if (m.type === 'done' || m.type === 'error') resolve(m.type);
        }));
        a.ws.send(JSON.stringify({ id: '1', type: 'completion', request: { prompt: 'Hi', max_tokens: 3 } }));
        assert.equal(await done, 'done');
        a.ws.close();
        const b = await opened('/v1/ws', ['openai-insecure-api-key.ws-key']);
        assert.equal(b.protocol, 'openai-insecure-api-key.ws-key');
        b.ws.close();
        const c = await opened('/v1/ws?stream=1&api_key=ws%2Dkey');
        assert.ok(c.ws, 'the query key opens the socket');
        c.ws.close();
        assert.equal((await opened('/v1/ws?api_key=nope')).status, 401);
        assert.equal((await opened('/v1/ws', ['openai-insecure-api-key.nope'])).status, 401);
    });
});

test('each WebSocket request has its access-log line, like HTTP requests and gRPC calls', async () => {
    const s = await startServer(['--access-log']);
    try {
        const c = await connect(s.url);
        c.send({ id: 'a', type: 'completion', request: { prompt: 'Hi', max_tokens: 3,
            stream_options: { include_usage: true } } });
        c.send({ id: 'b', type: 'chat', request: { messages: [], max_tokens: 3 } });
        await c.done('a');
        await c.done('b');
        c.ws.close();
        const lines = await waitFor(() => {
            const ws = s.log().split('\n').filter((l) => l.includes('"WS"')).map((l) => JSON.parse(l));
            return ws.length >= 2 ? ws : null;
        }, 2000);
        assert.ok(lines, s.log().slice(-2000));
        const a = lines.find((l) => l.request_id === 'a');
        assert.equal(a.path, '/v1/ws completion');
        assert.equal(a.status, 200);
        assert.equal(a.completion_tokens, 3);
        assert.ok(a.prompt_tokens > 0);
        const b = lines.find((l) => l.request_id === 'b');
        assert.equal(b.path, '/v1/ws chat');
        assert.equal(b.status, 400);
    } finally {
        await s.stop();
    }
});
