// Conformance with OpenAI's published OpenAPI schemas (a subset of openai/openai-openapi in
// openapi/openai-subset.json, written by openapi/extract.py): every response body and every
// streamed chunk or event of a set of requests is validated with ajv against the schema OpenAI
// documents for it. Fields the spec does not name (vLLM's stop_reason, ...) are allowed, as the
// spec allows them.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { http, startServer } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const Ajv2020 = require('ajv/dist/2020').default;
const spec = JSON.parse(readFileSync(new URL('./openapi/openai-subset.json', import.meta.url)));
// OpenAPI 3.0's `nullable` as ajv takes it: beside no `type` (which ajv refuses) it becomes
// anyOf [it, null]; beside an `enum`, null joins the enum (ajv requires it there).
(function nullable(x) {
    if (Array.isArray(x)) return x.forEach(nullable);
    if (!x || typeof x !== 'object') return;
    Object.values(x).forEach(nullable);
    if (x.nullable === true && Array.isArray(x.enum) && !x.enum.includes(null)) x.enum.push(null);
    if (x.nullable === true && !('type' in x)) {
        const rest = { ...x };
        delete rest.nullable;
        for (const k of Object.keys(x)) delete x[k];
        x.anyOf = [rest, { type: 'null' }];
    }
})(spec);
// A streamed completion chunk carries `finish_reason: null` until its choice ends and
// `usage: null` until the last chunk (OpenAI's own streams do; its SDKs read them), while the
// spec gives chunks the whole response's schema: chunks are checked against that schema with
// those two also allowed to be null.
{
    const c = structuredClone(spec.$defs.CreateCompletionResponse);
    const choice = c.properties.choices.items;
    choice.properties.finish_reason = { anyOf: [choice.properties.finish_reason, { type: 'null' }] };
    c.properties.usage = { anyOf: [c.properties.usage, { type: 'null' }] };
    spec.$defs.CreateCompletionStreamChunk = c;
}
// OpenAPI's own keywords (discriminator, nullable) and formats (unixtime) are not JSON Schema's.
const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
ajv.addSchema(spec);
const check = (name, value, what) => {
    const validate = ajv.getSchema(`${spec.$id}#/$defs/${name}`);
    assert.ok(validate(value), `${what} is not a ${name}: ${JSON.stringify(validate.errors?.slice(0, 3))}\n` +
        JSON.stringify(value).slice(0, 800));
};

let server;
before(async () => {
    server = await startServer();
});
after(async () => server && (await server.stop()));

// The `data:` payloads of a server-sent event stream, [DONE] left out.
async function events(route, body) {
    const res = await fetch(`${server.url}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, stream: true }) });
    assert.equal(res.status, 200);
    const text = await res.text();
    return text.split('\n\n').map((e) => e.split('\n').filter((l) => l.startsWith('data: '))
        .map((l) => l.slice(6)).join('\n')).filter((d) => d && d !== '[DONE]').map((d) => JSON.parse(d));
}

async function whole(route, body, status = 200) {
    const r = await http(`${server.url}${route}`, { body });
    assert.equal(r.status, status, r.text);
    return r.json;
}

const messages = [{ role: 'user', content: 'Tell me a story.' }];
const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
    properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'], additionalProperties: false } } }];
const rtools = [{ type: 'function', name: 'get_weather', parameters: tools[0].function.parameters }];

// Each Responses event is checked against the schema of its own type.
const eventSchema = Object.fromEntries(Object.entries(spec.$defs)
    .filter(([name, s]) => /^Response.*Event$/.test(name) && s.properties?.type?.enum?.length === 1)
    .map(([name, s]) => [s.properties.type.enum[0], name]));
describe('/v1/completions', () => {
    const cases = {
        plain: { prompt: 'Once upon a time', max_tokens: 8 },
        logprobs: { prompt: 'Once upon a time', max_tokens: 8, logprobs: 2 },
        'two prompts, n 2, stop': { prompt: ['Once', 'upon'], max_tokens: 6, n: 2, stop: ['.'] },
    };
    for (const [name, body] of Object.entries(cases)) {
        Object.assign(body, { seed: 7 });  // sampled, but the same answers every run
        test(name, async () => {
            check('CreateCompletionResponse', await whole('/v1/completions', body), 'the body');
            for (const c of await events('/v1/completions', { ...body, stream_options: { include_usage: true } }))
                check('CreateCompletionStreamChunk', c, 'a chunk');
        });
    }
    // Echoed prompt tokens carry their logprobs (the first prompt token, BOS, is not echoed:
    // no null, which the spec's number[] would refuse).
    test('echo with logprobs', async () => {
        const body = { prompt: 'Once upon a time', max_tokens: 4, echo: true, logprobs: 1 };
        check('CreateCompletionResponse', await whole('/v1/completions', body), 'the body');
        for (const c of await events('/v1/completions', { ...body, stream_options: { include_usage: true } }))
            check('CreateCompletionStreamChunk', c, 'a chunk');
    });
});

describe('/v1/chat/completions', () => {
    const cases = {
        plain: { messages, max_completion_tokens: 8 },
        logprobs: { messages, max_completion_tokens: 8, logprobs: true, top_logprobs: 2 },
        'json_schema': { messages, max_completion_tokens: 40, response_format: { type: 'json_schema',
            json_schema: { name: 'p', schema: tools[0].function.parameters } } },
        'forced tool call': { messages, max_completion_tokens: 40, tools, tool_choice: 'required',
            parallel_tool_calls: false },
    };
    for (const [name, body] of Object.entries(cases)) {
        Object.assign(body, { seed: 7 });
        test(name, async () => {
            check('CreateChatCompletionResponse', await whole('/v1/chat/completions', body), 'the body');
            for (const c of await events('/v1/chat/completions', { ...body, stream_options: { include_usage: true } }))
                check('CreateChatCompletionStreamResponse', c, 'a chunk');
        });
    }
});

describe('/v1/responses', () => {
    const cases = {
        plain: { input: 'Tell me a story.', instructions: 'Be brief.', max_output_tokens: 8 },
        'message items': { input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hi' }] }],
            max_output_tokens: 8 },
        'json_schema': { input: 'Tim', max_output_tokens: 40, text: { format: { type: 'json_schema', name: 'p',
            schema: tools[0].function.parameters } } },
        'forced tool call': { input: 'Weather?', max_output_tokens: 40, tools: rtools, tool_choice: 'required',
            parallel_tool_calls: false },
    };
    for (const [name, body] of Object.entries(cases)) {
        test(name, async () => {
            check('Response', await whole('/v1/responses', body), 'the body');
            const all = await events('/v1/responses', body);
            assert.ok(all.length >= 3);
            for (const e of all) {
                assert.ok(eventSchema[e.type], `no schema for the event type ${e.type}`);
                check(eventSchema[e.type], e, `the ${e.type} event`);
            }
        });
    }
});

test('errors and models', async () => {
    check('ErrorResponse', await whole('/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }, 400),
        'a 400');
    check('ErrorResponse', await whole('/v1/responses', { input: 5 }, 400), 'a 400');
    const models = await http(`${server.url}/v1/models`, { method: 'GET' });
    check('ListModelsResponse', models.json, '/v1/models');
});
