// Shared by reliability_input.test.mjs, reliability_load.test.mjs and scripts/soak.mjs: the hostile
// corpora (tests/server/hostile/*.jsonl, format in hostile/README.md), clients for every transport
// that can send what a well-behaved client never would (raw HTTP bytes, raw WebSocket frames, raw
// protobuf bytes), and the checks of what comes back.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
export const WebSocket = require('ws');
export const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

export const KEY = 'reliability-key';
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Polls `fn` until it returns truthy or `ms` pass; returns the last value.
export async function waitFor(fn, ms, step = 20) {
    const end = Date.now() + ms;
    for (;;) {
        const v = await fn();
        if (v || Date.now() >= end) return v;
        await sleep(step);
    }
}
const statusName = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

// --- corpora ------------------------------------------------------------------------------------
// A string may be written {"$repeat": [part, {"chunk", "times"}, ...]}, an array
// {"$array": {"times", "item", "indexed"}}; "{KEY}" / "{KEY_PREFIX}" become the API key / half of it.
export function expand(v) {
    if (typeof v === 'string') return v.replaceAll('{KEY}', KEY).replaceAll('{KEY_PREFIX}', KEY.slice(0, 8));
    if (Array.isArray(v)) return v.map(expand);
    if (v && typeof v === 'object') {
        if (v.$repeat) return repeatParts(v.$repeat);
        if (v.$array) {
            const { times, item, indexed } = v.$array;
            return Array.from({ length: times }, (_, i) => (indexed ? `${expand(item)}${i}` : expand(item)));
        }
        return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, expand(x)]));
    }
    return v;
}
export function repeatParts(parts) {
    if (!Array.isArray(parts)) parts = [parts.prefix ?? '', { chunk: parts.chunk, times: parts.times }, parts.suffix ?? ''];
    return parts.map((p) => (typeof p === 'string' ? expand(p) : p.chunk.repeat(p.times))).join('');
}
export function loadCorpus(name) {
    const text = fs.readFileSync(path.join(here, 'hostile', `${name}.jsonl`), 'utf8');
    return text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
}

