// /v1/completions, /v1/chat/completions, /v1/models, /health, /tokenize, /detokenize through the
// official OpenAI client against `peregrine serve` on the embedded model.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { http, startServer } from './harness.mjs';

let server, client;
before(async () => {
    server = await startServer();
    client = server.client();
});
after(async () => server && (await server.stop()));

const prompt = 'Once upon a time';

async function collect(stream) {
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    return chunks;
}

describe('completions', () => {
    test('non-streaming: text, finish reason, usage', async () => {
        const r = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 12, temperature: 0 });
        assert.match(r.id, /^cmpl-/);
        assert.equal(r.object, 'text_completion');
        assert.equal(r.model, 'stories260K');
        assert.equal(r.choices.length, 1);
        assert.equal(r.choices[0].index, 0);
        assert.ok(r.choices[0].text.length > 0);
        assert.equal(r.choices[0].finish_reason, 'length');
        assert.equal(r.usage.completion_tokens, 12);
        assert.ok(r.usage.prompt_tokens > 0);
        assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
        assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
    });

    test('greedy streaming matches non-streaming; usage chunk last', async () => {
        const whole = await client.completions.create({ prompt, max_tokens: 20, temperature: 0 });
        const chunks = await collect(
            await client.completions.create({
                prompt,
                max_tokens: 20,
                temperature: 0,
                stream: true,
                stream_options: { include_usage: true },
            }),
        );
        const usage = chunks.at(-1);
        assert.deepEqual(usage.choices, []);
        assert.equal(usage.usage.completion_tokens, 20);
        const body = chunks.slice(0, -1);
        assert.ok(body.length > 1);
        for (const c of body) {
            assert.equal(c.object, 'text_completion');
            assert.equal(c.id, usage.id);
            assert.equal(c.usage, null);
        }
        assert.equal(body.map((c) => c.choices[0].text).join(''), whole.choices[0].text);
        assert.equal(body.at(-1).choices[0].finish_reason, 'length');
    });

    test('model may be left out', async () => {
        const r = await http(`${server.url}/v1/completions`, { body: { prompt, max_tokens: 3 } });
        assert.equal(r.status, 200);
        assert.equal(r.json.model, 'stories260K');
    });

    test('n choices, seeded, each with its own index', async () => {
        const r = await client.completions.create({ prompt, max_tokens: 8, n: 3, seed: 7, temperature: 1 });
        assert.deepEqual(
            r.choices.map((c) => c.index),
            [0, 1, 2],
        );
        assert.equal(r.usage.completion_tokens, 24);
        const again = await client.completions.create({ prompt, max_tokens: 8, n: 3, seed: 7, temperature: 1 });
        assert.deepEqual(
            again.choices.map((c) => c.text),
            r.choices.map((c) => c.text),
        );
        const chunks = await collect(
            await client.completions.create({ prompt, max_tokens: 8, n: 2, seed: 7, temperature: 1, stream: true }),
        );
        const texts = ['', ''];
        for (const c of chunks) for (const ch of c.choices) texts[ch.index] += ch.text;
        assert.deepEqual(texts, r.choices.slice(0, 2).map((c) => c.text));
    });

    test('stop strings end the text before them', async () => {
        const base = await client.completions.create({ prompt, max_tokens: 30, temperature: 0 });
        const text = base.choices[0].text;
        const words = text.split(' ').filter((w) => w.length >= 3);
        const stop = ' ' + words[2];
        const cut = text.slice(0, text.indexOf(stop));
        const r = await client.completions.create({ prompt, max_tokens: 30, temperature: 0, stop: [stop, 'zzzz'] });
        assert.equal(r.choices[0].text, cut);
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.equal(r.choices[0].stop_reason, stop);
        const s = await collect(
            await client.completions.create({ prompt, max_tokens: 30, temperature: 0, stop, stream: true }),
        );
        assert.equal(s.map((c) => c.choices[0]?.text ?? '').join(''), cut);
        assert.equal(s.at(-1).choices[0].finish_reason, 'stop');
    });

    test('logprobs in the legacy format', async () => {
        const r = await client.completions.create({ prompt, max_tokens: 10, temperature: 0, logprobs: 3 });
        const lp = r.choices[0].logprobs;
        assert.equal(lp.tokens.length, 10);
        assert.equal(lp.token_logprobs.length, 10);
        assert.equal(lp.top_logprobs.length, 10);
        assert.equal(lp.text_offset.length, 10);
        assert.equal(lp.tokens.join(''), r.choices[0].text);
        for (let i = 0; i < 10; ++i) {
            assert.ok(lp.token_logprobs[i] <= 0);
            const top = lp.top_logprobs[i];
            assert.ok(Object.keys(top).length >= 3);
            // Greedy: the chosen token is the most likely one.
            assert.ok(Math.abs(Math.max(...Object.values(top)) - lp.token_logprobs[i]) < 1e-5);
            if (i > 0) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + lp.tokens[i - 1].length);
        }
        const chunks = await collect(
            await client.completions.create({ prompt, max_tokens: 10, temperature: 0, logprobs: 3, stream: true }),
        );
        const streamed = chunks.flatMap((c) => c.choices[0].logprobs?.tokens ?? []);
        assert.deepEqual(streamed, lp.tokens);
    });

    test('echo puts the prompt first', async () => {
        const r = await client.completions.create({ prompt, max_tokens: 5, temperature: 0, echo: true });
        const plain = await client.completions.create({ prompt, max_tokens: 5, temperature: 0 });
        assert.equal(r.choices[0].text, prompt + plain.choices[0].text);
        const only = await client.completions.create({ prompt, max_tokens: 0, echo: true, logprobs: 1 });
        assert.equal(only.choices[0].text, prompt);
        assert.equal(only.usage.completion_tokens, 0);
        // The first echoed token follows BOS (not echoed): it has a logprob.
        assert.equal(typeof only.choices[0].logprobs.token_logprobs[0], 'number');
        // The echoed tokens are the text's (no "<s>", no SentencePiece space before the first),
        // so they join into it and text_offset points at each.
        const elp = only.choices[0].logprobs;
        assert.notEqual(elp.tokens[0], '<s>');
        assert.equal(elp.tokens.join(''), prompt);
        elp.tokens.forEach((t, i) => assert.equal(prompt.slice(elp.text_offset[i], elp.text_offset[i] + t.length), t));
        const both = await client.completions.create({ prompt, max_tokens: 5, temperature: 0, echo: true, logprobs: 1 });
        assert.equal(both.choices[0].logprobs.tokens.join(''), both.choices[0].text);
        both.choices[0].logprobs.tokens.forEach((t, i) => {
            const at = both.choices[0].logprobs.text_offset[i];
            assert.equal(both.choices[0].text.slice(at, at + t.length), t);
        });
        const chunks = await collect(
            await client.completions.create({ prompt, max_tokens: 5, temperature: 0, echo: true, stream: true }),
        );
        assert.equal(chunks.map((c) => c.choices[0].text).join(''), prompt + plain.choices[0].text);
    });

    test('echo with logprobs: a real logprob for every prompt token after the first', async () => {
        const finite = (v) => typeof v === 'number' && Number.isFinite(v) && v <= 0;
        const ids = (await http(`${server.url}/tokenize`, { body: { prompt } })).json.tokens;
        assert.equal(ids[0], 1);  // BOS: the first prompt token, not echoed (the text has no "<s>")
        const r = await client.completions.create({ prompt, max_tokens: 4, temperature: 0, echo: true, logprobs: 2 });
        const lp = r.choices[0].logprobs;
        assert.equal(lp.tokens.length, ids.length - 1 + 4);
        lp.token_logprobs.forEach((v, i) => assert.ok(finite(v), `token ${i}: ${v}`));
        lp.top_logprobs.forEach((top, i) => {
            assert.ok(Object.keys(top).length >= 2, `top ${i}`);
            assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
            // Greedy over a likely prompt: the alternatives are keyed as the tokens are shown.
            assert.ok(Object.keys(top).length <= 2, JSON.stringify(top));
            for (const v of Object.values(top)) assert.ok(finite(v));
        });
        // Without BOS the first prompt token is echoed, and has no logprob (as OpenAI's).
        const bare = await http(`${server.url}/v1/completions`,
            { body: { prompt, max_tokens: 0, echo: true, logprobs: 0, add_special_tokens: false } });
        assert.equal(bare.status, 200, bare.text);
        const blp = bare.json.choices[0].logprobs;
        assert.equal(blp.tokens.join(''), prompt);
        assert.equal(blp.token_logprobs[0], null);
        assert.equal(blp.top_logprobs[0], null);
        blp.token_logprobs.slice(1).forEach((v) => assert.ok(finite(v)));
        // The prompt only (max_tokens 0): the same numbers, nothing generated.
        const only = await client.completions.create({ prompt, max_tokens: 0, echo: true, logprobs: 2 });
        assert.equal(only.choices[0].text, prompt);
        assert.equal(only.choices[0].finish_reason, 'length');
        assert.equal(only.usage.completion_tokens, 0);
        assert.deepEqual(only.choices[0].logprobs.token_logprobs, lp.token_logprobs.slice(0, ids.length - 1));
        // Streamed: the echo comes first with the same logprobs; n 2 choices each have them.
        const chunks = await collect(await client.completions.create(
            { prompt, max_tokens: 4, temperature: 0, echo: true, logprobs: 2, stream: true, n: 2 }));
        for (const index of [0, 1]) {
            const mine = chunks.filter((c) => c.choices[0]?.index === index);
            assert.deepEqual(mine.flatMap((c) => c.choices[0].logprobs?.token_logprobs ?? []), lp.token_logprobs);
            assert.deepEqual(mine.flatMap((c) => c.choices[0].logprobs?.text_offset ?? []), lp.text_offset);
            assert.equal(mine.map((c) => c.choices[0].text).join(''), r.choices[0].text);
        }
    });

    test('prompt_logprobs (vLLM): per choice on completions, on the response for chat', async () => {
        const ids = (await http(`${server.url}/tokenize`, { body: { prompt } })).json.tokens;
        const r = await http(`${server.url}/v1/completions`,
            { body: { prompt, max_tokens: 3, temperature: 0, prompt_logprobs: 2, n: 2 } });
        assert.equal(r.status, 200, r.text);
        const echoed = await client.completions.create({ prompt, max_tokens: 0, echo: true, logprobs: 2 });
        for (const choice of r.json.choices) {
            const plp = choice.prompt_logprobs;
            assert.equal(plp.length, ids.length);
            assert.equal(plp[0], null);
            for (let i = 1; i < ids.length; ++i) {
                const own = plp[i][String(ids[i])];
                assert.ok(own, `position ${i} lacks its token ${ids[i]}`);
                assert.deepEqual(Object.keys(own).sort(), ['decoded_token', 'logprob', 'rank']);
                assert.ok(own.rank >= 1);
                // The same number the echo reports for this token.
                assert.ok(Math.abs(own.logprob - echoed.choices[0].logprobs.token_logprobs[i - 1]) < 1e-6);
                const entries = Object.values(plp[i]);
                assert.ok(entries.length >= 2 && entries.length <= 3);
                const ranks = entries.map((e) => e.rank);
                assert.ok(ranks.includes(1) && ranks.includes(2), JSON.stringify(plp[i]));
                const best = entries.find((e) => e.rank === 1);
                for (const e of entries) assert.ok(e.logprob <= best.logprob + 1e-6);
            }
            // decoded_token: the token's text (SentencePiece's space before a word included).
            assert.equal(plp[1][String(ids[1])].decoded_token.replace(/^ /, ''), echoed.choices[0].logprobs.tokens[0]);
        }
        assert.equal(r.json.choices[0].logprobs, null);
        const chat = await http(`${server.url}/v1/chat/completions`, { body: {
            messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 2, prompt_logprobs: 1 } });
        assert.equal(chat.status, 200, chat.text);
        assert.equal(chat.json.prompt_logprobs.length, chat.json.usage.prompt_tokens);
        assert.equal(chat.json.prompt_logprobs[0], null);
        assert.ok(chat.json.prompt_logprobs.slice(1).every((p) => p && Object.keys(p).length >= 1));
        // As vLLM: not streamed, and within the logprobs limit.
        for (const [body, why] of [[{ prompt, prompt_logprobs: 1, stream: true }, 'stream'],
            [{ prompt, prompt_logprobs: 21 }, 'limit'], [{ prompt, prompt_logprobs: -1 }, 'negative']]) {
            const bad = await http(`${server.url}/v1/completions`, { body });
            assert.equal(bad.status, 400, why);
            assert.equal(bad.json.error.param, 'prompt_logprobs', why);
        }
    });

    test('prompt as token ids, a list of strings, a list of id lists', async () => {
        const tok = await http(`${server.url}/tokenize`, { body: { prompt } });
        assert.equal(tok.status, 200);
        const ids = tok.json.tokens;
        assert.equal(tok.json.count, ids.length);
        assert.equal(tok.json.max_model_len, 512);
        const detok = await http(`${server.url}/detokenize`, { body: { tokens: ids } });
        assert.equal(detok.json.prompt, prompt);

        const byText = await client.completions.create({ prompt, max_tokens: 8, temperature: 0 });
        const byIds = await client.completions.create({ prompt: ids, max_tokens: 8, temperature: 0 });
        assert.equal(byIds.choices[0].text, byText.choices[0].text);
        const two = await client.completions.create({ prompt: [prompt, 'Tom had a dog'], max_tokens: 8, temperature: 0 });
        assert.deepEqual(
            two.choices.map((c) => c.index),
            [0, 1],
        );
        assert.equal(two.choices[0].text, byText.choices[0].text);
        const lists = await client.completions.create({ prompt: [ids, ids], max_tokens: 8, temperature: 0, n: 2 });
        assert.equal(lists.choices.length, 4);
        for (const c of lists.choices) assert.equal(c.text, byText.choices[0].text);
        assert.equal(lists.usage.prompt_tokens, 2 * ids.length);
    });

    test('the same long prompt twice: the second is served from the prefix cache', async () => {
        const long = 'Once upon a time, there was a little girl named Lily. She liked to play in the park with her dog. '.repeat(4);
        const first = await client.completions.create({ prompt: long, max_tokens: 4, temperature: 0 });
        const second = await client.completions.create({ prompt: long, max_tokens: 4, temperature: 0 });
        assert.ok(first.usage.prompt_tokens > 64);
        assert.ok(second.usage.prompt_tokens_details.cached_tokens >= 64, JSON.stringify(second.usage));
        assert.equal(second.choices[0].text, first.choices[0].text);
    });

    test('concurrent greedy requests get the text each gets alone', async () => {
        const alone = await client.completions.create({ prompt, max_tokens: 24, temperature: 0 });
        const one = async (i) => {
            const req = { prompt, max_tokens: 24, temperature: 0 };
            if (i % 2) return (await client.completions.create(req)).choices[0].text;
            const chunks = await collect(await client.completions.create({ ...req, stream: true }));
            return chunks.map((c) => c.choices[0].text).join('');
        };
        const texts = await Promise.all(Array.from({ length: 48 }, (_, i) => one(i)));
        for (const t of texts) assert.equal(t, alone.choices[0].text);
    });
});

