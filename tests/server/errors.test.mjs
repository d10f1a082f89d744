// Errors: OpenAI's {"error": {message, type, param, code}} with the right status, through the
// official client and raw HTTP; API keys; the body size limit.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import { apiError, http, startServer } from './harness.mjs';

let server, client;
before(async () => {
    server = await startServer(['--max-body-bytes', '65536']);
    client = server.client();
});
after(async () => server && (await server.stop()));

function assertErrorBody(body, { type = 'invalid_request_error', param, code } = {}) {
    assert.ok(body && body.error, `no error object in ${JSON.stringify(body)}`);
    const e = body.error;
    assert.deepEqual(Object.keys(e).sort(), ['code', 'message', 'param', 'type']);
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0);
    assert.equal(e.type, type);
    if (param !== undefined) assert.equal(e.param, param);
    if (code !== undefined) assert.equal(e.code, code);
}

describe('client errors', () => {
    test('unknown model: 404', async () => {
        const e = await apiError(() => client.completions.create({ model: 'gpt-4', prompt: 'Hi', max_tokens: 2 }));
        assert.equal(e.status, 404);
        assert.equal(e.code, 'model_not_found');
        assert.equal(e.param, 'model');
        assert.match(e.message, /gpt-4/);
        const chat = await apiError(() =>
            client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'Hi' }] }),
        );
        assert.equal(chat.status, 404);
        const raw = await http(`${server.url}/v1/completions`, { body: { model: 'x', prompt: 'Hi' } });
        assert.equal(raw.status, 404);
        assertErrorBody(raw.json, { type: 'not_found_error', param: 'model', code: 'model_not_found' });
    });

    test('bad JSON: 400', async () => {
        for (const body of ['{"prompt": "Hi", ', 'not json', '[1, 2]', '']) {
            const r = await http(`${server.url}/v1/completions`, { body });
            assert.equal(r.status, 400, body);
            assertErrorBody(r.json);
        }
        const r = await http(`${server.url}/v1/chat/completions`, { body: '{"messages": [}' });
        assert.equal(r.status, 400);
        assertErrorBody(r.json, { code: 'invalid_json' });
    });

    test('wrong types: 400 naming the parameter', async () => {
        const cases = [
            [{ prompt: 'Hi', temperature: 'hot' }, 'temperature'],
            [{ prompt: 'Hi', max_tokens: '5' }, 'max_tokens'],
            [{ prompt: 'Hi', max_tokens: 2.5 }, 'max_tokens'],
            [{ prompt: 'Hi', n: true }, 'n'],
            [{ prompt: 'Hi', stop: 5 }, 'stop'],
            [{ prompt: 'Hi', stream: 'yes' }, 'stream'],
            [{ prompt: 'Hi', logit_bias: { abc: 1 } }, 'logit_bias'],
            [{ prompt: 'Hi', top_p: 0 }, 'top_p'],
            [{ prompt: 'Hi', n: 0 }, 'n'],
            [{ prompt: 'Hi', logprobs: 50 }, 'logprobs'],
            [{ prompt: { text: 'Hi' } }, 'prompt'],
            [{ prompt: [1, 'a'] }, 'prompt'],
            [{}, 'prompt'],
            [{ prompt: [100000] }, 'prompt'],
        ];
        for (const [body, param] of cases) {
            const e = await apiError(() => client.completions.create(body));
            assert.equal(e.status, 400, JSON.stringify(body));
            assert.equal(e.param, param, JSON.stringify(body));
            assert.equal(e.type, 'invalid_request_error');
        }
        const chat = [
            [{ messages: 'Hi' }, 'messages'],
            [{ messages: [{ content: 'Hi' }] }, 'messages'],
            [{ messages: [{ role: 'user', content: 5 }] }, 'messages'],
            [{ messages: [{ role: 'wizard', content: 'Hi' }] }, 'messages'],
            [{ messages: [{ role: 'user', content: 'Hi' }], top_logprobs: 2 }, 'top_logprobs'],
        ];
        for (const [body, param] of chat) {
            const e = await apiError(() => client.chat.completions.create(body));
            assert.equal(e.status, 400, JSON.stringify(body));
            assert.equal(e.param, param, JSON.stringify(body));
        }
    });

    test('negative max_tokens: 400', async () => {
        const e = await apiError(() => client.completions.create({ prompt: 'Hi', max_tokens: -1 }));
        assert.equal(e.status, 400);
        assert.equal(e.param, 'max_tokens');
        const c = await apiError(() =>
            client.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: -5 }),
        );
        assert.equal(c.status, 400);
        assert.equal(c.param, 'max_completion_tokens');
        const raw = await http(`${server.url}/v1/completions`, { body: { prompt: 'Hi', max_tokens: -1 } });
        assert.equal(raw.status, 400);
        assertErrorBody(raw.json, { param: 'max_tokens' });
    });

    test('prompt too long: 400', async () => {
        const ids = Array.from({ length: 600 }, (_, i) => 300 + (i % 100));
        const e = await apiError(() => client.completions.create({ prompt: ids, max_tokens: 4 }));
        assert.equal(e.status, 400);
        assert.equal(e.code, 'context_length_exceeded');
        assert.equal(e.param, 'prompt');
        assert.match(e.message, /512/);
        const words = 'Lily and Tom went to the park to play. '.repeat(80);
        const chat = await apiError(() =>
            client.chat.completions.create({ messages: [{ role: 'user', content: words }] }),
        );
        assert.equal(chat.status, 400);
        assert.equal(chat.param, 'messages');
        // A prompt that fits, with max_tokens that do not.
        const m = await apiError(() => client.completions.create({ prompt: 'Hi', max_tokens: 1000 }));
        assert.equal(m.status, 400);
        assert.equal(m.param, 'max_tokens');
    });

    test('features not implemented: 400 with a clear message', async () => {
        const messages = [{ role: 'user', content: 'Hi' }];
        const rf = await apiError(() =>
            client.chat.completions.create({ messages, response_format: { type: 'yaml' } }),
        );
        assert.equal(rf.status, 400);
        assert.equal(rf.param, 'response_format');
        assert.match(rf.message, /'yaml' is not supported/);
        const ok = await client.chat.completions.create({ messages, max_tokens: 2, response_format: { type: 'text' } });
        assert.equal(ok.choices.length, 1);
        const tools = await apiError(() =>
            client.chat.completions.create({
                messages,
                tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
                tool_choice: 'sometimes',
            }),
        );
        assert.equal(tools.status, 400);
        assert.equal(tools.param, 'tool_choice');
        assert.match(tools.message, /'auto'/);
    });

    test('unknown fields are refused by name, known ones accepted', async () => {
        const r = await http(`${server.url}/v1/completions`, {
            body: { prompt: 'Hi', max_tokens: 2, foo: 1, user: 'u1', priority: 3, cache_salt: 'tenant-a', bar: { x: [] } },
        });
        assert.equal(r.status, 400);
        assertErrorBody(r.json, { param: 'foo' });
        const ok = await http(`${server.url}/v1/completions`, {
            body: { prompt: 'Hi', max_tokens: 2, user: 'u1', priority: 3, cache_salt: 'tenant-a' },
        });
        assert.equal(ok.status, 200);
    });

    test('unknown routes 404, wrong methods 405', async () => {
        const r = await http(`${server.url}/v1/nothing`, { body: {} });
        assert.equal(r.status, 404);
        assertErrorBody(r.json, { type: 'not_found_error' });
        const m = await http(`${server.url}/v1/completions`, { method: 'GET' });
        assert.equal(m.status, 405);
        assert.equal(m.headers.get('allow'), 'POST');
        assertErrorBody(m.json);
        const h = await http(`${server.url}/health`, { method: 'POST', body: {} });
        assert.equal(h.status, 405);
    });

    test('a body over --max-body-bytes: 413', async () => {
        const r = await http(`${server.url}/v1/completions`, { body: { prompt: 'x'.repeat(100000) } });
        assert.equal(r.status, 413);
        assertErrorBody(r.json, { code: 'request_too_large' });
        // The server still answers.
        const ok = await http(`${server.url}/v1/completions`, { body: { prompt: 'Hi', max_tokens: 1 } });
        assert.equal(ok.status, 200);
    });

    test('keep-alive: several requests on one connection, pipelined too', async () => {
        const port = Number(new URL(server.url).port);
        const sock = net.connect(port, '127.0.0.1');
        await new Promise((r) => sock.once('connect', r));
        const body = JSON.stringify({ prompt: 'Hi', max_tokens: 2, temperature: 0 });
        const req = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
        let data = '';
        sock.on('data', (d) => (data += d.toString()));
        sock.write(req + req + req);
        const ok = () => (data.match(/HTTP\/1\.1 200 OK/g) ?? []).length === 3 && data.trimEnd().endsWith('}');
        const end = Date.now() + 5000;
        while (!ok() && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
        sock.destroy();
        assert.ok(ok(), data);
    });
});

