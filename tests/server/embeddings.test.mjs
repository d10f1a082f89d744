// POST /v1/embeddings (`serve --task embed`) with real clients: the openai SDK (float and its
// default base64), LangChain JS's OpenAIEmbeddings and the Vercel AI SDK's embed / embedMany,
// against a fixture model laid over with sentence-transformers files (tests/data/embeddings),
// checked against the golden vectors sentence-transformers computed; then the bad inputs and the
// wrong-server cases with OpenAI error bodies.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';

import { http, startServer } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const { OpenAIEmbeddings } = require('@langchain/openai');
const { embed, embedMany } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');

const data = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'data');
const CASE = 'qwen3-tiny-last';
const golden = JSON.parse(fs.readFileSync(path.join(data, 'embeddings', `${CASE}.golden.json`), 'utf8'));
// The bounds of tests/engine/test_embeddings.cc: float32 both sides, another summation order.
const MIN_COSINE = 1 - 1e-4;
const MAX_ABS_DIFF = 5e-6;
const MAX_LEN = 64;  // the longest golden input has 62 tokens

// The case's folder in the build tree: the fixture model's files, then the case's files over them.
function caseFolder() {
    const dir = path.resolve(process.env.PG_NODE_MODULES, '..', 'test-data', 'embeddings-serve', CASE);
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(dir, { recursive: true });
    const model = path.join(data, golden.model);
    for (const f of fs.readdirSync(model)) {
        if (fs.statSync(path.join(model, f)).isFile()) fs.copyFileSync(path.join(model, f), path.join(dir, f));
    }
    fs.cpSync(path.join(data, 'embeddings', CASE), dir, { recursive: true });
    return dir;
}

const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
function assertClose(ours, ref, what) {
    assert.equal(ours.length, ref.length, `${what}: ${ours.length} rows`);
    for (let i = 0; i < ref.length; i++) {
        const a = Array.from(ours[i]);
        assert.equal(a.length, ref[i].length, `${what} row ${i}: ${a.length} values`);
        const cos = dot(a, ref[i]) / Math.sqrt(dot(a, a) * dot(ref[i], ref[i]));
        const maxDiff = Math.max(...a.map((x, c) => Math.abs(x - ref[i][c])));
        assert.ok(cos >= MIN_COSINE, `${what} row ${i}: cosine ${cos}`);
        assert.ok(maxDiff <= MAX_ABS_DIFF, `${what} row ${i}: max |diff| ${maxDiff}`);
    }
}

let server;
let url;
before(async () => {
    server = await startServer(['--model', caseFolder(), '--task', 'embed', '--served-model-name', 'embedder',
        '--max-model-len', String(MAX_LEN), '--access-log']);
    url = server.url;
});
after(async () => server && (await server.stop()));

describe('openai SDK', () => {
    test('float: every input, in order, with the usage', async () => {
        const res = await server.client().embeddings.create({ model: 'embedder', input: golden.inputs,
            encoding_format: 'float' });
        assert.equal(res.object, 'list');
        assert.equal(res.model, 'embedder');
        res.data.forEach((d, i) => {
            assert.equal(d.object, 'embedding');
            assert.equal(d.index, i);
        });
        assertClose(res.data.map((d) => d.embedding), golden.embeddings, 'float');
        const tokens = golden.token_ids.reduce((s, ids) => s + ids.length, 0);
        assert.deepEqual(res.usage, { prompt_tokens: tokens, total_tokens: tokens });
    });

    test('the default encoding (base64, decoded by the SDK)', async () => {
        const res = await server.client().embeddings.create({ model: 'embedder', input: golden.inputs });
        assertClose(res.data.map((d) => d.embedding), golden.embeddings, 'base64');
    });

    test('base64 on the wire is little-endian float32', async () => {
        const r = await http(`${url}/v1/embeddings`, { body: { input: golden.inputs[0], encoding_format: 'base64' } });
        assert.equal(r.status, 200, r.text);
        const bytes = Buffer.from(r.json.data[0].embedding, 'base64');
        const v = Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(4 * i));
        assertClose([v], [golden.embeddings[0]], 'raw base64');
    });

    test('token ids: a list of lists and a single list', async () => {
        const client = server.client();
        const many = await client.embeddings.create({ input: golden.token_ids, encoding_format: 'float' });
        assertClose(many.data.map((d) => d.embedding), golden.embeddings, 'ids');
        const one = await client.embeddings.create({ input: golden.token_ids[1], encoding_format: 'float' });
        assertClose([one.data[0].embedding], [golden.embeddings[1]], 'one id list');
    });

    test('dimensions: the first N values, normalised again', async () => {
        const res = await server.client().embeddings.create({ input: golden.inputs, dimensions: 16,
            encoding_format: 'float', user: 'someone' });
        const want = golden.embeddings.map((g) => {
            const v = g.slice(0, 16);
            const n = Math.sqrt(dot(v, v));
            return v.map((x) => x / n);
        });
        assertClose(res.data.map((d) => d.embedding), want, 'dimensions 16');
    });

    test('concurrent requests batch together and answer alike', async () => {
        const client = server.client();
        const res = await Promise.all(golden.inputs.map((input) =>
            client.embeddings.create({ input, encoding_format: 'float' })));
        assertClose(res.map((r) => r.data[0].embedding), golden.embeddings, 'concurrent');
    });
});

