// Issue #25's defects and the context-and-template flags, through `peregrine serve` and the
// official client: the context length is enforced and reported (no silent cut), the model's
// generation_config.json gives request defaults, per-request chat templates work and unknown
// fields are refused, the tokenizer is checked before slow work, and the small endpoints.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, describe, test } from 'node:test';

import { apiError, http, startServer } from './harness.mjs';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const stories = path.join(repo, 'models', 'stories260K');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-api-surface-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

// stories260K's KV cache: 5 layers x (K + V) x 4 heads x 8 dims x 4 bytes = 1280 bytes a token,
// so 81920 bytes hold 64 tokens (4 blocks of 16).
const KV_64_TOKENS = '81920';

// Runs `peregrine ARGS` to its exit: {code, output, seconds}.
function runToExit(args, timeoutMs = 60000) {
    return new Promise((resolve) => {
        const t0 = Date.now();
        const proc = spawn(process.env.PG_BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] });
        let output = '';
        proc.stdout.on('data', (d) => (output += d));
        proc.stderr.on('data', (d) => (output += d));
        const timer = setTimeout(() => proc.kill('SIGKILL'), timeoutMs);
        proc.on('exit', (code) => {
            clearTimeout(timer);
            resolve({ code, output, seconds: (Date.now() - t0) / 1000 });
        });
    });
}

// A copy of stories260K without tokenizer_config.json: no chat template.
function modelWithoutTemplate() {
    const dir = path.join(tmp, 'no-template');
    fs.mkdirSync(dir, { recursive: true });
    for (const f of ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json'])
        fs.copyFileSync(path.join(stories, f), path.join(dir, f));
    return dir;
}

describe('context length (defect 1)', () => {
    test('a KV cache smaller than the context lowers max_model_len and refuses longer requests', async () => {
        const server = await startServer(['--kv-cache-memory', KV_64_TOKENS]);
        try {
            assert.match(server.log(), /warning: the KV cache holds 64 tokens.*max_model_len lowered to 64/);
            const models = await http(`${server.url}/v1/models`, { method: 'GET' });
            assert.equal(models.json.data[0].max_model_len, 64);
            const client = server.client();
            const e = await apiError(() =>
                client.completions.create({ prompt: 'Once upon a time', max_tokens: 200, temperature: 0 }),
            );
            assert.equal(e.status, 400);
            assert.equal(e.code, 'context_length_exceeded');
            assert.equal(e.param, 'max_tokens');
            assert.match(
                e.message,
                /This model's maximum context length is 64 tokens\. However, you requested (\d+) tokens \((\d+) in the messages, 200 in the completion\)\. Please reduce the length of the messages or completion\.$/,
            );
            const [, total, prompt] = e.message.match(/requested (\d+) tokens \((\d+)/);
            assert.equal(Number(total), Number(prompt) + 200);
            // Chat without max_tokens may fill the context; with it, the same check.
            const chat = await client.chat.completions.create({
                messages: [{ role: 'user', content: 'Once' }],
                temperature: 0,
            });
            assert.ok(chat.usage.prompt_tokens + chat.usage.completion_tokens <= 64);
            const ce = await apiError(() =>
                client.chat.completions.create({ messages: [{ role: 'user', content: 'Once' }], max_tokens: 100 }),
            );
            assert.equal(ce.status, 400);
            assert.match(ce.message, /maximum context length is 64 tokens/);
            // What fits is answered in full.
            const ok = await client.completions.create({ prompt: 'Once', max_tokens: 20, temperature: 0, ignore_eos: true });
            assert.equal(ok.usage.completion_tokens, 20);
        } finally {
            await server.stop();
        }
    });

    test('--max-model-len that one sequence cannot fit is refused at start, naming the flags', async () => {
        const r = await runToExit(['serve', '--port', '0', '--kv-cache-memory', KV_64_TOKENS, '--max-model-len', '512']);
        assert.notEqual(r.code, 0, r.output);
        assert.match(r.output, /--max-model-len 512/);
        assert.match(r.output, /largest max model length is 64/);
        assert.match(r.output, /--kv-cache-memory/);
        assert.match(r.output, /--gpu-memory-utilization/);
        const long = await runToExit(['serve', '--port', '0', '--max-model-len', '4096']);
        assert.notEqual(long.code, 0);
        assert.match(long.output, /longer than the model's context \(512 tokens/);
    });

    test('--max-model-len below the context is reported and enforced', async () => {
        const server = await startServer(['--max-model-len', '32']);
        try {
            const models = await http(`${server.url}/v1/models`, { method: 'GET' });
            assert.equal(models.json.data[0].max_model_len, 32);
            const e = await apiError(() => server.client().completions.create({ prompt: 'Once', max_tokens: 40 }));
            assert.equal(e.status, 400);
            assert.match(e.message, /maximum context length is 32 tokens/);
        } finally {
            await server.stop();
        }
    });
});

describe('generation_config.json defaults (defect 2)', () => {
    test('requests without sampling fields take the defaults of --generation-config PATH', async () => {
        const dir = path.join(tmp, 'greedy-config');
        fs.mkdirSync(dir, { recursive: true });
        fs.writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ temperature: 0.0, top_k: 5 }));
        const server = await startServer(['--generation-config', dir]);
        try {
            assert.match(server.log(), /sampling defaults \([^)]*greedy-config\): temperature=0 top_k=5/);
            const client = server.client();
            const body = { prompt: 'Once upon a time', max_tokens: 24, ignore_eos: true };
            const greedy = await client.completions.create({ ...body, temperature: 0 });
            for (let i = 0; i < 3; ++i) {
                const r = await client.completions.create(body);  // temperature 0 from the file
                assert.equal(r.choices[0].text, greedy.choices[0].text);
            }
        } finally {
            await server.stop();
        }
        const vllm = await startServer(['--generation-config', 'vllm']);
        await vllm.stop();
        assert.match(vllm.log(), /sampling defaults \(vllm\): none/);
        const bad = await runToExit(['serve', '--port', '0', '--generation-config', path.join(tmp, 'absent')]);
        assert.notEqual(bad.code, 0);
        assert.match(bad.output, /no generation_config\.json there/);
    });
});

