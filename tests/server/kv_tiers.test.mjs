// The KV cache's tiers through `peregrine serve` (embedded model, CPU): a KV pool of 12 blocks
// so that concurrent requests preempt each other (swapped to the host tier: the default with
// --kv-offload-memory), a pinned system prompt that stays a cache hit, prompt_cache_key taken.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, http } from './harness.mjs';

const BLOCK_BYTES = 20480;  // the embedded model's KV block: 16 tokens, every layer's K and V (f32)
const SYSTEM = 'You are a helpful assistant who answers briefly and kindly, always.';
let server;
let dir;

before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-kv-tiers-'));
    fs.writeFileSync(path.join(dir, 'system.txt'), SYSTEM);
    server = await startServer(['--device', 'cpu', '--kv-cache-memory', String(12 * BLOCK_BYTES),
                                '--kv-offload-memory', String(64 * BLOCK_BYTES), '--pin-prefix',
                                path.join(dir, 'system.txt')]);
});

after(async () => {
    await server?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
});

const metric = (text, name) => Number((text.match(new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, 'm')) ?? [])[1]);

test('the pinned prefix is reported and is a cache hit', async () => {
    const [, pinned, total] = server.log().match(/pinned prefix 1: (\d+) of its (\d+) tokens held/).map(Number);
    assert.equal(pinned, Math.floor((total - 1) / 16) * 16, 'whole blocks, never the last token');
    assert.ok(pinned >= 32);
    const health = await http(`${server.url}/health`, { method: 'GET' });
    assert.equal(health.json.pinned_prefix_tokens, pinned);
    const r = await http(`${server.url}/v1/completions`,
                         { body: { prompt: `${SYSTEM} Once upon a time`, max_tokens: 4, temperature: 0 } });
    assert.equal(r.status, 200, r.text);
    assert.ok(r.json.usage.prompt_tokens_details.cached_tokens >= pinned);
});

test('concurrent requests in a tiny pool are swapped, not recomputed, and all finish', async () => {
    const prompts = Array.from({ length: 5 }, (_, i) => `Story ${i}: the little ${['dog', 'cat', 'bird', 'fox', 'owl'][i]} went`);
    const one = (prompt) => http(`${server.url}/v1/completions`, {
        body: { prompt, max_tokens: 100, temperature: 0, ignore_eos: true, prompt_cache_key: `conv-${prompt.length}` },
    });
    const together = await Promise.all(prompts.map(one));
    for (const r of together) {
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.choices[0].finish_reason, 'length');
    }
    const m = (await http(`${server.url}/metrics`, { method: 'GET' })).text;
    assert.ok(metric(m, 'peregrine:num_preemptions_total') > 0, 'the pool is small enough to preempt');
    assert.ok(metric(m, 'peregrine:num_swap_preemptions_total') > 0);
    assert.ok(metric(m, 'peregrine:kv_swapped_in_bytes_total') > 0);
    // Greedy: alone, each prompt gives the same text as in the crowd.
    for (let i = 0; i < prompts.length; ++i) {
        const alone = await one(prompts[i]);
        assert.equal(alone.json.choices[0].text, together[i].json.choices[0].text, prompts[i]);
    }
    const health = await http(`${server.url}/health`, { method: 'GET' });
    assert.ok(health.json.swap_preemptions > 0);
});

test('a conversation is named by prompt_cache_key or the X-Session-ID header, and counted', async () => {
    const count = async () => metric((await http(`${server.url}/metrics`, { method: 'GET' })).text,
                                     'peregrine:conversation_requests_total');
    const before = await count();
    const ask = (extra, headers = {}) => http(`${server.url}/v1/completions`,
                                              { body: { prompt: 'Hi there', max_tokens: 2, ...extra }, headers });
    assert.equal((await ask({ prompt_cache_key: 'conv-a' })).status, 200);
    assert.equal((await ask({}, { 'X-Session-ID': 'conv-b' })).status, 200);
    assert.equal((await ask({})).status, 200, 'an anonymous request');
    const chat = await http(`${server.url}/v1/chat/completions`, {
        body: { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }, headers: { 'x-session-id': 'conv-c' },
    });
    assert.equal(chat.status, 200, chat.text);
    assert.equal(await count(), before + 3);
    const health = await http(`${server.url}/health`, { method: 'GET' });
    assert.equal(health.json.conversation_requests, before + 3);
});