describe('chat completions', () => {
    const messages = [
        { role: 'system', content: 'A story.' },
        { role: 'user', content: 'Lily had a red ball.' },
    ];

    test('non-streaming', async () => {
        const r = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 16, temperature: 0 });
        assert.match(r.id, /^chatcmpl-/);
        assert.equal(r.object, 'chat.completion');
        assert.equal(r.choices[0].message.role, 'assistant');
        assert.ok(r.choices[0].message.content.length > 0);
        assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
        assert.ok(r.usage.prompt_tokens > 0);
    });

    test('streaming: role first, then content, then the finish reason', async () => {
        const whole = await client.chat.completions.create({ messages, max_completion_tokens: 16, temperature: 0 });
        const chunks = await collect(
            await client.chat.completions.create({
                messages,
                max_completion_tokens: 16,
                temperature: 0,
                stream: true,
                stream_options: { include_usage: true },
            }),
        );
        assert.equal(chunks[0].object, 'chat.completion.chunk');
        assert.equal(chunks[0].choices[0].delta.role, 'assistant');
        const usage = chunks.at(-1);
        assert.deepEqual(usage.choices, []);
        assert.equal(usage.usage.completion_tokens, whole.usage.completion_tokens);
        const content = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
        assert.equal(content, whole.choices[0].message.content);
        const last = chunks.at(-2).choices[0];
        assert.deepEqual(last.delta, {});
        assert.equal(last.finish_reason, whole.choices[0].finish_reason);
    });

    test('content given as text parts', async () => {
        const a = await client.chat.completions.create({ messages, max_tokens: 8, temperature: 0 });
        const b = await client.chat.completions.create({
            messages: [
                messages[0],
                { role: 'user', content: [{ type: 'text', text: 'Lily had ' }, { type: 'text', text: 'a red ball.' }] },
            ],
            max_tokens: 8,
            temperature: 0,
        });
        assert.equal(b.choices[0].message.content, a.choices[0].message.content);
    });

    test('logprobs with top_logprobs', async () => {
        const r = await client.chat.completions.create({
            messages,
            max_tokens: 6,
            temperature: 0,
            logprobs: true,
            top_logprobs: 3,
        });
        const content = r.choices[0].logprobs.content;
        assert.equal(content.length, r.usage.completion_tokens);
        for (const e of content) {
            assert.equal(typeof e.token, 'string');
            assert.ok(e.logprob <= 0);
            assert.deepEqual(e.bytes, [...Buffer.from(e.token)]);
            assert.equal(e.top_logprobs.length, 3);
            assert.equal(e.top_logprobs[0].token, e.token);
        }
        assert.equal(content.map((e) => e.token).join(''), r.choices[0].message.content);
    });

    test('n choices in a stream each start with the role', async () => {
        const chunks = await collect(
            await client.chat.completions.create({ messages, max_tokens: 5, n: 2, seed: 1, stream: true }),
        );
        const roles = chunks.filter((c) => c.choices[0]?.delta.role === 'assistant').map((c) => c.choices[0].index);
        assert.deepEqual(roles.sort(), [0, 1]);
        const finished = chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0].index);
        assert.deepEqual(finished.sort(), [0, 1]);
    });
});

