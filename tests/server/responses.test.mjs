// POST /v1/responses (OpenAI's Responses API) through real clients against `peregrine serve` on
// the embedded model: the `openai` SDK's responses.create (whole and streamed, structured output,
// a function tool round trip), LangChain JS's ChatOpenAI with useResponsesApi, and the Vercel AI
// SDK's openai(...) provider (the Responses API) with generateText and streamText. The answer is
// the chat-completions answer to the same messages (one request path), which the tests check.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { apiError, http, startServer } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const { z } = require('zod');
const { ChatOpenAI } = require('@langchain/openai');
const { generateText, streamText } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');

let server, client;
before(async () => {
    server = await startServer();
    client = server.client();
});
after(async () => server && (await server.stop()));

const input = 'Tell me a story about a cat.';
const chatText = async (messages, max = 24) => (await client.chat.completions.create({
    messages, max_completion_tokens: max, temperature: 0 })).choices[0].message.content;

describe('openai SDK responses.create', () => {
    test('whole: the response object, the chat answer to the same messages', async () => {
        const r = await client.responses.create({
            model: 'stories260K', input, instructions: 'Be brief.', max_output_tokens: 24, temperature: 0 });
        assert.match(r.id, /^resp_/);
        assert.equal(r.object, 'response');
        assert.equal(r.model, 'stories260K');
        assert.equal(r.instructions, 'Be brief.');
        assert.equal(r.store, false);
        assert.equal(r.output[0].type, 'message');
        assert.equal(r.output[0].role, 'assistant');
        assert.equal(r.output[0].content[0].type, 'output_text');
        assert.equal(r.output_text, r.output[0].content[0].text);  // the SDK's convenience
        assert.equal(r.output_text, await chatText([
            { role: 'system', content: 'Be brief.' }, { role: 'user', content: input }]));
        assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
        assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
        if (r.status === 'incomplete') assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
        else assert.equal(r.status, 'completed');
    });

    test('max_output_tokens cuts it: incomplete, with the reason', async () => {
        const r = await client.responses.create({ input, max_output_tokens: 3, temperature: 0 });
        assert.equal(r.status, 'incomplete');
        assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
        assert.equal(r.usage.output_tokens, 3);
        assert.equal(r.output[0].status, 'incomplete');
    });

    test('message items: roles, input_text and output_text parts', async () => {
        const items = [
            { role: 'developer', content: 'Be brief.' },
            { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hi' }] },
            { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Hello.' }] },
            { role: 'user', content: input },
        ];
        const r = await client.responses.create({ input: items, max_output_tokens: 16, temperature: 0 });
        assert.equal(r.output_text, await chatText([
            { role: 'developer', content: 'Be brief.' }, { role: 'user', content: 'Hi' },
            { role: 'assistant', content: 'Hello.' }, { role: 'user', content: input }], 16));
    });

    test('stream: the typed event sequence; the deltas make the final text', async () => {
        const whole = await client.responses.create({ input, max_output_tokens: 20, temperature: 0 });
        const events = [];
        for await (const e of await client.responses.create({ input, max_output_tokens: 20, temperature: 0,
            stream: true })) events.push(e);
        events.forEach((e, i) => assert.equal(e.sequence_number, i));
        const types = events.map((e) => e.type);
        const deltas = types.filter((t) => t === 'response.output_text.delta').length;
        assert.ok(deltas > 0);
        assert.deepEqual(types, [
            'response.created', 'response.in_progress', 'response.output_item.added',
            'response.content_part.added', ...Array(deltas).fill('response.output_text.delta'),
            'response.output_text.done', 'response.content_part.done', 'response.output_item.done',
            whole.status === 'completed' ? 'response.completed' : 'response.incomplete',
        ]);
        const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
        assert.equal(text, whole.output_text);
        assert.equal(events.find((e) => e.type === 'response.output_text.done').text, text);
        const last = events.at(-1).response;
        assert.equal(last.output[0].content[0].text, text);
        assert.equal(last.usage.output_tokens, whole.usage.output_tokens);
        assert.equal(events[0].response.status, 'in_progress');
    });

    test('stream through the SDK helper: finalResponse', async () => {
        const stream = client.responses.stream({ input, max_output_tokens: 12, temperature: 0 });
        let text = '';
        stream.on('response.output_text.delta', (e) => { text += e.delta; });
        const final = await stream.finalResponse();
        assert.equal(final.output[0].content[0].text, text);
    });

    test('text.format json_schema: structured output', async () => {
        const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 10 },
            age: { type: 'integer', minimum: 0, maximum: 99 } }, required: ['name', 'age'], additionalProperties: false };
        const r = await client.responses.create({ input: 'Tim', max_output_tokens: 200, temperature: 0,
            text: { format: { type: 'json_schema', name: 'person', schema, strict: true } } });
        assert.equal(r.status, 'completed');
        const v = JSON.parse(r.output_text);
        assert.equal(typeof v.name, 'string');
        assert.ok(Number.isInteger(v.age));
        assert.equal(r.text.format.type, 'json_schema');
    });

    test('a function tool round trip: function_call out, function_call_output in', async () => {
        const tools = [{ type: 'function', name: 'get_weather', description: 'Weather in a city',
            parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } },
                required: ['city'], additionalProperties: false } }];
        const r = await client.responses.create({ input: 'Weather in Paris?', tools, tool_choice: 'required',
            parallel_tool_calls: false, max_output_tokens: 60, temperature: 0 });
        assert.equal(r.status, 'completed');
        const calls = r.output.filter((o) => o.type === 'function_call');
        assert.equal(calls.length, 1);
        assert.equal(calls[0].name, 'get_weather');
        assert.match(calls[0].call_id, /^call_/);
        assert.equal(typeof JSON.parse(calls[0].arguments).city, 'string');
        const streamed = [];
        for await (const e of await client.responses.create({ input: 'Weather in Paris?', tools,
            tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 60, temperature: 0,
            stream: true })) streamed.push(e);
        const done = streamed.find((e) => e.type === 'response.function_call_arguments.done');
        assert.equal(done.name, 'get_weather');
        assert.equal(streamed.at(-1).response.output[0].arguments, done.arguments);
        const answer = await client.responses.create({ tools, max_output_tokens: 16, temperature: 0, input: [
            { role: 'user', content: 'Weather in Paris?' },
            calls[0],
            { type: 'function_call_output', call_id: calls[0].call_id, output: '{"celsius": 21}' },
        ] });
        assert.equal(answer.output[0].type, 'message');
        assert.equal(answer.output_text, await chatText([
            { role: 'user', content: 'Weather in Paris?' },
            { role: 'assistant', content: '', tool_calls: [{ id: calls[0].call_id, type: 'function',
                function: { name: 'get_weather', arguments: calls[0].arguments } }] },
            { role: 'tool', tool_call_id: calls[0].call_id, content: '{"celsius": 21}' }], 16));
    });

    test('bad input: 4xx naming the field; nothing is stored', async () => {
        const cases = [
            [{}, 'input'],
            [{ input: 5 }, 'input'],
            [{ input: [{ role: 'wizard', content: 'Hi' }] }, 'input[0].role'],
            [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input[0].content'],
            [{ input: 'Hi', max_output_tokens: -1 }, 'max_output_tokens'],
            [{ input: 'Hi', previous_response_id: 'resp_1' }, 'previous_response_id'],
            [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, 'input[0]'],
            [{ input: 'Hi', tools: [{ type: 'web_search' }] }, 'tools'],
            [{ input: 'Hi', text: { format: { type: 'yaml' } } }, 'text.format'],
            [{ input: 'Hi', text: { format: { type: 'json_schema', schema: 5 } } }, 'text.format'],
            [{ input: 'Hi', n: 2 }, 'n'],
        ];
        for (const [body, param] of cases) {
            const e = await apiError(() => client.responses.create(body));
            assert.equal(e.status, 400, JSON.stringify(body));
            assert.equal(e.param, param, JSON.stringify(body));
            assert.equal(e.type, 'invalid_request_error');
        }
        const r = await http(`${server.url}/v1/responses/resp_123`, { method: 'GET' });
        assert.equal(r.status, 404);
        assert.match(r.json.error.message, /keeps no responses/);
    });
});