describe('chat templates and request fields (defect 3, flags)', () => {
    test('a request chat_template with chat_template_kwargs is rendered', async () => {
        const server = await startServer();
        try {
            const client = server.client();
            const ask = (n) =>
                client.chat.completions.create({
                    messages: [{ role: 'user', content: 'Once' }],
                    max_tokens: 1,
                    chat_template: "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{{ ' upon' * n }}",
                    chat_template_kwargs: { n },
                });
            const one = await ask(1);
            const ten = await ask(10);
            assert.ok(ten.usage.prompt_tokens >= one.usage.prompt_tokens + 9, `${one.usage.prompt_tokens} ${ten.usage.prompt_tokens}`);
            const tok = await http(`${server.url}/tokenize`, {
                body: { messages: [{ role: 'user', content: 'Once' }], chat_template: "{{ ' upon' * n }}", chat_template_kwargs: { n: 4 } },
            });
            assert.equal(tok.status, 200, tok.text);
            assert.ok(tok.json.count >= 4, tok.text);
            const bad = await apiError(() =>
                client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], chat_template: '{% for %}' }),
            );
            assert.equal(bad.status, 400);
            assert.equal(bad.param, 'chat_template');
        } finally {
            await server.stop();
        }
    });

    test('fields the server does not honour get a 400 naming them', async () => {
        const server = await startServer();
        try {
            const cases = [
                ['/v1/completions', { prompt: 'Once', max_tokens: 2, frobnicate: 1 }, 'frobnicate'],
                ['/v1/completions', { prompt: 'Once', messages: [] }, 'messages'],
                ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], echo: true }, 'echo'],
                ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], store: true }, 'store'],
                ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], reasoning_effort: 'low' }, 'reasoning_effort'],
                ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], audio: {} }, 'audio'],
            ];
            for (const [route, body, field] of cases) {
                const r = await http(`${server.url}${route}`, { body });
                assert.equal(r.status, 400, `${field}: ${r.text}`);
                assert.equal(r.json.error.param, field);
                assert.match(r.json.error.message, new RegExp(field));
            }
            // Accepted: what OpenAI's SDKs send that changes nothing here.
            const ok = await http(`${server.url}/v1/chat/completions`, {
                body: { messages: [{ role: 'user', content: 'x' }], max_tokens: 1, store: false, user: 'u', service_tier: 'auto' },
            });
            assert.equal(ok.status, 200, ok.text);
        } finally {
            await server.stop();
        }
    });

    test('--chat-template lets a model without one chat; content format auto / openai', async () => {
        const model = modelWithoutTemplate();
        const plain = await startServer(['--model', model]);
        try {
            const e = await apiError(() => plain.client().chat.completions.create({ messages: [{ role: 'user', content: 'x' }] }));
            assert.equal(e.status, 400);
            assert.match(e.message, /--chat-template/);
        } finally {
            await plain.stop();
        }
        const string = await startServer(['--model', model, '--chat-template', "{% for m in messages %}{{ m['content'] }}{% endfor %}"]);
        try {
            assert.match(string.log(), /chat template: --chat-template, message content as a string/);
            const r = await string.client().chat.completions.create({
                messages: [{ role: 'user', content: [{ type: 'text', text: 'Once upon' }, { type: 'text', text: ' a time' }] }],
                max_tokens: 2,
            });
            assert.ok(r.usage.prompt_tokens >= 3);
        } finally {
            await string.stop();
        }
        const file = path.join(tmp, 'parts.jinja');
        fs.writeFileSync(file, "{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endfor %}");
        const parts = await startServer(['--model', model, '--chat-template', file]);
        try {
            assert.match(parts.log(), /message content as a list of parts \(openai\)/);
            const r = await parts.client().chat.completions.create({ messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 2 });
            assert.ok(r.usage.prompt_tokens >= 3);
        } finally {
            await parts.stop();
        }
        const forced = await runToExit(['serve', '--port', '0', '--chat-template-content-format', 'xml']);
        assert.notEqual(forced.code, 0);
        const missing = await runToExit(['serve', '--port', '0', '--chat-template', path.join(tmp, 'absent.jinja')]);
        assert.notEqual(missing.code, 0);
        assert.match(missing.output, /no such file, and not a template/);
    });
});

