// Structured output through `peregrine serve` on the embedded model, with the official `openai`
// client: response_format json_schema over the schema corpus (tests/data/json-schemas, 121
// schemas), each answer checked by a real JSON Schema validator (ajv), greedy and sampled;
// json_object, vLLM's guided_* fields and structured_outputs; streaming; errors naming the field.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { http, startServer } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const Ajv2020 = require('ajv/dist/2020').default;
const AjvDraft04 = require('ajv-draft-04').default;
const addFormats = require('ajv-formats');

const here = path.dirname(fileURLToPath(import.meta.url));
const corpus = JSON.parse(fs.readFileSync(path.join(here, '..', 'data', 'json-schemas', 'corpus.json'), 'utf8'));

let server, client;
before(async () => {
    server = await startServer();
    client = server.client();
});
after(async () => server && (await server.stop()));

// Runs `fn` over `items`, `width` at a time.
async function pool(items, width, fn) {
    const out = new Array(items.length);
    let next = 0;
    await Promise.all(Array.from({ length: width }, async () => {
        while (next < items.length) {
            const i = next++;
            out[i] = await fn(items[i], i);
        }
    }));
    return out;
}

const messages = [{ role: 'user', content: 'Tell me about it.' }];

describe('structured output', () => {
    // The embedded model (512-token context) knows no JSON: inside an unbounded string it would
    // write on past max_tokens. The grammar closes the structure within the budget instead
    // (src/grammar/matcher.h: tokens_left), so every answer ends by itself ("stop") and
    // validates; how many the budget narrowed is not visible here (the grammar tests count it).
    test('json_schema: every answer of the corpus validates (ajv), greedy and temperature 1', async () => {
        // Draft 2020-12 (prefixItems), except the schemas written in draft 4's boolean
        // exclusiveMinimum / exclusiveMaximum.
        const ajv2020 = addFormats(new Ajv2020({ strict: false, allErrors: true }));
        const ajv04 = addFormats(new AjvDraft04({ strict: false, allErrors: true }));
        const draft04 = (schema) => /"exclusive(Minimum|Maximum)":(true|false)/.test(JSON.stringify(schema)) ||
            String(schema.$schema ?? '').includes('draft-04');
        const failures = [];
        let valid = 0;
        // Under the sanitizers (PG_SANITIZED=1: 197 s for this file) T=1 only; the Release run walks both.
        const temperatures = process.env.PG_SANITIZED === '1' ? [1] : [0, 1];
        for (const temperature of temperatures) {
            await pool(corpus, 6, async (entry, i) => {
                const r = await client.chat.completions.create({
                    model: 'stories260K', messages, temperature, seed: i, max_tokens: 480,
                    response_format: { type: 'json_schema', json_schema: { name: entry.name, schema: entry.schema, strict: true } },
                });
                const text = r.choices[0].message.content;
                const where = `${entry.name} (T=${temperature}, ${r.usage.completion_tokens} tokens)`;
                if (r.choices[0].finish_reason !== 'stop')
                    failures.push(`${where}: finish_reason ${r.choices[0].finish_reason}: ${text.slice(0, 200)}`);
                let value;
                try {
                    value = JSON.parse(text);
                } catch (e) {
                    failures.push(`${where}: not JSON: ${text.slice(0, 200)}`);
                    return;
                }
                const ajv = draft04(entry.schema) ? ajv04 : ajv2020;
                const validate = ajv.compile(entry.schema);
                if (!validate(value))
                    failures.push(`${where}: ${ajv.errorsText(validate.errors)}: ${text.slice(0, 200)}`);
                else
                    valid++;
            });
        }
        console.log(`json_schema corpus: ${valid} of ${corpus.length * temperatures.length} answers ` +
                    `(T=${temperatures.join(', ')}) end by themselves within max_tokens and validate (ajv)`);
        assert.deepEqual(failures, []);
        assert.equal(valid, corpus.length * temperatures.length);
    });

    test('json_object, guided_regex / guided_choice / guided_grammar, structured_outputs, streaming', async () => {
        const obj = await client.chat.completions.create({
            model: 'stories260K', messages, temperature: 0, max_tokens: 480, response_format: { type: 'json_object' } });
        assert.equal(obj.choices[0].finish_reason, 'stop');
        assert.equal(typeof JSON.parse(obj.choices[0].message.content), 'object');

        const re = await client.completions.create({
            model: 'stories260K', prompt: 'Once upon a time', temperature: 1, seed: 3, max_tokens: 50,
            guided_regex: '(red|green|blue) [0-9]{2}' });
        assert.match(re.choices[0].text, /^(red|green|blue) [0-9]{2}$/);
        assert.equal(re.choices[0].finish_reason, 'stop');

        const choice = await client.completions.create({
            model: 'stories260K', prompt: 'Once upon a time', temperature: 1, seed: 4, max_tokens: 50,
            guided_choice: ['positive', 'negative'] });
        assert.ok(['positive', 'negative'].includes(choice.choices[0].text), choice.choices[0].text);

        const gbnf = await client.completions.create({
            model: 'stories260K', prompt: 'Once upon a time', temperature: 1, seed: 5, max_tokens: 50,
            guided_grammar: 'root ::= "x=" [0-9]{1,4}' });
        assert.match(gbnf.choices[0].text, /^x=[0-9]{1,4}$/);

        const so = await client.completions.create({
            model: 'stories260K', prompt: 'Once upon a time', temperature: 1, seed: 6, max_tokens: 50,
            structured_outputs: { choice: ['a', 'b', 'c'] } });
        assert.ok(['a', 'b', 'c'].includes(so.choices[0].text));

        // Streamed: the deltas join into a valid answer.
        const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 1, maximum: 9 } },
            required: ['ok', 'n'], additionalProperties: false };
        const stream = await client.chat.completions.create({
            model: 'stories260K', messages, temperature: 1, seed: 7, max_tokens: 200, stream: true,
            response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
        let text = '';
        let finish = null;
        for await (const c of stream) {
            text += c.choices[0]?.delta?.content ?? '';
            finish = c.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(finish, 'stop');
        const v = JSON.parse(text);
        assert.equal(typeof v.ok, 'boolean');
        assert.ok(Number.isInteger(v.n) && v.n >= 1 && v.n <= 9);
    });

    test('tools: tool_choice required / a named function force valid calls; streamed as tool-call deltas', async () => {
        const ajv = addFormats(new Ajv2020({ strict: false }));
        // Bounded arguments (the embedded model would write a story into an unbounded string).
        const fn = (name, properties, required) => ({ type: 'function', function: { name, description: name,
            parameters: { type: 'object', properties, required, additionalProperties: false } } });
        const tools = [
            fn('get_weather', { city: { type: 'string', maxLength: 20 }, unit: { enum: ['celsius', 'fahrenheit'] } },
               ['city']),
            fn('set_alarm', { hour: { type: 'integer', minimum: 0, maximum: 23 },
                              minute: { type: 'integer', minimum: 0, maximum: 59 } }, ['hour', 'minute']),
            fn('roll_dice', { sides: { enum: [4, 6, 8, 20] }, count: { type: 'integer', minimum: 1, maximum: 5 } },
               ['sides']),
        ];
        const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));
        const check = (calls, context) => {
            assert.ok(Array.isArray(calls) && calls.length >= 1, context);
            for (const call of calls) {
                assert.equal(call.type, 'function', context);
                assert.match(call.id, /^call_/);
                const schema = byName[call.function.name];
                assert.ok(schema, `${context}: unknown tool ${call.function.name}`);
                const args = JSON.parse(call.function.arguments);
                const validate = ajv.compile(schema);
                assert.ok(validate(args), `${context}: ${ajv.errorsText(validate.errors)} ${call.function.arguments}`);
            }
        };
        let completed = 0;
        for (let seed = 0; seed < 6; seed++) {
            // One call each (parallel calls: the embedded model never stops adding them).
            const r = await client.chat.completions.create({
                model: 'stories260K', messages, tools, tool_choice: 'required', temperature: 1, seed, max_tokens: 480,
                parallel_tool_calls: false });
            if (r.choices[0].finish_reason === 'length') continue;  // a story inside a string (see above)
            completed++;
            assert.equal(r.choices[0].finish_reason, 'tool_calls');
            assert.equal(r.choices[0].message.content, null);
            check(r.choices[0].message.tool_calls, `required, seed ${seed}`);
        }
        assert.ok(completed >= 5, `only ${completed} of 6 forced calls completed`);
        const parallel = await client.chat.completions.create({
            model: 'stories260K', messages, tools, tool_choice: 'required', temperature: 1, seed: 9, max_tokens: 480 });
        if (parallel.choices[0].finish_reason === 'tool_calls') check(parallel.choices[0].message.tool_calls, 'parallel');
        else assert.equal(parallel.choices[0].finish_reason, 'length');
        const name = tools[0].function.name;
        const named = await client.chat.completions.create({
            model: 'stories260K', messages, tools, tool_choice: { type: 'function', function: { name } },
            temperature: 0, max_tokens: 480, parallel_tool_calls: true });
        if (named.choices[0].finish_reason !== 'length') {
            assert.equal(named.choices[0].message.tool_calls.length, 1);
            assert.equal(named.choices[0].message.tool_calls[0].function.name, name);
            check(named.choices[0].message.tool_calls, 'named');
        }
        // Streamed: the SDK's accumulated deltas make the same kind of calls.
        for (let seed = 0; seed < 4; seed++) {
            const stream = await client.chat.completions.create({
                model: 'stories260K', messages, tools, tool_choice: 'required', temperature: 1, seed, max_tokens: 480,
                parallel_tool_calls: false, stream: true });
            const calls = [];
            let finish = null;
            for await (const chunk of stream) {
                const d = chunk.choices[0]?.delta;
                for (const tc of d?.tool_calls ?? []) {  // the first delta names the call, the rest add arguments
                    calls[tc.index] ??= { ...tc, function: { ...tc.function, arguments: '' } };
                    calls[tc.index].function.arguments += tc.function.arguments;
                }
                finish = chunk.choices[0]?.finish_reason ?? finish;
            }
            if (finish === 'length') continue;
            assert.equal(finish, 'tool_calls');
            assert.equal(calls.length, 1);
            check(calls, `streamed, seed ${seed}`);
        }
        // tool_choice auto (the default) on a model whose template has no tool-call format: its
        // answer is text; none renders the tools and answers text.
        const auto = await client.chat.completions.create({ model: 'stories260K', messages, tools, max_tokens: 5 });
        assert.equal(typeof auto.choices[0].message.content, 'string');
        assert.equal(auto.choices[0].message.tool_calls, undefined);
        const none = await client.chat.completions.create({
            model: 'stories260K', messages, tools, tool_choice: 'none', max_tokens: 5 });
        assert.equal(typeof none.choices[0].message.content, 'string');
    });

    // A call whose arguments take dozens of tokens, through the SDK's stream helper: the
    // arguments arrive piece by piece (the first delta names the call, later ones carry only
    // index and arguments), and the pieces join into the final call's arguments, which validate.
    test('tools: a long forced call streams its arguments token by token (openai SDK)', async () => {
        const ajv = addFormats(new Ajv2020({ strict: false }));
        const parameters = { type: 'object', additionalProperties: false,
            required: ['city', 'unit', 'days', 'stops', 'budget'],
            properties: {
                city: { enum: ['Paris', 'Oslo', 'Lisbon', 'Kyoto'] },
                unit: { enum: ['celsius', 'fahrenheit'] },
                days: { type: 'integer', minimum: 1, maximum: 14 },
                stops: { type: 'array', minItems: 4, maxItems: 4,
                    items: { enum: ['museum', 'park', 'harbour', 'market', 'castle'] } },
                budget: { type: 'object', additionalProperties: false, required: ['low', 'high', 'currency'],
                    properties: { low: { type: 'integer', minimum: 0, maximum: 999 },
                        high: { type: 'integer', minimum: 0, maximum: 999 },
                        currency: { enum: ['EUR', 'NOK', 'JPY'] } } },
            } };
        const tools = [{ type: 'function', function: { name: 'plan_trip', description: 'Plan a trip', parameters } },
            { type: 'function', function: { name: 'noop', parameters: { type: 'object', properties: {} } } }];
        const validate = ajv.compile(parameters);
        for (const [seed, temperature] of [[0, 0], [1, 1], [2, 1]]) {
            const context = `seed ${seed}`;
            const stream = client.chat.completions.stream({
                model: 'stories260K', messages, tools, tool_choice: { type: 'function', function: { name: 'plan_trip' } },
                temperature, seed, max_tokens: 400 });
            const deltas = [];
            let content = '';
            for await (const chunk of stream) {
                const d = chunk.choices[0]?.delta;
                content += d?.content ?? '';
                for (const tc of d?.tool_calls ?? []) deltas.push(tc);
            }
            const final = await stream.finalChatCompletion();
            const choice = final.choices[0];
            assert.equal(choice.finish_reason, 'tool_calls', context);
            assert.equal(content, '', context);
            assert.equal(choice.message.tool_calls.length, 1, context);
            const [call] = choice.message.tool_calls;
            assert.equal(call.function.name, 'plan_trip');
            assert.match(call.id, /^call_/);
            // First delta: index, id, type, name (and the arguments so far); then index + arguments only.
            const [first, ...rest] = deltas;
            assert.equal(first.index, 0);
            assert.equal(first.id, call.id);
            assert.equal(first.type, 'function');
            assert.equal(first.function.name, 'plan_trip');
            assert.ok(rest.length >= 20, `${context}: only ${deltas.length} deltas for ${call.function.arguments}`);
            for (const d of rest) {
                assert.deepEqual(Object.keys(d).sort(), ['function', 'index'], JSON.stringify(d));
                assert.deepEqual(Object.keys(d.function), ['arguments'], JSON.stringify(d));
                assert.equal(d.index, 0);
            }
            const joined = deltas.map((d) => d.function.arguments).join('');
            assert.equal(joined, call.function.arguments, context);
            const args = JSON.parse(joined);
            assert.ok(validate(args), `${context}: ${ajv.errorsText(validate.errors)} ${joined}`);
            // The same request answered whole: the same call (greedy).
            if (temperature === 0) {
                const whole = await client.chat.completions.create({ model: 'stories260K', messages, tools,
                    tool_choice: { type: 'function', function: { name: 'plan_trip' } }, temperature, max_tokens: 400 });
                assert.equal(whole.choices[0].message.tool_calls[0].function.arguments, joined);
            }
        }
    });

    test('bad requests: 400 naming the field and the keyword', async () => {
        const base = { model: 'stories260K', messages, max_tokens: 10 };
        const cases = [
            [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: {} } } } },
                'response_format', /'not'/],
            [{ guided_json: { type: 'string', multipleOf: 2 } }, 'guided_json', /'multipleOf'/],
            [{ guided_regex: '(a' }, 'guided_regex', /./],
            [{ guided_grammar: 'start ::= "x"' }, 'guided_grammar', /root/],
            [{ guided_choice: [] }, 'guided_choice', /non-empty/],
            [{ response_format: { type: 'yaml' } }, 'response_format', /not supported/],
            [{ guided_regex: 'a', guided_choice: ['a'] }, 'guided_choice', /only one/],
            [{ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format', /schema/],
        ];
        for (const [extra, param, pattern] of cases) {
            const r = await http(`${server.url}/v1/chat/completions`, { body: { ...base, ...extra } });
            assert.equal(r.status, 400, `${JSON.stringify(extra)} -> ${r.status} ${r.text}`);
            assert.equal(r.json.error.param, param, r.text);
            assert.match(r.json.error.message, pattern, r.text);
        }
        // Still serving.
        const ok = await client.chat.completions.create({ ...base, guided_choice: ['fine'] });
        assert.equal(ok.choices[0].message.content, 'fine');
    });
});

