// serve --ssl-*: the HTTP API over TLS (JSON, SSE), WebSockets over TLS (wss) and
// gRPC over TLS, each with an independent client (node's https, the ws package, @grpc/grpc-js),
// against certificates made here by Debian's openssl; a required client certificate
// (--ssl-cert-reqs 2); a plain-HTTP client on the TLS port gets no answer and the server goes
// on; bad flags are refused before the model loads. `peregrine router` and `serve
// --data-parallel-size` take the same flags for their front.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';

import { startServer } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const WebSocket = require('ws');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'proto');

// A CA, a server certificate for 127.0.0.1 / localhost and a client certificate, signed by it.
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-tls-'));
const file = (name) => path.join(dir, name);
function openssl(...args) {
    execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}
function issue(name, cn, ext) {
    openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', `${name}.key`,
        '-out', `${name}.csr`, '-subj', `/CN=${cn}`);
    fs.writeFileSync(file(`${name}.ext`), ext);
    openssl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out',
        `${name}.pem`, '-days', '2', '-extfile', `${name}.ext`);
}
openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', 'ca.key',
    '-out', 'ca.pem', '-days', '2', '-subj', '/CN=peregrine test CA');
issue('server', 'localhost', 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
issue('client', 'a client', 'extendedKeyUsage=clientAuth\n');
const ca = fs.readFileSync(file('ca.pem'));
const tlsArgs = ['--ssl-certfile', file('server.pem'), '--ssl-keyfile', file('server.key')];

function freePort() {
    return new Promise((resolve) => {
        const s = net.createServer().listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

// One HTTPS request: {status, body}.
function request(url, { method = 'POST', body, options = {} } = {}) {
    return new Promise((resolve, reject) => {
        const req = https.request(url, { method, ca, headers: { 'content-type': 'application/json' }, ...options },
            (res) => {
                const chunks = [];
                res.on('data', (d) => chunks.push(d.toString()));
                res.on('end', () => resolve({ status: res.statusCode, body: chunks.join('') }));
            });
        req.on('error', reject);
        if (body !== undefined) req.write(JSON.stringify(body));
        req.end();
    });
}

let server, grpcPort;
before(async () => {
    grpcPort = await freePort();
    server = await startServer([...tlsArgs, '--grpc-port', String(grpcPort)]);
});
after(async () => {
    server && (await server.stop());
    fs.rmSync(dir, { recursive: true, force: true });
});

test('the ready line names an https URL', () => {
    assert.match(server.url, /^https:\/\/127\.0\.0\.1:\d+$/);
});

test('a completion and /health over HTTPS', async () => {
    const health = await request(`${server.url}/health`, { method: 'GET' });
    assert.equal(health.status, 200);
    const r = await request(`${server.url}/v1/completions`, {
        body: { prompt: 'Once upon a time', max_tokens: 12, temperature: 0 },
    });
    assert.equal(r.status, 200, r.body);
    const j = JSON.parse(r.body);
    assert.equal(j.usage.completion_tokens, 12);
    assert.ok(j.choices[0].text.length > 0);
});

test('curl with the test CA gets a completion; without it, curl refuses the certificate', () => {
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
    const ok = spawnSync('curl', ['-sS', '--cacert', file('ca.pem'), `${server.url}/v1/completions`, '-H',
        'Content-Type: application/json', '-d', body], { encoding: 'utf8', timeout: 30000 });
    assert.equal(ok.status, 0, ok.stderr);
    assert.equal(JSON.parse(ok.stdout).usage.completion_tokens, 6);
    const untrusted = spawnSync('curl', ['-sS', `${server.url}/health`], { encoding: 'utf8', timeout: 30000 });
    assert.notEqual(untrusted.status, 0);
});

test('SSE over HTTPS: the events give the one-shot text and end with [DONE]', async () => {
    const r = await request(`${server.url}/v1/completions`, {
        body: { prompt: 'Once upon a time', max_tokens: 24, temperature: 0, stream: true, ignore_eos: true },
    });
    assert.equal(r.status, 200);
    const events = r.body.split('\n\n').filter((e) => e.startsWith('data: '));
    assert.equal(events.at(-1), 'data: [DONE]');
    const text = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)).choices[0]?.text ?? '').join('');
    const whole = JSON.parse((await request(`${server.url}/v1/completions`, {
        body: { prompt: 'Once upon a time', max_tokens: 24, temperature: 0, ignore_eos: true },
    })).body).choices[0].text;
    assert.equal(text, whole);
});

test('a WebSocket over TLS (wss://) answers a completion', async () => {
    const ws = new WebSocket(`${server.url.replace(/^https/, 'wss')}/v1/ws`, { ca });
    await new Promise((resolve, reject) => {
        ws.once('open', resolve);
        ws.once('error', reject);
    });
    const messages = [];
    const done = new Promise((resolve) => ws.on('message', (d) => {
        const m = JSON.parse(d.toString());
        messages.push(m);
        if (m.type === 'done' || m.type === 'error') resolve(m);
    }));
    ws.send(JSON.stringify({ id: '1', type: 'completion', request: { prompt: 'Hi', max_tokens: 5, temperature: 0 } }));
    const last = await done;
    assert.equal(last.type, 'done', JSON.stringify(messages));
    ws.close();
});

test('gRPC over TLS: a client trusting the CA generates, a plain-text client does not', async () => {
    const def = protoLoader.loadSync('peregrine/v1/inference.proto', { includeDirs: [protoDir], keepCase: true });
    const Inference = grpc.loadPackageDefinition(def).peregrine.v1.Inference;
    const generate = (client) => new Promise((resolve) => {
        const messages = [];
        const call = client.generate({ prompt: 'Once upon a time', temperature: 0, max_tokens: 8 });
        call.on('data', (m) => messages.push(m));
        call.on('error', (error) => resolve({ error }));
        call.on('end', () => resolve({ text: messages.map((m) => m.text).join('') }));
    });
    const secure = new Inference(`localhost:${grpcPort}`, grpc.credentials.createSsl(ca));
    const ok = await generate(secure);
    secure.close();
    assert.equal(ok.error, undefined);
    assert.ok(ok.text.length > 0);
    const plain = new Inference(`127.0.0.1:${grpcPort}`, grpc.credentials.createInsecure(),
        { 'grpc.initial_reconnect_backoff_ms': 100 });
    const refused = await Promise.race([generate(plain), new Promise((r) => setTimeout(() => r({ timeout: true }), 5000))]);
    plain.close();
    assert.ok(refused.error || refused.timeout, 'a plain-text gRPC client got an answer');
});

test('plain HTTP on the TLS port gets no answer, and HTTPS still works after', async () => {
    const plain = await fetch(`${server.url.replace(/^https/, 'http')}/health`).then(
        (r) => `answered ${r.status}`, () => 'failed');
    assert.equal(plain, 'failed');
    assert.equal((await request(`${server.url}/health`, { method: 'GET' })).status, 200);
});

test('--ssl-cert-reqs 2: a client certificate signed by --ssl-ca-certs is required', async () => {
    const mtls = await startServer([...tlsArgs, '--ssl-ca-certs', file('ca.pem'), '--ssl-cert-reqs', '2']);
    try {
        const without = await request(`${mtls.url}/health`, { method: 'GET' }).then(
            (r) => `answered ${r.status}`, () => 'failed');
        assert.equal(without, 'failed');
        const withCert = await request(`${mtls.url}/health`, {
            method: 'GET',
            options: { key: fs.readFileSync(file('client.key')), cert: fs.readFileSync(file('client.pem')) },
        });
        assert.equal(withCert.status, 200);
    } finally {
        await mtls.stop();
    }
});

test('peregrine router --ssl-*: a TLS front over a plain replica', async () => {
    const { spawn } = await import('node:child_process');
    const plain = await startServer(['--device', 'cpu', '--threads', '1']);
    const proc = spawn(process.env.PG_BINARY, ['router', '--port', '0', '--backend', plain.url, ...tlsArgs],
        { stdio: ['ignore', 'ignore', 'pipe'] });
    try {
        let log = '';
        const url = await new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`router not ready:\n${log}`)), 30000);
            proc.stderr.on('data', (d) => {
                log += d;
                const m = log.match(/ready: routing at (https:\/\/[^\s]+)\/v1/);
                if (m) {
                    clearTimeout(timer);
                    resolve(m[1]);
                }
            });
        });
        const body = { prompt: 'Once upon a time', max_tokens: 8, temperature: 0 };
        const through = JSON.parse((await request(`${url}/v1/completions`, { body })).body).choices[0].text;
        const direct = JSON.parse((await (await fetch(`${plain.url}/v1/completions`, {
            method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
        })).text())).choices[0].text;
        assert.equal(through, direct);
    } finally {
        proc.kill('SIGTERM');
        await plain.stop();
    }
});