test('Expect: 100-continue gets 100 Continue before the body', async () => {
    const port = Number(new URL(server.url).port);
    const sock = net.connect(port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    let data = '';
    sock.on('data', (d) => (data += d.toString()));
    const body = JSON.stringify({ prompt: 'Hi', max_tokens: 2 });
    sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: ${body.length}\r\n\r\n`);
    const end = Date.now() + 3000;
    while (!data.includes('100 Continue') && Date.now() < end) await new Promise((r) => setTimeout(r, 5));
    assert.match(data, /^HTTP\/1\.1 100 Continue\r\n\r\n/);
    sock.write(body);
    while (!data.includes('"usage"') && Date.now() < end) await new Promise((r) => setTimeout(r, 5));
    sock.destroy();
    assert.match(data, /HTTP\/1\.1 200 OK/);
});

test('X-Request-Id: the client\'s is echoed, else one is made', async () => {
    const mine = await http(`${server.url}/v1/models`, { method: 'GET', headers: { 'x-request-id': 'trace-42' } });
    assert.equal(mine.headers.get('x-request-id'), 'trace-42');
    const made = await http(`${server.url}/v1/nothing`, { method: 'GET' });
    assert.match(made.headers.get('x-request-id'), /^req-[0-9a-f]{16}$/);
    const other = await http(`${server.url}/v1/nothing`, { method: 'GET' });
    assert.notEqual(other.headers.get('x-request-id'), made.headers.get('x-request-id'));
});

test('JSON nested too deeply: 400, and the server lives', async () => {
    const deep = '['.repeat(20000) + ']'.repeat(20000);
    const r = await http(`${server.url}/v1/chat/completions`, {
        body: `{"messages": [{"role": "user", "content": "Hi", "x": ${deep}}]}`,
    });
    assert.equal(r.status, 400);
    assertErrorBody(r.json);
    const ok = await http(`${server.url}/health`, { method: 'GET' });
    assert.equal(ok.status, 200);
});

describe('API keys', () => {
    let keyed;
    before(async () => {
        keyed = await startServer(['--api-key', 'key-one', '--api-key', 'key-two', '--served-model-name', 'tiny']);
    });
    after(async () => keyed && (await keyed.stop()));

    test('missing or wrong key: 401; either configured key works', async () => {
        const missing = await http(`${keyed.url}/v1/models`, { method: 'GET' });
        assert.equal(missing.status, 401);
        assertErrorBody(missing.json, { type: 'authentication_error', code: 'invalid_api_key' });
        const wrong = await apiError(() => keyed.client({ apiKey: 'key-three' }).models.list());
        assert.equal(wrong.status, 401);
        for (const apiKey of ['key-one', 'key-two']) {
            const r = await keyed.client({ apiKey }).completions.create({ model: 'tiny', prompt: 'Hi', max_tokens: 2 });
            assert.equal(r.model, 'tiny');
        }
        const health = await http(`${keyed.url}/health`, { method: 'GET' });
        assert.equal(health.status, 200);
    });
});