// --- the server ----------------------------------------------------------------------------------
export function freePort() {
    return new Promise((resolve) => {
        const s = net.createServer().listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

// The binary's `serve` flags (from --help): flags of the contract it lacks are left out of `args`
// (so the server still starts) and listed in `missing`, for a test to fail on.
let helpText;
export function contractArgs(args) {
    helpText ??= spawnSync(process.env.PG_BINARY, ['serve', '--help'], { encoding: 'utf8' }).stdout ?? '';
    const out = [], missing = [];
    for (let i = 0; i < args.length; ++i) {
        const flag = args[i];
        const takesValue = i + 1 < args.length && !args[i + 1].startsWith('--');
        if (flag.startsWith('--') && !new RegExp(`${flag}\\b`).test(helpText)) {
            missing.push(flag);
            if (takesValue) ++i;
            continue;
        }
        out.push(flag);
        if (takesValue) out.push(args[++i]);
    }
    return { args: out, missing };
}

export async function health(url) {
    const res = await fetch(`${url}/health`);
    // The HTTP status wins over the body's own "status" ("ok", "draining"), kept as `state`.
    const body = await res.json().catch(() => ({}));
    return { ...body, state: body.status, status: res.status };
}
// Polls /health until no request is in flight and nothing runs, waits or holds a KV block; the last reading and whether it got there.
export async function waitIdle(url, ms = 2000) {
    const end = Date.now() + ms;
    for (;;) {
        const h = await health(url).catch((e) => ({ error: String(e) }));
        const idle = h.kv_blocks_used === 0 && h.running === 0 && h.waiting === 0 && (h.requests_in_flight ?? 0) === 0;
        if (idle || Date.now() >= end) return { idle, h };
        await sleep(20);
    }
}

// --- REST ----------------------------------------------------------------------------------------
// One request on its own connection: {status, headers, body (Buffer), closed}.
export function httpRequest(port, { method = 'POST', path: p = '/', headers = {}, body }, timeoutMs = 15000) {
    return new Promise((resolve, reject) => {
        const h = { ...headers };
        if (body !== undefined && !Object.keys(h).some((k) => ['content-length', 'transfer-encoding'].includes(k.toLowerCase())))
            h['content-length'] = String(body.length);
        const req = http.request({ host: '127.0.0.1', port, method, path: p, headers: h, agent: false }, (res) => {
            const chunks = [];
            res.on('data', (c) => chunks.push(c));
            res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
            res.on('error', reject);
        });
        req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
        req.on('error', reject);
        req.end(body);
    });
}

// The bytes of a REST case's body, or undefined.
export function caseBody(c) {
    if (c.body !== undefined) return Buffer.from(expand(c.body), 'utf8');
    if (c.body_latin1 !== undefined) return Buffer.from(expand(c.body_latin1), 'latin1');
    if (c.body_json !== undefined) return Buffer.from(JSON.stringify(c.body_json), 'utf8');
    if (c.body_repeat !== undefined) return Buffer.from(repeatParts(c.body_repeat), 'utf8');
    return undefined;
}

// Parses the HTTP/1.1 responses in `buf` (1xx skipped): [{status, headers, body}], and whether
// the last one is incomplete.
export function parseResponses(buf, closed) {
    const out = [];
    let at = 0;
    while (at < buf.length) {
        const end = buf.indexOf('\r\n\r\n', at);
        if (end < 0) return { responses: out, partial: true };
        const lines = buf.subarray(at, end).toString('latin1').split('\r\n');
        const m = lines[0].match(/^HTTP\/1\.[01] (\d{3})/);
        if (!m) return { responses: out, partial: true, junk: lines[0] };
        const headers = {};
        for (const l of lines.slice(1)) {
            const i = l.indexOf(':');
            if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
        }
        const status = Number(m[1]);
        let pos = end + 4;
        if (status >= 100 && status < 200) {
            at = pos;
            continue;
        }
        let body;
        if (headers['content-length'] !== undefined) {
            const n = Number(headers['content-length']);
            if (buf.length < pos + n) return { responses: out, partial: true };
            body = buf.subarray(pos, pos + n);
            pos += n;
        } else if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
            const parts = [];
            for (;;) {
                const eol = buf.indexOf('\r\n', pos);
                if (eol < 0) return { responses: out, partial: true };
                const size = parseInt(buf.subarray(pos, eol).toString('latin1'), 16);
                if (buf.length < eol + 2 + size + 2) return { responses: out, partial: true };
                parts.push(buf.subarray(eol + 2, eol + 2 + size));
                pos = eol + 2 + size + 2;
                if (size === 0) break;
            }
            body = Buffer.concat(parts);
        } else {
            if (!closed) return { responses: out, partial: true };
            body = buf.subarray(pos);
            pos = buf.length;
        }
        out.push({ status, headers, body });
        at = pos;
    }
    return { responses: out, partial: false };
}

// Sends `bytes` on a new connection; collects until `count` responses came (and, with waitClose,
// the server closed), the server closed, or waitMs passed.
export function rawExchange(port, bytes, { count = 1, waitClose = false, waitMs = 3000 } = {}) {
    return new Promise((resolve) => {
        const sock = net.connect(port, '127.0.0.1');
        let buf = Buffer.alloc(0), closed = false, done = false;
        const finish = () => {
            if (done) return;
            done = true;
            clearTimeout(timer);
            sock.destroy();
            resolve({ ...parseResponses(buf, closed), closed, raw: buf });
        };
        const timer = setTimeout(finish, waitMs);
        const check = () => {
            const { responses } = parseResponses(buf, closed);
            if (closed || (responses.length >= count && !waitClose)) finish();
        };
        sock.on('data', (d) => {
            buf = Buffer.concat([buf, d]);
            check();
        });
        sock.on('end', () => {
            closed = true;
            check();
        });
        sock.on('close', () => {
            closed = true;
            check();
        });
        sock.on('error', () => {});
        sock.on('connect', () => sock.write(bytes));
    });
}

// The error type that goes with an HTTP status.
export function typesFor(status) {
    if (status === 401) return ['authentication_error'];
    if (status === 403) return ['permission_error'];
    if (status === 404) return ['not_found_error'];
    if (status === 429) return ['rate_limit_error'];
    if (status === 503) return ['service_unavailable'];
    if (status === 501) return ['server_error', 'invalid_request_error'];
    if (status >= 500) return ['server_error'];
    return ['invalid_request_error'];
}

// Problems with an OpenAI error object {message, type, param, code} for `status`.
export function errorProblems(err, status, expect = {}) {
    const p = [];
    if (!err || typeof err !== 'object') return [`no error object: ${JSON.stringify(err)?.slice(0, 200)}`];
    const keys = Object.keys(err).sort().join(',');
    if (keys !== 'code,message,param,type') p.push(`error keys are ${keys}`);
    if (typeof err.message !== 'string' || !err.message) p.push('error.message is not a non-empty string');
    if (!typesFor(status).includes(err.type)) p.push(`error.type ${err.type} does not go with status ${status}`);
    for (const k of ['type', 'code', 'param'])
        if (expect[k] !== undefined && err[k] !== expect[k]) p.push(`error.${k} is ${JSON.stringify(err[k])}, expected ${JSON.stringify(expect[k])}`);
    return p;
}

const allowed = (s) => (Array.isArray(s) ? s : [s]);

// Problems with one REST answer {status, headers, body, closed} for the case's `expect`.
export function restProblems(c, res, method = c.method ?? 'POST') {
    const e = c.expect;
    const p = [];
    const ok = allowed(e.status).includes(res.status);
    if (!ok) p.push(`status ${res.status}, expected ${JSON.stringify(e.status)}`);
    if (res.status >= 500 && !ok) p.push(`5XX: ${res.status} ${res.body.toString('utf8').slice(0, 300)}`);
    if (e.no_body && res.body.length) p.push(`a body of ${res.body.length} bytes where none is expected`);
    if (res.status >= 400 && method !== 'HEAD') {
        let j;
        try {
            j = JSON.parse(res.body.toString('utf8'));
        } catch {
            p.push(`the error body is not JSON: ${res.body.toString('utf8').slice(0, 200)}`);
        }
        if (j) p.push(...errorProblems(j.error, res.status, ok && !Array.isArray(e.status) ? e : {}));
    }
    for (const [name, want] of Object.entries(e.headers ?? {})) {
        const got = res.headers[name] ?? null;
        if (want === null ? got !== null : want.regex ? !new RegExp(want.regex).test(got ?? '') : got !== want)
            p.push(`header ${name}: ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
    }
    return p;
}

// Runs one case of rest.jsonl; returns its problems.
export async function runRestCase(port, c) {
    if (c.raw !== undefined || c.raw_repeat !== undefined) {
        const bytes = Buffer.from(c.raw !== undefined ? expand(c.raw) : repeatParts(c.raw_repeat), 'latin1');
        const seq = c.expect.sequence;
        const r = await rawExchange(port, bytes, { count: seq ? seq.length : 1, waitClose: !!c.expect.closed, waitMs: c.wait_ms ?? 3000 });
        const p = [];
        if (seq) {
            const got = r.responses.map((x) => x.status);
            if (JSON.stringify(got.slice(0, seq.length)) !== JSON.stringify(seq)) p.push(`statuses ${JSON.stringify(got)}, expected ${JSON.stringify(seq)}`);
            for (const x of r.responses) if (x.status >= 500) p.push(`5XX: ${x.status}`);
        } else if (!r.responses.length) {
            p.push(`no response (closed: ${r.closed}; got ${JSON.stringify(r.raw.toString('latin1').slice(0, 120))})`);
        } else {
            p.push(...restProblems(c, r.responses[0], 'RAW'));
        }
        if (c.expect.closed && !r.closed) p.push('the connection was not closed');
        return p;
    }
    const headers = { authorization: `Bearer ${KEY}` };
    const body = caseBody(c);
    if (body !== undefined) headers['content-type'] = 'application/json';
    for (const [k, v] of Object.entries(c.headers ?? {})) {
        if (v === null) delete headers[k];
        else headers[k] = expand(v);
    }
    const method = c.method ?? 'POST';
    try {
        if (method === 'HEAD') {
            // On a raw socket: an HTTP client would not see body bytes sent after a HEAD answer.
            const head = Object.entries({ host: 'x', ...headers, connection: 'close' }).map(([k, v]) => `${k}: ${v}\r\n`).join('');
            const r = await rawExchange(port, Buffer.from(`HEAD ${expand(c.path)} HTTP/1.1\r\n${head}\r\n`, 'latin1'), { waitClose: true });
            const end = r.raw.indexOf('\r\n\r\n');
            const [first, ...lines] = r.raw.subarray(0, end < 0 ? r.raw.length : end).toString('latin1').split('\r\n');
            const hdrs = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).trim().toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
            const status = Number(first.match(/^HTTP\/1\.1 (\d{3})/)?.[1]);
            return restProblems(c, { status, headers: hdrs, body: end < 0 ? r.raw : r.raw.subarray(end + 4) }, method);
        }
        const res = await httpRequest(port, { method, path: expand(c.path ?? '/v1/completions'), headers, body });
        return restProblems(c, res, method);
    } catch (e) {
        return [`request failed: ${e.message}`];
    }
}

// --- WebSocket -----------------------------------------------------------------------------------
// A client frame, masked unless told otherwise; payload bytes are latin1.
export function wsFrame({ opcode, fin = true, rsv1 = false, mask = true, payload = '', payload_repeat }) {
    const data = Buffer.from(payload_repeat ? repeatParts(payload_repeat) : payload, 'latin1');
    const head = [(fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | opcode];
    const m = mask ? 0x80 : 0;
    if (data.length < 126) head.push(m | data.length);
    else if (data.length < 65536) head.push(m | 126, data.length >> 8, data.length & 255);
    else {
        head.push(m | 127, 0, 0, 0, 0);
        for (let s = 24; s >= 0; s -= 8) head.push((data.length >>> s) & 255);
    }
    if (!mask) return Buffer.concat([Buffer.from(head), data]);
    const key = Buffer.from([0x12, 0x34, 0x56, 0x78]);
    const out = Buffer.from(data);
    for (let i = 0; i < out.length; ++i) out[i] ^= key[i & 3];
    return Buffer.concat([Buffer.from(head), key, out]);
}

// A /v1/ws connection recording messages, pongs and the close.
export async function wsConnect(url, { key = KEY } = {}) {
    const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/ws`, {
        headers: key ? { authorization: `Bearer ${key}` } : {},
        perMessageDeflate: false,
        maxPayload: 256 << 20,
    });
    const s = { msgs: [], pongs: [], closed: null, waiters: new Set() };
    const notify = () => s.waiters.forEach((w) => w());
    ws.on('message', (data) => {
        let m;
        try {
            m = JSON.parse(data.toString());
        } catch {
            m = { unparsed: data.toString().slice(0, 200) };
        }
        s.msgs.push(m);
        notify();
    });
    ws.on('pong', (d) => {
        s.pongs.push(d.toString('latin1'));
        notify();
    });
    ws.on('close', (code, reason) => {
        s.closed = { code, reason: reason.toString() };
        notify();
    });
    ws.on('error', (e) => {
        s.error = e;
        notify();
    });
    await new Promise((resolve, reject) => {
        ws.once('open', resolve);
        ws.once('unexpected-response', (_q, res) => reject(Object.assign(new Error(`upgrade refused: ${res.statusCode}`), { status: res.statusCode })));
        ws.once('error', reject);
    });
    const conn = {
        ws,
        s,
        // Resolves with pred()'s value once truthy, or undefined after ms.
        until(pred, ms = 5000) {
            return new Promise((resolve) => {
                const v0 = pred();
                if (v0) return resolve(v0);
                const w = () => {
                    const v = pred();
                    if (v) done(v);
                };
                const done = (v) => {
                    clearTimeout(t);
                    s.waiters.delete(w);
                    resolve(v);
                };
                const t = setTimeout(() => done(undefined), ms);
                s.waiters.add(w);
            });
        },
        terminal: (id) => s.msgs.filter((m) => m.id === id && (m.type === 'done' || m.type === 'error')),
        send: (obj) => ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj)),
        raw: (buf) => ws._socket.write(buf),
    };
    return conn;
}

// Sends one item of a ws.jsonl case.
export async function wsSendItem(conn, item) {
    if (item.wait_ms) return sleep(item.wait_ms);
    if (item.json !== undefined) return conn.send(JSON.stringify(expand(item.json)));
    if (item.text !== undefined) return conn.send(expand(item.text));
    if (item.text_repeat !== undefined) return conn.send(repeatParts(item.text_repeat));
    if (item.binary !== undefined) return conn.ws.send(Buffer.from(item.binary, 'utf8'), { binary: true });
    if (item.ping !== undefined) return conn.ws.ping(Buffer.from(item.ping, 'latin1'));
    if (item.pong !== undefined) return conn.ws.pong(Buffer.from(item.pong, 'latin1'));
    if (item.close !== undefined) {
        const reason = Buffer.from(item.reason ?? '', 'utf8');
        const payload = Buffer.concat([Buffer.from([item.close >> 8, item.close & 255]), reason]);
        return conn.raw(wsFrame({ opcode: 8, payload: payload.toString('latin1') }));
    }
    if (item.frame) return conn.raw(wsFrame(item.frame));
    throw new Error(`unknown ws item ${JSON.stringify(item)}`);
}

// Whether a connection still answers a ping and a small request (a new one when `conn` is closed).
export async function wsStillServes(url, conn) {
    if (!conn || conn.s.closed || conn.ws.readyState !== WebSocket.OPEN) conn = await wsConnect(url);
    const tag = `alive-${Math.random().toString(36).slice(2)}`;
    conn.ws.ping(Buffer.from(tag));
    if (!(await conn.until(() => conn.s.pongs.includes(tag), 3000))) return 'no pong';
    conn.send({ id: tag, type: 'completion', request: { prompt: 'Once upon a time', max_tokens: 3 } });
    const t = await conn.until(() => conn.terminal(tag)[0], 5000);
    conn.ws.terminate();
    return t?.type === 'done' ? null : `a small request got ${JSON.stringify(t)}`;
}

// Runs one case of ws.jsonl; returns its problems.
export async function runWsCase(url, c) {
    const p = [];
    let conn;
    try {
        conn = await wsConnect(url);
    } catch (e) {
        return [`cannot connect: ${e.message}`];
    }
    for (const item of c.send) await wsSendItem(conn, item);
    const e = c.expect;
    if (e.pong !== undefined && !(await conn.until(() => conn.s.pongs.includes(e.pong), 3000))) p.push(`no pong ${JSON.stringify(e.pong)}`);
    // Replies in order per id; an expected id may be a list of acceptable ids (null: the error of an unreadable message).
    const used = new Set();
    for (const want of e.replies ?? []) {
        const ids = Array.isArray(want.id) ? want.id : [want.id];
        const pick = () => conn.s.msgs.find((m, i) => !used.has(i) && ids.includes(m.id ?? null) && (m.type === 'done' || m.type === 'error') && used.add(i));
        const got = await conn.until(() => pick() || (conn.s.closed && { closed: conn.s.closed }), 8000);
        if (got?.closed) {
            if (!(e.or_close ?? []).includes(got.closed.code)) p.push(`closed with ${got.closed.code} waiting for ${JSON.stringify(want)}`);
            break;
        }
        if (!got) {
            p.push(`no reply for id ${JSON.stringify(want.id)}`);
            continue;
        }
        if (!allowed(want.type).includes(got.type)) p.push(`id ${JSON.stringify(got.id)}: ${got.type} ${JSON.stringify(got.error ?? {})}, expected ${want.type} ${want.status ?? ''}`);
        else if (got.type === 'error') {
            if (!allowed(want.status).includes(got.status)) p.push(`status ${got.status}, expected ${want.status}`);
            if (got.status >= 500) p.push(`5XX: ${JSON.stringify(got).slice(0, 300)}`);
            p.push(...errorProblems(got.error, got.status, got.status === want.status ? { code: want.code, param: want.param } : {}));
        }
    }
    if (e.silent) {
        await sleep(300);
        if (conn.s.msgs.length) p.push(`unexpected messages ${JSON.stringify(conn.s.msgs).slice(0, 200)}`);
    }
    if (e.close) {
        const closed = await conn.until(() => conn.s.closed, 5000);
        if (!closed) p.push(`not closed (expected close ${JSON.stringify(e.close)})`);
        else if (e.close !== 'any' && !e.close.includes(closed.code)) p.push(`closed with ${closed.code}, expected ${JSON.stringify(e.close)}`);
    }
    const alive = await wsStillServes(url, e.close || conn.s.closed ? null : conn).catch((x) => x.message);
    if (alive) p.push(`afterwards: ${alive}`);
    conn.ws.terminate();
    return p;
}

// --- gRPC ----------------------------------------------------------------------------------------
const protoDir = path.resolve(here, '..', '..', 'proto');
let Inference;
// A client; `own`: on a connection of its own (grpc-js otherwise shares one per target).
export function grpcClient(port, { own = false } = {}) {
    if (!Inference) {
        const def = protoLoader.loadSync('peregrine/v1/inference.proto', { includeDirs: [protoDir], keepCase: true });
        Inference = grpc.loadPackageDefinition(def).peregrine.v1.Inference;
    }
    return new Inference(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), {
        'grpc.max_receive_message_length': 64 << 20,
        ...(own ? { 'grpc.use_local_subchannel_pool': 1 } : {}),
    });
}
export function grpcMeta(md = {}) {
    const m = new grpc.Metadata();
    const all = { authorization: `Bearer ${KEY}`, ...md };
    for (const [k, v] of Object.entries(all)) if (v !== null) m.set(k, expand(v));
    return m;
}
const byteCodec = [(b) => b, (b) => b];