test('serve --data-parallel-size 2 --ssl-*: the front serves TLS', async () => {
    const dp = await startServer(['--device', 'cpu', '--threads', '1', '--data-parallel-size', '2', ...tlsArgs]);
    try {
        assert.match(dp.url, /^https:/);
        const r = await request(`${dp.url}/v1/completions`, { body: { prompt: 'Hi', max_tokens: 4 } });
        assert.equal(r.status, 200, r.body);
    } finally {
        await dp.stop();
    }
});

test('bad TLS flags are refused before the model loads, naming the flag', () => {
    const run = (...args) => spawnSync(process.env.PG_BINARY, ['serve', '--port', '0', ...args], { encoding: 'utf8', timeout: 30000 });
    const cases = [
        [['--ssl-certfile', file('server.pem')], /--ssl-certfile needs --ssl-keyfile/],
        [['--ssl-certfile', file('server.pem'), '--ssl-keyfile', file('client.key')], /--ssl-keyfile .*(does not match|mismatch)/],
        [['--ssl-certfile', file('ca.key'), '--ssl-keyfile', file('server.key')], /--ssl-certfile/],
        [[...tlsArgs, '--ssl-cert-reqs', '2'], /needs --ssl-ca-certs/],
        [['--ssl-ca-certs', file('ca.pem')], /need --ssl-certfile/],
        [['--data-parallel-size', '2', '--ssl-certfile', file('server.pem'), '--ssl-keyfile', file('client.key')],
            /--ssl-keyfile/],
    ];
    for (const [args, message] of cases) {
        const r = run(...args);
        assert.notEqual(r.status, 0, args.join(' '));
        assert.match(r.stderr, message, args.join(' '));
        assert.doesNotMatch(r.stderr, /^model:/m, 'the model was loaded first');
    }
});