describe('start-up (defects 4, 5) and flags', () => {
    test('the try: line double-quotes the Authorization header', async () => {
        const server = await startServer(['--api-key', 'k']);
        await server.stop();
        assert.match(server.log(), /^try: .* -H "Authorization: Bearer \$PEREGRINE_API_KEY"/m);
    });

    test('a model without a tokenizer fails at once, naming --tokenizer; --tokenizer supplies one', async () => {
        const r = await runToExit(['serve', '--port', '0', '--model', path.join(repo, 'bench/models/llama-3.2-1b'), '--load-format', 'dummy'], 30000);
        assert.notEqual(r.code, 0, r.output);
        assert.match(r.output, /no tokenizer\.json.*--tokenizer/);
        assert.ok(r.seconds < 10, `took ${r.seconds} s`);
        // A shape of our own, dummy weights, stories260K's tokenizer.
        const dir = path.join(tmp, 'tiny-shape');
        fs.mkdirSync(dir, { recursive: true });
        const config = JSON.parse(fs.readFileSync(path.join(stories, 'config.json')));
        Object.assign(config, { hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8, vocab_size: 600 });
        fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
        for (const tok of [stories, path.join(stories, 'tokenizer.json')]) {
            const server = await startServer(['--model', dir, '--load-format', 'dummy', '--tokenizer', tok]);
            try {
                const c = await server.client().completions.create({ prompt: 'Once upon a time', max_tokens: 8, ignore_eos: true });
                assert.equal(c.usage.completion_tokens, 8);
            } finally {
                await server.stop();
            }
        }
        const bad = await runToExit(['serve', '--port', '0', '--model', dir, '--load-format', 'dummy', '--tokenizer', path.join(tmp, 'absent')]);
        assert.notEqual(bad.code, 0);
        assert.match(bad.output, /--tokenizer: .*no such file/);
    });

    test('--seed makes unseeded requests reproducible across runs', async () => {
        const texts = [];
        for (let run = 0; run < 2; ++run) {
            const server = await startServer(['--seed', '7']);
            try {
                const client = server.client();
                const out = [];
                for (let i = 0; i < 2; ++i)
                    out.push((await client.completions.create({ prompt: 'Once', max_tokens: 16, temperature: 1, ignore_eos: true })).choices[0].text);
                texts.push(out);
            } finally {
                await server.stop();
            }
        }
        assert.deepEqual(texts[0], texts[1]);
    });

    test('--dtype half is parsed and answered with a clear message', async () => {
        const r = await runToExit(['serve', '--port', '0', '--device', 'cpu', '--dtype', 'half']);
        assert.notEqual(r.code, 0);
        assert.match(r.output, /--dtype half: the CPU backend has no float16/);
    });

    test('positional model, /version, /ping, /v1/models/{id}', async () => {
        const server = await startServer([stories]);
        try {
            assert.match(server.log(), /serving 'stories260K'/);
            const v = await http(`${server.url}/version`, { method: 'GET' });
            assert.equal(v.status, 200);
            assert.equal(typeof v.json.version, 'string');
            const ping = await http(`${server.url}/ping`, { method: 'GET' });
            assert.equal(ping.status, 200);
            const one = await server.client().models.retrieve('stories260K');
            assert.equal(one.id, 'stories260K');
            const e = await apiError(() => server.client().models.retrieve('nope'));
            assert.equal(e.status, 404);
            assert.equal(e.code, 'model_not_found');
        } finally {
            await server.stop();
        }
    });
    // A Hugging Face repo id read from the local cache (HF_HOME/hub/models--org--name, the
    // snapshot refs/main names), served under that id; absent: a message saying how to get it.
    test('a Hugging Face repo id from the cache; absent, how to download it', async () => {
        const home = path.join(tmp, 'hf-home');
        const repoDir = path.join(home, 'hub', 'models--tiny-org--stories');
        const snap = path.join(repoDir, 'snapshots', 'abc123');
        fs.mkdirSync(snap, { recursive: true });
        fs.mkdirSync(path.join(repoDir, 'refs'), { recursive: true });
        fs.writeFileSync(path.join(repoDir, 'refs', 'main'), 'abc123');
        for (const f of fs.readdirSync(stories)) fs.copyFileSync(path.join(stories, f), path.join(snap, f));
        const saved = process.env.HF_HOME;
        process.env.HF_HOME = home;
        try {
            const server = await startServer(['tiny-org/stories', '--device', 'cpu']);
            try {
                assert.match(server.log(), /serving 'tiny-org\/stories'/);
                assert.match(server.log(), /snapshots\/abc123/);
                const r = await server.client().completions.create({ model: 'tiny-org/stories', prompt: 'Once upon a time',
                    max_tokens: 8, temperature: 0 });
                assert.ok(r.choices[0].text.length > 0);
            } finally {
                await server.stop();
            }
            const missing = await runToExit(['serve', '--port', '0', '--device', 'cpu', 'tiny-org/absent']);
            assert.notEqual(missing.code, 0);
            assert.match(missing.output, /'tiny-org\/absent' is neither a local path nor in the Hugging Face cache/);
            assert.match(missing.output, /hf download tiny-org\/absent/);
        } finally {
            if (saved === undefined) delete process.env.HF_HOME;
            else process.env.HF_HOME = saved;
        }
    });
    test('--root-path: the proxy prefix is served, and paths without it still are', async () => {
        const server = await startServer(['--device', 'cpu', '--root-path', '/llm/']);
        try {
            for (const p of ['/llm/v1/models', '/v1/models', '/llm/health'])
                assert.equal((await http(`${server.url}${p}`, { method: 'GET' })).status, 200, p);
            assert.equal((await http(`${server.url}/llmx/v1/models`, { method: 'GET' })).status, 404);
            const r = await http(`${server.url}/llm/v1/completions`,
                { body: { prompt: 'Once upon a time', max_tokens: 4, temperature: 0 } });
            assert.equal(r.status, 200);
            assert.ok(r.json.choices[0].text.length > 0);
        } finally {
            await server.stop();
        }
    });
});