describe('other endpoints', () => {
    test('/v1/models', async () => {
        const list = await client.models.list();
        const ids = [];
        for await (const m of list) ids.push(m.id);
        assert.deepEqual(ids, ['stories260K']);
        const one = await client.models.retrieve('stories260K');
        assert.equal(one.object, 'model');
        assert.equal(one.owned_by, 'peregrine');
    });

    test('/health', async () => {
        const r = await http(`${server.url}/health`, { method: 'GET' });
        assert.equal(r.status, 200);
        assert.equal(r.json.status, 'ok');
        assert.equal(r.json.model, 'stories260K');
        if ('healthy_replicas' in r.json) {  // serve --data-parallel-size: the router's own health
            assert.ok(r.json.healthy_replicas >= 1);
            return;
        }
        for (const k of ['uptime_s', 'requests_served', 'running', 'waiting', 'kv_cache_usage',
            'prefix_cache_hit_rate', 'memory_rss_bytes'])
            assert.ok(k in r.json, k);
        assert.ok(r.json.requests_served > 0);
    });

    test('/tokenize with messages renders the chat template', async () => {
        const r = await http(`${server.url}/tokenize`, {
            body: { messages: [{ role: 'user', content: 'Hi' }], return_token_strs: true },
        });
        assert.equal(r.status, 200);
        assert.equal(r.json.tokens[0], 1);  // <s> from the template, parsed as the special token
        assert.equal(r.json.token_strs[0], '<s>');
    });
});
