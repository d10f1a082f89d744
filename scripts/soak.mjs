#!/usr/bin/env node
// Soak test of `peregrine serve` (not part of CI):
//
//   node scripts/soak.mjs [--minutes 30] [--concurrency 16] [--binary build/peregrine]
//                         [--node-modules build/node-test] [--seed N] [-- extra serve flags]
//
// Starts its own server (the embedded model, REST + WebSocket + gRPC) and keeps `concurrency`
// clients busy with mixed traffic: REST completions and chat (streaming or not), WebSocket
// requests, gRPC Generate streams; some are cut mid-stream on every transport (socket closed,
// WebSocket terminated or cancelled, gRPC cancelled), and cases of tests/server/hostile/*.jsonl are
// mixed in. Every 10 s it pauses new requests, waits for the server to go idle and samples: 5xx
// answers so far (must stay 0), /health kv_blocks_used (must be 0 when idle), the server's RSS
// (VmRSS) and open descriptors. At the end it prints the first sample after the warm-up (2 min,
// or a third of a shorter run) against the last, and exits 1 on any 5xx, a KV block held once the
// traffic stopped, a request that hung, or a server that died or did not exit 0 on SIGTERM.
// The npm packages come from the server tests' setup (`cd build && ctest -R server_npm_setup`).
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const opt = { minutes: 30, concurrency: 16, binary: 'build/peregrine', 'node-modules': 'build/node-test', seed: Date.now() % 100000 };
const extra = [];
for (let i = 2; i < process.argv.length; ++i) {
    const a = process.argv[i];
    if (a === '--') {
        extra.push(...process.argv.slice(i + 1));
        break;
    }
    const k = a.replace(/^--/, '');
    if (!(k in opt) || i + 1 >= process.argv.length) {
        console.error(`usage: node scripts/soak.mjs [--minutes N] [--concurrency N] [--binary PATH] [--node-modules DIR] [--seed N] [-- serve flags]`);
        process.exit(2);
    }
    opt[k] = typeof opt[k] === 'number' ? Number(process.argv[++i]) : process.argv[++i];
}
process.env.PG_BINARY = path.resolve(root, opt.binary);
process.env.PG_NODE_MODULES = path.resolve(root, opt['node-modules']);
if (!fs.existsSync(process.env.PG_BINARY)) throw new Error(`no binary at ${process.env.PG_BINARY} (--binary)`);
if (!fs.existsSync(path.join(process.env.PG_NODE_MODULES, 'node_modules', 'ws')))
    throw new Error(`no npm packages in ${process.env.PG_NODE_MODULES} (run: cd build && ctest -R server_npm_setup)`);
const { startServer } = await import(path.join(root, 'tests/server/harness.mjs'));
const R = await import(path.join(root, 'tests/server/reliability_lib.mjs'));