// tool_choice auto: the model's own call format parsed out of its answer. The embedded model
// writes no calls by itself, so a regex (a real structured output; auto allows one) makes it
// write a Hermes call after some text; `--tool-call-parser hermes` since its template has none.
describe('tool_choice auto (hermes)', () => {
    let hermes, hc;
    before(async () => {
        hermes = await startServer(['--tool-call-parser', 'hermes']);
        hc = hermes.client();
    });
    after(async () => hermes && (await hermes.stop()));
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>';
    const escape = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const base = { model: 'stories260K', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools,
        temperature: 0, max_tokens: 320 };

    test('the call comes back as tool_calls, text before it as content; streamed as tool-call deltas', async () => {
        const regex = `Let me check\\. ${escape(call)}`;
        const r = await hc.chat.completions.create({ ...base, tool_choice: 'auto', structured_outputs: { regex } });
        assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
        assert.equal(r.choices[0].message.content, 'Let me check.');
        const [tc] = r.choices[0].message.tool_calls;
        assert.equal(r.choices[0].message.tool_calls.length, 1);
        assert.match(tc.id, /^call_[0-9a-f]+$/);
        assert.equal(tc.type, 'function');
        assert.equal(tc.function.name, 'get_weather');
        assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris' });

        // Two calls, streamed: content deltas first, then per call its id/name and its arguments.
        const two = `${call}\n${call.replace('Paris', 'Oslo')}`;
        const stream = await hc.chat.completions.create({ ...base, guided_regex: `Sure\\. ${escape(two)}`, stream: true });
        let content = '';
        const calls = [];
        let finish = null;
        const deltas = [];
        for await (const chunk of stream) {
            const d = chunk.choices[0]?.delta;
            content += d?.content ?? '';
            for (const t of d?.tool_calls ?? []) {
                deltas.push(t);
                calls[t.index] ??= { id: t.id, name: t.function?.name, arguments: '' };
                calls[t.index].arguments += t.function?.arguments ?? '';
            }
            finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(finish, 'tool_calls');
        assert.equal(content, 'Sure.');
        assert.equal(calls.length, 2);
        // Each call's arguments came in several pieces, as the model wrote them.
        for (const i of [0, 1]) assert.ok(deltas.filter((t) => t.index === i).length > 2, JSON.stringify(deltas));
        assert.deepEqual(calls.map((c) => [c.name, JSON.parse(c.arguments)]),
            [['get_weather', { city: 'Paris' }], ['get_weather', { city: 'Oslo' }]]);
        assert.ok(deltas.every((t) => Number.isInteger(t.index)));
        assert.ok(calls.every((c) => /^call_/.test(c.id)));
        // parallel_tool_calls false: the first call; the rest of the answer is text.
        const one = await hc.chat.completions.create({ ...base, guided_regex: escape(two), parallel_tool_calls: false });
        assert.equal(one.choices[0].finish_reason, 'tool_calls');
        assert.equal(one.choices[0].message.tool_calls.length, 1);
        assert.equal(one.choices[0].message.content, `\n${call.replace('Paris', 'Oslo')}`);

        // Cut short after a complete call: the call is there, finish_reason says "length".
        for (const stream of [false, true]) {
            const cut = await hc.chat.completions.create({ ...base, max_tokens: 80, stream,
                guided_regex: `${escape(call)} and then [a-z]{300}` });
            let finish = cut.choices?.[0].finish_reason, calls = cut.choices?.[0].message.tool_calls ?? [];
            if (stream) {
                for await (const chunk of cut) {
                    for (const t of chunk.choices[0]?.delta?.tool_calls ?? []) if (t.id) calls.push(t);
                    finish = chunk.choices[0]?.finish_reason ?? finish;
                }
            }
            assert.equal(finish, 'length');
            assert.equal(calls.length, 1);
            assert.equal(calls[0].function.name, 'get_weather');
        }

        // A call to a tool that is not offered, or not a call, stays content: no text is lost.
        for (const text of [call.replace('get_weather', 'launch'), call.replace('"name"', '"nome"')]) {
            const t = await hc.chat.completions.create({ ...base, guided_regex: escape(text) });
            assert.equal(t.choices[0].finish_reason, 'stop');
            assert.equal(t.choices[0].message.content, text);
            assert.equal(t.choices[0].message.tool_calls, undefined);
        }
        // A call left unclosed is a call once its name and arguments began (its pieces may have
        // streamed already): the arguments as written.
        const open = await hc.chat.completions.create({ ...base, guided_regex: escape(call.replace('}}', '}')) });
        assert.equal(open.choices[0].message.tool_calls[0].function.arguments, '{"city":"Paris"}');
        assert.equal(open.choices[0].message.content, null);
    });

    test('a tool round trip (assistant tool_calls, a tool message) renders through the template', async () => {
        const messages = [
            { role: 'user', content: 'Weather in Paris?' },
            { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
                function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
            { role: 'tool', tool_call_id: 'call_1', content: 'Sunny, 18 C.' },
        ];
        const r = await hc.chat.completions.create({ ...base, messages, max_tokens: 5 });
        assert.equal(typeof r.choices[0].message.content, 'string');
        assert.ok(r.usage.prompt_tokens > 5);  // the tool's answer reached the prompt
    });
});