describe('LangChain JS OpenAIEmbeddings', () => {
    const embeddings = () => new OpenAIEmbeddings({ model: 'embedder', apiKey: 'none', maxRetries: 0,
        configuration: { baseURL: `${url}/v1` } });

    test('embedQuery', async () => {
        assertClose([await embeddings().embedQuery(golden.inputs[1])], [golden.embeddings[1]], 'embedQuery');
    });

    test('embedDocuments', async () => {
        assertClose(await embeddings().embedDocuments(golden.inputs), golden.embeddings, 'embedDocuments');
    });
});

describe('Vercel AI SDK', () => {
    const provider = () => createOpenAI({ baseURL: `${url}/v1`, apiKey: 'none' });
    const model = () => (provider().textEmbeddingModel ?? provider().embedding)('embedder');

    test('embed', async () => {
        const { embedding, usage } = await embed({ model: model(), value: golden.inputs[2], maxRetries: 0 });
        assertClose([embedding], [golden.embeddings[2]], 'embed');
        assert.equal(usage.tokens, golden.token_ids[2].length);
    });

    test('embedMany', async () => {
        const { embeddings } = await embedMany({ model: model(), values: golden.inputs, maxRetries: 0 });
        assertClose(embeddings, golden.embeddings, 'embedMany');
    });
});

describe('bad requests: 400 with an OpenAI error body', () => {
    async function bad(body, param, pattern) {
        const r = await http(`${url}/v1/embeddings`, { body });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.type, 'invalid_request_error');
        assert.equal(r.json.error.param, param, r.text);
        assert.match(r.json.error.message, pattern);
    }
    test('missing, empty or mistyped input', async () => {
        await bad({}, 'input', /'input' is required/);
        await bad({ input: '' }, 'input', /empty string/);
        await bad({ input: [] }, 'input', /must not be empty/);
        await bad({ input: ['a', ''] }, 'input', /empty string/);
        await bad({ input: [[]] }, 'input', /empty list of token ids/);
        await bad({ input: 5 }, 'input', /must be a string/);
        await bad({ input: [{ text: 'a' }] }, 'input', /list items/);
        await bad({ input: [1, 'a'] }, 'input', /token ids must be integers/);
    });
    test('token ids outside the vocabulary', async () => {
        await bad({ input: [[1, 99999]] }, 'input', /token id 99999 is outside the vocabulary/);
        await bad({ input: [-1] }, 'input', /out of range/);
    });
    test('an input longer than the context names the numbers', async () => {
        const ids = Array.from({ length: MAX_LEN + 1 }, () => 300);
        await bad({ input: [ids] }, 'input',
            new RegExp(`maximum context length is ${MAX_LEN} tokens. However, you requested ${MAX_LEN + 1} tokens`));
        const r = await http(`${url}/v1/embeddings`, { body: { input: [ids.slice(1)], encoding_format: 'float' } });
        assert.equal(r.status, 200, r.text);  // exactly the context fits
    });
    test('dimensions and encoding_format', async () => {
        await bad({ input: 'a', dimensions: 0 }, 'dimensions', /at least 1/);
        await bad({ input: 'a', dimensions: 65 }, 'dimensions', /at most the model's embedding size 64/);
        await bad({ input: 'a', encoding_format: 'hex' }, 'encoding_format', /"float" or "base64"/);
    });
    test('an unknown model is 404', async () => {
        const r = await http(`${url}/v1/embeddings`, { body: { input: 'a', model: 'other' } });
        assert.equal(r.status, 404, r.text);
        assert.equal(r.json.error.code, 'model_not_found');
    });
    test('completions and chat on an embedding server', async () => {
        for (const [route, body] of [['completions', { prompt: 'a' }],
            ['chat/completions', { messages: [{ role: 'user', content: 'a' }] }]]) {
            const r = await http(`${url}/v1/${route}`, { body });
            assert.equal(r.status, 400, r.text);
            assert.match(r.json.error.message, /served for embeddings \(--task embed\).*\/v1\/embeddings/);
        }
    });
    test('the access log and metrics count embedding requests', async () => {
        const m = await http(`${url}/metrics`, { method: 'GET' });
        assert.match(m.text, /peregrine:request_success_total\{[^}]*finished_reason="stop"[^}]*\} [1-9]/);
        assert.match(server.log(), /"path":"\/v1\/embeddings"/);
    });
});

describe('a generating server', () => {
    test('answers /v1/embeddings with 400 saying how to start an embedding server', async () => {
        const gen = await startServer([]);
        try {
            const r = await http(`${gen.url}/v1/embeddings`, { body: { input: 'hello' } });
            assert.equal(r.status, 400, r.text);
            assert.equal(r.json.error.code, 'model_does_not_support_embeddings');
            assert.match(r.json.error.message, /does not support embeddings.*--task embed/);
        } finally {
            await gen.stop();
        }
    });
});
