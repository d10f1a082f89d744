// The gRPC API (proto/peregrine/v1/inference.proto) with an independent client, @grpc/grpc-js
// and @grpc/proto-loader, against `peregrine serve --grpc-port` on the embedded model.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';

import { http, startServer, waitFor } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'proto');

function freePort() {
    return new Promise((resolve) => {
        const s = net.createServer().listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

let server, client, grpcPort;
before(async () => {
    const port = await freePort();
    grpcPort = port;
    server = await startServer(['--grpc-port', String(port)]);
    const def = protoLoader.loadSync('peregrine/v1/inference.proto', { includeDirs: [protoDir], keepCase: true });
    const Inference = grpc.loadPackageDefinition(def).peregrine.v1.Inference;
    client = new Inference(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
});
after(async () => {
    client && client.close();
    server && (await server.stop());
});

function generate(req) {
    return new Promise((resolve) => {
        const messages = [];
        const call = client.generate(req);
        call.on('data', (m) => messages.push(m));
        call.on('error', (error) => resolve({ messages, error }));
        call.on('end', () => resolve({ messages, text: messages.map((m) => m.text).join('') }));
    });
}

const prompt = 'Once upon a time';

test('greedy Generate streams the same text as /v1/completions', async () => {
    const g = await generate({ prompt, temperature: 0, max_tokens: 24 });
    assert.equal(g.error, undefined);
    const last = g.messages.at(-1);
    assert.ok(last.finish_reason);
    assert.ok(last.usage && last.usage.prompt_tokens > 0);
    const h = await http(`${server.url}/v1/completions`, { body: { prompt, temperature: 0, max_tokens: 24 } });
    assert.equal(h.status, 200);
    assert.equal(g.text, h.json.choices[0].text);
});

test('a cancelled stream leaves nothing running', async () => {
    const call = client.generate({ prompt, temperature: 0, max_tokens: 200, ignore_eos: true });
    await new Promise((resolve) => call.once('data', resolve));
    call.on('error', () => {});
    call.cancel();
    const h = await waitFor(async () => {
        const r = (await http(`${server.url}/health`, { method: 'GET' })).json;
        return r.running === 0 && r.requests_in_flight === 0 && r;
    }, 5000);
    assert.ok(h, 'requests still running');
});

test('invalid arguments and unknown models give their codes', async () => {
    let g = await generate({ prompt, temperature: -1 });
    assert.equal(g.error.code, grpc.status.INVALID_ARGUMENT);
    g = await generate({});
    assert.equal(g.error.code, grpc.status.INVALID_ARGUMENT);
    g = await generate({ prompt, model: 'no-such-model' });
    assert.equal(g.error.code, grpc.status.NOT_FOUND);
});

test('256 concurrent streams finish with no error', async () => {
    const all = await Promise.all(
        Array.from({ length: 256 }, () => generate({ prompt, temperature: 0, max_tokens: 16 })),
    );
    for (const g of all) {
        assert.equal(g.error, undefined);
        assert.equal(g.text, all[0].text);
    }
});

test('gRPC calls are in the access log, like HTTP requests', async () => {
    const port = await freePort();
    const s = await startServer(['--grpc-port', String(port), '--access-log']);
    const def = protoLoader.loadSync('peregrine/v1/inference.proto', { includeDirs: [protoDir], keepCase: true });
    const c = new (grpc.loadPackageDefinition(def).peregrine.v1.Inference)(`127.0.0.1:${port}`,
        grpc.credentials.createInsecure());
    try {
        await new Promise((resolve, reject) => {
            const call = c.generate({ prompt, max_tokens: 3 });
            call.on('data', () => {});
            call.on('error', reject);
            call.on('end', resolve);
        });
        await new Promise((resolve, reject) => c.listModels({}, (e, r) => (e ? reject(e) : resolve(r))));
        const listed = await waitFor(() => s.log().split('\n').find((l) => l.includes('Inference/ListModels')), 2000);
        assert.ok(listed, s.log().slice(-2000));
        assert.equal(JSON.parse(listed).status, 0);
        const line = await waitFor(() => s.log().split('\n').find((l) => l.includes('Inference/Generate')), 2000);
        assert.ok(line, s.log().slice(-2000));
        const j = JSON.parse(line);
        assert.equal(j.path, '/peregrine.v1.Inference/Generate');
        assert.equal(j.status, 0);
        assert.equal(j.completion_tokens, 3);
        assert.ok(j.prompt_tokens > 0);
        assert.match(j.remote, /127\.0\.0\.1/);
    } finally {
        c.close();
        await s.stop();
    }
});

test('structured output: a JSON schema, a regex, a choice list and a grammar are honoured', async () => {
    const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 }, ok: { type: 'boolean' } },
        required: ['n', 'ok'], additionalProperties: false };
    const s = await generate({ prompt, temperature: 0, max_tokens: 200, json_schema: JSON.stringify(schema) });
    assert.equal(s.error, undefined);
    assert.equal(s.messages.at(-1).finish_reason, 'stop', s.text);
    const value = JSON.parse(s.text);
    assert.deepEqual(Object.keys(value).sort(), ['n', 'ok']);
    assert.ok(Number.isInteger(value.n) && value.n >= 0 && value.n <= 9 && typeof value.ok === 'boolean');

    const r = await generate({ prompt, temperature: 1, seed: 4, max_tokens: 32, regex: '[a-c]{3}-[0-9]{2}' });
    assert.match(r.text, /^[a-c]{3}-[0-9]{2}$/);
    const c = await generate({ prompt, temperature: 1, seed: 5, max_tokens: 32, choice: { choices: ['red', 'green'] } });
    assert.ok(['red', 'green'].includes(c.text), c.text);
    const g = await generate({ prompt, temperature: 1, seed: 6, max_tokens: 32, grammar: 'root ::= "yes" | "no"' });
    assert.ok(['yes', 'no'].includes(g.text), g.text);
    // Chat too: the same fields with messages.
    const chat = await generate({ messages: [{ role: 'user', content: 'Hi' }], temperature: 0, max_tokens: 32,
        choice: { choices: ['alpha', 'beta'] } });
    assert.ok(['alpha', 'beta'].includes(chat.text), chat.text);

    // Bad ones: INVALID_ARGUMENT naming the field.
    for (const [req, field] of [[{ json_schema: '{not json' }, 'json_schema'], [{ regex: '' }, undefined],
        [{ choice: { choices: [] } }, 'choice'], [{ grammar: 'root ::= undefined_rule' }, 'grammar']]) {
        const bad = await generate({ prompt, max_tokens: 8, ...req });
        assert.equal(bad.error?.code, grpc.status.INVALID_ARGUMENT, JSON.stringify(req));
        if (field) assert.match(bad.error.details, new RegExp(field), bad.error.details);
    }
});

// Tools: the same tools / tool_choice as the HTTP API. A named call's arguments stream as
// tool_call_deltas (the first with id and name), the text carries no call, and the choice's last
// message has the call whole with finish_reason "tool_calls".
test('tools: a forced call streams as tool_call_deltas and ends whole; bad tools are INVALID_ARGUMENT', async () => {
    const parameters = { type: 'object', additionalProperties: false, required: ['city', 'days', 'stops'],
        properties: { city: { enum: ['Paris', 'Oslo', 'Lisbon'] }, days: { type: 'integer', minimum: 1, maximum: 9 },
            stops: { type: 'array', minItems: 3, maxItems: 3, items: { enum: ['museum', 'park', 'market'] } } } };
    const tools = [{ name: 'plan_trip', description: 'Plan a trip', parameters: JSON.stringify(parameters) },
        { name: 'noop' }];
    const messages = [{ role: 'user', content: 'Plan a trip' }];
    for (const tool_choice of ['plan_trip', 'required']) {
        const g = await generate({ messages, tools, tool_choice, temperature: 0, max_tokens: 300,
            parallel_tool_calls: false });
        assert.equal(g.error, undefined, String(g.error));
        const last = g.messages.at(-1);
        assert.equal(last.finish_reason, 'tool_calls', JSON.stringify(last));
        assert.equal(g.text, '');
        assert.equal(last.tool_calls.length, 1);
        const [call] = last.tool_calls;
        assert.match(call.id, /^call_[0-9a-f]+$/);
        const deltas = g.messages.flatMap((m) => m.tool_call_deltas ?? []);
        assert.equal(deltas[0].id, call.id);
        assert.equal(deltas[0].name, call.name);
        assert.ok(deltas.every((d) => !d.index));  // 0: proto3 leaves it out
        assert.ok(deltas.slice(1).every((d) => !d.id && !d.name));
        assert.ok(deltas.length >= 10, `${deltas.length} deltas`);
        assert.equal(deltas.map((d) => d.arguments).join(''), call.arguments);
        if (call.name === 'plan_trip') {
            const args = JSON.parse(call.arguments);
            assert.ok(['Paris', 'Oslo', 'Lisbon'].includes(args.city) && args.stops.length === 3, call.arguments);
        } else {
            assert.deepEqual(JSON.parse(call.arguments), {});
        }
    }
    // none: text, no calls.
    const none = await generate({ messages, tools, tool_choice: 'none', max_tokens: 5 });
    assert.equal(none.error, undefined);
    assert.equal((none.messages.at(-1).tool_calls ?? []).length, 0);
    assert.notEqual(none.messages.at(-1).finish_reason, 'tool_calls');
    for (const [req, pattern] of [
        [{ tool_choice: 'launch' }, /tool_choice.*'launch'/],
        [{ tools: [{ name: 'f', parameters: '{not json' }], tool_choice: 'required' }, /tools.*not JSON/],
        [{ tools: [{ name: 'f', parameters: JSON.stringify({ type: 'object', not: {} }) }], tool_choice: 'required' },
            /'not'/],
        [{ tools: [{ name: 'bad name' }] }, /tools/],
        [{ tool_choice: 'required', json_schema: '{}' }, /tool_choice/],
        [{ messages: [], prompt, tool_choice: 'required' }, /tools/],
    ]) {
        const bad = await generate({ messages, tools, max_tokens: 8, ...req });
        assert.equal(bad.error?.code, grpc.status.INVALID_ARGUMENT, JSON.stringify(req));
        assert.match(bad.error.details, pattern, bad.error.details);
    }
});

// The standard health service answers for the server ("") and for the service's own name, as
// Kubernetes' gRPC probe may ask; another name is NOT_FOUND.
test('gRPC health: the server and peregrine.v1.Inference are SERVING', async () => {
    const def = protoLoader.loadSync('grpc_health.proto',
        { includeDirs: [path.dirname(fileURLToPath(import.meta.url))], enums: String });
    const Health = grpc.loadPackageDefinition(def).grpc.health.v1.Health;
    const h = new Health(`127.0.0.1:${grpcPort}`, grpc.credentials.createInsecure());
    const check = (service) => new Promise((resolve) => h.check({ service }, (e, r) => resolve(e ? e.code : r.status)));
    try {
        assert.equal(await check(''), 'SERVING');
        assert.equal(await check('peregrine.v1.Inference'), 'SERVING');
        assert.equal(await check('nope.v1.Other'), grpc.status.NOT_FOUND);
    } finally {
        h.close();
    }
});

// Server reflection, v1 (ours) and v1alpha (grpc++'s), with the reflection proto loaded by
// @grpc/proto-loader (v1alpha: the same file under its old package name).
test('server reflection v1 and v1alpha list the services and give the descriptors', async () => {
    const fs = await import('node:fs');
    const os = await import('node:os');
    const v1Path = path.join(protoDir, 'grpc', 'reflection', 'v1', 'reflection.proto');
    const alphaDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-refl-'));
    fs.mkdirSync(path.join(alphaDir, 'grpc', 'reflection', 'v1alpha'), { recursive: true });
    fs.writeFileSync(path.join(alphaDir, 'grpc', 'reflection', 'v1alpha', 'reflection.proto'),
        fs.readFileSync(v1Path, 'utf8').replace('package grpc.reflection.v1;', 'package grpc.reflection.v1alpha;'));
    const ask = (dir, file, pkg, requests) => new Promise((resolve, reject) => {
        const def = protoLoader.loadSync(file, { includeDirs: [dir], keepCase: true });
        const Service = pkg.split('.').reduce((o, k) => o[k], grpc.loadPackageDefinition(def)).ServerReflection;
        const c = new Service(`127.0.0.1:${grpcPort}`, grpc.credentials.createInsecure());
        const call = c.ServerReflectionInfo();
        const out = [];
        call.on('data', (m) => {
            out.push(m);
            if (out.length === requests.length) call.end();
        });
        call.on('error', reject);
        call.on('end', () => {
            c.close();
            resolve(out);
        });
        for (const r of requests) call.write(r);
    });
    const requests = [
        { list_services: '' },
        { file_containing_symbol: 'peregrine.v1.Inference' },
        { file_by_filename: 'peregrine/v1/inference.proto' },
        { file_containing_symbol: 'no.such.Symbol' },
    ];
    const [list, bySymbol, byName, missing] =
        await ask(protoDir, 'grpc/reflection/v1/reflection.proto', 'grpc.reflection.v1', requests);
    const names = list.list_services_response.service.map((s) => s.name);
    for (const n of ['peregrine.v1.Inference', 'grpc.reflection.v1.ServerReflection']) assert.ok(names.includes(n), names.join(' '));
    // A serialized FileDescriptorProto: its name (field 1) and the service's methods are in it.
    const first = bySymbol.file_descriptor_response.file_descriptor_proto[0].toString('latin1');
    assert.ok(first.includes('peregrine/v1/inference.proto') && first.includes('Generate'), first.slice(0, 80));
    // By file name: the same file first.
    assert.equal(byName.file_descriptor_response.file_descriptor_proto[0].toString('latin1'), first);
    assert.equal(missing.error_response.error_code, 5);
    const [alphaList, alphaFile] = await ask(alphaDir, 'grpc/reflection/v1alpha/reflection.proto',
        'grpc.reflection.v1alpha', requests.slice(0, 2));
    assert.ok(alphaList.list_services_response.service.some((s) => s.name === 'peregrine.v1.Inference'));
    assert.ok(alphaFile.file_descriptor_response.file_descriptor_proto.length >= 1);
    fs.rmSync(alphaDir, { recursive: true, force: true });
});
