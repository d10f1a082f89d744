// The KV cache's disk tier through `peregrine serve` (embedded model, CPU): a KV pool of 7 blocks
// and a host tier of 6, so a prompt's blocks go to the disk file when others follow; sent again,
// the prompt gets them back as cached tokens with the same text, and the disk tier's metrics and
// /health figures move. Bad flags are refused at start, naming the flag and the numbers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, http } from './harness.mjs';

const BLOCK_BYTES = 20480;  // the embedded model's KV block: 16 tokens, every layer's K and V (f32)
const SLOT_BYTES = 24576;   // one block on disk: a 64-byte header and the block, rounded up to 4 KiB
let server;
let dir;

before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-kv-disk-'));
    server = await startServer(['--device', 'cpu', '--kv-cache-memory', String(7 * BLOCK_BYTES),
                                '--kv-offload-memory', String(6 * BLOCK_BYTES), '--kv-offload-disk', dir,
                                '--kv-offload-disk-size', String(64 * SLOT_BYTES)]);
});

after(async () => {
    await server?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
});

const metric = (text, name) => Number((text.match(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm')) ?? [])[1]);
// 81 token ids: 5 full blocks and the token the prompt must compute.
const prompt = (k) => [1, ...Array.from({ length: 80 }, (_, i) => 3 + ((k * 97 + i * 31) % 400))];
const complete = (ids) => http(`${server.url}/v1/completions`, { body: { prompt: ids, max_tokens: 6, temperature: 0 } });

test('a prompt whose blocks went to disk comes back cached, with the same text', async () => {
    const first = await complete(prompt(0));
    assert.equal(first.status, 200, first.text);
    for (let k = 1; k <= 3; ++k) assert.equal((await complete(prompt(k))).status, 200);  // push it out
    const again = await complete(prompt(0));
    assert.equal(again.status, 200, again.text);
    assert.equal(again.json.choices[0].text, first.json.choices[0].text);
    assert.equal(again.json.usage.prompt_tokens_details.cached_tokens, 80);

    const m = (await http(`${server.url}/metrics`, { method: 'GET' })).text;
    assert.ok(metric(m, 'peregrine:disk_prefix_cache_hits_total') >= 80, m);
    assert.ok(metric(m, 'peregrine:disk_prefix_cache_queries_total') >= metric(m, 'peregrine:disk_prefix_cache_hits_total'));
    assert.ok(metric(m, 'peregrine:kv_disk_written_bytes_total') >= 5 * BLOCK_BYTES);
    assert.ok(metric(m, 'peregrine:kv_disk_read_bytes_total') >= 5 * BLOCK_BYTES);
    assert.equal(metric(m, 'peregrine:disk_kv_cache_blocks'), 64);
    assert.ok(metric(m, 'peregrine:disk_kv_cache_used_bytes') >= 5 * SLOT_BYTES);
    assert.equal(metric(m, 'peregrine:disk_kv_read_failures_total'), 0);

    const health = (await http(`${server.url}/health`, { method: 'GET' })).json;
    assert.equal(health.disk_kv_blocks_total, 64);
    assert.equal(health.disk_kv_bytes_total, 64 * SLOT_BYTES);
    assert.ok(health.disk_kv_blocks_used >= 5);
    assert.ok(fs.readdirSync(dir).length === 1, 'one file for the tier');
});

test('bad disk-tier flags are refused at start, naming the flag and the numbers', async () => {
    const base = ['--device', 'cpu', '--kv-offload-memory', String(6 * BLOCK_BYTES)];
    await assert.rejects(startServer([...base, '--kv-offload-disk', path.join(dir, 'nope'), '--kv-offload-disk-size', '1000000']),
                         /--kv-offload-disk \S+nope is not a writable directory/);
    await assert.rejects(startServer([...base, '--kv-offload-disk', dir, '--kv-offload-disk-size', '1000']),
                         /--kv-offload-disk-size 1000 bytes is less than one KV block on disk \(24576 bytes/);
    await assert.rejects(startServer(['--device', 'cpu', '--kv-offload-disk', dir, '--kv-offload-disk-size', '1000000']),
                         /--kv-offload-disk needs a host tier/);
});