// A Generate call: {messages, code (status name), details, call}. `onData(msg, call)` sees each message.
export function grpcGenerate(client, req, { metadata, deadlineMs, raw, onData } = {}) {
    return new Promise((resolve) => {
        const opts = deadlineMs ? { deadline: new Date(Date.now() + deadlineMs) } : {};
        const md = grpcMeta(metadata);
        const call = raw
            ? client.makeServerStreamRequest('/peregrine.v1.Inference/Generate', ...byteCodec, raw, md, opts)
            : client.generate(req, md, opts);
        const messages = [];
        call.on('data', (m) => {
            messages.push(m);
            onData?.(m, call);
        });
        call.on('error', (e) => resolve({ messages, code: statusName[e.code], details: e.details, call }));
        call.on('end', () => setImmediate(() => resolve({ messages, code: 'OK', call })));
    });
}
export function grpcUnary(client, method, req, { metadata, raw, deadlineMs } = {}) {
    return new Promise((resolve) => {
        const cb = (e, res) => resolve(e ? { code: statusName[e.code], details: e.details } : { code: 'OK', res });
        const md = grpcMeta(metadata);
        const opts = deadlineMs ? { deadline: new Date(Date.now() + deadlineMs) } : {};
        const fn = client[method[0].toLowerCase() + method.slice(1)];
        if (raw !== undefined || !fn) client.makeUnaryRequest(`/peregrine.v1.Inference/${method}`, ...byteCodec, raw ?? Buffer.alloc(0), md, opts, cb);
        else fn.call(client, req, md, opts, cb);
    });
}

// Runs one case of grpc.jsonl on a connection of its own (a case that wedges its connection
// cannot stall the next ones), with a 10 s deadline unless the case has one; returns its problems.
export async function runGrpcCase(port, c) {
    const raw = c.raw_hex !== undefined ? Buffer.from(c.raw_hex, 'hex') : undefined;
    const req = expand(c.request ?? {});
    const client = grpcClient(port, { own: true });
    const deadlineMs = c.deadline_ms ?? 10000;
    const r = c.method === 'Generate'
        ? await grpcGenerate(client, req, { metadata: c.metadata, deadlineMs, raw })
        : await grpcUnary(client, c.method, req, { metadata: c.metadata, raw, deadlineMs });
    client.close();
    const want = allowed(c.expect);
    const p = [];
    if (!want.includes(r.code)) p.push(`status ${r.code} (${r.details ?? ''}), expected ${want.join(' or ')}`);
    if (['INTERNAL', 'UNKNOWN', 'DATA_LOSS'].includes(r.code) && !want.includes(r.code)) p.push(`5XX-like: ${r.code} ${r.details}`);
    return p;
}