// A small deterministic generator, so a seed replays the same mix.
let rs = opt.seed >>> 0 || 1;
const rand = () => ((rs = (Math.imul(rs ^ (rs >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0) / 4294967296);
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const chance = (p) => rand() < p;

const grpcPort = await R.freePort();
const { args, missing } = R.contractArgs(['--api-key', R.KEY, '--grpc-port', String(grpcPort), '--max-body-bytes', '65536', '--read-timeout', '2']);
if (missing.length) console.error(`note: this binary lacks ${missing.join(' ')}; running without`);
const server = await startServer([...args, ...extra]);
const port = Number(new URL(server.url).port);
const pid = server.proc.pid;
const client = R.grpcClient(grpcPort);
console.error(`soak: pid ${pid}, ${server.url}, gRPC ${grpcPort}, ${opt.minutes} min, concurrency ${opt.concurrency}, seed ${opt.seed}`);

const hostile = {
    rest: R.loadCorpus('rest').filter((c) => !c.wait_ms),
    ws: R.loadCorpus('ws'),
    grpc: R.loadCorpus('grpc'),
};
const counts = {};  // "transport outcome" -> n
const count = (k) => (counts[k] = (counts[k] ?? 0) + 1);
const fivexx = [];  // descriptions of every 5xx (and gRPC INTERNAL / UNKNOWN)
const hangs = [];
const mismatches = new Map();  // hostile cases whose answer differs from the corpus's expectation
const note5xx = (what) => {
    fivexx.push(what);
    if (fivexx.length <= 20) console.error(`5XX: ${what}`);
};

const prompts = ['Once upon a time', 'The little dog', 'Lily and Tom went to the park', 'One day, a bird', 'Hi'];
const body = (extra = {}) => ({ prompt: pick(prompts), max_tokens: 1 + Math.floor(rand() * 160), temperature: rand() < 0.3 ? 0 : rand(), ...extra });
const headers = { authorization: `Bearer ${R.KEY}`, 'content-type': 'application/json' };

// REST, streaming or not, completion or chat; `cutAfter`: events (or ms) before the client hangs up.
function restOnce({ stream, chat, cutAfter }) {
    const b = body({ stream });
    if (chat) {
        b.messages = [{ role: 'user', content: b.prompt }];
        delete b.prompt;
    }
    const data = Buffer.from(JSON.stringify(b));
    return new Promise((resolve) => {
        const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: chat ? '/v1/chat/completions' : '/v1/completions', agent: false,
            headers: { ...headers, 'content-length': data.length } }, (res) => {
            let text = '', events = 0;
            res.on('data', (d) => {
                text += d;
                events += (d.toString().match(/^data: /gm) ?? []).length;
                if (stream && cutAfter && events >= cutAfter) {
                    req.destroy();
                    resolve('cut');
                }
            });
            res.on('end', () => {
                if (res.statusCode >= 500) note5xx(`REST ${res.statusCode} ${text.slice(0, 200)}`);
                if (stream && res.statusCode === 200 && !text.includes('data: [DONE]')) return resolve('incomplete');
                resolve(res.statusCode === 200 ? 'ok' : `status ${res.statusCode}`);
            });
            res.on('error', () => resolve('cut'));
        });
        req.on('error', (e) => resolve(e.message.includes('socket hang up') || e.code === 'ECONNRESET' ? 'cut' : `error ${e.code ?? e.message}`));
        if (!stream && cutAfter) setTimeout(() => (req.destroy(), resolve('cut')), cutAfter * 20);
        req.end(data);
    });
}

// WebSocket: one connection per worker, reopened after a terminate.
async function wsOnce(w, { cancel, terminate }) {
    if (!w.conn || w.conn.s.closed) w.conn = await R.wsConnect(server.url);
    const c = w.conn;
    const id = `r${++w.n}`;
    const chat = chance(0.3);
    const request = body();
    if (chat) {
        request.messages = [{ role: 'user', content: request.prompt }];
        delete request.prompt;
    }
    c.send({ id, type: chat ? 'chat' : 'completion', request });
    if (cancel || terminate) {
        await c.until(() => c.s.msgs.some((m) => m.id === id) || c.s.closed, 10000);
        if (terminate) {
            c.ws.terminate();
            w.conn = null;
            return 'cut';
        }
        c.send({ type: 'cancel', id });
    }
    const end = await c.until(() => c.terminal(id)[0] || (c.s.closed && { closed: c.s.closed }), 60000);
    if (!end) return 'hang';
    if (end.closed) return `closed ${end.closed.code}`;
    if (end.type === 'error') {
        if (end.status >= 500) note5xx(`WS ${JSON.stringify(end).slice(0, 200)}`);
        return `status ${end.status}`;
    }
    return cancel ? 'cancelled' : 'ok';
}

async function grpcOnce({ cancelAfter }) {
    const req = chance(0.2) ? { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1 + Math.floor(rand() * 100) } : body();
    let seen = 0;
    const r = await R.grpcGenerate(client, req, { onData: (_m, call) => cancelAfter && ++seen === cancelAfter && call.cancel() });
    if (['INTERNAL', 'UNKNOWN', 'DATA_LOSS'].includes(r.code)) note5xx(`gRPC ${r.code} ${r.details}`);
    return r.code === 'OK' ? 'ok' : r.code === 'CANCELLED' ? 'cut' : r.code;
}

async function hostileOnce() {
    const kind = pick(['rest', 'rest', 'ws', 'grpc']);
    const c = pick(hostile[kind]);
    const problems = kind === 'rest' ? await R.runRestCase(port, c) : kind === 'ws' ? await R.runWsCase(server.url, c) : await R.runGrpcCase(grpcPort, c);
    for (const p of problems) if (p.startsWith('5XX')) note5xx(`hostile ${kind} "${c.name}": ${p}`);
    if (problems.length) mismatches.set(`${kind}: ${c.name}`, problems.join('; ').slice(0, 160));
    return problems.length ? 'mismatch' : 'ok';
}

// One operation with a guard against hangs.
async function op(w) {
    const r = rand();
    let what, run;
    if (r < 0.2) [what, run] = ['REST', () => restOnce({ stream: false, chat: chance(0.3), cutAfter: chance(0.1) ? 1 + Math.floor(rand() * 10) : 0 })];
    else if (r < 0.4) [what, run] = ['REST-stream', () => restOnce({ stream: true, chat: chance(0.3), cutAfter: chance(0.25) ? 1 + Math.floor(rand() * 20) : 0 })];
    else if (r < 0.6) [what, run] = ['WS', () => wsOnce(w, { cancel: chance(0.15), terminate: chance(0.1) })];
    else if (r < 0.85) [what, run] = ['gRPC', () => grpcOnce({ cancelAfter: chance(0.2) ? 1 + Math.floor(rand() * 10) : 0 })];
    else [what, run] = ['hostile', hostileOnce];
    let timer;
    const outcome = await Promise.race([
        run().catch((e) => `error ${e.message.slice(0, 60)}`),
        new Promise((r2) => (timer = setTimeout(() => r2('hang'), 90000))),
    ]);
    clearTimeout(timer);
    if (outcome === 'hang') hangs.push(what);
    count(`${what} ${outcome}`);
}

let paused = false, stopping = false, active = 0;
async function worker(w) {
    while (!stopping) {
        if (paused) {
            await R.sleep(20);
            continue;
        }
        ++active;
        await op(w);
        --active;
    }
    w.conn?.ws.terminate();
}

const rssKb = () => Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)?.[1] ?? NaN);
const fds = () => fs.readdirSync(`/proc/${pid}/fd`).length;
const samples = [];
const t0 = Date.now();
const endAt = t0 + opt.minutes * 60000;
const warmup = Math.min(120000, (opt.minutes * 60000) / 3);

