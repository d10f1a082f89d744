// Around the routes: Prometheus metrics, CORS, per-key rate limits, JSON access logs, and
// graceful shutdown on SIGTERM.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { APIError, http, startServer, waitFor } from './harness.mjs';

const prompt = 'Once upon a time';

// name{labels} value → [{name, labels, value}]
function parseMetrics(text) {
    const out = [];
    for (const line of text.split('\n')) {
        if (!line || line.startsWith('#')) continue;
        const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/);
        assert.ok(m, `bad exposition line: ${line}`);
        const labels = {};
        for (const [, k, v] of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
        out.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return out;
}

describe('metrics, CORS and access logs', () => {
    let server, client;
    before(async () => {
        server = await startServer(['--allowed-origins', 'https://good.example', '--access-log']);
        client = server.client();
    });
    after(async () => server && (await server.stop()));

    test('GET /metrics speaks the Prometheus text format', async () => {
        const c = await client.completions.create({ prompt, max_tokens: 12, ignore_eos: true });
        assert.equal(c.choices[0].finish_reason, 'length');
        const r = await http(`${server.url}/metrics`, { method: 'GET' });
        assert.equal(r.status, 200);
        assert.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
        const samples = parseMetrics(r.text);
        const one = (name, labels = {}) =>
            samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
        for (const g of ['num_requests_running', 'num_requests_waiting', 'kv_cache_usage_perc']) {
            assert.match(r.text, new RegExp(`# TYPE peregrine:${g} gauge`));
            assert.ok(one(`peregrine:${g}`), g);
        }
        for (const c of ['prefix_cache_queries', 'prefix_cache_hits', 'num_preemptions', 'prompt_tokens',
                         'generation_tokens', 'request_success']) {
            assert.match(r.text, new RegExp(`# HELP peregrine:${c}_total `));
            assert.match(r.text, new RegExp(`# TYPE peregrine:${c}_total counter`));
        }
        const usage = one('peregrine:kv_cache_usage_perc').value;
        assert.ok(usage >= 0 && usage <= 1);
        assert.ok(one('peregrine:generation_tokens_total').value >= 12);
        assert.ok(one('peregrine:request_success_total', { finished_reason: 'length' }).value >= 1);
        for (const reason of ['stop', 'abort']) assert.ok(one('peregrine:request_success_total', { finished_reason: reason }));
        for (const h of ['time_to_first_token_seconds', 'inter_token_latency_seconds', 'e2e_request_latency_seconds',
                         'request_queue_time_seconds', 'request_prompt_tokens', 'request_generation_tokens']) {
            const name = `peregrine:${h}`;
            assert.match(r.text, new RegExp(`# TYPE ${name} histogram`));
            const buckets = samples.filter((s) => s.name === `${name}_bucket`);
            assert.ok(buckets.length > 3, name);
            for (let i = 1; i < buckets.length; ++i) assert.ok(buckets[i].value >= buckets[i - 1].value, name);
            assert.equal(buckets.at(-1).labels.le, '+Inf');
            assert.equal(buckets.at(-1).value, one(`${name}_count`).value, name);
            assert.ok(one(`${name}_count`).value >= 1, name);
            assert.ok(one(`${name}_sum`));
        }
        assert.ok(samples.every((s) => s.labels.model_name === 'stories260K'), 'every sample has model_name');
        assert.equal(one('peregrine:inter_token_latency_seconds_count').value, 11);
        assert.equal(one('peregrine:request_generation_tokens_sum').value, 12);
    });

    test('CORS: an allowed origin gets preflight and response headers, others none', async () => {
        const pre = await http(`${server.url}/v1/chat/completions`, {
            method: 'OPTIONS',
            headers: {
                origin: 'https://good.example',
                'access-control-request-method': 'POST',
                'access-control-request-headers': 'authorization, content-type, x-stainless-os',
            },
        });
        assert.ok(pre.status === 204 || pre.status === 200, String(pre.status));
        assert.equal(pre.headers.get('access-control-allow-origin'), 'https://good.example');
        assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
        const allowHeaders = pre.headers.get('access-control-allow-headers').toLowerCase();
        for (const h of ['authorization', 'content-type', 'x-stainless-os']) assert.ok(allowHeaders.includes(h), h);

        const ok = await http(`${server.url}/v1/models`, { method: 'GET', headers: { origin: 'https://good.example' } });
        assert.equal(ok.status, 200);
        assert.equal(ok.headers.get('access-control-allow-origin'), 'https://good.example');
        const err = await http(`${server.url}/v1/completions`, { body: '{', headers: { origin: 'https://good.example' } });
        assert.equal(err.status, 400);
        assert.equal(err.headers.get('access-control-allow-origin'), 'https://good.example');

        const evilPre = await http(`${server.url}/v1/chat/completions`, {
            method: 'OPTIONS',
            headers: { origin: 'https://evil.example', 'access-control-request-method': 'POST' },
        });
        assert.equal(evilPre.headers.get('access-control-allow-origin'), null);
        assert.equal(evilPre.headers.get('access-control-allow-methods'), null);
        const evil = await http(`${server.url}/v1/models`, { method: 'GET', headers: { origin: 'https://evil.example' } });
        assert.equal(evil.status, 200);
        assert.equal(evil.headers.get('access-control-allow-origin'), null);
    });

    test('access log: one JSON line per request with its id, status and tokens', async () => {
        const rid = `mw-log-${Date.now()}`;
        const r = await http(`${server.url}/v1/completions`, {
            body: { prompt, max_tokens: 7, ignore_eos: true },
            headers: { 'x-request-id': rid },
        });
        assert.equal(r.status, 200);
        const line = await waitFor(
            () => server.log().split('\n').find((l) => l.startsWith('{') && l.includes(`"${rid}"`)),
            2000,
        );
        assert.ok(line, server.log());
        const j = JSON.parse(line);
        assert.equal(j.method, 'POST');
        assert.equal(j.path, '/v1/completions');
        assert.equal(j.status, 200);
        assert.equal(j.completion_tokens, 7);
        assert.equal(j.prompt_tokens, r.json.usage.prompt_tokens);
        assert.equal(typeof j.duration_ms, 'number');
        assert.ok(!Number.isNaN(Date.parse(j.time)));
        const miss = await http(`${server.url}/nope`, { method: 'GET', headers: { 'x-request-id': `${rid}-404` } });
        assert.equal(miss.status, 404);
        const l404 = await waitFor(() => server.log().split('\n').find((l) => l.includes(`"${rid}-404"`)), 2000);
        assert.equal(JSON.parse(l404).status, 404);
    });
});

describe('rate limits', () => {
    test('requests per minute, per API key: 429 with Retry-After', async () => {
        const server = await startServer(['--api-key', 'k1', '--api-key', 'k2', '--rate-limit-rpm', '2']);
        try {
            const k1 = server.client({ apiKey: 'k1' });
            await k1.models.list();
            await k1.models.list();
            await assert.rejects(k1.models.list(), (e) => e instanceof APIError && e.status === 429);
            const raw = await http(`${server.url}/v1/models`, { method: 'GET', headers: { authorization: 'Bearer k1' } });
            assert.equal(raw.status, 429);
            const retry = Number(raw.headers.get('retry-after'));
            assert.ok(retry >= 1 && retry <= 30, String(retry));
            assert.equal(raw.json.error.type, 'rate_limit_error');
            assert.equal(raw.json.error.code, 'rate_limit_exceeded');
            assert.equal(typeof raw.json.error.message, 'string');
            // Another key has its own bucket.
            const k2 = server.client({ apiKey: 'k2' });
            const c = await k2.completions.create({ prompt, max_tokens: 2 });
            assert.equal(c.choices.length, 1);
        } finally {
            await server.stop();
        }
    });

    test('tokens per minute count prompt + max_tokens at admission', async () => {
        const server = await startServer(['--rate-limit-tpm', '100']);
        try {
            const client = server.client();
            const a = await client.completions.create({ prompt, max_tokens: 40 });
            const cost = a.usage.prompt_tokens + 40;
            assert.ok(cost * 2 <= 100 && cost * 3 > 100, `cost ${cost}`);
            await client.completions.create({ prompt, max_tokens: 40 });
            const r = await http(`${server.url}/v1/completions`, { body: { prompt, max_tokens: 40 } });
            assert.equal(r.status, 429);
            assert.ok(Number(r.headers.get('retry-after')) >= 1);
            assert.equal(r.json.error.type, 'rate_limit_error');
            // Small enough for what is left: admitted.
            const small = await http(`${server.url}/v1/completions`, { body: { prompt, max_tokens: 1 } });
            assert.equal(small.status, 200, small.text);
            // More than a whole minute's allowance: retrying cannot help, so 413 and no Retry-After.
            const huge = await http(`${server.url}/v1/completions`, { body: { prompt, max_tokens: 200 } });
            assert.equal(huge.status, 413);
            assert.equal(huge.json.error.param, 'max_tokens');
            assert.equal(huge.json.error.code, 'tokens_exceed_rate_limit');
            assert.equal(huge.headers.get('retry-after'), null);
        } finally {
            await server.stop();
        }
    });
});

describe('queue limit', () => {
    test('requests beyond --max-queued-requests get 429 with Retry-After', async () => {
        const server = await startServer(['--max-queued-requests', '2']);
        try {
            const long = { model: 'stories260K', prompt, max_tokens: 400, ignore_eos: true };
            const running = [http(`${server.url}/v1/completions`, { body: long }),
                             http(`${server.url}/v1/completions`, { body: long })];
            // Both are in flight once the engine reports them.
            await waitFor(async () => (await http(`${server.url}/health`, { method: 'GET' })).json?.requests_in_flight === 2, 2000);
            const refused = await http(`${server.url}/v1/completions`, { body: long });
            assert.equal(refused.status, 429);
            assert.equal(refused.headers.get('retry-after'), '1');
            assert.equal(refused.json.error.code, 'too_many_requests_queued');
            for (const r of await Promise.all(running)) assert.equal(r.status, 200);
            const again = await http(`${server.url}/v1/completions`, { body: { ...long, max_tokens: 4 } });
            assert.equal(again.status, 200);
        } finally {
            await server.stop();
        }
    });
});

describe('graceful shutdown', () => {
    const long = { prompt, max_tokens: 480, ignore_eos: true, temperature: 0.8, stream: true };

    // Starts `count` streams and resolves once each has sent a token, with `rest`: the finish
    // reasons once every stream has ended.
    async function startStreams(client, count) {
        const firsts = [];
        const rest = Array.from({ length: count }, () => {
            let first;
            firsts.push(new Promise((r) => (first = r)));
            return (async () => {
                const stream = await client.completions.create(long);
                let finish = null;
                for await (const chunk of stream) {
                    if (chunk.choices[0]?.text) first();
                    finish = chunk.choices[0]?.finish_reason ?? finish;
                }
                first();
                return finish;
            })();
        });
        await Promise.all(firsts);
        return { rest: Promise.all(rest) };
    }

    test('SIGTERM drains: /health 503 draining, new requests 503, running ones finish, exit 0', async (t) => {
        const server = await startServer(['--shutdown-timeout', '120']);  // an upper bound: slow under ASan
        const client = server.client();
        const { rest: done } = await startStreams(client, 24);
        await waitFor(async () => (await http(`${server.url}/health`, { method: 'GET' })).json.running > 0, 2000, 2);
        const exited = server.stop();
        await waitFor(() => server.log().includes('draining'), 2000, 1);
        const h = await http(`${server.url}/health`, { method: 'GET' }).catch(() => null);
        const n = await http(`${server.url}/v1/completions`, { body: { prompt, max_tokens: 2 } }).catch(() => null);
        const finishes = await done;
        assert.deepEqual(new Set(finishes), new Set(['length']));
        const { code } = await exited;
        assert.equal(code, 0, server.log());
        t.diagnostic(`health during drain: ${h?.status}, new request: ${n?.status}`);
        // The streams outlast these two calls unless the machine is very fast; then the server is gone.
        if (h) {
            assert.equal(h.status, 503);
            assert.equal(h.json.status, 'draining');
        }
        if (n) {
            assert.equal(n.status, 503);
            assert.equal(n.json.error.code, 'shutting_down');
        }
    });

    test('past --shutdown-timeout the rest are aborted and the server exits 0', async () => {
        const server = await startServer(['--shutdown-timeout', '0']);
        const client = server.client();
        const { rest: done } = await startStreams(client, 24);
        const exited = server.stop();
        const finishes = await done;
        assert.ok(finishes.includes('abort'), JSON.stringify(finishes));
        const { code } = await exited;
        assert.equal(code, 0, server.log());
        assert.match(server.log(), /aborting \d+ request/);
    });
});
