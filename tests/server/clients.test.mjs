// Real OpenAI-API clients against `peregrine serve` on the embedded model: LangChain JS
// (ChatOpenAI.withStructuredOutput, both its tool-call and its json_schema methods) and the
// Vercel AI SDK through its chat-completions provider (generateObject, tool calls with
// generateText and streamText). Each client validates the answer against its zod schema itself.
// The embedded model has a 512-token context: small schemas, bounded strings and max tokens.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { startServer } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const { z } = require('zod');
const { ChatOpenAI } = require('@langchain/openai');
const { generateObject, generateText, streamText, tool } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');

let server;
before(async () => {
    server = await startServer();
});
after(async () => server && (await server.stop()));

const person = z.object({
    name: z.string().max(12),
    age: z.number().int().min(0).max(120),
    pet: z.enum(['cat', 'dog', 'none']),
});
const weather = z.object({ city: z.string().max(12), unit: z.enum(['celsius', 'fahrenheit']) });

describe('LangChain JS', () => {
    const chat = () => new ChatOpenAI({
        model: 'stories260K', apiKey: 'none', configuration: { baseURL: `${server.url}/v1` },
        temperature: 0, maxTokens: 200, maxRetries: 0,
    });

    for (const method of ['functionCalling', 'jsonSchema']) {
        test(`withStructuredOutput(zod), method ${method}`, async () => {
            const structured = chat().withStructuredOutput(person, { name: 'person', method });
            const out = await structured.invoke('Tell me about Tim.');
            assert.deepEqual(person.parse(out), out);
        });
    }

    test('bindTools with a forced tool: the call comes back parsed', async () => {
        const model = chat().bindTools([{ type: 'function', function: { name: 'get_weather',
            description: 'Weather in a city', parameters: z.toJSONSchema(weather) } }],
        // One call: with parallel calls the embedded model never stops adding them.
        { tool_choice: 'required', parallel_tool_calls: false });
        const msg = await model.invoke('Weather in Paris?');
        assert.equal(msg.tool_calls.length, 1, JSON.stringify(msg));
        assert.equal(msg.tool_calls[0].name, 'get_weather');
        weather.parse(msg.tool_calls[0].args);
    });
});

describe('Vercel AI SDK (chat completions provider)', () => {
    const model = () => createOpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none' }).chat('stories260K');

    test('generateObject with a zod schema', async () => {
        const { object, finishReason } = await generateObject({
            model: model(), schema: person, prompt: 'Tell me about Tim.', temperature: 0, maxOutputTokens: 200,
            maxRetries: 0,
        });
        assert.equal(finishReason, 'stop');
        assert.deepEqual(person.parse(object), object);
    });

    test('generateText with tools, toolChoice required', async () => {
        const result = await generateText({
            model: model(), prompt: 'Weather in Paris?', temperature: 0, maxOutputTokens: 200, maxRetries: 0,
            tools: { get_weather: tool({ description: 'Weather in a city', inputSchema: weather }) },
            toolChoice: 'required',
            providerOptions: { openai: { parallelToolCalls: false } },  // one call (see LangChain's)
        });
        assert.equal(result.finishReason, 'tool-calls');
        assert.equal(result.toolCalls.length, 1);
        assert.equal(result.toolCalls[0].toolName, 'get_weather');
        assert.match(result.toolCalls[0].toolCallId, /^call_/);
        weather.parse(result.toolCalls[0].input);
    });

    test('streamText with a named tool: the streamed call deltas make one call', async () => {
        const result = streamText({
            model: model(), prompt: 'Weather in Oslo?', temperature: 0, maxOutputTokens: 200, maxRetries: 0,
            tools: { get_weather: tool({ description: 'Weather in a city', inputSchema: weather }) },
            toolChoice: { type: 'tool', toolName: 'get_weather' },
        });
        const calls = await result.toolCalls;
        assert.equal(await result.finishReason, 'tool-calls');
        assert.equal(calls.length, 1);
        assert.equal(calls[0].toolName, 'get_weather');
        weather.parse(calls[0].input);
    });
});