// Pauses new requests, waits for what is running to end and the engine to go idle, samples.
async function sample() {
    paused = true;
    await R.waitFor(() => active === 0, 30000, 10);
    const { idle, h } = await R.waitIdle(server.url, 2000);
    const s = { t: Math.round((Date.now() - t0) / 1000), fivexx: fivexx.length, kv: h.kv_blocks_used, idle, rssMb: +(rssKb() / 1024).toFixed(1), fds: fds(),
        served: h.requests_served, aborted: h.requests_aborted, ops: Object.values(counts).reduce((a, b) => a + b, 0) };
    paused = false;
    samples.push(s);
    console.error(`[${s.t}s] ops ${s.ops} 5xx ${s.fivexx} kv ${s.kv}${idle ? '' : ' (NOT IDLE)'} rss ${s.rssMb} MB fds ${s.fds} served ${s.served} aborted ${s.aborted}`);
    return s;
}

let died = false;
server.proc.on('exit', () => (died = !stopping));
const workers = Array.from({ length: opt.concurrency }, () => ({ n: 0 }));
const running = workers.map(worker);
while (Date.now() < endAt && !died) {
    await R.sleep(Math.min(10000, Math.max(0, endAt - Date.now())));
    if (!died) await sample();
}
stopping = true;
await Promise.all(running);
const final = died ? null : await R.waitIdle(server.url, 5000);
client.close();
const exit = died ? { code: 'died' } : await server.stop();

const first = samples.find((s) => s.t * 1000 >= warmup) ?? samples[0];
const last = samples.at(-1);
const rows = [['5xx so far', 'fivexx'], ['kv_blocks_used (idle)', 'kv'], ['RSS (MB)', 'rssMb'], ['open fds', 'fds'], ['requests_served', 'served'], ['requests_aborted', 'aborted'], ['client operations', 'ops']];
console.log(`\n${'metric'.padEnd(24)}${`first after warm-up (${first?.t}s)`.padStart(30)}${`last (${last?.t}s)`.padStart(16)}${'change'.padStart(10)}`);
for (const [label, k] of rows) {
    const a = first?.[k], b = last?.[k];
    const d = typeof a === 'number' && typeof b === 'number' ? +(b - a).toFixed(1) : '';
    console.log(`${label.padEnd(24)}${String(a).padStart(30)}${String(b).padStart(16)}${String(d).padStart(10)}`);
}
console.log('\noutcomes:');
for (const [k, v] of Object.entries(counts).sort()) console.log(`  ${k.padEnd(40)}${String(v).padStart(8)}`);

if (mismatches.size) {
    console.log('\nhostile cases answered otherwise than the corpus expects (not a soak failure unless 5xx):');
    for (const [k, v] of mismatches) console.log(`  ${k}: ${v}`);
}

const failures = [];
if (died) failures.push(`the server died:\n${server.log().slice(-3000)}`);
if (fivexx.length) failures.push(`${fivexx.length} 5xx answers, e.g. ${fivexx.slice(0, 5).join(' | ')}`);
if (hangs.length) failures.push(`${hangs.length} requests hung (no answer in 90 s): ${[...new Set(hangs)].join(', ')}`);
if (final && !final.idle) failures.push(`not idle after the traffic stopped: ${JSON.stringify(final.h)}`);
if (samples.some((s) => s.idle && s.kv !== 0)) failures.push('a KV block was held while idle during the run');
if (!died && exit.code !== 0) failures.push(`SIGTERM: exit ${JSON.stringify(exit)}`);
if (!samples.length) failures.push('no sample taken (run longer)');
if (failures.length) {
    console.log(`\nFAIL\n- ${failures.join('\n- ')}`);
    process.exit(1);
}
console.log('\nPASS');