describe('LangChain JS ChatOpenAI with useResponsesApi', () => {
    const chat = (extra = {}) => new ChatOpenAI({
        model: 'stories260K', apiKey: 'none', configuration: { baseURL: `${server.url}/v1` },
        temperature: 0, maxTokens: 16, maxRetries: 0, useResponsesApi: true, ...extra,
    });

    test('invoke and stream', async () => {
        const msg = await chat().invoke(input);
        assert.equal(typeof msg.content === 'string' ? msg.content : msg.content.map((p) => p.text).join(''),
            await chatText([{ role: 'user', content: input }], 16));
        assert.ok(msg.usage_metadata.output_tokens > 0);
        let text = '';
        for await (const chunk of await chat({ streaming: true }).stream(input))
            text += typeof chunk.content === 'string' ? chunk.content : chunk.content.map((p) => p.text ?? '').join('');
        assert.equal(text, await chatText([{ role: 'user', content: input }], 16));
    });
});

describe('Vercel AI SDK openai(...) provider (the Responses API)', () => {
    const model = () => createOpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none' })('stories260K');

    test('generateText', async () => {
        const r = await generateText({ model: model(), prompt: input, temperature: 0, maxOutputTokens: 16,
            maxRetries: 0 });
        assert.equal(r.text, await chatText([{ role: 'user', content: input }], 16));
        assert.ok(['stop', 'length'].includes(r.finishReason));
        assert.ok(r.usage.outputTokens > 0);
        assert.match(r.response.id, /^resp_/);
    });

    test('streamText', async () => {
        const r = streamText({ model: model(), prompt: input, temperature: 0, maxOutputTokens: 16, maxRetries: 0 });
        let text = '';
        for await (const part of r.textStream) text += part;
        assert.equal(text, await chatText([{ role: 'user', content: input }], 16));
        assert.equal(await r.text, text);
    });

    test('generateText with a forced tool', async () => {
        const { tool } = require('ai');
        const r = await generateText({ model: model(), prompt: 'Weather in Oslo?', temperature: 0,
            maxOutputTokens: 60, maxRetries: 0,
            tools: { get_weather: tool({ description: 'Weather', inputSchema: z.object({ city: z.string().max(10) }) }) },
            toolChoice: 'required', providerOptions: { openai: { parallelToolCalls: false } } });
        assert.equal(r.toolCalls.length, 1);
        assert.equal(r.toolCalls[0].toolName, 'get_weather');
        assert.equal(typeof r.toolCalls[0].input.city, 'string');
    });
});
